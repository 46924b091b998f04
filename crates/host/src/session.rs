//! One guest's session: its window, its rings and doorbells, and the thread that takes its
//! requests off the submission ring.
//!
//! Requests that need no device run on the session thread; device requests go to the device's
//! queue and complete from the device worker. The host never posts more completions than the
//! completion ring can hold: a request is taken off the submission ring only when a completion
//! slot is free for it, so a guest that stops reading completions stalls only itself.

use std::collections::HashMap;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use virtsoc_proto::layout::{ctl, CONTROL_OFFSET};
use virtsoc_proto::ring::{host_rings, Doorbell, FutexDoorbell, RingConsumer, RingProducer};
use virtsoc_proto::{Completion, DeviceId, Opcode, Request, SharedWindow, Status};
use virtsoc_svm::SvmManager;

use virtsoc_fence::queue::{OrderedQueue, QueueItem};
use virtsoc_fence::table::{FenceId, FenceStatus, VirtualFenceTable};

use crate::device::{DeviceSet, DeviceSlot, GuestQueue};
use crate::dispatch;
use crate::fences::WindowFencePage;

/// A connected guest.
pub struct Session {
    guest_id: u64,
    name: String,
    window: Arc<SharedWindow>,
    sock: UnixStream,
    closed: AtomicBool,
    cq: Mutex<RingProducer<Completion>>,
    popped: AtomicU64,
    posted: AtomicU64,
    host_bell: FutexDoorbell,
    guest_bell: FutexDoorbell,
    fences: Arc<VirtualFenceTable>,
    queues: Mutex<HashMap<u32, (GuestQueue, Arc<DeviceSlot>)>>,
}

impl Session {
    /// A session over an already mapped window.
    pub fn new(
        guest_id: u64,
        name: String,
        window: Arc<SharedWindow>,
        sock: UnixStream,
        spins: u32,
    ) -> (Arc<Self>, RingConsumer<Request>) {
        let (sq, cq) = host_rings(&window);
        let s = Arc::new(Session {
            guest_id,
            name,
            host_bell: FutexDoorbell::host_bell(&window, spins),
            guest_bell: FutexDoorbell::guest_bell(&window, spins),
            fences: Arc::new(VirtualFenceTable::new(Arc::new(WindowFencePage::new(
                window.clone(),
            )))),
            queues: Mutex::new(HashMap::new()),
            window,
            sock,
            closed: AtomicBool::new(false),
            cq: Mutex::new(cq),
            popped: AtomicU64::new(0),
            posted: AtomicU64::new(0),
        });
        (s, sq)
    }

    /// The guest's id.
    pub fn guest_id(&self) -> u64 {
        self.guest_id
    }

    /// The guest's name from the handshake.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The guest's virtual fence table.
    pub fn fences(&self) -> &Arc<VirtualFenceTable> {
        &self.fences
    }

    /// Whether the session has ended.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Ends the session: wakes the session thread, tells the guest, hangs up.
    pub fn close(&self) {
        if self.closed.swap(true, Ordering::SeqCst) {
            return;
        }
        if let Ok(w) = self.window.atomic_u32(CONTROL_OFFSET + ctl::HOST_STATE) {
            w.store(1, Ordering::SeqCst);
        }
        self.host_bell.force_wake();
        self.guest_bell.force_wake();
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
        self.fences.cancel_all();
        let queues: Vec<_> = self
            .queues
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain()
            .map(|(_, v)| v)
            .collect();
        for (q, slot) in queues {
            q.close();
            slot.kick();
        }
    }

    /// Posts a completion for a request taken earlier.
    pub fn complete(&self, mut c: Completion) {
        if self.is_closed() {
            return;
        }
        let mut cq = self.cq.lock().unwrap_or_else(|p| p.into_inner());
        let in_flight = self.popped.load(Ordering::SeqCst) - self.posted.load(Ordering::SeqCst);
        c.queue_depth = in_flight.saturating_sub(1).min(u32::MAX as u64) as u32;
        match cq.push(c) {
            Ok(true) => {
                self.posted.fetch_add(1, Ordering::SeqCst);
                drop(cq);
                self.guest_bell.notify();
            }
            Ok(false) | Err(_) => {
                drop(cq);
                log::warn!(
                    "guest {} ({}): completion ring corrupted by the guest; closing",
                    self.guest_id,
                    self.name
                );
                self.close();
            }
        }
    }

    /// Whether one more request may be taken (a completion slot is free for it).
    fn can_take(&self) -> Result<bool, ()> {
        let cq = self.cq.lock().unwrap_or_else(|p| p.into_inner());
        let space = cq.space().map_err(|_| ())? as u64;
        let in_flight = self.popped.load(Ordering::SeqCst) - self.posted.load(Ordering::SeqCst);
        Ok(in_flight < space)
    }

    /// The session thread: takes requests until the session closes, then releases everything
    /// the guest held.
    pub fn run(
        self: Arc<Self>,
        mut sq: RingConsumer<Request>,
        svm: Arc<SvmManager>,
        devices: Arc<DeviceSet>,
    ) {
        loop {
            let mut ready = || {
                self.is_closed()
                    || match (sq.available(), self.can_take()) {
                        (Ok(n), Ok(ok)) => n > 0 && ok,
                        _ => true,
                    }
            };
            self.host_bell.wait(&mut ready, None);
            if self.is_closed() {
                break;
            }
            let req = match (self.can_take(), sq.pop()) {
                (Ok(true), Ok(Some(r))) => r,
                (Ok(false), Ok(_)) | (Ok(true), Ok(None)) => continue,
                _ => {
                    log::warn!(
                        "guest {} ({}): submission ring corrupted by the guest; closing",
                        self.guest_id,
                        self.name
                    );
                    self.close();
                    break;
                }
            };
            self.popped.fetch_add(1, Ordering::SeqCst);
            self.dispatch(req, &svm, &devices);
        }
        let freed = svm.detach_guest(self.guest_id);
        log::info!(
            "guest {} ({}) gone: released {freed} regions",
            self.guest_id,
            self.name
        );
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
            let mut qs = self.queues.lock().unwrap_or_else(|p| p.into_inner());
            qs.entry(dev)
                .or_insert_with(|| {
                    let q = Arc::new(OrderedQueue::new(self.fences.clone()));
                    slot.attach(self.clone(), q.clone());
                    (q, slot.clone())
                })
                .0
                .clone()
        };
        q.push(item).map_err(|_| Status::Closed)?;
        slot.kick();
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

    fn fence_op(
        self: &Arc<Self>,
        op: Opcode,
        req: &Request,
        devices: &DeviceSet,
    ) -> dispatch::Outcome {
        let cpu = req.device == DeviceId::CPU.0;
        match op {
            Opcode::FenceCreate => {
                let f = self.fences.create().map_err(|_| Status::Closed)?;
                Ok([f.to_u64(), 0, 0, 0, 0, 0])
            }
            Opcode::FenceSignal => {
                let f = self.fence_arg(req.args[0])?;
                if cpu {
                    // CPU requests run in order on this thread: everything before is done.
                    self.fences.signal(f).map_err(|_| Status::BadArgument)?;
                } else {
                    self.queue_on(devices, req.device, QueueItem::Signal(f))?;
                }
                Ok([0; 6])
            }
            Opcode::FenceWait => {
                let f = self.fence_arg(req.args[0])?;
                if cpu {
                    // Waiting is for device queues; the guest reads the fence page instead.
                    return Err(Status::BadArgument);
                }
                self.queue_on(devices, req.device, QueueItem::Wait(f))?;
                Ok([0; 6])
            }
            Opcode::FenceRelease => {
                let f = self.fence_arg(req.args[0])?;
                self.fences.release(f).map_err(|_| Status::BadArgument)?;
                Ok([0; 6])
            }
            Opcode::FenceStatus => {
                let f = FenceId::from_u64(req.args[0]);
                match self.fences.status(f) {
                    Ok(FenceStatus::Signaled) => Ok([1, 0, 0, 0, 0, 0]),
                    Ok(FenceStatus::Pending) => Ok([0; 6]),
                    Err(_) => Err(Status::BadArgument),
                }
            }
            _ => Err(Status::Internal),
        }
    }

    fn dispatch(self: &Arc<Self>, req: Request, svm: &SvmManager, devices: &DeviceSet) {
        let op = Opcode::from_u32(req.opcode);
        let outcome = match op {
            Some(Opcode::BeginAccess | Opcode::EndAccess | Opcode::DeviceCmd)
                if req.device != DeviceId::CPU.0 =>
            {
                // Completed by the device worker.
                if let Err(s) = self.queue_on(devices, req.device, QueueItem::Cmd(req)) {
                    self.complete(Completion::err(req.seq, s));
                }
                return;
            }
            Some(
                op @ (Opcode::FenceCreate
                | Opcode::FenceSignal
                | Opcode::FenceWait
                | Opcode::FenceRelease
                | Opcode::FenceStatus),
            ) => self.fence_op(op, &req, devices),
            _ => dispatch::inline(svm, self.guest_id, &req),
        };
        self.complete(match outcome {
            Ok(v) => Completion::ok(req.seq, v),
            Err(s) => Completion::err(req.seq, s),
        });
    }
}
