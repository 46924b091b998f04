//! How `bench sharing` grades a configuration's fairness: per window, the worst guest's
//! relative gap to its equal share, from the daemon's device-time meter (the scheduler's
//! own view) and from the guests' own counts of the work they got done, each unit weighed
//! by its size's time alone (the grade: a scheduler can meter device time fairly while a
//! guest's time goes to something other than its work).
//!
//! A guest's work in a window is read from the times its answers came, not from a count at
//! the window's edges ([`work_in`]): a count moves by a whole unit when an answer falls
//! just before or after an edge, a 1080p guest's 30-70 pictures a window by 1.5-3% per
//! edge, while the time between two answers says how much of the next unit was done at the
//! edge. The counts at the edges are kept beside it (`counted`).

use std::time::Instant;

use crate::stats::percentile;

/// The windows of one run, read at the same instants from both sides: per window and
/// guest, the device time the daemon's meter counted (ns) and the units of work the guest
/// itself counted as answered.
#[derive(Debug, Clone, Default)]
pub(crate) struct Windows {
    pub meter_ns: Vec<Vec<u64>>,
    pub guest_units: Vec<Vec<u64>>,
    /// Per window and guest, the units of work it got done, from its answers' times
    /// ([`work_in`]); empty where they were not kept.
    pub guest_work: Vec<Vec<f64>>,
}

/// How much work a guest whose answers came at `times` (sorted) got done in each window
/// between consecutive `edges`: its answers in the window, and of the unit under way at
/// each edge the part done by then, as the time since the answer before it over the time
/// between that answer and its own (the device works on a guest's next unit from one
/// answer to the next). Over several windows the parts add up to the answers.
pub(crate) fn work_in(times: &[Instant], edges: &[Instant]) -> Vec<f64> {
    let done_at = |t: Instant| -> f64 {
        let k = times.partition_point(|x| *x <= t);
        match (k.checked_sub(1).map(|i| times[i]), times.get(k)) {
            (Some(prev), Some(next)) if next > &prev => {
                let part =
                    t.duration_since(prev).as_secs_f64() / next.duration_since(prev).as_secs_f64();
                k as f64 + part
            }
            _ => k as f64,
        }
    };
    edges
        .windows(2)
        .map(|e| done_at(e[1]) - done_at(e[0]))
        .collect()
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

/// One window's unfairness from the guests' own counts: guest `i` got `units[i]`
/// units of size `i % 3` done, each worth `1 / rates[i % 3]` seconds of the device (the size's
/// rate alone, as the guests counted it, device saturated), so the device time it got is
/// measured by what it got done, not by the scheduler's meter. Given a whole run's counts,
/// the run's: no window edge cuts a guest's queue there (a guest counts a command when its
/// answer comes, so a window holds up to a queue's depth more or less of one guest's work
/// than the meter's continuous count).
pub(crate) fn guest_unfairness(units: &[u64], rates: &[f64]) -> Option<f64> {
    let units: Vec<f64> = units.iter().map(|u| *u as f64).collect();
    work_unfairness(&units, rates)
}

/// The unfairness among guests of one size, no weights: guest `i` of size `i % sizes` got
/// `units[i]` done; the worst size's (of those with two guests or more). What it grades is
/// the scheduler's evenness alone: neither the alone rates (measured in slices of their own,
/// whose spread on this machine is up to a quarter) nor what sharing costs one size more
/// than another weighs in it.
pub(crate) fn same_size_unfairness(units: &[f64], sizes: usize) -> Option<f64> {
    (0..sizes.max(1))
        .filter_map(|k| {
            let class: Vec<f64> = units
                .iter()
                .skip(k)
                .step_by(sizes.max(1))
                .copied()
                .collect();
            (class.len() > 1).then(|| unfairness_of(&class)).flatten()
        })
        .reduce(f64::max)
}

/// [`guest_unfairness`] of units counted in fractions ([`work_in`]).
pub(crate) fn work_unfairness(units: &[f64], rates: &[f64]) -> Option<f64> {
    if rates.is_empty() {
        return None;
    }
    let work: Vec<f64> = units
        .iter()
        .enumerate()
        .map(|(i, u)| *u / rates[i % rates.len()].max(1e-9))
        .collect();
    unfairness_of(&work)
}

/// A configuration's unfairness, graded both ways (fractions, median and p95 over the
/// windows).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Grade {
    /// From the daemon's device-time meter (the scheduler's own view).
    pub meter: (f64, f64),
    /// From the guests' own accounts of their completed work, from their answers' times
    /// where kept: what the grade is.
    pub guest: (f64, f64),
    /// The same from the counts at the windows' edges.
    pub counted: (f64, f64),
    /// Among guests of one size ([`same_size_unfairness`], from the answers' times); `None`
    /// with no two guests of one size.
    pub same_size: Option<(f64, f64)>,
    /// The guests' grade with each size's work weighed by its cost together instead of
    /// alone ([`together_rates`]): what is left once neither the alone rates' noise nor the
    /// sizes' different slowdowns beside each other weigh in. A decomposition, not the
    /// grade: those costs come from the meter.
    /// `None` where no window had every size's cost together.
    pub together: Option<(f64, f64)>,
}

/// Each size's units of work per second of device time together, over a run's windows:
/// the work its guests got done (from their answers' times where kept) over the device
/// time the meter counted for them (guest `i` of size `i % sizes`). 0 for a size without
/// either.
pub(crate) fn together_rates(w: &Windows, sizes: usize) -> Vec<f64> {
    let sizes = sizes.max(1);
    let mut units = vec![0.0; sizes];
    let mut secs = vec![0.0; sizes];
    for (meter, work) in w.meter_ns.iter().zip(w.work()) {
        for (i, ns) in meter.iter().enumerate() {
            units[i % sizes] += work.get(i).copied().unwrap_or(0.0);
            secs[i % sizes] += *ns as f64 / 1e9;
        }
    }
    units
        .iter()
        .zip(&secs)
        .map(|(u, s)| if *s > 0.0 { u / s } else { 0.0 })
        .collect()
}

impl Windows {
    /// Per window and guest, its units of work done: from its answers' times where kept,
    /// else the counts at the windows' edges.
    fn work(&self) -> Vec<Vec<f64>> {
        match self.guest_work.len() == self.guest_units.len() {
            true => self.guest_work.clone(),
            false => (self.guest_units.iter())
                .map(|x| x.iter().map(|u| *u as f64).collect())
                .collect(),
        }
    }
}

impl Grade {
    /// Grades `windows`; `rates[k]`: size `k`'s units per second alone for each window.
    pub(crate) fn of(windows: &[(Windows, Vec<f64>)]) -> Self {
        let meter: Vec<f64> = windows
            .iter()
            .flat_map(|(w, _)| w.meter_ns.iter().filter_map(|x| unfairness(x)))
            .collect();
        let counted: Vec<f64> = windows
            .iter()
            .flat_map(|(w, rates)| {
                w.guest_units
                    .iter()
                    .filter_map(|x| guest_unfairness(x, rates))
            })
            .collect();
        // Each run's windows' work once, weighed by its alone rates and by its costs together.
        let (mut timed, mut same_size, mut together) = (vec![], vec![], vec![]);
        for (w, rates) in windows {
            let costs = together_rates(w, rates.len());
            let known = costs.iter().all(|r| *r > 0.0);
            for x in w.work() {
                timed.extend(work_unfairness(&x, rates));
                same_size.extend(same_size_unfairness(&x, rates.len()));
                if known {
                    together.extend(work_unfairness(&x, &costs));
                }
            }
        }
        let m = |v: &[f64]| (percentile(v, 50.0), percentile(v, 95.0));
        Grade {
            together: (!together.is_empty()).then(|| m(&together)),
            meter: m(&meter),
            guest: m(&timed),
            counted: m(&counted),
            same_size: (!same_size.is_empty()).then(|| m(&same_size)),
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
            guest_work: vec![],
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
            guest_work: vec![],
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
            guest_work: vec![],
        };
        let g = Grade::of(&[(w, vec![1.0, 1.0])]);
        assert!((g.guest.0 - 0.05).abs() < 1e-9, "{g:?}");
        assert_eq!(guest_unfairness(&[200, 200], &[1.0, 1.0]), Some(0.0));
    }

    #[test]
    fn work_in_a_window_counts_the_unit_under_way_at_each_edge_in_part() {
        use std::time::Duration;
        let t0 = Instant::now();
        let ms = |m: u64| t0 + Duration::from_millis(m);
        // Answers every 10 ms from 10 ms on (the device on the next unit in between).
        let times: Vec<Instant> = (1..=30).map(|k| ms(10 * k)).collect();
        // Windows [0, 105), [105, 200), [200, 295): whole counts 10, 10, 9.
        let w = work_in(&times, &[ms(0), ms(105), ms(200), ms(295)]);
        let want = [10.5, 9.5, 9.5];
        for (got, want) in w.iter().zip(want) {
            assert!((got - want).abs() < 1e-9, "{w:?}");
        }
        // The parts add up to the answers over the windows together.
        let all = work_in(&times, &[ms(0), ms(295)]);
        assert!((all[0] - w.iter().sum::<f64>()).abs() < 1e-9);
        // Before the first answer nothing is known to be done; after the last, no part.
        assert_eq!(work_in(&times, &[ms(0), ms(5)]), vec![0.0]);
        assert_eq!(work_in(&times, &[ms(300), ms(400)]), vec![0.0]);
        assert!(work_in(&[], &[ms(0), ms(10)]) == vec![0.0]);
    }

    #[test]
    fn same_size_unfairness_compares_guests_of_one_size_only() {
        // Sizes 0, 1, 2, 0, 1: sizes 0 and 1 have two guests each, size 2 one.
        let u = same_size_unfairness(&[100.0, 10.0, 7.0, 100.0, 11.0], 3).unwrap();
        // Size 1: 10 and 11, shares 10/21 against 1/2.
        assert!((u - (0.5 - 10.0 / 21.0) * 2.0).abs() < 1e-12, "{u}");
        // However far apart the sizes' counts, guests of one size alike are even.
        assert_eq!(
            same_size_unfairness(&[5.0, 900.0, 5.0, 900.0], 2),
            Some(0.0)
        );
        assert_eq!(same_size_unfairness(&[5.0, 900.0], 3), None);
    }

    #[test]
    fn the_grade_reads_the_answers_times_where_kept() {
        // Two guests of one size: counted at the edges 105 and 95 (5% off), while their
        // answers' times say each did 100 units.
        let w = Windows {
            meter_ns: vec![vec![1, 1]],
            guest_units: vec![vec![105, 95]],
            guest_work: vec![vec![100.0, 100.0]],
        };
        let g = Grade::of(&[(w, vec![1.0, 1.0])]);
        assert_eq!(g.guest.0, 0.0);
        assert!((g.counted.0 - 0.05).abs() < 1e-9, "{g:?}");
        assert!(g.passes(UNFAIRNESS_TARGET));
    }

    #[test]
    fn the_together_weights_take_each_sizes_cost_beside_the_others() {
        // Sizes cost 1 and 2 ms alone (rates 1000 and 500 a second), but beside each other
        // size 1 costs 2.5 ms. The meter gave both guests 0.5 s a window: 500 and 200
        // units. Weighed alone, guest 1 got 0.4 s of work against guest 0's 0.5 s (11%
        // off); weighed by the costs together (1 and 2.5 ms), both got the same.
        let w = Windows {
            meter_ns: vec![vec![500_000_000, 500_000_000]; 2],
            guest_units: vec![vec![500, 200]; 2],
            guest_work: vec![],
        };
        let rates = together_rates(&w, 2);
        assert!((rates[0] - 1000.0).abs() < 1e-6 && (rates[1] - 400.0).abs() < 1e-6);
        let g = Grade::of(&[(w, vec![1000.0, 500.0])]);
        assert!((g.guest.0 - 1.0 / 9.0).abs() < 1e-9, "{g:?}");
        assert!(g.together.unwrap().0.abs() < 1e-9, "{g:?}");
        // A size the meter never saw leaves the together grade out of those windows.
        let w = Windows {
            meter_ns: vec![vec![1, 0]],
            guest_units: vec![vec![5, 0]],
            guest_work: vec![],
        };
        assert_eq!(together_rates(&w, 2), vec![5e9, 0.0]);
        assert_eq!(Grade::of(&[(w, vec![1.0, 1.0])]).together, None);
    }
}
