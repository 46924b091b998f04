//! A first-fit range allocator for the guest-visible data area of a window.
//!
//! Free space is a sorted map of ranges that grows and shrinks with use (no fixed table);
//! freed ranges coalesce with their neighbours.

use std::collections::BTreeMap;

/// Hands out page-aligned ranges of `[base, base + size)`.
#[derive(Debug)]
pub struct RangeAllocator {
    free: BTreeMap<u64, u64>,
    align: u64,
    free_bytes: u64,
}

impl RangeAllocator {
    /// A new allocator over `[base, base + size)`; `align` must be a power of two.
    pub fn new(base: u64, size: u64, align: u64) -> Self {
        assert!(align.is_power_of_two());
        let mut free = BTreeMap::new();
        if size > 0 {
            free.insert(base, size);
        }
        RangeAllocator {
            free,
            align,
            free_bytes: size,
        }
    }

    /// Bytes currently free.
    pub fn free_bytes(&self) -> u64 {
        self.free_bytes
    }

    /// Rounds a length up to the allocation granule.
    pub fn round(&self, len: u64) -> Option<u64> {
        len.checked_add(self.align - 1)
            .map(|v| v & !(self.align - 1))
    }

    /// Allocates `len` bytes (rounded up); returns the start offset.
    pub fn alloc(&mut self, len: u64) -> Option<u64> {
        let len = self.round(len.max(1))?;
        let (&start, &size) = self.free.iter().find(|(_, &size)| size >= len)?;
        self.free.remove(&start);
        if size > len {
            self.free.insert(start + len, size - len);
        }
        self.free_bytes -= len;
        Some(start)
    }

    /// Returns a range obtained from [`alloc`](Self::alloc) with the same `len`.
    pub fn free(&mut self, start: u64, len: u64) {
        let Some(mut len) = self.round(len.max(1)) else {
            return;
        };
        self.free_bytes += len;
        let mut start = start;
        if let Some((&next, &nlen)) = self.free.range(start..).next() {
            if start + len == next {
                self.free.remove(&next);
                len += nlen;
            }
        }
        if let Some((&prev, &plen)) = self.free.range(..start).next_back() {
            if prev + plen == start {
                self.free.remove(&prev);
                start = prev;
                len += plen;
            }
        }
        self.free.insert(start, len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn alloc_free_coalesce() {
        let mut a = RangeAllocator::new(4096, 4096 * 4, 4096);
        let x = a.alloc(1).unwrap();
        let y = a.alloc(4097).unwrap();
        let z = a.alloc(4096).unwrap();
        assert_eq!((x, y, z), (4096, 8192, 16384));
        assert!(a.alloc(1).is_none());
        a.free(y, 4097);
        a.free(x, 1);
        a.free(z, 4096);
        assert_eq!(a.free_bytes(), 4096 * 4);
        assert_eq!(a.alloc(4096 * 4), Some(4096));
    }

    proptest! {
        #[test]
        fn never_overlaps(ops in proptest::collection::vec((1u64..20_000, any::<bool>()), 1..200)) {
            let mut a = RangeAllocator::new(0, 1 << 20, 4096);
            let mut live: Vec<(u64, u64)> = Vec::new();
            for (len, free) in ops {
                if free && !live.is_empty() {
                    let (s, l) = live.remove(0);
                    a.free(s, l);
                } else if let Some(s) = a.alloc(len) {
                    let r = a.round(len).unwrap();
                    for &(os, ol) in &live {
                        let orr = a.round(ol).unwrap();
                        prop_assert!(s + r <= os || os + orr <= s, "overlap");
                    }
                    prop_assert!(s + r <= 1 << 20);
                    live.push((s, len));
                }
            }
            for (s, l) in live { a.free(s, l); }
            prop_assert_eq!(a.free_bytes(), 1 << 20);
        }
    }
}
