//! `virtsoc bench devices`: per-frame cost of the real devices, measured through the daemon
//! (requests, SVM accesses and all): H.264 decode rate at 1920x1080 and 3840x2160, ISP
//! conversion NV12 -> RGBA, and GPU composition of a video and a UI layer.

use std::time::Instant;

use serde::Serialize;
use virtsoc_guest::devices as api;
use virtsoc_guest::{ConnectOptions, Connection, Format};

use crate::bench_svm::OrderingMode;
use crate::scenario::pipe::Pipe;
use crate::scenario::{full_layer, media};
use crate::stats::percentile;
use crate::CliError;

/// One measured size.
#[derive(Debug, Clone, Serialize)]
pub struct DeviceNumbers {
    pub resolution: String,
    /// Frames decoded per second (decode + receive into an NV12 region, one at a time).
    pub decode_fps: f64,
    /// Median ISP NV12 -> RGBA conversion, ms per frame (as the guest sees it).
    pub isp_ms: f64,
    /// Median GPU composition (NV12 video + RGBA UI into RGBA), ms per frame as the guest
    /// sees it, and the GPU backend's own time.
    pub gpu_composite_ms: f64,
    pub gpu_backend_ms: f64,
}

/// Runs the measurements at each `(width, height)`.
pub fn run(
    target: &str,
    sizes: &[(u32, u32)],
    frames: usize,
) -> Result<Vec<DeviceNumbers>, CliError> {
    sizes
        .iter()
        .map(|&(w, h)| one(target, w, h, frames))
        .collect()
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
        resolution: format!("{w}x{h}"),
        decode_fps,
        isp_ms: percentile(&isp, 50.0),
        gpu_composite_ms: percentile(&gpu, 50.0),
        gpu_backend_ms: percentile(&gpu_own, 50.0),
    })
}

/// Prints the numbers as a table.
pub fn print_table(rs: &[DeviceNumbers]) {
    println!(
        "{:<10} {:>11} {:>13} {:>15} {:>15}",
        "size", "decode fps", "isp ms/frame", "gpu ms/frame", "gpu own ms"
    );
    for r in rs {
        println!(
            "{:<10} {:>11.1} {:>13.2} {:>15.2} {:>15.2}",
            r.resolution, r.decode_fps, r.isp_ms, r.gpu_composite_ms, r.gpu_backend_ms
        );
    }
}
