//! Pixel formats the display scans out, in the display's and the media crate's terms.

#[cfg(test)]
use std::sync::Arc;

use virtsoc_display as vd;
use virtsoc_proto::wire::Format;
use virtsoc_proto::Status;

use super::Answer;

/// A pixel format the display scans out, in the display's and the media crate's terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct FrameFormat {
    pub(super) display: vd::PixelFormat,
    pub(super) media: virtsoc_media::PixelFormat,
}

impl FrameFormat {
    /// The format of a region of format `f`: Rgba8 and Bgra8 only.
    pub(super) fn of(f: Format) -> Answer<Self> {
        match f {
            Format::Rgba8 => Ok(FrameFormat {
                display: vd::PixelFormat::Rgba8,
                media: virtsoc_media::PixelFormat::Rgba8,
            }),
            Format::Bgra8 => Ok(FrameFormat {
                display: vd::PixelFormat::Bgra8,
                media: virtsoc_media::PixelFormat::Bgra8,
            }),
            _ => Err(Status::NotSupported),
        }
    }

    /// Bytes of a `width` x `height` image with rows `stride` bytes apart, checked against
    /// the region's `size`.
    pub(super) fn required_len(
        &self,
        width: u32,
        height: u32,
        stride: u32,
        size: u64,
    ) -> Answer<usize> {
        let row = u64::from(width) * 4;
        if width == 0 || height == 0 || u64::from(stride) < row {
            return Err(Status::BadArgument);
        }
        let need = u64::from(stride) * u64::from(height - 1) + row;
        if need > size {
            return Err(Status::BadArgument);
        }
        usize::try_from(need).map_err(|_| Status::BadArgument)
    }

    /// A frame of these pixels (owner, id and submission time are set when presenting). With
    /// no `capture_ns`, a capture time stamped into the pixels is used, if there is one.
    #[cfg(test)]
    pub(super) fn frame(
        &self,
        bytes: Arc<[u8]>,
        width: u32,
        height: u32,
        stride: u32,
        capture_ns: Option<u64>,
    ) -> vd::PresentedFrame {
        let capture_ns = capture_ns.or_else(|| self.stamped_time(&bytes, width, height, stride));
        vd::PresentedFrame {
            id: 0,
            owner: 0,
            data: vd::FrameData::Bytes(bytes),
            format: self.display,
            width,
            height,
            stride,
            capture_ns,
            submitted_ns: 0,
        }
    }

    /// The capture time the camera stamped into the pixels, if any.
    #[cfg(test)]
    pub(super) fn stamped_time(
        &self,
        bytes: &[u8],
        width: u32,
        height: u32,
        stride: u32,
    ) -> Option<u64> {
        let layout =
            virtsoc_media::FrameLayout::with_stride(self.media, width, height, stride).ok()?;
        let frame = virtsoc_media::FrameRef::new(layout, bytes).ok()?;
        virtsoc_media::read_timestamp(frame)
    }
}
