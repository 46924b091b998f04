//! The one token bucket of virtsoc, on a caller's clock: the bandwidth share that paces the
//! large moves of a guest's bytes (`virtsoc_svm::pace`, units of bytes) and the rate cap of a
//! guest's requests on a device (`virtsoc_sched::policy`, units of [`REQUEST`]ths of a
//! request, so a cap may be fractional).
//!
//! A bucket holds at most `burst` units, is full at first, and refills at `rate` units per
//! second: whoever takes from it moves at most `burst + rate * t` units in any `t` seconds.
//! Time is in nanoseconds of any epoch (a clock going back counts as standing still), and the
//! arithmetic is integer throughout (tokens are kept in unit-nanoseconds), so the time a
//! refusal names is exact: taking at that time succeeds.

/// Units of one request for a requests-per-second bucket ([`TokenBucket::per_second`]).
pub const REQUEST: u64 = 1000;

const NS: u128 = 1_000_000_000;

/// A token bucket (see the crate documentation).
#[derive(Debug, Clone)]
pub struct TokenBucket {
    /// Units per second; 0: unlimited (every take succeeds).
    rate: u64,
    /// Most units it holds.
    burst: u64,
    /// Units available at `last`, times 10^9.
    tokens: u128,
    last: Option<u64>,
}

impl TokenBucket {
    /// A full bucket of `burst` units refilled at `rate` units per second (`rate` 0:
    /// unlimited).
    pub fn new(rate: u64, burst: u64) -> Self {
        TokenBucket {
            rate,
            burst,
            tokens: u128::from(burst) * NS,
            last: None,
        }
    }

    /// A bucket of `rate` requests per second (fractions allowed, to a thousandth) with
    /// bursts of one second's worth, at least one request; take [`REQUEST`] units a request.
    pub fn per_second(rate: f64) -> Self {
        let units = (rate * REQUEST as f64).ceil().clamp(1.0, u64::MAX as f64) as u64;
        TokenBucket::new(units, units.max(REQUEST))
    }

    /// Units per second (0: unlimited).
    pub fn rate(&self) -> u64 {
        self.rate
    }

    /// Most units it holds.
    pub fn burst(&self) -> u64 {
        self.burst
    }

    fn refill(&mut self, now: u64) {
        let last = *self.last.get_or_insert(now);
        let dt = u128::from(now.saturating_sub(last));
        let cap = u128::from(self.burst) * NS;
        self.tokens = (self.tokens + dt * u128::from(self.rate)).min(cap);
        self.last = Some(now.max(last));
    }

    /// Takes `n` units at `now`: `Ok` if they were there (or the bucket is unlimited), else
    /// `Err` with the time they will be (nothing taken). A request over the burst is taken
    /// as the burst (it would never fit otherwise).
    pub fn take(&mut self, now: u64, n: u64) -> Result<(), u64> {
        match self.ready_at(now, n) {
            at if at > now => Err(at),
            _ if self.rate == 0 => Ok(()),
            _ => {
                self.tokens -= u128::from(n.min(self.burst)) * NS;
                Ok(())
            }
        }
    }

    /// When `n` units are there (`now` if they are), without taking them.
    pub fn ready_at(&mut self, now: u64, n: u64) -> u64 {
        if self.rate == 0 {
            return now;
        }
        self.refill(now);
        let want = u128::from(n.min(self.burst)) * NS;
        if self.tokens >= want {
            return now;
        }
        let wait = (want - self.tokens).div_ceil(u128::from(self.rate));
        let since = self.last.unwrap_or(now).max(now);
        since + u64::try_from(wait).unwrap_or(u64::MAX / 2)
    }

    /// Units available at `now` (`u64::MAX` when unlimited).
    pub fn available(&mut self, now: u64) -> u64 {
        if self.rate == 0 {
            return u64::MAX;
        }
        self.refill(now);
        u64::try_from(self.tokens / NS).unwrap_or(u64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;
    const S: u64 = 1_000_000_000;

    /// Takes as fast as the bucket gives, on a fake clock that jumps to each time it names:
    /// the units taken in 10 s are the burst plus the rate's.
    #[test]
    fn the_rate_is_held_after_the_burst() {
        let (rate, burst, chunk) = (100 << 20, 4 << 20, 256 << 10);
        let mut b = TokenBucket::new(rate, burst);
        let (mut now, mut moved) = (0u64, 0u64);
        while now < 10 * S {
            match b.take(now, chunk) {
                Ok(()) => moved += chunk,
                Err(at) => {
                    assert!(at > now, "the bucket names a later time");
                    now = at;
                }
            }
        }
        let want = burst + rate * 10;
        assert!(
            moved <= want + chunk && moved + chunk >= want,
            "moved {moved}, want {want}"
        );
    }

    #[test]
    fn a_refusal_names_the_exact_time() {
        let (rate, chunk) = (10 << 20, 256 << 10);
        let mut b = TokenBucket::new(rate, 2 << 20);
        let n = (0..100)
            .take_while(|_| b.take(5 * S, chunk).is_ok())
            .count() as u64;
        assert_eq!(n * chunk, 2 << 20);
        let at = b.take(5 * S, chunk).unwrap_err();
        assert_eq!(at, 5 * S + chunk * S / rate);
        assert!(b.take(at - 1, chunk).is_err());
        assert_eq!(
            b.ready_at(at, chunk),
            at,
            "ready then, nothing taken by asking"
        );
        assert!(b.take(at, chunk).is_ok());
    }

    /// Idle for a minute: the burst banked, not a minute's worth; a clock going back refills
    /// nothing.
    #[test]
    fn idle_time_banks_no_more_than_the_burst() {
        let mut b = TokenBucket::new(50, 10);
        b.take(0, 10).unwrap();
        assert_eq!(b.available(0), 0);
        assert_eq!(b.available(60 * S), 10);
        b.take(60 * S, 10).unwrap();
        assert!(b.take(60 * S - MS, 1).is_err());
    }

    #[test]
    fn requests_per_second_and_unlimited() {
        let mut b = TokenBucket::per_second(10.0);
        let (mut served, mut t) = (0, 0);
        while t < 10 * S {
            match b.take(t, REQUEST) {
                Ok(()) => served += 1,
                Err(at) => assert!(at > t),
            }
            t += MS;
        }
        // A full bucket (10) plus 10 per second.
        assert!((105..=111).contains(&served), "{served}");
        // Half a request per second: one at once, the next two seconds later.
        let mut h = TokenBucket::per_second(0.5);
        assert!(h.take(0, REQUEST).is_ok());
        assert_eq!(h.take(0, REQUEST), Err(2 * S));
        let mut u = TokenBucket::new(0, 0);
        assert!((0..1000).all(|_| u.take(0, 1 << 30).is_ok()));
        assert_eq!(u.available(0), u64::MAX);
    }
}
