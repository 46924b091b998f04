//! Sizes of the arrays GL calls read and write, computed from a call's arguments and the
//! state they depend on (pixel store alignment). One source for both sides of the stream:
//! the guest computes how many bytes to send, the host recomputes how many it must have
//! received (this file is a module of `virtsoc-gles-gen` and is copied into the guest's and
//! the host's generated code by their build scripts). Every function returns `None` for an
//! argument GL refuses (negative counts, unknown enums, overflow).

/// Bytes per pixel of a `format`/`type` pair of `glTexImage2D`/`glReadPixels`.
pub fn pixel_bytes(format: u32, ty: u32) -> Option<usize> {
    let comps = match format {
        0x1906 /* ALPHA */ | 0x1909 /* LUMINANCE */ | 0x1902 /* DEPTH_COMPONENT */ => 1,
        0x1903 /* RED_EXT */ | 0x8D94 /* RED_INTEGER */ | 0x1901 /* STENCIL_INDEX */ => 1,
        0x190A /* LUMINANCE_ALPHA */ | 0x8227 /* RG_EXT */ | 0x8228 /* RG_INTEGER */ => 2,
        0x84F9 /* DEPTH_STENCIL_OES */ => 1,
        0x1907 /* RGB */ | 0x8D98 /* RGB_INTEGER */ => 3,
        0x1908 /* RGBA */ | 0x80E1 /* BGRA_EXT */ | 0x8D99 /* RGBA_INTEGER */ => 4,
        _ => return None,
    };
    match ty {
        0x1401 /* UNSIGNED_BYTE */ | 0x1400 /* BYTE */ => Some(comps),
        0x1403 /* UNSIGNED_SHORT */ | 0x1402 /* SHORT */ => Some(comps * 2),
        0x8D61 /* HALF_FLOAT_OES */ | 0x140B /* HALF_FLOAT */ => Some(comps * 2),
        0x1404..=0x1406 /* INT, UNSIGNED_INT, FLOAT */ => Some(comps * 4),
        // Packed types: one value per pixel.
        0x8363 /* UNSIGNED_SHORT_5_6_5 */
        | 0x8033 /* UNSIGNED_SHORT_4_4_4_4 */
        | 0x8034 /* UNSIGNED_SHORT_5_5_5_1 */ => Some(2),
        0x84FA /* UNSIGNED_INT_24_8_OES */
        | 0x8368 /* UNSIGNED_INT_2_10_10_10_REV */
        | 0x8C3B /* UNSIGNED_INT_10F_11F_11F_REV */
        | 0x8C3E /* UNSIGNED_INT_5_9_9_9_REV */ => Some(4),
        0x8DAD /* FLOAT_32_UNSIGNED_INT_24_8_REV */ => Some(8),
        _ => None,
    }
}

/// Bytes of a `width` x `height` image of `format`/`type` whose rows start at multiples of
/// `alignment` (the `GL_PACK_ALIGNMENT`/`GL_UNPACK_ALIGNMENT` in force); the last row is not
/// padded, as GL reads it.
pub fn image_bytes(width: i64, height: i64, format: u32, ty: u32, alignment: i64) -> Option<usize> {
    if width < 0 || height < 0 || !matches!(alignment, 1 | 2 | 4 | 8) {
        return None;
    }
    let (w, h, a) = (width as usize, height as usize, alignment as usize);
    if w == 0 || h == 0 {
        return Some(0);
    }
    let px = pixel_bytes(format, ty)?;
    let row = w.checked_mul(px)?;
    let stride = row.checked_add(a - 1)? / a * a;
    stride.checked_mul(h - 1)?.checked_add(row)
}

/// The pixel store parameters of one direction (`GL_UNPACK_*` or `GL_PACK_*`): GLES 2.0 has
/// the alignment only, GLES 3.0 adds row length, image height and skips.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PixelStore {
    /// `*_ALIGNMENT` (1, 2, 4 or 8).
    pub alignment: i64,
    /// `*_ROW_LENGTH` (0: the width).
    pub row_length: i64,
    /// `UNPACK_IMAGE_HEIGHT` (0: the height).
    pub image_height: i64,
    /// `*_SKIP_PIXELS`.
    pub skip_pixels: i64,
    /// `*_SKIP_ROWS`.
    pub skip_rows: i64,
    /// `UNPACK_SKIP_IMAGES`.
    pub skip_images: i64,
}

impl Default for PixelStore {
    fn default() -> Self {
        PixelStore {
            alignment: 4,
            row_length: 0,
            image_height: 0,
            skip_pixels: 0,
            skip_rows: 0,
            skip_images: 0,
        }
    }
}

impl PixelStore {
    /// Sets `pname` (`GL_UNPACK_*`/`GL_PACK_*` of either direction) to `v`; `false` when
    /// `pname` is not a parameter of this direction or `v` is out of range.
    pub fn set(&mut self, pname: u32, v: i64) -> bool {
        if pname == 0x0CF5 || pname == 0x0D05 {
            if !matches!(v, 1 | 2 | 4 | 8) {
                return false;
            }
            self.alignment = v;
            return true;
        }
        if !(0..=(1 << 20)).contains(&v) {
            return false;
        }
        let field = match pname {
            0x0CF2 | 0x0D02 => &mut self.row_length, // UNPACK_/PACK_ROW_LENGTH
            0x806E => &mut self.image_height,        // UNPACK_IMAGE_HEIGHT
            0x0CF4 | 0x0D04 => &mut self.skip_pixels, // UNPACK_/PACK_SKIP_PIXELS
            0x0CF3 | 0x0D03 => &mut self.skip_rows,  // UNPACK_/PACK_SKIP_ROWS
            0x806D => &mut self.skip_images,         // UNPACK_SKIP_IMAGES
            _ => return false,
        };
        *field = v;
        true
    }
}

/// Whether `pname` is an unpack parameter (else a pack one, or neither).
pub fn is_unpack_param(pname: u32) -> bool {
    matches!(pname, 0x0CF5 | 0x0CF2 | 0x806E | 0x0CF4 | 0x0CF3 | 0x806D)
}

/// Whether `pname` is a pack parameter.
pub fn is_pack_param(pname: u32) -> bool {
    matches!(pname, 0x0D02..=0x0D05) // ROW_LENGTH, SKIP_ROWS, SKIP_PIXELS, ALIGNMENT
}

/// Bytes from the start of a pixel array to the end of the last pixel GL reads or writes
/// for a `width` x `height` x `depth` image of `format`/`type` with pixel store `ps`
/// (row length, image height and skips as GLES 3.0 defines them; the last row is not
/// padded).
pub fn image_bytes_3d(
    width: i64,
    height: i64,
    depth: i64,
    format: u32,
    ty: u32,
    ps: &PixelStore,
) -> Option<usize> {
    if width < 0 || height < 0 || depth < 0 || !matches!(ps.alignment, 1 | 2 | 4 | 8) {
        return None;
    }
    if width == 0 || height == 0 || depth == 0 {
        return Some(0);
    }
    let px = pixel_bytes(format, ty)? as u128;
    let (w, h, d) = (width as u128, height as u128, depth as u128);
    let row_px = if ps.row_length > 0 {
        ps.row_length as u128
    } else {
        w
    };
    let rows = if ps.image_height > 0 {
        ps.image_height as u128
    } else {
        h
    };
    let a = ps.alignment as u128;
    let stride = row_px.checked_mul(px)?.div_ceil(a) * a;
    let image = stride.checked_mul(rows)?;
    let end = (ps.skip_images as u128 + d - 1)
        .checked_mul(image)?
        .checked_add((ps.skip_rows as u128 + h - 1).checked_mul(stride)?)?
        .checked_add((ps.skip_pixels as u128 + w).checked_mul(px)?)?;
    usize::try_from(end).ok()
}

/// Values `glClearBuffer{i,ui,f}v(buffer)` reads: 4 for `GL_COLOR`, 1 for depth or stencil.
pub fn clear_buffer_count(buffer: u32) -> Option<usize> {
    match buffer {
        0x1800 => Some(4),          // COLOR
        0x1801 | 0x1802 => Some(1), // DEPTH, STENCIL
        _ => None,
    }
}

/// Values `glGet{Integer,Float,Boolean}v` writes for `pname` (GLES 2.0 and the extensions
/// we expose); 16 for unknown names is the largest any query writes, so a buffer of that
/// size is always safe.
pub fn get_count(pname: u32) -> usize {
    match pname {
        0x0B12 /* DEPTH_RANGE */ | 0x846D /* ALIASED_POINT_SIZE_RANGE */
        | 0x846E /* ALIASED_LINE_WIDTH_RANGE */ | 0x0D3A /* MAX_VIEWPORT_DIMS */ => 2,
        0x0C22 /* COLOR_CLEAR_VALUE */ | 0x0C23 /* COLOR_WRITEMASK */ | 0x0C10 /* SCISSOR_BOX */
        | 0x0BA2 /* VIEWPORT */ | 0x8005 /* BLEND_COLOR */ => 4,
        0x86A3 /* COMPRESSED_TEXTURE_FORMATS */ | 0x8DF8 /* SHADER_BINARY_FORMATS */ => 256,
        _ => 1,
    }
}

/// Values `glTexParameter{i,f}v`/`glGetTexParameter{i,f}v` read or write for `pname`
/// (`GL_TEXTURE_BORDER_COLOR`, which a newer host context takes, has 4).
pub fn tex_param_count(pname: u32) -> usize {
    if pname == 0x1004 {
        4
    } else {
        1
    }
}

/// Values `glGetVertexAttrib{i,f}v` writes for `pname`.
pub fn vertex_attrib_count(pname: u32) -> usize {
    if pname == 0x8626
    /* CURRENT_VERTEX_ATTRIB */
    {
        4
    } else {
        1
    }
}

/// Bytes of one component of a vertex attribute of `ty`.
pub fn attrib_type_bytes(ty: u32) -> Option<usize> {
    match ty {
        0x1400 | 0x1401 => Some(1),                   // BYTE, UNSIGNED_BYTE
        0x1402 | 0x1403 | 0x8D61 | 0x140B => Some(2), // SHORT, UNSIGNED_SHORT, HALF_FLOAT
        0x1404 | 0x1405 | 0x1406 | 0x140C => Some(4), // INT, UNSIGNED_INT, FLOAT, FIXED
        _ => None,
    }
}

/// Bytes of one index of `ty` (`glDrawElements`).
pub fn index_bytes(ty: u32) -> Option<usize> {
    match ty {
        0x1401 => Some(1),
        0x1403 => Some(2),
        0x1405 => Some(4),
        _ => None,
    }
}

/// The smallest and largest index among `count` indices of `ty` in `data`; `None` when
/// `data` is too short, the type is unknown, or `count` is 0.
pub fn index_range(data: &[u8], ty: u32, count: usize) -> Option<(u32, u32)> {
    let w = index_bytes(ty)?;
    if count == 0 || data.len() < count.checked_mul(w)? {
        return None;
    }
    let (mut lo, mut hi) = (u32::MAX, 0u32);
    for c in data[..count * w].chunks_exact(w) {
        let v = match w {
            1 => c[0] as u32,
            2 => u16::from_le_bytes([c[0], c[1]]) as u32,
            _ => u32::from_le_bytes([c[0], c[1], c[2], c[3]]),
        };
        lo = lo.min(v);
        hi = hi.max(v);
    }
    Some((lo, hi))
}

/// A count argument as a size: `None` when negative.
pub fn n(v: i64) -> Option<usize> {
    usize::try_from(v).ok()
}

/// The product of sizes, `None` when one is or on overflow.
pub fn mul(f: &[Option<usize>]) -> Option<usize> {
    f.iter().try_fold(1usize, |acc, x| acc.checked_mul((*x)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_pad_rows_but_the_last() {
        // 3 RGB pixels = 9 bytes a row, padded to 12 with alignment 4.
        assert_eq!(image_bytes(3, 2, 0x1907, 0x1401, 4), Some(21));
        assert_eq!(image_bytes(3, 2, 0x1907, 0x1401, 1), Some(18));
        assert_eq!(image_bytes(2, 2, 0x1908, 0x1401, 8), Some(16));
        assert_eq!(image_bytes(-1, 2, 0x1908, 0x1401, 4), None);
        assert_eq!(image_bytes(1, 1, 0x1234, 0x1401, 4), None);
        assert_eq!(image_bytes(1, 1, 0x1908, 0x1401, 3), None);
        assert_eq!(image_bytes(0, 100, 0x1908, 0x1401, 4), Some(0));
        assert_eq!(image_bytes(1 << 40, 1 << 40, 0x1908, 0x1406, 4), None);
    }

    #[test]
    fn pixel_store_rows_skips_and_images() {
        let mut ps = PixelStore::default();
        // Defaults: the GLES 2.0 size.
        assert_eq!(
            image_bytes_3d(3, 2, 1, 0x1907, 0x1401, &ps),
            image_bytes(3, 2, 0x1907, 0x1401, 4)
        );
        assert!(ps.set(0x0CF2, 10)); // row length 10 RGBA8 = 40 bytes a row
        assert!(ps.set(0x0CF4, 2)); // skip 2 pixels
        assert!(ps.set(0x0CF3, 1)); // skip 1 row
        assert_eq!(
            image_bytes_3d(4, 3, 1, 0x1908, 0x1401, &ps),
            Some(3 * 40 + 6 * 4)
        );
        assert!(ps.set(0x806E, 5)); // image height 5 rows
        assert!(ps.set(0x806D, 1)); // skip one image
        assert_eq!(
            image_bytes_3d(4, 3, 2, 0x1908, 0x1401, &ps),
            Some(2 * 200 + 3 * 40 + 6 * 4)
        );
        assert!(!ps.set(0x0CF2, -1));
        assert!(!ps.set(0x0CF5, 3));
        assert!(!ps.set(0x1234, 0));
        let big = 1 << 30;
        let dflt = PixelStore::default();
        assert_eq!(image_bytes_3d(big, big, big, 0x1908, 0x1406, &dflt), None);
        assert_eq!(
            image_bytes_3d(i64::MAX, i64::MAX, i64::MAX, 0x1908, 0x1406, &dflt),
            None
        );
        assert_eq!(clear_buffer_count(0x1800), Some(4));
        assert_eq!(clear_buffer_count(0x1234), None);
    }

    #[test]
    fn index_ranges() {
        let d: Vec<u8> = [5u16, 2, 9].iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(index_range(&d, 0x1403, 3), Some((2, 9)));
        assert_eq!(index_range(&d, 0x1403, 4), None);
        assert_eq!(mul(&[Some(3), n(4)]), Some(12));
        assert_eq!(mul(&[Some(3), n(-4)]), None);
    }
}
