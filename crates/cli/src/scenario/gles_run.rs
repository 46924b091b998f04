//! What the GLES scenarios (`gles-video`, `gles-camera`) share: each mode's guest runs in a
//! child process of its own (the vendor library makes one connection per process, and
//! `--compare` runs each mode against a daemon of its own), started with [`GUEST_ENV`] set,
//! whose JSON row the parent reads; the child's connection takes the mode's coherence
//! protocol from `VIRTSOC_COHERENCE`. Then the frame pacing, the counters before the run
//! and the row after it.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::gles_egl::Egl;
use super::{cpu_seconds, daemon_cpu_seconds, RunExtra, RunOpts, ScenarioResult};
use crate::bench_svm::OrderingMode;
use crate::stats::P50P99;
use crate::CliError;

/// Set in the child that runs the guest.
pub const GUEST_ENV: &str = "VIRTSOC_GLES_SCENARIO_GUEST";
/// The daemon's pid, for the child's CPU figures.
const PID_ENV: &str = "VIRTSOC_GLES_SCENARIO_DAEMON_PID";

/// The guest of one GLES scenario, run in the child: its row.
pub type Guest = fn(Option<u32>, &RunOpts, &RunExtra) -> Result<ScenarioResult, CliError>;

/// Runs one mode of scenario `o.scenario`: in a child process (module docs), or, in that
/// child, `guest` itself.
pub fn run(
    target: &str,
    daemon_pid: Option<u32>,
    o: &RunOpts,
    x: &RunExtra,
    guest: Guest,
) -> Result<ScenarioResult, CliError> {
    if std::env::var_os(GUEST_ENV).is_some() {
        let pid = daemon_pid.or_else(|| std::env::var(PID_ENV).ok()?.parse().ok());
        return guest(pid, o, x);
    }
    let exe = std::env::current_exe()?;
    let json = crate::bench_gles::env::write_vendor_json()?;
    let res = match (o.width, o.height) {
        (640, 360) => "360p",
        (1280, 720) => "720p",
        (3840, 2160) => "uhd",
        _ => "1080p",
    };
    let mut cmd = Command::new(exe);
    cmd.args([
        "run",
        &o.scenario,
        "--socket",
        target,
        "--protocol",
        &o.protocol,
    ])
    .args([
        "--ordering",
        if o.ordering == OrderingMode::Fence {
            "fence"
        } else {
            "atomic"
        },
    ])
    .args(["--seconds", &o.seconds.to_string(), "--resolution", res])
    .args(["--fps", &o.fps.to_string(), "--json"])
    .args(["--in-flight", &x.in_flight.to_string()])
    .env(GUEST_ENV, "1")
    .env("VIRTSOC_SOCKET", target)
    .env("VIRTSOC_COHERENCE", &o.protocol)
    .env("__EGL_VENDOR_LIBRARY_FILENAMES", &json)
    .stderr(Stdio::inherit());
    // The guest ends with this process (a bench may kill it before its time is up).
    crate::bench_gles::env::die_with_parent(&mut cmd);
    // Only an atomic guest times its stages (with `--compare`, the fence modes run plain).
    if x.breakdown && o.ordering == OrderingMode::Atomic {
        cmd.arg("--breakdown");
    }
    if let Some(pid) = daemon_pid {
        cmd.env(PID_ENV, pid.to_string());
    }
    let out = cmd.output()?;
    if !out.status.success() {
        return Err(CliError::Usage(format!(
            "the {} guest failed ({})",
            o.scenario, out.status
        )));
    }
    let rows: Vec<ScenarioResult> = serde_json::from_slice(&out.stdout)?;
    rows.into_iter()
        .next()
        .ok_or_else(|| CliError::Usage("the guest answered no row".into()))
}

/// Counters at the start of the measured run.
pub struct Before {
    hits: u64,
    misses: u64,
    copies: u64,
    copy_ns: u64,
    ledger: Vec<(String, String, u64, u64)>,
    cpu_guest: f64,
    cpu_daemon: Option<f64>,
}

/// The daemon's memory domains (the guest window, host RAM, the devices'), read on a
/// connection of its own (the vendor library's is inside the library).
fn domains() -> Result<Vec<String>, CliError> {
    let target = std::env::var("VIRTSOC_SOCKET").unwrap_or_else(|_| "/tmp/virtsoc.sock".into());
    let c = virtsoc_guest::Connection::open(&target, &virtsoc_guest::ConnectOptions::default())?;
    let mut names = vec!["guest-window".to_string(), "host-ram".to_string()];
    for d in c.devices() {
        if !names.contains(&d.domain) {
            names.push(d.domain.clone());
        }
    }
    c.close();
    Ok(names)
}

pub fn snapshot(egl: &Egl, pid: Option<u32>) -> Result<Before, CliError> {
    let mut ledger = Vec::new();
    let all = domains()?;
    for s in &all {
        for d in &all {
            let (c, b) = egl.ledger(s, d)?;
            ledger.push((s.to_string(), d.to_string(), c, b));
        }
    }
    Ok(Before {
        hits: egl.counter(c"hits")?,
        misses: egl.counter(c"misses")?,
        copies: egl.counter(c"copies")? + egl.counter(c"device_copies")?,
        copy_ns: egl.counter(c"copy_ns")?,
        ledger,
        cpu_guest: cpu_seconds(std::process::id()).unwrap_or(0.0),
        cpu_daemon: pid.and_then(daemon_cpu_seconds),
    })
}

/// `--breakdown`: each stage of a frame finished before the next (the GL's work with a fence
/// sync the guest waits on) and its duration kept, so the row says where each millisecond
/// goes. Off, it costs nothing and changes nothing.
pub struct Stages {
    names: &'static [&'static str],
    ms: Vec<Vec<f64>>,
    on: bool,
    at: Instant,
}

impl Stages {
    /// Stages `names`, in the order a frame passes them; timed only when `on`.
    pub fn new(names: &'static [&'static str], on: bool) -> Stages {
        Stages {
            names,
            ms: vec![Vec::new(); names.len()],
            on,
            at: Instant::now(),
        }
    }

    /// A frame's first stage starts now.
    pub fn start(&mut self) {
        self.at = Instant::now();
    }

    /// Ends stage `k` of the frame, once the GL has finished what was asked of it when `gl`.
    pub fn end(&mut self, egl: &Egl, k: usize, gl: bool) -> Result<(), CliError> {
        if !self.on {
            return Ok(());
        }
        if gl {
            egl.finish_sync(egl.sync(super::gles_egl::SYNC_FENCE, &[])?)?;
        }
        let now = Instant::now();
        if let Some(v) = self.ms.get_mut(k) {
            v.push((now - self.at).as_secs_f64() * 1e3);
        }
        self.at = now;
        Ok(())
    }

    /// Each stage's p50 (ms); empty when not timed.
    fn p50s(&self) -> Vec<(String, f64)> {
        if !self.on {
            return Vec::new();
        }
        self.names
            .iter()
            .zip(&self.ms)
            .map(|(n, v)| {
                let mut v = v.clone();
                v.sort_by(|a, b| a.total_cmp(b));
                (n.to_string(), P50P99::of(&v).p50)
            })
            .collect()
    }
}

/// Sleeps until frame `i`'s start on the schedule from `anchor`; returns whether to drop
/// the frame: more than a frame late, the schedule re-anchors at now and every other late
/// frame is dropped (as the other scenarios do), so a pipeline slower than the frame rate
/// still shows frames.
pub fn pace(anchor: &mut Instant, dropped_last: &mut bool, i: u64, period: Duration) -> bool {
    let start = *anchor + period * i as u32;
    let now = Instant::now();
    if start > now {
        std::thread::sleep(start - now);
        *dropped_last = false;
        return false;
    }
    let behind = now - start;
    if behind <= period {
        *dropped_last = false;
        return false;
    }
    *anchor += behind;
    *dropped_last = !*dropped_last;
    *dropped_last
}

/// The run's row from the counters, the display's statistics and the latches' latencies.
pub fn row(
    egl: &Egl,
    o: &RunOpts,
    pid: Option<u32>,
    b: &Before,
    (frames_in, late, wall): (u64, u64, f64),
    stages: &Stages,
) -> Result<ScenarioResult, CliError> {
    let st = egl.command(c"display", c"stats", &[])?;
    // The consuming display sink: enabled, frames, bytes, missed.
    let sink = egl.command(c"display", c"sink", &[])?;
    let (presented, dropped, p50, p99) = (st[0], st[1], st[3], st[4]);
    let frames = frames_in.max(1) as f64;
    let mut ledger = Vec::new();
    for (s, d, c0, b0) in &b.ledger {
        let (c, bytes) = egl.ledger(s, d)?;
        if c > *c0 {
            ledger.push(serde_json::json!({
                "link": format!("{s}->{d}"),
                "copies_per_frame": (c - c0) as f64 / frames,
                "mb_per_frame": (bytes - b0) as f64 / 1e6 / frames,
            }));
        }
    }
    let (hits, misses) = (
        egl.counter(c"hits")? - b.hits,
        egl.counter(c"misses")? - b.misses,
    );
    let copies = egl.counter(c"copies")? + egl.counter(c"device_copies")? - b.copies;
    let copy_ns = egl.counter(c"copy_ns")? - b.copy_ns;
    let mut access = egl.import_latency_us()?;
    access.sort_by(|a, b| a.total_cmp(b));
    let acc = P50P99::of(&access);
    let cpu_daemon = b
        .cpu_daemon
        .zip(pid.and_then(daemon_cpu_seconds))
        .map(|(a, z)| (z - a) / wall * 100.0);
    let cpu_guest = (cpu_seconds(std::process::id()).unwrap_or(0.0) - b.cpu_guest) / wall * 100.0;
    let v = serde_json::json!({
        "scenario": o.scenario,
        "protocol": o.protocol,
        "ordering": format!("{:?}", o.ordering).to_lowercase(),
        "resolution": format!("{}x{}", o.width, o.height),
        "target_fps": o.fps,
        "seconds": wall,
        "presented_fps": presented as f64 / wall,
        "frames_in": frames_in,
        "presented": presented,
        "dropped": late + dropped,
        "dropped_late": late,
        "dropped_replaced": dropped,
        "latency_ms": {"p50": p50 as f64 / 1e6, "p99": p99 as f64 / 1e6},
        "access_latency_us": {"p50": acc.p50, "p99": acc.p99},
        "copies_per_frame": copies as f64 / frames,
        "ledger": ledger,
        "composition": "gles",
        "pacing": "free",
        "coherence_ms_per_frame": copy_ns as f64 / 1e6 / frames,
        "prediction_accuracy": (hits + misses > 0).then(|| hits as f64 / (hits + misses) as f64),
        "cpu_daemon_pct": cpu_daemon,
        "cpu_guest_pct": cpu_guest,
        "display_sink": if sink[0] != 0 { "crc" } else { "none" },
        "sink_bytes_per_frame": sink[2] as f64 / sink[1].max(1) as f64,
        "sink_missed": sink[3],
        "stages_ms": stages.p50s(),
    });
    Ok(serde_json::from_value(v)?)
}
