//! The EGL entry points of displays, configs, contexts and the thread's state, and the
//! helpers every EGL file shares. Each entry point runs its body inside
//! `guard`: a failure sets the calling thread's EGL error and returns the call's failure
//! value, success sets `EGL_SUCCESS`, and a panic never unwinds into C.

use std::cell::Cell;
use std::ffi::{c_char, c_ulong, c_void, CStr};
use std::sync::{Arc, Mutex};

use virtsoc_gles_stream::{egl as wire, Reader};

use super::consts::*;
use super::state::{
    choose, config_attrib, from_handle, table, to_handle, Ctx, Display, Platform, Table,
};
use super::x11;
use crate::rt::{self, ChannelError, Context, Stream};
use virtsoc_sync::LockExt;

/// An EGL handle (display, config, context, surface, sync).
pub type Handle = *mut c_void;
/// `EGLint`.
pub type EglInt = i32;
/// `EGLBoolean`.
pub type EglBool = u32;
/// `EGLAttrib`.
pub type EglAttrib = isize;

pub(crate) const NO: Handle = std::ptr::null_mut();

thread_local! {
    static ERROR: Cell<i32> = const { Cell::new(EGL_SUCCESS) };
}

pub(crate) fn set_error(e: i32) {
    ERROR.with(|c| c.set(e));
}

/// Runs an entry point's body: sets the thread's error and never unwinds.
pub(crate) fn guard<T: Copy>(fail: T, f: impl FnOnce() -> Result<T, i32>) -> T {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(v)) => {
            set_error(EGL_SUCCESS);
            v
        }
        Ok(Err(e)) => {
            set_error(e);
            fail
        }
        Err(_) => {
            set_error(EGL_BAD_ALLOC);
            fail
        }
    }
}

/// An attribute list's element (`EGLint` or `EGLAttrib`).
pub(crate) trait Wide {
    fn wide(self) -> i64;
}

impl Wide for i32 {
    fn wide(self) -> i64 {
        self.into()
    }
}

impl Wide for isize {
    fn wide(self) -> i64 {
        self as i64
    }
}

/// The attribute pairs of a list ending at `EGL_NONE` (at most 128 pairs).
pub(crate) fn pairs<T: Copy + Wide>(list: *const T) -> Vec<(i32, i32)> {
    let mut out = Vec::new();
    if list.is_null() {
        return out;
    }
    for i in 0..128 {
        // SAFETY: the program's attribute list, read pairwise up to its EGL_NONE.
        let a: i64 = unsafe { *list.add(2 * i) }.wide();
        if a == EGL_NONE as i64 {
            break;
        }
        // SAFETY: as above: a value follows every attribute but EGL_NONE.
        let v: i64 = unsafe { *list.add(2 * i + 1) }.wide();
        out.push((a as i32, v as i32));
    }
    out
}

/// Writes `v` through an out-pointer that may be null.
pub(crate) fn put<T>(p: *mut T, v: T) {
    if !p.is_null() {
        // SAFETY: a non-null out-parameter of the program.
        unsafe { p.write(v) };
    }
}

/// The display of handle `dpy`, initialised.
pub(crate) fn display(t: &Table, dpy: Handle) -> Result<&Display, i32> {
    let d = t.displays.get(&from_handle(dpy)).ok_or(EGL_BAD_DISPLAY)?;
    if !d.initialized {
        return Err(EGL_NOT_INITIALIZED);
    }
    Ok(d)
}

pub(crate) fn stream(t: &Table) -> Result<Arc<Mutex<Stream>>, i32> {
    t.stream.clone().ok_or(EGL_NOT_INITIALIZED)
}

pub(crate) fn lock(s: &Mutex<Stream>) -> std::sync::MutexGuard<'_, Stream> {
    s.lock_or_recover()
}

/// The EGL error of a failed batch.
pub(crate) fn batch_error(e: &ChannelError, lost: i32) -> i32 {
    match e {
        ChannelError::Lost(why) => {
            log::warn!("virtsoc EGL: {why}");
            lost
        }
        ChannelError::Refused(why) => {
            log::warn!("virtsoc EGL: {why}");
            EGL_BAD_ALLOC
        }
    }
}

/// The answer of the last `op` packet in a reply (its first word).
pub(crate) fn answer(reply: &[u8], op: u32) -> Option<u32> {
    let mut r = Reader::new(reply);
    let mut found = None;
    while let Some(Ok((o, mut p))) = r.next_packet() {
        if o == op {
            found = p.u32().ok();
        }
    }
    found
}

/// Encodes an EGL packet with `words`, runs the batch and returns the packet's answer.
pub(crate) fn round_trip(s: &Mutex<Stream>, op: u32, words: &[u32], lost: i32) -> Result<u32, i32> {
    let mut s = lock(s);
    {
        let enc = s.egl_encoder();
        let mut p = enc.packet(op);
        for w in words {
            p.u32(*w);
        }
    }
    let reply = s.round_trip().map_err(|e| batch_error(&e, lost))?;
    answer(&reply, op).ok_or(EGL_BAD_ALLOC)
}

/// Encodes an EGL packet that answers nothing and sends it without waiting.
pub(crate) fn post(s: &Mutex<Stream>, op: u32, words: &[u32]) {
    let mut s = lock(s);
    {
        let enc = s.egl_encoder();
        let mut p = enc.packet(op);
        for w in words {
            p.u32(*w);
        }
    }
    // A failure surfaces at the next waited batch.
    let _ = s.flush();
}

pub(crate) fn to_egl_error(code: u32) -> Result<(), i32> {
    if code == wire::SUCCESS {
        Ok(())
    } else {
        Err(code as i32)
    }
}

/// The X display windows of `d` live on.
pub(crate) fn x_display(d: &Display) -> *mut c_void {
    if d.native != 0 {
        d.native as *mut c_void
    } else {
        x11::open_default()
    }
}

// ---- glvnd's imports ----

/// glvnd's `getPlatformDisplay`: the display of `platform` on `native`.
pub extern "C" fn get_platform_display(
    platform: u32,
    native: *mut c_void,
    _attribs: *const EglAttrib,
) -> Handle {
    guard(NO, || {
        let platform = match platform {
            EGL_PLATFORM_X11_KHR => Platform::X11,
            EGL_PLATFORM_SURFACELESS_MESA => Platform::Surfaceless,
            EGL_NONE_PLATFORM if !native.is_null() || std::env::var_os("DISPLAY").is_some() => {
                Platform::X11
            }
            EGL_NONE_PLATFORM => Platform::Surfaceless,
            _ => return Err(EGL_BAD_PARAMETER),
        };
        let native = native as usize;
        let mut t = table();
        if let Some((id, _)) = t
            .displays
            .iter()
            .find(|(_, d)| d.platform == platform && d.native == native)
        {
            return Ok(to_handle(*id));
        }
        let id = t.next_id();
        t.displays.insert(
            id,
            Display {
                platform,
                native,
                initialized: false,
                visual: 0,
            },
        );
        Ok(to_handle(id))
    })
}

/// glvnd's `getSupportsAPI`: OpenGL ES only.
pub extern "C" fn get_supports_api(api: u32) -> EglBool {
    u32::from(api == EGL_OPENGL_ES_API)
}

/// The platform extensions glvnd asks for.
pub extern "C" fn get_vendor_string(name: i32) -> *const c_char {
    match name {
        0 => c"EGL_KHR_platform_x11 EGL_EXT_platform_x11 EGL_MESA_platform_surfaceless".as_ptr(),
        _ => std::ptr::null(),
    }
}

// ---- EGL 1.0-1.5 ----

/// `eglGetDisplay`.
pub extern "C" fn eglGetDisplay(native: *mut c_void) -> Handle {
    get_platform_display(EGL_NONE_PLATFORM, native, std::ptr::null())
}

/// `eglGetPlatformDisplay`.
pub extern "C" fn eglGetPlatformDisplay(
    platform: u32,
    native: *mut c_void,
    attribs: *const EglAttrib,
) -> Handle {
    get_platform_display(platform, native, attribs)
}

/// `eglInitialize`: connects to the daemon (once per process).
pub extern "C" fn eglInitialize(dpy: Handle, major: *mut EglInt, minor: *mut EglInt) -> EglBool {
    guard(EGL_FALSE, || {
        let mut t = table();
        let id = from_handle(dpy);
        let (platform, native) = match t.displays.get(&id) {
            Some(d) => (d.platform, d.native),
            None => return Err(EGL_BAD_DISPLAY),
        };
        if t.stream.is_none() {
            match crate::transport::Transport::connect() {
                Ok(tr) => {
                    let tr = Arc::new(tr);
                    let s = Stream::new(tr.clone());
                    t.stream = Some(Arc::new(Mutex::new(s)));
                    t.transport = Some(tr);
                }
                Err(e) => {
                    log::warn!("virtsoc EGL: {e}");
                    t.connect_error = Some(e.to_string());
                    return Err(EGL_NOT_INITIALIZED);
                }
            }
        }
        let visual = match platform {
            Platform::X11 => x11::default_visual_id(if native != 0 {
                native
            } else {
                x11::open_default() as usize
            }),
            Platform::Surfaceless => 0,
        };
        if let Some(d) = t.displays.get_mut(&id) {
            d.initialized = true;
            d.visual = visual;
        }
        put(major, 1);
        put(minor, 5);
        Ok(EGL_TRUE)
    })
}

/// `eglTerminate`.
pub extern "C" fn eglTerminate(dpy: Handle) -> EglBool {
    guard(EGL_FALSE, || {
        let mut t = table();
        let d = t
            .displays
            .get_mut(&from_handle(dpy))
            .ok_or(EGL_BAD_DISPLAY)?;
        d.initialized = false;
        Ok(EGL_TRUE)
    })
}

/// `eglQueryString`.
pub extern "C" fn eglQueryString(dpy: Handle, name: EglInt) -> *const c_char {
    guard(std::ptr::null(), || {
        if dpy.is_null() {
            return match name {
                EGL_EXTENSIONS => Ok(c"EGL_EXT_client_extensions EGL_EXT_platform_base \
                    EGL_KHR_platform_x11 EGL_EXT_platform_x11 EGL_MESA_platform_surfaceless \
                    EGL_KHR_client_get_all_proc_addresses"
                    .as_ptr()),
                EGL_VERSION => Ok(c"1.5 virtsoc".as_ptr()),
                _ => Err(EGL_BAD_DISPLAY),
            };
        }
        let t = table();
        display(&t, dpy)?;
        Ok(match name {
            EGL_VENDOR => c"virtsoc".as_ptr(),
            EGL_VERSION => c"1.5 virtsoc".as_ptr(),
            EGL_CLIENT_APIS => c"OpenGL_ES".as_ptr(),
            EGL_EXTENSIONS => c"EGL_KHR_fence_sync EGL_KHR_surfaceless_context \
                EGL_KHR_create_context EGL_KHR_get_all_proc_addresses \
                EGL_KHR_no_config_context EGL_KHR_image_base EGL_VIRTSOC_region_image \
                EGL_KHR_wait_sync EGL_VIRTSOC_fence_sync"
                .as_ptr(),
            _ => return Err(EGL_BAD_PARAMETER),
        })
    })
}

/// `eglGetConfigs`.
pub extern "C" fn eglGetConfigs(
    dpy: Handle,
    configs: *mut Handle,
    size: EglInt,
    num: *mut EglInt,
) -> EglBool {
    guard(EGL_FALSE, || {
        let t = table();
        display(&t, dpy)?;
        if num.is_null() {
            return Err(EGL_BAD_PARAMETER);
        }
        let all: Vec<u32> = wire::CONFIGS.iter().map(|c| c.0).collect();
        write_configs(&all, configs, size, num);
        Ok(EGL_TRUE)
    })
}

fn write_configs(ids: &[u32], configs: *mut Handle, size: EglInt, num: *mut EglInt) {
    if configs.is_null() {
        put(num, ids.len() as EglInt);
        return;
    }
    let n = ids.len().min(size.max(0) as usize);
    for (i, id) in ids.iter().take(n).enumerate() {
        // SAFETY: the program gave room for `size` configs; `i < size`.
        unsafe { configs.add(i).write(to_handle(*id)) };
    }
    put(num, n as EglInt);
}

/// `eglChooseConfig`.
pub extern "C" fn eglChooseConfig(
    dpy: Handle,
    attribs: *const EglInt,
    configs: *mut Handle,
    size: EglInt,
    num: *mut EglInt,
) -> EglBool {
    guard(EGL_FALSE, || {
        let t = table();
        let d = display(&t, dpy)?;
        if num.is_null() {
            return Err(EGL_BAD_PARAMETER);
        }
        let ids = choose(&pairs(attribs), d.visual)?;
        write_configs(&ids, configs, size, num);
        Ok(EGL_TRUE)
    })
}

/// `eglGetConfigAttrib`.
pub extern "C" fn eglGetConfigAttrib(
    dpy: Handle,
    config: Handle,
    attr: EglInt,
    value: *mut EglInt,
) -> EglBool {
    guard(EGL_FALSE, || {
        let t = table();
        let d = display(&t, dpy)?;
        let id = from_handle(config);
        wire::config(id).ok_or(EGL_BAD_CONFIG)?;
        let v = config_attrib(id, attr, d.visual).ok_or(EGL_BAD_ATTRIBUTE)?;
        put(value, v);
        Ok(EGL_TRUE)
    })
}

/// `eglCreateContext`: OpenGL ES 2 contexts.
pub extern "C" fn eglCreateContext(
    dpy: Handle,
    config: Handle,
    share: Handle,
    attribs: *const EglInt,
) -> Handle {
    guard(NO, || {
        let mut t = table();
        display(&t, dpy)?;
        let config = from_handle(config);
        if config != 0 && wire::config(config).is_none() {
            return Err(EGL_BAD_CONFIG);
        }
        let (mut major, mut minor) = (1, 0);
        for (a, v) in pairs(attribs) {
            match a {
                EGL_CONTEXT_CLIENT_VERSION => major = v,
                EGL_CONTEXT_MINOR_VERSION => minor = v,
                EGL_CONTEXT_FLAGS_KHR
                | EGL_CONTEXT_OPENGL_PROFILE_MASK
                | EGL_CONTEXT_OPENGL_DEBUG
                | EGL_CONTEXT_OPENGL_ROBUST_ACCESS
                | EGL_CONTEXT_OPENGL_RESET_NOTIFICATION_STRATEGY
                | EGL_CONTEXT_PRIORITY_LEVEL_IMG
                | EGL_CONTEXT_OPENGL_NO_ERROR_KHR => {}
                _ => return Err(EGL_BAD_ATTRIBUTE),
            }
        }
        if !matches!((major, minor), (2, 0) | (3, 0) | (3, 1)) {
            // OpenGL ES 1 is not offered; ES 3 is 3.0 or 3.1 (the host refuses it without
            // ES 3; a 3.1 request on a host with 3.0 only gets 3.0, `GL_VERSION` says so).
            return Err(EGL_BAD_MATCH);
        }
        let major = major as u32;
        let share_id = from_handle(share);
        if share_id != 0 && !t.contexts.contains_key(&share_id) {
            return Err(EGL_BAD_CONTEXT);
        }
        let s = stream(&t)?;
        let id = t.next_id();
        let code = round_trip(
            &s,
            wire::CREATE_CONTEXT,
            &[id, share_id, major],
            EGL_BAD_ALLOC,
        )?;
        to_egl_error(code)?;
        let gl = match t.contexts.get(&share_id) {
            Some(other) => crate::gl::GlState::new(major, Some(&other.rt.gl())),
            None => crate::gl::GlState::new(major, None),
        };
        let rt = Arc::new(Context {
            id,
            stream: s,
            gl: Mutex::new(gl),
        });
        t.contexts.insert(
            id,
            Ctx {
                display: from_handle(dpy),
                config,
                rt,
            },
        );
        Ok(to_handle(id))
    })
}

/// `eglDestroyContext`.
pub extern "C" fn eglDestroyContext(dpy: Handle, ctx: Handle) -> EglBool {
    guard(EGL_FALSE, || {
        let mut t = table();
        display(&t, dpy)?;
        let id = from_handle(ctx);
        let c = t.contexts.remove(&id).ok_or(EGL_BAD_CONTEXT)?;
        post(&c.rt.stream, wire::DESTROY_CONTEXT, &[id]);
        Ok(EGL_TRUE)
    })
}
/// `eglQueryContext`.
pub extern "C" fn eglQueryContext(
    dpy: Handle,
    ctx: Handle,
    attr: EglInt,
    value: *mut EglInt,
) -> EglBool {
    guard(EGL_FALSE, || {
        let t = table();
        display(&t, dpy)?;
        let c = t.contexts.get(&from_handle(ctx)).ok_or(EGL_BAD_CONTEXT)?;
        let v = match attr {
            EGL_CONFIG_ID => c.config as i32,
            EGL_CONTEXT_CLIENT_TYPE => EGL_OPENGL_ES_API as i32,
            EGL_CONTEXT_CLIENT_VERSION => c.rt.gl().client_version() as i32,
            EGL_RENDER_BUFFER => EGL_BACK_BUFFER,
            _ => return Err(EGL_BAD_ATTRIBUTE),
        };
        put(value, v);
        Ok(EGL_TRUE)
    })
}

/// `eglGetError`: the calling thread's last error, reset.
pub extern "C" fn eglGetError() -> EglInt {
    ERROR.with(|c| c.replace(EGL_SUCCESS))
}

/// `eglBindAPI`: OpenGL ES only.
pub extern "C" fn eglBindAPI(api: u32) -> EglBool {
    guard(EGL_FALSE, || {
        if api == EGL_OPENGL_ES_API {
            Ok(EGL_TRUE)
        } else {
            Err(EGL_BAD_PARAMETER)
        }
    })
}

/// `eglQueryAPI`.
pub extern "C" fn eglQueryAPI() -> u32 {
    EGL_OPENGL_ES_API
}

/// Waits until the host ran everything the current context sent.
pub(crate) fn finish_current() -> Result<(), i32> {
    let Some(cur) = rt::current() else {
        return Ok(());
    };
    let mut s = lock(&cur.stream);
    s.encoder(cur.id).packet(wire::FINISH);
    s.round_trip()
        .map(|_| ())
        .map_err(|e| batch_error(&e, EGL_CONTEXT_LOST))
}

/// `eglWaitClient`.
pub extern "C" fn eglWaitClient() -> EglBool {
    guard(EGL_FALSE, || finish_current().map(|()| EGL_TRUE))
}

/// `eglWaitGL`.
pub extern "C" fn eglWaitGL() -> EglBool {
    eglWaitClient()
}

/// `eglWaitNative`: nothing to wait for.
pub extern "C" fn eglWaitNative(_engine: EglInt) -> EglBool {
    guard(EGL_FALSE, || Ok(EGL_TRUE))
}

/// `eglReleaseThread`.
pub extern "C" fn eglReleaseThread() -> EglBool {
    guard(EGL_FALSE, || {
        if let Some(cur) = rt::current() {
            let _ = lock(&cur.stream).flush();
        }
        rt::make_current(None);
        Ok(EGL_TRUE)
    })
}

/// `eglCopyBuffers`: pixmaps are not supported.
pub extern "C" fn eglCopyBuffers(_dpy: Handle, _surf: Handle, _pixmap: c_ulong) -> EglBool {
    set_error(EGL_BAD_NATIVE_PIXMAP);
    EGL_FALSE
}

/// `eglBindTexImage`: not supported.
pub extern "C" fn eglBindTexImage(_dpy: Handle, _surf: Handle, _buffer: EglInt) -> EglBool {
    set_error(EGL_BAD_MATCH);
    EGL_FALSE
}

/// `eglReleaseTexImage`: not supported.
pub extern "C" fn eglReleaseTexImage(_dpy: Handle, _surf: Handle, _buffer: EglInt) -> EglBool {
    set_error(EGL_BAD_MATCH);
    EGL_FALSE
}

/// `eglGetCurrentContext`.
pub extern "C" fn eglGetCurrentContext() -> Handle {
    rt::current().map_or(NO, |c| to_handle(c.id))
}

/// `eglGetProcAddress`.
pub extern "C" fn eglGetProcAddress(name: *const c_char) -> *mut c_void {
    super::get_proc_address(name)
}

/// The name of a C string, if it is UTF-8.
pub(crate) fn name_of<'a>(p: *const c_char) -> Option<&'a str> {
    if p.is_null() {
        return None;
    }
    // SAFETY: a NUL-terminated name from the program or glvnd.
    unsafe { CStr::from_ptr(p) }.to_str().ok()
}
