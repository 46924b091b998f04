//! Storage of one replica: a host allocation or a range of the owner's shared window.
//!
//! Host allocations are anonymous private mappings: page-aligned (so device libraries get the
//! vector-aligned planes their SIMD paths want, see `virtsoc-media`'s scaler) and zeroed
//! lazily by the kernel, so a replica costs memory only where it is touched, and all of it
//! goes back to the system when the replica is dropped. Window ranges are accessed only through the window's checked
//! volatile accessors: the guest can change them at any time.
//!
//! A domain whose device works in another process (the `gles` device's render worker) has its
//! host replicas in memfds instead ([`HostBuf::try_shared`], chosen per domain by
//! [`crate::SvmManager::set_shared_memory`]): the daemon maps the memfd (`MAP_SHARED`) and
//! hands the descriptor ([`HostBuf::memfd`]) to the worker, which maps the same pages. The
//! memfd's size is sealed, so the other process can neither shrink it under the daemon's
//! mapping (a `SIGBUS` here) nor grow it; its first [`SHARED_DATA_OFFSET`] bytes are a page
//! for the other side's own use (a driver that imports the memfd reads a header there), the
//! replica's bytes follow.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use virtsoc_proto::SharedWindow;
use virtsoc_sync::RwLockExt;

use crate::{Result, SvmError};

/// Mappings of at least this many bytes ask for transparent huge pages: a 16 MiB replica is
/// 8 TLB entries instead of 4096, so a device walking it (a fill, a copy) does not evict
/// the other guests' translations from the TLB either (and page walks under a hypervisor's
/// nested paging are the costliest). Only where a replica is touched are pages committed, 2 MiB
/// at a time.
const HUGE_MIN: usize = 2 << 20;

/// Where a shared replica's bytes start in its memfd (the page before is the importer's).
pub const SHARED_DATA_OFFSET: u64 = 4096;

/// Page-aligned, lazily zeroed bytes of an anonymous private mapping (or of a memfd's shared
/// mapping, [`HostBuf::try_shared`]).
#[derive(Debug)]
pub struct PageBytes {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is owned by this value alone and accessed only through `&`/`&mut self`.
unsafe impl Send for PageBytes {}
// SAFETY: shared access hands out only `&[u8]`.
unsafe impl Sync for PageBytes {}

impl PageBytes {
    /// Maps `len` zeroed bytes (no pages are committed until touched).
    fn map(len: usize) -> Result<Self> {
        if len == 0 {
            return Ok(PageBytes {
                ptr: std::ptr::NonNull::dangling(),
                len: 0,
            });
        }
        // SAFETY: a fresh anonymous mapping aliases nothing.
        let p = unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                len,
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                rustix::mm::MapFlags::PRIVATE | rustix::mm::MapFlags::NORESERVE,
            )
        }
        .map_err(|_| SvmError::OutOfMemory)?;
        let ptr = std::ptr::NonNull::new(p.cast::<u8>()).ok_or(SvmError::OutOfMemory)?;
        if len >= HUGE_MIN {
            // SAFETY: the range is the mapping just made; the advice changes only how the
            // kernel backs it (transparent huge pages where it can), not its contents.
            let _ = unsafe { rustix::mm::madvise(p, len, rustix::mm::Advice::LinuxHugepage) };
        }
        Ok(PageBytes { ptr, len })
    }

    /// Maps `len` bytes of `fd` from [`SHARED_DATA_OFFSET`], shared (the memfd holds at
    /// least that many bytes there: [`SharedMemory::new`] sized and sealed it).
    fn map_shared(fd: BorrowedFd<'_>, len: usize) -> Result<Self> {
        if len == 0 {
            return Self::map(0);
        }
        // SAFETY: a fresh shared mapping of a memfd this process made and sealed at a size
        // covering the range (it cannot shrink under the mapping); it aliases no Rust
        // object of this process. The other process mapping the memfd writes it only
        // while it has the replica's access (the device's protocol), like any device.
        let p = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                rustix::mm::MapFlags::SHARED,
                fd,
                SHARED_DATA_OFFSET,
            )
        }
        .map_err(|_| SvmError::OutOfMemory)?;
        let ptr = std::ptr::NonNull::new(p.cast::<u8>()).ok_or(SvmError::OutOfMemory)?;
        if len >= HUGE_MIN {
            // SAFETY: as in `map`: advice on the mapping just made.
            let _ = unsafe { rustix::mm::madvise(p, len, rustix::mm::Advice::LinuxHugepage) };
        }
        Ok(PageBytes { ptr, len })
    }
}

/// The memfd of a shared replica ([`HostBuf::try_shared`]): [`SHARED_DATA_OFFSET`] bytes for
/// the importer, then the replica's bytes, rounded up to a page; sealed at that size.
#[derive(Debug)]
pub struct SharedMemory {
    fd: OwnedFd,
    len: u64,
}

impl SharedMemory {
    /// A sealed memfd for a replica of `len` bytes.
    fn new(len: usize) -> Result<SharedMemory> {
        use rustix::fs::{MemfdFlags, SealFlags};
        let data = (len as u64).next_multiple_of(SHARED_DATA_OFFSET);
        let total = SHARED_DATA_OFFSET
            .checked_add(data)
            .ok_or(SvmError::OutOfMemory)?;
        let fd = rustix::fs::memfd_create(
            "virtsoc-replica",
            MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
        )
        .map_err(|e| SvmError::Internal(format!("memfd_create: {e}")))?;
        rustix::fs::ftruncate(&fd, total).map_err(|_| SvmError::OutOfMemory)?;
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)
            .map_err(|e| SvmError::Internal(format!("sealing a memfd: {e}")))?;
        Ok(SharedMemory { fd, len: total })
    }

    /// The descriptor (to pass to another process; it stays this replica's).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// The memfd's size in bytes (sealed).
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the memfd holds no replica bytes (only the importer's page).
    pub fn is_empty(&self) -> bool {
        self.len <= SHARED_DATA_OFFSET
    }
}

impl Drop for PageBytes {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: the mapping came from `map` with this length and is unmapped once.
            let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len) };
        }
    }
}

impl std::ops::Deref for PageBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `len` readable bytes live at `ptr` as long as `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for PageBytes {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

/// A replica held in host memory. Readers share it (a device reading a replica in place
/// while the copy engine copies it out); a writer has it alone.
#[derive(Debug)]
pub struct HostBuf {
    bytes: RwLock<PageBytes>,
    /// The memfd the bytes are a shared mapping of, for a shared replica.
    shared: Option<SharedMemory>,
}

impl HostBuf {
    /// A zeroed, page-aligned buffer of `len` bytes; `OutOfMemory` when it cannot be mapped.
    pub fn try_zeroed(len: usize) -> Result<Arc<Self>> {
        Ok(Arc::new(HostBuf {
            bytes: RwLock::new(PageBytes::map(len)?),
            shared: None,
        }))
    }

    /// A zeroed buffer of `len` bytes in a sealed memfd of its own, mapped shared, which
    /// another process may map too ([`memfd`](Self::memfd)). Never pooled: a freed replica's
    /// memfd is never another region's.
    pub fn try_shared(len: usize) -> Result<Arc<Self>> {
        let mem = SharedMemory::new(len)?;
        let bytes = PageBytes::map_shared(mem.fd(), len)?;
        Ok(Arc::new(HostBuf {
            bytes: RwLock::new(bytes),
            shared: Some(mem),
        }))
    }

    /// The memfd of a shared buffer ([`try_shared`](Self::try_shared)); `None` for an
    /// anonymous one.
    pub fn memfd(&self) -> Option<&SharedMemory> {
        self.shared.as_ref()
    }

    /// A zeroed buffer of `len` bytes (tests and measurements; panics when out of memory).
    pub fn zeroed(len: usize) -> Arc<Self> {
        Self::try_zeroed(len).expect("map a host buffer")
    }

    /// Locks the bytes for writing (alone).
    pub fn lock(&self) -> RwLockWriteGuard<'_, PageBytes> {
        self.bytes.write_or_recover()
    }

    /// Locks the bytes for reading (shared with other readers).
    pub fn read(&self) -> RwLockReadGuard<'_, PageBytes> {
        self.bytes.read_or_recover()
    }
}

/// Locks two distinct host buffers, `a` to read and `b` to write, in address order so that
/// two threads locking the same pair the other way round cannot deadlock; `None` when they
/// are the same buffer.
pub fn lock_two<'a>(
    a: &'a Arc<HostBuf>,
    b: &'a Arc<HostBuf>,
) -> Option<(
    RwLockReadGuard<'a, PageBytes>,
    RwLockWriteGuard<'a, PageBytes>,
)> {
    if Arc::ptr_eq(a, b) {
        return None;
    }
    Some(if Arc::as_ptr(a) < Arc::as_ptr(b) {
        let ga = a.read();
        (ga, b.lock())
    } else {
        let gb = b.lock();
        (a.read(), gb)
    })
}

/// Memory owned by a physical device (a GPU's textures or buffers): the copy engine moves
/// bytes in (an upload) and out (a readback) through it, and the owning device reaches its
/// native object through [`DeviceMemory::as_any`]. Offsets and lengths are in the region's
/// linear byte layout (planes at their offsets, rows `stride` apart), so a sub-range copy
/// moves only that sub-range.
pub trait DeviceMemory: Send + Sync + std::fmt::Debug {
    /// Copies `src` into bytes `[offset, offset + src.len())` (an upload).
    fn write(&self, offset: u64, src: &[u8]) -> Result<()>;
    /// Copies bytes `[offset, offset + dst.len())` into `dst` (a readback).
    fn read(&self, offset: u64, dst: &mut [u8]) -> Result<()>;
    /// The device's own object behind this memory (for the owning device to downcast).
    fn as_any(&self) -> &dyn std::any::Any;
}

/// Allocates a domain's replicas in the device's own memory (see
/// [`crate::SvmManager::set_allocator`]).
pub trait DeviceAllocator: Send + Sync {
    /// Memory for one replica of a region with metadata `meta`, or `None` when the device
    /// keeps such regions in host memory (e.g. command records in a blob).
    fn alloc(&self, meta: &crate::RegionMeta) -> Result<Option<std::sync::Arc<dyn DeviceMemory>>>;
}

/// Where a replica's bytes are.
#[derive(Debug, Clone)]
pub enum Backing {
    /// Host RAM, or the local memory of a device that works on host-addressable bytes.
    Host(Arc<HostBuf>),
    /// A range of the owning guest's window.
    Window {
        /// The owning guest's window.
        win: Arc<SharedWindow>,
        /// Where the replica starts in the window, in bytes.
        offset: u64,
    },
    /// A device's own memory (GPU textures): reached only through uploads and readbacks.
    Device(Arc<dyn DeviceMemory>),
}

/// Bytes moved per step when a copy has to pass through a bounce buffer (two devices'
/// memories): small enough to stay in cache, so the bytes cross memory once.
const BOUNCE: usize = 1 << 20;

/// Runs `f` on bytes `[offset, offset + len)` of `win` in place (bounds checked).
fn with_window_bytes(
    win: &SharedWindow,
    offset: u64,
    len: usize,
    f: impl FnOnce(&mut [u8]) -> Result<()>,
) -> Result<()> {
    let s = win.slice(offset, len as u64)?;
    let guard = s.ptr_guard_mut();
    // SAFETY: `slice` checked that `len` bytes at the pointer lie inside the window's
    // mapping, which `win` keeps mapped for the whole call. The guest may write these bytes
    // concurrently (it shares the mapping): they are only copied as opaque data by the
    // device's upload or readback (a memcpy), never interpreted or validated by the host, so
    // a racing guest write changes only which pixel values land in its own replica, as it
    // would through the window's volatile accessors.
    let bytes = unsafe { std::slice::from_raw_parts_mut(guard.as_ptr(), len) };
    f(bytes)
}

/// Copies bytes `[off, off + len)` of the region from `src` to `dst`. With `stream` (a copy
/// made ahead of its reader, e.g. a prefetch) a host-to-host copy of at least
/// [`crate::stream::STREAM_MIN`] bytes bypasses the CPU caches (see [`crate::stream`]); else,
/// and for copies through a window or device memory, the bytes go through the caches.
pub fn copy_range(src: &Backing, dst: &Backing, off: u64, len: u64, stream: bool) -> Result<()> {
    let n = usize::try_from(len).map_err(|_| SvmError::OutOfRange)?;
    let o = usize::try_from(off).map_err(|_| SvmError::OutOfRange)?;
    let end = o.checked_add(n).ok_or(SvmError::OutOfRange)?;
    match (src, dst) {
        (Backing::Host(a), Backing::Host(b)) => {
            let Some((ga, mut gb)) = lock_two(a, b) else {
                return Ok(());
            };
            match (ga.get(o..end), gb.get_mut(o..end)) {
                (Some(s), Some(d)) if stream => crate::stream::copy(d, s),
                (Some(s), Some(d)) => d.copy_from_slice(s),
                _ => return Err(SvmError::OutOfRange),
            }
        }
        (Backing::Host(a), Backing::Window { win, offset }) => {
            let g = a.read();
            win.copy_in(offset + off, g.get(o..end).ok_or(SvmError::OutOfRange)?)?;
        }
        (Backing::Window { win, offset }, Backing::Host(b)) => {
            let mut g = b.lock();
            win.copy_out(offset + off, g.get_mut(o..end).ok_or(SvmError::OutOfRange)?)?;
        }
        (Backing::Host(a), Backing::Device(d)) => {
            let g = a.read();
            d.write(off, g.get(o..end).ok_or(SvmError::OutOfRange)?)?;
        }
        (Backing::Device(d), Backing::Host(b)) => {
            let mut g = b.lock();
            d.read(off, g.get_mut(o..end).ok_or(SvmError::OutOfRange)?)?;
        }
        (Backing::Device(a), Backing::Device(b)) if Arc::ptr_eq(a, b) => {}
        (Backing::Window { .. }, Backing::Window { .. }) => {
            return Err(SvmError::Internal("window to window copy".into()))
        }
        // Window <-> device: the device's upload or readback reads or writes the window's
        // bytes where they are (no bounce buffer, no extra memcpy).
        (Backing::Window { win, offset }, Backing::Device(d)) => {
            with_window_bytes(win, offset + off, n, |b| d.write(off, b))?
        }
        (Backing::Device(d), Backing::Window { win, offset }) => {
            with_window_bytes(win, offset + off, n, |b| d.read(off, b))?
        }
        // Device <-> device (two devices' memories): a readback, then an upload, through a
        // cache-sized buffer.
        (Backing::Device(a), Backing::Device(b)) => {
            let mut bounce = vec![0u8; n.min(BOUNCE)];
            let mut at = off;
            while at < off + len {
                let step = ((off + len - at) as usize).min(BOUNCE);
                let chunk = &mut bounce[..step];
                a.read(at, chunk)?;
                b.write(at, chunk)?;
                at += step as u64;
            }
        }
    }
    Ok(())
}
