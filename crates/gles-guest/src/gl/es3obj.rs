//! GLES 3.0 calls of the guest (2): sync objects (names made in the guest from the share
//! group's counter, handed out as `GLsync` handles, translated by the host per guest; an
//! unknown one is the host's `GL_INVALID_VALUE`), `glGetStringi` and the GLES 3.0 limits
//! answered in the guest, the calls with string arrays (`glTransformFeedbackVaryings`,
//! `glGetUniformIndices`), `glGetActiveUniformBlockiv` (its answer's length is the host's),
//! and program binaries (none exposed). Payloads: see the host's `gl::es3obj`.

#![allow(non_snake_case)]

use std::ffi::{c_char, c_void, CString};

use virtsoc_gles_stream::gl_ops as op;

use super::custom::{encode, round_trip};
use super::{rtx, GlState, GL_INVALID_ENUM, GL_INVALID_OPERATION, GL_INVALID_VALUE};
use crate::rt::{self, Context};

/// `GL_WAIT_FAILED`.
const WAIT_FAILED: u32 = 0x911D;
/// Most syncs a share group holds at once.
const MAX_SYNCS: usize = 1 << 16;
/// Most values `glGetActiveUniformBlockiv` answers.
const MAX_BLOCK_VALUES: usize = 4096;

/// The `GLsync` handle of sync name `n`, and back.
fn handle(n: u32) -> *mut c_void {
    n as usize as *mut c_void
}

fn sync_name(s: *mut c_void) -> u32 {
    u32::try_from(s as usize).unwrap_or(u32::MAX)
}

/// `glFenceSync`: a name from the share group's counter; the stream is flushed.
pub(crate) unsafe extern "C" fn glFenceSync(condition: u32, flags: u32) -> *mut c_void {
    let Some(ctx) = rt::current() else {
        return std::ptr::null_mut();
    };
    let st = ctx.gl();
    let name = {
        let mut s = st.shared();
        if s.es3.syncs.len() >= MAX_SYNCS {
            None
        } else {
            let n = s.es3.next_sync.wrapping_add(1).max(1);
            s.es3.next_sync = n;
            s.es3.syncs.insert(n);
            Some(n)
        }
    };
    drop(st);
    let Some(name) = name else {
        ctx.gl().error(0x0505); // OUT_OF_MEMORY
        return std::ptr::null_mut();
    };
    encode(&ctx, op::glFenceSync, |p| {
        p.u32(condition).u32(flags).u32(name);
    });
    let _ = ctx.stream().flush();
    handle(name)
}

/// `glIsSync`: whether the share group made the sync and has not deleted it.
pub(crate) unsafe extern "C" fn glIsSync(sync: *mut c_void) -> u8 {
    let Some(ctx) = rt::current() else { return 0 };
    let st = ctx.gl();
    let n = sync_name(sync);
    let known = st.shared().es3.syncs.contains(&n);
    known as u8
}

/// `glDeleteSync`: the host deletes its sync (an unknown name is its error).
pub(crate) unsafe extern "C" fn glDeleteSync(sync: *mut c_void) {
    let Some(ctx) = rt::current() else { return };
    if sync.is_null() {
        return;
    }
    let n = sync_name(sync);
    ctx.gl().shared().es3.syncs.remove(&n);
    encode(&ctx, op::glDeleteSync, |p| {
        p.u32(n);
    });
}

/// `glClientWaitSync`: a round trip; the host waits (its wait is bounded).
pub(crate) unsafe extern "C" fn glClientWaitSync(
    sync: *mut c_void,
    flags: u32,
    timeout: u64,
) -> u32 {
    let Some(ctx) = rt::current() else {
        return WAIT_FAILED;
    };
    let _st = ctx.gl();
    encode(&ctx, op::glClientWaitSync, |p| {
        p.u32(sync_name(sync)).u32(flags).u64(timeout);
    });
    round_trip(&ctx, op::glClientWaitSync)
        .and_then(|b| {
            b.get(..4)
                .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
        })
        .unwrap_or(WAIT_FAILED)
}

/// `glWaitSync`: the host's GL queue waits; the guest does not.
pub(crate) unsafe extern "C" fn glWaitSync(sync: *mut c_void, flags: u32, timeout: u64) {
    let Some(ctx) = rt::current() else { return };
    let _st = ctx.gl();
    encode(&ctx, op::glWaitSync, |p| {
        p.u32(sync_name(sync)).u32(flags).u64(timeout);
    });
}

/// `glGetSynciv`: a round trip answering at most `count` values.
///
/// # Safety
/// `length` is null or has room for one value, `values` for `count`.
pub(crate) unsafe extern "C" fn glGetSynciv(
    sync: *mut c_void,
    pname: u32,
    count: i32,
    length: *mut i32,
    values: *mut i32,
) {
    let Some(ctx) = rt::current() else { return };
    let mut st = ctx.gl();
    let Ok(n) = usize::try_from(count) else {
        st.error(GL_INVALID_VALUE);
        return;
    };
    encode(&ctx, op::glGetSynciv, |p| {
        p.u32(sync_name(sync)).u32(pname).i32(count);
    });
    let Some(b) = round_trip(&ctx, op::glGetSynciv) else {
        return;
    };
    // The answer: u32 byte length, then the values.
    let got = b.get(4..).unwrap_or(&[]);
    let k = (got.len() / 4).min(n);
    // SAFETY: `values` has room for `count` values, `k <= count` (the caller's contract).
    unsafe { rtx::copy_out(values.cast(), k * 4, got) };
    if !length.is_null() {
        // SAFETY: the caller's contract.
        unsafe { *length = k as i32 };
    }
}

/// Makes the context's `glGetStringi` list from the extensions `glGetString` shows, once;
/// call without the state locked (`glGetString` locks it).
fn fill_ext_strings(ctx: &Context) {
    if !ctx.gl().es3.ext_strings.is_empty() {
        return;
    }
    // SAFETY: GL_EXTENSIONS: the cached string stays valid with the context.
    let p = unsafe { super::custom::glGetString(0x1F03) };
    if p.is_null() {
        return;
    }
    // SAFETY: a NUL-terminated string the context keeps.
    let list: Vec<CString> = unsafe { std::ffi::CStr::from_ptr(p.cast()) }
        .to_string_lossy()
        .split_whitespace()
        .filter_map(|e| CString::new(e).ok())
        .collect();
    let mut st = ctx.gl();
    if st.es3.ext_strings.is_empty() {
        st.es3.ext_strings = list;
    }
}

/// `GL_NUM_EXTENSIONS`: how many extensions `glGetStringi` answers; call without the state
/// locked.
pub(crate) fn num_extensions(ctx: &Context) -> usize {
    fill_ext_strings(ctx);
    ctx.gl().es3.ext_strings.len()
}

/// Whether the context is GLES 3.0: made for 3, or made for 2 on a host whose context is
/// GLES 3 (asked once, a round trip).
pub(crate) fn is_es3(ctx: &Context, st: &mut GlState) -> bool {
    if st.client_version() >= 3 {
        return true;
    }
    if let Some(v) = st.es3.host_es3 {
        return v;
    }
    let v = super::custom::host_string(ctx, 0x1F02).is_some_and(|s| s.starts_with(b"OpenGL ES 3"));
    st.es3.host_es3 = Some(v);
    v
}

/// Whether the context is GLES 3.1: a GLES 3 context on a host whose context is GLES 3.1 or
/// newer (asked once, a round trip), as Mesa gives a 3.0 request its newest compatible
/// version.
pub(crate) fn is_es31(ctx: &Context, st: &mut GlState) -> bool {
    if !is_es3(ctx, st) {
        return false;
    }
    if let Some(m) = st.es3.host_minor {
        return m >= 1;
    }
    let minor = super::custom::host_string(ctx, 0x1F02)
        .and_then(|s| es3_minor(&s))
        .unwrap_or(0);
    st.es3.host_minor = Some(minor);
    minor >= 1
}

/// The minor version of an `OpenGL ES 3.x ...` version string.
fn es3_minor(s: &[u8]) -> Option<u32> {
    let rest = s.strip_prefix(b"OpenGL ES 3.")?;
    let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    std::str::from_utf8(&rest[..digits]).ok()?.parse().ok()
}

/// `glGetIntegerv` values the guest answers itself; `None`: ask on.
pub(crate) fn local_ints(ctx: &Context, st: &mut GlState, pname: u32) -> Option<Vec<i32>> {
    let es3 = matches!(pname, 0x821B | 0x821C) && is_es3(ctx, st);
    Some(match pname {
        0x821B if es3 => vec![3],                       // MAJOR_VERSION
        0x821C if es3 => vec![is_es31(ctx, st) as i32], // MINOR_VERSION
        0x87FE => vec![0],                              // NUM_PROGRAM_BINARY_FORMATS: none exposed
        0x87FF => Vec::new(),                           // PROGRAM_BINARY_FORMATS
        0x88ED => vec![st.es3.pack_buffer() as i32],
        0x88EF => vec![st.es3.unpack_buffer() as i32],
        0x0CF2 => vec![st.es3.unpack.row_length as i32],
        0x806E => vec![st.es3.unpack.image_height as i32],
        0x0CF4 => vec![st.es3.unpack.skip_pixels as i32],
        0x0CF3 => vec![st.es3.unpack.skip_rows as i32],
        0x806D => vec![st.es3.unpack.skip_images as i32],
        0x0D02 => vec![st.es3.pack.row_length as i32],
        0x0D04 => vec![st.es3.pack.skip_pixels as i32],
        0x0D03 => vec![st.es3.pack.skip_rows as i32],
        0x85B5 => vec![st.es3.vao as i32], // VERTEX_ARRAY_BINDING
        _ => return None,
    })
}

/// `glGetStringi(GL_EXTENSIONS, index)`: the extensions `glGetString` shows.
pub(crate) unsafe extern "C" fn glGetStringi(name: u32, index: u32) -> *const u8 {
    let null = std::ptr::null();
    let Some(ctx) = rt::current() else {
        return null;
    };
    if name != 0x1F03 {
        ctx.gl().error(GL_INVALID_ENUM);
        return null;
    }
    fill_ext_strings(&ctx);
    let mut st = ctx.gl();
    match st.es3.ext_strings.get(index as usize) {
        // The CString's bytes stay where they are while the context lives.
        Some(s) => s.as_ptr().cast(),
        None => {
            st.error(GL_INVALID_VALUE);
            null
        }
    }
}

/// `count` strings joined, each with its NUL.
///
/// # Safety
/// `strings` is null or holds `count` NUL-terminated strings (or nulls).
unsafe fn joined(strings: *const *const c_char, count: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for i in 0..count {
        if strings.is_null() {
            break;
        }
        // SAFETY: `count` pointers (the caller's contract).
        let s = unsafe { *strings.add(i) };
        if !s.is_null() {
            // SAFETY: a NUL-terminated string (the caller's contract).
            out.extend_from_slice(unsafe { std::ffi::CStr::from_ptr(s) }.to_bytes());
        }
        out.push(0);
    }
    out
}

/// `glTransformFeedbackVaryings`: the names joined, each with its NUL.
///
/// # Safety
/// GL's contract: `count` NUL-terminated strings.
pub(crate) unsafe extern "C" fn glTransformFeedbackVaryings(
    program: u32,
    count: i32,
    varyings: *const *const c_char,
    buffer_mode: u32,
) {
    let Some(ctx) = rt::current() else { return };
    let mut st = ctx.gl();
    let Ok(n) = usize::try_from(count) else {
        st.error(GL_INVALID_VALUE);
        return;
    };
    // SAFETY: the caller's contract.
    let names = unsafe { joined(varyings, n) };
    encode(&ctx, op::glTransformFeedbackVaryings, |p| {
        p.u32(program).i32(count).u32(buffer_mode).bytes(&names);
    });
}

/// `glGetUniformIndices`: the names joined; a round trip answers `count` indices.
///
/// # Safety
/// GL's contract: `count` names, room for `count` indices.
pub(crate) unsafe extern "C" fn glGetUniformIndices(
    program: u32,
    count: i32,
    names: *const *const c_char,
    indices: *mut u32,
) {
    let Some(ctx) = rt::current() else { return };
    let mut st = ctx.gl();
    let Ok(n) = usize::try_from(count) else {
        st.error(GL_INVALID_VALUE);
        return;
    };
    // SAFETY: the caller's contract.
    let joined = unsafe { joined(names, n) };
    encode(&ctx, op::glGetUniformIndices, |p| {
        p.u32(program).i32(count).bytes(&joined);
    });
    if let Some(b) = round_trip(&ctx, op::glGetUniformIndices) {
        // SAFETY: `indices` has room for `count` values (the caller's contract).
        unsafe { rtx::copy_out(indices.cast(), n * 4, b.get(4..).unwrap_or(&[])) };
    }
}

/// `glGetActiveUniformBlockiv`: a round trip; the host answers as many values as the
/// query has (`GL_UNIFORM_BLOCK_ACTIVE_UNIFORM_INDICES`: the block's uniform count, which
/// the caller sized `params` for).
///
/// # Safety
/// GL's contract: `params` has room for what `pname` answers.
pub(crate) unsafe extern "C" fn glGetActiveUniformBlockiv(
    program: u32,
    index: u32,
    pname: u32,
    params: *mut i32,
) {
    let Some(ctx) = rt::current() else { return };
    let _st = ctx.gl();
    encode(&ctx, op::glGetActiveUniformBlockiv, |p| {
        p.u32(program).u32(index).u32(pname);
    });
    if let Some(b) = round_trip(&ctx, op::glGetActiveUniformBlockiv) {
        let vals = b.get(4..).unwrap_or(&[]);
        let n = vals.len().min(MAX_BLOCK_VALUES * 4);
        // SAFETY: `params` has room for the values GL answers for `pname` (the caller's
        // contract), which is what the host's driver answered.
        unsafe { rtx::copy_out(params.cast(), n, vals) };
    }
}

/// `glGetProgramBinary`: no binary formats are exposed (`GL_NUM_PROGRAM_BINARY_FORMATS` 0).
///
/// # Safety
/// `length` is null or has room for one value.
pub(crate) unsafe extern "C" fn glGetProgramBinary(
    _program: u32,
    _buf_size: i32,
    length: *mut i32,
    _format: *mut u32,
    _binary: *mut c_void,
) {
    let Some(ctx) = rt::current() else { return };
    if !length.is_null() {
        // SAFETY: the caller's contract.
        unsafe { *length = 0 };
    }
    ctx.gl().error(GL_INVALID_OPERATION);
}

/// `glProgramBinary`: no binary format is accepted.
pub(crate) unsafe extern "C" fn glProgramBinary(
    _program: u32,
    _format: u32,
    _binary: *const c_void,
    _length: i32,
) {
    if let Some(ctx) = rt::current() {
        ctx.gl().error(GL_INVALID_ENUM);
    }
}
