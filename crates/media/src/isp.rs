//! Image signal processor backends: colour conversion between NV12, YUV420P, RGBA and BGRA
//! with scaling, from one byte buffer into another.
//!
//! * [`SwscaleIsp`] — libswscale, bilinear filter; keeps a small map of scaling contexts keyed
//!   by (source format and size, destination format and size).
//! * [`CpuIsp`] — the plain-Rust reference. Colour: BT.601 limited range ("studio swing",
//!   Y 16..235, Cb/Cr 16..240) for YUV, full range 0..255 for RGB — the same defaults
//!   swscale uses. Scaling: **bilinear** (2x2 taps) with pixel-centre alignment; chroma planes
//!   are sampled with centred siting (chroma sample between its 2x2 luma pixels), and YUV
//!   output chroma is sampled at the centre of each 2x2 output block. Same-format,
//!   same-size conversions are exact copies.
//! * [`ProcessIsp`] — [`SwscaleIsp`] in sandboxed worker processes ([`serve_isp`]), so a
//!   crash or hang of libswscale fails one conversion, never the process that asked.
//! * [`NullIsp`] — copies when source and destination have the same format and size, errors
//!   otherwise.
//!
//! [`measure_convert_ms`] times a backend for the project's bench.

mod worker;

pub use worker::{
    check_isp_answer, serve_isp, serve_isp_with, ProcessIsp, IDLE_TIMEOUT, ISP_WORKER_ARG,
};

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use crate::error::{MediaError, Result};
use crate::frame::{copy_frame, FrameLayout, FrameMut, FrameRef, PixelFormat};
use crate::sws::{ScaleFilter, Scaler};
use virtsoc_sync::LockExt;

/// A colour-conversion and scaling engine.
pub trait IspBackend: Send + Sync {
    /// Short backend name for logs.
    fn name(&self) -> &str;
    /// Converts `src` into `dst`; the formats and sizes may differ.
    fn convert(&self, src: FrameRef<'_>, dst: FrameMut<'_>) -> Result<()>;
    /// [`convert`](Self::convert) on behalf of `tenant` (a guest): a backend that keeps
    /// state between conversions ([`ProcessIsp`]'s workers) keeps each tenant's apart.
    fn convert_for(&self, tenant: u64, src: FrameRef<'_>, dst: FrameMut<'_>) -> Result<()> {
        let _ = tenant;
        self.convert(src, dst)
    }
    /// [`convert_for`](Self::convert_for), with what the backend keeps for `tenant` between
    /// its conversions (a worker process and its buffers) charged through `charge` for as
    /// long as it is kept: a refused charge fails the conversion with
    /// [`MediaError::OverLimit`] and keeps nothing. Backends that keep nothing ignore it.
    fn convert_charged(
        &self,
        tenant: u64,
        src: FrameRef<'_>,
        dst: FrameMut<'_>,
        charge: Charger<'_>,
    ) -> Result<()> {
        let _ = charge;
        self.convert_for(tenant, src, dst)
    }
    /// `tenant` is gone: drop what was kept for it.
    fn forget(&self, tenant: u64) {
        let _ = tenant;
    }
}

/// Memory charged to a tenant (its guest's memory limit), held as long as this lives.
pub type Charge = Box<dyn std::any::Any + Send>;

/// Why a tenant's limit refused a charge: the charger's own error (the daemon's is its memory
/// accounting's), kept whole for the [`crate::MediaError::OverLimit`] it becomes.
pub type ChargeError = Box<dyn std::error::Error + Send + Sync>;

/// Charges `bytes` to the tenant a conversion is for: the charge, or why its limit refuses
/// them.
pub type Charger<'a> = &'a dyn Fn(u64) -> std::result::Result<Charge, ChargeError>;

/// Validates both frames; true when they have the same format and size, which a plain copy
/// (exact) converts.
fn same_picture(src: &FrameRef<'_>, dst: &FrameMut<'_>) -> Result<bool> {
    src.validate()?;
    dst.validate()?;
    let (s, d) = (&src.layout, &dst.layout);
    Ok((s.format, s.width, s.height) == (d.format, d.width, d.height))
}

/// Scaling configuration: source and destination format and size (strides are per call).
type ScalerKey = (PixelFormat, u32, u32, PixelFormat, u32, u32);

fn key_of(src: &FrameLayout, dst: &FrameLayout) -> ScalerKey {
    (
        src.format, src.width, src.height, dst.format, dst.width, dst.height,
    )
}

struct CacheEntry {
    idle: Vec<Scaler>,
    last_used: u64,
}

#[derive(Default)]
struct ScalerCache {
    entries: HashMap<ScalerKey, CacheEntry>,
    tick: u64,
}

/// Distinct conversion configurations kept; the least recently used one is dropped beyond.
const MAX_CACHED_CONFIGS: usize = 16;
/// Idle contexts kept per configuration (one per concurrently converting thread).
const MAX_IDLE_PER_CONFIG: usize = 4;

/// libswscale-backed ISP (bilinear filter).
///
/// Scaling contexts are cached per configuration. A context is taken out of the cache for
/// the duration of one conversion, so concurrent conversions do not serialise on a lock.
pub struct SwscaleIsp {
    cache: Mutex<ScalerCache>,
    filter: ScaleFilter,
}

impl Default for SwscaleIsp {
    fn default() -> Self {
        Self::new()
    }
}

impl SwscaleIsp {
    /// The fast configuration: `SWS_BILINEAR` with swscale's default (SIMD) paths.
    pub fn new() -> Self {
        SwscaleIsp {
            cache: Mutex::default(),
            filter: ScaleFilter::Bilinear,
        }
    }

    /// The accurate configuration: `SWS_BILINEAR | SWS_ACCURATE_RND | SWS_FULL_CHR_H_INT`
    /// (interpolated chroma, full-precision coefficients); slower.
    pub fn accurate() -> Self {
        SwscaleIsp {
            cache: Mutex::default(),
            filter: ScaleFilter::BilinearAccurate,
        }
    }

    /// Number of configurations currently cached (for tests and stats).
    pub fn cached_configs(&self) -> usize {
        self.lock().entries.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ScalerCache> {
        self.cache.lock_or_recover()
    }

    fn take(&self, key: &ScalerKey) -> Option<Scaler> {
        let mut c = self.lock();
        c.tick += 1;
        let tick = c.tick;
        let e = c.entries.get_mut(key)?;
        e.last_used = tick;
        e.idle.pop()
    }

    fn give_back(&self, key: ScalerKey, scaler: Scaler) {
        let mut c = self.lock();
        c.tick += 1;
        let tick = c.tick;
        if !c.entries.contains_key(&key) && c.entries.len() >= MAX_CACHED_CONFIGS {
            if let Some(oldest) = c
                .entries
                .iter()
                .min_by_key(|(_, e)| e.last_used)
                .map(|(k, _)| *k)
            {
                c.entries.remove(&oldest);
            }
        }
        let e = c.entries.entry(key).or_insert_with(|| CacheEntry {
            idle: Vec::new(),
            last_used: tick,
        });
        e.last_used = tick;
        if e.idle.len() < MAX_IDLE_PER_CONFIG {
            e.idle.push(scaler);
        }
    }
}

impl IspBackend for SwscaleIsp {
    fn name(&self) -> &str {
        match self.filter {
            ScaleFilter::Bilinear => "swscale",
            ScaleFilter::BilinearAccurate => "swscale-accurate",
        }
    }

    fn convert(&self, src: FrameRef<'_>, dst: FrameMut<'_>) -> Result<()> {
        if same_picture(&src, &dst)? {
            // A plain copy is exact and faster; swscale's unscaled NV12 -> NV12 path also
            // leaves the UV plane unwritten when handed only two plane pointers.
            return copy_frame(src, dst);
        }
        let key = key_of(&src.layout, &dst.layout);
        let mut scaler = match self.take(&key) {
            Some(s) => s,
            None => Scaler::for_layouts(src.layout, dst.layout, self.filter)?,
        };
        let r = scaler.scale(src, dst);
        self.give_back(key, scaler);
        r
    }
}

/// Plain-Rust reference ISP: BT.601 limited-range YUV <-> full-range RGB, bilinear scaling
/// (see the module docs for the exact sampling rules).
#[derive(Debug, Default, Clone, Copy)]
pub struct CpuIsp;

impl CpuIsp {
    /// The reference backend.
    pub fn new() -> Self {
        CpuIsp
    }
}

/// BT.601 limited-range YUV to full-range RGB.
pub fn yuv_to_rgb(y: f32, u: f32, v: f32) -> [f32; 3] {
    let c = 1.164_383_6 * (y - 16.0);
    let d = u - 128.0;
    let e = v - 128.0;
    [
        c + 1.596_026_8 * e,
        c - 0.391_762_3 * d - 0.812_967_6 * e,
        c + 2.017_232_2 * d,
    ]
}

/// Full-range RGB to BT.601 limited-range YUV.
pub fn rgb_to_yuv(r: f32, g: f32, b: f32) -> [f32; 3] {
    [
        16.0 + 0.256_788_2 * r + 0.504_129_3 * g + 0.097_905_9 * b,
        128.0 - 0.148_222_9 * r - 0.290_992_8 * g + 0.439_215_7 * b,
        128.0 + 0.439_215_7 * r - 0.367_788_7 * g - 0.071_427 * b,
    ]
}

#[inline]
fn to_u8(v: f32) -> u8 {
    (v + 0.5).clamp(0.0, 255.0) as u8
}

/// Bilinear reads of one frame in its own colour space (YUV or RGB(A)).
struct Sampler<'a> {
    frame: FrameRef<'a>,
}

impl Sampler<'_> {
    /// Bilinear sample of an 8-bit plane with element size `step` and channel offset `ch`.
    #[allow(clippy::too_many_arguments)]
    fn plane(
        &self,
        plane: usize,
        step: usize,
        ch: usize,
        w: usize,
        h: usize,
        x: f32,
        y: f32,
    ) -> f32 {
        let Some(p) = self.frame.layout.plane(plane) else {
            return 0.0;
        };
        let d = self.frame.data;
        let x = x.clamp(0.0, (w - 1) as f32);
        let y = y.clamp(0.0, (h - 1) as f32);
        let x0 = x.floor() as usize;
        let y0 = y.floor() as usize;
        let x1 = (x0 + 1).min(w - 1);
        let y1 = (y0 + 1).min(h - 1);
        let tx = x - x0 as f32;
        let ty = y - y0 as f32;
        let at = |xx: usize, yy: usize| d[p.offset + yy * p.stride + xx * step + ch] as f32;
        let top = at(x0, y0) * (1.0 - tx) + at(x1, y0) * tx;
        let bot = at(x0, y1) * (1.0 - tx) + at(x1, y1) * tx;
        top * (1.0 - ty) + bot * ty
    }

    /// Luma only (YUV sources) at luma pixel coordinates.
    fn luma(&self, x: f32, y: f32) -> f32 {
        let l = &self.frame.layout;
        self.plane(0, 1, 0, l.width as usize, l.height as usize, x, y)
    }

    /// Chroma (U, V) of a YUV source at luma pixel coordinates (centred siting).
    fn chroma(&self, x: f32, y: f32) -> [f32; 2] {
        let l = &self.frame.layout;
        let (cw, ch) = (l.width as usize / 2, l.height as usize / 2);
        let cx = (x + 0.5) / 2.0 - 0.5;
        let cy = (y + 0.5) / 2.0 - 0.5;
        match l.format {
            PixelFormat::Nv12 => [
                self.plane(1, 2, 0, cw, ch, cx, cy),
                self.plane(1, 2, 1, cw, ch, cx, cy),
            ],
            _ => [
                self.plane(1, 1, 0, cw, ch, cx, cy),
                self.plane(2, 1, 0, cw, ch, cx, cy),
            ],
        }
    }

    /// R, G, B, A of an RGB source.
    fn rgba(&self, x: f32, y: f32) -> [f32; 4] {
        let l = &self.frame.layout;
        let (w, h) = (l.width as usize, l.height as usize);
        let order = if l.format == PixelFormat::Bgra8 {
            [2, 1, 0, 3]
        } else {
            [0, 1, 2, 3]
        };
        order.map(|c| self.plane(0, 4, c, w, h, x, y))
    }

    /// The colour at (x, y) as YUV.
    fn yuv(&self, x: f32, y: f32) -> [f32; 3] {
        if self.frame.layout.format.is_yuv() {
            let [u, v] = self.chroma(x, y);
            [self.luma(x, y), u, v]
        } else {
            let [r, g, b, _] = self.rgba(x, y);
            rgb_to_yuv(r, g, b)
        }
    }

    /// The colour at (x, y) as RGBA.
    fn rgb(&self, x: f32, y: f32) -> [f32; 4] {
        if self.frame.layout.format.is_yuv() {
            let [y_, u, v] = self.yuv(x, y);
            let [r, g, b] = yuv_to_rgb(y_, u, v);
            [r, g, b, 255.0]
        } else {
            self.rgba(x, y)
        }
    }
}

impl IspBackend for CpuIsp {
    fn name(&self) -> &str {
        "cpu-reference"
    }

    fn convert(&self, src: FrameRef<'_>, mut dst: FrameMut<'_>) -> Result<()> {
        if same_picture(&src, &dst)? {
            return copy_frame(src, dst);
        }
        let (s, d) = (src.layout, dst.layout);
        let sampler = Sampler { frame: src };
        let sx = s.width as f32 / d.width as f32;
        let sy = s.height as f32 / d.height as f32;
        // Destination pixel centre -> source coordinates.
        let map_x = |dx: f32| (dx + 0.5) * sx - 0.5;
        let map_y = |dy: f32| (dy + 0.5) * sy - 0.5;
        let (dw, dh) = (d.width as usize, d.height as usize);
        match d.format {
            PixelFormat::Rgba8 | PixelFormat::Bgra8 => {
                let order = if d.format == PixelFormat::Bgra8 {
                    [2, 1, 0, 3]
                } else {
                    [0, 1, 2, 3]
                };
                let stride = d.stride as usize;
                for y in 0..dh {
                    let fy = map_y(y as f32);
                    let row = &mut dst.data[y * stride..y * stride + dw * 4];
                    for (x, px) in row.chunks_exact_mut(4).enumerate() {
                        let c = sampler.rgb(map_x(x as f32), fy);
                        for (i, &o) in order.iter().enumerate() {
                            px[i] = to_u8(c[o]);
                        }
                    }
                }
            }
            PixelFormat::Nv12 | PixelFormat::Yuv420p => {
                let src_yuv = s.format.is_yuv();
                let format = d.format;
                let mut planes = dst.planes_mut();
                let luma_stride = d.stride as usize;
                for y in 0..dh {
                    let fy = map_y(y as f32);
                    let row = &mut planes[0][y * luma_stride..y * luma_stride + dw];
                    for (x, px) in row.iter_mut().enumerate() {
                        let fx = map_x(x as f32);
                        let l = if src_yuv {
                            sampler.luma(fx, fy)
                        } else {
                            sampler.yuv(fx, fy)[0]
                        };
                        *px = to_u8(l);
                    }
                }
                let (cw, ch) = (dw / 2, dh / 2);
                for cy in 0..ch {
                    // Centre of the 2x2 output block in destination luma coordinates.
                    let fy = map_y(2.0 * cy as f32 + 0.5);
                    for cx in 0..cw {
                        let fx = map_x(2.0 * cx as f32 + 0.5);
                        let [_, u, v] = sampler.yuv(fx, fy);
                        let (u, v) = (to_u8(u), to_u8(v));
                        if format == PixelFormat::Nv12 {
                            let o = cy * luma_stride + cx * 2;
                            planes[1][o] = u;
                            planes[1][o + 1] = v;
                        } else {
                            let o = cy * (luma_stride / 2) + cx;
                            planes[1][o] = u;
                            planes[2][o] = v;
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

/// Pass-through ISP: copies frames of equal format and size (strides may differ), refuses
/// anything that would need conversion or scaling.
#[derive(Debug, Default, Clone, Copy)]
pub struct NullIsp;

impl NullIsp {
    /// The pass-through backend.
    pub fn new() -> Self {
        NullIsp
    }
}

impl IspBackend for NullIsp {
    fn name(&self) -> &str {
        "null"
    }

    fn convert(&self, src: FrameRef<'_>, dst: FrameMut<'_>) -> Result<()> {
        src.validate()?;
        dst.validate()?;
        let dst_layout = dst.layout;
        copy_frame(src, dst).map_err(|e| match e {
            MediaError::Unsupported(_) => MediaError::Unsupported(format!(
                "null ISP only copies; {:?} -> {:?} needs conversion",
                src.layout, dst_layout
            )),
            e => e,
        })
    }
}

/// Median wall time in milliseconds of one `src -> dst` conversion by `isp`, over
/// `iterations` runs (at least 1) after one warm-up run. Source and destination buffers are
/// rotated among three of each so that large frames are measured streaming through memory
/// rather than cache-resident.
pub fn measure_convert_ms(
    isp: &dyn IspBackend,
    src: FrameLayout,
    dst: FrameLayout,
    iterations: usize,
) -> Result<f64> {
    src.validate()?;
    dst.validate()?;
    let iterations = iterations.max(1);
    let mut srcs: Vec<Vec<u8>> = (0..3u8)
        .map(|k| {
            (0..src.size())
                .map(|i| ((i / 7) as u8).wrapping_add(k))
                .collect()
        })
        .collect();
    let mut dsts: Vec<Vec<u8>> = (0..3).map(|_| vec![0u8; dst.size()]).collect();
    // Warm-up (context creation, page faults of the destination buffers).
    for d in dsts.iter_mut() {
        isp.convert(FrameRef::new(src, &srcs[0])?, FrameMut::new(dst, d)?)?;
    }
    let mut times = Vec::with_capacity(iterations);
    for i in 0..iterations {
        let s = &mut srcs[i % 3];
        let d = &mut dsts[i % 3];
        let t = Instant::now();
        isp.convert(FrameRef::new(src, s)?, FrameMut::new(dst, d)?)?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(|a, b| a.total_cmp(b));
    Ok(times[times.len() / 2])
}
