//! Synthetic frames for tests and benchmarks. Each channel varies in its own
//! direction, so swapped planes, mirrored or mis-rotated output show up as
//! large differences.

use crate::{FrameLayout, OwnedFrame, PixelFormat, Result};

fn wave(x: f32, period: f32) -> f32 {
    0.5 + 0.5 * (x * std::f32::consts::TAU / period).sin()
}

fn byte(v: f32) -> u8 {
    (v.clamp(0.0, 1.0) * 255.0).round() as u8
}

/// Luma/chroma values at luma position (x, y) of a `w` x `h` frame.
fn yuv_at(x: f32, y: f32, w: f32, h: f32, phase: u32) -> (f32, f32, f32) {
    let p = phase as f32 * 7.0;
    let luma = 16.0 + 219.0 * (0.6 * (x + p) / w + 0.25 * y / h + 0.15 * wave(x + y, 37.0));
    let u = 40.0 + 176.0 * (y / h) * 0.8 + 20.0 * wave(x, 53.0);
    let v = 40.0 + 176.0 * (1.0 - x / w) * 0.8 + 20.0 * wave(y, 41.0);
    (luma, u, v)
}

/// An NV12 frame with tight stride.
pub fn nv12_gradient(width: u32, height: u32, phase: u32) -> Result<OwnedFrame> {
    nv12_gradient_strided(width, height, width, phase)
}

/// An NV12 frame with an explicit stride (padding bytes are 0xEE).
pub fn nv12_gradient_strided(
    width: u32,
    height: u32,
    stride: u32,
    phase: u32,
) -> Result<OwnedFrame> {
    let layout = FrameLayout::with_stride(PixelFormat::Nv12, width, height, stride)?;
    let mut f = OwnedFrame::new(layout)?;
    f.data.fill(0xEE);
    let (w, h, s) = (width as usize, height as usize, stride as usize);
    for y in 0..h {
        for x in 0..w {
            let (l, _, _) = yuv_at(x as f32 + 0.5, y as f32 + 0.5, w as f32, h as f32, phase);
            f.data[y * s + x] = l.round().clamp(0.0, 255.0) as u8;
        }
    }
    for cy in 0..h / 2 {
        for cx in 0..w / 2 {
            let (_, u, v) = yuv_at(
                cx as f32 * 2.0 + 1.0,
                cy as f32 * 2.0 + 1.0,
                w as f32,
                h as f32,
                phase,
            );
            let o = h * s + cy * s + cx * 2;
            f.data[o] = u.round().clamp(0.0, 255.0) as u8;
            f.data[o + 1] = v.round().clamp(0.0, 255.0) as u8;
        }
    }
    Ok(f)
}

/// A YUV420P frame with tight stride.
pub fn yuv420p_gradient(width: u32, height: u32, phase: u32) -> Result<OwnedFrame> {
    let layout = FrameLayout::packed(PixelFormat::Yuv420p, width, height)?;
    let mut f = OwnedFrame::new(layout)?;
    let (w, h) = (width as usize, height as usize);
    let (cw, ch) = (w / 2, h / 2);
    for y in 0..h {
        for x in 0..w {
            let (l, _, _) = yuv_at(x as f32 + 0.5, y as f32 + 0.5, w as f32, h as f32, phase);
            f.data[y * w + x] = l.round().clamp(0.0, 255.0) as u8;
        }
    }
    for cy in 0..ch {
        for cx in 0..cw {
            let (_, u, v) = yuv_at(
                cx as f32 * 2.0 + 1.0,
                cy as f32 * 2.0 + 1.0,
                w as f32,
                h as f32,
                phase,
            );
            f.data[w * h + cy * cw + cx] = u.round().clamp(0.0, 255.0) as u8;
            f.data[w * h + cw * ch + cy * cw + cx] = v.round().clamp(0.0, 255.0) as u8;
        }
    }
    Ok(f)
}

/// An RGBA (or BGRA) frame: red grows to the right, green downwards, blue is a
/// diagonal wave; alpha follows `alpha(x, y)` (0..=255).
pub fn rgb_gradient(
    format: PixelFormat,
    width: u32,
    height: u32,
    alpha: impl Fn(u32, u32) -> u8,
) -> Result<OwnedFrame> {
    let layout = FrameLayout::packed(format, width, height)?;
    let mut f = OwnedFrame::new(layout)?;
    let (w, h) = (width as f32, height as f32);
    for y in 0..height {
        for x in 0..width {
            let (fx, fy) = (x as f32 + 0.5, y as f32 + 0.5);
            let r = byte(0.1 + 0.8 * fx / w);
            let g = byte(0.1 + 0.8 * fy / h);
            let b = byte(0.2 + 0.6 * wave(fx - fy, 29.0));
            let a = alpha(x, y);
            let o = (y * layout.stride + x * 4) as usize;
            let px = if format == PixelFormat::Bgra8 {
                [b, g, r, a]
            } else {
                [r, g, b, a]
            };
            f.data[o..o + 4].copy_from_slice(&px);
        }
    }
    Ok(f)
}

/// A phone-UI-like RGBA overlay: translucent status and navigation bars,
/// a few opaque "buttons", transparent elsewhere.
pub fn rgba_ui(width: u32, height: u32) -> Result<OwnedFrame> {
    let layout = FrameLayout::packed(PixelFormat::Rgba8, width, height)?;
    let mut f = OwnedFrame::new(layout)?;
    let bar = (height / 20).max(1);
    for y in 0..height {
        for x in 0..width {
            let o = (y * layout.stride + x * 4) as usize;
            let px = if y < bar || y >= height - bar {
                [20, 20, 30, 160]
            } else if y > height * 3 / 4
                && (x / (width / 8).max(1)) % 2 == 1
                && y < height * 3 / 4 + bar * 2
            {
                [230, 230, 240, 255]
            } else {
                [0, 0, 0, 0]
            };
            f.data[o..o + 4].copy_from_slice(&px);
        }
    }
    Ok(f)
}

/// An equirectangular RGBA panorama: smooth in longitude and latitude and
/// continuous across the horizontal seam.
pub fn equirect_rgba(width: u32, height: u32) -> Result<OwnedFrame> {
    let layout = FrameLayout::packed(PixelFormat::Rgba8, width, height)?;
    let mut f = OwnedFrame::new(layout)?;
    let tau = std::f32::consts::TAU;
    for y in 0..height {
        for x in 0..width {
            let lon = (x as f32 + 0.5) / width as f32 * tau;
            let lat = (y as f32 + 0.5) / height as f32;
            let r = byte(0.5 + 0.4 * lon.cos());
            let g = byte(0.5 + 0.4 * lon.sin());
            let b = byte(0.1 + 0.8 * lat);
            let o = (y * layout.stride + x * 4) as usize;
            f.data[o..o + 4].copy_from_slice(&[r, g, b, 255]);
        }
    }
    Ok(f)
}

/// An equirectangular NV12 panorama (same idea as [`equirect_rgba`]).
pub fn equirect_nv12(width: u32, height: u32) -> Result<OwnedFrame> {
    let layout = FrameLayout::packed(PixelFormat::Nv12, width, height)?;
    let mut f = OwnedFrame::new(layout)?;
    let tau = std::f32::consts::TAU;
    let (w, h) = (width as usize, height as usize);
    for y in 0..h {
        for x in 0..w {
            let lon = (x as f32 + 0.5) / w as f32 * tau;
            let lat = (y as f32 + 0.5) / h as f32;
            f.data[y * w + x] = (40.0 + 100.0 * lat + 60.0 * (0.5 + 0.5 * lon.cos())).round() as u8;
        }
    }
    for cy in 0..h / 2 {
        for cx in 0..w / 2 {
            let lon = (cx as f32 * 2.0 + 1.0) / w as f32 * tau;
            let o = w * h + cy * w + cx * 2;
            f.data[o] = (128.0 + 60.0 * lon.sin()).round() as u8;
            f.data[o + 1] = (128.0 + 60.0 * (lon * 2.0).cos()).round() as u8;
        }
    }
    Ok(f)
}
