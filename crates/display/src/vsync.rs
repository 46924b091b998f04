//! Driving a [`Display`] in real time: the vsync schedule, the clock,
//! subscriber delivery, and the [`VsyncThread`] that ties them together.
//!
//! * [`VsyncSchedule`] is the pacing math: absolute deadlines
//!   `start + k * 1e9 / hz` (computed exactly, so no drift accumulates),
//!   and which deadline a late wake-up belongs to.
//! * [`Clock`] / [`MonotonicClock`]: where "now" comes from
//!   (`CLOCK_MONOTONIC`, the clock guests and cameras stamp frames with).
//! * [`Subscribers`]: bounded mpsc channels, one per subscriber. A
//!   subscriber that does not keep up loses events (counted as lagged)
//!   instead of stalling the display; one whose receiver was dropped is
//!   removed at the next vsync.
//! * [`VsyncThread`]: sleeps until each deadline (a condition variable wait
//!   with a timeout, so `stop` wakes it at once; no busy polling), runs
//!   [`Display::on_vsync`] and publishes the event.

use std::fmt;
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;
use virtsoc_sync::{CondvarExt, LockExt};

use crate::display::{Display, PresentOutcome, VsyncEvent};
use crate::error::{DisplayError, Result};
use crate::frame::{GuestId, PresentedFrame};

/// Absolute vsync deadlines at a fixed rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VsyncSchedule {
    start_ns: u64,
    hz: u32,
    next: u64,
}

/// A deadline that came due, from [`VsyncSchedule::due`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tick {
    /// Index of the deadline (`deadline = start + index * period`).
    pub index: u64,
    /// The deadline.
    pub deadline_ns: u64,
    /// Deadlines skipped because the wake-up came more than a period late.
    pub missed: u64,
}

impl VsyncSchedule {
    /// Deadlines `start_ns + k / hz` seconds for k = 1, 2, ...; `None` if
    /// `hz` is 0.
    pub fn new(start_ns: u64, hz: u32) -> Option<Self> {
        (hz > 0).then_some(VsyncSchedule {
            start_ns,
            hz,
            next: 1,
        })
    }

    /// The `index`-th deadline.
    pub fn deadline(&self, index: u64) -> u64 {
        let offset = u128::from(index) * 1_000_000_000 / u128::from(self.hz);
        self.start_ns
            .saturating_add(u64::try_from(offset).unwrap_or(u64::MAX))
    }

    /// The next deadline not yet consumed.
    pub fn next_deadline(&self) -> u64 {
        self.deadline(self.next)
    }

    /// If the next deadline has come at `now_ns`, consumes it (and any
    /// later ones that have also passed, which count as missed) and returns
    /// the latest passed deadline.
    pub fn due(&mut self, now_ns: u64) -> Option<Tick> {
        if now_ns < self.next_deadline() {
            return None;
        }
        // Largest k with deadline(k) <= now: k = floor((now - start) * hz / 1e9).
        let elapsed = u128::from(now_ns - self.start_ns);
        let k = u64::try_from(elapsed * u128::from(self.hz) / 1_000_000_000)
            .unwrap_or(u64::MAX)
            .max(self.next);
        let tick = Tick {
            index: k,
            deadline_ns: self.deadline(k),
            missed: k - self.next,
        };
        self.next = k.saturating_add(1);
        Some(tick)
    }
}

/// A source of nanosecond timestamps.
pub trait Clock: Send + Sync {
    /// Now, in nanoseconds.
    fn now_ns(&self) -> u64;
}

/// `CLOCK_MONOTONIC` in nanoseconds.
#[derive(Debug, Default, Clone, Copy)]
pub struct MonotonicClock;

impl Clock for MonotonicClock {
    fn now_ns(&self) -> u64 {
        let ts = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
        let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
        let nanos = u64::try_from(ts.tv_nsec).unwrap_or(0);
        secs.saturating_mul(1_000_000_000).saturating_add(nanos)
    }
}

/// Identifies a subscription.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SubscriberId(pub u64);

/// Events queued per subscriber before further events are skipped.
pub const SUBSCRIBER_QUEUE: usize = 16;

/// The vsync subscriber list.
#[derive(Debug, Default)]
pub struct Subscribers {
    next_id: u64,
    subs: Vec<(SubscriberId, SyncSender<VsyncEvent>)>,
    lagged: u64,
}

impl Subscribers {
    /// An empty list.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a subscriber; events arrive on the returned receiver.
    pub fn subscribe(&mut self) -> (SubscriberId, Receiver<VsyncEvent>) {
        let (tx, rx) = mpsc::sync_channel(SUBSCRIBER_QUEUE);
        self.next_id += 1;
        let id = SubscriberId(self.next_id);
        self.subs.push((id, tx));
        (id, rx)
    }

    /// Removes a subscriber (its receiver then reports disconnection once
    /// drained). `false` if it was not subscribed.
    pub fn unsubscribe(&mut self, id: SubscriberId) -> bool {
        let before = self.subs.len();
        self.subs.retain(|(s, _)| *s != id);
        self.subs.len() != before
    }

    /// Sends `event` to every subscriber; drops those whose receiver is
    /// gone. Returns how many received it.
    pub fn publish(&mut self, event: &VsyncEvent) -> usize {
        let mut delivered = 0;
        let mut lagged = 0;
        self.subs.retain(|(_, tx)| match tx.try_send(*event) {
            Ok(()) => {
                delivered += 1;
                true
            }
            Err(TrySendError::Full(_)) => {
                lagged += 1;
                true
            }
            Err(TrySendError::Disconnected(_)) => false,
        });
        self.lagged += lagged;
        delivered
    }

    /// Number of subscribers.
    pub fn len(&self) -> usize {
        self.subs.len()
    }

    /// Whether there are no subscribers.
    pub fn is_empty(&self) -> bool {
        self.subs.is_empty()
    }

    /// Events skipped because a subscriber's queue was full.
    pub fn lagged(&self) -> u64 {
        self.lagged
    }
}

struct Shared {
    display: Mutex<Display>,
    subscribers: Mutex<Subscribers>,
    stop: Mutex<bool>,
    wake: Condvar,
    clock: Arc<dyn Clock>,
    /// The vsync rate asked for (the thread restarts its schedule when it changes).
    hz: std::sync::atomic::AtomicU32,
}

/// Runs a [`Display`]'s vsync on a dedicated thread.
pub struct VsyncThread {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl fmt::Debug for VsyncThread {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VsyncThread")
            .field("running", &self.thread.is_some())
            .finish_non_exhaustive()
    }
}

impl VsyncThread {
    /// Starts vsync for `display` on `CLOCK_MONOTONIC`.
    pub fn spawn(display: Display) -> Result<Self> {
        Self::spawn_with_clock(display, Arc::new(MonotonicClock))
    }

    /// Starts vsync for `display`, timestamping with `clock`. The thread
    /// sleeps with the system's monotonic timer, so `clock` must advance at
    /// real-time rate (an offset or a different epoch is fine).
    pub fn spawn_with_clock(display: Display, clock: Arc<dyn Clock>) -> Result<Self> {
        let hz = display.refresh_hz();
        let shared = Arc::new(Shared {
            display: Mutex::new(display),
            subscribers: Mutex::new(Subscribers::new()),
            stop: Mutex::new(false),
            wake: Condvar::new(),
            clock,
            hz: std::sync::atomic::AtomicU32::new(hz),
        });
        let schedule = VsyncSchedule::new(shared.clock.now_ns(), hz).ok_or(
            DisplayError::InvalidConfig("refresh rate must be 1-1000 Hz"),
        )?;
        let worker = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("virtsoc-vsync".into())
            .spawn(move || run(&worker, schedule))
            .map_err(DisplayError::Spawn)?;
        Ok(VsyncThread {
            shared,
            thread: Some(thread),
        })
    }

    /// Presents a frame (see [`Display::present`]).
    pub fn present(&self, frame: PresentedFrame) -> Result<PresentOutcome> {
        self.shared.display.lock_or_recover().present(frame)
    }

    /// Switches the foreground owner (see [`Display::set_foreground`]).
    pub fn set_foreground(&self, owner: GuestId) {
        self.shared.display.lock_or_recover().set_foreground(owner);
    }

    /// Changes the vsync rate at once: the schedule restarts from now at `hz`.
    pub fn set_refresh_hz(&self, hz: u32) -> Result<()> {
        self.shared.display.lock_or_recover().set_refresh_hz(hz)?;
        self.shared
            .hz
            .store(hz, std::sync::atomic::Ordering::SeqCst);
        // Taking the stop lock orders the store before the thread's next check.
        drop(self.shared.stop.lock_or_recover());
        self.shared.wake.notify_all();
        Ok(())
    }

    /// Runs `f` with the display locked (stats, snapshots, ...). Keep it
    /// short: vsync waits for it.
    pub fn with_display<R>(&self, f: impl FnOnce(&mut Display) -> R) -> R {
        f(&mut self.shared.display.lock_or_recover())
    }

    /// Subscribes to vsync events.
    pub fn subscribe(&self) -> (SubscriberId, Receiver<VsyncEvent>) {
        self.shared.subscribers.lock_or_recover().subscribe()
    }

    /// Unsubscribes; `false` if `id` was not subscribed.
    pub fn unsubscribe(&self, id: SubscriberId) -> bool {
        self.shared.subscribers.lock_or_recover().unsubscribe(id)
    }

    /// Number of live subscribers.
    pub fn subscriber_count(&self) -> usize {
        self.shared.subscribers.lock_or_recover().len()
    }

    /// Events skipped because a subscriber's queue was full.
    pub fn lagged_events(&self) -> u64 {
        self.shared.subscribers.lock_or_recover().lagged()
    }

    /// Stops the thread and waits for it. Subscribers' receivers report
    /// disconnection afterwards.
    pub fn stop(&mut self) -> Result<()> {
        *self.shared.stop.lock_or_recover() = true;
        self.shared.wake.notify_all();
        let result = match self.thread.take() {
            Some(t) => t
                .join()
                .map_err(|_| DisplayError::Thread("vsync thread panicked".into())),
            None => Ok(()),
        };
        *self.shared.subscribers.lock_or_recover() = Subscribers::new();
        result
    }
}

impl Drop for VsyncThread {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            log::error!("{e}");
        }
    }
}

fn run(shared: &Shared, mut schedule: VsyncSchedule) {
    loop {
        let deadline = schedule.next_deadline();
        {
            let mut stop = shared.stop.lock_or_recover();
            loop {
                if *stop {
                    return;
                }
                let now = shared.clock.now_ns();
                if now >= deadline {
                    break;
                }
                let hz = shared.hz.load(std::sync::atomic::Ordering::SeqCst);
                if hz != schedule.hz {
                    if let Some(s) = VsyncSchedule::new(now, hz) {
                        schedule = s;
                    }
                    break;
                }
                let wait = Duration::from_nanos(deadline - now);
                stop = shared.wake.wait_timeout_or_recover(stop, wait).0;
            }
        }
        let now = shared.clock.now_ns();
        if schedule.due(now).is_none() {
            continue;
        }
        let event = shared.display.lock_or_recover().on_vsync(now);
        shared.subscribers.lock_or_recover().publish(&event);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule_has_no_drift() {
        let s = VsyncSchedule::new(1_000, 60).unwrap();
        assert_eq!(s.deadline(1), 1_000 + 16_666_666);
        assert_eq!(s.deadline(60), 1_000 + 1_000_000_000);
        assert_eq!(s.deadline(6000), 1_000 + 100_000_000_000);
        assert!(VsyncSchedule::new(0, 0).is_none());
    }

    #[test]
    fn schedule_on_time_and_late() {
        let mut s = VsyncSchedule::new(0, 100).unwrap(); // 10 ms
        assert_eq!(s.next_deadline(), 10_000_000);
        assert_eq!(s.due(9_999_999), None);
        assert_eq!(
            s.due(10_000_000),
            Some(Tick {
                index: 1,
                deadline_ns: 10_000_000,
                missed: 0
            })
        );
        // Woke at 45 ms: deadlines 2 and 3 were skipped, 4 is this one.
        assert_eq!(
            s.due(45_000_000),
            Some(Tick {
                index: 4,
                deadline_ns: 40_000_000,
                missed: 2
            })
        );
        assert_eq!(s.next_deadline(), 50_000_000);
        assert_eq!(s.due(49_000_000), None);
    }

    fn event(seq: u64) -> VsyncEvent {
        VsyncEvent {
            seq,
            timestamp_ns: seq * 10,
            missed: 0,
            scanout: None,
            foreground: None,
        }
    }

    #[test]
    fn subscribers_receive_unsubscribe_and_get_dropped() {
        let mut subs = Subscribers::new();
        let (a, rx_a) = subs.subscribe();
        let (_b, rx_b) = subs.subscribe();
        assert_eq!(subs.publish(&event(1)), 2);
        assert_eq!(rx_a.try_recv().unwrap().seq, 1);
        assert_eq!(rx_b.try_recv().unwrap().seq, 1);

        assert!(subs.unsubscribe(a));
        assert!(!subs.unsubscribe(a));
        assert_eq!(subs.publish(&event(2)), 1);
        // The unsubscribed receiver is disconnected, not silently idle.
        assert!(matches!(
            rx_a.try_recv(),
            Err(mpsc::TryRecvError::Disconnected)
        ));

        drop(rx_b);
        assert_eq!(subs.publish(&event(3)), 0);
        assert!(subs.is_empty());
    }

    #[test]
    fn slow_subscriber_lags_instead_of_blocking() {
        let mut subs = Subscribers::new();
        let (_id, rx) = subs.subscribe();
        for seq in 1..=(SUBSCRIBER_QUEUE as u64 + 5) {
            subs.publish(&event(seq));
        }
        assert_eq!(subs.lagged(), 5);
        assert_eq!(subs.len(), 1);
        let got: Vec<u64> = rx.try_iter().map(|e| e.seq).collect();
        assert_eq!(got, (1..=SUBSCRIBER_QUEUE as u64).collect::<Vec<_>>());
    }

    #[test]
    fn monotonic_clock_moves_forward() {
        let c = MonotonicClock;
        let a = c.now_ns();
        let b = c.now_ns();
        assert!(a > 0 && b >= a);
    }
}
