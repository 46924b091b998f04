//! The crate's single error type, [`FenceError`], and its `Result` alias.

use crate::table::FenceId;
use thiserror::Error;

/// Everything that can go wrong in this crate.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum FenceError {
    /// The id was never handed out by this table.
    #[error("unknown fence {0:?}")]
    UnknownFence(FenceId),
    /// The id was handed out, but its record has since been reclaimed
    /// (it was signaled and its slot freed or recycled). Its status reads
    /// `Signaled`; signaling it again is refused.
    #[error("stale fence {0:?}: it was signaled and its slot reclaimed")]
    StaleFence(FenceId),
    /// The table was torn down with `cancel_all` (e.g. the guest
    /// disconnected) before this fence was signaled.
    #[error("fence table cancelled")]
    Cancelled,
    /// The table already holds its most live (unsignaled) fences.
    #[error("too many live fences (at most {0})")]
    TooMany(usize),
    /// The queue holds its most items.
    #[error("queue full (at most {0} items)")]
    QueueFull(usize),
    /// The queue was closed; no more items are accepted.
    #[error("queue closed")]
    QueueClosed,
    /// A sequence number that the timeline has not issued yet.
    #[error("seqno {seqno} not issued on timeline {timeline:?} (next is {next})")]
    SeqnoNotIssued {
        /// Timeline name.
        timeline: String,
        /// The offending sequence number.
        seqno: u64,
        /// The next sequence number the timeline would issue.
        next: u64,
    },
    /// An exported table state that is inconsistent (untrusted snapshot input).
    #[error("bad fence table image: {0}")]
    BadImage(String),
    /// A flow control configuration that makes no sense.
    #[error("invalid pacer configuration: {0}")]
    InvalidPacerConfig(&'static str),
}

/// `Result` with [`FenceError`] as the default error.
pub type Result<T, E = FenceError> = std::result::Result<T, E>;
