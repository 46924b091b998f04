//! What a device command runs with: [`DeviceCtx`] (the calling guest, its regions' replicas
//! in the device's memory, its fences, the reason a command failed) and [`DeviceResult`].

use std::sync::Arc;
use virtsoc_svm::{GuestId, RegionId};

use virtsoc_fence::table::VirtualFenceTable;
use virtsoc_proto::Status;
use virtsoc_sched::policy::GuestPolicy;
use virtsoc_svm::{DomainId, SvmManager};
use virtsoc_sync::LockExt;

use crate::status::status_of;

/// What a device command returns: result values, or a status for the guest.
pub type DeviceResult = std::result::Result<[u64; 6], Status>;

/// Context of one device command.
pub struct DeviceCtx<'a> {
    /// The guest that sent the command.
    pub guest: GuestId,
    /// The SVM manager, to reach region replicas.
    pub svm: &'a Arc<SvmManager>,
    /// The device's own memory domain.
    pub domain: DomainId,
    /// The guest's virtual fence table (e.g. to signal a fence at the next vsync).
    pub fences: &'a Arc<VirtualFenceTable>,
    /// The device reads host memory in place ([`super::Device::reads_host_memory`]): its
    /// sources come from [`SvmManager::read_replica`].
    pub reads_host: bool,
    /// The sending guest's sharing policy, where the caller has it (device workers do);
    /// devices read their per-guest quotas from it.
    pub policy: Option<&'a GuestPolicy>,
    /// Why the command failed, for the guest ([`DeviceCtx::fail`]).
    reason: std::sync::Mutex<Option<String>>,
    /// The command's device time as the device measured it ([`DeviceCtx::busy_for`]).
    busy_ns: std::sync::Mutex<Option<u64>>,
}

impl<'a> DeviceCtx<'a> {
    /// The context of one command of `guest` on the device whose memory is `domain`.
    pub fn new(
        guest: GuestId,
        svm: &'a Arc<SvmManager>,
        domain: DomainId,
        fences: &'a Arc<VirtualFenceTable>,
    ) -> Self {
        DeviceCtx {
            guest,
            svm,
            domain,
            fences,
            reads_host: false,
            policy: None,
            reason: std::sync::Mutex::new(None),
            busy_ns: std::sync::Mutex::new(None),
        }
    }

    /// The same context carrying the guest's sharing policy.
    pub fn with_policy(mut self, policy: &'a GuestPolicy) -> Self {
        self.policy = Some(policy);
        self
    }

    /// The same context for a device that reads host memory in place.
    pub fn reading_host(mut self, yes: bool) -> Self {
        self.reads_host = yes;
        self
    }

    /// The replica the device reads region `id` from: a current host-memory replica where
    /// it is, for a device that reads host memory in place; else its own.
    pub fn source(&self, id: RegionId) -> Result<virtsoc_svm::Backing, Status> {
        match self.reads_host {
            true => self.svm.read_replica(self.guest, id, self.domain),
            false => self.svm.replica(self.guest, id, self.domain),
        }
        .map_err(|e| status_of(&e))
    }

    /// Runs `f` on the bytes of region `id` as the device reads them (see
    /// [`source`](Self::source)). The guest must have begun a read access to it from this
    /// device.
    pub fn with_source<T>(&self, id: RegionId, f: impl FnOnce(&[u8]) -> T) -> Result<T, Status> {
        match self.source(id)? {
            virtsoc_svm::Backing::Host(b) => Ok(f(&b.read())),
            _ => Err(Status::BadArgument),
        }
    }

    /// Records why the command fails with `status` and returns the status: the guest gets
    /// the reason with it (the first [`REASON_BYTES`](virtsoc_proto::wire::REASON_BYTES)
    /// bytes, shown by `virtsoc_last_error`). Only for sentences about this guest's own
    /// command and data.
    pub fn fail(&self, status: Status, reason: impl Into<String>) -> Status {
        *self.reason.lock_or_recover() = Some(reason.into());
        status
    }

    /// The reason recorded by [`fail`](Self::fail), taken.
    pub fn take_reason(&self) -> Option<String> {
        self.reason.lock_or_recover().take()
    }

    /// Says how much device time the command took as the device measured it (work it runs
    /// apart, in a worker process: [`super::Reply::busy_for`]); the default `execute_async`
    /// passes it on with the answer.
    pub fn busy_for(&self, ns: u64) {
        *self.busy_ns.lock_or_recover() = Some(ns);
    }

    /// The device time recorded by [`busy_for`](Self::busy_for), taken.
    pub fn take_busy(&self) -> Option<u64> {
        self.busy_ns.lock_or_recover().take()
    }

    /// Runs `f` on the bytes of region `id` in this device's memory. The guest must have
    /// begun an access to it from this device.
    pub fn with_region<T>(
        &self,
        id: RegionId,
        f: impl FnOnce(&mut [u8]) -> T,
    ) -> Result<T, Status> {
        self.svm
            .with_replica(self.guest, id, self.domain, f)
            .map_err(|e| status_of(&e))
    }

    /// Runs `f` on the bytes of `src` (read, from [`source`](Self::source)) and `dst`
    /// (written, in this device's memory), both locked at once (the same region twice is
    /// `BadArgument`).
    pub fn with_regions<T>(
        &self,
        src: RegionId,
        dst: RegionId,
        f: impl FnOnce(&[u8], &mut [u8]) -> T,
    ) -> Result<T, Status> {
        self.svm
            .with_source_and_replica(self.guest, (src, dst), self.domain, self.reads_host, f)
            .map_err(|e| status_of(&e))
    }

    /// A copy of the first `n` bytes of region `id` as the device reads it (see
    /// [`source`](Self::source)), wherever that memory is (read back from device memory);
    /// counted on the guest's ledger.
    pub fn read_bytes(&self, id: RegionId, n: usize) -> Result<Vec<u8>, Status> {
        let t0 = std::time::Instant::now();
        let mut out = vec![0u8; n];
        match self.source(id) {
            Ok(virtsoc_svm::Backing::Host(b)) => {
                out.copy_from_slice(b.read().get(..n).ok_or(Status::OutOfRange)?)
            }
            Ok(virtsoc_svm::Backing::Device(m)) => {
                m.read(0, &mut out).map_err(|e| status_of(&e))?
            }
            Ok(_) => return Err(Status::BadArgument),
            Err(st) => return Err(st),
        }
        self.count_copy(n, t0);
        Ok(out)
    }

    /// Writes `bytes` at the start of region `id` in this device's memory (uploaded into
    /// device memory); counted on the guest's ledger.
    pub fn write_bytes(&self, id: RegionId, bytes: &[u8]) -> Result<(), Status> {
        let t0 = std::time::Instant::now();
        match self.svm.replica(self.guest, id, self.domain) {
            Ok(virtsoc_svm::Backing::Host(b)) => b
                .lock()
                .get_mut(..bytes.len())
                .ok_or(Status::OutOfRange)?
                .copy_from_slice(bytes),
            Ok(virtsoc_svm::Backing::Device(m)) => m.write(0, bytes).map_err(|e| status_of(&e))?,
            Ok(_) => return Err(Status::BadArgument),
            Err(e) => return Err(status_of(&e)),
        }
        self.count_copy(bytes.len(), t0);
        Ok(())
    }

    /// Whether the device reads region `id` (see [`source`](Self::source)) from device
    /// memory.
    pub fn source_in_device_memory(&self, id: RegionId) -> bool {
        matches!(self.source(id), Ok(virtsoc_svm::Backing::Device(_)))
    }

    /// Whether region `id`'s replica in this device's domain is in device memory.
    pub fn in_device_memory(&self, id: RegionId) -> bool {
        matches!(
            self.svm.replica(self.guest, id, self.domain),
            Ok(virtsoc_svm::Backing::Device(_))
        )
    }

    /// Counts a copy of `n` bytes of frame data this device made in its own memory.
    pub fn count_copy(&self, n: usize, since: std::time::Instant) {
        self.svm
            .count_device_copy(self.guest, self.domain, n as u64, since.elapsed());
    }

    /// Metadata (size, format, dimensions) of region `id` of this guest.
    pub fn meta(&self, id: RegionId) -> Result<virtsoc_svm::RegionMeta, Status> {
        self.svm.meta(self.guest, id).map_err(|e| status_of(&e))
    }
}
