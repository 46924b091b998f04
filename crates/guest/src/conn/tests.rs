//! The completion reaper on a fake link: completions reach their waiters whatever their
//! order, detached requests are booked without a waiter, and completions nobody asked for
//! are dropped. No daemon, no sockets, no threads.

use std::collections::VecDeque;

use super::*;
use crate::link::Arrived;

/// A link the test feeds: requests pushed are recorded, each `reap` hands out the next batch
/// the test queued. A reap with nothing queued would wait forever here: it panics instead.
#[derive(Default)]
struct FakeLink {
    pushed: Mutex<Vec<Request>>,
    batches: Mutex<VecDeque<Vec<Arrived>>>,
    closed: AtomicBool,
    full: AtomicBool,
}

impl FakeLink {
    fn arrive(&self, batch: Vec<Completion>) {
        self.batches
            .lock()
            .push_back(batch.into_iter().map(|c| (c, Vec::new())).collect());
    }

    fn arrive_with(&self, batch: Vec<Arrived>) {
        self.batches.lock().push_back(batch);
    }
}

impl GuestLink for Arc<FakeLink> {
    fn push(&self, req: &Request, _payload: &[u8]) -> Result<bool> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(GuestError::Closed);
        }
        if self.full.load(Ordering::SeqCst) {
            return Ok(false);
        }
        self.pushed.lock().push(*req);
        Ok(true)
    }

    fn reap(&self, _timeout: Duration) -> Result<Vec<Arrived>> {
        if let Some(b) = self.batches.lock().pop_front() {
            return Ok(b);
        }
        if self.closed.load(Ordering::SeqCst) {
            return Err(GuestError::Closed);
        }
        panic!("FakeLink: reaping with nothing to arrive would wait forever");
    }

    fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
    }

    fn shares_window(&self) -> bool {
        true
    }
}

fn connection() -> (Connection, Arc<FakeLink>) {
    let link = Arc::new(FakeLink::default());
    let window = Arc::new(
        SharedWindow::create_memfd("conn-test", WindowLayout::new(1 << 20, 8, 8).unwrap()).unwrap(),
    );
    let c = Connection::with_link(
        Box::new(link.clone()),
        window,
        3,
        "write-invalidate".into(),
        Vec::new(),
    )
    .unwrap();
    (c, link)
}

fn ok(seq: u64, v: u64) -> Completion {
    Completion::ok(seq, [v; 6])
}

#[test]
fn completions_reach_their_waiters_in_any_order() {
    let (c, link) = connection();
    let seqs: Vec<u64> = (0..3)
        .map(|_| c.submit(Opcode::Nop, DeviceId::CPU, [0; 6]).unwrap())
        .collect();
    assert_eq!(link.pushed.lock().len(), 3);
    assert_eq!(c.in_flight(), 3);
    // One batch, out of order: the first wait reaps all three.
    link.arrive(vec![ok(seqs[2], 30), ok(seqs[0], 10), ok(seqs[1], 20)]);
    assert_eq!(c.wait(seqs[1]).unwrap().values, [20; 6]);
    assert_eq!(c.in_flight(), 0, "all three booked");
    // The others were kept for their waiters (no reap: FakeLink would panic).
    assert_eq!(c.wait(seqs[2]).unwrap().values, [30; 6]);
    assert_eq!(c.wait(seqs[0]).unwrap().values, [10; 6]);
}

#[test]
fn a_completion_for_no_request_is_dropped() {
    let (c, link) = connection();
    let seq = c.submit(Opcode::Nop, DeviceId::CPU, [0; 6]).unwrap();
    // Never used, and a duplicate of one completed already.
    link.arrive(vec![ok(seq + 1000, 1), ok(seq, 2)]);
    assert_eq!(c.wait(seq).unwrap().values, [2; 6]);
    link.arrive(vec![ok(seq, 3)]);
    c.reap_once(None).unwrap();
    assert_eq!(c.in_flight(), 0, "unknown completions are not counted");
    let r = c.reaped.lock();
    assert!(
        r.done.is_empty(),
        "nothing kept for nobody: {:?}",
        r.done.keys()
    );
    assert!(r.outstanding.is_empty());
}

/// A request nobody waits for (detached) is booked when it completes: a failure is kept for
/// `take_async_errors`, a success is forgotten; a waiter that never came does not hold up
/// anyone else.
#[test]
fn completions_without_a_waiter() {
    let (c, link) = connection();
    let quiet = c
        .submit_detached(Opcode::FenceSignal, DeviceId::CPU, [0; 6])
        .unwrap();
    let failing = c
        .submit_detached(Opcode::FenceRelease, DeviceId::CPU, [0; 6])
        .unwrap();
    let abandoned = c.submit(Opcode::Nop, DeviceId::CPU, [0; 6]).unwrap();
    let waited = c.submit(Opcode::Nop, DeviceId::CPU, [0; 6]).unwrap();
    link.arrive(vec![
        ok(quiet, 0),
        Completion::err(failing, Status::BadArgument),
        ok(abandoned, 5),
        ok(waited, 6),
    ]);
    assert_eq!(c.wait(waited).unwrap().values, [6; 6]);
    assert_eq!(c.in_flight(), 0);
    assert_eq!(c.take_async_errors(), vec![(failing, Status::BadArgument)]);
    assert!(c.take_async_errors().is_empty(), "taken once");
    let r = c.reaped.lock();
    assert!(!r.done.contains_key(&quiet) && !r.done.contains_key(&failing));
    assert!(r.detached.is_empty());
    // The abandoned request's completion waits for a late waiter.
    assert_eq!(r.done.get(&abandoned).map(|c| c.values), Some([5; 6]));
}

#[test]
fn a_failed_call_carries_status_and_reason() {
    let (c, link) = connection();
    link.arrive(vec![Completion::err_with_reason(
        1,
        Status::DeviceError,
        "no carrier",
    )]);
    match c.call(Opcode::DeviceCmd, DeviceId(9), [0; 6]) {
        Err(GuestError::Status { op, status, reason }) => {
            assert_eq!((op, status), (Opcode::DeviceCmd, Status::DeviceError));
            assert_eq!(reason.as_deref(), Some("no carrier"));
        }
        other => panic!("{other:?}"),
    }
    // A status the library does not know is an internal error.
    let mut odd = Completion::err(2, Status::Busy);
    odd.status = 4242;
    link.arrive(vec![odd]);
    assert!(matches!(
        c.call(Opcode::Nop, DeviceId::CPU, [0; 6]),
        Err(GuestError::Status {
            status: Status::Internal,
            ..
        })
    ));
}

#[test]
fn queue_depth_feedback_is_kept() {
    let (c, link) = connection();
    let seq = c.submit(Opcode::Nop, DeviceId::CPU, [0; 6]).unwrap();
    let mut done = ok(seq, 0);
    done.queue_depth = 11;
    link.arrive(vec![done]);
    c.wait(seq).unwrap();
    assert_eq!(c.max_queue_depth(), 11);
}

/// A remote CPU read's bytes land in the mirror window at the offset the completion names;
/// bytes aimed outside the window are refused.
#[test]
fn read_bytes_land_in_the_window() {
    let (c, link) = connection();
    let data = c.window().layout().data_offset();
    let seq = c
        .submit(Opcode::BeginAccess, DeviceId::CPU, [0; 6])
        .unwrap();
    link.arrive_with(vec![(ok(seq, data), b"bytes".to_vec())]);
    c.wait(seq).unwrap();
    let mut got = [0u8; 5];
    c.window().copy_out(data, &mut got).unwrap();
    assert_eq!(&got, b"bytes");

    let seq = c
        .submit(Opcode::BeginAccess, DeviceId::CPU, [0; 6])
        .unwrap();
    link.arrive_with(vec![(ok(seq, u64::MAX - 2), b"bytes".to_vec())]);
    assert!(matches!(c.wait(seq), Err(GuestError::Proto(_))));
}

#[test]
fn a_closed_link_fails_waiters_and_submissions() {
    let (c, link) = connection();
    let seq = c.submit(Opcode::Nop, DeviceId::CPU, [0; 6]).unwrap();
    link.closed.store(true, Ordering::SeqCst);
    assert!(matches!(c.wait(seq), Err(GuestError::Closed)));
    assert!(matches!(
        c.submit(Opcode::Nop, DeviceId::CPU, [0; 6]),
        Err(GuestError::Closed)
    ));
}

#[test]
fn a_raw_request_refused_by_a_full_ring_is_not_in_flight() {
    let (c, link) = connection();
    link.full.store(true, Ordering::SeqCst);
    let req = Request::new(77, Opcode::Nop, DeviceId::CPU, [0; 6]);
    assert!(matches!(
        c.submit_raw(req),
        Err(GuestError::Status {
            status: Status::Busy,
            ..
        })
    ));
    assert_eq!(c.in_flight(), 0);
    link.full.store(false, Ordering::SeqCst);
    c.submit_raw(req).unwrap();
    link.arrive(vec![ok(77, 1)]);
    assert_eq!(c.wait(77).unwrap().values, [1; 6]);
    assert_eq!(c.in_flight(), 0);
}

/// `end_access_detached` queues the end without waiting for it (a reap here would panic:
/// nothing has arrived) and without asking for compensation; its failure is kept for
/// `take_async_errors`, and requests queued after it are answered as usual.
#[test]
fn a_detached_end_access_is_queued_without_a_wait() {
    let (c, link) = connection();
    c.end_access_detached(RegionId(7), DeviceId::CPU, 16, 32, AccessMode::Write)
        .unwrap();
    let end = *link.pushed.lock().last().unwrap();
    assert_eq!(end.opcode, Opcode::EndAccess as u32);
    assert_eq!(end.args[..5], [7, 16, 32, AccessMode::Write as u64, 0]);
    let next = c.submit(Opcode::Nop, DeviceId::CPU, [0; 6]).unwrap();
    link.arrive(vec![
        Completion::err(end.seq, Status::BadArgument),
        ok(next, 1),
    ]);
    assert_eq!(c.wait(next).unwrap().values, [1; 6]);
    assert_eq!(c.take_async_errors(), vec![(end.seq, Status::BadArgument)]);
}

/// `write_posted` on a region whose place in the window is known puts the bytes there and
/// queues one posted write (`ACCESS_BEGINS`) without waiting (a reap here would panic);
/// a range outside the region is refused before anything is written or sent.
#[test]
fn a_posted_write_copies_into_the_window_and_queues_one_request() {
    let (c, link) = connection();
    let id = RegionId(5);
    c.regions.lock().insert(
        id,
        RegionInfo {
            id,
            size: 64,
            stride: 0,
            width: 0,
            height: 0,
            format: Format::Blob,
        },
    );
    c.cpu_offsets.lock().insert(id, 4096);
    c.write_posted(id, 8, &[7; 16]).unwrap();
    let req = *link.pushed.lock().last().unwrap();
    assert_eq!(req.opcode, Opcode::EndAccess as u32);
    let begins = virtsoc_proto::wire::ACCESS_BEGINS;
    assert_eq!(req.args[..5], [5, 8, 16, AccessMode::Write as u64, begins]);
    let mut seen = [0u8; 24];
    c.window().copy_out(4096, &mut seen).unwrap();
    assert_eq!(seen[..8], [0; 8]);
    assert_eq!(seen[8..], [7; 16]);
    let pushed = link.pushed.lock().len();
    assert!(c.write_posted(id, 60, &[1; 8]).is_err());
    assert!(c.write_posted(RegionId(6), 0, &[1; 8]).is_err());
    assert_eq!(
        link.pushed.lock().len(),
        pushed,
        "nothing sent for a bad range"
    );
}
