//! The host's EGL, as the render worker uses it: `libEGL.so.1` loaded at run time, one
//! display on the surfaceless platform (`EGL_PLATFORM_SURFACELESS_MESA`; Mesa's llvmpipe on
//! a machine without a GPU, the GPU's driver elsewhere), OpenGL ES contexts and pbuffer
//! surfaces standing in for the guest's windows and pbuffers.

use std::ffi::{c_char, c_void, CStr};

use libloading::Library;

/// An EGL display, context, surface or config handle.
pub type Handle = *mut c_void;
type EglInt = i32;
type EglBool = u32;

const EGL_PLATFORM_SURFACELESS_MESA: u32 = 0x31DD;
const EGL_OPENGL_ES_API: u32 = 0x30A0;
const EGL_NONE: EglInt = 0x3038;
const EGL_RED_SIZE: EglInt = 0x3024;
const EGL_GREEN_SIZE: EglInt = 0x3023;
const EGL_BLUE_SIZE: EglInt = 0x3022;
const EGL_ALPHA_SIZE: EglInt = 0x3021;
const EGL_DEPTH_SIZE: EglInt = 0x3025;
const EGL_STENCIL_SIZE: EglInt = 0x3026;
const EGL_SURFACE_TYPE: EglInt = 0x3033;
const EGL_PBUFFER_BIT: EglInt = 0x0001;
const EGL_RENDERABLE_TYPE: EglInt = 0x3040;
const EGL_OPENGL_ES2_BIT: EglInt = 0x0004;
const EGL_WIDTH: EglInt = 0x3057;
const EGL_HEIGHT: EglInt = 0x3056;
const EGL_CONTEXT_MAJOR_VERSION: EglInt = 0x3098;
const EGL_EXTENSIONS: EglInt = 0x3055;
const EGL_VENDOR: EglInt = 0x3053;
const EGL_VERSION: EglInt = 0x3054;

/// What went wrong with the host's EGL.
#[derive(Debug, thiserror::Error)]
pub enum EglError {
    /// `libEGL.so.1` or one of its functions could not be loaded.
    #[error("host EGL: {0}")]
    Load(String),
    /// A core GL function is missing (the GL decoder cannot run).
    #[error("host EGL: {0}")]
    Gl(#[from] crate::gl::MissingGlFunction),
    /// An EGL or GL function a part of the worker needs is missing.
    #[error("host EGL/GL has no {0:?}")]
    NoFunction(&'static CStr),
    /// An EGL call failed.
    #[error("host EGL: {call} failed (error {code:#x})")]
    Call {
        /// The call.
        call: &'static str,
        /// `eglGetError` after it.
        code: i32,
    },
}

type GetProcAddress = unsafe extern "C" fn(*const c_char) -> *const c_void;
type GetPlatformDisplay = unsafe extern "C" fn(u32, *mut c_void, *const EglInt) -> Handle;
type Initialize = unsafe extern "C" fn(Handle, *mut EglInt, *mut EglInt) -> EglBool;
type ChooseConfig =
    unsafe extern "C" fn(Handle, *const EglInt, *mut Handle, EglInt, *mut EglInt) -> EglBool;
type CreateContext = unsafe extern "C" fn(Handle, Handle, Handle, *const EglInt) -> Handle;
type CreatePbuffer = unsafe extern "C" fn(Handle, Handle, *const EglInt) -> Handle;
type MakeCurrent = unsafe extern "C" fn(Handle, Handle, Handle, Handle) -> EglBool;
type Destroy = unsafe extern "C" fn(Handle, Handle) -> EglBool;
type BindApi = unsafe extern "C" fn(u32) -> EglBool;
type GetError = unsafe extern "C" fn() -> EglInt;
type QueryString = unsafe extern "C" fn(Handle, EglInt) -> *const c_char;
type Terminate = unsafe extern "C" fn(Handle) -> EglBool;

/// The host display and the EGL functions the worker calls.
pub struct HostEgl {
    _lib: Library,
    display: Handle,
    get_proc: GetProcAddress,
    choose_config: ChooseConfig,
    create_context: CreateContext,
    create_pbuffer: CreatePbuffer,
    make_current: MakeCurrent,
    destroy_context: Destroy,
    destroy_surface: Destroy,
    get_error: GetError,
    terminate: Terminate,
    /// The host's vendor and version, for logs.
    pub description: String,
}

// SAFETY: the worker uses its EGL from one thread only; the handles are plain pointers.
unsafe impl Send for HostEgl {}

fn sym<T: Copy>(lib: &Library, name: &str) -> Result<T, EglError> {
    // SAFETY: every caller names an EGL 1.4/1.5 function whose C signature is `T`.
    unsafe { lib.get::<T>(name.as_bytes()) }
        .map(|s| *s)
        .map_err(|e| EglError::Load(format!("{name}: {e}")))
}

impl HostEgl {
    /// Loads `libEGL.so.1` and initialises the surfaceless display with OpenGL ES bound.
    pub fn open() -> Result<HostEgl, EglError> {
        // SAFETY: loading the system's EGL runs its initialisers, which is what linking
        // against it would do.
        let lib = unsafe { Library::new("libEGL.so.1") }
            .map_err(|e| EglError::Load(format!("libEGL.so.1: {e}")))?;
        let get_proc: GetProcAddress = sym(&lib, "eglGetProcAddress")?;
        let initialize: Initialize = sym(&lib, "eglInitialize")?;
        let bind_api: BindApi = sym(&lib, "eglBindAPI")?;
        let query_string: QueryString = sym(&lib, "eglQueryString")?;
        let get_error: GetError = sym(&lib, "eglGetError")?;
        let name = c"eglGetPlatformDisplayEXT";
        // SAFETY: a NUL-terminated name; the result is null or eglGetPlatformDisplayEXT.
        let p = unsafe { get_proc(name.as_ptr()) };
        if p.is_null() {
            return Err(EglError::Load("no eglGetPlatformDisplayEXT".into()));
        }
        // SAFETY: eglGetPlatformDisplayEXT has this signature (EGL_EXT_platform_base).
        let get_platform_display: GetPlatformDisplay = unsafe { std::mem::transmute(p) };
        // SAFETY: the surfaceless platform takes no native display; no attributes.
        let display = unsafe {
            get_platform_display(
                EGL_PLATFORM_SURFACELESS_MESA,
                std::ptr::null_mut(),
                std::ptr::null(),
            )
        };
        if display.is_null() {
            // SAFETY: no arguments.
            let code = unsafe { get_error() };
            return Err(EglError::Call {
                call: "eglGetPlatformDisplayEXT(surfaceless)",
                code,
            });
        }
        let (mut major, mut minor) = (0, 0);
        // SAFETY: a display from above and two out-parameters.
        if unsafe { initialize(display, &mut major, &mut minor) } == 0 {
            // SAFETY: no arguments.
            let code = unsafe { get_error() };
            return Err(EglError::Call {
                call: "eglInitialize",
                code,
            });
        }
        // SAFETY: a valid API enum.
        if unsafe { bind_api(EGL_OPENGL_ES_API) } == 0 {
            // SAFETY: no arguments.
            let code = unsafe { get_error() };
            return Err(EglError::Call {
                call: "eglBindAPI",
                code,
            });
        }
        let text = |what| {
            // SAFETY: an initialised display and a valid name; the result is a static
            // NUL-terminated string or null.
            let s = unsafe { query_string(display, what) };
            if s.is_null() {
                String::new()
            } else {
                // SAFETY: non-null, NUL-terminated, owned by EGL for the display's life.
                unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
            }
        };
        let description = format!("{} EGL {}", text(EGL_VENDOR), text(EGL_VERSION));
        let _ = text(EGL_EXTENSIONS);
        Ok(HostEgl {
            display,
            get_proc,
            choose_config: sym(&lib, "eglChooseConfig")?,
            create_context: sym(&lib, "eglCreateContext")?,
            create_pbuffer: sym(&lib, "eglCreatePbufferSurface")?,
            make_current: sym(&lib, "eglMakeCurrent")?,
            destroy_context: sym(&lib, "eglDestroyContext")?,
            destroy_surface: sym(&lib, "eglDestroySurface")?,
            get_error,
            terminate: sym(&lib, "eglTerminate")?,
            description,
            _lib: lib,
        })
    }

    fn fail(&self, call: &'static str) -> EglError {
        // SAFETY: no arguments.
        let code = unsafe { (self.get_error)() };
        EglError::Call { call, code }
    }

    /// The address of a GL or EGL function of the host (null when unknown).
    pub fn proc_address(&self, name: &CStr) -> *const c_void {
        // SAFETY: a NUL-terminated name.
        unsafe { (self.get_proc)(name.as_ptr()) }
    }

    /// The host's function `name` as `T` (`None` when the host has none). The callers in
    /// this crate name a GL or EGL function whose C signature is `T`, an `extern "C" fn`
    /// pointer type.
    pub(crate) fn function<T: Copy>(&self, name: &CStr) -> Option<T> {
        assert_eq!(
            std::mem::size_of::<T>(),
            std::mem::size_of::<*const c_void>(),
            "{name:?}: not a function pointer type"
        );
        let p = self.proc_address(name);
        if p.is_null() {
            return None;
        }
        // SAFETY: `p` is the non-null address of the host's function `name`, and `T` is
        // that function's pointer type (this crate's callers' obligation, above; the size
        // is checked).
        Some(unsafe { std::mem::transmute_copy::<*const c_void, T>(&p) })
    }

    /// A host config with these channel sizes that supports pbuffers and ES 2 (the
    /// smallest match EGL sorts first).
    pub fn config(&self, rgba: [u32; 4], depth: u32, stencil: u32) -> Result<Handle, EglError> {
        let attrs = [
            EGL_RED_SIZE,
            rgba[0] as EglInt,
            EGL_GREEN_SIZE,
            rgba[1] as EglInt,
            EGL_BLUE_SIZE,
            rgba[2] as EglInt,
            EGL_ALPHA_SIZE,
            rgba[3] as EglInt,
            EGL_DEPTH_SIZE,
            depth as EglInt,
            EGL_STENCIL_SIZE,
            stencil as EglInt,
            EGL_SURFACE_TYPE,
            EGL_PBUFFER_BIT,
            EGL_RENDERABLE_TYPE,
            EGL_OPENGL_ES2_BIT,
            EGL_NONE,
        ];
        let mut config: Handle = std::ptr::null_mut();
        let mut n = 0;
        // SAFETY: a NONE-terminated attribute list and room for one config.
        let ok =
            unsafe { (self.choose_config)(self.display, attrs.as_ptr(), &mut config, 1, &mut n) };
        if ok == 0 {
            return Err(self.fail("eglChooseConfig"));
        }
        if n < 1 || config.is_null() {
            return Err(EglError::Call {
                call: "eglChooseConfig (no matching config)",
                code: 0x3005,
            });
        }
        Ok(config)
    }

    /// An OpenGL ES `major` context in `config`, sharing with `share` (null: none).
    pub(crate) fn create_context(
        &self,
        config: Handle,
        share: Handle,
        major: u32,
    ) -> Result<Handle, EglError> {
        let attrs = [EGL_CONTEXT_MAJOR_VERSION, major as EglInt, EGL_NONE];
        // SAFETY: a config of this display (or null), a context of it (or null), a
        // NONE-terminated attribute list.
        let c = unsafe { (self.create_context)(self.display, config, share, attrs.as_ptr()) };
        if c.is_null() {
            return Err(self.fail("eglCreateContext"));
        }
        Ok(c)
    }

    /// A pbuffer of `width` x `height` in `config`.
    pub(crate) fn create_pbuffer(
        &self,
        config: Handle,
        width: u32,
        height: u32,
    ) -> Result<Handle, EglError> {
        let attrs = [
            EGL_WIDTH,
            width as EglInt,
            EGL_HEIGHT,
            height as EglInt,
            EGL_NONE,
        ];
        // SAFETY: a config of this display, a NONE-terminated attribute list.
        let s = unsafe { (self.create_pbuffer)(self.display, config, attrs.as_ptr()) };
        if s.is_null() {
            return Err(self.fail("eglCreatePbufferSurface"));
        }
        Ok(s)
    }

    /// Makes `ctx` current with `draw` and `read` (nulls release the current context).
    pub(crate) fn make_current(
        &self,
        draw: Handle,
        read: Handle,
        ctx: Handle,
    ) -> Result<(), EglError> {
        // SAFETY: handles of this display or null.
        if unsafe { (self.make_current)(self.display, draw, read, ctx) } == 0 {
            return Err(self.fail("eglMakeCurrent"));
        }
        Ok(())
    }

    /// Destroys a context (EGL keeps it until it is no longer current).
    /// The display (for the functions callers load themselves, e.g. EGLImages).
    pub(crate) fn display(&self) -> Handle {
        self.display
    }

    pub(crate) fn destroy_context(&self, ctx: Handle) {
        // SAFETY: a context of this display.
        unsafe { (self.destroy_context)(self.display, ctx) };
    }

    /// Destroys a surface (EGL keeps it until it is no longer current).
    pub(crate) fn destroy_surface(&self, surf: Handle) {
        // SAFETY: a surface of this display.
        unsafe { (self.destroy_surface)(self.display, surf) };
    }
}

impl Drop for HostEgl {
    fn drop(&mut self) {
        let null = std::ptr::null_mut();
        // SAFETY: releasing the current context and terminating our own display.
        unsafe {
            (self.make_current)(self.display, null, null, null);
            (self.terminate)(self.display);
        }
    }
}

/// Tests that open the host's EGL take this first: the platform display is one per process,
/// so one test's `eglTerminate` (a [`HostEgl`] dropped) would end another's contexts.
#[cfg(test)]
pub(crate) static HOST_EGL_TESTS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A test's host context: ES `major` on an RGBA8 pbuffer, current on this thread, one test at
/// a time ([`HOST_EGL_TESTS`]); released and destroyed when dropped.
#[cfg(test)]
pub(crate) struct TestContext {
    pub(crate) egl: HostEgl,
    ctx: Handle,
    surf: Handle,
    _one: std::sync::MutexGuard<'static, ()>,
}

#[cfg(test)]
impl TestContext {
    /// The context, or `None` where the host has no EGL or no ES `major` context (said on
    /// stderr; a failure under `VIRTSOC_REQUIRE_ALL`).
    pub(crate) fn open(major: u32, (w, h): (u32, u32)) -> Option<TestContext> {
        let one = virtsoc_sync::LockExt::lock_or_recover(&HOST_EGL_TESTS);
        let skip = |why: &str| {
            assert!(std::env::var_os("VIRTSOC_REQUIRE_ALL").is_none(), "{why}");
            eprintln!("SKIPPED: {why}");
        };
        let Ok(egl) = HostEgl::open() else {
            skip("no host EGL");
            return None;
        };
        let config = egl.config([8, 8, 8, 8], 0, 0).expect("config");
        let Ok(ctx) = egl.create_context(config, std::ptr::null_mut(), major) else {
            skip(&format!("no ES {major} context"));
            return None;
        };
        let surf = egl.create_pbuffer(config, w, h).expect("pbuffer");
        egl.make_current(surf, surf, ctx).expect("current");
        Some(TestContext {
            egl,
            ctx,
            surf,
            _one: one,
        })
    }

    /// The host's GL functions.
    pub(crate) fn gl(&self) -> crate::gl::Gl {
        // SAFETY: the loader answers the host's GL functions by name; a context is current.
        unsafe { crate::gl::Gl::load(|n| self.egl.proc_address(n)) }.expect("host GL")
    }
}

#[cfg(test)]
impl Drop for TestContext {
    fn drop(&mut self) {
        let null = std::ptr::null_mut();
        let _ = self.egl.make_current(null, null, null);
        self.egl.destroy_surface(self.surf);
        self.egl.destroy_context(self.ctx);
    }
}
