//! virtsoc's EGL vendor library for glvnd (`libEGL_virtsoc.so`): EGL ([`egl`]) and the
//! OpenGL ES entry points ([`gl`]), encoded into one command stream per connection and run by
//! the daemon's render worker (see `docs/gles.md`).

// The library is named as glvnd names vendor libraries (libEGL_<vendor>.so), and its entry
// points by the names the Khronos APIs give them.
#![allow(non_snake_case)]

pub mod egl;
pub mod gl;
pub mod rt;
pub mod transport;
