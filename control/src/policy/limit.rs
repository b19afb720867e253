//! A concurrency limit per destination on the caller's side (README, "Adaptive concurrency"):
//! how many requests a calling service's proxy lets be in flight to one VIP at once, adapted to
//! the VIP's latency by the native module's gradient (`odmesh_filter::limiter`, where the
//! algorithm and each setting are described).
//!
//! ```yaml
//! vips:
//!   payments:
//!     concurrency_limit: {}           # on, with the defaults below
//!     callers:
//!       checkout:
//!         concurrency_limit:          # every field optional
//!           initial_limit: 20
//!           min_limit: 1
//!           max_limit: 1000
//!           window: 100ms             # how often the limit is recomputed
//!           min_samples: 10           # answers a window needs before it closes
//!           tolerance_percent: 150    # latency up to 1.5 × the usual is not congestion
//!           smoothing_percent: 20     # how far the limit moves toward its target per window
//!           long_windows: 600         # windows the usual latency follows over
//! ```
//!
//! A VIP's entry or a caller's in it, never the file's `defaults` (each limit belongs to one
//! destination); a caller's replaces the VIP's whole. Both shells carry it (the route: a
//! per-route configuration of the native module's filter, or metadata the wasm plugin reads).

use serde::{Deserialize, Serialize};

use odmesh_filter::limiter::Params;

use super::{Bounded, Positive};

/// The settings as the file writes them; `None` takes the default.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ConcurrencyLimit {
    pub initial_limit: Option<Bounded<1, 100_000>>,
    pub min_limit: Option<Bounded<1, 100_000>>,
    pub max_limit: Option<Bounded<1, 100_000>>,
    pub window: Option<Positive>,
    pub min_samples: Option<Bounded<1, 100_000>>,
    pub tolerance_percent: Option<Bounded<100, 10_000>>,
    pub smoothing_percent: Option<Bounded<1, 100>>,
    pub long_windows: Option<Bounded<1, 1_000_000>>,
}

impl ConcurrencyLimit {
    /// The limiter's settings: those given, the module's defaults for the rest, the default
    /// initial limit brought within the bounds given (so that `max_limit: 5` alone will do).
    pub fn params(&self) -> Params {
        let d = Params::default();
        let n = |v: Option<Bounded<1, 100_000>>, default: u32| v.map_or(default, |b| b.0);
        let (min_limit, max_limit) = (
            n(self.min_limit, d.min_limit),
            n(self.max_limit, d.max_limit),
        );
        let initial = d.initial_limit.clamp(min_limit.min(max_limit), max_limit);
        Params {
            initial_limit: n(self.initial_limit, initial),
            min_limit,
            max_limit,
            window_ms: self.window.map_or(d.window_ms, |w| {
                u64::try_from(w.0.as_millis()).unwrap_or(u64::MAX).max(1)
            }),
            min_samples: n(self.min_samples, d.min_samples),
            tolerance: (self.tolerance_percent).map_or(d.tolerance, |p| f64::from(p.0) / 100.0),
            smoothing: (self.smoothing_percent).map_or(d.smoothing, |p| f64::from(p.0) / 100.0),
            long_windows: self.long_windows.map_or(d.long_windows, |b| b.0),
        }
    }

    /// What is wrong with the settings together (each is checked as it is read), in words.
    pub fn check(&self) -> Result<(), String> {
        self.params().check()
    }
}
