//! [`PrefetchEngine`]: the thread-safe façade of the prefetch protocol
//! (paper §3.3). It owns the whole mutable state (twin hypergraphs, region
//! hashtable, counters) behind one `Mutex`, turns access events into
//! [`PrefetchPlan`]s, scores reads against them ([`ReadOutcome`]), and
//! suspends/resumes flows.
//!
//! # Event protocol
//!
//! * [`PrefetchEngine::on_begin_access`] for every access; only reads matter.
//! * [`PrefetchEngine::on_end_access`] for every access; only writes matter.
//!   A write end closes the region's previous cycle into the hypergraphs and
//!   returns the plan for the data just written.
//! * [`PrefetchEngine::on_copy_complete`] for every copy between physical
//!   devices, prefetch *and* on-demand: bandwidth of a pair can only recover
//!   from a suspension if copies on it keep being reported.
//!
//! # Prediction details
//!
//! * Slack of a cycle = time from the write's end to the *first* read's
//!   begin. It is fed into the virtual hyperedge when the cycle is closed
//!   (at the next write of the region), because only then is the reader set,
//!   and therefore the hyperedge, known.
//! * Targets are the reader pdevs of the physical hyperedge, minus the
//!   writer's own pdev (a reader there needs no copy; a read on the source
//!   pdev is always scored a hit).
//! * `predicted_copy` = Σ over targets of `size / smoothed_bw(source,
//!   target)`, where `size` is the size passed to `on_end_access` (or the
//!   edge's smoothed size if that is 0). A pair whose bandwidth was never
//!   measured contributes **0**: with no measurement at all the copy time and
//!   the compensation are 0 (the engine never guesses a bandwidth).
//! * `compensation = max(0, predicted_copy - predicted_slack)`.

use std::collections::HashMap;
use std::mem::size_of;
use std::sync::Mutex;
use std::time::Duration;
use virtsoc_sync::LockExt;

use log::debug;

use crate::hypergraph::{map_bytes, pair_low, FlowId, TwinHypergraphs, VirtualEdge};
use crate::region::{PlanRecord, ReaderRecord, RegionEdge, RegionState, WriteRecord};
use crate::smoothing::secs_to_duration;
use crate::{AccessKind, Config, ConfigError, PDev, RegionId, VDev};

/// What to prefetch after a write, and how long the writer must block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrefetchPlan {
    /// The virtual hyperedge (data flow) the prediction came from.
    pub flow: FlowId,
    /// Physical device holding the freshly written data (the writer's pdev).
    pub source: PDev,
    /// Physical devices to copy to: every predicted reader pdev except
    /// `source`. May be empty when all predicted readers share the writer's
    /// physical device.
    pub targets: Vec<PDev>,
    /// Bytes assumed per copy.
    pub size: u64,
    /// Σ over targets of `size / smoothed bandwidth(source, target)` (copies
    /// run sequentially on one engine); unmeasured pairs count 0.
    pub predicted_copy: Duration,
    /// Smoothed slack (write end -> first read begin) of the flow.
    pub predicted_slack: Duration,
    /// `max(0, predicted_copy - predicted_slack)`: how long the writer's
    /// guest must block so the next read does not wait.
    pub compensation: Duration,
    /// True when the region had no history for this writer and the flow was
    /// taken from the writer's most recently observed flow.
    pub zero_shot: bool,
}

/// Result of a reader access against the region's last plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReadOutcome {
    /// The reader's pdev was predicted (or is the writer's own pdev).
    Hit,
    /// A plan (or a shadow plan of a suspended flow) existed and did not
    /// cover the reader's pdev.
    Miss,
    /// No plan: fresh region, unknown flow, or no write yet.
    Unpredicted,
    /// The access was a plain write; nothing was scored.
    NotRead,
}

/// Counters and sizes reported by [`PrefetchEngine::stats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefetchStats {
    /// Plans returned by `on_end_access`.
    pub predictions: u64,
    /// Of those, zero-shot plans.
    pub zero_shot_predictions: u64,
    /// Predictions kept only as shadow plans because the flow was suspended.
    pub shadow_predictions: u64,
    /// Reads covered by a real plan.
    pub hits: u64,
    /// Reads not covered by a real plan.
    pub misses: u64,
    /// Reads covered by a shadow plan.
    pub shadow_hits: u64,
    /// Reads not covered by a shadow plan.
    pub shadow_misses: u64,
    /// Reads with no plan to score against.
    pub unpredicted: u64,
    /// Flow suspension events (miss-based and bandwidth-based counted
    /// separately).
    pub suspensions: u64,
    /// Flow resumption events (same accounting as `suspensions`).
    pub resumptions: u64,
    /// Flows currently suspended (for either reason).
    pub suspended_flows: u64,
    /// Virtual hyperedges.
    pub virtual_flows: u64,
    /// Physical hyperedges.
    pub physical_flows: u64,
    /// Entries of the region hashtable.
    pub regions_tracked: u64,
    /// Estimated bytes held by all structures (capacity × entry size, plus
    /// one control byte per hashtable slot, plus owned vectors).
    pub metadata_bytes: u64,
}

/// Read-only snapshot of one virtual hyperedge, for diagnostics and tests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FlowInfo {
    /// Writer vdev.
    pub writer: VDev,
    /// Reader vdevs (sorted).
    pub readers: Vec<VDev>,
    /// Closed cycles recorded.
    pub cycles: u64,
    /// Distinct reads recorded in those cycles.
    pub reads: u64,
    /// Smoothed slack, `None` if never measured.
    pub smoothed_slack: Option<Duration>,
    /// Current run of consecutive misses.
    pub consecutive_misses: u32,
    /// Suspended after too many consecutive misses.
    pub miss_suspended: bool,
    /// Suspended because a pair of its last plan is under the bandwidth floor.
    pub bandwidth_suspended: bool,
    /// Real-plan hits scored on this flow.
    pub hits: u64,
    /// Real-plan misses scored on this flow.
    pub misses: u64,
}

#[derive(Debug)]
struct State {
    cfg: Config,
    graphs: TwinHypergraphs,
    regions: HashMap<RegionId, RegionState>,
    counters: PrefetchStats,
}

/// The prefetch engine. `Send + Sync`; every method takes `&self`.
#[derive(Debug)]
pub struct PrefetchEngine {
    state: Mutex<State>,
}

impl Default for PrefetchEngine {
    fn default() -> Self {
        PrefetchEngine::new(Config::default())
    }
}

impl PrefetchEngine {
    /// Creates an engine. Out-of-range config fields are replaced by their
    /// defaults (see [`Config::sanitized`]); use [`PrefetchEngine::try_new`]
    /// to reject them instead.
    pub fn new(cfg: Config) -> Self {
        if let Err(e) = cfg.validate() {
            log::warn!("prefetch: {e}; using the default for that field");
        }
        Self::build(cfg.sanitized())
    }

    /// Creates an engine, rejecting an invalid config.
    pub fn try_new(cfg: Config) -> Result<Self, ConfigError> {
        cfg.validate()?;
        Ok(Self::build(cfg))
    }

    fn build(cfg: Config) -> Self {
        PrefetchEngine {
            state: Mutex::new(State {
                cfg,
                graphs: TwinHypergraphs::default(),
                regions: HashMap::new(),
                counters: PrefetchStats::default(),
            }),
        }
    }

    /// The configuration in use (after sanitising).
    pub fn config(&self) -> Config {
        self.state.lock_or_recover().cfg
    }

    /// A device begins accessing `region` (for a reader: after the writer's
    /// `end_access`).
    ///
    /// For reads (`Read`, `ReadWrite`): measures the slack since the region's
    /// last write end (the first read of a cycle defines the cycle's slack),
    /// records the reader in the current cycle and scores the last plan:
    /// `Hit` if `pdev` was covered, `Miss` if a real or shadow plan existed
    /// and did not cover it, `Unpredicted` if there was no plan (including a
    /// region never written: such reads create no edges). A reader (same
    /// `vdev` and `pdev`) that reads twice in one cycle is scored once: the
    /// repeat returns the first outcome and changes no counter. Outcomes of
    /// shadow plans are counted as `shadow_hits`/`shadow_misses` and stay out
    /// of [`PrefetchEngine::accuracy`]. For plain writes returns `NotRead`.
    pub fn on_begin_access(
        &self,
        region: RegionId,
        vdev: VDev,
        pdev: PDev,
        kind: AccessKind,
        now: Duration,
    ) -> ReadOutcome {
        if !kind.is_read() {
            return ReadOutcome::NotRead;
        }
        let mut guard = self.state.lock_or_recover();
        let State {
            cfg,
            graphs,
            regions,
            counters,
        } = &mut *guard;
        let Some(r) = regions.get_mut(&region) else {
            counters.unpredicted += 1;
            return ReadOutcome::Unpredicted;
        };
        let Some(write) = r.write else {
            counters.unpredicted += 1;
            return ReadOutcome::Unpredicted;
        };
        if let Some(prev) = r.readers.iter().find(|x| x.vdev == vdev && x.pdev == pdev) {
            return prev.outcome;
        }
        if r.first_read_slack.is_none() {
            r.first_read_slack = Some(now.saturating_sub(write.end));
        }
        let outcome = match &r.plan {
            None => {
                counters.unpredicted += 1;
                ReadOutcome::Unpredicted
            }
            Some(plan) => {
                let hit = plan.covers(pdev);
                if let Some(edge) = graphs.vedge_mut(plan.flow) {
                    score(edge, plan.flow, hit, plan.shadow, cfg, counters);
                }
                if hit {
                    ReadOutcome::Hit
                } else {
                    ReadOutcome::Miss
                }
            }
        };
        r.readers.push(ReaderRecord {
            vdev,
            pdev,
            outcome,
        });
        outcome
    }

    /// A device ends accessing `region`.
    ///
    /// For writes (`Write`, `ReadWrite`): closes the region's previous cycle
    /// (previous writer -> readers seen since; a cycle without readers is
    /// dropped) into the virtual hyperedge `(writer vdev, reader vdevs)` and
    /// the physical hyperedge `(writer pdev, reader pdevs)`, then predicts the
    /// readers of this write from the region's own hyperedge for this writer,
    /// or zero-shot from the flow most recently observed for this writer.
    ///
    /// Returns `None` for plain reads, when nothing is known about the
    /// writer, or when the flow is suspended; in the last case a shadow plan
    /// is kept and scored so a miss-suspended flow resumes on a shadow hit.
    pub fn on_end_access(
        &self,
        region: RegionId,
        vdev: VDev,
        pdev: PDev,
        kind: AccessKind,
        size: u64,
        now: Duration,
    ) -> Option<PrefetchPlan> {
        if !kind.is_write() {
            return None;
        }
        let mut guard = self.state.lock_or_recover();
        let State {
            cfg,
            graphs,
            regions,
            counters,
        } = &mut *guard;
        let r = regions.entry(region).or_default();
        close_cycle(r, graphs, cfg.alpha);
        r.write = Some(WriteRecord {
            vdev,
            pdev,
            end: now,
            size,
        });

        let (flow, phys, zero_shot) = match r.edge_for(vdev) {
            Some(e) => (e.flow, e.phys, false),
            None => {
                let flow = *graphs.writer_recent.get(&vdev)?;
                let phys = graphs.vedge(flow)?.last_phys?;
                (flow, phys, true)
            }
        };
        let pedge = graphs.pedge(phys)?;
        let targets: Vec<PDev> = pedge
            .readers
            .iter()
            .copied()
            .filter(|t| *t != pdev)
            .collect();
        let copy_size = if size > 0 {
            size
        } else {
            pedge.size.get().map_or(0, |s| s as u64)
        };
        let copy_secs: f64 = targets
            .iter()
            .filter_map(|t| graphs.predicted_bw((pdev, *t)))
            .filter(|bw| *bw > 0.0)
            .map(|bw| copy_size as f64 / bw)
            .sum();
        let pairs: Vec<(PDev, PDev)> = targets.iter().map(|t| (pdev, *t)).collect();
        let low = pairs
            .iter()
            .any(|p| pair_low(&graphs.bandwidth, *p, cfg.bandwidth_floor));
        let edge = graphs.vedge_mut(flow)?;
        set_bw_suspended(edge, flow, low, counters);
        edge.plan_pairs = pairs;
        let predicted_copy = secs_to_duration(copy_secs);
        let predicted_slack = secs_to_duration(edge.slack.get().unwrap_or(0.0));
        let suspended = edge.suspended();
        r.plan = Some(PlanRecord {
            flow,
            source: pdev,
            targets: targets.clone(),
            shadow: suspended,
        });
        if suspended {
            counters.shadow_predictions += 1;
            return None;
        }
        counters.predictions += 1;
        if zero_shot {
            counters.zero_shot_predictions += 1;
        }
        Some(PrefetchPlan {
            flow,
            source: pdev,
            targets,
            size: copy_size,
            predicted_copy,
            predicted_slack,
            compensation: predicted_copy.saturating_sub(predicted_slack),
            zero_shot,
        })
    }

    /// A copy of `bytes` from `src` to `dst` took `elapsed`: smooths the
    /// pair's bandwidth, tracks its maximum smoothed value, and re-evaluates
    /// the bandwidth suspension of every flow whose last plan used the pair.
    /// Copies of 0 bytes or 0 duration carry no measurement and are ignored.
    pub fn on_copy_complete(&self, src: PDev, dst: PDev, bytes: u64, elapsed: Duration) {
        if bytes == 0 || elapsed.is_zero() {
            return;
        }
        let sample = bytes as f64 / elapsed.as_secs_f64();
        let mut guard = self.state.lock_or_recover();
        let State {
            cfg,
            graphs,
            counters,
            ..
        } = &mut *guard;
        graphs.record_bandwidth(cfg.alpha, (src, dst), sample);
        let TwinHypergraphs {
            vedges, bandwidth, ..
        } = graphs;
        for (i, edge) in vedges.iter_mut().enumerate() {
            if !edge.plan_pairs.contains(&(src, dst)) {
                continue;
            }
            let low = edge
                .plan_pairs
                .iter()
                .any(|p| pair_low(bandwidth, *p, cfg.bandwidth_floor));
            set_bw_suspended(edge, FlowId(i as u32), low, counters);
        }
    }

    /// Smoothed bandwidth of a pair in bytes per second, `None` if never
    /// measured.
    pub fn predicted_bandwidth(&self, src: PDev, dst: PDev) -> Option<f64> {
        self.state.lock_or_recover().graphs.predicted_bw((src, dst))
    }

    /// The region was freed: drops its hashtable entry (flows stay).
    pub fn forget_region(&self, region: RegionId) {
        let mut st = self.state.lock_or_recover();
        st.regions.remove(&region);
        shrink(&mut st.regions);
    }

    /// Drops every region for which `f` returns true (e.g. all regions of a
    /// disconnected guest). Flows stay.
    pub fn forget_regions_where(&self, f: impl Fn(RegionId) -> bool) {
        let mut st = self.state.lock_or_recover();
        st.regions.retain(|k, _| !f(*k));
        shrink(&mut st.regions);
    }

    /// The flow a region is currently linked to for `writer`.
    pub fn region_flow(&self, region: RegionId, writer: VDev) -> Option<FlowId> {
        self.state
            .lock_or_recover()
            .regions
            .get(&region)
            .and_then(|r| r.edge_for(writer))
            .map(|e| e.flow)
    }

    /// Snapshot of a virtual hyperedge.
    pub fn flow_info(&self, flow: FlowId) -> Option<FlowInfo> {
        let st = self.state.lock_or_recover();
        let e = st.graphs.vedge(flow)?;
        Some(FlowInfo {
            writer: e.writer,
            readers: e.readers.clone(),
            cycles: e.cycles,
            reads: e.reads,
            smoothed_slack: e.slack.get().map(secs_to_duration),
            consecutive_misses: e.consecutive_misses,
            miss_suspended: e.miss_suspended,
            bandwidth_suspended: e.bw_suspended,
            hits: e.hits,
            misses: e.misses,
        })
    }

    /// Counters and sizes.
    pub fn stats(&self) -> PrefetchStats {
        let st = self.state.lock_or_recover();
        let mut s = st.counters;
        s.suspended_flows = st.graphs.vedges.iter().filter(|e| e.suspended()).count() as u64;
        s.virtual_flows = st.graphs.vedges.len() as u64;
        s.physical_flows = st.graphs.pedges.len() as u64;
        s.regions_tracked = st.regions.len() as u64;
        let bytes = size_of::<State>()
            + st.graphs.metadata_bytes()
            + map_bytes(&st.regions)
            + st.regions
                .values()
                .map(RegionState::heap_bytes)
                .sum::<usize>();
        s.metadata_bytes = bytes as u64;
        s
    }

    /// `hits / (hits + misses)` over real plans; `None` before any scored
    /// read.
    pub fn accuracy(&self) -> Option<f64> {
        let st = self.state.lock_or_recover();
        let scored = st.counters.hits + st.counters.misses;
        (scored > 0).then(|| st.counters.hits as f64 / scored as f64)
    }
}

/// Closes the region's current cycle into the hypergraphs (if it had a write
/// and at least one reader) and resets the cycle.
fn close_cycle(r: &mut RegionState, graphs: &mut TwinHypergraphs, alpha: f64) {
    let readers = std::mem::take(&mut r.readers);
    let slack = r.first_read_slack.take();
    r.plan = None;
    let Some(w) = r.write.take() else { return };
    if readers.is_empty() {
        return;
    }
    let mut vreaders: Vec<VDev> = readers.iter().map(|x| x.vdev).collect();
    vreaders.sort_unstable();
    vreaders.dedup();
    let mut preaders: Vec<PDev> = readers.iter().map(|x| x.pdev).collect();
    preaders.sort_unstable();
    preaders.dedup();
    let (Some(flow), Some(phys)) = (
        graphs.intern_virtual(w.vdev, vreaders),
        graphs.intern_physical(w.pdev, preaders),
    ) else {
        return;
    };
    if let Some(e) = graphs.vedge_mut(flow) {
        e.cycles += 1;
        e.reads += readers.len() as u64;
        if let Some(s) = slack {
            e.slack.update(alpha, s.as_secs_f64());
        }
        e.last_phys = Some(phys);
    }
    if let Some(p) = graphs.pedge_mut(phys) {
        p.cycles += 1;
        p.size.update(alpha, w.size as f64);
    }
    graphs.writer_recent.insert(w.vdev, flow);
    if let Some(old) = r.edge_for(w.vdev) {
        if old.flow != flow {
            debug!(
                "prefetch: region flow of {:?} changed {:?} -> {:?}",
                w.vdev, old.flow, flow
            );
        }
    }
    r.set_edge(RegionEdge {
        writer: w.vdev,
        flow,
        phys,
    });
}

/// Scores one read against a flow and applies miss-based suspension and
/// resumption.
fn score(
    edge: &mut VirtualEdge,
    id: FlowId,
    hit: bool,
    shadow: bool,
    cfg: &Config,
    counters: &mut PrefetchStats,
) {
    if hit {
        edge.consecutive_misses = 0;
        edge.consecutive_hits = edge.consecutive_hits.saturating_add(1);
        if edge.confident() {
            set_bw_suspended(edge, id, false, counters);
        }
        if shadow {
            counters.shadow_hits += 1;
        } else {
            counters.hits += 1;
            edge.hits += 1;
        }
        if edge.miss_suspended {
            edge.miss_suspended = false;
            counters.resumptions += 1;
            debug!("prefetch: flow {id:?} resumed after a hit");
        }
    } else {
        edge.consecutive_hits = 0;
        edge.consecutive_misses = edge.consecutive_misses.saturating_add(1);
        if shadow {
            counters.shadow_misses += 1;
        } else {
            counters.misses += 1;
            edge.misses += 1;
        }
        if cfg.max_consecutive_misses > 0
            && edge.consecutive_misses >= cfg.max_consecutive_misses
            && !edge.miss_suspended
        {
            edge.miss_suspended = true;
            counters.suspensions += 1;
            debug!(
                "prefetch: flow {id:?} suspended after {} consecutive misses",
                edge.consecutive_misses
            );
        }
    }
}

/// Applies a bandwidth-floor verdict to a flow, counting transitions.
/// Suspends `edge` for a low bandwidth (`low`, and the flow not [confident]), or resumes it.
///
/// [confident]: VirtualEdge::confident
fn set_bw_suspended(edge: &mut VirtualEdge, id: FlowId, low: bool, counters: &mut PrefetchStats) {
    let low = low && !edge.confident();
    if low && !edge.bw_suspended {
        edge.bw_suspended = true;
        counters.suspensions += 1;
        debug!("prefetch: flow {id:?} suspended: bandwidth below floor");
    } else if !low && edge.bw_suspended {
        edge.bw_suspended = false;
        counters.resumptions += 1;
        debug!("prefetch: flow {id:?} resumed: bandwidth recovered");
    }
}

/// Gives memory back after many regions were forgotten.
fn shrink<K: std::hash::Hash + Eq, V>(m: &mut HashMap<K, V>) {
    if m.capacity() > 64 && m.len() * 4 < m.capacity() {
        m.shrink_to(m.len() * 2);
    }
}
