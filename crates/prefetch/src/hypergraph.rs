//! The twin hypergraphs (paper §3.2, Figure 7) minus the region hashtable,
//! which lives in `region`.
//!
//! * Virtual layer: nodes are [`VDev`]s; a hyperedge ([`VirtualEdge`], id
//!   [`FlowId`]) is `writer -> set of readers`, keyed by that pair, and
//!   carries the R/W history counts, the smoothed slack and the per-flow
//!   prediction bookkeeping (miss counter, suspension flags).
//! * Physical layer: nodes are [`PDev`]s; a hyperedge ([`PhysicalEdge`]) is
//!   `writer pdev -> set of reader pdevs` and carries the smoothed data size.
//! * Per-pair bandwidth: one table keyed by `(src pdev, dst pdev)` shared by
//!   all physical hyperedges that use the pair (a bus is a property of the
//!   pair, not of a flow), holding the smoothed bandwidth and its maximum.
//! * `writer_recent`: for each writer vdev, the flow most recently observed
//!   (the source of zero-shot predictions).
//!
//! All tables grow on demand (`Vec` + `HashMap`); edges are never removed.

use std::collections::HashMap;
use std::mem::size_of;

use crate::smoothing::Ewma;
use crate::{PDev, VDev};

/// Identifier of a virtual hyperedge (a data flow `writer -> readers`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FlowId(pub u32);

/// Identifier of a physical hyperedge.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct PhysEdgeId(pub(crate) u32);

/// A hyperedge of the virtual layer.
#[derive(Debug)]
pub(crate) struct VirtualEdge {
    pub(crate) writer: VDev,
    /// Sorted, deduplicated.
    pub(crate) readers: Vec<VDev>,
    /// Closed cycles (writes followed by at least one read).
    pub(crate) cycles: u64,
    /// Distinct reader accesses recorded in those cycles.
    pub(crate) reads: u64,
    /// Smoothed slack (seconds) between a write's end and the first read.
    pub(crate) slack: Ewma,
    /// Physical hyperedge most recently observed together with this flow.
    pub(crate) last_phys: Option<PhysEdgeId>,
    pub(crate) consecutive_misses: u32,
    /// Current run of consecutive hits (real or shadow plans).
    pub(crate) consecutive_hits: u32,
    pub(crate) miss_suspended: bool,
    pub(crate) bw_suspended: bool,
    /// `(source, target)` pairs of the flow's most recent plan.
    pub(crate) plan_pairs: Vec<(PDev, PDev)>,
    pub(crate) hits: u64,
    pub(crate) misses: u64,
}

impl VirtualEdge {
    pub(crate) fn suspended(&self) -> bool {
        self.miss_suspended || self.bw_suspended
    }

    /// Its last [`CONFIDENT_HITS`] scored reads (of real or shadow plans) were hits: a
    /// prefetch of this flow moves bytes that are read anyway, so a low bandwidth does not
    /// make it waste (see [`crate::Config::bandwidth_floor`]).
    pub(crate) fn confident(&self) -> bool {
        self.consecutive_hits >= CONFIDENT_HITS
    }
}

/// Hits in a row after which a flow's prefetches are no longer suspended for a low
/// bandwidth.
pub(crate) const CONFIDENT_HITS: u32 = 8;

/// Weight of the newest copy in a pair's steady bandwidth, the one the bandwidth floor is
/// checked on (about the last ten copies). One 1 MiB copy's rate moves by 2-3x with where
/// the copying thread runs and what is in the caches (5-25 GB/s measured for the same pair
/// on the 2-core machine, nothing else running): with the prediction's `alpha` (0.5), two
/// slow copies in a row fell under half of the largest value ever smoothed and suspended a
/// flow whose prefetches all hit, round after round.
pub(crate) const STEADY_ALPHA: f64 = 0.1;

/// Copies before a pair's steady bandwidth counts as its maximum (while it still leans on
/// its first samples).
pub(crate) const STEADY_WARMUP: u64 = 8;

/// A hyperedge of the physical layer.
#[derive(Debug)]
pub(crate) struct PhysicalEdge {
    #[allow(dead_code)] // kept for debugging / completeness of the model
    pub(crate) writer: PDev,
    /// Sorted, deduplicated.
    pub(crate) readers: Vec<PDev>,
    pub(crate) cycles: u64,
    /// Smoothed size in bytes of the data written in closed cycles.
    pub(crate) size: Ewma,
}

/// Bandwidth statistics of one `(src, dst)` pair.
#[derive(Debug, Default)]
pub(crate) struct PairBandwidth {
    /// Smoothed bytes per second (the configured `alpha`): predicts a copy's time.
    pub(crate) smoothed: Ewma,
    /// Bytes per second smoothed over more copies ([`STEADY_ALPHA`]): the bandwidth floor's.
    pub(crate) steady: Ewma,
    /// Largest steady value reached after [`STEADY_WARMUP`] copies.
    pub(crate) max: f64,
}

/// True when the pair has been measured (its steady bandwidth past its warm-up) and its
/// steady bandwidth is below `floor * max`.
pub(crate) fn pair_low(
    bandwidth: &HashMap<(PDev, PDev), PairBandwidth>,
    pair: (PDev, PDev),
    floor: f64,
) -> bool {
    match bandwidth
        .get(&pair)
        .filter(|b| b.steady.samples() >= STEADY_WARMUP)
        .and_then(|b| b.steady.get().map(|s| (s, b.max)))
    {
        Some((s, max)) => s < floor * max,
        None => false,
    }
}

/// The two layers plus the bandwidth table and the writer -> flow index.
#[derive(Debug, Default)]
pub(crate) struct TwinHypergraphs {
    pub(crate) vedges: Vec<VirtualEdge>,
    vindex: HashMap<(VDev, Vec<VDev>), FlowId>,
    pub(crate) pedges: Vec<PhysicalEdge>,
    pindex: HashMap<(PDev, Vec<PDev>), PhysEdgeId>,
    pub(crate) bandwidth: HashMap<(PDev, PDev), PairBandwidth>,
    pub(crate) writer_recent: HashMap<VDev, FlowId>,
}

impl TwinHypergraphs {
    /// Finds or creates the virtual hyperedge `writer -> readers`
    /// (`readers` must be sorted and deduplicated). `None` only if 2^32
    /// edges already exist.
    pub(crate) fn intern_virtual(&mut self, writer: VDev, readers: Vec<VDev>) -> Option<FlowId> {
        let key = (writer, readers);
        if let Some(id) = self.vindex.get(&key) {
            return Some(*id);
        }
        let id = FlowId(u32::try_from(self.vedges.len()).ok()?);
        self.vedges.push(VirtualEdge {
            writer,
            readers: key.1.clone(),
            cycles: 0,
            reads: 0,
            slack: Ewma::new(),
            last_phys: None,
            consecutive_misses: 0,
            consecutive_hits: 0,
            miss_suspended: false,
            bw_suspended: false,
            plan_pairs: Vec::new(),
            hits: 0,
            misses: 0,
        });
        self.vindex.insert(key, id);
        Some(id)
    }

    /// Finds or creates the physical hyperedge `writer -> readers`
    /// (`readers` must be sorted and deduplicated).
    pub(crate) fn intern_physical(
        &mut self,
        writer: PDev,
        readers: Vec<PDev>,
    ) -> Option<PhysEdgeId> {
        let key = (writer, readers);
        if let Some(id) = self.pindex.get(&key) {
            return Some(*id);
        }
        let id = PhysEdgeId(u32::try_from(self.pedges.len()).ok()?);
        self.pedges.push(PhysicalEdge {
            writer,
            readers: key.1.clone(),
            cycles: 0,
            size: Ewma::new(),
        });
        self.pindex.insert(key, id);
        Some(id)
    }

    pub(crate) fn vedge(&self, id: FlowId) -> Option<&VirtualEdge> {
        self.vedges.get(id.0 as usize)
    }

    pub(crate) fn vedge_mut(&mut self, id: FlowId) -> Option<&mut VirtualEdge> {
        self.vedges.get_mut(id.0 as usize)
    }

    pub(crate) fn pedge(&self, id: PhysEdgeId) -> Option<&PhysicalEdge> {
        self.pedges.get(id.0 as usize)
    }

    pub(crate) fn pedge_mut(&mut self, id: PhysEdgeId) -> Option<&mut PhysicalEdge> {
        self.pedges.get_mut(id.0 as usize)
    }

    /// Smoothed bandwidth of a pair in bytes per second.
    pub(crate) fn predicted_bw(&self, pair: (PDev, PDev)) -> Option<f64> {
        self.bandwidth.get(&pair).and_then(|b| b.smoothed.get())
    }

    /// Feeds one bandwidth sample (bytes per second) into a pair.
    pub(crate) fn record_bandwidth(&mut self, alpha: f64, pair: (PDev, PDev), sample: f64) {
        let b = self.bandwidth.entry(pair).or_default();
        b.smoothed.update(alpha, sample);
        let s = b.steady.update(STEADY_ALPHA, sample);
        if b.steady.samples() >= STEADY_WARMUP && s > b.max {
            b.max = s;
        }
    }

    /// Approximate heap + inline bytes held by the hypergraphs.
    pub(crate) fn metadata_bytes(&self) -> usize {
        let mut n = vec_bytes(&self.vedges) + vec_bytes(&self.pedges);
        n += self
            .vedges
            .iter()
            .map(|e| vec_bytes(&e.readers) + vec_bytes(&e.plan_pairs))
            .sum::<usize>();
        n += self
            .pedges
            .iter()
            .map(|e| vec_bytes(&e.readers))
            .sum::<usize>();
        n += map_bytes(&self.vindex) + self.vindex.keys().map(|k| vec_bytes(&k.1)).sum::<usize>();
        n += map_bytes(&self.pindex) + self.pindex.keys().map(|k| vec_bytes(&k.1)).sum::<usize>();
        n += map_bytes(&self.bandwidth) + map_bytes(&self.writer_recent);
        n
    }
}

/// Bytes of a `Vec`'s allocation.
pub(crate) fn vec_bytes<T>(v: &Vec<T>) -> usize {
    v.capacity() * size_of::<T>()
}

/// Approximate bytes of a `HashMap`'s table: one entry plus one control byte
/// per slot of capacity (the real table rounds buckets up to a power of two,
/// so this is a slight underestimate at worst by a factor below 2).
pub(crate) fn map_bytes<K, V>(m: &HashMap<K, V>) -> usize {
    m.capacity() * (size_of::<(K, V)>() + 1)
}
