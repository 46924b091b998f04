//! Frame descriptions shared by every backend, from the `virtsoc-frame` crate:
//! [`PixelFormat`], [`FrameLayout`] and the borrowed views [`FrameRef`] / [`FrameMut`] over
//! plain byte buffers (see that crate for the plane layout of each format), plus
//! [`copy_frame`].
//!
//! A frame error ([`FrameError`]) reaches callers of this crate as [`MediaError::Frame`].

pub use virtsoc_frame::{
    FrameError, FrameLayout, FrameMut, FrameRef, OwnedFrame, PixelFormat, PlaneInfo, MAX_DIMENSION,
};

use crate::error::{MediaError, Result};

/// Copies `src` into `dst` row by row; both must have the same format, width and height
/// (strides may differ).
pub fn copy_frame(src: FrameRef<'_>, dst: FrameMut<'_>) -> Result<()> {
    src.validate()?;
    dst.validate()?;
    let (s, d) = (src.layout, dst.layout);
    if s.format != d.format || s.width != d.width || s.height != d.height {
        return Err(MediaError::Unsupported(format!(
            "copy needs equal format and size, got {s:?} -> {d:?}"
        )));
    }
    for (sp, dp) in s.planes().into_iter().zip(d.planes()) {
        if sp.stride == dp.stride {
            let n = sp.len();
            dst.data[dp.offset..dp.offset + n].copy_from_slice(&src.data[sp.offset..sp.offset + n]);
            continue;
        }
        for row in 0..sp.rows() {
            let so = sp.offset + row * sp.stride;
            let dof = dp.offset + row * dp.stride;
            dst.data[dof..dof + sp.row_bytes()].copy_from_slice(&src.data[so..so + sp.row_bytes()]);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_across_strides_and_refuses_mismatches() {
        let packed = FrameLayout::packed(PixelFormat::Nv12, 4, 2).unwrap();
        let padded = FrameLayout::with_stride(PixelFormat::Nv12, 4, 2, 6).unwrap();
        let src: Vec<u8> = (0..packed.size() as u8).collect();
        let mut dst = vec![0xAA; padded.size()];
        let s = FrameRef::new(packed, &src).unwrap();
        copy_frame(s, FrameMut::new(padded, &mut dst).unwrap()).unwrap();
        assert_eq!(
            dst,
            [0, 1, 2, 3, 0xAA, 0xAA, 4, 5, 6, 7, 0xAA, 0xAA, 8, 9, 10, 11, 0xAA, 0xAA]
        );
        let rgba = FrameLayout::packed(PixelFormat::Rgba8, 4, 2).unwrap();
        let mut out = vec![0; rgba.size()];
        assert!(matches!(
            copy_frame(s, FrameMut::new(rgba, &mut out).unwrap()),
            Err(MediaError::Unsupported(_))
        ));
    }
}
