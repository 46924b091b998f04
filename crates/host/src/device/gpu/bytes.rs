//! The GPU device on host-memory replicas (the `cpu` and `null` backends, or any backend
//! without device memory): each source is copied out of its replica (one region at a time,
//! counted on the guest's ledger), the backend draws into the locked destination replica.

use std::collections::BTreeMap;
use std::time::Instant;

use virtsoc_devapi::gpu::{CompositeReply, ConvertReply, MarkersReply, ProjectReply};
use virtsoc_devapi::{MarkerRecord, MARKER_RECORD};
use virtsoc_gpu::{FrameLayout, FrameMut, FrameRef, GpuStats, Layer, MAX_LAYERS, MAX_MARKERS};
use virtsoc_proto::Status;
use virtsoc_svm::RegionId;

use super::{marker_of, rgb_layout, view_of, Gpu};
use crate::device::layers::{crop_inside, layout_of, read_layers, read_records};
use crate::device::{DeviceCtx, DeviceResult};
use crate::status::status_of;

impl Gpu {
    pub(super) fn composite(
        &self,
        cx: &DeviceCtx<'_>,
        layers: RegionId,
        count: u64,
        dst: RegionId,
        damage: u64,
    ) -> DeviceResult {
        let specs = read_layers(cx, layers, count, MAX_LAYERS)?;
        let dst_layout = rgb_layout(cx, dst)?;
        let damage = super::damage_rect(damage, dst_layout.width, dst_layout.height)?;
        let full = virtsoc_gpu::Rect::full(dst_layout.width, dst_layout.height);
        self.check_cost_in(&specs, damage.unwrap_or(full))?;
        // Copy each distinct source out of its replica, one region lock at a time.
        let mut sources: BTreeMap<RegionId, (FrameLayout, Vec<u8>)> = BTreeMap::new();
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
                src: FrameRef {
                    layout: *layout,
                    data: bytes,
                },
                crop: s.crop,
                dst_rect: s.dst,
                rotation: s.rotation,
                alpha: s.alpha,
                blend: s.blend,
            });
        }
        let stats = with_dst(cx, dst, &dst_layout, |d| {
            self.run("composite", |b| match damage {
                Some(r) => b.composite_damage(&layers, d, r),
                None => b.composite(&layers, d),
            })
        })?;
        Ok(CompositeReply {
            gpu_us: micros(&stats),
        }
        .to_values())
    }

    pub(super) fn project(
        &self,
        cx: &DeviceCtx<'_>,
        src: RegionId,
        dst: RegionId,
        angles: [u64; 3],
    ) -> DeviceResult {
        let view = view_of(angles);
        let dst_layout = rgb_layout(cx, dst)?;
        let src_layout = layout_of(cx, src)?;
        let bytes = copy_out(cx, src, &src_layout)?;
        let stats = with_dst(cx, dst, &dst_layout, |d| {
            self.run("project", |b| {
                b.project_equirect(
                    FrameRef {
                        layout: src_layout,
                        data: &bytes,
                    },
                    view,
                    d,
                )
            })
        })?;
        Ok(ProjectReply {
            gpu_us: micros(&stats),
        }
        .to_values())
    }

    pub(super) fn markers(
        &self,
        cx: &DeviceCtx<'_>,
        markers: RegionId,
        count: u64,
        dst: RegionId,
    ) -> DeviceResult {
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

    pub(super) fn convert(&self, cx: &DeviceCtx<'_>, src: RegionId, dst: RegionId) -> DeviceResult {
        let dst_layout = rgb_layout(cx, dst)?;
        let src_layout = layout_of(cx, src)?;
        let bytes = copy_out(cx, src, &src_layout)?;
        let stats = with_dst(cx, dst, &dst_layout, |d| {
            self.convert_frame(
                FrameRef {
                    layout: src_layout,
                    data: &bytes,
                },
                d,
            )
        })?;
        Ok(ConvertReply {
            gpu_us: micros(&stats),
        }
        .to_values())
    }
}

/// Copies the frame bytes of region `id` out of this device's replica.
fn copy_out(
    cx: &DeviceCtx<'_>,
    id: RegionId,
    layout: &FrameLayout,
) -> std::result::Result<Vec<u8>, Status> {
    let n = layout.size_bytes().map_err(|e| status_of(&e))?;
    let t0 = Instant::now();
    let bytes = cx
        .with_region(id, |b| b.get(..n).map(<[u8]>::to_vec))?
        .ok_or(Status::OutOfRange)?;
    // A copy of frame bytes inside the device's memory: on the ledger.
    cx.svm
        .count_device_copy(cx.guest, cx.domain, n as u64, t0.elapsed());
    Ok(bytes)
}

/// Runs `f` on destination region `id` (locked alone) as a frame of `layout`.
fn with_dst(
    cx: &DeviceCtx<'_>,
    id: RegionId,
    layout: &FrameLayout,
    f: impl FnOnce(FrameMut<'_>) -> std::result::Result<GpuStats, Status>,
) -> std::result::Result<GpuStats, Status> {
    let n = layout.size_bytes().map_err(|e| status_of(&e))?;
    cx.with_region(id, |b| match b.get_mut(..n) {
        Some(d) => f(FrameMut {
            layout: *layout,
            data: d,
        }),
        None => Err(Status::OutOfRange),
    })?
}

fn micros(stats: &GpuStats) -> u64 {
    u64::try_from(stats.total().as_micros()).unwrap_or(u64::MAX)
}
