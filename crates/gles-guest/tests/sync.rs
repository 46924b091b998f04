//! End to end: EGL syncs are virtsoc virtual fences (`EGL_VIRTSOC_fence_sync`,
//! `include/EGL/eglext_virtsoc.h`) through glvnd and a real daemon.
//!
//! - The GL queue waits on a fence the program signals later (`eglWaitSyncKHR`): a fence
//!   sync behind it stays unsignaled (a timed-out client wait, not a hang) until then.
//! - Draw waits for decode: a decode queued on the codec (held back by a fence of its own)
//!   and an `eglWaitSyncKHR` on the codec's fence; the latched external texture, drawn and
//!   read back, equals the CPU's BT.601 reference of the decoded picture, never the stale
//!   region; a second picture decoded into the same region is drawn, not the first. Once
//!   with the guest waiting for each command (atomic) and once with fences only, under
//!   every coherence protocol (each in a process of its own).
//! - Bad input: another guest's fence id is refused, a fence that never signals times a
//!   client wait out, and a guest whose GL queue waits forever does not hold another
//!   guest's GL (a second process draws meanwhile).
//!
//! Needs the built binaries (as `render.rs`), glvnd, and ffmpeg with libx264 for the clips;
//! skipped loudly without them unless `VIRTSOC_REQUIRE_ALL` is set.

mod common;

use std::ffi::{c_char, c_void, CStr};
use std::path::Path;
use std::process::Command;

use common::{dlopen, skip, sym, H};

const EGL_SYNC_FENCE: u32 = 0x30F9;
const EGL_SYNC_VIRTSOC_FENCE: u32 = 0x7A20;
const SYNC_DEVICE: i32 = 0x7A21;
const FENCE_ID_LO: i32 = 0x7A22;
const FENCE_ID_HI: i32 = 0x7A23;
const EGL_NONE: i32 = 0x3038;
const SATISFIED: i32 = 0x30F6;
const TIMEOUT_EXPIRED: i32 = 0x30F5;
const FOREVER: u64 = u64::MAX;
const FLUSH: i32 = 1;
const SYNC_STATUS: i32 = 0x30F1;
const SIGNALED: i32 = 0x30F2;
const UNSIGNALED: i32 = 0x30F3;
const EGL_BAD_PARAMETER: i32 = 0x300C;
const EGL_BAD_MATCH: i32 = 0x3009;
const NV12: i32 = 0x7A11;
const BLOB: i32 = 0x7A13;
const TEXTURE_EXTERNAL: u32 = 0x8D65;
const SIZE: i32 = 64;
/// How long a wait that must not be satisfied yet is given (a pass proves nothing went
/// early within it; a fence that were not honoured would be signaled within microseconds).
const HELD_NS: u64 = 300_000_000;

/// BT.601 limited range, as the render worker converts.
fn yuv(y: u8, u: u8, v: u8) -> [u8; 4] {
    let c = 298 * (i32::from(y) - 16);
    let (d, e) = (i32::from(u) - 128, i32::from(v) - 128);
    let k = |x: i32| ((x + 128) >> 8).clamp(0, 255) as u8;
    [
        k(c + 409 * e),
        k(c - 100 * d - 208 * e),
        k(c + 516 * d),
        255,
    ]
}

fn as_fn<T: Copy>(p: *mut c_void) -> T {
    assert!(!p.is_null());
    assert_eq!(std::mem::size_of::<T>(), std::mem::size_of::<*mut c_void>());
    // SAFETY: every caller names a function whose C type, as eglext_virtsoc.h and the
    // EGL/GL headers declare it, is `T`.
    unsafe { std::mem::transmute_copy(&p) }
}

fn protocol() -> String {
    std::env::var("VIRTSOC_TEST_PROTOCOL").unwrap_or_else(|_| "write-invalidate".into())
}

/// A one-frame 64x64 H.264 clip of lavfi source `src`, or `None` without ffmpeg/libx264.
fn clip(dir: &Path, name: &str, src: &str) -> Option<Vec<u8>> {
    let path = dir.join(name);
    let made = Command::new("ffmpeg")
        .args(["-v", "error", "-y", "-f", "lavfi", "-i"])
        .arg(format!("{src}=size={SIZE}x{SIZE}:rate=25"))
        .args(["-frames:v", "1", "-c:v", "libx264", "-pix_fmt", "yuv420p"])
        .args(["-f", "h264"])
        .arg(&path)
        .status()
        .is_ok_and(|s| s.success());
    made.then(|| std::fs::read(&path).ok()).flatten()
}

/// The EGL and GL entry points the tests use.
struct Api {
    dpy: H,
    get_error: extern "C" fn() -> i32,
    create_sync: extern "C" fn(H, u32, *const i32) -> H,
    destroy_sync: extern "C" fn(H, H) -> u32,
    client_wait: extern "C" fn(H, H, i32, u64) -> i32,
    wait_sync: extern "C" fn(H, H, i32) -> i32,
    signal_sync: extern "C" fn(H, H, i32) -> u32,
    sync_attrib: extern "C" fn(H, H, i32, *mut i32) -> u32,
    sync_fence: extern "C" fn(H, H, *mut u64) -> u32,
    device_wait: extern "C" fn(H, H, *const c_char) -> u32,
    create_region: extern "C" fn(H, i32, i32, i32, *mut u64) -> u32,
    map_region: extern "C" fn(H, u64, *mut i32) -> *mut u8,
    unmap_region: extern "C" fn(H, u64) -> u32,
    create_image: extern "C" fn(H, H, u32, H, *const i32) -> H,
    target_texture: extern "C" fn(u32, H),
    command: extern "C" fn(H, *const c_char, *const c_char, *const u64, *mut u64) -> u32,
    queue: extern "C" fn(H, *const c_char, *const c_char, *const u64) -> u32,
    ledger: extern "C" fn(H, *const c_char, *const c_char, *mut u64, *mut u64) -> u32,
    present: extern "C" fn(H, H, i32, i32, u64, i32) -> u32,
    surface: H,
    clear_color: extern "C" fn(f32, f32, f32, f32),
    clear: extern "C" fn(u32),
    read_pixels: extern "C" fn(i32, i32, i32, i32, u32, u32, *mut c_void),
    gl: *mut c_void,
}

impl Api {
    /// glvnd's libraries with a current 64x64 pbuffer; `None` (skipped) without them.
    fn open() -> Option<Api> {
        let egl = dlopen(c"libEGL.so.1");
        let gl = dlopen(c"libGLESv2.so.2");
        if egl.is_null() || gl.is_null() {
            skip("glvnd's libEGL.so.1 / libGLESv2.so.2 not installed");
            return None;
        }
        let get_platform_display: extern "C" fn(u32, H, *const isize) -> H =
            sym(egl, c"eglGetPlatformDisplay");
        let initialize: extern "C" fn(H, *mut i32, *mut i32) -> u32 = sym(egl, c"eglInitialize");
        let choose: extern "C" fn(H, *const i32, *mut H, i32, *mut i32) -> u32 =
            sym(egl, c"eglChooseConfig");
        let create_context: extern "C" fn(H, H, H, *const i32) -> H = sym(egl, c"eglCreateContext");
        let create_pbuffer: extern "C" fn(H, H, *const i32) -> H =
            sym(egl, c"eglCreatePbufferSurface");
        let make_current: extern "C" fn(H, H, H, H) -> u32 = sym(egl, c"eglMakeCurrent");
        let get_proc: extern "C" fn(*const c_char) -> *mut c_void = sym(egl, c"eglGetProcAddress");
        let p = |name: &CStr| {
            let f = get_proc(name.as_ptr());
            assert!(!f.is_null(), "{name:?}");
            f
        };
        let dpy = get_platform_display(0x31DD, std::ptr::null_mut(), std::ptr::null());
        let (mut major, mut minor) = (0, 0);
        assert_eq!(initialize(dpy, &mut major, &mut minor), 1);
        let attrs = [
            0x3024, 8, 0x3023, 8, 0x3022, 8, 0x3021, 8, 0x3033, 1, 0x3040, 4, 0x3038,
        ];
        let (mut config, mut n): (H, i32) = (std::ptr::null_mut(), 0);
        assert_eq!(choose(dpy, attrs.as_ptr(), &mut config, 1, &mut n), 1);
        let ctx = create_context(
            dpy,
            config,
            std::ptr::null_mut(),
            [0x3098, 2, EGL_NONE].as_ptr(),
        );
        assert!(!ctx.is_null());
        let surf = create_pbuffer(dpy, config, [0x3057, SIZE, 0x3056, SIZE, EGL_NONE].as_ptr());
        assert!(!surf.is_null());
        assert_eq!(make_current(dpy, surf, surf, ctx), 1);
        Some(Api {
            dpy,
            get_error: sym(egl, c"eglGetError"),
            create_sync: as_fn(p(c"eglCreateSyncKHR")),
            destroy_sync: as_fn(p(c"eglDestroySyncKHR")),
            client_wait: as_fn(p(c"eglClientWaitSyncKHR")),
            wait_sync: as_fn(p(c"eglWaitSyncKHR")),
            signal_sync: as_fn(p(c"eglSignalSyncKHR")),
            sync_attrib: as_fn(p(c"eglGetSyncAttribKHR")),
            sync_fence: as_fn(p(c"eglGetSyncFenceVIRTSOC")),
            device_wait: as_fn(p(c"eglDeviceWaitSyncVIRTSOC")),
            create_region: as_fn(p(c"eglCreateRegionVIRTSOC")),
            map_region: as_fn(p(c"eglMapRegionVIRTSOC")),
            unmap_region: as_fn(p(c"eglUnmapRegionVIRTSOC")),
            create_image: as_fn(p(c"eglCreateImageKHR")),
            target_texture: as_fn(p(c"glEGLImageTargetTexture2DOES")),
            command: as_fn(p(c"eglDeviceCommandVIRTSOC")),
            queue: as_fn(p(c"eglQueueDeviceCommandVIRTSOC")),
            ledger: as_fn(p(c"eglQueryLedgerVIRTSOC")),
            present: as_fn(p(c"eglPresentVIRTSOC")),
            surface: surf,
            clear_color: sym(gl, c"glClearColor"),
            clear: sym(gl, c"glClear"),
            read_pixels: sym(gl, c"glReadPixels"),
            gl,
        })
    }

    fn sync(&self, kind: u32, attrs: &[i32]) -> H {
        let mut a = attrs.to_vec();
        a.push(EGL_NONE);
        (self.create_sync)(self.dpy, kind, a.as_ptr())
    }

    /// A sync only the program signals.
    fn manual(&self) -> H {
        let s = self.sync(EGL_SYNC_VIRTSOC_FENCE, &[SYNC_DEVICE, 0]);
        assert!(!s.is_null(), "{:#x}", (self.get_error)());
        s
    }

    fn wait(&self, s: H, ns: u64) -> i32 {
        (self.client_wait)(self.dpy, s, FLUSH, ns)
    }

    fn status(&self, s: H) -> i32 {
        let mut v = 0;
        assert_eq!((self.sync_attrib)(self.dpy, s, SYNC_STATUS, &mut v), 1);
        v
    }

    fn pixels(&self) -> Vec<u8> {
        let mut px = vec![0u8; (SIZE * SIZE * 4) as usize];
        (self.read_pixels)(0, 0, SIZE, SIZE, 0x1908, 0x1401, px.as_mut_ptr().cast());
        px
    }

    fn region(&self, format: i32, w: i32, h: i32) -> u64 {
        let mut r = 0;
        assert_eq!((self.create_region)(self.dpy, format, w, h, &mut r), 1);
        r
    }

    fn cmd(&self, command: &CStr, args: &[u64]) -> [u64; 6] {
        let mut out = [0u64; 6];
        let ok = (self.command)(
            self.dpy,
            c"codec".as_ptr(),
            command.as_ptr(),
            args.as_ptr(),
            out.as_mut_ptr(),
        );
        assert_eq!(ok, 1, "codec::{command:?}: {:#x}", (self.get_error)());
        out
    }

    fn queue(&self, command: &CStr, args: &[u64]) {
        let ok = (self.queue)(self.dpy, c"codec".as_ptr(), command.as_ptr(), args.as_ptr());
        assert_eq!(
            ok,
            1,
            "queued codec::{command:?}: {:#x}",
            (self.get_error)()
        );
    }

    /// The CPU's BT.601 reference of NV12 region `r`.
    fn reference(&self, r: u64) -> Vec<u8> {
        let mut stride = 0;
        let p = (self.map_region)(self.dpy, r, &mut stride);
        assert!(!p.is_null());
        let (s, st) = (SIZE as usize, stride as usize);
        // SAFETY: the mapping holds the NV12 region (stride * SIZE * 3 / 2 bytes) until the
        // unmap below.
        let b = unsafe { std::slice::from_raw_parts(p, st * s * 3 / 2) };
        let mut out = Vec::with_capacity(s * s * 4);
        for y in 0..s {
            for x in 0..s {
                let c = st * s + (y / 2) * st + (x / 2) * 2;
                out.extend_from_slice(&yuv(b[y * st + x], b[c], b[c + 1]));
            }
        }
        assert_eq!((self.unmap_region)(self.dpy, r), 1);
        out
    }
}

/// The largest difference of two RGBA pictures.
fn worst(a: &[u8], b: &[u8]) -> u8 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| x.abs_diff(*y))
        .max()
        .unwrap_or(0)
}

/// Program `fs` with the full-screen quad's vertex shader, in use, its quad bound.
fn external_program(gl: *mut c_void) {
    let create_shader: extern "C" fn(u32) -> u32 = sym(gl, c"glCreateShader");
    let shader_source: extern "C" fn(u32, i32, *const *const c_char, *const i32) =
        sym(gl, c"glShaderSource");
    let compile_shader: extern "C" fn(u32) = sym(gl, c"glCompileShader");
    let create_program: extern "C" fn() -> u32 = sym(gl, c"glCreateProgram");
    let attach_shader: extern "C" fn(u32, u32) = sym(gl, c"glAttachShader");
    let bind_attrib: extern "C" fn(u32, u32, *const c_char) = sym(gl, c"glBindAttribLocation");
    let link_program: extern "C" fn(u32) = sym(gl, c"glLinkProgram");
    let get_programiv: extern "C" fn(u32, u32, *mut i32) = sym(gl, c"glGetProgramiv");
    let use_program: extern "C" fn(u32) = sym(gl, c"glUseProgram");
    let shader = |kind: u32, src: &CStr| {
        let s = create_shader(kind);
        let p = src.as_ptr();
        shader_source(s, 1, &p, std::ptr::null());
        compile_shader(s);
        s
    };
    let prog = create_program();
    attach_shader(prog, shader(0x8B31, c"attribute vec2 pos; varying vec2 tc; void main() { tc = pos * 0.5 + 0.5; gl_Position = vec4(pos, 0.0, 1.0); }"));
    attach_shader(prog, shader(0x8B30, c"#extension GL_OES_EGL_image_external : require\nprecision mediump float; varying vec2 tc; uniform samplerExternalOES t; void main() { gl_FragColor = texture2D(t, tc); }"));
    bind_attrib(prog, 0, c"pos".as_ptr());
    link_program(prog);
    let mut linked = 0;
    get_programiv(prog, 0x8B82, &mut linked);
    assert_eq!(linked, 1, "program links");
    use_program(prog);
}

/// Draws the full-screen quad (the program in use samples the external texture).
fn draw_quad(gl: *mut c_void) {
    static QUAD: [f32; 8] = [-1.0, -1.0, 1.0, -1.0, -1.0, 1.0, 1.0, 1.0];
    let viewport: extern "C" fn(i32, i32, i32, i32) = sym(gl, c"glViewport");
    let attrib_pointer: extern "C" fn(u32, i32, u32, u8, i32, *const c_void) =
        sym(gl, c"glVertexAttribPointer");
    let enable_attrib: extern "C" fn(u32) = sym(gl, c"glEnableVertexAttribArray");
    let draw_arrays: extern "C" fn(u32, i32, i32) = sym(gl, c"glDrawArrays");
    viewport(0, 0, SIZE, SIZE);
    attrib_pointer(0, 2, 0x1406, 0, 0, QUAD.as_ptr().cast());
    enable_attrib(0);
    draw_arrays(0x0005, 0, 4);
}

/// The child of `a_guest_cannot_stall_another`: draws and reads back in its own process.
#[test]
fn other_guest_draws() {
    if role() != "child" {
        return;
    }
    let Some(api) = Api::open() else {
        panic!("the child has no EGL");
    };
    (api.clear_color)(0.0, 0.0, 1.0, 1.0);
    (api.clear)(0x4000);
    let px = api.pixels();
    assert_eq!(&px[..4], &[0, 0, 255, 255], "the other guest drew");
}

/// The GL queue waits on fences; fences of other guests and fences that never signal are
/// errors and timeouts; a guest whose GL queue waits forever does not hold another's.
#[test]
fn gl_queue_waits_on_virtual_fences() {
    if role() != "queue" {
        return;
    }
    let tmp = std::env::temp_dir().join(format!("virtsoc-gles-sync-{}", std::process::id()));
    // Queue waits here last as long as the test needs (the deadline has a test of its own).
    let Some((_d, sock)) = daemon_with_fence_wait(&tmp, 600_000) else {
        return;
    };
    let Some(api) = Api::open() else { return };
    // A fence sync signals once the GL work before it ran.
    (api.clear_color)(1.0, 0.0, 0.0, 1.0);
    (api.clear)(0x4000);
    let s = api.sync(EGL_SYNC_FENCE, &[]);
    assert!(!s.is_null(), "{:#x}", (api.get_error)());
    assert_eq!(api.wait(s, FOREVER), SATISFIED);
    assert_eq!(api.status(s), SIGNALED);
    let mut id = 0u64;
    assert_eq!((api.sync_fence)(api.dpy, s, &mut id), 1);
    // Its exported id imports as a sync of its own.
    let imported = api.sync(
        EGL_SYNC_VIRTSOC_FENCE,
        &[FENCE_ID_LO, id as i32, FENCE_ID_HI, (id >> 32) as i32],
    );
    assert!(!imported.is_null(), "import: {:#x}", (api.get_error)());
    assert_eq!(api.wait(imported, 0), SATISFIED);
    assert_eq!((api.destroy_sync)(api.dpy, imported), 1);
    assert_eq!((api.destroy_sync)(api.dpy, s), 1);

    // The GL queue held by a fence the program signals later.
    let gate = api.manual();
    assert_eq!(api.status(gate), UNSIGNALED);
    assert_eq!(
        api.wait(gate, 1_000_000),
        TIMEOUT_EXPIRED,
        "a fence that never signals times out"
    );
    assert_eq!((api.wait_sync)(api.dpy, gate, 0), 1);
    (api.clear_color)(0.0, 1.0, 0.0, 1.0);
    (api.clear)(0x4000);
    let after = api.sync(EGL_SYNC_FENCE, &[]);
    assert!(!after.is_null());
    assert_eq!(
        api.wait(after, HELD_NS),
        TIMEOUT_EXPIRED,
        "the GL work waits for the fence"
    );
    assert_eq!((api.signal_sync)(api.dpy, gate, SIGNALED), 1);
    assert_eq!(api.wait(after, FOREVER), SATISFIED);
    assert_eq!(&api.pixels()[..4], &[0, 255, 0, 255]);
    assert_eq!(
        (api.signal_sync)(api.dpy, after, SIGNALED),
        0,
        "only program fences"
    );
    assert_eq!((api.get_error)(), EGL_BAD_MATCH);

    // Another guest's fence id names nothing here.
    let other = virtsoc_guest::Connection::open(
        sock.to_str().expect("utf-8 path"),
        &virtsoc_guest::ConnectOptions::default(),
    )
    .expect("another guest");
    let mut foreign = virtsoc_guest::Fence::from_u64(0);
    for _ in 0..200 {
        foreign = other.fence_create().expect("fence");
    }
    let f = foreign.to_u64();
    let refused = api.sync(
        EGL_SYNC_VIRTSOC_FENCE,
        &[FENCE_ID_LO, f as i32, FENCE_ID_HI, (f >> 32) as i32],
    );
    assert!(refused.is_null(), "another guest's fence");
    assert_eq!((api.get_error)(), EGL_BAD_PARAMETER);
    assert!(api
        .sync(EGL_SYNC_VIRTSOC_FENCE, &[SYNC_DEVICE, 9999])
        .is_null());
    assert!(api.sync(0x1234, &[]).is_null());

    // This guest's GL queue waits forever; another guest (a process of its own) draws.
    let forever = api.manual();
    assert_eq!((api.wait_sync)(api.dpy, forever, 0), 1);
    (api.clear)(0x4000);
    let held = api.sync(EGL_SYNC_FENCE, &[]);
    let exe = std::env::current_exe().expect("test executable");
    let out = Command::new(exe)
        .args(["--exact", "other_guest_draws", "--nocapture"])
        .env("VIRTSOC_SYNC_ROLE", "child")
        .output()
        .expect("run the other guest");
    assert!(
        out.status.success(),
        "the other guest drew while this one's GL queue waited: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(api.wait(held, 0), TIMEOUT_EXPIRED, "still held");
    assert_eq!((api.signal_sync)(api.dpy, forever, SIGNALED), 1);
    assert_eq!(api.wait(held, FOREVER), SATISFIED);
    let _ = std::fs::remove_dir_all(&tmp);
}

/// A daemon whose policy gives up a queue's fence wait after `ms` milliseconds.
fn daemon_with_fence_wait(tmp: &Path, ms: u64) -> Option<(common::Daemon, std::path::PathBuf)> {
    std::fs::create_dir_all(tmp).expect("temp dir");
    let policy = tmp.join("policy.toml");
    std::fs::write(&policy, format!("[default]\nfence_wait_ms = {ms}\n")).expect("policy");
    let policy = policy.to_str().expect("utf-8 path").to_string();
    let (d, sock, _) = common::start_daemon(tmp, &["--policy", &policy])?;
    Some((d, sock))
}

/// A GL-queue wait on a sync nobody signals is given up at the policy's `fence_wait_ms`:
/// the GL work behind it runs and a wait on it returns, instead of the queue (and every
/// `glFinish` of the program) hanging forever.
#[test]
fn gl_queue_wait_ends_at_the_policy_deadline() {
    if role() != "deadline" {
        return;
    }
    let tmp = std::env::temp_dir().join(format!("virtsoc-gles-dl-{}", std::process::id()));
    let Some((_d, _sock)) = daemon_with_fence_wait(&tmp, 2_000) else {
        return;
    };
    let Some(api) = Api::open() else { return };
    let never = api.manual();
    assert_eq!((api.wait_sync)(api.dpy, never, 0), 1);
    (api.clear_color)(0.0, 1.0, 0.0, 1.0);
    (api.clear)(0x4000);
    let after = api.sync(EGL_SYNC_FENCE, &[]);
    assert!(!after.is_null(), "{:#x}", (api.get_error)());
    assert_eq!(
        api.wait(after, HELD_NS),
        TIMEOUT_EXPIRED,
        "the GL work waits for the fence first"
    );
    assert_eq!(
        api.wait(after, 60_000_000_000),
        SATISFIED,
        "the wait is given up at the policy's deadline, not held forever"
    );
    assert_eq!(
        &api.pixels()[..4],
        &[0, 255, 0, 255],
        "the work behind it ran"
    );
    assert_eq!(
        api.status(never),
        UNSIGNALED,
        "giving up does not signal the fence"
    );
    let _ = std::fs::remove_dir_all(&tmp);
}

/// This process's part (`$VIRTSOC_SYNC_ROLE`): the vendor library connects once per
/// process, so each part runs in a process of its own, started by [`syncs_end_to_end`].
fn role() -> String {
    std::env::var("VIRTSOC_SYNC_ROLE").unwrap_or_default()
}

/// Runs test `name` in a process of its own as `role`, under `protocol`.
fn run_part(name: &str, role: &str, protocol: &str) {
    common::rerun(
        name,
        &[
            ("VIRTSOC_SYNC_ROLE", role),
            ("VIRTSOC_TEST_PROTOCOL", protocol),
        ],
    );
}

/// Every part: the GL queue's waits once, decode -> texture under every protocol.
#[test]
fn syncs_end_to_end() {
    if !role().is_empty() {
        return;
    }
    run_part(
        "gl_queue_waits_on_virtual_fences",
        "queue",
        "write-invalidate",
    );
    run_part(
        "gl_queue_wait_ends_at_the_policy_deadline",
        "deadline",
        "write-invalidate",
    );
    for p in ["write-invalidate", "guest-staging", "prefetch"] {
        run_part("decode_to_texture", "decode", p);
    }
}

/// Codec frame -> external texture -> readback equals the CPU's BT.601 reference, with the
/// guest waiting for each command (atomic) and with fences only; draw waits for decode; a
/// rewritten region is never sampled stale.
#[test]
fn decode_to_texture() {
    if role() != "decode" {
        return;
    }
    let tmp = std::env::temp_dir().join(format!("virtsoc-gles-dec-{}", std::process::id()));
    let coherence = protocol();
    let Some((_d, _, _)) = common::start_daemon(&tmp, &["--protocol", &coherence]) else {
        return;
    };
    let Some(api) = Api::open() else { return };
    let (Some(first), Some(second)) = (
        clip(&tmp, "a.h264", "testsrc2"),
        clip(&tmp, "b.h264", "mandelbrot"),
    ) else {
        return skip("ffmpeg with libx264 cannot make the H.264 clips");
    };
    let bits = |b: &[u8]| {
        let r = api.region(BLOB, b.len() as i32, 1);
        let p = (api.map_region)(api.dpy, r, std::ptr::null_mut());
        assert!(!p.is_null());
        // SAFETY: the mapping holds the region's `b.len()` bytes until the unmap.
        unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), p, b.len()) };
        assert_eq!((api.unmap_region)(api.dpy, r), 1);
        r
    };
    let (bits1, bits2) = (bits(&first), bits(&second));
    let picture = api.region(NV12, SIZE, SIZE);
    let image = (api.create_image)(
        api.dpy,
        std::ptr::null_mut(),
        0x7A00,
        std::ptr::null_mut(),
        [
            0x7A01,
            picture as i32,
            0x7A02,
            (picture >> 32) as i32,
            EGL_NONE,
        ]
        .as_ptr(),
    );
    assert!(!image.is_null(), "{:#x}", (api.get_error)());
    external_program(api.gl);
    let gen_textures: extern "C" fn(i32, *mut u32) = sym(api.gl, c"glGenTextures");
    let bind_texture: extern "C" fn(u32, u32) = sym(api.gl, c"glBindTexture");
    let mut tex = 0;
    gen_textures(1, &mut tex);
    bind_texture(TEXTURE_EXTERNAL, tex);
    let latch_and_draw = || {
        (api.target_texture)(TEXTURE_EXTERNAL, image);
        draw_quad(api.gl);
    };

    // Atomic: the guest waits for each codec command, then latches and draws.
    let dec1 = api.cmd(c"open_decoder", &[0, 3, 1])[0];
    api.cmd(c"decode", &[dec1, bits1, first.len() as u64, 0]);
    api.cmd(c"flush", &[dec1]);
    assert_eq!(
        api.cmd(c"receive_frame", &[dec1, picture])[0],
        1,
        "a picture"
    );
    latch_and_draw();
    let want1 = api.reference(picture);
    let got1 = api.pixels();
    assert!(
        worst(&got1, &want1) <= 2,
        "atomic: the decoded picture within 2 of its reference: {}",
        worst(&got1, &want1)
    );

    // Fences only: the codec's queue is held by a gate; the GL queue waits for the codec's
    // fence; nothing runs until the gate opens, and then the draw shows the new picture.
    let dec2 = api.cmd(c"open_decoder", &[0, 3, 1])[0];
    let gate = api.manual();
    assert_eq!((api.device_wait)(api.dpy, gate, c"codec".as_ptr()), 1);
    api.queue(c"decode", &[dec2, bits2, second.len() as u64, 0]);
    api.queue(c"flush", &[dec2]);
    api.queue(c"receive_frame", &[dec2, picture]);
    let decoded = api.sync(EGL_SYNC_VIRTSOC_FENCE, &[SYNC_DEVICE, 10]);
    assert!(!decoded.is_null(), "{:#x}", (api.get_error)());
    assert_eq!((api.wait_sync)(api.dpy, decoded, 0), 1);
    latch_and_draw();
    let drawn = api.sync(EGL_SYNC_FENCE, &[]);
    assert_eq!(
        api.wait(drawn, HELD_NS),
        TIMEOUT_EXPIRED,
        "the draw waits for the decode"
    );
    assert_eq!(api.status(decoded), UNSIGNALED);
    assert_eq!((api.signal_sync)(api.dpy, gate, SIGNALED), 1);
    assert_eq!(api.wait(drawn, FOREVER), SATISFIED);
    assert_eq!(api.status(decoded), SIGNALED);
    let got2 = api.pixels();
    // Latched again without a new write (before the CPU maps the region for the
    // reference below: a map is a write): nothing is imported again. Every byte into the
    // gles domain (the stream's batches, the daemon's own copies) of a draw with a latch
    // is compared with the same draw without one: an import would add the picture's bytes
    // (its copy into the worker's message, and a coherence copy when stale).
    let into_gles = || {
        let (mut c, mut b) = (0u64, 0u64);
        let ok = (api.ledger)(api.dpy, std::ptr::null(), c"gles".as_ptr(), &mut c, &mut b);
        assert_eq!(ok, 1);
        b
    };
    let b0 = into_gles();
    draw_quad(api.gl);
    assert!(api.pixels() == got2);
    let b1 = into_gles();
    latch_and_draw();
    assert!(api.pixels() == got2);
    let b2 = into_gles();
    let picture_bytes = (SIZE * SIZE * 3 / 2) as u64;
    assert!(
        (b2 - b1).saturating_sub(b1 - b0) < picture_bytes / 2,
        "an unchanged picture is not imported again: {b0} -> {b1} (draw) -> {b2} (latch, draw)"
    );
    let want2 = api.reference(picture);
    assert!(worst(&want1, &want2) > 40, "the two pictures differ");
    assert!(
        worst(&got2, &want2) <= 2,
        "fence: the second picture within 2 of its reference: {}",
        worst(&got2, &want2)
    );
    api.cmd(c"close", &[dec1]);
    api.cmd(c"close", &[dec2]);
    let _ = std::fs::remove_dir_all(&tmp);
}

/// CRC-32 (IEEE), as the display's `checksum` computes it.
fn crc32(bytes: &[u8]) -> u32 {
    let mut c = !0u32;
    for b in bytes {
        c ^= u32::from(*b);
        for _ in 0..8 {
            c = if c & 1 != 0 {
                (c >> 1) ^ 0xEDB8_8320
            } else {
                c >> 1
            };
        }
    }
    !c
}

/// A present carries an acquire fence: the display shows a frame only once the GL work
/// before it ran (held here by a program fence), and then shows that work's pixels.
#[test]
fn present_waits_for_draw() {
    if role() != "present" {
        return;
    }
    let tmp = std::env::temp_dir().join(format!("virtsoc-gles-present-{}", std::process::id()));
    let size = format!("{SIZE}x{SIZE}");
    let args = ["--display-verify", "--display-size", &size];
    let Some((_d, _, _)) = common::start_daemon(&tmp, &args) else {
        return;
    };
    let Some(api) = Api::open() else { return };
    let gate = api.manual();
    assert_eq!((api.wait_sync)(api.dpy, gate, 0), 1);
    (api.clear_color)(0.0, 0.0, 1.0, 1.0);
    (api.clear)(0x4000);
    assert_eq!(
        (api.present)(api.dpy, api.surface, SIZE, SIZE, 0, 0),
        1,
        "{:#x}",
        (api.get_error)()
    );
    // Signaled by the display's queue after the present.
    let shown = api.sync(EGL_SYNC_VIRTSOC_FENCE, &[SYNC_DEVICE, 14]);
    assert!(!shown.is_null(), "{:#x}", (api.get_error)());
    assert_eq!(
        api.wait(shown, HELD_NS),
        TIMEOUT_EXPIRED,
        "the present waits for the draw"
    );
    assert_eq!((api.signal_sync)(api.dpy, gate, SIGNALED), 1);
    assert_eq!(api.wait(shown, FOREVER), SATISFIED);
    // The next vsync has scanned the frame out.
    let vsync = api.manual();
    let mut id = 0u64;
    assert_eq!((api.sync_fence)(api.dpy, vsync, &mut id), 1);
    let ok = (api.queue)(
        api.dpy,
        c"display".as_ptr(),
        c"signal_at_vsync".as_ptr(),
        [id].as_ptr(),
    );
    assert_eq!(ok, 1);
    assert_eq!(api.wait(vsync, FOREVER), SATISFIED);
    let mut out = [0u64; 6];
    let ok = (api.command)(
        api.dpy,
        c"display".as_ptr(),
        c"checksum".as_ptr(),
        std::ptr::null(),
        out.as_mut_ptr(),
    );
    assert_eq!(ok, 1, "checksum: {:#x}", (api.get_error)());
    let blue: Vec<u8> = (0..SIZE * SIZE).flat_map(|_| [0u8, 0, 255, 255]).collect();
    assert_eq!(
        out[1] as u32,
        crc32(&blue),
        "the display shows the drawn frame"
    );
    let _ = std::fs::remove_dir_all(&tmp);
}
