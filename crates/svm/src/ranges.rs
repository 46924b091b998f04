//! Byte ranges of a region: which parts of a replica are stale.
//!
//! A replica records the ranges it does *not* hold the current contents of, as a small sorted
//! set of disjoint half-open ranges. A write of `[a, b)` by one domain adds `[a, b)` to every
//! other replica's set; a copy removes what it brought. So a sub-range write followed by a read
//! elsewhere moves only the sub-range (dirty-range coherence). The set is bounded: past
//! [`MAX_RANGES`] pieces the two closest neighbours are merged (a superset: more is copied,
//! never less).

/// Most disjoint ranges one set keeps before merging neighbours.
pub const MAX_RANGES: usize = 16;

/// A half-open byte range `[start, end)`.
pub type Range = (u64, u64);

/// A bounded set of disjoint, sorted, non-empty half-open ranges.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RangeSet {
    pieces: Vec<Range>,
}

impl RangeSet {
    /// The empty set.
    pub fn new() -> Self {
        RangeSet::default()
    }

    /// The set holding just `r` (empty if `r` is empty).
    pub fn of(r: Range) -> Self {
        let mut s = RangeSet::new();
        s.insert(r);
        s
    }

    /// Whether nothing is in the set.
    pub fn is_empty(&self) -> bool {
        self.pieces.is_empty()
    }

    /// The pieces, sorted.
    pub fn pieces(&self) -> &[Range] {
        &self.pieces
    }

    /// Total bytes covered.
    pub fn bytes(&self) -> u64 {
        self.pieces.iter().map(|(a, b)| b - a).sum()
    }

    /// Adds `r`, merging what it touches.
    pub fn insert(&mut self, r: Range) {
        let (mut a, mut b) = r;
        if a >= b {
            return;
        }
        let mut out = Vec::with_capacity(self.pieces.len() + 1);
        let mut placed = false;
        for &(x, y) in &self.pieces {
            if y < a {
                out.push((x, y));
            } else if x > b {
                if !placed {
                    out.push((a, b));
                    placed = true;
                }
                out.push((x, y));
            } else {
                a = a.min(x);
                b = b.max(y);
            }
        }
        if !placed {
            out.push((a, b));
        }
        self.pieces = out;
        while self.pieces.len() > MAX_RANGES {
            // Merge the pair with the smallest gap.
            let i = (0..self.pieces.len() - 1)
                .min_by_key(|&i| self.pieces[i + 1].0 - self.pieces[i].1)
                .unwrap_or(0);
            let merged = (self.pieces[i].0, self.pieces[i + 1].1);
            self.pieces[i] = merged;
            self.pieces.remove(i + 1);
        }
    }

    /// Removes `r`.
    pub fn remove(&mut self, r: Range) {
        let (a, b) = r;
        if a >= b {
            return;
        }
        let mut out = Vec::with_capacity(self.pieces.len() + 1);
        for &(x, y) in &self.pieces {
            if y <= a || x >= b {
                out.push((x, y));
                continue;
            }
            if x < a {
                out.push((x, a));
            }
            if y > b {
                out.push((b, y));
            }
        }
        self.pieces = out;
    }

    /// Whether any byte of `r` is in the set.
    pub fn overlaps(&self, r: Range) -> bool {
        self.pieces.iter().any(|&(x, y)| x < r.1 && r.0 < y)
    }

    /// The parts of `r` in the set.
    pub fn intersect(&self, r: Range) -> Vec<Range> {
        self.pieces
            .iter()
            .filter_map(|&(x, y)| {
                let (a, b) = (x.max(r.0), y.min(r.1));
                (a < b).then_some((a, b))
            })
            .collect()
    }

    /// Every boundary of the set inside `r` (for splitting `r` into pieces each wholly in or
    /// wholly out of the set).
    pub fn boundaries_in(&self, r: Range, out: &mut Vec<u64>) {
        for &(x, y) in &self.pieces {
            for p in [x, y] {
                if r.0 < p && p < r.1 {
                    out.push(p);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn insert_merges_and_remove_splits() {
        let mut s = RangeSet::new();
        s.insert((10, 20));
        s.insert((30, 40));
        s.insert((20, 30));
        assert_eq!(s.pieces(), &[(10, 40)]);
        s.remove((15, 25));
        assert_eq!(s.pieces(), &[(10, 15), (25, 40)]);
        assert!(s.overlaps((14, 16)));
        assert!(!s.overlaps((15, 25)));
        assert_eq!(s.intersect((0, 30)), vec![(10, 15), (25, 30)]);
        assert_eq!(s.bytes(), 20);
        s.insert((5, 5));
        assert_eq!(s.pieces().len(), 2);
    }

    #[test]
    fn stays_bounded_as_a_superset() {
        let mut s = RangeSet::new();
        for i in 0..100u64 {
            s.insert((i * 10, i * 10 + 1));
        }
        assert!(s.pieces().len() <= MAX_RANGES);
        for i in 0..100u64 {
            assert!(s.overlaps((i * 10, i * 10 + 1)));
        }
    }

    proptest! {
        /// Against a byte map: every operation keeps the set equal to (a superset of, once
        /// merged) the bytes inserted and not removed since.
        #[test]
        fn matches_a_byte_map(ops in proptest::collection::vec((any::<bool>(), 0u64..200, 0u64..40), 0..60)) {
            let mut s = RangeSet::new();
            let mut map = vec![false; 256];
            let mut merged = false;
            for (ins, a, len) in ops {
                let r = (a, a + len);
                if ins { s.insert(r) } else { s.remove(r) }
                for b in a..a + len { map[b as usize] = ins; }
                merged |= s.pieces().len() >= MAX_RANGES;
                for w in s.pieces().windows(2) {
                    prop_assert!(w[0].1 < w[1].0, "sorted and disjoint: {:?}", s);
                }
                for (b, &m) in map.iter().enumerate() {
                    if m {
                        prop_assert!(s.overlaps((b as u64, b as u64 + 1)), "byte {b} lost");
                    }
                }
                if !merged {
                    for (b, &m) in map.iter().enumerate() {
                        prop_assert_eq!(s.overlaps((b as u64, b as u64 + 1)), m, "byte {}", b);
                    }
                }
            }
        }
    }
}
