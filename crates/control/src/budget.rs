//! The live view's CPU budget: viewers may cost the daemon at most a given percentage of the
//! CPU its other work uses, whatever their number, size or frame rate.
//!
//! A view frame costs about a millisecond of CPU on a small machine (sampling the presented
//! planes, one JPEG, the request), which at 10 frames a second is a point of a core: more
//! than 10% of a daemon serving one 1080p camera guest. A page asks for frames at its own
//! rate, and any number of pages may be open, so the cost is bounded here rather than
//! trusted to the pages: the CPU of every request of the view (its thread's, from the
//! request to the answer written: frames, the page, its reports) is charged to the budget,
//! and the next frame request (any viewer's) waits until what was served so far fits it. The allowance is `pct` percent of the
//! daemon's other CPU (the process's CPU time minus the view's), measured over windows of
//! [`WINDOW`]; a request never waits more than [`MAX_WAIT`], so every viewer still gets a
//! frame a second from an idle daemon. A budget of 0 turns the pacing off.
//!
//! The pacing is a virtual clock: a frame of CPU `c` moves the next allowed start by
//! `c / (pct/100 x other CPU rate)`, which holds the view's share of the daemon's CPU at
//! `pct` on average. The arithmetic takes its clock and CPU readings as arguments
//! ([`ViewBudget::delay_at`], [`ViewBudget::charge_at`]), so it is tested without sleeping.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use virtsoc_sync::LockExt;

/// How long the daemon's other CPU is measured over.
pub const WINDOW: Duration = Duration::from_millis(500);
/// The longest a frame request waits for the budget.
pub const MAX_WAIT: Duration = Duration::from_secs(1);

/// The default budget: percent of the daemon's other CPU.
pub const DEFAULT_PCT: f64 = 4.0;

#[derive(Debug, Default)]
struct State {
    /// Start of the current measuring window: when, the process's CPU then, the view's then.
    window: Option<(u64, u64, u64)>,
    /// The daemon's other CPU over the last window, in cores (CPU ns per ns).
    rate: Option<f64>,
    /// The view's CPU so far.
    view_ns: u64,
    /// The earliest instant the next frame may start.
    next: u64,
    /// Requests charged, and frame requests that waited.
    requests: u64,
    delayed: u64,
}

/// What the budget has seen, for the control API.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct BudgetStats {
    /// The budget, percent of the daemon's other CPU (0: off).
    pub pct: f64,
    /// CPU the view's requests used, ms.
    pub view_cpu_ms: f64,
    /// The daemon's other CPU over the last window, percent of a core.
    pub other_cpu_pct: Option<f64>,
    /// The view's requests charged (frames, the page, its reports).
    pub requests: u64,
    /// Frame requests that waited for the budget.
    pub delayed: u64,
}

/// The live view's CPU budget (see the module docs).
#[derive(Debug)]
pub struct ViewBudget {
    pct: f64,
    epoch: Instant,
    state: Mutex<State>,
}

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl ViewBudget {
    /// A budget of `pct` percent of the daemon's other CPU (0 or less: no pacing), whose
    /// first window starts now.
    pub fn new(pct: f64) -> Self {
        Self::starting(pct, ns(process_cpu()))
    }

    /// A budget whose first window starts at instant 0 with the process at `process_ns` of
    /// CPU.
    fn starting(pct: f64, process_ns: u64) -> Self {
        ViewBudget {
            pct: if pct.is_finite() { pct.max(0.0) } else { 0.0 },
            epoch: Instant::now(),
            state: Mutex::new(State {
                window: Some((0, process_ns, 0)),
                ..State::default()
            }),
        }
    }

    /// The budget in percent (0: off).
    pub fn pct(&self) -> f64 {
        self.pct
    }

    fn now(&self) -> u64 {
        ns(self.epoch.elapsed())
    }

    /// How long a frame request arriving now waits for the budget.
    pub fn delay(&self) -> Duration {
        if self.pct == 0.0 {
            return Duration::ZERO;
        }
        self.delay_at(self.now(), ns(process_cpu()))
    }

    /// A request of the view used `cpu` of its thread's CPU, finishing now.
    pub fn charge(&self, cpu: Duration) {
        self.charge_at(self.now(), ns(cpu));
    }

    /// [`delay`](Self::delay) at instant `now` (ns), the process having used `process_ns`
    /// of CPU so far.
    pub fn delay_at(&self, now: u64, process_ns: u64) -> Duration {
        let mut s = self.state.lock_or_recover();
        match s.window {
            None => s.window = Some((now, process_ns, s.view_ns)),
            Some((t0, p0, v0)) if now.saturating_sub(t0) >= ns(WINDOW) => {
                let other = process_ns
                    .saturating_sub(p0)
                    .saturating_sub(s.view_ns.saturating_sub(v0));
                s.rate = Some(other as f64 / (now - t0) as f64);
                s.window = Some((now, process_ns, s.view_ns));
            }
            Some(_) => {}
        }
        let wait = Duration::from_nanos(s.next.saturating_sub(now)).min(MAX_WAIT);
        if !wait.is_zero() {
            s.delayed += 1;
        }
        wait
    }

    /// [`charge`](Self::charge) at instant `now` (ns) of `cpu_ns`.
    pub fn charge_at(&self, now: u64, cpu_ns: u64) {
        let mut s = self.state.lock_or_recover();
        s.view_ns = s.view_ns.saturating_add(cpu_ns);
        s.requests += 1;
        if self.pct == 0.0 {
            return;
        }
        // Before the first window is measured (half a second after the daemon started),
        // as if the daemon were idle.
        let allowance = self.pct / 100.0 * s.rate.unwrap_or(0.0);
        let gap = if allowance > 0.0 {
            cpu_ns as f64 / allowance
        } else {
            f64::INFINITY
        };
        // Never more than a longest wait ahead: an idle daemon's viewers get a frame a
        // second, and a burst of them does not bank a debt that starves the view later.
        let gap = gap.min(ns(MAX_WAIT) as f64) as u64;
        s.next = (s.next.max(now) + gap).min(now + ns(MAX_WAIT));
    }

    /// What the budget has seen.
    pub fn stats(&self) -> BudgetStats {
        let s = self.state.lock_or_recover();
        BudgetStats {
            pct: self.pct,
            view_cpu_ms: s.view_ns as f64 / 1e6,
            other_cpu_pct: s.rate.map(|r| r * 100.0),
            requests: s.requests,
            delayed: s.delayed,
        }
    }
}

/// CPU time of this process so far.
pub fn process_cpu() -> Duration {
    clock(rustix::time::ClockId::ProcessCPUTime)
}

/// CPU time of the calling thread so far.
pub fn thread_cpu() -> Duration {
    clock(rustix::time::ClockId::ThreadCPUTime)
}

fn clock(id: rustix::time::ClockId) -> Duration {
    let t = rustix::time::clock_gettime(id);
    Duration::new(
        t.tv_sec.max(0) as u64,
        t.tv_nsec.clamp(0, 999_999_999) as u32,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    /// Runs a viewer asking for a frame every `ask` ms, each costing `cost` ms of CPU, beside
    /// other daemon work of `other` cores, for `secs`; returns the view's CPU as a fraction
    /// of the other CPU, and frames served. The viewer comes a second after the daemon
    /// started.
    fn run(b: &ViewBudget, ask: u64, cost: u64, other: f64, secs: u64) -> (f64, u64) {
        let (mut t, mut view, mut frames) = (1000 * MS, 0u64, 0u64);
        let end = t + secs * 1000 * MS;
        while t < end {
            let process = (t as f64 * other) as u64 + view;
            t += ns(b.delay_at(t, process));
            t += cost * MS;
            view += cost * MS;
            frames += 1;
            b.charge_at(t, cost * MS);
            t += ask * MS;
        }
        (view as f64 / (secs as f64 * 1e9 * other), frames)
    }

    #[test]
    fn a_fast_viewer_is_held_to_the_budget() {
        // 1 ms frames asked for every 10 ms (10% of a 10%-of-a-core daemon unpaced).
        let b = ViewBudget::starting(4.0, 0);
        let (share, frames) = run(&b, 10, 1, 0.1, 60);
        assert!((0.035..=0.045).contains(&share), "view share {share}");
        assert!(frames < 60 * 6, "{frames} frames");
        assert!(b.stats().delayed > 0);
    }

    #[test]
    fn a_budget_of_zero_does_not_pace() {
        let b = ViewBudget::starting(0.0, 0);
        let (share, frames) = run(&b, 9, 1, 0.1, 10);
        assert_eq!(frames, 1000);
        assert!(share > 0.09, "view share {share}");
        assert_eq!(b.stats().delayed, 0);
    }

    #[test]
    fn a_viewer_within_the_budget_is_not_delayed() {
        // 1 ms frames every 999 ms: 0.1% of a core against a 50%-of-a-core daemon's 4%.
        let b = ViewBudget::starting(4.0, 0);
        let (_, frames) = run(&b, 999, 1, 0.5, 20);
        assert_eq!(frames, 20);
        assert_eq!(b.stats().delayed, 0);
    }

    #[test]
    fn an_idle_daemon_still_gives_a_frame_a_second() {
        let b = ViewBudget::starting(4.0, 0);
        let (_, frames) = run(&b, 10, 1, 0.0, 30);
        // Never more than MAX_WAIT between frames: at least a frame a second.
        assert!(frames >= 29, "{frames} frames");
        assert!(frames <= 40, "{frames} frames");
    }

    #[test]
    fn many_viewers_share_one_budget() {
        // Four viewers interleaved on one clock cost what one would.
        let b = ViewBudget::starting(4.0, 0);
        let (mut t, mut view) = (1000 * MS, 0u64);
        let end = t + 60 * 1000 * MS;
        while t < end {
            for _ in 0..4 {
                let process = (t as f64 * 0.1) as u64 + view;
                t += ns(b.delay_at(t, process));
                b.charge_at(t + MS, MS);
                view += MS;
            }
            t += MS;
        }
        let share = view as f64 / (60e9 * 0.1);
        assert!(share < 0.05, "four viewers' share {share}");
    }

    #[test]
    fn readings_of_this_process_advance() {
        let (p, t) = (process_cpu(), thread_cpu());
        let mut x = 0u64;
        for i in 0..2_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        assert!(process_cpu() > p);
        assert!(thread_cpu() > t);
    }
}
