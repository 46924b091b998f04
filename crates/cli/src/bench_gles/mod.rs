//! `virtsoc bench gles`, `virtsoc gles vendor-json` and `virtsoc gles validate`: unmodified
//! GLES 2.0 programs through virtsoc's EGL vendor library (`libEGL_virtsoc.so`, see
//! docs/gles.md), next to the same programs on the host's Mesa (llvmpipe through glvnd) and
//! on Mesa's virgl driver over `virgl_test_server`.
//!
//! The benchmark runs `glmark2-es2 --off-screen` (800x600, glmark2's default size) over
//! glmark2's default scenes, or the `--scenes` given, three ways per round, the paths taking
//! turns round by round:
//!
//! - **native**: the program as it is (glvnd picks Mesa);
//! - **virtsoc**: `__EGL_VENDOR_LIBRARY_FILENAMES` names the vendor JSON of
//!   `libEGL_virtsoc.so` and `VIRTSOC_SOCKET` the daemon (a `virtsocd` child of this process,
//!   unless `--socket` names a running one);
//! - **virgl**: `GALLIUM_DRIVER=virpipe` against a `virgl_test_server` of this process on
//!   `/tmp/.virgl_test` (the one path Mesa 22.3's vtest winsys knows);
//! - **vm** (only when asked for, `--paths ...,vm`): the program inside a QEMU guest (TCG)
//!   booted from the GLES guest image, its vendor library a VM guest of the same daemon
//!   ([`vm`]).
//!
//! Every path runs with Mesa's on-disk shader cache off (`MESA_SHADER_CACHE_DISABLE`), as the
//! sandboxed render worker must: a cache warmed by earlier runs would let the native path
//! skip shader compiles the others pay for.
//!
//! Precision differs between the paths on Mesa's llvmpipe: natively `mediump` is emulated
//! fp16, virtsoc's render worker computes it at `highp` (docs/gles.md, "Shader precision")
//! and virgl's host compiles desktop GLSL without precisions. `VIRTSOC_GLES_PRECISION=guest`
//! in this command's environment (the daemon it starts inherits it) keeps the guest's
//! precisions, for comparing the remoting alone with the native path.
//!
//! Without `$DISPLAY` the programs get an Xvfb of their own on a free display. Per path it
//! records each scene's FPS, glmark2's score, the program's CPU seconds (this process's
//! reaped-children times around it) and its server's (the daemon with its render workers,
//! or the virgl server with its per-client children: /proc times of the process tree). On the
//! virtsoc path it reads the guest's counters from the daemon's control API each time a
//! scene ends: device commands of the `gles` device (stream batches), SVM copies, and the
//! `gles` counters of the guest's stats when the daemon has them (round trips, stream bytes,
//! frames); until it counts them, the stream's bytes are the bytes SVM copies into the `gles`
//! domain and frames are FPS x duration.
//!
//! `virtsoc gles validate` is the correctness check of `make test`'s GLES test: each scene
//! with `--validate` natively and through virtsoc, and `es2_info` through virtsoc; it fails
//! when a scene validates natively but not through virtsoc.

mod chart;
mod counters;
pub(crate) mod env;
mod glmark;
mod report;
mod table;
mod validate;
mod vm;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use serde::Serialize;

use crate::daemon_proc::DaemonProcess;
use crate::CliError;
use counters::SceneCostMeter;
use env::{Display, VirglServer};
use glmark::{SceneLine, GLMARK2};
use report::report;
pub use report::{median, GlesReport, PathRun};
use vm::VmGuest;

pub use validate::ValidateArgs;

/// Errors of the GLES commands.
#[derive(Debug, thiserror::Error)]
pub enum GlesError {
    /// The vendor library is not where it should be.
    #[error(
        "{} is not built: run `cargo build -p virtsoc-gles -p virtsoc-render` (add --release \
         for target/release)",
        .0.display()
    )]
    NotBuilt(PathBuf),
    /// A program the command needs is not installed.
    #[error("{program} is not installed (Debian package {package}; scripts/install-deps.sh installs it)")]
    Missing {
        /// The program.
        program: String,
        /// The Debian package that has it.
        package: String,
    },
    /// Starting the daemon, Xvfb or the virgl server failed.
    #[error("set-up: {0}")]
    Setup(String),
    /// Bad options.
    #[error("{0}")]
    Usage(String),
    /// The validation check failed.
    #[error("check failed: {0}")]
    Check(String),
    /// Reading or writing a file, pipe or process failed.
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    /// JSON could not be written.
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
}

impl From<GlesError> for CliError {
    fn from(e: GlesError) -> Self {
        match e {
            GlesError::Io(e) => CliError::Io(e),
            GlesError::Json(e) => CliError::Json(e),
            other => CliError::Usage(other.to_string()),
        }
    }
}

/// `virtsoc gles ...`.
#[derive(Debug, clap::Subcommand)]
pub enum GlesCmd {
    /// Writes the glvnd vendor JSON of libEGL_virtsoc.so next to the library (beside this
    /// `virtsoc` executable) and prints its path; use it as `__EGL_VENDOR_LIBRARY_FILENAMES`.
    VendorJson,
    /// glmark2-es2 --validate on a few scenes natively and through virtsoc, and es2_info
    /// through virtsoc; fails when a scene validates natively but not through virtsoc.
    Validate(ValidateArgs),
}

/// Options of `virtsoc bench gles`.
#[derive(Debug, clap::Args)]
pub struct BenchGlesArgs {
    /// Daemon to use (a Unix socket path); default: start one (then its CPU is measured).
    #[arg(long)]
    pub socket: Option<String>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Also write an SVG bar chart here (FPS as % of native per scene, the scores).
    #[arg(long)]
    pub chart: Option<PathBuf>,
    /// Rounds (each runs every path once, in turn); the report has the medians.
    #[arg(long, default_value_t = 1)]
    pub rounds: usize,
    /// Scenes to run (`scene` or `scene:opt=val:...`, comma-separated or repeated; default:
    /// glmark2's default list).
    #[arg(long, value_delimiter = ',')]
    pub scenes: Vec<String>,
    /// Seconds per scene (glmark2's own default is 10).
    #[arg(long, default_value_t = 2.0)]
    pub duration: f64,
    /// Paths to run: native, virtsoc, virgl, vm (a QEMU guest; not in the default list).
    #[arg(long, value_delimiter = ',', default_value = "native,virtsoc,virgl")]
    pub paths: Vec<GlPath>,
    /// The vm path's GLES guest image (default: target/PROFILE/vm-gles-image, built or brought up
    /// to date by scripts/build-guest-image.sh --gles).
    #[arg(long)]
    pub vm_image: Option<PathBuf>,
    /// The vm path's accelerator: tcg, or kvm where the host has it.
    #[arg(long, default_value = "tcg")]
    pub vm_accel: String,
}

/// How a program reaches a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum GlPath {
    /// Mesa on the host, through glvnd.
    Native,
    /// virtsoc's vendor library, the daemon and its render worker.
    Virtsoc,
    /// Mesa's virgl driver over virgl_test_server.
    Virgl,
    /// virtsoc's vendor library inside a QEMU guest (the daemon's VM endpoint).
    Vm,
}

impl GlPath {
    /// Its name in tables and JSON.
    pub fn name(self) -> &'static str {
        match self {
            GlPath::Native => "native",
            GlPath::Virtsoc => "virtsoc",
            GlPath::Virgl => "virgl",
            GlPath::Vm => "vm",
        }
    }

    const ALL: [GlPath; 4] = [GlPath::Native, GlPath::Virtsoc, GlPath::Virgl, GlPath::Vm];
}

/// How a path reaches its GPU: the environment of its programs.
pub(crate) struct PathEnv {
    display: String,
    /// The vendor JSON and the daemon socket, for the virtsoc path.
    virtsoc: Option<(PathBuf, String)>,
    /// The VM guest, for the vm path.
    vm: Option<VmGuest>,
}

impl PathEnv {
    /// `program` with the environment of `path`: glvnd's and Mesa's selection variables
    /// cleared, then set for the path; on the vm path, `virtsoc vm run` running it in the
    /// guest (append the program's arguments either way).
    pub(crate) fn command(&self, program: &str, path: GlPath) -> Result<Command, GlesError> {
        if path == GlPath::Vm {
            return match &self.vm {
                Some(vm) => Ok(vm.command(program)),
                None => Err(GlesError::Setup("the vm path is not set up".into())),
            };
        }
        let mut c = Command::new(program);
        c.env("DISPLAY", &self.display);
        for v in [
            "__EGL_VENDOR_LIBRARY_FILENAMES",
            "__EGL_VENDOR_LIBRARY_DIRS",
            "GALLIUM_DRIVER",
            "VIRTSOC_SOCKET",
            "LIBGL_ALWAYS_SOFTWARE",
        ] {
            c.env_remove(v);
        }
        // Every path compiles its shaders under the same conditions: virtsoc's sandboxed
        // render worker cannot open Mesa's on-disk shader cache, so neither does the native
        // program (a warm disk cache made native terrain 5 fps against 2 without it) nor the
        // virgl server (`VirglServer::start`).
        c.env("MESA_SHADER_CACHE_DISABLE", "true");
        match path {
            GlPath::Native => {}
            GlPath::Virtsoc => {
                if let Some((json, socket)) = &self.virtsoc {
                    c.env("__EGL_VENDOR_LIBRARY_FILENAMES", json);
                    c.env("VIRTSOC_SOCKET", socket);
                }
            }
            GlPath::Virgl => {
                c.env("GALLIUM_DRIVER", "virpipe");
            }
            GlPath::Vm => {}
        }
        Ok(c)
    }
}

/// The daemon of the virtsoc path: one this process started, or the `--socket` given.
struct Daemon {
    socket: String,
    pid: Option<u32>,
    _child: Option<DaemonProcess>,
}

impl Daemon {
    /// The daemon at `socket`, or one started with `extra` arguments (a VM endpoint).
    fn open(socket: Option<String>, extra: &[String]) -> Result<Daemon, GlesError> {
        match socket {
            Some(s) => Ok(Daemon {
                socket: s,
                pid: None,
                _child: None,
            }),
            None => {
                let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
                let d = DaemonProcess::spawn(&extra, false)
                    .map_err(|e| GlesError::Setup(format!("starting virtsocd: {e}")))?;
                let e = d.endpoint();
                Ok(Daemon {
                    socket: e.target,
                    pid: e.pid,
                    _child: Some(d),
                })
            }
        }
    }
}

/// glmark2's arguments: off-screen, the per-scene duration, the scenes.
fn glmark2_args(scenes: &[String], duration: f64, validate: bool) -> Vec<String> {
    let mut a = vec!["--off-screen".to_string()];
    if validate {
        a.push("--validate".into());
    } else {
        a.push("-b".into());
        a.push(format!(":duration={duration}"));
    }
    for s in scenes {
        a.push("-b".into());
        a.push(s.clone());
    }
    a
}

/// Runs glmark2 once on `path`; `cost` snapshots the virtsoc guest's counters as each scene
/// ends.
fn run_once(
    env: &PathEnv,
    path: GlPath,
    args: &[String],
    (limit, quiet): (Duration, Duration),
    server_pid: Option<u32>,
    mut cost: Option<&mut SceneCostMeter>,
) -> Result<PathRun, GlesError> {
    let mut cmd = env.command(GLMARK2, path)?;
    cmd.args(args);
    let server_cpu = server_pid.map(env::CpuWatch::start);
    if let Some(c) = cost.as_deref_mut() {
        c.begin();
    }
    let mut run = PathRun::default();
    let out = glmark::run_program(cmd, limit, quiet, |line| {
        if let Some(SceneLine::Fps { name, .. } | SceneLine::Other { name, .. }) =
            glmark::parse_scene_line(line)
        {
            if let Some(c) = cost.as_deref_mut() {
                c.scene_ended(&name);
            }
        }
    })?;
    // Let the render worker or the virgl child finish with the program before the sample.
    std::thread::sleep(Duration::from_millis(300));
    run.server_cpu_s = server_cpu.and_then(env::CpuWatch::finish);
    for l in &out.lines {
        match glmark::parse_scene_line(l) {
            Some(SceneLine::Fps { name, fps, .. }) => run.scenes.push((name, Some(fps))),
            Some(SceneLine::Other { name, .. }) => run.scenes.push((name, None)),
            Some(SceneLine::Validation { .. }) | None => {}
        }
        if let Some(s) = glmark::parse_score(l) {
            run.score = Some(s);
        }
        if run.renderer.is_none() {
            run.renderer = glmark::header_value(l, "GL_RENDERER");
        }
    }
    run.program_cpu_s = out.cpu_s;
    run.wall_s = out.wall_s;
    if !out.ok() {
        run.error = Some(out.failure());
    } else if let Some(want) = match path {
        GlPath::Virgl => Some("virgl"),
        GlPath::Vm => Some("virtsoc"),
        _ => None,
    }
    .filter(|w| !run.renderer.as_deref().is_some_and(|r| r.contains(w)))
    {
        run.error = Some(format!(
            "GL_RENDERER is {:?}, not {want}: the run is not counted",
            run.renderer
        ));
        run.scenes.iter_mut().for_each(|s| s.1 = None);
        run.score = None;
    }
    if let Some(c) = cost {
        run.counters = c.take();
    }
    Ok(run)
}

/// Runs the benchmark.
pub fn bench(a: &BenchGlesArgs) -> Result<GlesReport, GlesError> {
    if a.rounds == 0 || !(0.1..=600.0).contains(&a.duration) {
        return Err(GlesError::Usage(
            "--rounds must be positive and --duration in 0.1..=600".into(),
        ));
    }
    env::require(GLMARK2, "glmark2-es2-x11")?;
    let mut display = Display::open()?;
    let want = |p: GlPath| a.paths.contains(&p);
    let mut not_run: BTreeMap<GlPath, String> = BTreeMap::new();
    let n_scenes = if a.scenes.is_empty() {
        33
    } else {
        a.scenes.len()
    };
    let limit = Duration::from_secs_f64(60.0 + n_scenes as f64 * (2.0 * a.duration + 30.0));
    // The vm path's set-up: the image and the VM's endpoint (on the daemon started below).
    let vm = if want(GlPath::Vm) {
        let g = match &a.socket {
            Some(_) => Err(GlesError::Usage(
                "the vm path needs a daemon of this run (no --socket)".into(),
            )),
            None => vm::image(a.vm_image.clone())
                .and_then(|image| VmGuest::new(image, &a.vm_accel, limit)),
        };
        g.map_err(|e| not_run.insert(GlPath::Vm, e.to_string()))
            .ok()
    } else {
        None
    };
    // The virtsoc path's set-up: the vendor JSON, a daemon, its control API.
    let mut daemon = None;
    let mut vendor = None;
    if want(GlPath::Virtsoc) || vm.is_some() {
        let extra = vm.as_ref().map(VmGuest::daemon_args).unwrap_or_default();
        match Daemon::open(a.socket.clone(), &extra) {
            Ok(d) => {
                match env::write_vendor_json() {
                    Ok(j) => vendor = Some((j, d.socket.clone())),
                    Err(e) => {
                        not_run.insert(GlPath::Virtsoc, e.to_string());
                    }
                }
                daemon = Some(d);
            }
            Err(e) => {
                not_run.insert(GlPath::Virtsoc, e.to_string());
                not_run.insert(GlPath::Vm, e.to_string());
            }
        }
    }
    let virgl = if want(GlPath::Virgl) {
        match VirglServer::start() {
            Ok(s) => Some(s),
            Err(e) => {
                not_run.insert(GlPath::Virgl, e.to_string());
                None
            }
        }
    } else {
        None
    };
    let mut env = PathEnv {
        display: display.name.clone(),
        virtsoc: vendor,
        vm,
    };
    let args = glmark2_args(&a.scenes, a.duration, false);
    // A scene prints its line after `duration` (and its last frame): silence far beyond that
    // is a program stuck in a scene.
    let quiet = Duration::from_secs_f64(60.0 + 2.0 * a.duration);
    let mut counters = daemon.as_ref().map(|d| SceneCostMeter::new(&d.socket));
    let mut runs: BTreeMap<GlPath, Vec<PathRun>> = BTreeMap::new();
    for round in 0..a.rounds {
        for path in GlPath::ALL {
            if !want(path) || not_run.contains_key(&path) {
                continue;
            }
            if !a.json {
                eprintln!(
                    "bench gles: round {}/{}: {}",
                    round + 1,
                    a.rounds,
                    path.name()
                );
            }
            if display.ensure()? {
                eprintln!("bench gles: the X server had gone: {} now", display.name);
                env.display = display.name.clone();
            }
            let server = match path {
                GlPath::Native => None,
                GlPath::Virtsoc | GlPath::Vm => daemon.as_ref().and_then(|d| d.pid),
                GlPath::Virgl => virgl.as_ref().map(VirglServer::pid),
            };
            // A VM boots before the program's first line.
            let (limit, quiet) = match path {
                GlPath::Vm => (limit + vm::BOOT_ALLOWANCE, quiet + vm::BOOT_ALLOWANCE),
                _ => (limit, quiet),
            };
            let cost = if path == GlPath::Virtsoc {
                counters.as_mut()
            } else {
                None
            };
            let r = run_once(&env, path, &args, (limit, quiet), server, cost)?;
            if let Some(e) = &r.error {
                eprintln!("bench gles: {} round {}: {e}", path.name(), round + 1);
            }
            runs.entry(path).or_default().push(r);
        }
    }
    drop(virgl);
    drop(daemon);
    drop(display);
    Ok(report(a, &args, runs, not_run))
}
/// Runs `virtsoc bench gles` and prints its report.
pub fn run_bench(a: &BenchGlesArgs) -> Result<(), CliError> {
    let r = bench(a)?;
    if let Some(path) = &a.chart {
        chart::write(&r, path)?;
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        table::print(&r);
        if let Some(path) = &a.chart {
            println!("chart: {}", path.display());
        }
    }
    Ok(())
}

/// Runs `virtsoc gles ...`.
pub fn run_cmd(which: &GlesCmd) -> Result<(), CliError> {
    match which {
        GlesCmd::VendorJson => {
            println!("{}", env::write_vendor_json()?.display());
            Ok(())
        }
        GlesCmd::Validate(a) => Ok(validate::run(a)?),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glmark2_arguments() {
        let a = glmark2_args(&["build:use-vbo=true".into()], 1.5, false);
        assert_eq!(
            a,
            [
                "--off-screen",
                "-b",
                ":duration=1.5",
                "-b",
                "build:use-vbo=true"
            ]
        );
        assert_eq!(glmark2_args(&[], 2.0, true), ["--off-screen", "--validate"]);
    }
}
