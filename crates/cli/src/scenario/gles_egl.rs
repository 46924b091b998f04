//! The EGL and GLES 2 calls of `virtsoc run gles-video`'s guest, through glvnd's
//! `libEGL.so.1` / `libGLESv2.so.2` and virtsoc's vendor library (`libEGL_virtsoc.so`,
//! selected by `__EGL_VENDOR_LIBRARY_FILENAMES`), as any GLES program would make them: a
//! context on a pbuffer, the video and UI programs, EGLImages of SVM regions, fence syncs
//! and virtsoc's extension calls (`crates/gles-guest/include/EGL/eglext_virtsoc.h`).

use std::ffi::{c_char, c_void, CStr, CString};

use crate::CliError;

type H = *mut c_void;

/// `EGL_SYNC_FENCE_KHR`.
pub const SYNC_FENCE: u32 = 0x30F9;
/// `EGL_SYNC_VIRTSOC_FENCE`.
pub const SYNC_VIRTSOC_FENCE: u32 = 0x7A20;
/// `EGL_VIRTSOC_SYNC_DEVICE`.
pub const SYNC_DEVICE: i32 = 0x7A21;
/// `EGL_FOREVER_KHR`.
pub const FOREVER: u64 = u64::MAX;
/// `EGL_VIRTSOC_FORMAT_*`.
pub const FORMAT_RGBA8: i32 = 0x7A10;
pub const FORMAT_NV12: i32 = 0x7A11;
pub const FORMAT_BLOB: i32 = 0x7A13;
/// GL enums.
pub const TEXTURE_2D: u32 = 0x0DE1;
pub const TEXTURE_EXTERNAL: u32 = 0x8D65;
const EGL_NONE: i32 = 0x3038;

fn fail(what: &str) -> CliError {
    CliError::Usage(format!("gles-video guest: {what}"))
}

/// The entry points, resolved once.
pub struct Egl {
    _egl: libloading::Library,
    _gl: libloading::Library,
    pub dpy: H,
    pub surface: H,
    get_error: extern "C" fn() -> i32,
    create_sync: extern "C" fn(H, u32, *const i32) -> H,
    destroy_sync: extern "C" fn(H, H) -> u32,
    client_wait: extern "C" fn(H, H, i32, u64) -> i32,
    wait_sync: extern "C" fn(H, H, i32) -> i32,
    device_wait: extern "C" fn(H, H, *const c_char) -> u32,
    swap: extern "C" fn(H, H) -> u32,
    present: extern "C" fn(H, H, i32, i32, u64, i32) -> u32,
    create_region: extern "C" fn(H, i32, i32, i32, *mut u64) -> u32,
    map_region: extern "C" fn(H, u64, *mut i32) -> *mut u8,
    unmap_region: extern "C" fn(H, u64) -> u32,
    create_image: extern "C" fn(H, H, u32, H, *const i32) -> H,
    command: extern "C" fn(H, *const c_char, *const c_char, *const u64, *mut u64) -> u32,
    queue: extern "C" fn(H, *const c_char, *const c_char, *const u64) -> u32,
    ledger: extern "C" fn(H, *const c_char, *const c_char, *mut u64, *mut u64) -> u32,
    counter: extern "C" fn(H, *const c_char, *mut u64) -> u32,
    import_latency: extern "C" fn(H, *mut u64, i32, *mut i32) -> u32,
    pub gl: Gl,
}

/// The GLES 2 calls the guest makes.
pub struct Gl {
    pub target_texture: extern "C" fn(u32, H),
    pub create_shader: extern "C" fn(u32) -> u32,
    pub shader_source: extern "C" fn(u32, i32, *const *const c_char, *const i32),
    pub compile_shader: extern "C" fn(u32),
    pub create_program: extern "C" fn() -> u32,
    pub attach_shader: extern "C" fn(u32, u32),
    pub bind_attrib: extern "C" fn(u32, u32, *const c_char),
    pub link_program: extern "C" fn(u32),
    pub get_programiv: extern "C" fn(u32, u32, *mut i32),
    pub use_program: extern "C" fn(u32),
    pub attrib_pointer: extern "C" fn(u32, i32, u32, u8, i32, *const c_void),
    pub enable_attrib: extern "C" fn(u32),
    pub draw_arrays: extern "C" fn(u32, i32, i32),
    pub viewport: extern "C" fn(i32, i32, i32, i32),
    pub gen_textures: extern "C" fn(i32, *mut u32),
    pub bind_texture: extern "C" fn(u32, u32),
    pub tex_parameteri: extern "C" fn(u32, u32, i32),
    pub enable: extern "C" fn(u32),
    pub disable: extern "C" fn(u32),
    pub blend_func: extern "C" fn(u32, u32),
}

/// Symbol `name` of `lib` as `T` (its C type).
fn sym<T: Copy>(lib: &libloading::Library, name: &str) -> Result<T, CliError> {
    // SAFETY: every caller names a function whose C signature, as the EGL/GLES headers
    // declare it, is `T`.
    unsafe { lib.get::<T>(name.as_bytes()) }
        .map(|s| *s)
        .map_err(|e| fail(&format!("{name}: {e}")))
}

/// Entry point `name` through `eglGetProcAddress` as `T`.
fn proc<T: Copy>(get: extern "C" fn(*const c_char) -> H, name: &str) -> Result<T, CliError> {
    let c = CString::new(name).map_err(|_| fail(name))?;
    let p = get(c.as_ptr());
    if p.is_null() || std::mem::size_of::<T>() != std::mem::size_of::<H>() {
        return Err(fail(&format!(
            "no {name} (is libEGL_virtsoc.so the vendor?)"
        )));
    }
    // SAFETY: `T` is the C type of `name` as the EGL headers and eglext_virtsoc.h declare
    // it, and a function pointer of the same size as `p`.
    Ok(unsafe { std::mem::transmute_copy(&p) })
}

fn gl_calls(
    get: extern "C" fn(*const c_char) -> H,
    gl: &libloading::Library,
) -> Result<Gl, CliError> {
    Ok(Gl {
        target_texture: proc(get, "glEGLImageTargetTexture2DOES")?,
        create_shader: sym(gl, "glCreateShader")?,
        shader_source: sym(gl, "glShaderSource")?,
        compile_shader: sym(gl, "glCompileShader")?,
        create_program: sym(gl, "glCreateProgram")?,
        attach_shader: sym(gl, "glAttachShader")?,
        bind_attrib: sym(gl, "glBindAttribLocation")?,
        link_program: sym(gl, "glLinkProgram")?,
        get_programiv: sym(gl, "glGetProgramiv")?,
        use_program: sym(gl, "glUseProgram")?,
        attrib_pointer: sym(gl, "glVertexAttribPointer")?,
        enable_attrib: sym(gl, "glEnableVertexAttribArray")?,
        draw_arrays: sym(gl, "glDrawArrays")?,
        viewport: sym(gl, "glViewport")?,
        gen_textures: sym(gl, "glGenTextures")?,
        bind_texture: sym(gl, "glBindTexture")?,
        tex_parameteri: sym(gl, "glTexParameteri")?,
        enable: sym(gl, "glEnable")?,
        disable: sym(gl, "glDisable")?,
        blend_func: sym(gl, "glBlendFunc")?,
    })
}

impl Egl {
    /// glvnd's libraries with a context current on a `w` x `h` pbuffer.
    pub fn open(w: u32, h: u32) -> Result<Egl, CliError> {
        // SAFETY: loading the system's glvnd libraries (their initialisers are glvnd's).
        let egl = unsafe { libloading::Library::new("libEGL.so.1") }
            .map_err(|e| fail(&format!("libEGL.so.1: {e}")))?;
        // SAFETY: as above.
        let gl = unsafe { libloading::Library::new("libGLESv2.so.2") }
            .map_err(|e| fail(&format!("libGLESv2.so.2: {e}")))?;
        let get: extern "C" fn(*const c_char) -> H = sym(&egl, "eglGetProcAddress")?;
        let platform: extern "C" fn(u32, H, *const isize) -> H =
            sym(&egl, "eglGetPlatformDisplay")?;
        let initialize: extern "C" fn(H, *mut i32, *mut i32) -> u32 = sym(&egl, "eglInitialize")?;
        let choose: extern "C" fn(H, *const i32, *mut H, i32, *mut i32) -> u32 =
            sym(&egl, "eglChooseConfig")?;
        let context: extern "C" fn(H, H, H, *const i32) -> H = sym(&egl, "eglCreateContext")?;
        let pbuffer: extern "C" fn(H, H, *const i32) -> H = sym(&egl, "eglCreatePbufferSurface")?;
        let current: extern "C" fn(H, H, H, H) -> u32 = sym(&egl, "eglMakeCurrent")?;
        let get_error: extern "C" fn() -> i32 = sym(&egl, "eglGetError")?;
        // EGL_PLATFORM_SURFACELESS_MESA: no X server needed.
        let dpy = platform(0x31DD, std::ptr::null_mut(), std::ptr::null());
        let (mut major, mut minor) = (0, 0);
        if dpy.is_null() || initialize(dpy, &mut major, &mut minor) != 1 {
            return Err(fail(&format!("eglInitialize: {:#x}", get_error())));
        }
        let attrs = [
            0x3024, 8, 0x3023, 8, 0x3022, 8, 0x3021, 8, 0x3033, 1, 0x3040, 4, EGL_NONE,
        ];
        let (mut config, mut n): (H, i32) = (std::ptr::null_mut(), 0);
        if choose(dpy, attrs.as_ptr(), &mut config, 1, &mut n) != 1 || n < 1 {
            return Err(fail("no RGBA8 pbuffer config"));
        }
        let ctx = context(
            dpy,
            config,
            std::ptr::null_mut(),
            [0x3098, 2, EGL_NONE].as_ptr(),
        );
        let (wi, hi) = (w as i32, h as i32);
        let surface = pbuffer(dpy, config, [0x3057, wi, 0x3056, hi, EGL_NONE].as_ptr());
        if ctx.is_null() || surface.is_null() || current(dpy, surface, surface, ctx) != 1 {
            return Err(fail(&format!("context: {:#x}", get_error())));
        }
        Ok(Egl {
            dpy,
            surface,
            get_error,
            create_sync: proc(get, "eglCreateSyncKHR")?,
            destroy_sync: proc(get, "eglDestroySyncKHR")?,
            client_wait: proc(get, "eglClientWaitSyncKHR")?,
            wait_sync: proc(get, "eglWaitSyncKHR")?,
            device_wait: proc(get, "eglDeviceWaitSyncVIRTSOC")?,
            swap: sym(&egl, "eglSwapBuffers")?,
            present: proc(get, "eglPresentVIRTSOC")?,
            create_region: proc(get, "eglCreateRegionVIRTSOC")?,
            map_region: proc(get, "eglMapRegionVIRTSOC")?,
            unmap_region: proc(get, "eglUnmapRegionVIRTSOC")?,
            create_image: proc(get, "eglCreateImageKHR")?,
            command: proc(get, "eglDeviceCommandVIRTSOC")?,
            queue: proc(get, "eglQueueDeviceCommandVIRTSOC")?,
            ledger: proc(get, "eglQueryLedgerVIRTSOC")?,
            counter: proc(get, "eglQueryCounterVIRTSOC")?,
            import_latency: proc(get, "eglQueryImportLatencyVIRTSOC")?,
            gl: gl_calls(get, &gl)?,
            _egl: egl,
            _gl: gl,
        })
    }

    fn check(&self, ok: bool, what: &str) -> Result<(), CliError> {
        if ok {
            Ok(())
        } else {
            Err(fail(&format!(
                "{what}: EGL error {:#x}",
                (self.get_error)()
            )))
        }
    }

    /// A sync of `kind` with `attrs` (without the closing `EGL_NONE`).
    pub fn sync(&self, kind: u32, attrs: &[i32]) -> Result<H, CliError> {
        let mut a = attrs.to_vec();
        a.push(EGL_NONE);
        let s = (self.create_sync)(self.dpy, kind, a.as_ptr());
        self.check(!s.is_null(), "eglCreateSyncKHR")?;
        Ok(s)
    }

    /// A sync signaled once device `device`'s queue ran what came before (`SYNC_FENCE`:
    /// the GL's).
    pub fn device_sync(&self, device: i32) -> Result<H, CliError> {
        self.sync(SYNC_VIRTSOC_FENCE, &[SYNC_DEVICE, device])
    }

    /// Waits for `s` on the CPU (the fence page), then destroys it.
    pub fn finish_sync(&self, s: H) -> Result<(), CliError> {
        let r = (self.client_wait)(self.dpy, s, 1, FOREVER);
        self.check(r == 0x30F6, "eglClientWaitSyncKHR")?;
        self.destroy(s);
        Ok(())
    }

    pub fn destroy(&self, s: H) {
        (self.destroy_sync)(self.dpy, s);
    }

    /// The GL queue waits for `s` (the guest does not).
    pub fn gl_wait(&self, s: H) -> Result<(), CliError> {
        self.check((self.wait_sync)(self.dpy, s, 0) == 1, "eglWaitSyncKHR")
    }

    /// Device `device`'s queue waits for `s`.
    pub fn device_wait(&self, s: H, device: &CStr) -> Result<(), CliError> {
        let ok = (self.device_wait)(self.dpy, s, device.as_ptr()) == 1;
        self.check(ok, "eglDeviceWaitSyncVIRTSOC")
    }

    /// `eglSwapBuffers` then the present on the display (module docs of `gles_video`).
    pub fn swap_and_present(
        &self,
        w: u32,
        h: u32,
        capture_ns: u64,
        wait: bool,
    ) -> Result<(), CliError> {
        self.check((self.swap)(self.dpy, self.surface) == 1, "eglSwapBuffers")?;
        let ok = (self.present)(
            self.dpy,
            self.surface,
            w as i32,
            h as i32,
            capture_ns,
            i32::from(wait),
        ) == 1;
        self.check(ok, "eglPresentVIRTSOC")
    }

    pub fn region(&self, format: i32, w: u32, h: u32) -> Result<u64, CliError> {
        let mut r = 0;
        let ok = (self.create_region)(self.dpy, format, w as i32, h as i32, &mut r) == 1;
        self.check(ok, "eglCreateRegionVIRTSOC")?;
        Ok(r)
    }

    /// Writes `bytes` at the start of region `r` from the CPU (a whole-region access).
    pub fn write(
        &self,
        r: u64,
        f: impl FnOnce(&mut [u8], usize),
        len: usize,
    ) -> Result<(), CliError> {
        let mut stride = 0;
        let p = (self.map_region)(self.dpy, r, &mut stride);
        self.check(!p.is_null(), "eglMapRegionVIRTSOC")?;
        // SAFETY: the mapping holds the whole region, at least `len` bytes (each caller
        // sizes `len` from the region it made), until the unmap below.
        let b = unsafe { std::slice::from_raw_parts_mut(p, len) };
        f(b, stride.max(0) as usize);
        self.check(
            (self.unmap_region)(self.dpy, r) == 1,
            "eglUnmapRegionVIRTSOC",
        )
    }

    pub fn image(&self, r: u64) -> Result<H, CliError> {
        let a = [0x7A01, r as u32 as i32, 0x7A02, (r >> 32) as i32, EGL_NONE];
        let i = (self.create_image)(
            self.dpy,
            std::ptr::null_mut(),
            0x7A00,
            std::ptr::null_mut(),
            a.as_ptr(),
        );
        self.check(!i.is_null(), "eglCreateImageKHR")?;
        Ok(i)
    }

    /// An EGLImage of each region of `regions` and a texture of `target` for each (the
    /// images a scene latches in turn).
    pub fn images(&self, regions: &[u64], target: u32) -> Result<(Vec<H>, Vec<u32>), CliError> {
        let mut images = Vec::with_capacity(regions.len());
        let mut textures = Vec::with_capacity(regions.len());
        for &r in regions {
            images.push(self.image(r)?);
            textures.push(self.texture(target));
        }
        Ok((images, textures))
    }

    /// Latches image `image` on texture `texture` of `target` and draws the full-screen
    /// quad with `program`.
    pub fn draw_image(&self, program: u32, target: u32, texture: u32, image: H) {
        let g = &self.gl;
        (g.use_program)(program);
        (g.bind_texture)(target, texture);
        (g.target_texture)(target, image);
        self.quad();
    }

    /// Runs a device command and waits for it (`eglDeviceCommandVIRTSOC`).
    pub fn command(
        &self,
        device: &CStr,
        command: &CStr,
        args: &[u64],
    ) -> Result<[u64; 6], CliError> {
        let mut out = [0u64; 6];
        let ok = (self.command)(
            self.dpy,
            device.as_ptr(),
            command.as_ptr(),
            args.as_ptr(),
            out.as_mut_ptr(),
        ) == 1;
        self.check(ok, &format!("{device:?}::{command:?}"))?;
        Ok(out)
    }

    /// Queues a device command (`eglQueueDeviceCommandVIRTSOC`).
    pub fn queue(&self, device: &CStr, command: &CStr, args: &[u64]) -> Result<(), CliError> {
        let ok = (self.queue)(self.dpy, device.as_ptr(), command.as_ptr(), args.as_ptr()) == 1;
        self.check(ok, &format!("queued {device:?}::{command:?}"))
    }

    /// Copies and bytes from domain `src` to `dst` on the connection's ledger.
    pub fn ledger(&self, src: &str, dst: &str) -> Result<(u64, u64), CliError> {
        let (s, d) = (
            CString::new(src).map_err(|_| fail(src))?,
            CString::new(dst).map_err(|_| fail(dst))?,
        );
        let (mut c, mut b) = (0, 0);
        let ok = (self.ledger)(self.dpy, s.as_ptr(), d.as_ptr(), &mut c, &mut b) == 1;
        self.check(ok, "eglQueryLedgerVIRTSOC")?;
        Ok((c, b))
    }

    pub fn counter(&self, name: &CStr) -> Result<u64, CliError> {
        let mut v = 0;
        self.check(
            (self.counter)(self.dpy, name.as_ptr(), &mut v) == 1,
            "eglQueryCounterVIRTSOC",
        )?;
        Ok(v)
    }

    /// The latches' access latencies (us) since the last call.
    pub fn import_latency_us(&self) -> Result<Vec<f64>, CliError> {
        let mut ns = vec![0u64; 1 << 16];
        let mut n = 0;
        let ok = (self.import_latency)(self.dpy, ns.as_mut_ptr(), ns.len() as i32, &mut n) == 1;
        self.check(ok, "eglQueryImportLatencyVIRTSOC")?;
        ns.truncate(n.max(0) as usize);
        Ok(ns.into_iter().map(|v| v as f64 / 1e3).collect())
    }

    /// A linked program of the full-screen quad's vertex shader and fragment shader `fs`.
    pub fn program(&self, fs: &CStr) -> Result<u32, CliError> {
        let g = &self.gl;
        let shader = |kind: u32, src: &CStr| {
            let s = (g.create_shader)(kind);
            let p = src.as_ptr();
            (g.shader_source)(s, 1, &p, std::ptr::null());
            (g.compile_shader)(s);
            s
        };
        let vs = c"attribute vec2 pos; varying vec2 tc; void main() { tc = vec2(pos.x * 0.5 + 0.5, 0.5 - pos.y * 0.5); gl_Position = vec4(pos, 0.0, 1.0); }";
        let prog = (g.create_program)();
        (g.attach_shader)(prog, shader(0x8B31, vs));
        (g.attach_shader)(prog, shader(0x8B30, fs));
        (g.bind_attrib)(prog, 0, c"pos".as_ptr());
        (g.link_program)(prog);
        let mut linked = 0;
        (g.get_programiv)(prog, 0x8B82, &mut linked);
        if linked != 1 {
            return Err(fail("a program did not link"));
        }
        Ok(prog)
    }

    /// A texture bound to `target`, linear and clamped.
    pub fn texture(&self, target: u32) -> u32 {
        let g = &self.gl;
        let mut t = 0;
        (g.gen_textures)(1, &mut t);
        (g.bind_texture)(target, t);
        for (p, v) in [
            (0x2801, 0x2601),
            (0x2800, 0x2601),
            (0x2802, 0x812F),
            (0x2803, 0x812F),
        ] {
            (g.tex_parameteri)(target, p, v);
        }
        t
    }

    /// Draws the full-screen quad with the program in use.
    pub fn quad(&self) {
        static QUAD: [f32; 8] = [-1.0, -1.0, 1.0, -1.0, -1.0, 1.0, 1.0, 1.0];
        let g = &self.gl;
        (g.attrib_pointer)(0, 2, 0x1406, 0, 0, QUAD.as_ptr().cast());
        (g.enable_attrib)(0);
        (g.draw_arrays)(0x0005, 0, 4);
    }
}
