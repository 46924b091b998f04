//! The daemon's clock for media timestamps: CLOCK_MONOTONIC in nanoseconds, shared by the
//! camera (capture times stamped into pixels), the codec, and the display (scan-out times),
//! so motion-to-photon latency is a plain subtraction.

/// Nanoseconds on CLOCK_MONOTONIC.
pub fn now_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    #[test]
    fn monotonic() {
        let a = super::now_ns();
        let b = super::now_ns();
        assert!(b >= a && a > 0);
    }
}
