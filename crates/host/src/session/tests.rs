//! The session's dispatch on fakes: every malformed field of a request gets its own status,
//! and the good paths (regions, CPU accesses, fences, remote CPU bytes) work end to end.

use super::*;
use crate::testkit::{Core, GUEST};
use virtsoc_proto::wire::Format;
use virtsoc_proto::AccessMode;
use virtsoc_svm::{GuestId, RegionId};

const CPU: DeviceId = DeviceId::CPU;
const MISSING_DEVICE: u32 = 99;

fn args(v: &[u64]) -> [u64; 6] {
    let mut a = [0; 6];
    a[..v.len()].copy_from_slice(v);
    a
}

/// Each malformed request, alone, and the status it must get. The session goes on.
#[test]
fn each_malformed_field_gets_its_status() {
    let mut core = Core::new();
    let id = core.blob(4096);
    let fence = core.call(Opcode::FenceCreate, CPU, [0; 6]).unwrap()[0];
    let rw = AccessMode::ReadWrite as u64;
    let rgba = Format::Rgba8 as u64;
    let cases: &[(&str, u32, u32, [u64; 6], Status)] = &[
        ("unknown opcode", 999, 0, [0; 6], Status::UnknownOpcode),
        (
            "unknown opcode on a device",
            u32::MAX,
            1,
            [0; 6],
            Status::UnknownOpcode,
        ),
        (
            "alloc: unknown format",
            1,
            0,
            args(&[64, 0, 0, 77]),
            Status::BadArgument,
        ),
        (
            "alloc: format over 32 bits",
            1,
            0,
            args(&[64, 0, 0, 1 << 32]),
            Status::BadArgument,
        ),
        (
            "alloc: width over 32 bits",
            1,
            0,
            args(&[0, 1 << 32, 2, rgba]),
            Status::BadArgument,
        ),
        (
            "alloc: height over 32 bits",
            1,
            0,
            args(&[0, 2, 1 << 32, rgba]),
            Status::BadArgument,
        ),
        (
            "alloc: image too wide",
            1,
            0,
            args(&[0, 1 << 20, 2, rgba]),
            Status::BadArgument,
        ),
        (
            "alloc: zero-sized image",
            1,
            0,
            args(&[0, 0, 2, rgba]),
            Status::BadArgument,
        ),
        (
            "alloc: usage over 32 bits",
            1,
            0,
            args(&[64, 0, 0, 0, 1 << 33]),
            Status::BadArgument,
        ),
        ("alloc: empty blob", 1, 0, args(&[0]), Status::BadArgument),
        (
            "alloc: blob over the limit",
            1,
            0,
            args(&[1 << 30]),
            Status::OutOfMemory,
        ),
        (
            "alloc: blob over 1 TiB",
            1,
            0,
            args(&[1 << 41]),
            Status::BadArgument,
        ),
        (
            "free: unknown region",
            2,
            0,
            args(&[id + 100]),
            Status::NoSuchRegion,
        ),
        (
            "begin: unknown region",
            3,
            0,
            args(&[id + 100, 0, 8, rw]),
            Status::NoSuchRegion,
        ),
        (
            "begin: past the end",
            3,
            0,
            args(&[id, 4000, 97, rw]),
            Status::OutOfRange,
        ),
        (
            "begin: empty range",
            3,
            0,
            args(&[id, 0, 0, rw]),
            Status::OutOfRange,
        ),
        (
            "begin: offset overflows",
            3,
            0,
            args(&[id, u64::MAX, 2, rw]),
            Status::OutOfRange,
        ),
        (
            "begin: length overflows",
            3,
            0,
            args(&[id, 1, u64::MAX, rw]),
            Status::OutOfRange,
        ),
        (
            "begin: mode 0",
            3,
            0,
            args(&[id, 0, 8, 0]),
            Status::BadArgument,
        ),
        (
            "begin: mode 4",
            3,
            0,
            args(&[id, 0, 8, 4]),
            Status::BadArgument,
        ),
        (
            "begin: mode over 32 bits",
            3,
            0,
            args(&[id, 0, 8, (1 << 32) | 1]),
            Status::BadArgument,
        ),
        (
            "end: unknown region",
            4,
            0,
            args(&[id + 100, 0, 8, rw]),
            Status::NoSuchRegion,
        ),
        (
            "end: past the end",
            4,
            0,
            args(&[id, 0, 4097, rw]),
            Status::OutOfRange,
        ),
        (
            "end: mode 0",
            4,
            0,
            args(&[id, 0, 8, 0]),
            Status::BadArgument,
        ),
        (
            "device command on the CPU",
            5,
            0,
            args(&[1, id]),
            Status::UnknownDevice,
        ),
        (
            "begin on a missing device",
            3,
            MISSING_DEVICE,
            args(&[id, 0, 8, rw]),
            Status::UnknownDevice,
        ),
        (
            "end on a missing device",
            4,
            MISSING_DEVICE,
            args(&[id, 0, 8, rw]),
            Status::UnknownDevice,
        ),
        (
            "command on a missing device",
            5,
            MISSING_DEVICE,
            args(&[1, id]),
            Status::UnknownDevice,
        ),
        (
            "counters: ledger page past the end",
            7,
            0,
            args(&[3]),
            Status::BadArgument,
        ),
        (
            "counters: page u64::MAX",
            7,
            0,
            args(&[u64::MAX]),
            Status::BadArgument,
        ),
        (
            "signal: unknown fence",
            9,
            0,
            args(&[fence + (1 << 40)]),
            Status::BadArgument,
        ),
        ("signal: fence 0", 9, 0, args(&[0]), Status::BadArgument),
        (
            "wait: on the CPU",
            10,
            0,
            args(&[fence]),
            Status::BadArgument,
        ),
        (
            "wait: unknown fence",
            10,
            1,
            args(&[fence + (1 << 40)]),
            Status::BadArgument,
        ),
        (
            "wait: missing device",
            10,
            MISSING_DEVICE,
            args(&[fence]),
            Status::UnknownDevice,
        ),
        (
            "signal: missing device",
            9,
            MISSING_DEVICE,
            args(&[fence]),
            Status::UnknownDevice,
        ),
        (
            "release: unknown fence",
            11,
            0,
            args(&[fence + (1 << 40)]),
            Status::BadArgument,
        ),
        (
            "status: unknown fence",
            12,
            0,
            args(&[fence + (1 << 40)]),
            Status::BadArgument,
        ),
    ];
    for (what, op, dev, a, want) in cases {
        assert_eq!(core.call_raw(*op, *dev, *a), Err(*want), "{what}");
        assert!(!core.session.is_closed(), "{what}: the session goes on");
    }
    // Nothing reached a device queue, and the region and fence are untouched.
    assert!(core.devices.iter().all(|s| s.depth() == 0));
    assert_eq!(core.svm.meta(GUEST, RegionId(id)).unwrap().size, 4096);
    assert_eq!(
        core.call(Opcode::FenceStatus, CPU, args(&[fence])),
        Ok([0; 6])
    );
}

#[test]
fn regions_are_allocated_accessed_and_freed() {
    let mut core = Core::new();
    assert_eq!(core.call(Opcode::Nop, CPU, [0; 6]), Ok([0; 6]));
    let img = core
        .call(
            Opcode::Alloc,
            CPU,
            args(&[0, 64, 32, Format::Rgba8 as u64, 3]),
        )
        .unwrap();
    assert_eq!((img[1], img[2]), (64 * 32 * 4, 256), "size and stride");
    let id = core.blob(4096);
    assert_ne!(id, img[0], "ids are distinct");
    assert_eq!(
        core.call(Opcode::Stats, CPU, [0; 6]).unwrap()[..2],
        [GUEST.0, 2],
        "guest id and regions"
    );

    let w = AccessMode::Write as u64;
    let v = core
        .call(Opcode::BeginAccess, CPU, args(&[id, 16, 8, w]))
        .unwrap();
    let data = core.window.layout().data_offset();
    assert!(
        v[0] >= data && v[0] + 8 <= core.window.size(),
        "offset {} in the data area",
        v[0]
    );
    core.window.copy_in(v[0], b"virtsoc!").unwrap();
    core.call(Opcode::EndAccess, CPU, args(&[id, 16, 8, w]))
        .unwrap();

    let r = AccessMode::Read as u64;
    let v2 = core
        .call(Opcode::BeginAccess, CPU, args(&[id, 16, 8, r]))
        .unwrap();
    assert_eq!(v2[0], v[0], "the same replica");
    let mut got = [0u8; 8];
    core.window.copy_out(v2[0], &mut got).unwrap();
    assert_eq!(&got, b"virtsoc!");
    core.call(Opcode::EndAccess, CPU, args(&[id, 16, 8, r]))
        .unwrap();

    assert_eq!(core.call(Opcode::Free, CPU, args(&[id])), Ok([0; 6]));
    assert_eq!(
        core.call(Opcode::Free, CPU, args(&[id])),
        Err(Status::NoSuchRegion)
    );
    assert_eq!(
        core.call(Opcode::BeginAccess, CPU, args(&[id, 0, 8, r])),
        Err(Status::NoSuchRegion)
    );
    assert_eq!(core.call(Opcode::Stats, CPU, [0; 6]).unwrap()[1], 1);
}

#[test]
fn fences_are_created_signaled_and_released() {
    let mut core = Core::new();
    let f = core.call(Opcode::FenceCreate, CPU, [0; 6]).unwrap()[0];
    assert_eq!(core.call(Opcode::FenceStatus, CPU, args(&[f])), Ok([0; 6]));
    // On the CPU a signal fires at once: every earlier CPU request is done.
    assert_eq!(core.call(Opcode::FenceSignal, CPU, args(&[f])), Ok([0; 6]));
    assert_eq!(
        core.call(Opcode::FenceStatus, CPU, args(&[f])).unwrap()[0],
        1
    );
    assert_eq!(core.call(Opcode::FenceRelease, CPU, args(&[f])), Ok([0; 6]));
    // A released fence reads as signaled (its slot may be recycled since), releasing it
    // again changes nothing, and it cannot be signaled again.
    assert_eq!(
        core.call(Opcode::FenceStatus, CPU, args(&[f])).unwrap()[0],
        1
    );
    assert_eq!(core.call(Opcode::FenceRelease, CPU, args(&[f])), Ok([0; 6]));
    assert_eq!(
        core.call(Opcode::FenceSignal, CPU, args(&[f])),
        Err(Status::BadArgument),
        "a released fence cannot be signaled"
    );
    // A fence beyond the page that was never handed out.
    let overflow = (1 << 32) | u64::from(u32::MAX - 1);
    assert_eq!(
        core.call(Opcode::FenceStatus, CPU, args(&[overflow])),
        Err(Status::BadArgument)
    );
}

#[test]
fn live_fences_are_limited_per_guest() {
    let limits = Limits {
        fences: 2,
        ..Limits::default()
    };
    let mut core = Core::with(limits, false);
    let a = core.call(Opcode::FenceCreate, CPU, [0; 6]).unwrap()[0];
    core.call(Opcode::FenceCreate, CPU, [0; 6]).unwrap();
    assert_eq!(
        core.call(Opcode::FenceCreate, CPU, [0; 6]),
        Err(Status::OutOfMemory)
    );
    core.call(Opcode::FenceSignal, CPU, args(&[a])).unwrap();
    core.call(Opcode::FenceRelease, CPU, args(&[a])).unwrap();
    assert!(
        core.call(Opcode::FenceCreate, CPU, [0; 6]).is_ok(),
        "a slot came back"
    );
}

#[test]
fn device_requests_are_queued_and_bounded() {
    let limits = Limits {
        queued_per_device: 2,
        ..Limits::default()
    };
    let mut core = Core::with(limits, false);
    let id = core.blob(4096);
    let dev = DeviceId::PRODUCER.0;
    let w = AccessMode::Write as u64;
    for _ in 0..2 {
        let posted = core.send_with(
            Opcode::BeginAccess as u32,
            dev,
            args(&[id, 0, 8, w]),
            vec![],
        );
        assert!(posted.is_none(), "completed by the device, not now");
    }
    let slot = core.devices.get(DeviceId::PRODUCER).unwrap().clone();
    assert_eq!(slot.depth(), 2);
    assert_eq!(
        core.call_raw(Opcode::DeviceCmd as u32, dev, args(&[1, id])),
        Err(Status::Busy)
    );
    assert_eq!(
        core.call_raw(Opcode::FenceSignal as u32, dev, args(&[1 << 40])),
        Err(Status::BadArgument),
        "the fence is checked before the queue"
    );
    assert_eq!(
        core.session.commands().get(&dev),
        Some(&2),
        "commands counted per device"
    );
    // Closing the session closes its queues and tells nobody (the guest is gone).
    core.session.close();
    assert!(core.link.is_closed());
    assert!(core
        .send_with(
            Opcode::BeginAccess as u32,
            dev,
            args(&[id, 0, 8, w]),
            vec![]
        )
        .is_none());
}

#[test]
fn a_guest_whose_completions_cannot_be_posted_is_closed() {
    let mut core = Core::new();
    core.link.refuse_posts.store(true, Ordering::SeqCst);
    assert!(core
        .send_with(Opcode::Nop as u32, 0, [0; 6], vec![])
        .is_none());
    assert!(core.session.is_closed());
    assert!(core.link.is_closed());
}

/// A remote guest's CPU bytes travel with its requests and completions.
#[test]
fn remote_cpu_accesses_carry_their_bytes() {
    let mut core = Core::with(Limits::default(), true);
    let id = core.blob(64);
    let (w, r) = (AccessMode::Write as u64, AccessMode::Read as u64);
    let end = Opcode::EndAccess as u32;
    let begin = Opcode::BeginAccess as u32;

    // A whole-region write needs no bytes at begin; the end brings them.
    let (c, payload) = core
        .send_with(begin, 0, args(&[id, 0, 64, w]), vec![])
        .unwrap();
    assert_eq!((c.status, payload.len()), (0, 0));
    let bytes: Vec<u8> = (0..64).collect();
    let (c, _) = core
        .send_with(end, 0, args(&[id, 0, 64, w]), bytes.clone())
        .unwrap();
    assert_eq!(c.status, 0);

    // A read brings the bytes back.
    let (c, payload) = core
        .send_with(begin, 0, args(&[id, 8, 16, r]), vec![])
        .unwrap();
    assert_eq!(c.status, 0);
    assert_eq!(payload, bytes[8..24]);
    core.send_with(end, 0, args(&[id, 8, 16, r]), vec![])
        .unwrap();

    // Malformed remote accesses.
    let bad: &[(&str, u32, [u64; 6], usize, Status)] = &[
        (
            "payload shorter than the range",
            end,
            args(&[id, 0, 64, w]),
            63,
            Status::BadArgument,
        ),
        (
            "payload longer than the range",
            end,
            args(&[id, 0, 64, w]),
            65,
            Status::BadArgument,
        ),
        (
            "oversized payload",
            end,
            args(&[id, 0, 64, w]),
            1 << 20,
            Status::BadArgument,
        ),
        (
            "unknown region",
            begin,
            args(&[id + 1, 0, 8, r]),
            0,
            Status::NoSuchRegion,
        ),
        (
            "past the end",
            begin,
            args(&[id, 60, 8, r]),
            0,
            Status::OutOfRange,
        ),
        (
            "empty range",
            begin,
            args(&[id, 0, 0, r]),
            0,
            Status::OutOfRange,
        ),
        (
            "offset overflows",
            end,
            args(&[id, u64::MAX, 2, w]),
            2,
            Status::OutOfRange,
        ),
        (
            "bad mode",
            begin,
            args(&[id, 0, 8, 9]),
            0,
            Status::BadArgument,
        ),
    ];
    for (what, op, a, n, want) in bad {
        let (c, payload) = core.send_with(*op, 0, *a, vec![0xee; *n]).unwrap();
        assert_eq!(Status::from_u32(c.status), Some(*want), "{what}");
        assert!(payload.is_empty(), "{what}: no bytes with a failure");
    }
    // None of them wrote.
    let (_, payload) = core
        .send_with(begin, 0, args(&[id, 0, 64, r]), vec![])
        .unwrap();
    assert_eq!(payload, bytes);
}

/// The session loop takes requests until its link ends, then releases the guest.
#[test]
fn the_loop_serves_until_the_link_ends_then_releases_the_guest() {
    let core = Core::new();
    core.link
        .feed(Request::new(1, Opcode::Nop, CPU, [0; 6]), vec![]);
    core.link
        .feed(Request::new(2, Opcode::Alloc, CPU, args(&[4096])), vec![]);
    let mut bogus = Request::new(3, Opcode::Nop, CPU, [0; 6]);
    bogus.opcode = 4242;
    core.link.feed(bogus, vec![]);
    core.session
        .clone()
        .run(core.svm.clone(), core.devices.clone());
    let posted: Vec<(u64, u32)> = core
        .link
        .take_posted()
        .iter()
        .map(|(c, _)| (c.seq, c.status))
        .collect();
    assert_eq!(
        posted,
        vec![(1, 0), (2, 0), (3, Status::UnknownOpcode as u32)]
    );
    assert!(core.session.is_closed() && core.link.is_closed());
    assert!(
        core.svm.guest_usage(GUEST).is_err(),
        "the guest's regions were released"
    );
}

/// The counters record is each guest's own: its metadata bytes grow with its own regions,
/// not with another guest's.
#[test]
fn counters_are_each_guests_own() {
    use virtsoc_proto::counters::{Counters, LEDGER_PAGE};
    let mut core = Core::new();
    let other = GuestId(GUEST.0 + 1);
    core.svm
        .attach_guest(
            other,
            crate::testkit::window(),
            core.svm
                .protocol(virtsoc_svm::ProtocolKind::WriteInvalidate),
            1 << 20,
        )
        .unwrap();
    let read = |svm: &SvmManager, guest: GuestId| {
        let mut c = Counters::default();
        for n in 0..Counters::PAGES {
            let req = Request::new(1, Opcode::Counters, CPU, args(&[n]));
            assert!(c.set_page(n, &dispatch::inline(svm, guest, &req).unwrap()));
        }
        c
    };
    let (mine0, theirs0) = (read(&core.svm, GUEST), read(&core.svm, other));
    for _ in 0..3 {
        core.blob(4096);
    }
    let (mine, theirs) = (read(&core.svm, GUEST), read(&core.svm, other));
    assert!(mine.metadata_bytes > mine0.metadata_bytes, "{mine:?}");
    assert_eq!(theirs.metadata_bytes, theirs0.metadata_bytes, "{theirs:?}");
    // A CPU write then read moves no bytes between domains: the ledger stays empty.
    assert_eq!(mine.ledger_links, 0);
    assert_eq!(
        core.call(Opcode::Counters, CPU, args(&[LEDGER_PAGE])),
        Err(Status::BadArgument)
    );
}

/// Bytes a device copied show in the ledger pages after the record.
#[test]
fn the_ledger_follows_the_record() {
    use virtsoc_proto::counters::{Counters, LedgerEntry, LEDGER_PAGE};
    let mut core = Core::new();
    let dom = core.devices.get(DeviceId::PRODUCER).unwrap().domain;
    core.svm
        .count_device_copy(GUEST, dom, 1000, Duration::from_nanos(5));
    let mut c = Counters::default();
    for n in 0..Counters::PAGES {
        c.set_page(n, &core.call(Opcode::Counters, CPU, args(&[n])).unwrap());
    }
    assert_eq!(
        (c.ledger_links, c.device_copies, c.device_copy_bytes),
        (1, 1, 1000)
    );
    let v = core
        .call(Opcode::Counters, CPU, args(&[LEDGER_PAGE]))
        .unwrap();
    let e = LedgerEntry::from_values(&v);
    assert_eq!((e.src, e.dst, e.copies, e.bytes), (dom.0, dom.0, 1, 1000));
}
