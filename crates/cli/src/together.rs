//! Channels measured at once: [`Together`] makes their round trips at one time, then starts
//! their timed transfers at one instant and
//! takes their aggregate rate over the span all of them ran (bytes moved by every channel
//! over the time from that start to the last one's end). Summing each channel's own rate
//! instead counts a channel's fast transfers while the others were descheduled as if they
//! had overlapped, which on a machine with fewer cores than channels they did not.

use std::sync::{Condvar, Mutex};
use std::time::Instant;

use virtsoc_sync::{CondvarExt, LockExt};

/// Where the channels meet: each waits at a barrier until every channel still running
/// arrives. Before the round trips (so a row's round trips are measured with every channel
/// making them at once, not next to another channel's bulk transfers), after them (no
/// channel's transfers begin while another still measures its round trips), and at the
/// start of the timed transfers, which starts the clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Phase {
    RoundTrips = 0,
    Transfers = 1,
    Timed = 2,
}

const PHASES: usize = 3;

/// The shared barriers, and the start and end of the channels' timed transfers.
pub struct Together {
    state: Mutex<State>,
    cv: Condvar,
}

#[derive(Default)]
struct State {
    /// Channels still expected at the barriers ahead (those that gave up are not).
    expected: usize,
    arrived: [usize; PHASES],
    /// When each barrier opened ([`Phase::Timed`]'s is the timed transfers' start).
    opened: [Option<Instant>; PHASES],
    end: Option<Instant>,
}

impl Together {
    /// `channels` channels, each of which takes a [`Turn`].
    pub fn new(channels: usize) -> Together {
        Together {
            state: Mutex::new(State {
                expected: channels,
                ..State::default()
            }),
            cv: Condvar::new(),
        }
    }

    /// One channel's part: dropped before it passed every barrier (its channel failed),
    /// the others stop waiting for it.
    pub fn turn(&self) -> Turn<'_> {
        Turn {
            of: self,
            passed: 0,
        }
    }

    /// Seconds from the common start to the last end (None before any channel ended).
    pub fn span_secs(&self) -> Option<f64> {
        let s = self.state.lock_or_recover();
        Some((s.end? - s.opened[Phase::Timed as usize]?).as_secs_f64())
    }

    /// Opens every barrier not yet open that every expected channel reached.
    fn release_ready(&self, s: &mut State) {
        let now = Instant::now();
        for p in 0..PHASES {
            if s.opened[p].is_none() && s.arrived[p] >= s.expected {
                s.opened[p] = Some(now);
                self.cv.notify_all();
            }
        }
    }
}

/// A channel's part in a [`Together`].
pub struct Turn<'a> {
    of: &'a Together,
    /// Barriers passed (phases in order).
    passed: usize,
}

impl Turn<'_> {
    /// Waits at the barrier of `phase` (and of any phase before it this channel skipped)
    /// until every channel still running arrived; passing one again does nothing.
    pub fn reach(&mut self, phase: Phase) {
        let upto = phase as usize + 1;
        let mut s = self.of.state.lock_or_recover();
        while self.passed < upto {
            let p = self.passed;
            s.arrived[p] += 1;
            self.of.release_ready(&mut s);
            while s.opened[p].is_none() {
                s = self.of.cv.wait_or_recover(s);
            }
            self.passed += 1;
        }
    }

    /// Waits until every channel is ready for its timed transfers ([`Phase::Timed`]).
    pub fn start(&mut self) {
        self.reach(Phase::Timed);
    }

    /// Notes that this channel's timed transfers are done.
    pub fn end(&self) {
        let now = Instant::now();
        let mut s = self.of.state.lock_or_recover();
        s.end = Some(s.end.map_or(now, |e| e.max(now)));
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        if self.passed < PHASES {
            let mut s = self.of.state.lock_or_recover();
            s.expected = s.expected.saturating_sub(1);
            self.of.release_ready(&mut s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_starts_when_the_last_channel_arrives_and_a_failed_one_is_not_awaited() {
        let t = Together::new(3);
        let mut a = t.turn();
        let b = t.turn();
        let mut c = t.turn();
        std::thread::scope(|s| {
            let h = s.spawn(move || {
                a.start();
                a.end();
            });
            // b fails before its start: without the drop the others would wait forever.
            drop(b);
            c.start();
            c.end();
            h.join().expect("channel a");
        });
        assert!(t.span_secs().is_some_and(|x| x >= 0.0));
    }

    #[test]
    fn no_span_until_a_channel_ended() {
        let t = Together::new(1);
        let mut a = t.turn();
        a.start();
        assert!(t.span_secs().is_none());
        a.end();
        assert!(t.span_secs().is_some());
    }

    #[test]
    fn no_channel_transfers_before_every_round_trip_is_done() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let t = Together::new(3);
        let rtts_done = AtomicUsize::new(0);
        let seen = std::sync::Mutex::new(Vec::new());
        std::thread::scope(|s| {
            for k in 0..3u64 {
                let (t, rtts_done, seen) = (&t, &rtts_done, &seen);
                s.spawn(move || {
                    let mut turn = t.turn();
                    turn.reach(Phase::RoundTrips);
                    // The round trips of channel k take k * 20 ms.
                    std::thread::sleep(std::time::Duration::from_millis(20 * k));
                    rtts_done.fetch_add(1, Ordering::SeqCst);
                    turn.reach(Phase::Transfers);
                    seen.lock().unwrap().push(rtts_done.load(Ordering::SeqCst));
                    turn.start();
                    turn.end();
                });
            }
        });
        assert_eq!(
            *seen.lock().unwrap(),
            vec![3, 3, 3],
            "every channel waited for the others"
        );
        assert!(t.span_secs().is_some());
    }

    #[test]
    fn a_channel_that_fails_between_barriers_is_not_awaited() {
        let t = Together::new(2);
        let mut a = t.turn();
        let mut b = t.turn();
        std::thread::scope(|s| {
            let h = s.spawn(move || {
                a.reach(Phase::RoundTrips);
                a.start();
                a.end();
            });
            b.reach(Phase::RoundTrips);
            // b fails during its round trips.
            drop(b);
            h.join().expect("channel a");
        });
        assert!(t.span_secs().is_some());
    }
}
