//! Part (a) of `bench sharing`: fairness and overhead per scheduler and guest count, in
//! interleaved slices against one guest alone and against round robin.

use super::cpu::{CpuSplit, Reading};
use super::*;

/// Part (a) on one device: every scheduler with every guest count. Each scheduler gets one
/// daemon; each guest count `repeats` rounds of (interleaved slice pairs of every size alone
/// and the guests together, then the guests together for the windows), so the alone rates
/// an overhead is computed against were measured within a second of it, on the same
/// daemon, under the same load. The overhead is the median over the slice pairs; the
/// windows of all rounds make the unfairness.
pub(super) fn fairness_on(
    work: Work,
    p: &SharingParams,
    repeats: usize,
    alone_all: &mut Vec<AloneRow>,
) -> Result<Vec<FairnessRow>, CliError> {
    let mut fairness = Vec::new();
    for kind in &p.schedulers {
        let d = DaemonProcess::spawn(&["--scheduler", kind.name()], false)?;
        let (target, pid) = (d.endpoint().target, d.endpoint().pid);
        let control = Target::Unix(control_path(std::path::Path::new(&target)));
        let daemon = (target.as_str(), &control, pid);
        let r = fairness_of(work, *kind, daemon, p, repeats, &mut fairness);
        d.stop()?;
        alone_all.extend(r?);
    }
    // Against round robin: both daemons at once, slices alternating between them.
    let rr_rates: Vec<f64> = alone_all
        .iter()
        .filter(|a| a.device == work.device() && a.scheduler == Kind::RoundRobin.name())
        .map(|a| a.commands_per_s)
        .collect();
    if rr_rates.len() == 3 {
        for kind in p.schedulers.iter().filter(|k| **k != Kind::RoundRobin) {
            let rr = DaemonProcess::spawn(&["--scheduler", Kind::RoundRobin.name()], false)?;
            let other = DaemonProcess::spawn(&["--scheduler", kind.name()], false)?;
            let targets = [rr.endpoint().target, other.endpoint().target];
            let mut r = Ok(());
            for &n in &p.guests {
                let pairs = SLICE_PAIRS * repeats.max(1);
                let ratios = match ab_slices(work, [&targets[0], &targets[1]], n, pairs, &rr_rates)
                {
                    Ok(x) => x,
                    Err(e) => {
                        r = Err(e);
                        break;
                    }
                };
                let losses: Vec<f64> = ratios.iter().map(|x| (1.0 - x) * 100.0).collect();
                if let Some(row) = fairness.iter_mut().find(|f| {
                    f.scheduler == kind.name() && f.guests == n && f.device == work.device()
                }) {
                    row.overhead_vs_round_robin_pct = Some(percentile(&losses, 50.0));
                    row.overhead_vs_round_robin_range_pct =
                        Some((percentile(&losses, 25.0), percentile(&losses, 75.0)));
                }
            }
            rr.stop()?;
            other.stop()?;
            r?;
        }
    }
    Ok(fairness)
}

/// `n` guests on each of two daemons (`targets[0]` round robin, `targets[1]` the scheduler
/// compared), all connected at once; `pairs` pairs of slices, the guests of one daemon on
/// and the other's off, then the other way round. Each pair's throughput of the second
/// daemon over the first's (the work weighed by `rates`, each size's commands per second
/// alone), a second apart under the same load.
fn ab_slices(
    work: Work,
    targets: [&str; 2],
    n: usize,
    pairs: usize,
    rates: &[f64],
) -> Result<Vec<f64>, CliError> {
    let warm = Barrier::new(2 * n + 1);
    let stop = AtomicBool::new(false);
    let gates: Vec<Gate> = (0..2 * n).map(|_| Gate::closed()).collect();
    let done: Vec<AtomicU64> = (0..2 * n).map(|_| AtomicU64::new(0)).collect();
    let names: Vec<String> = (0..2 * n)
        .map(|j| format!("share-ab{}-{}", j / n, j % n))
        .collect();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..2 * n)
            .map(|j| {
                let (name, gate, warm, stop, done) = (&names[j], &gates[j], &warm, &stop, &done[j]);
                let (target, size) = (targets[j / n], work.sizes()[(j % n) % 3]);
                s.spawn(move || {
                    work.guest(
                        target,
                        name,
                        size,
                        (Some(gate), None, None),
                        warm,
                        stop,
                        done,
                    )
                })
            })
            .collect();
        warm.wait();
        let slice = |side: usize| -> f64 {
            for (j, g) in gates.iter().enumerate() {
                g.set(j / n == side);
            }
            std::thread::sleep(SLICE_SETTLE);
            let c0: Vec<u64> = done.iter().map(|c| c.load(Ordering::Relaxed)).collect();
            let t0 = Instant::now();
            std::thread::sleep(SLICE_TOGETHER);
            let counts: Vec<u64> = (side * n..side * n + n)
                .map(|j| done[j].load(Ordering::Relaxed) - c0[j])
                .collect();
            together_throughput(&counts, rates, t0.elapsed().as_secs_f64())
        };
        let mut out = Vec::new();
        for k in 0..pairs {
            // Alternate which side goes first, so a trend in the load does not favour one.
            let (a, b) = if k % 2 == 0 {
                let a = slice(0);
                (a, slice(1))
            } else {
                let b = slice(1);
                (slice(0), b)
            };
            out.push(b / a.max(1e-9));
        }
        stop_guests(&stop, &gates, handles)?;
        Ok(out)
    })
}

/// [`fairness_on`] for one scheduler whose daemon is at `target`: pushes its rows onto
/// `fairness`, returns its alone rates (the median per size over the rounds).
fn fairness_of(
    work: Work,
    kind: Kind,
    (target, control, pid): (&str, &Target, Option<u32>),
    p: &SharingParams,
    repeats: usize,
    fairness: &mut Vec<FairnessRow>,
) -> Result<Vec<AloneRow>, CliError> {
    let sizes = work.sizes();
    let mut alone_rates: Vec<Vec<f64>> = vec![Vec::new(); sizes.len()];
    let mut round = 0;
    for &n in &p.guests {
        let mut runs: Vec<(Windows, Vec<f64>)> = Vec::new();
        let mut pairs = Vec::new();
        for _ in 0..repeats.max(1) {
            round += 1;
            let round_pairs = interleaved(work, (target, control, pid), round, n, SLICE_PAIRS)?;
            // This round's alone rates weigh its windows' counts.
            let rates: Vec<f64> = (0..n.min(sizes.len()))
                .map(|k| percentile(&alone_of(&round_pairs, &sizes, k), 50.0))
                .collect();
            for pair in &round_pairs {
                for (i, r) in pair.rates.iter().enumerate() {
                    alone_rates[i].push(*r);
                }
            }
            pairs.extend(round_pairs);
            runs.push((
                run_guests(work, target, control, round, n, p.seconds)?,
                rates,
            ));
        }
        fairness.push(row(work, kind, n, &runs, &pairs));
    }
    Ok(sizes
        .iter()
        .zip(alone_rates)
        .filter(|(_, rates)| !rates.is_empty())
        .map(|((w, h), rates)| AloneRow {
            device: work.device().to_string(),
            scheduler: kind.name().to_string(),
            size: format!("{w}x{h}"),
            commands_per_s: percentile(&rates, 50.0),
        })
        .collect())
}

/// The alone rates of size index `k` in `pairs`, pooled with every index of the same size
/// (one size measured twice weighs alike: with one size three times, the control, each
/// index's own median differed by up to 25% between indices here, and the grade measured
/// that more than the scheduler).
fn alone_of(pairs: &[SlicePair], sizes: &[(u32, u32)], k: usize) -> Vec<f64> {
    pairs
        .iter()
        .flat_map(|p| p.rates.iter().enumerate())
        .filter(|(j, _)| sizes.get(*j) == sizes.get(k))
        .map(|(_, r)| *r)
        .collect()
}

/// Per-guest sums over `windows`.
fn sums(windows: &[&Vec<u64>], n: usize) -> Vec<u64> {
    let mut total = vec![0u64; n];
    for win in windows {
        for (t, x) in total.iter_mut().zip(win.iter()) {
            *t += x;
        }
    }
    total
}

/// The row of `n` guests under `kind`: the grade of the windows of `runs` (each with its
/// round's alone rates) and the overhead of the slice `pairs`.
fn row(
    work: Work,
    kind: Kind,
    n: usize,
    runs: &[(Windows, Vec<f64>)],
    pairs: &[SlicePair],
) -> FairnessRow {
    let sizes = work.sizes();
    let grade = Grade::of(runs);
    let windows: Vec<&Vec<u64>> = runs.iter().flat_map(|(w, _)| &w.meter_ns).collect();
    let window_units: Vec<&Vec<u64>> = runs.iter().flat_map(|(w, _)| &w.guest_units).collect();
    let total = sums(&windows, n);
    let guest_units = sums(&window_units, n);
    let all: u64 = total.iter().sum::<u64>().max(1);
    let throughputs: Vec<f64> = pairs.iter().map(|p| p.throughput).collect();
    let overheads: Vec<f64> = throughputs.iter().map(|t| (1.0 - t) * 100.0).collect();
    let unit_costs: Vec<f64> = (pairs.iter())
        .filter_map(|p| p.unit_cost.map(|u| (u - 1.0) * 100.0))
        .collect();
    let per_size = |f: &dyn Fn(&SlicePair) -> &Vec<f64>| -> Vec<f64> {
        (0..sizes.len().min(n))
            .map(|k| {
                let v: Vec<f64> = pairs.iter().filter_map(|p| f(p).get(k).copied()).collect();
                percentile(&v, 50.0)
            })
            .collect()
    };
    let busy_together: Vec<f64> = pairs.iter().map(|p| p.busy_together).collect();
    let pooled: Vec<Vec<f64>> = (0..sizes.len().min(n))
        .map(|k| alone_of(pairs, &sizes, k))
        .collect();
    let run_rates: Vec<f64> = pooled.iter().map(|v| percentile(v, 50.0)).collect();
    let spread = |v: &Vec<f64>| {
        let mid = percentile(v, 50.0).max(1e-9);
        (percentile(v, 75.0) - percentile(v, 25.0)) / mid * 100.0
    };
    FairnessRow {
        alone_rate_spread_pct: pooled.iter().map(spread).collect(),
        pair_rates: pairs.iter().map(|p| p.rates.clone()).collect(),
        pair_command_ms_alone: pairs.iter().map(|p| p.command_ms_alone.clone()).collect(),
        busy_alone_pct: per_size(&|p| &p.busy_alone),
        busy_together_pct: percentile(&busy_together, 50.0),
        cpu_alone_pct: (0..sizes.len().min(n))
            .map(|k| {
                let v: Vec<CpuSplit> = pairs
                    .iter()
                    .filter_map(|p| p.cpu_alone.get(k).copied())
                    .collect();
                CpuSplit::median(&v)
            })
            .collect(),
        cpu_together_pct: CpuSplit::median(
            &pairs.iter().map(|p| p.cpu_together).collect::<Vec<_>>(),
        ),
        command_ms_alone: per_size(&|p| &p.command_ms_alone),
        command_ms_together: per_size(&|p| &p.command_ms_together),
        scheduler: kind.name().to_string(),
        guests: n,
        unfairness_median: grade.meter.0,
        unfairness_p95: grade.meter.1,
        unfairness_guest_median: grade.guest.0,
        unfairness_guest_p95: grade.guest.1,
        unfairness_guest_counted_median: grade.counted.0,
        unfairness_same_size_median: grade.same_size.map(|s| s.0),
        unfairness_together_weights_median: grade.together.map(|t| t.0),
        unfairness_same_size_run: grade::same_size_unfairness(
            &guest_units.iter().map(|u| *u as f64).collect::<Vec<_>>(),
            run_rates.len(),
        ),
        unfairness_guest_run: grade::guest_unfairness(&guest_units, &run_rates),
        unfairness_target_met: grade.passes(UNFAIRNESS_TARGET),
        guest_bytes: guest_units
            .iter()
            .enumerate()
            .map(|(i, u)| u * work.bytes_per_unit(sizes[i % 3]))
            .collect(),
        guest_units,
        window_units: window_units.into_iter().cloned().collect(),
        window_work: runs
            .iter()
            .flat_map(|(w, _)| w.guest_work.clone())
            .collect(),
        alone_queue_factor: backlog::DEEP,
        overhead_pct: percentile(&overheads, 50.0),
        overhead_range_pct: (percentile(&overheads, 25.0), percentile(&overheads, 75.0)),
        overhead_pairs: overheads.len(),
        overhead_per_unit_pct: (!unit_costs.is_empty()).then(|| percentile(&unit_costs, 50.0)),
        overhead_per_unit_range_pct: (!unit_costs.is_empty())
            .then(|| (percentile(&unit_costs, 25.0), percentile(&unit_costs, 75.0))),
        overhead_vs_round_robin_pct: None,
        overhead_vs_round_robin_range_pct: None,
        throughput: percentile(&throughputs, 50.0),
        shares: total.iter().map(|t| *t as f64 / all as f64).collect(),
        windows: windows.len(),
        window_ms: windows
            .iter()
            .map(|w| w.iter().map(|t| *t as f64 / 1e6).collect())
            .collect(),
        device: work.device().to_string(),
        rotation: gpu::ROTATION,
    }
}

/// How long a slice of the overhead measure waits after switching guests on or off before
/// counting (the guests switched off finish their queued commands meanwhile).
const SLICE_SETTLE: Duration = Duration::from_millis(80);
/// How long each size alone is counted in a slice pair.
const SLICE_ALONE: Duration = Duration::from_millis(300);
/// How long the guests together are counted in a slice pair.
const SLICE_TOGETHER: Duration = Duration::from_millis(600);

/// One slice pair's result: each size's commands per second alone, and the guests'
/// throughput together in units of one guest alone (the same commands at the alone rates
/// would have taken this fraction of the time); and from the daemon's accounting, where the
/// difference goes: the device's busy time (% of the slice) and its time per command of
/// each size, alone and together.
#[derive(Debug, Clone)]
struct SlicePair {
    rates: Vec<f64>,
    throughput: f64,
    busy_alone: Vec<f64>,
    busy_together: f64,
    command_ms_alone: Vec<f64>,
    command_ms_together: Vec<f64>,
    /// The device time the guests' work together took over what the same work took
    /// alone ([`unit_cost`]).
    unit_cost: Option<f64>,
    /// Where the cores went, each size alone and the guests together.
    cpu_alone: Vec<CpuSplit>,
    cpu_together: CpuSplit,
}

/// Device time (ns) per guest name.
type DeviceTimes = std::collections::BTreeMap<String, u64>;

/// Over a slice: the device's busy time as % of `secs`, and per size (guest `i` of size
/// `i % 3`) its device time per command in ms (0 without commands).
fn device_use(
    names: &[String],
    (before, after): (&DeviceTimes, &DeviceTimes),
    counts: &[u64],
    secs: f64,
    sizes: usize,
) -> (f64, Vec<f64>) {
    let ns: Vec<u64> = names
        .iter()
        .map(|g| {
            let a = after.get(g).copied().unwrap_or(0);
            a.saturating_sub(before.get(g).copied().unwrap_or(0))
        })
        .collect();
    let busy = ns.iter().sum::<u64>() as f64 / 1e9 / secs.max(1e-9) * 100.0;
    let per_cmd = (0..sizes)
        .map(|k| {
            let (t, c) = ns
                .iter()
                .zip(counts)
                .enumerate()
                .filter(|(i, _)| i % 3 == k)
                .fold((0u64, 0u64), |(t, c), (_, (x, y))| (t + x, c + y));
            if c == 0 {
                0.0
            } else {
                t as f64 / 1e6 / c as f64
            }
        })
        .collect();
    (busy, per_cmd)
}

/// The throughput overhead measured in interleaved slices: `n` guests (`share-o{round}-{i}`,
/// guest `i` of size `i % 3`) stay connected; each pair of slices runs each size alone (the
/// first guest of that size, the others switched off) and then all of them together. Each
/// pair compares rates a second apart, so the machine's load (other work on its cores is
/// the GPU's too on a CPU driver) drifts little between the two halves of a comparison,
/// unlike alone runs seconds before the guests together; the overhead is then the median
/// over many pairs.
fn interleaved(
    work: Work,
    (target, control, pid): (&str, &Target, Option<u32>),
    round: usize,
    n: usize,
    pairs: usize,
) -> Result<Vec<SlicePair>, CliError> {
    let warm = Barrier::new(n + 1);
    let stop = AtomicBool::new(false);
    let gates: Vec<Gate> = (0..n).map(|_| Gate::closed()).collect();
    let deeps: Vec<AtomicBool> = (0..n).map(|_| AtomicBool::new(false)).collect();
    let done: Vec<AtomicU64> = (0..n).map(|_| AtomicU64::new(0)).collect();
    let names: Vec<String> = (0..n).map(|i| format!("share-o{round}-{i}")).collect();
    let sizes = n.min(3);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|i| {
                let (name, warm, stop, done) = (&names[i], &warm, &stop, &done[i]);
                let flags = (Some(&gates[i]), Some(&deeps[i]), None);
                let size = work.sizes()[i % 3];
                s.spawn(move || work.guest(target, name, size, flags, warm, stop, done))
            })
            .collect();
        warm.wait();
        type Counted = (Vec<u64>, f64, (f64, Vec<f64>), CpuSplit);
        // Guests `on` run; alone (one guest on), it queues deeper to saturate the device.
        let count = |on: &dyn Fn(usize) -> bool, d: Duration| -> Result<Counted, CliError> {
            let alone = (0..n).filter(|i| on(*i)).count() == 1;
            for (i, (g, deep)) in gates.iter().zip(&deeps).enumerate() {
                deep.store(alone && on(i), Ordering::Relaxed);
                g.set(on(i));
            }
            std::thread::sleep(SLICE_SETTLE);
            let d0 = device_time(control, work.device())?;
            let c0: Vec<u64> = done.iter().map(|c| c.load(Ordering::Relaxed)).collect();
            let cpu0 = Reading::now(pid);
            let t0 = Instant::now();
            std::thread::sleep(d);
            let cpu = cpu0.split_to(&Reading::now(pid));
            let counts: Vec<u64> = done
                .iter()
                .zip(&c0)
                .map(|(c, z)| c.load(Ordering::Relaxed) - z)
                .collect();
            let secs = t0.elapsed().as_secs_f64();
            let d1 = device_time(control, work.device())?;
            let used = device_use(&names, (&d0, &d1), &counts, secs, sizes);
            Ok((counts, secs, used, cpu))
        };
        let mut out = Vec::new();
        for _ in 0..pairs {
            let (mut rates, mut busy_alone, mut command_ms_alone) = (vec![], vec![], vec![]);
            let mut cpu_alone = vec![];
            for k in 0..sizes {
                let (c, secs, (busy, per_cmd), cpu) = count(&|i| i == k, SLICE_ALONE)?;
                rates.push(c[k] as f64 / secs);
                busy_alone.push(busy);
                command_ms_alone.push(per_cmd[k]);
                cpu_alone.push(cpu);
            }
            let (c, secs, (busy_together, command_ms_together), cpu_together) =
                count(&|_| true, SLICE_TOGETHER)?;
            out.push(SlicePair {
                cpu_alone,
                cpu_together,
                throughput: together_throughput(&c, &rates, secs),
                unit_cost: unit_cost(&c, &command_ms_alone, &command_ms_together),
                rates,
                busy_alone,
                busy_together,
                command_ms_alone,
                command_ms_together,
            });
        }
        stop_guests(&stop, &gates, handles)?;
        Ok(out)
    })
}

/// The device time `counts[i]` commands of guest `i` (size `i % sizes`) took together over
/// what they would have taken alone, from the meter's time per command of each size alone
/// (`ms_alone`) and together (`ms_together`): what sharing costs a unit of work where the
/// device is busy, whether or not one guest alone keeps it busy (the codec's does not: one
/// decoder with one thread uses one of the host's cores). `None` without a size's cost.
pub(super) fn unit_cost(counts: &[u64], ms_alone: &[f64], ms_together: &[f64]) -> Option<f64> {
    let sizes = ms_alone.len().min(ms_together.len());
    if sizes == 0 || ms_alone.iter().take(sizes).any(|m| *m <= 0.0) {
        return None;
    }
    let (mut alone, mut together) = (0.0, 0.0);
    for (i, c) in counts.iter().enumerate() {
        alone += *c as f64 * ms_alone[i % sizes];
        together += *c as f64 * ms_together[i % sizes];
    }
    (alone > 0.0).then(|| together / alone)
}

/// The guests' work together in `secs` (`counts[i]` commands of guest `i`, of size `i % 3`)
/// in units of one guest alone: the seconds it would have taken at the alone `rates`, over
/// `secs`. 1 is no overhead.
pub(super) fn together_throughput(counts: &[u64], rates: &[f64], secs: f64) -> f64 {
    let alone_secs: f64 = counts
        .iter()
        .enumerate()
        .map(|(i, c)| *c as f64 / rates[i % rates.len()].max(1e-9))
        .sum();
    alone_secs / secs.max(1e-9)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(rates: [f64; 3]) -> SlicePair {
        SlicePair {
            rates: rates.to_vec(),
            throughput: 1.0,
            busy_alone: vec![],
            busy_together: 0.0,
            command_ms_alone: vec![],
            command_ms_together: vec![],
            unit_cost: None,
            cpu_alone: vec![],
            cpu_together: CpuSplit::default(),
        }
    }

    #[test]
    fn the_unit_cost_weighs_each_sizes_shift_by_its_work_together() {
        // Size 0: 1 ms alone, 1.2 together; size 1: 4 ms both. Guests 0 and 2 (size 0) did
        // 100 units each, guest 1 (size 1) 50: 200 ms alone became 240, 200 stayed 200.
        let u = unit_cost(&[100, 50, 100], &[1.0, 4.0], &[1.2, 4.0]).unwrap();
        assert!((u - 440.0 / 400.0).abs() < 1e-12, "{u}");
        assert_eq!(unit_cost(&[1, 1], &[0.0, 1.0], &[1.0, 1.0]), None);
        assert_eq!(unit_cost(&[0, 0], &[1.0, 1.0], &[1.0, 1.0]), None);
        assert_eq!(unit_cost(&[1], &[], &[]), None);
    }

    #[test]
    fn one_size_measured_twice_weighs_alike() {
        let pairs = [pair([100.0, 80.0, 10.0]), pair([90.0, 120.0, 12.0])];
        let mixed = [(640, 360), (1280, 720), (1920, 1080)];
        assert_eq!(alone_of(&pairs, &mixed, 0), vec![100.0, 90.0]);
        // The control: every index is one size, so each pools all of them.
        let same = [(640, 360); 3];
        let mut v = alone_of(&pairs, &same, 1);
        v.sort_by(f64::total_cmp);
        assert_eq!(v, vec![10.0, 12.0, 80.0, 90.0, 100.0, 120.0]);
        assert_eq!(alone_of(&pairs, &same, 0), alone_of(&pairs, &same, 2));
    }
}
