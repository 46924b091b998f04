//! The SVM manager of virtsoc (vSoC section 3.2).
//!
//! It owns the per-guest state ([`guest::GuestSvm`], with each guest's own region table keyed
//! by its 64-bit ids), the replicas of every region in every memory domain
//! ([`region`]), the copy engine that moves bytes between domains ([`copier`]), and the
//! coherence protocols that decide when to move them ([`coherence`]). A guest names only its
//! own regions: every lookup is keyed by the caller's guest id.

mod adopt;
pub mod alloc;
pub mod backing;
pub mod coherence;
pub mod copier;
pub mod dma;
pub mod domain;
pub mod guest;
pub mod id;
pub mod pace;
mod posted;
pub mod ranges;
pub mod region;
mod replicas;
pub mod snapshot;
pub mod stream;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_shared;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use virtsoc_prefetch::PrefetchEngine;
use virtsoc_sync::RwLockExt;

use virtsoc_proto::wire::Format;
use virtsoc_proto::{AccessMode, ProtoError, SharedWindow};

pub use backing::{
    Backing, DeviceAllocator, DeviceMemory, HostBuf, SharedMemory, SHARED_DATA_OFFSET,
};
pub use coherence::{AccessInfo, Coherence, ProtocolKind, Step};
pub use copier::CopyEngine;
pub use dma::CopyTicket;
pub use domain::{DomainId, DomainKind, Topology};
pub use guest::{GuestSvm, LinkCount};
pub use id::{GuestId, RegionId};
pub use region::{AccessReport, Region, RegionKey, RegionMeta};
pub use snapshot::RegionImage;

use region::RegionCtx;

/// Errors of the SVM manager.
#[derive(Debug, thiserror::Error)]
pub enum SvmError {
    /// A malformed request or snapshot (unknown protocol name, bad metadata, ...); the text says
    /// what.
    #[error("bad argument: {0}")]
    BadArgument(String),
    /// The guest id has no SVM state (never attached, or already detached).
    #[error("guest {0} is not attached")]
    GuestNotAttached(GuestId),
    /// An inconsistency inside the manager (a bug, not the caller's fault); the text says what.
    #[error("internal error: {0}")]
    Internal(String),
    /// The region id is not one of the guest's regions.
    #[error("no such region")]
    NoSuchRegion,
    /// The operation is not available in this configuration; the text says what.
    #[error("not supported: {0}")]
    NotSupported(String),
    /// No room: the guest's window, memory limit or region limit is exhausted, or host memory could
    /// not be mapped.
    #[error("out of memory")]
    OutOfMemory,
    /// An access range outside the region (empty, past its end, or overflowing).
    #[error("offset or length out of range")]
    OutOfRange,
    /// No valid replica has a copy path to this domain id.
    #[error("domain {0} cannot be reached from any valid replica")]
    Unreachable(u32),
    /// A domain id that was never registered.
    #[error("unknown memory domain {0}")]
    UnknownDomain(u32),
    /// An error of the guest's shared window.
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
    /// Width in pixels for image formats, 1..=32768 (ignored for [`Format::Blob`]).
    pub width: u32,
    /// Height in pixels for image formats, 1..=32768 (ignored for [`Format::Blob`]).
    pub height: u32,
    /// Byte layout of the region.
    pub format: Format,
    /// Usage bits (`virtsoc_proto::wire::usage`): informational, kept in the region metadata.
    pub usage: u32,
}

/// Counters over the manager's lifetime.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct SvmStats {
    /// Regions currently held by all attached guests.
    pub regions: u64,
    /// begin_access calls served.
    pub begin_accesses: u64,
    /// end_access calls served.
    pub end_accesses: u64,
    /// Coherence copies made.
    pub copies: u64,
    /// Time spent copying for coherence, in nanoseconds.
    pub coherence_ns: u64,
}

#[derive(Debug, Default)]
struct Counters {
    begin: AtomicU64,
    end: AtomicU64,
    copies: AtomicU64,
    coherence_ns: AtomicU64,
}

/// One access: who accesses which bytes how.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AccessSpec {
    /// The virtual device as the guest names it.
    pub vdev: u32,
    /// The memory domain of the physical device behind it.
    pub domain: DomainId,
    /// First byte accessed.
    pub offset: u64,
    /// Bytes accessed.
    pub len: u64,
    /// Read, write or both.
    pub mode: AccessMode,
    /// For an end_access: the guest waits for the completion and blocks for the compensation
    /// it asks for (else the writer's device queue holds its next fence signal instead).
    pub compensates: bool,
    /// The device reads host memory directly, as a display controller scans out of system
    /// RAM: a read-only access is served in place from a host-memory replica holding the
    /// range's current contents when there is one (no copy), and from `domain` otherwise.
    /// Protocols whose devices sync through the guest ignore it (see
    /// [`Coherence::reads_host_in_place`]).
    pub reads_host: bool,
}

impl AccessSpec {
    /// An access of `[offset, offset + len)` by `vdev` in `domain`.
    pub fn new(vdev: u32, domain: DomainId, offset: u64, len: u64, mode: AccessMode) -> Self {
        AccessSpec {
            vdev,
            domain,
            offset,
            len,
            mode,
            compensates: false,
            reads_host: false,
        }
    }

    /// The same access, by a device that reads host memory in place (see
    /// [`AccessSpec::reads_host`]).
    pub fn reading_host(self, yes: bool) -> Self {
        AccessSpec {
            reads_host: yes,
            ..self
        }
    }

    /// The same access, with the guest blocking for compensation.
    pub fn compensating(self, yes: bool) -> Self {
        AccessSpec {
            compensates: yes,
            ..self
        }
    }
}

/// Where a begin_access stands.
#[derive(Debug)]
pub enum Progress {
    /// The domain holds the bytes: the access may go on.
    Done(AccessReport),
    /// A copy into the domain is in flight: ask again (with `retry`) once it is done.
    Wait(Arc<CopyTicket>),
}

/// What an end_access did.
#[derive(Debug, Default)]
pub struct EndReport {
    /// What the access itself did (copies made, compensation asked).
    pub report: AccessReport,
    /// Prefetch copies it started (a writer's device queue may hold its next fence signal
    /// until they finished).
    pub started: Vec<Arc<CopyTicket>>,
}

/// The SVM manager.
pub struct SvmManager {
    engine: Arc<CopyEngine>,
    prefetch_cfg: virtsoc_prefetch::Config,
    dma: Arc<dma::Dma>,
    epoch: Instant,
    guests: RwLock<HashMap<u64, Arc<GuestSvm>>>,
    counters: Counters,
}

impl SvmManager {
    /// A manager over the given domains.
    pub fn new(topo: Topology) -> Self {
        Self::with_prefetch_config(topo, virtsoc_prefetch::Config::default())
    }

    /// A manager whose prefetch engines use `cfg` (the default is the paper's tuning).
    pub fn with_prefetch_config(topo: Topology, cfg: virtsoc_prefetch::Config) -> Self {
        let engine = Arc::new(CopyEngine::new(Arc::new(topo)));
        SvmManager {
            dma: Arc::new(dma::Dma::start(engine.clone(), dma::CHANNELS)),
            engine,
            prefetch_cfg: cfg,
            epoch: Instant::now(),
            guests: RwLock::new(HashMap::new()),
            counters: Counters::default(),
        }
    }

    /// The copy engine (for measurements).
    pub fn engine(&self) -> &CopyEngine {
        &self.engine
    }

    /// A new instance of a coherence protocol bound to this manager, for one guest (the
    /// prefetch protocol's predictor is the guest's own).
    pub fn protocol(&self, kind: ProtocolKind) -> Arc<dyn Coherence> {
        match kind {
            ProtocolKind::GuestStaging => Arc::new(coherence::GuestStaging),
            ProtocolKind::WriteInvalidate => Arc::new(coherence::WriteInvalidate),
            ProtocolKind::Prefetch => {
                let predictor = Arc::new(PrefetchEngine::new(self.prefetch_cfg));
                self.engine.observe(&predictor);
                Arc::new(coherence::Prefetch::new(
                    predictor,
                    self.dma.clone(),
                    self.epoch,
                ))
            }
        }
    }

    /// Fault injection for tests: every asynchronous copy a copy channel makes waits `d`
    /// before it starts (keeps a prefetch in flight deterministically); the small ones made
    /// by the writer's thread ([`coherence::INLINE_COPY_MAX`]) are not held up.
    pub fn set_dma_delay(&self, d: Duration) {
        self.dma.set_delay(d);
    }

    /// Places `domain`'s replicas in a device's own memory (a GPU's textures): every copy in
    /// or out becomes an upload or a readback through `alloc`'s memory.
    pub fn set_allocator(&self, domain: DomainId, alloc: Arc<dyn DeviceAllocator>) {
        self.engine.set_allocator(domain, alloc);
    }

    /// Makes the host replicas of `domain` made from now on shared memfds
    /// ([`HostBuf::try_shared`]) that the domain's device may hand to a process of its own
    /// ([`HostBuf::memfd`]); they are charged and copied like any host replica.
    pub fn set_shared_memory(&self, domain: DomainId) {
        self.engine.set_shared_memory(domain);
    }

    /// Bytes of `guest`'s share of the manager's bookkeeping: its predictor (twin
    /// hypergraphs) and its entries of the region table.
    pub fn metadata_bytes(&self, guest: GuestId) -> u64 {
        let guest = guest.0;
        let Ok(g) = self.guest(guest) else {
            return 0;
        };
        let regions = g.region_count() as u64;
        g.protocol().metadata_bytes()
            + regions
                * (std::mem::size_of::<u64>()
                    + std::mem::size_of::<Arc<Region>>()
                    + std::mem::size_of::<Region>()) as u64
    }

    /// The predictor of `guest` (prefetch protocol only).
    pub fn predictor(&self, guest: GuestId) -> Option<Arc<PrefetchEngine>> {
        let guest = guest.0;
        self.guest(guest).ok()?.protocol().predictor()
    }

    /// Counters of one guest.
    pub fn guest_counters(&self, guest: GuestId) -> Result<virtsoc_proto::counters::Counters> {
        let guest = guest.0;
        Ok(self.guest(guest)?.snapshot())
    }

    /// The copy ledger of one guest: copies per (source, destination) domain; a device's own
    /// copies are on the link from its domain to itself.
    pub fn guest_ledger(&self, guest: GuestId) -> Result<Vec<((u32, u32), LinkCount)>> {
        let guest = guest.0;
        Ok(self.guest(guest)?.counters().ledger())
    }

    /// Counts a copy of `guest`'s frame bytes that a device made inside its own memory.
    pub fn count_device_copy(&self, guest: GuestId, domain: DomainId, bytes: u64, dt: Duration) {
        let guest = guest.0;
        if let Ok(g) = self.guest(guest) {
            g.counters().count_copy(domain.0, domain.0, bytes, dt);
        }
    }

    /// The writer of region `id` was held back `held` outside its guest (its device queue's
    /// fence signal waited for the prefetch copies): the prefetch protocol takes the hold out
    /// of the slack it measures.
    pub fn note_hold(&self, guest: GuestId, id: RegionId, held: Duration) {
        let (guest, id) = (guest.0, id.0);
        if let Ok(g) = self.guest(guest) {
            g.protocol().note_hold(RegionKey { guest, id }, held);
        }
    }

    /// Registers a guest and its window; its regions use `protocol` and may hold at most
    /// `limit` bytes of host and device memory.
    pub fn attach_guest(
        &self,
        guest: GuestId,
        window: Arc<SharedWindow>,
        protocol: Arc<dyn Coherence>,
        limit: u64,
    ) -> Result<Arc<GuestSvm>> {
        self.attach_guest_limited(guest, window, protocol, limit, u64::MAX)
    }

    /// Like [`attach_guest`](Self::attach_guest), the guest holding at most `max_regions`
    /// regions at once (`OutOfMemory` beyond).
    pub fn attach_guest_limited(
        &self,
        guest: GuestId,
        window: Arc<SharedWindow>,
        protocol: Arc<dyn Coherence>,
        limit: u64,
        max_regions: u64,
    ) -> Result<Arc<GuestSvm>> {
        let guest = guest.0;
        let mut guests = self.guests.write_or_recover();
        if guests.contains_key(&guest) {
            return Err(SvmError::BadArgument(format!(
                "guest {guest} already attached"
            )));
        }
        let g = Arc::new(GuestSvm::new(guest, window, limit, max_regions, protocol));
        guests.insert(guest, g.clone());
        Ok(g)
    }

    /// Removes a guest and frees every region it owns. Returns how many regions were freed.
    /// Only the guest's own table is touched: other guests' lookups never wait for it.
    pub fn detach_guest(&self, guest: GuestId) -> usize {
        let guest = guest.0;
        let g = self.guests.write_or_recover().remove(&guest);
        let Some(g) = g else {
            return 0;
        };
        let dropped = g.take_regions();
        for r in &dropped {
            g.protocol().forget(r.key);
        }
        dropped.len()
    }

    /// Guest `guest`'s window now belongs to another daemon (a VM guest migrated with its
    /// memory file): freeing its regions later forgets their window ranges without zeroing
    /// them.
    pub fn disown_window(&self, guest: GuestId) -> Result<()> {
        let guest = guest.0;
        self.guest(guest)?.disown_window();
        Ok(())
    }

    /// Charges `bytes` of memory a device holds for `guest` outside its regions (a worker
    /// process, GL objects) against the guest's memory limit, as region memory is:
    /// `OutOfMemory` past it. The charge is given back when the returned guard drops.
    pub fn charge(&self, guest: GuestId, bytes: u64) -> Result<MemoryCharge> {
        let g = self.guest(guest.0)?;
        g.charge_bytes(bytes)?;
        Ok(MemoryCharge {
            guest: Arc::downgrade(&g),
            bytes,
        })
    }

    fn guest(&self, guest: u64) -> Result<Arc<GuestSvm>> {
        self.guests
            .read_or_recover()
            .get(&guest)
            .cloned()
            .ok_or(SvmError::GuestNotAttached(GuestId(guest)))
    }

    fn region(&self, guest: u64, id: u64) -> Result<Arc<Region>> {
        self.guest(guest)
            .map_err(|_| SvmError::NoSuchRegion)?
            .region(id)
            .ok_or(SvmError::NoSuchRegion)
    }

    /// Allocates a region (no memory is committed until the first access); returns its id.
    pub fn alloc(&self, guest: GuestId, desc: AllocDesc) -> Result<(RegionId, RegionMeta)> {
        let guest = guest.0;
        let g = self.guest(guest)?;
        let (size, stride) = snapshot::layout_of(&desc)?;
        // Nothing the guest could ever back is promised: a region larger than its memory
        // limit is refused up front.
        if size > g.limit() {
            return Err(SvmError::OutOfMemory);
        }
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
        let region = Arc::new(Region::new(key, meta, g.clone()));
        g.insert_region(key.id, region)?;
        Ok((RegionId(key.id), meta))
    }

    /// Frees a region of `guest`.
    pub fn free(&self, guest: GuestId, id: RegionId) -> Result<()> {
        let (guest, id) = (guest.0, id.0);
        let r = self
            .guest(guest)
            .map_err(|_| SvmError::NoSuchRegion)?
            .remove_region(id)
            .ok_or(SvmError::NoSuchRegion)?;
        r.guest.protocol().forget(r.key);
        Ok(())
    }

    /// Offset of a region's replica in its owner's window (CPU accesses), if it has one.
    pub fn window_offset(&self, guest: GuestId, id: RegionId) -> Result<Option<u64>> {
        let (guest, id) = (guest.0, id.0);
        Ok(self.region(guest, id)?.window_offset())
    }

    /// The window of `guest` (host services read and write a guest's channel rings and
    /// payloads in it, bounds-checked).
    pub fn guest_window(&self, guest: GuestId) -> Result<Arc<SharedWindow>> {
        Ok(self.guest(guest.0)?.window().clone())
    }

    /// Metadata of a region of `guest`.
    pub fn meta(&self, guest: GuestId, id: RegionId) -> Result<RegionMeta> {
        let (guest, id) = (guest.0, id.0);
        Ok(self.region(guest, id)?.meta)
    }

    /// The access's byte range, checked against the region.
    fn range_of(meta: &RegionMeta, spec: &AccessSpec) -> Result<(u64, u64)> {
        match spec.offset.checked_add(spec.len) {
            Some(end) if spec.len > 0 && end <= meta.size => Ok((spec.offset, end)),
            _ => Err(SvmError::OutOfRange),
        }
    }

    fn info(&self, region: &Region, spec: &AccessSpec, retry: bool) -> Result<AccessInfo> {
        if !self.engine.topology().contains(spec.domain) {
            return Err(SvmError::UnknownDomain(spec.domain.0));
        }
        let range = Self::range_of(&region.meta, spec)?;
        Ok(AccessInfo {
            vdev: spec.vdev,
            domain: spec.domain,
            mode: spec.mode,
            range,
            whole: range == (0, region.meta.size),
            retry,
            compensates: spec.compensates,
        })
    }

    /// Runs one step of the protocol's begin (or end) under the region's lock.
    fn step(
        &self,
        region: &Arc<Region>,
        (a, reads_host): (&AccessInfo, bool),
        begin: bool,
        report: &mut AccessReport,
        started: &mut Vec<Arc<CopyTicket>>,
    ) -> Result<Step> {
        let protocol = region.guest.protocol().clone();
        let mut state = region.lock();
        let mut cx = RegionCtx::new(region, &mut state, &self.engine);
        // A device reading host memory in place reads a valid host replica where it is (a
        // lent one moved out into host memory first).
        let in_place = reads_host && a.mode == AccessMode::Read && protocol.reads_host_in_place();
        let moved;
        let a = match in_place.then(|| cx.host_domain_for_read(a.range)).flatten() {
            Some(domain) => {
                cx.state.host_reader = true;
                moved = AccessInfo { domain, ..*a };
                &moved
            }
            None => a,
        };
        let step = if begin {
            protocol.begin_access(&mut cx, a)?
        } else {
            protocol.end_access(&mut cx, a)?;
            Step::Done
        };
        if a.mode.writes() {
            cx.state.version += 1;
            if !begin {
                cx.state.cpu_wrote_last = a.domain == DomainId::GUEST_WINDOW;
            }
        }
        report.copies += cx.report.copies;
        report.bytes += cx.report.bytes;
        report.coherence += cx.report.coherence;
        report.compensation = cx.report.compensation;
        if a.domain == DomainId::GUEST_WINDOW && begin {
            report.window_offset = cx.window_offset().map(|w| w + a.range.0);
        }
        started.append(&mut cx.started);
        let inline = std::mem::take(&mut cx.inline);
        drop(state);
        for job in inline {
            dma::execute(&self.engine, job);
        }
        Ok(step)
    }

    fn finish(&self, mut report: AccessReport, t0: Instant) -> AccessReport {
        report.elapsed = t0.elapsed();
        self.counters
            .copies
            .fetch_add(report.copies as u64, Ordering::Relaxed);
        self.counters
            .coherence_ns
            .fetch_add(report.coherence.as_nanos() as u64, Ordering::Relaxed);
        report
    }

    /// Begins an access, waiting (on this thread) for copies in flight to the domain. For
    /// the guest window domain the report carries the window offset of the byte at
    /// `spec.offset`.
    pub fn begin_access(
        &self,
        guest: GuestId,
        id: RegionId,
        spec: &AccessSpec,
    ) -> Result<AccessReport> {
        let (guest, id) = (guest.0, id.0);
        self.counters.begin.fetch_add(1, Ordering::Relaxed);
        let region = self.region(guest, id)?;
        let t0 = Instant::now();
        let mut report = AccessReport::default();
        let mut retry = false;
        loop {
            let a = self.info(&region, spec, retry)?;
            match self.step(
                &region,
                (&a, spec.reads_host),
                true,
                &mut report,
                &mut Vec::new(),
            )? {
                Step::Done => return Ok(self.finish(report, t0)),
                Step::WaitFor(t) => {
                    t.wait();
                    retry = true;
                }
            }
        }
    }

    /// One step of a begin_access that never blocks: `Wait(ticket)` when a copy into the
    /// domain is in flight (ask again with `retry` set once the ticket is done). For device
    /// workers, which park the command instead of stalling other guests' work.
    pub fn begin_access_step(
        &self,
        guest: GuestId,
        id: RegionId,
        spec: &AccessSpec,
        retry: bool,
    ) -> Result<Progress> {
        let (guest, id) = (guest.0, id.0);
        if !retry {
            self.counters.begin.fetch_add(1, Ordering::Relaxed);
        }
        let region = self.region(guest, id)?;
        let t0 = Instant::now();
        let mut report = AccessReport::default();
        let a = self.info(&region, spec, retry)?;
        Ok(
            match self.step(
                &region,
                (&a, spec.reads_host),
                true,
                &mut report,
                &mut Vec::new(),
            )? {
                Step::Done => Progress::Done(self.finish(report, t0)),
                Step::WaitFor(t) => Progress::Wait(t),
            },
        )
    }

    /// Ends an access begun with [`begin_access`](Self::begin_access).
    pub fn end_access(&self, guest: GuestId, id: RegionId, spec: &AccessSpec) -> Result<EndReport> {
        let (guest, id) = (guest.0, id.0);
        self.counters.end.fetch_add(1, Ordering::Relaxed);
        let region = self.region(guest, id)?;
        let t0 = Instant::now();
        let mut report = AccessReport::default();
        let mut started = Vec::new();
        let a = self.info(&region, spec, false)?;
        self.step(
            &region,
            (&a, spec.reads_host),
            false,
            &mut report,
            &mut started,
        )?;
        Ok(EndReport {
            report: self.finish(report, t0),
            started,
        })
    }

    /// Number of regions and host bytes held by `guest`.
    pub fn guest_usage(&self, guest: GuestId) -> Result<(u64, u64)> {
        let guest = guest.0;
        let g = self.guest(guest)?;
        Ok((g.region_count() as u64, g.host_bytes()))
    }

    /// Lifetime counters.
    pub fn stats(&self) -> SvmStats {
        SvmStats {
            regions: self
                .guests
                .read_or_recover()
                .values()
                .map(|g| g.region_count() as u64)
                .sum(),
            begin_accesses: self.counters.begin.load(Ordering::Relaxed),
            end_accesses: self.counters.end.load(Ordering::Relaxed),
            copies: self.counters.copies.load(Ordering::Relaxed),
            coherence_ns: self.counters.coherence_ns.load(Ordering::Relaxed),
        }
    }
}

/// Memory a device holds for a guest outside its regions, charged against the guest's limit
/// ([`SvmManager::charge`]) until this drops.
#[derive(Debug)]
pub struct MemoryCharge {
    guest: std::sync::Weak<GuestSvm>,
    bytes: u64,
}

impl MemoryCharge {
    /// Bytes charged.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for MemoryCharge {
    fn drop(&mut self) {
        if let Some(g) = self.guest.upgrade() {
            g.release_bytes(self.bytes);
        }
    }
}
