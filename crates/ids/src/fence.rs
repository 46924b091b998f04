//! Virtual fence ids: a slot of the guest's fence page (or an overflow number) and the
//! generation of that slot, packed into one `u64` on the wire.

/// Identifies one virtual fence: a page slot (or overflow number) and the generation of that
/// slot when the fence was created. Whether an index has a slot in the shared page is the
/// fence crate's to say (`virtsoc_fence::is_page_backed`): the page size is its.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FenceId {
    /// Page slot index, or past the page's slots for an overflow fence that has no slot in
    /// the page.
    pub index: u32,
    /// Generation of the slot for this fence (never 0 for a handed-out id).
    pub generation: u32,
}

impl FenceId {
    /// Packs the id for wire protocols: `generation << 32 | index`.
    pub const fn to_u64(self) -> u64 {
        ((self.generation as u64) << 32) | self.index as u64
    }

    /// Inverse of [`FenceId::to_u64`].
    pub const fn from_u64(raw: u64) -> Self {
        Self {
            index: raw as u32,
            generation: (raw >> 32) as u32,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fence_ids_pack_generation_over_index() {
        let id = FenceId {
            index: 7,
            generation: 0x8000_0001,
        };
        assert_eq!(id.to_u64(), 0x8000_0001_0000_0007);
        assert_eq!(FenceId::from_u64(id.to_u64()), id);
    }
}
