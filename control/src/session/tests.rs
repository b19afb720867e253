use std::net::IpAddr;

use super::*;
use crate::model::Snapshot;
use crate::prewarm::{History, Limits};
use crate::xds::{CLUSTER_TYPE_URL, ENDPOINTS_TYPE_URL, XdsOptions};
use odmesh_registry::Registry;
use odmesh_registry::testing as testdata;

/// An ADS session on a cache where `hello` has one instance.
struct Ads {
    cache: Cache,
    metrics: Metrics,
    session: Session,
}

impl Ads {
    fn on_request(&mut self, req: DeltaDiscoveryRequest) -> [Option<DeltaDiscoveryResponse>; 2] {
        let cx = context(&self.cache, &self.metrics, None);
        self.session.on_request(&cx, req)
    }
}

/// A context without prewarm whose bound over all streams is `admission`.
fn bounded<'a>(cache: &'a Cache, metrics: &'a Metrics, admission: &'a Admission) -> Context<'a> {
    Context {
        admission,
        ..context(cache, metrics, None)
    }
}

fn ads_stream() -> Ads {
    let hello = testdata::instance("hello", "hello-1", "10.0.0.1");
    let snapshot = Snapshot::from_registry(&Registry::from_iter([hello]));
    let cache = Cache::with_snapshot(XdsOptions::new(Some("/ca.pem".into())), snapshot.into());
    Ads {
        cache,
        metrics: Metrics::default(),
        session: Session::new(1, Service::Ads, SubscriptionLimits::default()),
    }
}

fn request(type_url: &str, subscribe: &[&str], unsubscribe: &[&str]) -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest {
        type_url: type_url.into(),
        resource_names_subscribe: subscribe.iter().map(|s| s.to_string()).collect(),
        resource_names_unsubscribe: unsubscribe.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

fn sent(response: &Option<DeltaDiscoveryResponse>) -> Vec<&str> {
    (response.iter())
        .flat_map(|r| &r.resources)
        .map(|r| r.name.as_str())
        .collect()
}

#[test]
fn a_cluster_dropped_before_envoy_asked_for_its_endpoints_gets_them_when_asked_for_again() {
    let mut stream = ads_stream();
    // Envoy asks for hello.vip and drops it before the answer arrives: it ignores the
    // cluster, and the load assignment sent behind it.
    let [cluster, endpoints] = stream.on_request(request(CLUSTER_TYPE_URL, &["hello.vip"], &[]));
    assert_eq!(
        (sent(&cluster), sent(&endpoints)),
        (vec!["hello.vip"], vec!["hello.vip"])
    );
    stream.on_request(request(CLUSTER_TYPE_URL, &[], &["hello.vip"]));
    assert!(
        stream.session.status().endpoints.is_empty(),
        "Envoy will never subscribe to it now"
    );

    // It asks again, gets the cluster, and subscribes to the load assignment: it has it.
    let [cluster, endpoints] = stream.on_request(request(CLUSTER_TYPE_URL, &["hello.vip"], &[]));
    assert_eq!(
        (sent(&cluster), sent(&endpoints)),
        (vec!["hello.vip"], vec!["hello.vip"])
    );
    let [again, _] = stream.on_request(request(ENDPOINTS_TYPE_URL, &["hello.vip"], &[]));
    assert!(again.is_none(), "what was just sent is not sent again");
}

#[test]
fn a_name_that_is_not_an_odmesh_cluster_gets_no_load_assignment_on_envoys_behalf() {
    let mut stream = ads_stream();
    let [cluster, endpoints] = stream.on_request(request(CLUSTER_TYPE_URL, &["xds_cluster"], &[]));
    assert_eq!(
        cluster.map(|r| r.removed_resources),
        Some(vec!["xds_cluster".to_owned()])
    );
    assert!(endpoints.is_none());
    assert!(stream.session.status().endpoints.is_empty());
}

#[test]
fn names_beyond_the_shared_room_wait_and_are_pushed_once_there_is_room() {
    let mut stream = ads_stream();
    let admission = Admission::new(1);
    let cx = bounded(&stream.cache, &stream.metrics, &admission);
    // One name fits; the second waits: a removal now, and not counted.
    let [cluster, endpoints] = stream.session.on_request(
        &cx,
        request(CLUSTER_TYPE_URL, &["hello.vip", "other.vip"], &[]),
    );
    assert_eq!(sent(&cluster), ["hello.vip"]);
    assert_eq!(
        cluster.as_ref().map(|r| r.removed_resources.clone()),
        Some(vec!["other.vip".to_owned()])
    );
    assert_eq!(sent(&endpoints), ["hello.vip"]);
    let metrics = &stream.metrics;
    assert_eq!(metrics.xds_cluster_subscriptions.load(Ordering::Relaxed), 1);
    assert_eq!(metrics.xds_names_waiting_total.load(Ordering::Relaxed), 1);
    assert!(stream.session.is_waiting());
    assert!(
        (stream.session)
            .on_change(&cx, Changes::default())
            .iter()
            .all(Option::is_none),
        "no room yet"
    );

    // Room: hello.vip is unsubscribed. The waiting name is pushed, with its endpoints.
    stream
        .session
        .on_request(&cx, request(CLUSTER_TYPE_URL, &[], &["hello.vip"]));
    let [cluster, endpoints] = stream.session.on_change(&cx, Changes::default());
    assert_eq!(sent(&cluster), ["other.vip"]);
    assert_eq!(sent(&endpoints), ["other.vip"]);
    assert!(!stream.session.is_waiting());
    assert_eq!(metrics.xds_cluster_subscriptions.load(Ordering::Relaxed), 1);

    // Closing gives back exactly what was counted.
    stream.session.close(&cx);
    assert_eq!(
        (
            metrics.xds_cluster_subscriptions.load(Ordering::Relaxed),
            metrics.xds_subscriptions.load(Ordering::Relaxed),
            stream.cache.watched(),
        ),
        (0, 0, 0)
    );
}

/// The names in a response's `removed_resources`.
fn removed(response: &Option<DeltaDiscoveryResponse>) -> Vec<&str> {
    (response.iter())
        .flat_map(|r| &r.removed_resources)
        .map(String::as_str)
        .collect()
}

/// An ADS session with at most `max_unregistered` unregistered names per type.
fn ads_stream_within(max_unregistered: usize) -> Ads {
    Ads {
        session: Session::new(
            1,
            Service::Ads,
            SubscriptionLimits {
                max_names: 100,
                max_unregistered,
            },
        ),
        ..ads_stream()
    }
}

#[test]
fn load_assignments_of_no_counted_cluster_are_bounded_and_refused_ones_cost_no_cache_entry() {
    // A client subscribing random load-assignment names, with no cluster: each would be a
    // resource built and kept for the stream's life.
    let mut stream = ads_stream_within(2);
    let inbox = stream.cache.open_stream(1);
    let names = ["x1.vip", "x2.vip", "x3.vip", "x4.vip", "x5.vip"];
    let [endpoints, _] = stream.on_request(request(ENDPOINTS_TYPE_URL, &names, &[]));
    assert_eq!(sent(&endpoints), ["x1.vip", "x2.vip"]);
    assert_eq!(removed(&endpoints), ["x3.vip", "x4.vip", "x5.vip"]);
    assert_eq!(
        stream
            .metrics
            .xds_names_refused_total
            .load(Ordering::Relaxed),
        3
    );
    assert_eq!(stream.metrics.xds_subscriptions.load(Ordering::Relaxed), 2);
    assert_eq!(stream.cache.watched(), 2, "refused names are not watched");
    assert_eq!(
        stream.session.status().endpoints.len(),
        5,
        "all are subscribed"
    );

    // The load assignment of a cluster the stream counts needs no room of its own, even
    // unregistered: the cluster's room is its.
    let [cluster, endpoints] = stream.on_request(request(CLUSTER_TYPE_URL, &["y.vip"], &[]));
    assert_eq!(
        (sent(&cluster), sent(&endpoints)),
        (vec!["y.vip"], vec!["y.vip"])
    );
    let [again, _] = stream.on_request(request(ENDPOINTS_TYPE_URL, &["y.vip"], &[]));
    assert!(again.is_none(), "sent behind its cluster already");
    assert_eq!(
        stream
            .metrics
            .xds_names_refused_total
            .load(Ordering::Relaxed),
        3
    );

    // x5 is registered: the stream, which watches no x5, is told, and sends it.
    let registry = Registry::from_iter([
        testdata::instance("hello", "hello-1", "10.0.0.1"),
        testdata::instance("x5", "x5-1", "10.0.0.5"),
    ]);
    stream
        .cache
        .set_snapshot(Snapshot::from_registry(&registry).into());
    let changes = inbox.take();
    assert!(changes.names.contains("x5.vip"), "{changes:?}");
    let cx = context(&stream.cache, &stream.metrics, None);
    let [_, endpoints] = stream.session.on_change(&cx, changes);
    assert_eq!(sent(&endpoints), ["x5.vip"]);
    // Sent registered, it counts like any other name from now on.
    assert_eq!(stream.metrics.xds_subscriptions.load(Ordering::Relaxed), 5);
    assert_eq!(stream.cache.watched(), 4);

    // Unsubscribing the refused ones gives back nothing (they took nothing); closing gives
    // back exactly what was counted.
    stream
        .session
        .on_request(&cx, request(ENDPOINTS_TYPE_URL, &[], &["x3.vip", "x4.vip"]));
    assert_eq!(stream.metrics.xds_subscriptions.load(Ordering::Relaxed), 5);
    stream.session.close(&cx);
    assert_eq!(
        (
            stream.metrics.xds_subscriptions.load(Ordering::Relaxed),
            stream.cache.watched()
        ),
        (0, 0)
    );
}

#[test]
fn refused_cluster_names_take_no_room_from_other_streams() {
    // Under a shared bound of 3 names, a client asking for 10 unregistered clusters, of which
    // its stream admits 1, leaves room for another proxy's real VIP.
    let mut flood = ads_stream_within(1);
    let admission = Admission::new(3);
    let cx = bounded(&flood.cache, &flood.metrics, &admission);
    let names: Vec<String> = (0..10).map(|i| format!("random-{i}.vip")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let [cluster, _] = flood
        .session
        .on_request(&cx, request(CLUSTER_TYPE_URL, &names, &[]));
    assert_eq!(sent(&cluster).len() + removed(&cluster).len(), 10);
    // The request's 3 names of room were taken before they were admitted; the 2 refused
    // gave theirs back. The 7 beyond wait, and are refused in turn as room allows.
    assert_eq!(flood.session.status().waiting, 7);
    assert_eq!(admission.room(), 2, "only the admitted name takes room");
    flood.session.on_change(&cx, Changes::default());
    assert_eq!(flood.session.status().waiting, 5);
    assert_eq!(admission.room(), 2);
    let mut proxy = Session::new(2, Service::Ads, SubscriptionLimits::default());
    let [cluster, endpoints] =
        proxy.on_request(&cx, request(CLUSTER_TYPE_URL, &["hello.vip"], &[]));
    assert_eq!(
        (sent(&cluster), sent(&endpoints)),
        (vec!["hello.vip"], vec!["hello.vip"])
    );
}

#[test]
fn kept_versions_after_a_streams_first_request_of_a_type_take_room_like_any_name() {
    let mut stream = ads_stream();
    let admission = Admission::new(1);
    let cx = bounded(&stream.cache, &stream.metrics, &admission);
    stream
        .session
        .on_request(&cx, request(CLUSTER_TYPE_URL, &["hello.vip"], &[]));
    // A later request claims to have kept other.vip: not its first request of the type, so
    // the claim is ignored and other.vip needs room, of which there is none.
    let late = DeltaDiscoveryRequest {
        initial_resource_versions: [("other.vip".to_owned(), "v1".to_owned())].into(),
        ..request(CLUSTER_TYPE_URL, &["other.vip"], &[])
    };
    let [cluster, _] = stream.session.on_request(&cx, late);
    assert_eq!(
        cluster.map(|r| r.removed_resources),
        Some(vec!["other.vip".to_owned()]),
        "it waits for room"
    );
    let metrics = &stream.metrics;
    assert_eq!(metrics.xds_cluster_subscriptions.load(Ordering::Relaxed), 1);
    assert_eq!(
        metrics
            .xds_late_versions_ignored_total
            .load(Ordering::Relaxed),
        1
    );
    assert!(stream.session.is_waiting());
    stream.session.close(&cx);
}

/// A session of a proxy of service `billing` on a cache where `hello` and `world` are
/// registered (complete, unless `loading`), with a history in which `billing` used
/// `hello.vip`, `world.vip` and `gone.vip` (no longer registered).
struct Prewarmed {
    cache: Cache,
    metrics: Metrics,
    prewarm: Prewarm,
    session: Session,
    inbox: std::sync::Arc<crate::cache::Inbox>,
}

impl Prewarmed {
    fn new(loading: bool) -> Prewarmed {
        let registry = Registry::from_iter([
            testdata::instance("hello", "hello-1", "10.0.0.1"),
            testdata::instance("world", "world-1", "10.0.0.2"),
        ])
        .still_loading(loading);
        let cache = Cache::with_snapshot(
            XdsOptions::new(Some("/ca.pem".into())),
            Snapshot::from_registry(&registry).into(),
        );
        let prewarm = Prewarm::new(
            Limits::default(),
            None,
            History::default(),
            Default::default(),
        );
        prewarm.asked("billing", ["hello.vip", "world.vip", "gone.vip"]);
        Prewarmed {
            inbox: cache.open_stream(1),
            cache,
            metrics: Metrics::default(),
            prewarm,
            session: Session::new(1, Service::Ads, SubscriptionLimits::default()),
        }
    }

    fn on_request(&mut self, req: DeltaDiscoveryRequest) -> [Option<DeltaDiscoveryResponse>; 2] {
        let cx = context(&self.cache, &self.metrics, Some(&self.prewarm));
        self.session.on_request(&cx, req)
    }

    fn on_change(&mut self) -> [Option<DeltaDiscoveryResponse>; 2] {
        let cx = context(&self.cache, &self.metrics, Some(&self.prewarm));
        self.session.on_change(&cx, self.inbox.take())
    }

    fn close(&self) {
        let cx = context(&self.cache, &self.metrics, Some(&self.prewarm));
        self.session.close(&cx);
    }
}

/// A context without a shared bound and without eviction.
fn context<'a>(
    cache: &'a Cache,
    metrics: &'a Metrics,
    prewarm: Option<&'a Prewarm>,
) -> Context<'a> {
    // No bound: the count the tests share never leaves room short.
    static UNBOUNDED: Admission = Admission::new(usize::MAX);
    Context {
        cache,
        metrics,
        admission: &UNBOUNDED,
        prewarm,
        eviction: None,
    }
}

/// Envoy's first cluster request with a `cds_config`: no names (the wildcard), and the node.
fn wildcard_request(service: &str) -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest {
        node: Some(envoy_types::pb::envoy::config::core::v3::Node {
            id: "proxy-1".into(),
            cluster: service.into(),
            ..Default::default()
        }),
        ..request(CLUSTER_TYPE_URL, &[], &[])
    }
}

#[test]
fn a_wildcard_stream_is_sent_its_services_registered_history_with_the_load_assignments() {
    let mut stream = Prewarmed::new(false);
    let [clusters, endpoints] = stream.on_request(wildcard_request("billing"));
    assert_eq!(
        sent(&clusters),
        ["hello.vip", "world.vip"],
        "gone.vip is not registered"
    );
    assert_eq!(sent(&endpoints), ["hello.vip", "world.vip"]);
    let status = stream.session.status();
    assert!(status.wildcard);
    assert_eq!(status.prewarmed, 2);
    assert_eq!(
        stream.metrics.prewarm_pushed_total.load(Ordering::Relaxed),
        2
    );
    assert_eq!(
        stream
            .metrics
            .xds_cluster_subscriptions
            .load(Ordering::Relaxed),
        2
    );
    // Envoy subscribes to the load assignments it was sent: not sent again.
    let [again, _] = stream.on_request(request(
        ENDPOINTS_TYPE_URL,
        &["hello.vip", "world.vip"],
        &[],
    ));
    assert!(again.is_none());
    // An on-demand name besides the wildcard is served as ever.
    let [clusters, _] = stream.on_request(request(CLUSTER_TYPE_URL, &["other.vip"], &[]));
    assert_eq!(sent(&clusters), ["other.vip"]);
    stream.close();
    assert_eq!(
        stream.cache.watched(),
        0,
        "closing gives back what prewarm counted"
    );
}

#[test]
fn a_wildcard_with_nothing_to_send_is_answered_at_once_with_an_empty_response() {
    let mut stream = Prewarmed::new(false);
    let [clusters, endpoints] = stream.on_request(wildcard_request("search"));
    let clusters = clusters.expect("Envoy holds its listeners until this answer");
    assert!(clusters.resources.is_empty() && clusters.removed_resources.is_empty());
    assert!(endpoints.is_none());
    // Its ACK is not answered again.
    let ack = DeltaDiscoveryRequest {
        response_nonce: clusters.nonce,
        ..request(CLUSTER_TYPE_URL, &[], &[])
    };
    assert!(stream.on_request(ack).iter().all(Option::is_none));
}

#[test]
fn while_the_registry_loads_nothing_is_sent_ahead_and_once_complete_the_history_goes() {
    let mut stream = Prewarmed::new(true);
    let [clusters, _] = stream.on_request(wildcard_request("billing"));
    assert!(
        sent(&clusters).is_empty(),
        "which VIPs are gone is not known yet"
    );
    assert!(clusters.is_some(), "but the wildcard is answered");
    let complete = Registry::from_iter([testdata::instance("hello", "hello-1", "10.0.0.1")]);
    stream
        .cache
        .set_snapshot(Snapshot::from_registry(&complete).into());
    let [clusters, endpoints] = stream.on_change();
    assert_eq!(sent(&clusters), ["hello.vip"], "world.vip went meanwhile");
    assert_eq!(sent(&endpoints), ["hello.vip"]);
    assert!(stream.on_change().iter().all(Option::is_none), "once only");
}

#[test]
fn a_reconnecting_wildcard_proxy_keeps_what_it_holds_and_gets_only_what_it_lacks() {
    let mut stream = Prewarmed::new(false);
    // Envoy held hello.vip (sent ahead before) and other.vip (asked on demand); on the
    // new stream it names the wildcard and its on-demand name, and lists both as kept.
    let versions = stream.cache.snapshot();
    assert!(versions.get("hello.vip").is_some());
    let mut first = wildcard_request("billing");
    first.resource_names_subscribe = vec!["*".into(), "other.vip".into()];
    let [clusters, _] = stream.on_request(DeltaDiscoveryRequest {
        initial_resource_versions: [
            ("hello.vip".to_owned(), "stale".to_owned()),
            ("other.vip".to_owned(), "stale".to_owned()),
        ]
        .into(),
        ..first
    });
    // hello.vip is brought up to date (its version differs), world.vip is sent ahead,
    // other.vip too (changed); nothing is sent twice.
    assert_eq!(sent(&clusters), ["hello.vip", "other.vip", "world.vip"]);
    let status = stream.session.status();
    assert_eq!(status.clusters, ["hello.vip", "other.vip", "world.vip"]);
    assert_eq!(status.prewarmed, 1);
}

#[test]
fn on_demand_asks_are_recorded_for_the_service_and_prewarm_off_records_nothing() {
    let mut stream = Prewarmed::new(false);
    let mut first = request(CLUSTER_TYPE_URL, &["hello.vip", "nobody.vip"], &[]);
    first.node = wildcard_request("search").node;
    stream.on_request(first);
    assert_eq!(
        stream.prewarm.predict("search", |_| true),
        ["hello.vip"],
        "only registered VIPs"
    );
    assert!(
        !stream.session.status().wildcard,
        "names in a first request: no wildcard"
    );
    assert_eq!(
        stream.metrics.prewarm_asked_total.load(Ordering::Relaxed),
        1
    );

    let mut off = ads_stream();
    let mut first = request(CLUSTER_TYPE_URL, &[], &[]);
    first.node = wildcard_request("search").node;
    let [clusters, _] = off.on_request(first);
    assert!(
        clusters.is_some(),
        "a wildcard is answered even with prewarm off"
    );
    assert!(sent(&clusters).is_empty());
}

#[test]
fn a_request_weighs_the_names_it_lists_and_a_wildcard_start_what_may_go_ahead() {
    let stream = Prewarmed::new(false);
    let cx = context(&stream.cache, &stream.metrics, Some(&stream.prewarm));
    let session = &stream.session;
    let listed = request(CLUSTER_TYPE_URL, &["a.vip", "b.vip"], &["c.vip"]);
    assert_eq!(session.request_weight(&cx, &listed), 3);
    // The first cluster request without names starts the wildcard: the service's history
    // may go ahead, 1,000 clusters at most.
    let limit = Limits::default().max_per_service;
    assert_eq!(
        session.request_weight(&cx, &wildcard_request("billing")),
        limit
    );
    let explicit = request(CLUSTER_TYPE_URL, &["*", "a.vip"], &[]);
    assert_eq!(session.request_weight(&cx, &explicit), 2 + limit);
    // Not on load assignments, and not without prewarm.
    let endpoints = request(ENDPOINTS_TYPE_URL, &[], &[]);
    assert_eq!(session.request_weight(&cx, &endpoints), 0);
    let off = context(&stream.cache, &stream.metrics, None);
    assert_eq!(
        session.request_weight(&off, &wildcard_request("billing")),
        0
    );
}

#[test]
fn a_change_weighs_the_names_it_changed_and_a_full_diff_every_subscribed_one() {
    let mut stream = ads_stream();
    stream.on_request(request(CLUSTER_TYPE_URL, &["hello.vip", "other.vip"], &[]));
    let cx = context(&stream.cache, &stream.metrics, None);
    // Two clusters, and their load assignments sent along.
    assert_eq!(stream.session.subscribed(), 4);
    let all = Changes {
        all: true,
        ..Changes::default()
    };
    assert_eq!(stream.session.change_weight(&cx, &all), 4);
    let one = Changes {
        all: false,
        names: ["hello.vip".to_owned()].into(),
    };
    assert_eq!(stream.session.change_weight(&cx, &one), 1);
    assert_eq!(stream.session.tick_weight(), 0);
}

#[test]
fn each_service_serves_only_its_own_types() {
    assert_eq!(
        Service::Ads.resource_type(CLUSTER_TYPE_URL),
        Some(ResourceType::Cluster)
    );
    assert_eq!(
        Service::Ads.resource_type(ENDPOINTS_TYPE_URL),
        Some(ResourceType::Endpoints)
    );
    assert_eq!(Service::Ads.resource_type(""), None);
    assert_eq!(Service::Cds.resource_type(""), Some(ResourceType::Cluster));
    assert_eq!(Service::Cds.resource_type(ENDPOINTS_TYPE_URL), None);
    assert_eq!(
        Service::Eds.resource_type(""),
        Some(ResourceType::Endpoints)
    );
    assert_eq!(
        Service::Ads.resource_type("type.googleapis.com/envoy.config.listener.v3.Listener"),
        None
    );
}

#[test]
fn one_source_takes_its_share_of_the_shared_room_and_no_more_however_many_streams_it_opens() {
    let instances = ["a", "b", "c", "d", "e"].map(|vip| testdata::instance(vip, vip, "10.0.0.9"));
    let snapshot = Snapshot::from_registry(&Registry::from_iter(instances));
    let cache = Cache::with_snapshot(XdsOptions::new(Some("/ca.pem".into())), snapshot.into());
    let metrics = Metrics::default();
    let admission = Admission::with_share(10, 4);
    let cx = bounded(&cache, &metrics, &admission);
    let (hog, other): (IpAddr, IpAddr) = ("10.1.0.1".parse().unwrap(), "10.1.0.2".parse().unwrap());
    let stream = |id, source| {
        Session::new(id, Service::Ads, SubscriptionLimits::default()).from_source(Some(source))
    };
    let ask = |session: &mut Session, names: &[&str]| {
        let [cluster, _] = session.on_request(&cx, request(CLUSTER_TYPE_URL, names, &[]));
        let removed = cluster.as_ref().map(|r| r.removed_resources.clone());
        (
            sent(&cluster)
                .iter()
                .map(|s| s.to_string())
                .collect::<Vec<_>>(),
            removed.unwrap_or_default(),
        )
    };

    // Two streams from one source: the second gets what is left of the source's share, and
    // its other name waits (a removal now) although there is room over all streams.
    let mut first = stream(1, hog);
    assert_eq!(ask(&mut first, &["a.vip", "b.vip", "c.vip"]).0.len(), 3);
    let mut second = stream(2, hog);
    let (served, waiting) = ask(&mut second, &["d.vip", "e.vip"]);
    assert_eq!(
        (served.len(), waiting.len()),
        (1, 1),
        "{served:?} {waiting:?}"
    );
    assert!(second.is_waiting());
    assert_eq!(admission.used_by(hog), 4);
    assert_eq!(admission.room(), 6);
    let waiting_for_source = || {
        metrics
            .xds_names_waiting_for_source_total
            .load(Ordering::Relaxed)
    };
    assert_eq!(waiting_for_source(), 1);

    // Another source is served all it asks for.
    let mut third = stream(3, other);
    assert_eq!(
        ask(&mut third, &["a.vip", "b.vip", "c.vip", "d.vip"])
            .0
            .len(),
        4
    );
    assert_eq!((admission.used_by(other), admission.room()), (4, 2));
    assert_eq!(waiting_for_source(), 1);

    // The source's first stream closes: its share frees up for its waiting name.
    first.close(&cx);
    assert_eq!(admission.used_by(hog), 1);
    let [cluster, endpoints] = second.on_change(&cx, Changes::default());
    assert_eq!(sent(&cluster).len(), 1);
    assert_eq!(sent(&endpoints).len(), 1);
    assert!(!second.is_waiting());
    assert_eq!((admission.used_by(hog), admission.room()), (2, 4));

    // Everything closed: nothing is left counted, and no source is remembered.
    second.close(&cx);
    third.close(&cx);
    assert_eq!(
        (
            admission.used_by(hog),
            admission.used_by(other),
            admission.room()
        ),
        (0, 0, 10)
    );
}

#[test]
fn names_tracked_over_all_streams_and_per_source_are_bounded_whatever_their_standing() {
    let cache = Cache::with_snapshot(
        XdsOptions::new(Some("/ca.pem".into())),
        Snapshot::from_registry(&Registry::from_iter([testdata::instance(
            "a", "a", "10.0.0.9",
        )]))
        .into(),
    );
    let metrics = Metrics::default();
    // 10 names tracked in all, 6 by one source; unregistered names past the first are refused
    // and still tracked.
    let admission = Admission::new(100).tracking(10, 6);
    let cx = bounded(&cache, &metrics, &admission);
    let limits = SubscriptionLimits {
        max_unregistered: 1,
        ..SubscriptionLimits::default()
    };
    let (a, b): (IpAddr, IpAddr) = ("10.1.0.1".parse().unwrap(), "10.1.0.2".parse().unwrap());
    let stream = |id, source| Session::new(id, Service::Ads, limits).from_source(Some(source));
    let names = |prefix: &str, n| {
        (0..n)
            .map(|i| format!("{prefix}{i}.vip"))
            .collect::<Vec<_>>()
    };
    let ask = |session: &mut Session, names: &[String]| {
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let [cluster, _] = session.on_request(&cx, request(ENDPOINTS_TYPE_URL, &names, &[]));
        cluster.map_or(0, |r| r.removed_resources.len())
    };
    let untracked = || metrics.xds_names_untracked_total.load(Ordering::Relaxed);

    let mut a1 = stream(1, a);
    ask(&mut a1, &names("x", 5));
    assert_eq!(admission.names_tracked(Some(a)), (5, 5));
    // The source's second stream tracks one more name: its share is 6.
    let mut a2 = stream(2, a);
    assert_eq!(
        ask(&mut a2, &names("y", 3)),
        2,
        "a removal for the two untracked (the first is the stream's one unregistered name)"
    );
    assert_eq!((admission.names_tracked(Some(a)), untracked()), ((6, 6), 2));
    // Another source takes what is left over all streams: 4.
    let mut b1 = stream(3, b);
    ask(&mut b1, &names("z", 5));
    assert_eq!(
        (admission.names_tracked(Some(b)), untracked()),
        ((10, 4), 3)
    );
    // An unsubscribe gives back; a close gives back all.
    a1.on_request(&cx, request(ENDPOINTS_TYPE_URL, &[], &["x0.vip"]));
    assert_eq!(admission.names_tracked(Some(a)), (9, 5));
    a1.close(&cx);
    assert_eq!(admission.names_tracked(Some(a)), (5, 1));
    a2.close(&cx);
    b1.close(&cx);
    assert_eq!(admission.names_tracked(Some(b)), (0, 0));
}

#[test]
fn a_refused_name_once_registered_takes_room_like_any_other_or_waits_for_it() {
    let stream = ads_stream();
    let admission = Admission::new(1);
    let cx = bounded(&stream.cache, &stream.metrics, &admission);
    let refusing = SubscriptionLimits {
        max_unregistered: 0,
        ..SubscriptionLimits::default()
    };
    let inbox = stream.cache.open_stream(1);
    let mut a = Session::new(1, Service::Ads, refusing);
    let mut b = Session::new(2, Service::Ads, SubscriptionLimits::default());
    a.on_request(&cx, request(CLUSTER_TYPE_URL, &["x.vip"], &[]));
    assert_eq!(a.status().refused, 1);
    // The other stream takes the only room.
    let [cluster, _] = b.on_request(&cx, request(CLUSTER_TYPE_URL, &["hello.vip"], &[]));
    assert_eq!(sent(&cluster), ["hello.vip"]);
    assert_eq!(admission.room(), 0);

    // x is registered: no room, so it waits rather than being counted over the bound.
    let registry = Registry::from_iter([
        testdata::instance("hello", "hello-1", "10.0.0.1"),
        testdata::instance("x", "x-1", "10.0.0.2"),
    ]);
    stream
        .cache
        .set_snapshot(Snapshot::from_registry(&registry).into());
    let [cluster, _] = a.on_change(&cx, inbox.take());
    assert!(
        sent(&cluster).is_empty(),
        "sent over the bound: {:?}",
        sent(&cluster)
    );
    assert!(a.is_waiting());
    assert_eq!(admission.room(), 0);
    // Room again: it is pushed.
    b.close(&cx);
    let [cluster, endpoints] = a.on_change(&cx, Changes::default());
    assert_eq!(
        (sent(&cluster), sent(&endpoints)),
        (vec!["x.vip"], vec!["x.vip"])
    );
    assert_eq!(admission.room(), 0);
    a.close(&cx);
    assert_eq!(admission.room(), 1);
}

#[test]
fn a_name_subscribed_and_unsubscribed_in_one_request_is_neither_counted_nor_watched() {
    // Found by the xds_session fuzz target: the name was given back before it was counted,
    // so its source kept counting it (and the cache watching it) after it was gone.
    let stream = ads_stream();
    let admission = Admission::with_share(10, 5);
    let cx = bounded(&stream.cache, &stream.metrics, &admission);
    let source: IpAddr = "10.1.0.1".parse().unwrap();
    let mut session =
        Session::new(1, Service::Ads, SubscriptionLimits::default()).from_source(Some(source));
    session.on_request(
        &cx,
        request(CLUSTER_TYPE_URL, &["hello.vip"], &["hello.vip"]),
    );
    let gauge = |g: &std::sync::atomic::AtomicU64| g.load(Ordering::Relaxed);
    let counts = || {
        (
            admission.used_by(source),
            admission.room(),
            gauge(&stream.metrics.xds_cluster_subscriptions),
            gauge(&stream.metrics.xds_subscriptions),
            stream.cache.watched(),
        )
    };
    assert_eq!(session.subscribed(), 0);
    assert_eq!(counts(), (0, 10, 0, 0, 0));
    session.close(&cx);
    assert_eq!(counts(), (0, 10, 0, 0, 0));
}

#[test]
fn a_refused_name_once_registered_is_counted_within_its_sources_share() {
    // Found by the xds_session fuzz target. A name refused as unregistered takes no room;
    // registered later, it was sent and counted without room under the bound or the source's
    // share: here the source counted 2 names with a share of 1. It waits for room now.
    let hello = testdata::instance("hello", "hello-1", "10.0.0.1");
    let later = testdata::instance("later", "later-1", "10.0.0.2");
    let options = XdsOptions::new(Some("/ca.pem".into()));
    let snapshot = Snapshot::from_registry(&Registry::from_iter([hello.clone()]));
    let cache = Cache::with_snapshot(options, snapshot.into());
    let metrics = Metrics::default();
    let admission = Admission::with_share(1, 1);
    let cx = bounded(&cache, &metrics, &admission);
    let source: IpAddr = "10.1.0.1".parse().unwrap();
    let limits = SubscriptionLimits {
        max_names: 10,
        max_unregistered: 0,
    };
    let mut session = Session::new(1, Service::Ads, limits).from_source(Some(source));
    let inbox = cache.open_stream(1);
    let [cluster, _] = session.on_request(&cx, request(CLUSTER_TYPE_URL, &["later.vip"], &[]));
    assert_eq!(
        removed(&cluster),
        ["later.vip"],
        "refused: no unregistered name allowed"
    );
    let [cluster, _] = session.on_request(&cx, request(CLUSTER_TYPE_URL, &["hello.vip"], &[]));
    assert_eq!(sent(&cluster), ["hello.vip"]);
    assert_eq!(
        (admission.used_by(source), admission.room()),
        (1, 0),
        "the share is full"
    );

    cache.set_snapshot(Snapshot::from_registry(&Registry::from_iter([hello, later])).into());
    let [cluster, _] = session.on_change(&cx, inbox.take());
    assert!(
        admission.used_by(source) <= 1,
        "the source counts {} names over its share of 1 (later.vip {}sent)",
        admission.used_by(source),
        if sent(&cluster).contains(&"later.vip") {
            ""
        } else {
            "not "
        }
    );
}

/// An ADS session on a cache where `big` has `n` instances and VIPs of 4 or more are split.
fn big_stream(n: u8) -> Ads {
    let snapshot = Snapshot::from_registry(&big_registry(n, &[]));
    let options = XdsOptions {
        leds_min_endpoints: 4,
        ..XdsOptions::new(Some("/ca.pem".into()))
    };
    Ads {
        cache: Cache::with_snapshot(options, snapshot.into()),
        metrics: Metrics::default(),
        session: Session::new(7, Service::Ads, SubscriptionLimits::default()),
    }
}

/// `big`'s instances 10.0.0.0 .. 10.0.0.<n-1> but `without`.
fn big_registry(n: u8, without: &[u8]) -> Registry {
    Registry::from_iter(
        (0..n)
            .filter(|i| !without.contains(i))
            .map(|i| testdata::instance("big", &format!("big-{i}"), &format!("10.0.0.{i}"))),
    )
}

const LB_ENDPOINT: &str = crate::xds::leds::LB_ENDPOINT_TYPE_URL;

/// The load assignment `any` holds.
fn decode_assignment(
    any: &envoy_types::pb::google::protobuf::Any,
) -> envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment {
    use prost::Message;
    envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment::decode(&*any.value)
        .expect("a load assignment")
}

impl Ads {
    fn on_change(&mut self, names: &[&str]) -> [Option<DeltaDiscoveryResponse>; 3] {
        let cx = context(&self.cache, &self.metrics, None);
        let changes = Changes {
            all: false,
            names: names.iter().map(|n| n.to_string()).collect(),
        };
        let [c, e] = self.session.on_change(&cx, changes);
        [c, e, self.session.take_collections()]
    }

    /// Subscribes `big.vip` as Envoy does: the cluster, its load assignment, its collection
    /// (returned).
    fn subscribe_big(&mut self) -> String {
        self.on_request(request(CLUSTER_TYPE_URL, &["big.vip"], &[]));
        self.on_request(request(ENDPOINTS_TYPE_URL, &["big.vip"], &[]));
        let glob = self.glob();
        self.on_request(request(LB_ENDPOINT, &[&glob], &[]));
        glob
    }

    /// The glob of `big.vip`'s only locality on this stream, as its load assignment now
    /// names it.
    fn glob(&self) -> String {
        use crate::xds::leds;
        let name = ResourceName::new("big.vip");
        let cla = self.cache.current("", ResourceType::Endpoints)(&name).unwrap();
        let generation = leds::generation(&self.session.epoch(), &cla.version);
        leds::collection("big.vip", &generation, 0)
    }
}

#[test]
fn a_large_vip_goes_out_as_a_collection_whose_members_follow_each_change() {
    let mut ads = big_stream(5);
    let [cluster, cla] = ads.on_request(request(CLUSTER_TYPE_URL, &["big.vip"], &[]));
    assert_eq!(sent(&cluster), ["big.vip"]);
    let cla = cla.expect("the load assignment follows the cluster");
    let epoch = ads.session.epoch();
    assert!(cla.resources[0].version.ends_with(&format!(".{epoch}")));
    let assignment = decode_assignment(cla.resources[0].resource.as_ref().unwrap());
    assert!(assignment.endpoints[0].lb_endpoints.is_empty());
    ads.on_request(request(ENDPOINTS_TYPE_URL, &["big.vip"], &[]));

    // Envoy subscribes the glob: every member, named under it.
    let glob = ads.glob();
    let [members, none] = ads.on_request(request(LB_ENDPOINT, &[&glob], &[]));
    assert!(none.is_none());
    let first = members.as_ref().expect("the glob's first answer");
    assert_eq!(first.type_url, LB_ENDPOINT);
    let prefix = glob.trim_end_matches('*');
    let names = sent(&members);
    assert_eq!(names.len(), 5);
    assert!(names.iter().all(|n| n.starts_with(prefix)), "{names:?}");
    assert!(
        first
            .resources
            .iter()
            .all(|r| r.resource.as_ref().unwrap().type_url == LB_ENDPOINT)
    );
    assert_eq!(ads.session.status().collections, 1);
    // Subscribed again, it is a new collection in Envoy: every member again.
    let [again, _] = ads.on_request(request(LB_ENDPOINT, &[&glob], &[]));
    assert_eq!(sent(&again).len(), 5);
    assert_eq!(ads.session.status().collections, 1);

    // One instance leaves and one arrives: the load assignment stays, two members move.
    let snapshot = Snapshot::from_registry(&Registry::from_iter(
        (0..5u8)
            .filter(|&i| i != 1)
            .chain([9])
            .map(|i| testdata::instance("big", &format!("big-{i}"), &format!("10.0.0.{i}"))),
    ));
    ads.cache.set_snapshot(snapshot.into());
    let [c, e, members] = ads.on_change(&["big.vip"]);
    assert!(
        c.is_none() && e.is_none(),
        "the cluster and its load assignment did not change"
    );
    assert_eq!(sent(&members), [format!("{prefix}10.0.0.9_8080")]);
    assert_eq!(removed(&members), [format!("{prefix}10.0.0.1_8080")]);
    // Another VIP's change says nothing here.
    let [_, _, members] = ads.on_change(&["other.vip"]);
    assert!(members.is_none());

    // Unsubscribed, the glob gets nothing more.
    ads.on_request(request(LB_ENDPOINT, &[], &[&glob]));
    assert_eq!(ads.session.status().collections, 0);
    ads.cache
        .set_snapshot(Snapshot::from_registry(&big_registry(5, &[])).into());
    let [_, _, members] = ads.on_change(&["big.vip"]);
    assert!(members.is_none());
}

#[test]
fn a_glob_of_another_stream_or_of_no_subscribed_assignment_is_not_taken() {
    let mut ads = big_stream(5);
    ads.on_request(request(CLUSTER_TYPE_URL, &["big.vip"], &[]));
    let other_epoch = crate::xds::leds::collection("big.vip", "0.1", 0);
    let no_locality = crate::xds::leds::collection("big.vip", &ads.session.epoch(), 1);
    let not_split = crate::xds::leds::collection("hello.vip", &ads.session.epoch(), 0);
    let [answer, _] = ads.on_request(request(
        LB_ENDPOINT,
        &[&other_epoch, &no_locality, &not_split, "junk"],
        &[],
    ));
    assert!(answer.is_none());
    assert_eq!(ads.session.status().collections, 0);
    // Nor on a stream that serves clusters only.
    let mut cds = big_stream(5);
    cds.session = Session::new(8, Service::Cds, SubscriptionLimits::default());
    let glob = cds.glob();
    let [answer, _] = cds.on_request(request(LB_ENDPOINT, &[&glob], &[]));
    assert!(answer.is_none());
}

#[test]
fn a_proxy_back_from_another_stream_gets_the_load_assignment_again_under_the_new_epoch() {
    let mut first = big_stream(5);
    let [_, cla] = first.on_request(request(CLUSTER_TYPE_URL, &["big.vip"], &[]));
    let kept = cla.unwrap().resources[0].version.clone();

    let mut second = big_stream(5);
    second.session = Session::new(8, Service::Ads, SubscriptionLimits::default());
    second.on_request(request(CLUSTER_TYPE_URL, &["big.vip"], &[]));
    let mut req = request(ENDPOINTS_TYPE_URL, &["big.vip"], &[]);
    req.initial_resource_versions
        .insert("big.vip".into(), kept.clone());
    let [cla, _] = second.on_request(req);
    let resent = cla.expect("the kept assignment names the old stream's collection");
    assert_ne!(resent.resources[0].version, kept);
    assert!(
        resent.resources[0]
            .version
            .ends_with(&second.session.epoch())
    );
}

#[test]
fn a_standalone_eds_stream_gets_a_large_vips_whole_load_assignment_and_its_changes() {
    let mut eds = big_stream(5);
    eds.session = Session::new(9, Service::Eds, SubscriptionLimits::default());
    let endpoints = |r: &Option<DeltaDiscoveryResponse>| {
        let any = r.as_ref().unwrap().resources[0].resource.clone().unwrap();
        let cla = decode_assignment(&any);
        assert!(
            cla.endpoints.iter().all(|l| l.lb_config.is_none()),
            "a collection on EDS"
        );
        cla.endpoints
            .iter()
            .map(|l| l.lb_endpoints.len())
            .sum::<usize>()
    };
    let [cla, _] = eds.on_request(request(ENDPOINTS_TYPE_URL, &["big.vip"], &[]));
    assert_eq!(endpoints(&cla), 5);
    eds.cache
        .set_snapshot(Snapshot::from_registry(&big_registry(5, &[3])).into());
    let [_, cla, members] = eds.on_change(&["big.vip"]);
    assert_eq!(
        endpoints(&cla),
        4,
        "an endpoint's change resends the whole assignment"
    );
    assert!(members.is_none());
}

#[test]
fn only_the_exact_name_of_a_collection_of_a_subscribed_split_assignment_is_taken() {
    let mut ads = big_stream(5);
    ads.on_request(request(CLUSTER_TYPE_URL, &["big.vip"], &[]));
    ads.on_request(request(ENDPOINTS_TYPE_URL, &["big.vip"], &[]));
    let glob = ads.glob();
    let (head, tail) = glob.split_at(glob.len() - 3);
    assert_eq!(tail, "0/*");
    let aliases = [format!("{head}00/*"), format!("{head}+0/*")];
    // Nor a registered VIP the stream does not subscribe.
    let unsubscribed = glob.replace("big.vip", "hello.vip");
    let mut names: Vec<&str> = aliases.iter().map(String::as_str).collect();
    names.push(&unsubscribed);
    let [answer, _] = ads.on_request(request(LB_ENDPOINT, &names, &[]));
    assert!(answer.is_none(), "{answer:?}");
    assert_eq!(ads.session.status().collections, 0);
    // The exact name is.
    let [answer, _] = ads.on_request(request(LB_ENDPOINT, &[&glob], &[]));
    assert_eq!(sent(&answer).len(), 5);
}

#[test]
fn a_changed_cluster_names_its_collections_anew_and_the_old_ones_are_forgotten() {
    let mut ads = big_stream(5);
    let old = ads.subscribe_big();
    let policy = b"vips: {big: {retries: {count: 1}}}";
    ads.cache.set_policy(std::sync::Arc::new(
        crate::policy::Policy::parse(policy).unwrap(),
    ));
    let [cluster, cla, members] = ads.on_change(&["big.vip"]);
    assert_eq!(sent(&cluster), ["big.vip"]);
    let cla = cla.expect("a changed cluster brings its load assignment");
    let new = ads.glob();
    assert_ne!(
        new, old,
        "the new cluster's collection has a name of its own"
    );
    let assignment = decode_assignment(cla.resources[0].resource.as_ref().unwrap());
    assert_eq!(
        crate::xds::leds::collections_in(&assignment),
        std::slice::from_ref(&new)
    );
    assert!(members.is_none(), "nothing more for the old collection");
    assert_eq!(ads.session.status().collections, 0);
    let [answer, _] = ads.on_request(request(LB_ENDPOINT, &[&new], &[&old]));
    assert_eq!(
        sent(&answer).len(),
        5,
        "the new collection gets every member"
    );
}

#[test]
fn a_vip_that_goes_whole_drops_its_collection_and_split_again_starts_from_nothing() {
    let mut ads = big_stream(5);
    ads.subscribe_big();
    // Two instances: below three quarters of the threshold of 4, whole.
    ads.cache
        .set_snapshot(Snapshot::from_registry(&big_registry(5, &[2, 3, 4])).into());
    let [_, cla, members] = ads.on_change(&["big.vip"]);
    assert!(cla.is_some() && members.is_none());
    assert_eq!(ads.session.status().collections, 0);
    // Split again, before Envoy's unsubscribe of the old collection arrives: nothing goes
    // to it but what its subscribe asks for, every member.
    ads.cache
        .set_snapshot(Snapshot::from_registry(&big_registry(5, &[4])).into());
    let [_, cla, members] = ads.on_change(&["big.vip"]);
    assert!(cla.is_some() && members.is_none());
    let glob = ads.glob();
    let [answer, _] = ads.on_request(request(LB_ENDPOINT, &[&glob], &[]));
    assert_eq!(sent(&answer).len(), 4);
    assert!(removed(&answer).is_empty());
}

#[test]
fn a_proxy_that_rejects_a_load_assignment_or_names_unreadable_collections_gets_them_whole() {
    let whole = |r: &Option<DeltaDiscoveryResponse>| {
        let r = r.as_ref().expect("the whole assignment is sent again");
        assert_eq!(r.type_url, ENDPOINTS_TYPE_URL);
        let any = r.resources[0].resource.clone().unwrap();
        let cla = decode_assignment(&any);
        cla.endpoints
            .iter()
            .map(|l| l.lb_endpoints.len())
            .sum::<usize>()
    };
    for unreadable in [false, true] {
        let mut ads = big_stream(5);
        ads.on_request(request(CLUSTER_TYPE_URL, &["big.vip"], &[]));
        let [cla, _] = ads.on_request(request(ENDPOINTS_TYPE_URL, &["big.vip"], &[]));
        assert!(cla.is_none(), "pushed along with the cluster already");
        let answer = if unreadable {
            let glob = format!("{}?xds.node.id=proxy-1", ads.glob());
            ads.on_request(request(LB_ENDPOINT, &[&glob], &[]))
        } else {
            let mut nack = request(ENDPOINTS_TYPE_URL, &[], &[]);
            nack.response_nonce = "2".into();
            nack.error_detail = Some(Default::default());
            ads.on_request(nack)
        };
        assert_eq!(whole(&answer[0]), 5, "unreadable: {unreadable}");
        assert!(ads.session.status().whole_assignments);
        // And its changes go whole.
        ads.cache
            .set_snapshot(Snapshot::from_registry(&big_registry(5, &[0])).into());
        let [_, cla, members] = ads.on_change(&["big.vip"]);
        assert_eq!(whole(&cla), 4);
        assert!(members.is_none());
    }
}

#[test]
fn a_split_vip_sent_ahead_serves_its_collection_before_envoy_subscribes_its_assignment() {
    let options = XdsOptions {
        leds_min_endpoints: 4,
        ..XdsOptions::new(Some("/ca.pem".into()))
    };
    let cache = Cache::with_snapshot(
        options,
        Snapshot::from_registry(&big_registry(5, &[])).into(),
    );
    let prewarm = Prewarm::new(
        Limits::default(),
        None,
        History::default(),
        Default::default(),
    );
    prewarm.asked("billing", ["big.vip"]);
    let metrics = Metrics::default();
    let cx = context(&cache, &metrics, Some(&prewarm));
    let mut session = Session::new(3, Service::Ads, SubscriptionLimits::default());
    let [clusters, endpoints] = session.on_request(&cx, wildcard_request("billing"));
    assert_eq!(sent(&clusters), ["big.vip"]);
    let cla = endpoints.expect("the assignment goes with the cluster sent ahead");
    let assignment = decode_assignment(cla.resources[0].resource.as_ref().unwrap());
    let globs = crate::xds::leds::collections_in(&assignment);
    assert_eq!(globs.len(), 1);
    // Envoy subscribes the collection as soon as it has the assignment, maybe before it
    // subscribes the assignment by name.
    let [members, _] = session.on_request(&cx, request(LB_ENDPOINT, &[&globs[0]], &[]));
    assert_eq!(sent(&members).len(), 5);
    let [again, _] = session.on_request(&cx, request(ENDPOINTS_TYPE_URL, &["big.vip"], &[]));
    assert!(again.is_none());
    assert_eq!(session.status().collections, 1);
    session.close(&cx);
}

#[test]
fn a_proxy_back_while_the_registry_loads_keeps_its_collection_until_it_is_loaded() {
    let mut first = big_stream(5);
    let [_, cla] = first.on_request(request(CLUSTER_TYPE_URL, &["big.vip"], &[]));
    let kept = cla.unwrap().resources[0].version.clone();
    let old_glob = first.glob();

    // A restarted control plane, its registry still loading (the VIP not listed yet).
    let mut back = big_stream(5);
    back.cache
        .set_snapshot(Snapshot::from_registry(&big_registry(0, &[]).still_loading(true)).into());
    back.session = Session::new(8, Service::Ads, SubscriptionLimits::default());
    let mut req = request(CLUSTER_TYPE_URL, &["big.vip"], &[]);
    req.initial_resource_versions
        .insert("big.vip".into(), "c".into());
    back.on_request(req);
    let mut req = request(ENDPOINTS_TYPE_URL, &["big.vip"], &[]);
    req.initial_resource_versions.insert("big.vip".into(), kept);
    let [cla, _] = back.on_request(req);
    assert!(
        cla.is_none(),
        "what the proxy kept stays while the registry loads"
    );
    let [members, _] = back.on_request(request(LB_ENDPOINT, &[&old_glob], &[]));
    assert!(
        members.is_none(),
        "the old stream's collection is not answered"
    );
    // Loaded: the assignment goes again, in this stream's generation, and its collection
    // is answered.
    back.cache
        .set_snapshot(Snapshot::from_registry(&big_registry(5, &[])).into());
    let cx = context(&back.cache, &back.metrics, None);
    let all = Changes {
        all: true,
        names: Default::default(),
    };
    let [_, cla] = back.session.on_change(&cx, all);
    let cla = cla.expect("the kept assignment names another stream's collection");
    let assignment = decode_assignment(cla.resources[0].resource.as_ref().unwrap());
    let new_glob = back.glob();
    assert_eq!(
        crate::xds::leds::collections_in(&assignment),
        std::slice::from_ref(&new_glob)
    );
    let [members, _] = back.on_request(request(LB_ENDPOINT, &[&new_glob], &[&old_glob]));
    assert_eq!(sent(&members).len(), 5);
}

#[test]
fn a_split_vip_stays_split_down_to_three_quarters_of_the_threshold_and_a_whole_one_whole_below_it()
{
    let mut ads = big_stream(5);
    ads.subscribe_big();
    let set = |ads: &mut Ads, n: u8| {
        let without: Vec<u8> = (n..5).collect();
        (ads.cache).set_snapshot(Snapshot::from_registry(&big_registry(5, &without)).into());
        ads.on_change(&["big.vip"])
    };
    // 3 of a threshold of 4: still split, the change goes as members.
    let [_, cla, members] = set(&mut ads, 3);
    assert!(cla.is_none(), "the assignment stays split");
    assert_eq!(removed(&members).len(), 2);
    // 2: whole.
    let [_, cla, _] = set(&mut ads, 2);
    let cla = cla.expect("whole now");
    let whole = decode_assignment(cla.resources[0].resource.as_ref().unwrap());
    assert!(crate::xds::leds::collections_in(&whole).is_empty());
    // 3 again: whole still, below the threshold.
    let [_, cla, _] = set(&mut ads, 3);
    let cla = cla.expect("the whole assignment changed");
    let whole = decode_assignment(cla.resources[0].resource.as_ref().unwrap());
    assert!(crate::xds::leds::collections_in(&whole).is_empty());
    // 4: split again.
    let [_, cla, _] = set(&mut ads, 4);
    let split = decode_assignment(cla.unwrap().resources[0].resource.as_ref().unwrap());
    assert_eq!(crate::xds::leds::collections_in(&split).len(), 1);
}
