//! Unit tests of the gpu device: records, markers, views, statuses, backends, budgets.

use super::*;
use virtsoc_gpu::{GpuError, PixelFormat};

#[test]
fn cost_counts_each_layer_clipped_to_the_target() {
    use crate::device::layers::LayerSpec;
    use virtsoc_gpu::{Rect, Rotation};
    let l = |x, y, w, h| LayerSpec {
        src: RegionId(1),
        crop: Rect::new(0, 0, 1, 1),
        dst: Rect::new(x, y, w, h),
        rotation: Rotation::R0,
        alpha: 1.0,
        blend: true,
    };
    // Inside, half off the right edge, wholly off screen, larger than the target.
    assert_eq!(
        composite_cost_in(&[l(0, 0, 10, 10)], Rect::full(100, 100)),
        100
    );
    assert_eq!(
        composite_cost_in(&[l(95, 0, 10, 10)], Rect::full(100, 100)),
        50
    );
    assert_eq!(
        composite_cost_in(&[l(-50, -50, 10, 10)], Rect::full(100, 100)),
        0
    );
    assert_eq!(
        composite_cost_in(&[l(-8, -8, 4096, 4096)], Rect::full(100, 100)),
        10_000
    );
    // Within a damaged rectangle, only the part of each layer inside it counts.
    assert_eq!(
        composite_cost_in(
            &[l(0, 0, 100, 100), l(90, 90, 50, 50)],
            Rect::new(80, 80, 20, 20)
        ),
        400 + 100
    );
    // 64 full-target layers cost 64 targets.
    assert_eq!(
        composite_cost_in(&vec![l(0, 0, 4096, 4096); 64], Rect::full(4096, 4096)),
        64 << 24
    );
    let gpu = Gpu::with_backend(Arc::new(NullBackend::new()), "null".into()).with_limits(
        &crate::Limits {
            gpu_cost: 8 * 100 * 100,
            ..crate::Limits::default()
        },
    );
    assert_eq!(
        gpu.check_cost_in(&vec![l(0, 0, 100, 100); 8], Rect::full(100, 100)),
        Ok(())
    );
    assert_eq!(
        gpu.check_cost_in(&vec![l(0, 0, 100, 100); 9], Rect::full(100, 100)),
        Err(Status::Busy)
    );
}

#[test]
fn submissions_in_flight_are_capped_per_guest() {
    let f = InFlight::new(2);
    assert!(f.take(GuestId(1)) && f.take(GuestId(1)));
    assert!(!f.take(GuestId(1)), "a third submission of guest 1 waits");
    assert!(f.take(GuestId(2)), "guest 2 is not held back by guest 1");
    f.release(GuestId(1));
    assert!(f.take(GuestId(1)));
    f.release(GuestId(1));
    f.release(GuestId(1));
    f.release(GuestId(2));
    assert!(f.by_guest.lock().unwrap().is_empty());
}

#[test]
fn views_map() {
    let v = view_of([(-1_570_796i64) as u64, 250_000, 1_570_796]);
    assert!((v.yaw + std::f32::consts::FRAC_PI_2).abs() < 1e-5);
    assert!((v.pitch - 0.25).abs() < 1e-6);
    assert!((v.fov_y - std::f32::consts::FRAC_PI_2).abs() < 1e-5);
}

#[test]
fn markers_are_validated() {
    let m = MarkerRecord {
        x: 10,
        y: -3,
        size: 6,
        rgba: [1, 2, 3, 4],
    };
    assert_eq!(
        marker_of(&m),
        Ok(Marker::square(10.0, -3.0, 6.0, [1, 2, 3, 4]))
    );
    assert_eq!(
        marker_of(&MarkerRecord { size: 0, ..m }),
        Err(Status::BadArgument)
    );
    assert_eq!(
        marker_of(&MarkerRecord { x: i32::MAX, ..m }),
        Err(Status::BadArgument)
    );
}

#[test]
fn backend_errors_map_to_statuses() {
    assert_eq!(
        status_of(&GpuError::InvalidParameter("x".into())),
        Status::BadArgument
    );
    assert_eq!(
        status_of(&GpuError::Frame(virtsoc_gpu::FrameError::BufferTooSmall {
            needed: 2,
            got: 1
        })),
        Status::OutOfRange
    );
    assert_eq!(
        status_of(&GpuError::UnsupportedFormat {
            op: "convert",
            role: "destination",
            format: PixelFormat::Nv12
        }),
        Status::NotSupported
    );
    assert_eq!(
        status_of(&GpuError::DeviceLost("gone".into())),
        Status::DeviceError
    );
}

#[test]
fn backends_are_chosen_by_name_and_the_timeline_advances() {
    let cfg = |gpu| DeviceConfig {
        gpu,
        ..DeviceConfig::default()
    };
    let g = Gpu::new(&cfg(GpuBackendKind::Cpu)).unwrap();
    assert_eq!(g.backend_name(), "cpu");
    let n = Gpu::new(&cfg(GpuBackendKind::Null)).unwrap();
    assert_eq!(n.backend_name(), "null");
    assert!(n.backend().starts_with("null"));
    // One good and one failing call: both retire their sequence numbers.
    let src = virtsoc_gpu::OwnedFrame::new(FrameLayout::packed(PixelFormat::Nv12, 8, 4).unwrap())
        .unwrap();
    let mut dst =
        virtsoc_gpu::OwnedFrame::new(FrameLayout::packed(PixelFormat::Rgba8, 8, 4).unwrap())
            .unwrap();
    g.convert_frame(src.as_ref(), dst.as_mut()).unwrap();
    let mut yuv =
        virtsoc_gpu::OwnedFrame::new(FrameLayout::packed(PixelFormat::Nv12, 8, 4).unwrap())
            .unwrap();
    assert_eq!(
        g.convert_frame(src.as_ref(), yuv.as_mut()),
        Err(Status::NotSupported)
    );
    assert_eq!(g.timeline_counts(), (2, 2));
    assert!(
        g.backend().contains("2 submitted, 2 completed"),
        "{}",
        g.backend()
    );
}

/// A composite's damage argument: 0 and a rectangle covering the target are the whole
/// target; a rectangle inside it is kept; empty or reaching outside is `BadArgument`.
#[test]
fn damage_rectangles_are_checked() {
    let pack = virtsoc_devapi::pack_damage;
    assert_eq!(damage_rect(0, 100, 50), Ok(None));
    assert_eq!(damage_rect(pack(0, 0, 100, 50), 100, 50), Ok(None));
    assert_eq!(
        damage_rect(pack(10, 20, 30, 5), 100, 50),
        Ok(Some(virtsoc_gpu::Rect::new(10, 20, 30, 5)))
    );
    for bad in [pack(0, 0, 0, 5), pack(90, 0, 11, 5), pack(0, 46, 10, 5)] {
        assert_eq!(damage_rect(bad, 100, 50), Err(Status::BadArgument));
    }
}
