//! What a worker process costs per frame: the median time of one 1920x1080 NV12 -> RGBA
//! conversion by libswscale in this process and in a sandboxed worker ([`ProcessIsp`]), and
//! of one 1920x1080 NV12 frame encoded by libx264 (veryfast) in this process and in a worker
//! ([`ProcessEncoder`]), in alternating rounds (so that a change in the machine's load hits
//! both alike), next to the time of the copies the workers add (the ISP: the source into the
//! shared buffer and the result out of it; the encoder: the frame in). Prints the load
//! average before and after: on a busy machine the numbers are noisy.
//!
//! `cargo run --release -p virtsoc-media --example worker_cost [-- ROUNDS]` (the example is
//! also its own worker: `worker_cost --isp-worker`, `worker_cost --codec-worker`).

use std::time::Instant;

use virtsoc_media::codec::serve_decoder;
use virtsoc_media::isp::{measure_convert_ms, serve_isp, ISP_WORKER_ARG};
use virtsoc_media::{
    EncoderBackend, EncoderPreset, FfmpegEncoder, FrameLayout, FrameRef, PixelFormat,
    ProcessEncoder, ProcessIsp, SwscaleIsp, WorkerPool,
};

/// The codec worker's argument, as `virtsocd` takes it.
const CODEC_WORKER_ARG: &str = "--codec-worker";

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// Median time in ms of copying `n` bytes between buffers that do not stay in cache.
fn copy_ms(n: usize, iterations: usize) -> f64 {
    let srcs: Vec<Vec<u8>> = (0..3u8).map(|k| vec![k; n]).collect();
    let mut dsts: Vec<Vec<u8>> = (0..3).map(|_| vec![0u8; n]).collect();
    let times = (0..iterations)
        .map(|i| {
            let t = Instant::now();
            dsts[i % 3].copy_from_slice(&srcs[i % 3]);
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    std::hint::black_box(&dsts);
    median(times)
}

/// Median time in ms of encoding one of `frames` distinct 1080p NV12 frames with `e` (after
/// `warm` frames), each round a new stream.
fn encode_ms(e: &mut dyn EncoderBackend, frames: &[Vec<u8>], warm: usize) -> f64 {
    let l = FrameLayout::packed(PixelFormat::Nv12, 1920, 1080).expect("1080p NV12");
    let mut times = Vec::new();
    for (i, f) in frames.iter().enumerate() {
        let frame = FrameRef::new(l, f).expect("a whole frame");
        let t = Instant::now();
        e.encode(frame, i as i64).expect("encoded");
        if i >= warm {
            times.push(t.elapsed().as_secs_f64() * 1e3);
        }
    }
    median(times)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    match std::env::args().nth(1).as_deref() {
        Some(ISP_WORKER_ARG) => return Ok(serve_isp()?),
        Some(CODEC_WORKER_ARG) => return Ok(serve_decoder()?),
        _ => {}
    }
    let rounds: usize = std::env::args()
        .nth(1)
        .map(|r| r.parse())
        .transpose()?
        .unwrap_or(5);
    let src = FrameLayout::packed(PixelFormat::Nv12, 1920, 1080)?;
    let dst = FrameLayout::packed(PixelFormat::Rgba8, 1920, 1080)?;
    let exe = std::env::current_exe()?;
    let worker = ProcessIsp::new(WorkerPool::new(&exe, &[ISP_WORKER_ARG.to_string()], 1));
    let local = SwscaleIsp::new();
    println!("load average before: {}", loadavg());
    let (mut here, mut there) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        here.push(measure_convert_ms(&local, src, dst, 30)?);
        there.push(measure_convert_ms(&worker, src, dst, 30)?);
    }
    // The encoder: 30 distinct frames a round (a moving ramp), the first 5 not counted.
    let frames: Vec<Vec<u8>> = (0..30)
        .map(|i| {
            (0..src.size())
                .map(|k| ((k % 1920 + k / 1920 + 4 * i) & 0xff) as u8)
                .collect()
        })
        .collect();
    let codec = WorkerPool::new(&exe, &[CODEC_WORKER_ARG.to_string()], 1);
    let open = (1920, 1080, 30, 4_000_000, EncoderPreset::Veryfast);
    let (mut enc_here, mut enc_there) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let mut e = FfmpegEncoder::new_h264_with(open.0, open.1, open.2, open.3, open.4)?;
        enc_here.push(encode_ms(&mut e, &frames, 5));
        let mut e = ProcessEncoder::open(&codec, (open.0, open.1), (open.2, open.3), open.4)?;
        enc_there.push(encode_ms(&mut e, &frames, 5));
    }
    let copies = copy_ms(src.size(), 60) + copy_ms(dst.size(), 60);
    let frame_copy = copy_ms(src.size(), 60);
    println!("load average after:  {}", loadavg());
    let (h, t) = (median(here.clone()), median(there.clone()));
    println!("rounds (median of 30 conversions each), in process: {here:.2?}");
    println!("rounds (median of 30 conversions each), in a worker: {there:.2?}");
    println!(
        "1920x1080 NV12 -> RGBA: in process {h:.2} ms, in a worker {t:.2} ms: +{:.2} ms ({:+.0}%) per frame",
        t - h,
        (t / h - 1.0) * 100.0
    );
    println!(
        "the worker's two extra copies: source {} bytes + result {} bytes = {} bytes per frame; \
         copying them here takes {copies:.2} ms",
        src.size(),
        dst.size(),
        src.size() + dst.size()
    );
    let (h, t) = (median(enc_here.clone()), median(enc_there.clone()));
    println!("encoder rounds (median of 25 frames each), in process: {enc_here:.2?}");
    println!("encoder rounds (median of 25 frames each), in a worker: {enc_there:.2?}");
    println!(
        "1920x1080 NV12 -> H.264 (libx264 veryfast): in process {h:.2} ms, in a worker {t:.2} ms: {:+.2} ms ({:+.0}%) per frame",
        t - h,
        (t / h - 1.0) * 100.0
    );
    println!(
        "the encoder worker's extra copy: the frame, {} bytes; copying it here takes {frame_copy:.2} ms",
        src.size()
    );
    Ok(())
}
