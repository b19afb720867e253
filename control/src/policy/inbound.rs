//! A service's own inbound side (README, "Adaptive concurrency"): what its Envoy does with the
//! requests that reach the service, keyed by the service's name (the Envoy node's `cluster`).
//!
//! ```yaml
//! services:
//!   payments:
//!     adaptive_concurrency:          # Envoy's gradient controller; every field optional
//!       latency_percentile: 50       # of the sampled latencies, compared with the minimum
//!       update_interval: 100ms       # how often the limit is recomputed
//!       min_limit: 3
//!       max_limit: 1000
//!       min_rtt_interval: 60s        # how often the minimum latency is measured again
//!       min_rtt_requests: 50         # requests per measurement
//!       min_rtt_concurrency: 3       # the limit while measuring
//!       jitter_percent: 15
//!       buffer_percent: 25           # latency above the minimum still taken as unloaded
//!       status: 503                  # what a request over the limit gets
//! ```

use serde::{Deserialize, Serialize};

use super::{Bounded, Positive};

/// The policy of one service's inbound side.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Inbound {
    /// Envoy's adaptive concurrency limit in front of the service; none when absent.
    pub adaptive_concurrency: Option<AdaptiveConcurrency>,
}

/// Envoy's adaptive concurrency filter, gradient controller: the limit follows the ratio of
/// the service's minimum latency to its recent latency (docs/envoy.md, "Adaptive
/// concurrency"). Every value is optional; [`AdaptiveConcurrency::DEFAULTS`] fills the rest.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AdaptiveConcurrency {
    pub latency_percentile: Option<Bounded<1, 100>>,
    pub update_interval: Option<Positive>,
    pub min_limit: Option<Bounded<1, 100_000>>,
    pub max_limit: Option<Bounded<1, 100_000>>,
    pub min_rtt_interval: Option<Positive>,
    pub min_rtt_requests: Option<Bounded<1, 100_000>>,
    pub min_rtt_concurrency: Option<Bounded<1, 100_000>>,
    pub jitter_percent: Option<Bounded<0, 100>>,
    pub buffer_percent: Option<Bounded<0, 100>>,
    pub status: Option<Bounded<400, 599>>,
}

/// Every value of [`AdaptiveConcurrency`], filled in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Limiter {
    pub latency_percentile: u32,
    pub update_interval: std::time::Duration,
    pub min_limit: u32,
    pub max_limit: u32,
    pub min_rtt_interval: std::time::Duration,
    pub min_rtt_requests: u32,
    pub min_rtt_concurrency: u32,
    pub jitter_percent: u32,
    pub buffer_percent: u32,
    pub status: u32,
}

impl AdaptiveConcurrency {
    /// Envoy's defaults, and 100 ms between updates (which Envoy requires to be given).
    pub const DEFAULTS: Limiter = Limiter {
        latency_percentile: 50,
        update_interval: std::time::Duration::from_millis(100),
        min_limit: 3,
        max_limit: 1000,
        min_rtt_interval: std::time::Duration::from_secs(60),
        min_rtt_requests: 50,
        min_rtt_concurrency: 3,
        jitter_percent: 15,
        buffer_percent: 25,
        status: 503,
    };

    /// The values given, and the defaults for the rest.
    pub fn limiter(&self) -> Limiter {
        let d = Self::DEFAULTS;
        let n = |v: Option<u32>, default| v.unwrap_or(default);
        Limiter {
            latency_percentile: n(self.latency_percentile.map(|b| b.0), d.latency_percentile),
            update_interval: self.update_interval.map_or(d.update_interval, |p| p.0),
            min_limit: n(self.min_limit.map(|b| b.0), d.min_limit),
            max_limit: n(self.max_limit.map(|b| b.0), d.max_limit),
            min_rtt_interval: self.min_rtt_interval.map_or(d.min_rtt_interval, |p| p.0),
            min_rtt_requests: n(self.min_rtt_requests.map(|b| b.0), d.min_rtt_requests),
            min_rtt_concurrency: n(self.min_rtt_concurrency.map(|b| b.0), d.min_rtt_concurrency),
            jitter_percent: n(self.jitter_percent.map(|b| b.0), d.jitter_percent),
            buffer_percent: n(self.buffer_percent.map(|b| b.0), d.buffer_percent),
            status: n(self.status.map(|b| b.0), d.status),
        }
    }
}
