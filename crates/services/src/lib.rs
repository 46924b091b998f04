//! Host services for guests, after virtio-vapp (`shared/seeds/virtio-vapp.txt`): a guest
//! calls a program that runs on the host through a channel the host controls.
//!
//! - [`chan`]: a channel's rings and payload slots, laid out in an SVM region of the guest's
//!   window, with futex doorbells; one ring pair per channel, so a busy service holds up
//!   only its own channel.
//! - [`packet`] and [`reassembly`]: transfers larger than a slot travel in 64 KiB packets
//!   with a completion bitmap (Algorithm 2), reassembled in any order, revocable, bounded in
//!   memory, timed out when never finished.
//! - [`hypervisor`]: the service hypervisor: registered services and their declared calls,
//!   which guest may use which service ([`policy`]), shared or per-guest instances, the
//!   channel table, restarting a service instance that died.
//! - [`builtin`]: the emulator services (location, sensors, clipboard) and the bulk
//!   echo/sink service.
//! - [`external`]: services of host programs, which register over the daemon's services
//!   socket (the protocol, the daemon's proxy, and [`external::client`] for Rust programs).
//!
//! Nothing here depends on the daemon: the host crate serves channels with it, the guest
//! library opens them with it.

pub mod builtin;
pub mod chan;
pub mod external;
pub mod gate;
pub mod hypervisor;
pub mod packet;
pub mod payload;
pub mod policy;
pub mod reassembly;

use virtsoc_proto::Status;

/// Errors of the services layer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ServiceError {
    /// No service of that name is registered.
    #[error("no service {0:?}")]
    NoSuchService(String),
    /// The policy does not let this guest use this service.
    #[error("guest {guest:?} may not use service {service:?}")]
    Denied {
        /// The guest's name.
        guest: String,
        /// The service asked for.
        service: String,
    },
    /// A channel id that is not one of the caller's open channels.
    #[error("no channel {0} of this guest")]
    NoSuchChannel(u64),
    /// A call number the service does not declare.
    #[error("service {service:?} has no call {call}")]
    NoSuchCall {
        /// The service.
        service: String,
        /// The call number asked for.
        call: u32,
    },
    /// A malformed packet header or channel entry; the text says what.
    #[error("bad packet: {0}")]
    BadPacket(String),
    /// A packet received twice.
    #[error("transfer {transfer}: packet {index} received twice")]
    Duplicate {
        /// The transfer.
        transfer: u32,
        /// The packet index.
        index: u32,
    },
    /// A packet whose bytes do not fit its place (it would overlap a neighbour).
    #[error("transfer {transfer}: packet {index} overlaps its neighbours ({len} bytes)")]
    Overlap {
        /// The transfer.
        transfer: u32,
        /// The packet index.
        index: u32,
        /// The length it claimed.
        len: u32,
    },
    /// The sender's count of packets does not add up with the receiver's bitmap.
    #[error("transfer {transfer}: {detail}")]
    Incomplete {
        /// The transfer.
        transfer: u32,
        /// Which packets are missing, or how the counts differ.
        detail: String,
    },
    /// A transfer id that is not open on this channel.
    #[error("no transfer {0} on this channel")]
    NoSuchTransfer(u32),
    /// Holding this transfer would exceed the guest's memory for transfers.
    #[error("transfer of {want} bytes exceeds the channel's budget ({left} bytes left)")]
    OverBudget {
        /// Bytes asked for.
        want: u64,
        /// Bytes left in the budget.
        left: u64,
    },
    /// A transfer that was not finished in time.
    #[error("transfer {0} timed out")]
    TimedOut(u32),
    /// The service instance died (panicked, or its process exited) during or before the
    /// call; it has been restarted.
    #[error("service {0:?} died; it was restarted, call again")]
    ServiceDied(String),
    /// The service's host program went away (it exited, hung, or broke the protocol); its
    /// guests get this until a program registers the service again.
    #[error("service {service:?} is unavailable: {reason}")]
    Unavailable {
        /// The service.
        service: String,
        /// What happened to its program.
        reason: String,
    },
    /// A call that did not finish within the policy's `call_timeout_ms`.
    #[error("service {service:?} did not answer within {ms} ms")]
    CallTimedOut {
        /// The service.
        service: String,
        /// The deadline it missed.
        ms: u64,
    },
    /// The channel is closed.
    #[error("channel closed")]
    Closed,
    /// A bad argument to a call; the text says what.
    #[error("{0}")]
    BadArgument(String),
    /// A policy that does not parse.
    #[error("services policy: {0}")]
    Policy(String),
    /// The shared window refused an access (out of bounds, a ring index out of range).
    #[error("channel memory: {0}")]
    Memory(String),
}

impl ServiceError {
    /// The status a guest gets for this error.
    pub fn status(&self) -> Status {
        match self {
            ServiceError::NoSuchService(_) => Status::NotSupported,
            ServiceError::Denied { .. } => Status::PermissionDenied,
            ServiceError::NoSuchChannel(_) | ServiceError::NoSuchTransfer(_) => Status::BadArgument,
            ServiceError::NoSuchCall { .. } => Status::UnknownOpcode,
            ServiceError::BadPacket(_)
            | ServiceError::Duplicate { .. }
            | ServiceError::Overlap { .. }
            | ServiceError::Incomplete { .. }
            | ServiceError::BadArgument(_)
            | ServiceError::Policy(_) => Status::BadArgument,
            ServiceError::OverBudget { .. } => Status::OutOfMemory,
            ServiceError::TimedOut(_) | ServiceError::CallTimedOut { .. } => Status::Busy,
            ServiceError::ServiceDied(_) | ServiceError::Unavailable { .. } => Status::DeviceError,
            ServiceError::Closed => Status::Closed,
            ServiceError::Memory(_) => Status::OutOfRange,
        }
    }
}

impl From<virtsoc_proto::ProtoError> for ServiceError {
    fn from(e: virtsoc_proto::ProtoError) -> Self {
        ServiceError::Memory(e.to_string())
    }
}

/// Result type of this crate.
pub type Result<T> = std::result::Result<T, ServiceError>;

/// A service name packed into two request words (at most 16 bytes, ASCII, NUL padded).
pub fn pack_name(name: &str) -> Option<[u64; 2]> {
    let b = name.as_bytes();
    if b.is_empty() || b.len() > 16 || !b.iter().all(|c| c.is_ascii_graphic()) {
        return None;
    }
    let mut w = [0u64; 2];
    for (i, &c) in b.iter().enumerate() {
        w[i / 8] |= u64::from(c) << (8 * (i % 8));
    }
    Some(w)
}

/// The name packed by [`pack_name`]; `None` when the words are not a valid name.
pub fn unpack_name(w: [u64; 2]) -> Option<String> {
    let mut s = String::new();
    for i in 0..16 {
        let c = (w[i / 8] >> (8 * (i % 8))) as u8;
        if c == 0 {
            // Only padding may follow.
            if (i + 1..16).any(|j| (w[j / 8] >> (8 * (j % 8))) as u8 != 0) {
                return None;
            }
            break;
        }
        if !c.is_ascii_graphic() {
            return None;
        }
        s.push(char::from(c));
    }
    (!s.is_empty()).then_some(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_pack_and_bad_ones_are_refused() {
        for n in ["geo", "clipboard", "sixteen-chars-ok"] {
            assert_eq!(unpack_name(pack_name(n).unwrap()).as_deref(), Some(n));
        }
        assert!(pack_name("").is_none());
        assert!(pack_name("seventeen-chars-x").is_none());
        assert!(pack_name("sp ace").is_none());
        assert!(unpack_name([0, 0]).is_none());
        assert!(
            unpack_name([0x6f00_6567, 0]).is_none(),
            "NUL inside the name"
        );
        assert!(unpack_name([0x01, 0]).is_none(), "control byte");
    }
}
