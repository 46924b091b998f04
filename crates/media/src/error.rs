//! The crate's single error type, [`MediaError`], and its `Result` alias.
//!
//! Every public entry point of `virtsoc-media` validates its inputs (layouts, buffer sizes,
//! codec availability) and reports problems through this enum instead of panicking, because
//! the bytes come from guest-controlled shared memory.

use std::path::PathBuf;

/// Errors of the media backends.
#[derive(Debug, thiserror::Error)]
pub enum MediaError {
    /// A frame layout or buffer breaks a rule of `virtsoc-frame` (zero, odd or too large a
    /// size, stride too small, size overflow, buffer shorter than its layout).
    #[error("invalid frame: {0}")]
    Frame(#[from] virtsoc_frame::FrameError),
    /// A frame the operation cannot take although its layout is valid (a size outside what
    /// the codec, camera or scaler handles, a format other than the one it needs).
    #[error("invalid frame layout: {0}")]
    InvalidLayout(String),
    /// The request is valid but this backend or this FFmpeg build cannot serve it
    /// (missing codec or encoder, conversion pair not handled by a backend, ...).
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The system is out of a resource the backend needs now (a process or a thread could
    /// not be started, a socket pair or a shared buffer could not be made); later may work.
    #[error("out of resources: {0}")]
    Resources(String),
    /// What the backend would keep for the guest (a worker process and its buffers) is
    /// more than the guest's memory limit allows; nothing was kept.
    #[error("over the memory limit: {0}")]
    OverLimit(String),
    /// The input bitstream is corrupt or truncated; the decoder stays usable.
    #[error("decode error: {0}")]
    Decode(String),
    /// A worker process (the ISP's swscale) crashed, hung or answered something malformed:
    /// the call failed, the process that asked goes on (the next call gets a fresh worker).
    #[error("worker failed: {0}")]
    Worker(String),
    /// The encoder rejected a frame or failed.
    #[error("encode error: {0}")]
    Encode(String),
    /// A file could not be opened or demuxed.
    #[error("cannot read media file {path}: {reason}")]
    File {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// A source has no (more) frames to give.
    #[error("no frames: {0}")]
    NoFrames(String),
    /// Any other failure reported by an FFmpeg library.
    #[error("ffmpeg {context}: {source}")]
    Ffmpeg {
        /// The FFmpeg call or step that failed.
        context: &'static str,
        /// FFmpeg's error.
        #[source]
        source: ffmpeg_next::Error,
    },
}

/// Result type of this crate.
pub type Result<T> = std::result::Result<T, MediaError>;

impl MediaError {
    pub(crate) fn ffmpeg(context: &'static str, source: ffmpeg_next::Error) -> Self {
        MediaError::Ffmpeg { context, source }
    }
}
