//! The daemon's side of one registered host program: a [`Service`] whose calls copy their
//! input into a slot of the shared memfd, send the program a request, wait (up to the
//! call's deadline) for its answer, and copy the output back; plus the loop that reads the
//! program's answers ([`ExternalService::serve`]).
//!
//! Each request waits on its own entry of the table of requests outstanding; the reader
//! fills the entry and wakes the waiters. When the program goes (hang-up, a missed deadline,
//! a malformed or unasked-for answer) every entry still waiting fails at once, the socket is
//! shut, and the service stays unavailable until a program registers the name again.

use std::collections::HashMap;
use std::os::unix::net::UnixStream;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags};
use serde_json::{json, Value};
use virtsoc_proto::{SharedWindow, WindowLayout};

use super::{Answer, FromProgram, Registration, ToProgram};
use crate::hypervisor::{CallCtx, CallInfo, Reply, Service};
use crate::payload::{Input, Output};
use crate::{Result, ServiceError};
use virtsoc_sync::{CondvarExt, LockExt};

/// A request's place in the table.
enum Slot {
    Waiting,
    Answered(Answer),
    Failed(ServiceError),
}

struct State {
    connected: bool,
    /// Why the program is gone.
    why: String,
    /// Slots of the memfd no call holds.
    free: Vec<u32>,
    pending: HashMap<u64, Slot>,
    next_id: u64,
}

/// A service served by a host program.
pub struct ExternalService {
    name: String,
    calls: Vec<CallInfo>,
    shm: SharedWindow,
    slot_bytes: u64,
    slots: u32,
    peer: String,
    /// The socket for sending (`None` once disconnected).
    tx: Mutex<Option<UnixStream>>,
    st: Mutex<State>,
    cv: Condvar,
}

/// How long the program has to answer the daemon's own requests (control operations,
/// migration hand-overs).
const OWN_TIMEOUT: Duration = Duration::from_secs(10);

fn io(e: impl std::fmt::Display) -> ServiceError {
    ServiceError::Memory(e.to_string())
}

/// A slot taken for a call, given back on drop.
struct Taken<'a> {
    svc: &'a ExternalService,
    slot: u32,
}

impl Drop for Taken<'_> {
    fn drop(&mut self) {
        let mut st = self.svc.lock();
        if st.connected {
            st.free.push(self.slot);
            drop(st);
            self.svc.cv.notify_all();
        }
    }
}

impl ExternalService {
    /// The proxy of the program that registered `reg` on `sock`, with its memfd of `slots`
    /// slots of `slot_bytes`.
    pub fn new(
        reg: &Registration,
        slots: u32,
        slot_bytes: u64,
        sock: &UnixStream,
        peer: String,
    ) -> Result<Self> {
        let probe = WindowLayout::new(2 << 20, 1, 1).map_err(io)?;
        let size = probe.data_offset() + u64::from(slots) * slot_bytes;
        let layout = WindowLayout::new(size, 1, 1).map_err(io)?;
        let shm = SharedWindow::create_memfd(&format!("virtsoc-service-{}", reg.name), layout)
            .map_err(io)?;
        Ok(ExternalService {
            name: reg.name.clone(),
            calls: reg.calls.clone(),
            shm,
            slot_bytes,
            slots,
            peer,
            tx: Mutex::new(Some(sock.try_clone().map_err(io)?)),
            st: Mutex::new(State {
                connected: true,
                why: String::new(),
                free: (0..slots).rev().collect(),
                pending: HashMap::new(),
                next_id: 1,
            }),
            cv: Condvar::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.st.lock_or_recover()
    }

    /// Bytes of the memfd.
    pub fn shm_size(&self) -> u64 {
        self.shm.size()
    }

    /// Who the program is (pid and uid).
    pub fn peer(&self) -> &str {
        &self.peer
    }

    fn offset(&self, slot: u32) -> u64 {
        self.shm.layout().data_offset() + u64::from(slot) * self.slot_bytes
    }

    fn gone(&self, st: &State) -> ServiceError {
        ServiceError::Unavailable {
            service: self.name.clone(),
            reason: st.why.clone(),
        }
    }

    /// Sends the registration's answer with the memfd.
    pub(super) fn send_with_fd(&self, msg: &ToProgram) -> Result<()> {
        self.send_inner(msg, true)
    }

    fn send(&self, msg: &ToProgram) -> Result<()> {
        self.send_inner(msg, false)
    }

    fn send_inner(&self, msg: &ToProgram, fd: bool) -> Result<()> {
        let tx = self.tx.lock_or_recover();
        let sock = tx.as_ref().ok_or_else(|| self.gone(&self.lock()))?;
        let fd = fd.then(|| self.shm.fd());
        virtsoc_proto::handshake::send_json(sock, msg, fd).map_err(io)
    }

    /// Cuts the program off: every request waiting fails, the socket is shut, and the
    /// service is unavailable from now on (until another registration replaces it).
    pub fn disconnect(&self, why: &str) {
        let mut st = self.lock();
        if st.connected {
            log::warn!(
                "service {:?} ({}): {why}; disconnected",
                self.name,
                self.peer
            );
            st.connected = false;
            st.why = why.to_string();
            let err = self.gone(&st);
            for w in st.pending.values_mut() {
                if matches!(w, Slot::Waiting) {
                    *w = Slot::Failed(err.clone());
                }
            }
        }
        drop(st);
        self.cv.notify_all();
        if let Some(s) = self.tx.lock_or_recover().take() {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }

    /// Reads the program's answers until it hangs up or is disconnected.
    pub fn serve(&self, sock: &UnixStream) {
        let why = loop {
            let msg = match virtsoc_proto::handshake::recv_json::<FromProgram>(sock) {
                Ok((m, _)) => m,
                Err(virtsoc_proto::ProtoError::Closed) => break "its program hung up".to_string(),
                Err(e) => break format!("its program broke the protocol: {e}"),
            };
            let FromProgram::Reply(ans) = msg else {
                break "its program registered twice on one connection".into();
            };
            let mut st = self.lock();
            if !st.connected {
                break st.why.clone();
            }
            match st.pending.get_mut(&ans.id) {
                Some(w @ Slot::Waiting) => *w = Slot::Answered(ans),
                _ => {
                    break format!(
                        "its program answered request {}, which is not waiting",
                        ans.id
                    )
                }
            }
            drop(st);
            self.cv.notify_all();
        };
        self.disconnect(&why);
    }

    /// Sends the request `make` builds with its id and waits for the answer until `deadline`
    /// (`timeout` after the call began); a program that lets it pass is disconnected.
    fn request(
        &self,
        deadline: Instant,
        timeout: Duration,
        make: impl FnOnce(u64) -> ToProgram,
    ) -> Result<Answer> {
        let id = {
            let mut st = self.lock();
            if !st.connected {
                return Err(self.gone(&st));
            }
            let id = st.next_id;
            st.next_id += 1;
            st.pending.insert(id, Slot::Waiting);
            id
        };
        if let Err(e) = self.send(&make(id)) {
            self.lock().pending.remove(&id);
            self.disconnect(&format!("a request could not be sent: {e}"));
            return Err(self.gone(&self.lock()));
        }
        let mut st = self.lock();
        loop {
            if !matches!(st.pending.get(&id), Some(Slot::Waiting)) {
                return match st.pending.remove(&id) {
                    Some(Slot::Answered(a)) => Ok(a),
                    Some(Slot::Failed(e)) => Err(e),
                    _ => Err(self.gone(&st)),
                };
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                st.pending.remove(&id);
                drop(st);
                self.disconnect(&format!("it did not answer request {id} in time"));
                return Err(ServiceError::CallTimedOut {
                    service: self.name.clone(),
                    ms: timeout.as_millis() as u64,
                });
            }
            st = self.cv.wait_timeout_or_recover(st, left).0;
        }
    }

    /// A request of the daemon's own (control, migration) within [`OWN_TIMEOUT`].
    fn own_request(&self, make: impl FnOnce(u64) -> ToProgram) -> Result<Answer> {
        self.request(Instant::now() + OWN_TIMEOUT, OWN_TIMEOUT, make)
    }

    /// Takes a free slot, waiting until `deadline` for one.
    fn take_slot(&self, deadline: Instant, timeout: Duration) -> Result<Taken<'_>> {
        let mut st = self.lock();
        loop {
            if !st.connected {
                return Err(self.gone(&st));
            }
            if let Some(slot) = st.free.pop() {
                return Ok(Taken { svc: self, slot });
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(ServiceError::CallTimedOut {
                    service: self.name.clone(),
                    ms: timeout.as_millis() as u64,
                });
            }
            st = self.cv.wait_timeout_or_recover(st, left).0;
        }
    }
}

impl Service for ExternalService {
    fn name(&self) -> &str {
        &self.name
    }

    fn calls(&self) -> Vec<CallInfo> {
        self.calls.clone()
    }

    fn call(
        &self,
        cx: &CallCtx,
        call: u32,
        input: &dyn Input,
        out: &mut dyn Output,
    ) -> Result<Reply> {
        let deadline = Instant::now() + cx.timeout;
        let n = input.len() as u64;
        // The input at the slot's start, the output's room after it (page aligned).
        let room = n.next_multiple_of(4096);
        if room > self.slot_bytes {
            return Err(ServiceError::BadArgument(format!(
                "an input of {n} bytes exceeds service {:?}'s slots of {} bytes",
                self.name, self.slot_bytes
            )));
        }
        let taken = self.take_slot(deadline, cx.timeout)?;
        let base = self.offset(taken.slot);
        let mut at = base;
        let mut err = None;
        input.for_each_chunk(&mut |chunk| {
            if err.is_none() {
                err = self.shm.copy_in(at, chunk).err();
                at += chunk.len() as u64;
            }
        })?;
        if let Some(e) = err {
            return Err(io(e));
        }
        let capacity = (self.slot_bytes - room).min(out.capacity() as u64);
        let output = base + room;
        let ans = self.request(deadline, cx.timeout, |id| ToProgram::Call {
            id,
            guest: cx.guest,
            channel: cx.channel,
            call,
            input: base,
            input_len: n,
            output,
            output_capacity: capacity,
        })?;
        if let Some(e) = ans.error {
            return Err(ServiceError::BadArgument(e));
        }
        if ans.len > capacity {
            self.disconnect(&format!(
                "it answered {} bytes of output for room of {capacity}",
                ans.len
            ));
            return Err(self.gone(&self.lock()));
        }
        let len = ans.len as usize;
        let bytes = self.shm.slice(output, ans.len).map_err(io)?;
        let guard = bytes.ptr_guard();
        // SAFETY: `slice` checked that `len` bytes at `output` lie inside the memfd's
        // mapping, which `self.shm` keeps mapped. The program may still write them (it
        // should not, having answered): the bytes are copied as opaque data, so a racing
        // write changes only the output the guest gets from it.
        let src = unsafe { std::slice::from_raw_parts(guard.as_ptr(), len) };
        out.write_at(0, src)?;
        drop(taken);
        Ok(Reply {
            len,
            values: ans.values,
        })
    }

    fn control(&self, op: &str, args: &Value) -> Result<Value> {
        let ans = self.own_request(|id| ToProgram::Control {
            id,
            name: op.to_string(),
            args: args.clone(),
        })?;
        match ans.error {
            Some(e) => Err(ServiceError::BadArgument(e)),
            None => Ok(ans.result.unwrap_or(Value::Null)),
        }
    }

    fn guest_gone(&self, guest: u64) {
        // Best effort: a program that is gone has nothing to forget.
        if self.available() && self.send(&ToProgram::GuestGone { guest }).is_err() {
            self.disconnect("it stopped reading its socket");
        }
    }

    fn export_guest(&self, guest: u64) -> Option<Value> {
        match self.own_request(|id| ToProgram::Export { id, guest }) {
            Ok(a) if a.error.is_none() => a.result.filter(|v| !v.is_null()),
            Ok(a) => {
                log::warn!(
                    "service {:?}: export of guest {guest}: {:?}",
                    self.name,
                    a.error
                );
                None
            }
            Err(e) => {
                log::warn!("service {:?}: export of guest {guest}: {e}", self.name);
                None
            }
        }
    }

    fn import_guest(&self, guest: u64, state: &Value) -> Result<()> {
        let ans = self.own_request(|id| ToProgram::Import {
            id,
            guest,
            state: state.clone(),
        })?;
        ans.error
            .map_or(Ok(()), |e| Err(ServiceError::BadArgument(e)))
    }

    fn available(&self) -> bool {
        if !self.lock().connected {
            return false;
        }
        // A program that exited a moment ago may not have been noticed by the reader yet:
        // the kernel knows its end of the socket is closed.
        let hung_up = {
            let tx = self.tx.lock_or_recover();
            tx.as_ref().is_none_or(|s| {
                let mut fds = [PollFd::new(s, PollFlags::RDHUP)];
                let zero = rustix::time::Timespec {
                    tv_sec: 0,
                    tv_nsec: 0,
                };
                poll(&mut fds, Some(&zero)).is_ok_and(|n| {
                    n > 0
                        && fds[0]
                            .revents()
                            .intersects(PollFlags::RDHUP | PollFlags::HUP | PollFlags::ERR)
                })
            })
        };
        if hung_up {
            self.disconnect("its program hung up");
        }
        !hung_up
    }

    fn status(&self) -> Value {
        let st = self.lock();
        json!({
            "program": self.peer,
            "connected": st.connected,
            "gone_because": (!st.connected).then(|| st.why.clone()),
            "slots": self.slots,
            "slot_bytes": self.slot_bytes,
            "slots_busy": self.slots as usize - st.free.len(),
        })
    }
}
