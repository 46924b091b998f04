//! Test helpers: a temporary directory, the `ffmpeg` CLI (clip generation, golden hashes),
//! a tiny deterministic PRNG.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// A directory removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        static N: AtomicU32 = AtomicU32::new(0);
        let p = std::env::temp_dir().join(format!(
            "virtsoc-media-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The `ffmpeg` binary. Panics with instructions if it is missing: the codec tests need it
/// and must not silently pass without it.
pub fn ffmpeg() -> &'static str {
    let ok = Command::new("ffmpeg")
        .arg("-version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(
        ok,
        "the `ffmpeg` command-line tool is required by virtsoc-media's codec/camera tests \
         (it generates the test clips and the golden frame hashes) but was not found on PATH; \
         install it with scripts/install-deps.sh (Debian package `ffmpeg`)"
    );
    "ffmpeg"
}

/// True if the `ffmpeg` CLI lists `name` among its encoders.
pub fn has_encoder(name: &str) -> bool {
    let out = Command::new(ffmpeg())
        .args(["-hide_banner", "-encoders"])
        .output()
        .expect("run ffmpeg -encoders");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .any(|l| l.split_whitespace().nth(1) == Some(name))
}

/// Runs `ffmpeg` with `args`, panicking with its stderr on failure.
pub fn run_ffmpeg(args: &[&str]) {
    let out = Command::new(ffmpeg())
        .args(["-hide_banner", "-loglevel", "error", "-y"])
        .args(args)
        .output()
        .expect("run ffmpeg");
    assert!(
        out.status.success(),
        "ffmpeg {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Generates a `testsrc2` clip of `frames` frames at 30 fps encoded with `codec_args`.
pub fn gen_clip(
    dir: &Path,
    file: &str,
    w: u32,
    h: u32,
    frames: u32,
    codec_args: &[&str],
) -> PathBuf {
    let path = dir.join(file);
    let src = format!("testsrc2=size={w}x{h}:rate=30");
    let frames = frames.to_string();
    let mut args = vec!["-f", "lavfi", "-i", &src, "-frames:v", &frames];
    args.extend_from_slice(codec_args);
    let p = path.to_str().unwrap().to_string();
    args.push(&p);
    run_ffmpeg(&args);
    path
}

/// Per-frame MD5 (hex) of the clip's decoded YUV420P frames, as the ffmpeg CLI computes them
/// (`-f framemd5`), in output order.
pub fn golden_md5(path: &Path) -> Vec<String> {
    let out = Command::new(ffmpeg())
        .args(["-hide_banner", "-loglevel", "error", "-threads", "1", "-i"])
        .arg(path)
        .args([
            "-map",
            "0:v:0",
            "-fps_mode",
            "passthrough",
            "-pix_fmt",
            "yuv420p",
            "-f",
            "framemd5",
            "-",
        ])
        .output()
        .expect("run ffmpeg framemd5");
    assert!(
        out.status.success(),
        "ffmpeg framemd5 of {} failed: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| l.rsplit(',').next().unwrap().trim().to_string())
        .collect()
}

/// MD5 (hex) of a byte slice.
pub fn md5_hex(data: &[u8]) -> String {
    use md5::{Digest, Md5};
    let d = Md5::digest(data);
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// xorshift64* PRNG for reproducible garbage.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub fn fill(&mut self, buf: &mut [u8]) {
        for b in buf {
            *b = self.next_u64() as u8;
        }
    }
}

/// Whether this test binary was started as a worker (a socket to its parent as stdin): the
/// worker tests run their own binary again with the `worker_main` filter.
pub fn stdin_is_socket() -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::metadata("/proc/self/fd/0")
        .map(|m| m.file_type().is_socket())
        .unwrap_or(false)
}

/// Ends a worker with its serve loop's result as the exit status (1, with the error on
/// stderr, when it failed).
pub fn exit_with(r: virtsoc_media::Result<()>) -> ! {
    std::process::exit(match r {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("worker: {e}");
            1
        }
    })
}
