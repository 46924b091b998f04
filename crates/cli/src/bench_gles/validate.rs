//! `virtsoc gles validate`: glmark2's own image checks (`--validate`) on a few scenes
//! natively and through virtsoc, and `es2_info` through virtsoc. It fails when a scene
//! validates natively (`Validation: Success`) but not through virtsoc, when a program
//! fails through virtsoc, or when es2_info does not show virtsoc's vendor strings.
//!
//! With `--vm` the same glmark2 run also goes inside a VM guest (the `vm` path of
//! [`super::vm`]): it fails too when a scene validates natively but not in the VM, when
//! glmark2's GL strings there do not name virtsoc, or when the daemon's `gles` device got
//! no batch from the VM's guest (nothing was drawn through virtsoc).

use std::path::PathBuf;
use std::time::Duration;

use super::counters::SceneCostMeter;
use super::env::{self, Display};
use super::glmark::{self, SceneLine, GLMARK2};
use super::vm::{self, VmGuest};
use super::{glmark2_args, Daemon, GlPath, GlesError, PathEnv};

/// es2_info of Debian's mesa-utils-bin.
pub const ES2_INFO: &str = "es2_info.x86_64-linux-gnu";

/// Options of `virtsoc gles validate`.
#[derive(Debug, Clone, clap::Args)]
pub struct ValidateArgs {
    /// Daemon to use (a Unix socket path); default: start one.
    #[arg(long)]
    pub socket: Option<String>,
    /// Scenes to validate (comma-separated or repeated; `all`: glmark2's default list).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "build:use-vbo=true,texture,shading"
    )]
    pub scenes: Vec<String>,
    /// Seconds each program may run (a VM's boot comes on top).
    #[arg(long, default_value_t = 60)]
    pub timeout: u64,
    /// Also validate inside a VM guest (QEMU) booted from the GLES guest image.
    #[arg(long)]
    pub vm: bool,
    /// The GLES guest image (default: target/PROFILE/vm-gles-image, built or brought up to date by
    /// scripts/build-guest-image.sh --gles).
    #[arg(long)]
    pub vm_image: Option<PathBuf>,
    /// The VM's accelerator: tcg, or kvm where the host has it.
    #[arg(long, default_value = "tcg")]
    pub vm_accel: String,
}

/// A scene's verdicts natively and through virtsoc.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdicts {
    /// The scene as glmark2 printed it.
    pub name: String,
    /// Natively (None: no line for the scene).
    pub native: Option<String>,
    /// Through virtsoc.
    pub virtsoc: Option<String>,
}

/// Scene verdicts from glmark2's output lines.
fn verdicts(lines: &[String]) -> Vec<(String, String)> {
    lines
        .iter()
        .filter_map(|l| match glmark::parse_scene_line(l)? {
            SceneLine::Validation { name, verdict } => Some((name, verdict)),
            SceneLine::Other { name, text } => Some((name, text)),
            SceneLine::Fps { .. } => None,
        })
        .collect()
}

/// Lines up the two runs' verdicts by scene, in native order, then virtsoc-only scenes.
fn line_up(native: &[(String, String)], virtsoc: &[(String, String)]) -> Vec<Verdicts> {
    let mut out: Vec<Verdicts> = native
        .iter()
        .map(|(n, v)| Verdicts {
            name: n.clone(),
            native: Some(v.clone()),
            virtsoc: virtsoc.iter().find(|(m, _)| m == n).map(|x| x.1.clone()),
        })
        .collect();
    for (n, v) in virtsoc {
        if !out.iter().any(|o| &o.name == n) {
            out.push(Verdicts {
                name: n.clone(),
                native: None,
                virtsoc: Some(v.clone()),
            });
        }
    }
    out
}

/// The problems of a validation: scenes that validate natively and not `via` the other
/// path ("through virtsoc", "in the VM"), and a check that would prove nothing (no scene
/// validated natively).
fn problems(rows: &[Verdicts], via: &str) -> Vec<String> {
    let mut out = Vec::new();
    if !rows.iter().any(|r| r.native.as_deref() == Some("Success")) {
        out.push("no scene validated natively: the comparison would prove nothing".into());
    }
    for r in rows {
        if r.native.as_deref() == Some("Success") && r.virtsoc.as_deref() != Some("Success") {
            out.push(format!(
                "{}: Success natively, {} {via}",
                r.name,
                r.virtsoc.as_deref().unwrap_or("no result")
            ));
        }
    }
    out
}

/// Whether es2_info's output names virtsoc as the EGL vendor and in a GL string.
fn es2_info_problems(lines: &[String]) -> Vec<String> {
    let value = |key: &str| lines.iter().find_map(|l| glmark::header_value(l, key));
    let is_virtsoc = |v: &Option<String>| {
        v.as_deref()
            .is_some_and(|s| s.to_ascii_lowercase().contains("virtsoc"))
    };
    let mut out = Vec::new();
    let egl = value("EGL_VENDOR");
    if !is_virtsoc(&egl) {
        out.push(format!("es2_info: EGL_VENDOR is {egl:?}, not virtsoc's"));
    }
    let gl: Vec<Option<String>> = ["GL_VENDOR", "GL_RENDERER", "GL_VERSION"]
        .iter()
        .map(|k| value(k))
        .collect();
    if !gl.iter().any(is_virtsoc) {
        out.push(format!(
            "es2_info: no GL string names virtsoc (GL_VENDOR, GL_RENDERER, GL_VERSION: {gl:?})"
        ));
    }
    out
}

/// Runs the check, printing what it saw; an error names every problem.
pub fn run(a: &ValidateArgs) -> Result<(), GlesError> {
    env::require(GLMARK2, "glmark2-es2-x11")?;
    env::require(ES2_INFO, "mesa-utils-bin")?;
    let json = env::write_vendor_json()?;
    let limit = Duration::from_secs(a.timeout.max(1));
    let vm = match (a.vm, &a.socket) {
        (false, _) => None,
        (true, Some(_)) => {
            return Err(GlesError::Usage(
                "--vm needs a daemon of this run (no --socket)".into(),
            ))
        }
        (true, None) => Some(VmGuest::new(
            vm::image(a.vm_image.clone())?,
            &a.vm_accel,
            limit,
        )?),
    };
    let display = Display::open()?;
    let extra = vm.as_ref().map(VmGuest::daemon_args).unwrap_or_default();
    let daemon = Daemon::open(a.socket.clone(), &extra)?;
    let penv = PathEnv {
        display: display.name.clone(),
        virtsoc: Some((json.clone(), daemon.socket.clone())),
        vm,
    };
    let scenes: Vec<String> = if a.scenes.iter().any(|s| s == "all") {
        Vec::new()
    } else {
        a.scenes.clone()
    };
    let args = glmark2_args(&scenes, 0.0, true);
    println!("vendor JSON: {}", json.display());
    println!("daemon: {}", daemon.socket);
    println!("{GLMARK2} {}", args.join(" "));
    let mut problems_seen = Vec::new();
    let mut runs = Vec::new();
    let mut paths = vec![GlPath::Native, GlPath::Virtsoc];
    if penv.vm.is_some() {
        paths.push(GlPath::Vm);
    }
    for &path in &paths {
        let (lines, problems) = validate_path(&penv, path, &args, limit, &daemon.socket)?;
        problems_seen.extend(problems);
        runs.push(verdicts(&lines));
    }
    let rows = line_up(&runs[0], &runs[1]);
    let in_vm = runs.get(2).map(|vm| line_up(&runs[0], vm));
    println!(
        "{:<60} {:>10} {:>10} {:>10}",
        "scene", "native", "virtsoc", "vm"
    );
    for r in &rows {
        let vm = in_vm
            .as_ref()
            .and_then(|v| v.iter().find(|x| x.name == r.name))
            .and_then(|x| x.virtsoc.as_deref());
        println!(
            "{:<60} {:>10} {:>10} {:>10}",
            r.name,
            r.native.as_deref().unwrap_or("-"),
            r.virtsoc.as_deref().unwrap_or("-"),
            vm.unwrap_or("-")
        );
    }
    problems_seen.extend(problems(&rows, "through virtsoc"));
    if let Some(v) = &in_vm {
        problems_seen.extend(problems(v, "in the VM"));
    }
    let info = glmark::run_program(
        penv.command(ES2_INFO, GlPath::Virtsoc)?,
        limit,
        limit,
        |_| {},
    )?;
    for key in [
        "EGL_VERSION",
        "EGL_VENDOR",
        "GL_VENDOR",
        "GL_RENDERER",
        "GL_VERSION",
    ] {
        let v = info.lines.iter().find_map(|l| glmark::header_value(l, key));
        println!("es2_info {key}: {}", v.as_deref().unwrap_or("(none)"));
    }
    if !info.ok() {
        problems_seen.push(format!("es2_info: {}", info.failure()));
    }
    problems_seen.extend(es2_info_problems(&info.lines));
    drop(daemon);
    drop(display);
    if problems_seen.is_empty() {
        println!("gles validate: OK");
        Ok(())
    } else {
        Err(GlesError::Check(problems_seen.join("; ")))
    }
}

/// Runs glmark2 (`args`) on `path`, printing its GL_RENDERER: its output lines and what went
/// wrong. On the vm path the daemon at `socket` must have counted `gles` batches of the
/// VM's guest, and glmark2's GL strings must name virtsoc.
fn validate_path(
    penv: &PathEnv,
    path: GlPath,
    args: &[String],
    limit: Duration,
    socket: &str,
) -> Result<(Vec<String>, Vec<String>), GlesError> {
    let mut cmd = penv.command(GLMARK2, path)?;
    cmd.args(args);
    let mut counters = (path == GlPath::Vm).then(|| SceneCostMeter::new(socket));
    if let Some(c) = counters.as_mut() {
        c.begin();
    }
    // `vm run` gives up (and stops QEMU) at the limit plus the boot: it ends first.
    let limit = match path {
        GlPath::Vm => limit + vm::BOOT_ALLOWANCE + Duration::from_secs(30),
        _ => limit,
    };
    let out = glmark::run_program(cmd, limit, limit, |l| {
        if let (Some(c), Some(SceneLine::Validation { name, .. })) =
            (counters.as_mut(), glmark::parse_scene_line(l))
        {
            c.scene_ended(&name);
        }
    })?;
    let value = |key: &str| out.lines.iter().find_map(|l| glmark::header_value(l, key));
    let renderer = value("GL_RENDERER");
    let mut problems = Vec::new();
    if !out.ok() {
        problems.push(format!("glmark2 {}: {}", path.name(), out.failure()));
    }
    let mut note = String::new();
    if let Some(c) = counters.as_mut() {
        let batches: u64 = c.take().values().map(|s| s.commands).sum();
        note = format!(" ({batches} gles batches from the VM, {:.1} s)", out.wall_s);
        if batches == 0 {
            problems.push("vm: the daemon's gles device got no batch from the VM guest".into());
        }
        if !["GL_VENDOR", "GL_RENDERER"]
            .iter()
            .any(|k| value(k).is_some_and(|v| v.contains("virtsoc")))
        {
            problems.push(format!(
                "vm: glmark2's GL_VENDOR and GL_RENDERER ({:?}, {renderer:?}) do not name virtsoc",
                value("GL_VENDOR")
            ));
        }
    }
    println!(
        "{:<8} GL_RENDERER {}{note}",
        path.name(),
        renderer.as_deref().unwrap_or("(none)")
    );
    Ok((out.lines, problems))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_scene_lost_through_virtsoc_is_a_problem() {
        let native = verdicts(&lines(&[
            "[build] use-vbo=true: Validation: Success",
            "[texture] <default>: Validation: Success",
            "[shading] shading=cel: Validation: Unknown",
        ]));
        let virtsoc = verdicts(&lines(&[
            "[build] use-vbo=true: Validation: Success",
            "[texture] <default>: Validation: Failure",
            "[shading] shading=cel: Validation: Failure",
        ]));
        let rows = line_up(&native, &virtsoc);
        assert_eq!(rows.len(), 3);
        let p = problems(&rows, "through virtsoc");
        assert_eq!(p, ["texture: Success natively, Failure through virtsoc"]);
        assert_eq!(
            problems(&rows, "in the VM"),
            ["texture: Success natively, Failure in the VM"]
        );
        // A virtsoc run that printed nothing loses every scene.
        let p = problems(&line_up(&native, &[]), "through virtsoc");
        assert_eq!(p.len(), 2, "{p:?}");
        // Nothing validated natively: the check refuses to pass.
        assert_eq!(problems(&line_up(&[], &[]), "through virtsoc").len(), 1);
    }

    #[test]
    fn es2_info_must_name_virtsoc() {
        let mesa = lines(&[
            "EGL_VENDOR: Mesa Project",
            "GL_VENDOR: Mesa/X.org",
            "GL_RENDERER: llvmpipe",
        ]);
        assert_eq!(es2_info_problems(&mesa).len(), 2);
        let ours = lines(&[
            "EGL_VENDOR: virtsoc",
            "GL_VENDOR: virtsoc",
            "GL_RENDERER: virtsoc (llvmpipe)",
        ]);
        assert!(es2_info_problems(&ours).is_empty());
    }
}
