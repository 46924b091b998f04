//! Array sizes on the host, recomputed from a call's arguments and this context's state
//! (the functions the annotation file's length expressions name). The state-free ones are
//! shared with the guest (`crates/gles-gen/src/sizes.rs`).

#[allow(dead_code)]
#[path = "../../../gles-gen/src/sizes.rs"]
mod shared;

pub use shared::*;

use super::ContextState;

/// Bytes `glTexImage2D`/`glTexSubImage2D` read (unpack alignment in force).
pub fn teximage(cx: &ContextState, w: i64, h: i64, format: i64, ty: i64) -> Option<usize> {
    image_bytes(w, h, format as u32, ty as u32, cx.unpack_alignment)
}

/// Bytes `glReadPixels` writes (pack alignment in force).
pub fn readpixels(cx: &ContextState, w: i64, h: i64, format: i64, ty: i64) -> Option<usize> {
    image_bytes(w, h, format as u32, ty as u32, cx.pack_alignment)
}

/// Values `glGet*v(pname)` writes.
pub fn getv(_cx: &ContextState, pname: i64) -> Option<usize> {
    Some(get_count(pname as u32))
}

/// Values `glTexParameter*v`/`glGetTexParameter*v(pname)` use.
pub fn texparam(_cx: &ContextState, pname: i64) -> Option<usize> {
    Some(tex_param_count(pname as u32))
}

/// Values `glGetVertexAttrib*v(pname)` writes.
pub fn vattrib(_cx: &ContextState, pname: i64) -> Option<usize> {
    Some(vertex_attrib_count(pname as u32))
}
