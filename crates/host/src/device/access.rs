//! Device commands that take their own accesses ([`Opcode::DeviceCmdAccess`]): the device's
//! worker begins an access to the whole of each region the command's declaration names, in
//! the declared mode, runs the command, and ends the accesses when it answers ([`Ends`],
//! carried by its [`Reply`]). It is what a begin_access per region, the command and a
//! detached end_access per region queued on the device do, in one request instead of
//! 1 + 2n: a player's `decode` and `receive_frame` each cost the daemon one ring entry.
//!
//! A begin that waits for a copy into the device's memory parks the request at that region
//! (the regions before it stay begun) and resumes there; a begin that fails ends those
//! before it and answers the failure without running the command. The ends run however the
//! command answers (a failure, a paced command's last step, an asynchronous device's
//! completion on another thread, a reply dropped unanswered); prefetch copies they start
//! hold the queue's next fence signal, as a detached end_access's do.

use std::sync::Arc;

use virtsoc_sched::policy::Policy;
use virtsoc_svm::{AccessSpec, CopyTicket, GuestId, Progress, RegionId, SvmManager};

use super::worker::{run_command, Later, Parked};
use super::{DeviceResult, DeviceSlot, Reply};
use crate::session::Session;
use crate::status::status_of;
use virtsoc_proto::{Request, Status};

/// The accesses a command took, ended when it answers.
pub(super) struct Ends {
    svm: Arc<SvmManager>,
    guest: GuestId,
    accesses: Vec<(RegionId, AccessSpec)>,
}

/// What the ends started: the copies of each region the queue's next signal waits for.
type Started = (
    Arc<SvmManager>,
    GuestId,
    Vec<(RegionId, Vec<Arc<CopyTicket>>)>,
);

impl Ends {
    /// Ends every access; the first failure becomes the answer of a command that succeeded.
    /// The copies they started, if any.
    pub(super) fn end(
        self,
        result: &mut DeviceResult,
        reason: &mut Option<String>,
    ) -> Option<Started> {
        let mut started = Vec::new();
        for (id, spec) in &self.accesses {
            match self.svm.end_access(self.guest, *id, spec) {
                Ok(end) if !end.started.is_empty() => started.push((*id, end.started)),
                Ok(_) => {}
                Err(e) if result.is_ok() => {
                    *result = Err(status_of(&e));
                    *reason = Some(format!("end_access of region {id}: {e}"));
                }
                Err(_) => {}
            }
        }
        (!started.is_empty()).then_some((self.svm, self.guest, started))
    }
}

/// Runs `req`, a [`Opcode::DeviceCmdAccess`](virtsoc_proto::Opcode::DeviceCmdAccess) of
/// `session`'s guest on `slot`'s device (see the module's notes). `resume`: the region whose
/// begin parked it, when it is run again after that copy.
pub(super) fn execute(
    svm: &Arc<SvmManager>,
    slot: &DeviceSlot,
    session: &Arc<Session>,
    req: Request,
    reply: Reply,
    resume: Option<usize>,
    policy: &Policy,
) -> Option<Later> {
    // The worker's `execute` checked the policy (on the first run).
    let guest = session.guest_id();
    let reads_host = slot.device.reads_host_memory();
    let cx = slot
        .ctx(svm, session)
        .with_policy(policy.for_guest(session.name()));
    let Some(info) = virtsoc_devapi::device(slot.id) else {
        let why = "the device declares no commands: which regions they name is unknown; \
                   bracket them with begin/end_access";
        reply.send_because(Err(Status::NotSupported), Some(why.into()));
        return None;
    };
    // The checks of `validate`, once: the opcode is declared, each region is the guest's.
    let Some(decl) = info.commands.iter().find(|c| c.op == req.args[0]) else {
        reply.send(Err(Status::UnknownOpcode));
        return None;
    };
    let from = resume.unwrap_or(0);
    let mut accesses = Vec::new();
    for (id, mode) in decl.regions(&req.args) {
        // A region freed while the request was parked is the guest's own race: the accesses
        // begun before it end.
        let size = match cx.meta(id) {
            Ok(m) => m.size,
            Err(st) => {
                accesses.truncate(from);
                reply.ending(svm, guest, accesses).send(Err(st));
                return None;
            }
        };
        let spec = AccessSpec::new(slot.id.0, slot.domain, 0, size, mode).reading_host(reads_host);
        accesses.push((id, spec));
    }
    for (i, (id, spec)) in accesses.iter().enumerate().skip(from) {
        match svm.begin_access_step(guest, *id, spec, resume == Some(i)) {
            Ok(Progress::Done(_)) => {}
            Ok(Progress::Wait(ticket)) => {
                return Some(Later::Parked(Parked {
                    req,
                    reply,
                    ticket,
                    at: i,
                }))
            }
            Err(e) => {
                let why = format!("begin_access of region {id}: {e}");
                accesses.truncate(i);
                let reply = reply.ending(svm, guest, accesses);
                reply.send_because(Err(status_of(&e)), Some(why));
                return None;
            }
        }
    }
    run_command(slot, &cx, &req.args, reply.ending(svm, guest, accesses))
}

impl Reply {
    /// The same reply, ending `accesses` of `guest` before it answers.
    fn ending(
        mut self,
        svm: &Arc<SvmManager>,
        guest: GuestId,
        accesses: Vec<(RegionId, AccessSpec)>,
    ) -> Reply {
        self.ends = Some(Ends {
            svm: svm.clone(),
            guest,
            accesses,
        });
        self
    }
}
