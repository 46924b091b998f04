//! EGL surfaces: window (an X11 window gives the size; frames may be shown on the virtsoc
//! display), pbuffer, their queries and attributes, `eglMakeCurrent`, `eglSwapBuffers` and
//! `eglSwapInterval`.

use std::cell::Cell;
use std::ffi::{c_ulong, c_void};

use virtsoc_gles_stream::egl as wire;

use super::api::{
    answer, batch_error, display, guard, lock, pairs, post, put, round_trip, set_error, stream,
    to_egl_error, x_display, EglAttrib, EglBool, EglInt, Handle, NO,
};
use super::consts::*;
use super::state::{from_handle, table, to_handle, Platform, Surface, SurfaceKind, Table};
use super::x11;
use crate::rt;

/// The size of a window surface's window now.
fn window_size(t: &Table, s: &Surface) -> Option<(u32, u32)> {
    let SurfaceKind::Window(win) = s.kind else {
        return None;
    };
    let d = t.displays.get(&s.display)?;
    x11::window_size(x_display(d) as usize, win)
}

fn create_surface(
    t: &mut Table,
    dpy: Handle,
    config: Handle,
    kind: SurfaceKind,
    size: (u32, u32),
) -> Result<Handle, i32> {
    let config = from_handle(config);
    wire::config(config).ok_or(EGL_BAD_CONFIG)?;
    let s = stream(t)?;
    let id = t.next_id();
    let (w, h) = (
        size.0.clamp(1, wire::MAX_SURFACE),
        size.1.clamp(1, wire::MAX_SURFACE),
    );
    let code = round_trip(&s, wire::CREATE_SURFACE, &[id, w, h, config], EGL_BAD_ALLOC)?;
    to_egl_error(code)?;
    t.surfaces.insert(
        id,
        Surface {
            display: from_handle(dpy),
            config,
            kind,
            size: (w, h),
            interval: 1,
        },
    );
    Ok(to_handle(id))
}

fn create_window(dpy: Handle, config: Handle, win: u64) -> Handle {
    guard(NO, || {
        let mut t = table();
        let d = display(&t, dpy)?;
        if d.platform != Platform::X11 {
            return Err(EGL_BAD_NATIVE_WINDOW);
        }
        let size = x11::window_size(x_display(d) as usize, win).ok_or(EGL_BAD_NATIVE_WINDOW)?;
        create_surface(&mut t, dpy, config, SurfaceKind::Window(win), size)
    })
}

/// `eglCreateWindowSurface` (an X11 window id).
pub extern "C" fn eglCreateWindowSurface(
    dpy: Handle,
    config: Handle,
    win: c_ulong,
    _attribs: *const EglInt,
) -> Handle {
    create_window(dpy, config, win)
}

/// `eglCreatePlatformWindowSurface` (a pointer to an X11 window id).
pub extern "C" fn eglCreatePlatformWindowSurface(
    dpy: Handle,
    config: Handle,
    win: *mut c_void,
    _attribs: *const EglAttrib,
) -> Handle {
    if win.is_null() {
        set_error(EGL_BAD_NATIVE_WINDOW);
        return NO;
    }
    // SAFETY: EGL_KHR_platform_x11 passes a pointer to the Window.
    let id = unsafe { *(win as *const c_ulong) };
    create_window(dpy, config, id)
}

/// `eglCreatePbufferSurface`.
pub extern "C" fn eglCreatePbufferSurface(
    dpy: Handle,
    config: Handle,
    attribs: *const EglInt,
) -> Handle {
    guard(NO, || {
        let mut t = table();
        display(&t, dpy)?;
        let (mut w, mut h) = (0i32, 0i32);
        for (a, v) in pairs(attribs) {
            match a {
                EGL_WIDTH => w = v,
                EGL_HEIGHT => h = v,
                EGL_LARGEST_PBUFFER | EGL_TEXTURE_FORMAT | EGL_TEXTURE_TARGET
                | EGL_MIPMAP_TEXTURE | EGL_GL_COLORSPACE | EGL_VG_ALPHA_FORMAT
                | EGL_VG_COLORSPACE => {}
                _ => return Err(EGL_BAD_ATTRIBUTE),
            }
        }
        if w < 0 || h < 0 {
            return Err(EGL_BAD_PARAMETER);
        }
        create_surface(
            &mut t,
            dpy,
            config,
            SurfaceKind::Pbuffer,
            (w as u32, h as u32),
        )
    })
}

/// `eglCreatePixmapSurface`: pixmaps are not supported.
pub extern "C" fn eglCreatePixmapSurface(
    _dpy: Handle,
    _config: Handle,
    _pixmap: c_ulong,
    _attribs: *const EglInt,
) -> Handle {
    set_error(EGL_BAD_NATIVE_PIXMAP);
    NO
}

/// `eglCreatePlatformPixmapSurface`: pixmaps are not supported.
pub extern "C" fn eglCreatePlatformPixmapSurface(
    _dpy: Handle,
    _config: Handle,
    _pixmap: *mut c_void,
    _attribs: *const EglAttrib,
) -> Handle {
    set_error(EGL_BAD_NATIVE_PIXMAP);
    NO
}

/// `eglCreatePbufferFromClientBuffer`: not supported.
pub extern "C" fn eglCreatePbufferFromClientBuffer(
    _dpy: Handle,
    _buftype: u32,
    _buffer: *mut c_void,
    _config: Handle,
    _attribs: *const EglInt,
) -> Handle {
    set_error(EGL_BAD_PARAMETER);
    NO
}

/// `eglDestroySurface`.
pub extern "C" fn eglDestroySurface(dpy: Handle, surf: Handle) -> EglBool {
    guard(EGL_FALSE, || {
        let mut t = table();
        display(&t, dpy)?;
        let id = from_handle(surf);
        t.surfaces.remove(&id).ok_or(EGL_BAD_SURFACE)?;
        if let Some(tr) = &t.transport {
            tr.forget_surface(id);
            super::present::forget_surface(tr.connection(), id);
        }
        let s = stream(&t)?;
        post(&s, wire::DESTROY_SURFACE, &[id]);
        Ok(EGL_TRUE)
    })
}

/// `eglQuerySurface`.
pub extern "C" fn eglQuerySurface(
    dpy: Handle,
    surf: Handle,
    attr: EglInt,
    value: *mut EglInt,
) -> EglBool {
    guard(EGL_FALSE, || {
        let t = table();
        display(&t, dpy)?;
        let s = t.surfaces.get(&from_handle(surf)).ok_or(EGL_BAD_SURFACE)?;
        let v = match attr {
            EGL_WIDTH => s.size.0 as i32,
            EGL_HEIGHT => s.size.1 as i32,
            EGL_CONFIG_ID => s.config as i32,
            EGL_RENDER_BUFFER => match s.kind {
                SurfaceKind::Window(_) => EGL_BACK_BUFFER,
                SurfaceKind::Pbuffer => EGL_BACK_BUFFER,
            },
            EGL_SWAP_BEHAVIOR => EGL_BUFFER_DESTROYED,
            EGL_MULTISAMPLE_RESOLVE => EGL_MULTISAMPLE_RESOLVE_DEFAULT,
            EGL_HORIZONTAL_RESOLUTION | EGL_VERTICAL_RESOLUTION | EGL_PIXEL_ASPECT_RATIO => {
                EGL_UNKNOWN
            }
            EGL_LARGEST_PBUFFER | EGL_MIPMAP_TEXTURE => 0,
            EGL_TEXTURE_FORMAT | EGL_TEXTURE_TARGET => EGL_NO_TEXTURE,
            EGL_GL_COLORSPACE => EGL_GL_COLORSPACE_LINEAR,
            _ => return Err(EGL_BAD_ATTRIBUTE),
        };
        put(value, v);
        Ok(EGL_TRUE)
    })
}

/// `eglSurfaceAttrib`: the defaults are accepted.
pub extern "C" fn eglSurfaceAttrib(
    dpy: Handle,
    surf: Handle,
    attr: EglInt,
    value: EglInt,
) -> EglBool {
    guard(EGL_FALSE, || {
        let t = table();
        display(&t, dpy)?;
        t.surfaces.get(&from_handle(surf)).ok_or(EGL_BAD_SURFACE)?;
        match (attr, value) {
            (EGL_SWAP_BEHAVIOR, EGL_BUFFER_DESTROYED)
            | (EGL_MULTISAMPLE_RESOLVE, EGL_MULTISAMPLE_RESOLVE_DEFAULT)
            | (EGL_MIPMAP_TEXTURE, _) => Ok(EGL_TRUE),
            (EGL_SWAP_BEHAVIOR | EGL_MULTISAMPLE_RESOLVE, _) => Err(EGL_BAD_MATCH),
            _ => Err(EGL_BAD_ATTRIBUTE),
        }
    })
}

/// `eglMakeCurrent`.
pub extern "C" fn eglMakeCurrent(dpy: Handle, draw: Handle, read: Handle, ctx: Handle) -> EglBool {
    guard(EGL_FALSE, || {
        let t = table();
        let (draw, read, ctx) = (from_handle(draw), from_handle(read), from_handle(ctx));
        if ctx == 0 {
            if draw != 0 || read != 0 {
                return Err(EGL_BAD_MATCH);
            }
            if let Some(cur) = rt::current() {
                let mut s = lock(&cur.stream);
                {
                    let enc = s.egl_encoder();
                    enc.packet(wire::MAKE_CURRENT).u32(0).u32(0).u32(0);
                }
                s.switched_to(0);
                let _ = s.flush();
            }
            rt::make_current(None);
            return Ok(EGL_TRUE);
        }
        display(&t, dpy)?;
        let c = t.contexts.get(&ctx).ok_or(EGL_BAD_CONTEXT)?;
        if (draw == 0) != (read == 0) {
            return Err(EGL_BAD_MATCH);
        }
        for s in [draw, read] {
            if s != 0 && !t.surfaces.contains_key(&s) {
                return Err(EGL_BAD_SURFACE);
            }
        }
        let code = {
            let mut s = lock(&c.rt.stream);
            {
                let enc = s.egl_encoder();
                enc.packet(wire::MAKE_CURRENT).u32(ctx).u32(draw).u32(read);
            }
            s.switched_to(ctx);
            let reply = s
                .round_trip()
                .map_err(|e| batch_error(&e, EGL_CONTEXT_LOST))?;
            answer(&reply, wire::MAKE_CURRENT).ok_or(EGL_BAD_ALLOC)?
        };
        to_egl_error(code)?;
        CURRENT_SURFACE.with(|c| c.set(draw));
        rt::make_current(Some(c.rt.clone()));
        Ok(EGL_TRUE)
    })
}

thread_local! {
    /// The draw surface current on this thread (for swap interval).
    static CURRENT_SURFACE: Cell<u32> = const { Cell::new(0) };
}

/// `eglSwapBuffers`: the host flushes the frame; a window's new size is taken at swap.
pub extern "C" fn eglSwapBuffers(dpy: Handle, surf: Handle) -> EglBool {
    guard(EGL_FALSE, || {
        let mut t = table();
        display(&t, dpy)?;
        let id = from_handle(surf);
        let (now, size, window, interval) = {
            let s = t.surfaces.get(&id).ok_or(EGL_BAD_SURFACE)?;
            let window = matches!(s.kind, SurfaceKind::Window(_));
            let now = window_size(&t, s).filter(|&n| n != s.size);
            (now, s.size, window, s.interval)
        };
        let cur = rt::current().ok_or(EGL_BAD_SURFACE)?;
        let mut s = lock(&cur.stream);
        s.encoder(cur.id).packet(wire::SWAP).u32(id);
        if window && present_on_display() {
            // The frame as it is now, before a resize remakes the host surface.
            s.flush().map_err(|e| batch_error(&e, EGL_CONTEXT_LOST))?;
            if let Some(tr) = &t.transport {
                if let Err(e) = tr.present(id, size, interval) {
                    log::info!("virtsoc EGL: presenting: {e}");
                }
            }
        }
        if let Some((w, h)) = now {
            let (w, h) = (w.min(wire::MAX_SURFACE), h.min(wire::MAX_SURFACE));
            s.egl_encoder()
                .packet(wire::RESIZE_SURFACE)
                .u32(id)
                .u32(w)
                .u32(h);
            if let Some(surface) = t.surfaces.get_mut(&id) {
                surface.size = (w, h);
            }
        }
        s.flush().map_err(|e| batch_error(&e, EGL_CONTEXT_LOST))?;
        Ok(EGL_TRUE)
    })
}

/// Whether window surfaces are shown on the daemon's display: by default yes (2-3 ms a
/// 800x600 frame on a 2-core CPU host, three counted copies of its bytes, see docs/gles.md);
/// `VIRTSOC_GLES_PRESENT=0` turns it off.
fn present_on_display() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("VIRTSOC_GLES_PRESENT").map_or(true, |v| v != "0"))
}

/// `eglSwapInterval`: window presents wait for the display's vsync with an interval >= 1
/// (`Transport::present`), not with 0.
pub extern "C" fn eglSwapInterval(dpy: Handle, interval: EglInt) -> EglBool {
    guard(EGL_FALSE, || {
        let mut t = table();
        display(&t, dpy)?;
        let id = CURRENT_SURFACE.with(|c| c.get());
        if let Some(s) = t.surfaces.get_mut(&id) {
            s.interval = interval.clamp(0, 1);
        }
        Ok(EGL_TRUE)
    })
}
