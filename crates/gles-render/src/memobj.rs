//! Frame memory shared by file descriptor: an RGBA8 texture of the host's driver whose pixels
//! live in a memfd another process maps too (`GL_EXT_memory_object` +
//! `GL_EXT_memory_object_fd`), so rendered frames reach that memory without a copy.
//!
//! Mesa's llvmpipe imports an opaque fd only if it starts with the header Mesa writes when it
//! exports one itself (`util/os_memory_fd.c`): `size_t size | size_t offset | u8 uuid[16]`,
//! the mapping's size, where the data starts, and the first 16 bytes of the SHA-1 of the
//! driver's id (`"llvmpipe"` followed by Mesa's git hash, empty in Debian's build). A frame
//! memfd ([`FrameMemory`]) is that header, padded to a page, then the texture's bytes in
//! llvmpipe's layout: rows of `width * 4` bytes rounded up to 64, from the bottom (GL's
//! order). Another driver (or a Mesa with another id) refuses the import: the caller keeps
//! the counted `glReadPixels` readback then.
//!
//! The worker's presents ([`crate::present`]) import the frame region's shared replica
//! (a memfd of the daemon's whose first page takes the header, [`write_header`]) this way;
//! `tests` render into one and read the pixels through the mapping.

use std::ffi::{c_void, CStr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use crate::egl::HostEgl;

/// `SHA-1("llvmpipe")[..16]`: llvmpipe's driver id as Debian's Mesa 22.3 checks it.
pub const LLVMPIPE_UUID: [u8; 16] = [
    108, 185, 238, 7, 74, 11, 173, 123, 1, 46, 27, 233, 105, 126, 83, 15,
];
/// Where the pixels start in a frame memfd (after the header, page aligned).
pub const DATA_OFFSET: usize = 4096;

/// Why frame memory could not be made or imported.
#[derive(Debug, thiserror::Error)]
pub enum MemObjError {
    /// A system call failed.
    #[error("{0}: {1}")]
    Os(&'static str, std::io::Error),
    /// The driver lacks a function of the extensions.
    #[error("the host GL has no {0}")]
    Missing(&'static str),
    /// The driver refused the memory or the texture.
    #[error("{0} failed (GL error {1:#x}, framebuffer status {2:#x})")]
    Gl(&'static str, u32, u32),
}

/// Bytes of Mesa's header: `size_t size | size_t offset | u8 uuid[16]`.
pub const HEADER_LEN: usize = 32;

/// Writes Mesa's header for a memfd of `memfd_len` bytes whose data starts at
/// [`DATA_OFFSET`] into the start of `page` (at least [`HEADER_LEN`] bytes).
pub fn write_header(page: &mut [u8], memfd_len: u64, uuid: [u8; 16]) {
    let mut header = [0u8; HEADER_LEN];
    header[..8].copy_from_slice(&memfd_len.to_ne_bytes());
    header[8..16].copy_from_slice(&(DATA_OFFSET as u64).to_ne_bytes());
    header[16..].copy_from_slice(&uuid);
    if let Some(dst) = page.get_mut(..HEADER_LEN) {
        dst.copy_from_slice(&header);
    }
}

/// Bytes per row of an RGBA8 texture of `width` in llvmpipe's layout (rounded up to 64).
pub fn llvmpipe_stride(width: u32) -> usize {
    (width as usize * 4).div_ceil(64) * 64
}

/// A memfd holding one `width` x `height` RGBA8 frame after Mesa's header.
pub struct FrameMemory {
    /// The memfd.
    pub fd: OwnedFd,
    /// Its size in bytes.
    pub len: usize,
    /// Bytes per row of the frame.
    pub stride: usize,
}

impl FrameMemory {
    /// A memfd for a `width` x `height` frame, with the header `uuid` (the driver's id hash).
    pub fn new(width: u32, height: u32, uuid: [u8; 16]) -> Result<FrameMemory, MemObjError> {
        let stride = (width as usize * 4).div_ceil(64) * 64;
        // llvmpipe rounds the rows of a texture up to 4 (its raster block).
        let rows = (height as usize).div_ceil(4) * 4;
        let len = DATA_OFFSET + stride * rows;
        // SAFETY: a NUL-terminated name; the flags ask for nothing unusual.
        let raw = unsafe { libc::memfd_create(c"virtsoc-frame".as_ptr(), libc::MFD_CLOEXEC) };
        if raw < 0 {
            return Err(MemObjError::Os(
                "memfd_create",
                std::io::Error::last_os_error(),
            ));
        }
        // SAFETY: a fresh descriptor this function owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let file = std::fs::File::from(fd);
        file.set_len(len as u64)
            .map_err(|e| MemObjError::Os("ftruncate", e))?;
        let mut header = [0u8; HEADER_LEN];
        write_header(&mut header, len as u64, uuid);
        std::os::unix::fs::FileExt::write_all_at(&file, &header, 0)
            .map_err(|e| MemObjError::Os("writing the header", e))?;
        Ok(FrameMemory {
            fd: file.into(),
            len,
            stride,
        })
    }
}

type Fn0 = unsafe extern "C" fn();
type GenFn = unsafe extern "C" fn(i32, *mut u32);
type DeleteFn = unsafe extern "C" fn(i32, *const u32);
type ImportFdFn = unsafe extern "C" fn(u32, u64, u32, i32);
type TexStorageMemFn = unsafe extern "C" fn(u32, i32, u32, i32, i32, u32, u64);
type BindFn = unsafe extern "C" fn(u32, u32);
type GetErrorFn = unsafe extern "C" fn() -> u32;

/// The GL functions an import needs, loaded from the host's EGL.
struct MemGl {
    create_memory_objects: GenFn,
    delete_memory_objects: DeleteFn,
    import_memory_fd: ImportFdFn,
    tex_storage_mem_2d: TexStorageMemFn,
    gen_textures: GenFn,
    bind_texture: BindFn,
    get_error: GetErrorFn,
}

fn load(egl: &HostEgl, name: &'static CStr) -> Result<Fn0, MemObjError> {
    let p = egl.proc_address(name);
    if p.is_null() {
        return Err(MemObjError::Missing(name.to_str().unwrap_or("?")));
    }
    // SAFETY: a non-null function address of the host's GL; callers give it its prototype
    // before calling it (`gl_fn!`).
    Ok(unsafe { std::mem::transmute::<*const c_void, Fn0>(p) })
}

/// The host's GL function `$name` as a `$t`, the prototype its specification gives it.
macro_rules! gl_fn {
    ($egl:expr, $name:literal, $t:ty) => {{
        let f = load($egl, $name)?;
        // SAFETY: `$t` is the prototype of `$name` in GLES 2.0 / GL_EXT_memory_object(_fd).
        unsafe { std::mem::transmute::<Fn0, $t>(f) }
    }};
}

impl MemGl {
    fn load(egl: &HostEgl) -> Result<MemGl, MemObjError> {
        Ok(MemGl {
            create_memory_objects: gl_fn!(egl, c"glCreateMemoryObjectsEXT", GenFn),
            delete_memory_objects: gl_fn!(egl, c"glDeleteMemoryObjectsEXT", DeleteFn),
            import_memory_fd: gl_fn!(egl, c"glImportMemoryFdEXT", ImportFdFn),
            tex_storage_mem_2d: gl_fn!(egl, c"glTexStorageMem2DEXT", TexStorageMemFn),
            gen_textures: gl_fn!(egl, c"glGenTextures", GenFn),
            bind_texture: gl_fn!(egl, c"glBindTexture", BindFn),
            get_error: gl_fn!(egl, c"glGetError", GetErrorFn),
        })
    }
}

/// Makes a `GL_TEXTURE_2D` of the current context whose RGBA8 pixels are `mem`'s (a
/// duplicate of its fd goes to the driver). Returns the texture name; the texture stays
/// bound to `GL_TEXTURE_2D`. Mesa reports no error when it refuses the memory (a header
/// without its driver id): the texture then has no storage, and a framebuffer on it is
/// incomplete (`GL_FRAMEBUFFER_INCOMPLETE_ATTACHMENT`), which the caller checks.
pub fn import_texture(
    egl: &HostEgl,
    mem: &FrameMemory,
    width: u32,
    height: u32,
) -> Result<u32, MemObjError> {
    import_fd(egl, mem.fd.as_fd(), mem.len as u64, width, height)
}

/// [`import_texture`] of memfd `fd` of `len` bytes (which starts with Mesa's header,
/// [`write_header`]).
pub fn import_fd(
    egl: &HostEgl,
    fd: BorrowedFd<'_>,
    len: u64,
    width: u32,
    height: u32,
) -> Result<u32, MemObjError> {
    const TEXTURE_2D: u32 = 0x0DE1;
    const RGBA8: u32 = 0x8058;
    const HANDLE_TYPE_OPAQUE_FD: u32 = 0x9586;
    let gl = MemGl::load(egl)?;
    let dup = fd
        .try_clone_to_owned()
        .map_err(|e| MemObjError::Os("dup", e))?;
    let (mut mo, mut tex) = (0u32, 0u32);
    // SAFETY: a context is current (the caller's contract); the driver takes ownership of
    // the duplicated fd on import (into_raw_fd gives it up here).
    unsafe {
        (gl.get_error)();
        (gl.create_memory_objects)(1, &mut mo);
        (gl.import_memory_fd)(mo, len, HANDLE_TYPE_OPAQUE_FD, {
            let raw = dup.as_raw_fd();
            std::mem::forget(dup);
            raw
        });
        let e = (gl.get_error)();
        if e != 0 {
            (gl.delete_memory_objects)(1, &mo);
            return Err(MemObjError::Gl("glImportMemoryFdEXT", e, 0));
        }
        (gl.gen_textures)(1, &mut tex);
        (gl.bind_texture)(TEXTURE_2D, tex);
        (gl.tex_storage_mem_2d)(TEXTURE_2D, 1, RGBA8, width as i32, height as i32, mo, 0);
        let e = (gl.get_error)();
        // The texture keeps the memory; the object's name is not needed any more.
        (gl.delete_memory_objects)(1, &mo);
        if e != 0 {
            return Err(MemObjError::Gl("glTexStorageMem2DEXT", e, 0));
        }
    }
    Ok(tex)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::egl::TestContext;

    type GlFn<A> = unsafe extern "C" fn(A);

    /// Clears a framebuffer on `tex` to orange with a 4x2 blue corner and returns the
    /// memfd's bytes (`Err`: the framebuffer's status, when it is not complete).
    fn clear_and_read(egl: &HostEgl, mem: &FrameMemory, tex: u32) -> Result<Vec<u8>, u32> {
        // A framebuffer on the texture, cleared to one colour with a 4x2 corner in another.
        type ColorFn = unsafe extern "C" fn(f32, f32, f32, f32);
        type RectFn = unsafe extern "C" fn(i32, i32, i32, i32);
        type FbTexFn = unsafe extern "C" fn(u32, u32, u32, u32, i32);
        type StatusFn = unsafe extern "C" fn(u32) -> u32;
        let f = |n: &'static CStr| load(egl, n).expect("GL function");
        // SAFETY: each function gets the GLES 2.0 prototype of its name; the context is
        // current.
        unsafe {
            let gen_fb = std::mem::transmute::<Fn0, GenFn>(f(c"glGenFramebuffers"));
            let bind_fb = std::mem::transmute::<Fn0, BindFn>(f(c"glBindFramebuffer"));
            let fb_tex = std::mem::transmute::<Fn0, FbTexFn>(f(c"glFramebufferTexture2D"));
            let status = std::mem::transmute::<Fn0, StatusFn>(f(c"glCheckFramebufferStatus"));
            let clear_color = std::mem::transmute::<Fn0, ColorFn>(f(c"glClearColor"));
            let clear = std::mem::transmute::<Fn0, GlFn<u32>>(f(c"glClear"));
            let enable = std::mem::transmute::<Fn0, GlFn<u32>>(f(c"glEnable"));
            let scissor = std::mem::transmute::<Fn0, RectFn>(f(c"glScissor"));
            let finish: Fn0 = f(c"glFinish");
            let mut fb = 0;
            gen_fb(1, &mut fb);
            bind_fb(0x8D40, fb);
            fb_tex(0x8D40, 0x8CE0, 0x0DE1, tex, 0);
            let st = status(0x8D40);
            if st != 0x8CD5 {
                return Err(st);
            }
            clear_color(1.0, 0.5, 0.0, 1.0);
            clear(0x4000);
            enable(0x0C11);
            scissor(0, 0, 4, 2);
            clear_color(0.0, 0.0, 1.0, 1.0);
            clear(0x4000);
            finish();
        }
        let file = std::fs::File::from(mem.fd.try_clone().expect("dup"));
        let mut bytes = vec![0u8; mem.len];
        std::os::unix::fs::FileExt::read_exact_at(&file, &mut bytes, 0).expect("read");
        Ok(bytes)
    }

    #[test]
    fn llvmpipe_renders_into_a_memfd_of_ours() {
        let host = TestContext::open(2, (16, 16)).expect("host EGL (Mesa)");
        let egl = &host.egl;
        let (w, h) = (40u32, 30u32);
        let mem = FrameMemory::new(w, h, LLVMPIPE_UUID).expect("memfd");
        let tex = import_texture(egl, &mem, w, h).expect("llvmpipe imports our memfd");
        assert_ne!(tex, 0);
        let bytes = clear_and_read(egl, &mem, tex).expect("framebuffer complete");
        let px = |x: usize, y: usize| {
            let at = DATA_OFFSET + y * mem.stride + x * 4;
            [bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]
        };
        // Row 0 is GL's bottom row: the scissored corner.
        assert_eq!(px(0, 0), [0, 0, 255, 255]);
        assert_eq!(px(3, 1), [0, 0, 255, 255]);
        assert_eq!(px(4, 0), [255, 128, 0, 255]);
        assert_eq!(px(39, 29), [255, 128, 0, 255]);
    }

    #[test]
    fn a_memfd_without_the_drivers_id_is_refused() {
        let host = TestContext::open(2, (16, 16)).expect("host EGL (Mesa)");
        let egl = &host.egl;
        let mem = FrameMemory::new(8, 8, [0; 16]).expect("memfd");
        // Mesa answers no GL error when it refuses the memory (its import fails silently):
        // the texture has no storage, so a framebuffer on it is incomplete (attachment).
        let tex = import_texture(egl, &mem, 8, 8).expect("no GL error");
        assert_eq!(clear_and_read(egl, &mem, tex), Err(0x8CD6));
    }
}
