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

/// A begin_access waiting for a copy into the device's memory.
pub(super) struct Parked {
    req: Request,
    reply: Reply,
    ticket: Arc<CopyTicket>,
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
    let cx = DeviceCtx::new(session.guest_id(), svm, slot.domain, session.fences())
        .reading_host(slot.device.reads_host_memory());
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
    region: RegionId,
}

fn hold_until_copied(
    svm: &Arc<SvmManager>,
    guest: GuestId,
    region: RegionId,
    tickets: Vec<Arc<CopyTicket>>,
    token: DoneToken,
) {
    let hold = Arc::new(Mutex::new(Hold {
        token: Some(token),
        left: tickets.len(),
        since: Instant::now(),
        svm: svm.clone(),
        guest,
        region,
    }));
    for t in tickets {
        let hold = hold.clone();
        t.on_done(Box::new(move || {
            let mut h = hold.lock_or_recover();
            h.left = h.left.saturating_sub(1);
            if h.left == 0 {
                if let Some(token) = h.token.take() {
                    token.done();
                    h.svm.note_hold(h.guest, h.region, h.since.elapsed());
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
    retry: bool,
    policy: &Policy,
) -> Option<Later> {
    let guest = session.guest_id();
    if !retry && !permitted(slot, policy, session.name(), &req) {
        slot.acct.denied(guest.0);
        reply.send(Err(Status::PermissionDenied));
        return None;
    }
    match Opcode::from_u32(req.opcode) {
        Some(op @ (Opcode::BeginAccess | Opcode::EndAccess)) => {
            let (id, spec) = match access_spec(&req, slot.domain) {
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
                        return Some(Later::Parked(Parked { req, reply, ticket }))
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
                                hold_until_copied(svm, guest, id, end.started, token);
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
            let cx = DeviceCtx::new(guest, svm, slot.domain, session.fences())
                .reading_host(slot.device.reads_host_memory());
            if let Err(st) = validate(slot.id, &cx, &req.args) {
                reply.send(Err(st));
                return None;
            }
            if let Some(op) = slot.device.paced(&cx, &req.args) {
                return Some(Later::Paced(PacedRun {
                    op,
                    reply,
                    waiting: None,
                }));
            }
            slot.device.execute_async(&cx, &req.args, reply);
        }
        _ => reply.send(Err(Status::UnknownOpcode)),
    }
    None
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
    // Fence each blocked queue has a wake-up registered for (keyed by queue address).
    let mut armed: HashMap<usize, FenceId> = HashMap::new();
    // The parked begin_access of each queue that has one.
    let mut parked: HashMap<usize, Parked> = HashMap::new();
    // The paced command of each queue that has one, between its steps.
    let mut paced: HashMap<usize, PacedRun> = HashMap::new();
    // Queues whose last request is still being answered (set until its reply is sent).
    let mut busy: HashMap<usize, Arc<AtomicBool>> = HashMap::new();
    // The next request of each queue, taken off it and waiting for the scheduler's turn.
    let mut staged: HashMap<usize, (Request, DoneToken)> = HashMap::new();
    loop {
        let seen = slot.events.current();
        if slot.stop.load(Ordering::SeqCst) {
            return;
        }
        let queues: Vec<_> = slot.queues.lock_or_recover().clone();
        let mut progressed = false;
        let mut dead = Vec::new();
        let mut ready: Vec<usize> = Vec::new();
        let mut running: Vec<u64> = Vec::new();
        let policy = arbiter.policy().current();
        // The earliest time a paced command's next step has its bytes of its guest's share.
        let mut pace_wake: Option<Instant> = None;
        for (i, (session, q)) in queues.iter().enumerate() {
            let key = Arc::as_ptr(q) as usize;
            if session.is_closed() {
                dead.push(key);
                continue;
            }
            // A paced command runs a step when its guest's share has the bytes, else waits
            // without holding the worker: the other queues are served meanwhile.
            if let Some(p) = paced.remove(&key) {
                running.push(session.guest_id().0);
                match step_paced(&svm, &slot, session, p) {
                    None => progressed = true,
                    Some((p, None)) => {
                        paced.insert(key, p);
                        progressed = true;
                    }
                    Some((p, Some(at))) => {
                        pace_wake = Some(pace_wake.map_or(at, |w| w.min(at)));
                        paced.insert(key, p);
                    }
                }
                continue;
            }
            if let Some(p) = parked.remove(&key) {
                if !p.ticket.is_done() {
                    parked.insert(key, p);
                    running.push(session.guest_id().0);
                    continue;
                }
                if let Some(again) = execute(&svm, &slot, session, p.req, p.reply, true, &policy) {
                    hold(&slot, (&mut parked, &mut paced), key, again);
                }
                progressed = true;
                continue;
            }
            // A command still running on the device (an asynchronous GPU submission) holds
            // its queue: the guest's next request sees its result, and nobody waits for it.
            if busy.get(&key).is_some_and(|b| b.load(Ordering::Acquire)) {
                running.push(session.guest_id().0);
                continue;
            }
            if staged.contains_key(&key) {
                ready.push(i);
                continue;
            }
            match q.try_pop_ready() {
                TryPop::Ready(req, token) => {
                    staged.insert(key, (req, token));
                    ready.push(i);
                }
                TryPop::Blocked(f) => {
                    if armed.get(&key) != Some(&f) {
                        armed.insert(key, f);
                        let wake = slot.waker();
                        if session.fences().on_signal(f, Box::new(wake)).is_err() {
                            progressed = true; // stale or cancelled: look again
                        }
                    }
                }
                TryPop::Empty => {}
                TryPop::Closed => dead.push(key),
            }
        }
        let mut deadline = None;
        if !ready.is_empty() {
            let guests: Vec<(u64, &str)> = ready
                .iter()
                .map(|i| (queues[*i].0.guest_id().0, queues[*i].0.name()))
                .collect();
            match arbiter.pick(&slot.acct, &guests, &running) {
                Pick::Serve(g) => {
                    if let Some(&i) = ready.iter().find(|i| queues[**i].0.guest_id().0 == g) {
                        let (session, q) = &queues[i];
                        let key = Arc::as_ptr(q) as usize;
                        if let Some((req, token)) = staged.remove(&key) {
                            let reply = start(&slot, &mut busy, key, session, req, token);
                            if let Some(p) =
                                execute(&svm, &slot, session, req, reply, false, &policy)
                            {
                                hold(&slot, (&mut parked, &mut paced), key, p);
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
            let mut qs = slot.queues.lock_or_recover();
            let gone: Vec<u64> = qs
                .iter()
                .filter(|(_, q)| dead.contains(&(Arc::as_ptr(q) as usize)))
                .map(|(s, _)| s.guest_id().0)
                .collect();
            qs.retain(|(_, q)| !dead.contains(&(Arc::as_ptr(q) as usize)));
            drop(qs);
            for g in gone {
                arbiter.forget(&slot.acct, g);
            }
            for k in dead {
                armed.remove(&k);
                parked.remove(&k);
                paced.remove(&k);
                busy.remove(&k);
                staged.remove(&k);
            }
        }
        // Nothing of a guest may outlive its session here: the worker sleeps holding no
        // session (and with it no window) of any guest; a departed guest's queue, parked
        // request and flags went above.
        drop(queues);
        drop(policy);
        if !progressed {
            let limit = deadline
                .map(|t| std::time::Duration::from_nanos(t.saturating_sub(slot.acct.now()).max(1)));
            let pace_limit = pace_wake.map(|t| {
                t.saturating_duration_since(Instant::now())
                    .max(std::time::Duration::from_nanos(1))
            });
            let limit = match (limit, pace_limit) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            slot.events.wait_past_for(seen, limit);
        }
    }
}

/// Keeps what `execute` left for later for queue `key`: parks a begin_access, or keeps a
/// paced command for its steps.
fn hold(
    slot: &DeviceSlot,
    (parked, paced): (&mut HashMap<usize, Parked>, &mut HashMap<usize, PacedRun>),
    key: usize,
    later: Later,
) {
    match later {
        Later::Parked(p) => park(slot, parked, key, p),
        Later::Paced(p) => {
            paced.insert(key, p);
        }
    }
}

/// Parks `p` for queue `key` and arranges for the copy's completion to wake the worker.
fn park(slot: &DeviceSlot, parked: &mut HashMap<usize, Parked>, key: usize, p: Parked) {
    let wake = slot.waker();
    p.ticket.on_done(Box::new(wake));
    parked.insert(key, p);
}
