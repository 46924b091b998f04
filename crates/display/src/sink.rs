//! A consuming sink: what a real consumer of the screen does with every frame it shows (a
//! window's scan-out, an encoder for a cloud-phone stream, a VNC or WebRTC view, a display
//! controller reading its planes). [`ConsumingSink`] wraps a backend; every frame scanned out
//! is handed to the sink's own thread, which reads every byte of every visible plane once
//! (a CRC-32 over them, as `--display-verify` computes over the composed screen) and counts
//! the frames and bytes per owner ([`SinkStats`]). The vsync thread only queues the frame: a
//! sink still busy with [`SINK_QUEUE`] earlier frames counts the new one as missed instead of
//! holding up the vsync.

use std::collections::HashMap;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Condvar, Mutex};

use virtsoc_sync::{CondvarExt, LockExt};

use crate::backend::DisplayBackend;
use crate::error::Result;
use crate::frame::{GuestId, PresentedFrame};

/// Frames that may wait for the sink's thread.
pub const SINK_QUEUE: usize = 2;

/// What the sink read of one owner's frames.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SinkCounts {
    /// Frames read in full.
    pub frames: u64,
    /// Bytes read.
    pub bytes: u64,
    /// Frames scanned out while the sink was still busy (not read).
    pub missed: u64,
    /// Frames whose pixels could not be read.
    pub unreadable: u64,
    /// CRC-32 of the last frame read.
    pub last_crc: u32,
}

#[derive(Debug, Default)]
struct StatsInner {
    by_owner: HashMap<GuestId, SinkCounts>,
    /// Frames handed to the sink and not yet done.
    queued: u64,
}

/// The sink's counters, shared with whoever reports them.
#[derive(Debug, Default, Clone)]
pub struct SinkStats {
    inner: Arc<(Mutex<StatsInner>, Condvar)>,
}

impl SinkStats {
    /// What the sink read of `owner`'s frames.
    pub fn of(&self, owner: GuestId) -> SinkCounts {
        let g = self.inner.0.lock_or_recover();
        g.by_owner.get(&owner).copied().unwrap_or_default()
    }

    /// Forgets `owner` (its guest left).
    pub fn forget(&self, owner: GuestId) {
        self.inner.0.lock_or_recover().by_owner.remove(&owner);
    }

    /// Waits until every frame handed to the sink so far was read.
    pub fn wait_idle(&self) {
        let (m, cv) = &*self.inner;
        let mut g = m.lock_or_recover();
        while g.queued > 0 {
            g = cv.wait_or_recover(g);
        }
    }

    fn update(&self, owner: GuestId, f: impl FnOnce(&mut SinkCounts)) {
        let mut g = self.inner.0.lock_or_recover();
        f(g.by_owner.entry(owner).or_default());
    }

    fn queued(&self, delta: i64) {
        let (m, cv) = &*self.inner;
        let mut g = m.lock_or_recover();
        g.queued = g.queued.saturating_add_signed(delta);
        if g.queued == 0 {
            cv.notify_all();
        }
    }
}

/// Reads every byte of every visible plane of `frame` once: (CRC-32, bytes), or `None` when
/// its pixels cannot be read. Planes read back from device memory land in `scratch` (the
/// caller's, reused from frame to frame).
pub fn consume(frame: &PresentedFrame, scratch: &mut Vec<u8>) -> Option<(u32, u64)> {
    let mut h = crc32fast::Hasher::new();
    let mut n = 0u64;
    frame
        .data
        .consume(scratch, &mut |b| {
            h.update(b);
            n += b.len() as u64;
        })
        .then(|| (h.finalize(), n))
}

/// A backend that also hands every frame it scans out to a consuming reader.
pub struct ConsumingSink {
    inner: Box<dyn DisplayBackend>,
    queue: SyncSender<PresentedFrame>,
    stats: SinkStats,
}

impl ConsumingSink {
    /// Wraps `inner`; starts the sink's thread (it ends when the sink is dropped).
    pub fn new(inner: Box<dyn DisplayBackend>) -> Result<(Self, SinkStats)> {
        let stats = SinkStats::default();
        let (queue, frames) = sync_channel(SINK_QUEUE);
        let st = stats.clone();
        std::thread::Builder::new()
            .name("display-sink".into())
            .spawn(move || read_frames(frames, st))?;
        Ok((
            ConsumingSink {
                inner,
                queue,
                stats: stats.clone(),
            },
            stats,
        ))
    }
}

/// The sink's thread: reads every frame it is handed.
fn read_frames(frames: Receiver<PresentedFrame>, stats: SinkStats) {
    let mut scratch = Vec::new();
    for frame in frames {
        let read = consume(&frame, &mut scratch);
        stats.update(frame.owner, |c| match read {
            Some((crc, bytes)) => {
                c.frames += 1;
                c.bytes += bytes;
                c.last_crc = crc;
            }
            None => c.unreadable += 1,
        });
        stats.queued(-1);
    }
}

impl DisplayBackend for ConsumingSink {
    fn scanout(&mut self, frame: &PresentedFrame) -> Result<()> {
        self.inner.scanout(frame)?;
        self.stats.queued(1);
        match self.queue.try_send(frame.clone()) {
            Ok(()) => {}
            Err(TrySendError::Full(f) | TrySendError::Disconnected(f)) => {
                self.stats.queued(-1);
                self.stats.update(f.owner, |c| c.missed += 1);
            }
        }
        Ok(())
    }

    fn name(&self) -> &'static str {
        self.inner.name()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::NullBackend;
    use crate::frame::{FrameHandle, PixelFormat};

    /// Pixels in two planes, counting the bytes read.
    #[derive(Debug)]
    struct TwoPlanes(Vec<u8>, Vec<u8>);

    impl FrameHandle for TwoPlanes {
        fn pixels(&self) -> Option<&[u8]> {
            None // not composed: the sink must read the planes
        }
        fn consume(&self, _scratch: &mut Vec<u8>, visit: &mut dyn FnMut(&[u8])) -> bool {
            visit(&self.0);
            visit(&self.1);
            true
        }
    }

    #[test]
    fn every_byte_of_every_plane_is_read_once_per_frame() {
        let (mut sink, stats) = ConsumingSink::new(Box::new(NullBackend)).expect("sink");
        let planes = TwoPlanes(vec![1u8; 64 * 16 * 4], vec![2u8; 32 * 8 * 4]);
        let mut want = crc32fast::Hasher::new();
        want.update(&planes.0);
        want.update(&planes.1);
        let want = want.finalize();
        let data: Arc<dyn FrameHandle> = Arc::new(planes);
        for id in 0..3u64 {
            let f = PresentedFrame::new(id, 64, 16, PixelFormat::Rgba8, data.clone())
                .with_owner(GuestId(7));
            sink.scanout(&f).expect("scanout");
            // One at a time, so that none is missed.
            stats.wait_idle();
        }
        let c = stats.of(GuestId(7));
        assert_eq!(c.frames, 3);
        assert_eq!(c.bytes, 3 * (64 * 16 * 4 + 32 * 8 * 4));
        assert_eq!(c.last_crc, want);
        assert_eq!((c.missed, c.unreadable), (0, 0));
        assert_eq!(stats.of(GuestId(8)), SinkCounts::default());
    }

    #[test]
    fn plain_bytes_are_read_and_unreadable_frames_counted() {
        let f = PresentedFrame::new(1, 4, 2, PixelFormat::Rgba8, vec![9u8; 32]);
        assert_eq!(
            consume(&f, &mut Vec::new()),
            Some((crc32fast::hash(&[9u8; 32]), 32))
        );
        #[derive(Debug)]
        struct Gone;
        impl FrameHandle for Gone {
            fn pixels(&self) -> Option<&[u8]> {
                None
            }
        }
        let g: Arc<dyn FrameHandle> = Arc::new(Gone);
        let f = PresentedFrame::new(2, 4, 2, PixelFormat::Rgba8, g);
        assert_eq!(consume(&f, &mut Vec::new()), None);
        let (mut sink, stats) = ConsumingSink::new(Box::new(NullBackend)).expect("sink");
        sink.scanout(&f).expect("scanout");
        stats.wait_idle();
        assert_eq!(stats.of(GuestId(0)).unreadable, 1);
    }
}
