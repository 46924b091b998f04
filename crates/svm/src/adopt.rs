//! Adopted replicas: memory a device already holds the new contents of a region in (a
//! decoder worker's picture buffer) becomes the region's replica in the device's domain
//! as it is, instead of being copied into a replica of the manager's own.
//!
//! The lent memory ([`DeviceMemory`], whose `read` gives the region's bytes in its linear
//! layout) is read only: the copy engine reads from it (a reader's fetch, a prefetch, a
//! snapshot), but nothing ever writes into it. Whatever would write the replica (a fetch
//! into the domain, the device asking for its replica's bytes to write, a prefetch aimed at
//! it) first *moves it out*: its still valid bytes are copied into host memory of the
//! manager's own, which replaces it (a copy, counted on the guest's ledger as the device's
//! own). A replica left with no valid byte (the region was written whole elsewhere) is
//! dropped at once, so the lent memory goes back to its owner. It is charged to the guest's
//! memory limit as any replica in the domain is (the region's size, once).

use std::sync::Arc;
use std::time::Instant;

use crate::backing::{copy_range, Backing, DeviceMemory, HostBuf};
use crate::domain::DomainId;
use crate::id::{GuestId, RegionId};
use crate::ranges::{Range, RangeSet};
use crate::region::RegionCtx;
use crate::{Result, SvmError, SvmManager};

/// The pieces of `[0, size)` not in `stale`.
fn valid_pieces(stale: &RangeSet, size: u64) -> Vec<Range> {
    let mut out = Vec::new();
    let mut at = 0;
    for &(s, e) in stale.pieces() {
        if s > at {
            out.push((at, s.min(size)));
        }
        at = at.max(e);
    }
    if at < size {
        out.push((at, size));
    }
    out
}

impl RegionCtx<'_> {
    /// Moves the replica in `d` out of lent memory when it is adopted: its valid bytes go
    /// into a fresh host buffer (counted as the device's own copy), which replaces it.
    pub(crate) fn move_out(&mut self, d: DomainId) -> Result<()> {
        let size = self.size();
        let written = self.state.written;
        let Some(r) = self.state.replicas.get_mut(&d).filter(|r| r.adopted) else {
            return Ok(());
        };
        let n = usize::try_from(size).map_err(|_| SvmError::OutOfMemory)?;
        let buf = Backing::Host(HostBuf::try_zeroed(n)?);
        let pieces = match written {
            true => valid_pieces(&r.stale, size),
            false => vec![(0, size)],
        };
        let t0 = Instant::now();
        let mut bytes = 0;
        for &(s, e) in &pieces {
            copy_range(&r.backing, &buf, s, e - s, false)?;
            bytes += e - s;
        }
        r.backing = buf;
        r.adopted = false;
        r.fresh = bytes == 0;
        if bytes > 0 {
            let dt = t0.elapsed();
            self.region.guest.counters().count_copy(d.0, d.0, bytes, dt);
            self.report.copies += 1;
            self.report.bytes += bytes;
            self.report.coherence += dt;
        }
        log::debug!(
            "region {:?}: adopted replica in domain {} moved out ({bytes} bytes)",
            self.region.key,
            d.0
        );
        Ok(())
    }

    /// A host-memory domain holding the current contents of `range` for a reader that reads
    /// host memory in place: a valid host replica where there is one, else a valid adopted
    /// replica moved out into host memory (one copy, the device's own, as a device that
    /// copies its output into its replica pays; a reader in another domain would instead
    /// have it copied into its own memory and, for the display, read back again). `None`
    /// when no domain holds the range in host memory or can be moved out (out of memory).
    pub(crate) fn host_domain_for_read(&mut self, range: Range) -> Option<DomainId> {
        if let Some(d) = self.valid_host_domain(range) {
            return Some(d);
        }
        let lent = self
            .state
            .replicas
            .iter()
            .filter(|(_, r)| r.adopted)
            .map(|(d, _)| *d)
            .find(|d| self.is_valid_in(*d, range))?;
        self.move_out(lent).ok()?;
        self.valid_host_domain(range)
    }

    /// Drops every adopted replica that holds no valid byte any more (its memory goes back
    /// to the device that lent it).
    pub(crate) fn drop_stale_adopted(&mut self) {
        let size = self.size();
        let gone: Vec<DomainId> = self
            .state
            .replicas
            .iter()
            .filter(|(_, r)| r.adopted && r.stale.bytes() >= size)
            .map(|(d, _)| *d)
            .collect();
        for d in gone {
            self.state.replicas.remove(&d);
            self.region.guest.release_bytes(size);
        }
    }
}

impl SvmManager {
    /// Makes `mem` the region's replica in `domain`, holding the region's whole new
    /// contents (moved out into host memory at once when a device that reads host memory
    /// in place has read the region before): the replica there (the device must have begun an access, so that it
    /// exists) is replaced without a copy, it becomes the only valid one, and the region
    /// counts as written. `mem` is only ever read (see the module's notes); it is dropped
    /// when the region is written whole elsewhere, written in `domain` by a copy (moved out
    /// first), replaced by another adoption, moved out ([`move_out_replica`]) or freed.
    ///
    /// [`move_out_replica`]: Self::move_out_replica
    pub fn adopt_replica(
        &self,
        guest: GuestId,
        id: RegionId,
        domain: DomainId,
        mem: Arc<dyn DeviceMemory>,
    ) -> Result<()> {
        let region = self.region(guest.0, id.0)?;
        let mut state = region.lock();
        let size = region.meta.size;
        match state.replicas.get_mut(&domain) {
            Some(r) if !matches!(r.backing, Backing::Window { .. }) => {
                r.backing = Backing::Device(mem);
                r.adopted = true;
                r.stale = RangeSet::new();
                r.fresh = false;
            }
            Some(_) => {
                return Err(SvmError::BadArgument(
                    "the guest window cannot adopt memory".into(),
                ))
            }
            None => {
                return Err(SvmError::BadArgument(
                    "the device has not begun an access to this region".into(),
                ))
            }
        }
        state.written = true;
        state.cpu_wrote_last = false;
        state.generation += 1;
        for (d, r) in state.replicas.iter_mut() {
            if *d != domain {
                r.stale.insert((0, size));
            }
        }
        let mut cx = RegionCtx::new(&region, &mut state, &self.engine);
        cx.drop_stale_adopted();
        if cx.state.host_reader {
            // Its reader reads host memory in place: moved out now, on this (the lending
            // device's) thread, as a device that copies its output into its replica pays,
            // instead of on the reader's path (a display's present, at a vsync).
            cx.move_out(domain)?;
        }
        Ok(())
    }

    /// Moves the region's replica in `domain` out of the memory it adopted (`only`: if it
    /// is still that memory): its valid bytes are copied into host memory of the manager's
    /// own (counted), and the lent memory is dropped. Whether it did.
    pub fn move_out_replica(
        &self,
        guest: GuestId,
        id: RegionId,
        domain: DomainId,
        only: Option<&Arc<dyn DeviceMemory>>,
    ) -> Result<bool> {
        let region = self.region(guest.0, id.0)?;
        let mut state = region.lock();
        let adopted = state.replicas.get(&domain).is_some_and(|r| {
            r.adopted
                && match (&r.backing, only) {
                    (_, None) => true,
                    (Backing::Device(m), Some(o)) => {
                        std::ptr::addr_eq(Arc::as_ptr(m), Arc::as_ptr(o))
                    }
                    _ => false,
                }
        });
        if adopted {
            RegionCtx::new(&region, &mut state, &self.engine).move_out(domain)?;
        }
        Ok(adopted)
    }

    /// Whether the region's replica in `domain` is memory the device lent
    /// ([`adopt_replica`](Self::adopt_replica)).
    pub fn is_adopted(&self, guest: GuestId, id: RegionId, domain: DomainId) -> Result<bool> {
        let region = self.region(guest.0, id.0)?;
        let state = region.lock();
        Ok(state.replicas.get(&domain).is_some_and(|r| r.adopted))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AccessSpec, ProtocolKind, Topology};
    use std::sync::atomic::{AtomicU64, Ordering};
    use virtsoc_proto::{AccessMode, SharedWindow, WindowLayout};

    #[test]
    fn valid_pieces_are_the_complement() {
        let mut s = RangeSet::new();
        assert_eq!(valid_pieces(&s, 10), vec![(0, 10)]);
        s.insert((2, 4));
        s.insert((8, 10));
        assert_eq!(valid_pieces(&s, 10), vec![(0, 2), (4, 8)]);
        assert!(valid_pieces(&RangeSet::of((0, 10)), 10).is_empty());
    }

    /// Memory a device lends: fixed bytes, reads counted, any write a test failure.
    #[derive(Debug)]
    struct Lent {
        bytes: Vec<u8>,
        reads: AtomicU64,
    }

    impl DeviceMemory for Lent {
        fn write(&self, _offset: u64, _src: &[u8]) -> Result<()> {
            panic!("lent memory written");
        }
        fn read(&self, offset: u64, dst: &mut [u8]) -> Result<()> {
            let o = offset as usize;
            dst.copy_from_slice(&self.bytes[o..o + dst.len()]);
            self.reads.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }
        fn as_any(&self) -> &dyn std::any::Any {
            self
        }
    }

    const G: GuestId = GuestId(1);
    const N: u64 = 8192;

    fn setup(kind: ProtocolKind) -> (SvmManager, DomainId, DomainId, RegionId) {
        let mut t = Topology::new();
        let dev = t.add_device_domain("codec");
        let other = t.add_device_domain("display");
        let svm = SvmManager::new(t);
        let win = Arc::new(
            SharedWindow::create_memfd("t", WindowLayout::new(1 << 20, 16, 16).unwrap()).unwrap(),
        );
        svm.attach_guest(G, win, svm.protocol(kind), 1 << 30)
            .unwrap();
        let (id, _) = svm
            .alloc(
                G,
                crate::AllocDesc {
                    size: N,
                    width: 0,
                    height: 0,
                    format: virtsoc_proto::wire::Format::Blob,
                    usage: 0,
                },
            )
            .unwrap();
        (svm, dev, other, id)
    }

    fn access(svm: &SvmManager, id: RegionId, d: DomainId, mode: AccessMode, begin: bool) {
        let spec = AccessSpec::new(d.0, d, 0, N, mode);
        match begin {
            true => drop(svm.begin_access(G, id, &spec).unwrap()),
            false => drop(svm.end_access(G, id, &spec).unwrap()),
        }
    }

    /// The device writes the region by lending memory that holds it.
    fn adopt(svm: &SvmManager, id: RegionId, dev: DomainId, seed: u8) -> Arc<Lent> {
        let lent = Arc::new(Lent {
            bytes: (0..N).map(|i| seed ^ i as u8).collect(),
            reads: AtomicU64::new(0),
        });
        access(svm, id, dev, AccessMode::Write, true);
        svm.adopt_replica(G, id, dev, lent.clone()).unwrap();
        access(svm, id, dev, AccessMode::Write, false);
        lent
    }

    fn read_in(svm: &SvmManager, id: RegionId, d: DomainId) -> Vec<u8> {
        access(svm, id, d, AccessMode::Read, true);
        let b = svm.with_replica(G, id, d, |b| b.to_vec()).unwrap();
        access(svm, id, d, AccessMode::Read, false);
        b
    }

    #[test]
    fn an_adopted_replica_is_read_where_it_is_and_never_written() {
        let (svm, dev, other, id) = setup(ProtocolKind::WriteInvalidate);
        let lent = adopt(&svm, id, dev, 7);
        assert!(svm.is_adopted(G, id, dev).unwrap());
        // Another device reads it: one copy, out of the lent memory.
        let seen = read_in(&svm, id, other);
        assert_eq!(seen, lent.bytes);
        assert_eq!(lent.reads.load(Ordering::Relaxed), 1);
        // The region was charged once for the device's replica, once for the reader's.
        assert_eq!(svm.guest_usage(G).unwrap().1, 2 * N);
        // The next picture replaces it: the first one's memory goes back.
        let second = adopt(&svm, id, dev, 9);
        assert_eq!(
            Arc::strong_count(&lent),
            1,
            "the replaced memory is dropped"
        );
        assert_eq!(read_in(&svm, id, other), second.bytes);
    }

    #[test]
    fn a_whole_write_elsewhere_drops_it_and_a_partial_one_moves_it_out_before_a_fetch() {
        let (svm, dev, other, id) = setup(ProtocolKind::WriteInvalidate);
        let lent = adopt(&svm, id, dev, 3);
        // Written whole by another device: nothing valid is left in the lent memory.
        access(&svm, id, other, AccessMode::Write, true);
        access(&svm, id, other, AccessMode::Write, false);
        assert_eq!(Arc::strong_count(&lent), 1, "dropped at once");
        assert!(!svm.is_adopted(G, id, dev).unwrap());
        assert_eq!(svm.guest_usage(G).unwrap().1, N, "its charge given back");

        // Adopted again, then a part written by another device, then read by the device:
        // the fetch into its domain moves the lent memory out first (the write panics).
        let lent = adopt(&svm, id, dev, 5);
        let spec = AccessSpec::new(other.0, other, 0, 100, AccessMode::Write);
        svm.begin_access(G, id, &spec).unwrap();
        svm.with_replica(G, id, other, |b| b[..100].fill(0xee))
            .unwrap();
        svm.end_access(G, id, &spec).unwrap();
        assert!(
            svm.is_adopted(G, id, dev).unwrap(),
            "still holds valid bytes"
        );
        let before = svm.guest_ledger(G).unwrap();
        let seen = read_in(&svm, id, dev);
        assert!(seen[..100].iter().all(|b| *b == 0xee));
        assert_eq!(&seen[100..], &lent.bytes[100..]);
        assert!(!svm.is_adopted(G, id, dev).unwrap());
        assert_eq!(Arc::strong_count(&lent), 1);
        let own = |l: &[((u32, u32), crate::LinkCount)]| {
            l.iter()
                .find(|(k, _)| *k == (dev.0, dev.0))
                .map_or(0, |(_, c)| c.bytes)
        };
        let after = svm.guest_ledger(G).unwrap();
        assert_eq!(
            own(&after) - own(&before),
            N - 100,
            "the move out is counted"
        );
    }

    #[test]
    fn asking_for_its_bytes_or_moving_it_out_gives_host_memory() {
        let (svm, dev, _, id) = setup(ProtocolKind::Prefetch);
        let lent = adopt(&svm, id, dev, 1);
        let other: Arc<dyn DeviceMemory> = Arc::new(Lent {
            bytes: vec![0; N as usize],
            reads: AtomicU64::new(0),
        });
        assert!(!svm.move_out_replica(G, id, dev, Some(&other)).unwrap());
        assert!(svm.is_adopted(G, id, dev).unwrap());
        // The device asks for its replica's bytes (to write them): moved out first.
        access(&svm, id, dev, AccessMode::ReadWrite, true);
        let b = svm.with_replica(G, id, dev, |b| b.to_vec()).unwrap();
        access(&svm, id, dev, AccessMode::ReadWrite, false);
        assert_eq!(b, lent.bytes);
        assert_eq!(Arc::strong_count(&lent), 1);
        let lent = adopt(&svm, id, dev, 2);
        let as_dyn: Arc<dyn DeviceMemory> = lent.clone();
        assert!(svm.move_out_replica(G, id, dev, Some(&as_dyn)).unwrap());
        drop(as_dyn);
        assert_eq!(Arc::strong_count(&lent), 1);
        // The CPU reads what it held.
        let w = DomainId::GUEST_WINDOW;
        let off = svm
            .begin_access(G, id, &AccessSpec::new(0, w, 0, N, AccessMode::Read))
            .unwrap()
            .window_offset
            .unwrap();
        let mut seen = vec![0u8; N as usize];
        svm.guest_window(G)
            .unwrap()
            .copy_out(off, &mut seen)
            .unwrap();
        assert_eq!(seen, lent.bytes);
    }
}
