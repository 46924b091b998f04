//! Services of host programs: a program outside the daemon (any language) registers a named
//! service with its declared calls over the daemon's services socket and serves the calls
//! of the guests the policy lets use it. The full protocol is in `docs/services.md`.
//!
//! - Frames are those of the connection handshake ([`virtsoc_proto::handshake`]): a
//!   little-endian `u32` length, then that many bytes of JSON (at most 64 KiB); a frame may
//!   carry one file descriptor.
//! - The program sends [`FromProgram::Register`]; the daemon checks who it is ([`trusted`]:
//!   the daemon's own user or root by the socket's peer credentials, or the daemon's token)
//!   and what it declares ([`Registration::check`]), and answers
//!   [`ToProgram::Registered`] with a memfd of `slots` slots of `slot_bytes` each, or
//!   [`ToProgram::Refused`].
//! - Each call comes as [`ToProgram::Call`]: its input already copied into a slot of the
//!   memfd at `input`, room for its output at `output`; the program answers
//!   [`FromProgram::Reply`] with the output's length and four values (or an error). Up to
//!   `slots` calls are outstanding at once; answers may come in any order.
//! - Control operations (`virtsoc ctl`), a guest's departure, and a migration's hand-over
//!   of a guest's state come as [`ToProgram::Control`], [`ToProgram::GuestGone`],
//!   [`ToProgram::Export`] and [`ToProgram::Import`].
//!
//! The program is held to the rules of the built-in services: the policy decides who may
//! open it, the admission gate orders its calls, and each call has the policy's deadline
//! (`call_timeout_ms`). A program that misses a deadline, sends a malformed or unasked-for
//! answer, or hangs up is disconnected: its calls in flight and the calls after fail at once
//! ([`crate::ServiceError::Unavailable`]) until a program registers the name again, and its
//! guests' channels stay open. Nothing the program sends is trusted: offsets and lengths
//! are the daemon's, the output length is checked against the room given.
//!
//! Copies: a call's input goes from the guest's memory (its channel slot, its region, or a
//! reassembled transfer) into the memfd once, and the output back once; the program reads
//! and writes the memfd in place. A socket instead would copy each byte twice each way.

pub mod client;
mod proxy;

use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use proxy::ExternalService;

use crate::hypervisor::{CallInfo, Hypervisor};
use crate::{Result, ServiceError};

/// Calls a program may declare.
pub const MAX_CALLS: usize = 64;
/// Slots (calls outstanding at once) a program may ask for.
pub const MAX_SLOTS: u32 = 64;
/// Slots when the program asks for none.
pub const DEFAULT_SLOTS: u32 = 4;
/// Bytes of a slot when the program asks for none: a call's input and its output.
pub const DEFAULT_SLOT_BYTES: u64 = 32 << 20;
/// Smallest slot.
pub const MIN_SLOT_BYTES: u64 = 64 << 10;
/// Most bytes of all slots together.
pub const MAX_SHM_BYTES: u64 = 1 << 30;
/// Time a new connection has to send its registration.
pub const REGISTER_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest a send to a program may block (a program that stops reading is disconnected).
pub const SEND_TIMEOUT: Duration = Duration::from_secs(2);

/// What a program declares when it registers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Registration {
    /// The service's name (1 to 16 printable ASCII characters, what guests open).
    pub name: String,
    /// Its calls.
    pub calls: Vec<CallInfo>,
    /// The daemon's token (needed when the program runs as another user than the daemon).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// Calls outstanding at once (1..=64; [`DEFAULT_SLOTS`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slots: Option<u32>,
    /// Bytes of each slot (a multiple of 4096, at least 64 KiB; [`DEFAULT_SLOT_BYTES`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slot_bytes: Option<u64>,
}

impl Registration {
    /// Checks the declaration; the slots and their size it gets.
    pub fn check(&self) -> Result<(u32, u64)> {
        let bad = |m: String| Err(ServiceError::BadArgument(m));
        if crate::pack_name(&self.name).is_none() {
            return bad(format!(
                "service name {:?}: 1 to 16 printable ASCII characters",
                self.name
            ));
        }
        if self.calls.is_empty() || self.calls.len() > MAX_CALLS {
            return bad(format!("1 to {MAX_CALLS} calls, got {}", self.calls.len()));
        }
        for (i, c) in self.calls.iter().enumerate() {
            if self.calls[..i].iter().any(|d| d.call == c.call) {
                return bad(format!("call {} declared twice", c.call));
            }
            let printable =
                |s: &str, max: usize| s.chars().count() <= max && !s.chars().any(char::is_control);
            if c.name.is_empty() || !printable(&c.name, 64) || !printable(&c.doc, 1024) {
                return bad(format!(
                    "call {}: a name of 1 to 64 and a doc of at most 1024 printable characters",
                    c.call
                ));
            }
        }
        let slots = self.slots.unwrap_or(DEFAULT_SLOTS);
        let slot_bytes = self.slot_bytes.unwrap_or(DEFAULT_SLOT_BYTES);
        if slots == 0 || slots > MAX_SLOTS {
            return bad(format!("slots: 1 to {MAX_SLOTS}, got {slots}"));
        }
        if slot_bytes < MIN_SLOT_BYTES
            || !slot_bytes.is_multiple_of(4096)
            || u64::from(slots).saturating_mul(slot_bytes) > MAX_SHM_BYTES
        {
            return bad(format!(
                "slot_bytes: a multiple of 4096, at least {MIN_SLOT_BYTES}, at most \
                 {MAX_SHM_BYTES} for all {slots} slots; got {slot_bytes}"
            ));
        }
        Ok((slots, slot_bytes))
    }
}

/// An answer of the program to a request of the daemon.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Answer {
    /// The request's id.
    pub id: u64,
    /// A call's output bytes (written at the call's `output`).
    #[serde(default)]
    pub len: u64,
    /// A call's four result values.
    #[serde(default)]
    pub values: [u64; 4],
    /// The request failed: why (the guest gets it as a bad-argument error).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// A control operation's or an export's result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
}

/// Frames a program sends.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum FromProgram {
    /// The first frame: the registration.
    Register(Registration),
    /// The answer to a request.
    Reply(Answer),
}

/// Frames the daemon sends.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum ToProgram {
    /// Registered; the frame carries the memfd (`size` bytes; map it shared, read-write).
    Registered {
        /// Bytes of the memfd.
        size: u64,
        /// Slots.
        slots: u32,
        /// Bytes of each slot.
        slot_bytes: u64,
    },
    /// Not registered; the daemon closes the connection.
    Refused {
        /// Why.
        reason: String,
    },
    /// A guest's call.
    Call {
        /// Answer with this id.
        id: u64,
        /// The calling guest (the daemon's id of it).
        guest: u64,
        /// The channel it called on.
        channel: u64,
        /// The call number (one the program declared).
        call: u32,
        /// Offset of the input in the memfd.
        input: u64,
        /// Bytes of input.
        input_len: u64,
        /// Offset of the room for the output in the memfd.
        output: u64,
        /// Bytes of room for the output.
        output_capacity: u64,
    },
    /// A control operation of the service (`virtsoc ctl` or `POST /services/NAME/OP`).
    Control {
        /// Answer with this id (its `result`).
        id: u64,
        /// The operation.
        name: String,
        /// Its arguments.
        args: Value,
    },
    /// A guest went away: forget its state. No answer.
    GuestGone {
        /// The guest.
        guest: u64,
    },
    /// A guest is migrating: answer its state (`result`; null: none) for the target daemon.
    Export {
        /// Answer with this id.
        id: u64,
        /// The guest.
        guest: u64,
    },
    /// A guest migrated here: take over its state (as another program's `Export` gave it).
    Import {
        /// Answer with this id.
        id: u64,
        /// The guest (its id in this daemon).
        guest: u64,
        /// Its state.
        state: Value,
    },
}

/// Who may register: the daemon's own user, root, or whoever presents the daemon's token.
#[derive(Debug, Clone, Default)]
pub struct Trust {
    /// The daemon's effective user id.
    pub uid: u32,
    /// The daemon's token, if it has one.
    pub token: Option<String>,
}

/// Whether a program running as `peer_uid` that presented `token` may register.
pub fn trusted(trust: &Trust, peer_uid: u32, token: Option<&str>) -> Result<()> {
    if peer_uid == trust.uid || peer_uid == 0 {
        return Ok(());
    }
    match (&trust.token, token) {
        (Some(want), Some(got)) if constant_time_eq(want.as_bytes(), got.as_bytes()) => Ok(()),
        (Some(_), Some(_)) => Err(ServiceError::Denied {
            guest: format!("uid {peer_uid}"),
            service: "(registration: wrong token)".into(),
        }),
        _ => Err(ServiceError::Denied {
            guest: format!("uid {peer_uid}"),
            service: "(registration: another user needs the daemon's token)".into(),
        }),
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

/// Serves one connection of the services socket: reads the registration (within
/// [`REGISTER_TIMEOUT`]), checks the program ([`trusted`], by the socket's peer credentials)
/// and its declaration, registers the service with `hv`, and serves the program's answers
/// until it hangs up or is disconnected. Returns the service's name once the connection is
/// over (the registration stays, unavailable, until a program registers the name again),
/// or why it was refused (the program was told).
pub fn serve_connection(sock: UnixStream, hv: &Arc<Hypervisor>, trust: &Trust) -> Result<String> {
    let refuse = |e: ServiceError| {
        let _ = virtsoc_proto::handshake::send_json(
            &sock,
            &ToProgram::Refused {
                reason: e.to_string(),
            },
            None,
        );
        e
    };
    let (msg, _) = virtsoc_proto::handshake::recv_json_until::<FromProgram>(
        &sock,
        Instant::now() + REGISTER_TIMEOUT,
    )
    .map_err(|e| ServiceError::BadArgument(format!("registration: {e}")))?;
    let FromProgram::Register(reg) = msg else {
        return Err(refuse(ServiceError::BadArgument(
            "the first frame must be a registration".into(),
        )));
    };
    let peer = rustix::net::sockopt::socket_peercred(&sock)
        .map_err(|e| refuse(ServiceError::BadArgument(format!("peer credentials: {e}"))))?;
    trusted(trust, peer.uid.as_raw(), reg.token.as_deref()).map_err(refuse)?;
    let (slots, slot_bytes) = reg.check().map_err(refuse)?;
    sock.set_write_timeout(Some(SEND_TIMEOUT))
        .map_err(|e| ServiceError::Memory(e.to_string()))?;
    let peer_name = format!(
        "pid {} uid {}",
        peer.pid.as_raw_nonzero(),
        peer.uid.as_raw()
    );
    let svc =
        Arc::new(ExternalService::new(&reg, slots, slot_bytes, &sock, peer_name).map_err(refuse)?);
    hv.register_external(svc.clone()).map_err(refuse)?;
    let registered = ToProgram::Registered {
        size: svc.shm_size(),
        slots,
        slot_bytes,
    };
    if let Err(e) = svc.send_with_fd(&registered) {
        svc.disconnect(&format!("the registration's answer could not be sent: {e}"));
        return Err(e);
    }
    log::info!(
        "service {:?} registered by a host program ({}), {} calls, {slots} slots of {slot_bytes} bytes",
        reg.name,
        svc.peer(),
        reg.calls.len()
    );
    svc.serve(&sock);
    Ok(reg.name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::borrow::Cow;

    fn reg(calls: Vec<CallInfo>) -> Registration {
        Registration {
            name: "upper".into(),
            calls,
            token: None,
            slots: None,
            slot_bytes: None,
        }
    }

    fn call(n: u32, name: &str) -> CallInfo {
        CallInfo {
            call: n,
            name: Cow::Owned(name.into()),
            doc: Cow::Borrowed(""),
        }
    }

    #[test]
    fn declarations_are_checked() {
        assert_eq!(
            reg(vec![call(1, "upper")]).check().unwrap(),
            (DEFAULT_SLOTS, DEFAULT_SLOT_BYTES)
        );
        assert!(reg(vec![]).check().is_err(), "no calls");
        assert!(reg(vec![call(1, "a"), call(1, "b")]).check().is_err());
        assert!(reg(vec![call(1, "")]).check().is_err());
        assert!(reg(vec![call(1, "a\nb")]).check().is_err());
        let mut r = reg(vec![call(1, "a")]);
        r.name = "has space".into();
        assert!(r.check().is_err());
        r.name = "ok".into();
        r.slots = Some(0);
        assert!(r.check().is_err());
        r.slots = Some(64);
        r.slot_bytes = Some(32 << 20);
        assert!(r.check().is_err(), "2 GiB in all");
        r.slot_bytes = Some((64 << 10) + 1);
        assert!(r.check().is_err(), "not page sized");
        r.slot_bytes = Some(64 << 10);
        assert_eq!(r.check().unwrap(), (64, 64 << 10));
    }

    #[test]
    fn only_the_daemons_user_root_or_the_token_may_register() {
        let t = Trust {
            uid: 1000,
            token: Some("s3cret".into()),
        };
        assert!(trusted(&t, 1000, None).is_ok());
        assert!(trusted(&t, 0, None).is_ok());
        assert!(trusted(&t, 1001, None).is_err());
        assert!(trusted(&t, 1001, Some("guess")).is_err());
        assert!(trusted(&t, 1001, Some("s3cret")).is_ok());
        let no_token = Trust {
            uid: 1000,
            token: None,
        };
        assert!(trusted(&no_token, 1001, Some("")).is_err());
    }

    #[test]
    fn frames_read_as_documented() {
        let r: FromProgram = serde_json::from_str(
            r#"{"op": "register", "name": "upper",
                "calls": [{"call": 1, "name": "upper", "doc": "uppercase"}]}"#,
        )
        .unwrap();
        assert!(matches!(r, FromProgram::Register(ref g) if g.calls[0].name == "upper"));
        let a: FromProgram =
            serde_json::from_str(r#"{"op": "reply", "id": 7, "len": 3, "values": [1, 2, 3, 4]}"#)
                .unwrap();
        assert!(matches!(
            a,
            FromProgram::Reply(Answer { id: 7, len: 3, .. })
        ));
        let e: FromProgram =
            serde_json::from_str(r#"{"op": "reply", "id": 8, "error": "no"}"#).unwrap();
        assert!(matches!(
            e,
            FromProgram::Reply(Answer { error: Some(_), .. })
        ));
        let c = serde_json::to_value(ToProgram::GuestGone { guest: 3 }).unwrap();
        assert_eq!(c, serde_json::json!({"op": "guest_gone", "guest": 3}));
    }
}
