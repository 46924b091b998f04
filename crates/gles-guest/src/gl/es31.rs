//! GLES 3.1 calls of the guest the generator cannot do: the indirect draws (their
//! `indirect` is an offset into the bound `GL_DRAW_INDIRECT_BUFFER`, never client memory in
//! GLES 3.1), `glCreateShaderProgramv` (a program name made in the guest, its strings
//! joined), and the vertex attribute bindings' state (`ghook`: an attribute whose format
//! `glVertexAttribFormat` set reads a vertex buffer binding, so a draw sends no client array
//! for it). Compute dispatches, program pipelines, `glProgramUniform*`, images, the
//! program interface queries and the rest are generated. Payloads: see the host's
//! `gl::es31`.

#![allow(non_snake_case)]

use std::ffi::{c_char, c_void};

use virtsoc_gles_stream::gl_ops as op;

use super::custom::{encode, joined_source};
use super::state::{Kind, MAX_ATTRIBS};
use super::{GlState, GL_INVALID_ENUM, GL_INVALID_OPERATION, GL_INVALID_VALUE};
use crate::rt;

/// `GL_DRAW_INDIRECT_BUFFER`.
const DRAW_INDIRECT_BUFFER: u32 = 0x8F3F;

/// Whether an indirect draw may be sent: a vertex array object and a draw-indirect buffer
/// bound, `indirect` a non-negative offset into it aligned to 4 (GLES 3.1's rules; the
/// guest's check spares a packet the host would refuse anyway).
fn indirect_ok(st: &mut GlState, indirect: *const c_void) -> bool {
    let off = indirect as usize;
    if st.es3.vao == 0 || st.es3.bound_buffer(DRAW_INDIRECT_BUFFER) == Some(0) {
        st.error(GL_INVALID_OPERATION);
        return false;
    }
    if off % 4 != 0 || off > i64::MAX as usize {
        st.error(GL_INVALID_VALUE);
        return false;
    }
    true
}

/// `glDrawArraysIndirect`: `mode, offset u64`.
///
/// # Safety
/// GL's arguments (`indirect` is an offset, never dereferenced).
pub(crate) unsafe extern "C" fn glDrawArraysIndirect(mode: u32, indirect: *const c_void) {
    let Some(ctx) = rt::current() else { return };
    let mut st = ctx.gl();
    if !indirect_ok(&mut st, indirect) {
        return;
    }
    drop(st);
    encode(&ctx, op::glDrawArraysIndirect, |p| {
        p.u32(mode).u64(indirect as u64);
    });
}

/// `glDrawElementsIndirect`: `mode, type, offset u64`.
///
/// # Safety
/// GL's arguments (`indirect` is an offset, never dereferenced).
pub(crate) unsafe extern "C" fn glDrawElementsIndirect(
    mode: u32,
    ty: u32,
    indirect: *const c_void,
) {
    let Some(ctx) = rt::current() else { return };
    let mut st = ctx.gl();
    if !matches!(ty, 0x1401 | 0x1403 | 0x1405) {
        st.error(GL_INVALID_ENUM);
        return;
    }
    if !indirect_ok(&mut st, indirect) {
        return;
    }
    if st.element_buffer == 0 {
        st.error(GL_INVALID_OPERATION);
        return;
    }
    drop(st);
    encode(&ctx, op::glDrawElementsIndirect, |p| {
        p.u32(mode).u32(ty).u64(indirect as u64);
    });
}

/// `glCreateShaderProgramv`: a program name made in the guest (as `glCreateProgram`'s),
/// the strings joined into one source: `type, name, source bytes`.
///
/// # Safety
/// GL's contract: `count` NUL-terminated strings.
pub(crate) unsafe extern "C" fn glCreateShaderProgramv(
    ty: u32,
    count: i32,
    strings: *const *const c_char,
) -> u32 {
    let Some(ctx) = rt::current() else { return 0 };
    let mut st = ctx.gl();
    let Ok(n) = usize::try_from(count) else {
        st.error(GL_INVALID_VALUE);
        return 0;
    };
    // SAFETY: the caller's contract (no lengths: each string is NUL-terminated).
    let src = unsafe { joined_source(n, strings, std::ptr::null()) };
    let name = st.new_names(Kind::Program, 1).first().copied().unwrap_or(0);
    drop(st);
    encode(&ctx, op::glCreateShaderProgramv, |p| {
        p.u32(ty).u32(name).bytes(&src);
    });
    name
}

/// Guest state updated by generated GLES 3.1 entry points before they encode (`ghook`).
pub(crate) mod hooks {
    use super::*;

    /// Marks attribute `index` as reading a vertex buffer binding.
    fn bind_attrib(st: &mut GlState, index: u32) {
        if let Some(a) = st.attribs.get_mut(index as usize) {
            a.bound = true;
            a.buffer = 0;
            a.ptr = 0;
        }
    }

    /// # Safety
    /// GL's arguments (none is a pointer).
    pub(crate) unsafe fn glVertexAttribFormat(
        st: &mut GlState,
        index: u32,
        _size: i32,
        _ty: u32,
        _normalized: u8,
        _offset: u32,
    ) {
        bind_attrib(st, index);
    }

    /// # Safety
    /// GL's arguments (none is a pointer).
    pub(crate) unsafe fn glVertexAttribIFormat(
        st: &mut GlState,
        index: u32,
        _size: i32,
        _ty: u32,
        _offset: u32,
    ) {
        bind_attrib(st, index);
    }

    /// # Safety
    /// GL's arguments (none is a pointer).
    pub(crate) unsafe fn glVertexAttribBinding(st: &mut GlState, index: u32, _binding: u32) {
        if (index as usize) < MAX_ATTRIBS {
            bind_attrib(st, index);
        }
    }
}
