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
//! for frames of 160x128 and up, i.e. still 4x4 after a 2x downscale; the reader averages the
//! central half of each block, so bilinear or bicubic filtering at block edges does not
//! matter.

use crate::error::Result;
use crate::frame::{FrameMut, FrameRef, PixelFormat};

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
    let bpp = l.format.luma_bytes_per_pixel() as usize;
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
            for cy in 0..crow_end.min(p.rows) {
                let o = p.offset + cy * p.stride;
                data[o..o + p.row_bytes].fill(128);
            }
        }
    }
    Ok(())
}

/// Mean brightness (luma for YUV, (R + 2G + B) / 4 for RGB) of the centre half of block
/// (col, row) of `frame`.
fn block_level(frame: &FrameRef<'_>, col: u32, row: u32) -> f32 {
    let l = frame.layout;
    let (w, h) = (l.width as f32, l.height as f32);
    let bw = w / COLUMNS as f32;
    let bh = h / ROW_DIVISIONS as f32;
    let x0 = (col as f32 * bw + bw / 4.0).floor() as usize;
    let x1 = ((col as f32 * bw + 3.0 * bw / 4.0).ceil() as usize)
        .max(x0 + 1)
        .min(l.width as usize);
    let y0 = (row as f32 * bh + bh / 4.0).floor() as usize;
    let y1 = ((row as f32 * bh + 3.0 * bh / 4.0).ceil() as usize)
        .max(y0 + 1)
        .min(l.height as usize);
    let stride = l.stride as usize;
    let mut sum = 0u64;
    let mut n = 0u64;
    for y in y0..y1 {
        for x in x0..x1 {
            let v = match l.format {
                PixelFormat::Nv12 | PixelFormat::Yuv420p => frame.data[y * stride + x] as u64,
                PixelFormat::Rgba8 | PixelFormat::Bgra8 => {
                    let p = &frame.data[y * stride + 4 * x..y * stride + 4 * x + 3];
                    (p[0] as u64 + 2 * p[1] as u64 + p[2] as u64) / 4
                }
            };
            sum += v;
            n += 1;
        }
    }
    sum as f32 / n.max(1) as f32
}

/// Reads a timestamp drawn by [`stamp_timestamp`] (or a [`super::SyntheticCamera`]) from a
/// frame of any supported format, at the stamped size or rescaled. `None` if the frame
/// carries no valid timestamp (missing start markers, too little contrast, or a check-byte
/// mismatch).
pub fn read_timestamp(frame: FrameRef<'_>) -> Option<u64> {
    frame.validate().ok()?;
    let l = frame.layout;
    if l.width < COLUMNS || l.height < ROW_DIVISIONS {
        return None;
    }
    let mut ts = 0u64;
    let mut check = 0u8;
    for row in 0..ROWS {
        let white = block_level(&frame, 0, row);
        let black = block_level(&frame, 1, row);
        if white - black < 64.0 {
            return None;
        }
        let threshold = (white + black) / 2.0;
        let bit = |col: u32| block_level(&frame, col, row) > threshold;
        for col in 2..18 {
            ts = (ts << 1) | bit(col) as u64;
        }
        check = (check << 2) | ((bit(18) as u8) << 1) | bit(19) as u8;
    }
    (check == check_byte(ts)).then_some(ts)
}
