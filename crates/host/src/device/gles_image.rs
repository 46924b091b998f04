//! `gles::import`: an SVM region's bytes into a guest EGLImage (`EGL_VIRTSOC_REGION`,
//! `crates/gles-guest/include/EGL/eglext_virtsoc.h`).
//!
//! The guest brackets the command with a read access of the region *from the gles device*,
//! so the SVM's coherence has brought the region into the `gles` memory domain (a copy on
//! the guest's ledger when the gles replica was stale, none when it was current). The
//! device checks the layout against the region; the worker reads the replica where it is
//! (it is shared with the worker, `gles_maps.rs`: the daemon's `IMPORT_MAPPED` packet),
//! converts it and uploads it into the image's host texture. A replica that is not shared
//! is read into the worker's message instead ([`DeviceCtx::with_source`]: one more copy,
//! counted on the gles domain's own link) and sent as the daemon's `IMPORT` packet. An image whose region's
//! write generation is the one of its last successful import is not sent again.

use virtsoc_devapi::gles::{Import, ImportReply};
use virtsoc_proto::Status;
use virtsoc_svm::RegionId;

use super::maps::{self, Mapped, IMPORT_MAPPED};
use super::{Kind, MAX_BATCH};
use crate::device::DeviceCtx;

/// The IMPORT opcode of the GLES stream (`virtsoc_gles_stream::egl::IMPORT`).
const IMPORT: u32 = 0x1_0023;
/// EGL_SUCCESS, as the worker's answer carries it.
const SUCCESS: u32 = 0x3000;
/// Largest width or height of an image (`virtsoc_gles_stream::egl::MAX_SURFACE`).
const MAX_SIZE: u32 = 16384;
/// Layouts (`virtsoc_gles_stream::egl::IMAGE_*`).
const RGBA8: u32 = 1;
const NV12: u32 = 3;
const YUV420: u32 = 4;
/// Words of the IMPORT payload before the bytes.
const HEAD_WORDS: usize = 8;

/// What an import needs.
pub(super) enum Prepared {
    /// The image already holds the region's current contents: nothing to send.
    Current,
    /// The worker's batch and what its answer is for.
    Batch(Vec<u8>, Kind),
    /// The worker reads the region's shared replica where it is, and what its answer is
    /// for.
    Mapped(Mapped, Kind),
}

/// Why an image layout is refused (the guest reads the text with its `BadArgument`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
enum LayoutError {
    /// A width or height of 0 or over [`MAX_SIZE`].
    #[error("image size {w}x{h} (1 to {MAX_SIZE} each)")]
    Size { w: u32, h: u32 },
    /// RGBA8 rows shorter than the width.
    #[error("stride {stride} under {row} bytes")]
    Stride { stride: u64, row: u64 },
    /// YUV with odd sizes, or a stride under the width (odd, for YUV 4:2:0).
    #[error("{w}x{h} YUV with stride {stride} (even sizes, stride at least the width)")]
    Yuv { w: u64, h: u64, stride: u64 },
    /// A format the device does not know.
    #[error("image format {0} (1 RGBA8, 3 NV12, 4 YUV 4:2:0)")]
    Format(u32),
}

/// The bytes of the region a layout reads (the end of its last row), or why it does not fit.
fn layout_end(format: u32, w: u32, h: u32, stride: u32, off: [u32; 2]) -> Result<u64, LayoutError> {
    if !(1..=MAX_SIZE).contains(&w) || !(1..=MAX_SIZE).contains(&h) {
        return Err(LayoutError::Size { w, h });
    }
    let (w, h, s) = (u64::from(w), u64::from(h), u64::from(stride));
    let plane = |off: u64, stride: u64, rows: u64, row: u64| off + stride * (rows - 1) + row;
    match format {
        RGBA8 => {
            if s < w * 4 {
                return Err(LayoutError::Stride {
                    stride: s,
                    row: w * 4,
                });
            }
            Ok(plane(0, s, h, w * 4))
        }
        NV12 | YUV420 => {
            if w % 2 != 0 || h % 2 != 0 || s < w || (format == YUV420 && s % 2 != 0) {
                return Err(LayoutError::Yuv { w, h, stride: s });
            }
            let luma = plane(0, s, h, w);
            let (o1, o2) = (u64::from(off[0]), u64::from(off[1]));
            Ok(if format == NV12 {
                luma.max(plane(o1, s, h / 2, w))
            } else {
                let cs = s / 2;
                luma.max(plane(o1, cs, h / 2, w / 2))
                    .max(plane(o2, cs, h / 2, w / 2))
            })
        }
        f => Err(LayoutError::Format(f)),
    }
}

/// Checks `c` against the region and reads the bytes into the worker's batch; `last` is
/// `(region, generation)` of the image's last successful import.
pub(super) fn prepare(
    cx: &DeviceCtx<'_>,
    c: &Import,
    last: Option<(RegionId, u64)>,
) -> Result<Prepared, Status> {
    let image = (c.image & 0xFFFF_FFFF) as u32;
    let force = c.image >> 63 != 0;
    if image == 0 {
        return Err(cx.fail(Status::BadArgument, "image 0"));
    }
    let (w, h) = (c.size as u32, (c.size >> 32) as u32);
    let (stride, format) = (c.layout as u32, (c.layout >> 32) as u32);
    let off = [c.planes as u32, (c.planes >> 32) as u32];
    let end = layout_end(format, w, h, stride, off)
        .map_err(|e| cx.fail(Status::BadArgument, e.to_string()))?;
    let size = cx.meta(c.region)?.size;
    if end > size {
        return Err(cx.fail(
            Status::BadArgument,
            format!("the image reads {end} bytes, the region has {size}"),
        ));
    }
    let head = 8 + 4 * HEAD_WORDS;
    if end + head as u64 + 4 > MAX_BATCH {
        return Err(cx.fail(Status::BadArgument, "image too large for one import"));
    }
    let gen = cx
        .svm
        .generation(cx.guest, c.region)
        .map_err(|e| crate::dispatch::status_of(&e))?;
    if !force && last == Some((c.region, gen)) {
        return Ok(Prepared::Current);
    }
    let n = end as usize;
    let kind = Kind::Import {
        image,
        region: c.region,
        gen,
        bytes: end,
    };
    if let Some(src) = maps::shared_replica(cx, c.region) {
        // Read where the SVM put it: no copy here.
        let head = [image, format, w, h, stride, off[0], off[1]];
        let len = n as u32;
        return Ok(Prepared::Mapped(Mapped::Import { head, src, len }, kind));
    }
    let padded = n.next_multiple_of(4);
    let mut b = Vec::with_capacity(head + padded);
    let words = [
        IMPORT,
        (4 * HEAD_WORDS + padded) as u32,
        image,
        format,
        w,
        h,
        stride,
        off[0],
        off[1],
        n as u32,
    ];
    for word in words {
        b.extend_from_slice(&word.to_le_bytes());
    }
    let t0 = std::time::Instant::now();
    cx.with_source(c.region, |src| {
        src.get(..n)
            .map(|bytes| b.extend_from_slice(bytes))
            .is_some()
    })?
    .then_some(())
    .ok_or(Status::OutOfRange)?;
    cx.count_copy(n, t0);
    b.resize(head + padded, 0);
    Ok(Prepared::Batch(b, kind))
}

/// Most images whose last import a guest's map keeps (more: it starts over, which costs
/// only imports that could have been skipped).
pub(super) const MAX_RECORDED: usize = 4096;

/// Records `image`'s last successful import in `map`, bounded by [`MAX_RECORDED`] (a guest
/// making images without end cannot grow it without end).
pub(super) fn record(
    map: &mut std::collections::HashMap<u32, (RegionId, u64)>,
    image: u32,
    at: (RegionId, u64),
) -> Option<(RegionId, u64)> {
    if map.len() >= MAX_RECORDED && !map.contains_key(&image) {
        map.clear();
    }
    map.insert(image, at)
}

/// The result of an import from the worker's answer (`op | len | error`).
pub(super) fn answer(
    cx: &DeviceCtx<'_>,
    reply: &[u8],
    image: u32,
    bytes: u64,
) -> super::DeviceResult {
    let word = |i: usize| {
        reply
            .get(4 * i..4 * i + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    match (
        word(0).filter(|&op| op == IMPORT || op == IMPORT_MAPPED),
        word(2),
    ) {
        (Some(_), Some(SUCCESS)) => Ok(ImportReply { imported: 1, bytes }.to_values()),
        (Some(_), Some(code)) => Err(cx.fail(
            Status::BadArgument,
            format!("image {image}: the render worker refused it (EGL error {code:#x})"),
        )),
        _ => Err(cx.fail(Status::DeviceError, "render worker: no import answer")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_are_checked_and_measured() {
        assert_eq!(layout_end(RGBA8, 4, 2, 16, [0, 0]), Ok(32));
        assert_eq!(layout_end(RGBA8, 4, 2, 20, [0, 0]), Ok(36));
        assert!(layout_end(RGBA8, 4, 2, 12, [0, 0]).is_err());
        assert_eq!(layout_end(NV12, 4, 4, 4, [16, 0]), Ok(24));
        assert!(layout_end(NV12, 3, 4, 4, [16, 0]).is_err());
        assert_eq!(layout_end(YUV420, 4, 4, 4, [16, 20]), Ok(24));
        assert!(layout_end(7, 4, 4, 16, [0, 0]).is_err());
        assert!(layout_end(RGBA8, 0, 4, 16, [0, 0]).is_err());
        assert!(layout_end(RGBA8, MAX_SIZE + 1, 4, u32::MAX, [0, 0]).is_err());
    }

    /// The guest reads these words with its `BadArgument`: the typed error keeps them.
    #[test]
    fn layout_refusals_read_as_before() {
        let text = |r: Result<u64, LayoutError>| r.map_err(|e| e.to_string()).unwrap_err();
        assert_eq!(
            text(layout_end(RGBA8, 0, 4, 16, [0, 0])),
            "image size 0x4 (1 to 16384 each)"
        );
        assert_eq!(
            text(layout_end(RGBA8, 4, 2, 12, [0, 0])),
            "stride 12 under 16 bytes"
        );
        assert_eq!(
            text(layout_end(NV12, 3, 4, 4, [16, 0])),
            "3x4 YUV with stride 4 (even sizes, stride at least the width)"
        );
        assert_eq!(
            text(layout_end(7, 4, 4, 16, [0, 0])),
            "image format 7 (1 RGBA8, 3 NV12, 4 YUV 4:2:0)"
        );
    }

    #[test]
    fn the_record_of_imports_is_bounded() {
        let mut m = std::collections::HashMap::new();
        for i in 0..3 * MAX_RECORDED as u32 {
            record(&mut m, i, (RegionId(1), 2));
            assert!(m.len() <= MAX_RECORDED);
        }
        assert_eq!(
            m.get(&(3 * MAX_RECORDED as u32 - 1)),
            Some(&(RegionId(1), 2))
        );
    }
}
