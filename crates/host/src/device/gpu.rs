//! The gpu device: layer composition with direct YUV sampling, 360-degree projection, AR
//! marker overlays and colour conversion, on a `virtsoc-gpu` backend.
//!
//! # Backends
//!
//! `wgpu` (headless Vulkan: a real GPU, or Mesa's lavapipe on a CPU-only host), `cpu` (the
//! plain-Rust reference) or `null` (validates, fills with grey). When `wgpu` finds no adapter
//! the device falls back to `cpu` with a warning in the log and says so in
//! [`Device::backend`], so the daemon starts on hosts without Vulkan.
//!
//! # Regions
//!
//! Formats and sizes come from the regions' metadata: NV12, YUV420P, RGBA8 and BGRA8 map to
//! the backend's pixel formats; Blob and YUYV are `NotSupported`. Destinations must be RGBA8
//! or BGRA8 (`NotSupported` otherwise).
//!
//! The regions a command names as arguments are bracketed by the guest (its library's
//! `command_with_access` does it). The *source regions named inside layer records* of
//! `composite` are not command arguments: the guest must itself `begin_access(src, GPU,
//! Read)` on each of them before the command and end the access after it. A source that is
//! not one of the guest's regions answers `NoSuchRegion`; one the GPU has not begun to access
//! answers `BadArgument`.
//!
//! # Locking
//!
//! The device never holds two region locks at once: every source is copied out of its
//! replica under its own lock (one at a time, once per distinct region), then the destination
//! replica alone is locked while the backend draws into it. So there is no lock order between
//! regions to get wrong (a guest may even name the destination as a source). The price is one
//! memcpy per source frame, small next to the upload the GPU needs anyway.
//!
//! # Timeline (physical fences)
//!
//! Each backend call gets the next sequence number of a [`PhysicalFenceTable`] timeline
//! named `gpu`, shared by this device and the ISP's `gpu` backend, and is marked complete
//! when the call returns. The backend calls are synchronous (the wgpu backend waits for its
//! submissions and reads the result back before returning), so the command has completed when
//! `execute` returns and a `Signal` queued after it in the guest's device queue is already
//! correctly ordered: no virtual fence is attached to the timeline today. It records what the
//! device did (issued and completed counts appear in [`Device::backend`] and the debug log),
//! and it is where an asynchronous execute (submit now, read back later) would attach the
//! guest's fences.
//!
//! # Results and errors
//!
//! Every command returns `gpu_us`, the time the backend spent on it (upload, execution and
//! readback) in microseconds. Bad input answers a status and never panics: `OutOfRange` when
//! `count` records do not fit the record region, `BadArgument` for bad records (rotation
//! other than 0/90/180/270, alpha outside [0, 1], empty or oversized rectangles, crops
//! outside their source, bad view angles or marker sizes), `NotSupported` for formats,
//! `DeviceError` when the backend itself fails.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use virtsoc_devapi::gpu::{Command, CompositeReply, ConvertReply, MarkersReply, ProjectReply};
use virtsoc_devapi::{MarkerRecord, MARKER_RECORD};
use virtsoc_fence::{MemPage, PhysicalFenceTable, VirtualFenceTable};
use virtsoc_gpu::{
    CpuBackend, FrameLayout, FrameMut, FrameRef, GpuBackend, GpuError, GpuStats, Layer, Marker,
    NullBackend, View, WgpuBackend, MAX_COORD, MAX_LAYERS, MAX_MARKERS,
};
use virtsoc_proto::Status;

use super::layers::{crop_inside, layout_of, read_layers, read_records};
use super::registry::DeviceConfig;
use super::{Device, DeviceCtx, DeviceResult};
use crate::{HostError, Result};

/// The gpu device.
pub struct Gpu {
    backend: Arc<dyn GpuBackend>,
    /// What serves the device, for listings (adapter, fallback reason).
    desc: String,
    timeline: PhysicalFenceTable,
    /// Highest sequence number handed out on the timeline.
    issued: AtomicU64,
}

impl Gpu {
    /// Builds the device from the daemon's configuration (`cfg.gpu`: wgpu, cpu or null).
    pub fn new(cfg: &DeviceConfig) -> Result<Self> {
        let (backend, desc): (Arc<dyn GpuBackend>, String) = match cfg.gpu.as_str() {
            "wgpu" => match WgpuBackend::new() {
                Ok(b) => {
                    let desc = format!("wgpu on {}", b.adapter_info());
                    (Arc::new(b), desc)
                }
                Err(e) => {
                    log::warn!("gpu: wgpu unavailable ({e}); falling back to the CPU backend");
                    (
                        Arc::new(CpuBackend::new()),
                        "cpu (fallback: no usable wgpu adapter, see the log)".to_string(),
                    )
                }
            },
            "cpu" => (Arc::new(CpuBackend::new()), "cpu reference".into()),
            "null" => (Arc::new(NullBackend::new()), "null (fills grey)".into()),
            other => {
                return Err(HostError::Config(format!(
                    "unknown gpu backend {other:?} (wgpu, cpu, null)"
                )))
            }
        };
        log::info!("gpu: {desc}");
        Ok(Self::with_backend(backend, desc))
    }

    /// A device on an explicit backend.
    pub fn with_backend(backend: Arc<dyn GpuBackend>, desc: String) -> Self {
        let fences = Arc::new(VirtualFenceTable::new(Arc::new(MemPage::new())));
        Gpu {
            backend,
            desc,
            timeline: PhysicalFenceTable::new("gpu", fences),
            issued: AtomicU64::new(0),
        }
    }

    /// Name of the backend in use ("wgpu", "cpu", "null").
    pub fn backend_name(&self) -> &str {
        self.backend.name()
    }

    /// Sequence numbers issued on the GPU timeline and the completion watermark.
    pub fn timeline_counts(&self) -> (u64, u64) {
        (
            self.issued.load(Ordering::Relaxed),
            self.timeline.last_completed(),
        )
    }

    /// Runs one backend call as one submission of the GPU timeline.
    pub(crate) fn run(
        &self,
        op: &str,
        f: impl FnOnce(&dyn GpuBackend) -> virtsoc_gpu::Result<GpuStats>,
    ) -> std::result::Result<GpuStats, Status> {
        let seq = self.timeline.next_seqno();
        self.issued.fetch_max(seq, Ordering::Relaxed);
        let r = f(&*self.backend);
        // The call has finished (or failed) when it returns: retire the seqno either way so
        // the timeline never stalls.
        if let Err(e) = self.timeline.complete(seq) {
            log::warn!("gpu: timeline: {e}");
        }
        match r {
            Ok(stats) => {
                log::debug!(
                    "gpu: {op} #{seq} done in {:?} (upload {:?}, execute {:?}, readback {:?})",
                    stats.total(),
                    stats.upload,
                    stats.execute,
                    stats.readback
                );
                Ok(stats)
            }
            Err(e) => {
                log::debug!("gpu: {op} #{seq} failed: {e}");
                Err(status_of(&e))
            }
        }
    }

    /// Converts `src` into `dst` (RGBA8 or BGRA8) on the GPU: the ISP's `gpu` backend.
    pub(crate) fn convert_frame(
        &self,
        src: FrameRef<'_>,
        dst: FrameMut<'_>,
    ) -> std::result::Result<GpuStats, Status> {
        self.run("convert", |b| b.convert(src, dst))
    }

    fn composite(&self, cx: &DeviceCtx<'_>, layers: u64, count: u64, dst: u64) -> DeviceResult {
        let specs = read_layers(cx, layers, count, MAX_LAYERS)?;
        let dst_layout = rgb_layout(cx, dst)?;
        // Copy each distinct source out of its replica, one region lock at a time.
        let mut sources: BTreeMap<u64, (FrameLayout, Vec<u8>)> = BTreeMap::new();
        for s in &specs {
            if sources.contains_key(&s.src) {
                continue;
            }
            let layout = layout_of(cx, s.src)?;
            let bytes = copy_out(cx, s.src, &layout)?;
            sources.insert(s.src, (layout, bytes));
        }
        let mut layers = Vec::with_capacity(specs.len());
        for s in &specs {
            let (layout, bytes) = &sources[&s.src];
            if !crop_inside(s.crop, layout) {
                return Err(Status::BadArgument);
            }
            layers.push(Layer {
                src: FrameRef::new(*layout, bytes),
                crop: s.crop,
                dst_rect: s.dst,
                rotation: s.rotation,
                alpha: s.alpha,
                blend: s.blend,
            });
        }
        let stats = with_dst(cx, dst, &dst_layout, |d| {
            self.run("composite", |b| b.composite(&layers, d))
        })?;
        Ok(CompositeReply {
            gpu_us: micros(&stats),
        }
        .to_values())
    }

    fn project(&self, cx: &DeviceCtx<'_>, src: u64, dst: u64, angles: [u64; 3]) -> DeviceResult {
        let view = view_of(angles);
        let dst_layout = rgb_layout(cx, dst)?;
        let src_layout = layout_of(cx, src)?;
        let bytes = copy_out(cx, src, &src_layout)?;
        let stats = with_dst(cx, dst, &dst_layout, |d| {
            self.run("project", |b| {
                b.project_equirect(FrameRef::new(src_layout, &bytes), view, d)
            })
        })?;
        Ok(ProjectReply {
            gpu_us: micros(&stats),
        }
        .to_values())
    }

    fn markers(&self, cx: &DeviceCtx<'_>, markers: u64, count: u64, dst: u64) -> DeviceResult {
        let records = read_records(cx, markers, count, MARKER_RECORD)?;
        if count as usize > MAX_MARKERS {
            return Err(Status::BadArgument);
        }
        let list = records
            .chunks_exact(MARKER_RECORD)
            .map(|b| MarkerRecord::from_bytes(b).ok_or(Status::BadArgument))
            .map(|r| r.and_then(|r| marker_of(&r)))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let dst_layout = rgb_layout(cx, dst)?;
        let stats = with_dst(cx, dst, &dst_layout, |d| {
            self.run("markers", |b| b.draw_markers(&list, d))
        })?;
        Ok(MarkersReply {
            gpu_us: micros(&stats),
        }
        .to_values())
    }

    fn convert(&self, cx: &DeviceCtx<'_>, src: u64, dst: u64) -> DeviceResult {
        let dst_layout = rgb_layout(cx, dst)?;
        let src_layout = layout_of(cx, src)?;
        let bytes = copy_out(cx, src, &src_layout)?;
        let stats = with_dst(cx, dst, &dst_layout, |d| {
            self.convert_frame(FrameRef::new(src_layout, &bytes), d)
        })?;
        Ok(ConvertReply {
            gpu_us: micros(&stats),
        }
        .to_values())
    }
}

impl Device for Gpu {
    fn name(&self) -> &str {
        "gpu"
    }

    fn backend(&self) -> String {
        let (issued, completed) = self.timeline_counts();
        format!(
            "{}; timeline: {issued} submitted, {completed} completed",
            self.desc
        )
    }

    fn execute(&self, cx: &DeviceCtx<'_>, args: &[u64; 6]) -> DeviceResult {
        match Command::decode(args)? {
            Command::Composite(c) => self.composite(cx, c.layers, c.count, c.dst),
            Command::Project(c) => self.project(cx, c.src, c.dst, [c.yaw, c.pitch, c.fov]),
            Command::Markers(c) => self.markers(cx, c.markers, c.count, c.dst),
            Command::Convert(c) => self.convert(cx, c.src, c.dst),
        }
    }
}

/// A marker record as a filled square centred at (`x`, `y`).
fn marker_of(r: &MarkerRecord) -> std::result::Result<Marker, Status> {
    let m = MAX_COORD as i64;
    if r.size == 0 || r.size as i64 > m || (r.x as i64).abs() > m || (r.y as i64).abs() > m {
        return Err(Status::BadArgument);
    }
    Ok(Marker::square(
        r.x as f32,
        r.y as f32,
        r.size as f32,
        r.rgba,
    ))
}

/// The view of `project`: yaw, pitch and vertical field of view in microradians (two's
/// complement). The backend rejects a field of view outside (0, 179 degrees].
fn view_of([yaw, pitch, fov]: [u64; 3]) -> View {
    let rad = |v: u64| (v as i64 as f64 * 1e-6) as f32;
    View {
        yaw: rad(yaw),
        pitch: rad(pitch),
        fov_y: rad(fov),
    }
}

/// The layout of a destination region, which must be RGBA8 or BGRA8.
fn rgb_layout(cx: &DeviceCtx<'_>, id: u64) -> std::result::Result<FrameLayout, Status> {
    let l = layout_of(cx, id)?;
    if l.format.is_yuv() {
        return Err(Status::NotSupported);
    }
    Ok(l)
}

/// Copies the frame bytes of region `id` out of this device's replica.
pub(crate) fn copy_out(
    cx: &DeviceCtx<'_>,
    id: u64,
    layout: &FrameLayout,
) -> std::result::Result<Vec<u8>, Status> {
    let n = layout.size_bytes().map_err(|e| status_of(&e))?;
    cx.with_region(id, |b| b.get(..n).map(<[u8]>::to_vec))?
        .ok_or(Status::OutOfRange)
}

/// Runs `f` on destination region `id` (locked alone) as a frame of `layout`.
fn with_dst(
    cx: &DeviceCtx<'_>,
    id: u64,
    layout: &FrameLayout,
    f: impl FnOnce(FrameMut<'_>) -> std::result::Result<GpuStats, Status>,
) -> std::result::Result<GpuStats, Status> {
    let n = layout.size_bytes().map_err(|e| status_of(&e))?;
    cx.with_region(id, |b| match b.get_mut(..n) {
        Some(d) => f(FrameMut::new(*layout, d)),
        None => Err(Status::OutOfRange),
    })?
}

fn micros(stats: &GpuStats) -> u64 {
    u64::try_from(stats.total().as_micros()).unwrap_or(u64::MAX)
}

/// The status a guest sees for a backend error.
pub(crate) fn status_of(e: &GpuError) -> Status {
    match e {
        GpuError::ZeroSize { .. }
        | GpuError::TooLarge { .. }
        | GpuError::InvalidLayout(_)
        | GpuError::InvalidRect { .. }
        | GpuError::RectOutOfBounds { .. }
        | GpuError::InvalidParameter(_)
        | GpuError::TooMany { .. } => Status::BadArgument,
        GpuError::BufferTooSmall { .. } => Status::OutOfRange,
        GpuError::UnsupportedFormat { .. } => Status::NotSupported,
        GpuError::UnknownSubmission(_) => Status::Internal,
        GpuError::NoAdapter(_)
        | GpuError::DeviceRequest(_)
        | GpuError::Backend(_)
        | GpuError::DeviceLost(_) => Status::DeviceError,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use virtsoc_gpu::PixelFormat;

    #[test]
    fn views_map() {
        let v = view_of([(-1_570_796i64) as u64, 250_000, 1_570_796]);
        assert!((v.yaw + std::f32::consts::FRAC_PI_2).abs() < 1e-5);
        assert!((v.pitch - 0.25).abs() < 1e-6);
        assert!((v.fov_y - std::f32::consts::FRAC_PI_2).abs() < 1e-5);
    }

    #[test]
    fn markers_are_validated() {
        let m = MarkerRecord {
            x: 10,
            y: -3,
            size: 6,
            rgba: [1, 2, 3, 4],
        };
        assert_eq!(
            marker_of(&m),
            Ok(Marker::square(10.0, -3.0, 6.0, [1, 2, 3, 4]))
        );
        assert_eq!(
            marker_of(&MarkerRecord { size: 0, ..m }),
            Err(Status::BadArgument)
        );
        assert_eq!(
            marker_of(&MarkerRecord { x: i32::MAX, ..m }),
            Err(Status::BadArgument)
        );
    }

    #[test]
    fn backend_errors_map_to_statuses() {
        assert_eq!(
            status_of(&GpuError::InvalidParameter("x".into())),
            Status::BadArgument
        );
        assert_eq!(
            status_of(&GpuError::BufferTooSmall { needed: 2, got: 1 }),
            Status::OutOfRange
        );
        assert_eq!(
            status_of(&GpuError::UnsupportedFormat {
                op: "convert",
                role: "destination",
                format: PixelFormat::Nv12
            }),
            Status::NotSupported
        );
        assert_eq!(
            status_of(&GpuError::DeviceLost("gone".into())),
            Status::DeviceError
        );
    }

    #[test]
    fn backends_are_chosen_by_name_and_the_timeline_advances() {
        let cfg = |gpu: &str| DeviceConfig {
            gpu: gpu.into(),
            ..DeviceConfig::default()
        };
        assert!(matches!(
            Gpu::new(&cfg("vulkan9")),
            Err(HostError::Config(_))
        ));
        let g = Gpu::new(&cfg("cpu")).unwrap();
        assert_eq!(g.backend_name(), "cpu");
        let n = Gpu::new(&cfg("null")).unwrap();
        assert_eq!(n.backend_name(), "null");
        assert!(n.backend().starts_with("null"));
        // One good and one failing call: both retire their sequence numbers.
        let src = virtsoc_gpu::OwnedFrame::new(FrameLayout::new(PixelFormat::Nv12, 8, 4)).unwrap();
        let mut dst =
            virtsoc_gpu::OwnedFrame::new(FrameLayout::new(PixelFormat::Rgba8, 8, 4)).unwrap();
        g.convert_frame(src.as_ref(), dst.as_mut()).unwrap();
        let mut yuv =
            virtsoc_gpu::OwnedFrame::new(FrameLayout::new(PixelFormat::Nv12, 8, 4)).unwrap();
        assert_eq!(
            g.convert_frame(src.as_ref(), yuv.as_mut()),
            Err(Status::NotSupported)
        );
        assert_eq!(g.timeline_counts(), (2, 2));
        assert!(
            g.backend().contains("2 submitted, 2 completed"),
            "{}",
            g.backend()
        );
    }
}
