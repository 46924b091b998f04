//! Device commands on the vendor library's connection, for programs that fill regions with
//! virtsoc's devices before making them EGLImages (a decoder's pictures):
//! `eglDeviceCommandVIRTSOC` runs one and waits for its results;
//! `eglQueueDeviceCommandVIRTSOC` queues one (its region accesses too) and returns at once,
//! to be ordered against the GL queue with virtual fences (`EGL_SYNC_VIRTSOC_FENCE` on the
//! device, `eglWaitSyncKHR`; see `sync.rs` and `include/EGL/eglext_virtsoc.h`).

use std::ffi::c_char;

use virtsoc_devapi::{CommandInfo, DeviceInfo};
use virtsoc_guest::{Connection, GuestError, RegionId};
use virtsoc_proto::{AccessMode, Opcode};

use super::api::{display, guard, name_of, put, EglBool, Handle};
use super::consts::*;
use super::state::table;

/// Word `i` of the program's non-null argument array `args`.
fn arg(args: *const u64, i: usize) -> u64 {
    // SAFETY: the program's array of the command's arguments (the extension's contract:
    // its declared count, at most five; `i` is below it).
    unsafe { *args.add(i) }
}

/// A resolved command: the device, the command, its words and its region arguments
/// (`(id, mode, size)`).
struct Resolved {
    info: &'static DeviceInfo,
    cmd: &'static CommandInfo,
    words: [u64; 6],
    regions: Vec<(RegionId, AccessMode, u64)>,
}

fn resolve(
    conn: &Connection,
    device: *const c_char,
    command: *const c_char,
    args: *const u64,
) -> Result<Resolved, i32> {
    let (dev, cmd) = (name_of(device), name_of(command));
    let info = virtsoc_devapi::ALL
        .iter()
        .find(|d| Some(d.name) == dev)
        .ok_or(EGL_BAD_PARAMETER)?;
    let c = info
        .commands
        .iter()
        .find(|c| Some(c.name) == cmd)
        .ok_or(EGL_BAD_PARAMETER)?;
    let mut words = [0u64; 6];
    words[0] = c.op;
    for i in 0..c.args.len().min(5) {
        if args.is_null() {
            return Err(EGL_BAD_PARAMETER);
        }
        words[i + 1] = arg(args, i);
    }
    let mut regions = Vec::new();
    for (id, mode) in c.regions(&words) {
        let size = conn.region(id).ok_or(EGL_BAD_PARAMETER)?.size;
        regions.push((id, mode, size));
    }
    Ok(Resolved {
        info,
        cmd: c,
        words,
        regions,
    })
}

fn with_connection<T: Copy>(
    dpy: Handle,
    fail: T,
    f: impl FnOnce(&Connection) -> Result<T, i32>,
) -> T {
    super::set_last_vendor();
    guard(fail, || {
        let tr = {
            let t = table();
            display(&t, dpy)?;
            t.transport.clone().ok_or(EGL_NOT_INITIALIZED)?
        };
        f(tr.connection())
    })
}

/// `eglDeviceCommandVIRTSOC`: runs command `command` of virtsoc device `device` (names as
/// `virtsoc devices` lists them, e.g. `codec` / `decode`) on the library's connection with
/// `args` (its declared arguments, at most five), every region argument bracketed by an
/// access of the whole region from that device in the declared mode (as
/// `Connection::command_with_access`); its six result words through `results`.
pub extern "C" fn eglDeviceCommandVIRTSOC(
    dpy: Handle,
    device: *const c_char,
    command: *const c_char,
    args: *const u64,
    results: *mut u64,
) -> EglBool {
    with_connection(dpy, EGL_FALSE, |conn| {
        let r = resolve(conn, device, command, args)?;
        let fail = |what: &str, e: GuestError| {
            log::warn!("virtsoc EGL: {}::{}: {what}: {e}", r.info.name, r.cmd.name);
            EGL_BAD_ACCESS
        };
        let mut begun = Vec::new();
        let mut result = Ok([0u64; 6]);
        for &(id, mode, size) in &r.regions {
            match conn.begin_access(id, r.info.id, 0, size, mode) {
                Ok(_) => begun.push((id, mode, size)),
                Err(e) => {
                    result = Err(fail("access", e));
                    break;
                }
            }
        }
        if result.is_ok() {
            result = conn
                .device_cmd(r.info.id, r.words)
                .map_err(|e| fail("command", e));
        }
        for (id, mode, size) in begun {
            if let Err(e) = conn.end_access(id, r.info.id, 0, size, mode) {
                log::warn!("virtsoc EGL: end of access: {e}");
            }
        }
        let v = result?;
        if !results.is_null() {
            for (i, x) in v.iter().enumerate() {
                put(results.wrapping_add(i), *x);
            }
        }
        Ok(EGL_TRUE)
    })
}

/// `eglQueueDeviceCommandVIRTSOC`: as `eglDeviceCommandVIRTSOC`, but queued: the accesses
/// and the command go to the device's queue and the call returns at once (no results; a
/// failure is logged when the library next collects its connection's errors). Order it
/// against other devices with virtual fences.
pub extern "C" fn eglQueueDeviceCommandVIRTSOC(
    dpy: Handle,
    device: *const c_char,
    command: *const c_char,
    args: *const u64,
) -> EglBool {
    with_connection(dpy, EGL_FALSE, |conn| {
        let r = resolve(conn, device, command, args)?;
        let dev = r.info.id;
        let access = |op, (id, mode, size): (RegionId, AccessMode, u64)| {
            let id = u64::from(id);
            conn.submit_detached(op, dev, [id, 0, size, mode as u64, 0, 0])
        };
        let queued = (|| {
            for &a in &r.regions {
                access(Opcode::BeginAccess, a)?;
            }
            conn.submit_detached(Opcode::DeviceCmd, dev, r.words)?;
            for &a in &r.regions {
                access(Opcode::EndAccess, a)?;
            }
            Ok::<_, GuestError>(())
        })();
        queued.map_err(|e| {
            log::warn!("virtsoc EGL: {}::{}: {e}", r.info.name, r.cmd.name);
            EGL_BAD_ACCESS
        })?;
        Ok(EGL_TRUE)
    })
}
