//! `virtsoc bench sharing`: how fairly the daemon's schedulers share the GPU.
//!
//! (a) **Fairness.** For each scheduler (`virtsocd --scheduler`), a daemon of its own serves
//! 2, 4 and 8 guests with equal shares. Each guest is a thread of this process with its own
//! connection (its own session, rings and window) keeping four GPU compositions queued
//! (continuously backlogged), of a size that differs from guest to guest (`--gpu-sizes`,
//! 320x180, 640x360, 960x540 in turn), so the per-command cost differs about six-fold. After
//! a 0.5 s settle, every second the bench reads each guest's GPU device time from the
//! daemon's control API (the worker's continuous accounting, the command in service counted
//! up to the reading, as AvA reads its API server's): the window's unfairness is `max over
//! guests |share - ideal| / ideal`, reported as the median and p95 over the windows (each
//! window's device times are in the JSON, `window_ms`). Overhead, in interleaved slices
//! before each round's windows (the same guests stay connected and are switched on and off):
//! each size alone for 0.3 s (its commands per second), then all the guests together for
//! 0.6 s, whose commands would have taken `sum(commands / rate alone)` seconds alone;
//! `overhead_pct` is how much longer they took together, the median over the slice pairs of
//! all `--repeats` rounds (their quartiles say how noisy). A machine whose load drifts
//! changes little within a pair, a second long, where alone runs seconds before the guests
//! together compared two different machines. `overhead_vs_round_robin_pct` is the
//! scheduler's own cost: a round-robin daemon and the scheduler's run at once with as many
//! guests each, and 0.6 s slices alternate between their guests; the median over the pairs
//! of how much less work the scheduler's guests did (weighed by the round-robin daemon's
//! alone rates).
//!
//! (b) **Multimedia.** A video guest composes a 1280x720 frame on the GPU and presents it on
//! the display 30 times a second, against 1, 2 and 4 hog guests looping 1920x1080
//! compositions (each guest one in flight), and against 1, 2 and 4 CPU spinners (processes of
//! their own; the video guest then also makes each frame on the CPU); its presented rate (the
//! display's count) as a percentage of its desired 30 fps, with round robin (and alone, 0
//! hogs, for what the machine gives it at the time) and with the `feedback` scheduler (the
//! video guest's policy class is `multimedia`: the DFR loop raises its share and boosts it
//! while it is behind), against the spinners also with the feedback loop steering CPU
//! weights (`virtsocd --cpu-cgroup`: the video guest's process, and on a CPU Vulkan driver
//! the daemon's rasterizer threads that compose its frames, whose group's weight follows the
//! video guest's raised share).
//!
//! (c) **Together vs alone** (the Android-on-KVM paper's Table 3 analog): app guests that each
//! compose and present a 1280x720 frame 30 times a second, one alone and two together; the
//! slower guest's frame rate together as a percentage of one alone.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use serde::Serialize;
use virtsoc_control::client::{control_path, request, Target};
use virtsoc_control::GuestInfo;
use virtsoc_guest::{ConnectOptions, Connection};
use virtsoc_sched::Kind;

use crate::daemon_proc::DaemonProcess;
use crate::stats::percentile;
use crate::CliError;

mod chart;
mod codec;
mod gpu;
mod multimedia;
pub use chart::write as write_chart;
pub use multimedia::{cpu_hog, HogKind};
use multimedia::{run_apps, run_multimedia, MultimediaRun};

/// The device the fairness part loads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Work {
    /// GPU compositions of these sizes (`--gpu-sizes`; by default 320x180, 640x360 and
    /// 960x540, about 1, 2.5 and 5.5 ms each on lavapipe in a release build: one command is
    /// small against a guest's ideal device time in a 1 s window even with 8 guests, 125 ms.
    /// A command cannot be preempted, so a guest running one of cost `c` is ahead of its
    /// fluid share by up to `c` at a window's edge whatever the scheduler: with 1280x720, 10
    /// ms, no scheduler gets 8 guests under about 3%, see `virtsoc_sched`'s eight-guest
    /// test).
    Gpu([(u32, u32); 3]),
    /// H.264 decodes of 360p, 720p and 1080p clips.
    Codec,
}

impl Work {
    fn device(self) -> &'static str {
        match self {
            Work::Gpu(_) => "gpu",
            Work::Codec => "codec",
        }
    }

    fn sizes(self) -> [(u32, u32); 3] {
        match self {
            Work::Gpu(sizes) => sizes,
            Work::Codec => [(640, 360), (1280, 720), (1920, 1080)],
        }
    }

    /// Runs one guest of this work until `stop` (waiting while `gate` is false).
    #[allow(clippy::too_many_arguments)]
    fn guest(
        self,
        target: &str,
        name: &str,
        size: (u32, u32),
        gate: Option<&AtomicBool>,
        warm: &Barrier,
        stop: &AtomicBool,
        done: &AtomicU64,
    ) -> Result<(), CliError> {
        match self {
            Work::Gpu(_) => gpu::guest(target, name, size, gpu::BACKLOG, gate, warm, stop, done),
            Work::Codec => codec::guest(target, name, size, gate, warm, stop, done),
        }
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct SharingParams {
    pub seconds: u64,
    pub guests: Vec<usize>,
    pub schedulers: Vec<Kind>,
    /// Hog counts of the multimedia part (empty: skip it).
    pub hogs: Vec<usize>,
    /// The kinds of hog the multimedia part runs against.
    pub hog_kinds: Vec<HogKind>,
    /// Run the two-guests-together part.
    pub together: bool,
    /// Run the fairness part on the codec too.
    pub codec: bool,
    /// Rounds of (alone, together) per guest count on the GPU (the codec runs one).
    pub repeats: usize,
    /// The GPU guests' composition sizes (guest `i` has size `i % 3`).
    pub gpu_sizes: [(u32, u32); 3],
}

/// One size alone on the device, measured just before a scheduler's fairness runs (the
/// machine's load drifts: other work on its cores is the GPU's too on a CPU driver).
#[derive(Debug, Clone, Serialize)]
pub struct AloneRow {
    pub device: String,
    pub scheduler: String,
    pub size: String,
    pub commands_per_s: f64,
}

/// One fairness configuration.
#[derive(Debug, Clone, Serialize)]
pub struct FairnessRow {
    pub scheduler: String,
    pub guests: usize,
    /// Median over 1 s windows of max |share - ideal| / ideal (a fraction).
    pub unfairness_median: f64,
    pub unfairness_p95: f64,
    /// Throughput lost against one guest alone, percent: the same commands done by each
    /// size alone would have taken that much less time. The median over interleaved slice
    /// pairs (each size alone, then the guests together, a second apart).
    pub overhead_pct: f64,
    /// The quartiles (25th, 75th percentile) of the slice pairs' overheads (how noisy it
    /// is).
    pub overhead_range_pct: (f64, f64),
    /// How many slice pairs the overhead is the median of.
    pub overhead_pairs: usize,
    /// Throughput lost against round robin with as many guests, percent (when measured):
    /// a round-robin daemon and this scheduler's running at once, their guests' slices
    /// alternating, the median over the slice pairs.
    pub overhead_vs_round_robin_pct: Option<f64>,
    /// The quartiles of those pairs' losses.
    pub overhead_vs_round_robin_range_pct: Option<(f64, f64)>,
    /// Work per second in units of "one guest alone" (the throughput behind both overheads).
    pub throughput: f64,
    /// Each guest's fraction of the GPU time, whole run.
    pub shares: Vec<f64>,
    pub windows: usize,
    /// Each window's device time per guest, in milliseconds (what the unfairness is computed
    /// from).
    pub window_ms: Vec<Vec<f64>>,
    /// `gpu` or `codec`.
    pub device: String,
}

/// One multimedia configuration.
#[derive(Debug, Clone, Serialize)]
pub struct MultimediaRow {
    pub scheduler: String,
    pub hogs: usize,
    /// `gpu` (composition loops) or `cpu` (spinning processes).
    pub hog_kind: HogKind,
    /// Whether the daemon steered CPU weights (`--cpu-cgroup`).
    pub cpu_weight: bool,
    /// The video guest's CPU weight at the end of the run (`cpu.weight` or `cpu.shares`).
    pub video_cpu_weight: Option<u64>,
    /// Presented frames per second as a percentage of the desired 30.
    pub dfr_pct: f64,
    pub presented_fps: f64,
    /// Hog compositions per second, all hogs.
    pub hog_commands_per_s: f64,
}

/// The Table 3 analog: app guests (30 fps, a 1280x720 GPU composition presented per frame)
/// alone and two together.
#[derive(Debug, Clone, Serialize)]
pub struct TogetherRow {
    pub scheduler: String,
    pub guests: usize,
    /// Frames per second of each guest.
    pub fps: Vec<f64>,
    /// The slowest guest's rate as a percentage of one guest alone.
    pub vs_alone_pct: f64,
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct SharingReport {
    pub alone: Vec<AloneRow>,
    /// Part (a) on the GPU.
    pub fairness: Vec<FairnessRow>,
    /// Part (a) on the codec (H.264 decode, a device that runs one command at a time).
    pub fairness_codec: Vec<FairnessRow>,
    pub multimedia: Vec<MultimediaRow>,
    pub together: Vec<TogetherRow>,
}

/// The hogs' composition size: four of them queued ahead of the video's frame overrun its
/// period on lavapipe (release build), one does not. In a debug build one alone takes longer
/// than a frame period, and no scheduler gets a frame past a command it cannot preempt.
const HOG_SIZE: (u32, u32) = (1920, 1080);

/// The video guest's desired frame rate.
const VIDEO_FPS: f64 = 30.0;

/// Device time on `device` of each guest named `share-*`, by name.
fn device_time(control: &Target, device: &str) -> Result<BTreeMap<String, u64>, CliError> {
    let r = request(control, "GET", "/guests", b"")?;
    let guests: Vec<GuestInfo> = serde_json::from_str(&r.body)?;
    Ok(guests
        .into_iter()
        .filter(|g| g.name.starts_with("share-"))
        .map(|g| {
            let t = g.device_use.get(device).map_or(0, |u| u.device_ns);
            (g.name, t)
        })
        .collect())
}

/// How long the guests run together before the first window: their queues fill and the
/// scheduler has seen each of them (a start-up transient, not sharing).
const SETTLE: Duration = Duration::from_millis(500);

/// Slice pairs of the overhead measure per round ([`interleaved`]).
const SLICE_PAIRS: usize = 4;

/// One run: `n` guests named `share-{round}-{i}` on the daemon at `target`; per-window device
/// time per guest (each window's device time is what the daemon's continuous accounting
/// counted in it, the command in service included up to the sample), each guest's completed
/// commands and the seconds they took.
#[allow(clippy::type_complexity)]
fn run_guests(
    work: Work,
    target: &str,
    control: &Target,
    round: usize,
    n: usize,
    seconds: u64,
) -> Result<(Vec<Vec<u64>>, Vec<u64>, f64), CliError> {
    let warm = Barrier::new(n + 1);
    let stop = AtomicBool::new(false);
    let done: Vec<AtomicU64> = (0..n).map(|_| AtomicU64::new(0)).collect();
    let names: Vec<String> = (0..n).map(|i| format!("share-{round}-{i}")).collect();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|i| {
                let (name, warm, stop, done) = (&names[i], &warm, &stop, &done[i]);
                let size = work.sizes()[i % 3];
                s.spawn(move || work.guest(target, name, size, None, warm, stop, done))
            })
            .collect();
        warm.wait();
        let measured = (|| -> Result<_, CliError> {
            std::thread::sleep(SETTLE);
            let mut windows = Vec::new();
            let mut last = device_time(control, work.device())?;
            let c0: Vec<u64> = done.iter().map(|c| c.load(Ordering::Relaxed)).collect();
            let t0 = Instant::now();
            for k in 1..=seconds {
                let next = t0 + Duration::from_secs(k);
                std::thread::sleep(next.saturating_duration_since(Instant::now()));
                let now = device_time(control, work.device())?;
                windows.push(
                    names
                        .iter()
                        .map(|g| {
                            let a = now.get(g).copied().unwrap_or(0);
                            a.saturating_sub(last.get(g).copied().unwrap_or(0))
                        })
                        .collect(),
                );
                last = now;
            }
            let counts: Vec<u64> = done
                .iter()
                .zip(&c0)
                .map(|(c, z)| c.load(Ordering::Relaxed) - z)
                .collect();
            Ok((windows, counts, t0.elapsed().as_secs_f64()))
        })();
        stop.store(true, Ordering::Relaxed);
        for h in handles {
            match h.join() {
                Ok(r) => r?,
                Err(_) => return Err(CliError::Usage("a guest thread panicked".into())),
            }
        }
        measured
    })
}

/// Three `WxH` sizes.
pub fn parse_sizes(v: &[String]) -> Result<[(u32, u32); 3], CliError> {
    let bad = || CliError::Usage(format!("--gpu-sizes wants three WxH sizes, not {v:?}"));
    let sizes: Vec<(u32, u32)> = v
        .iter()
        .map(|s| {
            let (w, h) = s.split_once('x').ok_or_else(bad)?;
            let (w, h) = (w.parse().map_err(|_| bad())?, h.parse().map_err(|_| bad())?);
            if w == 0 || h == 0 || w > 4096 || h > 4096 {
                return Err(bad());
            }
            Ok((w, h))
        })
        .collect::<Result<_, _>>()?;
    sizes.try_into().map_err(|_| bad())
}

/// `gpu` and/or `cpu`.
pub fn parse_hog_kinds(v: &[String]) -> Result<Vec<HogKind>, CliError> {
    v.iter()
        .map(|s| match s.as_str() {
            "gpu" => Ok(HogKind::Gpu),
            "cpu" => Ok(HogKind::Cpu),
            _ => Err(CliError::Usage(format!(
                "--hog-kind wants gpu and/or cpu, not {s:?}"
            ))),
        })
        .collect()
}

/// max over guests |share - ideal| / ideal of one window (equal shares).
fn unfairness(window: &[u64]) -> Option<f64> {
    let total: u64 = window.iter().sum();
    if total == 0 {
        return None;
    }
    let ideal = 1.0 / window.len() as f64;
    Some(
        window
            .iter()
            .map(|t| (*t as f64 / total as f64 - ideal).abs() / ideal)
            .fold(0.0, f64::max),
    )
}

/// Runs the benchmark.
pub fn run(p: &SharingParams) -> Result<SharingReport, CliError> {
    let mut alone = Vec::new();
    let fairness = fairness_on(Work::Gpu(p.gpu_sizes), p, p.repeats, &mut alone)?;
    let fairness_codec = if p.codec {
        fairness_on(Work::Codec, p, 1, &mut alone)?
    } else {
        Vec::new()
    };
    let mut multimedia = Vec::new();
    // GPU hogs: round robin and feedback; CPU spinners: round robin, feedback on device
    // shares alone, and feedback steering CPU weights too.
    let runs = [
        (HogKind::Gpu, Kind::RoundRobin, false),
        (HogKind::Gpu, Kind::Feedback, false),
        (HogKind::Cpu, Kind::RoundRobin, false),
        (HogKind::Cpu, Kind::Feedback, false),
        (HogKind::Cpu, Kind::Feedback, true),
    ];
    for (hog, kind, cpu_weight) in runs {
        if !p.hog_kinds.contains(&hog) {
            continue;
        }
        // Round robin also runs the video alone (0 hogs): what the machine gives it now.
        let alone = (kind == Kind::RoundRobin && !p.hogs.is_empty()).then_some(0);
        for hogs in alone.into_iter().chain(p.hogs.iter().copied()) {
            let r = MultimediaRun {
                kind,
                hog,
                hogs,
                cpu_weight,
            };
            multimedia.push(run_multimedia(r, p.seconds)?);
        }
    }
    let mut together = Vec::new();
    if p.together {
        for kind in [Kind::RoundRobin, Kind::Wfq] {
            let alone = run_apps(kind, 1, p.seconds)?;
            let two = run_apps(kind, 2, p.seconds)?;
            let base = alone[0].max(1e-9);
            for fps in [alone, two] {
                together.push(TogetherRow {
                    scheduler: kind.name().to_string(),
                    guests: fps.len(),
                    vs_alone_pct: fps.iter().copied().fold(f64::INFINITY, f64::min) / base * 100.0,
                    fps,
                });
            }
        }
    }
    Ok(SharingReport {
        alone,
        fairness,
        fairness_codec,
        multimedia,
        together,
    })
}

/// Part (a) on one device: every scheduler with every guest count. Each scheduler gets one
/// daemon; each guest count `repeats` rounds of (interleaved slice pairs of every size alone
/// and the guests together, then the guests together for the windows), so the alone rates
/// an overhead is computed against were measured within a second of it, on the same
/// daemon, under the same load. The overhead is the median over the slice pairs; the
/// windows of all rounds make the unfairness.
fn fairness_on(
    work: Work,
    p: &SharingParams,
    repeats: usize,
    alone_all: &mut Vec<AloneRow>,
) -> Result<Vec<FairnessRow>, CliError> {
    let mut fairness = Vec::new();
    for kind in &p.schedulers {
        let d = DaemonProcess::spawn(&["--scheduler", kind.name()], false)?;
        let target = d.endpoint().target;
        let control = Target::Unix(control_path(std::path::Path::new(&target)));
        let r = fairness_of(work, *kind, &target, &control, p, repeats, &mut fairness);
        d.stop()?;
        alone_all.extend(r?);
    }
    // Against round robin: both daemons at once, slices alternating between them.
    let rr_rates: Vec<f64> = alone_all
        .iter()
        .filter(|a| a.device == work.device() && a.scheduler == Kind::RoundRobin.name())
        .map(|a| a.commands_per_s)
        .collect();
    if rr_rates.len() == 3 {
        for kind in p.schedulers.iter().filter(|k| **k != Kind::RoundRobin) {
            let rr = DaemonProcess::spawn(&["--scheduler", Kind::RoundRobin.name()], false)?;
            let other = DaemonProcess::spawn(&["--scheduler", kind.name()], false)?;
            let targets = [rr.endpoint().target, other.endpoint().target];
            let mut r = Ok(());
            for &n in &p.guests {
                let pairs = SLICE_PAIRS * repeats.max(1);
                let ratios = match ab_slices(work, [&targets[0], &targets[1]], n, pairs, &rr_rates)
                {
                    Ok(x) => x,
                    Err(e) => {
                        r = Err(e);
                        break;
                    }
                };
                let losses: Vec<f64> = ratios.iter().map(|x| (1.0 - x) * 100.0).collect();
                if let Some(row) = fairness.iter_mut().find(|f| {
                    f.scheduler == kind.name() && f.guests == n && f.device == work.device()
                }) {
                    row.overhead_vs_round_robin_pct = Some(percentile(&losses, 50.0));
                    row.overhead_vs_round_robin_range_pct =
                        Some((percentile(&losses, 25.0), percentile(&losses, 75.0)));
                }
            }
            rr.stop()?;
            other.stop()?;
            r?;
        }
    }
    Ok(fairness)
}

/// `n` guests on each of two daemons (`targets[0]` round robin, `targets[1]` the scheduler
/// compared), all connected at once; `pairs` pairs of slices, the guests of one daemon on
/// and the other's off, then the other way round. Each pair's throughput of the second
/// daemon over the first's (the work weighed by `rates`, each size's commands per second
/// alone), a second apart under the same load.
fn ab_slices(
    work: Work,
    targets: [&str; 2],
    n: usize,
    pairs: usize,
    rates: &[f64],
) -> Result<Vec<f64>, CliError> {
    let warm = Barrier::new(2 * n + 1);
    let stop = AtomicBool::new(false);
    let gates: Vec<AtomicBool> = (0..2 * n).map(|_| AtomicBool::new(false)).collect();
    let done: Vec<AtomicU64> = (0..2 * n).map(|_| AtomicU64::new(0)).collect();
    let names: Vec<String> = (0..2 * n)
        .map(|j| format!("share-ab{}-{}", j / n, j % n))
        .collect();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..2 * n)
            .map(|j| {
                let (name, gate, warm, stop, done) = (&names[j], &gates[j], &warm, &stop, &done[j]);
                let (target, size) = (targets[j / n], work.sizes()[(j % n) % 3]);
                s.spawn(move || work.guest(target, name, size, Some(gate), warm, stop, done))
            })
            .collect();
        warm.wait();
        let slice = |side: usize| -> f64 {
            for (j, g) in gates.iter().enumerate() {
                g.store(j / n == side, Ordering::Relaxed);
            }
            std::thread::sleep(SLICE_SETTLE);
            let c0: Vec<u64> = done.iter().map(|c| c.load(Ordering::Relaxed)).collect();
            let t0 = Instant::now();
            std::thread::sleep(SLICE_TOGETHER);
            let counts: Vec<u64> = (side * n..side * n + n)
                .map(|j| done[j].load(Ordering::Relaxed) - c0[j])
                .collect();
            together_throughput(&counts, rates, t0.elapsed().as_secs_f64())
        };
        let mut out = Vec::new();
        for k in 0..pairs {
            // Alternate which side goes first, so a trend in the load does not favour one.
            let (a, b) = if k % 2 == 0 {
                let a = slice(0);
                (a, slice(1))
            } else {
                let b = slice(1);
                (slice(0), b)
            };
            out.push(b / a.max(1e-9));
        }
        stop.store(true, Ordering::Relaxed);
        for g in &gates {
            g.store(true, Ordering::Relaxed);
        }
        for h in handles {
            match h.join() {
                Ok(r) => r?,
                Err(_) => return Err(CliError::Usage("a guest thread panicked".into())),
            }
        }
        Ok(out)
    })
}

/// [`fairness_on`] for one scheduler whose daemon is at `target`: pushes its rows onto
/// `fairness`, returns its alone rates (the median per size over the rounds).
fn fairness_of(
    work: Work,
    kind: Kind,
    target: &str,
    control: &Target,
    p: &SharingParams,
    repeats: usize,
    fairness: &mut Vec<FairnessRow>,
) -> Result<Vec<AloneRow>, CliError> {
    let sizes = work.sizes();
    let mut alone_rates: Vec<Vec<f64>> = vec![Vec::new(); sizes.len()];
    let mut round = 0;
    for &n in &p.guests {
        let mut windows = Vec::new();
        let mut overheads = Vec::new();
        let mut throughputs = Vec::new();
        let mut total = vec![0u64; n];
        for _ in 0..repeats.max(1) {
            round += 1;
            for pair in interleaved(work, target, round, n, SLICE_PAIRS)? {
                for (i, r) in pair.rates.iter().enumerate() {
                    alone_rates[i].push(*r);
                }
                throughputs.push(pair.throughput);
                overheads.push((1.0 - pair.throughput) * 100.0);
            }
            let (w, _, _) = run_guests(work, target, control, round, n, p.seconds)?;
            for win in &w {
                for (t, x) in total.iter_mut().zip(win) {
                    *t += x;
                }
            }
            windows.extend(w);
        }
        let us: Vec<f64> = windows.iter().filter_map(|w| unfairness(w)).collect();
        let all: u64 = total.iter().sum::<u64>().max(1);
        let throughput = percentile(&throughputs, 50.0);
        fairness.push(FairnessRow {
            scheduler: kind.name().to_string(),
            guests: n,
            unfairness_median: percentile(&us, 50.0),
            unfairness_p95: percentile(&us, 95.0),
            overhead_pct: percentile(&overheads, 50.0),
            overhead_range_pct: (percentile(&overheads, 25.0), percentile(&overheads, 75.0)),
            overhead_pairs: overheads.len(),
            overhead_vs_round_robin_pct: None,
            overhead_vs_round_robin_range_pct: None,
            throughput,
            shares: total.iter().map(|t| *t as f64 / all as f64).collect(),
            windows: us.len(),
            window_ms: windows
                .iter()
                .map(|w| w.iter().map(|t| *t as f64 / 1e6).collect())
                .collect(),
            device: work.device().to_string(),
        });
    }
    Ok(sizes
        .iter()
        .zip(alone_rates)
        .filter(|(_, rates)| !rates.is_empty())
        .map(|((w, h), rates)| AloneRow {
            device: work.device().to_string(),
            scheduler: kind.name().to_string(),
            size: format!("{w}x{h}"),
            commands_per_s: percentile(&rates, 50.0),
        })
        .collect())
}

/// How long a slice of the overhead measure waits after switching guests on or off before
/// counting (the guests switched off finish their queued commands meanwhile).
const SLICE_SETTLE: Duration = Duration::from_millis(80);
/// How long each size alone is counted in a slice pair.
const SLICE_ALONE: Duration = Duration::from_millis(300);
/// How long the guests together are counted in a slice pair.
const SLICE_TOGETHER: Duration = Duration::from_millis(600);

/// One slice pair's result: each size's commands per second alone, and the guests'
/// throughput together in units of one guest alone (the same commands at the alone rates
/// would have taken this fraction of the time).
#[derive(Debug, Clone)]
struct SlicePair {
    rates: Vec<f64>,
    throughput: f64,
}

/// The throughput overhead measured in interleaved slices: `n` guests (`share-o{round}-{i}`,
/// guest `i` of size `i % 3`) stay connected; each pair of slices runs each size alone (the
/// first guest of that size, the others switched off) and then all of them together. Each
/// pair compares rates a second apart, so the machine's load (other work on its cores is
/// the GPU's too on a CPU driver) drifts little between the two halves of a comparison,
/// unlike alone runs seconds before the guests together; the overhead is then the median
/// over many pairs.
fn interleaved(
    work: Work,
    target: &str,
    round: usize,
    n: usize,
    pairs: usize,
) -> Result<Vec<SlicePair>, CliError> {
    let warm = Barrier::new(n + 1);
    let stop = AtomicBool::new(false);
    let gates: Vec<AtomicBool> = (0..n).map(|_| AtomicBool::new(false)).collect();
    let done: Vec<AtomicU64> = (0..n).map(|_| AtomicU64::new(0)).collect();
    let names: Vec<String> = (0..n).map(|i| format!("share-o{round}-{i}")).collect();
    let sizes = n.min(3);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|i| {
                let (name, gate, warm, stop, done) = (&names[i], &gates[i], &warm, &stop, &done[i]);
                let size = work.sizes()[i % 3];
                s.spawn(move || work.guest(target, name, size, Some(gate), warm, stop, done))
            })
            .collect();
        warm.wait();
        let count = |on: &dyn Fn(usize) -> bool, d: Duration| -> (Vec<u64>, f64) {
            for (i, g) in gates.iter().enumerate() {
                g.store(on(i), Ordering::Relaxed);
            }
            std::thread::sleep(SLICE_SETTLE);
            let c0: Vec<u64> = done.iter().map(|c| c.load(Ordering::Relaxed)).collect();
            let t0 = Instant::now();
            std::thread::sleep(d);
            let counts = done
                .iter()
                .zip(&c0)
                .map(|(c, z)| c.load(Ordering::Relaxed) - z)
                .collect();
            (counts, t0.elapsed().as_secs_f64())
        };
        let mut out = Vec::new();
        for _ in 0..pairs {
            let rates: Vec<f64> = (0..sizes)
                .map(|k| {
                    let (c, secs) = count(&|i| i == k, SLICE_ALONE);
                    c[k] as f64 / secs
                })
                .collect();
            let (c, secs) = count(&|_| true, SLICE_TOGETHER);
            out.push(SlicePair {
                throughput: together_throughput(&c, &rates, secs),
                rates,
            });
        }
        stop.store(true, Ordering::Relaxed);
        for g in &gates {
            g.store(true, Ordering::Relaxed);
        }
        for h in handles {
            match h.join() {
                Ok(r) => r?,
                Err(_) => return Err(CliError::Usage("a guest thread panicked".into())),
            }
        }
        Ok(out)
    })
}

/// The guests' work together in `secs` (`counts[i]` commands of guest `i`, of size `i % 3`)
/// in units of one guest alone: the seconds it would have taken at the alone `rates`, over
/// `secs`. 1 is no overhead.
fn together_throughput(counts: &[u64], rates: &[f64], secs: f64) -> f64 {
    let alone_secs: f64 = counts
        .iter()
        .enumerate()
        .map(|(i, c)| *c as f64 / rates[i % rates.len()].max(1e-9))
        .sum();
    alone_secs / secs.max(1e-9)
}

/// Prints the report as tables.
pub fn print_table(r: &SharingReport) {
    println!("one guest alone:");
    for a in &r.alone {
        println!(
            "  {:<6} {:<12} {:<10} {:>8.1} commands/s",
            a.device, a.scheduler, a.size, a.commands_per_s
        );
    }
    for (device, rows) in [("gpu", &r.fairness), ("codec", &r.fairness_codec)] {
        if !rows.is_empty() {
            println!("fairness on the {device}:");
            print_fairness(rows);
        }
    }
    print_rest(r);
}

fn print_fairness(rows: &[FairnessRow]) {
    println!(
        "{:<12} {:>6} {:>12} {:>10} {:>10} {:>15} {:>10}  shares",
        "scheduler", "guests", "unfair p50%", "p95%", "overhead%", "(p25..p75)", "vs rr %"
    );
    for f in rows {
        let shares: Vec<String> = f.shares.iter().map(|s| format!("{:.3}", s)).collect();
        println!(
            "{:<12} {:>6} {:>12.1} {:>10.1} {:>10.1} {:>15} {:>10}  {}",
            f.scheduler,
            f.guests,
            f.unfairness_median * 100.0,
            f.unfairness_p95 * 100.0,
            f.overhead_pct,
            format!(
                "{:.1}..{:.1}",
                f.overhead_range_pct.0, f.overhead_range_pct.1
            ),
            f.overhead_vs_round_robin_pct
                .map_or("-".into(), |o| format!("{o:.1}")),
            shares.join(" ")
        );
    }
}

/// Prints the rest of the report.
fn print_rest(r: &SharingReport) {
    if !r.multimedia.is_empty() {
        println!(
            "{:<12} {:>4} {:>5} {:>10} {:>8} {:>8} {:>12}",
            "scheduler", "hog", "hogs", "cpu weight", "% of DFR", "fps", "hog cmds/s"
        );
    }
    for m in &r.multimedia {
        let weight = match (m.cpu_weight, m.video_cpu_weight) {
            (false, _) => "-".to_string(),
            (true, Some(w)) => w.to_string(),
            (true, None) => "none".to_string(),
        };
        println!(
            "{:<12} {:>4} {:>5} {:>10} {:>8.1} {:>8.1} {:>12.1}",
            m.scheduler,
            m.hog_kind.name(),
            m.hogs,
            weight,
            m.dfr_pct,
            m.presented_fps,
            m.hog_commands_per_s
        );
    }
    if !r.together.is_empty() {
        println!("{:<12} {:>6} {:>10}  fps", "scheduler", "guests", "% alone");
    }
    for t in &r.together {
        let fps: Vec<String> = t.fps.iter().map(|f| format!("{f:.1}")).collect();
        println!(
            "{:<12} {:>6} {:>10.1}  {}",
            t.scheduler,
            t.guests,
            t.vs_alone_pct,
            fps.join(" ")
        );
    }
}

/// A bench guest named `name` on `target` with a window of `window_size` bytes.
pub(super) fn open_guest(
    target: &str,
    name: &str,
    window_size: u64,
) -> Result<Connection, CliError> {
    Ok(Connection::open(
        target,
        &ConnectOptions {
            name: name.to_string(),
            window_size,
            ..ConnectOptions::default()
        },
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unfairness_is_the_worst_guests_relative_gap() {
        assert_eq!(unfairness(&[0, 0]), None);
        assert_eq!(unfairness(&[500, 500]), Some(0.0));
        // Shares 0.6 and 0.4 against 0.5: 20% off.
        let u = unfairness(&[600, 400]).unwrap();
        assert!((u - 0.2).abs() < 1e-12, "{u}");
    }

    #[test]
    fn together_throughput_is_in_units_of_one_guest_alone() {
        // Sizes at 100, 50 and 25 commands/s alone; 4 guests (guest 3 is size 0 again).
        let rates = [100.0, 50.0, 25.0];
        // Each guest a quarter of a second's worth of its size alone, in one second: no
        // overhead.
        let t = together_throughput(&[25, 12, 6, 25], &rates, 1.0);
        assert!((t - (0.25 + 0.24 + 0.24 + 0.25)).abs() < 1e-9, "{t}");
        // The same commands in two seconds: half the throughput.
        assert!((together_throughput(&[25, 12, 6, 25], &rates, 2.0) - t / 2.0).abs() < 1e-9);
        // Two guests measure two sizes.
        assert!((together_throughput(&[50, 25], &rates[..2], 1.0) - 1.0).abs() < 1e-9);
    }

    #[test]
    fn gpu_sizes_parse_and_bad_ones_are_refused() {
        let v: Vec<String> = ["320x180", "640x360", "960x540"].map(String::from).to_vec();
        assert_eq!(
            parse_sizes(&v).unwrap(),
            [(320, 180), (640, 360), (960, 540)]
        );
        for bad in [
            vec!["320x180"],
            vec!["0x1", "1x1", "1x1"],
            vec!["a", "b", "c"],
        ] {
            let v: Vec<String> = bad.into_iter().map(String::from).collect();
            assert!(parse_sizes(&v).is_err(), "{v:?}");
        }
    }
}
