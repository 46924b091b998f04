//! ISP backends: swscale against the CPU reference for every conversion pair, error paths.

use virtsoc_media::isp::measure_convert_ms;
use virtsoc_media::{
    CpuIsp, FrameError, FrameLayout, FrameMut, FrameRef, IspBackend, MediaError, NullIsp,
    PixelFormat, SwscaleIsp,
};

/// A smooth, in-gamut test image in `layout`'s format (low spatial frequencies, so that
/// the two backends' different filter footprints and chroma siting barely matter).
fn smooth_frame(layout: FrameLayout) -> Vec<u8> {
    let mut buf = vec![0u8; layout.size()];
    let (w, h) = (layout.width as f32, layout.height as f32);
    let tau = std::f32::consts::TAU;
    let rgb = |x: f32, y: f32| -> [f32; 3] {
        [
            128.0 + 90.0 * (tau * x / w).sin(),
            50.0 + 150.0 * y / h,
            128.0 + 70.0 * (tau * (x + y) / (w + h)).cos(),
        ]
    };
    let mut f = FrameMut::new(layout, &mut buf).unwrap();
    let stride = layout.stride as usize;
    match layout.format {
        PixelFormat::Rgba8 | PixelFormat::Bgra8 => {
            let bgr = layout.format == PixelFormat::Bgra8;
            for y in 0..layout.height as usize {
                for x in 0..layout.width as usize {
                    let [r, g, b] = rgb(x as f32, y as f32);
                    let o = y * stride + x * 4;
                    let px = [r as u8, g as u8, b as u8, 255];
                    let px = if bgr { [px[2], px[1], px[0], 255] } else { px };
                    f.data[o..o + 4].copy_from_slice(&px);
                }
            }
        }
        PixelFormat::Nv12 | PixelFormat::Yuv420p => {
            let nv12 = layout.format == PixelFormat::Nv12;
            let mut planes = f.planes_mut();
            for y in 0..layout.height as usize {
                for x in 0..layout.width as usize {
                    let [r, g, b] = rgb(x as f32, y as f32);
                    let [yy, _, _] = virtsoc_media::isp::rgb_to_yuv(r, g, b);
                    planes[0][y * stride + x] = yy.round() as u8;
                }
            }
            for cy in 0..layout.height as usize / 2 {
                for cx in 0..layout.width as usize / 2 {
                    let [r, g, b] = rgb(2.0 * cx as f32 + 0.5, 2.0 * cy as f32 + 0.5);
                    let [_, u, v] = virtsoc_media::isp::rgb_to_yuv(r, g, b);
                    if nv12 {
                        planes[1][cy * stride + 2 * cx] = u.round() as u8;
                        planes[1][cy * stride + 2 * cx + 1] = v.round() as u8;
                    } else {
                        planes[1][cy * stride / 2 + cx] = u.round() as u8;
                        planes[2][cy * stride / 2 + cx] = v.round() as u8;
                    }
                }
            }
        }
    }
    buf
}

/// Per-channel samples of a frame: Y/U/V planes for YUV, R/G/B/A for RGB (any order).
fn channels(layout: FrameLayout, data: &[u8]) -> Vec<(&'static str, Vec<u8>)> {
    let stride = layout.stride as usize;
    let (w, h) = (layout.width as usize, layout.height as usize);
    match layout.format {
        PixelFormat::Rgba8 | PixelFormat::Bgra8 => {
            let names = if layout.format == PixelFormat::Rgba8 {
                ["R", "G", "B", "A"]
            } else {
                ["B", "G", "R", "A"]
            };
            (0..4)
                .map(|c| {
                    let v = (0..h)
                        .flat_map(|y| (0..w).map(move |x| (x, y)))
                        .map(|(x, y)| data[y * stride + x * 4 + c])
                        .collect();
                    (names[c], v)
                })
                .collect()
        }
        PixelFormat::Nv12 | PixelFormat::Yuv420p => {
            let luma = (0..h)
                .flat_map(|y| (0..w).map(move |x| (x, y)))
                .map(|(x, y)| data[y * stride + x])
                .collect();
            let cpos: Vec<(usize, usize)> = (0..h / 2)
                .flat_map(|y| (0..w / 2).map(move |x| (x, y)))
                .collect();
            let (u, v): (Vec<u8>, Vec<u8>) = if layout.format == PixelFormat::Nv12 {
                let base = stride * h;
                cpos.iter()
                    .map(|&(x, y)| {
                        let o = base + y * stride + 2 * x;
                        (data[o], data[o + 1])
                    })
                    .unzip()
            } else {
                let ub = stride * h;
                let vb = ub + stride / 2 * h / 2;
                cpos.iter()
                    .map(|&(x, y)| (data[ub + y * stride / 2 + x], data[vb + y * stride / 2 + x]))
                    .unzip()
            };
            vec![("Y", luma), ("U", u), ("V", v)]
        }
    }
}

/// Per-channel tolerance against the CPU reference, in 8-bit code values: maximum and mean
/// absolute difference over all samples of a channel.
#[derive(Clone, Copy, Debug)]
struct Tolerance {
    max: u8,
    mean: f64,
}

/// `SwscaleIsp::accurate()`: full chroma interpolation, accurate rounding. What remains is
/// chroma siting (swscale sites 4:2:0 chroma left/co-sited horizontally, the reference
/// centres it) and rounding.
const ACCURATE: Tolerance = Tolerance { max: 4, mean: 1.5 };
/// `SwscaleIsp::new()`: the fast paths reuse one chroma sample for two output pixels in
/// YUV -> RGB and use 15-bit coefficients, so chroma-driven channels drift more on the
/// test image's steepest slope (R varies by 9 code values per pixel).
const FAST: Tolerance = Tolerance { max: 12, mean: 4.5 };

fn compare_backends(
    sw: &SwscaleIsp,
    tol: Tolerance,
    src: FrameLayout,
    dst: FrameLayout,
) -> (u8, f64) {
    let input = smooth_frame(src);
    let mut a = vec![0u8; dst.size()];
    let mut b = vec![0u8; dst.size()];
    sw.convert(
        FrameRef::new(src, &input).unwrap(),
        FrameMut::new(dst, &mut a).unwrap(),
    )
    .unwrap();
    CpuIsp::new()
        .convert(
            FrameRef::new(src, &input).unwrap(),
            FrameMut::new(dst, &mut b).unwrap(),
        )
        .unwrap();
    let (mut worst, mut worst_mean) = (0u8, 0f64);
    for ((name, ca), (_, cb)) in channels(dst, &a).into_iter().zip(channels(dst, &b)) {
        let diffs: Vec<u8> = ca.iter().zip(&cb).map(|(x, y)| x.abs_diff(*y)).collect();
        let max = *diffs.iter().max().unwrap();
        let mean = diffs.iter().map(|&d| d as f64).sum::<f64>() / diffs.len() as f64;
        println!(
            "{} {:?} {}x{} -> {:?} {}x{} channel {name}: max {max} mean {mean:.3}",
            sw.name(),
            src.format,
            src.width,
            src.height,
            dst.format,
            dst.width,
            dst.height
        );
        assert!(
            max <= tol.max && mean <= tol.mean,
            "{} {src:?} -> {dst:?} channel {name}: max diff {max}, mean {mean:.3}, tolerance {tol:?}",
            sw.name()
        );
        worst = worst.max(max);
        worst_mean = worst_mean.max(mean);
    }
    (worst, worst_mean)
}

fn every_pair(sw: &SwscaleIsp, tol: Tolerance) {
    let (mut worst, mut worst_mean) = (0, 0.0f64);
    for &sf in &PixelFormat::ALL {
        for &df in &PixelFormat::ALL {
            let src = FrameLayout::packed(sf, 64, 48).unwrap();
            for (dw, dh) in [(64, 48), (32, 24)] {
                let dst = FrameLayout::packed(df, dw, dh).unwrap();
                let (m, mean) = compare_backends(sw, tol, src, dst);
                worst = worst.max(m);
                worst_mean = worst_mean.max(mean);
            }
        }
    }
    println!(
        "{}: worst max diff {worst}, worst mean diff {worst_mean:.3}",
        sw.name()
    );
}

#[test]
fn swscale_accurate_matches_cpu_reference_for_every_pair() {
    every_pair(&SwscaleIsp::accurate(), ACCURATE);
}

#[test]
fn swscale_fast_matches_cpu_reference_for_every_pair() {
    every_pair(&SwscaleIsp::new(), FAST);
}

#[test]
fn padded_strides_and_odd_widths_match() {
    // Row padding on both sides and RGB widths that are not multiples of 16 (staged path).
    let src = FrameLayout::with_stride(PixelFormat::Nv12, 64, 48, 96).unwrap();
    let dst = FrameLayout::with_stride(PixelFormat::Rgba8, 64, 48, 300).unwrap();
    let cases = [
        (src, dst),
        (
            FrameLayout::packed(PixelFormat::Rgba8, 70, 42).unwrap(),
            FrameLayout::packed(PixelFormat::Yuv420p, 70, 42).unwrap(),
        ),
        (
            FrameLayout::packed(PixelFormat::Bgra8, 37, 23).unwrap(),
            FrameLayout::packed(PixelFormat::Rgba8, 37, 23).unwrap(),
        ),
        (
            FrameLayout::packed(PixelFormat::Nv12, 70, 42).unwrap(),
            FrameLayout::packed(PixelFormat::Bgra8, 35, 21).unwrap(),
        ),
    ];
    for (s, d) in cases {
        compare_backends(&SwscaleIsp::new(), FAST, s, d);
        compare_backends(&SwscaleIsp::accurate(), ACCURATE, s, d);
    }
}

#[test]
fn same_layout_conversions_are_exact() {
    for &f in &PixelFormat::ALL {
        let l = FrameLayout::packed(f, 64, 48).unwrap();
        let input = smooth_frame(l);
        for isp in [&CpuIsp::new() as &dyn IspBackend, &NullIsp::new()] {
            let mut out = vec![0u8; l.size()];
            isp.convert(
                FrameRef::new(l, &input).unwrap(),
                FrameMut::new(l, &mut out).unwrap(),
            )
            .unwrap();
            assert_eq!(out, input, "{} {f:?}", isp.name());
        }
    }
}

#[test]
fn nv12_yuv420p_round_trip_is_lossless_on_cpu() {
    let a = FrameLayout::packed(PixelFormat::Nv12, 64, 48).unwrap();
    let b = FrameLayout::packed(PixelFormat::Yuv420p, 64, 48).unwrap();
    let input = smooth_frame(a);
    let mut mid = vec![0u8; b.size()];
    let mut back = vec![0u8; a.size()];
    for isp in [&CpuIsp::new() as &dyn IspBackend, &SwscaleIsp::new()] {
        isp.convert(
            FrameRef::new(a, &input).unwrap(),
            FrameMut::new(b, &mut mid).unwrap(),
        )
        .unwrap();
        isp.convert(
            FrameRef::new(b, &mid).unwrap(),
            FrameMut::new(a, &mut back).unwrap(),
        )
        .unwrap();
        assert_eq!(back, input, "{}", isp.name());
    }
}

#[test]
fn bad_sizes_and_unsupported_pairs_are_errors() {
    let good = FrameLayout::packed(PixelFormat::Rgba8, 64, 48).unwrap();
    let small = vec![0u8; good.size() - 1];
    let mut out = vec![0u8; good.size()];
    let backends: [&dyn IspBackend; 3] = [&SwscaleIsp::new(), &CpuIsp::new(), &NullIsp::new()];
    for isp in backends {
        // Source buffer too small (public fields bypass the constructor's check).
        let src = FrameRef {
            layout: good,
            data: &small,
        };
        let r = isp.convert(src, FrameMut::new(good, &mut out).unwrap());
        assert!(
            matches!(r, Err(MediaError::Frame(FrameError::BufferTooSmall { .. }))),
            "{}: {r:?}",
            isp.name()
        );
        // Destination buffer too small.
        let input = vec![0u8; good.size()];
        let mut tiny = vec![0u8; 16];
        let dst = FrameMut {
            layout: good,
            data: &mut tiny,
        };
        assert!(isp
            .convert(FrameRef::new(good, &input).unwrap(), dst)
            .is_err());
        // Odd-sized YUV layout built by hand.
        let odd = FrameLayout {
            format: PixelFormat::Nv12,
            width: 63,
            height: 48,
            stride: 64,
        };
        let mut buf = vec![0u8; 64 * 48 * 2];
        let dst = FrameMut {
            layout: odd,
            data: &mut buf,
        };
        assert!(matches!(
            isp.convert(FrameRef::new(good, &input).unwrap(), dst),
            Err(MediaError::Frame(FrameError::OddSize { .. }))
        ));
        // Zero-sized layout.
        let zero = FrameLayout {
            format: PixelFormat::Rgba8,
            width: 0,
            height: 48,
            stride: 0,
        };
        let dst = FrameMut {
            layout: zero,
            data: &mut out,
        };
        assert!(isp
            .convert(FrameRef::new(good, &input).unwrap(), dst)
            .is_err());
    }
    // The null backend refuses conversions.
    let nv12 = FrameLayout::packed(PixelFormat::Nv12, 64, 48).unwrap();
    let input = vec![0u8; good.size()];
    let mut out = vec![0u8; nv12.size()];
    let r = NullIsp::new().convert(
        FrameRef::new(good, &input).unwrap(),
        FrameMut::new(nv12, &mut out).unwrap(),
    );
    assert!(matches!(r, Err(MediaError::Unsupported(_))), "{r:?}");
}

#[test]
fn swscale_cache_is_bounded_and_reused() {
    let isp = SwscaleIsp::new();
    let src = FrameLayout::packed(PixelFormat::Nv12, 64, 48).unwrap();
    let input = smooth_frame(src);
    for i in 0..40u32 {
        let dst = FrameLayout::packed(PixelFormat::Rgba8, 16 + 2 * (i % 20), 16).unwrap();
        let mut out = vec![0u8; dst.size()];
        isp.convert(
            FrameRef::new(src, &input).unwrap(),
            FrameMut::new(dst, &mut out).unwrap(),
        )
        .unwrap();
    }
    assert!(isp.cached_configs() <= 16);
    assert!(isp.cached_configs() >= 1);
}

#[test]
fn measure_convert_reports_a_time() {
    let src = FrameLayout::packed(PixelFormat::Nv12, 320, 240).unwrap();
    let dst = FrameLayout::packed(PixelFormat::Rgba8, 320, 240).unwrap();
    let ms = measure_convert_ms(&SwscaleIsp::new(), src, dst, 5).unwrap();
    assert!(ms > 0.0 && ms.is_finite());
}

/// `len` zeroed bytes starting `misalign` bytes past a 64-byte boundary, inside `store`.
fn placed(store: &mut Vec<u8>, len: usize, misalign: usize) -> &mut [u8] {
    *store = vec![0u8; len + 128];
    let start = (64 - store.as_ptr() as usize % 64) % 64 + misalign;
    &mut store[start..start + len]
}

/// Regression for a daemon-killing input: swscale's SIMD paths fault on plane pointers or
/// strides that are not vector-aligned (NV12 -> YUV420P at 720x480 has 360-byte chroma rows).
/// Every format pair, same-size and scaled, at widths from 16 to 4096 (16 mod 32 among them),
/// odd heights where the formats allow them, with source and destination buffers at every
/// alignment that matters, must convert like the CPU reference, through either backend.
#[test]
fn conversion_matrix_over_widths_heights_and_alignments() {
    let widths = [16u32, 34, 48, 62, 720, 1280, 1936, 4096];
    let misaligns = [0usize, 1, 8, 16, 32];
    let fast = SwscaleIsp::new();
    let accurate = SwscaleIsp::accurate();
    let cpu = CpuIsp::new();
    let mut runs = 0;
    for &sf in &PixelFormat::ALL {
        for &df in &PixelFormat::ALL {
            let yuv = sf.is_yuv() || df.is_yuv();
            for &w in &widths {
                let h = if yuv { 16 } else { 15 };
                let src = FrameLayout::packed(sf, w, h).unwrap();
                let scaled = if yuv {
                    (w / 2 + w / 2 % 2, 8)
                } else {
                    (w / 2 + 1, 7)
                };
                for (dw, dh) in [(w, h), scaled] {
                    let dst = FrameLayout::packed(df, dw.max(2), dh).unwrap();
                    let input = smooth_frame(src);
                    let mut want = vec![0u8; dst.size()];
                    cpu.convert(
                        FrameRef::new(src, &input).unwrap(),
                        FrameMut::new(dst, &mut want).unwrap(),
                    )
                    .unwrap();
                    for &m in &misaligns {
                        let (mut s_store, mut d_store) = (Vec::new(), Vec::new());
                        let s_buf = placed(&mut s_store, src.size(), m);
                        s_buf.copy_from_slice(&input);
                        let d_buf = placed(&mut d_store, dst.size(), (m * 3) % 64);
                        for (isp, tol) in [(&fast, FAST), (&accurate, ACCURATE)] {
                            isp.convert(
                                FrameRef::new(src, s_buf).unwrap(),
                                FrameMut::new(dst, d_buf).unwrap(),
                            )
                            .unwrap_or_else(|e| panic!("{src:?} -> {dst:?}: {e}"));
                            let worst = channels(dst, d_buf)
                                .into_iter()
                                .zip(channels(dst, &want))
                                .map(|((_, a), (_, b))| {
                                    a.iter().zip(&b).map(|(x, y)| x.abs_diff(*y)).max().unwrap()
                                })
                                .max()
                                .unwrap();
                            // Tiny and scaled frames have few samples to average edge effects
                            // over, so only the maximum is checked, with room for filter
                            // footprints at the borders.
                            assert!(
                                worst <= tol.max * 4,
                                "{} {src:?} -> {dst:?} misaligned by {m}: max diff {worst}",
                                isp.name()
                            );
                            runs += 1;
                        }
                    }
                }
            }
        }
    }
    assert_eq!(runs, 16 * widths.len() * 2 * misaligns.len() * 2);
}

/// Odd YUV sizes are refused with a clear error, never handed to swscale.
#[test]
fn odd_yuv_sizes_are_refused() {
    for (w, h) in [(720, 481), (721, 480)] {
        for f in [PixelFormat::Nv12, PixelFormat::Yuv420p] {
            assert!(matches!(
                FrameLayout::packed(f, w, h),
                Err(FrameError::OddSize { .. })
            ));
        }
    }
}
