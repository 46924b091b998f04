//! When a scenario's frames start: on its own clock, or aligned to land just before a vsync
//! with a lead measured from the guest's own pipeline (the display's `timing`).

use std::time::{Duration, Instant};

use virtsoc_guest::devices as api;
use virtsoc_guest::Connection;

use crate::CliError;

/// When a scenario's frames start.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    clap::ValueEnum,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum Pacing {
    /// Each frame starts where the display's vsync lets it land on time: its start is
    /// shifted (after a warm-up of 20 frames, then every 30) to `lead` before a vsync, `lead` being
    /// the largest of this guest's last 30 capture -> present times (the display's `timing`)
    /// plus a margin, as Android's Choreographer phase offsets do. A faster pipeline gets a
    /// shorter lead, so its frames wait less for the vsync. The largest, not a percentile: a
    /// frame that misses its vsync costs a frame (the display's queue catches up by dropping
    /// one), and with the 90th percentile about one frame in ten missed.
    #[default]
    Vsync,
    /// Frames start on the scenario's own clock, whatever the vsync phase.
    Free,
}

/// How far to move a frame starting at `start_ns` (later, by less than `period_ns`) so that
/// it starts `lead_ns` before a vsync of a clock that ticked at `vsync_ns` every `period_ns`.
fn phase_shift(start_ns: i128, vsync_ns: i128, lead_ns: i128, period_ns: i128) -> u64 {
    let want = (vsync_ns - lead_ns).rem_euclid(period_ns);
    (want - start_ns.rem_euclid(period_ns)).rem_euclid(period_ns) as u64
}

/// Frames before the first alignment to the vsync, and between two.
const ALIGN_FIRST: u64 = 20;
const ALIGN_EVERY: u64 = 30;
/// Slack added to the measured capture -> present time.
const ALIGN_MARGIN: Duration = Duration::from_micros(1500);

/// With `Pacing::Vsync`, how far (forward, by less than a refresh period) to move a schedule
/// starting at `t0` so that frame `i` starts `lead` before a vsync. Zero on other frames than
/// the alignment points, and before the display has a few samples of this guest's timing.
pub(super) fn shift(
    conn: &Connection,
    pacing: Pacing,
    t0: Instant,
    i: u64,
    period: Duration,
) -> Result<Duration, CliError> {
    if pacing != Pacing::Vsync || i < ALIGN_FIRST || !(i - ALIGN_FIRST).is_multiple_of(ALIGN_EVERY)
    {
        return Ok(Duration::ZERO);
    }
    let t = conn.command(&api::display::Timing::default())?;
    if t.samples < ALIGN_FIRST / 2 || t.period_ns == 0 || t.last_vsync_ns == 0 {
        return Ok(Duration::ZERO);
    }
    let lead = t.ready_max_ns as i128 + ALIGN_MARGIN.as_nanos() as i128;
    // Frame i's start on CLOCK_MONOTONIC.
    let start = t0 + period * i as u32;
    let now = Instant::now();
    let start_ns = super::now_ns() as i128
        + if start >= now {
            (start - now).as_nanos() as i128
        } else {
            -((now - start).as_nanos() as i128)
        };
    let vsync = t.last_vsync_ns as i128;
    Ok(Duration::from_nanos(phase_shift(
        start_ns,
        vsync,
        lead,
        t.period_ns as i128,
    )))
}

#[cfg(test)]
mod tests {
    use super::phase_shift;

    #[test]
    fn a_frame_is_moved_to_start_lead_before_a_vsync() {
        let vp = 16_666_667;
        // Vsyncs at 1000 + k * vp; a 4 ms lead: starts at 1000 - 4 ms + k * vp.
        let lead = 4_000_000;
        assert_eq!(phase_shift(1000, 1000, lead, vp), (vp - lead) as u64);
        let start = 1000 + 3 * vp + 5;
        let s = phase_shift(start, 1000, lead, vp) as i128;
        assert!(s < vp);
        assert_eq!(
            (start + s - 1000 + lead).rem_euclid(vp),
            0,
            "lands on the phase"
        );
        // Already on the phase: no move.
        assert_eq!(phase_shift(1000 - lead + 7 * vp, 1000, lead, vp), 0);
    }
}
