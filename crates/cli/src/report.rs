//! `virtsoc report RESULTS.json --out DIR`: charts of scenario results (PNG and SVG) with
//! plotters: presented frame rate and motion-to-photon latency per scenario and
//! protocol/ordering, and the CDF of SVM access latency with prefetch on and off (vSoC
//! Figure 16).

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::scenario::ScenarioResult;
use crate::CliError;

const FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";

pub(crate) fn register_font() -> Result<(), CliError> {
    let bytes = std::fs::read(FONT)
        .map_err(|e| CliError::Usage(format!("cannot read {FONT} (fonts-dejavu-core): {e}")))?;
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
        .map_err(|_| CliError::Usage("cannot load the chart font".into()))
}

pub(crate) fn err<E: std::fmt::Display>(e: E) -> CliError {
    CliError::Usage(format!("chart: {e}"))
}

/// Reads results written by `virtsoc run --json` (one array, or several concatenated).
pub fn load(path: &Path) -> Result<Vec<ScenarioResult>, CliError> {
    let text = std::fs::read_to_string(path)?;
    let mut out = Vec::new();
    for v in serde_json::Deserializer::from_str(&text).into_iter::<serde_json::Value>() {
        let v = v?;
        let items = match v {
            serde_json::Value::Array(a) => a,
            other => vec![other],
        };
        for it in items {
            out.push(serde_json::from_value(it)?);
        }
    }
    if out.is_empty() {
        return Err(CliError::Usage(format!(
            "{} holds no results",
            path.display()
        )));
    }
    Ok(out)
}

fn label(r: &ScenarioResult) -> String {
    format!("{}/{}", r.protocol, r.ordering)
}

/// A grouped bar chart of scenario results: one group per scenario, one bar per
/// protocol/ordering.
fn bars<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    rs: &[ScenarioResult],
    title: &str,
    y_label: &str,
    value: impl Fn(&ScenarioResult) -> f64,
) -> Result<(), CliError>
where
    DB::ErrorType: 'static,
{
    let mut scenarios: Vec<String> = rs.iter().map(|r| r.scenario.clone()).collect();
    scenarios.dedup();
    let mut combos: Vec<String> = rs.iter().map(label).collect();
    combos.sort();
    combos.dedup();
    let series: Vec<(String, Vec<Option<f64>>)> = combos
        .into_iter()
        .map(|combo| {
            let values = scenarios
                .iter()
                .map(|sc| {
                    rs.iter()
                        .find(|r| &r.scenario == sc && label(r) == combo)
                        .map(&value)
                })
                .collect();
            (combo, values)
        })
        .collect();
    grouped_bars(area, title, y_label, &scenarios, &series)
}

/// A grouped bar chart: one group per entry of `groups`, one bar per series (its name and
/// its value in each group, `None` for no bar), with a legend. It does not present `area`:
/// the caller presents the whole drawing once every panel is drawn (an SVG backend's
/// `present` ends its document, so a panel that presented its own part of a split area
/// left only the first panel in the file).
pub(crate) fn grouped_bars<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    title: &str,
    y_label: &str,
    groups: &[String],
    series: &[(String, Vec<Option<f64>>)],
) -> Result<(), CliError>
where
    DB::ErrorType: 'static,
{
    area.fill(&WHITE).map_err(err)?;
    let n = series.len().max(1) as f64;
    let ymax = series
        .iter()
        .flat_map(|(_, v)| v.iter().flatten().copied())
        .fold(0.0f64, f64::max)
        .max(1e-9)
        * 1.15;
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(-0.5f64..groups.len() as f64 - 0.5, 0f64..ymax)
        .map_err(err)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(groups.len() + 1)
        .x_label_formatter(&|x| {
            if (x - x.round()).abs() > 1e-6 || *x < 0.0 {
                return String::new();
            }
            groups.get(x.round() as usize).cloned().unwrap_or_default()
        })
        .y_desc(y_label)
        .draw()
        .map_err(err)?;
    for (ci, (name, values)) in series.iter().enumerate() {
        let color = Palette99::pick(ci).to_rgba();
        let rects: Vec<_> = values
            .iter()
            .enumerate()
            .filter_map(|(gi, v)| {
                let x0 = gi as f64 - 0.4 + 0.8 * ci as f64 / n;
                let x1 = x0 + 0.8 / n;
                Some(Rectangle::new([(x0, 0.0), (x1, (*v)?)], color.filled()))
            })
            .collect();
        chart
            .draw_series(rects)
            .map_err(err)?
            .label(name.clone())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], color.filled()));
    }
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .draw()
        .map_err(err)?;
    Ok(())
}

/// CDF of the access latency per protocol/ordering (pooled over scenarios).
fn cdf<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    rs: &[ScenarioResult],
) -> Result<(), CliError>
where
    DB::ErrorType: 'static,
{
    area.fill(&WHITE).map_err(err)?;
    let mut combos: Vec<String> = rs.iter().map(label).collect();
    combos.sort();
    combos.dedup();
    let xmax = rs
        .iter()
        .flat_map(|r| r.access_latency_cdf_us.iter().copied())
        .fold(1.0f64, f64::max);
    let mut chart = ChartBuilder::on(area)
        .caption("SVM access latency (CDF)", ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d((1f64..xmax * 1.2).log_scale(), 0f64..1f64)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("begin_access latency (us, log)")
        .y_desc("fraction")
        .draw()
        .map_err(err)?;
    for (ci, combo) in combos.iter().enumerate() {
        let mut v: Vec<f64> = rs
            .iter()
            .filter(|r| &label(r) == combo)
            .flat_map(|r| r.access_latency_cdf_us.iter().copied())
            .collect();
        v.sort_by(|a, b| a.total_cmp(b));
        if v.is_empty() {
            continue;
        }
        let n = v.len() as f64;
        let color = Palette99::pick(ci).to_rgba();
        chart
            .draw_series(LineSeries::new(
                v.iter()
                    .enumerate()
                    .map(|(i, x)| (x.max(1.0), (i + 1) as f64 / n)),
                color.stroke_width(2),
            ))
            .map_err(err)?
            .label(combo.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 15, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .draw()
        .map_err(err)?;
    Ok(())
}

/// Writes every chart into `out` as PNG and SVG; returns the files written.
pub fn write(rs: &[ScenarioResult], out: &Path) -> Result<Vec<std::path::PathBuf>, CliError> {
    register_font()?;
    std::fs::create_dir_all(out)?;
    let mut files = Vec::new();
    let size = (1000, 560);
    for (name, kind) in [("fps", 0), ("latency", 1), ("access-cdf", 2)] {
        let png = out.join(format!("{name}.png"));
        let svg = out.join(format!("{name}.svg"));
        {
            let a = BitMapBackend::new(&png, size).into_drawing_area();
            draw(kind, &a, rs)?;
            a.present().map_err(err)?;
        }
        {
            let a = SVGBackend::new(&svg, size).into_drawing_area();
            draw(kind, &a, rs)?;
            a.present().map_err(err)?;
        }
        files.push(png);
        files.push(svg);
    }
    Ok(files)
}

fn draw<DB: DrawingBackend>(
    kind: u8,
    a: &DrawingArea<DB, Shift>,
    rs: &[ScenarioResult],
) -> Result<(), CliError>
where
    DB::ErrorType: 'static,
{
    match kind {
        0 => bars(a, rs, "Presented frame rate", "frames per second", |r| {
            r.presented_fps
        }),
        1 => bars(a, rs, "Motion-to-photon latency (p50)", "ms", |r| {
            r.latency_ms.p50
        }),
        _ => cdf(a, rs),
    }
}
