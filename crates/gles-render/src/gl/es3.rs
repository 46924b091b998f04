//! GLES 3.0 on the host (1): pixel buffers and the pixel store, buffer range reads,
//! 64-bit and indexed queries, the GLES 3.0 object kinds' host names, and the state
//! tracked after GLES 3.0 calls (`hooks`).
//!
//! With a `GL_PIXEL_UNPACK_BUFFER` or `GL_PIXEL_PACK_BUFFER` bound, a pixel call's pointer
//! is an offset into that buffer: the decoder asks the driver which buffer is bound and how
//! large it is, and refuses (`GL_INVALID_OPERATION`) an offset whose pixels (sized from the
//! pixel store the decoder tracks and puts in force before the call) would pass its end; a
//! call that carries bytes is refused while a buffer is bound (the driver would take the
//! packet's address for an offset).
//!
//! Payloads (the guest's `gl::es3` writes them):
//! - unpack pixel arrays: `u32 0, bytes` or `u32 1, offset u64`;
//! - `glReadPixels(x, y, w, h, format, type, kind u32 [, offset u64])`: kind 0 answers the
//!   pixels, kind 1 writes them into the pack buffer at `offset`;
//! - `glMapBufferRange(target, offset u64, length u64, access)`: reads only (`MAP_READ`);
//!   answers the range's bytes (null when refused). Writes come back as `glBufferSubData`.

#![allow(non_snake_case, clippy::too_many_arguments)]

use std::ffi::c_void;

use virtsoc_gles_stream::{gl_ops as op, Encoder, Reader};

use super::hooks::binding;
use super::names::Kind;
use super::sz::{self, PixelStore};
use super::{rtx, ContextState, DecodeResult, Gl, GL_INVALID_OPERATION, GL_INVALID_VALUE};

/// `GL_BUFFER_SIZE`.
const BUFFER_SIZE: u32 = 0x8764;
/// `GL_PIXEL_PACK_BUFFER` / `GL_PIXEL_UNPACK_BUFFER`.
const PIXEL_PACK_BUFFER: u32 = 0x88EB;
const PIXEL_UNPACK_BUFFER: u32 = 0x88EC;

/// The GLES 3.0 state the decoder keeps for one guest context.
#[derive(Debug, Default)]
pub(crate) struct HostEs3 {
    /// Unpack rows and skips (the alignment is `ContextState::unpack_alignment`).
    pub unpack: PixelStore,
    /// Pack rows and skips.
    pub pack: PixelStore,
    /// Whether the guest ever set an attribute divisor (draws ask the driver's then).
    pub divisors_used: bool,
    /// Whether the guest ever bound a vertex array object on this context (client arrays
    /// go through the scratch buffer then: `gl::draw`).
    pub vertex_arrays_used: bool,
}

/// The binding query of buffer `target` (`None`: not a buffer target).
fn target_binding(target: u32) -> Option<u32> {
    Some(match target {
        0x8892 => 0x8894,            // ARRAY_BUFFER
        0x8893 => 0x8895,            // ELEMENT_ARRAY_BUFFER
        PIXEL_PACK_BUFFER => 0x88ED, // PIXEL_PACK_BUFFER_BINDING
        PIXEL_UNPACK_BUFFER => 0x88EF,
        0x8A11 => 0x8A28,          // UNIFORM_BUFFER
        0x8C8E => 0x8C8F,          // TRANSFORM_FEEDBACK_BUFFER
        0x8F36 | 0x8F37 => target, // COPY_READ/WRITE_BUFFER (binding = target)
        0x8F3F => 0x8F43,          // DRAW_INDIRECT_BUFFER (GLES 3.1)
        0x90EE => 0x90EF,          // DISPATCH_INDIRECT_BUFFER
        0x90D2 => 0x90D3,          // SHADER_STORAGE_BUFFER
        0x92C0 => 0x92C1,          // ATOMIC_COUNTER_BUFFER
        _ => return None,
    })
}

/// Whether `glBindBuffer` may take GLES 3.0 buffer `target`.
pub(crate) fn bind_target_ok(target: u32) -> bool {
    target_binding(target).is_some()
}

/// The size of the buffer bound to `target`, 0 when none is.
fn bound_size(gl: &Gl, target: u32) -> u64 {
    let Some(b) = target_binding(target) else {
        return 0;
    };
    if binding(gl, b) == 0 {
        return 0;
    }
    // SAFETY: a current context; a buffer is bound to `target`; one value written.
    unsafe {
        if let Some(f) = gl.glGetBufferParameteri64v {
            let mut v = 0i64;
            f(target, BUFFER_SIZE, &mut v);
            v.max(0) as u64
        } else {
            let mut v = 0i32;
            (gl.glGetBufferParameteriv)(target, BUFFER_SIZE, &mut v);
            v.max(0) as u64
        }
    }
}

/// `glPixelStorei` (after the driver's): the rows and skips the sizes use.
pub(crate) fn pixel_store(cx: &mut ContextState, pname: u32, param: i32) {
    if sz::is_unpack_param(pname) {
        cx.es3.unpack.set(pname, param as i64);
    } else if sz::is_pack_param(pname) {
        cx.es3.pack.set(pname, param as i64);
    }
}

/// Puts pixel store `ps` of one direction in force on the driver (whatever else set it).
fn assert_store(gl: &Gl, ps: &PixelStore, unpack: bool) {
    let v: &[(u32, i64)] = if unpack {
        &[
            (0x0CF5, ps.alignment),
            (0x0CF2, ps.row_length),
            (0x806E, ps.image_height),
            (0x0CF4, ps.skip_pixels),
            (0x0CF3, ps.skip_rows),
            (0x806D, ps.skip_images),
        ]
    } else {
        &[
            (0x0D05, ps.alignment),
            (0x0D02, ps.row_length),
            (0x0D04, ps.skip_pixels),
            (0x0D03, ps.skip_rows),
        ]
    };
    let es3 = gl.glMapBufferRange.is_some();
    for (i, (pname, val)) in v.iter().enumerate() {
        // GLES 2.0 drivers know the alignments only (the guest cannot set the others there).
        if i > 0 && !es3 {
            continue;
        }
        // SAFETY: a current context; scalar arguments.
        unsafe { (gl.glPixelStorei)(*pname, *val as i32) };
    }
}

/// Checks a pixel buffer offset: a buffer bound to `target` and `need` bytes from `off`
/// inside it (`GL_INVALID_OPERATION` recorded otherwise).
fn pbo_offset(
    gl: &Gl,
    cx: &mut ContextState,
    target: u32,
    off: u64,
    need: usize,
) -> Option<*const c_void> {
    let size = bound_size(gl, target);
    let end = off.checked_add(need as u64);
    if size == 0 || !end.is_some_and(|e| e <= size) {
        cx.error(GL_INVALID_OPERATION);
        return None;
    }
    Some(off as usize as *const c_void)
}

/// The pointer to hand the driver for an unpack pixel array of `need` bytes: the packet's
/// bytes (`b`: `Some`) when no unpack buffer is bound, else an offset checked against the
/// bound buffer; `None` after recording the error. Puts the unpack parameters in force.
pub(crate) fn unpack_ptr(
    gl: &Gl,
    cx: &mut ContextState,
    b: Option<Option<&[u8]>>,
    off: u64,
    need: usize,
    nullable: bool,
) -> Option<*const c_void> {
    assert_store(gl, &sz::unpack_store(cx), true);
    let bound = gl.glMapBufferRange.is_some() && binding(gl, 0x88EF) != 0;
    match b {
        Some(_) if bound => {
            cx.error(GL_INVALID_OPERATION);
            None
        }
        Some(bytes) => {
            let p = rtx::in_ptr(bytes, need, nullable);
            if p.is_none() {
                cx.error(GL_INVALID_VALUE);
            }
            p
        }
        None => pbo_offset(gl, cx, PIXEL_UNPACK_BUFFER, off, need),
    }
}

/// `glReadPixels`: into the answer (kind 0) or the bound pack buffer (kind 1).
pub(crate) fn glReadPixels(
    gl: &Gl,
    cx: &mut ContextState,
    r: &mut Reader<'_>,
    reply: &mut Encoder,
) -> DecodeResult {
    let (x, y, w, h, format, ty) = (r.i32()?, r.i32()?, r.i32()?, r.i32()?, r.u32()?, r.u32()?);
    let kind = r.u32()?;
    let off = if kind == 0 { 0 } else { r.u64()? };
    let n = sz::readpixels(cx, w as i64, h as i64, format as i64, ty as i64);
    // The GLES 2.0 check (the alignment in force), then the rows and skips.
    let _ = super::hooks::check_glReadPixels(gl, cx, x, y, w, h, format, ty, std::ptr::null_mut());
    assert_store(gl, &sz::pack_store(cx), false);
    let bound = gl.glMapBufferRange.is_some() && binding(gl, 0x88ED) != 0;
    if kind != 0 {
        let Some(n) = n else {
            cx.error(GL_INVALID_VALUE);
            return Ok(());
        };
        if let Some(p) = pbo_offset(gl, cx, PIXEL_PACK_BUFFER, off, n) {
            // SAFETY: a current context; `p` is an offset into the bound pack buffer with
            // room for the `n` bytes the driver writes (checked).
            unsafe { (gl.glReadPixels)(x, y, w, h, format, ty, p.cast_mut()) };
        }
        return Ok(());
    }
    let mut p = reply.packet(op::glReadPixels);
    let out = n
        .filter(|_| !bound)
        .and_then(|n| Some((n, rtx::out_buf(n)?)));
    let Some((n, mut buf)) = out else {
        cx.error(if bound {
            GL_INVALID_OPERATION
        } else {
            GL_INVALID_VALUE
        });
        p.null();
        return Ok(());
    };
    // SAFETY: a current context, no pack buffer bound; `buf` has room for the `n` bytes the
    // driver writes with the pack parameters put in force above.
    unsafe { (gl.glReadPixels)(x, y, w, h, format, ty, buf.as_mut_ptr().cast()) };
    p.bytes(&rtx::out_bytes(&buf, n));
    Ok(())
}

/// `glMapBufferRange` for reading: the range's bytes (the driver maps it, the bytes are
/// copied, it is unmapped at once).
pub(crate) fn glMapBufferRange(
    gl: &Gl,
    cx: &mut ContextState,
    r: &mut Reader<'_>,
    reply: &mut Encoder,
) -> DecodeResult {
    let (target, off, len, access) = (r.u32()?, r.u64()?, r.u64()?, r.u32()?);
    let mut p = reply.packet(op::glMapBufferRange);
    let size = bound_size(gl, target);
    let fits = off.checked_add(len).is_some_and(|e| e <= size) && len > 0;
    let (Some(map), Some(unmap)) = (gl.glMapBufferRange, gl.glUnmapBuffer) else {
        cx.error(GL_INVALID_OPERATION);
        p.null();
        return Ok(());
    };
    if access != 1 || !fits || len as usize > rtx::MAX_OUT {
        cx.error(if access != 1 {
            GL_INVALID_OPERATION
        } else {
            GL_INVALID_VALUE
        });
        p.null();
        return Ok(());
    }
    // SAFETY: a current context; the range lies inside the bound buffer (checked).
    let m = unsafe { map(target, off as isize, len as isize, 1) };
    if m.is_null() {
        p.null();
        return Ok(());
    }
    // SAFETY: the driver mapped `len` readable bytes at `m` until the unmap below.
    let bytes = unsafe { std::slice::from_raw_parts(m.cast::<u8>(), len as usize) };
    p.bytes(bytes);
    // SAFETY: a current context; the buffer mapped above.
    unsafe { unmap(target) };
    Ok(())
}

/// Calls the guest's library answers itself; never sent.
fn never_sent(cx: &mut ContextState) -> DecodeResult {
    cx.error(GL_INVALID_OPERATION);
    Ok(())
}

pub(crate) fn glFlushMappedBufferRange(
    _gl: &Gl,
    cx: &mut ContextState,
    _r: &mut Reader<'_>,
    _reply: &mut Encoder,
) -> DecodeResult {
    never_sent(cx)
}

pub(crate) fn glUnmapBuffer(
    _gl: &Gl,
    cx: &mut ContextState,
    _r: &mut Reader<'_>,
    _reply: &mut Encoder,
) -> DecodeResult {
    never_sent(cx)
}

pub(crate) fn glGetBufferPointerv(
    _gl: &Gl,
    cx: &mut ContextState,
    _r: &mut Reader<'_>,
    _reply: &mut Encoder,
) -> DecodeResult {
    never_sent(cx)
}

/// `glGetInteger64v(pname)`: as `glGetIntegerv`, 64-bit values (list queries sized by the
/// driver's count).
pub(crate) fn glGetInteger64v(
    gl: &Gl,
    cx: &mut ContextState,
    r: &mut Reader<'_>,
    reply: &mut Encoder,
) -> DecodeResult {
    let pname = r.u32()?;
    let mut p = reply.packet(op::glGetInteger64v);
    let Some(f) = gl.glGetInteger64v else {
        cx.error(GL_INVALID_OPERATION);
        p.null();
        return Ok(());
    };
    let n = match super::custom::list_count(pname) {
        Some(c) => {
            let mut k = 0i32;
            // SAFETY: a current context; a count query writes one value.
            unsafe { (gl.glGetIntegerv)(c, &mut k) };
            k.clamp(0, 4096) as usize
        }
        None => sz::get_count(pname),
    };
    let mut v = vec![0i64; n + 16];
    // SAFETY: a current context; `v` has room for what `pname` answers and 16 more.
    unsafe { f(pname, v.as_mut_ptr()) };
    if let Some(k) = super::custom::binding_kind(pname) {
        v[0] = cx.share().guest_of(k, v[0] as u32) as i64;
    }
    let b: Vec<u8> = v[..n].iter().flat_map(|x| x.to_ne_bytes()).collect();
    p.bytes(&b);
    Ok(())
}

/// The kind of object an indexed binding query answers.
fn indexed_binding(target: u32) -> bool {
    matches!(target, 0x8A28 | 0x8C8F) // UNIFORM_/TRANSFORM_FEEDBACK_BUFFER_BINDING
}

/// `glGetIntegeri_v`/`glGetInteger64i_v(target, index)`: one value (indexed buffer bindings
/// answer the guest's names).
fn get_indexed(
    gl: &Gl,
    cx: &mut ContextState,
    r: &mut Reader<'_>,
    reply: &mut Encoder,
    wide: bool,
) -> DecodeResult {
    let (target, index) = (r.u32()?, r.u32()?);
    let opc = if wide {
        op::glGetInteger64i_v
    } else {
        op::glGetIntegeri_v
    };
    let mut p = reply.packet(opc);
    let mut v = [0i64; 8];
    // SAFETY: a current context; `v` has room for 8 values, indexed queries write one.
    let ok = unsafe {
        match (wide, gl.glGetInteger64i_v, gl.glGetIntegeri_v) {
            (true, Some(f), _) => {
                f(target, index, v.as_mut_ptr());
                true
            }
            (false, _, Some(f)) => {
                let mut w = [0i32; 8];
                f(target, index, w.as_mut_ptr());
                v[0] = w[0] as i64;
                true
            }
            _ => false,
        }
    };
    if !ok {
        cx.error(GL_INVALID_OPERATION);
        p.null();
        return Ok(());
    }
    if indexed_binding(target) {
        v[0] = cx.share().guest_of(Kind::Buffer, v[0] as u32) as i64;
    }
    if wide {
        p.bytes(&v[0].to_ne_bytes());
    } else {
        p.bytes(&(v[0] as i32).to_ne_bytes());
    }
    Ok(())
}

pub(crate) fn glGetIntegeri_v(
    gl: &Gl,
    cx: &mut ContextState,
    r: &mut Reader<'_>,
    reply: &mut Encoder,
) -> DecodeResult {
    get_indexed(gl, cx, r, reply, false)
}

pub(crate) fn glGetInteger64i_v(
    gl: &Gl,
    cx: &mut ContextState,
    r: &mut Reader<'_>,
    reply: &mut Encoder,
) -> DecodeResult {
    get_indexed(gl, cx, r, reply, true)
}

/// Makes one host object of a GLES 3.0 kind into `h` (left 0 when the driver lacks it).
pub(crate) fn host_gen(gl: &Gl, kind: Kind, h: &mut u32) {
    let f = match kind {
        Kind::Query => gl.glGenQueries,
        Kind::Sampler => gl.glGenSamplers,
        Kind::VertexArray => gl.glGenVertexArrays,
        Kind::TransformFeedback => gl.glGenTransformFeedbacks,
        Kind::ProgramPipeline => gl.glGenProgramPipelines,
        _ => None,
    };
    if let Some(f) = f {
        // SAFETY: a current context; `h` has room for one name.
        unsafe { f(1, h) };
    }
}

/// Deletes host objects of a GLES 3.0 kind.
pub(crate) fn host_delete(gl: &Gl, kind: Kind, names: &[u32]) {
    let f = match kind {
        Kind::Query => gl.glDeleteQueries,
        Kind::Sampler => gl.glDeleteSamplers,
        Kind::VertexArray => gl.glDeleteVertexArrays,
        Kind::TransformFeedback => gl.glDeleteTransformFeedbacks,
        Kind::ProgramPipeline => gl.glDeleteProgramPipelines,
        _ => None,
    };
    if let Some(f) = f {
        // SAFETY: a current context; `names` holds its host names.
        unsafe { f(names.len() as i32, names.as_ptr()) };
    }
}

/// State the host tracks after GLES 3.0 calls (the annotation file's `hhook`).
pub(crate) mod hooks {
    use super::*;

    /// The host texture bound to `target` (3D and array targets too).
    fn texture_binding(gl: &Gl, target: u32) -> u32 {
        match target {
            0x0DE1 => binding(gl, 0x8069),                   // TEXTURE_2D
            0x8513 | 0x8515..=0x851A => binding(gl, 0x8514), // CUBE_MAP (and faces)
            0x806F => binding(gl, 0x806A),                   // TEXTURE_3D
            0x8C1A => binding(gl, 0x8C1D),                   // TEXTURE_2D_ARRAY
            _ => 0,
        }
    }

    /// Bytes per texel of a sized internal format (an estimate: 4 when unknown).
    fn texel_bytes(internalformat: u32) -> u64 {
        match internalformat {
            0x8229 | 0x8231 | 0x8232 | 0x8F94 => 1, // R8, R8I, R8UI, R8_SNORM
            0x822B | 0x822D | 0x8233..=0x8236 | 0x8D62 | 0x8056 | 0x8057 => 2,
            0x881A | 0x8230 | 0x823B | 0x823C | 0x8D76 | 0x8D88 => 8, // RGBA16F, RG32F, ...
            0x8814 | 0x8D70 | 0x8D82 => 16,                           // RGBA32F/UI/I
            0x8815 | 0x8D71 | 0x8D83 => 12,                           // RGB32F/UI/I
            0x8CAD => 8,                                              // DEPTH32F_STENCIL8
            _ => 4,
        }
    }

    /// Bytes of `levels` mipmap levels of a `w` x `h` x `d` image (`d` not halved for
    /// array textures).
    fn storage_bytes(levels: i32, w: i32, h: i32, d: i32, halve_d: bool, texel: u64) -> u64 {
        let (mut w, mut h, mut d) = (w.max(0) as u64, h.max(0) as u64, d.max(0) as u64);
        let mut total = 0u64;
        for _ in 0..levels.clamp(0, 32) {
            total =
                total.saturating_add(w.saturating_mul(h).saturating_mul(d).saturating_mul(texel));
            w = (w / 2).max(1);
            h = (h / 2).max(1);
            if halve_d {
                d = (d / 2).max(1);
            }
        }
        total
    }

    pub(crate) fn glTexImage3D(
        gl: &Gl,
        cx: &mut ContextState,
        target: u32,
        level: i32,
        _internalformat: i32,
        width: i32,
        height: i32,
        depth: i32,
        _border: i32,
        format: u32,
        ty: u32,
        _pixels: *const c_void,
    ) {
        let t = texture_binding(gl, target);
        let n = sz::image_bytes_3d(
            width as i64,
            height as i64,
            depth as i64,
            format,
            ty,
            &PixelStore {
                alignment: 1,
                ..PixelStore::default()
            },
        )
        .unwrap_or(0);
        cx.share().set_texture_bytes(t, target, level, n as u64);
    }

    pub(crate) fn glTexStorage2D(
        gl: &Gl,
        cx: &mut ContextState,
        target: u32,
        levels: i32,
        internalformat: u32,
        width: i32,
        height: i32,
    ) {
        let t = texture_binding(gl, target);
        let faces = if target == 0x8513 { 6 } else { 1 };
        let n = storage_bytes(
            levels,
            width,
            height,
            faces,
            false,
            texel_bytes(internalformat),
        );
        cx.share().set_texture_bytes(t, target, -1, n);
    }

    pub(crate) fn glTexStorage3D(
        gl: &Gl,
        cx: &mut ContextState,
        target: u32,
        levels: i32,
        internalformat: u32,
        width: i32,
        height: i32,
        depth: i32,
    ) {
        let t = texture_binding(gl, target);
        let halve = target == 0x806F;
        let n = storage_bytes(
            levels,
            width,
            height,
            depth,
            halve,
            texel_bytes(internalformat),
        );
        cx.share().set_texture_bytes(t, target, -1, n);
    }

    pub(crate) fn glRenderbufferStorageMultisample(
        gl: &Gl,
        cx: &mut ContextState,
        _target: u32,
        samples: i32,
        internalformat: u32,
        width: i32,
        height: i32,
    ) {
        let r = binding(gl, 0x8CA7); // RENDERBUFFER_BINDING
        let n = storage_bytes(
            1,
            width,
            height,
            samples.max(1),
            false,
            texel_bytes(internalformat),
        );
        cx.share().set_renderbuffer_bytes(r, n);
    }

    pub(crate) fn glVertexAttribDivisor(_gl: &Gl, cx: &mut ContextState, _index: u32, _d: u32) {
        cx.es3.divisors_used = true;
    }

    /// `GL_CURRENT_QUERY` answers the guest's name.
    pub(crate) fn glGetQueryiv(
        _gl: &Gl,
        cx: &mut ContextState,
        _t: u32,
        pname: u32,
        params: *mut i32,
    ) {
        if pname == 0x8865 && !params.is_null() {
            // SAFETY: `params` is the decoder's output buffer (one value at least).
            unsafe { *params = cx.share().guest_of(Kind::Query, *params as u32) as i32 };
        }
    }

    /// `GL_VERTEX_ATTRIB_ARRAY_BUFFER_BINDING` answers the guest's name.
    pub(crate) fn glGetVertexAttribIiv(
        _gl: &Gl,
        cx: &mut ContextState,
        _i: u32,
        pname: u32,
        params: *mut i32,
    ) {
        if pname == 0x889F && !params.is_null() {
            // SAFETY: `params` is the decoder's output buffer (one value at least).
            unsafe { *params = cx.share().guest_of(Kind::Buffer, *params as u32) as i32 };
        }
    }

    /// As `glGetVertexAttribIiv`.
    pub(crate) fn glGetVertexAttribIuiv(
        _gl: &Gl,
        cx: &mut ContextState,
        _i: u32,
        pname: u32,
        params: *mut u32,
    ) {
        if pname == 0x889F && !params.is_null() {
            // SAFETY: `params` is the decoder's output buffer (one value at least).
            unsafe { *params = cx.share().guest_of(Kind::Buffer, *params) };
        }
    }
}
