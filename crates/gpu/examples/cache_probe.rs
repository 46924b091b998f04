//! `bench sharing` part (a) without the daemon: how much slower compositions get when
//! several guests' images take turns on the device than when one guest's are reused.
//!
//! Each of `N` "guests" owns a source and a destination image of its size (the sizes cycle
//! through the ones given, as the bench's guests do); a composition draws the source over
//! the whole destination, submitted and waited for one at a time (the WFQ scheduler keeps
//! one command on the device). `--rotate R`: each guest owns R such pairs and each of its
//! compositions takes the next one (a swapchain, video buffers), as the bench's guests do
//! (`virtsoc bench sharing`'s `ROTATION`). Per round, interleaved: each size alone (its first guest's
//! images, `CMDS` compositions in a row), then all guests in turn, one composition each
//! (round robin; `--batch K`: K in a row each). The overhead is the bench's: how much longer
//! the guests in turn took than the same compositions at the sizes' alone rates. There is
//! no daemon, guest process, ring or scheduler here, only the device and its caches: on a
//! CPU driver (lavapipe) one guest's images stay in the CPU's caches from one composition
//! to the next, several guests' do not.
//!
//! `cargo run --release -p virtsoc-gpu --example cache_probe -- N WxH [WxH ...] [--batch K]
//! [--rotate R]`

use std::time::Instant;
use virtsoc_gpu::{FrameLayout, GpuImage, ImageLayer, PixelFormat, Rect, WgpuBackend};

/// Compositions per measured run.
const CMDS: usize = 200;
/// Interleaved rounds (the median is reported).
const ROUNDS: usize = 9;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: cache_probe N WxH [WxH ...] [--batch K] [--rotate R]";
    let n: usize = args.first().and_then(|a| a.parse().ok()).expect(usage);
    let option = |name: &str| -> usize {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1)?.parse().ok())
            .unwrap_or(1)
            .max(1)
    };
    let (batch, rotate) = (option("--batch"), option("--rotate"));
    let sizes: Vec<(u32, u32)> = args
        .iter()
        .skip(1)
        .filter_map(|a| {
            let (w, h) = a.split_once('x')?;
            Some((w.parse().ok()?, h.parse().ok()?))
        })
        .collect();
    assert!(n > 0 && !sizes.is_empty(), "{usage}");
    let b = WgpuBackend::new().expect("wgpu");
    // Per guest: its size's index and its `rotate` (source, destination) pairs.
    type Pairs = Vec<(GpuImage, GpuImage)>;
    let guests: Vec<(usize, Pairs)> = (0..n)
        .map(|i| {
            let (w, h) = sizes[i % sizes.len()];
            let l = FrameLayout::packed(PixelFormat::Rgba8, w, h).expect("layout");
            let pairs = (0..rotate)
                .map(|r| {
                    let src = b.create_image(l).expect("image");
                    let dst = b.create_image(l).expect("image");
                    let bytes = vec![(i * 37 + r) as u8; l.size_bytes().expect("layout")];
                    b.write_image(&src, 0, &bytes).expect("write");
                    (src, dst)
                })
                .collect();
            (i % sizes.len(), pairs)
        })
        .collect();
    let footprint: usize = guests
        .iter()
        .map(|(k, _)| 8 * (sizes[*k].0 * sizes[*k].1) as usize * rotate)
        .sum();
    println!(
        "{n} guests, {rotate} image pairs each: {:.1} MiB of images",
        footprint as f64 / (1 << 20) as f64
    );
    // Each guest's next pair.
    let next: Vec<std::cell::Cell<usize>> = (0..n).map(|_| std::cell::Cell::new(0)).collect();
    let compose = |g: usize| {
        let r = next[g].get();
        next[g].set((r + 1) % rotate);
        let (src, dst) = &guests[g].1[r];
        let l = dst.layout();
        let layers = [ImageLayer::new(src, Rect::full(l.width, l.height)).with_blend(false)];
        let id = b.submit_composite_images(&layers, dst).expect("submit");
        b.wait_submission(id).expect("wait");
    };
    let kinds = sizes.len().min(n);
    let mut overheads = Vec::new();
    let mut alone_us: Vec<Vec<f64>> = vec![Vec::new(); kinds];
    for _ in 0..ROUNDS {
        // Each size alone: its first guest's images (its `rotate` pairs in turn).
        let mut rate = vec![0.0; kinds];
        for (k, r) in rate.iter_mut().enumerate() {
            let t = Instant::now();
            for _ in 0..CMDS {
                compose(k);
            }
            let per = t.elapsed().as_secs_f64() / CMDS as f64;
            alone_us[k].push(per * 1e6);
            *r = per;
        }
        // All guests in turn.
        let t = Instant::now();
        let mut alone_secs = 0.0;
        for c in 0..CMDS {
            let g = (c / batch) % n;
            compose(g);
            alone_secs += rate[guests[g].0];
        }
        let together = t.elapsed().as_secs_f64();
        overheads.push((together / alone_secs - 1.0) * 100.0);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    for (k, v) in alone_us.iter_mut().enumerate() {
        let (w, h) = sizes[k];
        println!("{w}x{h} alone: {:.0} us a composition", median(v));
    }
    let q = {
        let mut v = overheads.clone();
        v.sort_by(f64::total_cmp);
        (v[v.len() / 4], v[3 * v.len() / 4])
    };
    println!(
        "{n} guests in turn (batch {batch}, rotate {rotate}): overhead {:.1}% (quartiles {:.1}, {:.1})",
        median(&mut overheads),
        q.0,
        q.1
    );
}
