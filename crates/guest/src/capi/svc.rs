//! The C ABI of host services (`virtsoc_channel_*`, `virtsoc_geo_fix`,
//! `virtsoc_sensor_read`), declared in `include/virtsoc.h`: a channel handle wrapping
//! [`ServiceChannel`](crate::services::ServiceChannel).

use std::ffi::{c_char, c_int, c_void};

use super::{bad, conn, opt_str, run, Result, VirtsocConn};

/// Opaque handle of a channel to a host service for C. The channel borrows its
/// connection for as long as C keeps it: the header's contract (a channel is closed before
/// its connection) is what makes the `'static` borrow sound.
pub struct VirtsocChannel(crate::services::ServiceChannel<'static>);

unsafe fn service<'a>(
    s: *mut VirtsocChannel,
) -> Result<&'a mut crate::services::ServiceChannel<'static>> {
    // SAFETY: a non-null handle came from virtsoc_channel_open and was not closed.
    unsafe { s.as_mut() }
        .map(|s| &mut s.0)
        .ok_or_else(|| bad("null service channel"))
}

/// Opens a channel to host service `name`; see the header.
///
/// # Safety
/// `c` must be a live handle; `name` a NUL-terminated string; `out` a valid pointer.
#[no_mangle]
pub unsafe extern "C" fn virtsoc_channel_open(
    c: *mut VirtsocConn,
    name: *const c_char,
    out: *mut *mut VirtsocChannel,
) -> c_int {
    run(|| {
        // SAFETY: forwarded caller guarantees; the header requires the channel to be closed
        // before its connection, so the connection outlives the channel's borrow of it.
        let c: &'static crate::Connection = unsafe { conn(c) }?;
        // SAFETY: forwarded caller guarantees.
        let name = unsafe { opt_str(name) }?.ok_or_else(|| bad("null service name"))?;
        if out.is_null() {
            return Err(bad("null out"));
        }
        let ch = crate::services::ServiceChannel::open(c, name)?;
        // SAFETY: `out` is a valid pointer (checked non-null above).
        unsafe { *out = Box::into_raw(Box::new(VirtsocChannel(ch))) };
        Ok(())
    })
}

/// Calls `call` of a service channel; see the header.
///
/// # Safety
/// `s` must be a live channel; `input` `in_len` readable bytes (or NULL with 0); `output`
/// `out_cap` writable bytes (or NULL with 0); `out_len` and `values` (4 words) valid or NULL.
#[no_mangle]
pub unsafe extern "C" fn virtsoc_channel_call(
    s: *mut VirtsocChannel,
    call: u32,
    input: *const c_void,
    in_len: usize,
    output: *mut c_void,
    out_cap: usize,
    out_len: *mut usize,
    values: *mut u64,
) -> c_int {
    run(|| {
        // SAFETY: forwarded caller guarantees.
        let s = unsafe { service(s) }?;
        if (input.is_null() && in_len > 0) || (output.is_null() && out_cap > 0) {
            return Err(bad("null buffer with a length"));
        }
        let data: &[u8] = if in_len == 0 {
            &[]
        } else {
            // SAFETY: the caller passes `in_len` readable bytes.
            unsafe { std::slice::from_raw_parts(input.cast::<u8>(), in_len) }
        };
        let r = s.call(call, data)?;
        if r.output.len() > out_cap {
            return Err(bad(&format!(
                "the answer has {} bytes, the buffer {out_cap}",
                r.output.len()
            )));
        }
        if !r.output.is_empty() {
            // SAFETY: the caller passes `out_cap` writable bytes; checked to fit above.
            unsafe { std::slice::from_raw_parts_mut(output.cast::<u8>(), r.output.len()) }
                .copy_from_slice(&r.output);
        }
        if !out_len.is_null() {
            // SAFETY: the caller passes a valid pointer or NULL.
            unsafe { *out_len = r.output.len() };
        }
        if !values.is_null() {
            // SAFETY: the caller passes 4 writable words or NULL.
            unsafe { std::slice::from_raw_parts_mut(values, 4) }.copy_from_slice(&r.values);
        }
        Ok(())
    })
}

/// Closes a service channel and frees its handle; see the header.
///
/// # Safety
/// `c` must be the live handle the channel was opened on; `s` a channel of it, not used
/// afterwards (NULL is ignored).
#[no_mangle]
pub unsafe extern "C" fn virtsoc_channel_close(
    c: *mut VirtsocConn,
    s: *mut VirtsocChannel,
) -> c_int {
    run(|| {
        // SAFETY: forwarded caller guarantees (the connection is checked live).
        let _ = unsafe { conn(c) }?;
        if s.is_null() {
            return Ok(());
        }
        // SAFETY: per the contract the handle is owned by us now.
        let s = unsafe { Box::from_raw(s) };
        s.0.close()
    })
}

/// The current location fix; see the header.
///
/// # Safety
/// `s` must be a live channel to `geo`; the out pointers valid (4 of them).
#[no_mangle]
pub unsafe extern "C" fn virtsoc_geo_fix(
    s: *mut VirtsocChannel,
    lon: *mut f64,
    lat: *mut f64,
    alt: *mut f64,
    time_ms: *mut u64,
) -> c_int {
    run(|| {
        // SAFETY: forwarded caller guarantees.
        let s = unsafe { service(s) }?;
        if lon.is_null() || lat.is_null() || alt.is_null() || time_ms.is_null() {
            return Err(bad("null out pointer"));
        }
        let v = s.call(crate::services::geo::call::FIX, &[])?.values;
        // SAFETY: the four pointers are valid (checked non-null above).
        unsafe {
            *lon = f64::from_bits(v[0]);
            *lat = f64::from_bits(v[1]);
            *alt = f64::from_bits(v[2]);
            *time_ms = v[3];
        }
        Ok(())
    })
}

/// One sensor's value; see the header.
///
/// # Safety
/// `s` must be a live channel to `sensor`; `name` NUL-terminated; `xyz` 3 writable doubles;
/// `time_ns` valid or NULL.
#[no_mangle]
pub unsafe extern "C" fn virtsoc_sensor_read(
    s: *mut VirtsocChannel,
    name: *const c_char,
    xyz: *mut f64,
    time_ns: *mut u64,
) -> c_int {
    run(|| {
        // SAFETY: forwarded caller guarantees.
        let s = unsafe { service(s) }?;
        // SAFETY: forwarded caller guarantees.
        let name = unsafe { opt_str(name) }?.ok_or_else(|| bad("null sensor name"))?;
        if xyz.is_null() {
            return Err(bad("null xyz"));
        }
        let v = s
            .call(crate::services::sensors::call::READ, name.as_bytes())?
            .values;
        // SAFETY: `xyz` points to 3 writable doubles; `time_ns` valid or NULL.
        unsafe {
            for (i, w) in v[..3].iter().enumerate() {
                *xyz.add(i) = f64::from_bits(*w);
            }
            if !time_ns.is_null() {
                *time_ns = v[3];
            }
        }
        Ok(())
    })
}
