//! The report of `virtsoc bench gles`: each path's runs, the per-scene rows (medians over
//! rounds, % of native, the virtsoc path's per-frame costs) and the paths' summaries, folded
//! from the runs by [`report`].

use std::collections::BTreeMap;

use serde::Serialize;

use super::glmark::GLMARK2;
use super::{counters, BenchGlesArgs, GlPath};

/// One glmark2 run of one path.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PathRun {
    /// FPS per scene, in glmark2's order (None: the scene printed no FPS).
    pub scenes: Vec<(String, Option<f64>)>,
    /// glmark2's score.
    pub score: Option<f64>,
    /// GL_RENDERER from glmark2's header.
    pub renderer: Option<String>,
    /// CPU seconds of the program.
    pub program_cpu_s: Option<f64>,
    /// CPU seconds of its server (daemon and render workers, or virgl server), if any.
    pub server_cpu_s: Option<f64>,
    /// Wall seconds of the run.
    pub wall_s: f64,
    /// Why the run failed, if it did.
    pub error: Option<String>,
    /// The virtsoc guest's counters per scene (virtsoc path).
    #[serde(skip)]
    pub counters: BTreeMap<String, counters::SceneCost>,
}

/// A scene's row of the report: medians over rounds, and the rounds' values.
#[derive(Debug, Clone, Serialize)]
pub struct SceneRow {
    /// `scene` or `scene:options` as glmark2 printed them.
    pub name: String,
    /// Median FPS natively.
    pub native_fps: Option<f64>,
    /// Median FPS through virtsoc.
    pub virtsoc_fps: Option<f64>,
    /// Median FPS through virgl.
    pub virgl_fps: Option<f64>,
    /// virtsoc's FPS in % of native.
    pub virtsoc_pct: Option<f64>,
    /// virgl's FPS in % of native.
    pub virgl_pct: Option<f64>,
    /// Median FPS inside the VM guest (vm path).
    pub vm_fps: Option<f64>,
    /// The VM guest's FPS in % of native.
    pub vm_pct: Option<f64>,
    /// Round trips per frame on the virtsoc path: the `gles` device's `round_trips` (batches
    /// the guest waited on), else (an older daemon) the `gles` device commands.
    pub round_trips_per_frame: Option<f64>,
    /// Which counter `round_trips_per_frame` came from (`round_trips` or `gles commands`).
    pub round_trips_source: Option<String>,
    /// Stream bytes per frame on the virtsoc path (the daemon's `gles` counters, else the
    /// bytes SVM copied into the `gles` domain).
    pub bytes_per_frame: Option<f64>,
    /// Which counter `bytes_per_frame` came from.
    pub bytes_source: Option<String>,
    /// Copies of frame bytes per frame on the virtsoc path (the `gles` device's
    /// `frame_copies`; against an older daemon, SVM copies per frame).
    pub copies_per_frame: Option<f64>,
    /// Which counter `copies_per_frame` came from (`frame copies` or `SVM copies`).
    pub copies_source: Option<String>,
    /// Frames counted by the daemon (or FPS x duration) per round, virtsoc path.
    pub frames_source: Option<String>,
    /// Native FPS of each round.
    pub native_fps_rounds: Vec<Option<f64>>,
    /// virtsoc FPS of each round.
    pub virtsoc_fps_rounds: Vec<Option<f64>>,
    /// virgl FPS of each round.
    pub virgl_fps_rounds: Vec<Option<f64>>,
    /// The VM guest's FPS of each round.
    pub vm_fps_rounds: Vec<Option<f64>>,
}

/// A path's summary over the rounds.
#[derive(Debug, Clone, Serialize)]
pub struct PathSummary {
    /// Whether the path was asked for.
    pub selected: bool,
    /// Median score.
    pub score: Option<f64>,
    /// Score in % of native.
    pub score_pct: Option<f64>,
    /// Median CPU seconds of the program per run.
    pub program_cpu_s: Option<f64>,
    /// Median CPU seconds of the server per run (None: no server, or not ours).
    pub server_cpu_s: Option<f64>,
    /// GL_RENDERER the program saw.
    pub renderer: Option<String>,
    /// Each round's run.
    pub rounds: Vec<PathRun>,
    /// Why the path did not run at all, if so.
    pub not_run: Option<String>,
}

/// The report of `virtsoc bench gles`.
#[derive(Debug, Clone, Serialize)]
pub struct GlesReport {
    /// Median glmark2 score natively.
    pub score_native: Option<f64>,
    /// Median glmark2 score through virtsoc.
    pub score_virtsoc: Option<f64>,
    /// Median glmark2 score through virgl.
    pub score_virgl: Option<f64>,
    /// Median glmark2 score inside the VM guest (vm path).
    pub score_vm: Option<f64>,
    /// Per scene, in glmark2's order.
    pub scenes: Vec<SceneRow>,
    /// Per path: scores, CPU, renderer, each round.
    pub paths: BTreeMap<&'static str, PathSummary>,
    /// Rounds run.
    pub rounds: usize,
    /// Seconds per scene.
    pub duration_s: f64,
    /// The glmark2 command line (before the path's environment).
    pub command: String,
}

/// Median of the values present (None when none is).
pub fn median(v: impl IntoIterator<Item = Option<f64>>) -> Option<f64> {
    let mut xs: Vec<f64> = v.into_iter().flatten().filter(|x| x.is_finite()).collect();
    if xs.is_empty() {
        return None;
    }
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    Some(if n % 2 == 1 {
        xs[n / 2]
    } else {
        (xs[n / 2 - 1] + xs[n / 2]) / 2.0
    })
}

/// `a` in % of `b`.
pub(super) fn pct(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b * 100.0),
        _ => None,
    }
}

/// Folds the runs into the report: scene rows in first-seen order, medians, percentages.
pub(super) fn report(
    a: &BenchGlesArgs,
    args: &[String],
    runs: BTreeMap<GlPath, Vec<PathRun>>,
    not_run: BTreeMap<GlPath, String>,
) -> GlesReport {
    let empty = Vec::new();
    let of = |p: GlPath| runs.get(&p).unwrap_or(&empty);
    let mut names: Vec<String> = Vec::new();
    for p in GlPath::ALL {
        for r in of(p) {
            for (n, _) in &r.scenes {
                if !names.contains(n) {
                    names.push(n.clone());
                }
            }
        }
    }
    let fps_rounds = |p: GlPath, name: &str| -> Vec<Option<f64>> {
        of(p)
            .iter()
            .map(|r| r.scenes.iter().find(|(n, _)| n == name).and_then(|s| s.1))
            .collect()
    };
    let scenes = names
        .iter()
        .map(|name| {
            let native = fps_rounds(GlPath::Native, name);
            let virtsoc = fps_rounds(GlPath::Virtsoc, name);
            let virgl = fps_rounds(GlPath::Virgl, name);
            let in_vm = fps_rounds(GlPath::Vm, name);
            let (nm, vm, gm, qm) = (
                median(native.iter().copied()),
                median(virtsoc.iter().copied()),
                median(virgl.iter().copied()),
                median(in_vm.iter().copied()),
            );
            let per_frame = counters::per_frame(
                of(GlPath::Virtsoc)
                    .iter()
                    .map(|r| (r.counters.get(name), r.scenes.iter().find(|s| &s.0 == name))),
                a.duration,
            );
            SceneRow {
                name: name.clone(),
                native_fps: nm,
                virtsoc_fps: vm,
                virgl_fps: gm,
                virtsoc_pct: pct(vm, nm),
                virgl_pct: pct(gm, nm),
                vm_fps: qm,
                vm_pct: pct(qm, nm),
                round_trips_per_frame: per_frame.round_trips,
                round_trips_source: per_frame.round_trips_source,
                bytes_per_frame: per_frame.bytes,
                bytes_source: per_frame.bytes_source,
                copies_per_frame: per_frame.copies,
                copies_source: per_frame.copies_source,
                frames_source: per_frame.frames_source,
                native_fps_rounds: native,
                virtsoc_fps_rounds: virtsoc,
                virgl_fps_rounds: virgl,
                vm_fps_rounds: in_vm,
            }
        })
        .collect();
    let score = |p: GlPath| median(of(p).iter().map(|r| r.score));
    let mut paths = BTreeMap::new();
    for p in GlPath::ALL {
        let rs = of(p);
        paths.insert(
            p.name(),
            PathSummary {
                selected: a.paths.contains(&p),
                score: score(p),
                score_pct: pct(score(p), score(GlPath::Native)),
                program_cpu_s: median(rs.iter().map(|r| r.program_cpu_s)),
                server_cpu_s: median(rs.iter().map(|r| r.server_cpu_s)),
                renderer: rs.iter().find_map(|r| r.renderer.clone()),
                rounds: rs.clone(),
                not_run: not_run.get(&p).cloned(),
            },
        );
    }
    GlesReport {
        score_native: score(GlPath::Native),
        score_virtsoc: score(GlPath::Virtsoc),
        score_virgl: score(GlPath::Virgl),
        score_vm: score(GlPath::Vm),
        scenes,
        paths,
        rounds: a.rounds,
        duration_s: a.duration,
        command: format!("{GLMARK2} {}", args.join(" ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_skip_missing_values() {
        assert_eq!(median([Some(3.0), None, Some(1.0), Some(2.0)]), Some(2.0));
        assert_eq!(median([Some(1.0), Some(4.0)]), Some(2.5));
        assert_eq!(median([None, None]), None);
        assert_eq!(pct(Some(50.0), Some(200.0)), Some(25.0));
        assert_eq!(pct(Some(50.0), None), None);
    }

    #[test]
    fn the_report_lines_up_scenes_and_paths() {
        let a = BenchGlesArgs {
            socket: None,
            json: true,
            chart: None,
            rounds: 2,
            scenes: vec![],
            duration: 1.0,
            paths: GlPath::ALL.to_vec(),
            vm_image: None,
            vm_accel: "tcg".into(),
        };
        let run = |fps: &[(&str, Option<f64>)], score: Option<f64>| PathRun {
            scenes: fps.iter().map(|(n, f)| (n.to_string(), *f)).collect(),
            score,
            ..PathRun::default()
        };
        let mut runs = BTreeMap::new();
        runs.insert(
            GlPath::Native,
            vec![
                run(
                    &[("build", Some(100.0)), ("texture", Some(200.0))],
                    Some(150.0),
                ),
                run(
                    &[("build", Some(120.0)), ("texture", Some(220.0))],
                    Some(170.0),
                ),
            ],
        );
        runs.insert(
            GlPath::Virtsoc,
            vec![
                run(&[("build", Some(55.0))], None),
                run(&[("build", Some(45.0)), ("texture", None)], Some(80.0)),
            ],
        );
        runs.insert(
            GlPath::Vm,
            vec![
                run(&[("build", Some(22.0))], Some(20.0)),
                run(&[("build", Some(33.0))], Some(40.0)),
            ],
        );
        let mut not_run = BTreeMap::new();
        not_run.insert(GlPath::Virgl, "no server".to_string());
        let r = report(&a, &[], runs, not_run);
        assert_eq!(r.score_vm, Some(30.0));
        assert_eq!(r.scenes[0].vm_fps, Some(27.5));
        assert_eq!(r.scenes[0].vm_pct, Some(25.0));
        assert_eq!(r.scenes[1].vm_fps_rounds, vec![None, None]);
        assert_eq!(r.score_native, Some(160.0));
        assert_eq!(r.score_virtsoc, Some(80.0));
        assert_eq!(r.score_virgl, None);
        assert_eq!(r.scenes.len(), 2);
        assert_eq!(r.scenes[0].native_fps, Some(110.0));
        assert_eq!(r.scenes[0].virtsoc_fps, Some(50.0));
        assert_eq!(r.scenes[1].virtsoc_fps, None);
        assert_eq!(r.scenes[1].virtsoc_fps_rounds, vec![None, None]);
        assert_eq!(r.paths["virtsoc"].score_pct, Some(50.0));
        assert_eq!(r.paths["virgl"].not_run.as_deref(), Some("no server"));
        let v = serde_json::to_value(&r).expect("json");
        for k in ["score_native", "score_virtsoc", "score_virgl", "scenes"] {
            assert!(v.get(k).is_some(), "{k}");
        }
        for k in [
            "name",
            "native_fps",
            "virtsoc_fps",
            "virgl_fps",
            "round_trips_per_frame",
            "copies_per_frame",
        ] {
            assert!(v["scenes"][0].get(k).is_some(), "{k}");
        }
        assert!(v["score_virgl"].is_null());
    }
}
