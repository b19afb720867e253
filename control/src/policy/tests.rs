use super::*;
use odmesh_base::error::{Chain, repeats_its_cause};
use std::time::SystemTime;

const EXAMPLE: &str = r#"
defaults:
  connect_timeout: 2s
  retries:
    count: 3
vips:
  payments:
    request_timeout: 300ms
    retries:
      on: [reset, connect-failure]
      count: 1
    circuit_breakers: {max_requests: 100}
    callers:
      checkout:
        circuit_breakers: {max_requests: 500}
        request_timeout: 1s
svips:
  payments:
    protocol: http2
"#;

fn example() -> Policy {
    Policy::parse(EXAMPLE.as_bytes()).unwrap()
}

#[test]
fn without_a_policy_every_cluster_gets_the_builtin_defaults() {
    let e = Policy::default().resolve(Kind::Vip, "hello", None, Protocol::Auto);
    assert_eq!(e, Effective::builtin());
    assert_eq!(e.retries.value, 2);
    assert_eq!(
        e.retry_on.value,
        [
            RetryOn::ConnectFailure,
            RetryOn::RefusedStream,
            RetryOn::ResetBeforeRequest
        ]
    );
    assert_eq!(
        e.request_timeout.value,
        Duration::ZERO,
        "no request timeout"
    );
}

#[test]
fn layers_apply_weakest_first_and_each_value_says_where_it_came_from() {
    let p = example();
    let e = p.resolve(Kind::Vip, "payments", None, Protocol::Auto);
    assert_eq!(
        e.connect_timeout,
        Sourced::new(Duration::from_secs(2), Source::Defaults)
    );
    assert_eq!(
        e.request_timeout,
        Sourced::new(Duration::from_millis(300), Source::Vip)
    );
    assert_eq!(
        e.retries,
        Sourced::new(1, Source::Vip),
        "the VIP's count beats the defaults'"
    );
    assert_eq!(e.retry_on.value, [RetryOn::Reset, RetryOn::ConnectFailure]);
    assert_eq!(e.max_requests, Sourced::new(100, Source::Vip));
    assert_eq!(
        e.max_connections,
        Sourced::new(1024, Source::Builtin),
        "field by field"
    );

    let checkout = p.resolve(Kind::Vip, "payments", Some("checkout"), Protocol::Auto);
    assert_eq!(checkout.max_requests, Sourced::new(500, Source::Caller));
    assert_eq!(checkout.request_timeout.value, Duration::from_secs(1));
    assert_eq!(checkout.retries, Sourced::new(1, Source::Vip));

    // Another VIP gets the defaults only; another caller gets the VIP's entry.
    let other = p.resolve(Kind::Vip, "ledger", Some("checkout"), Protocol::Auto);
    assert_eq!(other.retries, Sourced::new(3, Source::Defaults));
    assert_eq!(other.max_requests.from, Source::Builtin);
    let cart = p.resolve(Kind::Vip, "payments", Some("cart"), Protocol::Auto);
    assert_eq!(cart.max_requests, Sourced::new(100, Source::Vip));
}

#[test]
fn vips_and_svips_are_separate_tables_and_only_named_callers_have_overrides() {
    let p = example();
    let svip = p.resolve(Kind::Svip, "payments", None, Protocol::Auto);
    assert_eq!(svip.protocol, Sourced::new(Protocol::Http2, Source::Vip));
    assert_eq!(svip.request_timeout.from, Source::Builtin);
    assert!(p.has_caller_override(Kind::Vip, "payments", "checkout"));
    assert!(!p.has_caller_override(Kind::Vip, "payments", "cart"));
    assert!(!p.has_caller_override(Kind::Svip, "payments", "checkout"));
}

#[test]
fn a_protocol_declared_in_the_registry_beats_the_defaults_but_not_the_vip_entry() {
    let p = Policy::parse(b"defaults: {protocol: http1}\nvips: {grpc: {protocol: http2}}").unwrap();
    let declared = p.resolve(Kind::Vip, "web", None, Protocol::Http2);
    assert_eq!(
        declared.protocol,
        Sourced::new(Protocol::Http2, Source::Registry)
    );
    let undeclared = p.resolve(Kind::Vip, "web", None, Protocol::Auto);
    assert_eq!(
        undeclared.protocol,
        Sourced::new(Protocol::Http1, Source::Defaults)
    );
    let entry = p.resolve(Kind::Vip, "grpc", None, Protocol::Http1);
    assert_eq!(entry.protocol, Sourced::new(Protocol::Http2, Source::Vip));
}

#[test]
fn a_backoff_without_a_maximum_gets_ten_times_its_base() {
    let p = Policy::parse(b"defaults: {retries: {backoff: {base: 50ms}}}").unwrap();
    let e = p.resolve(Kind::Vip, "x", None, Protocol::Auto);
    assert_eq!(e.retry_backoff_base.value, Duration::from_millis(50));
    assert_eq!(e.retry_backoff_max.value, Duration::from_millis(500));
}

#[test]
fn an_empty_file_is_the_empty_policy() {
    assert_eq!(Policy::parse(b"").unwrap(), Policy::default());
    assert_eq!(Policy::parse(b"  \n").unwrap(), Policy::default());
}

/// The error for `yaml`, which must be refused.
fn refused(yaml: &str) -> String {
    let error = Policy::parse(yaml.as_bytes()).expect_err("the policy should be refused");
    assert!(!repeats_its_cause(&error), "{}", Chain(&error));
    Chain(&error).to_string()
}

#[test]
fn every_mistake_is_refused_with_its_field_and_line() {
    for (yaml, says) in [
        (
            "vips:\n  payments:\n    retries: {count: 11}\n",
            "11 is not between 0 and 10",
        ),
        (
            "vips:\n  payments:\n    request_timeout: 3\n",
            "needs a unit",
        ),
        (
            "vips:\n  payments:\n    request_timeout: soon\n",
            "is not a duration",
        ),
        (
            "vips:\n  payments:\n    connect_timeout: 0s\n",
            "must be more than 0",
        ),
        (
            "vips:\n  payments:\n    retries: {on: [sometimes]}\n",
            "unknown variant `sometimes`",
        ),
        (
            "vips:\n  payments:\n    timeout: 1s\n",
            "unknown field `timeout`",
        ),
        (
            "vips:\n  payments:\n    load_balancing: random\n",
            "unknown variant `random`",
        ),
        (
            "vips:\n  \"bad name!\":\n    retries: {count: 1}\n",
            "not a valid VIP",
        ),
        (
            "vips:\n  payments:\n    outlier_detection: {max_ejection_percent: 101}\n",
            "101 is not between 0 and 100",
        ),
        ("defaults:\n  request_timeout: 2d\n", "needs a unit"),
        ("vipz: {}\n", "unknown field `vipz`"),
    ] {
        let error = refused(yaml);
        assert!(error.contains(says), "{yaml:?}: {error}");
        assert!(
            error.contains("line "),
            "{yaml:?}: the error should give the line: {error}"
        );
    }
}

#[test]
fn the_error_names_the_line_of_the_mistake() {
    let error =
        refused("defaults:\n  retries: {count: 1}\nvips:\n  payments:\n    retries: {count: 99}\n");
    assert!(error.contains("line 5"), "{error}");
}

#[test]
fn durations_take_the_usual_units() {
    for (text, d) in [
        ("0s", Duration::ZERO),
        ("250ms", Duration::from_millis(250)),
        ("2s", Duration::from_secs(2)),
        ("5m", Duration::from_secs(300)),
        ("1h", Duration::from_secs(3600)),
    ] {
        assert_eq!(parse_duration(text), Ok(d), "{text}");
    }
    assert!(
        parse_duration("25h")
            .unwrap_err()
            .contains("longer than a day")
    );
    assert!(parse_duration("-1s").is_err());
}

#[test]
fn callers_belong_in_a_vip_entry_only() {
    let error = refused("defaults:\n  callers: {checkout: {}}\n");
    assert!(
        error.contains("belongs in a VIP's or SVIP's entry only"),
        "{error}"
    );
    let error = refused("vips:\n  a:\n    callers:\n      c:\n        callers: {}\n");
    assert!(
        error.contains("belongs in a VIP's or SVIP's entry only"),
        "{error}"
    );
    assert!(error.contains("line 5"), "{error}");
}

#[test]
fn a_mistake_inside_a_vip_entry_names_its_field_and_its_own_line() {
    let error = refused("vips:\n  slow:\n    request_timeout: 300ms\n    retries: {count: many}\n");
    assert!(error.contains("vips.slow.retries.count"), "{error}");
    assert!(error.contains("line 4"), "{error}");
}

#[test]
fn a_backoff_whose_maximum_is_below_its_base_is_refused() {
    let error = refused("vips:\n  a:\n    retries: {backoff: {base: 1s, max: 100ms}}\n");
    assert!(
        error.contains("max (100ms) is shorter than base (1000ms)"),
        "{error}"
    );
    assert!(error.contains("line 3"), "{error}");
}

#[test]
fn the_hash_header_is_a_header_name_and_defaults_to_x_odmesh_hash_key() {
    let p = Policy::parse(b"vips: {a: {load_balancing: ring_hash, hash_header: X-User}}").unwrap();
    let a = p.resolve(Kind::Vip, "a", None, Protocol::Auto);
    assert_eq!(
        a.hash_header,
        Sourced::new(HeaderName("x-user".into()), Source::Vip)
    );
    let b = p.resolve(Kind::Vip, "b", None, Protocol::Auto);
    assert_eq!(b.hash_header.value.0, DEFAULT_HASH_HEADER);
    let error = refused("vips: {a: {hash_header: \"bad header\"}}");
    assert!(error.contains("is not a header name"), "{error}");
}

#[test]
fn a_change_concerns_a_vip_when_its_entry_or_the_defaults_change() {
    let before =
        Policy::parse(b"vips: {a: {retries: {count: 1}}, b: {retries: {count: 1}}}").unwrap();
    let after =
        Policy::parse(b"vips: {a: {retries: {count: 2}}, b: {retries: {count: 1}}}").unwrap();
    assert!(before.changes_for(&after, Kind::Vip, "a"));
    assert!(!before.changes_for(&after, Kind::Vip, "b"));
    assert!(!before.changes_for(&after, Kind::Vip, "c"));
    let defaults = Policy::parse(b"defaults: {retries: {count: 3}}").unwrap();
    assert!(before.changes_for(&defaults, Kind::Vip, "c"));
}

#[test]
fn an_unknown_field_names_its_path_line_and_column() {
    let error = refused("vips:\n  payments:\n    retries: {count: 1}\n    timeout: 1s\n");
    assert!(
        error.starts_with("vips.payments.timeout: unknown field `timeout`"),
        "{error}"
    );
    assert!(error.ends_with("at line 4, column 5"), "{error}");
}

#[test]
fn a_policy_file_error_shows_its_cause_once() {
    use super::watch::PolicyFileError;
    let document = Policy::parse(b"hello").unwrap_err();
    assert!(matches!(document, InvalidPolicy::Document(_)), "{document}");
    assert_eq!(
        Chain(&document).to_string(),
        "expected mapping start at line 1, column 1"
    );
    let path = std::path::PathBuf::from("/etc/odmesh/policy.yaml");
    let errors = [
        PolicyFileError::Read {
            path: path.clone(),
            source: std::io::Error::other("permission denied"),
        },
        PolicyFileError::Invalid {
            path,
            source: Policy::parse(b"vips: {a: {retries: {count: many}}}").unwrap_err(),
        },
    ];
    for e in errors {
        assert!(!repeats_its_cause(&e), "{}", Chain(&e));
        let shown = Chain(&e).to_string();
        assert!(shown.contains("/etc/odmesh/policy.yaml: "), "{shown}");
        assert!(
            shown.ends_with("permission denied") || shown.contains("line 1"),
            "{shown}"
        );
    }
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// "Now" for route-level policy without fault times.
const NOW: SystemTime = SystemTime::UNIX_EPOCH;

/// The timeouts of each cluster set apart in `caller`'s routes.
fn timeouts_of(policy: &Policy, caller: &str) -> (Timeouts, BTreeMap<String, Timeouts>) {
    let routes = policy.routes(caller, NOW);
    let clusters = (routes.clusters.into_iter())
        .map(|(cluster, level)| (cluster, level.timeouts))
        .collect();
    (routes.default.timeouts, clusters)
}

#[test]
fn the_routes_timeouts_list_only_the_clusters_that_differ_from_the_defaults_per_caller() {
    let policy = example();
    let (default, clusters) = timeouts_of(&policy, "shipping");
    assert_eq!(default, Timeouts::default());
    let payments = Timeouts {
        request: ms(300),
        per_try: Duration::ZERO,
    };
    // The SVIP's entry sets no timeout: it is not listed.
    assert_eq!(
        clusters,
        BTreeMap::from([("payments.vip".to_owned(), payments)])
    );
    let (_, checkout) = timeouts_of(&policy, "checkout");
    assert_eq!(checkout["payments.vip"].request, ms(1000));
    assert_eq!(Policy::default().routes("x", NOW), RoutePolicy::default());
}

#[test]
fn a_default_timeout_applies_to_every_cluster_and_an_entry_can_lift_it() {
    let policy = Policy::parse(
        b"defaults: {request_timeout: 2s, per_try_timeout: 500ms}
vips:
  slow: {request_timeout: 0s}
  same: {request_timeout: 2s}
  tries: {per_try_timeout: 100ms}
",
    )
    .unwrap();
    let (default, clusters) = timeouts_of(&policy, "anyone");
    assert_eq!(
        default,
        Timeouts {
            request: ms(2000),
            per_try: ms(500)
        }
    );
    let expected = BTreeMap::from([
        (
            "slow.vip".to_owned(),
            Timeouts {
                request: Duration::ZERO,
                per_try: ms(500),
            },
        ),
        (
            "tries.vip".to_owned(),
            Timeouts {
                request: ms(2000),
                per_try: ms(100),
            },
        ),
    ]);
    assert_eq!(clusters, expected);
}

#[test]
fn hedging_and_faults_are_per_vip_and_caller_and_a_callers_fault_replaces_the_vips() {
    let policy = Policy::parse(
        br#"
defaults: {per_try_timeout: 100ms}
vips:
  search:
    hedge: true
    callers:
      batch: {hedge: false}
  payments:
    fault:
      abort: {status: 503, percent: 50}
      header: X-Chaos
    callers:
      checkout:
        fault:
          delay: {fixed: 500ms}
"#,
    )
    .unwrap();
    let web = policy.routes("web", NOW);
    assert!(web.clusters["search.vip"].hedge);
    assert!(!web.default.hedge && web.default.fault.is_none());
    let abort = web.clusters["payments.vip"].fault.as_ref().unwrap();
    assert_eq!(abort.delay, None);
    let expected = fault::Abort {
        with: fault::AbortWith::Status(503),
        percent: fault::Percent {
            per_million: 500_000,
        },
    };
    assert_eq!(abort.abort, Some(expected));
    assert_eq!(abort.header, Some(HeaderName("x-chaos".to_owned())));

    let checkout = policy.routes("checkout", NOW);
    let delay = checkout.clusters["payments.vip"].fault.as_ref().unwrap();
    assert_eq!(delay.abort, None, "the caller's fault is whole, not merged");
    assert_eq!(delay.delay.as_ref().unwrap().fixed.0, ms(500));
    assert_eq!(
        delay.delay.as_ref().unwrap().percent.per_million,
        1_000_000,
        "every request by default"
    );
    let batch = policy.routes("batch", NOW);
    assert!(!batch.clusters.contains_key("search.vip"), "{batch:?}");
    // Shown with their source.
    let e = policy.resolve(Kind::Vip, "search", Some("batch"), Protocol::Auto);
    assert_eq!(e.hedge, Sourced::new(false, Source::Caller));
    let e = policy.resolve(Kind::Vip, "payments", None, Protocol::Auto);
    assert_eq!(e.fault.from, Source::Vip);
}

#[test]
fn a_fault_stops_at_its_until_and_the_routes_say_when() {
    let policy = Policy::parse(
        b"vips:
  a: {fault: {abort: {grpc_status: 14}, until: 2026-12-05T10:00:00Z}}
  b: {fault: {abort: {status: 500}, until: '2026-12-05T11:00:00+00:00'}}
  c: {fault: {abort: {status: 500}}}
",
    )
    .unwrap();
    let ten = SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_464_800);
    let before = ten - Duration::from_secs(1);
    assert_eq!(policy.routes("x", before).clusters.len(), 3);
    assert_eq!(policy.next_expiry(before), Some(ten));
    let at_ten = policy.routes("x", ten);
    assert_eq!(
        at_ten.clusters.keys().collect::<Vec<_>>(),
        ["b.vip", "c.vip"]
    );
    assert_eq!(
        policy.next_expiry(ten),
        Some(ten + Duration::from_secs(3600))
    );
    assert_eq!(policy.next_expiry(ten + Duration::from_secs(3600)), None);
    // /debug/policy says whether each fault still applies.
    let view = |vip| {
        let e = policy.resolve(Kind::Vip, vip, None, Protocol::Auto);
        e.debug_view(ten)["fault"].clone()
    };
    assert_eq!(view("a")["applies"], false, "{}", view("a"));
    assert_eq!(view("a")["value"]["until"], "2026-12-05T10:00:00Z");
    assert_eq!(view("b")["applies"], true);
    assert_eq!(view("c")["applies"], true);
    // /metrics counts the experiments running: a's has ended.
    let features = policy.features(ten);
    assert_eq!(
        (features.faults, features.hedges, features.limits),
        (2, 0, 0)
    );
    assert_eq!(policy.features(before).faults, 3);
    let none = policy.resolve(Kind::Vip, "d", None, Protocol::Auto);
    assert_eq!(
        none.debug_view(ten)["fault"]["value"],
        serde_json::Value::Null
    );
    assert_eq!(none.debug_view(ten)["fault"].get("applies"), None);
}

#[test]
fn a_fault_or_hedge_that_cannot_work_is_refused_with_its_field() {
    for (yaml, says) in [
        (
            "defaults: {fault: {abort: {status: 503}}}",
            "defaults.fault: a fault is for one VIP",
        ),
        (
            "vips: {a: {fault: {}}}",
            "a fault needs a delay or an abort",
        ),
        (
            "vips: {a: {fault: {header: x-chaos}}}",
            "a fault needs a delay or an abort",
        ),
        (
            "vips: {a: {fault: {abort: {percent: 5}}}}",
            "either `status` or `grpc_status`",
        ),
        (
            "vips: {a: {fault: {abort: {status: 503, grpc_status: 14}}}}",
            "either `status` or `grpc_status`",
        ),
        (
            "vips: {a: {fault: {abort: {status: 600}}}}",
            "600 is not between 200 and 599",
        ),
        (
            "vips: {a: {fault: {abort: {grpc_status: 0}}}}",
            "0 is not between 1 and 16",
        ),
        (
            "vips: {a: {fault: {abort: {status: 503, percent: 101}}}}",
            "101 is not a percentage from 0 to 100",
        ),
        (
            "vips: {a: {fault: {delay: {fixed: 0s}}}}",
            "must be more than 0",
        ),
        (
            "vips: {a: {fault: {delay: {fixed: 1s}, until: tomorrow}}}",
            "is not a time like 2026-12-05T10:00:00Z",
        ),
        (
            "vips: {a: {fault: {delay: {fixed: 1s}, header: 'x chaos'}}}",
            "is not a header name",
        ),
        (
            "vips: {a: {fault: {delay: {fixed: 1s, pct: 5}}}}",
            "unknown field `pct`",
        ),
        ("vips: {a: {hedge: true}}", "vips.a.hedge: a hedge is sent"),
        (
            "vips: {a: {hedge: true, per_try_timeout: 100ms, retries: {count: 0}}}",
            "vips.a.hedge",
        ),
        (
            "svips: {a: {hedge: true, per_try_timeout: 1s, callers: {web: {per_try_timeout: 0s}}}}",
            "svips.a.callers.web.hedge",
        ),
        ("defaults: {hedge: true}", "defaults.hedge"),
        ("vips: {a: {hedge: maybe}}", "hedge"),
    ] {
        let shown = refused(yaml);
        assert!(shown.contains(says), "{yaml}: {shown}");
    }
    // A hedge with its per-try timeout from the defaults is fine.
    Policy::parse(b"defaults: {per_try_timeout: 1s}\nvips: {a: {hedge: true}}").unwrap();
}

#[test]
fn a_service_gets_its_own_inbound_limit_and_a_bad_one_is_refused() {
    let policy = Policy::parse(
        b"services:
  payments:
    adaptive_concurrency: {update_interval: 250ms, max_limit: 40}
  Checkout Web: {}
",
    )
    .unwrap();
    let limit = policy.inbound("payments").unwrap().limiter();
    assert_eq!(limit.update_interval, ms(250));
    assert_eq!(limit.max_limit, 40);
    assert_eq!(limit.min_rtt_requests, 50, "Envoy's default");
    assert_eq!(
        policy.inbound("Checkout Web"),
        None,
        "an entry without a limit"
    );
    assert_eq!(policy.inbound("ledger"), None);
    assert_eq!(policy.entries(), 2);
    assert!(policy.summary()["services"]["payments"]["adaptive_concurrency"].is_object());
    for (yaml, says) in [
        (
            "services: {a: {adaptive_concurrency: {min_limit: 50, max_limit: 10}}}",
            "services.a.adaptive_concurrency: min_limit is above max_limit",
        ),
        (
            "services: {a: {adaptive_concurrency: {status: 200}}}",
            "200 is not between 400 and 599",
        ),
        (
            "services: {a: {adaptive_concurrency: {update_interval: 0s}}}",
            "must be more than 0",
        ),
        (
            "services: {a: {adaptive_concurrency: {limit: 5}}}",
            "unknown field `limit`",
        ),
        ("services: {'': {}}", "is not a service name"),
    ] {
        let shown = refused(yaml);
        assert!(shown.contains(says), "{yaml}: {shown}");
    }
}

#[test]
fn the_demo_policy_parses_and_so_does_its_chaos_experiment_uncommented() {
    let demo = include_str!("../../../demo/policy.yaml");
    Policy::parse(demo.as_bytes()).unwrap();
    let commented = "    # fault: {abort: {status: 503, percent: 20}}";
    assert!(
        demo.contains(commented),
        "the experiment moved: update this test"
    );
    let on = demo.replace(commented, "    fault: {abort: {status: 503, percent: 20}}");
    let policy = Policy::parse(on.as_bytes()).unwrap();
    let fault = policy.routes("odmesh", NOW).clusters["demo-b.vip"]
        .fault
        .clone();
    assert_eq!(fault.unwrap().abort.unwrap().percent.per_million, 200_000);
}

#[test]
fn a_concurrency_limit_is_per_vip_and_caller_and_only_the_route_carries_it() {
    let policy = Policy::parse(
        b"vips:
  pay:
    concurrency_limit: {}
    callers:
      web: {concurrency_limit: {max_limit: 5, window: 250ms, tolerance_percent: 200}}
      batch: {request_timeout: 1s}
  search: {request_timeout: 1s}
",
    )
    .unwrap();
    let params = |caller: &str, cluster: &str| {
        let routes = policy.routes(caller, NOW);
        routes
            .level(cluster)
            .limit
            .as_ref()
            .map(ConcurrencyLimit::params)
    };
    let defaults = odmesh_filter::limiter::Params::default();
    assert_eq!(params("other", "pay.vip"), Some(defaults));
    // A caller's entry without one keeps the VIP's; a caller's own replaces it whole.
    assert_eq!(params("batch", "pay.vip"), Some(defaults));
    let web = params("web", "pay.vip").unwrap();
    assert_eq!(
        (web.max_limit, web.initial_limit, web.window_ms),
        (5, 5, 250)
    );
    assert_eq!((web.tolerance, web.min_limit), (2.0, defaults.min_limit));
    assert_eq!(
        params("web", "pay.svip"),
        None,
        "an SVIP is a destination of its own"
    );
    assert_eq!(params("web", "search.vip"), None);
    // The cluster itself does not change: the limit lives in the caller's route.
    let e = |caller| policy.resolve(Kind::Vip, "pay", Some(caller), Protocol::Auto);
    assert_eq!(
        e("other").concurrency_limit.from,
        Source::Vip,
        "and /debug/policy shows where it came from"
    );
}

#[test]
fn a_concurrency_limit_that_cannot_work_is_refused_with_its_field() {
    for (yaml, says) in [
        (
            "defaults: {concurrency_limit: {}}",
            "defaults.concurrency_limit: a concurrency limit is for one VIP",
        ),
        (
            "vips: {a: {concurrency_limit: {min_limit: 50, max_limit: 10}}}",
            "vips.a.concurrency_limit: min_limit 50 must be at least 1 and at most max_limit 10",
        ),
        (
            "vips: {a: {callers: {web: {concurrency_limit: {initial_limit: 2000}}}}}",
            "vips.a.callers.web.concurrency_limit: initial_limit 2000",
        ),
        (
            "vips: {a: {concurrency_limit: {min_limit: 0}}}",
            "0 is not between 1 and 100000",
        ),
        (
            "vips: {a: {concurrency_limit: {tolerance_percent: 50}}}",
            "50 is not between 100 and 10000",
        ),
        (
            "vips: {a: {concurrency_limit: {limit: 5}}}",
            "unknown field `limit`",
        ),
    ] {
        let shown = refused(yaml);
        assert!(shown.contains(says), "{yaml}: {shown}");
    }
}

#[test]
fn the_entries_that_switch_each_feature_on_are_counted_callers_included() {
    let policy = Policy::parse(
        b"vips:
  a:
    per_try_timeout: 100ms
    retries: {count: 1}
    hedge: true
    concurrency_limit: {}
    callers:
      x: {hedge: false}
      y: {fault: {abort: {status: 503}}, concurrency_limit: {max_limit: 50}}
svips:
  b: {per_try_timeout: 100ms, retries: {count: 1}, hedge: true}
",
    )
    .unwrap();
    let f = policy.features(SystemTime::UNIX_EPOCH);
    assert_eq!((f.hedges, f.faults, f.limits), (2, 1, 2));
    assert_eq!(
        Policy::default().features(SystemTime::UNIX_EPOCH),
        Features::default()
    );
}
