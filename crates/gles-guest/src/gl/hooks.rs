//! Guest state updated by generated entry points before they encode (the annotation file's
//! `ghook`): buffer bindings and element-buffer contents, pixel store, enabled attributes.

#![allow(non_snake_case)]

use std::ffi::c_void;

use super::state::MAX_ATTRIBS;
use super::GlState;

pub(crate) use super::es3::hooks::*;
pub(crate) use super::es31::hooks::*;

/// # Safety
/// GL's arguments (none is a pointer).
pub(crate) unsafe fn glBindBuffer(st: &mut GlState, target: u32, buffer: u32) {
    match target {
        super::GL_ARRAY_BUFFER => st.array_buffer = buffer,
        super::GL_ELEMENT_ARRAY_BUFFER => st.element_buffer = buffer,
        _ => super::es3::bind_buffer(st, target, buffer),
    }
}

/// # Safety
/// `data` is null or holds `size` bytes.
pub(crate) unsafe fn glBufferData(
    st: &mut GlState,
    target: u32,
    size: isize,
    data: *const c_void,
    _usage: u32,
) {
    let Ok(n) = usize::try_from(size) else { return };
    // SAFETY: the caller's contract.
    let d = unsafe { super::rtx::slice(data.cast(), n) };
    st.buffer_data(target, n, d);
}

/// # Safety
/// `data` is null or holds `size` bytes.
pub(crate) unsafe fn glBufferSubData(
    st: &mut GlState,
    target: u32,
    offset: isize,
    size: isize,
    data: *const c_void,
) {
    let (Ok(off), Ok(n)) = (usize::try_from(offset), usize::try_from(size)) else {
        return;
    };
    // SAFETY: the caller's contract.
    if let Some(d) = unsafe { super::rtx::slice(data.cast(), n) } {
        st.buffer_sub_data(target, off, d);
    }
}

/// # Safety
/// GL's arguments (none is a pointer).
pub(crate) unsafe fn glPixelStorei(st: &mut GlState, pname: u32, param: i32) {
    super::es3::pixel_store(st, pname, param);
    if !matches!(param, 1 | 2 | 4 | 8) {
        return;
    }
    match pname {
        0x0CF5 => st.unpack_alignment = param as i64,
        0x0D05 => st.pack_alignment = param as i64,
        _ => {}
    }
}

/// # Safety
/// GL's arguments (none is a pointer).
pub(crate) unsafe fn glEnableVertexAttribArray(st: &mut GlState, index: u32) {
    if let Some(a) = st
        .attribs
        .get_mut(index as usize)
        .filter(|_| (index as usize) < MAX_ATTRIBS)
    {
        a.enabled = true;
    }
}

/// # Safety
/// GL's arguments (none is a pointer).
pub(crate) unsafe fn glDisableVertexAttribArray(st: &mut GlState, index: u32) {
    if let Some(a) = st.attribs.get_mut(index as usize) {
        a.enabled = false;
    }
}
