//! The virtsoc guest library.
//!
//! A guest HAL (gralloc, codec, camera, composer) links this library to reach the host
//! daemon. It implements the shared memory interface of vSoC's Figure 3 — [`Connection::alloc`],
//! [`Connection::free`], [`Connection::begin_access`], [`Connection::end_access`] — plus device
//! commands, over the ring protocol of `virtsoc-proto`.
//!
//! - [`conn`]: the connection, request submission and completion reaping;
//! - [`planes`]: where an image region's planes are;
//! - [`capi`]: the C ABI declared in `include/virtsoc.h`.

pub mod capi;
pub mod compose;
pub mod conn;
mod link;
pub mod planes;
pub mod services;
pub mod vm;

pub use conn::{Access, ConnectOptions, Connection, Counters, Fence, LedgerLink, RegionInfo};
pub use virtsoc_devapi as devices;
pub use virtsoc_devapi::DeviceCommand;
pub use virtsoc_ids::RegionId;
pub use virtsoc_proto::wire::{testdev, usage, Format, ACCESS_COMPENSATES};
pub use virtsoc_proto::{AccessMode, Completion, DeviceId, Opcode, Status};

/// Errors the guest library reports.
#[derive(Debug, thiserror::Error)]
pub enum GuestError {
    /// An argument the library refused before sending anything (bad size, null pointer, ...); the
    /// text says what.
    #[error("invalid argument: {0}")]
    BadArgument(String),
    /// Reading or writing the connection failed.
    #[error("i/o: {0}")]
    Io(std::io::Error),
    /// The daemon closed the connection (it exited, or dropped the session).
    #[error("the daemon closed the connection")]
    Closed,
    /// Connecting to the daemon's socket failed.
    #[error("cannot connect to {path}: {source}")]
    Connect {
        /// The socket path (or address) tried.
        path: String,
        /// Why connecting failed.
        source: std::io::Error,
    },
    /// The daemon sent something the wire protocol does not allow.
    #[error("protocol error: {0}")]
    Proto(#[from] virtsoc_proto::ProtoError),
    /// The flow-control pacer refused its parameters (the ring sizes from the welcome).
    #[error("flow control: {0}")]
    Pacing(#[source] virtsoc_fence::FenceError),
    /// The daemon refused the connection at the handshake; the text is its reason.
    #[error("the daemon refused the connection: {0}")]
    Refused(String),
    /// The session migrated: resume it on the daemon at this Unix socket path.
    #[error("the session moved to the daemon on {0}")]
    Moved(String),
    /// The host answered with an error status, and with the device's reason when it gave one.
    #[error("{op:?} failed: {}{}", status.message(), reason.as_deref().map(|r| format!(": {r}")).unwrap_or_default())]
    Status {
        /// The request that failed.
        op: Opcode,
        /// The status the host answered.
        status: Status,
        /// The device's own explanation, when it gave one.
        reason: Option<String>,
    },
}

impl GuestError {
    /// The status a C caller sees (negated in the C ABI).
    pub fn status(&self) -> Status {
        match self {
            GuestError::BadArgument(_) => Status::BadArgument,
            GuestError::Closed
            | GuestError::Connect { .. }
            | GuestError::Refused(_)
            | GuestError::Moved(_) => Status::Closed,
            GuestError::Proto(_) | GuestError::Io(_) | GuestError::Pacing(_) => Status::Internal,
            GuestError::Status { status, .. } => *status,
        }
    }
}

/// Result type of this crate.
pub type Result<T> = std::result::Result<T, GuestError>;
