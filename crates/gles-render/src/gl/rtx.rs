//! Helpers of the generated decoders: checked pointers into packets, output buffers.

use std::ffi::{c_char, c_void};

/// The largest output array a call may ask the host for (a 4096x4096 RGBA float read).
pub const MAX_OUT: usize = 256 << 20;

/// The pointer to hand the driver for an input array of `need` bytes: null for a null
/// array (when `nullable`, or when nothing is read), the payload's bytes when they are
/// enough; `None` when the guest sent fewer bytes than GL will read.
pub fn in_ptr(b: Option<&[u8]>, need: usize, nullable: bool) -> Option<*const c_void> {
    match b {
        None if nullable || need == 0 => Some(std::ptr::null()),
        None => None,
        Some(b) if b.len() >= need => Some(b.as_ptr().cast()),
        Some(_) => None,
    }
}

/// A NUL-terminated string in the payload; `None` without its NUL.
pub fn cstr_ptr(b: Option<&[u8]>) -> Option<*const c_char> {
    let b = b?;
    b.contains(&0).then_some(b.as_ptr().cast())
}

/// Spare bytes after every output buffer: a newer host context answers some names of
/// GLES 2.0 queries with more values than GLES 2.0 does.
pub const OUT_SLACK: usize = 64;

/// A zeroed, 4-aligned buffer of at least `n` bytes (and [`OUT_SLACK`] more) for the
/// driver to write; `None` past [`MAX_OUT`].
pub fn out_buf(n: usize) -> Option<Vec<u32>> {
    (n <= MAX_OUT).then(|| vec![0u32; (n + OUT_SLACK).div_ceil(4)])
}

/// The first `n` bytes of an output buffer.
pub fn out_bytes(v: &[u32], n: usize) -> Vec<u8> {
    let mut out: Vec<u8> = v.iter().flat_map(|w| w.to_ne_bytes()).collect();
    out.truncate(n);
    out
}
