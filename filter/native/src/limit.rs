//! The per-destination concurrency limit (README, "Adaptive concurrency"), as an HTTP filter
//! on safe handles: the gradient of `odmesh_filter::limiter`, one per cluster in this Envoy,
//! shared by its workers.
//!
//! The filter is in the native bootstrap's chain switched off (`disabled: true`); the route
//! the control plane serves switches it on for the VIPs whose policy has a
//! `concurrency_limit`, with a per-route configuration naming the cluster and the limiter's
//! settings (JSON: `{"cluster": "slow.vip", "params": {...}}`). Envoy creates no filter at all
//! for the other requests. A cluster keeps its limiter when the route changes (a new
//! per-route configuration finds it by name and gives it the new settings).
//!
//! Per request: let in, or refuse at once with 503 (`x-odmesh-limited: <cluster>`, a body
//! naming the limit); time it to its response headers (the latency the gradient follows);
//! free its slot when the stream ends, whatever the end.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Instant;

pub use odmesh_filter::limiter::{
    GRPC_UNAVAILABLE, LIMITED_HEADER, METRIC_LABEL, METRIC_LIMIT, METRIC_LIMITED, STATUS, is_grpc,
};
use odmesh_filter::limiter::{Gradient, Setting, refusal_body};

/// The filter name the bootstrap gives (`filter_name` of the dynamic-module filter).
pub const FILTER_NAME: &str = "odmesh-limit";
/// Envoy's response code details for a refusal (`%RESPONSE_CODE_DETAILS%`).
pub const DETAILS: &str = "odmesh_concurrency_limited";

/// Nanoseconds on a monotonic clock (since the module's first look at it).
pub fn now() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    let nanos = EPOCH.get_or_init(Instant::now).elapsed().as_nanos();
    u64::try_from(nanos).unwrap_or(u64::MAX)
}

/// One cluster's limiter, shared by every route and worker that sends to it.
#[derive(Debug)]
pub struct Destination {
    cluster: String,
    gradient: Mutex<Gradient>,
}

impl Destination {
    fn gradient(&self) -> MutexGuard<'_, Gradient> {
        // A panic while holding the lock left plain numbers behind: still usable.
        self.gradient.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The current limit and what is in flight.
    pub fn state(&self) -> (u32, u32) {
        let g = self.gradient();
        (g.limit(), g.in_flight())
    }
}

/// Every cluster's limiter in this Envoy, by name. Entries stay: one small struct per
/// cluster that ever had a limit.
fn destinations() -> &'static Mutex<HashMap<String, Arc<Destination>>> {
    static ALL: OnceLock<Mutex<HashMap<String, Arc<Destination>>>> = OnceLock::new();
    ALL.get_or_init(Mutex::default)
}

/// `per_route_config_new`: the cluster's limiter, made or found, with the settings given.
/// An error says what is wrong (Envoy then refuses the route).
pub fn route_config_new(config: &[u8], now: u64) -> Result<Arc<Destination>, String> {
    let parsed = Setting::parse(config)?;
    let mut all = destinations().lock().unwrap_or_else(|e| e.into_inner());
    let destination = all.entry(parsed.cluster.clone()).or_insert_with(|| {
        Arc::new(Destination {
            cluster: parsed.cluster.clone(),
            gradient: Mutex::new(Gradient::new(parsed.params, now)),
        })
    });
    {
        let mut g = destination.gradient();
        if *g.params() != parsed.params {
            g.set_params(parsed.params);
        }
    }
    Ok(Arc::clone(destination))
}

/// A refused request's answer.
#[derive(Debug, PartialEq, Eq)]
pub struct Refusal {
    pub cluster: String,
    pub body: String,
}

impl Refusal {
    /// The answer's headers: the cluster, and for a gRPC call its status.
    pub fn headers(&self, grpc: bool) -> Vec<(&str, &str)> {
        let mut headers = vec![(LIMITED_HEADER, self.cluster.as_str())];
        if grpc {
            headers.push(("grpc-status", GRPC_UNAVAILABLE));
        }
        headers
    }
}

/// One request under the filter.
#[derive(Debug, Default)]
pub struct Attempt {
    /// The limiter it holds a slot of, if it was let in.
    admitted: Option<Arc<Destination>>,
    started: u64,
    sampled: bool,
}

impl Attempt {
    /// The request's headers have arrived: `route` is its route's limiter (none: the route
    /// has no limit, and the request passes untouched). `Err`: refuse it with that answer.
    pub fn start(&mut self, route: Option<&Arc<Destination>>, now: u64) -> Result<(), Refusal> {
        let Some(destination) = route else {
            return Ok(());
        };
        let mut g = destination.gradient();
        if !g.try_acquire() {
            return Err(Refusal {
                cluster: destination.cluster.clone(),
                body: refusal_body(&destination.cluster, g.limit()),
            });
        }
        drop(g);
        self.admitted = Some(Arc::clone(destination));
        self.started = now;
        Ok(())
    }

    /// The response's headers: the request's latency, if it was let in. When that closed a
    /// window, the cluster and its limit now (for the gauge).
    pub fn responded(&mut self, now: u64) -> Option<(&str, u32)> {
        let destination = self.admitted.as_ref().filter(|_| !self.sampled)?;
        self.sampled = true;
        let mut g = destination.gradient();
        g.sample(now.saturating_sub(self.started), now)
            .then(|| (destination.cluster.as_str(), g.limit()))
    }

    /// The stream is over (answered, reset or cancelled): the slot is free. A request that
    /// got no response headers counts with the time it took (a timeout is a slow answer).
    pub fn end(&mut self, now: u64) {
        let _ = self.responded(now);
        if let Some(destination) = self.admitted.take() {
            destination.gradient().release();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn config(cluster: &str, params: &str) -> Vec<u8> {
        format!(r#"{{"cluster": "{cluster}", "params": {params}}}"#).into_bytes()
    }

    #[test]
    fn requests_over_the_limit_are_refused_naming_the_cluster_until_a_slot_frees() {
        let d = route_config_new(&config("t1.vip", r#"{"initial_limit": 2}"#), 0).unwrap();
        let mut a = Attempt::default();
        let mut b = Attempt::default();
        let mut c = Attempt::default();
        assert_eq!(a.start(Some(&d), 0), Ok(()));
        assert_eq!(b.start(Some(&d), 0), Ok(()));
        let refusal = c.start(Some(&d), 0).unwrap_err();
        assert_eq!(refusal.cluster, "t1.vip");
        assert!(
            refusal
                .body
                .contains("concurrency limit of t1.vip reached (2 in flight)")
        );
        assert_eq!(d.state(), (2, 2));
        a.end(5 * MS);
        assert_eq!(d.state(), (2, 1));
        assert_eq!(c.start(Some(&d), 5 * MS), Ok(()));
        // A refused attempt holds nothing: ending it frees nothing.
        let mut refused = Attempt::default();
        assert!(refused.start(Some(&d), 5 * MS).is_err());
        refused.end(6 * MS);
        assert_eq!(d.state(), (2, 2));
    }

    #[test]
    fn a_grpc_call_is_told_unavailable() {
        let refusal = Refusal {
            cluster: "a.vip".to_owned(),
            body: String::new(),
        };
        assert_eq!(refusal.headers(false), [(LIMITED_HEADER, "a.vip")]);
        assert_eq!(
            refusal.headers(true),
            [(LIMITED_HEADER, "a.vip"), ("grpc-status", "14")]
        );
    }

    #[test]
    fn a_route_without_a_limit_lets_everything_through() {
        let mut a = Attempt::default();
        assert_eq!(a.start(None, 0), Ok(()));
        assert_eq!(a.responded(1), None);
        a.end(2);
    }

    #[test]
    fn a_new_route_keeps_the_cluster_limiter_and_gives_it_the_new_settings() {
        let first = route_config_new(&config("t2.vip", r#"{"initial_limit": 5}"#), 0).unwrap();
        let mut held = Attempt::default();
        held.start(Some(&first), 0).unwrap();
        let second = route_config_new(
            &config("t2.vip", r#"{"initial_limit": 3, "max_limit": 3}"#),
            0,
        )
        .unwrap();
        assert!(Arc::ptr_eq(&first, &second));
        assert_eq!(
            second.state(),
            (3, 1),
            "the limit within the new bounds, in flight kept"
        );
        let other = route_config_new(&config("t2.svip", "{}"), 0).unwrap();
        assert!(!Arc::ptr_eq(&first, &other));
    }

    #[test]
    fn a_bad_configuration_is_refused_with_what_is_wrong() {
        for (bad, says) in [
            (b"{}".to_vec(), "cluster"),
            (config("t3.vip", r#"{"min_limit": 0}"#), "min_limit"),
            (config("t3.vip", r#"{"limit": 3}"#), "unknown field"),
            (b"not json".to_vec(), "invalid odmesh limit configuration"),
        ] {
            let err = route_config_new(&bad, 0).unwrap_err();
            assert!(err.contains(says), "{err}");
        }
    }

    #[test]
    fn each_request_is_timed_once_to_its_response_headers() {
        let params = r#"{"initial_limit": 10, "min_samples": 1, "window_ms": 1}"#;
        let d = route_config_new(&config("t4.vip", params), 0).unwrap();
        // Ten requests held open: the limiter is not app-limited.
        let mut open: Vec<Attempt> = (0..10).map(|_| Attempt::default()).collect();
        for a in &mut open {
            a.start(Some(&d), 0).unwrap();
        }
        // Fast answers, then slow ones: the limit falls.
        let mut now = 0;
        for (i, a) in open.iter_mut().enumerate() {
            now = (i as u64 + 1) * 2 * MS;
            let closed = a.responded(now - MS + if i < 2 { 0 } else { 400 * MS });
            assert_eq!(
                closed.map(|(c, _)| c),
                Some("t4.vip"),
                "each closes a window"
            );
            assert_eq!(
                a.responded(now + 1000 * MS),
                None,
                "a second call changes nothing"
            );
        }
        let (limit, in_flight) = d.state();
        assert_eq!(in_flight, 10);
        assert!(limit < 10, "{limit}");
        for a in &mut open {
            a.end(now);
        }
        assert_eq!(d.state().1, 0);
    }
}
