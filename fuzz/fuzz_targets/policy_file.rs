//! The policy file (`--policy`, YAML), any bytes, through `odmesh_control::policy::Policy::parse`,
//! the parser its watcher uses. Checks:
//! - a refusal says why: the cause at the end of its chain has a message (the watcher logs
//!   the chain);
//! - in an accepted policy, every value a proxy of any caller gets for any VIP or SVIP
//!   (`Policy::resolve`) is within the ranges the parser enforces (durations up to a day,
//!   positive where 0 means nothing, counts and percentages within their bounds, a backoff's
//!   maximum at least its base, a header name as Envoy takes it), and comes from a layer that
//!   applies (the file's `defaults`, the VIP's entry, the caller's own); a caller without an
//!   entry gets the VIP's; the VIP names are valid and lowercase;
//! - the policy has no serde `Serialize`, so it is written back from what it resolves to: each
//!   layer's values (those whose source is that layer) as a YAML flow document; that document
//!   is accepted and resolves to the same values, with the same VIPs and callers.
#![no_main]

use std::fmt::Write as _;
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use odmesh_control::policy::{Effective, Policy, Source};
use odmesh_fuzz::assert_says_why;
use odmesh_names::Kind;
use odmesh_registry::Protocol;

const DAY: Duration = Duration::from_secs(24 * 3600);

fuzz_target!(|data: &[u8]| {
    let policy = match Policy::parse(data) {
        Ok(policy) => policy,
        Err(e) => {
            assert_says_why(&e);
            return;
        }
    };
    let layers = Layers::of(&policy);
    let written = layers.write();
    let again = match Policy::parse(written.as_bytes()) {
        Ok(again) => again,
        Err(e) => panic!("the policy written back is refused ({e}): {written}"),
    };
    let layers_again = Layers::of(&again);
    assert_eq!(
        layers, layers_again,
        "the policy written back resolves differently: {written}"
    );
});

/// What a policy resolves to: for a VIP it has no entry for, and for each VIP and SVIP it has
/// one for, for every caller with an entry of its own and for one without.
#[derive(Debug, PartialEq)]
struct Layers {
    defaults: Effective,
    entries: Vec<VipLayers>,
}

#[derive(Debug, PartialEq)]
struct VipLayers {
    kind: Kind,
    vip: String,
    /// As a caller without an entry of its own gets it.
    vip_layer: Effective,
    callers: Vec<(String, Effective)>,
}

impl Layers {
    /// Resolves everything `policy` has, checking each value.
    fn of(policy: &Policy) -> Layers {
        let summary = policy.summary();
        let mut entries = Vec::new();
        for (kind, table) in [(Kind::Vip, "vips"), (Kind::Svip, "svips")] {
            let table = summary[table].as_object().expect("a table of entries");
            for (vip, entry) in table {
                assert!(
                    odmesh_registry::check_vip(vip).is_ok() && *vip == vip.to_ascii_lowercase(),
                    "an entry for {vip:?}, not a valid lowercase VIP"
                );
                let callers: Vec<String> = (entry["callers"].as_array().expect("callers").iter())
                    .map(|c| c.as_str().expect("a caller").to_owned())
                    .collect();
                let stranger = unlisted(&callers);
                assert!(!policy.has_caller_override(kind, vip, &stranger));
                let vip_layer = policy.resolve(kind, vip, None, Protocol::Auto);
                check(
                    &vip_layer,
                    &[Source::Builtin, Source::Defaults, Source::Vip],
                );
                let other = policy.resolve(kind, vip, Some(&stranger), Protocol::Auto);
                assert_eq!(other, vip_layer, "a caller without an entry of its own");
                let callers = (callers.into_iter())
                    .map(|caller| {
                        assert!(policy.has_caller_override(kind, vip, &caller));
                        let e = policy.resolve(kind, vip, Some(&caller), Protocol::Auto);
                        check(
                            &e,
                            &[
                                Source::Builtin,
                                Source::Defaults,
                                Source::Vip,
                                Source::Caller,
                            ],
                        );
                        (caller, e)
                    })
                    .collect();
                entries.push(VipLayers {
                    kind,
                    vip: vip.clone(),
                    vip_layer,
                    callers,
                });
            }
        }
        let listed: Vec<String> = entries.iter().map(|e| e.vip.clone()).collect();
        let defaults = policy.resolve(Kind::Vip, &unlisted(&listed), None, Protocol::Auto);
        check(&defaults, &[Source::Builtin, Source::Defaults]);
        let overrides = usize::from(defaults != Effective::builtin());
        let entries_count = policy.entries();
        assert!(
            entries_count == entries.len() + overrides || entries_count == entries.len() + 1,
            "entries() is {entries_count} with {} VIP and SVIP entries",
            entries.len()
        );
        Layers { defaults, entries }
    }

    /// The policy as a YAML flow document: each layer's own values.
    fn write(&self) -> String {
        let mut out = String::from("{defaults: ");
        out += &layer(&self.defaults, Source::Defaults, "");
        for (kind, table) in [(Kind::Vip, "vips"), (Kind::Svip, "svips")] {
            let _ = write!(out, ", {table}: {{");
            let entries = self.entries.iter().filter(|e| e.kind == kind);
            for (i, entry) in entries.enumerate() {
                let callers: Vec<String> = (entry.callers.iter())
                    .map(|(caller, e)| {
                        format!("{}: {}", quote(caller), layer(e, Source::Caller, ""))
                    })
                    .collect();
                let callers = format!("callers: {{{}}}", callers.join(", "));
                let sep = if i == 0 { "" } else { ", " };
                let body = layer(&entry.vip_layer, Source::Vip, &callers);
                let _ = write!(out, "{sep}{}: {body}", quote(&entry.vip));
            }
            out += "}";
        }
        out += "}";
        out
    }
}

/// A name not in `names`.
fn unlisted(names: &[String]) -> String {
    (0..)
        .map(|i| format!("odmesh-fuzz-unlisted-{i}"))
        .find(|name| !names.contains(name))
        .expect("a name")
}

/// Checks every value of `e` against the parser's ranges, and that each comes from one of
/// `sources`.
fn check(e: &Effective, sources: &[Source]) {
    let positive = |d: Duration, what: &str| {
        assert!(
            !d.is_zero() && d <= DAY,
            "{what} is {d:?}: not more than 0 and at most a day"
        );
    };
    let within = |d: Duration, what: &str| assert!(d <= DAY, "{what} is {d:?}: over a day");
    let between = |n: u32, min: u32, max: u32, what: &str| {
        assert!(
            (min..=max).contains(&n),
            "{what} is {n}, not between {min} and {max}"
        );
    };
    positive(e.connect_timeout.value, "connect_timeout");
    within(e.request_timeout.value, "request_timeout");
    within(e.per_try_timeout.value, "per_try_timeout");
    positive(e.idle_timeout.value, "idle_timeout");
    let header = &e.hash_header.value.0;
    assert!(
        !header.is_empty()
            && header.len() <= 100
            && (header.bytes())
                .all(|b| b.is_ascii_digit() || b.is_ascii_lowercase() || b == b'-' || b == b'_'),
        "hash_header {header:?}"
    );
    between(e.retries.value, 0, 10, "retries.count");
    positive(e.retry_backoff_base.value, "retries.backoff.base");
    let (base, max) = (e.retry_backoff_base.value, e.retry_backoff_max.value);
    // The maximum is at least the base; unless written, it is 10 times it.
    assert!(
        base <= max && max <= 10 * DAY,
        "retries.backoff: base {base:?}, max {max:?}"
    );
    if e.retry_budget_percent.from != Source::Builtin {
        between(
            e.retry_budget_percent.value,
            1,
            100,
            "retries.budget_percent",
        );
    }
    between(e.max_connections.value, 1, 1_000_000, "max_connections");
    between(
        e.max_pending_requests.value,
        1,
        1_000_000,
        "max_pending_requests",
    );
    between(e.max_requests.value, 1, 1_000_000, "max_requests");
    between(e.max_retries.value, 0, 1_000_000, "max_retries");
    between(e.consecutive_5xx.value, 1, 1000, "consecutive_5xx");
    positive(e.outlier_interval.value, "outlier_detection.interval");
    positive(e.base_ejection_time.value, "base_ejection_time");
    between(e.max_ejection_percent.value, 0, 100, "max_ejection_percent");
    for (what, from) in sources_of(e) {
        assert!(
            sources.contains(&from),
            "{what} comes from {from:?}, not one of {sources:?}"
        );
    }
}

fn sources_of(e: &Effective) -> [(&'static str, Source); 20] {
    [
        ("connect_timeout", e.connect_timeout.from),
        ("request_timeout", e.request_timeout.from),
        ("per_try_timeout", e.per_try_timeout.from),
        ("idle_timeout", e.idle_timeout.from),
        ("protocol", e.protocol.from),
        ("load_balancing", e.load_balancing.from),
        ("hash_header", e.hash_header.from),
        ("retries.on", e.retry_on.from),
        ("retries.count", e.retries.from),
        ("retries.backoff.base", e.retry_backoff_base.from),
        ("retries.backoff.max", e.retry_backoff_max.from),
        ("retries.budget_percent", e.retry_budget_percent.from),
        ("max_connections", e.max_connections.from),
        ("max_pending_requests", e.max_pending_requests.from),
        ("max_requests", e.max_requests.from),
        ("max_retries", e.max_retries.from),
        ("consecutive_5xx", e.consecutive_5xx.from),
        ("outlier_detection.interval", e.outlier_interval.from),
        ("base_ejection_time", e.base_ejection_time.from),
        ("max_ejection_percent", e.max_ejection_percent.from),
    ]
}

/// The values of `e` that come from layer `from`, as a YAML flow mapping, with `extra` (the
/// VIP's callers) in it.
fn layer(e: &Effective, from: Source, extra: &str) -> String {
    let ms = |d: Duration| format!("{}ms", d.as_millis());
    let mut fields: Vec<String> = Vec::new();
    let mut put = |key: &str, set: bool, value: String| {
        if set {
            fields.push(format!("{key}: {value}"));
        }
    };
    put(
        "connect_timeout",
        e.connect_timeout.from == from,
        ms(e.connect_timeout.value),
    );
    put(
        "request_timeout",
        e.request_timeout.from == from,
        ms(e.request_timeout.value),
    );
    put(
        "per_try_timeout",
        e.per_try_timeout.from == from,
        ms(e.per_try_timeout.value),
    );
    put(
        "idle_timeout",
        e.idle_timeout.from == from,
        ms(e.idle_timeout.value),
    );
    put(
        "protocol",
        e.protocol.from == from,
        e.protocol.value.as_str().to_owned(),
    );
    put(
        "load_balancing",
        e.load_balancing.from == from,
        serde_json::to_value(e.load_balancing.value)
            .expect("a word")
            .as_str()
            .expect("a word")
            .to_owned(),
    );
    put(
        "hash_header",
        e.hash_header.from == from,
        quote(&e.hash_header.value.0),
    );
    let mut retries: Vec<String> = Vec::new();
    if e.retry_on.from == from {
        let on: Vec<String> = e.retry_on.value.iter().map(|r| quote(r.as_str())).collect();
        retries.push(format!("on: [{}]", on.join(", ")));
    }
    if e.retries.from == from {
        retries.push(format!("count: {}", e.retries.value));
    }
    if e.retry_backoff_base.from == from {
        let (base, max) = (e.retry_backoff_base.value, e.retry_backoff_max.value);
        // A maximum 10 times the base need not be written (and may be over a day).
        let max = match max == base * 10 {
            true => String::new(),
            false => format!(", max: {}", ms(max)),
        };
        retries.push(format!("backoff: {{base: {}{max}}}", ms(base)));
    }
    if e.retry_budget_percent.from == from {
        retries.push(format!("budget_percent: {}", e.retry_budget_percent.value));
    }
    put(
        "retries",
        !retries.is_empty(),
        format!("{{{}}}", retries.join(", ")),
    );
    let mut breakers: Vec<String> = Vec::new();
    for (key, value) in [
        ("max_connections", e.max_connections),
        ("max_pending_requests", e.max_pending_requests),
        ("max_requests", e.max_requests),
        ("max_retries", e.max_retries),
    ] {
        if value.from == from {
            breakers.push(format!("{key}: {}", value.value));
        }
    }
    put(
        "circuit_breakers",
        !breakers.is_empty(),
        format!("{{{}}}", breakers.join(", ")),
    );
    let mut outlier: Vec<String> = Vec::new();
    if e.consecutive_5xx.from == from {
        outlier.push(format!("consecutive_5xx: {}", e.consecutive_5xx.value));
    }
    if e.outlier_interval.from == from {
        outlier.push(format!("interval: {}", ms(e.outlier_interval.value)));
    }
    if e.base_ejection_time.from == from {
        outlier.push(format!(
            "base_ejection_time: {}",
            ms(e.base_ejection_time.value)
        ));
    }
    if e.max_ejection_percent.from == from {
        outlier.push(format!(
            "max_ejection_percent: {}",
            e.max_ejection_percent.value
        ));
    }
    put(
        "outlier_detection",
        !outlier.is_empty(),
        format!("{{{}}}", outlier.join(", ")),
    );
    if !extra.is_empty() {
        fields.push(extra.to_owned());
    }
    format!("{{{}}}", fields.join(", "))
}

/// `text` as a YAML double-quoted scalar: printable ASCII as is, everything else escaped.
fn quote(text: &str) -> String {
    let mut out = String::from("\"");
    for c in text.chars() {
        match c {
            '"' => out += "\\\"",
            '\\' => out += "\\\\",
            ' '..='~' => out.push(c),
            c if u32::from(c) <= 0xffff => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => {
                let _ = write!(out, "\\U{:08x}", u32::from(c));
            }
        }
    }
    out.push('"');
    out
}
