//! The little of Xlib the vendor library needs (a window's size, the default visual),
//! loaded with `dlopen` at run time so the library has no link dependency on libX11.

use std::ffi::{c_char, c_int, c_uint, c_ulong, c_void, CStr};
use std::sync::OnceLock;

type XOpenDisplay = unsafe extern "C" fn(*const c_char) -> *mut c_void;
type XGetGeometry = unsafe extern "C" fn(
    *mut c_void,
    c_ulong,
    *mut c_ulong,
    *mut c_int,
    *mut c_int,
    *mut c_uint,
    *mut c_uint,
    *mut c_uint,
    *mut c_uint,
) -> c_int;
type XDefaultScreen = unsafe extern "C" fn(*mut c_void) -> c_int;
type XDefaultVisual = unsafe extern "C" fn(*mut c_void, c_int) -> *mut c_void;
type XVisualIdFromVisual = unsafe extern "C" fn(*mut c_void) -> c_ulong;
type XErrorHandler = unsafe extern "C" fn(*mut c_void, *mut c_void) -> c_int;
type XSetErrorHandler = unsafe extern "C" fn(Option<XErrorHandler>) -> Option<XErrorHandler>;

/// Xlib's functions, once loaded.
struct Xlib {
    open_display: XOpenDisplay,
    get_geometry: XGetGeometry,
    default_screen: XDefaultScreen,
    default_visual: XDefaultVisual,
    visual_id: XVisualIdFromVisual,
    _set_error_handler: XSetErrorHandler,
}

// SAFETY: function pointers into a library that stays loaded for the process's life.
unsafe impl Send for Xlib {}
// SAFETY: as for Send; Xlib's own locking is the caller's concern.
unsafe impl Sync for Xlib {}

fn sym(lib: *mut c_void, name: &CStr) -> Option<*mut c_void> {
    // SAFETY: a handle from dlopen and a NUL-terminated name.
    let p = unsafe { libc::dlsym(lib, name.as_ptr()) };
    (!p.is_null()).then_some(p)
}

fn xlib() -> Option<&'static Xlib> {
    static X: OnceLock<Option<Xlib>> = OnceLock::new();
    X.get_or_init(|| {
        // SAFETY: loading the system's libX11 (already loaded by X11 programs).
        let lib = unsafe { libc::dlopen(c"libX11.so.6".as_ptr(), libc::RTLD_NOW) };
        if lib.is_null() {
            return None;
        }
        // SAFETY: (all transmutes below) each symbol is the Xlib function of that name,
        // whose C signature the target type spells.
        unsafe {
            Some(Xlib {
                open_display: std::mem::transmute::<*mut c_void, XOpenDisplay>(sym(
                    lib,
                    c"XOpenDisplay",
                )?),
                get_geometry: std::mem::transmute::<*mut c_void, XGetGeometry>(sym(
                    lib,
                    c"XGetGeometry",
                )?),
                default_screen: std::mem::transmute::<*mut c_void, XDefaultScreen>(sym(
                    lib,
                    c"XDefaultScreen",
                )?),
                default_visual: std::mem::transmute::<*mut c_void, XDefaultVisual>(sym(
                    lib,
                    c"XDefaultVisual",
                )?),
                visual_id: std::mem::transmute::<*mut c_void, XVisualIdFromVisual>(sym(
                    lib,
                    c"XVisualIDFromVisual",
                )?),
                _set_error_handler: std::mem::transmute::<*mut c_void, XSetErrorHandler>(sym(
                    lib,
                    c"XSetErrorHandler",
                )?),
            })
        }
    })
    .as_ref()
}

/// A connection to `$DISPLAY` of the vendor library's own (for the default display).
pub fn open_default() -> *mut c_void {
    static D: OnceLock<usize> = OnceLock::new();
    *D.get_or_init(|| match xlib() {
        // SAFETY: null names `$DISPLAY`; the connection is kept for the process's life.
        Some(x) => unsafe { (x.open_display)(std::ptr::null()) as usize },
        None => 0,
    }) as *mut c_void
}

/// The size of X window `win` on `dpy` (a live `Display*` as an address), if it can be
/// had.
pub fn window_size(dpy: usize, win: u64) -> Option<(u32, u32)> {
    let x = xlib()?;
    if dpy == 0 || win == 0 {
        return None;
    }
    let dpy = dpy as *mut c_void;
    let (mut root, mut px, mut py) = (0, 0, 0);
    let (mut w, mut h, mut border, mut depth) = (0, 0, 0, 0);
    // SAFETY: a live Display of the program (or ours) and out-parameters for every field.
    let ok = unsafe {
        (x.get_geometry)(
            dpy,
            win as c_ulong,
            &mut root,
            &mut px,
            &mut py,
            &mut w,
            &mut h,
            &mut border,
            &mut depth,
        )
    };
    (ok != 0 && w > 0 && h > 0).then_some((w, h))
}

/// The id of the default visual of `dpy` (a live `Display*` as an address; 0 without X).
pub fn default_visual_id(dpy: usize) -> i32 {
    let Some(x) = xlib() else { return 0 };
    if dpy == 0 {
        return 0;
    }
    let dpy = dpy as *mut c_void;
    // SAFETY: a live Display; the visual belongs to it.
    unsafe {
        let screen = (x.default_screen)(dpy);
        let v = (x.default_visual)(dpy, screen);
        if v.is_null() {
            0
        } else {
            (x.visual_id)(v) as i32
        }
    }
}
