//! Adaptive spinning before a doorbell sleeps.
//!
//! A waiter spins on its ring before it sleeps on the doorbell, so that an answer arriving
//! within microseconds costs no futex wake-up and no trip through the scheduler. Spinning is
//! only worth it when the wait is that short: a guest waiting for a millisecond of GPU work,
//! or the daemon's connection thread waiting for such a guest's next request, burns its whole
//! spin on every wait. On a host whose GPU is a CPU driver (lavapipe) those spins take the
//! cores the device's work runs on: on this 2-core machine 4096 spins on each side made a
//! 960x540 composition 1.39 ms instead of 0.88 ms for one guest alone (docs/results.md,
//! stop 22).
//!
//! So each doorbell learns how long its waits are, the way adaptive mutexes do: a wait that
//! ended in a sleep longer than [`SHORT_SLEEP`] halves the spin (down to [`MIN_SPINS`]), one
//! that slept less than that (a longer spin would have caught it) doubles it (up to the
//! configured spins), and a spin that found the answer keeps it.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// The fewest spins a doorbell comes down to.
pub const MIN_SPINS: u32 = 16;
/// A sleep shorter than this would have been caught by spinning longer.
pub const SHORT_SLEEP: Duration = Duration::from_micros(50);

/// A spin count that follows the length of a doorbell's waits.
#[derive(Debug)]
pub struct AdaptiveSpin {
    max: u32,
    limit: AtomicU32,
}

impl AdaptiveSpin {
    /// Spins of at most `max` iterations (0: never spin), starting at `max`.
    pub fn new(max: u32) -> Self {
        AdaptiveSpin {
            max,
            limit: AtomicU32::new(max),
        }
    }

    /// The current spin count.
    pub fn limit(&self) -> u32 {
        self.limit.load(Ordering::Relaxed)
    }

    /// Spins up to the current count until `ready()`: whether it became ready.
    pub fn spin(&self, ready: &mut dyn FnMut() -> bool) -> bool {
        for _ in 0..self.limit() {
            if ready() {
                return true;
            }
            std::hint::spin_loop();
        }
        false
    }

    /// A doorbell's wait: spins until `ready()`, else runs `sleep` (which sleeps until
    /// `ready()` or its timeout: whether it became ready) and learns from how long it slept.
    pub fn wait(
        &self,
        ready: &mut dyn FnMut() -> bool,
        sleep: impl FnOnce(&mut dyn FnMut() -> bool) -> bool,
    ) -> bool {
        if self.spin(ready) {
            return true;
        }
        let since = std::time::Instant::now();
        let woke = sleep(ready);
        self.slept(since.elapsed());
        woke
    }

    /// After a spin that did not find the answer: the sleep that followed lasted `slept`.
    pub fn slept(&self, slept: Duration) {
        let cur = self.limit();
        let next = if slept < SHORT_SLEEP {
            cur.saturating_mul(2).max(MIN_SPINS).min(self.max)
        } else {
            (cur / 2).max(MIN_SPINS.min(self.max))
        };
        self.limit.store(next, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_waits_bring_the_spin_down_and_short_ones_back_up() {
        let s = AdaptiveSpin::new(4096);
        assert_eq!(s.limit(), 4096);
        for _ in 0..20 {
            s.slept(Duration::from_millis(1));
        }
        assert_eq!(s.limit(), MIN_SPINS);
        for _ in 0..20 {
            s.slept(Duration::from_micros(5));
        }
        assert_eq!(s.limit(), 4096);
    }

    #[test]
    fn a_spin_that_finds_the_answer_keeps_the_count() {
        let s = AdaptiveSpin::new(64);
        s.slept(Duration::from_millis(1));
        assert_eq!(s.limit(), 32);
        let mut n = 0;
        assert!(s.spin(&mut || {
            n += 1;
            n == 10
        }));
        assert_eq!(s.limit(), 32);
        // Not ready within the count: gives up after exactly that many checks.
        let mut checks = 0;
        assert!(!s.spin(&mut || {
            checks += 1;
            false
        }));
        assert_eq!(checks, 32);
    }

    #[test]
    fn no_spins_configured_stays_at_none() {
        let s = AdaptiveSpin::new(0);
        s.slept(Duration::from_micros(1));
        assert_eq!(s.limit(), 0);
        s.slept(Duration::from_secs(1));
        assert_eq!(s.limit(), 0);
        assert!(!s.spin(&mut || true));
    }

    #[test]
    fn a_wait_spins_first_and_learns_from_its_sleep() {
        let s = AdaptiveSpin::new(64);
        // Ready while spinning: no sleep.
        assert!(s.wait(&mut || true, |_| panic!("slept")));
        // Not ready: sleeps, and a long sleep halves the spin.
        let woke = s.wait(&mut || false, |_| {
            std::thread::sleep(Duration::from_millis(2));
            true
        });
        assert!(woke);
        assert_eq!(s.limit(), 32);
    }
}
