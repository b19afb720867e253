//! A concurrency limit per destination, on the caller's side (README, "Adaptive
//! concurrency"): how many requests a proxy lets be in flight to one cluster at once, adapted
//! to the cluster's latency, so that a destination that slows down cannot pile up requests in
//! every caller.
//!
//! The algorithm is a gradient in the spirit of Netflix's concurrency-limits (`Gradient2`):
//! requests are timed, and every `window` (once it holds `min_samples`) the window's average
//! latency (the short RTT) is compared with the destination's usual latency (the long RTT):
//!
//! ```text
//! gradient  = clamp(tolerance × long / short, 0.5, 1)
//! target    = limit × gradient + √limit          (√limit: room for a queue)
//! limit     = limit × (1 − smoothing) + target × smoothing, within [min_limit, max_limit]
//! ```
//!
//! Latency above `tolerance` times the usual shrinks the limit (by half at most per window);
//! otherwise it grows by about `smoothing × √limit` per window. The usual latency falls at
//! once to a faster window's and rises slowly toward slower ones (a moving average over
//! `long_windows` windows), so a destination that recovers lets the limit grow back at once,
//! and one that is slower for good is followed within `long_windows` windows. While fewer
//! than half the limit are in flight the limit holds: a quiet caller proves nothing about the
//! destination. A request over the limit is refused at once; the shell answers it.
//!
//! What it cannot know: a limiter that first sees a destination already congested takes that
//! latency as usual, and lowers the limit only when latency rises further (so does
//! `Gradient2`); Envoy's inbound limiter instead measures the unloaded latency by pinning the
//! limit low now and then, refusing requests while it does, which a caller's limit should not.
//!
//! Pure: time is given in nanoseconds by the caller, and nothing here is shared between
//! threads (the native shell keeps one [`Gradient`] per cluster behind a lock).

use serde::{Deserialize, Serialize};

/// The limiter's settings, as the control plane writes them (JSON); every field optional.
#[derive(Clone, Copy, Debug, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct Params {
    /// The limit before the first window closes.
    pub initial_limit: u32,
    pub min_limit: u32,
    pub max_limit: u32,
    /// How often the limit is recomputed, in milliseconds.
    pub window_ms: u64,
    /// Samples a window needs before it closes (it stays open until it has them).
    pub min_samples: u32,
    /// How much slower than usual (long RTT) the window may be before the limit shrinks.
    pub tolerance: f64,
    /// How far the limit moves toward its target per window, in (0, 1].
    pub smoothing: f64,
    /// Windows the long RTT averages over.
    pub long_windows: u32,
}

impl Default for Params {
    fn default() -> Params {
        Params {
            initial_limit: 20,
            min_limit: 1,
            max_limit: 1000,
            window_ms: 100,
            min_samples: 10,
            tolerance: 1.5,
            smoothing: 0.2,
            long_windows: 600,
        }
    }
}

impl Params {
    /// Settings that make sense together, or what is wrong with them.
    pub fn check(&self) -> Result<(), String> {
        if self.min_limit == 0 || self.min_limit > self.max_limit {
            return Err(format!(
                "min_limit {} must be at least 1 and at most max_limit {}",
                self.min_limit, self.max_limit
            ));
        }
        if !(self.min_limit..=self.max_limit).contains(&self.initial_limit) {
            return Err(format!(
                "initial_limit {} must lie within [{}, {}]",
                self.initial_limit, self.min_limit, self.max_limit
            ));
        }
        if self.window_ms == 0 || self.min_samples == 0 || self.long_windows == 0 {
            return Err("window_ms, min_samples and long_windows must be at least 1".to_owned());
        }
        if !(self.tolerance >= 1.0 && self.tolerance.is_finite()) {
            return Err(format!("tolerance {} must be at least 1", self.tolerance));
        }
        if !(self.smoothing > 0.0 && self.smoothing <= 1.0) {
            return Err(format!("smoothing {} must lie in (0, 1]", self.smoothing));
        }
        Ok(())
    }
}

/// One cluster's limit, its requests in flight and the latencies it has seen.
#[derive(Clone, Debug)]
pub struct Gradient {
    params: Params,
    limit: f64,
    in_flight: u32,
    /// The usual latency (ns); 0 before the first window closes.
    long_rtt: f64,
    /// Windows closed so far.
    windows: u64,
    window_start: u64,
    window_sum: u64,
    window_count: u32,
}

impl Gradient {
    /// A limiter at `params.initial_limit`, its first window opening at `now` (ns).
    pub fn new(params: Params, now: u64) -> Gradient {
        Gradient {
            params,
            limit: f64::from(params.initial_limit),
            in_flight: 0,
            long_rtt: 0.0,
            windows: 0,
            window_start: now,
            window_sum: 0,
            window_count: 0,
        }
    }

    /// New settings, keeping what was learnt (the limit, within the new bounds).
    pub fn set_params(&mut self, params: Params) {
        self.params = params;
        self.limit = self
            .limit
            .clamp(f64::from(params.min_limit), f64::from(params.max_limit));
    }

    pub fn params(&self) -> &Params {
        &self.params
    }

    /// The current limit, whole requests.
    pub fn limit(&self) -> u32 {
        self.limit as u32
    }

    pub fn in_flight(&self) -> u32 {
        self.in_flight
    }

    /// Lets one more request in, or `false` when the limit is reached (the request must be
    /// refused, and nothing is counted for it).
    pub fn try_acquire(&mut self) -> bool {
        if self.in_flight >= self.limit() {
            return false;
        }
        self.in_flight += 1;
        true
    }

    /// The latency (ns) of a request let in, at `now` (ns); its slot stays taken until
    /// [`Gradient::release`]. Closes the window when it is due: `true` then (the limit may
    /// have changed).
    pub fn sample(&mut self, rtt: u64, now: u64) -> bool {
        self.window_sum = self.window_sum.saturating_add(rtt);
        self.window_count += 1;
        let window = self.params.window_ms.saturating_mul(1_000_000);
        if self.window_count >= self.params.min_samples
            && now.saturating_sub(self.window_start) >= window
        {
            let short = self.window_sum as f64 / f64::from(self.window_count);
            self.window_start = now;
            self.window_sum = 0;
            self.window_count = 0;
            self.update(short.max(1.0));
            return true;
        }
        false
    }

    /// A request let in is over: its slot is free.
    pub fn release(&mut self) {
        self.in_flight = self.in_flight.saturating_sub(1);
    }

    fn update(&mut self, short: f64) {
        let p = self.params;
        self.windows += 1;
        if self.windows == 1 || short < self.long_rtt {
            self.long_rtt = short;
        } else {
            self.long_rtt += (short - self.long_rtt) * 2.0 / (f64::from(p.long_windows) + 1.0);
        }
        if f64::from(self.in_flight) < self.limit / 2.0 {
            return;
        }
        let gradient = (p.tolerance * self.long_rtt / short).clamp(0.5, 1.0);
        let target = self.limit * gradient + self.limit.sqrt();
        let next = self.limit * (1.0 - p.smoothing) + target * p.smoothing;
        self.limit = next.clamp(f64::from(p.min_limit), f64::from(p.max_limit));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    /// Drives `g` for `windows` windows with `in_flight` requests always open, each taking
    /// `rtt(in_flight)`: a closed loop of callers, as a load generator is. Returns the time.
    fn drive(g: &mut Gradient, mut now: u64, windows: u32, rtt: impl Fn(u32) -> u64) -> u64 {
        let step = g.params().window_ms * MS / u64::from(g.params().min_samples);
        for _ in 0..windows * g.params().min_samples {
            // Fill up to the limit, as callers with more demand than the limit would.
            while g.try_acquire() {}
            let latency = rtt(g.in_flight());
            now += step;
            g.sample(latency, now);
            g.release();
        }
        now
    }

    /// A destination whose latency grows with what is in flight past 5: 10 ms unloaded.
    fn congested(in_flight: u32) -> u64 {
        10 * MS + u64::from(in_flight.saturating_sub(5)) * 10 * MS
    }

    #[test]
    fn the_defaults_check_and_bad_settings_say_what_is_wrong() {
        assert_eq!(Params::default().check(), Ok(()));
        let bad = [
            (
                Params {
                    min_limit: 0,
                    ..Params::default()
                },
                "min_limit",
            ),
            (
                Params {
                    min_limit: 50,
                    max_limit: 10,
                    ..Params::default()
                },
                "min_limit",
            ),
            (
                Params {
                    initial_limit: 5000,
                    ..Params::default()
                },
                "initial_limit",
            ),
            (
                Params {
                    window_ms: 0,
                    ..Params::default()
                },
                "window_ms",
            ),
            (
                Params {
                    tolerance: 0.5,
                    ..Params::default()
                },
                "tolerance",
            ),
            (
                Params {
                    tolerance: f64::NAN,
                    ..Params::default()
                },
                "tolerance",
            ),
            (
                Params {
                    smoothing: 0.0,
                    ..Params::default()
                },
                "smoothing",
            ),
            (
                Params {
                    smoothing: 1.5,
                    ..Params::default()
                },
                "smoothing",
            ),
        ];
        for (params, says) in bad {
            let err = params.check().unwrap_err();
            assert!(err.contains(says), "{params:?}: {err}");
        }
    }

    #[test]
    fn settings_parse_from_json_with_defaults_for_what_is_missing() {
        let p: Params = serde_json::from_str(r#"{"max_limit": 50, "tolerance": 2}"#).unwrap();
        assert_eq!(p.max_limit, 50);
        assert_eq!(p.tolerance, 2.0);
        assert_eq!(p.initial_limit, Params::default().initial_limit);
        assert!(serde_json::from_str::<Params>(r#"{"max": 50}"#).is_err());
    }

    #[test]
    fn nothing_over_the_limit_gets_in_and_a_released_slot_is_free_again() {
        let params = Params {
            initial_limit: 3,
            ..Params::default()
        };
        let mut g = Gradient::new(params, 0);
        assert!(g.try_acquire() && g.try_acquire() && g.try_acquire());
        assert!(!g.try_acquire());
        assert_eq!(g.in_flight(), 3);
        g.release();
        assert!(g.try_acquire());
        assert!(!g.try_acquire());
    }

    /// 20 windows of one request at a time at 10 ms: a caller before the trouble.
    fn quiet(g: &mut Gradient, mut now: u64) -> u64 {
        for _ in 0..20 * 10 {
            assert!(g.try_acquire());
            now += 10 * MS;
            g.sample(10 * MS, now);
            g.release();
        }
        now
    }

    #[test]
    fn a_congested_destination_brings_the_limit_down_to_where_latency_holds() {
        let mut g = Gradient::new(Params::default(), 0);
        let now = quiet(&mut g, 0);
        assert_eq!(
            g.limit(),
            20,
            "a quiet caller proves nothing: the limit holds"
        );
        let now = drive(&mut g, now, 100, congested);
        let limit = g.limit();
        assert!((5..=10).contains(&limit), "settled at {limit}");
        let latency = congested(limit);
        assert!(latency <= 60 * MS, "latency at the limit {latency} ns");
        // It stays near there: the usual latency creeps up only over `long_windows`.
        drive(&mut g, now, 100, congested);
        assert!((5..=12).contains(&g.limit()), "then {}", g.limit());
    }

    #[test]
    fn when_the_destination_recovers_the_limit_grows_back() {
        let mut g = Gradient::new(Params::default(), 0);
        let now = quiet(&mut g, 0);
        let now = drive(&mut g, now, 100, congested);
        let low = g.limit();
        assert!(low <= 10, "{low}");
        let now = drive(&mut g, now, 50, |_| 10 * MS);
        let grown = g.limit();
        assert!(grown >= 2 * low, "from {low} to {grown} in 50 windows");
        drive(&mut g, now, 2000, |_| 10 * MS);
        assert_eq!(g.limit(), 1000, "up to max_limit while latency stays flat");
    }

    #[test]
    fn a_limiter_that_starts_congested_takes_that_latency_as_usual_and_creeps() {
        // No quiet start: the first window already sees 160 ms and takes it as usual. The
        // limit still stops well short of max_limit, but creeps up as the usual latency
        // follows what the limit lets through (the weakness the module's docs state).
        let mut g = Gradient::new(Params::default(), 0);
        let now = drive(&mut g, 0, 100, congested);
        let first = g.limit();
        drive(&mut g, now, 100, congested);
        let later = g.limit();
        assert!((20..100).contains(&first), "{first}");
        assert!(later >= first && later < 100, "{first}, then {later}");
    }

    #[test]
    fn a_window_waits_for_its_samples_and_its_time() {
        let params = Params {
            initial_limit: 100,
            ..Params::default()
        };
        let mut g = Gradient::new(params, 0);
        for _ in 0..100 {
            assert!(g.try_acquire());
        }
        // Nine slow samples over a long time: not enough to close the window.
        for i in 1..10 {
            g.sample(1000 * MS, i * 1000 * MS);
        }
        assert_eq!(g.limit(), 100);
        // The tenth closes it; the first window only sets the usual latency.
        assert!(g.sample(1000 * MS, 10_000 * MS));
        assert_eq!(g.windows, 1);
        // Ten fast samples inside the next 100 ms: the window stays open until its time.
        for i in 1..=10 {
            g.sample(MS, 10_000 * MS + i * MS);
        }
        assert_eq!(g.windows, 1);
        g.sample(MS, 10_000 * MS + 100 * MS);
        assert_eq!(g.windows, 2);
    }

    #[test]
    fn new_settings_keep_the_limit_within_their_bounds() {
        let mut g = Gradient::new(Params::default(), 0);
        g.set_params(Params {
            max_limit: 8,
            initial_limit: 8,
            ..Params::default()
        });
        assert_eq!(g.limit(), 8);
        g.set_params(Params {
            min_limit: 30,
            initial_limit: 30,
            ..Params::default()
        });
        assert_eq!(g.limit(), 30);
    }

    #[test]
    fn release_never_goes_below_zero() {
        let mut g = Gradient::new(Params::default(), 0);
        g.release();
        assert_eq!(g.in_flight(), 0);
    }
}
