//! Streaming copies and fills: large moves of bytes that bypass the CPU caches, as a device's
//! DMA engine does.
//!
//! The daemon plays the devices' DMA engines with the host CPU: a copy engine channel copying
//! a replica, a test device filling a buffer. A real engine writes memory without going
//! through the CPU caches; a `memcpy` of 16 MiB goes through them and evicts everything the
//! other guests' µs-scale paths keep there (region tables, locks, the prefetch predictor's
//! state, the code itself). That is measurable: next to a guest whose producer filled (and
//! checksummed) 16 MiB per iteration, another guest's SVM access p50 was 124–190% of its
//! number alone; with the same loop on 1 MiB fills (more operations, less memory) 87%, on
//! 4 MiB 111%, on 32 MiB 163% (`virtsoc bench isolation --hostile queue-flood`,
//! `docs/results.md`, stop 18).
//!
//! So moves of at least [`STREAM_MIN`] bytes use non-temporal stores (x86_64: `vmovntdq` with
//! AVX, detected at run time, `movntdq` otherwise, then `sfence`); the destination's head
//! and tail up to 64-byte alignment are copied normally. Other architectures copy normally.
//!
//! Where it is used, and where not: the destination of a streaming move is cold for its next
//! reader, which then reads it from memory. That is right for a device fill (the test
//! producer writes for another device, [`fill_with`]: the pattern is made and checksummed in
//! an L1-sized scratch chunk, so neither the stores nor the checksum's loads go through the
//! destination in the caches) and for a prefetch copy the copy engine makes ahead of a read
//! that comes later (`dma`, through [`crate::CopyEngine::copy_ahead`]). Both are at least
//! [`STREAM_MIN`] bytes, past what a core's L2 cache holds: a normal copy of that size has
//! pushed most of its own head out of L2 before the reader comes anyway (`virtsoc bench svm`,
//! 16 MiB frames read 17 ms later: the same access p50 and coherence time with streaming
//! prefetch copies as without, stop 18). A synchronous fetch in a begin_access is followed by
//! its reader at once: it copies normally ([`crate::CopyEngine::copy`]), as do copies through
//! a guest window or device memory (their own accessors).

/// Moves of at least this many bytes stream past the caches: twice a core's L2 cache (1 MiB
/// on the machine measured), so buffers a core's cache could still hand to their reader
/// (the 1 MiB buffers of `virtsoc bench svm --size 1048576`, command records, small planes)
/// keep normal copies, and UHD frames (12–33 MiB) stream.
pub const STREAM_MIN: usize = 2 << 20;

/// Bytes a [`fill_with`] generator writes per call (in a scratch buffer that stays in the L1
/// cache, then streamed out): a multiple of 64.
pub const FILL_CHUNK: usize = 16 << 10;

/// Copies `src` to `dst` (same length), streaming past the caches from [`STREAM_MIN`] bytes.
///
/// # Panics
///
/// When the lengths differ, as [`slice::copy_from_slice`].
pub fn copy(dst: &mut [u8], src: &[u8]) {
    if dst.len() >= STREAM_MIN {
        copy_nt(dst, src);
    } else {
        dst.copy_from_slice(src);
    }
}

/// Copies `src` to `dst` (same length) with non-temporal stores whatever the size (where the
/// CPU has them; a normal copy elsewhere).
///
/// # Panics
///
/// When the lengths differ, as [`slice::copy_from_slice`].
pub fn copy_nt(dst: &mut [u8], src: &[u8]) {
    assert_eq!(
        dst.len(),
        src.len(),
        "stream copy: destination and source lengths differ"
    );
    #[cfg(target_arch = "x86_64")]
    x86::copy(dst, src);
    #[cfg(not(target_arch = "x86_64"))]
    dst.copy_from_slice(src);
}

/// Fills `dst` by calling `gen` on its consecutive chunks, in order: [`FILL_CHUNK`] bytes
/// each, the last one shorter. From [`STREAM_MIN`] bytes `gen` writes a scratch buffer that
/// stays in the L1 cache and each chunk is streamed to `dst` past the caches (a generator
/// that also reads its chunk, e.g. to checksum it, then reads it from the cache, not from
/// memory); below it `gen` writes `dst` itself.
pub fn fill_with(dst: &mut [u8], gen: impl FnMut(&mut [u8])) {
    if dst.len() < STREAM_MIN {
        dst.chunks_mut(FILL_CHUNK).for_each(gen);
        return;
    }
    fill_streaming(dst, gen);
}

/// [`fill_with`] streaming whatever the size: for one piece of a large fill made a piece at
/// a time (a paced fill, [`crate::pace`]). Pieces other than the last should be multiples of
/// [`FILL_CHUNK`] for the generator to see the chunks of one [`fill_with`].
pub fn fill_streaming(dst: &mut [u8], mut gen: impl FnMut(&mut [u8])) {
    let mut scratch = vec![0u8; FILL_CHUNK];
    for d in dst.chunks_mut(FILL_CHUNK) {
        let s = &mut scratch[..d.len()];
        gen(s);
        copy_nt(d, s);
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use core::arch::x86_64::{
        __m128i, __m256i, _mm256_loadu_si256, _mm256_stream_si256, _mm_loadu_si128, _mm_sfence,
        _mm_stream_si128,
    };

    /// Bytes per step of the streaming loops: one cache line.
    const LINE: usize = 64;

    /// Copies `src` to `dst` (same length): the head up to 64-byte alignment of `dst` and the
    /// tail normally, the lines between with non-temporal stores, then a store fence.
    pub(super) fn copy(dst: &mut [u8], src: &[u8]) {
        by_lines(dst, src, |db, sb| {
            if std::arch::is_x86_feature_detected!("avx") {
                // SAFETY: the CPU has AVX (detected above); `db` starts 64-byte aligned and
                // both slices hold the same multiple of 64 bytes (`by_lines`).
                unsafe { lines_avx(db, sb) };
            } else {
                // SAFETY: SSE2 is part of x86_64; `db` starts 64-byte aligned and both
                // slices hold the same multiple of 64 bytes (`by_lines`).
                unsafe { lines_sse2(db, sb) };
            }
        });
    }

    /// Splits `dst`/`src` into an unaligned head, whole 64-byte lines of `dst` from an
    /// aligned start, and a tail; copies head and tail normally, hands the lines to `lines`,
    /// then fences.
    fn by_lines(dst: &mut [u8], src: &[u8], lines: impl FnOnce(&mut [u8], &[u8])) {
        let head = dst.as_ptr().align_offset(LINE).min(dst.len());
        let (dh, dr) = dst.split_at_mut(head);
        let (sh, sr) = src.split_at(head);
        dh.copy_from_slice(sh);
        let body = dr.len() / LINE * LINE;
        let (db, dt) = dr.split_at_mut(body);
        let (sb, st) = sr.split_at(body);
        lines(db, sb);
        dt.copy_from_slice(st);
        sfence();
    }

    /// The non-temporal stores are weakly ordered: makes them visible before whatever this
    /// thread stores next (the replica's lock release, the copy's completion).
    fn sfence() {
        // SAFETY: SSE is part of x86_64; a fence has no operands.
        unsafe { _mm_sfence() };
    }

    /// Streams `src` into `dst` a cache line at a time with 32-byte non-temporal stores.
    ///
    /// # Safety
    ///
    /// The CPU has AVX; `dst` starts 32-byte aligned; `src.len() == dst.len()`, a multiple
    /// of 64.
    #[target_feature(enable = "avx")]
    unsafe fn lines_avx(dst: &mut [u8], src: &[u8]) {
        debug_assert!(src.len() == dst.len() && dst.len().is_multiple_of(LINE));
        let (d, s) = (dst.as_mut_ptr(), src.as_ptr());
        let mut i = 0;
        while i < dst.len() {
            // SAFETY: `i + 64 <= len` for both slices; unaligned loads; the stores' addresses
            // are `dst`'s 32-byte aligned start plus multiples of 32 (caller's contract).
            unsafe {
                let a = _mm256_loadu_si256(s.add(i).cast::<__m256i>());
                let b = _mm256_loadu_si256(s.add(i + 32).cast::<__m256i>());
                _mm256_stream_si256(d.add(i).cast::<__m256i>(), a);
                _mm256_stream_si256(d.add(i + 32).cast::<__m256i>(), b);
            }
            i += LINE;
        }
    }

    /// Streams `src` into `dst` a cache line at a time with 16-byte non-temporal stores.
    ///
    /// # Safety
    ///
    /// `dst` starts 16-byte aligned; `src.len() == dst.len()`, a multiple of 64.
    unsafe fn lines_sse2(dst: &mut [u8], src: &[u8]) {
        debug_assert!(src.len() == dst.len() && dst.len().is_multiple_of(LINE));
        let (d, s) = (dst.as_mut_ptr(), src.as_ptr());
        let mut i = 0;
        while i < dst.len() {
            // SAFETY: `i + 64 <= len` for both slices; unaligned loads; the stores' addresses
            // are `dst`'s 16-byte aligned start plus multiples of 16 (caller's contract).
            unsafe {
                for k in (0..LINE).step_by(16) {
                    let v = _mm_loadu_si128(s.add(i + k).cast::<__m128i>());
                    _mm_stream_si128(d.add(i + k).cast::<__m128i>(), v);
                }
            }
            i += LINE;
        }
    }

    #[cfg(test)]
    /// The SSE2 path, for tests on machines with AVX.
    pub(super) fn copy_sse2(dst: &mut [u8], src: &[u8]) {
        // SAFETY: as in `copy`.
        by_lines(dst, src, |db, sb| unsafe { lines_sse2(db, sb) });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Distinct bytes (a position-dependent pattern that no shift of itself reproduces).
    fn pattern(n: usize, seed: u8) -> Vec<u8> {
        (0..n)
            .map(|i| {
                (i as u8)
                    .wrapping_mul(31)
                    .wrapping_add((i >> 8) as u8 ^ seed)
            })
            .collect()
    }

    /// Every destination and source misalignment against a cache line, and lengths around
    /// the head, the lines and the tail.
    #[test]
    fn streaming_copy_gives_the_bytes_of_copy_from_slice() {
        let lens = [
            0, 1, 15, 16, 17, 63, 64, 65, 127, 128, 129, 191, 1000, 4095, 4096, 4097, 70_001,
        ];
        let mut checked = 0;
        for len in lens {
            for dmis in [0, 1, 7, 16, 31, 33, 63] {
                for smis in [0, 3, 32] {
                    let src = pattern(len + smis, len as u8);
                    let s = &src[smis..];
                    let mut want = vec![0xAAu8; len + dmis + 64];
                    want[dmis..dmis + len].copy_from_slice(s);
                    let mut got = vec![0xAAu8; len + dmis + 64];
                    copy_nt(&mut got[dmis..dmis + len], s);
                    assert!(got == want, "len {len} dst+{dmis} src+{smis}");
                    #[cfg(target_arch = "x86_64")]
                    {
                        let mut got = vec![0xAAu8; len + dmis + 64];
                        x86::copy_sse2(&mut got[dmis..dmis + len], s);
                        assert!(got == want, "sse2: len {len} dst+{dmis} src+{smis}");
                    }
                    checked += 1;
                }
            }
        }
        assert_eq!(checked, lens.len() * 7 * 3);
    }

    #[test]
    fn copy_streams_large_and_copies_small_alike() {
        for len in [STREAM_MIN - 1, STREAM_MIN + 65] {
            let src = pattern(len, 9);
            let mut dst = vec![0u8; len + 1];
            copy(&mut dst[1..], &src);
            assert!(dst[1..] == src[..], "len {len}");
            assert_eq!(dst[0], 0);
        }
    }

    #[test]
    #[should_panic(expected = "lengths differ")]
    fn lengths_must_match() {
        copy_nt(&mut [0u8; 10], &[0u8; 11]);
    }

    /// A fill through the scratch chunks writes what the generator wrote, in order, whatever
    /// the size (below and above the streaming threshold, a partial last chunk).
    #[test]
    fn fill_with_calls_the_generator_on_consecutive_chunks() {
        for len in [
            0,
            5,
            FILL_CHUNK,
            3 * FILL_CHUNK + 7,
            STREAM_MIN + FILL_CHUNK / 2 + 3,
        ] {
            let mut next = 0u32;
            let mut calls = Vec::new();
            let mut dst = vec![0u8; len];
            fill_with(&mut dst, |c| {
                calls.push(c.len());
                for b in c.iter_mut() {
                    *b = (next % 251) as u8;
                    next += 1;
                }
            });
            let want: Vec<u8> = (0..len as u32).map(|i| (i % 251) as u8).collect();
            assert!(dst == want, "len {len}");
            assert_eq!(calls.iter().sum::<usize>(), len);
            assert!(calls.iter().rev().skip(1).all(|&c| c == FILL_CHUNK));
        }
    }
}
