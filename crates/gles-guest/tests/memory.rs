//! GL memory counted against the guest's memory limit (`--guest-mem-limit`): a guest whose
//! textures outgrow its limit loses its contexts (`EGL_CONTEXT_LOST`, its render worker
//! ended) while another guest keeps rendering; the charge shows in the guest's `bytes` in
//! the control API while its objects live and is given back when its contexts are lost and
//! when it leaves.
//!
//! The binaries are built by `cargo build -p virtsocd -p virtsoc-render -p
//! virtsoc-gles`; without them (or without glvnd) the test is skipped loudly, unless
//! `VIRTSOC_REQUIRE_ALL` is set.

mod common;

use std::ffi::c_void;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{dlopen, skip, sym, H};
use virtsoc_control::client::{request, Target};

/// The guest's memory limit in the test: the vendor library's regions and one 4 MiB
/// texture fit, a 64 MiB one does not.
const LIMIT: u64 = 48 << 20;

/// A guest through glvnd and the vendor library: a context current on a 16 x 16 pbuffer.
struct Guest {
    egl: H,
    gles: H,
    dpy: H,
    surf: H,
}

impl Guest {
    fn open() -> Option<Guest> {
        let (egl, gles) = (dlopen(c"libEGL.so.1"), dlopen(c"libGLESv2.so.2"));
        if egl.is_null() || gles.is_null() {
            return None;
        }
        let pb = common::pbuffer(egl, &common::ES2_PBUFFER, 2, (16, 16));
        let (dpy, surf) = (pb.dpy, pb.surf);
        Some(Guest {
            egl,
            gles,
            dpy,
            surf,
        })
    }

    /// A new `size` x `size` RGBA8 texture without contents; then glFinish; the GL error.
    fn texture(&self, size: i32) -> u32 {
        let gen: extern "C" fn(i32, *mut u32) = sym(self.gles, c"glGenTextures");
        let bind: extern "C" fn(u32, u32) = sym(self.gles, c"glBindTexture");
        let image: extern "C" fn(u32, i32, i32, i32, i32, i32, u32, u32, *const c_void) =
            sym(self.gles, c"glTexImage2D");
        let finish: extern "C" fn() = sym(self.gles, c"glFinish");
        let error: extern "C" fn() -> u32 = sym(self.gles, c"glGetError");
        let mut t = 0;
        gen(1, &mut t);
        bind(0x0DE1, t);
        image(
            0x0DE1,
            0,
            0x1908,
            size,
            size,
            0,
            0x1908,
            0x1401,
            std::ptr::null(),
        );
        finish();
        error()
    }

    /// Clears to green and reads the pixel back: `Ok(rgba)`, or the EGL error of the swap.
    fn frame(&self) -> Result<[u8; 4], i32> {
        let clear_color: extern "C" fn(f32, f32, f32, f32) = sym(self.gles, c"glClearColor");
        let clear: extern "C" fn(u32) = sym(self.gles, c"glClear");
        let read: extern "C" fn(i32, i32, i32, i32, u32, u32, *mut c_void) =
            sym(self.gles, c"glReadPixels");
        let swap: extern "C" fn(H, H) -> u32 = sym(self.egl, c"eglSwapBuffers");
        let get_error: extern "C" fn() -> i32 = sym(self.egl, c"eglGetError");
        clear_color(0.0, 1.0, 0.0, 1.0);
        clear(0x4000);
        let mut px = [0u8; 4];
        read(8, 8, 1, 1, 0x1908, 0x1401, px.as_mut_ptr().cast());
        if swap(self.dpy, self.surf) == 0 {
            return Err(get_error());
        }
        Ok(px)
    }
}

/// The other guest's side (this test run again with `VIRTSOC_GLES_MEMORY_GUEST` set): reads
/// commands from stdin (`frame`, `texture N`), answers each on stdout.
#[test]
fn memory_guest() {
    if std::env::var_os("VIRTSOC_GLES_MEMORY_GUEST").is_none() {
        return;
    }
    let g = Guest::open().expect("glvnd");
    let mut out = std::io::stdout();
    for line in std::io::stdin().lock().lines() {
        let line = line.expect("stdin");
        let answer = match line.split_whitespace().collect::<Vec<_>>()[..] {
            ["frame"] => format!("frame {:?}", g.frame()),
            ["texture", n] => format!("texture {}", g.texture(n.parse().expect("size"))),
            _ => break,
        };
        writeln!(out, "{answer}").expect("stdout");
        out.flush().expect("stdout");
    }
}

/// The other guest, a process of its own.
struct Other {
    child: Child,
    lines: std::io::Lines<BufReader<std::process::ChildStdout>>,
}

impl Other {
    fn start() -> Other {
        let mut child = Command::new(std::env::current_exe().expect("test executable"))
            .args([
                "--exact",
                "memory_guest",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env("VIRTSOC_GLES_MEMORY_GUEST", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the other guest");
        let out = child.stdout.take().expect("stdout");
        Other {
            child,
            lines: BufReader::new(out).lines(),
        }
    }

    /// Sends `cmd`, returns its answer (skipping the test harness's lines).
    fn ask(&mut self, cmd: &str) -> String {
        let stdin = self.child.stdin.as_mut().expect("stdin");
        writeln!(stdin, "{cmd}").expect("to the other guest");
        let word = cmd.split_whitespace().next().unwrap_or_default();
        loop {
            let line = self
                .lines
                .next()
                .expect("the other guest answers")
                .expect("its stdout");
            // The harness's "test memory_guest ... " may open the line.
            if let Some(i) = line.find(&format!("{word} ")) {
                return line[i..].to_string();
            }
        }
    }

    /// Ends it (stdin closed) and waits for it.
    fn leave(mut self) {
        drop(self.child.stdin.take());
        let status = self.child.wait().expect("wait");
        assert!(status.success(), "the other guest: {status}");
    }
}

/// The guest named `gles-<pid>`'s entry in the control API's `/guests`, if it is there.
fn guest_info(ctl: &Path, pid: u32) -> Option<serde_json::Value> {
    let r = request(&Target::Unix(ctl.to_path_buf()), "GET", "/guests", b"").expect("control");
    assert_eq!(r.status, 200, "{}", r.body);
    let name = format!("gles-{pid}");
    r.json()
        .as_array()?
        .iter()
        .find(|g| g["name"] == name.as_str())
        .cloned()
}

fn bytes_of(ctl: &Path, pid: u32) -> u64 {
    guest_info(ctl, pid)
        .and_then(|g| g["bytes"].as_u64())
        .unwrap_or_else(|| panic!("guest gles-{pid} listed with its bytes"))
}

#[test]
fn gl_memory_is_charged_against_the_guests_limit() {
    if std::env::var_os("VIRTSOC_GLES_MEMORY_GUEST").is_some() {
        return;
    }
    let tmp = std::env::temp_dir().join(format!("virtsoc-gles-memory-{}", std::process::id()));
    let limit = LIMIT.to_string();
    let Some((_d, _, ctl)) = common::start_daemon(&tmp, &["--guest-mem-limit", &limit]) else {
        return;
    };
    let mut other = Other::start();
    assert_eq!(other.ask("frame"), "frame Ok([0, 255, 0, 255])");
    let Some(g) = Guest::open() else {
        return skip("glvnd's libEGL.so.1 / libGLESv2.so.2 not installed");
    };
    assert_eq!(g.frame(), Ok([0, 255, 0, 255]));
    let me = std::process::id();
    let before = bytes_of(&ctl, me);

    // A 4 MiB texture fits; it is charged.
    assert_eq!(g.texture(1024), 0, "GL_NO_ERROR");
    let with = bytes_of(&ctl, me);
    assert!(
        with >= before + (4 << 20),
        "a 4 MiB texture is charged: {before} -> {with} bytes"
    );
    assert_eq!(g.frame(), Ok([0, 255, 0, 255]));

    // A 64 MiB texture does not: the guest's contexts are lost, its GL memory given back.
    g.texture(4096);
    let mut lost = None;
    for _ in 0..4 {
        if let Err(e) = g.frame() {
            lost = Some(e);
            break;
        }
    }
    assert_eq!(lost, Some(0x300E), "EGL_CONTEXT_LOST");
    let after = bytes_of(&ctl, me);
    assert!(
        after + (4 << 20) <= with,
        "the lost contexts' memory is given back: {with} -> {after} bytes"
    );

    // The other guest, under the same limit, renders on, and is charged for its own.
    assert_eq!(other.ask("frame"), "frame Ok([0, 255, 0, 255])");
    let pid = other.child.id();
    let b0 = bytes_of(&ctl, pid);
    assert_eq!(other.ask("texture 1024"), "texture 0");
    let b1 = bytes_of(&ctl, pid);
    assert!(b1 >= b0 + (4 << 20), "{b0} -> {b1}");
    assert_eq!(other.ask("frame"), "frame Ok([0, 255, 0, 255])");
    // When it leaves, its charge goes with it.
    other.leave();
    let t0 = Instant::now();
    while guest_info(&ctl, pid).is_some() {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the guest that left is still listed"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = std::fs::remove_dir_all(&tmp);
}
