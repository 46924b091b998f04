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
                "{} not built (cargo build -p virtsocd; cargo build -p \
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

/// A context current on a pbuffer of the default display: what most tests set up first.
pub struct Pbuffer {
    pub dpy: H,
    pub config: H,
    pub ctx: H,
    pub surf: H,
}

/// An ES `es` context (2 or 3) on a `w` x `h` pbuffer of a config with `config_attrs`
/// (`EGL_NONE`-terminated), made current; `None` where any step fails.
pub fn try_pbuffer(egl: H, config_attrs: &[i32], es: i32, (w, h): (i32, i32)) -> Option<Pbuffer> {
    let get_platform_display: extern "C" fn(u32, H, *const isize) -> H =
        sym(egl, c"eglGetPlatformDisplay");
    let initialize: extern "C" fn(H, *mut i32, *mut i32) -> u32 = sym(egl, c"eglInitialize");
    let choose: extern "C" fn(H, *const i32, *mut H, i32, *mut i32) -> u32 =
        sym(egl, c"eglChooseConfig");
    let create_context: extern "C" fn(H, H, H, *const i32) -> H = sym(egl, c"eglCreateContext");
    let create_pbuffer: extern "C" fn(H, H, *const i32) -> H = sym(egl, c"eglCreatePbufferSurface");
    let make_current: extern "C" fn(H, H, H, H) -> u32 = sym(egl, c"eglMakeCurrent");
    let dpy = get_platform_display(0x31DD, std::ptr::null_mut(), std::ptr::null());
    let (mut major, mut minor) = (0, 0);
    if dpy.is_null() || initialize(dpy, &mut major, &mut minor) != 1 {
        return None;
    }
    let (mut config, mut n): (H, i32) = (std::ptr::null_mut(), 0);
    if choose(dpy, config_attrs.as_ptr(), &mut config, 1, &mut n) != 1 || n < 1 {
        return None;
    }
    let ctx = create_context(
        dpy,
        config,
        std::ptr::null_mut(),
        [0x3098, es, 0x3038].as_ptr(),
    );
    let surf = create_pbuffer(dpy, config, [0x3057, w, 0x3056, h, 0x3038].as_ptr());
    if ctx.is_null() || surf.is_null() || make_current(dpy, surf, surf, ctx) != 1 {
        return None;
    }
    Some(Pbuffer {
        dpy,
        config,
        ctx,
        surf,
    })
}

/// [`try_pbuffer`] that must succeed.
pub fn pbuffer(egl: H, config_attrs: &[i32], es: i32, size: (i32, i32)) -> Pbuffer {
    let get_error: extern "C" fn() -> i32 = sym(egl, c"eglGetError");
    try_pbuffer(egl, config_attrs, es, size)
        .unwrap_or_else(|| panic!("an ES {es} context on a pbuffer: {:#x}", get_error()))
}

/// A pbuffer config of any colour depth with an ES 2 renderable bit.
pub const ES2_PBUFFER: [i32; 5] = [0x3033, 1, 0x3040, 4, 0x3038];

/// Runs test `name` of this executable again in a process of its own with `env` set: it
/// must pass.
pub fn rerun(name: &str, env: &[(&str, &str)]) {
    let exe = std::env::current_exe().expect("test executable");
    let out = Command::new(exe)
        .args(["--exact", name, "--nocapture"])
        .envs(env.iter().copied())
        .output()
        .expect("run the test again");
    assert!(
        out.status.success(),
        "{name} {env:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Named results of a scene a test runs natively and through virtsoc.
pub type Results = Vec<(String, Vec<u8>)>;

/// Where a native child writes its results (the env variable naming the file).
pub const NATIVE_OUT: &str = "VIRTSOC_NATIVE_OUT";

/// In the native child (test `child` of [`native_results`]): writes `scene`'s results to the
/// file the parent named; `None` when this process is not that child.
pub fn write_native(scene: impl FnOnce() -> Option<Results>) -> Option<()> {
    let out = std::env::var_os(NATIVE_OUT)?;
    if let Some(r) = scene() {
        let text: String = r
            .iter()
            .map(|(n, v)| {
                let hex: String = v.iter().map(|b| format!("{b:02x}")).collect();
                format!("{n}\t{hex}\n")
            })
            .collect();
        std::fs::write(out, text).expect("write results");
    }
    Some(())
}

/// Runs test `child` of this executable natively (glvnd's own vendor, no virtsoc socket), in
/// a process of its own (glvnd picks its vendor once per process); its results, `None` when
/// it wrote none (no such context natively: the caller skips).
pub fn native_results(tmp: &Path, child: &str) -> Option<Results> {
    let file = tmp.join(format!("{child}.txt"));
    let exe = std::env::current_exe().expect("test executable");
    let st = Command::new(exe)
        .args(["--exact", child, "--test-threads", "1"])
        .env(NATIVE_OUT, &file)
        .env_remove("__EGL_VENDOR_LIBRARY_FILENAMES")
        .env_remove("VIRTSOC_SOCKET")
        .status()
        .expect("run the native child");
    assert!(st.success(), "the native run failed");
    let text = std::fs::read_to_string(&file).ok()?;
    Some(
        text.lines()
            .filter_map(|l| l.split_once('\t'))
            .map(|(n, h)| {
                let v = (0..h.len() / 2)
                    .map(|i| u8::from_str_radix(&h[2 * i..2 * i + 2], 16).expect("hex"))
                    .collect();
                (n.to_owned(), v)
            })
            .collect(),
    )
}

/// Every result through virtsoc equals the native run's, name by name.
pub fn assert_same(ours: &Results, native: &Results) {
    assert_eq!(ours.len(), native.len());
    for ((n, a), (m, b)) in ours.iter().zip(native) {
        assert_eq!(n, m);
        if a.len() <= 64 {
            assert_eq!(a, b, "{n} differs from the native run");
        }
        assert!(
            a == b,
            "{n} differs from the native run ({} vs {} bytes)",
            a.len(),
            b.len()
        );
    }
}
