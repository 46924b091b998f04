//! Channels measured at once: [`Together`] starts their timed transfers at one instant and
//! takes their aggregate rate over the span all of them ran (bytes moved by every channel
//! over the time from that start to the last one's end). Summing each channel's own rate
//! instead counts a channel's fast transfers while the others were descheduled as if they
//! had overlapped, which on a machine with fewer cores than channels they did not.

use std::sync::{Condvar, Mutex};
use std::time::Instant;

use virtsoc_sync::{CondvarExt, LockExt};

/// The shared start and end of the channels' timed transfers.
pub struct Together {
    state: Mutex<State>,
    cv: Condvar,
}

#[derive(Default)]
struct State {
    /// Channels still expected at the start (those that gave up before it are not).
    expected: usize,
    arrived: usize,
    start: Option<Instant>,
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

    /// One channel's part: dropped before [`Turn::start`] (its channel failed), the others
    /// stop waiting for it.
    pub fn turn(&self) -> Turn<'_> {
        Turn {
            of: self,
            started: false,
        }
    }

    /// Seconds from the common start to the last end (None before any channel ended).
    pub fn span_secs(&self) -> Option<f64> {
        let s = self.state.lock_or_recover();
        Some((s.end? - s.start?).as_secs_f64())
    }

    /// Starts the clock once every expected channel arrived.
    fn release_if_all(&self, s: &mut State) {
        if s.start.is_none() && s.arrived >= s.expected {
            s.start = Some(Instant::now());
            self.cv.notify_all();
        }
    }
}

/// A channel's part in a [`Together`].
pub struct Turn<'a> {
    of: &'a Together,
    started: bool,
}

impl Turn<'_> {
    /// Waits until every channel is ready for its timed transfers.
    pub fn start(&mut self) {
        if self.started {
            return;
        }
        self.started = true;
        let mut s = self.of.state.lock_or_recover();
        s.arrived += 1;
        self.of.release_if_all(&mut s);
        while s.start.is_none() {
            s = self.of.cv.wait_or_recover(s);
        }
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
        if !self.started {
            let mut s = self.of.state.lock_or_recover();
            s.expected = s.expected.saturating_sub(1);
            self.of.release_if_all(&mut s);
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
}
