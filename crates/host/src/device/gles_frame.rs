//! A window surface's frame for the display (`gles::readback`), and the copies of frame
//! bytes it took, each counted on the guest's SVM ledger.
//!
//! - **In place** (the frame region's replica in the `gles` domain is shared with the
//!   worker, `gles_maps.rs`): the worker writes the surface into it, rows from the top
//!   (`virtsoc_render::present`: a blit into the memory imported as a texture, or a
//!   readback with the rows reversed by the driver): one copy; the display scans the
//!   replica out where it is.
//! - **Through the socket** (a replica that is not shared): the worker's READBACK answer
//!   written into the frame region here, rows flipped as they are copied (GL's run from
//!   the bottom): three copies.

use virtsoc_devapi::gles::ReadbackReply;
use virtsoc_proto::wire::Format;
use virtsoc_proto::Status;
use virtsoc_svm::RegionId;

use super::super::{DeviceCtx, DeviceResult};
use super::maps::{self, Mapped, PRESENT};
use super::READBACK;

/// The present of surface `surf` into frame region `frame` in place, when the frame's
/// replica is shared with the worker (`None`: it is not); the frame must be an RGBA8 image
/// with rows of `width * 4` bytes.
pub(super) fn mapped_present(
    cx: &DeviceCtx<'_>,
    surf: u32,
    frame: RegionId,
) -> Result<Option<Mapped>, Status> {
    let Some(buf) = maps::shared_replica(cx, frame) else {
        return Ok(None);
    };
    let meta = cx.meta(frame)?;
    if meta.format != Format::Rgba8 || u64::from(meta.stride) != u64::from(meta.width) * 4 {
        return Err(cx.fail(Status::BadArgument, "frame: an RGBA8 image is needed"));
    }
    Ok(Some(Mapped::Present {
        surface: surf,
        frame: buf,
        size: (meta.width, meta.height),
    }))
}

/// The result of an in-place present from the worker's answer (`op | len | width | height
/// | copies`): the command's values, the copies of frame bytes it took (each counted on the
/// guest's ledger here) and the frame's bytes.
pub(super) fn present_answer(
    cx: &DeviceCtx<'_>,
    answer: &[u8],
    (fw, fh): (u32, u32),
) -> Result<([u64; 6], u64, u64), Status> {
    let word = |i: usize| {
        answer
            .get(4 * i..4 * i + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let (Some(PRESENT), Some(w), Some(h), Some(copies)) = (word(0), word(2), word(3), word(4))
    else {
        return Err(cx.fail(Status::DeviceError, "render worker: no present answer"));
    };
    if w == 0 {
        return Err(cx.fail(
            Status::BadArgument,
            format!(
                "the surface is not the draw surface of the current context, or not of the \
                 frame's size {fw}x{fh}"
            ),
        ));
    }
    if (w, h) != (fw, fh) || !(1..=2).contains(&copies) {
        return Err(cx.fail(
            Status::DeviceError,
            "render worker: malformed present answer",
        ));
    }
    let bytes = u64::from(w) * u64::from(h) * 4;
    let t0 = std::time::Instant::now();
    for _ in 0..copies {
        cx.count_copy(bytes as usize, t0);
    }
    let v = ReadbackReply {
        width: u64::from(w),
        height: u64::from(h),
    }
    .to_values();
    Ok((v, u64::from(copies), bytes))
}

/// Copies of frame bytes per readback: the worker's `glReadPixels`, the socket from the
/// worker, the write into the frame region.
pub(super) const READBACK_COPIES: u64 = 3;

/// Counts a done readback's copies before the frame region on the guest's ledger (the
/// worker's `glReadPixels` and the socket to the daemon: the worker has no ledger of its
/// own; [`write_frame`] counts its own copy) and returns the frame's bytes.
pub(super) fn count_readback(cx: &DeviceCtx<'_>, reply: &[u64; 6]) -> u64 {
    let bytes = reply[0] * reply[1] * 4;
    let t0 = std::time::Instant::now();
    cx.count_copy(bytes as usize, t0);
    cx.count_copy(bytes as usize, t0);
    bytes
}

/// Writes a READBACK answer (`op | len | width | height | byte_len | pixels`) into the
/// RGBA8 image region `frame`, which must be of the surface's size.
pub(super) fn write_frame(cx: &DeviceCtx<'_>, frame: RegionId, answer: &[u8]) -> DeviceResult {
    let word = |i: usize| {
        answer
            .get(4 * i..4 * i + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let (Some(op), Some(len), Some(w), Some(h), Some(n)) =
        (word(0), word(1), word(2), word(3), word(4))
    else {
        return Err(cx.fail(Status::DeviceError, "render worker: no readback answer"));
    };
    let px = answer.get(20..).unwrap_or_default();
    let need = u64::from(w) * u64::from(h) * 4;
    if op != READBACK
        || u64::from(n) != need
        || (px.len() as u64) < need
        || u64::from(len) < need + 12
    {
        return Err(cx.fail(
            Status::DeviceError,
            "render worker: malformed readback answer",
        ));
    }
    let px = &px[..need as usize];
    if w == 0 {
        return Err(cx.fail(
            Status::BadArgument,
            "the surface is not the draw surface of the current context",
        ));
    }
    let meta = cx.meta(frame)?;
    if meta.format != Format::Rgba8 || meta.width != w || meta.height != h {
        return Err(cx.fail(
            Status::BadArgument,
            format!("frame: an RGBA8 image of {w}x{h} is needed"),
        ));
    }
    let (row, stride) = (w as usize * 4, meta.stride as usize);
    let t0 = std::time::Instant::now();
    // GL's rows run from the bottom, the display's from the top: flipped as copied.
    cx.with_region(frame, |dst| {
        for (y, src) in px.chunks_exact(row).rev().enumerate() {
            if let Some(d) = dst.get_mut(y * stride..y * stride + row) {
                d.copy_from_slice(src);
            }
        }
    })?;
    cx.count_copy(need as usize, t0);
    Ok(ReadbackReply {
        width: u64::from(w),
        height: u64::from(h),
    }
    .to_values())
}
