//! A mapped shared window with bounds-checked access.
//!
//! Both sides map the same file (a memfd for process guests, the ivshmem memory file or the
//! PCI BAR for VM guests) with vm-memory's [`MmapRegion`]. Every access names an offset and a
//! length that are checked against the mapping; values are copied out before use.

use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::AtomicU32;
use std::sync::Arc;

use vm_memory::{ByteValued, Bytes, FileOffset, MmapRegion, VolatileMemory, VolatileSlice};

use crate::window_layout::WindowLayout;
use crate::{ProtoError, Result};

/// One mapping of a shared window.
pub struct SharedWindow {
    map: MmapRegion<()>,
    file: Arc<File>,
    layout: WindowLayout,
}

impl std::fmt::Debug for SharedWindow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedWindow")
            .field("layout", &self.layout)
            .finish()
    }
}

impl SharedWindow {
    /// Creates a fresh anonymous memfd of `layout.size` bytes and maps it (host side).
    pub fn create_memfd(name: &str, layout: WindowLayout) -> Result<Self> {
        layout.validate()?;
        let fd = rustix::fs::memfd_create(
            name,
            rustix::fs::MemfdFlags::CLOEXEC | rustix::fs::MemfdFlags::ALLOW_SEALING,
        )
        .map_err(std::io::Error::from)?;
        let file = File::from(fd);
        file.set_len(layout.size)?;
        // The guest must not be able to shrink the file under the host's mapping (SIGBUS).
        rustix::fs::fcntl_add_seals(
            &file,
            rustix::fs::SealFlags::SHRINK | rustix::fs::SealFlags::GROW,
        )
        .map_err(std::io::Error::from)?;
        Self::map_file(file, layout)
    }

    /// Maps an existing file (guest side, or a VM's memory-backend file).
    pub fn map_file(file: File, layout: WindowLayout) -> Result<Self> {
        layout.validate()?;
        let len = file.metadata()?.len();
        if len < layout.size {
            return Err(ProtoError::Layout(format!(
                "window file has {len} bytes, layout needs {}",
                layout.size
            )));
        }
        let file = Arc::new(file);
        let size = usize::try_from(layout.size)
            .map_err(|_| ProtoError::Layout("window too large".into()))?;
        let map = MmapRegion::from_file(FileOffset::from_arc(file.clone(), 0), size)
            .map_err(ProtoError::Mmap)?;
        Ok(SharedWindow { map, file, layout })
    }

    /// The layout this window was mapped with.
    pub fn layout(&self) -> WindowLayout {
        self.layout
    }

    /// The file behind the mapping (to pass to the peer).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }

    /// Base address of the mapping in this process. Only the guest library hands pointers
    /// derived from it to its callers; the host uses the checked accessors.
    pub fn base_ptr(&self) -> *mut u8 {
        self.map.as_ptr()
    }

    /// Size of the mapping.
    pub fn size(&self) -> u64 {
        self.layout.size
    }

    /// Checks that `[offset, offset + len)` lies inside the window.
    pub fn check(&self, offset: u64, len: u64) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.layout.size => Ok(()),
            _ => Err(ProtoError::OutOfBounds {
                offset,
                len,
                size: self.layout.size,
            }),
        }
    }

    /// A volatile view of `[offset, offset + len)`.
    pub fn slice(&self, offset: u64, len: u64) -> Result<VolatileSlice<'_>> {
        self.check(offset, len)?;
        self.map
            .get_slice(offset as usize, len as usize)
            .map_err(|_| self.oob(offset, len))
    }

    /// The 32-bit atomic at `offset` (must be 4-byte aligned).
    pub fn atomic_u32(&self, offset: u64) -> Result<&AtomicU32> {
        self.check(offset, 4)?;
        self.map
            .get_atomic_ref::<AtomicU32>(offset as usize)
            .map_err(|_| self.oob(offset, 4))
    }

    /// Copies a value out of the window.
    pub fn read_obj<T: ByteValued>(&self, offset: u64) -> Result<T> {
        self.slice(offset, std::mem::size_of::<T>() as u64)?
            .read_obj(0)
            .map_err(|_| self.oob(offset, std::mem::size_of::<T>() as u64))
    }

    /// Copies a value into the window.
    pub fn write_obj<T: ByteValued>(&self, offset: u64, val: T) -> Result<()> {
        self.slice(offset, std::mem::size_of::<T>() as u64)?
            .write_obj(val, 0)
            .map_err(|_| self.oob(offset, std::mem::size_of::<T>() as u64))
    }

    /// Copies `dst.len()` bytes starting at `offset` out of the window.
    pub fn copy_out(&self, offset: u64, dst: &mut [u8]) -> Result<()> {
        let s = self.slice(offset, dst.len() as u64)?;
        s.copy_to(dst);
        Ok(())
    }

    /// Copies `src` into the window at `offset`.
    pub fn copy_in(&self, offset: u64, src: &[u8]) -> Result<()> {
        let s = self.slice(offset, src.len() as u64)?;
        s.copy_from(src);
        Ok(())
    }

    /// Fills `[offset, offset + len)` with zeroes.
    pub fn zero(&self, offset: u64, len: u64) -> Result<()> {
        self.check(offset, len)?;
        let zeros = [0u8; 64 * 1024];
        let mut done = 0;
        while done < len {
            let n = (len - done).min(zeros.len() as u64);
            self.copy_in(offset + done, &zeros[..n as usize])?;
            done += n;
        }
        Ok(())
    }

    fn oob(&self, offset: u64, len: u64) -> ProtoError {
        ProtoError::OutOfBounds {
            offset,
            len,
            size: self.layout.size,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checked_access() {
        let l = WindowLayout::new(1 << 16, 4, 4).unwrap();
        let w = SharedWindow::create_memfd("t", l).unwrap();
        w.write_obj(100u64, 0xdead_beef_u64).unwrap();
        assert_eq!(w.read_obj::<u64>(100).unwrap(), 0xdead_beef);
        assert!(w.read_obj::<u64>((1 << 16) - 4).is_err());
        assert!(w.slice(u64::MAX - 1, 4).is_err());
        assert!(w.atomic_u32(2).is_err(), "misaligned atomic must fail");
        let mut buf = [0u8; 8];
        w.copy_out(100, &mut buf).unwrap();
        assert_eq!(u64::from_le_bytes(buf), 0xdead_beef);
    }

    #[test]
    fn two_mappings_share_bytes() {
        let l = WindowLayout::new(1 << 16, 4, 4).unwrap();
        let a = SharedWindow::create_memfd("t", l).unwrap();
        let f = File::from(a.fd().try_clone_to_owned().unwrap());
        let b = SharedWindow::map_file(f, l).unwrap();
        a.write_obj(4096, 7u32).unwrap();
        assert_eq!(b.read_obj::<u32>(4096).unwrap(), 7);
    }
}
