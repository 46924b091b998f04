//! The wgpu backend: any adapter (lavapipe on a
//! CPU-only host, a real GPU elsewhere). This module owns device setup, the
//! backend struct, submission numbering and the small public accessors; the
//! rest lives in submodules:
//!
//! * [`image`]: resident images ([`GpuImage`]) and their uploads/readbacks;
//! * [`ops`]: the four drawing operations on resident images;
//! * [`bytes`]: the byte API ([`GpuBackend`], `submit_*`/`finish`) on top of
//!   the image path (temporary pooled images, upload, operation, readback);
//! * [`completion`]: completion tracking, the poller thread and callbacks;
//! * [`pipelines`]: shader modules, layouts, samplers and cached pipelines;
//! * [`pool`]: pooled textures and buffers;
//! * [`floor`]: floor and resident-composition measurements;
//! * [`present`]: presenting composed images in a window's surface.
//!
//! # Resident images
//!
//! A [`GpuImage`] is a long-lived set of textures holding one frame (one
//! texture per plane). The daemon keeps GPU replicas of SVM regions in them:
//! its copy engine calls [`WgpuBackend::write_image`] /
//! [`WgpuBackend::read_image`] with byte ranges of the frame's linear layout,
//! and GPU commands run asynchronously from resident images into a resident
//! image (`submit_*_images`), with no upload or readback.
//!
//! # Submissions and completion
//!
//! The backend numbers its queue submissions 1, 2, 3, ... in queue order
//! ([`SubmissionId`]). The daemon can put that number into its physical fence
//! table and signal the fence when [`WgpuBackend::completed_submission`]
//! (non-blocking) reaches it, block with [`WgpuBackend::wait_submission`], or
//! register a callback with [`WgpuBackend::on_submission_done`] (called on the
//! backend's poller thread, which polls the device only while submissions are
//! outstanding). Submissions complete in order, so "completed >= id" means
//! every earlier submission is done too. The poller is the only thread that
//! waits on the device: [`WgpuBackend::wait_submission`] and readbacks wait for
//! it to see their submission done (see `completion`).
//!
//! The byte API splits every operation into `submit_*` (validate, upload into
//! pooled images, encode, submit) and [`WgpuBackend::finish`] (wait, read back
//! into the caller's bytes). It makes two submissions per operation (the work,
//! then the copy into the readback buffer, so their costs can be told apart);
//! a [`PendingFrame`] carries the number of the last one.
//!
//! # Shaders
//!
//! Source planes are textures (R8 Y, RG8 NV12 UV, R8 U/V, RGBA8 or BGRA8
//! packed) sampled directly in the fragment (or compute) shader: YUV -> RGB
//! happens while sampling, with no conversion pass. Filtering uses the
//! hardware sampler (linear; clamp-to-edge, or repeating horizontally for the
//! equirect projection): one `textureSampleLevel` per plane (NV12 chroma in
//! one sample of the RG8 plane), with coordinates clamped to the crop shrunk
//! by half a texel so nothing outside the crop bleeds in. Its precision is the
//! device's (8-bit on llvmpipe: within 4 codes of the CPU reference).
//! Pipelines are specialised per source format and for unscaled layers (one
//! exact luma `textureLoad`) through override constants, and plane sizes come from uniforms: CPU Vulkan drivers
//! execute every branch of a shader and make `textureDimensions` expensive.
//!
//! A composition whose first layer overwrites the whole destination (covers
//! it, and replaces or is opaque) neither loads nor uploads the destination:
//! the pass starts with a clear.
//!
//! Temporary textures and readback/storage buffers are pooled by (format,
//! size, usage) with a fixed cap. Pipelines are created on first use and cached.

mod bytes;
mod completion;
mod driver_threads;
mod floor;
mod image;
mod ops;
mod pipelines;
mod pool;
mod present;
mod sample;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::RecvTimeoutError;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use virtsoc_sync::LockExt;

use crate::{FrameError, FrameLayout, GpuError, Result};

pub use bytes::PendingFrame;
pub use driver_threads::CPU_DRIVER_THREADS;
pub use floor::{FloorTimings, FLOOR_RUNS};
pub use image::GpuImage;
pub use ops::ImageLayer;
pub use present::{SurfaceOutcome, SurfacePresenter};
pub use sample::SampleAxis;

use completion::{Completion, Waited};
use pipelines::{PipeKey, Pipelines};
use pool::Pool;

/// Number of a queue submission made by a [`WgpuBackend`] (1, 2, 3, ...; 0 = none).
pub type SubmissionId = u64;

/// What the adapter is, in plain strings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdapterSummary {
    /// Adapter name as the driver reports it (e.g. "llvmpipe (LLVM 15.0.7, 256 bits)").
    pub name: String,
    /// Graphics API in use (`Vulkan`, `Metal`, `Dx12`, `Gl`, ...; wgpu's `Backend` in Debug form).
    pub backend: String,
    /// Kind of device (`Cpu`, `IntegratedGpu`, `DiscreteGpu`, `VirtualGpu`, `Other`; wgpu's
    /// `DeviceType` in Debug form).
    pub device_type: String,
    /// Driver name (may be empty).
    pub driver: String,
    /// Driver version and details (may be empty).
    pub driver_info: String,
    /// PCI vendor id (0 when unknown).
    pub vendor: u32,
    /// PCI device id (0 when unknown).
    pub device: u32,
}

impl AdapterSummary {
    /// Whether the adapter is a CPU driver (lavapipe, SwiftShader, WARP).
    pub fn is_cpu(&self) -> bool {
        self.device_type == "Cpu"
    }

    fn from_info(info: &wgpu::AdapterInfo) -> Self {
        AdapterSummary {
            name: info.name.clone(),
            backend: format!("{:?}", info.backend),
            device_type: format!("{:?}", info.device_type),
            driver: info.driver.clone(),
            driver_info: info.driver_info.clone(),
            vendor: info.vendor,
            device: info.device,
        }
    }
}

impl std::fmt::Display for AdapterSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ({}, {}, {} {})",
            self.name, self.backend, self.device_type, self.driver, self.driver_info
        )
    }
}

/// Mutable backend state, behind one mutex; submissions are numbered while it
/// is held so numbers follow queue order.
#[derive(Default)]
struct State {
    render: HashMap<PipeKey, wgpu::RenderPipeline>,
    convert: HashMap<(u32, bool), wgpu::ComputePipeline>,
    /// Fused compositions as compute passes, by their [`PipeKey::Fused`] key.
    compute: HashMap<PipeKey, wgpu::ComputePipeline>,
    pool: Pool,
    last_submission: SubmissionId,
}

/// One numbered queue submission.
struct Submitted {
    id: SubmissionId,
    at: Instant,
    index: wgpu::SubmissionIndex,
    /// When the device finished it (set by the work-done callback).
    done: Arc<Mutex<Option<Instant>>>,
}

/// GPU device operations on wgpu. See the module docs.
pub struct WgpuBackend {
    /// The instance and adapter the device came from (windows' surfaces are made on them).
    wgpu_instance: wgpu::Instance,
    adapter: wgpu::Adapter,
    device: wgpu::Device,
    queue: wgpu::Queue,
    info: AdapterSummary,
    max_dim: u32,
    max_buffer: u64,
    /// Distinguishes backends, so images of another device are refused.
    instance: u64,
    pipes: Pipelines,
    state: Mutex<State>,
    completion: Arc<Completion>,
    poller: Option<JoinHandle<()>>,
    error: Arc<Mutex<Option<String>>>,
    lost: Arc<Mutex<Option<String>>>,
    /// Draw two full-screen bottom layers in one pass (on by default).
    fuse: bool,
    /// Run the fused bottom pair as a compute pass when the target is RGBA
    /// (on by default).
    fuse_compute: bool,
    /// Threads the driver made with the device (a CPU driver's workers).
    driver_threads: Vec<i32>,
    /// Nearest-neighbour plane sampling, made on first use.
    sample_pipe: sample::SamplePipeCell,
}

fn align_up(v: u64, a: u64) -> u64 {
    v.div_ceil(a) * a
}

/// Polls `device`. wgpu-core 30 asserts, inside a poll, that a queue it finds empty has
/// finished the submission waited for; with submissions and polls on several threads the
/// finished index it read can lag, and the assertion panics (seen under a guest flooding the
/// GPU with composites, in the poller thread). That panic leaves the device usable, so it
/// becomes a `Timeout` here: the caller polls again and sees the submission finished.
fn poll(
    device: &wgpu::Device,
    completion: &Completion,
    how: wgpu::PollType,
) -> std::result::Result<(), wgpu::PollError> {
    completion.note_poll();
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| device.poll(how))) {
        Ok(r) => r.map(|_| ()),
        Err(_) => {
            log::warn!("virtsoc-gpu: wgpu panicked in a device poll; polling again");
            Err(wgpu::PollError::Timeout)
        }
    }
}

/// How long a readback waits for its submission.
const MAP_LIMIT: Duration = Duration::from_secs(120);

fn backend_err(e: impl std::fmt::Display) -> GpuError {
    GpuError::Backend(e.to_string())
}

impl WgpuBackend {
    /// Creates a headless device on any adapter (honours `WGPU_BACKEND` and
    /// friends). Fails with [`GpuError::NoAdapter`] when none exists.
    pub fn new() -> Result<Self> {
        let before = driver_threads::thread_ids();
        let instance =
            wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
        let adapter = pollster::block_on(instance.request_adapter(&wgpu::RequestAdapterOptions {
            power_preference: wgpu::PowerPreference::HighPerformance,
            force_fallback_adapter: false,
            compatible_surface: None,
            apply_limit_buckets: false,
        }))
        .map_err(|e| GpuError::NoAdapter(e.to_string()))?;
        Self::from_adapter(instance, adapter, &before)
    }

    /// The backend on `adapter`; `threads_before`: this process's threads before the
    /// adapter was opened (the driver's are told apart by being new).
    fn from_adapter(
        wgpu_instance: wgpu::Instance,
        adapter: wgpu::Adapter,
        threads_before: &[i32],
    ) -> Result<Self> {
        static INSTANCES: AtomicU64 = AtomicU64::new(1);
        let info = AdapterSummary::from_info(&adapter.get_info());
        let limits = adapter.limits();
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("virtsoc-gpu"),
            required_features: wgpu::Features::empty(),
            required_limits: limits.clone(),
            ..Default::default()
        }))
        .map_err(|e| GpuError::DeviceRequest(e.to_string()))?;
        log::info!("virtsoc-gpu: wgpu adapter {info}");

        let completion = Completion::new();
        let error = Arc::new(Mutex::new(None::<String>));
        let e2 = error.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            log::error!("wgpu error: {e}");
            let mut g = e2.lock_or_recover();
            if g.is_none() {
                *g = Some(e.to_string());
            }
        }));
        let lost = Arc::new(Mutex::new(None::<String>));
        let (l2, c2) = (lost.clone(), completion.clone());
        device.set_device_lost_callback(move |reason, msg| {
            let m = format!("{reason:?}: {msg}");
            *l2.lock_or_recover() = Some(m.clone());
            c2.fail(GpuError::DeviceLost(m));
        });

        let max_dim = limits.max_texture_dimension_2d.min(crate::MAX_DIMENSION);
        let max_buffer = limits
            .max_buffer_size
            .min(limits.max_storage_buffer_binding_size);
        let pipes = Pipelines::new(&device, &limits);
        let poller = completion::spawn_poller(device.clone(), completion.clone())?;
        let driver_threads =
            driver_threads::made_by_driver(threads_before, &driver_threads::thread_ids());

        let backend = WgpuBackend {
            wgpu_instance,
            adapter,
            device,
            queue,
            info,
            max_dim,
            max_buffer,
            instance: INSTANCES.fetch_add(1, Ordering::Relaxed),
            pipes,
            state: Mutex::new(State::default()),
            completion,
            poller: Some(poller),
            error,
            lost,
            fuse: true,
            fuse_compute: true,
            driver_threads,
            sample_pipe: Default::default(),
        };
        backend.check_errors()?;
        Ok(backend)
    }

    /// Whether two full-screen bottom layers are drawn in one pass (the default); off, every
    /// layer is its own draw (for measuring the difference and testing both paths).
    pub fn set_fused_layers(&mut self, on: bool) {
        self.fuse = on;
    }

    /// Whether a fused bottom pair with an RGBA target runs as a compute pass (the default)
    /// or as a render pass (for measuring the difference and testing both paths).
    pub fn set_fused_compute(&mut self, on: bool) {
        self.fuse_compute = on;
    }

    /// The adapter in use (e.g. "llvmpipe (LLVM 15.0.6)" on lavapipe).
    pub fn adapter_info(&self) -> &AdapterSummary {
        &self.info
    }

    /// Largest frame width/height this device accepts.
    pub fn max_dimension(&self) -> u32 {
        self.max_dim
    }

    /// Number of the most recent submission (0 if none yet).
    pub fn last_submission(&self) -> SubmissionId {
        self.state.lock_or_recover().last_submission
    }

    /// Highest submission known to be complete (as the poller thread saw it: it waits on the
    /// device whenever submissions are outstanding). Does not block.
    pub fn completed_submission(&self) -> SubmissionId {
        self.completion.completed()
    }

    /// Blocks until submission `id` (and so every earlier one) has completed.
    pub fn wait_submission(&self, id: SubmissionId) -> Result<()> {
        if id > self.last_submission() {
            return Err(GpuError::UnknownSubmission(id));
        }
        self.wait_done(id, None, Duration::from_secs(120))
    }

    /// Calls `f` once submission `id` has completed (`Ok`) or the device was
    /// lost or the backend dropped first (`Err`). `f` runs on the backend's
    /// poller thread, never while a lock of the backend is held; for an
    /// already completed `id` it runs right away (on that thread too). An `id`
    /// never submitted gets [`GpuError::UnknownSubmission`].
    pub fn on_submission_done(&self, id: SubmissionId, f: Box<dyn FnOnce(Result<()>) + Send>) {
        let known = id <= self.last_submission();
        self.completion.add_callback(id, known, f);
    }

    /// Number of idle pooled textures and buffers (for tests of bounded reuse).
    pub fn pooled_resources(&self) -> (usize, usize) {
        self.state.lock_or_recover().pool.counts()
    }

    fn check_lost(&self) -> Result<()> {
        match self.lost.lock_or_recover().clone() {
            Some(m) => Err(GpuError::DeviceLost(m)),
            None => Ok(()),
        }
    }

    fn check_errors(&self) -> Result<()> {
        self.check_lost()?;
        match self.error.lock_or_recover().take() {
            Some(m) => Err(GpuError::Backend(m)),
            None => Ok(()),
        }
    }

    /// Checks a (validated) layout against the device limits.
    fn check_size(&self, layout: &FrameLayout) -> Result<()> {
        let too_large = GpuError::Frame(FrameError::TooLarge {
            width: layout.width,
            height: layout.height,
            max: self.max_dim,
        });
        if layout.width > self.max_dim || layout.height > self.max_dim {
            return Err(too_large);
        }
        // Readback (and convert's storage) buffers hold the frame as RGBA rows
        // padded to 256 bytes.
        let bytes = align_up(layout.width as u64 * 4, 256) * layout.height as u64;
        if bytes > self.max_buffer {
            return Err(too_large);
        }
        Ok(())
    }

    /// Submits one command buffer, numbers it and records its completion time.
    /// Called with the state lock held, so numbers follow queue order.
    fn submit(&self, st: &mut State, cmd: wgpu::CommandBuffer) -> Submitted {
        let at = Instant::now();
        let index = self.queue.submit([cmd]);
        st.last_submission += 1;
        let id = st.last_submission;
        let done = Arc::new(Mutex::new(None));
        let (d2, c2) = (done.clone(), self.completion.clone());
        self.queue.on_submitted_work_done(move || {
            *d2.lock_or_recover() = Some(Instant::now());
            c2.work_done(id);
        });
        self.completion.submitted(id, index.clone());
        Submitted {
            id,
            at,
            index,
            done,
        }
    }

    /// Waits until submission `id` (wgpu's `index`, when known) has completed, at most
    /// `limit`. Off the poller thread it waits for the poller to see it
    /// ([`completion::Completion::wait`]); on the poller (a callback) it polls the device
    /// from there.
    fn wait_done(
        &self,
        id: SubmissionId,
        index: Option<&wgpu::SubmissionIndex>,
        limit: Duration,
    ) -> Result<()> {
        let start = Instant::now();
        loop {
            self.check_lost()?;
            if self.completion.completed() >= id {
                return Ok(());
            }
            let left = limit.saturating_sub(start.elapsed());
            if left.is_zero() {
                return Err(GpuError::Backend(format!(
                    "submission {id} did not complete"
                )));
            }
            if !completion::on_poller() {
                match self.completion.wait(id, left) {
                    Waited::Done | Waited::TimedOut => continue,
                    Waited::Failed(e) => return Err(e),
                }
            }
            // On the poller thread, nothing else polls: do it here. A poll that panicked
            // (see [`poll`]) is tried again, until the limit.
            let how = wgpu::PollType::Wait {
                submission_index: index.cloned(),
                timeout: Some(left.min(Duration::from_millis(200))),
            };
            match poll(&self.device, &self.completion, how) {
                Ok(()) | Err(wgpu::PollError::Timeout) => {}
                Err(e) => return Err(backend_err(e)),
            }
        }
    }

    /// Maps `buffers` for reading after submission `sub` and waits.
    fn map_read(
        &self,
        buffers: &[&wgpu::Buffer],
        sub: (SubmissionId, &wgpu::SubmissionIndex),
    ) -> Result<()> {
        let (tx, rx) = std::sync::mpsc::channel();
        for b in buffers {
            let tx = tx.clone();
            b.slice(..).map_async(wgpu::MapMode::Read, move |r| {
                let _ = tx.send(r);
            });
        }
        self.wait_done(sub.0, Some(sub.1), MAP_LIMIT)?;
        let start = Instant::now();
        for _ in buffers {
            let r = loop {
                // The poll that saw the submission done delivered the maps asked for before
                // it ended; one asked for later is served by the next poll: the poller's,
                // asked for here, or on the poller (a callback) this thread's own.
                let waited = if completion::on_poller() {
                    let _ = poll(&self.device, &self.completion, wgpu::PollType::Poll);
                    rx.recv_timeout(Duration::from_millis(5))
                } else {
                    match rx.try_recv() {
                        Ok(r) => break r,
                        Err(_) => self.completion.want_poll(),
                    }
                    rx.recv_timeout(Duration::from_secs(1))
                };
                match waited {
                    Ok(r) => break r,
                    Err(RecvTimeoutError::Disconnected) => {
                        return Err(GpuError::Backend("a readback map was dropped".into()))
                    }
                    Err(RecvTimeoutError::Timeout) => {}
                }
                self.check_lost()?;
                if let Some(e) = self.completion.failure() {
                    return Err(e);
                }
                if start.elapsed() > MAP_LIMIT {
                    return Err(GpuError::Backend("readback map did not complete".into()));
                }
            };
            r.map_err(|e| GpuError::Backend(format!("readback map failed: {e}")))?;
        }
        Ok(())
    }

    /// Device polls made so far on threads other than the backend's poller: none, by design
    /// (see [`completion`]); a diagnostic for tests.
    #[doc(hidden)]
    pub fn polls_off_poller(&self) -> u64 {
        self.completion.polls_off_poller()
    }
}

impl Drop for WgpuBackend {
    fn drop(&mut self) {
        // Let outstanding work finish so pending callbacks get their result.
        let last = self.last_submission();
        let _ = self.wait_done(last, None, Duration::from_secs(10));
        self.completion.shutdown();
        if let Some(h) = self.poller.take() {
            let _ = h.join();
        }
    }
}
