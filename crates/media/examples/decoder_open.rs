//! How long opening a decoder in a worker process takes, with workers started ahead and
//! without: `cargo run --release -p virtsoc-media --example decoder_open [OPENS]`.
//!
//! The example is its own worker program: run with a socket as stdin, it serves a decoder.

use std::os::unix::fs::FileTypeExt;
use std::time::{Duration, Instant};

use virtsoc_media::codec::serve_decoder;
use virtsoc_media::{CodecKind, DecoderPool, PixelFormat, ProcessDecoder};

fn main() {
    let stdin_is_socket = std::fs::metadata("/proc/self/fd/0")
        .map(|m| m.file_type().is_socket())
        .unwrap_or(false);
    if stdin_is_socket {
        std::process::exit(match serve_decoder() {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("worker: {e}");
                1
            }
        });
    }
    let opens: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(20);
    let exe = std::env::current_exe().expect("own path");
    for spare in [0, 2] {
        let pool = DecoderPool::new(&exe, &[], spare);
        let mut ms = Vec::new();
        for _ in 0..opens {
            // Time for the pool to start the next spare worker between two opens.
            std::thread::sleep(Duration::from_millis(300));
            let t = Instant::now();
            let d = ProcessDecoder::open(&pool, CodecKind::H264, PixelFormat::Nv12, 2)
                .expect("open a decoder");
            ms.push(t.elapsed().as_secs_f64() * 1e3);
            drop(d);
        }
        ms.sort_by(f64::total_cmp);
        println!(
            "spare workers {spare}: open_decoder p50 {:.2} ms, max {:.2} ms ({opens} opens)",
            ms[ms.len() / 2],
            ms[ms.len() - 1]
        );
    }
}
