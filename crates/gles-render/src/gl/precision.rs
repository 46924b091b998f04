//! Shader precision on the host: the guest's `mediump` and `lowp` computed at `highp` where
//! the host's driver would emulate them (docs/gles.md, "Shader precision").
//!
//! Mesa's llvmpipe and softpipe lower GLSL ES `mediump`/`lowp` floats to fp16, which x86
//! emulates with a conversion around every operation: a fragment shader in `mediump` runs
//! several times slower than the same shader in `highp`. GLSL ES lets an implementation
//! compute at a higher precision than a qualifier asks (GLSL ES 1.00 and 3.00, section
//! 4.5.2), so on such a host the worker rewrites each guest shader's source before it
//! reaches the driver ([`to_highp`]): every `mediump` and `lowp` token becomes `highp`, and
//! the default precisions the language predeclares below `highp` (`int` in fragment
//! shaders, `sampler2D` and `samplerCube` in both stages) are declared `highp`. A real GPU
//! keeps the guest's precisions ([`Precision::Auto`] decides by the host's `GL_RENDERER`);
//! `VIRTSOC_GLES_PRECISION=guest|highp|auto` ([`ENV`]) in the daemon's environment (the
//! workers inherit it) chooses.
//!
//! The rewrite keeps the guest's line numbers (no newline added or removed: compile logs
//! point at the guest's lines), and its columns except after a `lowp` (one more byte) or on
//! the line of the inserted defaults. It skips comments and directives other than
//! `#define` (whose body may carry a qualifier into the code), and puts the defaults before
//! the first token outside every directive and conditional block, so `#version` and the
//! leading `#extension` lines stay first. The result is at most [`bound`] bytes.

use std::borrow::Cow;

use super::Gl;

/// The environment variable choosing the shader precision: `guest`, `highp` or `auto`.
pub const ENV: &str = "VIRTSOC_GLES_PRECISION";

/// The default precisions put in force before the guest's first declaration: those GLSL ES
/// predeclares below `highp` and lets a shader redeclare (`float` has no default in a
/// fragment shader: declaring one would accept a shader the guest's driver refuses).
pub const DEFAULTS: &str =
    "precision highp int;precision highp sampler2D;precision highp samplerCube;";

/// Which precision guest shaders run at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precision {
    /// The guest's qualifiers, as written.
    Guest,
    /// Every float and int at `highp` ([`to_highp`]).
    Highp,
    /// `Highp` when the host's driver emulates `mediump` ([`emulates_mediump`]), else
    /// `Guest`.
    Auto,
}

impl Precision {
    /// The setting named `s` (`guest`, `highp`, `auto`); `None` for anything else.
    pub fn parse(s: &str) -> Option<Precision> {
        match s.trim() {
            "guest" => Some(Precision::Guest),
            "highp" => Some(Precision::Highp),
            "auto" | "" => Some(Precision::Auto),
            _ => None,
        }
    }

    /// The setting of [`ENV`] in this process's environment; [`Precision::Auto`] when it is
    /// unset or names none (logged).
    pub fn from_env() -> Precision {
        let Ok(v) = std::env::var(ENV) else {
            return Precision::Auto;
        };
        Precision::parse(&v).unwrap_or_else(|| {
            log::warn!("{ENV}={v:?} is not guest, highp or auto: auto");
            Precision::Auto
        })
    }

    /// The setting in force on a host whose `GL_RENDERER` is `renderer`: never `Auto`.
    pub fn resolve(self, renderer: &str) -> Precision {
        match self {
            Precision::Auto if emulates_mediump(renderer) => Precision::Highp,
            Precision::Auto => Precision::Guest,
            p => p,
        }
    }

    /// The setting's name, as [`ENV`] takes it.
    pub fn name(self) -> &'static str {
        match self {
            Precision::Guest => "guest",
            Precision::Highp => "highp",
            Precision::Auto => "auto",
        }
    }
}

/// Whether a driver whose `GL_RENDERER` is `renderer` computes `mediump` in emulated fp16:
/// Mesa's software rasterizers (llvmpipe, softpipe; zink on lavapipe names llvmpipe too).
pub fn emulates_mediump(renderer: &str) -> bool {
    let r = renderer.to_ascii_lowercase();
    r.contains("llvmpipe") || r.contains("softpipe")
}

/// The most bytes [`to_highp`] makes of a source of `len` bytes: a `lowp` grows by one byte
/// and takes at least five with what separates it from the next, and [`DEFAULTS`] goes in
/// once.
pub fn bound(len: usize) -> usize {
    len.saturating_add(len / 5 + 1)
        .saturating_add(DEFAULTS.len())
}

/// The current context's `GL_RENDERER` (empty when GL has none).
pub(crate) fn renderer(gl: &Gl) -> String {
    // SAFETY: a current context; GL answers null or a static NUL-terminated string.
    let s = unsafe { (gl.glGetString)(0x1F01) };
    if s.is_null() {
        return String::new();
    }
    // SAFETY: non-null: a NUL-terminated string GL keeps alive.
    let c = unsafe { std::ffi::CStr::from_ptr(s.cast()) };
    c.to_string_lossy().into_owned()
}

/// What the scanner is in.
#[derive(Clone, Copy, PartialEq)]
enum Directive {
    /// Code.
    None,
    /// A `#define`'s line: its tokens are rewritten like code.
    Define,
    /// Any other directive's line: left as it is.
    Other,
}

fn is_ident_start(b: u8) -> bool {
    b.is_ascii_alphabetic() || b == b'_'
}

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// `src` with every `mediump` and `lowp` token made `highp` and [`DEFAULTS`] before the
/// first declaration (see the module doc); borrowed when nothing changes. A source that is
/// not UTF-8 or not GLSL is rewritten all the same (the driver judges it): only whole
/// identifier tokens outside comments and non-`#define` directives are replaced.
pub fn to_highp(src: &[u8]) -> Cow<'_, [u8]> {
    let mut out: Vec<u8> = Vec::new();
    // Bytes of `src` before `done` are in `out` already.
    let mut done = 0usize;
    let mut changed = false;
    let mut inserted = false;
    let mut dir = Directive::None;
    let mut depth = 0usize;
    // Only whitespace (and comments) so far on this line: a `#` starts a directive.
    let mut line_start = true;
    let mut i = 0usize;
    while i < src.len() {
        let b = src[i];
        match b {
            b'\n' => {
                // A backslash before the newline (or its CR) continues a directive.
                let before = src[..i].strip_suffix(b"\r").unwrap_or(&src[..i]);
                let continued = before.last() == Some(&b'\\');
                if !continued {
                    dir = Directive::None;
                    line_start = true;
                }
                i += 1;
            }
            b'/' if src.get(i + 1) == Some(&b'/') => {
                // A line comment: up to the newline, which the loop sees.
                while i < src.len() && src[i] != b'\n' {
                    i += 1;
                }
            }
            b'/' if src.get(i + 1) == Some(&b'*') => {
                // A block comment (one unclosed runs to the end): a space, to the language.
                i += 2;
                while i < src.len() && !(src[i] == b'*' && src.get(i + 1) == Some(&b'/')) {
                    i += 1;
                }
                i = (i + 2).min(src.len());
            }
            b'#' if line_start && dir == Directive::None => {
                line_start = false;
                let (name, end) = directive_name(src, i + 1);
                match name {
                    b"if" | b"ifdef" | b"ifndef" => depth += 1,
                    b"endif" => depth = depth.saturating_sub(1),
                    _ => {}
                }
                dir = if name == b"define" {
                    Directive::Define
                } else {
                    Directive::Other
                };
                i = end;
            }
            b'"' if dir == Directive::Other => {
                // A string (of `#line`/`#include`-like lines): skipped whole.
                i += 1;
                while i < src.len() && src[i] != b'"' && src[i] != b'\n' {
                    i += 1;
                }
                i = (i + 1).min(src.len());
            }
            _ if b.is_ascii_whitespace() => i += 1,
            _ => {
                line_start = false;
                if dir == Directive::None && depth == 0 && !inserted {
                    inserted = true;
                    out.extend_from_slice(&src[done..i]);
                    out.extend_from_slice(DEFAULTS.as_bytes());
                    done = i;
                    changed = true;
                }
                if is_ident_start(b) {
                    let start = i;
                    while i < src.len() && is_ident(src[i]) {
                        i += 1;
                    }
                    let with: &[u8] = match &src[start..i] {
                        b"mediump" => b"highp  ",
                        b"lowp" => b"highp",
                        _ => continue,
                    };
                    if dir != Directive::Other {
                        out.extend_from_slice(&src[done..start]);
                        out.extend_from_slice(with);
                        done = i;
                        changed = true;
                    }
                } else if b.is_ascii_digit()
                    || (b == b'.' && src.get(i + 1).is_some_and(u8::is_ascii_digit))
                {
                    // A number, suffixes and exponents included: never an identifier.
                    i += 1;
                    while i < src.len() && (is_ident(src[i]) || src[i] == b'.') {
                        i += 1;
                    }
                } else {
                    i += 1;
                }
            }
        }
    }
    if !changed {
        return Cow::Borrowed(src);
    }
    out.extend_from_slice(&src[done..]);
    Cow::Owned(out)
}

/// The name of the directive whose `#` is just before `at`, and where it ends.
fn directive_name(src: &[u8], mut at: usize) -> (&[u8], usize) {
    while at < src.len() && (src[at] == b' ' || src[at] == b'\t') {
        at += 1;
    }
    let start = at;
    while at < src.len() && is_ident(src[at]) {
        at += 1;
    }
    (&src[start..at], at)
}

/// Host hooks (the annotation file's `hhook`): a shader whose source the driver got
/// rewritten answers the guest's own text (`GL_SHADER_SOURCE_LENGTH`, `glGetShaderSource`),
/// as a driver that kept the guest's precisions would.
pub(crate) mod hooks {
    #![allow(non_snake_case)]

    use std::ffi::c_char;

    use super::super::{ContextState, Gl};

    /// `GL_SHADER_SOURCE_LENGTH`.
    const SHADER_SOURCE_LENGTH: u32 = 0x8B88;

    pub(crate) fn glGetShaderiv(
        _gl: &Gl,
        cx: &mut ContextState,
        shader: u32,
        pname: u32,
        params: *mut i32,
    ) {
        if pname != SHADER_SOURCE_LENGTH {
            return;
        }
        let Some(len) = cx.share().guest_source(shader).map(<[u8]>::len) else {
            return;
        };
        // SAFETY: `params` is the decoder's output buffer (one value).
        unsafe { *params = i32::try_from(len + 1).unwrap_or(i32::MAX) };
    }

    pub(crate) fn glGetShaderSource(
        _gl: &Gl,
        cx: &mut ContextState,
        shader: u32,
        buf_size: i32,
        length: *mut i32,
        source: *mut c_char,
    ) {
        let share = cx.share();
        let Some(text) = share.guest_source(shader) else {
            return;
        };
        let room = usize::try_from(buf_size).unwrap_or(0);
        let n = text.len().min(room.saturating_sub(1));
        // SAFETY: the decoder's output buffers: `source` has room for `buf_size` bytes (n
        // and the NUL when `buf_size` > 0), `length` for one value.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr(), source.cast::<u8>(), n);
            if room > 0 {
                *source.add(n) = 0;
            }
            *length = n as i32;
        }
    }
}

#[cfg(test)]
#[path = "precision_tests.rs"]
mod tests;
