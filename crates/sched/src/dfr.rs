//! The desired-frame-rate (DFR) feedback loop of the multimedia VM scheduler (its
//! Algorithm 1), steering one multimedia guest's share from the frame rate it presents.
//!
//! The frame rate is an EWMA of the presented rate sampled every interval. While the rate is
//! below the DFR and not improving, the share grows: doubled every 200 ms during the first
//! second of activity (fast start), then by one share unit per second. A raise that did not
//! help gets three chances; after them the share is halved (never below the original) and
//! the DFR lowered to the rate seen (the DFR was too high, or the rate does not depend on the
//! share). A rate above the DFR raises it (rate x tolerance ratio). When the guest presents
//! nothing for a second, its original share is restored and the next activity fast-starts
//! again. A guest seen behind its DFR stays boosted (behind) for `boost_hold` after.

use crate::{Nanos, MS};

/// How far under its DFR a guest may be before it counts as behind.
pub const BEHIND_MARGIN: f64 = 0.05;

/// Parameters of [`DfrController`] (defaults from the paper, memory-mapped display).
#[derive(Debug, Clone, Copy)]
pub struct DfrConfig {
    /// Initial desired frame rate.
    pub initial_dfr: f64,
    /// EWMA weight of the newest sample.
    pub ewma_weight: f64,
    /// DFR raised to rate x this when the rate exceeds it.
    pub tolerance_ratio: f64,
    /// Fast start's target as a fraction of the DFR ("fast-scaled DFR").
    pub fast_scale: f64,
    /// Share added per normal-phase raise.
    pub share_unit: u32,
    /// Raises without improvement before halving.
    pub chances: u32,
    /// Length of the fast-start phase and its sampling interval.
    pub fast_start: Nanos,
    /// Sampling interval during the fast start.
    pub fast_interval: Nanos,
    /// Normal sampling interval.
    pub interval: Nanos,
    /// No frame for this long restores the original share.
    pub idle_restore: Nanos,
    /// Largest share the controller gives.
    pub max_share: u32,
    /// How long a guest stays [`behind`](DfrController::behind) (boosted) after its last
    /// sample under the DFR: a boosted guest presents at its DFR, so the samples while
    /// boosted cannot tell whether it still needs the boost; ending it at the first good
    /// sample made every other second an unboosted trial behind the batch guests (a 30 fps
    /// video against four GPU hogs settled at 94% of its DFR, the boost coming and going at
    /// the margin). With a hold, one trial in `boost_hold`.
    pub boost_hold: Nanos,
}

impl Default for DfrConfig {
    fn default() -> Self {
        DfrConfig {
            initial_dfr: 20.0,
            ewma_weight: 0.8,
            tolerance_ratio: 0.8,
            fast_scale: 1.0,
            share_unit: 100,
            chances: 3,
            fast_start: 1000 * MS,
            fast_interval: 200 * MS,
            interval: 1000 * MS,
            idle_restore: 1000 * MS,
            max_share: 10_000,
            boost_hold: 5000 * MS,
        }
    }
}

/// The controller of one multimedia guest.
#[derive(Debug, Clone)]
pub struct DfrController {
    cfg: DfrConfig,
    original: u32,
    share: u32,
    dfr: f64,
    fps: Option<f64>,
    fps_prev: f64,
    negative: u32,
    prev_increased: bool,
    /// Start of the current activity (None while idle).
    start: Option<Nanos>,
    last_sample: Option<(Nanos, u64)>,
    last_frame: Nanos,
    /// Frames presented at the last observation.
    seen: u64,
    /// The last observation's time.
    now: Nanos,
    /// Behind until then (the last sample under the DFR plus `boost_hold`).
    behind_until: Nanos,
}

impl DfrController {
    /// A controller for a guest whose configured share is `share`.
    pub fn new(cfg: DfrConfig, share: u32) -> Self {
        DfrController {
            cfg,
            original: share.max(1),
            share: share.max(1),
            dfr: cfg.initial_dfr,
            fps: None,
            fps_prev: 0.0,
            negative: 0,
            prev_increased: false,
            start: None,
            last_sample: None,
            last_frame: 0,
            seen: 0,
            now: 0,
            behind_until: 0,
        }
    }

    /// The share the guest should have now.
    pub fn share(&self) -> u32 {
        self.share
    }

    /// Whether the controller has raised the share above the guest's configured one.
    pub fn raised(&self) -> bool {
        self.share > self.original
    }

    /// The current desired frame rate.
    pub fn dfr(&self) -> f64 {
        self.dfr
    }

    /// The EWMA frame rate, once sampled.
    pub fn fps(&self) -> Option<f64> {
        self.fps
    }

    /// Whether the guest is behind its DFR by more than [`BEHIND_MARGIN`], or was within the
    /// last [`DfrConfig::boost_hold`] (a multimedia guest then goes ahead of batch guests).
    /// The margin keeps a guest that presents at its DFR, whose average is a hair under it,
    /// from holding batch guests back for good.
    pub fn behind(&self) -> bool {
        self.start.is_some()
            && self.fps.is_some_and(|f| {
                f < self.dfr * (1.0 - BEHIND_MARGIN) || self.now < self.behind_until
            })
    }

    /// Feeds the guest's total of presented frames at `now`; returns the new share when it
    /// changed. Call it often (every vsync, every 100 ms): it samples at its own intervals.
    pub fn observe(&mut self, now: Nanos, presented: u64) -> Option<u32> {
        let before = self.share;
        self.now = now;
        let Some((t0, n0)) = self.last_sample else {
            self.last_sample = Some((now, presented));
            self.seen = presented;
            return None;
        };
        let new_frames = presented > self.seen;
        self.seen = presented;
        if new_frames {
            self.last_frame = now;
            if self.start.is_none() {
                self.start = Some(now);
                self.fps = None;
                self.last_sample = Some((now, presented));
                return None;
            }
        }
        if self.start.is_some() && now.saturating_sub(self.last_frame) >= self.cfg.idle_restore {
            self.restore();
            self.last_sample = Some((now, presented));
            return (self.share != before).then_some(self.share);
        }
        let Some(start) = self.start else {
            self.last_sample = Some((now, presented));
            return None;
        };
        let fast = now.saturating_sub(start) < self.cfg.fast_start;
        let interval = if fast {
            self.cfg.fast_interval
        } else {
            self.cfg.interval
        };
        let dt = now.saturating_sub(t0);
        if dt < interval {
            return None;
        }
        self.last_sample = Some((now, presented));
        let sample = presented.saturating_sub(n0) as f64 * 1e9 / dt as f64;
        let w = self.cfg.ewma_weight;
        let prev = self.fps.unwrap_or(sample);
        self.fps_prev = prev;
        let fps = match self.fps {
            Some(f) => (1.0 - w) * f + w * sample,
            None => sample,
        };
        self.fps = Some(fps);
        if fps < self.dfr * (1.0 - BEHIND_MARGIN) {
            self.behind_until = now.saturating_add(self.cfg.boost_hold);
        }
        self.step(fps, prev, fast);
        (self.share != before).then_some(self.share)
    }

    /// Algorithm 1, lines 2-28.
    fn step(&mut self, fps: f64, prev: f64, fast: bool) {
        let max = self.cfg.max_share.max(self.original);
        if fast {
            if fps <= prev && fps < self.dfr * self.cfg.fast_scale {
                self.share = self.share.saturating_mul(2).min(max);
            }
            return;
        }
        if fps <= prev && fps < self.dfr {
            if !self.prev_increased {
                self.share = self.share.saturating_add(self.cfg.share_unit).min(max);
                self.prev_increased = true;
            } else {
                self.negative += 1;
                if self.negative >= self.cfg.chances {
                    self.share = (self.share / 2).max(self.original);
                    self.negative = 0;
                    if fps < self.dfr {
                        self.dfr = fps;
                    }
                }
                self.prev_increased = false;
            }
        } else {
            self.negative = 0;
            self.prev_increased = false;
        }
        if fps * self.cfg.tolerance_ratio > self.dfr {
            self.dfr = fps * self.cfg.tolerance_ratio;
        }
    }

    fn restore(&mut self) {
        self.share = self.original;
        self.behind_until = 0;
        self.start = None;
        self.fps = None;
        self.negative = 0;
        self.prev_increased = false;
    }
}
