//! Shader precision through virtsoc (docs/gles.md, "Shader precision"): a fragment shader
//! in `mediump` whose result fp16 visibly changes (`fract` of values up to 1000), drawn
//! natively in `mediump` and in `highp`, and through virtsoc: with the default setting
//! (`auto`) on a host whose driver emulates `mediump` (Mesa's llvmpipe) the picture equals
//! the native `highp` one; with `VIRTSOC_GLES_PRECISION=guest` it equals the native
//! `mediump` one. Each daemon's `gles` backend line names the setting until a worker started,
//! then the precision in force; the program reads its own shader text back
//! (`GL_SHADER_SOURCE_LENGTH`, `glGetShaderSource`) wherever it ran.
//!
//! Every draw runs in a child process of this test (glvnd picks its vendor once per
//! process). Needs the binaries (`cargo build -p virtsocd -p virtsoc-render
//! -p virtsoc-gles`) and glvnd; skipped loudly without them unless `VIRTSOC_REQUIRE_ALL` is
//! set.

mod common;

use std::ffi::{c_char, c_void, CStr, CString};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{dlopen, skip, sym, H};
use virtsoc_control::client::{request, Target};

/// The child's output file, and which shaders it draws (`mediump`, `highp` or both).
const CHILD_OUT: &str = "VIRTSOC_PRECISION_CHILD_OUT";
const CHILD_DRAWS: &str = "VIRTSOC_PRECISION_CHILD_DRAWS";
const W: i32 = 64;

const VS: &CStr = c"attribute vec2 pos; varying vec2 uv;
void main() { uv = pos * 0.5 + 0.5; gl_Position = vec4(pos, 0.0, 1.0); }";

/// fp16 keeps 11 significant bits: `x` up to 1000 has steps of 0.5 there, and its `fract`
/// shows them.
const FS: &str = "precision mediump float; varying vec2 uv; uniform float k;
void main() { float x = uv.x * k + uv.y * 3.7;
  gl_FragColor = vec4(fract(x), fract(x * 0.37), uv.y, 1.0); }";

/// Draws the full-screen quad with fragment shader `fs` on the current context; the frame.
fn draw(g: H, fs: &str) -> Vec<u8> {
    let create_shader: extern "C" fn(u32) -> u32 = sym(g, c"glCreateShader");
    let shader_source: extern "C" fn(u32, i32, *const *const c_char, *const i32) =
        sym(g, c"glShaderSource");
    let compile: extern "C" fn(u32) = sym(g, c"glCompileShader");
    let get_shaderiv: extern "C" fn(u32, u32, *mut i32) = sym(g, c"glGetShaderiv");
    let get_source: extern "C" fn(u32, i32, *mut i32, *mut c_char) = sym(g, c"glGetShaderSource");
    let create_program: extern "C" fn() -> u32 = sym(g, c"glCreateProgram");
    let attach: extern "C" fn(u32, u32) = sym(g, c"glAttachShader");
    let bind_attrib: extern "C" fn(u32, u32, *const c_char) = sym(g, c"glBindAttribLocation");
    let link: extern "C" fn(u32) = sym(g, c"glLinkProgram");
    let get_programiv: extern "C" fn(u32, u32, *mut i32) = sym(g, c"glGetProgramiv");
    let use_program: extern "C" fn(u32) = sym(g, c"glUseProgram");
    let uniform_location: extern "C" fn(u32, *const c_char) -> i32 =
        sym(g, c"glGetUniformLocation");
    let uniform1f: extern "C" fn(i32, f32) = sym(g, c"glUniform1f");
    let attrib_pointer: extern "C" fn(u32, i32, u32, u8, i32, *const c_void) =
        sym(g, c"glVertexAttribPointer");
    let enable_attrib: extern "C" fn(u32) = sym(g, c"glEnableVertexAttribArray");
    let draw_arrays: extern "C" fn(u32, i32, i32) = sym(g, c"glDrawArrays");
    let viewport: extern "C" fn(i32, i32, i32, i32) = sym(g, c"glViewport");
    let read_pixels: extern "C" fn(i32, i32, i32, i32, u32, u32, *mut c_void) =
        sym(g, c"glReadPixels");
    let fs = CString::new(fs).expect("no NUL");
    let p = create_program();
    for (kind, src) in [(0x8B31, VS), (0x8B30, fs.as_c_str())] {
        let s = create_shader(kind);
        let ptr = src.as_ptr();
        shader_source(s, 1, &ptr, std::ptr::null());
        compile(s);
        let mut ok = 0;
        get_shaderiv(s, 0x8B81, &mut ok);
        assert_eq!(ok, 1, "shader compiles: {src:?}");
        // The program reads its own text back, whatever the driver compiled.
        let text = src.to_bytes();
        let mut len = 0;
        get_shaderiv(s, 0x8B88, &mut len); // SHADER_SOURCE_LENGTH
        assert_eq!(len as usize, text.len() + 1, "source length of {src:?}");
        let mut back = vec![0u8; text.len() + 1];
        let mut n = 0;
        get_source(s, back.len() as i32, &mut n, back.as_mut_ptr().cast());
        assert_eq!(&back[..n as usize], text, "source read back");
        get_source(s, 8, &mut n, back.as_mut_ptr().cast());
        assert_eq!((n, &back[..8]), (7, [&text[..7], &[0]].concat().as_slice()));
        attach(p, s);
    }
    bind_attrib(p, 0, c"pos".as_ptr());
    link(p);
    let mut ok = 0;
    get_programiv(p, 0x8B82, &mut ok);
    assert_eq!(ok, 1, "program links");
    use_program(p);
    uniform1f(uniform_location(p, c"k".as_ptr()), 1000.0);
    viewport(0, 0, W, W);
    let quad: [f32; 8] = [-1.0, -1.0, 1.0, -1.0, -1.0, 1.0, 1.0, 1.0];
    attrib_pointer(0, 2, 0x1406, 0, 0, quad.as_ptr().cast());
    enable_attrib(0);
    draw_arrays(0x0005, 0, 4);
    let mut px = vec![0u8; (W * W * 4) as usize];
    read_pixels(0, 0, W, W, 0x1908, 0x1401, px.as_mut_ptr().cast());
    px
}

/// An ES 2 context current on a W x W pbuffer of the surfaceless display.
fn context(egl: H) -> bool {
    let rgba8 = [
        0x3024, 8, 0x3023, 8, 0x3022, 8, 0x3021, 8, 0x3033, 1, 0x3040, 4, 0x3038,
    ];
    common::try_pbuffer(egl, &rgba8, 2, (W, W)).is_some()
}

/// The child: draws what `CHILD_DRAWS` asks and writes the frames, hex, one a line.
#[test]
fn precision_child() {
    let Some(out) = std::env::var_os(CHILD_OUT) else {
        return;
    };
    let (egl, gles) = (dlopen(c"libEGL.so.1"), dlopen(c"libGLESv2.so.2"));
    assert!(!egl.is_null() && !gles.is_null(), "glvnd");
    assert!(context(egl), "an ES 2 context");
    let draws = std::env::var(CHILD_DRAWS).unwrap_or_default();
    let mut text = String::new();
    for d in draws.split(',') {
        let fs = match d {
            "mediump" => FS.to_string(),
            "highp" => FS.replace("mediump", "highp"),
            _ => panic!("draw {d:?}"),
        };
        let hex: String = draw(gles, &fs).iter().map(|b| format!("{b:02x}")).collect();
        text.push_str(&hex);
        text.push('\n');
    }
    std::fs::write(out, text).expect("write frames");
}

/// Runs the child with `env` (glvnd's vendor and the daemon, or none: native); its frames.
fn child(tmp: &Path, name: &str, draws: &str, env: &[(&str, &Path)]) -> Vec<Vec<u8>> {
    let out = tmp.join(format!("{name}.txt"));
    let mut c = Command::new(std::env::current_exe().expect("test executable"));
    c.args(["--exact", "precision_child", "--test-threads", "1"])
        .env(CHILD_OUT, &out)
        .env(CHILD_DRAWS, draws)
        .env_remove("__EGL_VENDOR_LIBRARY_FILENAMES")
        .env_remove("VIRTSOC_SOCKET");
    for (k, v) in env {
        c.env(k, v);
    }
    let st = c.status().expect("run the child");
    assert!(st.success(), "the {name} run failed");
    let text = std::fs::read_to_string(&out).expect("the child's frames");
    text.lines()
        .map(|l| {
            (0..l.len() / 2)
                .map(|i| u8::from_str_radix(&l[2 * i..2 * i + 2], 16).expect("hex"))
                .collect()
        })
        .collect()
}

/// The `gles` device's backend line as it is now.
fn gles_backend_now(ctl: &Path) -> String {
    let r = request(&Target::Unix(ctl.to_path_buf()), "GET", "/devices", b"").expect("control");
    let v: serde_json::Value = serde_json::from_str(&r.body).expect("json");
    v.as_array()
        .into_iter()
        .flatten()
        .find(|d| d["name"] == "gles")
        .and_then(|d| d["backend"].as_str())
        .expect("a gles device")
        .to_string()
}

/// The `gles` device's backend line once a render worker told the daemon the precision in
/// force (the worker of a guest that drew: its line may still be on the way).
fn gles_backend(ctl: &Path) -> String {
    let t0 = Instant::now();
    loop {
        let line = gles_backend_now(ctl);
        if !line.contains("none has yet") {
            return line;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "no render worker said the precision: {line}"
        );
        // The daemon's reading of the worker's line has no event to wait on from here.
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn mediump_computes_at_highp_where_the_host_emulates_it() {
    let tmp = std::env::temp_dir().join(format!("virtsoc-gles-precision-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).expect("temp dir");
    let Some((_auto, sock, ctl)) = common::start_daemon(&tmp.join("auto"), &[]) else {
        return;
    };
    if dlopen(c"libEGL.so.1").is_null() {
        return skip("glvnd's libEGL.so.1 not installed");
    }
    let json = tmp.join("auto").join("virtsoc.json");
    let native = child(&tmp, "native", "mediump,highp", &[]);
    let (n_medium, n_high) = (&native[0], &native[1]);
    let before = gles_backend_now(&ctl);
    assert!(
        before.contains("shader precision: auto (as a render worker decides"),
        "{before}"
    );
    let ours = child(
        &tmp,
        "auto",
        "mediump",
        &[
            ("__EGL_VENDOR_LIBRARY_FILENAMES", &json),
            ("VIRTSOC_SOCKET", &sock),
        ],
    );
    let line = gles_backend(&ctl);
    // On this project's hosts (Mesa's llvmpipe) mediump is fp16 and the two differ; a host
    // computing mediump at full precision draws them alike, and keeps the guest's text.
    let emulated = n_medium != n_high;
    let expect = if emulated {
        "shader precision: highp (auto, host renderer"
    } else {
        "shader precision: guest (auto, host renderer"
    };
    assert!(line.contains(expect), "{expect} in {line}");
    assert!(ours[0] == *n_high, "auto: the native highp picture");
    if !emulated {
        eprintln!("this host computes mediump at full precision: nothing more to compare");
        let _ = std::fs::remove_dir_all(&tmp);
        return;
    }
    assert!(ours[0] != *n_medium, "auto: not the native mediump picture");

    // VIRTSOC_GLES_PRECISION=guest: the guest's precisions, the native mediump picture.
    let guest_dir = tmp.join("guest");
    let Some((_guest, sock, ctl)) =
        common::start_daemon_env(&guest_dir, &[], &[("VIRTSOC_GLES_PRECISION", "guest")])
    else {
        return;
    };
    let json = guest_dir.join("virtsoc.json");
    let theirs = child(
        &tmp,
        "guest",
        "mediump,highp",
        &[
            ("__EGL_VENDOR_LIBRARY_FILENAMES", &json),
            ("VIRTSOC_SOCKET", &sock),
        ],
    );
    let line = gles_backend(&ctl);
    assert!(line.contains("shader precision: guest (guest"), "{line}");
    assert!(theirs[0] == *n_medium, "guest: the native mediump picture");
    assert!(theirs[1] == *n_high, "guest: a highp shader as natively");
    let _ = std::fs::remove_dir_all(&tmp);
}
