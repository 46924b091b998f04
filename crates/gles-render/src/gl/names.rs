//! Guest names to host names, per share group, and the memory its objects hold.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use virtsoc_gles_stream::Reader;

use super::{ContextState, DecodeResult, Gl, GL_INVALID_VALUE};

pub use virtsoc_gles_stream::{Kind, KINDS};

/// How a decoder treats a name the share group does not know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// A GL error, the call skipped.
    Use,
    /// Made on the host (`glBind*` of a name never generated is allowed in GLES 2.0).
    Bind,
    /// The call answers 0 (`glIs*`).
    Soft,
}

/// The objects of guest contexts that share them: name tables per kind, and the bytes
/// buffers, textures and renderbuffers hold (what the daemon may charge the guest).
#[derive(Debug, Default)]
pub struct ShareGroup {
    maps: [HashMap<u32, u32>; KINDS],
    /// GLES 3 sync objects of the group (`gl::es3obj`).
    pub(crate) syncs: super::es3obj::Syncs,
    buffer_bytes: HashMap<u32, u64>,
    texture_bytes: HashMap<(u32, u32, i32), u64>,
    renderbuffer_bytes: HashMap<u32, u64>,
    /// The guest's text of each host shader whose source the worker rewrote
    /// (`gl::precision`): what the guest reads back.
    guest_sources: HashMap<u32, Vec<u8>>,
}

impl ShareGroup {
    /// A new, empty share group, ready to be given to [`ContextState::new`].
    pub fn new_shared() -> Arc<Mutex<ShareGroup>> {
        Arc::new(Mutex::new(ShareGroup::default()))
    }

    /// The host name of guest name `guest`.
    pub fn get(&self, kind: Kind, guest: u32) -> Option<u32> {
        self.maps[kind as usize].get(&guest).copied()
    }

    /// Records a mapping; returns the host name it replaces.
    pub fn insert(&mut self, kind: Kind, guest: u32, host: u32) -> Option<u32> {
        self.maps[kind as usize].insert(guest, host)
    }

    /// Forgets a guest name; returns its host name.
    pub fn remove(&mut self, kind: Kind, guest: u32) -> Option<u32> {
        let h = self.maps[kind as usize].remove(&guest)?;
        match kind {
            Kind::Buffer => {
                self.buffer_bytes.remove(&h);
            }
            Kind::Texture => self.texture_bytes.retain(|k, _| k.0 != h),
            Kind::Renderbuffer => {
                self.renderbuffer_bytes.remove(&h);
            }
            Kind::Shader => {
                self.guest_sources.remove(&h);
            }
            _ => {}
        }
        Some(h)
    }

    /// The guest name of host name `host` (for queries answering names).
    pub fn guest_of(&self, kind: Kind, host: u32) -> u32 {
        if host == 0 {
            return 0;
        }
        self.maps[kind as usize]
            .iter()
            .find(|(_, h)| **h == host)
            .map(|(g, _)| *g)
            .unwrap_or(0)
    }

    /// Objects of each kind the group holds, in [`Kind`] order.
    pub fn counts(&self) -> [usize; KINDS] {
        let mut c = [0; KINDS];
        for (i, m) in self.maps.iter().enumerate() {
            c[i] = m.len();
        }
        c
    }

    /// Bytes held by the group's buffers, textures (every level and face) and renderbuffers,
    /// as specified (an estimate of the driver's memory), and the guest's texts of rewritten
    /// shaders.
    pub fn bytes(&self) -> u64 {
        self.buffer_bytes.values().sum::<u64>()
            + self.texture_bytes.values().sum::<u64>()
            + self.renderbuffer_bytes.values().sum::<u64>()
            + self
                .guest_sources
                .values()
                .map(|s| s.len() as u64)
                .sum::<u64>()
    }

    /// Keeps the guest's text of host shader `host`, whose source the driver got rewritten
    /// (`None`: the driver has the guest's text).
    pub(crate) fn set_guest_source(&mut self, host: u32, text: Option<Vec<u8>>) {
        match text {
            Some(t) if host != 0 => {
                self.guest_sources.insert(host, t);
            }
            _ => {
                self.guest_sources.remove(&host);
            }
        }
    }

    /// The guest's text of host shader `host` when the driver has a rewritten one.
    pub(crate) fn guest_source(&self, host: u32) -> Option<&[u8]> {
        self.guest_sources.get(&host).map(Vec::as_slice)
    }

    pub(crate) fn set_buffer_bytes(&mut self, host: u32, n: u64) {
        if host != 0 {
            self.buffer_bytes.insert(host, n);
        }
    }

    pub(crate) fn set_texture_bytes(&mut self, host: u32, target: u32, level: i32, n: u64) {
        if host != 0 {
            self.texture_bytes.insert((host, target, level), n);
        }
    }

    pub(crate) fn set_renderbuffer_bytes(&mut self, host: u32, n: u64) {
        if host != 0 {
            self.renderbuffer_bytes.insert(host, n);
        }
    }
}

/// Makes one host object of `kind` (programs and shaders are made by their own calls:
/// 0 for those).
pub(crate) fn host_gen(gl: &Gl, kind: Kind) -> u32 {
    let mut h = 0u32;
    // SAFETY: a current context (dispatch's contract); `h` has room for one name.
    unsafe {
        match kind {
            Kind::Buffer => (gl.glGenBuffers)(1, &mut h),
            Kind::Texture => (gl.glGenTextures)(1, &mut h),
            Kind::Framebuffer => (gl.glGenFramebuffers)(1, &mut h),
            Kind::Renderbuffer => (gl.glGenRenderbuffers)(1, &mut h),
            Kind::Program | Kind::Shader => {}
            Kind::Query
            | Kind::Sampler
            | Kind::VertexArray
            | Kind::TransformFeedback
            | Kind::ProgramPipeline => super::es3::host_gen(gl, kind, &mut h),
        }
    }
    h
}

fn host_delete(gl: &Gl, kind: Kind, names: &[u32]) {
    if names.is_empty() {
        return;
    }
    let n = names.len() as i32;
    // SAFETY: a current context; `names` holds `n` host names.
    unsafe {
        match kind {
            Kind::Buffer => (gl.glDeleteBuffers)(n, names.as_ptr()),
            Kind::Texture => (gl.glDeleteTextures)(n, names.as_ptr()),
            Kind::Framebuffer => (gl.glDeleteFramebuffers)(n, names.as_ptr()),
            Kind::Renderbuffer => (gl.glDeleteRenderbuffers)(n, names.as_ptr()),
            Kind::Program => names.iter().for_each(|h| (gl.glDeleteProgram)(*h)),
            Kind::Shader => names.iter().for_each(|h| (gl.glDeleteShader)(*h)),
            Kind::Query
            | Kind::Sampler
            | Kind::VertexArray
            | Kind::TransformFeedback
            | Kind::ProgramPipeline => super::es3::host_delete(gl, kind, names),
        }
    }
}

/// `n i32 | names bytes`, checked: the names, or `None` after recording the error.
fn read_names(
    cx: &mut ContextState,
    r: &mut Reader<'_>,
) -> Result<Option<Vec<u32>>, virtsoc_gles_stream::StreamError> {
    let n = r.i32()?;
    let b = r.bytes()?;
    let Ok(n) = usize::try_from(n) else {
        cx.error(GL_INVALID_VALUE);
        return Ok(None);
    };
    let b = b.unwrap_or(&[]);
    if b.len() / 4 < n {
        cx.error(GL_INVALID_VALUE);
        return Ok(None);
    }
    Ok(Some(
        b.chunks_exact(4)
            .take(n)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
    ))
}

/// `glGen*`: the guest made the names; the host makes as many and maps them.
pub(crate) fn gen(gl: &Gl, cx: &mut ContextState, kind: Kind, r: &mut Reader<'_>) -> DecodeResult {
    let Some(guest) = read_names(cx, r)? else {
        return Ok(());
    };
    let mut replaced = Vec::new();
    for g in guest.into_iter().filter(|g| *g != 0) {
        let h = host_gen(gl, kind);
        if h == 0 {
            cx.error(super::GL_OUT_OF_MEMORY);
            break;
        }
        replaced.extend(cx.share().insert(kind, g, h));
    }
    host_delete(gl, kind, &replaced);
    Ok(())
}

/// `glDelete*(n, names)`: known names deleted on the host and forgotten; unknown ignored.
pub(crate) fn delete(
    gl: &Gl,
    cx: &mut ContextState,
    kind: Kind,
    r: &mut Reader<'_>,
) -> DecodeResult {
    let Some(guest) = read_names(cx, r)? else {
        return Ok(());
    };
    let host: Vec<u32> = {
        let mut s = cx.share();
        guest.iter().filter_map(|g| s.remove(kind, *g)).collect()
    };
    host_delete(gl, kind, &host);
    Ok(())
}

/// `glDeleteProgram`/`glDeleteShader(name)`.
pub(crate) fn delete1(
    gl: &Gl,
    cx: &mut ContextState,
    kind: Kind,
    r: &mut Reader<'_>,
) -> DecodeResult {
    let g = r.u32()?;
    if g == 0 {
        return Ok(());
    }
    let h = cx.share().remove(kind, g);
    match h {
        Some(h) => host_delete(gl, kind, &[h]),
        None => cx.error(GL_INVALID_VALUE),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_both_ways_and_deletion_frees_their_bytes() {
        let mut s = ShareGroup::default();
        assert_eq!(s.insert(Kind::Buffer, 1, 10), None);
        assert_eq!(s.insert(Kind::Texture, 1, 20), None);
        assert_eq!(s.get(Kind::Buffer, 1), Some(10));
        assert_eq!(s.get(Kind::Renderbuffer, 1), None);
        assert_eq!(s.guest_of(Kind::Texture, 20), 1);
        assert_eq!(s.guest_of(Kind::Texture, 0), 0);
        s.set_buffer_bytes(10, 100);
        s.set_texture_bytes(20, 0x0DE1, 0, 64);
        s.set_texture_bytes(20, 0x0DE1, 1, 16);
        s.set_texture_bytes(20, 0x0DE1, 1, 8); // respecified
        assert_eq!(s.bytes(), 172);
        assert_eq!(s.counts(), [1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(s.remove(Kind::Texture, 1), Some(20));
        assert_eq!(s.bytes(), 100);
        assert_eq!(s.remove(Kind::Buffer, 1), Some(10));
        assert_eq!((s.bytes(), s.remove(Kind::Buffer, 1)), (0, None));
    }
}
