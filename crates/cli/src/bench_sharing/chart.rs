//! The chart of `virtsoc bench sharing` (SVG): unfairness per scheduler and guest count, and
//! the multimedia guest's share of its desired frame rate against the number of hogs, drawn
//! with the grouped bars of `virtsoc report` ([`crate::report::grouped_bars`]).

use std::path::Path;

use plotters::prelude::*;

use super::{FairnessRow, SharingReport};
use crate::report::{err, grouped_bars, register_font};
use crate::CliError;

/// Named series of a grouped bar chart: each series' value in each group.
type Series = Vec<(String, Vec<Option<f64>>)>;

/// Groups (guest counts) and one series per scheduler of `rows`: median unfairness in %, from
/// the guests' own counts of their completed work.
fn fairness_series(rows: &[FairnessRow]) -> (Vec<String>, Series) {
    let mut counts: Vec<usize> = rows.iter().map(|r| r.guests).collect();
    counts.sort_unstable();
    counts.dedup();
    let mut names: Vec<&str> = Vec::new();
    for r in rows {
        if !names.contains(&r.scheduler.as_str()) {
            names.push(&r.scheduler);
        }
    }
    let series = names
        .iter()
        .map(|name| {
            let v = counts
                .iter()
                .map(|n| {
                    rows.iter()
                        .find(|r| r.scheduler == *name && r.guests == *n)
                        .map(|r| r.unfairness_guest_median * 100.0)
                })
                .collect();
            (name.to_string(), v)
        })
        .collect();
    let groups = counts.iter().map(|n| format!("{n} guests")).collect();
    (groups, series)
}

/// Writes the chart to `path`: GPU fairness, codec fairness (if measured), multimedia.
pub fn write(r: &SharingReport, path: &Path) -> Result<(), CliError> {
    register_font()?;
    let area = SVGBackend::new(path, size(r)).into_drawing_area();
    draw(r, &area)?;
    area.present().map_err(err)?;
    Ok(())
}

/// The chart's size: 420 pixels of height per panel.
fn size(r: &SharingReport) -> (u32, u32) {
    (1000, 420 * panels(r).max(1) as u32)
}

/// How many panels the chart has.
fn panels(r: &SharingReport) -> usize {
    1 + usize::from(!r.fairness_codec.is_empty()) + usize::from(!r.multimedia.is_empty())
}

/// Draws every panel of the chart on `area` (split evenly, one panel a row); the caller
/// presents it.
fn draw<DB: DrawingBackend>(
    r: &SharingReport,
    area: &DrawingArea<DB, plotters::coord::Shift>,
) -> Result<(), CliError>
where
    DB::ErrorType: 'static,
{
    let mut panels = vec![(
        "Unfairness on the GPU from the guests' completed work (median per 1 s window)",
        &r.fairness,
    )];
    if !r.fairness_codec.is_empty() {
        panels.push((
            "Unfairness on the codec from the guests' completed work (median per 1 s window)",
            &r.fairness_codec,
        ));
    }
    let parts = area.split_evenly((self::panels(r).max(1), 1));
    for (part, (title, rows)) in parts.iter().zip(&panels) {
        let (groups, series) = fairness_series(rows);
        grouped_bars(part, title, "unfairness %", &groups, &series)?;
    }
    if let Some(part) = parts.get(panels.len()) {
        multimedia(r, part)?;
    }
    Ok(())
}

/// The multimedia panel: the video guest's presented rate per hog count.
fn multimedia<DB: DrawingBackend>(
    r: &SharingReport,
    part: &DrawingArea<DB, plotters::coord::Shift>,
) -> Result<(), CliError>
where
    DB::ErrorType: 'static,
{
    let mut hogs: Vec<usize> = r.multimedia.iter().map(|m| m.hogs).collect();
    hogs.sort_unstable();
    hogs.dedup();
    let label = |m: &super::MultimediaRow| {
        format!(
            "{} vs {} hogs{}",
            m.scheduler,
            m.hog_kind.name(),
            if m.cpu_weight { " + cpu weight" } else { "" }
        )
    };
    let mut names: Vec<String> = Vec::new();
    for m in &r.multimedia {
        if !names.contains(&label(m)) {
            names.push(label(m));
        }
    }
    let series: Series = names
        .into_iter()
        .map(|name| {
            let v = hogs
                .iter()
                .map(|h| {
                    r.multimedia
                        .iter()
                        .find(|m| label(m) == name && m.hogs == *h)
                        .map(|m| m.dfr_pct)
                })
                .collect();
            (name, v)
        })
        .collect();
    let groups: Vec<String> = hogs.iter().map(|h| format!("{h} hogs")).collect();
    grouped_bars(
        part,
        "Video guest: presented rate, % of its 30 fps DFR",
        "% of DFR",
        &groups,
        &series,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench_sharing::{HogKind, MultimediaRow};

    fn row(scheduler: &str, guests: usize, device: &str) -> FairnessRow {
        FairnessRow {
            scheduler: scheduler.into(),
            guests,
            unfairness_median: 0.01,
            unfairness_p95: 0.02,
            unfairness_guest_median: 0.015,
            unfairness_guest_p95: 0.03,
            unfairness_guest_counted_median: 0.02,
            unfairness_same_size_median: Some(0.01),
            unfairness_together_weights_median: Some(0.01),
            unfairness_same_size_run: None,
            unfairness_target_met: true,
            guest_units: vec![1; guests],
            guest_bytes: vec![1; guests],
            window_units: vec![],
            window_work: vec![],
            alone_queue_factor: 2,
            overhead_pct: 1.0,
            overhead_range_pct: (0.0, 2.0),
            overhead_pairs: 4,
            overhead_per_unit_pct: None,
            overhead_per_unit_range_pct: None,
            overhead_vs_round_robin_pct: None,
            overhead_vs_round_robin_range_pct: None,
            throughput: 1.0,
            busy_alone_pct: vec![],
            busy_together_pct: 100.0,
            cpu_alone_pct: vec![],
            cpu_together_pct: Default::default(),
            command_ms_alone: vec![],
            alone_rate_spread_pct: vec![],
            pair_rates: vec![],
            pair_command_ms_alone: vec![],
            unfairness_guest_run: None,
            command_ms_together: vec![],
            shares: vec![],
            windows: 1,
            window_ms: vec![],
            device: device.into(),
            rotation: 8,
        }
    }

    #[test]
    fn every_panel_is_in_the_svg() {
        let r = SharingReport {
            alone: vec![],
            fairness: vec![row("wfq", 2, "gpu"), row("round-robin", 2, "gpu")],
            fairness_codec: vec![row("wfq", 2, "codec")],
            multimedia: vec![MultimediaRow {
                scheduler: "feedback".into(),
                hogs: 1,
                hog_kind: HogKind::Gpu,
                cpu_weight: false,
                video_cpu_weight: None,
                dfr_pct: 99.0,
                presented_fps: 29.7,
                hog_commands_per_s: 10.0,
            }],
            together: vec![],
        };
        // Written as `bench sharing --chart` writes it: an SVG backend on a file writes the
        // file at its first `present`, so a panel that presented its part lost the rest.
        let path = std::env::temp_dir().join(format!("virtsoc-chart-{}.svg", std::process::id()));
        write(&r, &path).expect("chart written");
        let svg = std::fs::read_to_string(&path).expect("chart read");
        let _ = std::fs::remove_file(&path);
        for title in [
            "Unfairness on the GPU",
            "Unfairness on the codec",
            "Video guest",
        ] {
            assert!(svg.contains(title), "{title} missing from the SVG");
        }
        assert!(svg.trim_end().ends_with("</svg>"), "the document is closed");
        assert_eq!(svg.matches("<svg").count(), 1, "one document");
    }
}
