//! A decode or flush call's answer, both sides of it: the worker writes where each picture
//! lies ([`answer`]), the parent reads and checks it ([`parse_answer`]): the buffers the
//! worker dropped and introduced, the pictures (or the call's own error), earlier packets'
//! failures, and the packets of the [packet ring](crate::worker::ring) libavcodec let go.

use super::{direct, format_code, format_of, max_buffer_bytes, planes, MAX_ITEMS};
use crate::codec::{DecodedFrame, HeldPicture, PacketError};
use crate::error::{MediaError, Result};
use crate::frame::FrameLayout;
use crate::worker::ring::PacketRing;
use crate::worker::shared::{self, Mapped, Placed, SharedSlots};
use crate::worker::wire::{bad, In, Out};

/// How a picture travels in an answer.
const INLINE: u8 = 0;
const SHARED: u8 = 1;
/// Where libavcodec decoded it: a shared buffer and its 4:2:0 planes.
const PLANES: u8 = 2;

/// Reads a decode or flush answer: the buffers the worker dropped and introduced, then the
/// pictures (or the call's own error), earlier packets' failures and the packets `ring` may
/// place over again. `Err` for anything malformed (the caller ends the worker).
pub(super) fn parse_answer(
    a: &mut In,
    mapped: &mut Mapped,
    layout_seen: &mut Option<FrameLayout>,
    failures: &mut Vec<PacketError>,
    mut ring: Option<&mut PacketRing>,
) -> Result<Result<Vec<DecodedFrame>>> {
    // Buffers the worker dropped, then those it introduces with this answer (their
    // descriptors came with it, in order).
    for _ in 0..a.u32()?.min(shared::MAX_SLOTS as u32 + 1) {
        let id = a.u32()?;
        mapped.remove(id);
    }
    let new = a.u32()? as usize;
    if new != a.fds.len() {
        return Err(bad("descriptors"));
    }
    let fds = std::mem::take(&mut a.fds);
    for fd in fds {
        let id = a.u32()?;
        let cell = a.u32()?;
        mapped.add(id, fd, cell)?;
    }
    let own = match a.u8()? {
        0 => None,
        _ => Some(a.text()?),
    };
    let n = a.u32()?;
    if n > MAX_ITEMS {
        return Err(bad("too many pictures"));
    }
    let mut frames = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let format = format_of(a.u8()?).ok_or_else(|| bad("format"))?;
        let (w, h, pw, ph) = (a.u32()?, a.u32()?, a.u32()?, a.u32()?);
        let corrupt = a.u8()? != 0;
        let pts = a.u64()? as i64;
        let layout = FrameLayout::packed(format, w, h).map_err(|_| bad("layout"))?;
        if pw < w || ph < h || pw > w + 1 || ph > h + 1 {
            return Err(bad("picture size"));
        }
        let (data, held) = match a.u8()? {
            INLINE => {
                let data = a.bytes()?;
                if data.len() != layout.size() {
                    return Err(bad("picture size"));
                }
                (data.to_vec(), None)
            }
            SHARED => {
                let p = mapped.picture(a.u32()?)?;
                // Checks the picture fits its buffer.
                p.frame(layout)?;
                (Vec::new(), Some(HeldPicture::Shared(p)))
            }
            PLANES => {
                let pic = mapped.picture(a.u32()?)?;
                let mut planes = [(0usize, 0usize); 3];
                for p in &mut planes {
                    *p = (a.u32()? as usize, a.u32()? as usize);
                }
                planes::check_planes(pic.bytes().len(), &planes, w, h)?;
                let packed = std::sync::OnceLock::new();
                let held = HeldPicture::Planes {
                    pic,
                    planes,
                    packed,
                };
                (Vec::new(), Some(held))
            }
            _ => return Err(bad("picture kind")),
        };
        *layout_seen = Some(layout);
        frames.push(DecodedFrame {
            layout,
            pts,
            data,
            corrupt,
            picture_size: (pw, ph),
            held,
        });
    }
    let n = a.u32()?;
    if n > MAX_ITEMS {
        return Err(bad("too many failures"));
    }
    for _ in 0..n {
        let (pts, seq, reason) = (a.u64()? as i64, a.u64()?, a.text()?);
        failures.push(PacketError { pts, seq, reason });
    }
    // The ring's packets libavcodec let go of (never more than the ring holds).
    let n = a.u32()?;
    if n as usize > PacketRing::MAX_HELD {
        return Err(bad("too many packets let go"));
    }
    for _ in 0..n {
        let at = a.u32()?;
        if let Some(r) = ring.as_deref_mut() {
            r.done(at);
        }
    }
    Ok(match own {
        None => Ok(frames),
        Some(e) => Err(MediaError::Decode(e)),
    })
}

/// Parses `bytes` as a worker's decode answer (no descriptors), as the daemon does: for the
/// fuzzer and the tests. Returns whether it was accepted.
#[doc(hidden)]
pub fn check_worker_answer(bytes: &[u8]) -> bool {
    let mut a = In::from_bytes(bytes.to_vec());
    let mut mapped = Mapped::new(max_buffer_bytes());
    parse_answer(&mut a, &mut mapped, &mut None, &mut Vec::new(), None).is_ok()
}

/// A decoded picture with where the worker put it.
pub(super) type Placement = (DecodedFrame, Placed);

/// Where each picture of `r` is: in the shared buffer libavcodec decoded it into, else
/// copied into one (inline when none is free).
pub(super) fn placed(slots: &SharedSlots, r: Result<Vec<DecodedFrame>>) -> Result<Vec<Placement>> {
    let mut out = Vec::new();
    for f in r? {
        let direct = f
            .held_yuv420()
            .and_then(|(ptrs, strides)| direct::planes_of(slots, ptrs, strides));
        let at = match direct {
            Some((id, planes)) => Placed::Planes { id, planes },
            None => shared::lock(slots).place(f.layout, |dst| f.copy_into(dst))?,
        };
        out.push((f, at));
    }
    Ok(out)
}

pub(super) fn answer(
    a: &mut Out,
    r: &Result<Vec<Placement>>,
    failures: Vec<PacketError>,
    freed: &[u32],
) {
    let frames: &[Placement] = match r {
        Ok(f) => {
            a.u8(0);
            f
        }
        Err(e) => {
            // The decoder's own words, as an in-process decoder's error carries them.
            let why = match e {
                MediaError::Decode(m) => m.clone(),
                e => e.to_string(),
            };
            a.u8(1).text(&why);
            &[]
        }
    };
    a.u32(frames.len() as u32);
    for (f, at) in frames {
        a.u8(format_code(f.layout.format))
            .u32(f.layout.width)
            .u32(f.layout.height)
            .u32(f.picture_size.0)
            .u32(f.picture_size.1)
            .u8(u8::from(f.corrupt))
            .u64(f.pts as u64);
        match at {
            Placed::Slot(id) => {
                a.u8(SHARED).u32(*id);
            }
            Placed::Planes { id, planes } => {
                a.u8(PLANES).u32(*id);
                for &(offset, stride) in planes {
                    a.u32(offset).u32(stride);
                }
            }
            Placed::Inline => {
                let mut data = vec![0u8; f.layout.size()];
                let copied = crate::frame::FrameMut::new(f.layout, &mut data)
                    .map_err(MediaError::from)
                    .and_then(|dst| f.copy_into(dst));
                if copied.is_err() {
                    data.fill(0);
                }
                a.u8(INLINE).bytes(&data);
            }
        }
    }
    a.u32(failures.len() as u32);
    for f in failures {
        a.u64(f.pts as u64).u64(f.seq).text(&f.reason);
    }
    a.u32(freed.len() as u32);
    for at in freed {
        a.u32(*at);
    }
}

#[cfg(test)]
mod tests {
    use super::super::max_picture_bytes;
    use super::*;

    /// A decode answer with one inline 16x8 NV12 picture of `bytes` bytes.
    fn inline_answer(bytes: usize) -> Vec<u8> {
        let mut a = Out::default();
        a.u32(0).u32(0).u8(0).u32(1);
        a.u8(0).u32(16).u32(8).u32(16).u32(8).u8(0).u64(7);
        a.u8(INLINE).bytes(&vec![1u8; bytes]);
        a.u32(1).u64(3).u64(2).text("bad packet");
        a.u32(0);
        a.0
    }

    #[test]
    fn a_well_formed_answer_is_read() {
        let mut a = In::from_bytes(inline_answer(16 * 8 * 3 / 2));
        let (mut mapped, mut seen, mut failures) =
            (Mapped::new(max_picture_bytes()), None, Vec::new());
        let frames = parse_answer(&mut a, &mut mapped, &mut seen, &mut failures, None)
            .unwrap()
            .unwrap();
        assert_eq!(frames.len(), 1);
        assert_eq!(frames[0].pts, 7);
        assert_eq!(frames[0].as_frame().data.len(), 192);
        assert_eq!(failures[0].reason, "bad packet");
    }

    #[test]
    fn malformed_answers_are_refused_without_panicking() {
        assert!(!check_worker_answer(&inline_answer(191)), "short picture");
        let good = inline_answer(192);
        assert!(check_worker_answer(&good));
        // Every truncation, and a deterministic stream of corruptions, of a good answer.
        for n in 0..good.len() {
            assert!(!check_worker_answer(&good[..n]), "truncated to {n}");
        }
        for (_, bad) in crate::worker::wire::corruptions(&good, 20_000) {
            check_worker_answer(&bad);
        }
        // A picture in a buffer the worker never introduced.
        let mut a = Out::default();
        a.u32(0).u32(0).u8(0).u32(1);
        a.u8(0)
            .u32(16)
            .u32(8)
            .u32(16)
            .u32(8)
            .u8(0)
            .u64(7)
            .u8(SHARED)
            .u32(5);
        a.u32(0);
        assert!(!check_worker_answer(&a.0));
        // A buffer announced without its descriptor.
        let mut a = Out::default();
        a.u32(0).u32(1).u32(5).u8(0).u32(0).u32(0);
        assert!(!check_worker_answer(&a.0));
    }

    /// The packets an answer says libavcodec let go of come back to the parent's ring (and
    /// only those); an answer letting go of more than a ring holds is refused.
    #[test]
    fn packets_let_go_come_back_to_the_ring() {
        let mut ring = PacketRing::new().unwrap();
        let (first, second) = (ring.put(&[1; 100]).unwrap(), ring.put(&[2; 100]).unwrap());
        let mut good = inline_answer(192);
        good.truncate(good.len() - 4);
        let mut a = Out(good.clone());
        a.u32(2).u32(second).u32(99);
        let mut mapped = Mapped::new(max_picture_bytes());
        let parsed = parse_answer(
            &mut In::from_bytes(a.0),
            &mut mapped,
            &mut None,
            &mut Vec::new(),
            Some(&mut ring),
        );
        assert!(matches!(parsed, Ok(Ok(f)) if f.len() == 1));
        assert_eq!(ring.held(), 1);
        assert_eq!(
            ring.put(&[3; 100]),
            Some(second),
            "the span let go, not the held one"
        );
        assert_ne!(second, first);
        let mut a = Out(good);
        a.u32(PacketRing::MAX_HELD as u32 + 1);
        for _ in 0..=PacketRing::MAX_HELD {
            a.u32(first);
        }
        assert!(!check_worker_answer(&a.0));
    }
}
