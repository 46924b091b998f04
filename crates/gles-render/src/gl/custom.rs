//! Hand-written decoders (the annotation file's `custom=host`/`both`): errors, strings,
//! queries answering names, shader sources, and draws with client vertex arrays.
//!
//! Payloads (the guest's `gl::custom` writes them):
//! - `glGetError()`: answer `u32`.
//! - `glGetString(name)`: answer the string's bytes (no NUL), null when GL has none.
//! - `glGetIntegerv(pname)`: answer the values' bytes; binding queries answer guest names.
//! - `glVertexAttribPointer(index, size, type, normalized, stride, offset u64)`: only with an
//!   `ARRAY_BUFFER` bound (client arrays travel with the draw).
//! - `glDrawArrays(mode, first, count) client`; `glDrawElements(mode, count, type, kind u32,
//!   offset u64 (kind 0) | index bytes (kind 1)) client`, where `client` is `base u32,
//!   nverts u32, nattr u32` then per attribute `index, size, type, normalized, bytes` holding
//!   vertices `base..base+nverts` tightly packed.
//! - `glShaderSource(shader, bytes)`: the sources joined.

#![allow(non_snake_case)]

use std::ffi::c_void;

use virtsoc_gles_stream::{gl_ops as op, Encoder, Reader};

use super::hooks::{binding, ARRAY_BUFFER_BINDING, ELEMENT_ARRAY_BUFFER_BINDING};
use super::names::{Kind, Mode};
use super::{
    sz, ContextState, DecodeResult, Gl, GL_INVALID_ENUM, GL_INVALID_OPERATION, GL_INVALID_VALUE,
};

const GL_ARRAY_BUFFER: u32 = 0x8892;
const GL_ELEMENT_ARRAY_BUFFER: u32 = 0x8893;
const GL_STREAM_DRAW: u32 = 0x88E0;

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
fn binding_kind(pname: u32) -> Option<Kind> {
    Some(match pname {
        0x8894 | 0x8895 => Kind::Buffer, // ARRAY_/ELEMENT_ARRAY_BUFFER_BINDING
        0x8069 | 0x8514 => Kind::Texture, // TEXTURE_BINDING_2D/_CUBE_MAP
        0x8CA6 => Kind::Framebuffer,     // FRAMEBUFFER_BINDING
        0x8CA7 => Kind::Renderbuffer,    // RENDERBUFFER_BINDING
        0x8B8D => Kind::Program,         // CURRENT_PROGRAM
        _ => return None,
    })
}

/// The count query of a list-valued query (their lengths depend on the driver).
fn list_count(pname: u32) -> Option<u32> {
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

pub(crate) fn glVertexAttribPointer(
    gl: &Gl,
    cx: &mut ContextState,
    r: &mut Reader<'_>,
    _reply: &mut Encoder,
) -> DecodeResult {
    let (index, size, ty, norm, stride, off) =
        (r.u32()?, r.i32()?, r.u32()?, r.u32()?, r.i32()?, r.u64()?);
    if binding(gl, ARRAY_BUFFER_BINDING) == 0 {
        // An offset without a buffer would be a pointer into the worker.
        cx.error(GL_INVALID_OPERATION);
        return Ok(());
    }
    // SAFETY: a current context; with a buffer bound the pointer is an offset into it.
    unsafe {
        (gl.glVertexAttribPointer)(
            index,
            size,
            ty,
            norm as u8,
            stride,
            off as usize as *const c_void,
        )
    };
    Ok(())
}

pub(crate) fn glGetVertexAttribPointerv(
    _gl: &Gl,
    cx: &mut ContextState,
    _r: &mut Reader<'_>,
    _reply: &mut Encoder,
) -> DecodeResult {
    // Answered in the guest; never sent.
    cx.error(GL_INVALID_OPERATION);
    Ok(())
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
    let Some(shader) = cx.host_name(gl, Kind::Shader, shader, Mode::Use) else {
        return Ok(());
    };
    let Ok(len) = i32::try_from(src.len()) else {
        cx.error(GL_INVALID_VALUE);
        return Ok(());
    };
    let ptr = src.as_ptr().cast::<std::ffi::c_char>();
    // SAFETY: a current context; one string of `len` bytes (no NUL needed with a length).
    unsafe { (gl.glShaderSource)(shader, 1, &ptr, &len) };
    Ok(())
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
                0x8B50 | 0x8B53 | 0x8B57 => 2, // FLOAT_VEC2, INT_VEC2, BOOL_VEC2
                0x8B51 | 0x8B54 | 0x8B58 => 3,
                0x8B52 | 0x8B55 | 0x8B59 | 0x8B5A => 4, // ..._VEC4, FLOAT_MAT2
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
    float: bool,
) -> DecodeResult {
    let (program, location) = (r.u32()?, r.i32()?);
    let opc = if float {
        op::glGetUniformfv
    } else {
        op::glGetUniformiv
    };
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
        if float {
            (gl.glGetUniformfv)(program, location, v.as_mut_ptr().cast());
        } else {
            (gl.glGetUniformiv)(program, location, v.as_mut_ptr().cast());
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
    get_uniform(gl, cx, r, reply, true)
}

pub(crate) fn glGetUniformiv(
    gl: &Gl,
    cx: &mut ContextState,
    r: &mut Reader<'_>,
    reply: &mut Encoder,
) -> DecodeResult {
    get_uniform(gl, cx, r, reply, false)
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

/// A client attribute sent with a draw.
struct ClientAttrib<'a> {
    index: u32,
    size: i32,
    ty: u32,
    normalized: bool,
    data: &'a [u8],
}

/// The client block of a draw: `(base, nverts, attributes)`; attributes checked against
/// `nverts` (`None`: an error was recorded).
#[allow(clippy::type_complexity)]
fn read_client<'a>(
    cx: &mut ContextState,
    r: &mut Reader<'a>,
) -> Result<Option<(u32, u32, Vec<ClientAttrib<'a>>)>, virtsoc_gles_stream::StreamError> {
    let (base, nverts, nattr) = (r.u32()?, r.u32()?, r.u32()?);
    let mut attrs = Vec::new();
    let mut ok = true;
    for _ in 0..nattr.min(64) {
        let (index, size, ty, normalized) = (r.u32()?, r.i32()?, r.u32()?, r.u32()? != 0);
        let data = r.bytes()?.unwrap_or(&[]);
        let need = sz::attrib_type_bytes(ty)
            .filter(|_| (1..=4).contains(&size))
            .and_then(|b| b.checked_mul(size as usize)?.checked_mul(nverts as usize));
        match need {
            Some(n) if data.len() >= n && index < 64 => attrs.push(ClientAttrib {
                index,
                size,
                ty,
                normalized,
                data,
            }),
            _ => ok = false,
        }
    }
    if !ok || nattr > 64 {
        cx.error(GL_INVALID_VALUE);
        return Ok(None);
    }
    Ok(Some((base, nverts, attrs)))
}

/// Checks that every enabled attribute reads from a buffer (a client pointer would read the
/// worker's memory), client ones excepted (they are about to be uploaded).
fn attribs_are_buffers(gl: &Gl, cx: &mut ContextState, client: &[ClientAttrib<'_>]) -> bool {
    if cx.max_attribs == 0 {
        let mut m = 0i32;
        // SAFETY: a current context; one value.
        unsafe {
            (gl.glGetIntegerv)(0x8869 /* MAX_VERTEX_ATTRIBS */, &mut m)
        };
        cx.max_attribs = m.clamp(1, 64) as u32;
    }
    for i in 0..cx.max_attribs {
        if client.iter().any(|a| a.index == i) {
            continue;
        }
        let (mut enabled, mut buf) = (0i32, 0i32);
        // SAFETY: a current context; `i` below MAX_VERTEX_ATTRIBS; one value each.
        unsafe {
            (gl.glGetVertexAttribiv)(i, 0x8622 /* ENABLED */, &mut enabled);
            (gl.glGetVertexAttribiv)(i, 0x889F /* BUFFER_BINDING */, &mut buf);
        }
        if enabled != 0 && buf == 0 {
            return false;
        }
    }
    true
}

/// Uploads client attributes to the scratch buffer and points them at it.
fn upload_client(gl: &Gl, cx: &mut ContextState, attrs: &[ClientAttrib<'_>]) {
    if attrs.is_empty() {
        return;
    }
    if cx.scratch_vbo == 0 {
        // SAFETY: a current context; room for one name.
        unsafe { (gl.glGenBuffers)(1, &mut cx.scratch_vbo) };
    }
    let mut offs = Vec::with_capacity(attrs.len());
    let mut total = 0usize;
    for a in attrs {
        offs.push(total);
        total += a.data.len().div_ceil(4) * 4;
    }
    let prev = binding(gl, ARRAY_BUFFER_BINDING);
    // SAFETY: a current context; every data pointer holds `data.len()` bytes of the packet,
    // the buffer is `total` bytes and each attribute's range lies inside it.
    unsafe {
        (gl.glBindBuffer)(GL_ARRAY_BUFFER, cx.scratch_vbo);
        (gl.glBufferData)(
            GL_ARRAY_BUFFER,
            total as isize,
            std::ptr::null(),
            GL_STREAM_DRAW,
        );
        for (a, off) in attrs.iter().zip(&offs) {
            (gl.glBufferSubData)(
                GL_ARRAY_BUFFER,
                *off as isize,
                a.data.len() as isize,
                a.data.as_ptr().cast(),
            );
            let elem = sz::attrib_type_bytes(a.ty).unwrap_or(4) * a.size as usize;
            (gl.glVertexAttribPointer)(
                a.index,
                a.size,
                a.ty,
                a.normalized as u8,
                elem as i32,
                *off as *const c_void,
            );
        }
        (gl.glBindBuffer)(GL_ARRAY_BUFFER, prev);
    }
}

pub(crate) fn glDrawArrays(
    gl: &Gl,
    cx: &mut ContextState,
    r: &mut Reader<'_>,
    _reply: &mut Encoder,
) -> DecodeResult {
    let (mode, first, count) = (r.u32()?, r.i32()?, r.i32()?);
    let Some((base, nverts, attrs)) = read_client(cx, r)? else {
        return Ok(());
    };
    if first < 0 || count < 0 {
        cx.error(GL_INVALID_VALUE);
        return Ok(());
    }
    if count == 0 {
        return Ok(());
    }
    let mut first = first;
    if !attrs.is_empty() {
        // The client arrays hold vertices base..base+nverts: the draw must stay inside.
        let end = first as u64 + count as u64;
        if (first as u64) < base as u64 || end > base as u64 + nverts as u64 {
            cx.error(GL_INVALID_VALUE);
            return Ok(());
        }
        first -= base as i32;
    }
    if !attribs_are_buffers(gl, cx, &attrs) {
        cx.error(GL_INVALID_OPERATION);
        return Ok(());
    }
    upload_client(gl, cx, &attrs);
    // SAFETY: a current context; every enabled attribute reads a buffer.
    unsafe { (gl.glDrawArrays)(mode, first, count) };
    Ok(())
}

pub(crate) fn glDrawElements(
    gl: &Gl,
    cx: &mut ContextState,
    r: &mut Reader<'_>,
    _reply: &mut Encoder,
) -> DecodeResult {
    let (mode, count, ty, kind) = (r.u32()?, r.i32()?, r.u32()?, r.u32()?);
    let (offset, indices) = if kind == 0 {
        (r.u64()?, None)
    } else {
        (0, Some(r.bytes()?.unwrap_or(&[])))
    };
    let Some((base, nverts, attrs)) = read_client(cx, r)? else {
        return Ok(());
    };
    let Ok(n) = usize::try_from(count) else {
        cx.error(GL_INVALID_VALUE);
        return Ok(());
    };
    let Some(ib) = sz::index_bytes(ty) else {
        cx.error(GL_INVALID_ENUM);
        return Ok(());
    };
    if n == 0 {
        return Ok(());
    }
    if !attribs_are_buffers(gl, cx, &attrs) {
        cx.error(GL_INVALID_OPERATION);
        return Ok(());
    }
    let element_buffer = binding(gl, ELEMENT_ARRAY_BUFFER_BINDING);
    let Some(indices) = indices else {
        // Indices in the bound element buffer: the driver reads them; no client arrays then.
        if element_buffer == 0 || !attrs.is_empty() {
            cx.error(GL_INVALID_OPERATION);
            return Ok(());
        }
        // SAFETY: a current context; the offset is into the bound element buffer.
        unsafe { (gl.glDrawElements)(mode, count, ty, offset as usize as *const c_void) };
        return Ok(());
    };
    let Some(need) = n.checked_mul(ib).filter(|b| *b <= indices.len()) else {
        cx.error(GL_INVALID_VALUE);
        return Ok(());
    };
    let indices = &indices[..need];
    let mut rebased: Vec<u8>;
    let mut ptr = indices.as_ptr();
    if !attrs.is_empty() {
        let Some((lo, hi)) = sz::index_range(indices, ty, n) else {
            cx.error(GL_INVALID_VALUE);
            return Ok(());
        };
        if lo < base || hi as u64 >= base as u64 + nverts as u64 {
            cx.error(GL_INVALID_VALUE);
            return Ok(());
        }
        if base != 0 {
            rebased = Vec::with_capacity(need);
            for c in indices.chunks_exact(ib) {
                match ib {
                    1 => rebased.push(c[0] - base as u8),
                    2 => rebased
                        .extend((u16::from_le_bytes([c[0], c[1]]) - base as u16).to_le_bytes()),
                    _ => rebased.extend(
                        (u32::from_le_bytes([c[0], c[1], c[2], c[3]]) - base).to_le_bytes(),
                    ),
                }
            }
            ptr = rebased.as_ptr();
        }
    }
    upload_client(gl, cx, &attrs);
    // SAFETY: a current context; `ptr` holds `count` indices of `ty` (checked); with no
    // element buffer bound for the call the driver reads them from here.
    unsafe {
        if element_buffer != 0 {
            (gl.glBindBuffer)(GL_ELEMENT_ARRAY_BUFFER, 0);
        }
        (gl.glDrawElements)(mode, count, ty, ptr.cast());
        if element_buffer != 0 {
            (gl.glBindBuffer)(GL_ELEMENT_ARRAY_BUFFER, element_buffer);
        }
    }
    Ok(())
}
