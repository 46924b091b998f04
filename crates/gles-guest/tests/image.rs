//! End to end: EGLImages of SVM regions (`EGL_VIRTSOC_REGION`) through glvnd and a real
//! daemon. An RGBA region written by the CPU is drawn and read back equal; an NV12 region
//! sampled through an external texture (`samplerExternalOES`) equals a CPU BT.601
//! reference; a rewritten region is drawn with its new pixels after the next
//! `glEGLImageTargetTexture2DOES`, and an unchanged one is not copied again (the ledger's
//! `guest-window -> gles` link); bad images are EGL errors, never hangs.
//!
//! Built binaries: `cargo build -p virtsocd` and `cargo build -p virtsoc-gles
//! -p virtsoc-render`; without them (or glvnd) the test is skipped loudly, unless
//! `VIRTSOC_REQUIRE_ALL` is set.

mod common;

use std::ffi::{c_char, c_void, CStr};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{dlopen, skip, sym, H};

const EGL_VIRTSOC_REGION: u32 = 0x7A00;
const ID_LO: i32 = 0x7A01;
const ID_HI: i32 = 0x7A02;
const FORMAT: i32 = 0x7A03;
const RGBA8: i32 = 0x7A10;
const NV12: i32 = 0x7A11;
const YUV420: i32 = 0x7A12;
const BLOB: i32 = 0x7A13;
const EGL_WIDTH: i32 = 0x3057;
const EGL_NONE: i32 = 0x3038;
const EGL_BAD_PARAMETER: i32 = 0x300C;
const EGL_BAD_MATCH: i32 = 0x3009;
const TEXTURE_2D: u32 = 0x0DE1;
const TEXTURE_EXTERNAL: u32 = 0x8D65;
const SIZE: i32 = 64;

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

fn rgba_pattern(x: usize, y: usize, seed: u8) -> [u8; 4] {
    [
        (x * 4) as u8 ^ seed,
        (y * 4) as u8,
        ((x ^ y) * 4) as u8 ^ seed.rotate_left(3),
        255,
    ]
}

/// The extension function at `p` as `T` (its C type).
fn as_fn<T: Copy>(p: *mut c_void) -> T {
    assert!(!p.is_null());
    assert_eq!(std::mem::size_of::<T>(), std::mem::size_of::<*mut c_void>());
    // SAFETY: every caller names a function whose C type, as eglext_virtsoc.h and the
    // EGL/GL headers declare it, is `T`.
    unsafe { std::mem::transmute_copy(&p) }
}

/// The coherence protocol of this run's daemon: `$VIRTSOC_TEST_PROTOCOL`, else the
/// daemon's default.
fn protocol() -> String {
    std::env::var("VIRTSOC_TEST_PROTOCOL").unwrap_or_else(|_| "write-invalidate".into())
}

/// The same test under the other protocols, each in a process of its own (the vendor
/// library connects once per process).
#[test]
fn regions_as_egl_images_under_every_protocol() {
    if std::env::var_os("VIRTSOC_TEST_PROTOCOL").is_some() {
        return;
    }
    for p in ["guest-staging", "prefetch"] {
        common::rerun("regions_as_egl_images", &[("VIRTSOC_TEST_PROTOCOL", p)]);
    }
}

#[test]
fn regions_as_egl_images() {
    let tmp = std::env::temp_dir().join(format!("virtsoc-gles-image-{}", std::process::id()));
    let coherence = protocol();
    let Some((_d, sock, _)) = common::start_daemon(&tmp, &["--protocol", &coherence]) else {
        return;
    };
    let egl = dlopen(c"libEGL.so.1");
    let gles = dlopen(c"libGLESv2.so.2");
    if egl.is_null() || gles.is_null() {
        return skip("glvnd's libEGL.so.1 / libGLESv2.so.2 not installed");
    }
    let get_platform_display: extern "C" fn(u32, H, *const isize) -> H =
        sym(egl, c"eglGetPlatformDisplay");
    let initialize: extern "C" fn(H, *mut i32, *mut i32) -> u32 = sym(egl, c"eglInitialize");
    let choose: extern "C" fn(H, *const i32, *mut H, i32, *mut i32) -> u32 =
        sym(egl, c"eglChooseConfig");
    let create_context: extern "C" fn(H, H, H, *const i32) -> H = sym(egl, c"eglCreateContext");
    let create_pbuffer: extern "C" fn(H, H, *const i32) -> H = sym(egl, c"eglCreatePbufferSurface");
    let make_current: extern "C" fn(H, H, H, H) -> u32 = sym(egl, c"eglMakeCurrent");
    let query_string: extern "C" fn(H, i32) -> *const c_char = sym(egl, c"eglQueryString");
    let get_error: extern "C" fn() -> i32 = sym(egl, c"eglGetError");
    let get_proc: extern "C" fn(*const c_char) -> *mut c_void = sym(egl, c"eglGetProcAddress");
    let proc = |name: &CStr| {
        let p = get_proc(name.as_ptr());
        assert!(!p.is_null(), "{name:?}");
        p
    };
    let create_region: extern "C" fn(H, i32, i32, i32, *mut u64) -> u32 =
        as_fn(proc(c"eglCreateRegionVIRTSOC"));
    let map_region: extern "C" fn(H, u64, *mut i32) -> *mut u8 =
        as_fn(proc(c"eglMapRegionVIRTSOC"));
    let unmap_region: extern "C" fn(H, u64) -> u32 = as_fn(proc(c"eglUnmapRegionVIRTSOC"));
    let destroy_region: extern "C" fn(H, u64) -> u32 = as_fn(proc(c"eglDestroyRegionVIRTSOC"));
    let ledger: extern "C" fn(H, *const c_char, *const c_char, *mut u64, *mut u64) -> u32 =
        as_fn(proc(c"eglQueryLedgerVIRTSOC"));
    let create_image: extern "C" fn(H, H, u32, H, *const i32) -> H =
        as_fn(proc(c"eglCreateImageKHR"));
    let destroy_image: extern "C" fn(H, H) -> u32 = as_fn(proc(c"eglDestroyImageKHR"));
    let target_texture: extern "C" fn(u32, H) = as_fn(proc(c"glEGLImageTargetTexture2DOES"));
    let device_command: extern "C" fn(
        H,
        *const c_char,
        *const c_char,
        *const u64,
        *mut u64,
    ) -> u32 = as_fn(proc(c"eglDeviceCommandVIRTSOC"));

    let dpy = get_platform_display(0x31DD, std::ptr::null_mut(), std::ptr::null());
    let (mut major, mut minor) = (0, 0);
    assert_eq!(initialize(dpy, &mut major, &mut minor), 1);
    // SAFETY: a static NUL-terminated string of the vendor.
    let ext = unsafe { CStr::from_ptr(query_string(dpy, 0x3055)) };
    let ext = ext.to_str().unwrap_or_default();
    assert!(ext.contains("EGL_KHR_image_base") && ext.contains("EGL_VIRTSOC_region_image"));
    let attrs = [
        0x3024, 8, 0x3023, 8, 0x3022, 8, 0x3021, 8, 0x3033, 1, 0x3040, 4, 0x3038,
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
    let surf = create_pbuffer(dpy, config, [0x3057, SIZE, 0x3056, SIZE, 0x3038].as_ptr());
    assert!(!surf.is_null());
    assert_eq!(make_current(dpy, surf, surf, ctx), 1);

    let get_string: extern "C" fn(u32) -> *const c_char = sym(gles, c"glGetString");
    // SAFETY: glGetString's static string.
    let gl_ext = unsafe { CStr::from_ptr(get_string(0x1F03)) };
    let gl_ext = gl_ext.to_str().unwrap_or_default().to_owned();
    assert!(gl_ext.contains("GL_OES_EGL_image"), "{gl_ext}");
    let read_pixels: extern "C" fn(i32, i32, i32, i32, u32, u32, *mut c_void) =
        sym(gles, c"glReadPixels");
    let gl_get_error: extern "C" fn() -> u32 = sym(gles, c"glGetError");
    let create_shader: extern "C" fn(u32) -> u32 = sym(gles, c"glCreateShader");
    let shader_source: extern "C" fn(u32, i32, *const *const c_char, *const i32) =
        sym(gles, c"glShaderSource");
    let compile_shader: extern "C" fn(u32) = sym(gles, c"glCompileShader");
    let get_shaderiv: extern "C" fn(u32, u32, *mut i32) = sym(gles, c"glGetShaderiv");
    let create_program: extern "C" fn() -> u32 = sym(gles, c"glCreateProgram");
    let attach_shader: extern "C" fn(u32, u32) = sym(gles, c"glAttachShader");
    let bind_attrib: extern "C" fn(u32, u32, *const c_char) = sym(gles, c"glBindAttribLocation");
    let link_program: extern "C" fn(u32) = sym(gles, c"glLinkProgram");
    let get_programiv: extern "C" fn(u32, u32, *mut i32) = sym(gles, c"glGetProgramiv");
    let use_program: extern "C" fn(u32) = sym(gles, c"glUseProgram");
    let attrib_pointer: extern "C" fn(u32, i32, u32, u8, i32, *const c_void) =
        sym(gles, c"glVertexAttribPointer");
    let enable_attrib: extern "C" fn(u32) = sym(gles, c"glEnableVertexAttribArray");
    let draw_arrays: extern "C" fn(u32, i32, i32) = sym(gles, c"glDrawArrays");
    let viewport: extern "C" fn(i32, i32, i32, i32) = sym(gles, c"glViewport");
    let gen_textures: extern "C" fn(i32, *mut u32) = sym(gles, c"glGenTextures");
    let bind_texture: extern "C" fn(u32, u32) = sym(gles, c"glBindTexture");
    let tex_parameteri: extern "C" fn(u32, u32, i32) = sym(gles, c"glTexParameteri");

    let program = |fs: &CStr| {
        let shader = |kind: u32, src: &CStr| {
            let s = create_shader(kind);
            let p = src.as_ptr();
            shader_source(s, 1, &p, std::ptr::null());
            compile_shader(s);
            let mut ok = 0;
            get_shaderiv(s, 0x8B81, &mut ok);
            assert_eq!(ok, 1, "shader compiles: {src:?}");
            s
        };
        let vs = shader(
            0x8B31,
            c"attribute vec2 pos; varying vec2 tc; void main() { tc = pos * 0.5 + 0.5; gl_Position = vec4(pos, 0.0, 1.0); }",
        );
        let prog = create_program();
        attach_shader(prog, vs);
        attach_shader(prog, shader(0x8B30, fs));
        bind_attrib(prog, 0, c"pos".as_ptr());
        link_program(prog);
        let mut linked = 0;
        get_programiv(prog, 0x8B82, &mut linked);
        assert_eq!(linked, 1, "program links");
        prog
    };
    let quad: [f32; 8] = [-1.0, -1.0, 1.0, -1.0, -1.0, 1.0, 1.0, 1.0];
    let frame = || {
        viewport(0, 0, SIZE, SIZE);
        attrib_pointer(0, 2, 0x1406, 0, 0, quad.as_ptr().cast());
        enable_attrib(0);
        draw_arrays(0x0005, 0, 4);
        let mut px = vec![0u8; (SIZE * SIZE * 4) as usize];
        read_pixels(0, 0, SIZE, SIZE, 0x1908, 0x1401, px.as_mut_ptr().cast());
        px
    };
    let window_to_gles = || {
        let (mut c, mut b) = (0u64, 0u64);
        assert_eq!(
            ledger(
                dpy,
                c"guest-window".as_ptr(),
                c"gles".as_ptr(),
                &mut c,
                &mut b
            ),
            1
        );
        (c, b)
    };
    let fill = |region: u64, f: &dyn Fn(&mut [u8], usize)| {
        let mut stride = 0;
        let p = map_region(dpy, region, &mut stride);
        assert!(!p.is_null(), "map: {:#x}", get_error());
        // SAFETY: the mapping holds the whole region (at least what `f` writes, which
        // each caller sizes from the region's layout) until the unmap.
        let bytes = unsafe { std::slice::from_raw_parts_mut(p, (SIZE * SIZE * 4) as usize) };
        f(bytes, stride as usize);
        assert_eq!(unmap_region(dpy, region), 1);
    };
    let image_of = |region: u64, extra: &[i32]| {
        let mut a = vec![ID_LO, region as u32 as i32, ID_HI, (region >> 32) as i32];
        a.extend_from_slice(extra);
        a.push(EGL_NONE);
        create_image(
            dpy,
            std::ptr::null_mut(),
            EGL_VIRTSOC_REGION,
            std::ptr::null_mut(),
            a.as_ptr(),
        )
    };
    let texture = |target: u32| {
        let mut t = 0;
        gen_textures(1, &mut t);
        bind_texture(target, t);
        tex_parameteri(target, 0x2801, 0x2600); // MIN_FILTER NEAREST
        tex_parameteri(target, 0x2800, 0x2600); // MAG_FILTER NEAREST
        t
    };

    // --- RGBA: written by the CPU, imported, drawn and read back equal.
    let mut rgba = 0u64;
    assert_eq!(create_region(dpy, RGBA8, SIZE, SIZE, &mut rgba), 1);
    let pattern = |seed: u8| {
        move |b: &mut [u8], stride: usize| {
            for y in 0..SIZE as usize {
                for x in 0..SIZE as usize {
                    b[y * stride + 4 * x..][..4].copy_from_slice(&rgba_pattern(x, y, seed));
                }
            }
        }
    };
    // Before the write: the prefetch protocol may move the bytes at the write's end.
    let before = window_to_gles();
    fill(rgba, &pattern(0));
    let image = image_of(rgba, &[]);
    assert!(!image.is_null(), "eglCreateImageKHR: {:#x}", get_error());
    let after_create = window_to_gles();
    assert!(
        after_create.0 > before.0 && after_create.1 - before.1 >= (SIZE * SIZE * 4) as u64,
        "the import copied the region into the gles domain on the ledger: {before:?} -> {after_create:?}"
    );
    let prog2d = program(
        c"precision mediump float; varying vec2 tc; uniform sampler2D t; void main() { gl_FragColor = texture2D(t, tc); }",
    );
    use_program(prog2d);
    let tex = texture(TEXTURE_2D);
    target_texture(TEXTURE_2D, image);
    assert_eq!(gl_get_error(), 0);
    let expect = |seed: u8| {
        let mut v = Vec::new();
        for y in 0..SIZE as usize {
            for x in 0..SIZE as usize {
                v.extend_from_slice(&rgba_pattern(x, y, seed));
            }
        }
        v
    };
    assert!(
        frame() == expect(0),
        "the drawn image equals the region's pixels"
    );
    // The link also carries the stream's batches (small): an import is a whole region.
    // Guest-staging (the baseline) pulls every device read from the guest again, so only
    // the other protocols copy nothing for an unchanged region (the daemon skips the
    // worker's upload under all three).
    let region_bytes = (SIZE * SIZE * 4) as u64;
    let unchanged_limit = match protocol().as_str() {
        "guest-staging" => 2 * region_bytes,
        _ => region_bytes,
    };
    let imported = window_to_gles();
    assert!(
        imported.1 - after_create.1 < unchanged_limit,
        "an unchanged region is not copied again: {after_create:?} -> {imported:?}"
    );

    // --- Rewritten: the next glEGLImageTargetTexture2DOES imports it, the draw shows it.
    fill(rgba, &pattern(0x5A));
    bind_texture(TEXTURE_2D, tex);
    target_texture(TEXTURE_2D, image);
    assert_eq!(gl_get_error(), 0);
    assert!(frame() == expect(0x5A), "the rewritten region is drawn");
    let rewritten = window_to_gles();
    assert!(
        rewritten.1 - imported.1 >= region_bytes,
        "the rewrite was copied: {imported:?} -> {rewritten:?}"
    );
    // Latching again without a write copies nothing and draws the same.
    target_texture(TEXTURE_2D, image);
    assert!(frame() == expect(0x5A));
    let again = window_to_gles();
    assert!(
        again.1 - rewritten.1 < unchanged_limit,
        "{rewritten:?} -> {again:?}"
    );

    // --- NV12 through an external texture.
    let mut nv12 = 0u64;
    assert_eq!(create_region(dpy, NV12, SIZE, SIZE, &mut nv12), 1);
    let s = SIZE as usize;
    let luma = |x: usize, y: usize| (16 + (x * 219 / s + y) % 220) as u8;
    let chroma = |x: usize, y: usize| ((40 + x * 5) as u8, (200 - y * 4) as u8);
    fill(nv12, &|b: &mut [u8], stride: usize| {
        for y in 0..s {
            for x in 0..s {
                b[y * stride + x] = luma(x, y);
            }
        }
        for y in 0..s / 2 {
            for x in 0..s / 2 {
                let (u, v) = chroma(x, y);
                b[stride * s + y * stride + 2 * x] = u;
                b[stride * s + y * stride + 2 * x + 1] = v;
            }
        }
    });
    let nv_image = image_of(nv12, &[]);
    assert!(!nv_image.is_null(), "NV12 image: {:#x}", get_error());
    // The same picture as YUV 4:2:0 planes.
    let mut i420 = 0u64;
    assert_eq!(create_region(dpy, YUV420, SIZE, SIZE, &mut i420), 1);
    fill(i420, &|b: &mut [u8], stride: usize| {
        for y in 0..s {
            for x in 0..s {
                b[y * stride + x] = luma(x, y);
            }
        }
        let (cs, u0) = (stride / 2, stride * s);
        let v0 = u0 + cs * s / 2;
        for y in 0..s / 2 {
            for x in 0..s / 2 {
                let (u, v) = chroma(x, y);
                b[u0 + y * cs + x] = u;
                b[v0 + y * cs + x] = v;
            }
        }
    });
    let i420_image = image_of(i420, &[]);
    assert!(!i420_image.is_null(), "YUV420 image: {:#x}", get_error());
    let check_yuv = |what: &str| {
        let got = frame();
        let mut worst = 0;
        for y in 0..s {
            for x in 0..s {
                let (u, v) = chroma(x / 2, y / 2);
                let want = yuv(luma(x, y), u, v);
                let o = (y * s + x) * 4;
                for c in 0..4 {
                    worst = worst.max(want[c].abs_diff(got[o + c]));
                }
            }
        }
        assert!(
            worst <= 2,
            "{what} drawn within 2 of the BT.601 reference: {worst}"
        );
    };
    // YUV 4:2:0 through a GL_TEXTURE_2D (the host converted it to RGBA).
    use_program(prog2d);
    texture(TEXTURE_2D);
    target_texture(TEXTURE_2D, i420_image);
    assert_eq!(gl_get_error(), 0);
    check_yuv("YUV 4:2:0 as a 2D texture");
    if gl_ext.contains("GL_OES_EGL_image_external") {
        let prog_ext = program(
            c"#extension GL_OES_EGL_image_external : require\nprecision mediump float; varying vec2 tc; uniform samplerExternalOES t; void main() { gl_FragColor = texture2D(t, tc); }",
        );
        use_program(prog_ext);
        texture(TEXTURE_EXTERNAL);
        target_texture(TEXTURE_EXTERNAL, nv_image);
        assert_eq!(gl_get_error(), 0);
        check_yuv("NV12 through samplerExternalOES");
        texture(TEXTURE_EXTERNAL);
        target_texture(TEXTURE_EXTERNAL, i420_image);
        check_yuv("YUV 4:2:0 through samplerExternalOES");
    } else {
        skip("the host GL has no GL_OES_EGL_image_external");
    }

    // --- A picture the codec device decoded (a one-frame H.264 clip made by ffmpeg now)
    // into an NV12 region, imported from the codec's memory, not the guest's.
    let clip = tmp.join("clip.h264");
    let made = Command::new("ffmpeg")
        .args(["-v", "error", "-y", "-f", "lavfi", "-i"])
        .arg(format!("testsrc2=size={SIZE}x{SIZE}:rate=25"))
        .args([
            "-frames:v",
            "1",
            "-c:v",
            "libx264",
            "-pix_fmt",
            "yuv420p",
            "-f",
            "h264",
        ])
        .arg(&clip)
        .status()
        .is_ok_and(|s| s.success());
    let cmd = |device: &CStr, command: &CStr, args: &[u64]| {
        let mut out = [0u64; 6];
        let ok = device_command(
            dpy,
            device.as_ptr(),
            command.as_ptr(),
            args.as_ptr(),
            out.as_mut_ptr(),
        );
        assert_eq!(ok, 1, "{device:?}::{command:?}: {:#x}", get_error());
        out
    };
    if !made {
        skip("ffmpeg with libx264 cannot make the H.264 clip");
    } else {
        let bits = std::fs::read(&clip).expect("the clip");
        let mut bitstream = 0u64;
        assert_eq!(
            create_region(dpy, BLOB, bits.len() as i32, 1, &mut bitstream),
            1
        );
        let p = map_region(dpy, bitstream, std::ptr::null_mut());
        assert!(!p.is_null());
        // SAFETY: the mapping holds the region's `bits.len()` bytes until the unmap.
        unsafe { std::ptr::copy_nonoverlapping(bits.as_ptr(), p, bits.len()) };
        assert_eq!(unmap_region(dpy, bitstream), 1);
        let handle = cmd(c"codec", c"open_decoder", &[0, 3, 1])[0]; // H.264 to NV12
        cmd(
            c"codec",
            c"decode",
            &[handle, bitstream, bits.len() as u64, 0],
        );
        cmd(c"codec", c"flush", &[handle]);
        let info = cmd(c"codec", c"stream_info", &[handle]);
        assert_eq!((info[0], info[1]), (SIZE as u64, SIZE as u64));
        let mut picture = 0u64;
        assert_eq!(create_region(dpy, NV12, SIZE, SIZE, &mut picture), 1);
        let into_gles = || {
            let (mut c, mut b) = (0u64, 0u64);
            assert_eq!(
                ledger(dpy, std::ptr::null(), c"gles".as_ptr(), &mut c, &mut b),
                1
            );
            b
        };
        let (all0, window0) = (into_gles(), window_to_gles().1);
        assert_eq!(
            cmd(c"codec", c"receive_frame", &[handle, picture])[0],
            1,
            "a picture"
        );
        cmd(c"codec", c"close", &[handle]);
        let decoded = image_of(picture, &[]);
        assert!(
            !decoded.is_null(),
            "image of the decoded picture: {:#x}",
            get_error()
        );
        let (all1, window1) = (into_gles(), window_to_gles().1);
        let nv12_bytes = (SIZE * SIZE * 3 / 2) as u64;
        // The picture comes into the gles domain from the codec's side; under guest-staging
        // the window is the only truth, so it comes through the window (the codec wrote it
        // back there). (The daemon's own copy of the replica into the worker's message,
        // counted on the gles domain's self-link, used to pass for it: the worker reads
        // the replica in place now.)
        let (from_codec, from_window) = ((all1 - all0) - (window1 - window0), window1 - window0);
        let came = match protocol().as_str() {
            "guest-staging" => from_window,
            _ => from_codec,
        };
        assert!(
            came >= nv12_bytes,
            "the picture came into the gles domain from the codec's side: {all0}/{window0} -> {all1}/{window1}"
        );
        use_program(prog2d);
        texture(TEXTURE_2D);
        target_texture(TEXTURE_2D, decoded);
        assert_eq!(gl_get_error(), 0);
        let got = frame();
        // The reference: the picture's bytes as the CPU reads them, through BT.601.
        let mut stride = 0;
        let p = map_region(dpy, picture, &mut stride);
        assert!(!p.is_null());
        let stride = stride as usize;
        // SAFETY: the mapping holds the NV12 region (stride * SIZE * 3 / 2 bytes).
        let b = unsafe { std::slice::from_raw_parts(p, stride * s * 3 / 2) };
        let mut worst = 0;
        for y in 0..s {
            for x in 0..s {
                let c = stride * s + (y / 2) * stride + (x / 2) * 2;
                let want = yuv(b[y * stride + x], b[c], b[c + 1]);
                for k in 0..4 {
                    worst = worst.max(want[k].abs_diff(got[(y * s + x) * 4 + k]));
                }
            }
        }
        assert_eq!(unmap_region(dpy, picture), 1);
        assert!(
            worst <= 2,
            "the decoded picture drawn within 2 of its BT.601 reference: {worst}"
        );
        assert_eq!(destroy_image(dpy, decoded), 1);
    }

    // --- Bad input: EGL errors, never hangs.
    let other = virtsoc_guest::Connection::open(
        sock.to_str().expect("utf-8 path"),
        &virtsoc_guest::ConnectOptions::default(),
    )
    .expect("another guest");
    let mut foreign = 0;
    for _ in 0..100 {
        let r = other.alloc(0, 16, 16, virtsoc_proto::wire::Format::Rgba8, 0);
        foreign = u64::from(r.expect("alloc").id);
    }
    assert!(image_of(foreign, &[]).is_null(), "another guest's region");
    assert_eq!(get_error(), EGL_BAD_PARAMETER);
    assert!(
        image_of(rgba, &[EGL_WIDTH, 2 * SIZE]).is_null(),
        "larger than the region"
    );
    assert_eq!(get_error(), EGL_BAD_MATCH);
    assert!(
        image_of(rgba, &[FORMAT, NV12]).is_null(),
        "not the region's format"
    );
    assert_eq!(get_error(), EGL_BAD_MATCH);
    assert!(
        image_of(rgba, &[FORMAT, 0x1234]).is_null(),
        "no such format"
    );
    assert_eq!(get_error(), EGL_BAD_PARAMETER);
    let bad_target = [ID_LO, rgba as i32, EGL_NONE];
    assert!(create_image(
        dpy,
        std::ptr::null_mut(),
        0x30B1,
        std::ptr::null_mut(),
        bad_target.as_ptr()
    )
    .is_null());
    assert_eq!(get_error(), EGL_BAD_PARAMETER);
    // A freed region: no new image of it, and latching its image fails cleanly.
    assert_eq!(destroy_region(dpy, rgba), 1);
    assert!(image_of(rgba, &[]).is_null(), "a freed region");
    assert_eq!(get_error(), EGL_BAD_PARAMETER);
    bind_texture(TEXTURE_2D, tex);
    let t = Instant::now();
    target_texture(TEXTURE_2D, image);
    assert_eq!(
        gl_get_error(),
        0x0502,
        "GL_INVALID_OPERATION for a freed region"
    );
    assert!(t.elapsed() < Duration::from_secs(10));
    target_texture(TEXTURE_2D, std::ptr::null_mut());
    assert_eq!(gl_get_error(), 0x0501, "GL_INVALID_VALUE for no image");
    assert_eq!(destroy_image(dpy, image), 1);
    assert_eq!(destroy_image(dpy, image), 0);
    assert_eq!(get_error(), EGL_BAD_PARAMETER);
    assert_eq!(destroy_image(dpy, nv_image), 1);
    assert_eq!(destroy_image(dpy, i420_image), 1);
    assert_eq!(
        make_current(
            dpy,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut()
        ),
        1
    );
    let _ = std::fs::remove_dir_all(&tmp);
}
