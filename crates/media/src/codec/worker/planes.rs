//! The parent's side of a picture a worker's libavcodec decoded straight into a shared
//! buffer (`direct`): checking that the 4:2:0 planes the worker names lie in the buffer
//! ([`check_planes`]), and the one copy of them into a guest's NV12 or YUV420P frame
//! ([`copy_planes`]: row by row, chroma interleaved for NV12).

use crate::error::{MediaError, Result};
use crate::frame::{FrameMut, PixelFormat};
use crate::worker::wire::bad;

/// The rows and bytes per row of each 4:2:0 plane of a `w` x `h` picture (even sizes).
fn extents(w: usize, h: usize) -> [(usize, usize); 3] {
    [(h, w), (h / 2, w / 2), (h / 2, w / 2)]
}

/// Checks that the planes `(offset, stride)` of a 4:2:0 picture of `w` x `h` lie within a
/// buffer of `len` bytes (a stride at least a row, the last row's end inside).
pub(crate) fn check_planes(len: usize, planes: &[(usize, usize); 3], w: u32, h: u32) -> Result<()> {
    for (&(off, stride), (rows, row)) in planes.iter().zip(extents(w as usize, h as usize)) {
        if rows == 0 || row == 0 {
            return Err(bad("empty plane"));
        }
        let end = (stride >= row)
            .then(|| {
                stride
                    .checked_mul(rows - 1)?
                    .checked_add(off)?
                    .checked_add(row)
            })
            .flatten();
        if !end.is_some_and(|e| e <= len) {
            return Err(bad("plane outside its buffer"));
        }
    }
    Ok(())
}

/// Copies a 4:2:0 picture whose planes lie in `bytes` at `planes` into `dst` (YUV420P: plane
/// by plane; NV12: the chroma planes interleaved), `dst`'s size.
pub(crate) fn copy_planes(
    bytes: &[u8],
    planes: &[(usize, usize); 3],
    dst: FrameMut<'_>,
) -> Result<()> {
    dst.validate()?;
    let l = dst.layout;
    check_planes(bytes.len(), planes, l.width, l.height)?;
    let dp = l.planes();
    let [(rows, w), (crows, cw), _] = extents(l.width as usize, l.height as usize);
    let row = |p: usize, r: usize, n: usize| -> Result<&[u8]> {
        let (off, stride) = planes[p];
        bytes
            .get(off + r * stride..off + r * stride + n)
            .ok_or_else(|| bad("plane outside its buffer"))
    };
    let short = || MediaError::InvalidLayout("frame smaller than its layout".into());
    for r in 0..rows {
        let o = dp[0].offset + r * dp[0].stride;
        dst.data
            .get_mut(o..o + w)
            .ok_or_else(short)?
            .copy_from_slice(row(0, r, w)?);
    }
    match l.format {
        PixelFormat::Yuv420p => {
            for (p, d) in dp.iter().enumerate().skip(1) {
                for r in 0..crows {
                    let o = d.offset + r * d.stride;
                    dst.data
                        .get_mut(o..o + cw)
                        .ok_or_else(short)?
                        .copy_from_slice(row(p, r, cw)?);
                }
            }
        }
        PixelFormat::Nv12 => {
            for r in 0..crows {
                let (u, v) = (row(1, r, cw)?, row(2, r, cw)?);
                let o = dp[1].offset + r * dp[1].stride;
                let d = dst.data.get_mut(o..o + 2 * cw).ok_or_else(short)?;
                for ((d, u), v) in d.chunks_exact_mut(2).zip(u).zip(v) {
                    d[0] = *u;
                    d[1] = *v;
                }
            }
        }
        f => {
            return Err(MediaError::Unsupported(format!(
                "a decoded 4:2:0 picture into {f:?}"
            )))
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::FrameLayout;

    /// A 4x2 picture in a buffer with padded rows: Y rows of stride 8 at 0, U and V rows of
    /// stride 4 at 16 and 20.
    fn buffer() -> (Vec<u8>, [(usize, usize); 3]) {
        let mut b = vec![0u8; 24];
        b[..4].copy_from_slice(&[1, 2, 3, 4]);
        b[8..12].copy_from_slice(&[5, 6, 7, 8]);
        b[16..18].copy_from_slice(&[10, 11]);
        b[20..22].copy_from_slice(&[20, 21]);
        (b, [(0, 8), (16, 4), (20, 4)])
    }

    #[test]
    fn planes_become_nv12_and_yuv420p() {
        let (b, planes) = buffer();
        let l = FrameLayout::packed(PixelFormat::Nv12, 4, 2).unwrap();
        let mut out = vec![0u8; l.size()];
        copy_planes(&b, &planes, FrameMut::new(l, &mut out).unwrap()).unwrap();
        assert_eq!(out, [1, 2, 3, 4, 5, 6, 7, 8, 10, 20, 11, 21]);
        let l = FrameLayout::packed(PixelFormat::Yuv420p, 4, 2).unwrap();
        let mut out = vec![0u8; l.size()];
        copy_planes(&b, &planes, FrameMut::new(l, &mut out).unwrap()).unwrap();
        assert_eq!(out, [1, 2, 3, 4, 5, 6, 7, 8, 10, 11, 20, 21]);
    }

    #[test]
    fn planes_outside_the_buffer_are_refused() {
        let (b, planes) = buffer();
        assert!(check_planes(b.len(), &planes, 4, 2).is_ok());
        assert!(
            check_planes(b.len(), &planes, 10, 2).is_err(),
            "rows longer than strides"
        );
        assert!(check_planes(21, &planes, 4, 2).is_err(), "V past the end");
        assert!(check_planes(b.len(), &[(0, 8), (16, 4), (usize::MAX, 4)], 4, 2).is_err());
        assert!(check_planes(b.len(), &[(0, 1), (16, 4), (20, 4)], 4, 2).is_err());
        let l = FrameLayout::packed(PixelFormat::Nv12, 4, 4).unwrap();
        let mut out = vec![0u8; l.size()];
        assert!(copy_planes(&b, &planes, FrameMut::new(l, &mut out).unwrap()).is_err());
    }
}
