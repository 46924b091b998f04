//! `virtsoc soak`: a daemon of its own under mixed guests for a while, then checks that it
//! gave back what they took (issue 10).
//!
//! Guests run in threads of this process (the crashing ones as `virtsoc debug hold` child
//! processes killed with SIGKILL), in four roles:
//! - good: short pipelines with verifiable data: producer -> consumer checksums, CPU write ->
//!   device read -> CPU read, display presents checked against the display's own checksum;
//! - hostile: malformed ring entries (`submit_raw`), out-of-range accesses, other guests'
//!   region ids, posted writes where none may go (a device's queue, a read, after a device
//!   wrote the region), fence misuse; every misuse must be refused with an error status;
//! - crashing: child processes holding regions mid-access, killed with SIGKILL;
//! - reconnecting: connect, use a region, leave (with or without freeing it), again.
//!
//! A warm-up round runs every role at once first; then the daemon's RSS, open descriptors and
//! threads are measured, the guests run for the given time, and once every guest has left the
//! same numbers are measured again. The checks: RSS within 10% of the start, descriptors and
//! threads back to their start values, every good guest's data correct, the daemon alive.
//! Waits are bounded; nothing is checked against a clock.

mod checks;
mod roles;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use virtsoc_guest::devices::display;
use virtsoc_guest::RegionId;
use virtsoc_guest::{
    testdev, AccessMode, ConnectOptions, Connection, DeviceId, Fence, Format, GuestError, Opcode,
};
use virtsoc_proto::Request;

use crate::daemon_proc::DaemonProcess;
use crate::CliError;
use roles::{good_round, guest, open};
use virtsoc_sync::LockExt;

/// Options of `virtsoc soak`.
#[derive(Debug, clap::Args)]
pub struct SoakArgs {
    /// Guests running at once (a quarter of each role, at least one of each).
    #[arg(long, default_value_t = 8)]
    pub guests: usize,
    /// How long the guests run after the warm-up.
    #[arg(long, default_value_t = 60.0)]
    pub seconds: f64,
    /// The same in minutes (instead of `--seconds`).
    #[arg(long, conflicts_with = "seconds")]
    pub minutes: Option<f64>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Hostile guests send no bursts of malformed ring entries (`submit_raw`).
    #[arg(long)]
    pub no_raw_bursts: bool,
    /// Roles to run (default all): good, hostile, crashing, reconnecting.
    #[arg(long, value_delimiter = ',')]
    pub roles: Vec<String>,
}

impl SoakArgs {
    /// How long the guests run after the warm-up, in seconds.
    pub fn run_seconds(&self) -> f64 {
        self.minutes.map_or(self.seconds, |m| m * 60.0)
    }
}

/// The screen size of the soak's daemon (small: every present is composed and checksummed).
const SCREEN: (u32, u32) = (64, 48);
/// Bytes of a good guest's test region.
const REGION: u64 = 64 << 10;
/// Allowed growth of the daemon's RSS between start and end.
const RSS_SLACK: f64 = 0.10;

/// One measurement of the daemon process.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct ProcStats {
    pub rss_kib: u64,
    pub fds: u64,
    pub threads: u64,
}

impl ProcStats {
    fn of(pid: u32) -> Option<ProcStats> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse::<u64>().ok())
        };
        let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64;
        Some(ProcStats {
            rss_kib: field("VmRSS:")?,
            fds,
            threads: field("Threads:")?,
        })
    }
}

/// What the daemon's descriptors point at (`/proc/PID/fd` links), sorted.
fn fd_targets(pid: u32) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.flatten()
                .filter_map(|e| std::fs::read_link(e.path()).ok())
                .map(|p| {
                    // Socket and pipe inodes differ per connection: keep the kind only.
                    // Inode numbers and guest ids (in window names) differ: drop digits.
                    let s = p.display().to_string();
                    s.chars()
                        .filter(|c| !c.is_ascii_digit())
                        .collect::<String>()
                })
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// Counters shared by the guest threads.
#[derive(Debug, Default)]
struct Tally {
    good_rounds: AtomicU64,
    good_bad_data: AtomicU64,
    good_errors: AtomicU64,
    presents: AtomicU64,
    presents_verified: AtomicU64,
    hostile_rounds: AtomicU64,
    hostile_requests: AtomicU64,
    hostile_accepted: AtomicU64,
    crashes: AtomicU64,
    crash_failures: AtomicU64,
    reconnects: AtomicU64,
    reconnect_errors: AtomicU64,
    /// The first few failures, for the report.
    notes: Mutex<Vec<String>>,
}

impl Tally {
    fn note(&self, what: String) {
        let mut n = self.notes.lock_or_recover();
        if n.len() < 20 {
            n.push(what);
        }
    }
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

fn get(c: &AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}

/// The soak's result.
#[derive(Debug, Serialize)]
pub struct SoakReport {
    pub guests: usize,
    pub seconds: f64,
    pub daemon_pid: u32,
    pub start: ProcStats,
    pub end: ProcStats,
    pub peak_rss_kib: u64,
    pub good_rounds: u64,
    pub good_bad_data: u64,
    pub good_errors: u64,
    pub presents: u64,
    pub presents_verified: u64,
    pub hostile_rounds: u64,
    pub hostile_requests: u64,
    pub hostile_accepted: u64,
    pub crashes: u64,
    pub crash_failures: u64,
    pub reconnects: u64,
    pub reconnect_errors: u64,
    pub daemon_alive: bool,
    pub checks: Vec<Check>,
    pub notes: Vec<String>,
}

/// One pass/fail line.
#[derive(Debug, Serialize)]
pub struct Check {
    pub name: String,
    pub ok: bool,
    pub detail: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Good,
    Hostile,
    Crashing,
    Reconnecting,
}

const ROLES: [Role; 4] = [
    Role::Good,
    Role::Hostile,
    Role::Crashing,
    Role::Reconnecting,
];

struct Ctx {
    socket: String,
    tally: Tally,
    stop: AtomicBool,
    /// Region ids the good guests hold (probed by the hostile ones).
    others: Mutex<Vec<RegionId>>,
    raw_bursts: bool,
}

/// Soak guests of one role running in the background until stopped, for other benchmarks
/// (`virtsoc bench isolation` runs the hostile and crashing roles next to its victim).
pub(crate) struct Background {
    ctx: Arc<Ctx>,
    handles: Vec<std::thread::JoinHandle<()>>,
}

/// What a [`Background`] role did.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct BackgroundTally {
    /// Sessions (hostile), children killed (crashing), rounds (good), sessions (reconnecting).
    pub rounds: u64,
    /// Misuses sent (hostile).
    pub requests: u64,
    /// Misuses accepted (hostile; must stay 0).
    pub accepted: u64,
    /// Failures of the role's guests (errors, wrong data, children that did not start).
    pub failures: u64,
}

impl Background {
    /// Starts `guests` guests of `role` (`good`, `hostile`, `crashing`, `reconnecting`)
    /// against the daemon at `socket`.
    pub(crate) fn start(socket: &str, role: &str, guests: usize) -> Result<Self, CliError> {
        let role = match role {
            "good" => Role::Good,
            "hostile" => Role::Hostile,
            "crashing" => Role::Crashing,
            "reconnecting" => Role::Reconnecting,
            _ => return Err(CliError::Usage(format!("unknown role {role}"))),
        };
        let ctx = Arc::new(Ctx {
            socket: socket.into(),
            tally: Tally::default(),
            stop: AtomicBool::new(false),
            others: Mutex::new(Vec::new()),
            raw_bursts: true,
        });
        // Until stopped (a day is longer than any benchmark).
        let deadline = Instant::now() + Duration::from_secs(86_400);
        let handles = (0..guests)
            .map(|i| {
                let ctx = ctx.clone();
                std::thread::spawn(move || guest(&ctx, role, i, deadline))
            })
            .collect();
        Ok(Background { ctx, handles })
    }

    /// Stops the guests (each finishes its current round) and tells what they did.
    pub(crate) fn stop(self) -> BackgroundTally {
        self.ctx.stop.store(true, Ordering::Relaxed);
        let mut failures = 0;
        for h in self.handles {
            failures += u64::from(h.join().is_err());
        }
        let t = &self.ctx.tally;
        BackgroundTally {
            rounds: get(&t.hostile_rounds)
                + get(&t.crashes)
                + get(&t.good_rounds)
                + get(&t.reconnects),
            requests: get(&t.hostile_requests),
            accepted: get(&t.hostile_accepted),
            failures: failures
                + get(&t.crash_failures)
                + get(&t.good_errors)
                + get(&t.good_bad_data)
                + get(&t.reconnect_errors),
        }
    }
}

/// Runs the soak and prints its report; fails when a check fails.
pub fn run(args: &SoakArgs) -> Result<(), CliError> {
    let report = soak(args)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_table(&report);
    }
    let failed: Vec<&str> = report
        .checks
        .iter()
        .filter(|c| !c.ok)
        .map(|c| c.name.as_str())
        .collect();
    if failed.is_empty() {
        Ok(())
    } else {
        Err(CliError::Usage(format!(
            "soak checks failed: {}",
            failed.join(", ")
        )))
    }
}

fn soak(args: &SoakArgs) -> Result<SoakReport, CliError> {
    let roles = parse_roles(&args.roles)?;
    let guests = args.guests.max(roles.len());
    let mut daemon = spawn_daemon(guests)?;
    let ep = daemon.endpoint();
    let pid = ep.pid.unwrap_or(0);
    let ctx = Ctx::new(ep.target.clone(), !args.no_raw_bursts);
    // Warm-up: every role at once for a short while, so the daemon's lazily grown state
    // (allocator arenas, device state, thread stacks) is there before the start measurement.
    let warm = Duration::from_secs_f64((args.run_seconds() / 10.0).clamp(1.0, 5.0));
    round(&ctx, &roles, guests, warm);
    let start = settle(pid, None);
    let start_fds = fd_targets(pid);
    // The tally counts the measured run only.
    let ctx = Ctx::new(ctx.socket.clone(), !args.no_raw_bursts);
    let peak = Arc::new(AtomicU64::new(start.rss_kib));
    let watcher = {
        let (peak, ctx) = (peak.clone(), ctx.clone());
        std::thread::spawn(move || {
            while !ctx.stop.load(Ordering::Relaxed) {
                if let Some(s) = ProcStats::of(pid) {
                    peak.fetch_max(s.rss_kib, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(250));
            }
        })
    };
    round(
        &ctx,
        &roles,
        guests,
        Duration::from_secs_f64(args.run_seconds().max(0.0)),
    );
    ctx.stop.store(true, Ordering::Relaxed);
    let _ = watcher.join();
    let end = settle(pid, Some(start));
    let lingering = lingering_sessions(&ctx.socket);
    if end.fds > start.fds {
        let mut extra = fd_targets(pid);
        for f in &start_fds {
            if let Some(i) = extra.iter().position(|e| e == f) {
                extra.remove(i);
            }
        }
        ctx.tally
            .note(format!("descriptors open beyond the start: {extra:?}"));
    }
    // The daemon still serves a guest after all that.
    let serves = good_round(&ctx, &open(&ctx.socket, "after", "prefetch")?, 0).is_ok();
    let daemon_alive = daemon.is_running() && serves;
    let t = &ctx.tally;
    let outcome = checks::Outcome {
        start,
        end,
        lingering,
        daemon_alive,
        pid,
    };
    let checks = checks::checks(&outcome, t, &roles);
    let report = SoakReport {
        guests,
        seconds: args.run_seconds(),
        daemon_pid: pid,
        start,
        end,
        peak_rss_kib: peak.load(Ordering::Relaxed),
        good_rounds: get(&t.good_rounds),
        good_bad_data: get(&t.good_bad_data),
        good_errors: get(&t.good_errors),
        presents: get(&t.presents),
        presents_verified: get(&t.presents_verified),
        hostile_rounds: get(&t.hostile_rounds),
        hostile_requests: get(&t.hostile_requests),
        hostile_accepted: get(&t.hostile_accepted),
        crashes: get(&t.crashes),
        crash_failures: get(&t.crash_failures),
        reconnects: get(&t.reconnects),
        reconnect_errors: get(&t.reconnect_errors),
        daemon_alive,
        checks,
        notes: t.notes.lock_or_recover().clone(),
    };
    if daemon_alive {
        daemon.stop()?;
    }
    Ok(report)
}

/// The roles named on the command line (all of them when none is).
fn parse_roles(names: &[String]) -> Result<Vec<Role>, CliError> {
    if names.is_empty() {
        return Ok(ROLES.to_vec());
    }
    names
        .iter()
        .map(|r| match r.as_str() {
            "good" => Ok(Role::Good),
            "hostile" => Ok(Role::Hostile),
            "crashing" => Ok(Role::Crashing),
            "reconnecting" => Ok(Role::Reconnecting),
            _ => Err(CliError::Usage(format!("unknown role {r}"))),
        })
        .collect()
}

/// The soak's own daemon: light devices (null GPU, CPU ISP), the soak's screen, room for
/// `guests` and their reconnections.
fn spawn_daemon(guests: usize) -> Result<DaemonProcess, CliError> {
    let size = format!("{}x{}", SCREEN.0, SCREEN.1);
    let max_guests = (guests * 2 + 16).to_string();
    DaemonProcess::spawn(
        &[
            "--gpu-backend",
            "null",
            "--isp-backend",
            "cpu",
            "--display-size",
            &size,
            "--display-verify",
            "--max-guests",
            &max_guests,
        ],
        false,
    )
}

impl Ctx {
    /// A fresh context (an empty tally) for guests of the daemon on `socket`.
    fn new(socket: String, raw_bursts: bool) -> Arc<Ctx> {
        Arc::new(Ctx {
            socket,
            tally: Tally::default(),
            stop: AtomicBool::new(false),
            others: Mutex::new(Vec::new()),
            raw_bursts,
        })
    }
}

/// The daemon's count of sessions that ended over a second ago and are still referenced
/// (the `virtsoc_sessions_lingering` metric of its control API).
fn lingering_sessions(socket: &str) -> Option<u64> {
    let target = virtsoc_control::client::Target::Unix(virtsoc_control::client::control_path(
        std::path::Path::new(socket),
    ));
    let page = virtsoc_control::client::request(&target, "GET", "/metrics", b"").ok()?;
    page.body.lines().find_map(|l| {
        l.strip_prefix("virtsoc_sessions_lingering ")
            .and_then(|v| v.trim().parse::<f64>().ok())
            .map(|v| v as u64)
    })
}

/// Measures the daemon once every guest has left: descriptors and threads of departed
/// guests are released asynchronously, so this waits (bounded) until they are back to
/// `target`'s values, or stop changing.
fn settle(pid: u32, target: Option<ProcStats>) -> ProcStats {
    let until = Instant::now() + Duration::from_secs(30);
    let mut last = ProcStats::of(pid).unwrap_or_default();
    let mut stable = 0;
    while Instant::now() < until {
        std::thread::sleep(Duration::from_millis(200));
        let now = ProcStats::of(pid).unwrap_or_default();
        let back = target.is_some_and(|t| now.fds <= t.fds && now.threads <= t.threads);
        stable = if (now.fds, now.threads) == (last.fds, last.threads) {
            stable + 1
        } else {
            0
        };
        last = now;
        if back || (target.is_none() && stable >= 5) {
            break;
        }
    }
    last
}

/// Runs `guests` guests (roles in turn) until `length` has passed, then joins them.
fn round(ctx: &Arc<Ctx>, roles: &[Role], guests: usize, length: Duration) {
    let deadline = Instant::now() + length;
    let handles: Vec<_> = (0..guests)
        .map(|i| {
            let ctx = ctx.clone();
            let role = roles[i % roles.len()];
            std::thread::spawn(move || guest(&ctx, role, i, deadline))
        })
        .collect();
    for h in handles {
        if h.join().is_err() {
            ctx.tally.note("a guest thread panicked".into());
            bump(&ctx.tally.good_errors);
        }
    }
}

fn print_table(r: &SoakReport) {
    println!(
        "virtsoc soak: {} guests, {:.0} s, daemon pid {}",
        r.guests, r.seconds, r.daemon_pid
    );
    println!("{:<16} {:>12} {:>12}", "daemon", "start", "end");
    println!(
        "{:<16} {:>12} {:>12}",
        "rss KiB", r.start.rss_kib, r.end.rss_kib
    );
    println!("{:<16} {:>12} {:>12}", "fds", r.start.fds, r.end.fds);
    println!(
        "{:<16} {:>12} {:>12}",
        "threads", r.start.threads, r.end.threads
    );
    println!("{:<16} {:>12}", "peak rss KiB", r.peak_rss_kib);
    println!();
    println!("{:<26} {:>10}", "guests", "count");
    for (k, v) in [
        ("good rounds", r.good_rounds),
        ("  wrong data", r.good_bad_data),
        ("  errors", r.good_errors),
        ("  presents", r.presents),
        ("  presents verified", r.presents_verified),
        ("hostile sessions", r.hostile_rounds),
        ("  misuses sent", r.hostile_requests),
        ("  misuses accepted", r.hostile_accepted),
        ("crashed (SIGKILL)", r.crashes),
        ("  failed to start", r.crash_failures),
        ("reconnects", r.reconnects),
        ("  errors", r.reconnect_errors),
    ] {
        println!("{k:<26} {v:>10}");
    }
    println!();
    for c in &r.checks {
        println!(
            "{:<4} {:<18} {}",
            if c.ok { "ok" } else { "FAIL" },
            c.name,
            c.detail
        );
    }
    for n in &r.notes {
        println!("note: {n}");
    }
}
