//! The CPU backend: the reference implementation for tests and the fallback
//! when no GPU adapter exists. It follows the sampling conventions documented
//! at the crate root exactly as the wgpu shaders do.

use std::f32::consts::{PI, TAU};
use std::ops::Range;
use std::time::Instant;

use crate::{
    check_layers, check_markers, check_rgb_dst, check_view, Clear, FrameMut, FrameRef, GpuBackend,
    GpuStats, Layer, Marker, MarkerShape, PixelFormat, Rect, Result, Rotation, View,
};

/// Plain-Rust implementation of the GPU operations (row bands run on scoped
/// threads).
#[derive(Clone, Debug)]
pub struct CpuBackend {
    threads: usize,
}

impl Default for CpuBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl CpuBackend {
    /// Uses up to `available_parallelism()` threads (at most 8).
    pub fn new() -> Self {
        let threads = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
            .min(8);
        CpuBackend { threads }
    }

    /// Uses exactly `threads` threads (at least 1).
    pub fn with_threads(threads: usize) -> Self {
        CpuBackend {
            threads: threads.max(1),
        }
    }

    fn par_rows(
        &self,
        data: &mut [u8],
        stride: usize,
        rows: Range<usize>,
        f: impl Fn(usize, &mut [u8]) + Sync,
    ) {
        let n = rows.len();
        if n == 0 {
            return;
        }
        let region = &mut data[rows.start * stride..rows.end * stride];
        let threads = self.threads.min((n / 16).max(1));
        if threads <= 1 {
            for (i, row) in region.chunks_mut(stride).enumerate() {
                f(rows.start + i, row);
            }
            return;
        }
        let per = n.div_ceil(threads);
        let f = &f;
        std::thread::scope(|s| {
            for (bi, band) in region.chunks_mut(per * stride).enumerate() {
                s.spawn(move || {
                    for (i, row) in band.chunks_mut(stride).enumerate() {
                        f(rows.start + bi * per + i, row);
                    }
                });
            }
        });
    }
}

// ---------------------------------------------------------------------------
// Sampling, shared with the wgpu shaders' conventions.

/// A validated source frame split into planes.
pub(crate) enum Src<'a> {
    Rgb {
        data: &'a [u8],
        stride: usize,
        w: u32,
        h: u32,
        bgra: bool,
    },
    Nv12 {
        y: &'a [u8],
        uv: &'a [u8],
        stride: usize,
        w: u32,
        h: u32,
    },
    I420 {
        y: &'a [u8],
        u: &'a [u8],
        v: &'a [u8],
        stride: usize,
        cstride: usize,
        w: u32,
        h: u32,
    },
}

impl<'a> Src<'a> {
    /// `frame` must already be validated (its buffer is large enough).
    pub(crate) fn new(frame: FrameRef<'a>) -> Result<Self> {
        frame.layout.check_buffer(frame.data.len())?;
        let l = frame.layout;
        let d = &frame.data[..l.size()];
        let stride = l.stride as usize;
        let offset = |i| l.plane(i).map_or(d.len(), |p| p.offset);
        Ok(match l.format {
            PixelFormat::Rgba8 | PixelFormat::Bgra8 => Src::Rgb {
                data: d,
                stride,
                w: l.width,
                h: l.height,
                bgra: l.format == PixelFormat::Bgra8,
            },
            PixelFormat::Nv12 => {
                let o1 = offset(1);
                Src::Nv12 {
                    y: &d[..o1],
                    uv: &d[o1..],
                    stride,
                    w: l.width,
                    h: l.height,
                }
            }
            PixelFormat::Yuv420p => {
                let (o1, o2) = (offset(1), offset(2));
                Src::I420 {
                    y: &d[..o1],
                    u: &d[o1..o2],
                    v: &d[o2..],
                    stride,
                    cstride: stride / 2,
                    w: l.width,
                    h: l.height,
                }
            }
        })
    }
}

/// How sampling coordinates are bounded.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Addr {
    /// Clamp to the crop rectangle `[x0, x1) x [y0, y1)` (luma pixels), per plane.
    Crop { x0: f32, y0: f32, x1: f32, y1: f32 },
    /// Wrap horizontally, clamp vertically (equirect).
    Wrap,
}

/// Clamps a continuous coordinate to the texel centres inside `[lo_edge, hi_edge)`.
#[inline]
pub(crate) fn clamp_axis(c: f32, lo_edge: f32, hi_edge: f32) -> f32 {
    let mut lo = lo_edge + 0.5;
    let mut hi = hi_edge - 0.5;
    if lo > hi {
        let m = 0.5 * (lo_edge + hi_edge);
        lo = m;
        hi = m;
    }
    c.max(lo).min(hi)
}

#[inline]
fn taps(c: f32, n: u32, wrap: bool) -> (usize, usize, f32) {
    let f = c - 0.5;
    let fl = f.floor();
    let a = f - fl;
    let i0 = fl as i64;
    let n = n as i64;
    let (a0, a1) = if wrap {
        (i0.rem_euclid(n), (i0 + 1).rem_euclid(n))
    } else {
        (i0.clamp(0, n - 1), (i0 + 1).clamp(0, n - 1))
    };
    (a0 as usize, a1 as usize, a)
}

/// Bilinear sample of a `C`-channel 8-bit plane at continuous texel coordinates.
#[inline]
#[allow(clippy::too_many_arguments)]
fn bilinear<const C: usize>(
    plane: &[u8],
    stride: usize,
    w: u32,
    h: u32,
    x: f32,
    y: f32,
    wrap_x: bool,
) -> [f32; C] {
    let (x0, x1, ax) = taps(x, w, wrap_x);
    let (y0, y1, ay) = taps(y, h, false);
    let r0 = y0 * stride;
    let r1 = y1 * stride;
    let mut out = [0f32; C];
    for (c, o) in out.iter_mut().enumerate() {
        let p00 = plane[r0 + x0 * C + c] as f32;
        let p10 = plane[r0 + x1 * C + c] as f32;
        let p01 = plane[r1 + x0 * C + c] as f32;
        let p11 = plane[r1 + x1 * C + c] as f32;
        let top = p00 + (p10 - p00) * ax;
        let bot = p01 + (p11 - p01) * ax;
        *o = (top + (bot - top) * ay) / 255.0;
    }
    out
}

/// BT.601 limited range, normalized inputs and outputs.
#[inline]
pub(crate) fn yuv_to_rgb(y: f32, u: f32, v: f32) -> [f32; 3] {
    let yy = 1.164383 * (y - 0.062_745_1);
    let uu = u - 0.501_960_8;
    let vv = v - 0.501_960_8;
    [
        (yy + 1.596027 * vv).clamp(0.0, 1.0),
        (yy - 0.391762 * uu - 0.812968 * vv).clamp(0.0, 1.0),
        (yy + 2.017232 * uu).clamp(0.0, 1.0),
    ]
}

/// Samples `src` at continuous luma coordinates; returns normalized RGBA.
#[inline]
pub(crate) fn sample(src: &Src<'_>, sx: f32, sy: f32, addr: Addr) -> [f32; 4] {
    let (lx, ly, wrap) = match addr {
        Addr::Crop { x0, y0, x1, y1 } => (clamp_axis(sx, x0, x1), clamp_axis(sy, y0, y1), false),
        Addr::Wrap => (sx, sy, true),
    };
    let chroma = |w: u32, h: u32| -> (f32, f32, u32, u32) {
        let (cx, cy) = match addr {
            Addr::Crop { x0, y0, x1, y1 } => (
                clamp_axis(sx * 0.5, x0 * 0.5, x1 * 0.5),
                clamp_axis(sy * 0.5, y0 * 0.5, y1 * 0.5),
            ),
            Addr::Wrap => (sx * 0.5, sy * 0.5),
        };
        (cx, cy, w / 2, h / 2)
    };
    match *src {
        Src::Rgb {
            data,
            stride,
            w,
            h,
            bgra,
        } => {
            let p = bilinear::<4>(data, stride, w, h, lx, ly, wrap);
            if bgra {
                [p[2], p[1], p[0], p[3]]
            } else {
                p
            }
        }
        Src::Nv12 {
            y,
            uv,
            stride,
            w,
            h,
        } => {
            let [l] = bilinear::<1>(y, stride, w, h, lx, ly, wrap);
            let (cx, cy, cw, ch) = chroma(w, h);
            let [u, v] = bilinear::<2>(uv, stride, cw, ch, cx, cy, wrap);
            let [r, g, b] = yuv_to_rgb(l, u, v);
            [r, g, b, 1.0]
        }
        Src::I420 {
            y,
            u,
            v,
            stride,
            cstride,
            w,
            h,
        } => {
            let [l] = bilinear::<1>(y, stride, w, h, lx, ly, wrap);
            let (cx, cy, cw, ch) = chroma(w, h);
            let [u] = bilinear::<1>(u, cstride, cw, ch, cx, cy, wrap);
            let [v] = bilinear::<1>(v, cstride, cw, ch, cx, cy, wrap);
            let [r, g, b] = yuv_to_rgb(l, u, v);
            [r, g, b, 1.0]
        }
    }
}

/// Affine map from destination pixels (relative to `dst_rect`) to source luma
/// pixels for one layer (mirrors `layer_coord` in the shader). Unscaled layers
/// get exact integer steps, so their samples land exactly on texel centres.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct LayerMap {
    /// m00, m01, m10, m11.
    pub m: [f32; 4],
    /// Source coordinate at the dst_rect origin.
    pub b: [f32; 2],
    pub origin: [f32; 2],
}

impl LayerMap {
    pub(crate) fn new(dst: Rect, crop: Rect, rot: Rotation) -> Self {
        let (cx, cy) = (crop.x as f32, crop.y as f32);
        let (cw, ch) = (crop.width as f32, crop.height as f32);
        let (dw, dh) = (dst.width as f32, dst.height as f32);
        let (m, b) = match rot {
            Rotation::R0 => ([cw / dw, 0.0, 0.0, ch / dh], [cx, cy]),
            Rotation::R90 => ([0.0, cw / dh, -ch / dw, 0.0], [cx, cy + ch]),
            Rotation::R180 => ([-cw / dw, 0.0, 0.0, -ch / dh], [cx + cw, cy + ch]),
            Rotation::R270 => ([0.0, -cw / dh, ch / dw, 0.0], [cx + cw, cy]),
        };
        LayerMap {
            m,
            b,
            origin: [dst.x as f32, dst.y as f32],
        }
    }

    /// Whether every destination pixel centre maps exactly onto a source
    /// texel centre (unscaled, integer-aligned), so one fetch suffices.
    pub(crate) fn is_exact(&self) -> bool {
        self.m.iter().all(|v| *v == 0.0 || v.abs() == 1.0)
            && self.b.iter().all(|v| v.fract() == 0.0)
            && self.origin.iter().all(|v| v.fract() == 0.0)
    }

    /// Source coordinate of destination pixel centre (px, py).
    #[inline]
    pub(crate) fn at(&self, px: f32, py: f32) -> (f32, f32) {
        let rx = px - self.origin[0];
        let ry = py - self.origin[1];
        (
            self.b[0] + self.m[0] * rx + self.m[1] * ry,
            self.b[1] + self.m[2] * rx + self.m[3] * ry,
        )
    }
}

/// Precomputed view rotation for the equirect projection.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ViewParams {
    pub cos_yaw: f32,
    pub sin_yaw: f32,
    pub cos_pitch: f32,
    pub sin_pitch: f32,
    pub tan_half: f32,
}

impl ViewParams {
    pub(crate) fn new(v: &View) -> Self {
        ViewParams {
            cos_yaw: v.yaw.cos(),
            sin_yaw: v.yaw.sin(),
            cos_pitch: v.pitch.cos(),
            sin_pitch: v.pitch.sin(),
            tan_half: (v.fov_y * 0.5).tan(),
        }
    }
}

/// Source coordinate (luma pixels) of destination pixel centre (px, py) in the
/// equirect projection (mirrors `equirect_coord` in the shader).
#[inline]
pub(crate) fn equirect_coord(
    px: f32,
    py: f32,
    tw: f32,
    th: f32,
    sw: f32,
    sh: f32,
    vp: &ViewParams,
) -> (f32, f32) {
    let aspect = tw / th;
    let x = (2.0 * px / tw - 1.0) * vp.tan_half * aspect;
    let y = (1.0 - 2.0 * py / th) * vp.tan_half;
    let z = 1.0f32;
    let y1 = y * vp.cos_pitch + z * vp.sin_pitch;
    let z1 = -y * vp.sin_pitch + z * vp.cos_pitch;
    let x2 = x * vp.cos_yaw + z1 * vp.sin_yaw;
    let z2 = -x * vp.sin_yaw + z1 * vp.cos_yaw;
    let lon = x2.atan2(z2);
    let lat = y1.atan2((x2 * x2 + z2 * z2).sqrt());
    let u = lon / TAU + 0.5;
    let v = 0.5 - lat / PI;
    (u * sw, v * sh)
}

#[inline]
fn to_byte(v: f32) -> u8 {
    (v.clamp(0.0, 1.0) * 255.0).round() as u8
}

/// Writes (or blends) normalized RGBA `c` with plane alpha into a 4-byte pixel.
#[inline]
pub(crate) fn put_pixel(px: &mut [u8], c: [f32; 4], alpha: f32, blend: bool, bgra: bool) {
    let a = c[3] * alpha;
    let (ri, bi) = if bgra { (2, 0) } else { (0, 2) };
    let out = if blend {
        let d = [
            px[ri] as f32 / 255.0,
            px[1] as f32 / 255.0,
            px[bi] as f32 / 255.0,
            px[3] as f32 / 255.0,
        ];
        let k = 1.0 - a;
        [
            c[0] * a + d[0] * k,
            c[1] * a + d[1] * k,
            c[2] * a + d[2] * k,
            a + d[3] * k,
        ]
    } else {
        [c[0], c[1], c[2], a]
    };
    px[ri] = to_byte(out[0]);
    px[1] = to_byte(out[1]);
    px[bi] = to_byte(out[2]);
    px[3] = to_byte(out[3]);
}

/// Whether pixel centre (cx, cy) is covered by marker `m`.
#[inline]
pub(crate) fn marker_covers(m: &Marker, cx: f32, cy: f32) -> bool {
    let half = m.size * 0.5;
    let dx = cx - m.x;
    let dy = cy - m.y;
    let inside = dx >= -half && dx < half && dy >= -half && dy < half;
    match m.shape {
        MarkerShape::Square => inside,
        MarkerShape::Cross => {
            let t = (m.size * 0.2).max(2.0) * 0.5;
            inside && (dx.abs() < t || dy.abs() < t)
        }
    }
}

fn fill_rows(be: &CpuBackend, dst: &mut FrameMut<'_>, rgba: [u8; 4]) {
    let l = dst.layout;
    let px = if l.format == PixelFormat::Bgra8 {
        [rgba[2], rgba[1], rgba[0], rgba[3]]
    } else {
        rgba
    };
    let row_bytes = l.width as usize * 4;
    be.par_rows(
        dst.data,
        l.stride as usize,
        0..l.height as usize,
        |_, row| {
            for p in row[..row_bytes].chunks_exact_mut(4) {
                p.copy_from_slice(&px);
            }
        },
    );
}

/// Intersection of a destination rectangle with the frame, as pixel ranges.
pub(crate) fn clip(rect: Rect, w: u32, h: u32) -> (Range<usize>, Range<usize>) {
    let x0 = (rect.x as i64).clamp(0, w as i64);
    let x1 = (rect.x as i64 + rect.width as i64).clamp(0, w as i64);
    let y0 = (rect.y as i64).clamp(0, h as i64);
    let y1 = (rect.y as i64 + rect.height as i64).clamp(0, h as i64);
    (x0 as usize..x1 as usize, y0 as usize..y1 as usize)
}

impl CpuBackend {
    fn draw_layer(&self, layer: &Layer<'_>, dst: &mut FrameMut<'_>) -> Result<()> {
        let src = Src::new(layer.src)?;
        let l = dst.layout;
        let bgra = l.format == PixelFormat::Bgra8;
        let (xs, ys) = clip(layer.dst_rect, l.width, l.height);
        if xs.is_empty() || ys.is_empty() {
            return Ok(());
        }
        let c = layer.crop;
        let addr = Addr::Crop {
            x0: c.x as f32,
            y0: c.y as f32,
            x1: (c.x as i64 + c.width as i64) as f32,
            y1: (c.y as i64 + c.height as i64) as f32,
        };
        let map = LayerMap::new(layer.dst_rect, c, layer.rotation);
        self.par_rows(dst.data, l.stride as usize, ys, |y, row| {
            for x in xs.clone() {
                let (sx, sy) = map.at(x as f32 + 0.5, y as f32 + 0.5);
                let col = sample(&src, sx, sy, addr);
                put_pixel(
                    &mut row[x * 4..x * 4 + 4],
                    col,
                    layer.alpha,
                    layer.blend,
                    bgra,
                );
            }
        });
        Ok(())
    }
}

impl GpuBackend for CpuBackend {
    fn name(&self) -> &str {
        "cpu"
    }

    fn composite_with(
        &self,
        layers: &[Layer<'_>],
        mut dst: FrameMut<'_>,
        clear: Clear,
    ) -> Result<GpuStats> {
        let t = Instant::now();
        check_rgb_dst("composite", &dst.layout, dst.data.len())?;
        check_layers(layers)?;
        if let Some(c) = clear.color() {
            fill_rows(self, &mut dst, c);
        }
        for layer in layers {
            self.draw_layer(layer, &mut dst)?;
        }
        Ok(GpuStats {
            execute: t.elapsed(),
            ..Default::default()
        })
    }

    fn project_equirect(
        &self,
        src: FrameRef<'_>,
        view: View,
        dst: FrameMut<'_>,
    ) -> Result<GpuStats> {
        let t = Instant::now();
        check_rgb_dst("project_equirect", &dst.layout, dst.data.len())?;
        check_view(&view)?;
        let s = Src::new(src)?;
        let vp = ViewParams::new(&view);
        let l = dst.layout;
        let bgra = l.format == PixelFormat::Bgra8;
        let (tw, th) = (l.width as f32, l.height as f32);
        let (sw, sh) = (src.layout.width as f32, src.layout.height as f32);
        self.par_rows(
            dst.data,
            l.stride as usize,
            0..l.height as usize,
            |y, row| {
                for x in 0..l.width as usize {
                    let (sx, sy) =
                        equirect_coord(x as f32 + 0.5, y as f32 + 0.5, tw, th, sw, sh, &vp);
                    let c = sample(&s, sx, sy, Addr::Wrap);
                    put_pixel(&mut row[x * 4..x * 4 + 4], c, 1.0, false, bgra);
                }
            },
        );
        Ok(GpuStats {
            execute: t.elapsed(),
            ..Default::default()
        })
    }

    fn draw_markers(&self, markers: &[Marker], dst: FrameMut<'_>) -> Result<GpuStats> {
        let t = Instant::now();
        check_rgb_dst("draw_markers", &dst.layout, dst.data.len())?;
        check_markers(markers)?;
        let l = dst.layout;
        let bgra = l.format == PixelFormat::Bgra8;
        let stride = l.stride as usize;
        for m in markers {
            let half = m.size * 0.5 + 1.0;
            let rect = Rect::new(
                (m.x - half).floor() as i32,
                (m.y - half).floor() as i32,
                (2.0 * half).ceil() as u32 + 1,
                (2.0 * half).ceil() as u32 + 1,
            );
            let (xs, ys) = clip(rect, l.width, l.height);
            let c = [
                m.rgba[0] as f32 / 255.0,
                m.rgba[1] as f32 / 255.0,
                m.rgba[2] as f32 / 255.0,
                m.rgba[3] as f32 / 255.0,
            ];
            for y in ys {
                let row = &mut dst.data[y * stride..y * stride + l.width as usize * 4];
                for x in xs.clone() {
                    if marker_covers(m, x as f32 + 0.5, y as f32 + 0.5) {
                        put_pixel(&mut row[x * 4..x * 4 + 4], c, 1.0, true, bgra);
                    }
                }
            }
        }
        Ok(GpuStats {
            execute: t.elapsed(),
            ..Default::default()
        })
    }

    fn convert(&self, src: FrameRef<'_>, dst: FrameMut<'_>) -> Result<GpuStats> {
        check_rgb_dst("convert", &dst.layout, dst.data.len())?;
        src.layout.check_buffer(src.data.len())?;
        let (w, h) = (dst.layout.width, dst.layout.height);
        let layer = Layer::new(src, Rect::full(w, h)).with_blend(false);
        self.composite_with(&[layer], dst, Clear::Keep)
    }
}

#[cfg(test)]
mod tests;
