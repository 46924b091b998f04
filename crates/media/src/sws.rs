//! A small owned wrapper around libswscale's `SwsContext` that scales between plain byte
//! buffers described by [`FrameLayout`]s (crate-internal; used by the ISP, the decoder's output
//! conversion and the file camera).
//!
//! swscale's SIMD paths assume what FFmpeg's own frames guarantee: plane pointers and line
//! sizes aligned to the CPU's widest vector, and rows that may be read or written up to the
//! next multiple of that width. Region buffers of arbitrary sizes do not give that (720 pixels
//! of YUV420P have 360-byte chroma rows, and swscale's aligned stores then fault and kill the
//! process), so a buffer is handed to swscale directly only when every plane's pointer,
//! stride and row length are multiples of [`SIMD_ALIGN`]; any other buffer is staged through
//! internally owned, aligned and padded buffers. The common video sizes (1280, 1920, 3840
//! wide, on the page-aligned buffers of the SVM) take the direct path without extra copies.

use std::ffi::c_int;
use std::ptr::NonNull;

use ffmpeg_next::ffi;

use crate::error::{MediaError, Result};
use crate::frame::{copy_frame, FrameLayout, FrameMut, FrameRef, PixelFormat};

/// Filter used by a [`Scaler`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum ScaleFilter {
    /// Bilinear, swscale's fast default paths (nearest-neighbour chroma in unscaled
    /// YUV -> RGB, reduced-precision coefficients).
    Bilinear,
    /// Bilinear with full horizontal chroma interpolation and accurate rounding.
    BilinearAccurate,
}

impl ScaleFilter {
    fn flags(self) -> c_int {
        match self {
            ScaleFilter::Bilinear => ffi::SWS_BILINEAR,
            ScaleFilter::BilinearAccurate => {
                ffi::SWS_BILINEAR | ffi::SWS_ACCURATE_RND | ffi::SWS_FULL_CHR_H_INT
            }
        }
    }
}

/// The FFmpeg pixel format of one of ours.
pub(crate) fn av_format(format: PixelFormat) -> ffi::AVPixelFormat {
    match format {
        PixelFormat::Nv12 => ffi::AVPixelFormat::AV_PIX_FMT_NV12,
        PixelFormat::Yuv420p => ffi::AVPixelFormat::AV_PIX_FMT_YUV420P,
        PixelFormat::Rgba8 => ffi::AVPixelFormat::AV_PIX_FMT_RGBA,
        PixelFormat::Bgra8 => ffi::AVPixelFormat::AV_PIX_FMT_BGRA,
    }
}

/// Plane pointers and strides of a layout over a base pointer, in swscale's array form.
fn plane_arrays(layout: &FrameLayout) -> ([usize; 4], [c_int; 4]) {
    let mut offs = [0usize; 4];
    let mut strides = [0 as c_int; 4];
    for (i, p) in layout.planes().iter().enumerate() {
        offs[i] = p.offset;
        strides[i] = p.stride as c_int;
    }
    (offs, strides)
}

/// The alignment swscale's widest SIMD paths (AVX-512) assume for plane pointers, line sizes
/// and row lengths.
pub(crate) const SIMD_ALIGN: usize = 64;

/// True if swscale may read/write the planes of `layout` over `base` in place: every plane
/// starts on a [`SIMD_ALIGN`] boundary, and its stride and its row length in bytes are
/// multiples of it, so no vector load or store is misaligned or runs past a row (nor past the
/// last row of the buffer).
fn direct_ok(layout: &FrameLayout, base: *const u8) -> bool {
    layout.planes().iter().all(|p| {
        (base as usize).wrapping_add(p.offset) % SIMD_ALIGN == 0
            && p.stride % SIMD_ALIGN == 0
            && p.row_bytes() % SIMD_ALIGN == 0
    })
}

/// A padded copy of a layout for staging: the luma stride rounded up so that every plane's
/// stride (chroma planes of YUV420P have half of it) is a multiple of [`SIMD_ALIGN`].
fn staging_layout(layout: &FrameLayout) -> FrameLayout {
    let row = layout.width * layout.format.bytes_per_pixel();
    let unit = 2 * SIMD_ALIGN as u32;
    let stride = row.div_ceil(unit) * unit;
    FrameLayout { stride, ..*layout }
}

/// Extra bytes after a staged frame so that over-reads past the last row stay in bounds.
const STAGING_TAIL: usize = 256;

/// A zeroed byte buffer whose first `len` bytes start on a [`SIMD_ALIGN`] boundary: `Vec`
/// over-allocated by the alignment, with the aligned window's offset.
#[derive(Default)]
struct AlignedBuf {
    bytes: Vec<u8>,
    start: usize,
}

impl AlignedBuf {
    /// The aligned window of `len` bytes (grown and re-aligned when needed).
    fn get(&mut self, len: usize) -> &mut [u8] {
        let aligned = |b: &Vec<u8>, start: usize| (b.as_ptr() as usize + start) % SIMD_ALIGN == 0;
        if self.bytes.len() < self.start + len || !aligned(&self.bytes, self.start) {
            self.bytes = vec![0u8; len + SIMD_ALIGN];
            let misalign = self.bytes.as_ptr() as usize % SIMD_ALIGN;
            self.start = (SIMD_ALIGN - misalign) % SIMD_ALIGN;
        }
        &mut self.bytes[self.start..self.start + len]
    }
}

/// An owned swscale context plus reusable staging buffers.
pub(crate) struct Scaler {
    ctx: NonNull<ffi::SwsContext>,
    src: (ffi::AVPixelFormat, u32, u32),
    dst: FrameLayout,
    stage_src: AlignedBuf,
    stage_dst: AlignedBuf,
    /// NV12 source fed to a YUV420P-configured context after de-interleaving the chroma
    /// (swscale's fast unscaled YUV -> RGB converters exist only for planar input: NV12 ->
    /// RGBA at 3840x2160 takes ~15 ms through the generic path, ~2-3 ms this way).
    nv12_as_planar: bool,
    stage_uv: AlignedBuf,
}

// SAFETY: an SwsContext is only used through `&mut self`, so never from two threads at once,
// and libswscale keeps no thread-affine state in it.
unsafe impl Send for Scaler {}

impl Drop for Scaler {
    fn drop(&mut self) {
        // SAFETY: ctx came from sws_getContext and is freed exactly once.
        unsafe { ffi::sws_freeContext(self.ctx.as_ptr()) }
    }
}

impl Scaler {
    /// A scaler from an FFmpeg pixel format of `sw x sh` to `dst` (format and size; the
    /// stride of `dst` is not part of the configuration).
    pub(crate) fn new(
        src_fmt: ffi::AVPixelFormat,
        sw: u32,
        sh: u32,
        dst: FrameLayout,
        filter: ScaleFilter,
    ) -> Result<Self> {
        dst.validate()?;
        if sw == 0
            || sh == 0
            || sw > crate::frame::MAX_DIMENSION
            || sh > crate::frame::MAX_DIMENSION
        {
            return Err(MediaError::InvalidLayout(format!(
                "scaler source size {sw}x{sh}"
            )));
        }
        // SAFETY: plain constructor call with valid sizes and formats; NULL is checked.
        let ctx = unsafe {
            ffi::sws_getContext(
                sw as c_int,
                sh as c_int,
                src_fmt,
                dst.width as c_int,
                dst.height as c_int,
                av_format(dst.format),
                filter.flags(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null(),
            )
        };
        let ctx = NonNull::new(ctx).ok_or_else(|| {
            MediaError::Unsupported(format!(
                "swscale cannot convert {src_fmt:?} {sw}x{sh} to {:?} {}x{}",
                dst.format, dst.width, dst.height
            ))
        })?;
        Ok(Scaler {
            ctx,
            src: (src_fmt, sw, sh),
            dst,
            stage_src: AlignedBuf::default(),
            stage_dst: AlignedBuf::default(),
            nv12_as_planar: false,
            stage_uv: AlignedBuf::default(),
        })
    }

    /// A scaler between two of our layouts.
    pub(crate) fn for_layouts(
        src: FrameLayout,
        dst: FrameLayout,
        filter: ScaleFilter,
    ) -> Result<Self> {
        src.validate()?;
        let nv12_as_planar = src.format == PixelFormat::Nv12
            && !dst.format.is_yuv()
            && filter == ScaleFilter::Bilinear;
        if nv12_as_planar {
            let mut s = Self::new(
                ffi::AVPixelFormat::AV_PIX_FMT_YUV420P,
                src.width,
                src.height,
                dst,
                filter,
            )?;
            s.src.0 = av_format(PixelFormat::Nv12);
            s.nv12_as_planar = true;
            return Ok(s);
        }
        Self::new(av_format(src.format), src.width, src.height, dst, filter)
    }

    fn check_dst(&self, dst: &FrameMut<'_>) -> Result<()> {
        dst.validate()?;
        let d = dst.layout;
        if (d.format, d.width, d.height) != (self.dst.format, self.dst.width, self.dst.height) {
            return Err(MediaError::InvalidLayout(format!(
                "scaler configured for {:?}, got {d:?}",
                self.dst
            )));
        }
        Ok(())
    }

    /// Runs swscale on raw plane pointers.
    ///
    /// # Safety
    /// The pointers and strides must describe planes valid for the configured source format
    /// and size, and the destination planes must be valid for writes of the configured
    /// destination, including swscale's possible touches past the row ends.
    unsafe fn run(
        &mut self,
        src: &[*const u8; 4],
        src_stride: &[c_int; 4],
        dst: &[*mut u8; 4],
        dst_stride: &[c_int; 4],
    ) -> Result<()> {
        // SAFETY: forwarded from the caller's contract.
        let r = unsafe {
            ffi::sws_scale(
                self.ctx.as_ptr(),
                src.as_ptr(),
                src_stride.as_ptr(),
                0,
                self.src.2 as c_int,
                dst.as_ptr(),
                dst_stride.as_ptr(),
            )
        };
        if r < 0 {
            return Err(MediaError::ffmpeg("sws_scale", ffmpeg_next::Error::from(r)));
        }
        Ok(())
    }

    /// Scales from raw source planes (e.g. a decoder's AVFrame, which FFmpeg pads and aligns)
    /// into `dst`, directly when `dst` is aligned for swscale, else through a staging buffer.
    ///
    /// # Safety
    /// `src`/`src_stride` must describe readable planes of the configured source format and
    /// size, aligned and padded the way FFmpeg aligns and pads its own frames.
    pub(crate) unsafe fn scale_raw_into(
        &mut self,
        src: &[*const u8; 4],
        src_stride: &[c_int; 4],
        mut dst: FrameMut<'_>,
    ) -> Result<()> {
        self.check_dst(&dst)?;
        if direct_ok(&dst.layout, dst.data.as_ptr()) {
            let (offs, strides) = plane_arrays(&dst.layout);
            let base = dst.data.as_mut_ptr();
            let mut ptrs = [std::ptr::null_mut(); 4];
            for i in 0..dst.layout.planes().len() {
                // SAFETY: offsets are inside the validated buffer.
                ptrs[i] = unsafe { base.add(offs[i]) };
            }
            // SAFETY: caller guarantees the source; the destination was validated and is
            // aligned with whole-vector rows.
            return unsafe { self.run(src, src_stride, &ptrs, &strides) };
        }
        let stage = staging_layout(&dst.layout);
        let mut staged = std::mem::take(&mut self.stage_dst);
        let buf = staged.get(stage.size() + STAGING_TAIL);
        let (offs, strides) = plane_arrays(&stage);
        let base = buf.as_mut_ptr();
        let mut ptrs = [std::ptr::null_mut(); 4];
        for i in 0..stage.planes().len() {
            // SAFETY: offsets are inside `buf`.
            ptrs[i] = unsafe { base.add(offs[i]) };
        }
        // SAFETY: the caller guarantees the source; the staging buffer is aligned and padded.
        let r = unsafe { self.run(src, src_stride, &ptrs, &strides) };
        let r = r.and_then(|()| copy_frame(FrameRef::new(stage, buf)?, dst.reborrow()));
        self.stage_dst = staged;
        r
    }

    /// Scales `src` (whose format and size must match the configuration) into `dst`.
    pub(crate) fn scale(&mut self, src: FrameRef<'_>, dst: FrameMut<'_>) -> Result<()> {
        src.validate()?;
        let s = src.layout;
        if (av_format(s.format), s.width, s.height) != self.src {
            return Err(MediaError::InvalidLayout(format!(
                "scaler configured for source {:?}, got {s:?}",
                self.src
            )));
        }
        if self.nv12_as_planar {
            return self.scale_nv12_as_planar(src, dst);
        }
        if direct_ok(&s, src.data.as_ptr()) {
            return self.scale_from(s, src.data, dst);
        }
        let stage = staging_layout(&s);
        let mut staged = std::mem::take(&mut self.stage_src);
        let buf = staged.get(stage.size() + STAGING_TAIL);
        let r = copy_frame(src, FrameMut::new(stage, buf)?)
            .and_then(|()| self.scale_from(stage, buf, dst));
        self.stage_src = staged;
        r
    }

    /// NV12 through the YUV420P-configured context: the chroma is de-interleaved into an
    /// aligned scratch buffer, and the luma plane is used in place when it is aligned for
    /// swscale, else copied next to the chroma.
    fn scale_nv12_as_planar(&mut self, src: FrameRef<'_>, dst: FrameMut<'_>) -> Result<()> {
        let s = src.layout;
        let (Some(yp), Some(uvp)) = (s.plane(0), s.plane(1)) else {
            return Err(MediaError::InvalidLayout(format!("{s:?} is not NV12")));
        };
        let (w, h) = (s.width as usize, s.height as usize);
        let (cw, ch) = (w / 2, h / 2);
        let cstride = cw.div_ceil(SIMD_ALIGN) * SIMD_ALIGN;
        let y_in_place = (src.data.as_ptr() as usize + yp.offset) % SIMD_ALIGN == 0
            && yp.stride % SIMD_ALIGN == 0
            && yp.row_bytes() % SIMD_ALIGN == 0;
        let ystride = if y_in_place {
            0
        } else {
            w.div_ceil(SIMD_ALIGN) * SIMD_ALIGN
        };
        let chroma_at = ystride * h;
        let mut staged = std::mem::take(&mut self.stage_uv);
        let buf = staged.get(chroma_at + 2 * cstride * ch + STAGING_TAIL);
        {
            let (y_plane, rest) = buf.split_at_mut(chroma_at);
            if !y_in_place {
                for row in 0..h {
                    y_plane[row * ystride..][..w]
                        .copy_from_slice(&src.data[yp.offset + row * yp.stride..][..w]);
                }
            }
            let (u_plane, rest) = rest.split_at_mut(cstride * ch);
            let v_plane = &mut rest[..cstride * ch];
            for row in 0..ch {
                let srow = &src.data[uvp.offset + row * uvp.stride..][..2 * cw];
                let urow = &mut u_plane[row * cstride..][..cw];
                let vrow = &mut v_plane[row * cstride..][..cw];
                for ((pair, u), v) in srow
                    .chunks_exact(2)
                    .zip(urow.iter_mut())
                    .zip(vrow.iter_mut())
                {
                    *u = pair[0];
                    *v = pair[1];
                }
            }
        }
        let (y_ptr, y_stride) = if y_in_place {
            (src.data[yp.offset..].as_ptr(), yp.stride)
        } else {
            (buf.as_ptr(), ystride)
        };
        let ptrs = [
            y_ptr,
            buf[chroma_at..].as_ptr(),
            buf[chroma_at + cstride * ch..].as_ptr(),
            std::ptr::null(),
        ];
        let strides = [y_stride as c_int, cstride as c_int, cstride as c_int, 0];
        // SAFETY: the luma plane lies in the validated source and is aligned with
        // whole-vector rows, or in the aligned scratch buffer like the chroma planes, which
        // is padded past its last row.
        let r = unsafe { self.scale_raw_into(&ptrs, &strides, dst) };
        self.stage_uv = staged;
        r
    }

    fn scale_from(&mut self, layout: FrameLayout, data: &[u8], dst: FrameMut<'_>) -> Result<()> {
        let (offs, strides) = plane_arrays(&layout);
        let mut ptrs = [std::ptr::null(); 4];
        for i in 0..layout.planes().len() {
            ptrs[i] = data[offs[i]..].as_ptr();
        }
        // SAFETY: the planes lie inside `data` (validated and aligned, or staged with
        // alignment and padding).
        unsafe { self.scale_raw_into(&ptrs, &strides, dst) }
    }
}
