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

mod access;
pub mod camera;
pub mod codec;
mod ctx;
pub mod display;
pub mod feedback;
pub mod gles;
pub mod gpu;
pub mod isp;
pub(crate) mod layers;
pub mod modem;
pub mod registry;
pub mod share;
pub mod testdev;
mod worker;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use virtsoc_fence::queue::{DoneToken, OrderedQueue, TryPop};
use virtsoc_fence::table::FenceId;
use virtsoc_proto::{Completion, DeviceId, Opcode, Request, Status};
use virtsoc_svm::{CopyTicket, DomainId, GuestId, Progress, RegionId, SvmManager};
use virtsoc_sync::{EventCount, LockExt};

use crate::session::Session;

/// Why a device refused a guest's snapshot record ([`Device::import_guest`]; the record is
/// untrusted: a tampered or foreign saved session).
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// The record does not parse as the device's record.
    #[error("malformed record: {0}")]
    Malformed(#[from] serde_json::Error),
    /// A field is missing, or a value out of range or inconsistent (the text names it).
    #[error("{0}")]
    Invalid(String),
    /// A part of the record does not parse as what it should hold (the text names it).
    #[error("{0}")]
    Part(serde_json::Error),
    /// The services layer refused the record's channels.
    #[error("{0}")]
    Services(#[from] virtsoc_services::ServiceError),
    /// More channels than the guest has room for here.
    #[error("{channels} channels, room for {room}")]
    TooManyChannels {
        /// The record's channels.
        channels: usize,
        /// The channels the guest may still open.
        room: usize,
    },
    /// Recreating one of its objects was refused, as the guest's own command would be.
    #[error("{what}: {}", status.message())]
    Refused {
        /// The object (e.g. `codec session 3`).
        what: String,
        /// The device's answer.
        status: Status,
    },
}
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
    /// Run once the answer is given (the worker's queue becomes ready again), with the
    /// device time the device measured itself ([`Reply::busy_for`]), if it did.
    on_sent: Option<Box<dyn FnOnce(Option<u64>) + Send>>,
    /// The request's device time as the device measured it.
    busy_ns: Option<u64>,
    /// The accesses a command that took them itself ([`Opcode::DeviceCmdAccess`]) ends
    /// before its answer is posted.
    ends: Option<access::Ends>,
}

impl Reply {
    /// Says how long the device was busy with the request, in nanoseconds, as the device
    /// itself measured it (a device running several guests' commands at once, as the
    /// `gles` device's render workers do): the accounting charges this to the guest instead
    /// of the time from dispatch to answer.
    pub fn busy_for(&mut self, ns: u64) {
        self.busy_ns = Some(ns);
    }

    /// Answers with `result`.
    pub fn send(mut self, result: DeviceResult) {
        self.post(result, None);
    }

    /// Answers with `result`, and a failure with `reason` if there is one.
    pub fn send_because(mut self, result: DeviceResult, reason: Option<String>) {
        self.post(result, reason);
    }

    fn post(&mut self, mut result: DeviceResult, mut reason: Option<String>) {
        let copies = match self.ends.take() {
            Some(ends) if self.token.is_some() => ends.end(&mut result, &mut reason),
            _ => None,
        };
        if let Some(token) = self.token.take() {
            self.session.complete(match (result, reason) {
                (Ok(values), _) => Completion::ok(self.seq, values),
                (Err(status), Some(r)) => Completion::err_with_reason(self.seq, status, &r),
                (Err(status), None) => Completion::err(self.seq, status),
            });
            match copies {
                // As after a detached end_access: the queue's next fence signal waits for
                // the prefetch copies the ends started.
                Some((svm, guest, ended)) => worker::hold_until_copied(&svm, guest, ended, token),
                None => token.done(),
            }
        }
        if let Some(f) = self.on_sent.take() {
            f(self.busy_ns);
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
    /// ([`virtsoc_svm::AccessSpec::reads_host`]). By default no.
    fn reads_host_memory(&self) -> bool {
        false
    }
    /// Threads outside the device workers that run the device's work on the CPU (an
    /// emulated GPU's driver threads), for CPU weighting. By default none.
    fn cpu_threads(&self) -> Vec<u32> {
        Vec::new()
    }
    /// The daemon steers guests' CPU weights through `cgroups` (`--cpu-cgroup`): a device
    /// whose work runs in worker processes serving one guest each puts them in that
    /// guest's group ([`crate::cgroup::CpuCgroups::attach_worker`]). By default nothing.
    fn use_cgroups(&self, _cgroups: Arc<crate::cgroup::CpuCgroups>) {}
    /// Whether the host replicas of the device's domain are shared memfds
    /// ([`virtsoc_svm::HostBuf::try_shared`]) that it hands to a process of its own (a
    /// render worker). By default no.
    fn shares_memory(&self) -> bool {
        false
    }
    /// Memory of the device's own kind for the replicas of its domain (a GPU's textures),
    /// if its replicas do not live in host memory.
    fn allocator(&self) -> Option<Arc<dyn virtsoc_svm::DeviceAllocator>> {
        None
    }
    /// Whether a command that waits for a worker process is answered apart from the device's
    /// thread (the codec's waiter and session thread, the ISP's conversion threads), the
    /// thread then free for the next guest's command. The scheduler is then not told of
    /// such commands as running on the device (`Accounting::with_apart`): they run in the
    /// guest's own worker, and WFQ, which keeps one command on a device at a time (an
    /// asynchronous device's queue: the GPU's), held every other guest's commands until
    /// the one waiting apart was about done (until stop 52: a victim's 640x360 decode 12
    /// ms at the median next to a one-thread decoder under `--scheduler wfq`, 0.5 ms
    /// alone). By default no.
    fn answers_apart(&self) -> bool {
        false
    }
    /// How much device time a guest's commands may take in a row once it is served, where
    /// the scheduler has turns ([`virtsoc_sched::Scheduler::set_turn`]): for a device whose
    /// next command is slower after a change of guest. By default none.
    fn turn(&self) -> std::time::Duration {
        std::time::Duration::ZERO
    }
    /// How many of its commands a scheduler that holds commands back (WFQ) lets be on
    /// this device at once ([`virtsoc_sched::Scheduler::set_max_running`]). By default one.
    fn commands_at_once(&self) -> usize {
        1
    }
    /// Runs one device command (`args[0]` is the device opcode).
    fn execute(&self, cx: &DeviceCtx<'_>, args: &[u64; 6]) -> DeviceResult;
    /// Runs one device command and answers through `reply`, at once or once the work is done
    /// (a device with asynchronous work overrides this; the default runs
    /// [`execute`](Self::execute)).
    fn execute_async(&self, cx: &DeviceCtx<'_>, args: &[u64; 6], mut reply: Reply) {
        let result = self.execute(cx, args);
        if let Some(ns) = cx.take_busy() {
            reply.busy_for(ns);
        }
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
    fn import_guest(
        &self,
        _guest: GuestId,
        _record: &serde_json::Value,
    ) -> Result<(), RecordError> {
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
    for (region, _) in cmd.regions(args) {
        cx.meta(region)?;
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
    /// The context a command of `session`'s guest runs in on this device (its domain, the
    /// guest's fences, whether the device reads host memory in place).
    pub(crate) fn ctx<'a>(&self, svm: &'a Arc<SvmManager>, session: &'a Session) -> DeviceCtx<'a> {
        DeviceCtx::new(session.guest_id(), svm, self.domain, session.fences())
            .reading_host(self.device.reads_host_memory())
    }

    /// Commands queued on this device, all guests together.
    pub fn depth(&self) -> usize {
        self.queues
            .lock_or_recover()
            .iter()
            .map(|(_, q)| q.len())
            .sum()
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
                if let Some(cg) = &sharing.cgroups {
                    device.use_cgroups(cg.clone());
                }
                let slot = Arc::new(DeviceSlot {
                    id,
                    domain,
                    device: device.clone(),
                    queues: Mutex::new(Vec::new()),
                    events: Arc::new(EventCount::default()),
                    stop: AtomicBool::new(false),
                    worker: Mutex::new(None),
                    acct: Arc::new(
                        Accounting::new(sharing.scheduler)
                            .with_turn(device.turn())
                            .with_max_running(device.commands_at_once())
                            .with_apart(device.answers_apart()),
                    ),
                });
                let (svm, s) = (svm.clone(), slot.clone());
                let arbiter = Arbiter::new(sharing.clone());
                let handle = std::thread::Builder::new()
                    .name(format!("dev-{}", device.name()))
                    .spawn(move || worker::serve(svm, s, arbiter))
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

#[cfg(test)]
mod tests;
