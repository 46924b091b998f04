//! What the fairness guests of `virtsoc bench sharing` (GPU and codec) share: the loop that
//! keeps a guest's work queued on the daemon, the accesses a backlogged guest holds for its
//! whole run, and the check of each answer.
//!
//! WFQ's fairness is defined over backlogged flows, and the overhead against one guest
//! alone assumes the guest alone keeps the device busy. A closed loop (one command, wait for
//! its answer, the next) leaves the device idle for every round trip, and a scheduler that
//! keeps a guest's turn through those gaps (WFQ's anticipation) idles it further: with
//! closed-loop codec guests, one alone kept the codec busy 55-65% of the time and WFQ's two
//! guests together 53% (docs/results.md, stop 23).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Instant;

use virtsoc_guest::{AccessMode, Connection, DeviceId, Opcode, RegionId};

use crate::scenario::pipe::{access_args, check_async_errors, check_completion};
use crate::CliError;

/// Where a guest's loop is told to pause and stop, and counts its work.
#[derive(Clone, Copy)]
pub(super) struct Control<'a> {
    /// While closed, the guest lets its queue drain and waits.
    pub gate: Option<&'a Gate>,
    pub stop: &'a AtomicBool,
    /// Units of work answered.
    pub done: &'a AtomicU64,
    /// While true, the guest keeps [`DEEP`] times its depth queued: one guest alone, the
    /// rate the overhead is measured against, then keeps the device busy even when its
    /// thread is late to queue the next unit (with its usual depth one guest alone kept the
    /// GPU busy 94-96% of the time where guests together kept it 100% busy, so the guests
    /// together looked faster than one alone: a negative overhead).
    pub deep: Option<&'a AtomicBool>,
    /// When each unit counted in `done` was answered (where the fairness windows want
    /// them: `grade::work_in`).
    pub times: Option<&'a Mutex<Vec<Instant>>>,
}

impl Control<'_> {
    /// One more unit answered.
    fn count(&self) {
        self.done.fetch_add(1, Ordering::Relaxed);
        if let Some(t) = self.times {
            t.lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(Instant::now());
        }
    }
}

/// A guest's switch: while it is closed the guest drains its queue and sleeps until it
/// opens. (Until stop 54 a switched-off guest looked at an atomic flag every millisecond:
/// seven guests off while one ran alone woke 7000 times a second on the cores the device
/// shares, a cost the alone rates paid and the guests together did not.)
pub(super) struct Gate {
    open: Mutex<bool>,
    changed: Condvar,
}

impl Gate {
    /// A gate, closed.
    pub(super) fn closed() -> Self {
        Gate {
            open: Mutex::new(false),
            changed: Condvar::new(),
        }
    }

    /// Opens or closes it, waking a guest waiting on it.
    pub(super) fn set(&self, open: bool) {
        *self.open.lock().unwrap_or_else(|e| e.into_inner()) = open;
        self.changed.notify_all();
    }

    fn is_open(&self) -> bool {
        *self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Returns once it is open.
    fn wait_open(&self) {
        let open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        drop(self.changed.wait_while(open, |o| !*o));
    }
}

/// How many times its depth a guest keeps queued while [`Control::deep`] is set.
pub(super) const DEEP: usize = 2;

/// Runs until `stop`: keeps `depth` units of work queued, unit `k` queued by `submit(k)`
/// (from `first` on) and waited for by `answered` in the order queued, each answered counted
/// in `done`. While `gate` is closed it lets its queue drain and waits for it to open.
pub(super) fn run<T>(
    ctl: Control<'_>,
    depth: usize,
    first: u64,
    mut submit: impl FnMut(u64) -> Result<T, CliError>,
    mut answered: impl FnMut(T) -> Result<(), CliError>,
) -> Result<(), CliError> {
    let mut queued = VecDeque::with_capacity(depth);
    let mut k = first;
    while !ctl.stop.load(Ordering::Relaxed) {
        if let Some(g) = ctl.gate.filter(|g| !g.is_open()) {
            while let Some(t) = queued.pop_front() {
                answered(t)?;
                ctl.count();
            }
            g.wait_open();
            continue;
        }
        let want = if ctl.deep.is_some_and(|d| d.load(Ordering::Relaxed)) {
            DEEP * depth.max(1)
        } else {
            depth.max(1)
        };
        while queued.len() < want {
            queued.push_back(submit(k)?);
            k += 1;
        }
        if let Some(t) = queued.pop_front() {
            answered(t)?;
            ctl.count();
        }
    }
    for t in queued {
        answered(t)?;
    }
    Ok(())
}

/// Queues `op` (begin_access or end_access) of device `dev` on each of `regions`, whole,
/// without waiting for the answers (a failure shows in [`answered`]).
pub(super) fn access(
    conn: &Connection,
    dev: DeviceId,
    op: Opcode,
    regions: &[(RegionId, AccessMode)],
) -> Result<(), CliError> {
    for (id, mode) in regions {
        conn.submit_detached(op, dev, access_args(conn, *id, *mode)?)?;
    }
    Ok(())
}

/// Waits for request `seq` (`what` names it in an error): an error if it or an earlier
/// request queued without waiting failed.
pub(super) fn answered(conn: &Connection, seq: u64, what: &str) -> Result<(), CliError> {
    check_completion(&conn.wait(seq)?, what)?;
    check_async_errors(conn)
}

/// Ends the accesses a backlogged guest held for its run, and checks they ended.
pub(super) fn release(
    conn: &Connection,
    dev: DeviceId,
    regions: &[(RegionId, AccessMode)],
) -> Result<(), CliError> {
    access(conn, dev, Opcode::EndAccess, regions)?;
    conn.drain()?;
    check_async_errors(conn)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_guest_waiting_at_a_closed_gate_goes_on_once_it_opens() {
        let gate = Gate::closed();
        assert!(!gate.is_open());
        let passed = AtomicBool::new(false);
        std::thread::scope(|s| {
            let waiter = s.spawn(|| {
                gate.wait_open();
                passed.store(true, Ordering::SeqCst);
            });
            // Closed, it holds the waiter (however long this thread takes to get here).
            assert!(!passed.load(Ordering::SeqCst));
            gate.set(true);
            waiter.join().unwrap();
        });
        assert!(passed.load(Ordering::SeqCst));
        // Open, it does not wait.
        gate.wait_open();
        gate.set(false);
        assert!(!gate.is_open());
    }
}
