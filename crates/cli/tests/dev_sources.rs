//! Integration tests of the daemon's media sources and sinks chosen on the command line:
//! `--camera-source file:PATH` (a video clip made with the `ffmpeg` CLI, looped as a camera),
//! bad `--camera-source` / `--display-backend` values refusing to start, and (with the
//! `window` feature) `--display-backend window` showing presented frames on an Xvfb screen,
//! checked with an `xwd` screenshot.

mod common;

use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{
    camera_capture as capture, connect_to as connect, mp4_clip, region_bytes as read_region,
    region_meta as meta, Daemon,
};
use virtsoc_guest::Format;
use virtsoc_host::device::camera::read_capture_time;

/// A fresh directory of its own for each call (tests run in parallel).
fn temp_dir(tag: &str) -> PathBuf {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let dir = std::env::temp_dir().join(format!(
        "virtsoc-dev-sources-{tag}-{}-{n}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Rows `from..to` of an image plane whose rows are `stride` bytes apart, `row` bytes each.
fn rows(px: &[u8], stride: usize, row: usize, from: usize, to: usize) -> Vec<u8> {
    (from..to)
        .flat_map(|y| px[y * stride..y * stride + row].iter().copied())
        .collect()
}

/// Distinct byte values: a blank (uniform) image has one.
fn distinct(bytes: &[u8]) -> usize {
    let mut seen = [false; 256];
    for b in bytes {
        seen[*b as usize] = true;
    }
    seen.iter().filter(|s| **s).count()
}

#[test]
fn a_video_file_is_looped_as_the_camera() {
    let dir = temp_dir("clip");
    let clip = mp4_clip(&dir);
    let source = format!("file:{}", clip.display());
    let d = Daemon::start(&["--camera-source", &source]);
    d.expect_log("camera: playing");
    let c = connect(d.socket());

    let nv12 = c.alloc(0, 320, 240, Format::Nv12, 0).unwrap();
    let m = meta(&nv12);
    let stride = nv12.stride as usize;
    // The bottom half of the luma plane: below the timestamp strip, all picture.
    let picture = |px: &[u8]| rows(px, stride, 320, 120, 240);
    let mut frames = Vec::new();
    for i in 0..40u64 {
        let r = capture(&c, &nv12);
        assert_eq!(r.index, i, "frame indices count on across the loop");
        let px = read_region(&c, &nv12);
        assert_eq!(
            read_capture_time(&m, &px),
            Some(r.capture_ns),
            "frame {i} carries its capture time in the pixels"
        );
        let p = picture(&px);
        assert!(distinct(&p) > 16, "frame {i} is blank");
        frames.push(p);
    }
    for i in 0..29 {
        assert_ne!(
            frames[i],
            frames[i + 1],
            "frames {i} and {} are equal",
            i + 1
        );
    }
    // Past the clip's 30 frames the file starts over: the same pictures again.
    for i in 0..10 {
        assert_eq!(
            frames[i],
            frames[i + 30],
            "frame {} repeats frame {i}",
            i + 30
        );
    }

    // Another format and size: converted and scaled from the file's frames.
    let rgba = c.alloc(0, 256, 144, Format::Rgba8, 0).unwrap();
    let mut last = Vec::new();
    for i in 0..3u64 {
        let r = capture(&c, &rgba);
        assert_eq!(r.index, i, "a new mode starts at frame 0");
        let px = read_region(&c, &rgba);
        assert_eq!(read_capture_time(&meta(&rgba), &px), Some(r.capture_ns));
        let p = rows(&px, rgba.stride as usize, 256 * 4, 72, 144);
        assert!(distinct(&p) > 16, "RGBA frame {i} is blank");
        let opaque = p.chunks_exact(4).all(|px| px[3] == 255);
        assert!(opaque, "RGBA frame {i} is not opaque");
        assert_ne!(p, last, "RGBA frame {i} repeats the previous one");
        last = p;
    }
    drop(c);
    drop(d);
    let _ = std::fs::remove_dir_all(dir);
}

/// Runs virtsocd with `args` (and `env`), expecting it to refuse to start; returns its
/// stderr.
fn refused(args: &[&str], env: &[(&str, Option<&str>)]) -> String {
    let dir = temp_dir("refused");
    let mut cmd = Command::new(common::virtsocd());
    cmd.arg("--socket")
        .arg(dir.join("d.sock"))
        .arg("--print-ready")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        match v {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    let mut child = cmd.spawn().expect("start virtsocd");
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("virtsocd {args:?} did not exit: it should refuse to start");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut out = String::new();
    let mut err = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(!status.success(), "virtsocd {args:?} exited successfully");
    assert!(!out.contains("READY"), "virtsocd {args:?} got ready: {out}");
    let _ = std::fs::remove_dir_all(dir);
    err
}

#[test]
fn bad_camera_sources_stop_the_daemon() {
    let missing = "/nonexistent/virtsoc-no-such-clip.mp4";
    let err = refused(&["--camera-source", &format!("file:{missing}")], &[]);
    assert!(err.contains(missing), "the error names the file: {err}");

    let err = refused(&["--camera-source", "rtsp://camera.local/stream"], &[]);
    assert!(
        err.contains("unknown camera source") && err.contains("rtsp://camera.local/stream"),
        "{err}"
    );

    // A file that exists but is no video.
    let dir = temp_dir("junk");
    let junk = dir.join("junk.mp4");
    std::fs::write(&junk, b"this is not a video").unwrap();
    let junk = junk.to_str().unwrap();
    let err = refused(&["--camera-source", &format!("file:{junk}")], &[]);
    assert!(err.contains(junk), "the error names the file: {err}");
    let _ = std::fs::remove_dir_all(dir);

    // V4L2: without the feature the daemon says how to get it; with it, a missing device is
    // named (no /dev/video* exists on the machines this runs on).
    let err = refused(&["--camera-source", "v4l2:/dev/video-virtsoc-none"], &[]);
    if cfg!(feature = "v4l2") {
        assert!(err.contains("/dev/video-virtsoc-none"), "{err}");
    } else {
        assert!(err.contains("v4l2` cargo feature"), "{err}");
    }
}

#[test]
fn bad_display_backends_stop_the_daemon() {
    // An unknown backend is refused by the argument parser, which lists the choices.
    let err = refused(&["--display-backend", "wayland"], &[]);
    assert!(
        err.contains("wayland")
            && err.contains("[possible values: headless, window, window-surface]"),
        "{err}"
    );
    // Without the `window` feature the window backend is not there; with it, it needs an X
    // display.
    let err = refused(&["--display-backend", "window"], &[("DISPLAY", None)]);
    if cfg!(feature = "window") {
        assert!(err.contains("$DISPLAY"), "{err}");
    } else {
        assert!(
            err.contains("not built") && err.contains("`window` cargo feature"),
            "{err}"
        );
    }
}

#[cfg(feature = "window")]
mod window {
    use super::*;
    use std::io::{BufRead, BufReader};
    use std::path::Path;
    use std::process::Child;
    use std::sync::{Arc, Mutex};
    use virtsoc_guest::devices::display::{Present, SignalAtVsync};
    use virtsoc_guest::{AccessMode, Connection, DeviceId, RegionInfo};

    /// Finds `program` on `$PATH`, or fails naming the package that provides it.
    fn require(program: &str, package: &str) -> PathBuf {
        let path = std::env::var_os("PATH").unwrap_or_default();
        std::env::split_paths(&path)
            .map(|d| d.join(program))
            .find(|p| p.is_file())
            .unwrap_or_else(|| {
                panic!(
                    "`{program}` not found: the window test needs the `{package}` package \
                     (apt-get install --no-install-recommends xvfb x11-apps)"
                )
            })
    }

    /// A child process killed when dropped.
    struct Kill(Child);

    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    /// Starts Xvfb on a free display number (it picks one and tells us with -displayfd).
    fn xvfb() -> (Kill, String) {
        let bin = require("Xvfb", "xvfb");
        let mut child = Command::new(bin)
            .args([
                "-displayfd",
                "1",
                "-screen",
                "0",
                "1920x1080x24",
                "-nolisten",
                "tcp",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start Xvfb");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let n: u32 = line
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("Xvfb did not report its display: {line:?}"));
        (Kill(child), format!(":{n}"))
    }

    /// Starts virtsocd on X display `display` with `--display-backend backend`; returns it
    /// with its socket and its log so far.
    fn daemon(display: &str, dir: &Path, backend: &str) -> (Kill, PathBuf, Arc<Mutex<String>>) {
        let socket = dir.join("d.sock");
        let mut child = Command::new(common::virtsocd())
            .arg("--socket")
            .arg(&socket)
            .args(["--print-ready", "--display-backend", backend])
            .args(["--refresh-hz", "60"])
            .env("DISPLAY", display)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start virtsocd");
        let err = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let all = Arc::clone(&log);
        std::thread::spawn(move || {
            for l in BufReader::new(err).lines().map_while(Result::ok) {
                eprintln!("[virtsocd] {l}");
                let mut all = all.lock().unwrap();
                all.push_str(&l);
                all.push('\n');
            }
        });
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        if !line.starts_with("READY") {
            let _ = child.kill();
            let _ = child.wait();
            std::thread::sleep(Duration::from_millis(200));
            panic!(
                "virtsocd did not start with the window backend: {}",
                log.lock().unwrap()
            );
        }
        (Kill(child), socket, log)
    }

    /// Waits (bounded) for the next vsync.
    fn wait_vsync(c: &Connection) {
        let f = c.fence_create().unwrap();
        c.command(&SignalAtVsync { fence: f.to_u64() })
            .expect("signal_at_vsync");
        assert!(
            c.fence_wait_cpu(f, Duration::from_secs(20)).unwrap(),
            "no vsync within 20 s"
        );
        let _ = c.fence_release(f);
    }

    /// Presents a `w` x `h` RGBA frame of one colour.
    fn present_solid(c: &Connection, r: &RegionInfo, rgb: [u8; 3]) {
        let a = c
            .begin_access(r.id, DeviceId::CPU, 0, r.size, AccessMode::Write)
            .unwrap();
        // SAFETY: the window maps the whole region while the CPU access lasts.
        let px =
            unsafe { std::slice::from_raw_parts_mut(a.ptr.unwrap().as_ptr(), r.size as usize) };
        for p in px.chunks_exact_mut(4) {
            p.copy_from_slice(&[rgb[0], rgb[1], rgb[2], 255]);
        }
        c.end_access(r.id, DeviceId::CPU, 0, r.size, AccessMode::Write)
            .unwrap();
        c.command_with_access(&Present {
            frame: r.id,
            capture_ns: 0,
        })
        .expect("present");
    }

    /// A screenshot: width, height and RGB pixels.
    struct Shot {
        width: usize,
        height: usize,
        rgb: Vec<[u8; 3]>,
    }

    impl Shot {
        /// Share of the pixels within 2 of `rgb` in every channel.
        fn share(&self, rgb: [u8; 3]) -> f64 {
            let close = |a: u8, b: u8| a.abs_diff(b) <= 2;
            let n = self
                .rgb
                .iter()
                .filter(|p| (0..3).all(|i| close(p[i], rgb[i])))
                .count();
            n as f64 / (self.width * self.height).max(1) as f64
        }
    }

    /// Minimal XWD (X11 window dump, version 7) reader for ZPixmap TrueColor images of 24
    /// or 32 bits per pixel.
    fn parse_xwd(data: &[u8]) -> Shot {
        let field = |i: usize| -> usize {
            u32::from_be_bytes(data[i * 4..i * 4 + 4].try_into().unwrap()) as usize
        };
        assert!(data.len() >= 100, "XWD file too short");
        let (header_size, version, format) = (field(0), field(1), field(2));
        assert_eq!(version, 7, "XWD version");
        assert_eq!(format, 2, "XWD pixmap format (ZPixmap)");
        let (width, height) = (field(4), field(5));
        let byte_order = field(7);
        let bits_per_pixel = field(11);
        let bytes_per_line = field(12);
        let masks = [field(14) as u32, field(15) as u32, field(16) as u32];
        let ncolors = field(19);
        assert!(
            bits_per_pixel == 32 || bits_per_pixel == 24,
            "{bits_per_pixel} bits per pixel"
        );
        let bpp = bits_per_pixel / 8;
        let start = header_size + ncolors * 12;
        assert!(
            data.len() >= start + bytes_per_line * height,
            "XWD truncated"
        );
        let channel = |v: u32, mask: u32| -> u8 {
            if mask == 0 {
                return 0;
            }
            let bits = mask.count_ones();
            let x = (v & mask) >> mask.trailing_zeros();
            ((x * 255) / ((1u32 << bits) - 1)) as u8
        };
        let mut rgb = Vec::with_capacity(width * height);
        for y in 0..height {
            let row = &data[start + y * bytes_per_line..];
            for x in 0..width {
                let p = &row[x * bpp..x * bpp + bpp];
                let mut v = 0u32;
                for i in 0..bpp {
                    let b = if byte_order == 0 {
                        p[bpp - 1 - i]
                    } else {
                        p[i]
                    };
                    v = v << 8 | u32::from(b);
                }
                rgb.push(masks.map(|m| channel(v, m)));
            }
        }
        Shot { width, height, rgb }
    }

    fn screenshot(xwd: &Path, display: &str, dir: &Path) -> Shot {
        let file = dir.join("screen.xwd");
        let out = Command::new(xwd)
            .args(["-root", "-silent", "-display", display, "-out"])
            .arg(&file)
            .output()
            .expect("run xwd");
        assert!(
            out.status.success(),
            "xwd failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        parse_xwd(&std::fs::read(&file).unwrap())
    }

    /// Presents solid frames from guest memory and checks each covers the screen, with the
    /// window painted as `backend` paints it; returns the daemon's log.
    fn frames_show(backend: &str) -> String {
        let xwd = require("xwd", "x11-apps");
        let (_x, display) = xvfb();
        let dir = temp_dir("window");
        let (_d, socket, log) = daemon(&display, &dir, backend);
        let c = connect(&socket);
        let frame = c.alloc(0, 320, 240, Format::Rgba8, 0).unwrap();
        let colours = [[0xe0, 0x30, 0x20], [0x20, 0xc0, 0x60]];
        let before = screenshot(&xwd, &display, &dir);
        assert!(
            colours.iter().all(|c| before.share(*c) < 0.01),
            "the colours are on screen before being presented"
        );
        for colour in colours {
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                present_solid(&c, &frame, colour);
                wait_vsync(&c);
                wait_vsync(&c);
                let shot = screenshot(&xwd, &display, &dir);
                assert_eq!((shot.width, shot.height), (1920, 1080));
                // The window covers the screen; the 4:3 frame fills three quarters of it.
                let share = shot.share(colour);
                if share > 0.5 {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "colour {colour:02x?} covers only {:.1}% of the screen",
                    share * 100.0
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        drop(c);
        let _ = std::fs::remove_dir_all(dir);
        let log = log.lock().unwrap().clone();
        log
    }

    /// The default window: on a CPU adapter (lavapipe) frames painted from their CPU pixels
    /// (composed on the GPU at the window's size when they live there), on a GPU through a
    /// surface.
    #[test]
    fn presented_frames_show_in_an_x11_window() {
        let log = frames_show("window");
        let painter = match log.contains(", Cpu,") {
            true => "painted by the cpu painter",
            false => "painted by the gpu painter",
        };
        assert!(log.contains(painter), "{log}");
    }

    /// `window-surface`: frames composed on the GPU and presented through a wgpu surface on
    /// the window (lavapipe's X11 window-system integration puts them on the screen).
    #[test]
    fn presented_frames_show_through_a_gpu_surface() {
        let log = frames_show("window-surface");
        assert!(log.contains("painted by the gpu painter"), "{log}");
        assert!(
            log.contains("virtsoc-gpu: presenting"),
            "no surface was made: {log}"
        );
        assert!(!log.contains("painted on the CPU"), "{log}");
    }
}
