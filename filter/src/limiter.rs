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

/// The status of a refused request.
pub const STATUS: u32 = 503;
/// The header of a refused request's answer: the cluster whose limit was reached.
pub const LIMITED_HEADER: &str = "x-odmesh-limited";
/// The counter of refused requests (`dynamicmodulescustom.<name>` or `wasmcustom.<name>` in
/// Envoy's stats).
pub const METRIC_LIMITED: &str = "odmesh_concurrency_limited";
/// The gauge of each cluster's limit, labelled [`METRIC_LABEL`], set as each window closes.
pub const METRIC_LIMIT: &str = "odmesh_concurrency_limit";
pub const METRIC_LABEL: &str = "cluster";
/// The gRPC status of a refused gRPC call: `UNAVAILABLE`, which clients retry elsewhere or
/// later. Envoy's local reply from a dynamic module says `grpc-status: 0` (OK) unless the
/// module sets it (docs/envoy.md, "On the caller's side, per destination").
pub const GRPC_UNAVAILABLE: &str = "14";

/// What a route gives the limit filter (JSON: `{"cluster": "slow.vip", "params": {...}}`):
/// the cluster whose limiter it is, and the limiter's settings.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Setting {
    pub cluster: String,
    #[serde(default)]
    pub params: Params,
}

impl Setting {
    /// The setting in `json`, or what is wrong with it.
    pub fn parse(json: &[u8]) -> Result<Setting, String> {
        let parsed: Setting = serde_json::from_slice(json)
            .map_err(|e| format!("invalid odmesh limit configuration: {e}"))?;
        parsed
            .params
            .check()
            .map_err(|e| format!("invalid odmesh limit for {}: {e}", parsed.cluster))?;
        Ok(parsed)
    }
}

/// The body of a refused request's answer (or a refused gRPC call's message).
pub fn refusal_body(cluster: &str, limit: u32) -> String {
    format!(
        "odmesh: concurrency limit of {cluster} reached ({limit} in flight): refused at once so \
         that a slow destination does not pile up requests (README, \"Adaptive concurrency\")\n"
    )
}

/// Whether a request's `content-type` makes it a gRPC call (`application/grpc`, alone or with
/// a `+format` or `;parameters`), as Envoy decides for its own local replies.
pub fn is_grpc(content_type: Option<&[u8]>) -> bool {
    const GRPC: &[u8] = b"application/grpc";
    content_type.is_some_and(|t| {
        t.len() >= GRPC.len()
            && t[..GRPC.len()].eq_ignore_ascii_case(GRPC)
            && matches!(t.get(GRPC.len()), None | Some(b'+' | b';'))
    })
}

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

/// The first byte of [`Gradient::encode`]'s layout, and its length.
const ENCODING: u8 = 1;
const ENCODED_LEN: usize = 1 + 5 * 4 + 8 + 4 * 8 + 2 * 4 + 3 * 8;

/// One cluster's limit, its requests in flight and the latencies it has seen.
#[derive(Clone, Debug, PartialEq)]
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

    /// The whole state as bytes, for a shell that keeps it where several threads reach it
    /// (the wasm shell: Envoy's shared data, one VM per worker). [`Gradient::decode`] reads
    /// it back; the layout is private to this version of the module.
    pub fn encode(&self) -> Vec<u8> {
        let p = &self.params;
        let mut out = Vec::with_capacity(ENCODED_LEN);
        out.push(ENCODING);
        for n in [
            p.initial_limit,
            p.min_limit,
            p.max_limit,
            p.min_samples,
            p.long_windows,
        ] {
            out.extend(n.to_le_bytes());
        }
        out.extend(p.window_ms.to_le_bytes());
        for x in [p.tolerance, p.smoothing, self.limit, self.long_rtt] {
            out.extend(x.to_bits().to_le_bytes());
        }
        out.extend(self.in_flight.to_le_bytes());
        out.extend(self.window_count.to_le_bytes());
        for n in [self.windows, self.window_start, self.window_sum] {
            out.extend(n.to_le_bytes());
        }
        out
    }

    /// A state [`Gradient::encode`] wrote; `None` for any other bytes (another layout, cut
    /// short, or settings that do not [`Params::check`]).
    pub fn decode(bytes: &[u8]) -> Option<Gradient> {
        let (&version, mut rest) = bytes.split_first()?;
        if version != ENCODING || rest.len() != ENCODED_LEN - 1 {
            return None;
        }
        let mut take = |n: usize| {
            let (head, tail) = rest.split_at(n);
            rest = tail;
            head
        };
        let mut u32_ = || u32::from_le_bytes(take(4).try_into().unwrap_or_default());
        let (initial_limit, min_limit, max_limit, min_samples, long_windows) =
            (u32_(), u32_(), u32_(), u32_(), u32_());
        let mut u64_ = || u64::from_le_bytes(take(8).try_into().unwrap_or_default());
        let window_ms = u64_();
        let (tolerance, smoothing, limit, long_rtt) = (
            f64::from_bits(u64_()),
            f64::from_bits(u64_()),
            f64::from_bits(u64_()),
            f64::from_bits(u64_()),
        );
        let in_flight = u32::from_le_bytes(take(4).try_into().ok()?);
        let window_count = u32::from_le_bytes(take(4).try_into().ok()?);
        let mut u64_ = || u64::from_le_bytes(take(8).try_into().unwrap_or_default());
        let (windows, window_start, window_sum) = (u64_(), u64_(), u64_());
        let params = Params {
            initial_limit,
            min_limit,
            max_limit,
            window_ms,
            min_samples,
            tolerance,
            smoothing,
            long_windows,
        };
        params.check().ok()?;
        let bounds = f64::from(min_limit)..=f64::from(max_limit);
        (bounds.contains(&limit) && long_rtt.is_finite() && long_rtt >= 0.0).then_some(Gradient {
            params,
            limit,
            in_flight,
            long_rtt,
            windows,
            window_start,
            window_sum,
            window_count,
        })
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

    #[test]
    fn a_state_read_back_from_its_bytes_goes_on_exactly_as_the_original() {
        let params = Params {
            initial_limit: 30,
            tolerance: 1.25,
            ..Params::default()
        };
        let mut g = Gradient::new(params, 7 * MS);
        let now = drive(&mut g, 7 * MS, 40, congested);
        g.try_acquire();
        g.sample(3 * MS + 1, now);
        let mut copy = Gradient::decode(&g.encode()).expect("its own bytes");
        assert_eq!(copy, g);
        // Both go on the same way: nothing was rounded on the way.
        drive(&mut g, now, 30, |n| congested(n) / 3);
        drive(&mut copy, now, 30, |n| congested(n) / 3);
        assert_eq!(copy, g);
        assert_eq!(g.encode().len(), ENCODED_LEN);
    }

    #[test]
    fn bytes_of_another_layout_or_with_impossible_settings_are_not_a_state() {
        let good = Gradient::new(Params::default(), 0).encode();
        assert!(Gradient::decode(&good).is_some());
        assert_eq!(Gradient::decode(&[]), None);
        assert_eq!(Gradient::decode(&good[..good.len() - 1]), None);
        assert_eq!(Gradient::decode(&[good.as_slice(), &[0]].concat()), None);
        let mut other = good.clone();
        other[0] = ENCODING + 1;
        assert_eq!(Gradient::decode(&other), None);
        // min_limit (bytes 5..9) of 0 fails the settings' check.
        let mut zero_min = good.clone();
        zero_min[5..9].copy_from_slice(&0u32.to_le_bytes());
        assert_eq!(Gradient::decode(&zero_min), None);
        // A limit (bytes 45..53) outside [min, max].
        let mut limit = good;
        limit[45..53].copy_from_slice(&5000f64.to_bits().to_le_bytes());
        assert_eq!(Gradient::decode(&limit), None);
    }

    #[test]
    fn a_grpc_call_is_one_by_its_content_type_and_only_a_grpc_call() {
        for (content_type, grpc) in [
            (Some(&b"application/grpc"[..]), true),
            (Some(b"application/grpc+proto"), true),
            (Some(b"Application/GRPC;charset=utf-8"), true),
            (Some(b"application/grpc-web"), false),
            (Some(b"application/json"), false),
            (Some(b"application/gr"), false),
            (None, false),
        ] {
            assert_eq!(is_grpc(content_type), grpc, "{content_type:?}");
        }
    }

    #[test]
    fn a_setting_names_its_cluster_and_bad_ones_say_what_is_wrong() {
        let s = Setting::parse(br#"{"cluster": "a.vip", "params": {"max_limit": 90}}"#).unwrap();
        assert_eq!(s.cluster, "a.vip");
        assert_eq!(s.params.max_limit, 90);
        assert_eq!(s.params.window_ms, Params::default().window_ms);
        for (bad, says) in [
            (&br#"{}"#[..], "cluster"),
            (
                br#"{"cluster": "a.vip", "params": {"min_limit": 0}}"#,
                "min_limit",
            ),
            (br#"{"cluster": "a.vip", "limit": 3}"#, "unknown field"),
            (b"not json", "invalid odmesh limit configuration"),
        ] {
            let err = Setting::parse(bad).unwrap_err();
            assert!(err.contains(says), "{err}");
        }
    }
}
