//! `virtsoc soak`: a daemon of its own under mixed guests for a while, then checks that it
//! gave back what they took (issue 10).
//!
//! Guests run in threads of this process (the crashing ones as `virtsoc debug hold` child
//! processes killed with SIGKILL), in four roles:
//! - good: short pipelines with verifiable data: producer -> consumer checksums, CPU write ->
//!   device read -> CPU read, display presents checked against the display's own checksum;
//! - hostile: malformed ring entries (`submit_raw`), out-of-range accesses, other guests'
//!   region ids, fence misuse; every misuse must be refused with an error status;
//! - crashing: child processes holding regions mid-access, killed with SIGKILL;
//! - reconnecting: connect, use a region, leave (with or without freeing it), again.
//!
//! A warm-up round runs every role at once first; then the daemon's RSS, open descriptors and
//! threads are measured, the guests run for the given time, and once every guest has left the
//! same numbers are measured again. The checks: RSS within 10% of the start, descriptors and
//! threads back to their start values, every good guest's data correct, the daemon alive.
//! Waits are bounded; nothing is checked against a clock.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use virtsoc_guest::devices::display;
use virtsoc_guest::{
    testdev, AccessMode, ConnectOptions, Connection, DeviceId, Fence, Format, GuestError, Opcode,
};
use virtsoc_proto::Request;

use crate::daemon_proc::DaemonProcess;
use crate::CliError;

/// Options of `virtsoc soak`.
#[derive(Debug, clap::Args)]
pub struct SoakArgs {
    /// Guests running at once (a quarter of each role, at least one of each).
    #[arg(long, default_value_t = 8)]
    pub guests: usize,
    /// How long the guests run after the warm-up.
    #[arg(long, default_value_t = 60.0)]
    pub seconds: f64,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Hostile guests send no bursts of malformed ring entries (`submit_raw`); see
    /// `tests/soak.rs` for what those bursts currently leave behind in the daemon.
    #[arg(long)]
    pub no_raw_bursts: bool,
    /// Roles to run (default all): good, hostile, crashing, reconnecting.
    #[arg(long, value_delimiter = ',')]
    pub roles: Vec<String>,
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
        let mut n = self.notes.lock().unwrap_or_else(|p| p.into_inner());
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
    others: Mutex<Vec<u64>>,
    raw_bursts: bool,
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
    let roles: Vec<Role> = if args.roles.is_empty() {
        ROLES.to_vec()
    } else {
        args.roles
            .iter()
            .map(|r| match r.as_str() {
                "good" => Ok(Role::Good),
                "hostile" => Ok(Role::Hostile),
                "crashing" => Ok(Role::Crashing),
                "reconnecting" => Ok(Role::Reconnecting),
                _ => Err(CliError::Usage(format!("unknown role {r}"))),
            })
            .collect::<Result<_, _>>()?
    };
    let guests = args.guests.max(roles.len());
    let size = format!("{}x{}", SCREEN.0, SCREEN.1);
    let max_guests = (guests * 2 + 16).to_string();
    let mut daemon = DaemonProcess::spawn(
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
    )?;
    let ep = daemon.endpoint();
    let pid = ep.pid.unwrap_or(0);
    let ctx = Arc::new(Ctx {
        socket: ep.target.clone(),
        tally: Tally::default(),
        stop: AtomicBool::new(false),
        others: Mutex::new(Vec::new()),
        raw_bursts: !args.no_raw_bursts,
    });
    // Warm-up: every role at once for a short while, so the daemon's lazily grown state
    // (allocator arenas, device state, thread stacks) is there before the start measurement.
    let warm = Duration::from_secs_f64((args.seconds / 10.0).clamp(1.0, 5.0));
    round(&ctx, &roles, guests, warm);
    let start = settle(pid, None);
    let start_fds = fd_targets(pid);
    // The tally counts the measured run only.
    let ctx = Arc::new(Ctx {
        socket: ctx.socket.clone(),
        tally: Tally::default(),
        stop: AtomicBool::new(false),
        others: Mutex::new(Vec::new()),
        raw_bursts: !args.no_raw_bursts,
    });
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
        Duration::from_secs_f64(args.seconds.max(0.0)),
    );
    ctx.stop.store(true, Ordering::Relaxed);
    let _ = watcher.join();
    let end = settle(pid, Some(start));
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
    let mut checks = Vec::new();
    let mut check = |name: &str, ok: bool, detail: String| {
        checks.push(Check {
            name: name.into(),
            ok,
            detail,
        })
    };
    let limit = (start.rss_kib as f64 * (1.0 + RSS_SLACK)) as u64;
    check(
        "rss",
        end.rss_kib <= limit,
        format!(
            "{} KiB -> {} KiB (limit {limit} KiB)",
            start.rss_kib, end.rss_kib
        ),
    );
    check(
        "fds",
        end.fds <= start.fds,
        format!("{} -> {}", start.fds, end.fds),
    );
    check(
        "threads",
        end.threads <= start.threads,
        format!("{} -> {}", start.threads, end.threads),
    );
    let rounds = get(&t.good_rounds);
    check(
        "good data",
        (rounds > 0 || !roles.contains(&Role::Good))
            && get(&t.good_bad_data) == 0
            && get(&t.good_errors) == 0,
        format!(
            "{rounds} rounds, {} wrong, {} errors",
            get(&t.good_bad_data),
            get(&t.good_errors)
        ),
    );
    check(
        "hostile refused",
        get(&t.hostile_accepted) == 0,
        format!(
            "{} misuses accepted of {}",
            get(&t.hostile_accepted),
            get(&t.hostile_requests)
        ),
    );
    check(
        "crashing guests",
        get(&t.crash_failures) == 0,
        format!(
            "{} killed, {} failed to start",
            get(&t.crashes),
            get(&t.crash_failures)
        ),
    );
    check(
        "reconnects",
        get(&t.reconnect_errors) == 0,
        format!(
            "{} sessions, {} errors",
            get(&t.reconnects),
            get(&t.reconnect_errors)
        ),
    );
    check("daemon alive", daemon_alive, format!("pid {pid}"));
    let report = SoakReport {
        guests,
        seconds: args.seconds,
        daemon_pid: pid,
        start,
        end,
        peak_rss_kib: peak.load(Ordering::Relaxed),
        good_rounds: rounds,
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
        notes: t.notes.lock().unwrap_or_else(|p| p.into_inner()).clone(),
    };
    if daemon_alive {
        daemon.stop()?;
    }
    Ok(report)
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

fn open(socket: &str, name: &str, coherence: &str) -> Result<Connection, GuestError> {
    Connection::open(
        socket,
        &ConnectOptions {
            name: name.into(),
            window_size: 16 << 20,
            sq_entries: 64,
            cq_entries: 64,
            coherence: Some(coherence.into()),
            ..ConnectOptions::default()
        },
    )
}

const PROTOCOLS: [&str; 3] = ["guest-staging", "write-invalidate", "prefetch"];

fn guest(ctx: &Ctx, role: Role, index: usize, deadline: Instant) {
    let t = &ctx.tally;
    let name = format!("soak-{index}");
    match role {
        Role::Good => {
            let c = match open(&ctx.socket, &name, PROTOCOLS[index / 4 % PROTOCOLS.len()]) {
                Ok(c) => c,
                Err(e) => {
                    t.note(format!("{name}: connect: {e}"));
                    return bump(&t.good_errors);
                }
            };
            let mut n = 0u64;
            while Instant::now() < deadline {
                match good_round(ctx, &c, (index as u64) << 32 | n) {
                    Ok(()) => bump(&t.good_rounds),
                    Err(e) => {
                        t.note(format!("{name}: round {n}: {e}"));
                        bump(&t.good_errors);
                        break;
                    }
                }
                n += 1;
            }
            c.close();
        }
        Role::Hostile => {
            let mut n = 0u64;
            while Instant::now() < deadline {
                if let Err(e) = hostile_round(ctx, &name, n) {
                    // The daemon may drop a guest that corrupts its ring: not a failure.
                    log::debug!("{name}: {e}");
                }
                bump(&t.hostile_rounds);
                n += 1;
            }
        }
        Role::Crashing => {
            let mut n = 0u64;
            while Instant::now() < deadline {
                match crash_once(&ctx.socket, n) {
                    Ok(()) => bump(&t.crashes),
                    Err(e) => {
                        t.note(format!("{name}: {e}"));
                        bump(&t.crash_failures);
                        std::thread::sleep(Duration::from_millis(200));
                    }
                }
                n += 1;
            }
        }
        Role::Reconnecting => {
            let mut n = 0u64;
            while Instant::now() < deadline {
                match reconnect_once(ctx, &name, n) {
                    Ok(()) => bump(&t.reconnects),
                    Err(e) => {
                        t.note(format!("{name}: {e}"));
                        bump(&t.reconnect_errors);
                    }
                }
                n += 1;
            }
        }
    }
}

fn soak_err(what: String) -> CliError {
    CliError::Usage(what)
}

/// Copies bytes out of (or into) region `id` through a CPU access.
fn cpu_read(c: &Connection, id: u64, len: u64) -> Result<Vec<u8>, CliError> {
    let a = c.begin_access(id, DeviceId::CPU, 0, len, AccessMode::Read)?;
    let ptr = a.ptr.ok_or_else(|| soak_err("no CPU pointer".into()))?;
    let mut out = vec![0u8; len as usize];
    // SAFETY: the window maps `len` bytes at `ptr` until end_access.
    unsafe { std::ptr::copy_nonoverlapping(ptr.as_ptr(), out.as_mut_ptr(), out.len()) };
    c.end_access(id, DeviceId::CPU, 0, len, AccessMode::Read)?;
    Ok(out)
}

fn cpu_write(c: &Connection, id: u64, bytes: &[u8]) -> Result<(), CliError> {
    let len = bytes.len() as u64;
    let a = c.begin_access(id, DeviceId::CPU, 0, len, AccessMode::Write)?;
    let ptr = a.ptr.ok_or_else(|| soak_err("no CPU pointer".into()))?;
    // SAFETY: the window maps `len` bytes at `ptr` until end_access.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), ptr.as_ptr(), bytes.len()) };
    c.end_access(id, DeviceId::CPU, 0, len, AccessMode::Write)?;
    Ok(())
}

/// Runs `cmd` on `device` with `id` bracketed by an access of `mode`.
fn on_device(
    c: &Connection,
    device: DeviceId,
    id: u64,
    mode: AccessMode,
    args: [u64; 6],
) -> Result<[u64; 6], CliError> {
    c.begin_access(id, device, 0, REGION, mode)?;
    let v = c.device_cmd(device, args)?;
    c.end_access(id, device, 0, REGION, mode)?;
    Ok(v)
}

/// A deterministic byte pattern of `seed`.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// One good round: producer -> consumer (and the CPU) agree on the producer's bytes; CPU
/// bytes reach the consumer; a present shows on the screen as sent. Wrong data is counted
/// in the tally, errors are returned.
fn good_round(ctx: &Ctx, c: &Connection, seed: u64) -> Result<(), CliError> {
    let t = &ctx.tally;
    let r = c.alloc_blob(REGION)?;
    ctx.others
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(r.id);
    // Producer -> consumer, then the CPU reads the same bytes.
    let made = on_device(
        c,
        DeviceId::PRODUCER,
        r.id,
        AccessMode::Write,
        [testdev::WRITE_PATTERN, r.id, seed, 0, 0, 0],
    )?[0];
    let seen = on_device(
        c,
        DeviceId::CONSUMER,
        r.id,
        AccessMode::Read,
        [testdev::CHECKSUM, r.id, 0, 0, 0, 0],
    )?[0];
    let cpu = crc32fast::hash(&cpu_read(c, r.id, REGION)?) as u64;
    if made != seen || made != cpu {
        bump(&t.good_bad_data);
        t.note(format!(
            "producer crc {made:08x}, consumer {seen:08x}, cpu {cpu:08x}"
        ));
    }
    // CPU write -> device read -> CPU read.
    let bytes = pattern(seed, REGION as usize);
    cpu_write(c, r.id, &bytes)?;
    let want = crc32fast::hash(&bytes) as u64;
    let seen = on_device(
        c,
        DeviceId::CONSUMER2,
        r.id,
        AccessMode::Read,
        [testdev::CHECKSUM, r.id, 0, 0, 0, 0],
    )?[0];
    let back = cpu_read(c, r.id, REGION)?;
    if seen != want || back != bytes {
        bump(&t.good_bad_data);
        t.note(format!("cpu wrote {want:08x}, consumer read {seen:08x}"));
    }
    c.free(r.id)?;
    ctx.others
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .retain(|&id| id != r.id);
    // Every fourth round: an opaque full-screen frame, checked against the display's CRC.
    if seed.is_multiple_of(4) {
        present(ctx, c, seed)?;
    }
    Ok(())
}

fn present(ctx: &Ctx, c: &Connection, seed: u64) -> Result<(), CliError> {
    let t = &ctx.tally;
    let (w, h) = SCREEN;
    let f = c.alloc(0, w, h, Format::Rgba8, 0)?;
    let mut px = pattern(seed ^ 0x5eed, f.size as usize);
    for p in px.chunks_exact_mut(4) {
        p[3] = 255;
    }
    // Rows are `stride` bytes; the screen shows `w * 4` of each.
    cpu_write(c, f.id, &px)?;
    let row = (w * 4) as usize;
    let mut shown = Vec::with_capacity(row * h as usize);
    for y in 0..h as usize {
        let at = y * f.stride as usize;
        shown.extend_from_slice(&px[at..at + row]);
    }
    let want = crc32fast::hash(&shown) as u64;
    let id = c
        .command_with_access(&display::Present {
            frame: f.id,
            capture_ns: 0,
        })?
        .frame_id;
    bump(&t.presents);
    match c.command(&display::Checksum::default()) {
        Ok(v) if v.frame_id == id => {
            if v.crc == want {
                bump(&t.presents_verified);
            } else {
                bump(&t.good_bad_data);
                t.note(format!(
                    "present {id}: screen crc {:08x}, sent {want:08x}",
                    v.crc
                ));
            }
        }
        // Not on screen yet, or already replaced: nothing to compare.
        Ok(_) | Err(GuestError::Status { .. }) => {}
        Err(e) => return Err(e.into()),
    }
    c.free(f.id)?;
    Ok(())
}

/// Whether `r` is refused with an error status (what every misuse must get).
fn refused<T>(t: &Tally, what: &str, r: Result<T, GuestError>) -> Result<(), CliError> {
    bump(&t.hostile_requests);
    match r {
        Err(GuestError::Status { .. }) | Err(GuestError::BadArgument(_)) => Ok(()),
        Ok(_) => {
            bump(&t.hostile_accepted);
            t.note(format!("misuse accepted: {what}"));
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

/// One hostile session: misuses through the API (each must be refused), then a burst of
/// malformed ring entries, then the guest hangs up.
fn hostile_round(ctx: &Ctx, name: &str, n: u64) -> Result<(), CliError> {
    let t = &ctx.tally;
    let c = open(&ctx.socket, name, PROTOCOLS[n as usize % PROTOCOLS.len()])?;
    let own = c.alloc_blob(4096)?;
    // Out of range, through the raw call (the library would refuse it itself).
    for (off, len) in [(4096, 1), (0, 4097), (u64::MAX, 2), (4000, u64::MAX)] {
        let r = c.call(
            Opcode::BeginAccess,
            DeviceId::CPU,
            [own.id, off, len, AccessMode::Read as u64, 0, 0],
        );
        refused(t, &format!("access {off}+{len} of a 4096-byte region"), r)?;
    }
    // Answered with whatever status, as long as the daemon answers.
    let _ = c.call(
        Opcode::EndAccess,
        DeviceId::CONSUMER,
        [own.id, 0, 4096, AccessMode::Read as u64, 0, 0],
    );
    let _ = c.device_cmd(DeviceId::CONSUMER, [testdev::CHECKSUM, own.id, 0, 0, 0, 0]);
    // Other guests' region ids (ids are per guest: none of these are this guest's).
    let theirs: Vec<u64> = ctx
        .others
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .copied()
        .filter(|&id| id > own.id)
        .take(4)
        .collect();
    for id in theirs.into_iter().chain([own.id + 1000, u64::MAX]) {
        refused(
            t,
            &format!("access to region {id}"),
            c.call(
                Opcode::BeginAccess,
                DeviceId::CPU,
                [id, 0, 16, AccessMode::Read as u64, 0, 0],
            ),
        )?;
        refused(
            t,
            &format!("free of region {id}"),
            c.call(Opcode::Free, DeviceId::CPU, [id, 0, 0, 0, 0, 0]),
        )?;
    }
    // Fence misuse: a released fence, double release, forged ids (any status will do).
    let f = c.fence_create()?;
    c.fence_release(f)?;
    let _ = c.fence_release(f);
    let _ = c.call(
        Opcode::FenceStatus,
        DeviceId::CPU,
        [f.0 ^ (1 << 40), 0, 0, 0, 0, 0],
    );
    let _ = c.fence_release(Fence(0xdead_beef_0000 + n));
    let _ = c.fence_signal(DeviceId::CONSUMER, Fence(0xdead_0000 + n));
    // A fence that is never signaled holds this guest's producer queue only.
    let stuck = c.fence_create()?;
    let _ = c.fence_wait(DeviceId::PRODUCER, stuck);
    if !ctx.raw_bursts {
        c.close();
        return Ok(());
    }
    // Malformed ring entries, sent without waiting; the answers are not read.
    let mut x = n.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for i in 0..32u64 {
        let r = next();
        let req = Request {
            seq: 1 << 62 | i,
            opcode: match i % 4 {
                0 => (r % 64) as u32,
                1 => u32::MAX - (r % 4) as u32,
                _ => (r % 13) as u32,
            },
            device: match i % 3 {
                0 => (r >> 8) as u32 % 20,
                1 => (r >> 8) as u32,
                _ => DeviceId::CPU.0,
            },
            args: [
                if i % 2 == 0 { own.id } else { next() },
                next() % 8192,
                next() % 8192,
                next() % 5,
                next(),
                next(),
            ],
        };
        if c.submit_raw(req).is_err() {
            break;
        }
        bump(&t.hostile_requests);
    }
    std::thread::sleep(Duration::from_millis(20));
    c.close();
    Ok(())
}

/// A `virtsoc debug hold` child holding regions mid-access, killed with SIGKILL.
fn crash_once(socket: &str, n: u64) -> Result<(), CliError> {
    let exe = std::env::current_exe()?;
    let mut child = Command::new(exe)
        .args(["debug", "hold", "--socket", socket, "--regions", "3"])
        .args(["--size", &(256u64 << 10).to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let mut line = String::new();
    if let Some(out) = child.stdout.take() {
        let _ = BufReader::new(out).read_line(&mut line);
    }
    // Killed at varying points: some right after READY, some a little later.
    std::thread::sleep(Duration::from_millis(n % 5 * 20));
    let _ = child.kill();
    let _ = child.wait();
    if line.starts_with("READY") {
        Ok(())
    } else {
        Err(soak_err(format!(
            "debug hold did not get ready: {:?}",
            line.trim()
        )))
    }
}

/// Connects, checks a region round trip, and leaves (freeing it or not, closing or just
/// dropping the connection).
fn reconnect_once(ctx: &Ctx, name: &str, n: u64) -> Result<(), CliError> {
    let c = open(&ctx.socket, name, PROTOCOLS[n as usize % PROTOCOLS.len()])?;
    let r = c.alloc_blob(8192)?;
    let bytes = pattern(n, 8192);
    cpu_write(&c, r.id, &bytes)?;
    if cpu_read(&c, r.id, 8192)? != bytes {
        bump(&ctx.tally.good_bad_data);
        ctx.tally.note(format!("{name}: round trip {n} differs"));
    }
    if n.is_multiple_of(2) {
        c.free(r.id)?;
    }
    if n.is_multiple_of(3) {
        c.close();
    }
    Ok(())
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
