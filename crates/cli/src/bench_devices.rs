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
//! `--json` prints `{"sizes": [{"width", "height", "composite_ms", "floor_ms", ...}]}`.

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
    /// Frames decoded per second (decode + receive into an NV12 region, one at a time).
    pub decode_fps: f64,
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

/// Runs the measurements at each `(width, height)`.
pub fn run(target: &str, sizes: &[(u32, u32)], frames: usize) -> Result<DeviceBench, CliError> {
    let gpu = match WgpuBackend::new() {
        Ok(g) => Some(g),
        Err(e) => {
            log::warn!("bench devices: no local GPU measurements: {e}");
            None
        }
    };
    let mut out = Vec::with_capacity(sizes.len());
    for &(w, h) in sizes {
        let mut n = one(target, w, h, frames)?;
        local_gpu(gpu.as_ref(), &mut n);
        out.push(n);
    }
    Ok(DeviceBench {
        adapter: gpu.as_ref().map(|g| g.adapter_info().to_string()),
        sizes: out,
    })
}

fn one(target: &str, w: u32, h: u32, frames: usize) -> Result<DeviceNumbers, CliError> {
    let conn = Connection::open(
        target,
        &ConnectOptions {
            name: format!("bench-devices-{w}x{h}"),
            coherence: Some("prefetch".into()),
            window_size: (w as u64 * h as u64 * 4 * 8 + (64 << 20)).min(1 << 30),
            ..ConnectOptions::default()
        },
    )?;
    let mut p = Pipe::new(&conn, OrderingMode::Atomic);
    let units = media::load_units(&media::clip("flat", w, h, 30, 4)?)?;
    let n = frames.min(units.len()).max(1);
    let bits = conn
        .alloc_blob(units.iter().map(Vec::len).max().unwrap_or(1) as u64)?
        .id;
    let frame = conn.alloc(0, w, h, Format::Nv12, 0)?.id;
    let rgba = conn.alloc(0, w, h, Format::Rgba8, 0)?.id;
    let ui = conn.alloc(0, w, h, Format::Rgba8, 0)?.id;
    let out = conn.alloc(0, w, h, Format::Rgba8, 0)?.id;
    p.cpu_write(ui, &vec![0u8; (w * h * 4) as usize])?;
    let layers = conn.alloc_blob(2 * api::LAYER_RECORD as u64)?.id;
    let mut blob = full_layer(frame, w, h, false).to_bytes().to_vec();
    blob.extend_from_slice(&full_layer(ui, w, h, true).to_bytes());
    p.cpu_write(layers, &blob)?;
    let t = p.run(&api::codec::OpenDecoder {
        kind: api::codec_kind::H264,
        format: Format::Nv12 as u64,
        threads: 0,
    })?;
    let handle = p.result(t)?.handle;
    // Decode: the guest writes each packet and takes each frame.
    let t0 = Instant::now();
    let mut decoded = 0;
    for unit in units.iter().take(n) {
        p.cpu_write(bits, unit)?;
        p.run(&api::codec::Decode {
            handle,
            bitstream: bits,
            len: unit.len() as u64,
            pts: 0,
        })?;
        let r = p.run(&api::codec::ReceiveFrame { handle, frame })?;
        decoded += p.result(r)?.got;
    }
    let decode_fps = decoded as f64 / t0.elapsed().as_secs_f64();
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
    p.run(&api::codec::Close { handle })?;
    Ok(DeviceNumbers {
        width: w,
        height: h,
        resolution: format!("{w}x{h}"),
        decode_fps,
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

/// Prints the numbers as a table.
pub fn print_table(b: &DeviceBench) {
    if let Some(a) = &b.adapter {
        println!("local GPU (resident, floor): {a}");
    }
    println!(
        "{:<10} {:>11} {:>13} {:>15} {:>15} {:>12} {:>9}",
        "size",
        "decode fps",
        "isp ms/frame",
        "gpu ms/frame",
        "gpu own ms",
        "resident ms",
        "floor ms"
    );
    let opt = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.2}"));
    for r in &b.sizes {
        println!(
            "{:<10} {:>11.1} {:>13.2} {:>15.2} {:>15.2} {:>12} {:>9}",
            r.resolution,
            r.decode_fps,
            r.isp_ms,
            r.gpu_composite_ms,
            r.gpu_backend_ms,
            opt(r.gpu_resident_ms),
            opt(r.floor_ms)
        );
    }
}
