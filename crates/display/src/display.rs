//! The display core: a pure state machine driven by [`Display::present`] and
//! [`Display::on_vsync`].
//!
//! # Pacing
//!
//! Between two vsyncs any number of frames may be presented; at the vsync
//! the display scans out the **last** of them and counts the others as
//! dropped (they were replaced before they could be seen). A vsync with no
//! new frame repeats what is on screen and calls no backend.
//!
//! # Foreground / background sharing
//!
//! Several guests may share one display (the KVM/ARM Android graphics
//! design). Each frame carries an owner; once [`Display::set_foreground`]
//! picked an owner, only that owner's frames are scanned out and the others'
//! are counted as *hidden* (not dropped: nobody was meant to see them). The
//! last hidden frame of every owner is kept, so switching the foreground
//! shows the new owner's latest content at the next vsync even if it is not
//! drawing (counted as *revealed*). Until `set_foreground` is called every
//! owner's frames are shown.
//!
//! # Accounting
//!
//! `submitted = presented + dropped + hidden + failed + (1 if a submitted
//! frame is waiting for the next vsync)`; revealed scan-outs are extra.
//! Every scan-out leaves a [`ScanoutRecord`] (kept in a bounded history)
//! with its time and, when the frame carried a capture time, its
//! motion-to-photon latency (scan-out time minus capture time).
//!
//! Time is whatever the caller passes, in nanoseconds: the
//! [`VsyncThread`](crate::VsyncThread) uses `CLOCK_MONOTONIC`, tests use
//! numbers.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::path::Path;

use crate::backend::{DisplayBackend, HeadlessBackend};
use crate::error::{DisplayError, Result};
use crate::frame::{GuestId, PresentedFrame};
use crate::snapshot;

/// Configuration of a [`Display`].
pub struct DisplayConfig {
    /// Width in pixels (frames of other sizes are accepted and handed to the
    /// backend as they are).
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// Vsync rate, 1-1000 Hz (default 60).
    pub refresh_hz: u32,
    /// Where frames go (default: [`HeadlessBackend`]).
    pub backend: Box<dyn DisplayBackend>,
    /// How many scan-out records to keep (default 4096).
    pub history: usize,
    /// Frames waiting for vsyncs, 1 or 2 (default 1): with 1 a frame presented before the
    /// next vsync replaces the waiting one ("mailbox"); with 2 it waits behind it and is shown
    /// at the vsync after (a FIFO of two, as Android's BufferQueue: frames that arrive in a
    /// burst are all shown, one vsync later), only a third replaces the newest waiting, and
    /// at a vsync the newer of two waiting frames is shown and the older dropped when the
    /// newer has waited half a period, or the older was already waiting at the vsync before
    /// (the queue catches up instead of adding a vsync of latency for good).
    pub queue_depth: usize,
}

impl DisplayConfig {
    /// A 60 Hz headless display of the given size.
    pub fn new(width: u32, height: u32) -> Self {
        DisplayConfig {
            width,
            height,
            refresh_hz: 60,
            backend: Box::new(HeadlessBackend::new()),
            history: 4096,
            queue_depth: 1,
        }
    }

    /// Sets how many frames may wait for vsyncs (1 or 2; see [`DisplayConfig::queue_depth`]).
    pub fn with_queue_depth(mut self, depth: usize) -> Self {
        self.queue_depth = depth.clamp(1, 2);
        self
    }

    /// Sets the vsync rate.
    pub fn with_refresh_hz(mut self, hz: u32) -> Self {
        self.refresh_hz = hz;
        self
    }

    /// Sets the backend.
    pub fn with_backend(mut self, backend: impl DisplayBackend + 'static) -> Self {
        self.backend = Box::new(backend);
        self
    }

    /// Sets the history length.
    pub fn with_history(mut self, records: usize) -> Self {
        self.history = records;
        self
    }
}

impl fmt::Debug for DisplayConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DisplayConfig")
            .field("width", &self.width)
            .field("height", &self.height)
            .field("refresh_hz", &self.refresh_hz)
            .field("backend", &self.backend.name())
            .field("history", &self.history)
            .finish()
    }
}

/// What [`Display::present`] did with a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PresentOutcome {
    /// Queued for the next vsync.
    Queued,
    /// Queued for the next vsync, replacing (dropping) the frame with this id.
    Replaced {
        /// Id of the dropped frame.
        dropped: u64,
    },
    /// Its owner is in the background: not shown, kept as the owner's latest.
    Hidden,
}

/// One frame reaching the screen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScanoutRecord {
    /// The frame's id.
    pub frame_id: u64,
    /// The frame's owner.
    pub owner: GuestId,
    /// Sequence number of the vsync that scanned it out.
    pub vsync_seq: u64,
    /// Time of that vsync.
    pub scanout_ns: u64,
    /// When the frame was submitted.
    pub submitted_ns: u64,
    /// When its content was captured, if known.
    pub capture_ns: Option<u64>,
    /// Motion-to-photon latency (`scanout_ns - capture_ns`), if the capture
    /// time is known and not in the future. `None` for revealed frames.
    pub latency_ns: Option<u64>,
    /// Whether this is a background frame shown because its owner became
    /// the foreground (not counted as presented).
    pub revealed: bool,
}

/// One vsync, as delivered to subscribers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VsyncEvent {
    /// Sequence number, from 1.
    pub seq: u64,
    /// Time of the vsync.
    pub timestamp_ns: u64,
    /// Vsyncs that were due since the previous one but did not happen (the
    /// driver slept too long).
    pub missed: u64,
    /// The new frame scanned out at this vsync, if any.
    pub scanout: Option<ScanoutRecord>,
    /// The foreground owner, if one is set.
    pub foreground: Option<GuestId>,
}

/// Summary of motion-to-photon latency samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LatencySummary {
    /// Number of samples.
    pub count: u64,
    /// Sum of all samples.
    pub total_ns: u128,
    /// Smallest sample.
    pub min_ns: u64,
    /// Largest sample.
    pub max_ns: u64,
}

impl LatencySummary {
    fn add(&mut self, ns: u64) {
        if self.count == 0 {
            self.min_ns = ns;
            self.max_ns = ns;
        } else {
            self.min_ns = self.min_ns.min(ns);
            self.max_ns = self.max_ns.max(ns);
        }
        self.count += 1;
        self.total_ns += u128::from(ns);
    }

    /// Mean latency, if there are samples.
    pub fn mean_ns(&self) -> Option<u64> {
        (self.count > 0).then(|| (self.total_ns / u128::from(self.count)) as u64)
    }
}

/// Counters of a [`Display`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DisplayStats {
    /// Vsyncs processed.
    pub vsyncs: u64,
    /// Vsyncs that were due but skipped because the driver ran late.
    pub missed_vsyncs: u64,
    /// Vsyncs that had no new frame (the screen repeated).
    pub idle_vsyncs: u64,
    /// Frames accepted by `present`.
    pub submitted: u64,
    /// Foreground frames scanned out.
    pub presented: u64,
    /// Foreground frames replaced before a vsync.
    pub dropped: u64,
    /// Frames presented by background owners (or pending when their owner
    /// lost the foreground).
    pub hidden: u64,
    /// Background frames shown when their owner became the foreground.
    pub revealed: u64,
    /// Frames the backend failed to scan out.
    pub failed: u64,
    /// Frames rejected by `present` as malformed.
    pub rejected: u64,
    /// Motion-to-photon latency over all presented frames with a capture
    /// time.
    pub latency: LatencySummary,
}

#[derive(Debug)]
struct Pending {
    frame: PresentedFrame,
    /// A background frame re-shown on a foreground switch; already counted
    /// as hidden.
    revealed: bool,
}

/// The display state machine.
pub struct Display {
    width: u32,
    height: u32,
    refresh_hz: u32,
    backend: Box<dyn DisplayBackend>,
    foreground: Option<GuestId>,
    pending: Option<Pending>,
    /// The frame waiting behind `pending` (queue depth 2 only).
    queued: Option<Pending>,
    /// Owners of waiting frames dropped after they were queued (catch-up at a vsync, or a
    /// foreground switch), until drained.
    late_drops: Vec<GuestId>,
    queue_depth: usize,
    background: HashMap<GuestId, PresentedFrame>,
    current: Option<PresentedFrame>,
    seq: u64,
    last_vsync_ns: Option<u64>,
    stats: DisplayStats,
    history: VecDeque<ScanoutRecord>,
    history_cap: usize,
    last_error: Option<String>,
}

impl fmt::Debug for Display {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Display")
            .field("width", &self.width)
            .field("height", &self.height)
            .field("refresh_hz", &self.refresh_hz)
            .field("backend", &self.backend.name())
            .field("foreground", &self.foreground)
            .field("seq", &self.seq)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl Display {
    /// A display with nothing on screen.
    pub fn new(config: DisplayConfig) -> Result<Self> {
        if config.width == 0 || config.height == 0 {
            return Err(DisplayError::InvalidConfig("zero width or height"));
        }
        if !(1..=1000).contains(&config.refresh_hz) {
            return Err(DisplayError::InvalidConfig(
                "refresh rate must be 1-1000 Hz",
            ));
        }
        Ok(Display {
            width: config.width,
            height: config.height,
            refresh_hz: config.refresh_hz,
            backend: config.backend,
            foreground: None,
            pending: None,
            queued: None,
            late_drops: Vec::new(),
            queue_depth: config.queue_depth.clamp(1, 2),
            background: HashMap::new(),
            current: None,
            seq: 0,
            last_vsync_ns: None,
            stats: DisplayStats::default(),
            history: VecDeque::new(),
            history_cap: config.history,
            last_error: None,
        })
    }

    /// Width in pixels.
    pub fn width(&self) -> u32 {
        self.width
    }

    /// Height in pixels.
    pub fn height(&self) -> u32 {
        self.height
    }

    /// Vsync rate.
    pub fn refresh_hz(&self) -> u32 {
        self.refresh_hz
    }

    /// Changes the vsync rate (1-1000 Hz); a [`crate::VsyncThread`] driving this display
    /// should be told with its own `set_refresh_hz`, which calls this.
    pub fn set_refresh_hz(&mut self, hz: u32) -> Result<()> {
        if !(1..=1000).contains(&hz) {
            return Err(DisplayError::InvalidConfig(
                "refresh rate must be 1-1000 Hz",
            ));
        }
        self.refresh_hz = hz;
        Ok(())
    }

    /// Nominal time between vsyncs, rounded to the nanosecond.
    pub fn period_ns(&self) -> u64 {
        (1_000_000_000 + u64::from(self.refresh_hz) / 2) / u64::from(self.refresh_hz)
    }

    /// Queues a frame for the next vsync (see the module docs for what
    /// happens to frames already queued and to background owners' frames).
    pub fn present(&mut self, frame: PresentedFrame) -> Result<PresentOutcome> {
        if let Err(e) = frame.validate() {
            self.stats.rejected += 1;
            return Err(e);
        }
        self.stats.submitted += 1;
        if self.foreground.is_some_and(|fg| fg != frame.owner) {
            self.stats.hidden += 1;
            self.background.insert(frame.owner, frame);
            return Ok(PresentOutcome::Hidden);
        }
        let new = Pending {
            frame,
            revealed: false,
        };
        // Depth 2: a frame arriving while another (not a revealed background frame) waits
        // queues behind it; only the newest waiting frame is ever replaced.
        let behind = self.queue_depth == 2 && self.pending.as_ref().is_some_and(|p| !p.revealed);
        let old = if behind {
            self.queued.replace(new)
        } else {
            self.pending.replace(new)
        };
        Ok(match old {
            None => PresentOutcome::Queued,
            Some(old) => {
                if !old.revealed {
                    self.stats.dropped += 1;
                }
                PresentOutcome::Replaced {
                    dropped: old.frame.id,
                }
            }
        })
    }

    /// Makes `owner` the foreground: from now on only its frames are
    /// scanned out. A frame the previous foreground owner had queued becomes
    /// hidden; the new owner's latest hidden frame, if any, is shown at the
    /// next vsync.
    pub fn set_foreground(&mut self, owner: GuestId) {
        if self.foreground == Some(owner) {
            return;
        }
        // Only the newest waiting frame matters from here on.
        if let Some(q) = self.queued.take() {
            if let Some(p) = self.pending.replace(q) {
                self.drop_waiting(p);
            }
        }
        self.foreground = Some(owner);
        // Remember what the others had on screen, so switching back to them
        // shows it again; a newer queued frame overrides it below.
        if let Some(cur) = &self.current {
            if cur.owner != owner {
                self.background
                    .entry(cur.owner)
                    .or_insert_with(|| cur.clone());
            }
        }
        if let Some(p) = self.pending.take() {
            if p.frame.owner == owner {
                // Shared mode -> this owner: its queued frame stays queued.
                self.pending = Some(p);
            } else {
                if !p.revealed {
                    self.stats.hidden += 1;
                }
                self.background.insert(p.frame.owner, p.frame);
            }
        }
        if self.pending.is_none() {
            if let Some(frame) = self.background.remove(&owner) {
                self.pending = Some(Pending {
                    frame,
                    revealed: true,
                });
            }
        }
    }

    /// The foreground owner, if one was set.
    pub fn foreground(&self) -> Option<GuestId> {
        self.foreground
    }

    /// Forgets an owner's kept background frame (call when a guest leaves).
    pub fn remove_owner(&mut self, owner: GuestId) {
        self.background.remove(&owner);
    }

    /// Processes the vsync at `now_ns`: scans out the frame queued since
    /// the previous vsync, if any. Times earlier than the previous vsync are
    /// treated as equal to it.
    pub fn on_vsync(&mut self, now_ns: u64) -> VsyncEvent {
        let previous = self.last_vsync_ns;
        let now = previous.map_or(now_ns, |last| now_ns.max(last));
        let missed = self.last_vsync_ns.map_or(0, |last| {
            // Number of whole periods elapsed, rounded, minus this vsync.
            let period = self.period_ns();
            ((now - last + period / 2) / period).saturating_sub(1)
        });
        self.last_vsync_ns = Some(now);
        self.seq += 1;
        self.stats.vsyncs += 1;
        self.stats.missed_vsyncs += missed;

        // Catching up: the newer of two waiting frames is shown now and the older dropped
        // when the newer has waited half a period already, or when the older was waiting at
        // the previous vsync too (it was passed over once: the queue is standing, not a
        // burst). A burst is absorbed once; a queue that stays two deep would otherwise put
        // every later frame a vsync behind for good - frames paced to arrive just before
        // each vsync never wait half a period.
        let period = self.period_ns();
        let standing = |p: &Pending| previous.is_some_and(|v| p.frame.submitted_ns <= v);
        if self.queued.as_ref().is_some_and(|q| {
            q.frame.submitted_ns + period / 2 <= now || self.pending.as_ref().is_some_and(standing)
        }) {
            if let Some(p) = self.pending.take() {
                self.drop_waiting(p);
            }
            self.pending = self.queued.take();
        }
        let scanout = match self.pending.take() {
            None => {
                self.stats.idle_vsyncs += 1;
                None
            }
            Some(Pending { frame, revealed }) => self.scan_out(frame, revealed, now),
        };
        self.pending = self.queued.take();
        VsyncEvent {
            seq: self.seq,
            timestamp_ns: now,
            missed,
            scanout,
            foreground: self.foreground,
        }
    }

    fn scan_out(
        &mut self,
        frame: PresentedFrame,
        revealed: bool,
        now: u64,
    ) -> Option<ScanoutRecord> {
        if let Err(e) = self.backend.scanout(&frame) {
            log::warn!(
                "display backend {} failed on frame {}: {e}",
                self.backend.name(),
                frame.id
            );
            self.last_error = Some(e.to_string());
            if !revealed {
                self.stats.failed += 1;
            }
            return None;
        }
        let latency_ns = if revealed {
            None
        } else {
            frame.capture_ns.and_then(|c| now.checked_sub(c))
        };
        if revealed {
            self.stats.revealed += 1;
        } else {
            self.stats.presented += 1;
        }
        if let Some(l) = latency_ns {
            self.stats.latency.add(l);
        }
        let record = ScanoutRecord {
            frame_id: frame.id,
            owner: frame.owner,
            vsync_seq: self.seq,
            scanout_ns: now,
            submitted_ns: frame.submitted_ns,
            capture_ns: frame.capture_ns,
            latency_ns,
            revealed,
        };
        if self.history_cap > 0 {
            if self.history.len() == self.history_cap {
                self.history.pop_front();
            }
            self.history.push_back(record);
        }
        self.current = Some(frame);
        Some(record)
    }

    /// The counters.
    pub fn stats(&self) -> DisplayStats {
        self.stats
    }

    /// Recent scan-outs, oldest first (bounded by the configured history).
    pub fn scanouts(&self) -> impl Iterator<Item = &ScanoutRecord> {
        self.history.iter()
    }

    /// Takes the recent scan-outs out of the history.
    pub fn drain_scanouts(&mut self) -> Vec<ScanoutRecord> {
        self.history.drain(..).collect()
    }

    /// Motion-to-photon latency samples of the recent scan-outs.
    pub fn latency_samples(&self) -> Vec<u64> {
        self.history.iter().filter_map(|r| r.latency_ns).collect()
    }

    /// The frame on screen (the last one scanned out).
    pub fn last_frame(&self) -> Option<&PresentedFrame> {
        self.current.as_ref()
    }

    /// Counts a waiting frame dropped after it was queued (and remembers its owner).
    fn drop_waiting(&mut self, p: Pending) {
        if !p.revealed {
            self.stats.dropped += 1;
            self.late_drops.push(p.frame.owner);
        }
    }

    /// Owners of the frames dropped after they had been queued (a queue of two catching up,
    /// a foreground switch), since the last call: one entry per frame.
    pub fn drain_late_drops(&mut self) -> Vec<GuestId> {
        std::mem::take(&mut self.late_drops)
    }

    /// Frames waiting for vsyncs (0, 1, or 2 with a queue depth of 2).
    pub fn waiting(&self) -> usize {
        usize::from(self.pending.is_some()) + usize::from(self.queued.is_some())
    }

    /// Id of the frame waiting for the next vsync.
    pub fn pending_frame_id(&self) -> Option<u64> {
        self.pending.as_ref().map(|p| p.frame.id)
    }

    /// The last backend error, if any.
    pub fn last_error(&self) -> Option<&str> {
        self.last_error.as_deref()
    }

    /// Time of the last vsync.
    pub fn last_vsync_ns(&self) -> Option<u64> {
        self.last_vsync_ns
    }

    /// Writes the frame on screen as a PNG file.
    pub fn snapshot_png(&self, path: impl AsRef<Path>) -> Result<()> {
        let frame = self.current.as_ref().ok_or(DisplayError::NoFrame)?;
        snapshot::write_png(frame, path.as_ref())
    }
}
