//! `bench sharing`'s tables.

use super::*;

/// Prints the report as tables.
pub fn print_table(r: &SharingReport) {
    println!("one guest alone:");
    for a in &r.alone {
        println!(
            "  {:<6} {:<12} {:<10} {:>8.1} commands/s",
            a.device, a.scheduler, a.size, a.commands_per_s
        );
    }
    for (device, rows) in [("gpu", &r.fairness), ("codec", &r.fairness_codec)] {
        if !rows.is_empty() {
            println!("fairness on the {device}:");
            print_fairness(rows);
        }
    }
    print_rest(r);
}

fn print_fairness(rows: &[FairnessRow]) {
    println!(
        "unfairness from the guests' completed work (p50, p95 over 1 s windows, from their \
         answers' times; p50 from whole units counted at the edges; over the whole run; p50 \
         among guests of one size, no weights; p50 with each size weighed by its cost together, not \
         alone; the meter's p50 beside it), overhead against \
         one guest alone queueing {}x deeper (whether it keeps the device busy: where the \
         cores went, below)",
        rows.first().map_or(backlog::DEEP, |f| f.alone_queue_factor)
    );
    println!(
        "{:<12} {:>6} {:>10} {:>8} {:>9} {:>8} {:>10} {:>9} {:>9} {:>10} {:>15} {:>10}  shares (meter)",
        "scheduler",
        "guests",
        "guest p50%",
        "p95%",
        "counted%",
        "run%",
        "one size%",
        "together%",
        "meter p50",
        "overhead%",
        "(p25..p75)",
        "vs rr %"
    );
    for f in rows {
        let shares: Vec<String> = f.shares.iter().map(|s| format!("{:.3}", s)).collect();
        println!(
            "{:<12} {:>6} {:>10.2} {:>8.2} {:>9.2} {:>8} {:>10} {:>9} {:>9.2} {:>10.1} {:>15} {:>10}  {}",
            f.scheduler,
            f.guests,
            f.unfairness_guest_median * 100.0,
            f.unfairness_guest_p95 * 100.0,
            f.unfairness_guest_counted_median * 100.0,
            f.unfairness_guest_run
                .map_or("-".into(), |u| format!("{:.2}", u * 100.0)),
            f.unfairness_same_size_median
                .map_or("-".into(), |u| format!("{:.2}", u * 100.0)),
            f.unfairness_together_weights_median
                .map_or("-".into(), |u| format!("{:.2}", u * 100.0)),
            f.unfairness_median * 100.0,
            f.overhead_pct,
            format!(
                "{:.1}..{:.1}",
                f.overhead_range_pct.0, f.overhead_range_pct.1
            ),
            f.overhead_vs_round_robin_pct
                .map_or("-".into(), |o| format!("{o:.1}")),
            shares.join(" ")
        );
    }
    println!("where the overhead goes (medians of the slice pairs; sizes in order):");
    println!(
        "{:<12} {:>6}  {:<20} {:>9}  {:<22} {:<22} {:>16}",
        "scheduler",
        "guests",
        "busy% alone",
        "together",
        "ms/command alone",
        "together",
        "per unit +% (p25..p75)"
    );
    let list = |v: &[f64], digits: usize| -> String {
        let s: Vec<String> = v.iter().map(|x| format!("{x:.digits$}")).collect();
        s.join(" ")
    };
    for f in rows {
        println!(
            "{:<12} {:>6}  {:<20} {:>9.1}  {:<22} {:<22} {:>16}",
            f.scheduler,
            f.guests,
            list(&f.busy_alone_pct, 1),
            f.busy_together_pct,
            list(&f.command_ms_alone, 2),
            list(&f.command_ms_together, 2),
            match (f.overhead_per_unit_pct, f.overhead_per_unit_range_pct) {
                (Some(p), Some((a, b))) => format!("{p:.1} ({a:.1}..{b:.1})"),
                _ => "-".into(),
            }
        );
    }
    println!(
        "where the cores went (% of one core, medians of the slice pairs): daemon / its \
         workers / guests / other / idle"
    );
    let split = |c: &CpuSplit| {
        format!(
            "{:.0}/{:.0}/{:.0}/{:.0}/{:.0}",
            c.daemon, c.workers, c.guests, c.other, c.idle
        )
    };
    for f in rows {
        let alone: Vec<String> = f.cpu_alone_pct.iter().map(split).collect();
        println!(
            "{:<12} {:>6}  alone {}  together {}",
            f.scheduler,
            f.guests,
            alone.join(", "),
            split(&f.cpu_together_pct)
        );
    }
}

/// Prints the rest of the report.
fn print_rest(r: &SharingReport) {
    if !r.multimedia.is_empty() {
        println!(
            "{:<12} {:>4} {:>5} {:>10} {:>8} {:>8} {:>12}",
            "scheduler", "hog", "hogs", "cpu weight", "% of DFR", "fps", "hog cmds/s"
        );
    }
    for m in &r.multimedia {
        let weight = match (m.cpu_weight, m.video_cpu_weight) {
            (false, _) => "-".to_string(),
            (true, Some(w)) => w.to_string(),
            (true, None) => "none".to_string(),
        };
        println!(
            "{:<12} {:>4} {:>5} {:>10} {:>8.1} {:>8.1} {:>12.1}",
            m.scheduler,
            m.hog_kind.name(),
            m.hogs,
            weight,
            m.dfr_pct,
            m.presented_fps,
            m.hog_commands_per_s
        );
    }
    if !r.together.is_empty() {
        println!(
            "{:<12} {:>6} {:>10}  shown fps (each while the foreground) / presented fps",
            "scheduler", "guests", "% alone"
        );
    }
    let list = |v: &[f64]| -> String {
        let s: Vec<String> = v.iter().map(|f| format!("{f:.1}")).collect();
        s.join(" ")
    };
    for t in &r.together {
        println!(
            "{:<12} {:>6} {:>10.1}  {} / {}",
            t.scheduler,
            t.guests,
            t.vs_alone_pct,
            list(&t.fps),
            list(&t.presented_fps)
        );
    }
}
