//! Single exponential smoothing (the paper's forecaster for slack intervals
//! and bus bandwidth) and the `f64`-seconds <-> [`Duration`] conversion used
//! by the engine.
//!
//! `s = alpha * x + (1 - alpha) * s`; the first sample initialises `s`.

use std::time::Duration;

/// A single-exponential-smoothing accumulator. Empty until the first sample.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Ewma {
    value: Option<f64>,
    samples: u64,
}

impl Ewma {
    /// An empty accumulator.
    pub const fn new() -> Self {
        Ewma {
            value: None,
            samples: 0,
        }
    }

    /// Feeds one sample and returns the new smoothed value. Non-finite
    /// samples are ignored: the current value is returned unchanged (`NAN`
    /// while still empty).
    pub fn update(&mut self, alpha: f64, x: f64) -> f64 {
        if !x.is_finite() {
            return self.value.unwrap_or(f64::NAN);
        }
        let v = match self.value {
            None => x,
            Some(s) => alpha * x + (1.0 - alpha) * s,
        };
        self.value = Some(v);
        self.samples = self.samples.saturating_add(1);
        v
    }

    /// The smoothed value, `None` before the first sample.
    pub fn get(&self) -> Option<f64> {
        self.value
    }

    /// Number of samples fed so far.
    pub fn samples(&self) -> u64 {
        self.samples
    }
}

/// Converts non-negative seconds to a [`Duration`], saturating: negative or
/// NaN gives zero, too large gives [`Duration::MAX`].
pub(crate) fn secs_to_duration(secs: f64) -> Duration {
    if secs.is_nan() || secs <= 0.0 {
        return Duration::ZERO;
    }
    Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX)
}
