//! Layer records (shared by the GPU's `composite` and the display's `present_layers`) and the
//! frame layout of a region, checked from guest-provided metadata and records.

use virtsoc_devapi::{LayerRecord, LAYER_RECORD};
use virtsoc_gpu::{FrameLayout, PixelFormat, Rect, Rotation, MAX_COORD};
use virtsoc_proto::Status;
use virtsoc_svm::RegionId;

use super::DeviceCtx;
use crate::status::status_of;

/// A layer record checked on its own (the crop is checked against its source later).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct LayerSpec {
    pub(crate) src: RegionId,
    pub(crate) crop: Rect,
    pub(crate) dst: Rect,
    pub(crate) rotation: Rotation,
    pub(crate) alpha: f32,
    pub(crate) blend: bool,
}

impl LayerSpec {
    pub(crate) fn parse(r: &LayerRecord) -> std::result::Result<Self, Status> {
        let rotation = match r.rotation {
            0 => Rotation::R0,
            90 => Rotation::R90,
            180 => Rotation::R180,
            270 => Rotation::R270,
            _ => return Err(Status::BadArgument),
        };
        if !(r.alpha.is_finite() && (0.0..=1.0).contains(&r.alpha)) {
            return Err(Status::BadArgument);
        }
        let [cx, cy, cw, ch] = r.crop;
        let crop_xy = (i32::try_from(cx), i32::try_from(cy));
        let (Ok(cx), Ok(cy)) = crop_xy else {
            return Err(Status::BadArgument);
        };
        if cw == 0 || ch == 0 {
            return Err(Status::BadArgument);
        }
        let [dx, dy] = r.dst_pos;
        let [dw, dh] = r.dst_size;
        let m = MAX_COORD as i64;
        let bad_dst = dw == 0
            || dh == 0
            || (dx as i64).abs() > m
            || (dy as i64).abs() > m
            || dw as i64 > m
            || dh as i64 > m;
        if bad_dst {
            return Err(Status::BadArgument);
        }
        Ok(LayerSpec {
            src: r.src,
            crop: Rect::new(cx, cy, cw, ch),
            dst: Rect::new(dx, dy, dw, dh),
            rotation,
            alpha: r.alpha,
            blend: r.blend,
        })
    }
}

/// Whether `crop` lies inside a frame of `layout`.
pub(crate) fn crop_inside(crop: Rect, layout: &FrameLayout) -> bool {
    crop.x >= 0
        && crop.y >= 0
        && crop.x as u64 + crop.width as u64 <= layout.width as u64
        && crop.y as u64 + crop.height as u64 <= layout.height as u64
}

/// Reads and checks `count` layer records from region `layers` (at most `max`).
pub(crate) fn read_layers(
    cx: &DeviceCtx<'_>,
    layers: RegionId,
    count: u64,
    max: usize,
) -> std::result::Result<Vec<LayerSpec>, Status> {
    let records = read_records(cx, layers, count, LAYER_RECORD)?;
    if count as usize > max {
        return Err(Status::BadArgument);
    }
    records
        .chunks_exact(LAYER_RECORD)
        .map(|b| LayerRecord::from_bytes(b).ok_or(Status::BadArgument))
        .map(|r| r.and_then(|r| LayerSpec::parse(&r)))
        .collect()
}

/// The frame layout of region `id` from its metadata, checked against the region size.
pub(crate) fn layout_of(
    cx: &DeviceCtx<'_>,
    id: RegionId,
) -> std::result::Result<FrameLayout, Status> {
    let meta = cx.meta(id)?;
    let layout = FrameLayout::with_stride(
        PixelFormat::try_from(meta.format)?,
        meta.width,
        meta.height,
        meta.stride,
    )
    .map_err(|e| status_of(&e))?;
    if layout.size() as u64 > meta.size {
        return Err(Status::OutOfRange);
    }
    Ok(layout)
}

/// Reads `count` records of `size` bytes from the start of region `id`.
pub(crate) fn read_records(
    cx: &DeviceCtx<'_>,
    id: RegionId,
    count: u64,
    size: usize,
) -> std::result::Result<Vec<u8>, Status> {
    let meta = cx.meta(id)?;
    let bytes = count
        .checked_mul(size as u64)
        .filter(|&n| n <= meta.size)
        .ok_or(Status::OutOfRange)?;
    if bytes == 0 {
        return Ok(Vec::new());
    }
    let n = usize::try_from(bytes).map_err(|_| Status::OutOfRange)?;
    cx.with_region(id, |b| b.get(..n).map(<[u8]>::to_vec))?
        .ok_or(Status::OutOfRange)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> LayerRecord {
        LayerRecord {
            src: RegionId(3),
            crop: [0, 0, 16, 8],
            dst_pos: [-4, 2],
            dst_size: [32, 16],
            rotation: 90,
            alpha: 0.5,
            blend: true,
        }
    }

    #[test]
    fn layer_records_are_validated() {
        let s = LayerSpec::parse(&record()).unwrap();
        assert_eq!(s.rotation, Rotation::R90);
        assert_eq!(s.crop, Rect::new(0, 0, 16, 8));
        assert_eq!(s.dst, Rect::new(-4, 2, 32, 16));
        let bad = |f: fn(&mut LayerRecord)| {
            let mut r = record();
            f(&mut r);
            LayerSpec::parse(&r)
        };
        assert_eq!(bad(|r| r.rotation = 45), Err(Status::BadArgument));
        assert_eq!(bad(|r| r.alpha = 1.5), Err(Status::BadArgument));
        assert_eq!(bad(|r| r.alpha = -0.1), Err(Status::BadArgument));
        assert_eq!(bad(|r| r.alpha = f32::NAN), Err(Status::BadArgument));
        assert_eq!(bad(|r| r.crop[2] = 0), Err(Status::BadArgument));
        assert_eq!(bad(|r| r.crop[0] = u32::MAX), Err(Status::BadArgument));
        assert_eq!(bad(|r| r.dst_size[1] = 0), Err(Status::BadArgument));
        assert_eq!(bad(|r| r.dst_pos[0] = i32::MIN), Err(Status::BadArgument));
        assert_eq!(bad(|r| r.dst_size[0] = u32::MAX), Err(Status::BadArgument));
        for rot in [0, 180, 270] {
            let mut r = record();
            r.rotation = rot;
            assert!(LayerSpec::parse(&r).is_ok());
        }
    }

    #[test]
    fn crops_must_lie_inside_the_source() {
        let l = FrameLayout::packed(PixelFormat::Nv12, 64, 32).unwrap();
        assert!(crop_inside(Rect::new(0, 0, 64, 32), &l));
        assert!(crop_inside(Rect::new(10, 4, 54, 28), &l));
        assert!(!crop_inside(Rect::new(11, 4, 54, 28), &l));
        assert!(!crop_inside(Rect::new(0, 1, 64, 32), &l));
        assert!(!crop_inside(Rect::new(-1, 0, 8, 8), &l));
    }

    #[test]
    fn frame_errors_map_to_statuses() {
        let short = virtsoc_gpu::FrameError::BufferTooSmall { needed: 2, got: 1 };
        assert_eq!(status_of(&short), Status::OutOfRange);
        let zero = FrameLayout::packed(PixelFormat::Rgba8, 0, 1).unwrap_err();
        assert_eq!(status_of(&zero), Status::BadArgument);
    }
}
