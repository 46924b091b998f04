//! `virtsoc bench admission`: how long good local guests wait to be admitted while hostile
//! peers keep every pre-handshake budget of the daemon full (issue 30's target: within
//! 100 ms p99, and TCP strangers never hold a local guest's place).
//!
//! A daemon of its own (`--max-guests 8`, a Unix socket and a TCP listener with a token)
//! serves `--flood` idle connections per listener, each reopened as soon as the daemon lets
//! go of it (a refusal, the oldest pending connection cut off, the handshake deadline), by
//! one thread per listener. Once both floods are on (each has had a connection let go of
//! and reopened it, or after [`FLOOD_ON_WAIT`]), `--guests` good local guests connect one
//! after another (each says hello, runs a `nop`, and leaves). Each guest's admission time is from
//! its `connect` call to its admitted connection; a guest refused or timed out is counted
//! as locked out.

use std::io::Read;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use virtsoc_guest::{ConnectOptions, Connection};

use crate::daemon_proc::DaemonProcess;
use crate::stats::percentile;
use crate::CliError;

/// The daemon's guest limit in the bench: small, so that a flood that held places would
/// show at once.
const MAX_GUESTS: &str = "8";

/// Longest the bench waits for both floods to be on before the guests connect (on a loaded
/// machine the daemon may take seconds to accept the 128 connections and let go of the first).
const FLOOD_ON_WAIT: Duration = Duration::from_secs(20);

/// The report.
#[derive(Debug, Clone, Serialize)]
pub struct AdmissionReport {
    /// Idle connections kept open per listener.
    pub flood_per_listener: usize,
    /// How many times the flooders reopened a connection the daemon let go of (Unix, TCP).
    pub reopened_unix: usize,
    pub reopened_tcp: usize,
    pub guests: usize,
    pub admitted: usize,
    /// Guests refused or timed out (the target: none).
    pub locked_out: usize,
    /// Admission times of the admitted guests, milliseconds.
    pub admit_ms_p50: f64,
    pub admit_ms_p99: f64,
    pub admit_ms_max: f64,
    /// The target (p99 within 100 ms, none locked out) met.
    pub target_met: bool,
}

/// Keeps `n` idle connections made by `open` until `stop`, reopening each as soon as the
/// daemon lets go of it, counting the reopened ones in `reopened`.
fn flood(
    open: impl Fn() -> Option<Box<dyn Read + Send>> + Send + 'static,
    n: usize,
    stop: Arc<AtomicBool>,
    reopened: Arc<AtomicUsize>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut conns: Vec<Option<Box<dyn Read + Send>>> = (0..n).map(|_| open()).collect();
        while !stop.load(Ordering::SeqCst) {
            for c in conns.iter_mut() {
                let closed = match c {
                    // A read that returns (a refusal, EOF) means the daemon let go of it.
                    Some(r) => {
                        let mut buf = [0u8; 256];
                        !matches!(r.read(&mut buf), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
                    }
                    None => true,
                };
                if closed {
                    *c = open();
                    reopened.fetch_add(1, Ordering::SeqCst);
                }
            }
            // The flooder's pace: a hostile peer reopening within milliseconds.
            std::thread::sleep(Duration::from_millis(2));
        }
    })
}

/// Runs the bench: `flood` idle connections per listener, `guests` good local guests.
pub fn run(flood_n: usize, guests: usize) -> Result<AdmissionReport, CliError> {
    let d = DaemonProcess::spawn(
        &["--max-guests", MAX_GUESTS, "--handshake-timeout-ms", "5000"],
        true,
    )?;
    let e = d.endpoint();
    let (addr, _token) = e
        .remote
        .clone()
        .ok_or_else(|| CliError::Usage("the daemon has no TCP listener".into()))?;
    let socket = e.target.clone();
    let stop = Arc::new(AtomicBool::new(false));
    let (reopened_unix, reopened_tcp) = (Arc::default(), Arc::default());
    let unix = flood(
        move || {
            let s = UnixStream::connect(&socket).ok()?;
            s.set_nonblocking(true).ok()?;
            Some(Box::new(s))
        },
        flood_n,
        stop.clone(),
        Arc::clone(&reopened_unix),
    );
    let tcp = flood(
        move || {
            let s = std::net::TcpStream::connect(&addr).ok()?;
            s.set_nonblocking(true).ok()?;
            Some(Box::new(s))
        },
        flood_n,
        stop.clone(),
        Arc::clone(&reopened_tcp),
    );
    // The budgets fill, and the daemon lets go of connections beyond them.
    let on = |n: &Arc<AtomicUsize>| n.load(Ordering::SeqCst) > 0;
    let t0 = Instant::now();
    while !(on(&reopened_unix) && on(&reopened_tcp)) && t0.elapsed() < FLOOD_ON_WAIT {
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(100));
    let mut took = Vec::with_capacity(guests);
    let mut locked_out = 0;
    for _ in 0..guests {
        let t0 = Instant::now();
        let opts = ConnectOptions {
            window_size: 4 << 20,
            ..ConnectOptions::default()
        };
        match Connection::open(&e.target, &opts) {
            Ok(g) => {
                took.push(t0.elapsed().as_secs_f64() * 1e3);
                if g.nop().is_err() {
                    locked_out += 1;
                }
                g.close();
            }
            Err(_) => locked_out += 1,
        }
    }
    stop.store(true, Ordering::SeqCst);
    let _ = (unix.join(), tcp.join());
    let (reopened_unix, reopened_tcp) = (
        reopened_unix.load(Ordering::SeqCst),
        reopened_tcp.load(Ordering::SeqCst),
    );
    d.stop()?;
    took.sort_by(|a, b| a.total_cmp(b));
    let p99 = percentile(&took, 99.0);
    Ok(AdmissionReport {
        flood_per_listener: flood_n,
        reopened_unix,
        reopened_tcp,
        guests,
        admitted: took.len(),
        locked_out,
        admit_ms_p50: percentile(&took, 50.0),
        admit_ms_p99: p99,
        admit_ms_max: took.last().copied().unwrap_or(0.0),
        target_met: locked_out == 0 && p99 <= 100.0,
    })
}

/// Prints the report as a table.
pub fn print(r: &AdmissionReport) {
    println!(
        "{} good local guests next to {} + {} idle connections (Unix + TCP, reopened {} + {} \
         times), daemon --max-guests {MAX_GUESTS}:",
        r.guests, r.flood_per_listener, r.flood_per_listener, r.reopened_unix, r.reopened_tcp
    );
    println!(
        "admitted {} locked out {}  admission p50 {:.2} ms  p99 {:.2} ms  max {:.2} ms  \
         (target: p99 <= 100 ms, none locked out: {})",
        r.admitted,
        r.locked_out,
        r.admit_ms_p50,
        r.admit_ms_p99,
        r.admit_ms_max,
        if r.target_met { "met" } else { "not met" }
    );
}
