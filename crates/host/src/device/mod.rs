//! Virtual devices: the trait every device implements, and the worker that runs a device's
//! queue.
//!
//! A device owns a memory domain (its local memory) and executes the requests addressed to it
//! in order on its own thread: begin_access / end_access of regions it touches, and its own
//! commands. Requests from all guests share the device's queue; each completion goes back to
//! the guest that sent it. Jobs of a guest that has gone away are dropped unexecuted.

pub mod testdev;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use virtsoc_proto::{Completion, DeviceId, Request, Status};
use virtsoc_svm::{DomainId, SvmManager};

use crate::dispatch;
use crate::session::Session;

/// What a device command returns: result values, or a status for the guest.
pub type DeviceResult = std::result::Result<[u64; 6], Status>;

/// Context of one device command.
pub struct DeviceCtx<'a> {
    /// The guest that sent the command.
    pub guest: u64,
    /// The SVM manager, to reach region replicas.
    pub svm: &'a SvmManager,
    /// The device's own memory domain.
    pub domain: DomainId,
}

/// A virtual device.
pub trait Device: Send + Sync {
    /// Short name for logs and listings.
    fn name(&self) -> &str;
    /// Backend description for listings.
    fn backend(&self) -> &str;
    /// Runs one device command (`args[0]` is the device opcode).
    fn execute(&self, cx: &DeviceCtx<'_>, args: &[u64; 6]) -> DeviceResult;
}

struct Job {
    session: Arc<Session>,
    req: Request,
}

struct Queue {
    jobs: Mutex<VecDeque<Job>>,
    ready: Condvar,
    stop: AtomicBool,
}

/// A registered device with its queue and worker thread.
pub struct DeviceSlot {
    pub id: DeviceId,
    pub domain: DomainId,
    pub device: Arc<dyn Device>,
    queue: Arc<Queue>,
    worker: Mutex<Option<JoinHandle<()>>>,
}

impl DeviceSlot {
    /// Queue depth right now.
    pub fn depth(&self) -> usize {
        self.queue.jobs.lock().map(|q| q.len()).unwrap_or(0)
    }

    /// Queues a request from `session`.
    pub fn submit(&self, session: Arc<Session>, req: Request) {
        let mut q = self.queue.jobs.lock().unwrap_or_else(|p| p.into_inner());
        q.push_back(Job { session, req });
        self.queue.ready.notify_one();
    }
}

/// Every device of the daemon.
pub struct DeviceSet {
    slots: Vec<Arc<DeviceSlot>>,
}

impl DeviceSet {
    /// Starts a worker for each `(id, domain, device)`.
    pub fn start(
        svm: Arc<SvmManager>,
        devices: Vec<(DeviceId, DomainId, Arc<dyn Device>)>,
    ) -> Self {
        let slots = devices
            .into_iter()
            .map(|(id, domain, device)| {
                let queue = Arc::new(Queue {
                    jobs: Mutex::new(VecDeque::new()),
                    ready: Condvar::new(),
                    stop: AtomicBool::new(false),
                });
                let slot = Arc::new(DeviceSlot {
                    id,
                    domain,
                    device: device.clone(),
                    queue: queue.clone(),
                    worker: Mutex::new(None),
                });
                let svm = svm.clone();
                let name = format!("dev-{}", device.name());
                let handle = std::thread::Builder::new()
                    .name(name)
                    .spawn(move || worker(svm, id, domain, device, queue))
                    .expect("spawn device worker");
                *slot.worker.lock().unwrap_or_else(|p| p.into_inner()) = Some(handle);
                slot
            })
            .collect();
        DeviceSet { slots }
    }

    /// The device with id `id`, if any (never the CPU).
    pub fn get(&self, id: DeviceId) -> Option<&Arc<DeviceSlot>> {
        self.slots.iter().find(|s| s.id == id)
    }

    /// All devices.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<DeviceSlot>> {
        self.slots.iter()
    }

    /// Stops every worker after its current job.
    pub fn stop(&self) {
        for s in &self.slots {
            s.queue.stop.store(true, Ordering::SeqCst);
            let _g = s.queue.jobs.lock();
            s.queue.ready.notify_all();
        }
        for s in &self.slots {
            if let Some(h) = s.worker.lock().unwrap_or_else(|p| p.into_inner()).take() {
                let _ = h.join();
            }
        }
    }
}

fn worker(
    svm: Arc<SvmManager>,
    id: DeviceId,
    domain: DomainId,
    device: Arc<dyn Device>,
    queue: Arc<Queue>,
) {
    loop {
        let job = {
            let mut q = queue.jobs.lock().unwrap_or_else(|p| p.into_inner());
            loop {
                if queue.stop.load(Ordering::SeqCst) {
                    return;
                }
                if let Some(j) = q.pop_front() {
                    break j;
                }
                q = queue.ready.wait(q).unwrap_or_else(|p| p.into_inner());
            }
        };
        if job.session.is_closed() {
            continue;
        }
        let guest = job.session.guest_id();
        let completion =
            match dispatch::access_or_command(&svm, guest, id, domain, &job.req, |args| {
                device.execute(
                    &DeviceCtx {
                        guest,
                        svm: &svm,
                        domain,
                    },
                    args,
                )
            }) {
                Ok(values) => Completion::ok(job.req.seq, values),
                Err(status) => Completion::err(job.req.seq, status),
            };
        job.session.complete(completion);
    }
}
