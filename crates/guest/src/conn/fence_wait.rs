//! Waiting on the CPU for a virtual command fence (a HAL's `sync_wait`): the guest thread
//! sleeps until a device signals the fence, without a round trip per check.
//!
//! A process guest sleeps on the fence's word in the shared fence page: it counts itself in
//! the control page's `FENCE_WAITERS` word, then futex-waits on the slot while the slot says
//! pending; the host, after writing a slot, wakes that slot's waiters while the count is
//! non-zero (`virtsoc_host::fences`). Both sides order their store before their load
//! (sequentially consistent), so a signal is never missed: either the guest sees the new word,
//! or the host sees the waiter. A short spin comes first, for fences about to fire.
//!
//! VM guests (the window is a PCI BAR: the host's futex does not reach the guest's kernel),
//! remote guests (no shared page) and fences beyond the page re-check at growing intervals
//! (50 us, doubling up to 1 ms) instead.

use std::time::Instant;

use virtsoc_proto::window_layout::{ctl, CONTROL_OFFSET};

use super::*;

/// Page reads before a process guest goes to sleep on the slot.
const SPINS: u32 = 200;
/// Longest single sleep, after which a sleeping waiter checks that the daemon still runs.
const LIVENESS: Duration = Duration::from_millis(100);
/// First and largest re-check interval of the polling path.
const POLL_FIRST: Duration = Duration::from_micros(50);
const POLL_MAX: Duration = Duration::from_millis(1);

impl Connection {
    /// Blocks until fence `f` is signaled or `timeout` has passed; returns whether it was
    /// signaled. See the module docs for how each kind of guest waits.
    pub fn fence_wait_cpu(&self, f: crate::Fence, timeout: Duration) -> Result<bool> {
        let deadline = Instant::now() + timeout;
        let link = self.link();
        if virtsoc_fence::is_page_backed(f) && link.shares_window() && link.host_futex() {
            return self.sleep_on_slot(f, deadline);
        }
        let mut pause = POLL_FIRST;
        loop {
            if self.fence_signaled(f)? {
                return Ok(true);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(false);
            }
            std::thread::sleep(pause.min(left));
            pause = (pause * 2).min(POLL_MAX);
        }
    }

    /// The process guest's wait: spin, then futex-wait on the slot word (module docs).
    fn sleep_on_slot(&self, id: FenceId, deadline: Instant) -> Result<bool> {
        let window = self.window();
        let slot = window.atomic_u32(FENCE_PAGE_OFFSET + slot_offset(id.index) as u64)?;
        let signaled = |w: u32| slot_status(w, id) == FenceStatus::Signaled;
        for _ in 0..SPINS {
            if signaled(slot.load(Ordering::Acquire)) {
                return Ok(true);
            }
            std::hint::spin_loop();
        }
        let waiters = window.atomic_u32(CONTROL_OFFSET + ctl::FENCE_WAITERS)?;
        let host_state = window.atomic_u32(CONTROL_OFFSET + ctl::HOST_STATE)?;
        waiters.fetch_add(1, Ordering::SeqCst);
        let outcome = loop {
            let word = slot.load(Ordering::SeqCst);
            if signaled(word) {
                break Ok(true);
            }
            if host_state.load(Ordering::SeqCst) != 0 {
                break Err(GuestError::Closed);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break Ok(false);
            }
            let nap = left.min(LIVENESS);
            let ts = rustix::thread::futex::Timespec {
                tv_sec: nap.as_secs() as i64,
                tv_nsec: nap.subsec_nanos() as i64,
            };
            // EAGAIN (the word changed), EINTR and ETIMEDOUT all lead back to the checks.
            let _ = rustix::thread::futex::wait(
                slot,
                rustix::thread::futex::Flags::empty(),
                word,
                Some(&ts),
            );
        };
        waiters.fetch_sub(1, Ordering::SeqCst);
        outcome
    }
}
