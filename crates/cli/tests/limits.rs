//! The daemon as a security boundary, limits and isolation: what one guest may hold and ask
//! for is bounded (`virtsocd --limit-*`), a guest that hits a limit gets a clear status
//! (`OutOfMemory` for what it holds, `Busy` for queues and rates), and nothing of a departed
//! guest stays behind. Each test runs a real daemon.

mod common;

use std::time::{Duration, Instant};

use common::{connect, cpu_write, Daemon};
use virtsoc_devapi::{HandleId, RegionId};
use virtsoc_guest::devices::codec_kind;
use virtsoc_guest::devices::{codec, display, gpu, LayerRecord};
use virtsoc_guest::{AccessMode, Connection, DeviceId, Format, Opcode, Status};

fn status<T: std::fmt::Debug>(r: virtsoc_guest::Result<T>) -> Status {
    r.expect_err("the request should fail").status()
}

#[test]
fn regions_are_capped_per_guest_and_huge_blobs_refused_up_front() {
    let d = Daemon::start(&[
        "--gpu-backend",
        "null",
        "--limit-regions",
        "8",
        "--guest-mem-limit",
        "67108864",
    ]);
    let c = connect(&d);
    let ids: Vec<RegionId> = (0..8).map(|_| c.alloc_blob(4096).unwrap().id).collect();
    assert_eq!(status(c.alloc_blob(4096)), Status::OutOfMemory);
    c.free(ids[0]).unwrap();
    c.alloc_blob(4096).unwrap();
    assert_eq!(status(c.alloc_blob(4096)), Status::OutOfMemory);
    // Larger than the guest's memory limit (64 MiB): refused at alloc, not at first access.
    c.free(ids[1]).unwrap();
    assert_eq!(status(c.alloc_blob(1 << 40)), Status::OutOfMemory);
    assert_eq!(status(c.alloc_blob((64 << 20) + 1)), Status::OutOfMemory);
    c.alloc_blob(64 << 20).unwrap();
    // Another guest has its own quota.
    let other = connect(&d);
    other.alloc_blob(4096).unwrap();
}

#[test]
fn live_fences_are_capped_per_guest() {
    let d = Daemon::start(&["--gpu-backend", "null", "--limit-fences", "5"]);
    let c = connect(&d);
    let fences: Vec<_> = (0..5).map(|_| c.fence_create().unwrap()).collect();
    assert_eq!(status(c.fence_create()), Status::OutOfMemory);
    // A signaled fence no longer counts.
    c.call(
        Opcode::FenceSignal,
        DeviceId::CPU,
        [fences[0].to_u64(), 0, 0, 0, 0, 0],
    )
    .unwrap();
    c.fence_create().unwrap();
    assert_eq!(status(c.fence_create()), Status::OutOfMemory);
}

#[test]
fn queued_items_per_device_are_capped_busy_beyond() {
    let d = Daemon::start(&["--gpu-backend", "null", "--limit-queued", "4"]);
    let c = connect(&d);
    let f = c.fence_create().unwrap();
    let wait = || {
        c.call(
            Opcode::FenceWait,
            DeviceId::CONSUMER,
            [f.to_u64(), 0, 0, 0, 0, 0],
        )
    };
    // The queue is held by the unsignaled fence: items pile up until the cap.
    let mut accepted = 0;
    let busy = loop {
        match wait() {
            Ok(_) => accepted += 1,
            Err(e) => break e.status(),
        }
        assert!(accepted <= 5, "5 waits accepted past a cap of 4");
    };
    assert_eq!(busy, Status::Busy);
    assert!(
        accepted >= 4,
        "only {accepted} items accepted under a cap of 4"
    );
    // Another device's queue of the same guest is its own.
    c.call(
        Opcode::FenceWait,
        DeviceId::PRODUCER,
        [f.to_u64(), 0, 0, 0, 0, 0],
    )
    .unwrap();
    // Once the fence is signaled the queue drains and takes items again.
    c.call(
        Opcode::FenceSignal,
        DeviceId::CPU,
        [f.to_u64(), 0, 0, 0, 0, 0],
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while wait().is_err() {
        assert!(Instant::now() < deadline, "the queue never drained");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Lines of the daemon's memory map naming a memfd (guest windows).
fn memfd_maps(d: &Daemon) -> usize {
    std::fs::read_to_string(format!("/proc/{}/maps", d.child.id()))
        .unwrap()
        .lines()
        .filter(|l| l.contains("memfd"))
        .count()
}

#[test]
fn a_departed_guests_window_is_unmapped_without_anyone_else_using_its_devices() {
    let d = Daemon::start(&["--gpu-backend", "null"]);
    let c = connect(&d);
    // Warm-up guest: whatever the daemon maps once for good is in the baseline.
    c.nop().unwrap();
    drop(c);
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut baseline = memfd_maps(&d);
    // Wait for the warm-up guest's window to go (its cleanup is asynchronous).
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        let now = memfd_maps(&d);
        if now == baseline {
            break;
        }
        baseline = now;
    }
    let c = connect(&d);
    // Queues on two devices, each worker handling the guest's items.
    for dev in [DeviceId::CONSUMER, DeviceId::PRODUCER] {
        let f = c.fence_create().unwrap();
        c.call(Opcode::FenceSignal, dev, [f.to_u64(), 0, 0, 0, 0, 0])
            .unwrap();
        let t = Instant::now();
        while !c.fence_signaled(f).unwrap() {
            assert!(t.elapsed() < Duration::from_secs(20));
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    assert!(memfd_maps(&d) > baseline, "the guest's window is mapped");
    drop(c);
    // No other guest comes: the window must still go.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = memfd_maps(&d);
        if now == baseline {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{now} memfd mappings 10 s after the guest left, {baseline} before it came"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn codec_sessions_and_threads_are_capped_across_guests() {
    let d = Daemon::start(&[
        "--gpu-backend",
        "null",
        "--limit-codec-threads",
        "4",
        "--limit-codec-sessions",
        "2",
    ]);
    let open = |c: &Connection, threads| {
        c.command(&codec::OpenDecoder {
            kind: codec_kind::H264,
            format: Format::Nv12 as u64,
            threads,
        })
        .map(|r| r.handle)
    };
    let a = connect(&d);
    let b = connect(&d);
    let h = open(&a, 3).unwrap();
    // 3 of the daemon's 4 codec threads are taken: B's 2-thread decoder is Busy, 1 fits.
    assert_eq!(status(open(&b, 2)), Status::Busy);
    open(&b, 1).unwrap();
    assert_eq!(status(open(&b, 1)), Status::Busy);
    a.command(&codec::Close { handle: h }).unwrap();
    open(&b, 1).unwrap();
    // B's own quota: two sessions.
    assert_eq!(status(open(&b, 1)), Status::OutOfMemory);
    // A guest that leaves gives its sessions and threads back.
    drop(b);
    let deadline = Instant::now() + Duration::from_secs(20);
    while open(&a, 4).is_err() {
        assert!(
            Instant::now() < deadline,
            "B's threads were never given back"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A decoder's (or an encoder's) worker process counts against its guest's memory limit
/// (32 MiB each), and no guest holds more than its share of the codec threads: idle 1-thread
/// decoders cannot pile up worker processes uncounted, nor can one guest take every thread.
#[test]
fn decoder_workers_count_against_the_guests_memory_and_threads_are_shared() {
    let d = Daemon::start(&[
        "--gpu-backend",
        "null",
        "--guest-mem-limit",
        &(100u64 << 20).to_string(),
        "--limit-codec-threads-per-guest",
        "4",
    ]);
    let open = |c: &Connection, threads| {
        c.command(&codec::OpenDecoder {
            kind: codec_kind::H264,
            format: Format::Nv12 as u64,
            threads,
        })
        .map(|r| r.handle)
    };
    let a = connect(&d);
    let held: Vec<HandleId> = (0..3).map(|_| open(&a, 1).unwrap()).collect();
    // Three workers are 96 MiB of the guest's 100: a fourth is refused, with the reason.
    match open(&a, 1) {
        Err(e) => {
            assert_eq!(e.status(), Status::OutOfMemory);
            assert!(format!("{e}").contains("memory"), "{e}");
        }
        Ok(_) => panic!("a fourth worker fit in 100 MiB"),
    }
    // An encoder's worker counts the same.
    let encoder = a.command(&codec::OpenEncoder {
        width: 64,
        height: 64,
        fps: 30,
        bitrate: 500_000,
    });
    match encoder {
        Err(e) => assert!(format!("{e}").contains("an encoder's worker"), "{e}"),
        Ok(_) => panic!("an encoder's worker fit in 4 MiB"),
    }
    a.command(&codec::Close { handle: held[0] }).unwrap();
    let h = open(&a, 1).unwrap();
    // Its threads: 3 held of its 4, so a 2-thread decoder is Busy even with memory free.
    a.command(&codec::Close { handle: h }).unwrap();
    a.command(&codec::Close { handle: held[1] }).unwrap();
    open(&a, 2).unwrap();
    assert_eq!(status(open(&a, 2)), Status::Busy);
    // Another guest gets its own share.
    let b = connect(&d);
    open(&b, 4).unwrap();
}

#[test]
fn snapshots_are_rate_limited_per_guest() {
    let dir = std::env::temp_dir().join(format!("virtsoc-limits-snap-{}", std::process::id()));
    let d = Daemon::start(&[
        "--gpu-backend",
        "null",
        "--refresh-hz",
        "200",
        "--limit-snapshot-interval-ms",
        "500",
        "--snapshot-dir",
        dir.to_str().unwrap(),
    ]);
    let c = connect(&d);
    let r = c.alloc(0, 64, 48, Format::Rgba8, 0).unwrap();
    cpu_write(&c, r.id, &vec![0x80; r.size as usize]);
    let shown = c
        .command_with_access(&display::Present {
            frame: r.id,
            capture_ns: 0,
        })
        .unwrap()
        .frame_id;
    let deadline = Instant::now() + Duration::from_secs(20);
    let first = loop {
        match c.command(&display::Snapshot {}) {
            Ok(s) => break s.frame_id,
            Err(e) => {
                // Nothing scanned out yet.
                assert_eq!(e.status(), Status::Busy);
                assert!(Instant::now() < deadline, "no snapshot within 20 s");
                std::thread::sleep(Duration::from_millis(600));
            }
        }
    };
    assert_eq!(first, shown);
    // The file exists once the snapshot is answered (written off the device worker).
    assert!(dir.join(format!("virtsoc-display-{first}.png")).exists());
    assert_eq!(status(c.command(&display::Snapshot {})), Status::Busy);
    // Another guest has its own rate.
    let other = connect(&d);
    other.command(&display::Snapshot {}).unwrap();
    std::thread::sleep(Duration::from_millis(600));
    c.command(&display::Snapshot {}).unwrap();
    let _ = std::fs::remove_dir_all(dir);
}

/// Writes `layers` as records into a new blob of `c`.
fn layer_blob(c: &Connection, layers: &[LayerRecord]) -> RegionId {
    let bytes: Vec<u8> = layers.iter().flat_map(|l| l.to_bytes()).collect();
    let blob = c.alloc_blob(bytes.len() as u64).unwrap().id;
    cpu_write(c, blob, &bytes);
    blob
}

fn full_layer(src: RegionId, w: u32, h: u32) -> LayerRecord {
    LayerRecord {
        src,
        crop: [0, 0, w, h],
        dst_pos: [0, 0],
        dst_size: [w, h],
        rotation: 0,
        alpha: 0.5,
        blend: true,
    }
}

/// A guest with an RGBA source and destination of `w` x `h`, both begun by the GPU (source
/// read, destination written) for detached composites.
struct Painter {
    c: Connection,
    src: virtsoc_guest::RegionInfo,
    dst: virtsoc_guest::RegionInfo,
}

impl Painter {
    fn new(d: &Daemon, w: u32, h: u32) -> Painter {
        let c = connect(d);
        let src = c.alloc(0, w, h, Format::Rgba8, 0).unwrap();
        cpu_write(&c, src.id, &vec![0x40; src.size as usize]);
        let dst = c.alloc(0, w, h, Format::Rgba8, 0).unwrap();
        Painter { c, src, dst }
    }

    fn begin(&self, blob: RegionId) {
        let c = &self.c;
        let size = c.region(blob).unwrap().size;
        c.begin_access(blob, gpu::ID, 0, size, AccessMode::Read)
            .unwrap();
        c.begin_access(self.src.id, gpu::ID, 0, self.src.size, AccessMode::Read)
            .unwrap();
        c.begin_access(self.dst.id, gpu::ID, 0, self.dst.size, AccessMode::Write)
            .unwrap();
    }

    fn end(&self, blob: RegionId) {
        let c = &self.c;
        let size = c.region(blob).unwrap().size;
        c.end_access(blob, gpu::ID, 0, size, AccessMode::Read)
            .unwrap();
        c.end_access(self.src.id, gpu::ID, 0, self.src.size, AccessMode::Read)
            .unwrap();
        c.end_access(self.dst.id, gpu::ID, 0, self.dst.size, AccessMode::Write)
            .unwrap();
    }

    fn composite(&self, blob: RegionId, count: u64) -> gpu::Composite {
        gpu::Composite {
            layers: blob,
            count,
            dst: self.dst.id,
        }
    }
}

#[test]
fn a_composite_over_the_cost_budget_is_busy() {
    // Budget: 4 full layers of a 64x64 target.
    let d = Daemon::start(&["--gpu-backend", "cpu", "--limit-gpu-cost", "16384"]);
    let p = Painter::new(&d, 64, 64);
    let four = layer_blob(&p.c, &[full_layer(p.src.id, 64, 64); 4]);
    let five = layer_blob(&p.c, &[full_layer(p.src.id, 64, 64); 5]);
    // Off-target parts of a layer cost nothing: 5 layers half off the target fit.
    let half_off = LayerRecord {
        dst_pos: [32, 0],
        ..full_layer(p.src.id, 64, 64)
    };
    let offset = layer_blob(&p.c, &[half_off; 5]);
    for (blob, count, want) in [
        (four, 4, None),
        (five, 5, Some(Status::Busy)),
        (offset, 5, None),
    ] {
        p.begin(blob);
        let r = p.c.command(&p.composite(blob, count));
        p.end(blob);
        match want {
            None => {
                r.unwrap();
            }
            Some(s) => assert_eq!(status(r), s),
        }
    }
}

#[test]
fn a_gpu_hog_does_not_hold_back_another_guest() {
    let d = Daemon::start(&["--gpu-backend", "cpu"]);
    // The hog: a queue full of 8-layer 512x512 composites (within the budget).
    let (w, h) = (512, 512);
    let hog = Painter::new(&d, w, h);
    let blob = layer_blob(&hog.c, &[full_layer(hog.src.id, w, h); 8]);
    hog.begin(blob);
    let victim = Painter::new(&d, 64, 64);
    let vblob = layer_blob(&victim.c, &[full_layer(victim.src.id, 64, 64)]);
    const N: u64 = 24;
    for _ in 0..N {
        hog.c
            .submit_detached(
                Opcode::DeviceCmd,
                gpu::ID,
                virtsoc_guest::DeviceCommand::encode(&hog.composite(blob, 8)),
            )
            .unwrap();
    }
    // The victim's whole composite (its accesses and the command, five requests on the GPU
    // queue) completes while most of the hog's work still waits: the worker serves the
    // guests in turn, never one guest's queue to the end.
    victim.begin(vblob);
    victim.c.command(&victim.composite(vblob, 1)).unwrap();
    victim.end(vblob);
    let left = hog.c.in_flight();
    assert!(
        left >= N / 3,
        "the victim finished after the hog's composites: {left} of {N} left"
    );
    hog.c.drain().unwrap();
    assert!(hog.c.take_async_errors().is_empty());
    hog.end(blob);
}

/// A guest's pacing so far, from the control API: (bytes moved in paced steps, ns waited).
fn paced(d: &Daemon, guest: u64) -> (u64, u64) {
    use virtsoc_control::client::{control_path, request, Target};
    let r = request(
        &Target::Unix(control_path(d.socket())),
        "GET",
        "/guests",
        b"",
    )
    .expect("control request");
    assert_eq!(r.status, 200, "{}", r.body);
    let guests = r.json();
    let g = guests
        .as_array()
        .and_then(|a| a.iter().find(|g| g["id"] == guest))
        .unwrap_or_else(|| panic!("guest {guest} listed: {guests}"));
    let p = &g["paced"];
    (p["bytes"].as_u64().unwrap(), p["wait_ns"].as_u64().unwrap())
}

/// A guest whose large fill waits for its bandwidth share (1 MiB/s, 1 MiB of burst: a
/// 16 MiB fill needs 15 s of it, 60 steps of 256 KiB after the burst) does not hold the
/// producer's worker: another guest's 120 requests on the same device (40 fills with their
/// accesses) complete while the paced fill has moved only part of its bytes. Pacing that
/// waited inside the worker, even between steps, would hold each of the other guest's
/// requests for a step's share (0.25 s): the paced fill would be done before them. No pacing
/// would leave no paced bytes.
#[test]
fn a_paced_fill_does_not_hold_back_another_guest_on_the_device() {
    use virtsoc_guest::testdev::WRITE_PATTERN;
    let d = Daemon::start(&[
        "--gpu-backend",
        "null",
        "--limit-bandwidth",
        "1048576",
        "--limit-bandwidth-burst",
        "1048576",
    ]);
    const BIG: u64 = 16 << 20;
    let (p, w) = (DeviceId::PRODUCER, AccessMode::Write);
    let hog = connect(&d);
    let big = hog.alloc_blob(BIG).unwrap().id;
    hog.begin_access(big, p, 0, BIG, w).unwrap();
    hog.submit_detached(
        Opcode::DeviceCmd,
        p,
        [WRITE_PATTERN, u64::from(big), 1, 0, 0, 0],
    )
    .unwrap();
    // The other guest: fills of 1 MiB (under the streaming threshold: not paced) on the same
    // producer, its accesses queued there too.
    let victim = connect(&d);
    const SMALL: u64 = 1 << 20;
    let small = victim.alloc_blob(SMALL).unwrap().id;
    for seed in 0..40 {
        victim.begin_access(small, p, 0, SMALL, w).unwrap();
        victim
            .device_cmd(p, [WRITE_PATTERN, u64::from(small), seed, 0, 0, 0])
            .unwrap();
        victim.end_access(small, p, 0, SMALL, w).unwrap();
    }
    let (bytes, _) = paced(&d, hog.guest_id());
    assert!(
        bytes > 0 && bytes < BIG,
        "the hog's fill is paced and not done: {bytes} of {BIG} bytes moved"
    );
    assert_eq!(
        paced(&d, victim.guest_id()).0,
        0,
        "the victim was not paced"
    );
    // A guest that leaves with its paced fill under way: the fill is dropped, the device
    // serves the others on.
    drop(hog);
    victim.begin_access(small, p, 0, SMALL, w).unwrap();
    victim
        .device_cmd(p, [WRITE_PATTERN, u64::from(small), 9, 0, 0, 0])
        .unwrap();
    victim.end_access(small, p, 0, SMALL, w).unwrap();
}
