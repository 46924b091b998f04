//! GLES 3.0 state and calls of the guest (1): the pixel store's rows and skips, the buffer
//! targets GLES 3.0 adds (pixel pack/unpack, uniform, transform feedback, copy), vertex
//! array objects (each keeps its own attribute pointers and element buffer: client arrays
//! need them in the guest), `glReadPixels` (a round trip, or an offset into the bound
//! `GL_PIXEL_PACK_BUFFER`), and buffer range mappings (`glMapBufferRange`: guest memory
//! standing for the range, filled by a round trip when mapped for reading, written back as
//! `glBufferSubData` at `glFlushMappedBufferRange` and `glUnmapBuffer`). Payloads: see the
//! host's `gl::es3`.

#![allow(non_snake_case)]

use std::collections::{HashMap, HashSet};
use std::ffi::c_void;

use virtsoc_gles_stream::gl_ops as op;

use super::custom::encode;
use super::state::{Attrib, Kind, MAX_ATTRIBS};
use super::sz::PixelStore;
use super::{rtx, sz, GlState, GL_INVALID_ENUM, GL_INVALID_OPERATION, GL_INVALID_VALUE};
use crate::rt;

/// `GL_PIXEL_PACK_BUFFER`.
pub(crate) const PIXEL_PACK_BUFFER: u32 = 0x88EB;
/// `GL_PIXEL_UNPACK_BUFFER`.
pub(crate) const PIXEL_UNPACK_BUFFER: u32 = 0x88EC;
/// Buffer targets besides `GL_ARRAY_BUFFER`/`GL_ELEMENT_ARRAY_BUFFER`.
const TARGETS: &[u32] = &[
    PIXEL_PACK_BUFFER,
    PIXEL_UNPACK_BUFFER,
    0x8A11, // UNIFORM_BUFFER
    0x8C8E, // TRANSFORM_FEEDBACK_BUFFER
    0x8F36, // COPY_READ_BUFFER
    0x8F37, // COPY_WRITE_BUFFER
    0x8F3F, // DRAW_INDIRECT_BUFFER (GLES 3.1)
    0x90EE, // DISPATCH_INDIRECT_BUFFER
    0x90D2, // SHADER_STORAGE_BUFFER
    0x92C0, // ATOMIC_COUNTER_BUFFER
];

/// What a vertex array object holds that the guest needs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct VaoState {
    attribs: [Attrib; MAX_ATTRIBS],
    element_buffer: u32,
}

impl Default for VaoState {
    fn default() -> Self {
        VaoState {
            attribs: [Attrib::default(); MAX_ATTRIBS],
            element_buffer: 0,
        }
    }
}

/// The GLES 3.0 state of one guest context.
#[derive(Debug, Default)]
pub(crate) struct Es3State {
    /// Unpack rows and skips (the alignment is `GlState::unpack_alignment`).
    pub unpack: PixelStore,
    /// Pack rows and skips (the alignment is `GlState::pack_alignment`).
    pub pack: PixelStore,
    /// Buffers bound to [`TARGETS`].
    targets: HashMap<u32, u32>,
    /// The bound vertex array object (0: the default one).
    pub vao: u32,
    /// The state of the vertex array objects not bound (the bound one's is in `GlState`).
    vaos: HashMap<u32, VaoState>,
    /// `glGetStringi(GL_EXTENSIONS, i)` answers, made once.
    pub ext_strings: Vec<std::ffi::CString>,
    /// Whether the host's context is GLES 3 (asked once: an ES 2 context on an ES 3 host is
    /// ES 3.0, as Mesa gives an ES 2 request its newest compatible version).
    pub host_es3: Option<bool>,
    /// The minor version of the host's GLES 3 context (asked once).
    pub host_minor: Option<u32>,
}

impl Es3State {
    /// The buffer bound to GLES 3.0 buffer `target` (`None`: not such a target).
    pub fn bound_buffer(&self, target: u32) -> Option<u32> {
        TARGETS
            .contains(&target)
            .then(|| self.targets.get(&target).copied().unwrap_or(0))
    }

    /// The bound `GL_PIXEL_UNPACK_BUFFER` (0: none).
    pub fn unpack_buffer(&self) -> u32 {
        self.bound_buffer(PIXEL_UNPACK_BUFFER).unwrap_or(0)
    }

    /// The bound `GL_PIXEL_PACK_BUFFER` (0: none).
    pub fn pack_buffer(&self) -> u32 {
        self.bound_buffer(PIXEL_PACK_BUFFER).unwrap_or(0)
    }
}

/// A buffer range mapped by `glMapBufferRange`.
#[derive(Debug)]
pub(crate) struct Mapping {
    offset: usize,
    access: u32,
    data: Vec<u8>,
}

/// The GLES 3.0 objects of a share group.
#[derive(Debug, Default)]
pub(crate) struct SharedEs3 {
    /// The last sync name made.
    pub next_sync: u32,
    /// Syncs made and not deleted.
    pub syncs: HashSet<u32>,
    /// Buffers mapped with `glMapBufferRange`.
    maps: HashMap<u32, Mapping>,
}

/// `glBindBuffer` of a GLES 3.0 target.
pub(crate) fn bind_buffer(st: &mut GlState, target: u32, buffer: u32) {
    if TARGETS.contains(&target) {
        st.es3.targets.insert(target, buffer);
    }
}

/// `glPixelStorei` of a GLES 3.0 parameter (the alignments are `GlState`'s).
pub(crate) fn pixel_store(st: &mut GlState, pname: u32, param: i32) {
    if sz::is_unpack_param(pname) {
        st.es3.unpack.set(pname, param as i64);
    } else if sz::is_pack_param(pname) {
        st.es3.pack.set(pname, param as i64);
    }
}

/// Names deleted: GLES 3.0 bindings to them undone as GL does.
pub(crate) fn deleted(st: &mut GlState, kind: Kind, names: &[u32]) {
    for &n in names.iter().filter(|n| **n != 0) {
        match kind {
            Kind::Buffer => {
                st.es3.targets.retain(|_, b| *b != n);
                st.shared().es3.maps.remove(&n);
                for v in st.es3.vaos.values_mut() {
                    if v.element_buffer == n {
                        v.element_buffer = 0;
                    }
                    for a in v.attribs.iter_mut().filter(|a| a.buffer == n) {
                        a.buffer = 0;
                        a.ptr = 0;
                    }
                }
            }
            Kind::VertexArray => {
                if st.es3.vao == n {
                    switch_vao(st, 0);
                }
                st.es3.vaos.remove(&n);
            }
            _ => {}
        }
    }
}

/// Makes `vao` the bound vertex array object in the guest's state.
fn switch_vao(st: &mut GlState, vao: u32) {
    let cur = VaoState {
        attribs: st.attribs,
        element_buffer: st.element_buffer,
    };
    st.es3.vaos.insert(st.es3.vao, cur);
    let next = st.es3.vaos.remove(&vao).unwrap_or_default();
    st.attribs = next.attribs;
    st.element_buffer = next.element_buffer;
    st.es3.vao = vao;
}

/// Guest state updated by generated GLES 3.0 entry points before they encode (`ghook`).
pub(crate) mod hooks {
    use super::*;

    /// # Safety
    /// GL's arguments (none is a pointer).
    pub(crate) unsafe fn glBindBufferBase(st: &mut GlState, target: u32, _index: u32, buffer: u32) {
        bind_buffer(st, target, buffer);
    }

    /// # Safety
    /// GL's arguments (none is a pointer).
    pub(crate) unsafe fn glBindBufferRange(
        st: &mut GlState,
        target: u32,
        _index: u32,
        buffer: u32,
        _offset: isize,
        _size: isize,
    ) {
        bind_buffer(st, target, buffer);
    }

    /// # Safety
    /// GL's arguments (none is a pointer).
    pub(crate) unsafe fn glBindVertexArray(st: &mut GlState, array: u32) {
        if array != st.es3.vao {
            switch_vao(st, array);
        }
    }

    /// # Safety
    /// GL's arguments (none is a pointer).
    pub(crate) unsafe fn glVertexAttribDivisor(st: &mut GlState, index: u32, divisor: u32) {
        if let Some(a) = st.attribs.get_mut(index as usize) {
            a.divisor = divisor;
        }
    }
}

/// `glReadPixels`: with a `GL_PIXEL_PACK_BUFFER` bound, `pixels` is an offset into it and
/// the host writes there (no round trip); else a round trip answers the pixels.
///
/// # Safety
/// Without a pack buffer, `pixels` has room for the pixels (pack parameters in force).
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe extern "C" fn glReadPixels(
    x: i32,
    y: i32,
    width: i32,
    height: i32,
    format: u32,
    ty: u32,
    pixels: *mut c_void,
) {
    let Some(ctx) = rt::current() else { return };
    let mut st = ctx.gl();
    let Some(n) = sz::readpixels(&st, width as i64, height as i64, format as i64, ty as i64) else {
        st.error(GL_INVALID_VALUE);
        return;
    };
    let pbo = st.es3.pack_buffer() != 0;
    encode(&ctx, op::glReadPixels, |p| {
        p.i32(x).i32(y).i32(width).i32(height).u32(format).u32(ty);
        if pbo {
            p.u32(1).u64(pixels as usize as u64);
        } else {
            p.u32(0);
        }
    });
    if pbo {
        return;
    }
    let reply = ctx.stream().round_trip();
    let Ok(reply) = reply else { return };
    let Some(mut a) = rtx::answer(&reply, op::glReadPixels) else {
        return;
    };
    if let Ok(Some(b)) = a.bytes() {
        // SAFETY: `pixels` has room for `n` bytes (the GL contract).
        unsafe { rtx::copy_out(pixels.cast(), n, b) };
    }
}

/// The access bits `glMapBufferRange` knows.
const MAP_READ: u32 = 0x1;
const MAP_WRITE: u32 = 0x2;
const MAP_INVALIDATE_RANGE: u32 = 0x4;
const MAP_INVALIDATE_BUFFER: u32 = 0x8;
const MAP_FLUSH_EXPLICIT: u32 = 0x10;
const MAP_UNSYNCHRONIZED: u32 = 0x20;

/// The error `glMapBufferRange`'s access bits make, if any.
fn access_error(access: u32) -> Option<u32> {
    if access & !0x3F != 0 {
        return Some(GL_INVALID_VALUE);
    }
    let read_bad = MAP_INVALIDATE_RANGE | MAP_INVALIDATE_BUFFER | MAP_UNSYNCHRONIZED;
    if access & (MAP_READ | MAP_WRITE) == 0
        || (access & MAP_READ != 0 && access & read_bad != 0)
        || (access & MAP_FLUSH_EXPLICIT != 0 && access & MAP_WRITE == 0)
    {
        return Some(GL_INVALID_OPERATION);
    }
    None
}

/// The range's current bytes from the host (a round trip); `None` when the host refused.
fn read_range(ctx: &rt::Context, target: u32, offset: usize, len: usize) -> Option<Vec<u8>> {
    encode(ctx, op::glMapBufferRange, |p| {
        p.u32(target)
            .u64(offset as u64)
            .u64(len as u64)
            .u32(MAP_READ);
    });
    let reply = ctx.stream().round_trip().ok()?;
    let mut a = rtx::answer(&reply, op::glMapBufferRange)?;
    let b = a.bytes().ok()??;
    (b.len() == len).then(|| b.to_vec())
}

/// `glMapBufferRange`: guest memory standing for the range; its bytes come from the host
/// when mapped for reading (a round trip), else from the guest's copy of the buffer.
pub(crate) unsafe extern "C" fn glMapBufferRange(
    target: u32,
    offset: isize,
    length: isize,
    access: u32,
) -> *mut c_void {
    let null = std::ptr::null_mut();
    let Some(ctx) = rt::current() else {
        return null;
    };
    let mut st = ctx.gl();
    let Some(b) = st.bound_buffer(target) else {
        st.error(GL_INVALID_ENUM);
        return null;
    };
    let (Ok(off), Ok(len)) = (usize::try_from(offset), usize::try_from(length)) else {
        st.error(GL_INVALID_VALUE);
        return null;
    };
    if let Some(e) = access_error(access) {
        st.error(e);
        return null;
    }
    let shadow = {
        let s = st.shared();
        match s.buffers.get(&b) {
            _ if b == 0 => Err(GL_INVALID_OPERATION),
            Some(i) if i.mapped.is_some() || s.es3.maps.contains_key(&b) => {
                Err(GL_INVALID_OPERATION)
            }
            Some(i) if len > 0 && off.checked_add(len).is_some_and(|e| e <= i.size) => Ok(i
                .shadow
                .as_ref()
                .and_then(|sh| sh.get(off..off + len))
                .map(|r| r.to_vec())),
            _ => Err(GL_INVALID_VALUE),
        }
    };
    let shadow = match shadow {
        Ok(s) => s,
        Err(e) => {
            st.error(e);
            return null;
        }
    };
    let data = if access & MAP_READ != 0 {
        match read_range(&ctx, target, off, len) {
            Some(d) => {
                // The host's bytes are the buffer's: the guest's copy learns them.
                if let Some(sh) = st
                    .shared()
                    .buffers
                    .get_mut(&b)
                    .and_then(|i| i.shadow.as_mut())
                {
                    sh[off..off + len].copy_from_slice(&d);
                }
                d
            }
            None => return null,
        }
    } else {
        shadow.unwrap_or_else(|| vec![0; len])
    };
    let mut m = Mapping {
        offset: off,
        access,
        data,
    };
    let p = m.data.as_mut_ptr().cast();
    // The Vec's bytes do not move when the map does.
    st.shared().es3.maps.insert(b, m);
    p
}

/// Sends `bytes` as `glBufferSubData(target, offset, ...)` (the generated entry point: it
/// updates the guest's copy too). Call with no lock held.
fn write_back(target: u32, offset: usize, bytes: &[u8]) {
    if bytes.is_empty() {
        return;
    }
    // SAFETY: `bytes` holds its bytes; the generated entry point takes the locks anew.
    unsafe {
        super::gen::glBufferSubData(
            target,
            offset as isize,
            bytes.len() as isize,
            bytes.as_ptr().cast(),
        )
    };
}

/// `glFlushMappedBufferRange`: the range (relative to the mapping) goes to the host.
pub(crate) unsafe extern "C" fn glFlushMappedBufferRange(
    target: u32,
    offset: isize,
    length: isize,
) {
    let Some(ctx) = rt::current() else { return };
    let part = {
        let mut st = ctx.gl();
        let b = st.bound_buffer(target).unwrap_or(0);
        let r = {
            let s = st.shared();
            match s.es3.maps.get(&b) {
                Some(m) if m.access & MAP_FLUSH_EXPLICIT != 0 => {
                    match (usize::try_from(offset), usize::try_from(length)) {
                        (Ok(o), Ok(l)) if o.checked_add(l).is_some_and(|e| e <= m.data.len()) => {
                            Ok((m.offset + o, m.data[o..o + l].to_vec()))
                        }
                        _ => Err(GL_INVALID_VALUE),
                    }
                }
                _ => Err(GL_INVALID_OPERATION),
            }
        };
        match r {
            Ok(p) => p,
            Err(e) => {
                st.error(e);
                return;
            }
        }
    };
    write_back(target, part.0, &part.1);
}

/// `glUnmapBuffer`: a write mapping's range goes to the host (all of it: the host's bytes
/// may differ from the guest's copy after transform feedback or copies), unless flushed
/// explicitly. A `glMapBufferOES` mapping is unmapped as `glUnmapBufferOES` does.
pub(crate) unsafe extern "C" fn glUnmapBuffer(target: u32) -> u8 {
    let Some(ctx) = rt::current() else { return 0 };
    let m = {
        let mut st = ctx.gl();
        let b = st.bound_buffer(target).unwrap_or(0);
        let (m, oes) = {
            let mut s = st.shared();
            let oes = s.buffers.get(&b).is_some_and(|i| i.mapped.is_some());
            (s.es3.maps.remove(&b), oes)
        };
        if oes {
            drop(st);
            // SAFETY: GL's contract, passed on.
            return unsafe { super::custom::glUnmapBufferOES(target) };
        }
        match m {
            Some(m) => m,
            None => {
                st.error(GL_INVALID_OPERATION);
                return 0;
            }
        }
    };
    if m.access & MAP_WRITE != 0 && m.access & MAP_FLUSH_EXPLICIT == 0 {
        write_back(target, m.offset, &m.data);
    }
    1
}

/// `glGetBufferPointerv(target, GL_BUFFER_MAP_POINTER)`.
///
/// # Safety
/// `params` is null or has room for one pointer.
pub(crate) unsafe extern "C" fn glGetBufferPointerv(
    target: u32,
    pname: u32,
    params: *mut *mut c_void,
) {
    let Some(ctx) = rt::current() else { return };
    let p = {
        let mut st = ctx.gl();
        if pname != 0x88BD {
            st.error(GL_INVALID_ENUM);
            return;
        }
        let b = st.bound_buffer(target).unwrap_or(0);
        let mut s = st.shared();
        s.es3
            .maps
            .get_mut(&b)
            .map(|m| m.data.as_mut_ptr().cast::<c_void>())
    };
    match p {
        // SAFETY: the caller's contract.
        Some(p) if !params.is_null() => unsafe { *params = p },
        Some(_) => {}
        // SAFETY: GL's contract, passed on.
        None => unsafe { super::custom::glGetBufferPointervOES(target, pname, params) },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vertex_array_objects_keep_their_own_attributes() {
        let mut st = GlState::new(3, None);
        st.attribs[0].ptr = 0x1000;
        st.element_buffer = 7;
        // SAFETY: scalar arguments.
        unsafe { hooks::glBindVertexArray(&mut st, 5) };
        assert_eq!((st.attribs[0].ptr, st.element_buffer), (0, 0));
        st.element_buffer = 9;
        // SAFETY: scalar arguments.
        unsafe { hooks::glBindVertexArray(&mut st, 0) };
        assert_eq!((st.attribs[0].ptr, st.element_buffer), (0x1000, 7));
        // SAFETY: scalar arguments.
        unsafe { hooks::glBindVertexArray(&mut st, 5) };
        assert_eq!(st.element_buffer, 9);
        st.deleted(Kind::VertexArray, &[5]);
        assert_eq!((st.es3.vao, st.element_buffer), (0, 7));
    }

    #[test]
    fn buffer_targets_pixel_store_and_access_bits() {
        let mut st = GlState::new(3, None);
        bind_buffer(&mut st, PIXEL_UNPACK_BUFFER, 4);
        assert!(sz::unpack_buffer_bound(&st));
        assert_eq!(st.bound_buffer(PIXEL_UNPACK_BUFFER), Some(4));
        st.deleted(Kind::Buffer, &[4]);
        assert!(!sz::unpack_buffer_bound(&st));
        pixel_store(&mut st, 0x0CF2, 16); // UNPACK_ROW_LENGTH
        assert_eq!(sz::teximage(&st, 2, 2, 0x1908, 0x1401), Some(64 + 8));
        assert_eq!(access_error(MAP_READ), None);
        assert_eq!(access_error(MAP_WRITE | MAP_FLUSH_EXPLICIT), None);
        assert_eq!(
            access_error(MAP_READ | MAP_INVALIDATE_RANGE),
            Some(GL_INVALID_OPERATION)
        );
        assert_eq!(access_error(0), Some(GL_INVALID_OPERATION));
        assert_eq!(access_error(0x100 | MAP_WRITE), Some(GL_INVALID_VALUE));
    }
}
