//! What the end-to-end tests share: the built binaries, a daemon, glvnd's libraries and
//! the failing-worker scenario.
#![allow(dead_code)]

use std::ffi::{c_void, CStr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// target/debug (or release): the tests run from target/<profile>/deps.
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable");
    exe.parent()
        .and_then(Path::parent)
        .expect("target directory")
        .to_path_buf()
}

pub fn skip(why: &str) {
    assert!(
        std::env::var_os("VIRTSOC_REQUIRE_ALL").is_none(),
        "{why} and VIRTSOC_REQUIRE_ALL is set"
    );
    eprintln!("SKIPPED: {why}");
}

pub struct Daemon(pub Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn dlopen(name: &CStr) -> *mut c_void {
    // SAFETY: loading a system library by name.
    unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) }
}

/// A function of `lib` as `T` (its C type).
pub fn sym<T: Copy>(lib: *mut c_void, name: &CStr) -> T {
    // SAFETY: a handle from dlopen and a NUL-terminated name.
    let p = unsafe { libc::dlsym(lib, name.as_ptr()) };
    assert!(!p.is_null(), "{name:?} missing");
    assert_eq!(std::mem::size_of::<T>(), std::mem::size_of::<*mut c_void>());
    // SAFETY: every caller names a function whose C signature is `T`.
    unsafe { std::mem::transmute_copy(&p) }
}

pub type H = *mut c_void;

/// Runs a guest against a daemon whose render worker is `script` (a shell script), with
/// `args` more daemon arguments: its EGL context creation must fail with `EGL_BAD_ALLOC`
/// within `within`, twice, and the daemon must go on serving another guest.
pub fn worker_fails(name: &str, script: &str, args: &[&str], within: Duration) {
    let tmp = std::env::temp_dir().join(format!("virtsoc-gles-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).expect("temp dir");
    let worker = tmp.join("worker");
    std::fs::write(&worker, script).expect("worker script");
    std::fs::set_permissions(&worker, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let worker = worker.to_str().expect("utf-8 path");
    let all: Vec<&str> = ["--render-worker", worker]
        .into_iter()
        .chain(args.iter().copied())
        .collect();
    let Some((_d, sock, _)) = start_daemon(&tmp, &all) else {
        return;
    };
    let egl = dlopen(c"libEGL.so.1");
    if egl.is_null() {
        return skip("glvnd's libEGL.so.1 not installed");
    }
    let get_platform_display: extern "C" fn(u32, H, *const isize) -> H =
        sym(egl, c"eglGetPlatformDisplay");
    let initialize: extern "C" fn(H, *mut i32, *mut i32) -> u32 = sym(egl, c"eglInitialize");
    let create_context: extern "C" fn(H, H, H, *const i32) -> H = sym(egl, c"eglCreateContext");
    let get_error: extern "C" fn() -> i32 = sym(egl, c"eglGetError");
    let dpy = get_platform_display(0x31DD, std::ptr::null_mut(), std::ptr::null());
    assert!(!dpy.is_null());
    let (mut major, mut minor) = (0, 0);
    assert_eq!(initialize(dpy, &mut major, &mut minor), 1);
    let attrs = [0x3098, 2, 0x3038];
    for _ in 0..2 {
        let t = Instant::now();
        let ctx = create_context(
            dpy,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            attrs.as_ptr(),
        );
        assert!(ctx.is_null());
        assert_eq!(get_error(), 0x3003, "EGL_BAD_ALLOC");
        assert!(
            t.elapsed() < within,
            "the failure is prompt: {:?}",
            t.elapsed()
        );
    }
    // The daemon goes on: another guest connects and runs a request.
    let other = virtsoc_guest::Connection::open(
        sock.to_str().expect("utf-8 path"),
        &virtsoc_guest::ConnectOptions::default(),
    )
    .expect("another guest connects");
    other.nop().expect("and is served");
    let _ = std::fs::remove_dir_all(&tmp);
}

/// Starts `virtsocd` for one test in directory `tmp` (created), with `args` more
/// arguments, its control API on `tmp/v.ctl`, and points glvnd at `libEGL_virtsoc.so` and
/// the daemon (`__EGL_VENDOR_LIBRARY_FILENAMES`, `VIRTSOC_SOCKET`): the daemon, its socket
/// and its control socket, once both listen. `None` (skipped loudly) when a binary is not
/// built.
pub fn start_daemon(tmp: &Path, args: &[&str]) -> Option<(Daemon, PathBuf, PathBuf)> {
    start_daemon_env(tmp, args, &[])
}

/// [`start_daemon`] with `env` in the daemon's environment (its render workers inherit it).
pub fn start_daemon_env(
    tmp: &Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> Option<(Daemon, PathBuf, PathBuf)> {
    let dir = bin_dir();
    let (daemon, vendor) = (dir.join("virtsocd"), dir.join("libEGL_virtsoc.so"));
    for p in [&daemon, &dir.join("virtsoc-render"), &vendor] {
        if !p.is_file() {
            skip(&format!(
                "{} not built (cargo build -p virtsoc --bin virtsocd; cargo build -p \
                 virtsoc-render -p virtsoc-gles)",
                p.display()
            ));
            return None;
        }
    }
    std::fs::create_dir_all(tmp).expect("temp dir");
    let (sock, json, ctl) = (
        tmp.join("v.sock"),
        tmp.join("virtsoc.json"),
        tmp.join("v.ctl"),
    );
    std::fs::write(
        &json,
        format!(
            r#"{{"file_format_version":"1.0.0","ICD":{{"library_path":"{}"}}}}"#,
            vendor.display()
        ),
    )
    .expect("vendor json");
    let d = Daemon(
        Command::new(&daemon)
            .arg("--socket")
            .arg(&sock)
            .arg("--control")
            .arg(&ctl)
            .args(args)
            .envs(env.iter().copied())
            .env("RUST_LOG", "error")
            .stdout(Stdio::null())
            .spawn()
            .expect("start virtsocd"),
    );
    let t0 = Instant::now();
    while !sock.exists() || !ctl.exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "daemon never listened"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // glvnd reads these when libEGL loads its vendors (at the first display).
    std::env::set_var("__EGL_VENDOR_LIBRARY_FILENAMES", &json);
    std::env::set_var("VIRTSOC_SOCKET", &sock);
    Some((d, sock, ctl))
}
