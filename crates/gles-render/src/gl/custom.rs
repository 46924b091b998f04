//! Hand-written decoders (the annotation file's `custom=host`/`both`): errors, strings,
//! queries answering names, shader sources. Attribute pointers and draws with client
//! vertex arrays are in `gl::draw`, the GLES 3.0 calls in `gl::es3` and `gl::es3obj`; they
//! are re-exported here, where the generated dispatch looks for them.
//!
//! Payloads (the guest's `gl::custom` writes them):
//! - `glGetError()`: answer `u32`.
//! - `glGetString(name)`: answer the string's bytes (no NUL), null when GL has none.
//! - `glGetIntegerv(pname)`: answer the values' bytes; binding queries answer guest names.
//! - `glShaderSource(shader, bytes)`: the sources joined (rewritten to `highp` where the
//!   host computes the guest's precisions so: `gl::precision`).

#![allow(non_snake_case)]

use virtsoc_gles_stream::{gl_ops as op, Encoder, Reader};

use super::names::{Kind, Mode};
use super::{
    precision, sz, ContextState, DecodeResult, Gl, Precision, GL_INVALID_ENUM,
    GL_INVALID_OPERATION, GL_INVALID_VALUE,
};

pub(crate) use super::draw::*;
pub(crate) use super::es3::*;
pub(crate) use super::es31::*;
pub(crate) use super::es3obj::*;

pub(crate) fn glGetError(
    gl: &Gl,
    cx: &mut ContextState,
    _r: &mut Reader<'_>,
    reply: &mut Encoder,
) -> DecodeResult {
    let mut e = cx.take_error();
    if e == 0 {
        // SAFETY: a current context.
        e = unsafe { (gl.glGetError)() };
    }
    reply.packet(op::glGetError).u32(e);
    Ok(())
}

pub(crate) fn glGetString(
    gl: &Gl,
    _cx: &mut ContextState,
    r: &mut Reader<'_>,
    reply: &mut Encoder,
) -> DecodeResult {
    let name = r.u32()?;
    // SAFETY: a current context; GL answers null or a static NUL-terminated string.
    let s = unsafe { (gl.glGetString)(name) };
    let mut p = reply.packet(op::glGetString);
    if s.is_null() {
        p.null();
    } else {
        // SAFETY: non-null: a NUL-terminated string GL keeps alive.
        let c = unsafe { std::ffi::CStr::from_ptr(s.cast()) };
        p.bytes(c.to_bytes());
    }
    Ok(())
}

/// The kind of object a binding query answers.
pub(super) fn binding_kind(pname: u32) -> Option<Kind> {
    Some(match pname {
        0x8894 | 0x8895 => Kind::Buffer, // ARRAY_/ELEMENT_ARRAY_BUFFER_BINDING
        // PIXEL_PACK/UNPACK_, UNIFORM_, TRANSFORM_FEEDBACK_, COPY_READ/WRITE_BUFFER_BINDING
        0x88ED | 0x88EF | 0x8A28 | 0x8C8F | 0x8F36 | 0x8F37 => Kind::Buffer,
        // DRAW_/DISPATCH_INDIRECT_, SHADER_STORAGE_, ATOMIC_COUNTER_BUFFER_BINDING (GLES 3.1)
        0x8F43 | 0x90EF | 0x90D3 | 0x92C1 => Kind::Buffer,
        0x825A => Kind::ProgramPipeline,  // PROGRAM_PIPELINE_BINDING
        0x8069 | 0x8514 => Kind::Texture, // TEXTURE_BINDING_2D/_CUBE_MAP
        0x806A | 0x8C1D => Kind::Texture, // TEXTURE_BINDING_3D/_2D_ARRAY
        0x8CA6 | 0x8CAA => Kind::Framebuffer, // (DRAW_)FRAMEBUFFER_BINDING, READ_
        0x8CA7 => Kind::Renderbuffer,     // RENDERBUFFER_BINDING
        0x8B8D => Kind::Program,          // CURRENT_PROGRAM
        0x85B5 => Kind::VertexArray,      // VERTEX_ARRAY_BINDING
        0x8919 => Kind::Sampler,          // SAMPLER_BINDING
        0x8E25 => Kind::TransformFeedback, // TRANSFORM_FEEDBACK_BINDING
        _ => return None,
    })
}

/// The count query of a list-valued query (their lengths depend on the driver).
pub(super) fn list_count(pname: u32) -> Option<u32> {
    match pname {
        0x86A3 => Some(0x86A2), // COMPRESSED_TEXTURE_FORMATS
        0x8DF8 => Some(0x8DF9), // SHADER_BINARY_FORMATS
        0x87FF => Some(0x87FE), // PROGRAM_BINARY_FORMATS
        _ => None,
    }
}

/// `glGet{Integer,Float,Boolean}v(pname)`: answers the values' bytes (`glGetIntegerv` of a
/// binding answers the guest's name). The driver writes into a buffer sized from its own
/// count for list queries, with room to spare for the others.
fn get_values(
    gl: &Gl,
    cx: &mut ContextState,
    r: &mut Reader<'_>,
    reply: &mut Encoder,
    opc: u32,
) -> DecodeResult {
    let pname = r.u32()?;
    let n = match list_count(pname) {
        Some(c) => {
            let mut k = 0i32;
            // SAFETY: a current context; a count query writes one value.
            unsafe { (gl.glGetIntegerv)(c, &mut k) };
            k.clamp(0, 4096) as usize
        }
        None => sz::get_count(pname),
    };
    let mut v = vec![0u32; n + 16];
    // SAFETY: a current context; `v` has room for what `pname` answers (the list queries'
    // counts asked first) and 16 values more.
    unsafe {
        if opc == op::glGetIntegerv {
            (gl.glGetIntegerv)(pname, v.as_mut_ptr().cast());
        } else if opc == op::glGetFloatv {
            (gl.glGetFloatv)(pname, v.as_mut_ptr().cast());
        } else {
            (gl.glGetBooleanv)(pname, v.as_mut_ptr().cast());
        }
    }
    let b: Vec<u8> = if opc == op::glGetBooleanv {
        // Booleans are one byte each.
        v.iter().flat_map(|x| x.to_ne_bytes()).take(n).collect()
    } else {
        if opc == op::glGetIntegerv {
            if let Some(k) = binding_kind(pname) {
                v[0] = cx.share().guest_of(k, v[0]);
            }
        }
        v[..n].iter().flat_map(|x| x.to_ne_bytes()).collect()
    };
    reply.packet(opc).bytes(&b);
    Ok(())
}

pub(crate) fn glGetIntegerv(
    gl: &Gl,
    cx: &mut ContextState,
    r: &mut Reader<'_>,
    reply: &mut Encoder,
) -> DecodeResult {
    get_values(gl, cx, r, reply, op::glGetIntegerv)
}

pub(crate) fn glGetFloatv(
    gl: &Gl,
    cx: &mut ContextState,
    r: &mut Reader<'_>,
    reply: &mut Encoder,
) -> DecodeResult {
    get_values(gl, cx, r, reply, op::glGetFloatv)
}

pub(crate) fn glGetBooleanv(
    gl: &Gl,
    cx: &mut ContextState,
    r: &mut Reader<'_>,
    reply: &mut Encoder,
) -> DecodeResult {
    get_values(gl, cx, r, reply, op::glGetBooleanv)
}

pub(crate) fn glShaderBinary(
    _gl: &Gl,
    cx: &mut ContextState,
    _r: &mut Reader<'_>,
    _reply: &mut Encoder,
) -> DecodeResult {
    // No binary formats are exposed.
    cx.error(GL_INVALID_ENUM);
    Ok(())
}

pub(crate) fn glShaderSource(
    gl: &Gl,
    cx: &mut ContextState,
    r: &mut Reader<'_>,
    _reply: &mut Encoder,
) -> DecodeResult {
    let shader = r.u32()?;
    let src = r.bytes()?.unwrap_or(&[]);
    let r_src = src;
    let Some(shader) = cx.host_name(gl, Kind::Shader, shader, Mode::Use) else {
        return Ok(());
    };
    let src = host_source(gl, cx, src);
    // The guest reads its own text back (`GL_SHADER_SOURCE_LENGTH`, `glGetShaderSource`:
    // glmark2 checks the length), up to a NUL as the driver would keep it.
    let guest_text = matches!(src, std::borrow::Cow::Owned(_)).then(|| {
        let raw = r_src;
        raw[..raw.iter().position(|b| *b == 0).unwrap_or(raw.len())].to_vec()
    });
    cx.share().set_guest_source(shader, guest_text);
    let Ok(len) = i32::try_from(src.len()) else {
        cx.error(GL_INVALID_VALUE);
        return Ok(());
    };
    let ptr = src.as_ptr().cast::<std::ffi::c_char>();
    // SAFETY: a current context; one string of `len` bytes (no NUL needed with a length).
    unsafe { (gl.glShaderSource)(shader, 1, &ptr, &len) };
    Ok(())
}

/// A guest shader's source as the host's driver compiles it: rewritten to `highp` where the
/// context's precision says so (resolved against the renderer on first use).
pub(super) fn host_source<'a>(
    gl: &Gl,
    cx: &mut ContextState,
    src: &'a [u8],
) -> std::borrow::Cow<'a, [u8]> {
    if cx.precision == Precision::Auto {
        cx.precision = Precision::Auto.resolve(&precision::renderer(gl));
        log::debug!("gles decoder: shader precision {}", cx.precision.name());
    }
    if cx.precision == Precision::Highp {
        precision::to_highp(src)
    } else {
        std::borrow::Cow::Borrowed(src)
    }
}

pub(crate) fn glGetAttachedShaders(
    gl: &Gl,
    cx: &mut ContextState,
    r: &mut Reader<'_>,
    reply: &mut Encoder,
) -> DecodeResult {
    let (program, max) = (r.u32()?, r.i32()?);
    let mut p = reply.packet(op::glGetAttachedShaders);
    let Some(program) = cx.host_name(gl, Kind::Program, program, Mode::Use) else {
        p.null().null();
        return Ok(());
    };
    let max = max.clamp(0, 64);
    let mut count = 0i32;
    let mut v = vec![0u32; max as usize];
    // SAFETY: a current context; `v` has room for `max` names.
    unsafe { (gl.glGetAttachedShaders)(program, max, &mut count, v.as_mut_ptr()) };
    let count = count.clamp(0, max);
    let s = cx.share();
    let names: Vec<u8> = v[..count as usize]
        .iter()
        .flat_map(|h| s.guest_of(Kind::Shader, *h).to_le_bytes())
        .collect();
    p.bytes(&count.to_le_bytes()).bytes(&names);
    Ok(())
}

/// Values of the uniform at `location` of (host) `program`: its type's component count
/// times... one element; `None` when no active uniform has that location.
fn uniform_values(gl: &Gl, program: u32, location: i32) -> Option<usize> {
    let mut n = 0i32;
    // SAFETY: a current context; one value.
    unsafe {
        (gl.glGetProgramiv)(program, 0x8B86 /* ACTIVE_UNIFORMS */, &mut n)
    };
    for i in 0..n.max(0) as u32 {
        let (mut len, mut size, mut ty) = (0i32, 0i32, 0u32);
        let mut name = [0u8; 256];
        // SAFETY: a current context; `name` has room for 256 bytes, the others one value.
        unsafe {
            (gl.glGetActiveUniform)(
                program,
                i,
                256,
                &mut len,
                &mut size,
                &mut ty,
                name.as_mut_ptr().cast(),
            )
        };
        // SAFETY: GL wrote a NUL-terminated name into `name` (zeroed, bufSize 256).
        let loc = unsafe { (gl.glGetUniformLocation)(program, name.as_ptr().cast()) };
        if loc >= 0 && location >= loc && location < loc.saturating_add(size.max(1)) {
            return Some(match ty {
                // FLOAT_VEC2, INT_VEC2, BOOL_VEC2, UNSIGNED_INT_VEC2
                0x8B50 | 0x8B53 | 0x8B57 | 0x8DC6 => 2,
                0x8B51 | 0x8B54 | 0x8B58 | 0x8DC7 => 3,
                0x8B52 | 0x8B55 | 0x8B59 | 0x8B5A | 0x8DC8 => 4, // ..._VEC4, FLOAT_MAT2
                0x8B65 | 0x8B67 => 6,                            // FLOAT_MAT2x3, 3x2
                0x8B66 | 0x8B69 => 8,                            // FLOAT_MAT2x4, 4x2
                0x8B68 | 0x8B6A => 12,                           // FLOAT_MAT3x4, 4x3
                0x8B5B => 9,
                0x8B5C => 16,
                _ => 1,
            });
        }
    }
    None
}

fn get_uniform(
    gl: &Gl,
    cx: &mut ContextState,
    r: &mut Reader<'_>,
    reply: &mut Encoder,
    opc: u32,
) -> DecodeResult {
    let (program, location) = (r.u32()?, r.i32()?);
    let mut p = reply.packet(opc);
    let Some(program) = cx.host_name(gl, Kind::Program, program, Mode::Use) else {
        p.null();
        return Ok(());
    };
    let Some(n) = uniform_values(gl, program, location) else {
        cx.error(GL_INVALID_OPERATION);
        p.null();
        return Ok(());
    };
    let mut v = [0u32; 16];
    // SAFETY: a current context; `v` has room for the 16 values of the largest uniform.
    unsafe {
        if opc == op::glGetUniformfv {
            (gl.glGetUniformfv)(program, location, v.as_mut_ptr().cast());
        } else if opc == op::glGetUniformiv {
            (gl.glGetUniformiv)(program, location, v.as_mut_ptr().cast());
        } else if let Some(f) = gl.glGetUniformuiv {
            f(program, location, v.as_mut_ptr());
        } else {
            cx.error(GL_INVALID_OPERATION);
        }
    }
    let b: Vec<u8> = v[..n].iter().flat_map(|x| x.to_ne_bytes()).collect();
    p.bytes(&b);
    Ok(())
}

pub(crate) fn glGetUniformfv(
    gl: &Gl,
    cx: &mut ContextState,
    r: &mut Reader<'_>,
    reply: &mut Encoder,
) -> DecodeResult {
    get_uniform(gl, cx, r, reply, op::glGetUniformfv)
}

pub(crate) fn glGetUniformiv(
    gl: &Gl,
    cx: &mut ContextState,
    r: &mut Reader<'_>,
    reply: &mut Encoder,
) -> DecodeResult {
    get_uniform(gl, cx, r, reply, op::glGetUniformiv)
}

pub(crate) fn glGetUniformuiv(
    gl: &Gl,
    cx: &mut ContextState,
    r: &mut Reader<'_>,
    reply: &mut Encoder,
) -> DecodeResult {
    get_uniform(gl, cx, r, reply, op::glGetUniformuiv)
}

pub(crate) fn glMapBufferOES(
    _gl: &Gl,
    cx: &mut ContextState,
    _r: &mut Reader<'_>,
    _reply: &mut Encoder,
) -> DecodeResult {
    // Mapping happens in guest memory; never sent.
    cx.error(GL_INVALID_OPERATION);
    Ok(())
}

pub(crate) fn glUnmapBufferOES(
    gl: &Gl,
    cx: &mut ContextState,
    r: &mut Reader<'_>,
    reply: &mut Encoder,
) -> DecodeResult {
    glMapBufferOES(gl, cx, r, reply)
}

pub(crate) fn glGetBufferPointervOES(
    gl: &Gl,
    cx: &mut ContextState,
    r: &mut Reader<'_>,
    reply: &mut Encoder,
) -> DecodeResult {
    glMapBufferOES(gl, cx, r, reply)
}

/// `glEGLImageTargetTexture2DOES`: the guest names its image in an EGL packet
/// (`IMAGE_TARGET_TEXTURE`, the worker's `crate::image`); this opcode is never sent.
pub(crate) fn glEGLImageTargetTexture2DOES(
    _gl: &Gl,
    cx: &mut ContextState,
    _r: &mut Reader<'_>,
    _reply: &mut Encoder,
) -> DecodeResult {
    cx.error(GL_INVALID_OPERATION);
    Ok(())
}
