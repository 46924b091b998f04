//! The release page of a decoder worker's picture buffers ([`super::shared`]): a page of
//! counters the parent makes and writes and the worker maps read-only, on which the parent
//! counts each picture it is done with the moment it drops it, so the worker may decode into
//! that buffer again without waiting for the parent's next call.

use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};

use super::shared::{Buffer, MAX_SLOTS};
use super::wire::bad;
use crate::error::Result;

/// Counters on a [`ReleasePage`]: one per buffer a worker may have at once, with room.
pub(crate) const CELLS: u32 = 64;
const _: () = assert!(CELLS as usize >= MAX_SLOTS);

/// Where the parent counts the pictures it is done with, one counter per cell (each live
/// buffer of the worker has a cell of its own, named when the buffer was introduced): made
/// and written by the parent, mapped read-only by the worker.
pub(crate) struct ReleasePage(Buffer);

impl ReleasePage {
    const BYTES: usize = CELLS as usize * 4;

    /// The parent's page, every count at 0.
    pub(crate) fn new() -> Result<ReleasePage> {
        Ok(ReleasePage(Buffer::new(Self::BYTES)?))
    }

    /// The worker's mapping of the page its parent sent (read-only).
    pub(crate) fn open(fd: OwnedFd) -> Result<ReleasePage> {
        let b = Buffer::open(fd, Self::BYTES, false)?;
        if b.len() != Self::BYTES {
            return Err(bad("release page size"));
        }
        Ok(ReleasePage(b))
    }

    /// Its descriptor, to send.
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.0.fd()
    }

    fn cell(&self, cell: u32) -> Option<&AtomicU32> {
        if cell >= CELLS {
            return None;
        }
        // SAFETY: the mapping is page-aligned and `BYTES` long (checked when opened), so
        // the word of cell `cell < CELLS` lies within it, aligned; both processes access it
        // only atomically, and it stays mapped as long as `self`.
        Some(unsafe { &*self.0.as_ptr().add(cell as usize * 4).cast::<AtomicU32>() })
    }

    /// The pictures counted done in `cell` so far (wrapping).
    pub(crate) fn count(&self, cell: u32) -> u32 {
        self.cell(cell).map_or(0, |c| c.load(Ordering::Acquire))
    }

    /// The parent is done with one more picture in the buffer of `cell` (after its last
    /// read of it).
    pub(crate) fn release(&self, cell: u32) {
        if let Some(c) = self.cell(cell) {
            c.fetch_add(1, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the parent counts, the worker's read-only mapping sees; a cell out of range is
    /// neither counted nor read.
    #[test]
    fn the_parent_s_counts_reach_the_worker_s_mapping() {
        let parent = ReleasePage::new().unwrap();
        let worker = ReleasePage::open(parent.fd().try_clone_to_owned().unwrap()).unwrap();
        parent.release(3);
        parent.release(3);
        parent.release(CELLS);
        assert_eq!((worker.count(3), worker.count(2)), (2, 0));
        assert_eq!(worker.count(CELLS), 0);
        let small = Buffer::new(16).unwrap();
        assert!(ReleasePage::open(small.fd().try_clone_to_owned().unwrap()).is_err());
    }
}
