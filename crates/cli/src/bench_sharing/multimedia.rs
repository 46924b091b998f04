//! Parts (b) and (c) of `virtsoc bench sharing`: a 30 fps video guest against GPU hogs or
//! CPU spinners, and app guests alone and two together.
//!
//! The CPU hogs are processes of their own (`virtsoc cpu-hog`): each connects as a guest, so
//! the daemon can give it a cgroup and a weight, and then spins on the CPU until killed.
//! Against them the video guest makes each frame on the CPU before composing it (a software
//! decoder's work: a gradient rendered into a buffer and written into its source region),
//! so its rate depends on the CPU it gets, which the feedback scheduler steers through the
//! guests' CPU weights when the daemon runs with `--cpu-cgroup`.

use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use serde::Serialize;

use virtsoc_control::client::{control_path, request, Target};
use virtsoc_guest::devices as api;
use virtsoc_guest::Format;
use virtsoc_sched::Kind;

use super::{gpu, stop_guests, Control, MultimediaRow, HOG_SIZE, VIDEO_FPS};
use crate::bench_svm::OrderingMode;
use crate::daemon_proc::DaemonProcess;
use crate::scenario::full_layer;
use crate::scenario::pipe::Pipe;
use crate::CliError;

/// What `n` app guests together under `kind` got: per guest, the frames per second the
/// display showed of it while it had the screen, and the frames per second it presented.
#[derive(Debug, Clone, Default)]
pub(super) struct Apps {
    pub shown_fps: Vec<f64>,
    pub presented_fps: Vec<f64>,
}

/// `n` app guests together under `kind`. The display shows one guest's frames, its
/// foreground's (the first to present, until switched): the others' are hidden, and a
/// frame the guest presented is not a frame anyone saw. So the measure is cut into `n`
/// equal parts, guest `i` made the foreground for the `i`th; its shown rate is the
/// display's count of its scanned-out frames in its part (after [`SWITCH_SETTLE`]), and
/// every guest runs all along, so the foreground shares the machine with all of them.
pub(super) fn run_apps(kind: Kind, n: usize, seconds: u64) -> Result<Apps, CliError> {
    let d = DaemonProcess::spawn(
        &["--scheduler", kind.name(), "--display-size", "1280x720"],
        false,
    )?;
    let target = d.endpoint().target;
    let control = Target::Unix(control_path(std::path::Path::new(&target)));
    let warm = Barrier::new(n + 1);
    let stop = AtomicBool::new(false);
    let frames: Vec<AtomicU64> = (0..n).map(|_| AtomicU64::new(0)).collect();
    let names: Vec<String> = (0..n).map(|i| format!("app-{i}")).collect();
    let r = std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|i| {
                let (t, name, warm, stop, f) = (&target, &names[i], &warm, &stop, &frames[i]);
                s.spawn(move || video(t, name, false, warm, stop, f))
            })
            .collect();
        warm.wait();
        let measured = (|| -> Result<Apps, CliError> {
            std::thread::sleep(Duration::from_secs(1));
            let part = Duration::from_secs_f64(seconds as f64 / n.max(1) as f64);
            let mut out = Apps::default();
            for name in &names {
                let id = guest(&control, name)?.id;
                let body = serde_json::json!({ "guest": id }).to_string();
                let r = request(&control, "POST", "/display/foreground", body.as_bytes())?;
                if r.status != 200 {
                    return Err(CliError::Usage(format!("foreground: {}", r.body)));
                }
                std::thread::sleep(SWITCH_SETTLE);
                let (s0, f0) = (
                    guest(&control, name)?.presented,
                    count(&frames, name, &names),
                );
                let t0 = Instant::now();
                std::thread::sleep(part);
                let (s1, f1) = (
                    guest(&control, name)?.presented,
                    count(&frames, name, &names),
                );
                let secs = t0.elapsed().as_secs_f64();
                out.shown_fps.push(s1.saturating_sub(s0) as f64 / secs);
                out.presented_fps.push(f1.saturating_sub(f0) as f64 / secs);
            }
            Ok(out)
        })();
        stop_guests(&stop, &[], handles)?;
        measured
    });
    d.stop()?;
    r
}

/// How long after a foreground switch the display's count of the new foreground is read
/// from (the switch reveals its latest hidden frame, counted apart, and its next frame
/// comes within a period).
const SWITCH_SETTLE: Duration = Duration::from_millis(200);

/// The frames guest `name` (one of `names`) counted as presented.
fn count(frames: &[AtomicU64], name: &str, names: &[String]) -> u64 {
    names
        .iter()
        .position(|n| n == name)
        .map_or(0, |i| frames[i].load(Ordering::Relaxed))
}

/// The `top` row of the guest named `name`.
fn guest(control: &Target, name: &str) -> Result<crate::top::TopGuest, CliError> {
    crate::top::sample(control, None)?
        .into_iter()
        .find(|g| g.name == name)
        .ok_or_else(|| CliError::Usage(format!("no guest {name} on the display's daemon")))
}

/// What the multimedia guest competes with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum HogKind {
    /// Guests looping 1920x1080 GPU compositions (threads of the bench).
    Gpu,
    /// Processes spinning on the CPU (each a guest of its own).
    Cpu,
    /// Unmodified glmark2-es2 instances rendering through virtsoc, against a GLES video
    /// guest (`gles.rs`).
    Gles,
}

impl HogKind {
    /// The JSON spelling.
    pub fn name(self) -> &'static str {
        match self {
            HogKind::Gpu => "gpu",
            HogKind::Cpu => "cpu",
            HogKind::Gles => "gles",
        }
    }
}

/// The video guest: a 1280x720 GPU composition presented on the display every 1/30 s; with
/// `cpu_frame`, each frame first made on the CPU ([`render`]).
fn video(
    target: &str,
    name: &str,
    cpu_frame: bool,
    warm: &Barrier,
    stop: &AtomicBool,
    frames: &AtomicU64,
) -> Result<(), CliError> {
    let (w, h) = (1280u32, 720u32);
    let setup = || -> Result<_, CliError> {
        let conn = super::open_guest(target, name, w as u64 * h as u64 * 4 * 5 + (16 << 20))?;
        let src = conn.alloc(0, w, h, Format::Rgba8, 0)?.id;
        let outs = (0..3)
            .map(|_| conn.alloc(0, w, h, Format::Rgba8, 0).map(|r| r.id))
            .collect::<Result<Vec<_>, _>>()?;
        let layers = conn.alloc_blob(api::LAYER_RECORD as u64)?.id;
        Ok((conn, src, outs, layers))
    };
    let (conn, src, outs, layers) = match setup() {
        Ok(x) => x,
        Err(e) => {
            warm.wait();
            return Err(e);
        }
    };
    let mut p = Pipe::new(&conn, OrderingMode::Atomic);
    let ready = (|| -> Result<(), CliError> {
        p.cpu_write(src, &vec![0x40u8; (w * h * 4) as usize])?;
        p.cpu_write(layers, &full_layer(src, w, h, false).to_bytes())?;
        Ok(())
    })();
    warm.wait();
    ready?;
    let period = Duration::from_secs_f64(1.0 / VIDEO_FPS);
    let mut next = Instant::now();
    let mut i = 0;
    let mut pixels = vec![0u8; (w * h * 4) as usize];
    while !stop.load(Ordering::Relaxed) {
        let dst = outs[i % outs.len()];
        i += 1;
        if cpu_frame {
            render(&mut pixels, w, i as u32);
            p.cpu_write(src, &pixels)?;
        }
        let t = p.run_with(
            &api::gpu::Composite {
                layers,
                count: 1,
                dst,
            },
            &[src],
        )?;
        p.result(t)?;
        let t = p.run(&api::display::Present {
            frame: dst,
            capture_ns: 0,
        })?;
        p.result(t)?;
        frames.fetch_add(1, Ordering::Relaxed);
        next += period;
        let now = Instant::now();
        if next > now {
            std::thread::sleep(next - now);
        } else {
            next = now; // late: no catching up
        }
    }
    Ok(())
}

/// Frame `n` of the video: a moving gradient, a few milliseconds of CPU.
fn render(pixels: &mut [u8], w: u32, n: u32) {
    for (i, px) in pixels.chunks_exact_mut(4).enumerate() {
        let (x, y) = (i as u32 % w, i as u32 / w);
        let v = x.wrapping_mul(7) ^ y.wrapping_mul(13) ^ n.wrapping_mul(31);
        px.copy_from_slice(&[v as u8, (v >> 3) as u8, (x + n) as u8, 0xff]);
    }
}

/// `virtsoc cpu-hog`: connects to `socket` as guest `name`, then spins until killed.
pub fn cpu_hog(socket: &str, name: &str) -> Result<(), CliError> {
    let _conn = super::open_guest(socket, name, 4 << 20)?;
    let mut x = 1u64;
    loop {
        for _ in 0..1_000_000 {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        }
        std::hint::black_box(x);
    }
}

/// The CPU hogs of a run, killed when dropped.
struct CpuHogs(Vec<Child>);

impl CpuHogs {
    fn spawn(target: &str, n: usize) -> Result<Self, CliError> {
        let exe = std::env::current_exe()?;
        let mut hogs = CpuHogs(Vec::new());
        for i in 0..n {
            hogs.0.push(
                Command::new(&exe)
                    .args(["cpu-hog", "--socket", target, "--name", &format!("hog-{i}")])
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .spawn()?,
            );
        }
        Ok(hogs)
    }
}

impl Drop for CpuHogs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The CPU weight of guest `id`'s group under the daemon's `--cpu-cgroup NAME` (the bench
/// and its daemon at the root of the hierarchy), if it has one.
pub(super) fn cpu_weight(name: &str, id: u64) -> Option<u64> {
    [
        format!("/sys/fs/cgroup/{name}/guest-{id}/cpu.weight"),
        format!("/sys/fs/cgroup/unified/{name}/guest-{id}/cpu.weight"),
        format!("/sys/fs/cgroup/cpu/{name}/guest-{id}/cpu.shares"),
    ]
    .iter()
    .find_map(|p| std::fs::read_to_string(p).ok()?.trim().parse().ok())
}

/// The display's presented count of the guest named `video`.
pub(super) fn presented(control: &Target) -> Result<u64, CliError> {
    Ok(crate::top::sample(control, None)?
        .into_iter()
        .find(|g| g.name == "video")
        .map_or(0, |g| g.presented))
}

/// How one multimedia run is set up.
#[derive(Debug, Clone, Copy)]
pub(super) struct MultimediaRun {
    pub kind: Kind,
    pub hog: HogKind,
    pub hogs: usize,
    /// The daemon steers CPU weights (`--cpu-cgroup`).
    pub cpu_weight: bool,
}

/// The daemon of one multimedia run: `r.kind`'s scheduler, a policy whose guest `video`
/// is of the multimedia class, a display of `display` size, and with `r.cpu_weight` CPU
/// weights steered under a cgroup of the bench's own. Its policy file goes when dropped.
pub(super) struct RunDaemon {
    pub d: DaemonProcess,
    pub target: String,
    pub control: Target,
    /// The `--cpu-cgroup` name.
    pub cgroup: String,
    policy: std::path::PathBuf,
}

impl RunDaemon {
    pub(super) fn start(r: &MultimediaRun, display: &str) -> Result<RunDaemon, CliError> {
        let pid = std::process::id();
        let policy = std::env::temp_dir().join(format!("virtsoc-bench-policy-{pid}.toml"));
        std::fs::write(&policy, "[guest.video]\nclass = \"multimedia\"\n")?;
        let policy_arg = policy.display().to_string();
        let cgroup = format!("virtsoc-bench-{pid}");
        let mut args = vec![
            "--scheduler",
            r.kind.name(),
            "--policy",
            &policy_arg,
            "--display-size",
            display,
        ];
        if r.cpu_weight {
            args.extend(["--cpu-cgroup", &cgroup]);
        }
        let d = DaemonProcess::spawn(&args, false)?;
        let target = d.endpoint().target;
        let control = Target::Unix(control_path(std::path::Path::new(&target)));
        Ok(RunDaemon {
            d,
            target,
            control,
            cgroup,
            policy,
        })
    }

    /// The video guest's CPU weight now, when the daemon steers weights.
    pub(super) fn video_weight(&self, r: &MultimediaRun) -> Result<Option<u64>, CliError> {
        if !r.cpu_weight {
            return Ok(None);
        }
        Ok(crate::top::sample(&self.control, None)?
            .into_iter()
            .find(|g| g.name == "video")
            .and_then(|g| cpu_weight(&self.cgroup, g.id)))
    }

    /// Stops the daemon.
    pub(super) fn stop(self) -> Result<(), CliError> {
        let _ = std::fs::remove_file(&self.policy);
        self.d.stop().map(|_| ())
    }
}

/// One multimedia run: the video guest against `hogs` hogs under `kind`.
pub(super) fn run_multimedia(r: MultimediaRun, seconds: u64) -> Result<MultimediaRow, CliError> {
    let rd = RunDaemon::start(&r, "1280x720")?;
    let (target, control) = (rd.target.clone(), rd.control.clone());
    let gpu_hogs = if r.hog == HogKind::Gpu { r.hogs } else { 0 };
    let warm = Barrier::new(gpu_hogs + 2);
    let stop = AtomicBool::new(false);
    let done: Vec<AtomicU64> = (0..gpu_hogs).map(|_| AtomicU64::new(0)).collect();
    let names: Vec<String> = (0..gpu_hogs).map(|i| format!("hog-{i}")).collect();
    let video_frames = AtomicU64::new(0);
    let cpu_frame = r.hog == HogKind::Cpu;
    let result = std::thread::scope(|s| {
        let mut handles: Vec<_> = (0..gpu_hogs)
            .map(|i| {
                let (t, name, warm, stop, done) = (&target, &names[i], &warm, &stop, &done[i]);
                s.spawn(move || {
                    let ctl = Control {
                        gate: None,
                        stop,
                        done,
                        deep: None,
                        times: None,
                    };
                    gpu::guest(t, name, gpu::Load::closed_loop(HOG_SIZE), warm, ctl)
                })
            })
            .collect();
        let (t, warm_v, stop_v, frames) = (&target, &warm, &stop, &video_frames);
        handles.push(s.spawn(move || video(t, "video", cpu_frame, warm_v, stop_v, frames)));
        warm.wait();
        let measured = (|| -> Result<_, CliError> {
            let _spinners = CpuHogs::spawn(&target, if cpu_frame { r.hogs } else { 0 })?;
            // Let the feedback loop see the guest (its fast start is one second).
            std::thread::sleep(Duration::from_secs(2));
            let f0 = presented(&control)?;
            let c0: u64 = done.iter().map(|c| c.load(Ordering::Relaxed)).sum();
            let t0 = Instant::now();
            std::thread::sleep(Duration::from_secs(seconds));
            let f1 = presented(&control)?;
            let c1: u64 = done.iter().map(|c| c.load(Ordering::Relaxed)).sum();
            let secs = t0.elapsed().as_secs_f64();
            let weight = rd.video_weight(&r)?;
            Ok(((f1 - f0) as f64 / secs, (c1 - c0) as f64 / secs, weight))
        })();
        stop_guests(&stop, &[], handles)?;
        measured
    });
    rd.stop()?;
    let (fps, hog_rate, weight) = result?;
    Ok(MultimediaRow {
        scheduler: r.kind.name().to_string(),
        hogs: r.hogs,
        hog_kind: r.hog,
        cpu_weight: r.cpu_weight,
        video_cpu_weight: weight,
        dfr_pct: fps / VIDEO_FPS * 100.0,
        presented_fps: fps,
        hog_commands_per_s: hog_rate,
    })
}
