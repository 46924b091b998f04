//! A worker's libavcodec decodes straight into the buffers it shares with its parent
//! (`get_buffer2`): every picture arrives uncopied, a buffer the parent still holds is never
//! decoded into again (held pictures keep their pixels while the stream goes on), and a
//! worker that dies leaves nothing of its buffers mapped once its pictures are dropped.
//!
//! The worker is this test binary run again with the `worker_main` filter and a socket as
//! stdin (as in `decoder_worker.rs`).

mod common;

use std::path::PathBuf;

use common::{gen_clip, TempDir};
use virtsoc_media::codec::serve_decoder;
use virtsoc_media::{
    CodecKind, DecodedFrame, DecoderBackend, DecoderPool, Demuxer, FfmpegDecoder, PixelFormat,
    ProcessDecoder,
};

#[test]
fn worker_main() {
    if common::stdin_is_socket() {
        common::exit_with(serve_decoder());
    }
}

fn worker(format: PixelFormat, threads: usize) -> ProcessDecoder {
    let exe: PathBuf = std::env::current_exe().unwrap();
    let args: Vec<String> = ["--exact", "worker_main", "--nocapture"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let pool = std::sync::Arc::new(DecoderPool::new(&exe, &args, 0));
    ProcessDecoder::open(&pool, CodecKind::H264, format, threads).unwrap()
}

/// A 30-frame 320x240 clip with B-frames (reordered output, several references).
fn packets(dir: &TempDir) -> Vec<(Vec<u8>, i64)> {
    let p = gen_clip(
        dir.path(),
        "s.h264",
        320,
        240,
        30,
        &["-c:v", "libx264", "-pix_fmt", "yuv420p", "-f", "h264"],
    );
    let mut d = Demuxer::open(&p).unwrap();
    let mut out = Vec::new();
    while let Some(p) = d.read_packet().unwrap() {
        out.push((p.data, p.pts));
    }
    out
}

fn decode_all(d: &mut dyn DecoderBackend, pkts: &[(Vec<u8>, i64)]) -> Vec<DecodedFrame> {
    let mut out = Vec::new();
    for (p, pts) in pkts {
        out.extend(d.decode(p, *pts).unwrap());
    }
    out.extend(d.flush().unwrap());
    out
}

fn pixels(f: &DecodedFrame) -> Vec<u8> {
    f.as_frame().data.to_vec()
}

/// Every picture of a stream held at once, in both output formats: each arrived in the
/// buffer libavcodec decoded it into, and each still has the pixels the in-process decoder
/// gives once the whole stream is decoded (a buffer decoded into again while held would
/// change them).
#[test]
fn held_pictures_keep_their_buffers_while_the_stream_goes_on() {
    let dir = TempDir::new("slots-held");
    let pkts = packets(&dir);
    for format in [PixelFormat::Nv12, PixelFormat::Yuv420p] {
        let want: Vec<_> = decode_all(
            &mut FfmpegDecoder::new(CodecKind::H264, format, 2).unwrap(),
            &pkts,
        )
        .iter()
        .map(|f| (f.pts, pixels(f)))
        .collect();
        let mut w = worker(format, 2);
        let got = decode_all(&mut w, &pkts);
        assert_eq!(got.len(), 30);
        assert!(
            got.iter().all(|f| f.uncopied() && f.data.is_empty()),
            "{format:?}: every picture in the buffer libavcodec decoded it into"
        );
        let got: Vec<_> = got.iter().map(|f| (f.pts, pixels(f))).collect();
        assert!(got == want, "{format:?}: held pictures changed");
    }
}

/// Pictures handed back as they are used (the daemon's pattern): buffers are reused, and
/// the pixels stay right.
#[test]
fn released_buffers_are_reused() {
    let dir = TempDir::new("slots-reuse");
    let pkts = packets(&dir);
    let mut local = FfmpegDecoder::new(CodecKind::H264, PixelFormat::Nv12, 2).unwrap();
    let mut w = worker(PixelFormat::Nv12, 2);
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for (p, pts) in pkts.iter().chain(&pkts) {
        a.extend(local.decode(p, *pts).unwrap().iter().map(pixels));
        b.extend(w.decode(p, *pts).unwrap().iter().map(pixels));
    }
    a.extend(local.flush().unwrap().iter().map(pixels));
    b.extend(w.flush().unwrap().iter().map(pixels));
    assert_eq!(a.len(), 60);
    assert!(a == b, "the same pixels");
    assert!(
        w.mapped_inodes().len() < 30,
        "{} buffers for a stream whose pictures were handed back",
        w.mapped_inodes().len()
    );
}

/// The memfd inodes mapped in this process (`/proc/self/maps`).
fn mapped_memfds() -> Vec<u64> {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .filter(|l| l.contains("virtsoc-picture"))
        .filter_map(|l| l.split_whitespace().nth(4)?.parse().ok())
        .collect()
}

/// A worker killed with packets in its frame threads and pictures held: held pictures stay
/// readable, the decoder forgets the worker's buffers at once, and once the pictures are
/// dropped none of them is mapped.
#[test]
fn a_dead_worker_leaves_no_buffer_mapped() {
    let dir = TempDir::new("slots-dead");
    let pkts = packets(&dir);
    let mut w = worker(PixelFormat::Nv12, 2);
    let mut held = Vec::new();
    for (p, pts) in &pkts[..10] {
        held.extend(w.decode(p, *pts).unwrap());
    }
    assert!(!held.is_empty());
    let inodes = w.mapped_inodes();
    assert!(!inodes.is_empty());
    assert!(inodes.iter().all(|i| mapped_memfds().contains(i)));
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &w.pid().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    assert!(w.decode(&pkts[10].0, pkts[10].1).is_err());
    assert!(w.mapped_inodes().is_empty(), "the dead worker's buffers");
    // Still readable.
    let before: Vec<_> = held.iter().map(pixels).collect();
    assert!(before.iter().all(|p| p.len() == 320 * 240 * 3 / 2));
    drop(held);
    let left: Vec<_> = mapped_memfds()
        .into_iter()
        .filter(|i| inodes.contains(i))
        .collect();
    assert!(left.is_empty(), "still mapped: {left:?}");
    drop(w);
}
