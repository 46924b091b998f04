//! `virtsoc-prefetch`: the prefetch engine of the virtsoc SVM framework
//! (vSoC, SOSP'24, §3.2 "twin hypergraphs" and §3.3 "the prefetch engine").
//!
//! This crate root owns the small public vocabulary shared by every module:
//! the identifiers ([`RegionId`], from `virtsoc-ids`; [`VDev`], [`PDev`]), the access kind
//! ([`AccessKind`]) and the tuning knobs ([`Config`]). The logic lives in:
//!
//! * [`smoothing`] – single exponential smoothing ([`Ewma`]);
//! * `hypergraph` – the twin hypergraphs (virtual and physical layers plus the
//!   per-pair bandwidth table);
//! * `region` – the region hashtable entries that link an SVM region to its
//!   hyperedges and hold the current write/read cycle and plan;
//! * `engine` – [`PrefetchEngine`], the thread-safe façade that turns
//!   `begin_access`/`end_access`/copy-completion events into
//!   [`PrefetchPlan`]s and scores them.
//!
//! The crate is pure logic: no threads, no sleeps, no I/O. Time is injected
//! by the caller as a monotonic [`std::time::Duration`] since an arbitrary
//! epoch, so synthetic traces run instantly in tests.
//!
//! # Model in one paragraph
//!
//! A *cycle* of a region is one write followed by the reads seen before the
//! next write. When the next write ends, the cycle is closed into a virtual
//! hyperedge keyed by `(writer VDev, set of reader VDevs)` and a physical
//! hyperedge keyed by `(writer PDev, set of reader PDevs)`; many regions (a
//! ring of buffers) share one hyperedge. The new write is then predicted from
//! the region's own hyperedge for that writer, or, for a region without such
//! history, *zero-shot* from the flow most recently observed for that writer.
//! The plan lists the physical devices to copy to, the predicted copy time
//! (from per-pair smoothed bandwidth), the smoothed slack of the flow and the
//! compensation the writer's guest must block for.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod engine;
mod error;
mod hypergraph;
mod region;
pub mod smoothing;

#[cfg(test)]
mod tests;

pub use engine::{FlowInfo, PrefetchEngine, PrefetchPlan, PrefetchStats, ReadOutcome};
pub use error::ConfigError;
pub use hypergraph::FlowId;
pub use smoothing::Ewma;

/// A region of the predictor's guest (predictors are per guest, so the region's own id
/// names it): the one region id of `virtsoc-ids`.
pub use virtsoc_ids::RegionId;

/// The former name of [`RegionId`] here, the same type (`svm::coherence` still calls it so).
pub use virtsoc_ids::RegionId as RegionKey;

/// A virtual device (codec, GPU, camera, a producer test device, ...): a node
/// of the virtual hypergraph.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct VDev(pub u32);

/// A physical device / memory domain (host RAM, device-local memory of a
/// GPU, ...): a node of the physical hypergraph.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PDev(pub u32);

/// How a device accesses a region. `ReadWrite` counts as both a read (at
/// `begin_access`) and a write (at `end_access`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AccessKind {
    /// The device only reads the region.
    Read,
    /// The device only writes the region.
    Write,
    /// The device reads and then writes the region (in-place processing).
    ReadWrite,
}

impl AccessKind {
    /// True for `Read` and `ReadWrite`.
    pub fn is_read(self) -> bool {
        matches!(self, AccessKind::Read | AccessKind::ReadWrite)
    }

    /// True for `Write` and `ReadWrite`.
    pub fn is_write(self) -> bool {
        matches!(self, AccessKind::Write | AccessKind::ReadWrite)
    }
}

/// Tuning knobs of the prefetch engine (defaults are the paper's values).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Config {
    /// Single exponential smoothing factor in `(0, 1]`; default `0.5`.
    pub alpha: f64,
    /// Suspend a flow's prefetching after this many consecutive
    /// mispredictions; default `3`. `0` disables miss-based suspension.
    pub max_consecutive_misses: u32,
    /// Suspend a flow while the steady bandwidth of one of its `(source,
    /// target)` pairs (smoothed over about ten copies) is below `floor * the
    /// largest steady bandwidth seen on that pair`; in `[0, 1]`, default
    /// `0.5`. `0` disables it.
    ///
    /// The paper suspends "to avoid bandwidth waste". A flow whose last eight
    /// scored reads were hits wastes none (the bytes it moves are read anyway, then on
    /// the reader's critical path), so it keeps prefetching whatever the
    /// bandwidth, and a suspended flow resumes after eight shadow hits in a
    /// row. Without that, another guest loading the memory system (or the
    /// copying thread landing on a busy core) turned a well-predicted flow's
    /// prefetches into copies inside `begin_access`: 1-2 us became 70-110 us
    /// for a 1 MiB read (`virtsoc bench isolation`, docs/results.md, stop 21).
    pub bandwidth_floor: f64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            alpha: 0.5,
            max_consecutive_misses: 3,
            bandwidth_floor: 0.5,
        }
    }
}

impl Config {
    /// Checks that `alpha` is in `(0, 1]` and `bandwidth_floor` in `[0, 1]`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(self.alpha > 0.0 && self.alpha <= 1.0) {
            return Err(ConfigError::Alpha(self.alpha));
        }
        if !(0.0..=1.0).contains(&self.bandwidth_floor) {
            return Err(ConfigError::BandwidthFloor(self.bandwidth_floor));
        }
        Ok(())
    }

    /// Returns a copy where every out-of-range field is replaced by its
    /// default value.
    pub fn sanitized(self) -> Config {
        let d = Config::default();
        Config {
            alpha: if self.alpha > 0.0 && self.alpha <= 1.0 {
                self.alpha
            } else {
                d.alpha
            },
            max_consecutive_misses: self.max_consecutive_misses,
            bandwidth_floor: if (0.0..=1.0).contains(&self.bandwidth_floor) {
                self.bandwidth_floor
            } else {
                d.bandwidth_floor
            },
        }
    }
}
