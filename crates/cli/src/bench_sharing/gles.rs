//! Part (b) of `virtsoc bench sharing` with OpenGL ES (`--hog-kind gles`): the video guest
//! is a GLES app, `virtsoc run gles-video`'s guest (H.264 decoded on the codec, drawn through
//! an EGLImage with a UI layer, presented with an acquire fence; 640x360 at 30 fps, its
//! connection named `video`, the policy's `multimedia` class), next to `hogs` unmodified
//! `glmark2-es2` instances rendering through virtsoc as fast as they can (`jellyfish`,
//! off-screen, under an Xvfb of the bench's), each a guest of its own (`hog-N`).
//!
//! On a CPU driver the GL's work runs in each guest's render worker, so the device is the
//! CPU those workers get: round robin and the feedback loop order the `gles` device's
//! commands, but the workers of several guests run at once, and only with `--cpu-cgroup`
//! (`cpu_weight`) does the video guest's raised share reach its render worker's CPU weight
//! (the workers join their guests' groups). The row is what the video guest got: the frames
//! the display counted for it, as a percentage of 30 per second.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use virtsoc_control::client::{request, Target};
use virtsoc_control::GuestInfo;

use super::multimedia::{presented, MultimediaRun, RunDaemon};
use super::{MultimediaRow, VIDEO_FPS};
use crate::bench_gles::env::{die_with_parent, require, write_vendor_json, Display};
use crate::CliError;

/// The glmark2 scene the hogs loop: fragment-heavy, seconds of work per frame on llvmpipe.
const HOG_SCENE: &str = "jellyfish";

/// Child processes killed (and waited for) when dropped.
struct Children(Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Requests the `gles` device answered for the guests named `hog-*`.
fn hog_requests(control: &Target) -> Result<u64, CliError> {
    let r = request(control, "GET", "/guests", b"")?;
    let guests: Vec<GuestInfo> = serde_json::from_str(&r.body)?;
    Ok(guests
        .iter()
        .filter(|g| g.name.starts_with("hog-"))
        .filter_map(|g| g.device_use.get("gles"))
        .map(|u| u.requests)
        .sum())
}

/// One run: the GLES video guest against `r.hogs` glmark2-es2 hogs under `r.kind`.
pub(super) fn run_gles(r: MultimediaRun, seconds: u64) -> Result<MultimediaRow, CliError> {
    require("glmark2-es2", "glmark2-es2-x11")?;
    let json = write_vendor_json()?;
    let display = Display::open()?;
    let rd = RunDaemon::start(&r, "640x360")?;
    let (target, control) = (rd.target.clone(), rd.control.clone());
    let gl_env = |c: &mut Command, name: &str| {
        die_with_parent(c);
        c.env("__EGL_VENDOR_LIBRARY_FILENAMES", &json)
            .env("VIRTSOC_SOCKET", &target)
            .env("VIRTSOC_NAME", name)
            .env("MESA_SHADER_CACHE_DISABLE", "true")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
    };
    let result = (|| -> Result<_, CliError> {
        let mut hogs = Children(Vec::new());
        for i in 0..r.hogs {
            let mut c = Command::new("glmark2-es2");
            c.args(["--off-screen", "--run-forever", "-b", HOG_SCENE])
                .env("DISPLAY", &display.name);
            gl_env(&mut c, &format!("hog-{i}"));
            hogs.0.push(c.spawn()?);
        }
        // The video guest: the gles-video scenario's guest (ended with its parent here).
        let warmup = Duration::from_secs(2);
        let mut video = Command::new(std::env::current_exe()?);
        video.args([
            "run",
            "gles-video",
            "--socket",
            &target,
            "--resolution",
            "360p",
            "--fps",
            "30",
            "--protocol",
            "prefetch",
            "--ordering",
            "fence",
            "--seconds",
            "600",
            "--json",
        ]);
        gl_env(&mut video, "video");
        let video = Children(vec![video.spawn()?]);
        // Its first frame (after the clip is made, or found made), then a warm-up: the
        // feedback loop's fast start is one second.
        let t = Instant::now();
        while presented(&control)? == 0 {
            if t.elapsed() > Duration::from_secs(120) {
                return Err(CliError::Usage(
                    "the GLES video guest presented nothing".into(),
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        std::thread::sleep(warmup);
        let (f0, h0) = (presented(&control)?, hog_requests(&control)?);
        let t0 = Instant::now();
        std::thread::sleep(Duration::from_secs(seconds));
        let (f1, h1) = (presented(&control)?, hog_requests(&control)?);
        let secs = t0.elapsed().as_secs_f64();
        let weight = rd.video_weight(&r)?;
        drop(video);
        drop(hogs);
        Ok((
            f1.saturating_sub(f0) as f64 / secs,
            h1.saturating_sub(h0) as f64 / secs,
            weight,
        ))
    })();
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
