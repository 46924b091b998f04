//! [`PixelFormat`]: the pixel formats frames come in.

/// The pixel formats of frames: the union of what the codec, ISP, camera, GPU and display
/// devices read and write. The display scans out only the packed RGB ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PixelFormat {
    /// 8-bit 4:2:0, Y plane then one interleaved U/V plane at half resolution.
    Nv12,
    /// 8-bit 4:2:0, Y, U and V planes; chroma at half resolution, chroma stride `stride / 2`.
    Yuv420p,
    /// 8-bit packed R, G, B, A (straight alpha).
    Rgba8,
    /// 8-bit packed B, G, R, A (straight alpha; the common scan-out format).
    Bgra8,
}

impl PixelFormat {
    /// All formats, for tests and capability listings. The camera numbers its modes' formats
    /// by their place here, so the order is kept.
    pub const ALL: [PixelFormat; 4] = [
        PixelFormat::Nv12,
        PixelFormat::Yuv420p,
        PixelFormat::Rgba8,
        PixelFormat::Bgra8,
    ];

    /// True for the 4:2:0 YUV formats (BT.601 limited range).
    pub const fn is_yuv(self) -> bool {
        matches!(self, PixelFormat::Nv12 | PixelFormat::Yuv420p)
    }

    /// True for the packed 4-byte RGB formats.
    pub const fn is_rgb(self) -> bool {
        !self.is_yuv()
    }

    /// Bytes per pixel of the first plane: 1 for YUV luma, 4 for packed RGB.
    pub const fn bytes_per_pixel(self) -> u32 {
        if self.is_yuv() {
            1
        } else {
            4
        }
    }

    /// Number of planes.
    pub const fn plane_count(self) -> usize {
        match self {
            PixelFormat::Nv12 => 2,
            PixelFormat::Yuv420p => 3,
            PixelFormat::Rgba8 | PixelFormat::Bgra8 => 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_and_planes() {
        for f in PixelFormat::ALL {
            assert_ne!(f.is_yuv(), f.is_rgb());
            assert_eq!(f.bytes_per_pixel(), if f.is_yuv() { 1 } else { 4 });
        }
        assert_eq!(PixelFormat::Nv12.plane_count(), 2);
        assert_eq!(PixelFormat::Yuv420p.plane_count(), 3);
        assert_eq!(PixelFormat::Bgra8.plane_count(), 1);
    }
}
