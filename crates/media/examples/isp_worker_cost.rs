//! What the ISP's worker process costs per frame: the median time of one 1920x1080 NV12 ->
//! RGBA conversion by libswscale in this process and in a sandboxed worker
//! ([`ProcessIsp`]), in alternating rounds (so that a change in the machine's load hits both
//! alike), next to the time of the two copies the worker adds (the source into the shared
//! buffer, the result out of it). Prints the load average before and after: on a busy
//! machine the numbers are noisy.
//!
//! `cargo run --release -p virtsoc-media --example isp_worker_cost [-- ROUNDS]`
//! (the example is also its own worker: `isp_worker_cost --isp-worker`).

use std::time::Instant;

use virtsoc_media::isp::{measure_convert_ms, serve_isp, ISP_WORKER_ARG};
use virtsoc_media::{FrameLayout, PixelFormat, ProcessIsp, SwscaleIsp, WorkerPool};

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

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if std::env::args().nth(1).as_deref() == Some(ISP_WORKER_ARG) {
        serve_isp()?;
        return Ok(());
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
    let copies = copy_ms(src.size(), 60) + copy_ms(dst.size(), 60);
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
    Ok(())
}
