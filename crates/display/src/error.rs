//! The crate's single error type, [`DisplayError`], and its `Result` alias.

use thiserror::Error;

/// Everything that can go wrong in this crate.
#[derive(Debug, Error)]
pub enum DisplayError {
    /// The display's own configuration makes no sense (zero size or rate).
    #[error("invalid display configuration: {0}")]
    InvalidConfig(&'static str),
    /// A presented frame is malformed (zero size, short buffer, bad stride).
    /// Frames come from guests, so this is an ordinary error, never a panic.
    #[error("invalid frame {id}: {reason}")]
    InvalidFrame {
        /// The frame's id.
        id: u64,
        /// What is wrong with it.
        reason: String,
    },
    /// The frame's pixels are not CPU-visible (a handle without a mapping)
    /// and the operation needs them.
    #[error("frame {id} has no CPU-visible pixels")]
    PixelsUnavailable {
        /// The frame's id.
        id: u64,
    },
    /// A snapshot was asked for before anything was scanned out.
    #[error("nothing has been scanned out yet")]
    NoFrame,
    /// File I/O (snapshots).
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    /// PNG encoding.
    #[error("PNG encoding failed: {0}")]
    Png(#[from] png::EncodingError),
    /// A backend failed to scan a frame out.
    #[error("display backend: {0}")]
    Backend(String),
    /// The vsync thread (or the window's event thread) could not be started.
    #[error("could not start a display thread: {0}")]
    Spawn(#[source] std::io::Error),
    /// The vsync thread has gone away.
    #[error("vsync thread: {0}")]
    Thread(String),
}

/// `Result` with [`DisplayError`] as the default error.
pub type Result<T, E = DisplayError> = std::result::Result<T, E>;
