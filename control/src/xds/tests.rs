use super::*;
use envoy_types::pb::envoy::config::cluster::v3::cluster::ClusterDiscoveryType as Cdt;

fn ep(zone: Option<&str>, ip: &str, port: u16) -> Endpoint {
    Endpoint {
        zone: zone.map(Into::into),
        ip: ip.parse().unwrap(),
        port,
    }
}

fn info(vip: &str, kind: Kind, mut endpoints: Vec<Endpoint>) -> ClusterInfo {
    endpoints.sort();
    ClusterInfo {
        vip: vip.into(),
        kind,
        instances: endpoints.len(),
        endpoints,
        protocol: Protocol::Auto,
    }
}

fn opts() -> XdsOptions {
    XdsOptions::new(Some("/ca.pem".into()))
}

fn odmesh_meta(c: &Cluster) -> &HashMap<String, Value> {
    &c.metadata.as_ref().unwrap().filter_metadata[METADATA_NAMESPACE].fields
}

#[test]
fn a_vip_cluster_is_eds_over_ads_with_its_own_service_name() {
    let hello = info("hello", Kind::Vip, vec![ep(None, "10.0.0.1", 8080)]);
    let c = cluster("hello.vip", Lookup::Registered(&hello), &opts()).unwrap();
    assert_eq!(c.name, "hello.vip");
    assert_eq!(
        c.cluster_discovery_type,
        Some(Cdt::Type(DiscoveryType::Eds as i32))
    );
    let eds = c.eds_cluster_config.unwrap();
    assert_eq!(eds.service_name, "hello.vip");
    let source = eds.eds_config.unwrap();
    assert!(matches!(
        source.config_source_specifier,
        Some(ConfigSourceSpecifier::Ads(_))
    ));
    assert_eq!(source.resource_api_version, ApiVersion::V3 as i32);
    assert_eq!(c.connect_timeout.unwrap().seconds, 1);
    assert_eq!(c.lb_policy, LbPolicy::RoundRobin as i32);
    assert!(c.outlier_detection.is_some());
    assert!(c.transport_socket.is_none(), "plain VIPs have no TLS");
}

#[test]
fn cluster_metadata_says_vip_kind_and_registered() {
    let hello = info("hello", Kind::Vip, vec![]);
    let c = cluster("hello.vip", Lookup::Registered(&hello), &opts()).unwrap();
    let meta = odmesh_meta(&c);
    assert_eq!(meta["vip"], string_value("hello"));
    assert_eq!(meta["kind"], string_value("vip"));
    assert_eq!(meta["registered"].kind, Some(value::Kind::BoolValue(true)));
    assert_eq!(
        meta["reason"],
        string_value("VIP hello has no healthy endpoint: no instance of it is UP")
    );
}

#[test]
fn an_unknown_vip_is_a_normal_cluster_marked_unregistered_with_no_endpoints() {
    let c = cluster("nobody.vip", Lookup::Unregistered, &opts()).unwrap();
    assert_eq!(
        c.eds_cluster_config.as_ref().unwrap().service_name,
        "nobody.vip",
        "still an EDS cluster of its own"
    );
    let meta = odmesh_meta(&c);
    assert_eq!(meta["registered"].kind, Some(value::Kind::BoolValue(false)));
    assert_eq!(
        meta["reason"].kind,
        Some(value::Kind::StringValue(
            "VIP nobody is not registered".into()
        ))
    );
    assert_eq!(meta["vip"], string_value("nobody"));
    let cla = load_assignment("nobody.vip", Lookup::Unregistered).unwrap();
    assert_eq!(cla.cluster_name, "nobody.vip");
    assert!(cla.endpoints.is_empty());
}

#[test]
fn a_vip_not_known_yet_says_so_and_is_versioned_apart_from_an_unregistered_one() {
    let c = cluster("late.vip", Lookup::NotYetKnown, &opts()).unwrap();
    let meta = odmesh_meta(&c);
    assert_eq!(meta["registered"].kind, Some(value::Kind::BoolValue(false)));
    assert_eq!(
        meta["reason"],
        string_value("VIP late is not known yet: the control plane is still loading its registry")
    );
    let not_yet = build("late.vip", Lookup::NotYetKnown, &opts()).unwrap();
    let unregistered = build("late.vip", Lookup::Unregistered, &opts()).unwrap();
    assert_ne!(not_yet.cluster.version, unregistered.cluster.version);
    assert!(!not_yet.cluster.registered && !unregistered.endpoints.registered);
    let hello = info("hello", Kind::Vip, vec![]);
    assert!(
        build("hello.vip", Lookup::Registered(&hello), &opts())
            .unwrap()
            .cluster
            .registered
    );
}

#[test]
fn an_svip_cluster_talks_tls_with_the_svip_as_sni_and_the_configured_ca() {
    let secure = info("hello", Kind::Svip, vec![ep(None, "10.0.0.1", 8443)]);
    let c = cluster("hello.svip", Lookup::Registered(&secure), &opts()).unwrap();
    let socket = c.transport_socket.unwrap();
    assert_eq!(socket.name, "envoy.transport_sockets.tls");
    let Some(transport_socket::ConfigType::TypedConfig(any)) = socket.config_type else {
        panic!("typed config expected");
    };
    assert_eq!(any.type_url, UPSTREAM_TLS_TYPE_URL);
    let tls = UpstreamTlsContext::decode(any.value.as_slice()).unwrap();
    assert_eq!(tls.sni, "hello");
    let Some(ValidationContextType::ValidationContext(vc)) =
        tls.common_tls_context.unwrap().validation_context_type
    else {
        panic!("validation context expected");
    };
    assert_eq!(
        vc.trusted_ca.unwrap().specifier,
        Some(Specifier::Filename("/ca.pem".into()))
    );
    assert_eq!(vc.match_typed_subject_alt_names.len(), 1);
    assert_eq!(
        vc.match_typed_subject_alt_names[0]
            .matcher
            .as_ref()
            .unwrap()
            .match_pattern,
        Some(MatchPattern::Exact("hello".into()))
    );
}

/// The cluster's HTTP protocol options and, for a `.svip`, the ALPN it offers.
fn protocol_of(kind: Kind, protocol: Protocol) -> (UpstreamProtocolOptions, Vec<String>) {
    let name = odmesh_names::cluster_name("svc", kind);
    let svc = ClusterInfo {
        protocol,
        ..info("svc", kind, vec![])
    };
    let c = cluster(&name, Lookup::Registered(&svc), &opts()).unwrap();
    let any = &c.typed_extension_protocol_options[HTTP_PROTOCOL_OPTIONS];
    assert_eq!(any.type_url, HTTP_PROTOCOL_OPTIONS_TYPE_URL);
    let options = HttpProtocolOptions::decode(any.value.as_slice()).unwrap();
    let alpn = match c.transport_socket.and_then(|s| s.config_type) {
        Some(transport_socket::ConfigType::TypedConfig(tls)) => {
            let tls = UpstreamTlsContext::decode(tls.value.as_slice()).unwrap();
            tls.common_tls_context.unwrap().alpn_protocols
        }
        _ => Vec::new(),
    };
    (options.upstream_protocol_options.unwrap(), alpn)
}

#[test]
fn without_a_declaration_a_vip_speaks_the_callers_protocol_and_an_svip_what_alpn_settles() {
    let (vip, _) = protocol_of(Kind::Vip, Protocol::Auto);
    let UpstreamProtocolOptions::UseDownstreamProtocolConfig(both) = vip else {
        panic!("a .vip follows the caller: {vip:?}");
    };
    assert!(both.http_protocol_options.is_some() && both.http2_protocol_options.is_some());

    let (svip, alpn) = protocol_of(Kind::Svip, Protocol::Auto);
    let UpstreamProtocolOptions::AutoConfig(auto) = svip else {
        panic!("a .svip follows ALPN: {svip:?}");
    };
    assert!(auto.http_protocol_options.is_some() && auto.http2_protocol_options.is_some());
    assert!(
        alpn.is_empty(),
        "Envoy's auto_config offers h2,http/1.1 itself: {alpn:?}"
    );
}

#[test]
fn a_declared_protocol_is_spoken_whatever_the_caller_spoke() {
    for kind in [Kind::Vip, Kind::Svip] {
        let (http2, alpn) = protocol_of(kind, Protocol::Http2);
        assert_eq!(
            http2,
            UpstreamProtocolOptions::ExplicitHttpConfig(ExplicitHttpConfig {
                protocol_config: Some(ProtocolConfig::Http2ProtocolOptions(
                    Http2ProtocolOptions::default()
                )),
            }),
            "{kind:?}"
        );
        let expected: &[&str] = if kind == Kind::Svip { &["h2"] } else { &[] };
        assert_eq!(alpn, expected, "{kind:?}");

        let (http1, alpn) = protocol_of(kind, Protocol::Http1);
        assert!(
            matches!(
                http1,
                UpstreamProtocolOptions::ExplicitHttpConfig(ExplicitHttpConfig {
                    protocol_config: Some(ProtocolConfig::HttpProtocolOptions(_)),
                })
            ),
            "{kind:?}: {http1:?}"
        );
        let expected: &[&str] = if kind == Kind::Svip {
            &["http/1.1"]
        } else {
            &[]
        };
        assert_eq!(alpn, expected, "{kind:?}");
    }
}

#[test]
fn a_protocol_declaration_changes_the_cluster_version_and_its_metadata() {
    let auto = info("hello", Kind::Vip, vec![ep(None, "10.0.0.1", 8080)]);
    let http2 = ClusterInfo {
        protocol: Protocol::Http2,
        ..auto.clone()
    };
    let a = build("hello.vip", Lookup::Registered(&auto), &opts()).unwrap();
    let b = build("hello.vip", Lookup::Registered(&http2), &opts()).unwrap();
    assert_ne!(a.cluster.version, b.cluster.version);
    let c = cluster("hello.vip", Lookup::Registered(&http2), &opts()).unwrap();
    assert_eq!(odmesh_meta(&c)["protocol"], string_value("http2"));
}

/// The cluster `hello.vip` builds under `yaml`, for proxies of `caller`.
fn under_policy(yaml: &str, caller: Option<&str>) -> (Cluster, HttpProtocolOptions) {
    let policy = Policy::parse(yaml.as_bytes()).unwrap();
    let hello = info("hello", Kind::Vip, vec![ep(None, "10.0.0.1", 8080)]);
    let built = build_for(
        "hello.vip",
        Lookup::Registered(&hello),
        &opts(),
        &policy,
        caller,
    )
    .unwrap();
    let c = Cluster::decode(built.cluster.resource.value.as_slice()).unwrap();
    let any = &c.typed_extension_protocol_options[HTTP_PROTOCOL_OPTIONS];
    let options = HttpProtocolOptions::decode(any.value.as_slice()).unwrap();
    (c, options)
}

#[test]
fn without_a_policy_a_request_that_never_reached_an_instance_is_retried_on_another() {
    let (c, options) = under_policy("", None);
    let retry = options.retry_policy.unwrap();
    assert_eq!(
        retry.retry_on,
        "connect-failure,refused-stream,reset-before-request"
    );
    assert_eq!(retry.num_retries, Some(UInt32Value { value: 2 }));
    assert_eq!(retry.retry_host_predicate[0].name, PREVIOUS_HOSTS);
    assert_eq!(retry.host_selection_retry_max_attempts, 3);
    assert_eq!(c.connect_timeout.unwrap().seconds, 1);
    assert_eq!(c.lb_policy, LbPolicy::RoundRobin as i32);
}

#[test]
fn each_policy_value_lands_in_its_envoy_field() {
    let (c, options) = under_policy(
        "vips:
  hello:
    connect_timeout: 250ms
    idle_timeout: 5m
    load_balancing: least_request
    retries: {on: [5xx, reset], count: 3, backoff: {base: 10ms, max: 1s}, budget_percent: 20}
    circuit_breakers: {max_connections: 10, max_pending_requests: 11, max_requests: 12, max_retries: 2}
    outlier_detection: {consecutive_5xx: 7, interval: 2s, base_ejection_time: 9s, max_ejection_percent: 50}
",
        None,
    );
    assert_eq!(c.connect_timeout.unwrap().nanos, 250_000_000);
    assert_eq!(c.lb_policy, LbPolicy::LeastRequest as i32);
    let retry = options.retry_policy.unwrap();
    assert_eq!(retry.retry_on, "5xx,reset");
    assert_eq!(retry.num_retries, Some(UInt32Value { value: 3 }));
    let backoff = retry.retry_back_off.unwrap();
    assert_eq!(backoff.base_interval.unwrap().nanos, 10_000_000);
    assert_eq!(backoff.max_interval.unwrap().seconds, 1);
    let idle = options.common_http_protocol_options.unwrap().idle_timeout;
    assert_eq!(idle.unwrap().seconds, 300);
    let limits = &c.circuit_breakers.as_ref().unwrap().thresholds[0];
    let n = |v: &Option<UInt32Value>| v.as_ref().unwrap().value;
    assert_eq!(
        (n(&limits.max_connections), n(&limits.max_pending_requests)),
        (10, 11)
    );
    assert_eq!((n(&limits.max_requests), n(&limits.max_retries)), (12, 2));
    let budget = limits.retry_budget.as_ref().unwrap();
    assert_eq!(budget.budget_percent.as_ref().unwrap().value, 20.0);
    let outliers = c.outlier_detection.as_ref().unwrap();
    assert_eq!(n(&outliers.consecutive_5xx), 7);
    assert_eq!(outliers.interval.unwrap().seconds, 2);
    assert_eq!(outliers.base_ejection_time.unwrap().seconds, 9);
    assert_eq!(n(&outliers.max_ejection_percent), 50);
}

#[test]
fn hashing_balancers_hash_the_policys_header_and_the_others_hash_nothing() {
    let (c, options) = under_policy(
        "vips: {hello: {load_balancing: maglev, hash_header: x-user}}",
        None,
    );
    assert_eq!(c.lb_policy, LbPolicy::Maglev as i32);
    let Some(hash_policy::PolicySpecifier::Header(header)) =
        &options.hash_policy[0].policy_specifier
    else {
        panic!("a header hash policy: {:?}", options.hash_policy);
    };
    assert_eq!(header.header_name, "x-user");
    let (_, round_robin) = under_policy("", None);
    assert!(round_robin.hash_policy.is_empty());
}

/// One change of each policy value, away from its default.
const POLICY_KNOBS: [&str; 18] = [
    "connect_timeout: 2s",
    "idle_timeout: 1m",
    "protocol: http2",
    "load_balancing: least_request",
    "load_balancing: maglev",
    "retries: {on: [5xx]}",
    "retries: {count: 1}",
    "retries: {backoff: {base: 1s}}",
    "retries: {backoff: {base: 25ms, max: 7s}}",
    "retries: {budget_percent: 10}",
    "circuit_breakers: {max_connections: 1}",
    "circuit_breakers: {max_pending_requests: 1}",
    "circuit_breakers: {max_requests: 1}",
    "circuit_breakers: {max_retries: 1}",
    "outlier_detection: {consecutive_5xx: 1}",
    "outlier_detection: {interval: 1s}",
    "outlier_detection: {base_ejection_time: 1s}",
    "outlier_detection: {max_ejection_percent: 1}",
];

#[test]
fn every_policy_knob_changes_the_cluster_version() {
    let hello = info("hello", Kind::Vip, vec![ep(None, "10.0.0.1", 8080)]);
    let version = |yaml: &str| {
        let policy = Policy::parse(yaml.as_bytes()).unwrap();
        build_for(
            "hello.vip",
            Lookup::Registered(&hello),
            &opts(),
            &policy,
            None,
        )
        .unwrap()
        .cluster
        .version
    };
    let base = version("");
    for knob in POLICY_KNOBS {
        let changed = version(&format!("vips: {{hello: {{{knob}}}}}"));
        assert_ne!(changed, base, "{knob} did not change the version");
    }
    assert_eq!(version("vips: {other: {retries: {count: 1}}}"), base);
    // Timeouts are the route's (xds::route): they leave the cluster alone.
    assert_eq!(
        version("vips: {hello: {request_timeout: 1s, per_try_timeout: 1s}}"),
        base
    );
    assert_ne!(
        version("vips: {hello: {load_balancing: ring_hash, hash_header: a}}"),
        version("vips: {hello: {load_balancing: ring_hash, hash_header: b}}"),
        "the hash header"
    );
}

#[test]
fn a_callers_override_and_a_policy_change_change_the_cluster_version() {
    let yaml = "vips: {hello: {callers: {checkout: {circuit_breakers: {max_requests: 5}}}}}";
    let policy = Policy::parse(yaml.as_bytes()).unwrap();
    let hello = info("hello", Kind::Vip, vec![ep(None, "10.0.0.1", 8080)]);
    let lookup = Lookup::Registered(&hello);
    let version = |policy: &Policy, caller| {
        build_for("hello.vip", lookup, &opts(), policy, caller)
            .unwrap()
            .cluster
            .version
    };
    let shared = version(&policy, None);
    assert_eq!(
        shared,
        version(&Policy::default(), None),
        "no change for the others"
    );
    assert_ne!(shared, version(&policy, Some("checkout")));
    let hash = Policy::parse(b"vips: {hello: {load_balancing: maglev}}").unwrap();
    assert_ne!(shared, version(&hash, None));
}

#[test]
fn without_an_upstream_ca_the_system_bundle_is_used() {
    let o = XdsOptions::new(None);
    assert!(
        SYSTEM_CA_BUNDLES
            .iter()
            .any(|p| Path::new(p) == o.upstream_ca)
    );
}

#[test]
fn endpoints_are_grouped_by_zone_into_localities() {
    let hello = info(
        "hello",
        Kind::Vip,
        vec![
            ep(Some("b"), "10.0.0.3", 80),
            ep(None, "10.0.0.9", 80),
            ep(Some("a"), "10.0.0.1", 80),
            ep(Some("a"), "10.0.0.2", 81),
        ],
    );
    let cla = load_assignment("hello.vip", Lookup::Registered(&hello)).unwrap();
    assert_eq!(cla.cluster_name, "hello.vip");
    let zones: Vec<Option<&str>> = cla
        .endpoints
        .iter()
        .map(|g| g.locality.as_ref().map(|l| l.zone.as_str()))
        .collect();
    assert_eq!(zones, [None, Some("a"), Some("b")]);
    let counts: Vec<usize> = cla.endpoints.iter().map(|g| g.lb_endpoints.len()).collect();
    assert_eq!(counts, [1, 2, 1]);
    let Some(HostIdentifier::Endpoint(first)) = &cla.endpoints[1].lb_endpoints[1].host_identifier
    else {
        panic!("endpoint expected");
    };
    let Some(address::Address::SocketAddress(sa)) = &first.address.as_ref().unwrap().address else {
        panic!("socket address expected");
    };
    assert_eq!(sa.address, "10.0.0.2");
    assert_eq!(sa.port_specifier, Some(PortSpecifier::PortValue(81)));
}

#[test]
fn names_that_are_not_odmesh_clusters_are_refused() {
    assert!(build("xds_cluster", Lookup::Unregistered, &opts()).is_err());
    assert!(build("Bad!.vip", Lookup::Unregistered, &opts()).is_err());
}

#[test]
fn equal_inputs_give_equal_versions_however_the_metadata_map_encodes() {
    let a = build("hello.vip", Lookup::Unregistered, &opts()).unwrap();
    for _ in 0..20 {
        let b = build("hello.vip", Lookup::Unregistered, &opts()).unwrap();
        assert_eq!(a.cluster.version, b.cluster.version);
        assert_eq!(a.endpoints.version, b.endpoints.version);
    }
}

#[test]
fn an_endpoint_change_changes_only_the_load_assignment_version() {
    let one = info("hello", Kind::Vip, vec![ep(None, "10.0.0.1", 80)]);
    let two = info(
        "hello",
        Kind::Vip,
        vec![ep(None, "10.0.0.1", 80), ep(None, "10.0.0.2", 80)],
    );
    let a = build("hello.vip", Lookup::Registered(&one), &opts()).unwrap();
    let b = build("hello.vip", Lookup::Registered(&two), &opts()).unwrap();
    assert_eq!(a.cluster.version, b.cluster.version);
    assert_ne!(a.endpoints.version, b.endpoints.version);
}

#[test]
fn registering_a_vip_changes_both_versions_even_with_no_endpoints() {
    let empty = info("hello", Kind::Vip, vec![]);
    let before = build("hello.vip", Lookup::Unregistered, &opts()).unwrap();
    let after = build("hello.vip", Lookup::Registered(&empty), &opts()).unwrap();
    assert_ne!(before.cluster.version, after.cluster.version);
    assert_ne!(
        before.endpoints.version, after.endpoints.version,
        "the load assignment follows its cluster so a re-warming cluster gets it"
    );
}

#[test]
fn the_upstream_ca_is_part_of_the_version_of_svip_clusters_only() {
    let other = XdsOptions::new(Some("/other.pem".into()));
    let a = build("hello.svip", Lookup::Unregistered, &opts()).unwrap();
    let b = build("hello.svip", Lookup::Unregistered, &other).unwrap();
    assert_ne!(a.cluster.version, b.cluster.version);
    let a = build("hello.vip", Lookup::Unregistered, &opts()).unwrap();
    let b = build("hello.vip", Lookup::Unregistered, &other).unwrap();
    assert_eq!(a.cluster.version, b.cluster.version);
}

#[test]
fn resources_carry_their_type_url_and_decode_back() {
    let r = build("hello.vip", Lookup::Unregistered, &opts()).unwrap();
    assert_eq!(
        r.get(ResourceType::Cluster).resource.type_url,
        CLUSTER_TYPE_URL
    );
    assert_eq!(
        r.get(ResourceType::Endpoints).resource.type_url,
        ENDPOINTS_TYPE_URL
    );
    let c = Cluster::decode(r.cluster.resource.value.as_slice()).unwrap();
    assert_eq!(c.name, "hello.vip");
    assert_eq!(
        ResourceType::from_type_url(ENDPOINTS_TYPE_URL),
        Some(ResourceType::Endpoints)
    );
    assert_eq!(ResourceType::from_type_url("type.googleapis.com/x"), None);
}

/// A resource of every shape the builder makes, each one thing away from another: the
/// endpoints (none, a port, an address, a zone, one added), the protocol, the registry's
/// answer, the VIP, TLS (`.svip`, the CA, the SAN check), a hash header and every policy
/// value.
fn catalogue() -> Vec<(String, ClusterResources)> {
    let endpoint_sets = [
        vec![],
        vec![ep(Some("a"), "10.0.0.1", 8080)],
        vec![ep(Some("a"), "10.0.0.1", 8081)],
        vec![ep(Some("a"), "10.0.0.2", 8080)],
        vec![ep(Some("b"), "10.0.0.1", 8080)],
        vec![ep(None, "10.0.0.1", 8080)],
        vec![
            ep(Some("a"), "10.0.0.1", 8080),
            ep(Some("a"), "10.0.0.2", 8080),
        ],
    ];
    let no_san = XdsOptions {
        verify_upstream_san: false,
        ..opts()
    };
    let other_ca = XdsOptions::new(Some("/other.pem".into()));
    let mut out = Vec::new();
    for kind in [Kind::Vip, Kind::Svip] {
        let name = odmesh_names::cluster_name("hello", kind);
        let mut add = |what: String, lookup: Lookup<'_>, opts: &XdsOptions, yaml: &str| {
            let policy = Policy::parse(yaml.as_bytes()).unwrap();
            let built = build_for(&name, lookup, opts, &policy, None).unwrap();
            out.push((format!("{name}: {what}"), built));
        };
        for (i, endpoints) in endpoint_sets.iter().enumerate() {
            let hello = info("hello", kind, endpoints.clone());
            add(
                format!("endpoints {i}"),
                Lookup::Registered(&hello),
                &opts(),
                "",
            );
        }
        let one = info("hello", kind, endpoint_sets[1].clone());
        // HTTP/2 comes from the policy's knobs below.
        let http1 = ClusterInfo {
            protocol: Protocol::Http1,
            ..one.clone()
        };
        add("HTTP/1.1".into(), Lookup::Registered(&http1), &opts(), "");
        add("unregistered".into(), Lookup::Unregistered, &opts(), "");
        add("not yet known".into(), Lookup::NotYetKnown, &opts(), "");
        let other = info("other", kind, endpoint_sets[1].clone());
        add(
            "another VIP".into(),
            Lookup::Registered(&other),
            &opts(),
            "",
        );
        let registered = Lookup::Registered(&one);
        if kind == Kind::Svip {
            add("no SAN check".into(), registered, &no_san, "");
            add("another CA".into(), registered, &other_ca, "");
        }
        let section = format!("{}s", kind.as_str());
        for knob in POLICY_KNOBS
            .iter()
            .chain(&["load_balancing: ring_hash, hash_header: a"])
        {
            let yaml = format!("{section}: {{hello: {{{knob}}}}}");
            add(knob.to_string(), registered, &opts(), &yaml);
        }
    }
    out
}

#[test]
fn versions_are_equal_exactly_when_the_resources_are() {
    let built = catalogue();
    let decoded: Vec<(Cluster, ClusterLoadAssignment)> = (built.iter())
        .map(|(_, r)| {
            let cluster = Cluster::decode(r.cluster.resource.value.as_slice()).unwrap();
            let endpoints = r.endpoints.resource.value.as_slice();
            (cluster, ClusterLoadAssignment::decode(endpoints).unwrap())
        })
        .collect();
    for (i, (what, a)) in built.iter().enumerate() {
        for (j, (other, b)) in built.iter().enumerate().skip(i + 1) {
            let same_cluster = decoded[i].0 == decoded[j].0;
            let same_endpoints = same_cluster && decoded[i].1 == decoded[j].1;
            assert!(
                !same_endpoints,
                "{what} and {other} build the same resources"
            );
            assert_eq!(
                a.cluster.version == b.cluster.version,
                same_cluster,
                "cluster versions of {what} and {other}"
            );
            assert_ne!(
                a.endpoints.version, b.endpoints.version,
                "{what} and {other}"
            );
        }
    }
    // Built again, with fresh maps (each iterating in an order of its own): equal versions.
    for ((what, a), (_, b)) in built.iter().zip(catalogue()) {
        assert_eq!(a.cluster.version, b.cluster.version, "{what}");
        assert_eq!(a.endpoints.version, b.endpoints.version, "{what}");
    }
}

/// What this guards: stability across runs. A restarted control plane (or another
/// replica, or a later build) must give a resource the version it had, or every
/// reconnecting proxy is sent again all it holds; a version that came from anything but
/// the resource's bytes (a process's random seed, `DefaultHasher`) would fail here. The
/// values were computed from the encoding: when a change to the builder changes what
/// this cluster is, they change too, and are to be updated with it.
#[test]
fn a_known_resource_has_the_same_version_in_every_process() {
    let hello = info("hello", Kind::Svip, vec![ep(Some("a"), "10.0.0.1", 8443)]);
    let built = build("hello.svip", Lookup::Registered(&hello), &opts()).unwrap();
    assert_eq!(
        (&*built.cluster.version, &*built.endpoints.version),
        ("b886c7b90f574fda", "ade5b3c3290fc45d")
    );
}

/// `n` endpoints of `big`, half in zone `a`, half in zone `b`.
fn big(n: u8) -> ClusterInfo {
    let eps = (0..n)
        .map(|i| {
            ep(
                Some(if i % 2 == 0 { "a" } else { "b" }),
                &format!("10.0.0.{i}"),
                8080,
            )
        })
        .collect();
    info("big", Kind::Vip, eps)
}

fn leds_opts(min: usize) -> XdsOptions {
    XdsOptions {
        leds_min_endpoints: min,
        ..opts()
    }
}

fn ids(members: &[leds::Member]) -> Vec<&str> {
    members.iter().map(|m| &*m.id).collect()
}

#[test]
fn a_vip_at_the_threshold_names_a_collection_per_locality_and_one_below_lists_its_endpoints() {
    let four = big(4);
    let r = build("big.vip", Lookup::Registered(&four), &leds_opts(4)).unwrap();
    let split = r
        .endpoints
        .leds
        .as_ref()
        .expect("4 endpoints at a threshold of 4 are split");
    assert_eq!(
        ids(&split.localities[0]),
        ["10.0.0.0_8080", "10.0.0.2_8080"]
    );
    assert_eq!(
        ids(&split.localities[1]),
        ["10.0.0.1_8080", "10.0.0.3_8080"]
    );
    let cla = split.assignment("e1");
    assert_eq!(cla.cluster_name, "big.vip");
    for (i, locality) in cla.endpoints.iter().enumerate() {
        assert!(
            locality.lb_endpoints.is_empty(),
            "locality {i} lists endpoints"
        );
        let Some(envoy_types::pb::envoy::config::endpoint::v3::locality_lb_endpoints::LbConfig::LedsClusterLocalityConfig(c)) =
            &locality.lb_config
        else {
            panic!("locality {i} names no collection");
        };
        assert_eq!(
            c.leds_collection_name,
            format!("xdstp://odmesh/envoy.config.endpoint.v3.LbEndpoint/big.vip/e1/{i}/*")
        );
        let ads = c.leds_config.as_ref().unwrap();
        assert!(matches!(
            ads.config_source_specifier,
            Some(ConfigSourceSpecifier::Ads(_))
        ));
    }
    assert_eq!(cla.endpoints[0].locality.as_ref().unwrap().zone, "a");
    // On the wire, on stream 5: the version carries the stream's epoch, and the collections
    // are named in the stream's generation of this version.
    let wire = r.endpoints.to_resource_on(5);
    let epoch = leds::epoch(5);
    assert_eq!(wire.version, format!("{}.{epoch}", r.endpoints.version));
    let cla = ClusterLoadAssignment::decode(&*wire.resource.unwrap().value).unwrap();
    let generation = leds::generation(&epoch, &r.endpoints.version);
    assert!(generation.starts_with(&epoch) && generation.len() == epoch.len() + 9);
    assert_eq!(
        leds::collections_in(&cla),
        [0, 1].map(|i| leds::collection("big.vip", &generation, i))
    );
    assert_ne!(leds::epoch(6), epoch, "another stream, another epoch");

    let plain = build("big.vip", Lookup::Registered(&four), &leds_opts(5)).unwrap();
    assert!(plain.endpoints.leds.is_none());
    let wire = plain.endpoints.to_resource_on(5);
    assert_eq!(wire.version, *plain.endpoints.version);
    let cla = ClusterLoadAssignment::decode(&*wire.resource.unwrap().value).unwrap();
    assert_eq!(
        cla.endpoints
            .iter()
            .map(|l| l.lb_endpoints.len())
            .sum::<usize>(),
        4
    );
    let off = build("big.vip", Lookup::Registered(&big(200)), &leds_opts(0)).unwrap();
    assert!(off.endpoints.leds.is_none(), "0 turns collections off");
}

#[test]
fn a_split_assignment_keeps_its_version_when_only_endpoints_change_and_members_tell_what_did() {
    let before = big(6);
    let mut after = big(6);
    after.endpoints.retain(|e| e.ip.to_string() != "10.0.0.2");
    after.endpoints.push(ep(Some("a"), "10.0.0.9", 8080));
    after.endpoints.sort();
    let (b, a) = (
        build("big.vip", Lookup::Registered(&before), &leds_opts(4)).unwrap(),
        build("big.vip", Lookup::Registered(&after), &leds_opts(4)).unwrap(),
    );
    assert_eq!(
        a.endpoints.version, b.endpoints.version,
        "the localities did not change"
    );
    let (bl, al) = (b.endpoints.leds.unwrap(), a.endpoints.leds.unwrap());
    let (send, gone) = leds::diff(&bl.localities[0], &al.localities[0]);
    assert_eq!(
        ids(&send.into_iter().cloned().collect::<Vec<_>>()),
        ["10.0.0.9_8080"]
    );
    assert_eq!(gone, ["10.0.0.2_8080"]);
    let (send, gone) = leds::diff(&bl.localities[1], &al.localities[1]);
    assert!(send.is_empty() && gone.is_empty(), "zone b did not change");
    // A glob's first answer: every member of its locality.
    let (send, gone) = leds::diff(&[], &al.localities[1]);
    assert_eq!(send.len(), 3);
    assert!(gone.is_empty());
    // A new zone changes the assignment itself.
    let mut zoned = big(6);
    zoned.endpoints.push(ep(Some("c"), "10.0.0.7", 8080));
    zoned.endpoints.sort();
    let z = build("big.vip", Lookup::Registered(&zoned), &leds_opts(4)).unwrap();
    assert_ne!(z.endpoints.version, b.endpoints.version);
}

#[test]
fn collection_names_read_back_and_nothing_else_reads_as_one() {
    let name = leds::collection("big.vip", "1f.7.0a1b2c3d", 2);
    assert_eq!(
        leds::parse_glob(&name),
        Some(leds::Glob {
            cluster: "big.vip",
            epoch: "1f.7.0a1b2c3d",
            locality: 2
        })
    );
    assert!(leds::is_collection_name(&name) && !leds::is_collection_name("big.vip"));
    let member = leds::member_name("big.vip", "1f.7.0a1b2c3d", 2, "10.0.0.1_80");
    assert_eq!(
        member.rsplit_once('/').unwrap().0,
        name.rsplit_once('/').unwrap().0
    );
    for bad in [
        "xdstp://odmesh/envoy.config.endpoint.v3.LbEndpoint/big.vip/1f.7.0a1b2c3d/2",
        "xdstp://odmesh/envoy.config.endpoint.v3.LbEndpoint/big.vip/1f.7.0a1b2c3d/x/*",
        "xdstp://odmesh/envoy.config.endpoint.v3.LbEndpoint/big.vip/2/*",
        "xdstp://odmesh/envoy.config.endpoint.v3.LbEndpoint//1f.7/2/*",
        "xdstp://other/envoy.config.endpoint.v3.LbEndpoint/big.vip/1f.7/2/*",
        "big.vip",
        "",
    ] {
        assert_eq!(leds::parse_glob(bad), None, "{bad}");
    }
}

#[test]
fn a_member_id_holds_only_characters_envoy_keeps_as_they_are() {
    let v6 = info(
        "six",
        Kind::Vip,
        vec![ep(None, "fd00::1", 8080), ep(None, "fd00::2", 8080)],
    );
    let r = build("six.vip", Lookup::Registered(&v6), &leds_opts(2)).unwrap();
    let split = r.endpoints.leds.unwrap();
    assert_eq!(ids(&split.localities[0]), ["fd00--1_8080", "fd00--2_8080"]);
    let ok = |c: char| c.is_ascii_alphanumeric() || "._-".contains(c);
    assert!(split.localities[0].iter().all(|m| m.id.chars().all(ok)));
    // Two instances on one address are one member.
    let twice = info(
        "two",
        Kind::Vip,
        vec![ep(None, "10.0.0.1", 80), ep(None, "10.0.0.1", 80)],
    );
    let r = build("two.vip", Lookup::Registered(&twice), &leds_opts(2)).unwrap();
    assert_eq!(
        ids(&r.endpoints.leds.unwrap().localities[0]),
        ["10.0.0.1_80"]
    );
}
