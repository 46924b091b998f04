//! Prints the media backends' throughput on this machine, using the same public functions
//! the project's `virtsoc bench` calls: swscale NV12 -> RGBA at 3840x2160 and, for every
//! video file given on the command line, the decode frame rate with 1 and 2 threads.
//!
//! `cargo run --release -p virtsoc-media --example media_measure -- clip1.mp4 clip2.mp4`

use std::time::Instant;
use virtsoc_media::isp::measure_convert_ms;

use virtsoc_media::{
    measure_decode_fps, CameraSource, FrameLayout, FrameMut, PixelFormat, SwscaleIsp,
    SyntheticCamera,
};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dst = FrameLayout::packed(PixelFormat::Rgba8, 3840, 2160)?;
    for src_format in [PixelFormat::Nv12, PixelFormat::Yuv420p] {
        let src = FrameLayout::packed(src_format, 3840, 2160)?;
        for isp in [SwscaleIsp::new(), SwscaleIsp::accurate()] {
            let ms = measure_convert_ms(&isp, src, dst, 30)?;
            println!(
                "{} {src_format:?}->RGBA 3840x2160: {ms:.2} ms (median of 30)",
                virtsoc_media::IspBackend::name(&isp)
            );
        }
    }
    for (w, h) in [(1920, 1080), (3840, 2160)] {
        for format in [PixelFormat::Nv12, PixelFormat::Rgba8] {
            let mut cam = SyntheticCamera::new(w, h, 30, format)?;
            let l = cam.layout();
            let mut buf = vec![0u8; l.size()];
            let mut times = Vec::new();
            for i in 0..20 {
                let t = Instant::now();
                cam.capture(FrameMut::new(l, &mut buf)?, i)?;
                times.push(t.elapsed().as_secs_f64() * 1e3);
            }
            times.sort_by(f64::total_cmp);
            println!(
                "synthetic camera {format:?} {w}x{h}: {:.2} ms per frame (median of 20)",
                times[10]
            );
        }
    }
    for path in std::env::args().skip(1) {
        for threads in [1, 2] {
            // Median of three runs.
            let mut runs = (0..3)
                .map(|_| measure_decode_fps(&path, threads))
                .collect::<Result<Vec<f64>, _>>()?;
            runs.sort_by(f64::total_cmp);
            println!(
                "decode {path} threads={threads}: {:.1} fps (median of 3)",
                runs[1]
            );
        }
    }
    Ok(())
}
