//! Array sizes on the host, recomputed from a call's arguments and this context's state
//! (the functions the annotation file's length expressions name). The state-free ones are
//! shared with the guest (`crates/gles-gen/src/sizes.rs`).

#[allow(dead_code)]
#[path = "../../../gles-gen/src/sizes.rs"]
mod shared;

pub use shared::*;

use super::ContextState;

/// The unpack parameters the decoder computes sizes with (and puts in force before a call
/// reads pixels: `gl::es3::unpack_ptr`).
pub fn unpack_store(cx: &ContextState) -> PixelStore {
    PixelStore {
        alignment: cx.unpack_alignment,
        ..cx.es3.unpack
    }
}

/// The pack parameters (2D: no image height or image skips).
pub fn pack_store(cx: &ContextState) -> PixelStore {
    PixelStore {
        alignment: cx.pack_alignment,
        image_height: 0,
        skip_images: 0,
        ..cx.es3.pack
    }
}

/// Bytes `glTexImage2D`/`glTexSubImage2D` read (unpack parameters in force).
pub fn teximage(cx: &ContextState, w: i64, h: i64, format: i64, ty: i64) -> Option<usize> {
    image_bytes_3d(w, h, 1, format as u32, ty as u32, &unpack_store(cx))
}

/// Bytes `glTexImage3D`/`glTexSubImage3D` read (unpack parameters in force).
pub fn teximage3d(
    cx: &ContextState,
    w: i64,
    h: i64,
    d: i64,
    format: i64,
    ty: i64,
) -> Option<usize> {
    image_bytes_3d(w, h, d, format as u32, ty as u32, &unpack_store(cx))
}

/// Bytes `glReadPixels` writes (pack parameters in force).
pub fn readpixels(cx: &ContextState, w: i64, h: i64, format: i64, ty: i64) -> Option<usize> {
    image_bytes_3d(w, h, 1, format as u32, ty as u32, &pack_store(cx))
}

/// Values `glClearBuffer*v(buffer)` reads.
pub fn clearbuffer(_cx: &ContextState, buffer: i64) -> Option<usize> {
    clear_buffer_count(buffer as u32)
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
