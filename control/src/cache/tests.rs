use super::*;
use crate::session::{Delta, Room, SubscriptionLimits, Subscriptions, diff, diff_pending};
use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use odmesh_registry::testing as testdata;
use odmesh_registry::{Instance, Registry, Status};
use prost::Message;

fn inst(vip: &str, ip: &str, status: Status) -> Instance {
    Instance {
        status,
        ..testdata::instance(vip, &format!("{vip}-{ip}"), ip)
    }
}

fn snapshot(instances: Vec<Instance>) -> Arc<Snapshot> {
    Arc::new(Snapshot::from_registry(&Registry::from_iter(instances)))
}

fn cache(instances: Vec<Instance>) -> Cache {
    Cache::with_snapshot(XdsOptions::new(Some("/ca.pem".into())), snapshot(instances))
}

fn names(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

fn parsed(list: &[&str]) -> Vec<ResourceName> {
    list.iter().copied().map(ResourceName::new).collect()
}

/// Subscribes like a stream does: update the state, then count the new names.
/// Subscribes `list`; returns the names of it known to be unregistered.
fn subscribe(cache: &Cache, subs: &mut Subscriptions, list: &[&str]) -> Vec<String> {
    subscribe_as(cache, "", subs, list)
}

/// Computes what to send and records it as sent.
fn send(cache: &Cache, ty: ResourceType, subs: &mut Subscriptions) -> Delta {
    send_as(cache, "", ty, subs)
}

/// [`subscribe`] by a proxy of `caller`: the names the cache knows to be unregistered.
fn subscribe_as(
    cache: &Cache,
    caller: &str,
    subs: &mut Subscriptions,
    list: &[&str],
) -> Vec<String> {
    let change = subs.update(&names(list), &[], &HashMap::new());
    let unregistered = (cache.unregistered(&change.added).into_iter())
        .map(ResourceName::to_string)
        .collect();
    cache.watch(stream_of(caller), caller, &change.added);
    unregistered
}

/// The stream the tests' proxies of `caller` use: one per calling service.
fn stream_of(caller: &str) -> StreamId {
    let callers = ["", "checkout", "cart", "web"];
    callers.iter().position(|c| *c == caller).unwrap() as StreamId
}

/// [`send`] to a proxy of `caller`.
fn send_as(cache: &Cache, caller: &str, ty: ResourceType, subs: &mut Subscriptions) -> Delta {
    let delta = delta(cache, caller, ty, subs);
    // Refused names sent registered count from now on, as a stream counts them.
    let counted = subs.record(&delta);
    cache.watch(stream_of(caller), caller, &counted);
    delta
}

/// [`diff`] of `subs` against the cache now, as a stream of a proxy of `caller` makes it.
fn delta(cache: &Cache, caller: &str, ty: ResourceType, subs: &Subscriptions) -> Delta {
    let loading = !cache.snapshot().is_complete();
    diff(subs, loading, cache.current(caller, ty))
}

/// [`diff_pending`] of `subs` against the cache now: what a request calls for.
fn delta_pending(cache: &Cache, caller: &str, ty: ResourceType, subs: &Subscriptions) -> Delta {
    let loading = !cache.snapshot().is_complete();
    diff_pending(subs, loading, cache.current(caller, ty))
}

fn sent_names(delta: &Delta) -> Vec<&str> {
    delta.send.iter().map(|r| r.name.as_str()).collect()
}

fn endpoint_count(r: &Versioned) -> usize {
    let cla = ClusterLoadAssignment::decode(r.resource.value.as_slice()).unwrap();
    cla.endpoints.iter().map(|g| g.lb_endpoints.len()).sum()
}

#[test]
fn a_presubscribed_name_is_not_resent_when_the_clients_own_subscribe_arrives() {
    let cache = cache(vec![inst("hello", "10.0.0.1", Status::Up)]);
    let mut subs = Subscriptions::default();
    let added = subs.presubscribe(&parsed(&["hello.vip"]));
    assert_eq!(added, ["hello.vip"]);
    cache.watch(0, "", &added);
    let pushed = send(&cache, ResourceType::Endpoints, &mut subs);
    assert_eq!(sent_names(&pushed), ["hello.vip"]);

    let change = subs.update(&names(&["hello.vip"]), &[], &HashMap::new());
    assert!(change.added.is_empty());
    assert!(send(&cache, ResourceType::Endpoints, &mut subs).is_empty());

    // A later subscribe (the client dropped it and asks again) is answered as usual.
    subs.update(&names(&["hello.vip"]), &[], &HashMap::new());
    assert_eq!(
        sent_names(&send(&cache, ResourceType::Endpoints, &mut subs)),
        ["hello.vip"]
    );
}

#[test]
fn a_presubscription_the_client_never_took_up_is_withdrawn_and_a_later_subscribe_answered() {
    let cache = cache(vec![inst("hello", "10.0.0.1", Status::Up)]);
    let mut eds = Subscriptions::default();
    subscribe(&cache, &mut eds, &["taken.vip"]);
    let added = eds.presubscribe(&parsed(&["hello.vip", "taken.vip"]));
    assert_eq!(added, ["hello.vip"]);
    send(&cache, ResourceType::Endpoints, &mut eds);

    // The client dropped hello.vip before it subscribed to its load assignment.
    let withdrawn = eds.withdraw_presubscribed(&parsed(&["hello.vip", "taken.vip"]));
    assert_eq!(
        withdrawn,
        ["hello.vip"],
        "taken.vip is the client's own subscription"
    );
    assert_eq!(eds.names().collect::<Vec<_>>(), ["taken.vip"]);

    // It asks for the cluster again and, holding it this time, subscribes: answered.
    subscribe(&cache, &mut eds, &["hello.vip"]);
    assert_eq!(
        sent_names(&send(&cache, ResourceType::Endpoints, &mut eds)),
        ["hello.vip"]
    );
}

#[test]
fn a_subscription_is_answered_with_the_resource_once() {
    let cache = cache(vec![inst("hello", "10.0.0.1", Status::Up)]);
    let mut subs = Subscriptions::default();
    subscribe(&cache, &mut subs, &["hello.vip"]);
    let first = send(&cache, ResourceType::Cluster, &mut subs);
    assert_eq!(sent_names(&first), ["hello.vip"]);
    let c = Cluster::decode(first.send[0].resource.value.as_slice()).unwrap();
    assert_eq!(c.name, "hello.vip");
    assert!(send(&cache, ResourceType::Cluster, &mut subs).is_empty());
}

#[test]
fn a_request_is_answered_with_what_it_asked_for_and_a_cache_change_with_what_changed() {
    let cache = cache(vec![
        inst("a", "10.0.0.1", Status::Up),
        inst("b", "10.0.0.2", Status::Up),
        inst("c", "10.0.0.3", Status::Up),
    ]);
    let mut subs = Subscriptions::default();
    subscribe(&cache, &mut subs, &["a.vip", "b.vip"]);
    let pending = delta_pending(&cache, "", ResourceType::Endpoints, &subs);
    assert_eq!(pending, delta(&cache, "", ResourceType::Endpoints, &subs));
    assert!(subs.record(&pending).is_empty());
    // `a` changes in the cache; before the stream hears of it, a request asks for `c`.
    cache.set_snapshot(snapshot(vec![
        inst("a", "10.0.0.9", Status::Up),
        inst("b", "10.0.0.2", Status::Up),
        inst("c", "10.0.0.3", Status::Up),
    ]));
    subscribe(&cache, &mut subs, &["c.vip"]);
    let answer = delta_pending(&cache, "", ResourceType::Endpoints, &subs);
    assert_eq!(sent_names(&answer), ["c.vip"]);
    assert!(subs.record(&answer).is_empty());
    assert!(delta_pending(&cache, "", ResourceType::Endpoints, &subs).is_empty());
    // The change is the cache's: the full diff that answers it has `a`, and only `a`.
    let change = send(&cache, ResourceType::Endpoints, &mut subs);
    assert_eq!(sent_names(&change), ["a.vip"]);
}

#[test]
fn every_name_a_request_touches_is_pending_until_the_answer_is_recorded() {
    let cache = cache(vec![inst("a", "10.0.0.1", Status::Up)]);
    let limits = SubscriptionLimits {
        max_names: 2,
        max_unregistered: 0,
    };
    let mut subs = Subscriptions::with_limits(limits);
    // `b` is not registered and over the bound: refused. `c` is over max_names: overflow.
    subscribe(&cache, &mut subs, &["a.vip", "b.vip", "c.vip"]);
    assert!(!subs.admit_unregistered("b.vip"));
    let answer = delta_pending(&cache, "", ResourceType::Cluster, &subs);
    assert_eq!(answer, delta(&cache, "", ResourceType::Cluster, &subs));
    assert_eq!(sent_names(&answer), ["a.vip"]);
    assert_eq!(answer.remove, ["b.vip", "c.vip"]);
    assert!(subs.record(&answer).is_empty());
    // Asked again, `a` is sent again (the client may have dropped it), and nothing else.
    subscribe(&cache, &mut subs, &["a.vip"]);
    let again = delta_pending(&cache, "", ResourceType::Cluster, &subs);
    assert_eq!(sent_names(&again), ["a.vip"]);
    assert!(again.remove.is_empty());
}

#[test]
fn subscribing_again_to_a_name_resends_it_even_at_the_same_version() {
    let cache = cache(vec![inst("hello", "10.0.0.1", Status::Up)]);
    let mut subs = Subscriptions::default();
    subscribe(&cache, &mut subs, &["hello.vip"]);
    send(&cache, ResourceType::Cluster, &mut subs);
    subscribe(&cache, &mut subs, &["hello.vip"]);
    assert_eq!(
        sent_names(&send(&cache, ResourceType::Cluster, &mut subs)),
        ["hello.vip"]
    );
    assert_eq!(cache.watched(), 1, "one stream still counts once");
}

#[test]
fn an_unsubscribed_name_gets_no_more_updates_and_no_removal() {
    let cache = cache(vec![inst("hello", "10.0.0.1", Status::Up)]);
    let mut subs = Subscriptions::default();
    subscribe(&cache, &mut subs, &["hello.vip"]);
    send(&cache, ResourceType::Endpoints, &mut subs);
    let change = subs.update(&[], &names(&["hello.vip"]), &HashMap::new());
    assert_eq!(change.removed, ["hello.vip"]);
    cache.unwatch(0, change.removed.iter().map(ResourceName::as_str));
    assert_eq!(
        cache.watched(),
        0,
        "nobody subscribes: resources are dropped"
    );
    cache.set_snapshot(snapshot(vec![
        inst("hello", "10.0.0.1", Status::Up),
        inst("hello", "10.0.0.2", Status::Up),
    ]));
    assert!(send(&cache, ResourceType::Endpoints, &mut subs).is_empty());
}

#[test]
fn a_reconnect_with_initial_versions_gets_only_what_differs() {
    let cache = cache(vec![
        inst("same", "10.0.0.1", Status::Up),
        inst("stale", "10.0.0.2", Status::Up),
    ]);
    let same = cache.resource(ResourceType::Cluster, "same.vip").unwrap();
    let initial = HashMap::from([
        ("same.vip".to_string(), same.version.to_string()),
        ("stale.vip".to_string(), "an-old-version".to_string()),
    ]);
    let mut subs = Subscriptions::default();
    let change = subs.update(&names(&["same.vip", "stale.vip", "new.vip"]), &[], &initial);
    cache.watch(0, "", &change.added);
    let delta = send(&cache, ResourceType::Cluster, &mut subs);
    assert_eq!(sent_names(&delta), ["new.vip", "stale.vip"]);
    assert!(delta.remove.is_empty());
}

#[test]
fn an_unknown_vip_is_answered_with_an_unregistered_cluster_not_a_removal() {
    let cache = cache(vec![]);
    let mut subs = Subscriptions::default();
    subscribe(&cache, &mut subs, &["nobody.vip"]);
    let clusters = send(&cache, ResourceType::Cluster, &mut subs);
    assert_eq!(sent_names(&clusters), ["nobody.vip"]);
    assert!(clusters.remove.is_empty());
    let mut eds = Subscriptions::default();
    subscribe(&cache, &mut eds, &["nobody.vip"]);
    let endpoints = send(&cache, ResourceType::Endpoints, &mut eds);
    assert_eq!(endpoint_count(&endpoints.send[0]), 0);
}

#[test]
fn a_name_that_is_not_an_odmesh_cluster_is_removed_once() {
    let cache = cache(vec![]);
    let mut subs = Subscriptions::default();
    subscribe(&cache, &mut subs, &["xds_cluster", "Not A Vip.vip"]);
    let delta = send(&cache, ResourceType::Cluster, &mut subs);
    assert!(delta.send.is_empty());
    assert_eq!(delta.remove, ["Not A Vip.vip", "xds_cluster"]);
    cache.set_snapshot(snapshot(vec![inst("other", "10.0.0.1", Status::Up)]));
    assert!(send(&cache, ResourceType::Cluster, &mut subs).is_empty());
}

#[test]
fn the_wildcard_is_reported_and_not_served() {
    let cache = cache(vec![inst("hello", "10.0.0.1", Status::Up)]);
    let mut subs = Subscriptions::default();
    let change = subs.update(&names(&["*"]), &[], &HashMap::new());
    assert!(change.wildcard);
    assert!(change.added.is_empty());
    assert!(send(&cache, ResourceType::Cluster, &mut subs).is_empty());
}

#[test]
fn a_change_to_one_cluster_among_many_sends_only_that_one_to_its_subscribers_only() {
    let many: Vec<Instance> = (0..50)
        .map(|i| inst(&format!("svc{i}"), "10.0.0.1", Status::Up))
        .collect();
    let cache = cache(many.clone());
    let mut a = Subscriptions::default();
    let mut b = Subscriptions::default();
    subscribe(&cache, &mut a, &["svc1.vip", "svc2.vip", "svc3.vip"]);
    subscribe(&cache, &mut b, &["svc4.vip", "svc5.vip"]);
    send(&cache, ResourceType::Endpoints, &mut a);
    send(&cache, ResourceType::Endpoints, &mut b);

    let mut changed = many;
    changed.push(inst("svc2", "10.0.0.2", Status::Up));
    changed.push(inst("svc40", "10.0.0.2", Status::Up));
    let rebuilt = cache.set_snapshot(snapshot(changed));
    assert_eq!(rebuilt, ["svc2.vip"], "unsubscribed svc40 is not built");

    let to_a = send(&cache, ResourceType::Endpoints, &mut a);
    assert_eq!(sent_names(&to_a), ["svc2.vip"]);
    assert_eq!(endpoint_count(&to_a.send[0]), 2);
    assert!(send(&cache, ResourceType::Endpoints, &mut b).is_empty());
    assert!(
        send(&cache, ResourceType::Cluster, &mut a).send.len() == 3,
        "clusters were never sent on this state, so all go now"
    );
}

fn policy(yaml: &str) -> Arc<Policy> {
    Arc::new(Policy::parse(yaml.as_bytes()).unwrap())
}

#[test]
fn a_policy_change_is_sent_to_the_subscribers_of_the_clusters_it_changes_only() {
    let cache = cache(vec![
        inst("a", "10.0.0.1", Status::Up),
        inst("b", "10.0.0.2", Status::Up),
    ]);
    let (mut on_a, mut on_b) = (Subscriptions::default(), Subscriptions::default());
    subscribe(&cache, &mut on_a, &["a.vip"]);
    subscribe(&cache, &mut on_b, &["b.vip"]);
    send(&cache, ResourceType::Cluster, &mut on_a);
    send(&cache, ResourceType::Cluster, &mut on_b);

    let changed = cache.set_policy(policy("vips: {a: {circuit_breakers: {max_requests: 5}}}"));
    assert_eq!(changed, ["a.vip"]);
    assert_eq!(
        sent_names(&send(&cache, ResourceType::Cluster, &mut on_a)),
        ["a.vip"]
    );
    assert!(send(&cache, ResourceType::Cluster, &mut on_b).is_empty());
    // The same policy again changes nothing.
    assert!(
        cache
            .set_policy(policy("vips: {a: {circuit_breakers: {max_requests: 5}}}"))
            .is_empty()
    );
    assert!(send(&cache, ResourceType::Cluster, &mut on_a).is_empty());
}

#[test]
fn a_caller_with_an_override_gets_its_own_cluster_and_the_others_share_one() {
    let cache = cache(vec![inst("pay", "10.0.0.1", Status::Up)]);
    cache.set_policy(policy(
        "vips: {pay: {retries: {count: 1}, callers: {checkout: {retries: {count: 4}}}}}",
    ));
    let (mut checkout, mut cart, mut web) = Default::default();
    subscribe_as(&cache, "checkout", &mut checkout, &["pay.vip"]);
    subscribe_as(&cache, "cart", &mut cart, &["pay.vip"]);
    subscribe_as(&cache, "web", &mut web, &["pay.vip"]);
    let version = |caller: &str, subs: &mut Subscriptions| {
        send_as(&cache, caller, ResourceType::Cluster, subs).send[0]
            .version
            .clone()
    };
    let (v_checkout, v_cart, v_web) = (
        version("checkout", &mut checkout),
        version("cart", &mut cart),
        version("web", &mut web),
    );
    assert_ne!(v_checkout, v_cart);
    assert_eq!(
        v_cart, v_web,
        "callers without an override share one cluster"
    );
    let retries = |caller| cache.effective_policy("pay.vip", caller).unwrap().retries;
    assert_eq!(retries("checkout").value, 4);
    assert_eq!(retries("cart").value, 1);

    // The override goes away: checkout's proxies get the shared cluster, the others
    // nothing new.
    cache.set_policy(policy("vips: {pay: {retries: {count: 1}}}"));
    let to_checkout = send_as(&cache, "checkout", ResourceType::Cluster, &mut checkout);
    assert_eq!(to_checkout.send[0].version, v_cart);
    assert!(send_as(&cache, "cart", ResourceType::Cluster, &mut cart).is_empty());

    // Unsubscribing every caller forgets the name.
    for (caller, subs) in [("checkout", &checkout), ("cart", &cart), ("web", &web)] {
        cache.unwatch(stream_of(caller), subs.names().collect::<Vec<_>>());
    }
    assert_eq!(cache.watched(), 0);
}

#[test]
fn an_override_added_for_a_subscribed_caller_moves_it_to_its_own_cluster_alone() {
    let cache = cache(vec![inst("pay", "10.0.0.1", Status::Up)]);
    let (mut checkout, mut cart) = (Subscriptions::default(), Subscriptions::default());
    subscribe_as(&cache, "checkout", &mut checkout, &["pay.vip"]);
    subscribe_as(&cache, "cart", &mut cart, &["pay.vip"]);
    send_as(&cache, "checkout", ResourceType::Cluster, &mut checkout);
    send_as(&cache, "cart", ResourceType::Cluster, &mut cart);

    let changed = cache.set_policy(policy(
        "vips: {pay: {callers: {checkout: {connect_timeout: 2s}}}}",
    ));
    assert_eq!(changed, ["pay.vip"]);
    let to_checkout = send_as(&cache, "checkout", ResourceType::Cluster, &mut checkout);
    assert_eq!(sent_names(&to_checkout), ["pay.vip"]);
    assert!(send_as(&cache, "cart", ResourceType::Cluster, &mut cart).is_empty());

    // The last subscriber of each variant takes it along; the name stays for the other.
    cache.unwatch(stream_of("cart"), ["pay.vip"]);
    assert_eq!(cache.watched(), 1);
    let connect = cache
        .effective_policy("pay.vip", "checkout")
        .unwrap()
        .connect_timeout;
    assert_eq!(connect.value, std::time::Duration::from_secs(2));
    cache.unwatch(stream_of("checkout"), ["pay.vip"]);
    assert_eq!(cache.watched(), 0);
}

#[test]
fn a_vip_that_appears_later_changes_its_cluster_and_its_endpoints() {
    let cache = cache(vec![]);
    let mut cds = Subscriptions::default();
    let mut eds = Subscriptions::default();
    subscribe(&cache, &mut cds, &["late.vip"]);
    subscribe(&cache, &mut eds, &["late.vip"]);
    send(&cache, ResourceType::Cluster, &mut cds);
    send(&cache, ResourceType::Endpoints, &mut eds);

    let generation = cache.generation();
    cache.set_snapshot(snapshot(vec![inst("late", "10.0.0.1", Status::Up)]));
    assert_eq!(cache.generation(), generation + 1);
    assert_eq!(
        sent_names(&send(&cache, ResourceType::Cluster, &mut cds)),
        ["late.vip"]
    );
    let endpoints = send(&cache, ResourceType::Endpoints, &mut eds);
    assert_eq!(endpoint_count(&endpoints.send[0]), 1);
}

#[test]
fn a_vip_whose_instances_all_go_away_keeps_its_cluster_with_no_endpoints() {
    let cache = cache(vec![inst("hello", "10.0.0.1", Status::Up)]);
    let mut eds = Subscriptions::default();
    subscribe(&cache, &mut eds, &["hello.vip"]);
    send(&cache, ResourceType::Endpoints, &mut eds);
    cache.set_snapshot(snapshot(vec![inst("hello", "10.0.0.1", Status::Down)]));
    let delta = send(&cache, ResourceType::Endpoints, &mut eds);
    assert!(delta.remove.is_empty());
    assert_eq!(endpoint_count(&delta.send[0]), 0);
}

#[test]
fn an_unchanged_snapshot_sends_nothing() {
    let cache = cache(vec![inst("hello", "10.0.0.1", Status::Up)]);
    let mut subs = Subscriptions::default();
    subscribe(&cache, &mut subs, &["hello.vip"]);
    send(&cache, ResourceType::Cluster, &mut subs);
    let rebuilt = cache.set_snapshot(snapshot(vec![inst("hello", "10.0.0.1", Status::Up)]));
    assert!(rebuilt.is_empty());
    assert!(send(&cache, ResourceType::Cluster, &mut subs).is_empty());
}

#[test]
fn resources_stay_built_while_any_stream_subscribes() {
    let cache = cache(vec![]);
    cache.watch(1, "", &parsed(&["x.vip"]));
    cache.watch(2, "", &parsed(&["x.vip"]));
    cache.unwatch(1, ["x.vip"]);
    assert_eq!(cache.watched(), 1);
    cache.unwatch(2, ["x.vip"]);
    assert_eq!(cache.watched(), 0);
}

#[test]
fn a_watch_whose_build_raced_a_registry_change_keeps_what_the_registry_says_now() {
    // A watch counts hello.vip, then builds it outside the lock from the registry of that
    // moment, which is still loading: "not known yet"...
    let cache = Cache::with_snapshot(XdsOptions::new(None), loading(vec![]));
    let subscribed = parsed(&["hello.vip", "other.vip"]);
    let unbuilt = cache.lock().count(1, "billing", &subscribed);
    let (generation, caller, built) = unbuilt.build(&cache.options);
    // ...while the registry finishes loading, with hello registered.
    cache.set_snapshot(snapshot(vec![inst("hello", "10.0.0.1", Status::Up)]));
    cache
        .lock()
        .keep(generation, &caller, built, &cache.options);

    let cluster = cache.resource(ResourceType::Cluster, "hello.vip").unwrap();
    assert!(cluster.registered, "{}", reason(&cluster));
    let endpoints = cache
        .resource(ResourceType::Endpoints, "hello.vip")
        .unwrap();
    assert_eq!(endpoint_count(&endpoints), 1);
    let other = cache.resource(ResourceType::Cluster, "other.vip").unwrap();
    assert!(
        reason(&other).contains("not registered"),
        "{}",
        reason(&other)
    );
    let other = [ResourceName::new("other.vip")];
    assert_eq!(cache.unregistered(&other), [&other[0]]);
    assert_eq!(cache.watched(), 2);
}

#[test]
fn a_watch_of_many_names_counts_and_builds_every_one() {
    // More names than one hold of the lock takes: each slice is counted and built.
    let cache = cache(vec![inst("hello", "10.0.0.1", Status::Up)]);
    let mut many: Vec<ResourceName> = (0..SLICE * 2 + 7)
        .map(|i| ResourceName::new(format!("nobody-{i}.vip")))
        .collect();
    many.push(ResourceName::new("hello.vip"));
    let unregistered = cache.unregistered(&many);
    assert_eq!(unregistered.len(), many.len() - 1);
    assert!(!unregistered.iter().any(|name| *name == "hello.vip"));
    cache.watch(1, "billing", &many);
    assert_eq!(cache.watched(), many.len());
    cache.unwatch(1, many.iter().map(ResourceName::as_str));
    assert_eq!(cache.watched(), 0);
    cache.watch(2, "billing", &many);
    cache.close_stream(2);
    assert_eq!(cache.watched(), 0, "closing forgets every slice");
}

fn loading(instances: Vec<Instance>) -> Arc<Snapshot> {
    let registry = Registry::from_iter(instances).still_loading(true);
    Arc::new(Snapshot::from_registry(&registry))
}

fn reason(r: &Versioned) -> String {
    let c = Cluster::decode(r.resource.value.as_slice()).unwrap();
    let meta = &c.metadata.unwrap().filter_metadata[xds::METADATA_NAMESPACE];
    match &meta.fields["reason"].kind {
        Some(envoy_types::pb::google::protobuf::value::Kind::StringValue(s)) => s.clone(),
        other => panic!("reason is not a string: {other:?}"),
    }
}

/// Subscribes on a new stream, as a reconnecting client that kept `kept` (name, version).
fn reconnect(cache: &Cache, subs: &mut Subscriptions, kept: &[(&str, &str)]) {
    let initial: HashMap<String, String> = kept
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect();
    let names: Vec<String> = initial.keys().cloned().collect();
    let change = subs.update(&names, &[], &initial);
    cache.watch(0, "", &change.added);
}

#[test]
fn what_a_reconnecting_client_kept_stays_as_it_is_while_the_registry_is_loading() {
    // Before the restart: hello has an endpoint, and the client holds that version.
    let before = cache(vec![inst("hello", "10.0.0.1", Status::Up)]);
    let held = before.resource(ResourceType::Cluster, "hello.vip").unwrap();
    let held_eds = before
        .resource(ResourceType::Endpoints, "hello.vip")
        .unwrap();

    // A restarted control plane whose registry is still loading, and empty so far.
    let cache = Cache::with_snapshot(XdsOptions::new(Some("/ca.pem".into())), loading(vec![]));
    let (mut cds, mut eds) = (Subscriptions::default(), Subscriptions::default());
    reconnect(&cache, &mut cds, &[("hello.vip", &held.version)]);
    reconnect(&cache, &mut eds, &[("hello.vip", &held_eds.version)]);
    assert!(send(&cache, ResourceType::Cluster, &mut cds).is_empty());
    assert!(send(&cache, ResourceType::Endpoints, &mut eds).is_empty());

    // Still loading, the VIP comes back with another endpoint: still left alone.
    cache.set_snapshot(loading(vec![inst("hello", "10.0.0.2", Status::Up)]));
    assert!(send(&cache, ResourceType::Endpoints, &mut eds).is_empty());

    // Loaded: the kept names are compared like any other, and what differs is sent.
    cache.set_snapshot(snapshot(vec![inst("hello", "10.0.0.2", Status::Up)]));
    assert!(
        send(&cache, ResourceType::Cluster, &mut cds).is_empty(),
        "the same cluster: nothing to send"
    );
    let update = send(&cache, ResourceType::Endpoints, &mut eds);
    assert_eq!(sent_names(&update), ["hello.vip"]);
    assert_eq!(endpoint_count(&update.send[0]), 1);
}

#[test]
fn a_kept_name_the_complete_registry_does_not_list_becomes_unregistered_once_loaded() {
    let before = cache(vec![inst("gone", "10.0.0.1", Status::Up)]);
    let held = before.resource(ResourceType::Cluster, "gone.vip").unwrap();
    let cache = Cache::with_snapshot(XdsOptions::new(Some("/ca.pem".into())), loading(vec![]));
    let mut cds = Subscriptions::default();
    reconnect(&cache, &mut cds, &[("gone.vip", &held.version)]);
    assert!(send(&cache, ResourceType::Cluster, &mut cds).is_empty());
    cache.set_snapshot(snapshot(vec![]));
    let update = send(&cache, ResourceType::Cluster, &mut cds);
    assert_eq!(sent_names(&update), ["gone.vip"]);
    assert_eq!(reason(&update.send[0]), "VIP gone is not registered");
}

#[test]
fn a_new_name_while_loading_is_not_known_yet_and_not_registered_once_loaded() {
    let cache = Cache::with_snapshot(XdsOptions::new(Some("/ca.pem".into())), loading(vec![]));
    let mut cds = Subscriptions::default();
    subscribe(&cache, &mut cds, &["new.vip"]);
    let first = send(&cache, ResourceType::Cluster, &mut cds);
    assert_eq!(
        reason(&first.send[0]),
        "VIP new is not known yet: the control plane is still loading its registry"
    );
    assert!(!first.send[0].registered);
    let rebuilt = cache.set_snapshot(snapshot(vec![]));
    assert_eq!(rebuilt, ["new.vip"]);
    let second = send(&cache, ResourceType::Cluster, &mut cds);
    assert_eq!(reason(&second.send[0]), "VIP new is not registered");
}

fn limited(max_names: usize, max_unregistered: usize) -> Subscriptions {
    Subscriptions::with_limits(SubscriptionLimits {
        max_names,
        max_unregistered,
    })
}

#[test]
fn names_over_the_stream_bound_are_answered_with_a_removal_once_and_not_kept() {
    let cache = cache(vec![inst("a", "10.0.0.1", Status::Up)]);
    let mut cds = limited(2, 10);
    let change = cds.update(
        &names(&["a.vip", "b.vip", "c.vip", "d.vip"]),
        &[],
        &HashMap::new(),
    );
    assert_eq!(change.added, ["a.vip", "b.vip"]);
    assert_eq!(change.over_limit, 2);
    cache.watch(0, "", &change.added);
    let delta = send(&cache, ResourceType::Cluster, &mut cds);
    assert_eq!(sent_names(&delta), ["a.vip", "b.vip"]);
    assert_eq!(delta.remove, ["c.vip", "d.vip"]);
    assert_eq!(cds.len(), 2, "the names over the bound are not kept");
    assert!(
        send(&cache, ResourceType::Cluster, &mut cds).is_empty(),
        "removed once"
    );
    // Room again after an unsubscribe.
    cds.update(&[], &names(&["b.vip"]), &HashMap::new());
    let change = cds.update(&names(&["c.vip"]), &[], &HashMap::new());
    assert_eq!(change.added, ["c.vip"]);
}

#[test]
fn names_beyond_the_room_left_by_other_streams_are_counted_apart_and_not_answered() {
    let mut cds = limited(100, 10);
    let change = cds.update_within(
        &names(&["a.vip", "b.vip", "c.vip"]),
        &[],
        &HashMap::new(),
        1,
    );
    assert_eq!(change.added, ["a.vip"]);
    assert_eq!((change.over_room, change.over_limit), (2, 0));
    assert_eq!((cds.len(), cds.counted_len(), cds.waiting()), (3, 1, 2));
    // Answered with a removal while they wait, then sent once admitted.
    let cache = cache(vec![inst("b", "10.0.0.2", Status::Up)]);
    cache.watch(0, "", &change.added);
    let first = send(&cache, ResourceType::Cluster, &mut cds);
    assert_eq!(sent_names(&first), ["a.vip"]);
    assert_eq!(first.remove, ["b.vip", "c.vip"]);
    assert!(send(&cache, ResourceType::Cluster, &mut cds).is_empty());
    let admitted = cds.admit_waiting(1);
    assert_eq!(admitted, ["b.vip"]);
    cache.watch(0, "", &admitted);
    assert_eq!(
        sent_names(&send(&cache, ResourceType::Cluster, &mut cds)),
        ["b.vip"]
    );
    // Unsubscribing one still waiting gives nothing back: it was never counted.
    let gone = cds.update(&[], &names(&["c.vip"]), &HashMap::new());
    assert!(gone.removed.is_empty());
    assert!(!cds.is_waiting());
    let again = cds.update_within(&names(&["a.vip"]), &[], &HashMap::new(), 0);
    assert_eq!(
        again.over_room, 0,
        "a name already subscribed needs no room"
    );
    let kept = HashMap::from([("k.vip".to_string(), "v1".to_string())]);
    let reconnect = limited(100, 10).update_within(&names(&["k.vip"]), &[], &kept, 0);
    assert_eq!(
        reconnect.added,
        ["k.vip"],
        "a kept name needs no room either"
    );
}

#[test]
fn unregistered_names_over_their_bound_are_refused_until_they_are_registered() {
    let cache = cache(vec![inst("real", "10.0.0.1", Status::Up)]);
    let mut cds = limited(100, 2);
    let unregistered = subscribe(
        &cache,
        &mut cds,
        &["real.vip", "x1.vip", "x2.vip", "x3.vip"],
    );
    let admitted: Vec<bool> = unregistered
        .iter()
        .map(|n| cds.admit_unregistered(n))
        .collect();
    assert_eq!(
        admitted,
        [true, true, false],
        "real.vip is registered: not counted"
    );
    assert!(cds.is_refused("x3.vip"));
    let delta = send(&cache, ResourceType::Cluster, &mut cds);
    assert_eq!(sent_names(&delta), ["real.vip", "x1.vip", "x2.vip"]);
    assert_eq!(delta.remove, ["x3.vip"]);
    assert!(send(&cache, ResourceType::Cluster, &mut cds).is_empty());

    // x3 registers: it is sent like any cluster and is an ordinary subscription from
    // then on, even once it is gone again (a cluster with no endpoints, not a removal).
    cache.set_snapshot(snapshot(vec![
        inst("real", "10.0.0.1", Status::Up),
        inst("x3", "10.0.0.3", Status::Up),
    ]));
    assert_eq!(
        sent_names(&send(&cache, ResourceType::Cluster, &mut cds)),
        ["x3.vip"]
    );
    assert!(!cds.is_refused("x3.vip"));
    cache.set_snapshot(snapshot(vec![inst("real", "10.0.0.1", Status::Up)]));
    let gone = send(&cache, ResourceType::Cluster, &mut cds);
    assert_eq!(sent_names(&gone), ["x3.vip"]);
    assert!(gone.remove.is_empty());
}

#[test]
fn unsubscribing_an_unregistered_name_makes_room_for_another() {
    let mut cds = limited(100, 1);
    cds.update(&names(&["x1.vip", "x2.vip"]), &[], &HashMap::new());
    assert!(cds.admit_unregistered("x1.vip"));
    assert!(!cds.admit_unregistered("x2.vip"));
    cds.update(&[], &names(&["x1.vip", "x2.vip"]), &HashMap::new());
    cds.update(&names(&["x3.vip"]), &[], &HashMap::new());
    assert!(cds.admit_unregistered("x3.vip"));
    assert!(!cds.is_refused("x2.vip"));
}

#[test]
fn names_the_client_kept_count_under_the_unregistered_bound_like_any_other() {
    // A kept list cannot bring in more unregistered names than a stream is served: a real
    // proxy never held more, and an unregistered cluster carries no request that would work.
    let mut cds = limited(100, 1);
    let initial = HashMap::from([
        ("x.vip".to_string(), "v1".to_string()),
        ("y.vip".to_string(), "v1".to_string()),
    ]);
    cds.update(&names(&["x.vip", "y.vip"]), &[], &initial);
    assert!(cds.admit_unregistered("x.vip"));
    assert!(!cds.admit_unregistered("y.vip"));
    assert!(cds.is_refused("y.vip"));
}

#[test]
fn kept_names_need_no_room_from_other_sources_but_take_their_own_sources_share() {
    let kept = HashMap::from([
        ("a.vip".to_string(), "v1".to_string()),
        ("b.vip".to_string(), "v1".to_string()),
    ]);
    let ask = names(&["a.vip", "b.vip", "c.vip"]);
    // No room over all streams: the kept names are taken, within the share; the new one waits.
    let room = Room {
        any: 0,
        share: 5,
        names: usize::MAX,
    };
    let change = limited(100, 10).update_within_share(&ask, &[], &kept, room);
    assert_eq!((change.added.len(), change.over_room), (2, 1));
    // A share of one: one kept name, and nothing more.
    let room = Room {
        any: 10,
        share: 1,
        names: usize::MAX,
    };
    let change = limited(100, 10).update_within_share(&ask, &[], &kept, room);
    assert_eq!((change.added, change.over_room), (vec!["a.vip".into()], 2));
}

#[tokio::test]
async fn follow_applies_each_snapshot_and_wakes_subscribers() {
    let cache = Arc::new(cache(vec![]));
    let inbox = cache.open_stream(1);
    cache.watch(1, "", &parsed(&["hello.vip"]));
    let (tx, rx) = watch::channel(snapshot(vec![]));
    let follower = tokio::spawn({
        let cache = cache.clone();
        async move { cache.follow(rx).await }
    });
    tx.send_replace(snapshot(vec![inst("hello", "10.0.0.1", Status::Up)]));
    let wait = std::time::Duration::from_secs(5);
    tokio::time::timeout(wait, async {
        while !inbox.take().names.contains("hello.vip") {
            inbox.notified().await;
        }
    })
    .await
    .unwrap();
    assert!(cache.snapshot().get("hello.vip").is_some());
    drop(tx);
    tokio::time::timeout(wait, follower).await.unwrap().unwrap();
}

/// Three streams: 1 and 2 watch `a.vip`, 3 watches `b.vip`.
fn three_streams(cache: &Cache) -> [Arc<Inbox>; 3] {
    let inboxes = [1, 2, 3].map(|id| cache.open_stream(id));
    cache.watch(1, "", &parsed(&["a.vip"]));
    cache.watch(2, "", &parsed(&["a.vip"]));
    cache.watch(3, "", &parsed(&["b.vip"]));
    inboxes
}

fn changed_names(inbox: &Inbox) -> Vec<String> {
    inbox.take().names.into_iter().collect()
}

#[tokio::test]
async fn a_change_to_a_cluster_wakes_only_the_streams_subscribed_to_it() {
    let cache = cache(vec![inst("a", "10.0.0.1", Status::Up)]);
    let [one, two, three] = three_streams(&cache);
    cache.set_snapshot(snapshot(vec![inst("a", "10.0.0.2", Status::Up)]));

    let wait = std::time::Duration::from_secs(5);
    for inbox in [&one, &two] {
        tokio::time::timeout(wait, inbox.notified()).await.unwrap();
        assert_eq!(
            changed_names(inbox),
            ["a.vip"],
            "both streams on a.vip get it"
        );
    }
    assert!(!three.has_changes(), "b.vip did not change");
    // A zero timeout polls once: a wake would have left a permit behind.
    let not_woken = tokio::time::timeout(std::time::Duration::ZERO, three.notified());
    assert!(not_woken.await.is_err(), "the stream on b.vip is not woken");
}

#[test]
fn a_stream_that_unsubscribes_is_no_longer_woken() {
    let cache = cache(vec![inst("a", "10.0.0.1", Status::Up)]);
    let [one, two, _] = three_streams(&cache);
    cache.unwatch(2, ["a.vip"]);
    cache.set_snapshot(snapshot(vec![inst("a", "10.0.0.2", Status::Up)]));
    assert_eq!(changed_names(&one), ["a.vip"]);
    assert!(!two.has_changes());
}

#[test]
fn a_closed_stream_leaves_no_counts_behind_and_is_not_woken() {
    let cache = cache(vec![inst("a", "10.0.0.1", Status::Up)]);
    let [one, two, three] = three_streams(&cache);
    cache.watch(2, "", &parsed(&["b.vip", "a.vip"]));
    cache.close_stream(2);
    assert_eq!(
        cache.watched(),
        2,
        "a.vip and b.vip, still watched by 1 and 3"
    );
    cache.close_stream(1);
    assert_eq!(cache.watched(), 1, "only b.vip");
    cache.set_snapshot(snapshot(vec![
        inst("a", "10.0.0.2", Status::Up),
        inst("b", "10.0.0.3", Status::Up),
    ]));
    assert!(!one.has_changes() && !two.has_changes());
    assert_eq!(changed_names(&three), ["b.vip"]);
    cache.close_stream(3);
    assert_eq!(cache.watched(), 0);
}

#[test]
fn a_registry_that_finishes_loading_asks_every_stream_for_a_full_diff() {
    let cache = Cache::with_snapshot(XdsOptions::new(Some("/ca.pem".into())), loading(vec![]));
    let [one, _, three] = three_streams(&cache);
    let idle = cache.open_stream(4);
    cache.set_snapshot(snapshot(vec![]));
    for inbox in [&one, &three, &idle] {
        assert!(inbox.take().all);
    }
}

#[test]
fn a_policy_change_wakes_only_the_streams_of_the_names_it_changes() {
    let cache = cache(vec![inst("a", "10.0.0.1", Status::Up)]);
    let [one, two, three] = three_streams(&cache);
    cache.set_policy(policy("vips: {a: {retries: {count: 1}}}"));
    assert_eq!(changed_names(&one), ["a.vip"]);
    assert_eq!(changed_names(&two), ["a.vip"]);
    assert!(!three.has_changes());
}

#[test]
fn changes_carry_when_the_cache_took_them_and_when_the_registry_published_them() {
    let cache = cache(vec![inst("a", "10.0.0.1", Status::Up)]);
    let [one, _, three] = three_streams(&cache);
    let unapplied = Arc::new(crate::model::Oldest::default());
    let mut builder = crate::model::SnapshotBuilder::with_published(unapplied.clone());
    let registry = |ip| Arc::new(Registry::from_iter([inst("a", ip, Status::Up)]));
    // Two snapshots sent, the first never applied (a `watch` keeps the latest): the second
    // counts from the first's publication.
    let published = std::time::Instant::now();
    unapplied.note(published);
    builder.update(registry("10.0.0.2"));
    unapplied.note(std::time::Instant::now());
    let taken = std::time::Instant::now();
    cache.set_snapshot(builder.update(registry("10.0.0.3")).snapshot);
    let (changes, stamps) = one.take_stamped();
    assert_eq!(changes.names.into_iter().collect::<Vec<_>>(), ["a.vip"]);
    assert_eq!(stamps.registry, Some(published));
    assert!(stamps.queued.is_some_and(|queued| queued >= taken));
    assert_eq!(
        one.take_stamped().1,
        Stamps::default(),
        "taken: nothing is left"
    );
    assert_eq!(unapplied.take(), None, "applied: nothing is left");
    assert!(!three.has_changes());
    // A policy change is no registry change.
    cache.set_policy(policy("vips: {a: {retries: {count: 1}}}"));
    let stamps = one.take_stamped().1;
    assert!(
        stamps.queued.is_some() && stamps.registry.is_none(),
        "{stamps:?}"
    );
}
