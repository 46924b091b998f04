//! Virtual devices: the trait every device implements, and the worker that runs a device's
//! queue.
//!
//! A device owns a memory domain (its local memory) and executes the requests addressed to it
//! on its own thread: begin_access / end_access of regions it touches, and its own commands.
//! Each guest has its own ordered queue on each device it uses (so a fence wait holds back only
//! that guest's work on that device); the worker serves the queues and posts each completion to
//! the guest that sent the request. Queues of a guest that has gone away are dropped
//! unexecuted. Which ready queue goes next is the device's scheduler's choice ([`share`]: round
//! robin by default, or weighted fair queueing, AvA's rate controls and the multimedia feedback
//! scheduler on the device time measured per guest), within the policy's allow-lists and rate
//! caps; a rate control may postpone every ready guest, and the worker then sleeps until the
//! time it names (or an event).
//!
//! The worker never blocks on one guest's behalf:
//! - a begin_access whose bytes are still being copied in (a prefetch in flight) is *parked*:
//!   that guest's queue waits, the worker serves the others, and the copy's completion wakes
//!   it to retry;
//! - a device command may finish *later* (an asynchronous GPU submission): it hands back a
//!   [`Reply`] that posts the completion when the work is done;
//! - a command that moves many bytes (a fill or copy of at least
//!   [`STREAM_MIN`](virtsoc_svm::stream::STREAM_MIN) bytes, [`Device::paced`]) runs in
//!   [`PACE_CHUNK`](virtsoc_svm::pace::PACE_CHUNK) steps, each taking its bytes from the
//!   guest's bandwidth share first ([`virtsoc_svm::pace`], `Limits::bandwidth`): between two
//!   steps the worker serves the other guests, and when the share is spent that guest's
//!   queue waits (a timed wait of the worker, woken early by any other event) while the
//!   others go on;
//! - a fence `Signal` queued after a command fires only once that command is really done: the
//!   queue's [`DoneToken`] travels with the [`Reply`], and with the prefetch copies a writer's
//!   end_access started when its guest does not block for them (fence ordering), so a reader
//!   waiting on the fence never finds its bytes still in flight.

pub mod camera;
pub mod codec;
mod ctx;
pub mod display;
pub mod feedback;
pub mod gpu;
pub mod isp;
pub(crate) mod layers;
pub mod modem;
pub mod registry;
pub mod share;
pub mod testdev;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use std::time::Instant;

use virtsoc_fence::queue::{DoneToken, OrderedQueue, TryPop};
use virtsoc_fence::table::FenceId;
use virtsoc_proto::{Completion, DeviceId, Opcode, Request, Status};
use virtsoc_svm::{AccessSpec, CopyTicket, DomainId, GuestId, Progress, RegionId, SvmManager};
use virtsoc_sync::LockExt;

use crate::dispatch;
use crate::session::Session;
use crate::sync::EventCount;
use share::{permitted, start, Accounting, Arbiter, Sharing};
use virtsoc_sched::policy::Policy;
use virtsoc_sched::Pick;

pub use ctx::{DeviceCtx, DeviceResult};

/// The answer to one request, to be given once: posts the completion to the guest, then
/// reports the request done to its queue (which may fire fence signals queued after it).
/// Dropping it unanswered answers `Internal`.
pub struct Reply {
    session: Arc<Session>,
    seq: u64,
    token: Option<DoneToken>,
    /// Run once the answer is given (the worker's queue becomes ready again).
    on_sent: Option<Box<dyn FnOnce() + Send>>,
}

impl Reply {
    /// Answers with `result`.
    pub fn send(mut self, result: DeviceResult) {
        self.post(result, None);
    }

    /// Answers with `result`, and a failure with `reason` if there is one.
    pub fn send_because(mut self, result: DeviceResult, reason: Option<String>) {
        self.post(result, reason);
    }

    fn post(&mut self, result: DeviceResult, reason: Option<String>) {
        if let Some(token) = self.token.take() {
            self.session.complete(match (result, reason) {
                (Ok(values), _) => Completion::ok(self.seq, values),
                (Err(status), Some(r)) => Completion::err_with_reason(self.seq, status, &r),
                (Err(status), None) => Completion::err(self.seq, status),
            });
            token.done();
        }
        if let Some(f) = self.on_sent.take() {
            f();
        }
    }
}

impl Drop for Reply {
    fn drop(&mut self) {
        self.post(Err(Status::Internal), None);
    }
}

/// A virtual device. Its command set is declared in `virtsoc-devapi`; the worker has already
/// checked the opcode and that every region argument names a region of the calling guest.
pub trait Device: Send + Sync {
    /// Short name for logs and listings.
    fn name(&self) -> &str;
    /// Backend description for listings (e.g. "libavcodec 59 (h264, hevc)").
    fn backend(&self) -> String;
    /// The memory domain the device works in: devices naming the same domain are one
    /// physical device's memory (the ISP's GPU backend and the display share the GPU's), so
    /// nothing is copied between them. By default the device's own.
    fn memory_domain(&self) -> &str {
        self.name()
    }
    /// Whether the device reads host memory directly (a display controller scans out of
    /// system RAM): its read accesses are then served in place from a host-memory replica
    /// holding the current contents, with no copy into its own domain
    /// ([`AccessSpec::reads_host`]). By default no.
    fn reads_host_memory(&self) -> bool {
        false
    }
    /// Threads outside the device workers that run the device's work on the CPU (an
    /// emulated GPU's driver threads), for CPU weighting. By default none.
    fn cpu_threads(&self) -> Vec<u32> {
        Vec::new()
    }
    /// Memory of the device's own kind for the replicas of its domain (a GPU's textures),
    /// if its replicas do not live in host memory.
    fn allocator(&self) -> Option<Arc<dyn virtsoc_svm::DeviceAllocator>> {
        None
    }
    /// Runs one device command (`args[0]` is the device opcode).
    fn execute(&self, cx: &DeviceCtx<'_>, args: &[u64; 6]) -> DeviceResult;
    /// Runs one device command and answers through `reply`, at once or once the work is done
    /// (a device with asynchronous work overrides this; the default runs
    /// [`execute`](Self::execute)).
    fn execute_async(&self, cx: &DeviceCtx<'_>, args: &[u64; 6], reply: Reply) {
        let result = self.execute(cx, args);
        reply.send_because(result, cx.take_reason());
    }
    /// A command that moves many bytes for the guest (a fill or copy of at least
    /// [`virtsoc_svm::stream::STREAM_MIN`] bytes), to be run a chunk at a time paced to the
    /// guest's bandwidth share ([`virtsoc_svm::pace`]): the worker runs its steps as the
    /// share allows and serves other guests between them. `None` (the default, and for a
    /// command whose arguments are wrong: `execute` answers those) runs the command whole.
    fn paced(&self, _cx: &DeviceCtx<'_>, _args: &[u64; 6]) -> Option<Box<dyn PacedOp>> {
        None
    }
    /// A guest went away: drop every object it held on this device.
    fn guest_gone(&self, _guest: GuestId) {}
    /// A display's latest frame presented by `guest` newer than frame `after`, waiting up to
    /// `wait` for one on the caller's thread (the live view's and recordings' source). Only
    /// a display has frames.
    fn latest_frame(
        &self,
        _guest: GuestId,
        _after: u64,
        _wait: std::time::Duration,
    ) -> Option<virtsoc_display::PresentedFrame> {
        None
    }
    /// Snapshots: a record of the commands that created and configured `guest`'s objects on
    /// this device (JSON), or `None` when it holds none worth keeping.
    fn export_guest(&self, _guest: GuestId) -> Option<serde_json::Value> {
        None
    }
    /// Snapshots: recreates `guest`'s objects from a record of
    /// [`export_guest`](Self::export_guest) (untrusted input: validate it).
    fn import_guest(&self, _guest: GuestId, _record: &serde_json::Value) -> Result<(), String> {
        Ok(())
    }
    /// Runs host control operation `op` (from the control API) with JSON `args`. Called from
    /// the control server's threads: it must take only short locks. By default no operation
    /// is supported.
    fn control(
        &self,
        op: &str,
        _args: &serde_json::Value,
    ) -> Result<serde_json::Value, virtsoc_control::ControlError> {
        Err(virtsoc_control::ControlError::Unsupported(format!(
            "{} control operation {op:?}",
            self.name()
        )))
    }
}

/// A device command run in steps, each moving at most
/// [`PACE_CHUNK`](virtsoc_svm::pace::PACE_CHUNK) bytes ([`Device::paced`]).
pub trait PacedOp: Send {
    /// Bytes the next step moves.
    fn next_bytes(&self) -> u64;
    /// Runs the next step: the command's answer once it is done.
    fn step(&mut self, cx: &DeviceCtx<'_>) -> Option<DeviceResult>;
}

/// Checks a device command against the device's declaration: the opcode exists and every
/// region argument names a region of the guest.
pub fn validate(id: DeviceId, cx: &DeviceCtx<'_>, args: &[u64; 6]) -> Result<(), Status> {
    let Some(decl) = virtsoc_devapi::device(id) else {
        return Ok(()); // a device without a declaration validates itself
    };
    let cmd = decl
        .commands
        .iter()
        .find(|c| c.op == args[0])
        .ok_or(Status::UnknownOpcode)?;
    for (i, a) in cmd.args.iter().enumerate() {
        if a.kind.starts_with("region") {
            cx.meta(args[1 + i])?;
        }
    }
    Ok(())
}

/// One guest's queue on one device.
pub type GuestQueue = Arc<OrderedQueue<Request>>;

/// A registered device with its queues (one per guest) and its worker thread.
pub struct DeviceSlot {
    /// The device's id, as guests name it in requests.
    pub id: DeviceId,
    /// The memory domain the device's replicas live in.
    pub domain: DomainId,
    /// The device itself.
    pub device: Arc<dyn Device>,
    queues: Mutex<Vec<(Arc<Session>, GuestQueue)>>,
    events: Arc<EventCount>,
    stop: AtomicBool,
    worker: Mutex<Option<JoinHandle<()>>>,
    /// Device time per guest and the scheduler.
    acct: Arc<Accounting>,
}

impl DeviceSlot {
    /// Commands queued on this device, all guests together.
    pub fn depth(&self) -> usize {
        self.queues
            .lock()
            .map(|q| q.iter().map(|(_, q)| q.len()).sum())
            .unwrap_or(0)
    }

    /// Registers a guest's queue on this device.
    pub fn attach(&self, session: Arc<Session>, queue: GuestQueue) {
        self.queues.lock_or_recover().push((session, queue));
        self.events.notify();
    }

    /// Tells the worker that a queue changed (a push, a close).
    pub fn kick(&self) {
        self.events.notify();
    }

    /// A callback that wakes this device's worker (for fence signals).
    pub fn waker(&self) -> impl Fn() + Send + Sync + 'static {
        let ev = self.events.clone();
        move || ev.notify()
    }
}

/// Every device of the daemon.
pub struct DeviceSet {
    slots: Vec<Arc<DeviceSlot>>,
    /// The multimedia feedback loop (`--scheduler feedback`).
    feedback: Mutex<Option<feedback::FeedbackLoop>>,
}

impl DeviceSet {
    /// Starts a worker for each `(id, domain, device)`, round robin and no policy.
    pub fn start(
        svm: Arc<SvmManager>,
        devices: Vec<(DeviceId, DomainId, Arc<dyn Device>)>,
    ) -> Self {
        Self::start_shared(svm, devices, Sharing::default())
    }

    /// Starts a worker for each `(id, domain, device)`, shared as `sharing` says.
    pub fn start_shared(
        svm: Arc<SvmManager>,
        devices: Vec<(DeviceId, DomainId, Arc<dyn Device>)>,
        sharing: Sharing,
    ) -> Self {
        let slots = devices
            .into_iter()
            .map(|(id, domain, device)| {
                let slot = Arc::new(DeviceSlot {
                    id,
                    domain,
                    device: device.clone(),
                    queues: Mutex::new(Vec::new()),
                    events: Arc::new(EventCount::default()),
                    stop: AtomicBool::new(false),
                    worker: Mutex::new(None),
                    acct: Arc::new(Accounting::new(sharing.scheduler)),
                });
                let (svm, s) = (svm.clone(), slot.clone());
                let arbiter = Arbiter::new(sharing.clone());
                let handle = std::thread::Builder::new()
                    .name(format!("dev-{}", device.name()))
                    .spawn(move || worker(svm, s, arbiter))
                    .expect("spawn device worker");
                *slot.worker.lock_or_recover() = Some(handle);
                slot
            })
            .collect::<Vec<_>>();
        let feedback = if sharing.scheduler == virtsoc_sched::Kind::Feedback {
            feedback::FeedbackLoop::start(
                slots.clone(),
                sharing.policy.clone(),
                sharing.cgroups.clone(),
            )
            .map_err(|e| log::error!("feedback loop not started: {e}"))
            .ok()
        } else {
            None
        };
        DeviceSet {
            slots,
            feedback: Mutex::new(feedback),
        }
    }

    /// The devices without their workers: a test serves the queues itself, one step at a
    /// time.
    #[cfg(test)]
    pub(crate) fn idle(devices: Vec<(DeviceId, DomainId, Arc<dyn Device>)>) -> Self {
        let slots = devices
            .into_iter()
            .map(|(id, domain, device)| {
                Arc::new(DeviceSlot {
                    id,
                    domain,
                    device,
                    queues: Mutex::new(Vec::new()),
                    events: Arc::new(EventCount::default()),
                    stop: AtomicBool::new(false),
                    worker: Mutex::new(None),
                    acct: Arc::new(Accounting::new(virtsoc_sched::Kind::default())),
                })
            })
            .collect();
        DeviceSet {
            slots,
            feedback: Mutex::new(None),
        }
    }

    /// The device with id `id`, if any (never the CPU).
    pub fn get(&self, id: DeviceId) -> Option<&Arc<DeviceSlot>> {
        self.slots.iter().find(|s| s.id == id)
    }

    /// All devices.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<DeviceSlot>> {
        self.slots.iter()
    }

    /// Names of the devices whose worker still lists a queue of `session`.
    pub fn holders(&self, session: &Arc<Session>) -> Vec<String> {
        self.slots
            .iter()
            .filter(|s| {
                s.queues
                    .lock_or_recover()
                    .iter()
                    .any(|(x, _)| Arc::ptr_eq(x, session))
            })
            .map(|s| s.device.name().to_string())
            .collect()
    }

    /// Stops every worker after its current command.
    pub fn stop(&self) {
        if let Some(mut f) = self.feedback.lock_or_recover().take() {
            f.stop();
        }
        for s in &self.slots {
            s.stop.store(true, Ordering::SeqCst);
            s.events.notify();
        }
        for s in &self.slots {
            if let Some(h) = s.worker.lock_or_recover().take() {
                let _ = h.join();
            }
        }
    }
}

/// A begin_access waiting for a copy into the device's memory.
struct Parked {
    req: Request,
    reply: Reply,
    ticket: Arc<CopyTicket>,
}

/// A paced command between its steps ([`Device::paced`]), and since when its next step has
/// been waiting for its bytes of the guest's share.
struct PacedRun {
    op: Box<dyn PacedOp>,
    reply: Reply,
    waiting: Option<Instant>,
}

/// What `execute` left for later.
enum Later {
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

/// The region and access of a begin_access or end_access request (decoded by the core
/// requests' declaration, [`virtsoc_proto::ops`]); `UnknownOpcode` for any other request.
pub fn access_spec(req: &Request, domain: DomainId) -> Result<(RegionId, AccessSpec), Status> {
    let a = virtsoc_proto::ops::CoreRequest::decode(req.opcode, &req.args)?
        .access()
        .ok_or(Status::UnknownOpcode)?;
    let spec = AccessSpec::new(req.device, domain, a.offset, a.len, a.mode)
        .compensating(a.flags & virtsoc_proto::wire::ACCESS_COMPENSATES != 0);
    Ok((RegionId(a.id), spec))
}

/// Runs one request on the device. A begin_access that must wait for a copy comes back
/// parked; a command the device paces ([`Device::paced`]) comes back to be run in steps.
fn execute(
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
        Some(Opcode::BeginAccess) => {
            let (id, spec) = match access_spec(&req, slot.domain) {
                Ok((id, spec)) => (id, spec.reading_host(slot.device.reads_host_memory())),
                Err(st) => {
                    reply.send(Err(st));
                    return None;
                }
            };
            match svm.begin_access_step(guest, id, &spec, retry) {
                Ok(Progress::Done(r)) => reply.send(Ok(dispatch::access_values(&r))),
                Ok(Progress::Wait(ticket)) => {
                    return Some(Later::Parked(Parked { req, reply, ticket }))
                }
                Err(e) => reply.send(Err(dispatch::status_of(&e))),
            }
        }
        Some(Opcode::EndAccess) => {
            let (id, spec) = match access_spec(&req, slot.domain) {
                Ok((id, spec)) => (id, spec.reading_host(slot.device.reads_host_memory())),
                Err(st) => {
                    reply.send(Err(st));
                    return None;
                }
            };
            match svm.end_access(guest, id, &spec) {
                Ok(end) => {
                    let mut reply = reply;
                    let values = dispatch::access_values(&end.report);
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
                Err(e) => reply.send(Err(dispatch::status_of(&e))),
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
fn worker(svm: Arc<SvmManager>, slot: Arc<DeviceSlot>, mut arbiter: Arbiter) {
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

#[cfg(test)]
mod tests;
