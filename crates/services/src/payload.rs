//! What a service call reads and writes: bytes in guest memory, read and written in place
//! through the bounds-checked window ([`WindowBytes`]), or bytes the host holds (a
//! reassembled transfer, a test's buffer).

use std::sync::Arc;

use virtsoc_proto::SharedWindow;

use crate::{Result, ServiceError};

/// Bytes a call reads.
pub trait Input {
    /// Its length.
    fn len(&self) -> usize;
    /// Whether it is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Copies `buf.len()` bytes from `offset` into `buf`.
    fn read_at(&self, offset: usize, buf: &mut [u8]) -> Result<()>;
    /// The whole input, copied.
    fn to_vec(&self) -> Result<Vec<u8>> {
        let mut v = vec![0u8; self.len()];
        self.read_at(0, &mut v)?;
        Ok(v)
    }
}

/// Bytes a call writes.
pub trait Output {
    /// Bytes it can take.
    fn capacity(&self) -> usize;
    /// Writes `bytes` at `offset`.
    fn write_at(&mut self, offset: usize, bytes: &[u8]) -> Result<()>;
}

fn range(offset: usize, len: usize, size: usize) -> Result<u64> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(offset as u64),
        _ => Err(ServiceError::BadArgument(format!(
            "{len} bytes at {offset} outside a payload of {size}"
        ))),
    }
}

impl Input for &[u8] {
    fn len(&self) -> usize {
        <[u8]>::len(self)
    }
    fn read_at(&self, offset: usize, buf: &mut [u8]) -> Result<()> {
        let at = range(offset, buf.len(), <[u8]>::len(self))? as usize;
        buf.copy_from_slice(&self[at..at + buf.len()]);
        Ok(())
    }
}

impl Input for Vec<u8> {
    fn len(&self) -> usize {
        <[u8]>::len(self)
    }
    fn read_at(&self, offset: usize, buf: &mut [u8]) -> Result<()> {
        self.as_slice().read_at(offset, buf)
    }
}

impl Output for Vec<u8> {
    fn capacity(&self) -> usize {
        self.len()
    }
    fn write_at(&mut self, offset: usize, bytes: &[u8]) -> Result<()> {
        let at = range(offset, bytes.len(), self.len())? as usize;
        self[at..at + bytes.len()].copy_from_slice(bytes);
        Ok(())
    }
}

/// A range of a guest's window, read and written in place.
#[derive(Clone)]
pub struct WindowBytes {
    win: Arc<SharedWindow>,
    at: u64,
    len: usize,
}

impl WindowBytes {
    /// `len` bytes at window offset `at` (checked against the mapping).
    pub fn new(win: Arc<SharedWindow>, at: u64, len: usize) -> Result<Self> {
        win.check(at, len as u64)?;
        Ok(WindowBytes { win, at, len })
    }

    /// The first `len` bytes of this range.
    pub fn prefix(&self, len: usize) -> Result<Self> {
        range(0, len, self.len)?;
        Ok(WindowBytes {
            win: self.win.clone(),
            at: self.at,
            len,
        })
    }
}

impl Input for WindowBytes {
    fn len(&self) -> usize {
        self.len
    }
    fn read_at(&self, offset: usize, buf: &mut [u8]) -> Result<()> {
        let off = range(offset, buf.len(), self.len)?;
        Ok(self.win.copy_out(self.at + off, buf)?)
    }
}

impl Output for WindowBytes {
    fn capacity(&self) -> usize {
        self.len
    }
    fn write_at(&mut self, offset: usize, bytes: &[u8]) -> Result<()> {
        let off = range(offset, bytes.len(), self.len)?;
        Ok(self.win.copy_in(self.at + off, bytes)?)
    }
}

/// Copies `input` into `out` in chunks of at most 1 MiB (no whole-payload buffer).
pub fn copy(input: &dyn Input, out: &mut dyn Output) -> Result<usize> {
    let n = input.len();
    if n > out.capacity() {
        return Err(ServiceError::BadArgument(format!(
            "{n} bytes do not fit an output of {}",
            out.capacity()
        )));
    }
    let mut buf = vec![0u8; n.min(1 << 20)];
    let mut at = 0;
    while at < n {
        let k = (n - at).min(buf.len());
        input.read_at(at, &mut buf[..k])?;
        out.write_at(at, &buf[..k])?;
        at += k;
    }
    Ok(n)
}

/// CRC-32 of `input`, read in chunks of at most 1 MiB.
pub fn crc(input: &dyn Input) -> Result<u32> {
    let n = input.len();
    let mut h = crc32fast::Hasher::new();
    let mut buf = vec![0u8; n.min(1 << 20)];
    let mut at = 0;
    while at < n {
        let k = (n - at).min(buf.len());
        input.read_at(at, &mut buf[..k])?;
        h.update(&buf[..k]);
        at += k;
    }
    Ok(h.finalize())
}
