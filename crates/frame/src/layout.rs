//! [`FrameLayout`]: format, size and stride of a frame in a flat byte buffer, and the
//! [`PlaneInfo`] of each of its planes.

use crate::{FrameError, PixelFormat, Result};

/// Largest width or height accepted anywhere (a backend may accept less, e.g. the wgpu
/// backend checks the device's `max_texture_dimension_2d` too).
pub const MAX_DIMENSION: u32 = 16384;

/// One plane's place inside a frame buffer: the luma or packed RGB plane, or a chroma plane
/// (half the width and height; NV12's holds U and V interleaved, 2 bytes per texel).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlaneInfo {
    /// Byte offset of the plane's first row.
    pub offset: usize,
    /// Bytes from one row of the plane to the next.
    pub stride: usize,
    /// Width in texels.
    pub width: u32,
    /// Height in texels (rows).
    pub height: u32,
    /// Bytes per texel.
    pub bytes_per_texel: usize,
}

impl PlaneInfo {
    /// Meaningful bytes per row (`width * bytes_per_texel`, at most `stride`).
    pub fn row_bytes(&self) -> usize {
        self.width as usize * self.bytes_per_texel
    }

    /// Rows in the plane.
    pub fn rows(&self) -> usize {
        self.height as usize
    }

    /// Bytes the plane occupies (`stride * rows`).
    pub fn len(&self) -> usize {
        self.stride * self.rows()
    }

    /// True if the plane holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Format, size and row stride of a frame stored in a flat byte buffer.
///
/// The constructors check the layout; one built by struct literal (or received with its
/// fields set by someone else) must pass [`validate`](Self::validate) before its planes are
/// used. Every device checks the layouts it is handed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FrameLayout {
    /// Pixel format, which decides the planes.
    pub format: PixelFormat,
    /// Width in pixels, 1..=[`MAX_DIMENSION`]; even for YUV formats.
    pub width: u32,
    /// Height in pixels, 1..=[`MAX_DIMENSION`]; even for YUV formats.
    pub height: u32,
    /// Luma (YUV) or packed (RGB) row length in bytes, at least `width * bytes_per_pixel`;
    /// even for YUV formats.
    pub stride: u32,
}

impl FrameLayout {
    /// A layout without row padding (`stride = width * bytes per pixel`).
    pub fn packed(format: PixelFormat, width: u32, height: u32) -> Result<Self> {
        let stride = width.saturating_mul(format.bytes_per_pixel());
        Self::with_stride(format, width, height, stride)
    }

    /// A packed layout checked against `max` instead of [`MAX_DIMENSION`] for its width and
    /// height: the sizes a region may be *allocated* with (the wire's limit, larger than what
    /// any device reads) follow the same plane rule as the frames devices take.
    pub fn packed_within(format: PixelFormat, width: u32, height: u32, max: u32) -> Result<Self> {
        let layout = FrameLayout {
            format,
            width,
            height,
            stride: width.saturating_mul(format.bytes_per_pixel()),
        };
        layout.validate_within(max)?;
        Ok(layout)
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

    /// Checks the invariants: a size of 1..=[`MAX_DIMENSION`] each way, a stride of at least
    /// one row, even width, height and stride for YUV, and a byte size that fits `usize`.
    pub fn validate(&self) -> Result<()> {
        self.validate_within(MAX_DIMENSION)
    }

    /// [`validate`](Self::validate) with `max` in place of [`MAX_DIMENSION`].
    fn validate_within(&self, max: u32) -> Result<()> {
        let (format, width, height, stride) = (self.format, self.width, self.height, self.stride);
        if width == 0 || height == 0 {
            return Err(FrameError::ZeroSize { width, height });
        }
        if width > max || height > max {
            return Err(FrameError::TooLarge { width, height, max });
        }
        let min = u64::from(width) * u64::from(format.bytes_per_pixel());
        if u64::from(stride) < min {
            return Err(FrameError::StrideTooSmall {
                format,
                width,
                stride,
                min,
            });
        }
        if format.is_yuv() {
            if width % 2 != 0 || height % 2 != 0 {
                return Err(FrameError::OddSize {
                    format,
                    width,
                    height,
                });
            }
            if stride % 2 != 0 {
                return Err(FrameError::OddStride { format, stride });
            }
        }
        // 16384 rows * 4 GiB strides would overflow a 32-bit usize; be explicit.
        let total = u64::from(stride) * u64::from(height) * 2;
        if usize::try_from(total).is_err() {
            return Err(FrameError::Overflow { stride, height });
        }
        Ok(())
    }

    /// Total bytes of all planes. Meaningful for a valid layout (saturates otherwise).
    pub fn size(&self) -> usize {
        let luma = u64::from(self.stride) * u64::from(self.height);
        let total = if self.format.is_yuv() {
            luma.saturating_add(luma / 2)
        } else {
            luma
        };
        usize::try_from(total).unwrap_or(usize::MAX)
    }

    /// Checks the layout and returns its size in bytes.
    pub fn size_bytes(&self) -> Result<usize> {
        self.validate()?;
        Ok(self.size())
    }

    /// Width and height of the chroma planes (YUV only).
    pub fn chroma_size(&self) -> (u32, u32) {
        (self.width / 2, self.height / 2)
    }

    /// Plane `index` (0 = Y or packed, 1 = UV or U, 2 = V), `None` past the last plane.
    /// Meaningful for a valid layout.
    pub fn plane(&self, index: usize) -> Option<PlaneInfo> {
        let stride = self.stride as usize;
        let (w, h) = (self.width, self.height);
        let (cw, ch) = self.chroma_size();
        let luma = stride * h as usize;
        let info = |offset, stride, width, height, bytes_per_texel| PlaneInfo {
            offset,
            stride,
            width,
            height,
            bytes_per_texel,
        };
        match (self.format, index) {
            (PixelFormat::Rgba8 | PixelFormat::Bgra8, 0) => Some(info(0, stride, w, h, 4)),
            (PixelFormat::Nv12 | PixelFormat::Yuv420p, 0) => Some(info(0, stride, w, h, 1)),
            (PixelFormat::Nv12, 1) => Some(info(luma, stride, cw, ch, 2)),
            (PixelFormat::Yuv420p, 1 | 2) => {
                let cs = stride / 2;
                let offset = luma + (index - 1) * cs * ch as usize;
                Some(info(offset, cs, cw, ch, 1))
            }
            _ => None,
        }
    }

    /// All planes in order. Meaningful for a valid layout.
    pub fn planes(&self) -> Vec<PlaneInfo> {
        (0..self.format.plane_count())
            .filter_map(|i| self.plane(i))
            .collect()
    }

    /// The same format at another size, packed.
    pub fn resized(&self, width: u32, height: u32) -> Result<Self> {
        Self::packed(self.format, width, height)
    }

    /// Checks the layout and that a buffer of `len` bytes holds it.
    pub fn check_buffer(&self, len: usize) -> Result<()> {
        self.validate()?;
        let needed = self.size();
        if len < needed {
            return Err(FrameError::BufferTooSmall { needed, got: len });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_planes() {
        let l = FrameLayout::packed(PixelFormat::Nv12, 64, 48).unwrap();
        assert_eq!(l.size(), 64 * 48 * 3 / 2);
        assert_eq!(l.size_bytes(), Ok(l.size()));
        let uv = l.plane(1).unwrap();
        assert_eq!(
            (uv.offset, uv.stride, uv.row_bytes(), uv.rows()),
            (64 * 48, 64, 64, 24)
        );
        assert_eq!((uv.width, uv.height, uv.bytes_per_texel), (32, 24, 2));
        let l = FrameLayout::with_stride(PixelFormat::Yuv420p, 64, 48, 80).unwrap();
        assert_eq!(l.size(), 80 * 48 + 2 * 40 * 24);
        assert_eq!(l.plane(2).unwrap().offset, 80 * 48 + 40 * 24);
        assert_eq!(l.plane(2).unwrap().stride, 40);
        assert_eq!(l.plane(3), None);
        assert_eq!(l.planes().len(), 3);
        let l = FrameLayout::packed(PixelFormat::Bgra8, 3, 5).unwrap();
        assert_eq!(l.size(), 60);
        assert_eq!(l.planes(), [l.plane(0).unwrap()]);
        assert_eq!(l.resized(4, 4).unwrap().stride, 16);
    }

    #[test]
    fn plane_sizes_add_up_to_the_frame() {
        for f in PixelFormat::ALL {
            let l = FrameLayout::with_stride(f, 16, 8, 80).unwrap();
            let last = *l.planes().last().unwrap();
            assert_eq!(last.offset + last.len(), l.size(), "{f:?}");
        }
    }

    #[test]
    fn rejects_bad_layouts() {
        use FrameError as E;
        let nv12 = PixelFormat::Nv12;
        assert!(matches!(
            FrameLayout::packed(nv12, 63, 48),
            Err(E::OddSize { .. })
        ));
        assert!(matches!(
            FrameLayout::packed(PixelFormat::Yuv420p, 64, 47),
            Err(E::OddSize { .. })
        ));
        assert!(matches!(
            FrameLayout::packed(PixelFormat::Rgba8, 0, 4),
            Err(E::ZeroSize {
                width: 0,
                height: 4
            })
        ));
        assert!(matches!(
            FrameLayout::with_stride(PixelFormat::Rgba8, 8, 4, 31),
            Err(E::StrideTooSmall { min: 32, .. })
        ));
        assert!(matches!(
            FrameLayout::with_stride(PixelFormat::Yuv420p, 8, 4, 9),
            Err(E::OddStride { stride: 9, .. })
        ));
        assert!(matches!(
            FrameLayout::packed(PixelFormat::Rgba8, MAX_DIMENSION + 1, 4),
            Err(E::TooLarge { .. })
        ));
        assert!(matches!(
            FrameLayout::packed(PixelFormat::Rgba8, u32::MAX, 4),
            Err(E::TooLarge { .. })
        ));
        let l = FrameLayout::packed(PixelFormat::Rgba8, 4, 4).unwrap();
        assert_eq!(
            l.check_buffer(63),
            Err(E::BufferTooSmall {
                needed: 64,
                got: 63
            })
        );
        assert_eq!(l.check_buffer(64), Ok(()));
        let odd = FrameLayout { width: 3, ..l };
        assert!(odd.check_buffer(1000).is_ok());
        let bad = FrameLayout { stride: 1, ..l };
        assert!(bad.size_bytes().is_err());
    }

    #[test]
    fn packed_within_moves_only_the_size_limit() {
        let big = FrameLayout::packed_within(PixelFormat::Rgba8, MAX_DIMENSION + 2, 2, 1 << 15);
        assert_eq!(
            big.map(|l| l.size()),
            Ok((MAX_DIMENSION as usize + 2) * 2 * 4)
        );
        assert!(matches!(
            FrameLayout::packed_within(PixelFormat::Rgba8, 9, 2, 8),
            Err(FrameError::TooLarge { max: 8, .. })
        ));
        assert!(matches!(
            FrameLayout::packed_within(PixelFormat::Nv12, 3, 2, 1 << 15),
            Err(FrameError::OddSize { .. })
        ));
    }
}
