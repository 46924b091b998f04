//! Attribute pointers and draws with client vertex arrays (GLES 2.0's and GLES 3.0's
//! instanced draws and integer attributes). A client array arrives with its draw; after
//! checking that it holds every element the draw reads (vertices `base..base+nverts`, or
//! for an attribute with a divisor, asked of the driver, `ceil(instances / divisor)`
//! elements) the attribute is pointed at its bytes in the batch for the draw, or, once
//! the context has bound a vertex array object, uploaded to the context's scratch buffer.
//!
//! Payloads (the guest's `gl::draw` writes them):
//! - `glVertexAttribPointer(index, size, type, normalized, stride, offset u64)` and
//!   `glVertexAttribIPointer(index, size, type, stride, offset u64)`: only with an
//!   `ARRAY_BUFFER` bound (client arrays travel with the draw).
//! - `glDrawArrays(mode, first, count) client`, `glDrawArraysInstanced(mode, first, count,
//!   instances) client`; `glDrawElements(mode, count, type, kind u32, offset u64 (kind 0) |
//!   index bytes (kind 1)) client`, `glDrawElementsInstanced(mode, count, type, instances,
//!   kind, ...) client`, where `client` is `base u32, nverts u32, nattr u32` then per
//!   attribute `index, size, type, flags (1 normalized, 2 integer), bytes`, tightly packed.

#![allow(non_snake_case)]

use std::ffi::c_void;

use virtsoc_gles_stream::{Encoder, Reader, StreamError};

use super::hooks::{binding, ARRAY_BUFFER_BINDING, ELEMENT_ARRAY_BUFFER_BINDING};
use super::{
    sz, ContextState, DecodeResult, Gl, GL_INVALID_ENUM, GL_INVALID_OPERATION, GL_INVALID_VALUE,
};

const GL_ARRAY_BUFFER: u32 = 0x8892;
const GL_ELEMENT_ARRAY_BUFFER: u32 = 0x8893;
const GL_STREAM_DRAW: u32 = 0x88E0;
/// `GL_VERTEX_ATTRIB_ARRAY_DIVISOR`.
const ATTRIB_DIVISOR: u32 = 0x88FE;

fn attrib_pointer(
    gl: &Gl,
    cx: &mut ContextState,
    r: &mut Reader<'_>,
    integer: bool,
) -> DecodeResult {
    let (index, size, ty) = (r.u32()?, r.i32()?, r.u32()?);
    let norm = if integer { 0 } else { r.u32()? };
    let (stride, off) = (r.i32()?, r.u64()?);
    if binding(gl, ARRAY_BUFFER_BINDING) == 0 {
        // An offset without a buffer would be a pointer into the worker.
        cx.error(GL_INVALID_OPERATION);
        return Ok(());
    }
    let ptr = off as usize as *const c_void;
    // SAFETY: a current context; with a buffer bound the pointer is an offset into it.
    unsafe {
        if !integer {
            (gl.glVertexAttribPointer)(index, size, ty, norm as u8, stride, ptr);
        } else if let Some(f) = gl.glVertexAttribIPointer {
            f(index, size, ty, stride, ptr);
        } else {
            cx.error(GL_INVALID_OPERATION);
        }
    }
    Ok(())
}

pub(crate) fn glVertexAttribPointer(
    gl: &Gl,
    cx: &mut ContextState,
    r: &mut Reader<'_>,
    _reply: &mut Encoder,
) -> DecodeResult {
    attrib_pointer(gl, cx, r, false)
}

pub(crate) fn glVertexAttribIPointer(
    gl: &Gl,
    cx: &mut ContextState,
    r: &mut Reader<'_>,
    _reply: &mut Encoder,
) -> DecodeResult {
    attrib_pointer(gl, cx, r, true)
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

pub(crate) fn glDrawRangeElements(
    _gl: &Gl,
    cx: &mut ContextState,
    _r: &mut Reader<'_>,
    _reply: &mut Encoder,
) -> DecodeResult {
    // The guest sends glDrawElements; never sent.
    cx.error(GL_INVALID_OPERATION);
    Ok(())
}

/// A client attribute sent with a draw.
struct ClientAttrib<'a> {
    index: u32,
    size: i32,
    ty: u32,
    flags: u32,
    /// 0: per vertex (the data holds vertices `base..`), else per `divisor` instances.
    divisor: u32,
    data: &'a [u8],
}

/// The divisor of attribute `index` on the driver (0 unless the guest ever set one).
fn divisor(gl: &Gl, cx: &ContextState, index: u32) -> u32 {
    if !cx.es3.divisors_used {
        return 0;
    }
    let mut d = 0i32;
    // SAFETY: a current context; `index` checked below the driver's attribute count by the
    // caller; one value.
    unsafe { (gl.glGetVertexAttribiv)(index, ATTRIB_DIVISOR, &mut d) };
    d.max(0) as u32
}

/// The client block of a draw of `instances` instances: `(base, nverts, attributes)`;
/// attributes checked against what the draw reads (`None`: an error was recorded).
#[allow(clippy::type_complexity)]
fn read_client<'a>(
    gl: &Gl,
    cx: &mut ContextState,
    r: &mut Reader<'a>,
    instances: u32,
) -> Result<Option<(u32, u32, Vec<ClientAttrib<'a>>)>, StreamError> {
    let (base, nverts, nattr) = (r.u32()?, r.u32()?, r.u32()?);
    let max = max_attribs(gl, cx);
    let mut attrs = Vec::new();
    let mut ok = nattr <= 64;
    for _ in 0..nattr.min(64) {
        let (index, size, ty, flags) = (r.u32()?, r.i32()?, r.u32()?, r.u32()?);
        let data = r.bytes()?.unwrap_or(&[]);
        if index >= max {
            ok = false;
            continue;
        }
        let d = divisor(gl, cx, index);
        let elems = if d == 0 {
            nverts as usize
        } else {
            (instances.max(1) as usize).div_ceil(d as usize)
        };
        let need = sz::attrib_type_bytes(ty)
            .filter(|_| (1..=4).contains(&size))
            .and_then(|b| b.checked_mul(size as usize)?.checked_mul(elems));
        match need {
            Some(n) if data.len() >= n => attrs.push(ClientAttrib {
                index,
                size,
                ty,
                flags,
                divisor: d,
                data,
            }),
            _ => ok = false,
        }
    }
    if !ok {
        cx.error(GL_INVALID_VALUE);
        return Ok(None);
    }
    Ok(Some((base, nverts, attrs)))
}

/// `GL_MAX_VERTEX_ATTRIBS` of the driver, asked once.
fn max_attribs(gl: &Gl, cx: &mut ContextState) -> u32 {
    if cx.max_attribs == 0 {
        let mut m = 0i32;
        // SAFETY: a current context; one value.
        unsafe {
            (gl.glGetIntegerv)(0x8869 /* MAX_VERTEX_ATTRIBS */, &mut m)
        };
        cx.max_attribs = m.clamp(1, 64) as u32;
    }
    cx.max_attribs
}

/// Checks that every enabled attribute reads from a buffer (a client pointer would read the
/// worker's memory), client ones excepted (they are about to be uploaded).
fn attribs_are_buffers(gl: &Gl, cx: &mut ContextState, client: &[ClientAttrib<'_>]) -> bool {
    for i in 0..max_attribs(gl, cx) {
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

/// Points client attributes at their bytes in the batch, which stays where it is for the
/// draw: the driver reads them during the call as it reads a native program's client
/// arrays (no buffer to fill: one copy of the vertices less per draw, and no storage
/// orphaned). With a vertex array object possibly bound (GLES 3.0 refuses client pointers
/// then) they go to the scratch buffer instead ([`upload_client`]).
fn point_client(gl: &Gl, cx: &mut ContextState, attrs: &[ClientAttrib<'_>]) {
    if attrs.is_empty() {
        return;
    }
    if cx.es3.vertex_arrays_used {
        upload_client(gl, cx, attrs);
        return;
    }
    let prev = binding(gl, ARRAY_BUFFER_BINDING);
    // SAFETY: a current context with no vertex array object bound (the guest never bound
    // one on it); each pointer is the start of `data`, which holds every element the draw
    // reads (`read_client`) and lives in the batch until the draw returns. Only this
    // draw's client attributes are pointed here; a later draw that does not send an
    // enabled attribute's bytes again is refused (`attribs_are_buffers`: no buffer).
    unsafe {
        if prev != 0 {
            (gl.glBindBuffer)(GL_ARRAY_BUFFER, 0);
        }
        for a in attrs {
            set_pointer(gl, a, a.data.as_ptr().cast());
        }
        if prev != 0 {
            (gl.glBindBuffer)(GL_ARRAY_BUFFER, prev);
        }
    }
}

/// Points attribute `a` at `ptr` (an offset into the bound array buffer, or client
/// memory), tightly packed.
///
/// # Safety
/// A current context; `ptr` is what the driver may read for `a`.
unsafe fn set_pointer(gl: &Gl, a: &ClientAttrib<'_>, ptr: *const c_void) {
    let elem = sz::attrib_type_bytes(a.ty).unwrap_or(4) * a.size as usize;
    // SAFETY: the caller's contract.
    unsafe {
        match (a.flags & 2 != 0, gl.glVertexAttribIPointer) {
            (true, Some(f)) => f(a.index, a.size, a.ty, elem as i32, ptr),
            _ => (gl.glVertexAttribPointer)(
                a.index,
                a.size,
                a.ty,
                (a.flags & 1) as u8,
                elem as i32,
                ptr,
            ),
        }
    }
}

/// Uploads client attributes to the scratch buffer and points them at it.
fn upload_client(gl: &Gl, cx: &mut ContextState, attrs: &[ClientAttrib<'_>]) {
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
            set_pointer(gl, a, *off as *const c_void);
        }
        (gl.glBindBuffer)(GL_ARRAY_BUFFER, prev);
    }
}

/// `glDrawArrays` and `glDrawArraysInstanced` (`inst`).
fn draw_arrays(gl: &Gl, cx: &mut ContextState, r: &mut Reader<'_>, inst: bool) -> DecodeResult {
    let (mode, first, count) = (r.u32()?, r.i32()?, r.i32()?);
    let instances = if inst { r.i32()? } else { 1 };
    if first < 0 || count < 0 || instances < 0 {
        cx.error(GL_INVALID_VALUE);
        return Ok(());
    }
    let Some((base, nverts, attrs)) = read_client(gl, cx, r, instances as u32)? else {
        return Ok(());
    };
    if count == 0 || instances == 0 {
        return Ok(());
    }
    let mut first = first;
    if attrs.iter().any(|a| a.divisor == 0) {
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
    point_client(gl, cx, &attrs);
    // SAFETY: a current context; every enabled attribute reads a buffer holding what the
    // draw reads.
    unsafe {
        if !inst {
            (gl.glDrawArrays)(mode, first, count);
        } else if let Some(f) = gl.glDrawArraysInstanced {
            f(mode, first, count, instances);
        } else {
            cx.error(GL_INVALID_OPERATION);
        }
    }
    Ok(())
}

pub(crate) fn glDrawArrays(
    gl: &Gl,
    cx: &mut ContextState,
    r: &mut Reader<'_>,
    _reply: &mut Encoder,
) -> DecodeResult {
    draw_arrays(gl, cx, r, false)
}

pub(crate) fn glDrawArraysInstanced(
    gl: &Gl,
    cx: &mut ContextState,
    r: &mut Reader<'_>,
    _reply: &mut Encoder,
) -> DecodeResult {
    draw_arrays(gl, cx, r, true)
}

/// The driver's draw of `count` indices of `ty` at `ptr` (an offset into the element buffer
/// or client memory), instanced when `inst` is given.
///
/// # Safety
/// A current context; `ptr` is what the driver may read for this draw.
unsafe fn elements_call(
    gl: &Gl,
    cx: &mut ContextState,
    mode: u32,
    count: i32,
    ty: u32,
    ptr: *const c_void,
    inst: Option<i32>,
) {
    // SAFETY: the caller's contract.
    unsafe {
        match inst {
            None => (gl.glDrawElements)(mode, count, ty, ptr),
            Some(i) => match gl.glDrawElementsInstanced {
                Some(f) => f(mode, count, ty, ptr, i),
                None => cx.error(GL_INVALID_OPERATION),
            },
        }
    }
}

/// Rebases `indices` (of `ib` bytes each, all >= `base`) to start at 0.
fn rebase(indices: &[u8], ib: usize, base: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(indices.len());
    for c in indices.chunks_exact(ib) {
        match ib {
            1 => out.push(c[0] - base as u8),
            2 => out.extend((u16::from_le_bytes([c[0], c[1]]) - base as u16).to_le_bytes()),
            _ => out.extend((u32::from_le_bytes([c[0], c[1], c[2], c[3]]) - base).to_le_bytes()),
        }
    }
    out
}

/// `glDrawElements` and `glDrawElementsInstanced` (`inst`).
fn draw_elements(gl: &Gl, cx: &mut ContextState, r: &mut Reader<'_>, inst: bool) -> DecodeResult {
    let (mode, count, ty) = (r.u32()?, r.i32()?, r.u32()?);
    let instances = if inst { Some(r.i32()?) } else { None };
    let kind = r.u32()?;
    let (offset, indices) = if kind == 0 {
        (r.u64()?, None)
    } else {
        (0, Some(r.bytes()?.unwrap_or(&[])))
    };
    let n_inst = instances.unwrap_or(1);
    if n_inst < 0 {
        cx.error(GL_INVALID_VALUE);
        return Ok(());
    }
    let Some((base, nverts, attrs)) = read_client(gl, cx, r, n_inst as u32)? else {
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
    if n == 0 || n_inst == 0 {
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
        unsafe {
            elements_call(
                gl,
                cx,
                mode,
                count,
                ty,
                offset as usize as *const c_void,
                instances,
            )
        };
        return Ok(());
    };
    let Some(need) = n.checked_mul(ib).filter(|b| *b <= indices.len()) else {
        cx.error(GL_INVALID_VALUE);
        return Ok(());
    };
    let indices = &indices[..need];
    let rebased: Vec<u8>;
    let mut ptr = indices.as_ptr();
    if attrs.iter().any(|a| a.divisor == 0) {
        let Some((lo, hi)) = sz::index_range(indices, ty, n) else {
            cx.error(GL_INVALID_VALUE);
            return Ok(());
        };
        if lo < base || hi as u64 >= base as u64 + nverts as u64 {
            cx.error(GL_INVALID_VALUE);
            return Ok(());
        }
        if base != 0 {
            rebased = rebase(indices, ib, base);
            ptr = rebased.as_ptr();
        }
    }
    point_client(gl, cx, &attrs);
    // SAFETY: a current context; `ptr` holds `count` indices of `ty` (checked); with no
    // element buffer bound for the call the driver reads them from here.
    unsafe {
        if element_buffer != 0 {
            (gl.glBindBuffer)(GL_ELEMENT_ARRAY_BUFFER, 0);
        }
        elements_call(gl, cx, mode, count, ty, ptr.cast(), instances);
        if element_buffer != 0 {
            (gl.glBindBuffer)(GL_ELEMENT_ARRAY_BUFFER, element_buffer);
        }
    }
    Ok(())
}

pub(crate) fn glDrawElements(
    gl: &Gl,
    cx: &mut ContextState,
    r: &mut Reader<'_>,
    _reply: &mut Encoder,
) -> DecodeResult {
    draw_elements(gl, cx, r, false)
}

pub(crate) fn glDrawElementsInstanced(
    gl: &Gl,
    cx: &mut ContextState,
    r: &mut Reader<'_>,
    _reply: &mut Encoder,
) -> DecodeResult {
    draw_elements(gl, cx, r, true)
}

#[cfg(test)]
#[path = "draw_tests.rs"]
pub(super) mod tests;
