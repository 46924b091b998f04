//! Measurements on resident images: the floor (the fastest full-screen
//! NV12 -> RGBA pass this device can run, render and compute variants) and
//! the resident composition (NV12 video + RGBA UI), both timed from
//! submission to completion with no upload or readback.

use std::time::{Duration, Instant};
use virtsoc_sync::LockExt;

use super::image::GpuImage;
use super::ops::ImageLayer;
use super::WgpuBackend;
use crate::{pattern, FrameLayout, GpuError, PixelFormat, Rect, Result};

const FLOOR_WGSL: &str = include_str!("../shaders/floor.wgsl");

/// Runs measured (after one warm-up) by [`WgpuBackend::measure_floor`] and
/// [`WgpuBackend::measure_composite_resident`]; medians are reported.
pub const FLOOR_RUNS: usize = 7;

/// Result of [`WgpuBackend::measure_floor`]: medians of [`FLOOR_RUNS`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FloorTimings {
    /// Destination width in pixels.
    pub width: u32,
    /// Destination height in pixels.
    pub height: u32,
    /// One full-screen textured triangle in a render pass, hardware sampler.
    pub render: Duration,
    /// A compute pass, four pixels per invocation, storage texture output.
    pub compute: Duration,
    /// The smaller of the two.
    pub floor: Duration,
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

impl WgpuBackend {
    /// Submits `cmd` and waits for it; returns the time from submission to
    /// completion.
    fn time_submission(&self, cmd: wgpu::CommandBuffer) -> Result<Duration> {
        let t = Instant::now();
        let id = {
            let mut st = self.state.lock_or_recover();
            self.submit(&mut st, cmd).id
        };
        self.wait_submission(id)?;
        self.check_errors()?;
        Ok(t.elapsed())
    }

    /// One warm-up run of `f`, then the median of [`FLOOR_RUNS`] runs.
    fn median_of(&self, mut f: impl FnMut() -> Result<Duration>) -> Result<Duration> {
        f()?;
        let runs = (0..FLOOR_RUNS).map(|_| f()).collect::<Result<Vec<_>>>()?;
        Ok(median(runs))
    }

    /// Resident NV12 source and RGBA destination images of `width` x `height`.
    fn floor_images(&self, width: u32, height: u32) -> Result<(GpuImage, GpuImage)> {
        let video = pattern::nv12_gradient(width, height, 0)?;
        let src = self.create_image(video.layout)?;
        self.write_image(&src, 0, &video.data)?;
        let dst = self.create_image(FrameLayout::packed(PixelFormat::Rgba8, width, height)?)?;
        Ok((src, dst))
    }

    /// The fastest full-screen NV12 -> RGBA pass at `width` x `height` on this
    /// device, on resident images (no upload or readback): (a) one full-screen
    /// textured triangle in a render pass with the hardware sampler, (b) a
    /// compute pass doing four pixels per invocation. Medians of
    /// [`FLOOR_RUNS`] runs after a warm-up, submission to completion.
    pub fn measure_floor(&self, width: u32, height: u32) -> Result<FloorTimings> {
        let (src, dst) = self.floor_images(width, height)?;
        let module = self
            .device
            .create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some("virtsoc-floor"),
                source: wgpu::ShaderSource::Wgsl(FLOOR_WGSL.into()),
            });
        let constants = [("FW", width as f64), ("FH", height as f64)];
        let options = wgpu::PipelineCompilationOptions {
            constants: &constants,
            ..Default::default()
        };
        let render = self
            .device
            .create_render_pipeline(&wgpu::RenderPipelineDescriptor {
                label: Some("virtsoc-floor"),
                layout: None,
                vertex: wgpu::VertexState {
                    module: &module,
                    entry_point: Some("vs_floor"),
                    compilation_options: options.clone(),
                    buffers: &[],
                },
                primitive: Default::default(),
                depth_stencil: None,
                multisample: Default::default(),
                fragment: Some(wgpu::FragmentState {
                    module: &module,
                    entry_point: Some("fs_floor"),
                    compilation_options: options.clone(),
                    targets: &[Some(wgpu::ColorTargetState {
                        format: wgpu::TextureFormat::Rgba8Unorm,
                        blend: None,
                        write_mask: wgpu::ColorWrites::ALL,
                    })],
                }),
                multiview_mask: None,
                cache: None,
            });
        let compute = self
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some("virtsoc-floor"),
                layout: None,
                module: &module,
                entry_point: Some("cs_floor"),
                compilation_options: options,
                cache: None,
            });
        let views = &src.inner.views;
        let entry = |binding, resource| wgpu::BindGroupEntry { binding, resource };
        let sampled = [
            entry(0, wgpu::BindingResource::TextureView(&views[0])),
            entry(1, wgpu::BindingResource::TextureView(&views[1])),
            entry(2, wgpu::BindingResource::Sampler(&self.pipes.clamp_sampler)),
        ];
        let render_group = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("virtsoc-floor"),
            layout: &render.get_bind_group_layout(0),
            entries: &sampled,
        });
        let mut entries = sampled.to_vec();
        entries.push(entry(
            3,
            wgpu::BindingResource::TextureView(&dst.inner.views[0]),
        ));
        let compute_group = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("virtsoc-floor"),
            layout: &compute.get_bind_group_layout(0),
            entries: &entries,
        });
        self.check_errors()?;
        let render_time = self.median_of(|| {
            let mut enc = self.device.create_command_encoder(&Default::default());
            {
                let load = wgpu::LoadOp::Clear(wgpu::Color::TRANSPARENT);
                let mut pass =
                    super::ops::begin_pass(&mut enc, &dst.inner.views[0], load, "virtsoc-floor");
                pass.set_pipeline(&render);
                pass.set_bind_group(0, &render_group, &[]);
                pass.draw(0..3, 0..1);
            }
            self.time_submission(enc.finish())
        })?;
        let compute_time = self.median_of(|| {
            let mut enc = self.device.create_command_encoder(&Default::default());
            {
                let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: Some("virtsoc-floor"),
                    timestamp_writes: None,
                });
                pass.set_pipeline(&compute);
                pass.set_bind_group(0, &compute_group, &[]);
                pass.dispatch_workgroups(width.div_ceil(32), height.div_ceil(8), 1);
            }
            self.time_submission(enc.finish())
        })?;
        Ok(FloorTimings {
            width,
            height,
            render: render_time,
            compute: compute_time,
            floor: render_time.min(compute_time),
        })
    }

    /// Median time (after a warm-up; [`FLOOR_RUNS`] runs) of
    /// [`WgpuBackend::submit_composite_images`] to completion on resident
    /// images: a full-screen NV12 video layer (no blending) plus a full-screen
    /// RGBA UI layer blended on top, into an RGBA image of `width` x `height`.
    pub fn measure_composite_resident(&self, width: u32, height: u32) -> Result<Duration> {
        let (video, dst) = self.floor_images(width, height)?;
        let ui_frame = pattern::rgba_ui(width, height)?;
        let ui = self.create_image(ui_frame.layout)?;
        self.write_image(&ui, 0, &ui_frame.data)?;
        let full = Rect::full(width, height);
        let layers = [
            ImageLayer::new(&video, full).with_blend(false),
            ImageLayer::new(&ui, full),
        ];
        self.median_of(|| {
            let t = Instant::now();
            let id = self.submit_composite_images(&layers, &dst)?;
            self.wait_submission(id)?;
            let d = t.elapsed();
            if d.is_zero() {
                return Err(GpuError::Backend("zero composition time".into()));
            }
            Ok(d)
        })
    }
}
