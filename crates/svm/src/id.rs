//! Typed ids of the SVM API: which guest, and which of its regions. Declared once in
//! `virtsoc-ids` (the leaf crate every crate shares) and re-exported here, so
//! `virtsoc_svm::GuestId` is the one guest type.

pub use virtsoc_ids::{GuestId, RegionId};
