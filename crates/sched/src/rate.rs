//! AvA's rate controls for devices that cannot be preempted: device time is accounted per
//! guest in a window (500 ms); a guest whose proportion of the window's device time (among
//! the guests with work) exceeds its share `L_v = s_v / sum(s)` is postponed, and checked
//! again after a delay:
//!
//! - **fixed-rate** polling: the delay is a fixed interval `d` (AvA: 5 ms);
//! - **AIMD** feedback: each guest's delay adapts at the end of every window, `d <- d * b` if
//!   the guest exhausted its share in that window, `d <- d + a` otherwise (AvA's formula with
//!   `a = 1 ms`, `b = 1/2`), within [`RateConfig::min_delay`] and [`RateConfig::max_delay`]: a
//!   guest that keeps exhausting its share is re-checked ever more finely, so the device idles
//!   little once it may run again.
//!
//! Guests within their share are served in turn. A guest alone is never postponed. The guests
//! "with work" are those ready or running now, and those that were within the last
//! `anticipate` (a closed-loop guest between two commands).

use std::collections::HashMap;

use crate::rr::RoundRobin;
use crate::{GuestId, Nanos, Pick, Scheduler, DEFAULT_SHARE, MS};

/// Parameters of [`RateControl`].
#[derive(Debug, Clone, Copy)]
pub struct RateConfig {
    /// The accounting window.
    pub window: Nanos,
    /// Fixed-rate polling interval; also AIMD's first delay.
    pub delay: Nanos,
    /// AIMD additive increase.
    pub a: Nanos,
    /// AIMD multiplicative decrease.
    pub b: f64,
    /// Smallest delay AIMD shrinks to.
    pub min_delay: Nanos,
    /// Largest delay AIMD grows to.
    pub max_delay: Nanos,
    /// Proportion above its share a guest may use before it is postponed (0.01 = 1 point).
    pub tolerance: f64,
    /// How long a guest that had work still counts as having work.
    pub anticipate: Nanos,
}

impl Default for RateConfig {
    fn default() -> Self {
        RateConfig {
            window: 500 * MS,
            delay: 5 * MS,
            a: MS,
            b: 0.5,
            min_delay: MS / 4,
            max_delay: 50 * MS,
            tolerance: 0.01,
            anticipate: 2 * MS,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Fixed,
    Aimd,
}

#[derive(Debug)]
struct Account {
    share: f64,
    used: Nanos,
    delay: Nanos,
    not_before: Nanos,
}

/// Windowed device-time accounting with fixed-rate or AIMD postponement.
#[derive(Debug)]
pub struct RateControl {
    cfg: RateConfig,
    mode: Mode,
    accounts: HashMap<GuestId, Account>,
    shares: HashMap<GuestId, u32>,
    window_start: Option<Nanos>,
    turn: RoundRobin,
    seen: HashMap<GuestId, Nanos>,
}

impl RateControl {
    /// Fixed-rate polling.
    pub fn fixed(cfg: RateConfig) -> Self {
        Self::new(cfg, Mode::Fixed)
    }

    /// AIMD delay control.
    pub fn aimd(cfg: RateConfig) -> Self {
        Self::new(cfg, Mode::Aimd)
    }

    fn new(cfg: RateConfig, mode: Mode) -> Self {
        RateControl {
            cfg,
            mode,
            accounts: HashMap::new(),
            shares: HashMap::new(),
            window_start: None,
            turn: RoundRobin::default(),
            seen: HashMap::new(),
        }
    }

    /// A guest's current postponement delay.
    pub fn delay(&self, guest: GuestId) -> Option<Nanos> {
        self.accounts.get(&guest).map(|a| a.delay)
    }

    fn account(&mut self, guest: GuestId) -> &mut Account {
        let share = f64::from(*self.shares.get(&guest).unwrap_or(&DEFAULT_SHARE));
        let delay = self.cfg.delay;
        self.accounts.entry(guest).or_insert(Account {
            share,
            used: 0,
            delay,
            not_before: 0,
        })
    }

    fn roll(&mut self, now: Nanos) {
        let start = *self.window_start.get_or_insert(now);
        if now.saturating_sub(start) >= self.cfg.window {
            if self.mode == Mode::Aimd {
                let (used, share) = self
                    .accounts
                    .values()
                    .filter(|a| a.used > 0)
                    .fold((0u64, 0.0), |(u, s), a| (u + a.used, s + a.share));
                let cfg = self.cfg;
                for a in self.accounts.values_mut().filter(|a| a.used > 0) {
                    let exhausted = a.used as f64 / used.max(1) as f64
                        > a.share / share.max(1.0) + cfg.tolerance;
                    a.delay = if exhausted {
                        ((a.delay as f64 * cfg.b) as Nanos).max(cfg.min_delay)
                    } else {
                        (a.delay + cfg.a).min(cfg.max_delay)
                    };
                }
            }
            for a in self.accounts.values_mut() {
                a.used = 0;
            }
            self.window_start = Some(now);
        }
    }

    /// Whether `guest` used more than its share of the window among `active`.
    fn over_share(&self, guest: GuestId, active: &[GuestId]) -> bool {
        if active.len() < 2 {
            return false;
        }
        let (mut used, mut share) = (0u64, 0.0);
        for g in active {
            if let Some(a) = self.accounts.get(g) {
                used += a.used;
                share += a.share;
            }
        }
        let Some(me) = self.accounts.get(&guest) else {
            return false;
        };
        if used == 0 || share <= 0.0 {
            return false;
        }
        me.used as f64 / used as f64 > me.share / share + self.cfg.tolerance
    }
}

impl Scheduler for RateControl {
    fn name(&self) -> &'static str {
        match self.mode {
            Mode::Fixed => "fixed-rate",
            Mode::Aimd => "aimd",
        }
    }

    fn set_share(&mut self, guest: GuestId, share: u32) {
        let share = share.max(1);
        self.shares.insert(guest, share);
        if let Some(a) = self.accounts.get_mut(&guest) {
            a.share = f64::from(share);
        }
    }

    fn forget(&mut self, guest: GuestId) {
        self.accounts.remove(&guest);
        self.shares.remove(&guest);
        self.turn.forget(guest);
        self.seen.remove(&guest);
    }

    fn pick(&mut self, ready: &[GuestId], busy: &[GuestId], now: Nanos) -> Pick {
        if ready.is_empty() {
            return Pick::Wait;
        }
        self.roll(now);
        for g in ready.iter().chain(busy) {
            self.seen.insert(*g, now);
        }
        let horizon = now.saturating_sub(self.cfg.anticipate);
        self.seen.retain(|_, t| *t >= horizon);
        let active: Vec<GuestId> = self.seen.keys().copied().collect();
        for g in &active {
            self.account(*g);
        }
        let mut eligible = Vec::with_capacity(ready.len());
        let mut wake = Nanos::MAX;
        for g in ready {
            let not_before = self.accounts.get(g).map_or(0, |a| a.not_before);
            if now < not_before {
                wake = wake.min(not_before);
                continue;
            }
            let over = self.over_share(*g, &active);
            let a = self.account(*g);
            if over {
                a.not_before = now + a.delay;
                wake = wake.min(a.not_before);
            } else {
                eligible.push(*g);
            }
        }
        match self.turn.pick(&eligible, busy, now) {
            Pick::Serve(g) => Pick::Serve(g),
            _ if wake != Nanos::MAX => Pick::Until(wake),
            other => other,
        }
    }

    fn dispatched(&mut self, _guest: GuestId, _now: Nanos) {}

    fn completed(&mut self, guest: GuestId, device_ns: Nanos, now: Nanos) {
        self.roll(now);
        self.seen.insert(guest, now);
        let a = self.account(guest);
        a.used = a.used.saturating_add(device_ns);
    }
}
