//! [`FrameError`]: what is wrong with a frame layout or its buffer.

use crate::PixelFormat;

/// A frame layout that breaks a rule of [`FrameLayout`](crate::FrameLayout), or a buffer
/// too short for its layout. Frames come from guests, so this is an ordinary error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// A frame with a zero width or height.
    #[error("zero-sized frame {width}x{height}")]
    ZeroSize {
        /// Width in pixels.
        width: u32,
        /// Height in pixels.
        height: u32,
    },
    /// A frame wider or taller than the limit ([`MAX_DIMENSION`](crate::MAX_DIMENSION), or a
    /// backend's own smaller limit).
    #[error("frame {width}x{height} exceeds the maximum dimension {max}")]
    TooLarge {
        /// Width in pixels.
        width: u32,
        /// Height in pixels.
        height: u32,
        /// Largest accepted dimension.
        max: u32,
    },
    /// A stride shorter than one row of pixels.
    #[error("stride {stride} < {min} bytes per row for {format:?} width {width}")]
    StrideTooSmall {
        /// The format.
        format: PixelFormat,
        /// Width in pixels.
        width: u32,
        /// The stride given.
        stride: u32,
        /// Bytes of one row.
        min: u64,
    },
    /// A YUV 4:2:0 frame with an odd width or height.
    #[error("{format:?} needs even width and height, got {width}x{height}")]
    OddSize {
        /// The format.
        format: PixelFormat,
        /// Width in pixels.
        width: u32,
        /// Height in pixels.
        height: u32,
    },
    /// A YUV 4:2:0 frame with an odd stride.
    #[error("{format:?} needs an even stride, got {stride}")]
    OddStride {
        /// The format.
        format: PixelFormat,
        /// The stride given.
        stride: u32,
    },
    /// A frame whose byte size does not fit in `usize`.
    #[error("frame of stride {stride} and height {height} overflows usize")]
    Overflow {
        /// The stride.
        stride: u32,
        /// Height in pixels.
        height: u32,
    },
    /// A byte buffer shorter than its layout requires.
    #[error("buffer too small: need {needed} bytes, got {got}")]
    BufferTooSmall {
        /// Bytes the layout needs.
        needed: usize,
        /// Bytes the buffer has.
        got: usize,
    },
}

/// `Result` with [`FrameError`].
pub type Result<T, E = FrameError> = std::result::Result<T, E>;
