//! EGL syncs are virtsoc virtual fences (`EGL_KHR_fence_sync`, `EGL_KHR_wait_sync`, EGL
//! 1.5 syncs, and virtsoc's `EGL_VIRTSOC_fence_sync`, `include/EGL/eglext_virtsoc.h`).
//!
//! - **A fence sync** (`EGL_SYNC_FENCE_KHR`) flushes the stream (its batch goes to the
//!   `gles` device's queue without waiting, ended by a host `glFinish`) and queues a
//!   `FenceSignal` of a virtual fence behind it on the gles queue: the daemon signals the
//!   fence once the GL work before it is complete on the host (drawn, not only submitted:
//!   llvmpipe renders when it is flushed). Creating one is not a round trip: fence ids come from a small
//!   pool of `FenceCreate` requests submitted ahead ([`POOL`]) and collected later.
//! - **`eglClientWaitSync`** waits on the fence's word in the shared fence page
//!   (`Connection::fence_wait_cpu`: spin, then futex), no round trip per check; a finite
//!   timeout answers `EGL_TIMEOUT_EXPIRED_KHR`, never a hang.
//! - **`eglWaitSync`** flushes the stream and queues a `FenceWait` on the gles queue: the
//!   guest's later GL work waits on the host for the fence (e.g. a decode's, see below)
//!   while the guest goes on. The daemon's queues are per guest: only this guest's GL
//!   queue waits.
//! - **`EGL_SYNC_VIRTSOC_FENCE`** syncs: a fence signaled by another device's queue
//!   (`EGL_VIRTSOC_SYNC_DEVICE`: the codec's after the decode queued before it), by the
//!   CPU (`EGL_VIRTSOC_SYNC_DEVICE` 0: pending until `eglSignalSyncKHR`), or an existing
//!   fence id of this connection imported (`EGL_VIRTSOC_FENCE_ID_LO/HI`, checked with the
//!   daemon: another guest's id names nothing here). The fence id of any sync is exported
//!   by `eglGetSyncFenceVIRTSOC` (as `eglDupNativeFenceFDANDROID` exports a sync file).
//!   `eglDeviceWaitSyncVIRTSOC` makes any device's queue wait on a sync.
//!
//! Syncs made here own their fence and release it when destroyed (a pending fence stays
//! until it is signaled); an imported fence stays its creator's.

use std::collections::{HashMap, VecDeque};
use std::ffi::c_char;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use virtsoc_guest::{Connection, Fence};
use virtsoc_proto::ops::{self, CoreOp};
use virtsoc_proto::{DeviceId, Opcode, Status};

use super::api::{display, guard, lock, name_of, pairs, put, EglAttrib, EglBool, EglInt, Handle};
use super::consts::*;
use super::state::{from_handle, table, to_handle};
use crate::rt;
use crate::transport::Transport;
use virtsoc_sync::LockExt;

/// `eglCreateSyncKHR` type: a virtsoc virtual fence (`eglext_virtsoc.h`).
pub const EGL_SYNC_VIRTSOC_FENCE: u32 = 0x7A20;
/// Attribute: the device whose queue signals the fence (a virtsoc device id; default the
/// gles device; 0: the program, with `eglSignalSyncKHR`).
pub const EGL_VIRTSOC_SYNC_DEVICE: i32 = 0x7A21;
/// Attribute / `eglGetSyncAttrib`: the fence id's low 32 bits (import / export).
pub const EGL_VIRTSOC_FENCE_ID_LO: i32 = 0x7A22;
/// Attribute / `eglGetSyncAttrib`: the fence id's high 32 bits.
pub const EGL_VIRTSOC_FENCE_ID_HI: i32 = 0x7A23;
/// `eglGetSyncAttrib`: the device whose queue signals the fence (0: the program; an
/// imported fence: unknown, `EGL_NONE`).
pub const EGL_VIRTSOC_SYNC_SIGNALER: i32 = 0x7A24;

const EGL_TIMEOUT_EXPIRED_KHR: i32 = 0x30F5;
const EGL_UNSIGNALED_KHR: i32 = 0x30F3;
const EGL_SYNC_FLUSH_COMMANDS_BIT_KHR: i32 = 1;
const EGL_FOREVER_KHR: u64 = u64::MAX;
/// The longest single CPU wait (a longer timeout waits in pieces of this).
const WAIT_PIECE: Duration = Duration::from_secs(3600);
/// `FenceCreate` requests kept in flight, so that a sync takes an id without a round trip.
pub const POOL: usize = 16;
/// The gles device.
const GLES: DeviceId = virtsoc_devapi::gles::ID;

/// One sync.
#[derive(Clone, Copy)]
struct Sync {
    dpy: u32,
    kind: u32,
    fence: Fence,
    /// The device whose queue signals it (`Some(0)`: the program); `None`: imported.
    signaler: Option<u32>,
}

#[derive(Default)]
struct Syncs {
    next: u32,
    map: HashMap<u32, Sync>,
    /// `FenceCreate` requests in flight, and the connection they are on.
    pool: VecDeque<u64>,
    pool_of: usize,
}

static SYNCS: std::sync::LazyLock<Mutex<Syncs>> =
    std::sync::LazyLock::new(|| Mutex::new(Syncs::default()));

fn syncs() -> MutexGuard<'static, Syncs> {
    SYNCS.lock_or_recover()
}

/// The transport of an initialised display.
fn transport(dpy: Handle) -> Result<Arc<Transport>, i32> {
    let t = table();
    display(&t, dpy)?;
    t.transport.clone().ok_or(EGL_NOT_INITIALIZED)
}

/// The EGL error of a failed fence request.
fn fence_error(what: &str, e: &virtsoc_guest::GuestError) -> i32 {
    log::warn!("virtsoc EGL: {what}: {e}");
    match e {
        virtsoc_guest::GuestError::Status {
            status: Status::BadArgument,
            ..
        } => EGL_BAD_PARAMETER,
        virtsoc_guest::GuestError::Status {
            status: Status::OutOfMemory,
            ..
        } => EGL_BAD_ALLOC,
        _ => EGL_BAD_ACCESS,
    }
}

/// A fresh fence: the oldest `FenceCreate` of the pool (long answered in a steady state),
/// another submitted in its place.
pub(crate) fn new_fence(conn: &Connection) -> Result<Fence, i32> {
    let mut s = syncs();
    let owner = conn as *const Connection as usize;
    if s.pool_of != owner {
        s.pool.clear();
        s.pool_of = owner;
    }
    let submit = || {
        conn.submit(
            Opcode::FenceCreate,
            DeviceId::CPU,
            ops::FenceCreate {}.encode(),
        )
        .map_err(|e| fence_error("fence", &e))
    };
    while s.pool.len() < POOL {
        let seq = submit()?;
        s.pool.push_back(seq);
    }
    let Some(seq) = s.pool.pop_front() else {
        return Err(EGL_BAD_ALLOC);
    };
    let c = conn.wait(seq).map_err(|e| fence_error("fence", &e))?;
    if Status::from_u32(c.status) != Some(Status::Ok) {
        log::warn!("virtsoc EGL: no fence: {:?}", c.reason());
        return Err(EGL_BAD_ALLOC);
    }
    s.pool.push_back(submit()?);
    Ok(Fence::from_u64(ops::FenceCreate::reply(&c.values).fence))
}

/// Sends what the current context's stream holds (without waiting): GL work before this
/// point reaches the gles queue before what follows. With `finished`, the batch ends with a
/// `glFinish` ([`rt::Stream::flush_finished`]): a fence sync signals once the GL work before
/// it is complete on the host, as `EGL_KHR_fence_sync` says, not once it was submitted.
fn flush_current(finished: bool) -> Result<(), i32> {
    if let Some(cur) = rt::current() {
        let mut s = lock(&cur.stream);
        let sent = if finished {
            s.flush_finished(cur.id)
        } else {
            s.flush()
        };
        sent.map_err(|e| {
            log::warn!("virtsoc EGL: {e:?}");
            EGL_CONTEXT_LOST
        })?;
    }
    Ok(())
}

/// The attributes of an `EGL_SYNC_VIRTSOC_FENCE`: (signaling device, imported id).
fn virtsoc_attribs(attribs: &[(i32, i32)]) -> Result<(u32, Option<u64>), i32> {
    let (mut device, mut lo, mut hi) = (None, None, None);
    for &(a, v) in attribs {
        match a {
            EGL_VIRTSOC_SYNC_DEVICE => device = Some(v as u32),
            EGL_VIRTSOC_FENCE_ID_LO => lo = Some(v as u32),
            EGL_VIRTSOC_FENCE_ID_HI => hi = Some(v as u32),
            _ => return Err(EGL_BAD_ATTRIBUTE),
        }
    }
    match (device, lo, hi) {
        (Some(_), Some(_), _) => Err(EGL_BAD_ATTRIBUTE),
        (_, None, Some(_)) => Err(EGL_BAD_ATTRIBUTE),
        (d, None, None) => Ok((d.unwrap_or(GLES.0), None)),
        (None, Some(lo), hi) => Ok((0, Some(u64::from(lo) | u64::from(hi.unwrap_or(0)) << 32))),
    }
}

fn create_sync(dpy: Handle, kind: u32, attribs: Vec<(i32, i32)>) -> Handle {
    super::set_last_vendor();
    guard(std::ptr::null_mut(), || {
        let tr = transport(dpy)?;
        let conn = tr.connection();
        let (device, import) = match kind {
            EGL_SYNC_FENCE_KHR if attribs.is_empty() => (GLES.0, None),
            EGL_SYNC_FENCE_KHR => return Err(EGL_BAD_ATTRIBUTE),
            EGL_SYNC_VIRTSOC_FENCE => virtsoc_attribs(&attribs)?,
            _ => return Err(EGL_BAD_ATTRIBUTE),
        };
        let (fence, signaler) = match import {
            Some(id) => {
                // Checked with the daemon: an id this guest's table does not hold (another
                // guest's, a released one) is refused.
                conn.core(DeviceId::CPU, ops::FenceStatus { fence: id })
                    .map_err(|e| fence_error("import fence", &e))?;
                (Fence::from_u64(id), None)
            }
            None => {
                if device != 0 && !conn.devices().iter().any(|d| d.id == device) {
                    return Err(EGL_BAD_ATTRIBUTE);
                }
                if device == GLES.0 {
                    if rt::current().is_none() {
                        return Err(EGL_BAD_MATCH);
                    }
                    flush_current(true)?;
                }
                let f = new_fence(conn)?;
                if device != 0 {
                    conn.fence_signal(DeviceId(device), f)
                        .map_err(|e| fence_error("signal", &e))?;
                }
                (f, Some(device))
            }
        };
        let mut s = syncs();
        s.next = s.next.wrapping_add(1).max(1);
        let id = s.next;
        s.map.insert(
            id,
            Sync {
                dpy: from_handle(dpy),
                kind,
                fence,
                signaler,
            },
        );
        Ok(to_handle(id))
    })
}

/// The sync of handle `sync` on display `dpy`, and the display's transport.
fn lookup(dpy: Handle, sync: Handle) -> Result<(Sync, Arc<Transport>), i32> {
    let tr = transport(dpy)?;
    let s = syncs()
        .map
        .get(&from_handle(sync))
        .copied()
        .filter(|s| s.dpy == from_handle(dpy))
        .ok_or(EGL_BAD_PARAMETER)?;
    Ok((s, tr))
}

/// `eglCreateSyncKHR`: `EGL_SYNC_FENCE_KHR` or `EGL_SYNC_VIRTSOC_FENCE`.
pub extern "C" fn eglCreateSyncKHR(dpy: Handle, kind: u32, attribs: *const EglInt) -> Handle {
    create_sync(dpy, kind, pairs(attribs))
}

/// `eglCreateSync` (EGL 1.5): as [`eglCreateSyncKHR`].
pub extern "C" fn eglCreateSync(dpy: Handle, kind: u32, attribs: *const EglAttrib) -> Handle {
    create_sync(dpy, kind, pairs(attribs))
}

/// `eglDestroySync` / `eglDestroySyncKHR`: a fence the sync made is released (kept by the
/// daemon until it is signaled, so queued waits on it still hold).
pub extern "C" fn eglDestroySync(dpy: Handle, sync: Handle) -> EglBool {
    super::set_last_vendor();
    guard(EGL_FALSE, || {
        let (s, tr) = lookup(dpy, sync)?;
        syncs().map.remove(&from_handle(sync));
        if s.signaler.is_some() {
            tr.connection()
                .fence_release(s.fence)
                .map_err(|e| fence_error("release", &e))?;
        }
        Ok(EGL_TRUE)
    })
}

/// Whether `f` was signaled within `timeout` (`EGL_FOREVER_KHR`: no limit), read from the
/// fence page.
fn wait_cpu(conn: &Connection, f: Fence, timeout: u64) -> Result<bool, i32> {
    let err = |e: virtsoc_guest::GuestError| fence_error("wait", &e);
    if timeout == 0 {
        return conn.fence_signaled(f).map_err(err);
    }
    let mut left = Duration::from_nanos(timeout);
    loop {
        let piece = left.min(WAIT_PIECE);
        if conn.fence_wait_cpu(f, piece).map_err(err)? {
            return Ok(true);
        }
        if timeout != EGL_FOREVER_KHR {
            left = left.saturating_sub(piece);
            if left.is_zero() {
                return Ok(false);
            }
        }
    }
}

/// `eglClientWaitSync` / `eglClientWaitSyncKHR`: waits on the fence page (no round trip);
/// `EGL_TIMEOUT_EXPIRED_KHR` when `timeout` ns pass first.
pub extern "C" fn eglClientWaitSync(
    dpy: Handle,
    sync: Handle,
    flags: EglInt,
    timeout: u64,
) -> EglInt {
    super::set_last_vendor();
    guard(EGL_FALSE as EglInt, || {
        let (s, tr) = lookup(dpy, sync)?;
        if flags & EGL_SYNC_FLUSH_COMMANDS_BIT_KHR != 0 {
            flush_current(false)?;
        }
        Ok(if wait_cpu(tr.connection(), s.fence, timeout)? {
            EGL_CONDITION_SATISFIED_KHR
        } else {
            EGL_TIMEOUT_EXPIRED_KHR
        })
    })
}

/// Queues a wait for `s` on `device`'s queue (the gles one: after the stream's work so far).
fn queue_wait(tr: &Transport, s: &Sync, device: DeviceId) -> Result<(), i32> {
    if device == GLES {
        flush_current(false)?;
    }
    tr.connection()
        .fence_wait(device, s.fence)
        .map_err(|e| fence_error("wait", &e))
}

/// `eglWaitSync` / `eglWaitSyncKHR`: the guest's GL queue on the host waits for the fence
/// (the calling thread does not).
pub extern "C" fn eglWaitSync(dpy: Handle, sync: Handle, flags: EglInt) -> EglInt {
    super::set_last_vendor();
    guard(EGL_FALSE as EglInt, || {
        let (s, tr) = lookup(dpy, sync)?;
        if flags != 0 {
            return Err(EGL_BAD_PARAMETER);
        }
        if rt::current().is_none() {
            return Err(EGL_BAD_MATCH);
        }
        queue_wait(&tr, &s, GLES)?;
        Ok(EGL_TRUE as EglInt)
    })
}

/// `eglSignalSyncKHR`: signals a program-signaled `EGL_SYNC_VIRTSOC_FENCE` (device 0);
/// virtual fences signal once: `EGL_UNSIGNALED_KHR` and other syncs are `EGL_BAD_MATCH`.
pub extern "C" fn eglSignalSyncKHR(dpy: Handle, sync: Handle, mode: EglInt) -> EglBool {
    super::set_last_vendor();
    guard(EGL_FALSE, || {
        let (s, tr) = lookup(dpy, sync)?;
        if s.signaler != Some(0) || mode != EGL_SIGNALED_KHR {
            return Err(if mode == EGL_SIGNALED_KHR || mode == EGL_UNSIGNALED_KHR {
                EGL_BAD_MATCH
            } else {
                EGL_BAD_PARAMETER
            });
        }
        tr.connection()
            .fence_signal(DeviceId::CPU, s.fence)
            .map_err(|e| fence_error("signal", &e))?;
        Ok(EGL_TRUE)
    })
}

fn sync_attrib(dpy: Handle, sync: Handle, attr: EglInt) -> Result<i64, i32> {
    let (s, tr) = lookup(dpy, sync)?;
    Ok(match attr {
        EGL_SYNC_TYPE_KHR => i64::from(s.kind),
        EGL_SYNC_STATUS_KHR => {
            let done = tr
                .connection()
                .fence_signaled(s.fence)
                .map_err(|e| fence_error("status", &e))?;
            i64::from(if done {
                EGL_SIGNALED_KHR
            } else {
                EGL_UNSIGNALED_KHR
            })
        }
        EGL_SYNC_CONDITION_KHR => i64::from(EGL_SYNC_PRIOR_COMMANDS_COMPLETE_KHR),
        EGL_VIRTSOC_FENCE_ID_LO => i64::from(s.fence.to_u64() as u32 as i32),
        EGL_VIRTSOC_FENCE_ID_HI => i64::from((s.fence.to_u64() >> 32) as u32 as i32),
        EGL_VIRTSOC_SYNC_SIGNALER => s.signaler.map_or(i64::from(EGL_NONE), i64::from),
        _ => return Err(EGL_BAD_ATTRIBUTE),
    })
}

/// `eglGetSyncAttribKHR`.
pub extern "C" fn eglGetSyncAttribKHR(
    dpy: Handle,
    sync: Handle,
    attr: EglInt,
    value: *mut EglInt,
) -> EglBool {
    super::set_last_vendor();
    guard(EGL_FALSE, || {
        put(value, sync_attrib(dpy, sync, attr)? as EglInt);
        Ok(EGL_TRUE)
    })
}

/// `eglGetSyncAttrib`.
pub extern "C" fn eglGetSyncAttrib(
    dpy: Handle,
    sync: Handle,
    attr: EglInt,
    value: *mut EglAttrib,
) -> EglBool {
    super::set_last_vendor();
    guard(EGL_FALSE, || {
        put(value, sync_attrib(dpy, sync, attr)? as EglAttrib);
        Ok(EGL_TRUE)
    })
}

/// `eglGetSyncFenceVIRTSOC`: the virtsoc fence id of `sync` (for another API of this
/// connection, or `EGL_VIRTSOC_FENCE_ID_LO/HI` of another sync).
pub extern "C" fn eglGetSyncFenceVIRTSOC(dpy: Handle, sync: Handle, fence: *mut u64) -> EglBool {
    super::set_last_vendor();
    guard(EGL_FALSE, || {
        let (s, _) = lookup(dpy, sync)?;
        put(fence, s.fence.to_u64());
        Ok(EGL_TRUE)
    })
}

/// `eglDeviceWaitSyncVIRTSOC`: the queue of virtsoc device `device` (a name as `virtsoc
/// devices` lists it) holds the guest's later commands on that device until `sync`
/// signals.
pub extern "C" fn eglDeviceWaitSyncVIRTSOC(
    dpy: Handle,
    sync: Handle,
    device: *const c_char,
) -> EglBool {
    super::set_last_vendor();
    guard(EGL_FALSE, || {
        let (s, tr) = lookup(dpy, sync)?;
        let name = name_of(device).ok_or(EGL_BAD_PARAMETER)?;
        let id = tr
            .connection()
            .devices()
            .iter()
            .find(|d| d.name == name)
            .map(|d| DeviceId(d.id))
            .ok_or(EGL_BAD_PARAMETER)?;
        queue_wait(&tr, &s, id)?;
        Ok(EGL_TRUE)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn virtsoc_fence_attributes() {
        assert_eq!(virtsoc_attribs(&[]), Ok((GLES.0, None)));
        assert_eq!(
            virtsoc_attribs(&[(EGL_VIRTSOC_SYNC_DEVICE, 10)]),
            Ok((10, None))
        );
        assert_eq!(
            virtsoc_attribs(&[(EGL_VIRTSOC_FENCE_ID_LO, 5), (EGL_VIRTSOC_FENCE_ID_HI, 1)]),
            Ok((0, Some(5 | 1 << 32)))
        );
        assert_eq!(
            virtsoc_attribs(&[(EGL_VIRTSOC_FENCE_ID_HI, 1)]),
            Err(EGL_BAD_ATTRIBUTE)
        );
        assert_eq!(
            virtsoc_attribs(&[(EGL_VIRTSOC_SYNC_DEVICE, 10), (EGL_VIRTSOC_FENCE_ID_LO, 1)]),
            Err(EGL_BAD_ATTRIBUTE)
        );
        assert_eq!(virtsoc_attribs(&[(0x3000, 1)]), Err(EGL_BAD_ATTRIBUTE));
    }
}
