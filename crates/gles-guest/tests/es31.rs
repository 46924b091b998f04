//! OpenGL ES 3.1 end to end: one program (this test) runs compute shaders writing a shader
//! storage buffer (dispatched directly and indirectly, a uniform set with
//! `glProgramUniform1ui`) and an image (`glBindImageTexture`, read back through a
//! framebuffer), asks the program interface (`glGetProgramResource*`), and draws with
//! separable programs in a program pipeline from a vertex buffer binding
//! (`glBindVertexBuffer`, `glVertexAttribFormat`) with `glDrawArraysIndirect` and
//! `glDrawElementsIndirect`; natively (Mesa through glvnd, in a child process) and through
//! virtsoc (a real daemon and render worker): every value and picture must be equal. Then,
//! through virtsoc only, indirect draws and dispatches without their buffers or past their
//! end are GL errors, and the context goes on.
//!
//! Needs the binaries (`cargo build -p virtsocd -p virtsoc-render -p
//! virtsoc-gles`), glvnd and an ES 3.1 driver; skipped loudly without them unless
//! `VIRTSOC_REQUIRE_ALL` is set.

mod common;

use std::ffi::{c_char, c_void, CStr};

use common::{dlopen, skip, sym, Results, H};

const W: i32 = 32;

macro_rules! gl {
    ($lib:expr, $name:ident) => {
        sym(
            $lib,
            CStr::from_bytes_with_nul(concat!(stringify!($name), "\0").as_bytes()).expect("name"),
        )
    };
}

fn le32(v: &[u32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// An ES 3 context current on a pbuffer (EGL_OPENGL_ES3_BIT_KHR config).
fn context(egl: H) -> Option<(H, H)> {
    let rgba8 = [
        0x3024, 8, 0x3023, 8, 0x3022, 8, 0x3021, 8, 0x3033, 1, 0x3040, 0x40, 0x3038,
    ];
    common::try_pbuffer(egl, &rgba8, 3, (W, W)).map(|pb| (pb.dpy, pb.ctx))
}

/// Whether the current context is GLES 3.1 or newer.
fn is_es31(g: H) -> bool {
    let get_string: extern "C" fn(u32) -> *const c_char = gl!(g, glGetString);
    let v = get_string(0x1F02);
    !v.is_null() && {
        // SAFETY: GL_VERSION is a NUL-terminated string GL keeps.
        let s = unsafe { CStr::from_ptr(v) }.to_string_lossy().into_owned();
        s.starts_with("OpenGL ES 3.") && !s.starts_with("OpenGL ES 3.0")
    }
}

/// A program of one compute shader (through `glCreateShader` and `glLinkProgram`).
fn compute_program(g: H, src: &CStr) -> u32 {
    let create_shader: extern "C" fn(u32) -> u32 = gl!(g, glCreateShader);
    let shader_source: extern "C" fn(u32, i32, *const *const c_char, *const i32) =
        gl!(g, glShaderSource);
    let compile: extern "C" fn(u32) = gl!(g, glCompileShader);
    let create_program: extern "C" fn() -> u32 = gl!(g, glCreateProgram);
    let attach: extern "C" fn(u32, u32) = gl!(g, glAttachShader);
    let link: extern "C" fn(u32) = gl!(g, glLinkProgram);
    let get_programiv: extern "C" fn(u32, u32, *mut i32) = gl!(g, glGetProgramiv);
    let s = create_shader(0x91B9); // COMPUTE_SHADER
    let ptr = src.as_ptr();
    shader_source(s, 1, &ptr, std::ptr::null());
    compile(s);
    let p = create_program();
    attach(p, s);
    link(p);
    let mut ok = 0;
    get_programiv(p, 0x8B82, &mut ok);
    assert_eq!(ok, 1, "compute program links");
    p
}

/// Maps `len` bytes of the buffer bound to `target` for reading and copies them.
fn read_buffer(g: H, target: u32, len: usize) -> Vec<u8> {
    let map: extern "C" fn(u32, isize, isize, u32) -> *mut c_void = gl!(g, glMapBufferRange);
    let unmap: extern "C" fn(u32) -> u8 = gl!(g, glUnmapBuffer);
    let p = map(target, 0, len as isize, 0x1);
    assert!(!p.is_null(), "map for reading");
    // SAFETY: GL mapped `len` readable bytes at `p` until the unmap.
    let v = unsafe { std::slice::from_raw_parts(p.cast::<u8>(), len) }.to_vec();
    assert_eq!(unmap(target), 1);
    v
}

/// A buffer bound to `target` holding `data`.
fn buffer(g: H, target: u32, data: &[u8]) -> u32 {
    let gen: extern "C" fn(i32, *mut u32) = gl!(g, glGenBuffers);
    let bind: extern "C" fn(u32, u32) = gl!(g, glBindBuffer);
    let data_fn: extern "C" fn(u32, isize, *const c_void, u32) = gl!(g, glBufferData);
    let mut b = 0;
    gen(1, &mut b);
    bind(target, b);
    data_fn(target, data.len() as isize, data.as_ptr().cast(), 0x88E8); // DYNAMIC_COPY
    b
}

const CS_SQUARES: &CStr = c"#version 310 es
layout(local_size_x = 64) in;
layout(std430, binding = 0) buffer B { uint v[]; };
uniform uint k;
void main() { uint i = gl_GlobalInvocationID.x; v[i] = i * i + k; }";
const CS_INC: &CStr = c"#version 310 es
layout(local_size_x = 64) in;
layout(std430, binding = 0) buffer B { uint v[]; };
void main() { v[gl_GlobalInvocationID.x] += 1u; }";
const CS_IMAGE: &CStr = c"#version 310 es
layout(local_size_x = 8, local_size_y = 8) in;
layout(rgba8, binding = 1) writeonly uniform highp image2D img;
void main() {
  ivec2 p = ivec2(gl_GlobalInvocationID.xy);
  imageStore(img, p, vec4(float(p.x) / 31.0, float(p.y) / 31.0, 0.5, 1.0));
}";
const VS_SEP: &CStr = c"#version 310 es
layout(location = 0) in vec2 pos;
void main() { gl_Position = vec4(pos, 0.0, 1.0); }";
const FS_SEP: &CStr = c"#version 310 es
precision highp float;
uniform vec4 color;
layout(location = 0) out vec4 o;
void main() { o = color; }";

/// Compute into a storage buffer, directly and indirectly; the program interface.
fn compute(g: H, out: &mut Results) {
    let use_program: extern "C" fn(u32) = gl!(g, glUseProgram);
    let dispatch: extern "C" fn(u32, u32, u32) = gl!(g, glDispatchCompute);
    let dispatch_indirect: extern "C" fn(isize) = gl!(g, glDispatchComputeIndirect);
    let barrier: extern "C" fn(u32) = gl!(g, glMemoryBarrier);
    let bind_base: extern "C" fn(u32, u32, u32) = gl!(g, glBindBufferBase);
    let uniform_ui: extern "C" fn(u32, i32, u32) = gl!(g, glProgramUniform1ui);
    let location: extern "C" fn(u32, u32, *const c_char) -> i32 =
        gl!(g, glGetProgramResourceLocation);
    let index: extern "C" fn(u32, u32, *const c_char) -> u32 = gl!(g, glGetProgramResourceIndex);
    let interface: extern "C" fn(u32, u32, u32, *mut i32) = gl!(g, glGetProgramInterfaceiv);
    let res_name: extern "C" fn(u32, u32, u32, i32, *mut i32, *mut c_char) =
        gl!(g, glGetProgramResourceName);
    let res_iv: extern "C" fn(u32, u32, u32, i32, *const u32, i32, *mut i32, *mut i32) =
        gl!(g, glGetProgramResourceiv);

    let p = compute_program(g, CS_SQUARES);
    let ssbo = buffer(g, 0x90D2, &[0u8; 256 * 4]);
    bind_base(0x90D2, 0, ssbo);
    let k = location(p, 0x92E1, c"k".as_ptr()); // UNIFORM
    uniform_ui(p, k, 7);
    use_program(p);
    dispatch(4, 1, 1);
    barrier(0x2000 | 0x200); // SHADER_STORAGE | BUFFER_UPDATE
    out.push(("squares".into(), read_buffer(g, 0x90D2, 256 * 4)));

    let inc = compute_program(g, CS_INC);
    use_program(inc);
    buffer(g, 0x90EE, &le32(&[2, 1, 1])); // DISPATCH_INDIRECT_BUFFER
    dispatch_indirect(0);
    barrier(0x2000 | 0x200);
    out.push(("incremented".into(), read_buffer(g, 0x90D2, 256 * 4)));

    let block = index(p, 0x92E6, c"B".as_ptr()); // SHADER_STORAGE_BLOCK
    let mut active = 0;
    interface(p, 0x92E6, 0x92F5, &mut active); // ACTIVE_RESOURCES
    let mut name = [0 as c_char; 16];
    let mut len = 0;
    res_name(p, 0x92E6, block, 16, &mut len, name.as_mut_ptr());
    let props = [0x9302u32]; // BUFFER_BINDING
    let (mut n, mut binding) = (0, -1);
    res_iv(p, 0x92E6, block, 1, props.as_ptr(), 1, &mut n, &mut binding);
    let name: Vec<u8> = name[..len.max(0) as usize]
        .iter()
        .map(|c| *c as u8)
        .collect();
    out.push((
        "interface".into(),
        le32(&[
            block,
            active as u32,
            n as u32,
            binding as u32,
            (k >= 0) as u32,
        ]),
    ));
    out.push(("block name".into(), name));
}

/// A compute shader writes an image; read back through a framebuffer.
fn image(g: H, out: &mut Results) {
    let gen_tex: extern "C" fn(i32, *mut u32) = gl!(g, glGenTextures);
    let bind_tex: extern "C" fn(u32, u32) = gl!(g, glBindTexture);
    let storage: extern "C" fn(u32, i32, u32, i32, i32) = gl!(g, glTexStorage2D);
    let bind_image: extern "C" fn(u32, u32, i32, u8, i32, u32, u32) = gl!(g, glBindImageTexture);
    let use_program: extern "C" fn(u32) = gl!(g, glUseProgram);
    let dispatch: extern "C" fn(u32, u32, u32) = gl!(g, glDispatchCompute);
    let barrier: extern "C" fn(u32) = gl!(g, glMemoryBarrier);
    let gen_fb: extern "C" fn(i32, *mut u32) = gl!(g, glGenFramebuffers);
    let bind_fb: extern "C" fn(u32, u32) = gl!(g, glBindFramebuffer);
    let fb_tex: extern "C" fn(u32, u32, u32, u32, i32) = gl!(g, glFramebufferTexture2D);
    let read_pixels: extern "C" fn(i32, i32, i32, i32, u32, u32, *mut c_void) =
        gl!(g, glReadPixels);
    let mut t = 0;
    gen_tex(1, &mut t);
    bind_tex(0x0DE1, t);
    storage(0x0DE1, 1, 0x8058, W, W); // RGBA8
    let p = compute_program(g, CS_IMAGE);
    bind_image(1, t, 0, 0, 0, 0x88B9, 0x8058); // WRITE_ONLY, RGBA8
    use_program(p);
    dispatch(W as u32 / 8, W as u32 / 8, 1);
    barrier(0x400 | 0x100); // FRAMEBUFFER | TEXTURE_UPDATE
    let mut fb = 0;
    gen_fb(1, &mut fb);
    bind_fb(0x8D40, fb);
    fb_tex(0x8D40, 0x8CE0, 0x0DE1, t, 0);
    let mut px = vec![0u8; (W * W * 4) as usize];
    read_pixels(0, 0, W, W, 0x1908, 0x1401, px.as_mut_ptr().cast());
    bind_fb(0x8D40, 0);
    out.push(("image".into(), px));
}

/// Separable programs in a pipeline draw from a vertex buffer binding, indirectly.
fn pipeline_indirect(g: H, out: &mut Results) -> (u32, u32) {
    let create: extern "C" fn(u32, i32, *const *const c_char) -> u32 =
        gl!(g, glCreateShaderProgramv);
    let gen_pipelines: extern "C" fn(i32, *mut u32) = gl!(g, glGenProgramPipelines);
    let stages: extern "C" fn(u32, u32, u32) = gl!(g, glUseProgramStages);
    let bind_pipeline: extern "C" fn(u32) = gl!(g, glBindProgramPipeline);
    let pipeline_iv: extern "C" fn(u32, u32, *mut i32) = gl!(g, glGetProgramPipelineiv);
    let validate: extern "C" fn(u32) = gl!(g, glValidateProgramPipeline);
    let use_program: extern "C" fn(u32) = gl!(g, glUseProgram);
    let uniform4f: extern "C" fn(u32, i32, f32, f32, f32, f32) = gl!(g, glProgramUniform4f);
    let location: extern "C" fn(u32, *const c_char) -> i32 = gl!(g, glGetUniformLocation);
    let gen_vao: extern "C" fn(i32, *mut u32) = gl!(g, glGenVertexArrays);
    let bind_vao: extern "C" fn(u32) = gl!(g, glBindVertexArray);
    let bind_vb: extern "C" fn(u32, u32, isize, i32) = gl!(g, glBindVertexBuffer);
    let format: extern "C" fn(u32, i32, u32, u8, u32) = gl!(g, glVertexAttribFormat);
    let attrib_binding: extern "C" fn(u32, u32) = gl!(g, glVertexAttribBinding);
    let enable: extern "C" fn(u32) = gl!(g, glEnableVertexAttribArray);
    let draw_arrays: extern "C" fn(u32, *const c_void) = gl!(g, glDrawArraysIndirect);
    let draw_elements: extern "C" fn(u32, u32, *const c_void) = gl!(g, glDrawElementsIndirect);
    let clear_color: extern "C" fn(f32, f32, f32, f32) = gl!(g, glClearColor);
    let clear: extern "C" fn(u32) = gl!(g, glClear);
    let read_pixels: extern "C" fn(i32, i32, i32, i32, u32, u32, *mut c_void) =
        gl!(g, glReadPixels);

    let vs = create(0x8B31, 1, &VS_SEP.as_ptr());
    let fs = create(0x8B30, 1, &FS_SEP.as_ptr());
    let mut pl = 0;
    gen_pipelines(1, &mut pl);
    stages(pl, 0x1, vs); // VERTEX_SHADER_BIT
    stages(pl, 0x2, fs); // FRAGMENT_SHADER_BIT
    use_program(0);
    bind_pipeline(pl);
    validate(pl);
    let (mut vsq, mut fsq, mut valid) = (0, 0, 0);
    pipeline_iv(pl, 0x8B31, &mut vsq);
    pipeline_iv(pl, 0x8B30, &mut fsq);
    pipeline_iv(pl, 0x8B83, &mut valid); // VALIDATE_STATUS
    out.push((
        "pipeline".into(),
        le32(&[
            (vsq as u32 == vs) as u32,
            (fsq as u32 == fs) as u32,
            valid as u32,
        ]),
    ));
    uniform4f(fs, location(fs, c"color".as_ptr()), 0.0, 1.0, 0.0, 1.0);

    let mut vao = 0;
    gen_vao(1, &mut vao);
    bind_vao(vao);
    let tri: Vec<u8> = [-1.0f32, -1.0, 1.0, -1.0, -1.0, 1.0, 1.0, 1.0]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    let vb = buffer(g, 0x8892, &tri);
    bind_vb(0, vb, 0, 8);
    format(0, 2, 0x1406, 0, 0);
    attrib_binding(0, 0);
    enable(0);
    // DrawArraysIndirectCommand {count, instanceCount, first, reserved}, then
    // DrawElementsIndirectCommand {count, instanceCount, firstIndex, baseVertex, reserved}.
    let cmds = buffer(g, 0x8F3F, &le32(&[3, 1, 0, 0, 3, 1, 0, 0, 0]));
    clear_color(0.0, 0.0, 0.0, 1.0);
    clear(0x4000);
    draw_arrays(0x0004, std::ptr::null());
    let mut px = vec![0u8; (W * W * 4) as usize];
    read_pixels(0, 0, W, W, 0x1908, 0x1401, px.as_mut_ptr().cast());
    out.push(("draw arrays indirect".into(), px.clone()));
    buffer(g, 0x8893, &[1u8, 0, 3, 0, 2, 0]); // the other triangle, u16 indices
    uniform4f(fs, location(fs, c"color".as_ptr()), 0.0, 0.0, 1.0, 1.0);
    draw_elements(0x0004, 0x1403, 16 as *const c_void);
    read_pixels(0, 0, W, W, 0x1908, 0x1401, px.as_mut_ptr().cast());
    out.push(("draw elements indirect".into(), px));
    (vao, cmds)
}

fn scene(g: H) -> Results {
    let mut out = Results::new();
    compute(g, &mut out);
    image(g, &mut out);
    pipeline_indirect(g, &mut out);
    out
}

/// The native run: only in the child process the main test starts.
#[test]
fn es31_native_child() {
    common::write_native(|| {
        let (egl, gles) = (dlopen(c"libEGL.so.1"), dlopen(c"libGLESv2.so.2"));
        assert!(!egl.is_null() && !gles.is_null(), "glvnd");
        (context(egl).is_some() && is_es31(gles)).then(|| scene(gles))
    });
}

/// Indirect calls without their buffers, or past their end: GL errors, nothing read from
/// the render worker's memory; the context goes on.
fn hostile(g: H) {
    let get_error: extern "C" fn() -> u32 = gl!(g, glGetError);
    let bind: extern "C" fn(u32, u32) = gl!(g, glBindBuffer);
    let bind_vao: extern "C" fn(u32) = gl!(g, glBindVertexArray);
    let draw_arrays: extern "C" fn(u32, *const c_void) = gl!(g, glDrawArraysIndirect);
    let dispatch_indirect: extern "C" fn(isize) = gl!(g, glDispatchComputeIndirect);
    while get_error() != 0 {}
    draw_arrays(0x0004, 4096 as *const c_void);
    assert_eq!(
        get_error(),
        0x0502,
        "an offset past the indirect buffer's end"
    );
    bind(0x8F3F, 0);
    draw_arrays(0x0004, std::ptr::null());
    assert_eq!(get_error(), 0x0502, "no indirect buffer bound");
    bind(0x90EE, 0);
    dispatch_indirect(0);
    assert_eq!(get_error(), 0x0502, "no dispatch-indirect buffer bound");
    bind_vao(0);
    draw_arrays(0x0004, 0x1234_5678 as *const c_void);
    assert_eq!(get_error(), 0x0502, "no vertex array object bound");
    assert_eq!(get_error(), 0);
}

#[test]
fn es31_computes_and_draws_as_native() {
    let tmp = std::env::temp_dir().join(format!("virtsoc-gles-es31-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).expect("temp dir");
    let Some(native) = common::native_results(&tmp, "es31_native_child") else {
        return skip("no OpenGL ES 3.1 context natively");
    };

    let Some((_d, _sock, _)) = common::start_daemon(&tmp, &[]) else {
        return;
    };
    let (egl, gles) = (dlopen(c"libEGL.so.1"), dlopen(c"libGLESv2.so.2"));
    if egl.is_null() || gles.is_null() {
        return skip("glvnd's libEGL.so.1 / libGLESv2.so.2 not installed");
    }
    context(egl).expect("an ES 3 context through virtsoc");
    let get_string: extern "C" fn(u32) -> *const c_char = gl!(gles, glGetString);
    // SAFETY: GL_VERSION is a NUL-terminated string GL keeps.
    let version = unsafe { CStr::from_ptr(get_string(0x1F02)) }.to_owned();
    assert_eq!(version.to_str().ok(), Some("OpenGL ES 3.1 virtsoc"));
    let ours = scene(gles);
    common::assert_same(&ours, &native);
    let squares = &ours[0].1;
    assert_eq!(
        &squares[4 * 5..4 * 6],
        &(5u32 * 5 + 7).to_le_bytes(),
        "computed"
    );
    let inc = &ours[1].1;
    assert_eq!(
        &inc[4 * 5..4 * 6],
        &(5u32 * 5 + 8).to_le_bytes(),
        "dispatched indirectly"
    );
    assert_eq!(
        &inc[4 * 200..4 * 201],
        &(200u32 * 200 + 7).to_le_bytes(),
        "2 groups only"
    );
    assert_eq!(ours[2].1, le32(&[0, 1, 1, 0, 1]), "the program interface");
    assert_eq!(
        ours[5].1,
        le32(&[1, 1, 1]),
        "the pipeline's stages are the guest's names, and it validates"
    );
    assert!(ours[6].1.chunks(4).any(|p| p == [0, 255, 0, 255]), "drawn");
    assert!(ours[7].1.chunks(4).any(|p| p == [0, 0, 255, 255]), "drawn");
    hostile(gles);
    let mut again = Results::new();
    compute(gles, &mut again);
    assert!(again[0].1 == ours[0].1, "the context still computes");
    let _ = std::fs::remove_dir_all(&tmp);
}
