//! Decoded pictures lent as regions' replicas: `receive_frame` makes the worker's shared
//! buffer libavcodec decoded a picture into the frame region's replica in the codec's
//! domain ([`virtsoc_svm::SvmManager::adopt_replica`]) instead of copying the picture into
//! it, so the decoder's own write is the picture's only copy until a reader needs it
//! elsewhere (a reader's fetch then reads it straight out of the buffer, the one copy it
//! would have paid for anyway, NV12's interleaving included).
//!
//! The buffer stays held (the worker decodes nothing into it) while it is a replica. A
//! decoder lends at most [`MAX_LENT`] buffers at once: past that the oldest lent picture
//! still a replica is moved out into memory of the daemon's own (copied, counted), so a
//! guest rotating through many frame regions cannot pin the worker's buffer pool. A lent
//! picture counts against the guest's memory limit as the replica it replaces did (the
//! region's size).

use std::collections::VecDeque;
use std::sync::{Arc, Weak};

use virtsoc_media::{DecodedFrame, FrameLayout, LentPicture};
use virtsoc_proto::Status;
use virtsoc_svm::{DeviceMemory, RegionId, RegionMeta, SvmError};

use super::super::DeviceCtx;
use crate::status::status_of;

/// Pictures one decoder lends as replicas at once (of its worker's 48 shared buffers; the
/// decoder's references, its frame threads and the pictures waiting for `receive_frame`
/// need the others).
pub const MAX_LENT: usize = 8;

/// A decoded picture serving as a replica: read only.
#[derive(Debug)]
struct LentMemory(LentPicture);

impl DeviceMemory for LentMemory {
    fn write(&self, _offset: u64, _src: &[u8]) -> virtsoc_svm::Result<()> {
        Err(SvmError::NotSupported(
            "a decoded picture lent as a replica is read only".into(),
        ))
    }

    fn read(&self, offset: u64, dst: &mut [u8]) -> virtsoc_svm::Result<()> {
        let offset = usize::try_from(offset).map_err(|_| SvmError::OutOfRange)?;
        self.0
            .read(offset, dst)
            .map_err(|e| SvmError::Internal(format!("reading a lent picture: {e}")))
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// The pictures one decoder has lent: (region, the replica's memory), oldest first.
#[derive(Default)]
pub(super) struct Lent {
    lent: VecDeque<(RegionId, Weak<dyn DeviceMemory>)>,
}

impl Lent {
    /// Lends picture `f` as region `id`'s replica in the codec's domain when it lies in a
    /// worker's shared buffer and the region holds exactly its packed frame (`layout`,
    /// `meta`); whether it did. The guest must have begun a write access to the region.
    pub(super) fn lend(
        &mut self,
        cx: &DeviceCtx<'_>,
        id: RegionId,
        (layout, meta): (FrameLayout, &RegionMeta),
        f: &DecodedFrame,
    ) -> Result<bool, Status> {
        let packed = FrameLayout::packed(layout.format, layout.width, layout.height);
        if packed.ok() != Some(layout) || layout.size() as u64 != meta.size {
            return Ok(false);
        }
        // It holds the same buffer: on failure the picture stays queued.
        let Some(pic) = f.lend() else {
            return Ok(false);
        };
        let mem: Arc<dyn DeviceMemory> = Arc::new(LentMemory(pic));
        cx.svm
            .adopt_replica(cx.guest, id, cx.domain, mem.clone())
            .map_err(|e| status_of(&e))?;
        // The region's earlier picture, if lent, is replaced.
        self.lent.retain(|(r, _)| *r != id);
        self.lent.push_back((id, Arc::downgrade(&mem)));
        drop(mem);
        self.bound(cx);
        Ok(true)
    }

    /// Forgets pictures no longer lent, and moves the oldest still lent out while more than
    /// [`MAX_LENT`] are.
    fn bound(&mut self, cx: &DeviceCtx<'_>) {
        self.lent.retain(|(_, m)| m.strong_count() > 0);
        while self.lent.len() > MAX_LENT {
            let Some((id, m)) = self.lent.pop_front() else {
                break;
            };
            let Some(m) = m.upgrade() else { continue };
            match cx.svm.move_out_replica(cx.guest, id, cx.domain, Some(&m)) {
                Ok(true) => log::debug!(
                    "codec: guest {}: region {id}'s lent picture moved out ({MAX_LENT} lent)",
                    cx.guest
                ),
                Ok(false) => {}
                Err(e) => log::debug!("codec: guest {}: region {id}: {e}", cx.guest),
            }
        }
    }
}
