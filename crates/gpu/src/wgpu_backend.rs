//! The wgpu backend: headless (no surface), any adapter (lavapipe on a
//! CPU-only host, a real GPU elsewhere).
//!
//! # Submissions and completion
//!
//! Every operation is split into `submit_*` (validate, upload the source planes
//! as textures, encode, submit) and [`WgpuBackend::finish`] (wait, read back into
//! the caller's bytes). The synchronous [`GpuBackend`] methods are
//! `submit_*` followed by `finish`.
//!
//! Each operation makes two queue submissions (the work, then the copy into the
//! readback buffer, so their costs can be told apart). The backend numbers its
//! submissions 1, 2, 3, ... in queue order; a [`PendingFrame`] carries the
//! number of its last submission ([`PendingFrame::submission`]). The daemon can
//! put that number into its physical fence table and signal the fence when
//! [`WgpuBackend::completed_submission`] (non-blocking) reaches it, or block
//! with [`WgpuBackend::wait_submission`]. Submissions complete in order, so
//! "completed >= id" means every earlier submission is done too.
//!
//! # Shaders
//!
//! Source planes are uploaded as textures (R8 Y, RG8 NV12 UV, R8 U/V, RGBA8
//! or BGRA8 packed) and sampled directly in the fragment (or compute) shader:
//! YUV -> RGB happens while sampling, with no conversion pass. Filtering is
//! done in the shader with `textureLoad` and f32 weights instead of a
//! hardware sampler, so results match the CPU reference within a code value or
//! two on any adapter (sampler precision is vendor-specific, 8-bit on
//! llvmpipe). Pipelines are specialised per source format and for unscaled
//! layers (one luma fetch instead of four) through override constants, and
//! plane sizes come from uniforms: CPU Vulkan drivers execute every branch of
//! a shader and make `textureDimensions` expensive.
//!
//! Textures, readback and storage buffers are pooled by (format, size, usage)
//! with a fixed cap, so repeated frames of equal sizes reuse them and the pool
//! never grows without bound. Pipelines are created on first use and cached.

use std::collections::HashMap;
use std::num::NonZeroU64;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytemuck::{Pod, Zeroable};
use wgpu::util::DeviceExt;

use crate::cpu::{LayerMap, ViewParams};
use crate::frame::Planes;
use crate::{
    check_layers, check_markers, check_rgb_dst, check_view, Clear, FrameLayout, FrameMut, FrameRef,
    GpuBackend, GpuError, GpuStats, Layer, Marker, MarkerShape, PixelFormat, Rect, Result, View,
};

/// Number of a queue submission made by a [`WgpuBackend`] (1, 2, 3, ...; 0 = none).
pub type SubmissionId = u64;

/// Idle textures kept for reuse.
const MAX_POOLED_TEXTURES: usize = 24;
/// Idle buffers (readback, storage) kept for reuse.
const MAX_POOLED_BUFFERS: usize = 6;

/// What the adapter is, in plain strings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdapterSummary {
    pub name: String,
    pub backend: String,
    pub device_type: String,
    pub driver: String,
    pub driver_info: String,
    pub vendor: u32,
    pub device: u32,
}

impl AdapterSummary {
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

/// Uniforms of the source-sampling shaders; mirrors `Params` in common.wgsl.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
struct Params {
    dst_rect: [f32; 4],
    map_m: [f32; 4],
    map_b: [f32; 4],
    crop: [f32; 4],
    misc: [f32; 4],
    rot: [f32; 4],
    target_size: [f32; 4],
    modes: [u32; 4],
}

/// One instance of the marker pipeline.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
struct MarkerInstance {
    centre_size: [f32; 3],
    shape: u32,
    rgba: [u8; 4],
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Target {
    Rgba,
    Bgra,
}

impl Target {
    fn of(format: PixelFormat) -> Self {
        if format == PixelFormat::Bgra8 {
            Target::Bgra
        } else {
            Target::Rgba
        }
    }

    fn texture_format(self) -> wgpu::TextureFormat {
        match self {
            Target::Rgba => wgpu::TextureFormat::Rgba8Unorm,
            Target::Bgra => wgpu::TextureFormat::Bgra8Unorm,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum PipeKey {
    Layer {
        target: Target,
        blend: bool,
        mode: u32,
        exact: bool,
    },
    Equirect {
        target: Target,
        mode: u32,
    },
    Markers(Target),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct TexKey {
    format: wgpu::TextureFormat,
    width: u32,
    height: u32,
    usage: wgpu::TextureUsages,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct BufKey {
    size: u64,
    usage: wgpu::BufferUsages,
}

#[derive(Default)]
struct State {
    render: HashMap<PipeKey, wgpu::RenderPipeline>,
    convert: HashMap<(u32, bool), wgpu::ComputePipeline>,
    textures: Vec<(TexKey, wgpu::Texture)>,
    buffers: Vec<(BufKey, wgpu::Buffer)>,
    last_submission: SubmissionId,
}

/// Source planes uploaded for one layer.
struct Uploaded {
    textures: Vec<(TexKey, wgpu::Texture)>,
    views: [wgpu::TextureView; 3],
    mode: u32,
}

/// Work submitted by a `submit_*` call, not yet read back. Pass it to
/// [`WgpuBackend::finish`]; dropping it just discards the result.
pub struct PendingFrame {
    id: SubmissionId,
    layout: FrameLayout,
    buffer: wgpu::Buffer,
    buf_key: BufKey,
    bytes_per_row: u32,
    upload: Duration,
    submitted: Instant,
    work: wgpu::SubmissionIndex,
    copy: wgpu::SubmissionIndex,
    work_done: Arc<Mutex<Option<Instant>>>,
    copy_done: Arc<Mutex<Option<Instant>>>,
}

impl PendingFrame {
    /// The submission whose completion means the result is ready to read back.
    pub fn submission(&self) -> SubmissionId {
        self.id
    }

    /// Format and size of the result (any stride is accepted by `finish`).
    pub fn layout(&self) -> FrameLayout {
        self.layout
    }
}

impl std::fmt::Debug for PendingFrame {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingFrame")
            .field("id", &self.id)
            .field("layout", &self.layout)
            .finish()
    }
}

/// GPU device operations on wgpu. See the module docs for submissions.
pub struct WgpuBackend {
    device: wgpu::Device,
    queue: wgpu::Queue,
    info: AdapterSummary,
    max_dim: u32,
    max_buffer: u64,
    uniform_stride: u64,
    render_module: wgpu::ShaderModule,
    convert_module: wgpu::ShaderModule,
    marker_module: wgpu::ShaderModule,
    src_layout: wgpu::PipelineLayout,
    convert_bgl: wgpu::BindGroupLayout,
    convert_layout: wgpu::PipelineLayout,
    src_bgl: wgpu::BindGroupLayout,
    marker_bgl: wgpu::BindGroupLayout,
    marker_layout: wgpu::PipelineLayout,
    dummy_view: wgpu::TextureView,
    state: Mutex<State>,
    completed: Arc<AtomicU64>,
    error: Arc<Mutex<Option<String>>>,
    lost: Arc<Mutex<Option<String>>>,
}

struct Submitted {
    id: SubmissionId,
    at: Instant,
    index: wgpu::SubmissionIndex,
    done: Arc<Mutex<Option<Instant>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn align_up(v: u64, a: u64) -> u64 {
    v.div_ceil(a) * a
}

/// Values of the shader's pipeline-overridable constants.
fn src_constants(mode: u32, exact: bool) -> Vec<(&'static str, f64)> {
    vec![
        ("SRC_MODE", mode as f64),
        ("LUMA_EXACT", if exact { 1.0 } else { 0.0 }),
    ]
}

fn src_entry(binding: u32, ty: wgpu::BindingType) -> wgpu::BindGroupLayoutEntry {
    wgpu::BindGroupLayoutEntry {
        binding,
        visibility: wgpu::ShaderStages::VERTEX
            | wgpu::ShaderStages::FRAGMENT
            | wgpu::ShaderStages::COMPUTE,
        ty,
        count: None,
    }
}

fn texture_binding() -> wgpu::BindingType {
    wgpu::BindingType::Texture {
        sample_type: wgpu::TextureSampleType::Float { filterable: false },
        view_dimension: wgpu::TextureViewDimension::D2,
        multisampled: false,
    }
}

fn uniform_binding(size: u64) -> wgpu::BindingType {
    wgpu::BindingType::Buffer {
        ty: wgpu::BufferBindingType::Uniform,
        has_dynamic_offset: false,
        min_binding_size: NonZeroU64::new(size),
    }
}

const COMMON_WGSL: &str = include_str!("shaders/common.wgsl");
const RENDER_WGSL: &str = include_str!("shaders/render.wgsl");
const CONVERT_WGSL: &str = include_str!("shaders/convert.wgsl");
const MARKERS_WGSL: &str = include_str!("shaders/markers.wgsl");

impl WgpuBackend {
    /// Creates a headless device on any adapter (honours `WGPU_BACKEND` and
    /// friends). Fails with [`GpuError::NoAdapter`] when none exists.
    pub fn new() -> Result<Self> {
        let instance =
            wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
        let adapter = pollster::block_on(instance.request_adapter(&wgpu::RequestAdapterOptions {
            power_preference: wgpu::PowerPreference::HighPerformance,
            force_fallback_adapter: false,
            compatible_surface: None,
            apply_limit_buckets: false,
        }))
        .map_err(|e| GpuError::NoAdapter(e.to_string()))?;
        Self::from_adapter(&adapter)
    }

    fn from_adapter(adapter: &wgpu::Adapter) -> Result<Self> {
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

        let error = Arc::new(Mutex::new(None::<String>));
        let e2 = error.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            log::error!("wgpu error: {e}");
            let mut g = lock(&e2);
            if g.is_none() {
                *g = Some(e.to_string());
            }
        }));
        let lost = Arc::new(Mutex::new(None::<String>));
        let l2 = lost.clone();
        device.set_device_lost_callback(move |reason, msg| {
            *lock(&l2) = Some(format!("{reason:?}: {msg}"));
        });

        let params_size = std::mem::size_of::<Params>() as u64;
        let uniform_stride = align_up(
            params_size,
            limits.min_uniform_buffer_offset_alignment as u64,
        );
        let max_dim = limits.max_texture_dimension_2d.min(crate::MAX_DIMENSION);
        let max_buffer = limits
            .max_buffer_size
            .min(limits.max_storage_buffer_binding_size);

        let module = |label: &str, body: &str| {
            let src = format!("{COMMON_WGSL}\n{body}");
            device.create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some(label),
                source: wgpu::ShaderSource::Wgsl(src.into()),
            })
        };
        let render_module = module("virtsoc-render", RENDER_WGSL);
        let convert_module = module("virtsoc-convert", CONVERT_WGSL);
        let marker_module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("virtsoc-markers"),
            source: wgpu::ShaderSource::Wgsl(MARKERS_WGSL.into()),
        });

        let src_entries = [
            src_entry(0, uniform_binding(params_size)),
            src_entry(1, texture_binding()),
            src_entry(2, texture_binding()),
            src_entry(3, texture_binding()),
        ];
        let src_bgl = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some("virtsoc-src"),
            entries: &src_entries,
        });
        let mut convert_entries = src_entries.to_vec();
        convert_entries.push(wgpu::BindGroupLayoutEntry {
            binding: 5,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty: wgpu::BufferBindingType::Storage { read_only: false },
                has_dynamic_offset: false,
                min_binding_size: None,
            },
            count: None,
        });
        let convert_bgl = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some("virtsoc-convert"),
            entries: &convert_entries,
        });
        let marker_bgl = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some("virtsoc-markers"),
            entries: &[src_entry(0, uniform_binding(16))],
        });
        let playout = |label: &str, bgl: &wgpu::BindGroupLayout| {
            device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                label: Some(label),
                bind_group_layouts: &[Some(bgl)],
                immediate_size: 0,
            })
        };
        let src_layout = playout("virtsoc-src", &src_bgl);
        let convert_layout = playout("virtsoc-convert", &convert_bgl);
        let marker_layout = playout("virtsoc-markers", &marker_bgl);

        let dummy = device.create_texture(&wgpu::TextureDescriptor {
            label: Some("virtsoc-dummy"),
            size: wgpu::Extent3d {
                width: 1,
                height: 1,
                depth_or_array_layers: 1,
            },
            mip_level_count: 1,
            sample_count: 1,
            dimension: wgpu::TextureDimension::D2,
            format: wgpu::TextureFormat::R8Unorm,
            usage: wgpu::TextureUsages::TEXTURE_BINDING,
            view_formats: &[],
        });
        let dummy_view = dummy.create_view(&Default::default());

        let backend = WgpuBackend {
            device,
            queue,
            info,
            max_dim,
            max_buffer,
            uniform_stride,
            render_module,
            convert_module,
            marker_module,
            src_layout,
            convert_bgl,
            convert_layout,
            src_bgl,
            marker_bgl,
            marker_layout,
            dummy_view,
            state: Mutex::new(State::default()),
            completed: Arc::new(AtomicU64::new(0)),
            error,
            lost,
        };
        backend.check_errors()?;
        Ok(backend)
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
        lock(&self.state).last_submission
    }

    /// Highest submission known to be complete; polls the device without blocking.
    pub fn completed_submission(&self) -> SubmissionId {
        let _ = self.device.poll(wgpu::PollType::Poll);
        self.completed.load(Ordering::Acquire)
    }

    /// Blocks until submission `id` (and so every earlier one) has completed.
    pub fn wait_submission(&self, id: SubmissionId) -> Result<()> {
        if id > self.last_submission() {
            return Err(GpuError::UnknownSubmission(id));
        }
        for _ in 0..100 {
            if self.completed.load(Ordering::Acquire) >= id {
                return Ok(());
            }
            self.device
                .poll(wgpu::PollType::wait_indefinitely())
                .map_err(|e| GpuError::Backend(e.to_string()))?;
            self.check_lost()?;
        }
        if self.completed.load(Ordering::Acquire) >= id {
            Ok(())
        } else {
            Err(GpuError::Backend(format!(
                "submission {id} did not complete"
            )))
        }
    }

    /// Number of idle pooled textures and buffers (for tests of bounded reuse).
    pub fn pooled_resources(&self) -> (usize, usize) {
        let st = lock(&self.state);
        (st.textures.len(), st.buffers.len())
    }

    fn check_lost(&self) -> Result<()> {
        match lock(&self.lost).clone() {
            Some(m) => Err(GpuError::DeviceLost(m)),
            None => Ok(()),
        }
    }

    fn check_errors(&self) -> Result<()> {
        self.check_lost()?;
        match lock(&self.error).take() {
            Some(m) => Err(GpuError::Backend(m)),
            None => Ok(()),
        }
    }

    fn check_size(&self, layout: &FrameLayout) -> Result<()> {
        let too_large = GpuError::TooLarge {
            width: layout.width,
            height: layout.height,
            max: self.max_dim,
        };
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

    // -- pools --------------------------------------------------------------

    fn take_texture(&self, st: &mut State, key: TexKey) -> wgpu::Texture {
        if let Some(i) = st.textures.iter().position(|(k, _)| *k == key) {
            return st.textures.remove(i).1;
        }
        self.device.create_texture(&wgpu::TextureDescriptor {
            label: Some("virtsoc-pooled"),
            size: wgpu::Extent3d {
                width: key.width,
                height: key.height,
                depth_or_array_layers: 1,
            },
            mip_level_count: 1,
            sample_count: 1,
            dimension: wgpu::TextureDimension::D2,
            format: key.format,
            usage: key.usage,
            view_formats: &[],
        })
    }

    fn give_texture(st: &mut State, key: TexKey, tex: wgpu::Texture) {
        st.textures.push((key, tex));
        while st.textures.len() > MAX_POOLED_TEXTURES {
            st.textures.remove(0);
        }
    }

    fn take_buffer(&self, st: &mut State, key: BufKey) -> wgpu::Buffer {
        if let Some(i) = st.buffers.iter().position(|(k, _)| *k == key) {
            return st.buffers.remove(i).1;
        }
        self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("virtsoc-pooled"),
            size: key.size,
            usage: key.usage,
            mapped_at_creation: false,
        })
    }

    fn give_buffer(st: &mut State, key: BufKey, buf: wgpu::Buffer) {
        st.buffers.push((key, buf));
        while st.buffers.len() > MAX_POOLED_BUFFERS {
            st.buffers.remove(0);
        }
    }

    // -- pipelines ------------------------------------------------------------

    fn render_pipeline(&self, st: &mut State, key: PipeKey) -> wgpu::RenderPipeline {
        if let Some(p) = st.render.get(&key) {
            return p.clone();
        }
        let no_buffers: Vec<Option<wgpu::VertexBufferLayout>> = vec![];
        let (target, blend, module, vs, fs, layout, buffers, constants) = match key {
            PipeKey::Layer {
                target,
                blend,
                mode,
                exact,
            } => (
                target,
                blend,
                &self.render_module,
                "vs_rect",
                "fs_layer",
                &self.src_layout,
                no_buffers,
                src_constants(mode, exact),
            ),
            PipeKey::Equirect { target, mode } => (
                target,
                false,
                &self.render_module,
                "vs_rect",
                "fs_equirect",
                &self.src_layout,
                no_buffers,
                src_constants(mode, false),
            ),
            PipeKey::Markers(target) => (
                target,
                true,
                &self.marker_module,
                "vs_marker",
                "fs_marker",
                &self.marker_layout,
                vec![Some(wgpu::VertexBufferLayout {
                    array_stride: std::mem::size_of::<MarkerInstance>() as u64,
                    step_mode: wgpu::VertexStepMode::Instance,
                    attributes: &MARKER_ATTRIBUTES,
                })],
                vec![],
            ),
        };
        let options = wgpu::PipelineCompilationOptions {
            constants: &constants,
            ..Default::default()
        };
        let pipeline = self
            .device
            .create_render_pipeline(&wgpu::RenderPipelineDescriptor {
                label: Some("virtsoc-render"),
                layout: Some(layout),
                vertex: wgpu::VertexState {
                    module,
                    entry_point: Some(vs),
                    compilation_options: options.clone(),
                    buffers: &buffers,
                },
                primitive: wgpu::PrimitiveState {
                    topology: wgpu::PrimitiveTopology::TriangleList,
                    cull_mode: None,
                    ..Default::default()
                },
                depth_stencil: None,
                multisample: Default::default(),
                fragment: Some(wgpu::FragmentState {
                    module,
                    entry_point: Some(fs),
                    compilation_options: options,
                    targets: &[Some(wgpu::ColorTargetState {
                        format: target.texture_format(),
                        blend: blend.then_some(wgpu::BlendState::ALPHA_BLENDING),
                        write_mask: wgpu::ColorWrites::ALL,
                    })],
                }),
                multiview_mask: None,
                cache: None,
            });
        st.render.insert(key, pipeline.clone());
        pipeline
    }

    fn convert_pipeline(&self, st: &mut State, mode: u32, exact: bool) -> wgpu::ComputePipeline {
        if let Some(p) = st.convert.get(&(mode, exact)) {
            return p.clone();
        }
        let constants = src_constants(mode, exact);
        let p = self
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some("virtsoc-convert"),
                layout: Some(&self.convert_layout),
                module: &self.convert_module,
                entry_point: Some("cs_convert"),
                compilation_options: wgpu::PipelineCompilationOptions {
                    constants: &constants,
                    ..Default::default()
                },
                cache: None,
            });
        st.convert.insert((mode, exact), p.clone());
        p
    }

    // -- uploads --------------------------------------------------------------

    fn upload_plane(
        &self,
        st: &mut State,
        format: wgpu::TextureFormat,
        width: u32,
        height: u32,
        data: &[u8],
        stride: usize,
    ) -> (TexKey, wgpu::Texture) {
        let key = TexKey {
            format,
            width,
            height,
            usage: wgpu::TextureUsages::TEXTURE_BINDING | wgpu::TextureUsages::COPY_DST,
        };
        let tex = self.take_texture(st, key);
        self.queue.write_texture(
            wgpu::TexelCopyTextureInfo {
                texture: &tex,
                mip_level: 0,
                origin: wgpu::Origin3d::ZERO,
                aspect: wgpu::TextureAspect::All,
            },
            data,
            wgpu::TexelCopyBufferLayout {
                offset: 0,
                bytes_per_row: Some(stride as u32),
                rows_per_image: Some(height),
            },
            wgpu::Extent3d {
                width,
                height,
                depth_or_array_layers: 1,
            },
        );
        (key, tex)
    }

    fn upload_source(&self, st: &mut State, src: FrameRef<'_>) -> Result<Uploaded> {
        let planes: Planes = src.layout.check_buffer(src.data.len())?;
        let l = src.layout;
        let (w, h) = (l.width, l.height);
        let (cw, ch) = l.chroma_size();
        let plane = |o: usize, end: usize| &src.data[o..end];
        let mut textures = Vec::with_capacity(3);
        let mode = match l.format {
            PixelFormat::Rgba8 | PixelFormat::Bgra8 => {
                let f = if l.format == PixelFormat::Bgra8 {
                    wgpu::TextureFormat::Bgra8Unorm
                } else {
                    wgpu::TextureFormat::Rgba8Unorm
                };
                textures.push(self.upload_plane(st, f, w, h, plane(0, planes.size), planes.p0.1));
                0
            }
            PixelFormat::Nv12 => {
                let (o1, s1) = planes.p1.expect("nv12 planes");
                textures.push(self.upload_plane(
                    st,
                    wgpu::TextureFormat::R8Unorm,
                    w,
                    h,
                    plane(0, o1),
                    planes.p0.1,
                ));
                textures.push(self.upload_plane(
                    st,
                    wgpu::TextureFormat::Rg8Unorm,
                    cw,
                    ch,
                    plane(o1, planes.size),
                    s1,
                ));
                1
            }
            PixelFormat::Yuv420p => {
                let (o1, s1) = planes.p1.expect("yuv420p planes");
                let (o2, s2) = planes.p2.expect("yuv420p planes");
                textures.push(self.upload_plane(
                    st,
                    wgpu::TextureFormat::R8Unorm,
                    w,
                    h,
                    plane(0, o1),
                    planes.p0.1,
                ));
                textures.push(self.upload_plane(
                    st,
                    wgpu::TextureFormat::R8Unorm,
                    cw,
                    ch,
                    plane(o1, o2),
                    s1,
                ));
                textures.push(self.upload_plane(
                    st,
                    wgpu::TextureFormat::R8Unorm,
                    cw,
                    ch,
                    plane(o2, planes.size),
                    s2,
                ));
                2
            }
        };
        let view = |i: usize| {
            textures
                .get(i)
                .map(|(_, t)| t.create_view(&Default::default()))
                .unwrap_or_else(|| self.dummy_view.clone())
        };
        let views = [view(0), view(1), view(2)];
        Ok(Uploaded {
            textures,
            views,
            mode,
        })
    }

    fn src_bind_group(
        &self,
        bgl: &wgpu::BindGroupLayout,
        ubuf: &wgpu::Buffer,
        offset: u64,
        up: &Uploaded,
        storage: Option<&wgpu::Buffer>,
    ) -> wgpu::BindGroup {
        let mut entries = vec![
            wgpu::BindGroupEntry {
                binding: 0,
                resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer: ubuf,
                    offset,
                    size: NonZeroU64::new(std::mem::size_of::<Params>() as u64),
                }),
            },
            wgpu::BindGroupEntry {
                binding: 1,
                resource: wgpu::BindingResource::TextureView(&up.views[0]),
            },
            wgpu::BindGroupEntry {
                binding: 2,
                resource: wgpu::BindingResource::TextureView(&up.views[1]),
            },
            wgpu::BindGroupEntry {
                binding: 3,
                resource: wgpu::BindingResource::TextureView(&up.views[2]),
            },
        ];
        if let Some(s) = storage {
            entries.push(wgpu::BindGroupEntry {
                binding: 5,
                resource: s.as_entire_binding(),
            });
        }
        self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("virtsoc-src"),
            layout: bgl,
            entries: &entries,
        })
    }

    fn uniform_buffer(&self, params: &[Params]) -> wgpu::Buffer {
        let stride = self.uniform_stride as usize;
        let mut bytes = vec![0u8; stride * params.len().max(1)];
        for (i, p) in params.iter().enumerate() {
            bytes[i * stride..i * stride + std::mem::size_of::<Params>()]
                .copy_from_slice(bytemuck::bytes_of(p));
        }
        self.device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some("virtsoc-params"),
                contents: &bytes,
                usage: wgpu::BufferUsages::UNIFORM,
            })
    }

    /// Submits one command buffer, numbers it and records its completion time.
    fn submit(&self, st: &mut State, cmd: wgpu::CommandBuffer) -> Submitted {
        let at = Instant::now();
        let index = self.queue.submit([cmd]);
        st.last_submission += 1;
        let id = st.last_submission;
        let done = Arc::new(Mutex::new(None));
        let d2 = done.clone();
        let completed = self.completed.clone();
        self.queue.on_submitted_work_done(move || {
            *lock(&d2) = Some(Instant::now());
            completed.fetch_max(id, Ordering::AcqRel);
        });
        Submitted {
            id,
            at,
            index,
            done,
        }
    }

    fn target_texture(&self, st: &mut State, dst: &FrameLayout) -> (TexKey, wgpu::Texture) {
        let key = TexKey {
            format: Target::of(dst.format).texture_format(),
            width: dst.width,
            height: dst.height,
            usage: wgpu::TextureUsages::RENDER_ATTACHMENT
                | wgpu::TextureUsages::COPY_SRC
                | wgpu::TextureUsages::COPY_DST,
        };
        (key, self.take_texture(st, key))
    }

    /// Uploads the current destination contents into the render target.
    fn load_target(&self, tex: &wgpu::Texture, dst: FrameRef<'_>) {
        let l = dst.layout;
        self.queue.write_texture(
            wgpu::TexelCopyTextureInfo {
                texture: tex,
                mip_level: 0,
                origin: wgpu::Origin3d::ZERO,
                aspect: wgpu::TextureAspect::All,
            },
            &dst.data[..l.stride as usize * l.height as usize],
            wgpu::TexelCopyBufferLayout {
                offset: 0,
                bytes_per_row: Some(l.stride),
                rows_per_image: Some(l.height),
            },
            wgpu::Extent3d {
                width: l.width,
                height: l.height,
                depth_or_array_layers: 1,
            },
        );
    }

    /// Submits the render work, then the copy of the target into a readback
    /// buffer, and returns everything to the pools.
    #[allow(clippy::too_many_arguments)]
    fn finish_render(
        &self,
        st: &mut State,
        encoder: wgpu::CommandEncoder,
        target: (TexKey, wgpu::Texture),
        layout: FrameLayout,
        uploads: Vec<Uploaded>,
        upload: Duration,
    ) -> Result<PendingFrame> {
        let work = self.submit(st, encoder.finish());
        let bpr = align_up(
            layout.width as u64 * 4,
            wgpu::COPY_BYTES_PER_ROW_ALIGNMENT as u64,
        );
        let buf_key = BufKey {
            size: bpr * layout.height as u64,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        };
        let buffer = self.take_buffer(st, buf_key);
        let mut enc = self.device.create_command_encoder(&Default::default());
        enc.copy_texture_to_buffer(
            wgpu::TexelCopyTextureInfo {
                texture: &target.1,
                mip_level: 0,
                origin: wgpu::Origin3d::ZERO,
                aspect: wgpu::TextureAspect::All,
            },
            wgpu::TexelCopyBufferInfo {
                buffer: &buffer,
                layout: wgpu::TexelCopyBufferLayout {
                    offset: 0,
                    bytes_per_row: Some(bpr as u32),
                    rows_per_image: Some(layout.height),
                },
            },
            wgpu::Extent3d {
                width: layout.width,
                height: layout.height,
                depth_or_array_layers: 1,
            },
        );
        let copy = self.submit(st, enc.finish());
        Self::give_texture(st, target.0, target.1);
        for up in uploads {
            for (k, t) in up.textures {
                Self::give_texture(st, k, t);
            }
        }
        self.check_errors()?;
        Ok(PendingFrame {
            id: copy.id,
            layout,
            buffer,
            buf_key,
            bytes_per_row: bpr as u32,
            upload,
            submitted: work.at,
            work: work.index,
            copy: copy.index,
            work_done: work.done,
            copy_done: copy.done,
        })
    }

    fn layer_params(&self, layer: &Layer<'_>, dst: &FrameLayout) -> Params {
        let r = layer.dst_rect;
        let c = layer.crop;
        let map = LayerMap::new(r, c, layer.rotation);
        Params {
            dst_rect: [r.x as f32, r.y as f32, r.width as f32, r.height as f32],
            map_m: map.m,
            map_b: [map.b[0], map.b[1], 0.0, 0.0],
            crop: [c.x as f32, c.y as f32, c.width as f32, c.height as f32],
            misc: [
                layer.src.layout.width as f32,
                layer.src.layout.height as f32,
                layer.alpha,
                0.0,
            ],
            rot: [1.0, 0.0, 1.0, 0.0],
            target_size: [dst.width as f32, dst.height as f32, 0.0, 0.0],
            modes: [0; 4],
        }
    }

    // -- operations -------------------------------------------------------------

    /// Submits a composition. `dst` gives the destination layout and, with
    /// [`Clear::Keep`], its current contents (otherwise its bytes are not read).
    pub fn submit_composite(
        &self,
        layers: &[Layer<'_>],
        dst: FrameRef<'_>,
        clear: Clear,
    ) -> Result<PendingFrame> {
        let t0 = Instant::now();
        check_rgb_dst("composite", &dst.layout, dst.data.len())?;
        check_layers(layers)?;
        self.check_size(&dst.layout)?;
        for l in layers {
            self.check_size(&l.src.layout)?;
        }
        let target = Target::of(dst.layout.format);
        let mut st = lock(&self.state);
        let tex = self.target_texture(&mut st, &dst.layout);
        if clear == Clear::Keep {
            self.load_target(&tex.1, dst);
        }
        let mut uploads = Vec::with_capacity(layers.len());
        let mut params = Vec::with_capacity(layers.len());
        for l in layers {
            let up = self.upload_source(&mut st, l.src)?;
            params.push(self.layer_params(l, &dst.layout));
            uploads.push(up);
        }
        let ubuf = self.uniform_buffer(&params);
        let groups: Vec<_> = uploads
            .iter()
            .enumerate()
            .map(|(i, up)| {
                self.src_bind_group(
                    &self.src_bgl,
                    &ubuf,
                    i as u64 * self.uniform_stride,
                    up,
                    None,
                )
            })
            .collect();
        let pipes: Vec<_> = layers
            .iter()
            .zip(&uploads)
            .map(|(l, up)| {
                let key = PipeKey::Layer {
                    target,
                    blend: l.blend,
                    mode: up.mode,
                    exact: LayerMap::new(l.dst_rect, l.crop, l.rotation).is_exact(),
                };
                self.render_pipeline(&mut st, key)
            })
            .collect();
        let upload = t0.elapsed();
        let view = tex.1.create_view(&Default::default());
        let load = match clear.color() {
            Some(c) => wgpu::LoadOp::Clear(wgpu::Color {
                r: c[0] as f64 / 255.0,
                g: c[1] as f64 / 255.0,
                b: c[2] as f64 / 255.0,
                a: c[3] as f64 / 255.0,
            }),
            None => wgpu::LoadOp::Load,
        };
        let mut encoder = self.device.create_command_encoder(&Default::default());
        {
            let mut pass = encoder.begin_render_pass(&wgpu::RenderPassDescriptor {
                label: Some("virtsoc-composite"),
                color_attachments: &[Some(wgpu::RenderPassColorAttachment {
                    view: &view,
                    depth_slice: None,
                    resolve_target: None,
                    ops: wgpu::Operations {
                        load,
                        store: wgpu::StoreOp::Store,
                    },
                })],
                ..Default::default()
            });
            for (pipe, group) in pipes.iter().zip(&groups) {
                pass.set_pipeline(pipe);
                pass.set_bind_group(0, group, &[]);
                pass.draw(0..6, 0..1);
            }
        }
        self.finish_render(&mut st, encoder, tex, dst.layout, uploads, upload)
    }

    /// Submits an equirect projection into a destination of `dst` layout.
    pub fn submit_project_equirect(
        &self,
        src: FrameRef<'_>,
        view: View,
        dst: FrameLayout,
    ) -> Result<PendingFrame> {
        let t0 = Instant::now();
        check_rgb_dst("project_equirect", &dst, usize::MAX)?;
        check_view(&view)?;
        src.layout.check_buffer(src.data.len())?;
        self.check_size(&dst)?;
        self.check_size(&src.layout)?;
        let target = Target::of(dst.format);
        let mut st = lock(&self.state);
        let tex = self.target_texture(&mut st, &dst);
        let up = self.upload_source(&mut st, src)?;
        let vp = ViewParams::new(&view);
        let p = Params {
            dst_rect: [0.0, 0.0, dst.width as f32, dst.height as f32],
            map_m: [0.0; 4],
            map_b: [0.0; 4],
            crop: [0.0, 0.0, src.layout.width as f32, src.layout.height as f32],
            misc: [
                src.layout.width as f32,
                src.layout.height as f32,
                1.0,
                vp.tan_half,
            ],
            rot: [vp.cos_yaw, vp.sin_yaw, vp.cos_pitch, vp.sin_pitch],
            target_size: [dst.width as f32, dst.height as f32, 0.0, 0.0],
            modes: [0; 4],
        };
        let ubuf = self.uniform_buffer(&[p]);
        let group = self.src_bind_group(&self.src_bgl, &ubuf, 0, &up, None);
        let pipe = self.render_pipeline(
            &mut st,
            PipeKey::Equirect {
                target,
                mode: up.mode,
            },
        );
        let upload = t0.elapsed();
        let tview = tex.1.create_view(&Default::default());
        let mut encoder = self.device.create_command_encoder(&Default::default());
        {
            let mut pass = encoder.begin_render_pass(&wgpu::RenderPassDescriptor {
                label: Some("virtsoc-equirect"),
                color_attachments: &[Some(wgpu::RenderPassColorAttachment {
                    view: &tview,
                    depth_slice: None,
                    resolve_target: None,
                    ops: wgpu::Operations {
                        load: wgpu::LoadOp::Clear(wgpu::Color::BLACK),
                        store: wgpu::StoreOp::Store,
                    },
                })],
                ..Default::default()
            });
            pass.set_pipeline(&pipe);
            pass.set_bind_group(0, &group, &[]);
            pass.draw(0..6, 0..1);
        }
        self.finish_render(&mut st, encoder, tex, dst, vec![up], upload)
    }

    /// Submits markers drawn over the contents of `dst`.
    pub fn submit_draw_markers(
        &self,
        markers: &[Marker],
        dst: FrameRef<'_>,
    ) -> Result<PendingFrame> {
        let t0 = Instant::now();
        check_rgb_dst("draw_markers", &dst.layout, dst.data.len())?;
        check_markers(markers)?;
        self.check_size(&dst.layout)?;
        let target = Target::of(dst.layout.format);
        let mut st = lock(&self.state);
        let tex = self.target_texture(&mut st, &dst.layout);
        self.load_target(&tex.1, dst);
        let instances: Vec<MarkerInstance> = markers
            .iter()
            .map(|m| MarkerInstance {
                centre_size: [m.x, m.y, m.size],
                shape: match m.shape {
                    MarkerShape::Square => 0,
                    MarkerShape::Cross => 1,
                },
                rgba: m.rgba,
            })
            .collect();
        let ibuf = (!instances.is_empty()).then(|| {
            self.device
                .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                    label: Some("virtsoc-markers"),
                    contents: bytemuck::cast_slice(&instances),
                    usage: wgpu::BufferUsages::VERTEX,
                })
        });
        let ubuf = self
            .device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some("virtsoc-marker-params"),
                contents: bytemuck::cast_slice(&[
                    dst.layout.width as f32,
                    dst.layout.height as f32,
                    0.0,
                    0.0,
                ]),
                usage: wgpu::BufferUsages::UNIFORM,
            });
        let group = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("virtsoc-markers"),
            layout: &self.marker_bgl,
            entries: &[wgpu::BindGroupEntry {
                binding: 0,
                resource: ubuf.as_entire_binding(),
            }],
        });
        let pipe = self.render_pipeline(&mut st, PipeKey::Markers(target));
        let upload = t0.elapsed();
        let tview = tex.1.create_view(&Default::default());
        let mut encoder = self.device.create_command_encoder(&Default::default());
        {
            let mut pass = encoder.begin_render_pass(&wgpu::RenderPassDescriptor {
                label: Some("virtsoc-markers"),
                color_attachments: &[Some(wgpu::RenderPassColorAttachment {
                    view: &tview,
                    depth_slice: None,
                    resolve_target: None,
                    ops: wgpu::Operations {
                        load: wgpu::LoadOp::Load,
                        store: wgpu::StoreOp::Store,
                    },
                })],
                ..Default::default()
            });
            if let Some(ibuf) = &ibuf {
                pass.set_pipeline(&pipe);
                pass.set_bind_group(0, &group, &[]);
                pass.set_vertex_buffer(0, ibuf.slice(..));
                pass.draw(0..6, 0..instances.len() as u32);
            }
        }
        self.finish_render(&mut st, encoder, tex, dst.layout, vec![], upload)
    }

    /// Submits a conversion (compute shader) of the whole `src` into a
    /// destination of `dst` layout.
    pub fn submit_convert(&self, src: FrameRef<'_>, dst: FrameLayout) -> Result<PendingFrame> {
        let t0 = Instant::now();
        check_rgb_dst("convert", &dst, usize::MAX)?;
        src.layout.check_buffer(src.data.len())?;
        self.check_size(&dst)?;
        self.check_size(&src.layout)?;
        let mut st = lock(&self.state);
        let up = self.upload_source(&mut st, src)?;
        let layer = Layer::new(src, Rect::full(dst.width, dst.height)).with_blend(false);
        let mut p = self.layer_params(&layer, &dst);
        let exact = LayerMap::new(layer.dst_rect, layer.crop, layer.rotation).is_exact();
        p.modes[3] = (dst.format == PixelFormat::Bgra8) as u32;
        let ubuf = self.uniform_buffer(&[p]);
        let size = dst.width as u64 * dst.height as u64 * 4;
        let skey = BufKey {
            size,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
        };
        let storage = self.take_buffer(&mut st, skey);
        let group = self.src_bind_group(&self.convert_bgl, &ubuf, 0, &up, Some(&storage));
        let pipe = self.convert_pipeline(&mut st, up.mode, exact);
        let upload = t0.elapsed();
        let mut encoder = self.device.create_command_encoder(&Default::default());
        {
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("virtsoc-convert"),
                timestamp_writes: None,
            });
            pass.set_pipeline(&pipe);
            pass.set_bind_group(0, &group, &[]);
            pass.dispatch_workgroups(dst.width.div_ceil(8), dst.height.div_ceil(8), 1);
        }
        let work = self.submit(&mut st, encoder.finish());
        let buf_key = BufKey {
            size,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        };
        let buffer = self.take_buffer(&mut st, buf_key);
        let mut enc = self.device.create_command_encoder(&Default::default());
        enc.copy_buffer_to_buffer(&storage, 0, &buffer, 0, size);
        let copy = self.submit(&mut st, enc.finish());
        Self::give_buffer(&mut st, skey, storage);
        for (k, t) in up.textures {
            Self::give_texture(&mut st, k, t);
        }
        self.check_errors()?;
        Ok(PendingFrame {
            id: copy.id,
            layout: dst,
            buffer,
            buf_key,
            bytes_per_row: dst.width * 4,
            upload,
            submitted: work.at,
            work: work.index,
            copy: copy.index,
            work_done: work.done,
            copy_done: copy.done,
        })
    }

    /// Waits for `pending` and copies the result into `dst`, which must have the
    /// pending frame's format, width and height (any valid stride).
    pub fn finish(&self, pending: PendingFrame, dst: FrameMut<'_>) -> Result<GpuStats> {
        let pl = pending.layout;
        let l = dst.layout;
        if (l.format, l.width, l.height) != (pl.format, pl.width, pl.height) {
            return Err(GpuError::InvalidLayout(format!(
                "finish: destination {:?} {}x{} does not match the submitted {:?} {}x{}",
                l.format, l.width, l.height, pl.format, pl.width, pl.height
            )));
        }
        check_rgb_dst("finish", &l, dst.data.len())?;
        // Wait for the work first so its completion time is recorded apart
        // from the readback copy's.
        self.device
            .poll(wgpu::PollType::Wait {
                submission_index: Some(pending.work.clone()),
                timeout: None,
            })
            .map_err(|e| GpuError::Backend(e.to_string()))?;
        let slice = pending.buffer.slice(..);
        let (tx, rx) = mpsc::channel();
        slice.map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        self.device
            .poll(wgpu::PollType::Wait {
                submission_index: Some(pending.copy.clone()),
                timeout: None,
            })
            .map_err(|e| GpuError::Backend(e.to_string()))?;
        self.check_lost()?;
        let mapped = match rx.try_recv() {
            Ok(r) => r,
            Err(_) => {
                // The map callback runs on a later poll in some cases.
                self.device
                    .poll(wgpu::PollType::wait_indefinitely())
                    .map_err(|e| GpuError::Backend(e.to_string()))?;
                rx.recv_timeout(Duration::from_secs(60))
                    .map_err(|_| GpuError::Backend("readback map did not complete".into()))?
            }
        };
        mapped.map_err(|e| GpuError::Backend(format!("readback map failed: {e}")))?;
        let mapped_at = Instant::now();
        let now = mapped_at;
        let work_done = lock(&pending.work_done).unwrap_or(now);
        let copy_done = lock(&pending.copy_done).unwrap_or(now);
        {
            let view = slice
                .get_mapped_range()
                .map_err(|e| GpuError::Backend(format!("readback range: {e}")))?;
            let row = l.width as usize * 4;
            let bpr = pending.bytes_per_row as usize;
            let stride = l.stride as usize;
            for (y, src_row) in view.chunks(bpr).take(l.height as usize).enumerate() {
                dst.data[y * stride..y * stride + row].copy_from_slice(&src_row[..row]);
            }
        }
        pending.buffer.unmap();
        // GPU copy into the readback buffer, then mapping it and copying rows out.
        let readback = copy_done.saturating_duration_since(work_done) + mapped_at.elapsed();
        let execute = work_done.saturating_duration_since(pending.submitted);
        {
            let mut st = lock(&self.state);
            Self::give_buffer(&mut st, pending.buf_key, pending.buffer);
        }
        self.check_errors()?;
        Ok(GpuStats {
            upload: pending.upload,
            execute,
            readback,
        })
    }
}

const MARKER_ATTRIBUTES: [wgpu::VertexAttribute; 3] = [
    wgpu::VertexAttribute {
        format: wgpu::VertexFormat::Float32x3,
        offset: 0,
        shader_location: 0,
    },
    wgpu::VertexAttribute {
        format: wgpu::VertexFormat::Uint32,
        offset: 12,
        shader_location: 1,
    },
    wgpu::VertexAttribute {
        format: wgpu::VertexFormat::Unorm8x4,
        offset: 16,
        shader_location: 2,
    },
];

impl GpuBackend for WgpuBackend {
    fn name(&self) -> &str {
        "wgpu"
    }

    fn composite_with(
        &self,
        layers: &[Layer<'_>],
        dst: FrameMut<'_>,
        clear: Clear,
    ) -> Result<GpuStats> {
        let pending = self.submit_composite(layers, dst.as_ref(), clear)?;
        self.finish(pending, dst)
    }

    fn project_equirect(
        &self,
        src: FrameRef<'_>,
        view: View,
        dst: FrameMut<'_>,
    ) -> Result<GpuStats> {
        check_rgb_dst("project_equirect", &dst.layout, dst.data.len())?;
        let pending = self.submit_project_equirect(src, view, dst.layout)?;
        self.finish(pending, dst)
    }

    fn draw_markers(&self, markers: &[Marker], dst: FrameMut<'_>) -> Result<GpuStats> {
        let pending = self.submit_draw_markers(markers, dst.as_ref())?;
        self.finish(pending, dst)
    }

    fn convert(&self, src: FrameRef<'_>, dst: FrameMut<'_>) -> Result<GpuStats> {
        check_rgb_dst("convert", &dst.layout, dst.data.len())?;
        let pending = self.submit_convert(src, dst.layout)?;
        self.finish(pending, dst)
    }
}
