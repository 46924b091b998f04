//! End to end: the render worker works in the guest's replicas of the `gles` memory domain
//! (shared memfds, `crates/host/src/device/gles_maps.rs`), through glvnd and a real daemon.
//!
//! - **Batches in place**, under every coherence protocol (each in a process of its own):
//!   a scene drawn and read back whole equals what was drawn; the daemon copies no stream
//!   byte (nothing more on the `gles` domain's own link than the presents' copies).
//! - **Presents**: the display shows the drawn frame top row on top (its checksum of the
//!   frame), with one copy of frame bytes per present (`GET /gles/stats`), read back and
//!   (`VIRTSOC_RENDER_PRESENT=direct`) blitted into the frame's memory imported as a texture
//!   (rows of 64 bytes; the other size is read back).
//! - **Freed replicas leave the worker**: a surface presented at another size frees its
//!   frame regions; the worker's mappings come back to what they were.
//! - **Only the guest's own**: two guests' workers map disjoint memfds (`/proc/PID/maps` of
//!   the workers, as root), while one of them names region ids it does not own.
//!
//! Needs the built binaries (as `render.rs`) and glvnd; skipped loudly without them unless
//! `VIRTSOC_REQUIRE_ALL` is set.

mod common;

use std::collections::BTreeSet;
use std::ffi::{c_char, c_void, CStr};
use std::path::Path;

use common::{dlopen, skip, sym, H};
use virtsoc_control::client::{request, Target};
use virtsoc_devapi::RegionId;

fn protocol() -> String {
    std::env::var("VIRTSOC_TEST_PROTOCOL").unwrap_or_else(|_| "write-invalidate".into())
}

fn role() -> String {
    std::env::var("VIRTSOC_TEST_ROLE").unwrap_or_default()
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

/// The EGL and GL functions the tests call, a context current on a pbuffer.
struct Api {
    dpy: H,
    config: H,
    ctx: H,
    create_pbuffer: extern "C" fn(H, H, *const i32) -> H,
    make_current: extern "C" fn(H, H, H, H) -> u32,
    destroy_surface: extern "C" fn(H, H) -> u32,
    get_error: extern "C" fn() -> i32,
    present: extern "C" fn(H, H, i32, i32, u64, i32) -> u32,
    command: extern "C" fn(H, *const c_char, *const c_char, *const u64, *mut u64) -> u32,
    ledger: extern "C" fn(H, *const c_char, *const c_char, *mut u64, *mut u64) -> u32,
    clear_color: extern "C" fn(f32, f32, f32, f32),
    clear: extern "C" fn(u32),
    enable: extern "C" fn(u32),
    disable: extern "C" fn(u32),
    scissor: extern "C" fn(i32, i32, i32, i32),
    read_pixels: extern "C" fn(i32, i32, i32, i32, u32, u32, *mut c_void),
    finish: extern "C" fn(),
    create_region: extern "C" fn(H, i32, i32, i32, *mut u64) -> u32,
    destroy_region: extern "C" fn(H, u64) -> u32,
    create_image: extern "C" fn(H, H, u32, H, *const i32) -> H,
    destroy_image: extern "C" fn(H, H) -> u32,
    gen_buffers: extern "C" fn(i32, *mut u32),
    bind_buffer: extern "C" fn(u32, u32),
    buffer_data: extern "C" fn(u32, isize, *const c_void, u32),
}

impl Api {
    fn open() -> Option<Api> {
        let egl = dlopen(c"libEGL.so.1");
        let gles = dlopen(c"libGLESv2.so.2");
        if egl.is_null() || gles.is_null() {
            skip("glvnd's libEGL.so.1 / libGLESv2.so.2 not installed");
            return None;
        }
        let get_platform_display: extern "C" fn(u32, H, *const isize) -> H =
            sym(egl, c"eglGetPlatformDisplay");
        let initialize: extern "C" fn(H, *mut i32, *mut i32) -> u32 = sym(egl, c"eglInitialize");
        let choose: extern "C" fn(H, *const i32, *mut H, i32, *mut i32) -> u32 =
            sym(egl, c"eglChooseConfig");
        let create_context: extern "C" fn(H, H, H, *const i32) -> H = sym(egl, c"eglCreateContext");
        let get_proc: extern "C" fn(*const c_char) -> *mut c_void = sym(egl, c"eglGetProcAddress");
        let ext = |name: &CStr| {
            let p = get_proc(name.as_ptr());
            assert!(!p.is_null(), "{name:?}");
            p
        };
        let dpy = get_platform_display(0x31DD, std::ptr::null_mut(), std::ptr::null());
        assert!(!dpy.is_null());
        let (mut major, mut minor) = (0, 0);
        assert_eq!(initialize(dpy, &mut major, &mut minor), 1);
        let attrs = [
            0x3024, 8, 0x3023, 8, 0x3022, 8, 0x3021, 8, 0x3033, 1, 0x3038,
        ];
        let (mut config, mut n): (H, i32) = (std::ptr::null_mut(), 0);
        assert_eq!(choose(dpy, attrs.as_ptr(), &mut config, 1, &mut n), 1);
        let ctx = create_context(
            dpy,
            config,
            std::ptr::null_mut(),
            [0x3098, 2, 0x3038].as_ptr(),
        );
        assert!(!ctx.is_null());
        fn as_fn<T: Copy>(p: *mut c_void) -> T {
            assert_eq!(std::mem::size_of::<T>(), std::mem::size_of::<*mut c_void>());
            // SAFETY: every caller names a function whose C type, as eglext_virtsoc.h and
            // EGL_KHR_image_base declare it, is `T`.
            unsafe { std::mem::transmute_copy(&p) }
        }
        Some(Api {
            dpy,
            config,
            ctx,
            create_pbuffer: sym(egl, c"eglCreatePbufferSurface"),
            make_current: sym(egl, c"eglMakeCurrent"),
            destroy_surface: sym(egl, c"eglDestroySurface"),
            get_error: sym(egl, c"eglGetError"),
            present: as_fn(ext(c"eglPresentVIRTSOC")),
            command: as_fn(ext(c"eglDeviceCommandVIRTSOC")),
            ledger: as_fn(ext(c"eglQueryLedgerVIRTSOC")),
            create_region: as_fn(ext(c"eglCreateRegionVIRTSOC")),
            destroy_region: as_fn(ext(c"eglDestroyRegionVIRTSOC")),
            create_image: as_fn(ext(c"eglCreateImageKHR")),
            destroy_image: as_fn(ext(c"eglDestroyImageKHR")),
            clear_color: sym(gles, c"glClearColor"),
            clear: sym(gles, c"glClear"),
            enable: sym(gles, c"glEnable"),
            disable: sym(gles, c"glDisable"),
            scissor: sym(gles, c"glScissor"),
            read_pixels: sym(gles, c"glReadPixels"),
            finish: sym(gles, c"glFinish"),
            gen_buffers: sym(gles, c"glGenBuffers"),
            bind_buffer: sym(gles, c"glBindBuffer"),
            buffer_data: sym(gles, c"glBufferData"),
        })
    }

    /// A `w` x `h` pbuffer, current.
    fn surface(&self, w: i32, h: i32) -> H {
        let s = (self.create_pbuffer)(
            self.dpy,
            self.config,
            [0x3057, w, 0x3056, h, 0x3038].as_ptr(),
        );
        assert!(!s.is_null(), "pbuffer: {:#x}", (self.get_error)());
        assert_eq!((self.make_current)(self.dpy, s, s, self.ctx), 1);
        s
    }

    /// Clears the current surface blue with its bottom `red` rows red (GL's rows from 0);
    /// the frame as the display shows it (rows from the top).
    fn draw(&self, (w, h): (i32, i32), red: i32) -> Vec<u8> {
        (self.disable)(0x0C11);
        (self.clear_color)(0.0, 0.0, 1.0, 1.0);
        (self.clear)(0x4000);
        (self.enable)(0x0C11);
        (self.scissor)(0, 0, w, red);
        (self.clear_color)(1.0, 0.0, 0.0, 1.0);
        (self.clear)(0x4000);
        (self.disable)(0x0C11);
        (0..h)
            .flat_map(|y| (0..w).map(move |_| y))
            .flat_map(|y| match y >= h - red {
                true => [255u8, 0, 0, 255],
                false => [0, 0, 255, 255],
            })
            .collect()
    }

    /// The whole current surface read back (rows from the bottom).
    fn pixels(&self, (w, h): (i32, i32)) -> Vec<u8> {
        let mut px = vec![0u8; (w * h * 4) as usize];
        (self.read_pixels)(0, 0, w, h, 0x1908, 0x1401, px.as_mut_ptr().cast());
        px
    }

    /// Presents surface `s` and waits until the display read it; the display's checksum of
    /// the frame it shows.
    fn present_and_checksum(&self, s: H, (w, h): (i32, i32)) -> u32 {
        assert_eq!(
            (self.present)(self.dpy, s, w, h, 0, 1),
            1,
            "{:#x}",
            (self.get_error)()
        );
        let mut out = [0u64; 6];
        let ok = (self.command)(
            self.dpy,
            c"display".as_ptr(),
            c"checksum".as_ptr(),
            std::ptr::null(),
            out.as_mut_ptr(),
        );
        assert_eq!(ok, 1, "checksum: {:#x}", (self.get_error)());
        out[1] as u32
    }

    /// Bytes copied on `src` -> `dst` of this guest's ledger.
    fn ledger_bytes(&self, src: &CStr, dst: &CStr) -> u64 {
        let (mut c, mut b) = (0u64, 0u64);
        assert_eq!(
            (self.ledger)(self.dpy, src.as_ptr(), dst.as_ptr(), &mut c, &mut b),
            1
        );
        b
    }
}

/// This process's guest's `gles` counters (`GET /gles/stats`).
fn gles_stats(ctl: &Path) -> serde_json::Value {
    let target = Target::Unix(ctl.to_path_buf());
    let name = format!("gles-{}", std::process::id());
    let r = request(&target, "GET", "/guests", b"").expect("control");
    let id = r
        .json()
        .as_array()
        .and_then(|gs| gs.iter().find(|g| g["name"] == name.as_str()).cloned())
        .and_then(|g| g["id"].as_u64())
        .expect("this guest");
    let r = request(&target, "GET", "/gles/stats", b"").expect("control");
    r.json()["guests"][id.to_string()].clone()
}

/// Every part, each in a process of its own (the vendor library connects once per
/// process): batches and presents under every protocol, freed replicas, two guests.
#[test]
fn in_place_end_to_end() {
    if !role().is_empty() {
        return;
    }
    for p in ["write-invalidate", "guest-staging", "prefetch"] {
        common::rerun(
            "in_place_guest",
            &[("VIRTSOC_TEST_ROLE", "guest"), ("VIRTSOC_TEST_PROTOCOL", p)],
        );
    }
    // The presents' other way: frames imported as textures and blitted into (the daemon's
    // workers inherit the setting).
    common::rerun(
        "in_place_guest",
        &[
            ("VIRTSOC_TEST_ROLE", "guest"),
            ("VIRTSOC_TEST_PROTOCOL", "write-invalidate"),
            ("VIRTSOC_RENDER_PRESENT", "direct"),
        ],
    );
    common::rerun(
        "freed_replicas_leave_the_worker",
        &[("VIRTSOC_TEST_ROLE", "freed")],
    );
    common::rerun(
        "workers_map_only_their_guests_replicas",
        &[("VIRTSOC_TEST_ROLE", "own")],
    );
}

/// Batches and presents under one protocol (a part of [`in_place_end_to_end`]).
#[test]
fn in_place_guest() {
    if role() != "guest" {
        return;
    }
    let p = protocol();
    let tmp = std::env::temp_dir().join(format!("virtsoc-gles-inplace-{}", std::process::id()));
    let args = ["--display-verify", "--protocol", p.as_str()];
    let Some((_d, _, ctl)) = common::start_daemon(&tmp, &args) else {
        return;
    };
    let Some(api) = Api::open() else { return };
    // Batches: each draw (with a 1 MiB buffer upload in its stream) and its readback (a
    // 400 KB answer, placed in the reply region's replica) equal what was drawn, and the
    // daemon copies none of the stream's bytes: the gles domain's own link carries the
    // answers only.
    let size = (320, 320);
    let s = api.surface(size.0, size.1);
    let self_link = || api.ledger_bytes(c"gles", c"gles");
    let mut buf = 0;
    (api.gen_buffers)(1, &mut buf);
    (api.bind_buffer)(0x8892, buf);
    let upload = vec![7u8; 1 << 20];
    let before = self_link();
    let reds = [1, 7, 100];
    for red in reds {
        (api.buffer_data)(
            0x8892,
            upload.len() as isize,
            upload.as_ptr().cast(),
            0x88E4,
        );
        let want = api.draw(size, red);
        // GL's rows from the bottom: the display's order is the reverse.
        let row = (size.0 * 4) as usize;
        let got: Vec<u8> = api
            .pixels(size)
            .chunks(row)
            .rev()
            .flatten()
            .copied()
            .collect();
        assert!(
            got == want,
            "{p}: the frame with {red} red rows read back as drawn"
        );
    }
    let answers = reds.len() as u64 * (size.0 * size.1 * 4 + 64) as u64;
    let copied = self_link() - before;
    assert!(
        copied <= answers,
        "{p}: no stream byte copied by the daemon: {copied} bytes on the gles link"
    );
    // Presents: top row on top, one copy each (read back with the rows reversed; with
    // VIRTSOC_RENDER_PRESENT=direct the first size is blitted into its memory).
    for size in [(64, 32), (20, 6)] {
        let s2 = api.surface(size.0, size.1);
        let s0 = gles_stats(&ctl);
        for red in [1, 3] {
            let want = api.draw(size, red);
            assert_eq!(
                api.present_and_checksum(s2, size),
                crc32(&want),
                "{p}: {size:?} with {red} red rows shown top row on top"
            );
        }
        let s1 = gles_stats(&ctl);
        let n = |k: &str| s1[k].as_u64().unwrap_or(0) - s0[k].as_u64().unwrap_or(0);
        assert_eq!(n("presents"), 2, "{p} {size:?}: {s1}");
        assert_eq!(
            n("frame_copies"),
            2,
            "{p} {size:?}: one copy per present: {s1}"
        );
        assert_eq!((api.destroy_surface)(api.dpy, s2), 1);
    }
    assert_eq!((api.make_current)(api.dpy, s, s, api.ctx), 1);
    let _ = std::fs::remove_dir_all(&tmp);
}

/// A part of [`in_place_end_to_end`].
#[test]
fn freed_replicas_leave_the_worker() {
    if role() != "freed" {
        return;
    }
    let tmp = std::env::temp_dir().join(format!("virtsoc-gles-freed-{}", std::process::id()));
    let Some((_d, _, ctl)) = common::start_daemon(&tmp, &["--display-verify"]) else {
        return;
    };
    let Some(api) = Api::open() else { return };
    let mapped = || gles_stats(&ctl)["worker_mappings"].as_u64().unwrap_or(0);
    let _s = api.surface(64, 64);
    (api.finish)();
    let held = mapped();
    assert!(held >= 2, "the stream regions at least: {held}");
    // An EGLImage of a region is imported from its replica, which the worker maps; the
    // region freed (and another made in its place), the mapping goes at the next command.
    for round in 0..3 {
        let mut region = 0u64;
        assert_eq!((api.create_region)(api.dpy, 0x7A10, 64, 64, &mut region), 1);
        let attrs = [0x7A01, region as i32, 0x7A02, (region >> 32) as i32, 0x3038];
        let image = (api.create_image)(
            api.dpy,
            std::ptr::null_mut(),
            0x7A00,
            std::ptr::null_mut(),
            attrs.as_ptr(),
        );
        assert!(!image.is_null(), "image: {:#x}", (api.get_error)());
        (api.finish)();
        assert_eq!(
            mapped(),
            held + 1,
            "round {round}: the region's replica mapped"
        );
        assert_eq!((api.destroy_image)(api.dpy, image), 1);
        assert_eq!((api.destroy_region)(api.dpy, region), 1);
        (api.finish)();
        assert_eq!(
            mapped(),
            held,
            "round {round}: the freed region's mapping is gone"
        );
    }
    let _ = std::fs::remove_dir_all(&tmp);
}

/// The inodes of the shared replicas mapped in process `pid`.
fn replica_inodes(pid: u32) -> BTreeSet<u64> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    maps.lines()
        .filter(|l| l.contains("memfd:virtsoc-replica"))
        .filter_map(|l| l.split_whitespace().nth(4)?.parse().ok())
        .collect()
}

/// The render workers of daemon `pid` (its children named virtsoc-render).
fn workers(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten();
    for t in tasks.flatten() {
        let children = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
        for c in children
            .split_whitespace()
            .filter_map(|c| c.parse::<u32>().ok())
        {
            let comm = std::fs::read_to_string(format!("/proc/{c}/comm")).unwrap_or_default();
            if comm.trim() == "virtsoc-render" {
                out.push(c);
            }
        }
    }
    out
}

/// A part of [`in_place_end_to_end`].
#[test]
fn workers_map_only_their_guests_replicas() {
    if role() != "own" {
        return;
    }
    // SAFETY: geteuid has no arguments.
    if unsafe { libc::geteuid() } != 0 {
        return skip("reading the sandboxed workers' maps needs root");
    }
    let tmp = std::env::temp_dir().join(format!("virtsoc-gles-own-{}", std::process::id()));
    let Some((d, sock, _)) = common::start_daemon(&tmp, &["--display-verify"]) else {
        return;
    };
    let Some(api) = Api::open() else { return };
    let s = api.surface(64, 64);
    api.draw((64, 64), 5);
    api.present_and_checksum(s, (64, 64));
    (api.finish)();
    // A second guest on a connection of its own runs a batch (its worker starts), then
    // names every region id it could guess in the gles device's commands: ids are per
    // guest, so what it reaches is its own or nothing.
    let other = EGL_virtsoc::transport::Transport::open(sock.to_str().expect("utf-8"))
        .expect("a second guest");
    let mut e = virtsoc_gles_stream::Encoder::new();
    e.packet(virtsoc_gles_stream::egl::FINISH);
    EGL_virtsoc::rt::Channel::exec(&other, e.as_bytes(), true).expect("its batch runs");
    let conn = other.connection();
    let gles = virtsoc_devapi::gles::ID;
    for id in 1..64u64 {
        let rb = virtsoc_devapi::gles::Readback {
            surface: 1,
            frame: RegionId(id),
        };
        let im = virtsoc_devapi::gles::Import {
            image: 1,
            region: RegionId(id),
            size: 4 | 4 << 32,
            layout: 16 | 1 << 32,
            planes: 0,
        };
        for args in [
            virtsoc_devapi::DeviceCommand::encode(&rb),
            virtsoc_devapi::DeviceCommand::encode(&im),
        ] {
            if let Ok(seq) = conn.submit(virtsoc_proto::Opcode::DeviceCmd, gles, args) {
                let _ = conn.wait(seq);
            }
        }
    }
    EGL_virtsoc::rt::Channel::exec(&other, e.as_bytes(), true).expect("it goes on");
    let ws = workers(d.0.id());
    assert_eq!(ws.len(), 2, "one render worker per guest: {ws:?}");
    let sets: Vec<BTreeSet<u64>> = ws.iter().map(|&w| replica_inodes(w)).collect();
    assert!(
        sets.iter().all(|s| !s.is_empty()),
        "each maps its replicas: {sets:?}"
    );
    assert!(
        sets[0].is_disjoint(&sets[1]),
        "two guests' workers share a replica: {sets:?}"
    );
    drop(other);
    let _ = std::fs::remove_dir_all(&tmp);
}
