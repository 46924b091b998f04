//! An event counter: the wake-up primitive device workers and VM doorbells sleep on.

use std::time::{Duration, Instant};

use crate::{Condvar, Mutex};

/// An event counter: every event bumps it, and a waiter that saw value `v` sleeps only until
/// it moves past `v`, so no wake-up is lost between checking for work and going to sleep.
#[derive(Debug, Default)]
pub struct EventCount {
    seq: Mutex<u64>,
    cv: Condvar,
}

impl EventCount {
    /// The current value.
    pub fn current(&self) -> u64 {
        *self.seq.lock()
    }

    /// Records an event and wakes every waiter.
    pub fn notify(&self) {
        *self.seq.lock() += 1;
        self.cv.notify_all();
    }

    /// Sleeps until the value differs from `seen`.
    pub fn wait_past(&self, seen: u64) {
        let s = self.seq.lock();
        drop(self.cv.wait_while(s, |s| *s == seen));
    }

    /// Like [`wait_past`](Self::wait_past) with a time limit; `false` on time-out.
    pub fn wait_past_for(&self, seen: u64, limit: Option<Duration>) -> bool {
        let Some(limit) = limit else {
            self.wait_past(seen);
            return true;
        };
        let deadline = Instant::now() + limit;
        let mut s = self.seq.lock();
        while *s == seen {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            s = self.cv.wait_timeout(s, left).0;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_lost_wakeups_and_timeouts() {
        let e = EventCount::default();
        let seen = e.current();
        e.notify();
        e.wait_past(seen); // returns at once: the event happened after `seen`
        assert!(!e.wait_past_for(e.current(), Some(Duration::from_millis(1))));
        assert!(e.wait_past_for(seen, Some(Duration::from_millis(1))));
    }
}
