//! `virtsoc-media`: the media backends of the virtsoc host — video codec (libavcodec),
//! image signal processor (libswscale and a CPU reference) and camera sources.
//!
//! Everything works on plain byte buffers described by a [`FrameLayout`], because the
//! daemon's devices read and write SVM region replicas. Every entry point validates sizes and
//! returns [`MediaError`] instead of panicking. The crate holds no global mutable state besides
//! FFmpeg's one-time initialization (see [`quiet_ffmpeg_logs`]).
//!
//! * [`frame`] — pixel formats, layouts and frame views.
//! * [`isp`] — colour conversion and scaling backends, swscale also in a sandboxed worker
//!   process ([`ProcessIsp`]).
//! * [`codec`] — decoders, demuxer, H.264 encoder.
//! * [`camera`] — synthetic and file camera sources, pixel-embedded capture timestamps.

#![warn(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

pub mod camera;
pub mod codec;
pub mod error;
pub mod frame;
pub mod isp;
mod sws;
mod worker;

pub use camera::{
    read_timestamp, read_timestamp_grid, read_timestamp_top, stamp_timestamp, CameraSource,
    CaptureInfo, FileCamera, SyntheticCamera,
};
pub use codec::{
    measure_decode_fps, CodecKind, DecodedFrame, DecoderBackend, DecoderPool, Demuxer,
    EncoderBackend, EncoderPreset, FfmpegDecoder, FfmpegEncoder, JpegEncoder, LentPicture,
    Mp4Recorder, NullDecoder, PacketError, ProcessDecoder, ProcessEncoder, YuvJpegEncoder,
    MAX_IN_FLIGHT,
};
pub use error::{MediaError, Result};
pub use frame::{
    copy_frame, FrameError, FrameLayout, FrameMut, FrameRef, OwnedFrame, PixelFormat, PlaneInfo,
};
pub use isp::{Charge, ChargeError, Charger, CpuIsp, IspBackend, NullIsp, ProcessIsp, SwscaleIsp};
pub use worker::{deadline_for, worker_processes, WorkerPool, CALL_DEADLINE, WORKER_RESIDENT};

/// Initializes FFmpeg for this process (its error strings, which are empty until then) and
/// silences its own console messages (libavcodec prints a line per corrupt packet even at
/// the "error" level; failures reach callers as [`MediaError`]s instead). Runs once; every
/// decoder, encoder and demuxer constructor calls it, so callers need not.
pub fn quiet_ffmpeg_logs() {
    codec::init_ffmpeg();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn send<T: Send>() {}
    fn send_sync<T: Send + Sync>() {}

    #[test]
    fn backends_are_thread_safe_as_the_daemon_needs() {
        send::<FfmpegDecoder>();
        send::<NullDecoder>();
        send::<FfmpegEncoder>();
        send::<ProcessEncoder>();
        send::<Demuxer>();
        send::<FileCamera>();
        send::<SyntheticCamera>();
        send::<Box<dyn DecoderBackend>>();
        send::<Box<dyn CameraSource>>();
        send_sync::<SwscaleIsp>();
        send_sync::<CpuIsp>();
        send_sync::<NullIsp>();
        send_sync::<ProcessIsp>();
        send_sync::<Box<dyn IspBackend>>();
    }
}
