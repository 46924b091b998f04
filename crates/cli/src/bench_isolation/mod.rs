//! `virtsoc bench isolation`: what one hostile guest does to a well-behaved one (issue 10's
//! target: the victim within 20% of its numbers alone).
//!
//! One daemon of its own (default backends: wgpu GPU, swscale ISP; a 1280x720 display) serves
//! a victim guest alone and next to each kind of hostile guest in turn, one row each. The
//! victim, measured the same way in every row, runs three workloads:
//! - **SVM access**: a write -> read pipeline under the prefetch protocol (`virtsoc bench
//!   svm`'s: the producer writes a 1 MiB buffer, 2 ms later the consumer reads and checksums
//!   it, 4 buffers in turn, atomic ordering), on one connection kept for the row: the p50 of
//!   the consumer's begin_access on the host;
//! - **decode**: H.264 pictures of the cheap 640x360 clip decoded one at a time (decode, then
//!   receive_frame, on a decoder of one thread; `victim::CodecVictim`), on one connection
//!   and decoder kept for the row: the p50 and p99 of a picture's time from its decode's
//!   submission to its picture's answer; the p99 is checked for stalls only ([`STALL_MS`]),
//!   the p50 reported beside the check (not in it: next to a guest that keeps the cores
//!   busy, a decoder that needs a core's time is slower whoever schedules the codec, and 2
//!   cores make that a large share);
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
//! - `slow-decoder`: plays the realistic UHD clip (another size with
//!   `--slow-resolution`; CABAC, B-frames, 150 Mbit/s at UHD: tens of milliseconds
//!   a picture on 2 cores) with 4 pictures queued, as fast as its decoder goes: a guest that
//!   keeps the codec and the cores busy (until stop 49 its receives that waited for its
//!   worker held the codec's thread, and every other guest's codec commands, meanwhile);
//! - `slow-decoder-1`: the same on a decoder of one thread, whose every `decode` is a round
//!   trip to its worker (until stop 51 waited for on the codec's thread: see
//!   `host/src/device/codec/wait.rs`);
//! - `slow-encoder`: encodes 3840x2160 pictures of noise back to back (the same
//!   `--slow-resolution`), one at a time, with the daemon's H.264 encoder (until stop
//!   50 each encode held the codec's thread for the whole frame);
//! - `slow-isp`: converts 3840x2160 NV12 pictures into RGBA8 with the ISP (the same
//!   `--slow-resolution`), back to back, one at a time;
//! - `session-churn`: opens a decoder of one thread and closes it, again (each open takes
//!   a worker process from the daemon's pool, which starts its replacement);
//! - `misuse` and `crashing`: the soak's hostile role (malformed ring entries, other guests'
//!   ids, fence misuse; 2 guests) and crashing role (children killed mid-access; 2 guests).
//!
//! **How alone and next-to are compared.** The victim's access p50 is a few microseconds of
//! host CPU time on a cold cache (one access every few ms), and on a shared machine it moves
//! by 2x from one measurement to the next on its own (measured: 1.1 to 6.1 us alone within
//! one run, load average 7 on 2 cores); the first version of this benchmark (one alone
//! measurement, then one next to the hostile guest, a fresh victim connection each) failed
//! rows at random on that. So the two conditions are interleaved finely and compared in
//! pairs: the hostile guest starts and runs 1 s, then each row has rounds (one per second of
//! `--seconds`, at most 5), and each round
//! - alternates blocks of the victim's SVM frames alone and next to the guest (6 blocks of
//!   `--frames / rounds / 6` frames each way): before an alone block the guest is paused and
//!   has finished its operation under way (50 ms more of quiet), before a next-to block it
//!   runs again for 200 ms; each block is the SVM frames, then `DECODE_PICTURES` of the
//!   decoder's; a round's p50s (and the decoder's p99) are over its blocks' frames;
//! - then runs `--seconds / rounds` of camera alone (the guest paused) and next to it (after
//!   the guest ran again for 200 ms).
//!
//! "Paused" is a hostile guest that stays connected with whatever it holds (regions, fences,
//! handshakes under way) and sends nothing. The soak roles (`misuse`, `crashing`) cannot
//! pause: their guests are stopped for the alone half and started again for the next-to half
//! (after 1 s), one SVM block each way per round. A row's percentages are the medians over
//! its rounds of each round's next-to/alone ratio, and its alone/with columns the medians of
//! the rounds' values; every round's numbers are in the JSON report. The check is the
//! issue's: access p50 at most 120% and camera fps at least 80% of alone; and no stall: the
//! victim decoder's p99 at most [`STALL_MS`]. One run, one machine: on a shared machine the
//! numbers move with its load.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use serde::Serialize;
use virtsoc_guest::GuestError;

use crate::daemon_proc::DaemonProcess;
use crate::soak::Background;
use crate::stats::{median_or_zero, percentile};
use crate::CliError;

mod hostile;
mod table;
mod victim;
use hostile::hostile;
pub use table::print_table;
use victim::{camera, CodecVictim, SvmVictim};

/// Every hostile kind, in the order of the table.
pub const KINDS: [&str; 15] = [
    "prefetch-abuser",
    "composite-64x4096",
    "composite-3x4096",
    "region-flood",
    "fence-flood",
    "queue-flood",
    "snapshot-spam",
    "handshake-trickle",
    "slow-decoder",
    "slow-decoder-1",
    "slow-encoder",
    "slow-isp",
    "session-churn",
    "misuse",
    "crashing",
];

/// The victim may lose at most this fraction of its alone-numbers.
const TOLERANCE: f64 = 0.20;
/// Most the victim decoder's p99 may be next to a hostile guest (median of the rounds), ms:
/// its pictures take about 1 ms alone and up to 11 ms next to guests that keep both cores
/// busy (every round of every kind, stop 51); held behind another guest's 3840x2160 picture
/// (the codec's thread waiting for that guest's worker) they took 225-400 ms (stops
/// 48-50), behind another guest's worker starts 44-60 ms (stop 51).
const STALL_MS: f64 = 25.0;
/// Most alone/with rounds of a row (there is one per second of camera).
const MAX_ROUNDS: usize = 5;
/// Fewest SVM frames of one measurement when the row has several rounds.
const MIN_ROUND_FRAMES: usize = 60;
/// How long a hostile guest runs before the victim is measured next to it.
const WARM: Duration = Duration::from_secs(1);
/// Alone/with blocks of SVM frames per round, for a hostile guest that pauses quickly.
const BLOCKS: usize = 6;
/// How long a paused hostile guest runs again before the victim's next block next to it.
const RESUME: Duration = Duration::from_millis(200);
/// How long after a hostile guest went idle the victim's next alone block starts.
const QUIET: Duration = Duration::from_millis(50);
/// Bytes of the victim's SVM buffers.
const SVM_SIZE: u64 = 1 << 20;
/// Pictures of the victim's decoder per block (a picture takes about a millisecond alone).
const DECODE_PICTURES: usize = 20;

/// What to run.
#[derive(Debug, Clone)]
pub struct IsolationParams {
    /// Seconds of the victim's camera scenario per row.
    pub seconds: f64,
    /// Frames of the victim's SVM pipeline per row.
    pub frames: usize,
    /// Hostile kinds (default: all of [`KINDS`]).
    pub kinds: Vec<String>,
    /// The picture size of the `slow-decoder`'s clip and of the `slow-encoder`'s pictures.
    pub slow: (u32, u32),
}

/// The victim's numbers in one round: alone, then next to the hostile guest.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Round {
    /// Alone: p50 of the victim's read begin_access (host side), us.
    pub alone_access_p50_us: f64,
    /// Alone: frames the display presented for the victim's camera scenario, per second.
    pub alone_camera_fps: f64,
    /// Next to the hostile guest: access p50, us.
    pub access_p50_us: f64,
    /// Next to the hostile guest: camera fps.
    pub camera_fps: f64,
    /// Alone: p50 of the victim's picture times (decode submitted -> picture answered), ms.
    pub alone_decode_p50_ms: f64,
    /// Alone: p99 of the same, ms.
    pub alone_decode_p99_ms: f64,
    /// Next to the hostile guest: decode p50, ms.
    pub decode_p50_ms: f64,
    /// Next to the hostile guest: decode p99, ms.
    pub decode_p99_ms: f64,
}

/// The victim's numbers in one row (medians over its rounds).
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// The hostile kind.
    pub hostile: String,
    /// The victim alone: access p50 (us), the median of the rounds' alone values.
    pub alone_access_p50_us: f64,
    /// The victim alone: camera fps, the median of the rounds' alone values.
    pub alone_camera_fps: f64,
    /// p50 of the victim's read begin_access (host side) next to the hostile guest, us (the
    /// median of the rounds' values).
    pub access_p50_us: f64,
    /// The median over the rounds of access p50 next to the hostile guest / alone, %.
    pub access_pct_of_alone: f64,
    /// Frames the display presented for the victim's camera scenario, per second (the
    /// median of the rounds' values).
    pub camera_fps: f64,
    /// The median over the rounds of camera fps next to the hostile guest / alone, %.
    pub fps_pct_of_alone: f64,
    /// The victim alone: its pictures' p50 (ms), the median of the rounds' values.
    pub alone_decode_p50_ms: f64,
    /// Next to the hostile guest: its pictures' p50 (ms), the median of the rounds' values.
    pub decode_p50_ms: f64,
    /// The median over the rounds of decode p50 next to the hostile guest / alone, %
    /// (reported, not checked).
    pub decode_pct_of_alone: f64,
    /// The victim alone: its pictures' p99 (ms), the median of the rounds' values.
    pub alone_decode_p99_ms: f64,
    /// Next to the hostile guest: its pictures' p99 (ms), the median of the rounds' values
    /// (checked: at most [`STALL_MS`]).
    pub decode_p99_ms: f64,
    /// Within the tolerance, and no stall.
    pub ok: bool,
    /// `ok`, or `FAIL` and what is out of the tolerance.
    pub check: String,
    /// Every round's numbers, in order.
    pub rounds: Vec<Round>,
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
    /// Seconds of the victim's camera scenario per row and condition (over all rounds).
    pub seconds: f64,
    /// Frames of the victim's SVM pipeline per row and condition (over all rounds).
    pub frames: usize,
    /// Alone/with rounds per row.
    pub rounds: usize,
    /// Most the victim may lose, % of alone.
    pub tolerance_pct: f64,
    /// One row per hostile kind.
    pub rows: Vec<Row>,
    /// Every row within the tolerance, and no stall.
    pub all_ok: bool,
}

/// Counters of a hostile guest.
#[derive(Default)]
struct Tally {
    ops: AtomicU64,
    refused: AtomicU64,
    first: virtsoc_sync::Mutex<Option<String>>,
}

impl Tally {
    fn op<T>(&self, r: Result<T, GuestError>) -> Result<Option<T>, CliError> {
        self.ops.fetch_add(1, Ordering::Relaxed);
        match r {
            Ok(v) => Ok(Some(v)),
            Err(e @ (GuestError::Status { .. } | GuestError::BadArgument(_))) => {
                self.refused.fetch_add(1, Ordering::Relaxed);
                self.first.lock().get_or_insert_with(|| e.to_string());
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
    let plan = Plan::of(p);
    Ok(IsolationReport {
        seconds: plan.seconds * plan.rounds as f64,
        frames: plan.frames * plan.rounds,
        rounds: plan.rounds,
        tolerance_pct: TOLERANCE * 100.0,
        all_ok: rows.iter().all(|r| r.ok),
        rows,
    })
}

/// How a row is measured: `rounds` alone/with pairs, each half of a pair `frames` SVM frames
/// and `seconds` of camera.
#[derive(Debug, Clone, Copy)]
struct Plan {
    rounds: usize,
    frames: usize,
    seconds: f64,
}

impl Plan {
    /// One round per whole second of camera (1 to [`MAX_ROUNDS`]); the frames and seconds
    /// split evenly between them (at least [`MIN_ROUND_FRAMES`] frames a round when there
    /// are several).
    fn of(p: &IsolationParams) -> Plan {
        let rounds = (p.seconds.floor() as usize).clamp(1, MAX_ROUNDS);
        Plan {
            rounds,
            frames: (p.frames / rounds).max(p.frames.min(MIN_ROUND_FRAMES)),
            seconds: p.seconds / rounds as f64,
        }
    }
}

fn rows(
    target: &str,
    pid: Option<u32>,
    p: &IsolationParams,
    kinds: &[String],
) -> Result<Vec<Row>, CliError> {
    let plan = Plan::of(p);
    // A first camera run warms the devices up (GPU pipelines, ISP scalers); not measured.
    camera(target, pid, 1.0)?;
    let mut rows = Vec::new();
    // A round takes about 2 x its seconds plus the SVM frames, its pauses and setup; a daemon
    // that stops answering (a device thread gone) would otherwise hang the victim's waits
    // forever.
    let limit = Duration::from_secs_f64(
        plan.rounds as f64 * (plan.seconds * 6.0 + plan.frames as f64 * 0.1 + 30.0) + 90.0,
    );
    for kind in kinds {
        let (done, watch) = std::sync::mpsc::channel::<()>();
        let watchdog = watchdog(kind.clone(), pid, limit, watch);
        eprintln!("bench isolation: the victim alone and next to {kind}");
        let tally = Tally::default();
        let ctl = Ctl::default();
        let mut svm = SvmVictim::open(target)?;
        let mut codec = CodecVictim::open(target)?;
        let (rounds, corrupt, soak) = std::thread::scope(|s| {
            let mut h = match kind.as_str() {
                // The soak's roles run as they are (stopped and started again to pause).
                "misuse" => Hostile::Soak("hostile", None, SoakTally::default()),
                "crashing" => Hostile::Soak("crashing", None, SoakTally::default()),
                _ => Hostile::Thread(
                    &ctl,
                    Some(s.spawn(|| {
                        let r = hostile(kind, (target, p.slow), &ctl, &tally);
                        ctl.ended.store(true, Ordering::Release);
                        r
                    })),
                ),
            };
            let measured = measure_row(&mut h, (&mut svm, &mut codec), (target, pid), &plan);
            let soak = h.stop(kind);
            measured.map(|(rounds, corrupt)| (rounds, corrupt, soak))
        })?;
        let (ops, refused) = match soak {
            Some(t) => {
                if t.failures > 0 {
                    eprintln!("bench isolation: {kind}: {} guest failures", t.failures);
                }
                (t.ops, t.refused)
            }
            None => (
                tally.ops.load(Ordering::Relaxed),
                tally.refused.load(Ordering::Relaxed),
            ),
        };
        let of = |f: fn(&Round) -> f64| median_or_zero(&rounds.iter().map(f).collect::<Vec<_>>());
        let access_pct = of(|r| pct(r.access_p50_us, r.alone_access_p50_us));
        let fps_pct = of(|r| pct(r.camera_fps, r.alone_camera_fps));
        let decode_pct = of(|r| pct(r.decode_p50_ms, r.alone_decode_p50_ms));
        let mut out = Vec::new();
        if access_pct > (1.0 + TOLERANCE) * 100.0 {
            out.push(format!("access p50 {access_pct:.0}% of alone"));
        }
        if fps_pct < (1.0 - TOLERANCE) * 100.0 {
            out.push(format!("camera fps {fps_pct:.0}% of alone"));
        }
        if corrupt > 0 {
            out.push(format!("{corrupt} corrupt frames"));
        }
        let decode_p99 = of(|r| r.decode_p99_ms);
        if decode_p99 > STALL_MS {
            out.push(format!("decode p99 {decode_p99:.0} ms (a stall)"));
        }
        rows.push(Row {
            hostile: kind.clone(),
            alone_access_p50_us: of(|r| r.alone_access_p50_us),
            alone_camera_fps: of(|r| r.alone_camera_fps),
            access_p50_us: of(|r| r.access_p50_us),
            access_pct_of_alone: access_pct,
            camera_fps: of(|r| r.camera_fps),
            fps_pct_of_alone: fps_pct,
            alone_decode_p50_ms: of(|r| r.alone_decode_p50_ms),
            decode_p50_ms: of(|r| r.decode_p50_ms),
            decode_pct_of_alone: decode_pct,
            alone_decode_p99_ms: of(|r| r.alone_decode_p99_ms),
            decode_p99_ms: decode_p99,
            ok: out.is_empty(),
            check: if out.is_empty() {
                "ok".into()
            } else {
                format!("FAIL: {}", out.join(", "))
            },
            rounds,
            hostile_ops: ops,
            hostile_refused: refused,
            hostile_refusal: tally.first.into_inner(),
            victim_corrupt: corrupt,
        });
        drop(done);
        let _ = watchdog.join();
    }
    Ok(rows)
}

/// The rounds of one row, the hostile guest `h` running (not paused) when it starts: (every
/// round's numbers, the victim's corrupt SVM frames).
fn measure_row(
    h: &mut Hostile<'_, '_>,
    (svm, codec): (&mut SvmVictim, &mut CodecVictim),
    (target, pid): (&str, Option<u32>),
    plan: &Plan,
) -> Result<(Vec<Round>, usize), CliError> {
    h.resume(target)?;
    std::thread::sleep(WARM);
    let mut rounds = Vec::new();
    let mut corrupt = 0;
    for _ in 0..plan.rounds {
        let blocks = h.blocks();
        let n = (plan.frames / blocks).max(1);
        let (mut alone, mut with) = (Vec::new(), Vec::new());
        let (mut alone_ms, mut with_ms) = (Vec::new(), Vec::new());
        for _ in 0..blocks {
            h.pause()?;
            std::thread::sleep(QUIET);
            let (us, c) = svm.measure(n)?;
            alone.extend(us);
            corrupt += c;
            alone_ms.extend(codec.measure(DECODE_PICTURES)?);
            h.resume(target)?;
            std::thread::sleep(h.warm());
            let (us, c) = svm.measure(n)?;
            with.extend(us);
            corrupt += c;
            with_ms.extend(codec.measure(DECODE_PICTURES)?);
        }
        h.pause()?;
        std::thread::sleep(QUIET);
        let alone_fps = camera(target, pid, plan.seconds)?;
        h.resume(target)?;
        std::thread::sleep(h.warm());
        let fps = camera(target, pid, plan.seconds)?;
        rounds.push(Round {
            alone_access_p50_us: median_or_zero(&alone),
            alone_camera_fps: alone_fps,
            access_p50_us: median_or_zero(&with),
            camera_fps: fps,
            alone_decode_p50_ms: percentile(&alone_ms, 50.0),
            alone_decode_p99_ms: percentile(&alone_ms, 99.0),
            decode_p50_ms: percentile(&with_ms, 50.0),
            decode_p99_ms: percentile(&with_ms, 99.0),
        });
    }
    Ok((rounds, corrupt))
}

/// Stops, pauses and resumes a hostile thread of this process (see [`hostile()`]).
#[derive(Default)]
struct Ctl {
    stop: AtomicBool,
    pause: AtomicBool,
    /// The thread saw the pause and does nothing until resumed.
    idle: AtomicBool,
    /// The thread returned.
    ended: AtomicBool,
}

impl Ctl {
    /// Whether the hostile guest goes on with its next operation (false once stopped);
    /// waits while it is paused.
    fn go(&self) -> bool {
        while self.pause.load(Ordering::Acquire) && !self.stop.load(Ordering::Relaxed) {
            self.idle.store(true, Ordering::Release);
            std::thread::sleep(Duration::from_millis(1));
        }
        !self.stop.load(Ordering::Relaxed)
    }

    /// Pauses the thread and waits until it is idle (its operation under way finished).
    fn pause(&self) {
        self.pause.store(true, Ordering::Release);
        while !self.idle.load(Ordering::Acquire) && !self.ended.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn resume(&self) {
        self.idle.store(false, Ordering::Release);
        self.pause.store(false, Ordering::Release);
    }
}

/// What soak-role guests did over a row (they are stopped and started again to pause).
#[derive(Default)]
struct SoakTally {
    ops: u64,
    refused: u64,
    failures: u64,
}

/// A hostile guest of a row.
enum Hostile<'s, 'c> {
    /// A thread of this process running [`hostile()`] under a [`Ctl`]; it runs from the start.
    Thread(
        &'c Ctl,
        Option<std::thread::ScopedJoinHandle<'s, Result<(), CliError>>>,
    ),
    /// A soak role, its guests running while `Some`.
    Soak(&'static str, Option<Background>, SoakTally),
}

impl Hostile<'_, '_> {
    /// Alone/with blocks of SVM frames per round: many where pausing is quick.
    fn blocks(&self) -> usize {
        match self {
            Hostile::Thread(..) => BLOCKS,
            Hostile::Soak(..) => 1,
        }
    }

    /// How long the guest runs after a resume before the victim is measured.
    fn warm(&self) -> Duration {
        match self {
            Hostile::Thread(..) => RESUME,
            Hostile::Soak(..) => WARM,
        }
    }

    fn pause(&mut self) -> Result<(), CliError> {
        match self {
            Hostile::Thread(ctl, _) => ctl.pause(),
            Hostile::Soak(_, bg, tally) => {
                if let Some(b) = bg.take() {
                    let t = b.stop();
                    if t.requests > 0 {
                        // Misuses sent, and those refused (every one should be).
                        tally.ops += t.requests;
                        tally.refused += t.requests - t.accepted.min(t.requests);
                    } else {
                        tally.ops += t.rounds;
                    }
                    tally.failures += t.failures;
                }
            }
        }
        Ok(())
    }

    fn resume(&mut self, target: &str) -> Result<(), CliError> {
        match self {
            Hostile::Thread(ctl, _) => ctl.resume(),
            Hostile::Soak(role, bg, _) => {
                if bg.is_none() {
                    *bg = Some(Background::start(target, role, 2)?);
                }
            }
        }
        Ok(())
    }

    /// Stops the guest: what a soak role did (`None` for a thread, which counts in its
    /// [`Tally`]).
    fn stop(mut self, kind: &str) -> Option<SoakTally> {
        match &mut self {
            Hostile::Thread(ctl, h) => {
                ctl.stop.store(true, Ordering::Release);
                match h.take().map(|h| h.join()) {
                    Some(Ok(Ok(()))) | None => {}
                    Some(Ok(Err(e))) => eprintln!("bench isolation: {kind} ended early: {e}"),
                    Some(Err(_)) => eprintln!("bench isolation: {kind} panicked"),
                }
                None
            }
            Hostile::Soak(..) => {
                let _ = self.pause();
                match self {
                    Hostile::Soak(_, _, t) => Some(t),
                    Hostile::Thread(..) => None,
                }
            }
        }
    }
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

#[cfg(test)]
mod tests;
