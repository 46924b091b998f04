//! Integration tests of the display device through a real daemon: presenting frames, the
//! per-guest counters, vsync fences, PNG snapshots, screen sharing between guests, and bad
//! inputs. No timing assertions: vsyncs are awaited with vsync fences, bounded.
//!
//! (That a snapshot holds exactly the presented pixels is checked by the unit tests in
//! `crates/host/src/device/display.rs`; here the PNG's signature and size are checked.)

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::Daemon;
use virtsoc_devapi::RegionId;
use virtsoc_guest::devices::display::{Present, SignalAtVsync, Snapshot, Stats, StatsReply};
use virtsoc_guest::{AccessMode, ConnectOptions, Connection, DeviceId, Fence, Format, Status};

fn snapshot_dir(tag: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("virtsoc-dev-display-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn start(dir: &Path) -> Daemon {
    Daemon::start(&[
        "--refresh-hz",
        "60",
        "--snapshot-dir",
        dir.to_str().unwrap(),
        // These tests take snapshots back to back (the rate limit has its own test).
        "--limit-snapshot-interval-ms",
        "0",
    ])
}

fn connect(d: &Daemon) -> Connection {
    Connection::connect(
        d.socket(),
        &ConnectOptions {
            window_size: 64 << 20,
            ..ConnectOptions::default()
        },
    )
    .expect("connect")
}

/// Allocates a `w` x `h` frame of `format` and fills it from the CPU with `fill(i)` per byte.
fn frame(c: &Connection, w: u32, h: u32, format: Format, fill: impl Fn(usize) -> u8) -> RegionId {
    let r = c.alloc(0, w, h, format, 0).expect("alloc");
    let a = c
        .begin_access(r.id, DeviceId::CPU, 0, r.size, AccessMode::Write)
        .unwrap();
    // SAFETY: the window maps the whole region while the CPU access lasts.
    let px = unsafe { std::slice::from_raw_parts_mut(a.ptr.unwrap().as_ptr(), r.size as usize) };
    for (i, b) in px.iter_mut().enumerate() {
        *b = fill(i);
    }
    c.end_access(r.id, DeviceId::CPU, 0, r.size, AccessMode::Write)
        .unwrap();
    r.id
}

fn present(c: &Connection, region: RegionId, capture_ns: u64) -> u64 {
    c.command_with_access(&Present {
        frame: region,
        capture_ns,
    })
    .expect("present")
    .frame_id
}

fn stats(c: &Connection) -> StatsReply {
    c.command(&Stats {}).expect("stats")
}

/// Waits (bounded) for the next vsync, with a fence the display signals at vsync.
fn wait_vsync(c: &Connection) {
    let f: Fence = c.fence_create().unwrap();
    c.command(&SignalAtVsync { fence: f.to_u64() })
        .expect("signal_at_vsync");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !c.fence_signaled(f).unwrap() {
        assert!(Instant::now() < deadline, "no vsync within 20 s");
        std::thread::sleep(Duration::from_millis(1));
    }
    c.fence_release(f).unwrap();
}

fn status_of<T: std::fmt::Debug>(r: virtsoc_guest::Result<T>) -> Status {
    r.expect_err("the command should fail").status()
}

fn now_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// Width and height from a PNG's IHDR chunk, after checking the signature.
fn png_size(bytes: &[u8]) -> (u32, u32) {
    assert!(bytes.len() > 33, "{} bytes is no PNG", bytes.len());
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "PNG signature");
    assert_eq!(&bytes[12..16], b"IHDR");
    let be = |o: usize| u32::from_be_bytes(bytes[o..o + 4].try_into().unwrap());
    (be(16), be(20))
}

#[test]
fn presents_are_counted_and_snapshots_written() {
    let dir = snapshot_dir("count");
    let d = start(&dir);
    let c = connect(&d);
    assert_eq!(
        status_of(c.command(&Snapshot {})),
        Status::Busy,
        "nothing on screen yet"
    );
    assert_eq!(
        stats(&c),
        StatsReply::default(),
        "a fresh guest has no counters"
    );

    let (w, h) = (64, 48);
    let regions: Vec<RegionId> = (0..6u8)
        .map(|k| frame(&c, w, h, Format::Rgba8, move |i| (i as u8) ^ k))
        .collect();
    let mut ids = Vec::new();
    for r in &regions {
        ids.push(present(&c, *r, now_ns()));
    }
    assert!(ids.windows(2).all(|p| p[1] > p[0]), "fresh ids: {ids:?}");
    wait_vsync(&c);
    wait_vsync(&c);
    let s = stats(&c);
    assert_eq!(s.presented + s.dropped, 6, "{s:?}");
    assert!(s.presented >= 1, "{s:?}");
    assert!(s.vsyncs >= 2, "{s:?}");
    assert_eq!(
        s.samples, s.presented,
        "every frame had a capture time: {s:?}"
    );
    assert!(s.latency_p50_ns <= s.latency_p99_ns, "{s:?}");

    // The last frame presented is the one on screen.
    let shot = c.command(&Snapshot {}).expect("snapshot").frame_id;
    assert_eq!(shot, *ids.last().unwrap());
    let png = std::fs::read(dir.join(format!("virtsoc-display-{shot}.png"))).expect("png file");
    assert_eq!(png_size(&png), (w, h));

    // A frame without a capture time adds no latency sample.
    let before = stats(&c);
    present(&c, regions[0], 0);
    wait_vsync(&c);
    wait_vsync(&c);
    let after = stats(&c);
    assert_eq!(after.presented + after.dropped, 7, "{after:?}");
    assert_eq!(after.samples, before.samples, "{after:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_inputs_are_refused() {
    let dir = snapshot_dir("bad");
    let d = start(&dir);
    let c = connect(&d);
    let nv12 = frame(&c, 64, 64, Format::Nv12, |_| 128);
    assert_eq!(
        status_of(c.command_with_access(&Present {
            frame: nv12,
            capture_ns: 0
        })),
        Status::NotSupported
    );
    let blob = c.alloc_blob(4096).unwrap().id;
    assert_eq!(
        status_of(c.command_with_access(&Present {
            frame: blob,
            capture_ns: 0
        })),
        Status::NotSupported
    );
    assert_eq!(
        status_of(c.command(&SignalAtVsync {
            fence: 0x7777_0000_0123
        })),
        Status::BadArgument,
        "unknown fence"
    );
    // Nothing of that reached the screen or the counters.
    let s = stats(&c);
    assert_eq!((s.presented, s.dropped), (0, 0), "{s:?}");
    assert_eq!(status_of(c.command(&Snapshot {})), Status::Busy);
    // The daemon is fine afterwards.
    let ok = frame(&c, 16, 16, Format::Bgra8, |i| i as u8);
    present(&c, ok, 0);
    wait_vsync(&c);
    wait_vsync(&c);
    assert_eq!(stats(&c).presented, 1);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn guests_share_the_screen() {
    let dir = snapshot_dir("share");
    let d = start(&dir);
    let a = connect(&d);
    let b = connect(&d);
    let fa = frame(&a, 32, 32, Format::Rgba8, |_| 10);
    let fb = frame(&b, 40, 24, Format::Rgba8, |_| 200);
    let shown = present(&a, fa, 0);
    present(&b, fb, 0);
    wait_vsync(&a);
    wait_vsync(&b);
    let (sa, sb) = (stats(&a), stats(&b));
    assert_eq!((sa.presented, sa.dropped), (1, 0), "foreground: {sa:?}");
    assert_eq!((sb.presented, sb.dropped), (0, 1), "background: {sb:?}");
    assert_eq!(b.command(&Snapshot {}).unwrap().frame_id, shown);

    // The foreground guest leaves: the other one gets the screen.
    a.close();
    drop(a);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let id = present(&b, fb, 0);
        wait_vsync(&b);
        wait_vsync(&b);
        if b.command(&Snapshot {}).unwrap().frame_id == id {
            break;
        }
        assert!(Instant::now() < deadline, "guest b never got the screen");
    }
    let pngs: Vec<Vec<u8>> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".png"))
        .map(|e| std::fs::read(e.path()).unwrap())
        .collect();
    assert!(
        pngs.iter().any(|p| png_size(p) == (40, 24)),
        "a snapshot of guest b's frame"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The display's `timing`: the vsync clock (a last vsync between two readings of the clock
/// around a vsync fence, the period of the refresh rate) and the guest's capture -> present
/// time over its frames that had a capture time (frames without one are not counted).
#[test]
fn timing_gives_the_vsync_clock_and_the_guests_ready_time() {
    use virtsoc_guest::devices::display::Timing;
    let dir = snapshot_dir("timing");
    let d = start(&dir);
    let c = connect(&d);
    let t = c.command(&Timing::default()).unwrap();
    assert_eq!((t.samples, t.ready_p90_ns, t.ready_max_ns), (0, 0, 0));
    assert_eq!(t.period_ns, 1_000_000_000 / 60);
    let f = frame(&c, 64, 48, Format::Rgba8, |i| i as u8);
    let before = now_ns();
    wait_vsync(&c);
    let t = c.command(&Timing::default()).unwrap();
    assert!(
        t.last_vsync_ns >= before && t.last_vsync_ns <= now_ns(),
        "{t:?}"
    );
    // Frames presented 5 ms after their capture time, and one 40 ms after: ready times of at
    // least 5 ms, the largest at least 40 ms.
    for k in 0..10 {
        let late = if k == 4 { 40_000_000 } else { 5_000_000 };
        present(&c, f, now_ns() - late);
        wait_vsync(&c);
    }
    present(&c, f, 0);
    let t = c.command(&Timing::default()).unwrap();
    assert_eq!(t.samples, 10, "{t:?}");
    assert!(t.ready_p90_ns >= 5_000_000, "{t:?}");
    assert!(
        t.ready_max_ns >= 40_000_000 && t.ready_max_ns >= t.ready_p90_ns,
        "{t:?}"
    );
    drop(c);
    drop(d);
    let _ = std::fs::remove_dir_all(&dir);
}
