//! The four drawing operations on resident images (composition, equirect
//! projection, markers, conversion): validation, encoding and submission.
//! The `submit_*_images` methods are the asynchronous public API; the
//! `*_locked` encoders are shared with the byte API.

use virtsoc_sync::LockExt;
use wgpu::util::DeviceExt;

use super::image::GpuImage;
use super::pipelines::{MarkerInstance, Params, PipeKey, Target};
use super::pool::BufKey;
use super::{align_up, State, SubmissionId, Submitted, WgpuBackend};
use crate::cpu::{LayerMap, ViewParams};
use crate::{
    check_crop, check_dst_rect, check_markers, check_view, FrameLayout, GpuError, LayerOf, Marker,
    MarkerShape, PixelFormat, Rect, Result, Rotation, View, MAX_LAYERS,
};

/// One composition layer drawn from a resident image (its placement as in
/// [`Layer`](crate::Layer): [`LayerOf`]).
pub type ImageLayer<'a> = LayerOf<&'a GpuImage>;

impl<'a> ImageLayer<'a> {
    /// Byte layer `l` (crop, placement, rotation, alpha, blending) drawn from `image`, the
    /// resident copy of its source.
    pub fn of(l: &crate::Layer<'_>, image: &'a GpuImage) -> Self {
        l.drawn_from(image)
    }

    /// The whole image drawn into `dst_rect`, unrotated, opaque plane alpha,
    /// blending on.
    pub fn new(image: &'a GpuImage, dst_rect: Rect) -> Self {
        LayerOf::whole(image, &image.layout(), dst_rect)
    }
}

/// Whether `l` overwrites every pixel of a `dst`-sized destination whatever
/// it held (so the destination need not be loaded): it covers the whole
/// destination, and it either replaces (no blending) or is opaque (plane
/// alpha 1 and a YUV source, which has no alpha).
pub(super) fn covers_opaque(l: &ImageLayer<'_>, dst: &FrameLayout) -> bool {
    covers(l, dst) && (!l.blend || (l.alpha == 1.0 && l.src.layout().format.is_yuv()))
}

/// Whether `l` maps a `dst`-sized destination 1:1 onto the whole of its source: same
/// size, placed at the origin, not rotated, the crop the whole source (the shaders'
/// `IDENT`: one fetch per pixel, no coordinate mapping or crop clamping).
fn is_identity(l: &ImageLayer<'_>, dst: &FrameLayout) -> bool {
    let sl = l.src.layout();
    let full = Rect::full(dst.width, dst.height);
    l.rotation == Rotation::R0
        && l.dst_rect == full
        && l.crop == full
        && sl.width == dst.width
        && sl.height == dst.height
}

/// Whether `l`'s destination rectangle covers the whole destination.
fn covers(l: &ImageLayer<'_>, dst: &FrameLayout) -> bool {
    let r = l.dst_rect;
    r.x <= 0
        && r.y <= 0
        && r.x as i64 + r.width as i64 >= dst.width as i64
        && r.y as i64 + r.height as i64 >= dst.height as i64
}

fn rgb_dst(op: &'static str, dst: &GpuImage) -> Result<()> {
    if !dst.is_rgb() {
        return Err(GpuError::UnsupportedFormat {
            op,
            role: "destination",
            format: dst.layout().format,
        });
    }
    Ok(())
}

fn not_dst(src: &GpuImage, dst: &GpuImage) -> Result<()> {
    if src.id() == dst.id() {
        return Err(GpuError::InvalidParameter(format!(
            "image {} is both a source and the destination",
            dst.id()
        )));
    }
    Ok(())
}

fn layer_params(l: &ImageLayer<'_>, dst: &FrameLayout) -> Params {
    let r = l.dst_rect;
    let c = l.crop;
    let sl = l.src.layout();
    let map = LayerMap::new(r, c, l.rotation);
    Params {
        dst_rect: [r.x as f32, r.y as f32, r.width as f32, r.height as f32],
        map_m: map.m,
        map_b: [map.b[0], map.b[1], 0.0, 0.0],
        crop: [c.x as f32, c.y as f32, c.width as f32, c.height as f32],
        misc: [sl.width as f32, sl.height as f32, l.alpha, 0.0],
        rot: [1.0, 0.0, 1.0, 0.0],
        target_size: [dst.width as f32, dst.height as f32, 0.0, 0.0],
        modes: [0; 4],
    }
}

fn color(c: [u8; 4]) -> wgpu::Color {
    wgpu::Color {
        r: c[0] as f64 / 255.0,
        g: c[1] as f64 / 255.0,
        b: c[2] as f64 / 255.0,
        a: c[3] as f64 / 255.0,
    }
}

impl WgpuBackend {
    pub(super) fn check_image_layers(
        &self,
        layers: &[ImageLayer<'_>],
        dst: &GpuImage,
    ) -> Result<()> {
        self.check_owner(dst)?;
        rgb_dst("composite", dst)?;
        if layers.len() > MAX_LAYERS {
            return Err(GpuError::TooMany {
                what: "layers",
                count: layers.len(),
                max: MAX_LAYERS,
            });
        }
        for l in layers {
            self.check_owner(l.src)?;
            not_dst(l.src, dst)?;
            check_crop(l.crop, &l.src.layout())?;
            check_dst_rect(l.dst_rect)?;
            if !(l.alpha.is_finite() && (0.0..=1.0).contains(&l.alpha)) {
                return Err(GpuError::InvalidParameter(format!(
                    "layer alpha {} outside [0, 1]",
                    l.alpha
                )));
            }
        }
        Ok(())
    }

    /// Draws `layers` in order over the contents of `dst` (RGBA8/BGRA8) and
    /// submits, returning at once. Validation as for
    /// [`GpuBackend::composite`](crate::GpuBackend::composite).
    pub fn submit_composite_images(
        &self,
        layers: &[ImageLayer<'_>],
        dst: &GpuImage,
    ) -> Result<SubmissionId> {
        self.check_image_layers(layers, dst)?;
        let mut st = self.state.lock_or_recover();
        let sub = self.composite_locked(&mut st, layers, dst, None, None);
        drop(st);
        self.check_errors()?;
        Ok(sub.id)
    }

    /// [`submit_composite_images`](Self::submit_composite_images) limited to the `damage`
    /// rectangle of `dst`, over its current contents (a render pass scissored to it; pixels
    /// outside are neither loaded into the shaders nor written).
    pub fn submit_composite_images_damage(
        &self,
        layers: &[ImageLayer<'_>],
        dst: &GpuImage,
        damage: Rect,
    ) -> Result<SubmissionId> {
        self.check_image_layers(layers, dst)?;
        let l = dst.layout();
        crate::check_damage(damage, l.width, l.height)?;
        let mut st = self.state.lock_or_recover();
        let sub = self.composite_locked(&mut st, layers, dst, None, Some(damage));
        drop(st);
        self.check_errors()?;
        Ok(sub.id)
    }

    /// Renders a rectilinear view of the equirectangular `src` into the whole
    /// of `dst` (RGBA8/BGRA8) and submits, returning at once.
    pub fn submit_project_images(
        &self,
        src: &GpuImage,
        view: &View,
        dst: &GpuImage,
    ) -> Result<SubmissionId> {
        self.check_owner(src)?;
        self.check_owner(dst)?;
        rgb_dst("project_equirect", dst)?;
        not_dst(src, dst)?;
        check_view(view)?;
        let mut st = self.state.lock_or_recover();
        let sub = self.project_locked(&mut st, src, view, dst);
        drop(st);
        self.check_errors()?;
        Ok(sub.id)
    }

    /// Blends `markers`, in order, over the existing contents of `dst`
    /// (RGBA8/BGRA8) and submits, returning at once.
    pub fn submit_markers_image(&self, markers: &[Marker], dst: &GpuImage) -> Result<SubmissionId> {
        self.check_owner(dst)?;
        rgb_dst("draw_markers", dst)?;
        check_markers(markers)?;
        let mut st = self.state.lock_or_recover();
        let sub = self.markers_locked(&mut st, markers, dst);
        drop(st);
        self.check_errors()?;
        Ok(sub.id)
    }

    /// Converts and scales the whole of `src` (any format) into the whole of
    /// `dst` (RGBA8/BGRA8) with a compute shader (the ISP path) and submits,
    /// returning at once.
    pub fn submit_convert_images(&self, src: &GpuImage, dst: &GpuImage) -> Result<SubmissionId> {
        self.check_owner(src)?;
        self.check_owner(dst)?;
        rgb_dst("convert", dst)?;
        not_dst(src, dst)?;
        let mut st = self.state.lock_or_recover();
        let sub = self.convert_locked(&mut st, src, dst);
        drop(st);
        self.check_errors()?;
        Ok(sub.id)
    }

    /// Encodes and submits a composition (validated). `init`: the colour the
    /// destination starts with, or `None` to keep its contents. When the first
    /// layer overwrites everything, the destination is neither loaded nor
    /// cleared to `init` (a cheap clear instead). `damage`: only that rectangle
    /// (validated) is drawn, over the destination's contents.
    pub(super) fn composite_locked(
        &self,
        st: &mut State,
        layers: &[ImageLayer<'_>],
        dst: &GpuImage,
        init: Option<[u8; 4]>,
        damage: Option<Rect>,
    ) -> Submitted {
        let dl = dst.layout();
        let target = Target::of(dl.format);
        let params: Vec<Params> = layers.iter().map(|l| layer_params(l, &dl)).collect();
        let ubuf = self.uniform_buffer(&params);
        let groups: Vec<wgpu::BindGroup> = layers
            .iter()
            .enumerate()
            .map(|(i, l)| {
                self.src_bind_group(
                    &self.pipes.src_bgl,
                    &ubuf,
                    i as u64 * self.pipes.uniform_stride,
                    &l.src.inner.views,
                    &self.pipes.clamp_sampler,
                    None,
                )
            })
            .collect();
        let exact = |l: &ImageLayer<'_>| LayerMap::new(l.dst_rect, l.crop, l.rotation).is_exact();
        let ident = |l: &ImageLayer<'_>| is_identity(l, &dl);
        // Two full-screen layers at the bottom (a video under a UI, Android's usual GPU
        // fallback) are drawn in one pass: the target is written once, not twice.
        let fused = layers.len() >= 2
            && covers_opaque(&layers[0], &dl)
            && covers(&layers[1], &dl)
            && self.fuse;
        let mut draws: Vec<(wgpu::RenderPipeline, Vec<&wgpu::BindGroup>)> = Vec::new();
        let mut encoder = self.device.create_command_encoder(&Default::default());
        let mut rest = 0;
        // The bottom pair already wrote the whole target: later layers load it.
        let mut loaded = false;
        if fused {
            let (a, b) = (&layers[0], &layers[1]);
            let key = PipeKey::Fused {
                target,
                mode: a.src.inner.mode,
                exact: exact(a),
                ident: ident(a),
                mode2: b.src.inner.mode,
                exact2: exact(b),
                ident2: ident(b),
                blend2: b.blend,
            };
            rest = 2;
            if target == Target::Rgba && self.fuse_compute && damage.is_none() {
                // A compute pass writes every pixel of the target once: no rasterizer,
                // no colour attachment to clear or blend into.
                let pipe = self.fused_compute_pipeline(st, key);
                let out = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
                    label: Some("virtsoc-out"),
                    layout: &self.pipes.out_bgl,
                    entries: &[wgpu::BindGroupEntry {
                        binding: 0,
                        resource: wgpu::BindingResource::TextureView(&dst.inner.views[0]),
                    }],
                });
                let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: Some("virtsoc-composite-cs"),
                    timestamp_writes: None,
                });
                pass.set_pipeline(&pipe);
                pass.set_bind_group(0, &groups[0], &[]);
                pass.set_bind_group(1, &groups[1], &[]);
                pass.set_bind_group(2, &out, &[]);
                pass.dispatch_workgroups(dl.width.div_ceil(32), dl.height.div_ceil(8), 1);
                loaded = true;
            } else {
                draws.push((self.render_pipeline(st, key), vec![&groups[0], &groups[1]]));
            }
        }
        for (l, group) in layers.iter().zip(&groups).skip(rest) {
            let key = PipeKey::Layer {
                target,
                blend: l.blend,
                mode: l.src.inner.mode,
                exact: exact(l),
                ident: ident(l),
            };
            draws.push((self.render_pipeline(st, key), vec![group]));
        }
        let load = if loaded || damage.is_some() {
            wgpu::LoadOp::Load
        } else if layers.first().is_some_and(|l| covers_opaque(l, &dl)) {
            wgpu::LoadOp::Clear(wgpu::Color::TRANSPARENT)
        } else {
            match init {
                Some(c) => wgpu::LoadOp::Clear(color(c)),
                None => wgpu::LoadOp::Load,
            }
        };
        if !(loaded && draws.is_empty()) {
            let mut pass = begin_pass(&mut encoder, &dst.inner.views[0], load, "virtsoc-composite");
            if let Some(d) = damage {
                pass.set_scissor_rect(d.x as u32, d.y as u32, d.width, d.height);
            }
            for (pipe, groups) in &draws {
                pass.set_pipeline(pipe);
                for (i, group) in groups.iter().enumerate() {
                    pass.set_bind_group(i as u32, *group, &[]);
                }
                pass.draw(0..6, 0..1);
            }
        }
        self.submit(st, encoder.finish())
    }

    pub(super) fn project_locked(
        &self,
        st: &mut State,
        src: &GpuImage,
        view: &View,
        dst: &GpuImage,
    ) -> Submitted {
        let (sl, dl) = (src.layout(), dst.layout());
        let vp = ViewParams::new(view);
        let p = Params {
            dst_rect: [0.0, 0.0, dl.width as f32, dl.height as f32],
            map_m: [0.0; 4],
            map_b: [0.0; 4],
            crop: [0.0, 0.0, sl.width as f32, sl.height as f32],
            misc: [sl.width as f32, sl.height as f32, 1.0, vp.tan_half],
            rot: [vp.cos_yaw, vp.sin_yaw, vp.cos_pitch, vp.sin_pitch],
            target_size: [dl.width as f32, dl.height as f32, 0.0, 0.0],
            modes: [0; 4],
        };
        let ubuf = self.uniform_buffer(&[p]);
        let group = self.src_bind_group(
            &self.pipes.src_bgl,
            &ubuf,
            0,
            &src.inner.views,
            &self.pipes.wrap_sampler,
            None,
        );
        let key = PipeKey::Equirect {
            target: Target::of(dl.format),
            mode: src.inner.mode,
        };
        let pipe = self.render_pipeline(st, key);
        let mut encoder = self.device.create_command_encoder(&Default::default());
        {
            let load = wgpu::LoadOp::Clear(wgpu::Color::BLACK);
            let mut pass = begin_pass(&mut encoder, &dst.inner.views[0], load, "virtsoc-equirect");
            pass.set_pipeline(&pipe);
            pass.set_bind_group(0, &group, &[]);
            pass.draw(0..6, 0..1);
        }
        self.submit(st, encoder.finish())
    }

    pub(super) fn markers_locked(
        &self,
        st: &mut State,
        markers: &[Marker],
        dst: &GpuImage,
    ) -> Submitted {
        let dl = dst.layout();
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
                contents: bytemuck::cast_slice(&[dl.width as f32, dl.height as f32, 0.0, 0.0]),
                usage: wgpu::BufferUsages::UNIFORM,
            });
        let group = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("virtsoc-markers"),
            layout: &self.pipes.marker_bgl,
            entries: &[wgpu::BindGroupEntry {
                binding: 0,
                resource: ubuf.as_entire_binding(),
            }],
        });
        let pipe = self.render_pipeline(st, PipeKey::Markers(Target::of(dl.format)));
        let mut encoder = self.device.create_command_encoder(&Default::default());
        {
            let load = wgpu::LoadOp::Load;
            let mut pass = begin_pass(&mut encoder, &dst.inner.views[0], load, "virtsoc-markers");
            if let Some(ibuf) = &ibuf {
                pass.set_pipeline(&pipe);
                pass.set_bind_group(0, &group, &[]);
                pass.set_vertex_buffer(0, ibuf.slice(..));
                pass.draw(0..6, 0..instances.len() as u32);
            }
        }
        self.submit(st, encoder.finish())
    }

    /// Compute conversion into a storage buffer with 256-byte aligned rows,
    /// copied into `dst` in the same submission.
    pub(super) fn convert_locked(
        &self,
        st: &mut State,
        src: &GpuImage,
        dst: &GpuImage,
    ) -> Submitted {
        let (sl, dl) = (src.layout(), dst.layout());
        let full = Rect::full(dl.width, dl.height);
        let layer = ImageLayer::new(src, full).with_blend(false);
        let mut p = layer_params(&layer, &dl);
        let exact = LayerMap::new(full, layer.crop, Rotation::R0).is_exact();
        let bpr = align_up(
            dl.width as u64 * 4,
            wgpu::COPY_BYTES_PER_ROW_ALIGNMENT as u64,
        );
        p.modes[3] = (dl.format == PixelFormat::Bgra8) as u32;
        p.target_size[2] = (bpr / 4) as f32;
        debug_assert_eq!(p.misc[0], sl.width as f32);
        let ubuf = self.uniform_buffer(&[p]);
        let skey = BufKey {
            size: bpr * dl.height as u64,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
        };
        let storage = st.pool.take_buffer(&self.device, skey);
        let group = self.src_bind_group(
            &self.pipes.convert_bgl,
            &ubuf,
            0,
            &src.inner.views,
            &self.pipes.clamp_sampler,
            Some(&storage),
        );
        let pipe = self.convert_pipeline(st, src.inner.mode, exact);
        let mut encoder = self.device.create_command_encoder(&Default::default());
        {
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("virtsoc-convert"),
                timestamp_writes: None,
            });
            pass.set_pipeline(&pipe);
            pass.set_bind_group(0, &group, &[]);
            pass.dispatch_workgroups(dl.width.div_ceil(8), dl.height.div_ceil(8), 1);
        }
        encoder.copy_buffer_to_texture(
            wgpu::TexelCopyBufferInfo {
                buffer: &storage,
                layout: wgpu::TexelCopyBufferLayout {
                    offset: 0,
                    bytes_per_row: Some(bpr as u32),
                    rows_per_image: Some(dl.height),
                },
            },
            wgpu::TexelCopyTextureInfo {
                texture: dst.target(),
                mip_level: 0,
                origin: wgpu::Origin3d::ZERO,
                aspect: wgpu::TextureAspect::All,
            },
            wgpu::Extent3d {
                width: dl.width,
                height: dl.height,
                depth_or_array_layers: 1,
            },
        );
        let sub = self.submit(st, encoder.finish());
        st.pool.give_buffer(skey, storage);
        sub
    }
}

/// A render pass onto `view` with `load`, storing the result.
pub(super) fn begin_pass<'e>(
    encoder: &'e mut wgpu::CommandEncoder,
    view: &wgpu::TextureView,
    load: wgpu::LoadOp<wgpu::Color>,
    label: &str,
) -> wgpu::RenderPass<'e> {
    encoder.begin_render_pass(&wgpu::RenderPassDescriptor {
        label: Some(label),
        color_attachments: &[Some(wgpu::RenderPassColorAttachment {
            view,
            depth_slice: None,
            resolve_target: None,
            ops: wgpu::Operations {
                load,
                store: wgpu::StoreOp::Store,
            },
        })],
        ..Default::default()
    })
}
