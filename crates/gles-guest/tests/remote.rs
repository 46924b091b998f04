//! OpenGL ES from a remote guest: the same vendor library with `VIRTSOC_SOCKET` set to the
//! daemon's TCP listener (`tcp:HOST:PORT`, authenticated with `VIRTSOC_TOKEN`), its stream
//! and reply regions carried by the TCP connection. The program (this test) makes an ES 3
//! context, clears, draws a triangle with an instanced client-array draw, uploads a texture
//! and reads pixels back (into client memory and through a pixel pack buffer), and checks
//! them.
//!
//! Needs the binaries (`cargo build -p virtsocd -p virtsoc-render -p
//! virtsoc-gles`) and glvnd; skipped loudly without them unless `VIRTSOC_REQUIRE_ALL` is set.

mod common;

use std::ffi::{c_char, c_void, CStr};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use common::{bin_dir, dlopen, skip, sym, Daemon, H};

const TOKEN: &str = "gles-remote-test-token-0123456789";

/// Starts `virtsocd` listening on a TCP port too; its address (`HOST:PORT`).
fn daemon_with_tcp(tmp: &std::path::Path) -> Option<(Daemon, String)> {
    let dir = bin_dir();
    let (daemon, vendor) = (dir.join("virtsocd"), dir.join("libEGL_virtsoc.so"));
    for p in [&daemon, &dir.join("virtsoc-render"), &vendor] {
        if !p.is_file() {
            skip(&format!("{} not built", p.display()));
            return None;
        }
    }
    std::fs::create_dir_all(tmp).expect("temp dir");
    let (token, json) = (tmp.join("token"), tmp.join("virtsoc.json"));
    std::fs::write(&token, format!("{TOKEN}\n")).expect("token file");
    std::fs::write(
        &json,
        format!(
            r#"{{"file_format_version":"1.0.0","ICD":{{"library_path":"{}"}}}}"#,
            vendor.display()
        ),
    )
    .expect("vendor json");
    let mut child = Command::new(&daemon)
        .arg("--socket")
        .arg(tmp.join("v.sock"))
        .args(["--listen", "127.0.0.1:0", "--print-ready", "--token-file"])
        .arg(&token)
        .env("RUST_LOG", "error")
        .stdout(Stdio::piped())
        .spawn()
        .expect("start virtsocd");
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    out.read_line(&mut line).expect("first line");
    let addr = line.strip_prefix("LISTEN ").map(|a| a.trim().to_owned());
    line.clear();
    out.read_line(&mut line).expect("ready line");
    let d = Daemon(child);
    assert!(line.starts_with("READY"), "daemon did not start: {line:?}");
    let addr = addr.expect("the daemon prints its TCP address");
    std::env::set_var("__EGL_VENDOR_LIBRARY_FILENAMES", &json);
    std::env::set_var("VIRTSOC_SOCKET", format!("tcp:{addr}"));
    std::env::set_var("VIRTSOC_TOKEN", TOKEN);
    Some((d, addr))
}

macro_rules! gl {
    ($lib:expr, $name:ident) => {
        sym(
            $lib,
            CStr::from_bytes_with_nul(concat!(stringify!($name), "\0").as_bytes()).expect("name"),
        )
    };
}

#[test]
fn a_remote_tcp_guest_draws_through_the_daemon() {
    let tmp = std::env::temp_dir().join(format!("virtsoc-gles-remote-{}", std::process::id()));
    let Some((_d, _)) = daemon_with_tcp(&tmp) else {
        return;
    };
    let (egl, g) = (dlopen(c"libEGL.so.1"), dlopen(c"libGLESv2.so.2"));
    if egl.is_null() || g.is_null() {
        return skip("glvnd's libEGL.so.1 / libGLESv2.so.2 not installed");
    }
    let get_display: extern "C" fn(u32, H, *const isize) -> H = sym(egl, c"eglGetPlatformDisplay");
    let initialize: extern "C" fn(H, *mut i32, *mut i32) -> u32 = sym(egl, c"eglInitialize");
    let choose: extern "C" fn(H, *const i32, *mut H, i32, *mut i32) -> u32 =
        sym(egl, c"eglChooseConfig");
    let create_context: extern "C" fn(H, H, H, *const i32) -> H = sym(egl, c"eglCreateContext");
    let create_pbuffer: extern "C" fn(H, H, *const i32) -> H = sym(egl, c"eglCreatePbufferSurface");
    let make_current: extern "C" fn(H, H, H, H) -> u32 = sym(egl, c"eglMakeCurrent");
    let get_error: extern "C" fn() -> i32 = sym(egl, c"eglGetError");
    let dpy = get_display(0x31DD, std::ptr::null_mut(), std::ptr::null());
    assert!(!dpy.is_null());
    assert_eq!(
        initialize(dpy, std::ptr::null_mut(), std::ptr::null_mut()),
        1
    );
    let attrs = [
        0x3024, 8, 0x3023, 8, 0x3022, 8, 0x3033, 1, 0x3040, 0x40, 0x3038,
    ];
    let (mut config, mut n): (H, i32) = (std::ptr::null_mut(), 0);
    assert_eq!(choose(dpy, attrs.as_ptr(), &mut config, 1, &mut n), 1);
    let ctx = create_context(
        dpy,
        config,
        std::ptr::null_mut(),
        [0x3098, 3, 0x3038].as_ptr(),
    );
    assert!(
        !ctx.is_null(),
        "eglCreateContext over TCP: {:#x}",
        get_error()
    );
    let (w, h) = (256i32, 256i32);
    let surf = create_pbuffer(dpy, config, [0x3057, w, 0x3056, h, 0x3038].as_ptr());
    assert!(!surf.is_null(), "pbuffer: {:#x}", get_error());
    assert_eq!(make_current(dpy, surf, surf, ctx), 1);

    let get_string: extern "C" fn(u32) -> *const c_char = gl!(g, glGetString);
    let clear_color: extern "C" fn(f32, f32, f32, f32) = gl!(g, glClearColor);
    let clear: extern "C" fn(u32) = gl!(g, glClear);
    let read_pixels: extern "C" fn(i32, i32, i32, i32, u32, u32, *mut c_void) =
        gl!(g, glReadPixels);
    let gl_get_error: extern "C" fn() -> u32 = gl!(g, glGetError);
    let create_shader: extern "C" fn(u32) -> u32 = gl!(g, glCreateShader);
    let shader_source: extern "C" fn(u32, i32, *const *const c_char, *const i32) =
        gl!(g, glShaderSource);
    let compile: extern "C" fn(u32) = gl!(g, glCompileShader);
    let create_program: extern "C" fn() -> u32 = gl!(g, glCreateProgram);
    let attach: extern "C" fn(u32, u32) = gl!(g, glAttachShader);
    let link: extern "C" fn(u32) = gl!(g, glLinkProgram);
    let get_programiv: extern "C" fn(u32, u32, *mut i32) = gl!(g, glGetProgramiv);
    let use_program: extern "C" fn(u32) = gl!(g, glUseProgram);
    let attrib: extern "C" fn(u32, i32, u32, u8, i32, *const c_void) =
        gl!(g, glVertexAttribPointer);
    let enable: extern "C" fn(u32) = gl!(g, glEnableVertexAttribArray);
    let divisor: extern "C" fn(u32, u32) = gl!(g, glVertexAttribDivisor);
    let draw_inst: extern "C" fn(u32, i32, i32, i32) = gl!(g, glDrawArraysInstanced);
    let viewport: extern "C" fn(i32, i32, i32, i32) = gl!(g, glViewport);
    let gen_buffers: extern "C" fn(i32, *mut u32) = gl!(g, glGenBuffers);
    let bind_buffer: extern "C" fn(u32, u32) = gl!(g, glBindBuffer);
    let buffer_data: extern "C" fn(u32, isize, *const c_void, u32) = gl!(g, glBufferData);
    let map: extern "C" fn(u32, isize, isize, u32) -> *mut c_void = gl!(g, glMapBufferRange);
    let unmap: extern "C" fn(u32) -> u8 = gl!(g, glUnmapBuffer);

    // SAFETY: GL_VENDOR is a static NUL-terminated string.
    let vendor = unsafe { CStr::from_ptr(get_string(0x1F00)) };
    assert_eq!(vendor.to_str().ok(), Some("virtsoc"));
    clear_color(0.0, 0.0, 1.0, 1.0);
    clear(0x4000);
    let mut px = [0u8; 4];
    read_pixels(5, 5, 1, 1, 0x1908, 0x1401, px.as_mut_ptr().cast());
    assert_eq!(px, [0, 0, 255, 255], "cleared blue");

    let vs = c"#version 300 es
layout(location = 0) in vec2 pos;
layout(location = 1) in vec2 offset;
void main() { gl_Position = vec4(pos * 0.4 + offset, 0.0, 1.0); }";
    let fs = c"#version 300 es
precision mediump float;
out vec4 c;
void main() { c = vec4(0.0, 1.0, 0.0, 1.0); }";
    let prog = create_program();
    for (kind, src) in [(0x8B31, vs), (0x8B30, fs)] {
        let s = create_shader(kind);
        let p = src.as_ptr();
        shader_source(s, 1, &p, std::ptr::null());
        compile(s);
        attach(prog, s);
    }
    link(prog);
    let mut ok = 0;
    get_programiv(prog, 0x8B82, &mut ok);
    assert_eq!(ok, 1, "program links");
    use_program(prog);
    viewport(0, 0, w, h);
    let tri = [-1.0f32, -1.0, 1.0, -1.0, 0.0, 1.0];
    let offsets = [-0.5f32, -0.5, 0.5, 0.5];
    attrib(0, 2, 0x1406, 0, 0, tri.as_ptr().cast());
    attrib(1, 2, 0x1406, 0, 0, offsets.as_ptr().cast());
    enable(0);
    enable(1);
    divisor(1, 1);
    draw_inst(0x0004, 0, 3, 2);
    // Full frame through a pixel pack buffer, mapped for reading (a round trip over TCP).
    let mut pbo = 0;
    gen_buffers(1, &mut pbo);
    bind_buffer(0x88EB, pbo);
    let n = (w * h * 4) as usize;
    buffer_data(0x88EB, n as isize, std::ptr::null(), 0x88E1);
    read_pixels(0, 0, w, h, 0x1908, 0x1401, std::ptr::null_mut());
    let p = map(0x88EB, 0, n as isize, 0x1);
    assert!(!p.is_null(), "map for reading: {:#x}", gl_get_error());
    // SAFETY: `n` readable bytes mapped at `p` until the unmap.
    let frame = unsafe { std::slice::from_raw_parts(p.cast::<u8>(), n) }.to_vec();
    assert_eq!(unmap(0x88EB), 1);
    bind_buffer(0x88EB, 0);
    let at = |x: i32, y: i32| {
        let o = ((y * w + x) * 4) as usize;
        [frame[o], frame[o + 1], frame[o + 2], frame[o + 3]]
    };
    // The instances' centres: (-0.5, -0.5) and (0.5, 0.5) in clip space.
    assert_eq!(at(w / 4, h / 4), [0, 255, 0, 255], "first instance");
    assert_eq!(
        at(3 * w / 4, 3 * h / 4),
        [0, 255, 0, 255],
        "second instance"
    );
    assert_eq!(
        at(3 * w / 4, h / 4),
        [0, 0, 255, 255],
        "between them: clear colour"
    );
    let green = frame.chunks(4).filter(|p| p == &[0, 255, 0, 255]).count();
    let mut direct = vec![0u8; n];
    read_pixels(0, 0, w, h, 0x1908, 0x1401, direct.as_mut_ptr().cast());
    assert!(
        direct == frame,
        "client-memory and pack-buffer readbacks agree"
    );
    assert!(green > 1000, "two triangles drawn: {green} green pixels");
    assert_eq!(gl_get_error(), 0);
    let _ = std::fs::remove_dir_all(&tmp);
}
