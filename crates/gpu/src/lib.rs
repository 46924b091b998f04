//! virtsoc GPU device backends.
//!
//! The daemon's GPU device gets inputs and outputs as plain byte buffers (the
//! bytes of SVM region replicas), described by a [`FrameLayout`]. Every backend
//! implements [`GpuBackend`]:
//!
//! * [`GpuBackend::composite`]: layers (NV12, YUV420P, RGBA, BGRA; crop, scale,
//!   rotation, plane alpha, blending) drawn in order onto an RGBA8/BGRA8 frame.
//!   YUV sources are sampled directly (BT.601 limited range), no conversion pass.
//! * [`GpuBackend::project_equirect`]: a rectilinear view of an equirectangular
//!   360-degree source.
//! * [`GpuBackend::draw_markers`]: filled squares or crosses (AR overlays) over an
//!   existing frame.
//! * [`GpuBackend::convert`]: colour conversion and scaling (the ISP's GPU path),
//!   a compute shader on wgpu.
//!
//! [`WgpuBackend`] also keeps frames resident on the device: [`GpuImage`]s
//! filled and read by byte ranges of their linear layout
//! ([`WgpuBackend::write_image`], [`WgpuBackend::read_image`]), and the same
//! operations run asynchronously between resident images
//! ([`WgpuBackend::submit_composite_images`] and friends, completion through
//! [`WgpuBackend::on_submission_done`]). The byte API runs on that path.
//!
//! Backends: [`WgpuBackend`] (headless wgpu, any adapter: lavapipe on a CPU-only
//! host, a real GPU elsewhere), [`CpuBackend`] (plain Rust; the reference and the
//! fallback when no adapter exists) and [`NullBackend`] (validates, fills with a
//! constant; for plumbing tests).
//!
//! ```
//! use virtsoc_gpu::{pattern, CpuBackend, FrameLayout, GpuBackend, Layer, OwnedFrame, PixelFormat, Rect};
//!
//! let video = pattern::nv12_gradient(64, 48, 0)?;
//! let mut screen = OwnedFrame::new(FrameLayout::packed(PixelFormat::Rgba8, 128, 96)?)?;
//! let layer = Layer::new(video.as_ref(), Rect::new(0, 0, 128, 96)).with_blend(false);
//! let backend = CpuBackend::new(); // or WgpuBackend::new()?
//! let stats = backend.composite(&[layer], screen.as_mut())?;
//! assert!(stats.total() > std::time::Duration::ZERO);
//! # Ok::<(), virtsoc_gpu::GpuError>(())
//! ```
//!
//! # Sampling conventions (shared by all backends)
//!
//! * Bilinear filtering; pixel centres at `i + 0.5`.
//! * Chroma is centre-sited: chroma coordinate = luma coordinate / 2.
//! * Composition clamps sampling to the crop rectangle (no bleeding of pixels
//!   outside the crop); equirect wraps horizontally and clamps vertically.
//! * BT.601 limited range: `R = 1.164383 (Y-16) + 1.596027 (V-128)`,
//!   `G = 1.164383 (Y-16) - 0.391762 (U-128) - 0.812968 (V-128)`,
//!   `B = 1.164383 (Y-16) + 2.017232 (U-128)`, clamped to [0, 255].
//! * Straight (non-premultiplied) alpha. With `blend`, a layer pixel of alpha
//!   `A = src.a * layer.alpha` gives `rgb = src.rgb * A + dst.rgb * (1 - A)`,
//!   `a = A + dst.a * (1 - A)`. Without `blend`, it replaces the destination
//!   (`a = A`).
//! * Results are rounded to the nearest 8-bit value.

mod cpu;
mod null;
pub mod pattern;
mod wgpu_backend;

use std::time::{Duration, Instant};

pub use cpu::CpuBackend;
pub use null::NullBackend;
pub use virtsoc_frame::{
    FrameError, FrameLayout, FrameMut, FrameRef, OwnedFrame, PixelFormat, PlaneInfo, MAX_DIMENSION,
};
/// The raw window and display handles a [`SurfacePresenter`] is made from (wgpu's own).
pub use wgpu::rwh;
pub use wgpu_backend::{
    AdapterSummary, FloorTimings, GpuImage, ImageLayer, PendingFrame, SampleAxis, SubmissionId,
    SurfaceOutcome, SurfacePresenter, WgpuBackend, CPU_DRIVER_THREADS, FLOOR_RUNS,
};

/// Most layers one composition accepts.
pub const MAX_LAYERS: usize = 64;
/// Most markers one `draw_markers` call accepts.
pub const MAX_MARKERS: usize = 65536;
/// Largest absolute coordinate (and extent) accepted for destination rectangles
/// and markers.
pub const MAX_COORD: u32 = 1 << 16;

/// Errors of the GPU device backends. Bad arguments never panic.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum GpuError {
    /// No wgpu adapter could be found (message from wgpu); use [`CpuBackend`] instead.
    #[error("no GPU adapter: {0} (install mesa-vulkan-drivers for a CPU Vulkan device)")]
    NoAdapter(String),
    /// The adapter was found but opening a device on it failed (message from wgpu).
    #[error("GPU device request failed: {0}")]
    DeviceRequest(String),
    /// A frame layout or buffer that breaks a rule of `virtsoc-frame` (zero or odd size,
    /// stride too small, buffer too short), or a frame larger than the device takes
    /// ([`FrameError::TooLarge`] with the device's limit).
    #[error("invalid frame: {0}")]
    Frame(#[from] FrameError),
    /// Valid layouts that do not fit together (a destination that does not match
    /// its submission); the text says what. A layout breaking the rules on its own
    /// is a [`GpuError::Frame`].
    #[error("invalid frame layout: {0}")]
    InvalidLayout(String),
    /// The operation does not accept this pixel format in this role.
    #[error("{op}: unsupported {role} format {format:?}")]
    UnsupportedFormat {
        /// Operation name (`"composite"`, `"convert"`, ...).
        op: &'static str,
        /// Role of the frame (`"source"`, `"destination"`).
        role: &'static str,
        /// The rejected format.
        format: PixelFormat,
    },
    /// A zero-sized rectangle or one with coordinates beyond [`MAX_COORD`].
    #[error("invalid rectangle {rect:?}: {reason}")]
    InvalidRect {
        /// The rejected rectangle.
        rect: Rect,
        /// Why it was rejected.
        reason: &'static str,
    },
    /// A crop rectangle not wholly inside its source frame.
    #[error("rectangle {rect:?} lies outside the {width}x{height} source")]
    RectOutOfBounds {
        /// The rejected crop.
        rect: Rect,
        /// Source width in pixels.
        width: u32,
        /// Source height in pixels.
        height: u32,
    },
    /// An out-of-range parameter (layer alpha, view angles, marker position or size, ...); the text
    /// says which.
    #[error("invalid parameter: {0}")]
    InvalidParameter(String),
    /// More items than one call accepts ([`MAX_LAYERS`], [`MAX_MARKERS`]).
    #[error("too many {what}: {count} > {max}")]
    TooMany {
        /// What there were too many of (`"layers"`, `"markers"`).
        what: &'static str,
        /// How many were given.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// A submission id the backend never handed out (beyond its last submission).
    #[error("unknown submission {0}")]
    UnknownSubmission(u64),
    /// Any other failure inside the backend (readback mapping, poller thread, dropped
    /// backend, a submission that never completed); the text says what.
    #[error("GPU backend error: {0}")]
    Backend(String),
    /// The GPU device was lost; the backend is unusable and must be recreated.
    #[error("GPU device lost: {0}")]
    DeviceLost(String),
}

/// Result of the GPU backend operations.
pub type Result<T> = std::result::Result<T, GpuError>;

/// An axis-aligned rectangle in pixels. Crops must lie inside their source;
/// destination rectangles may extend past the destination and are clipped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Rect {
    /// Left edge in pixels (may be negative for destination rectangles).
    pub x: i32,
    /// Top edge in pixels (may be negative for destination rectangles).
    pub y: i32,
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
}

impl Rect {
    /// A rectangle at (`x`, `y`) of `width` x `height` pixels.
    pub const fn new(x: i32, y: i32, width: u32, height: u32) -> Self {
        Rect {
            x,
            y,
            width,
            height,
        }
    }

    /// The rectangle covering a whole `width` x `height` frame.
    pub const fn full(width: u32, height: u32) -> Self {
        Rect::new(0, 0, width, height)
    }
}

/// Clockwise rotation of the cropped source as it is placed into `dst_rect`
/// (`dst_rect` is given in the rotated orientation).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Rotation {
    #[default]
    /// No rotation (the default).
    R0,
    /// 90 degrees clockwise.
    R90,
    /// 180 degrees.
    R180,
    /// 270 degrees clockwise (90 counter-clockwise).
    R270,
}

impl Rotation {
    /// Clockwise angle in degrees.
    pub fn degrees(self) -> u32 {
        match self {
            Rotation::R0 => 0,
            Rotation::R90 => 90,
            Rotation::R180 => 180,
            Rotation::R270 => 270,
        }
    }
}

/// One composition layer drawn from a source `S`: a frame's bytes ([`Layer`]) or, on the
/// wgpu backend, a resident image (`ImageLayer`). How a source is placed (crop, destination,
/// rotation, alpha, blending) and its builders are declared once, here, for both.
#[derive(Clone, Copy, Debug)]
pub struct LayerOf<S> {
    /// The source: a frame (layout and bytes) or a resident image; any [`PixelFormat`].
    pub src: S,
    /// Source region, in source pixels; must lie inside the source.
    pub crop: Rect,
    /// Destination region, in destination pixels; clipped to the destination.
    pub dst_rect: Rect,
    /// Clockwise rotation applied to the cropped source.
    pub rotation: Rotation,
    /// Plane alpha in [0, 1], multiplied with the source alpha.
    pub alpha: f32,
    /// Blend over what is below (straight alpha) instead of replacing it.
    pub blend: bool,
}

/// One composition layer drawn from a frame's bytes.
pub type Layer<'a> = LayerOf<FrameRef<'a>>;

impl<'a> Layer<'a> {
    /// The whole source drawn into `dst_rect`, unrotated, opaque plane alpha,
    /// blending on.
    pub fn new(src: FrameRef<'a>, dst_rect: Rect) -> Self {
        LayerOf::whole(src, &src.layout, dst_rect)
    }
}

impl<S> LayerOf<S> {
    /// The whole of `src` (laid out as `layout`) drawn into `dst_rect`, unrotated, opaque
    /// plane alpha, blending on.
    fn whole(src: S, layout: &FrameLayout, dst_rect: Rect) -> Self {
        LayerOf {
            src,
            crop: Rect::full(layout.width, layout.height),
            dst_rect,
            rotation: Rotation::R0,
            alpha: 1.0,
            blend: true,
        }
    }

    /// The same placement drawn from another source (e.g. a frame's resident copy).
    pub fn drawn_from<T>(&self, src: T) -> LayerOf<T> {
        LayerOf {
            src,
            crop: self.crop,
            dst_rect: self.dst_rect,
            rotation: self.rotation,
            alpha: self.alpha,
            blend: self.blend,
        }
    }

    /// Replaces the crop (source pixels; must lie inside the source).
    pub fn with_crop(mut self, crop: Rect) -> Self {
        self.crop = crop;
        self
    }

    /// Replaces the rotation.
    pub fn with_rotation(mut self, rotation: Rotation) -> Self {
        self.rotation = rotation;
        self
    }

    /// Replaces the plane alpha (must be in [0, 1]).
    pub fn with_alpha(mut self, alpha: f32) -> Self {
        self.alpha = alpha;
        self
    }

    /// Turns blending over the layers below on or off.
    pub fn with_blend(mut self, blend: bool) -> Self {
        self.blend = blend;
        self
    }
}

/// What the destination holds before the first layer is drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Clear {
    /// Fill with an RGBA colour (given in R, G, B, A order whatever the
    /// destination byte order).
    Color([u8; 4]),
    /// Keep the destination's current contents.
    Keep,
    /// Opaque black (the default).
    #[default]
    Black,
}

impl Clear {
    pub(crate) fn color(self) -> Option<[u8; 4]> {
        match self {
            Clear::Color(c) => Some(c),
            Clear::Black => Some([0, 0, 0, 255]),
            Clear::Keep => None,
        }
    }
}

/// Camera for the equirectangular projection, all angles in radians.
/// `yaw = 0, pitch = 0` looks at the centre of the equirect image; positive yaw
/// turns right (towards larger x), positive pitch looks up.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct View {
    /// Horizontal angle in radians; positive turns right. Any finite value.
    pub yaw: f32,
    /// Vertical angle in radians; positive looks up. Any finite value.
    pub pitch: f32,
    /// Vertical field of view, in (0, 179 degrees].
    pub fov_y: f32,
}

/// Marker shapes for AR overlays.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum MarkerShape {
    #[default]
    /// A filled square (the default).
    Square,
    /// Two bars of thickness `max(size * 0.2, 2)` through the centre.
    Cross,
}

/// A filled square or cross centred at (`x`, `y`) (destination pixels) with
/// side `size`, colour `rgba` (straight alpha, blended over the frame).
/// A pixel belongs to the square when its centre `c` satisfies
/// `-size/2 <= c - centre < size/2` on both axes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Marker {
    /// Centre x in destination pixels (absolute value at most [`MAX_COORD`]).
    pub x: f32,
    /// Centre y in destination pixels (absolute value at most [`MAX_COORD`]).
    pub y: f32,
    /// Side length in pixels, in (0, [`MAX_COORD`]].
    pub size: f32,
    /// Colour, R, G, B, A order, straight alpha.
    pub rgba: [u8; 4],
    /// Square or cross.
    pub shape: MarkerShape,
}

impl Marker {
    /// A filled square centred at (`x`, `y`) with side `size` pixels.
    pub fn square(x: f32, y: f32, size: f32, rgba: [u8; 4]) -> Self {
        Marker {
            x,
            y,
            size,
            rgba,
            shape: MarkerShape::Square,
        }
    }

    /// A cross centred at (`x`, `y`) spanning `size` pixels.
    pub fn cross(x: f32, y: f32, size: f32, rgba: [u8; 4]) -> Self {
        Marker {
            x,
            y,
            size,
            rgba,
            shape: MarkerShape::Cross,
        }
    }
}

/// Where the time of one operation went.
///
/// * `upload`: validation and handing the source bytes to the device (for wgpu:
///   staging the planes with `write_texture`; the copy itself runs at submit).
/// * `execute`: from submission until the device finished (for wgpu this
///   includes the staged uploads, the draw/dispatch and the copy into the
///   readback buffer).
/// * `readback`: mapping the result and copying it into the destination bytes.
///
/// The CPU backend reports all its work as `execute`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GpuStats {
    /// Validation and staging of the source bytes.
    pub upload: Duration,
    /// Device execution, from submission to completion.
    pub execute: Duration,
    /// Mapping the result and copying it out.
    pub readback: Duration,
}

impl GpuStats {
    /// Sum of the three phases.
    pub fn total(&self) -> Duration {
        self.upload + self.execute + self.readback
    }
}

/// The GPU device operations. Implementations are `Send + Sync`; calls may come
/// from several threads.
pub trait GpuBackend: Send + Sync {
    /// Short backend name ("wgpu", "cpu", "null").
    fn name(&self) -> &str;

    /// Draws `layers` in order onto `dst` (RGBA8 or BGRA8) after applying `clear`.
    fn composite_with(
        &self,
        layers: &[Layer<'_>],
        dst: FrameMut<'_>,
        clear: Clear,
    ) -> Result<GpuStats>;

    /// [`GpuBackend::composite_with`] onto a destination cleared to opaque black.
    fn composite(&self, layers: &[Layer<'_>], dst: FrameMut<'_>) -> Result<GpuStats> {
        self.composite_with(layers, dst, Clear::Black)
    }

    /// Draws `layers` in order onto the `damage` rectangle of `dst` (RGBA8 or BGRA8) over
    /// its current contents; pixels outside `damage` are left alone. The layers are placed
    /// as for the whole target. By default through a scratch frame of the damaged area (its
    /// pixels copied in, composed with the layers moved by the rectangle's origin, copied
    /// back): exact for every backend, and cheap when the damage is small.
    fn composite_damage(
        &self,
        layers: &[Layer<'_>],
        dst: FrameMut<'_>,
        damage: Rect,
    ) -> Result<GpuStats> {
        let l = dst.layout;
        check_rgb_dst("composite", &l, dst.data.len())?;
        check_damage(damage, l.width, l.height)?;
        let (x, y, w, h) = (
            damage.x as usize,
            damage.y as usize,
            damage.width as usize,
            damage.height as usize,
        );
        let stride = l.stride as usize;
        let mut scratch =
            OwnedFrame::new(FrameLayout::packed(l.format, damage.width, damage.height)?)?;
        let rows = |data_row: usize| data_row * stride + x * 4..data_row * stride + (x + w) * 4;
        for (r, out) in scratch.data.chunks_exact_mut(w * 4).enumerate().take(h) {
            out.copy_from_slice(&dst.data[rows(y + r)]);
        }
        let moved: Vec<Layer<'_>> = layers
            .iter()
            .map(|layer| Layer {
                dst_rect: Rect::new(
                    layer.dst_rect.x - damage.x,
                    layer.dst_rect.y - damage.y,
                    layer.dst_rect.width,
                    layer.dst_rect.height,
                ),
                ..*layer
            })
            .collect();
        let stats = self.composite_with(&moved, scratch.as_mut(), Clear::Keep)?;
        for (r, src) in scratch.data.chunks_exact(w * 4).enumerate().take(h) {
            dst.data[rows(y + r)].copy_from_slice(src);
        }
        Ok(stats)
    }

    /// Renders a rectilinear view of the equirectangular 360-degree `src` into
    /// `dst` (RGBA8 or BGRA8).
    fn project_equirect(
        &self,
        src: FrameRef<'_>,
        view: View,
        dst: FrameMut<'_>,
    ) -> Result<GpuStats>;

    /// Blends markers, in order, over the existing contents of `dst` (RGBA8 or BGRA8).
    fn draw_markers(&self, markers: &[Marker], dst: FrameMut<'_>) -> Result<GpuStats>;

    /// Converts and scales the whole of `src` (any format) into the whole of
    /// `dst` (RGBA8 or BGRA8). On wgpu this is a compute shader.
    fn convert(&self, src: FrameRef<'_>, dst: FrameMut<'_>) -> Result<GpuStats>;
}

// ---------------------------------------------------------------------------
// Validation shared by all backends.

/// Checks that `damage` is a non-empty rectangle inside a `width` x `height` target.
pub fn check_damage(damage: Rect, width: u32, height: u32) -> Result<()> {
    let inside = damage.x >= 0
        && damage.y >= 0
        && damage.width > 0
        && damage.height > 0
        && damage.x as u64 + damage.width as u64 <= width as u64
        && damage.y as u64 + damage.height as u64 <= height as u64;
    if !inside {
        return Err(GpuError::InvalidParameter(format!(
            "damage {damage:?} is not a non-empty rectangle inside the {width}x{height} target"
        )));
    }
    Ok(())
}

pub(crate) fn check_rgb_dst(op: &'static str, layout: &FrameLayout, len: usize) -> Result<()> {
    if !layout.format.is_rgb() {
        return Err(GpuError::UnsupportedFormat {
            op,
            role: "destination",
            format: layout.format,
        });
    }
    layout.check_buffer(len)?;
    Ok(())
}

pub(crate) fn check_dst_rect(rect: Rect) -> Result<()> {
    if rect.width == 0 || rect.height == 0 {
        return Err(GpuError::InvalidRect {
            rect,
            reason: "zero-sized destination rectangle",
        });
    }
    let m = MAX_COORD as i64;
    if (rect.x as i64).abs() > m
        || (rect.y as i64).abs() > m
        || rect.width as i64 > m
        || rect.height as i64 > m
    {
        return Err(GpuError::InvalidRect {
            rect,
            reason: "destination rectangle coordinates too large",
        });
    }
    Ok(())
}

pub(crate) fn check_crop(crop: Rect, src: &FrameLayout) -> Result<()> {
    if crop.width == 0 || crop.height == 0 {
        return Err(GpuError::InvalidRect {
            rect: crop,
            reason: "zero-sized crop",
        });
    }
    let inside = crop.x >= 0
        && crop.y >= 0
        && crop.x as u64 + crop.width as u64 <= src.width as u64
        && crop.y as u64 + crop.height as u64 <= src.height as u64;
    if !inside {
        return Err(GpuError::RectOutOfBounds {
            rect: crop,
            width: src.width,
            height: src.height,
        });
    }
    Ok(())
}

pub(crate) fn check_layers(layers: &[Layer<'_>]) -> Result<()> {
    if layers.len() > MAX_LAYERS {
        return Err(GpuError::TooMany {
            what: "layers",
            count: layers.len(),
            max: MAX_LAYERS,
        });
    }
    for layer in layers {
        layer.src.layout.check_buffer(layer.src.data.len())?;
        check_crop(layer.crop, &layer.src.layout)?;
        check_dst_rect(layer.dst_rect)?;
        if !(layer.alpha.is_finite() && (0.0..=1.0).contains(&layer.alpha)) {
            return Err(GpuError::InvalidParameter(format!(
                "layer alpha {} outside [0, 1]",
                layer.alpha
            )));
        }
    }
    Ok(())
}

pub(crate) fn check_view(view: &View) -> Result<()> {
    let max_fov = 179f32.to_radians();
    if !(view.yaw.is_finite() && view.pitch.is_finite()) {
        return Err(GpuError::InvalidParameter(format!(
            "view angles must be finite: {view:?}"
        )));
    }
    if !(view.fov_y.is_finite() && view.fov_y > 0.0 && view.fov_y <= max_fov) {
        return Err(GpuError::InvalidParameter(format!(
            "fov_y {} outside (0, 179 degrees]",
            view.fov_y
        )));
    }
    Ok(())
}

pub(crate) fn check_markers(markers: &[Marker]) -> Result<()> {
    if markers.len() > MAX_MARKERS {
        return Err(GpuError::TooMany {
            what: "markers",
            count: markers.len(),
            max: MAX_MARKERS,
        });
    }
    let m = MAX_COORD as f32;
    for mk in markers {
        let ok = mk.x.is_finite()
            && mk.y.is_finite()
            && mk.size.is_finite()
            && mk.x.abs() <= m
            && mk.y.abs() <= m
            && mk.size > 0.0
            && mk.size <= m;
        if !ok {
            return Err(GpuError::InvalidParameter(format!("bad marker {mk:?}")));
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Measurement.

/// Result of [`measure`]: medians over the measured runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuTimings {
    /// Name of the measured backend ([`GpuBackend::name`]).
    pub backend: String,
    /// Destination width in pixels.
    pub width: u32,
    /// Destination height in pixels.
    pub height: u32,
    /// Number of measured runs (without the warm-up), [`MEASURE_RUNS`].
    pub runs: u32,
    /// Per-phase medians (each phase's median taken independently).
    pub median: GpuStats,
    /// Median wall time of one whole composition call.
    pub median_total: Duration,
    /// Fastest measured composition call.
    pub min_total: Duration,
    /// Slowest measured composition call.
    pub max_total: Duration,
}

/// Runs measured by [`measure`] after one warm-up.
pub const MEASURE_RUNS: u32 = 5;

/// Times composition of a full-screen NV12 video layer (source of the
/// destination size, drawn without blending) plus a full-screen RGBA UI layer with translucent bars, blended, into an RGBA destination of
/// `width` x `height`. One warm-up run, then the median of [`MEASURE_RUNS`]
/// runs; the destination alternates between two buffers.
pub fn measure(backend: &dyn GpuBackend, width: u32, height: u32) -> Result<GpuTimings> {
    let video = pattern::nv12_gradient(width, height, 0)?;
    let ui = pattern::rgba_ui(width, height)?;
    let dst_layout = FrameLayout::packed(PixelFormat::Rgba8, width, height)?;
    let mut dsts = [OwnedFrame::new(dst_layout)?, OwnedFrame::new(dst_layout)?];
    let layers = [
        Layer::new(video.as_ref(), Rect::full(width, height)).with_blend(false),
        Layer::new(ui.as_ref(), Rect::full(width, height)),
    ];
    backend.composite(&layers, dsts[1].as_mut())?;
    let mut stats = Vec::with_capacity(MEASURE_RUNS as usize);
    let mut totals = Vec::with_capacity(MEASURE_RUNS as usize);
    for i in 0..MEASURE_RUNS as usize {
        let t = Instant::now();
        let s = backend.composite(&layers, dsts[i % 2].as_mut())?;
        totals.push(t.elapsed());
        stats.push(s);
    }
    fn median(mut v: Vec<Duration>) -> Duration {
        v.sort();
        v[v.len() / 2]
    }
    let median_stats = GpuStats {
        upload: median(stats.iter().map(|s| s.upload).collect()),
        execute: median(stats.iter().map(|s| s.execute).collect()),
        readback: median(stats.iter().map(|s| s.readback).collect()),
    };
    Ok(GpuTimings {
        backend: backend.name().to_string(),
        width,
        height,
        runs: MEASURE_RUNS,
        median: median_stats,
        median_total: median(totals.clone()),
        min_total: totals.iter().copied().min().unwrap_or_default(),
        max_total: totals.iter().copied().max().unwrap_or_default(),
    })
}
