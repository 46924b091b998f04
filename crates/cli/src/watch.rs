//! `virtsoc watch`: a scenario running against a daemon of its own with the live view on,
//! until Ctrl-C (how `make demo` ends: something a person can watch in a browser). With
//! `--measure SECONDS` it measures the view instead: one scenario run during which a viewer
//! (Debian's chromium, headless, on the live view page) is paused and resumed in turn
//! (SIGSTOP/SIGCONT), `--rounds` times, the daemon's CPU taken over each `SECONDS` window; it
//! prints what the view costs the daemon (median of the windows with the viewer against the
//! median without), the same per thread name (each thread's run time from
//! `/proc/PID/task/*/schedstat`, nanoseconds: the view's own request threads stand out of the
//! noise of the others), and the latency the page measured (capture stamp -> frame drawn).

use std::collections::BTreeMap;
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
use crate::stats::median_or_zero;
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
    /// The daemon's view CPU budget (`virtsocd --view-budget`: percent of its other CPU; 0
    /// unpaced). Default: the daemon's.
    #[arg(long)]
    pub view_budget: Option<f64>,
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
    /// The daemon's CPU per thread name (percent of one core): medians of the windows
    /// without and with the viewer.
    pub threads: Vec<ThreadCost>,
    /// Frames the display presented per second over the whole run.
    pub presented_fps: f64,
    /// What the page reported: frames drawn per second, capture -> drawn latency.
    pub view_fps: f64,
    /// The page's limits: frames per second and the box frames fit.
    pub view_fps_cap: u32,
    pub view_max: String,
    pub view_latency_ms_p50: f64,
    pub view_latency_ms_p95: f64,
    /// Frames the page drew over the time it ran (the first seconds and the windows with
    /// it, each with the second before it): about its mean rate.
    pub view_fps_mean: f64,
    /// The daemon's view budget at the end (`GET /view/budget`; null when unpaced).
    pub view_budget: serde_json::Value,
}

/// One thread name's CPU (percent of one core), medians of the windows.
#[derive(Debug, Serialize)]
pub struct ThreadCost {
    pub name: String,
    pub without_pct: f64,
    pub with_pct: f64,
}

/// Each thread of `pid`: its name and the CPU time it has run, in seconds (its schedstat).
fn thread_times(pid: u32) -> BTreeMap<u32, (String, f64)> {
    let mut out = BTreeMap::new();
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for e in dir.flatten() {
        let Some(tid) = e.file_name().to_str().and_then(|t| t.parse().ok()) else {
            continue;
        };
        let read = |f: &str| std::fs::read_to_string(e.path().join(f)).ok();
        let (Some(comm), Some(sched)) = (read("comm"), read("schedstat")) else {
            continue;
        };
        let ns = sched
            .split_whitespace()
            .next()
            .and_then(|n| n.parse::<f64>().ok());
        if let Some(ns) = ns {
            out.insert(tid, (comm.trim().to_string(), ns / 1e9));
        }
    }
    out
}

/// CPU per thread name (percent of one core) from `before` to `after` over `seconds`:
/// threads that started in between count from zero, threads that ended are missing.
fn thread_cpu_pct(
    before: &BTreeMap<u32, (String, f64)>,
    after: &BTreeMap<u32, (String, f64)>,
    seconds: f64,
) -> BTreeMap<String, f64> {
    let mut by_name = BTreeMap::new();
    for (tid, (name, t)) in after {
        let t0 = before
            .get(tid)
            .filter(|(n, _)| n == name)
            .map_or(0.0, |b| b.1);
        *by_name.entry(name.clone()).or_insert(0.0) += (t - t0).max(0.0) / seconds * 100.0;
    }
    by_name
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
    let budget = args.view_budget.map(|b| b.to_string());
    let mut daemon_args = vec!["--display-size", &size, "--control-listen", &args.listen];
    if let Some(b) = &budget {
        daemon_args.extend(["--view-budget", b]);
    }
    let daemon = DaemonProcess::spawn(&daemon_args, true)?;
    let e = daemon.endpoint();
    let token = e.remote.as_ref().map(|r| r.1.clone()).unwrap_or_default();
    let url = format!(
        "http://{}/view?fps={}&max={}#token={token}",
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
    let control = Target::Unix(control_path(std::path::Path::new(&e.target)));
    let reports = request(&control, "GET", "/view/report", b"").map(|r| r.json());
    let budget = request(&control, "GET", "/view/budget", b"")
        .ok()
        .filter(|r| r.status == 200)
        .map(|r| r.json())
        .unwrap_or_default();
    let _ = viewer.kill();
    let _ = viewer.wait();
    let _ = daemon.stop();
    let run = run.map_err(|_| CliError::Usage("the scenario thread panicked".into()))??;
    let (without, with) = windows?;
    let report = reports
        .ok()
        .and_then(|v| v.as_array().and_then(|a| a.last().cloned()))
        .unwrap_or_default();
    // The page ran the first seconds and each window with it, with the second before it.
    let ran = 3.0 + f64::from(args.rounds) * (seconds + SETTLE.as_secs_f64());
    let cost = view_cost(
        args,
        (seconds, ran),
        &run,
        (without, with),
        (&report, budget),
    );
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

/// The daemon's CPU (percent of a core) in one window.
#[derive(Debug, Default)]
struct Window {
    total: f64,
    threads: BTreeMap<String, f64>,
}

/// The daemon's CPU over `rounds` pairs of `seconds` windows, the viewer paused in the first
/// of each pair and running in the second.
fn measure_windows(
    viewer: &Child,
    pid: u32,
    seconds: f64,
    rounds: u32,
) -> Result<(Vec<Window>, Vec<Window>), CliError> {
    let window = |pid: u32| -> Result<Window, CliError> {
        let cpu = || {
            scenario::daemon_cpu_seconds(pid)
                .ok_or_else(|| CliError::Usage("the daemon's CPU time is unreadable".into()))
        };
        let (c0, threads0, t0) = (cpu()?, thread_times(pid), std::time::Instant::now());
        std::thread::sleep(Duration::from_secs_f64(seconds));
        let (c1, threads1, dt) = (cpu()?, thread_times(pid), t0.elapsed().as_secs_f64());
        Ok(Window {
            total: (c1 - c0) / dt * 100.0,
            threads: thread_cpu_pct(&threads0, &threads1, dt),
        })
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

/// Medians per thread name of the windows without and with the viewer (a name missing from
/// a window counts 0 there), largest difference first.
fn thread_costs(without: &[Window], with: &[Window]) -> Vec<ThreadCost> {
    let names: std::collections::BTreeSet<&String> = without
        .iter()
        .chain(with)
        .flat_map(|w| w.threads.keys())
        .collect();
    let med = |ws: &[Window], name: &str| {
        let v: Vec<f64> = ws
            .iter()
            .map(|w| w.threads.get(name).copied().unwrap_or(0.0))
            .collect();
        median_or_zero(&v)
    };
    let mut out: Vec<ThreadCost> = names
        .into_iter()
        .map(|n| ThreadCost {
            name: n.clone(),
            without_pct: med(without, n),
            with_pct: med(with, n),
        })
        .collect();
    out.sort_by(|a, b| {
        (b.with_pct - b.without_pct)
            .abs()
            .total_cmp(&(a.with_pct - a.without_pct).abs())
    });
    out
}

fn view_cost(
    args: &WatchArgs,
    (seconds, ran): (f64, f64),
    run: &ScenarioResult,
    (without, with): (Vec<Window>, Vec<Window>),
    (report, budget): (&serde_json::Value, serde_json::Value),
) -> ViewCost {
    let threads = thread_costs(&without, &with);
    let without: Vec<f64> = without.iter().map(|w| w.total).collect();
    let with: Vec<f64> = with.iter().map(|w| w.total).collect();
    let cpu0 = median_or_zero(&without);
    let cpu1 = median_or_zero(&with);
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
        threads,
        presented_fps: run.presented_fps,
        view_fps: num("fps"),
        view_fps_cap: args.view_fps,
        view_max: args.view_max.clone(),
        view_latency_ms_p50: num("latency_ms_p50"),
        view_latency_ms_p95: num("latency_ms_p95"),
        view_fps_mean: num("frames") / ran,
        view_budget: budget,
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
    println!(
        "view's extra daemon CPU: {:+.1}% ({:+.2} points of a core)",
        c.extra_cpu_pct,
        c.cpu_daemon_pct_with - c.cpu_daemon_pct_without
    );
    println!("per thread (% of a core, median without -> with), largest change first:");
    for t in c
        .threads
        .iter()
        .filter(|t| t.with_pct.max(t.without_pct) >= 0.05)
    {
        println!(
            "  {:<18} {:6.2} -> {:6.2}  ({:+.2})",
            t.name,
            t.without_pct,
            t.with_pct,
            t.with_pct - t.without_pct
        );
    }
    println!("presented fps over the run: {:.1}", c.presented_fps);
    println!(
        "view (at most {} fps, within {}): {:.1} fps drawn in the last second ({:.1} on \
         average), capture -> drawn p50 {:.1} ms, p95 {:.1} ms",
        c.view_fps_cap,
        c.view_max,
        c.view_fps,
        c.view_fps_mean,
        c.view_latency_ms_p50,
        c.view_latency_ms_p95
    );
    match c.view_budget.get("pct").and_then(|p| p.as_f64()) {
        Some(pct) => println!(
            "view budget: {pct}% of the daemon's other CPU; {} frame requests waited for it \
             ({} requests of the view charged)",
            c.view_budget["delayed"], c.view_budget["requests"]
        ),
        None => println!("view budget: off (viewers unpaced)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn times(v: &[(u32, &str, f64)]) -> BTreeMap<u32, (String, f64)> {
        v.iter().map(|&(t, n, s)| (t, (n.to_string(), s))).collect()
    }

    /// Threads of one name add up; a thread that started (or took a new name) in the window
    /// counts from zero; one that ended is missing.
    #[test]
    fn thread_cpu_is_summed_by_name() {
        let before = times(&[
            (1, "dev-isp", 1.0),
            (2, "control-req", 0.5),
            (3, "gone", 9.0),
        ]);
        let after = times(&[
            (1, "dev-isp", 1.5),
            (2, "control-req", 0.6),
            (4, "control-req", 0.2),
            (5, "new", 0.1),
        ]);
        let pct = thread_cpu_pct(&before, &after, 10.0);
        assert!((pct["dev-isp"] - 5.0).abs() < 1e-9);
        assert!((pct["control-req"] - 3.0).abs() < 1e-9);
        assert!((pct["new"] - 1.0).abs() < 1e-9);
        assert!(!pct.contains_key("gone"));
    }

    /// Per-name medians over the windows, a name missing from a window counting 0 there,
    /// the largest change first.
    #[test]
    fn thread_costs_are_medians_largest_change_first() {
        let w = |v: &[(&str, f64)]| Window {
            total: 0.0,
            threads: v.iter().map(|&(n, p)| (n.to_string(), p)).collect(),
        };
        let without = [w(&[("isp", 2.0)]), w(&[("isp", 3.0)]), w(&[("isp", 9.0)])];
        let with = [
            w(&[("isp", 2.5), ("control-req", 1.0)]),
            w(&[("isp", 3.0), ("control-req", 0.8)]),
            w(&[("isp", 2.0)]),
        ];
        let costs = thread_costs(&without, &with);
        assert_eq!(costs[0].name, "control-req");
        assert_eq!((costs[0].without_pct, costs[0].with_pct), (0.0, 0.8));
        assert_eq!(costs[1].name, "isp");
        assert_eq!((costs[1].without_pct, costs[1].with_pct), (3.0, 2.5));
    }

    /// This process's threads are listed with their names.
    #[test]
    fn thread_times_lists_this_thread() {
        let me = rustix::thread::gettid().as_raw_nonzero().get() as u32;
        let threads = thread_times(std::process::id());
        let (name, secs) = threads.get(&me).expect("this thread is listed");
        assert!(!name.is_empty());
        assert!(*secs >= 0.0);
    }
}
