//! The pixel formats the display scans out a region in as it is, and the bytes that takes.

#[cfg(test)]
use std::sync::Arc;

#[cfg(test)]
use virtsoc_display as vd;
use virtsoc_frame::PixelFormat;
use virtsoc_proto::wire::Format;
use virtsoc_proto::Status;

use super::Answer;

/// A pixel format the display scans out as it is: a packed RGB one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ScanoutFormat(pub(super) PixelFormat);

impl ScanoutFormat {
    /// The format of a region of format `f`: Rgba8 and Bgra8 only.
    pub(super) fn of(f: Format) -> Answer<Self> {
        match PixelFormat::try_from(f)? {
            p if p.is_rgb() => Ok(ScanoutFormat(p)),
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
            owner: vd::GuestId(0),
            data: vd::FrameData::Bytes(bytes),
            format: self.0,
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
        let layout = virtsoc_media::FrameLayout::with_stride(self.0, width, height, stride).ok()?;
        let frame = virtsoc_media::FrameRef::new(layout, bytes).ok()?;
        virtsoc_media::read_timestamp(frame)
    }
}
