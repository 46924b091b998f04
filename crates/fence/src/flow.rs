//! MIMD flow control between guest submission and host execution
//! (vSoC §3.4, borrowed from Trinity).
//!
//! Virtual fences let guest drivers submit without waiting for the host, so
//! a fast guest could pile commands up in host queues. This module owns
//! [`MimdPacer`], a multiplicative-increase / multiplicative-decrease window
//! on the number of commands a guest may have in flight.
//!
//! Usage by the guest library: every completion (or fence status reply)
//! from the host carries the depth of the host queue the command went
//! through ([`crate::OrderedQueue::len`]). The guest feeds it to
//! [`MimdPacer::on_feedback`], and before submitting a command it checks
//! [`MimdPacer::can_submit`] with its current in-flight count, blocking
//! (e.g. on the next completion, or a fence wait) while the window is full.
//! The pacer is pure arithmetic: no threads, no clocks.

use crate::error::{FenceError, Result};

/// MIMD in-flight window.
#[derive(Debug, Clone, PartialEq)]
pub struct MimdPacer {
    window: f64,
    min: f64,
    max: f64,
    increase: f64,
    decrease: f64,
    target_depth: u32,
}

impl MimdPacer {
    /// Default multiplicative increase factor.
    pub const DEFAULT_INCREASE: f64 = 1.25;
    /// Default multiplicative decrease factor.
    pub const DEFAULT_DECREASE: f64 = 0.5;

    /// A pacer with the default factors, the window starting at `min`.
    /// Requires `1 <= min <= max`.
    pub fn new(min: u32, max: u32, target_depth: u32) -> Result<Self> {
        Self::with_factors(
            min,
            max,
            target_depth,
            Self::DEFAULT_INCREASE,
            Self::DEFAULT_DECREASE,
        )
    }

    /// A pacer with explicit factors: `increase > 1`, `0 < decrease < 1`.
    pub fn with_factors(
        min: u32,
        max: u32,
        target_depth: u32,
        increase: f64,
        decrease: f64,
    ) -> Result<Self> {
        if min == 0 {
            return Err(FenceError::InvalidPacerConfig("min must be at least 1"));
        }
        if min > max {
            return Err(FenceError::InvalidPacerConfig("min must not exceed max"));
        }
        if !(increase.is_finite() && increase > 1.0) {
            return Err(FenceError::InvalidPacerConfig("increase must be > 1"));
        }
        if !(decrease > 0.0 && decrease < 1.0) {
            return Err(FenceError::InvalidPacerConfig("decrease must be in (0, 1)"));
        }
        Ok(Self {
            window: f64::from(min),
            min: f64::from(min),
            max: f64::from(max),
            increase,
            decrease,
            target_depth,
        })
    }

    /// How many commands may be in flight now (`floor(window)`, within
    /// `[min, max]`).
    pub fn allowed_in_flight(&self) -> u32 {
        // window is kept in [min, max], both u32 values.
        self.window.floor() as u32
    }

    /// Whether one more command may be submitted with `in_flight` already
    /// submitted and not completed.
    pub fn can_submit(&self, in_flight: u32) -> bool {
        in_flight < self.allowed_in_flight()
    }

    /// Feeds back the host queue depth: above the target the window shrinks
    /// by `decrease`, at or below it grows by `increase`; clamped to
    /// `[min, max]`.
    pub fn on_feedback(&mut self, queue_depth: u32) {
        let factor = if queue_depth > self.target_depth {
            self.decrease
        } else {
            self.increase
        };
        self.window = (self.window * factor).clamp(self.min, self.max);
    }

    /// The current (fractional) window.
    pub fn window(&self) -> f64 {
        self.window
    }

    /// The queue depth the pacer steers towards.
    pub fn target_depth(&self) -> u32 {
        self.target_depth
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_bad_configs() {
        assert!(MimdPacer::new(0, 10, 4).is_err());
        assert!(MimdPacer::new(5, 4, 4).is_err());
        assert!(MimdPacer::with_factors(1, 4, 4, 1.0, 0.5).is_err());
        assert!(MimdPacer::with_factors(1, 4, 4, 1.5, 1.0).is_err());
        assert!(MimdPacer::with_factors(1, 4, 4, f64::NAN, 0.5).is_err());
        assert!(MimdPacer::with_factors(1, 4, 4, 1.5, f64::NAN).is_err());
        assert!(MimdPacer::new(1, 1, 0).is_ok());
    }

    #[test]
    fn multiplicative_increase_and_decrease_with_clamping() {
        let mut p = MimdPacer::new(2, 100, 8).unwrap();
        assert_eq!(p.allowed_in_flight(), 2);
        p.on_feedback(8); // at target: grow
        assert_eq!(p.window(), 2.5);
        p.on_feedback(0);
        assert_eq!(p.window(), 3.125);
        assert_eq!(p.allowed_in_flight(), 3);
        for _ in 0..100 {
            p.on_feedback(0);
        }
        assert_eq!(p.allowed_in_flight(), 100, "clamped to max");
        p.on_feedback(9); // above target: halve
        assert_eq!(p.window(), 50.0);
        p.on_feedback(9);
        assert_eq!(p.window(), 25.0);
        for _ in 0..100 {
            p.on_feedback(1000);
        }
        assert_eq!(p.allowed_in_flight(), 2, "clamped to min");
        assert!(p.can_submit(1) && !p.can_submit(2));
    }

    /// Host drains `k` items per tick; the guest always fills the window.
    /// Returns (max depth after warm-up, items the host executed).
    fn simulate(pacer: Option<MimdPacer>, k: u32, ticks: u32) -> (u32, u64) {
        let mut pacer = pacer;
        let mut depth: u32 = 0;
        let mut executed = 0u64;
        let mut max_depth = 0;
        for tick in 0..ticks {
            let allowed = pacer
                .as_ref()
                .map_or(u32::MAX / 2, |p| p.allowed_in_flight());
            // Every queued command is in flight from the guest's view.
            depth = depth.max(allowed.min(depth.saturating_add(4 * k)));
            let drained = depth.min(k);
            depth -= drained;
            executed += u64::from(drained);
            if let Some(p) = pacer.as_mut() {
                p.on_feedback(depth);
            }
            if tick > 100 {
                max_depth = max_depth.max(depth);
            }
        }
        (max_depth, executed)
    }

    #[test]
    fn paced_guest_keeps_host_queue_bounded() {
        let (k, target, ticks) = (4, 8, 10_000);
        let pacer = MimdPacer::new(1, 1_000_000, target).unwrap();
        let (max_depth, executed) = simulate(Some(pacer), k, ticks);
        // Depth stays within a small multiple of target + per-tick drain.
        assert!(max_depth <= 4 * (target + k), "max depth {max_depth}");
        // And the host is kept mostly busy.
        assert!(
            executed >= u64::from(ticks * k) * 3 / 4,
            "executed {executed}"
        );
        // Without pacing the same guest piles commands up without bound.
        let (unpaced, _) = simulate(None, k, ticks);
        assert!(unpaced > 100 * (target + k), "unpaced depth {unpaced}");
    }
}
