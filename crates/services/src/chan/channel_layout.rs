//! A channel's layout: where its rings and slots lie from its base, and how big it is.

use super::{CONTROL, ENTRY, MAX_ENTRIES, SLOT_SIZE};
use crate::{Result, ServiceError};

/// Where a channel lives and how big it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChannelLayout {
    /// Ring entries (a power of two, at most [`MAX_ENTRIES`]); also the number of slots.
    pub entries: u32,
    /// Bytes of each slot.
    pub slot_size: u32,
}

impl ChannelLayout {
    /// A layout with `entries` entries of [`SLOT_SIZE`] slots.
    pub fn new(entries: u32) -> Result<Self> {
        let l = ChannelLayout {
            entries,
            slot_size: SLOT_SIZE,
        };
        l.validate()?;
        Ok(l)
    }

    pub(super) fn validate(&self) -> Result<()> {
        if self.entries == 0 || !self.entries.is_power_of_two() || self.entries > MAX_ENTRIES {
            return Err(ServiceError::BadArgument(format!(
                "channel entries must be a power of two in 1..={MAX_ENTRIES}, got {}",
                self.entries
            )));
        }
        if self.slot_size != SLOT_SIZE {
            return Err(ServiceError::BadArgument(format!(
                "slot size must be {SLOT_SIZE}, got {}",
                self.slot_size
            )));
        }
        Ok(())
    }

    pub(super) fn req_ring(&self) -> u64 {
        CONTROL
    }

    pub(super) fn resp_ring(&self) -> u64 {
        CONTROL + u64::from(self.entries) * ENTRY
    }

    /// Offset of the slots from the channel's base.
    pub fn data(&self) -> u64 {
        (CONTROL + 2 * u64::from(self.entries) * ENTRY).next_multiple_of(4096)
    }

    /// Offset of slot `i` from the channel's base.
    pub fn slot(&self, i: u32) -> u64 {
        self.data() + u64::from(i) * u64::from(self.slot_size)
    }

    /// Bytes the channel needs.
    pub fn size(&self) -> u64 {
        self.slot(self.entries)
    }
}
