//! The daemon's start-up errors: a bad flag value, an unusable path (named in the message), a
//! socket another daemon holds, or the host library's own error.

use std::path::PathBuf;

use thiserror::Error;
use virtsoc_host::HostError;

/// Why `virtsocd` did not start (or stopped with an error).
#[derive(Debug, Error)]
pub enum ConfigError {
    /// `--token-file` cannot be read.
    #[error("configuration: --token-file {}: {source}", path.display())]
    TokenFile {
        /// The file.
        path: PathBuf,
        /// Why it cannot be read.
        source: std::io::Error,
    },
    /// The remote-guest token (`--token-file`, `$VIRTSOC_TOKEN`) is too short to be secret.
    #[error("configuration: the remote-guest token must be at least 16 characters")]
    ShortToken,
    /// `--policy` cannot be read or parsed.
    #[error("--policy {}: {source}", path.display())]
    Policy {
        /// The file.
        path: PathBuf,
        /// The parse or read error (with its line).
        source: HostError,
    },
    /// A `--vm` value is malformed.
    #[error("--vm {spec}: {source}")]
    Vm {
        /// The value as given.
        spec: String,
        /// What is wrong with it.
        source: HostError,
    },
    /// `--listen` cannot be bound.
    #[error("--listen {addr}: {source}")]
    Listen {
        /// The address.
        addr: std::net::SocketAddr,
        /// Why it cannot be bound.
        source: std::io::Error,
    },
    /// The prefetch flags are out of range.
    #[error("configuration: {0}")]
    Prefetch(String),
    /// The path of this executable (the decoder and ISP workers') cannot be had.
    #[error("cannot find this executable for its worker processes: {0}")]
    OwnExecutable(std::io::Error),
    /// `--socket` names a file that is not a socket: it is left alone.
    #[error("configuration: {} exists and is not a socket; not replacing it", path.display())]
    NotASocket {
        /// The path.
        path: PathBuf,
    },
    /// A live daemon answers on `--socket`: its socket is left alone.
    #[error(
        "configuration: another daemon is already listening on {}; not replacing its socket",
        path.display()
    )]
    SocketInUse {
        /// The path.
        path: PathBuf,
    },
    /// Whether a daemon answers on `--socket` cannot be told.
    #[error("configuration: cannot tell whether a daemon listens on {}: {source}", path.display())]
    SocketUnknown {
        /// The path.
        path: PathBuf,
        /// What connecting to it said.
        source: std::io::Error,
    },
    /// `--socket` cannot be inspected, cleared or bound.
    #[error("--socket {}: {source}", path.display())]
    Socket {
        /// The path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The host library's error (devices, state directory, control API, serving).
    #[error(transparent)]
    Host(#[from] HostError),
    /// Another system call failed (signal handlers, threads, stdout).
    #[error(transparent)]
    Io(#[from] std::io::Error),
}
