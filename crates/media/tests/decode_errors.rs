//! How the decoder reports damage, per packet and per picture, on clips made at test time by
//! the `ffmpeg` CLI: pictures decoded with concealment come out marked corrupt; with frame
//! threads a bad packet's error is reported with that packet's pts and sequence number, not
//! blamed on the later call it surfaces in; odd picture sizes are delivered cropped to even
//! and say so.

mod common;

use std::path::Path;

use common::{gen_clip, TempDir};
use virtsoc_media::{
    CodecKind, DecodedFrame, DecoderBackend, Demuxer, FfmpegDecoder, MediaError, PacketError,
    PixelFormat,
};

const FRAMES: u32 = 30;

/// The packets of a raw H.264 clip, as the demuxer cuts them, with pts = index.
fn packets(path: &Path) -> Vec<(Vec<u8>, i64)> {
    let mut d = Demuxer::open(path).unwrap();
    let mut out = Vec::new();
    while let Some(p) = d.read_packet().unwrap() {
        out.push(p.data);
    }
    out.into_iter().zip(0..).collect()
}

/// A 320x240 H.264 clip without B-frames (one picture per packet, in order), a key frame
/// only at the start.
fn clip(dir: &Path) -> Vec<(Vec<u8>, i64)> {
    let p = gen_clip(
        dir,
        "ipp.h264",
        320,
        240,
        FRAMES,
        &[
            "-c:v", "libx264", "-pix_fmt", "yuv420p", "-bf", "0", "-g", "1000", "-f", "h264",
        ],
    );
    let pkts = packets(&p);
    assert_eq!(pkts.len(), FRAMES as usize);
    pkts
}

/// What a run of a decoder gave.
#[derive(Default)]
struct Outcome {
    frames: Vec<DecodedFrame>,
    /// Calls that failed: (packet index, reason).
    failed: Vec<(usize, String)>,
    /// Failures reported after their call (`take_failures`), with the index of the call.
    later: Vec<(usize, PacketError)>,
}

/// Feeds `pkts` and flushes.
fn run(threads: usize, pkts: &[(Vec<u8>, i64)]) -> Outcome {
    let mut dec = FfmpegDecoder::new(CodecKind::H264, PixelFormat::Yuv420p, threads).unwrap();
    let mut o = Outcome::default();
    for (i, (p, pts)) in pkts.iter().enumerate() {
        match dec.decode(p, *pts) {
            Ok(f) => o.frames.extend(f),
            Err(MediaError::Decode(e)) => o.failed.push((i, e)),
            Err(e) => panic!("packet {i}: {e}"),
        }
        o.later
            .extend(dec.take_failures().into_iter().map(|f| (i, f)));
    }
    o.frames.extend(dec.flush().unwrap());
    o.later
        .extend(dec.take_failures().into_iter().map(|f| (pkts.len(), f)));
    o
}

/// Bytes with no NAL start code: libavcodec's H.264 decoder fails the packet outright.
fn junk() -> Vec<u8> {
    (0..3000u32).map(|x| (x * 7 + 0xa5) as u8 | 0x80).collect()
}

fn corrupt_pts(o: &Outcome) -> Vec<i64> {
    o.frames
        .iter()
        .filter(|f| f.corrupt)
        .map(|f| f.pts)
        .collect()
}

#[test]
fn concealed_damage_is_flagged_corrupt() {
    let dir = TempDir::new("conceal");
    let pkts = clip(dir.path());
    for threads in [1, 3] {
        let clean = run(threads, &pkts);
        assert_eq!(clean.frames.len(), FRAMES as usize);
        assert!(
            corrupt_pts(&clean).is_empty(),
            "threads {threads}: clean stream"
        );
        // The second half of picture 10's slice data overwritten: libavcodec conceals the
        // damaged macroblocks and says so on that picture.
        let mut damaged = pkts.clone();
        let p = &mut damaged[10].0;
        let from = p.len() / 3;
        for (i, b) in p.iter_mut().enumerate().skip(from) {
            *b = (i * 31) as u8;
        }
        let o = run(threads, &damaged);
        assert_eq!(o.frames.len(), FRAMES as usize, "threads {threads}");
        assert!(
            o.failed.is_empty() && o.later.is_empty(),
            "threads {threads}"
        );
        let corrupt = corrupt_pts(&o);
        assert!(
            corrupt.contains(&10),
            "threads {threads}: picture 10 not flagged, corrupt {corrupt:?}"
        );
        assert!(
            corrupt.iter().all(|&p| p >= 10),
            "threads {threads}: pictures before the damage flagged: {corrupt:?}"
        );
    }
}

#[test]
fn a_bad_packets_error_names_that_packet() {
    let dir = TempDir::new("attrib");
    let pkts = clip(dir.path());
    // Junk (pts 1000) as the 16th packet, and junk (pts 2000) as the last one before the
    // end of the stream.
    let mut fed = pkts.clone();
    fed.insert(15, (junk(), 1000));
    fed.push((junk(), 2000));
    let last = fed.len() - 1;

    // One thread: each packet's result comes out in its own call, which fails.
    let o = run(1, &fed);
    let calls: Vec<usize> = o.failed.iter().map(|(i, _)| *i).collect();
    assert_eq!(calls, [15, last], "{:?}", o.failed);
    assert!(o.failed[0].1.contains("Invalid data"), "{:?}", o.failed);
    assert!(o.later.is_empty(), "{:?}", o.later);
    assert_eq!(o.frames.len(), FRAMES as usize);

    // Frame threads: a packet's result comes out `threads - 1` packets later. The later
    // calls (good packets) succeed; the failures name the junk packets.
    let o = run(3, &fed);
    assert!(o.failed.is_empty(), "good packets blamed: {:?}", o.failed);
    let named: Vec<(i64, u64)> = o.later.iter().map(|(_, f)| (f.pts, f.seq)).collect();
    assert_eq!(
        named,
        [(1000, 16), (2000, last as u64 + 1)],
        "{:?}",
        o.later
    );
    // Reported during the call that fed the packet 2 later, and at the flush.
    let when: Vec<usize> = o.later.iter().map(|(i, _)| *i).collect();
    assert_eq!(when, [17, fed.len()]);
    assert!(o.later[0].1.reason.contains("Invalid data"));
    assert_eq!(o.frames.len(), FRAMES as usize);
}

#[test]
fn odd_sizes_are_delivered_cropped_and_say_so() {
    let dir = TempDir::new("odd");
    // 4:4:4, since x264 codes odd sizes only without chroma subsampling.
    let p = gen_clip(
        dir.path(),
        "odd.h264",
        322,
        242,
        5,
        &[
            "-vf",
            "format=yuv444p,crop=321:241:0:0",
            "-c:v",
            "libx264",
            "-f",
            "h264",
        ],
    );
    let o = run(1, &packets(&p));
    assert_eq!(o.frames.len(), 5);
    for f in &o.frames {
        assert_eq!((f.layout.width, f.layout.height), (320, 240));
        assert_eq!(f.picture_size, (321, 241));
        assert!(f.cropped());
    }
    let even = gen_clip(
        dir.path(),
        "even.h264",
        320,
        240,
        2,
        &["-c:v", "libx264", "-pix_fmt", "yuv420p", "-f", "h264"],
    );
    let o = run(1, &packets(&even));
    assert!(o
        .frames
        .iter()
        .all(|f| !f.cropped() && f.picture_size == (320, 240)));
}
