//! Frames handed to the display: [`PresentedFrame`] and its pixel storage ([`FrameData`],
//! [`FrameHandle`]). The [`PixelFormat`] is `virtsoc-frame`'s; the display shows the packed
//! RGB ones (`Rgba8`, `Bgra8`).
//!
//! A frame is cheap to clone (its pixels sit behind an `Arc`), so the
//! display can keep the last frame of every guest and backends can keep the
//! frame they showed without copying pixels.

use std::fmt;
use std::sync::Arc;

use crate::error::{DisplayError, Result};

/// The guest that owns a frame (for foreground/background display sharing): the one guest
/// id of every crate.
pub use virtsoc_ids::GuestId;

pub use virtsoc_frame::{PixelFormat, MAX_DIMENSION};

/// Converts one pixel of a packed RGB format to R, G, B, A (the display shows only those;
/// [`PresentedFrame::validate`] refuses the others).
pub(crate) fn to_rgba(format: PixelFormat, px: [u8; 4]) -> [u8; 4] {
    match format {
        PixelFormat::Bgra8 => [px[2], px[1], px[0], px[3]],
        _ => px,
    }
}

/// Pixel storage that is not a plain byte buffer owned by the frame: an SVM
/// region, a mapped guest buffer, a GPU surface.
pub trait FrameHandle: Send + Sync + fmt::Debug {
    /// The CPU-visible pixels, laid out as the frame's `stride`, `height`
    /// and `format` say; `None` if they are not CPU-visible (a backend that
    /// needs them then fails with [`DisplayError::PixelsUnavailable`]).
    fn pixels(&self) -> Option<&[u8]>;

    /// How many bytes [`pixels`](Self::pixels) gives, if known without producing them (a
    /// handle whose pixels are made on demand, e.g. composed from display planes, says so
    /// here so that validating a frame does not make them).
    fn byte_len(&self) -> Option<usize> {
        self.pixels().map(<[u8]>::len)
    }

    /// The frame as tightly packed RGBA8 at `width` x `height`, when the handle can make it
    /// at that size directly (display planes composed straight into a small screen for a
    /// viewer); `None` otherwise (scale the full pixels instead).
    fn rgba_scaled(&self, _width: u32, _height: u32) -> Option<Vec<u8>> {
        None
    }

    /// A small picture of the frame in full-range YUV 4:2:0 for a viewer, made directly at
    /// `width` x `height` from where the pixels live (display planes sampled row by row);
    /// `None` when the handle cannot.
    fn view_picture(&self, _width: u32, _height: u32) -> Option<ViewPicture> {
        None
    }

    /// Reads every byte of every visible plane of the frame once, handing them to `visit`
    /// in order (a consuming sink: an encoder, a remote view, a display controller's
    /// scan-out); false when the pixels cannot be read. By default the CPU-visible pixels;
    /// a handle whose pixels live in planes reads the planes where they are instead of
    /// composing the screen. Bytes that must be read back first (device memory) go
    /// through `scratch`, the consumer's own buffer kept from frame to frame (a fresh
    /// buffer of a 4K plane per frame is tens of megabytes of page faults).
    fn consume(&self, _scratch: &mut Vec<u8>, visit: &mut dyn FnMut(&[u8])) -> bool {
        match self.pixels() {
            Some(p) => {
                visit(p);
                true
            }
            None => false,
        }
    }

    /// The handle as `Any`, for a backend that knows its concrete type (the daemon's window
    /// painter presents display planes on the GPU); `None` by default.
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        None
    }
}

/// A picture in full-range ("JPEG") YUV 4:2:0 with tightly packed planes, for viewers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ViewPicture {
    /// Width in pixels (even).
    pub width: u32,
    /// Height in pixels (even).
    pub height: u32,
    /// Y (width x height), then U and V (each width/2 x height/2).
    pub data: Vec<u8>,
}

impl ViewPicture {
    /// A black picture; sizes are rounded up to even.
    pub fn black(width: u32, height: u32) -> Self {
        let (w, h) = ((width.max(2) + 1) & !1, (height.max(2) + 1) & !1);
        let luma = w as usize * h as usize;
        let mut data = vec![0u8; luma + luma / 2];
        data[luma..].fill(128);
        ViewPicture {
            width: w,
            height: h,
            data,
        }
    }

    /// The Y, U and V planes.
    pub fn planes_mut(&mut self) -> (&mut [u8], &mut [u8], &mut [u8]) {
        let luma = self.width as usize * self.height as usize;
        let (y, c) = self.data.split_at_mut(luma);
        let (u, v) = c.split_at_mut(luma / 4);
        (y, u, v)
    }
}

/// Where a frame's pixels live.
#[derive(Clone, Debug)]
pub enum FrameData {
    /// A shared byte buffer.
    Bytes(Arc<[u8]>),
    /// A caller-provided handle.
    Handle(Arc<dyn FrameHandle>),
}

impl FrameData {
    /// The CPU-visible pixels, if any.
    pub fn pixels(&self) -> Option<&[u8]> {
        match self {
            FrameData::Bytes(b) => Some(b),
            FrameData::Handle(h) => h.pixels(),
        }
    }

    /// Reads every byte of every visible plane once (see [`FrameHandle::consume`]).
    pub fn consume(&self, scratch: &mut Vec<u8>, visit: &mut dyn FnMut(&[u8])) -> bool {
        match self {
            FrameData::Bytes(b) => {
                visit(b);
                true
            }
            FrameData::Handle(h) => h.consume(scratch, visit),
        }
    }

    /// Length of the CPU-visible pixels, if known without producing them.
    pub fn byte_len(&self) -> Option<usize> {
        match self {
            FrameData::Bytes(b) => Some(b.len()),
            FrameData::Handle(h) => h.byte_len(),
        }
    }
}

impl From<Arc<[u8]>> for FrameData {
    fn from(b: Arc<[u8]>) -> Self {
        FrameData::Bytes(b)
    }
}

impl From<Vec<u8>> for FrameData {
    fn from(b: Vec<u8>) -> Self {
        FrameData::Bytes(b.into())
    }
}

impl From<Arc<dyn FrameHandle>> for FrameData {
    fn from(h: Arc<dyn FrameHandle>) -> Self {
        FrameData::Handle(h)
    }
}

/// One frame presented to the display.
#[derive(Clone, Debug)]
pub struct PresentedFrame {
    /// Producer-chosen id, reported back in scan-out records.
    pub id: u64,
    /// The guest that presented it.
    pub owner: GuestId,
    /// The pixels.
    pub data: FrameData,
    /// Pixel layout: a packed RGB format (4 bytes per pixel).
    pub format: PixelFormat,
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// Bytes from one row to the next (at least `width * 4`).
    pub stride: u32,
    /// When the content was captured or decoded (camera or decoder
    /// timestamp, same clock as the display's vsync times), for
    /// motion-to-photon latency.
    pub capture_ns: Option<u64>,
    /// When the frame was submitted to the display.
    pub submitted_ns: u64,
}

impl PresentedFrame {
    /// A tightly packed frame of guest 0, submitted at time 0, with no
    /// capture time; adjust with the `with_*` methods.
    pub fn new(
        id: u64,
        width: u32,
        height: u32,
        format: PixelFormat,
        data: impl Into<FrameData>,
    ) -> Self {
        PresentedFrame {
            id,
            owner: GuestId(0),
            data: data.into(),
            format,
            width,
            height,
            stride: width.saturating_mul(format.bytes_per_pixel()),
            capture_ns: None,
            submitted_ns: 0,
        }
    }

    /// Sets the owner.
    pub fn with_owner(mut self, owner: GuestId) -> Self {
        self.owner = owner;
        self
    }

    /// Sets the capture time.
    pub fn with_capture_ns(mut self, capture_ns: u64) -> Self {
        self.capture_ns = Some(capture_ns);
        self
    }

    /// Sets the submission time.
    pub fn with_submitted_ns(mut self, submitted_ns: u64) -> Self {
        self.submitted_ns = submitted_ns;
        self
    }

    /// Sets the row stride in bytes.
    pub fn with_stride(mut self, stride: u32) -> Self {
        self.stride = stride;
        self
    }

    fn invalid(&self, reason: impl Into<String>) -> DisplayError {
        DisplayError::InvalidFrame {
            id: self.id,
            reason: reason.into(),
        }
    }

    /// Bytes the pixel buffer must hold: every full row but the last, plus
    /// the last row's pixels.
    pub fn required_len(&self) -> u64 {
        let row = u64::from(self.width) * u64::from(self.format.bytes_per_pixel());
        match self.height {
            0 => 0,
            h => u64::from(self.stride) * u64::from(h - 1) + row,
        }
    }

    /// Checks dimensions, stride and (when the pixels are CPU-visible) the
    /// buffer length.
    pub fn validate(&self) -> Result<()> {
        if !self.format.is_rgb() {
            return Err(self.invalid(format!("{:?} is not a scan-out format", self.format)));
        }
        if self.width == 0 || self.height == 0 {
            return Err(self.invalid("zero width or height"));
        }
        if self.width > MAX_DIMENSION || self.height > MAX_DIMENSION {
            return Err(self.invalid(format!(
                "{}x{} exceeds {MAX_DIMENSION}x{MAX_DIMENSION}",
                self.width, self.height
            )));
        }
        let row = u64::from(self.width) * u64::from(self.format.bytes_per_pixel());
        if u64::from(self.stride) < row {
            return Err(self.invalid(format!("stride {} < row size {row}", self.stride)));
        }
        if let Some(len) = self.data.byte_len() {
            let need = self.required_len();
            if (len as u64) < need {
                return Err(self.invalid(format!("{len} bytes of pixels, need {need}")));
            }
        }
        Ok(())
    }

    /// The CPU-visible pixels, validated against the frame's geometry.
    pub fn pixels(&self) -> Result<&[u8]> {
        self.validate()?;
        self.data
            .pixels()
            .ok_or(DisplayError::PixelsUnavailable { id: self.id })
    }

    /// Rows of pixel bytes (`width * 4` each, stride padding cut off).
    pub fn rows(&self) -> Result<impl Iterator<Item = &[u8]>> {
        let px = self.pixels()?;
        let row = self.width as usize * self.format.bytes_per_pixel() as usize;
        let stride = self.stride as usize;
        Ok((0..self.height as usize).map(move |y| &px[y * stride..y * stride + row]))
    }

    /// The frame as tightly packed RGBA8 at `width` x `height`, when its handle can make it
    /// at that size directly ([`FrameHandle::rgba_scaled`]).
    pub fn rgba_scaled(&self, width: u32, height: u32) -> Option<Vec<u8>> {
        match &self.data {
            FrameData::Handle(h) => h.rgba_scaled(width, height),
            FrameData::Bytes(_) => None,
        }
    }

    /// A small full-range YUV 4:2:0 picture for a viewer, when the frame's handle can make
    /// one directly (see [`FrameHandle::view_picture`]).
    pub fn view_picture(&self, width: u32, height: u32) -> Option<ViewPicture> {
        match &self.data {
            FrameData::Handle(h) => h.view_picture(width, height),
            FrameData::Bytes(_) => None,
        }
    }

    /// The pixels as tightly packed R, G, B, A bytes.
    pub fn to_rgba8(&self) -> Result<Vec<u8>> {
        let mut out = Vec::with_capacity(self.width as usize * self.height as usize * 4);
        for row in self.rows()? {
            for px in row.chunks_exact(4) {
                out.extend_from_slice(&to_rgba(self.format, [px[0], px[1], px[2], px[3]]));
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_rejects_bad_geometry() {
        let ok = PresentedFrame::new(1, 2, 2, PixelFormat::Rgba8, vec![0u8; 16]);
        assert!(ok.validate().is_ok());
        let short = PresentedFrame::new(2, 2, 2, PixelFormat::Rgba8, vec![0u8; 15]);
        assert!(matches!(
            short.validate(),
            Err(DisplayError::InvalidFrame { id: 2, .. })
        ));
        let zero = PresentedFrame::new(3, 0, 2, PixelFormat::Rgba8, vec![0u8; 16]);
        assert!(zero.validate().is_err());
        let huge = PresentedFrame::new(4, u32::MAX, 1, PixelFormat::Rgba8, vec![0u8; 16]);
        assert!(huge.validate().is_err());
        let narrow = ok.clone().with_stride(7);
        assert!(narrow.validate().is_err());
        let yuv = PresentedFrame::new(6, 2, 2, PixelFormat::Nv12, vec![0u8; 16]);
        assert!(yuv.validate().is_err());
        // A padded stride needs no padding after the last row.
        let padded =
            PresentedFrame::new(5, 2, 2, PixelFormat::Rgba8, vec![0u8; 20]).with_stride(12);
        assert!(padded.validate().is_ok());
    }

    #[test]
    fn bgra_converts_and_stride_is_skipped() {
        // 1x2 BGRA with 8-byte stride: row 0 = blue, row 1 = red.
        let data = vec![255, 0, 0, 255, 9, 9, 9, 9, 0, 0, 255, 128];
        let f = PresentedFrame::new(1, 1, 2, PixelFormat::Bgra8, data).with_stride(8);
        assert_eq!(f.to_rgba8().unwrap(), vec![0, 0, 255, 255, 255, 0, 0, 128]);
    }

    #[derive(Debug)]
    struct Opaque;
    impl FrameHandle for Opaque {
        fn pixels(&self) -> Option<&[u8]> {
            None
        }
    }

    #[test]
    fn opaque_handles_have_no_pixels() {
        let h: Arc<dyn FrameHandle> = Arc::new(Opaque);
        let f = PresentedFrame::new(9, 4, 4, PixelFormat::Rgba8, h);
        assert!(f.validate().is_ok());
        assert!(matches!(
            f.to_rgba8(),
            Err(DisplayError::PixelsUnavailable { id: 9 })
        ));
    }
}
