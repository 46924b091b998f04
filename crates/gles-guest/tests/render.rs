//! End to end: a real daemon (`virtsocd`, its render worker `virtsoc-render`), glvnd's
//! `libEGL.so.1` / `libGLESv2.so.2` pointed at `libEGL_virtsoc.so`, and a program (this
//! test) that clears a pbuffer, draws a triangle and reads the pixels back.
//!
//! The binaries are built by `cargo build -p virtsocd -p virtsoc-render -p
//! virtsoc-gles`; without them (or without glvnd) the test is skipped loudly, unless
//! `VIRTSOC_REQUIRE_ALL` is set.

mod common;

use std::ffi::{c_char, c_void, CStr};

use common::{dlopen, skip, sym, H};

#[test]
fn draws_and_reads_pixels_through_the_daemon() {
    let tmp = std::env::temp_dir().join(format!("virtsoc-gles-test-{}", std::process::id()));
    let Some((_d, _sock, _)) = common::start_daemon(&tmp, &[]) else {
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

    let dpy = get_platform_display(0x31DD, std::ptr::null_mut(), std::ptr::null());
    assert!(!dpy.is_null(), "no surfaceless display: {:#x}", get_error());
    let (mut major, mut minor) = (0, 0);
    assert_eq!(
        initialize(dpy, &mut major, &mut minor),
        1,
        "eglInitialize: {:#x}",
        get_error()
    );
    // SAFETY: a static NUL-terminated string of the vendor.
    let vendor_name = unsafe { CStr::from_ptr(query_string(dpy, 0x3053)) };
    assert_eq!(vendor_name.to_str().ok(), Some("virtsoc"));
    let attrs = [
        0x3024, 8, 0x3023, 8, 0x3022, 8, 0x3033, 1, 0x3040, 4, 0x3038,
    ];
    let (mut config, mut n): (H, i32) = (std::ptr::null_mut(), 0);
    assert_eq!(choose(dpy, attrs.as_ptr(), &mut config, 1, &mut n), 1);
    assert_eq!(n, 1);
    let ctx_attrs = [0x3098, 2, 0x3038];
    let ctx = create_context(dpy, config, std::ptr::null_mut(), ctx_attrs.as_ptr());
    assert!(!ctx.is_null(), "eglCreateContext: {:#x}", get_error());
    // ES 1 is refused cleanly (ES 3 is offered: tests/es3.rs).
    let es1 = [0x3098, 1, 0x3038];
    assert!(create_context(dpy, config, std::ptr::null_mut(), es1.as_ptr()).is_null());
    assert_eq!(get_error(), 0x3009);
    let (w, h) = (1024i32, 768i32);
    let pb_attrs = [0x3057, w, 0x3056, h, 0x3038];
    let surf = create_pbuffer(dpy, config, pb_attrs.as_ptr());
    assert!(
        !surf.is_null(),
        "eglCreatePbufferSurface: {:#x}",
        get_error()
    );
    assert_eq!(
        make_current(dpy, surf, surf, ctx),
        1,
        "eglMakeCurrent: {:#x}",
        get_error()
    );

    let clear_color: extern "C" fn(f32, f32, f32, f32) = sym(gles, c"glClearColor");
    let clear: extern "C" fn(u32) = sym(gles, c"glClear");
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

    let pixel = |x: i32, y: i32| {
        let mut px = [0u8; 4];
        read_pixels(x, y, 1, 1, 0x1908, 0x1401, px.as_mut_ptr().cast());
        px
    };
    clear_color(1.0, 0.0, 0.0, 1.0);
    clear(0x4000);
    assert_eq!(pixel(3, 3), [255, 0, 0, 255], "cleared red");
    assert_eq!(gl_get_error(), 0);

    let shader = |kind: u32, src: &CStr| {
        let s = create_shader(kind);
        let p = src.as_ptr();
        shader_source(s, 1, &p, std::ptr::null());
        compile_shader(s);
        let mut ok = 0;
        get_shaderiv(s, 0x8B81, &mut ok);
        assert_eq!(ok, 1, "shader compiles");
        s
    };
    let vs = shader(
        0x8B31,
        c"attribute vec2 pos; void main() { gl_Position = vec4(pos, 0.0, 1.0); }",
    );
    let fs = shader(
        0x8B30,
        c"precision mediump float; void main() { gl_FragColor = vec4(0.0, 1.0, 0.0, 1.0); }",
    );
    let prog = create_program();
    attach_shader(prog, vs);
    attach_shader(prog, fs);
    bind_attrib(prog, 0, c"pos".as_ptr());
    link_program(prog);
    let mut linked = 0;
    get_programiv(prog, 0x8B82, &mut linked);
    assert_eq!(linked, 1, "program links");
    use_program(prog);
    viewport(0, 0, w, h);
    let tri: [f32; 6] = [-0.9, -0.9, 0.9, -0.9, 0.0, 0.9];
    attrib_pointer(0, 2, 0x1406, 0, 0, tri.as_ptr().cast());
    enable_attrib(0);
    draw_arrays(0x0004, 0, 3);
    assert_eq!(
        pixel(w / 2, h / 2),
        [0, 255, 0, 255],
        "triangle centre is green"
    );
    assert_eq!(
        pixel(1, h - 2),
        [255, 0, 0, 255],
        "a corner keeps the clear colour"
    );
    assert_eq!(gl_get_error(), 0);
    // The whole frame at once: 3 MiB of answers, more than the first reply region holds.
    let mut frame = vec![0u8; (w * h * 4) as usize];
    read_pixels(0, 0, w, h, 0x1908, 0x1401, frame.as_mut_ptr().cast());
    let at = |x: i32, y: i32| {
        let o = ((y * w + x) * 4) as usize;
        [frame[o], frame[o + 1], frame[o + 2], frame[o + 3]]
    };
    assert_eq!(at(w / 2, h / 2), [0, 255, 0, 255]);
    assert_eq!(at(w - 2, h - 2), [255, 0, 0, 255]);
    let green = frame.chunks(4).filter(|p| p == &[0, 255, 0, 255]).count();
    assert!(
        green > (w * h / 4) as usize,
        "the triangle covers a good part: {green}"
    );
    // A texture larger than the first stream region (4 MiB in one packet).
    let gen_textures: extern "C" fn(i32, *mut u32) = sym(gles, c"glGenTextures");
    let bind_texture: extern "C" fn(u32, u32) = sym(gles, c"glBindTexture");
    let tex_image: extern "C" fn(u32, i32, i32, i32, i32, i32, u32, u32, *const c_void) =
        sym(gles, c"glTexImage2D");
    let mut tex = 0;
    gen_textures(1, &mut tex);
    bind_texture(0x0DE1, tex);
    let texels = vec![0x7Fu8; 1024 * 1024 * 4];
    tex_image(
        0x0DE1,
        0,
        0x1908,
        1024,
        1024,
        0,
        0x1908,
        0x1401,
        texels.as_ptr().cast(),
    );
    assert_eq!(gl_get_error(), 0);
    // A fence sync through glvnd's dispatch of an extension function.
    let get_proc: extern "C" fn(*const c_char) -> *mut c_void = sym(egl, c"eglGetProcAddress");
    let p = get_proc(c"eglCreateSyncKHR".as_ptr());
    assert!(!p.is_null(), "eglCreateSyncKHR");
    // SAFETY: eglCreateSyncKHR's C type.
    let create_sync: extern "C" fn(H, u32, *const i32) -> H = unsafe { std::mem::transmute(p) };
    // SAFETY: eglClientWaitSyncKHR's C type.
    let client_wait: extern "C" fn(H, H, i32, u64) -> i32 =
        unsafe { std::mem::transmute(get_proc(c"eglClientWaitSyncKHR".as_ptr())) };
    // SAFETY: eglDestroySyncKHR's C type.
    let destroy_sync: extern "C" fn(H, H) -> u32 =
        unsafe { std::mem::transmute(get_proc(c"eglDestroySyncKHR".as_ptr())) };
    let sync = create_sync(dpy, 0x30F9, [0x3038].as_ptr());
    assert!(!sync.is_null(), "fence sync: {:#x}", get_error());
    assert_eq!(
        client_wait(dpy, sync, 1, u64::MAX),
        0x30F6,
        "condition satisfied"
    );
    assert_eq!(destroy_sync(dpy, sync), 1);
    let query_surface: extern "C" fn(H, H, i32, *mut i32) -> u32 = sym(egl, c"eglQuerySurface");
    let mut qw = 0;
    assert_eq!(query_surface(dpy, surf, 0x3057, &mut qw), 1);
    assert_eq!(qw, w);
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
