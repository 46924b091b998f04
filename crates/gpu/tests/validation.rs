//! Bad inputs produce errors (never panics) on every backend; the null backend
//! fills; measure works on the CPU and null backends.

mod common;

use common::frame;
use virtsoc_gpu::{
    pattern, Clear, CpuBackend, FrameError, FrameLayout, FrameMut, FrameRef, GpuBackend, GpuError,
    Layer, Marker, NullBackend, OwnedFrame, PixelFormat, Rect, View,
};

fn backends() -> Vec<&'static dyn GpuBackend> {
    static CPU: std::sync::OnceLock<CpuBackend> = std::sync::OnceLock::new();
    static NULL: std::sync::OnceLock<NullBackend> = std::sync::OnceLock::new();
    let mut v: Vec<&'static dyn GpuBackend> = vec![
        CPU.get_or_init(CpuBackend::new),
        NULL.get_or_init(NullBackend::new),
    ];
    match common::gpu() {
        Some(g) => v.push(g),
        None => println!("{} (wgpu validation cases)", common::SKIP),
    }
    v
}

/// A layout with its fields set by hand, unchecked: the backends must refuse a bad one.
fn raw(format: PixelFormat, width: u32, height: u32, stride: u32) -> FrameLayout {
    FrameLayout {
        format,
        width,
        height,
        stride,
    }
}

/// A view with its fields set by hand, unchecked.
fn view(layout: FrameLayout, data: &[u8]) -> FrameRef<'_> {
    FrameRef { layout, data }
}

/// A writable view with its fields set by hand, unchecked.
fn view_mut(layout: FrameLayout, data: &mut [u8]) -> FrameMut<'_> {
    FrameMut { layout, data }
}

fn rgba(w: u32, h: u32) -> OwnedFrame {
    frame(FrameLayout::packed(PixelFormat::Rgba8, w, h).unwrap())
}

/// Which error a bad case must produce.
type ErrorCheck = fn(&GpuError) -> bool;

const VIEW: View = View {
    yaw: 0.0,
    pitch: 0.0,
    fov_y: 1.0,
};

#[test]
fn bad_composite_arguments_are_errors() {
    let src = pattern::nv12_gradient(32, 24, 0).unwrap();
    let good = Layer::new(src.as_ref(), Rect::full(32, 24));
    for be in backends() {
        let name = be.name();
        let mut dst = rgba(32, 24);
        assert!(
            be.composite(&[good], dst.as_mut()).is_ok(),
            "{name}: good case failed"
        );

        let cases: Vec<(&str, Layer<'_>, ErrorCheck)> = vec![
            (
                "crop past right edge",
                good.with_crop(Rect::new(10, 0, 23, 24)),
                |e| matches!(e, GpuError::RectOutOfBounds { .. }),
            ),
            (
                "negative crop",
                good.with_crop(Rect::new(-1, 0, 8, 8)),
                |e| matches!(e, GpuError::RectOutOfBounds { .. }),
            ),
            ("zero crop", good.with_crop(Rect::new(0, 0, 0, 8)), |e| {
                matches!(e, GpuError::InvalidRect { .. })
            }),
            (
                "zero dst rect",
                Layer::new(src.as_ref(), Rect::new(0, 0, 8, 0)),
                |e| matches!(e, GpuError::InvalidRect { .. }),
            ),
            (
                "huge dst rect",
                Layer::new(src.as_ref(), Rect::new(i32::MIN, 0, 8, 8)),
                |e| matches!(e, GpuError::InvalidRect { .. }),
            ),
            ("alpha > 1", good.with_alpha(1.5), |e| {
                matches!(e, GpuError::InvalidParameter(_))
            }),
            ("alpha NaN", good.with_alpha(f32::NAN), |e| {
                matches!(e, GpuError::InvalidParameter(_))
            }),
            (
                "source buffer too small",
                Layer::new(view(src.layout, &src.data[..100]), Rect::full(32, 24)),
                |e| matches!(e, GpuError::Frame(FrameError::BufferTooSmall { .. })),
            ),
            (
                "odd NV12 size",
                Layer::new(
                    view(raw(PixelFormat::Nv12, 31, 24, 31), &src.data),
                    Rect::full(32, 24),
                ),
                |e| matches!(e, GpuError::Frame(FrameError::OddSize { .. })),
            ),
            (
                "source stride too small",
                Layer::new(
                    view(raw(PixelFormat::Rgba8, 8, 8, 16), &src.data),
                    Rect::full(32, 24),
                ),
                |e| matches!(e, GpuError::Frame(FrameError::StrideTooSmall { .. })),
            ),
            (
                "zero-sized source",
                Layer::new(
                    view(raw(PixelFormat::Rgba8, 0, 8, 0), &src.data),
                    Rect::full(8, 8),
                ),
                |e| matches!(e, GpuError::Frame(FrameError::ZeroSize { .. })),
            ),
        ];
        for (what, layer, ok) in cases {
            let r = be.composite(&[layer], dst.as_mut());
            match r {
                Err(e) => assert!(ok(&e), "{name}: {what}: unexpected error {e}"),
                Ok(_) => panic!("{name}: {what}: accepted"),
            }
        }

        // Destination problems.
        let mut yuv_dst = frame(FrameLayout::packed(PixelFormat::Nv12, 32, 24).unwrap());
        assert!(matches!(
            be.composite(&[good], yuv_dst.as_mut()),
            Err(GpuError::UnsupportedFormat { .. })
        ));
        let mut short = vec![0u8; 32 * 24 * 4 - 1];
        let r = be.composite(
            &[good],
            view_mut(raw(PixelFormat::Rgba8, 32, 24, 32 * 4), &mut short),
        );
        assert!(
            matches!(r, Err(GpuError::Frame(FrameError::BufferTooSmall { .. }))),
            "{name}: {r:?}"
        );
        let mut none: Vec<u8> = vec![];
        let r = be.composite(
            &[good],
            view_mut(raw(PixelFormat::Rgba8, 0, 0, 0), &mut none),
        );
        assert!(
            matches!(r, Err(GpuError::Frame(FrameError::ZeroSize { .. }))),
            "{name}: {r:?}"
        );
        let r = be.composite(
            &[good],
            view_mut(raw(PixelFormat::Rgba8, 100_000, 1, 100_000 * 4), &mut none),
        );
        assert!(
            matches!(r, Err(GpuError::Frame(FrameError::TooLarge { .. }))),
            "{name}: {r:?}"
        );
        let many = vec![good; virtsoc_gpu::MAX_LAYERS + 1];
        assert!(matches!(
            be.composite(&many, dst.as_mut()),
            Err(GpuError::TooMany { .. })
        ));
    }
}

#[test]
fn bad_equirect_marker_convert_arguments_are_errors() {
    let src = pattern::equirect_rgba(64, 32).unwrap();
    for be in backends() {
        let name = be.name();
        let mut dst = rgba(16, 16);
        assert!(
            be.project_equirect(src.as_ref(), VIEW, dst.as_mut())
                .is_ok(),
            "{name}"
        );
        for view in [
            View { fov_y: 0.0, ..VIEW },
            View { fov_y: 3.2, ..VIEW },
            View {
                yaw: f32::INFINITY,
                ..VIEW
            },
            View {
                pitch: f32::NAN,
                ..VIEW
            },
        ] {
            let r = be.project_equirect(src.as_ref(), view, dst.as_mut());
            assert!(
                matches!(r, Err(GpuError::InvalidParameter(_))),
                "{name}: {view:?}: {r:?}"
            );
        }
        let r = be.project_equirect(view(src.layout, &src.data[..10]), VIEW, dst.as_mut());
        assert!(
            matches!(r, Err(GpuError::Frame(FrameError::BufferTooSmall { .. }))),
            "{name}: {r:?}"
        );

        assert!(be
            .draw_markers(&[Marker::square(4.0, 4.0, 2.0, [1; 4])], dst.as_mut())
            .is_ok());
        assert!(be.draw_markers(&[], dst.as_mut()).is_ok());
        for m in [
            Marker::square(4.0, 4.0, 0.0, [1; 4]),
            Marker::square(4.0, 4.0, -3.0, [1; 4]),
            Marker::cross(f32::NAN, 4.0, 2.0, [1; 4]),
            Marker::cross(4.0, 1e30, 2.0, [1; 4]),
        ] {
            let r = be.draw_markers(&[m], dst.as_mut());
            assert!(
                matches!(r, Err(GpuError::InvalidParameter(_))),
                "{name}: {m:?}: {r:?}"
            );
        }

        let mut yuv_dst = frame(FrameLayout::packed(PixelFormat::Yuv420p, 16, 16).unwrap());
        let r = be.convert(src.as_ref(), yuv_dst.as_mut());
        assert!(
            matches!(r, Err(GpuError::UnsupportedFormat { .. })),
            "{name}: {r:?}"
        );
        let r = be.convert(
            view(raw(PixelFormat::Yuv420p, 16, 15, 16), &src.data),
            dst.as_mut(),
        );
        assert!(
            matches!(r, Err(GpuError::Frame(FrameError::OddSize { .. }))),
            "{name}: {r:?}"
        );
    }
}

#[test]
fn null_backend_fills_pixels_only() {
    let be = NullBackend::with_fill([1, 2, 3, 4]);
    let layout = FrameLayout::with_stride(PixelFormat::Bgra8, 3, 2, 16).unwrap();
    let mut f = frame(layout);
    f.data.fill(0xAA);
    be.composite_with(&[], f.as_mut(), Clear::Keep).unwrap();
    assert_eq!(&f.data[..12], &[3, 2, 1, 4, 3, 2, 1, 4, 3, 2, 1, 4]);
    assert_eq!(&f.data[12..16], &[0xAA; 4], "row padding untouched");
}

#[test]
fn measure_runs_on_cpu_and_null() {
    for be in [&CpuBackend::new() as &dyn GpuBackend, &NullBackend::new()] {
        let t = virtsoc_gpu::measure(be, 64, 48).unwrap();
        assert_eq!(t.runs, virtsoc_gpu::MEASURE_RUNS);
        assert_eq!((t.width, t.height), (64, 48));
        assert!(t.min_total <= t.median_total && t.median_total <= t.max_total);
    }
    assert!(
        virtsoc_gpu::measure(&CpuBackend::new(), 63, 48).is_err(),
        "odd NV12 width"
    );
}

#[test]
fn cpu_composite_of_yuv_matches_its_own_convert() {
    // Composition of one full-screen opaque layer and convert share one path.
    let src = pattern::yuv420p_gradient(64, 48, 9).unwrap();
    let (mut a, mut b) = (rgba(100, 70), rgba(100, 70));
    let be = CpuBackend::new();
    be.composite(
        &[Layer::new(src.as_ref(), Rect::full(100, 70)).with_blend(false)],
        a.as_mut(),
    )
    .unwrap();
    be.convert(src.as_ref(), b.as_mut()).unwrap();
    assert_eq!(a, b);
    assert!(common::distinct_values(&a) > 16);
}
