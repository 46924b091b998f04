//! Where the planes of an image region are.
//!
//! The host stacks a region's planes as `virtsoc-frame`'s `FrameLayout` does, from the row
//! stride the host chose at allocation (kept in [`RegionInfo`]); the planes here are that
//! layout's (the one plane rule, declared in `virtsoc-frame`; YUYV, which no device reads,
//! is one plane):
//!
//! | format  | planes (offset, stride)                                              |
//! |---------|----------------------------------------------------------------------|
//! | NV12    | Y (0, `s`), interleaved UV (`s * h`, `s`)                            |
//! | YUV420P | Y (0, `s`), U (`s * h`, `s / 2`), V (`s * h + s / 2 * h / 2`, `s / 2`) |
//! | RGBA8, BGRA8, YUYV | one plane (0, `s`)                                        |
//! | blob    | none                                                                 |
//!
//! The C ABI reports it in `struct virtsoc_region` (`virtsoc_alloc_frame`,
//! `virtsoc_region_info`).

use virtsoc_frame::{FrameLayout, PixelFormat};
use virtsoc_proto::wire::Format;

use crate::RegionInfo;

/// One plane of an image region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Plane {
    /// Byte offset of the plane's first row from the start of the region.
    pub offset: u64,
    /// Bytes from the start of one row to the next.
    pub stride: u32,
    /// Meaningful bytes in a row (`<= stride`).
    pub row_bytes: u32,
    /// Rows in the plane.
    pub rows: u32,
}

impl RegionInfo {
    /// The region's planes in order (Y first for YUV formats); empty for a blob (and for
    /// metadata no frame layout has, which the host never gives).
    pub fn planes(&self) -> Vec<Plane> {
        let (w, h, s) = (self.width, self.height, self.stride);
        if self.format == Format::Yuyv {
            let row_bytes = w.saturating_mul(2);
            return vec![Plane {
                offset: 0,
                stride: s,
                row_bytes,
                rows: h,
            }];
        }
        let layout = PixelFormat::try_from(self.format)
            .ok()
            .and_then(|f| FrameLayout::with_stride(f, w, h, s).ok());
        let Some(layout) = layout else {
            return Vec::new();
        };
        layout
            .planes()
            .iter()
            .map(|p| Plane {
                offset: p.offset as u64,
                stride: p.stride as u32,
                row_bytes: p.row_bytes() as u32,
                rows: p.height,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn region(format: Format, width: u32, height: u32, stride: u32) -> RegionInfo {
        RegionInfo {
            id: crate::RegionId(1),
            size: 0,
            stride,
            width,
            height,
            format,
        }
    }

    #[test]
    fn planes_follow_the_hosts_layout() {
        let p = region(Format::Yuv420p, 320, 240, 384).planes();
        assert_eq!(
            p,
            vec![
                Plane {
                    offset: 0,
                    stride: 384,
                    row_bytes: 320,
                    rows: 240
                },
                Plane {
                    offset: 384 * 240,
                    stride: 192,
                    row_bytes: 160,
                    rows: 120
                },
                Plane {
                    offset: 384 * 240 + 192 * 120,
                    stride: 192,
                    row_bytes: 160,
                    rows: 120
                },
            ]
        );
        let p = region(Format::Nv12, 64, 48, 64).planes();
        assert_eq!(p.len(), 2);
        assert_eq!((p[1].offset, p[1].stride, p[1].rows), (64 * 48, 64, 24));
        let p = region(Format::Rgba8, 10, 4, 40).planes();
        assert_eq!((p.len(), p[0].row_bytes), (1, 40));
        assert!(region(Format::Blob, 0, 0, 0).planes().is_empty());
    }

    #[test]
    fn packed_planes_cover_the_image_size_exactly() {
        for f in Format::ALL.iter().copied().filter(|f| *f != Format::Blob) {
            let (size, stride) = f.image_size(64, 48).unwrap();
            let planes = region(f, 64, 48, stride).planes();
            let end = planes
                .iter()
                .map(|p| p.offset + u64::from(p.stride) * u64::from(p.rows))
                .max()
                .unwrap();
            assert_eq!(end, size, "{f:?}");
        }
    }
}
