//! `virtsoc run SCENARIO`: the paper's application workloads (vSoC Table 1) as guest
//! processes driving real devices through the guest library, measured per coherence protocol
//! and ordering mode in one invocation (`--compare`).
//!
//! - `uhd-video`: decode (codec) -> composite with a UI layer (GPU) -> display, with
//!   presentation deadlines: a frame that is late by more than one frame period is dropped;
//! - `video-360`: as above with an equirectangular projection (GPU) whose view turns;
//! - `camera`: camera -> ISP (NV12 to RGBA) -> GPU preview composite -> display;
//! - `ar`: camera -> ISP -> GPU composite + markers on the tracked point -> display, with a
//!   second reader of each camera frame (the tracker), a two-reader flow;
//! - `livestream`: camera -> encoder -> RTMP push to a local nginx, pulled back, decoded,
//!   composited and displayed (see `livestream.rs`);
//! - `gles-video`: codec -> an EGLImage of the decoded region drawn by OpenGL ES with a UI
//!   layer -> display (`gles_video.rs`);
//! - `gles-camera`: camera -> ISP -> an EGLImage of the RGBA frame drawn by OpenGL ES through
//!   an effect -> display (`gles_camera.rs`).

mod gles_camera;
mod gles_egl;
mod gles_run;
pub mod gles_video;
mod livestream;
pub mod media;
mod pacing;
pub mod pipe;
pub mod rounds;
pub mod show;
mod video;
pub use pacing::Pacing;

use std::time::{Duration, Instant};

use serde::Serialize;
use virtsoc_guest::devices::{self as api, LayerRecord, MarkerRecord};
use virtsoc_guest::{ConnectOptions, Connection, Format};

use crate::bench_svm::OrderingMode;
use crate::stats::P50P99;
use crate::CliError;
use pipe::Pipe;
use show::{layer_blob, screen_layer, Composition, Show};
use virtsoc_devapi::RegionId;

/// The scenarios.
pub const SCENARIOS: [&str; 7] = [
    "uhd-video",
    "video-360",
    "camera",
    "ar",
    "livestream",
    "gles-video",
    "gles-camera",
];

/// How to run a scenario.
#[derive(Debug, Clone)]
pub struct RunOpts {
    pub scenario: String,
    pub protocol: String,
    pub ordering: OrderingMode,
    pub seconds: f64,
    pub width: u32,
    pub height: u32,
    pub fps: u32,
    pub composition: Composition,
    /// When each frame starts.
    pub pacing: Pacing,
}

/// How to run a scenario beyond [`RunOpts`] (kept apart so that its other users need no
/// change): the clip of the video scenarios, the GLES scenarios' queue depth and stage
/// timing.
#[derive(Debug, Clone, Copy)]
pub struct RunExtra {
    pub clip: media::Clip,
    /// GLES scenarios, fence ordering: frames drawn but not finished by the GL that the
    /// guest lets be queued before it waits for the oldest.
    pub in_flight: usize,
    /// GLES scenarios, atomic ordering: finish and time every stage of every frame.
    pub breakdown: bool,
}

impl Default for RunExtra {
    /// The cheap clip (what [`run`] and [`run_on`] always used).
    fn default() -> Self {
        RunExtra {
            clip: media::Clip::Cheap,
            in_flight: gles_video::IN_FLIGHT,
            breakdown: false,
        }
    }
}

/// The resolution and frame rate a scenario runs at unless told: `uhd-video` is the paper's
/// UHD case (3840x2160 at 60 fps), the others 1080p at 30 fps.
pub fn defaults(scenario: &str) -> (&'static str, u32) {
    match scenario {
        "uhd-video" => ("uhd", 60),
        _ => ("1080p", 30),
    }
}

/// Copies of frame bytes on one link of the host's ledger, per frame.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct LedgerRow {
    /// `source->destination` memory domains (the same twice: a device's own copy).
    pub link: String,
    pub copies_per_frame: f64,
    pub mb_per_frame: f64,
}

/// What one run measured.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct ScenarioResult {
    pub scenario: String,
    pub protocol: String,
    pub ordering: String,
    pub resolution: String,
    pub target_fps: u32,
    pub seconds: f64,
    /// Frames scanned out by the display per second.
    pub presented_fps: f64,
    pub frames_in: u64,
    pub presented: u64,
    /// Frames dropped for missing their deadline plus frames replaced before a vsync.
    pub dropped: u64,
    /// Of those: the guest was more than a frame late (or the decoder held the frame back).
    #[serde(default)]
    pub dropped_late: u64,
    /// Of those: the display replaced them with a newer frame before a vsync.
    #[serde(default)]
    pub dropped_replaced: u64,
    /// Motion-to-photon latency (capture or decode to scan-out), ms.
    pub latency_ms: P50P99,
    /// Host-side duration of the devices' read begin_access, us.
    pub access_latency_us: P50P99,
    /// Those durations, sorted and thinned to at most 400 points (for CDFs).
    #[serde(default)]
    pub access_latency_cdf_us: Vec<f64>,
    /// Every copy of frame bytes the host made for this guest (coherence copies, uploads,
    /// readbacks, devices' own copies), per frame in: the sum over `ledger`.
    pub copies_per_frame: f64,
    /// The copies by link.
    #[serde(default)]
    pub ledger: Vec<LedgerRow>,
    /// How layers reached the screen (`planes` or `gpu`), and frames the display's planes
    /// could not show (composed on the GPU instead).
    #[serde(default)]
    pub composition: String,
    #[serde(default)]
    pub composition_fallbacks: u64,
    /// When frames started (`vsync` or `free`, see [`Pacing`]).
    #[serde(default)]
    pub pacing: String,
    pub coherence_ms_per_frame: f64,
    pub prediction_accuracy: Option<f64>,
    /// CPU time over wall time, percent of one core.
    pub cpu_daemon_pct: Option<f64>,
    pub cpu_guest_pct: f64,
    /// The clip of a video scenario (`cheap` or `realistic`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clip: Option<String>,
    /// What consumed the presented frames in the daemon (`crc`: every byte of every plane
    /// read once per scanned-out frame; `none`), and the bytes it read per presented frame.
    #[serde(default)]
    pub display_sink: String,
    #[serde(default)]
    pub sink_bytes_per_frame: f64,
    /// Frames the sink could not read because it was still busy with earlier ones.
    #[serde(default)]
    pub sink_missed: u64,
    /// With `--breakdown` (GLES scenarios): each stage's p50 in ms per frame, in the order
    /// a frame passes them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stages_ms: Vec<(String, f64)>,
    /// With `--rounds`: the rows of every round (this row holds their medians).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rounds: Vec<ScenarioResult>,
}

/// CLOCK_MONOTONIC in ns (the daemon's media clock: process guests share it).
fn now_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// CPU seconds of process `pid` from /proc: (its own user + system, its reaped children's).
fn proc_cpu(pid: u32) -> Option<(f64, f64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<f64> = rest
        .split_whitespace()
        .skip(11)
        .take(4)
        .map(|v| v.parse().ok())
        .collect::<Option<_>>()?;
    let tick = rustix::param::clock_ticks_per_second() as f64;
    // utime, stime, cutime, cstime.
    Some((
        (f.first()? + f.get(1)?) / tick,
        (f.get(2)? + f.get(3)?) / tick,
    ))
}

/// CPU seconds (user + system) of process `pid`.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    proc_cpu(pid).map(|(own, _)| own)
}

/// CPU seconds of the daemon `pid` with its decoder workers: its own, its running
/// children's, and those of the children it has reaped.
pub fn daemon_cpu_seconds(pid: u32) -> Option<f64> {
    daemon_cpu(pid).map(|(own, children)| own + children)
}

/// CPU seconds of the daemon `pid`, apart: (its own, its children's, running and reaped).
pub fn daemon_cpu(pid: u32) -> Option<(f64, f64)> {
    let (own, reaped) = proc_cpu(pid)?;
    let live: f64 = live_children(pid).into_iter().filter_map(cpu_seconds).sum();
    Some((own, reaped + live))
}

/// The running children of process `pid` (from each of its threads' `children` list).
fn live_children(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for t in tasks.flatten() {
        if let Ok(list) = std::fs::read_to_string(t.path().join("children")) {
            out.extend(
                list.split_whitespace()
                    .filter_map(|p| p.parse::<u32>().ok()),
            );
        }
    }
    out
}

/// Parses `1080p`, `720p`, `uhd`/`2160p`.
pub fn resolution(s: &str) -> Result<(u32, u32), CliError> {
    match s {
        "720p" => Ok((1280, 720)),
        "1080p" => Ok((1920, 1080)),
        "uhd" | "2160p" => Ok((3840, 2160)),
        "360p" => Ok((640, 360)),
        other => Err(CliError::Usage(format!(
            "--resolution must be 360p, 720p, 1080p or uhd, not {other}"
        ))),
    }
}

/// A UI layer: transparent, with an opaque navigation bar at the bottom and a translucent
/// panel above it. It leaves the top half alone: camera frames carry their capture time
/// stamped in their top quarter, and the display reads it back from the presented pixels.
fn ui_pixels(w: u32, h: u32) -> Vec<u8> {
    let mut px = vec![0u8; (w * h * 4) as usize];
    for y in h / 2..h {
        for x in 0..w {
            let i = ((y * w + x) * 4) as usize;
            if y >= h - h / 16 {
                px[i..i + 4].copy_from_slice(&[30, 30, 40, 255]);
            } else if y > h * 3 / 4 && x > w / 10 && x < w * 9 / 10 {
                px[i..i + 4].copy_from_slice(&[255, 255, 255, 96]);
            }
        }
    }
    px
}

/// `n` image regions of `w` x `h` pixels in `format` (the slots a pipeline rotates through).
pub(crate) fn images(
    conn: &Connection,
    n: usize,
    (w, h): (u32, u32),
    format: Format,
) -> Result<Vec<RegionId>, CliError> {
    (0..n)
        .map(|_| conn.alloc(0, w, h, format, 0).map(|r| r.id))
        .collect::<Result<_, _>>()
        .map_err(CliError::from)
}

/// A layer covering the whole `w` x `h` frame.
pub(crate) fn full_layer(src: RegionId, w: u32, h: u32, blend: bool) -> LayerRecord {
    LayerRecord {
        src,
        crop: [0, 0, w, h],
        dst_pos: [0, 0],
        dst_size: [w, h],
        rotation: 0,
        alpha: 1.0,
        blend,
    }
}

/// Counters of one run; `start` marks the end of setup.
pub struct Common {
    pub(super) frames_in: u64,
    pub(super) late_drops: u64,
    /// When the measured run started: its duration and every rate are taken from here.
    pub(super) t0: Instant,
    /// The frame schedule's origin (frame `i` starts `i` periods after it). A late frame
    /// and the vsync alignment move it; they never move `t0`, which measures the run (when
    /// they did, a pipeline slower than the frame rate ran past `--seconds` while its rates
    /// were divided by the shortened span: uhd-video's realistic clip ran 9.3 s reported as
    /// 3.0 s, presenting 11 fps reported as 34).
    pub(super) anchor: Instant,
    /// Whether the last frame was dropped for being late (see [`pace`]).
    dropped_last: bool,
    before: virtsoc_guest::Counters,
    ledger0: Vec<virtsoc_guest::LedgerLink>,
    cpu_guest0: f64,
    cpu_daemon0: Option<f64>,
    daemon_pid: Option<u32>,
    pacing: Pacing,
}

impl Common {
    /// With vsync pacing, moves the schedule so frame `i` starts its lead before a vsync
    /// (see [`Pacing::Vsync`]).
    fn align(&mut self, conn: &Connection, i: u64, period: Duration) -> Result<(), CliError> {
        self.anchor += pacing::shift(conn, self.pacing, self.anchor, i, period)?;
        Ok(())
    }

    /// Frame `i`'s place in the schedule at `now`: how long to wait before it starts, or,
    /// when it is late, whether to drop it (a late frame re-anchors the schedule at `now`:
    /// [`late_rule`]). Only the schedule moves, never [`Common::t0`].
    fn schedule(&mut self, now: Instant, i: u64, period: Duration) -> (Option<Duration>, bool) {
        let start = self.anchor + period * i as u32;
        if start > now {
            self.dropped_last = false;
            return (Some(start - now), false);
        }
        let (drop, shift) = late_rule(&mut self.dropped_last, now - start, period);
        self.anchor += shift;
        (None, drop)
    }

    /// Setup (media generation, allocation) is done: the measured run starts now.
    pub(super) fn start(&mut self, conn: &Connection) -> Result<(), CliError> {
        self.before = conn.counters()?;
        self.ledger0 = conn.ledger()?;
        self.cpu_guest0 = cpu_seconds(std::process::id()).unwrap_or(0.0);
        self.cpu_daemon0 = self.daemon_pid.and_then(daemon_cpu_seconds);
        self.t0 = Instant::now();
        self.anchor = self.t0;
        Ok(())
    }
}

/// Runs one scenario against the daemon at `target`.
pub fn run(target: &str, daemon_pid: Option<u32>, o: &RunOpts) -> Result<ScenarioResult, CliError> {
    run_ext(target, daemon_pid, o, &RunExtra::default())
}

/// [`run`] with the options of [`RunExtra`].
pub fn run_ext(
    target: &str,
    daemon_pid: Option<u32>,
    o: &RunOpts,
    x: &RunExtra,
) -> Result<ScenarioResult, CliError> {
    match o.scenario.as_str() {
        "gles-video" => return gles_run::run(target, daemon_pid, o, x, gles_video::guest),
        "gles-camera" => return gles_run::run(target, daemon_pid, o, x, gles_camera::guest),
        _ => {}
    }
    let frame_bytes = o.width as u64 * o.height as u64 * 4;
    let conn = Connection::open(
        target,
        &ConnectOptions {
            name: format!("{}-{}-{:?}", o.scenario, o.protocol, o.ordering),
            coherence: Some(o.protocol.clone()),
            window_size: (frame_bytes * 16 + (64 << 20)).min(1 << 30),
            ..ConnectOptions::default()
        },
    )?;
    run_on_ext(&conn, daemon_pid, o, x)
}

/// Runs one scenario on an existing connection (e.g. a guest that also does other work, or
/// migrates meanwhile: `bench migrate`).
pub fn run_on(
    conn: &Connection,
    daemon_pid: Option<u32>,
    o: &RunOpts,
) -> Result<ScenarioResult, CliError> {
    run_on_ext(conn, daemon_pid, o, &RunExtra::default())
}

/// [`run_on`] with the options of [`RunExtra`].
pub fn run_on_ext(
    conn: &Connection,
    daemon_pid: Option<u32>,
    o: &RunOpts,
    x: &RunExtra,
) -> Result<ScenarioResult, CliError> {
    let (w, h) = (o.width, o.height);
    let mut pipe = Pipe::new(conn, o.ordering);
    let mut show = Show::new(&mut pipe, o.composition)?;
    let period = Duration::from_secs_f64(1.0 / o.fps.max(1) as f64);
    let mut common = Common {
        frames_in: 0,
        late_drops: 0,
        t0: Instant::now(),
        anchor: Instant::now(),
        dropped_last: false,
        before: virtsoc_guest::Counters::default(),
        ledger0: Vec::new(),
        cpu_guest0: 0.0,
        cpu_daemon0: None,
        daemon_pid,
        pacing: o.pacing,
    };
    match o.scenario.as_str() {
        "uhd-video" | "video-360" => {
            video::video(&mut pipe, &mut show, (o, x.clip), period, &mut common)?
        }
        "camera" | "ar" => camera(&mut pipe, &mut show, o, period, &mut common)?,
        "livestream" => livestream::livestream(&mut pipe, &mut show, o, period, &mut common)?,
        other => {
            return Err(CliError::Usage(format!(
                "unknown scenario {other} (one of {})",
                SCENARIOS.join(", ")
            )))
        }
    }
    pipe.end_frame(0)?;
    conn.drain()?;
    let wall = common.t0.elapsed().as_secs_f64();
    // Let the last presented frame reach a vsync before reading the display's counters.
    std::thread::sleep(period * 2);
    let st = pipe.conn.command(&api::display::Stats::default())?;
    let sink = pipe.conn.command(&api::display::Sink::default())?;
    let d = conn.counters()?.since(&common.before);
    let scored = d.hits + d.misses;
    let frames = common.frames_in.max(1) as f64;
    let ledger = ledger_rows(conn, &common.ledger0, frames)?;
    let access = P50P99::of(&pipe.access_us);
    Ok(ScenarioResult {
        scenario: o.scenario.clone(),
        protocol: o.protocol.clone(),
        ordering: format!("{:?}", o.ordering).to_lowercase(),
        resolution: format!("{w}x{h}"),
        target_fps: o.fps,
        seconds: wall,
        presented_fps: st.presented as f64 / wall,
        frames_in: common.frames_in,
        presented: st.presented,
        dropped: common.late_drops + st.dropped,
        dropped_late: common.late_drops,
        dropped_replaced: st.dropped,
        latency_ms: P50P99 {
            p50: st.latency_p50_ns as f64 / 1e6,
            p99: st.latency_p99_ns as f64 / 1e6,
        },
        access_latency_us: access,
        access_latency_cdf_us: thin_sorted(&pipe.access_us, 400),
        copies_per_frame: (d.copies + d.device_copies) as f64 / frames,
        ledger,
        composition: match show.composition {
            Composition::Planes => "planes".into(),
            Composition::Gpu => "gpu".into(),
        },
        composition_fallbacks: show.fallbacks,
        pacing: match o.pacing {
            Pacing::Vsync => "vsync".into(),
            Pacing::Free => "free".into(),
        },
        coherence_ms_per_frame: d.copy_ns as f64 / 1e6 / frames,
        prediction_accuracy: (scored > 0).then(|| d.hits as f64 / scored as f64),
        cpu_daemon_pct: common
            .cpu_daemon0
            .zip(daemon_pid.and_then(daemon_cpu_seconds))
            .map(|(a, b)| (b - a) / wall * 100.0),
        cpu_guest_pct: (cpu_seconds(std::process::id()).unwrap_or(0.0) - common.cpu_guest0) / wall
            * 100.0,
        clip: matches!(o.scenario.as_str(), "uhd-video" | "video-360").then(|| match x.clip {
            media::Clip::Cheap => "cheap".into(),
            media::Clip::Realistic => "realistic".into(),
        }),
        display_sink: if sink.enabled != 0 { "crc" } else { "none" }.into(),
        sink_bytes_per_frame: sink.bytes as f64 / sink.frames.max(1) as f64,
        sink_missed: sink.missed,
        stages_ms: Vec::new(),
        rounds: Vec::new(),
    })
}

/// The ledger's growth since `before`, per frame, by link.
fn ledger_rows(
    conn: &Connection,
    before: &[virtsoc_guest::LedgerLink],
    frames: f64,
) -> Result<Vec<LedgerRow>, CliError> {
    Ok(conn
        .ledger()?
        .into_iter()
        .filter_map(|l| {
            let b = before.iter().find(|x| (x.src, x.dst) == (l.src, l.dst));
            let copies = l.copies.saturating_sub(b.map_or(0, |b| b.copies));
            let bytes = l.bytes.saturating_sub(b.map_or(0, |b| b.bytes));
            (copies > 0).then(|| LedgerRow {
                link: format!("{}->{}", conn.domain_name(l.src), conn.domain_name(l.dst)),
                copies_per_frame: copies as f64 / frames,
                mb_per_frame: bytes as f64 / 1e6 / frames,
            })
        })
        .collect())
}

/// Sorts `v` and keeps at most `n` evenly spaced points (the extremes included).
fn thin_sorted(v: &[f64], n: usize) -> Vec<f64> {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    if s.len() <= n || n < 2 {
        return s;
    }
    (0..n).map(|i| s[i * (s.len() - 1) / (n - 1)]).collect()
}

/// Sleeps until frame `i`'s start; returns whether the guest is already more than a frame
/// behind (the frame will miss its deadline: drop it, as Android's renderer does). A late
/// frame re-anchors the schedule at now, and the frame after a dropped one is not dropped,
/// as a player skipping frames does: a pipeline slower than the frame rate (a decoder that
/// cannot keep up) then shows at least every other frame it makes, instead of being behind
/// for good and showing none.
fn pace(c: &mut Common, conn: &Connection, i: u64, period: Duration) -> Result<bool, CliError> {
    c.align(conn, i, period)?;
    let (wait, drop) = c.schedule(Instant::now(), i, period);
    if let Some(w) = wait {
        std::thread::sleep(w);
    }
    Ok(drop)
}

/// The late-frame rule of [`pace`] for a frame `behind` its start: whether to drop it, and how
/// far to move the schedule (re-anchored at now when late); `dropped_last` is updated.
fn late_rule(dropped_last: &mut bool, behind: Duration, period: Duration) -> (bool, Duration) {
    if behind <= period {
        *dropped_last = false;
        return (false, Duration::ZERO);
    }
    *dropped_last = !*dropped_last;
    (*dropped_last, behind)
}

fn camera(
    p: &mut Pipe<'_>,
    show: &mut Show,
    o: &RunOpts,
    period: Duration,
    c: &mut Common,
) -> Result<(), CliError> {
    let (w, h) = (o.width, o.height);
    let screen = show.screen;
    let ar = o.scenario == "ar";
    let conn = p.conn;
    let cams = images(conn, 3, (w, h), Format::Nv12)?;
    let rgbs = images(conn, 3, (w, h), Format::Rgba8)?;
    let ui = conn.alloc(0, screen.0, screen.1, Format::Rgba8, 0)?.id;
    p.cpu_write(ui, &ui_pixels(screen.0, screen.1))?;
    let lists: Vec<(RegionId, Vec<LayerRecord>)> = (0..3)
        .map(|k| -> Result<_, CliError> {
            let records = vec![
                screen_layer(rgbs[k], (w, h), screen, false),
                screen_layer(ui, screen, screen, true),
            ];
            Ok((layer_blob(p, &records)?, records))
        })
        .collect::<Result<_, _>>()?;
    let markers = conn.alloc_blob(api::MARKER_RECORD as u64)?.id;
    c.start(p.conn)?; // setup is not part of the run
    let mut i = 0u64;
    while c.t0.elapsed().as_secs_f64() < o.seconds {
        let late = pace(c, p.conn, i, period)?;
        let k = (i % 3) as usize;
        let cap = p.run(&api::camera::Capture { frame: cams[k] })?;
        c.frames_in += 1;
        if ar {
            // The tracker: a second reader of the camera frame.
            p.run(&api::consumer2::Checksum { region: cams[k] })?;
        }
        if late {
            c.late_drops += 1;
            p.end_frame(0)?;
            i += 1;
            continue;
        }
        p.run(&api::isp::Convert {
            src: cams[k],
            dst: rgbs[k],
        })?;
        if ar {
            // Overlays on the preview need the tracked point: this frame's capture result.
            let r = p.result(cap)?;
            let m = MarkerRecord {
                x: r.marker_x as i32,
                y: r.marker_y as i32,
                size: (w / 40).max(4),
                rgba: [255, 40, 40, 255],
            };
            p.cpu_write(markers, &m.to_bytes())?;
            p.run(&api::gpu::Markers {
                markers,
                count: 1,
                dst: rgbs[k],
            })?;
        }
        // capture_ns 0: the display reads the capture time stamped into the pixels.
        let (blob, records) = &lists[k];
        show.show(p, (*blob, records), (&[rgbs[k], ui], &[rgbs[k]]), 0)?;
        p.end_frame(if o.ordering == OrderingMode::Fence {
            2
        } else {
            0
        })?;
        i += 1;
    }
    Ok(())
}

/// Prints results as a table.
pub fn print_table(rs: &[ScenarioResult]) {
    println!(
        "{:<10} {:<16} {:<6} {:<6} {:>9} {:>6} {:>6} {:>6} {:>8} {:>8} {:>9} {:>7} {:>8} {:>6} {:>6}",
        "scenario",
        "protocol",
        "order",
        "comp",
        "res",
        "fps",
        "shown",
        "drop",
        "m2p p50",
        "m2p p99",
        "acc p50us",
        "copies",
        "coh ms",
        "cpu d%",
        "cpu g%"
    );
    for r in rs {
        println!(
            "{:<10} {:<16} {:<6} {:<6} {:>9} {:>6.1} {:>6} {:>6} {:>8.1} {:>8.1} {:>9.1} {:>7.2} {:>8.2} {:>6.0} {:>6.0}",
            r.scenario,
            r.protocol,
            r.ordering,
            r.composition,
            r.resolution,
            r.presented_fps,
            r.presented,
            r.dropped,
            r.latency_ms.p50,
            r.latency_ms.p99,
            r.access_latency_us.p50,
            r.copies_per_frame,
            r.coherence_ms_per_frame,
            r.cpu_daemon_pct.unwrap_or(f64::NAN),
            r.cpu_guest_pct
        );
    }
    // Where the copies went, for the first row of each distinct ledger.
    if let Some(r) = rs.first() {
        let links: Vec<String> = r
            .ledger
            .iter()
            .map(|l| {
                format!(
                    "{} {:.2}x {:.1} MB",
                    l.link, l.copies_per_frame, l.mb_per_frame
                )
            })
            .collect();
        if !links.is_empty() {
            println!(
                "copies per frame by link ({} {}): {}",
                r.protocol,
                r.ordering,
                links.join(", ")
            );
        }
    }
}

#[cfg(test)]
mod tests;
