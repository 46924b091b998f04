//! The GLES 2.0 entry points of the vendor library: encoded into the current context's
//! stream (generated from the registry by `virtsoc-gles-gen`, `gl_guest.rs` in `OUT_DIR`),
//! the calls the generator cannot do written by hand (`custom`; what a write mapping changed:
//! `diff`), and the guest-side state
//! that spares round trips ([`GlState`]).
//!
//! # For the EGL half
//!
//! - `GlState::new(client_version: u32, share: Option<&GlState>) -> GlState`: the GL state
//!   of a new context (`client_version` 2; `share`: the state of the context given as
//!   `share_context` to `eglCreateContext`, whose names the new one shares). Put it in
//!   [`crate::rt::Context::gl`].
//! - `proc_address(name: &CStr) -> Option<*const c_void>`: the entry point of GL command
//!   `name` (`glClear`, ...; also `glMapBufferOES` and the other extension commands we
//!   expose), for `eglGetProcAddress` and glvnd's `getProcAddress`. The functions are not
//!   exported from the library.
//!
//! Every entry point does nothing (answers 0) without a current context, never panics,
//! locks the context's `gl` state before its `stream` (keep that order), and flushes the
//! stream itself for calls with results (`Stream::round_trip`), at `glFlush`
//! (`Stream::flush`) and at `glFinish` (a round trip: the host ran `glFinish`).
//!
//! `glGetError` answers the errors the guest's own checks recorded first, then asks the
//! host (a round trip: the host answers the errors its decoder recorded, then the driver's).
//! Strings (`glGetString`) and constant limits (`glGetIntegerv` of `GL_MAX_*` and the
//! like) are fetched once per context; bindings of buffers and pixel store alignment are
//! answered from guest state; uniform and attribute locations round-trip (programs ask them
//! at set-up).

use std::ffi::{c_void, CStr};

mod custom;
mod diff;
mod draw;
mod es3;
mod es31;
mod es3obj;
mod hooks;
mod rtx;
mod state;
pub mod sz;

pub use state::GlState;

/// The generated encoder entry points and the entry-point table.
#[allow(
    non_snake_case,
    unused_mut,
    unused_variables,
    unused_unsafe,
    clippy::unnecessary_cast,
    clippy::too_many_arguments,
    clippy::missing_safety_doc,
    clippy::let_and_return,
    clippy::cast_lossless,
    clippy::ptr_as_ptr,
    clippy::needless_return
)]
pub(crate) mod gen {
    include!(concat!(env!("OUT_DIR"), "/gl_guest.rs"));
}

/// `GL_INVALID_ENUM`.
pub const GL_INVALID_ENUM: u32 = 0x0500;
/// `GL_INVALID_VALUE`.
pub const GL_INVALID_VALUE: u32 = 0x0501;
/// `GL_INVALID_OPERATION`.
pub const GL_INVALID_OPERATION: u32 = 0x0502;
/// `GL_ARRAY_BUFFER`.
pub const GL_ARRAY_BUFFER: u32 = 0x8892;
/// `GL_ELEMENT_ARRAY_BUFFER`.
pub const GL_ELEMENT_ARRAY_BUFFER: u32 = 0x8893;

/// The entry point of GL command `name` (generated or hand-written), as
/// `eglGetProcAddress` answers it; `None` for a command we do not provide.
pub fn proc_address(name: &CStr) -> Option<*const c_void> {
    gen::lookup(name.to_bytes())
}
