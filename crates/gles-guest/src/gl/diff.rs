//! What a write mapping changed (`glMapBufferOES` .. `glUnmapBufferOES`): the runs of bytes
//! that differ from the guest's copy of the buffer, found a block at a time (slice
//! comparisons the C library vectorizes) and sent as one `glBufferSubData` each. Runs
//! closer than [`GAP`] bytes go as one (a packet costs more than the bytes between them);
//! past [`MAX_RUNS`] runs, the span of them all goes.

/// Bytes compared at a time; runs start and end on these blocks (a run may take up to a
/// block's unchanged bytes at each end, within the span the mapping changed).
const BLOCK: usize = 64;
/// Changed runs closer than this are sent as one.
const GAP: usize = 256;
/// Most runs sent for one unmap.
const MAX_RUNS: usize = 64;
/// Blocks compared as one first (a page of an unchanged stretch costs one comparison).
const PAGE: usize = 4096;

/// The runs `(start, end)` of `new` to send: where it differs from `old`, all of it when
/// there is no `old` of its length; empty when nothing changed.
pub(crate) fn changed_runs(old: Option<&[u8]>, new: &[u8]) -> Vec<(usize, usize)> {
    let Some(old) = old.filter(|o| o.len() == new.len()) else {
        return if new.is_empty() {
            Vec::new()
        } else {
            vec![(0, new.len())]
        };
    };
    let mut runs: Vec<(usize, usize)> = Vec::new();
    let mut add = |lo: usize, hi: usize| match runs.last_mut() {
        Some((_, end)) if lo - *end < GAP => *end = hi,
        _ => runs.push((lo, hi)),
    };
    for (p, (po, pn)) in old.chunks(PAGE).zip(new.chunks(PAGE)).enumerate() {
        if po == pn {
            continue;
        }
        for (b, (bo, bn)) in po.chunks(BLOCK).zip(pn.chunks(BLOCK)).enumerate() {
            if bo != bn {
                let lo = p * PAGE + b * BLOCK;
                add(lo, lo + bn.len());
            }
        }
    }
    if runs.len() > MAX_RUNS {
        let span = (runs[0].0, runs[runs.len() - 1].1);
        return vec![span];
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_of_changed_blocks() {
        let old = vec![0u8; 64 * 1024];
        assert!(changed_runs(Some(&old), &old).is_empty(), "nothing changed");
        assert_eq!(changed_runs(None, &old), [(0, old.len())], "no copy: all");
        assert_eq!(
            changed_runs(Some(&old[..10]), &old),
            [(0, old.len())],
            "a copy of another size: all"
        );
        assert!(changed_runs(None, &[]).is_empty());
        let mut new = old.clone();
        new[100] = 1; // block 64..128
        new[130] = 1; // block 128..192: merged
        new[5000] = 1; // far: a run of its own
        new[65535] = 1; // the last block
        assert_eq!(
            changed_runs(Some(&old), &new),
            [(64, 192), (4992, 5056), (65472, 65536)]
        );
        // Runs less than GAP apart go as one.
        let mut new = old.clone();
        new[0] = 1;
        new[64 + 200] = 1;
        assert_eq!(changed_runs(Some(&old), &new), [(0, 320)]);
        // A length that is not a multiple of a block.
        let (old, mut new) = (vec![0u8; 1000], vec![0u8; 1000]);
        new[999] = 7;
        assert_eq!(changed_runs(Some(&old), &new), [(960, 1000)]);
    }

    #[test]
    fn many_runs_become_their_span() {
        let old = vec![0u8; 1 << 20];
        let mut new = old.clone();
        for i in 0..1000 {
            new[100 + i * 1000] = 1;
        }
        assert_eq!(changed_runs(Some(&old), &new), [(64, 999_104)]);
    }

    /// Every changed byte is inside a run, on any input.
    #[test]
    fn every_changed_byte_is_sent() {
        let mut s = 0x9E37_79B9_7F4A_7C15u64;
        for round in 0..200 {
            let len = (round * 37) % 20_000;
            let old: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            let mut new = old.clone();
            for _ in 0..round % 50 {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                if len > 0 {
                    new[(s % len as u64) as usize] ^= 0x5A;
                }
            }
            let runs = changed_runs(Some(&old), &new);
            for i in (0..len).filter(|&i| old[i] != new[i]) {
                assert!(runs.iter().any(|&(lo, hi)| lo <= i && i < hi), "byte {i}");
            }
            assert!(runs.windows(2).all(|w| w[0].1 <= w[1].0), "ordered");
        }
    }

    /// Not a test: the cost of finding the runs of a 1.15 MB mapping (glmark2's `buffer`
    /// scene) against the byte-wise scan for one span this replaced.
    /// `cargo test --release -p virtsoc-gles --lib diff_cost -- --ignored --nocapture`
    #[test]
    #[ignore]
    fn diff_cost() {
        fn bytewise(old: &[u8], new: &[u8]) -> Option<(usize, usize)> {
            let lo = old.iter().zip(new).position(|(a, b)| a != b)?;
            let mut back = old.iter().rev().zip(new.iter().rev());
            Some((lo, new.len() - back.position(|(a, b)| a != b).unwrap_or(0)))
        }
        let n = 1_150_000;
        let old: Vec<u8> = (0..n).map(|i| (i % 251) as u8).collect();
        let mut new = old.clone();
        // Every other 48-byte vertex of each 4.8 KB column rewritten, in 90% of the columns.
        for c in 0..n / 4800 {
            if c % 10 == 9 {
                continue;
            }
            for v in (0..100).step_by(2) {
                let at = c * 4800 + v * 48;
                new[at..at + 48].iter_mut().for_each(|b| *b ^= 1);
            }
        }
        let mut best = [f64::MAX; 2];
        let (mut runs, mut span) = (Vec::new(), None);
        for round in 0..20 {
            let t = std::time::Instant::now();
            if round % 2 == 0 {
                runs = std::hint::black_box(changed_runs(Some(&old), &new));
            } else {
                span = std::hint::black_box(bytewise(&old, &new));
            }
            let us = t.elapsed().as_secs_f64() * 1e6;
            best[round % 2] = best[round % 2].min(us);
        }
        let sent: usize = runs.iter().map(|(a, b)| b - a).sum();
        eprintln!(
            "1.15 MB mapping: runs {:.0} us ({} runs, {sent} bytes), byte-wise span {:.0} us ({:?})",
            best[0],
            runs.len(),
            best[1],
            span
        );
    }
}
