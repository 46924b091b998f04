//! Camera sources and pixel timestamps.

mod common;

use std::time::Duration;

use common::{gen_clip, Rng, TempDir};
use virtsoc_media::camera::timestamp::MIN_SIZE_8X8;
use virtsoc_media::{
    read_timestamp, stamp_timestamp, CameraSource, CodecKind, CpuIsp, DecoderBackend,
    FfmpegDecoder, FfmpegEncoder, FileCamera, FrameLayout, FrameMut, FrameRef, IspBackend,
    MediaError, PixelFormat, SwscaleIsp, SyntheticCamera,
};

const STAMPS: [u64; 6] = [
    0,
    1,
    u64::MAX,
    0x0123_4567_89ab_cdef,
    1_732_000_000_123_456_789,
    0x8000_0000_0000_0001,
];

fn capture(cam: &mut SyntheticCamera, ts: u64) -> Vec<u8> {
    let l = cam.layout();
    let mut buf = vec![0u8; l.size()];
    cam.capture(FrameMut::new(l, &mut buf).unwrap(), ts)
        .unwrap();
    buf
}

#[test]
fn timestamp_round_trips_in_every_format() {
    for &f in &PixelFormat::ALL {
        for (w, h) in [
            (320, 240),
            (40, 32),
            (MIN_SIZE_8X8.0, MIN_SIZE_8X8.1),
            (1920, 1080),
        ] {
            let mut cam = SyntheticCamera::new(w, h, 30, f).unwrap();
            for ts in STAMPS {
                let buf = capture(&mut cam, ts);
                let frame = FrameRef::new(cam.layout(), &buf).unwrap();
                assert_eq!(read_timestamp(frame), Some(ts), "{f:?} {w}x{h}");
            }
        }
    }
}

#[test]
fn timestamp_survives_conversion_and_scaling() {
    let isps: [&dyn IspBackend; 3] = [&SwscaleIsp::new(), &SwscaleIsp::accurate(), &CpuIsp::new()];
    let ts = 1_732_000_000_987_654_321u64;
    for isp in isps {
        for &sf in &PixelFormat::ALL {
            let (sw, sh) = MIN_SIZE_8X8;
            let mut cam = SyntheticCamera::new(sw, sh, 30, sf).unwrap();
            let buf = capture(&mut cam, ts);
            for &df in &PixelFormat::ALL {
                for (dw, dh) in [
                    (sw / 2, sh / 2),
                    (sw, sh),
                    (sw * 3 / 2, sh),
                    (sw / 2, sh / 4 * 2),
                ] {
                    let dl = FrameLayout::packed(df, dw, dh).unwrap();
                    let mut out = vec![0u8; dl.size()];
                    isp.convert(
                        FrameRef::new(cam.layout(), &buf).unwrap(),
                        FrameMut::new(dl, &mut out).unwrap(),
                    )
                    .unwrap();
                    assert_eq!(
                        read_timestamp(FrameRef::new(dl, &out).unwrap()),
                        Some(ts),
                        "{}: {sf:?} {sw}x{sh} -> {df:?} {dw}x{dh}",
                        isp.name()
                    );
                }
            }
        }
    }
}

#[test]
fn timestamp_survives_nv12_to_rgba_2x_downscale_at_1080p() {
    let mut cam = SyntheticCamera::new(1920, 1080, 30, PixelFormat::Nv12).unwrap();
    let dl = FrameLayout::packed(PixelFormat::Rgba8, 960, 540).unwrap();
    let isp = SwscaleIsp::new();
    for k in 0..5u64 {
        let ts = 1_000_000_007 * (k + 1);
        let buf = capture(&mut cam, ts);
        let mut out = vec![0u8; dl.size()];
        isp.convert(
            FrameRef::new(cam.layout(), &buf).unwrap(),
            FrameMut::new(dl, &mut out).unwrap(),
        )
        .unwrap();
        assert_eq!(read_timestamp(FrameRef::new(dl, &out).unwrap()), Some(ts));
    }
}

#[test]
fn timestamp_survives_h264_encode_and_decode() {
    let (w, h) = (320, 240);
    let mut cam = SyntheticCamera::new(w, h, 30, PixelFormat::Nv12).unwrap();
    let mut enc = FfmpegEncoder::new_h264(w, h, 30, 1_000_000).unwrap();
    let mut dec = FfmpegDecoder::new(CodecKind::H264, PixelFormat::Yuv420p, 1).unwrap();
    let mut decoded = Vec::new();
    for i in 0..15i64 {
        let buf = capture(&mut cam, 5_000_000_000 + i as u64 * 33_333_333);
        for p in enc
            .encode(FrameRef::new(cam.layout(), &buf).unwrap(), i)
            .unwrap()
        {
            decoded.extend(dec.decode(&p.data, p.pts).unwrap());
        }
    }
    for p in enc.flush().unwrap() {
        decoded.extend(dec.decode(&p.data, p.pts).unwrap());
    }
    decoded.extend(dec.flush().unwrap());
    assert_eq!(decoded.len(), 15);
    for f in &decoded {
        assert_eq!(
            read_timestamp(f.as_frame()),
            Some(5_000_000_000 + f.pts as u64 * 33_333_333),
            "frame {}",
            f.pts
        );
    }
}

#[test]
fn frames_without_a_timestamp_read_as_none() {
    let l = FrameLayout::packed(PixelFormat::Rgba8, 320, 240).unwrap();
    assert_eq!(
        read_timestamp(FrameRef::new(l, &vec![0; l.size()]).unwrap()),
        None
    );
    assert_eq!(
        read_timestamp(FrameRef::new(l, &vec![255; l.size()]).unwrap()),
        None
    );
    let mut noise = vec![0u8; l.size()];
    let mut rng = Rng::new(3);
    let mut hits = 0;
    for _ in 0..50 {
        rng.fill(&mut noise);
        hits += read_timestamp(FrameRef::new(l, &noise).unwrap()).is_some() as u32;
    }
    assert_eq!(hits, 0);
    // A stamp with one flipped data block fails the check byte.
    let y = FrameLayout::packed(PixelFormat::Yuv420p, 320, 240).unwrap();
    let mut buf = vec![128u8; y.size()];
    stamp_timestamp(FrameMut::new(y, &mut buf).unwrap(), 12345).unwrap();
    assert_eq!(read_timestamp(FrameRef::new(y, &buf).unwrap()), Some(12345));
    // Block (col 5, row 1) is x 80..96, y 15..30: invert it.
    for yy in 15..30 {
        for xx in 80..96 {
            buf[yy * 320 + xx] = 251 - buf[yy * 320 + xx];
        }
    }
    assert_eq!(read_timestamp(FrameRef::new(y, &buf).unwrap()), None);
    // Too-small frames are refused for stamping and read as None.
    let tiny = FrameLayout::packed(PixelFormat::Rgba8, 16, 16).unwrap();
    let mut t = vec![0u8; tiny.size()];
    assert!(stamp_timestamp(FrameMut::new(tiny, &mut t).unwrap(), 1).is_err());
    assert_eq!(read_timestamp(FrameRef::new(tiny, &t).unwrap()), None);
}

/// Brightness at (x, y): luma for YUV, mean of R, G, B for RGB.
fn brightness(l: FrameLayout, buf: &[u8], x: u32, y: u32) -> u32 {
    let (x, y, s) = (x as usize, y as usize, l.stride as usize);
    if l.format.is_yuv() {
        buf[y * s + x] as u32
    } else {
        buf[y * s + 4 * x..y * s + 4 * x + 3]
            .iter()
            .map(|&v| v as u32)
            .sum::<u32>()
            / 3
    }
}

#[test]
fn square_moves_and_is_where_marker_position_says() {
    for &f in &PixelFormat::ALL {
        let mut cam = SyntheticCamera::new(320, 240, 30, f).unwrap();
        assert_eq!(cam.frame_interval(), Duration::from_nanos(33_333_333));
        let l = cam.layout();
        let mut prev: Option<(Vec<u8>, (u32, u32))> = None;
        for i in 0..10u64 {
            let mut buf = vec![0u8; l.size()];
            let info = cam.capture(FrameMut::new(l, &mut buf).unwrap(), i).unwrap();
            assert_eq!(info.frame_index, i);
            let (x, y) = cam.marker_position(i);
            assert_eq!(info.marker, Some((x, y)));
            assert!(
                brightness(l, &buf, x, y) >= 234,
                "{f:?} frame {i}: square not at ({x},{y})"
            );
            // Inside the frame, below the timestamp strip.
            let half = cam.marker_size() / 2;
            assert!(x >= half && x + half <= 320 && y >= 60 + half && y + half <= 240);
            if let Some((pbuf, ppos)) = &prev {
                assert_ne!(*ppos, (x, y), "square did not move at frame {i}");
                assert_ne!(pbuf, &buf);
            }
            prev = Some((buf, (x, y)));
        }
    }
    // The path is a closed loop of 180 frames.
    let cam = SyntheticCamera::new(320, 240, 30, PixelFormat::Nv12).unwrap();
    assert_eq!(cam.marker_position(7), cam.marker_position(187));
}

#[test]
fn capture_checks_destination_and_accepts_padded_stride() {
    let mut cam = SyntheticCamera::new(64, 48, 60, PixelFormat::Nv12).unwrap();
    let wrong = FrameLayout::packed(PixelFormat::Rgba8, 64, 48).unwrap();
    let mut buf = vec![0u8; wrong.size()];
    assert!(matches!(
        cam.capture(FrameMut::new(wrong, &mut buf).unwrap(), 0),
        Err(MediaError::InvalidLayout(_))
    ));
    let padded = FrameLayout::with_stride(PixelFormat::Nv12, 64, 48, 128).unwrap();
    let mut buf = vec![0u8; padded.size()];
    cam.capture(FrameMut::new(padded, &mut buf).unwrap(), 77)
        .unwrap();
    assert_eq!(
        read_timestamp(FrameRef::new(padded, &buf).unwrap()),
        Some(77)
    );
    // Hand-built short buffer.
    let l = cam.layout();
    let mut short = vec![0u8; 10];
    let bad = FrameMut {
        layout: l,
        data: &mut short,
    };
    assert!(cam.capture(bad, 0).is_err());
    assert!(SyntheticCamera::new(38, 32, 30, PixelFormat::Rgba8).is_err());
    assert!(SyntheticCamera::new(64, 48, 0, PixelFormat::Rgba8).is_err());
    assert!(SyntheticCamera::new(63, 48, 30, PixelFormat::Nv12).is_err());
}

#[test]
fn file_camera_loops_a_generated_clip() {
    let dir = TempDir::new("filecam");
    let clip = gen_clip(
        dir.path(),
        "loop.mp4",
        320,
        240,
        10,
        &["-c:v", "libx264", "-pix_fmt", "yuv420p"],
    );
    let mut cam = FileCamera::open(&clip, PixelFormat::Rgba8).unwrap();
    let l = cam.layout();
    assert_eq!(
        (l.format, l.width, l.height),
        (PixelFormat::Rgba8, 320, 240)
    );
    assert!((cam.frame_interval().as_secs_f64() - 1.0 / 30.0).abs() < 1e-6);
    let mut frames = Vec::new();
    let mut pts = Vec::new();
    for i in 0..25u64 {
        let mut buf = vec![0u8; l.size()];
        let info = cam.capture(FrameMut::new(l, &mut buf).unwrap(), i).unwrap();
        assert_eq!(info.frame_index, i);
        pts.push(info.source_pts.unwrap());
        frames.push(buf);
    }
    assert_eq!(cam.loops(), 2);
    assert_eq!(pts[..10], pts[10..20]);
    assert_eq!(pts[..5], pts[20..25]);
    assert_eq!(frames[0], frames[10]);
    assert_eq!(frames[3], frames[23]);
    assert_ne!(frames[0], frames[1]);
    assert_eq!(cam.decode_errors(), 0);
    // With stamping on, the capture time is readable.
    cam.set_stamp_timestamps(true);
    let mut buf = vec![0u8; l.size()];
    cam.capture(FrameMut::new(l, &mut buf).unwrap(), 424242)
        .unwrap();
    assert_eq!(
        read_timestamp(FrameRef::new(l, &buf).unwrap()),
        Some(424242)
    );
    // Wrong destination.
    let nv12 = FrameLayout::packed(PixelFormat::Nv12, 320, 240).unwrap();
    let mut b = vec![0u8; nv12.size()];
    assert!(cam
        .capture(FrameMut::new(nv12, &mut b).unwrap(), 0)
        .is_err());
}

#[test]
fn file_camera_refuses_non_video() {
    let dir = TempDir::new("filecam-bad");
    let p = dir.path().join("x.mp4");
    std::fs::write(&p, b"definitely not a video").unwrap();
    assert!(FileCamera::open(&p, PixelFormat::Nv12).is_err());
    assert!(FileCamera::open(dir.path().join("missing.mp4"), PixelFormat::Nv12).is_err());
}
