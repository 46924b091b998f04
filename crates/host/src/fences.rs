//! The guest's virtual fence page: where the host mirrors fence status into the guest's window
//! so the guest reads it without a round trip. The host only writes here; its authoritative
//! fence state lives in the session's `VirtualFenceTable`.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use virtsoc_fence::page::{slot_offset, FencePageSink};
use virtsoc_proto::layout::FENCE_PAGE_OFFSET;
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
        self.store(slot_offset(index) as u64, word);
    }

    fn store_header(&self, header: u32) {
        self.store(0, header);
    }
}
