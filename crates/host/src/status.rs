//! What a guest sees of the daemon's results: the one mapping from every error type to the
//! [`Status`] of a completion, and the words of an access request and its reply.
//!
//! Every error a request can meet (the SVM manager's, a media backend's, the GPU's, a frame
//! layout's) becomes a status here and nowhere else: [`GuestStatus`] has one impl per error
//! type, and [`status_of`] is the one function callers use. (The trait is ours rather than
//! `From<&E> for Status` because both types live in other crates.) The session's inline
//! requests ([`crate::dispatch`]) and the device workers ([`crate::device`]) both decode
//! accesses with [`access_spec`] and answer them with [`access_values`], so neither depends on
//! the other for them.

use virtsoc_frame::FrameError;
use virtsoc_gpu::GpuError;
use virtsoc_media::MediaError;
use virtsoc_proto::ops::{BeginAccessReply, CoreRequest};
use virtsoc_proto::{Request, Status};
use virtsoc_svm::{AccessReport, AccessSpec, DomainId, RegionId, SvmError};

/// An error a guest may be answered with: the status it becomes.
pub trait GuestStatus {
    /// The status a guest sees for this error.
    fn status(&self) -> Status;
}

/// The status a guest sees for `e` (any error type of [`GuestStatus`]).
pub fn status_of<E: GuestStatus + ?Sized>(e: &E) -> Status {
    e.status()
}

impl GuestStatus for SvmError {
    fn status(&self) -> Status {
        match self {
            SvmError::BadArgument(_) => Status::BadArgument,
            SvmError::GuestNotAttached(_) => Status::Closed,
            SvmError::NoSuchRegion => Status::NoSuchRegion,
            SvmError::NotSupported(_) => Status::NotSupported,
            SvmError::OutOfMemory => Status::OutOfMemory,
            SvmError::OutOfRange => Status::OutOfRange,
            SvmError::UnknownDomain(_) => Status::UnknownDevice,
            SvmError::Internal(_) | SvmError::Unreachable(_) | SvmError::Window(_) => {
                Status::Internal
            }
        }
    }
}

/// A frame that breaks the layout rules: `OutOfRange` for a buffer (region) too short for its
/// layout, `BadArgument` for the rest.
impl GuestStatus for FrameError {
    fn status(&self) -> Status {
        match self {
            FrameError::BufferTooSmall { .. } => Status::OutOfRange,
            _ => Status::BadArgument,
        }
    }
}

/// A media backend's error (codec, ISP, camera): a resource the backend could not get (a
/// worker process, a shared buffer) is `Busy`, as the guest may try again later.
impl GuestStatus for MediaError {
    fn status(&self) -> Status {
        match self {
            MediaError::Frame(e) => e.status(),
            MediaError::InvalidLayout(_) => Status::BadArgument,
            MediaError::Unsupported(_) => Status::NotSupported,
            MediaError::Resources(_) => Status::Busy,
            MediaError::OverLimit(_) => Status::OutOfMemory,
            MediaError::Decode(_)
            | MediaError::Worker(_)
            | MediaError::Encode(_)
            | MediaError::NoFrames(_)
            | MediaError::File { .. }
            | MediaError::Ffmpeg { .. } => Status::DeviceError,
        }
    }
}

/// A GPU backend's error.
impl GuestStatus for GpuError {
    fn status(&self) -> Status {
        match self {
            GpuError::Frame(e) => e.status(),
            GpuError::InvalidLayout(_)
            | GpuError::InvalidRect { .. }
            | GpuError::RectOutOfBounds { .. }
            | GpuError::InvalidParameter(_)
            | GpuError::TooMany { .. } => Status::BadArgument,
            GpuError::UnsupportedFormat { .. } => Status::NotSupported,
            GpuError::UnknownSubmission(_) => Status::Internal,
            GpuError::NoAdapter(_)
            | GpuError::DeviceRequest(_)
            | GpuError::Backend(_)
            | GpuError::DeviceLost(_) => Status::DeviceError,
        }
    }
}

/// The region and access of a begin_access or end_access request (decoded by the core
/// requests' declaration, [`virtsoc_proto::ops`]) for memory domain `domain`;
/// `UnknownOpcode` for any other request.
pub fn access_spec(req: &Request, domain: DomainId) -> Result<(RegionId, AccessSpec), Status> {
    let a = CoreRequest::decode(req.opcode, &req.args)?
        .access()
        .ok_or(Status::UnknownOpcode)?;
    let spec = AccessSpec::new(req.device, domain, a.offset, a.len, a.mode)
        .compensating(a.flags & virtsoc_proto::wire::ACCESS_COMPENSATES != 0);
    Ok((RegionId(a.id), spec))
}

/// Values of an access completion (either end: the same [`BeginAccessReply`]).
pub fn access_values(r: &AccessReport) -> [u64; 6] {
    BeginAccessReply {
        window_offset: r.window_offset.unwrap_or(u64::MAX),
        coherence_ns: r.coherence.as_nanos() as u64,
        copies: r.copies as u64,
        compensation_ns: r.compensation.as_nanos() as u64,
        host_ns: r.elapsed.as_nanos() as u64,
        bytes: r.bytes,
    }
    .to_values()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_media_error_is_one_status_for_every_device() {
        let e = MediaError::Resources("no worker".into());
        assert_eq!(status_of(&e), Status::Busy);
        let short = FrameError::BufferTooSmall { needed: 2, got: 1 };
        assert_eq!(status_of(&MediaError::Frame(short)), Status::OutOfRange);
        let gpu = GpuError::Frame(FrameError::BufferTooSmall { needed: 2, got: 1 });
        assert_eq!(status_of(&gpu), Status::OutOfRange);
    }

    #[test]
    fn svm_errors_keep_their_statuses() {
        assert_eq!(status_of(&SvmError::NoSuchRegion), Status::NoSuchRegion);
        assert_eq!(status_of(&SvmError::OutOfRange), Status::OutOfRange);
        assert_eq!(
            status_of(&SvmError::GuestNotAttached(virtsoc_svm::GuestId(3))),
            Status::Closed,
            "a departed guest's request is answered Closed"
        );
    }
}
