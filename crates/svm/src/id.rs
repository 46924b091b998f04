//! Typed ids of the SVM API: which guest, and which of its regions.
//!
//! The wire carries both as bare `u64`s; the host wraps them once where it decodes a request,
//! so a guest id can no longer be passed where a region id is meant.

use std::fmt;

/// A guest, as the daemon numbers its connections (process, remote and VM guests alike).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(transparent)]
pub struct GuestId(pub u64);

/// A region of one guest: ids are the guest's own (two guests may both hold a region 1).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(transparent)]
pub struct RegionId(pub u64);

impl fmt::Display for GuestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl fmt::Display for RegionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl From<u64> for GuestId {
    fn from(v: u64) -> Self {
        GuestId(v)
    }
}

impl From<u64> for RegionId {
    fn from(v: u64) -> Self {
        RegionId(v)
    }
}

impl From<GuestId> for u64 {
    fn from(v: GuestId) -> Self {
        v.0
    }
}

impl From<RegionId> for u64 {
    fn from(v: RegionId) -> Self {
        v.0
    }
}
