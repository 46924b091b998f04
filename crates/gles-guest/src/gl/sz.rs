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

/// The unpack parameters in force (GLES 2.0's alignment, GLES 3.0's rows and skips).
pub fn unpack_store(st: &GlState) -> PixelStore {
    PixelStore {
        alignment: st.unpack_alignment,
        ..st.es3.unpack
    }
}

/// The pack parameters in force (no image height or image skips: `glReadPixels` is 2D).
pub fn pack_store(st: &GlState) -> PixelStore {
    PixelStore {
        alignment: st.pack_alignment,
        image_height: 0,
        skip_images: 0,
        ..st.es3.pack
    }
}

/// Bytes `glTexImage2D`/`glTexSubImage2D` read (unpack parameters in force).
pub fn teximage(st: &GlState, w: i64, h: i64, format: i64, ty: i64) -> Option<usize> {
    image_bytes_3d(w, h, 1, format as u32, ty as u32, &unpack_store(st))
}

/// Bytes `glTexImage3D`/`glTexSubImage3D` read (unpack parameters in force).
pub fn teximage3d(st: &GlState, w: i64, h: i64, d: i64, format: i64, ty: i64) -> Option<usize> {
    image_bytes_3d(w, h, d, format as u32, ty as u32, &unpack_store(st))
}

/// Bytes `glReadPixels` writes (pack parameters in force).
pub fn readpixels(st: &GlState, w: i64, h: i64, format: i64, ty: i64) -> Option<usize> {
    image_bytes_3d(w, h, 1, format as u32, ty as u32, &pack_store(st))
}

/// Whether a `GL_PIXEL_UNPACK_BUFFER` is bound: pixel pointers are offsets into it.
pub fn unpack_buffer_bound(st: &GlState) -> bool {
    st.es3.unpack_buffer() != 0
}

/// Values `glClearBuffer*v(buffer)` reads.
pub fn clearbuffer(_st: &GlState, buffer: i64) -> Option<usize> {
    clear_buffer_count(buffer as u32)
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
