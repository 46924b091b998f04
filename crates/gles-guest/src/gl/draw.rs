//! Vertex attribute pointers and the draws that send client arrays (GLES 2.0's
//! `glDrawArrays`/`glDrawElements`, GLES 3.0's instanced draws, `glDrawRangeElements` and
//! integer attributes). A client array travels with the draw: the vertices the draw uses
//! (`base..base+nverts`), or for an attribute with a divisor the instances' elements
//! (`0..ceil(instances/divisor)`). Payloads: see the host's `gl::draw`.

#![allow(non_snake_case)]

use std::ffi::c_void;

use virtsoc_gles_stream::{gl_ops as op, Packet};

use super::custom::encode;
use super::state::{Attrib, MAX_ATTRIBS};
use super::{sz, GlState, GL_INVALID_ENUM, GL_INVALID_OPERATION, GL_INVALID_VALUE};
use crate::rt;

/// Most vertices a client-array draw sends.
const MAX_CLIENT_VERTICES: usize = 16 << 20;

/// Records an attribute pointer; sends it only with a buffer bound. Client pointers are
/// refused while a vertex array object is bound (GLES 3.0).
#[allow(clippy::too_many_arguments)]
fn attrib_pointer(
    index: u32,
    size: i32,
    ty: u32,
    normalized: u8,
    stride: i32,
    pointer: *const c_void,
    integer: bool,
) {
    let Some(ctx) = rt::current() else { return };
    let mut st = ctx.gl();
    if index as usize >= MAX_ATTRIBS || !(1..=4).contains(&size) || stride < 0 {
        st.error(GL_INVALID_VALUE);
        return;
    }
    let int_ok = !integer || matches!(ty, 0x1400..=0x1405);
    if sz::attrib_type_bytes(ty).is_none() || !int_ok {
        st.error(GL_INVALID_ENUM);
        return;
    }
    let buffer = st.array_buffer;
    if buffer == 0 && st.es3.vao != 0 && !pointer.is_null() {
        st.error(GL_INVALID_OPERATION);
        return;
    }
    let a = &mut st.attribs[index as usize];
    *a = Attrib {
        enabled: a.enabled,
        size,
        ty,
        normalized: normalized != 0,
        stride,
        ptr: pointer as usize,
        buffer,
        integer,
        divisor: a.divisor,
        bound: false,
    };
    if buffer != 0 {
        if integer {
            encode(&ctx, op::glVertexAttribIPointer, |p| {
                p.u32(index)
                    .i32(size)
                    .u32(ty)
                    .i32(stride)
                    .u64(pointer as u64);
            });
        } else {
            encode(&ctx, op::glVertexAttribPointer, |p| {
                p.u32(index)
                    .i32(size)
                    .u32(ty)
                    .u32(normalized as u32)
                    .i32(stride)
                    .u64(pointer as u64);
            });
        }
    }
}

/// `glVertexAttribPointer`: recorded; sent only with a buffer bound (client arrays travel
/// with the draws).
///
/// # Safety
/// GL's contract.
pub(crate) unsafe extern "C" fn glVertexAttribPointer(
    index: u32,
    size: i32,
    ty: u32,
    normalized: u8,
    stride: i32,
    pointer: *const c_void,
) {
    attrib_pointer(index, size, ty, normalized, stride, pointer, false);
}

/// `glVertexAttribIPointer` (GLES 3.0): as `glVertexAttribPointer`, integer values.
///
/// # Safety
/// GL's contract.
pub(crate) unsafe extern "C" fn glVertexAttribIPointer(
    index: u32,
    size: i32,
    ty: u32,
    stride: i32,
    pointer: *const c_void,
) {
    attrib_pointer(index, size, ty, 0, stride, pointer, true);
}

/// `glGetVertexAttribPointerv`, from guest state.
///
/// # Safety
/// `pointer` is null or has room for one pointer.
pub(crate) unsafe extern "C" fn glGetVertexAttribPointerv(
    index: u32,
    pname: u32,
    pointer: *mut *mut c_void,
) {
    let Some(ctx) = rt::current() else { return };
    let mut st = ctx.gl();
    if pname != 0x8645 {
        st.error(GL_INVALID_ENUM);
        return;
    }
    let Some(a) = st.attribs.get(index as usize) else {
        st.error(GL_INVALID_VALUE);
        return;
    };
    if !pointer.is_null() {
        // SAFETY: the caller's contract.
        unsafe { *pointer = a.ptr as *mut c_void };
    }
}

/// The elements of client attribute `a` a draw of vertices `base..base+nverts` and
/// `instances` instances reads: `(first, count)`.
fn elements(a: &Attrib, base: usize, nverts: usize, instances: usize) -> (usize, usize) {
    if a.divisor == 0 {
        (base, nverts)
    } else {
        (0, instances.max(1).div_ceil(a.divisor as usize))
    }
}

/// The client attributes of a draw, packed: `base u32, nverts u32, nattr u32`, then per
/// attribute `index, size, type, flags (1 normalized, 2 integer), bytes`.
///
/// # Safety
/// Every enabled client attribute's pointer holds the elements the draw uses.
unsafe fn client_block(
    p: &mut Packet<'_>,
    attrs: &[(u32, Attrib)],
    base: usize,
    nverts: usize,
    instances: usize,
) {
    p.u32(base as u32)
        .u32(nverts as u32)
        .u32(attrs.len() as u32);
    for (i, a) in attrs {
        let elem = sz::attrib_type_bytes(a.ty).unwrap_or(4) * a.size as usize;
        let stride = if a.stride == 0 {
            elem
        } else {
            a.stride as usize
        };
        let (first, n) = elements(a, base, nverts, instances);
        let flags = a.normalized as u32 | (a.integer as u32) << 1;
        p.u32(*i).i32(a.size).u32(a.ty).u32(flags);
        if stride == elem {
            // Tightly packed: one copy.
            let src = (a.ptr + first * stride) as *const u8;
            // SAFETY: the caller's contract: elements `first..first+n` are readable.
            p.bytes(unsafe { std::slice::from_raw_parts(src, elem * n) });
            continue;
        }
        let mut data = Vec::with_capacity(elem * n);
        for v in first..first + n {
            let src = (a.ptr + v * stride) as *const u8;
            // SAFETY: the caller's contract: element `v` of the attribute is readable.
            data.extend_from_slice(unsafe { std::slice::from_raw_parts(src, elem) });
        }
        p.bytes(&data);
    }
}

/// The enabled attributes in client memory, and whether any enabled one is in a buffer;
/// `None` when one has no pointer.
fn client_attribs(st: &GlState) -> Option<(Vec<(u32, Attrib)>, bool)> {
    let mut v = Vec::new();
    let mut any_buffer = false;
    for (i, a) in st.attribs.iter().enumerate().filter(|(_, a)| a.enabled) {
        if a.buffer != 0 || a.bound {
            any_buffer = true;
        } else if a.ptr == 0 {
            return None;
        } else {
            v.push((i as u32, *a));
        }
    }
    Some((v, any_buffer))
}

/// Whether a client attribute would send more than [`MAX_CLIENT_VERTICES`] elements.
fn too_many(attrs: &[(u32, Attrib)], base: usize, nverts: usize, instances: usize) -> bool {
    attrs
        .iter()
        .any(|(_, a)| elements(a, base, nverts, instances).1 > MAX_CLIENT_VERTICES)
}

/// `glDrawArrays` and `glDrawArraysInstanced` (`inst`: the instance count).
fn draw_arrays(mode: u32, first: i32, count: i32, inst: Option<i32>) {
    let Some(ctx) = rt::current() else { return };
    let mut st = ctx.gl();
    if first < 0 || count < 0 || inst.is_some_and(|i| i < 0) {
        st.error(GL_INVALID_VALUE);
        return;
    }
    let Some((attrs, any_buffer)) = client_attribs(&st) else {
        st.error(GL_INVALID_OPERATION);
        return;
    };
    let instances = inst.unwrap_or(1) as usize;
    let (first_u, end) = (first as usize, first as usize + count as usize);
    let base = if attrs.is_empty() || any_buffer {
        0
    } else {
        first_u
    };
    let nverts = if attrs.is_empty() { 0 } else { end - base };
    if too_many(&attrs, base, nverts, instances) {
        st.error(GL_INVALID_VALUE);
        return;
    }
    let opc = match inst {
        Some(_) => op::glDrawArraysInstanced,
        None => op::glDrawArrays,
    };
    encode(&ctx, opc, |p| {
        p.u32(mode).i32(first).i32(count);
        if let Some(i) = inst {
            p.i32(i);
        }
        // SAFETY: the caller's contract.
        unsafe { client_block(p, &attrs, base, nverts, instances) };
    });
}

/// `glDrawArrays`: client arrays' vertices `first..first+count` go with it.
///
/// # Safety
/// GL's contract: client arrays hold the vertices drawn.
pub(crate) unsafe extern "C" fn glDrawArrays(mode: u32, first: i32, count: i32) {
    draw_arrays(mode, first, count, None);
}

/// `glDrawArraysInstanced` (GLES 3.0).
///
/// # Safety
/// GL's contract: client arrays hold the vertices and instances drawn.
pub(crate) unsafe extern "C" fn glDrawArraysInstanced(
    mode: u32,
    first: i32,
    count: i32,
    instancecount: i32,
) {
    draw_arrays(mode, first, count, Some(instancecount));
}

/// The index bytes of a draw: client memory, or the guest's copy of the element buffer;
/// `None` after recording the error.
///
/// # Safety
/// Without an element buffer, `indices` holds `n * ib` bytes.
unsafe fn index_bytes(
    st: &mut GlState,
    indices: *const c_void,
    n: usize,
    ib: usize,
) -> Option<Vec<u8>> {
    let eb = st.element_buffer;
    if eb != 0 {
        let s = st.shared();
        let off = indices as usize;
        let b = s
            .buffers
            .get(&eb)
            .and_then(|i| i.shadow.as_ref())
            .and_then(|sh| sh.get(off..off.checked_add(n * ib)?))
            .map(|b| b.to_vec());
        drop(s);
        if b.is_none() {
            st.error(GL_INVALID_OPERATION);
        }
        return b;
    }
    if indices.is_null() {
        st.error(GL_INVALID_OPERATION);
        return None;
    }
    // SAFETY: the caller's contract: `count` indices of `ty`.
    Some(unsafe { std::slice::from_raw_parts(indices.cast::<u8>(), n * ib) }.to_vec())
}

/// `glDrawElements`, `glDrawRangeElements` and `glDrawElementsInstanced`.
///
/// # Safety
/// GL's contract: `indices` (without an element buffer) holds `count` indices, client
/// arrays hold every element they name.
unsafe fn draw_elements(mode: u32, count: i32, ty: u32, indices: *const c_void, inst: Option<i32>) {
    let Some(ctx) = rt::current() else { return };
    let mut st = ctx.gl();
    let (Ok(n), false) = (usize::try_from(count), inst.is_some_and(|i| i < 0)) else {
        st.error(GL_INVALID_VALUE);
        return;
    };
    let Some(ib) = sz::index_bytes(ty) else {
        st.error(GL_INVALID_ENUM);
        return;
    };
    let Some((attrs, any_buffer)) = client_attribs(&st) else {
        st.error(GL_INVALID_OPERATION);
        return;
    };
    if n == 0 {
        return;
    }
    let opc = match inst {
        Some(_) => op::glDrawElementsInstanced,
        None => op::glDrawElements,
    };
    let head = |p: &mut Packet<'_>| {
        p.u32(mode).i32(count).u32(ty);
        if let Some(i) = inst {
            p.i32(i);
        }
    };
    if attrs.is_empty() && st.element_buffer != 0 {
        encode(&ctx, opc, |p| {
            head(p);
            p.u32(0).u64(indices as u64);
            p.u32(0).u32(0).u32(0);
        });
        return;
    }
    // SAFETY: the caller's contract.
    let Some(bytes) = (unsafe { index_bytes(&mut st, indices, n, ib) }) else {
        return;
    };
    let (base, nverts) = if attrs.is_empty() {
        (0, 0)
    } else {
        let Some((lo, hi)) = sz::index_range(&bytes, ty, n) else {
            st.error(GL_INVALID_VALUE);
            return;
        };
        let base = if any_buffer { 0 } else { lo as usize };
        (base, hi as usize + 1 - base)
    };
    let instances = inst.unwrap_or(1) as usize;
    if too_many(&attrs, base, nverts, instances) {
        st.error(GL_INVALID_VALUE);
        return;
    }
    encode(&ctx, opc, |p| {
        head(p);
        p.u32(1).bytes(&bytes);
        // SAFETY: the caller's contract.
        unsafe { client_block(p, &attrs, base, nverts, instances) };
    });
}

/// `glDrawElements`: indices in the element buffer are sent as its offset unless client
/// arrays need their range; client arrays' vertices between the smallest and the largest
/// index go with it.
///
/// # Safety
/// GL's contract: `indices` (without an element buffer) holds `count` indices, client
/// arrays hold every vertex they name.
pub(crate) unsafe extern "C" fn glDrawElements(
    mode: u32,
    count: i32,
    ty: u32,
    indices: *const c_void,
) {
    // SAFETY: the caller's contract.
    unsafe { draw_elements(mode, count, ty, indices, None) };
}

/// `glDrawRangeElements` (GLES 3.0): `glDrawElements` (the range is a hint; the guest
/// finds the range itself when client arrays need it).
///
/// # Safety
/// As `glDrawElements`.
pub(crate) unsafe extern "C" fn glDrawRangeElements(
    mode: u32,
    start: u32,
    end: u32,
    count: i32,
    ty: u32,
    indices: *const c_void,
) {
    if end < start {
        if let Some(ctx) = rt::current() {
            ctx.gl().error(GL_INVALID_VALUE);
        }
        return;
    }
    // SAFETY: the caller's contract.
    unsafe { draw_elements(mode, count, ty, indices, None) };
}

/// `glDrawElementsInstanced` (GLES 3.0).
///
/// # Safety
/// As `glDrawElements`; client arrays with a divisor hold the instances' elements.
pub(crate) unsafe extern "C" fn glDrawElementsInstanced(
    mode: u32,
    count: i32,
    ty: u32,
    indices: *const c_void,
    instancecount: i32,
) {
    // SAFETY: the caller's contract.
    unsafe { draw_elements(mode, count, ty, indices, Some(instancecount)) };
}
