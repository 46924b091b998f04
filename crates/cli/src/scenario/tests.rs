//! Unit tests of the scenarios' pacing (no daemon).

use super::{late_rule, Common, Pacing};
use std::time::{Duration, Instant};

/// A late frame moves the schedule, never the start the run is measured from: a run
/// slower than its frame rate lasts its `--seconds` and its rates use the real span.
#[test]
fn late_frames_move_the_schedule_not_the_measured_start() {
    let t0 = Instant::now();
    let mut c = Common {
        frames_in: 0,
        late_drops: 0,
        t0,
        anchor: t0,
        dropped_last: false,
        before: virtsoc_guest::Counters::default(),
        ledger0: Vec::new(),
        cpu_guest0: 0.0,
        cpu_daemon0: None,
        daemon_pid: None,
        pacing: Pacing::Free,
    };
    let p = Duration::from_millis(16);
    // Frame 1, due at t0 + p, is asked at t0 + 10 p: late, dropped, schedule re-anchored.
    assert_eq!(c.schedule(t0 + 10 * p, 1, p), (None, true));
    assert_eq!(c.t0, t0, "the measured start stays");
    assert_eq!(c.anchor, t0 + 9 * p);
    // Frame 2 is now due one period after the re-anchored frame 1.
    assert_eq!(c.schedule(t0 + 10 * p, 2, p), (Some(p), false));
}

/// A guest three periods slow per frame (a decoder that cannot keep up) still shows
/// every other frame; an on-time guest drops nothing.
#[test]
fn a_slow_pipeline_shows_every_other_frame() {
    let p = Duration::from_millis(16);
    let mut last = false;
    let drops: Vec<bool> = (0..6).map(|_| late_rule(&mut last, 3 * p, p).0).collect();
    assert_eq!(drops, [true, false, true, false, true, false]);
    assert_eq!(
        late_rule(&mut last, 3 * p, p).1,
        3 * p,
        "re-anchored at now"
    );
    let mut last = false;
    assert_eq!(late_rule(&mut last, p / 2, p), (false, Duration::ZERO));
    assert!(!last);
}
