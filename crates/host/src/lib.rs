//! virtsocd, the virtsoc host daemon, as a library (the binary is a thin wrapper).
//!
//! - [`daemon`]: accepting guests, the handshake, the session table, shutdown;
//! - [`session`]: one guest's session and the loop that serves it;
//! - [`link`]: the transports (shared rings, TCP frames) behind one trait;
//! - [`vm`]: VM guests (ivshmem window, virtio-serial doorbells);
//! - [`dispatch`]: decoding and validating requests;
//! - [`status`]: the one mapping from errors to the status a guest sees;
//! - [`fences`]: the guest-visible virtual fence page;
//! - [`device`]: the device trait, device workers, and the devices themselves;
//! - [`cgroup`]: guests' CPU weight through cgroups;
//! - [`runtime_dir`]: a private `XDG_RUNTIME_DIR` for the binaries when there is none;
//! - [`snapshot`]: saving and restoring guest sessions (snapshots, restarts, migration).

pub mod cgroup;
pub mod clock;
pub mod control;
pub mod daemon;
pub mod device;
pub mod dispatch;
pub mod fences;
pub mod limits;
pub mod link;
pub mod live_view;
pub mod policy;
pub mod runtime_dir;
pub mod services;
pub mod session;
pub mod snapshot;
pub mod status;
#[cfg(test)]
pub(crate) mod testkit;
pub mod vm;

pub use daemon::{Daemon, DaemonConfig};
pub use limits::Limits;

/// Errors of the daemon.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// Invalid configuration (bad option, missing token, unusable path); the text says what.
    #[error("configuration: {0}")]
    Config(String),
    /// An I/O error (sockets, files, threads).
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    /// An error of the wire protocol layer (handshake, ring, window).
    #[error("protocol: {0}")]
    Proto(#[from] virtsoc_proto::ProtoError),
    /// An error of the SVM manager.
    #[error("svm: {0}")]
    Svm(#[from] virtsoc_svm::SvmError),
    /// Writing, reading or restoring a snapshot (or migrating) failed; the text says what.
    #[error("snapshot: {0}")]
    Snapshot(String),
}

/// Result type of this crate.
pub type Result<T> = std::result::Result<T, HostError>;

/// Host memory policy (glibc): large buffers (frames, replicas, decoder pictures) always get
/// their own mappings, so the memory a departed guest held goes back to the system instead
/// of staying in the allocator's arenas (glibc raises its mmap threshold after each large
/// free, which would keep later frame-sized buffers in arenas for good).
pub fn set_memory_policy() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only changes allocator parameters; called before the daemon's threads.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 256 << 10);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 4 << 20);
    }
}

/// Gives the allocator's free memory back to the system (after a guest left).
pub fn release_free_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only returns free memory to the system.
    unsafe {
        libc::malloc_trim(0);
    }
}
