//! The guest's replicas in the `gles` memory domain that its render worker maps: the domain's
//! host replicas are sealed memfds (`SvmManager::set_shared_memory`, asked for by
//! [`Device::shares_memory`](super::super::Device::shares_memory)); each is passed once to
//! the guest's own worker (`SCM_RIGHTS` with a MAP packet) under a handle the daemon
//! chooses, and the worker reads batches, image pixels and writes frames and large answers
//! there (`virtsoc_render::mapped`), so those bytes cross no socket and no daemon buffer.
//!
//! - **Only the guest's own**: a table belongs to one guest's forwarding thread, and the
//!   replicas it maps come from that guest's regions ([`DeviceCtx`] of the guest's
//!   command): another guest's memfd never reaches the worker.
//! - **Gone with the replica**: the table holds each replica weakly; before every message
//!   the replicas dropped since (region freed, reallocated, guest's memory given back) are
//!   unmapped in the worker (UNMAP packets first in the message), so a worker maps only
//!   what the SVM still holds, give or take the replicas dropped since the guest's last
//!   `gles` command.
//! - **Bounded**: at most [`MAX_MAPPED`] (the worker's own bound); past that the least
//!   recently used one not needed by the message is unmapped.

use std::collections::HashMap;
use std::os::fd::BorrowedFd;
use std::sync::{Arc, Weak};

use virtsoc_svm::{Backing, HostBuf, RegionId, SHARED_DATA_OFFSET};

use crate::device::DeviceCtx;

/// `virtsoc_gles_stream::egl::MAP`.
const MAP: u32 = 0x1_0010;
/// `virtsoc_gles_stream::egl::UNMAP`.
const UNMAP: u32 = 0x1_0011;
/// `virtsoc_gles_stream::egl::EXEC_MAPPED`.
pub(super) const EXEC_MAPPED: u32 = 0x1_0012;
/// `virtsoc_gles_stream::egl::PRESENT`.
pub(super) const PRESENT: u32 = 0x1_0013;
/// `virtsoc_gles_stream::egl::IMPORT_MAPPED`.
pub(super) const IMPORT_MAPPED: u32 = 0x1_0024;

/// Most replicas one worker maps (`virtsoc_render::mapped::MAX_MAPPINGS`).
pub(super) const MAX_MAPPED: usize = 256;
/// Most MAP packets one message carries (`virtsoc_render::serve::MAX_FDS`).
pub(super) const MAX_MAPS_PER_MESSAGE: usize = 16;

/// The replica of region `id` in the device's domain when it is a shared memfd (else the
/// batch travels the old way, through the socket).
pub(super) fn shared_replica(cx: &DeviceCtx<'_>, id: RegionId) -> Option<Arc<HostBuf>> {
    match cx.svm.replica(cx.guest, id, cx.domain) {
        Ok(Backing::Host(b)) if b.memfd().is_some() => Some(b),
        _ => None,
    }
}

/// What a job asks of the worker in a guest's shared replicas.
pub(super) enum Mapped {
    /// Run the first `len` bytes of `stream`; large answers into `reply` when it fits.
    Exec {
        stream: Arc<HostBuf>,
        len: u32,
        reply: Option<Arc<HostBuf>>,
    },
    /// Present surface `surface` into `frame`, an RGBA8 image of `size`.
    Present {
        surface: u32,
        frame: Arc<HostBuf>,
        size: (u32, u32),
    },
    /// Import the first `len` bytes of `src` into a guest image: `head` is the IMPORT
    /// packet's words (image, format, width, height, stride, offset1, offset2).
    Import {
        head: [u32; 7],
        src: Arc<HostBuf>,
        len: u32,
    },
}

struct Entry {
    buf: Weak<HostBuf>,
    /// The message that last needed it.
    used: u64,
}

/// One guest worker's mapped replicas.
#[derive(Default)]
pub(super) struct Maps {
    by_handle: HashMap<u32, Entry>,
    /// Handles by the replica's address (held weakly: the address is never reused while
    /// the entry is here).
    by_buf: HashMap<usize, u32>,
    next: u32,
    tick: u64,
}

/// A message to the worker being built: its packets and the replicas whose memfds ride on
/// it, in MAP order.
#[derive(Default)]
pub(super) struct Message {
    pub(super) bytes: Vec<u8>,
    pub(super) fds: Vec<Arc<HostBuf>>,
}

impl Message {
    fn packet(&mut self, op: u32, words: &[u32]) {
        self.bytes.extend_from_slice(&op.to_le_bytes());
        self.bytes
            .extend_from_slice(&(4 * words.len() as u32).to_le_bytes());
        for w in words {
            self.bytes.extend_from_slice(&w.to_le_bytes());
        }
    }

    /// The memfds, to send.
    pub(super) fn borrowed_fds(&self) -> Vec<BorrowedFd<'_>> {
        self.fds
            .iter()
            .filter_map(|b| b.memfd().map(|m| m.fd()))
            .collect()
    }
}

impl Maps {
    /// How many replicas the worker has mapped.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.by_handle.len()
    }

    /// Unmaps the replicas dropped since the last message.
    fn prune(&mut self, msg: &mut Message) {
        let dead: Vec<u32> = self
            .by_handle
            .iter()
            .filter(|(_, e)| e.buf.strong_count() == 0)
            .map(|(h, _)| *h)
            .collect();
        for h in dead {
            self.forget(h, msg);
        }
    }

    fn forget(&mut self, h: u32, msg: &mut Message) {
        if let Some(e) = self.by_handle.remove(&h) {
            self.by_buf.remove(&(e.buf.as_ptr() as usize));
            msg.packet(UNMAP, &[h]);
        }
    }

    /// The worker's handle of `buf` (a shared replica), mapped in this message if it is
    /// not yet; `None` when it is not shared or the message carries its most maps.
    fn handle(&mut self, buf: &Arc<HostBuf>, msg: &mut Message) -> Option<u32> {
        let mem = buf.memfd()?;
        let key = Arc::as_ptr(buf) as usize;
        if let Some(&h) = self.by_buf.get(&key) {
            if let Some(e) = self.by_handle.get_mut(&h) {
                e.used = self.tick;
                return Some(h);
            }
        }
        if msg.fds.len() >= MAX_MAPS_PER_MESSAGE {
            return None;
        }
        if self.by_handle.len() >= MAX_MAPPED {
            let oldest = self
                .by_handle
                .iter()
                .filter(|(_, e)| e.used < self.tick)
                .min_by_key(|(_, e)| e.used)
                .map(|(h, _)| *h)?;
            self.forget(oldest, msg);
        }
        let h = loop {
            self.next = self.next.wrapping_add(1).max(1);
            if !self.by_handle.contains_key(&self.next) {
                break self.next;
            }
        };
        let bytes = mem.len().saturating_sub(SHARED_DATA_OFFSET);
        msg.packet(MAP, &[h, bytes as u32, (bytes >> 32) as u32]);
        msg.fds.push(buf.clone());
        self.by_handle.insert(
            h,
            Entry {
                buf: Arc::downgrade(buf),
                used: self.tick,
            },
        );
        self.by_buf.insert(key, h);
        Some(h)
    }

    /// The message asking `job` of the worker: the unmaps and maps it needs first; `None`
    /// when a replica could not be mapped (the caller answers the guest an error).
    pub(super) fn message(&mut self, job: &Mapped) -> Option<Message> {
        self.tick += 1;
        let mut msg = Message::default();
        self.prune(&mut msg);
        match job {
            Mapped::Exec { stream, len, reply } => {
                let s = self.handle(stream, &mut msg)?;
                let r = match reply {
                    Some(r) => self.handle(r, &mut msg).unwrap_or(0),
                    None => 0,
                };
                msg.packet(EXEC_MAPPED, &[s, r, *len]);
            }
            Mapped::Present {
                surface,
                frame,
                size,
            } => {
                let f = self.handle(frame, &mut msg)?;
                msg.packet(PRESENT, &[*surface, f, size.0, size.1]);
            }
            Mapped::Import { head, src, len } => {
                let s = self.handle(src, &mut msg)?;
                let mut words = head.to_vec();
                words.extend([s, *len]);
                msg.packet(IMPORT_MAPPED, &words);
            }
        }
        Some(msg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ops(msg: &Message) -> Vec<(u32, u32)> {
        let mut out = Vec::new();
        let w = |i: usize| u32::from_le_bytes(msg.bytes[i..i + 4].try_into().unwrap());
        let mut at = 0;
        while at < msg.bytes.len() {
            out.push((w(at), w(at + 8)));
            at += 8 + w(at + 4) as usize;
        }
        out
    }

    fn exec(stream: &Arc<HostBuf>, reply: Option<&Arc<HostBuf>>) -> Mapped {
        Mapped::Exec {
            stream: stream.clone(),
            len: 16,
            reply: reply.cloned(),
        }
    }

    #[test]
    fn replicas_are_mapped_once_and_unmapped_when_dropped() {
        let mut maps = Maps::default();
        let (a, b) = (
            HostBuf::try_shared(100).unwrap(),
            HostBuf::try_shared(8192).unwrap(),
        );
        let m = maps.message(&exec(&a, Some(&b))).unwrap();
        assert_eq!(ops(&m), [(MAP, 1), (MAP, 2), (EXEC_MAPPED, 1)]);
        assert_eq!(m.borrowed_fds().len(), 2);
        drop(m);
        // Mapped already: only the batch.
        let m = maps.message(&exec(&a, Some(&b))).unwrap();
        assert_eq!(ops(&m), [(EXEC_MAPPED, 1)]);
        assert!(m.fds.is_empty());
        // A replica dropped (its region freed or reallocated) is unmapped before the next
        // message, and its successor gets a handle of its own.
        drop(a);
        let c = HostBuf::try_shared(100).unwrap();
        let m = maps.message(&exec(&c, None)).unwrap();
        assert_eq!(ops(&m), [(UNMAP, 1), (MAP, 3), (EXEC_MAPPED, 3)]);
        assert_eq!(maps.len(), 2);
        // Anonymous memory is never mapped.
        let anon = HostBuf::try_zeroed(100).unwrap();
        assert!(maps.message(&exec(&anon, None)).is_none());
    }

    #[test]
    fn the_table_is_bounded_by_evicting_the_least_recently_used() {
        let mut maps = Maps::default();
        let bufs: Vec<_> = (0..=MAX_MAPPED)
            .map(|_| HostBuf::try_shared(16).unwrap())
            .collect();
        for b in &bufs[..MAX_MAPPED] {
            maps.message(&exec(b, None)).unwrap();
        }
        assert_eq!(maps.len(), MAX_MAPPED);
        // The first one used again, then one more: the second (least recent) goes.
        maps.message(&exec(&bufs[0], None)).unwrap();
        let m = maps.message(&exec(&bufs[MAX_MAPPED], None)).unwrap();
        assert_eq!(ops(&m)[0], (UNMAP, 2));
        assert_eq!(maps.len(), MAX_MAPPED);
    }
}
