//! Export and import of a [`VirtualFenceTable`]'s state, for snapshots, restarts and
//! migration: every fence id the guest holds stays valid, with its status.
//!
//! The image holds each page slot's generation and state (free, pending, pending and
//! released, signaled), the pending overflow fences and the counters. Callbacks and waiters
//! are host-side and are not part of it: the device queues that registered them are drained
//! before a snapshot. An image is untrusted input: [`VirtualFenceTable::import`] validates
//! every slot and id before changing anything, and only imports into a table that has not
//! handed out a fence yet.

use super::{overflow_seq, FenceId, Inner, SlotState, VirtualFenceTable};
use crate::error::{FenceError, Result};
use crate::page::{pack_word, GENERATION_MASK, PAGE_SLOTS};
use std::collections::HashSet;
use virtsoc_sync::LockExt;

/// State of one page slot in an image.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SlotImage {
    /// No fence (its last fence, if any, was signaled and reclaimed).
    Free,
    /// A pending fence; `released` when its owner already dropped it.
    Pending {
        /// The owner already released the fence (it is reclaimed once signaled).
        released: bool,
    },
    /// A signaled fence its owner still holds.
    Signaled,
}

impl SlotImage {
    /// The state as one byte (for on-disk formats).
    pub fn to_u8(self) -> u8 {
        match self {
            SlotImage::Free => 0,
            SlotImage::Pending { released: false } => 1,
            SlotImage::Pending { released: true } => 2,
            SlotImage::Signaled => 3,
        }
    }

    /// Inverse of [`to_u8`](Self::to_u8); `None` for an unknown value.
    pub fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            0 => SlotImage::Free,
            1 => SlotImage::Pending { released: false },
            2 => SlotImage::Pending { released: true },
            3 => SlotImage::Signaled,
            _ => return None,
        })
    }
}

/// A fence table's state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FenceTableImage {
    /// Every page slot (`PAGE_SLOTS` of them): its generation and state.
    pub slots: Vec<(u32, SlotImage)>,
    /// Pending overflow fences.
    pub overflow: Vec<FenceId>,
    /// Overflow fences handed out so far.
    pub overflow_next: u64,
    /// Fences created so far.
    pub created: u64,
    /// Slots recycled so far.
    pub recycled: u64,
}

/// Largest counter value an image may carry.
const MAX_COUNT: u64 = 1 << 62;

fn bad(msg: String) -> FenceError {
    FenceError::BadImage(msg)
}

impl FenceTableImage {
    /// Checks the image (untrusted input) without touching a table.
    pub fn validate(&self) -> Result<()> {
        if self.slots.len() != PAGE_SLOTS as usize {
            return Err(bad(format!(
                "{} slots, the page has {PAGE_SLOTS}",
                self.slots.len()
            )));
        }
        for (i, &(generation, state)) in self.slots.iter().enumerate() {
            if generation > GENERATION_MASK {
                return Err(bad(format!("slot {i}: generation {generation} too large")));
            }
            if generation == 0 && state != SlotImage::Free {
                return Err(bad(format!("slot {i}: a fence of generation 0")));
            }
        }
        let mut seen = HashSet::new();
        for &id in &self.overflow {
            match overflow_seq(id) {
                Some(seq) if seq < self.overflow_next => {}
                _ => return Err(bad(format!("overflow fence {id:?} was never handed out"))),
            }
            if !seen.insert(id) {
                return Err(bad(format!("overflow fence {id:?} twice")));
            }
        }
        if self.overflow_next > self.created {
            return Err(bad("more overflow fences than fences created".into()));
        }
        // Counters a table could reach, with room to go on counting.
        if self.created > MAX_COUNT || self.recycled > MAX_COUNT {
            return Err(bad("counters out of range".into()));
        }
        Ok(())
    }
}

impl VirtualFenceTable {
    /// The table's state: every id handed out keeps its meaning in a table it is imported
    /// into.
    pub fn export(&self) -> FenceTableImage {
        let inner = self.inner.lock_or_recover();
        let slots = inner
            .slots
            .iter()
            .map(|s| {
                let st = match &s.state {
                    SlotState::Free => SlotImage::Free,
                    SlotState::Pending { released, .. } => SlotImage::Pending {
                        released: *released,
                    },
                    SlotState::Signaled => SlotImage::Signaled,
                };
                (s.generation, st)
            })
            .collect();
        let mut overflow: Vec<FenceId> = inner.overflow.keys().copied().collect();
        overflow.sort_unstable();
        FenceTableImage {
            slots,
            overflow,
            overflow_next: inner.overflow_next,
            created: inner.created,
            recycled: inner.recycled,
        }
    }

    /// Replaces the state of a fresh table (no fence handed out yet) with `img`, mirroring
    /// every slot into the page. Refuses an invalid image, or a table already in use, and
    /// then changes nothing.
    pub fn import(&self, img: &FenceTableImage) -> Result<()> {
        img.validate()?;
        let mut inner = self.inner.lock_or_recover();
        if inner.cancelled {
            return Err(FenceError::Cancelled);
        }
        if inner.created != 0 {
            return Err(bad("the table already handed out fences".into()));
        }
        let live = img
            .slots
            .iter()
            .filter(|(_, s)| matches!(s, SlotImage::Pending { .. }))
            .count()
            + img.overflow.len();
        if live > self.max_live {
            return Err(FenceError::TooMany(self.max_live));
        }
        let mut fresh = Inner::empty();
        for (i, &(generation, state)) in img.slots.iter().enumerate() {
            let slot = &mut fresh.slots[i];
            slot.generation = generation;
            slot.state = match state {
                SlotImage::Free => SlotState::Free,
                SlotImage::Pending { released } => SlotState::Pending {
                    released,
                    callbacks: Vec::new(),
                },
                SlotImage::Signaled => SlotState::Signaled,
            };
        }
        fresh.free = (0..PAGE_SLOTS)
            .filter(|&i| matches!(fresh.slots[i as usize].state, SlotState::Free))
            .collect();
        fresh.signaled_fifo = (0..PAGE_SLOTS)
            .filter(|&i| matches!(fresh.slots[i as usize].state, SlotState::Signaled))
            .map(|i| (i, fresh.slots[i as usize].generation))
            .collect();
        fresh.overflow = img.overflow.iter().map(|&id| (id, Vec::new())).collect();
        fresh.overflow_next = img.overflow_next;
        fresh.created = img.created;
        fresh.recycled = img.recycled;
        for (i, &(generation, state)) in img.slots.iter().enumerate() {
            // A free slot's word keeps its last generation, signaled: an old id of it reads
            // signaled, as in the exporting table.
            let signaled = !matches!(state, SlotImage::Pending { .. }) && generation != 0;
            self.sink
                .store_slot(i as u32, pack_word(generation, signaled));
        }
        *inner = fresh;
        Ok(())
    }
}
