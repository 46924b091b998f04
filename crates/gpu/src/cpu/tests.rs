//! Unit tests of the CPU backend.

use super::*;
use crate::{FrameLayout, OwnedFrame};

#[test]
fn bt601_reference_points() {
    // Limited-range black, white and the primaries round-trip.
    let n = |v: f32| v / 255.0;
    let k = yuv_to_rgb(n(16.0), n(128.0), n(128.0));
    assert!(k.iter().all(|c| to_byte(*c) == 0), "{k:?}");
    let w = yuv_to_rgb(n(235.0), n(128.0), n(128.0));
    assert!(w.iter().all(|c| to_byte(*c) == 255), "{w:?}");
    // BT.601 red: Y=81, U=90, V=240.
    let r = yuv_to_rgb(n(81.0), n(90.0), n(240.0));
    assert!(
        to_byte(r[0]) >= 253 && to_byte(r[1]) <= 2 && to_byte(r[2]) <= 2,
        "{r:?}"
    );
}

#[test]
fn identity_copy_is_exact() {
    let src =
        crate::pattern::rgb_gradient(PixelFormat::Rgba8, 32, 16, |x, _| (x * 8) as u8).unwrap();
    let mut dst =
        OwnedFrame::new(FrameLayout::packed(PixelFormat::Rgba8, 32, 16).unwrap()).unwrap();
    let be = CpuBackend::with_threads(2);
    be.convert(src.as_ref(), dst.as_mut()).unwrap();
    assert_eq!(src.data, dst.data);
}

#[test]
fn bgra_destination_swaps_bytes() {
    let src = crate::pattern::rgb_gradient(PixelFormat::Rgba8, 8, 8, |_, _| 255).unwrap();
    let mut dst = OwnedFrame::new(FrameLayout::packed(PixelFormat::Bgra8, 8, 8).unwrap()).unwrap();
    CpuBackend::new()
        .convert(src.as_ref(), dst.as_mut())
        .unwrap();
    for (s, d) in src.data.chunks(4).zip(dst.data.chunks(4)) {
        assert_eq!([s[2], s[1], s[0], s[3]], [d[0], d[1], d[2], d[3]]);
    }
}

#[test]
fn rotation_90_moves_top_left_to_top_right() {
    // 2x1 source: left pixel red, right pixel green; rotated 90 cw into 1x2,
    // red must end on top.
    let mut src = OwnedFrame::new(FrameLayout::packed(PixelFormat::Rgba8, 2, 1).unwrap()).unwrap();
    src.data.copy_from_slice(&[255, 0, 0, 255, 0, 255, 0, 255]);
    let mut dst = OwnedFrame::new(FrameLayout::packed(PixelFormat::Rgba8, 1, 2).unwrap()).unwrap();
    let layer = Layer::new(src.as_ref(), Rect::full(1, 2)).with_rotation(Rotation::R90);
    CpuBackend::new().composite(&[layer], dst.as_mut()).unwrap();
    assert_eq!(&dst.data[..4], &[255, 0, 0, 255]);
    assert_eq!(&dst.data[4..], &[0, 255, 0, 255]);
}

#[test]
fn blend_half_alpha_over_black() {
    let mut src = OwnedFrame::new(FrameLayout::packed(PixelFormat::Rgba8, 1, 1).unwrap()).unwrap();
    src.data.copy_from_slice(&[200, 100, 50, 255]);
    let mut dst = OwnedFrame::new(FrameLayout::packed(PixelFormat::Rgba8, 1, 1).unwrap()).unwrap();
    let layer = Layer::new(src.as_ref(), Rect::full(1, 1)).with_alpha(0.5);
    CpuBackend::new().composite(&[layer], dst.as_mut()).unwrap();
    assert_eq!(dst.data, vec![100, 50, 25, 255]);
}

#[test]
fn crop_clamp_does_not_bleed() {
    // Left half white, right half black; crop the left half and scale up:
    // nothing of the black half may appear.
    let mut src = OwnedFrame::new(FrameLayout::packed(PixelFormat::Rgba8, 4, 2).unwrap()).unwrap();
    for (i, p) in src.data.chunks_mut(4).enumerate() {
        let v = if i % 4 < 2 { 255 } else { 0 };
        p.copy_from_slice(&[v, v, v, 255]);
    }
    let mut dst = OwnedFrame::new(FrameLayout::packed(PixelFormat::Rgba8, 16, 8).unwrap()).unwrap();
    let layer = Layer::new(src.as_ref(), Rect::full(16, 8)).with_crop(Rect::new(0, 0, 2, 2));
    CpuBackend::new().composite(&[layer], dst.as_mut()).unwrap();
    assert!(dst.data.iter().all(|&b| b == 255));
}

#[test]
fn equirect_forward_view_looks_at_centre() {
    let src = crate::pattern::equirect_rgba(256, 128).unwrap();
    let mut dst = OwnedFrame::new(FrameLayout::packed(PixelFormat::Rgba8, 9, 9).unwrap()).unwrap();
    let view = View {
        yaw: 0.0,
        pitch: 0.0,
        fov_y: 0.2,
    };
    CpuBackend::new()
        .project_equirect(src.as_ref(), view, dst.as_mut())
        .unwrap();
    // Centre pixel of the view ~ centre pixel of the panorama.
    let c = &dst.data[(4 * 9 + 4) * 4..(4 * 9 + 4) * 4 + 4];
    let o = (64 * 256 + 128) * 4;
    let s = &src.data[o..o + 4];
    for i in 0..3 {
        assert!((c[i] as i32 - s[i] as i32).abs() <= 3, "{c:?} vs {s:?}");
    }
}

#[test]
fn marker_cross_leaves_corners() {
    let mut dst =
        OwnedFrame::new(FrameLayout::packed(PixelFormat::Rgba8, 20, 20).unwrap()).unwrap();
    let m = Marker::cross(10.0, 10.0, 10.0, [255, 0, 0, 255]);
    CpuBackend::new().draw_markers(&[m], dst.as_mut()).unwrap();
    let at = |x: usize, y: usize| dst.data[(y * 20 + x) * 4];
    assert_eq!(at(10, 10), 255);
    assert_eq!(at(5, 10), 255);
    assert_eq!(at(6, 6), 0);
    assert_eq!(at(15, 10), 0);
}
