//! Array sizes in the guest: how many bytes a call sends or receives, from its arguments
//! and the context's state (the functions the annotation file's length expressions name).
//! The state-free ones are shared with the host (`crates/gles-gen/src/sizes.rs`).

#[allow(dead_code)]
#[path = "../../../gles-gen/src/sizes.rs"]
mod shared;

pub use shared::*;

use super::GlState;

/// `GL_NUM_COMPRESSED_TEXTURE_FORMATS`.
const NUM_COMPRESSED_TEXTURE_FORMATS: u32 = 0x86A2;

/// Bytes `glTexImage2D`/`glTexSubImage2D` read (unpack alignment in force).
pub fn teximage(st: &GlState, w: i64, h: i64, format: i64, ty: i64) -> Option<usize> {
    image_bytes(w, h, format as u32, ty as u32, st.unpack_alignment)
}

/// Bytes `glReadPixels` writes (pack alignment in force).
pub fn readpixels(st: &GlState, w: i64, h: i64, format: i64, ty: i64) -> Option<usize> {
    image_bytes(w, h, format as u32, ty as u32, st.pack_alignment)
}

/// Values `glGet*v(pname)` writes into the caller's memory: the list queries write as many
/// as their count query said (asked before, so cached), 0 for the shader binary formats
/// (none exposed).
pub fn getv(st: &GlState, pname: i64) -> Option<usize> {
    match pname as u32 {
        0x86A3 => st
            .ints
            .get(&NUM_COMPRESSED_TEXTURE_FORMATS)
            .and_then(|v| v.first())
            .and_then(|n| usize::try_from(*n).ok()),
        0x8DF8 => Some(0),
        p => Some(get_count(p)),
    }
}

/// Values `glTexParameter*v`/`glGetTexParameter*v(pname)` use.
pub fn texparam(_st: &GlState, pname: i64) -> Option<usize> {
    Some(tex_param_count(pname as u32))
}

/// Values `glGetVertexAttrib*v(pname)` writes.
pub fn vattrib(_st: &GlState, pname: i64) -> Option<usize> {
    Some(vertex_attrib_count(pname as u32))
}
