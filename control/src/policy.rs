//! Per-destination policy: what a cluster gets beyond its endpoints (timeouts, retries,
//! hedging, circuit breakers, outlier detection, load balancing, upstream protocol, idle
//! timeout, injected faults, the callers' concurrency limit), from the policy file (`--policy FILE`), for each calling service,
//! and where each value came from.
//!
//! ```yaml
//! defaults:                      # every cluster
//!   retries: {count: 2}
//! vips:                          # per VIP (`svips:` likewise, per SVIP)
//!   payments:
//!     request_timeout: 300ms
//!     retries: {on: [reset, connect-failure], count: 1}
//!     circuit_breakers: {max_requests: 100}
//!     callers:                   # per calling service: the Envoy node's `cluster`
//!       checkout:
//!         circuit_breakers: {max_requests: 500}
//! ```
//!
//! Precedence, weakest first: odmesh's built-in defaults ([`Settings::builtin`]), the file's
//! `defaults`, the VIP's entry, the VIP's entry for the calling service. Each layer sets only
//! the values it names, down to single fields of `retries`, `circuit_breakers` and
//! `outlier_detection`; a `fault` or `concurrency_limit` entry is whole (a caller's replaces the
//! VIP's). The upstream protocol declared by the instances in the registry sits
//! between the file's `defaults` and the VIP's entry: a service owner knows what their server
//! speaks, and a platform team can still decide per VIP.
//!
//! Everything is checked while the file is read, so an error names the line and the field.
//! Pure: the watcher that reads the file is [`watch`].

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use odmesh_names::Kind;
use serde::{Deserialize, Deserializer, Serialize};

use odmesh_registry::Protocol;

pub mod fault;
pub mod inbound;
pub mod limit;
pub mod watch;

pub use fault::Fault;
pub use limit::ConcurrencyLimit;

/// The whole policy file.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    #[serde(default)]
    defaults: Settings,
    #[serde(default)]
    vips: BTreeMap<VipName, Entry>,
    #[serde(default)]
    svips: BTreeMap<VipName, Entry>,
    /// Per service (the Envoy node's `cluster`): its own inbound side.
    #[serde(default)]
    services: BTreeMap<ServiceName, inbound::Inbound>,
}

/// The policy of one VIP or SVIP, with its per-caller overrides.
type Entry = Settings<BTreeMap<String, Settings>>;

/// Where `callers:` may not be written (the file's `defaults`, a caller's own entry).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NoCallers;

impl<'de> Deserialize<'de> for NoCallers {
    fn deserialize<D: Deserializer<'de>>(_: D) -> Result<NoCallers, D::Error> {
        Err(serde::de::Error::custom(
            "`callers` belongs in a VIP's or SVIP's entry only",
        ))
    }
}

/// One layer of policy: every value optional. `C` is what `callers:` holds: the per-caller
/// overrides in a VIP's entry, nothing elsewhere. (Not `#[serde(flatten)]`, which would cost
/// the errors their line.)
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings<C = NoCallers> {
    /// Per calling service (the Envoy node's `cluster`): overrides of this entry.
    #[serde(default)]
    pub callers: C,
    pub connect_timeout: Option<Positive>,
    /// The whole request, all tries included; 0 for none.
    pub request_timeout: Option<Dur>,
    /// Each try; 0 for none.
    pub per_try_timeout: Option<Dur>,
    /// How long an unused connection to an instance is kept.
    pub idle_timeout: Option<Positive>,
    pub protocol: Option<Protocol>,
    pub load_balancing: Option<LoadBalancing>,
    /// The request header that `ring_hash` and `maglev` hash.
    pub hash_header: Option<HeaderName>,
    pub retries: Option<Retries>,
    pub circuit_breakers: Option<CircuitBreakers>,
    pub outlier_detection: Option<OutlierDetection>,
    /// When a try has had no answer for the per-try timeout, send another try to another
    /// instance without cancelling the first; the first answer wins.
    pub hedge: Option<bool>,
    /// Faults injected for a chaos experiment: a VIP's (or a caller's), never the defaults'.
    pub fault: Option<Fault>,
    /// An adaptive limit of the requests in flight to the VIP from each proxy of a caller: a
    /// VIP's (or a caller's), never the defaults'.
    pub concurrency_limit: Option<ConcurrencyLimit>,
}

/// What to retry, how often, and how fast.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Retries {
    /// Envoy's retry conditions (`x-envoy-retry-on` words).
    pub on: Option<Vec<RetryOn>>,
    /// Retries after the first try (0 to 10).
    pub count: Option<Bounded<0, 10>>,
    /// Base interval of the exponential backoff (the maximum is 10 times it unless given).
    pub backoff: Option<Backoff>,
    /// At most this percent of the active requests may be retries (a retry budget).
    pub budget_percent: Option<Bounded<1, 100>>,
}

/// Exponential backoff between retries: `max` at least `base` (Envoy refuses a cluster
/// otherwise).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, try_from = "RawBackoff")]
pub struct Backoff {
    pub base: Positive,
    pub max: Option<Positive>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBackoff {
    base: Positive,
    max: Option<Positive>,
}

impl TryFrom<RawBackoff> for Backoff {
    type Error = String;
    fn try_from(raw: RawBackoff) -> Result<Backoff, String> {
        if let Some(max) = raw.max
            && max.0 < raw.base.0
        {
            return Err(format!(
                "max ({}) is shorter than base ({})",
                Dur(max.0),
                Dur(raw.base.0)
            ));
        }
        Ok(Backoff {
            base: raw.base,
            max: raw.max,
        })
    }
}

/// An HTTP header name: lowercase letters, digits and `-`, as Envoy takes it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct HeaderName(pub String);

impl<'de> Deserialize<'de> for HeaderName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<HeaderName, D::Error> {
        let name = String::deserialize(d)?.trim().to_ascii_lowercase();
        let valid = !name.is_empty()
            && name.len() <= 100
            && !name.starts_with(':')
            && (name.bytes()).all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !valid {
            return Err(serde::de::Error::custom(format!(
                "{} is not a header name (letters, digits, - and _)",
                odmesh_base::logs::clip(&name)
            )));
        }
        Ok(HeaderName(name))
    }
}

/// Envoy's circuit breakers (per cluster, default priority).
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CircuitBreakers {
    pub max_connections: Option<Bounded<1, 1_000_000>>,
    pub max_pending_requests: Option<Bounded<1, 1_000_000>>,
    pub max_requests: Option<Bounded<1, 1_000_000>>,
    pub max_retries: Option<Bounded<0, 1_000_000>>,
}

/// Envoy's outlier detection: instances that keep failing are ejected for a while.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutlierDetection {
    pub consecutive_5xx: Option<Bounded<1, 1000>>,
    pub interval: Option<Positive>,
    pub base_ejection_time: Option<Positive>,
    pub max_ejection_percent: Option<Bounded<0, 100>>,
}

/// How a cluster picks an instance. The hashing policies hash the request header
/// `hash_header` (default `x-odmesh-hash-key`), so requests with one key go to one instance
/// while it is up; a request without it goes to any.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LoadBalancing {
    RoundRobin,
    LeastRequest,
    RingHash,
    Maglev,
}

/// One of Envoy's retry conditions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RetryOn {
    #[serde(rename = "5xx")]
    FiveXx,
    GatewayError,
    Reset,
    ResetBeforeRequest,
    ConnectFailure,
    RefusedStream,
    EnvoyRatelimited,
    Retriable4xx,
    /// gRPC statuses (for gRPC calls).
    Cancelled,
    DeadlineExceeded,
    Internal,
    ResourceExhausted,
    Unavailable,
}

impl RetryOn {
    /// Envoy's word for it.
    pub fn as_str(self) -> &'static str {
        match self {
            RetryOn::FiveXx => "5xx",
            RetryOn::GatewayError => "gateway-error",
            RetryOn::Reset => "reset",
            RetryOn::ResetBeforeRequest => "reset-before-request",
            RetryOn::ConnectFailure => "connect-failure",
            RetryOn::RefusedStream => "refused-stream",
            RetryOn::EnvoyRatelimited => "envoy-ratelimited",
            RetryOn::Retriable4xx => "retriable-4xx",
            RetryOn::Cancelled => "cancelled",
            RetryOn::DeadlineExceeded => "deadline-exceeded",
            RetryOn::Internal => "internal",
            RetryOn::ResourceExhausted => "resource-exhausted",
            RetryOn::Unavailable => "unavailable",
        }
    }
}

/// The header `ring_hash` and `maglev` hash unless the policy names another.
pub const DEFAULT_HASH_HEADER: &str = "x-odmesh-hash-key";

/// A duration written `300ms`, `2s`, `5m` or `1h` (0 allowed: "none").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Dur(pub Duration);

/// A duration that must not be 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Positive(pub Duration);

/// An integer in `MIN..=MAX`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Bounded<const MIN: u32, const MAX: u32>(pub u32);

/// A service's name as a key of `services:`: the Envoy node's `cluster`, as its bootstrap
/// writes it (any case, at most 256 bytes, not empty).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct ServiceName(String);

impl<'de> Deserialize<'de> for ServiceName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<ServiceName, D::Error> {
        let name = String::deserialize(d)?;
        if name.trim().is_empty() || name.len() > 256 || name.chars().any(char::is_control) {
            return Err(serde::de::Error::custom(format!(
                "{:?} is not a service name (a node's `cluster`: 1 to 256 bytes, no control characters)",
                odmesh_base::logs::clip(&name)
            )));
        }
        Ok(ServiceName(name))
    }
}

/// A VIP name as a key of `vips:`/`svips:`: valid, lowercase.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct VipName(String);

/// Parses `300ms`, `2s`, `5m`, `1h`.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration like 300ms, 2s, 5m or 1h"))?;
    let d = match unit {
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.saturating_mul(60)),
        "h" => Duration::from_secs(n.saturating_mul(3600)),
        _ => return Err(format!("{text:?} needs a unit: ms, s, m or h")),
    };
    if d > Duration::from_secs(24 * 3600) {
        return Err(format!("{text:?} is longer than a day"));
    }
    Ok(d)
}

/// A value read as text or number, for messages.
fn text_of<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Text(String),
        Number(u64),
    }
    Ok(match Raw::deserialize(d)? {
        Raw::Text(t) => t,
        Raw::Number(n) => n.to_string(),
    })
}

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Dur, D::Error> {
        let text = text_of(d)?;
        parse_duration(&text)
            .map(Dur)
            .map_err(serde::de::Error::custom)
    }
}

impl<'de> Deserialize<'de> for Positive {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Positive, D::Error> {
        let Dur(d0) = Dur::deserialize(d)?;
        if d0.is_zero() {
            return Err(serde::de::Error::custom("must be more than 0"));
        }
        Ok(Positive(d0))
    }
}

impl<'de, const MIN: u32, const MAX: u32> Deserialize<'de> for Bounded<MIN, MAX> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let n = u64::deserialize(d)?;
        match u32::try_from(n) {
            Ok(n) if (MIN..=MAX).contains(&n) => Ok(Bounded(n)),
            _ => Err(serde::de::Error::custom(format!(
                "{n} is not between {MIN} and {MAX}"
            ))),
        }
    }
}

impl<'de> Deserialize<'de> for VipName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<VipName, D::Error> {
        let name = String::deserialize(d)?.trim().to_ascii_lowercase();
        odmesh_registry::check_vip(&name).map_err(serde::de::Error::custom)?;
        Ok(VipName(name))
    }
}

impl From<Dur> for Duration {
    fn from(d: Dur) -> Duration {
        d.0
    }
}

impl From<Positive> for Duration {
    fn from(d: Positive) -> Duration {
        d.0
    }
}

impl Serialize for Positive {
    /// As written: `300ms`.
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&Dur(self.0))
    }
}

impl<const MIN: u32, const MAX: u32> Serialize for Bounded<MIN, MAX> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u32(self.0)
    }
}

impl<const MIN: u32, const MAX: u32> From<Bounded<MIN, MAX>> for u32 {
    fn from(n: Bounded<MIN, MAX>) -> u32 {
        n.0
    }
}

impl fmt::Display for Dur {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}ms", self.0.as_millis())
    }
}

/// Why a policy was refused: the parser's error, which says what is wrong and at which line
/// and column, after the field it is about.
#[derive(Debug, thiserror::Error)]
pub enum InvalidPolicy {
    /// A mistake in a field: which one, as in `vips.slow.retries.count`.
    #[error("{field}")]
    Field {
        field: String,
        #[source]
        source: Box<serde_saphyr::Error>,
    },
    /// A mistake in the document as a whole (not a mapping of fields).
    #[error(transparent)]
    Document(Box<serde_saphyr::Error>),
    /// Fields that are each valid but do not go together, as in a hedge without a per-try
    /// timeout.
    #[error("{field}: {reason}")]
    Conflict { field: String, reason: String },
}

impl Policy {
    /// How many entries it has: one per VIP and SVIP, and one for non-empty defaults. What a
    /// policy file that suddenly loses most of them is held by (see [`watch`]).
    pub fn entries(&self) -> usize {
        self.vips.len()
            + self.svips.len()
            + self.services.len()
            + usize::from(self.defaults != Settings::default())
    }

    /// The adaptive concurrency limit in front of `service` (the node's `cluster`), if the
    /// file gives it one.
    pub fn inbound(&self, service: &str) -> Option<&inbound::AdaptiveConcurrency> {
        (self.services.get(&ServiceName(service.to_owned())))
            .and_then(|s| s.adaptive_concurrency.as_ref())
    }

    /// Parses and checks a policy file.
    pub fn parse(yaml: &[u8]) -> Result<Policy, InvalidPolicy> {
        if yaml.iter().all(u8::is_ascii_whitespace) {
            return Ok(Policy::default());
        }
        // One line, without a snippet of the file: it goes to logs and `/debug/policy`.
        let mut options = serde_saphyr::Options::default();
        options.with_snippet = false;
        // serde-saphyr says the line and column; the path says which field, as in
        // `vips.slow.retries.count: invalid u64 at line 4, column 22`.
        let mut path = None;
        serde_saphyr::with_deserializer_from_slice_with_options(yaml, options, |de| {
            serde_path_to_error::deserialize(de).map_err(|e| {
                path = Some(e.path().to_string());
                e.into_inner()
            })
        })
        .map_err(|e| match path.filter(|p| p != ".") {
            Some(field) => InvalidPolicy::Field {
                field,
                source: Box::new(e),
            },
            None => InvalidPolicy::Document(Box::new(e)),
        })
        .and_then(|policy: Policy| policy.check().map(|()| policy))
    }

    /// What the fields cannot say one by one: a fault belongs to a destination, and a hedge
    /// needs a per-try timeout (when to send it) and a retry (what it is), for every caller.
    fn check(&self) -> Result<(), InvalidPolicy> {
        let conflict = |field: String, reason: &str| InvalidPolicy::Conflict {
            field,
            reason: reason.to_owned(),
        };
        if self.defaults.fault.is_some() {
            return Err(conflict(
                "defaults.fault".to_owned(),
                "a fault is for one VIP or SVIP (its entry, or a caller's in it), never for every destination",
            ));
        }
        if self.defaults.concurrency_limit.is_some() {
            return Err(conflict(
                "defaults.concurrency_limit".to_owned(),
                "a concurrency limit is for one VIP or SVIP (its entry, or a caller's in it), never for every destination",
            ));
        }
        let hedge_ok = |e: &Effective| {
            !e.hedge.value || (!e.per_try_timeout.value.is_zero() && e.retries.value > 0)
        };
        const HEDGE: &str = "a hedge is sent when a try has had no answer for the per-try timeout, as a retry: set per_try_timeout, and retries.count of at least 1";
        for (service, inbound) in &self.services {
            let limiter = inbound.adaptive_concurrency.as_ref().map(|a| a.limiter());
            if limiter.is_some_and(|l| l.min_limit > l.max_limit) {
                return Err(conflict(
                    format!("services.{}.adaptive_concurrency", service.0),
                    "min_limit is above max_limit",
                ));
            }
        }
        let mut defaults = Effective::builtin();
        defaults.apply(&self.defaults, Source::Defaults);
        if !hedge_ok(&defaults) {
            return Err(conflict("defaults.hedge".to_owned(), HEDGE));
        }
        for (table, kind, entries) in [
            ("vips", Kind::Vip, &self.vips),
            ("svips", Kind::Svip, &self.svips),
        ] {
            for (vip, entry) in entries {
                let callers = std::iter::once(None).chain(entry.callers.keys().map(Some));
                for caller in callers {
                    let e = self.resolve(kind, &vip.0, caller.map(String::as_str), Protocol::Auto);
                    let field = |name: &str| match caller {
                        None => format!("{table}.{}.{name}", vip.0),
                        Some(c) => format!("{table}.{}.callers.{c}.{name}", vip.0),
                    };
                    if !hedge_ok(&e) {
                        return Err(conflict(field("hedge"), HEDGE));
                    }
                    if let Some(Err(reason)) = e.concurrency_limit.value.as_ref().map(|l| l.check())
                    {
                        return Err(conflict(field("concurrency_limit"), &reason));
                    }
                }
            }
        }
        Ok(())
    }

    /// The entry of `vip` (of `kind`), if the file has one.
    fn entry(&self, kind: Kind, vip: &str) -> Option<&Entry> {
        let table = match kind {
            Kind::Vip => &self.vips,
            Kind::Svip => &self.svips,
        };
        table.get(&VipName(vip.to_owned()))
    }

    /// Whether `caller` has an override of its own for `vip`: its proxies then get their own
    /// version of the cluster, and everyone else shares one.
    pub fn has_caller_override(&self, kind: Kind, vip: &str, caller: &str) -> bool {
        self.entry(kind, vip)
            .is_some_and(|e| e.callers.contains_key(caller))
    }

    /// The effective policy of `vip` (of `kind`) for proxies of `caller` (`None`: a caller
    /// without an override), with `declared` the protocol its instances declare.
    pub fn resolve(
        &self,
        kind: Kind,
        vip: &str,
        caller: Option<&str>,
        declared: Protocol,
    ) -> Effective {
        let mut out = Effective::builtin();
        out.apply(&self.defaults, Source::Defaults);
        if declared != Protocol::Auto {
            out.protocol = Sourced::new(declared, Source::Registry);
        }
        if let Some(entry) = self.entry(kind, vip) {
            out.apply(entry, Source::Vip);
            if let Some(settings) = caller.and_then(|c| entry.callers.get(c)) {
                out.apply(settings, Source::Caller);
            }
        }
        out
    }

    /// What proxies of `caller` give each cluster in their route at `now` (docs/envoy.md,
    /// "Timeouts live in the route"): request and per-try timeouts, hedging, faults whose
    /// `until` has not passed. `default` for every cluster the file does not set apart; each
    /// VIP's or SVIP's cluster whose route-level policy, for this caller, differs from it.
    /// Bounded by the file, never by the registry.
    pub fn routes(&self, caller: &str, now: SystemTime) -> RoutePolicy {
        let level = |e: Effective| RouteLevel {
            timeouts: Timeouts {
                request: e.request_timeout.value,
                per_try: e.per_try_timeout.value,
            },
            hedge: e.hedge.value,
            fault: e.fault.value.filter(|f| f.applies_at(now)),
            limit: e.concurrency_limit.value,
        };
        let mut defaults = Effective::builtin();
        defaults.apply(&self.defaults, Source::Defaults);
        let default = level(defaults);
        let entries = (self.vips.keys().map(|vip| (Kind::Vip, vip)))
            .chain(self.svips.keys().map(|svip| (Kind::Svip, svip)));
        let clusters = entries
            .filter_map(|(kind, vip)| {
                let own = level(self.resolve(kind, &vip.0, Some(caller), Protocol::Auto));
                (own != default).then(|| (odmesh_names::cluster_name(&vip.0, kind), own))
            })
            .collect();
        RoutePolicy { default, clusters }
    }

    /// The first moment after `now` at which a fault entry stops applying: when the routes
    /// must be built again.
    pub fn next_expiry(&self, now: SystemTime) -> Option<SystemTime> {
        let entries = self.vips.values().chain(self.svips.values());
        let settings = entries.flat_map(|e| {
            std::iter::once(e.fault.as_ref()).chain(e.callers.values().map(|c| c.fault.as_ref()))
        });
        (settings.flatten())
            .filter_map(|f| f.until.as_ref().map(fault::Until::at))
            .filter(|at| *at > now)
            .min()
    }

    /// How many entries (a VIP's or SVIP's, or a caller's in one) switch on hedging, a fault
    /// that applies at `now`, and a concurrency limit: what `/metrics` shows of the resilience
    /// policy in use (README, "Per-destination policy").
    pub fn features(&self, now: SystemTime) -> Features {
        let entries = self.vips.values().chain(self.svips.values());
        let settings = entries.flat_map(|e| {
            let callers = e
                .callers
                .values()
                .map(|c| (c.hedge, c.fault.as_ref(), &c.concurrency_limit));
            std::iter::once((e.hedge, e.fault.as_ref(), &e.concurrency_limit)).chain(callers)
        });
        let mut features = Features::default();
        for (hedge, fault, limit) in settings {
            features.hedges += usize::from(hedge == Some(true));
            features.faults += usize::from(fault.is_some_and(|f| f.applies_at(now)));
            features.limits += usize::from(limit.is_some());
        }
        features
    }

    /// Whether going from `self` to `new` can change what `vip` (of `kind`) gets: its entry,
    /// or the defaults, differ.
    pub fn changes_for(&self, new: &Policy, kind: Kind, vip: &str) -> bool {
        self.defaults != new.defaults || self.entry(kind, vip) != new.entry(kind, vip)
    }

    /// The file's VIP and SVIP entries and their callers, for the admin endpoint.
    pub fn summary(&self) -> serde_json::Value {
        let list = |table: &BTreeMap<VipName, Entry>| -> serde_json::Value {
            (table.iter())
                .map(|(vip, entry)| {
                    let callers: Vec<&str> = entry.callers.keys().map(String::as_str).collect();
                    (vip.0.clone(), serde_json::json!({ "callers": callers }))
                })
                .collect::<serde_json::Map<_, _>>()
                .into()
        };
        let services: serde_json::Map<String, serde_json::Value> = (self.services.iter())
            .map(|(name, inbound)| (name.0.clone(), serde_json::json!(inbound)))
            .collect();
        serde_json::json!({
            "vips": list(&self.vips),
            "svips": list(&self.svips),
            "services": services,
        })
    }
}

/// The entries of a policy that switch each resilience feature on ([`Policy::features`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Features {
    pub hedges: usize,
    pub faults: usize,
    pub limits: usize,
}

/// A request's two deadlines, as a route carries them; zero: none.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Timeouts {
    /// The whole request, all tries included.
    pub request: Duration,
    /// Each try.
    pub per_try: Duration,
}

/// What a route gives requests to one cluster.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct RouteLevel {
    pub timeouts: Timeouts,
    /// Hedge on the per-try timeout.
    pub hedge: bool,
    /// Faults to inject, if an entry applies now.
    pub fault: Option<Fault>,
    /// The caller-side concurrency limit, if any.
    pub limit: Option<ConcurrencyLimit>,
}

impl RoutePolicy {
    /// What requests to `cluster` get.
    pub fn level(&self, cluster: &str) -> &RouteLevel {
        self.clusters.get(cluster).unwrap_or(&self.default)
    }
}

impl RouteLevel {
    /// Whether anything but timeouts is set: what the native module's timeout table cannot
    /// carry (the route must).
    pub fn beyond_timeouts(&self) -> bool {
        self.hedge || self.fault.is_some() || self.limit.is_some()
    }
}

/// The route-level policy of every cluster for one calling service ([`Policy::routes`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct RoutePolicy {
    /// Every cluster not in `clusters`.
    pub default: RouteLevel,
    /// By cluster name (`<vip>.vip`, `<svip>.svip`): those whose route-level policy differs
    /// from `default`.
    pub clusters: BTreeMap<String, RouteLevel>,
}

/// Where an effective value came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// odmesh's default.
    Builtin,
    /// The policy file's `defaults`.
    Defaults,
    /// The instances' declaration in the registry.
    Registry,
    /// The VIP's entry in the policy file.
    Vip,
    /// The VIP's entry for the calling service.
    Caller,
}

/// A value and where it came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Sourced<T> {
    pub value: T,
    pub from: Source,
}

impl<T> Sourced<T> {
    fn new(value: T, from: Source) -> Sourced<T> {
        Sourced { value, from }
    }
}

/// Every value a cluster gets, each with its source. What [`crate::xds`] turns into Envoy's
/// fields.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Effective {
    pub connect_timeout: Sourced<Duration>,
    /// Zero: none.
    pub request_timeout: Sourced<Duration>,
    /// Zero: none.
    pub per_try_timeout: Sourced<Duration>,
    pub idle_timeout: Sourced<Duration>,
    pub protocol: Sourced<Protocol>,
    pub load_balancing: Sourced<LoadBalancing>,
    pub hash_header: Sourced<HeaderName>,
    pub retry_on: Sourced<Vec<RetryOn>>,
    pub retries: Sourced<u32>,
    pub retry_backoff_base: Sourced<Duration>,
    pub retry_backoff_max: Sourced<Duration>,
    /// Zero: no budget (`max_retries` bounds the retries alone).
    pub retry_budget_percent: Sourced<u32>,
    pub max_connections: Sourced<u32>,
    pub max_pending_requests: Sourced<u32>,
    pub max_requests: Sourced<u32>,
    pub max_retries: Sourced<u32>,
    pub consecutive_5xx: Sourced<u32>,
    pub outlier_interval: Sourced<Duration>,
    pub base_ejection_time: Sourced<Duration>,
    pub max_ejection_percent: Sourced<u32>,
    pub hedge: Sourced<bool>,
    /// `None`: no fault.
    pub fault: Sourced<Option<Fault>>,
    /// `None`: no limit.
    pub concurrency_limit: Sourced<Option<ConcurrencyLimit>>,
}

impl Effective {
    /// What `/debug/policy` shows: every value with its source, and whether the fault applies
    /// at `now` (`"applies": false` once its `until` has passed: proxies no longer get it).
    pub fn debug_view(&self, now: SystemTime) -> serde_json::Value {
        let mut view = serde_json::to_value(self).unwrap_or_default();
        if let Some(fault) = &self.fault.value {
            view["fault"]["applies"] = fault.applies_at(now).into();
        }
        view
    }

    /// odmesh's defaults, with no policy file: Envoy's own defaults, plus a retry of a request
    /// that never reached an instance (connect failure, refused stream, reset before the
    /// request), twice, each on another instance, so an instance that died before the
    /// registry knew costs no request.
    pub fn builtin() -> Effective {
        fn b<T>(value: T) -> Sourced<T> {
            Sourced::new(value, Source::Builtin)
        }
        let secs = |s| b(Duration::from_secs(s));
        Effective {
            connect_timeout: secs(1),
            request_timeout: secs(0),
            per_try_timeout: secs(0),
            idle_timeout: secs(3600),
            protocol: Sourced::new(Protocol::Auto, Source::Builtin),
            load_balancing: Sourced::new(LoadBalancing::RoundRobin, Source::Builtin),
            hash_header: b(HeaderName(DEFAULT_HASH_HEADER.to_owned())),
            retry_on: Sourced::new(
                vec![
                    RetryOn::ConnectFailure,
                    RetryOn::RefusedStream,
                    RetryOn::ResetBeforeRequest,
                ],
                Source::Builtin,
            ),
            retries: b(2),
            retry_backoff_base: b(Duration::from_millis(25)),
            retry_backoff_max: b(Duration::from_millis(250)),
            retry_budget_percent: b(0),
            max_connections: b(1024),
            max_pending_requests: b(1024),
            max_requests: b(1024),
            max_retries: b(3),
            consecutive_5xx: b(5),
            outlier_interval: secs(10),
            base_ejection_time: secs(30),
            max_ejection_percent: b(10),
            hedge: b(false),
            fault: Sourced::new(None, Source::Builtin),
            concurrency_limit: Sourced::new(None, Source::Builtin),
        }
    }

    /// Applies the values `s` sets, marked as coming from `from`.
    fn apply<C>(&mut self, s: &Settings<C>, from: Source) {
        /// Sets `slot` to `value` (a parsed form that converts to the slot's type) if the
        /// layer has one.
        fn set<T, V: Clone + Into<T>>(slot: &mut Sourced<T>, value: &Option<V>, from: Source) {
            if let Some(value) = value {
                *slot = Sourced::new(value.clone().into(), from);
            }
        }
        set(&mut self.connect_timeout, &s.connect_timeout, from);
        set(&mut self.request_timeout, &s.request_timeout, from);
        set(&mut self.per_try_timeout, &s.per_try_timeout, from);
        set(&mut self.idle_timeout, &s.idle_timeout, from);
        set(&mut self.protocol, &s.protocol, from);
        set(&mut self.load_balancing, &s.load_balancing, from);
        set(&mut self.hash_header, &s.hash_header, from);
        if let Some(r) = &s.retries {
            set(&mut self.retry_on, &r.on, from);
            set(&mut self.retries, &r.count, from);
            if let Some(backoff) = &r.backoff {
                set(&mut self.retry_backoff_base, &Some(backoff.base), from);
                let max = backoff.max.map_or(backoff.base.0 * 10, |m| m.0);
                set(&mut self.retry_backoff_max, &Some(max), from);
            }
            set(&mut self.retry_budget_percent, &r.budget_percent, from);
        }
        if let Some(c) = &s.circuit_breakers {
            set(&mut self.max_connections, &c.max_connections, from);
            set(
                &mut self.max_pending_requests,
                &c.max_pending_requests,
                from,
            );
            set(&mut self.max_requests, &c.max_requests, from);
            set(&mut self.max_retries, &c.max_retries, from);
        }
        if let Some(o) = &s.outlier_detection {
            set(&mut self.consecutive_5xx, &o.consecutive_5xx, from);
            set(&mut self.outlier_interval, &o.interval, from);
            set(&mut self.base_ejection_time, &o.base_ejection_time, from);
            set(
                &mut self.max_ejection_percent,
                &o.max_ejection_percent,
                from,
            );
        }
        set(&mut self.hedge, &s.hedge, from);
        if let Some(fault) = &s.fault {
            self.fault = Sourced::new(Some(fault.clone()), from);
        }
        if let Some(limit) = &s.concurrency_limit {
            self.concurrency_limit = Sourced::new(Some(limit.clone()), from);
        }
    }
}

/// The policy in use, shared: replaced whole when the file changes.
pub type SharedPolicy = Arc<Policy>;

#[cfg(test)]
mod tests;
