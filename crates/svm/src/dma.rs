//! Asynchronous copies: the "DMA engine" that carries out prefetches while the guest goes on.
//!
//! A job copies one region's bytes from a source replica to a destination replica. It takes
//! the region's lock only to look up the replicas and to publish the result, never while the
//! bytes move. A job whose region was written again in the meantime (its generation changed)
//! does not mark its destination valid. Waiters (a reader whose prefetch is still in flight)
//! block on the job's [`CopyTicket`].

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use crate::domain::DomainId;
use crate::engine::CopyEngine;
use crate::region::Region;

/// Completion of one asynchronous copy.
#[derive(Debug, Default)]
pub struct CopyTicket {
    done: Mutex<bool>,
    cv: Condvar,
}

impl CopyTicket {
    /// A ticket for a copy not yet done.
    pub fn new() -> Arc<Self> {
        Arc::new(CopyTicket::default())
    }

    /// Marks the copy finished and wakes waiters.
    pub fn complete(&self) {
        *self.done.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.cv.notify_all();
    }

    /// Whether the copy finished.
    pub fn is_done(&self) -> bool {
        *self.done.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Blocks until the copy finished.
    pub fn wait(&self) {
        let mut d = self.done.lock().unwrap_or_else(|p| p.into_inner());
        while !*d {
            d = self.cv.wait(d).unwrap_or_else(|p| p.into_inner());
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

struct Queue {
    jobs: VecDeque<DmaJob>,
    stop: bool,
}

/// The copy queue and its worker thread.
pub struct Dma {
    queue: Arc<(Mutex<Queue>, Condvar)>,
    worker: Mutex<Option<JoinHandle<()>>>,
}

impl Dma {
    /// Starts the worker.
    pub(crate) fn start(engine: Arc<CopyEngine>) -> Self {
        let queue = Arc::new((
            Mutex::new(Queue {
                jobs: VecDeque::new(),
                stop: false,
            }),
            Condvar::new(),
        ));
        let q = queue.clone();
        let worker = std::thread::Builder::new()
            .name("svm-dma".into())
            .spawn(move || run(q, engine))
            .expect("spawn dma worker");
        Dma {
            queue,
            worker: Mutex::new(Some(worker)),
        }
    }

    /// Queues a copy.
    pub(crate) fn push(&self, job: DmaJob) {
        let (m, cv) = &*self.queue;
        let mut q = m.lock().unwrap_or_else(|p| p.into_inner());
        if q.stop {
            job.ticket.complete();
            return;
        }
        q.jobs.push_back(job);
        cv.notify_one();
    }

    /// Number of copies waiting.
    pub fn depth(&self) -> usize {
        self.queue.0.lock().map(|q| q.jobs.len()).unwrap_or(0)
    }
}

impl Drop for Dma {
    fn drop(&mut self) {
        {
            let (m, cv) = &*self.queue;
            m.lock().unwrap_or_else(|p| p.into_inner()).stop = true;
            cv.notify_all();
        }
        if let Some(h) = self.worker.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = h.join();
        }
    }
}

fn run(queue: Arc<(Mutex<Queue>, Condvar)>, engine: Arc<CopyEngine>) {
    let (m, cv) = &*queue;
    loop {
        let job = {
            let mut q = m.lock().unwrap_or_else(|p| p.into_inner());
            loop {
                if let Some(j) = q.jobs.pop_front() {
                    break j;
                }
                if q.stop {
                    return;
                }
                q = cv.wait(q).unwrap_or_else(|p| p.into_inner());
            }
        };
        execute(&engine, job);
    }
}

fn execute(engine: &CopyEngine, job: DmaJob) {
    let region = &job.region;
    let size = region.meta.size;
    let prepared = {
        let st = region.lock();
        match (st.replicas.get(&job.src), st.replicas.get(&job.dst)) {
            (Some(s), Some(d)) if st.generation == job.generation => {
                Some((s.backing.clone(), d.backing.clone(), !d.fresh))
            }
            _ => None,
        }
    };
    let copied = prepared.and_then(|(sb, db, measure)| {
        match engine.copy(job.src, &sb, job.dst, &db, size, measure) {
            Ok(dt) => {
                let c = region.guest.counters();
                c.copies.fetch_add(1, Ordering::Relaxed);
                c.copy_ns.fetch_add(dt.as_nanos() as u64, Ordering::Relaxed);
                Some(())
            }
            Err(e) => {
                log::warn!("prefetch copy of region {:?} failed: {e}", region.key);
                None
            }
        }
    });
    {
        let mut st = region.lock();
        if copied.is_some() && st.generation == job.generation {
            if let Some(r) = st.replicas.get_mut(&job.dst) {
                r.valid = true;
                r.fresh = false;
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
