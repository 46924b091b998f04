//! The chart of `virtsoc bench services --chart F.svg`: per channel count, each kind's
//! bandwidth (top) and round trip p50 (bottom), drawn with the grouped bars of
//! `virtsoc report` ([`crate::report::grouped_bars`]), two SVG panels nested in one file.

use std::path::Path;

use plotters::prelude::*;

use super::{Report, Row};
use crate::report::{err, grouped_bars, register_font};
use crate::CliError;

/// A row's kind as the legend names it.
fn kind(r: &Row) -> String {
    let k = match &r.payload {
        Some(p) => format!("{} ({p})", r.channel),
        None => r.channel.clone(),
    };
    match r.guest.as_str() {
        "process" => k,
        g => format!("{k}, {g} guest"),
    }
}

/// One bar series: its legend and a value per group.
type Series = (String, Vec<Option<f64>>);

/// The channel counts (the groups) and one series per kind, in the order the kinds first
/// appear, of `value` over the channel counts.
fn series(r: &Report, value: impl Fn(&Row) -> f64) -> (Vec<String>, Vec<Series>) {
    let mut kinds: Vec<String> = Vec::new();
    let mut counts: Vec<u32> = Vec::new();
    for row in &r.rows {
        if !kinds.contains(&kind(row)) {
            kinds.push(kind(row));
        }
        if !counts.contains(&row.channels) {
            counts.push(row.channels);
        }
    }
    let groups = counts
        .iter()
        .map(|n| format!("{n} channel{}", if *n == 1 { "" } else { "s" }))
        .collect();
    let series = kinds
        .into_iter()
        .map(|k| {
            let v = counts
                .iter()
                .map(|n| {
                    r.rows
                        .iter()
                        .find(|row| kind(row) == k && row.channels == *n)
                        .map(&value)
                })
                .collect();
            (k, v)
        })
        .collect();
    (groups, series)
}

fn panel(
    size: (u32, u32),
    draw: impl FnOnce(&DrawingArea<SVGBackend, plotters::coord::Shift>) -> Result<(), CliError>,
) -> Result<String, CliError> {
    let mut svg = String::new();
    {
        let area = SVGBackend::with_string(&mut svg, size).into_drawing_area();
        draw(&area)?;
        area.present().map_err(err)?;
    }
    Ok(svg)
}

/// Writes the chart of `r` to `path`.
pub fn write(r: &Report, path: &Path) -> Result<(), CliError> {
    register_font()?;
    let (width, h) = (1100u32, 440u32);
    let (groups, bw) = series(r, |row| row.bandwidth_gbps);
    let (_, rtt) = series(r, |row| row.rtt_us.p50);
    let mib = r.bulk_bytes as f64 / f64::from(1 << 20);
    let top = panel((width, h), |a| {
        grouped_bars(
            a,
            &format!(
                "bench services: bandwidth, {mib:.0} MiB transfers (load {})",
                r.load.split_whitespace().next().unwrap_or("?")
            ),
            "GB/s",
            &groups,
            &bw,
        )
    })?;
    let bottom = panel((width, h), |a| {
        grouped_bars(a, "round trip p50 (64 bytes)", "us", &groups, &rtt)
    })?;
    let nest = |svg: &str, y: u32| svg.replacen("<svg ", &format!("<svg x=\"0\" y=\"{y}\" "), 1);
    let doc = format!(
        "<svg width=\"{width}\" height=\"{}\" viewBox=\"0 0 {width} {}\" \
         xmlns=\"http://www.w3.org/2000/svg\">\n{}\n{}\n</svg>\n",
        2 * h,
        2 * h,
        nest(&top, 0),
        nest(&bottom, h)
    );
    std::fs::write(path, doc)?;
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::stats::P50P99;

    pub(crate) fn row(channel: &str, payload: Option<&str>, n: u32, gbps: f64) -> Row {
        Row {
            channel: channel.into(),
            payload: payload.map(str::to_string),
            guest: "process".into(),
            channels: n,
            bandwidth_gbps: gbps,
            rtt_us: P50P99 { p50: 2.0, p99: 3.0 },
            rounds_gbps: Vec::new(),
        }
    }

    #[test]
    fn kinds_become_series_over_channel_counts() {
        let r = Report {
            bulk_bytes: 1 << 20,
            round_trips: 1,
            reps: 1,
            rounds: 1,
            load: "0.5 0.4 0.3".into(),
            rows: vec![
                row("service", Some("region"), 1, 9.0),
                row("tcp-loopback", None, 1, 4.0),
                row("service", Some("region"), 2, 17.0),
            ],
        };
        let (groups, s) = series(&r, |x| x.bandwidth_gbps);
        assert_eq!(groups, ["1 channel", "2 channels"]);
        assert_eq!(
            s[0],
            ("service (region)".into(), vec![Some(9.0), Some(17.0)])
        );
        assert_eq!(s[1], ("tcp-loopback".into(), vec![Some(4.0), None]));
        let svg = std::env::temp_dir().join(format!("svc-chart-{}.svg", std::process::id()));
        write(&r, &svg).unwrap();
        let text = std::fs::read_to_string(&svg).unwrap();
        assert!(text.contains("tcp-loopback") && text.contains("GB/s"));
        std::fs::remove_file(&svg).ok();
    }
}
