//! Layout of the shared window: header page, virtual fence page, ring control page, the two
//! rings, and the guest-visible data area that holds region replicas.
//!
//! The layout is computed from three numbers (window size, submission and completion ring sizes)
//! by both sides; the host sends those numbers in the handshake and never reads a layout back
//! from the window.

use crate::wire::{Completion, Request};
use crate::{ProtoError, Result};

/// Page size used for alignment of window areas.
pub const PAGE: u64 = 4096;
/// Offset of the (host-written, informational) header page.
pub const HEADER_OFFSET: u64 = 0;
/// Offset of the 4 KiB virtual fence page (host writes, guest reads).
pub const FENCE_PAGE_OFFSET: u64 = PAGE;
/// Offset of the ring control page.
pub const CONTROL_OFFSET: u64 = 2 * PAGE;
/// Offset of the submission ring entries.
pub const SQ_OFFSET: u64 = 3 * PAGE;

/// Offsets of the control words inside the control page, each on its own cache line.
pub mod ctl {
    /// Submission ring tail (written by the guest).
    pub const SQ_TAIL: u64 = 0;
    /// Submission ring head (written by the host).
    pub const SQ_HEAD: u64 = 64;
    /// Completion ring tail (written by the host).
    pub const CQ_TAIL: u64 = 128;
    /// Completion ring head (written by the guest).
    pub const CQ_HEAD: u64 = 192;
    /// Futex word the host sleeps on; the guest bumps it to wake the host.
    pub const HOST_BELL: u64 = 256;
    /// Non-zero while the host is (about to be) asleep on `HOST_BELL`.
    pub const HOST_SLEEPING: u64 = 260;
    /// Futex word the guest sleeps on; the host bumps it to wake the guest.
    pub const GUEST_BELL: u64 = 320;
    /// Non-zero while the guest is (about to be) asleep on `GUEST_BELL`.
    pub const GUEST_SLEEPING: u64 = 324;
    /// Host state: 0 running, 1 the session was closed by the host.
    pub const HOST_STATE: u64 = 384;
    /// Guest threads (about to be) asleep on a fence page slot (a futex wait on the slot's
    /// word): while non-zero, the host wakes a slot's waiters when it writes the slot. Written
    /// by the guest; to the host only a hint (a wrong value costs a futex call or a wait's
    /// timeout, never correctness for anyone else).
    pub const FENCE_WAITERS: u64 = 448;
    /// Most spin iterations the guest asks the host's waits for its requests to make before
    /// they sleep (0: no wish, the daemon's own `--spins`): a guest whose requests come in
    /// bursts far apart (a GL stream's batches, a frame apart) spares the host's cores the
    /// spin that could never catch the next burst. Written by the guest; to the host only
    /// a hint, never more than its own count.
    pub const HOST_SPINS: u64 = 512;
}

/// Magic value at the start of the header page ("VIRTSOC1").
pub const WINDOW_MAGIC: u64 = 0x3143_4f53_5452_4956;

/// Smallest data area we accept.
pub const MIN_DATA: u64 = PAGE;

/// Computed layout of a window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct WindowLayout {
    /// Total window size in bytes.
    pub size: u64,
    /// Number of submission ring entries (power of two).
    pub sq_entries: u32,
    /// Number of completion ring entries (power of two).
    pub cq_entries: u32,
}

impl WindowLayout {
    /// Builds and validates a layout.
    pub fn new(size: u64, sq_entries: u32, cq_entries: u32) -> Result<Self> {
        let l = WindowLayout {
            size,
            sq_entries,
            cq_entries,
        };
        l.validate()?;
        Ok(l)
    }

    /// Checks that the numbers describe a usable window.
    pub fn validate(&self) -> Result<()> {
        for (name, n) in [("sq", self.sq_entries), ("cq", self.cq_entries)] {
            if n == 0 || !n.is_power_of_two() || n > 1 << 16 {
                return Err(ProtoError::Layout(format!(
                    "{name} entries must be a power of two in 1..=65536, got {n}"
                )));
            }
        }
        if !self.size.is_multiple_of(PAGE) {
            return Err(ProtoError::Layout(
                "window size must be page aligned".into(),
            ));
        }
        if self.size < self.data_offset() + MIN_DATA {
            return Err(ProtoError::Layout(format!(
                "window of {} bytes leaves no data area (needs at least {})",
                self.size,
                self.data_offset() + MIN_DATA
            )));
        }
        Ok(())
    }

    /// Offset of the completion ring entries.
    pub fn cq_offset(&self) -> u64 {
        SQ_OFFSET + self.sq_entries as u64 * Request::SIZE as u64
    }

    /// Offset of the data area (page aligned).
    pub fn data_offset(&self) -> u64 {
        let end = self.cq_offset() + self.cq_entries as u64 * Completion::SIZE as u64;
        end.div_ceil(PAGE) * PAGE
    }

    /// Size of the data area.
    pub fn data_size(&self) -> u64 {
        self.size - self.data_offset()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_areas_do_not_overlap() {
        let l = WindowLayout::new(1 << 20, 64, 128).unwrap();
        assert!(l.cq_offset() >= SQ_OFFSET + 64 * 64);
        assert!(l.data_offset() >= l.cq_offset() + 128 * 64);
        assert_eq!(l.data_offset() % PAGE, 0);
        assert_eq!(l.data_offset() + l.data_size(), 1 << 20);
    }

    #[test]
    fn bad_layouts_are_rejected() {
        assert!(WindowLayout::new(1 << 20, 3, 4).is_err());
        assert!(WindowLayout::new(1 << 20, 0, 4).is_err());
        assert!(WindowLayout::new(4 * PAGE, 64, 64).is_err());
        assert!(WindowLayout::new((1 << 20) + 1, 64, 64).is_err());
    }
}
