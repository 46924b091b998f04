//! The virtsoc wire protocol, shared by the host daemon and the guest library.
//!
//! This crate owns everything both sides must agree on byte for byte:
//! - [`window_layout`]: where the rings, the fence page and the data area sit in the shared window;
//! - [`wire`]: the fixed-size ring entries, opcodes, access modes and status codes;
//! - [`ops`]: the core requests (regions, accesses, fences, counters) declared once;
//! - [`counters`]: the guest's SVM counters, one record both sides decode the same way;
//! - [`shared_window`]: bounds-checked access to a mapped window (vm-memory over a memfd or a PCI BAR);
//! - [`ring`]: the lock-free single-producer/single-consumer rings and their doorbells;
//! - [`handshake`]: the connection handshake and file-descriptor passing on the Unix socket;
//! - [`stream`]: ring entries as frames on a byte stream, for remote (TCP) guests.
//!
//! Nothing here trusts the peer: every index, offset and length read from the window is checked
//! and a violation is a [`ProtoError`], never a panic.

pub mod counters;
pub mod handshake;
pub mod ops;
pub mod ring;
pub mod shared_window;
pub mod spin;
pub mod stream;
pub mod window_layout;
pub mod wire;

pub use shared_window::SharedWindow;
pub use window_layout::WindowLayout;
pub use wire::{AccessMode, Completion, DeviceId, Opcode, Request, Status};

/// Errors of the protocol layer.
#[derive(Debug, thiserror::Error)]
pub enum ProtoError {
    /// The handshake failed (unexpected message, version or size); the text says what.
    #[error("bad handshake: {0}")]
    Handshake(String),
    /// A handshake message was not valid JSON for its type.
    #[error("bad handshake message: {0}")]
    HandshakeJson(#[from] serde_json::Error),
    /// Reading or writing the socket (or the window file) failed.
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
    /// The peer broke the ring protocol (bad index, entry or length); the text names the rule.
    #[error("peer violated the ring protocol: {0}")]
    RingViolation(&'static str),
    /// An access past the end of the shared window.
    #[error("window access out of bounds: offset {offset} len {len} (window {size} bytes)")]
    OutOfBounds {
        /// Offset of the access in the window, in bytes.
        offset: u64,
        /// Length of the access in bytes.
        len: u64,
        /// Size of the window in bytes.
        size: u64,
    },
    /// Window layout parameters that do not fit together (ring sizes, page alignment, ...); the
    /// text says what.
    #[error("invalid window layout: {0}")]
    Layout(String),
    /// Mapping the shared window failed.
    #[error("memory mapping failed: {0}")]
    Mmap(#[source] vm_memory::mmap::MmapRegionError),
    /// The peer closed the connection.
    #[error("peer closed the connection")]
    Closed,
}

/// Result type of this crate.
pub type Result<T> = std::result::Result<T, ProtoError>;
