//! Pausing a channel's thread between requests (a migration's quiesce, a snapshot) and
//! stopping it (its guest moved away, or went); and, when it pauses, the answers it posted
//! that its guest may not have read yet, kept for the hand-over ([`super::handover`]).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use virtsoc_services::chan::{Closer, Entry, HostEnd};
use virtsoc_services::hypervisor::handover::KeptAnswer;
use virtsoc_services::payload::Input;
use virtsoc_sync::{CondvarExt, LockExt};

/// A channel thread's pause switch.
#[derive(Default)]
pub struct Control {
    st: Mutex<Pause>,
    cv: Condvar,
    /// Set while paused or stopped: the thread's wait for a request ends, and it takes none.
    interrupt: Arc<AtomicBool>,
}

#[derive(Default)]
struct Pause {
    paused: bool,
    /// The thread is between requests, holding.
    idle: bool,
    stop: bool,
    /// What the thread left unread when it paused.
    unread: Vec<KeptAnswer>,
}

impl Control {
    /// The flag the thread's [`HostEnd`] watches.
    pub fn interrupt(&self) -> Arc<AtomicBool> {
        self.interrupt.clone()
    }

    /// Pauses the thread once its request in progress is answered; `false` when that does
    /// not happen within `timeout` (the pause stays asked for; [`resume`](Self::resume)
    /// undoes it).
    pub fn pause(&self, closer: &Closer, timeout: Duration) -> bool {
        self.st.lock_or_recover().paused = true;
        self.interrupt.store(true, Ordering::Release);
        closer.wake_host();
        let deadline = Instant::now() + timeout;
        let mut p = self.st.lock_or_recover();
        while !p.idle && !p.stop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            p = self.cv.wait_timeout_or_recover(p, left).0;
        }
        true
    }

    /// The answers the paused thread's guest had not read when it paused.
    pub fn unread(&self) -> Vec<KeptAnswer> {
        self.st.lock_or_recover().unread.clone()
    }

    /// Lets a paused thread take requests again.
    pub fn resume(&self) {
        let mut p = self.st.lock_or_recover();
        p.paused = false;
        p.unread.clear();
        self.interrupt.store(false, Ordering::Release);
        drop(p);
        self.cv.notify_all();
    }

    /// Ends the thread at its next pass (paused or not).
    pub fn stop(&self) {
        self.st.lock_or_recover().stop = true;
        self.interrupt.store(true, Ordering::Release);
        self.cv.notify_all();
    }

    /// Between two requests: holds while paused (keeping what `unread` says the guest has
    /// not read); `false` once stopped.
    pub fn hold(&self, unread: impl FnOnce() -> Vec<KeptAnswer>) -> bool {
        let mut p = self.st.lock_or_recover();
        if p.paused && !p.stop && !p.idle {
            p.unread = unread();
            p.idle = true;
            self.cv.notify_all();
        }
        while p.paused && !p.stop {
            p = self.cv.wait_or_recover(p);
        }
        p.idle = false;
        !p.stop
    }
}

/// The responses of `log` (the last ones `end` posted, oldest first) that its guest has not
/// read, with their slots' bytes.
pub fn unread(end: &HostEnd, log: &VecDeque<Entry>) -> Vec<KeptAnswer> {
    let n = (end.unread() as usize).min(log.len());
    log.iter()
        .skip(log.len() - n)
        .map(|e| {
            let bytes = end
                .slot(e.slot)
                .and_then(|s| s.prefix((e.len as usize).min(s.len())))
                .and_then(|b| b.to_vec())
                .unwrap_or_default();
            KeptAnswer::new(e, &bytes)
        })
        .collect()
}
