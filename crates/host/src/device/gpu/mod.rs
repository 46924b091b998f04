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
//! # Memory
//!
//! With `wgpu`, the GPU's memory domain (shared with the display and a GPU-backed ISP) keeps
//! image regions in resident GPU images (`memory`): the SVM uploads into them and reads back
//! out of them, and commands draw from resident sources into a resident destination, so a
//! source not written since its last upload is never uploaded again and nothing is read back
//! unless another domain reads it. With `cpu` and `null` (or for regions outside GPU memory)
//! the device works on host-memory replicas (`bytes`): each source is copied out of its
//! replica (counted on the ledger), the destination replica is locked while the backend draws.
//!
//! # Asynchronous execution and the timeline (physical fences)
//!
//! A command on resident images is submitted and the worker goes on: its completion (the
//! guest's reply, and with it the release of any virtual fence signal queued after the command)
//! is given when the GPU finishes the submission. Each command takes the next sequence number
//! of the `gpu` [`PhysicalFenceTable`] timeline (shared with the ISP's `gpu` backend) and
//! completes it then: the guest's virtual fences are ordered by real GPU completion. Commands
//! on host memory run synchronously and complete their sequence number on return.
//!
//! # Limits
//!
//! One guest's command cannot hog the GPU ([`crate::Limits`]): a `composite` whose cost (the
//! sum over its layers of the destination pixels each layer covers, its destination rectangle
//! clipped to the target) is over [`Limits::gpu_cost`](crate::Limits::gpu_cost) answers
//! `Busy` without running; and a guest has at most
//! [`Limits::gpu_in_flight`](crate::Limits::gpu_in_flight) submissions on the GPU at once (its
//! gpu and GPU-backed ISP work together; `Busy` beyond). The device worker already serves
//! guests round robin and holds a guest's queue, not the worker, while its command runs, so
//! another guest's command is submitted after at most one command of each other guest.
//!
//! # Results and errors
//!
//! Every command returns `gpu_us`: from submission to completion on resident images, the
//! backend's time (upload, execution and readback) on host memory, in microseconds. Bad input answers a status and never panics: `OutOfRange` when
//! `count` records do not fit the record region, `BadArgument` for bad records (rotation
//! other than 0/90/180/270, alpha outside [0, 1], empty or oversized rectangles, crops
//! outside their source, bad view angles or marker sizes), `NotSupported` for formats,
//! `DeviceError` when the backend itself fails.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use virtsoc_svm::{GuestId, RegionId};

use virtsoc_devapi::gpu::{Command, CompositeReply};
use virtsoc_devapi::MarkerRecord;
use virtsoc_fence::{MemPage, PhysicalFenceTable, VirtualFenceTable};
use virtsoc_gpu::{
    CpuBackend, FrameLayout, FrameMut, FrameRef, GpuBackend, GpuImage, GpuStats, ImageLayer,
    Marker, NullBackend, SubmissionId, View, WgpuBackend, MAX_COORD, MAX_LAYERS, MAX_MARKERS,
};
use virtsoc_proto::Status;
use virtsoc_svm::Backing;
use virtsoc_sync::LockExt;

use super::layers::{crop_inside, layout_of, read_layers, read_records};
use super::registry::{DeviceConfig, GpuBackendKind};
use super::{Device, DeviceCtx, DeviceResult, Reply};
use crate::status::status_of;
use crate::Result;

mod bytes;
pub(crate) mod memory;

use memory::{GpuAllocator, GpuMemory};

/// The gpu device.
pub struct Gpu {
    backend: Arc<dyn GpuBackend>,
    /// The same backend when it is wgpu: resident images, asynchronous submissions.
    wgpu: Option<Arc<WgpuBackend>>,
    /// What serves the device, for listings (adapter, fallback reason).
    desc: String,
    timeline: Arc<PhysicalFenceTable>,
    /// Highest sequence number handed out on the timeline.
    issued: AtomicU64,
    /// Largest cost of one composite (layers x destination pixels).
    max_cost: u64,
    /// Each guest's submissions on the GPU.
    in_flight: Arc<InFlight>,
}

/// Submissions in flight per guest, each guest at most `max`.
#[derive(Debug)]
pub(crate) struct InFlight {
    max: usize,
    by_guest: Mutex<HashMap<GuestId, usize>>,
}

impl InFlight {
    pub(crate) fn new(max: usize) -> Self {
        InFlight {
            max,
            by_guest: Mutex::new(HashMap::new()),
        }
    }

    /// Counts one more submission of `guest`: `false` (nothing counted) at its maximum.
    pub(crate) fn take(&self, guest: GuestId) -> bool {
        let mut m = self.by_guest.lock_or_recover();
        let n = m.entry(guest).or_insert(0);
        if *n >= self.max {
            return false;
        }
        *n += 1;
        true
    }

    /// One submission of `guest` finished.
    pub(crate) fn release(&self, guest: GuestId) {
        let mut m = self.by_guest.lock_or_recover();
        if let Some(n) = m.get_mut(&guest) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                m.remove(&guest);
            }
        }
    }
}

/// Destination pixels `r` covers inside `clip`.
fn clipped_area(r: virtsoc_gpu::Rect, clip: virtsoc_gpu::Rect) -> u64 {
    let span = |start: i32, len: u32, cstart: i32, clen: u32| {
        let a = i64::from(start).max(i64::from(cstart));
        let b = (i64::from(start) + i64::from(len)).min(i64::from(cstart) + i64::from(clen));
        (b - a).max(0) as u64
    };
    span(r.x, r.width, clip.x, clip.width) * span(r.y, r.height, clip.y, clip.height)
}

/// The cost of composing `layers` within `clip` of the target (its damaged rectangle, or
/// all of it): the pixels of `clip` each layer covers, summed.
pub(crate) fn composite_cost_in(
    layers: &[crate::device::layers::LayerSpec],
    clip: virtsoc_gpu::Rect,
) -> u64 {
    layers.iter().map(|l| clipped_area(l.dst, clip)).sum()
}

/// The rectangle of a `width` x `height` target a composite's `damage` argument names:
/// `None` for the whole target (0, or a rectangle covering it), `BadArgument` for an empty
/// rectangle or one reaching outside.
pub(crate) fn damage_rect(
    damage: u64,
    width: u32,
    height: u32,
) -> std::result::Result<Option<virtsoc_gpu::Rect>, Status> {
    let Some([x, y, w, h]) = virtsoc_devapi::unpack_damage(damage) else {
        return Ok(None);
    };
    let r = virtsoc_gpu::Rect::new(x as i32, y as i32, w, h);
    virtsoc_gpu::check_damage(r, width, height).map_err(|_| Status::BadArgument)?;
    Ok((r != virtsoc_gpu::Rect::full(width, height)).then_some(r))
}

impl Gpu {
    /// The wgpu backend, when the GPU is one (its resident images are the GPU domain's
    /// memory; the display composes view frames there).
    pub fn wgpu(&self) -> Option<&Arc<WgpuBackend>> {
        self.wgpu.as_ref()
    }

    /// Builds the device from the daemon's configuration (`cfg.gpu`: wgpu, cpu or null).
    pub fn new(cfg: &DeviceConfig) -> Result<Self> {
        let cpu = || -> Arc<dyn GpuBackend> { Arc::new(CpuBackend::new()) };
        let (backend, wgpu, desc) = match cfg.gpu {
            GpuBackendKind::Auto | GpuBackendKind::Wgpu => match WgpuBackend::new() {
                Ok(b) => {
                    if cfg.gpu_driver_nice != 0 {
                        match b.renice_cpu_driver_threads(cfg.gpu_driver_nice) {
                            Ok(0) => {}
                            Ok(n) => log::info!(
                                "gpu: {n} CPU driver threads at nice {}",
                                cfg.gpu_driver_nice
                            ),
                            Err(e) => {
                                log::warn!("gpu: cannot renice the CPU driver's threads: {e}")
                            }
                        }
                    }
                    let desc = format!("wgpu on {} (resident images)", b.adapter_info());
                    let b = Arc::new(b);
                    (b.clone() as Arc<dyn GpuBackend>, Some(b), desc)
                }
                Err(e) if cfg.gpu == GpuBackendKind::Wgpu => {
                    return Err(crate::HostError::Config(format!(
                        "--gpu-backend wgpu: no usable wgpu adapter ({e}); install a Vulkan \
                         driver (mesa-vulkan-drivers) or choose auto or cpu"
                    )))
                }
                Err(e) => {
                    log::warn!("gpu: wgpu unavailable ({e}); falling back to the CPU backend");
                    let desc = "cpu (fallback: no usable wgpu adapter, see the log)".to_string();
                    (cpu(), None, desc)
                }
            },
            GpuBackendKind::Cpu => (cpu(), None, "cpu reference".into()),
            GpuBackendKind::Null => (
                Arc::new(NullBackend::new()) as Arc<dyn GpuBackend>,
                None,
                "null (fills grey)".into(),
            ),
        };
        log::info!("gpu: {desc}");
        let mut gpu = Self::with_backend(backend, desc);
        gpu.wgpu = wgpu;
        Ok(gpu)
    }

    /// A device on an explicit backend (host-memory replicas).
    pub fn with_backend(backend: Arc<dyn GpuBackend>, desc: String) -> Self {
        let fences = Arc::new(VirtualFenceTable::new(Arc::new(MemPage::new())));
        Gpu {
            backend,
            wgpu: None,
            desc,
            timeline: Arc::new(PhysicalFenceTable::new("gpu", fences)),
            issued: AtomicU64::new(0),
            max_cost: crate::Limits::default().gpu_cost,
            in_flight: Arc::new(InFlight::new(crate::Limits::default().gpu_in_flight)),
        }
    }

    /// The same device within `limits` (cost of one command, submissions in flight).
    pub fn with_limits(mut self, limits: &crate::Limits) -> Self {
        self.max_cost = limits.gpu_cost;
        self.in_flight = Arc::new(InFlight::new(limits.gpu_in_flight));
        self
    }

    /// `Busy` for a composite of `layers` within `clip` of its target over the budget.
    pub(crate) fn check_cost_in(
        &self,
        layers: &[crate::device::layers::LayerSpec],
        clip: virtsoc_gpu::Rect,
    ) -> std::result::Result<(), Status> {
        let cost = composite_cost_in(layers, clip);
        if cost > self.max_cost {
            log::debug!(
                "gpu: composite of cost {cost} over the budget {}",
                self.max_cost
            );
            return Err(Status::Busy);
        }
        Ok(())
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

    fn next_seqno(&self) -> u64 {
        let seq = self.timeline.next_seqno();
        self.issued.fetch_max(seq, Ordering::Relaxed);
        seq
    }

    /// Runs one backend call as one submission of the GPU timeline.
    pub(crate) fn run(
        &self,
        op: &str,
        f: impl FnOnce(&dyn GpuBackend) -> virtsoc_gpu::Result<GpuStats>,
    ) -> std::result::Result<GpuStats, Status> {
        let seq = self.next_seqno();
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

    /// Converts `src` into `dst` (RGBA8 or BGRA8) on the GPU: the ISP's `gpu` backend on
    /// host-memory frames.
    pub(crate) fn convert_frame(
        &self,
        src: FrameRef<'_>,
        dst: FrameMut<'_>,
    ) -> std::result::Result<GpuStats, Status> {
        self.run("convert", |b| b.convert(src, dst))
    }

    /// The resident image of region `id`'s replica in this device's memory, if it has one
    /// (`None`: the replica is in host memory).
    fn image(
        &self,
        cx: &DeviceCtx<'_>,
        id: RegionId,
    ) -> std::result::Result<Option<GpuImage>, Status> {
        if self.wgpu.is_none() {
            return Ok(None);
        }
        match cx.svm.replica(cx.guest, id, cx.domain) {
            Ok(Backing::Device(m)) => Ok(m
                .as_any()
                .downcast_ref::<GpuMemory>()
                .map(|g| g.image.clone())),
            Ok(_) => Ok(None),
            Err(e) => Err(status_of(&e)),
        }
    }

    /// Submits `op` on resident images and answers `reply` when the GPU has finished it:
    /// `Ok(None)` when a region is not resident (the caller runs the host-memory path).
    fn submit(
        &self,
        op: &'static str,
        guest: GuestId,
        reply: Reply,
        f: impl FnOnce(&WgpuBackend) -> virtsoc_gpu::Result<SubmissionId>,
    ) {
        let Some(w) = &self.wgpu else {
            reply.send(Err(Status::Internal));
            return;
        };
        if !self.in_flight.take(guest) {
            log::debug!("gpu: guest {guest}: {op} refused, submissions in flight at the limit");
            reply.send(Err(Status::Busy));
            return;
        }
        let seq = self.next_seqno();
        let t0 = Instant::now();
        let id = match f(w) {
            Ok(id) => id,
            Err(e) => {
                log::debug!("gpu: {op} #{seq} refused: {e}");
                let _ = self.timeline.complete(seq);
                self.in_flight.release(guest);
                reply.send(Err(status_of(&e)));
                return;
            }
        };
        let timeline = self.timeline.clone();
        let in_flight = self.in_flight.clone();
        w.on_submission_done(
            id,
            Box::new(move |r| {
                in_flight.release(guest);
                if let Err(e) = timeline.complete(seq) {
                    log::warn!("gpu: timeline: {e}");
                }
                let us = u64::try_from(t0.elapsed().as_micros()).unwrap_or(u64::MAX);
                log::debug!("gpu: {op} #{seq} (submission {id}) done in {us} us");
                reply.send(
                    r.map(|()| CompositeReply { gpu_us: us }.to_values())
                        .map_err(|e| status_of(&e)),
                );
            }),
        );
    }

    /// Checks `cmd` and gathers its resident images: `Ok(None)` when an image it names is not
    /// resident (the host-memory path runs it instead).
    fn prepare(
        &self,
        cx: &DeviceCtx<'_>,
        cmd: &Command,
    ) -> std::result::Result<Option<Prepared>, Status> {
        macro_rules! resident {
            ($id:expr) => {
                match self.image(cx, $id)? {
                    Some(i) => i,
                    None => return Ok(None),
                }
            };
        }
        Ok(Some(match *cmd {
            Command::Composite(_) | Command::CompositeDamage(_) => {
                let (layers, count, dst, damage) = match *cmd {
                    Command::CompositeDamage(c) => (c.layers, c.count, c.dst, c.damage),
                    Command::Composite(c) => (c.layers, c.count, c.dst, 0),
                    _ => unreachable!("matched above"),
                };
                let specs = read_layers(cx, layers, count, MAX_LAYERS)?;
                let target = rgb_layout(cx, dst)?;
                let damage = damage_rect(damage, target.width, target.height)?;
                let full = virtsoc_gpu::Rect::full(target.width, target.height);
                self.check_cost_in(&specs, damage.unwrap_or(full))?;
                let dst = resident!(dst);
                let mut layers = Vec::with_capacity(specs.len());
                for s in specs {
                    let img = resident!(s.src);
                    if !crop_inside(s.crop, &img.layout()) {
                        return Err(Status::BadArgument);
                    }
                    layers.push((img, s));
                }
                Prepared::Composite {
                    layers,
                    dst,
                    damage,
                }
            }
            Command::Project(c) => {
                rgb_dst(cx, c.dst)?;
                Prepared::Project {
                    src: resident!(c.src),
                    dst: resident!(c.dst),
                    view: view_of([c.yaw, c.pitch, c.fov]),
                }
            }
            Command::Markers(c) => {
                let list = markers_of(cx, c.markers, c.count)?;
                rgb_dst(cx, c.dst)?;
                Prepared::Markers {
                    list,
                    dst: resident!(c.dst),
                }
            }
            Command::Convert(c) => {
                rgb_dst(cx, c.dst)?;
                Prepared::Convert {
                    src: resident!(c.src),
                    dst: resident!(c.dst),
                }
            }
        }))
    }

    /// Submits prepared work; `reply` is answered when the GPU has finished it.
    fn launch(&self, p: Prepared, guest: GuestId, reply: Reply) {
        match p {
            Prepared::Composite {
                layers,
                dst,
                damage,
            } => {
                let layers: Vec<ImageLayer<'_>> = layers
                    .iter()
                    .map(|(image, s)| ImageLayer {
                        src: image,
                        crop: s.crop,
                        dst_rect: s.dst,
                        rotation: s.rotation,
                        alpha: s.alpha,
                        blend: s.blend,
                    })
                    .collect();
                self.submit("composite", guest, reply, |w| match damage {
                    Some(d) => w.submit_composite_images_damage(&layers, &dst, d),
                    None => w.submit_composite_images(&layers, &dst),
                });
            }
            Prepared::Project { src, dst, view } => {
                self.submit("project", guest, reply, |w| {
                    w.submit_project_images(&src, &view, &dst)
                });
            }
            Prepared::Markers { list, dst } => {
                self.submit("markers", guest, reply, |w| {
                    w.submit_markers_image(&list, &dst)
                });
            }
            Prepared::Convert { src, dst } => self.convert_images(guest, &src, &dst, reply),
        }
    }

    /// Converts resident `src` into resident `dst` (RGBA8 or BGRA8), answering `reply` when
    /// done: the gpu device's `convert` and the ISP's `gpu` backend.
    pub(crate) fn convert_images(
        &self,
        guest: GuestId,
        src: &GpuImage,
        dst: &GpuImage,
        reply: Reply,
    ) {
        self.submit("convert", guest, reply, |w| {
            w.submit_convert_images(src, dst)
        });
    }

    /// The resident images of `src` and `dst`, if both are (for the ISP's `gpu` backend).
    pub(crate) fn images(
        &self,
        cx: &DeviceCtx<'_>,
        src: RegionId,
        dst: RegionId,
    ) -> std::result::Result<Option<(GpuImage, GpuImage)>, Status> {
        Ok(match (self.image(cx, src)?, self.image(cx, dst)?) {
            (Some(s), Some(d)) => Some((s, d)),
            _ => None,
        })
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

    /// Two: with the next command queued behind the running one the GPU's queue goes
    /// straight on to it. On lavapipe (stop 54, `bench sharing`, WFQ) one at a time left
    /// the host's cores 32-42% idle with the guests together against 15-23% under round
    /// robin, which queues everything, and WFQ did 2-11% less work than round robin at 8
    /// guests, 10-16% at 2; with two, 22-37% idle, 8 guests as much as round robin or more,
    /// 2 guests 3-7% less. Guests of one size were less even: 3.6-4.2% against 1.6-3.3%.
    fn commands_at_once(&self) -> usize {
        2
    }

    fn cpu_threads(&self) -> Vec<u32> {
        self.wgpu
            .as_ref()
            .map(|w| w.cpu_driver_threads())
            .unwrap_or_default()
    }

    fn allocator(&self) -> Option<Arc<dyn virtsoc_svm::DeviceAllocator>> {
        self.wgpu.as_ref().map(|b| {
            Arc::new(GpuAllocator { backend: b.clone() }) as Arc<dyn virtsoc_svm::DeviceAllocator>
        })
    }

    fn execute(&self, cx: &DeviceCtx<'_>, args: &[u64; 6]) -> DeviceResult {
        match Command::decode(args)? {
            Command::Composite(c) => self.composite(cx, c.layers, c.count, c.dst, 0),
            Command::CompositeDamage(c) => self.composite(cx, c.layers, c.count, c.dst, c.damage),
            Command::Project(c) => self.project(cx, c.src, c.dst, [c.yaw, c.pitch, c.fov]),
            Command::Markers(c) => self.markers(cx, c.markers, c.count, c.dst),
            Command::Convert(c) => self.convert(cx, c.src, c.dst),
        }
    }

    fn execute_async(&self, cx: &DeviceCtx<'_>, args: &[u64; 6], reply: Reply) {
        let prepared = Command::decode(args).and_then(|cmd| self.prepare(cx, &cmd));
        match prepared {
            Ok(Some(p)) => self.launch(p, cx.guest, reply),
            Ok(None) => reply.send(self.execute(cx, args)),
            Err(st) => reply.send(Err(st)),
        }
    }
}

/// A command checked and ready to submit on resident images.
enum Prepared {
    Composite {
        layers: Vec<(GpuImage, crate::device::layers::LayerSpec)>,
        dst: GpuImage,
        /// Only this rectangle of `dst` (`None`: all of it).
        damage: Option<virtsoc_gpu::Rect>,
    },
    Project {
        src: GpuImage,
        dst: GpuImage,
        view: View,
    },
    Markers {
        list: Vec<Marker>,
        dst: GpuImage,
    },
    Convert {
        src: GpuImage,
        dst: GpuImage,
    },
}

/// Checks that `id` is an RGBA8 or BGRA8 frame.
fn rgb_dst(cx: &DeviceCtx<'_>, id: RegionId) -> std::result::Result<(), Status> {
    rgb_layout(cx, id).map(|_| ())
}

/// The markers of `count` records in region `markers`.
fn markers_of(
    cx: &DeviceCtx<'_>,
    markers: RegionId,
    count: u64,
) -> std::result::Result<Vec<Marker>, Status> {
    let records = read_records(cx, markers, count, virtsoc_devapi::MARKER_RECORD)?;
    if count as usize > MAX_MARKERS {
        return Err(Status::BadArgument);
    }
    records
        .chunks_exact(virtsoc_devapi::MARKER_RECORD)
        .map(|b| MarkerRecord::from_bytes(b).ok_or(Status::BadArgument))
        .map(|r| r.and_then(|r| marker_of(&r)))
        .collect()
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
fn rgb_layout(cx: &DeviceCtx<'_>, id: RegionId) -> std::result::Result<FrameLayout, Status> {
    let l = layout_of(cx, id)?;
    if l.format.is_yuv() {
        return Err(Status::NotSupported);
    }
    Ok(l)
}

#[cfg(test)]
mod tests;
