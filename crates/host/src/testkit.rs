//! Fakes for unit tests of the core guest->host path: no daemon process, no sockets, no
//! worker threads.
//!
//! - [`MemLink`]: a [`HostLink`] over in-memory queues: the test feeds requests (with their
//!   payloads) and reads back the completions the session posted.
//! - [`FakeBell`]: a [`Doorbell`] that counts its rings and never sleeps (a wait that would
//!   sleep is a test bug and panics instead of hanging).
//! - [`window`]: a small memfd window with the real layout, for [`ShmLink`](crate::link::ShmLink)
//!   and the SVM manager.
//! - [`Core`]: an SVM manager with a producer and a consumer domain, one attached guest and
//!   its session over a [`MemLink`], and idle devices (their queues are served by the test,
//!   one step at a time, see `device::tests`).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use virtsoc_svm::GuestId;

use virtsoc_proto::ring::Doorbell;
use virtsoc_proto::{Completion, DeviceId, Opcode, Request, SharedWindow, Status, WindowLayout};
use virtsoc_svm::{DomainId, ProtocolKind, SvmManager, Topology};

use crate::device::testdev::{Consumer, Producer};
use crate::device::{Device, DeviceSet};
use crate::link::{HostLink, Incoming, LinkError};
use crate::session::Session;
use crate::Limits;

/// A memfd window of 1 MiB with 8-entry rings.
pub fn window() -> Arc<SharedWindow> {
    let l = WindowLayout::new(1 << 20, 8, 8).expect("layout");
    Arc::new(SharedWindow::create_memfd("testkit", l).expect("memfd window"))
}

/// A doorbell that counts and never sleeps; clones share their counts.
#[derive(Debug, Default, Clone)]
pub struct FakeBell(Arc<[AtomicU32; 2]>);

impl FakeBell {
    /// Calls of `notify` so far.
    pub fn notified(&self) -> u32 {
        self.0[0].load(Ordering::SeqCst)
    }

    /// Calls of `force_wake` so far.
    pub fn forced(&self) -> u32 {
        self.0[1].load(Ordering::SeqCst)
    }
}

impl Doorbell for FakeBell {
    fn notify(&self) {
        self.0[0].fetch_add(1, Ordering::SeqCst);
    }

    fn force_wake(&self) {
        self.0[1].fetch_add(1, Ordering::SeqCst);
    }

    fn wait(&self, ready: &mut dyn FnMut() -> bool, _timeout: Option<Duration>) -> bool {
        assert!(
            ready(),
            "FakeBell: the caller would sleep with nothing to wake it"
        );
        true
    }
}

/// A host link over in-memory queues.
#[derive(Debug, Default)]
pub struct MemLink {
    incoming: Mutex<VecDeque<Incoming>>,
    posted: Mutex<Vec<(Completion, Vec<u8>)>>,
    closed: AtomicBool,
    /// Whether CPU bytes travel in the link (a remote guest).
    pub bulk: bool,
    /// Refuse posts (a guest whose completion ring is broken).
    pub refuse_posts: AtomicBool,
}

impl MemLink {
    /// Queues a request for `next`.
    pub fn feed(&self, req: Request, payload: Vec<u8>) {
        self.incoming.lock().unwrap().push_back(Incoming {
            req,
            payload,
            charge: None,
            placed: false,
        });
    }

    /// The completions posted so far, taken.
    pub fn take_posted(&self) -> Vec<(Completion, Vec<u8>)> {
        std::mem::take(&mut *self.posted.lock().unwrap())
    }

    /// Whether `close` was called.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }
}

impl HostLink for MemLink {
    fn next(&self) -> Result<Option<Incoming>, LinkError> {
        if self.is_closed() {
            return Ok(None);
        }
        Ok(self.incoming.lock().unwrap().pop_front())
    }

    fn post(&self, c: Completion, payload: Vec<u8>) -> Result<(), LinkError> {
        if self.refuse_posts.load(Ordering::SeqCst) {
            return Err(LinkError::Violation("completion ring broken".into()));
        }
        self.posted.lock().unwrap().push((c, payload));
        Ok(())
    }

    fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
    }

    fn carries_bulk(&self) -> bool {
        self.bulk
    }
}

/// The guest id every [`Core`] attaches.
pub const GUEST: GuestId = GuestId(7);

/// One guest's session over a [`MemLink`], an SVM manager and idle devices.
pub struct Core {
    pub svm: Arc<SvmManager>,
    pub devices: Arc<DeviceSet>,
    pub link: Arc<MemLink>,
    pub session: Arc<Session>,
    pub window: Arc<SharedWindow>,
    next_seq: u64,
}

impl Core {
    /// A guest with the default limits, its CPU accesses through a shared window.
    pub fn new() -> Self {
        Self::with(Limits::default(), false)
    }

    /// A guest within `limits`; `remote`: CPU bytes travel in the link.
    pub fn with(limits: Limits, remote: bool) -> Self {
        Self::with_protocol(limits, remote, ProtocolKind::WriteInvalidate)
    }

    /// A guest within `limits` whose regions follow coherence protocol `protocol`.
    pub fn with_protocol(limits: Limits, remote: bool, protocol: ProtocolKind) -> Self {
        let mut topo = Topology::new();
        let prod = topo.add_device_domain("producer");
        let cons = topo.add_device_domain("consumer");
        let svm = Arc::new(SvmManager::new(topo));
        let window = window();
        svm.attach_guest(GUEST, window.clone(), svm.protocol(protocol), 64 << 20)
            .expect("attach");
        let devices: Vec<(DeviceId, DomainId, Arc<dyn Device>)> = vec![
            (DeviceId::PRODUCER, prod, Arc::new(Producer)),
            (
                DeviceId::CONSUMER,
                cons,
                Arc::new(Consumer::new("consumer")),
            ),
        ];
        let devices = Arc::new(DeviceSet::idle(devices));
        let link = Arc::new(MemLink {
            bulk: remote,
            ..MemLink::default()
        });
        let session = Session::new(
            GUEST,
            "testkit".into(),
            window.clone(),
            link.clone(),
            &limits,
        );
        Core {
            svm,
            devices,
            link,
            session,
            window,
            next_seq: 1,
        }
    }

    /// Dispatches one request with `payload` and returns what was posted for it at once
    /// (`None` when it went to a device queue).
    pub fn send_with(
        &mut self,
        op: u32,
        device: u32,
        args: [u64; 6],
        payload: Vec<u8>,
    ) -> Option<(Completion, Vec<u8>)> {
        let seq = self.next_seq;
        self.next_seq += 1;
        let req = Request {
            seq,
            opcode: op,
            device,
            args,
        };
        self.session.dispatch(
            Incoming {
                req,
                payload,
                charge: None,
                placed: false,
            },
            &self.svm,
            &self.devices,
        );
        let mut posted = self.link.take_posted();
        assert!(posted.len() <= 1, "one request, one completion: {posted:?}");
        let got = posted.pop();
        if let Some((c, _)) = &got {
            assert_eq!(c.seq, seq, "the completion names the request");
        }
        got
    }

    /// Dispatches `op` on `device`: `Ok(values)` or `Err(status)` when it completed at once.
    /// Panics when the request went to a device queue.
    pub fn call(
        &mut self,
        op: Opcode,
        device: DeviceId,
        args: [u64; 6],
    ) -> Result<[u64; 6], Status> {
        self.call_raw(op as u32, device.0, args)
    }

    /// [`call`](Self::call) with raw opcode and device numbers.
    pub fn call_raw(&mut self, op: u32, device: u32, args: [u64; 6]) -> Result<[u64; 6], Status> {
        let (c, _) = self
            .send_with(op, device, args, Vec::new())
            .expect("completed at once");
        result_of(&c)
    }

    /// The sequence number of the last request sent.
    pub fn last_seq(&self) -> u64 {
        self.next_seq - 1
    }

    /// Allocates a blob of `size` bytes; its id.
    pub fn blob(&mut self, size: u64) -> u64 {
        self.call(Opcode::Alloc, DeviceId::CPU, [size, 0, 0, 0, 0, 0])
            .expect("alloc")[0]
    }
}

impl Default for Core {
    fn default() -> Self {
        Self::new()
    }
}

/// A completion as a result.
pub fn result_of(c: &Completion) -> Result<[u64; 6], Status> {
    match Status::from_u32(c.status) {
        Some(Status::Ok) => Ok(c.values),
        Some(s) => Err(s),
        None => panic!("completion with unknown status {}", c.status),
    }
}
