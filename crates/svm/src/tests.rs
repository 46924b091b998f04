//! Unit tests of the manager and both protocols, single-threaded.

use super::*;
use std::sync::atomic::AtomicU64;
use std::sync::Mutex;
use virtsoc_proto::WindowLayout;

struct Fixture {
    svm: SvmManager,
    prod: DomainId,
    cons: DomainId,
    win: Arc<SharedWindow>,
}

fn fixture(kind: ProtocolKind, topo_fn: impl FnOnce(&mut Topology, DomainId, DomainId)) -> Fixture {
    let mut t = Topology::new();
    let prod = t.add_device_domain("producer");
    let cons = t.add_device_domain("consumer");
    topo_fn(&mut t, prod, cons);
    let svm = SvmManager::with_prefetch_config(t, steady_config());
    let win = Arc::new(
        SharedWindow::create_memfd("t", WindowLayout::new(8 << 20, 16, 16).unwrap()).unwrap(),
    );
    svm.attach_guest(GuestId(1), win.clone(), svm.protocol(kind), 1 << 30)
        .unwrap();
    Fixture {
        svm,
        prod,
        cons,
        win,
    }
}

/// The paper's tuning without bandwidth-based suspension: these tests share two cores with
/// each other, and the bandwidth rule (tested in the prefetch crate) would react to that.
fn steady_config() -> virtsoc_prefetch::Config {
    virtsoc_prefetch::Config {
        bandwidth_floor: 0.0,
        ..virtsoc_prefetch::Config::default()
    }
}

fn blob(size: u64) -> AllocDesc {
    AllocDesc {
        size,
        width: 0,
        height: 0,
        format: Format::Blob,
        usage: 0,
    }
}

/// Producer writes `seed` bytes; consumer reads; returns (copies at producer end, copies at
/// consumer begin, what the consumer saw).
fn write_then_read(f: &Fixture, id: RegionId, seed: u8) -> (u32, u32, Vec<u8>) {
    let size = f.svm.meta(GuestId(1), id).unwrap().size;
    f.svm
        .begin_access(
            GuestId(1),
            id,
            &AccessSpec::new(f.prod.0, f.prod, 0, size, AccessMode::Write),
        )
        .unwrap();
    f.svm
        .with_replica(GuestId(1), id, f.prod, |b| {
            b.iter_mut()
                .enumerate()
                .for_each(|(i, x)| *x = seed ^ i as u8)
        })
        .unwrap();
    let e = f
        .svm
        .end_access(
            GuestId(1),
            id,
            &AccessSpec::new(f.prod.0, f.prod, 0, size, AccessMode::Write),
        )
        .unwrap();
    let b = f
        .svm
        .begin_access(
            GuestId(1),
            id,
            &AccessSpec::new(f.cons.0, f.cons, 0, size, AccessMode::Read),
        )
        .unwrap();
    let seen = f
        .svm
        .with_replica(GuestId(1), id, f.cons, |b| b.to_vec())
        .unwrap();
    f.svm
        .end_access(
            GuestId(1),
            id,
            &AccessSpec::new(f.cons.0, f.cons, 0, size, AccessMode::Read),
        )
        .unwrap();
    (e.report.copies, b.copies, seen)
}

fn expected(seed: u8, n: usize) -> Vec<u8> {
    (0..n).map(|i| seed ^ i as u8).collect()
}

#[test]
fn guest_staging_copies_twice_and_reader_sees_last_write() {
    let f = fixture(ProtocolKind::GuestStaging, |_, _, _| {});
    let (id, _) = f.svm.alloc(GuestId(1), blob(10_000)).unwrap();
    for seed in 1..5 {
        let (e, b, seen) = write_then_read(&f, id, seed);
        assert_eq!((e, b), (1, 1), "one copy to the window, one back");
        assert_eq!(seen, expected(seed, 10_000));
    }
    // The window also holds the last write (that is the baseline's point).
    let mut w = vec![0u8; 10_000];
    let off = f
        .svm
        .begin_access(
            GuestId(1),
            id,
            &AccessSpec::new(
                DomainId::GUEST_WINDOW.0,
                DomainId::GUEST_WINDOW,
                0,
                10_000,
                AccessMode::Read,
            ),
        )
        .unwrap()
        .window_offset
        .unwrap();
    f.win.copy_out(off, &mut w).unwrap();
    assert_eq!(w, expected(4, 10_000));
}

/// The fair baseline: a region nobody wrote since a device's last pull is not copied to it
/// again; a write (by the guest or another device) makes the next read pull again.
#[test]
fn guest_staging_does_not_copy_an_unchanged_region_again() {
    let f = fixture(ProtocolKind::GuestStaging, |_, _, _| {});
    let (id, _) = f.svm.alloc(GuestId(1), blob(10_000)).unwrap();
    let read = |d: DomainId| {
        let spec = AccessSpec::new(d.0, d, 0, 10_000, AccessMode::Read);
        let b = f.svm.begin_access(GuestId(1), id, &spec).unwrap();
        let seen = f
            .svm
            .with_replica(GuestId(1), id, d, |b| b.to_vec())
            .unwrap();
        f.svm.end_access(GuestId(1), id, &spec).unwrap();
        (b.copies, seen)
    };
    let (_, _, seen) = write_then_read(&f, id, 7);
    assert_eq!(seen, expected(7, 10_000));
    // Unchanged since the consumer's pull: no copy, same bytes.
    for _ in 0..3 {
        assert_eq!(read(f.cons), (0, expected(7, 10_000)));
    }
    // The guest writes it from the CPU: the next read pulls again and sees the new bytes.
    let w = DomainId::GUEST_WINDOW;
    let spec = AccessSpec::new(w.0, w, 0, 10_000, AccessMode::Write);
    let off = f
        .svm
        .begin_access(GuestId(1), id, &spec)
        .unwrap()
        .window_offset
        .unwrap();
    f.win.copy_in(off, &expected(9, 10_000)).unwrap();
    f.svm.end_access(GuestId(1), id, &spec).unwrap();
    assert_eq!(read(f.cons), (1, expected(9, 10_000)));
    assert_eq!(read(f.cons).0, 0);
    // Another device's write (copied back to the window) also makes it pull again.
    let (_, b, seen) = write_then_read(&f, id, 3);
    assert_eq!((b, seen), (1, expected(3, 10_000)));
}

#[test]
fn write_invalidate_copies_once_and_reader_sees_last_write() {
    let f = fixture(ProtocolKind::WriteInvalidate, |_, _, _| {});
    let (id, _) = f.svm.alloc(GuestId(1), blob(10_000)).unwrap();
    for seed in 1..5 {
        let (e, b, seen) = write_then_read(&f, id, seed);
        assert_eq!(
            (e, b),
            (0, 1),
            "one direct device-to-device copy at the read"
        );
        assert_eq!(seen, expected(seed, 10_000));
    }
    // A second read without an intervening write copies nothing.
    let r = f
        .svm
        .begin_access(
            GuestId(1),
            id,
            &AccessSpec::new(f.cons.0, f.cons, 0, 10_000, AccessMode::Read),
        )
        .unwrap();
    assert_eq!(r.copies, 0);
}

#[test]
fn restricted_topology_routes_through_host_ram() {
    let f = fixture(ProtocolKind::WriteInvalidate, |t, p, c| {
        t.add_link(p, DomainId::HOST_RAM);
        t.add_link(DomainId::HOST_RAM, c);
        t.add_link(DomainId::HOST_RAM, DomainId::GUEST_WINDOW);
    });
    let (id, _) = f.svm.alloc(GuestId(1), blob(4096)).unwrap();
    let (_, b, seen) = write_then_read(&f, id, 7);
    assert_eq!(b, 2, "producer -> host ram -> consumer");
    assert_eq!(seen, expected(7, 4096));
    // Host RAM kept a valid replica on the way: the CPU read takes one hop.
    let r = f
        .svm
        .begin_access(
            GuestId(1),
            id,
            &AccessSpec::new(
                DomainId::GUEST_WINDOW.0,
                DomainId::GUEST_WINDOW,
                0,
                4096,
                AccessMode::Read,
            ),
        )
        .unwrap();
    assert_eq!(r.copies, 1);
}

#[test]
fn cpu_writes_reach_devices() {
    for kind in [ProtocolKind::GuestStaging, ProtocolKind::WriteInvalidate] {
        let f = fixture(kind, |_, _, _| {});
        let (id, _) = f.svm.alloc(GuestId(1), blob(8192)).unwrap();
        let r = f
            .svm
            .begin_access(
                GuestId(1),
                id,
                &AccessSpec::new(
                    DomainId::GUEST_WINDOW.0,
                    DomainId::GUEST_WINDOW,
                    4096,
                    4,
                    AccessMode::Write,
                ),
            )
            .unwrap();
        let off = r.window_offset.unwrap();
        assert_eq!(
            off % 4096,
            0,
            "window offset of byte 4096 of a page-aligned replica"
        );
        f.win.copy_in(off, &[1, 2, 3, 4]).unwrap();
        f.svm
            .end_access(
                GuestId(1),
                id,
                &AccessSpec::new(
                    DomainId::GUEST_WINDOW.0,
                    DomainId::GUEST_WINDOW,
                    4096,
                    4,
                    AccessMode::Write,
                ),
            )
            .unwrap();
        f.svm
            .begin_access(
                GuestId(1),
                id,
                &AccessSpec::new(f.cons.0, f.cons, 0, 8192, AccessMode::Read),
            )
            .unwrap();
        let seen = f
            .svm
            .with_replica(GuestId(1), id, f.cons, |b| b[4096..4100].to_vec())
            .unwrap();
        assert_eq!(seen, vec![1, 2, 3, 4], "{kind}");
    }
}

#[test]
fn guests_cannot_name_each_others_regions() {
    let f = fixture(ProtocolKind::WriteInvalidate, |_, _, _| {});
    let win2 = Arc::new(
        SharedWindow::create_memfd("t2", WindowLayout::new(1 << 20, 16, 16).unwrap()).unwrap(),
    );
    f.svm
        .attach_guest(
            GuestId(2),
            win2,
            f.svm.protocol(ProtocolKind::WriteInvalidate),
            1 << 30,
        )
        .unwrap();
    let (id, _) = f.svm.alloc(GuestId(1), blob(100)).unwrap();
    assert!(matches!(
        f.svm.begin_access(
            GuestId(2),
            id,
            &AccessSpec::new(f.prod.0, f.prod, 0, 100, AccessMode::Read)
        ),
        Err(SvmError::NoSuchRegion)
    ));
    assert!(matches!(
        f.svm.free(GuestId(2), id),
        Err(SvmError::NoSuchRegion)
    ));
    assert!(matches!(
        f.svm.meta(GuestId(2), id),
        Err(SvmError::NoSuchRegion)
    ));
    f.svm.free(GuestId(1), id).unwrap();
    assert!(matches!(
        f.svm.free(GuestId(1), id),
        Err(SvmError::NoSuchRegion)
    ));
}

#[test]
fn bad_ranges_domains_and_sizes_are_errors() {
    let f = fixture(ProtocolKind::WriteInvalidate, |_, _, _| {});
    let (id, _) = f.svm.alloc(GuestId(1), blob(100)).unwrap();
    let r = |o, l| {
        f.svm.begin_access(
            GuestId(1),
            id,
            &AccessSpec::new(f.prod.0, f.prod, o, l, AccessMode::Read),
        )
    };
    assert!(matches!(r(0, 0), Err(SvmError::OutOfRange)));
    assert!(matches!(r(1, 100), Err(SvmError::OutOfRange)));
    assert!(matches!(r(u64::MAX, 2), Err(SvmError::OutOfRange)));
    assert!(matches!(
        f.svm.begin_access(
            GuestId(1),
            id,
            &AccessSpec::new(DomainId(99).0, DomainId(99), 0, 100, AccessMode::Read)
        ),
        Err(SvmError::UnknownDomain(99))
    ));
    assert!(f.svm.alloc(GuestId(1), blob(0)).is_err());
    let bad_image = AllocDesc {
        format: Format::Nv12,
        width: 3,
        height: 3,
        ..blob(0)
    };
    assert!(matches!(
        f.svm.alloc(GuestId(1), bad_image),
        Err(SvmError::BadArgument(_))
    ));
    assert!(
        f.svm.with_replica(GuestId(1), id, f.cons, |_| ()).is_err(),
        "no access begun"
    );
}

#[test]
fn memory_limits_fail_cleanly_and_detach_frees_everything() {
    let mut t = Topology::new();
    let dev = t.add_device_domain("dev");
    let svm = SvmManager::new(t);
    let win = Arc::new(
        SharedWindow::create_memfd("t", WindowLayout::new(1 << 20, 16, 16).unwrap()).unwrap(),
    );
    let g = svm
        .attach_guest(
            GuestId(5),
            win,
            svm.protocol(ProtocolKind::WriteInvalidate),
            64 << 10,
        )
        .unwrap();
    let (a, _) = svm.alloc(GuestId(5), blob(48 << 10)).unwrap();
    let (b, _) = svm.alloc(GuestId(5), blob(48 << 10)).unwrap();
    svm.begin_access(
        GuestId(5),
        a,
        &AccessSpec::new(dev.0, dev, 0, 48 << 10, AccessMode::Write),
    )
    .unwrap();
    assert!(matches!(
        svm.begin_access(
            GuestId(5),
            b,
            &AccessSpec::new(dev.0, dev, 0, 48 << 10, AccessMode::Write)
        ),
        Err(SvmError::OutOfMemory)
    ));
    // A region larger than the guest's memory limit is refused up front.
    assert!(matches!(
        svm.alloc(GuestId(5), blob(2 << 20)),
        Err(SvmError::OutOfMemory)
    ));
    assert_eq!(g.host_bytes(), 48 << 10);
    assert_eq!(svm.detach_guest(GuestId(5)), 2);
    assert_eq!(g.host_bytes(), 0, "replicas released with their regions");
    assert!(matches!(
        svm.alloc(GuestId(5), blob(1)),
        Err(SvmError::GuestNotAttached(GuestId(5)))
    ));
}

#[test]
fn freed_window_ranges_come_back_zeroed() {
    let f = fixture(ProtocolKind::WriteInvalidate, |_, _, _| {});
    let (a, _) = f.svm.alloc(GuestId(1), blob(4096)).unwrap();
    let off = f
        .svm
        .begin_access(
            GuestId(1),
            a,
            &AccessSpec::new(
                DomainId::GUEST_WINDOW.0,
                DomainId::GUEST_WINDOW,
                0,
                4096,
                AccessMode::Write,
            ),
        )
        .unwrap()
        .window_offset
        .unwrap();
    f.win.copy_in(off, &[0xAA; 4096]).unwrap();
    f.svm.free(GuestId(1), a).unwrap();
    let (b, _) = f.svm.alloc(GuestId(1), blob(4096)).unwrap();
    let off2 = f
        .svm
        .begin_access(
            GuestId(1),
            b,
            &AccessSpec::new(
                DomainId::GUEST_WINDOW.0,
                DomainId::GUEST_WINDOW,
                0,
                4096,
                AccessMode::Read,
            ),
        )
        .unwrap()
        .window_offset
        .unwrap();
    assert_eq!(off, off2, "first fit reuses the range");
    let mut buf = [1u8; 4096];
    f.win.copy_out(off2, &mut buf).unwrap();
    assert!(buf.iter().all(|&x| x == 0));
}

#[test]
fn prefetch_moves_the_bytes_before_the_reader_asks() {
    let f = fixture(ProtocolKind::Prefetch, |_, _, _| {});
    let ids: Vec<RegionId> = (0..4)
        .map(|_| f.svm.alloc(GuestId(1), blob(100_000)).unwrap().0)
        .collect();
    let mut reader_copies = Vec::new();
    for frame in 0..40u8 {
        let id = ids[frame as usize % 4];
        let (_, b, seen) = write_then_read(&f, id, frame);
        assert_eq!(seen, expected(frame, 100_000), "frame {frame}");
        reader_copies.push(b);
    }
    // The first cycle teaches the flow; afterwards the reader never copies itself.
    assert!(reader_copies[..1].iter().all(|&c| c == 1));
    assert!(
        reader_copies[4..].iter().all(|&c| c == 0),
        "{reader_copies:?} {:?}",
        f.svm.predictor(GuestId(1)).unwrap().stats()
    );
    let c = f.svm.guest_counters(GuestId(1)).unwrap();
    assert!(c.prefetches >= 36, "{c:?}");
    assert!(c.hits >= 36 && c.misses == 0, "{c:?}");
    assert!(f.svm.metadata_bytes(GuestId(1)) > 0);
}

/// A prefetch of a region of at most `INLINE_COPY_MAX` bytes is made by the thread that ends
/// the writer's access: it is done when `end_access` returns although every copy channel is
/// held up (fault injection), and the reader finds the bytes without fetching them. A larger
/// one is left to a channel: still in flight on return.
#[test]
fn small_prefetches_are_made_by_the_writers_thread_large_ones_by_a_channel() {
    use crate::coherence::INLINE_COPY_MAX;
    for (size, inline) in [(16 << 10, true), (INLINE_COPY_MAX + 4096, false)] {
        let f = fixture(ProtocolKind::Prefetch, |_, _, _| {});
        let id = f.svm.alloc(GuestId(1), blob(size)).unwrap().0;
        for seed in 0..6 {
            write_then_read(&f, id, seed);
        }
        f.svm.set_dma_delay(std::time::Duration::from_millis(300));
        let spec = |d: DomainId, mode| AccessSpec::new(d.0, d, 0, size, mode);
        let w = spec(f.prod, AccessMode::Write);
        f.svm.begin_access(GuestId(1), id, &w).unwrap();
        f.svm
            .with_replica(GuestId(1), id, f.prod, |b| b.fill(0x5A))
            .unwrap();
        let end = f.svm.end_access(GuestId(1), id, &w).unwrap();
        assert_eq!(end.started.len(), 1, "{size}: one prefetch to the reader");
        assert_eq!(end.started[0].is_done(), inline, "{size}: done on return");
        let fetched = f.svm.guest_counters(GuestId(1)).unwrap().sync_fetches;
        let r = spec(f.cons, AccessMode::Read);
        f.svm.begin_access(GuestId(1), id, &r).unwrap();
        let ok = f
            .svm
            .with_replica(GuestId(1), id, f.cons, |b| b.iter().all(|&x| x == 0x5A))
            .unwrap();
        assert!(ok, "{size}: the reader sees the write");
        f.svm.end_access(GuestId(1), id, &r).unwrap();
        let now = f.svm.guest_counters(GuestId(1)).unwrap().sync_fetches;
        assert_eq!(now, fetched, "{size}: the prefetch brought the bytes");
    }
}

/// A posted write (the guest wrote its window, then one request) is begun and ended at once
/// while the CPU wrote the region last: the reader sees its bytes. Once a device has written
/// the region it is refused and publishes nothing (the reader, and a CPU read of the window,
/// still see the device's bytes), until the CPU writes it again with a begin_access. Only a
/// CPU write is posted.
#[test]
fn a_posted_write_publishes_only_while_the_cpu_wrote_the_region_last() {
    let f = fixture(ProtocolKind::Prefetch, |_, _, _| {});
    let size = 4096;
    let g = GuestId(1);
    let id = f.svm.alloc(g, blob(size)).unwrap().0;
    let win = DomainId::GUEST_WINDOW;
    let cpu = |mode| AccessSpec::new(win.0, win, 0, size, mode);
    let (w, r) = (AccessMode::Write, AccessMode::Read);
    let read = || {
        let spec = AccessSpec::new(f.cons.0, f.cons, 0, size, r);
        f.svm.begin_access(g, id, &spec).unwrap();
        let seen = f.svm.with_replica(g, id, f.cons, |b| b[0]).unwrap();
        f.svm.end_access(g, id, &spec).unwrap();
        seen
    };
    let posted = |byte: u8, off: u64| {
        f.win.copy_in(off, &[byte; 4096]).unwrap();
        f.svm.posted_write(g, id, &cpu(w))
    };
    let off = f
        .svm
        .begin_access(g, id, &cpu(w))
        .unwrap()
        .window_offset
        .unwrap();
    f.win.copy_in(off, &[1; 4096]).unwrap();
    f.svm.end_access(g, id, &cpu(w)).unwrap();
    assert_eq!(read(), 1);
    for byte in 2..6 {
        posted(byte, off).unwrap();
        assert_eq!(read(), byte, "posted write {byte}");
    }
    let prod = AccessSpec::new(f.prod.0, f.prod, 0, size, w);
    f.svm.begin_access(g, id, &prod).unwrap();
    f.svm.with_replica(g, id, f.prod, |b| b.fill(9)).unwrap();
    f.svm.end_access(g, id, &prod).unwrap();
    // The window was brought up to date (a CPU read) before the guest wrote it.
    f.svm.begin_access(g, id, &cpu(r)).unwrap();
    f.svm.end_access(g, id, &cpu(r)).unwrap();
    assert!(matches!(posted(7, off), Err(SvmError::BadArgument(_))));
    assert_eq!(read(), 9, "the refused write published nothing");
    f.svm.begin_access(g, id, &cpu(r)).unwrap();
    let mut seen = [0u8; 1];
    f.win.copy_out(off, &mut seen).unwrap();
    f.svm.end_access(g, id, &cpu(r)).unwrap();
    assert_eq!(seen[0], 9, "a CPU read fetches the current bytes back");
    f.svm.begin_access(g, id, &cpu(w)).unwrap();
    f.win.copy_in(off, &[8; 4096]).unwrap();
    f.svm.end_access(g, id, &cpu(w)).unwrap();
    posted(10, off).unwrap();
    assert_eq!(read(), 10);
    assert!(matches!(
        f.svm.posted_write(g, id, &cpu(AccessMode::ReadWrite)),
        Err(SvmError::BadArgument(_))
    ));
    assert!(matches!(
        f.svm
            .posted_write(g, id, &AccessSpec::new(f.prod.0, f.prod, 0, size, w)),
        Err(SvmError::BadArgument(_))
    ));
}

#[test]
fn prefetch_mispredictions_fall_back_to_a_synchronous_fetch() {
    let mut t = Topology::new();
    let prod = t.add_device_domain("producer");
    let cons = t.add_device_domain("consumer");
    let other = t.add_device_domain("other");
    let svm = SvmManager::with_prefetch_config(t, steady_config());
    let win = Arc::new(
        SharedWindow::create_memfd("t", WindowLayout::new(8 << 20, 16, 16).unwrap()).unwrap(),
    );
    svm.attach_guest(
        GuestId(1),
        win,
        svm.protocol(ProtocolKind::Prefetch),
        1 << 30,
    )
    .unwrap();
    let (id, _) = svm.alloc(GuestId(1), blob(50_000)).unwrap();
    let w = AccessMode::Write;
    let r = AccessMode::Read;
    for frame in 0..12u8 {
        // Frames 0-7 go to the consumer; then the flow switches to `other`.
        let reader = if frame < 8 { cons } else { other };
        svm.begin_access(GuestId(1), id, &AccessSpec::new(prod.0, prod, 0, 50_000, w))
            .unwrap();
        svm.with_replica(GuestId(1), id, prod, |b| b.fill(frame))
            .unwrap();
        svm.end_access(GuestId(1), id, &AccessSpec::new(prod.0, prod, 0, 50_000, w))
            .unwrap();
        svm.begin_access(
            GuestId(1),
            id,
            &AccessSpec::new(reader.0, reader, 0, 50_000, r),
        )
        .unwrap();
        let ok = svm
            .with_replica(GuestId(1), id, reader, |b| b.iter().all(|&x| x == frame))
            .unwrap();
        assert!(ok, "frame {frame}: reader saw stale bytes");
        svm.end_access(
            GuestId(1),
            id,
            &AccessSpec::new(reader.0, reader, 0, 50_000, r),
        )
        .unwrap();
    }
    let c = svm.guest_counters(GuestId(1)).unwrap();
    assert!(c.misses >= 1, "{c:?}");
    assert!(
        c.sync_fetches >= 2,
        "first frame and the switch fetch synchronously: {c:?}"
    );
}

#[test]
fn prefetch_reaches_every_reader_of_a_multi_reader_flow() {
    let mut t = Topology::new();
    let cam = t.add_device_domain("camera");
    let isp = t.add_device_domain("isp");
    let gpu = t.add_device_domain("gpu");
    let svm = SvmManager::with_prefetch_config(t, steady_config());
    let win = Arc::new(
        SharedWindow::create_memfd("t", WindowLayout::new(8 << 20, 16, 16).unwrap()).unwrap(),
    );
    svm.attach_guest(
        GuestId(1),
        win,
        svm.protocol(ProtocolKind::Prefetch),
        1 << 30,
    )
    .unwrap();
    let (id, _) = svm.alloc(GuestId(1), blob(10_000)).unwrap();
    let mut last = (0, 0);
    for frame in 0..10u8 {
        svm.begin_access(
            GuestId(1),
            id,
            &AccessSpec::new(cam.0, cam, 0, 10_000, AccessMode::Write),
        )
        .unwrap();
        svm.with_replica(GuestId(1), id, cam, |b| b.fill(frame))
            .unwrap();
        svm.end_access(
            GuestId(1),
            id,
            &AccessSpec::new(cam.0, cam, 0, 10_000, AccessMode::Write),
        )
        .unwrap();
        let mut copies = Vec::new();
        for d in [isp, gpu] {
            let rep = svm
                .begin_access(
                    GuestId(1),
                    id,
                    &AccessSpec::new(d.0, d, 0, 10_000, AccessMode::Read),
                )
                .unwrap();
            assert!(svm
                .with_replica(GuestId(1), id, d, |b| b.iter().all(|&x| x == frame))
                .unwrap());
            svm.end_access(
                GuestId(1),
                id,
                &AccessSpec::new(d.0, d, 0, 10_000, AccessMode::Read),
            )
            .unwrap();
            copies.push(rep.copies);
        }
        last = (copies[0], copies[1]);
    }
    assert_eq!(last, (0, 0), "both readers were prefetched to");
}

#[test]
fn a_write_during_a_prefetch_out_of_its_domain_leaves_readers_the_last_write() {
    let f = fixture(ProtocolKind::Prefetch, |_, _, _| {});
    let (id, _) = f.svm.alloc(GuestId(1), blob(4 << 20)).unwrap();
    for frame in 0..3u8 {
        write_then_read(&f, id, frame);
    }
    // Write twice in a row: the second write must not race the prefetch of the first.
    for seed in [50u8, 51] {
        f.svm
            .begin_access(
                GuestId(1),
                id,
                &AccessSpec::new(f.prod.0, f.prod, 0, 4 << 20, AccessMode::Write),
            )
            .unwrap();
        f.svm
            .with_replica(GuestId(1), id, f.prod, |b| b.fill(seed))
            .unwrap();
        f.svm
            .end_access(
                GuestId(1),
                id,
                &AccessSpec::new(f.prod.0, f.prod, 0, 4 << 20, AccessMode::Write),
            )
            .unwrap();
    }
    f.svm
        .begin_access(
            GuestId(1),
            id,
            &AccessSpec::new(f.cons.0, f.cons, 0, 4 << 20, AccessMode::Read),
        )
        .unwrap();
    assert!(f
        .svm
        .with_replica(GuestId(1), id, f.cons, |b| b.iter().all(|&x| x == 51))
        .unwrap());
}

fn spec(d: DomainId, offset: u64, len: u64, mode: AccessMode) -> AccessSpec {
    AccessSpec::new(d.0, d, offset, len, mode)
}

#[test]
fn a_sub_range_write_moves_only_the_sub_range() {
    for kind in [ProtocolKind::WriteInvalidate, ProtocolKind::Prefetch] {
        let f = fixture(kind, |_, _, _| {});
        let (id, _) = f.svm.alloc(GuestId(1), blob(1 << 20)).unwrap();
        write_then_read(&f, id, 7);
        // The CPU rewrites 100 bytes in the middle.
        let w = DomainId::GUEST_WINDOW;
        let r = f
            .svm
            .begin_access(GuestId(1), id, &spec(w, 5000, 100, AccessMode::Write))
            .unwrap();
        assert_eq!(r.bytes, 0, "{kind}: a write-only access fetches nothing");
        f.win
            .copy_in(r.window_offset.unwrap(), &[0xAB; 100])
            .unwrap();
        f.svm
            .end_access(GuestId(1), id, &spec(w, 5000, 100, AccessMode::Write))
            .unwrap();
        let r = f
            .svm
            .begin_access(GuestId(1), id, &spec(f.cons, 0, 1 << 20, AccessMode::Read))
            .unwrap();
        assert_eq!(
            (r.copies, r.bytes),
            (1, 100),
            "{kind}: the reader copies only the rewritten bytes"
        );
        let seen = f
            .svm
            .with_replica(GuestId(1), id, f.cons, |b| b.to_vec())
            .unwrap();
        let mut want = expected(7, 1 << 20);
        want[5000..5100].fill(0xAB);
        assert_eq!(seen, want, "{kind}");
        // A read of a range that holds nothing new copies nothing.
        let r = f
            .svm
            .begin_access(GuestId(1), id, &spec(f.prod, 0, 4096, AccessMode::Read))
            .unwrap();
        assert_eq!(
            r.bytes, 0,
            "{kind}: the producer is stale only at 5000..5100"
        );
        let r = f
            .svm
            .begin_access(GuestId(1), id, &spec(f.prod, 4096, 4096, AccessMode::Read))
            .unwrap();
        assert_eq!(r.bytes, 100, "{kind}");
    }
}

#[test]
fn two_domains_writing_different_halves_are_merged_by_a_reader() {
    let f = fixture(ProtocolKind::WriteInvalidate, |_, _, _| {});
    let (id, _) = f.svm.alloc(GuestId(1), blob(8192)).unwrap();
    for (d, off, byte) in [(f.prod, 0u64, 1u8), (DomainId::HOST_RAM, 4096, 2)] {
        f.svm
            .begin_access(GuestId(1), id, &spec(d, off, 4096, AccessMode::Write))
            .unwrap();
        f.svm
            .with_replica(GuestId(1), id, d, |b| {
                b[off as usize..off as usize + 4096].fill(byte)
            })
            .unwrap();
        f.svm
            .end_access(GuestId(1), id, &spec(d, off, 4096, AccessMode::Write))
            .unwrap();
    }
    let r = f
        .svm
        .begin_access(GuestId(1), id, &spec(f.cons, 0, 8192, AccessMode::Read))
        .unwrap();
    assert_eq!((r.copies, r.bytes), (2, 8192), "one piece from each writer");
    let seen = f
        .svm
        .with_replica(GuestId(1), id, f.cons, |b| b.to_vec())
        .unwrap();
    assert!(seen[..4096].iter().all(|&x| x == 1) && seen[4096..].iter().all(|&x| x == 2));
}

/// Device memory reached only through uploads and readbacks, counting them.
#[derive(Debug, Default)]
struct FakeDeviceMemory {
    bytes: Mutex<Vec<u8>>,
    uploaded: AtomicU64,
    read_back: AtomicU64,
    /// Uploads and readbacks made (calls, not bytes).
    calls: AtomicU64,
}

impl DeviceMemory for FakeDeviceMemory {
    fn write(&self, offset: u64, src: &[u8]) -> Result<()> {
        let mut b = self.bytes.lock().unwrap();
        b[offset as usize..offset as usize + src.len()].copy_from_slice(src);
        self.uploaded.fetch_add(src.len() as u64, Ordering::Relaxed);
        self.calls.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
    fn read(&self, offset: u64, dst: &mut [u8]) -> Result<()> {
        let b = self.bytes.lock().unwrap();
        dst.copy_from_slice(&b[offset as usize..offset as usize + dst.len()]);
        self.read_back
            .fetch_add(dst.len() as u64, Ordering::Relaxed);
        self.calls.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

#[derive(Default)]
struct FakeAllocator {
    made: Mutex<Vec<Arc<FakeDeviceMemory>>>,
}

impl DeviceAllocator for FakeAllocator {
    fn alloc(&self, meta: &RegionMeta) -> Result<Option<Arc<dyn DeviceMemory>>> {
        let m = Arc::new(FakeDeviceMemory {
            bytes: Mutex::new(vec![0; meta.size as usize]),
            ..Default::default()
        });
        self.made.lock().unwrap().push(m.clone());
        Ok(Some(m))
    }
}

#[test]
fn device_memory_replicas_are_filled_by_uploads_and_read_back_by_readbacks() {
    for kind in ProtocolKind::ALL {
        let f = fixture(kind, |_, _, _| {});
        let alloc = Arc::new(FakeAllocator::default());
        f.svm.set_allocator(f.cons, alloc.clone());
        let (id, _) = f.svm.alloc(GuestId(1), blob(64 << 10)).unwrap();
        for seed in 1..4 {
            write_then_read_device(&f, id, seed);
        }
        let made = alloc.made.lock().unwrap();
        assert_eq!(made.len(), 1, "{kind}: one replica in device memory");
        let mem = &made[0];
        assert_eq!(*mem.bytes.lock().unwrap(), expected(3, 64 << 10), "{kind}");
        assert!(
            mem.uploaded.load(Ordering::Relaxed) >= 3 * (64 << 10),
            "{kind}"
        );
        // The device writes; the CPU reads it back.
        drop(made);
        let d = f.cons;
        f.svm
            .begin_access(GuestId(1), id, &spec(d, 0, 64 << 10, AccessMode::Write))
            .unwrap();
        match f.svm.replica(GuestId(1), id, d).unwrap() {
            Backing::Device(m) => m.write(100, &[9, 9, 9]).unwrap(),
            other => panic!("{kind}: {other:?}"),
        }
        assert!(
            f.svm.with_replica(GuestId(1), id, d, |_| ()).is_err(),
            "device memory is not host-addressable"
        );
        f.svm
            .end_access(GuestId(1), id, &spec(d, 0, 64 << 10, AccessMode::Write))
            .unwrap();
        let w = DomainId::GUEST_WINDOW;
        let r = f
            .svm
            .begin_access(GuestId(1), id, &spec(w, 96, 8, AccessMode::Read))
            .unwrap();
        let mut got = [0u8; 8];
        f.win.copy_out(r.window_offset.unwrap(), &mut got).unwrap();
        assert_eq!(&got[4..7], &[9, 9, 9], "{kind}");
    }
}

fn write_then_read_device(f: &Fixture, id: RegionId, seed: u8) {
    let size = f.svm.meta(GuestId(1), id).unwrap().size;
    f.svm
        .begin_access(GuestId(1), id, &spec(f.prod, 0, size, AccessMode::Write))
        .unwrap();
    f.svm
        .with_replica(GuestId(1), id, f.prod, |b| {
            b.iter_mut()
                .enumerate()
                .for_each(|(i, x)| *x = seed ^ i as u8)
        })
        .unwrap();
    f.svm
        .end_access(GuestId(1), id, &spec(f.prod, 0, size, AccessMode::Write))
        .unwrap();
    f.svm
        .begin_access(GuestId(1), id, &spec(f.cons, 0, size, AccessMode::Read))
        .unwrap();
    f.svm
        .end_access(GuestId(1), id, &spec(f.cons, 0, size, AccessMode::Read))
        .unwrap();
}

#[test]
fn a_reader_whose_copy_is_in_flight_is_told_to_wait_not_blocked() {
    let f = fixture(ProtocolKind::Prefetch, |_, _, _| {});
    let (id, _) = f.svm.alloc(GuestId(1), blob(64 << 20)).unwrap();
    for seed in 0..3 {
        write_then_read(&f, id, seed);
    }
    let size = 64 << 20;
    let before = f.svm.guest_counters(GuestId(1)).unwrap().sync_fetches;
    f.svm
        .begin_access(GuestId(1), id, &spec(f.prod, 0, size, AccessMode::Write))
        .unwrap();
    let end = f
        .svm
        .end_access(GuestId(1), id, &spec(f.prod, 0, size, AccessMode::Write))
        .unwrap();
    assert_eq!(end.started.len(), 1, "the predicted reader's copy started");
    // Either the copy is still in flight (the step says wait, without blocking), or it
    // already finished (done). Both end with the reader holding the data.
    let mut retry = false;
    loop {
        match f
            .svm
            .begin_access_step(
                GuestId(1),
                id,
                &spec(f.cons, 0, size, AccessMode::Read),
                retry,
            )
            .unwrap()
        {
            Progress::Done(r) => {
                assert_eq!(r.copies, 0, "the prefetch brought the bytes");
                break;
            }
            Progress::Wait(t) => {
                t.wait();
                retry = true;
            }
        }
    }
    let s = f.svm.guest_counters(GuestId(1)).unwrap();
    assert_eq!(
        s.sync_fetches, before,
        "the reader never fetched synchronously"
    );
}

#[test]
fn each_guest_has_its_own_predictor() {
    let mut t = Topology::new();
    let prod = t.add_device_domain("producer");
    let cons = t.add_device_domain("consumer");
    let other = t.add_device_domain("other");
    let svm = SvmManager::with_prefetch_config(t, steady_config());
    for g in [1, 2] {
        let win = Arc::new(
            SharedWindow::create_memfd("t", WindowLayout::new(8 << 20, 16, 16).unwrap()).unwrap(),
        );
        svm.attach_guest(
            GuestId(g),
            win,
            svm.protocol(ProtocolKind::Prefetch),
            1 << 30,
        )
        .unwrap();
    }
    let round = |g: u64, id: RegionId, reader: DomainId| {
        svm.begin_access(GuestId(g), id, &spec(prod, 0, 4096, AccessMode::Write))
            .unwrap();
        svm.end_access(GuestId(g), id, &spec(prod, 0, 4096, AccessMode::Write))
            .unwrap();
        svm.begin_access(GuestId(g), id, &spec(reader, 0, 4096, AccessMode::Read))
            .unwrap();
        svm.end_access(GuestId(g), id, &spec(reader, 0, 4096, AccessMode::Read))
            .unwrap();
    };
    // Guest 1 learns producer -> consumer; guest 2 producer -> other.
    let (a, _) = svm.alloc(GuestId(1), blob(4096)).unwrap();
    let (b, _) = svm.alloc(GuestId(2), blob(4096)).unwrap();
    for _ in 0..5 {
        round(1, a, cons);
        round(2, b, other);
    }
    // A new region of guest 2 is predicted from guest 2's flow (zero-shot), never guest 1's.
    let (c, _) = svm.alloc(GuestId(2), blob(4096)).unwrap();
    for _ in 0..3 {
        round(2, c, other);
    }
    let (h1, m1) = {
        let s = svm.guest_counters(GuestId(1)).unwrap();
        (s.hits, s.misses)
    };
    let (h2, m2) = {
        let s = svm.guest_counters(GuestId(2)).unwrap();
        (s.hits, s.misses)
    };
    assert_eq!(m1, 0, "guest 1 never mispredicted");
    assert_eq!(m2, 0, "guest 2 never mispredicted");
    assert!(h1 >= 4 && h2 >= 6, "hits {h1} {h2}");
    assert!(svm.predictor(GuestId(1)).unwrap().stats().virtual_flows >= 1);
    assert_ne!(
        Arc::as_ptr(&svm.predictor(GuestId(1)).unwrap()),
        Arc::as_ptr(&svm.predictor(GuestId(2)).unwrap())
    );
}

fn window() -> Arc<SharedWindow> {
    Arc::new(SharedWindow::create_memfd("t", WindowLayout::new(1 << 20, 16, 16).unwrap()).unwrap())
}

#[test]
fn a_guest_holds_at_most_its_region_limit_and_no_blob_over_its_memory_limit() {
    let svm = SvmManager::new(Topology::new());
    let p = svm.protocol(ProtocolKind::WriteInvalidate);
    svm.attach_guest_limited(GuestId(1), window(), p, 1 << 20, 3)
        .unwrap();
    let ids: Vec<RegionId> = (0..3)
        .map(|_| svm.alloc(GuestId(1), blob(16)).unwrap().0)
        .collect();
    assert!(matches!(
        svm.alloc(GuestId(1), blob(16)),
        Err(SvmError::OutOfMemory)
    ));
    assert_eq!(svm.guest_usage(GuestId(1)).unwrap().0, 3);
    // Freeing one makes room for one.
    svm.free(GuestId(1), ids[0]).unwrap();
    svm.alloc(GuestId(1), blob(16)).unwrap();
    assert!(matches!(
        svm.alloc(GuestId(1), blob(16)),
        Err(SvmError::OutOfMemory)
    ));
    // Up to the memory limit is accepted (lazily backed), one byte more is not; a 1 TiB blob
    // is refused at once, not at its first access.
    svm.free(GuestId(1), ids[1]).unwrap();
    svm.alloc(GuestId(1), blob(1 << 20)).unwrap();
    svm.free(GuestId(1), ids[2]).unwrap();
    assert!(matches!(
        svm.alloc(GuestId(1), blob((1 << 20) + 1)),
        Err(SvmError::OutOfMemory)
    ));
    assert!(matches!(
        svm.alloc(GuestId(1), blob(1 << 40)),
        Err(SvmError::OutOfMemory)
    ));
}

#[test]
fn each_guest_has_its_own_region_table_dropped_whole_when_it_leaves() {
    let svm = Arc::new(SvmManager::new(Topology::new()));
    for g in [1, 2] {
        let p = svm.protocol(ProtocolKind::WriteInvalidate);
        svm.attach_guest(GuestId(g), window(), p, 1 << 30).unwrap();
    }
    let (mine, _) = svm.alloc(GuestId(2), blob(64)).unwrap();
    for _ in 0..20_000 {
        svm.alloc(GuestId(1), blob(64)).unwrap();
    }
    assert_eq!(svm.stats().regions, 20_001);
    // Guest 1 leaving holds no lock guest 2's lookups need: they go on while it runs.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let started = Arc::new(std::sync::Barrier::new(2));
    let looker = {
        let (svm, stop, started) = (svm.clone(), stop.clone(), started.clone());
        std::thread::spawn(move || {
            svm.meta(GuestId(2), mine).unwrap();
            started.wait();
            let mut n = 1u64;
            while !stop.load(Ordering::Relaxed) {
                svm.meta(GuestId(2), mine).unwrap();
                n += 1;
            }
            n
        })
    };
    // The looker is looking up before the guest leaves (a thread not yet scheduled when
    // the detach ended made this flaky on two busy cores).
    started.wait();
    assert_eq!(svm.detach_guest(GuestId(1)), 20_000);
    stop.store(true, Ordering::Relaxed);
    assert!(looker.join().unwrap() > 0);
    assert_eq!(svm.stats().regions, 1);
    assert_eq!(svm.guest_usage(GuestId(2)).unwrap().0, 1);
    assert!(matches!(
        svm.meta(GuestId(1), RegionId(1)),
        Err(SvmError::NoSuchRegion)
    ));
}

#[test]
fn a_host_replica_with_the_current_contents_is_found_with_its_generation() {
    let f = fixture(ProtocolKind::WriteInvalidate, |_, _, _| {});
    let (id, _) = f.svm.alloc(GuestId(1), blob(4096)).unwrap();
    write_then_read(&f, id, 3);
    let (b, g1) = f
        .svm
        .host_replica(GuestId(1), id)
        .unwrap()
        .expect("a host replica");
    let Backing::Host(buf) = b else {
        panic!("not host memory")
    };
    assert_eq!(buf.lock()[..4096], expected(3, 4096)[..]);
    assert_eq!(g1, f.svm.generation(GuestId(1), id).unwrap());
    write_then_read(&f, id, 4);
    let (_, g2) = f.svm.host_replica(GuestId(1), id).unwrap().unwrap();
    assert!(g2 > g1, "a write moves the generation");
    assert!(f.svm.host_replica(GuestId(1), RegionId(id.0 + 99)).is_err());
    assert!(f.svm.host_replica(GuestId(2), id).is_err());
}

/// A device that reads host memory directly (a display controller) reads a host replica
/// holding the current contents where it is: no copy, not even into its own device memory,
/// and `read_replica` hands it that replica. When only device memory holds the contents, or
/// under the guest-staging baseline (devices pull from the guest), it fetches into its own
/// domain as any reader does; a write is never redirected.
#[test]
fn a_host_memory_reader_reads_a_current_host_replica_in_place() {
    for kind in ProtocolKind::ALL {
        let f = fixture(kind, |_, _, _| {});
        let alloc = Arc::new(FakeAllocator::default());
        f.svm.set_allocator(f.cons, alloc.clone());
        let (id, _) = f.svm.alloc(GuestId(1), blob(64 << 10)).unwrap();
        let size = 64 << 10;
        let reader = |mode| spec(f.cons, 0, size, mode).reading_host(true);
        let uploaded = || -> u64 {
            let made = alloc.made.lock().unwrap();
            made.iter()
                .map(|m| m.uploaded.load(Ordering::Relaxed))
                .sum()
        };
        // The producer (host memory) writes; the host-memory reader reads.
        for seed in 1..4u8 {
            f.svm
                .begin_access(GuestId(1), id, &spec(f.prod, 0, size, AccessMode::Write))
                .unwrap();
            f.svm
                .with_replica(GuestId(1), id, f.prod, |b| b.fill(seed))
                .unwrap();
            f.svm
                .end_access(GuestId(1), id, &spec(f.prod, 0, size, AccessMode::Write))
                .unwrap();
            let r = f
                .svm
                .begin_access(GuestId(1), id, &reader(AccessMode::Read))
                .unwrap();
            let backing = f.svm.read_replica(GuestId(1), id, f.cons).unwrap();
            f.svm
                .end_access(GuestId(1), id, &reader(AccessMode::Read))
                .unwrap();
            if kind == ProtocolKind::GuestStaging {
                assert!(r.copies > 0, "{kind}: the baseline pulls from the guest");
                assert!(matches!(backing, Backing::Device(_)), "{kind}");
            } else {
                assert_eq!(
                    (r.copies, r.bytes),
                    (0, 0),
                    "{kind} seed {seed}: read in place"
                );
                match backing {
                    Backing::Host(b) => assert!(b.lock().iter().all(|&x| x == seed), "{kind}"),
                    other => panic!("{kind}: {other:?}"),
                }
            }
        }
        if kind != ProtocolKind::GuestStaging {
            assert_eq!(uploaded(), 0, "{kind}: nothing went to device memory");
        }
        // Without the flag, the same reader fetches into its device memory.
        let r = f
            .svm
            .begin_access(GuestId(1), id, &spec(f.cons, 0, size, AccessMode::Read))
            .unwrap();
        f.svm
            .end_access(GuestId(1), id, &spec(f.cons, 0, size, AccessMode::Read))
            .unwrap();
        if kind != ProtocolKind::GuestStaging {
            assert_eq!(r.bytes, size, "{kind}: an ordinary read copies");
        }
        // A write with the flag stays in the device's domain, leaving only device memory
        // current: the next in-place read has no host replica and reads its own domain.
        f.svm
            .begin_access(GuestId(1), id, &reader(AccessMode::Write))
            .unwrap();
        f.svm
            .end_access(GuestId(1), id, &reader(AccessMode::Write))
            .unwrap();
        let r = f
            .svm
            .begin_access(GuestId(1), id, &reader(AccessMode::Read))
            .unwrap();
        if kind != ProtocolKind::GuestStaging {
            assert_eq!(r.copies, 0, "{kind}: its own domain is current");
        }
        assert!(
            matches!(
                f.svm.read_replica(GuestId(1), id, f.cons).unwrap(),
                Backing::Device(_)
            ),
            "{kind}: device memory holds the last write"
        );
        f.svm
            .end_access(GuestId(1), id, &reader(AccessMode::Read))
            .unwrap();
    }
}

/// Window <-> device memory copies move the bytes in one upload or readback straight from or
/// into the window (no bounce buffer: the device sees one call for the whole range), at the
/// right offsets.
#[test]
fn window_device_copies_go_straight_through() {
    use crate::backing::{copy_range, Backing};
    let win = Arc::new(
        SharedWindow::create_memfd("w", WindowLayout::new(8 << 20, 16, 16).unwrap()).unwrap(),
    );
    let n = 3 << 20; // three times the old bounce buffer
    let pattern: Vec<u8> = (0..n).map(|i| (i * 7 % 251) as u8).collect();
    win.copy_in(4096, &pattern).unwrap();
    let mem = Arc::new(FakeDeviceMemory {
        bytes: Mutex::new(vec![0u8; n + 100]),
        ..FakeDeviceMemory::default()
    });
    let w = Backing::Window {
        win: win.clone(),
        offset: 4096 - 100,
    };
    let d = Backing::Device(mem.clone());
    copy_range(&w, &d, 100, n as u64, false).unwrap();
    assert_eq!(mem.calls.load(Ordering::Relaxed), 1, "one upload");
    assert_eq!(&mem.bytes.lock().unwrap()[100..], &pattern[..]);
    win.zero(4096, n as u64).unwrap();
    copy_range(&d, &w, 100, n as u64, false).unwrap();
    let mut back = vec![0u8; n];
    win.copy_out(4096, &mut back).unwrap();
    assert_eq!(back, pattern);
    assert_eq!(mem.calls.load(Ordering::Relaxed), 2, "one readback");
    // Out of the window's bounds: refused.
    assert!(copy_range(
        &d,
        &Backing::Window {
            win,
            offset: 8 << 20
        },
        100,
        16,
        false
    )
    .is_err());
}

/// A device's lent picture (an adopted replica in device memory) read by a device that
/// reads host memory in place (the display): moved out into host memory once, the device's
/// own copy, and read there; not uploaded into the reader's memory (before, the display's
/// memory, the GPU's, got a copy of every picture and the display read it back). Once the
/// region has such a reader, later pictures are moved out when they are lent.
#[test]
fn a_host_memory_reader_moves_a_lent_replica_out_once_and_reads_it_in_place() {
    for kind in [ProtocolKind::WriteInvalidate, ProtocolKind::Prefetch] {
        let f = fixture(kind, |_, _, _| {});
        let alloc = Arc::new(FakeAllocator::default());
        f.svm.set_allocator(f.cons, alloc.clone());
        let size = 64u64 << 10;
        let (id, _) = f.svm.alloc(GuestId(1), blob(size)).unwrap();
        let reader = |mode| spec(f.cons, 0, size, mode).reading_host(true);
        for seed in 1..4u8 {
            let w = spec(f.prod, 0, size, AccessMode::Write);
            f.svm.begin_access(GuestId(1), id, &w).unwrap();
            let lent = Arc::new(FakeDeviceMemory {
                bytes: Mutex::new(vec![seed; size as usize]),
                ..Default::default()
            });
            f.svm
                .adopt_replica(GuestId(1), id, f.prod, lent.clone())
                .unwrap();
            f.svm.end_access(GuestId(1), id, &w).unwrap();
            let r = f
                .svm
                .begin_access(GuestId(1), id, &reader(AccessMode::Read))
                .unwrap();
            let backing = f.svm.read_replica(GuestId(1), id, f.cons).unwrap();
            // A second read of the same picture finds it in host memory already.
            f.svm
                .end_access(GuestId(1), id, &reader(AccessMode::Read))
                .unwrap();
            let again = f
                .svm
                .begin_access(GuestId(1), id, &reader(AccessMode::Read))
                .unwrap();
            f.svm
                .end_access(GuestId(1), id, &reader(AccessMode::Read))
                .unwrap();
            // The first picture is moved out at the read; the next ones at their
            // adoption (the region has a host-memory reader), off the reader's path.
            let at_read = if seed == 1 { (1, size) } else { (0, 0) };
            assert_eq!((r.copies, r.bytes), at_read, "{kind} {seed}: moved out");
            assert_eq!(again.copies, 0, "{kind} {seed}: read in place");
            assert_eq!(lent.read_back.load(Ordering::Relaxed), size, "{kind}");
            match backing {
                Backing::Host(b) => assert!(b.lock().iter().all(|&x| x == seed), "{kind}"),
                other => panic!("{kind}: {other:?}"),
            }
        }
        let uploaded: u64 = alloc
            .made
            .lock()
            .unwrap()
            .iter()
            .map(|m| m.uploaded.load(Ordering::Relaxed))
            .sum();
        assert_eq!(uploaded, 0, "{kind}: nothing went to the reader's memory");
    }
}
