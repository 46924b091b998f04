//! Small statistics helpers for benchmark reports: percentiles and means over samples.

use serde::Serialize;

/// Percentile `p` (0..=100) of `v` by nearest rank; 0 for no samples.
pub fn percentile(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let rank = ((p / 100.0) * s.len() as f64).ceil() as usize;
    s[rank.clamp(1, s.len()) - 1]
}

/// The median of `v` (the mean of the middle two for an even count), NaNs skipped; NaN when
/// nothing is left.
pub fn median(v: &[f64]) -> f64 {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| !x.is_nan()).collect();
    if s.is_empty() {
        return f64::NAN;
    }
    s.sort_by(|a, b| a.total_cmp(b));
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

/// [`median`], 0 for no samples.
pub fn median_or_zero(v: &[f64]) -> f64 {
    let m = median(v);
    if m.is_nan() {
        0.0
    } else {
        m
    }
}

/// The smallest and largest of `v` (NaNs skipped where anything else is there); `None` for no
/// samples.
pub fn min_max(v: &[f64]) -> Option<(f64, f64)> {
    let lo = v.iter().copied().reduce(f64::min)?;
    let hi = v.iter().copied().reduce(f64::max)?;
    Some((lo, hi))
}

/// Mean of `v`; 0 for no samples.
pub fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

/// p50 and p99 of a sample set.
#[derive(Debug, Clone, Copy, Serialize, serde::Deserialize, PartialEq)]
pub struct P50P99 {
    pub p50: f64,
    pub p99: f64,
}

impl P50P99 {
    pub fn of(v: &[f64]) -> Self {
        P50P99 {
            p50: percentile(v, 50.0),
            p99: percentile(v, 99.0),
        }
    }
}

/// Mean and p50 of a sample set.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct MeanP50 {
    pub mean: f64,
    pub p50: f64,
}

impl MeanP50 {
    pub fn of(v: &[f64]) -> Self {
        MeanP50 {
            mean: mean(v),
            p50: percentile(v, 50.0),
        }
    }
}

/// Median time in milliseconds of `reps` memcpys of `size` bytes, rotating over enough
/// buffers that each copy streams through memory rather than hitting the cache.
pub fn machine_memcpy_ms(size: usize, reps: usize) -> f64 {
    memcpy_ms(size, reps, false)
}

/// Median memcpy of `size` bytes whose source was written just before (as a device's output
/// is when a prefetch copies it): the conditions the SVM's copies after a write run in.
pub fn machine_memcpy_written_ms(size: usize, reps: usize) -> f64 {
    memcpy_ms(size, reps, true)
}

fn memcpy_ms(size: usize, reps: usize, write_first: bool) -> f64 {
    let bufs = ((256 << 20) / size.max(1)).clamp(2, 16);
    let mut pool: Vec<Vec<u8>> = (0..bufs).map(|i| vec![i as u8; size]).collect();
    let mut times = Vec::with_capacity(reps);
    for r in 0..reps + 2 {
        let (a, b) = (r % bufs, (r + bufs / 2) % bufs);
        let (lo, hi) = pool.split_at_mut(a.max(b));
        let (src, dst) = if a < b {
            (&mut lo[a], &mut hi[0])
        } else {
            (&mut hi[0], &mut lo[b])
        };
        if write_first {
            src.fill(r as u8); // the producer's write, not timed
        }
        let t0 = std::time::Instant::now();
        dst.copy_from_slice(src);
        std::hint::black_box(&dst);
        if r >= 2 {
            times.push(t0.elapsed().as_secs_f64() * 1e3);
        }
    }
    percentile(&times, 50.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 50.0);
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert_eq!(percentile(&v, 100.0), 100.0);
        assert_eq!(percentile(&[], 50.0), 0.0);
        assert_eq!(mean(&[1.0, 2.0, 3.0]), 2.0);
    }

    #[test]
    fn medians_of_odd_even_empty_and_nan() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(&[f64::NAN, 5.0]), 5.0);
        assert!(median(&[]).is_nan());
        assert_eq!(median_or_zero(&[]), 0.0);
        assert_eq!(median_or_zero(&[4.0, 1.0, 3.0, 2.0]), 2.5);
    }

    #[test]
    fn memcpy_measures_something() {
        assert!(machine_memcpy_ms(1 << 20, 3) > 0.0);
    }
}
