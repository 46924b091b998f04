//! One guest's session: its window, its rings and doorbells, and the thread that takes its
//! requests off the submission ring.
//!
//! Requests that need no device run on the session thread; device requests go to the device's
//! queue and complete from the device worker. The host never posts more completions than the
//! completion ring can hold: a request is taken off the submission ring only when a completion
//! slot is free for it, so a guest that stops reading completions stalls only itself.

use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use virtsoc_proto::layout::{ctl, CONTROL_OFFSET};
use virtsoc_proto::ring::{host_rings, Doorbell, FutexDoorbell, RingConsumer, RingProducer};
use virtsoc_proto::{Completion, DeviceId, Opcode, Request, SharedWindow, Status};
use virtsoc_svm::SvmManager;

use crate::device::DeviceSet;
use crate::dispatch;

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

    fn dispatch(self: &Arc<Self>, req: Request, svm: &SvmManager, devices: &DeviceSet) {
        let device_op = matches!(
            Opcode::from_u32(req.opcode),
            Some(Opcode::BeginAccess | Opcode::EndAccess | Opcode::DeviceCmd)
        );
        if device_op && req.device != DeviceId::CPU.0 {
            match devices.get(DeviceId(req.device)) {
                Some(slot) => slot.submit(self.clone(), req),
                None => self.complete(Completion::err(req.seq, Status::UnknownDevice)),
            }
            return;
        }
        let c = match dispatch::inline(svm, self.guest_id, &req) {
            Ok(v) => Completion::ok(req.seq, v),
            Err(s) => Completion::err(req.seq, s),
        };
        self.complete(c);
    }
}
