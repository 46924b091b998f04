//! virtsocd, the virtsoc host daemon, as a library (the binary is a thin wrapper).
//!
//! - [`daemon`]: accepting guests, the handshake, the session table, shutdown;
//! - [`session`]: one guest's session and the loop that serves it;
//! - [`link`]: the transports (shared rings, TCP frames) behind one trait;
//! - [`vm`]: VM guests (ivshmem window, virtio-serial doorbells);
//! - [`dispatch`]: decoding and validating requests;
//! - [`fences`]: the guest-visible virtual fence page;
//! - [`device`]: the device trait, device workers, and the devices themselves.

pub mod clock;
pub mod control;
pub mod daemon;
pub mod device;
pub mod dispatch;
pub mod fences;
pub mod link;
pub mod session;
pub mod sync;
pub mod vm;

pub use daemon::{Daemon, DaemonConfig};

/// Errors of the daemon.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("configuration: {0}")]
    Config(String),
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("protocol: {0}")]
    Proto(#[from] virtsoc_proto::ProtoError),
    #[error("svm: {0}")]
    Svm(#[from] virtsoc_svm::SvmError),
}

/// Result type of this crate.
pub type Result<T> = std::result::Result<T, HostError>;
