//! `eglPresentVIRTSOC` (`EGL_VIRTSOC_fence_sync`, `include/EGL/eglext_virtsoc.h`): shows
//! the current draw surface (a pbuffer too: a program without an X server, such as `virtsoc
//! run gles-video`) on the daemon's display with an acquire fence and a presentation time
//! stamp, and the few counters a program needs to measure itself.
//!
//! A present queues, without waiting: on the gles queue the surface's readback into one of
//! [`FRAMES`] RGBA8 frame regions (after the GL work before it), a fence signaled after it
//! (the acquire fence), on the display's queue a wait on that fence and the frame's
//! present with `capture_ns` (the frame's decode or capture time, for decode-to-photon
//! latency), and a fence signaled after the display's access (the release fence): the gles
//! queue waits on it before the readback reuses the frame region. With
//! `EGL_VIRTSOC_PRESENT_WAIT` the program waits for the display's access (the atomic
//! ordering of the scenarios).

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use virtsoc_devapi::DeviceCommand;
use virtsoc_guest::conn::RegionInfo;
use virtsoc_guest::{Connection, Fence, GuestError};
use virtsoc_proto::wire::Format;
use virtsoc_proto::{AccessMode, DeviceId, Opcode};

use super::api::{display, guard, name_of, put, EglBool, EglInt, Handle};
use super::consts::*;
use super::state::{from_handle, table};
use crate::rt;
use virtsoc_sync::LockExt;

/// Frame regions of one surface taking turns.
pub const FRAMES: usize = 3;
/// `eglPresentVIRTSOC` flag: wait until the display has read the frame.
pub const EGL_VIRTSOC_PRESENT_WAIT: i32 = 1;

const GLES: DeviceId = virtsoc_devapi::gles::ID;
const DISPLAY: DeviceId = virtsoc_devapi::display::ID;

/// The display frames of one surface.
struct Frames {
    size: (u32, u32),
    regions: Vec<RegionInfo>,
    /// The release fence of each region's last frame (the display's access ended).
    released: Vec<Option<Fence>>,
    next: usize,
}

static PRESENTS: std::sync::LazyLock<Mutex<HashMap<u32, Frames>>> =
    std::sync::LazyLock::new(|| Mutex::new(HashMap::new()));

fn presents() -> MutexGuard<'static, HashMap<u32, Frames>> {
    PRESENTS.lock_or_recover()
}

fn failed(what: &str, e: &GuestError) -> i32 {
    log::warn!("virtsoc EGL: present: {what}: {e}");
    EGL_BAD_ACCESS
}

/// The frames of surface `surf` at `size` (made, or remade at a new size).
fn frames_of<'a>(
    all: &'a mut HashMap<u32, Frames>,
    conn: &Connection,
    surf: u32,
    size: (u32, u32),
) -> Result<&'a mut Frames, i32> {
    if all.get(&surf).is_some_and(|f| f.size != size) {
        if let Some(old) = all.remove(&surf) {
            drop_frames(conn, old);
        }
    }
    if let std::collections::hash_map::Entry::Vacant(slot) = all.entry(surf) {
        let mut regions = Vec::new();
        for _ in 0..FRAMES {
            regions.push(
                conn.alloc(0, size.0, size.1, Format::Rgba8, 0)
                    .map_err(|e| failed("frame region", &e))?,
            );
        }
        slot.insert(Frames {
            size,
            regions,
            released: vec![None; FRAMES],
            next: 0,
        });
    }
    all.get_mut(&surf).ok_or(EGL_BAD_ALLOC)
}

/// Frees a surface's frame regions once the display is done with them.
fn drop_frames(conn: &Connection, old: Frames) {
    for f in old.released.into_iter().flatten() {
        let _ = conn.fence_wait_cpu(f, Duration::from_secs(5));
        let _ = conn.fence_release(f);
    }
    for r in old.regions {
        let _ = conn.free(r.id);
    }
}

/// Forgets surface `surf`'s frames (the surface was destroyed).
pub fn forget_surface(conn: &Connection, surf: u32) {
    let old = presents().remove(&surf);
    if let Some(f) = old {
        drop_frames(conn, f);
    }
}

/// Queues one present of surface `surf` (module docs); the release fence.
fn queue_present(
    conn: &Connection,
    f: &mut Frames,
    surf: u32,
    capture_ns: u64,
) -> Result<Fence, GuestError> {
    let k = f.next;
    f.next = (k + 1) % f.regions.len();
    let frame = f.regions[k];
    if let Some(done) = f.released[k].take() {
        conn.fence_wait(GLES, done)?;
        conn.fence_release(done)?;
    }
    let word = u64::from(frame.id);
    let write = [word, 0, frame.size, AccessMode::Write as u64, 0, 0];
    let read = [word, 0, frame.size, AccessMode::Read as u64, 0, 0];
    let rb = virtsoc_devapi::gles::Readback {
        surface: u64::from(surf),
        frame: frame.id,
    };
    conn.submit_detached(Opcode::BeginAccess, GLES, write)?;
    conn.submit_detached(Opcode::DeviceCmd, GLES, rb.encode())?;
    conn.submit_detached(Opcode::EndAccess, GLES, write)?;
    let acquire = super::sync::new_fence(conn).map_err(|_| GuestError::Closed)?;
    conn.fence_signal(GLES, acquire)?;
    conn.fence_wait(DISPLAY, acquire)?;
    conn.fence_release(acquire)?;
    let present = virtsoc_devapi::display::Present {
        frame: frame.id,
        capture_ns,
    };
    conn.submit_detached(Opcode::BeginAccess, DISPLAY, read)?;
    conn.submit_detached(Opcode::DeviceCmd, DISPLAY, present.encode())?;
    conn.submit_detached(Opcode::EndAccess, DISPLAY, read)?;
    let released = super::sync::new_fence(conn).map_err(|_| GuestError::Closed)?;
    conn.fence_signal(DISPLAY, released)?;
    f.released[k] = Some(released);
    Ok(released)
}

/// `eglPresentVIRTSOC`: presents the current context's draw surface `surface` (of
/// `width` x `height`) on the daemon's display, `capture_ns` (CLOCK_MONOTONIC; 0: none)
/// being when its content was decoded or captured. Nothing waits unless `flags` has
/// `EGL_VIRTSOC_PRESENT_WAIT`.
pub extern "C" fn eglPresentVIRTSOC(
    dpy: Handle,
    surface: Handle,
    width: EglInt,
    height: EglInt,
    capture_ns: u64,
    flags: EglInt,
) -> EglBool {
    super::set_last_vendor();
    guard(EGL_FALSE, || {
        let tr = {
            let t = table();
            display(&t, dpy)?;
            t.transport.clone().ok_or(EGL_NOT_INITIALIZED)?
        };
        let w = u32::try_from(width).map_err(|_| EGL_BAD_PARAMETER)?;
        let h = u32::try_from(height).map_err(|_| EGL_BAD_PARAMETER)?;
        if w == 0 || h == 0 || flags & !EGL_VIRTSOC_PRESENT_WAIT != 0 {
            return Err(EGL_BAD_PARAMETER);
        }
        let cur = rt::current().ok_or(EGL_BAD_SURFACE)?;
        cur.stream().flush().map_err(|e| {
            log::warn!("virtsoc EGL: {e:?}");
            EGL_CONTEXT_LOST
        })?;
        let conn = tr.connection();
        let surf = from_handle(surface);
        let released = {
            let mut all = presents();
            let f = frames_of(&mut all, conn, surf, (w, h))?;
            queue_present(conn, f, surf, capture_ns).map_err(|e| failed("queue", &e))?
        };
        if flags & EGL_VIRTSOC_PRESENT_WAIT != 0 {
            let shown = conn
                .fence_wait_cpu(released, Duration::from_secs(30))
                .map_err(|e| failed("wait", &e))?;
            if !shown {
                return Err(EGL_BAD_ACCESS);
            }
        }
        for (seq, st) in conn.take_async_errors() {
            log::info!("virtsoc EGL: present: request {seq}: {}", st.message());
        }
        Ok(EGL_TRUE)
    })
}

/// `eglQueryCounterVIRTSOC`: one of the connection's SVM counters by name (`hits`,
/// `misses`: the prefetch predictions; `copies`, `copy_ns`, `device_copies`,
/// `device_copy_ns`), monotonic. `EGL_BAD_PARAMETER` for another name.
pub extern "C" fn eglQueryCounterVIRTSOC(
    dpy: Handle,
    name: *const std::ffi::c_char,
    value: *mut u64,
) -> EglBool {
    super::set_last_vendor();
    guard(EGL_FALSE, || {
        let tr = {
            let t = table();
            display(&t, dpy)?;
            t.transport.clone().ok_or(EGL_NOT_INITIALIZED)?
        };
        let c = tr
            .connection()
            .counters()
            .map_err(|e| failed("counters", &e))?;
        let v = match name_of(name) {
            Some("hits") => c.hits,
            Some("misses") => c.misses,
            Some("copies") => c.copies,
            Some("copy_ns") => c.copy_ns,
            Some("device_copies") => c.device_copies,
            Some("device_copy_ns") => c.device_copy_ns,
            _ => return Err(EGL_BAD_PARAMETER),
        };
        put(value, v);
        Ok(EGL_TRUE)
    })
}
