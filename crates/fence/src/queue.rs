//! Per-device command queues that honour virtual fences (vSoC §3.4).
//!
//! This module owns [`OrderedQueue`], the FIFO between a virtual device's
//! transport (which pushes the guest's commands and fence instructions as
//! [`QueueItem`]s, never blocking) and the device's single worker thread
//! (which pops runnable commands in order):
//!
//! * `Cmd(c)` items are returned to the worker in FIFO order, each with a
//!   [`DoneToken`] that the worker completes (by `done()` or by dropping it)
//!   once the command has actually finished executing;
//! * `Signal(f)` items are executed by the queue itself: `f` is signaled
//!   as soon as every command popped before the `Signal` has been reported
//!   done (immediately if there are none). This allows workers that
//!   pipeline commands and complete them later, even from another thread;
//! * `Wait(f)` items stop the queue (only this queue) until `f` is
//!   signaled: no item behind a `Wait(f)` is handed out before that.
//!
//! If the fence table is cancelled (guest gone), a queue blocked on a
//! `Wait` closes itself and the worker's `pop_ready` returns `None`.
//! A `Wait` on an id the table never issued is skipped with a warning rather
//! than blocking forever; `Signal`s of stale/unknown ids are logged. A worker
//! that bounds how long a queue may be held gives up a pending `Wait` with
//! [`OrderedQueue::abandon_wait`].

use crate::error::{FenceError, Result};
use crate::table::{FenceId, FenceStatus, VirtualFenceTable};
use std::collections::{BTreeSet, VecDeque};
use std::fmt;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use virtsoc_sync::{CondvarExt, LockExt};

/// One entry of a device queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QueueItem<T> {
    /// A device command, executed by the worker.
    Cmd(T),
    /// Signal this fence once all commands before it have completed.
    Signal(FenceId),
    /// Hold back everything behind this item until the fence is signaled.
    Wait(FenceId),
}

/// Result of a non-blocking [`OrderedQueue::try_pop_ready`].
#[derive(Debug)]
pub enum TryPop<T> {
    /// The next command, and the token to complete once it has executed.
    Ready(T, DoneToken),
    /// The queue is held by a `Wait` on this (pending) fence.
    Blocked(FenceId),
    /// Nothing queued.
    Empty,
    /// The queue was closed (or its fence table cancelled).
    Closed,
}

fn fire(table: &VirtualFenceTable, fences: Vec<FenceId>) {
    for id in fences {
        if let Err(e) = table.signal(id) {
            log::warn!("queue Signal({id:?}) failed: {e}");
        }
    }
}

/// Tracks popped-but-unfinished commands and the `Signal`s waiting on them.
struct Completion {
    table: Arc<VirtualFenceTable>,
    state: Mutex<CompletionState>,
}

#[derive(Default)]
struct CompletionState {
    next_token: u64,
    outstanding: BTreeSet<u64>,
    /// `(barrier, fence)`: signal `fence` once no token `< barrier` is
    /// outstanding. Barriers are non-decreasing.
    pending_signals: VecDeque<(u64, FenceId)>,
}

impl CompletionState {
    fn drain_ready(&mut self) -> Vec<FenceId> {
        let mut ready = Vec::new();
        while let Some(&(barrier, id)) = self.pending_signals.front() {
            match self.outstanding.first() {
                Some(&oldest) if oldest < barrier => break,
                _ => {
                    self.pending_signals.pop_front();
                    ready.push(id);
                }
            }
        }
        ready
    }
}

impl Completion {
    fn issue(self: &Arc<Self>) -> DoneToken {
        let mut st = self.state.lock_or_recover();
        let seq = st.next_token;
        st.next_token += 1;
        st.outstanding.insert(seq);
        DoneToken {
            seq,
            completion: self.clone(),
        }
    }

    /// Queues a `Signal`; returns the fences now ready to fire.
    fn push_signal(&self, id: FenceId) -> Vec<FenceId> {
        let mut st = self.state.lock_or_recover();
        let barrier = st.next_token;
        st.pending_signals.push_back((barrier, id));
        st.drain_ready()
    }

    fn complete(&self, seq: u64) {
        let ready = {
            let mut st = self.state.lock_or_recover();
            st.outstanding.remove(&seq);
            st.drain_ready()
        };
        fire(&self.table, ready);
    }
}

/// Proof that a popped command is in flight. Completing it (`done()` or
/// drop) tells the queue the command has finished, which may fire `Signal`
/// items queued after it. Can be sent to another thread (e.g. a completion
/// handler).
#[must_use = "dropping the token reports the command as completed"]
pub struct DoneToken {
    seq: u64,
    completion: Arc<Completion>,
}

impl DoneToken {
    /// Reports the command as completed (same as dropping the token).
    pub fn done(self) {}

    /// Position of the command among the commands popped from its queue.
    pub fn seq(&self) -> u64 {
        self.seq
    }
}

impl Drop for DoneToken {
    fn drop(&mut self) {
        self.completion.complete(self.seq);
    }
}

impl fmt::Debug for DoneToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DoneToken").field("seq", &self.seq).finish()
    }
}

struct State<T> {
    items: VecDeque<QueueItem<T>>,
    closed: bool,
    /// The fence whose signal callback is registered for the `Wait` at the
    /// front, so spurious wake-ups do not register it again.
    armed: Option<FenceId>,
}

struct Shared<T> {
    state: Mutex<State<T>>,
    cv: Condvar,
}

/// A per-device FIFO of commands and fence instructions, for one worker.
///
/// Pushing never blocks. A device worker looks like this:
///
/// ```
/// use std::sync::Arc;
/// use virtsoc_fence::{FenceStatus, MemPage, OrderedQueue, QueueItem, VirtualFenceTable};
///
/// let table = Arc::new(VirtualFenceTable::new(Arc::new(MemPage::new())));
/// let queue = Arc::new(OrderedQueue::new(table.clone()));
/// let worker = {
///     let queue = queue.clone();
///     std::thread::spawn(move || {
///         while let Some((cmd, token)) = queue.pop_ready() {
///             let _: &str = cmd; // execute the command ...
///             token.done(); // ... then Signals queued after it may fire
///         }
///     })
/// };
/// let fence = table.create().unwrap();
/// queue.push(QueueItem::Cmd("decode frame")).unwrap();
/// queue.push(QueueItem::Signal(fence)).unwrap();
/// assert_eq!(table.wait(fence, None).unwrap(), FenceStatus::Signaled);
/// queue.close();
/// worker.join().unwrap();
/// ```
///
/// Lock order: queue state, then completion state, then the fence table;
/// no lock is held while fences are signaled.
pub struct OrderedQueue<T> {
    shared: Arc<Shared<T>>,
    completion: Arc<Completion>,
}

impl<T: Send + 'static> OrderedQueue<T> {
    /// An empty, open queue whose fences live in `table`.
    pub fn new(table: Arc<VirtualFenceTable>) -> Self {
        Self {
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    items: VecDeque::new(),
                    closed: false,
                    armed: None,
                }),
                cv: Condvar::new(),
            }),
            completion: Arc::new(Completion {
                table,
                state: Mutex::new(CompletionState::default()),
            }),
        }
    }

    /// Appends an item; never blocks. Fails once the queue is closed.
    pub fn push(&self, item: QueueItem<T>) -> Result<()> {
        let mut st = self.shared.state.lock_or_recover();
        if st.closed {
            return Err(FenceError::QueueClosed);
        }
        st.items.push_back(item);
        drop(st);
        self.shared.cv.notify_all();
        Ok(())
    }

    /// Appends an item unless `max` items are already queued
    /// ([`FenceError::QueueFull`]); never blocks. Fails once the queue is closed.
    pub fn push_bounded(&self, item: QueueItem<T>, max: usize) -> Result<()> {
        let mut st = self.shared.state.lock_or_recover();
        if st.closed {
            return Err(FenceError::QueueClosed);
        }
        if st.items.len() >= max {
            return Err(FenceError::QueueFull(max));
        }
        st.items.push_back(item);
        drop(st);
        self.shared.cv.notify_all();
        Ok(())
    }

    /// Closes the queue: pushes fail, the worker's `pop_ready` returns
    /// `None`, queued items are dropped unexecuted. Outstanding tokens still
    /// fire the `Signal`s already popped when they complete.
    pub fn close(&self) {
        let mut st = self.shared.state.lock_or_recover();
        st.closed = true;
        st.items.clear();
        drop(st);
        self.shared.cv.notify_all();
    }

    /// Whether the queue is closed.
    pub fn is_closed(&self) -> bool {
        self.shared.state.lock_or_recover().closed
    }

    /// Items queued and not yet popped (commands and fence items), for flow
    /// control feedback.
    pub fn len(&self) -> usize {
        self.shared.state.lock_or_recover().items.len()
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Gives up the `Wait(id)` at the front of the queue, if `id` is still pending there: the
    /// items behind it become ready. For a worker that bounds how long a queue may wait (a
    /// fence that is never signaled must not hold the queue forever). Returns whether a wait
    /// was dropped.
    pub fn abandon_wait(&self, id: FenceId) -> bool {
        let mut st = self.shared.state.lock_or_recover();
        if !matches!(st.items.front(), Some(QueueItem::Wait(w)) if *w == id) {
            return false;
        }
        if self.completion.table.status(id) != Ok(FenceStatus::Pending) {
            return false;
        }
        st.items.pop_front();
        st.armed = None;
        drop(st);
        self.shared.cv.notify_all();
        true
    }

    /// Commands popped whose tokens have not completed yet.
    pub fn in_flight(&self) -> usize {
        self.completion.state.lock_or_recover().outstanding.len()
    }

    /// Blocks until the next command can run and returns it with its
    /// completion token; executes `Signal`/`Wait` items on the way. Returns
    /// `None` once the queue is closed or its fence table cancelled.
    ///
    /// A worker that completes its tokens on its own thread must do so
    /// before calling `pop_ready` again if a later `Wait` may depend on a
    /// `Signal` in this same queue.
    pub fn pop_ready(&self) -> Option<(T, DoneToken)> {
        match self.pop(true) {
            TryPop::Ready(cmd, token) => Some((cmd, token)),
            TryPop::Closed => None,
            TryPop::Blocked(_) | TryPop::Empty => unreachable!("blocking pop returned early"),
        }
    }

    /// Non-blocking variant of [`pop_ready`](Self::pop_ready), for event
    /// loops and tests.
    pub fn try_pop_ready(&self) -> TryPop<T> {
        self.pop(false)
    }

    fn pop(&self, block: bool) -> TryPop<T> {
        let table = &self.completion.table;
        let mut st = self.shared.state.lock_or_recover();
        loop {
            if st.closed {
                return TryPop::Closed;
            }
            let wait_on = match st.items.front() {
                None if block => {
                    st = self.wait(st);
                    continue;
                }
                None => return TryPop::Empty,
                Some(QueueItem::Cmd(_)) => {
                    let Some(QueueItem::Cmd(cmd)) = st.items.pop_front() else {
                        unreachable!()
                    };
                    return TryPop::Ready(cmd, self.completion.issue());
                }
                Some(&QueueItem::Signal(id)) => {
                    st.items.pop_front();
                    let ready = self.completion.push_signal(id);
                    if !ready.is_empty() {
                        // Callbacks of the signaled fences may lock this
                        // queue: never signal under our lock.
                        drop(st);
                        fire(table, ready);
                        st = self.shared.state.lock_or_recover();
                    }
                    continue;
                }
                Some(&QueueItem::Wait(id)) => id,
            };
            match table.status(wait_on) {
                Ok(FenceStatus::Signaled) => {
                    st.items.pop_front();
                    st.armed = None;
                }
                Err(FenceError::Cancelled) => {
                    st.closed = true;
                    st.items.clear();
                    return TryPop::Closed;
                }
                Err(e) => {
                    log::warn!("skipping Wait({wait_on:?}): {e}");
                    st.items.pop_front();
                    st.armed = None;
                }
                Ok(FenceStatus::Pending) if st.armed != Some(wait_on) => {
                    st.armed = Some(wait_on);
                    drop(st);
                    let weak = Arc::downgrade(&self.shared);
                    let wake = Box::new(move || {
                        if let Some(shared) = weak.upgrade() {
                            let _st = shared.state.lock_or_recover();
                            shared.cv.notify_all();
                        }
                    });
                    // May run `wake` right here if the fence was signaled
                    // meanwhile; either way the status is re-checked under
                    // our lock before sleeping, and a later signal needs our
                    // lock to notify, so no wake-up is lost.
                    if let Err(e) = table.on_signal(wait_on, wake) {
                        log::debug!("on_signal({wait_on:?}): {e}");
                    }
                    st = self.shared.state.lock_or_recover();
                }
                Ok(FenceStatus::Pending) if block => st = self.wait(st),
                Ok(FenceStatus::Pending) => return TryPop::Blocked(wait_on),
            }
        }
    }

    fn wait<'a>(&'a self, st: MutexGuard<'a, State<T>>) -> MutexGuard<'a, State<T>> {
        self.shared.cv.wait_or_recover(st)
    }
}

impl<T> fmt::Debug for OrderedQueue<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = self.shared.state.lock_or_recover();
        f.debug_struct("OrderedQueue")
            .field("len", &st.items.len())
            .field("closed", &st.closed)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::page::MemPage;
    use std::sync::mpsc;
    use std::thread;

    fn setup() -> (Arc<VirtualFenceTable>, OrderedQueue<u32>) {
        let table = Arc::new(VirtualFenceTable::new(Arc::new(MemPage::new())));
        let queue = OrderedQueue::new(table.clone());
        (table, queue)
    }

    fn ready(q: &OrderedQueue<u32>) -> (u32, DoneToken) {
        match q.try_pop_ready() {
            TryPop::Ready(c, t) => (c, t),
            other => panic!("expected a command, got {other:?}"),
        }
    }

    #[test]
    fn commands_in_fifo_order_and_len() {
        let (_t, q) = setup();
        for i in 0..5 {
            q.push(QueueItem::Cmd(i)).unwrap();
        }
        assert_eq!(q.len(), 5);
        for i in 0..5 {
            let (c, tok) = ready(&q);
            assert_eq!(c, i);
            tok.done();
        }
        assert!(q.is_empty());
        assert!(matches!(q.try_pop_ready(), TryPop::Empty));
    }

    #[test]
    fn signal_waits_for_preceding_commands_to_complete() {
        let (table, q) = setup();
        let f = table.create().unwrap();
        q.push(QueueItem::Cmd(1)).unwrap();
        q.push(QueueItem::Cmd(2)).unwrap();
        q.push(QueueItem::Signal(f)).unwrap();
        q.push(QueueItem::Cmd(3)).unwrap();
        let (_, t1) = ready(&q);
        let (_, t2) = ready(&q);
        let (c3, t3) = ready(&q); // passes the Signal, which must not fire yet
        assert_eq!(c3, 3);
        assert_eq!(table.status(f).unwrap(), FenceStatus::Pending);
        t2.done();
        assert_eq!(table.status(f).unwrap(), FenceStatus::Pending);
        t3.done(); // a later command does not matter
        assert_eq!(table.status(f).unwrap(), FenceStatus::Pending);
        assert_eq!(q.in_flight(), 1);
        drop(t1);
        assert_eq!(table.status(f).unwrap(), FenceStatus::Signaled);
    }

    #[test]
    fn an_abandoned_wait_lets_the_items_behind_it_run() {
        let (table, q) = setup();
        let f = table.create().unwrap();
        let other = table.create().unwrap();
        q.push(QueueItem::Wait(f)).unwrap();
        q.push(QueueItem::Cmd(7)).unwrap();
        assert!(matches!(q.try_pop_ready(), TryPop::Blocked(id) if id == f));
        assert!(!q.abandon_wait(other), "only the wait at the front");
        assert!(matches!(q.try_pop_ready(), TryPop::Blocked(_)));
        assert!(q.abandon_wait(f));
        assert!(!q.abandon_wait(f), "once");
        let (c, _t) = ready(&q);
        assert_eq!(c, 7);
        assert_eq!(
            table.status(f).unwrap(),
            FenceStatus::Pending,
            "the fence is not signaled"
        );
        // A wait whose fence was signaled meanwhile is not abandoned: it is simply passed.
        let g = table.create().unwrap();
        q.push(QueueItem::Wait(g)).unwrap();
        table.signal(g).unwrap();
        assert!(!q.abandon_wait(g));
    }

    #[test]
    fn signal_with_nothing_outstanding_fires_immediately() {
        let (table, q) = setup();
        let f = table.create().unwrap();
        q.push(QueueItem::Signal(f)).unwrap();
        assert!(matches!(q.try_pop_ready(), TryPop::Empty));
        assert_eq!(table.status(f).unwrap(), FenceStatus::Signaled);
    }

    #[test]
    fn wait_blocks_only_until_signaled() {
        let (table, q) = setup();
        let f = table.create().unwrap();
        q.push(QueueItem::Cmd(1)).unwrap();
        q.push(QueueItem::Wait(f)).unwrap();
        q.push(QueueItem::Cmd(2)).unwrap();
        ready(&q).1.done();
        assert!(matches!(q.try_pop_ready(), TryPop::Blocked(id) if id == f));
        assert!(matches!(q.try_pop_ready(), TryPop::Blocked(id) if id == f));
        table.signal(f).unwrap();
        assert_eq!(ready(&q).0, 2);
    }

    #[test]
    fn cross_queue_ordering_with_worker_threads() {
        // Codec queue writes then signals; GPU queue waits then reads.
        let table = Arc::new(VirtualFenceTable::new(Arc::new(MemPage::new())));
        let codec = Arc::new(OrderedQueue::new(table.clone()));
        let gpu = Arc::new(OrderedQueue::new(table.clone()));
        let f = table.create().unwrap();
        gpu.push(QueueItem::Wait(f)).unwrap();
        gpu.push(QueueItem::Cmd("read")).unwrap();
        let (log_tx, log_rx) = mpsc::channel();
        let gpu_worker = {
            let gpu = gpu.clone();
            let log_tx = log_tx.clone();
            thread::spawn(move || {
                while let Some((cmd, tok)) = gpu.pop_ready() {
                    log_tx.send(cmd).unwrap();
                    tok.done();
                }
            })
        };
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let codec_worker = {
            let codec = codec.clone();
            thread::spawn(move || {
                while let Some((cmd, tok)) = codec.pop_ready() {
                    go_rx.recv().unwrap(); // the test decides when it "finishes"
                    log_tx.send(cmd).unwrap();
                    tok.done();
                }
            })
        };
        codec.push(QueueItem::Cmd("write")).unwrap();
        codec.push(QueueItem::Signal(f)).unwrap();
        go_tx.send(()).unwrap();
        assert_eq!(log_rx.recv().unwrap(), "write");
        assert_eq!(log_rx.recv().unwrap(), "read");
        codec.close();
        gpu.close();
        codec_worker.join().unwrap();
        gpu_worker.join().unwrap();
    }

    #[test]
    fn close_wakes_a_blocked_worker() {
        let (table, q) = setup();
        let q = Arc::new(q);
        let f = table.create().unwrap();
        q.push(QueueItem::Wait(f)).unwrap();
        q.push(QueueItem::Cmd(9)).unwrap();
        let (tx, rx) = mpsc::channel();
        let worker = {
            let q = q.clone();
            thread::spawn(move || {
                tx.send(()).unwrap();
                q.pop_ready().map(|(c, _)| c)
            })
        };
        rx.recv().unwrap();
        q.close();
        assert_eq!(worker.join().unwrap(), None);
        assert_eq!(q.push(QueueItem::Cmd(1)), Err(FenceError::QueueClosed));
    }

    #[test]
    fn cancelled_table_closes_a_waiting_queue() {
        let (table, q) = setup();
        let q = Arc::new(q);
        let f = table.create().unwrap();
        q.push(QueueItem::Wait(f)).unwrap();
        q.push(QueueItem::Cmd(9)).unwrap();
        let (tx, rx) = mpsc::channel();
        let worker = {
            let q = q.clone();
            thread::spawn(move || {
                tx.send(()).unwrap();
                q.pop_ready().map(|(c, _)| c)
            })
        };
        rx.recv().unwrap();
        table.cancel_all();
        assert_eq!(worker.join().unwrap(), None);
        assert!(q.is_closed());
    }

    #[test]
    fn wait_on_unknown_fence_is_skipped() {
        let (_table, q) = setup();
        let bogus = FenceId {
            index: 3,
            generation: 77,
        };
        q.push(QueueItem::Wait(bogus)).unwrap();
        q.push(QueueItem::Cmd(5)).unwrap();
        assert_eq!(ready(&q).0, 5);
    }

    #[test]
    fn queue_is_send_and_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<OrderedQueue<Vec<u8>>>();
        assert_send_sync::<DoneToken>();
    }
}
