//! Opcodes of the EGL and virtsoc commands that travel in the stream beside the GL calls
//! (GL opcodes are generated and stay below [`BASE`]). Payloads are documented per opcode.
//!
//! Guest context and surface ids are chosen by the guest (non-zero, unique per connection);
//! the render worker maps them to host objects and refuses ids it does not know. A command
//! that answers appends `u32 op | u32 len | payload` to the batch's reply (see
//! `docs/gles.md`); the answers below give that payload.

/// First opcode of this range.
pub const BASE: u32 = 0x1_0000;
/// `ctx u32`: the following packets run on guest context `ctx` (0: none).
pub const SET_CONTEXT: u32 = BASE;
/// `ctx u32 | share u32 | major u32`: creates guest context `ctx` for OpenGL ES `major`
/// (2 only for now), sharing objects with context `share` (0: none). Answers `u32 error`,
/// an EGL error code ([`SUCCESS`] when it was made).
pub const CREATE_CONTEXT: u32 = BASE + 1;
/// `ctx u32`: destroys guest context `ctx` (once no longer current on the host).
pub const DESTROY_CONTEXT: u32 = BASE + 2;
/// `surf u32 | width u32 | height u32 | config u32`: creates guest surface `surf` (a
/// window or pbuffer of the guest), a host off-screen surface of `width` x `height`
/// (each 1..=[`MAX_SURFACE`]) in guest config `config`. Answers `u32 error`.
pub const CREATE_SURFACE: u32 = BASE + 3;
/// `surf u32`: destroys guest surface `surf`.
pub const DESTROY_SURFACE: u32 = BASE + 4;
/// `ctx u32 | draw u32 | read u32`: binds guest context `ctx` to surfaces `draw` and
/// `read` (0: none, surfaceless) and makes it the context the following packets run on.
/// `ctx` 0 releases the current context. Answers `u32 error`.
pub const MAKE_CURRENT: u32 = BASE + 5;
/// `surf u32`: the guest swapped surface `surf`: the host flushes its rendering.
pub const SWAP: u32 = BASE + 6;
/// `surf u32 | width u32 | height u32`: surface `surf`'s window changed size: the host
/// surface is remade at the new size (its contents are undefined until the next frame).
pub const RESIZE_SURFACE: u32 = BASE + 7;
/// No payload: waits until the host ran everything sent before (`glFinish` on the current
/// context). Answers an empty payload (used by fence syncs and `eglWaitClient`).
pub const FINISH: u32 = BASE + 8;
/// `surf u32`: reads surface `surf` back for the display: the host finishes the current
/// context's rendering and answers `u32 width | u32 height | u32 byte_len |
/// width * height * 4 bytes` of RGBA8 pixels, rows from the bottom, GL's order (0 x 0 when `surf` is not the draw surface
/// of the context the stream runs on). The daemon sends it itself (`gles::readback`); in a
/// guest's stream it is refused.
pub const READBACK: u32 = BASE + 9;

/// `handle u32 | bytes u64`: the daemon shares a replica of the guest's regions in the
/// `gles` memory domain with the worker: the memfd came with the message (`SCM_RIGHTS`,
/// one per MAP, in order), the replica's `bytes` start at its second page. The worker maps
/// it under `handle` (the daemon's name for it, non-zero) until [`UNMAP`]. The daemon's;
/// refused in a guest's stream. No answer.
pub const MAP: u32 = BASE + 0x10;
/// `handle u32`: the replica mapped as `handle` is gone (its region freed or reallocated):
/// the worker unmaps it and forgets what it made of it. The daemon's. No answer.
pub const UNMAP: u32 = BASE + 0x11;
/// `stream u32 | reply u32 | len u32`: runs the first `len` bytes of mapping `stream` (the
/// guest's stream region's replica; the daemon holds the guest's read access for the whole
/// batch) as a guest batch. Answers larger than the exec's inline answer go into mapping
/// `reply` (0: none) when they fit (the answer header says how many bytes it placed), else
/// travel on the socket. The daemon's, the last packet of its message.
pub const EXEC_MAPPED: u32 = BASE + 0x12;
/// `surf u32 | frame u32 | width u32 | height u32`: presents surface `surf` (the draw
/// surface of the context the stream runs on) into mapping `frame`, an RGBA8 image of
/// `width` x `height` with rows of `width * 4` bytes from the top (the display's order).
/// Answers `u32 width | u32 height | u32 copies` (0 x 0 when the surface is not the draw
/// surface or the sizes differ; `copies`: copies of the frame's bytes it took). The
/// daemon's.
pub const PRESENT: u32 = BASE + 0x13;

/// `image u32 | width u32 | height u32`: creates guest image `image` (an EGLImage of an SVM
/// region, `eglCreateImageKHR` with `EGL_VIRTSOC_REGION`): a host RGBA8 texture of `width`
/// x `height` (each 1..=[`MAX_SURFACE`]) wrapped in a host EGLImage. Its pixels arrive by
/// [`IMPORT`]. Answers `u32 error`.
pub const CREATE_IMAGE: u32 = BASE + 0x20;
/// `image u32`: destroys guest image `image` (textures bound to it keep its last pixels).
pub const DESTROY_IMAGE: u32 = BASE + 0x21;
/// `target u32 | image u32`: `glEGLImageTargetTexture2DOES` on the context the stream runs
/// on: the texture bound to `target` (`GL_TEXTURE_2D` or `GL_TEXTURE_EXTERNAL_OES`) becomes
/// a sibling of guest image `image`. No answer; an unknown image or a refused target is
/// `GL_INVALID_OPERATION` for the context.
pub const IMAGE_TARGET_TEXTURE: u32 = BASE + 0x22;
/// `image u32 | format u32 | width u32 | height u32 | stride u32 | offset1 u32 | offset2
/// u32 | byte_len u32 | bytes`: the pixels of guest image `image`, read by the daemon out
/// of the region's replica in the `gles` domain (`gles::import`), laid out as `format`
/// ([`IMAGE_RGBA8`], [`IMAGE_NV12`], [`IMAGE_YUV420`]) with luma (or RGBA) rows of
/// `stride` bytes from offset 0 and chroma planes at `offset1` (and `offset2`). The worker
/// converts YUV to RGBA (BT.601, limited range) and uploads it into the image's texture.
/// The daemon sends it itself; in a guest's stream it is refused. Answers `u32 error`.
pub const IMPORT: u32 = BASE + 0x23;

/// `image u32 | format u32 | width u32 | height u32 | stride u32 | offset1 u32 | offset2
/// u32 | mapping u32 | byte_len u32`: [`IMPORT`] of the first `byte_len` bytes of mapping
/// `mapping` (the region's replica in the `gles` domain, read where it is). The daemon's.
/// Answers `u32 error`.
pub const IMPORT_MAPPED: u32 = BASE + 0x24;

/// Image layout of [`IMPORT`]: RGBA8, 4 bytes a pixel.
pub const IMAGE_RGBA8: u32 = 1;
/// Image layout of [`IMPORT`]: NV12 (Y plane, then interleaved U/V at half resolution).
pub const IMAGE_NV12: u32 = 3;
/// Image layout of [`IMPORT`]: YUV 4:2:0 planar (Y, U, V; chroma rows of `stride / 2`).
pub const IMAGE_YUV420: u32 = 4;

/// EGL's success code, as the answers carry it.
pub const SUCCESS: u32 = 0x3000;
/// EGL_BAD_ALLOC.
pub const BAD_ALLOC: u32 = 0x3003;
/// EGL_BAD_CONFIG.
pub const BAD_CONFIG: u32 = 0x3005;
/// EGL_BAD_CONTEXT.
pub const BAD_CONTEXT: u32 = 0x3006;
/// EGL_BAD_MATCH.
pub const BAD_MATCH: u32 = 0x3009;
/// EGL_BAD_SURFACE.
pub const BAD_SURFACE: u32 = 0x300D;
/// EGL_BAD_PARAMETER.
pub const BAD_PARAMETER: u32 = 0x300C;

/// Largest width or height of a surface.
pub const MAX_SURFACE: u32 = 16384;

/// Guest configs the host knows: `(id, red, green, blue, alpha, depth, stencil)`. The guest
/// offers these and names them by id in [`CREATE_SURFACE`].
pub const CONFIGS: &[(u32, u32, u32, u32, u32, u32, u32)] = &[
    (1, 8, 8, 8, 8, 24, 8),
    (2, 8, 8, 8, 0, 24, 8),
    (3, 5, 6, 5, 0, 24, 8),
    (4, 8, 8, 8, 8, 0, 0),
    (5, 8, 8, 8, 0, 0, 0),
    (6, 5, 6, 5, 0, 0, 0),
    (7, 8, 8, 8, 8, 16, 0),
    (8, 5, 6, 5, 0, 16, 0),
];

/// The config of id `id`.
pub fn config(id: u32) -> Option<(u32, u32, u32, u32, u32, u32, u32)> {
    CONFIGS.iter().copied().find(|c| c.0 == id)
}
