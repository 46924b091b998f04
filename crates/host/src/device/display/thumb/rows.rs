//! A plane's samples a picture row at a time, and rows of RGB samples turned into the
//! picture's full-range Y, U and V.
//!
//! A row's samples are gathered first (one 4-byte load each, into a reused buffer), then
//! converted in loops over plain slices that the compiler vectorizes: the texels come from a
//! frame another core just wrote, so the reads are what a view picture mostly costs, and
//! the per-texel work must not add to them. Luma is taken from every sample, chroma from
//! the samples at even picture positions of even rows (4:2:0).

use virtsoc_gpu::{PlaneInfo, SampleAxis};

/// Full-range Y, Cb, Cr of an RGB pixel (JFIF's BT.601), in 16-bit fixed point.
#[inline]
pub(super) fn rgb_to_yuv(r: u8, g: u8, b: u8) -> (u8, u8, u8) {
    let (r, g, b) = (i32::from(r), i32::from(g), i32::from(b));
    let y = (19595 * r + 38470 * g + 7471 * b + 32768) >> 16;
    let u = ((-11056 * r - 21712 * g + 32768 * b + 32768) >> 16) + 128;
    let v = ((32768 * r - 27440 * g - 5328 * b + 32768) >> 16) + 128;
    (
        y.clamp(0, 255) as u8,
        u.clamp(0, 255) as u8,
        v.clamp(0, 255) as u8,
    )
}

/// Full-range Y of an RGB pixel, as [`rgb_to_yuv`] gives it.
#[inline]
pub(super) fn rgb_to_luma(r: u8, g: u8, b: u8) -> u8 {
    ((19595 * u32::from(r) + 38470 * u32::from(g) + 7471 * u32::from(b) + 32768) >> 16) as u8
}

/// `src` over `dst` with coverage `a` (0..=255): `dst` unchanged at 0, `src` at 255. No
/// branch, so that loops of it vectorize.
#[inline]
pub(super) fn mix(dst: &mut u8, src: u8, a: u32) {
    *dst = ((u32::from(src) * a + u32::from(*dst) * (255 - a) + 127) / 255) as u8;
}

/// R, G, B of a gathered sample.
#[inline]
fn rgb(p: u32) -> (u8, u8, u8) {
    (p as u8, (p >> 8) as u8, (p >> 16) as u8)
}

/// Coverage (0..=255) of a gathered RGBA sample in a plane of alpha `alpha` (0..=255).
#[inline]
pub(super) fn cover(p: u32, alpha: u32) -> u32 {
    (p >> 24) * alpha / 255
}

/// Luma of RGB samples `px` into `dst` (one each): written when the plane is opaque
/// (`alpha` `None`), else blended by each sample's coverage.
pub(super) fn luma_row(px: &[u32], dst: &mut [u8], alpha: Option<u32>) {
    let pairs = dst.iter_mut().zip(px);
    match alpha {
        None => pairs.for_each(|(d, &p)| {
            let (r, g, b) = rgb(p);
            *d = rgb_to_luma(r, g, b);
        }),
        Some(alpha) => pairs.for_each(|(d, &p)| {
            let (r, g, b) = rgb(p);
            mix(d, rgb_to_luma(r, g, b), cover(p, alpha));
        }),
    }
}

/// Chroma of RGB samples `px` into `u` and `v` (one each), written or blended as
/// [`luma_row`].
pub(super) fn chroma_row(px: &[u32], u: &mut [u8], v: &mut [u8], alpha: Option<u32>) {
    let triples = u.iter_mut().zip(v.iter_mut()).zip(px);
    let uv = |p: u32| {
        let (r, g, b) = rgb(p);
        let (_, cu, cv) = rgb_to_yuv(r, g, b);
        (cu, cv)
    };
    match alpha {
        None => triples.for_each(|((du, dv), &p)| (*du, *dv) = uv(p)),
        Some(alpha) => triples.for_each(|((du, dv), &p)| {
            let ((cu, cv), a) = (uv(p), cover(p, alpha));
            mix(du, cu, a);
            mix(dv, cv, a);
        }),
    }
}

/// Every other sample of `px` from `first` into `out` (emptied first): the samples that
/// give chroma.
pub(super) fn every_other(px: &[u32], first: usize, out: &mut Vec<u32>) {
    out.clear();
    out.extend(px.iter().skip(first).step_by(2));
}

/// The samples of one plane on a grid, where they are.
pub(super) enum Samples<'a> {
    /// Packed by the GPU: 4 bytes per sample, row by row.
    Packed { data: &'a [u8], width: usize },
    /// In host memory, read in place: sample (i, j) is the texel at `rows[j] + columns[i]`.
    Host {
        bytes: &'a [u8],
        rows: Vec<usize>,
        columns: Vec<usize>,
        bpp: usize,
        bgra: bool,
    },
}

/// The `N` bytes at `at` of `row`.
#[inline]
fn texel<const N: usize>(row: &[u8], at: usize) -> [u8; N] {
    let mut t = [0u8; N];
    t.copy_from_slice(&row[at..at + N]);
    t
}

impl Samples<'_> {
    /// Host samples of `info` on the grid `x` by `y` in `bytes` (`None` if the frame is short).
    pub(super) fn host<'b>(
        bytes: &'b [u8],
        info: &PlaneInfo,
        (x, y): (SampleAxis, SampleAxis),
        bgra: bool,
    ) -> Option<Samples<'b>> {
        let bpp = info.bytes_per_texel;
        let columns: Vec<usize> = (0..x.count).map(|i| x.texel(i) as usize * bpp).collect();
        let rows: Vec<usize> = (0..y.count)
            .map(|j| info.offset + y.texel(j) as usize * info.stride)
            .collect();
        // Every texel the grid names is inside `bytes`.
        let last = rows.iter().max()? + columns.iter().max()? + bpp;
        (last <= bytes.len()).then_some(Samples::Host {
            bytes,
            rows,
            columns,
            bpp,
            bgra,
        })
    }

    /// The samples of row `j` into `out` (emptied first), one `u32` each holding the texel's
    /// bytes from the lowest up: R, G, B, A (BGRA is swapped); luma in the lowest byte; NV12
    /// chroma in the two lowest. Nothing when the row is missing.
    pub(super) fn gather(&self, j: usize, out: &mut Vec<u32>) {
        out.clear();
        match self {
            Samples::Packed { data, width } => {
                let row = data
                    .get(j * width * 4..(j + 1) * width * 4)
                    .unwrap_or_default();
                out.extend(row.chunks_exact(4).map(|p| u32::from_le_bytes(texel(p, 0))));
            }
            Samples::Host {
                bytes,
                rows,
                columns,
                bpp,
                bgra,
            } => {
                let Some(row) = rows.get(j).and_then(|&base| bytes.get(base..)) else {
                    return;
                };
                // One loop per texel size, so each texel is one fixed-size load.
                let at = columns.iter();
                match (*bpp, *bgra) {
                    (4, false) => out.extend(at.map(|&c| u32::from_le_bytes(texel(row, c)))),
                    (4, true) => out.extend(at.map(|&c| {
                        let [b, g, r, a] = texel(row, c);
                        u32::from_le_bytes([r, g, b, a])
                    })),
                    (2, _) => out.extend(at.map(|&c| u32::from(u16::from_le_bytes(texel(row, c))))),
                    _ => out.extend(at.map(|&c| u32::from(row[c]))),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Mixing is exact at no and full coverage, for every pair of values.
    #[test]
    fn mixing_keeps_or_replaces_exactly() {
        for s in 0..=255u8 {
            for d in 0..=255u8 {
                let (mut kept, mut replaced) = (d, d);
                mix(&mut kept, s, 0);
                mix(&mut replaced, s, 255);
                assert_eq!((kept, replaced), (d, s));
            }
        }
    }

    /// Rows convert as the per-pixel functions do, opaque or blended, chroma from every other
    /// sample from the first one asked for.
    #[test]
    fn rows_convert_like_pixels() {
        let px: Vec<u32> = (0..9u32)
            .map(|k| {
                u32::from_le_bytes([
                    (k * 29) as u8,
                    (k * 71) as u8,
                    (k * 13) as u8,
                    (k * 31) as u8,
                ])
            })
            .collect();
        let mut luma = [9u8; 9];
        luma_row(&px, &mut luma, None);
        for (k, &p) in px.iter().enumerate() {
            let (r, g, b) = rgb(p);
            assert_eq!(luma[k], rgb_to_luma(r, g, b));
        }
        let mut blended = [200u8; 9];
        luma_row(&px, &mut blended, Some(128));
        for (k, &p) in px.iter().enumerate() {
            let (r, g, b) = rgb(p);
            let mut want = 200u8;
            mix(&mut want, rgb_to_luma(r, g, b), (p >> 24) * 128 / 255);
            assert_eq!(blended[k], want, "sample {k}");
        }
        let mut odd = vec![5];
        every_other(&px, 1, &mut odd);
        assert_eq!(odd, [px[1], px[3], px[5], px[7]]);
        let (mut u, mut v) = ([0u8; 4], [0u8; 4]);
        chroma_row(&odd, &mut u, &mut v, None);
        let (mut bu, mut bv) = ([60u8; 4], [190u8; 4]);
        chroma_row(&odd, &mut bu, &mut bv, Some(200));
        for (i, &p) in odd.iter().enumerate() {
            let (r, g, b) = rgb(p);
            let (_, cu, cv) = rgb_to_yuv(r, g, b);
            assert_eq!((u[i], v[i]), (cu, cv), "chroma {i}");
            let (mut wu, mut wv) = (60u8, 190u8);
            mix(&mut wu, cu, cover(p, 200));
            mix(&mut wv, cv, cover(p, 200));
            assert_eq!((bu[i], bv[i]), (wu, wv), "blended chroma {i}");
        }
    }

    /// Gathered samples hold the texels the grid names, BGRA swapped to RGBA, two-byte
    /// texels in the two lowest bytes.
    #[test]
    fn samples_are_gathered_in_rgba_order() {
        let bytes: Vec<u8> = (0..64u8).collect();
        let grid = |bpp: usize, bgra: bool| Samples::Host {
            bytes: &bytes,
            rows: vec![0, 32],
            columns: vec![0, 2 * bpp],
            bpp,
            bgra,
        };
        let mut out = vec![7];
        grid(4, false).gather(1, &mut out);
        assert_eq!(
            out,
            [
                u32::from_le_bytes([32, 33, 34, 35]),
                u32::from_le_bytes([40, 41, 42, 43])
            ]
        );
        grid(4, true).gather(0, &mut out);
        assert_eq!(out[0], u32::from_le_bytes([2, 1, 0, 3]));
        grid(2, false).gather(0, &mut out);
        assert_eq!(out, [0x0100, 0x0504]);
        grid(1, false).gather(1, &mut out);
        assert_eq!(out, [32, 34]);
        grid(1, false).gather(2, &mut out);
        assert!(out.is_empty(), "a missing row has no samples");
        let packed = Samples::Packed {
            data: &bytes[..16],
            width: 2,
        };
        packed.gather(1, &mut out);
        assert_eq!(
            out,
            [
                u32::from_le_bytes([8, 9, 10, 11]),
                u32::from_le_bytes([12, 13, 14, 15])
            ]
        );
    }
}
