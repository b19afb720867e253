//! The caller-side concurrency limit as a proxy-wasm HTTP context: the gradient of
//! `odmesh_filter::limiter`, one per cluster for the whole Envoy (its state in shared data,
//! [`crate::shared`]), with the same answers as the native module's (filter/native/src/limit.rs):
//! a request over the limit gets 503 at once with `x-odmesh-limited: <cluster>`, a gRPC call
//! `UNAVAILABLE`; a request let in is timed to its response headers, and when its stream ends,
//! whatever the end, that time goes to the limiter and its slot is freed (one change of the
//! shared state to let it in, one at its end).

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::time::UNIX_EPOCH;

use odmesh_filter::limiter::{
    LIMITED_HEADER, METRIC_LABEL, METRIC_LIMIT, METRIC_LIMITED, STATUS, Setting, is_grpc,
    refusal_body,
};
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::{Action, GrpcStatusCode, LogLevel, MetricType};

use crate::shared::{Store, key, update};

/// Envoy's shared data.
struct Envoy;

impl Store for Envoy {
    fn get(&self, key: &str) -> (Option<Vec<u8>>, Option<u32>) {
        hostcalls::get_shared_data(key).unwrap_or((None, None))
    }

    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> bool {
        hostcalls::set_shared_data(key, Some(value), cas).is_ok()
    }
}

/// Nanoseconds of Envoy's clock.
fn now() -> u64 {
    let since = (hostcalls::get_current_time().ok())
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .unwrap_or_default();
    u64::try_from(since.as_nanos()).unwrap_or(u64::MAX)
}

/// Settings parsed, with the route metadata's bytes they came from: a route's are parsed once
/// per worker. The most recently used first; at most this many (a proxy limits a few VIPs; a
/// linear scan of a few byte strings costs less than hashing one).
const SETTINGS_KEPT: usize = 16;

/// A parsed setting and its limiter's shared-data key.
pub struct Limited {
    setting: Setting,
    key: String,
}

/// A route metadata's bytes and what they gave (`None`: not a setting).
type Parsed = (Vec<u8>, Option<Rc<Limited>>);

/// What every request of the limit plugin in this worker shares.
pub struct Plugin {
    limited: Option<u32>,
    /// Each cluster's gauge of its limit, defined on first use.
    gauges: RefCell<HashMap<String, Option<u32>>>,
    settings: RefCell<Vec<Parsed>>,
}

impl Plugin {
    pub fn define() -> Plugin {
        Plugin {
            limited: hostcalls::define_metric(MetricType::Counter, METRIC_LIMITED).ok(),
            gauges: RefCell::default(),
            settings: RefCell::default(),
        }
    }

    /// The setting in a route's metadata; `None` (logged when first seen) if it is not one.
    fn setting(&self, bytes: Vec<u8>) -> Option<Rc<Limited>> {
        let mut settings = self.settings.borrow_mut();
        if let Some(at) = settings.iter().position(|(b, _)| *b == bytes) {
            let found = settings[at].1.clone();
            settings[..=at].rotate_right(1);
            return found;
        }
        let parsed = match Setting::parse(&bytes) {
            Ok(setting) => Some(Rc::new(Limited {
                key: key(&setting.cluster),
                setting,
            })),
            Err(e) => {
                let _ = hostcalls::log(LogLevel::Error, &format!("{e}: requests pass unlimited"));
                None
            }
        };
        settings.truncate(SETTINGS_KEPT - 1);
        settings.insert(0, (bytes, parsed.clone()));
        parsed
    }

    /// Sets `cluster`'s gauge to `limit` (`<METRIC_LIMIT>.<METRIC_LABEL>.<cluster>`).
    fn gauge(&self, cluster: &str, limit: u32) {
        let mut gauges = self.gauges.borrow_mut();
        let id = *gauges.entry(cluster.to_owned()).or_insert_with(|| {
            let name = format!("{METRIC_LIMIT}.{METRIC_LABEL}.{cluster}");
            hostcalls::define_metric(MetricType::Gauge, &name).ok()
        });
        if let Some(id) = id {
            let _ = hostcalls::record_metric(id, u64::from(limit));
        }
    }
}

/// One request on a route with a limit.
pub struct Request {
    plugin: Rc<Plugin>,
    /// The limiter whose slot it holds, if it was let in.
    admitted: Option<Rc<Limited>>,
    started: u64,
    /// When its response headers came.
    responded: Option<u64>,
}

impl Request {
    pub fn new(plugin: Rc<Plugin>) -> Request {
        Request {
            plugin,
            admitted: None,
            started: 0,
            responded: None,
        }
    }

    /// The stream is over: its latency (to its response headers, or to now without them)
    /// goes to the limiter and its slot is freed, in one change of the shared state.
    fn end(&mut self) {
        let Some(limited) = self.admitted.take() else {
            return;
        };
        let now = now();
        let rtt = self.responded.unwrap_or(now).saturating_sub(self.started);
        let closed = update(&Envoy, &limited.key, &limited.setting, now, |g| {
            let closed = g.sample(rtt, now).then(|| g.limit());
            g.release();
            closed
        });
        if let Some(Some(limit)) = closed {
            self.plugin.gauge(&limited.setting.cluster, limit);
        }
    }

    fn refuse(&self, setting: &Setting, limit: u32) {
        if let Some(id) = self.plugin.limited {
            let _ = hostcalls::increment_metric(id, 1);
        }
        let body = refusal_body(&setting.cluster, limit);
        let grpc = is_grpc(
            self.get_http_request_header_bytes("content-type")
                .as_deref(),
        );
        let cluster = setting.cluster.as_str();
        if grpc {
            let metadata = vec![(LIMITED_HEADER, cluster.as_bytes())];
            self.send_grpc_response(GrpcStatusCode::Unavailable, Some(body.trim_end()), metadata);
        } else {
            let headers = vec![(LIMITED_HEADER, cluster), ("content-type", "text/plain")];
            self.send_http_response(STATUS, headers, Some(body.as_bytes()));
        }
    }
}

impl Context for Request {}

impl HttpContext for Request {
    fn on_http_request_headers(&mut self, _: usize, _: bool) -> Action {
        // The route the request takes now (the mapping named its cluster): its limit, if any.
        let bytes = self.get_property(crate::ROUTE_METADATA_PATH.to_vec());
        let Some(limited) = bytes.and_then(|b| self.plugin.setting(b)) else {
            return Action::Continue;
        };
        let now = now();
        let setting = &limited.setting;
        match update(&Envoy, &limited.key, setting, now, |g| {
            (g.try_acquire(), g.limit())
        }) {
            Some((true, _)) => {
                self.admitted = Some(limited);
                self.started = now;
                Action::Continue
            }
            Some((false, limit)) => {
                self.refuse(setting, limit);
                Action::Pause
            }
            // The shared state could not be written: as without a limit.
            None => Action::Continue,
        }
    }

    fn on_http_response_headers(&mut self, _: usize, _: bool) -> Action {
        if self.admitted.is_some() && self.responded.is_none() {
            self.responded = Some(now());
        }
        Action::Continue
    }

    fn on_log(&mut self) {
        self.end();
    }
}

impl Drop for Request {
    /// A stream Envoy ends without a log call still frees its slot.
    fn drop(&mut self) {
        self.end();
    }
}
