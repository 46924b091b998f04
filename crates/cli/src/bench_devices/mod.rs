//! `virtsoc bench devices`: per-frame cost of the real devices, measured through the daemon
//! (requests, SVM accesses and all): H.264 decode rate at 1920x1080 and 3840x2160, ISP
//! conversion NV12 -> RGBA, and GPU composition of a video and a UI layer.
//!
//! Next to those, the GPU's own numbers on resident images: the device floor (the fastest
//! full-screen NV12 -> RGBA pass, render or compute) and the resident composition (NV12 video
//! and RGBA UI, no upload or readback). They come from a `WgpuBackend` created in this bench
//! process, which runs on the same machine and picks the same device kind as the daemon (the
//! same wgpu adapter selection; lavapipe on a CPU-only host), so they are what the daemon's
//! GPU device achieves once its replicas are resident.
//!
//! Decoding is measured on two clips generated at run time: `flat` (x264 ultrafast, CAVLC,
//! no B-frames: cheap to decode) and `real` (x264 medium: CABAC, B-frames, several
//! references, testsrc2 with noise). Each is decoded through the daemon, several packets in
//! flight as a player keeps them ([`decode`]), and, in the same run on the same packets, by
//! libavcodec alone in this process (the worker's model: one decoder with the daemon's
//! default thread count, pictures left in libavcodec's buffers): the ratio is virtsoc's
//! decode rate over native. A per-frame breakdown in CPU time of each process tells where
//! the time goes that is not decoding (see [`decode::Stages`]).
//!
//! `--json` prints `{"sizes": [{"width", "height", "decode_fps", "native_decode_fps",
//! "decode": [{"clip", ...}], "composite_ms", "floor_ms", ...}]}`.

use std::time::Instant;

use serde::Serialize;
use virtsoc_gpu::WgpuBackend;
use virtsoc_guest::devices as api;
use virtsoc_guest::{ConnectOptions, Connection, Format};

use crate::bench_svm::OrderingMode;
use crate::scenario::pipe::Pipe;
use crate::scenario::{full_layer, media};
use crate::stats::percentile;
use crate::CliError;

pub mod decode;

use decode::{decode_clip, DecodeNumbers};

/// What `bench devices` reports (`--json` prints it as is).
#[derive(Debug, Clone, Serialize)]
pub struct DeviceBench {
    /// The wgpu adapter of the bench's own GPU measurements, if any.
    pub adapter: Option<String>,
    pub sizes: Vec<DeviceNumbers>,
}

/// One measured size.
#[derive(Debug, Clone, Serialize)]
pub struct DeviceNumbers {
    pub width: u32,
    pub height: u32,
    pub resolution: String,
    /// Frames decoded per second of the `flat` clip (decode + receive into an NV12 region,
    /// several packets in flight).
    pub decode_fps: f64,
    /// libavcodec alone on the same packets, in the same run: frames per second.
    pub native_decode_fps: f64,
    /// Every clip's decode numbers (`flat` first).
    pub decode: Vec<DecodeNumbers>,
    /// Median ISP NV12 -> RGBA conversion, ms per frame (as the guest sees it).
    pub isp_ms: f64,
    /// Median GPU composition (NV12 video + RGBA UI into RGBA), ms per frame as the guest
    /// sees it, and the GPU backend's own time.
    pub gpu_composite_ms: f64,
    pub gpu_backend_ms: f64,
    /// Composition (NV12 video + RGBA UI into RGBA) on resident images, submission to
    /// completion, median ms (`gpu_resident_ms`); null without a wgpu adapter.
    pub composite_ms: Option<f64>,
    pub gpu_resident_ms: Option<f64>,
    /// The device floor: the faster of `floor_render_ms` (one full-screen textured pass) and
    /// `floor_compute_ms` (a compute pass, several pixels per invocation), NV12 -> RGBA on
    /// resident images, median ms; null without a wgpu adapter.
    pub floor_ms: Option<f64>,
    pub floor_render_ms: Option<f64>,
    pub floor_compute_ms: Option<f64>,
}

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The resident-image numbers of the bench's own GPU backend at the size of `n` (left null,
/// with a warning, if that backend fails).
fn local_gpu(gpu: Option<&WgpuBackend>, n: &mut DeviceNumbers) {
    let Some(gpu) = gpu else { return };
    let (w, h) = (n.width, n.height);
    match (
        gpu.measure_composite_resident(w, h),
        gpu.measure_floor(w, h),
    ) {
        (Ok(resident), Ok(floor)) => {
            n.composite_ms = Some(ms(resident));
            n.gpu_resident_ms = Some(ms(resident));
            n.floor_ms = Some(ms(floor.floor));
            n.floor_render_ms = Some(ms(floor.render));
            n.floor_compute_ms = Some(ms(floor.compute));
        }
        (r, f) => log::warn!("bench devices: local GPU at {w}x{h}: {r:?} {f:?}"),
    }
}

/// Runs the measurements at each `(width, height)` against the daemon at `target` (whose
/// process id `daemon`, when known, lets the decode breakdown count its CPU time).
/// `separate`: the player queues each region's accesses as requests of their own.
pub fn run(
    target: &str,
    daemon: Option<u32>,
    sizes: &[(u32, u32)],
    (frames, rounds): (usize, usize),
    separate: bool,
) -> Result<DeviceBench, CliError> {
    let gpu = match WgpuBackend::new() {
        Ok(g) => Some(g),
        Err(e) => {
            log::warn!("bench devices: no local GPU measurements: {e}");
            None
        }
    };
    let mut out = Vec::with_capacity(sizes.len());
    for &(w, h) in sizes {
        let mut n = one(target, daemon, (w, h), (frames, rounds), separate)?;
        local_gpu(gpu.as_ref(), &mut n);
        out.push(n);
    }
    Ok(DeviceBench {
        adapter: gpu.as_ref().map(|g| g.adapter_info().to_string()),
        sizes: out,
    })
}

/// One size's numbers: each clip decoded in `rounds` rounds (through the daemon, then
/// natively), then the ISP and the GPU.
fn one(
    target: &str,
    daemon: Option<u32>,
    (w, h): (u32, u32),
    (frames, rounds): (usize, usize),
    separate: bool,
) -> Result<DeviceNumbers, CliError> {
    let conn = Connection::open(
        target,
        &ConnectOptions {
            name: format!("bench-devices-{w}x{h}"),
            coherence: Some("prefetch".into()),
            window_size: (w as u64 * h as u64 * 4 * 8 + (64 << 20)).min(1 << 30),
            ..ConnectOptions::default()
        },
    )?;
    let mut decode = Vec::new();
    for clip in CLIPS {
        let units = media::load_units(&clip_path(clip, w, h)?)?;
        let units = &units[..frames.min(units.len()).max(1)];
        let how = (rounds, separate);
        decode.push(decode_clip(target, daemon, clip, units, (w, h), how)?);
    }
    let mut p = Pipe::new(&conn, OrderingMode::Atomic);
    // A frame of mid-grey video (what is in it does not change the ISP's or the GPU's cost).
    let frame = conn.alloc(0, w, h, Format::Nv12, 0)?.id;
    p.cpu_write(frame, &vec![128u8; (w * h * 3 / 2) as usize])?;
    let n = frames.max(1);
    let rgba = conn.alloc(0, w, h, Format::Rgba8, 0)?.id;
    let ui = conn.alloc(0, w, h, Format::Rgba8, 0)?.id;
    let out = conn.alloc(0, w, h, Format::Rgba8, 0)?.id;
    p.cpu_write(ui, &vec![0u8; (w * h * 4) as usize])?;
    let layers = conn.alloc_blob(2 * api::LAYER_RECORD as u64)?.id;
    let mut blob = full_layer(frame, w, h, false).to_bytes().to_vec();
    blob.extend_from_slice(&full_layer(ui, w, h, true).to_bytes());
    p.cpu_write(layers, &blob)?;
    let (mut isp, mut gpu, mut gpu_own) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..n.min(20) {
        let t = Instant::now();
        p.run(&api::isp::Convert {
            src: frame,
            dst: rgba,
        })?;
        isp.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        let r = p.run_with(
            &api::gpu::Composite {
                layers,
                count: 2,
                dst: out,
            },
            &[frame, ui],
        )?;
        gpu.push(t.elapsed().as_secs_f64() * 1e3);
        gpu_own.push(p.result(r)?.gpu_us as f64 / 1e3);
    }
    Ok(DeviceNumbers {
        width: w,
        height: h,
        resolution: format!("{w}x{h}"),
        decode_fps: decode[0].decode_fps,
        native_decode_fps: decode[0].native_decode_fps,
        decode,
        isp_ms: percentile(&isp, 50.0),
        gpu_composite_ms: percentile(&gpu, 50.0),
        gpu_backend_ms: percentile(&gpu_own, 50.0),
        composite_ms: None,
        gpu_resident_ms: None,
        floor_ms: None,
        floor_render_ms: None,
        floor_compute_ms: None,
    })
}

/// The clips decoding is measured on: cheap, then realistic.
const CLIPS: [&str; 2] = ["flat", "real"];
/// Seconds of each generated clip (30 fps).
const CLIP_SECONDS: u32 = 4;

/// The clip `kind` at `w` x `h`: `flat` is the scenarios' test clip; `real` is generated
/// here (and cached beside it) with x264's medium preset: CABAC, B-frames, several
/// references, testsrc2 with temporal noise; access-unit delimiters split it into packets.
fn clip_path(kind: &str, w: u32, h: u32) -> Result<std::path::PathBuf, CliError> {
    if kind != "real" {
        return media::clip(kind, w, h, 30, CLIP_SECONDS);
    }
    // A broadcast-like rate (8 Mbit/s at 1080p, by pixels): the noise is coded at the
    // quality that rate allows, as a camera's grain is, not losslessly.
    let kbps = (u64::from(w) * u64::from(h) * 4 / 1000).max(500);
    let dir = media::data_dir();
    std::fs::create_dir_all(&dir)?;
    let path = dir.join(format!("real-{w}x{h}-30fps-{CLIP_SECONDS}s-{kbps}k.h264"));
    if path.exists() {
        return Ok(path);
    }
    let tmp = path.with_extension("tmp.h264");
    let src = format!("testsrc2=size={w}x{h}:rate=30,noise=alls=8:allf=t");
    let (rate, buf) = (format!("{kbps}k"), format!("{}k", kbps * 2));
    let out = std::process::Command::new("ffmpeg")
        .args(["-nostdin", "-loglevel", "error", "-y", "-f", "lavfi", "-i"])
        .arg(&src)
        .args(["-t", &CLIP_SECONDS.to_string(), "-c:v", "libx264"])
        .args(["-preset", "medium", "-x264-params", "aud=1"])
        .args(["-b:v", &rate, "-maxrate", &rate, "-bufsize", &buf])
        .args(["-pix_fmt", "yuv420p", "-g", "60", "-f", "h264"])
        .arg(&tmp)
        .output()
        .map_err(|e| CliError::Usage(format!("cannot run ffmpeg: {e}")))?;
    if !out.status.success() {
        return Err(CliError::Usage(format!(
            "ffmpeg failed: {}",
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    std::fs::rename(&tmp, &path)?;
    Ok(path)
}

/// Prints the numbers as a table, then each clip's decode against native and its stages.
pub fn print_table(b: &DeviceBench) {
    if let Some(a) = &b.adapter {
        println!("local GPU (resident, floor): {a}");
    }
    println!(
        "{:<10} {:>11} {:>11} {:>13} {:>15} {:>15} {:>12} {:>9}",
        "size",
        "decode fps",
        "native fps",
        "isp ms/frame",
        "gpu ms/frame",
        "gpu own ms",
        "resident ms",
        "floor ms"
    );
    let opt = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.2}"));
    for r in &b.sizes {
        println!(
            "{:<10} {:>11.1} {:>11.1} {:>13.2} {:>15.2} {:>15.2} {:>12} {:>9}",
            r.resolution,
            r.decode_fps,
            r.native_decode_fps,
            r.isp_ms,
            r.gpu_composite_ms,
            r.gpu_backend_ms,
            opt(r.gpu_resident_ms),
            opt(r.floor_ms)
        );
    }
    println!();
    println!(
        "decode, us per frame, warm (after an untimed pass): wall time (through the daemon, \
         native) and CPU time (the decoder's worker, the daemon, the guest; native); floor = \
         the CPU time over the cores; open = the guest's open_decoder round trip"
    );
    println!(
        "{:<10} {:<5} {:>7} {:>7} {:>6} {:>7} {:>7} {:>7} {:>7} {:>6} {:>7} {:>7} {:>7} {:>7}",
        "size",
        "clip",
        "fps",
        "native",
        "ratio",
        "total",
        "native",
        "worker",
        "daemon",
        "guest",
        "nat.cpu",
        "floor",
        "copies",
        "open ms"
    );
    for r in &b.sizes {
        for d in &r.decode {
            let s = &d.stages;
            println!(
                "{:<10} {:<5} {:>7.1} {:>7.1} {:>6.2} {:>7.0} {:>7.0} {:>7.0} {:>7.0} {:>6.0} {:>7.0} {:>7.0} {:>7.2} {:>7.1}",
                r.resolution,
                d.clip,
                d.decode_fps,
                d.native_decode_fps,
                d.ratio,
                s.total,
                s.native_decode,
                s.worker_cpu,
                s.daemon_cpu,
                s.guest_cpu,
                s.native_cpu,
                s.cpu_floor,
                s.frame_copies,
                d.open_ms
            );
        }
    }
    println!(
        "per round: ratio (fps through the daemon / libavcodec's pass right after it); the \
         ratio above is their median"
    );
    for r in &b.sizes {
        for d in &r.decode {
            let rounds: Vec<String> = d
                .rounds
                .iter()
                .map(|x| {
                    format!(
                        "{:.2} ({:.0}/{:.0})",
                        x.ratio, x.decode_fps, x.native_decode_fps
                    )
                })
                .collect();
            println!("{:<10} {:<5} {}", r.resolution, d.clip, rounds.join(" "));
        }
    }
    println!(
        "switches per frame (times a thread was put on a CPU, every thread, the kernel's \
         schedstat): through the daemon (worker + daemon + guest), libavcodec alone"
    );
    for r in &b.sizes {
        for d in &r.decode {
            let w = &d.stages.switches;
            println!(
                "{:<10} {:<5} worker {:.1} + daemon {:.1} + guest {:.1} = {:.1}; alone {:.1}",
                r.resolution,
                d.clip,
                w.worker,
                w.daemon,
                w.guest,
                w.worker + w.daemon + w.guest,
                w.native
            );
        }
    }
}
