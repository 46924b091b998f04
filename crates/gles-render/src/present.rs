//! Presents ([`egl::PRESENT`](virtsoc_gles_stream::egl::PRESENT)): a guest surface's pixels
//! into the frame region's replica in the `gles` domain, which the daemon shares with the
//! worker ([`crate::mapped`]) and the display scans out where it is: at most one copy of
//! the frame's bytes, with rows from the top (the display's order, GL's are from the
//! bottom) at no extra cost.
//!
//! Two ways behind one call; a probe when the worker starts finds what the host can do:
//! - **readback** (the default where the driver reverses rows): `glReadPixels` straight
//!   into the mapping (one copy), rows reversed by the driver
//!   (`GL_ANGLE_pack_reverse_row_order`); without that extension the surface is first
//!   blitted upside down into a renderbuffer of the worker's (two copies).
//! - **direct** (`VIRTSOC_RENDER_PRESENT=direct`, or where the rows cannot be reversed):
//!   the frame's memfd is imported as the texture of a framebuffer
//!   (`GL_EXT_memory_object_fd`, [`crate::memobj`]: the worker writes the driver's header
//!   into the memfd's first page) and the surface is blitted into it upside down
//!   (`glBlitFramebuffer`; one copy). It needs the frame's rows to be the driver's
//!   (`llvmpipe`: multiples of 64 bytes) and a driver that takes the memfd; a frame it
//!   refuses (an incomplete framebuffer) is read back.
//!
//! On llvmpipe the blit costs more CPU than the readback (a textured draw through the
//! rasterizer threads against a row copy): windowed glmark2-es2 `texture` + `build`,
//! daemon and worker CPU per frame 6.9-7.4 ms direct, 4.3-5.2 ms readback, 5.2-5.4 ms for
//! the three-copy path before (release, load 9-10 on 2 cores, interleaved runs). A GPU
//! whose driver takes the frame's memory (an exported image) would blit on its copy engine
//! instead of stalling on a readback: that is where the direct way pays.
//!
//! Everything runs on a context of the worker's own (current with the guest's surface),
//! so the guest context's bindings and pixel store are never touched.

use std::collections::HashMap;
use std::ffi::{c_void, CStr};

use crate::egl::{EglError, Handle, HostEgl};
use crate::mapped::Mapping;
use crate::memobj;

const GL_READ_FRAMEBUFFER: u32 = 0x8CA8;
const GL_DRAW_FRAMEBUFFER: u32 = 0x8CA9;
const GL_FRAMEBUFFER: u32 = 0x8D40;
const GL_RENDERBUFFER: u32 = 0x8D41;
const GL_COLOR_ATTACHMENT0: u32 = 0x8CE0;
const GL_FRAMEBUFFER_COMPLETE: u32 = 0x8CD5;
const GL_TEXTURE_2D: u32 = 0x0DE1;
const GL_COLOR_BUFFER_BIT: u32 = 0x4000;
const GL_NEAREST: u32 = 0x2600;
const GL_PACK_ALIGNMENT: u32 = 0x0D05;
const GL_PACK_REVERSE_ROW_ORDER_ANGLE: u32 = 0x93A4;
const GL_EXTENSIONS: u32 = 0x1F03;
const GL_RGBA: u32 = 0x1908;
const GL_RGBA8: u32 = 0x8058;
const GL_UNSIGNED_BYTE: u32 = 0x1401;

/// Why a present (or the probe of the host) did not happen; logged by the worker.
#[derive(Debug, thiserror::Error)]
pub enum PresentError {
    /// The host GL lacks a framebuffer function presents need.
    #[error("the host GL lacks framebuffer functions")]
    NoFramebufferFunctions,
    /// The present context could not be made or made current.
    #[error("present context: {0}")]
    Context(EglError),
    /// The frame mapping is smaller than the frame (or the frame is empty).
    #[error("a {w}x{h} frame in a {len}-byte mapping")]
    MappingTooSmall {
        /// The frame's width.
        w: u32,
        /// The frame's height.
        h: u32,
        /// The mapping's length in bytes.
        len: usize,
    },
    /// The functions were not loaded (no present context was entered).
    #[error("no functions")]
    NoFunctions,
    /// The host GL has no `glBlitFramebuffer` for a direct present.
    #[error("no glBlitFramebuffer")]
    NoBlit,
    /// The host GL has no `glBlitFramebuffer` to flip the rows before a readback.
    #[error("no glBlitFramebuffer to flip the rows")]
    NoBlitToFlip,
}

type GenFn = unsafe extern "C" fn(i32, *mut u32);
type DeleteFn = unsafe extern "C" fn(i32, *const u32);
type BindFn = unsafe extern "C" fn(u32, u32);

/// The host functions presents need.
struct Fns {
    gen_framebuffers: GenFn,
    delete_framebuffers: DeleteFn,
    bind_framebuffer: BindFn,
    framebuffer_texture: unsafe extern "C" fn(u32, u32, u32, u32, i32),
    framebuffer_renderbuffer: unsafe extern "C" fn(u32, u32, u32, u32),
    check_status: unsafe extern "C" fn(u32) -> u32,
    gen_renderbuffers: GenFn,
    delete_renderbuffers: DeleteFn,
    bind_renderbuffer: BindFn,
    renderbuffer_storage: unsafe extern "C" fn(u32, u32, i32, i32),
    delete_textures: DeleteFn,
    blit: Option<unsafe extern "C" fn(i32, i32, i32, i32, i32, i32, i32, i32, u32, u32)>,
    read_pixels: unsafe extern "C" fn(i32, i32, i32, i32, u32, u32, *mut c_void),
    pixel_storei: unsafe extern "C" fn(u32, i32),
    get_string: unsafe extern "C" fn(u32) -> *const u8,
    finish: unsafe extern "C" fn(),
}

impl Fns {
    fn load(egl: &HostEgl) -> Option<Fns> {
        Some(Fns {
            gen_framebuffers: egl.function(c"glGenFramebuffers")?,
            delete_framebuffers: egl.function(c"glDeleteFramebuffers")?,
            bind_framebuffer: egl.function(c"glBindFramebuffer")?,
            framebuffer_texture: egl.function(c"glFramebufferTexture2D")?,
            framebuffer_renderbuffer: egl.function(c"glFramebufferRenderbuffer")?,
            check_status: egl.function(c"glCheckFramebufferStatus")?,
            gen_renderbuffers: egl.function(c"glGenRenderbuffers")?,
            delete_renderbuffers: egl.function(c"glDeleteRenderbuffers")?,
            bind_renderbuffer: egl.function(c"glBindRenderbuffer")?,
            renderbuffer_storage: egl.function(c"glRenderbufferStorage")?,
            delete_textures: egl.function(c"glDeleteTextures")?,
            blit: egl.function(c"glBlitFramebuffer"),
            read_pixels: egl.function(c"glReadPixels")?,
            pixel_storei: egl.function(c"glPixelStorei")?,
            get_string: egl.function(c"glGetString")?,
            finish: egl.function(c"glFinish")?,
        })
    }
}

/// How a present writes a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Way {
    /// Blitted into the frame's memory imported as a texture.
    Direct,
    /// Read back into the mapping.
    Readback,
}

/// What the worker made of one frame mapping.
enum Target {
    /// A framebuffer on the mapping's memfd, imported.
    Direct { tex: u32, fbo: u32 },
    /// The mapping is written by `glReadPixels`.
    Readback,
}

/// What the probe found the host can do.
#[derive(Clone, Copy)]
struct Caps {
    /// The driver imports memfds with llvmpipe's header and has `glBlitFramebuffer`.
    direct: bool,
    /// `GL_ANGLE_pack_reverse_row_order`.
    reverse_rows: bool,
}

impl Caps {
    /// Whether frames are imported and blitted into (else read back).
    fn use_direct(&self, prefer_direct: bool) -> bool {
        self.direct && (prefer_direct || !self.reverse_rows)
    }
}

/// The worker's presents.
#[derive(Default)]
pub struct Presenter {
    fns: Option<Fns>,
    ctx: Option<Handle>,
    caps: Option<Caps>,
    /// By the daemon's mapping handle.
    targets: HashMap<u32, Target>,
    /// A renderbuffer the surface is flipped into for a readback without reversed rows:
    /// `(fbo, renderbuffer, size)`.
    scratch: Option<(u32, u32, (u32, u32))>,
    /// Frames are blitted into where the host can (`VIRTSOC_RENDER_PRESENT=direct`).
    pub(crate) prefer_direct: bool,
}

// SAFETY: the worker presents from one thread only; the handles are plain pointers.
unsafe impl Send for Presenter {}

impl Presenter {
    /// Makes the present context current with `surface` (the guest's) as both draw and read
    /// surface; loads the functions and probes the host the first time.
    fn enter(&mut self, egl: &HostEgl, surface: Handle) -> Result<(), PresentError> {
        if self.fns.is_none() {
            self.fns = Some(Fns::load(egl).ok_or(PresentError::NoFramebufferFunctions)?);
        }
        let ctx = match self.ctx {
            Some(c) => c,
            None => {
                let null = std::ptr::null_mut();
                let c = egl
                    .create_context(null, null, 3)
                    .or_else(|_| egl.create_context(null, null, 2))
                    .map_err(PresentError::Context)?;
                self.ctx = Some(c);
                c
            }
        };
        egl.make_current(surface, surface, ctx)
            .map_err(PresentError::Context)?;
        if self.caps.is_none() {
            self.caps = Some(self.probe(egl));
        }
        Ok(())
    }

    /// Probes the host once, before the sandbox (the probe writes a memfd with `pwrite`,
    /// which the sandbox does not allow). Leaves the present context current (surfaceless).
    pub fn probe_host(&mut self, egl: &HostEgl) {
        self.prefer_direct = matches!(
            std::env::var("VIRTSOC_RENDER_PRESENT").as_deref(),
            Ok("direct")
        );
        if self.caps.is_some() {
            return;
        }
        let null = std::ptr::null_mut();
        if let Err(e) = self.enter(egl, null) {
            log::warn!("render worker: presents: {e}");
        }
    }

    /// What the host can do: a memfd of llvmpipe's imported as a complete framebuffer, and
    /// the reversed-rows readback.
    fn probe(&self, egl: &HostEgl) -> Caps {
        let Some(f) = &self.fns else {
            return Caps {
                direct: false,
                reverse_rows: false,
            };
        };
        // SAFETY: the present context is current; glGetString answers a static string
        // or null.
        let ext = unsafe { (f.get_string)(GL_EXTENSIONS) };
        let reverse_rows = !ext.is_null()
            // SAFETY: non-null and NUL-terminated, owned by the driver.
            && unsafe { CStr::from_ptr(ext.cast()) }
                .to_bytes()
                .split(|&b| b == b' ')
                .any(|e| e == b"GL_ANGLE_pack_reverse_row_order");
        let direct = f.blit.is_some()
            && memobj::FrameMemory::new(16, 4, memobj::LLVMPIPE_UUID)
                .ok()
                .and_then(|mem| {
                    let tex = memobj::import_texture(egl, &mem, 16, 4).ok()?;
                    let fbo = self.framebuffer_on(tex);
                    self.delete(tex, fbo);
                    fbo.map(|_| ())
                })
                .is_some();
        log::info!("render worker: presents: direct {direct}, reversed rows {reverse_rows}");
        Caps {
            direct,
            reverse_rows,
        }
    }

    /// A complete framebuffer on texture `tex` of the present context, if it is one.
    fn framebuffer_on(&self, tex: u32) -> Option<u32> {
        let f = self.fns.as_ref()?;
        let mut fbo = 0;
        // SAFETY: the present context is current; `fbo` receives one name.
        let status = unsafe {
            (f.gen_framebuffers)(1, &mut fbo);
            (f.bind_framebuffer)(GL_FRAMEBUFFER, fbo);
            (f.framebuffer_texture)(GL_FRAMEBUFFER, GL_COLOR_ATTACHMENT0, GL_TEXTURE_2D, tex, 0);
            let s = (f.check_status)(GL_FRAMEBUFFER);
            (f.bind_framebuffer)(GL_FRAMEBUFFER, 0);
            s
        };
        if status == GL_FRAMEBUFFER_COMPLETE {
            return Some(fbo);
        }
        // SAFETY: the present context's framebuffer made above.
        unsafe { (f.delete_framebuffers)(1, &fbo) };
        None
    }

    /// Deletes texture `tex` and framebuffer `fbo` of the present context (which is
    /// current).
    fn delete(&self, tex: u32, fbo: Option<u32>) {
        let Some(f) = &self.fns else { return };
        // SAFETY: names of the present context, which is current; 0 is ignored.
        unsafe {
            if let Some(fbo) = fbo {
                (f.delete_framebuffers)(1, &fbo);
            }
            (f.delete_textures)(1, &tex);
        }
    }

    /// How frame mapping `handle` (`m`, `w` x `h`) is written: imported on first use when
    /// the host can.
    fn target(&mut self, egl: &HostEgl, handle: u32, m: &mut Mapping, (w, h): (u32, u32)) {
        if self.targets.contains_key(&handle) {
            return;
        }
        let direct = self.caps.is_some_and(|c| c.use_direct(self.prefer_direct))
            && memobj::llvmpipe_stride(w) == w as usize * 4
            && h % 4 == 0;
        let mut t = Target::Readback;
        if direct {
            let len = m.memfd_len() as u64;
            memobj::write_header(m.header_mut(), len, memobj::LLVMPIPE_UUID);
            if let Ok(tex) = memobj::import_fd(egl, m.fd(), m.memfd_len() as u64, w, h) {
                match self.framebuffer_on(tex) {
                    Some(fbo) => t = Target::Direct { tex, fbo },
                    None => self.delete(tex, None),
                }
            }
        }
        self.targets.insert(handle, t);
    }

    /// Presents `surface` (`w` x `h`, the guest's rendering finished) into frame mapping
    /// `handle` (`m`, RGBA8 rows of `w * 4` bytes from the top): the copies it took and
    /// how. The present context is left current.
    pub fn present(
        &mut self,
        egl: &HostEgl,
        surface: Handle,
        (handle, m): (u32, &mut Mapping),
        (w, h): (u32, u32),
    ) -> Result<(u32, Way), PresentError> {
        let need = u64::from(w) * u64::from(h) * 4;
        if w == 0 || h == 0 || (m.bytes().len() as u64) < need {
            return Err(PresentError::MappingTooSmall {
                w,
                h,
                len: m.bytes().len(),
            });
        }
        self.enter(egl, surface)?;
        self.target(egl, handle, m, (w, h));
        let caps = self.caps.unwrap_or(Caps {
            direct: false,
            reverse_rows: false,
        });
        let f = self.fns.as_ref().ok_or(PresentError::NoFunctions)?;
        let (wi, hi) = (w as i32, h as i32);
        match self.targets.get(&handle) {
            Some(Target::Direct { fbo, .. }) => {
                let blit = f.blit.ok_or(PresentError::NoBlit)?;
                // SAFETY: the present context is current with the guest's surface as its
                // window-system framebuffer; `fbo` is its complete framebuffer on the
                // frame's memory (`w` x `h`). The blit flips the rows: GL's bottom row
                // lands in the frame's first.
                unsafe {
                    (f.bind_framebuffer)(GL_READ_FRAMEBUFFER, 0);
                    (f.bind_framebuffer)(GL_DRAW_FRAMEBUFFER, *fbo);
                    blit(0, 0, wi, hi, 0, hi, wi, 0, GL_COLOR_BUFFER_BIT, GL_NEAREST);
                    (f.bind_framebuffer)(GL_FRAMEBUFFER, 0);
                    (f.finish)();
                }
                Ok((1, Way::Direct))
            }
            _ if caps.reverse_rows => {
                // SAFETY: the present context is current with the guest's surface; the
                // mapping holds at least `w * h * 4` bytes (checked above), which
                // glReadPixels writes at pack alignment 4 (rows of `w * 4` bytes), the
                // last row first.
                unsafe {
                    (f.bind_framebuffer)(GL_FRAMEBUFFER, 0);
                    (f.pixel_storei)(GL_PACK_ALIGNMENT, 4);
                    (f.pixel_storei)(GL_PACK_REVERSE_ROW_ORDER_ANGLE, 1);
                    (f.read_pixels)(
                        0,
                        0,
                        wi,
                        hi,
                        GL_RGBA,
                        GL_UNSIGNED_BYTE,
                        m.bytes_mut().as_mut_ptr().cast(),
                    );
                }
                Ok((1, Way::Readback))
            }
            _ => self
                .flipped_readback(m, (w, h))
                .map(|()| (2, Way::Readback)),
        }
    }

    /// The surface blitted upside down into a renderbuffer of the worker's, then read into
    /// the mapping (a host without reversed-row readbacks).
    fn flipped_readback(
        &mut self,
        m: &mut Mapping,
        (w, h): (u32, u32),
    ) -> Result<(), PresentError> {
        let f = self.fns.as_ref().ok_or(PresentError::NoFunctions)?;
        let blit = f.blit.ok_or(PresentError::NoBlitToFlip)?;
        if self.scratch.is_some_and(|s| s.2 != (w, h)) {
            if let Some((fbo, rb, _)) = self.scratch.take() {
                // SAFETY: names of the present context, which is current.
                unsafe {
                    (f.delete_framebuffers)(1, &fbo);
                    (f.delete_renderbuffers)(1, &rb);
                }
            }
        }
        let (wi, hi) = (w as i32, h as i32);
        let (fbo, _, _) = match self.scratch {
            Some(s) => s,
            None => {
                let (mut fbo, mut rb) = (0, 0);
                // SAFETY: the present context is current; one name each.
                unsafe {
                    (f.gen_renderbuffers)(1, &mut rb);
                    (f.bind_renderbuffer)(GL_RENDERBUFFER, rb);
                    (f.renderbuffer_storage)(GL_RENDERBUFFER, GL_RGBA8, wi, hi);
                    (f.gen_framebuffers)(1, &mut fbo);
                    (f.bind_framebuffer)(GL_FRAMEBUFFER, fbo);
                    (f.framebuffer_renderbuffer)(
                        GL_FRAMEBUFFER,
                        GL_COLOR_ATTACHMENT0,
                        GL_RENDERBUFFER,
                        rb,
                    );
                    (f.bind_framebuffer)(GL_FRAMEBUFFER, 0);
                }
                self.scratch = Some((fbo, rb, (w, h)));
                (fbo, rb, (w, h))
            }
        };
        // SAFETY: the present context is current with the guest's surface; `fbo` is its
        // `w` x `h` renderbuffer framebuffer; the mapping holds `w * h * 4` bytes
        // (checked by the caller), written at pack alignment 4.
        unsafe {
            (f.bind_framebuffer)(GL_READ_FRAMEBUFFER, 0);
            (f.bind_framebuffer)(GL_DRAW_FRAMEBUFFER, fbo);
            blit(0, 0, wi, hi, 0, hi, wi, 0, GL_COLOR_BUFFER_BIT, GL_NEAREST);
            (f.bind_framebuffer)(GL_READ_FRAMEBUFFER, fbo);
            (f.pixel_storei)(GL_PACK_ALIGNMENT, 4);
            (f.read_pixels)(
                0,
                0,
                wi,
                hi,
                GL_RGBA,
                GL_UNSIGNED_BYTE,
                m.bytes_mut().as_mut_ptr().cast(),
            );
            (f.bind_framebuffer)(GL_FRAMEBUFFER, 0);
        }
        Ok(())
    }

    /// Forgets what was made of frame mapping `handle` (it is being unmapped). Makes the
    /// present context current (surfaceless) when there was something to delete.
    pub fn forget(&mut self, egl: &HostEgl, handle: u32) {
        let Some(Target::Direct { tex, fbo }) = self.targets.remove(&handle) else {
            return;
        };
        let (Some(ctx), null) = (self.ctx, std::ptr::null_mut()) else {
            return;
        };
        if egl.make_current(null, null, ctx).is_ok() {
            self.delete(tex, Some(fbo));
        }
    }

    /// How many frame mappings are imported as textures (tests).
    pub fn direct_targets(&self) -> usize {
        self.targets
            .values()
            .filter(|t| matches!(t, Target::Direct { .. }))
            .count()
    }
}
