//! The guest's calls on a connection: regions (alloc, free, metadata), accesses, device
//! commands (typed and raw), counters and the copy ledger, and fences.
//!
//! Regions are [`RegionId`]s in this API; the core requests' words are built here (the
//! `ops` structs take the wire's `u64`), so this is where a region id becomes its word.

use super::*;
use virtsoc_proto::counters::LEDGER_PAGE;
use virtsoc_proto::ops::{self, CoreOp};
use virtsoc_proto::wire::{ACCESS_BEGINS, ACCESS_COMPENSATES};

impl Connection {
    /// Runs core request `op` (see [`virtsoc_proto::ops`]) on `device`, waits for it and
    /// decodes its reply.
    pub fn core<O: CoreOp>(&self, device: DeviceId, op: O) -> Result<O::Reply> {
        let v = self.call(O::OPCODE, device, op.encode())?;
        Ok(O::reply(&v))
    }

    /// Submits core request `op` on `device` without waiting for it (a failure is kept for
    /// [`take_async_errors`](Self::take_async_errors)).
    fn core_detached<O: CoreOp>(&self, device: DeviceId, op: O) -> Result<()> {
        self.submit_detached(O::OPCODE, device, op.encode())
            .map(|_| ())
    }

    /// A round trip that does nothing.
    pub fn nop(&self) -> Result<()> {
        self.core(DeviceId::CPU, ops::Nop {}).map(|_| ())
    }

    /// Allocates a region: `size` bytes of [`Format::Blob`], or a `width` x `height` image.
    pub fn alloc(
        &self,
        size: u64,
        width: u32,
        height: u32,
        format: Format,
        usage: u32,
    ) -> Result<RegionInfo> {
        let r = self.core(
            DeviceId::CPU,
            ops::Alloc {
                size,
                width,
                height,
                format,
                usage,
            },
        )?;
        let info = RegionInfo {
            id: RegionId(r.id),
            size: r.size,
            stride: r.stride as u32,
            width,
            height,
            format,
        };
        self.regions.lock().insert(info.id, info);
        Ok(info)
    }

    /// Allocates `size` untyped bytes.
    pub fn alloc_blob(&self, size: u64) -> Result<RegionInfo> {
        self.alloc(size, 0, 0, Format::Blob, 0)
    }

    /// Cached metadata of one of this guest's regions.
    pub fn region(&self, id: RegionId) -> Option<RegionInfo> {
        self.regions.lock().get(&id).copied()
    }

    /// Frees a region.
    pub fn free(&self, id: RegionId) -> Result<()> {
        self.core(DeviceId::CPU, ops::Free { id: u64::from(id) })?;
        self.regions.lock().remove(&id);
        Ok(())
    }

    /// Begins an access to `[offset, offset + len)` of region `id` by `device`. For the CPU
    /// the result carries a pointer valid until [`end_access`](Self::end_access).
    pub fn begin_access(
        &self,
        id: RegionId,
        device: DeviceId,
        offset: u64,
        len: u64,
        mode: AccessMode,
    ) -> Result<Access> {
        if let Some(info) = self.region(id) {
            if offset.checked_add(len).is_none_or(|end| end > info.size) || len == 0 {
                return Err(GuestError::BadArgument(format!(
                    "range {offset}+{len} outside region {id} of {} bytes",
                    info.size
                )));
            }
        }
        let r = self.core(
            device,
            ops::BeginAccess {
                id: u64::from(id),
                offset,
                len,
                mode,
                flags: 0,
            },
        )?;
        let ptr = if device == DeviceId::CPU {
            self.cpu_offsets
                .lock()
                .insert(id, r.window_offset.wrapping_sub(offset));
            let window = self.window();
            window.check(r.window_offset, len).map_err(|_| {
                GuestError::Proto(virtsoc_proto::ProtoError::RingViolation(
                    "host returned a window offset outside the window",
                ))
            })?;
            // SAFETY: offset and length were checked against the mapping above.
            NonNull::new(unsafe { window.base_ptr().add(r.window_offset as usize) })
        } else {
            None
        };
        Ok(Access {
            ptr,
            coherence: Duration::from_nanos(r.coherence_ns),
            copies: r.copies as u32,
            compensation: Duration::ZERO,
            host_elapsed: Duration::from_nanos(r.host_ns),
        })
    }

    /// Writes `bytes` at `offset` of region `id` from the CPU: a CPU write access of the
    /// range around a copy into the window. A remote guest sends them straight from `bytes`
    /// (one vectored write of the frame), without copying them into its own copy of the
    /// window first: that copy of the range is left as it was, and the next CPU access that
    /// needs the range's bytes (a read, a partial write) brings the host's.
    pub fn write(&self, id: RegionId, offset: u64, bytes: &[u8]) -> Result<()> {
        self.write_accessed(id, offset, bytes, true)
    }

    /// [`write`](Self::write), its end_access waited for (`wait`) or only queued (a window
    /// the daemon shares: a remote guest's write always waits).
    fn write_accessed(&self, id: RegionId, offset: u64, bytes: &[u8], wait: bool) -> Result<()> {
        let len = bytes.len() as u64;
        let a = self.begin_access(id, DeviceId::CPU, offset, len, AccessMode::Write)?;
        if !self.link().shares_window() {
            let write = AccessMode::Write;
            self.end_access_with(
                id,
                DeviceId::CPU,
                (offset, len),
                write,
                bytes,
                ACCESS_COMPENSATES,
            )?;
            return Ok(());
        }
        let ptr = a
            .ptr
            .ok_or_else(|| GuestError::BadArgument("no CPU pointer".into()))?;
        // SAFETY: `begin_access` checked that `[ptr, ptr + len)` lies in the window's
        // mapping, which stays mapped while this connection lives; the CPU access is this
        // call's until its end_access.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), ptr.as_ptr(), bytes.len()) };
        self.end_access_inner(id, DeviceId::CPU, (offset, len), AccessMode::Write, wait)?;
        Ok(())
    }

    /// Writes `bytes` at `offset` of region `id` from the CPU as a posted write: into the
    /// window where the region lies (known from an earlier CPU access), then one request,
    /// queued without waiting, in which the daemon begins and ends the write
    /// ([`virtsoc_proto::wire::ACCESS_BEGINS`]): no round trip before the bytes, none after.
    /// A player writing packets for a decoder pays no round trip per packet. The first write
    /// to a region through this connection (where it lies is not known yet) is a plain
    /// begin_access, the copy and a detached end_access. The daemon refuses a posted write
    /// unless the CPU wrote the region last (a device that wrote it since may have had its
    /// bytes copied into the window over these): the refusal comes back through
    /// [`take_async_errors`](crate::Connection::take_async_errors) and nothing was
    /// published; write such regions with [`write`](Self::write). A remote guest's bytes
    /// travel with the request.
    pub fn write_posted(&self, id: RegionId, offset: u64, bytes: &[u8]) -> Result<()> {
        let len = bytes.len() as u64;
        let size = self
            .region(id)
            .ok_or_else(|| GuestError::BadArgument(format!("no region {id}")))?
            .size;
        if len == 0 || offset.checked_add(len).is_none_or(|end| end > size) {
            return Err(GuestError::BadArgument(format!(
                "range {offset}+{len} outside region {id} of {size} bytes"
            )));
        }
        let Some(base) = self.cpu_offsets.lock().get(&id).copied() else {
            return self.write_accessed(id, offset, bytes, false);
        };
        let posted = |payload: &[u8]| {
            let (range, write) = ((offset, len), AccessMode::Write);
            self.end_access_with(id, DeviceId::CPU, range, write, payload, ACCESS_BEGINS)
                .map(|_| ())
        };
        if !self.link().shares_window() {
            return posted(bytes);
        }
        let window = self.window();
        let at = base.wrapping_add(offset);
        window.check(at, len)?;
        let at = usize::try_from(at).map_err(|_| GuestError::BadArgument("offset".into()))?;
        // SAFETY: `[at, at + len)` lies in the window's mapping (checked above), which
        // `window` keeps mapped; the region lies there (where an earlier begin_access said,
        // and a region's place in the window never moves while it lives).
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), window.base_ptr().add(at), bytes.len())
        };
        posted(&[])
    }

    /// Ends an access. When the host asks for compensation (prefetch protocol), blocks for it
    /// before returning, so the next reader never waits for the copy.
    pub fn end_access(
        &self,
        id: RegionId,
        device: DeviceId,
        offset: u64,
        len: u64,
        mode: AccessMode,
    ) -> Result<Access> {
        self.end_access_inner(id, device, (offset, len), mode, true)
    }

    /// Ends an access without waiting for the daemon's answer (and without compensation):
    /// the request is queued like a device command, ahead of what the guest queues next,
    /// so a player that writes a packet and queues its decode pays no round trip for the
    /// write's end. A failure is kept for
    /// [`take_async_errors`](crate::Connection::take_async_errors).
    pub fn end_access_detached(
        &self,
        id: RegionId,
        device: DeviceId,
        offset: u64,
        len: u64,
        mode: AccessMode,
    ) -> Result<()> {
        self.end_access_inner(id, device, (offset, len), mode, false)
            .map(|_| ())
    }

    fn end_access_inner(
        &self,
        id: RegionId,
        device: DeviceId,
        (offset, len): (u64, u64),
        mode: AccessMode,
        wait: bool,
    ) -> Result<Access> {
        // A remote CPU write sends the bytes straight from this process's copy of the window
        // (one vectored write of the frame; no buffer in between).
        let remote_write = device == DeviceId::CPU && mode.writes() && !self.link().shares_window();
        let window = remote_write.then(|| self.window());
        let payload: &[u8] = if let Some(window) = &window {
            let base =
                self.cpu_offsets.lock().get(&id).copied().ok_or_else(|| {
                    GuestError::BadArgument("end_access without begin_access".into())
                })?;
            let at = base.wrapping_add(offset);
            window.check(at, len)?;
            let (at, n) = usize::try_from(at)
                .ok()
                .zip(usize::try_from(len).ok())
                .ok_or_else(|| GuestError::BadArgument("length".into()))?;
            // SAFETY: `[at, at + n)` lies in the window's mapping (checked above), which
            // `window` keeps mapped until this call returns. It is this process's own copy
            // of a remote guest's window, and the CPU access ends with this call: the
            // caller does not write the range while it is sent.
            unsafe { std::slice::from_raw_parts(window.base_ptr().add(at), n) }
        } else {
            &[]
        };
        let flags = if wait { ACCESS_COMPENSATES } else { 0 };
        self.end_access_with(id, device, (offset, len), mode, payload, flags)
    }

    /// Ends an access, the bytes of a remote CPU write being `payload`. With
    /// `ACCESS_COMPENSATES` in `flags` the call waits for the completion and blocks for the
    /// compensation it carries; without it the request is only queued (its failure kept for
    /// `take_async_errors`) and the access returned is empty.
    fn end_access_with(
        &self,
        id: RegionId,
        device: DeviceId,
        (offset, len): (u64, u64),
        mode: AccessMode,
        payload: &[u8],
        flags: u64,
    ) -> Result<Access> {
        let end = ops::EndAccess {
            id: u64::from(id),
            offset,
            len,
            mode,
            flags,
        };
        if flags & ACCESS_COMPENSATES == 0 {
            self.submit_with(Opcode::EndAccess, device, end.encode(), true, payload)?;
            return Ok(Access {
                ptr: None,
                coherence: Duration::ZERO,
                copies: 0,
                compensation: Duration::ZERO,
                host_elapsed: Duration::ZERO,
            });
        }
        let seq = self.submit_with(Opcode::EndAccess, device, end.encode(), false, payload)?;
        let r = ops::EndAccess::reply(&self.finish(Opcode::EndAccess, seq)?);
        let compensation = Duration::from_nanos(r.compensation_ns).min(MAX_COMPENSATION);
        if !compensation.is_zero() {
            std::thread::sleep(compensation);
        }
        Ok(Access {
            ptr: None,
            coherence: Duration::from_nanos(r.coherence_ns),
            copies: r.copies as u32,
            compensation,
            host_elapsed: Duration::from_nanos(r.host_ns),
        })
    }

    /// Runs a declared device command (see `virtsoc-devapi`) and decodes its results. The
    /// caller brackets the regions it names with begin/end_access itself.
    pub fn command<C: DeviceCommand>(&self, cmd: &C) -> Result<C::Reply> {
        let v = self.call(Opcode::DeviceCmd, C::DEVICE, cmd.encode())?;
        Ok(C::reply(&v))
    }

    /// Runs a declared device command with every region it names accessed whole by the
    /// command's device, in the declared modes: one request
    /// ([`Opcode::DeviceCmdAccess`]), as begin_access, the command and a detached
    /// end_access per region would be.
    pub fn command_with_access<C: DeviceCommand>(&self, cmd: &C) -> Result<C::Reply> {
        let seq = self.submit_with_access(cmd)?;
        let v = self.finish(Opcode::DeviceCmdAccess, seq)?;
        Ok(C::reply(&v))
    }

    /// Queues a declared device command that takes its own accesses (see
    /// [`command_with_access`](Self::command_with_access)) without waiting for it: its
    /// sequence number, for [`wait`](Self::wait).
    pub fn submit_with_access<C: DeviceCommand>(&self, cmd: &C) -> Result<u64> {
        self.submit(Opcode::DeviceCmdAccess, C::DEVICE, cmd.encode())
    }

    /// Sends a device command; `args[0]` is the device opcode.
    pub fn device_cmd(&self, device: DeviceId, args: [u64; 6]) -> Result<[u64; 6]> {
        self.call(Opcode::DeviceCmd, device, args)
    }

    /// Number of regions and host bytes the daemon accounts to this guest.
    pub fn usage(&self) -> Result<(u64, u64)> {
        let r = self.core(DeviceId::CPU, ops::Stats {})?;
        Ok((r.regions, r.bytes))
    }

    /// The guest's SVM counters kept by the host (its own: its metadata, its copies).
    pub fn counters(&self) -> Result<Counters> {
        let mut c = Counters::default();
        for page in 0..Counters::PAGES {
            let r = self.core(DeviceId::CPU, ops::Counters { page })?;
            c.set_page(page, &r.to_values());
        }
        Ok(c)
    }

    /// The name of memory domain `id`, as the ledger names domains.
    pub fn domain_name(&self, id: u32) -> String {
        match id {
            0 => "guest-window".into(),
            1 => "host-ram".into(),
            _ => self
                .devices
                .iter()
                .find(|d| d.domain_id == id)
                .map(|d| d.domain.clone())
                .unwrap_or_else(|| format!("domain-{id}")),
        }
    }

    /// The host's copy ledger for this guest: every copy of its bytes by link.
    pub fn ledger(&self) -> Result<Vec<LedgerLink>> {
        let n = self.counters()?.ledger_links;
        (0..n)
            .map(|i| {
                let r = self.core(
                    DeviceId::CPU,
                    ops::Counters {
                        page: LEDGER_PAGE + i,
                    },
                )?;
                Ok(LedgerLink::from_values(&r.to_values()))
            })
            .collect()
    }

    /// Creates a virtual command fence.
    pub fn fence_create(&self) -> Result<Fence> {
        Ok(Fence::from_u64(
            self.core(DeviceId::CPU, ops::FenceCreate {})?.fence,
        ))
    }

    /// Queues a signal of `f` on `device`: it fires once the device finished everything queued
    /// before it. Does not wait. On the CPU it fires at once (CPU requests run in order).
    pub fn fence_signal(&self, device: DeviceId, f: Fence) -> Result<()> {
        self.core_detached(device, ops::FenceSignal { fence: f.to_u64() })
    }

    /// Queues a wait for `f` on `device`: later commands of this guest on that device run only
    /// after `f` is signaled. Does not wait.
    pub fn fence_wait(&self, device: DeviceId, f: Fence) -> Result<()> {
        self.core_detached(device, ops::FenceWait { fence: f.to_u64() })
    }

    /// Gives a fence back. Does not wait.
    pub fn fence_release(&self, f: Fence) -> Result<()> {
        self.core_detached(DeviceId::CPU, ops::FenceRelease { fence: f.to_u64() })
    }

    /// Whether `f` was signaled, read from the shared fence page without a round trip (a
    /// round trip only for fences beyond the page).
    pub fn fence_signaled(&self, f: Fence) -> Result<bool> {
        if virtsoc_fence::is_page_backed(f) && self.link().shares_window() {
            let word = self
                .window()
                .atomic_u32(FENCE_PAGE_OFFSET + slot_offset(f.index) as u64)?
                .load(Ordering::Acquire);
            return Ok(slot_status(word, f) == FenceStatus::Signaled);
        }
        Ok(self
            .core(DeviceId::CPU, ops::FenceStatus { fence: f.to_u64() })?
            .signaled
            == 1)
    }
}
