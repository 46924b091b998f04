//! Frame layouts over plain byte buffers (the bytes of SVM region replicas).

use std::fmt;

use crate::{GpuError, Result};

/// Largest width or height any backend accepts. The wgpu backend additionally
/// checks the device's `max_texture_dimension_2d`.
pub const MAX_DIMENSION: u32 = 16384;

/// Pixel formats the GPU device understands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PixelFormat {
    /// 8-bit Y plane followed by an interleaved U/V plane at half resolution.
    Nv12,
    /// 8-bit Y, U and V planes; chroma at half resolution, chroma stride = stride / 2.
    Yuv420p,
    /// 8-bit R, G, B, A bytes per pixel (straight alpha).
    Rgba8,
    /// 8-bit B, G, R, A bytes per pixel (straight alpha).
    Bgra8,
}

impl PixelFormat {
    /// True for the planar/semi-planar YUV formats (BT.601 limited range).
    pub fn is_yuv(self) -> bool {
        matches!(self, PixelFormat::Nv12 | PixelFormat::Yuv420p)
    }

    /// True for the packed 4-byte RGB formats.
    pub fn is_rgb(self) -> bool {
        !self.is_yuv()
    }

    /// Bytes per pixel of the luma (or packed) plane.
    pub fn bytes_per_pixel(self) -> u32 {
        if self.is_yuv() {
            1
        } else {
            4
        }
    }
}

/// Shape of a frame in a byte buffer.
///
/// `stride` is the luma (or packed) row pitch in bytes. Planes are stacked
/// tightly: NV12 = Y (`stride * height`) then interleaved UV
/// (`stride * height / 2`); YUV420P = Y, U, V with chroma stride `stride / 2`.
/// YUV frames must have even width and height.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FrameLayout {
    /// Pixel format, which decides the planes.
    pub format: PixelFormat,
    /// Width in pixels, 1..=[`MAX_DIMENSION`]; even for YUV formats.
    pub width: u32,
    /// Height in pixels, 1..=[`MAX_DIMENSION`]; even for YUV formats.
    pub height: u32,
    /// Row pitch of the luma (or packed) plane in bytes, at least `width * bytes_per_pixel`.
    pub stride: u32,
}

/// One plane of a frame in its byte layout: the luma or packed RGB plane, or a chroma plane
/// (half the width and height; NV12's holds U and V interleaved, 2 bytes per texel).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlaneInfo {
    /// Where the plane starts in the frame's bytes.
    pub offset: usize,
    /// Bytes from one row of the plane to the next.
    pub stride: usize,
    /// Width in texels.
    pub width: u32,
    /// Height in texels.
    pub height: u32,
    /// Bytes per texel.
    pub bytes_per_texel: usize,
}

/// Byte ranges of the planes of a validated layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Planes {
    /// (offset, stride) of plane 0 (Y or packed RGB).
    pub p0: (usize, usize),
    /// (offset, stride) of plane 1 (NV12 UV or YUV420P U), if any.
    pub p1: Option<(usize, usize)>,
    /// (offset, stride) of plane 2 (YUV420P V), if any.
    pub p2: Option<(usize, usize)>,
    /// Total bytes the frame occupies.
    pub size: usize,
}

impl FrameLayout {
    /// A layout with the tightest stride (`width * bytes_per_pixel`).
    pub fn new(format: PixelFormat, width: u32, height: u32) -> Self {
        FrameLayout {
            format,
            width,
            height,
            stride: width.saturating_mul(format.bytes_per_pixel()),
        }
    }

    /// A layout with an explicit stride.
    pub fn with_stride(format: PixelFormat, width: u32, height: u32, stride: u32) -> Self {
        FrameLayout {
            format,
            width,
            height,
            stride,
        }
    }

    /// Checks dimensions and stride; returns the number of bytes the frame needs.
    pub fn size_bytes(&self) -> Result<usize> {
        Ok(self.planes()?.size)
    }

    /// Checks dimensions and stride.
    pub fn validate(&self) -> Result<()> {
        self.planes().map(|_| ())
    }

    /// Width and height of the chroma planes (YUV only).
    pub fn chroma_size(&self) -> (u32, u32) {
        (self.width / 2, self.height / 2)
    }

    /// The planes of the layout (luma or packed RGB first), each with its place in the
    /// frame's bytes and its size in texels.
    pub fn plane_infos(&self) -> Result<Vec<PlaneInfo>> {
        let p = self.planes()?;
        let (w, h) = (self.width, self.height);
        let (cw, ch) = self.chroma_size();
        let info = |(offset, stride): (usize, usize), width, height, bytes_per_texel| PlaneInfo {
            offset,
            stride,
            width,
            height,
            bytes_per_texel,
        };
        Ok(match self.format {
            PixelFormat::Rgba8 | PixelFormat::Bgra8 => vec![info(p.p0, w, h, 4)],
            PixelFormat::Nv12 => vec![
                info(p.p0, w, h, 1),
                info(p.p1.unwrap_or_default(), cw, ch, 2),
            ],
            PixelFormat::Yuv420p => vec![
                info(p.p0, w, h, 1),
                info(p.p1.unwrap_or_default(), cw, ch, 1),
                info(p.p2.unwrap_or_default(), cw, ch, 1),
            ],
        })
    }

    pub(crate) fn planes(&self) -> Result<Planes> {
        if self.width == 0 || self.height == 0 {
            return Err(GpuError::ZeroSize {
                width: self.width,
                height: self.height,
            });
        }
        if self.width > MAX_DIMENSION || self.height > MAX_DIMENSION {
            return Err(GpuError::TooLarge {
                width: self.width,
                height: self.height,
                max: MAX_DIMENSION,
            });
        }
        let row = self.width as u64 * self.format.bytes_per_pixel() as u64;
        if (self.stride as u64) < row {
            return Err(GpuError::InvalidLayout(format!(
                "stride {} < {} bytes per row for {:?} width {}",
                self.stride, row, self.format, self.width
            )));
        }
        if self.format.is_yuv() && (!self.width.is_multiple_of(2) || !self.height.is_multiple_of(2))
        {
            return Err(GpuError::InvalidLayout(format!(
                "{:?} needs even width and height, got {}x{}",
                self.format, self.width, self.height
            )));
        }
        let stride = self.stride as usize;
        let h = self.height as usize;
        let luma = stride * h;
        let planes = match self.format {
            PixelFormat::Rgba8 | PixelFormat::Bgra8 => Planes {
                p0: (0, stride),
                p1: None,
                p2: None,
                size: luma,
            },
            PixelFormat::Nv12 => Planes {
                p0: (0, stride),
                p1: Some((luma, stride)),
                p2: None,
                size: luma + stride * (h / 2),
            },
            PixelFormat::Yuv420p => {
                let cs = stride / 2;
                let chroma = cs * (h / 2);
                Planes {
                    p0: (0, stride),
                    p1: Some((luma, cs)),
                    p2: Some((luma + chroma, cs)),
                    size: luma + 2 * chroma,
                }
            }
        };
        Ok(planes)
    }

    /// Validates the layout against a buffer length.
    pub(crate) fn check_buffer(&self, len: usize) -> Result<Planes> {
        let planes = self.planes()?;
        if len < planes.size {
            return Err(GpuError::BufferTooSmall {
                needed: planes.size,
                got: len,
            });
        }
        Ok(planes)
    }
}

/// A read-only frame: a layout over borrowed bytes.
#[derive(Clone, Copy)]
pub struct FrameRef<'a> {
    /// Shape of the frame in `data`.
    pub layout: FrameLayout,
    /// The frame's bytes; at least [`FrameLayout::size_bytes`] long (longer is fine).
    pub data: &'a [u8],
}

/// A writable frame: a layout over mutably borrowed bytes.
pub struct FrameMut<'a> {
    /// Shape of the frame in `data`.
    pub layout: FrameLayout,
    /// The frame's bytes; at least [`FrameLayout::size_bytes`] long (longer is fine).
    pub data: &'a mut [u8],
}

impl<'a> FrameRef<'a> {
    /// Wraps `data` as a frame of `layout` (checked when an operation uses it).
    pub fn new(layout: FrameLayout, data: &'a [u8]) -> Self {
        FrameRef { layout, data }
    }
}

impl<'a> FrameMut<'a> {
    /// Wraps `data` as a frame of `layout` (checked when an operation uses it).
    pub fn new(layout: FrameLayout, data: &'a mut [u8]) -> Self {
        FrameMut { layout, data }
    }

    /// Reborrows as a read-only frame.
    pub fn as_ref(&self) -> FrameRef<'_> {
        FrameRef {
            layout: self.layout,
            data: self.data,
        }
    }

    /// Reborrows mutably (so a `FrameMut` can be passed by value twice).
    pub fn reborrow(&mut self) -> FrameMut<'_> {
        FrameMut {
            layout: self.layout,
            data: self.data,
        }
    }
}

impl fmt::Debug for FrameRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FrameRef")
            .field("layout", &self.layout)
            .field("len", &self.data.len())
            .finish()
    }
}

impl fmt::Debug for FrameMut<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FrameMut")
            .field("layout", &self.layout)
            .field("len", &self.data.len())
            .finish()
    }
}

/// An owned frame, handy for tests, benchmarks and callers without a replica.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnedFrame {
    /// Shape of the frame in `data`.
    pub layout: FrameLayout,
    /// The frame's bytes, exactly [`FrameLayout::size_bytes`] long when built by
    /// [`OwnedFrame::new`].
    pub data: Vec<u8>,
}

impl OwnedFrame {
    /// A zero-filled frame of the given layout.
    pub fn new(layout: FrameLayout) -> Result<Self> {
        let size = layout.size_bytes()?;
        Ok(OwnedFrame {
            layout,
            data: vec![0; size],
        })
    }

    /// Borrows as a read-only frame.
    pub fn as_ref(&self) -> FrameRef<'_> {
        FrameRef {
            layout: self.layout,
            data: &self.data,
        }
    }

    /// Borrows as a writable frame.
    pub fn as_mut(&mut self) -> FrameMut<'_> {
        FrameMut {
            layout: self.layout,
            data: &mut self.data,
        }
    }
}
