//! The `gles` device's counters, per guest and per guest context, counted where the work
//! happens (the guest's forwarding thread, as each batch goes to the render worker):
//!
//! - **batches**: `exec` commands (one per stream flush of the guest library);
//! - **stream bytes**: the bytes of those batches;
//! - **round trips**: batches the guest waits on (it passes a reply region exactly when it
//!   waits: a call with a result, `glFinish`, `eglMakeCurrent`, a fence);
//! - **swaps**: `SWAP` packets in the batches;
//! - **presents**: window surfaces' frames for the display, and **frame copies**: every
//!   copy of frame bytes on their way (in place: the worker's blit or readback into the
//!   frame region's replica; through the socket: the worker's `glReadPixels`, the socket
//!   from the worker, the write into the frame region), with their bytes; each is also
//!   counted on the guest's SVM ledger (`DeviceCtx::count_copy`);
//! - **worker mappings**: the guest's replicas its render worker holds mapped
//!   (`gles_maps.rs`).
//!
//! Per context, a batch's packets are attributed to the context they run on (the stream's
//! `SET_CONTEXT` / `MAKE_CURRENT` packets switch it); a waited batch is the round trip of
//! the context its last packet ran on. The walk over the packets reads only their 8-byte
//! headers and stops at the first malformed one (the worker rejects that batch anyway).
//! The control API reads them as `GET /gles/stats` (`Gles::control("stats")`).

use std::collections::BTreeMap;

use serde::Serialize;

/// `virtsoc_gles_stream::egl::SET_CONTEXT` (the daemon does not link the stream crate).
const SET_CONTEXT: u32 = 0x1_0000;
/// `virtsoc_gles_stream::egl::MAKE_CURRENT`.
const MAKE_CURRENT: u32 = 0x1_0005;
/// `virtsoc_gles_stream::egl::SWAP`.
const SWAP: u32 = 0x1_0006;
/// Most contexts counted apart per guest (the others are summed under context 0).
const MAX_CONTEXTS: usize = 256;
/// Most opcodes whose round trips are counted apart per guest.
const MAX_OPS: usize = 64;

/// The counters of one guest context (or of a whole guest).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub(super) struct Counts {
    pub(super) batches: u64,
    pub(super) stream_bytes: u64,
    pub(super) round_trips: u64,
    pub(super) swaps: u64,
}

/// A guest's `gles` counters.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub(super) struct GlesStats {
    #[serde(flatten)]
    pub(super) total: Counts,
    /// Window frames read back for the display.
    pub(super) presents: u64,
    /// Copies of frame bytes (see the module doc).
    pub(super) frame_copies: u64,
    /// Their bytes.
    pub(super) frame_copy_bytes: u64,
    /// The guest's replicas its render worker holds mapped (after the last batch).
    pub(super) worker_mappings: u64,
    /// By guest context id (0: packets before any context, and contexts past
    /// [`MAX_CONTEXTS`]).
    pub(super) contexts: BTreeMap<u32, Counts>,
    /// Round trips by the opcode of the waited batch's last packet (the call the guest
    /// waited for: a GL opcode of the generated table, or an EGL one from `0x10000`), at
    /// most [`MAX_OPS`] opcodes (the rest under `u32::MAX`).
    pub(super) round_trip_ops: BTreeMap<u32, u64>,
    /// The context the guest's stream last ran on.
    #[serde(skip)]
    on_ctx: u32,
}

impl GlesStats {
    /// Counts one guest batch (`waited`: the guest waits for its answers).
    pub(super) fn batch(&mut self, batch: &[u8], waited: bool) {
        self.total.batches += 1;
        self.total.stream_bytes += batch.len() as u64;
        let mut touched: Vec<u32> = Vec::new();
        let mut at = 0usize;
        let mut start = 0usize;
        let mut last_op = None;
        let word = |i: usize| {
            batch
                .get(i..i + 4)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        };
        while let (Some(op), Some(len)) = (word(at), word(at + 4)) {
            let Some(next) = (at + 8)
                .checked_add(len as usize)
                .filter(|&n| n <= batch.len())
            else {
                break;
            };
            last_op = Some(op);
            match op {
                SET_CONTEXT | MAKE_CURRENT => {
                    self.bytes_to(start, at, &mut touched);
                    start = at;
                    self.on_ctx = word(at + 8).unwrap_or(0);
                }
                SWAP => {
                    self.total.swaps += 1;
                    self.ctx(self.on_ctx).swaps += 1;
                }
                _ => {}
            }
            at = next;
        }
        self.bytes_to(start, batch.len(), &mut touched);
        if waited {
            self.total.round_trips += 1;
            self.ctx(self.on_ctx).round_trips += 1;
            let op = last_op.unwrap_or(u32::MAX);
            let op = if self.round_trip_ops.contains_key(&op) || self.round_trip_ops.len() < MAX_OPS
            {
                op
            } else {
                u32::MAX
            };
            *self.round_trip_ops.entry(op).or_default() += 1;
        }
    }

    /// Attributes bytes `start..end` of a batch to the current context (and the batch,
    /// once per context).
    fn bytes_to(&mut self, start: usize, end: usize, touched: &mut Vec<u32>) {
        if end <= start {
            return;
        }
        let id = self.on_ctx;
        let first = !touched.contains(&id);
        if first {
            touched.push(id);
        }
        let c = self.ctx(id);
        c.stream_bytes += (end - start) as u64;
        if first {
            c.batches += 1;
        }
    }

    fn ctx(&mut self, id: u32) -> &mut Counts {
        let id = if self.contexts.contains_key(&id) || self.contexts.len() < MAX_CONTEXTS {
            id
        } else {
            0
        };
        self.contexts.entry(id).or_default()
    }

    /// Counts one present: `copies` copies of frame bytes, `bytes` each.
    pub(super) fn present(&mut self, copies: u64, bytes: u64) {
        self.presents += 1;
        self.frame_copies += copies;
        self.frame_copy_bytes += copies * bytes;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn packet(out: &mut Vec<u8>, op: u32, words: &[u32]) {
        out.extend_from_slice(&op.to_le_bytes());
        out.extend_from_slice(&(4 * words.len() as u32).to_le_bytes());
        for w in words {
            out.extend_from_slice(&w.to_le_bytes());
        }
    }

    #[test]
    fn batches_are_attributed_to_their_contexts() {
        let mut s = GlesStats::default();
        let mut b = Vec::new();
        packet(&mut b, SET_CONTEXT, &[7]);
        packet(&mut b, 5, &[1, 2, 3]);
        packet(&mut b, SWAP, &[1]);
        packet(&mut b, SET_CONTEXT, &[9]);
        packet(&mut b, 5, &[1]);
        s.batch(&b, true);
        assert_eq!(s.total.batches, 1);
        assert_eq!(s.total.stream_bytes, b.len() as u64);
        assert_eq!(s.total.swaps, 1);
        assert_eq!(s.total.round_trips, 1);
        assert_eq!(s.contexts[&7].swaps, 1);
        assert_eq!(s.contexts[&7].stream_bytes, 12 + 20 + 12);
        assert_eq!(s.contexts[&9].round_trips, 1);
        assert_eq!(s.contexts[&9].stream_bytes, 12 + 12);
        assert_eq!(s.contexts[&7].round_trips, 0);
        assert_eq!(s.round_trip_ops.get(&5), Some(&1));
        // A later batch without SET_CONTEXT runs on context 9 still; unwaited.
        let mut c = Vec::new();
        packet(&mut c, SWAP, &[2]);
        s.batch(&c, false);
        assert_eq!(s.contexts[&9].swaps, 1);
        assert_eq!(s.contexts[&9].batches, 2);
        assert_eq!(s.total.round_trips, 1);
        s.present(3, 100);
        assert_eq!(
            (s.presents, s.frame_copies, s.frame_copy_bytes),
            (1, 3, 300)
        );
    }

    #[test]
    fn a_malformed_batch_counts_its_bytes_and_stops() {
        let mut s = GlesStats::default();
        let mut b = Vec::new();
        packet(&mut b, SWAP, &[1]);
        b.extend_from_slice(&SWAP.to_le_bytes());
        b.extend_from_slice(&u32::MAX.to_le_bytes());
        s.batch(&b, false);
        assert_eq!(s.total.swaps, 1);
        assert_eq!(s.contexts[&0].stream_bytes, b.len() as u64);
        let json = serde_json::to_value(&s).unwrap_or_default();
        assert_eq!(json["swaps"], 1);
        assert_eq!(json["contexts"]["0"]["batches"], 1);
    }
}
