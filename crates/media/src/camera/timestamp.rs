//! Capture timestamps embedded in pixels, so that latency can be measured end to end after
//! ISP conversion, scaling, compression and GPU composition.
//!
//! Layout: a strip over the top quarter of the frame, divided into a grid of
//! [`COLUMNS`] x [`ROWS`] blocks. Block (col, row) covers
//! `x in [col * W / 20, (col + 1) * W / 20)` and `y in [row * H / 16, (row + 1) * H / 16)`,
//! so the grid scales with the frame and survives any resize (even one that changes the
//! aspect ratio). Every row reads, left to right:
//!
//! | columns | content                                                           |
//! |---------|-------------------------------------------------------------------|
//! | 0, 1    | start marker: white, black (gives the row's own threshold)        |
//! | 2..18   | 16 timestamp bits, most significant first (row 0 = bits 63..48)  |
//! | 18, 19  | 2 bits of the check byte (row 0 = bits 7, 6), white = 1           |
//!
//! The check byte is the low byte of CRC-32 over the timestamp's big-endian bytes. White is
//! Y = 235 (RGB 255), black Y = 16 (RGB 0), chroma neutral. Blocks are at least 8x8 pixels
//! for frames of 160x128 and up, i.e. still 4x4 after a 2x downscale; the reader averages 4x4
//! samples in the central half of each block, so bilinear or bicubic filtering at block edges does not
//! matter.

use crate::error::Result;
use crate::frame::{FrameMut, FrameRef};

/// Grid columns across the frame width.
pub const COLUMNS: u32 = 20;
/// Grid rows carrying data.
pub const ROWS: u32 = 4;
/// The frame height is divided into this many block rows (the strip uses the first [`ROWS`]).
pub const ROW_DIVISIONS: u32 = 16;
/// Smallest frame the timestamp strip can be drawn into (2x2-pixel blocks).
pub const MIN_SIZE: (u32, u32) = (2 * COLUMNS, 2 * ROW_DIVISIONS);
/// Smallest frame whose blocks are at least 8x8 pixels.
pub const MIN_SIZE_8X8: (u32, u32) = (8 * COLUMNS, 8 * ROW_DIVISIONS);

const DATA_BITS_PER_ROW: u32 = 16;

fn check_byte(ts: u64) -> u8 {
    (crc32fast::hash(&ts.to_be_bytes()) & 0xff) as u8
}

/// The 20 block values (true = white) of grid row `row` for timestamp `ts`.
fn row_bits(ts: u64, row: u32) -> [bool; COLUMNS as usize] {
    let mut bits = [false; COLUMNS as usize];
    bits[0] = true;
    bits[1] = false;
    let word = (ts >> (DATA_BITS_PER_ROW * (ROWS - 1 - row))) & 0xffff;
    for i in 0..DATA_BITS_PER_ROW {
        bits[2 + i as usize] = (word >> (DATA_BITS_PER_ROW - 1 - i)) & 1 == 1;
    }
    let check = check_byte(ts);
    bits[18] = (check >> (7 - 2 * row)) & 1 == 1;
    bits[19] = (check >> (6 - 2 * row)) & 1 == 1;
    bits
}

/// Height in pixels of the strip in a frame of height `h`.
pub fn strip_height(h: u32) -> u32 {
    (ROWS * h).div_ceil(ROW_DIVISIONS)
}

/// Draws timestamp `ts` into the top strip of `dst` (any supported format).
/// Frames smaller than [`MIN_SIZE`] are refused.
pub fn stamp_timestamp(dst: FrameMut<'_>, ts: u64) -> Result<()> {
    dst.validate()?;
    let l = dst.layout;
    if l.width < MIN_SIZE.0 || l.height < MIN_SIZE.1 {
        return Err(crate::MediaError::InvalidLayout(format!(
            "{l:?} too small for a timestamp strip (min {}x{})",
            MIN_SIZE.0, MIN_SIZE.1
        )));
    }
    let (w, h) = (l.width as usize, l.height as usize);
    let col_of = |x: usize| (x * COLUMNS as usize / w).min(COLUMNS as usize - 1);
    let row_of = |y: usize| y * ROW_DIVISIONS as usize / h;
    let data = dst.data;
    let stride = l.stride as usize;
    let strip = strip_height(l.height) as usize;
    let bpp = l.format.bytes_per_pixel() as usize;
    // Render each grid row's pixel row once, then copy it down its band.
    let mut line = vec![0u8; w * bpp];
    let mut current_band = usize::MAX;
    for y in 0..strip {
        let r = row_of(y);
        if r >= ROWS as usize {
            break;
        }
        if r != current_band {
            current_band = r;
            let bits = row_bits(ts, r as u32);
            for (x, px) in line.chunks_exact_mut(bpp).enumerate() {
                let white = bits[col_of(x)];
                if bpp == 1 {
                    px[0] = if white { 235 } else { 16 };
                } else {
                    let v = if white { 255 } else { 0 };
                    px.copy_from_slice(&[v, v, v, 255]);
                }
            }
        }
        data[y * stride..y * stride + w * bpp].copy_from_slice(&line);
    }
    // Neutral chroma under the strip (strip height rounded up to whole chroma rows).
    if l.format.is_yuv() {
        let crow_end = strip.div_ceil(2);
        for p in l.planes().iter().skip(1) {
            for cy in 0..crow_end.min(p.rows()) {
                let o = p.offset + cy * p.stride;
                data[o..o + p.row_bytes()].fill(128);
            }
        }
    }
    Ok(())
}

/// Cells per block along each axis of the grid the reader samples (see [`read_timestamp`]).
pub const CELLS_PER_BLOCK: u32 = 8;
/// Grid cells across the frame width.
pub const GRID_COLUMNS: u32 = COLUMNS * CELLS_PER_BLOCK;
/// Grid cells down the frame height; the first [`GRID_ROWS`] of them cover the strip.
pub const GRID_ROW_DIVISIONS: u32 = ROW_DIVISIONS * CELLS_PER_BLOCK;
/// Grid rows over the strip: a reader needs `GRID_ROWS` x [`GRID_COLUMNS`] samples.
pub const GRID_ROWS: u32 = ROWS * CELLS_PER_BLOCK;
/// The cells of a block whose centres lie in its central half (cell centres at 5/16, 7/16,
/// 9/16 and 11/16 of the block): the samples averaged for the block's level.
const CENTRE_CELLS: std::ops::Range<u32> = 2..6;

/// Pixel at the centre of cell `i` of `cells` over `size` pixels:
/// `min((2i + 1) * size / (2 * cells), size - 1)`. The same rule as a nearest-neighbour grid
/// of the GPU (`virtsoc_gpu::SampleAxis`), so a reader on the GPU samples the same pixels.
pub fn grid_pixel(size: u32, cells: u32, i: u32) -> u32 {
    let (size, cells, i) = (
        u64::from(size.max(1)),
        u64::from(cells.max(1)),
        u64::from(i),
    );
    ((2 * i + 1) * size / (2 * cells)).min(size - 1) as u32
}

/// Reads a timestamp from the strip's grid of brightness levels (luma for YUV,
/// (R + 2G + B) / 4 for RGB): [`GRID_ROWS`] rows of [`GRID_COLUMNS`] samples, row-major,
/// sample (gx, gy) taken at pixel ([`grid_pixel`]`(width, GRID_COLUMNS, gx)`,
/// [`grid_pixel`]`(height, GRID_ROW_DIVISIONS, gy)`). `None` if it carries no valid
/// timestamp, or `levels` has fewer samples than that.
pub fn read_timestamp_grid(levels: &[u8]) -> Option<u64> {
    let cols = GRID_COLUMNS as usize;
    if levels.len() < cols * GRID_ROWS as usize {
        return None;
    }
    let block_level = |col: u32, row: u32| {
        let mut sum = 0u32;
        for gy in CENTRE_CELLS.map(|j| row * CELLS_PER_BLOCK + j) {
            for gx in CENTRE_CELLS.map(|j| col * CELLS_PER_BLOCK + j) {
                sum += u32::from(levels[gy as usize * cols + gx as usize]);
            }
        }
        sum as f32 / CENTRE_CELLS.len().pow(2) as f32
    };
    let mut ts = 0u64;
    let mut check = 0u8;
    for row in 0..ROWS {
        let white = block_level(0, row);
        let black = block_level(1, row);
        if white - black < 64.0 {
            return None;
        }
        let threshold = (white + black) / 2.0;
        let bit = |col: u32| block_level(col, row) > threshold;
        for col in 2..18 {
            ts = (ts << 1) | bit(col) as u64;
        }
        check = (check << 2) | ((bit(18) as u8) << 1) | bit(19) as u8;
    }
    (check == check_byte(ts)).then_some(ts)
}

/// The strip's grid of brightness levels (see [`read_timestamp_grid`]) from pixel bytes:
/// `bytes` holds at least the frame's first rows (through the strip) at `layout`'s stride;
/// a sample past the end gives `None`.
fn grid_levels(layout: &crate::frame::FrameLayout, bytes: &[u8]) -> Option<Vec<u8>> {
    let (w, h, stride) = (layout.width, layout.height, layout.stride as usize);
    let rgb = !layout.format.is_yuv();
    let xs: Vec<usize> = (0..GRID_COLUMNS)
        .map(|gx| grid_pixel(w, GRID_COLUMNS, gx) as usize)
        .collect();
    let mut levels = Vec::with_capacity(xs.len() * GRID_ROWS as usize);
    for gy in 0..GRID_ROWS {
        let row = grid_pixel(h, GRID_ROW_DIVISIONS, gy) as usize * stride;
        for &x in &xs {
            let v = if rgb {
                let p = bytes.get(row + 4 * x..row + 4 * x + 3)?;
                ((u16::from(p[0]) + 2 * u16::from(p[1]) + u16::from(p[2])) / 4) as u8
            } else {
                *bytes.get(row + x)?
            };
            levels.push(v);
        }
    }
    Some(levels)
}

/// Bytes of a frame of `layout` through the last pixel a reader samples (of the luma or
/// packed RGB plane): what a reader holding only the top of a frame needs.
pub fn strip_bytes(layout: &crate::frame::FrameLayout) -> usize {
    let row = grid_pixel(layout.height, GRID_ROW_DIVISIONS, GRID_ROWS - 1) as usize;
    let x = grid_pixel(layout.width, GRID_COLUMNS, GRID_COLUMNS - 1) as usize;
    let end = if layout.format.is_yuv() {
        x + 1
    } else {
        4 * x + 3
    };
    row * layout.stride as usize + end
}

/// Reads a timestamp from the top of a frame of `layout`: `top` holds at least its first
/// [`strip_bytes`] bytes. See [`read_timestamp`].
pub fn read_timestamp_top(layout: &crate::frame::FrameLayout, top: &[u8]) -> Option<u64> {
    if layout.width < COLUMNS || layout.height < ROW_DIVISIONS {
        return None;
    }
    read_timestamp_grid(&grid_levels(layout, top)?)
}

/// Reads a timestamp drawn by [`stamp_timestamp`] (or a [`super::SyntheticCamera`]) from a
/// frame of any supported format, at the stamped size or rescaled. `None` if the frame
/// carries no valid timestamp (missing start markers, too little contrast, or a check-byte
/// mismatch).
///
/// Each block's level is the mean of 4 x 4 samples in its central half (a grid of
/// [`CELLS_PER_BLOCK`] cells per block along each axis), so filtering at block edges does
/// not matter and a reader touches [`GRID_ROWS`] rows of [`GRID_COLUMNS`] pixels, not the
/// whole strip.
pub fn read_timestamp(frame: FrameRef<'_>) -> Option<u64> {
    frame.validate().ok()?;
    read_timestamp_top(&frame.layout, frame.data)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{FrameLayout, PixelFormat};

    /// A reader holding only the top of a frame reads the stamp from [`strip_bytes`] of it,
    /// and from one byte less it reads nothing (the last sampled pixel is missing).
    #[test]
    fn the_top_of_a_frame_is_enough_and_needed() {
        for format in [PixelFormat::Nv12, PixelFormat::Rgba8] {
            let layout = FrameLayout::packed(format, 1920, 1080).unwrap();
            let mut data = vec![0u8; layout.size()];
            let ts = 0x0123_4567_89ab_cdef;
            stamp_timestamp(FrameMut::new(layout, &mut data).unwrap(), ts).unwrap();
            let n = strip_bytes(&layout);
            assert!(n < layout.size() / 3, "{format:?}: {n} bytes");
            assert_eq!(
                read_timestamp_top(&layout, &data[..n]),
                Some(ts),
                "{format:?}"
            );
            assert_eq!(
                read_timestamp_top(&layout, &data[..n - 1]),
                None,
                "{format:?}"
            );
            assert_eq!(
                read_timestamp(FrameRef::new(layout, &data).unwrap()),
                Some(ts)
            );
        }
    }

    /// The grid reader takes levels sampled elsewhere (a GPU): the same pixels give the
    /// same timestamp, and a flipped data bit fails the check byte.
    #[test]
    fn grid_levels_sampled_elsewhere_read_the_same() {
        let layout = FrameLayout::packed(PixelFormat::Nv12, 1280, 720).unwrap();
        let mut data = vec![0u8; layout.size()];
        let ts = 1_700_000_000_123_456_789;
        stamp_timestamp(FrameMut::new(layout, &mut data).unwrap(), ts).unwrap();
        let mut levels = Vec::new();
        for gy in 0..GRID_ROWS {
            for gx in 0..GRID_COLUMNS {
                let (x, y) = (
                    grid_pixel(1280, GRID_COLUMNS, gx) as usize,
                    grid_pixel(720, GRID_ROW_DIVISIONS, gy) as usize,
                );
                levels.push(data[y * layout.stride as usize + x]);
            }
        }
        assert_eq!(read_timestamp_grid(&levels), Some(ts));
        assert_eq!(read_timestamp_grid(&levels[..levels.len() - 1]), None);
        // Block (5, 0) holds one data bit: its centre samples inverted.
        for gy in CENTRE_CELLS {
            for gx in CENTRE_CELLS.map(|j| 5 * CELLS_PER_BLOCK + j) {
                let v = &mut levels[(gy * GRID_COLUMNS + gx) as usize];
                *v = 251 - *v;
            }
        }
        assert_eq!(read_timestamp_grid(&levels), None);
    }
}
