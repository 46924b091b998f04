//! Typed ids shared by every virtsoc crate: which guest, which of its regions, which device,
//! which object a guest opened on a device (a handle), and which virtual fence.
//!
//! Modelled on vm-memory's `GuestAddress`: a newtype per kind of id with the few operations
//! it needs (display, conversion to and from the wire's words), so a guest id can never be
//! passed where a region id is meant. The wire carries them as bare `u64`s (a device as the
//! request's `u32`); the daemon wraps them once where it decodes a request. This crate is a
//! leaf: it depends on nothing of virtsoc, so the lowest crates (`prefetch`, `svm`, `fence`,
//! `proto`) use it as well as the highest.

/// Display as the wire word, and conversion to and from it, for newtype ids over one word.
macro_rules! wire_word {
    ($($id:ident: $word:ty),* $(,)?) => {
        $(
            impl std::fmt::Display for $id {
                fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                    self.0.fmt(f)
                }
            }

            impl From<$word> for $id {
                fn from(v: $word) -> Self {
                    $id(v)
                }
            }

            impl From<$id> for $word {
                fn from(v: $id) -> Self {
                    v.0
                }
            }
        )*
    };
}

mod device;
mod fence;

pub use device::{DeviceId, HandleId};
pub use fence::FenceId;

/// A guest, as the daemon numbers its connections (process, remote and VM guests alike).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(transparent)]
pub struct GuestId(pub u64);

/// A region of one guest: ids are the guest's own (two guests may both hold a region 1), so
/// a region is named host-wide only together with its guest. The default, region 0, is the
/// zero word of a command argument not yet set.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Default,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(transparent)]
pub struct RegionId(pub u64);

wire_word!(GuestId: u64, RegionId: u64);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_their_wire_words() {
        assert_eq!(u64::from(GuestId::from(7)), 7);
        assert_eq!(u64::from(RegionId::from(9)), 9);
        assert_eq!(u64::from(HandleId::from(4)), 4);
        assert_eq!(u32::from(DeviceId::from(10)), 10);
        assert_eq!(
            (DeviceId(10).to_string(), HandleId(2).to_string()),
            ("10".into(), "2".into())
        );
        assert_eq!(GuestId(3).to_string(), "3");
        assert_eq!(serde_json::to_string(&RegionId(5)).unwrap(), "5");
        let g: GuestId = serde_json::from_str("11").unwrap();
        assert_eq!(g, GuestId(11));
    }
}
