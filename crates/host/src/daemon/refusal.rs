//! Why a guest's hello is refused ([`AdmitError`]): the text of each refusal is the reason
//! of the `Refused` reply the guest reads, and of the daemon's log line.

use virtsoc_proto::handshake::PROTOCOL_VERSION;
use virtsoc_proto::ProtoError;
use virtsoc_svm::SvmError;

/// Why a guest is not admitted; its `Display` is the `Refused` reply's reason (guests and
/// tests read these words).
#[derive(Debug, thiserror::Error)]
pub enum AdmitError {
    /// The guest speaks another protocol version.
    #[error("protocol {asked} not supported (daemon speaks {PROTOCOL_VERSION})")]
    Protocol {
        /// The version the hello asked for.
        asked: u32,
    },
    /// The coherence protocol the hello names does not parse.
    #[error(transparent)]
    Coherence(SvmError),
    /// The window the hello asks for has no valid layout.
    #[error(transparent)]
    Layout(ProtoError),
    /// The guest's window could not be created.
    #[error("cannot create window: {0}")]
    Window(ProtoError),
    /// A VM's window could not be prepared (its rings and fence page cleared).
    #[error(transparent)]
    VmWindow(ProtoError),
    /// SVM refused the guest (its memory limit, its regions).
    #[error(transparent)]
    Attach(SvmError),
    /// The daemon serves `max_connections` guests already.
    #[error("too many connections: the daemon serves at most {max} guests at once")]
    TooManyConnections {
        /// The most guests at once.
        max: usize,
    },
    /// A VM guest's resume was refused; the text says why
    /// ([`Refusal::Refused`](crate::snapshot::restart::Refusal::Refused)).
    #[error("{0}")]
    Resume(String),
    /// A VM guest's session moved to another daemon, which its port follows.
    #[error("this session moved to another daemon with the VM's port")]
    Moved,
    /// The welcome could not be sent to a VM guest.
    #[error(transparent)]
    Welcome(std::io::Error),
    /// A VM guest's session thread could not be started.
    #[error(transparent)]
    Thread(std::io::Error),
}
