//! Regions: the host's full record of one SVM region and its replicas.
//!
//! The guest caches only the id and size; this record holds the metadata, one replica per
//! domain that has ever needed the bytes (allocated lazily at first access), and which bytes
//! of each replica hold the current contents: every replica keeps the set of byte ranges it is
//! stale in ([`RangeSet`]), so a sub-range write invalidates, and the next read elsewhere
//! copies, only that sub-range.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use virtsoc_proto::wire::Format;
use virtsoc_sync::LockExt;

use crate::backing::{Backing, HostBuf};
use crate::copier::CopyEngine;
use crate::dma::{CopyTicket, DmaJob};
use crate::domain::{DomainId, DomainKind};
use crate::guest::GuestSvm;
use crate::ranges::{Range, RangeSet};
use crate::{Result, SvmError};

/// Identifies a region host-wide: the owning guest and the guest-visible id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RegionKey {
    /// Id of the owning guest.
    pub guest: u64,
    /// The region's id as the guest names it (unique per guest).
    pub id: u64,
}

/// What a region was allocated as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct RegionMeta {
    /// Bytes the region occupies (computed from the image layout for image formats).
    pub size: u64,
    /// Width in pixels (as given, meaningless for blobs).
    pub width: u32,
    /// Height in pixels (as given, meaningless for blobs).
    pub height: u32,
    /// Row pitch in bytes (0 for blobs).
    pub stride: u32,
    #[serde(skip)]
    /// Byte layout of the region (not serialized).
    pub format: Format,
    /// Usage bits the guest gave at allocation (informational).
    pub usage: u32,
}

/// One replica of a region in one domain.
#[derive(Debug)]
pub(crate) struct Replica {
    pub(crate) backing: Backing,
    /// Byte ranges this replica does not hold the current contents of (empty: all valid).
    pub(crate) stale: RangeSet,
    /// True until bytes were first written into it: copies into a fresh replica pay for page
    /// faults and are not used to measure bandwidth.
    pub(crate) fresh: bool,
    /// Window range to give back when the replica goes away.
    window_range: Option<u64>,
    /// Its backing is memory a device lent ([`crate::SvmManager::adopt_replica`]): read
    /// only, never copied into (anything that would write it moves it out first).
    pub(crate) adopted: bool,
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
    /// Bumped at the begin and at the end of every writing access (bytes may change in
    /// between): a migration's pre-copy resends the regions whose version moved.
    pub(crate) version: u64,
    /// A device that reads host memory in place (the display) has read the region: what a
    /// device lends it later is moved out at once, on the lending device's thread
    /// ([`SvmManager::adopt_replica`](crate::SvmManager::adopt_replica)), not on that
    /// reader's path.
    pub(crate) host_reader: bool,
    /// The last write that ended was the guest's CPU's (in its window), and no device has
    /// written since: no copy into the window can have landed since then, so the guest may
    /// post a write ([`SvmManager::posted_write`](crate::SvmManager::posted_write)).
    pub(crate) cpu_wrote_last: bool,
}

/// The host's record of a region.
#[derive(Debug)]
pub struct Region {
    /// Which guest's region this is.
    pub key: RegionKey,
    /// What the region was allocated as.
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
        self.state.lock_or_recover()
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
    /// Bytes those copies moved.
    pub bytes: u64,
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
    /// Asynchronous copies this access started (prefetches at a writer's end_access).
    pub(crate) started: Vec<Arc<CopyTicket>>,
    /// Prefetch copies small enough to make on this thread once the region's lock is
    /// released ([`crate::coherence::INLINE_COPY_MAX`]); their tickets are in `started`.
    pub(crate) inline: Vec<DmaJob>,
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
            started: Vec::new(),
            inline: Vec::new(),
        }
    }

    /// Size of the region.
    pub fn size(&self) -> u64 {
        self.region.meta.size
    }

    /// Whether `d` holds the current contents of every byte.
    pub fn is_valid(&self, d: DomainId) -> bool {
        self.is_valid_in(d, (0, self.size()))
    }

    /// Whether `d` holds the current contents of `range`.
    pub fn is_valid_in(&self, d: DomainId, range: Range) -> bool {
        self.state
            .replicas
            .get(&d)
            .is_some_and(|r| !self.state.written || !r.stale.overlaps(range))
    }

    /// The first host-memory domain (not the guest window) whose replica holds the current
    /// contents of `range`, if any.
    pub fn valid_host_domain(&self, range: Range) -> Option<DomainId> {
        let mut host: Vec<DomainId> = self
            .state
            .replicas
            .iter()
            .filter(|(_, r)| matches!(r.backing, Backing::Host(_)))
            .map(|(d, _)| *d)
            .filter(|d| *d != DomainId::GUEST_WINDOW && self.is_valid_in(*d, range))
            .collect();
        host.sort();
        host.first().copied()
    }

    /// Domains holding the current contents of `range`.
    pub fn valid_domains_in(&self, range: Range) -> Vec<DomainId> {
        self.state
            .replicas
            .keys()
            .copied()
            .filter(|d| self.is_valid_in(*d, range))
            .collect()
    }

    /// Domains holding the current contents of every byte.
    pub fn valid_domains(&self) -> Vec<DomainId> {
        self.valid_domains_in((0, self.size()))
    }

    /// Makes sure `d` has a replica (allocating it lazily). A replica created before the
    /// first write is valid (all zeroes); after it, stale everywhere until filled.
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
                match self.host_or_device_memory(d, size) {
                    Ok(b) => (b, None),
                    Err(e) => {
                        self.region.guest.release_bytes(size);
                        return Err(e);
                    }
                }
            }
        };
        let stale = if self.state.written {
            RangeSet::of((0, size))
        } else {
            RangeSet::new()
        };
        self.state.replicas.insert(
            d,
            Replica {
                backing,
                stale,
                fresh: true,
                window_range,
                adopted: false,
            },
        );
        Ok(())
    }

    /// Memory for a replica in `d`: the device's own when the domain has an allocator, else
    /// page-aligned host memory (a shared memfd for a domain that shares its replicas).
    fn host_or_device_memory(&self, d: DomainId, size: u64) -> Result<Backing> {
        if let Some(a) = self.engine.allocator(d) {
            if let Some(mem) = a.alloc(&self.region.meta)? {
                return Ok(Backing::Device(mem));
            }
        }
        let n = usize::try_from(size).map_err(|_| SvmError::OutOfMemory)?;
        Ok(Backing::Host(match self.engine.shares_memory(d) {
            true => HostBuf::try_shared(n)?,
            false => HostBuf::try_zeroed(n)?,
        }))
    }

    /// Copies `range` directly from `src` to `dst` (both get replicas), whatever `dst` holds,
    /// and marks it valid in `dst` where it was valid in `src`.
    pub fn copy(&mut self, src: DomainId, dst: DomainId, range: Range) -> Result<()> {
        self.ensure_replica(src)?;
        self.ensure_replica(dst)?;
        if range.0 >= range.1 {
            return Ok(());
        }
        // Lent memory is never written: its valid bytes move into memory of our own first.
        self.move_out(dst)?;
        let (s, d) = (
            self.state.replicas[&src].backing.clone(),
            self.state.replicas[&dst].backing.clone(),
        );
        let measure = !self.state.replicas[&dst].fresh;
        let dt = self.engine.copy(src, &s, dst, &d, range, measure)?;
        self.report.coherence += dt;
        self.report.copies += 1;
        self.report.bytes += range.1 - range.0;
        self.region
            .guest
            .counters()
            .count_copy(src.0, dst.0, range.1 - range.0, dt);
        let src_stale = if self.state.written {
            self.state.replicas[&src].stale.intersect(range)
        } else {
            Vec::new()
        };
        if let Some(r) = self.state.replicas.get_mut(&dst) {
            r.stale.remove(range);
            for piece in src_stale {
                r.stale.insert(piece);
            }
            r.fresh = false;
        }
        Ok(())
    }

    /// Brings the current contents of `range` to `d`: each stale piece of `d` in `range`
    /// comes on the cheapest path from a domain holding it. Domains passed on the way keep
    /// what they forwarded.
    pub fn fetch(&mut self, d: DomainId, range: Range) -> Result<()> {
        self.ensure_replica(d)?;
        if !self.state.written {
            return Ok(());
        }
        let needed = self.state.replicas[&d].stale.intersect(range);
        for piece in needed {
            // Split where any replica's staleness changes, so that each part is wholly valid
            // or wholly stale in every domain; then route each part from the domains that
            // hold it.
            let mut cuts = vec![piece.0, piece.1];
            for r in self.state.replicas.values() {
                r.stale.boundaries_in(piece, &mut cuts);
            }
            cuts.sort_unstable();
            cuts.dedup();
            for part in cuts.windows(2).map(|w| (w[0], w[1])) {
                let sources = self.valid_domains_in(part);
                if sources.is_empty() {
                    return Err(SvmError::Internal(format!(
                        "bytes {part:?} of a written region have no valid replica"
                    )));
                }
                let path = self
                    .engine
                    .route(&sources, d, part.1 - part.0)
                    .ok_or(SvmError::Unreachable(d.0))?;
                for hop in path.windows(2) {
                    self.copy(hop[0], hop[1], part)?;
                }
            }
        }
        Ok(())
    }

    /// Records a write of `range` in `d`: `d` holds the current contents of `range`, every
    /// other replica is stale there.
    pub fn make_exclusive(&mut self, d: DomainId, range: Range) -> Result<()> {
        self.ensure_replica(d)?;
        if !self.state.written {
            // Until now every replica held the (zero) contents everywhere.
            self.state.written = true;
        }
        self.state.generation += 1;
        for (dom, r) in self.state.replicas.iter_mut() {
            if *dom == d {
                r.stale.remove(range);
            } else {
                r.stale.insert(range);
            }
        }
        self.drop_stale_adopted();
        Ok(())
    }

    /// Stale ranges of `d` (all of it when it has no replica).
    pub fn stale_ranges(&self, d: DomainId) -> Vec<Range> {
        match self.state.replicas.get(&d) {
            Some(_) if !self.state.written => Vec::new(),
            Some(r) => r.stale.pieces().to_vec(),
            None => vec![(0, self.size())],
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
        self.state
            .inflight
            .get(&d)
            .filter(|t| !t.is_done())
            .cloned()
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
