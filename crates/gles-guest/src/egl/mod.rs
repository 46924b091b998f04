//! EGL for glvnd: [`__egl_Main`] hands libEGL the vendor's imports (display creation,
//! API support, `getProcAddress` for every EGL and GL entry point); the entry points
//! themselves are in [`api`] (displays, configs, contexts), [`surface`] (surfaces, make
//! current, swap), [`sync`] (EGL syncs as virtual fences), [`image`] (EGLImages of SVM
//! regions), [`device`] and [`present`] (virtsoc's device-queue and present extensions), the
//! objects in [`state`], the bit of Xlib needed for windows in [`x11`].
//!
//! With only this vendor loaded (`__EGL_VENDOR_LIBRARY_FILENAMES` naming virtsoc's JSON),
//! the extension functions glvnd asks dispatch stubs for (`getDispatchAddress`) are the
//! implementations themselves.

pub mod api;
pub mod consts;
pub mod device;
pub mod image;
pub mod present;
pub mod state;
pub mod surface;
pub mod sync;
pub mod x11;

use std::ffi::{c_char, c_void};

use api::*;
use surface::*;
use sync::*;

/// `__EGLapiImports` of `glvnd/libeglabi.h` (ABI 0.x): what the vendor gives libEGL.
#[repr(C)]
pub struct EglApiImports {
    /// `getPlatformDisplay`.
    pub get_platform_display: Option<extern "C" fn(u32, *mut c_void, *const EglAttrib) -> Handle>,
    /// `getSupportsAPI`.
    pub get_supports_api: Option<extern "C" fn(u32) -> EglBool>,
    /// `getVendorString`.
    pub get_vendor_string: Option<extern "C" fn(i32) -> *const c_char>,
    /// `getProcAddress`.
    pub get_proc_address: Option<extern "C" fn(*const c_char) -> *mut c_void>,
    /// `getDispatchAddress`.
    pub get_dispatch_address: Option<extern "C" fn(*const c_char) -> *mut c_void>,
    /// `setDispatchIndex`.
    pub set_dispatch_index: Option<extern "C" fn(*const c_char, i32)>,
    /// `isPatchSupported` (not used: left null).
    pub is_patch_supported: *mut c_void,
    /// `initiatePatch` (null).
    pub initiate_patch: *mut c_void,
    /// `releasePatch` (null).
    pub release_patch: *mut c_void,
    /// `patchThreadAttach` (null).
    pub patch_thread_attach: *mut c_void,
    /// `findNativeDisplayPlatform` (null: libEGL guesses).
    pub find_native_display_platform: *mut c_void,
}

/// The vendor ABI major version this library implements.
pub const ABI_MAJOR: u32 = 0;

/// glvnd's entry into the vendor library: fills `imports`.
///
/// # Safety
/// `imports` is null or points to libEGL's writable imports table.
#[no_mangle]
pub unsafe extern "C" fn __egl_Main(
    version: u32,
    exports: *const c_void,
    vendor: *mut c_void,
    imports: *mut EglApiImports,
) -> EglBool {
    if version >> 16 != ABI_MAJOR || imports.is_null() {
        return 0;
    }
    EXPORTS.store(exports as usize, std::sync::atomic::Ordering::Release);
    VENDOR.store(vendor as usize, std::sync::atomic::Ordering::Release);
    // SAFETY: libEGL's imports table (the caller's contract); only the fields of ABI 0.0
    // are written, the rest stays as libEGL zeroed it.
    unsafe {
        (*imports).get_platform_display = Some(get_platform_display);
        (*imports).get_supports_api = Some(get_supports_api);
        (*imports).get_vendor_string = Some(get_vendor_string);
        (*imports).get_proc_address = Some(get_proc_address);
        (*imports).get_dispatch_address = Some(get_dispatch_address);
        (*imports).set_dispatch_index = Some(set_dispatch_index);
    }
    1
}

/// libEGL's `__EGLapiExports` and our `__EGLvendorInfo`, as `__egl_Main` gave them.
static EXPORTS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
static VENDOR: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// The head of `__EGLapiExports` (glvnd/libeglabi.h, ABI 0.x) up to `setLastVendor`.
#[repr(C)]
struct EglApiExportsHead {
    _calls: [*const c_void; 8],
    set_last_vendor: Option<extern "C" fn(*mut c_void) -> EglBool>,
}

/// Tells libEGL that this vendor ran the calling thread's last EGL call, so its
/// `eglGetError` asks us: an extension function handed out as itself (no glvnd stub)
/// calls this first.
pub(crate) fn set_last_vendor() {
    let exports = EXPORTS.load(std::sync::atomic::Ordering::Acquire) as *const EglApiExportsHead;
    let vendor = VENDOR.load(std::sync::atomic::Ordering::Acquire) as *mut c_void;
    if exports.is_null() || vendor.is_null() {
        return;
    }
    // SAFETY: libEGL's exports table, valid while the library is loaded (glvnd's
    // contract), whose ninth entry is `setLastVendor`.
    if let Some(f) = unsafe { (*exports).set_last_vendor } {
        f(vendor);
    }
}

/// `(name, address)` of each EGL entry point: `NAME => FUNCTION`.
macro_rules! entry_points {
    ($($name:ident => $f:path,)*) => {
        vec![$((stringify!($name), $f as *const () as usize)),*]
    };
}

/// Every EGL function the library implements, by name.
fn egl_functions() -> &'static [(&'static str, usize)] {
    static T: std::sync::OnceLock<Vec<(&'static str, usize)>> = std::sync::OnceLock::new();
    T.get_or_init(|| {
        entry_points![
            eglGetDisplay => eglGetDisplay,
            eglGetPlatformDisplay => eglGetPlatformDisplay,
            eglInitialize => eglInitialize,
            eglTerminate => eglTerminate,
            eglQueryString => eglQueryString,
            eglGetConfigs => eglGetConfigs,
            eglChooseConfig => eglChooseConfig,
            eglGetConfigAttrib => eglGetConfigAttrib,
            eglCreateContext => eglCreateContext,
            eglDestroyContext => eglDestroyContext,
            eglCreateWindowSurface => eglCreateWindowSurface,
            eglCreatePlatformWindowSurface => eglCreatePlatformWindowSurface,
            eglCreatePlatformWindowSurfaceEXT => eglCreatePlatformWindowSurface,
            eglCreatePbufferSurface => eglCreatePbufferSurface,
            eglCreatePixmapSurface => eglCreatePixmapSurface,
            eglCreatePlatformPixmapSurface => eglCreatePlatformPixmapSurface,
            eglCreatePbufferFromClientBuffer => eglCreatePbufferFromClientBuffer,
            eglDestroySurface => eglDestroySurface,
            eglQuerySurface => eglQuerySurface,
            eglSurfaceAttrib => eglSurfaceAttrib,
            eglMakeCurrent => eglMakeCurrent,
            eglSwapBuffers => eglSwapBuffers,
            eglSwapInterval => eglSwapInterval,
            eglQueryContext => eglQueryContext,
            eglGetError => eglGetError,
            eglBindAPI => eglBindAPI,
            eglQueryAPI => eglQueryAPI,
            eglWaitClient => eglWaitClient,
            eglWaitGL => eglWaitGL,
            eglWaitNative => eglWaitNative,
            eglReleaseThread => eglReleaseThread,
            eglCopyBuffers => eglCopyBuffers,
            eglBindTexImage => eglBindTexImage,
            eglReleaseTexImage => eglReleaseTexImage,
            eglGetCurrentContext => eglGetCurrentContext,
            eglGetProcAddress => eglGetProcAddress,
            eglCreateSync => eglCreateSync,
            eglCreateSyncKHR => eglCreateSyncKHR,
            eglDestroySync => eglDestroySync,
            eglDestroySyncKHR => eglDestroySync,
            eglClientWaitSync => eglClientWaitSync,
            eglClientWaitSyncKHR => eglClientWaitSync,
            eglWaitSync => eglWaitSync,
            eglWaitSyncKHR => eglWaitSync,
            eglGetSyncAttrib => eglGetSyncAttrib,
            eglGetSyncAttribKHR => eglGetSyncAttribKHR,
            eglCreateImageKHR => image::eglCreateImageKHR,
            eglCreateImage => image::eglCreateImage,
            eglDestroyImageKHR => image::eglDestroyImageKHR,
            eglDestroyImage => image::eglDestroyImageKHR,
            eglCreateRegionVIRTSOC => image::eglCreateRegionVIRTSOC,
            eglMapRegionVIRTSOC => image::eglMapRegionVIRTSOC,
            eglUnmapRegionVIRTSOC => image::eglUnmapRegionVIRTSOC,
            eglDestroyRegionVIRTSOC => image::eglDestroyRegionVIRTSOC,
            eglQueryLedgerVIRTSOC => image::eglQueryLedgerVIRTSOC,
            eglDeviceCommandVIRTSOC => device::eglDeviceCommandVIRTSOC,
            eglQueueDeviceCommandVIRTSOC => device::eglQueueDeviceCommandVIRTSOC,
            eglSignalSyncKHR => eglSignalSyncKHR,
            eglGetSyncFenceVIRTSOC => eglGetSyncFenceVIRTSOC,
            eglDeviceWaitSyncVIRTSOC => eglDeviceWaitSyncVIRTSOC,
            eglPresentVIRTSOC => present::eglPresentVIRTSOC,
            eglQueryCounterVIRTSOC => present::eglQueryCounterVIRTSOC,
            eglQueryImportLatencyVIRTSOC => image::eglQueryImportLatencyVIRTSOC,
        ]
    })
}

fn egl_function(name: &str) -> *mut c_void {
    egl_functions()
        .iter()
        .find(|(n, _)| *n == name)
        .map_or(std::ptr::null_mut(), |(_, f)| *f as *mut c_void)
}

/// glvnd's `getProcAddress`: an EGL function of this library, or a GL entry point.
pub extern "C" fn get_proc_address(name: *const c_char) -> *mut c_void {
    let found = std::panic::catch_unwind(|| match name_of(name) {
        Some(n) if n.starts_with("egl") => egl_function(n),
        Some(n) if n.starts_with("gl") => gl_proc_address(name),
        _ => std::ptr::null_mut(),
    });
    found.unwrap_or(std::ptr::null_mut())
}

/// The GL entry point `name` (from the GL half of the library).
fn gl_proc_address(name: *const c_char) -> *mut c_void {
    // SAFETY: a non-null (checked by `name_of`) NUL-terminated name.
    let name = unsafe { std::ffi::CStr::from_ptr(name) };
    crate::gl::proc_address(name).map_or(std::ptr::null_mut(), |p| p as *mut c_void)
}

/// glvnd's `getDispatchAddress`: the extension functions of this library themselves.
pub extern "C" fn get_dispatch_address(name: *const c_char) -> *mut c_void {
    std::panic::catch_unwind(|| match name_of(name) {
        Some(n) if n.starts_with("egl") => egl_function(n),
        _ => std::ptr::null_mut(),
    })
    .unwrap_or(std::ptr::null_mut())
}

/// glvnd's `setDispatchIndex`: nothing to record (see the module doc).
pub extern "C" fn set_dispatch_index(_name: *const c_char, _index: i32) {}
