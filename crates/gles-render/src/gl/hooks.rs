//! State the host tracks after some calls (the annotation file's `hhook`): pixel store
//! alignment (array sizes depend on it) and the bytes objects hold.

#![allow(non_snake_case, clippy::too_many_arguments)]

use std::ffi::c_void;

use super::{ContextState, Gl};

pub(crate) use super::es3::hooks::*;
pub(crate) use super::es31::hooks::*;
pub(crate) use super::precision::hooks::*;

/// A binding's current host name, asked of the driver.
pub(crate) fn binding(gl: &Gl, pname: u32) -> u32 {
    let mut v = 0i32;
    // SAFETY: a current context; one value written for a binding query.
    unsafe { (gl.glGetIntegerv)(pname, &mut v) };
    v as u32
}

/// A vertex array object bound: client arrays take the scratch buffer from now on.
pub(crate) fn glBindVertexArray(_gl: &Gl, cx: &mut ContextState, array: u32) {
    if array != 0 {
        cx.es3.vertex_arrays_used = true;
    }
}

/// `GL_ARRAY_BUFFER_BINDING`.
pub(crate) const ARRAY_BUFFER_BINDING: u32 = 0x8894;
/// `GL_ELEMENT_ARRAY_BUFFER_BINDING`.
pub(crate) const ELEMENT_ARRAY_BUFFER_BINDING: u32 = 0x8895;

fn texture_binding(gl: &Gl, target: u32) -> u32 {
    match target {
        0x0DE1 => binding(gl, 0x8069), // TEXTURE_2D -> TEXTURE_BINDING_2D
        0x8515..=0x851A => binding(gl, 0x8514), // cube faces -> TEXTURE_BINDING_CUBE_MAP
        _ => 0,
    }
}

pub(crate) fn glPixelStorei(_gl: &Gl, cx: &mut ContextState, pname: u32, param: i32) {
    super::es3::pixel_store(cx, pname, param);
    if !matches!(param, 1 | 2 | 4 | 8) {
        return;
    }
    match pname {
        0x0CF5 => cx.unpack_alignment = param as i64,
        0x0D05 => cx.pack_alignment = param as i64,
        _ => {}
    }
}

pub(crate) fn glBufferData(
    gl: &Gl,
    cx: &mut ContextState,
    target: u32,
    size: isize,
    _d: *const c_void,
    _u: u32,
) {
    let b = match target {
        0x8892 => binding(gl, ARRAY_BUFFER_BINDING),
        0x8893 => binding(gl, ELEMENT_ARRAY_BUFFER_BINDING),
        _ => 0,
    };
    cx.share().set_buffer_bytes(b, size.max(0) as u64);
}

pub(crate) fn glTexImage2D(
    gl: &Gl,
    cx: &mut ContextState,
    target: u32,
    level: i32,
    _internalformat: i32,
    width: i32,
    height: i32,
    _border: i32,
    format: u32,
    ty: u32,
    _pixels: *const c_void,
) {
    let t = texture_binding(gl, target);
    let n = super::sz::image_bytes(width as i64, height as i64, format, ty, 1).unwrap_or(0);
    cx.share().set_texture_bytes(t, target, level, n as u64);
}

pub(crate) fn glCompressedTexImage2D(
    gl: &Gl,
    cx: &mut ContextState,
    target: u32,
    level: i32,
    _internalformat: u32,
    _width: i32,
    _height: i32,
    _border: i32,
    image_size: i32,
    _data: *const c_void,
) {
    let t = texture_binding(gl, target);
    cx.share()
        .set_texture_bytes(t, target, level, image_size.max(0) as u64);
}

pub(crate) fn glRenderbufferStorage(
    gl: &Gl,
    cx: &mut ContextState,
    _target: u32,
    _f: u32,
    width: i32,
    height: i32,
) {
    let r = binding(gl, 0x8CA7); // RENDERBUFFER_BINDING
    let n = (width.max(0) as u64) * (height.max(0) as u64) * 4;
    cx.share().set_renderbuffer_bytes(r, n);
}

/// Buffer targets of GLES 2.0 and 3.0: with a pixel buffer bound the pointers of pixel calls
/// are offsets, which the decoder checks against the buffer (`gl::es3::unpack_ptr`).
pub(crate) fn check_glBindBuffer(
    _gl: &Gl,
    cx: &mut ContextState,
    target: u32,
    _buffer: u32,
) -> bool {
    let ok = matches!(target, 0x8892 | 0x8893) || super::es3::bind_target_ok(target);
    if !ok {
        cx.error(super::GL_INVALID_ENUM);
    }
    ok
}

/// GLES 2.0's alignments and GLES 3.0's row lengths, image height and skips, each in range:
/// the array sizes are computed with them (`sz::image_bytes_3d`).
pub(crate) fn check_glPixelStorei(_gl: &Gl, cx: &mut ContextState, pname: u32, param: i32) -> bool {
    if !super::sz::is_unpack_param(pname) && !super::sz::is_pack_param(pname) {
        cx.error(super::GL_INVALID_ENUM);
        return false;
    }
    if !super::sz::PixelStore::default().set(pname, param as i64) {
        cx.error(super::GL_INVALID_VALUE);
        return false;
    }
    true
}

/// Writes the guest's name of the host name in `*out` of `kind` over it.
///
/// # Safety
/// `out` points to one writable value (the generated decoders pass their output buffers).
unsafe fn to_guest_name(cx: &mut ContextState, kind: super::names::Kind, out: *mut i32) {
    // SAFETY: the caller's contract.
    unsafe { *out = cx.share().guest_of(kind, *out as u32) as i32 };
}

/// `GL_VERTEX_ATTRIB_ARRAY_BUFFER_BINDING` answers the guest's name.
pub(crate) fn glGetVertexAttribiv(
    _gl: &Gl,
    cx: &mut ContextState,
    _index: u32,
    pname: u32,
    params: *mut i32,
) {
    if pname == 0x889F {
        // SAFETY: `params` is the decoder's output buffer (one value at least).
        unsafe { to_guest_name(cx, super::names::Kind::Buffer, params) };
    }
}

/// `GL_FRAMEBUFFER_ATTACHMENT_OBJECT_NAME` answers the guest's name of the texture or
/// renderbuffer.
pub(crate) fn glGetFramebufferAttachmentParameteriv(
    gl: &Gl,
    cx: &mut ContextState,
    target: u32,
    attachment: u32,
    pname: u32,
    params: *mut i32,
) {
    if pname != 0x8CD1 {
        return;
    }
    let mut ty = 0i32;
    // SAFETY: a current context; one value (the attachment's object type).
    unsafe { (gl.glGetFramebufferAttachmentParameteriv)(target, attachment, 0x8CD0, &mut ty) };
    let kind = match ty as u32 {
        0x1702 => super::names::Kind::Texture,
        0x8D41 => super::names::Kind::Renderbuffer,
        _ => return,
    };
    // SAFETY: `params` is the decoder's output buffer (one value at least).
    unsafe { to_guest_name(cx, kind, params) };
}

/// Puts the alignment the sizes were computed with in force (whatever else set it on this
/// context).
fn assert_alignment(gl: &Gl, pname: u32, alignment: i64) {
    // SAFETY: a current context; scalar arguments.
    unsafe { (gl.glPixelStorei)(pname, alignment as i32) };
}

pub(crate) fn check_glTexImage2D(
    gl: &Gl,
    cx: &mut ContextState,
    _target: u32,
    _level: i32,
    _internalformat: i32,
    _width: i32,
    _height: i32,
    _border: i32,
    _format: u32,
    _ty: u32,
    _pixels: *const c_void,
) -> bool {
    assert_alignment(gl, 0x0CF5, cx.unpack_alignment);
    true
}

pub(crate) fn check_glTexSubImage2D(
    gl: &Gl,
    cx: &mut ContextState,
    _target: u32,
    _level: i32,
    _xoffset: i32,
    _yoffset: i32,
    _width: i32,
    _height: i32,
    _format: u32,
    _ty: u32,
    _pixels: *const c_void,
) -> bool {
    assert_alignment(gl, 0x0CF5, cx.unpack_alignment);
    true
}

pub(crate) fn check_glReadPixels(
    gl: &Gl,
    cx: &mut ContextState,
    _x: i32,
    _y: i32,
    _width: i32,
    _height: i32,
    _format: u32,
    _ty: u32,
    _pixels: *mut c_void,
) -> bool {
    assert_alignment(gl, 0x0D05, cx.pack_alignment);
    true
}
