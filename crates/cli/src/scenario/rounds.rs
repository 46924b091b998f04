//! `virtsoc run`: one mode, or with `--compare` every coherence protocol x ordering mode,
//! for `--rounds N` rounds run interleaved (round 1 runs every mode, then round 2 every
//! mode, ...), each run against a daemon of its own started fresh for it (unless `--socket`
//! names one), so that no mode always runs first, last, or on a daemon warmed by another.
//! Each mode's row holds the medians over its rounds (`rounds` keeps the per-round rows);
//! the table shows the median and the range, with write-invalidate + fence as the control
//! row and what prefetch + fence adds over it.

use serde::Serialize;

use super::media::Clip;
use super::{RunExtra, RunOpts, ScenarioResult};
use crate::bench_svm::OrderingMode;
use crate::daemon_proc::DaemonProcess;
use crate::stats::{median, P50P99};
use crate::CliError;

/// One protocol x ordering combination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mode {
    pub protocol: String,
    pub ordering: OrderingMode,
}

/// The modes of `--compare`, in table order.
pub fn compare_modes() -> Vec<Mode> {
    ["guest-staging", "write-invalidate", "prefetch"]
        .iter()
        .flat_map(|p| {
            [OrderingMode::Atomic, OrderingMode::Fence].map(|o| Mode {
                protocol: p.to_string(),
                ordering: o,
            })
        })
        .collect()
}

/// The order runs happen in: (round, mode index), every mode of a round before the next
/// round.
pub fn schedule(modes: usize, rounds: usize) -> Vec<(usize, usize)> {
    (0..rounds)
        .flat_map(|r| (0..modes).map(move |m| (r, m)))
        .collect()
}

/// Runs every mode `rounds` times in [`schedule`] order: each run gets a daemon from
/// `daemon` (called once per run: a fresh one) and is run by `run`. Returns per mode its
/// rows in round order.
pub fn run_interleaved<D, T>(
    modes: &[Mode],
    rounds: usize,
    mut daemon: impl FnMut() -> Result<D, CliError>,
    mut run: impl FnMut(&D, &Mode) -> Result<T, CliError>,
) -> Result<Vec<Vec<T>>, CliError> {
    let mut out: Vec<Vec<T>> = modes.iter().map(|_| Vec::new()).collect();
    for (_, m) in schedule(modes.len(), rounds) {
        let d = daemon()?;
        out[m].push(run(&d, &modes[m])?);
    }
    Ok(out)
}

/// The smallest and largest of `v`.
fn range(v: &[f64]) -> (f64, f64) {
    v.iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), x| {
            (lo.min(*x), hi.max(*x))
        })
}

/// One mode's row: the medians over `rounds` of the figures the checks and the table read,
/// the rest from the round whose frame rate is the median's nearest; `rounds` kept.
pub fn summarize(rounds: Vec<ScenarioResult>) -> Option<ScenarioResult> {
    let m = |f: fn(&ScenarioResult) -> f64| median(&rounds.iter().map(f).collect::<Vec<_>>());
    let fps = m(|r| r.presented_fps);
    let mid = rounds
        .iter()
        .min_by(|a, b| {
            (a.presented_fps - fps)
                .abs()
                .total_cmp(&(b.presented_fps - fps).abs())
        })?
        .clone();
    let mut row = ScenarioResult {
        presented_fps: fps,
        latency_ms: P50P99 {
            p50: m(|r| r.latency_ms.p50),
            p99: m(|r| r.latency_ms.p99),
        },
        access_latency_us: P50P99 {
            p50: m(|r| r.access_latency_us.p50),
            p99: m(|r| r.access_latency_us.p99),
        },
        copies_per_frame: m(|r| r.copies_per_frame),
        coherence_ms_per_frame: m(|r| r.coherence_ms_per_frame),
        sink_bytes_per_frame: m(|r| r.sink_bytes_per_frame),
        cpu_guest_pct: m(|r| r.cpu_guest_pct),
        cpu_daemon_pct: Some(m(|r| r.cpu_daemon_pct.unwrap_or(f64::NAN))).filter(|v| !v.is_nan()),
        ..mid
    };
    if rounds.len() > 1 {
        row.rounds = rounds;
    }
    Some(row)
}

/// What `virtsoc run` was asked.
#[derive(Debug, Clone)]
pub struct RunCmd {
    pub opts: RunOpts,
    pub socket: Option<String>,
    pub compare: bool,
    pub rounds: usize,
    pub clip: Option<Clip>,
    pub in_flight: usize,
    pub breakdown: bool,
    pub display_sink: String,
    pub json: bool,
    pub save: Option<std::path::PathBuf>,
}

/// Runs `virtsoc run`.
pub fn run_cmd(c: RunCmd) -> Result<(), CliError> {
    if !(1..=50).contains(&c.rounds) {
        return Err(CliError::Usage("--rounds must be 1..50".into()));
    }
    let gles = c.opts.scenario.starts_with("gles-");
    if c.in_flight > 8 || (!gles && c.in_flight != super::gles_video::IN_FLIGHT) {
        return Err(CliError::Usage(
            "--in-flight is 0..8 and only for gles-video and gles-camera".into(),
        ));
    }
    if c.breakdown && (!gles || (!c.compare && c.opts.ordering == OrderingMode::Fence)) {
        return Err(CliError::Usage(
            "--breakdown times the stages of gles-video and gles-camera with --ordering atomic \
             (each stage finished before the next; with --compare, the atomic rows)"
                .into(),
        ));
    }
    let modes = if c.compare {
        compare_modes()
    } else {
        vec![Mode {
            protocol: c.opts.protocol.clone(),
            ordering: c.opts.ordering,
        }]
    };
    let extra = RunExtra {
        clip: c.clip.unwrap_or(Clip::default_for(&c.opts.scenario)),
        in_flight: c.in_flight,
        breakdown: c.breakdown,
    };
    let size = format!("{}x{}", c.opts.width, c.opts.height);
    let daemon_args = ["--display-size", &size, "--display-sink", &c.display_sink];
    let total = modes.len() * c.rounds;
    let mut done = 0;
    let per_mode = run_interleaved(
        &modes,
        c.rounds,
        || match &c.socket {
            Some(s) => Ok((None, s.clone(), None)),
            None => {
                let d = DaemonProcess::spawn(&daemon_args, false)?;
                let e = d.endpoint();
                Ok((Some(d), e.target, e.pid))
            }
        },
        |(_, target, pid), m| {
            done += 1;
            if !c.json && total > 1 {
                eprintln!(
                    "[{done}/{total}] {} {} {:?}",
                    c.opts.scenario, m.protocol, m.ordering
                );
            }
            let o = RunOpts {
                protocol: m.protocol.clone(),
                ordering: m.ordering,
                ..c.opts.clone()
            };
            super::run_ext(target, *pid, &o, &extra)
        },
    )?;
    let results: Vec<ScenarioResult> = per_mode.into_iter().filter_map(summarize).collect();
    if let Some(path) = &c.save {
        std::fs::write(path, serde_json::to_string_pretty(&results)?)?;
    }
    if c.json {
        println!("{}", serde_json::to_string_pretty(&results)?);
    } else {
        super::print_table(&results);
        print_rounds(&results);
    }
    Ok(())
}

/// The control comparison: prefetch + fence over write-invalidate + fence, and the most
/// prefetch could gain over the control from the control's own measurements.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Control {
    pub fps_ratio: f64,
    pub latency_p50_ratio: f64,
    /// The control's coherence work per frame (its copies on the ledger, ms): all that
    /// prediction can take off the critical path, since the control does it on demand.
    pub control_coherence_ms: f64,
    /// The control's latency p50 with that work gone, over its latency p50: the lowest
    /// `latency_p50_ratio` prefetch could reach.
    pub ceiling_latency_p50_ratio: f64,
    /// The control's frame interval with that work gone: the highest `fps_ratio` prefetch
    /// could reach.
    pub ceiling_fps_ratio: f64,
}

/// `span` ms without `saved` ms of it, over `span` (0 when nothing would be left).
fn without(span: f64, saved: f64) -> f64 {
    if span > 0.0 {
        ((span - saved) / span).max(0.0)
    } else {
        1.0
    }
}

/// Prefetch + fence's frame rate and latency p50 over write-invalidate + fence's (the
/// control: reading host memory in place and fence ordering, without prediction).
pub fn control(rs: &[ScenarioResult]) -> Option<Control> {
    let find = |p: &str| rs.iter().find(|r| r.protocol == p && r.ordering == "fence");
    let (c, p) = (find("write-invalidate")?, find("prefetch")?);
    let coh = c.coherence_ms_per_frame.max(0.0);
    let interval = if c.presented_fps > 0.0 {
        1e3 / c.presented_fps
    } else {
        0.0
    };
    let left = without(interval, coh);
    Some(Control {
        fps_ratio: p.presented_fps / c.presented_fps,
        latency_p50_ratio: p.latency_ms.p50 / c.latency_ms.p50,
        control_coherence_ms: coh,
        ceiling_latency_p50_ratio: without(c.latency_ms.p50, coh),
        ceiling_fps_ratio: if left > 0.0 {
            1.0 / left
        } else {
            f64::INFINITY
        },
    })
}

/// The ranges over rounds, and the control row.
fn print_rounds(rs: &[ScenarioResult]) {
    if rs.iter().any(|r| !r.rounds.is_empty()) {
        println!(
            "\nover {} rounds (median [min, max]):",
            rs.first().map_or(0, |r| r.rounds.len())
        );
        for r in rs {
            let fps: Vec<f64> = r.rounds.iter().map(|x| x.presented_fps).collect();
            let lat: Vec<f64> = r.rounds.iter().map(|x| x.latency_ms.p50).collect();
            let (f0, f1) = range(&fps);
            let (l0, l1) = range(&lat);
            println!(
                "  {:<16} {:<6} fps {:>6.1} [{:.1}, {:.1}]  m2p p50 {:>6.1} [{:.1}, {:.1}] ms",
                r.protocol, r.ordering, r.presented_fps, f0, f1, r.latency_ms.p50, l0, l1
            );
        }
    }
    if let Some(r) = rs.first() {
        println!(
            "display sink: {} ({:.1} MB read per presented frame, {} frames missed)",
            r.display_sink,
            r.sink_bytes_per_frame / 1e6,
            r.sink_missed
        );
    }
    for r in rs.iter().filter(|r| !r.stages_ms.is_empty()) {
        let total: f64 = r.stages_ms.iter().map(|(_, ms)| ms).sum();
        println!(
            "stages of {} {} (p50 ms per frame, each finished before the next; sum {total:.1}):",
            r.protocol, r.ordering
        );
        for (name, ms) in &r.stages_ms {
            println!("  {name:<16} {ms:>7.2}");
        }
    }
    if let Some(c) = control(rs) {
        println!(
            "control: write-invalidate + fence; prefetch + fence over it: fps x{:.2}, m2p p50 x{:.2}",
            c.fps_ratio, c.latency_p50_ratio
        );
        println!(
            "prefetch's ceiling over the control: the control's coherence work is {:.2} ms a \
             frame, done on demand; off the critical path entirely it would give fps at most \
             x{:.3}, m2p p50 at least x{:.3}",
            c.control_coherence_ms, c.ceiling_fps_ratio, c.ceiling_latency_p50_ratio
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_are_interleaved_each_run_on_a_fresh_daemon() {
        let modes = compare_modes();
        assert_eq!(modes.len(), 6);
        let mut started = 0u32;
        let mut log: Vec<(u32, String, OrderingMode)> = Vec::new();
        let out = run_interleaved(
            &modes,
            3,
            || {
                started += 1;
                Ok(started)
            },
            |d, m| {
                log.push((*d, m.protocol.clone(), m.ordering));
                Ok(*d)
            },
        )
        .expect("runs");
        // 18 runs, 18 daemons, each used once.
        assert_eq!(started, 18);
        let daemons: std::collections::HashSet<u32> = log.iter().map(|l| l.0).collect();
        assert_eq!(daemons.len(), 18);
        // Round 1 is every mode in order, then round 2, then round 3.
        for (k, (_, p, o)) in log.iter().enumerate() {
            let m = &modes[k % 6];
            assert_eq!((p, *o), (&m.protocol, m.ordering), "run {k}");
        }
        // Per mode its rounds in order: mode 0 ran on daemons 1, 7, 13.
        assert_eq!(out[0], vec![1, 7, 13]);
        assert_eq!(out[5], vec![6, 12, 18]);
        assert_eq!(schedule(2, 2), vec![(0, 0), (0, 1), (1, 0), (1, 1)]);
    }

    #[test]
    fn a_ceiling_is_the_span_without_the_work_that_could_move() {
        assert_eq!(without(10.0, 2.5), 0.75);
        assert_eq!(without(10.0, 0.0), 1.0);
        assert_eq!(without(1.0, 3.0), 0.0, "never below nothing");
        assert_eq!(without(0.0, 1.0), 1.0, "no span, no gain");
    }

    #[test]
    fn ranges() {
        assert_eq!(range(&[3.0, 1.0, 2.0]), (1.0, 3.0));
    }
}
