//! `virtsoc bench sharing`: how fairly the daemon's schedulers share the GPU.
//!
//! (a) **Fairness.** For each scheduler (`virtsocd --scheduler`), a daemon of its own serves 2, 4
//! and 8 guests with equal shares. Each guest is a thread of this process with its own connection
//! (its own session, rings and window) keeping four GPU compositions queued (continuously
//! backlogged), of a size that differs from guest to guest (`--gpu-sizes`, 320x180, 640x360,
//! 960x540 in turn), so the per-command cost differs about six-fold. The same on the codec
//! (`fairness_codec` in the JSON): each guest keeps two frames' H.264 decode and receive queued, at
//! 640x360, 1280x720 and 1920x1080 in turn (`backlog`; `--codec-sizes`, one size three times for
//! the control whose grade weighs no size's work against another's; `--no-gpu` runs the codec's
//! part alone). After a 0.5 s settle, a second after its last reading (so a late reading never
//! leaves a short window behind it) the bench reads each guest's GPU device time from the daemon's
//! control API (the worker's continuous accounting, the command in service counted up to the
//! reading, as AvA reads its API server's): the window's unfairness is `max over guests |share -
//! ideal| / ideal`, reported as the median and p95 over the windows (each window's device times are
//! in the JSON, `window_ms`): the meter's view. The grade is the same from what the guests got
//! (`grade`): each guest's work done in the window, from the times its answers came, each unit
//! weighed by its size's time alone. Overhead, in interleaved slices before each round's windows
//! (the same guests stay connected and are switched on and off): each size alone for 0.3 s (its
//! commands per second), then all the guests together for 0.6 s, whose commands would have taken
//! `sum(commands / rate alone)` seconds alone; `overhead_pct` is how much longer they took
//! together, the median over the slice pairs of all `--repeats` rounds (their quartiles say how
//! noisy). A machine whose load drifts changes little within a pair, a second long, where alone
//! runs seconds before the guests together compared two different machines.
//! `overhead_vs_round_robin_pct` is the scheduler's own cost: a round-robin daemon and the
//! scheduler's run at once with as many guests each, and 0.6 s slices alternate between their
//! guests; the median over the pairs of how much less work the scheduler's guests did (weighed by
//! the round-robin daemon's alone rates). On the codec, whose guests' decoders run side by side
//! on the host's cores since stop 53 (`virtsocd --codec-grace-us`), one guest alone with its one
//! single-threaded decoder uses one core: the overhead against it is negative there and says
//! so; the comparison with round robin is the scheduler's cost.
//!
//! Every fairness guest composes fresh content each command, as a real guest does: it
//! rotates through 8 (source, destination) image pairs of its size (`gpu::ROTATION`, the
//! codec guests through 8 frame regions), alone as together. With one pair reused (until
//! stop 18) the overhead measured the CPU's caches more than the sharing: on a CPU driver
//! (lavapipe, 2 cores of 1 MiB L2 each, 32 MiB L3) one guest alone recomposed images still
//! in its L2 from its previous composition, while guests in turn each brought their own
//! images, several MB together, which did not stay there; the alone rate, the floor of the
//! overhead, was then measured under other conditions than the guests together. With the
//! rotation, one guest alone streams too (the smallest, 320x180, works on 3.5 MiB), so the
//! comparison measures the scheduling and the interleaving (stop 19: round robin about 0%
//! with 4 and 8 guests, WFQ 4-15%: most likely its own dispatch, see docs/results.md). What
//! remains of the caches (about 3% with 8 guests): 8 guests together work on 116 MiB of
//! images, past the L3, where one guest of 320x180 or 640x360 alone (3.5 and 14 MiB) still
//! fits in it. `cargo run --release -p virtsoc-gpu
//! --example cache_probe -- 8 320x180 640x360 960x540 --rotate 8` measures the caches' part
//! with no daemon, guest, ring or scheduler (`--rotate 1`: the old, one-pair workload). The
//! scheduler's own cost is `overhead_vs_round_robin_pct` (AvA's measure: the same guests
//! with and without the scheduling). `rotation` in the JSON says how many buffers each
//! guest rotated through.
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
//! With `--hog-kind gles` the video guest is a GLES app (`gles-video`'s guest) and the hogs
//! unmodified glmark2-es2 instances rendering through virtsoc (`gles.rs`): on a CPU driver
//! their render workers' CPU is the device, weighed per guest only with `--cpu-cgroup`.
//!
//! (c) **Together vs alone** (the Android-on-KVM paper's Table 3 analog): app guests that each
//! compose and present a 1280x720 frame 30 times a second, one alone and two together; the
//! slower guest's shown frame rate together as a percentage of one alone. The display shows
//! its foreground's frames only (the first guest to present, until switched), so frames are
//! counted where they were shown: the run is cut in parts, each guest the foreground for
//! one, and its rate is the display's count of its scanned-out frames in its part
//! (`presented_fps` keeps what each guest presented, shown or hidden).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use virtsoc_control::client::{control_path, request, Target};
use virtsoc_control::GuestInfo;
use virtsoc_guest::{ConnectOptions, Connection};
use virtsoc_sched::Kind;

use crate::daemon_proc::DaemonProcess;
use crate::stats::percentile;
use crate::CliError;

mod backlog;
mod chart;
mod codec;
mod cpu;
mod fairness;
mod gles;
mod gpu;
mod grade;
mod multimedia;
mod table;
use backlog::{Control, Gate};
pub use chart::write as write_chart;
pub use cpu::CpuSplit;
use fairness::fairness_on;
#[cfg(test)]
use fairness::together_throughput;
use grade::{Grade, Windows, UNFAIRNESS_TARGET};
pub use multimedia::{cpu_hog, HogKind};
use multimedia::{run_apps, run_multimedia, MultimediaRun};
pub use table::print_table;

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
    /// H.264 decodes of clips of these sizes (`--codec-sizes`; by default 640x360,
    /// 1280x720 and 1920x1080), each guest's decoder with this many threads
    /// (`--codec-threads`).
    Codec([(u32, u32); 3], u32),
}

impl Work {
    fn device(self) -> &'static str {
        match self {
            Work::Gpu(_) => "gpu",
            Work::Codec(..) => "codec",
        }
    }

    fn sizes(self) -> [(u32, u32); 3] {
        match self {
            Work::Gpu(sizes) | Work::Codec(sizes, _) => sizes,
        }
    }

    /// The bytes one unit of work of `size` moves, as the guest counts them: a composition
    /// reads its source image and writes its destination (RGBA), a decode delivers one NV12
    /// picture.
    fn bytes_per_unit(self, (w, h): (u32, u32)) -> u64 {
        let pixels = u64::from(w) * u64::from(h);
        match self {
            Work::Gpu(_) => pixels * 4 * 2,
            Work::Codec(..) => pixels * 3 / 2,
        }
    }

    /// Runs one guest of this work until `stop` (waiting while `gate` is false, queueing
    /// deeper while `deep` is true).
    #[allow(clippy::too_many_arguments)]
    fn guest(
        self,
        target: &str,
        name: &str,
        size: (u32, u32),
        (gate, deep, times): Flags<'_>,
        warm: &Barrier,
        stop: &AtomicBool,
        done: &AtomicU64,
    ) -> Result<(), CliError> {
        let ctl = Control {
            gate,
            stop,
            done,
            deep,
            times,
        };
        match self {
            Work::Gpu(_) => gpu::guest(target, name, gpu::Load::backlogged(size), warm, ctl),
            Work::Codec(_, threads) => codec::guest(target, name, (size, threads), warm, ctl),
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
    /// Run the fairness part on the GPU.
    pub gpu: bool,
    /// Run the fairness part on the codec too.
    pub codec: bool,
    /// Rounds of (alone, together) per guest count on the GPU (the codec runs one).
    pub repeats: usize,
    /// The GPU guests' composition sizes (guest `i` has size `i % 3`).
    pub gpu_sizes: [(u32, u32); 3],
    /// The codec guests' clip sizes (guest `i` has size `i % 3`): one size three times is
    /// the control whose grade does not depend on weighing one size's work against
    /// another's.
    pub codec_sizes: [(u32, u32); 3],
    /// The threads of each codec guest's decoder (`--codec-threads`).
    pub codec_threads: u32,
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
    /// Median over 1 s windows of max |share - ideal| / ideal (a fraction), the shares from
    /// the daemon's device-time meter (the scheduler's own view of what it gave).
    pub unfairness_median: f64,
    pub unfairness_p95: f64,
    /// The same from what the guests got: each guest's units of work done in the window,
    /// from the times its answers came (`grade::work_in`: the unit under way at an edge
    /// counted in part), each weighed by its size's time alone (`alone`'s rate, device
    /// saturated). This is the grade.
    pub unfairness_guest_median: f64,
    pub unfairness_guest_p95: f64,
    /// The same from whole units counted at the windows' edges (the grade until stop 52).
    pub unfairness_guest_counted_median: f64,
    /// Among guests of one size only, no weights (`grade::same_size_unfairness`): median
    /// over the windows, and over the whole run. The scheduler's evenness without the alone
    /// rates' noise and without what sharing costs one size more than another.
    pub unfairness_same_size_median: Option<f64>,
    pub unfairness_same_size_run: Option<f64>,
    /// The grade with each size's work weighed by its cost together, from the meter over
    /// the run (`grade::together_rates`), not alone: median over the windows. What is left
    /// of the grade across sizes once neither the alone rates' noise nor the sizes'
    /// different slowdowns beside each other weigh in (a decomposition, not the grade).
    pub unfairness_together_weights_median: Option<f64>,
    /// The same from the guests' counts over the whole run (each size weighed by its
    /// median rate alone over the run's slices): no window edge in it.
    pub unfairness_guest_run: Option<f64>,
    /// Whether `unfairness_guest_median` is within the target (2%).
    pub unfairness_target_met: bool,
    /// Units of work (compositions, or decoded pictures) each guest counted in the
    /// windows, the whole run, and the bytes they moved (a composition reads and writes
    /// an RGBA image of its size, a decode delivers an NV12 picture).
    pub guest_units: Vec<u64>,
    pub guest_bytes: Vec<u64>,
    /// Each window's units per guest, counted at its edges
    /// (`unfairness_guest_counted_median`) ...
    pub window_units: Vec<Vec<u64>>,
    /// ... and from the answers' times (what `unfairness_guest_median` and `_p95` are
    /// computed from).
    pub window_work: Vec<Vec<f64>>,
    /// How many times its usual queue depth one guest alone keeps queued in the slices
    /// the overhead is measured against (so that it saturates the device).
    pub alone_queue_factor: usize,
    /// Throughput lost against one guest alone, percent: the same commands done by each
    /// size alone would have taken that much less time. The median over interleaved slice
    /// pairs (each size alone, then the guests together, a second apart).
    pub overhead_pct: f64,
    /// The quartiles (25th, 75th percentile) of the slice pairs' overheads (how noisy it
    /// is).
    pub overhead_range_pct: (f64, f64),
    /// How many slice pairs the overhead is the median of.
    pub overhead_pairs: usize,
    /// How much more device time the guests' work took together than the same work alone,
    /// percent (the meter's time per command of each size, together and alone, weighed by
    /// the work done together; median over the slice pairs): the overhead against a
    /// device kept busy, which needs no guest alone that keeps it busy. The codec's guest
    /// alone does not (`cpu_alone_pct`: one decoder with one thread leaves the other core
    /// idle), so against it `overhead_pct` is negative.
    pub overhead_per_unit_pct: Option<f64>,
    /// Its quartiles over the slice pairs.
    pub overhead_per_unit_range_pct: Option<(f64, f64)>,
    /// Throughput lost against round robin with as many guests, percent (when measured):
    /// a round-robin daemon and this scheduler's running at once, their guests' slices
    /// alternating, the median over the slice pairs.
    pub overhead_vs_round_robin_pct: Option<f64>,
    /// The quartiles of those pairs' losses.
    pub overhead_vs_round_robin_range_pct: Option<(f64, f64)>,
    /// Work per second in units of "one guest alone" (the throughput behind both overheads).
    pub throughput: f64,
    /// Where the overhead goes, from the daemon's accounting in the same slice pairs
    /// (medians): the device's busy time, % of a slice, with each size alone ...
    pub busy_alone_pct: Vec<f64>,
    /// ... and with the guests together (below the alone values: the scheduler left the
    /// device idle);
    pub busy_together_pct: f64,
    /// Where the host's cores went (% of one core, medians of the slice pairs), each size
    /// alone ...
    pub cpu_alone_pct: Vec<CpuSplit>,
    /// ... and the guests together: a device whose guest alone leaves cores idle (the
    /// codec's) has no saturating alone rate, and the overhead against it is then negative.
    pub cpu_together_pct: CpuSplit,
    /// the device time per command of each size alone, ms ...
    pub command_ms_alone: Vec<f64>,
    /// How far the alone rates that weigh each size's work in the grade spread over the
    /// slice pairs: interquartile range over the median, percent. The grade cannot tell
    /// guests apart by less than about this.
    pub alone_rate_spread_pct: Vec<f64>,
    /// Per slice pair, in the order run: each size's commands per second alone and its
    /// device time per command alone (ms), the series behind the two medians above.
    pub pair_rates: Vec<Vec<f64>>,
    pub pair_command_ms_alone: Vec<Vec<f64>>,
    /// ... and together (above the alone values: the commands themselves ran slower, e.g.
    /// caches or CPU shared with more guests on a CPU driver).
    pub command_ms_together: Vec<f64>,
    /// Each guest's fraction of the GPU time, whole run.
    pub shares: Vec<f64>,
    pub windows: usize,
    /// Each window's device time per guest, in milliseconds (what the unfairness is computed
    /// from).
    pub window_ms: Vec<Vec<f64>>,
    /// `gpu` or `codec`.
    pub device: String,
    /// Buffers each guest rotates through (GPU: source and destination image pairs; codec:
    /// frame regions), alone and together alike.
    pub rotation: usize,
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
    /// Frames per second of each guest the display showed (scanned out), each measured
    /// while that guest had the screen (the display shows its foreground's frames only;
    /// every guest runs all along).
    pub fps: Vec<f64>,
    /// Frames per second each guest presented in the same part (shown or not).
    pub presented_fps: Vec<f64>,
    /// The slowest guest's shown rate as a percentage of one guest alone's.
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

/// Slice pairs of the overhead measure per round (`fairness::interleaved`).
const SLICE_PAIRS: usize = 4;

/// One run: `n` guests named `share-{round}-{i}` on the daemon at `target`, `seconds`
/// windows: per window the device time per guest (what the daemon's continuous accounting
/// counted in it, the command in service included up to the sample), the units of work
/// each guest counted as answered in it (its own count, read at the same instant), and its
/// work done in it from its answers' times (`grade::work_in`).
fn run_guests(
    work: Work,
    target: &str,
    control: &Target,
    round: usize,
    n: usize,
    seconds: u64,
) -> Result<Windows, CliError> {
    let warm = Barrier::new(n + 1);
    let stop = AtomicBool::new(false);
    let done: Vec<AtomicU64> = (0..n).map(|_| AtomicU64::new(0)).collect();
    let times: Vec<Mutex<Vec<Instant>>> = (0..n).map(|_| Mutex::new(Vec::new())).collect();
    let names: Vec<String> = (0..n).map(|i| format!("share-{round}-{i}")).collect();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|i| {
                let (name, warm, stop, done) = (&names[i], &warm, &stop, &done[i]);
                let size = work.sizes()[i % 3];
                let flags = (None, None, Some(&times[i]));
                s.spawn(move || work.guest(target, name, size, flags, warm, stop, done))
            })
            .collect();
        warm.wait();
        let mut edges = Vec::new();
        let measured = (|| -> Result<Windows, CliError> {
            std::thread::sleep(SETTLE);
            let mut out = Windows::default();
            let counts =
                || -> Vec<u64> { done.iter().map(|c| c.load(Ordering::Relaxed)).collect() };
            let mut last = device_time(control, work.device())?;
            let mut last_units = counts();
            edges.push(Instant::now());
            let mut read = Instant::now();
            for _ in 1..=seconds {
                let next = next_reading(read);
                std::thread::sleep(next.saturating_duration_since(Instant::now()));
                let units = counts();
                edges.push(Instant::now());
                let now = device_time(control, work.device())?;
                read = Instant::now();
                out.meter_ns.push(
                    names
                        .iter()
                        .map(|g| {
                            let a = now.get(g).copied().unwrap_or(0);
                            a.saturating_sub(last.get(g).copied().unwrap_or(0))
                        })
                        .collect(),
                );
                out.guest_units
                    .push(units.iter().zip(&last_units).map(|(a, b)| a - b).collect());
                last = now;
                last_units = units;
            }
            Ok(out)
        })();
        stop_guests(&stop, &[], handles)?;
        let mut out = measured?;
        for stamps in &times {
            let t = stamps.lock().unwrap_or_else(|e| e.into_inner());
            for (w, win) in grade::work_in(&t, &edges).into_iter().enumerate() {
                if let Some(row) = out.guest_work.get_mut(w) {
                    row.push(win);
                } else {
                    out.guest_work.push(vec![win]);
                }
            }
        }
        Ok(out)
    })
}

/// A guest's gate and deep-queue switches, and where it stamps its answers' times.
type Flags<'a> = (
    Option<&'a Gate>,
    Option<&'a AtomicBool>,
    Option<&'a Mutex<Vec<Instant>>>,
);

/// Ends a run of guest threads: sets `stop`, opens every gate (a guest paused at its gate
/// sees `stop`), and joins `handles`, returning the first guest's error.
fn stop_guests<'s>(
    stop: &AtomicBool,
    gates: &[Gate],
    handles: Vec<std::thread::ScopedJoinHandle<'s, Result<(), CliError>>>,
) -> Result<(), CliError> {
    stop.store(true, Ordering::Relaxed);
    for g in gates {
        g.set(true);
    }
    for h in handles {
        match h.join() {
            Ok(r) => r?,
            Err(_) => return Err(CliError::Usage("a guest thread panicked".into())),
        }
    }
    Ok(())
}

/// How long a fairness window lasts.
const WINDOW: Duration = Duration::from_secs(1);

/// When to take the reading that closes the window opened by the reading done at `read`:
/// a window after it. Not on a fixed schedule from the first reading: a reading that came
/// late (the control API's answer held up on a loaded machine) would then leave the next
/// window short, a few commands long, and one command's worth of device time would make
/// it look unfair (a window of 174 ms after one of 1.8 s was seen with 8 guests).
fn next_reading(read: Instant) -> Instant {
    read + WINDOW
}

/// Three `WxH` sizes.
/// Three `WxH` sizes of option `--{option}` (even ones where `even`: 4:2:0 clips).
pub fn parse_sizes(option: &str, v: &[String], even: bool) -> Result<[(u32, u32); 3], CliError> {
    let what = if even { "even " } else { "" };
    let bad = || CliError::Usage(format!("--{option} wants three {what}WxH sizes, not {v:?}"));
    let sizes: Vec<(u32, u32)> = v
        .iter()
        .map(|s| {
            let (w, h) = s.split_once('x').ok_or_else(bad)?;
            let (w, h) = (w.parse().map_err(|_| bad())?, h.parse().map_err(|_| bad())?);
            if w == 0 || h == 0 || w > 4096 || h > 4096 || (even && (w % 2 == 1 || h % 2 == 1)) {
                return Err(bad());
            }
            Ok((w, h))
        })
        .collect::<Result<_, _>>()?;
    sizes.try_into().map_err(|_| bad())
}

/// `gpu`, `cpu` and/or `gles`.
pub fn parse_hog_kinds(v: &[String]) -> Result<Vec<HogKind>, CliError> {
    v.iter()
        .map(|s| match s.as_str() {
            "gpu" => Ok(HogKind::Gpu),
            "cpu" => Ok(HogKind::Cpu),
            "gles" => Ok(HogKind::Gles),
            _ => Err(CliError::Usage(format!(
                "--hog-kind wants gpu, cpu and/or gles, not {s:?}"
            ))),
        })
        .collect()
}

/// Runs the benchmark.
pub fn run(p: &SharingParams) -> Result<SharingReport, CliError> {
    let mut alone = Vec::new();
    let fairness = if p.gpu {
        fairness_on(Work::Gpu(p.gpu_sizes), p, p.repeats, &mut alone)?
    } else {
        Vec::new()
    };
    let fairness_codec = if p.codec {
        fairness_on(
            Work::Codec(p.codec_sizes, p.codec_threads),
            p,
            1,
            &mut alone,
        )?
    } else {
        Vec::new()
    };
    let mut multimedia = Vec::new();
    // GPU hogs: round robin and feedback; CPU spinners and GLES hogs: round robin, feedback
    // on device shares alone, and feedback steering CPU weights too.
    let runs = [
        (HogKind::Gpu, Kind::RoundRobin, false),
        (HogKind::Gpu, Kind::Feedback, false),
        (HogKind::Cpu, Kind::RoundRobin, false),
        (HogKind::Cpu, Kind::Feedback, false),
        (HogKind::Cpu, Kind::Feedback, true),
        (HogKind::Gles, Kind::RoundRobin, false),
        (HogKind::Gles, Kind::Feedback, false),
        (HogKind::Gles, Kind::Feedback, true),
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
            multimedia.push(match hog {
                HogKind::Gles => gles::run_gles(r, p.seconds)?,
                _ => run_multimedia(r, p.seconds)?,
            });
        }
    }
    let mut together = Vec::new();
    if p.together {
        for kind in [Kind::RoundRobin, Kind::Wfq] {
            let alone = run_apps(kind, 1, p.seconds)?;
            let two = run_apps(kind, 2, p.seconds)?;
            let base = alone.shown_fps.first().copied().unwrap_or(0.0).max(1e-9);
            for apps in [alone, two] {
                together.push(TogetherRow {
                    scheduler: kind.name().to_string(),
                    guests: apps.shown_fps.len(),
                    vs_alone_pct: apps.shown_fps.iter().copied().fold(f64::INFINITY, f64::min)
                        / base
                        * 100.0,
                    fps: apps.shown_fps,
                    presented_fps: apps.presented_fps,
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
    fn a_late_reading_does_not_shorten_the_next_window() {
        let t0 = Instant::now();
        // The first reading came 0.8 s late: the next window still lasts a whole window.
        let late = t0 + WINDOW + Duration::from_millis(800);
        assert_eq!(next_reading(late) - late, WINDOW);
        assert!(next_reading(late) > t0 + 2 * WINDOW);
    }

    #[test]
    fn sizes_parse_and_bad_ones_are_refused() {
        let v: Vec<String> = ["320x180", "640x360", "961x540"].map(String::from).to_vec();
        assert_eq!(
            parse_sizes("gpu-sizes", &v, false).unwrap(),
            [(320, 180), (640, 360), (961, 540)]
        );
        // A codec clip is 4:2:0: odd sizes are refused there.
        let e = parse_sizes("codec-sizes", &v, true).unwrap_err();
        assert!(
            e.to_string().contains("--codec-sizes wants three even"),
            "{e}"
        );
        for bad in [
            vec!["320x180"],
            vec!["0x1", "1x1", "1x1"],
            vec!["a", "b", "c"],
        ] {
            let v: Vec<String> = bad.into_iter().map(String::from).collect();
            assert!(parse_sizes("gpu-sizes", &v, false).is_err(), "{v:?}");
        }
    }
}
