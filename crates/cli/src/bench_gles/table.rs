//! `bench gles`'s table: FPS per scene and path, scores, CPU, the virtsoc path's costs.

use super::{GlPath, GlesReport};

/// `v` with `digits` decimals, or `-`.
fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or("-".into(), |x| format!("{x:.digits$}"))
}

/// `name` cut to `width` characters (the end replaced by `~`).
fn cut(name: &str, width: usize) -> String {
    if name.chars().count() <= width {
        name.to_string()
    } else {
        let mut s: String = name.chars().take(width.saturating_sub(1)).collect();
        s.push('~');
        s
    }
}

/// Prints the report.
pub fn print(r: &GlesReport) {
    println!(
        "{} ({} s a scene, {} round{}; medians)",
        r.command,
        r.duration_s,
        r.rounds,
        if r.rounds == 1 { "" } else { "s" }
    );
    for p in GlPath::ALL {
        let s = &r.paths[p.name()];
        if !s.selected {
            continue;
        }
        let state = match (&s.not_run, &s.renderer) {
            (Some(why), _) => format!("not run: {why}"),
            (None, Some(renderer)) => format!("GL_RENDERER {renderer}"),
            (None, None) => "no GL_RENDERER seen".into(),
        };
        println!("  {:<8} {state}", p.name());
        for (i, run) in s.rounds.iter().enumerate() {
            if let Some(e) = &run.error {
                println!("  {:<8} round {}: {e}", "", i + 1);
            }
        }
    }
    println!();
    println!(
        "{:<44} {:>8} {:>8} {:>8} {:>9} {:>9} {:>9} {:>9} {:>8} {:>10}",
        "scene",
        "native",
        "virtsoc",
        "virgl",
        "virtsoc%",
        "range%",
        "virgl%",
        "rt/frame",
        "B/frame",
        "copies/fr"
    );
    for s in &r.scenes {
        println!(
            "{:<44} {:>8} {:>8} {:>8} {:>9} {:>9} {:>9} {:>9} {:>8} {:>10}",
            cut(&s.name, 44),
            opt(s.native_fps, 0),
            opt(s.virtsoc_fps, 0),
            opt(s.virgl_fps, 0),
            opt(s.virtsoc_pct, 1),
            spread(&s.native_fps_rounds, &s.virtsoc_fps_rounds),
            opt(s.virgl_pct, 1),
            opt(s.round_trips_per_frame, 1),
            opt(s.bytes_per_frame, 0),
            opt(s.copies_per_frame, 2),
        );
    }
    let n = &r.paths["native"];
    let v = &r.paths["virtsoc"];
    let g = &r.paths["virgl"];
    println!(
        "{:<44} {:>8} {:>8} {:>8} {:>9} {:>9}",
        "glmark2 Score",
        opt(n.score, 0),
        opt(v.score, 0),
        opt(g.score, 0),
        opt(v.score_pct, 1),
        opt(g.score_pct, 1),
    );
    println!(
        "{:<44} {:>8} {:>8} {:>8}",
        "CPU s of the program",
        opt(n.program_cpu_s, 2),
        opt(v.program_cpu_s, 2),
        opt(g.program_cpu_s, 2),
    );
    println!(
        "{:<44} {:>8} {:>8} {:>8}",
        "CPU s of its server (daemon + worker, virgl)",
        opt(n.server_cpu_s, 2),
        opt(v.server_cpu_s, 2),
        opt(g.server_cpu_s, 2),
    );
    if r.rounds > 1 {
        println!(
            "range%: the lowest and highest of the rounds' virtsoc FPS as % of the same round's \
             native (the paths take turns round by round)"
        );
    }
    if let Some(src) = r
        .scenes
        .iter()
        .find_map(|s| s.round_trips_source.as_deref())
    {
        let frames = r
            .scenes
            .iter()
            .find_map(|s| s.frames_source.as_deref())
            .unwrap_or("-");
        let bytes = r
            .scenes
            .iter()
            .find_map(|s| s.bytes_source.as_deref())
            .unwrap_or("-");
        println!(
            "virtsoc path: rt/frame counts {src}; B/frame counts {bytes}; frames from {frames}; \
             copies are SVM copies (stream regions included)"
        );
    }
    if r.paths["vm"].selected {
        print_vm(r);
    }
}

/// The vm path beside native and the process guest: FPS, % of each, scores, CPU.
fn print_vm(r: &GlesReport) {
    let (n, v, q) = (&r.paths["native"], &r.paths["virtsoc"], &r.paths["vm"]);
    println!();
    println!(
        "in a VM guest (QEMU; its CPU time is the emulated guest's: glmark2 and the vendor \
         library; GL runs on the host)"
    );
    println!(
        "{:<44} {:>8} {:>8} {:>8} {:>9} {:>11}",
        "scene", "native", "virtsoc", "vm", "vm%", "vm/virtsoc%"
    );
    for s in &r.scenes {
        println!(
            "{:<44} {:>8} {:>8} {:>8} {:>9} {:>11}",
            cut(&s.name, 44),
            opt(s.native_fps, 0),
            opt(s.virtsoc_fps, 0),
            opt(s.vm_fps, 0),
            opt(s.vm_pct, 1),
            opt(super::report::pct(s.vm_fps, s.virtsoc_fps), 1),
        );
    }
    println!(
        "{:<44} {:>8} {:>8} {:>8} {:>9} {:>11}",
        "glmark2 Score",
        opt(n.score, 0),
        opt(v.score, 0),
        opt(q.score, 0),
        opt(q.score_pct, 1),
        opt(super::report::pct(q.score, v.score), 1),
    );
    println!(
        "{:<44} {:>8} {:>8} {:>8}",
        "CPU s of the program (vm: QEMU)",
        opt(n.program_cpu_s, 2),
        opt(v.program_cpu_s, 2),
        opt(q.program_cpu_s, 2),
    );
    println!(
        "{:<44} {:>8} {:>8} {:>8}",
        "CPU s of the daemon + render worker",
        "-",
        opt(v.server_cpu_s, 2),
        opt(q.server_cpu_s, 2),
    );
    println!(
        "{:<44} {:>8} {:>8} {:>8}",
        "wall s of a run (vm: boot included)",
        opt(median_wall(n), 1),
        opt(median_wall(v), 1),
        opt(median_wall(q), 1),
    );
}

/// The median wall time of a path's runs.
fn median_wall(p: &super::report::PathSummary) -> Option<f64> {
    super::median(p.rounds.iter().map(|r| Some(r.wall_s)))
}

/// The lowest and highest of the rounds' `virtsoc` FPS as a percentage of the same round's
/// `native` ("lo-hi"; "-" without a round that ran both).
fn spread(native: &[Option<f64>], virtsoc: &[Option<f64>]) -> String {
    let pct: Vec<f64> = native
        .iter()
        .zip(virtsoc)
        .filter_map(|(n, v)| Some(100.0 * (*v)? / n.filter(|n| *n > 0.0)?))
        .collect();
    let lo = pct.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = pct.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if pct.is_empty() {
        "-".into()
    } else {
        format!("{lo:.0}-{hi:.0}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_is_the_rounds_lowest_and_highest_percentage() {
        let n = [Some(200.0), Some(100.0), None, Some(0.0)];
        let v = [Some(150.0), Some(90.0), Some(5.0), Some(3.0)];
        assert_eq!(spread(&n, &v), "75-90");
        assert_eq!(spread(&[None], &[Some(1.0)]), "-");
    }

    #[test]
    fn names_are_cut_and_numbers_dashed() {
        assert_eq!(cut("build", 8), "build");
        assert_eq!(cut("buffer:columns=200", 8), "buffer:~");
        assert_eq!(opt(None, 1), "-");
        assert_eq!(opt(Some(2.345), 1), "2.3");
    }
}
