//! Where the host's cores went during a slice of `bench sharing`'s overhead measure: the
//! daemon's own threads (the GPU's lavapipe threads are among them), its decoder worker
//! processes (the codec's work), this process (the guests), everything else, and idle, from
//! the kernel's counts (`/proc/stat` and each process's `stat`; clock ticks, 10 ms here).
//!
//! The overhead compares the guests' work together with one guest alone at its alone rate;
//! a guest alone that leaves cores idle (the codec: one guest's commands run one at a time,
//! and one decoder with one thread uses one core) makes that rate no device's capacity,
//! and the split shows it: what the cores did alone and together, not a ratio alone.

use std::time::Instant;

use serde::Serialize;

use crate::scenario::{cpu_seconds, daemon_cpu};
use crate::stats::percentile;

/// A slice's cores, each part in % of one core (the parts add up to `cores` x 100).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct CpuSplit {
    /// The daemon's own threads.
    pub daemon: f64,
    /// The daemon's child processes (decoder and encoder workers).
    pub workers: f64,
    /// This process: the guests' threads and the bench's own.
    pub guests: f64,
    /// Every other process, and the kernel's interrupts.
    pub other: f64,
    /// Idle (with I/O wait).
    pub idle: f64,
}

impl CpuSplit {
    /// Each part's median over `v`.
    pub(super) fn median(v: &[CpuSplit]) -> CpuSplit {
        let m = |f: fn(&CpuSplit) -> f64| percentile(&v.iter().map(f).collect::<Vec<_>>(), 50.0);
        CpuSplit {
            daemon: m(|c| c.daemon),
            workers: m(|c| c.workers),
            guests: m(|c| c.guests),
            other: m(|c| c.other),
            idle: m(|c| c.idle),
        }
    }
}

/// One reading of the counts (seconds).
#[derive(Debug, Clone, Copy)]
pub(super) struct Reading {
    at: Instant,
    host_busy: f64,
    host_idle: f64,
    daemon: f64,
    tree: f64,
    guests: f64,
}

impl Reading {
    /// The counts now, the daemon being process `daemon` (`None`: unknown, its parts 0).
    pub(super) fn now(daemon: Option<u32>) -> Reading {
        let (host_busy, host_idle) = host_times().unwrap_or((0.0, 0.0));
        let (own, children) = daemon.and_then(daemon_cpu).unwrap_or((0.0, 0.0));
        Reading {
            at: Instant::now(),
            host_busy,
            host_idle,
            daemon: own,
            tree: own + children,
            guests: cpu_seconds(std::process::id()).unwrap_or(0.0),
        }
    }

    /// The split from `self` to `later`.
    pub(super) fn split_to(&self, later: &Reading) -> CpuSplit {
        let secs = later.at.duration_since(self.at).as_secs_f64().max(1e-9);
        let pct = |a: f64, b: f64| ((b - a) / secs * 100.0).max(0.0);
        let daemon = pct(self.daemon, later.daemon);
        let workers = pct(self.tree - self.daemon, later.tree - later.daemon);
        let guests = pct(self.guests, later.guests);
        let busy = pct(self.host_busy, later.host_busy);
        CpuSplit {
            daemon,
            workers,
            guests,
            other: (busy - daemon - workers - guests).max(0.0),
            idle: pct(self.host_idle, later.host_idle),
        }
    }
}

/// The host's busy and idle seconds, all cores together, from `/proc/stat`'s first line.
fn host_times() -> Option<(f64, f64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    parse_host_times(stat.lines().next()?)
}

/// `cpu user nice system idle iowait irq softirq steal ...` (ticks): busy is user, nice,
/// system, irq, softirq and steal; idle is idle and iowait (guest time is in user already).
fn parse_host_times(line: &str) -> Option<(f64, f64)> {
    let mut f = line.split_whitespace();
    if f.next()? != "cpu" {
        return None;
    }
    let v: Vec<f64> = f.take(8).map(|x| x.parse().ok()).collect::<Option<_>>()?;
    if v.len() < 8 {
        return None;
    }
    let tick = rustix::param::clock_ticks_per_second() as f64;
    let busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7];
    Some((busy / tick, (v[3] + v[4]) / tick))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_line_splits_into_busy_and_idle() {
        let tick = rustix::param::clock_ticks_per_second() as f64;
        let (busy, idle) = parse_host_times("cpu  100 20 30 400 5 1 2 3 0 0").unwrap();
        assert!((busy - 156.0 / tick).abs() < 1e-9, "{busy}");
        assert!((idle - 405.0 / tick).abs() < 1e-9, "{idle}");
        assert_eq!(parse_host_times("cpu0 1 2 3 4 5 6 7 8"), None);
        assert_eq!(parse_host_times("cpu 1 2 3"), None);
    }

    #[test]
    fn a_split_is_each_count_over_the_time_between_readings() {
        let t0 = Instant::now();
        let a = Reading {
            at: t0,
            host_busy: 10.0,
            host_idle: 5.0,
            daemon: 1.0,
            tree: 1.5,
            guests: 2.0,
        };
        let b = Reading {
            at: t0 + std::time::Duration::from_millis(500),
            host_busy: 10.9,
            host_idle: 5.1,
            daemon: 1.2,
            tree: 2.0,
            guests: 2.1,
        };
        let s = a.split_to(&b);
        let near = |x: f64, y: f64| (x - y).abs() < 1e-6;
        // 0.2 s of the daemon, 0.3 s of workers, 0.1 s of guests in 0.5 s; 0.9 s busy.
        assert!(near(s.daemon, 40.0) && near(s.workers, 60.0) && near(s.guests, 20.0));
        assert!(near(s.other, 60.0) && near(s.idle, 20.0), "{s:?}");
        let m = CpuSplit::median(&[s, CpuSplit::default(), s]);
        assert_eq!(m, s);
    }
}
