//! The decoder in a worker process: the same pictures as in process, and a worker killed
//! mid-stream (as a crash in libavcodec would end it) is a decode error for that decoder
//! alone, never for the process that owns it.
//!
//! The worker is this test binary run again with the `worker_main` filter and a socket as
//! stdin: `worker_main` serves the decoder then and passes trivially otherwise.

mod common;

use std::os::unix::fs::FileTypeExt;
use std::path::PathBuf;

use common::{gen_clip, TempDir};
use virtsoc_media::codec::serve_decoder;
use virtsoc_media::{
    CodecKind, DecoderBackend, Demuxer, FfmpegDecoder, MediaError, PixelFormat, ProcessDecoder,
};

#[test]
fn worker_main() {
    let stdin_is_socket = std::fs::metadata("/proc/self/fd/0")
        .map(|m| m.file_type().is_socket())
        .unwrap_or(false);
    if stdin_is_socket {
        let code = match serve_decoder() {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("worker: {e}");
                1
            }
        };
        std::process::exit(code);
    }
}

fn worker(threads: usize) -> ProcessDecoder {
    let exe: PathBuf = std::env::current_exe().unwrap();
    let args: Vec<String> = [
        "--exact",
        "worker_main",
        "--nocapture",
        "--test-threads",
        "1",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    ProcessDecoder::spawn(&exe, &args, CodecKind::H264, PixelFormat::Nv12, threads).unwrap()
}

fn packets(dir: &TempDir) -> Vec<(Vec<u8>, i64)> {
    let p = gen_clip(
        dir.path(),
        "w.h264",
        320,
        240,
        20,
        &["-c:v", "libx264", "-pix_fmt", "yuv420p", "-f", "h264"],
    );
    let mut d = Demuxer::open(&p).unwrap();
    let mut out = Vec::new();
    while let Some(p) = d.read_packet().unwrap() {
        out.push((p.data, p.pts));
    }
    out
}

#[test]
fn a_worker_decodes_what_the_process_decodes() {
    let dir = TempDir::new("worker-same");
    let pkts = packets(&dir);
    let mut local = FfmpegDecoder::new(CodecKind::H264, PixelFormat::Nv12, 2).unwrap();
    let mut remote = worker(2);
    assert!(
        remote.name().starts_with("worker-h264"),
        "{}",
        remote.name()
    );
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for (p, pts) in &pkts {
        a.extend(local.decode(p, *pts).unwrap());
        b.extend(remote.decode(p, *pts).unwrap());
    }
    a.extend(local.flush().unwrap());
    b.extend(remote.flush().unwrap());
    assert_eq!(a.len(), 20);
    assert_eq!(a, b, "the same pictures, flags and sizes");
}

#[test]
fn a_killed_worker_is_an_error_for_its_decoder_only() {
    let dir = TempDir::new("worker-kill");
    let pkts = packets(&dir);
    let mut d = worker(1);
    for (p, pts) in &pkts[..5] {
        d.decode(p, *pts).unwrap();
    }
    // A crash: the worker ends without a word.
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &d.pid().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    for (p, pts) in &pkts[5..8] {
        match d.decode(p, *pts) {
            Err(MediaError::Decode(why)) => {
                assert!(why.contains("decoder process"), "{why}")
            }
            other => panic!("a dead worker answered {other:?}"),
        }
    }
    assert!(matches!(d.flush(), Err(MediaError::Decode(_))));
    // This process goes on: a new worker decodes the stream.
    let mut again = worker(1);
    let mut n = 0;
    for (p, pts) in &pkts {
        n += again.decode(p, *pts).unwrap().len();
    }
    n += again.flush().unwrap().len();
    assert_eq!(n, 20);
}
