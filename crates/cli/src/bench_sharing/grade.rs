//! How `bench sharing` grades a configuration's fairness: per window, the worst guest's
//! relative gap to its equal share, from the daemon's device-time meter (the scheduler's
//! own view) and from the guests' own counts of the work they got done, each unit weighed
//! by its size's time alone (the grade: a scheduler can meter device time fairly while a
//! guest's time goes to something other than its work).

use crate::stats::percentile;

/// The windows of one run, read at the same instants from both sides: per window and
/// guest, the device time the daemon's meter counted (ns) and the units of work the guest
/// itself counted as answered.
#[derive(Debug, Clone, Default)]
pub(crate) struct Windows {
    pub meter_ns: Vec<Vec<u64>>,
    pub guest_units: Vec<Vec<u64>>,
}

/// max over guests |share - ideal| / ideal of one window (equal shares).
fn unfairness(window: &[u64]) -> Option<f64> {
    let v: Vec<f64> = window.iter().map(|t| *t as f64).collect();
    unfairness_of(&v)
}

/// max over guests |share - ideal| / ideal of one window's amounts of work (equal shares).
fn unfairness_of(window: &[f64]) -> Option<f64> {
    let total: f64 = window.iter().sum();
    if total <= 0.0 || !total.is_finite() {
        return None;
    }
    let ideal = 1.0 / window.len() as f64;
    Some(
        window
            .iter()
            .map(|t| (t / total - ideal).abs() / ideal)
            .fold(0.0, f64::max),
    )
}

/// One window's unfairness from the guests' own counts: guest `i` answered `units[i]`
/// units of size `i % 3`, each worth `1 / rates[i % 3]` seconds of the device (the size's
/// rate alone, as the guests counted it, device saturated), so the device time it got is
/// measured by what it got done, not by the scheduler's meter. Given a whole run's counts,
/// the run's: no window edge cuts a guest's queue there (a guest counts a command when its
/// answer comes, so a window holds up to a queue's depth more or less of one guest's work
/// than the meter's continuous count).
pub(crate) fn guest_unfairness(units: &[u64], rates: &[f64]) -> Option<f64> {
    if rates.is_empty() {
        return None;
    }
    let work: Vec<f64> = units
        .iter()
        .enumerate()
        .map(|(i, u)| *u as f64 / rates[i % rates.len()].max(1e-9))
        .collect();
    unfairness_of(&work)
}

/// A configuration's unfairness, graded both ways (fractions, median and p95 over the
/// windows).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Grade {
    /// From the daemon's device-time meter (the scheduler's own view).
    pub meter: (f64, f64),
    /// From the guests' own counts of their completed work: what the grade is.
    pub guest: (f64, f64),
}

impl Grade {
    /// Grades `windows`; `rates[k]`: size `k`'s units per second alone for each window.
    pub(crate) fn of(windows: &[(Windows, Vec<f64>)]) -> Self {
        let meter: Vec<f64> = windows
            .iter()
            .flat_map(|(w, _)| w.meter_ns.iter().filter_map(|x| unfairness(x)))
            .collect();
        let guest: Vec<f64> = windows
            .iter()
            .flat_map(|(w, rates)| {
                w.guest_units
                    .iter()
                    .filter_map(|x| guest_unfairness(x, rates))
            })
            .collect();
        let m = |v: &[f64]| (percentile(v, 50.0), percentile(v, 95.0));
        Grade {
            meter: m(&meter),
            guest: m(&guest),
        }
    }

    /// Whether the guests' median unfairness is within `target` (a fraction); the meter's
    /// does not count.
    pub(crate) fn passes(&self, target: f64) -> bool {
        self.guest.0 <= target
    }
}

/// The target for the median unfairness from the guests' completed work.
pub(crate) const UNFAIRNESS_TARGET: f64 = 0.02;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unfairness_is_the_worst_guests_relative_gap() {
        assert_eq!(unfairness(&[0, 0]), None);
        assert_eq!(unfairness(&[500, 500]), Some(0.0));
        // Shares 0.6 and 0.4 against 0.5: 20% off.
        let u = unfairness(&[600, 400]).unwrap();
        assert!((u - 0.2).abs() < 1e-12, "{u}");
    }

    #[test]
    fn the_grade_is_what_the_guests_got_not_what_the_meter_says() {
        // Two guests, sizes at 100 and 50 units a second alone. The meter gave each the
        // same device time in every window, but the guests got 100 and 25 units: half
        // of its fair share for the second guest (its time went to something other than
        // its work, e.g. charged to it while the device was not working for it).
        let w = Windows {
            meter_ns: vec![vec![500_000_000, 500_000_000]; 3],
            guest_units: vec![vec![100, 25]; 3],
        };
        let g = Grade::of(&[(w, vec![100.0, 50.0])]);
        assert_eq!(g.meter, (0.0, 0.0));
        // Work 1.0 s and 0.5 s of the device: shares 2/3 and 1/3 against 1/2.
        assert!((g.guest.0 - 1.0 / 3.0).abs() < 1e-9, "{g:?}");
        assert!(!g.passes(UNFAIRNESS_TARGET));
        // Counts proportional to the alone rates are fair, whatever the meter says.
        let w = Windows {
            meter_ns: vec![vec![900, 100]],
            guest_units: vec![vec![100, 50]],
        };
        let g = Grade::of(&[(w, vec![100.0, 50.0])]);
        assert!(g.meter.0 > 0.5, "{g:?}");
        assert_eq!(g.guest.0, 0.0);
        assert!(g.passes(UNFAIRNESS_TARGET));
    }

    #[test]
    fn guest_unfairness_weighs_sizes_by_their_alone_rates() {
        // Guest 3 is size 0 again.
        let u = guest_unfairness(&[100, 50, 25, 100], &[100.0, 50.0, 25.0]).unwrap();
        assert!(u.abs() < 1e-12, "{u}");
        // Guest 3 got 10% more than the others: (1.1/4.1 - 1/4) * 4.
        let u = guest_unfairness(&[100, 50, 25, 110], &[100.0, 50.0, 25.0]).unwrap();
        assert!((u - (1.1 / 4.1 - 0.25) * 4.0).abs() < 1e-9, "{u}");
        assert_eq!(guest_unfairness(&[0, 0], &[1.0, 1.0]), None);
        assert_eq!(guest_unfairness(&[1, 1], &[]), None);
    }

    #[test]
    fn a_window_edge_moves_the_windows_grade_not_the_runs() {
        // One guest's answers fall on either side of the edge: 5% off in each window, even
        // over the run.
        let w = Windows {
            meter_ns: vec![vec![1, 1]; 2],
            guest_units: vec![vec![105, 95], vec![95, 105]],
        };
        let g = Grade::of(&[(w, vec![1.0, 1.0])]);
        assert!((g.guest.0 - 0.05).abs() < 1e-9, "{g:?}");
        assert_eq!(guest_unfairness(&[200, 200], &[1.0, 1.0]), Some(0.0));
    }
}
