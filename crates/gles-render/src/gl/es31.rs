//! GLES 3.1 decoders the generator cannot do, and the state hooks after GLES 3.1 calls.
//!
//! Payloads (the guest's `gl::es31` writes them):
//! - `glDrawArraysIndirect(mode, offset u64)`, `glDrawElementsIndirect(mode, type, offset
//!   u64)`: the offset into the bound `GL_DRAW_INDIRECT_BUFFER`. The host checks that a
//!   vertex array object, a draw-indirect buffer (and an element buffer) are bound before
//!   the driver reads anything: without them the offset would be a pointer into the worker.
//! - `glCreateShaderProgramv(type, name, source bytes)`: the guest's program name (made in
//!   the guest, as `glCreateProgram`'s), the strings joined; the source is rewritten as a
//!   `glShaderSource`'s is (`gl::precision`).

#![allow(non_snake_case)]

use std::ffi::c_void;

use virtsoc_gles_stream::{Encoder, Reader};

use super::hooks::{binding, ELEMENT_ARRAY_BUFFER_BINDING};
use super::names::Kind;
use super::{ContextState, DecodeResult, Gl, GL_INVALID_ENUM, GL_INVALID_OPERATION};

/// `GL_DRAW_INDIRECT_BUFFER_BINDING`.
const DRAW_INDIRECT_BUFFER_BINDING: u32 = 0x8F43;
/// `GL_VERTEX_ARRAY_BINDING`.
const VERTEX_ARRAY_BINDING: u32 = 0x85B5;

/// Whether an indirect draw's offset reads a buffer: a vertex array object and a
/// draw-indirect buffer bound (else `GL_INVALID_OPERATION` recorded).
fn indirect_bound(gl: &Gl, cx: &mut ContextState, elements: bool) -> bool {
    let ok = binding(gl, VERTEX_ARRAY_BINDING) != 0
        && binding(gl, DRAW_INDIRECT_BUFFER_BINDING) != 0
        && (!elements || binding(gl, ELEMENT_ARRAY_BUFFER_BINDING) != 0);
    if !ok {
        cx.error(GL_INVALID_OPERATION);
    }
    ok
}

pub(crate) fn glDrawArraysIndirect(
    gl: &Gl,
    cx: &mut ContextState,
    r: &mut Reader<'_>,
    _reply: &mut Encoder,
) -> DecodeResult {
    let (mode, off) = (r.u32()?, r.u64()?);
    if !indirect_bound(gl, cx, false) {
        return Ok(());
    }
    match gl.glDrawArraysIndirect {
        // SAFETY: a current context; with a draw-indirect buffer bound the pointer is an
        // offset into it, which the driver checks against the buffer's size.
        Some(f) => unsafe { f(mode, off as usize as *const c_void) },
        None => cx.error(GL_INVALID_OPERATION),
    }
    Ok(())
}

pub(crate) fn glDrawElementsIndirect(
    gl: &Gl,
    cx: &mut ContextState,
    r: &mut Reader<'_>,
    _reply: &mut Encoder,
) -> DecodeResult {
    let (mode, ty, off) = (r.u32()?, r.u32()?, r.u64()?);
    if !matches!(ty, 0x1401 | 0x1403 | 0x1405) {
        cx.error(GL_INVALID_ENUM);
        return Ok(());
    }
    if !indirect_bound(gl, cx, true) {
        return Ok(());
    }
    match gl.glDrawElementsIndirect {
        // SAFETY: a current context; with a draw-indirect and an element buffer bound the
        // pointer is an offset into the former, which the driver checks.
        Some(f) => unsafe { f(mode, ty, off as usize as *const c_void) },
        None => cx.error(GL_INVALID_OPERATION),
    }
    Ok(())
}

pub(crate) fn glCreateShaderProgramv(
    gl: &Gl,
    cx: &mut ContextState,
    r: &mut Reader<'_>,
    _reply: &mut Encoder,
) -> DecodeResult {
    let (ty, guest) = (r.u32()?, r.u32()?);
    let src = r.bytes()?.unwrap_or(&[]);
    let Some(f) = gl.glCreateShaderProgramv else {
        cx.error(GL_INVALID_OPERATION);
        return Ok(());
    };
    let src = super::custom::host_source(gl, cx, src);
    // NUL-terminated (the call takes no lengths), cut at a NUL inside as the driver would.
    let end = src.iter().position(|b| *b == 0).unwrap_or(src.len());
    let mut text = src[..end].to_vec();
    text.push(0);
    let ptr = text.as_ptr().cast::<std::ffi::c_char>();
    // SAFETY: a current context; one NUL-terminated string.
    let host = unsafe { f(ty, 1, &ptr) };
    cx.map_name(Kind::Program, guest, host);
    Ok(())
}

/// State the host tracks after GLES 3.1 calls (the annotation file's `hhook`).
pub(crate) mod hooks {
    use super::*;

    /// The stages' programs a pipeline query answers are host names: the guest's instead.
    pub(crate) fn glGetProgramPipelineiv(
        _gl: &Gl,
        cx: &mut ContextState,
        _pipeline: u32,
        pname: u32,
        params: *mut i32,
    ) {
        // ACTIVE_PROGRAM, FRAGMENT_SHADER, VERTEX_SHADER, COMPUTE_SHADER
        if matches!(pname, 0x8259 | 0x8B30 | 0x8B31 | 0x91B9) && !params.is_null() {
            // SAFETY: `params` is the decoder's output buffer (one value at least).
            unsafe { *params = cx.share().guest_of(Kind::Program, *params as u32) as i32 };
        }
    }
}

#[cfg(test)]
mod tests {
    use virtsoc_gles_stream::gl_ops as op;

    use super::*;
    use crate::egl::TestContext;
    use crate::gl::draw::tests::run;
    use crate::gl::ShareGroup;

    /// An indirect draw's offset reaches the driver only with a vertex array object, a
    /// draw-indirect buffer (and for elements an element buffer) bound: a raw stream
    /// (no guest library checking first) gets `GL_INVALID_OPERATION` otherwise.
    #[test]
    fn indirect_offsets_need_their_buffers() {
        let Some(host) = TestContext::open(3, (8, 8)) else {
            return;
        };
        let gl = host.gl();
        if gl.glDrawArraysIndirect.is_none() {
            eprintln!("SKIPPED: no GLES 3.1");
            return;
        }
        let mut cx = ContextState::new(ShareGroup::new_shared());
        let refused = |cx: &mut ContextState, e: &Encoder, why: &str| {
            run(&gl, cx, e);
            assert_eq!(cx.take_error(), GL_INVALID_OPERATION, "{why}");
        };
        let mut e = Encoder::new();
        e.packet(op::glDrawArraysIndirect).u32(4).u64(0x1234_5678);
        refused(&mut cx, &e, "no vertex array object");
        let mut e = Encoder::new();
        e.packet(op::glGenVertexArrays)
            .i32(1)
            .bytes(&1u32.to_le_bytes());
        e.packet(op::glBindVertexArray).u32(1);
        e.packet(op::glDrawArraysIndirect).u32(4).u64(0x1234_5678);
        refused(&mut cx, &e, "no draw-indirect buffer");
        let mut e = Encoder::new();
        e.packet(op::glGenBuffers).i32(1).bytes(&2u32.to_le_bytes());
        e.packet(op::glBindBuffer).u32(0x8F3F).u32(2);
        e.packet(op::glBufferData)
            .u32(0x8F3F)
            .u64(20)
            .bytes(&[0u8; 20])
            .u32(0x88E4);
        e.packet(op::glDrawElementsIndirect)
            .u32(4)
            .u32(0x1403)
            .u64(0);
        refused(&mut cx, &e, "no element buffer");
        let mut e = Encoder::new();
        e.packet(op::glDrawArraysIndirect).u32(4).u64(0);
        run(&gl, &mut cx, &e);
        assert_eq!(cx.take_error(), 0, "with its buffers bound the draw runs");
    }
}
