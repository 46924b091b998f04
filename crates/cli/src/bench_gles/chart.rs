//! The chart of `virtsoc bench gles` (SVG): each scene's FPS through virtsoc and virgl in %
//! of native, and the three glmark2 scores, drawn with the grouped bars of `virtsoc report`
//! ([`crate::report::grouped_bars`]).

use std::path::Path;

use plotters::prelude::*;

use super::GlesReport;
use crate::report::{err, grouped_bars, register_font};
use crate::CliError;

/// A short label for a scene: its index and the scene's name without options.
fn label(i: usize, name: &str) -> String {
    let scene = name.split(':').next().unwrap_or(name);
    let short: String = scene.chars().take(9).collect();
    format!("{}.{short}", i + 1)
}

/// One panel drawn by `draw` on an SVG of `size`, as SVG text.
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

/// Writes the chart to `path`. [`grouped_bars`] presents its area, which ends an SVG
/// backend's document, so each panel is an SVG of its own, nested in the file's.
pub fn write(r: &GlesReport, path: &Path) -> Result<(), CliError> {
    register_font()?;
    let width = (160 + 70 * r.scenes.len()).clamp(800, 4000) as u32;
    let (top_h, bottom_h) = (560u32, 340u32);
    let groups: Vec<String> = r
        .scenes
        .iter()
        .enumerate()
        .map(|(i, s)| label(i, &s.name))
        .collect();
    let mut series = vec![
        (
            "virtsoc".to_string(),
            r.scenes.iter().map(|s| s.virtsoc_pct).collect(),
        ),
        (
            "virgl".to_string(),
            r.scenes.iter().map(|s| s.virgl_pct).collect(),
        ),
    ];
    let vm = r.paths.get("vm").is_some_and(|p| p.selected);
    if vm {
        series.push((
            "vm".to_string(),
            r.scenes.iter().map(|s| s.vm_pct).collect(),
        ));
    }
    let top = panel((width, top_h), |a| {
        grouped_bars(
            a,
            "glmark2-es2 --off-screen 800x600: FPS per scene, % of native (llvmpipe)",
            "% of native FPS",
            &groups,
            &series,
        )
    })?;
    let mut scores = vec![
        ("native".to_string(), vec![r.score_native]),
        ("virtsoc".to_string(), vec![r.score_virtsoc]),
        ("virgl".to_string(), vec![r.score_virgl]),
    ];
    if vm {
        scores.push(("vm".to_string(), vec![r.score_vm]));
    }
    let bottom = panel((width, bottom_h), |a| {
        grouped_bars(
            a,
            "glmark2 Score",
            "score",
            &["glmark2 Score".to_string()],
            &scores,
        )
    })?;
    let nest = |svg: &str, y: u32| svg.replacen("<svg ", &format!("<svg x=\"0\" y=\"{y}\" "), 1);
    let doc = format!(
        "<svg width=\"{width}\" height=\"{h}\" viewBox=\"0 0 {width} {h}\" \
         xmlns=\"http://www.w3.org/2000/svg\">\n{}\n{}\n</svg>\n",
        nest(&top, 0),
        nest(&bottom, top_h),
        h = top_h + bottom_h
    );
    std::fs::write(path, doc)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_short() {
        assert_eq!(label(0, "build:use-vbo=false"), "1.build");
        assert_eq!(label(11, "conditionals:fragment-steps=0"), "12.condition");
    }
}
