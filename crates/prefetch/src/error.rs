//! The crate's single error type: invalid [`Config`](crate::Config) values
//! rejected by [`Config::validate`](crate::Config::validate) and
//! [`PrefetchEngine::try_new`](crate::PrefetchEngine::try_new).

use thiserror::Error;

/// An out-of-range configuration value.
#[derive(Debug, Clone, Copy, PartialEq, Error)]
pub enum ConfigError {
    /// `alpha` must be in `(0, 1]`.
    #[error("smoothing factor alpha must be in (0, 1], got {0}")]
    Alpha(f64),
    /// `bandwidth_floor` must be in `[0, 1]`.
    #[error("bandwidth floor must be in [0, 1], got {0}")]
    BandwidthFloor(f64),
}
