//! The worker's seam to the GL decoder ([`crate::gl`]): loading the host's GL functions,
//! share groups and per-context state, and running one GL packet. Everything the worker
//! knows about the decoder's API is here.

use std::ffi::{c_void, CStr};
use std::sync::{Arc, Mutex};

use virtsoc_gles_stream::{Encoder, Reader, StreamError};

use crate::gl::{ContextState, Gl, MissingGlFunction, Precision, ShareGroup};

/// The host's GL functions.
pub struct GlApi {
    gl: Gl,
    /// The precision new contexts' shaders run at (`crate::gl::precision`).
    precision: Precision,
}

/// The objects a group of sharing contexts has in common.
pub type Share = Arc<Mutex<ShareGroup>>;

/// The decoder's state of one guest context.
pub type CtxState = ContextState;

impl GlApi {
    /// Loads the host's GL functions through `get` (eglGetProcAddress).
    pub fn load(get: impl Fn(&CStr) -> *const c_void) -> Result<GlApi, MissingGlFunction> {
        // SAFETY: `get` answers the address of the named function of the host's GL (or
        // null), the loader's contract.
        let gl = unsafe { Gl::load(get) }?;
        Ok(GlApi {
            gl,
            precision: Precision::from_env(),
        })
    }

    /// Sets the precision the shaders of contexts made from now on run at (by default
    /// `$VIRTSOC_GLES_PRECISION`'s).
    pub fn set_precision(&mut self, p: Precision) {
        self.precision = p;
    }

    /// Decides [`Precision::Auto`] by the current context's renderer (contexts made before
    /// a decision decide at their first shader source): the line saying which precision is
    /// in force and why, as the daemon's `gles` backend line shows it (`highp (auto, host
    /// renderer llvmpipe (...))`).
    pub fn resolve_precision(&mut self) -> String {
        let (asked, renderer) = (self.precision, self.renderer());
        self.precision = asked.resolve(&renderer);
        let line = format!(
            "{} ({}, host renderer {renderer})",
            self.precision.name(),
            asked.name()
        );
        log::info!("render worker: guest shaders at {line}");
        line
    }

    /// The current context's `GL_RENDERER` (empty when there is none).
    pub fn renderer(&self) -> String {
        crate::gl::precision::renderer(&self.gl)
    }

    /// `glFlush` on the current context.
    pub fn flush(&self) {
        // SAFETY: a context is current when the worker calls this.
        unsafe { (self.gl.glFlush)() }
    }

    /// `glFinish` on the current context.
    pub fn finish(&self) {
        // SAFETY: a context is current when the worker calls this.
        unsafe { (self.gl.glFinish)() }
    }

    /// The current context's window-system framebuffer (FBO 0: its draw surface), `width`
    /// x `height` RGBA8 pixels with rows from the bottom (GL's order), into `px` (reused
    /// from frame to frame: a fresh buffer of a frame's size cost page faults on every
    /// readback); the context's framebuffer binding and pack alignment are left as they
    /// were.
    pub fn read_back_into(&self, width: u32, height: u32, px: &mut Vec<u8>) {
        const FRAMEBUFFER: u32 = 0x8D40;
        const FRAMEBUFFER_BINDING: u32 = 0x8CA6;
        const PACK_ALIGNMENT: u32 = 0x0D05;
        let (w, h) = (width as usize, height as usize);
        px.resize(w * h * 4, 0);
        let (mut fbo, mut align) = (0, 4);
        // SAFETY: a context is current; the buffer holds `width` x `height` RGBA8 pixels
        // at alignment 4 (rows of `4 * width` bytes, no padding).
        unsafe {
            (self.gl.glGetIntegerv)(FRAMEBUFFER_BINDING, &mut fbo);
            (self.gl.glGetIntegerv)(PACK_ALIGNMENT, &mut align);
            (self.gl.glBindFramebuffer)(FRAMEBUFFER, 0);
            (self.gl.glPixelStorei)(PACK_ALIGNMENT, 4);
            (self.gl.glReadPixels)(
                0,
                0,
                width as i32,
                height as i32,
                0x1908,
                0x1401,
                px.as_mut_ptr().cast(),
            );
            (self.gl.glPixelStorei)(PACK_ALIGNMENT, align);
            (self.gl.glBindFramebuffer)(FRAMEBUFFER, fbo as u32);
        }
        // GL's rows run from the bottom; the daemon flips them as it copies them into the
        // display's frame region (a copy it makes anyway): no pass over the pixels here.
    }

    /// A new share group.
    pub fn new_share(&self) -> Share {
        ShareGroup::new_shared()
    }

    /// The state of a new context in `share`.
    pub fn new_context(&self, share: &Share) -> CtxState {
        let mut cx = ContextState::new(share.clone());
        cx.set_precision(self.precision);
        cx
    }

    /// Drops what the decoder made for context `cx` alone; its host context must be
    /// current.
    pub fn release(&self, cx: &mut CtxState) {
        // SAFETY: the worker calls this with the context's host context current, and
        // `gl` was loaded from the host's library.
        unsafe { cx.release(&self.gl) }
    }

    /// Runs GL packet `op` on the current context (`cx`), appending any answer to `reply`.
    pub fn dispatch(
        &self,
        cx: &mut CtxState,
        op: u32,
        payload: Reader<'_>,
        reply: &mut Encoder,
    ) -> Result<(), StreamError> {
        crate::gl::dispatch(&self.gl, cx, op, payload, reply)
    }
}
