//! Frame descriptions shared by every backend: [`PixelFormat`], [`FrameLayout`] and the
//! borrowed views [`FrameRef`] / [`FrameMut`] over plain byte buffers.
//!
//! The daemon's devices get their bytes from SVM region replicas, so a frame is nothing but a
//! layout plus a byte slice at least [`FrameLayout::size`] long. Planes are tightly stacked:
//!
//! | format  | planes (offset order)                                   |
//! |---------|---------------------------------------------------------|
//! | NV12    | Y (`stride * h`), interleaved UV (`stride * h / 2`)     |
//! | YUV420P | Y (`stride * h`), U, V (each `stride / 2 * h / 2`)      |
//! | RGBA    | one plane, 4 bytes per pixel (R, G, B, A in memory)     |
//! | BGRA    | one plane, 4 bytes per pixel (B, G, R, A in memory)     |
//!
//! `stride` is the luma (YUV) or packed (RGB) row length in bytes. YUV formats need even width,
//! height and stride.

use crate::error::{MediaError, Result};

/// Largest width or height accepted anywhere in the crate.
pub const MAX_DIMENSION: u32 = 16384;

/// Pixel formats understood by the media backends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PixelFormat {
    /// 8-bit 4:2:0, Y plane then one interleaved U/V plane.
    Nv12,
    /// 8-bit 4:2:0, Y, U and V planes.
    Yuv420p,
    /// 8-bit packed R, G, B, A.
    Rgba8,
    /// 8-bit packed B, G, R, A.
    Bgra8,
}

impl PixelFormat {
    /// All formats, for tests and capability listings.
    pub const ALL: [PixelFormat; 4] = [
        PixelFormat::Nv12,
        PixelFormat::Yuv420p,
        PixelFormat::Rgba8,
        PixelFormat::Bgra8,
    ];

    /// True for the 4:2:0 YUV formats.
    pub fn is_yuv(self) -> bool {
        matches!(self, PixelFormat::Nv12 | PixelFormat::Yuv420p)
    }

    /// Bytes per pixel of the first plane (1 for YUV luma, 4 for packed RGB).
    pub fn luma_bytes_per_pixel(self) -> u32 {
        if self.is_yuv() {
            1
        } else {
            4
        }
    }

    /// Number of planes.
    pub fn plane_count(self) -> usize {
        match self {
            PixelFormat::Nv12 => 2,
            PixelFormat::Yuv420p => 3,
            PixelFormat::Rgba8 | PixelFormat::Bgra8 => 1,
        }
    }
}

/// One plane's place inside a frame buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlaneInfo {
    /// Byte offset of the plane's first row.
    pub offset: usize,
    /// Bytes between rows.
    pub stride: usize,
    /// Meaningful bytes per row (`<= stride`).
    pub row_bytes: usize,
    /// Rows in the plane.
    pub rows: usize,
}

impl PlaneInfo {
    /// Bytes the plane occupies (`stride * rows`).
    pub fn len(&self) -> usize {
        self.stride * self.rows
    }

    /// True if the plane holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Format, size and row stride of a frame stored in a flat byte buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FrameLayout {
    /// Pixel format.
    pub format: PixelFormat,
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// Luma (YUV) or packed (RGB) row length in bytes.
    pub stride: u32,
}

impl FrameLayout {
    /// A layout without row padding (`stride = width * bytes per pixel`).
    pub fn packed(format: PixelFormat, width: u32, height: u32) -> Result<Self> {
        let stride = width
            .checked_mul(format.luma_bytes_per_pixel())
            .ok_or_else(|| MediaError::InvalidLayout(format!("width {width} overflows")))?;
        Self::with_stride(format, width, height, stride)
    }

    /// A layout with an explicit row stride (bytes).
    pub fn with_stride(format: PixelFormat, width: u32, height: u32, stride: u32) -> Result<Self> {
        let layout = FrameLayout {
            format,
            width,
            height,
            stride,
        };
        layout.validate()?;
        Ok(layout)
    }

    /// Checks the invariants; layouts built by struct literal must pass this before use
    /// (every entry point of the crate calls it).
    pub fn validate(&self) -> Result<()> {
        let bad = |why: String| Err(MediaError::InvalidLayout(format!("{self:?}: {why}")));
        if self.width == 0 || self.height == 0 {
            return bad("zero size".into());
        }
        if self.width > MAX_DIMENSION || self.height > MAX_DIMENSION {
            return bad(format!("larger than {MAX_DIMENSION}"));
        }
        let min_stride = self.width as u64 * self.format.luma_bytes_per_pixel() as u64;
        if (self.stride as u64) < min_stride {
            return bad(format!("stride below {min_stride}"));
        }
        if self.format.is_yuv() {
            if self.width % 2 != 0 || self.height % 2 != 0 {
                return bad("YUV 4:2:0 needs even width and height".into());
            }
            if self.stride % 2 != 0 {
                return bad("YUV 4:2:0 needs an even stride".into());
            }
        }
        // 16384 rows * 4 GiB strides would overflow 32-bit usize; be explicit.
        let total = (self.stride as u64) * (self.height as u64) * 2;
        if usize::try_from(total).is_err() {
            return bad("size overflows usize".into());
        }
        Ok(())
    }

    /// Total bytes of all planes.
    pub fn size(&self) -> usize {
        let luma = self.stride as usize * self.height as usize;
        match self.format {
            PixelFormat::Nv12 | PixelFormat::Yuv420p => luma + luma / 2,
            PixelFormat::Rgba8 | PixelFormat::Bgra8 => luma,
        }
    }

    /// Plane `index` (0 = Y or packed, 1 = UV or U, 2 = V). `None` past the last plane.
    pub fn plane(&self, index: usize) -> Option<PlaneInfo> {
        let stride = self.stride as usize;
        let w = self.width as usize;
        let h = self.height as usize;
        let luma = stride * h;
        match (self.format, index) {
            (PixelFormat::Rgba8 | PixelFormat::Bgra8, 0) => Some(PlaneInfo {
                offset: 0,
                stride,
                row_bytes: w * 4,
                rows: h,
            }),
            (PixelFormat::Nv12 | PixelFormat::Yuv420p, 0) => Some(PlaneInfo {
                offset: 0,
                stride,
                row_bytes: w,
                rows: h,
            }),
            (PixelFormat::Nv12, 1) => Some(PlaneInfo {
                offset: luma,
                stride,
                row_bytes: w,
                rows: h / 2,
            }),
            (PixelFormat::Yuv420p, 1 | 2) => {
                let cs = stride / 2;
                Some(PlaneInfo {
                    offset: luma + (index - 1) * cs * (h / 2),
                    stride: cs,
                    row_bytes: w / 2,
                    rows: h / 2,
                })
            }
            _ => None,
        }
    }

    /// All planes in order.
    pub fn planes(&self) -> Vec<PlaneInfo> {
        (0..self.format.plane_count())
            .filter_map(|i| self.plane(i))
            .collect()
    }

    /// The same format and size with a different dimension, keeping the layout packed.
    pub fn resized(&self, width: u32, height: u32) -> Result<Self> {
        Self::packed(self.format, width, height)
    }

    fn check_buffer(&self, len: usize) -> Result<()> {
        self.validate()?;
        let needed = self.size();
        if len < needed {
            return Err(MediaError::BufferTooSmall { needed, got: len });
        }
        Ok(())
    }
}

/// A read-only frame: a layout over a byte buffer of at least `layout.size()` bytes.
#[derive(Debug, Clone, Copy)]
pub struct FrameRef<'a> {
    /// How the bytes are arranged.
    pub layout: FrameLayout,
    /// The bytes (may be longer than the layout needs).
    pub data: &'a [u8],
}

impl<'a> FrameRef<'a> {
    /// Validates the layout and the buffer size.
    pub fn new(layout: FrameLayout, data: &'a [u8]) -> Result<Self> {
        layout.check_buffer(data.len())?;
        Ok(FrameRef { layout, data })
    }

    /// Re-checks a frame whose public fields may have been set by hand.
    pub fn validate(&self) -> Result<()> {
        self.layout.check_buffer(self.data.len())
    }

    /// The bytes of plane `index` (`stride * rows`), or `None` if there is no such plane.
    /// Assumes a validated frame.
    pub fn plane(&self, index: usize) -> Option<&'a [u8]> {
        let p = self.layout.plane(index)?;
        self.data.get(p.offset..p.offset + p.len())
    }
}

/// A writable frame: a layout over a byte buffer of at least `layout.size()` bytes.
#[derive(Debug)]
pub struct FrameMut<'a> {
    /// How the bytes are arranged.
    pub layout: FrameLayout,
    /// The bytes (may be longer than the layout needs).
    pub data: &'a mut [u8],
}

impl<'a> FrameMut<'a> {
    /// Validates the layout and the buffer size.
    pub fn new(layout: FrameLayout, data: &'a mut [u8]) -> Result<Self> {
        layout.check_buffer(data.len())?;
        Ok(FrameMut { layout, data })
    }

    /// Re-checks a frame whose public fields may have been set by hand.
    pub fn validate(&self) -> Result<()> {
        self.layout.check_buffer(self.data.len())
    }

    /// A read-only view of the same frame.
    pub fn as_ref(&self) -> FrameRef<'_> {
        FrameRef {
            layout: self.layout,
            data: self.data,
        }
    }

    /// A shorter-lived writable view of the same frame.
    pub fn reborrow(&mut self) -> FrameMut<'_> {
        FrameMut {
            layout: self.layout,
            data: self.data,
        }
    }

    /// Disjoint mutable slices of every plane, in plane order. Assumes a validated frame.
    pub fn planes_mut(&mut self) -> Vec<&mut [u8]> {
        let mut out = Vec::with_capacity(3);
        let mut rest: &mut [u8] = self.data;
        let mut consumed = 0usize;
        for p in self.layout.planes() {
            let skip = p.offset - consumed;
            let tmp = std::mem::take(&mut rest);
            let (_, tail) = tmp.split_at_mut(skip.min(tmp.len()));
            let n = p.len().min(tail.len());
            let (plane, tail) = tail.split_at_mut(n);
            out.push(plane);
            rest = tail;
            consumed = p.offset + n;
        }
        out
    }
}

/// Copies `src` into `dst` row by row; both must have the same format, width and height
/// (strides may differ).
pub fn copy_frame(src: FrameRef<'_>, dst: FrameMut<'_>) -> Result<()> {
    src.validate()?;
    dst.validate()?;
    let (s, d) = (src.layout, dst.layout);
    if s.format != d.format || s.width != d.width || s.height != d.height {
        return Err(MediaError::Unsupported(format!(
            "copy needs equal format and size, got {s:?} -> {d:?}"
        )));
    }
    for (sp, dp) in s.planes().into_iter().zip(d.planes()) {
        if sp.stride == dp.stride {
            let n = sp.len();
            dst.data[dp.offset..dp.offset + n].copy_from_slice(&src.data[sp.offset..sp.offset + n]);
            continue;
        }
        for row in 0..sp.rows {
            let so = sp.offset + row * sp.stride;
            let dof = dp.offset + row * dp.stride;
            dst.data[dof..dof + sp.row_bytes].copy_from_slice(&src.data[so..so + sp.row_bytes]);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_planes() {
        let l = FrameLayout::packed(PixelFormat::Nv12, 64, 48).unwrap();
        assert_eq!(l.size(), 64 * 48 * 3 / 2);
        assert_eq!(l.plane(1).unwrap().offset, 64 * 48);
        let l = FrameLayout::with_stride(PixelFormat::Yuv420p, 64, 48, 80).unwrap();
        assert_eq!(l.size(), 80 * 48 + 2 * 40 * 24);
        assert_eq!(l.plane(2).unwrap().offset, 80 * 48 + 40 * 24);
        assert_eq!(l.plane(3), None);
        let l = FrameLayout::packed(PixelFormat::Bgra8, 3, 5).unwrap();
        assert_eq!(l.size(), 60);
    }

    #[test]
    fn rejects_bad_layouts() {
        assert!(FrameLayout::packed(PixelFormat::Nv12, 63, 48).is_err());
        assert!(FrameLayout::packed(PixelFormat::Yuv420p, 64, 47).is_err());
        assert!(FrameLayout::packed(PixelFormat::Rgba8, 0, 4).is_err());
        assert!(FrameLayout::with_stride(PixelFormat::Rgba8, 8, 4, 31).is_err());
        assert!(FrameLayout::with_stride(PixelFormat::Yuv420p, 8, 4, 9).is_err());
        assert!(FrameLayout::packed(PixelFormat::Rgba8, MAX_DIMENSION + 1, 4).is_err());
        let l = FrameLayout::packed(PixelFormat::Rgba8, 4, 4).unwrap();
        assert!(matches!(
            FrameRef::new(l, &[0u8; 63]),
            Err(MediaError::BufferTooSmall {
                needed: 64,
                got: 63
            })
        ));
    }

    #[test]
    fn planes_mut_are_disjoint_and_complete() {
        let l = FrameLayout::packed(PixelFormat::Yuv420p, 8, 4).unwrap();
        let mut buf = vec![0u8; l.size() + 7];
        let mut f = FrameMut::new(l, &mut buf).unwrap();
        let planes = f.planes_mut();
        assert_eq!(
            planes.iter().map(|p| p.len()).collect::<Vec<_>>(),
            [32, 8, 8]
        );
    }
}
