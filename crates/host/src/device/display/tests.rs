//! Unit tests of the display device (no daemon: the device on its own).

use super::screen::{lock, percentile};
use super::*;
use std::time::Duration;
use virtsoc_devapi::display::StatsReply;
use virtsoc_fence::table::{FenceId, VirtualFenceTable};
use virtsoc_fence::{FenceStatus, MemPage};
use virtsoc_proto::wire::Format;

fn display(hz: u32) -> (Display, PathBuf) {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let dir = std::env::temp_dir().join(format!("virtsoc-display-unit-{}-{n}", std::process::id()));
    let cfg = DeviceConfig {
        refresh_hz: hz,
        snapshot_dir: dir.clone(),
        ..DeviceConfig::default()
    };
    (Display::new(&cfg, None).unwrap(), dir)
}

fn table() -> Arc<VirtualFenceTable> {
    Arc::new(VirtualFenceTable::new(Arc::new(MemPage::new())))
}

/// Waits (bounded) for the next vsync after now, through a vsync fence.
fn next_vsync(d: &Display, guest: GuestId, t: &Arc<VirtualFenceTable>) {
    let f = t.create().unwrap();
    d.screen.signal_at_vsync(guest, t, f).unwrap();
    assert_eq!(
        t.wait(f, Some(Duration::from_secs(10))).unwrap(),
        FenceStatus::Signaled,
        "no vsync within 10 s"
    );
}

fn rgba_frame(w: u32, h: u32, seed: u8, capture_ns: Option<u64>) -> (Vec<u8>, vd::PresentedFrame) {
    let bytes: Vec<u8> = (0..w * h * 4)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect();
    let f = ScanoutFormat::of(Format::Rgba8).unwrap();
    let frame = f.frame(bytes.clone().into(), w, h, w * 4, capture_ns);
    (bytes, frame)
}

#[test]
fn formats_and_geometry_are_checked() {
    assert_eq!(ScanoutFormat::of(Format::Nv12), Err(Status::NotSupported));
    assert_eq!(ScanoutFormat::of(Format::Blob), Err(Status::NotSupported));
    assert_eq!(ScanoutFormat::of(Format::Yuyv), Err(Status::NotSupported));
    let f = ScanoutFormat::of(Format::Bgra8).unwrap();
    assert_eq!(f.required_len(4, 2, 16, 32), Ok(32));
    assert_eq!(
        f.required_len(4, 2, 20, 36),
        Ok(36),
        "no padding after the last row"
    );
    assert_eq!(
        f.required_len(4, 2, 12, 32),
        Err(Status::BadArgument),
        "stride"
    );
    assert_eq!(
        f.required_len(4, 2, 16, 31),
        Err(Status::BadArgument),
        "size"
    );
    assert_eq!(f.required_len(0, 2, 16, 32), Err(Status::BadArgument));
}

#[test]
fn percentiles_use_nearest_rank() {
    assert_eq!(percentile(&[], 50), 0);
    assert_eq!(percentile(&[7], 99), 7);
    let v: Vec<u64> = (1..=100).collect();
    assert_eq!(percentile(&v, 50), 50);
    assert_eq!(percentile(&v, 99), 99);
    assert_eq!(percentile(&[1, 2, 3], 50), 2);
}

#[test]
fn stats_count_every_frame_once_and_measure_latency() {
    let (d, _) = display(200);
    let t = table();
    let g = GuestId(1);
    assert_eq!(d.screen.stats(g), StatsReply::default());
    let now = crate::clock::now_ns();
    for i in 0..5u8 {
        let (_, frame) = rgba_frame(8, 4, i, Some(now));
        d.screen.present(g, frame).unwrap();
    }
    // The display queues two frames: three vsyncs drain it whatever the phase.
    for _ in 0..3 {
        next_vsync(&d, g, &t);
    }
    let s = d.screen.stats(g);
    assert_eq!(s.presented + s.dropped, 5, "{s:?}");
    assert!(s.presented >= 1, "{s:?}");
    assert!(s.vsyncs >= 2, "{s:?}");
    assert_eq!(s.samples, s.presented, "every frame carried a capture time");
    assert!(
        s.latency_p50_ns > 0 && s.latency_p50_ns <= s.latency_p99_ns,
        "{s:?}"
    );
    // Frame ids are distinct and increasing.
    let a = d.screen.present(g, rgba_frame(8, 4, 9, None).1).unwrap();
    let b = d.screen.present(g, rgba_frame(8, 4, 9, None).1).unwrap();
    assert!(b > a);
}

#[test]
fn a_stamped_capture_time_is_read_from_the_pixels() {
    let (d, _) = display(200);
    let t = table();
    let (w, h) = (160, 64);
    let mut bytes = vec![0u8; (w * h * 4) as usize];
    let stamped = crate::clock::now_ns();
    let layout =
        virtsoc_media::FrameLayout::packed(virtsoc_media::PixelFormat::Rgba8, w, h).unwrap();
    virtsoc_media::stamp_timestamp(
        virtsoc_media::FrameMut::new(layout, &mut bytes).unwrap(),
        stamped,
    )
    .unwrap();
    let f = ScanoutFormat::of(Format::Rgba8).unwrap();
    let frame = f.frame(bytes.clone().into(), w, h, w * 4, None);
    assert_eq!(frame.capture_ns, Some(stamped));
    // An explicit capture time wins over the stamp.
    assert_eq!(
        f.frame(bytes.into(), w, h, w * 4, Some(5)).capture_ns,
        Some(5)
    );
    // Unstamped pixels carry none.
    assert_eq!(rgba_frame(64, 64, 3, None).1.capture_ns, None);

    d.screen.present(GuestId(7), frame).unwrap();
    next_vsync(&d, GuestId(7), &t);
    let s = d.screen.stats(GuestId(7));
    assert_eq!((s.presented, s.samples), (1, 1), "{s:?}");
    let elapsed = crate::clock::now_ns() - stamped;
    assert!(s.latency_p50_ns > 0 && s.latency_p50_ns <= elapsed, "{s:?}");
}

#[test]
fn snapshot_writes_the_presented_pixels() {
    let (d, dir) = display(200);
    let t = table();
    assert_eq!(d.snapshot(), Err(Status::Busy), "nothing on screen yet");
    // A BGRA frame with padded rows: the PNG holds its pixels as RGBA.
    let (w, h, stride) = (5u32, 3u32, 24u32);
    let bgra: Vec<u8> = (0..stride * h).map(|i| (i * 7 + 1) as u8).collect();
    let f = ScanoutFormat::of(Format::Bgra8).unwrap();
    let id = d
        .screen
        .present(GuestId(3), f.frame(bgra.clone().into(), w, h, stride, None))
        .unwrap();
    next_vsync(&d, GuestId(3), &t);
    assert_eq!(d.snapshot(), Ok(id));
    let png = std::fs::read(dir.join(format!("virtsoc-display-{id}.png"))).unwrap();

    let mut rgba = Vec::new();
    for y in 0..h {
        for x in 0..w {
            let p = (y * stride + x * 4) as usize;
            rgba.extend_from_slice(&[bgra[p + 2], bgra[p + 1], bgra[p], bgra[p + 3]]);
        }
    }
    let expected = vd::PresentedFrame::new(0, w, h, vd::PixelFormat::Rgba8, rgba);
    let mut want = Vec::new();
    vd::encode_png(&expected, &mut want).unwrap();
    assert_eq!(png, want, "the PNG encodes exactly the presented pixels");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn unknown_fences_are_refused_and_gone_guests_forgotten() {
    let (d, _) = display(200);
    let t = table();
    assert_eq!(
        d.screen
            .signal_at_vsync(GuestId(1), &t, FenceId::from_u64(0x5_0000_0003)),
        Err(Status::BadArgument)
    );
    // A gone guest's pending fence is never signaled.
    let other = table();
    let f = other.create().unwrap();
    d.screen.signal_at_vsync(GuestId(2), &other, f).unwrap();
    d.guest_gone(GuestId(2));
    next_vsync(&d, GuestId(1), &t);
    next_vsync(&d, GuestId(1), &t);
    assert_eq!(other.status(f).unwrap(), FenceStatus::Pending);
}

#[test]
fn the_first_presenter_owns_the_screen_until_it_goes() {
    let (d, dir) = display(200);
    let t = table();
    let (a, b) = (GuestId(10), GuestId(20));
    d.screen.present(a, rgba_frame(8, 4, 1, None).1).unwrap();
    let hidden = d.screen.present(b, rgba_frame(8, 4, 2, None).1).unwrap();
    next_vsync(&d, a, &t);
    next_vsync(&d, a, &t);
    let (sa, sb) = (d.screen.stats(a), d.screen.stats(b));
    assert_eq!((sa.presented, sa.dropped), (1, 0), "{sa:?}");
    assert_eq!((sb.presented, sb.dropped), (0, 1), "background: {sb:?}");
    assert_ne!(d.snapshot(), Ok(hidden));

    // A goes: B, the latest presenter, gets the screen and its hidden frame shows.
    d.guest_gone(a);
    next_vsync(&d, b, &t);
    next_vsync(&d, b, &t);
    assert_eq!(d.snapshot(), Ok(hidden));
    d.screen.present(b, rgba_frame(8, 4, 3, None).1).unwrap();
    next_vsync(&d, b, &t);
    next_vsync(&d, b, &t);
    let sb = d.screen.stats(b);
    assert_eq!((sb.presented, sb.dropped), (1, 1), "{sb:?}");

    // B goes too: the next guest to present takes the screen.
    d.guest_gone(b);
    let c = GuestId(30);
    let shown = d.screen.present(c, rgba_frame(8, 4, 4, None).1).unwrap();
    next_vsync(&d, c, &t);
    next_vsync(&d, c, &t);
    assert_eq!(d.snapshot(), Ok(shown));
    let sc = d.screen.stats(c);
    assert_eq!((sc.presented, sc.dropped), (1, 0), "{sc:?}");
    {
        let st = lock(&d.screen.state);
        assert_eq!(st.guests.len(), 1);
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn refused_frames_change_nothing() {
    let (d, _) = display(200);
    let f = ScanoutFormat::of(Format::Rgba8).unwrap();
    let huge = f.frame(vec![0u8; 4 * 20_000].into(), 20_000, 1, 80_000, None);
    assert_eq!(d.screen.present(GuestId(4), huge), Err(Status::BadArgument));
    let st = lock(&d.screen.state);
    assert!(st.guests.is_empty() && st.foreground.is_none());
}

#[test]
fn bad_refresh_rates_are_configuration_errors() {
    let cfg = DeviceConfig {
        refresh_hz: 0,
        ..DeviceConfig::default()
    };
    assert!(matches!(
        Display::new(&cfg, None),
        Err(HostError::Config(_))
    ));
}

#[test]
fn backend_describes_the_screen() {
    let (d, dir) = display(60);
    let b = d.backend();
    assert!(b.starts_with("headless 1920x1080@60Hz (vsync thread), 4 planes, PNG snapshots to "));
    assert!(b.ends_with(&dir.display().to_string()));
}

#[test]
fn display_backends_are_checked() {
    use crate::device::registry::DisplayBackendKind;
    assert_eq!(
        Output::new(DisplayBackendKind::Headless).unwrap(),
        Output::Headless
    );
    match Output::new(DisplayBackendKind::Window) {
        Ok(Output::Window { display, surface }) if cfg!(feature = "window") => {
            assert_eq!(std::env::var("DISPLAY").unwrap(), display);
            assert!(!surface);
        }
        Ok(o) => panic!("{o:?}"),
        Err(HostError::Config(m)) if cfg!(feature = "window") => {
            assert!(m.contains("$DISPLAY"), "{m}")
        }
        Err(HostError::Config(m)) => {
            assert!(m.contains("not built") && m.contains("window"), "{m}")
        }
        Err(e) => panic!("{e}"),
    }
}

/// A guest's frame counters move with its snapshot: restored into another display, its
/// `presented` and `dropped` go on from where they were (a frame still waiting for a vsync
/// when it was saved counts as dropped); a record with more frames shown than presented is
/// refused.
#[test]
fn frame_counters_move_with_a_guest() {
    let (a, dir_a) = display(200);
    let t = table();
    for seed in 0..3 {
        a.screen
            .present(GuestId(10), rgba_frame(8, 4, seed, None).1)
            .unwrap();
        next_vsync(&a, GuestId(10), &t);
    }
    next_vsync(&a, GuestId(10), &t);
    let before = a.screen.stats(GuestId(10));
    assert_eq!(before.presented + before.dropped, 3, "{before:?}");
    let record = a
        .export_guest(GuestId(10))
        .expect("a record for a guest that presented");
    assert_eq!(record["submitted"], 3, "{record}");

    let (b, dir_b) = display(200);
    b.import_guest(GuestId(77), &record).unwrap();
    let after = b.screen.stats(GuestId(77));
    assert_eq!(
        (after.presented, after.dropped),
        (before.presented, before.dropped),
        "{after:?}"
    );
    let bad = serde_json::json!({ "foreground": false, "submitted": 1, "presented": 2 });
    assert!(b.import_guest(GuestId(78), &bad).is_err());
    // A guest that never used the display has no record.
    assert!(b.export_guest(GuestId(79)).is_none());
    let _ = std::fs::remove_dir_all(dir_a);
    let _ = std::fs::remove_dir_all(dir_b);
}

/// The consuming sink reads every byte of every plane of a frame once, in place, without
/// composing the screen: an NV12 video plane and an RGBA UI plane give their sizes' sum and
/// the CRC of their bytes in order.
#[test]
fn the_sink_reads_every_byte_of_every_plane() {
    use virtsoc_gpu::{FrameLayout, PixelFormat, Rect};
    let (w, h) = (64u32, 32u32);
    let plane = |format, seed: u8| {
        let layout = FrameLayout::packed(format, w, h).unwrap();
        let bytes: Vec<u8> = (0..layout.size())
            .map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed))
            .collect();
        let buf = virtsoc_svm::HostBuf::zeroed(bytes.len());
        buf.lock()[..bytes.len()].copy_from_slice(&bytes);
        let p = Plane {
            backing: virtsoc_svm::Backing::Host(buf),
            region: RegionId(seed as u64),
            generation: 1,
            layout,
            crop: Rect::new(0, 0, w, h),
            dst: Rect::new(0, 0, w, h),
            alpha: 1.0,
            blend: seed == 2,
        };
        (p, bytes)
    };
    let (video, vb) = plane(PixelFormat::Nv12, 1);
    let (ui, ub) = plane(PixelFormat::Rgba8, 2);
    let ledger = planes::Ledger {
        svm: Arc::new(virtsoc_svm::SvmManager::new(virtsoc_svm::Topology::new())),
        guest: GuestId(1),
        domain: virtsoc_svm::DomainId(0),
    };
    let set: Arc<dyn vd::FrameHandle> = Arc::new(PlaneSet::new(w, h, vec![video, ui], ledger));
    let frame = vd::PresentedFrame::new(1, w, h, vd::PixelFormat::Rgba8, set);
    let mut want = crc32fast::Hasher::new();
    want.update(&vb);
    want.update(&ub);
    let (crc, bytes) = vd::sink::consume(&frame, &mut Vec::new()).expect("readable planes");
    assert_eq!(bytes, (w * h * 3 / 2 + w * h * 4) as u64);
    assert_eq!(crc, want.finalize());
}
