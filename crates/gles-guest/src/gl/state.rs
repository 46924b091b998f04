//! The guest-side GL state of a context ([`GlState`]) and of its share group: names made
//! in the guest, bindings, pixel store, vertex attributes, cached limits and strings, the
//! guest's own recorded errors, and the element buffers' contents (client-array draws with
//! an element buffer need the indices).

use std::collections::HashMap;
use std::ffi::CString;
use std::sync::{Arc, Mutex, MutexGuard};
use virtsoc_sync::LockExt;

pub use virtsoc_gles_stream::Kind;

/// The share group's name counter of `kind`: programs and shaders share one namespace.
fn counter(kind: Kind) -> usize {
    match kind {
        Kind::Buffer => 0,
        Kind::Texture => 1,
        Kind::Framebuffer => 2,
        Kind::Renderbuffer => 3,
        Kind::Program | Kind::Shader => 4,
        Kind::Query => 5,
        Kind::Sampler => 6,
        Kind::VertexArray => 7,
        Kind::TransformFeedback => 8,
        Kind::ProgramPipeline => 9,
    }
}

/// Most bytes of a buffer the guest keeps a copy of.
const MAX_SHADOW: usize = 64 << 20;

/// What the guest knows of a buffer object.
#[derive(Debug, Default)]
pub(crate) struct BufferInfo {
    /// Its size (`glBufferData`).
    pub size: usize,
    /// Its contents (up to [`MAX_SHADOW`] bytes): the indices of client-array draws with
    /// an element buffer, what a mapping starts from.
    pub shadow: Option<Vec<u8>>,
    /// Guest memory standing for it while mapped (`glMapBufferOES`).
    pub mapped: Option<Vec<u8>>,
}

/// The state contexts sharing objects share.
#[derive(Debug, Default)]
pub(crate) struct Shared {
    next: [u32; 10],
    pub buffers: HashMap<u32, BufferInfo>,
    /// GLES 3 objects of the share group: syncs, buffer range mappings (`gl::es3`).
    pub es3: super::es3::SharedEs3,
}

/// One vertex attribute as `glVertexAttribPointer` left it.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Attrib {
    pub enabled: bool,
    pub size: i32,
    pub ty: u32,
    pub normalized: bool,
    pub stride: i32,
    /// The pointer (client memory) or the offset (with `buffer`).
    pub ptr: usize,
    /// The buffer bound when the pointer was set (0: client memory).
    pub buffer: u32,
    /// Set by `glVertexAttribIPointer` (GLES 3).
    pub integer: bool,
    /// `glVertexAttribDivisor` (GLES 3): 0 per vertex, else per `divisor` instances.
    pub divisor: u32,
    /// Its format was set by `glVertexAttribFormat` (GLES 3.1): it reads a vertex buffer
    /// binding, never client memory (until `glVertexAttribPointer` again).
    pub bound: bool,
}

/// Vertex attributes the guest tracks (GLES 2.0 drivers have 16 to 32).
pub(crate) const MAX_ATTRIBS: usize = 32;

/// Guest-side GL state of one context.
#[derive(Debug)]
pub struct GlState {
    client_version: u32,
    share: Arc<Mutex<Shared>>,
    errors: Vec<u32>,
    pub(crate) unpack_alignment: i64,
    pub(crate) pack_alignment: i64,
    pub(crate) array_buffer: u32,
    pub(crate) element_buffer: u32,
    pub(crate) attribs: [Attrib; MAX_ATTRIBS],
    /// `glGetIntegerv` answers of constant queries, fetched once.
    pub(crate) ints: HashMap<u32, Vec<i32>>,
    /// `glGetString` answers, fetched once (the pointers handed out stay valid).
    pub(crate) strings: HashMap<u32, CString>,
    /// GLES 3 state: pixel store, buffer targets, vertex array objects (`gl::es3`).
    pub(crate) es3: super::es3::Es3State,
}

impl Default for GlState {
    fn default() -> Self {
        GlState::new(2, None)
    }
}

impl GlState {
    /// The state of a new context of GLES `client_version` (2), sharing objects with
    /// `share`'s context when given.
    pub fn new(client_version: u32, share: Option<&GlState>) -> GlState {
        GlState {
            client_version,
            share: share.map(|s| s.share.clone()).unwrap_or_default(),
            errors: Vec::new(),
            unpack_alignment: 4,
            pack_alignment: 4,
            array_buffer: 0,
            element_buffer: 0,
            attribs: [Attrib::default(); MAX_ATTRIBS],
            ints: HashMap::new(),
            strings: HashMap::new(),
            es3: Default::default(),
        }
    }

    /// The GLES version the context was made for.
    pub fn client_version(&self) -> u32 {
        self.client_version
    }

    /// The share group's state, locked.
    pub(crate) fn shared(&self) -> MutexGuard<'_, Shared> {
        self.share.lock_or_recover()
    }

    /// Records an error found by the guest's own checks (`glGetError` returns it first).
    pub fn error(&mut self, e: u32) {
        if !self.errors.contains(&e) && self.errors.len() < 8 {
            self.errors.push(e);
        }
    }

    /// The oldest error the guest recorded, cleared.
    pub(crate) fn take_error(&mut self) -> Option<u32> {
        (!self.errors.is_empty()).then(|| self.errors.remove(0))
    }

    /// `n` new names of `kind` from the share group's counter.
    pub(crate) fn new_names(&mut self, kind: Kind, n: usize) -> Vec<u32> {
        let mut s = self.shared();
        let c = &mut s.next[counter(kind)];
        (0..n)
            .map(|_| {
                *c = c.wrapping_add(1).max(1);
                *c
            })
            .collect()
    }

    /// Names of `kind` deleted: bindings to them are undone as GL does.
    pub(crate) fn deleted(&mut self, kind: Kind, names: &[u32]) {
        super::es3::deleted(self, kind, names);
        if kind != Kind::Buffer {
            return;
        }
        for &n in names.iter().filter(|n| **n != 0) {
            self.shared().buffers.remove(&n);
            if self.array_buffer == n {
                self.array_buffer = 0;
            }
            if self.element_buffer == n {
                self.element_buffer = 0;
            }
            for a in self.attribs.iter_mut().filter(|a| a.buffer == n) {
                a.buffer = 0;
                a.ptr = 0;
            }
        }
    }

    /// The buffer bound to `target` (`GL_ARRAY_BUFFER`/`GL_ELEMENT_ARRAY_BUFFER`).
    pub(crate) fn bound_buffer(&self, target: u32) -> Option<u32> {
        match target {
            super::GL_ARRAY_BUFFER => Some(self.array_buffer),
            super::GL_ELEMENT_ARRAY_BUFFER => Some(self.element_buffer),
            _ => self.es3.bound_buffer(target),
        }
    }

    /// A buffer's new contents (`glBufferData`).
    pub(crate) fn buffer_data(&mut self, target: u32, size: usize, data: Option<&[u8]>) {
        let Some(b) = self.bound_buffer(target).filter(|b| *b != 0) else {
            return;
        };
        let keep = size <= MAX_SHADOW;
        let mut s = self.shared();
        let info = s.buffers.entry(b).or_default();
        info.size = size;
        info.shadow = keep.then(|| match data {
            Some(d) => d[..size.min(d.len())].to_vec(),
            None => vec![0; size],
        });
    }

    /// Part of a buffer's contents (`glBufferSubData`).
    pub(crate) fn buffer_sub_data(&mut self, target: u32, offset: usize, data: &[u8]) {
        let Some(b) = self.bound_buffer(target).filter(|b| *b != 0) else {
            return;
        };
        let mut s = self.shared();
        if let Some(sh) = s.buffers.get_mut(&b).and_then(|i| i.shadow.as_mut()) {
            if let Some(dst) = offset
                .checked_add(data.len())
                .and_then(|end| sh.get_mut(offset..end))
            {
                dst.copy_from_slice(data);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_contexts_share_names_and_buffers() {
        let mut a = GlState::new(2, None);
        let mut b = GlState::new(2, Some(&a));
        let mut c = GlState::new(2, None);
        assert_eq!(a.new_names(Kind::Buffer, 2), [1, 2]);
        assert_eq!(b.new_names(Kind::Buffer, 1), [3]);
        assert_eq!(c.new_names(Kind::Buffer, 1), [1]);
        // Programs and shaders share one namespace.
        assert_eq!(a.new_names(Kind::Program, 1), [1]);
        assert_eq!(b.new_names(Kind::Shader, 1), [2]);
        a.element_buffer = 3;
        a.buffer_data(
            super::super::GL_ELEMENT_ARRAY_BUFFER,
            4,
            Some(&[1, 2, 3, 4]),
        );
        a.buffer_sub_data(super::super::GL_ELEMENT_ARRAY_BUFFER, 2, &[9, 9]);
        a.buffer_sub_data(super::super::GL_ELEMENT_ARRAY_BUFFER, 3, &[7, 7]); // past the end
        assert_eq!(
            b.shared().buffers[&3].shadow.as_deref(),
            Some(&[1, 2, 9, 9][..])
        );
        a.attribs[0].buffer = 3;
        a.deleted(Kind::Buffer, &[3]);
        assert_eq!((a.element_buffer, a.attribs[0].buffer), (0, 0));
        assert!(b.shared().buffers.is_empty());
    }

    #[test]
    fn errors_are_kept_once_each_oldest_first() {
        let mut s = GlState::default();
        s.error(0x501);
        s.error(0x500);
        s.error(0x501);
        assert_eq!(s.take_error(), Some(0x501));
        assert_eq!(s.take_error(), Some(0x500));
        assert_eq!(s.take_error(), None);
    }
}
