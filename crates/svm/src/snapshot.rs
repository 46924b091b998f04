//! Export and import of one guest's regions, for snapshots, restarts and migration.
//!
//! [`SvmManager::export_region`] reads a region's metadata and its current bytes: each byte
//! range comes from a replica holding its current contents (the guest window, host RAM, or a
//! device's own memory through a readback, [`Backing::Device`], when that is the only valid
//! copy). A region never written is exported without bytes (it reads as zeroes).
//!
//! [`SvmManager::import_region`] recreates a region under the *same* id in a guest's table,
//! its bytes in one replica (host RAM; the guest window for guest-staging, whose devices
//! always pull from there); the other domains get replicas lazily at their next access, as
//! for any region. Everything imported is validated as untrusted input: the
//! metadata must describe a region [`SvmManager::alloc`] could have made, the bytes must be
//! exactly its size, the id must be free. [`SvmManager::reserve_ids`] makes later
//! allocations never reuse an imported id.

use crate::backing::Backing;
use crate::domain::DomainId;
use crate::region::{Region, RegionCtx, RegionKey, RegionMeta};
use crate::{AllocDesc, GuestId, ProtocolKind, RegionId, Result, SvmError, SvmManager};
use std::sync::Arc;

/// Largest region id an import accepts (so the id counter never wraps).
pub const MAX_ID: u64 = 1 << 62;

/// One region as exported: its id, metadata and contents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionImage {
    /// The guest-visible id.
    pub id: u64,
    /// What the region was allocated as.
    pub meta: RegionMeta,
    /// The region's bytes (`meta.size` of them), or `None` when it was never written (all
    /// zeroes).
    pub bytes: Option<Vec<u8>>,
}

/// Reads `dst.len()` bytes at `off` of the region out of one replica.
fn read_backing(b: &Backing, off: u64, dst: &mut [u8]) -> Result<()> {
    match b {
        Backing::Host(buf) => {
            let g = buf.read();
            let o = usize::try_from(off).map_err(|_| SvmError::OutOfRange)?;
            let end = o.checked_add(dst.len()).ok_or(SvmError::OutOfRange)?;
            dst.copy_from_slice(g.get(o..end).ok_or(SvmError::OutOfRange)?);
            Ok(())
        }
        Backing::Window { win, offset } => Ok(win.copy_out(offset + off, dst)?),
        Backing::Device(d) => d.read(off, dst),
    }
}

/// The size and stride an allocation of `meta`'s kind would get, or why it is invalid.
pub(crate) fn layout_of(desc: &AllocDesc) -> Result<(u64, u32)> {
    match desc.format {
        virtsoc_proto::wire::Format::Blob => {
            if desc.size == 0 || desc.size > (1 << 40) {
                return Err(SvmError::BadArgument(format!(
                    "blob size {} out of range",
                    desc.size
                )));
            }
            Ok((desc.size, 0))
        }
        f => f.image_size(desc.width, desc.height).ok_or_else(|| {
            SvmError::BadArgument(format!(
                "{}x{} does not fit format {:?}",
                desc.width, desc.height, f
            ))
        }),
    }
}

impl SvmManager {
    /// The ids of `guest`'s regions, in increasing order.
    pub fn region_ids(&self, guest: GuestId) -> Result<Vec<RegionId>> {
        let mut ids = self.guest(guest.0)?.region_ids();
        ids.sort_unstable();
        Ok(ids.into_iter().map(RegionId).collect())
    }

    /// The next id `guest`'s allocations would get.
    pub fn next_region_id(&self, guest: GuestId) -> Result<RegionId> {
        Ok(RegionId(self.guest(guest.0)?.peek_next_id()))
    }

    /// Makes `guest`'s later allocations take ids from `next` on (never lowers the counter).
    pub fn reserve_ids(&self, guest: GuestId, next: RegionId) -> Result<()> {
        let (guest, next) = (guest.0, next.0);
        if next > MAX_ID {
            return Err(SvmError::BadArgument(format!("next region id {next}")));
        }
        self.guest(guest)?.raise_next_id(next);
        Ok(())
    }

    /// Exports region `id` of `guest`: its metadata and its current bytes, read from the
    /// replicas that hold them (device memory through readbacks where that is the only
    /// valid copy). The region's lock is held while its bytes are read.
    pub fn export_region(&self, guest: GuestId, id: RegionId) -> Result<RegionImage> {
        Ok(self.export_region_versioned(guest, id)?.0)
    }

    /// The write version of region `id`: it moves at the begin and the end of every writing
    /// access (a migration's pre-copy resends the regions whose version moved).
    pub fn region_version(&self, guest: GuestId, id: RegionId) -> Result<u64> {
        let (guest, id) = (guest.0, id.0);
        Ok(self.region(guest, id)?.lock().version)
    }

    /// Like [`export_region`](Self::export_region), with the write version the bytes are of
    /// (read under the same lock).
    pub fn export_region_versioned(
        &self,
        guest: GuestId,
        id: RegionId,
    ) -> Result<(RegionImage, u64)> {
        let (guest, id) = (guest.0, id.0);
        let region = self.region(guest, id)?;
        let size = usize::try_from(region.meta.size).map_err(|_| SvmError::OutOfMemory)?;
        let state = region.lock();
        let generation = state.version;
        if !state.written {
            return Ok((
                RegionImage {
                    id,
                    meta: region.meta,
                    bytes: None,
                },
                generation,
            ));
        }
        let mut bytes = Vec::new();
        bytes
            .try_reserve_exact(size)
            .map_err(|_| SvmError::OutOfMemory)?;
        bytes.resize(size, 0);
        // Cut the region where any replica's staleness changes: each piece is wholly valid
        // or wholly stale in every replica, and comes from one that holds it, preferring
        // host-addressable memory over readbacks from a device.
        let mut cuts = vec![0, region.meta.size];
        for r in state.replicas.values() {
            r.stale.boundaries_in((0, region.meta.size), &mut cuts);
        }
        cuts.sort_unstable();
        cuts.dedup();
        for part in cuts.windows(2).map(|w| (w[0], w[1])) {
            let mut source = None;
            for r in state.replicas.values() {
                if r.stale.overlaps(part) {
                    continue;
                }
                let device = matches!(r.backing, Backing::Device(_));
                if source.is_none() || !device {
                    source = Some(&r.backing);
                }
                if !device {
                    break;
                }
            }
            let b = source.ok_or_else(|| {
                SvmError::Internal(format!(
                    "bytes {part:?} of region {id} have no valid replica"
                ))
            })?;
            read_backing(b, part.0, &mut bytes[part.0 as usize..part.1 as usize])?;
        }
        Ok((
            RegionImage {
                id,
                meta: region.meta,
                bytes: Some(bytes),
            },
            generation,
        ))
    }

    /// Checks that `img` describes a region `alloc` could have made and that its bytes are
    /// exactly its size (untrusted input: nothing is allocated).
    pub fn validate_image(img: &RegionImage) -> Result<()> {
        if img.id == 0 || img.id >= MAX_ID {
            return Err(SvmError::BadArgument(format!(
                "region id {} invalid",
                img.id
            )));
        }
        let m = &img.meta;
        let desc = AllocDesc {
            size: m.size,
            width: m.width,
            height: m.height,
            format: m.format,
            usage: m.usage,
        };
        let (size, stride) = layout_of(&desc)?;
        if size != m.size || stride != m.stride {
            return Err(SvmError::BadArgument(format!(
                "region {}: size {} / stride {} do not match {:?} {}x{}",
                img.id, m.size, m.stride, m.format, m.width, m.height
            )));
        }
        if let Some(b) = &img.bytes {
            if b.len() as u64 != m.size {
                return Err(SvmError::BadArgument(format!(
                    "region {}: {} bytes for a region of {}",
                    img.id,
                    b.len(),
                    m.size
                )));
            }
        }
        Ok(())
    }

    /// Recreates a region under its own id in `guest`'s table, its bytes in a host-RAM
    /// replica. Fails (having added nothing) on an invalid image, an id the guest already
    /// holds, or the guest's limits.
    pub fn import_region(&self, guest: GuestId, img: &RegionImage) -> Result<()> {
        let guest = guest.0;
        Self::validate_image(img)?;
        let g = self.guest(guest)?;
        if img.meta.size > g.limit() {
            return Err(SvmError::OutOfMemory);
        }
        if g.region(img.id).is_some() {
            return Err(SvmError::BadArgument(format!(
                "guest {guest} already holds region {}",
                img.id
            )));
        }
        let key = RegionKey { guest, id: img.id };
        let region = Arc::new(Region::new(key, img.meta, g.clone()));
        if let Some(bytes) = &img.bytes {
            // The bytes go where the guest's protocol keeps them: guest-staging always has
            // them in the guest window (devices pull from there), the others anywhere.
            let home = if g.protocol().name() == ProtocolKind::GuestStaging.name() {
                DomainId::GUEST_WINDOW
            } else {
                DomainId::HOST_RAM
            };
            let mut state = region.lock();
            let mut cx = RegionCtx::new(&region, &mut state, &self.engine);
            cx.ensure_replica(home)?;
            cx.make_exclusive(home, (0, img.meta.size))?;
            match &cx.state.replicas[&home].backing {
                Backing::Host(buf) => buf.lock().copy_from_slice(bytes),
                Backing::Window { win, offset } => win.copy_in(*offset, bytes)?,
                Backing::Device(d) => d.write(0, bytes)?,
            }
            if let Some(r) = cx.state.replicas.get_mut(&home) {
                r.fresh = false;
            }
        }
        g.insert_region_new(img.id, region)?;
        g.raise_next_id(img.id + 1);
        Ok(())
    }
}
