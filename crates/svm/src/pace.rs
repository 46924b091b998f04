//! Bandwidth shares: a per-guest token bucket of bytes per second that paces the large moves
//! of bytes the daemon makes on a guest's behalf, as a memory controller caps a tenant's
//! bandwidth (Intel MBA, ARM MPAM) or a DMA engine its channels.
//!
//! Why: the daemon plays the devices' DMA engines with the host CPU, and one guest moving
//! bytes as fast as it can (a test producer filling 16 MiB per iteration) loads the memory
//! bandwidth every other guest's microsecond-scale paths depend on; the harm follows the
//! bytes moved per second (`virtsoc bench isolation --hostile queue-flood`, `docs/results.md`
//! stops 18 and 20). Streaming past the caches ([`crate::stream`]) took away the cache
//! pollution, not the bandwidth.
//!
//! The rule: a move of at least [`crate::stream::STREAM_MIN`] bytes is made in chunks of
//! [`PACE_CHUNK`] bytes, and each chunk takes its bytes from the guest's [`Bucket`] first: a
//! bucket refills at `rate` bytes per second up to `burst` bytes, so a guest moves at most
//! `burst + rate * t` bytes in any `t` seconds, and a guest that was idle has no more than
//! `burst` banked. A chunk whose bytes are not there waits until they are: the device worker
//! defers that guest's command (it serves the other guests meanwhile and wakes at the time
//! the bucket names), so waiting for tokens never holds back another guest.

use virtsoc_rate::TokenBucket;

/// Bytes of one paced step: between two steps of one guest's large move the worker serves
/// other guests. A multiple of [`crate::stream::FILL_CHUNK`] (the fills' generators keep their
/// word stream across steps); about 50 us of a streaming fill.
pub const PACE_CHUNK: usize = 256 << 10;

/// A guest's bandwidth share: bytes per second and the most it may bank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Share {
    /// Bytes per second; 0: not paced.
    pub rate: u64,
    /// Most bytes the bucket holds (taken as at least [`PACE_CHUNK`], so a chunk always
    /// fits).
    pub burst: u64,
}

impl Share {
    /// Not paced.
    pub const UNLIMITED: Share = Share { rate: 0, burst: 0 };

    /// Whether moves are paced at all.
    pub fn paced(&self) -> bool {
        self.rate > 0
    }
}

/// A guest's bucket of bytes ([`virtsoc_rate::TokenBucket`]) for its [`Share`]: full at
/// first, refilled at the share's rate up to its burst (at least one [`PACE_CHUNK`], so a
/// chunk always fits); exact times, a clock going back counts as standing still.
#[derive(Debug, Clone)]
pub struct Bucket {
    share: Share,
    tokens: TokenBucket,
}

impl Bucket {
    /// A full bucket of `share`.
    pub fn new(share: Share) -> Self {
        let burst = share.burst.max(PACE_CHUNK as u64);
        Bucket {
            share,
            tokens: TokenBucket::new(share.rate, burst),
        }
    }

    /// The share.
    pub fn share(&self) -> Share {
        self.share
    }

    /// Takes `bytes` at `now`: `Ok` if they were there (or the share is not paced), else
    /// `Err` with the time they will be (nothing taken). A request over the capacity is
    /// taken as the capacity (it would never fit).
    pub fn take(&mut self, now: u64, bytes: u64) -> Result<(), u64> {
        self.tokens.take(now, bytes)
    }

    /// Bytes available at `now`.
    pub fn available(&mut self, now: u64) -> u64 {
        self.tokens.available(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;
    const S: u64 = 1_000_000_000;

    /// A guest idle for a minute has the burst banked, not a minute's worth.
    #[test]
    fn an_idle_guest_banks_no_more_than_the_burst() {
        let share = Share {
            rate: 50 << 20,
            burst: 1 << 20,
        };
        let mut b = Bucket::new(share);
        b.take(0, share.burst).unwrap();
        assert_eq!(b.available(0), 0);
        assert_eq!(b.available(60 * S), share.burst);
        let chunk = PACE_CHUNK as u64;
        let n = (0..1000)
            .take_while(|_| b.take(60 * S, chunk).is_ok())
            .count() as u64;
        assert_eq!(n * chunk, share.burst);
        // Half the time for one chunk later: still nothing.
        assert!(b.take(60 * S + chunk * S / share.rate / 2, chunk).is_err());
        // A clock that goes back is ignored (nothing refilled, nothing lost).
        assert!(b.take(60 * S - MS, chunk).is_err());
    }

    #[test]
    fn a_chunk_always_fits_and_an_unpaced_share_never_waits() {
        // A burst below one chunk is taken as one chunk.
        let mut b = Bucket::new(Share { rate: 1, burst: 10 });
        assert!(b.take(0, PACE_CHUNK as u64).is_ok());
        assert!(b.take(0, 1).is_err());
        let mut u = Bucket::new(Share::UNLIMITED);
        for _ in 0..1000 {
            assert!(u.take(0, 1 << 30).is_ok());
        }
    }
}
