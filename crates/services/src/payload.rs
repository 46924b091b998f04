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
    /// Runs `f` on the input's bytes, in order, a chunk at a time (in place where the input
    /// is memory the service can read directly).
    fn for_each_chunk(&self, f: &mut dyn FnMut(&[u8])) -> Result<()> {
        let n = self.len();
        let mut buf = vec![0u8; n.min(1 << 20)];
        let mut at = 0;
        while at < n {
            let k = (n - at).min(buf.len());
            self.read_at(at, &mut buf[..k])?;
            f(&buf[..k]);
            at += k;
        }
        Ok(())
    }
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
    fn for_each_chunk(&self, f: &mut dyn FnMut(&[u8])) -> Result<()> {
        f(self);
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
    /// In place (a reassembled transfer is read where it is, not through a buffer).
    fn for_each_chunk(&self, f: &mut dyn FnMut(&[u8])) -> Result<()> {
        f(self);
        Ok(())
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

impl WindowBytes {
    /// Runs `f` on `len` bytes at `offset` of this range, in place.
    fn with_ptr<T>(&self, offset: usize, len: usize, f: impl FnOnce(*mut u8) -> T) -> Result<T> {
        let off = range(offset, len, self.len)?;
        let s = self.win.slice(self.at + off, len as u64)?;
        let guard = s.ptr_guard_mut();
        Ok(f(guard.as_ptr()))
    }
}

impl Input for WindowBytes {
    fn len(&self) -> usize {
        self.len
    }
    fn read_at(&self, offset: usize, buf: &mut [u8]) -> Result<()> {
        self.with_ptr(offset, buf.len(), |p| {
            // SAFETY: `with_ptr` checked that `buf.len()` bytes at `p` lie inside the
            // window's mapping, which `self.win` keeps mapped. The guest may write them
            // concurrently: they are copied as opaque bytes (the copy's result is the
            // guest's own data either way), and `buf` is the host's, so the two never
            // overlap.
            unsafe { std::ptr::copy_nonoverlapping(p, buf.as_mut_ptr(), buf.len()) }
        })
    }
    fn for_each_chunk(&self, f: &mut dyn FnMut(&[u8])) -> Result<()> {
        self.with_ptr(0, self.len, |p| {
            // SAFETY: as in `read_at`: bounds checked, mapping kept; the bytes are only
            // read as opaque data (copied, checksummed), so a racing guest write changes
            // only the result the guest gets for its own data.
            f(unsafe { std::slice::from_raw_parts(p, self.len) })
        })
    }
}

impl Output for WindowBytes {
    fn capacity(&self) -> usize {
        self.len
    }
    fn write_at(&mut self, offset: usize, bytes: &[u8]) -> Result<()> {
        self.with_ptr(offset, bytes.len(), |p| {
            // SAFETY: bounds checked by `with_ptr`, mapping kept by `self.win`. `bytes` may
            // be window memory too (an echo between two ranges of one window), so the copy
            // allows overlap.
            unsafe { std::ptr::copy(bytes.as_ptr(), p, bytes.len()) }
        })
    }
}

/// Copies `input` into `out` (in place where both are window memory).
pub fn copy(input: &dyn Input, out: &mut dyn Output) -> Result<usize> {
    let n = input.len();
    if n > out.capacity() {
        return Err(ServiceError::BadArgument(format!(
            "{n} bytes do not fit an output of {}",
            out.capacity()
        )));
    }
    let mut at = 0;
    let mut err = None;
    input.for_each_chunk(&mut |chunk| {
        if err.is_none() {
            err = out.write_at(at, chunk).err();
            at += chunk.len();
        }
    })?;
    err.map_or(Ok(n), Err)
}

/// CRC-32 of `input` (read in place where it is window memory).
pub fn crc(input: &dyn Input) -> Result<u32> {
    let mut h = crc32fast::Hasher::new();
    input.for_each_chunk(&mut |chunk| h.update(chunk))?;
    Ok(h.finalize())
}

/// Reads every byte of `input` once, where it is (in place in the guest's window for a
/// region or a slot), as a consumer that uses the bytes without keeping a copy: answers
/// the bytes read and the wrapping sum of the input's little-endian 64-bit words (its last
/// partial word zero-padded), so that the reads cannot be left out.
pub fn drain(input: &dyn Input) -> Result<(usize, u64)> {
    let mut n = 0usize;
    let mut sum = 0u64;
    let mut tail = [0u8; 8];
    let mut held = 0usize;
    input.for_each_chunk(&mut |chunk| {
        let mut c = chunk;
        if held > 0 {
            let k = (8 - held).min(c.len());
            tail[held..held + k].copy_from_slice(&c[..k]);
            held += k;
            c = &c[k..];
            if held == 8 {
                sum = sum.wrapping_add(u64::from_le_bytes(tail));
                held = 0;
            }
        }
        let words = c.chunks_exact(8);
        let rest = words.remainder();
        sum = words.fold(sum, |s, w| {
            let mut b = [0u8; 8];
            b.copy_from_slice(w);
            s.wrapping_add(u64::from_le_bytes(b))
        });
        tail[..rest.len()].copy_from_slice(rest);
        held = rest.len();
        n += chunk.len();
    })?;
    if held > 0 {
        tail[held..].fill(0);
        sum = sum.wrapping_add(u64::from_le_bytes(tail));
    }
    Ok((n, sum))
}

/// [`drain`]'s sum of `bytes` (what the guest checks a drain against).
pub fn word_sum(bytes: &[u8]) -> u64 {
    drain(&bytes).map_or(0, |(_, s)| s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use virtsoc_proto::WindowLayout;

    #[test]
    fn window_bytes_copy_and_checksum_in_place() {
        let l = WindowLayout::new(1 << 20, 4, 4).unwrap();
        let w = Arc::new(SharedWindow::create_memfd("payload", l).unwrap());
        let data: Vec<u8> = (0..70_000u32).map(|i| (i % 251) as u8).collect();
        let mut a = WindowBytes::new(w.clone(), 4096, data.len()).unwrap();
        a.write_at(0, &data).unwrap();
        let mut b = WindowBytes::new(w.clone(), 200_000, data.len()).unwrap();
        assert_eq!(copy(&a, &mut b).unwrap(), data.len());
        assert_eq!(b.to_vec().unwrap(), data);
        assert_eq!(crc(&b).unwrap(), crc32fast::hash(&data));
        let (n, sum) = drain(&b).unwrap();
        assert_eq!(n, data.len());
        let want = data.chunks(8).fold(0u64, |s, w| {
            let mut t = [0u8; 8];
            t[..w.len()].copy_from_slice(w);
            s.wrapping_add(u64::from_le_bytes(t))
        });
        assert_eq!(sum, want);
        assert_eq!(word_sum(&data), want);
        assert!(b.write_at(data.len() - 1, &[1, 2]).is_err());
        assert!(WindowBytes::new(w, (1 << 20) - 10, 11).is_err());
        let mut small = vec![0u8; 10];
        assert!(copy(&a, &mut small).is_err());
    }
}
