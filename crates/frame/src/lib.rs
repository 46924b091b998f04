//! Frames as every virtsoc device sees them: the one [`PixelFormat`], a [`FrameLayout`]
//! (format, size, stride and the [`PlaneInfo`] of each plane) and the borrowed views
//! [`FrameRef`] / [`FrameMut`] (plus the owned [`OwnedFrame`]) over plain byte buffers.
//!
//! The media (codec, ISP, camera), GPU and display crates all take frames in these terms, so
//! a region's bytes can go from one device to the next without a conversion between their
//! types. The daemon's devices get their bytes from SVM region replicas: a frame is nothing
//! but a layout plus a byte slice at least [`FrameLayout::size`] long. Planes are stacked
//! tightly:
//!
//! | format  | planes (offset order)                                   |
//! |---------|---------------------------------------------------------|
//! | NV12    | Y (`stride * h`), interleaved UV (`stride * h / 2`)     |
//! | YUV420P | Y (`stride * h`), U, V (each `stride / 2 * h / 2`)      |
//! | RGBA    | one plane, 4 bytes per pixel (R, G, B, A in memory)     |
//! | BGRA    | one plane, 4 bytes per pixel (B, G, R, A in memory)     |
//!
//! `stride` is the luma (YUV) or packed (RGB) row length in bytes. YUV formats need even
//! width, height and stride; no dimension may exceed [`MAX_DIMENSION`].
//!
//! # Frames and the wire
//!
//! A guest allocates a region with the wire's `Format` (`virtsoc_proto::wire::Format`), which
//! also has formats that are no frame: `Blob` (untyped bytes) and `Yuyv` (an allocation
//! format no device reads). That enum stays the wire's allocation format, with the wire
//! numbers; the one conversion from it is `PixelFormat::try_from(format)` in the proto crate,
//! which refuses `Blob` and `Yuyv`. This crate knows nothing of the wire, so a frame's
//! format has no number here.
//!
//! # Errors
//!
//! Every check reports a [`FrameError`]; each device crate wraps it in its own error enum
//! (`#[from]`), so the cause stays matchable.

mod error;
mod format;
mod layout;
mod pixels;

pub use error::{FrameError, Result};
pub use format::PixelFormat;
pub use layout::{FrameLayout, PlaneInfo, MAX_DIMENSION};
pub use pixels::{FrameMut, FrameRef, OwnedFrame};
