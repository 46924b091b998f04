//! Resident images: asynchronous operations against the CPU reference,
//! completion callbacks, and byte-range uploads/readbacks.
//!
//! Tolerances are those of gpu_vs_cpu.rs (composition max 4, mean 0.6).

mod common;

use std::sync::mpsc;

use common::{assert_close, frame};
use virtsoc_gpu::{
    pattern, Clear, CpuBackend, FrameLayout, GpuBackend, GpuError, GpuImage, ImageLayer, Layer,
    Marker, OwnedFrame, PixelFormat, Rect, Rotation, View, WgpuBackend,
};

const MAX: u8 = 4;
const MEAN: f64 = 0.6;

fn upload(g: &WgpuBackend, f: &OwnedFrame) -> GpuImage {
    let img = g.create_image(f.layout).unwrap();
    g.write_image(&img, 0, &f.data).unwrap();
    img
}

fn download(g: &WgpuBackend, img: &GpuImage) -> OwnedFrame {
    let mut f = frame(img.layout());
    g.read_image(img, 0, &mut f.data).unwrap();
    f
}

/// Waits for `id` through `on_submission_done`; returns whether the callback
/// saw the submission complete and ran on another thread.
fn wait_callback(g: &WgpuBackend, id: u64) -> (bool, bool) {
    let (tx, rx) = mpsc::channel();
    let me = std::thread::current().id();
    g.on_submission_done(
        id,
        Box::new(move |r| {
            let _ = tx.send((r.is_ok(), std::thread::current().id() != me));
        }),
    );
    rx.recv_timeout(std::time::Duration::from_secs(120))
        .expect("callback never ran")
}

fn scene<'a>([a, b, c, d]: [&'a OwnedFrame; 4]) -> Vec<Layer<'a>> {
    vec![
        Layer::new(a.as_ref(), Rect::new(-10, 5, 100, 80))
            .with_crop(Rect::new(6, 4, 50, 40))
            .with_blend(false),
        Layer::new(b.as_ref(), Rect::new(30, 10, 60, 80))
            .with_rotation(Rotation::R90)
            .with_crop(Rect::new(17, 9, 71, 51))
            .with_alpha(0.8),
        Layer::new(c.as_ref(), Rect::new(60, 40, 64, 48))
            .with_rotation(Rotation::R180)
            .with_alpha(0.6),
        Layer::new(d.as_ref(), Rect::new(5, 50, 40, 50))
            .with_rotation(Rotation::R270)
            .with_crop(Rect::new(3, 2, 40, 30)),
    ]
}

#[test]
fn resident_composite_matches_cpu_for_all_source_formats() {
    let g = gpu_or_skip!();
    let nv12 = pattern::nv12_gradient_strided(64, 48, 80, 1).unwrap();
    let i420 = pattern::yuv420p_gradient(96, 64, 2).unwrap();
    let rgba = pattern::rgb_gradient(PixelFormat::Rgba8, 80, 60, |x, y| {
        ((x * 3 + y * 2) % 256) as u8
    })
    .unwrap();
    let bgra = pattern::rgb_gradient(PixelFormat::Bgra8, 50, 40, |x, _| (x * 5) as u8).unwrap();
    let base = pattern::rgb_gradient(PixelFormat::Rgba8, 128, 96, |_, _| 255).unwrap();
    for dst_format in [PixelFormat::Rgba8, PixelFormat::Bgra8] {
        let mut base = base.clone();
        base.layout = FrameLayout::with_stride(dst_format, 128, 96, 128 * 4).unwrap();
        let srcs = [&nv12, &i420, &rgba, &bgra];
        let mut expect = base.clone();
        CpuBackend::new()
            .composite_with(&scene(srcs), expect.as_mut(), Clear::Keep)
            .unwrap();
        let imgs: Vec<GpuImage> = srcs.iter().map(|f| upload(g, f)).collect();
        let dst = upload(g, &base);
        let ilayers: Vec<ImageLayer<'_>> = scene(srcs)
            .iter()
            .zip(&imgs)
            .map(|(l, img)| ImageLayer::of(l, img))
            .collect();
        let id = g.submit_composite_images(&ilayers, &dst).unwrap();
        assert!(id <= g.last_submission());
        let got = download(g, &dst);
        assert_close(
            &format!("resident {dst_format:?}"),
            &got,
            &expect,
            MAX,
            MEAN,
        );
        assert!(g.completed_submission() >= id);
    }
}

/// A composition limited to a damaged rectangle draws exactly what the whole composition
/// draws there and leaves every other pixel alone: on the CPU reference (bit-exact), on
/// resident images (a scissored pass) and through the byte API; a rectangle outside the
/// target is refused.
#[test]
fn composite_damage_draws_only_the_damaged_rectangle() {
    let g = gpu_or_skip!();
    let nv12 = pattern::nv12_gradient_strided(64, 48, 80, 1).unwrap();
    let i420 = pattern::yuv420p_gradient(96, 64, 2).unwrap();
    let rgba = pattern::rgb_gradient(PixelFormat::Rgba8, 80, 60, |x, y| {
        ((x * 3 + y * 2) % 256) as u8
    })
    .unwrap();
    let bgra = pattern::rgb_gradient(PixelFormat::Bgra8, 50, 40, |x, _| (x * 5) as u8).unwrap();
    let srcs = [&nv12, &i420, &rgba, &bgra];
    let before = pattern::rgb_gradient(PixelFormat::Rgba8, 128, 96, |x, _| x as u8).unwrap();
    let damage = Rect::new(23, 17, 50, 41);
    let inside = |x: usize, y: usize| (23..73).contains(&x) && (17..58).contains(&y);
    let mut whole = before.clone();
    CpuBackend::new()
        .composite_with(&scene(srcs), whole.as_mut(), Clear::Keep)
        .unwrap();
    let mut want = before.clone();
    for (i, px) in want.data.chunks_exact_mut(4).enumerate() {
        if inside(i % 128, i / 128) {
            px.copy_from_slice(&whole.data[i * 4..i * 4 + 4]);
        }
    }
    // Outside the rectangle the destination is untouched, bit for bit.
    let untouched = |what: &str, got: &OwnedFrame| {
        for (i, (a, b)) in got
            .data
            .chunks_exact(4)
            .zip(before.data.chunks_exact(4))
            .enumerate()
        {
            if !inside(i % 128, i / 128) {
                assert_eq!(a, b, "{what}: pixel {i} outside the damage changed");
            }
        }
    };
    let mut cpu = before.clone();
    CpuBackend::new()
        .composite_damage(&scene(srcs), cpu.as_mut(), damage)
        .unwrap();
    assert_eq!(
        cpu.data, want.data,
        "cpu: exactly the whole composition, clipped"
    );
    let mut bytes = before.clone();
    g.composite_damage(&scene(srcs), bytes.as_mut(), damage)
        .unwrap();
    untouched("byte api", &bytes);
    assert_close("byte api", &bytes, &want, MAX, MEAN);
    let imgs: Vec<GpuImage> = srcs.iter().map(|f| upload(g, f)).collect();
    let dst = upload(g, &before);
    let ilayers: Vec<ImageLayer<'_>> = scene(srcs)
        .iter()
        .zip(&imgs)
        .map(|(l, img)| ImageLayer::of(l, img))
        .collect();
    let id = g
        .submit_composite_images_damage(&ilayers, &dst, damage)
        .unwrap();
    g.wait_submission(id).unwrap();
    let got = download(g, &dst);
    untouched("resident", &got);
    assert_close("resident", &got, &want, MAX, MEAN);
    for bad in [
        Rect::new(100, 0, 29, 10),
        Rect::new(-1, 0, 10, 10),
        Rect::new(0, 0, 0, 10),
    ] {
        assert!(matches!(
            g.submit_composite_images_damage(&ilayers, &dst, bad),
            Err(GpuError::InvalidParameter(_))
        ));
        assert!(CpuBackend::new()
            .composite_damage(&scene(srcs), cpu.as_mut(), bad)
            .is_err());
    }
}

#[test]
fn resident_composite_is_asynchronous_and_ordered() {
    let g = gpu_or_skip!();
    let (w, h) = (3840, 2160);
    let video = pattern::nv12_gradient(w, h, 3).unwrap();
    let ui = pattern::rgba_ui(w, h).unwrap();
    let vi = upload(g, &video);
    let ui_img = upload(g, &ui);
    let dst = g
        .create_image(FrameLayout::packed(PixelFormat::Rgba8, w, h).unwrap())
        .unwrap();
    let layers = [
        ImageLayer::new(&vi, Rect::full(w, h)).with_blend(false),
        ImageLayer::new(&ui_img, Rect::full(w, h)),
    ];
    let id = g.submit_composite_images(&layers, &dst).unwrap();
    // The callback runs after completion, on the backend's thread.
    let (ok, other_thread) = wait_callback(g, id);
    assert!(ok && other_thread);
    assert!(g.completed_submission() >= id);
    // A readback after the callback sees the result.
    let mut expect = frame(dst.layout());
    let cpu_layers = [
        Layer::new(video.as_ref(), Rect::full(w, h)).with_blend(false),
        Layer::new(ui.as_ref(), Rect::full(w, h)),
    ];
    CpuBackend::new()
        .composite(&cpu_layers, expect.as_mut())
        .unwrap();
    let got = download(g, &dst);
    assert_close("resident 4k", &got, &expect, MAX, MEAN);
    // Callbacks for completed and unknown submissions.
    assert_eq!(wait_callback(g, id), (true, true));
    let (tx, rx) = mpsc::channel();
    g.on_submission_done(
        u64::MAX,
        Box::new(move |r| {
            let _ = tx.send(r);
        }),
    );
    assert!(matches!(
        rx.recv_timeout(std::time::Duration::from_secs(10)).unwrap(),
        Err(GpuError::UnknownSubmission(_))
    ));
}

#[test]
fn resident_project_markers_convert_match_cpu() {
    let g = gpu_or_skip!();
    let cpu = CpuBackend::new();
    let eq = pattern::equirect_nv12(256, 128).unwrap();
    let eq_img = upload(g, &eq);
    let dl = FrameLayout::packed(PixelFormat::Bgra8, 128, 96).unwrap();
    let view = View {
        yaw: 3.0,
        pitch: -0.6,
        fov_y: 60f32.to_radians(),
    };
    let dst = g.create_image(dl).unwrap();
    g.submit_project_images(&eq_img, &view, &dst).unwrap();
    let mut expect = frame(dl);
    cpu.project_equirect(eq.as_ref(), view, expect.as_mut())
        .unwrap();
    assert_close("resident equirect", &download(g, &dst), &expect, 8, MEAN);

    let markers = [
        Marker::square(20.0, 20.0, 10.0, [255, 0, 0, 255]),
        Marker::cross(64.3, 48.7, 21.0, [0, 255, 0, 200]),
    ];
    g.submit_markers_image(&markers, &dst).unwrap();
    cpu.draw_markers(&markers, expect.as_mut()).unwrap();
    assert_close("resident markers", &download(g, &dst), &expect, 8, MEAN);

    let src = pattern::yuv420p_gradient(128, 96, 5).unwrap();
    let src_img = upload(g, &src);
    let out = g
        .create_image(FrameLayout::packed(PixelFormat::Rgba8, 96, 72).unwrap())
        .unwrap();
    let id = g.submit_convert_images(&src_img, &out).unwrap();
    g.wait_submission(id).unwrap();
    let mut expect = frame(out.layout());
    cpu.convert(src.as_ref(), expect.as_mut()).unwrap();
    assert_close("resident convert", &download(g, &out), &expect, MAX, MEAN);
}

#[test]
fn bad_image_arguments_are_errors() {
    let g = gpu_or_skip!();
    let src = upload(g, &pattern::nv12_gradient(32, 24, 0).unwrap());
    let dst = g
        .create_image(FrameLayout::packed(PixelFormat::Rgba8, 32, 24).unwrap())
        .unwrap();
    let good = ImageLayer::new(&src, Rect::full(32, 24));
    assert!(g.submit_composite_images(&[good], &dst).is_ok());
    let bad = [
        good.with_crop(Rect::new(10, 0, 23, 24)),
        good.with_crop(Rect::new(0, 0, 0, 8)),
        good.with_alpha(f32::NAN),
        ImageLayer::new(&src, Rect::new(0, 0, 8, 0)),
        ImageLayer::new(&dst, Rect::full(32, 24)),
    ];
    for l in bad {
        assert!(g.submit_composite_images(&[l], &dst).is_err(), "{l:?}");
    }
    assert!(matches!(
        g.submit_composite_images(&[good], &src),
        Err(GpuError::UnsupportedFormat { .. })
    ));
    assert!(matches!(
        g.submit_composite_images(&vec![good; 65], &dst),
        Err(GpuError::TooMany { .. })
    ));
    assert!(g.submit_convert_images(&src, &src).is_err());
    let bad_view = View {
        yaw: 0.0,
        pitch: 0.0,
        fov_y: 0.0,
    };
    assert!(g.submit_project_images(&src, &bad_view, &dst).is_err());
    assert!(g
        .submit_markers_image(&[Marker::square(1.0, 1.0, -1.0, [0; 4])], &dst)
        .is_err());
    // Layouts with their fields set by hand, past the constructors' checks.
    let odd = FrameLayout {
        format: PixelFormat::Nv12,
        width: 31,
        height: 24,
        stride: 31,
    };
    assert!(g.create_image(odd).is_err());
    let huge = FrameLayout {
        format: PixelFormat::Rgba8,
        width: 100_000,
        height: 1,
        stride: 400_000,
    };
    assert!(g.create_image(huge).is_err());
    let n = dst.bytes();
    assert_eq!(n, 32 * 24 * 4);
    assert!(g.write_image(&dst, n - 3, &[0; 4]).is_err());
    assert!(g.read_image(&dst, usize::MAX, &mut [0; 4]).is_err());
    assert!(g.write_image(&dst, n, &[]).is_ok());
    assert_ne!(src.id(), dst.id());
    assert_eq!(src.clone().id(), src.id());
}

/// xorshift64*: a fixed-seed generator for the property test.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// For each byte of a frame: whether it is a pixel byte (not row padding).
fn pixel_mask(l: FrameLayout) -> Vec<bool> {
    let mut mask = vec![false; l.size_bytes().unwrap()];
    let (s, h, w) = (l.stride as usize, l.height as usize, l.width as usize);
    let mut mark = |off: usize, stride: usize, rows: usize, row_bytes: usize| {
        for r in 0..rows {
            mask[off + r * stride..off + r * stride + row_bytes].fill(true);
        }
    };
    match l.format {
        PixelFormat::Rgba8 | PixelFormat::Bgra8 => mark(0, s, h, w * 4),
        PixelFormat::Nv12 => {
            mark(0, s, h, w);
            mark(s * h, s, h / 2, w);
        }
        PixelFormat::Yuv420p => {
            mark(0, s, h, w);
            mark(s * h, s / 2, h / 2, w / 2);
            mark(s * h + (s / 2) * (h / 2), s / 2, h / 2, w / 2);
        }
    }
    mask
}

#[test]
fn partial_ranges_round_trip() {
    let g = gpu_or_skip!();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let layouts = [
        FrameLayout::with_stride(PixelFormat::Nv12, 38, 20, 48).unwrap(),
        FrameLayout::with_stride(PixelFormat::Yuv420p, 34, 14, 44).unwrap(),
        FrameLayout::with_stride(PixelFormat::Rgba8, 21, 13, 21 * 4 + 12).unwrap(),
        FrameLayout::with_stride(PixelFormat::Bgra8, 17, 9, 17 * 4 + 6).unwrap(),
        FrameLayout::packed(PixelFormat::Rgba8, 16, 8).unwrap(),
    ];
    for l in layouts {
        let img = g.create_image(l).unwrap();
        let n = img.bytes();
        let mask = pixel_mask(l);
        let mut model: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
        g.write_image(&img, 0, &model).unwrap();
        for round in 0..40 {
            // A random write: any offset and length, often short.
            let off = rng.below(n);
            let max = if round % 3 == 0 {
                n - off
            } else {
                (n - off).min(90)
            };
            let len = 1 + rng.below(max);
            let data: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
            g.write_image(&img, off, &data).unwrap();
            model[off..off + len].copy_from_slice(&data);
            // A random read into a buffer filled with a sentinel.
            let off = rng.below(n);
            let len = 1 + rng.below(n - off);
            let mut got = vec![0xA5u8; len];
            g.read_image(&img, off, &mut got).unwrap();
            for (i, b) in got.iter().enumerate() {
                let at = off + i;
                if mask[at] {
                    assert_eq!(*b, model[at], "{l:?} round {round}: byte {at}");
                } else {
                    assert_eq!(*b, 0xA5, "{l:?} round {round}: padding byte {at} written");
                }
            }
        }
        // The whole frame still matches on pixel bytes.
        let mut all = vec![0u8; n];
        g.read_image(&img, 0, &mut all).unwrap();
        for i in 0..n {
            if mask[i] {
                assert_eq!(all[i], model[i], "{l:?}: byte {i}");
            }
        }
    }
}

#[test]
fn floor_and_resident_measurements_run() {
    let g = gpu_or_skip!();
    let f = g.measure_floor(128, 96).unwrap();
    assert_eq!((f.width, f.height), (128, 96));
    assert_eq!(f.floor, f.render.min(f.compute));
    assert!(f.floor > std::time::Duration::ZERO);
    assert!(g.measure_composite_resident(128, 96).unwrap() > std::time::Duration::ZERO);
    assert!(g.measure_floor(127, 96).is_err(), "odd NV12 width");
}

/// A video under a full-screen UI, Android's usual GPU fallback, is drawn in one fused pass
/// (a compute pass on RGBA targets, or a render pass): both must give what the two separate
/// draws give, and the CPU reference, for every source format of the video, at the target's
/// size (the shaders' identity fetch) and scaled up, with and without the UI blending, and
/// with a third layer on top.
#[test]
fn fused_full_screen_layers_match_separate_draws_and_the_cpu() {
    let mut separate = WgpuBackend::new().unwrap();
    separate.set_fused_layers(false);
    let fused = WgpuBackend::new().unwrap();
    let mut fused_render = WgpuBackend::new().unwrap();
    fused_render.set_fused_compute(false);
    let (w, h) = (160, 96);
    let videos = |w, h| {
        [
            pattern::nv12_gradient(w, h, 3).unwrap(),
            pattern::yuv420p_gradient(w, h, 5).unwrap(),
            pattern::rgb_gradient(PixelFormat::Bgra8, w, h, |_, _| 255).unwrap(),
        ]
    };
    let mut all = videos(w, h).to_vec();
    all.extend(videos(w / 2 + 6, h / 2 + 4));
    // A translucent gradient over the whole screen (alpha varies across it).
    let ui = pattern::rgb_gradient(PixelFormat::Rgba8, w, h, |x, _| (40 + x) as u8).unwrap();
    let small = pattern::rgba_ui(w / 2, h / 2).unwrap();
    let full = Rect::new(0, 0, w, h);
    for video in &all {
        for blend in [true, false] {
            for third in [false, true] {
                let mut layers = vec![
                    Layer::new(video.as_ref(), full).with_blend(false),
                    Layer::new(ui.as_ref(), full)
                        .with_blend(blend)
                        .with_alpha(0.9),
                ];
                if third {
                    layers.push(Layer::new(small.as_ref(), Rect::new(20, 10, 60, 40)));
                }
                let mut want = frame(FrameLayout::packed(PixelFormat::Rgba8, w, h).unwrap());
                CpuBackend::new().composite(&layers, want.as_mut()).unwrap();
                let run = |g: &WgpuBackend| {
                    let imgs: Vec<GpuImage> = layers
                        .iter()
                        .map(|l| {
                            let img = g.create_image(l.src.layout).unwrap();
                            g.write_image(&img, 0, l.src.data).unwrap();
                            img
                        })
                        .collect();
                    let il: Vec<ImageLayer<'_>> = layers
                        .iter()
                        .zip(&imgs)
                        .map(|(l, img)| ImageLayer::of(l, img))
                        .collect();
                    let dst = g
                        .create_image(FrameLayout::packed(PixelFormat::Rgba8, w, h).unwrap())
                        .unwrap();
                    let id = g.submit_composite_images(&il, &dst).unwrap();
                    g.wait_submission(id).unwrap();
                    download(g, &dst)
                };
                let b = run(&separate);
                let l = video.layout;
                let what = format!(
                    "{:?} {}x{} blend={blend} third={third}",
                    l.format, l.width, l.height
                );
                for (name, g) in [("fused compute", &fused), ("fused render", &fused_render)] {
                    let a = run(g);
                    assert_close(&format!("{name} vs cpu, {what}"), &a, &want, MAX, MEAN);
                    // Separate draws round the video to 8 bits before blending the UI over
                    // it; the fused pass does not: a code value apart at most, rarely.
                    assert_close(&format!("{name} vs separate, {what}"), &a, &b, 2, 0.3);
                }
            }
        }
    }
}

/// `sample_plane` takes exactly the texels [`SampleAxis::texel`] names, for packed RGB and for
/// both planes of NV12 (chroma through a luma grid, every other sample).
#[test]
fn sampling_reads_the_texels_of_the_grid() {
    let g = gpu_or_skip!();
    let rgba = pattern::rgb_gradient(PixelFormat::Rgba8, 64, 48, |x, y| (x * 3 + y) as u8).unwrap();
    let img = upload(g, &rgba);
    let axis = |origin, size, samples, first, count, step, shift| virtsoc_gpu::SampleAxis {
        origin,
        size,
        samples,
        first,
        count,
        step,
        shift,
    };
    // Columns 4..60 in 10 cells, cells 2..9; rows 0..48 in 6 cells, all.
    let (x, y) = (axis(4, 56, 10, 2, 7, 1, 0), axis(0, 48, 6, 0, 6, 1, 0));
    assert_eq!((x.texel(0), x.texel(6), y.texel(5)), (18, 51, 44));
    let mut got = Vec::new();
    g.sample_plane(&img, 0, (x, y), |b| got = b.to_vec())
        .unwrap();
    assert_eq!(got.len(), 7 * 6 * 4);
    for j in 0..6 {
        for i in 0..7 {
            let (sx, sy) = (x.texel(i) as usize, y.texel(j) as usize);
            let want = &rgba.data[sy * 64 * 4 + sx * 4..][..4];
            assert_eq!(
                &got[(j as usize * 7 + i as usize) * 4..][..4],
                want,
                "cell {i},{j}"
            );
        }
    }
    let nv12 = pattern::nv12_gradient(64, 48, 5).unwrap();
    let img = upload(g, &nv12);
    // The chroma under every other sample of a 64 x 24 luma grid over the whole frame.
    let (cx, cy) = (axis(0, 64, 64, 1, 32, 2, 1), axis(0, 48, 24, 0, 12, 2, 1));
    g.sample_plane(&img, 1, (cx, cy), |b| got = b.to_vec())
        .unwrap();
    assert_eq!(got.len(), 32 * 12 * 4);
    for j in 0..12 {
        for i in 0..32 {
            let (sx, sy) = (cx.texel(i) as usize, cy.texel(j) as usize);
            let uv = &nv12.data[64 * 48 + sy * 64 + sx * 2..][..2];
            assert_eq!(
                &got[(j as usize * 32 + i as usize) * 4..][..2],
                uv,
                "chroma {i},{j}"
            );
        }
    }
    // Grids outside the plane or the cells, or a plane the image lacks, are refused.
    assert!(g
        .sample_plane(&img, 1, (axis(0, 66, 8, 0, 8, 1, 1), cy), |_| ())
        .is_err());
    assert!(g.sample_plane(&img, 2, (cx, cy), |_| ()).is_err());
    assert!(g
        .sample_plane(&img, 0, (axis(0, 8, 4, 2, 3, 1, 0), cy), |_| ())
        .is_err());
    assert!(g
        .sample_plane(&img, 0, (axis(0, 8, 4, 0, 3, 2, 0), cy), |_| ())
        .is_err());
}

/// Only the backend's poller thread waits on the device, or polls it at all: readers on other
/// threads wait for it to see their work done (and ask it for a poll when their buffer's map
/// came after that), and a completion callback, which runs on the poller, reads back by
/// polling from there (were it to wait for the poller, nothing would poll). No other thread
/// of this test binary made a poll when it ends.
#[test]
fn readers_on_several_threads_and_in_a_callback_read_their_own_work() {
    let g = gpu_or_skip!();
    let solid = |v: u8| {
        let mut f = frame(FrameLayout::packed(PixelFormat::Rgba8, 48, 32).unwrap());
        f.data.fill(v);
        f
    };
    let (src, dst) = (upload(g, &solid(0x41)), upload(g, &solid(0)));
    let id = g
        .submit_composite_images(
            &[ImageLayer::new(&src, Rect::new(0, 0, 48, 32)).with_blend(false)],
            &dst,
        )
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let back = dst.clone();
    g.on_submission_done(
        id,
        Box::new(move |_| {
            let mut out = vec![0u8; back.bytes()];
            let r = g.read_image(&back, 0, &mut out);
            let _ = tx.send(r.map(|()| out[..4].to_vec()));
        }),
    );
    let got = rx
        .recv_timeout(std::time::Duration::from_secs(150))
        .expect("the callback's readback never finished");
    assert_eq!(got.unwrap(), vec![0x41; 4]);
    std::thread::scope(|s| {
        for t in 0..4u8 {
            s.spawn(move || {
                let (src, dst) = (upload(g, &solid(0)), upload(g, &solid(0)));
                for i in 0..12u8 {
                    let v = t * 50 + i;
                    g.write_image(&src, 0, &solid(v).data).unwrap();
                    let layer = ImageLayer::new(&src, Rect::new(0, 0, 48, 32)).with_blend(false);
                    let id = g.submit_composite_images(&[layer], &dst).unwrap();
                    if i % 2 == 0 {
                        g.wait_submission(id).unwrap();
                        assert!(g.completed_submission() >= id);
                    }
                    let f = download(g, &dst);
                    assert!(f.data.iter().all(|b| *b == v), "thread {t}, round {i}");
                }
            });
        }
    });
    assert_eq!(
        g.polls_off_poller(),
        0,
        "device polls made on threads other than the poller"
    );
}
