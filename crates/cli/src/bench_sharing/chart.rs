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

/// Groups (guest counts) and one series per scheduler of `rows`: median unfairness in %.
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
                        .map(|r| r.unfairness_median * 100.0)
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
    let mut panels = vec![("Unfairness on the GPU (median per 1 s window)", &r.fairness)];
    if !r.fairness_codec.is_empty() {
        panels.push((
            "Unfairness on the codec (median per 1 s window)",
            &r.fairness_codec,
        ));
    }
    let rows = panels.len() + usize::from(!r.multimedia.is_empty());
    let area = SVGBackend::new(path, (1000, 420 * rows.max(1) as u32)).into_drawing_area();
    let parts = area.split_evenly((rows.max(1), 1));
    for (part, (title, rows)) in parts.iter().zip(&panels) {
        let (groups, series) = fairness_series(rows);
        grouped_bars(part, title, "unfairness %", &groups, &series)?;
    }
    if let Some(part) = parts.get(panels.len()) {
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
        )?;
    }
    area.present().map_err(err)?;
    Ok(())
}
