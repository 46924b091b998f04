//! The swscale ISP in a worker process: the same bytes as in process for every format pair
//! and several sizes and strides, a worker that crashes or hangs mid-conversion fails that
//! conversion only (the next takes a fresh worker), and a worker answering something
//! malformed is refused.
//!
//! The workers are this test binary run again with one of the `*_main` filters and a socket
//! as stdin: each serves then (a real swscale worker, one that crashes or hangs on demand,
//! or a hostile one speaking the protocol wrongly) and passes trivially otherwise.

mod common;

use std::io::{Read, Write};
use std::os::fd::FromRawFd;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use virtsoc_media::isp::{serve_isp, serve_isp_with};
use virtsoc_media::worker_processes;
use virtsoc_media::{
    FrameLayout, FrameMut, FrameRef, IspBackend, MediaError, PixelFormat, ProcessIsp, SwscaleIsp,
    WorkerPool, CALL_DEADLINE,
};

/// Source width at which the faulty worker crashes mid-conversion.
const CRASH_WIDTH: u32 = 66;
/// Source width at which the faulty worker hangs.
const HANG_WIDTH: u32 = 70;

#[test]
fn worker_main() {
    if common::stdin_is_socket() {
        common::exit_with(serve_isp());
    }
}

/// Swscale, but crashing or hanging on the marked source widths, in the middle of a
/// conversion as a fault in libswscale would.
struct Faulty(SwscaleIsp);

impl IspBackend for Faulty {
    fn name(&self) -> &str {
        "faulty"
    }
    fn convert(&self, src: FrameRef<'_>, dst: FrameMut<'_>) -> virtsoc_media::Result<()> {
        match src.layout.width {
            CRASH_WIDTH => std::process::abort(),
            HANG_WIDTH => loop {
                std::thread::sleep(Duration::from_secs(60));
            },
            _ => self.0.convert(src, dst),
        }
    }
}

#[test]
fn faulty_worker_main() {
    if common::stdin_is_socket() {
        common::exit_with(serve_isp_with(&Faulty(SwscaleIsp::new())));
    }
}

/// A compromised worker: reads each call and answers `answer(call)` raw (length prefix
/// included), or hangs up when that is `None`.
fn hostile(answer: impl Fn(&[u8]) -> Option<Vec<u8>>) -> ! {
    // SAFETY: the parent made stdin this process's socket; nothing else here uses fd 0.
    let mut sock = unsafe { UnixStream::from_raw_fd(0) };
    loop {
        let mut len = [0u8; 8];
        if sock.read_exact(&mut len).is_err() {
            std::process::exit(0);
        }
        let mut call = vec![0u8; u64::from_le_bytes(len) as usize];
        if sock.read_exact(&mut call).is_err() {
            std::process::exit(0);
        }
        match answer(&call) {
            Some(a) => {
                let _ = sock.write_all(&a);
            }
            None => std::process::exit(0),
        }
    }
}

/// A well-formed success answer for a destination of `w`x`h` (`fmt`, `stride`) and `bytes`.
fn success(fmt: u8, w: u32, h: u32, stride: u32, bytes: u64) -> Vec<u8> {
    let mut body = vec![0u8, fmt];
    for v in [w, h, stride] {
        body.extend(v.to_le_bytes());
    }
    body.extend(bytes.to_le_bytes());
    let mut m = (body.len() as u64).to_le_bytes().to_vec();
    m.extend(body);
    m
}

/// The destination layout of a call: op, source (format, width, height, stride), then the
/// destination's.
fn dst_of(call: &[u8]) -> (u8, u32, u32, u32) {
    let u = |at: usize| u32::from_le_bytes(call[at..at + 4].try_into().unwrap());
    (call[14], u(15), u(19), u(23))
}

#[test]
fn hostile_wrong_size_main() {
    if common::stdin_is_socket() {
        hostile(|call| {
            let (f, w, h, s) = dst_of(call);
            // Claims a frame two rows taller than asked.
            Some(success(f, w, h + 2, s, u64::from(s) * u64::from(h + 2)))
        });
    }
}

#[test]
fn hostile_byte_count_main() {
    if common::stdin_is_socket() {
        hostile(|call| {
            let (f, w, h, s) = dst_of(call);
            Some(success(f, w, h, s, 7))
        });
    }
}

#[test]
fn hostile_truncated_main() {
    if common::stdin_is_socket() {
        hostile(|call| {
            let (f, w, h, s) = dst_of(call);
            let a = success(f, w, h, s, 0);
            // The length of the whole answer, then half of it, then nothing.
            Some(a[..a.len() / 2].to_vec())
        });
    }
}

#[test]
fn hostile_huge_main() {
    if common::stdin_is_socket() {
        hostile(|_| Some((1u64 << 40).to_le_bytes().to_vec()));
    }
}

#[test]
fn hostile_silent_main() {
    if common::stdin_is_socket() {
        hostile(|_| None);
    }
}

fn pool(entry: &str, spare: usize) -> Arc<WorkerPool> {
    let exe = std::env::current_exe().unwrap();
    let args: Vec<String> = ["--exact", entry, "--nocapture", "--test-threads", "1"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    WorkerPool::new(&exe, &args, spare)
}

/// A deterministic busy frame: every byte in use, so a wrong copy shows.
fn frame(layout: FrameLayout, seed: u32) -> Vec<u8> {
    let mut x = 0x2545_f491u32 ^ seed;
    (0..layout.size())
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x >> 8) as u8
        })
        .collect()
}

fn convert(isp: &dyn IspBackend, sl: FrameLayout, src: &[u8], dl: FrameLayout) -> Vec<u8> {
    let mut out = vec![0u8; dl.size()];
    isp.convert(
        FrameRef::new(sl, src).unwrap(),
        FrameMut::new(dl, &mut out).unwrap(),
    )
    .unwrap_or_else(|e| panic!("{sl:?} -> {dl:?}: {e}"));
    out
}

fn packed(f: PixelFormat, w: u32, h: u32) -> FrameLayout {
    FrameLayout::packed(f, w, h).unwrap()
}

#[test]
fn the_worker_converts_byte_for_byte_as_in_process() {
    use PixelFormat::*;
    let isp = ProcessIsp::new(pool("worker_main", 1));
    let local = SwscaleIsp::new();
    let strided = |f, w, h, s| FrameLayout::with_stride(f, w, h, s).unwrap();
    let cases = [
        (packed(Nv12, 1920, 1080), packed(Rgba8, 1920, 1080)),
        (packed(Nv12, 640, 480), packed(Bgra8, 320, 240)),
        (packed(Rgba8, 100, 60), packed(Nv12, 200, 120)),
        (packed(Yuv420p, 352, 288), packed(Nv12, 176, 144)),
        (strided(Bgra8, 130, 64, 600), packed(Yuv420p, 64, 32)),
        (packed(Nv12, 64, 32), strided(Rgba8, 64, 32, 300)),
        (packed(Bgra8, 48, 48), packed(Rgba8, 48, 48)),
        (packed(Yuv420p, 16, 8), packed(Yuv420p, 16, 8)),
        (packed(Nv12, 1280, 720), packed(Nv12, 1920, 1080)),
        (packed(Rgba8, 2, 2), packed(Nv12, 4, 2)),
    ];
    for (i, (sl, dl)) in cases.into_iter().enumerate() {
        let src = frame(sl, i as u32);
        let want = convert(&local, sl, &src, dl);
        let got = convert(&isp, sl, &src, dl);
        assert!(got == want, "{sl:?} -> {dl:?}: not the in-process bytes");
        // The same worker again, its buffers reused.
        assert!(
            convert(&isp, sl, &src, dl) == want,
            "{sl:?} -> {dl:?}: again"
        );
    }
    assert_eq!(
        isp.idle_pids().len(),
        1,
        "one worker served every conversion"
    );
}

fn nv12_to_rgba(isp: &dyn IspBackend, w: u32) -> virtsoc_media::Result<Vec<u8>> {
    let (sl, dl) = (
        packed(PixelFormat::Nv12, w, 32),
        packed(PixelFormat::Rgba8, 32, 16),
    );
    let src = frame(sl, w);
    let mut out = vec![0u8; dl.size()];
    isp.convert(
        FrameRef::new(sl, &src).unwrap(),
        FrameMut::new(dl, &mut out).unwrap(),
    )?;
    Ok(out)
}

fn assert_worker_error(r: virtsoc_media::Result<Vec<u8>>, what: &str) -> String {
    match r {
        Err(MediaError::Worker(why)) => {
            assert!(why.contains("swscale process"), "{what}: {why}");
            why
        }
        other => panic!("{what}: answered {:?}", other.map(|v| v.len())),
    }
}

#[test]
fn a_worker_crashing_or_hanging_mid_conversion_fails_that_conversion_only() {
    let isp = ProcessIsp::new(pool("faulty_worker_main", 1));
    let local = SwscaleIsp::new();
    let want = nv12_to_rgba(&local, 64).unwrap();
    assert!(nv12_to_rgba(&isp, 64).unwrap() == want);
    let first = isp.idle_pids();
    // A crash inside libswscale: that conversion fails, with the reason.
    let why = assert_worker_error(nv12_to_rgba(&isp, CRASH_WIDTH), "crash");
    assert!(why.contains("exited") || why.contains("signal"), "{why}");
    assert!(isp.idle_pids().is_empty(), "the dead worker is not kept");
    // The next conversion takes a fresh worker.
    assert!(nv12_to_rgba(&isp, 64).unwrap() == want);
    assert_ne!(isp.idle_pids(), first);
    // A hang: ended at the deadline (plus the conversion's allowance), then the same.
    let t = Instant::now();
    let why = assert_worker_error(nv12_to_rgba(&isp, HANG_WIDTH), "hang");
    let took = t.elapsed();
    assert!(why.contains("ended after"), "{why}");
    assert!(
        took >= CALL_DEADLINE && took < CALL_DEADLINE * 3,
        "{took:?}"
    );
    assert!(nv12_to_rgba(&isp, 64).unwrap() == want);
    // Workers killed between conversions (the idle one, the one waiting in the pool): the
    // next conversion does not even notice.
    let mut waiting = worker_processes(std::process::id(), "faulty_worker_main");
    for _ in 0..200 {
        if waiting.len() == 2 {
            break;
        }
        // The pool's thread is still starting its next worker.
        std::thread::sleep(Duration::from_millis(10));
        waiting = worker_processes(std::process::id(), "faulty_worker_main");
    }
    assert_eq!(
        waiting.len(),
        2,
        "the idle worker and the one waiting in the pool"
    );
    for pid in waiting {
        let killed = std::process::Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status()
            .unwrap();
        assert!(killed.success());
    }
    // Until they have exited, as their parent sees it (a dying worker the next conversion
    // caught would fail it: it died during that conversion, as far as anyone can tell).
    std::thread::sleep(Duration::from_millis(200));
    assert!(nv12_to_rgba(&isp, 64).unwrap() == want);
}

#[test]
fn hostile_answers_are_refused() {
    for entry in [
        "hostile_wrong_size_main",
        "hostile_byte_count_main",
        "hostile_truncated_main",
        "hostile_huge_main",
        "hostile_silent_main",
    ] {
        let isp = ProcessIsp::new(pool(entry, 0));
        for _ in 0..2 {
            assert_worker_error(nv12_to_rgba(&isp, 64), entry);
        }
        assert!(isp.idle_pids().is_empty(), "{entry}: no worker kept");
    }
}

#[test]
fn a_worker_that_cannot_start_is_a_resource_error() {
    let isp = ProcessIsp::new(WorkerPool::new(
        std::path::Path::new("/nonexistent/virtsocd"),
        &[],
        1,
    ));
    match nv12_to_rgba(&isp, 64) {
        Err(MediaError::Resources(why)) => assert!(why.contains("cannot start"), "{why}"),
        other => panic!("answered {:?}", other.map(|v| v.len())),
    }
}

/// A worker serves one tenant: another's conversions take a worker of their own, a tenant
/// keeps its worker between conversions, and a tenant that is gone takes its workers along.
#[test]
fn tenants_never_share_a_worker() {
    let isp = ProcessIsp::new(pool("worker_main", 1));
    let (sl, dl) = (
        packed(PixelFormat::Nv12, 64, 32),
        packed(PixelFormat::Rgba8, 32, 16),
    );
    let src = frame(sl, 1);
    let want = convert(&SwscaleIsp::new(), sl, &src, dl);
    let convert_for = |tenant| {
        let mut out = vec![0u8; dl.size()];
        isp.convert_for(
            tenant,
            FrameRef::new(sl, &src).unwrap(),
            FrameMut::new(dl, &mut out).unwrap(),
        )
        .unwrap();
        assert!(out == want, "tenant {tenant}");
    };
    convert_for(1);
    let first = isp.idle_pids();
    convert_for(2);
    let both = isp.idle_pids();
    assert_eq!(both.len(), 2, "a worker each");
    assert!(both.contains(&first[0]));
    for tenant in [1, 2, 1, 2] {
        convert_for(tenant);
    }
    let mut again = isp.idle_pids();
    let mut both = both;
    again.sort_unstable();
    both.sort_unstable();
    assert_eq!(again, both, "each kept its own");
    isp.forget(1);
    assert_eq!(isp.idle_pids().len(), 1);
    assert!(!isp.idle_pids().contains(&first[0]));
}

/// What a kept worker holds is charged to its tenant while it is kept: the charge covers
/// the process and both buffers, a refused charge fails the conversion (over the limit) and
/// keeps no worker, forgetting the tenant gives the charge back, and a worker left idle past
/// the idle timeout is ended by the reaper (its process gone, its charge given back).
#[test]
fn kept_workers_are_charged_and_reaped_when_idle() {
    use std::sync::atomic::{AtomicU64, Ordering};

    /// A tenant's charged bytes: each charge adds, its drop takes away.
    struct Held(Arc<AtomicU64>, u64);
    impl Drop for Held {
        fn drop(&mut self) {
            self.0.fetch_sub(self.1, Ordering::SeqCst);
        }
    }
    let held = Arc::new(AtomicU64::new(0));
    let limit = Arc::new(AtomicU64::new(u64::MAX));
    let charger = |bytes: u64| -> Result<virtsoc_media::Charge, virtsoc_media::ChargeError> {
        if held.load(Ordering::SeqCst) + bytes > limit.load(Ordering::SeqCst) {
            return Err("refused".into());
        }
        held.fetch_add(bytes, Ordering::SeqCst);
        Ok(Box::new(Held(held.clone(), bytes)))
    };
    let isp = ProcessIsp::with_idle_timeout(pool("worker_main", 0), Duration::from_millis(300));
    let (sl, dl) = (
        packed(PixelFormat::Nv12, 64, 32),
        packed(PixelFormat::Rgba8, 32, 16),
    );
    let src = frame(sl, 3);
    let run = |tenant| {
        let mut out = vec![0u8; dl.size()];
        isp.convert_charged(
            tenant,
            FrameRef::new(sl, &src).unwrap(),
            FrameMut::new(dl, &mut out).unwrap(),
            &charger,
        )
    };
    run(1).unwrap();
    let kept = held.load(Ordering::SeqCst);
    let least = virtsoc_media::WORKER_RESIDENT + (sl.size() + dl.size()) as u64;
    assert!(kept >= least, "charged {kept}, holds at least {least}");
    run(1).unwrap();
    assert_eq!(
        held.load(Ordering::SeqCst),
        kept,
        "one charge per kept worker"
    );
    isp.forget(1);
    assert_eq!(held.load(Ordering::SeqCst), 0, "forgotten: given back");

    // A limit below what a worker holds: refused, and nothing kept.
    limit.store(kept - 1, Ordering::SeqCst);
    match run(2) {
        Err(MediaError::OverLimit(_)) => {}
        other => panic!("expected OverLimit, got {other:?}"),
    }
    assert!(isp.idle_pids().is_empty());
    assert_eq!(held.load(Ordering::SeqCst), 0);

    // Reaped when idle: the process ends and the charge goes.
    limit.store(u64::MAX, Ordering::SeqCst);
    run(3).unwrap();
    let pid = isp.idle_pids()[0];
    let deadline = Instant::now() + Duration::from_secs(20);
    while !isp.idle_pids().is_empty() || held.load(Ordering::SeqCst) != 0 {
        assert!(Instant::now() < deadline, "an idle worker was not reaped");
        std::thread::sleep(Duration::from_millis(20));
    }
    let me = std::process::id();
    assert!(!worker_processes(me, "worker_main").contains(&pid));
}
