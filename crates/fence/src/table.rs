//! The virtual fence table: the host's authoritative record of every virtual
//! fence of one guest (vSoC §3.4, §4).
//!
//! This module owns fence status ([`FenceStatus`]), which ids have a page slot
//! ([`is_page_backed`]; the id itself, [`FenceId`], is declared in `virtsoc-ids`)
//! and [`VirtualFenceTable`], which
//!
//! * allocates fences in the slots of the shared fence page and mirrors
//!   their status into it through a [`FencePageSink`] (host memory is the
//!   source of truth: the page is never read back);
//! * recycles the slots of signaled fences, oldest signal first, when free
//!   slots run low (below [`LOW_WATER_SLOTS`]);
//! * never fails for lack of slots: when every page slot holds an
//!   unsignaled fence it hands out *overflow* fences (`index >= PAGE_SLOTS`)
//!   tracked host-side only, whose status needs a round trip;
//! * signals fences, answers status queries, blocks waiters on a `Condvar`,
//!   runs signal callbacks outside its lock, and tears down (`cancel_all`,
//!   `signal_all`) when the guest goes away.
//!
//! # Fence life cycle
//!
//! `create` → *pending* → `signal` → *signaled* → slot reclaimed. A page slot
//! is reclaimed (and its fence's record dropped) when the fence is signaled
//! **and** released by its owner (immediately, onto the free list), or when
//! it is signaled and the table recycles it under slot pressure. Releasing a
//! fence that is still pending does **not** free its slot: the fence keeps
//! its slot until it is signaled, so that `Wait`s on it keep blocking and the
//! device's `Signal` still finds it. Once reclaimed, an id is *stale*: its
//! status reads `Signaled` forever (reclaiming only happens after signal),
//! and `signal` on it returns [`FenceError::StaleFence`].
//!
//! Overflow fences have no slot; their record is dropped as soon as they are
//! signaled.
//!
//! Generations are 31 bits and wrap (skipping 0) after 2^31 - 1 reuses of
//! one slot; an id older than a full wrap of its slot is reported as unknown
//! instead of signaled.

use crate::error::{FenceError, Result};
use crate::page::{pack_word, FencePageSink, GENERATION_MASK, PAGE_HEADER, PAGE_SLOTS};
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use virtsoc_sync::{CondvarExt, LockExt};

mod snapshot;
pub use snapshot::{FenceTableImage, SlotImage};

/// When fewer than this many page slots are free, `create` recycles the
/// oldest signaled slot before taking a free one (1/8 of the page).
pub const LOW_WATER_SLOTS: usize = PAGE_SLOTS as usize / 8;

/// A callback run once a fence is signaled (or the table cancelled).
pub type SignalCallback = Box<dyn FnOnce() + Send>;

pub use virtsoc_ids::FenceId;

/// Whether the fence has a slot in the shared page, so that the guest can read its status
/// without a round trip (overflow fences, `index >= PAGE_SLOTS`, have none).
pub const fn is_page_backed(id: FenceId) -> bool {
    id.index < PAGE_SLOTS
}

/// Status of a fence.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FenceStatus {
    /// Not signaled yet.
    Pending,
    /// Signaled (possibly long ago: its slot may have been recycled).
    Signaled,
}

/// A snapshot of the table's occupancy and counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FenceStats {
    /// Unsignaled fences (page-backed and overflow).
    pub live: usize,
    /// Signaled fences still holding their page slot (recyclable).
    pub signaled: usize,
    /// Unsignaled overflow fences (subset of `live`).
    pub overflow: usize,
    /// Free page slots.
    pub free_slots: usize,
    /// Slots taken back from signaled fences under slot pressure, ever.
    pub recycled: u64,
    /// Fences created, ever.
    pub created: u64,
    /// Overflow fences created, ever.
    pub overflow_created: u64,
}

enum SlotState {
    Free,
    Pending {
        released: bool,
        callbacks: Vec<SignalCallback>,
    },
    /// Signaled and not released (released + signaled goes straight to Free).
    Signaled,
}

struct Slot {
    generation: u32,
    state: SlotState,
}

/// Where an id's record is, if anywhere.
enum Lookup {
    /// Page slot with matching generation that still holds the fence.
    Page(usize),
    /// Unsignaled overflow fence.
    Overflow,
    /// Issued, signaled, record reclaimed.
    Reclaimed,
    /// Never issued.
    Unknown,
}

/// Number of distinct overflow indices (`PAGE_SLOTS..=u32::MAX`).
const OVERFLOW_RANGE: u64 = u32::MAX as u64 + 1 - PAGE_SLOTS as u64;

fn overflow_id(seq: u64) -> FenceId {
    FenceId {
        index: PAGE_SLOTS + (seq % OVERFLOW_RANGE) as u32,
        generation: (seq / OVERFLOW_RANGE + 1) as u32,
    }
}

fn overflow_seq(id: FenceId) -> Option<u64> {
    if is_page_backed(id) || id.generation == 0 {
        return None;
    }
    Some((id.generation as u64 - 1) * OVERFLOW_RANGE + (id.index - PAGE_SLOTS) as u64)
}

const fn next_generation(generation: u32) -> u32 {
    if generation >= GENERATION_MASK {
        1
    } else {
        generation + 1
    }
}

struct Inner {
    slots: Vec<Slot>,
    /// Free slots, least recently freed first.
    free: VecDeque<u32>,
    /// Signaled, unreleased slots in signal order, as (index, generation);
    /// entries that no longer match a `Signaled` slot are skipped lazily.
    signaled_fifo: VecDeque<(u32, u32)>,
    /// Unsignaled overflow fences and their callbacks.
    overflow: HashMap<FenceId, Vec<SignalCallback>>,
    overflow_next: u64,
    cancelled: bool,
    recycled: u64,
    created: u64,
}

impl Inner {
    /// A table with every slot free, generation 0.
    fn empty() -> Self {
        Inner {
            slots: (0..PAGE_SLOTS)
                .map(|_| Slot {
                    generation: 0,
                    state: SlotState::Free,
                })
                .collect(),
            free: (0..PAGE_SLOTS).collect(),
            signaled_fifo: VecDeque::new(),
            overflow: HashMap::new(),
            overflow_next: 0,
            cancelled: false,
            recycled: 0,
            created: 0,
        }
    }

    fn lookup(&self, id: FenceId) -> Lookup {
        if is_page_backed(id) {
            if id.generation == 0 || id.generation > GENERATION_MASK {
                return Lookup::Unknown;
            }
            let slot = &self.slots[id.index as usize];
            if slot.generation == id.generation {
                match slot.state {
                    SlotState::Free => Lookup::Reclaimed,
                    _ => Lookup::Page(id.index as usize),
                }
            } else if id.generation < slot.generation {
                Lookup::Reclaimed
            } else {
                Lookup::Unknown
            }
        } else if self.overflow.contains_key(&id) {
            Lookup::Overflow
        } else {
            match overflow_seq(id) {
                Some(seq) if seq < self.overflow_next => Lookup::Reclaimed,
                _ => Lookup::Unknown,
            }
        }
    }

    fn status(&self, id: FenceId) -> Result<FenceStatus> {
        let pending = match self.lookup(id) {
            Lookup::Unknown => return Err(FenceError::UnknownFence(id)),
            Lookup::Reclaimed => false,
            Lookup::Overflow => true,
            Lookup::Page(i) => matches!(self.slots[i].state, SlotState::Pending { .. }),
        };
        match (pending, self.cancelled) {
            (false, _) => Ok(FenceStatus::Signaled),
            (true, false) => Ok(FenceStatus::Pending),
            (true, true) => Err(FenceError::Cancelled),
        }
    }

    fn is_recyclable(&self, index: u32, generation: u32) -> bool {
        let slot = &self.slots[index as usize];
        slot.generation == generation && matches!(slot.state, SlotState::Signaled)
    }

    fn pop_recyclable(&mut self) -> Option<u32> {
        while let Some((index, generation)) = self.signaled_fifo.pop_front() {
            if self.is_recyclable(index, generation) {
                self.recycled += 1;
                return Some(index);
            }
        }
        None
    }

    fn take_slot(&mut self) -> Option<u32> {
        if self.free.len() < LOW_WATER_SLOTS {
            if let Some(index) = self.pop_recyclable() {
                return Some(index);
            }
        }
        self.free.pop_front().or_else(|| self.pop_recyclable())
    }

    fn push_signaled(&mut self, index: u32, generation: u32) {
        self.signaled_fifo.push_back((index, generation));
        // Released slots leave dead entries behind; keep the queue bounded.
        if self.signaled_fifo.len() > 2 * PAGE_SLOTS as usize {
            let fifo = std::mem::take(&mut self.signaled_fifo);
            self.signaled_fifo = fifo
                .into_iter()
                .filter(|&(i, g)| self.is_recyclable(i, g))
                .collect();
        }
    }

    /// Marks a pending fence signaled; returns its callbacks.
    fn mark_signaled(&mut self, id: FenceId, sink: &dyn FencePageSink) -> Vec<SignalCallback> {
        if !is_page_backed(id) {
            return self.overflow.remove(&id).unwrap_or_default();
        }
        let index = id.index;
        let slot = &mut self.slots[index as usize];
        let SlotState::Pending {
            released,
            callbacks,
        } = std::mem::replace(&mut slot.state, SlotState::Signaled)
        else {
            unreachable!("mark_signaled on a fence that is not pending");
        };
        sink.store_slot(index, pack_word(slot.generation, true));
        if released {
            slot.state = SlotState::Free;
            self.free.push_back(index);
        } else {
            let generation = slot.generation;
            self.push_signaled(index, generation);
        }
        callbacks
    }

    fn pending_ids(&self) -> Vec<FenceId> {
        let page = self.slots.iter().enumerate().filter_map(|(i, s)| {
            matches!(s.state, SlotState::Pending { .. }).then_some(FenceId {
                index: i as u32,
                generation: s.generation,
            })
        });
        page.chain(self.overflow.keys().copied()).collect()
    }
}

fn run_callbacks(callbacks: Vec<SignalCallback>) {
    for callback in callbacks {
        callback();
    }
}

/// The host's virtual fence table for one guest. Share it with `Arc`; all
/// methods take `&self`.
pub struct VirtualFenceTable {
    sink: Arc<dyn FencePageSink>,
    /// Most live (unsignaled) fences, page-backed and overflow together.
    max_live: usize,
    inner: Mutex<Inner>,
    signaled_cv: Condvar,
}

impl VirtualFenceTable {
    /// A table mirroring into `sink`. Writes the page header and resets
    /// every slot word (generation 0, pending).
    pub fn new(sink: Arc<dyn FencePageSink>) -> Self {
        Self::with_limit(sink, usize::MAX)
    }

    /// Like [`new`](Self::new), holding at most `max_live` unsignaled fences at once (page
    /// slots and overflow together): [`create`](Self::create) fails with
    /// [`FenceError::TooMany`] beyond.
    pub fn with_limit(sink: Arc<dyn FencePageSink>, max_live: usize) -> Self {
        sink.store_header(PAGE_HEADER);
        for index in 0..PAGE_SLOTS {
            sink.store_slot(index, pack_word(0, false));
        }
        Self {
            sink,
            max_live,
            inner: Mutex::new(Inner::empty()),
            signaled_cv: Condvar::new(),
        }
    }

    /// Creates a pending fence. Takes a free page slot (recycling the oldest
    /// signaled slot first when free slots are below [`LOW_WATER_SLOTS`]);
    /// if every slot holds a pending fence, returns an overflow fence.
    ///
    /// Fails after [`cancel_all`](Self::cancel_all), and with [`FenceError::TooMany`] when
    /// the table holds its most live fences.
    pub fn create(&self) -> Result<FenceId> {
        let mut inner = self.inner.lock_or_recover();
        if inner.cancelled {
            return Err(FenceError::Cancelled);
        }
        // Overflow fences exist only while every page slot holds a pending one, so the live
        // count needs counting the page only when the limit is below the page's size.
        if self.max_live < PAGE_SLOTS as usize {
            let pending = inner
                .slots
                .iter()
                .filter(|s| matches!(s.state, SlotState::Pending { .. }))
                .count();
            if pending + inner.overflow.len() >= self.max_live {
                return Err(FenceError::TooMany(self.max_live));
            }
        }
        if let Some(index) = inner.take_slot() {
            inner.created += 1;
            let slot = &mut inner.slots[index as usize];
            slot.generation = next_generation(slot.generation);
            slot.state = SlotState::Pending {
                released: false,
                callbacks: Vec::new(),
            };
            self.sink
                .store_slot(index, pack_word(slot.generation, false));
            return Ok(FenceId {
                index,
                generation: slot.generation,
            });
        }
        // Every page slot holds a pending fence.
        if PAGE_SLOTS as usize + inner.overflow.len() >= self.max_live {
            return Err(FenceError::TooMany(self.max_live));
        }
        inner.created += 1;
        let id = overflow_id(inner.overflow_next);
        inner.overflow_next += 1;
        inner.overflow.insert(id, Vec::new());
        log::debug!("fence page full, handing out overflow fence {id:?}");
        Ok(id)
    }

    /// Signals a fence: mirrors it into the page, wakes waiters, runs its
    /// callbacks (outside the lock). Idempotent while the fence's record
    /// exists; errors on an id never issued ([`FenceError::UnknownFence`]),
    /// on a reclaimed id ([`FenceError::StaleFence`]) and on a pending fence
    /// of a cancelled table ([`FenceError::Cancelled`]).
    pub fn signal(&self, id: FenceId) -> Result<()> {
        let mut inner = self.inner.lock_or_recover();
        match inner.lookup(id) {
            Lookup::Unknown => return Err(FenceError::UnknownFence(id)),
            Lookup::Reclaimed => return Err(FenceError::StaleFence(id)),
            Lookup::Page(i) if matches!(inner.slots[i].state, SlotState::Signaled) => return Ok(()),
            Lookup::Page(_) | Lookup::Overflow => {}
        }
        if inner.cancelled {
            return Err(FenceError::Cancelled);
        }
        let callbacks = inner.mark_signaled(id, &*self.sink);
        drop(inner);
        self.signaled_cv.notify_all();
        run_callbacks(callbacks);
        Ok(())
    }

    /// Status of a fence. A reclaimed (stale) id reads `Signaled`. A pending
    /// fence of a cancelled table is `Err(Cancelled)`.
    pub fn status(&self, id: FenceId) -> Result<FenceStatus> {
        self.inner.lock_or_recover().status(id)
    }

    /// Whether the guest can read `id`'s status from the page (otherwise it
    /// is an overflow fence and needs a round trip to [`status`](Self::status)).
    pub fn is_page_backed(&self, id: FenceId) -> bool {
        is_page_backed(id)
    }

    /// Blocks until the fence is signaled, or until `timeout` (if any) has
    /// passed, in which case it returns `Ok(Pending)`. Returns
    /// `Err(Cancelled)` if the table is cancelled while the fence is pending.
    pub fn wait(&self, id: FenceId, timeout: Option<Duration>) -> Result<FenceStatus> {
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        let mut inner = self.inner.lock_or_recover();
        loop {
            if inner.status(id)? == FenceStatus::Signaled {
                return Ok(FenceStatus::Signaled);
            }
            inner = match (timeout, deadline) {
                (Some(_), Some(deadline)) => {
                    let now = Instant::now();
                    if now >= deadline {
                        return Ok(FenceStatus::Pending);
                    }
                    self.signaled_cv
                        .wait_timeout_or_recover(inner, deadline - now)
                        .0
                }
                // No timeout, or one too large to represent: wait forever.
                _ => self.signaled_cv.wait_or_recover(inner),
            };
        }
    }

    /// Runs `f` once the fence is signaled: right now (in this thread) if it
    /// already is (or is stale), otherwise in the signaling thread, outside
    /// the table lock. On [`cancel_all`](Self::cancel_all) pending callbacks
    /// run too, so callbacks should check [`status`](Self::status) if they
    /// care. Errors (and drops `f`) on an unknown id or a cancelled table.
    pub fn on_signal(&self, id: FenceId, f: SignalCallback) -> Result<()> {
        let mut inner = self.inner.lock_or_recover();
        match inner.status(id)? {
            FenceStatus::Signaled => {
                drop(inner);
                f();
            }
            FenceStatus::Pending => match inner.lookup(id) {
                Lookup::Page(i) => match &mut inner.slots[i].state {
                    SlotState::Pending { callbacks, .. } => callbacks.push(f),
                    _ => unreachable!("pending fence without a pending slot"),
                },
                Lookup::Overflow => inner
                    .overflow
                    .get_mut(&id)
                    .expect("overflow fence present")
                    .push(f),
                Lookup::Reclaimed | Lookup::Unknown => unreachable!("pending fence without record"),
            },
        }
        Ok(())
    }

    /// The owner drops its fence. A signaled fence's slot is freed at once;
    /// a pending fence keeps its slot until it is signaled (then it is freed
    /// at once rather than waiting for recycling). Releasing twice, or
    /// releasing a stale id, is a no-op; an unknown id is an error.
    pub fn release(&self, id: FenceId) -> Result<()> {
        let mut inner = self.inner.lock_or_recover();
        match inner.lookup(id) {
            Lookup::Unknown => Err(FenceError::UnknownFence(id)),
            Lookup::Reclaimed | Lookup::Overflow => Ok(()),
            Lookup::Page(i) => {
                let slot = &mut inner.slots[i];
                match &mut slot.state {
                    SlotState::Pending { released, .. } => *released = true,
                    SlotState::Signaled => {
                        slot.state = SlotState::Free;
                        inner.free.push_back(i as u32);
                    }
                    SlotState::Free => unreachable!("lookup returned a free slot"),
                }
                Ok(())
            }
        }
    }

    /// Signals every pending fence (graceful teardown). Returns how many
    /// were signaled; does nothing on a cancelled table.
    pub fn signal_all(&self) -> usize {
        let mut inner = self.inner.lock_or_recover();
        if inner.cancelled {
            return 0;
        }
        let ids = inner.pending_ids();
        let mut callbacks = Vec::new();
        for &id in &ids {
            callbacks.extend(inner.mark_signaled(id, &*self.sink));
        }
        drop(inner);
        self.signaled_cv.notify_all();
        run_callbacks(callbacks);
        ids.len()
    }

    /// Tears the table down (e.g. the guest disconnected): every waiter on a
    /// pending fence wakes with `Err(Cancelled)`, pending callbacks run, and
    /// from now on `create`, `signal` of pending fences and `on_signal` of
    /// pending fences fail with [`FenceError::Cancelled`]. The page is left
    /// as it was. Idempotent.
    pub fn cancel_all(&self) {
        let mut inner = self.inner.lock_or_recover();
        if inner.cancelled {
            return;
        }
        inner.cancelled = true;
        let mut callbacks = Vec::new();
        for slot in &mut inner.slots {
            if let SlotState::Pending { callbacks: cbs, .. } = &mut slot.state {
                callbacks.append(cbs);
            }
        }
        for cbs in inner.overflow.values_mut() {
            callbacks.append(cbs);
        }
        drop(inner);
        self.signaled_cv.notify_all();
        run_callbacks(callbacks);
    }

    /// Whether [`cancel_all`](Self::cancel_all) was called.
    pub fn is_cancelled(&self) -> bool {
        self.inner.lock_or_recover().cancelled
    }

    /// A snapshot of occupancy and counters.
    pub fn stats(&self) -> FenceStats {
        let inner = self.inner.lock_or_recover();
        let (mut pending, mut signaled) = (0, 0);
        for slot in &inner.slots {
            match slot.state {
                SlotState::Pending { .. } => pending += 1,
                SlotState::Signaled => signaled += 1,
                SlotState::Free => {}
            }
        }
        FenceStats {
            live: pending + inner.overflow.len(),
            signaled,
            overflow: inner.overflow.len(),
            free_slots: inner.free.len(),
            recycled: inner.recycled,
            created: inner.created,
            overflow_created: inner.overflow_next,
        }
    }
}

impl fmt::Debug for VirtualFenceTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VirtualFenceTable")
            .field("stats", &self.stats())
            .field("cancelled", &self.is_cancelled())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests;
