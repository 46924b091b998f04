//! Storage of one replica: a host allocation or a range of the owner's shared window.
//!
//! Host allocations are zeroed lazily by the kernel (calloc-style), so a replica costs memory
//! only where it is touched. Window ranges are accessed only through the window's checked
//! volatile accessors: the guest can change them at any time.

use std::sync::{Arc, Mutex, MutexGuard};

use virtsoc_proto::SharedWindow;

use crate::{Result, SvmError};

/// A replica held in host memory.
#[derive(Debug)]
pub struct HostBuf {
    bytes: Mutex<Box<[u8]>>,
}

impl HostBuf {
    /// A zeroed buffer of `len` bytes.
    pub fn zeroed(len: usize) -> Arc<Self> {
        Arc::new(HostBuf {
            bytes: Mutex::new(vec![0u8; len].into_boxed_slice()),
        })
    }

    /// Locks the bytes.
    pub fn lock(&self) -> MutexGuard<'_, Box<[u8]>> {
        self.bytes.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Where a replica's bytes are.
#[derive(Debug, Clone)]
pub enum Backing {
    /// Host RAM or device-local memory.
    Host(Arc<HostBuf>),
    /// A range of the owning guest's window.
    Window { win: Arc<SharedWindow>, offset: u64 },
}

/// Copies `len` bytes from `src` to `dst`.
pub fn copy_bytes(src: &Backing, dst: &Backing, len: u64) -> Result<()> {
    let n = usize::try_from(len).map_err(|_| SvmError::OutOfRange)?;
    match (src, dst) {
        (Backing::Host(a), Backing::Host(b)) => {
            if Arc::ptr_eq(a, b) {
                return Ok(());
            }
            // Lock in address order so two opposite copies cannot deadlock.
            let a_first = Arc::as_ptr(a) < Arc::as_ptr(b);
            let (ga, mut gb) = if a_first {
                let ga = a.lock();
                (ga, b.lock())
            } else {
                let gb = b.lock();
                (a.lock(), gb)
            };
            let (s, d) = (ga.get(..n), gb.get_mut(..n));
            match (s, d) {
                (Some(s), Some(d)) => d.copy_from_slice(s),
                _ => return Err(SvmError::OutOfRange),
            }
        }
        (Backing::Host(a), Backing::Window { win, offset }) => {
            let g = a.lock();
            win.copy_in(*offset, g.get(..n).ok_or(SvmError::OutOfRange)?)?;
        }
        (Backing::Window { win, offset }, Backing::Host(b)) => {
            let mut g = b.lock();
            win.copy_out(*offset, g.get_mut(..n).ok_or(SvmError::OutOfRange)?)?;
        }
        (Backing::Window { .. }, Backing::Window { .. }) => {
            return Err(SvmError::Internal("window to window copy".into()))
        }
    }
    Ok(())
}
