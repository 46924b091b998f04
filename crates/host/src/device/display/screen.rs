//! The screen shared by every guest: the display state machine behind its vsync thread, each
//! guest's frames and counters, the foreground rule, and fences signaled at vsync.

use std::collections::{HashMap, VecDeque};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};
use virtsoc_svm::GuestId;

use virtsoc_devapi::display::{StatsReply, TimingReply};
use virtsoc_display as vd;
use virtsoc_fence::table::{FenceId, VirtualFenceTable};
use virtsoc_proto::Status;

use super::{Answer, LATENCY_WINDOW, MAX_PENDING_FENCES};
use virtsoc_sync::{CondvarExt, LockExt};

/// Frames whose ready latency (capture -> present) the `timing` command summarises.
const READY_WINDOW: usize = 30;

/// Nearest-rank percentile `p` of sorted samples (0 when there are none).
pub(super) fn percentile(sorted: &[u64], p: u64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (sorted.len() as u64 * p).div_ceil(100).max(1);
    sorted[(rank - 1).min(sorted.len() as u64 - 1) as usize]
}

/// One guest's view of the display.
#[derive(Debug)]
pub(super) struct GuestScreen {
    /// Frames it presented.
    pub(super) submitted: u64,
    /// Its frames scanned out.
    pub(super) presented: u64,
    /// Its frames replaced or hidden.
    pub(super) dropped: u64,
    /// Display vsync count when it first used the display.
    pub(super) first_vsync: u64,
    /// Latency samples of its last scanned-out frames.
    pub(super) latencies: VecDeque<u64>,
    /// Capture time -> present (the frame queued at the display) of its last frames that had
    /// a capture time.
    pub(super) ready: VecDeque<u64>,
    /// Order of its latest `present` among all guests' (0: never presented).
    pub(super) last_present: u64,
}

/// A fence to signal at the first vsync after `after_vsync`.
pub(super) struct PendingFence {
    pub(super) guest: GuestId,
    pub(super) table: Arc<VirtualFenceTable>,
    pub(super) fence: FenceId,
    pub(super) after_vsync: u64,
}

impl PendingFence {
    pub(super) fn signal(&self) {
        if let Err(e) = self.table.signal(self.fence) {
            // The guest released or recycled it meanwhile, or is going away.
            log::debug!(
                "display: guest {}: vsync fence {:?}: {e}",
                self.guest,
                self.fence
            );
        }
    }
}

/// Per-guest bookkeeping, behind the screen's lock (always taken inside the display's lock).
#[derive(Default)]
pub(super) struct State {
    pub(super) guests: HashMap<GuestId, GuestScreen>,
    pub(super) next_frame_id: u64,
    pub(super) present_seq: u64,
    pub(super) foreground: Option<GuestId>,
    pub(super) fences: Vec<PendingFence>,
    /// Each guest's latest presented frame, shown or not (for the live view and recordings).
    pub(super) latest: HashMap<GuestId, vd::PresentedFrame>,
}

impl State {
    /// The guest's record, created at its first use of the display (`vsyncs`: the display's
    /// vsync count now).
    pub(super) fn guest(&mut self, guest: GuestId, vsyncs: u64) -> &mut GuestScreen {
        self.guests.entry(guest).or_insert_with(|| GuestScreen {
            submitted: 0,
            presented: 0,
            dropped: 0,
            first_vsync: vsyncs,
            latencies: VecDeque::new(),
            ready: VecDeque::new(),
            last_present: 0,
        })
    }

    /// Counts scan-outs into their owners' records.
    pub(super) fn absorb(&mut self, d: &mut vd::Display) {
        for owner in d.drain_late_drops() {
            if let Some(g) = self.guests.get_mut(&owner) {
                g.dropped += 1;
            }
        }
        let records = d.drain_scanouts();
        for r in records.into_iter().filter(|r| !r.revealed) {
            let Some(g) = self.guests.get_mut(&r.owner) else {
                continue; // its guest has gone
            };
            g.presented += 1;
            if let Some(l) = r.latency_ns {
                if g.latencies.len() == LATENCY_WINDOW {
                    g.latencies.pop_front();
                }
                g.latencies.push_back(l);
            }
        }
    }

    /// Gives the screen to `guest`. Frames of owners that have gone, which the display keeps
    /// as background content when switching, are forgotten.
    pub(super) fn switch_foreground(&mut self, d: &mut vd::Display, guest: GuestId) {
        let previous = d.foreground();
        let shown = d.last_frame().map(|f| f.owner);
        d.set_foreground(guest);
        self.foreground = Some(guest);
        for o in [previous, shown].into_iter().flatten() {
            if o != guest && !self.guests.contains_key(&o) {
                d.remove_owner(o);
            }
        }
    }
}

/// The display with its vsync thread and the guests' bookkeeping.
pub(super) struct Screen {
    pub(super) vsync: vd::VsyncThread,
    pub(super) state: Mutex<State>,
    /// Notified after every present (with `state`).
    pub(super) presented: Condvar,
}

pub(super) fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    m.lock_or_recover()
}

impl Screen {
    /// Runs `f` with the display and the bookkeeping locked (in that order). Keep it short:
    /// vsync waits for it.
    pub(super) fn with<R>(&self, f: impl FnOnce(&mut vd::Display, &mut State) -> R) -> R {
        self.vsync.with_display(|d| f(d, &mut lock(&self.state)))
    }

    /// Presents `frame` as `guest`'s; returns its id.
    pub(super) fn present(&self, guest: GuestId, mut frame: vd::PresentedFrame) -> Answer<u64> {
        // Checked before touching any state, so a refused frame changes nothing.
        frame.validate().map_err(|e| {
            log::debug!("display: guest {guest}: {e}");
            Status::BadArgument
        })?;
        frame.submitted_ns = crate::clock::now_ns();
        let (capture_ns, submitted_ns) = (frame.capture_ns, frame.submitted_ns);
        self.with(|d, st| {
            let vsyncs = d.stats().vsyncs;
            st.guest(guest, vsyncs);
            st.next_frame_id += 1;
            let id = st.next_frame_id;
            frame.id = id;
            frame.owner = guest;
            if st.foreground.is_none() {
                st.switch_foreground(d, guest);
            }
            let keep = frame.clone();
            // The display queues only the foreground's frames, so a frame it replaces (and
            // counts as dropped) is always the presenting guest's own.
            let dropped_before = d.stats().dropped;
            let outcome = d.present(frame).map_err(|e| {
                log::debug!("display: guest {guest}: {e}");
                Status::BadArgument
            })?;
            let dropped =
                outcome == vd::PresentOutcome::Hidden || d.stats().dropped > dropped_before;
            st.present_seq += 1;
            let seq = st.present_seq;
            let g = st.guest(guest, vsyncs);
            g.submitted += 1;
            g.dropped += u64::from(dropped);
            g.last_present = seq;
            if let Some(ready) = capture_ns.and_then(|c| submitted_ns.checked_sub(c)) {
                if g.ready.len() == READY_WINDOW {
                    g.ready.pop_front();
                }
                g.ready.push_back(ready);
            }
            st.latest.insert(guest, keep);
            Ok(id)
        })
        .inspect(|_| self.presented.notify_all())
    }

    /// `guest`'s latest presented frame if it is newer than frame `after`, waiting up to
    /// `wait` for one (on the caller's thread; presents only notify).
    pub(super) fn latest_after(
        &self,
        guest: GuestId,
        after: u64,
        wait: Duration,
    ) -> Option<vd::PresentedFrame> {
        let deadline = Instant::now() + wait;
        let mut st = lock(&self.state);
        loop {
            if let Some(f) = st.latest.get(&guest).filter(|f| f.id > after) {
                return Some(f.clone());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            st = self.presented.wait_timeout_or_recover(st, left).0;
        }
    }

    /// `guest`'s counters.
    pub(super) fn stats(&self, guest: GuestId) -> StatsReply {
        let (mut samples, mut reply) = self.with(|d, st| {
            st.absorb(d);
            let vsyncs = d.stats().vsyncs;
            let g = st.guest(guest, vsyncs);
            let reply = StatsReply {
                presented: g.presented,
                dropped: g.dropped,
                vsyncs: vsyncs - g.first_vsync,
                samples: g.latencies.len() as u64,
                ..StatsReply::default()
            };
            (g.latencies.iter().copied().collect::<Vec<_>>(), reply)
        });
        samples.sort_unstable();
        reply.latency_p50_ns = percentile(&samples, 50);
        reply.latency_p99_ns = percentile(&samples, 99);
        reply
    }

    /// The vsync clock and `guest`'s ready latency (the display's `timing` command).
    pub(super) fn timing(&self, guest: GuestId, period_ns: u64) -> TimingReply {
        let (last, mut ready) = self.with(|d, st| {
            let vsyncs = d.stats().vsyncs;
            let g = st.guest(guest, vsyncs);
            (
                d.last_vsync_ns().unwrap_or(0),
                g.ready.iter().copied().collect::<Vec<_>>(),
            )
        });
        ready.sort_unstable();
        TimingReply {
            last_vsync_ns: last,
            period_ns,
            ready_p90_ns: percentile(&ready, 90),
            samples: ready.len() as u64,
            ready_max_ns: ready.last().copied().unwrap_or(0),
        }
    }

    /// Arranges for `guest`'s `fence` to be signaled at the next vsync.
    pub(super) fn signal_at_vsync(
        &self,
        guest: GuestId,
        fences: &Arc<VirtualFenceTable>,
        fence: FenceId,
    ) -> Answer<()> {
        fences.status(fence).map_err(|_| Status::BadArgument)?;
        self.with(|d, st| {
            let vsyncs = d.stats().vsyncs;
            st.guest(guest, vsyncs);
            if st.fences.iter().filter(|f| f.guest == guest).count() >= MAX_PENDING_FENCES {
                return Err(Status::Busy);
            }
            st.fences.push(PendingFence {
                guest,
                table: fences.clone(),
                fence,
                after_vsync: vsyncs,
            });
            Ok(())
        })
    }

    /// After a vsync: counts the scan-outs and returns the fences now due.
    pub(super) fn after_vsync(&self) -> Vec<PendingFence> {
        self.with(|d, st| {
            st.absorb(d);
            let vsyncs = d.stats().vsyncs;
            let (due, waiting) = std::mem::take(&mut st.fences)
                .into_iter()
                .partition(|f| f.after_vsync < vsyncs);
            st.fences = waiting;
            due
        })
    }

    /// Forgets `guest`: its frames, counters, pending fences, and the screen if it had it.
    pub(super) fn guest_gone(&self, guest: GuestId) {
        self.with(|d, st| {
            st.fences.retain(|f| f.guest != guest);
            st.latest.remove(&guest);
            if st.guests.remove(&guest).is_none() {
                return;
            }
            d.remove_owner(guest);
            if st.foreground == Some(guest) {
                st.foreground = None;
                let next = st
                    .guests
                    .iter()
                    .filter(|(_, g)| g.last_present > 0)
                    .max_by_key(|(_, g)| g.last_present)
                    .map(|(id, _)| *id);
                if let Some(next) = next {
                    st.switch_foreground(d, next);
                }
            }
        });
    }
}

/// The vsync listener: counts scan-outs and signals due fences after every vsync. Ends when
/// the display goes away (its vsync thread stops and the channel closes).
pub(super) fn listen(screen: Weak<Screen>, events: Receiver<vd::VsyncEvent>) {
    while events.recv().is_ok() {
        let Some(screen) = screen.upgrade() else {
            return;
        };
        for f in screen.after_vsync() {
            f.signal();
        }
    }
}

impl Screen {
    /// Gives the screen to `guest` now (the control API's foreground switch); its record is
    /// created if it never presented, and its latest frame is shown from the next vsync.
    pub(super) fn set_foreground(&self, guest: GuestId) {
        self.with(|d, st| {
            let vsyncs = d.stats().vsyncs;
            st.guest(guest, vsyncs);
            st.switch_foreground(d, guest);
        });
    }

    /// `guest` as the display's frames name their owner, if it used the display.
    pub(super) fn owner_of(&self, guest: GuestId) -> Option<GuestId> {
        self.with(|_, st| st.guests.contains_key(&guest).then_some(guest))
    }

    /// `guest`'s frame counters (submitted, presented, dropped), if it used the display.
    pub(super) fn counters(&self, guest: GuestId) -> Option<(u64, u64, u64)> {
        self.with(|d, st| {
            st.absorb(d);
            st.guests
                .get(&guest)
                .map(|g| (g.submitted, g.presented, g.dropped))
        })
    }

    /// Carries a guest's frame counters over from the daemon it was saved in (its record is
    /// created if needed): frames it had presented that were still waiting for a vsync there
    /// never reach a screen, and count as dropped.
    pub(super) fn carry_counters(
        &self,
        guest: GuestId,
        submitted: u64,
        presented: u64,
        dropped: u64,
    ) {
        self.with(|d, st| {
            let vsyncs = d.stats().vsyncs;
            let g = st.guest(guest, vsyncs);
            g.submitted += submitted;
            g.presented += presented;
            g.dropped += submitted.saturating_sub(presented).max(dropped);
        });
    }

    /// The guest that has the screen.
    pub(super) fn foreground(&self) -> Option<GuestId> {
        lock(&self.state).foreground
    }

    /// Every guest's counters and latency samples, for the control API's metrics.
    pub(super) fn guest_metrics(&self) -> Vec<virtsoc_control::DisplayGuestMetrics> {
        self.with(|d, st| {
            st.absorb(d);
            st.guests
                .iter()
                .map(|(id, g)| virtsoc_control::DisplayGuestMetrics {
                    guest: id.0,
                    presented: g.presented,
                    dropped: g.dropped,
                    latencies_ns: g.latencies.iter().copied().collect(),
                })
                .collect()
        })
    }
}
