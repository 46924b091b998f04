//! The virtual fence page: one 4 KiB page of guest memory through which the
//! guest reads fence status without a round trip to the host (vSoC §4).
//!
//! This module owns the page *layout* and the two ends that touch it:
//!
//! * the host writes it through a [`FencePageSink`] (the host is the only
//!   writer; it never reads its own state back from the page, because the
//!   page is guest memory that the guest may scribble on: the authoritative
//!   state lives in [`crate::VirtualFenceTable`], the page is only a mirror);
//! * the guest reads it with [`read_slot`] / [`slot_status`].
//!
//! # Layout
//!
//! The page is `PAGE_SIZE / 4 = 1024` little-endian (native) `u32` words,
//! each accessed atomically:
//!
//! | word        | content                                              |
//! |-------------|------------------------------------------------------|
//! | 0           | header: [`PAGE_HEADER`] = `PAGE_MAGIC << 16 \| PAGE_SLOTS` |
//! | `1 + i`     | slot `i`, for slot index `i` in `0..PAGE_SLOTS`      |
//!
//! Slot indices are therefore **0-based, `0..PAGE_SLOTS` (0..1023)**, and
//! slot `i` lives at byte offset `4 * (i + 1)`. A [`crate::FenceId`] whose
//! `index >= PAGE_SLOTS` is an overflow fence that has no slot in the page.
//!
//! A slot word is `(generation << 1) | signaled`, with the generation kept to
//! 31 bits ([`GENERATION_MASK`]). Generation 0 means "never used"; the host
//! bumps the generation each time it hands the slot out for a new fence.
//! A slot is only ever reused after its previous fence was signaled, so a
//! reader that sees a generation different from its id's generation knows
//! its fence was signaled long ago (see [`slot_status`]).

use crate::table::{FenceId, FenceStatus};
use std::sync::atomic::{AtomicU32, Ordering};

/// Size of the shared fence page in bytes.
pub const PAGE_SIZE: usize = 4096;
/// Number of `u32` words in the page (header included).
pub const PAGE_WORDS: usize = PAGE_SIZE / 4;
/// Number of fence slots in the page (word 0 is the header).
pub const PAGE_SLOTS: u32 = (PAGE_WORDS - 1) as u32;
/// Magic number in the upper half of the header word ("vF").
pub const PAGE_MAGIC: u32 = 0x7646;
/// The header word (word 0): `PAGE_MAGIC << 16 | PAGE_SLOTS`.
pub const PAGE_HEADER: u32 = (PAGE_MAGIC << 16) | PAGE_SLOTS;
/// Generations are 31-bit values (the low bit of a slot word is the
/// signaled flag).
pub const GENERATION_MASK: u32 = (1 << 31) - 1;

/// Encodes a slot word from a generation and a signaled flag.
pub const fn pack_word(generation: u32, signaled: bool) -> u32 {
    ((generation & GENERATION_MASK) << 1) | signaled as u32
}

/// Decodes a slot word into `(generation, signaled)`.
pub const fn unpack_word(word: u32) -> (u32, bool) {
    (word >> 1, word & 1 == 1)
}

/// Byte offset of slot `index` in the page.
///
/// # Panics
/// If `index >= PAGE_SLOTS`.
pub const fn slot_offset(index: u32) -> usize {
    assert!(index < PAGE_SLOTS, "fence page slot index out of range");
    4 * (index as usize + 1)
}

/// Guest-side interpretation of a slot word for a fence id.
///
/// * same generation, signaled bit set: `Signaled`;
/// * same generation, bit clear: `Pending`;
/// * different generation: the slot was recycled for a newer fence, which
///   the host only does after this fence was signaled: `Signaled`.
///
/// Only meaningful for page-backed ids ([`crate::is_page_backed`]);
/// overflow fences need a round trip to the host.
pub fn slot_status(word: u32, id: FenceId) -> FenceStatus {
    let (generation, signaled) = unpack_word(word);
    if generation != id.generation & GENERATION_MASK || signaled {
        FenceStatus::Signaled
    } else {
        FenceStatus::Pending
    }
}

/// Atomically loads (acquire) slot `index` from a fence page mapped at
/// `page_base`. This is the guest library's fast status path.
///
/// # Safety
/// `page_base` must point to a live mapping of at least [`PAGE_SIZE`] bytes,
/// aligned to 4 bytes, which is only ever accessed atomically (the host
/// writes it with atomic stores).
///
/// # Panics
/// If `index >= PAGE_SLOTS`.
pub unsafe fn read_slot(page_base: *const u8, index: u32) -> u32 {
    let offset = slot_offset(index);
    // SAFETY: the caller guarantees the mapping covers PAGE_SIZE bytes and is
    // 4-aligned; `offset + 4 <= PAGE_SIZE` by `slot_offset`. We only load.
    let word = unsafe { AtomicU32::from_ptr(page_base.add(offset) as *mut u32) };
    word.load(Ordering::Acquire)
}

/// Where the host mirrors fence status. Implemented over whatever maps the
/// shared guest page (an MMIO/BAR region, a guest-memory mapping, ...).
///
/// Implementations must store atomically with at least release ordering so
/// that a guest reading the word with acquire ordering observes everything
/// the host did before signaling.
pub trait FencePageSink: Send + Sync {
    /// Stores `word` into slot `index` (`index < PAGE_SLOTS`, i.e. page word
    /// `index + 1`).
    fn store_slot(&self, index: u32, word: u32);

    /// Stores the header word (page word 0). The table calls this once when
    /// it is created, with [`PAGE_HEADER`]. The default does nothing, for
    /// sinks whose header is written by whoever sets the page up.
    fn store_header(&self, header: u32) {
        let _ = header;
    }
}

/// A fence page in ordinary memory: used by tests, by in-process guests and
/// as a reference implementation of [`FencePageSink`].
#[derive(Debug)]
pub struct MemPage {
    words: Box<[AtomicU32]>,
}

impl MemPage {
    /// A zeroed page with the header word set.
    pub fn new() -> Self {
        let words: Box<[AtomicU32]> = (0..PAGE_WORDS).map(|_| AtomicU32::new(0)).collect();
        words[0].store(PAGE_HEADER, Ordering::Release);
        Self { words }
    }

    /// Loads slot `index` (acquire).
    ///
    /// # Panics
    /// If `index >= PAGE_SLOTS`.
    pub fn load_slot(&self, index: u32) -> u32 {
        assert!(index < PAGE_SLOTS, "fence page slot index out of range");
        self.words[index as usize + 1].load(Ordering::Acquire)
    }

    /// Loads the header word.
    pub fn header(&self) -> u32 {
        self.words[0].load(Ordering::Acquire)
    }

    /// Guest-side status of `id` as read from this page, or `None` for an
    /// overflow id that has no slot.
    pub fn status(&self, id: FenceId) -> Option<FenceStatus> {
        crate::table::is_page_backed(id).then(|| slot_status(self.load_slot(id.index), id))
    }

    /// Base pointer of the page, for [`read_slot`].
    pub fn as_ptr(&self) -> *const u8 {
        self.words.as_ptr().cast()
    }
}

impl Default for MemPage {
    fn default() -> Self {
        Self::new()
    }
}

impl FencePageSink for MemPage {
    fn store_slot(&self, index: u32, word: u32) {
        assert!(index < PAGE_SLOTS, "fence page slot index out of range");
        self.words[index as usize + 1].store(word, Ordering::Release);
    }

    fn store_header(&self, header: u32) {
        self.words[0].store(header, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_constants() {
        assert_eq!(PAGE_WORDS, 1024);
        assert_eq!(PAGE_SLOTS, 1023);
        assert_eq!(slot_offset(0), 4);
        assert_eq!(slot_offset(PAGE_SLOTS - 1), PAGE_SIZE - 4);
        assert_eq!(PAGE_HEADER & 0xffff, PAGE_SLOTS);
        assert_eq!(MemPage::new().header(), PAGE_HEADER);
    }

    #[test]
    #[should_panic]
    fn slot_offset_rejects_out_of_range() {
        let _ = slot_offset(PAGE_SLOTS);
    }

    #[test]
    fn word_roundtrip() {
        for (g, s) in [
            (0, false),
            (1, true),
            (GENERATION_MASK, false),
            (12345, true),
        ] {
            assert_eq!(unpack_word(pack_word(g, s)), (g, s));
        }
    }

    #[test]
    fn slot_status_rules() {
        let id = FenceId {
            index: 7,
            generation: 5,
        };
        assert_eq!(slot_status(pack_word(5, false), id), FenceStatus::Pending);
        assert_eq!(slot_status(pack_word(5, true), id), FenceStatus::Signaled);
        // Recycled for a newer fence (even while that one is pending).
        assert_eq!(slot_status(pack_word(6, false), id), FenceStatus::Signaled);
    }

    #[test]
    fn mem_page_store_and_raw_read_agree() {
        let page = MemPage::new();
        page.store_slot(0, pack_word(3, false));
        page.store_slot(PAGE_SLOTS - 1, pack_word(9, true));
        assert_eq!(page.load_slot(0), pack_word(3, false));
        // SAFETY: the MemPage is a live, 4-aligned, PAGE_SIZE-byte buffer.
        unsafe {
            assert_eq!(read_slot(page.as_ptr(), 0), pack_word(3, false));
            assert_eq!(read_slot(page.as_ptr(), PAGE_SLOTS - 1), pack_word(9, true));
            assert_eq!(read_slot(page.as_ptr(), 1), 0);
        }
        assert_eq!(page.header(), PAGE_HEADER);
    }
}
