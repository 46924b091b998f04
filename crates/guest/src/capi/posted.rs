//! The C ABI of posted writes and of the failures of requests nobody waits for:
//! `virtsoc_write_posted`, `virtsoc_drain`, `virtsoc_take_async_error`.

use std::ffi::{c_int, c_void};

use super::{bad, conn, run, VirtsocConn};
use crate::RegionId;

/// Writes `len` bytes from `bytes` at `offset` of region `id` from the CPU as a posted write
/// (`Connection::write_posted`): no round trip; a refusal comes back through
/// [`virtsoc_take_async_error`].
///
/// # Safety
/// `c` must be a live handle; `bytes` must point to `len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn virtsoc_write_posted(
    c: *mut VirtsocConn,
    id: u64,
    offset: u64,
    bytes: *const c_void,
    len: u64,
) -> c_int {
    run(|| {
        // SAFETY: forwarded caller guarantees.
        let c = unsafe { conn(c) }?;
        if bytes.is_null() {
            return Err(bad("null bytes"));
        }
        let n = usize::try_from(len).map_err(|_| bad("length"))?;
        // SAFETY: the caller guarantees `len` readable bytes at `bytes`.
        let s = unsafe { std::slice::from_raw_parts(bytes.cast::<u8>(), n) };
        c.write_posted(RegionId(id), offset, s)
    })
}

/// Waits until every request sent so far has completed (those nobody waits for included).
///
/// # Safety
/// `c` must be a live handle.
#[no_mangle]
pub unsafe extern "C" fn virtsoc_drain(c: *mut VirtsocConn) -> c_int {
    run(|| {
        // SAFETY: forwarded caller guarantees.
        unsafe { conn(c) }?.drain()
    })
}

/// The oldest failure of a request nobody waited for (a refused posted write): returns 1 and
/// fills `*seq_out` and `*status_out` (the negated status, as the calls return it), or 0
/// when there is none. Call [`virtsoc_drain`] first to know of every request sent.
///
/// # Safety
/// `c` must be a live handle; `seq_out` and `status_out` valid pointers or NULL.
#[no_mangle]
pub unsafe extern "C" fn virtsoc_take_async_error(
    c: *mut VirtsocConn,
    seq_out: *mut u64,
    status_out: *mut c_int,
) -> c_int {
    let mut got = None;
    let rc = run(|| {
        // SAFETY: forwarded caller guarantees.
        got = unsafe { conn(c) }?.take_async_error();
        Ok(())
    });
    match got {
        None => rc,
        Some((seq, status)) => {
            // SAFETY: the caller passes valid pointers or NULL.
            unsafe {
                if let Some(p) = seq_out.as_mut() {
                    *p = seq;
                }
                if let Some(p) = status_out.as_mut() {
                    *p = -(status as c_int);
                }
            }
            1
        }
    }
}
