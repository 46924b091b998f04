//! Nearest-neighbour sampling of one plane of a resident image on the GPU
//! ([`WgpuBackend::sample_plane`]): a compute pass takes one texel per cell of an even grid
//! over a source rectangle and packs them into a small buffer, which is all that is read
//! back. What a viewer of a 1080p frame needs at 480x270 is then one dispatch and a 0.5 MB
//! readback, instead of a readback of every sampled row (2 MB and a copy command per row).

use std::sync::OnceLock;

use super::pool::BufKey;
use virtsoc_sync::LockExt;

use super::WgpuBackend;
use crate::{GpuError, GpuImage, Result};

const SHADER: &str = r#"
struct Grid {
    // Source rectangle (texels) and samples over it.
    origin: vec2<u32>,
    size: vec2<u32>,
    samples: vec2<u32>,
    // The samples taken: first, first + step, ... (count of them); texels >> shift.
    first: vec2<u32>,
    count: vec2<u32>,
    step: vec2<u32>,
    shift: vec2<u32>,
};
@group(0) @binding(0) var src: texture_2d<f32>;
@group(0) @binding(1) var<uniform> g: Grid;
@group(0) @binding(2) var<storage, read_write> dst: array<u32>;

fn pos(i: u32, origin: u32, size: u32, n: u32) -> u32 {
    return origin + min((2u * i + 1u) * size / (2u * n), size - 1u);
}

@compute @workgroup_size(8, 8)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    if (id.x >= g.count.x || id.y >= g.count.y) { return; }
    let sx = pos(g.first.x + id.x * g.step.x, g.origin.x, g.size.x, g.samples.x) >> g.shift.x;
    let sy = pos(g.first.y + id.y * g.step.y, g.origin.y, g.size.y, g.samples.y) >> g.shift.y;
    dst[id.y * g.count.x + id.x] = pack4x8unorm(textureLoad(src, vec2<u32>(sx, sy), 0));
}
"#;

/// Samples along one axis: `samples` cells evenly over `size` texels from `origin`, of which
/// `count` are taken: cells `first`, `first + step`, ... Cell `i` reads texel
/// `(origin + min((2i + 1) * size / (2 * samples), size - 1)) >> shift`, the centre of the cell
/// (`shift` 1 reads a half-size chroma plane with a luma grid).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SampleAxis {
    /// First source texel of the rectangle.
    pub origin: u32,
    /// Texels in the rectangle.
    pub size: u32,
    /// Cells the rectangle is divided into.
    pub samples: u32,
    /// The first cell sampled.
    pub first: u32,
    /// Cells sampled.
    pub count: u32,
    /// Cells from one sample to the next (at least 1).
    pub step: u32,
    /// Right shift of the texel position (0 or 1).
    pub shift: u32,
}

impl SampleAxis {
    /// Texel of the `k`th sample taken.
    pub fn texel(&self, k: u32) -> u32 {
        let (origin, size, n) = (
            u64::from(self.origin),
            u64::from(self.size.max(1)),
            u64::from(self.samples.max(1)),
        );
        let i = u64::from(self.first) + u64::from(k) * u64::from(self.step);
        ((origin + ((2 * i + 1) * size / (2 * n)).min(size - 1)) >> self.shift) as u32
    }
}

/// The sampling pipeline, made on first use.
pub(super) struct SamplePipe {
    layout: wgpu::BindGroupLayout,
    pipeline: wgpu::ComputePipeline,
}

pub(super) type SamplePipeCell = OnceLock<SamplePipe>;

impl SamplePipe {
    fn new(device: &wgpu::Device) -> Self {
        let entry = |binding, ty| wgpu::BindGroupLayoutEntry {
            binding,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty,
            count: None,
        };
        let layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some("virtsoc-sample"),
            entries: &[
                entry(
                    0,
                    wgpu::BindingType::Texture {
                        sample_type: wgpu::TextureSampleType::Float { filterable: true },
                        view_dimension: wgpu::TextureViewDimension::D2,
                        multisampled: false,
                    },
                ),
                entry(
                    1,
                    wgpu::BindingType::Buffer {
                        ty: wgpu::BufferBindingType::Uniform,
                        has_dynamic_offset: false,
                        min_binding_size: None,
                    },
                ),
                entry(
                    2,
                    wgpu::BindingType::Buffer {
                        ty: wgpu::BufferBindingType::Storage { read_only: false },
                        has_dynamic_offset: false,
                        min_binding_size: None,
                    },
                ),
            ],
        });
        let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("virtsoc-sample"),
            source: wgpu::ShaderSource::Wgsl(SHADER.into()),
        });
        let pl = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some("virtsoc-sample"),
            bind_group_layouts: &[Some(&layout)],
            immediate_size: 0,
        });
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some("virtsoc-sample"),
            layout: Some(&pl),
            module: &module,
            entry_point: Some("main"),
            compilation_options: Default::default(),
            cache: None,
        });
        SamplePipe { layout, pipeline }
    }
}

fn check_axis(a: &SampleAxis, plane_size: u32) -> Result<()> {
    let last = u64::from(a.first) + u64::from(a.count.max(1) - 1) * u64::from(a.step);
    let src_last = (u64::from(a.origin) + u64::from(a.size.max(1)) - 1) >> a.shift;
    if a.size == 0
        || a.count == 0
        || a.samples == 0
        || a.step == 0
        || a.shift > 1
        || last >= u64::from(a.samples)
        || src_last >= u64::from(plane_size)
        || a.samples > crate::MAX_DIMENSION
    {
        return Err(GpuError::InvalidParameter(format!(
            "sampling {a:?} of a plane of {plane_size} texels"
        )));
    }
    Ok(())
}

impl WgpuBackend {
    /// Samples plane `plane` of `img` nearest-neighbour on the grid `x` by `y` and hands the
    /// samples to `sink`: `x.count * y.count` texels, row by row, 4 bytes each, channels in
    /// R, G, B, A order whatever the texture's order (luma is byte 0; NV12 chroma bytes 0
    /// and 1). One dispatch, one small readback.
    pub fn sample_plane(
        &self,
        img: &GpuImage,
        plane: usize,
        (x, y): (SampleAxis, SampleAxis),
        sink: impl FnOnce(&[u8]),
    ) -> Result<()> {
        self.check_owner(img)?;
        let p = img.inner.planes.get(plane).ok_or_else(|| {
            GpuError::InvalidParameter(format!("image {} has no plane {plane}", img.id()))
        })?;
        check_axis(&x, p.key.width)?;
        check_axis(&y, p.key.height)?;
        let pipe = self
            .sample_pipe
            .get_or_init(|| SamplePipe::new(&self.device));
        let grid: [u32; 14] = [
            x.origin, y.origin, x.size, y.size, x.samples, y.samples, x.first, y.first, x.count,
            y.count, x.step, y.step, x.shift, y.shift,
        ];
        let bytes = u64::from(x.count) * u64::from(y.count) * 4;
        let mut st = self.state.lock_or_recover();
        let uniform = wgpu::util::DeviceExt::create_buffer_init(
            &self.device,
            &wgpu::util::BufferInitDescriptor {
                label: Some("virtsoc-sample"),
                contents: bytemuck::cast_slice(&grid),
                usage: wgpu::BufferUsages::UNIFORM,
            },
        );
        let skey = BufKey {
            size: bytes,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
        };
        let storage = st.pool.take_buffer(&self.device, skey);
        let rkey = BufKey::readback(bytes);
        let readback = st.pool.take_buffer(&self.device, rkey);
        let bind = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("virtsoc-sample"),
            layout: &pipe.layout,
            entries: &[
                wgpu::BindGroupEntry {
                    binding: 0,
                    resource: wgpu::BindingResource::TextureView(&img.inner.views[plane]),
                },
                wgpu::BindGroupEntry {
                    binding: 1,
                    resource: uniform.as_entire_binding(),
                },
                wgpu::BindGroupEntry {
                    binding: 2,
                    resource: storage.as_entire_binding(),
                },
            ],
        });
        let mut enc = self.device.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            pass.set_pipeline(&pipe.pipeline);
            pass.set_bind_group(0, &bind, &[]);
            pass.dispatch_workgroups(x.count.div_ceil(8), y.count.div_ceil(8), 1);
        }
        enc.copy_buffer_to_buffer(&storage, 0, &readback, 0, bytes);
        let sub = self.submit(&mut st, enc.finish());
        drop(st);
        self.map_read(&[&readback], (sub.id, &sub.index))?;
        {
            let view = readback
                .slice(..)
                .get_mapped_range()
                .map_err(|e| GpuError::Backend(format!("readback range: {e}")))?;
            sink(&view[..bytes as usize]);
        }
        readback.unmap();
        let mut st = self.state.lock_or_recover();
        st.pool.give_buffer(skey, storage);
        st.pool.give_buffer(rkey, readback);
        drop(st);
        self.check_errors()
    }
}
