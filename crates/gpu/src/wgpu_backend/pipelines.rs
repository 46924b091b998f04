//! Shader modules, bind group and pipeline layouts, samplers, the uniform
//! block shared with the shaders, and the render/compute pipelines (created
//! on first use, cached in the backend state).

use std::num::NonZeroU64;

use bytemuck::{Pod, Zeroable};
use wgpu::util::DeviceExt;

use super::{align_up, State, WgpuBackend};
use crate::PixelFormat;

/// Uniforms of the source-sampling shaders; mirrors `Params` in common.wgsl.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub(super) struct Params {
    pub dst_rect: [f32; 4],
    pub map_m: [f32; 4],
    pub map_b: [f32; 4],
    pub crop: [f32; 4],
    pub misc: [f32; 4],
    pub rot: [f32; 4],
    pub target_size: [f32; 4],
    pub modes: [u32; 4],
}

/// One instance of the marker pipeline.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub(super) struct MarkerInstance {
    pub centre_size: [f32; 3],
    pub shape: u32,
    pub rgba: [u8; 4],
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

/// Render target byte order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Target {
    Rgba,
    Bgra,
}

impl Target {
    pub(super) fn of(format: PixelFormat) -> Self {
        if format == PixelFormat::Bgra8 {
            Target::Bgra
        } else {
            Target::Rgba
        }
    }

    pub(super) fn texture_format(self) -> wgpu::TextureFormat {
        match self {
            Target::Rgba => wgpu::TextureFormat::Rgba8Unorm,
            Target::Bgra => wgpu::TextureFormat::Bgra8Unorm,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum PipeKey {
    Layer {
        target: Target,
        blend: bool,
        mode: u32,
        exact: bool,
        ident: bool,
    },
    Equirect {
        target: Target,
        mode: u32,
    },
    Markers(Target),
    /// Two full-screen layers in one pass (see `shaders/fused.wgsl`).
    Fused {
        target: Target,
        mode: u32,
        exact: bool,
        ident: bool,
        mode2: u32,
        exact2: bool,
        ident2: bool,
        blend2: bool,
    },
}

/// Values of the shader's pipeline-overridable constants.
fn src_constants(mode: u32, exact: bool) -> Vec<(&'static str, f64)> {
    vec![
        ("SRC_MODE", mode as f64),
        ("LUMA_EXACT", if exact { 1.0 } else { 0.0 }),
    ]
}

/// Override constants of a [`PipeKey::Fused`] pipeline (render or compute).
fn fused_constants(key: PipeKey) -> Vec<(&'static str, f64)> {
    let PipeKey::Fused {
        mode,
        exact,
        ident,
        mode2,
        exact2,
        ident2,
        blend2,
        ..
    } = key
    else {
        return Vec::new();
    };
    let flag = |b: bool| if b { 1.0 } else { 0.0 };
    let mut c = src_constants(mode, exact);
    c.push(("IDENT", flag(ident)));
    c.push(("SRC_MODE2", mode2 as f64));
    c.push(("LUMA_EXACT2", flag(exact2)));
    c.push(("IDENT2", flag(ident2)));
    c.push(("BLEND2", flag(blend2)));
    c
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
        sample_type: wgpu::TextureSampleType::Float { filterable: true },
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

const COMMON_WGSL: &str = include_str!("../shaders/common.wgsl");
const RENDER_WGSL: &str = include_str!("../shaders/render.wgsl");
const CONVERT_WGSL: &str = include_str!("../shaders/convert.wgsl");
const MARKERS_WGSL: &str = include_str!("../shaders/markers.wgsl");
const FUSED_WGSL: &str = include_str!("../shaders/fused.wgsl");
const FUSED_CS_WGSL: &str = include_str!("../shaders/fused_cs.wgsl");

/// common.wgsl's sampling code for a second layer: every global and function name suffixed
/// by 2, its bindings in group 1 (the `Params` struct is shared).
fn second_layer_wgsl() -> String {
    let body = match COMMON_WGSL.find("@group(0)") {
        Some(i) => &COMMON_WGSL[i..],
        None => COMMON_WGSL,
    };
    let names = [
        "P",
        "t_luma",
        "t_c0",
        "t_c1",
        "s_lin",
        "clamp_axis",
        "yuv_to_rgb",
        "sample_tex",
        "sample_luma",
        "sample_src",
        "layer_coord",
        "equirect_coord",
        "sample_ident",
        "layer_color",
        "IDENT",
    ];
    let mut out = String::with_capacity(body.len() + 256);
    let mut word = String::new();
    let flush = |word: &mut String, out: &mut String| {
        out.push_str(word);
        if names.contains(&word.as_str()) {
            out.push('2');
        }
        word.clear();
    };
    for ch in body.chars() {
        if ch.is_ascii_alphanumeric() || ch == '_' {
            word.push(ch);
        } else {
            flush(&mut word, &mut out);
            out.push(ch);
        }
    }
    flush(&mut word, &mut out);
    let overrides = "override SRC_MODE2: u32 = 0u;\noverride LUMA_EXACT2: bool = false;\noverride IDENT2: bool = false;\n";
    format!(
        "{overrides}{}",
        out.replace("@group(0)", "@group(1)")
            .replace("SRC_MODE ", "SRC_MODE2 ")
            .replace("SRC_MODE)", "SRC_MODE2)")
            .replace("(LUMA_EXACT)", "(LUMA_EXACT2)")
    )
}

/// Everything pipeline-related created once with the device.
pub(super) struct Pipelines {
    pub uniform_stride: u64,
    render_module: wgpu::ShaderModule,
    fused_module: wgpu::ShaderModule,
    convert_module: wgpu::ShaderModule,
    marker_module: wgpu::ShaderModule,
    pub src_bgl: wgpu::BindGroupLayout,
    src_layout: wgpu::PipelineLayout,
    fused_layout: wgpu::PipelineLayout,
    /// The fused composition as a compute pass: both layers' groups and the
    /// storage output (group 2).
    fused_cs_layout: wgpu::PipelineLayout,
    /// The storage output of the compute composition (one RGBA8 view).
    pub out_bgl: wgpu::BindGroupLayout,
    pub convert_bgl: wgpu::BindGroupLayout,
    convert_layout: wgpu::PipelineLayout,
    pub marker_bgl: wgpu::BindGroupLayout,
    marker_layout: wgpu::PipelineLayout,
    /// Linear filtering, clamp to edge (composition, convert).
    pub clamp_sampler: wgpu::Sampler,
    /// Linear filtering, repeating horizontally (equirect).
    pub wrap_sampler: wgpu::Sampler,
    /// Bound for the planes a format does not have.
    pub dummy_view: wgpu::TextureView,
}

impl Pipelines {
    pub(super) fn new(device: &wgpu::Device, limits: &wgpu::Limits) -> Self {
        let params_size = std::mem::size_of::<Params>() as u64;
        let uniform_stride = align_up(
            params_size,
            limits.min_uniform_buffer_offset_alignment as u64,
        );
        let [render_module, fused_module, convert_module, marker_module] = shader_modules(device);
        let src_entries = [
            src_entry(0, uniform_binding(params_size)),
            src_entry(1, texture_binding()),
            src_entry(2, texture_binding()),
            src_entry(3, texture_binding()),
            src_entry(
                4,
                wgpu::BindingType::Sampler(wgpu::SamplerBindingType::Filtering),
            ),
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
        let fused_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some("virtsoc-fused"),
            bind_group_layouts: &[Some(&src_bgl), Some(&src_bgl)],
            immediate_size: 0,
        });
        let out_bgl = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some("virtsoc-out"),
            entries: &[wgpu::BindGroupLayoutEntry {
                binding: 0,
                visibility: wgpu::ShaderStages::COMPUTE,
                ty: wgpu::BindingType::StorageTexture {
                    access: wgpu::StorageTextureAccess::WriteOnly,
                    format: wgpu::TextureFormat::Rgba8Unorm,
                    view_dimension: wgpu::TextureViewDimension::D2,
                },
                count: None,
            }],
        });
        let fused_cs_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some("virtsoc-fused-cs"),
            bind_group_layouts: &[Some(&src_bgl), Some(&src_bgl), Some(&out_bgl)],
            immediate_size: 0,
        });
        let convert_layout = playout("virtsoc-convert", &convert_bgl);
        let marker_layout = playout("virtsoc-markers", &marker_bgl);
        let (clamp_sampler, wrap_sampler) = samplers(device);
        let dummy = super::pool::create_texture(
            device,
            super::pool::TexKey {
                format: wgpu::TextureFormat::R8Unorm,
                width: 1,
                height: 1,
                usage: wgpu::TextureUsages::TEXTURE_BINDING,
            },
            "virtsoc-dummy",
        );
        Pipelines {
            uniform_stride,
            render_module,
            fused_module,
            convert_module,
            marker_module,
            src_bgl,
            src_layout,
            fused_layout,
            fused_cs_layout,
            out_bgl,
            convert_bgl,
            convert_layout,
            marker_bgl,
            marker_layout,
            clamp_sampler,
            wrap_sampler,
            dummy_view: dummy.create_view(&Default::default()),
        }
    }
}

/// The shader modules: composition (render), fused composition (render and compute),
/// conversion (compute), markers.
fn shader_modules(device: &wgpu::Device) -> [wgpu::ShaderModule; 4] {
    let module = |label: &str, body: &str| {
        let src = format!("{COMMON_WGSL}\n{body}");
        device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some(label),
            source: wgpu::ShaderSource::Wgsl(src.into()),
        })
    };
    let render_module = module("virtsoc-render", RENDER_WGSL);
    let fused_module = module(
        "virtsoc-fused",
        &format!(
            "{RENDER_WGSL}\n{}\n{FUSED_WGSL}\n{FUSED_CS_WGSL}",
            second_layer_wgsl()
        ),
    );
    let convert_module = module("virtsoc-convert", CONVERT_WGSL);
    let marker_module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some("virtsoc-markers"),
        source: wgpu::ShaderSource::Wgsl(MARKERS_WGSL.into()),
    });
    [render_module, fused_module, convert_module, marker_module]
}

/// The linear samplers: clamped on both axes, and repeating horizontally (equirect).
fn samplers(device: &wgpu::Device) -> (wgpu::Sampler, wgpu::Sampler) {
    let sampler = |label: &str, u: wgpu::AddressMode| {
        device.create_sampler(&wgpu::SamplerDescriptor {
            label: Some(label),
            address_mode_u: u,
            address_mode_v: wgpu::AddressMode::ClampToEdge,
            address_mode_w: wgpu::AddressMode::ClampToEdge,
            mag_filter: wgpu::FilterMode::Linear,
            min_filter: wgpu::FilterMode::Linear,
            ..Default::default()
        })
    };
    let clamp_sampler = sampler("virtsoc-clamp", wgpu::AddressMode::ClampToEdge);
    let wrap_sampler = sampler("virtsoc-wrap", wgpu::AddressMode::Repeat);
    (clamp_sampler, wrap_sampler)
}

impl WgpuBackend {
    pub(super) fn render_pipeline(&self, st: &mut State, key: PipeKey) -> wgpu::RenderPipeline {
        if let Some(p) = st.render.get(&key) {
            return p.clone();
        }
        let pp = &self.pipes;
        let no_buffers: Vec<Option<wgpu::VertexBufferLayout>> = vec![];
        let (target, blend, module, vs, fs, layout, buffers, constants) = match key {
            PipeKey::Layer {
                target,
                blend,
                mode,
                exact,
                ident,
            } => {
                let mut c = src_constants(mode, exact);
                c.push(("IDENT", if ident { 1.0 } else { 0.0 }));
                (
                    target,
                    blend,
                    &pp.render_module,
                    "vs_rect",
                    "fs_layer",
                    &pp.src_layout,
                    no_buffers,
                    c,
                )
            }
            PipeKey::Equirect { target, mode } => (
                target,
                false,
                &pp.render_module,
                "vs_rect",
                "fs_equirect",
                &pp.src_layout,
                no_buffers,
                src_constants(mode, false),
            ),
            PipeKey::Fused { target, .. } => (
                target,
                false,
                &pp.fused_module,
                "vs_rect",
                "fs_fused",
                &pp.fused_layout,
                no_buffers,
                fused_constants(key),
            ),
            PipeKey::Markers(target) => (
                target,
                true,
                &pp.marker_module,
                "vs_marker",
                "fs_marker",
                &pp.marker_layout,
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

    /// The fused two-layer composition of `key` (a [`PipeKey::Fused`] with an
    /// RGBA target) as a compute pipeline (`cs_fused`).
    pub(super) fn fused_compute_pipeline(
        &self,
        st: &mut State,
        key: PipeKey,
    ) -> wgpu::ComputePipeline {
        if let Some(p) = st.compute.get(&key) {
            return p.clone();
        }
        let constants = fused_constants(key);
        let p = self
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some("virtsoc-fused-cs"),
                layout: Some(&self.pipes.fused_cs_layout),
                module: &self.pipes.fused_module,
                entry_point: Some("cs_fused"),
                compilation_options: wgpu::PipelineCompilationOptions {
                    constants: &constants,
                    ..Default::default()
                },
                cache: None,
            });
        st.compute.insert(key, p.clone());
        p
    }

    pub(super) fn convert_pipeline(
        &self,
        st: &mut State,
        mode: u32,
        exact: bool,
    ) -> wgpu::ComputePipeline {
        if let Some(p) = st.convert.get(&(mode, exact)) {
            return p.clone();
        }
        let constants = src_constants(mode, exact);
        let p = self
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some("virtsoc-convert"),
                layout: Some(&self.pipes.convert_layout),
                module: &self.pipes.convert_module,
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

    /// A bind group of the source-sampling layout (`bgl`: render or convert)
    /// for the planes in `views`, uniforms at `offset` in `ubuf`.
    pub(super) fn src_bind_group(
        &self,
        bgl: &wgpu::BindGroupLayout,
        ubuf: &wgpu::Buffer,
        offset: u64,
        views: &[wgpu::TextureView; 3],
        sampler: &wgpu::Sampler,
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
                resource: wgpu::BindingResource::TextureView(&views[0]),
            },
            wgpu::BindGroupEntry {
                binding: 2,
                resource: wgpu::BindingResource::TextureView(&views[1]),
            },
            wgpu::BindGroupEntry {
                binding: 3,
                resource: wgpu::BindingResource::TextureView(&views[2]),
            },
            wgpu::BindGroupEntry {
                binding: 4,
                resource: wgpu::BindingResource::Sampler(sampler),
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

    /// One uniform buffer holding `params` at `uniform_stride` intervals.
    pub(super) fn uniform_buffer(&self, params: &[Params]) -> wgpu::Buffer {
        let stride = self.pipes.uniform_stride as usize;
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
}
