//! The vendor library's EGL objects: displays, configs, contexts, surfaces and syncs, in
//! one table per process. Handles given to the program are small integers in pointer
//! form, checked against the table on every call (a stale or foreign handle is an EGL
//! error, never a dereference).

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, MutexGuard};

use virtsoc_gles_stream::egl as wire;

use super::consts::*;
use crate::rt::{Context, Stream};
use virtsoc_sync::LockExt;

/// Where a display's windows live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Platform {
    /// X11: windows are X window ids on `native` (a `Display*`; null: our own connection
    /// to `$DISPLAY`, opened when first needed).
    X11,
    /// No windows (pbuffers and surfaceless contexts only).
    Surfaceless,
}

/// One display.
pub struct Display {
    /// Its platform.
    pub platform: Platform,
    /// The program's native display (`Display*` for X11), or null.
    pub native: usize,
    /// Whether eglInitialize was called (and eglTerminate not since).
    pub initialized: bool,
    /// The X visual configs name as their native visual (0 without X).
    pub visual: i32,
}

/// What a surface stands for in the guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SurfaceKind {
    /// An X window: its id.
    Window(u64),
    /// A pbuffer.
    Pbuffer,
}

/// One surface.
pub struct Surface {
    /// The display it belongs to.
    pub display: u32,
    /// Its config id.
    pub config: u32,
    /// Window or pbuffer.
    pub kind: SurfaceKind,
    /// Its size as the host has it.
    pub size: (u32, u32),
    /// The swap interval last set.
    pub interval: i32,
}

/// One context.
pub struct Ctx {
    /// The display it belongs to.
    pub display: u32,
    /// Its config id (0: EGL_NO_CONFIG_KHR).
    pub config: u32,
    /// The runtime's context (what GL entry points encode for).
    pub rt: Arc<Context>,
}

/// Every EGL object of the process.
#[derive(Default)]
pub struct Table {
    /// Displays by handle.
    pub displays: HashMap<u32, Display>,
    /// Contexts by handle (= the stream's context id).
    pub contexts: HashMap<u32, Ctx>,
    /// Surfaces by handle (= the stream's surface id).
    pub surfaces: HashMap<u32, Surface>,
    /// Fence syncs by handle (signalled when made).
    pub syncs: HashMap<u32, u32>,
    /// The connection's stream, once connected.
    pub stream: Option<Arc<Mutex<Stream>>>,
    /// The stream's transport (for showing window surfaces on the daemon's display).
    pub transport: Option<Arc<crate::transport::Transport>>,
    /// Why connecting failed, if it did.
    pub connect_error: Option<String>,
    next: u32,
}

impl Table {
    /// A fresh handle value (never 0; distinct ranges are not needed: each kind has its
    /// own map).
    pub fn next_id(&mut self) -> u32 {
        self.next = self.next.wrapping_add(1).max(1);
        self.next
    }
}

/// The process's table, locked.
pub fn table() -> MutexGuard<'static, Table> {
    // A poisoned table is taken over: it holds whole objects.
    TABLE.lock_or_recover()
}

static TABLE: std::sync::LazyLock<Mutex<Table>> =
    std::sync::LazyLock::new(|| Mutex::new(Table::default()));

/// A handle in pointer form.
pub fn to_handle(id: u32) -> *mut c_void {
    id as usize as *mut c_void
}

/// The id of a handle (0 for null or one out of range).
pub fn from_handle(h: *mut c_void) -> u32 {
    u32::try_from(h as usize).unwrap_or(0)
}

/// A config's attribute, `None` for an attribute configs do not have.
pub fn config_attrib(id: u32, attr: i32, visual: i32) -> Option<i32> {
    let (_, r, g, b, a, d, s) = wire::config(id)?;
    let (r, g, b, a, d, s) = (r as i32, g as i32, b as i32, a as i32, d as i32, s as i32);
    Some(match attr {
        EGL_BUFFER_SIZE => r + g + b + a,
        EGL_RED_SIZE => r,
        EGL_GREEN_SIZE => g,
        EGL_BLUE_SIZE => b,
        EGL_ALPHA_SIZE => a,
        EGL_DEPTH_SIZE => d,
        EGL_STENCIL_SIZE => s,
        EGL_CONFIG_ID => id as i32,
        EGL_CONFIG_CAVEAT => EGL_NONE,
        EGL_LEVEL => 0,
        EGL_MAX_PBUFFER_WIDTH | EGL_MAX_PBUFFER_HEIGHT => wire::MAX_SURFACE as i32,
        EGL_MAX_PBUFFER_PIXELS => (wire::MAX_SURFACE * wire::MAX_SURFACE) as i32,
        EGL_NATIVE_RENDERABLE => EGL_TRUE as i32,
        EGL_NATIVE_VISUAL_ID => visual,
        EGL_NATIVE_VISUAL_TYPE => X_TRUE_COLOR,
        EGL_SAMPLES | EGL_SAMPLE_BUFFERS => 0,
        EGL_SURFACE_TYPE => EGL_WINDOW_BIT | EGL_PBUFFER_BIT,
        EGL_TRANSPARENT_TYPE => EGL_NONE,
        EGL_TRANSPARENT_RED_VALUE | EGL_TRANSPARENT_GREEN_VALUE | EGL_TRANSPARENT_BLUE_VALUE => 0,
        EGL_BIND_TO_TEXTURE_RGB | EGL_BIND_TO_TEXTURE_RGBA => EGL_FALSE as i32,
        EGL_MIN_SWAP_INTERVAL => 0,
        EGL_MAX_SWAP_INTERVAL => 1,
        EGL_LUMINANCE_SIZE | EGL_ALPHA_MASK_SIZE => 0,
        EGL_COLOR_BUFFER_TYPE => EGL_RGB_BUFFER,
        // ES 2 and (EGL_OPENGL_ES3_BIT_KHR) ES 3: a host without ES 3 refuses the context.
        EGL_RENDERABLE_TYPE | EGL_CONFORMANT => EGL_OPENGL_ES2_BIT | 0x0040,
        _ => return None,
    })
}

/// How a requested attribute value matches a config's.
enum Rule {
    AtLeast,
    Exact,
    Mask,
}

fn rule(attr: i32) -> Option<Rule> {
    Some(match attr {
        EGL_BUFFER_SIZE | EGL_RED_SIZE | EGL_GREEN_SIZE | EGL_BLUE_SIZE | EGL_ALPHA_SIZE
        | EGL_DEPTH_SIZE | EGL_STENCIL_SIZE | EGL_SAMPLES | EGL_SAMPLE_BUFFERS
        | EGL_LUMINANCE_SIZE | EGL_ALPHA_MASK_SIZE => Rule::AtLeast,
        EGL_SURFACE_TYPE | EGL_RENDERABLE_TYPE | EGL_CONFORMANT => Rule::Mask,
        EGL_CONFIG_ID
        | EGL_CONFIG_CAVEAT
        | EGL_LEVEL
        | EGL_NATIVE_RENDERABLE
        | EGL_NATIVE_VISUAL_TYPE
        | EGL_TRANSPARENT_TYPE
        | EGL_TRANSPARENT_RED_VALUE
        | EGL_TRANSPARENT_GREEN_VALUE
        | EGL_TRANSPARENT_BLUE_VALUE
        | EGL_BIND_TO_TEXTURE_RGB
        | EGL_BIND_TO_TEXTURE_RGBA
        | EGL_MIN_SWAP_INTERVAL
        | EGL_MAX_SWAP_INTERVAL
        | EGL_COLOR_BUFFER_TYPE => Rule::Exact,
        EGL_MAX_PBUFFER_WIDTH
        | EGL_MAX_PBUFFER_HEIGHT
        | EGL_MAX_PBUFFER_PIXELS
        | EGL_NATIVE_VISUAL_ID => return None,
        _ => return None,
    })
}

/// The configs matching `attrs` (pairs), sorted as EGL 1.5 §3.4.1.2 sorts them; `Err`
/// with an EGL error for a bad attribute.
pub fn choose(attrs: &[(i32, i32)], visual: i32) -> Result<Vec<u32>, i32> {
    // Defaults: a window-capable RGB config renderable by ES 1 (which all of ours are not:
    // EGL's default RENDERABLE_TYPE is ES 1, but programs asking for nothing get ES 2
    // configs anyway, as Mesa gives them).
    let mut want: Vec<(i32, i32)> = vec![(EGL_SURFACE_TYPE, EGL_WINDOW_BIT)];
    let mut config_id = None;
    for &(a, v) in attrs {
        match a {
            EGL_CONFIG_ID => config_id = Some(v),
            EGL_MATCH_NATIVE_PIXMAP
            | EGL_MAX_PBUFFER_WIDTH
            | EGL_MAX_PBUFFER_HEIGHT
            | EGL_MAX_PBUFFER_PIXELS
            | EGL_NATIVE_VISUAL_ID => {}
            _ if rule(a).is_some() => {
                want.retain(|w| w.0 != a);
                want.push((a, v));
            }
            _ => return Err(EGL_BAD_ATTRIBUTE),
        }
    }
    if let Some(id) = config_id {
        if id != EGL_DONT_CARE {
            return Ok(wire::config(id as u32)
                .map(|c| vec![c.0])
                .unwrap_or_default());
        }
    }
    let mut out: Vec<u32> = wire::CONFIGS
        .iter()
        .map(|c| c.0)
        .filter(|&id| {
            want.iter().all(|&(a, v)| {
                if v == EGL_DONT_CARE {
                    return true;
                }
                let have = config_attrib(id, a, visual).unwrap_or(0);
                match rule(a) {
                    Some(Rule::AtLeast) => have >= v,
                    Some(Rule::Exact) => have == v,
                    Some(Rule::Mask) => have & v == v,
                    None => true,
                }
            })
        })
        .collect();
    let wanted = |a: i32| {
        want.iter()
            .any(|&(x, v)| x == a && v != 0 && v != EGL_DONT_CARE)
    };
    let key = |id: u32| {
        let at = |a| config_attrib(id, a, visual).unwrap_or(0);
        let colour: i32 = [EGL_RED_SIZE, EGL_GREEN_SIZE, EGL_BLUE_SIZE, EGL_ALPHA_SIZE]
            .into_iter()
            .filter(|&a| wanted(a))
            .map(at)
            .sum();
        (
            -colour,
            at(EGL_BUFFER_SIZE),
            at(EGL_DEPTH_SIZE),
            at(EGL_STENCIL_SIZE),
            id,
        )
    };
    out.sort_by_key(|&id| key(id));
    Ok(out)
}

/// The EGL error of a lost stream for a call that needs the host.
pub fn lost_error(stream: &Mutex<Stream>) -> Option<i32> {
    let s = stream.lock_or_recover();
    s.lost().map(|_| EGL_CONTEXT_LOST)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choose_sorts_deeper_colour_first_then_smaller_buffers() {
        let c = choose(
            &[
                (EGL_RED_SIZE, 1),
                (EGL_GREEN_SIZE, 1),
                (EGL_BLUE_SIZE, 1),
                (EGL_DEPTH_SIZE, 1),
                (EGL_RENDERABLE_TYPE, EGL_OPENGL_ES2_BIT),
            ],
            33,
        )
        .unwrap();
        assert!(!c.is_empty());
        let first = wire::config(c[0]).unwrap();
        assert_eq!((first.1, first.2, first.3), (8, 8, 8));
        assert!(first.5 >= 1);
        // An RGB565 request still lists 8-bit configs (at least), deeper ones first.
        let c = choose(&[(EGL_RED_SIZE, 5), (EGL_ALPHA_SIZE, 8)], 0).unwrap();
        assert!(c.iter().all(|&id| wire::config(id).unwrap().4 == 8));
        assert_eq!(choose(&[(0x7777, 1)], 0), Err(EGL_BAD_ATTRIBUTE));
    }
}
