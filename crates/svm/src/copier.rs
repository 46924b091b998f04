//! The copy engine: moves bytes between domains on the cheapest path and measures the
//! bandwidth of every (source, destination) pair it uses.
//!
//! Costs come from measured bandwidth (single exponential smoothing, alpha 0.5) where a pair
//! has been used, and from a nominal bandwidth otherwise. Routing is Dijkstra from every domain
//! that holds a valid replica to the destination, so restricted topologies copy in hops.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::{Duration, Instant};
use virtsoc_sync::{LockExt, RwLockExt};

use crate::backing::{copy_range, Backing, DeviceAllocator};
use crate::domain::{DomainId, Topology};
use crate::Result;

/// Bandwidth assumed for a link that has not been measured yet (bytes/s).
pub const NOMINAL_BANDWIDTH: f64 = 8.0e9;
/// Fixed cost charged per hop when routing (setup, locking, cache effects).
pub const HOP_OVERHEAD: Duration = Duration::from_micros(50);
/// Smoothing factor for bandwidth estimates.
pub const ALPHA: f64 = 0.5;

/// Measurements of one directed pair.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct LinkStats {
    /// Copies made on the link.
    pub copies: u64,
    /// Bytes those copies moved.
    pub bytes: u64,
    /// Time the link spent copying, in nanoseconds.
    pub busy_ns: u64,
    /// Smoothed bandwidth, bytes/s.
    pub bandwidth: f64,
    /// Largest single-copy bandwidth seen, bytes/s.
    pub max_bandwidth: f64,
}

/// One measured link, for reports.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LinkReport {
    /// Name of the source domain.
    pub src: String,
    /// Name of the destination domain.
    pub dst: String,
    #[serde(flatten)]
    /// The link's measurements.
    pub stats: LinkStats,
}

/// Copies bytes and keeps the per-pair measurements.
pub struct CopyEngine {
    topo: Arc<Topology>,
    /// Told about every measured copy (their bandwidth models drive prefetch suspension):
    /// one prefetch engine per guest, held weakly so a departed guest's goes away.
    observers: Mutex<Vec<Weak<virtsoc_prefetch::PrefetchEngine>>>,
    /// Domains whose replicas live in a device's own memory.
    allocators: RwLock<HashMap<DomainId, Arc<dyn DeviceAllocator>>>,
    /// Domains whose host replicas are shared memfds (`HostBuf::try_shared`).
    shared: RwLock<std::collections::HashSet<DomainId>>,
    links: Mutex<HashMap<(DomainId, DomainId), LinkStats>>,
}

impl std::fmt::Debug for CopyEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CopyEngine")
            .field("domains", &self.topo.domains().len())
            .finish()
    }
}

impl CopyEngine {
    /// A new engine over `topo`.
    pub fn new(topo: Arc<Topology>) -> Self {
        CopyEngine {
            topo,
            observers: Mutex::new(Vec::new()),
            allocators: RwLock::new(HashMap::new()),
            shared: RwLock::new(std::collections::HashSet::new()),
            links: Mutex::new(HashMap::new()),
        }
    }

    /// Tells `engine` about every measured copy from now on (until it is dropped).
    pub fn observe(&self, engine: &Arc<virtsoc_prefetch::PrefetchEngine>) {
        let mut o = self.observers.lock_or_recover();
        o.retain(|w| w.strong_count() > 0);
        o.push(Arc::downgrade(engine));
    }

    /// Places `domain`'s replicas in device memory from `alloc`.
    pub fn set_allocator(&self, domain: DomainId, alloc: Arc<dyn DeviceAllocator>) {
        self.allocators.write_or_recover().insert(domain, alloc);
    }

    /// The allocator of `domain`, if its replicas live in device memory.
    pub fn allocator(&self, domain: DomainId) -> Option<Arc<dyn DeviceAllocator>> {
        self.allocators.read_or_recover().get(&domain).cloned()
    }

    /// Makes `domain`'s host replicas shared memfds from now on.
    pub fn set_shared_memory(&self, domain: DomainId) {
        self.shared.write_or_recover().insert(domain);
    }

    /// Whether `domain`'s host replicas are shared memfds.
    pub fn shares_memory(&self, domain: DomainId) -> bool {
        self.shared.read_or_recover().contains(&domain)
    }

    /// The topology.
    pub fn topology(&self) -> &Topology {
        &self.topo
    }

    /// Smoothed bandwidth of a pair, if measured.
    pub fn bandwidth(&self, src: DomainId, dst: DomainId) -> Option<f64> {
        let links = self.links.lock_or_recover();
        links
            .get(&(src, dst))
            .map(|s| s.bandwidth)
            .filter(|b| *b > 0.0)
    }

    /// Predicted time to copy `bytes` from `src` to `dst` directly, from the link's smoothed
    /// bandwidth (what the prefetch engine plans with), or [`NOMINAL_BANDWIDTH`] unmeasured.
    pub fn estimate(&self, src: DomainId, dst: DomainId, bytes: u64) -> Duration {
        let bw = self
            .bandwidth(src, dst)
            .unwrap_or(NOMINAL_BANDWIDTH)
            .max(1.0);
        Duration::from_secs_f64(bytes as f64 / bw)
    }

    /// Cost of one hop for routing: from the best bandwidth the link has shown (its
    /// capability, not its latest noise), and a link never measured is assumed as good as the
    /// best link measured so far — so two measured hops never look cheaper than one untried or
    /// momentarily slow direct link just because of measurement noise.
    fn hop_cost(
        links: &HashMap<(DomainId, DomainId), LinkStats>,
        src: DomainId,
        dst: DomainId,
        bytes: u64,
    ) -> f64 {
        let best_any = links
            .values()
            .map(|s| s.max_bandwidth)
            .fold(NOMINAL_BANDWIDTH, f64::max);
        let bw = links
            .get(&(src, dst))
            .map(|s| s.max_bandwidth)
            .filter(|b| *b > 0.0)
            .unwrap_or(best_any)
            .max(1.0);
        bytes as f64 / bw + HOP_OVERHEAD.as_secs_f64()
    }

    /// Cheapest path from any of `sources` to `dst` (inclusive of both ends), `None` when
    /// unreachable. A single-element path means `dst` is itself a source.
    pub fn route(&self, sources: &[DomainId], dst: DomainId, bytes: u64) -> Option<Vec<DomainId>> {
        if sources.contains(&dst) {
            return Some(vec![dst]);
        }
        let links = self.links.lock_or_recover().clone();
        // A direct link from a source is always taken when there is one: every path into
        // `dst` ends with a copy into it, so a relay only adds a copy (and an unmeasured
        // relay would look cheap only because it was never measured).
        let direct = sources
            .iter()
            .filter(|s| self.topo.linked(**s, dst))
            .min_by(|a, b| {
                Self::hop_cost(&links, **a, dst, bytes)
                    .total_cmp(&Self::hop_cost(&links, **b, dst, bytes))
            });
        if let Some(s) = direct {
            return Some(vec![*s, dst]);
        }
        let n = self.topo.domains().len();
        let mut dist = vec![f64::INFINITY; n];
        let mut prev: Vec<Option<DomainId>> = vec![None; n];
        let mut done = vec![false; n];
        for s in sources.iter().filter(|s| self.topo.contains(**s)) {
            dist[s.0 as usize] = 0.0;
        }
        while let Some(u) = (0..n)
            .filter(|&i| !done[i] && dist[i].is_finite())
            .min_by(|&a, &b| dist[a].total_cmp(&dist[b]))
        {
            done[u] = true;
            if u == dst.0 as usize {
                break;
            }
            // Bytes are relayed only through host RAM, never through another device's memory
            // or the guest's window (their replicas are their owners', and their links may
            // look cheaper only because they were never measured).
            let relay = dist[u] == 0.0
                || self
                    .topo
                    .info(DomainId(u as u32))
                    .is_some_and(|i| i.kind == crate::domain::DomainKind::HostRam);
            if !relay {
                continue;
            }
            for v in 0..n {
                let (du, dv) = (DomainId(u as u32), DomainId(v as u32));
                if done[v] || !self.topo.linked(du, dv) {
                    continue;
                }
                let c = dist[u] + Self::hop_cost(&links, du, dv, bytes);
                if c < dist[v] {
                    dist[v] = c;
                    prev[v] = Some(du);
                }
            }
        }
        if !dist.get(dst.0 as usize)?.is_finite() {
            return None;
        }
        let mut path = vec![dst];
        let mut cur = dst;
        while let Some(p) = prev[cur.0 as usize] {
            path.push(p);
            cur = p;
        }
        path.reverse();
        Some(path)
    }

    /// Copies bytes `range` between two replicas; records the bandwidth when `measure`
    /// (copies into never-touched memory measure page faults, not the link). For a copy
    /// whose reader comes at once (a fetch in a begin_access): through the caches.
    pub fn copy(
        &self,
        src_dom: DomainId,
        src: &Backing,
        dst_dom: DomainId,
        dst: &Backing,
        range: (u64, u64),
        measure: bool,
    ) -> Result<Duration> {
        self.copy_as(src_dom, src, dst_dom, dst, range, (measure, false))
    }

    /// [`copy`](Self::copy) for a copy made ahead of its reader (a prefetch): from
    /// [`crate::stream::STREAM_MIN`] bytes between host replicas it bypasses the CPU caches,
    /// as a device's DMA engine does (see [`crate::stream`]).
    pub fn copy_ahead(
        &self,
        src_dom: DomainId,
        src: &Backing,
        dst_dom: DomainId,
        dst: &Backing,
        range: (u64, u64),
        measure: bool,
    ) -> Result<Duration> {
        self.copy_as(src_dom, src, dst_dom, dst, range, (measure, true))
    }

    fn copy_as(
        &self,
        src_dom: DomainId,
        src: &Backing,
        dst_dom: DomainId,
        dst: &Backing,
        range: (u64, u64),
        (measure, stream): (bool, bool),
    ) -> Result<Duration> {
        let len = range.1.saturating_sub(range.0);
        let t0 = Instant::now();
        copy_range(src, dst, range.0, len, stream)?;
        let dt = t0.elapsed();
        if measure {
            self.record(src_dom, dst_dom, len, dt);
        } else {
            self.count(src_dom, dst_dom, len, dt);
        }
        Ok(dt)
    }

    fn count(&self, src: DomainId, dst: DomainId, len: u64, dt: Duration) {
        let mut links = self.links.lock_or_recover();
        let s = links.entry((src, dst)).or_default();
        s.copies += 1;
        s.bytes += len;
        s.busy_ns += dt.as_nanos() as u64;
    }

    /// Records a copy done elsewhere (e.g. by a device's own DMA).
    pub fn record(&self, src: DomainId, dst: DomainId, len: u64, dt: Duration) {
        let observers: Vec<_> = self
            .observers
            .lock_or_recover()
            .iter()
            .filter_map(Weak::upgrade)
            .collect();
        for o in observers {
            o.on_copy_complete(
                virtsoc_prefetch::PDev(src.0),
                virtsoc_prefetch::PDev(dst.0),
                len,
                dt,
            );
        }
        let bw = len as f64 / dt.as_secs_f64().max(1e-9);
        let mut links = self.links.lock_or_recover();
        let s = links.entry((src, dst)).or_default();
        s.bandwidth = if s.bandwidth == 0.0 {
            bw
        } else {
            ALPHA * bw + (1.0 - ALPHA) * s.bandwidth
        };
        s.max_bandwidth = s.max_bandwidth.max(bw);
        s.copies += 1;
        s.bytes += len;
        s.busy_ns += dt.as_nanos() as u64;
    }

    /// All measured links, sorted.
    pub fn report(&self) -> Vec<LinkReport> {
        let links = self.links.lock_or_recover();
        let sorted: BTreeMap<_, _> = links.iter().map(|(k, v)| (*k, *v)).collect();
        let name = |d: DomainId| {
            self.topo
                .info(d)
                .map(|i| i.name.clone())
                .unwrap_or_else(|| format!("domain-{}", d.0))
        };
        sorted
            .into_iter()
            .map(|((s, d), stats)| LinkReport {
                src: name(s),
                dst: name(d),
                stats,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backing::HostBuf;

    #[test]
    fn routes_direct_on_full_mesh_and_in_hops_when_restricted() {
        let mut t = Topology::new();
        let a = t.add_device_domain("a");
        let b = t.add_device_domain("b");
        let e = CopyEngine::new(Arc::new(t.clone()));
        assert_eq!(e.route(&[a], b, 1 << 20).unwrap(), vec![a, b]);
        assert_eq!(e.route(&[a, b], b, 1).unwrap(), vec![b]);

        t.add_link(a, DomainId::HOST_RAM);
        t.add_link(DomainId::HOST_RAM, b);
        let e = CopyEngine::new(Arc::new(t));
        assert_eq!(
            e.route(&[a], b, 1 << 20).unwrap(),
            vec![a, DomainId::HOST_RAM, b]
        );
        assert!(e.route(&[a], DomainId::GUEST_WINDOW, 1).is_none());
    }

    #[test]
    fn an_unmeasured_direct_link_beats_two_measured_hops() {
        let mut t = Topology::new();
        let a = t.add_device_domain("a");
        let b = t.add_device_domain("b");
        let e = CopyEngine::new(Arc::new(t));
        // Fast measured hops through the window; a -> b never measured.
        let w = DomainId::GUEST_WINDOW;
        e.record(a, w, 1 << 24, Duration::from_micros(800));
        e.record(w, b, 1 << 24, Duration::from_micros(800));
        assert_eq!(e.route(&[a], b, 1 << 24).unwrap(), vec![a, b]);
    }

    #[test]
    fn a_noisy_direct_link_still_beats_two_hops() {
        let mut t = Topology::new();
        let a = t.add_device_domain("a");
        let b = t.add_device_domain("b");
        let e = CopyEngine::new(Arc::new(t));
        let w = DomainId::GUEST_WINDOW;
        e.record(a, w, 1 << 24, Duration::from_micros(800));
        e.record(w, b, 1 << 24, Duration::from_micros(800));
        e.record(a, b, 1 << 24, Duration::from_micros(800));
        // One slow copy (the machine was busy) drags the smoothed bandwidth down.
        e.record(a, b, 1 << 24, Duration::from_micros(8000));
        assert_eq!(e.route(&[a], b, 1 << 24).unwrap(), vec![a, b]);
    }

    #[test]
    fn bytes_are_never_relayed_through_another_device() {
        let mut t = Topology::new();
        let a = t.add_device_domain("a");
        let b = t.add_device_domain("b");
        let _c = t.add_device_domain("c");
        let e = CopyEngine::new(Arc::new(t));
        // a -> b measured slow (an upload, say); the hops through c or the window were never
        // measured and would look cheaper, but c is a device and the window the guest's.
        e.record(a, b, 1 << 24, Duration::from_millis(20));
        let path = e.route(&[a], b, 1 << 24).unwrap();
        assert!(
            path == vec![a, b] || path == vec![a, DomainId::HOST_RAM, b],
            "{path:?}"
        );
    }

    #[test]
    fn copies_and_measures() {
        let mut t = Topology::new();
        let a = t.add_device_domain("a");
        let e = CopyEngine::new(Arc::new(t));
        let (x, y) = (HostBuf::zeroed(1 << 16), HostBuf::zeroed(1 << 16));
        x.lock()[5] = 42;
        e.copy(
            a,
            &Backing::Host(x),
            DomainId::HOST_RAM,
            &Backing::Host(y.clone()),
            (0, 1 << 16),
            true,
        )
        .unwrap();
        assert_eq!(y.lock()[5], 42);
        let r = e.report();
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].stats.copies, 1);
        assert!(r[0].stats.bandwidth > 0.0);
        assert!(e.bandwidth(a, DomainId::HOST_RAM).is_some());
        assert!(e.bandwidth(DomainId::HOST_RAM, a).is_none());
    }
}
