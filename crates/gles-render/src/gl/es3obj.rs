//! GLES 3.0 on the host (2): sync objects (the guest names them; each share group maps its
//! guest's names to the driver's `GLsync` handles, so a guest can name only its own: an
//! unknown name is `GL_INVALID_VALUE`, never a handle passed to the driver; waits are
//! bounded), the calls with string arrays, uniform block queries whose answer's length the
//! driver knows, and program binaries (none accepted).
//!
//! Payloads (the guest's `gl::es3obj` writes them):
//! - `glFenceSync(condition, flags, name)`; `glDeleteSync(name)`;
//!   `glClientWaitSync(name, flags, timeout u64)`: answer `u32`; `glWaitSync(name, flags,
//!   timeout u64)`; `glGetSynciv(name, pname, count)`: answer the values' bytes;
//! - `glTransformFeedbackVaryings(program, count, mode, names)` and
//!   `glGetUniformIndices(program, count, names)` (answer: `count` indices), `names` being
//!   the strings each followed by its NUL;
//! - `glGetActiveUniformBlockiv(program, index, pname)`: answer the values' bytes.

#![allow(non_snake_case)]

use std::collections::HashMap;
use std::ffi::{c_char, c_void};

use virtsoc_gles_stream::{gl_ops as op, Encoder, Reader};

use super::names::{Kind, Mode};
use super::{
    ContextState, DecodeResult, Gl, GL_INVALID_ENUM, GL_INVALID_OPERATION, GL_INVALID_VALUE,
    GL_OUT_OF_MEMORY,
};

/// Most syncs a share group holds.
const MAX_SYNCS: usize = 1 << 16;
/// The longest a guest's `glClientWaitSync` waits on the host (ns): a sync that does not
/// signal answers `GL_TIMEOUT_EXPIRED`, the worker goes on.
const MAX_WAIT_NS: u64 = 1_000_000_000;
/// `GL_WAIT_FAILED`.
const WAIT_FAILED: u32 = 0x911D;
/// Most strings in one call.
const MAX_STRINGS: usize = 4096;

/// A share group's syncs: guest name to the driver's handle.
#[derive(Debug, Default)]
pub(crate) struct Syncs(HashMap<u32, usize>);

/// The driver's handle of guest sync `name`; `None` after recording `GL_INVALID_VALUE`.
fn sync_of(cx: &mut ContextState, name: u32) -> Option<*mut c_void> {
    let h = cx.share().syncs.0.get(&name).copied();
    if h.is_none() {
        cx.error(GL_INVALID_VALUE);
    }
    h.map(|h| h as *mut c_void)
}

pub(crate) fn glFenceSync(
    gl: &Gl,
    cx: &mut ContextState,
    r: &mut Reader<'_>,
    _reply: &mut Encoder,
) -> DecodeResult {
    let (condition, flags, name) = (r.u32()?, r.u32()?, r.u32()?);
    let Some(f) = gl.glFenceSync else {
        cx.error(GL_INVALID_OPERATION);
        return Ok(());
    };
    let (known, full) = {
        let s = cx.share();
        (s.syncs.0.contains_key(&name), s.syncs.0.len() >= MAX_SYNCS)
    };
    if name == 0 || known {
        cx.error(GL_INVALID_VALUE);
        return Ok(());
    }
    if full {
        cx.error(GL_OUT_OF_MEMORY);
        return Ok(());
    }
    // SAFETY: a current context; scalar arguments (the driver checks them).
    let h = unsafe { f(condition, flags) };
    if !h.is_null() {
        cx.share().syncs.0.insert(name, h as usize);
    }
    Ok(())
}

pub(crate) fn glIsSync(
    _gl: &Gl,
    cx: &mut ContextState,
    _r: &mut Reader<'_>,
    _reply: &mut Encoder,
) -> DecodeResult {
    // Answered in the guest; never sent.
    cx.error(GL_INVALID_OPERATION);
    Ok(())
}

pub(crate) fn glDeleteSync(
    gl: &Gl,
    cx: &mut ContextState,
    r: &mut Reader<'_>,
    _reply: &mut Encoder,
) -> DecodeResult {
    let name = r.u32()?;
    let h = cx.share().syncs.0.remove(&name);
    match (h, gl.glDeleteSync) {
        // SAFETY: a current context; a handle the driver made for this share group.
        (Some(h), Some(f)) => unsafe { f(h as *mut c_void) },
        _ => cx.error(GL_INVALID_VALUE),
    }
    Ok(())
}

pub(crate) fn glClientWaitSync(
    gl: &Gl,
    cx: &mut ContextState,
    r: &mut Reader<'_>,
    reply: &mut Encoder,
) -> DecodeResult {
    let (name, flags, timeout) = (r.u32()?, r.u32()?, r.u64()?);
    let mut v = WAIT_FAILED;
    if let Some(h) = sync_of(cx, name) {
        match gl.glClientWaitSync {
            // SAFETY: a current context; a handle of this share group; the wait bounded.
            Some(f) => v = unsafe { f(h, flags, timeout.min(MAX_WAIT_NS)) },
            None => cx.error(GL_INVALID_OPERATION),
        }
    }
    reply.packet(op::glClientWaitSync).u32(v);
    Ok(())
}

pub(crate) fn glWaitSync(
    gl: &Gl,
    cx: &mut ContextState,
    r: &mut Reader<'_>,
    _reply: &mut Encoder,
) -> DecodeResult {
    let (name, flags, timeout) = (r.u32()?, r.u32()?, r.u64()?);
    if let Some(h) = sync_of(cx, name) {
        match gl.glWaitSync {
            // SAFETY: a current context; a handle of this share group (the driver checks
            // flags and timeout).
            Some(f) => unsafe { f(h, flags, timeout) },
            None => cx.error(GL_INVALID_OPERATION),
        }
    }
    Ok(())
}

pub(crate) fn glGetSynciv(
    gl: &Gl,
    cx: &mut ContextState,
    r: &mut Reader<'_>,
    reply: &mut Encoder,
) -> DecodeResult {
    let (name, pname, count) = (r.u32()?, r.u32()?, r.i32()?);
    let mut p = reply.packet(op::glGetSynciv);
    let (Some(h), Some(f)) = (sync_of(cx, name), gl.glGetSynciv) else {
        p.null();
        return Ok(());
    };
    let count = count.clamp(0, 16);
    let mut v = [0i32; 16];
    let mut len = 0i32;
    // SAFETY: a current context; a handle of this share group; `v` has room for `count`.
    unsafe { f(h, pname, count, &mut len, v.as_mut_ptr()) };
    let k = len.clamp(0, count) as usize;
    let b: Vec<u8> = v[..k].iter().flat_map(|x| x.to_ne_bytes()).collect();
    p.bytes(&b);
    Ok(())
}

/// `count` NUL-terminated strings of `b`, as pointers into it; `None` (error recorded) when
/// it holds fewer.
fn strings(cx: &mut ContextState, b: &[u8], count: i32) -> Option<Vec<*const c_char>> {
    let n = usize::try_from(count).ok().filter(|n| *n <= MAX_STRINGS);
    let Some(n) = n else {
        cx.error(GL_INVALID_VALUE);
        return None;
    };
    let mut out = Vec::with_capacity(n);
    let mut at = 0;
    for _ in 0..n {
        let Some(end) = b.get(at..).and_then(|r| r.iter().position(|c| *c == 0)) else {
            cx.error(GL_INVALID_VALUE);
            return None;
        };
        out.push(b[at..].as_ptr().cast());
        at += end + 1;
    }
    Some(out)
}

pub(crate) fn glTransformFeedbackVaryings(
    gl: &Gl,
    cx: &mut ContextState,
    r: &mut Reader<'_>,
    _reply: &mut Encoder,
) -> DecodeResult {
    let (program, count, mode) = (r.u32()?, r.i32()?, r.u32()?);
    let b = r.bytes()?.unwrap_or(&[]);
    let Some(program) = cx.host_name(gl, Kind::Program, program, Mode::Use) else {
        return Ok(());
    };
    let Some(names) = strings(cx, b, count) else {
        return Ok(());
    };
    match gl.glTransformFeedbackVaryings {
        // SAFETY: a current context; `names` holds `count` NUL-terminated strings of the
        // packet.
        Some(f) => unsafe { f(program, count, names.as_ptr(), mode) },
        None => cx.error(GL_INVALID_OPERATION),
    }
    Ok(())
}

pub(crate) fn glGetUniformIndices(
    gl: &Gl,
    cx: &mut ContextState,
    r: &mut Reader<'_>,
    reply: &mut Encoder,
) -> DecodeResult {
    let (program, count) = (r.u32()?, r.i32()?);
    let b = r.bytes()?.unwrap_or(&[]);
    let mut p = reply.packet(op::glGetUniformIndices);
    let program = cx.host_name(gl, Kind::Program, program, Mode::Use);
    let names = program.and_then(|_| strings(cx, b, count));
    let (Some(program), Some(names), Some(f)) = (program, names, gl.glGetUniformIndices) else {
        p.null();
        return Ok(());
    };
    let mut out = vec![u32::MAX; names.len()];
    // SAFETY: a current context; `names` holds `count` strings, `out` room for `count`.
    unsafe { f(program, count, names.as_ptr(), out.as_mut_ptr()) };
    let bytes: Vec<u8> = out.iter().flat_map(|x| x.to_ne_bytes()).collect();
    p.bytes(&bytes);
    Ok(())
}

pub(crate) fn glGetActiveUniformBlockiv(
    gl: &Gl,
    cx: &mut ContextState,
    r: &mut Reader<'_>,
    reply: &mut Encoder,
) -> DecodeResult {
    let (program, index, pname) = (r.u32()?, r.u32()?, r.u32()?);
    let mut p = reply.packet(op::glGetActiveUniformBlockiv);
    let program = cx.host_name(gl, Kind::Program, program, Mode::Use);
    let (Some(program), Some(f)) = (program, gl.glGetActiveUniformBlockiv) else {
        p.null();
        return Ok(());
    };
    // UNIFORM_BLOCK_ACTIVE_UNIFORM_INDICES answers as many as the block's uniforms.
    let n = if pname == 0x8A43 {
        let mut k = 0i32;
        // SAFETY: a current context; one value (GL_UNIFORM_BLOCK_ACTIVE_UNIFORMS).
        unsafe { f(program, index, 0x8A42, &mut k) };
        k.clamp(0, 4096) as usize
    } else {
        1
    };
    let mut v = vec![0i32; n + 16];
    // SAFETY: a current context; `v` has room for what `pname` answers and 16 more.
    unsafe { f(program, index, pname, v.as_mut_ptr()) };
    let b: Vec<u8> = v[..n].iter().flat_map(|x| x.to_ne_bytes()).collect();
    p.bytes(&b);
    Ok(())
}

pub(crate) fn glGetProgramBinary(
    _gl: &Gl,
    cx: &mut ContextState,
    _r: &mut Reader<'_>,
    _reply: &mut Encoder,
) -> DecodeResult {
    // No binary formats are exposed; never sent.
    cx.error(GL_INVALID_OPERATION);
    Ok(())
}

pub(crate) fn glProgramBinary(
    _gl: &Gl,
    cx: &mut ContextState,
    _r: &mut Reader<'_>,
    _reply: &mut Encoder,
) -> DecodeResult {
    // A binary would go to the driver's deserializer unchecked: none is accepted.
    cx.error(GL_INVALID_ENUM);
    Ok(())
}

pub(crate) fn glGetStringi(
    _gl: &Gl,
    cx: &mut ContextState,
    _r: &mut Reader<'_>,
    _reply: &mut Encoder,
) -> DecodeResult {
    // Answered in the guest (its extension list); never sent.
    cx.error(GL_INVALID_OPERATION);
    Ok(())
}
