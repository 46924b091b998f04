//! The render worker's loop: batches from the daemon on stdin (a socket), each run on the
//! host's EGL/GLES, each answered with its reply bytes and a status.
//!
//! Messages (the daemon's side is `virtsoc_host::device::gles`; the loop is
//! [`crate::serve`]): a batch is `u32 len | u32 flags | len bytes` of whole packets
//! ([`FROM_DAEMON`]: the daemon's own: a present, an import, mappings, a guest batch run
//! in place), file descriptors riding with its first byte (`SCM_RIGHTS`, one per MAP
//! packet); the answer is `u32 status | u32 reply_len | u32 msg_len | u64 gl_bytes | u32
//! placed | u32 mappings | reply | msg`, status [`OK`], [`BAD_STREAM`] (the
//! batch stopped at a malformed packet; `msg` says why) or [`LOST`] (the worker cannot go
//! on and exits). `gl_bytes`: the guest's GL memory after the batch
//! ([`Renderer::gl_bytes`]: its share groups' objects and its surfaces), which the daemon
//! charges against the guest's memory limit (the batch's device time the daemon takes
//! from the worker's CPU time, all its threads, the driver's too, as the kernel counts it);
//! `placed`: bytes of answers written into the reply mapping instead (`reply_len` is 0
//! then); `mappings`: the shared replicas the worker holds mapped. The daemon bounds all.
//!
//! Packets with opcodes from [`egl::BASE`] are the worker's own (contexts, surfaces, making
//! current, swaps); the rest go to the GL decoder with the state of the context the stream
//! runs on. Guest ids of contexts and surfaces are checked against the worker's tables; an
//! unknown one is an EGL error in the answer, never a host call.

use std::collections::HashMap;
use std::io::Write;

use virtsoc_gles_stream::{egl, Encoder, Reader, StreamError};

use crate::egl::{EglError, Handle, HostEgl};
use crate::glue::{CtxState, GlApi, Share};
use virtsoc_sync::LockExt;

/// Answer status: the batch ran.
pub const OK: u32 = 0;
/// Answer status: the batch stopped at a malformed packet.
pub const BAD_STREAM: u32 = 1;
/// Answer status: the worker cannot go on.
pub const LOST: u32 = 2;

/// Batch flag: the daemon's own batch (a readback), not a guest's stream.
pub const FROM_DAEMON: u32 = 1;

/// Largest batch the worker reads.
pub const MAX_BATCH: usize = 64 << 20;
/// Largest reply of one batch (the daemon refuses more).
pub const MAX_REPLY: usize = 64 << 20;
/// Most contexts, and most surfaces, of one guest.
pub const MAX_OBJECTS: usize = 1024;

/// What ends the worker.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// The socket to the daemon failed or closed.
    #[error("daemon socket: {0}")]
    Io(#[from] std::io::Error),
    /// The daemon sent a batch larger than [`MAX_BATCH`].
    #[error("batch of {0} bytes is too large")]
    TooLarge(usize),
}

pub(crate) struct HostContext {
    handle: Handle,
    share: Share,
    pub(crate) state: CtxState,
    pub(crate) draw: u32,
    read: u32,
}

pub(crate) struct HostSurface {
    pub(crate) handle: Handle,
    config: Handle,
    pub(crate) size: (u32, u32),
    /// Bytes per pixel: color, depth and stencil.
    px: u64,
}

/// The host side of one guest: its contexts and surfaces on the host's EGL.
pub struct Renderer {
    pub(crate) egl: HostEgl,
    pub(crate) gl: GlApi,
    pub(crate) contexts: HashMap<u32, HostContext>,
    pub(crate) surfaces: HashMap<u32, HostSurface>,
    /// Host configs of the guest's config ids.
    configs: HashMap<u32, Handle>,
    /// The context the stream's packets run on.
    pub(crate) on: u32,
    /// What is current on the host: `(ctx, draw, read)`.
    pub(crate) host_current: (u32, u32, u32),
    /// The guest's EGLImages of SVM regions (`crate::image`).
    pub(crate) images: crate::image::Images,
    /// The last readback's pixels (the buffer is reused, see `GlApi::read_back_into`).
    readback: Vec<u8>,
    /// The replicas the daemon shares with the worker (`crate::mapped`).
    pub(crate) mappings: crate::mapped::Mappings,
    /// Descriptors that came with the daemon's current message, for its MAP packets.
    pub(crate) incoming: std::collections::VecDeque<std::os::fd::OwnedFd>,
    /// The mapping an EXEC_MAPPED batch's answers may go into (0: none).
    pub(crate) reply_to: u32,
    /// Presents into shared frames (`crate::present`).
    pub(crate) presenter: crate::present::Presenter,
}

impl Renderer {
    /// Opens the host's EGL and loads its GL.
    pub fn new() -> Result<Renderer, EglError> {
        let egl = HostEgl::open()?;
        let gl = GlApi::load(|n| egl.proc_address(n))?;
        log::info!("render worker: {}", egl.description);
        Ok(Renderer {
            egl,
            gl,
            contexts: HashMap::new(),
            surfaces: HashMap::new(),
            configs: HashMap::new(),
            on: 0,
            host_current: (0, 0, 0),
            images: crate::image::Images::default(),
            readback: Vec::new(),
            mappings: Default::default(),
            incoming: Default::default(),
            reply_to: 0,
            presenter: Default::default(),
        })
    }

    /// The guest's GL memory: the objects of its share groups (each counted once), its
    /// surfaces (width x height x bytes per pixel of color, depth and stencil) and its
    /// EGLImages' textures.
    pub fn gl_bytes(&self) -> u64 {
        let mut groups: Vec<*const ()> = Vec::new();
        let mut total = 0u64;
        for c in self.contexts.values() {
            let id = std::sync::Arc::as_ptr(&c.share).cast::<()>();
            if !groups.contains(&id) {
                groups.push(id);
                let g = c.share.lock_or_recover();
                total = total.saturating_add(g.bytes());
            }
        }
        for s in self.surfaces.values() {
            let (w, h) = s.size;
            total = total.saturating_add(u64::from(w) * u64::from(h) * s.px);
        }
        total.saturating_add(self.images.bytes())
    }

    /// Makes a context current once and destroys it, so the driver's one-time set-up (a
    /// context's first creation opens Mesa's shader disk cache, which looks the user up
    /// through the C library's name service) happens before the sandbox, which allows
    /// neither sockets nor files; decides the shader precision by the host's renderer
    /// meanwhile (`crate::gl::precision`) and says which on stdout, for the daemon.
    pub fn warm_up(&mut self) {
        let null = std::ptr::null_mut();
        match self.egl.create_context(null, null, 2) {
            Ok(ctx) => {
                match self.egl.make_current(null, null, ctx) {
                    Ok(()) => {
                        // The daemon reads this one line (its `gles` backend line); nothing
                        // else of the worker's goes to stdout, and a closed pipe is no error.
                        let line = self.gl.resolve_precision();
                        let mut out = std::io::stdout();
                        let _ = writeln!(out, "{line}").and_then(|()| out.flush());
                    }
                    Err(e) => log::warn!("render worker: warming up: {e}"),
                }
                let _ = self.egl.make_current(null, null, null);
                self.egl.destroy_context(ctx);
            }
            Err(e) => log::warn!("render worker: warming up: {e}"),
        }
        // The presents' probe writes a memfd, which the sandbox would refuse.
        self.presenter.probe_host(&self.egl);
        let _ = self.egl.make_current(null, null, null);
        self.host_current = (0, 0, 0);
    }

    fn config(&mut self, id: u32) -> Result<Handle, u32> {
        if let Some(c) = self.configs.get(&id) {
            return Ok(*c);
        }
        let (_, r, g, b, a, d, s) = egl::config(id).ok_or(egl::BAD_CONFIG)?;
        let c = self
            .egl
            .config([r, g, b, a], d, s)
            .map_err(|e| log_err(e, egl::BAD_CONFIG))?;
        self.configs.insert(id, c);
        Ok(c)
    }

    /// Makes context `ctx` current on the host with its surfaces, if it is not already.
    pub(crate) fn bind(&mut self, ctx: u32) -> Result<(), u32> {
        let want = match self.contexts.get(&ctx) {
            Some(c) => (ctx, c.draw, c.read),
            None if ctx == 0 => (0, 0, 0),
            None => return Err(egl::BAD_CONTEXT),
        };
        if want == self.host_current {
            return Ok(());
        }
        let null = std::ptr::null_mut();
        let surf = |id: u32| self.surfaces.get(&id).map_or(null, |s| s.handle);
        let handle = self.contexts.get(&ctx).map_or(null, |c| c.handle);
        self.egl
            .make_current(surf(want.1), surf(want.2), handle)
            .map_err(|e| log_err(e, egl::BAD_MATCH))?;
        self.host_current = want;
        Ok(())
    }

    /// Runs one batch; appends the answers to `reply`. `trusted`: the daemon's own batch
    /// (a readback), which may hold commands a guest's may not.
    pub fn run(
        &mut self,
        batch: &[u8],
        reply: &mut Encoder,
        trusted: bool,
    ) -> Result<(), StreamError> {
        let mut r = Reader::new(batch);
        while let Some(p) = r.next_packet() {
            let (op, mut p) = p?;
            if crate::daemon_ops::is_daemons(op) {
                if !trusted {
                    return Err(p.bad("a command of the daemon's"));
                }
                self.daemon_packet(op, &mut p, reply)?;
            } else if op == egl::IMPORT {
                if !trusted {
                    return Err(p.bad("IMPORT is the daemon's"));
                }
                let err = self.images.import(&self.egl, &mut p)?;
                // The image context is current now.
                self.host_current = (u32::MAX, 0, 0);
                answer(reply, op, &[err]);
            } else if op == egl::READBACK {
                if !trusted {
                    return Err(p.bad("READBACK is the daemon's"));
                }
                let surf = p.u32()?;
                self.read_back(surf, reply);
            } else if op >= egl::BASE {
                self.egl_packet(op, &mut p, reply)?;
            } else {
                self.gl_packet(op, p, reply)?;
            }
            if reply.len() > MAX_REPLY {
                return Err(StreamError::Bad {
                    op,
                    what: format!("answers exceed {MAX_REPLY} bytes"),
                });
            }
        }
        Ok(())
    }

    fn gl_packet(
        &mut self,
        op: u32,
        p: Reader<'_>,
        reply: &mut Encoder,
    ) -> Result<(), StreamError> {
        if self.on == 0 || self.bind(self.on).is_err() {
            // GL calls without a current context do nothing.
            return Ok(());
        }
        let Some(c) = self.contexts.get_mut(&self.on) else {
            return Ok(());
        };
        self.gl.dispatch(&mut c.state, op, p, reply)
    }

    fn egl_packet(
        &mut self,
        op: u32,
        p: &mut Reader<'_>,
        reply: &mut Encoder,
    ) -> Result<(), StreamError> {
        match op {
            egl::SET_CONTEXT => {
                // An unknown (destroyed) context runs nothing: GL calls without a context
                // do nothing.
                let ctx = p.u32()?;
                self.on = if self.contexts.contains_key(&ctx) {
                    ctx
                } else {
                    0
                };
            }
            egl::CREATE_CONTEXT => {
                let (ctx, share, major) = (p.u32()?, p.u32()?, p.u32()?);
                let err = self.create_context(ctx, share, major);
                answer(reply, op, &[err]);
            }
            egl::DESTROY_CONTEXT => {
                let ctx = p.u32()?;
                if self.host_current.0 == ctx {
                    let _ = self.bind(0);
                }
                if self.contexts.contains_key(&ctx) && self.bind(ctx).is_ok() {
                    if let Some(c) = self.contexts.get_mut(&ctx) {
                        self.gl.release(&mut c.state);
                    }
                    let _ = self.bind(0);
                }
                if let Some(c) = self.contexts.remove(&ctx) {
                    self.egl.destroy_context(c.handle);
                }
                if self.on == ctx {
                    self.on = 0;
                }
            }
            egl::CREATE_SURFACE => {
                let (surf, w, h, config) = (p.u32()?, p.u32()?, p.u32()?, p.u32()?);
                let err = self.create_surface(surf, w, h, config);
                answer(reply, op, &[err]);
            }
            egl::DESTROY_SURFACE => {
                let surf = p.u32()?;
                let (_, d, r) = self.host_current;
                if d == surf || r == surf {
                    let _ = self.bind(0);
                }
                if let Some(s) = self.surfaces.remove(&surf) {
                    self.egl.destroy_surface(s.handle);
                }
            }
            egl::RESIZE_SURFACE => {
                let (surf, w, h) = (p.u32()?, p.u32()?, p.u32()?);
                self.resize_surface(surf, w, h);
            }
            egl::MAKE_CURRENT => {
                let (ctx, draw, read) = (p.u32()?, p.u32()?, p.u32()?);
                let err = self.make_current(ctx, draw, read);
                answer(reply, op, &[err]);
            }
            egl::SWAP => {
                let _surf = p.u32()?;
                if self.on != 0 && self.bind(self.on).is_ok() {
                    self.gl.flush();
                }
            }
            egl::FINISH => {
                if self.on != 0 && self.bind(self.on).is_ok() {
                    self.gl.finish();
                }
                answer(reply, op, &[]);
            }
            egl::CREATE_IMAGE => {
                let (image, w, h) = (p.u32()?, p.u32()?, p.u32()?);
                let err = self.images.create(&self.egl, image, w, h);
                self.host_current = (u32::MAX, 0, 0);
                answer(reply, op, &[err]);
            }
            egl::DESTROY_IMAGE => {
                let image = p.u32()?;
                self.images.destroy(&self.egl, image);
                self.host_current = (u32::MAX, 0, 0);
            }
            egl::IMAGE_TARGET_TEXTURE => {
                let (target, image) = (p.u32()?, p.u32()?);
                if self.on != 0 && self.bind(self.on).is_ok() {
                    let done = self.images.target_texture(target, image);
                    if let (false, Some(c)) = (done, self.contexts.get_mut(&self.on)) {
                        c.state.error(0x0502); // GL_INVALID_OPERATION
                    }
                }
            }
            _ => return Err(StreamError::UnknownOp(op)),
        }
        Ok(())
    }

    /// Answers READBACK: the pixels of `surf` when it is the draw surface of the context
    /// the stream runs on (and fits an answer), else a 0 x 0 image.
    fn read_back(&mut self, surf: u32, reply: &mut Encoder) {
        let size = match (self.contexts.get(&self.on), self.surfaces.get(&surf)) {
            (Some(c), Some(s)) if c.draw == surf => Some(s.size),
            _ => None,
        }
        // The daemon takes answers of at most MAX_REPLY bytes.
        .filter(|&(w, h)| u64::from(w) * u64::from(h) * 4 + 64 <= MAX_REPLY as u64);
        let pixels = match size {
            Some((w, h)) if self.bind(self.on).is_ok() => {
                self.gl.read_back_into(w, h, &mut self.readback);
                Some((w, h))
            }
            _ => None,
        };
        let mut p = reply.packet(egl::READBACK);
        match pixels {
            Some((w, h)) => {
                p.u32(w).u32(h).bytes(&self.readback);
            }
            None => {
                p.u32(0).u32(0).bytes(&[]);
            }
        }
    }

    fn create_context(&mut self, ctx: u32, share: u32, major: u32) -> u32 {
        if ctx == 0 || self.contexts.contains_key(&ctx) || self.contexts.len() >= MAX_OBJECTS {
            return egl::BAD_PARAMETER;
        }
        if major != 2 && major != 3 {
            return egl::BAD_MATCH;
        }
        let (share_handle, group) = match share {
            0 => (std::ptr::null_mut(), self.gl.new_share()),
            s => match self.contexts.get(&s) {
                Some(c) => (c.handle, c.share.clone()),
                None => return egl::BAD_CONTEXT,
            },
        };
        // EGL_KHR_no_config_context: one context renders to surfaces of every config.
        let handle = match self
            .egl
            .create_context(std::ptr::null_mut(), share_handle, major)
        {
            Ok(h) => h,
            Err(e) => return log_err(e, egl::BAD_ALLOC),
        };
        let state = self.gl.new_context(&group);
        self.contexts.insert(
            ctx,
            HostContext {
                handle,
                share: group,
                state,
                draw: 0,
                read: 0,
            },
        );
        egl::SUCCESS
    }

    fn create_surface(&mut self, surf: u32, w: u32, h: u32, config: u32) -> u32 {
        if surf == 0 || self.surfaces.contains_key(&surf) || self.surfaces.len() >= MAX_OBJECTS {
            return egl::BAD_PARAMETER;
        }
        if !(1..=egl::MAX_SURFACE).contains(&w) || !(1..=egl::MAX_SURFACE).contains(&h) {
            return egl::BAD_PARAMETER;
        }
        let px = egl::config(config).map_or(0, |(_, r, g, b, a, d, s)| {
            u64::from((r + g + b + a).div_ceil(8) + (d + s).div_ceil(8))
        });
        let config = match self.config(config) {
            Ok(c) => c,
            Err(e) => return e,
        };
        match self.egl.create_pbuffer(config, w, h) {
            Ok(handle) => {
                self.surfaces.insert(
                    surf,
                    HostSurface {
                        handle,
                        config,
                        size: (w, h),
                        px,
                    },
                );
                egl::SUCCESS
            }
            Err(e) => log_err(e, egl::BAD_ALLOC),
        }
    }

    fn resize_surface(&mut self, surf: u32, w: u32, h: u32) {
        if !(1..=egl::MAX_SURFACE).contains(&w) || !(1..=egl::MAX_SURFACE).contains(&h) {
            return;
        }
        let Some((config, px)) = self.surfaces.get(&surf).map(|s| (s.config, s.px)) else {
            return;
        };
        let Ok(handle) = self.egl.create_pbuffer(config, w, h) else {
            return;
        };
        let (_, d, r) = self.host_current;
        let was = self.host_current.0;
        if d == surf || r == surf {
            let _ = self.bind(0);
        }
        let size = (w, h);
        if let Some(old) = self.surfaces.insert(
            surf,
            HostSurface {
                handle,
                config,
                size,
                px,
            },
        ) {
            self.egl.destroy_surface(old.handle);
        }
        if was != 0 {
            let _ = self.bind(was);
        }
    }

    fn make_current(&mut self, ctx: u32, draw: u32, read: u32) -> u32 {
        if ctx == 0 {
            self.on = 0;
            return self.bind(0).err().unwrap_or(egl::SUCCESS);
        }
        for s in [draw, read] {
            if s != 0 && !self.surfaces.contains_key(&s) {
                return egl::BAD_SURFACE;
            }
        }
        let Some(c) = self.contexts.get_mut(&ctx) else {
            return egl::BAD_CONTEXT;
        };
        c.draw = draw;
        c.read = read;
        self.on = ctx;
        match self.bind(ctx) {
            Ok(()) => egl::SUCCESS,
            Err(e) => e,
        }
    }
}

fn log_err(e: EglError, code: u32) -> u32 {
    log::warn!("render worker: {e}");
    code
}

/// Appends the answer `op` with payload `words` to `reply`.
pub(crate) fn answer(reply: &mut Encoder, op: u32, words: &[u32]) {
    let mut p = reply.packet(op);
    for w in words {
        p.u32(*w);
    }
}

pub use crate::serve::{serve, serve_confined};

#[cfg(test)]
#[path = "worker_tests.rs"]
mod tests;
