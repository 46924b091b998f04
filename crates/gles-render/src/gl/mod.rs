//! The host's GL decoder: runs a guest's GL packets on the current host context.
//!
//! How to use it (the worker, `crate::worker`):
//!
//! ```text
//! let gl = unsafe { Gl::load(|name| egl_get_proc_address(name)) }?;   // once per process
//! let share = ShareGroup::new_shared();          // per guest share group
//! let mut cx = ContextState::new(share.clone()); // per guest context (same share: shared names)
//! // for each GL packet (op < egl::BASE), with cx's host context current:
//! dispatch(&gl, &mut cx, op, payload, &mut reply)?;
//! // when the guest destroys the context, with it current: unsafe { cx.release(&gl) };
//! ```
//!
//! The decoders are generated (`gl_host.rs` in `OUT_DIR`, from `crates/gles-gen`); the
//! calls the generator cannot do are in `custom`, the state tracking after some calls in
//! `hooks`. The guest is never trusted: names go through the share group's tables
//! ([`ShareGroup`]), an unknown name never reaches the driver; every array's length is
//! recomputed from the call's arguments and this context's state ([`sz`]), and a call whose
//! arrays are shorter is skipped with `GL_INVALID_VALUE` recorded for the context (the guest
//! reads it with `glGetError`). A malformed packet (scalars missing) is a [`StreamError`].

use std::sync::{Arc, Mutex, MutexGuard};

use virtsoc_gles_stream::StreamError;
use virtsoc_sync::LockExt;

mod custom;
mod draw;
mod es3;
mod es31;
mod es3obj;
mod hooks;
pub mod names;
pub mod precision;
mod rtx;
pub mod sz;

pub use names::ShareGroup;
pub use precision::Precision;

/// The generated decoder: the driver's function table ([`Gl`]) and [`dispatch`].
#[allow(
    non_snake_case,
    unused_mut,
    unused_labels,
    unused_variables,
    clippy::let_unit_value,
    clippy::unit_arg,
    clippy::needless_late_init,
    clippy::unnecessary_cast,
    clippy::too_many_arguments,
    clippy::redundant_field_names,
    clippy::let_and_return,
    clippy::ptr_as_ptr,
    clippy::missing_transmute_annotations,
    clippy::vec_init_then_push,
    clippy::match_single_binding,
    clippy::useless_vec,
    clippy::cast_lossless
)]
mod generated {
    include!(concat!(env!("OUT_DIR"), "/gl_host.rs"));
}

pub use generated::Gl;

/// A core GL entry point the host's GL does not have: what [`Gl::load`] fails with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("host GL has no {0}")]
pub struct MissingGlFunction(pub &'static str);

/// Runs GL packet `op` (its payload in `payload`) on the current host context, which must be
/// `cx`'s; the answers of calls with results go to `reply` (`reply.packet(op)`, in packet
/// order). A malformed packet (a scalar missing, an unknown opcode) is an error; a refused
/// call is a GL error recorded in `cx` (logged at debug level), not a stream error.
pub fn dispatch(
    gl: &Gl,
    cx: &mut ContextState,
    op: u32,
    payload: virtsoc_gles_stream::Reader<'_>,
    reply: &mut virtsoc_gles_stream::Encoder,
) -> Result<(), StreamError> {
    let before = cx.refused;
    let r = generated::dispatch(gl, cx, op, payload, reply);
    if cx.refused != before {
        log::debug!(
            "gles decoder: {} refused: GL error {:#x}",
            virtsoc_gles_stream::gl_ops::name(op).unwrap_or("?"),
            cx.last_error
        );
    }
    r
}

/// `GL_NO_ERROR`.
pub const GL_NO_ERROR: u32 = 0;
/// `GL_INVALID_ENUM`.
pub const GL_INVALID_ENUM: u32 = 0x0500;
/// `GL_INVALID_VALUE`.
pub const GL_INVALID_VALUE: u32 = 0x0501;
/// `GL_INVALID_OPERATION`.
pub const GL_INVALID_OPERATION: u32 = 0x0502;
/// `GL_OUT_OF_MEMORY`.
pub const GL_OUT_OF_MEMORY: u32 = 0x0505;

/// The state the decoder keeps for one guest context.
#[derive(Debug)]
pub struct ContextState {
    share: Arc<Mutex<ShareGroup>>,
    /// Errors found by the decoder's own checks, oldest first (the guest's `glGetError`
    /// returns them before the driver's).
    errors: Vec<u32>,
    /// `GL_UNPACK_ALIGNMENT` in force.
    pub(crate) unpack_alignment: i64,
    /// `GL_PACK_ALIGNMENT` in force.
    pub(crate) pack_alignment: i64,
    /// The buffer client vertex arrays are uploaded to at draw time (0 until first needed).
    pub(crate) scratch_vbo: u32,
    /// `GL_MAX_VERTEX_ATTRIBS` of the driver (0 until first asked).
    pub(crate) max_attribs: u32,
    /// Calls refused by the decoder's checks so far.
    refused: u64,
    /// The error of the last refusal.
    last_error: u32,
    /// GLES 3 state: pixel store rows and skips, divisors in use (`gl::es3`).
    pub(crate) es3: es3::HostEs3,
    /// The precision the guest's shaders run at ([`precision`]); `Auto` until the first
    /// shader source asks the driver its renderer.
    pub(crate) precision: Precision,
}

impl ContextState {
    /// The state of a new context whose objects live in `share` (a new share group:
    /// [`ShareGroup::new_shared`]; a context sharing with another: that one's
    /// [`share_group`](Self::share_group)).
    pub fn new(share: Arc<Mutex<ShareGroup>>) -> ContextState {
        ContextState {
            share,
            errors: Vec::new(),
            unpack_alignment: 4,
            pack_alignment: 4,
            scratch_vbo: 0,
            max_attribs: 0,
            refused: 0,
            last_error: GL_NO_ERROR,
            es3: Default::default(),
            precision: Precision::Auto,
        }
    }

    /// Sets the precision this context's shaders run at ([`Precision::Auto`]: decided by
    /// the host's renderer at the first shader source).
    pub fn set_precision(&mut self, p: Precision) {
        self.precision = p;
    }

    /// The precision this context's shaders run at ([`Precision::Auto`] until a shader
    /// source has been decoded).
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// The share group this context's names live in.
    pub fn share_group(&self) -> &Arc<Mutex<ShareGroup>> {
        &self.share
    }

    /// The share group, locked.
    pub fn share(&self) -> MutexGuard<'_, ShareGroup> {
        self.share.lock_or_recover()
    }

    /// Records a GL error found by the decoder (GL keeps one of each kind until read).
    pub fn error(&mut self, e: u32) {
        self.refused += 1;
        self.last_error = e;
        if !self.errors.contains(&e) && self.errors.len() < 8 {
            self.errors.push(e);
        }
    }

    /// How many calls of this context the decoder's checks refused (a guest bug or attack).
    pub fn refused(&self) -> u64 {
        self.refused
    }

    /// The oldest error recorded by the decoder, cleared ([`GL_NO_ERROR`] when none).
    pub fn take_error(&mut self) -> u32 {
        if self.errors.is_empty() {
            GL_NO_ERROR
        } else {
            self.errors.remove(0)
        }
    }

    /// Deletes what the decoder made for this context alone (its scratch buffer); the share
    /// group's objects stay for the other contexts sharing it.
    ///
    /// # Safety
    /// This context's host context must be current, `gl` loaded from its library.
    pub unsafe fn release(&mut self, gl: &Gl) {
        if self.scratch_vbo != 0 {
            // SAFETY: a current context (the caller's contract), one valid name.
            unsafe { (gl.glDeleteBuffers)(1, &self.scratch_vbo) };
            self.scratch_vbo = 0;
        }
    }

    /// Maps guest name `guest` of `kind` to the host's `host` (0: the host made none, the
    /// guest's name stays unknown).
    pub(crate) fn map_name(&mut self, kind: names::Kind, guest: u32, host: u32) {
        if host != 0 && guest != 0 {
            self.share().insert(kind, guest, host);
        }
    }

    /// The host name of guest name `guest` (0 is 0); an unknown one is created (`Bind`),
    /// an error (`Use`: recorded) or answered 0 (`Soft`): `None` skips the call.
    pub(crate) fn host_name(
        &mut self,
        gl: &Gl,
        kind: names::Kind,
        guest: u32,
        mode: names::Mode,
    ) -> Option<u32> {
        if guest == 0 {
            return Some(0);
        }
        if let Some(h) = self.share().get(kind, guest) {
            return Some(h);
        }
        match mode {
            names::Mode::Bind => {
                let h = names::host_gen(gl, kind);
                if h == 0 {
                    self.error(GL_OUT_OF_MEMORY);
                    return None;
                }
                self.share().insert(kind, guest, h);
                Some(h)
            }
            names::Mode::Use => {
                self.error(match kind {
                    names::Kind::Program | names::Kind::Shader => GL_INVALID_VALUE,
                    _ => GL_INVALID_OPERATION,
                });
                None
            }
            names::Mode::Soft => None,
        }
    }
}

/// Result of a decoder: a malformed packet is a stream error.
pub type DecodeResult = Result<(), StreamError>;
