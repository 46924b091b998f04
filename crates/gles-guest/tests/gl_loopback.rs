//! The guest GL entry points against the host decoder in one process: batches go straight
//! into `virtsoc_render::gl::dispatch` on a Mesa surfaceless EGL context (llvmpipe), and
//! the pictures drawn are read back and checked. Skipped where no EGL driver loads.

use std::ffi::{c_void, CStr};
use std::sync::{Arc, Mutex};

use virtsoc_gles_stream::{egl, Encoder, Reader};
use virtsoc_render::gl::{dispatch, ContextState, Gl, ShareGroup};
use EGL_virtsoc::gl::{proc_address, GlState};
use EGL_virtsoc::rt::{self, Channel, ChannelError, Context, Stream};

type Ptr = *mut c_void;

/// The host side: the decoder and the one context it runs.
struct Loopback {
    gl: Gl,
    cx: Mutex<ContextState>,
}

impl Channel for Loopback {
    fn exec(&self, batch: &[u8], _wait: bool) -> Result<Vec<u8>, ChannelError> {
        let mut reply = Encoder::new();
        let mut cx = self.cx.lock().unwrap();
        let mut r = Reader::new(batch);
        while let Some(p) = r.next_packet() {
            let (op, payload) = p.map_err(|e| ChannelError::Refused(e.to_string()))?;
            if op == egl::SET_CONTEXT {
                continue;
            }
            dispatch(&self.gl, &mut cx, op, payload, &mut reply)
                .map_err(|e| ChannelError::Refused(e.to_string()))?;
        }
        Ok(reply.as_bytes().to_vec())
    }
}

/// A surfaceless GLES context made current on this thread, and `eglGetProcAddress`.
struct HostEgl {
    get_proc: unsafe extern "C" fn(*const std::ffi::c_char) -> *const c_void,
}

fn host_egl() -> Option<HostEgl> {
    std::env::set_var("EGL_PLATFORM", "surfaceless");
    // SAFETY: loading the system's libEGL runs its initialisers, which expect nothing.
    let lib = unsafe { libloading::Library::new("libEGL.so.1") }.ok()?;
    // SAFETY: the EGL 1.5 prototypes of these symbols.
    unsafe {
        let get_display: libloading::Symbol<unsafe extern "C" fn(u32, Ptr, *const isize) -> Ptr> =
            lib.get(b"eglGetPlatformDisplay\0").ok()?;
        let init: libloading::Symbol<unsafe extern "C" fn(Ptr, *mut i32, *mut i32) -> u32> =
            lib.get(b"eglInitialize\0").ok()?;
        let bind_api: libloading::Symbol<unsafe extern "C" fn(u32) -> u32> =
            lib.get(b"eglBindAPI\0").ok()?;
        let choose: libloading::Symbol<
            unsafe extern "C" fn(Ptr, *const i32, *mut Ptr, i32, *mut i32) -> u32,
        > = lib.get(b"eglChooseConfig\0").ok()?;
        let create: libloading::Symbol<unsafe extern "C" fn(Ptr, Ptr, Ptr, *const i32) -> Ptr> =
            lib.get(b"eglCreateContext\0").ok()?;
        let make_current: libloading::Symbol<unsafe extern "C" fn(Ptr, Ptr, Ptr, Ptr) -> u32> =
            lib.get(b"eglMakeCurrent\0").ok()?;
        let get_proc: libloading::Symbol<
            unsafe extern "C" fn(*const std::ffi::c_char) -> *const c_void,
        > = lib.get(b"eglGetProcAddress\0").ok()?;
        let get_proc = *get_proc;
        let dpy = get_display(0x31DD, std::ptr::null_mut(), std::ptr::null());
        if dpy.is_null() || init(dpy, std::ptr::null_mut(), std::ptr::null_mut()) == 0 {
            return None;
        }
        bind_api(0x30A0);
        let attrs = [0x3040, 4, 0x3033, 1, 0x3038]; // RENDERABLE_TYPE ES2, SURFACE_TYPE PBUFFER
        let mut config: Ptr = std::ptr::null_mut();
        let mut n = 0;
        if choose(dpy, attrs.as_ptr(), &mut config, 1, &mut n) == 0 || n < 1 {
            return None;
        }
        let ctx_attrs = [0x3098, 2, 0x3038]; // CONTEXT_CLIENT_VERSION 2
        let ctx = create(dpy, config, std::ptr::null_mut(), ctx_attrs.as_ptr());
        if ctx.is_null() || make_current(dpy, std::ptr::null_mut(), std::ptr::null_mut(), ctx) == 0
        {
            return None;
        }
        // libEGL stays loaded for the process (contexts outlive the test functions).
        std::mem::forget(lib);
        Some(HostEgl { get_proc })
    }
}

/// A guest entry point by name, as glvnd gets it.
fn f<T: Copy>(name: &CStr) -> T {
    let p = proc_address(name).unwrap_or_else(|| panic!("no {name:?}"));
    assert_eq!(
        std::mem::size_of::<T>(),
        std::mem::size_of::<*const c_void>()
    );
    // SAFETY: `T` is the C function type of `name` (each call site names both).
    unsafe { std::mem::transmute_copy(&p) }
}

const VS: &str = "attribute vec4 pos; void main() { gl_Position = pos; }\0";
const FS: &str =
    "precision mediump float; uniform vec4 color; void main() { gl_FragColor = color; }\0";

#[test]
fn triangles_drawn_through_the_stream_read_back() {
    let Some(h) = host_egl() else {
        eprintln!("no surfaceless EGL here: skipped");
        return;
    };
    // SAFETY: eglGetProcAddress answers GL functions of the current context's library.
    let gl = unsafe { Gl::load(|n| (h.get_proc)(n.as_ptr())) }.expect("host GL");
    let share = ShareGroup::new_shared();
    let host = Arc::new(Loopback {
        gl,
        cx: Mutex::new(ContextState::new(share.clone())),
    });
    let stream = Arc::new(Mutex::new(Stream::new(host.clone())));
    rt::make_current(Some(Arc::new(Context {
        id: 1,
        stream,
        gl: Mutex::new(GlState::new(2, None)),
    })));

    type V = unsafe extern "C" fn();
    let gen_framebuffers: unsafe extern "C" fn(i32, *mut u32) = f(c"glGenFramebuffers");
    let gen_renderbuffers: unsafe extern "C" fn(i32, *mut u32) = f(c"glGenRenderbuffers");
    let gen_buffers: unsafe extern "C" fn(i32, *mut u32) = f(c"glGenBuffers");
    let bind_framebuffer: unsafe extern "C" fn(u32, u32) = f(c"glBindFramebuffer");
    let bind_renderbuffer: unsafe extern "C" fn(u32, u32) = f(c"glBindRenderbuffer");
    let bind_buffer: unsafe extern "C" fn(u32, u32) = f(c"glBindBuffer");
    let renderbuffer_storage: unsafe extern "C" fn(u32, u32, i32, i32) =
        f(c"glRenderbufferStorage");
    let framebuffer_renderbuffer: unsafe extern "C" fn(u32, u32, u32, u32) =
        f(c"glFramebufferRenderbuffer");
    let check_status: unsafe extern "C" fn(u32) -> u32 = f(c"glCheckFramebufferStatus");
    let viewport: unsafe extern "C" fn(i32, i32, i32, i32) = f(c"glViewport");
    let clear_color: unsafe extern "C" fn(f32, f32, f32, f32) = f(c"glClearColor");
    let clear: unsafe extern "C" fn(u32) = f(c"glClear");
    let read_pixels: unsafe extern "C" fn(i32, i32, i32, i32, u32, u32, *mut c_void) =
        f(c"glReadPixels");
    let create_shader: unsafe extern "C" fn(u32) -> u32 = f(c"glCreateShader");
    let shader_source: unsafe extern "C" fn(u32, i32, *const *const u8, *const i32) =
        f(c"glShaderSource");
    let compile_shader: unsafe extern "C" fn(u32) = f(c"glCompileShader");
    let get_shaderiv: unsafe extern "C" fn(u32, u32, *mut i32) = f(c"glGetShaderiv");
    let create_program: unsafe extern "C" fn() -> u32 = f(c"glCreateProgram");
    let attach_shader: unsafe extern "C" fn(u32, u32) = f(c"glAttachShader");
    let bind_attrib_location: unsafe extern "C" fn(u32, u32, *const u8) =
        f(c"glBindAttribLocation");
    let link_program: unsafe extern "C" fn(u32) = f(c"glLinkProgram");
    let get_programiv: unsafe extern "C" fn(u32, u32, *mut i32) = f(c"glGetProgramiv");
    let get_program_info_log: unsafe extern "C" fn(u32, i32, *mut i32, *mut u8) =
        f(c"glGetProgramInfoLog");
    let use_program: unsafe extern "C" fn(u32) = f(c"glUseProgram");
    let get_uniform_location: unsafe extern "C" fn(u32, *const u8) -> i32 =
        f(c"glGetUniformLocation");
    let uniform4f: unsafe extern "C" fn(i32, f32, f32, f32, f32) = f(c"glUniform4f");
    let buffer_data: unsafe extern "C" fn(u32, isize, *const c_void, u32) = f(c"glBufferData");
    let vertex_attrib_pointer: unsafe extern "C" fn(u32, i32, u32, u8, i32, *const c_void) =
        f(c"glVertexAttribPointer");
    let enable_attrib: unsafe extern "C" fn(u32) = f(c"glEnableVertexAttribArray");
    let draw_arrays: unsafe extern "C" fn(u32, i32, i32) = f(c"glDrawArrays");
    let draw_elements: unsafe extern "C" fn(u32, i32, u32, *const c_void) = f(c"glDrawElements");
    let get_error: unsafe extern "C" fn() -> u32 = f(c"glGetError");
    let get_string: unsafe extern "C" fn(u32) -> *const u8 = f(c"glGetString");
    let get_integerv: unsafe extern "C" fn(u32, *mut i32) = f(c"glGetIntegerv");
    let tex_image_2d: unsafe extern "C" fn(u32, i32, i32, i32, i32, i32, u32, u32, *const c_void) =
        f(c"glTexImage2D");
    let gen_textures: unsafe extern "C" fn(i32, *mut u32) = f(c"glGenTextures");
    let bind_texture: unsafe extern "C" fn(u32, u32) = f(c"glBindTexture");
    let finish: V = f(c"glFinish");
    let map_buffer: unsafe extern "C" fn(u32, u32) -> *mut c_void = f(c"glMapBufferOES");
    let unmap_buffer: unsafe extern "C" fn(u32) -> u8 = f(c"glUnmapBufferOES");
    let get_active_uniform: unsafe extern "C" fn(
        u32,
        u32,
        i32,
        *mut i32,
        *mut i32,
        *mut u32,
        *mut u8,
    ) = f(c"glGetActiveUniform");
    let get_uniformfv: unsafe extern "C" fn(u32, i32, *mut f32) = f(c"glGetUniformfv");
    let is_buffer: unsafe extern "C" fn(u32) -> u8 = f(c"glIsBuffer");
    let delete_buffers: unsafe extern "C" fn(i32, *const u32) = f(c"glDeleteBuffers");
    assert!(proc_address(c"glNoSuchThing").is_none());

    const W: i32 = 64;
    let pixel = |x: i32, y: i32| -> [u8; 4] {
        let mut px = [0u8; 4];
        // SAFETY: room for one RGBA pixel.
        unsafe { read_pixels(x, y, 1, 1, 0x1908, 0x1401, px.as_mut_ptr().cast()) };
        px
    };

    // SAFETY: the GL contract, followed by every call below (arrays of the sizes given).
    unsafe {
        let v = CStr::from_ptr(get_string(0x1F02).cast()).to_str().unwrap();
        // An ES 2 context on a host whose context is ES 3 is ES 3.0 (3.1 where the host's
        // is 3.1 or newer), as Mesa's would be.
        assert!(
            matches!(
                v,
                "OpenGL ES 2.0 virtsoc" | "OpenGL ES 3.0 virtsoc" | "OpenGL ES 3.1 virtsoc"
            ),
            "{v}"
        );
        let ext = CStr::from_ptr(get_string(0x1F03).cast()).to_str().unwrap();
        assert!(ext.contains("GL_OES_mapbuffer"), "{ext}");
        assert!(!ext.contains("GL_OES_vertex_array_object"), "{ext}");
        let mut max_tex = 0;
        get_integerv(0x0D33, &mut max_tex);
        assert!(max_tex >= 2048, "{max_tex}");

        // An FBO with a colour renderbuffer.
        let (mut fb, mut rb) = (0, 0);
        gen_framebuffers(1, &mut fb);
        gen_renderbuffers(1, &mut rb);
        bind_framebuffer(0x8D40, fb);
        bind_renderbuffer(0x8D41, rb);
        renderbuffer_storage(0x8D41, 0x8058 /* RGBA8_OES */, W, W);
        framebuffer_renderbuffer(0x8D40, 0x8CE0, 0x8D41, rb);
        assert_eq!(check_status(0x8D40), 0x8CD5, "framebuffer complete");
        let mut bound = 0;
        get_integerv(0x8CA6, &mut bound);
        assert_eq!(bound as u32, fb, "the guest's name comes back");
        viewport(0, 0, W, W);

        clear_color(0.0, 0.0, 1.0, 1.0);
        clear(0x4000);
        assert_eq!(pixel(5, 5), [0, 0, 255, 255]);

        // A program.
        let vs = create_shader(0x8B31);
        let fs = create_shader(0x8B30);
        for (s, src) in [(vs, VS), (fs, FS)] {
            let p = src.as_ptr();
            shader_source(s, 1, &p, std::ptr::null());
            compile_shader(s);
            let mut ok = 0;
            get_shaderiv(s, 0x8B81, &mut ok);
            assert_eq!(ok, 1, "compiled");
        }
        let prog = create_program();
        attach_shader(prog, vs);
        attach_shader(prog, fs);
        bind_attrib_location(prog, 0, c"pos".as_ptr().cast());
        link_program(prog);
        let mut ok = 0;
        get_programiv(prog, 0x8B82, &mut ok);
        let mut log = [0u8; 256];
        let mut len = 0;
        get_program_info_log(prog, 256, &mut len, log.as_mut_ptr());
        assert_eq!(
            ok,
            1,
            "linked: {:?}",
            String::from_utf8_lossy(&log[..len.max(0) as usize])
        );
        use_program(prog);
        let color = get_uniform_location(prog, c"color".as_ptr().cast());
        assert!(color >= 0);

        // Left half from a VBO: red.
        let left: [f32; 6] = [-1.0, -1.0, 0.0, -1.0, -1.0, 1.0];
        let mut vbo = 0;
        gen_buffers(1, &mut vbo);
        bind_buffer(0x8892, vbo);
        buffer_data(0x8892, 24, left.as_ptr().cast(), 0x88E4);
        vertex_attrib_pointer(0, 2, 0x1406, 0, 0, std::ptr::null());
        enable_attrib(0);
        uniform4f(color, 1.0, 0.0, 0.0, 1.0);
        draw_arrays(0x0004, 0, 3);
        assert_eq!(pixel(2, 2), [255, 0, 0, 255]);
        assert_eq!(pixel(W - 3, W - 3), [0, 0, 255, 255]);

        // Right half from client memory, vertices 2..5 of a larger array: green.
        bind_buffer(0x8892, 0);
        // Interleaved with a third float the draw does not use (stride 12).
        let right: [f32; 15] = [
            9.0, 9.0, 0.0, 9.0, 9.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 1.0, -1.0, 0.0,
        ];
        vertex_attrib_pointer(0, 2, 0x1406, 0, 12, right.as_ptr().cast());
        uniform4f(color, 0.0, 1.0, 0.0, 1.0);
        draw_arrays(0x0004, 2, 3);
        assert_eq!(pixel(W - 3, W - 3), [0, 255, 0, 255]);
        assert_eq!(pixel(2, 2), [255, 0, 0, 255]);

        // Client indices into client vertices: the whole square, white.
        let square: [f32; 8] = [-1.0, -1.0, 1.0, -1.0, 1.0, 1.0, -1.0, 1.0];
        let idx: [u16; 6] = [0, 1, 2, 0, 2, 3];
        vertex_attrib_pointer(0, 2, 0x1406, 0, 0, square.as_ptr().cast());
        uniform4f(color, 1.0, 1.0, 1.0, 1.0);
        draw_elements(0x0004, 6, 0x1403, idx.as_ptr().cast());
        assert_eq!(pixel(2, 2), [255, 255, 255, 255]);
        assert_eq!(pixel(W - 3, W - 3), [255, 255, 255, 255]);

        // An element buffer with client vertices (the guest's copy of the indices), then
        // with a VBO: grey, then yellow.
        let mut ebo = 0;
        gen_buffers(1, &mut ebo);
        bind_buffer(0x8893, ebo);
        buffer_data(0x8893, 12, idx.as_ptr().cast(), 0x88E4);
        uniform4f(color, 0.5, 0.5, 0.5, 1.0);
        draw_elements(0x0004, 6, 0x1403, std::ptr::null());
        let g = pixel(W / 2, W / 2);
        assert!(g[0] > 100 && g[0] < 150 && g[0] == g[2], "{g:?}");
        bind_buffer(0x8892, vbo);
        buffer_data(0x8892, 32, square.as_ptr().cast(), 0x88E4);
        vertex_attrib_pointer(0, 2, 0x1406, 0, 0, std::ptr::null());
        uniform4f(color, 1.0, 1.0, 0.0, 1.0);
        draw_elements(0x0004, 6, 0x1403, std::ptr::null());
        assert_eq!(pixel(W / 2, W / 2), [255, 255, 0, 255]);

        // Mapped: the right half of the square moves left of the middle (one vertex
        // changed), magenta; only the changed bytes travel.
        let p = map_buffer(0x8892, 0x88B9).cast::<f32>();
        assert!(!p.is_null());
        assert_eq!(
            *p.add(2),
            1.0,
            "the mapping starts from the buffer's contents"
        );
        *p.add(2) = -0.5;
        *p.add(4) = -0.5;
        assert_eq!(unmap_buffer(0x8892), 1);
        clear(0x4000);
        uniform4f(color, 1.0, 0.0, 1.0, 1.0);
        draw_elements(0x0004, 6, 0x1403, std::ptr::null());
        assert_eq!(pixel(2, W / 2), [255, 0, 255, 255]);
        assert_eq!(pixel(W - 3, W / 2), [0, 0, 255, 255]);

        // Queries with output arrays.
        let (mut len, mut size, mut ty) = (0, 0, 0);
        let mut name = [0u8; 16];
        get_active_uniform(prog, 0, 16, &mut len, &mut size, &mut ty, name.as_mut_ptr());
        assert_eq!(
            (&name[..len as usize], size, ty),
            (&b"color"[..], 1, 0x8B52)
        );
        let mut cv = [0f32; 5];
        get_uniformfv(prog, color, cv.as_mut_ptr());
        assert_eq!(cv, [1.0, 0.0, 1.0, 1.0, 0.0], "four values, no more");
        assert_eq!(is_buffer(vbo), 1);
        assert_eq!(is_buffer(12345), 0);
        delete_buffers(1, &vbo);
        assert_eq!(is_buffer(vbo), 0);
        assert_eq!(get_error(), 0);
        bind_framebuffer(0x8D40, fb);
        framebuffer_renderbuffer(0x8D40, 0x8CE0, 0x8D41, 777);
        assert_eq!(
            get_error(),
            0x0502,
            "an unknown renderbuffer never reaches the driver"
        );

        // A texture upload of 3x3 RGB (rows padded to 4 bytes), then one too short: refused.
        let mut tex = 0;
        gen_textures(1, &mut tex);
        bind_texture(0x0DE1, tex);
        let img = [7u8; 33];
        tex_image_2d(
            0x0DE1,
            0,
            0x1907,
            3,
            3,
            0,
            0x1907,
            0x1401,
            img.as_ptr().cast(),
        );
        assert_eq!(get_error(), 0);
        finish();
        assert!(share.lock().unwrap().bytes() >= 27 + 32);
        // The host refuses what the guest's own check would have let through.
        let mut cx = host.cx.lock().unwrap();
        let mut e = Encoder::new();
        e.packet(virtsoc_gles_stream::gl_ops::glTexImage2D)
            .u32(0x0DE1)
            .i32(0)
            .i32(0x1907)
            .i32(3)
            .i32(3)
            .i32(0)
            .u32(0x1907)
            .u32(0x1401)
            .u32(0) // the pixels travel in the packet (1: an offset into an unpack buffer)
            .bytes(&img[..30]);
        let (op, payload) = Reader::new(e.as_bytes()).next_packet().unwrap().unwrap();
        dispatch(&host.gl, &mut cx, op, payload, &mut Encoder::new()).unwrap();
        assert_eq!(cx.take_error(), 0x0501);
        // GLES 3 pixel store and buffer targets are taken; a read into a pack buffer too
        // small for the pixels (rows of 100 pixels) is refused.
        use virtsoc_gles_stream::gl_ops as o;
        let mut e = Encoder::new();
        e.packet(o::glPixelStorei).u32(0x0D02).i32(100);
        e.packet(o::glBindBuffer).u32(0x88EB).u32(999);
        e.packet(o::glReadPixels)
            .i32(0)
            .i32(0)
            .i32(2)
            .i32(2)
            .u32(0x1908)
            .u32(0x1401)
            .u32(1)
            .u64(0);
        e.packet(o::glBindBuffer).u32(0x88EB).u32(0);
        e.packet(o::glPixelStorei).u32(0x0D02).i32(0);
        let mut r = Reader::new(e.as_bytes());
        while let Some(Ok((op, payload))) = r.next_packet() {
            dispatch(&host.gl, &mut cx, op, payload, &mut Encoder::new()).unwrap();
        }
        assert_eq!(cx.take_error(), 0x0502);
        assert_eq!(cx.take_error(), 0);
        // The decoder's own checks (not the driver's): an unpack offset into an empty
        // buffer, bytes sent while an unpack buffer is bound, an unknown sync name.
        let before = cx.refused();
        let mut e = Encoder::new();
        e.packet(o::glBindBuffer).u32(0x88EC).u32(998);
        let sub = |e: &mut Encoder, kind: u32| {
            let mut p = e.packet(o::glTexSubImage2D);
            p.u32(0x0DE1)
                .i32(0)
                .i32(0)
                .i32(0)
                .i32(1)
                .i32(1)
                .u32(0x1908)
                .u32(0x1401);
            if kind == 1 {
                p.u32(1).u64(0);
            } else {
                p.u32(0).bytes(&[1, 2, 3, 4]);
            }
        };
        sub(&mut e, 1);
        sub(&mut e, 0);
        e.packet(o::glBindBuffer).u32(0x88EC).u32(0);
        e.packet(o::glClientWaitSync).u32(77).u32(0).u64(0);
        let mut reply = Encoder::new();
        let mut r = Reader::new(e.as_bytes());
        while let Some(Ok((op, payload))) = r.next_packet() {
            dispatch(&host.gl, &mut cx, op, payload, &mut reply).unwrap();
        }
        assert_eq!(cx.refused(), before + 3);
        assert_eq!(cx.take_error(), 0x0502);
        assert_eq!(cx.take_error(), 0x0501);
        let mut a = Reader::new(reply.as_bytes());
        let (op, mut payload) = a.next_packet().unwrap().unwrap();
        assert_eq!((op, payload.u32().unwrap()), (o::glClientWaitSync, 0x911D));
        drop(cx);
        assert_eq!(get_error(), 0);
    }
    rt::make_current(None);
}

/// Packets of every GL opcode with arbitrary payloads (small and hostile values, short
/// and long) go straight to the decoder: it answers errors, never panics or crashes.
#[test]
fn the_decoder_survives_arbitrary_packets() {
    let Some(h) = host_egl() else {
        eprintln!("no surfaceless EGL here: skipped");
        return;
    };
    // SAFETY: eglGetProcAddress answers GL functions of the current context's library.
    let gl = unsafe { Gl::load(|n| (h.get_proc)(n.as_ptr())) }.expect("host GL");
    let mut cx = ContextState::new(ShareGroup::new_shared());
    const VALUES: [u32; 16] = [
        0,
        1,
        2,
        3,
        4,
        7,
        16,
        0xFFFF_FFFF,
        0x7FFF_FFFF,
        0x8000_0000,
        0x8892,
        0x8893,
        0x1406,
        0x0DE1,
        0x1908,
        0x1401,
    ];
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut answered = 0;
    for round in 0..150 {
        for op in 1..=virtsoc_gles_stream::gl_ops::COUNT {
            let words = (next() % 14) as usize;
            let mut e = Encoder::new();
            {
                let mut p = e.packet(op);
                for _ in 0..words {
                    let r = next();
                    let v = if r % 5 == 0 {
                        (r >> 32) as u32
                    } else {
                        VALUES[(r >> 8) as usize % VALUES.len()]
                    };
                    p.u32(v);
                }
            }
            let (op, payload) = Reader::new(e.as_bytes()).next_packet().unwrap().unwrap();
            let mut reply = Encoder::new();
            // A short payload is a stream error; anything else runs or records a GL error.
            let _ = dispatch(&gl, &mut cx, op, payload, &mut reply);
            answered += usize::from(!reply.is_empty());
            let _ = cx.take_error();
        }
        if round % 50 == 0 {
            // SAFETY: a current context.
            unsafe { (gl.glFinish)() };
        }
    }
    assert!(answered > 0);
    // SAFETY: the context is current.
    unsafe { cx.release(&gl) };
}
