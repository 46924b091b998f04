//! The host program's side in Rust: [`ServiceHost::register`] registers a service over the
//! daemon's services socket and maps the memfd it gets; [`ServiceHost::serve`] then runs a
//! [`Handler`] on each request, its input and output in place in the memfd, until the
//! daemon hangs up. Programs in other languages speak the same frames (`docs/services.md`).
//!
//! ```no_run
//! use std::borrow::Cow;
//! use virtsoc_services::external::client::{CallMeta, Handler, Options, ServiceHost};
//! use virtsoc_services::hypervisor::CallInfo;
//! use virtsoc_services::ServiceError;
//!
//! struct Upper;
//! impl Handler for Upper {
//!     fn call(&mut self, _: &CallMeta, input: &[u8], output: &mut [u8])
//!         -> Result<(usize, [u64; 4]), ServiceError> {
//!         let out = output
//!             .get_mut(..input.len())
//!             .ok_or_else(|| ServiceError::BadArgument("no room".into()))?;
//!         out.copy_from_slice(input);
//!         out.make_ascii_uppercase();
//!         Ok((input.len(), [0; 4]))
//!     }
//! }
//! let calls = [CallInfo { call: 1, name: Cow::Borrowed("upper"), doc: Cow::Borrowed("") }];
//! let mut host =
//!     ServiceHost::register("/tmp/virtsoc.sock.services", "upper", &calls, &Options::default())?;
//! host.serve(&mut Upper)?;
//! # Ok::<(), virtsoc_services::ServiceError>(())
//! ```

use std::fs::File;
use std::os::unix::net::UnixStream;
use std::path::Path;

use serde_json::Value;
use virtsoc_proto::handshake::{recv_json, send_json};
use virtsoc_proto::{ProtoError, SharedWindow, WindowLayout};

use super::{Answer, FromProgram, Registration, ToProgram};
use crate::hypervisor::CallInfo;
use crate::{Result, ServiceError};

/// What a program asks for when it registers (all optional).
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// The daemon's token (when the program runs as another user than the daemon).
    pub token: Option<String>,
    /// Calls outstanding at once.
    pub slots: Option<u32>,
    /// Bytes of each call's slot (its input and output).
    pub slot_bytes: Option<u64>,
}

/// Who calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallMeta {
    /// The request's id.
    pub id: u64,
    /// The calling guest (the daemon's id of it).
    pub guest: u64,
    /// The channel it called on.
    pub channel: u64,
    /// The call number.
    pub call: u32,
}

/// What a program does with the daemon's requests.
///
/// An error goes to the daemon as its text (`Display`): a refusal in the program's own
/// words is [`ServiceError::BadArgument`], which is also what the daemon makes of any
/// error text a program answers, so the guest or the control API sees exactly those words.
pub trait Handler {
    /// Runs a call on `input`, writing at most `output.len()` bytes to `output`; answers
    /// the bytes written and four values, or an error the guest gets.
    fn call(
        &mut self,
        meta: &CallMeta,
        input: &[u8],
        output: &mut [u8],
    ) -> Result<(usize, [u64; 4])>;
    /// Runs control operation `op` (from `virtsoc ctl` or the control API).
    fn control(&mut self, op: &str, _args: &Value) -> Result<Value> {
        Err(ServiceError::BadArgument(format!(
            "no control operation {op:?}"
        )))
    }
    /// A guest went away.
    fn guest_gone(&mut self, _guest: u64) {}
    /// A guest migrates away: its state for the target daemon's program (`None`: none).
    fn export_guest(&mut self, _guest: u64) -> Option<Value> {
        None
    }
    /// A guest migrated here (now `guest`): takes over the state its old program exported.
    fn import_guest(&mut self, _guest: u64, _state: &Value) -> Result<()> {
        Ok(())
    }
}

/// A registered service, as its program holds it.
pub struct ServiceHost {
    sock: UnixStream,
    shm: SharedWindow,
    slots: u32,
    slot_bytes: u64,
}

fn proto(e: ProtoError) -> ServiceError {
    match e {
        ProtoError::Closed => ServiceError::Closed,
        e => ServiceError::Memory(e.to_string()),
    }
}

impl ServiceHost {
    /// Registers service `name` with `calls` on the daemon's services socket `socket`
    /// (`<daemon socket>.services` unless the daemon was told otherwise).
    pub fn register(
        socket: impl AsRef<Path>,
        name: &str,
        calls: &[CallInfo],
        opts: &Options,
    ) -> Result<Self> {
        let sock = UnixStream::connect(socket.as_ref()).map_err(|e| {
            ServiceError::BadArgument(format!("{}: {e}", socket.as_ref().display()))
        })?;
        let reg = FromProgram::Register(Registration {
            name: name.into(),
            calls: calls.to_vec(),
            token: opts.token.clone(),
            slots: opts.slots,
            slot_bytes: opts.slot_bytes,
        });
        send_json(&sock, &reg, None).map_err(proto)?;
        let (answer, fd) = recv_json::<ToProgram>(&sock).map_err(proto)?;
        let (size, slots, slot_bytes) = match answer {
            ToProgram::Registered {
                size,
                slots,
                slot_bytes,
            } => (size, slots, slot_bytes),
            ToProgram::Refused { reason } => return Err(ServiceError::BadArgument(reason)),
            other => {
                return Err(ServiceError::BadArgument(format!(
                    "the daemon answered {other:?} to the registration"
                )))
            }
        };
        let fd = fd.ok_or_else(|| ServiceError::BadArgument("no memfd came".into()))?;
        let layout = WindowLayout::new(size, 1, 1).map_err(proto)?;
        let shm = SharedWindow::map_file(File::from(fd), layout).map_err(proto)?;
        Ok(ServiceHost {
            sock,
            shm,
            slots,
            slot_bytes,
        })
    }

    /// Slots and their size, as the daemon granted them.
    pub fn slots(&self) -> (u32, u64) {
        (self.slots, self.slot_bytes)
    }

    /// Serves requests until the daemon hangs up (`Ok`) or something fails.
    pub fn serve(&mut self, h: &mut dyn Handler) -> Result<()> {
        loop {
            match self.serve_one(h) {
                Err(ServiceError::Closed) => return Ok(()),
                Err(e) => return Err(e),
                Ok(()) => {}
            }
        }
    }

    /// Waits for one request and answers it.
    pub fn serve_one(&mut self, h: &mut dyn Handler) -> Result<()> {
        let (msg, _) = recv_json::<ToProgram>(&self.sock).map_err(proto)?;
        let answer = match msg {
            ToProgram::Call {
                id,
                guest,
                channel,
                call,
                input,
                input_len,
                output,
                output_capacity,
            } => {
                let meta = CallMeta {
                    id,
                    guest,
                    channel,
                    call,
                };
                self.call(h, &meta, (input, input_len), (output, output_capacity))?
            }
            ToProgram::Control { id, name, args } => match h.control(&name, &args) {
                Ok(v) => answer(id, Ok(v)),
                Err(e) => answer(id, Err(e)),
            },
            ToProgram::GuestGone { guest } => {
                h.guest_gone(guest);
                return Ok(());
            }
            ToProgram::Export { id, guest } => answer(id, Ok(h.export_guest(guest).into())),
            ToProgram::Import { id, guest, state } => {
                answer(id, h.import_guest(guest, &state).map(|_| Value::Null))
            }
            other => {
                return Err(ServiceError::BadArgument(format!(
                    "unexpected frame from the daemon: {other:?}"
                )))
            }
        };
        send_json(&self.sock, &FromProgram::Reply(answer), None).map_err(proto)
    }

    fn call(
        &self,
        h: &mut dyn Handler,
        meta: &CallMeta,
        (input, input_len): (u64, u64),
        (output, capacity): (u64, u64),
    ) -> Result<Answer> {
        // The daemon's offsets are checked before any slice is made of them: inside the
        // mapping, and the input and the output apart.
        self.shm.check(input, input_len).map_err(proto)?;
        self.shm.check(output, capacity).map_err(proto)?;
        let apart = input + input_len <= output || output + capacity <= input;
        if !apart {
            return Err(ServiceError::BadArgument(
                "the daemon's input and output overlap".into(),
            ));
        }
        let base = self.shm.base_ptr();
        // SAFETY: both ranges lie inside the memfd's mapping (checked above), which
        // `self.shm` keeps mapped for `&self`'s life, and they do not overlap, so the shared
        // and the mutable slice alias nothing. The daemon does not touch a slot while its
        // call is outstanding (until this answer is sent).
        let (inp, out) = unsafe {
            (
                std::slice::from_raw_parts(base.add(input as usize), input_len as usize),
                std::slice::from_raw_parts_mut(base.add(output as usize), capacity as usize),
            )
        };
        Ok(match h.call(meta, inp, out) {
            Ok((len, values)) if len <= out.len() => Answer {
                id: meta.id,
                len: len as u64,
                values,
                ..Answer::default()
            },
            Ok((len, _)) => answer(
                meta.id,
                Err(ServiceError::BadArgument(format!(
                    "the service wrote {len} bytes into room for {capacity}"
                ))),
            ),
            Err(e) => answer(meta.id, Err(e)),
        })
    }
}

/// The answer to request `id`: its result, or its error's text.
fn answer(id: u64, r: Result<Value>) -> Answer {
    match r {
        Ok(v) => Answer {
            id,
            result: Some(v),
            ..Answer::default()
        },
        Err(e) => Answer {
            id,
            error: Some(e.to_string()),
            ..Answer::default()
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Refuser;
    impl Handler for Refuser {
        fn call(&mut self, _: &CallMeta, _: &[u8], _: &mut [u8]) -> Result<(usize, [u64; 4])> {
            Err(ServiceError::BadArgument("not today".into()))
        }
    }

    /// A program's refusal reaches the daemon as its own words (the daemon makes them a
    /// `BadArgument` again), and the default control refusal reads as before.
    #[test]
    fn a_handlers_refusal_goes_out_in_its_own_words() {
        let mut h = Refuser;
        let meta = CallMeta {
            id: 7,
            guest: 1,
            channel: 2,
            call: 3,
        };
        let e = h.call(&meta, &[], &mut []).unwrap_err();
        let a = answer(7, Err(e));
        assert_eq!((a.id, a.error.as_deref()), (7, Some("not today")));
        let e = h.control("reset", &Value::Null).unwrap_err();
        assert_eq!(
            answer(8, Err(e)).error.as_deref(),
            Some("no control operation \"reset\"")
        );
        assert_eq!(answer(9, Ok(Value::Null)).error, None);
    }
}
