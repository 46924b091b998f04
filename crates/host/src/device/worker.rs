//! A device's worker thread: it takes each guest's requests in the order the device's
//! scheduler picks them, runs them on the device, parks a begin_access that waits for a copy
//! into the device's memory (serving the other guests meanwhile), and runs a paced command
//! ([`Device::paced`]) a step at a time as its guest's bandwidth share allows.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use super::*;
use crate::status::{access_spec, access_values, status_of};

/// A begin_access waiting for a copy into the device's memory: a request's own, or that of
/// the region at `at` of a command that takes its accesses ([`Opcode::DeviceCmdAccess`]).
pub(super) struct Parked {
    pub(super) req: Request,
    pub(super) reply: Reply,
    pub(super) ticket: Arc<CopyTicket>,
    pub(super) at: usize,
}

/// A paced command between its steps ([`Device::paced`]), and since when its next step has
/// been waiting for its bytes of the guest's share.
pub(super) struct PacedRun {
    op: Box<dyn PacedOp>,
    reply: Reply,
    waiting: Option<Instant>,
}

/// What `execute` left for later.
pub(super) enum Later {
    /// A begin_access waiting for a copy.
    Parked(Parked),
    /// A command run in paced steps.
    Paced(PacedRun),
}

/// Runs paced command `p` of `session` one step if the guest's share has its bytes now;
/// else returns it with the time they will be there. `None`: the command is done (answered).
fn step_paced(
    svm: &Arc<SvmManager>,
    slot: &DeviceSlot,
    session: &Arc<Session>,
    mut p: PacedRun,
) -> Option<(PacedRun, Option<Instant>)> {
    let now = Instant::now();
    if let Err(at) = session.take_bandwidth(now, p.op.next_bytes()) {
        p.waiting.get_or_insert(now);
        return Some((p, Some(at)));
    }
    if let Some(since) = p.waiting.take() {
        session.note_paced_wait(now.saturating_duration_since(since));
    }
    let cx = slot.ctx(svm, session);
    match p.op.step(&cx) {
        Some(result) => {
            p.reply.send_because(result, cx.take_reason());
            None
        }
        None => Some((p, None)),
    }
}

/// Keeps a writer's request open until the prefetch copies its end_access started are done,
/// so a fence signal queued after it fires only then; tells the SVM how long that held the
/// writer back.
struct Hold {
    token: Option<DoneToken>,
    left: usize,
    since: Instant,
    svm: Arc<SvmManager>,
    guest: GuestId,
    regions: Vec<RegionId>,
}

/// Holds `token` until every copy the end_accesses of `ended` started is done (each region
/// with its copies).
pub(super) fn hold_until_copied(
    svm: &Arc<SvmManager>,
    guest: GuestId,
    ended: Vec<(RegionId, Vec<Arc<CopyTicket>>)>,
    token: DoneToken,
) {
    let regions = ended.iter().map(|(id, _)| *id).collect();
    let tickets: Vec<Arc<CopyTicket>> = ended.into_iter().flat_map(|(_, t)| t).collect();
    let hold = Arc::new(Mutex::new(Hold {
        token: Some(token),
        left: tickets.len(),
        since: Instant::now(),
        svm: svm.clone(),
        guest,
        regions,
    }));
    for t in tickets {
        let hold = hold.clone();
        t.on_done(Box::new(move || {
            let mut h = hold.lock_or_recover();
            h.left = h.left.saturating_sub(1);
            if h.left == 0 {
                if let Some(token) = h.token.take() {
                    token.done();
                    for r in &h.regions {
                        h.svm.note_hold(h.guest, *r, h.since.elapsed());
                    }
                }
            }
        }));
    }
}

/// Runs one request on the device. A begin_access that must wait for a copy comes back
/// parked; a command the device paces ([`Device::paced`]) comes back to be run in steps.
pub(super) fn execute(
    svm: &Arc<SvmManager>,
    slot: &DeviceSlot,
    session: &Arc<Session>,
    req: Request,
    reply: Reply,
    resume: Option<usize>,
    policy: &Policy,
) -> Option<Later> {
    let guest = session.guest_id();
    let retry = resume.is_some();
    if !retry && !permitted(slot, policy, session.name(), &req) {
        slot.acct.denied(guest);
        reply.send(Err(Status::PermissionDenied));
        return None;
    }
    match Opcode::from_u32(req.opcode) {
        Some(op @ (Opcode::BeginAccess | Opcode::EndAccess)) => {
            let (id, spec) = match access_spec(&req, slot.domain) {
                // A posted write is the CPU's alone.
                Ok(_) if crate::dispatch::posted(&req) => {
                    let why = "a posted write (ACCESS_BEGINS) is a CPU write";
                    reply.send_because(Err(Status::BadArgument), Some(why.into()));
                    return None;
                }
                Ok((id, spec)) => (id, spec.reading_host(slot.device.reads_host_memory())),
                Err(st) => {
                    reply.send(Err(st));
                    return None;
                }
            };
            if op == Opcode::BeginAccess {
                match svm.begin_access_step(guest, id, &spec, retry) {
                    Ok(Progress::Done(r)) => reply.send(Ok(access_values(&r))),
                    Ok(Progress::Wait(ticket)) => {
                        return Some(Later::Parked(Parked {
                            req,
                            reply,
                            ticket,
                            at: 0,
                        }))
                    }
                    Err(e) => reply.send(Err(status_of(&e))),
                }
            } else {
                match svm.end_access(guest, id, &spec) {
                    Ok(end) => {
                        let mut reply = reply;
                        let values = access_values(&end.report);
                        if !spec.compensates && !end.started.is_empty() {
                            // Fence ordering: nobody blocks for the compensation, so the queue
                            // holds its next signal until the copies are done.
                            if let Some(token) = reply.token.take() {
                                session.complete(Completion::ok(req.seq, values));
                                hold_until_copied(svm, guest, vec![(id, end.started)], token);
                                return None;
                            }
                        }
                        reply.send(Ok(values));
                    }
                    Err(e) => reply.send(Err(status_of(&e))),
                }
            }
        }
        Some(Opcode::DeviceCmd) => {
            let cx = slot
                .ctx(svm, session)
                .with_policy(policy.for_guest(session.name()));
            if let Err(st) = validate(slot.id, &cx, &req.args) {
                reply.send(Err(st));
                return None;
            }
            return run_command(slot, &cx, &req.args, reply);
        }
        Some(Opcode::DeviceCmdAccess) => {
            return super::access::execute(svm, slot, session, req, reply, resume, policy);
        }
        _ => reply.send(Err(Status::UnknownOpcode)),
    }
    None
}

/// Runs validated device command `args` of `cx`'s guest: in paced steps if the device paces
/// it ([`Device::paced`]: handed back to be run by the worker), else at once.
pub(super) fn run_command(
    slot: &DeviceSlot,
    cx: &DeviceCtx<'_>,
    args: &[u64; 6],
    reply: Reply,
) -> Option<Later> {
    if let Some(op) = slot.device.paced(cx, args) {
        return Some(Later::Paced(PacedRun {
            op,
            reply,
            waiting: None,
        }));
    }
    slot.device.execute_async(cx, args, reply);
    None
}

/// One guest queue's state between the worker's passes.
#[derive(Default)]
struct QueueState {
    /// The fence this queue, blocked, has a wake-up registered for.
    armed: Option<FenceId>,
    /// What `execute` left for later: a begin_access parked on a copy, or a paced command
    /// between its steps. Either holds the queue.
    later: Option<Later>,
    /// Set while the queue's last request is being answered (until its reply is sent).
    busy: Arc<AtomicBool>,
    /// The queue's next request, taken off it and waiting for the scheduler's turn.
    staged: Option<(Request, DoneToken)>,
    /// The fence wait holding the queue, and since when.
    held: Option<(FenceId, Instant)>,
}

impl QueueState {
    /// Keeps what `execute` left for later; a parked begin_access wakes the worker when its
    /// copy is done.
    fn hold(&mut self, slot: &DeviceSlot, later: Later) {
        if let Later::Parked(p) = &later {
            let wake = slot.waker();
            p.ticket.on_done(Box::new(wake));
        }
        self.later = Some(later);
    }
}

/// What one queue had this pass.
enum Turn {
    /// Something ran (a paced step, a parked access retried) or needs another look.
    Progressed,
    /// Its guest has work on the device (a paced command, a parked access, a command still
    /// running): it has nothing ready, and the scheduler counts it as running; `progressed`:
    /// a paced step ran.
    Running {
        /// A paced step ran this pass.
        progressed: bool,
    },
    /// A request is staged for the scheduler.
    Ready,
    /// Nothing to do (empty, or blocked on a fence with a wake-up registered).
    Idle,
    /// The queue is closed.
    Dead,
}

/// One queue's part of a pass: steps its paced command, retries its parked access, or stages
/// its next ready request, or gives up a fence wait that held the queue longer than its
/// guest's policy allows (`fence_wait_ms`). `wake_at` gets the time a paced step's bytes
/// will be there, or the time a held queue's wait runs out.
fn visit(
    svm: &Arc<SvmManager>,
    slot: &DeviceSlot,
    session: &Arc<Session>,
    q: &GuestQueue,
    st: &mut QueueState,
    policy: &Policy,
    wake_at: &mut Option<Instant>,
) -> Turn {
    match st.later.take() {
        // A paced command runs a step when its guest's share has the bytes, else waits
        // without holding the worker: the other queues are served meanwhile.
        Some(Later::Paced(p)) => {
            let progressed = match step_paced(svm, slot, session, p) {
                None => true,
                Some((p, None)) => {
                    st.later = Some(Later::Paced(p));
                    true
                }
                Some((p, Some(at))) => {
                    *wake_at = Some(wake_at.map_or(at, |w| w.min(at)));
                    st.later = Some(Later::Paced(p));
                    false
                }
            };
            return Turn::Running { progressed };
        }
        Some(Later::Parked(p)) => {
            if !p.ticket.is_done() {
                st.later = Some(Later::Parked(p));
                return Turn::Running { progressed: false };
            }
            if let Some(again) = execute(svm, slot, session, p.req, p.reply, Some(p.at), policy) {
                st.hold(slot, again);
            }
            return Turn::Progressed;
        }
        None => {}
    }
    // A command still running on the device (an asynchronous GPU submission) holds its
    // queue: the guest's next request sees its result, and nobody waits for it.
    if st.busy.load(Ordering::Acquire) {
        return Turn::Running { progressed: false };
    }
    if st.staged.is_some() {
        return Turn::Ready;
    }
    match q.try_pop_ready() {
        TryPop::Ready(req, token) => {
            st.held = None;
            st.staged = Some((req, token));
            Turn::Ready
        }
        TryPop::Blocked(f) => {
            let now = Instant::now();
            let since = match st.held {
                Some((h, t)) if h == f => t,
                _ => st.held.insert((f, now)).1,
            };
            let limit = since + policy.for_guest(session.name()).fence_wait();
            if now >= limit {
                st.held = None;
                if q.abandon_wait(f) {
                    log::warn!(
                        "guest {} ({}): a {} queue waited {:?} on fence {f:?}, which was not \
                         signaled; the wait is given up and the work behind it runs",
                        session.guest_id().0,
                        session.name(),
                        slot.device.name(),
                        now.saturating_duration_since(since),
                    );
                    session.note_abandoned_wait();
                }
                return Turn::Progressed;
            }
            *wake_at = Some(wake_at.map_or(limit, |w| w.min(limit)));
            if st.armed != Some(f) {
                st.armed = Some(f);
                let wake = slot.waker();
                if session.fences().on_signal(f, Box::new(wake)).is_err() {
                    return Turn::Progressed; // stale or cancelled: look again
                }
            }
            Turn::Idle
        }
        TryPop::Empty => Turn::Idle,
        TryPop::Closed => Turn::Dead,
    }
}

/// The key of a queue in the worker's state: its address, stable while the queue lives.
fn key_of(q: &GuestQueue) -> usize {
    Arc::as_ptr(q) as usize
}

/// The device worker: each pass takes the next ready request of every queue (at most one
/// staged per queue), asks the scheduler which guest goes next, and runs that one request,
/// each queue in order. A queue held by a fence wait, by a begin_access parked on a copy, or by
/// a command still running on the device has nothing ready; the fence's signal, the copy's
/// completion or the command's reply wakes the worker, and so does the time a rate control
/// postponed every ready guest to. A paced command ([`Device::paced`]) holds its queue too:
/// each pass runs its next step if its guest's bandwidth share has the bytes, and otherwise
/// the worker serves the others and wakes (at the latest) when the share will have them.
pub(super) fn serve(svm: Arc<SvmManager>, slot: Arc<DeviceSlot>, mut arbiter: Arbiter) {
    let mut states: HashMap<usize, QueueState> = HashMap::new();
    loop {
        let seen = slot.events.current();
        if slot.stop.load(Ordering::SeqCst) {
            return;
        }
        let queues: Vec<_> = slot.queues.lock_or_recover().clone();
        let mut progressed = false;
        let mut dead = Vec::new();
        let mut ready: Vec<usize> = Vec::new();
        let mut running: Vec<GuestId> = Vec::new();
        let policy = arbiter.policy().current();
        // The earliest time a paced command's next step has its bytes of its guest's share.
        let mut wake_at: Option<Instant> = None;
        for (i, (session, q)) in queues.iter().enumerate() {
            let key = key_of(q);
            if session.is_closed() {
                dead.push(key);
                continue;
            }
            let st = states.entry(key).or_default();
            match visit(&svm, &slot, session, q, st, &policy, &mut wake_at) {
                Turn::Progressed => progressed = true,
                Turn::Running { progressed: p } => {
                    running.push(session.guest_id());
                    progressed |= p;
                }
                Turn::Ready => ready.push(i),
                Turn::Idle => {}
                Turn::Dead => dead.push(key),
            }
        }
        let mut deadline = None;
        if !ready.is_empty() {
            let guests: Vec<(GuestId, &str)> = ready
                .iter()
                .map(|i| (queues[*i].0.guest_id(), queues[*i].0.name()))
                .collect();
            match arbiter.pick(&slot.acct, &guests, &running) {
                Pick::Serve(g) => {
                    if let Some(&i) = ready.iter().find(|i| queues[**i].0.guest_id() == g) {
                        let (session, q) = &queues[i];
                        let st = states.entry(key_of(q)).or_default();
                        if let Some((req, token)) = st.staged.take() {
                            let reply = start(&slot, &st.busy, session, req, token);
                            if let Some(p) =
                                execute(&svm, &slot, session, req, reply, None, &policy)
                            {
                                st.hold(&slot, p);
                            }
                            progressed = true;
                        }
                    }
                }
                Pick::Until(t) => deadline = Some(t),
                Pick::Wait => {}
            }
        }
        if !dead.is_empty() {
            drop_dead(&slot, &mut arbiter, &mut states, &dead);
        }
        // Nothing of a guest may outlive its session here: the worker sleeps holding no
        // session (and with it no window) of any guest; a departed guest's queue, parked
        // request and flags went above.
        drop(queues);
        drop(policy);
        if !progressed {
            sleep(&slot, seen, deadline, wake_at);
        }
    }
}

/// Removes the closed queues `dead` from the device, their guests from the scheduler and
/// their state from the worker's.
fn drop_dead(
    slot: &DeviceSlot,
    arbiter: &mut Arbiter,
    states: &mut HashMap<usize, QueueState>,
    dead: &[usize],
) {
    let mut qs = slot.queues.lock_or_recover();
    let gone: Vec<GuestId> = qs
        .iter()
        .filter(|(_, q)| dead.contains(&key_of(q)))
        .map(|(s, _)| s.guest_id())
        .collect();
    qs.retain(|(_, q)| !dead.contains(&key_of(q)));
    drop(qs);
    for g in gone {
        arbiter.forget(&slot.acct, g);
    }
    for k in dead {
        states.remove(k);
    }
}

/// Sleeps until an event past `seen`, or the earlier of the scheduler's `deadline` (device
/// clock) and the time a paced step's bytes are there (`wake_at`).
fn sleep(slot: &DeviceSlot, seen: u64, deadline: Option<u64>, wake_at: Option<Instant>) {
    let limit =
        deadline.map(|t| std::time::Duration::from_nanos(t.saturating_sub(slot.acct.now()).max(1)));
    let pace_limit = wake_at.map(|t| {
        t.saturating_duration_since(Instant::now())
            .max(std::time::Duration::from_nanos(1))
    });
    let limit = match (limit, pace_limit) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    slot.events.wait_past_for(seen, limit);
}
