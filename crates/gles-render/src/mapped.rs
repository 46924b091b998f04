//! The replicas the daemon shares with the worker ([`egl::MAP`](virtsoc_gles_stream::egl::MAP)):
//! memfds of the guest's regions in the `gles` memory domain, each mapped here under the
//! daemon's handle until [`egl::UNMAP`](virtsoc_gles_stream::egl::UNMAP). The worker reads
//! batches, image pixels and uploads where the SVM put them, and writes frames and answers
//! there, with no copy through the socket.
//!
//! A memfd's first page is the importer's (a driver importing the memfd as GL memory reads
//! a header there, [`crate::memobj`]); the replica's bytes follow ([`DATA_OFFSET`]). The
//! daemon sealed the memfd's size, so the mapping cannot shrink under the worker. The table
//! is bounded ([`MAX_MAPPINGS`]): the daemon keeps its own within that and unmaps what it
//! drops.

use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

/// Where the replica's bytes start in a shared memfd (`virtsoc_svm::SHARED_DATA_OFFSET`;
/// the worker does not link the SVM).
pub const DATA_OFFSET: usize = 4096;
/// Most mappings a worker holds at once.
pub const MAX_MAPPINGS: usize = 256;

/// What is wrong with a MAP.
#[derive(Debug, thiserror::Error)]
pub enum MapError {
    /// A zero handle, one already mapped, or a full table.
    #[error("mapping {0}: {1}")]
    Handle(u32, &'static str),
    /// The memfd is smaller than its page and the replica's bytes, or mmap failed.
    #[error("mapping {handle}: {what}")]
    Os {
        /// The handle.
        handle: u32,
        /// What failed.
        what: String,
    },
}

/// One shared replica, mapped.
pub struct Mapping {
    ptr: std::ptr::NonNull<u8>,
    /// The whole mapping (the memfd's size).
    map_len: usize,
    /// The replica's bytes after the first page.
    len: usize,
    fd: OwnedFd,
}

impl Mapping {
    /// Maps `fd` (the memfd of a replica of `len` bytes) whole, shared, readable and
    /// writable.
    fn new(handle: u32, fd: OwnedFd, len: u64) -> Result<Mapping, MapError> {
        let os = |what: String| MapError::Os { handle, what };
        // SAFETY: fstat fills one `stat` of a descriptor this value owns. (Not
        // `File::metadata`: it asks `statx`, which the sandbox does not allow.)
        let size = unsafe {
            let mut st: libc::stat = std::mem::zeroed();
            if libc::fstat(std::os::fd::AsRawFd::as_raw_fd(&fd), &mut st) != 0 {
                return Err(os(format!("fstat: {}", std::io::Error::last_os_error())));
            }
            st.st_size as u64
        };
        let need = len.checked_add(DATA_OFFSET as u64);
        if !need.is_some_and(|n| n <= size) || size > isize::MAX as u64 {
            return Err(os(format!("{size}-byte memfd for a {len}-byte replica")));
        }
        let map_len = size as usize;
        // SAFETY: a fresh shared mapping of the whole memfd, which the daemon sealed at this
        // size (it cannot shrink under the mapping); it aliases no Rust object.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                std::os::fd::AsRawFd::as_raw_fd(&fd),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(os(format!("mmap: {}", std::io::Error::last_os_error())));
        }
        let ptr = std::ptr::NonNull::new(p.cast::<u8>()).ok_or_else(|| os("mmap: null".into()))?;
        Ok(Mapping {
            ptr,
            map_len,
            len: len as usize,
            fd,
        })
    }

    /// The replica's bytes.
    ///
    /// The daemon and the SVM's copy engine write these pages only while no device access
    /// of the worker's is using them (the daemon holds the guest's access for each batch it
    /// sends), and the guest reaches them only through the SVM: while the worker reads
    /// them, nobody writes them.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `len` bytes at DATA_OFFSET lie inside the mapping (checked in `new`),
        // mapped for as long as `self`; see above for who writes them.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(DATA_OFFSET), self.len) }
    }

    /// The replica's bytes, to write (a frame, the answers of a batch).
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`; `&mut self` makes the access exclusive in this process.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(DATA_OFFSET), self.len) }
    }

    /// The importer's page (a driver's header, [`crate::memobj`]).
    pub fn header_mut(&mut self) -> &mut [u8] {
        // SAFETY: the first DATA_OFFSET bytes lie inside the mapping (its size is at least
        // DATA_OFFSET plus the replica's, checked in `new`); `&mut self` makes it exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), DATA_OFFSET) }
    }

    /// The memfd (to import into the driver).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// The memfd's size in bytes.
    pub fn memfd_len(&self) -> usize {
        self.map_len
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.map_len) };
    }
}

/// The worker's mappings, by the daemon's handle.
#[derive(Default)]
pub struct Mappings {
    map: HashMap<u32, Mapping>,
}

// SAFETY: the mappings are used from the worker's one thread; the pointers are owned.
unsafe impl Send for Mappings {}

impl Mappings {
    /// Maps `fd` under `handle` for a replica of `len` bytes.
    pub fn map(&mut self, handle: u32, fd: OwnedFd, len: u64) -> Result<(), MapError> {
        if handle == 0 {
            return Err(MapError::Handle(handle, "zero"));
        }
        if self.map.contains_key(&handle) {
            return Err(MapError::Handle(handle, "already mapped"));
        }
        if self.map.len() >= MAX_MAPPINGS {
            return Err(MapError::Handle(handle, "too many mappings"));
        }
        let m = Mapping::new(handle, fd, len)?;
        self.map.insert(handle, m);
        Ok(())
    }

    /// Unmaps `handle` (nothing when unknown); returns the mapping, for its owner to drop
    /// what it made of it first.
    pub fn unmap(&mut self, handle: u32) -> Option<Mapping> {
        self.map.remove(&handle)
    }

    /// The mapping of `handle`.
    pub fn get(&self, handle: u32) -> Option<&Mapping> {
        self.map.get(&handle)
    }

    /// The mapping of `handle`, to write.
    pub fn get_mut(&mut self, handle: u32) -> Option<&mut Mapping> {
        self.map.get_mut(&handle)
    }

    /// Takes mapping `handle` out of the table (to run a batch out of it while the table is
    /// used); [`put`](Self::put) brings it back.
    pub fn take(&mut self, handle: u32) -> Option<Mapping> {
        self.map.remove(&handle)
    }

    /// Puts a mapping taken with [`take`](Self::take) back.
    pub fn put(&mut self, handle: u32, m: Mapping) {
        self.map.insert(handle, m);
    }

    /// How many mappings are held.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    fn memfd(len: u64) -> OwnedFd {
        // SAFETY: a NUL-terminated name.
        let raw = unsafe { libc::memfd_create(c"t".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(raw >= 0);
        // SAFETY: a fresh descriptor owned here.
        let fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(raw) };
        std::fs::File::from(fd.try_clone().unwrap())
            .set_len(len)
            .unwrap();
        fd
    }

    #[test]
    fn mappings_share_the_pages_and_are_bounded() {
        let fd = memfd(8192);
        let file = std::fs::File::from(fd.try_clone().unwrap());
        file.write_all_at(b"batch", DATA_OFFSET as u64).unwrap();
        let mut m = Mappings::default();
        m.map(7, fd, 100).unwrap();
        assert_eq!(&m.get(7).unwrap().bytes()[..5], b"batch");
        assert_eq!(m.get(7).unwrap().bytes().len(), 100);
        m.get_mut(7).unwrap().bytes_mut()[..3].copy_from_slice(b"ans");
        let mut back = [0u8; 3];
        file.read_exact_at(&mut back, DATA_OFFSET as u64).unwrap();
        assert_eq!(&back, b"ans");
        // Refused: handle 0, a taken handle, a replica larger than the memfd.
        assert!(m.map(0, memfd(8192), 1).is_err());
        assert!(m.map(7, memfd(8192), 1).is_err());
        assert!(m.map(8, memfd(8192), 4097).is_err());
        assert!(m.map(9, memfd(100), 0).is_err(), "no importer's page");
        assert!(m.unmap(7).is_some());
        assert!(m.get(7).is_none());
        for h in 1..=MAX_MAPPINGS as u32 {
            m.map(h, memfd(4096), 0).unwrap();
        }
        assert!(m.map(MAX_MAPPINGS as u32 + 1, memfd(4096), 0).is_err());
        assert_eq!(m.len(), MAX_MAPPINGS);
    }
}
