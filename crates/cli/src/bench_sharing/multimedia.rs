//! Parts (b) and (c) of `virtsoc bench sharing`: a 30 fps video guest against GPU hogs, and
//! app guests alone and two together.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use virtsoc_control::client::{control_path, Target};
use virtsoc_guest::devices as api;
use virtsoc_guest::Format;
use virtsoc_sched::Kind;

use super::{guest, MultimediaRow, HOG_SIZE, VIDEO_FPS};
use crate::bench_svm::OrderingMode;
use crate::daemon_proc::DaemonProcess;
use crate::scenario::full_layer;
use crate::scenario::pipe::Pipe;
use crate::CliError;

/// `n` app guests together under `kind`: each guest's frames per second.
pub(super) fn run_apps(kind: Kind, n: usize, seconds: u64) -> Result<Vec<f64>, CliError> {
    let d = DaemonProcess::spawn(
        &["--scheduler", kind.name(), "--display-size", "1280x720"],
        false,
    )?;
    let target = d.endpoint().target;
    let warm = Barrier::new(n + 1);
    let stop = AtomicBool::new(false);
    let frames: Vec<AtomicU64> = (0..n).map(|_| AtomicU64::new(0)).collect();
    let names: Vec<String> = (0..n).map(|i| format!("app-{i}")).collect();
    let r = std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|i| {
                let (t, name, warm, stop, f) = (&target, &names[i], &warm, &stop, &frames[i]);
                s.spawn(move || video(t, name, warm, stop, f))
            })
            .collect();
        warm.wait();
        std::thread::sleep(Duration::from_secs(1));
        let f0: Vec<u64> = frames.iter().map(|f| f.load(Ordering::Relaxed)).collect();
        let t0 = Instant::now();
        std::thread::sleep(Duration::from_secs(seconds));
        let secs = t0.elapsed().as_secs_f64();
        let fps: Vec<f64> = frames
            .iter()
            .zip(&f0)
            .map(|(f, z)| (f.load(Ordering::Relaxed) - z) as f64 / secs)
            .collect();
        stop.store(true, Ordering::Relaxed);
        for h in handles {
            match h.join() {
                Ok(r) => r?,
                Err(_) => return Err(CliError::Usage("a guest thread panicked".into())),
            }
        }
        Ok(fps)
    });
    d.stop()?;
    r
}

/// The video guest: a 1280x720 GPU composition presented on the display every 1/30 s.
fn video(
    target: &str,
    name: &str,
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
    while !stop.load(Ordering::Relaxed) {
        let dst = outs[i % outs.len()];
        i += 1;
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

/// The display's presented count of the guest named `video`.
fn presented(control: &Target) -> Result<u64, CliError> {
    Ok(crate::top::sample(control, None)?
        .into_iter()
        .find(|g| g.name == "video")
        .map_or(0, |g| g.presented))
}

/// One multimedia run: the video guest against `hogs` GPU hogs under `kind`.
pub(super) fn run_multimedia(
    kind: Kind,
    hogs: usize,
    seconds: u64,
) -> Result<MultimediaRow, CliError> {
    let policy =
        std::env::temp_dir().join(format!("virtsoc-bench-policy-{}.toml", std::process::id()));
    std::fs::write(&policy, "[guest.video]\nclass = \"multimedia\"\n")?;
    let policy_arg = policy.display().to_string();
    let d = DaemonProcess::spawn(
        &[
            "--scheduler",
            kind.name(),
            "--policy",
            &policy_arg,
            "--display-size",
            "1280x720",
        ],
        false,
    )?;
    let target = d.endpoint().target;
    let control = Target::Unix(control_path(std::path::Path::new(&target)));
    let warm = Barrier::new(hogs + 2);
    let stop = AtomicBool::new(false);
    let done: Vec<AtomicU64> = (0..hogs).map(|_| AtomicU64::new(0)).collect();
    let names: Vec<String> = (0..hogs).map(|i| format!("hog-{i}")).collect();
    let video_frames = AtomicU64::new(0);
    let result = std::thread::scope(|s| {
        let mut handles: Vec<_> = (0..hogs)
            .map(|i| {
                let (t, name, warm, stop, done) = (&target, &names[i], &warm, &stop, &done[i]);
                s.spawn(move || guest(t, name, HOG_SIZE, warm, stop, done))
            })
            .collect();
        let (t, warm_v, stop_v, frames) = (&target, &warm, &stop, &video_frames);
        handles.push(s.spawn(move || video(t, "video", warm_v, stop_v, frames)));
        warm.wait();
        let measured = (|| -> Result<_, CliError> {
            // Let the feedback loop see the guest (its fast start is one second).
            std::thread::sleep(Duration::from_secs(2));
            let f0 = presented(&control)?;
            let c0: u64 = done.iter().map(|c| c.load(Ordering::Relaxed)).sum();
            let t0 = Instant::now();
            std::thread::sleep(Duration::from_secs(seconds));
            let f1 = presented(&control)?;
            let c1: u64 = done.iter().map(|c| c.load(Ordering::Relaxed)).sum();
            let secs = t0.elapsed().as_secs_f64();
            Ok(((f1 - f0) as f64 / secs, (c1 - c0) as f64 / secs))
        })();
        stop.store(true, Ordering::Relaxed);
        for h in handles {
            match h.join() {
                Ok(r) => r?,
                Err(_) => return Err(CliError::Usage("a guest thread panicked".into())),
            }
        }
        measured
    });
    d.stop()?;
    let _ = std::fs::remove_file(&policy);
    let (fps, hog_rate) = result?;
    Ok(MultimediaRow {
        scheduler: kind.name().to_string(),
        hogs,
        dfr_pct: fps / VIDEO_FPS * 100.0,
        presented_fps: fps,
        hog_commands_per_s: hog_rate,
    })
}
