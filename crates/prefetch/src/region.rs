//! The hashtable between the two hypergraph layers: one [`RegionState`] per
//! tracked SVM region.
//!
//! A region entry owns
//! * its links into the hypergraphs, one `(virtual edge, physical edge)` per
//!   writer vdev that has closed a cycle on it (usually exactly one; an
//!   in-place pipeline such as camera -> GPU(read-write) -> display has one
//!   per stage),
//! * the current cycle: the last write and the readers seen since, with the
//!   slack of the first read,
//! * the plan (real or shadow) made at the last write, which reads are scored
//!   against.

use std::mem::size_of;
use std::time::Duration;

use crate::engine::ReadOutcome;
use crate::hypergraph::{vec_bytes, FlowId, PhysEdgeId};
use crate::{PDev, VDev};

/// Link of a region to the hyperedges of one writer.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RegionEdge {
    pub(crate) writer: VDev,
    pub(crate) flow: FlowId,
    pub(crate) phys: PhysEdgeId,
}

/// The write that opened the current cycle.
#[derive(Clone, Copy, Debug)]
pub(crate) struct WriteRecord {
    pub(crate) vdev: VDev,
    pub(crate) pdev: PDev,
    pub(crate) end: Duration,
    pub(crate) size: u64,
}

/// A reader of the current cycle and how its (first) read was scored.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ReaderRecord {
    pub(crate) vdev: VDev,
    pub(crate) pdev: PDev,
    pub(crate) outcome: ReadOutcome,
}

/// The plan made at the last write. `shadow` plans belong to suspended
/// flows: nothing was prefetched, they are only scored.
#[derive(Clone, Debug)]
pub(crate) struct PlanRecord {
    pub(crate) flow: FlowId,
    pub(crate) source: PDev,
    pub(crate) targets: Vec<PDev>,
    pub(crate) shadow: bool,
}

impl PlanRecord {
    /// A read on `pdev` finds the data in place: it was a target, or it is
    /// the writer's own physical device (no copy needed).
    pub(crate) fn covers(&self, pdev: PDev) -> bool {
        pdev == self.source || self.targets.contains(&pdev)
    }
}

/// One entry of the region hashtable.
#[derive(Debug, Default)]
pub(crate) struct RegionState {
    pub(crate) edges: Vec<RegionEdge>,
    pub(crate) write: Option<WriteRecord>,
    pub(crate) readers: Vec<ReaderRecord>,
    pub(crate) first_read_slack: Option<Duration>,
    pub(crate) plan: Option<PlanRecord>,
}

impl RegionState {
    /// The region's link for `writer`, if that writer has closed a cycle here.
    pub(crate) fn edge_for(&self, writer: VDev) -> Option<RegionEdge> {
        self.edges.iter().copied().find(|e| e.writer == writer)
    }

    /// Installs or replaces the link for `edge.writer` (most recent last).
    pub(crate) fn set_edge(&mut self, edge: RegionEdge) {
        self.edges.retain(|e| e.writer != edge.writer);
        self.edges.push(edge);
    }

    /// Heap bytes owned by this entry (the inline part is counted by the
    /// table).
    pub(crate) fn heap_bytes(&self) -> usize {
        vec_bytes(&self.edges)
            + vec_bytes(&self.readers)
            + self
                .plan
                .as_ref()
                .map_or(0, |p| p.targets.capacity() * size_of::<PDev>())
    }
}
