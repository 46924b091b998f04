//! Helpers of the generated entry points: the caller's arrays as slices, answers out of a
//! reply, names as bytes.

use std::ffi::c_char;

use virtsoc_gles_stream::Reader;

/// `n` bytes at `p`; `None` for a null pointer.
///
/// # Safety
/// `p` is null or points to `n` readable bytes.
pub unsafe fn slice<'a>(p: *const u8, n: usize) -> Option<&'a [u8]> {
    if p.is_null() {
        None
    } else if n == 0 {
        Some(&[])
    } else {
        // SAFETY: the caller's contract.
        Some(unsafe { std::slice::from_raw_parts(p, n) })
    }
}

/// A NUL-terminated string's bytes, the NUL included; `None` for null.
///
/// # Safety
/// `p` is null or a NUL-terminated string.
pub unsafe fn cstr<'a>(p: *const c_char) -> Option<&'a [u8]> {
    if p.is_null() {
        return None;
    }
    // SAFETY: the caller's contract.
    Some(unsafe { std::ffi::CStr::from_ptr(p) }.to_bytes_with_nul())
}

/// Copies an answer into the caller's array of `n` bytes (at most `n`, at most what came).
///
/// # Safety
/// `p` is null or has room for `n` bytes.
pub unsafe fn copy_out(p: *mut u8, n: usize, b: &[u8]) {
    if p.is_null() {
        return;
    }
    let k = n.min(b.len());
    // SAFETY: `k` bytes fit in the caller's array (its contract) and are in `b`.
    unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), p, k) };
}

/// The answer of `op` in a batch's reply: its payload.
pub fn answer(reply: &[u8], op: u32) -> Option<Reader<'_>> {
    let mut r = Reader::new(reply);
    let mut found = None;
    while let Some(Ok((o, p))) = r.next_packet() {
        if o == op {
            found = Some(p);
        }
    }
    found
}

/// Writes names into the caller's array.
///
/// # Safety
/// `p` is null or has room for `names.len()` names.
pub unsafe fn write_names(p: *mut u32, names: &[u32]) {
    if !p.is_null() {
        // SAFETY: the caller's contract.
        unsafe { std::ptr::copy_nonoverlapping(names.as_ptr(), p, names.len()) };
    }
}

/// Reads `n` names from the caller's array (none for null).
///
/// # Safety
/// `p` is null or holds `n` names.
pub unsafe fn read_names(p: *const u32, n: usize) -> Vec<u32> {
    if p.is_null() || n == 0 {
        return Vec::new();
    }
    // SAFETY: the caller's contract.
    unsafe { std::slice::from_raw_parts(p, n) }.to_vec()
}

/// Names as stream bytes.
pub fn name_bytes(names: &[u32]) -> Vec<u8> {
    names.iter().flat_map(|n| n.to_le_bytes()).collect()
}
