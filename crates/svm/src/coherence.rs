//! Coherence protocols: what happens to replicas at begin_access and end_access.
//!
//! - `guest-staging` is the baseline of today's emulators (vSoC section 2.2): the guest window
//!   is the only truth; a device copies the window into its memory before every read and
//!   copies its memory back to the window after every write, so a write by one device and a
//!   read by another cost two copies.
//! - `write-invalidate` (vSoC 5.4): a write makes the writer's replica the only valid one; the
//!   next access elsewhere fetches synchronously, on the cheapest path, from a valid replica.
//! - `prefetch` (vSoC 3.3) plugs in through the same trait.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use virtsoc_prefetch::{AccessKind, PDev, PrefetchEngine, ReadOutcome, VDev};
use virtsoc_proto::AccessMode;

use crate::dma::{CopyTicket, Dma, DmaJob};
use crate::domain::DomainId;
use crate::region::{RegionCtx, RegionKey};
use crate::{Result, SvmError};

/// One access as the protocols see it.
#[derive(Debug, Clone, Copy)]
pub struct AccessInfo {
    /// The virtual device (as named by the guest).
    pub vdev: u32,
    /// The memory domain of the physical device behind it.
    pub domain: DomainId,
    pub mode: AccessMode,
    /// Whether the access covers the whole region.
    pub whole: bool,
    /// Set when begin_access is asked again after waiting for an in-flight copy.
    pub retry: bool,
}

/// What a protocol's begin_access needs next.
#[derive(Debug)]
pub enum Step {
    /// The domain is ready.
    Done,
    /// An asynchronous copy must finish first: the manager waits for it without holding the
    /// region's lock, then asks again.
    WaitFor(Arc<CopyTicket>),
}

/// A coherence protocol.
pub trait Coherence: Send + Sync {
    /// Its name on the command line and in reports.
    fn name(&self) -> &'static str;
    /// Prepares the accessing domain.
    fn begin_access(&self, cx: &mut RegionCtx<'_>, a: &AccessInfo) -> Result<Step>;
    /// Finishes an access.
    fn end_access(&self, cx: &mut RegionCtx<'_>, a: &AccessInfo) -> Result<()>;
    /// The region is gone; drop whatever the protocol keeps about it.
    fn forget(&self, _key: RegionKey) {}
}

/// The protocols that can be selected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub enum ProtocolKind {
    GuestStaging,
    WriteInvalidate,
    Prefetch,
}

impl ProtocolKind {
    /// Every protocol, in report order.
    pub const ALL: [ProtocolKind; 3] = [
        ProtocolKind::GuestStaging,
        ProtocolKind::WriteInvalidate,
        ProtocolKind::Prefetch,
    ];

    /// Command-line name.
    pub fn name(self) -> &'static str {
        match self {
            ProtocolKind::GuestStaging => "guest-staging",
            ProtocolKind::WriteInvalidate => "write-invalidate",
            ProtocolKind::Prefetch => "prefetch",
        }
    }
}

impl fmt::Display for ProtocolKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ProtocolKind {
    type Err = SvmError;
    fn from_str(s: &str) -> Result<Self> {
        ProtocolKind::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| SvmError::BadArgument(format!("unknown coherence protocol {s:?}")))
    }
}

/// Baseline: every device syncs through the guest window.
#[derive(Debug, Default)]
pub struct GuestStaging;

impl Coherence for GuestStaging {
    fn name(&self) -> &'static str {
        ProtocolKind::GuestStaging.name()
    }

    fn begin_access(&self, cx: &mut RegionCtx<'_>, a: &AccessInfo) -> Result<Step> {
        let d = a.domain;
        cx.ensure_replica(DomainId::GUEST_WINDOW)?;
        if d != DomainId::GUEST_WINDOW && (a.mode.reads() || !a.whole) {
            // The device knows nothing of other devices: it always pulls from guest memory.
            cx.copy(DomainId::GUEST_WINDOW, d)?;
        }
        cx.ensure_replica(d)?;
        if a.mode.writes() {
            cx.make_exclusive(d)?;
        }
        Ok(Step::Done)
    }

    fn end_access(&self, cx: &mut RegionCtx<'_>, a: &AccessInfo) -> Result<()> {
        if a.mode.writes() && a.domain != DomainId::GUEST_WINDOW {
            cx.copy(a.domain, DomainId::GUEST_WINDOW)?;
        }
        Ok(())
    }
}

/// Brings `a.domain` up to date for the access: fetches synchronously when it reads (or writes
/// part of) a region it holds no valid copy of, then makes it the only valid copy if it writes.
fn fetch_for(cx: &mut RegionCtx<'_>, a: &AccessInfo) -> Result<()> {
    if a.mode.reads() || !a.whole {
        cx.fetch(a.domain)?;
    } else {
        cx.ensure_replica(a.domain)?;
    }
    if a.mode.writes() {
        cx.make_exclusive(a.domain)?;
    }
    Ok(())
}

/// A write invalidates other replicas; the next access elsewhere fetches synchronously.
#[derive(Debug, Default)]
pub struct WriteInvalidate;

impl Coherence for WriteInvalidate {
    fn name(&self) -> &'static str {
        ProtocolKind::WriteInvalidate.name()
    }

    fn begin_access(&self, cx: &mut RegionCtx<'_>, a: &AccessInfo) -> Result<Step> {
        fetch_for(cx, a)?;
        Ok(Step::Done)
    }

    fn end_access(&self, _cx: &mut RegionCtx<'_>, _a: &AccessInfo) -> Result<()> {
        Ok(())
    }
}

/// vSoC's prefetch protocol: write-invalidate, plus, at a writer's end_access, an
/// asynchronous copy to every physical device the twin hypergraphs predict will read next,
/// and a compensation the writer's guest blocks for when the copy is predicted to outlast the
/// slack. A reader whose prefetch is still in flight waits for it; a mispredicted reader
/// fetches synchronously.
pub struct Prefetch {
    engine: Arc<PrefetchEngine>,
    dma: Arc<Dma>,
    epoch: Instant,
    /// Compensation handed to each region's last writer: the slack the reader sees starts
    /// when the writer's guest stops blocking, so it is taken out of the measured slack.
    compensated: Mutex<HashMap<RegionKey, Duration>>,
}

impl Prefetch {
    pub(crate) fn new(engine: Arc<PrefetchEngine>, dma: Arc<Dma>, epoch: Instant) -> Self {
        Prefetch {
            engine,
            dma,
            epoch,
            compensated: Mutex::new(HashMap::new()),
        }
    }

    fn compensated(&self) -> std::sync::MutexGuard<'_, HashMap<RegionKey, Duration>> {
        self.compensated.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Folds a host-wide region key into the predictor's 64-bit key (guest in the top 24 bits).
pub fn predictor_key(k: RegionKey) -> virtsoc_prefetch::RegionKey {
    virtsoc_prefetch::RegionKey((k.guest << 40) ^ k.id)
}

fn kind_of(m: AccessMode) -> AccessKind {
    match m {
        AccessMode::Read => AccessKind::Read,
        AccessMode::Write => AccessKind::Write,
        AccessMode::ReadWrite => AccessKind::ReadWrite,
    }
}

impl Coherence for Prefetch {
    fn name(&self) -> &'static str {
        ProtocolKind::Prefetch.name()
    }

    fn begin_access(&self, cx: &mut RegionCtx<'_>, a: &AccessInfo) -> Result<Step> {
        let region = cx.region_arc();
        let counters = region.guest.counters();
        if !a.retry {
            // Score the prediction and measure the slack when the access arrives, before any
            // wait for a copy still in flight.
            let t0 = Instant::now();
            let mut now = self.epoch.elapsed();
            if a.mode.reads() {
                if let Some(c) = self.compensated().remove(&region.key) {
                    now = now.saturating_sub(c);
                }
            }
            let outcome = self.engine.on_begin_access(
                predictor_key(region.key),
                VDev(a.vdev),
                PDev(a.domain.0),
                kind_of(a.mode),
                now,
            );
            counters
                .bookkeeping_ns
                .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
            match outcome {
                ReadOutcome::Hit => counters.hits.fetch_add(1, Ordering::Relaxed),
                ReadOutcome::Miss => counters.misses.fetch_add(1, Ordering::Relaxed),
                ReadOutcome::Unpredicted | ReadOutcome::NotRead => 0,
            };
        }
        // A write must not race a copy into (or out of) this region.
        if a.mode.writes() {
            if let Some(t) = cx.any_inflight() {
                return Ok(Step::WaitFor(t));
            }
        }
        let needs_data = a.mode.reads() || !a.whole;
        if needs_data && !cx.is_valid(a.domain) {
            if let Some(t) = cx.inflight_to(a.domain) {
                if !a.retry {
                    counters.inflight_waits.fetch_add(1, Ordering::Relaxed);
                }
                return Ok(Step::WaitFor(t));
            }
            counters.sync_fetches.fetch_add(1, Ordering::Relaxed);
        }
        fetch_for(cx, a)?;
        Ok(Step::Done)
    }

    fn end_access(&self, cx: &mut RegionCtx<'_>, a: &AccessInfo) -> Result<()> {
        let region = cx.region_arc();
        let counters = region.guest.counters();
        let t0 = Instant::now();
        let plan = self.engine.on_end_access(
            predictor_key(cx.region().key),
            VDev(a.vdev),
            PDev(a.domain.0),
            kind_of(a.mode),
            cx.size(),
            self.epoch.elapsed(),
        );
        counters
            .bookkeeping_ns
            .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        let Some(plan) = plan.filter(|_| a.mode.writes()) else {
            return Ok(());
        };
        log::trace!(
            "region {:?}: prefetch to {:?}, copy {:?}, slack {:?}, compensation {:?}",
            region.key,
            plan.targets,
            plan.predicted_copy,
            plan.predicted_slack,
            plan.compensation
        );
        let mut started = 0;
        let mut targets: Vec<DomainId> = plan.targets.iter().map(|p| DomainId(p.0)).collect();
        targets.sort();
        targets.dedup();
        for t in targets {
            // Targets reachable only in hops are left to the synchronous fetch; a target
            // already valid or already being copied to needs nothing more.
            if t == a.domain
                || !cx.engine().topology().linked(a.domain, t)
                || cx.inflight_to(t).is_some()
            {
                continue;
            }
            if cx.ensure_replica(t).is_err() {
                continue; // out of memory for a speculative copy: skip it
            }
            let ticket = CopyTicket::new();
            cx.set_inflight(t, ticket.clone());
            self.dma.push(DmaJob {
                region: cx.region_arc(),
                src: a.domain,
                dst: t,
                generation: cx.generation(),
                ticket,
            });
            started += 1;
        }
        counters.prefetches.fetch_add(started, Ordering::Relaxed);
        if started > 0 {
            cx.report.compensation = plan.compensation.min(MAX_COMPENSATION);
            if !cx.report.compensation.is_zero() {
                self.compensated()
                    .insert(region.key, cx.report.compensation);
            }
            counters
                .compensation_ns
                .fetch_add(cx.report.compensation.as_nanos() as u64, Ordering::Relaxed);
        }
        Ok(())
    }

    fn forget(&self, key: RegionKey) {
        self.compensated().remove(&key);
        self.engine.forget_region(predictor_key(key));
    }
}

/// Upper bound on the compensation a guest is asked for.
pub const MAX_COMPENSATION: Duration = Duration::from_millis(100);
