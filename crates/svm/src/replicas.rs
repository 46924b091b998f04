//! Reaching a region's replicas: the backing of a device's own replica, the one a device
//! that reads host memory in place reads, a current host replica for readers outside the
//! devices, and running code on replicas' bytes with their buffers (never the region)
//! locked.

use crate::backing::{self, Backing};
use crate::domain::DomainId;
use crate::id::{GuestId, RegionId};
use crate::region::RegionCtx;
use crate::{Result, SvmError, SvmManager};

impl SvmManager {
    /// The backing of the region's replica in `domain` (a device's own memory). The replica
    /// must exist, i.e. the device must have begun an access. An adopted replica
    /// ([`SvmManager::adopt_replica`]) is moved out into host memory first. No lock is held
    /// on return.
    pub fn replica(&self, guest: GuestId, id: RegionId, domain: DomainId) -> Result<Backing> {
        let (guest, id) = (guest.0, id.0);
        let region = self.region(guest, id)?;
        let mut state = region.lock();
        // The device is given its replica's bytes to read or write: memory it lent is moved
        // out first (it is never written).
        RegionCtx::new(&region, &mut state, &self.engine).move_out(domain)?;
        let replica = state.replicas.get_mut(&domain).ok_or_else(|| {
            SvmError::BadArgument("the device has not begun an access to this region".into())
        })?;
        replica.fresh = false;
        match &replica.backing {
            Backing::Window { .. } => Err(SvmError::BadArgument(
                "devices do not access the guest window directly".into(),
            )),
            b => Ok(b.clone()),
        }
    }

    /// The replica a device that reads host memory in place ([`crate::AccessSpec::reads_host`])
    /// reads the whole region from, after its read access began: a host-memory replica
    /// holding the current contents when there is one and the guest's protocol allows it,
    /// else the device's own replica in `domain`. No lock is held on return.
    pub fn read_replica(&self, guest: GuestId, id: RegionId, domain: DomainId) -> Result<Backing> {
        let region = self.region(guest.0, id.0)?;
        if region.guest.protocol().reads_host_in_place() {
            let mut state = region.lock();
            let cx = RegionCtx::new(&region, &mut state, &self.engine);
            if let Some(d) = cx.valid_host_domain((0, region.meta.size)) {
                if let Some(r) = state.replicas.get(&d) {
                    return Ok(r.backing.clone());
                }
            }
        }
        self.replica(guest, id, domain)
    }

    /// A replica of the region in host memory that holds its current contents, with the
    /// region's write generation: a reader outside the devices (the live view) reads that in
    /// place instead of having a device's memory read back. `None` when only device memory
    /// or the guest window holds the contents.
    pub fn host_replica(&self, guest: GuestId, id: RegionId) -> Result<Option<(Backing, u64)>> {
        let (guest, id) = (guest.0, id.0);
        let region = self.region(guest, id)?;
        let state = region.lock();
        Ok(state
            .replicas
            .iter()
            .find(|(_, r)| {
                matches!(r.backing, Backing::Host(_))
                    && (!state.written || !r.stale.overlaps((0, region.meta.size)))
            })
            .map(|(_, r)| (r.backing.clone(), state.generation)))
    }

    /// The region's write generation (it changes with every write access).
    pub fn generation(&self, guest: GuestId, id: RegionId) -> Result<u64> {
        let (guest, id) = (guest.0, id.0);
        Ok(self.region(guest, id)?.lock().generation)
    }

    /// Runs `f` on the bytes of the region's replica in a host-backed `domain` (a device's
    /// own memory). The replica must exist, i.e. the device must have begun an access. Only
    /// the replica's buffer is locked while `f` runs, never the region.
    pub fn with_replica<T>(
        &self,
        guest: GuestId,
        id: RegionId,
        domain: DomainId,
        f: impl FnOnce(&mut [u8]) -> T,
    ) -> Result<T> {
        match self.replica(guest, id, domain)? {
            Backing::Host(buf) => Ok(f(&mut buf.lock())),
            _ => Err(SvmError::BadArgument(
                "the replica is in device memory, not host-addressable".into(),
            )),
        }
    }

    /// Runs `f` on the bytes of two regions' replicas in a host-backed `domain`, `src` to
    /// read and `dst` to write, both buffers locked (never the regions). The same region
    /// twice is `BadArgument`.
    pub fn with_replicas<T>(
        &self,
        guest: GuestId,
        (src, dst): (RegionId, RegionId),
        domain: DomainId,
        f: impl FnOnce(&[u8], &mut [u8]) -> T,
    ) -> Result<T> {
        self.with_source_and_replica(guest, (src, dst), domain, false, f)
    }

    /// [`with_replicas`](Self::with_replicas) for a device that may read host memory in
    /// place (`reads_host`): `src` is then read from [`read_replica`](Self::read_replica).
    pub fn with_source_and_replica<T>(
        &self,
        guest: GuestId,
        (src, dst): (RegionId, RegionId),
        domain: DomainId,
        reads_host: bool,
        f: impl FnOnce(&[u8], &mut [u8]) -> T,
    ) -> Result<T> {
        let source = match reads_host {
            true => self.read_replica(guest, src, domain)?,
            false => self.replica(guest, src, domain)?,
        };
        match (source, self.replica(guest, dst, domain)?) {
            (Backing::Host(a), Backing::Host(b)) => {
                let (ga, mut gb) = backing::lock_two(&a, &b).ok_or_else(|| {
                    SvmError::BadArgument("source and destination are one region".into())
                })?;
                Ok(f(&ga, &mut gb))
            }
            _ => Err(SvmError::BadArgument(
                "the replicas are in device memory, not host-addressable".into(),
            )),
        }
    }
}
