//! `virtsoc bench isolation`: what one hostile guest does to a well-behaved one (issue 10's
//! target: the victim within 20% of its numbers alone).
//!
//! One daemon of its own (default backends: wgpu GPU, swscale ISP; a 1280x720 display) serves
//! a victim guest alone, then next to each kind of hostile guest in turn, one row each. The
//! victim, measured the same way in every row, runs two workloads one after the other:
//! - **SVM access**: a write -> read pipeline under the prefetch protocol (`virtsoc bench
//!   svm`'s: the producer writes a 1 MiB buffer, 2 ms later the consumer reads and checksums
//!   it, 4 buffers in turn): the p50 of the consumer's begin_access on the host;
//! - **camera**: the `camera` scenario (`virtsoc run camera`: camera -> ISP -> GPU/display
//!   planes -> display, prefetch, fences) at 720p and 30 fps: its presented frames per second.
//!
//! The hostile kinds (each a thread of this process; the soak's roles are reused as they are):
//! - `prefetch-abuser`: writes its buffers with one device and reads them with the others in
//!   turn (consumer, consumer2, CPU) under the prefetch protocol, as fast as it can;
//! - `composite-64x4096`: 64-layer 4096x4096 GPU composites, back to back (over the per-command
//!   cost budget: refused);
//! - `composite-3x4096`: the largest composite the budget lets through (three 4096x4096
//!   layers), back to back;
//! - `region-flood`: allocates 4 KiB regions until refused, frees them, again;
//! - `fence-flood`: creates fences until refused, releases them, again;
//! - `queue-flood`: queues 200 checksums behind a fence wait on the consumer, releases the
//!   fence from the producer, again;
//! - `snapshot-spam`: display snapshots back to back;
//! - `handshake-trickle`: 300 connections trickling a hello a byte every 200 ms (re-opened
//!   when the daemon cuts them off);
//! - `misuse` and `crashing`: the soak's hostile role (malformed ring entries, other guests'
//!   ids, fence misuse; 2 guests) and crashing role (children killed mid-access; 2 guests).
//!
//! Each row: the victim's workloads run alone, then the hostile guest starts, runs 1 s, the
//! victim's workloads run again, the hostile guest stops. The victim's numbers next to the
//! hostile guest are given as a percentage of its numbers alone just before (paired, so that
//! a drift of the machine's load over the run is not blamed on a hostile guest); the check is
//! the issue's: access p50 at most 120% and camera fps at least 80% of alone. One run, one
//! machine: on a shared machine the numbers move with its load.

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use serde::Serialize;
use virtsoc_guest::devices::{display, gpu, LayerRecord};
use virtsoc_guest::{
    testdev, AccessMode, ConnectOptions, Connection, DeviceId, Format, GuestError, Opcode,
};

use crate::bench_svm::{self, Consumer, OrderingMode, SlackPattern, SvmBenchParams};
use crate::daemon_proc::DaemonProcess;
use crate::scenario::{self, full_layer, show::Composition, RunOpts};
use crate::soak::Background;
use crate::CliError;

/// Every hostile kind, in the order of the table.
pub const KINDS: [&str; 10] = [
    "prefetch-abuser",
    "composite-64x4096",
    "composite-3x4096",
    "region-flood",
    "fence-flood",
    "queue-flood",
    "snapshot-spam",
    "handshake-trickle",
    "misuse",
    "crashing",
];

/// The victim may lose at most this fraction of its alone-numbers.
const TOLERANCE: f64 = 0.20;
/// Bytes of the victim's SVM buffers.
const SVM_SIZE: u64 = 1 << 20;

/// What to run.
#[derive(Debug, Clone)]
pub struct IsolationParams {
    /// Seconds of the victim's camera scenario per row.
    pub seconds: f64,
    /// Frames of the victim's SVM pipeline per row.
    pub frames: usize,
    /// Hostile kinds (default: all of [`KINDS`]).
    pub kinds: Vec<String>,
}

/// The victim's numbers in one row.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// The hostile kind.
    pub hostile: String,
    /// The victim alone just before: access p50 (us) and camera fps.
    pub alone_access_p50_us: f64,
    pub alone_camera_fps: f64,
    /// p50 of the victim's read begin_access (host side) next to the hostile guest, us.
    pub access_p50_us: f64,
    pub access_pct_of_alone: f64,
    /// Frames the display presented for the victim's camera scenario, per second.
    pub camera_fps: f64,
    pub fps_pct_of_alone: f64,
    /// Within the tolerance.
    pub ok: bool,
    /// What the hostile guest did: operations (requests, sessions, connections).
    pub hostile_ops: u64,
    /// Of those, refused by the daemon (a status, a cut-off connection).
    pub hostile_refused: u64,
    /// The first refusal's status and reason.
    pub hostile_refusal: Option<String>,
    /// Frames of the victim's SVM pipeline whose read checksum differed (must be 0).
    pub victim_corrupt: usize,
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct IsolationReport {
    pub seconds: f64,
    pub frames: usize,
    pub tolerance_pct: f64,
    pub rows: Vec<Row>,
    pub all_ok: bool,
}

/// Counters of a hostile guest.
#[derive(Default)]
struct Tally {
    ops: AtomicU64,
    refused: AtomicU64,
    first: std::sync::Mutex<Option<String>>,
}

impl Tally {
    fn op<T>(&self, r: Result<T, GuestError>) -> Result<Option<T>, CliError> {
        self.ops.fetch_add(1, Ordering::Relaxed);
        match r {
            Ok(v) => Ok(Some(v)),
            Err(e @ (GuestError::Status { .. } | GuestError::BadArgument(_))) => {
                self.refused.fetch_add(1, Ordering::Relaxed);
                self.first
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get_or_insert_with(|| e.to_string());
                Ok(None)
            }
            Err(e) => Err(e.into()),
        }
    }
}

/// Runs the benchmark.
pub fn run(p: &IsolationParams) -> Result<IsolationReport, CliError> {
    let kinds: Vec<String> = if p.kinds.is_empty() {
        KINDS.iter().map(|k| k.to_string()).collect()
    } else {
        p.kinds.clone()
    };
    if let Some(k) = kinds.iter().find(|k| !KINDS.contains(&k.as_str())) {
        return Err(CliError::Usage(format!(
            "unknown hostile kind {k} (kinds: {})",
            KINDS.join(", ")
        )));
    }
    let snapshots = std::env::temp_dir().join(format!("virtsoc-isolation-{}", std::process::id()));
    std::fs::create_dir_all(&snapshots)?;
    let dir = snapshots.display().to_string();
    let d = DaemonProcess::spawn(
        &[
            "--display-size",
            "1280x720",
            "--max-guests",
            "512",
            "--snapshot-dir",
            &dir,
        ],
        false,
    )?;
    let ep = d.endpoint();
    let r = rows(&ep.target, ep.pid, p, &kinds);
    d.stop()?;
    let _ = std::fs::remove_dir_all(&snapshots);
    let rows = r?;
    Ok(IsolationReport {
        seconds: p.seconds,
        frames: p.frames,
        tolerance_pct: TOLERANCE * 100.0,
        all_ok: rows.iter().all(|r| r.ok),
        rows,
    })
}

fn rows(
    target: &str,
    pid: Option<u32>,
    p: &IsolationParams,
    kinds: &[String],
) -> Result<Vec<Row>, CliError> {
    // A first camera run warms the devices up (GPU pipelines, ISP scalers); not measured.
    camera(target, pid, 1.0)?;
    let mut rows = Vec::new();
    // A row takes about 3 x seconds plus the SVM frames; a daemon that stops answering (a
    // device thread gone) would otherwise hang the victim's waits forever.
    let limit = Duration::from_secs_f64(p.seconds * 6.0 + p.frames as f64 * 0.05 + 120.0);
    for kind in kinds {
        let (done, watch) = std::sync::mpsc::channel::<()>();
        let watchdog = watchdog(kind.clone(), pid, limit, watch);
        eprintln!("bench isolation: victim alone, then next to {kind}");
        let (alone_us, alone_fps, alone_corrupt) = victim(target, pid, p)?;
        let tally = Tally::default();
        let stop = AtomicBool::new(false);
        // The soak's roles run as they are; the other kinds are a thread here.
        let background = match kind.as_str() {
            "misuse" => Some(Background::start(target, "hostile", 2)?),
            "crashing" => Some(Background::start(target, "crashing", 2)?),
            _ => None,
        };
        let measured = std::thread::scope(|s| {
            let thread = background
                .is_none()
                .then(|| s.spawn(|| hostile(kind, target, &stop, &tally)));
            std::thread::sleep(Duration::from_secs(1));
            let measured = victim(target, pid, p);
            stop.store(true, Ordering::Relaxed);
            if let Some(h) = thread {
                match h.join() {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => eprintln!("bench isolation: {kind} ended early: {e}"),
                    Err(_) => eprintln!("bench isolation: {kind} panicked"),
                }
            }
            measured
        });
        let (mut ops, mut refused) = (
            tally.ops.load(Ordering::Relaxed),
            tally.refused.load(Ordering::Relaxed),
        );
        if let Some(b) = background {
            let t = b.stop();
            if t.requests > 0 {
                // Misuses sent, and those refused (every one should be).
                (ops, refused) = (t.requests, t.requests - t.accepted.min(t.requests));
            } else {
                (ops, refused) = (t.rounds, 0);
            }
            if t.failures > 0 {
                eprintln!("bench isolation: {kind}: {} guest failures", t.failures);
            }
        }
        let (us, fps, corrupt) = measured?;
        let corrupt = corrupt + alone_corrupt;
        let access_pct = pct(us, alone_us);
        let fps_pct = pct(fps, alone_fps);
        rows.push(Row {
            hostile: kind.clone(),
            alone_access_p50_us: alone_us,
            alone_camera_fps: alone_fps,
            access_p50_us: us,
            access_pct_of_alone: access_pct,
            camera_fps: fps,
            fps_pct_of_alone: fps_pct,
            ok: access_pct <= (1.0 + TOLERANCE) * 100.0
                && fps_pct >= (1.0 - TOLERANCE) * 100.0
                && corrupt == 0,
            hostile_ops: ops,
            hostile_refused: refused,
            hostile_refusal: tally.first.into_inner().unwrap_or_else(|p| p.into_inner()),
            victim_corrupt: corrupt,
        });
        drop(done);
        let _ = watchdog.join();
    }
    Ok(rows)
}

/// Ends the benchmark (and its daemon) if the row of `kind` is not done within `limit`: its
/// end is signaled by dropping the sender of `done`.
fn watchdog(
    kind: String,
    pid: Option<u32>,
    limit: Duration,
    done: std::sync::mpsc::Receiver<()>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = done.recv_timeout(limit) {
            eprintln!(
                "bench isolation: the row of {kind} took over {limit:?}: the daemon stopped \
                 answering the victim (see its log above); ending"
            );
            if let Some(pid) = pid.and_then(|p| rustix::process::Pid::from_raw(p as i32)) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
            }
            std::process::exit(2);
        }
    })
}

fn pct(v: f64, alone: f64) -> f64 {
    if alone > 0.0 {
        v / alone * 100.0
    } else {
        0.0
    }
}

/// The victim's two workloads: (access p50 us, camera fps, corrupt SVM frames).
fn victim(
    target: &str,
    pid: Option<u32>,
    p: &IsolationParams,
) -> Result<(f64, f64, usize), CliError> {
    let svm = bench_svm::run(
        target,
        &SvmBenchParams {
            protocols: vec!["prefetch".into()],
            orderings: vec![OrderingMode::Atomic],
            size: SVM_SIZE,
            slack: Duration::from_millis(2),
            pattern: SlackPattern::Fixed,
            frames: p.frames,
            buffers: 4,
            warmup: 20,
            readers: 1,
            switch_every: None,
            consumer: Consumer::Checksum,
        },
    )?;
    let r = svm
        .protocols
        .first()
        .ok_or_else(|| CliError::Usage("bench svm returned no result".into()))?;
    let fps = camera(target, pid, p.seconds)?;
    Ok((r.access_latency_us.p50, fps, r.corrupt_frames))
}

/// The camera scenario at 720p, 30 fps: presented frames per second.
fn camera(target: &str, pid: Option<u32>, seconds: f64) -> Result<f64, CliError> {
    let r = scenario::run(
        target,
        pid,
        &RunOpts {
            scenario: "camera".into(),
            protocol: "prefetch".into(),
            ordering: OrderingMode::Fence,
            seconds,
            width: 1280,
            height: 720,
            fps: 30,
            composition: Composition::Planes,
            pacing: crate::scenario::Pacing::default(),
        },
    )?;
    Ok(r.presented_fps)
}

/// A hostile guest's connection.
fn open(target: &str, name: &str, window: u64, coherence: &str) -> Result<Connection, CliError> {
    Ok(Connection::open(
        target,
        &ConnectOptions {
            name: name.into(),
            window_size: window,
            coherence: Some(coherence.into()),
            ..ConnectOptions::default()
        },
    )?)
}

/// Runs hostile guest `kind` until `stop`.
fn hostile(kind: &str, target: &str, stop: &AtomicBool, t: &Tally) -> Result<(), CliError> {
    let name = format!("hostile-{kind}");
    match kind {
        "prefetch-abuser" => prefetch_abuser(target, &name, stop, t),
        "composite-64x4096" => composite(target, &name, 64, stop, t),
        "composite-3x4096" => composite(target, &name, 3, stop, t),
        "region-flood" => {
            let c = open(target, &name, 64 << 20, "write-invalidate")?;
            while !stop.load(Ordering::Relaxed) {
                let mut held = Vec::new();
                while held.len() < 1 << 17 && !stop.load(Ordering::Relaxed) {
                    match t.op(c.alloc_blob(4096))? {
                        Some(r) => held.push(r.id),
                        None => break,
                    }
                }
                for id in held {
                    t.op(c.free(id))?;
                }
            }
            Ok(())
        }
        "fence-flood" => {
            let c = open(target, &name, 16 << 20, "write-invalidate")?;
            while !stop.load(Ordering::Relaxed) {
                let mut held = Vec::new();
                while held.len() < 1 << 17 && !stop.load(Ordering::Relaxed) {
                    match t.op(c.fence_create())? {
                        Some(f) => held.push(f),
                        None => break,
                    }
                }
                for f in held {
                    t.op(c.fence_release(f))?;
                }
            }
            Ok(())
        }
        "queue-flood" => queue_flood(target, &name, stop, t),
        "snapshot-spam" => {
            let c = open(target, &name, 16 << 20, "write-invalidate")?;
            while !stop.load(Ordering::Relaxed) {
                t.op(c.command(&display::Snapshot::default()))?;
            }
            Ok(())
        }
        "handshake-trickle" => trickle(target, stop, t),
        other => Err(CliError::Usage(format!("unknown hostile kind {other}"))),
    }
}

/// Writes with the producer, reads with the consumer, the second consumer and the CPU in
/// turn, on 4 buffers of 1 MiB, without pause.
fn prefetch_abuser(target: &str, name: &str, stop: &AtomicBool, t: &Tally) -> Result<(), CliError> {
    let c = open(target, name, 64 << 20, "prefetch")?;
    let ring: Vec<u64> = (0..4)
        .map(|_| c.alloc_blob(SVM_SIZE).map(|r| r.id))
        .collect::<Result<_, _>>()?;
    let readers = [DeviceId::CONSUMER, DeviceId::CONSUMER2, DeviceId::CPU];
    let (w, r) = (AccessMode::Write, AccessMode::Read);
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let id = ring[i as usize % ring.len()];
        t.op(c.begin_access(id, DeviceId::PRODUCER, 0, SVM_SIZE, w))?;
        t.op(c.device_cmd(DeviceId::PRODUCER, [testdev::WRITE_PATTERN, id, i, 0, 0, 0]))?;
        t.op(c.end_access(id, DeviceId::PRODUCER, 0, SVM_SIZE, w))?;
        // A different reader each time: no flow the predictor learns holds for long.
        let dev = readers[(i as usize / ring.len() + i as usize) % readers.len()];
        t.op(c.begin_access(id, dev, 0, SVM_SIZE, r))?;
        if dev != DeviceId::CPU {
            t.op(c.device_cmd(dev, [testdev::CHECKSUM, id, 0, 0, 0, 0]))?;
        }
        t.op(c.end_access(id, dev, 0, SVM_SIZE, r))?;
        i += 1;
    }
    Ok(())
}

/// `layers` full layers of a 4096x4096 source composited into a 4096x4096 target, back to
/// back.
fn composite(
    target: &str,
    name: &str,
    layers: usize,
    stop: &AtomicBool,
    t: &Tally,
) -> Result<(), CliError> {
    const SIDE: u32 = 4096;
    let bytes = SIDE as u64 * SIDE as u64 * 4;
    let c = open(target, name, 2 * bytes + (64 << 20), "write-invalidate")?;
    let src = c.alloc(0, SIDE, SIDE, Format::Rgba8, 0)?;
    let dst = c.alloc(0, SIDE, SIDE, Format::Rgba8, 0)?;
    let records: Vec<LayerRecord> = (0..layers)
        .map(|_| full_layer(src.id, SIDE, SIDE, true))
        .collect();
    let blob: Vec<u8> = records.iter().flat_map(|l| l.to_bytes()).collect();
    let b = c.alloc_blob(blob.len() as u64)?;
    let n = blob.len() as u64;
    let a = c.begin_access(b.id, DeviceId::CPU, 0, n, AccessMode::Write)?;
    let ptr = a
        .ptr
        .ok_or_else(|| CliError::Usage("no CPU pointer".into()))?;
    // SAFETY: the window maps `n` bytes at `ptr` until end_access.
    unsafe { std::ptr::copy_nonoverlapping(blob.as_ptr(), ptr.as_ptr(), blob.len()) };
    c.end_access(b.id, DeviceId::CPU, 0, n, AccessMode::Write)?;
    // The layers' source is read by the GPU for as long as the guest composites.
    c.begin_access(src.id, gpu::ID, 0, src.size, AccessMode::Read)?;
    while !stop.load(Ordering::Relaxed) {
        t.op(c.command_with_access(&gpu::Composite {
            layers: b.id,
            count: layers as u64,
            dst: dst.id,
        }))?;
    }
    c.end_access(src.id, gpu::ID, 0, src.size, AccessMode::Read)?;
    Ok(())
}

/// 200 checksums queued on the consumer behind a fence wait whose fence the producer
/// signals after writing 16 MiB; again. (The fence is signaled by queued work: the guest
/// library's flow control may hold a submission until earlier ones complete, so a fence
/// only the guest would signal later could block the guest itself.)
fn queue_flood(target: &str, name: &str, stop: &AtomicBool, t: &Tally) -> Result<(), CliError> {
    const BIG: u64 = 16 << 20;
    let c = open(target, name, 64 << 20, "write-invalidate")?;
    let r = c.alloc_blob(4096)?;
    let big = c.alloc_blob(BIG)?;
    c.begin_access(r.id, DeviceId::CONSUMER, 0, 4096, AccessMode::Read)?;
    c.begin_access(big.id, DeviceId::PRODUCER, 0, BIG, AccessMode::Write)?;
    let mut i = 0;
    while !stop.load(Ordering::Relaxed) {
        let f = c.fence_create()?;
        c.submit_detached(
            Opcode::DeviceCmd,
            DeviceId::PRODUCER,
            [testdev::WRITE_PATTERN, big.id, i, 0, 0, 0],
        )?;
        c.fence_signal(DeviceId::PRODUCER, f)?;
        c.fence_wait(DeviceId::CONSUMER, f)?;
        for _ in 0..200 {
            t.op(c.submit_detached(
                Opcode::DeviceCmd,
                DeviceId::CONSUMER,
                [testdev::CHECKSUM, r.id, 0, 0, 0, 0],
            ))?;
        }
        c.drain()?;
        let refused = c.take_async_errors().len() as u64;
        t.refused.fetch_add(refused, Ordering::Relaxed);
        c.fence_release(f)?;
        i += 1;
    }
    c.end_access(big.id, DeviceId::PRODUCER, 0, BIG, AccessMode::Write)?;
    c.end_access(r.id, DeviceId::CONSUMER, 0, 4096, AccessMode::Read)?;
    Ok(())
}

/// 300 connections announcing a 1000-byte hello and sending a byte of it every 200 ms; one
/// the daemon cut off is opened again.
fn trickle(target: &str, stop: &AtomicBool, t: &Tally) -> Result<(), CliError> {
    let connect = || -> Option<UnixStream> {
        t.ops.fetch_add(1, Ordering::Relaxed);
        let mut s = UnixStream::connect(target).ok()?;
        s.write_all(&1000u32.to_le_bytes()).ok()?;
        s.write_all(b"{").ok()?;
        Some(s)
    };
    let mut socks: Vec<Option<UnixStream>> = (0..300).map(|_| connect()).collect();
    while !stop.load(Ordering::Relaxed) {
        for slot in socks.iter_mut() {
            use rustix::net::SendFlags;
            let sent = slot
                .as_ref()
                .map(|s| rustix::net::send(s, b" ", SendFlags::DONTWAIT | SendFlags::NOSIGNAL));
            if !matches!(sent, Some(Ok(_))) {
                // Cut off (or never connected): the daemon refused it; try again.
                t.refused.fetch_add(1, Ordering::Relaxed);
                *slot = connect();
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(())
}

/// Prints the report as a table.
pub fn print_table(r: &IsolationReport) {
    println!(
        "Isolation: a victim guest (SVM write->read access p50 under prefetch, 1 MiB; camera \
         scenario 720p30 presented fps, {:.0} s) alone, then next to each hostile guest; check: \
         within {:.0}% of alone",
        r.seconds, r.tolerance_pct
    );
    println!(
        "{:<18} {:>8} {:>8} {:>6} {:>7} {:>7} {:>6} {:>9} {:>9} {:>6}",
        "hostile", "alone us", "with us", "%", "alone fps", "with", "%", "ops", "refused", "check"
    );
    for row in &r.rows {
        println!(
            "{:<18} {:>8.2} {:>8.2} {:>6.0} {:>7.1} {:>7.1} {:>6.0} {:>9} {:>9} {:>6}",
            row.hostile,
            row.alone_access_p50_us,
            row.access_p50_us,
            row.access_pct_of_alone,
            row.alone_camera_fps,
            row.camera_fps,
            row.fps_pct_of_alone,
            row.hostile_ops,
            row.hostile_refused,
            if row.ok { "ok" } else { "FAIL" }
        );
    }
    for row in r.rows.iter().filter(|r| r.hostile_refusal.is_some()) {
        println!(
            "{}: first refusal: {}",
            row.hostile,
            row.hostile_refusal.as_deref().unwrap_or("")
        );
    }
    println!(
        "all within {:.0}%: {}",
        r.tolerance_pct,
        if r.all_ok { "yes" } else { "no" }
    );
}
