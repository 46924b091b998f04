//! The packet ring of a decoder worker: a memfd the parent makes and writes and the worker
//! maps read-only. The parent copies each packet it decodes into a free span of it (with
//! libavcodec's zeroed padding after it) and the decode call says only where the packet
//! lies; the worker hands libavcodec the packet as a reference-counted buffer over the ring,
//! so the packet's bytes pass through memory once on their way to the decoder (the parent's
//! copy) instead of twice (into the socket and out of it) and once more in a new packet.
//!
//! The worker's answers say which packets libavcodec let go of ([`RingView::take_freed`]);
//! the parent writes over no span before then ([`PacketRing::done`]). A packet that finds
//! no room goes in the call itself, as before. What the worker says can only mislead its own
//! decoder: the parent never reads the ring.

use std::ffi::c_void;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::{Arc, Mutex};

use ff::packet::Mut as _;
use ffmpeg_next as ff;

use super::shared::Buffer;
use super::wire::bad;
use crate::error::{MediaError, Result};

/// Bytes libavcodec may read past a packet's end (zeroed).
const PADDING: usize = ff::ffi::AV_INPUT_BUFFER_PADDING_SIZE as usize;
/// Spans start on cache lines.
const ALIGN: usize = 64;

/// The parent's side: where each packet it placed lies until the worker lets it go.
pub(crate) struct PacketRing {
    buf: Buffer,
    /// Spans of the packets placed and not let go yet (start, end with the padding), by
    /// start.
    held: Vec<(usize, usize)>,
}

impl PacketRing {
    /// Bytes of a ring: the packets in flight and those libavcodec's frame threads hold, at
    /// the largest pictures' bitrates (only the pages written cost memory).
    pub(crate) const BYTES: usize = 16 << 20;
    /// Most packets placed and not let go at once (the worker's answers say no more).
    pub(crate) const MAX_HELD: usize = 32;

    /// A ring with nothing placed.
    pub(crate) fn new() -> Result<PacketRing> {
        Ok(PacketRing {
            buf: Buffer::new(Self::BYTES)?,
            held: Vec::new(),
        })
    }

    /// Its descriptor, to send.
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.buf.fd()
    }

    /// Packets placed and not let go yet.
    pub(crate) fn held(&self) -> usize {
        self.held.len()
    }

    /// Copies `packet` into the first span from the ring's start that holds it with its
    /// padding (the start stays in use, so the bytes written were written lately: still in
    /// the caches), the padding zeroed. Its offset, or `None` when no span holds it or
    /// [`MAX_HELD`](Self::MAX_HELD) packets are placed.
    pub(crate) fn put(&mut self, packet: &[u8]) -> Option<u32> {
        if packet.is_empty() || self.held.len() >= Self::MAX_HELD {
            return None;
        }
        let need = (packet.len() + PADDING).next_multiple_of(ALIGN);
        let mut from = 0;
        let mut place = None;
        for (i, &(start, end)) in self.held.iter().enumerate() {
            if start - from >= need {
                place = Some(i);
                break;
            }
            from = end;
        }
        let i = match place {
            Some(i) => i,
            None if Self::BYTES - from >= need => self.held.len(),
            None => return None,
        };
        self.held.insert(i, (from, from + need));
        let bytes = &mut self.buf.bytes_mut()[from..from + packet.len() + PADDING];
        bytes[..packet.len()].copy_from_slice(packet);
        bytes[packet.len()..].fill(0);
        Some(from as u32)
    }

    /// The worker let go of the packet placed at `at` (an offset where none is placed:
    /// nothing).
    pub(crate) fn done(&mut self, at: u32) {
        if let Ok(i) = self.held.binary_search_by_key(&(at as usize), |s| s.0) {
            self.held.remove(i);
        }
    }
}

/// The worker's side: its read-only mapping of the parent's ring, and the packets
/// libavcodec let go of since the last answer.
pub(crate) struct RingView {
    map: Arc<Buffer>,
    freed: Arc<Mutex<Vec<u32>>>,
}

/// What a packet over the ring keeps alive, and where its release is told.
struct Lent {
    at: u32,
    freed: Arc<Mutex<Vec<u32>>>,
    _map: Arc<Buffer>,
}

/// libavcodec's last reference to a packet over the ring is gone.
unsafe extern "C" fn let_go(opaque: *mut c_void, _data: *mut u8) {
    // SAFETY: `opaque` is the `Lent` boxed in `RingView::packet` for this buffer, and
    // libavcodec calls this once, when its buffer's last reference goes.
    let lent = unsafe { Box::from_raw(opaque.cast::<Lent>()) };
    if let Ok(mut freed) = lent.freed.lock() {
        freed.push(lent.at);
    };
}

impl RingView {
    /// Maps the ring the parent sent (read-only; it must be a whole ring).
    pub(crate) fn open(fd: OwnedFd) -> Result<RingView> {
        let map = Buffer::open(fd, PacketRing::BYTES, false)?;
        if map.len() != PacketRing::BYTES {
            return Err(bad("packet ring size"));
        }
        Ok(RingView {
            map: Arc::new(map),
            freed: Arc::default(),
        })
    }

    /// The packet of `len` bytes the parent placed at `at`, as a libavcodec packet over the
    /// ring (read-only: libavcodec copies what it would change); when libavcodec lets it go,
    /// `at` is [freed](Self::take_freed).
    pub(crate) fn packet(&self, at: u32, len: u32) -> Result<ff::Packet> {
        let (start, len) = (at as usize, len as usize);
        if len == 0 || start + len + PADDING > self.map.len() {
            return Err(bad("a packet outside the ring"));
        }
        let lent = Box::into_raw(Box::new(Lent {
            at,
            freed: self.freed.clone(),
            _map: self.map.clone(),
        }));
        // SAFETY: the span lies within the mapping (checked above), which `lent` keeps
        // mapped until `let_go` runs; `let_go` takes `lent` back exactly once.
        let buf = unsafe {
            ff::ffi::av_buffer_create(
                self.map.as_ptr().add(start),
                len + PADDING,
                Some(let_go),
                lent.cast(),
                ff::ffi::AV_BUFFER_FLAG_READONLY,
            )
        };
        if buf.is_null() {
            // SAFETY: not handed to libavcodec: still ours alone.
            drop(unsafe { Box::from_raw(lent) });
            return Err(MediaError::Resources("a packet buffer".into()));
        }
        let mut p = ff::Packet::empty();
        // SAFETY: the packet takes the buffer's only reference (unreferenced when it is
        // dropped) and points at its first `len` bytes; the padding follows them.
        unsafe {
            let raw = p.as_mut_ptr();
            (*raw).buf = buf;
            (*raw).data = (*buf).data;
            (*raw).size = len as i32;
        }
        Ok(p)
    }

    /// The offsets of the packets libavcodec let go of since the last call.
    pub(crate) fn take_freed(&self) -> Vec<u32> {
        self.freed
            .lock()
            .map(|mut f| std::mem::take(&mut *f))
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ff::packet::Ref as _;

    /// A packet crosses the ring as placed, libavcodec's padding zeroed after it; its span
    /// is written over only after the worker let it go, and the first span that holds a
    /// packet is the one used.
    #[test]
    fn a_packet_crosses_and_its_span_comes_back_only_when_let_go() {
        let mut ring = PacketRing::new().unwrap();
        let view = RingView::open(ring.fd().try_clone_to_owned().unwrap()).unwrap();
        let a: Vec<u8> = (0..1000u32).map(|i| (i % 251) as u8 + 1).collect();
        let at = ring.put(&a).unwrap();
        assert_eq!(at, 0);
        let p = view.packet(at, a.len() as u32).unwrap();
        assert_eq!(p.data().unwrap(), &a[..]);
        let b = ring.put(&[7u8; 10]).unwrap();
        assert!(b as usize >= a.len() + PADDING, "over a held packet");
        // SAFETY: the buffer holds the packet's padding after it.
        let padding =
            unsafe { std::slice::from_raw_parts(p.data().unwrap().as_ptr().add(a.len()), PADDING) };
        assert!(padding.iter().all(|x| *x == 0));
        assert!(view.take_freed().is_empty());
        // A second reference, as libavcodec's frame threads take one (`Packet::clone` would
        // copy a read-only packet).
        let mut q = ff::Packet::empty();
        // SAFETY: both packets are valid; `q` takes a new reference to `p`'s buffer.
        let r = unsafe { ff::ffi::av_packet_ref(q.as_mut_ptr(), p.as_ptr()) };
        assert_eq!(r, 0);
        drop(p);
        assert!(view.take_freed().is_empty(), "let go while referenced");
        drop(q);
        assert_eq!(view.take_freed(), vec![at]);
        ring.done(at);
        assert_eq!(ring.put(&[9u8; 100]), Some(0), "the freed span first");
        assert_eq!(ring.held(), 2);
        ring.done(12345);
        assert_eq!(ring.held(), 2, "an offset where nothing is placed");
    }

    /// No room (the ring full, or too many packets held) is `None`, never a span over
    /// another; a packet outside the ring is refused by the worker.
    #[test]
    fn a_full_ring_places_nothing_over_a_held_packet() {
        let mut ring = PacketRing::new().unwrap();
        let big = vec![1u8; PacketRing::BYTES / 3];
        let spans: Vec<u32> = (0..3).filter_map(|_| ring.put(&big)).collect();
        assert_eq!(spans.len(), 2, "a third does not fit with the padding");
        assert_eq!(ring.put(&big), None);
        ring.done(spans[0]);
        assert_eq!(ring.put(&big), Some(spans[0]));
        let mut ring = PacketRing::new().unwrap();
        for _ in 0..PacketRing::MAX_HELD {
            assert!(ring.put(&[1]).is_some());
        }
        assert_eq!(ring.put(&[1]), None);
        let view = RingView::open(ring.fd().try_clone_to_owned().unwrap()).unwrap();
        assert!(view.packet(PacketRing::BYTES as u32 - 10, 10).is_err());
        assert!(view.packet(u32::MAX, u32::MAX).is_err());
        assert!(view.packet(0, 0).is_err());
        let small = Buffer::new(4096).unwrap();
        assert!(RingView::open(small.fd().try_clone_to_owned().unwrap()).is_err());
    }
}
