//! `virtsoc watch`: a scenario running against a daemon of its own with the live view on,
//! until Ctrl-C (how `make demo` ends: something a person can watch in a browser). With
//! `--measure SECONDS` it measures the view instead: one scenario run during which a viewer
//! (Debian's chromium, headless, on the live view page) is paused and resumed in turn
//! (SIGSTOP/SIGCONT), `--rounds` times, the daemon's CPU taken over each `SECONDS` window; it
//! prints what the view costs the daemon (median of the windows with the viewer against the
//! median without) and the latency the page measured (capture stamp -> frame drawn).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use virtsoc_control::client::{control_path, request, Target};

use crate::bench_svm::OrderingMode;
use crate::daemon_proc::DaemonProcess;
use crate::scenario::{self, show::Composition, RunOpts, ScenarioResult};
use crate::CliError;

/// Options of `virtsoc watch`.
#[derive(Debug, clap::Args)]
pub struct WatchArgs {
    /// The scenario to run (camera, uhd-video, video-360, ar).
    #[arg(default_value = "camera")]
    pub scenario: String,
    /// Where the live view (the daemon's control API on TCP) listens.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: String,
    /// 360p, 720p, 1080p or uhd (default: the scenario's).
    #[arg(long)]
    pub resolution: Option<String>,
    /// Frame rate (default: the scenario's).
    #[arg(long)]
    pub fps: Option<u32>,
    /// Measure the view's cost instead: windows of this many seconds without and with a
    /// headless chromium viewer, alternating, in one scenario run.
    #[arg(long)]
    pub measure: Option<f64>,
    /// Pairs of windows (without, with) of `--measure`.
    #[arg(long, default_value_t = 4)]
    pub rounds: u32,
    /// Print the measurement as JSON.
    #[arg(long)]
    pub json: bool,
    /// Frames per second the page pulls at most.
    #[arg(long, default_value_t = 10)]
    pub view_fps: u32,
    /// The box the page's frames fit (WIDTHxHEIGHT).
    #[arg(long, default_value = "480x480")]
    pub view_max: String,
}

/// The view's cost, from `--measure`.
#[derive(Debug, Serialize)]
pub struct ViewCost {
    pub scenario: String,
    pub resolution: String,
    pub fps: u32,
    /// Seconds per window, and pairs of windows.
    pub seconds: f64,
    pub rounds: u32,
    /// Daemon CPU (percent of one core) without and with the viewer: medians of the windows,
    /// and each window in order.
    pub cpu_daemon_pct_without: f64,
    pub cpu_daemon_pct_with: f64,
    pub cpu_windows_without: Vec<f64>,
    pub cpu_windows_with: Vec<f64>,
    /// (with - without) / without, percent.
    pub extra_cpu_pct: f64,
    /// Frames the display presented per second over the whole run.
    pub presented_fps: f64,
    /// What the page reported: frames drawn per second, capture -> drawn latency.
    pub view_fps: f64,
    /// The page's limits: frames per second and the box frames fit.
    pub view_fps_cap: u32,
    pub view_max: String,
    pub view_latency_ms_p50: f64,
    pub view_latency_ms_p95: f64,
}

/// The chromium binary, if installed.
pub fn chromium() -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths).find_map(|dir| {
            ["chromium", "chromium-browser", "google-chrome"]
                .iter()
                .map(|b| dir.join(b))
                .find(|p| p.is_file())
        })
    })
}

/// Opens `url` in headless chromium with a profile of its own in `profile`, in a process
/// group of its own (so that it can be paused and resumed whole).
fn open_viewer(browser: &PathBuf, url: &str, profile: &std::path::Path) -> std::io::Result<Child> {
    use std::os::unix::process::CommandExt;
    Command::new(browser)
        .process_group(0)
        .args([
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--mute-audio",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(url)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
}

/// Runs `virtsoc watch`.
pub fn run(args: &WatchArgs) -> Result<(), CliError> {
    let (default_res, default_fps) = scenario::defaults(&args.scenario);
    let (width, height) = scenario::resolution(args.resolution.as_deref().unwrap_or(default_res))?;
    let fps = args.fps.unwrap_or(default_fps);
    let size = format!("{width}x{height}");
    let daemon = DaemonProcess::spawn(
        &["--display-size", &size, "--control-listen", &args.listen],
        true,
    )?;
    let e = daemon.endpoint();
    let token = e.remote.as_ref().map(|r| r.1.clone()).unwrap_or_default();
    let url = format!(
        "http://{}/view?token={token}&fps={}&max={}",
        args.listen, args.view_fps, args.view_max
    );
    let opts = |seconds: f64| RunOpts {
        scenario: args.scenario.clone(),
        protocol: "prefetch".into(),
        ordering: OrderingMode::Fence,
        seconds,
        width,
        height,
        fps,
        composition: Composition::Planes,
        pacing: crate::scenario::Pacing::default(),
    };
    let Some(seconds) = args.measure else {
        println!(
            "live view of the {} scenario ({size} at {fps} fps): {url}",
            args.scenario
        );
        println!("(Ctrl-C to stop)");
        let stop = Arc::new(AtomicBool::new(false));
        for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
            signal_hook::flag::register(sig, stop.clone())?;
        }
        while !stop.load(Ordering::Relaxed) {
            match scenario::run(&e.target, e.pid, &opts(5.0)) {
                Ok(r) => println!(
                    "{}: {:.1} fps presented, motion-to-photon p50 {:.1} ms, daemon CPU {:.0}%",
                    r.scenario,
                    r.presented_fps,
                    r.latency_ms.p50,
                    r.cpu_daemon_pct.unwrap_or(0.0)
                ),
                // Ctrl-C reaches the daemon too: the run in progress ends with an error.
                Err(_) if stop.load(Ordering::Relaxed) => break,
                Err(err) => return Err(err),
            }
        }
        let _ = daemon.stop();
        return Ok(());
    };
    if !(1.0..=600.0).contains(&seconds) {
        return Err(CliError::Usage("--measure must be 1..600 seconds".into()));
    }
    if !(1..=50).contains(&args.rounds) {
        return Err(CliError::Usage("--rounds must be 1..50".into()));
    }
    let browser = chromium().ok_or_else(|| {
        CliError::Usage("--measure needs chromium (scripts/install-deps.sh installs it)".into())
    })?;
    let pid = e
        .pid
        .ok_or_else(|| CliError::Usage("the daemon's pid is unknown".into()))?;
    let profile = tempfile::tempdir()?;
    let mut viewer = open_viewer(&browser, &url, profile.path())?;
    // The page loads and starts pulling frames while the scenario starts.
    const SETTLE: Duration = Duration::from_secs(1);
    let total = 4.0 + (seconds + SETTLE.as_secs_f64()) * 2.0 * f64::from(args.rounds);
    let (run, windows) = std::thread::scope(|scope| {
        let run = scope.spawn(|| scenario::run(&e.target, e.pid, &opts(total)));
        std::thread::sleep(Duration::from_secs(3));
        let windows = measure_windows(&viewer, pid, seconds, args.rounds);
        (run.join(), windows)
    });
    let reports = request(
        &Target::Unix(control_path(std::path::Path::new(&e.target))),
        "GET",
        "/view/report",
        b"",
    )
    .map(|r| r.json());
    let _ = viewer.kill();
    let _ = viewer.wait();
    let _ = daemon.stop();
    let run = run.map_err(|_| CliError::Usage("the scenario thread panicked".into()))??;
    let (without, with) = windows?;
    let report = reports
        .ok()
        .and_then(|v| v.as_array().and_then(|a| a.last().cloned()))
        .unwrap_or_default();
    let cost = view_cost(args, seconds, &run, (without, with), &report);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&cost)?);
    } else {
        print_cost(&cost);
    }
    Ok(())
}

/// Sends `sig` to the viewer's process group.
fn signal_viewer(viewer: &Child, sig: rustix::process::Signal) -> Result<(), CliError> {
    let pid = rustix::process::Pid::from_raw(viewer.id() as i32)
        .ok_or_else(|| CliError::Usage("the viewer has no pid".into()))?;
    rustix::process::kill_process_group(pid, sig)
        .map_err(|e| CliError::Usage(format!("signalling the viewer: {e}")))
}

/// The daemon's CPU (percent of a core) over `rounds` pairs of `seconds` windows, the viewer
/// paused in the first of each pair and running in the second.
fn measure_windows(
    viewer: &Child,
    pid: u32,
    seconds: f64,
    rounds: u32,
) -> Result<(Vec<f64>, Vec<f64>), CliError> {
    let window = |pid: u32| -> Result<f64, CliError> {
        let cpu = || {
            scenario::cpu_seconds(pid)
                .ok_or_else(|| CliError::Usage("the daemon's CPU time is unreadable".into()))
        };
        let (c0, t0) = (cpu()?, std::time::Instant::now());
        std::thread::sleep(Duration::from_secs_f64(seconds));
        Ok((cpu()? - c0) / t0.elapsed().as_secs_f64() * 100.0)
    };
    let (mut without, mut with) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        signal_viewer(viewer, rustix::process::Signal::STOP)?;
        // Requests under way finish first.
        std::thread::sleep(Duration::from_secs(1));
        without.push(window(pid)?);
        signal_viewer(viewer, rustix::process::Signal::CONT)?;
        std::thread::sleep(Duration::from_secs(1));
        with.push(window(pid)?);
    }
    Ok((without, with))
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    match s.len() {
        0 => 0.0,
        n if n % 2 == 1 => s[n / 2],
        n => (s[n / 2 - 1] + s[n / 2]) / 2.0,
    }
}

fn view_cost(
    args: &WatchArgs,
    seconds: f64,
    run: &ScenarioResult,
    (without, with): (Vec<f64>, Vec<f64>),
    report: &serde_json::Value,
) -> ViewCost {
    let cpu0 = median(&without);
    let cpu1 = median(&with);
    let num = |k: &str| report[k].as_f64().unwrap_or(0.0);
    ViewCost {
        scenario: args.scenario.clone(),
        resolution: run.resolution.clone(),
        fps: run.target_fps,
        seconds,
        rounds: args.rounds,
        cpu_daemon_pct_without: cpu0,
        cpu_daemon_pct_with: cpu1,
        cpu_windows_without: without,
        cpu_windows_with: with,
        extra_cpu_pct: if cpu0 > 0.0 {
            (cpu1 - cpu0) / cpu0 * 100.0
        } else {
            0.0
        },
        presented_fps: run.presented_fps,
        view_fps: num("fps"),
        view_fps_cap: args.view_fps,
        view_max: args.view_max.clone(),
        view_latency_ms_p50: num("latency_ms_p50"),
        view_latency_ms_p95: num("latency_ms_p95"),
    }
}

fn print_cost(c: &ViewCost) {
    println!(
        "{} {} at {} fps: {} windows of {} s without and with a viewer, alternating",
        c.scenario, c.resolution, c.fps, c.rounds, c.seconds
    );
    let list = |v: &[f64]| {
        v.iter()
            .map(|x| format!("{x:.1}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    println!(
        "daemon CPU (% of a core), median: {:.1} without, {:.1} with",
        c.cpu_daemon_pct_without, c.cpu_daemon_pct_with
    );
    println!("  windows without: {}", list(&c.cpu_windows_without));
    println!("  windows with:    {}", list(&c.cpu_windows_with));
    println!("view's extra daemon CPU: {:+.1}%", c.extra_cpu_pct);
    println!("presented fps over the run: {:.1}", c.presented_fps);
    println!(
        "view (at most {} fps, within {}): {:.1} fps drawn, capture -> drawn p50 {:.1} ms, \
         p95 {:.1} ms",
        c.view_fps_cap, c.view_max, c.view_fps, c.view_latency_ms_p50, c.view_latency_ms_p95
    );
}
