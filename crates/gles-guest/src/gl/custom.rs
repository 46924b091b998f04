//! Hand-written entry points (the annotation file's `custom=guest`/`both`): frame
//! boundaries, errors, strings and cached limits, shader sources, and `GL_OES_mapbuffer`
//! (mapped in guest memory, sent as `glBufferSubData` at unmap). Vertex attribute pointers
//! and draws are in `gl::draw`, the GLES 3.0 calls in `gl::es3` and `gl::es3obj`; they are
//! re-exported here, where the generated entry-point table looks for them. Payloads: see
//! the host's `gl::custom`.

#![allow(non_snake_case)]

use std::ffi::{c_char, c_void, CString};

use virtsoc_gles_stream::{gl_ops as op, Packet};

use super::{rtx, sz, GlState, GL_INVALID_ENUM, GL_INVALID_OPERATION, GL_INVALID_VALUE};
use crate::rt::{self, Context};

pub(crate) use super::draw::*;
pub(crate) use super::es3::*;
pub(crate) use super::es31::*;
pub(crate) use super::es3obj::*;

/// Extensions exposed when the host has them: those that add no entry point, or whose
/// entry points we provide, and whose formats and types our size functions know.
const EXTENSIONS: &[&str] = &[
    "GL_OES_depth24",
    "GL_OES_depth32",
    "GL_OES_packed_depth_stencil",
    "GL_OES_rgb8_rgba8",
    "GL_OES_element_index_uint",
    "GL_OES_texture_npot",
    "GL_OES_standard_derivatives",
    "GL_OES_depth_texture",
    "GL_OES_stencil8",
    "GL_OES_fragment_precision_high",
    "GL_OES_texture_float",
    "GL_OES_texture_half_float",
    "GL_OES_texture_float_linear",
    "GL_OES_texture_half_float_linear",
    "GL_OES_vertex_half_float",
    "GL_OES_compressed_ETC1_RGB8_texture",
    "GL_OES_required_internalformat",
    "GL_OES_surfaceless_context",
    "GL_EXT_texture_format_BGRA8888",
    "GL_EXT_read_format_bgra",
    "GL_EXT_texture_filter_anisotropic",
    "GL_EXT_blend_minmax",
    "GL_EXT_texture_rg",
    "GL_EXT_texture_compression_dxt1",
    "GL_EXT_texture_compression_s3tc",
    "GL_KHR_texture_compression_astc_ldr",
    "GL_OES_EGL_image",
    "GL_OES_EGL_image_external",
];

/// Constant queries answered once per context.
const CONSTANTS: &[u32] = &[
    0x0D33, // MAX_TEXTURE_SIZE
    0x851C, // MAX_CUBE_MAP_TEXTURE_SIZE
    0x84E8, // MAX_RENDERBUFFER_SIZE
    0x8869, // MAX_VERTEX_ATTRIBS
    0x8DFB, // MAX_VERTEX_UNIFORM_VECTORS
    0x8DFC, // MAX_VARYING_VECTORS
    0x8DFD, // MAX_FRAGMENT_UNIFORM_VECTORS
    0x8B4D, // MAX_COMBINED_TEXTURE_IMAGE_UNITS
    0x8B4C, // MAX_VERTEX_TEXTURE_IMAGE_UNITS
    0x8872, // MAX_TEXTURE_IMAGE_UNITS
    0x0D3A, // MAX_VIEWPORT_DIMS
    0x846D, // ALIASED_POINT_SIZE_RANGE
    0x846E, // ALIASED_LINE_WIDTH_RANGE
    0x86A2, // NUM_COMPRESSED_TEXTURE_FORMATS
    0x86A3, // COMPRESSED_TEXTURE_FORMATS
    0x0D50, // SUBPIXEL_BITS
    0x8DFA, // SHADER_COMPILER
    0x84FF, // MAX_TEXTURE_MAX_ANISOTROPY_EXT
    // GLES 3.0 limits.
    0x8073, // MAX_3D_TEXTURE_SIZE
    0x88FF, // MAX_ARRAY_TEXTURE_LAYERS
    0x8824, // MAX_DRAW_BUFFERS
    0x8CDF, // MAX_COLOR_ATTACHMENTS
    0x8D57, // MAX_SAMPLES
    0x8A2F, // MAX_UNIFORM_BUFFER_BINDINGS
    0x8A30, // MAX_UNIFORM_BLOCK_SIZE
    0x8A34, // UNIFORM_BUFFER_OFFSET_ALIGNMENT
    0x8A2B, // MAX_VERTEX_UNIFORM_BLOCKS
    0x8A2D, // MAX_FRAGMENT_UNIFORM_BLOCKS
    0x8A2E, // MAX_COMBINED_UNIFORM_BLOCKS
    0x8C8A, // MAX_TRANSFORM_FEEDBACK_INTERLEAVED_COMPONENTS
    0x8C8B, // MAX_TRANSFORM_FEEDBACK_SEPARATE_ATTRIBS
    0x8C80, // MAX_TRANSFORM_FEEDBACK_SEPARATE_COMPONENTS
    0x9122, // MAX_VERTEX_OUTPUT_COMPONENTS
    0x9125, // MAX_FRAGMENT_INPUT_COMPONENTS
    0x8B4A, // MAX_VERTEX_UNIFORM_COMPONENTS
    0x8B49, // MAX_FRAGMENT_UNIFORM_COMPONENTS
    0x8B4B, // MAX_VARYING_COMPONENTS
    0x80E8, // MAX_ELEMENTS_VERTICES
    0x80E9, // MAX_ELEMENTS_INDICES
    0x8904, // MIN_PROGRAM_TEXEL_OFFSET
    0x8905, // MAX_PROGRAM_TEXEL_OFFSET
];

/// Sends the encoded packets and waits; the answer of `opc`, as its payload bytes.
pub(super) fn round_trip(ctx: &Context, opc: u32) -> Option<Vec<u8>> {
    let reply = ctx.stream().round_trip().ok()?;
    let mut a = rtx::answer(&reply, opc)?;
    let n = a.remaining();
    let mut out = Vec::with_capacity(n);
    while a.remaining() >= 4 {
        out.extend(a.u32().ok()?.to_le_bytes());
    }
    Some(out)
}

/// Encodes one packet of `opc` for the current context.
pub(super) fn encode(ctx: &Context, opc: u32, f: impl FnOnce(&mut Packet<'_>)) {
    let mut s = ctx.stream();
    let enc = s.encoder(ctx.id);
    let mut p = enc.packet(opc);
    f(&mut p);
}

/// `glFlush`: the batch goes to the host.
pub(crate) unsafe extern "C" fn glFlush() {
    if let Some(ctx) = rt::current() {
        encode(&ctx, op::glFlush, |_| {});
        let _ = ctx.stream().flush();
    }
}

/// `glFinish`: the batch runs on the host, which finishes its GL work, before it returns.
pub(crate) unsafe extern "C" fn glFinish() {
    if let Some(ctx) = rt::current() {
        encode(&ctx, op::glFinish, |_| {});
        let _ = ctx.stream().round_trip();
    }
}

/// `glGetError`: the guest's own errors first, then the host's (a round trip).
pub(crate) unsafe extern "C" fn glGetError() -> u32 {
    let Some(ctx) = rt::current() else { return 0 };
    let mut st = ctx.gl();
    if let Some(e) = st.take_error() {
        return e;
    }
    encode(&ctx, op::glGetError, |_| {});
    let a = round_trip(&ctx, op::glGetError);
    a.and_then(|b| {
        b.get(..4)
            .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
    })
    .unwrap_or(0)
}

/// The host's string `name` (a round trip).
pub(super) fn host_string(ctx: &Context, name: u32) -> Option<Vec<u8>> {
    encode(ctx, op::glGetString, |p| {
        p.u32(name);
    });
    let reply = ctx.stream().round_trip().ok()?;
    let mut a = rtx::answer(&reply, op::glGetString)?;
    a.bytes().ok()?.map(|b| b.to_vec())
}

/// The string the guest shows for `name`, from the host's.
fn make_string(ctx: &Context, name: u32, es3: bool, es31: bool) -> Option<String> {
    let host = |n| host_string(ctx, n).map(|b| String::from_utf8_lossy(&b).into_owned());
    Some(match name {
        0x1F00 => "virtsoc".to_owned(),
        0x1F01 => format!("virtsoc ({})", host(0x1F01).unwrap_or_default()),
        0x1F02 if es31 => "OpenGL ES 3.1 virtsoc".to_owned(),
        0x1F02 if es3 => "OpenGL ES 3.0 virtsoc".to_owned(),
        0x1F02 => "OpenGL ES 2.0 virtsoc".to_owned(),
        0x8B8C if es31 => "OpenGL ES GLSL ES 3.10".to_owned(),
        0x8B8C if es3 => "OpenGL ES GLSL ES 3.00".to_owned(),
        0x8B8C => "OpenGL ES GLSL ES 1.00".to_owned(),
        0x1F03 => {
            let h = host(0x1F03).unwrap_or_default();
            let mut v: Vec<&str> = h
                .split_whitespace()
                .filter(|e| EXTENSIONS.contains(e))
                .collect();
            v.push("GL_OES_mapbuffer");
            v.join(" ")
        }
        _ => return None,
    })
}

/// `glGetString`: fetched once per context; `GL_VERSION` says ES 2.0 (3.0 for a GLES 3
/// context, 3.1 where the host's is 3.1 or newer) and the extension
/// list holds only what we support.
pub(crate) unsafe extern "C" fn glGetString(name: u32) -> *const u8 {
    let Some(ctx) = rt::current() else {
        return std::ptr::null();
    };
    let mut st = ctx.gl();
    if let Some(s) = st.strings.get(&name) {
        return s.as_ptr().cast();
    }
    let es3 = super::es3obj::is_es3(&ctx, &mut st);
    let es31 = es3 && super::es3obj::is_es31(&ctx, &mut st);
    let Some(s) = make_string(&ctx, name, es3, es31) else {
        st.error(GL_INVALID_ENUM);
        return std::ptr::null();
    };
    let s = CString::new(s.replace('\0', "")).unwrap_or_default();
    let p = s.as_ptr().cast();
    // The CString's bytes do not move when the map does.
    st.strings.insert(name, s);
    p
}

/// The host's answer to `glGetIntegerv(pname)` (a round trip).
fn host_ints(ctx: &Context, pname: u32) -> Vec<i32> {
    encode(ctx, op::glGetIntegerv, |p| {
        p.u32(pname);
    });
    let reply = ctx.stream().round_trip();
    let Ok(reply) = reply else { return Vec::new() };
    let Some(mut a) = rtx::answer(&reply, op::glGetIntegerv) else {
        return Vec::new();
    };
    match a.bytes() {
        Ok(Some(b)) => b
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        _ => Vec::new(),
    }
}

/// The values of `glGetIntegerv(pname)`, from guest state, the cache or the host.
fn get_ints(ctx: &Context, st: &mut GlState, pname: u32) -> Vec<i32> {
    if let Some(v) = super::es3obj::local_ints(ctx, st, pname) {
        return v;
    }
    match pname {
        0x8894 => return vec![st.array_buffer as i32],
        0x8895 => return vec![st.element_buffer as i32],
        0x0CF5 => return vec![st.unpack_alignment as i32],
        0x0D05 => return vec![st.pack_alignment as i32],
        0x8DF9 => return vec![0], // NUM_SHADER_BINARY_FORMATS: none exposed
        0x8DF8 => return Vec::new(),
        _ => {}
    }
    if let Some(v) = st.ints.get(&pname) {
        return v.clone();
    }
    if pname == 0x86A3 && !st.ints.contains_key(&0x86A2) {
        let n = host_ints(ctx, 0x86A2);
        st.ints.insert(0x86A2, n);
    }
    let v = host_ints(ctx, pname);
    if CONSTANTS.contains(&pname) && !v.is_empty() {
        st.ints.insert(pname, v.clone());
    }
    v
}

/// `glGetIntegerv`.
///
/// # Safety
/// `data` has room for the values `pname` answers.
pub(crate) unsafe extern "C" fn glGetIntegerv(pname: u32, data: *mut i32) {
    let Some(ctx) = rt::current() else { return };
    // GL_NUM_EXTENSIONS (GLES 3): the list is made from glGetString, which takes the lock.
    let num_ext = (pname == 0x821D).then(|| super::es3obj::num_extensions(&ctx) as i32);
    let mut st = ctx.gl();
    let v = match num_ext {
        Some(n) => vec![n],
        None => get_ints(&ctx, &mut st, pname),
    };
    let Some(n) = sz::getv(&st, pname as i64) else {
        st.error(GL_INVALID_VALUE);
        return;
    };
    if data.is_null() {
        return;
    }
    let k = n.min(v.len());
    // SAFETY: `data` has room for `n` values (the GL contract), `k <= n`.
    unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), data, k) };
}

/// `glShaderSource`: the strings joined into one.
///
/// # Safety
/// GL's contract: `count` strings, `length` null or `count` lengths.
pub(crate) unsafe extern "C" fn glShaderSource(
    shader: u32,
    count: i32,
    string: *const *const c_char,
    length: *const i32,
) {
    let Some(ctx) = rt::current() else { return };
    let mut st = ctx.gl();
    let Ok(n) = usize::try_from(count) else {
        st.error(GL_INVALID_VALUE);
        return;
    };
    // SAFETY: the caller's contract.
    let src = unsafe { joined_source(n, string, length) };
    drop(st);
    encode(&ctx, op::glShaderSource, |p| {
        p.u32(shader).bytes(&src);
    });
}

/// A shader's source: `n` strings concatenated, each of its `length` (null, or negative:
/// NUL-terminated).
///
/// # Safety
/// `string` is null or holds `n` pointers, `length` null or `n` lengths; each non-null
/// string holds its length or is NUL-terminated.
pub(super) unsafe fn joined_source(
    n: usize,
    string: *const *const c_char,
    length: *const i32,
) -> Vec<u8> {
    let mut src = Vec::new();
    for i in 0..n {
        if string.is_null() {
            break;
        }
        // SAFETY: `string` holds `count` pointers (the caller's contract).
        let s = unsafe { *string.add(i) };
        if s.is_null() {
            continue;
        }
        let len = if length.is_null() {
            -1
        } else {
            // SAFETY: `length` is null or holds `count` lengths.
            unsafe { *length.add(i) }
        };
        if len < 0 {
            // SAFETY: without a length the string is NUL-terminated.
            src.extend_from_slice(unsafe { std::ffi::CStr::from_ptr(s) }.to_bytes());
        } else {
            // SAFETY: the string holds `len` bytes.
            src.extend_from_slice(unsafe {
                std::slice::from_raw_parts(s.cast::<u8>(), len as usize)
            });
        }
    }
    src
}

/// `glShaderBinary`: no binary formats exist here.
pub(crate) unsafe extern "C" fn glShaderBinary(
    _c: i32,
    _s: *const u32,
    _f: u32,
    _b: *const c_void,
    _l: i32,
) {
    if let Some(ctx) = rt::current() {
        ctx.gl().error(GL_INVALID_ENUM);
    }
}

/// `glEGLImageTargetTexture2DOES`: an EGLImage of an SVM region (`crate::egl::image`).
pub(crate) unsafe extern "C" fn glEGLImageTargetTexture2DOES(target: u32, image: *mut c_void) {
    crate::egl::image::target_texture(target, image);
}

/// `glMapBufferOES`: guest memory holding the buffer (write-only), sent at unmap.
pub(crate) unsafe extern "C" fn glMapBufferOES(target: u32, access: u32) -> *mut c_void {
    let Some(ctx) = rt::current() else {
        return std::ptr::null_mut();
    };
    let mut st = ctx.gl();
    if access != 0x88B9 {
        st.error(GL_INVALID_ENUM);
        return std::ptr::null_mut();
    }
    let Some(b) = st.bound_buffer(target) else {
        st.error(GL_INVALID_ENUM);
        return std::ptr::null_mut();
    };
    let mut s = st.shared();
    let info = s
        .buffers
        .get_mut(&b)
        .filter(|i| b != 0 && i.mapped.is_none() && i.size > 0);
    let Some(info) = info else {
        drop(s);
        st.error(GL_INVALID_OPERATION);
        return std::ptr::null_mut();
    };
    let mut m = info.shadow.clone().unwrap_or_default();
    m.resize(info.size, 0);
    let p = m.as_mut_ptr();
    info.mapped = Some(m);
    p.cast()
}

/// `glUnmapBufferOES`: the runs of bytes that differ from the guest's copy of the buffer go
/// to the host, a `glBufferSubData` each (all of them when there is no copy: `gl::diff`).
pub(crate) unsafe extern "C" fn glUnmapBufferOES(target: u32) -> u8 {
    let Some(ctx) = rt::current() else { return 0 };
    let (m, runs) = {
        let mut st = ctx.gl();
        let b = st.bound_buffer(target).unwrap_or(0);
        let mut s = st.shared();
        let (m, runs) = match s.buffers.get_mut(&b) {
            Some(info) => {
                let m = info.mapped.take();
                let runs = m
                    .as_ref()
                    .map(|m| super::diff::changed_runs(info.shadow.as_deref(), m));
                (m, runs.unwrap_or_default())
            }
            None => (None, Vec::new()),
        };
        drop(s);
        if m.is_none() {
            st.error(GL_INVALID_OPERATION);
        }
        (m, runs)
    };
    let Some(m) = m else { return 0 };
    for (lo, hi) in runs {
        let part = &m[lo..hi];
        // SAFETY: `part` holds its bytes; the generated entry point takes the locks anew
        // (and updates the guest's copy).
        unsafe {
            super::gen::glBufferSubData(
                target,
                lo as isize,
                part.len() as isize,
                part.as_ptr().cast(),
            )
        };
    }
    1
}

/// `glGetBufferPointervOES(target, GL_BUFFER_MAP_POINTER_OES)`.
///
/// # Safety
/// `params` is null or has room for one pointer.
pub(crate) unsafe extern "C" fn glGetBufferPointervOES(
    target: u32,
    pname: u32,
    params: *mut *mut c_void,
) {
    let Some(ctx) = rt::current() else { return };
    let mut st = ctx.gl();
    if pname != 0x88BD {
        st.error(GL_INVALID_ENUM);
        return;
    }
    let b = st.bound_buffer(target).unwrap_or(0);
    let p = st
        .shared()
        .buffers
        .get_mut(&b)
        .and_then(|i| i.mapped.as_mut().map(|m| m.as_mut_ptr().cast::<c_void>()))
        .unwrap_or(std::ptr::null_mut());
    if !params.is_null() {
        // SAFETY: the caller's contract.
        unsafe { *params = p };
    }
}
