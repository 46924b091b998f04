//! Test devices: a producer that writes a seeded pattern into a region and a consumer that
//! checksums one, each in its own device-local memory domain. Together they check that every
//! coherence protocol delivers the last write to the next reader.

use virtsoc_devapi::{consumer, producer};

use std::sync::Arc;

use virtsoc_svm::backing::HostBuf;
use virtsoc_svm::pace::PACE_CHUNK;
use virtsoc_svm::stream::STREAM_MIN;
use virtsoc_svm::Backing;

use super::{Device, DeviceCtx, DeviceResult};

/// Fills `buf` with the pattern of `seed` (xorshift64 words) and returns its CRC-32.
///
/// As a device's DMA engine, a large fill bypasses the CPU caches: the pattern is made and
/// checksummed a cache-resident chunk at a time and streamed out
/// ([`virtsoc_svm::stream::fill_with`]), so a guest filling 16 MiB buffers does not evict
/// what the other guests' paths keep in the caches.
pub fn fill_pattern(buf: &mut [u8], seed: u64) -> u32 {
    let mut p = Pattern::new(seed);
    virtsoc_svm::stream::fill_with(buf, |chunk| p.chunk(chunk));
    p.crc.finalize()
}

/// The pattern of one seed and the CRC-32 of what it wrote so far, chunk by chunk: every
/// chunk but the last a whole number of words (the words run on across chunks).
struct Pattern {
    x: u64,
    crc: crc32fast::Hasher,
}

impl Pattern {
    fn new(seed: u64) -> Self {
        Pattern {
            x: seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
            crc: crc32fast::Hasher::new(),
        }
    }

    fn chunk(&mut self, chunk: &mut [u8]) {
        let mut words = chunk.chunks_exact_mut(8);
        for c in &mut words {
            self.x ^= self.x << 13;
            self.x ^= self.x >> 7;
            self.x ^= self.x << 17;
            c.copy_from_slice(&self.x.to_le_bytes());
        }
        let rest = words.into_remainder();
        let tail = self.x.to_le_bytes();
        rest.copy_from_slice(&tail[..rest.len()]);
        self.crc.update(chunk);
    }
}

/// A large pattern fill made [`PACE_CHUNK`] bytes at a time, each piece streamed past the
/// caches, paced to the guest's bandwidth share by the device worker ([`super::PacedOp`]).
/// The replica is looked up once and locked for one piece at a time.
struct PacedFill {
    buf: Arc<HostBuf>,
    len: usize,
    pattern: Pattern,
    done: usize,
}

impl super::PacedOp for PacedFill {
    fn next_bytes(&self) -> u64 {
        self.len.saturating_sub(self.done).min(PACE_CHUNK) as u64
    }

    fn step(&mut self, _cx: &DeviceCtx<'_>) -> Option<DeviceResult> {
        let end = self.len.min(self.done + PACE_CHUNK);
        let p = &mut self.pattern;
        virtsoc_svm::stream::fill_streaming(&mut self.buf.lock()[self.done..end], |c| p.chunk(c));
        self.done = end;
        (end == self.len).then(|| Ok([self.pattern.crc.clone().finalize() as u64, 0, 0, 0, 0, 0]))
    }
}

/// Writes patterns.
#[derive(Debug, Default)]
pub struct Producer;

impl Device for Producer {
    fn name(&self) -> &str {
        "producer"
    }

    fn backend(&self) -> String {
        "cpu pattern generator".into()
    }

    fn execute(&self, cx: &DeviceCtx<'_>, args: &[u64; 6]) -> DeviceResult {
        let producer::Command::WritePattern(c) = producer::Command::decode(args)?;
        let crc = cx
            .svm
            .with_replica(cx.guest, c.region, cx.domain, |b| fill_pattern(b, c.seed))
            .map_err(|e| crate::status::status_of(&e))?;
        Ok([crc as u64, 0, 0, 0, 0, 0])
    }

    /// A fill of at least [`STREAM_MIN`] bytes (one that streams past the caches) is paced.
    fn paced(&self, cx: &DeviceCtx<'_>, args: &[u64; 6]) -> Option<Box<dyn super::PacedOp>> {
        let Ok(producer::Command::WritePattern(c)) = producer::Command::decode(args) else {
            return None;
        };
        // Anything wrong with the region: `execute` answers it.
        let Ok(Backing::Host(buf)) = cx.svm.replica(cx.guest, c.region, cx.domain) else {
            return None;
        };
        let len = buf.read().len();
        if len < STREAM_MIN {
            return None;
        }
        Some(Box::new(PacedFill {
            buf,
            len,
            pattern: Pattern::new(c.seed),
            done: 0,
        }))
    }
}

/// Checksums regions.
#[derive(Debug)]
pub struct Consumer {
    name: &'static str,
}

impl Consumer {
    /// A consumer listed under `name`.
    pub fn new(name: &'static str) -> Self {
        Consumer { name }
    }
}

impl Device for Consumer {
    fn name(&self) -> &str {
        self.name
    }

    fn backend(&self) -> String {
        "cpu crc32".into()
    }

    fn execute(&self, cx: &DeviceCtx<'_>, args: &[u64; 6]) -> DeviceResult {
        // `consumer2` declares the same command as `consumer`.
        let consumer::Command::Checksum(c) = consumer::Command::decode(args)?;
        let crc = cx
            .svm
            .with_replica(cx.guest, c.region, cx.domain, |b| crc32fast::hash(b))
            .map_err(|e| crate::status::status_of(&e))?;
        Ok([crc as u64, 0, 0, 0, 0, 0])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_depends_on_seed_and_covers_tail() {
        let mut a = vec![0u8; 1003];
        let mut b = vec![0u8; 1003];
        let ca = fill_pattern(&mut a, 1);
        let cb = fill_pattern(&mut b, 2);
        assert_ne!(ca, cb);
        assert_eq!(ca, crc32fast::hash(&a));
        assert!(a[1000..].iter().any(|&x| x != 0));
        let mut c = vec![0u8; 1003];
        assert_eq!(fill_pattern(&mut c, 1), ca, "deterministic");
    }

    /// The fill in one piece, as it was before large fills were streamed in chunks.
    fn fill_reference(buf: &mut [u8], seed: u64) -> u32 {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut chunks = buf.chunks_exact_mut(8);
        for c in &mut chunks {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            c.copy_from_slice(&x.to_le_bytes());
        }
        let rest = chunks.into_remainder();
        rest.copy_from_slice(&x.to_le_bytes()[..rest.len()]);
        crc32fast::hash(buf)
    }

    /// A paced fill, step by step, writes the bytes and answers the CRC of the fill in one
    /// piece; each step moves at most one pace chunk.
    #[test]
    fn a_paced_fill_in_steps_writes_the_bytes_and_crc_of_one_piece() {
        use super::super::PacedOp;
        let core = crate::testkit::Core::new();
        let cx = DeviceCtx::new(
            crate::testkit::GUEST,
            &core.svm,
            virtsoc_svm::DomainId(0),
            core.session.fences(),
        );
        for len in [
            STREAM_MIN,
            STREAM_MIN + 5,
            STREAM_MIN + 3 * PACE_CHUNK + 4096 + 64,
        ] {
            let buf = HostBuf::zeroed(len);
            let mut op = PacedFill {
                buf: buf.clone(),
                len,
                pattern: Pattern::new(42),
                done: 0,
            };
            let (mut steps, mut moved) = (0, 0);
            let answer = loop {
                let n = op.next_bytes();
                assert!(n > 0 && n <= PACE_CHUNK as u64, "len {len}: step of {n}");
                moved += n;
                steps += 1;
                if let Some(r) = op.step(&cx) {
                    break r;
                }
            };
            assert_eq!(moved, len as u64);
            assert_eq!(steps, len.div_ceil(PACE_CHUNK));
            let mut want = vec![0u8; len];
            let crc = fill_reference(&mut want, 42);
            assert_eq!(answer, Ok([crc as u64, 0, 0, 0, 0, 0]), "len {len}");
            assert!(buf.read()[..] == want[..], "len {len}");
        }
    }

    #[test]
    fn streamed_fills_write_the_bytes_and_crc_of_one_piece() {
        let big = virtsoc_svm::stream::STREAM_MIN;
        for len in [3, 1003, 64 << 10, big + 5, big + 4096 + 64] {
            for skew in [0, 1, 13] {
                let (mut a, mut b) = (vec![0u8; len + skew], vec![0u8; len + skew]);
                let ca = fill_pattern(&mut a[skew..], 42);
                let cb = fill_reference(&mut b[skew..], 42);
                assert_eq!(ca, cb, "len {len} skew {skew}");
                assert!(a == b, "len {len} skew {skew}");
                assert_eq!(ca, crc32fast::hash(&a[skew..]));
            }
        }
    }
}
