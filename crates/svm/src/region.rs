//! Regions: the host's full record of one SVM region and its replicas.
//!
//! The guest caches only the id and size; this record holds the metadata, one replica per
//! domain that has ever needed the bytes (allocated lazily at first access), and which of
//! those replicas hold the current contents.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use virtsoc_proto::wire::Format;

use crate::backing::{Backing, HostBuf};
use crate::dma::CopyTicket;
use crate::domain::{DomainId, DomainKind};
use crate::engine::CopyEngine;
use crate::guest::GuestSvm;
use crate::{Result, SvmError};

/// Identifies a region host-wide: the owning guest and the guest-visible id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RegionKey {
    pub guest: u64,
    pub id: u64,
}

/// What a region was allocated as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct RegionMeta {
    pub size: u64,
    pub width: u32,
    pub height: u32,
    pub stride: u32,
    #[serde(skip)]
    pub format: Format,
    pub usage: u32,
}

/// One replica of a region in one domain.
#[derive(Debug)]
pub(crate) struct Replica {
    pub(crate) backing: Backing,
    pub(crate) valid: bool,
    /// True until bytes were first written into it: copies into a fresh replica pay for page
    /// faults and are not used to measure bandwidth.
    pub(crate) fresh: bool,
    /// Window range to give back when the replica goes away.
    window_range: Option<u64>,
}

/// Mutable state of a region, behind the region's lock.
#[derive(Debug, Default)]
pub struct RegionState {
    pub(crate) replicas: BTreeMap<DomainId, Replica>,
    /// False until the first write: until then every replica is (zero-)valid.
    pub(crate) written: bool,
    /// Bumped by every write; asynchronous copies of an older generation are discarded.
    pub(crate) generation: u64,
    /// Asynchronous copies under way, by destination.
    pub(crate) inflight: BTreeMap<DomainId, Arc<CopyTicket>>,
}

/// The host's record of a region.
#[derive(Debug)]
pub struct Region {
    pub key: RegionKey,
    pub meta: RegionMeta,
    pub(crate) guest: Arc<GuestSvm>,
    state: Mutex<RegionState>,
}

impl Region {
    pub(crate) fn new(key: RegionKey, meta: RegionMeta, guest: Arc<GuestSvm>) -> Self {
        Region {
            key,
            meta,
            guest,
            state: Mutex::new(RegionState::default()),
        }
    }

    /// Offset of the region's replica in the owner's window, if it has one.
    pub fn window_offset(&self) -> Option<u64> {
        self.lock()
            .replicas
            .get(&DomainId::GUEST_WINDOW)
            .and_then(|r| r.window_range)
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, RegionState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        let st = std::mem::take(&mut *self.lock());
        for (_, r) in st.replicas {
            if let Some(off) = r.window_range {
                self.guest.release_window(off, self.meta.size);
            } else {
                self.guest.release_bytes(self.meta.size);
            }
        }
    }
}

/// What one begin/end access did, for statistics and the guest's compensation.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct AccessReport {
    /// Offset of the accessed bytes in the owner's window (CPU accesses).
    pub window_offset: Option<u64>,
    /// Time spent copying for coherence during this call.
    pub coherence: Duration,
    /// Copies (hops) made during this call.
    pub copies: u32,
    /// How long the guest should block before handing the region on (prefetch protocol).
    pub compensation: Duration,
    /// Wall time of the call on the host, waits for in-flight copies included.
    pub elapsed: Duration,
}

/// A locked region handed to a coherence protocol.
pub struct RegionCtx<'a> {
    pub(crate) region: &'a Arc<Region>,
    pub(crate) state: &'a mut RegionState,
    pub(crate) engine: &'a CopyEngine,
    pub(crate) report: AccessReport,
}

impl<'a> RegionCtx<'a> {
    pub(crate) fn new(
        region: &'a Arc<Region>,
        state: &'a mut RegionState,
        engine: &'a CopyEngine,
    ) -> Self {
        RegionCtx {
            region,
            state,
            engine,
            report: AccessReport::default(),
        }
    }

    /// Size of the region.
    pub fn size(&self) -> u64 {
        self.region.meta.size
    }

    /// Whether `d` holds the current contents.
    pub fn is_valid(&self, d: DomainId) -> bool {
        self.state
            .replicas
            .get(&d)
            .is_some_and(|r| r.valid || !self.state.written)
    }

    /// Domains holding the current contents.
    pub fn valid_domains(&self) -> Vec<DomainId> {
        self.state
            .replicas
            .iter()
            .filter(|(_, r)| r.valid || !self.state.written)
            .map(|(d, _)| *d)
            .collect()
    }

    /// Makes sure `d` has a replica (allocating it lazily). A replica created before the
    /// first write is valid (all zeroes); after it, invalid until filled.
    pub fn ensure_replica(&mut self, d: DomainId) -> Result<()> {
        if self.state.replicas.contains_key(&d) {
            return Ok(());
        }
        let size = self.size();
        let kind = self
            .engine
            .topology()
            .info(d)
            .ok_or(SvmError::UnknownDomain(d.0))?
            .kind;
        let (backing, window_range) = match kind {
            DomainKind::GuestWindow => {
                let off = self.region.guest.alloc_window(size)?;
                (
                    Backing::Window {
                        win: self.region.guest.window().clone(),
                        offset: off,
                    },
                    Some(off),
                )
            }
            DomainKind::HostRam | DomainKind::DeviceLocal => {
                self.region.guest.charge_bytes(size)?;
                let n = usize::try_from(size).map_err(|_| SvmError::OutOfMemory)?;
                match HostBuf::try_zeroed(n) {
                    Ok(buf) => (Backing::Host(buf), None),
                    Err(e) => {
                        self.region.guest.release_bytes(size);
                        return Err(e);
                    }
                }
            }
        };
        let valid = !self.state.written;
        self.state.replicas.insert(
            d,
            Replica {
                backing,
                valid,
                fresh: true,
                window_range,
            },
        );
        Ok(())
    }

    /// Copies the contents directly from `src` to `dst` (both get replicas) and marks `dst`
    /// valid if `src` was.
    pub fn copy(&mut self, src: DomainId, dst: DomainId) -> Result<()> {
        self.ensure_replica(src)?;
        self.ensure_replica(dst)?;
        let size = self.size();
        let (s, d) = (
            self.state.replicas[&src].backing.clone(),
            self.state.replicas[&dst].backing.clone(),
        );
        let measure = !self.state.replicas[&dst].fresh;
        let t0 = Instant::now();
        self.engine.copy(src, &s, dst, &d, size, measure)?;
        let dt = t0.elapsed();
        self.report.coherence += dt;
        self.report.copies += 1;
        let c = self.region.guest.counters();
        c.copies.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        c.copy_ns
            .fetch_add(dt.as_nanos() as u64, std::sync::atomic::Ordering::Relaxed);
        let src_valid = self.is_valid(src);
        if let Some(r) = self.state.replicas.get_mut(&dst) {
            r.valid = src_valid;
            r.fresh = false;
        }
        Ok(())
    }

    /// Brings the current contents to `d` on the cheapest path from a valid replica. Domains
    /// passed on the way keep valid replicas.
    pub fn fetch(&mut self, d: DomainId) -> Result<()> {
        self.ensure_replica(d)?;
        if self.is_valid(d) {
            return Ok(());
        }
        let sources = self.valid_domains();
        if sources.is_empty() {
            return Err(SvmError::Internal(
                "written region has no valid replica".into(),
            ));
        }
        let path = self
            .engine
            .route(&sources, d, self.size())
            .ok_or(SvmError::Unreachable(d.0))?;
        for hop in path.windows(2) {
            self.copy(hop[0], hop[1])?;
        }
        Ok(())
    }

    /// Records a write in `d`: `d` becomes the only valid replica.
    pub fn make_exclusive(&mut self, d: DomainId) -> Result<()> {
        self.ensure_replica(d)?;
        self.state.written = true;
        self.state.generation += 1;
        for (dom, r) in self.state.replicas.iter_mut() {
            r.valid = *dom == d;
        }
        Ok(())
    }

    /// Marks `d` as holding the current contents too.
    pub fn mark_valid(&mut self, d: DomainId) {
        if let Some(r) = self.state.replicas.get_mut(&d) {
            r.valid = true;
        }
    }

    /// The region being accessed.
    pub fn region(&self) -> &Region {
        self.region
    }

    pub(crate) fn region_arc(&self) -> Arc<Region> {
        self.region.clone()
    }

    /// The copy engine.
    pub fn engine(&self) -> &CopyEngine {
        self.engine
    }

    /// An asynchronous copy under way to `d`, if any.
    pub fn inflight_to(&self, d: DomainId) -> Option<Arc<CopyTicket>> {
        self.state.inflight.get(&d).cloned()
    }

    /// Any asynchronous copy under way.
    pub fn any_inflight(&self) -> Option<Arc<CopyTicket>> {
        self.state.inflight.values().next().cloned()
    }

    /// Current write generation.
    pub fn generation(&self) -> u64 {
        self.state.generation
    }

    /// Registers an asynchronous copy to `d`.
    pub(crate) fn set_inflight(&mut self, d: DomainId, t: Arc<CopyTicket>) {
        self.state.inflight.insert(d, t);
    }

    /// Offset of the window replica, if any.
    pub fn window_offset(&self) -> Option<u64> {
        self.state
            .replicas
            .get(&DomainId::GUEST_WINDOW)
            .and_then(|r| r.window_range)
    }
}
