//! Adaptive spinning before a doorbell sleeps.
//!
//! A waiter spins on its ring before it sleeps on the doorbell, so that an answer arriving
//! within microseconds costs no futex wake-up and no trip through the scheduler. Spinning is
//! only worth it when the wait is that short: a guest waiting for a millisecond of GPU work,
//! or the daemon's connection thread waiting for such a guest's next request, burns its whole
//! spin on every wait. On a host whose GPU is a CPU driver (lavapipe) those spins take the
//! cores the device's work runs on: on this 2-core machine 4096 spins on each side made a
//! 640x360 composition 1.39 ms instead of 0.88 ms for one guest alone (docs/results.md,
//! stop 22).
//!
//! So each doorbell learns how long its waits are, the way adaptive mutexes do. A wait the
//! full spin (`--spins` iterations, timed as it goes) could have caught, answered within the
//! time that spin takes, doubles the spin (up to the full count). [`LONG_RUN`] waits in a
//! row longer than a full spin, which spinning could never have caught, halve it (down to
//! [`MIN_SPINS`]); a wait the spin caught, or a shorter one, ends the run. So a guest that
//! waits long between bursts of short waits (a frame's accesses, then the next frame) keeps
//! its full spin for the bursts, and only a doorbell whose waits are all longer than the
//! whole spin (GPU work) stops spinning. A first cut halved the spin after any sleep over
//! 50 us: a guest's requests 100-200 us apart then met a sleeping connection thread, and a
//! victim's access p50 next to a flooding guest went from 75-88% to 110-137% of alone in
//! `bench isolation` (docs/results.md, stop 22).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The fewest spins a doorbell comes down to.
pub const MIN_SPINS: u32 = 16;
/// What one spin iteration is taken to cost until one is timed, in picoseconds.
const SPIN_PS: u64 = 50_000;
/// Spin iterations between two yields of the core (`sched_yield`) of a [`yielding`]
/// spin: with more spinning threads than cores (a guest's several service channels on 2
/// cores, each a guest thread and a daemon thread), a spinner that never yields holds the
/// core its peer needs to answer until the scheduler takes it away. On this machine, 4
/// channels streamed 5.2 GB/s together and made round trips of 237 us p50; yielding every
/// 64 iterations, 9.8 GB/s and 1.6 us. Device rings do not yield that way: a victim guest's
/// access next to a GPU hog (`bench isolation`, composite-3x4096) went from 95% to 142-166%
/// of its time alone, its spin giving the core to the hog's rasterizer threads. They yield
/// only while the peer has not taken what they gave it ([`spin_behind`]).
///
/// [`yielding`]: AdaptiveSpin::yielding
/// [`spin_behind`]: AdaptiveSpin::spin_behind
pub const YIELD_EVERY: u32 = 64;
/// Waits in a row longer than a full spin that halve the spin.
pub const LONG_RUN: u32 = 4;

/// A spin count that follows the length of a doorbell's waits.
#[derive(Debug)]
pub struct AdaptiveSpin {
    max: u32,
    limit: AtomicU32,
    /// The last timed cost of one spin iteration, in picoseconds.
    spin_ps: AtomicU64,
    /// Waits in a row longer than a full spin.
    long_run: AtomicU32,
    /// Iterations between two yields of the core (0: never yields).
    yield_every: u32,
}

impl AdaptiveSpin {
    /// Spins of at most `max` iterations (0: never spin), starting at `max`.
    pub fn new(max: u32) -> Self {
        AdaptiveSpin {
            max,
            limit: AtomicU32::new(max),
            spin_ps: AtomicU64::new(SPIN_PS),
            long_run: AtomicU32::new(0),
            yield_every: 0,
        }
    }

    /// Like [`new`](Self::new), yielding the core every `every` iterations (0: never).
    pub fn yielding(max: u32, every: u32) -> Self {
        AdaptiveSpin {
            yield_every: every,
            ..Self::new(max)
        }
    }

    /// The most iterations a spin makes.
    pub fn max(&self) -> u32 {
        self.max
    }

    /// The current spin count.
    pub fn limit(&self) -> u32 {
        self.limit.load(Ordering::Relaxed)
    }

    /// How long a spin of the full count lasts, as last timed.
    pub fn full_spin(&self) -> Duration {
        let ps = self.spin_ps.load(Ordering::Relaxed) * u64::from(self.max);
        Duration::from_nanos(ps / 1000)
    }

    /// Spins up to the current count until `ready()`: whether it became ready.
    pub fn spin(&self, ready: &mut dyn FnMut() -> bool) -> bool {
        self.spin_behind(ready, &mut || false)
    }

    /// [`spin`](Self::spin), yielding the core at every [`YIELD_EVERY`]th iteration where
    /// `behind()` says that the peer, awake, has not yet taken what this side gave it (a
    /// request it has not popped, a completion it has not reaped). A running peer takes an
    /// entry within a microsecond or two, far fewer than [`YIELD_EVERY`] iterations; an
    /// awake one that has not is most likely waiting for a core, perhaps the one this spin
    /// holds: two ring guests making round trips at once on 2 cores (each a guest thread and
    /// a daemon thread, all four spinning) took 300 us p50 a round trip, the length of a
    /// full spin, instead of 1.5 us. A spin whose peer has taken everything (a guest waiting
    /// for the GPU's answer, a daemon thread waiting for a guest's next request) does not
    /// yield: giving its core away then only delays its own answer (see [`YIELD_EVERY`]).
    /// Nor should it for a sleeping peer, which the doorbell woke: yielding then handed the
    /// core to whatever else was runnable (`bench svm` beside nice-19 fuzzers lost 4-11%).
    pub fn spin_behind(
        &self,
        ready: &mut dyn FnMut() -> bool,
        behind: &mut dyn FnMut() -> bool,
    ) -> bool {
        for i in 1..=self.limit() {
            if ready() {
                return true;
            }
            let every = self.yield_every != 0 && i % self.yield_every == 0;
            if every || (i % YIELD_EVERY == 0 && behind()) {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        false
    }

    /// A doorbell's wait: spins until `ready()`, else runs `sleep` (which sleeps until
    /// `ready()` or its timeout: whether it became ready) and learns from how long the
    /// whole wait took.
    pub fn wait(
        &self,
        ready: &mut dyn FnMut() -> bool,
        sleep: impl FnOnce(&mut dyn FnMut() -> bool) -> bool,
    ) -> bool {
        self.wait_behind(ready, &mut || false, sleep)
    }

    /// [`wait`](Self::wait) with the spin of [`spin_behind`](Self::spin_behind).
    pub fn wait_behind(
        &self,
        ready: &mut dyn FnMut() -> bool,
        behind: &mut dyn FnMut() -> bool,
        sleep: impl FnOnce(&mut dyn FnMut() -> bool) -> bool,
    ) -> bool {
        let t0 = Instant::now();
        let spins = self.limit();
        if self.spin_behind(ready, behind) {
            self.long_run.store(0, Ordering::Relaxed);
            return true;
        }
        self.timed(t0.elapsed(), spins);
        let woke = sleep(ready);
        self.waited(t0.elapsed());
        woke
    }

    /// A spin of `spins` iterations that did not find the answer took `spun`.
    pub fn timed(&self, spun: Duration, spins: u32) {
        if spins >= MIN_SPINS {
            let ps = spun.as_nanos().saturating_mul(1000) / u128::from(spins);
            self.spin_ps
                .store(u64::try_from(ps).unwrap_or(u64::MAX), Ordering::Relaxed);
        }
    }

    /// A wait that the spin did not catch was answered `waited` after it began.
    pub fn waited(&self, waited: Duration) {
        let cur = self.limit();
        let next = if waited < self.full_spin() {
            self.long_run.store(0, Ordering::Relaxed);
            cur.saturating_mul(2).max(MIN_SPINS).min(self.max)
        } else if self.long_run.fetch_add(1, Ordering::Relaxed) + 1 >= LONG_RUN {
            self.long_run.store(0, Ordering::Relaxed);
            (cur / 2).max(MIN_SPINS.min(self.max))
        } else {
            cur
        };
        self.limit.store(next, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spin_asks_whether_the_peer_is_behind_every_yield_every_iterations() {
        let s = AdaptiveSpin::new(10 * YIELD_EVERY);
        let (mut looked, mut asked) = (0, 0);
        assert!(!s.spin_behind(
            &mut || {
                looked += 1;
                false
            },
            &mut || {
                asked += 1;
                true
            }
        ));
        assert_eq!((looked, asked), (10 * YIELD_EVERY, 10));
        // Ready before the first question: never asked.
        let mut asked = 0;
        assert!(s.spin_behind(&mut || true, &mut || {
            asked += 1;
            true
        }));
        assert_eq!(asked, 0);
    }

    #[test]
    fn a_yielding_spin_looks_as_often_and_stops_at_the_answer() {
        for s in [AdaptiveSpin::new(300), AdaptiveSpin::yielding(300, 7)] {
            let mut looked = 0;
            assert!(!s.spin(&mut || {
                looked += 1;
                false
            }));
            assert_eq!(looked, 300, "every iteration looks, yielding or not");
            let mut looked = 0;
            assert!(s.spin(&mut || {
                looked += 1;
                looked == 100
            }));
            assert_eq!(looked, 100);
        }
        assert_eq!(AdaptiveSpin::yielding(300, 7).yield_every, 7);
        assert_eq!(AdaptiveSpin::new(300).yield_every, 0);
    }

    #[test]
    fn waits_longer_than_a_full_spin_bring_it_down_and_shorter_ones_back_up() {
        let s = AdaptiveSpin::new(4096);
        // 50 ns an iteration: a full spin lasts about 205 us.
        s.timed(Duration::from_nanos(50 * 4096), 4096);
        assert_eq!(s.full_spin(), Duration::from_nanos(50 * 4096));
        assert_eq!(s.limit(), 4096);
        for _ in 0..20 * LONG_RUN {
            s.waited(Duration::from_millis(1));
        }
        assert_eq!(s.limit(), MIN_SPINS);
        // 150 us apart: longer than the old 50 us rule, within a full spin.
        for _ in 0..20 {
            s.waited(Duration::from_micros(150));
        }
        assert_eq!(s.limit(), 4096);
    }

    #[test]
    fn long_waits_between_bursts_of_short_ones_keep_the_spin() {
        let s = AdaptiveSpin::new(4096);
        s.timed(Duration::from_nanos(50 * 4096), 4096);
        for _ in 0..100 {
            // A frame: its accesses 150 us apart, then a long wait for the next frame.
            s.waited(Duration::from_micros(150));
            s.waited(Duration::from_micros(150));
            s.waited(Duration::from_millis(16));
            // The next frame's accesses find the full spin.
            assert_eq!(s.limit(), 4096);
        }
    }

    #[test]
    fn a_spin_that_finds_the_answer_keeps_the_count() {
        let s = AdaptiveSpin::new(64);
        for _ in 0..LONG_RUN {
            s.waited(Duration::from_secs(1));
        }
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
    fn a_short_spin_is_not_timed() {
        let s = AdaptiveSpin::new(4096);
        s.timed(Duration::from_secs(1), MIN_SPINS - 1);
        assert_eq!(s.full_spin(), Duration::from_nanos(SPIN_PS * 4096 / 1000));
    }

    #[test]
    fn no_spins_configured_stays_at_none() {
        let s = AdaptiveSpin::new(0);
        s.waited(Duration::ZERO);
        assert_eq!(s.limit(), 0);
        s.waited(Duration::from_secs(1));
        assert_eq!(s.limit(), 0);
        assert!(!s.spin(&mut || true));
    }

    #[test]
    fn a_wait_spins_first_and_learns_from_how_long_it_took() {
        let s = AdaptiveSpin::new(64);
        // Ready while spinning: no sleep.
        assert!(s.wait(&mut || true, |_| panic!("slept")));
        // Not ready: sleeps; waits far longer than a full spin, in a row, halve the count.
        for _ in 0..LONG_RUN {
            let woke = s.wait(&mut || false, |_| {
                std::thread::sleep(Duration::from_millis(5));
                true
            });
            assert!(woke);
        }
        assert_eq!(s.limit(), 32);
    }
}
