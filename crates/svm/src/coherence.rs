//! Coherence protocols: what happens to replicas at begin_access and end_access.
//!
//! - `guest-staging` is the baseline of today's emulators (vSoC section 2.2): the guest window
//!   is the only truth; a device copies the window into its memory before every read and
//!   copies its memory back to the window after every write, so a write by one device and a
//!   read by another cost two copies.
//! - `write-invalidate` (vSoC 5.4): a write makes the writer's replica the only valid one; the
//!   next access elsewhere fetches synchronously, on the cheapest path, from a valid replica.
//! - `prefetch` (vSoC 3.3) plugs in through the same trait.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use virtsoc_proto::AccessMode;

use crate::domain::DomainId;
use crate::region::{RegionCtx, RegionKey};
use crate::{Result, SvmError};

/// A coherence protocol.
pub trait Coherence: Send + Sync {
    /// Its name on the command line and in reports.
    fn name(&self) -> &'static str;
    /// Prepares domain `d` for an access of `mode`; `whole` when the access covers the region.
    fn begin_access(
        &self,
        cx: &mut RegionCtx<'_>,
        d: DomainId,
        mode: AccessMode,
        whole: bool,
    ) -> Result<()>;
    /// Finishes an access of `mode` by domain `d`.
    fn end_access(&self, cx: &mut RegionCtx<'_>, d: DomainId, mode: AccessMode) -> Result<()>;
    /// The region is gone; drop whatever the protocol keeps about it.
    fn forget(&self, _key: RegionKey) {}
}

/// The protocols that can be selected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub enum ProtocolKind {
    GuestStaging,
    WriteInvalidate,
    Prefetch,
}

impl ProtocolKind {
    /// Every protocol, in report order.
    pub const ALL: [ProtocolKind; 3] = [
        ProtocolKind::GuestStaging,
        ProtocolKind::WriteInvalidate,
        ProtocolKind::Prefetch,
    ];

    /// Command-line name.
    pub fn name(self) -> &'static str {
        match self {
            ProtocolKind::GuestStaging => "guest-staging",
            ProtocolKind::WriteInvalidate => "write-invalidate",
            ProtocolKind::Prefetch => "prefetch",
        }
    }
}

impl fmt::Display for ProtocolKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ProtocolKind {
    type Err = SvmError;
    fn from_str(s: &str) -> Result<Self> {
        ProtocolKind::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| SvmError::BadArgument(format!("unknown coherence protocol {s:?}")))
    }
}

/// Baseline: every device syncs through the guest window.
#[derive(Debug, Default)]
pub struct GuestStaging;

impl Coherence for GuestStaging {
    fn name(&self) -> &'static str {
        ProtocolKind::GuestStaging.name()
    }

    fn begin_access(
        &self,
        cx: &mut RegionCtx<'_>,
        d: DomainId,
        mode: AccessMode,
        whole: bool,
    ) -> Result<()> {
        cx.ensure_replica(DomainId::GUEST_WINDOW)?;
        if d != DomainId::GUEST_WINDOW && (mode.reads() || !whole) {
            // The device knows nothing of other devices: it always pulls from guest memory.
            cx.copy(DomainId::GUEST_WINDOW, d)?;
        }
        cx.ensure_replica(d)?;
        if mode.writes() {
            cx.make_exclusive(d)?;
        }
        Ok(())
    }

    fn end_access(&self, cx: &mut RegionCtx<'_>, d: DomainId, mode: AccessMode) -> Result<()> {
        if mode.writes() && d != DomainId::GUEST_WINDOW {
            cx.copy(d, DomainId::GUEST_WINDOW)?;
        }
        Ok(())
    }
}

/// A write invalidates other replicas; the next access elsewhere fetches synchronously.
#[derive(Debug, Default)]
pub struct WriteInvalidate;

impl Coherence for WriteInvalidate {
    fn name(&self) -> &'static str {
        ProtocolKind::WriteInvalidate.name()
    }

    fn begin_access(
        &self,
        cx: &mut RegionCtx<'_>,
        d: DomainId,
        mode: AccessMode,
        whole: bool,
    ) -> Result<()> {
        if mode.reads() || !whole {
            cx.fetch(d)?;
        } else {
            cx.ensure_replica(d)?;
        }
        if mode.writes() {
            cx.make_exclusive(d)?;
        }
        Ok(())
    }

    fn end_access(&self, _cx: &mut RegionCtx<'_>, _d: DomainId, _mode: AccessMode) -> Result<()> {
        Ok(())
    }
}

/// Builds a protocol by kind.
pub fn build(kind: ProtocolKind) -> Result<Arc<dyn Coherence>> {
    match kind {
        ProtocolKind::GuestStaging => Ok(Arc::new(GuestStaging)),
        ProtocolKind::WriteInvalidate => Ok(Arc::new(WriteInvalidate)),
        ProtocolKind::Prefetch => Err(SvmError::NotSupported(
            "the prefetch protocol is not built into this daemon yet".into(),
        )),
    }
}
