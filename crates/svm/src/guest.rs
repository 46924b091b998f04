//! Per-guest SVM state: the guest's window and its allocator, its region table, its id
//! counter, its memory accounting and limits, and the coherence protocol its regions use.
//!
//! Each guest has its own region table: a lookup takes only its own guest's lock, so guests
//! never contend on one table, and a departed guest's table is dropped whole (no scan of
//! other guests' regions).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};

use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;
use virtsoc_proto::counters::{AtomicCounters, Counters};

use virtsoc_proto::SharedWindow;
use virtsoc_sync::{LockExt, RwLockExt};

use crate::alloc::RangeAllocator;
use crate::coherence::Coherence;
use crate::region::Region;
use crate::{Result, SvmError};

/// One guest's view of the SVM manager.
pub struct GuestSvm {
    id: u64,
    window: Arc<SharedWindow>,
    alloc: Mutex<RangeAllocator>,
    next_region: AtomicU64,
    host_bytes: AtomicU64,
    limit: u64,
    /// The guest's regions by id.
    regions: RwLock<HashMap<u64, Arc<Region>>>,
    /// Most regions the guest may hold at once.
    max_regions: u64,
    protocol: Arc<dyn Coherence>,
    counters: GuestCounters,
    /// The window now belongs to another daemon (a VM guest migrated with its memory file):
    /// ranges given back are forgotten, never zeroed.
    disowned: std::sync::atomic::AtomicBool,
}

/// Copies on one link of the ledger.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct LinkCount {
    /// Number of copies.
    pub copies: u64,
    /// Bytes copied.
    pub bytes: u64,
    /// Time spent copying, in nanoseconds.
    pub ns: u64,
}

/// Per-guest counters, for the benchmarks and the stats request: the record declared once in
/// [`virtsoc_proto::counters`], counted as atomics (reached through `Deref`, so
/// `counters.copies.fetch_add(..)` counts), and the copy ledger.
///
/// The prediction scores (`hits`, `misses`) are the protocol's own ([`GuestSvm::snapshot`]);
/// the request's gauges (`metadata_bytes`, `ledger_links`) are added by whoever sends them.
#[derive(Debug, Default)]
pub struct GuestCounters {
    counts: AtomicCounters,
    /// Every copy by link (source domain, destination domain); a device's own copies are on
    /// the link from its domain to itself.
    ledger: Mutex<BTreeMap<(u32, u32), LinkCount>>,
}

impl std::ops::Deref for GuestCounters {
    type Target = AtomicCounters;

    fn deref(&self) -> &AtomicCounters {
        &self.counts
    }
}

impl GuestCounters {
    /// Counts one copy of `bytes` from domain `src` to `dst` that took `dt`: a coherence
    /// copy, or (`src == dst`) a device's own copy.
    pub fn count_copy(&self, src: u32, dst: u32, bytes: u64, dt: Duration) {
        let ns = dt.as_nanos() as u64;
        let c = &self.counts;
        let (n, b, t) = if src == dst {
            (&c.device_copies, &c.device_copy_bytes, &c.device_copy_ns)
        } else {
            (&c.copies, &c.copy_bytes, &c.copy_ns)
        };
        n.fetch_add(1, Ordering::Relaxed);
        b.fetch_add(bytes, Ordering::Relaxed);
        t.fetch_add(ns, Ordering::Relaxed);
        let mut l = self.ledger.lock_or_recover();
        let e = l.entry((src, dst)).or_default();
        e.copies += 1;
        e.bytes += bytes;
        e.ns += ns;
    }

    /// The ledger: copies per (source, destination) domain.
    pub fn ledger(&self) -> Vec<((u32, u32), LinkCount)> {
        let l = self.ledger.lock_or_recover();
        l.iter().map(|(k, v)| (*k, *v)).collect()
    }

    /// Reads all counters.
    pub fn snapshot(&self) -> Counters {
        self.counts.load()
    }
}

impl std::fmt::Debug for GuestSvm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuestSvm")
            .field("id", &self.id)
            .field("protocol", &self.protocol.name())
            .finish()
    }
}

impl GuestSvm {
    pub(crate) fn new(
        id: u64,
        window: Arc<SharedWindow>,
        limit: u64,
        max_regions: u64,
        protocol: Arc<dyn Coherence>,
    ) -> Self {
        let l = window.layout();
        GuestSvm {
            id,
            alloc: Mutex::new(RangeAllocator::new(
                l.data_offset(),
                l.data_size(),
                virtsoc_proto::window_layout::PAGE,
            )),
            window,
            next_region: AtomicU64::new(1),
            host_bytes: AtomicU64::new(0),
            limit,
            regions: RwLock::new(HashMap::new()),
            max_regions,
            protocol,
            counters: GuestCounters::default(),
            disowned: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The guest's counters.
    pub fn counters(&self) -> &GuestCounters {
        &self.counters
    }

    /// The counters, with the prediction scores as the guest's own predictor counted them
    /// (each read scored once per write; shadow predictions of suspended flows excluded).
    pub fn snapshot(&self) -> Counters {
        let mut s = self.counters.snapshot();
        (s.hits, s.misses) = self.protocol.scores();
        s
    }

    /// The guest's id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The guest's window.
    pub fn window(&self) -> &Arc<SharedWindow> {
        &self.window
    }

    /// The coherence protocol of this guest's regions.
    pub fn protocol(&self) -> &Arc<dyn Coherence> {
        &self.protocol
    }

    /// Bytes of host and device memory held by the guest's replicas.
    pub fn host_bytes(&self) -> u64 {
        self.host_bytes.load(Ordering::Relaxed)
    }

    /// Bytes of host and device memory the guest's replicas may hold.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Most regions the guest may hold at once.
    pub fn max_regions(&self) -> u64 {
        self.max_regions
    }

    /// Number of regions the guest holds.
    pub fn region_count(&self) -> usize {
        self.regions.read_or_recover().len()
    }

    /// Region `id` of this guest.
    pub(crate) fn region(&self, id: u64) -> Option<Arc<Region>> {
        self.regions.read_or_recover().get(&id).cloned()
    }

    /// Adds a region, unless the guest already holds its most (`OutOfMemory`).
    pub(crate) fn insert_region(&self, id: u64, region: Arc<Region>) -> Result<()> {
        let mut t = self.regions.write_or_recover();
        if t.len() as u64 >= self.max_regions {
            return Err(SvmError::OutOfMemory);
        }
        t.insert(id, region);
        Ok(())
    }

    /// Removes region `id` from the table.
    pub(crate) fn remove_region(&self, id: u64) -> Option<Arc<Region>> {
        let mut t = self.regions.write_or_recover();
        let r = t.remove(&id);
        if t.is_empty() {
            // A guest that freed everything gives its table's memory back too.
            t.shrink_to_fit();
        }
        r
    }

    /// Empties the table (the guest is leaving): its regions, for the caller to drop. This
    /// also breaks the cycle between the guest and its regions (each region refers to its
    /// guest).
    pub(crate) fn take_regions(&self) -> Vec<Arc<Region>> {
        let t = std::mem::take(&mut *self.regions.write_or_recover());
        t.into_values().collect()
    }

    /// The ids of the guest's regions (in no order).
    pub(crate) fn region_ids(&self) -> Vec<u64> {
        self.regions.read_or_recover().keys().copied().collect()
    }

    /// Adds a region under an id that must be free (imports), within the guest's limits.
    pub(crate) fn insert_region_new(&self, id: u64, region: Arc<Region>) -> Result<()> {
        let mut t = self.regions.write_or_recover();
        if t.contains_key(&id) {
            return Err(SvmError::BadArgument(format!("region {id} exists")));
        }
        if t.len() as u64 >= self.max_regions {
            return Err(SvmError::OutOfMemory);
        }
        t.insert(id, region);
        Ok(())
    }

    /// The id the next allocation gets.
    pub(crate) fn peek_next_id(&self) -> u64 {
        self.next_region.load(Ordering::Relaxed)
    }

    /// Makes later allocations take ids from `next` on (never lowers the counter).
    pub(crate) fn raise_next_id(&self, next: u64) {
        self.next_region.fetch_max(next, Ordering::Relaxed);
    }

    pub(crate) fn next_id(&self) -> u64 {
        self.next_region.fetch_add(1, Ordering::Relaxed)
    }

    pub(crate) fn charge_bytes(&self, n: u64) -> Result<()> {
        let mut cur = self.host_bytes.load(Ordering::Relaxed);
        loop {
            let new = cur.checked_add(n).filter(|v| *v <= self.limit);
            let Some(new) = new else {
                return Err(SvmError::OutOfMemory);
            };
            match self.host_bytes.compare_exchange_weak(
                cur,
                new,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Ok(()),
                Err(v) => cur = v,
            }
        }
    }

    /// From now on ranges given back are not zeroed: the window belongs to someone else.
    pub(crate) fn disown_window(&self) {
        self.disowned.store(true, Ordering::SeqCst);
    }

    pub(crate) fn release_bytes(&self, n: u64) {
        self.host_bytes.fetch_sub(n, Ordering::Relaxed);
    }

    pub(crate) fn alloc_window(&self, size: u64) -> Result<u64> {
        let mut a = self.alloc.lock_or_recover();
        a.alloc(size).ok_or(SvmError::OutOfMemory)
    }

    /// Gives a window range back, zeroing it (by punching a hole in the file, so the memory
    /// goes back to the host too) so the next region starts from zeroes.
    pub(crate) fn release_window(&self, offset: u64, size: u64) {
        let mut a = self.alloc.lock_or_recover();
        if self.disowned.load(Ordering::SeqCst) {
            a.free(offset, size);
            return;
        }
        let len = a.round(size).unwrap_or(size);
        let punched = rustix::fs::fallocate(
            self.window.fd(),
            rustix::fs::FallocateFlags::PUNCH_HOLE | rustix::fs::FallocateFlags::KEEP_SIZE,
            offset,
            len,
        );
        if punched.is_err() {
            let _ = self.window.zero(offset, len);
        }
        a.free(offset, size);
    }
}
