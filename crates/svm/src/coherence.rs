//! Coherence protocols: what happens to replicas at begin_access and end_access.
//!
//! - `guest-staging` is the baseline of today's emulators (vSoC section 2.2): the guest window
//!   is the only truth; a device copies the window into its memory before a read of bytes
//!   written since its last pull (a fair baseline: goldfish's GAE uploads a gralloc buffer
//!   only when the guest changed it) and copies its memory back to the window after every
//!   write, so a write by one device and a read by another cost two copies, and an unchanged
//!   region (a static UI layer) none.
//! - `write-invalidate` (vSoC 5.4): a write makes the writer's replica the only valid one; the
//!   next access elsewhere fetches synchronously, on the cheapest path, from a valid replica.
//! - `prefetch` (vSoC 3.3) plugs in through the same trait.
//!
//! Every access names a byte range; validity is tracked per range (see [`crate::ranges`]),
//! so a sub-range access moves only the sub-range.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use virtsoc_prefetch::{AccessKind, PDev, PrefetchEngine, VDev};
use virtsoc_proto::AccessMode;
use virtsoc_sync::LockExt;

use crate::dma::{CopyTicket, Dma, DmaJob};
use crate::domain::DomainId;
use crate::ranges::Range;
use crate::region::{RegionCtx, RegionKey};
use crate::{Result, SvmError};

/// One access as the protocols see it.
#[derive(Debug, Clone, Copy)]
pub struct AccessInfo {
    /// The virtual device (as named by the guest).
    pub vdev: u32,
    /// The memory domain of the physical device behind it.
    pub domain: DomainId,
    /// Read, write or both.
    pub mode: AccessMode,
    /// The bytes accessed, `[start, end)`, checked against the region's size.
    pub range: Range,
    /// Whether the access covers the whole region.
    pub whole: bool,
    /// Set when begin_access is asked again after waiting for an in-flight copy.
    pub retry: bool,
    /// The guest blocks for the compensation this end_access asks for (it waits for the
    /// completion); otherwise the writer's device queue holds its next fence signal until
    /// the prefetch copies finished.
    pub compensates: bool,
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
    /// The guest's predictor, for protocols that have one.
    fn predictor(&self) -> Option<Arc<PrefetchEngine>> {
        None
    }
    /// Reads scored by the protocol's predictor as (hits, misses); (0, 0) without one.
    fn scores(&self) -> (u64, u64) {
        (0, 0)
    }
    /// Bytes of the protocol's own bookkeeping.
    fn metadata_bytes(&self) -> u64 {
        0
    }
    /// The writer of `key` was held back `held` for its prefetch copies outside the guest (a
    /// fence signal on its device queue waited for them).
    fn note_hold(&self, _key: RegionKey, _held: Duration) {}
    /// Whether a device that reads host memory directly ([`crate::AccessSpec::reads_host`])
    /// may read a valid host replica in place. True for the protocols that know where every
    /// replica is; the guest-staging baseline answers false, its devices pulling every read
    /// from the guest.
    fn reads_host_in_place(&self) -> bool {
        true
    }
}

/// The protocols that can be selected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub enum ProtocolKind {
    /// `guest-staging`: the guest window is the only truth; devices copy in before a read of
    /// what changed since their last pull, and back after each write (today's emulators).
    GuestStaging,
    /// `write-invalidate`: a write leaves only the writer's replica valid; the next access
    /// elsewhere fetches synchronously from a valid replica.
    WriteInvalidate,
    /// `prefetch`: write-invalidate plus predicted asynchronous copies to the next reader, started
    /// at end_access.
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
        if d != DomainId::GUEST_WINDOW && a.mode.reads() && !cx.is_valid_in(d, a.range) {
            // The device knows nothing of other devices: it pulls from guest memory, but
            // only what changed since its last pull (as a driver re-uploads a buffer only
            // when the guest wrote it): every write, the guest's or a device's (copied back
            // to the window), leaves the other replicas stale where it wrote.
            cx.copy(DomainId::GUEST_WINDOW, d, a.range)?;
        }
        cx.ensure_replica(d)?;
        if a.mode.writes() {
            cx.make_exclusive(d, a.range)?;
        }
        Ok(Step::Done)
    }

    fn end_access(&self, cx: &mut RegionCtx<'_>, a: &AccessInfo) -> Result<()> {
        if a.mode.writes() && a.domain != DomainId::GUEST_WINDOW {
            cx.copy(a.domain, DomainId::GUEST_WINDOW, a.range)?;
        }
        Ok(())
    }

    fn reads_host_in_place(&self) -> bool {
        false
    }
}

/// Brings `a.domain` up to date for the access: fetches synchronously the stale part of the
/// range it reads, then records its write of the range. A write-only access fetches nothing:
/// the bytes outside its range stay whatever they are where they are.
fn fetch_for(cx: &mut RegionCtx<'_>, a: &AccessInfo) -> Result<()> {
    if a.mode.reads() {
        cx.fetch(a.domain, a.range)?;
    } else {
        cx.ensure_replica(a.domain)?;
    }
    if a.mode.writes() {
        cx.make_exclusive(a.domain, a.range)?;
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

/// Prefetch copies of at most this many bytes are made by the thread that ends the writer's
/// access, right after it releases the region's lock, not by a copy channel: waking a
/// channel's thread and switching to it (and, for a reader already waiting, waking that
/// reader again) costs more than copying a small packet or a command record (64 KiB: about
/// 10 us at this machine's memcpy speed).
pub const INLINE_COPY_MAX: u64 = 64 << 10;

/// vSoC's prefetch protocol: write-invalidate, plus, at a writer's end_access, an
/// asynchronous copy to every physical device the twin hypergraphs predict will read next,
/// and a compensation the writer's guest blocks for when the copy is predicted to outlast the
/// slack. A reader whose prefetch is still in flight waits for it (a device worker parks the
/// command instead of blocking); a mispredicted reader fetches synchronously.
///
/// Each guest has its own instance and its own predictor: one guest's flows never predict,
/// suspend or score another's.
pub struct Prefetch {
    engine: Arc<PrefetchEngine>,
    dma: Arc<Dma>,
    epoch: Instant,
    /// How long each region's last writer was held back for its prefetch (its guest blocked
    /// for the compensation, or its device queue held the next fence signal): the slack the
    /// reader sees starts after the hold, so the hold is taken out of the measured slack.
    held: Mutex<HashMap<RegionKey, Duration>>,
}

impl Prefetch {
    pub(crate) fn new(engine: Arc<PrefetchEngine>, dma: Arc<Dma>, epoch: Instant) -> Self {
        Prefetch {
            engine,
            dma,
            epoch,
            held: Mutex::new(HashMap::new()),
        }
    }

    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<RegionKey, Duration>> {
        self.held.lock_or_recover()
    }

    /// This guest's predictor.
    pub fn engine(&self) -> &Arc<PrefetchEngine> {
        &self.engine
    }
}

/// The predictor's key of a region (predictors are per guest, so the guest's id is enough).
pub fn predictor_key(k: RegionKey) -> virtsoc_prefetch::RegionKey {
    virtsoc_prefetch::RegionKey(k.id)
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
                if let Some(c) = self.held().remove(&region.key) {
                    now = now.saturating_sub(c);
                }
            }
            self.engine.on_begin_access(
                predictor_key(region.key),
                VDev(a.vdev),
                PDev(a.domain.0),
                kind_of(a.mode),
                now,
            );
            counters
                .bookkeeping_ns
                .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        }
        // A write must not race a copy into its own domain (the copy would land on top of
        // it). Copies out of it may go on: the write bumps the generation, so they are not
        // taken as valid.
        if a.mode.writes() {
            if let Some(t) = cx.inflight_to(a.domain) {
                return Ok(Step::WaitFor(t));
            }
        }
        if a.mode.reads() && !cx.is_valid_in(a.domain, a.range) {
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
        let (mut started, mut queued) = (0, 0);
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
            let stale: u64 = cx.stale_ranges(t).iter().map(|(s, e)| e - s).sum();
            if stale == 0 {
                continue;
            }
            let ticket = CopyTicket::new();
            let job = DmaJob {
                region: cx.region_arc(),
                src: a.domain,
                dst: t,
                generation: cx.generation(),
                ticket: ticket.clone(),
            };
            if stale <= INLINE_COPY_MAX && self.dma.copies_inline() {
                // Cheaper than handing it to a channel: made on this thread as soon as the
                // region's lock is released, before the end_access answers.
                cx.inline.push(job);
            } else if self.dma.push(job) {
                queued += 1;
            } else {
                continue;
            }
            cx.set_inflight(t, ticket.clone());
            cx.started.push(ticket);
            started += 1;
        }
        counters.prefetches.fetch_add(started, Ordering::Relaxed);
        // Only a copy left to a channel can outlast the end_access.
        if queued > 0 {
            let c = plan.compensation.min(MAX_COMPENSATION);
            if a.compensates {
                // The guest waits for this completion and blocks for `c` before handing the
                // region on.
                cx.report.compensation = c;
                if !c.is_zero() {
                    self.held().insert(region.key, c);
                }
                counters
                    .compensation_ns
                    .fetch_add(c.as_nanos() as u64, Ordering::Relaxed);
            }
        }
        Ok(())
    }

    fn forget(&self, key: RegionKey) {
        self.held().remove(&key);
        self.engine.forget_region(predictor_key(key));
    }

    fn predictor(&self) -> Option<Arc<PrefetchEngine>> {
        Some(self.engine.clone())
    }

    fn scores(&self) -> (u64, u64) {
        let s = self.engine.stats();
        (s.hits, s.misses)
    }

    fn metadata_bytes(&self) -> u64 {
        self.engine.stats().metadata_bytes
    }

    fn note_hold(&self, key: RegionKey, held: Duration) {
        if !held.is_zero() {
            self.held().insert(key, held);
        }
    }
}

/// Upper bound on the compensation a guest is asked for.
pub const MAX_COMPENSATION: Duration = Duration::from_millis(100);
