//! wgpu results against the CPU reference.
//!
//! Tolerances (per 8-bit channel, over all destination pixels):
//! * composition, markers, convert: max abs diff <= 4, mean <= 0.6.
//!   Sampling uses the hardware bilinear filter, whose precision is
//!   vendor-specific: llvmpipe filters 8-bit textures in 8-bit fixed point, so
//!   filtered Y/U/V are rounded to 8 bits before the YUV -> RGB matrix (gain
//!   up to 2.02 on chroma); llvmpipe: max 4, mean 0.50 on the NV12 downscale.
//!   Blending runs in 8-bit fixed point on some GPUs (llvmpipe: max 2);
//! * equirect projection: max abs diff <= 8, mean <= 0.5 (GPU atan2/sqrt are
//!   approximations, which moves sample positions slightly; llvmpipe: max 1).
//!
//! Each comparison also checks that the reference is not a flat image, and
//! `comparison_detects_a_wrong_rotation` shows a wrong result exceeds them.
//!
//! Without an adapter every test here prints "skipped: no adapter ..." and
//! passes; `adapter_exists_when_lavapipe_is_installed` makes sure that does
//! not happen silently on a machine with lavapipe.

mod common;

use common::{assert_close, diff, frame};
use virtsoc_gpu::{
    pattern, Clear, CpuBackend, FrameLayout, GpuBackend, Layer, Marker, PixelFormat, Rect,
    Rotation, View,
};

const MAX: u8 = 4;
const MEAN: f64 = 0.6;
const EQ_MAX: u8 = 8;
const EQ_MEAN: f64 = 0.5;

fn cpu() -> CpuBackend {
    CpuBackend::new()
}

#[test]
fn adapter_exists_when_lavapipe_is_installed() {
    match common::gpu() {
        Some(g) => {
            let info = g.adapter_info();
            println!("adapter: {info}");
            assert!(!info.name.is_empty());
        }
        None => {
            // Unless the Vulkan driver list was overridden on purpose, an
            // installed lavapipe means an adapter must exist.
            let overridden = ["VK_ICD_FILENAMES", "VK_DRIVER_FILES", "WGPU_BACKEND"]
                .iter()
                .any(|v| std::env::var_os(v).is_some());
            assert!(
                overridden || !std::path::Path::new(common::LAVAPIPE_ICD).exists(),
                "lavapipe is installed ({}) but no wgpu adapter could be created",
                common::LAVAPIPE_ICD
            );
            println!("{}", common::SKIP);
        }
    }
}

#[test]
fn nv12_layer_scaled_2x() {
    let g = gpu_or_skip!();
    // Padded stride to exercise row pitch handling.
    let src = pattern::nv12_gradient_strided(64, 48, 80, 1).unwrap();
    let dl = FrameLayout::packed(PixelFormat::Rgba8, 128, 96).unwrap();
    let layer = Layer::new(src.as_ref(), Rect::full(128, 96)).with_blend(false);
    let (mut a, mut b) = (frame(dl), frame(dl));
    g.composite(&[layer], a.as_mut()).unwrap();
    cpu().composite(&[layer], b.as_mut()).unwrap();
    assert_close("nv12 2x", &a, &b, MAX, MEAN);
}

#[test]
fn yuv420p_layer_cropped_into_bgra() {
    let g = gpu_or_skip!();
    let src = pattern::yuv420p_gradient(128, 96, 2).unwrap();
    // Destination with a padded stride and BGRA byte order; odd crop offsets.
    let dl = FrameLayout::with_stride(PixelFormat::Bgra8, 128, 96, 128 * 4 + 48).unwrap();
    let layer =
        Layer::new(src.as_ref(), Rect::new(10, 8, 100, 70)).with_crop(Rect::new(17, 9, 71, 51));
    let clear = Clear::Color([30, 60, 90, 255]);
    let (mut a, mut b) = (frame(dl), frame(dl));
    g.composite_with(&[layer], a.as_mut(), clear).unwrap();
    cpu().composite_with(&[layer], b.as_mut(), clear).unwrap();
    assert_close("yuv420p crop", &a, &b, MAX, MEAN);
    // The clear colour must survive outside the layer, in BGRA order.
    assert_eq!(&a.data[0..4], &[90, 60, 30, 255]);
}

fn rotated_layers<'a>(
    bottom: &'a virtsoc_gpu::OwnedFrame,
    top: &'a virtsoc_gpu::OwnedFrame,
    rot: Rotation,
) -> Vec<Layer<'a>> {
    vec![
        Layer::new(bottom.as_ref(), Rect::full(128, 96)).with_blend(false),
        Layer::new(top.as_ref(), Rect::new(30, 10, 60, 80))
            .with_rotation(rot)
            .with_alpha(0.7),
        // Partly off-screen, upside down, translucent.
        Layer::new(top.as_ref(), Rect::new(-20, 50, 64, 48))
            .with_rotation(Rotation::R180)
            .with_alpha(0.5),
    ]
}

#[test]
fn rgba_layer_rotated_90_blended_over_another() {
    let g = gpu_or_skip!();
    let bottom = pattern::rgb_gradient(PixelFormat::Rgba8, 128, 96, |_, _| 255).unwrap();
    let top = pattern::rgb_gradient(PixelFormat::Bgra8, 80, 60, |x, y| {
        ((x * 3 + y * 2) % 256) as u8
    })
    .unwrap();
    let layers = rotated_layers(&bottom, &top, Rotation::R90);
    let dl = FrameLayout::packed(PixelFormat::Rgba8, 128, 96).unwrap();
    let (mut a, mut b) = (frame(dl), frame(dl));
    g.composite(&layers, a.as_mut()).unwrap();
    cpu().composite(&layers, b.as_mut()).unwrap();
    assert_close("rgba rot90 blend", &a, &b, MAX, MEAN);
}

#[test]
fn comparison_detects_a_wrong_rotation() {
    // Negative control: the same scene with 270 instead of 90 degrees must
    // exceed the tolerance, so the comparisons above can fail.
    let g = gpu_or_skip!();
    let bottom = pattern::rgb_gradient(PixelFormat::Rgba8, 128, 96, |_, _| 255).unwrap();
    let top = pattern::rgb_gradient(PixelFormat::Rgba8, 80, 60, |_, _| 255).unwrap();
    let dl = FrameLayout::packed(PixelFormat::Rgba8, 128, 96).unwrap();
    let (mut a, mut b) = (frame(dl), frame(dl));
    g.composite(&rotated_layers(&bottom, &top, Rotation::R90), a.as_mut())
        .unwrap();
    cpu()
        .composite(&rotated_layers(&bottom, &top, Rotation::R270), b.as_mut())
        .unwrap();
    let d = diff(&a, &b);
    assert!(d.max > MAX, "wrong rotation went unnoticed: {d:?}");
}

#[test]
fn composite_keep_draws_over_existing_contents() {
    let g = gpu_or_skip!();
    let base = pattern::rgb_gradient(PixelFormat::Rgba8, 128, 96, |_, _| 200).unwrap();
    let src = pattern::nv12_gradient(32, 24, 3).unwrap();
    let layer = Layer::new(src.as_ref(), Rect::new(40, 30, 48, 36)).with_alpha(0.6);
    let (mut a, mut b) = (base.clone(), base.clone());
    g.composite_with(&[layer], a.as_mut(), Clear::Keep).unwrap();
    cpu()
        .composite_with(&[layer], b.as_mut(), Clear::Keep)
        .unwrap();
    assert_close("keep", &a, &b, MAX, MEAN);
    assert_eq!(
        &a.data[..4],
        &base.data[..4],
        "pixels outside the layer must be kept"
    );
}

#[test]
fn equirect_projection_two_views() {
    let g = gpu_or_skip!();
    let rgba = pattern::equirect_rgba(256, 128).unwrap();
    let nv12 = pattern::equirect_nv12(256, 128).unwrap();
    let dl = FrameLayout::packed(PixelFormat::Rgba8, 128, 96).unwrap();
    let views = [
        View {
            yaw: 0.0,
            pitch: 0.0,
            fov_y: 90f32.to_radians(),
        },
        // Looking back across the seam and down.
        View {
            yaw: 3.0,
            pitch: -0.6,
            fov_y: 60f32.to_radians(),
        },
    ];
    for (i, view) in views.iter().enumerate() {
        for (name, src) in [("rgba", &rgba), ("nv12", &nv12)] {
            let (mut a, mut b) = (frame(dl), frame(dl));
            g.project_equirect(src.as_ref(), *view, a.as_mut()).unwrap();
            cpu()
                .project_equirect(src.as_ref(), *view, b.as_mut())
                .unwrap();
            assert_close(
                &format!("equirect {name} view {i}"),
                &a,
                &b,
                EQ_MAX,
                EQ_MEAN,
            );
        }
    }
    // The two views must actually differ.
    let (mut a, mut b) = (frame(dl), frame(dl));
    g.project_equirect(rgba.as_ref(), views[0], a.as_mut())
        .unwrap();
    g.project_equirect(rgba.as_ref(), views[1], b.as_mut())
        .unwrap();
    assert!(diff(&a, &b).mean > 10.0);
}

#[test]
fn markers_over_existing_frame() {
    let g = gpu_or_skip!();
    let base = pattern::rgb_gradient(PixelFormat::Rgba8, 128, 96, |_, _| 255).unwrap();
    let markers = [
        Marker::square(20.0, 20.0, 10.0, [255, 0, 0, 255]),
        Marker::cross(64.3, 48.7, 21.0, [0, 255, 0, 200]),
        Marker::square(66.0, 50.0, 7.5, [0, 0, 255, 128]),
        Marker::cross(0.0, 95.0, 30.0, [255, 255, 0, 255]),
        Marker::square(127.5, 3.25, 1.0, [255, 0, 255, 255]),
    ];
    for format in [PixelFormat::Rgba8, PixelFormat::Bgra8] {
        let mut base = base.clone();
        if format == PixelFormat::Bgra8 {
            base.layout.format = format;
        }
        let (mut a, mut b) = (base.clone(), base.clone());
        g.draw_markers(&markers, a.as_mut()).unwrap();
        cpu().draw_markers(&markers, b.as_mut()).unwrap();
        assert_close(&format!("markers {format:?}"), &a, &b, MAX, MEAN);
        assert!(diff(&a, &base).max > 100, "markers drew nothing");
    }
}

#[test]
fn convert_compute_matches_cpu() {
    let g = gpu_or_skip!();
    let nv12 = pattern::nv12_gradient(128, 96, 4).unwrap();
    let i420 = pattern::yuv420p_gradient(128, 96, 5).unwrap();
    let bgra = pattern::rgb_gradient(PixelFormat::Bgra8, 128, 96, |x, _| x as u8).unwrap();
    let cases = [
        (
            "nv12 -> rgba downscale",
            nv12.as_ref(),
            FrameLayout::packed(PixelFormat::Rgba8, 96, 72).unwrap(),
        ),
        (
            "yuv420p -> bgra upscale",
            i420.as_ref(),
            FrameLayout::packed(PixelFormat::Bgra8, 160, 120).unwrap(),
        ),
        (
            "nv12 -> rgba same size, padded",
            nv12.as_ref(),
            FrameLayout::with_stride(PixelFormat::Rgba8, 128, 96, 600).unwrap(),
        ),
        (
            "bgra -> rgba",
            bgra.as_ref(),
            FrameLayout::packed(PixelFormat::Rgba8, 128, 96).unwrap(),
        ),
    ];
    for (name, src, dl) in cases {
        let (mut a, mut b) = (frame(dl), frame(dl));
        g.convert(src, a.as_mut()).unwrap();
        cpu().convert(src, b.as_mut()).unwrap();
        assert_close(name, &a, &b, MAX, MEAN);
    }
}

#[test]
fn submissions_are_numbered_and_waitable() {
    let g = gpu_or_skip!();
    let src = pattern::nv12_gradient(64, 48, 0).unwrap();
    let dl = FrameLayout::packed(PixelFormat::Rgba8, 64, 48).unwrap();
    let mut out = frame(dl);
    let p1 = g.submit_convert(src.as_ref(), dl).unwrap();
    let p2 = g.submit_convert(src.as_ref(), dl).unwrap();
    assert!(p2.submission() > p1.submission());
    assert!(g.last_submission() >= p2.submission());
    g.wait_submission(p2.submission()).unwrap();
    assert!(g.completed_submission() >= p2.submission());
    g.finish(p1, out.as_mut()).unwrap();
    let mut expect = frame(dl);
    cpu().convert(src.as_ref(), expect.as_mut()).unwrap();
    assert_close("pending convert", &out, &expect, MAX, MEAN);
    // A finish into the wrong size fails cleanly.
    let mut small = frame(FrameLayout::packed(PixelFormat::Rgba8, 32, 24).unwrap());
    assert!(g.finish(p2, small.as_mut()).is_err());
    assert!(g.wait_submission(u64::MAX).is_err());
}

#[test]
fn pools_stay_bounded() {
    let g = gpu_or_skip!();
    for i in 0..40u32 {
        let w = 16 + 2 * i;
        let src = pattern::nv12_gradient(w, 16, i).unwrap();
        let mut dst = frame(FrameLayout::packed(PixelFormat::Rgba8, w, 16).unwrap());
        g.composite(&[Layer::new(src.as_ref(), Rect::full(w, 16))], dst.as_mut())
            .unwrap();
    }
    let (textures, buffers) = g.pooled_resources();
    assert!(
        textures <= 24 && buffers <= 6,
        "pools grew: {textures} textures, {buffers} buffers"
    );
}

#[test]
fn measure_reports_timings() {
    let g = gpu_or_skip!();
    let t = virtsoc_gpu::measure(g, 128, 96).unwrap();
    assert_eq!(t.backend, "wgpu");
    assert!(t.median_total > std::time::Duration::ZERO);
    assert!(t.min_total <= t.median_total && t.median_total <= t.max_total);
}

#[test]
fn concurrent_callers_share_one_device() {
    let g = gpu_or_skip!();
    let src = pattern::yuv420p_gradient(64, 48, 6).unwrap();
    let dl = FrameLayout::packed(PixelFormat::Rgba8, 96, 72).unwrap();
    let mut expect = frame(dl);
    let layer = Layer::new(src.as_ref(), Rect::full(96, 72)).with_blend(false);
    cpu().composite(&[layer], expect.as_mut()).unwrap();
    std::thread::scope(|s| {
        for _ in 0..3 {
            s.spawn(|| {
                for _ in 0..4 {
                    let mut out = frame(dl);
                    g.composite(&[layer], out.as_mut()).unwrap();
                    assert_close("threaded", &out, &expect, MAX, MEAN);
                }
            });
        }
    });
}

#[test]
fn backends_are_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<virtsoc_gpu::WgpuBackend>();
    check::<CpuBackend>();
    check::<virtsoc_gpu::NullBackend>();
}
