//! Drives one [`WgpuBackend`] from several threads at once, as the daemon does: uploads,
//! asynchronous compositions with completion callbacks, blocking readbacks, non-blocking and
//! blocking completion checks. It checks every readback's pixels, and is meant to be run in
//! a loop against a driver suspected of corrupting memory under concurrency (a crash ends
//! the process).
//!
//! `cargo run --release -p virtsoc-gpu --example gpu_stress -- [SECONDS] [THREADS]`

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use virtsoc_gpu::{FrameLayout, ImageLayer, PixelFormat, Rect, WgpuBackend};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let seconds: f64 = args.next().map_or(Ok(20.0), |s| s.parse())?;
    let threads: usize = args.next().map_or(Ok(6), |s| s.parse())?;
    let gpu = Arc::new(WgpuBackend::new()?);
    println!("adapter: {}", gpu.adapter_info());
    let until = Instant::now() + Duration::from_secs_f64(seconds);
    let ops = Arc::new(AtomicU64::new(0));
    let callbacks = Arc::new(AtomicU64::new(0));
    let mut joins = Vec::new();
    for t in 0..threads {
        let (gpu, ops, callbacks) = (gpu.clone(), ops.clone(), callbacks.clone());
        joins.push(std::thread::spawn(move || -> Result<(), String> {
            let e = |e: virtsoc_gpu::GpuError| format!("thread {t}: {e}");
            let sizes = [(64, 48), (320, 240), (1280, 720), (1920, 1080)];
            let (w, h) = sizes[t % sizes.len()];
            let (w, h) = (w + 16 * t as u32, h + 8 * t as u32);
            let rgba = FrameLayout::packed(PixelFormat::Rgba8, w, h).map_err(|e| e.to_string())?;
            let mut src = gpu.create_image(rgba).map_err(e)?;
            let mut dst = gpu.create_image(rgba).map_err(e)?;
            let mut bytes = vec![0u8; rgba.size()];
            let mut back = vec![0u8; rgba.size()];
            let mut i = 0u32;
            while Instant::now() < until {
                i = i.wrapping_add(1);
                if i.is_multiple_of(16) {
                    // Images come and go with the guests' regions, often while work that
                    // used them is still queued.
                    src = gpu.create_image(rgba).map_err(e)?;
                    dst = gpu.create_image(rgba).map_err(e)?;
                }
                let v = (i as u8).wrapping_mul(7).wrapping_add(t as u8);
                bytes.iter_mut().for_each(|b| *b = v);
                gpu.write_image(&src, 0, &bytes).map_err(e)?;
                let layer = ImageLayer::new(&src, Rect::full(w, h)).with_blend(false);
                let id = gpu.submit_composite_images(&[layer], &dst).map_err(e)?;
                let c = callbacks.clone();
                gpu.on_submission_done(
                    id,
                    Box::new(move |_| {
                        c.fetch_add(1, Ordering::Relaxed);
                    }),
                );
                match i % 4 {
                    0 => gpu.wait_submission(id).map_err(e)?,
                    1 => {
                        let _ = gpu.completed_submission();
                    }
                    _ => {}
                }
                if i.is_multiple_of(2) {
                    gpu.read_image(&dst, 0, &mut back).map_err(e)?;
                    if back.iter().any(|b| *b != v) {
                        return Err(format!("thread {t}: readback {i} differs"));
                    }
                }
                ops.fetch_add(1, Ordering::Relaxed);
            }
            Ok(())
        }));
    }
    let mut failed = false;
    for j in joins {
        if let Err(m) = j.join().map_err(|_| "a thread panicked".to_string())? {
            eprintln!("{m}");
            failed = true;
        }
    }
    gpu.wait_submission(gpu.last_submission())?;
    println!(
        "{} compositions, {} callbacks, {} threads, {seconds} s, {} device polls off the poller",
        ops.load(Ordering::Relaxed),
        callbacks.load(Ordering::Relaxed),
        threads,
        gpu.polls_off_poller()
    );
    if failed || gpu.polls_off_poller() > 0 {
        std::process::exit(1);
    }
    Ok(())
}
