//! The guest's virtual fence page: where the host mirrors fence status into the guest's window
//! so the guest reads it without a round trip. The host only writes here; its authoritative
//! fence state lives in the session's `VirtualFenceTable`.
//!
//! A guest thread may also sleep until a fence is signaled (`Connection::fence_wait_cpu`, a
//! HAL's `sync_wait`): it counts itself in the control page's `FENCE_WAITERS` word and
//! futex-waits on the fence's slot word; the host, after writing a slot, wakes that word's
//! waiters while the count is non-zero. The count is guest memory: the host only reads it to
//! skip the futex call when nobody waits.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use virtsoc_fence::page::{slot_offset, FencePageSink};
use virtsoc_proto::window_layout::{ctl, CONTROL_OFFSET, FENCE_PAGE_OFFSET};
use virtsoc_proto::SharedWindow;

/// Mirrors fence words into the fence page of a window.
pub struct WindowFencePage {
    window: Arc<SharedWindow>,
}

impl WindowFencePage {
    /// A sink over `window`'s fence page.
    pub fn new(window: Arc<SharedWindow>) -> Self {
        WindowFencePage { window }
    }

    fn store(&self, offset: u64, word: u32) {
        if let Ok(w) = self.window.atomic_u32(FENCE_PAGE_OFFSET + offset) {
            w.store(word, Ordering::Release);
        }
    }
}

impl FencePageSink for WindowFencePage {
    fn store_slot(&self, index: u32, word: u32) {
        let Ok(slot) = self
            .window
            .atomic_u32(FENCE_PAGE_OFFSET + slot_offset(index) as u64)
        else {
            return;
        };
        // SeqCst store, then SeqCst load of the waiter count (the guest does the mirror
        // image: count itself, then load the slot): either the guest sees the new word, or
        // the host sees the waiter and wakes it.
        slot.store(word, Ordering::SeqCst);
        let waiting = self
            .window
            .atomic_u32(CONTROL_OFFSET + ctl::FENCE_WAITERS)
            .is_ok_and(|w| w.load(Ordering::SeqCst) != 0);
        if waiting {
            let _ =
                rustix::thread::futex::wake(slot, rustix::thread::futex::Flags::empty(), u32::MAX);
        }
    }

    fn store_header(&self, header: u32) {
        self.store(0, header);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::io::Errno;
    use std::sync::atomic::AtomicBool;
    use virtsoc_fence::page::pack_word;

    /// A guest thread asleep on a slot (counted in `FENCE_WAITERS`) is woken by the host's
    /// store, not by its own timeout.
    #[test]
    fn storing_a_slot_wakes_a_counted_waiter() {
        let window = crate::testkit::window();
        let page = WindowFencePage::new(window.clone());
        let slot = FENCE_PAGE_OFFSET + slot_offset(3) as u64;
        let pending = pack_word(1, false);
        page.store_slot(3, pending);
        let waiters = window
            .atomic_u32(CONTROL_OFFSET + ctl::FENCE_WAITERS)
            .unwrap();
        waiters.fetch_add(1, Ordering::SeqCst);
        let asleep = AtomicBool::new(false);
        let woke = std::thread::scope(|s| {
            let waiter = s.spawn(|| {
                let word = window.atomic_u32(slot).unwrap();
                asleep.store(true, Ordering::SeqCst);
                let ts = rustix::thread::futex::Timespec {
                    tv_sec: 20,
                    tv_nsec: 0,
                };
                rustix::thread::futex::wait(
                    word,
                    rustix::thread::futex::Flags::empty(),
                    pending,
                    Some(&ts),
                )
            });
            while !asleep.load(Ordering::SeqCst) {
                std::thread::yield_now();
            }
            for _ in 0..1000 {
                std::thread::yield_now();
            }
            page.store_slot(3, pack_word(1, true));
            waiter.join().unwrap()
        });
        // Woken (Ok), or the word had already changed when it went to sleep (AGAIN): never
        // left asleep until its timeout.
        assert!(
            matches!(woke, Ok(()) | Err(Errno::AGAIN)),
            "the waiter was not woken: {woke:?}"
        );
        assert_eq!(
            window.atomic_u32(slot).unwrap().load(Ordering::SeqCst),
            pack_word(1, true)
        );
    }
}
