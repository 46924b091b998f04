//! Prints composition timings (NV12 video + RGBA UI -> RGBA) per backend:
//! the byte API (upload, draw, readback) and, on wgpu, the same composition
//! on resident images plus the device floor (fastest NV12 -> RGBA pass,
//! render and compute).
//!
//! `cargo run --release -p virtsoc-gpu --example gpu_measure [WxH ...] [--cpu] [--render]`
//! (`--render`: the fused composition as a render pass instead of a compute pass).

use virtsoc_gpu::{measure, CpuBackend, GpuBackend, GpuTimings, WgpuBackend};

fn print(t: &GpuTimings) {
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    println!(
        "{:>5} {:>4}x{:<4} median {:7.2} ms (min {:7.2}, max {:7.2}) upload {:6.2} execute {:6.2} readback {:6.2}",
        t.backend,
        t.width,
        t.height,
        ms(t.median_total),
        ms(t.min_total),
        ms(t.max_total),
        ms(t.median.upload),
        ms(t.median.execute),
        ms(t.median.readback),
    );
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let with_cpu = args.iter().any(|a| a == "--cpu");
    let render = args.iter().any(|a| a == "--render");
    let mut sizes: Vec<(u32, u32)> = args
        .iter()
        .filter_map(|a| {
            let (w, h) = a.split_once('x')?;
            Some((w.parse().ok()?, h.parse().ok()?))
        })
        .collect();
    if sizes.is_empty() {
        sizes = vec![(1920, 1080), (3840, 2160)];
    }
    let mut backends: Vec<Box<dyn GpuBackend>> = Vec::new();
    let t = std::time::Instant::now();
    match WgpuBackend::new() {
        Ok(mut b) => {
            b.set_fused_compute(!render);
            println!(
                "adapter: {} (setup {:.1} ms)",
                b.adapter_info(),
                t.elapsed().as_secs_f64() * 1e3
            );
            let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
            for &(w, h) in &sizes {
                match (b.measure_composite_resident(w, h), b.measure_floor(w, h)) {
                    (Ok(r), Ok(f)) => println!(
                        " wgpu {w:>4}x{h:<4} resident composite {:7.2} ms; floor {:7.2} ms (render {:7.2}, compute {:7.2})",
                        ms(r),
                        ms(f.floor),
                        ms(f.render),
                        ms(f.compute)
                    ),
                    (r, f) => println!("wgpu {w}x{h}: resident {r:?} floor {f:?}"),
                }
            }
            backends.push(Box::new(b));
        }
        Err(e) => println!("skipped wgpu: {e}"),
    }
    if with_cpu {
        backends.push(Box::new(CpuBackend::new()));
    }
    for be in &backends {
        for &(w, h) in &sizes {
            match measure(be.as_ref(), w, h) {
                Ok(t) => print(&t),
                Err(e) => println!("{} {w}x{h}: {e}", be.name()),
            }
        }
    }
}
