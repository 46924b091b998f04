//! Following a channel whose session moved to another daemon (a migration, a daemon
//! restart with `--state-dir`).
//!
//! The old daemon answers the request each channel is running, takes no more, keeps the
//! answers the guest may not have read yet, and at the hand-over closes the channel with
//! [`closed::MOVED`]. The channel then (nothing of the old daemon's memory is read: it may
//! be gone already):
//! 1. lets the connection follow the session (a call on it reconnects, with auto-reconnect
//!    on, to the daemon the session went to);
//! 2. lays the channel out afresh in its region in the new window and resumes it there
//!    (`service::resume`: same id; the services' state for the guest came along);
//! 3. takes the kept answers the new daemon posts first, those of the requests it still
//!    waits for (every request the old daemon took was answered; the others were never
//!    run);
//! 4. sends its calls still unanswered again, under the same sequence numbers, with their
//!    inputs (it keeps a copy of each inline call's input until its answer). Each call runs
//!    exactly once.
//!
//! Packets of a transfer cut by the move are not sent again one by one: the transfer
//! starts over as a whole on the new daemon ([`ServiceChannel::send`]), and its call runs
//! once (on the old daemon if the commit was answered there, else on the new one).

use std::sync::Arc;

use virtsoc_devapi::service as api;
use virtsoc_proto::{Opcode, Status};
use virtsoc_services::chan::{closed, kind, Entry};
use virtsoc_services::payload::{Input, Output};

use super::{lay_out, svc_err, Response, ServiceChannel};
use crate::{GuestError, Result};

/// The code of a response made up for a request of a transfer the move cut.
pub(super) const RESTART: u32 = u32::MAX;
const RESTART_REASON: &str = "the channel moved to another daemon; the transfer starts again";

/// The error a cut transfer's requests answer.
pub(super) fn restart_error() -> GuestError {
    GuestError::Status {
        op: Opcode::DeviceCmd,
        status: Status::Closed,
        reason: Some(RESTART_REASON.into()),
    }
}

/// Whether `e` is [`restart_error`].
pub(super) fn is_restart(e: &GuestError) -> bool {
    matches!(e, GuestError::Status { status: Status::Closed, reason: Some(r), .. } if r == RESTART_REASON)
}

impl ServiceChannel<'_> {
    /// Whether the connection went to another daemon (its window is not the channel's).
    pub(super) fn moved_away(&self) -> bool {
        !Arc::ptr_eq(&self.conn.window(), self.end.window())
    }

    /// Whether the channel's session moved: its daemon said so, or the connection went.
    pub(super) fn gone(&self) -> bool {
        self.end.closed_code() == closed::MOVED || self.moved_away()
    }

    /// After an error of the ring: whether the channel's session moved after all. The old
    /// daemon may release the ring (zeroing it, its `MOVED` mark with it) while the
    /// connection is still finishing its move: a call on the connection waits for the move
    /// to be done, then the windows tell.
    pub(super) fn moved_after_all(&self) -> bool {
        if self.gone() {
            return true;
        }
        let _ = self.conn.nop();
        self.moved_away()
    }

    /// Follows the channel to the daemon its session moved to (see the module docs).
    pub(super) fn follow_move(&mut self) -> Result<()> {
        if !self.gone() {
            return Err(GuestError::Closed);
        }
        // 1. The connection follows the session.
        let old = self.end.window().clone();
        self.conn.nop()?;
        if Arc::ptr_eq(&self.conn.window(), &old) {
            return Err(GuestError::Closed);
        }
        // 2. Fresh rings in the region, in the new window; the channel resumes there.
        let layout = self.end.layout();
        let (base, end) = lay_out(self.conn, self.region, layout)?;
        self.base = base;
        self.end = end;
        self.moves += 1;
        let r = self.conn.command(&api::Resume {
            channel: self.id,
            ring: u64::from(self.region),
        })?;
        // 3. The answers kept for it: those it waits for.
        for _ in 0..r.answers {
            let e = self
                .end
                .next(std::time::Duration::ZERO)
                .map_err(svc_err)?
                .ok_or_else(|| GuestError::BadArgument("a kept answer did not come".into()))?;
            let Some(at) = self.outstanding.iter().position(|(o, _)| o.seq == e.seq) else {
                continue; // read before the move
            };
            self.outstanding.remove(at);
            let slot = self.end.slot(e.slot).map_err(svc_err)?;
            let mut kept = vec![0u8; (e.len as usize).min(slot.capacity())];
            slot.read_at(0, &mut kept).map_err(svc_err)?;
            self.ready.push_back(Response {
                e,
                kept: Some(kept),
            });
        }
        // 4. The calls without an answer go again; a cut transfer's requests answer RESTART.
        for (e, input) in std::mem::take(&mut self.outstanding) {
            if e.code == kind::CALL || e.code == kind::CALL_REGION {
                self.repost(e, input)?;
            } else {
                let e = Entry {
                    code: RESTART,
                    len: 0,
                    ..e
                };
                self.ready.push_back(Response {
                    e,
                    kept: Some(Vec::new()),
                });
            }
        }
        Ok(())
    }

    /// Posts call `e` again on the new ring, its inline `input` in its slot.
    pub(super) fn repost(&mut self, e: Entry, input: Vec<u8>) -> Result<()> {
        if e.code == kind::CALL {
            let mut s = self.end.slot(e.slot).map_err(svc_err)?;
            s.write_at(0, &input).map_err(svc_err)?;
        }
        if !self.end.post(e).map_err(svc_err)? {
            return Err(GuestError::BadArgument("channel ring full".into()));
        }
        self.outstanding.push_back((e, input));
        Ok(())
    }
}
