//! The device side of the core path on fakes: the test plays the worker, one step at a time
//! on its own thread, over idle devices (see `testkit`).

use super::worker::execute;
use super::*;
use crate::testkit::{result_of, Core};
use virtsoc_fence::queue::QueueItem;
use virtsoc_proto::wire::testdev::{CHECKSUM, WRITE_PATTERN};
use virtsoc_proto::AccessMode;

const PRODUCER: DeviceId = DeviceId::PRODUCER;
const CONSUMER: DeviceId = DeviceId::CONSUMER;

/// Runs every ready request of `dev`'s queues, in order, as its worker would (no scheduler,
/// no parking: these protocols never leave a copy in flight). Returns how many ran.
fn serve(core: &Core, dev: DeviceId) -> usize {
    let slot = core.devices.get(dev).expect("device");
    let queues = slot.queues.lock().unwrap().clone();
    let policy = Policy::default();
    let mut ran = 0;
    for (session, q) in queues {
        while let TryPop::Ready(req, token) = q.try_pop_ready() {
            let reply = reply_to(&session, &req, token);
            let parked = execute(&core.svm, slot, &session, req, reply, None, &policy);
            assert!(parked.is_none(), "nothing parks here");
            ran += 1;
        }
    }
    ran
}

/// Queues a request on `dev` and returns its sequence number.
fn queue(core: &mut Core, op: Opcode, dev: DeviceId, args: [u64; 6]) -> u64 {
    assert!(
        core.send_with(op as u32, dev.0, args, vec![]).is_none(),
        "queued"
    );
    core.last_seq()
}

/// Queues a command on `dev` bracketed by a whole-region access of region `id` in `mode`;
/// the three sequence numbers.
fn bracketed(core: &mut Core, dev: DeviceId, id: u64, mode: u64, cmd: [u64; 6]) -> [u64; 3] {
    let len = core
        .svm
        .meta(crate::testkit::GUEST, RegionId(id))
        .unwrap()
        .size;
    [
        queue(core, Opcode::BeginAccess, dev, [id, 0, len, mode, 0, 0]),
        queue(core, Opcode::DeviceCmd, dev, cmd),
        queue(core, Opcode::EndAccess, dev, [id, 0, len, mode, 0, 0]),
    ]
}

/// The completions posted since the last call, by sequence number.
pub(super) fn results(core: &Core) -> Vec<(u64, Result<[u64; 6], Status>)> {
    core.link
        .take_posted()
        .iter()
        .map(|(c, _)| (c.seq, result_of(c)))
        .collect()
}

fn status_of_run(core: &mut Core, op: Opcode, dev: DeviceId, args: [u64; 6]) -> Status {
    let seq = queue(core, op, dev, args);
    assert_eq!(serve(core, dev), 1);
    let r = results(core);
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].0, seq);
    match r[0].1 {
        Ok(_) => Status::Ok,
        Err(s) => s,
    }
}

#[test]
fn each_malformed_device_request_gets_its_status() {
    let mut core = Core::new();
    let id = core.blob(4096);
    let w = AccessMode::Write as u64;
    let cases: &[(&str, Opcode, [u64; 6], Status)] = &[
        (
            "begin: unknown region",
            Opcode::BeginAccess,
            [id + 9, 0, 8, w, 0, 0],
            Status::NoSuchRegion,
        ),
        (
            "begin: past the end",
            Opcode::BeginAccess,
            [id, 4090, 8, w, 0, 0],
            Status::OutOfRange,
        ),
        (
            "begin: empty range",
            Opcode::BeginAccess,
            [id, 0, 0, w, 0, 0],
            Status::OutOfRange,
        ),
        (
            "begin: mode 0",
            Opcode::BeginAccess,
            [id, 0, 8, 0, 0, 0],
            Status::BadArgument,
        ),
        (
            "begin: mode over 32 bits",
            Opcode::BeginAccess,
            [id, 0, 8, 1 << 40, 0, 0],
            Status::BadArgument,
        ),
        (
            "end: unknown region",
            Opcode::EndAccess,
            [id + 9, 0, 8, w, 0, 0],
            Status::NoSuchRegion,
        ),
        (
            "end: offset overflows",
            Opcode::EndAccess,
            [id, u64::MAX, 8, w, 0, 0],
            Status::OutOfRange,
        ),
        (
            "end: mode 7",
            Opcode::EndAccess,
            [id, 0, 8, 7, 0, 0],
            Status::BadArgument,
        ),
        (
            "end: a posted write is the CPU's",
            Opcode::EndAccess,
            [id, 0, 8, w, virtsoc_proto::wire::ACCESS_BEGINS, 0],
            Status::BadArgument,
        ),
        (
            "command: unknown device opcode",
            Opcode::DeviceCmd,
            [77, id, 0, 0, 0, 0],
            Status::UnknownOpcode,
        ),
        (
            "command: unknown region",
            Opcode::DeviceCmd,
            [WRITE_PATTERN, id + 9, 1, 0, 0, 0],
            Status::NoSuchRegion,
        ),
        (
            "command: region not begun",
            Opcode::DeviceCmd,
            [WRITE_PATTERN, id, 1, 0, 0, 0],
            Status::BadArgument,
        ),
    ];
    for (what, op, args, want) in cases {
        assert_eq!(
            status_of_run(&mut core, *op, PRODUCER, *args),
            *want,
            "{what}"
        );
    }
    // The consumer's checksum on the producer: an opcode the producer does not declare.
    assert_eq!(
        status_of_run(
            &mut core,
            Opcode::DeviceCmd,
            PRODUCER,
            [CHECKSUM, id, 0, 0, 0, 0]
        ),
        Status::UnknownOpcode
    );
    assert!(!core.session.is_closed());
}

/// A request the session never queues on a device (an allocation) is refused by the worker.
#[test]
fn a_worker_refuses_what_is_not_a_device_request() {
    let core = Core::new();
    let slot = core.devices.get(PRODUCER).unwrap().clone();
    let q: GuestQueue = Arc::new(OrderedQueue::new(core.session.fences().clone()));
    slot.attach(core.session.clone(), q.clone());
    let req = Request::new(42, Opcode::Alloc, PRODUCER, [64, 0, 0, 0, 0, 0]);
    q.push(QueueItem::Cmd(req)).unwrap();
    assert_eq!(serve(&core, PRODUCER), 1);
    assert_eq!(results(&core), vec![(42, Err(Status::UnknownOpcode))]);
}

/// The reply of request `seq`, taken off a queue of its own as a worker would.
pub(super) fn reply_for(core: &Core, seq: u64) -> Reply {
    let q: GuestQueue = Arc::new(OrderedQueue::new(core.session.fences().clone()));
    let req = Request::new(seq, Opcode::Nop, PRODUCER, [0; 6]);
    q.push(QueueItem::Cmd(req)).unwrap();
    let TryPop::Ready(req, token) = q.try_pop_ready() else {
        panic!("ready");
    };
    reply_to(&core.session, &req, token)
}

/// The reply to `req` of `session`, as a worker makes it (without its accounting).
fn reply_to(session: &Arc<Session>, req: &Request, token: DoneToken) -> Reply {
    Reply {
        session: session.clone(),
        seq: req.seq,
        token: Some(token),
        on_sent: None,
        busy_ns: None,
        ends: None,
    }
}

/// A reply dropped without an answer answers `Internal`, and only once.
#[test]
fn an_unanswered_reply_answers_internal() {
    let core = Core::new();
    let sent = Arc::new(AtomicBool::new(false));
    let s2 = sent.clone();
    let mut reply = reply_for(&core, 5);
    reply.on_sent = Some(Box::new(move |_| s2.store(true, Ordering::SeqCst)));
    drop(reply);
    assert_eq!(results(&core), vec![(5, Err(Status::Internal))]);
    assert!(sent.load(Ordering::SeqCst), "the worker is told");
}

/// A failure a device explains carries its reason to the guest.
#[test]
fn a_reply_carries_the_reason() {
    let core = Core::new();
    reply_for(&core, 6).send_because(Err(Status::DeviceError), Some("no signal".into()));
    let posted = core.link.take_posted();
    assert_eq!(posted.len(), 1);
    assert_eq!(posted[0].0.reason().as_deref(), Some("no signal"));
}

/// A producer writes a pattern, a fence orders the consumer after it, and the consumer reads
/// the same bytes: the whole device path with its coherence copies and fence ordering.
#[test]
fn fences_order_a_consumer_after_a_producer() {
    let mut core = Core::new();
    let id = core.blob(1 << 16);
    let f = core
        .call(Opcode::FenceCreate, DeviceId::CPU, [0; 6])
        .unwrap()[0];
    let (w, r) = (AccessMode::Write as u64, AccessMode::Read as u64);

    // The consumer's work first, held by the fence.
    // Fence instructions are acknowledged at once and queued.
    assert_eq!(
        core.call(Opcode::FenceWait, CONSUMER, [f, 0, 0, 0, 0, 0]),
        Ok([0; 6])
    );
    let consumer = bracketed(&mut core, CONSUMER, id, r, [CHECKSUM, id, 0, 0, 0, 0]);
    assert_eq!(serve(&core, CONSUMER), 0, "held by the fence");
    assert!(results(&core).is_empty());

    let producer = bracketed(&mut core, PRODUCER, id, w, [WRITE_PATTERN, id, 9, 0, 0, 0]);
    assert_eq!(
        core.call(Opcode::FenceSignal, PRODUCER, [f, 0, 0, 0, 0, 0]),
        Ok([0; 6])
    );
    assert_eq!(serve(&core, PRODUCER), 3, "the signal is no command");
    let produced = results(&core);
    let seqs: Vec<u64> = produced.iter().map(|(s, _)| *s).collect();
    assert_eq!(seqs, producer.to_vec(), "in order");
    assert!(produced.iter().all(|(_, r)| r.is_ok()), "{produced:?}");
    let crc = produced[1].1.unwrap()[0];
    assert_eq!(
        core.call(Opcode::FenceStatus, DeviceId::CPU, [f, 0, 0, 0, 0, 0])
            .unwrap()[0],
        1,
        "signaled once the producer's commands were done"
    );

    assert_eq!(serve(&core, CONSUMER), 3);
    let consumed = results(&core);
    let seqs: Vec<u64> = consumed.iter().map(|(s, _)| *s).collect();
    assert_eq!(seqs, consumer.to_vec());
    assert_eq!(
        consumed[1].1.unwrap()[0],
        crc,
        "the consumer read what the producer wrote"
    );
    assert!(
        consumed[0].1.unwrap()[2] >= 1,
        "the consumer's begin copied the bytes"
    );
}

/// Region arguments of a declared command are checked against the caller's regions.
#[test]
fn validate_checks_declared_region_arguments() {
    let core = Core::new();
    let slot = core.devices.get(PRODUCER).unwrap();
    let cx = DeviceCtx::new(
        crate::testkit::GUEST,
        &core.svm,
        slot.domain,
        core.session.fences(),
    );
    assert_eq!(
        validate(PRODUCER, &cx, &[WRITE_PATTERN, 1234, 0, 0, 0, 0]),
        Err(Status::NoSuchRegion)
    );
    assert_eq!(
        validate(PRODUCER, &cx, &[99, 0, 0, 0, 0, 0]),
        Err(Status::UnknownOpcode)
    );
    // A device without a declaration validates itself.
    assert_eq!(validate(DeviceId(200), &cx, &[99, 0, 0, 0, 0, 0]), Ok(()));
}

/// A command that takes its own accesses (`DeviceCmdAccess`) runs as the bracketed command
/// does, and leaves no access behind: the same command without accesses is refused after
/// it. Its region arguments and opcode are checked as a command's.
#[test]
fn a_command_that_takes_its_accesses_begins_and_ends_them() {
    let mut core = Core::new();
    let id = core.blob(4096);
    let (w, r) = (AccessMode::Write as u64, AccessMode::Read as u64);
    let [_, write, _] = bracketed(&mut core, PRODUCER, id, w, [WRITE_PATTERN, id, 7, 0, 0, 0]);
    assert_eq!(serve(&core, PRODUCER), 3);
    let want = results(&core).into_iter().find(|(s, _)| *s == write);
    let want = want.unwrap().1.unwrap()[0];
    let seq = queue(
        &mut core,
        Opcode::DeviceCmdAccess,
        PRODUCER,
        [WRITE_PATTERN, id, 7, 0, 0, 0],
    );
    assert_eq!(serve(&core, PRODUCER), 1, "one request");
    let got = results(&core);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].0, seq);
    assert_eq!(got[0].1.unwrap()[0], want, "the same pattern written");
    // The consumer reads it: one begin and one end each, as the bracketed command's.
    let before = core.svm.stats();
    let sum = queue(
        &mut core,
        Opcode::DeviceCmdAccess,
        CONSUMER,
        [CHECKSUM, id, 0, 0, 0, 0],
    );
    assert_eq!(serve(&core, CONSUMER), 1);
    assert_eq!(results(&core), vec![(sum, Ok([want, 0, 0, 0, 0, 0]))]);
    let after = core.svm.stats();
    assert_eq!(after.begin_accesses - before.begin_accesses, 1);
    assert_eq!(after.end_accesses - before.end_accesses, 1);
    let _ = bracketed(&mut core, CONSUMER, id, r, [CHECKSUM, id, 0, 0, 0, 0]);
    assert_eq!(serve(&core, CONSUMER), 3);
    let again = core.svm.stats();
    assert_eq!(again.begin_accesses - after.begin_accesses, 1);
    assert_eq!(again.end_accesses - after.end_accesses, 1);
    results(&core);
    // A request refused before its command runs begins nothing, or ends what it began.
    for (args, want) in [
        ([WRITE_PATTERN, id + 9, 1, 0, 0, 0], Status::NoSuchRegion),
        ([77, id, 0, 0, 0, 0], Status::UnknownOpcode),
        ([CHECKSUM, id, 0, 0, 0, 0], Status::UnknownOpcode),
    ] {
        let st = status_of_run(&mut core, Opcode::DeviceCmdAccess, PRODUCER, args);
        assert_eq!(st, want, "{args:?}");
    }
    let last = core.svm.stats();
    assert_eq!(last.begin_accesses, again.begin_accesses);
    assert_eq!(last.end_accesses, again.end_accesses);
    assert!(!core.session.is_closed());
}

/// Runs the next request of `dev`'s queue as its worker would, waiting out a copy it parks
/// on (then running it again where it parked); whether it parked.
fn run_parking(core: &Core, dev: DeviceId) -> bool {
    let slot = core.devices.get(dev).unwrap().clone();
    let (session, q) = slot.queues.lock().unwrap()[0].clone();
    let TryPop::Ready(req, token) = q.try_pop_ready() else {
        panic!("ready");
    };
    let reply = reply_to(&session, &req, token);
    let policy = Policy::default();
    match execute(&core.svm, &slot, &session, req, reply, None, &policy) {
        None => false,
        Some(worker::Later::Parked(p)) => {
            assert!(results(core).is_empty(), "not answered while parked");
            p.ticket.wait();
            let again = execute(
                &core.svm,
                &slot,
                &session,
                p.req,
                p.reply,
                Some(p.at),
                &policy,
            );
            assert!(again.is_none(), "ran once resumed");
            true
        }
        Some(_) => panic!("paced"),
    }
}

/// A command whose begin waits for a copy into its device's memory (a prefetch still in
/// flight) parks at that region and resumes there once the copy is done: it runs once, on
/// the copied bytes, without fetching them itself.
#[test]
fn a_command_that_takes_its_accesses_parks_on_a_copy_and_resumes() {
    let prefetch = virtsoc_svm::ProtocolKind::Prefetch;
    let mut core = Core::with_protocol(crate::Limits::default(), false, prefetch);
    let id = core.blob(1 << 20);
    let sum = [CHECKSUM, id, 0, 0, 0, 0];
    let mut crc = 0;
    for seed in 0..4 {
        if seed == 3 {
            // Every copy now waits before it starts: the producer's end starts the
            // consumer's copy, and the consumer's begin finds it in flight.
            core.svm.set_dma_delay(std::time::Duration::from_millis(50));
        }
        queue(
            &mut core,
            Opcode::DeviceCmdAccess,
            PRODUCER,
            [WRITE_PATTERN, id, seed, 0, 0, 0],
        );
        run_parking(&core, PRODUCER);
        crc = results(&core)[0].1.unwrap()[0];
        let fetched = core
            .svm
            .guest_counters(crate::testkit::GUEST)
            .unwrap()
            .sync_fetches;
        let seq = queue(&mut core, Opcode::DeviceCmdAccess, CONSUMER, sum);
        let parked = run_parking(&core, CONSUMER);
        assert_eq!(
            results(&core),
            vec![(seq, Ok([crc, 0, 0, 0, 0, 0]))],
            "{seed}"
        );
        if seed == 3 {
            // The predictor learned who reads what the producer writes.
            assert!(parked, "parked on the copy in flight");
            let now = core.svm.guest_counters(crate::testkit::GUEST).unwrap();
            assert_eq!(now.sync_fetches, fetched, "the prefetch brought the bytes");
        }
    }
    assert_ne!(crc, 0);
}
