//! Completion tracking: the highest completed submission number, the poller
//! thread that drives the device while submissions are outstanding (it parks
//! on a condvar when there is nothing to wait for), and the callbacks of
//! [`WgpuBackend::on_submission_done`](super::WgpuBackend::on_submission_done),
//! which it runs without holding any lock.
//!
//! The poller is the only thread that waits on the device: every other thread
//! that needs a submission done waits here ([`Completion::wait`]) for the
//! poller to see it. Waits of several threads on the device at once are what
//! wgpu's `Device::maintain` races on (an assertion that fails when another
//! thread's poll moved the queue on in between, wgpu 30; gfx-rs/wgpu#9958), and
//! concurrency into the driver is where drivers have corrupted memory
//! (gfx-rs/wgpu#10085). It is also the only thread that polls at all: a reader
//! whose buffer map was asked for after the poll that saw its submission done
//! asks the poller for one more poll ([`Completion::want_poll`]) instead of
//! polling itself. Code that runs on the poller itself (a callback) polls the
//! device from there, as it cannot wait for its own thread.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use virtsoc_sync::{CondvarExt, LockExt};

use super::SubmissionId;
use crate::{GpuError, Result};

/// A completion callback.
pub(super) type Callback = Box<dyn FnOnce(Result<()>) + Send>;

#[derive(Default)]
struct Inner {
    /// Highest submission number handed to the queue.
    submitted: SubmissionId,
    /// wgpu's index of each submission not known complete, by number: the poller waits for
    /// the oldest, so each answers when it is done, not when the newest is.
    indices: BTreeMap<SubmissionId, wgpu::SubmissionIndex>,
    /// Callbacks waiting for their submission, by number.
    waiting: BTreeMap<SubmissionId, Vec<Callback>>,
    /// Callbacks to run at once with a fixed result (unknown ids).
    immediate: Vec<(Callback, GpuError)>,
    /// Set when the device was lost or polling failed: everything fails.
    failed: Option<GpuError>,
    shutdown: bool,
    /// A thread asked for a poll (a buffer map's callback runs inside one).
    poll_wanted: bool,
}

thread_local! {
    /// Set on a backend's poller thread.
    static ON_POLLER: Cell<bool> = const { Cell::new(false) };
}

/// Whether this thread is a backend's poller (where callbacks run).
pub(super) fn on_poller() -> bool {
    ON_POLLER.with(Cell::get)
}

/// How a [`Completion::wait`] ended.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Waited {
    /// The submission completed.
    Done,
    /// The timeout passed first.
    TimedOut,
    /// The device was lost or polling failed (the reason), or the backend is being dropped.
    Failed(GpuError),
}

impl Inner {
    /// Why every pending and later wait and callback fails, if they do: the device was
    /// lost or polling failed, or the backend is being dropped.
    fn failure(&self) -> Option<GpuError> {
        self.failed.clone().or_else(|| {
            self.shutdown
                .then(|| GpuError::Backend("the GPU backend was dropped".into()))
        })
    }
}

/// Shared between the backend, the work-done closures and the poller thread.
pub(super) struct Completion {
    completed: AtomicU64,
    /// Device polls made on a thread other than the poller.
    polls_off_poller: AtomicU64,
    inner: Mutex<Inner>,
    cv: Condvar,
}

impl Completion {
    pub(super) fn new() -> Arc<Self> {
        Arc::new(Completion {
            completed: AtomicU64::new(0),
            polls_off_poller: AtomicU64::new(0),
            inner: Mutex::new(Inner::default()),
            cv: Condvar::new(),
        })
    }

    /// Highest submission known to be complete.
    pub(super) fn completed(&self) -> SubmissionId {
        self.completed.load(Ordering::Acquire)
    }

    /// Counts a device poll about to be made on this thread (see
    /// [`polls_off_poller`](Self::polls_off_poller)).
    pub(super) fn note_poll(&self) {
        if !on_poller() {
            self.polls_off_poller.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Device polls made so far on threads other than the poller (none are expected).
    pub(super) fn polls_off_poller(&self) -> u64 {
        self.polls_off_poller.load(Ordering::Relaxed)
    }

    /// Why waits fail now, if they do (see [`Waited::Failed`]).
    pub(super) fn failure(&self) -> Option<GpuError> {
        self.inner.lock_or_recover().failure()
    }

    /// Asks the poller for one more (non-blocking) poll, made after this call: a buffer map
    /// asked for after the poll that saw its submission done is served by a later poll.
    pub(super) fn want_poll(&self) {
        let mut g = self.inner.lock_or_recover();
        g.poll_wanted = true;
        self.cv.notify_all();
    }

    /// Submission `id` (wgpu's `index`) was handed to the queue: the poller has work.
    pub(super) fn submitted(&self, id: SubmissionId, index: wgpu::SubmissionIndex) {
        let mut g = self.inner.lock_or_recover();
        g.submitted = g.submitted.max(id);
        g.indices.insert(id, index);
        self.cv.notify_all();
    }

    /// The device finished submission `id` (called from inside a device poll).
    pub(super) fn work_done(&self, id: SubmissionId) {
        self.completed.fetch_max(id, Ordering::AcqRel);
        let _g = self.inner.lock_or_recover();
        self.cv.notify_all();
    }

    /// The device was lost: fail every pending and future callback.
    pub(super) fn fail(&self, e: GpuError) {
        let mut g = self.inner.lock_or_recover();
        if g.failed.is_none() {
            g.failed = Some(e);
        }
        self.cv.notify_all();
    }

    pub(super) fn add_callback(&self, id: SubmissionId, known: bool, f: Callback) {
        let mut g = self.inner.lock_or_recover();
        if known {
            g.waiting.entry(id).or_default().push(f);
        } else {
            g.immediate.push((f, GpuError::UnknownSubmission(id)));
        }
        self.cv.notify_all();
    }

    /// Waits until submission `id` has completed (as the poller saw it), the
    /// device failed, or `timeout` passed. Never call it on the poller thread
    /// ([`on_poller`]): nothing would poll.
    pub(super) fn wait(&self, id: SubmissionId, timeout: Duration) -> Waited {
        let end = Instant::now() + timeout;
        let mut g = self.inner.lock_or_recover();
        loop {
            if self.completed() >= id {
                return Waited::Done;
            }
            if let Some(e) = g.failure() {
                return Waited::Failed(e);
            }
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Waited::TimedOut;
            }
            g = self.cv.wait_timeout_or_recover(g, left).0;
        }
    }

    pub(super) fn shutdown(&self) {
        let mut g = self.inner.lock_or_recover();
        g.shutdown = true;
        self.cv.notify_all();
    }
}

fn run(ready: Vec<(Callback, Result<()>)>) {
    for (f, r) in ready {
        if catch_unwind(AssertUnwindSafe(move || f(r))).is_err() {
            log::error!("virtsoc-gpu: a submission callback panicked");
        }
    }
}

/// Starts the poller thread.
pub(super) fn spawn_poller(device: wgpu::Device, c: Arc<Completion>) -> Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("virtsoc-gpu-poll".into())
        .spawn(move || poller(device, c))
        .map_err(|e| GpuError::Backend(format!("poller thread: {e}")))
}

fn poller(device: wgpu::Device, c: Arc<Completion>) {
    ON_POLLER.with(|p| p.set(true));
    let mut g = c.inner.lock_or_recover();
    loop {
        let done = c.completed();
        let mut ready: Vec<(Callback, Result<()>)> = std::mem::take(&mut g.immediate)
            .into_iter()
            .map(|(f, e)| (f, Err(e)))
            .collect();
        let fail = g.failure();
        let later = g.waiting.split_off(&(done + 1));
        let now = std::mem::replace(&mut g.waiting, later);
        ready.extend(now.into_values().flatten().map(|f| (f, Ok(()))));
        if let Some(e) = &fail {
            let all = std::mem::take(&mut g.waiting);
            ready.extend(all.into_values().flatten().map(|f| (f, Err(e.clone()))));
        }
        if !ready.is_empty() {
            drop(g);
            run(ready);
            g = c.inner.lock_or_recover();
            continue;
        }
        if g.shutdown {
            return;
        }
        if g.failed.is_some() {
            g = c.cv.wait_or_recover(g);
            continue;
        }
        // A poll asked for goes first: it waits on nothing, and its asker is waiting.
        let how = if std::mem::take(&mut g.poll_wanted) {
            wgpu::PollType::Poll
        } else if g.submitted > done {
            // The oldest submission not known complete: waiting for the newest (wgpu's
            // default) would answer every earlier one only when the newest is done, so
            // with several on the queue their answers would come together, each but the
            // last late, and device time would be charged to the wrong commands.
            g.indices = g.indices.split_off(&(done + 1));
            wgpu::PollType::Wait {
                submission_index: g.indices.values().next().cloned(),
                timeout: Some(Duration::from_secs(1)),
            }
        } else {
            g = c.cv.wait_or_recover(g);
            continue;
        };
        drop(g);
        let r = super::poll(&device, &c, how);
        g = c.inner.lock_or_recover();
        match r {
            Ok(_) | Err(wgpu::PollError::Timeout) => {}
            Err(e) => {
                if g.failed.is_none() {
                    g.failed = Some(GpuError::DeviceLost(e.to_string()));
                }
                // Threads in `wait` learn it now, not at their timeout.
                c.cv.notify_all();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_ends_with_the_submission_the_failure_or_the_timeout() {
        let c = Completion::new();
        assert_eq!(
            c.wait(0, Duration::ZERO),
            Waited::Done,
            "nothing to wait for"
        );
        assert_eq!(c.wait(2, Duration::ZERO), Waited::TimedOut);
        c.work_done(2);
        assert_eq!(
            c.wait(1, Duration::ZERO),
            Waited::Done,
            "in order: 2 done, so 1"
        );
        assert_eq!(c.wait(2, Duration::from_secs(60)), Waited::Done);
        assert_eq!(c.wait(3, Duration::ZERO), Waited::TimedOut);
        let lost = GpuError::DeviceLost("gone".into());
        c.fail(lost.clone());
        assert_eq!(c.wait(3, Duration::from_secs(60)), Waited::Failed(lost));
        assert_eq!(
            c.wait(2, Duration::ZERO),
            Waited::Done,
            "done before the loss"
        );
        let d = Completion::new();
        d.shutdown();
        assert!(matches!(
            d.wait(1, Duration::from_secs(60)),
            Waited::Failed(_)
        ));
        assert!(!on_poller(), "a test thread is no poller");
    }
}
