//! Asynchronous copies: the "DMA engine" that carries out prefetches while the guest goes on.
//!
//! A job copies the stale ranges of one region's destination replica from a source replica.
//! It takes the region's lock only to look up the replicas and to publish the result, never
//! while the bytes move. A job whose region was written again in the meantime (its generation
//! changed) does not mark its destination valid. Waiters (a reader whose prefetch is still in
//! flight) block on the job's [`CopyTicket`], or register a callback on it (a device worker
//! parks the command and goes on with other guests' work).
//!
//! Several channels (threads) serve the jobs, and guests take turns: each guest has its own
//! queue and the channels serve the queues round robin, so one guest's large copies never
//! serialise another guest's behind them. A small copy (a packet, a command record: at most
//! [`crate::coherence::INLINE_COPY_MAX`] bytes) is not queued: the thread that ends the
//! writer's access makes it (`execute`) once it has released the region's lock, since
//! handing it to a channel (waking the channel, and a reader waiting for it) costs more than
//! the copy.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use virtsoc_sync::{CondvarExt, LockExt};

use crate::copier::CopyEngine;
use crate::domain::DomainId;
use crate::region::Region;

/// A callback run once when a copy finishes.
pub type OnDone = Box<dyn FnOnce() + Send>;

#[derive(Default)]
struct TicketState {
    done: bool,
    callbacks: Vec<OnDone>,
}

/// Completion of one asynchronous copy.
#[derive(Default)]
pub struct CopyTicket {
    state: Mutex<TicketState>,
    cv: Condvar,
}

impl std::fmt::Debug for CopyTicket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CopyTicket")
            .field("done", &self.is_done())
            .finish()
    }
}

impl CopyTicket {
    /// A ticket for a copy not yet done.
    pub fn new() -> Arc<Self> {
        Arc::new(CopyTicket::default())
    }

    /// Marks the copy finished, wakes waiters and runs the callbacks.
    pub fn complete(&self) {
        let callbacks = {
            let mut st = self.state.lock_or_recover();
            st.done = true;
            std::mem::take(&mut st.callbacks)
        };
        self.cv.notify_all();
        for f in callbacks {
            f();
        }
    }

    /// Whether the copy finished.
    pub fn is_done(&self) -> bool {
        self.state.lock_or_recover().done
    }

    /// Blocks until the copy finished.
    pub fn wait(&self) {
        let mut st = self.state.lock_or_recover();
        while !st.done {
            st = self.cv.wait_or_recover(st);
        }
    }

    /// Runs `f` when the copy finishes (at once, on this thread, if it has).
    pub fn on_done(&self, f: OnDone) {
        let mut st = self.state.lock_or_recover();
        if st.done {
            drop(st);
            f();
        } else {
            st.callbacks.push(f);
        }
    }
}

/// One queued copy.
pub(crate) struct DmaJob {
    pub(crate) region: Arc<Region>,
    pub(crate) src: DomainId,
    pub(crate) dst: DomainId,
    pub(crate) generation: u64,
    pub(crate) ticket: Arc<CopyTicket>,
}

/// Jobs per guest, served round robin.
#[derive(Default)]
struct Queue {
    jobs: HashMap<u64, VecDeque<DmaJob>>,
    /// Guests with queued jobs, in the order they are served.
    turn: VecDeque<u64>,
    stop: bool,
}

impl Queue {
    fn push(&mut self, job: DmaJob) {
        let g = job.region.key.guest;
        let q = self.jobs.entry(g).or_default();
        if q.is_empty() {
            self.turn.push_back(g);
        }
        q.push_back(job);
    }

    /// The next job: the head of the next guest's queue in turn.
    fn pop(&mut self) -> Option<DmaJob> {
        let g = self.turn.pop_front()?;
        let q = self.jobs.get_mut(&g)?;
        let job = q.pop_front();
        if q.is_empty() {
            self.jobs.remove(&g);
        } else {
            self.turn.push_back(g);
        }
        job
    }

    fn len(&self) -> usize {
        self.jobs.values().map(VecDeque::len).sum()
    }
}

/// Copy channels serving one fair queue.
pub struct Dma {
    queue: Arc<(Mutex<Queue>, Condvar)>,
    workers: Mutex<Vec<JoinHandle<()>>>,
    /// Fault injection for tests: every copy a channel makes waits this long (ns) before it
    /// starts, so a test can keep a copy in flight for as long as it needs. 0 in normal
    /// operation.
    delay_ns: Arc<std::sync::atomic::AtomicU64>,
}

/// Copy channels the daemon runs.
pub const CHANNELS: usize = 2;

impl Dma {
    /// Starts `channels` workers.
    pub(crate) fn start(engine: Arc<CopyEngine>, channels: usize) -> Self {
        let queue = Arc::new((Mutex::new(Queue::default()), Condvar::new()));
        let delay_ns = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let workers = (0..channels.max(1))
            .filter_map(|i| {
                let (q, e, d) = (queue.clone(), engine.clone(), delay_ns.clone());
                std::thread::Builder::new()
                    .name(format!("svm-dma-{i}"))
                    .spawn(move || run(q, e, d))
                    .map_err(|err| log::warn!("svm: cannot start copy channel {i}: {err}"))
                    .ok()
            })
            .collect();
        Dma {
            queue,
            workers: Mutex::new(workers),
            delay_ns,
        }
    }

    /// Fault injection for tests: delays every copy a channel makes by `d` before it starts.
    pub(crate) fn set_delay(&self, d: std::time::Duration) {
        self.delay_ns
            .store(d.as_nanos() as u64, std::sync::atomic::Ordering::Relaxed);
    }

    /// Queues a copy. Without a running channel (stopping, or none could be started) the
    /// copy is not made: its ticket completes at once and the reader fetches synchronously.
    pub(crate) fn push(&self, job: DmaJob) -> bool {
        let (m, cv) = &*self.queue;
        let mut q = m.lock_or_recover();
        let no_channel = self.workers.lock_or_recover().is_empty();
        if q.stop || no_channel {
            drop(q);
            job.ticket.complete();
            return false;
        }
        q.push(job);
        cv.notify_one();
        true
    }

    /// Whether a small copy may be made by the thread that asks for it
    /// ([`crate::coherence::INLINE_COPY_MAX`]): not once the channels stop (the daemon is
    /// going away). Such a copy needs no channel, and the fault injection of
    /// [`set_delay`](Self::set_delay) does not hold it up.
    pub(crate) fn copies_inline(&self) -> bool {
        !self.queue.0.lock_or_recover().stop
    }

    /// Number of copies waiting.
    pub fn depth(&self) -> usize {
        self.queue.0.lock_or_recover().len()
    }
}

impl Drop for Dma {
    fn drop(&mut self) {
        {
            let (m, cv) = &*self.queue;
            m.lock_or_recover().stop = true;
            cv.notify_all();
        }
        for h in self.workers.lock_or_recover().drain(..) {
            let _ = h.join();
        }
    }
}

fn run(
    queue: Arc<(Mutex<Queue>, Condvar)>,
    engine: Arc<CopyEngine>,
    delay_ns: Arc<std::sync::atomic::AtomicU64>,
) {
    let (m, cv) = &*queue;
    loop {
        let job = {
            let mut q = m.lock_or_recover();
            loop {
                if let Some(j) = q.pop() {
                    break j;
                }
                if q.stop {
                    return;
                }
                q = cv.wait_or_recover(q);
            }
        };
        let delay = delay_ns.load(std::sync::atomic::Ordering::Relaxed);
        if delay > 0 {
            std::thread::sleep(std::time::Duration::from_nanos(delay));
        }
        execute(&engine, job);
    }
}

/// Makes one copy and completes its ticket; the region's lock must not be held.
pub(crate) fn execute(engine: &CopyEngine, job: DmaJob) {
    let region = &job.region;
    let prepared = {
        let st = region.lock();
        match (st.replicas.get(&job.src), st.replicas.get(&job.dst)) {
            // Memory a device lent is never copied into (see `adopt`).
            (Some(s), Some(d)) if st.generation == job.generation && !d.adopted => {
                let pieces = if st.written {
                    d.stale.pieces().to_vec()
                } else {
                    Vec::new()
                };
                // Copy only what the source holds.
                let pieces: Vec<_> = pieces
                    .into_iter()
                    .filter(|p| !st.written || !s.stale.overlaps(*p))
                    .collect();
                Some((s.backing.clone(), d.backing.clone(), !d.fresh, pieces))
            }
            _ => None,
        }
    };
    let mut copied = Vec::new();
    if let Some((sb, db, measure, pieces)) = prepared {
        for p in pieces {
            match engine.copy_ahead(job.src, &sb, job.dst, &db, p, measure) {
                Ok(dt) => {
                    region
                        .guest
                        .counters()
                        .count_copy(job.src.0, job.dst.0, p.1 - p.0, dt);
                    copied.push(p);
                }
                Err(e) => {
                    log::warn!("prefetch copy of region {:?} failed: {e}", region.key);
                    break;
                }
            }
        }
    }
    {
        let mut st = region.lock();
        if st.generation == job.generation {
            if let Some(r) = st.replicas.get_mut(&job.dst) {
                for p in &copied {
                    r.stale.remove(*p);
                }
                if !copied.is_empty() {
                    r.fresh = false;
                }
            }
        }
        if st
            .inflight
            .get(&job.dst)
            .is_some_and(|t| Arc::ptr_eq(t, &job.ticket))
        {
            st.inflight.remove(&job.dst);
        }
    }
    job.ticket.complete();
}
