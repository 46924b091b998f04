//! OpenGL ES 3.0 end to end: one program (this test) draws with instancing (client arrays
//! with divisors, integer attributes, a vertex array object with buffers filled through
//! `glMapBufferRange`), a uniform buffer, a 2D array texture uploaded from a pixel unpack
//! buffer with row length and skips and sampled through a sampler object, transform
//! feedback counted by a query, a pixel pack buffer readback, and sync objects, natively
//! (Mesa through glvnd, in a child process of this test) and through virtsoc (a real
//! daemon and render worker); every picture and value must be equal (the same llvmpipe
//! renders both). Then, through virtsoc only, hostile calls: a pixel buffer offset past the
//! buffer's end (unpack and pack), a mapped range past the buffer's end, an unknown sync
//! and another context's sync: GL errors, and the context, the daemon and another guest
//! go on.
//!
//! Needs the binaries (`cargo build -p virtsocd -p virtsoc-render -p
//! virtsoc-gles`), glvnd and an ES 3 driver; skipped loudly without them unless
//! `VIRTSOC_REQUIRE_ALL` is set.

mod common;

use std::ffi::{c_char, c_void, CStr};

use common::{dlopen, skip, sym, Results, H};

/// The pbuffer's width and height.
const W: i32 = 64;

fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn le(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// The GL functions the scene uses, from glvnd's `libGLESv2.so.2`.
macro_rules! gl {
    ($lib:expr, $name:ident) => {
        sym(
            $lib,
            CStr::from_bytes_with_nul(concat!(stringify!($name), "\0").as_bytes()).expect("name"),
        )
    };
}

/// An ES 3 context current on a 64x64 pbuffer of the first display; `None` when EGL has
/// none (skipped by the caller).
fn es3_context(egl: H) -> Option<(H, H)> {
    // RGBA8, pbuffer, EGL_OPENGL_ES3_BIT_KHR.
    let rgba8 = [
        0x3024, 8, 0x3023, 8, 0x3022, 8, 0x3021, 8, 0x3033, 1, 0x3040, 0x40, 0x3038,
    ];
    common::try_pbuffer(egl, &rgba8, 3, (W, W)).map(|pb| (pb.dpy, pb.ctx))
}

/// Compiles and links a program of `vs` and `fs`, with transform feedback `varyings`.
fn program(g: H, vs: &CStr, fs: &CStr, varyings: &[&CStr]) -> u32 {
    let create_shader: extern "C" fn(u32) -> u32 = gl!(g, glCreateShader);
    let shader_source: extern "C" fn(u32, i32, *const *const c_char, *const i32) =
        gl!(g, glShaderSource);
    let compile: extern "C" fn(u32) = gl!(g, glCompileShader);
    let get_shaderiv: extern "C" fn(u32, u32, *mut i32) = gl!(g, glGetShaderiv);
    let info_log: extern "C" fn(u32, i32, *mut i32, *mut c_char) = gl!(g, glGetShaderInfoLog);
    let create_program: extern "C" fn() -> u32 = gl!(g, glCreateProgram);
    let attach: extern "C" fn(u32, u32) = gl!(g, glAttachShader);
    let link: extern "C" fn(u32) = gl!(g, glLinkProgram);
    let get_programiv: extern "C" fn(u32, u32, *mut i32) = gl!(g, glGetProgramiv);
    let tf_varyings: extern "C" fn(u32, i32, *const *const c_char, u32) =
        gl!(g, glTransformFeedbackVaryings);
    let p = create_program();
    for (kind, src) in [(0x8B31, vs), (0x8B30, fs)] {
        let s = create_shader(kind);
        let ptr = src.as_ptr();
        shader_source(s, 1, &ptr, std::ptr::null());
        compile(s);
        let mut ok = 0;
        get_shaderiv(s, 0x8B81, &mut ok);
        let mut log = [0 as c_char; 512];
        info_log(s, 512, std::ptr::null_mut(), log.as_mut_ptr());
        // SAFETY: GL wrote a NUL-terminated log into the zeroed buffer.
        let log = unsafe { CStr::from_ptr(log.as_ptr()) };
        assert_eq!(ok, 1, "shader compiles: {log:?}");
        attach(p, s);
    }
    if !varyings.is_empty() {
        let v: Vec<*const c_char> = varyings.iter().map(|s| s.as_ptr()).collect();
        tf_varyings(p, v.len() as i32, v.as_ptr(), 0x8C8C); // INTERLEAVED_ATTRIBS
    }
    link(p);
    let mut ok = 0;
    get_programiv(p, 0x8B82, &mut ok);
    assert_eq!(ok, 1, "program links");
    p
}

/// The whole frame, read with `glReadPixels` into client memory.
fn frame(g: H) -> Vec<u8> {
    let read_pixels: extern "C" fn(i32, i32, i32, i32, u32, u32, *mut c_void) =
        gl!(g, glReadPixels);
    let mut px = vec![0u8; (W * W * 4) as usize];
    read_pixels(0, 0, W, W, 0x1908, 0x1401, px.as_mut_ptr().cast());
    px
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

const VS_INST: &CStr = c"#version 300 es
layout(location = 0) in vec2 pos;
layout(location = 1) in vec2 offset;
layout(location = 2) in ivec4 icolor;
layout(std140) uniform Params { vec4 tint; vec4 scale; };
flat out ivec4 vcol;
void main() { gl_Position = vec4(pos * scale.xy + offset, 0.0, 1.0); vcol = icolor; }";
const FS_INST: &CStr = c"#version 300 es
precision highp float;
precision highp int;
flat in ivec4 vcol;
layout(std140) uniform Params { vec4 tint; vec4 scale; };
out vec4 color;
void main() { color = vec4(vcol) / 255.0 * tint; }";
const VS_QUAD: &CStr = c"#version 300 es
out vec2 uv;
void main() {
  vec2 p = vec2(float((gl_VertexID & 1) * 2 - 1), float((gl_VertexID >> 1) * 2 - 1));
  gl_Position = vec4(p, 0.0, 1.0); uv = p * 0.5 + 0.5;
}";
const FS_ARRAY: &CStr = c"#version 300 es
precision highp float;
uniform highp sampler2DArray tex;
in vec2 uv;
out vec4 color;
void main() { color = texture(tex, vec3(uv, 1.0)); }";
const VS_TF: &CStr = c"#version 300 es
in float x;
out float y;
void main() { y = x * 2.0 + 1.0; gl_Position = vec4(0.0); }";
const FS_ONE: &CStr = c"#version 300 es
precision mediump float;
out vec4 c;
void main() { c = vec4(1.0); }";

/// Instanced draws with client arrays (VAO 0) and a uniform buffer.
fn instanced_client(g: H, out: &mut Results) -> (u32, u32) {
    let gen_buffers: extern "C" fn(i32, *mut u32) = gl!(g, glGenBuffers);
    let bind_buffer: extern "C" fn(u32, u32) = gl!(g, glBindBuffer);
    let buffer_data: extern "C" fn(u32, isize, *const c_void, u32) = gl!(g, glBufferData);
    let use_program: extern "C" fn(u32) = gl!(g, glUseProgram);
    let block_index: extern "C" fn(u32, *const c_char) -> u32 = gl!(g, glGetUniformBlockIndex);
    let block_binding: extern "C" fn(u32, u32, u32) = gl!(g, glUniformBlockBinding);
    let bind_base: extern "C" fn(u32, u32, u32) = gl!(g, glBindBufferBase);
    let block_iv: extern "C" fn(u32, u32, u32, *mut i32) = gl!(g, glGetActiveUniformBlockiv);
    let uniform_indices: extern "C" fn(u32, i32, *const *const c_char, *mut u32) =
        gl!(g, glGetUniformIndices);
    let attrib: extern "C" fn(u32, i32, u32, u8, i32, *const c_void) =
        gl!(g, glVertexAttribPointer);
    let iattrib: extern "C" fn(u32, i32, u32, i32, *const c_void) = gl!(g, glVertexAttribIPointer);
    let enable: extern "C" fn(u32) = gl!(g, glEnableVertexAttribArray);
    let divisor: extern "C" fn(u32, u32) = gl!(g, glVertexAttribDivisor);
    let clear: extern "C" fn(u32) = gl!(g, glClear);
    let draw_inst: extern "C" fn(u32, i32, i32, i32) = gl!(g, glDrawArraysInstanced);
    let get_i: extern "C" fn(u32, u32, *mut i32) = gl!(g, glGetIntegeri_v);

    let prog = program(g, VS_INST, FS_INST, &[]);
    use_program(prog);
    let mut ubo = 0;
    gen_buffers(1, &mut ubo);
    bind_buffer(0x8A11, ubo);
    let params = f32s(&[1.0, 1.0, 1.0, 1.0, 0.4, 0.4, 0.0, 0.0]);
    buffer_data(0x8A11, 32, params.as_ptr().cast(), 0x88E8);
    let idx = block_index(prog, c"Params".as_ptr());
    block_binding(prog, idx, 0);
    bind_base(0x8A11, 0, ubo);
    let (mut size, mut count) = (0, 0);
    block_iv(prog, idx, 0x8A40, &mut size); // DATA_SIZE
    block_iv(prog, idx, 0x8A42, &mut count); // ACTIVE_UNIFORMS
    let mut members = vec![0i32; count.max(0) as usize];
    block_iv(prog, idx, 0x8A43, members.as_mut_ptr());
    members.sort();
    let names = [c"tint".as_ptr(), c"scale".as_ptr()];
    let mut ind = [0u32; 2];
    uniform_indices(prog, 2, names.as_ptr(), ind.as_mut_ptr());
    let mut bound = 0;
    get_i(0x8A28, 0, &mut bound); // UNIFORM_BUFFER_BINDING
    let block = [size, count, (bound as u32 == ubo) as i32];
    out.push(("block".into(), le(&block)));
    out.push(("members".into(), le(&members)));
    out.push(("indices".into(), le(&ind.map(|v| v as i32))));

    let tri = [-1.0f32, -1.0, 1.0, -1.0, 0.0, 1.0];
    let offsets = [-0.5f32, -0.5, 0.5, -0.5, -0.5, 0.5, 0.5, 0.5];
    let colors: [u8; 16] = [
        255, 0, 0, 255, 0, 255, 0, 255, 0, 0, 255, 255, 255, 255, 0, 255,
    ];
    bind_buffer(0x8892, 0);
    attrib(0, 2, 0x1406, 0, 0, tri.as_ptr().cast());
    attrib(1, 2, 0x1406, 0, 0, offsets.as_ptr().cast());
    iattrib(2, 4, 0x1401, 0, colors.as_ptr().cast());
    for i in 0..3 {
        enable(i);
    }
    divisor(1, 1);
    divisor(2, 1);
    clear(0x4000);
    draw_inst(0x0004, 0, 3, 4);
    out.push(("instanced_client".into(), frame(g)));
    (prog, ubo)
}

/// A vertex array object with buffers filled through `glMapBufferRange`, an instanced
/// indexed draw, and a pixel pack buffer readback.
fn vao_mapped(g: H, ubo: u32, out: &mut Results) {
    let gen_buffers: extern "C" fn(i32, *mut u32) = gl!(g, glGenBuffers);
    let bind_buffer: extern "C" fn(u32, u32) = gl!(g, glBindBuffer);
    let buffer_data: extern "C" fn(u32, isize, *const c_void, u32) = gl!(g, glBufferData);
    let sub_data: extern "C" fn(u32, isize, isize, *const c_void) = gl!(g, glBufferSubData);
    let map: extern "C" fn(u32, isize, isize, u32) -> *mut c_void = gl!(g, glMapBufferRange);
    let flush: extern "C" fn(u32, isize, isize) = gl!(g, glFlushMappedBufferRange);
    let unmap: extern "C" fn(u32) -> u8 = gl!(g, glUnmapBuffer);
    let gen_vaos: extern "C" fn(i32, *mut u32) = gl!(g, glGenVertexArrays);
    let bind_vao: extern "C" fn(u32) = gl!(g, glBindVertexArray);
    let attrib: extern "C" fn(u32, i32, u32, u8, i32, *const c_void) =
        gl!(g, glVertexAttribPointer);
    let iattrib: extern "C" fn(u32, i32, u32, i32, *const c_void) = gl!(g, glVertexAttribIPointer);
    let enable: extern "C" fn(u32) = gl!(g, glEnableVertexAttribArray);
    let divisor: extern "C" fn(u32, u32) = gl!(g, glVertexAttribDivisor);
    let clear: extern "C" fn(u32) = gl!(g, glClear);
    let draw_inst: extern "C" fn(u32, i32, u32, *const c_void, i32) =
        gl!(g, glDrawElementsInstanced);
    let read_pixels: extern "C" fn(i32, i32, i32, i32, u32, u32, *mut c_void) =
        gl!(g, glReadPixels);

    let mut vao = 0;
    gen_vaos(1, &mut vao);
    bind_vao(vao);
    let mut b = [0u32; 4];
    gen_buffers(4, b.as_mut_ptr());
    // Positions: written through a whole-buffer write mapping.
    bind_buffer(0x8892, b[0]);
    buffer_data(0x8892, 32, std::ptr::null(), 0x88E8);
    let quad = f32s(&[-1.0, -1.0, 1.0, -1.0, 1.0, 1.0, -1.0, 1.0]);
    let p = map(0x8892, 0, 32, 0x2 | 0x8);
    assert!(!p.is_null(), "write mapping");
    // SAFETY: 32 writable bytes mapped at `p`.
    unsafe { std::ptr::copy_nonoverlapping(quad.as_ptr(), p.cast(), 32) };
    out.push(("unmap".into(), vec![unmap(0x8892)]));
    attrib(0, 2, 0x1406, 0, 0, std::ptr::null());
    enable(0);
    // Offsets: an explicitly flushed mapping of part of the buffer.
    bind_buffer(0x8892, b[1]);
    buffer_data(0x8892, 32, std::ptr::null(), 0x88E8);
    let offs = f32s(&[-0.4, -0.4, 0.4, 0.4]);
    let p = map(0x8892, 8, 16, 0x2 | 0x10);
    assert!(!p.is_null(), "flush-explicit mapping");
    // SAFETY: 16 writable bytes mapped at `p`.
    unsafe { std::ptr::copy_nonoverlapping(offs.as_ptr(), p.cast(), 16) };
    flush(0x8892, 0, 16);
    assert_eq!(unmap(0x8892), 1);
    attrib(1, 2, 0x1406, 0, 0, 8 as *const c_void);
    enable(1);
    divisor(1, 1);
    // Integer colours per instance.
    bind_buffer(0x8892, b[2]);
    let colors: [u8; 8] = [200, 100, 50, 255, 10, 20, 30, 255];
    buffer_data(0x8892, 8, colors.as_ptr().cast(), 0x88E4);
    iattrib(2, 4, 0x1401, 0, std::ptr::null());
    enable(2);
    divisor(2, 1);
    bind_buffer(0x8893, b[3]);
    let idx: [u16; 6] = [0, 1, 2, 0, 2, 3];
    buffer_data(0x8893, 12, idx.as_ptr().cast(), 0x88E4);
    bind_buffer(0x8A11, ubo);
    sub_data(0x8A11, 0, 16, f32s(&[0.5, 1.0, 1.0, 1.0]).as_ptr().cast());
    clear(0x4000);
    draw_inst(0x0004, 6, 0x1403, std::ptr::null(), 2);
    bind_buffer(0x8892, b[1]);
    out.push(("offsets_read".into(), read_buffer(g, 0x8892, 32)));
    // Pixel pack buffer readback.
    let mut pbo = 0;
    gen_buffers(1, &mut pbo);
    bind_buffer(0x88EB, pbo);
    let n = (W * W * 4) as usize;
    buffer_data(0x88EB, n as isize, std::ptr::null(), 0x88E1);
    read_pixels(0, 0, W, W, 0x1908, 0x1401, std::ptr::null_mut());
    out.push(("vao_pbo".into(), read_buffer(g, 0x88EB, n)));
    bind_buffer(0x88EB, 0);
    out.push(("vao_direct".into(), frame(g)));
    bind_vao(0);
}

/// A 2D array texture uploaded from a pixel unpack buffer (row length and skips), sampled
/// through a sampler object.
fn array_texture(g: H, out: &mut Results) {
    let gen_buffers: extern "C" fn(i32, *mut u32) = gl!(g, glGenBuffers);
    let bind_buffer: extern "C" fn(u32, u32) = gl!(g, glBindBuffer);
    let buffer_data: extern "C" fn(u32, isize, *const c_void, u32) = gl!(g, glBufferData);
    let gen_textures: extern "C" fn(i32, *mut u32) = gl!(g, glGenTextures);
    let bind_texture: extern "C" fn(u32, u32) = gl!(g, glBindTexture);
    let storage3d: extern "C" fn(u32, i32, u32, i32, i32, i32) = gl!(g, glTexStorage3D);
    let sub3d: extern "C" fn(u32, i32, i32, i32, i32, i32, i32, i32, u32, u32, *const c_void) =
        gl!(g, glTexSubImage3D);
    let pixel_store: extern "C" fn(u32, i32) = gl!(g, glPixelStorei);
    let gen_samplers: extern "C" fn(i32, *mut u32) = gl!(g, glGenSamplers);
    let sampler_i: extern "C" fn(u32, u32, i32) = gl!(g, glSamplerParameteri);
    let bind_sampler: extern "C" fn(u32, u32) = gl!(g, glBindSampler);
    let use_program: extern "C" fn(u32) = gl!(g, glUseProgram);
    let draw_arrays: extern "C" fn(u32, i32, i32) = gl!(g, glDrawArrays);
    let disable: extern "C" fn(u32) = gl!(g, glDisableVertexAttribArray);

    let prog = program(g, VS_QUAD, FS_ARRAY, &[]);
    use_program(prog);
    let mut tex = 0;
    gen_textures(1, &mut tex);
    bind_texture(0x8C1A, tex);
    storage3d(0x8C1A, 1, 0x8058, 4, 4, 2); // RGBA8, 4x4x2
                                           // Rows of 6 pixels, the image starting 1 pixel in.
    let src: Vec<u8> = (0..6 * 4 * 4).map(|i| (i * 7 % 251) as u8).collect();
    let mut pbo = 0;
    gen_buffers(1, &mut pbo);
    bind_buffer(0x88EC, pbo);
    buffer_data(0x88EC, src.len() as isize, src.as_ptr().cast(), 0x88E4);
    pixel_store(0x0CF2, 6); // UNPACK_ROW_LENGTH
    pixel_store(0x0CF4, 1); // UNPACK_SKIP_PIXELS
    sub3d(
        0x8C1A,
        0,
        0,
        0,
        1,
        4,
        4,
        1,
        0x1908,
        0x1401,
        std::ptr::null(),
    );
    pixel_store(0x0CF2, 0);
    pixel_store(0x0CF4, 0);
    bind_buffer(0x88EC, 0);
    let mut smp = 0;
    gen_samplers(1, &mut smp);
    sampler_i(smp, 0x2801, 0x2600); // MIN_FILTER NEAREST
    sampler_i(smp, 0x2800, 0x2600); // MAG_FILTER NEAREST
    bind_sampler(0, smp);
    for i in 0..3 {
        disable(i);
    }
    draw_arrays(0x0005, 0, 4);
    out.push(("array_texture".into(), frame(g)));
    bind_sampler(0, 0);
}

/// Transform feedback of 4 points into a buffer, counted by a query.
fn transform_feedback(g: H, out: &mut Results) {
    let gen_buffers: extern "C" fn(i32, *mut u32) = gl!(g, glGenBuffers);
    let bind_buffer: extern "C" fn(u32, u32) = gl!(g, glBindBuffer);
    let buffer_data: extern "C" fn(u32, isize, *const c_void, u32) = gl!(g, glBufferData);
    let bind_base: extern "C" fn(u32, u32, u32) = gl!(g, glBindBufferBase);
    let use_program: extern "C" fn(u32) = gl!(g, glUseProgram);
    let tf_varying: extern "C" fn(u32, u32, i32, *mut i32, *mut i32, *mut u32, *mut c_char) =
        gl!(g, glGetTransformFeedbackVarying);
    let gen_tfs: extern "C" fn(i32, *mut u32) = gl!(g, glGenTransformFeedbacks);
    let bind_tf: extern "C" fn(u32, u32) = gl!(g, glBindTransformFeedback);
    let begin_tf: extern "C" fn(u32) = gl!(g, glBeginTransformFeedback);
    let end_tf: extern "C" fn() = gl!(g, glEndTransformFeedback);
    let gen_queries: extern "C" fn(i32, *mut u32) = gl!(g, glGenQueries);
    let begin_query: extern "C" fn(u32, u32) = gl!(g, glBeginQuery);
    let end_query: extern "C" fn(u32) = gl!(g, glEndQuery);
    let query_uiv: extern "C" fn(u32, u32, *mut u32) = gl!(g, glGetQueryObjectuiv);
    let enable: extern "C" fn(u32) = gl!(g, glEnable);
    let disable: extern "C" fn(u32) = gl!(g, glDisable);
    let attrib: extern "C" fn(u32, i32, u32, u8, i32, *const c_void) =
        gl!(g, glVertexAttribPointer);
    let enable_attrib: extern "C" fn(u32) = gl!(g, glEnableVertexAttribArray);
    let divisor: extern "C" fn(u32, u32) = gl!(g, glVertexAttribDivisor);
    let draw_arrays: extern "C" fn(u32, i32, i32) = gl!(g, glDrawArrays);

    let prog = program(g, VS_TF, FS_ONE, &[c"y"]);
    use_program(prog);
    let (mut len, mut size, mut ty) = (0, 0, 0u32);
    let mut name = [0 as c_char; 16];
    tf_varying(prog, 0, 16, &mut len, &mut size, &mut ty, name.as_mut_ptr());
    // SAFETY: GL wrote a NUL-terminated name into the zeroed buffer.
    let vname = unsafe { CStr::from_ptr(name.as_ptr()) }.to_bytes().to_vec();
    out.push((
        "tf_varying".into(),
        [vname, ty.to_le_bytes().to_vec()].concat(),
    ));
    let mut tf = 0;
    gen_tfs(1, &mut tf);
    bind_tf(0x8E22, tf);
    let mut tfb = 0;
    gen_buffers(1, &mut tfb);
    bind_buffer(0x8C8E, tfb);
    buffer_data(0x8C8E, 16, std::ptr::null(), 0x88E5);
    bind_base(0x8C8E, 0, tfb);
    bind_buffer(0x8892, 0);
    let xs = [1.0f32, 2.0, 3.0, 4.0];
    divisor(0, 0);
    attrib(0, 1, 0x1406, 0, 0, xs.as_ptr().cast());
    enable_attrib(0);
    let mut q = 0;
    gen_queries(1, &mut q);
    enable(0x8C89); // RASTERIZER_DISCARD
    begin_query(0x8C88, q); // TRANSFORM_FEEDBACK_PRIMITIVES_WRITTEN
    begin_tf(0x0000);
    draw_arrays(0x0000, 0, 4);
    end_tf();
    end_query(0x8C88);
    disable(0x8C89);
    let mut written = 0u32;
    query_uiv(q, 0x8866, &mut written); // QUERY_RESULT
    out.push(("tf_written".into(), written.to_le_bytes().to_vec()));
    out.push(("tf_out".into(), read_buffer(g, 0x8C8E, 16)));
    bind_tf(0x8E22, 0);
}

/// Sync objects, strings and 64-bit queries.
fn syncs_and_queries(g: H, out: &mut Results) {
    let fence: extern "C" fn(u32, u32) -> H = gl!(g, glFenceSync);
    let is_sync: extern "C" fn(H) -> u8 = gl!(g, glIsSync);
    let client_wait: extern "C" fn(H, u32, u64) -> u32 = gl!(g, glClientWaitSync);
    let wait: extern "C" fn(H, u32, u64) = gl!(g, glWaitSync);
    let get_synciv: extern "C" fn(H, u32, i32, *mut i32, *mut i32) = gl!(g, glGetSynciv);
    let delete_sync: extern "C" fn(H) = gl!(g, glDeleteSync);
    let get_string: extern "C" fn(u32) -> *const c_char = gl!(g, glGetString);
    let get_stringi: extern "C" fn(u32, u32) -> *const c_char = gl!(g, glGetStringi);
    let get_integerv: extern "C" fn(u32, *mut i32) = gl!(g, glGetIntegerv);
    let get_integer64v: extern "C" fn(u32, *mut i64) = gl!(g, glGetInteger64v);
    let gl_get_error: extern "C" fn() -> u32 = gl!(g, glGetError);

    let s = fence(0x9117, 0);
    assert!(!s.is_null());
    let w = client_wait(s, 1, 1_000_000_000);
    let (mut len, mut status) = (0, 0);
    get_synciv(s, 0x9114, 1, &mut len, &mut status); // SYNC_STATUS
    let known = is_sync(s);
    delete_sync(s);
    let gone = is_sync(s);
    let s2 = fence(0x9117, 0);
    wait(s2, 0, u64::MAX);
    delete_sync(s2);
    let ok = [
        matches!(w, 0x911A | 0x911C) as u8, // ALREADY_SIGNALED, CONDITION_SATISFIED
        (len == 1 && status == 0x9119) as u8, // SIGNALED
        known,
        gone,
    ];
    out.push(("sync".into(), ok.to_vec()));
    // SAFETY: GL strings are NUL-terminated and static.
    let version = unsafe { CStr::from_ptr(get_string(0x1F02)) }
        .to_bytes()
        .to_vec();
    let (mut major, mut n_ext) = (0, 0);
    get_integerv(0x821B, &mut major);
    get_integerv(0x821D, &mut n_ext);
    let first = get_stringi(0x1F03, 0);
    let mut max_block = 0i64;
    get_integer64v(0x8A30, &mut max_block); // MAX_UNIFORM_BLOCK_SIZE
    let v = [
        version.starts_with(b"OpenGL ES 3.") as u8,
        major as u8,
        (n_ext > 0 && !first.is_null()) as u8,
        (max_block >= 16384) as u8,
    ];
    out.push(("strings".into(), v.to_vec()));
    out.push(("errors".into(), gl_get_error().to_le_bytes().to_vec()));
}

/// The scene on the current ES 3 context.
fn scene(g: H) -> Results {
    let mut out = Results::new();
    let (_prog, ubo) = instanced_client(g, &mut out);
    vao_mapped(g, ubo, &mut out);
    array_texture(g, &mut out);
    transform_feedback(g, &mut out);
    syncs_and_queries(g, &mut out);
    out
}

/// The native run: only in the child process the main test starts.
#[test]
fn es3_native_child() {
    common::write_native(|| {
        let (egl, gles) = (dlopen(c"libEGL.so.1"), dlopen(c"libGLESv2.so.2"));
        assert!(!egl.is_null() && !gles.is_null(), "glvnd");
        es3_context(egl).map(|_| scene(gles))
    });
}

/// Hostile calls through virtsoc: GL errors; the context goes on.
fn hostile(g: H, egl: H, dpy: H, ctx: H) {
    let gl_get_error: extern "C" fn() -> u32 = gl!(g, glGetError);
    let gen_buffers: extern "C" fn(i32, *mut u32) = gl!(g, glGenBuffers);
    let bind_buffer: extern "C" fn(u32, u32) = gl!(g, glBindBuffer);
    let buffer_data: extern "C" fn(u32, isize, *const c_void, u32) = gl!(g, glBufferData);
    let gen_textures: extern "C" fn(i32, *mut u32) = gl!(g, glGenTextures);
    let bind_texture: extern "C" fn(u32, u32) = gl!(g, glBindTexture);
    let storage2d: extern "C" fn(u32, i32, u32, i32, i32) = gl!(g, glTexStorage2D);
    let sub2d: extern "C" fn(u32, i32, i32, i32, i32, i32, u32, u32, *const c_void) =
        gl!(g, glTexSubImage2D);
    let read_pixels: extern "C" fn(i32, i32, i32, i32, u32, u32, *mut c_void) =
        gl!(g, glReadPixels);
    let map: extern "C" fn(u32, isize, isize, u32) -> *mut c_void = gl!(g, glMapBufferRange);
    let fence: extern "C" fn(u32, u32) -> H = gl!(g, glFenceSync);
    let client_wait: extern "C" fn(H, u32, u64) -> u32 = gl!(g, glClientWaitSync);
    let wait: extern "C" fn(H, u32, u64) = gl!(g, glWaitSync);
    let delete_sync: extern "C" fn(H) = gl!(g, glDeleteSync);
    assert_eq!(gl_get_error(), 0);

    let mut b = [0u32; 2];
    gen_buffers(2, b.as_mut_ptr());
    // A 4x4 RGBA upload (64 bytes) from offset 8 of a 16-byte unpack buffer.
    bind_buffer(0x88EC, b[0]);
    buffer_data(0x88EC, 16, std::ptr::null(), 0x88E4);
    let mut tex = 0;
    gen_textures(1, &mut tex);
    bind_texture(0x0DE1, tex);
    storage2d(0x0DE1, 1, 0x8058, 4, 4);
    sub2d(0x0DE1, 0, 0, 0, 4, 4, 0x1908, 0x1401, 8 as *const c_void);
    assert_eq!(
        gl_get_error(),
        0x0502,
        "unpack offset past the buffer's end"
    );
    bind_buffer(0x88EC, 0);
    // A 4x4 read (64 bytes) into a 16-byte pack buffer.
    bind_buffer(0x88EB, b[1]);
    buffer_data(0x88EB, 16, std::ptr::null(), 0x88E1);
    read_pixels(0, 0, 4, 4, 0x1908, 0x1401, std::ptr::null_mut());
    assert_eq!(gl_get_error(), 0x0502, "pack offset past the buffer's end");
    // A mapped range past the end (read and write).
    assert!(map(0x88EB, 0, 17, 0x1).is_null());
    assert_eq!(gl_get_error(), 0x0501, "map range past the end");
    assert!(map(0x88EB, 12, 8, 0x2).is_null());
    assert_eq!(gl_get_error(), 0x0501, "map range past the end");
    bind_buffer(0x88EB, 0);
    // An unknown sync name.
    let bogus = 0xBEEF as H;
    assert_eq!(client_wait(bogus, 0, 0), 0x911D, "WAIT_FAILED");
    assert_eq!(gl_get_error(), 0x0501, "unknown sync");
    wait(bogus, 0, u64::MAX);
    assert_eq!(gl_get_error(), 0x0501, "unknown sync");
    delete_sync(bogus);
    assert_eq!(gl_get_error(), 0x0501, "unknown sync");
    // Another context's sync (no sharing): unknown here.
    let create_context: extern "C" fn(H, H, H, *const i32) -> H = sym(egl, c"eglCreateContext");
    let make_current: extern "C" fn(H, H, H, H) -> u32 = sym(egl, c"eglMakeCurrent");
    let get_current_surface: extern "C" fn(i32) -> H = sym(egl, c"eglGetCurrentSurface");
    let surf = get_current_surface(0x3059);
    let other = create_context(
        dpy,
        std::ptr::null_mut(),
        std::ptr::null_mut(),
        [0x3098, 3, 0x3038].as_ptr(),
    );
    assert!(!other.is_null());
    assert_eq!(make_current(dpy, surf, surf, other), 1);
    let foreign = fence(0x9117, 0);
    assert!(!foreign.is_null());
    assert_eq!(make_current(dpy, surf, surf, ctx), 1);
    assert_eq!(client_wait(foreign, 0, 0), 0x911D, "another context's sync");
    assert_eq!(gl_get_error(), 0x0501, "another context's sync");
    assert_eq!(gl_get_error(), 0);
}

#[test]
fn es3_draws_as_native_and_refuses_hostile_input() {
    let tmp = std::env::temp_dir().join(format!("virtsoc-gles-es3-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).expect("temp dir");
    let Some(native) = common::native_results(&tmp, "es3_native_child") else {
        return skip("no OpenGL ES 3 context natively");
    };

    let Some((_d, sock, _)) = common::start_daemon(&tmp, &[]) else {
        return;
    };
    let (egl, gles) = (dlopen(c"libEGL.so.1"), dlopen(c"libGLESv2.so.2"));
    if egl.is_null() || gles.is_null() {
        return skip("glvnd's libEGL.so.1 / libGLESv2.so.2 not installed");
    }
    let (dpy, ctx) = es3_context(egl).expect("an ES 3 context through virtsoc");
    // SAFETY: GL_VENDOR is a static NUL-terminated string.
    let vendor = unsafe {
        let get_string: extern "C" fn(u32) -> *const c_char = gl!(gles, glGetString);
        CStr::from_ptr(get_string(0x1F00)).to_owned()
    };
    assert_eq!(vendor.to_str().ok(), Some("virtsoc"), "through virtsoc");
    let ours = scene(gles);
    common::assert_same(&ours, &native);
    // Pictures are not blank.
    let inst = &ours[3].1;
    assert!(
        inst.chunks(4).any(|p| p == [255, 0, 0, 255]),
        "instances drawn"
    );
    hostile(gles, egl, dpy, ctx);
    // The context goes on: the instanced draw again, the same picture.
    let again = {
        let mut r = Results::new();
        instanced_client(gles, &mut r);
        r
    };
    assert!(again[3].1 == ours[3].1, "the context still draws");
    // The daemon goes on: another guest connects and is served.
    let other = virtsoc_guest::Connection::open(
        sock.to_str().expect("utf-8 path"),
        &virtsoc_guest::ConnectOptions::default(),
    )
    .expect("another guest connects");
    other.nop().expect("and is served");
    let _ = std::fs::remove_dir_all(&tmp);
}
