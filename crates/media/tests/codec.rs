//! Codec backends. The decoder suite runs against every decoder backend and every codec whose
//! encoder the installed `ffmpeg` CLI has: clips are generated at test time, golden per-frame
//! MD5s come from `ffmpeg -f framemd5`, and every decoded frame must hash the same.

mod common;

use std::path::{Path, PathBuf};

use common::{gen_clip, golden_md5, has_encoder, md5_hex, Rng, TempDir};
use virtsoc_media::codec::StreamInfo;
use virtsoc_media::{
    measure_decode_fps, CodecKind, DecodedFrame, DecoderBackend, Demuxer, EncoderPreset,
    FfmpegDecoder, FfmpegEncoder, FrameLayout, FrameMut, FrameRef, MediaError, NullDecoder,
    PixelFormat,
};

struct Clip {
    path: PathBuf,
    kind: CodecKind,
    width: u32,
    height: u32,
    frames: usize,
}

/// A codec whose clip cannot be made is skipped, loudly; under `VIRTSOC_REQUIRE_ALL` (what
/// `make test` sets, with `scripts/install-deps.sh`'s ffmpeg) that is a failure.
fn skip_codec(why: &str) {
    assert!(
        std::env::var_os("VIRTSOC_REQUIRE_ALL").is_none(),
        "{why} and VIRTSOC_REQUIRE_ALL is set"
    );
    println!("SKIP {why}");
}

/// Generates one clip per codec the local ffmpeg can encode; prints why others are skipped.
fn make_clips(dir: &Path) -> Vec<Clip> {
    let mut clips = Vec::new();
    let mut add = |file: &str, kind, w, h, n: u32, args: &[&str]| {
        clips.push(Clip {
            path: gen_clip(dir, file, w, h, n, args),
            kind,
            width: w,
            height: h,
            frames: n as usize,
        });
    };
    assert!(
        has_encoder("libx264"),
        "the ffmpeg CLI has no libx264 encoder; the H.264 decoder tests need it"
    );
    // B-frames (x264 default) exercise reordering; MP4 gives avcC extradata.
    add(
        "h264.mp4",
        CodecKind::H264,
        320,
        240,
        30,
        &["-c:v", "libx264", "-pix_fmt", "yuv420p"],
    );
    // Raw Annex-B elementary stream, decoded with FfmpegDecoder::new (no extradata).
    add(
        "h264.h264",
        CodecKind::H264,
        176,
        144,
        20,
        &["-c:v", "libx264", "-pix_fmt", "yuv420p", "-f", "h264"],
    );
    if has_encoder("libx265") {
        add(
            "hevc.mp4",
            CodecKind::Hevc,
            320,
            240,
            20,
            &[
                "-c:v",
                "libx265",
                "-pix_fmt",
                "yuv420p",
                "-x265-params",
                "log-level=error",
            ],
        );
    } else {
        skip_codec("hevc: the ffmpeg CLI has no libx265 encoder");
    }
    if has_encoder("libvpx-vp9") {
        add(
            "vp9.webm",
            CodecKind::Vp9,
            320,
            240,
            20,
            &[
                "-c:v",
                "libvpx-vp9",
                "-deadline",
                "realtime",
                "-cpu-used",
                "8",
                "-pix_fmt",
                "yuv420p",
            ],
        );
    } else {
        skip_codec("vp9: the ffmpeg CLI has no libvpx-vp9 encoder");
    }
    if has_encoder("libsvtav1") {
        add(
            "av1.mkv",
            CodecKind::Av1,
            320,
            240,
            10,
            &["-c:v", "libsvtav1", "-preset", "12", "-pix_fmt", "yuv420p"],
        );
    } else if has_encoder("libaom-av1") {
        add(
            "av1.mkv",
            CodecKind::Av1,
            160,
            120,
            10,
            &[
                "-c:v",
                "libaom-av1",
                "-cpu-used",
                "8",
                "-pix_fmt",
                "yuv420p",
            ],
        );
    } else {
        skip_codec("av1: the ffmpeg CLI has no AV1 encoder");
    }
    clips
}

type Factory = Box<dyn Fn(&StreamInfo) -> virtsoc_media::Result<Box<dyn DecoderBackend>>>;

/// Every decoder backend under test, with its output format.
fn backends() -> Vec<(String, PixelFormat, Factory)> {
    let mut v: Vec<(String, PixelFormat, Factory)> = Vec::new();
    // Pictures copied out at once, and (with frame threads) held in libavcodec's buffers
    // until copied out by `copy_into`.
    for (threads, hold) in [(1usize, false), (2, false), (2, true)] {
        for out in [PixelFormat::Yuv420p, PixelFormat::Nv12] {
            v.push((
                format!("ffmpeg threads={threads} out={out:?} hold={hold}"),
                out,
                Box::new(move |info: &StreamInfo| {
                    let mut d = if info.extradata.is_empty() {
                        FfmpegDecoder::new(info.codec.unwrap(), out, threads)?
                    } else {
                        FfmpegDecoder::for_stream(info, out, threads)?
                    };
                    d.hold_pictures(hold);
                    Ok(Box::new(d) as Box<dyn DecoderBackend>)
                }),
            ));
        }
    }
    v
}

/// The picture's packed bytes (copied out of the decoder's buffers when it holds them).
fn packed(f: &DecodedFrame) -> Vec<u8> {
    if !f.is_held() {
        return f.data.clone();
    }
    assert!(f.data.is_empty(), "a held picture has no bytes of its own");
    let mut v = vec![0u8; f.layout.size()];
    f.copy_into(FrameMut::new(f.layout, &mut v).unwrap())
        .unwrap();
    v
}

/// Decodes every packet of `path`; a decode error fails the test.
fn decode_file(dec: &mut dyn DecoderBackend, path: &Path) -> (Vec<DecodedFrame>, usize) {
    let mut demux = Demuxer::open(path).unwrap();
    let mut frames = Vec::new();
    let mut packets = 0;
    while let Some(p) = demux.read_packet().unwrap() {
        packets += 1;
        frames.extend(
            dec.decode(&p.data, p.pts)
                .unwrap_or_else(|e| panic!("{} on {}: {e}", dec.name(), path.display())),
        );
    }
    frames.extend(dec.flush().unwrap());
    (frames, packets)
}

/// The frame as packed YUV420P bytes (what `-f framemd5 -pix_fmt yuv420p` hashes).
fn as_yuv420p(f: &DecodedFrame) -> Vec<u8> {
    let data = packed(f);
    match f.layout.format {
        PixelFormat::Yuv420p => data,
        PixelFormat::Nv12 => {
            let luma = (f.layout.width * f.layout.height) as usize;
            let mut out = data[..luma].to_vec();
            let uv = &data[luma..];
            out.extend(uv.iter().step_by(2));
            out.extend(uv.iter().skip(1).step_by(2));
            out
        }
        other => panic!("decoder produced {other:?}"),
    }
}

#[test]
fn decoder_suite_matches_ffmpeg_cli_hashes() {
    let dir = TempDir::new("suite");
    let clips = make_clips(dir.path());
    for clip in &clips {
        let golden = golden_md5(&clip.path);
        assert_eq!(
            golden.len(),
            clip.frames,
            "ffmpeg CLI frame count of {}",
            clip.path.display()
        );
        let info = Demuxer::open(&clip.path).unwrap().info().clone();
        assert_eq!(info.codec, Some(clip.kind));
        for (name, out, make) in backends() {
            let mut dec = match make(&info) {
                Ok(d) => d,
                Err(MediaError::Unsupported(why)) => {
                    println!("SKIP {name} on {:?}: {why}", clip.kind);
                    continue;
                }
                Err(e) => panic!("{name}: {e}"),
            };
            let (frames, _) = decode_file(dec.as_mut(), &clip.path);
            let hashes: Vec<String> = frames.iter().map(|f| md5_hex(&as_yuv420p(f))).collect();
            assert_eq!(
                hashes.len(),
                golden.len(),
                "{name} on {}: frame count",
                clip.path.display()
            );
            for (i, (h, g)) in hashes.iter().zip(&golden).enumerate() {
                assert_eq!(
                    h,
                    g,
                    "{name} on {}: frame {i} differs from ffmpeg",
                    clip.path.display()
                );
            }
            let want = FrameLayout::packed(out, clip.width, clip.height).unwrap();
            // Held when asked, converted (NV12 here) when copied out.
            let held = name.ends_with("hold=true");
            assert!(frames.iter().all(|f| f.layout == want
                && f.is_held() == held
                && (held || f.data.len() == want.size())));
            assert_eq!(dec.output_layout(), Some(want));
            // Raw elementary streams carry no timestamps (the demuxer numbers packets in
            // decode order), so only container clips must come out in increasing pts.
            let raw = clip.path.extension().is_some_and(|e| e == "h264");
            assert!(
                raw || frames.windows(2).all(|w| w[0].pts < w[1].pts),
                "{name}: pts not increasing: {:?}",
                frames.iter().map(|f| f.pts).collect::<Vec<_>>()
            );
            println!("{name} on {:?}: {} frames match", clip.kind, frames.len());
        }
        // The null backend cannot reproduce pictures; it must answer every packet with one
        // picture of its configured layout carrying the packet's pts.
        let want = FrameLayout::packed(PixelFormat::Nv12, clip.width, clip.height).unwrap();
        let mut null = NullDecoder::pattern(want).unwrap();
        let mut demux = Demuxer::open(&clip.path).unwrap();
        let mut packets = 0;
        while let Some(p) = demux.read_packet().unwrap() {
            packets += 1;
            let f = null.decode(&p.data, p.pts).unwrap();
            assert_eq!(f.len(), 1);
            assert_eq!((f[0].pts, f[0].layout), (p.pts, want));
        }
        assert!(null.flush().unwrap().is_empty());
        assert_eq!(packets, clip.frames);
    }
}

#[test]
fn null_decoder_plumbing() {
    let layout = FrameLayout::packed(PixelFormat::Nv12, 64, 48).unwrap();
    let mut d = NullDecoder::pattern(layout).unwrap();
    assert_eq!(d.output_layout(), Some(layout));
    let f = d.decode(&[1, 2, 3], 42).unwrap();
    assert_eq!(f.len(), 1);
    assert_eq!(
        (f[0].pts, f[0].layout, f[0].data.len()),
        (42, layout, layout.size())
    );
    assert!(d.decode(&[], 43).unwrap().is_empty());
    assert!(d.flush().unwrap().is_empty());
    let mut d = NullDecoder::discarding();
    assert!(d.decode(&[1, 2, 3], 1).unwrap().is_empty());
    assert_eq!(d.output_layout(), None);
    let rgba = FrameLayout::packed(PixelFormat::Rgba8, 64, 48).unwrap();
    assert!(matches!(
        NullDecoder::pattern(rgba),
        Err(MediaError::Unsupported(_))
    ));
}

#[test]
fn bad_configuration_is_an_error() {
    assert!(matches!(
        FfmpegDecoder::new(CodecKind::H264, PixelFormat::Rgba8, 1),
        Err(MediaError::Unsupported(_))
    ));
    assert!(matches!(
        Demuxer::open("/nonexistent/clip.mp4"),
        Err(MediaError::File { .. })
    ));
    let dir = TempDir::new("garbage");
    let junk = dir.path().join("junk.mp4");
    let mut bytes = vec![0u8; 10000];
    Rng::new(7).fill(&mut bytes);
    std::fs::write(&junk, &bytes).unwrap();
    assert!(Demuxer::open(&junk).is_err());
    assert!(FfmpegEncoder::new_h264(15, 16, 30, 1_000_000).is_err());
    assert!(FfmpegEncoder::new_h264(64, 48, 0, 1_000_000).is_err());
}

/// A decoder made with a lower picture limit decodes pictures up to it and refuses larger
/// ones (what the `device_commands` fuzz target relies on to stay fast).
#[test]
fn a_lower_picture_limit_refuses_larger_pictures() {
    let dir = TempDir::new("limit");
    let raw = gen_clip(
        dir.path(),
        "small.h264",
        176,
        144,
        5,
        &["-c:v", "libx264", "-pix_fmt", "yuv420p", "-f", "h264"],
    );
    let decode = |max: u32| {
        let mut dec =
            FfmpegDecoder::with_max_pixels(CodecKind::H264, PixelFormat::Yuv420p, 1, max).unwrap();
        let mut demux = Demuxer::open(&raw).unwrap();
        let (mut frames, mut errors) = (0, 0);
        while let Some(p) = demux.read_packet().unwrap() {
            match dec.decode(&p.data, p.pts) {
                Ok(f) => frames += f.len(),
                Err(_) => errors += 1,
            }
        }
        frames += dec.flush().map(|f| f.len()).unwrap_or(0);
        (frames, errors)
    };
    // libavcodec checks the coded size (macroblock rows rounded up), a little above 176 x 144.
    assert_eq!(decode(2 * 176 * 144), (5, 0));
    let (frames, errors) = decode(176 * 144 / 2);
    assert_eq!(frames, 0, "a picture above the limit came out");
    assert!(errors > 0, "the decoder refused nothing");
}

#[test]
fn random_bytes_never_crash_any_decoder() {
    let dir = TempDir::new("random");
    let raw = gen_clip(
        dir.path(),
        "ok.h264",
        176,
        144,
        10,
        &["-c:v", "libx264", "-f", "h264"],
    );
    let mut rng = Rng::new(0x5eed);
    for kind in CodecKind::ALL {
        for threads in [1, 2] {
            let mut dec = match FfmpegDecoder::new(kind, PixelFormat::Yuv420p, threads) {
                Ok(d) => d,
                Err(MediaError::Unsupported(why)) => {
                    skip_codec(&format!("{kind:?}: {why}"));
                    continue;
                }
                Err(e) => panic!("{e}"),
            };
            let mut errors = 0;
            for i in 0..200u32 {
                let len = 1 + (rng.next_u64() % 4096) as usize;
                let mut pkt = vec![0u8; len];
                rng.fill(&mut pkt);
                if i % 2 == 0 && len > 4 {
                    // Start codes get random data past the H.264/HEVC parsers.
                    pkt[..4].copy_from_slice(&[0, 0, 0, 1]);
                }
                match dec.decode(&pkt, i as i64) {
                    Ok(_) => {}
                    Err(MediaError::Decode(_)) => errors += 1,
                    Err(e) => panic!("{kind:?}: unexpected error kind {e}"),
                }
            }
            let _ = dec.flush();
            println!(
                "{kind:?} threads={threads}: {errors} packets rejected, error_count {}",
                dec.error_count()
            );
            if kind == CodecKind::H264 {
                // Still usable: a valid stream decodes after the garbage.
                let (frames, _) = decode_file(&mut dec, &raw);
                assert_eq!(frames.len(), 10, "H.264 decoder unusable after garbage");
            }
        }
    }
}

#[test]
fn truncated_and_damaged_files_never_crash() {
    let dir = TempDir::new("trunc");
    let mp4 = gen_clip(
        dir.path(),
        "full.mp4",
        320,
        240,
        30,
        &["-c:v", "libx264", "-movflags", "+faststart"],
    );
    let raw = gen_clip(
        dir.path(),
        "full.h264",
        320,
        240,
        30,
        &["-c:v", "libx264", "-f", "h264"],
    );
    for (src, name) in [(&mp4, "cut.mp4"), (&raw, "cut.h264")] {
        let bytes = std::fs::read(src).unwrap();
        let cut = dir.path().join(name);
        std::fs::write(&cut, &bytes[..bytes.len() / 2 + 123]).unwrap();
        let mut demux = match Demuxer::open(&cut) {
            Ok(d) => d,
            Err(e) => {
                println!("{name}: open failed cleanly: {e}");
                continue;
            }
        };
        let mut dec = demux.decoder(PixelFormat::Yuv420p, 2).unwrap();
        let (mut frames, mut errors) = (0, 0);
        loop {
            match demux.read_packet() {
                Ok(Some(p)) => match dec.decode(&p.data, p.pts) {
                    Ok(f) => frames += f.len(),
                    Err(_) => errors += 1,
                },
                Ok(None) => break,
                Err(e) => {
                    println!("{name}: demux error {e}");
                    break;
                }
            }
        }
        frames += dec.flush().map(|f| f.len()).unwrap_or(0);
        println!("{name}: {frames} frames, {errors} decode errors");
        assert!(
            frames > 0 && frames < 30,
            "{name}: {frames} frames from half a file"
        );
    }
    // Bit flips inside every third packet of a valid stream.
    let mut demux = Demuxer::open(&raw).unwrap();
    let mut dec = demux.decoder(PixelFormat::Nv12, 2).unwrap();
    let mut rng = Rng::new(99);
    let mut n = 0;
    while let Some(mut p) = demux.read_packet().unwrap() {
        n += 1;
        if n % 3 == 0 {
            for _ in 0..8 {
                let i = (rng.next_u64() as usize) % p.data.len();
                p.data[i] ^= 1 << (rng.next_u64() % 8);
            }
        }
        let _ = dec.decode(&p.data, p.pts);
    }
    let _ = dec.flush();
}

#[test]
fn demuxer_reports_stream_and_rewinds() {
    let dir = TempDir::new("demux");
    let mp4 = gen_clip(dir.path(), "c.mp4", 320, 240, 15, &["-c:v", "libx264"]);
    let mut d = Demuxer::open(&mp4).unwrap();
    let info = d.info().clone();
    assert_eq!(info.codec, Some(CodecKind::H264));
    assert_eq!((info.width, info.height), (320, 240));
    assert!((info.fps().unwrap() - 30.0).abs() < 0.01, "{info:?}");
    assert!(!info.extradata.is_empty());
    let first = d.read_packet().unwrap().unwrap();
    assert!(first.keyframe);
    let mut n = 1;
    while d.read_packet().unwrap().is_some() {
        n += 1;
    }
    assert_eq!(n, 15);
    d.rewind().unwrap();
    assert_eq!(d.read_packet().unwrap().unwrap(), first);
}

#[test]
fn measure_decode_fps_reports_a_rate() {
    let dir = TempDir::new("fps");
    let mp4 = gen_clip(dir.path(), "c.mp4", 320, 240, 30, &["-c:v", "libx264"]);
    for threads in [1, 2] {
        let fps = measure_decode_fps(&mp4, threads).unwrap();
        assert!(fps.is_finite() && fps > 1.0, "{fps}");
    }
}

/// Y plane PSNR in dB.
fn psnr_y(a: &[u8], b: &[u8]) -> f64 {
    let mse = a
        .iter()
        .zip(b)
        .map(|(x, y)| (*x as f64 - *y as f64).powi(2))
        .sum::<f64>()
        / a.len() as f64;
    10.0 * (255.0f64 * 255.0 / mse.max(1e-9)).log10()
}

#[test]
fn h264_encoder_round_trips_through_decoder() {
    for preset in EncoderPreset::ALL {
        assert_eq!(EncoderPreset::from_name(preset.name()), Some(preset));
        h264_round_trip(preset);
    }
    assert_eq!(EncoderPreset::from_name("placebo"), None);
}

fn h264_round_trip(preset: EncoderPreset) {
    let (w, h) = (320u32, 240u32);
    let mut enc = match FfmpegEncoder::new_h264_with(w, h, 30, 2_000_000, preset) {
        Ok(e) => e,
        Err(e) => panic!("no H.264 encoder: {e}"),
    };
    println!(
        "encoder: {} {} ({})",
        enc.name(),
        preset.name(),
        enc.bitstream_format()
    );
    let mut inputs = Vec::new();
    let mut packets = Vec::new();
    for i in 0..30i64 {
        let format = if i % 2 == 0 {
            PixelFormat::Yuv420p
        } else {
            PixelFormat::Nv12
        };
        let l = FrameLayout::packed(format, w, h).unwrap();
        let mut buf = vec![128u8; l.size()];
        for y in 0..h as usize {
            for x in 0..w as usize {
                buf[y * w as usize + x] =
                    (16 + ((x + 2 * i as usize) * 200 / w as usize) + y / 8) as u8;
            }
        }
        // Chroma: U 90 and V 170 (interleaved in NV12), so a swap or a smear shows.
        let luma = (w * h) as usize;
        for (k, b) in buf[luma..].iter_mut().enumerate() {
            let u = match format {
                PixelFormat::Nv12 => k % 2 == 0,
                _ => k < luma / 4,
            };
            *b = if u { CHROMA_U } else { CHROMA_V };
        }
        inputs.push(buf[..luma].to_vec());
        packets.extend(enc.encode(FrameRef::new(l, &buf).unwrap(), i).unwrap());
    }
    packets.extend(enc.flush().unwrap());
    assert_eq!(packets.len(), 30);
    assert!(packets[0].keyframe);
    assert!(packets[0].data.starts_with(&[0, 0, 0, 1]) || packets[0].data.starts_with(&[0, 0, 1]));
    assert!(packets.iter().all(|p| p.dts <= p.pts));
    // Wrong size or format is refused.
    let bad = FrameLayout::packed(PixelFormat::Rgba8, w, h).unwrap();
    assert!(enc
        .encode(FrameRef::new(bad, &vec![0; bad.size()]).unwrap(), 99)
        .is_err());

    let mut dec = FfmpegDecoder::new(CodecKind::H264, PixelFormat::Yuv420p, 2).unwrap();
    let mut frames = Vec::new();
    for p in &packets {
        frames.extend(dec.decode(&p.data, p.pts).unwrap());
    }
    frames.extend(dec.flush().unwrap());
    assert_eq!(frames.len(), 30);
    for (i, f) in frames.iter().enumerate() {
        assert_eq!(f.pts, i as i64);
        let p = psnr_y(&f.data[..(w * h) as usize], &inputs[i]);
        assert!(p > 30.0, "{}: frame {i}: PSNR {p:.1} dB", preset.name());
        // The decoder gives YUV420P: U then V, each a quarter of the luma.
        let luma = (w * h) as usize;
        let mean = |b: &[u8]| b.iter().map(|&x| x as f64).sum::<f64>() / b.len() as f64;
        let (u, v) = (
            mean(&f.data[luma..luma * 5 / 4]),
            mean(&f.data[luma * 5 / 4..luma * 3 / 2]),
        );
        assert!(
            (u - CHROMA_U as f64).abs() < 4.0 && (v - CHROMA_V as f64).abs() < 4.0,
            "{}: frame {i}: chroma U {u:.1} V {v:.1}",
            preset.name()
        );
    }
}

/// The chroma values of the encoder round trip's input.
const CHROMA_U: u8 = 90;
const CHROMA_V: u8 = 170;
