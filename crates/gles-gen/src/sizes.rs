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
        0x1903 /* RED_EXT */ => 1,
        0x190A /* LUMINANCE_ALPHA */ | 0x8227 /* RG_EXT */ => 2,
        0x84F9 /* DEPTH_STENCIL_OES */ => 1,
        0x1907 /* RGB */ => 3,
        0x1908 /* RGBA */ | 0x80E1 /* BGRA_EXT */ => 4,
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
        0x84FA /* UNSIGNED_INT_24_8_OES */ => Some(4),
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
    fn index_ranges() {
        let d: Vec<u8> = [5u16, 2, 9].iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(index_range(&d, 0x1403, 3), Some((2, 9)));
        assert_eq!(index_range(&d, 0x1403, 4), None);
        assert_eq!(mul(&[Some(3), n(4)]), Some(12));
        assert_eq!(mul(&[Some(3), n(-4)]), None);
    }
}
