//! One guest's session: its window, its rings and doorbells, and the thread that takes its
//! requests off the submission ring.
//!
//! Requests that need no device run on the session thread; device requests go to the device's
//! queue and complete from the device worker. The host never posts more completions than the
//! completion ring can hold: a request is taken off the submission ring only when a completion
//! slot is free for it, so a guest that stops reading completions stalls only itself.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use virtsoc_svm::pace::Bucket;
use virtsoc_svm::{GuestId, RegionId};

use virtsoc_fence::queue::{OrderedQueue, QueueItem};
use virtsoc_fence::table::{FenceId, FenceStatus, VirtualFenceTable};
use virtsoc_proto::ops::{self, CoreRequest};
use virtsoc_proto::{Completion, DeviceId, Opcode, Request, SharedWindow, Status};
use virtsoc_svm::SvmManager;
use virtsoc_sync::{CondvarExt, LockExt};

use crate::device::{DeviceSet, DeviceSlot, GuestQueue};
use crate::dispatch;
use crate::fences::WindowFencePage;
use crate::link::{HostLink, Incoming};
use crate::Limits;

/// Why a session's device queues did not drain ([`Session::drain_queues`]).
#[derive(Debug, thiserror::Error)]
pub enum DrainError {
    /// No fence could be made to mark the end of a queue.
    #[error("{0}")]
    Fence(#[from] virtsoc_fence::FenceError),
    /// The queues of these devices did not drain in time (a queue waiting on a fence nobody
    /// signals, say).
    #[error("device queues {0:?} did not drain")]
    Stuck(Vec<u32>),
}

/// A connected guest.
pub struct Session {
    guest_id: GuestId,
    name: String,
    window: Arc<SharedWindow>,
    link: Arc<dyn HostLink>,
    closed: AtomicBool,
    /// Closed by a migration that has not committed yet: the guest's regions and device
    /// objects stay when the session thread ends (see [`close_keeping_state`](Self::close_keeping_state)).
    keep_state: AtomicBool,
    fences: Arc<VirtualFenceTable>,
    queues: Mutex<HashMap<u32, (GuestQueue, Arc<DeviceSlot>)>>,
    /// Requests queued on each device (by device id), for the control API.
    commands: Mutex<HashMap<u32, u64>>,
    /// Items the guest may have waiting on one device.
    max_queued: usize,
    /// Quiesce gate (snapshots, migration): (paused, a request is being dispatched).
    gate: Mutex<(bool, bool)>,
    gate_cv: Condvar,
    /// The guest's bandwidth share for large moves its devices make
    /// ([`virtsoc_svm::pace`]), and what pacing held back.
    bandwidth: Mutex<Bandwidth>,
    /// Fence waits of its queues given up after the policy's `fence_wait_ms`.
    abandoned_waits: AtomicU64,
}

/// A guest's bandwidth bucket on the session's clock, and its pacing so far.
struct Bandwidth {
    bucket: Bucket,
    epoch: Instant,
    paced: Paced,
}

/// What pacing to a guest's bandwidth share did to it so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Paced {
    /// Bytes its devices moved in paced chunks.
    pub bytes: u64,
    /// Time its paced moves waited for their bytes of the share, in nanoseconds.
    pub wait_ns: u64,
}

impl Session {
    /// A session over `link`; `window` is the guest's window (shared with the guest, or the
    /// host's copy for remote guests), within `limits` (live fences, items queued per device).
    pub fn new(
        guest_id: GuestId,
        name: String,
        window: Arc<SharedWindow>,
        link: Arc<dyn HostLink>,
        limits: &Limits,
    ) -> Arc<Self> {
        Arc::new(Session {
            guest_id,
            name,
            fences: Arc::new(VirtualFenceTable::with_limit(
                Arc::new(WindowFencePage::new(window.clone())),
                limits.fences,
            )),
            queues: Mutex::new(HashMap::new()),
            commands: Mutex::new(HashMap::new()),
            max_queued: limits.queued_per_device,
            window,
            link,
            closed: AtomicBool::new(false),
            keep_state: AtomicBool::new(false),
            gate: Mutex::new((false, false)),
            gate_cv: Condvar::new(),
            bandwidth: Mutex::new(Bandwidth {
                bucket: Bucket::new(limits.bandwidth),
                epoch: Instant::now(),
                paced: Paced::default(),
            }),
            abandoned_waits: AtomicU64::new(0),
        })
    }

    /// Stops taking requests (quiesce): returns once no request is being dispatched; a
    /// request taken off the link meanwhile waits until [`resume`](Self::resume).
    pub fn pause(&self) {
        let mut g = self.gate.lock_or_recover();
        g.0 = true;
        while g.1 && !self.is_closed() {
            g = self.gate_cv.wait_or_recover(g);
        }
    }

    /// Takes requests again after [`pause`](Self::pause).
    pub fn resume(&self) {
        self.gate.lock_or_recover().0 = false;
        self.gate_cv.notify_all();
    }

    /// Waits until every command the guest queued on a device has completed (a fence
    /// signal queued behind them on each queue fires), at most `timeout`; `Err` names the
    /// devices that did not drain (e.g. a queue waiting on a fence nobody signals).
    pub fn drain_queues(&self, timeout: Duration) -> Result<(), DrainError> {
        let queues: Vec<(u32, GuestQueue, Arc<DeviceSlot>)> = self
            .queues
            .lock_or_recover()
            .iter()
            .map(|(d, (q, s))| (*d, q.clone(), s.clone()))
            .collect();
        let mut marks = Vec::new();
        for (dev, q, slot) in queues {
            let f = self.fences.create()?;
            if q.push(QueueItem::Signal(f)).is_err() {
                let _ = self.fences.signal(f);
            }
            slot.kick();
            marks.push((dev, f));
        }
        let deadline = std::time::Instant::now() + timeout;
        let mut stuck = Vec::new();
        for (dev, f) in marks {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if self.fences.wait(f, Some(left)) != Ok(FenceStatus::Signaled) {
                stuck.push(dev);
            }
            let _ = self.fences.release(f);
        }
        if stuck.is_empty() {
            Ok(())
        } else {
            Err(DrainError::Stuck(stuck))
        }
    }

    /// Whether the guest has not created a fence yet (a restore goes only into such a session).
    pub fn is_fresh(&self) -> bool {
        self.fences.stats().created == 0
    }

    /// The guest's id.
    pub fn guest_id(&self) -> GuestId {
        self.guest_id
    }

    /// The guest's name from the handshake.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Takes `bytes` of the guest's bandwidth share at `now` for one paced chunk: `Err(t)`
    /// when they will be there at `t` (nothing taken). See [`virtsoc_svm::pace`].
    pub fn take_bandwidth(&self, now: Instant, bytes: u64) -> Result<(), Instant> {
        let mut b = self.bandwidth.lock_or_recover();
        let t = now.saturating_duration_since(b.epoch).as_nanos() as u64;
        match b.bucket.take(t, bytes) {
            Ok(()) => {
                b.paced.bytes += bytes;
                Ok(())
            }
            Err(at) => Err(b.epoch + Duration::from_nanos(at)),
        }
    }

    /// Counts `waited` of pacing: a paced chunk waited this long for its bytes of the share.
    pub fn note_paced_wait(&self, waited: Duration) {
        self.bandwidth.lock_or_recover().paced.wait_ns += waited.as_nanos() as u64;
    }

    /// Counts a fence wait of one of the guest's queues given up after its policy's
    /// `fence_wait_ms` (the device worker's).
    pub fn note_abandoned_wait(&self) {
        self.abandoned_waits.fetch_add(1, Ordering::Relaxed);
    }

    /// Fence waits of the guest's queues given up so far.
    pub fn abandoned_waits(&self) -> u64 {
        self.abandoned_waits.load(Ordering::Relaxed)
    }

    /// What pacing did to the guest so far.
    pub fn paced(&self) -> Paced {
        self.bandwidth.lock_or_recover().paced
    }

    /// The guest's virtual fence table.
    pub fn fences(&self) -> &Arc<VirtualFenceTable> {
        &self.fences
    }

    /// Requests the guest queued on each device so far (by device id).
    pub fn commands(&self) -> HashMap<u32, u64> {
        self.commands.lock_or_recover().clone()
    }

    /// Whether the session has ended.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Ends the session: wakes the session thread, tells the guest, hangs up, and stops the
    /// guest's device queues.
    pub fn close(&self) {
        if self.closed.swap(true, Ordering::SeqCst) {
            return;
        }
        self.link.close();
        self.fences.cancel_all();
        // Under the gate's lock, so a thread about to wait at the gate sees the close.
        drop(self.gate.lock_or_recover());
        self.gate_cv.notify_all();
        let queues: Vec<_> = self
            .queues
            .lock_or_recover()
            .drain()
            .map(|(_, v)| v)
            .collect();
        for (q, slot) in queues {
            q.close();
            slot.kick();
        }
    }

    /// Ends the session like [`close`](Self::close) (the guest is hung up) but keeps what the
    /// guest holds (regions, device objects) until [`release`](Self::release): a migration
    /// that has not committed yet may still resume the guest here.
    pub fn close_keeping_state(&self) {
        self.keep_state.store(true, Ordering::SeqCst);
        self.close();
    }

    /// Releases everything the guest held (its device objects and regions).
    pub fn release(&self, svm: &SvmManager, devices: &DeviceSet) {
        for slot in devices.iter() {
            slot.device.guest_gone(self.guest_id);
        }
        let freed = svm.detach_guest(self.guest_id);
        crate::release_free_memory();
        log::info!(
            "guest {} ({}) gone: released {freed} regions",
            self.guest_id,
            self.name
        );
    }

    /// Posts a completion for a request taken earlier.
    pub fn complete(&self, c: Completion) {
        self.complete_with(c, Vec::new());
    }

    fn complete_with(&self, c: Completion, payload: Vec<u8>) {
        if self.is_closed() {
            return;
        }
        if let Err(e) = self.link.post(c, payload) {
            log::warn!("guest {} ({}): {e}; closing", self.guest_id, self.name);
            self.close();
        }
    }

    /// The session loop: takes requests until the session closes, then releases everything
    /// the guest held.
    pub fn run(self: Arc<Self>, svm: Arc<SvmManager>, devices: Arc<DeviceSet>) {
        loop {
            match self.link.next() {
                Ok(Some(inc)) => {
                    if !self.enter() {
                        break;
                    }
                    self.dispatch(inc, &svm, &devices);
                    self.leave();
                }
                Ok(None) => break,
                Err(e) => {
                    log::warn!("guest {} ({}): {e}; closing", self.guest_id, self.name);
                    break;
                }
            }
            if self.is_closed() {
                break;
            }
        }
        self.close();
        if !self.keep_state.load(Ordering::SeqCst) {
            self.release(&svm, &devices);
        }
    }

    /// Waits while the session is paused, then marks a dispatch under way; false once closed.
    fn enter(&self) -> bool {
        let mut g = self.gate.lock_or_recover();
        while g.0 && !self.is_closed() {
            g = self.gate_cv.wait_or_recover(g);
        }
        g.1 = true;
        !self.is_closed()
    }

    /// Marks the dispatch done. Only a [`pause`](Self::pause) waits for that, and it sets
    /// the paused flag under the gate's lock before it waits: with no pause there is no one
    /// to wake (and no wake-up syscall on every request).
    fn leave(&self) {
        let mut g = self.gate.lock_or_recover();
        g.1 = false;
        let paused = g.0;
        drop(g);
        if paused {
            self.gate_cv.notify_all();
        }
    }

    /// A CPU access of a remote guest: its bytes travel with the request (writes) or the
    /// completion (reads) and land in, or come from, the host's copy of its window.
    fn remote_cpu_access(
        &self,
        op: Opcode,
        inc: &Incoming,
        svm: &SvmManager,
    ) -> Result<(Completion, Vec<u8>), Status> {
        let ops::BeginAccess {
            id,
            offset,
            len,
            mode,
            ..
        } = CoreRequest::decode(inc.req.opcode, &inc.req.args)?
            .access()
            .ok_or(Status::UnknownOpcode)?;
        let meta = svm
            .meta(self.guest_id, RegionId(id))
            .map_err(|e| crate::status::status_of(&e))?;
        let end = offset
            .checked_add(len)
            .filter(|e| *e <= meta.size && len > 0);
        end.ok_or(Status::OutOfRange)?;
        if op == Opcode::EndAccess && mode.writes() {
            let at = svm
                .window_offset(self.guest_id, RegionId(id))
                .map_err(|e| crate::status::status_of(&e))?
                .ok_or(Status::BadArgument)?
                + offset;
            if inc.placed {
                // The link read the bytes straight into the window, where
                // `remote_write_target` (these same checks) said they go.
                if remote_write_target(svm, self.guest_id, &inc.req, len) != Some(at) {
                    return Err(Status::Internal);
                }
            } else {
                if inc.payload.len() as u64 != len {
                    return Err(Status::BadArgument);
                }
                self.window
                    .copy_in(at, &inc.payload)
                    .map_err(|_| Status::OutOfRange)?;
            }
        }
        let v = dispatch::inline(svm, self.guest_id, &inc.req)?;
        let whole = offset == 0 && len == meta.size;
        let payload = if op == Opcode::BeginAccess && (mode.reads() || !whole) {
            let mut bytes = vec![0u8; len as usize];
            self.window
                .copy_out(v[0], &mut bytes)
                .map_err(|_| Status::Internal)?;
            bytes
        } else {
            Vec::new()
        };
        Ok((Completion::ok(inc.req.seq, v), payload))
    }

    /// Queues an item on this guest's queue of device `dev`.
    fn queue_on(
        self: &Arc<Self>,
        devices: &DeviceSet,
        dev: u32,
        item: QueueItem<Request>,
    ) -> Result<(), Status> {
        if self.is_closed() {
            return Err(Status::Closed);
        }
        let slot = devices.get(DeviceId(dev)).ok_or(Status::UnknownDevice)?;
        let q = {
            let mut qs = self.queues.lock_or_recover();
            qs.entry(dev)
                .or_insert_with(|| {
                    let q = Arc::new(OrderedQueue::new(self.fences.clone()));
                    slot.attach(self.clone(), q.clone());
                    (q, slot.clone())
                })
                .0
                .clone()
        };
        let is_cmd = matches!(item, QueueItem::Cmd(_));
        // A guest may queue only so much ahead of the device: beyond, it is told to wait.
        q.push_bounded(item, self.max_queued).map_err(|e| match e {
            virtsoc_fence::FenceError::QueueFull(_) => Status::Busy,
            _ => Status::Closed,
        })?;
        slot.kick();
        if is_cmd {
            let mut c = self.commands.lock_or_recover();
            *c.entry(dev).or_insert(0) += 1;
        }
        Ok(())
    }

    /// A fence id named by the guest, checked against its table.
    fn fence_arg(&self, raw: u64) -> Result<FenceId, Status> {
        let f = FenceId::from_u64(raw);
        self.fences
            .status(f)
            .map(|_| f)
            .map_err(|_| Status::BadArgument)
    }

    /// A fence request (the session owns the guest's fence table); `device` is the
    /// request's.
    fn fence_op(
        self: &Arc<Self>,
        req: CoreRequest,
        device: u32,
        devices: &DeviceSet,
    ) -> dispatch::Outcome {
        let cpu = device == DeviceId::CPU.0;
        match req {
            CoreRequest::FenceCreate(_) => {
                let f = self.fences.create().map_err(|e| match e {
                    virtsoc_fence::FenceError::TooMany(_) => Status::OutOfMemory,
                    _ => Status::Closed,
                })?;
                Ok(ops::FenceCreateReply { fence: f.to_u64() }.to_values())
            }
            CoreRequest::FenceSignal(ops::FenceSignal { fence }) => {
                let f = self.fence_arg(fence)?;
                if cpu {
                    // CPU requests run in order on this thread: everything before is done.
                    self.fences.signal(f).map_err(|_| Status::BadArgument)?;
                } else {
                    self.queue_on(devices, device, QueueItem::Signal(f))?;
                }
                Ok(ops::FenceSignalReply {}.to_values())
            }
            CoreRequest::FenceWait(ops::FenceWait { fence }) => {
                let f = self.fence_arg(fence)?;
                if cpu {
                    // Waiting is for device queues; the guest reads the fence page instead.
                    return Err(Status::BadArgument);
                }
                self.queue_on(devices, device, QueueItem::Wait(f))?;
                Ok(ops::FenceWaitReply {}.to_values())
            }
            CoreRequest::FenceRelease(ops::FenceRelease { fence }) => {
                let f = self.fence_arg(fence)?;
                self.fences.release(f).map_err(|_| Status::BadArgument)?;
                Ok(ops::FenceReleaseReply {}.to_values())
            }
            CoreRequest::FenceStatus(ops::FenceStatus { fence }) => {
                let signaled = match self.fences.status(FenceId::from_u64(fence)) {
                    Ok(FenceStatus::Signaled) => 1,
                    Ok(FenceStatus::Pending) => 0,
                    Err(_) => return Err(Status::BadArgument),
                };
                Ok(ops::FenceStatusReply { signaled }.to_values())
            }
            _ => Err(Status::Internal),
        }
    }

    /// Runs or queues one request taken off the link; everything that completes here is
    /// posted before this returns.
    pub(crate) fn dispatch(self: &Arc<Self>, inc: Incoming, svm: &SvmManager, devices: &DeviceSet) {
        let req = inc.req;
        let op = Opcode::from_u32(req.opcode);
        let outcome = match op {
            Some(op @ (Opcode::BeginAccess | Opcode::EndAccess))
                if req.device == DeviceId::CPU.0 && self.link.carries_bulk() =>
            {
                match self.remote_cpu_access(op, &inc, svm) {
                    Ok((c, payload)) => self.complete_with(c, payload),
                    Err(s) => self.complete(Completion::err(req.seq, s)),
                }
                return;
            }
            Some(
                Opcode::BeginAccess
                | Opcode::EndAccess
                | Opcode::DeviceCmd
                | Opcode::DeviceCmdAccess,
            ) if req.device != DeviceId::CPU.0 => {
                // Completed by the device worker.
                if let Err(s) = self.queue_on(devices, req.device, QueueItem::Cmd(req)) {
                    self.complete(Completion::err(req.seq, s));
                }
                return;
            }
            Some(
                Opcode::FenceCreate
                | Opcode::FenceSignal
                | Opcode::FenceWait
                | Opcode::FenceRelease
                | Opcode::FenceStatus,
            ) => CoreRequest::decode(req.opcode, &req.args)
                .and_then(|r| self.fence_op(r, req.device, devices)),
            _ => dispatch::inline(svm, self.guest_id, &req),
        };
        self.complete(match outcome {
            Ok(v) => Completion::ok(req.seq, v),
            Err(s) => Completion::err(req.seq, s),
        });
    }
}

/// Where the bytes of a remote guest's CPU write go in the host's copy of its window: for
/// `req` carrying `len` bytes, the window offset when it is an `end_access` of the CPU that
/// writes exactly `len` (> 0) bytes inside one of the guest's regions, else `None`. The
/// stream link reads such bytes straight there ([`crate::link::StreamLink::placing`]).
pub(crate) fn remote_write_target(
    svm: &SvmManager,
    guest: GuestId,
    req: &Request,
    len: u64,
) -> Option<u64> {
    if req.device != DeviceId::CPU.0 || Opcode::from_u32(req.opcode) != Some(Opcode::EndAccess) {
        return None;
    }
    let a = CoreRequest::decode(req.opcode, &req.args).ok()?.access()?;
    if !a.mode.writes() || a.len != len || len == 0 {
        return None;
    }
    let meta = svm.meta(guest, RegionId(a.id)).ok()?;
    a.offset.checked_add(len).filter(|e| *e <= meta.size)?;
    let base = svm.window_offset(guest, RegionId(a.id)).ok()??;
    base.checked_add(a.offset)
}

#[cfg(test)]
mod tests;
