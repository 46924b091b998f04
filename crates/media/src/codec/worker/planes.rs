//! The parent's side of a picture a worker's libavcodec decoded straight into a shared
//! buffer (`direct`): checking that the 4:2:0 planes the worker names lie in the buffer
//! ([`check_planes`]), the one copy of them into a guest's NV12 or YUV420P frame
//! ([`copy_planes`]: row by row, chroma interleaved for NV12), and any byte range of that
//! frame read straight from the planes ([`read_planes`], for a picture lent out as a
//! region's replica).

use crate::error::{MediaError, Result};
use crate::frame::{FrameLayout, FrameMut, PixelFormat};
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

/// Writes bytes `[j0, j1)` of an NV12 chroma row interleaved from the rows `u` and `v`
/// into `d` (`j1 - j0` bytes).
fn interleave(u: &[u8], v: &[u8], j0: usize, j1: usize, d: &mut [u8]) {
    let (mut j, mut o) = (j0, 0);
    if j % 2 == 1 && j < j1 {
        d[o] = v[j / 2];
        (j, o) = (j + 1, o + 1);
    }
    let pairs = (j1 - j) / 2;
    let (us, vs) = (&u[j / 2..j / 2 + pairs], &v[j / 2..j / 2 + pairs]);
    for ((d, u), v) in d[o..o + 2 * pairs].chunks_exact_mut(2).zip(us).zip(vs) {
        d[0] = *u;
        d[1] = *v;
    }
    (j, o) = (j + 2 * pairs, o + 2 * pairs);
    if j < j1 {
        d[o] = u[j / 2];
    }
}

/// Reads bytes `[offset, offset + dst.len())` of the picture whose 4:2:0 planes lie in
/// `bytes` at `planes`, as a frame of layout `l` (NV12 or YUV420P, its size) holds it, into
/// `dst`; bytes between rows and planes read as zero.
pub(crate) fn read_planes(
    bytes: &[u8],
    planes: &[(usize, usize); 3],
    l: FrameLayout,
    offset: usize,
    dst: &mut [u8],
) -> Result<()> {
    l.validate()?;
    check_planes(bytes.len(), planes, l.width, l.height)?;
    let end = offset
        .checked_add(dst.len())
        .filter(|e| *e <= l.size())
        .ok_or_else(|| MediaError::InvalidLayout("a range past the picture".into()))?;
    let nv12 = match l.format {
        PixelFormat::Nv12 => true,
        PixelFormat::Yuv420p => false,
        f => return Err(MediaError::Unsupported(format!("a 4:2:0 picture as {f:?}"))),
    };
    let src_row = |p: usize, r: usize, n: usize| -> Result<&[u8]> {
        let (off, stride) = planes[p];
        bytes
            .get(off + r * stride..off + r * stride + n)
            .ok_or_else(|| bad("plane outside its buffer"))
    };
    let mut at = offset;
    for (p, d) in l.planes().iter().enumerate() {
        if end <= d.offset || d.stride == 0 {
            continue;
        }
        let first = offset.saturating_sub(d.offset) / d.stride;
        let last = (end - d.offset).div_ceil(d.stride).min(d.rows());
        for r in first..last {
            let row = d.offset + r * d.stride;
            let (a, b) = (offset.max(row), end.min(row + d.row_bytes()));
            if a >= b {
                continue;
            }
            dst[at - offset..a - offset].fill(0);
            let out = &mut dst[a - offset..b - offset];
            let (j0, j1) = (a - row, b - row);
            if nv12 && p == 1 {
                let n = d.row_bytes() / 2;
                interleave(src_row(1, r, n)?, src_row(2, r, n)?, j0, j1, out);
            } else {
                out.copy_from_slice(&src_row(p, r, d.row_bytes())?[j0..j1]);
            }
            at = b;
        }
    }
    dst[at - offset..].fill(0);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// Every range of the frame reads as the same bytes of a whole copy, in both formats
    /// and with padded rows.
    #[test]
    fn any_range_reads_as_the_copy_holds_it() {
        let (b, planes) = buffer();
        for l in [
            FrameLayout::packed(PixelFormat::Nv12, 4, 2).unwrap(),
            FrameLayout::packed(PixelFormat::Yuv420p, 4, 2).unwrap(),
            FrameLayout::with_stride(PixelFormat::Nv12, 4, 2, 6).unwrap(),
        ] {
            let mut whole = vec![0u8; l.size()];
            copy_planes(&b, &planes, FrameMut::new(l, &mut whole).unwrap()).unwrap();
            for s in 0..=whole.len() {
                for e in s..=whole.len() {
                    let mut part = vec![0xaa; e - s];
                    read_planes(&b, &planes, l, s, &mut part).unwrap();
                    assert_eq!(part, whole[s..e], "{l:?} [{s}, {e})");
                }
            }
            let mut over = vec![0u8; 2];
            assert!(read_planes(&b, &planes, l, whole.len() - 1, &mut over).is_err());
        }
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
