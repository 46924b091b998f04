//! The C ABI, declared in `include/virtsoc.h`.
//!
//! Every function returns 0 or a negated [`Status`]; the message of the last error on the
//! calling thread is available from `virtsoc_last_error`. Null pointers and invalid strings are
//! reported as `VIRTSOC_E_BAD_ARGUMENT`, never dereferenced. Panics never cross the boundary.

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use virtsoc_proto::wire::Format;
use virtsoc_proto::{AccessMode, DeviceId, Status};

use crate::{ConnectOptions, Connection, GuestError, RegionId, RegionInfo, Result};

mod posted;
mod svc;
pub use svc::VirtsocChannel;

/// Opaque connection handle for C.
pub struct VirtsocConn(Connection);

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_error(msg: &str) {
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
}

fn run(f: impl FnOnce() -> Result<()>) -> c_int {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => 0,
        Ok(Err(e)) => {
            set_error(&e.to_string());
            -(e.status() as c_int)
        }
        Err(_) => {
            set_error("internal panic in virtsoc guest library");
            -(Status::Internal as c_int)
        }
    }
}

fn bad(msg: &str) -> GuestError {
    GuestError::BadArgument(msg.to_string())
}

unsafe fn opt_str<'a>(p: *const c_char) -> Result<Option<&'a str>> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: the caller passes a NUL-terminated string or NULL.
    unsafe { CStr::from_ptr(p) }
        .to_str()
        .map(Some)
        .map_err(|_| bad("string is not UTF-8"))
}

unsafe fn conn<'a>(c: *mut VirtsocConn) -> Result<&'a Connection> {
    // SAFETY: a non-null handle came from virtsoc_connect and was not disconnected.
    unsafe { c.as_ref() }
        .map(|c| &c.0)
        .ok_or_else(|| bad("null connection"))
}

fn mode(m: u32) -> Result<AccessMode> {
    AccessMode::from_u32(m)
        .ok_or_else(|| bad("mode must be VIRTSOC_READ, VIRTSOC_WRITE or VIRTSOC_RW"))
}

/// Connects to the daemon. `name` and `coherence` may be NULL.
///
/// # Safety
/// `socket_path` must be a NUL-terminated string; `out` a valid pointer.
#[no_mangle]
pub unsafe extern "C" fn virtsoc_connect(
    socket_path: *const c_char,
    name: *const c_char,
    coherence: *const c_char,
    out: *mut *mut VirtsocConn,
) -> c_int {
    run(|| {
        if out.is_null() {
            return Err(bad("null output pointer"));
        }
        // SAFETY: forwarded caller guarantees.
        let path = unsafe { opt_str(socket_path) }?.ok_or_else(|| bad("null socket path"))?;
        let mut opts = ConnectOptions::default();
        // SAFETY: forwarded caller guarantees.
        if let Some(n) = unsafe { opt_str(name) }? {
            opts.name = n.to_string();
        }
        // SAFETY: forwarded caller guarantees.
        opts.coherence = unsafe { opt_str(coherence) }?.map(str::to_string);
        let c = Connection::connect(path, &opts)?;
        // SAFETY: `out` is non-null and valid per the contract.
        unsafe { *out = Box::into_raw(Box::new(VirtsocConn(c))) };
        Ok(())
    })
}

/// Hangs up and frees the handle. NULL is ignored.
///
/// # Safety
/// `c` must come from `virtsoc_connect` and not be used afterwards.
#[no_mangle]
pub unsafe extern "C" fn virtsoc_disconnect(c: *mut VirtsocConn) {
    if !c.is_null() {
        // SAFETY: per the contract the handle is owned by us now.
        drop(unsafe { Box::from_raw(c) });
    }
}

/// Allocates a region; see the header.
///
/// # Safety
/// `c` must be a live handle; `id_out` and `size_out` valid pointers or NULL.
#[no_mangle]
pub unsafe extern "C" fn virtsoc_alloc(
    c: *mut VirtsocConn,
    size: u64,
    width: u32,
    height: u32,
    format: u32,
    usage: u32,
    id_out: *mut u64,
    size_out: *mut u64,
) -> c_int {
    run(|| {
        // SAFETY: forwarded caller guarantees.
        let c = unsafe { conn(c) }?;
        if id_out.is_null() {
            return Err(bad("null id pointer"));
        }
        let format = Format::from_u32(format).ok_or_else(|| bad("unknown format"))?;
        let info = c.alloc(size, width, height, format, usage)?;
        // SAFETY: checked non-null above; size_out checked below.
        unsafe {
            *id_out = u64::from(info.id);
            if !size_out.is_null() {
                *size_out = info.size;
            }
        }
        Ok(())
    })
}

/// Planes `struct virtsoc_region` holds.
pub const MAX_PLANES: usize = 4;

/// `struct virtsoc_plane` of the header.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VirtsocPlane {
    /// Byte offset of the plane's first row from the start of the region.
    pub offset: u64,
    /// Bytes from the start of one row to the next.
    pub stride: u32,
    /// Meaningful bytes in a row (`<= stride`).
    pub row_bytes: u32,
    /// Rows in the plane.
    pub rows: u32,
    /// Always 0.
    pub reserved: u32,
}

/// `struct virtsoc_region` of the header: a region's id, size and layout.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VirtsocRegion {
    /// The region's id, as requests name it.
    pub id: u64,
    /// Size of the region in bytes.
    pub size: u64,
    /// Width in pixels (meaningful for image regions only).
    pub width: u32,
    /// Height in pixels (meaningful for image regions only).
    pub height: u32,
    /// `enum virtsoc_format` value (`Format` as u32).
    pub format: u32,
    /// Row pitch of the first plane in bytes (0 for a blob).
    pub stride: u32,
    /// Number of valid entries in `planes` (0 for a blob, up to [`MAX_PLANES`]).
    pub plane_count: u32,
    /// Always 0.
    pub reserved: u32,
    /// The planes in order (Y first for YUV formats); entries past `plane_count` are zero.
    pub planes: [VirtsocPlane; MAX_PLANES],
}

impl From<&RegionInfo> for VirtsocRegion {
    fn from(r: &RegionInfo) -> Self {
        let mut out = VirtsocRegion {
            id: u64::from(r.id),
            size: r.size,
            width: r.width,
            height: r.height,
            format: r.format as u32,
            stride: r.stride,
            ..VirtsocRegion::default()
        };
        for (dst, p) in out.planes.iter_mut().zip(r.planes()) {
            *dst = VirtsocPlane {
                offset: p.offset,
                stride: p.stride,
                row_bytes: p.row_bytes,
                rows: p.rows,
                reserved: 0,
            };
            out.plane_count += 1;
        }
        out
    }
}

/// Writes `r` to `out`.
///
/// # Safety
/// `out` must be a valid pointer or NULL (refused).
unsafe fn put_region(out: *mut VirtsocRegion, r: &RegionInfo) -> Result<()> {
    if out.is_null() {
        return Err(bad("null region pointer"));
    }
    // SAFETY: non-null and valid per the caller's contract; written whole, unaligned-safe.
    unsafe { out.write_unaligned(VirtsocRegion::from(r)) };
    Ok(())
}

/// Allocates a `width` x `height` image region and reports its layout; see the header.
///
/// # Safety
/// `c` must be a live handle; `out` a valid pointer.
#[no_mangle]
pub unsafe extern "C" fn virtsoc_alloc_frame(
    c: *mut VirtsocConn,
    width: u32,
    height: u32,
    format: u32,
    usage: u32,
    out: *mut VirtsocRegion,
) -> c_int {
    run(|| {
        // SAFETY: forwarded caller guarantees.
        let c = unsafe { conn(c) }?;
        if out.is_null() {
            return Err(bad("null region pointer"));
        }
        let format = match Format::from_u32(format) {
            Some(Format::Blob) => return Err(bad("a blob has no frame layout: use virtsoc_alloc")),
            Some(f) => f,
            None => return Err(bad("unknown format")),
        };
        let info = c.alloc(0, width, height, format, usage)?;
        // SAFETY: forwarded caller guarantees (checked non-null above).
        unsafe { put_region(out, &info) }
    })
}

/// Reports the id, size and layout of one of this connection's regions; see the header.
///
/// # Safety
/// `c` must be a live handle; `out` a valid pointer.
#[no_mangle]
pub unsafe extern "C" fn virtsoc_region_info(
    c: *mut VirtsocConn,
    id: u64,
    out: *mut VirtsocRegion,
) -> c_int {
    run(|| {
        // SAFETY: forwarded caller guarantees.
        let c = unsafe { conn(c) }?;
        let info = c.region(RegionId(id)).ok_or(GuestError::Status {
            op: virtsoc_proto::Opcode::Alloc,
            status: Status::NoSuchRegion,
            reason: Some(format!("region {id} is not one of this connection's")),
        })?;
        // SAFETY: forwarded caller guarantees.
        unsafe { put_region(out, &info) }
    })
}

/// Frees a region.
///
/// # Safety
/// `c` must be a live handle.
#[no_mangle]
pub unsafe extern "C" fn virtsoc_free(c: *mut VirtsocConn, id: u64) -> c_int {
    // SAFETY: forwarded caller guarantees.
    run(|| unsafe { conn(c) }?.free(RegionId(id)))
}

/// Begins an access; for `VIRTSOC_DEV_CPU` stores a pointer to the first byte in `*ptr_out`.
///
/// # Safety
/// `c` must be a live handle; `ptr_out` a valid pointer or NULL.
#[no_mangle]
pub unsafe extern "C" fn virtsoc_begin_access(
    c: *mut VirtsocConn,
    id: u64,
    device: u32,
    offset: u64,
    len: u64,
    mode_: u32,
    ptr_out: *mut *mut c_void,
) -> c_int {
    run(|| {
        // SAFETY: forwarded caller guarantees.
        let c = unsafe { conn(c) }?;
        let a = c.begin_access(RegionId(id), DeviceId(device), offset, len, mode(mode_)?)?;
        if !ptr_out.is_null() {
            let p = a
                .ptr
                .map(|p| p.as_ptr() as *mut c_void)
                .unwrap_or(std::ptr::null_mut());
            // SAFETY: checked non-null.
            unsafe { *ptr_out = p };
        }
        Ok(())
    })
}

/// Ends an access (blocks for prefetch compensation when the host asks for it).
///
/// # Safety
/// `c` must be a live handle.
#[no_mangle]
pub unsafe extern "C" fn virtsoc_end_access(
    c: *mut VirtsocConn,
    id: u64,
    device: u32,
    offset: u64,
    len: u64,
    mode_: u32,
) -> c_int {
    run(|| {
        // SAFETY: forwarded caller guarantees.
        let c = unsafe { conn(c) }?;
        c.end_access(RegionId(id), DeviceId(device), offset, len, mode(mode_)?)
            .map(|_| ())
    })
}

/// Sends a device command: `args[0]` is the device opcode; results go to `values` (6 words,
/// may be NULL).
///
/// # Safety
/// `c` must be a live handle; `args` must point to 6 words; `values` to 6 words or NULL.
#[no_mangle]
pub unsafe extern "C" fn virtsoc_device_cmd(
    c: *mut VirtsocConn,
    device: u32,
    args: *const u64,
    values: *mut u64,
) -> c_int {
    run(|| {
        // SAFETY: forwarded caller guarantees.
        let c = unsafe { conn(c) }?;
        if args.is_null() {
            return Err(bad("null args"));
        }
        let mut a = [0u64; 6];
        // SAFETY: the caller passes 6 readable words.
        a.copy_from_slice(unsafe { std::slice::from_raw_parts(args, 6) });
        let v = c.device_cmd(DeviceId(device), a)?;
        if !values.is_null() {
            // SAFETY: the caller passes 6 writable words.
            unsafe { std::slice::from_raw_parts_mut(values, 6) }.copy_from_slice(&v);
        }
        Ok(())
    })
}

/// Creates a virtual command fence.
///
/// # Safety
/// `c` must be a live handle; `fence_out` a valid pointer.
#[no_mangle]
pub unsafe extern "C" fn virtsoc_fence_create(c: *mut VirtsocConn, fence_out: *mut u64) -> c_int {
    run(|| {
        // SAFETY: forwarded caller guarantees.
        let c = unsafe { conn(c) }?;
        if fence_out.is_null() {
            return Err(bad("null fence pointer"));
        }
        let f = c.fence_create()?;
        // SAFETY: checked non-null.
        unsafe { *fence_out = f.to_u64() };
        Ok(())
    })
}

/// Queues a signal of `fence` on `device` (fires after the device's earlier commands).
///
/// # Safety
/// `c` must be a live handle.
#[no_mangle]
pub unsafe extern "C" fn virtsoc_fence_signal(
    c: *mut VirtsocConn,
    device: u32,
    fence: u64,
) -> c_int {
    // SAFETY: forwarded caller guarantees.
    run(|| unsafe { conn(c) }?.fence_signal(DeviceId(device), crate::Fence::from_u64(fence)))
}

/// Queues a wait for `fence` on `device` (its later commands run after the signal).
///
/// # Safety
/// `c` must be a live handle.
#[no_mangle]
pub unsafe extern "C" fn virtsoc_fence_wait(c: *mut VirtsocConn, device: u32, fence: u64) -> c_int {
    // SAFETY: forwarded caller guarantees.
    run(|| unsafe { conn(c) }?.fence_wait(DeviceId(device), crate::Fence::from_u64(fence)))
}

/// Gives a fence back.
///
/// # Safety
/// `c` must be a live handle.
#[no_mangle]
pub unsafe extern "C" fn virtsoc_fence_release(c: *mut VirtsocConn, fence: u64) -> c_int {
    // SAFETY: forwarded caller guarantees.
    run(|| unsafe { conn(c) }?.fence_release(crate::Fence::from_u64(fence)))
}

/// Runs `status` on the connection and stores its answer in `*signaled` (1 or 0): the body of
/// the fence status calls.
///
/// # Safety
/// `c` must be a live handle; `signaled` a valid pointer.
unsafe fn fence_flag(
    c: *mut VirtsocConn,
    signaled: *mut c_int,
    status: impl FnOnce(&Connection) -> Result<bool>,
) -> c_int {
    run(|| {
        // SAFETY: forwarded caller guarantees.
        let c = unsafe { conn(c) }?;
        if signaled.is_null() {
            return Err(bad("null output pointer"));
        }
        let v = status(c)?;
        // SAFETY: checked non-null.
        unsafe { *signaled = c_int::from(v) };
        Ok(())
    })
}

/// Stores 1 in `*signaled` if `fence` was signaled, else 0 (read from the shared fence page).
///
/// # Safety
/// `c` must be a live handle; `signaled` a valid pointer.
#[no_mangle]
pub unsafe extern "C" fn virtsoc_fence_signaled(
    c: *mut VirtsocConn,
    fence: u64,
    signaled: *mut c_int,
) -> c_int {
    // SAFETY: forwarded caller guarantees.
    unsafe {
        fence_flag(c, signaled, |c| {
            c.fence_signaled(crate::Fence::from_u64(fence))
        })
    }
}

/// Blocks until `fence` is signaled or `timeout_ms` milliseconds have passed (a HAL's
/// `sync_wait`); `*signaled` tells which. A process guest sleeps on the fence page (no round
/// trips); see `Connection::fence_wait_cpu`.
///
/// # Safety
/// `c` must be a live handle; `signaled` a valid pointer.
#[no_mangle]
pub unsafe extern "C" fn virtsoc_fence_wait_cpu(
    c: *mut VirtsocConn,
    fence: u64,
    timeout_ms: u32,
    signaled: *mut c_int,
) -> c_int {
    let timeout = std::time::Duration::from_millis(u64::from(timeout_ms));
    // SAFETY: forwarded caller guarantees.
    unsafe {
        fence_flag(c, signaled, |c| {
            c.fence_wait_cpu(crate::Fence::from_u64(fence), timeout)
        })
    }
}

/// The message of the last error on this thread (valid until the next call on this thread).
#[no_mangle]
pub extern "C" fn virtsoc_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// A static description of a (negated) status code.
#[no_mangle]
pub extern "C" fn virtsoc_strerror(code: c_int) -> *const c_char {
    let s = Status::from_u32(code.unsigned_abs()).unwrap_or(Status::Internal);
    STATUS_TEXT[s as usize].as_ptr()
}

macro_rules! status_text {
    ($($s:ident),*) => {
        [$(concat_cstr(Status::$s)),*]
    };
}

const fn concat_cstr(s: Status) -> &'static CStr {
    match s {
        Status::Ok => c"ok",
        Status::UnknownOpcode => c"unknown opcode",
        Status::UnknownDevice => c"unknown device",
        Status::NoSuchRegion => c"no such region (or not yours)",
        Status::OutOfRange => c"offset or length out of range",
        Status::BadArgument => c"bad argument",
        Status::OutOfMemory => c"out of memory (window or guest quota exhausted)",
        Status::Busy => c"busy, try again",
        Status::DeviceError => c"device error",
        Status::NotSupported => c"not supported",
        Status::Closed => c"connection closed",
        Status::Internal => c"internal error",
        Status::PermissionDenied => c"permission denied by the daemon's policy",
    }
}

static STATUS_TEXT: [&CStr; 12] = status_text!(
    Ok,
    UnknownOpcode,
    UnknownDevice,
    NoSuchRegion,
    OutOfRange,
    BadArgument,
    OutOfMemory,
    Busy,
    DeviceError,
    NotSupported,
    Closed,
    Internal
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strerror_matches_status_messages() {
        for v in 0..12u32 {
            let s = Status::from_u32(v).unwrap();
            // SAFETY: static NUL-terminated strings.
            let c = unsafe { CStr::from_ptr(virtsoc_strerror(-(v as c_int))) };
            assert_eq!(c.to_str().unwrap(), s.message());
        }
    }

    #[test]
    fn region_struct_has_the_headers_layout() {
        // The header's _Static_asserts check the same numbers on the C side.
        assert_eq!(std::mem::size_of::<VirtsocPlane>(), 24);
        assert_eq!(std::mem::size_of::<VirtsocRegion>(), 136);
        assert_eq!(std::mem::offset_of!(VirtsocRegion, planes), 40);
        let h = include_str!("../include/virtsoc.h");
        assert!(h.contains("sizeof(struct virtsoc_region) == 136"));
        assert!(h.contains("sizeof(struct virtsoc_plane) == 24"));
        assert!(h.contains(&format!("#define VIRTSOC_MAX_PLANES {MAX_PLANES}")));
        let r = VirtsocRegion::from(&RegionInfo {
            id: RegionId(9),
            size: 320 * 240 * 3 / 2,
            stride: 320,
            width: 320,
            height: 240,
            format: Format::Yuv420p,
        });
        assert_eq!((r.plane_count, r.planes[2].offset), (3, 320 * 240 * 5 / 4));
        assert_eq!(r.planes[3], VirtsocPlane::default());
    }

    #[test]
    fn header_constants_match_the_protocol() {
        let h = include_str!("../include/virtsoc.h");
        let find = |name: &str| -> i64 {
            let line = h
                .lines()
                .find(|l| l.contains(&format!("#define {name} ")))
                .unwrap_or_else(|| panic!("{name} missing from virtsoc.h"));
            line.split_whitespace()
                .nth(2)
                .unwrap()
                .trim_matches(|c| c == '(' || c == ')')
                .parse()
                .unwrap()
        };
        assert_eq!(
            find("VIRTSOC_E_NO_SUCH_REGION"),
            -(Status::NoSuchRegion as i64)
        );
        assert_eq!(find("VIRTSOC_E_OUT_OF_RANGE"), -(Status::OutOfRange as i64));
        assert_eq!(
            find("VIRTSOC_E_BAD_ARGUMENT"),
            -(Status::BadArgument as i64)
        );
        assert_eq!(
            find("VIRTSOC_E_OUT_OF_MEMORY"),
            -(Status::OutOfMemory as i64)
        );
        assert_eq!(find("VIRTSOC_E_CLOSED"), -(Status::Closed as i64));
        assert_eq!(
            find("VIRTSOC_E_UNKNOWN_DEVICE"),
            -(Status::UnknownDevice as i64)
        );
        assert_eq!(find("VIRTSOC_E_INTERNAL"), -(Status::Internal as i64));
        assert_eq!(
            find("VIRTSOC_E_PERMISSION_DENIED"),
            -(Status::PermissionDenied as i64)
        );
        assert_eq!(find("VIRTSOC_READ"), AccessMode::Read as i64);
        assert_eq!(find("VIRTSOC_WRITE"), AccessMode::Write as i64);
        assert_eq!(find("VIRTSOC_RW"), AccessMode::ReadWrite as i64);
        assert_eq!(find("VIRTSOC_DEV_CPU"), DeviceId::CPU.0 as i64);
        assert_eq!(find("VIRTSOC_DEV_PRODUCER"), DeviceId::PRODUCER.0 as i64);
        assert_eq!(find("VIRTSOC_DEV_CONSUMER"), DeviceId::CONSUMER.0 as i64);
        assert_eq!(find("VIRTSOC_FMT_BLOB"), Format::Blob as i64);
        assert_eq!(find("VIRTSOC_FMT_NV12"), Format::Nv12 as i64);
        assert_eq!(find("VIRTSOC_FMT_YUYV"), Format::Yuyv as i64);
        assert_eq!(find("VIRTSOC_FMT_RGBA8"), Format::Rgba8 as i64);
        assert_eq!(find("VIRTSOC_FMT_BGRA8"), Format::Bgra8 as i64);
        assert_eq!(find("VIRTSOC_FMT_YUV420P"), Format::Yuv420p as i64);
        assert_eq!(find("VIRTSOC_DEV_CONSUMER2"), DeviceId::CONSUMER2.0 as i64);
        assert_eq!(
            find("VIRTSOC_TEST_WRITE_PATTERN"),
            virtsoc_proto::wire::testdev::WRITE_PATTERN as i64
        );
        assert_eq!(
            find("VIRTSOC_TEST_CHECKSUM"),
            virtsoc_proto::wire::testdev::CHECKSUM as i64
        );
    }
}
