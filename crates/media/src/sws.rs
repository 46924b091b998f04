//! A small owned wrapper around libswscale's `SwsContext` that scales between plain byte
//! buffers described by [`FrameLayout`]s (crate-internal; used by the ISP, the decoder's output
//! conversion and the file camera).
//!
//! swscale's SIMD paths may touch a few bytes past a row's last pixel when widths are not a
//! multiple of 16, so such frames are staged through internally owned, padded buffers; frames
//! whose widths are multiples of 16 are converted in place without extra copies.

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

/// True if swscale may read/write this layout in place (see module docs).
fn direct_ok(layout: &FrameLayout) -> bool {
    layout.width % 16 == 0
}

/// A padded copy of a layout for staging.
fn staging_layout(layout: &FrameLayout) -> FrameLayout {
    let row = layout.width * layout.format.luma_bytes_per_pixel();
    let stride = row.div_ceil(64) * 64;
    FrameLayout { stride, ..*layout }
}

/// Extra bytes after a staged frame so that over-reads past the last row stay in bounds.
const STAGING_TAIL: usize = 256;

/// An owned swscale context plus reusable staging buffers.
pub(crate) struct Scaler {
    ctx: NonNull<ffi::SwsContext>,
    src: (ffi::AVPixelFormat, u32, u32),
    dst: FrameLayout,
    stage_src: Vec<u8>,
    stage_dst: Vec<u8>,
    /// NV12 source fed to a YUV420P-configured context after de-interleaving the chroma
    /// (swscale's fast unscaled YUV -> RGB converters exist only for planar input: NV12 ->
    /// RGBA at 3840x2160 takes ~15 ms through the generic path, ~2-3 ms this way).
    nv12_as_planar: bool,
    stage_uv: Vec<u8>,
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
            stage_src: Vec::new(),
            stage_dst: Vec::new(),
            nv12_as_planar: false,
            stage_uv: Vec::new(),
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
            && direct_ok(&src)
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

    /// Scales from raw source planes (e.g. a decoder's AVFrame, which FFmpeg pads) into `dst`.
    ///
    /// # Safety
    /// `src`/`src_stride` must describe readable planes of the configured source format and
    /// size, padded the way FFmpeg pads its own frames.
    pub(crate) unsafe fn scale_raw_into(
        &mut self,
        src: &[*const u8; 4],
        src_stride: &[c_int; 4],
        mut dst: FrameMut<'_>,
    ) -> Result<()> {
        self.check_dst(&dst)?;
        if direct_ok(&dst.layout) {
            let (offs, strides) = plane_arrays(&dst.layout);
            let base = dst.data.as_mut_ptr();
            let n = dst.layout.planes().len();
            let mut ptrs = [std::ptr::null_mut(); 4];
            for i in 0..n {
                // SAFETY: offsets are inside the validated buffer.
                ptrs[i] = unsafe { base.add(offs[i]) };
            }
            // SAFETY: caller guarantees the source; the destination was validated.
            return unsafe { self.run(src, src_stride, &ptrs, &strides) };
        }
        let stage = staging_layout(&dst.layout);
        let mut buf = std::mem::take(&mut self.stage_dst);
        buf.resize(stage.size() + STAGING_TAIL, 0);
        let (offs, strides) = plane_arrays(&stage);
        let base = buf.as_mut_ptr();
        let mut ptrs = [std::ptr::null_mut(); 4];
        for i in 0..stage.planes().len() {
            // SAFETY: offsets are inside `buf`.
            ptrs[i] = unsafe { base.add(offs[i]) };
        }
        // SAFETY: the caller guarantees the source; the staging buffer is padded.
        let r = unsafe { self.run(src, src_stride, &ptrs, &strides) };
        let r = r.and_then(|()| copy_frame(FrameRef::new(stage, &buf)?, dst.reborrow()));
        self.stage_dst = buf;
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
        if direct_ok(&s) {
            return self.scale_from(s, src.data, dst);
        }
        let stage = staging_layout(&s);
        let mut buf = std::mem::take(&mut self.stage_src);
        buf.resize(stage.size() + STAGING_TAIL, 0);
        let r = copy_frame(src, FrameMut::new(stage, &mut buf)?)
            .and_then(|()| self.scale_from(stage, &buf, dst));
        self.stage_src = buf;
        r
    }

    fn scale_nv12_as_planar(&mut self, src: FrameRef<'_>, dst: FrameMut<'_>) -> Result<()> {
        let s = src.layout;
        let (cw, ch) = (s.width as usize / 2, s.height as usize / 2);
        let cstride = cw.div_ceil(64) * 64;
        let mut uv = std::mem::take(&mut self.stage_uv);
        uv.resize(2 * cstride * ch + STAGING_TAIL, 0);
        let (Some(yp), Some(uvp)) = (s.plane(0), s.plane(1)) else {
            return Err(MediaError::InvalidLayout(format!("{s:?} is not NV12")));
        };
        {
            let (u_plane, v_plane) = uv.split_at_mut(cstride * ch);
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
        let ptrs = [
            src.data[yp.offset..].as_ptr(),
            uv.as_ptr(),
            uv[cstride * ch..].as_ptr(),
            std::ptr::null(),
        ];
        let strides = [yp.stride as c_int, cstride as c_int, cstride as c_int, 0];
        // SAFETY: the Y plane lies in the validated source (width a multiple of 16, so no
        // over-read past its rows), the chroma planes in the padded scratch buffer.
        let r = unsafe { self.scale_raw_into(&ptrs, &strides, dst) };
        self.stage_uv = uv;
        r
    }

    fn scale_from(&mut self, layout: FrameLayout, data: &[u8], dst: FrameMut<'_>) -> Result<()> {
        let (offs, strides) = plane_arrays(&layout);
        let mut ptrs = [std::ptr::null(); 4];
        for i in 0..layout.planes().len() {
            ptrs[i] = data[offs[i]..].as_ptr();
        }
        // SAFETY: the planes lie inside `data` (validated, or staged with padding).
        unsafe { self.scale_raw_into(&ptrs, &strides, dst) }
    }
}
