//! The byte API ([`GpuBackend`] and `submit_*`/[`WgpuBackend::finish`] on
//! [`FrameRef`]/[`FrameMut`]), implemented on the image path: sources go into
//! temporary pooled images (`write_image`), the operation runs image to image
//! (the same encoders as `submit_*_images`), and the destination image is
//! copied into a readback buffer in a second submission.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use virtsoc_sync::LockExt;

use super::image::GpuImage;
use super::ops::{covers_opaque, ImageLayer};
use super::pool::BufKey;
use super::{align_up, State, SubmissionId, Submitted, WgpuBackend, MAP_LIMIT};
use crate::{
    check_layers, check_markers, check_rgb_dst, check_view, Clear, FrameLayout, FrameMut, FrameRef,
    GpuBackend, GpuError, GpuStats, Layer, Marker, Result, View,
};

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
    /// The work's submission (the copy into the buffer is `id`).
    work: (SubmissionId, wgpu::SubmissionIndex),
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

impl WgpuBackend {
    /// Temporary images for `layouts`, from the pool.
    fn temp_images(&self, layouts: &[FrameLayout]) -> Result<Vec<GpuImage>> {
        let mut st = self.state.lock_or_recover();
        layouts
            .iter()
            .map(|l| self.temp_image(&mut st, *l))
            .collect()
    }

    /// Uploads a whole frame into `img`.
    fn upload_frame(&self, img: &GpuImage, src: FrameRef<'_>) -> Result<()> {
        self.write_image(img, 0, &src.data[..img.bytes()])
    }

    /// Submits the copy of `dst` into a readback buffer after `work`, and gives
    /// the temporary images back to the pool.
    fn finish_submit(
        &self,
        st: &mut State,
        work: Submitted,
        dst: GpuImage,
        srcs: Vec<GpuImage>,
        upload: Duration,
    ) -> Result<PendingFrame> {
        let layout = dst.layout();
        let bpr = align_up(
            layout.width as u64 * 4,
            wgpu::COPY_BYTES_PER_ROW_ALIGNMENT as u64,
        );
        let buf_key = BufKey::readback(bpr * layout.height as u64);
        let buffer = st.pool.take_buffer(&self.device, buf_key);
        let mut enc = self.device.create_command_encoder(&Default::default());
        enc.copy_texture_to_buffer(
            wgpu::TexelCopyTextureInfo {
                texture: dst.target(),
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
        Self::recycle_image(st, dst);
        for s in srcs {
            Self::recycle_image(st, s);
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
            work: (work.id, work.index),
            copy: copy.index,
            work_done: work.done,
            copy_done: copy.done,
        })
    }

    /// Submits a composition. `dst` gives the destination layout and, with
    /// [`Clear::Keep`], its current contents (otherwise its bytes are not read;
    /// nor are they when the first layer overwrites the whole destination).
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
        let mut layouts = vec![dst.layout];
        layouts.extend(layers.iter().map(|l| l.src.layout));
        let mut imgs = self.temp_images(&layouts)?;
        let dst_img = imgs.remove(0);
        for (l, img) in layers.iter().zip(&imgs) {
            self.upload_frame(img, l.src)?;
        }
        let ilayers: Vec<ImageLayer<'_>> = layers
            .iter()
            .zip(&imgs)
            .map(|(l, img)| ImageLayer::of(l, img))
            .collect();
        let covered = ilayers
            .first()
            .is_some_and(|l| covers_opaque(l, &dst.layout));
        if clear == Clear::Keep && !covered {
            self.upload_frame(&dst_img, dst)?;
        }
        let upload = t0.elapsed();
        let mut st = self.state.lock_or_recover();
        let work = self.composite_locked(&mut st, &ilayers, &dst_img, clear.color(), None);
        drop(ilayers);
        self.finish_submit(&mut st, work, dst_img, imgs, upload)
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
        let mut imgs = self.temp_images(&[dst, src.layout])?;
        let dst_img = imgs.remove(0);
        self.upload_frame(&imgs[0], src)?;
        let upload = t0.elapsed();
        let mut st = self.state.lock_or_recover();
        let work = self.project_locked(&mut st, &imgs[0], &view, &dst_img);
        self.finish_submit(&mut st, work, dst_img, imgs, upload)
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
        let dst_img = self.temp_images(&[dst.layout])?.remove(0);
        self.upload_frame(&dst_img, dst)?;
        let upload = t0.elapsed();
        let mut st = self.state.lock_or_recover();
        let work = self.markers_locked(&mut st, markers, &dst_img);
        self.finish_submit(&mut st, work, dst_img, vec![], upload)
    }

    /// Submits a conversion (compute shader) of the whole `src` into a
    /// destination of `dst` layout.
    pub fn submit_convert(&self, src: FrameRef<'_>, dst: FrameLayout) -> Result<PendingFrame> {
        let t0 = Instant::now();
        check_rgb_dst("convert", &dst, usize::MAX)?;
        src.layout.check_buffer(src.data.len())?;
        self.check_size(&dst)?;
        self.check_size(&src.layout)?;
        let mut imgs = self.temp_images(&[dst, src.layout])?;
        let dst_img = imgs.remove(0);
        self.upload_frame(&imgs[0], src)?;
        let upload = t0.elapsed();
        let mut st = self.state.lock_or_recover();
        let work = self.convert_locked(&mut st, &imgs[0], &dst_img);
        self.finish_submit(&mut st, work, dst_img, imgs, upload)
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
        self.wait_done(pending.work.0, Some(&pending.work.1), MAP_LIMIT)?;
        self.map_read(&[&pending.buffer], (pending.id, &pending.copy))?;
        let mapped_at = Instant::now();
        let work_done = pending.work_done.lock_or_recover().unwrap_or(mapped_at);
        let copy_done = pending.copy_done.lock_or_recover().unwrap_or(mapped_at);
        {
            let view = pending
                .buffer
                .slice(..)
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
        self.state
            .lock_or_recover()
            .pool
            .give_buffer(pending.buf_key, pending.buffer);
        self.check_errors()?;
        Ok(GpuStats {
            upload: pending.upload,
            execute,
            readback,
        })
    }
}

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
