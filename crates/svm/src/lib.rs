//! The SVM manager of virtsoc (vSoC section 3.2).
//!
//! It owns the host-wide region table keyed by (guest, 64-bit id), the per-guest state
//! ([`guest::GuestSvm`]), the replicas of every region in every memory domain
//! ([`region`]), the copy engine that moves bytes between domains ([`engine`]), and the
//! coherence protocols that decide when to move them ([`coherence`]). A guest names only its
//! own regions: every lookup is keyed by the caller's guest id.

pub mod alloc;
pub mod backing;
pub mod coherence;
pub mod dma;
pub mod domain;
pub mod engine;
pub mod guest;
pub mod region;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use virtsoc_prefetch::PrefetchEngine;

use virtsoc_proto::wire::Format;
use virtsoc_proto::{AccessMode, ProtoError, SharedWindow};

pub use coherence::{AccessInfo, Coherence, ProtocolKind, Step};
pub use domain::{DomainId, DomainKind, Topology};
pub use engine::CopyEngine;
pub use guest::CounterSnapshot;
pub use guest::GuestSvm;
pub use region::{AccessReport, Region, RegionKey, RegionMeta};

use backing::Backing;
use region::RegionCtx;

/// Errors of the SVM manager.
#[derive(Debug, thiserror::Error)]
pub enum SvmError {
    #[error("bad argument: {0}")]
    BadArgument(String),
    #[error("guest {0} is not attached")]
    GuestNotAttached(u64),
    #[error("internal error: {0}")]
    Internal(String),
    #[error("no such region")]
    NoSuchRegion,
    #[error("not supported: {0}")]
    NotSupported(String),
    #[error("out of memory")]
    OutOfMemory,
    #[error("offset or length out of range")]
    OutOfRange,
    #[error("domain {0} cannot be reached from any valid replica")]
    Unreachable(u32),
    #[error("unknown memory domain {0}")]
    UnknownDomain(u32),
    #[error("window: {0}")]
    Window(#[from] ProtoError),
}

/// Result type of this crate.
pub type Result<T> = std::result::Result<T, SvmError>;

/// What a guest asks for when allocating.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllocDesc {
    /// Byte size for [`Format::Blob`]; ignored (computed) for image formats.
    pub size: u64,
    pub width: u32,
    pub height: u32,
    pub format: Format,
    pub usage: u32,
}

/// Counters over the manager's lifetime.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct SvmStats {
    pub regions: u64,
    pub begin_accesses: u64,
    pub end_accesses: u64,
    pub copies: u64,
    pub coherence_ns: u64,
}

#[derive(Debug, Default)]
struct Counters {
    begin: AtomicU64,
    end: AtomicU64,
    copies: AtomicU64,
    coherence_ns: AtomicU64,
}

/// The SVM manager.
pub struct SvmManager {
    engine: Arc<CopyEngine>,
    prefetch: Arc<PrefetchEngine>,
    dma: Arc<dma::Dma>,
    epoch: Instant,
    regions: RwLock<HashMap<RegionKey, Arc<Region>>>,
    guests: Mutex<HashMap<u64, Arc<GuestSvm>>>,
    counters: Counters,
}

impl SvmManager {
    /// A manager over the given domains.
    pub fn new(topo: Topology) -> Self {
        Self::with_prefetch_config(topo, virtsoc_prefetch::Config::default())
    }

    /// A manager whose prefetch engine uses `cfg` (the default is the paper's tuning).
    pub fn with_prefetch_config(topo: Topology, cfg: virtsoc_prefetch::Config) -> Self {
        let prefetch = Arc::new(PrefetchEngine::new(cfg));
        let engine = Arc::new(CopyEngine::new(Arc::new(topo), Some(prefetch.clone())));
        SvmManager {
            dma: Arc::new(dma::Dma::start(engine.clone())),
            engine,
            prefetch,
            epoch: Instant::now(),
            regions: RwLock::new(HashMap::new()),
            guests: Mutex::new(HashMap::new()),
            counters: Counters::default(),
        }
    }

    /// The copy engine (for measurements).
    pub fn engine(&self) -> &CopyEngine {
        &self.engine
    }

    /// An instance of a coherence protocol bound to this manager.
    pub fn protocol(&self, kind: ProtocolKind) -> Arc<dyn Coherence> {
        match kind {
            ProtocolKind::GuestStaging => Arc::new(coherence::GuestStaging),
            ProtocolKind::WriteInvalidate => Arc::new(coherence::WriteInvalidate),
            ProtocolKind::Prefetch => Arc::new(coherence::Prefetch::new(
                self.prefetch.clone(),
                self.dma.clone(),
                self.epoch,
            )),
        }
    }

    /// The prefetch engine (twin hypergraphs), shared by every guest.
    pub fn prefetch_engine(&self) -> &Arc<PrefetchEngine> {
        &self.prefetch
    }

    /// Bytes held by the manager's bookkeeping: the twin hypergraphs and the region table.
    pub fn metadata_bytes(&self) -> u64 {
        let regions = self.regions.read().map(|r| r.capacity()).unwrap_or(0) as u64;
        self.prefetch.stats().metadata_bytes
            + regions
                * (std::mem::size_of::<RegionKey>()
                    + std::mem::size_of::<Arc<Region>>()
                    + std::mem::size_of::<Region>()) as u64
    }

    /// Counters of one guest.
    pub fn guest_counters(&self, guest: u64) -> Result<CounterSnapshot> {
        Ok(self.guest(guest)?.counters().snapshot())
    }

    /// Registers a guest and its window; its regions use `protocol` and may hold at most
    /// `limit` bytes of host and device memory.
    pub fn attach_guest(
        &self,
        guest: u64,
        window: Arc<SharedWindow>,
        protocol: Arc<dyn Coherence>,
        limit: u64,
    ) -> Result<Arc<GuestSvm>> {
        let mut guests = self.guests.lock().unwrap_or_else(|p| p.into_inner());
        if guests.contains_key(&guest) {
            return Err(SvmError::BadArgument(format!(
                "guest {guest} already attached"
            )));
        }
        let g = Arc::new(GuestSvm::new(guest, window, limit, protocol));
        guests.insert(guest, g.clone());
        Ok(g)
    }

    /// Removes a guest and frees every region it owns. Returns how many regions were freed.
    pub fn detach_guest(&self, guest: u64) -> usize {
        let g = self
            .guests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&guest);
        let mut regions = self.regions.write().unwrap_or_else(|p| p.into_inner());
        let mut dropped = Vec::new();
        regions.retain(|k, r| {
            if k.guest == guest {
                dropped.push(r.clone());
                false
            } else {
                true
            }
        });
        drop(regions);
        if let Some(g) = g {
            for r in &dropped {
                g.protocol().forget(r.key);
            }
        }
        dropped.len()
    }

    fn guest(&self, guest: u64) -> Result<Arc<GuestSvm>> {
        self.guests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&guest)
            .cloned()
            .ok_or(SvmError::GuestNotAttached(guest))
    }

    fn region(&self, guest: u64, id: u64) -> Result<Arc<Region>> {
        self.regions
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&RegionKey { guest, id })
            .cloned()
            .ok_or(SvmError::NoSuchRegion)
    }

    /// Allocates a region (no memory is committed until the first access); returns its id.
    pub fn alloc(&self, guest: u64, desc: AllocDesc) -> Result<(u64, RegionMeta)> {
        let g = self.guest(guest)?;
        let (size, stride) = match desc.format {
            Format::Blob => {
                if desc.size == 0 || desc.size > (1 << 40) {
                    return Err(SvmError::BadArgument(format!(
                        "blob size {} out of range",
                        desc.size
                    )));
                }
                (desc.size, 0)
            }
            f => f.image_size(desc.width, desc.height).ok_or_else(|| {
                SvmError::BadArgument(format!(
                    "{}x{} does not fit format {:?}",
                    desc.width, desc.height, f
                ))
            })?,
        };
        let meta = RegionMeta {
            size,
            width: desc.width,
            height: desc.height,
            stride,
            format: desc.format,
            usage: desc.usage,
        };
        let key = RegionKey {
            guest,
            id: g.next_id(),
        };
        let region = Arc::new(Region::new(key, meta, g));
        self.regions
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, region);
        Ok((key.id, meta))
    }

    /// Frees a region of `guest`.
    pub fn free(&self, guest: u64, id: u64) -> Result<()> {
        let r = self
            .regions
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&RegionKey { guest, id })
            .ok_or(SvmError::NoSuchRegion)?;
        r.guest.protocol().forget(r.key);
        Ok(())
    }

    /// Offset of a region's replica in its owner's window (CPU accesses), if it has one.
    pub fn window_offset(&self, guest: u64, id: u64) -> Result<Option<u64>> {
        Ok(self.region(guest, id)?.window_offset())
    }

    /// Metadata of a region of `guest`.
    pub fn meta(&self, guest: u64, id: u64) -> Result<RegionMeta> {
        Ok(self.region(guest, id)?.meta)
    }

    fn check_range(meta: &RegionMeta, offset: u64, len: u64) -> Result<bool> {
        match offset.checked_add(len) {
            Some(end) if len > 0 && end <= meta.size => Ok(offset == 0 && len == meta.size),
            _ => Err(SvmError::OutOfRange),
        }
    }

    fn run_access(&self, guest: u64, id: u64, a: AccessInfo, begin: bool) -> Result<AccessReport> {
        if !self.engine.topology().contains(a.domain) {
            return Err(SvmError::UnknownDomain(a.domain.0));
        }
        let region = self.region(guest, id)?;
        let protocol = region.guest.protocol().clone();
        let mut report = AccessReport::default();
        let t0 = Instant::now();
        let mut a = a;
        loop {
            let mut state = region.lock();
            let mut cx = RegionCtx::new(&region, &mut state, &self.engine);
            let step = if begin {
                protocol.begin_access(&mut cx, &a)?
            } else {
                protocol.end_access(&mut cx, &a)?;
                Step::Done
            };
            report.copies += cx.report.copies;
            report.coherence += cx.report.coherence;
            report.compensation = cx.report.compensation;
            if a.domain == DomainId::GUEST_WINDOW && begin {
                report.window_offset = cx.window_offset();
            }
            drop(state);
            match step {
                Step::Done => break,
                Step::WaitFor(t) => {
                    t.wait();
                    a.retry = true;
                }
            }
        }
        report.elapsed = t0.elapsed();
        self.counters
            .copies
            .fetch_add(report.copies as u64, Ordering::Relaxed);
        self.counters
            .coherence_ns
            .fetch_add(report.coherence.as_nanos() as u64, Ordering::Relaxed);
        Ok(report)
    }

    /// Begins an access of `[offset, offset + len)` of a region by `domain`. For the guest
    /// window domain the report carries the window offset of the byte at `offset`.
    #[allow(clippy::too_many_arguments)]
    pub fn begin_access(
        &self,
        guest: u64,
        id: u64,
        vdev: u32,
        domain: DomainId,
        offset: u64,
        len: u64,
        mode: AccessMode,
    ) -> Result<AccessReport> {
        self.counters.begin.fetch_add(1, Ordering::Relaxed);
        let mut report = self.access(guest, id, vdev, domain, offset, len, mode, true)?;
        if let Some(w) = report.window_offset.as_mut() {
            *w += offset;
        }
        Ok(report)
    }

    /// Ends an access begun with [`begin_access`](Self::begin_access).
    #[allow(clippy::too_many_arguments)]
    pub fn end_access(
        &self,
        guest: u64,
        id: u64,
        vdev: u32,
        domain: DomainId,
        offset: u64,
        len: u64,
        mode: AccessMode,
    ) -> Result<AccessReport> {
        self.counters.end.fetch_add(1, Ordering::Relaxed);
        self.access(guest, id, vdev, domain, offset, len, mode, false)
    }

    /// Checks the range and runs the protocol's begin (or end) for one access.
    #[allow(clippy::too_many_arguments)]
    fn access(
        &self,
        guest: u64,
        id: u64,
        vdev: u32,
        domain: DomainId,
        offset: u64,
        len: u64,
        mode: AccessMode,
        begin: bool,
    ) -> Result<AccessReport> {
        let meta = self.meta(guest, id)?;
        let whole = Self::check_range(&meta, offset, len)?;
        let a = AccessInfo {
            vdev,
            domain,
            mode,
            whole,
            retry: false,
        };
        self.run_access(guest, id, a, begin)
    }

    /// Runs `f` on the bytes of the region's replica in a host-backed `domain` (a device's
    /// own memory). The replica must exist, i.e. the device must have begun an access.
    pub fn with_replica<T>(
        &self,
        guest: u64,
        id: u64,
        domain: DomainId,
        f: impl FnOnce(&mut [u8]) -> T,
    ) -> Result<T> {
        let region = self.region(guest, id)?;
        let mut state = region.lock();
        let replica = state.replicas.get_mut(&domain).ok_or_else(|| {
            SvmError::BadArgument("the device has not begun an access to this region".into())
        })?;
        replica.fresh = false;
        match &replica.backing {
            Backing::Host(buf) => {
                let mut bytes = buf.lock();
                Ok(f(&mut bytes))
            }
            Backing::Window { .. } => Err(SvmError::BadArgument(
                "devices do not access the guest window directly".into(),
            )),
        }
    }

    /// Number of regions and host bytes held by `guest`.
    pub fn guest_usage(&self, guest: u64) -> Result<(u64, u64)> {
        let g = self.guest(guest)?;
        let n = self
            .regions
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .filter(|k| k.guest == guest)
            .count();
        Ok((n as u64, g.host_bytes()))
    }

    /// Lifetime counters.
    pub fn stats(&self) -> SvmStats {
        SvmStats {
            regions: self.regions.read().map(|r| r.len()).unwrap_or(0) as u64,
            begin_accesses: self.counters.begin.load(Ordering::Relaxed),
            end_accesses: self.counters.end.load(Ordering::Relaxed),
            copies: self.counters.copies.load(Ordering::Relaxed),
            coherence_ns: self.counters.coherence_ns.load(Ordering::Relaxed),
        }
    }
}
