//! `virtsoc bench sharing`: how fairly the daemon's schedulers share the GPU.
//!
//! (a) **Fairness.** For each scheduler (`virtsocd --scheduler`), a daemon of its own serves
//! 2, 4 and 8 guests with equal shares. Each guest is a thread of this process with its own
//! connection (its own session, rings and window) looping GPU compositions, one in flight,
//! of a size that differs from guest to guest (320x180, 960x540, 1280x720 in turn), so the
//! per-command cost differs several-fold. Every second the bench reads each guest's GPU device
//! time from the daemon's control API (the worker's accounting, as AvA reads its API
//! server's): the window's unfairness is `max over guests |share - ideal| / ideal`, reported as
//! the median and p95 over the windows. Throughput is the work done, each command counted as
//! `1 / (commands per second of its size alone)`, per second: `overhead_pct` is how much less
//! than one (the device as busy as with one guest alone) that is. One closed-loop guest leaves
//! the device idle during its round trips, so several guests can beat it (a negative
//! overhead); `overhead_vs_round_robin_pct` compares with round robin and as many guests.
//!
//! (b) **Multimedia.** A video guest composes a 1280x720 frame on the GPU and presents it on
//! the display 30 times a second, against 1, 2 and 4 hog guests looping 1920x1080
//! compositions (each guest one in flight); its presented rate (the display's count) as a percentage of its desired 30
//! fps, with round robin and with the `feedback` scheduler (the video guest's policy class is
//! `multimedia`: the DFR loop raises its share and boosts it while it is behind).
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
use virtsoc_guest::devices as api;
use virtsoc_guest::{ConnectOptions, Connection, Format};
use virtsoc_sched::Kind;

use crate::bench_svm::OrderingMode;
use crate::daemon_proc::DaemonProcess;
use crate::scenario::full_layer;
use crate::scenario::pipe::Pipe;
use crate::stats::percentile;
use crate::CliError;

/// The composition sizes guests cycle through.
const SIZES: [(u32, u32); 3] = [(320, 180), (960, 540), (1280, 720)];

mod codec;
mod multimedia;
use multimedia::{run_apps, run_multimedia};

/// The device the fairness part loads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Work {
    /// GPU compositions of [`SIZES`].
    Gpu,
    /// H.264 decodes of 360p, 720p and 1080p clips.
    Codec,
}

impl Work {
    fn device(self) -> &'static str {
        match self {
            Work::Gpu => "gpu",
            Work::Codec => "codec",
        }
    }

    fn sizes(self) -> [(u32, u32); 3] {
        match self {
            Work::Gpu => SIZES,
            Work::Codec => [(640, 360), (1280, 720), (1920, 1080)],
        }
    }

    /// Runs one guest of this work until `stop`.
    fn guest(
        self,
        target: &str,
        name: &str,
        size: (u32, u32),
        warm: &Barrier,
        stop: &AtomicBool,
        done: &AtomicU64,
    ) -> Result<(), CliError> {
        match self {
            Work::Gpu => guest(target, name, size, warm, stop, done),
            Work::Codec => codec::guest(target, name, size, warm, stop, done),
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
    /// Run the two-guests-together part.
    pub together: bool,
    /// Run the fairness part on the codec too.
    pub codec: bool,
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
    /// Throughput lost against one guest alone, percent (negative: the guests together keep
    /// the device busier than one closed-loop guest can).
    pub overhead_pct: f64,
    /// Throughput lost against round robin with as many guests, percent (when measured).
    pub overhead_vs_round_robin_pct: Option<f64>,
    /// Work per second in units of "one guest alone" (the throughput behind both overheads).
    pub throughput: f64,
    /// Each guest's fraction of the GPU time, whole run.
    pub shares: Vec<f64>,
    pub windows: usize,
}

/// One multimedia configuration.
#[derive(Debug, Clone, Serialize)]
pub struct MultimediaRow {
    pub scheduler: String,
    pub hogs: usize,
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

/// What one guest thread does until `stop`: compositions of `size`, one at a time.
fn guest(
    target: &str,
    name: &str,
    (w, h): (u32, u32),
    warm: &Barrier,
    stop: &AtomicBool,
    done: &AtomicU64,
) -> Result<(), CliError> {
    let setup = || -> Result<_, CliError> {
        let conn = open_guest(target, name, w as u64 * h as u64 * 4 * 3 + (16 << 20))?;
        let src = conn.alloc(0, w, h, Format::Rgba8, 0)?.id;
        let dst = conn.alloc(0, w, h, Format::Rgba8, 0)?.id;
        let layers = conn.alloc_blob(api::LAYER_RECORD as u64)?.id;
        Ok((conn, src, dst, layers))
    };
    let r = setup();
    let (conn, src, dst, layers) = match r {
        Ok(x) => x,
        Err(e) => {
            warm.wait();
            return Err(e);
        }
    };
    let mut p = Pipe::new(&conn, OrderingMode::Atomic);
    let one = |p: &mut Pipe| -> Result<(), CliError> {
        let t = p.run_with(
            &api::gpu::Composite {
                layers,
                count: 1,
                dst,
            },
            &[src],
        )?;
        p.result(t)?;
        Ok(())
    };
    let warmed = (|| -> Result<(), CliError> {
        p.cpu_write(src, &vec![0x80u8; (w * h * 4) as usize])?;
        p.cpu_write(layers, &full_layer(src, w, h, false).to_bytes())?;
        for _ in 0..3 {
            one(&mut p)?;
        }
        Ok(())
    })();
    warm.wait();
    warmed?;
    while !stop.load(Ordering::Relaxed) {
        one(&mut p)?;
        done.fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}

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

/// One run: `n` guests against a fresh daemon with `kind`; per-window GPU time per guest and
/// each guest's completed commands.
#[allow(clippy::type_complexity)]
fn run_guests(
    work: Work,
    kind: Kind,
    n: usize,
    seconds: u64,
) -> Result<(Vec<Vec<u64>>, Vec<u64>, f64), CliError> {
    let d = DaemonProcess::spawn(&["--scheduler", kind.name()], false)?;
    let target = d.endpoint().target;
    let control = Target::Unix(control_path(std::path::Path::new(&target)));
    let warm = Barrier::new(n + 1);
    let stop = AtomicBool::new(false);
    let done: Vec<AtomicU64> = (0..n).map(|_| AtomicU64::new(0)).collect();
    let names: Vec<String> = (0..n).map(|i| format!("share-{i}")).collect();
    let result = std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|i| {
                let (t, name, warm, stop, done) = (&target, &names[i], &warm, &stop, &done[i]);
                let size = work.sizes()[i % 3];
                s.spawn(move || work.guest(t, name, size, warm, stop, done))
            })
            .collect();
        warm.wait();
        let measured = (|| -> Result<_, CliError> {
            let mut windows = Vec::new();
            let mut last = device_time(&control, work.device())?;
            let c0: Vec<u64> = done.iter().map(|c| c.load(Ordering::Relaxed)).collect();
            let t0 = Instant::now();
            for k in 1..=seconds {
                let next = t0 + Duration::from_secs(k);
                std::thread::sleep(next.saturating_duration_since(Instant::now()));
                let now = device_time(&control, work.device())?;
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
    });
    d.stop()?;
    result
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
    let fairness = fairness_on(Work::Gpu, p, &mut alone)?;
    let fairness_codec = if p.codec {
        fairness_on(Work::Codec, p, &mut alone)?
    } else {
        Vec::new()
    };
    let mut multimedia = Vec::new();
    for kind in [Kind::RoundRobin, Kind::Feedback] {
        for &h in &p.hogs {
            multimedia.push(run_multimedia(kind, h, p.seconds)?);
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

/// Part (a) on one device: every scheduler with every guest count.
fn fairness_on(
    work: Work,
    p: &SharingParams,
    alone_all: &mut Vec<AloneRow>,
) -> Result<Vec<FairnessRow>, CliError> {
    let mut fairness = Vec::new();
    for kind in &p.schedulers {
        let mut alone = Vec::new();
        for (w, h) in work.sizes() {
            let (counts, secs) = run_alone(work, *kind, w, h, p.seconds.min(3))?;
            alone.push(AloneRow {
                device: work.device().to_string(),
                scheduler: kind.name().to_string(),
                size: format!("{w}x{h}"),
                commands_per_s: counts as f64 / secs,
            });
        }
        for &n in &p.guests {
            let (windows, counts, secs) = run_guests(work, *kind, n, p.seconds)?;
            let mut us: Vec<f64> = windows.iter().filter_map(|w| unfairness(w)).collect();
            us.sort_by(f64::total_cmp);
            let work: f64 = counts
                .iter()
                .enumerate()
                .map(|(i, c)| *c as f64 / alone[i % 3].commands_per_s.max(1e-9))
                .sum();
            let total: Vec<u64> = (0..n).map(|g| windows.iter().map(|w| w[g]).sum()).collect();
            let all: u64 = total.iter().sum::<u64>().max(1);
            fairness.push(FairnessRow {
                scheduler: kind.name().to_string(),
                guests: n,
                unfairness_median: percentile(&us, 50.0),
                unfairness_p95: percentile(&us, 95.0),
                overhead_pct: (1.0 - work / secs) * 100.0,
                overhead_vs_round_robin_pct: fairness
                    .iter()
                    .find(|r: &&FairnessRow| r.scheduler == "round-robin" && r.guests == n)
                    .map(|r| (1.0 - work / secs / r.throughput.max(1e-9)) * 100.0),
                throughput: work / secs,
                shares: total.iter().map(|t| *t as f64 / all as f64).collect(),
                windows: us.len(),
            });
        }
        alone_all.extend(alone);
    }
    Ok(fairness)
}

/// One guest of size `w` x `h` alone under `kind`: its completed commands and the seconds.
fn run_alone(work: Work, kind: Kind, w: u32, h: u32, seconds: u64) -> Result<(u64, f64), CliError> {
    let d = DaemonProcess::spawn(&["--scheduler", kind.name()], false)?;
    let target = d.endpoint().target;
    let warm = Barrier::new(2);
    let stop = AtomicBool::new(false);
    let done = AtomicU64::new(0);
    let r = std::thread::scope(|s| {
        let h = s.spawn(|| work.guest(&target, "share-alone", (w, h), &warm, &stop, &done));
        warm.wait();
        let c0 = done.load(Ordering::Relaxed);
        let t0 = Instant::now();
        std::thread::sleep(Duration::from_secs(seconds));
        let c = done.load(Ordering::Relaxed) - c0;
        let secs = t0.elapsed().as_secs_f64();
        stop.store(true, Ordering::Relaxed);
        match h.join() {
            Ok(r) => r.map(|()| (c, secs)),
            Err(_) => Err(CliError::Usage("the guest thread panicked".into())),
        }
    });
    d.stop()?;
    r
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
        "{:<12} {:>6} {:>12} {:>10} {:>10} {:>10}  shares",
        "scheduler", "guests", "unfair p50%", "p95%", "overhead%", "vs rr %"
    );
    for f in rows {
        let shares: Vec<String> = f.shares.iter().map(|s| format!("{:.3}", s)).collect();
        println!(
            "{:<12} {:>6} {:>12.1} {:>10.1} {:>10.1} {:>10}  {}",
            f.scheduler,
            f.guests,
            f.unfairness_median * 100.0,
            f.unfairness_p95 * 100.0,
            f.overhead_pct,
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
            "{:<12} {:>5} {:>8} {:>8} {:>12}",
            "scheduler", "hogs", "% of DFR", "fps", "hog cmds/s"
        );
    }
    for m in &r.multimedia {
        println!(
            "{:<12} {:>5} {:>8.1} {:>8.1} {:>12.1}",
            m.scheduler, m.hogs, m.dfr_pct, m.presented_fps, m.hog_commands_per_s
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
