//! Property test of the cache and of [`Session`] (one xDS stream's protocol) against
//! simulated Envoys.
//!
//! **The property.** Several simulated proxies ([`Proxy`]), each on an ADS stream ([`Stream`]:
//! a real [`Session`] and the messages in flight both ways) to a control plane
//! ([`ControlPlane`]: a cache, its metrics, the bound over all streams), go through any sequence
//! of subscribes, unsubscribes, registry changes, policy changes, reconnects, control-plane
//! restarts and partial deliveries. The proxies belong to two calling services, and some
//! policies give one of them an override. Whenever everything in flight has been delivered:
//! 1. every proxy holds, for every name it subscribes (cluster names by on-demand CDS; the load
//!    assignment of every cluster it holds), exactly what `xds::build_for` makes of that name
//!    from the registry and the policy now, for its calling service: the same version and the
//!    same message; nothing for a name that is not
//!    an odmesh cluster name; and nothing at all for a name it does not subscribe;
//! 2. except that, while the registry is still loading, what a proxy kept from an earlier
//!    stream (sent in `initial_resource_versions`) is left exactly as it held it (the restart
//!    guard); once the registry is complete, 1. holds for those names too;
//! 3. and except names over a stream's bounds, which come first:
//!    - a name over `max_names` when its stream got it is answered with a removal and not
//!      tracked; for Envoy that is final on that stream (it stays subscribed and does not ask
//!      again), so the proxy holds nothing for it, kept or not, until it asks for it again
//!      under the bound (on a new stream; the simulated on-demand CDS may also ask again);
//!    - a cluster name asked for while the complete registry does not list it, beyond the
//!      `max_unregistered` such names its stream holds, is refused: the proxy holds nothing for
//!      it until it is registered, and then holds it like any other. A kept unregistered name
//!      counts the same (a kept list brings in no more); a name the registry does not list *yet* (still
//!      loading) is not counted, neither then nor once the registry is complete;
//! 4. the bound over all streams (`max_subscriptions`, on cluster names): a request's new
//!    cluster names beyond the room left wait for room (names the proxy kept and names over
//!    `max_names` take none). Each is answered with a removal right away, which the proxy
//!    applies (it holds nothing for the name) while it stays subscribed; it is not counted
//!    nor watched; and it is pushed once there is room (as names are unsubscribed or streams
//!    close): the server tries when a change to one of the stream's names wakes it and,
//!    while names wait, once a second, which delivery here stands in for by waking every
//!    session whose names wait, until all is quiet. So the
//!    exception to 1.–3.: a name still waiting at a check is one the bound has no room for
//!    (the open streams count at least `max_subscriptions` cluster names), and its proxy
//!    holds nothing for it; once admitted, 1.–3. hold for it like for any other;
//! 5. on ADS, the load assignment of a cluster answered at the proxy's subscribe, or pushed
//!    once it had waited for room, comes right behind the cluster, before the proxy asks for
//!    it: one round trip, not two (not for names the proxy kept, names answered with a
//!    removal, nor beyond `max_names`);
//! 6. no stream subscribes, on the server side, a name its proxy does not; the gauges
//!    `xds_cluster_subscriptions` and `xds_subscriptions` are the sums over the open streams
//!    of the names that do not wait; the bound on names tracked counts every name of the open
//!    streams, however it stands; and the cache has resources built for exactly the names
//!    some open stream subscribes and does not wait for;
//! 7. a change wakes only the streams subscribed to a changed name, and each gets only those
//!    names, not a full diff (the registry finishing loading aside): a stream here runs on a
//!    cache change only when the cache put one in its inbox, as the server's stream task
//!    does. So 1. says that every stream subscribed to a changed name was handed it and sent
//!    the newest version, whatever the sequence; and a registry or policy change that touches
//!    none of a stream's names leaves its inbox empty (counted, so the cases reach it).
//!
//! What each request's bounds should do is worked out here from the rules above ([`Expected`],
//! [`Bounds`]), not by `cache` or `session`, and compared with what the session did: the names
//! it tracks, how many wait, its `refused` count. Which waiting names room admits is the
//! model's one borrowed choice: the first by name, as `Subscriptions::admit_waiting` takes
//! them (the rules only say how many).
//!
//! The proxies accept every response (a NACKed resource is, by design, not sent again until it
//! changes), acknowledge each, and never ask for the wildcard (odmesh does not serve it).
//!
//! The number of cases is modest so the test stays quick in debug builds; for more, run
//! `PROPTEST_CASES=10000 cargo test -p odmesh-control --test cache_properties` (about 30 s).
//! A failure is saved in `cache_properties.proptest-regressions` beside this file and tried
//! first on later runs.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::core::v3::{Node, address, socket_address::PortSpecifier};
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, Resource,
};
use envoy_types::pb::google::protobuf::Any;
use envoy_types::pb::google::protobuf::value::Kind as ValueKind;
use odmesh_control::cache::{Cache, Inbox};
use odmesh_control::metrics::Metrics;
use odmesh_control::model::{Snapshot, SnapshotBuilder};
use odmesh_control::policy::Policy;
use odmesh_control::session::{Admission, Context, Service, Session, SubscriptionLimits};
use odmesh_control::xds::{self, Lookup, ResourceType, XdsOptions};
use odmesh_names::parse_cluster_name;
use odmesh_registry::{Instance, Protocol, Registry, Status};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::{select, subsequence};
use proptest::test_runner::{Config, FileFailurePersistence, TestCaseError, TestRunner};
use prost::Message;

/// Cases run by default: a few seconds in a debug build on two cores.
const CASES: u32 = 1000;

/// Cluster names the proxies ask for: VIPs the registry may list, one it never does (`e`),
/// and names that are not odmesh cluster names at all.
const NAMES: &[&str] = &[
    "a.vip",
    "b.vip",
    "c.vip",
    "d.vip",
    "e.vip",
    "a.svip",
    "b.svip",
    "e.svip",
    "xds_cluster",
    "A.vip",
];
/// VIPs and SVIPs instances may list.
const VIPS: &[&str] = &["a", "b", "c", "d"];
const SVIPS: &[&str] = &["a", "b"];
const PORTS: &[Option<u16>] = &[None, Some(8080), Some(8081)];
const SECURE_PORTS: &[Option<u16>] = &[None, Some(8443)];
const STATUSES: &[Status] = &[
    Status::Up,
    Status::Up,
    Status::Down,
    Status::Starting,
    Status::OutOfService,
];
const ZONES: &[Option<&str>] = &[None, Some("z1"), Some("z2")];

#[test]
fn every_proxy_holds_what_the_registry_says_for_what_it_subscribes() {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(CASES);
    let mut runner = TestRunner::new(Config {
        cases,
        source_file: Some(file!()),
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        ..Config::default()
    });
    let seen = RefCell::new(Seen::default());
    let result = runner.run(&scenario(), |scenario| {
        let mut seen = seen.borrow_mut();
        scenario.run(&mut seen).map_err(TestCaseError::fail)
    });
    if let Err(failure) = result {
        panic!("{failure}");
    }
    let seen = seen.into_inner();
    println!("{cases} cases: {seen:#?}");
    // The generator must reach the interesting cases, or the property says little.
    if cases >= CASES {
        for (what, count) in seen.counts() {
            assert!(count > 0, "no case had {what}: {seen:#?}");
        }
    }
}

/// How often the cases reached what the property is about.
#[derive(Debug, Default)]
struct Seen {
    /// Times the property was checked.
    checks: usize,
    /// Checks, with the registry still loading, of a name a proxy kept whose resource the
    /// registry would have changed: the restart guard held it back.
    kept_held_back: usize,
    /// Names refused as unregistered over `max_unregistered`.
    refused_unregistered: usize,
    /// Checks of a name once refused that is now registered and held.
    refused_then_held: usize,
    /// Refused names registered since that found no room and wait for it.
    refused_then_waiting: usize,
    /// Kept unregistered names admitted (and counted) on a new stream, within
    /// `max_unregistered`.
    kept_unregistered: usize,
    /// Names asked for while the registry was loading and did not list them (not counted).
    not_known_yet: usize,
    /// Requests with names over `max_names`.
    over_max_names: usize,
    /// Checks of a cluster name that waited for room, was admitted, and is held.
    waited_then_served: usize,
    /// Checks of a cluster name still waiting for room (the bound is full).
    still_waiting: usize,
    /// Resources a proxy ignored, sent for a name it had dropped meanwhile.
    ignored: usize,
    /// Streams with subscriptions that a registry or policy change did not wake.
    not_woken: usize,
}

impl Seen {
    fn counts(&self) -> [(&'static str, usize); 12] {
        [
            ("a check", self.checks),
            ("a kept name held back", self.kept_held_back),
            ("a name refused as unregistered", self.refused_unregistered),
            (
                "a refused name held once registered",
                self.refused_then_held,
            ),
            (
                "a refused name registered with no room, waiting",
                self.refused_then_waiting,
            ),
            ("a kept unregistered name admitted", self.kept_unregistered),
            ("a name not known yet while loading", self.not_known_yet),
            ("names over max_names", self.over_max_names),
            (
                "a name served after it waited for room",
                self.waited_then_served,
            ),
            (
                "a name still waiting for room at a check",
                self.still_waiting,
            ),
            ("a resource sent for a dropped name", self.ignored),
            ("a stream a change did not wake", self.not_woken),
        ]
    }
}

// ---------------------------------------------------------------------------------------------
// What the generator makes.

/// One test case: how many proxies, the bounds, the registry at start, and what happens.
#[derive(Clone)]
struct Scenario {
    proxies: usize,
    limits: Limits,
    registry: Vec<Inst>,
    ops: Vec<Op>,
}

/// The bounds of the server: per stream, and on cluster names over all streams
/// (`--xds-max-subscriptions`).
#[derive(Clone, Copy)]
struct Limits {
    stream: SubscriptionLimits,
    total: usize,
}

/// An instance as the generator makes it: few ids, addresses, VIPs and ports, so that
/// changes collide.
#[derive(Clone, PartialEq)]
struct Inst {
    id: u8,
    ip: u8,
    vips: Vec<&'static str>,
    svips: Vec<&'static str>,
    port: Option<u16>,
    secure_port: Option<u16>,
    status: Status,
    zone: Option<&'static str>,
}

/// Something that happens. Proxy numbers (see [`Op::on`]) and positions in the registry are
/// taken modulo how many there are.
#[derive(Clone, Debug)]
enum Op {
    /// A proxy's on-demand CDS asks for cluster names.
    Subscribe(usize, Vec<&'static str>),
    /// A proxy drops cluster names (and the load assignments of those it holds).
    Unsubscribe(usize, Vec<&'static str>),
    /// The registry changes.
    Registry(Change),
    /// A proxy's stream breaks, and it opens another to the same control plane.
    Reconnect(usize),
    /// The control plane restarts: a new cache and metrics, and every proxy reconnects. With
    /// `Some(n)` its registry is still loading and has read only the first `n` instances so far.
    Restart(Option<usize>),
    /// One step on one stream.
    Step(usize, Step),
    /// Everything in flight is delivered until all is quiet, then the property is checked.
    Deliver,
    /// The policy file changes to one of [`POLICIES`].
    Policy(usize),
}

#[derive(Clone, Copy, Debug)]
enum Step {
    /// The server reads the next request.
    ServerReads,
    /// The server wakes on a cache change, if there was one, or, while some of the stream's
    /// cluster names wait for room, to look for room (its once-a-second retry).
    ServerWakes,
    /// The proxy reads the next response.
    ProxyReads,
}

/// A change to the registry.
#[derive(Clone, Debug)]
enum Change {
    Add(Inst),
    Remove(usize),
    Status(usize, Status),
    Port(usize, Option<u16>),
    Vips(usize, Vec<&'static str>),
    /// Every instance replaced: a source read anew.
    Replace(Vec<Inst>),
    /// Marked still loading (`true`) or complete again (`false`).
    StillLoading(bool),
}

fn inst() -> impl Strategy<Value = Inst> {
    (
        (
            0..6u8,
            1..4u8,
            subsequence(VIPS, 0..=2),
            subsequence(SVIPS, 0..=1),
        ),
        (
            select(PORTS),
            select(SECURE_PORTS),
            select(STATUSES),
            select(ZONES),
        ),
    )
        .prop_map(
            |((id, ip, vips, svips), (port, secure_port, status, zone))| Inst {
                id,
                ip,
                vips,
                svips,
                port,
                secure_port,
                status,
                zone,
            },
        )
}

fn change() -> impl Strategy<Value = Change> {
    prop_oneof![
        3 => inst().prop_map(Change::Add),
        2 => (0..8usize).prop_map(Change::Remove),
        2 => (0..8usize, select(STATUSES)).prop_map(|(at, s)| Change::Status(at, s)),
        1 => (0..8usize, select(PORTS)).prop_map(|(at, p)| Change::Port(at, p)),
        1 => (0..8usize, subsequence(VIPS, 0..=2)).prop_map(|(at, v)| Change::Vips(at, v)),
        1 => vec(inst(), 0..6).prop_map(Change::Replace),
        1 => any::<bool>().prop_map(Change::StillLoading),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let proxy = 0..3usize;
    let names = || vec(select(NAMES), 1..=3);
    let step = select(&[Step::ServerReads, Step::ServerWakes, Step::ProxyReads][..]);
    prop_oneof![
        6 => (proxy.clone(), names()).prop_map(|(p, n)| Op::Subscribe(p, n)),
        2 => (proxy.clone(), names()).prop_map(|(p, n)| Op::Unsubscribe(p, n)),
        5 => change().prop_map(Op::Registry),
        1 => proxy.clone().prop_map(Op::Reconnect),
        1 => proptest::option::of(0..6usize).prop_map(Op::Restart),
        8 => (proxy, step).prop_map(|(p, s)| Op::Step(p, s)),
        3 => Just(Op::Deliver),
        1 => (0..POLICIES.len()).prop_map(Op::Policy),
    ]
}

/// The policies the control plane may be given: none; one that changes a VIP for every
/// caller; one with an override for the calling service of the odd proxies (`svc-1`); one
/// that changes every cluster.
const POLICIES: &[&str] = &[
    "",
    "vips: {a: {retries: {count: 1}}}",
    "vips: {a: {callers: {svc-1: {request_timeout: 1s}}}, b: {load_balancing: least_request}}",
    "defaults: {connect_timeout: 2s}",
];

/// The calling service (`node.cluster`) of proxy `p`: two services, so that a caller's
/// override applies to some proxies and not others.
fn caller_of(p: usize) -> String {
    format!("svc-{}", p % 2)
}

fn limits() -> impl Strategy<Value = Limits> {
    let generous = Limits {
        stream: SubscriptionLimits::default(),
        total: usize::MAX,
    };
    let small = (
        1..6usize,
        0..3usize,
        prop_oneof![1 => Just(usize::MAX), 2 => 1..6usize],
    )
        .prop_map(|(max_names, max_unregistered, total)| Limits {
            stream: SubscriptionLimits {
                max_names,
                max_unregistered,
            },
            total,
        });
    prop_oneof![Just(generous), small]
}

fn scenario() -> impl Strategy<Value = Scenario> {
    (1..=3usize, limits(), vec(inst(), 0..6), vec(op(), 1..40)).prop_map(
        |(proxies, limits, registry, ops)| Scenario {
            proxies,
            limits,
            registry,
            ops,
        },
    )
}

impl Op {
    /// This operation with its proxy number taken modulo `proxies`.
    fn on(&self, proxies: usize) -> Op {
        match self.clone() {
            Op::Subscribe(p, names) => Op::Subscribe(p % proxies, names),
            Op::Unsubscribe(p, names) => Op::Unsubscribe(p % proxies, names),
            Op::Reconnect(p) => Op::Reconnect(p % proxies),
            Op::Step(p, step) => Op::Step(p % proxies, step),
            op => op,
        }
    }
}

impl Scenario {
    /// Plays the operations, checking the property at every `Deliver` and at the end.
    fn run(&self, seen: &mut Seen) -> Result<(), String> {
        let mut world = World::new(self);
        for (at, op) in self.ops.iter().enumerate() {
            world
                .apply(&op.on(self.proxies), seen)
                .map_err(|e| format!("after operation {}: {e}", at + 1))?;
        }
        (world.deliver(seen))
            .and_then(|()| world.check(seen))
            .map_err(|e| format!("at the end: {e}"))
    }
}

fn registry(instances: &[Inst], loading: bool) -> Registry {
    Registry::from_iter(instances.iter().map(Inst::instance)).still_loading(loading)
}

impl Inst {
    fn instance(&self) -> Instance {
        Instance {
            app: format!("APP{}", self.id % 2).into(),
            instance_id: format!("i{}", self.id).into(),
            ip: IpAddr::from([10, 0, 0, self.ip]),
            port: self.port,
            secure_port: self.secure_port,
            vips: self.vips.iter().map(|v| (*v).into()).collect(),
            svips: self.svips.iter().map(|v| (*v).into()).collect(),
            status: self.status,
            zone: self.zone.map(Into::into),
            protocol: Protocol::Auto,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The simulation.

/// A request of type `ty`, as Envoy's delta xDS client sends it.
fn request(
    ty: ResourceType,
    subscribe: Vec<String>,
    unsubscribe: Vec<String>,
) -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest {
        type_url: ty.type_url().to_owned(),
        resource_names_subscribe: subscribe,
        resource_names_unsubscribe: unsubscribe,
        ..Default::default()
    }
}

/// The requests that subscribe, unsubscribe or acknowledge something.
fn requests(all: impl IntoIterator<Item = DeltaDiscoveryRequest>) -> Vec<DeltaDiscoveryRequest> {
    (all.into_iter())
        .filter(|r| {
            !r.resource_names_subscribe.is_empty()
                || !r.resource_names_unsubscribe.is_empty()
                || !r.response_nonce.is_empty()
        })
        .collect()
}

/// One resource as a proxy holds it: what came on the wire.
#[derive(Clone, Debug, PartialEq)]
struct Held {
    version: String,
    resource: Option<Any>,
}

impl Held {
    fn received(r: &Resource) -> Held {
        Held {
            version: r.version.clone(),
            resource: r.resource.clone(),
        }
    }

    /// What `xds::build_for` makes of `name` in `snapshot` under `policy` for proxies of
    /// `caller` (their own variant if the policy has an override for them); `None` if it is
    /// not an odmesh name.
    fn built(
        name: &str,
        ty: ResourceType,
        snapshot: &Snapshot,
        opts: &XdsOptions,
        policy: &Policy,
        caller: &str,
    ) -> Option<Held> {
        let (vip, kind) = parse_cluster_name(name).ok()?;
        let variant = policy
            .has_caller_override(kind, vip, caller)
            .then_some(caller);
        let lookup = Lookup::in_snapshot(snapshot, name);
        let built = xds::build_for(name, lookup, opts, policy, variant).ok()?;
        Some(Held::received(&built.get(ty).to_resource()))
    }

    fn cluster(&self) -> Option<Cluster> {
        decode(self.resource.as_ref()?, xds::CLUSTER_TYPE_URL)
    }

    /// The `registered` flag of a cluster's odmesh metadata.
    fn registered(&self) -> bool {
        (self.cluster())
            .and_then(|c| c.metadata)
            .and_then(|m| m.filter_metadata.get(xds::METADATA_NAMESPACE).cloned())
            .and_then(|s| s.fields.get("registered").cloned())
            .is_some_and(|v| v.kind == Some(ValueKind::BoolValue(true)))
    }
}

/// A response on its way to a proxy, and whether the registry was still loading when it was
/// sent.
#[derive(Clone, Debug)]
struct ToProxy {
    response: DeltaDiscoveryResponse,
    while_loading: bool,
}

/// A simulated Envoy, as its delta xDS client behaves over ADS with on-demand CDS:
/// - a response's resources replace what it holds of the names it subscribes, removals drop
///   them; anything for a name it does not subscribe is ignored; it acknowledges each response;
/// - once it holds a cluster it subscribes the cluster's load assignment (its EDS service
///   name is the cluster name), and unsubscribes it when it drops the cluster;
/// - a cluster name answered with a removal stays subscribed: Envoy waits for the server,
///   and takes the cluster if it is pushed later (a name that waited for room);
/// - on a new stream (after a failure, a restart), it keeps all it holds and
///   subscribes again to every name, with the versions of those it holds in
///   `initial_resource_versions`.
#[derive(Debug, Default)]
struct Proxy {
    /// Cluster names on-demand CDS asked for and has not dropped.
    clusters: BTreeSet<String>,
    /// Clusters held: the last one received for each name.
    held_clusters: BTreeMap<String, Held>,
    /// Load assignments held, of held clusters only.
    held_endpoints: BTreeMap<String, Held>,
    /// What it told the current stream it kept, as it held it then: names it has not asked
    /// for again, nor been sent since while the registry was complete.
    kept: BTreeMap<(ResourceType, String), Held>,
}

impl Proxy {
    fn held(&self, ty: ResourceType) -> &BTreeMap<String, Held> {
        match ty {
            ResourceType::Cluster => &self.held_clusters,
            ResourceType::Endpoints => &self.held_endpoints,
        }
    }

    fn subscribes(&self, ty: ResourceType, name: &str) -> bool {
        match ty {
            ResourceType::Cluster => self.clusters.contains(name),
            ResourceType::Endpoints => self.held_clusters.contains_key(name),
        }
    }

    /// The names of type `ty` it subscribes.
    fn subscribed(&self, ty: ResourceType) -> Vec<&String> {
        match ty {
            ResourceType::Cluster => self.clusters.iter().collect(),
            ResourceType::Endpoints => self.held_clusters.keys().collect(),
        }
    }

    fn subscribe(&mut self, names: &[&str]) -> Vec<DeltaDiscoveryRequest> {
        let names = distinct(names);
        for name in &names {
            self.clusters.insert(name.clone());
            self.kept.remove(&(ResourceType::Cluster, name.clone()));
        }
        requests([request(ResourceType::Cluster, names, Vec::new())])
    }

    fn unsubscribe(&mut self, names: &[&str]) -> Vec<DeltaDiscoveryRequest> {
        let names: Vec<String> = distinct(names)
            .into_iter()
            .filter(|name| self.clusters.remove(name))
            .collect();
        let mut dropped = Vec::new();
        for name in &names {
            self.kept.remove(&(ResourceType::Cluster, name.clone()));
            if self.drop_cluster(name) {
                dropped.push(name.clone());
            }
        }
        requests([
            request(ResourceType::Cluster, Vec::new(), names),
            request(ResourceType::Endpoints, Vec::new(), dropped),
        ])
    }

    /// Drops a held cluster and its load assignment; returns whether it held the cluster.
    fn drop_cluster(&mut self, name: &str) -> bool {
        let held = self.held_clusters.remove(name).is_some();
        if held {
            self.held_endpoints.remove(name);
            self.kept
                .remove(&(ResourceType::Endpoints, name.to_owned()));
        }
        held
    }

    /// Applies a response; returns its ACK and the load assignments to subscribe or
    /// unsubscribe.
    fn apply(
        &mut self,
        response: &DeltaDiscoveryResponse,
        while_loading: bool,
        seen: &mut Seen,
    ) -> Result<Vec<DeltaDiscoveryRequest>, String> {
        let ty = ResourceType::from_type_url(&response.type_url)
            .ok_or_else(|| format!("a response of type {:?}", response.type_url))?;
        let (mut subscribe, mut unsubscribe) = (Vec::new(), Vec::new());
        for r in &response.resources {
            if !self.subscribes(ty, &r.name) {
                seen.ignored += 1;
                continue;
            }
            if !while_loading {
                self.kept.remove(&(ty, r.name.clone()));
            }
            let held = Held::received(r);
            let new = match ty {
                ResourceType::Cluster => self.held_clusters.insert(r.name.clone(), held),
                ResourceType::Endpoints => self.held_endpoints.insert(r.name.clone(), held),
            }
            .is_none();
            if ty == ResourceType::Cluster && new {
                subscribe.push(r.name.clone());
            }
        }
        for name in &response.removed_resources {
            if !self.subscribes(ty, name) {
                continue;
            }
            if !while_loading {
                self.kept.remove(&(ty, name.clone()));
            }
            match ty {
                ResourceType::Cluster => {
                    if self.drop_cluster(name) {
                        unsubscribe.push(name.clone());
                    }
                }
                ResourceType::Endpoints => {
                    self.held_endpoints.remove(name);
                }
            }
        }
        let ack = DeltaDiscoveryRequest {
            response_nonce: response.nonce.clone(),
            ..request(ty, Vec::new(), Vec::new())
        };
        Ok(requests([
            ack,
            request(ResourceType::Endpoints, subscribe, unsubscribe),
        ]))
    }

    /// The first requests on a new stream.
    fn reconnect(&mut self) -> Vec<DeltaDiscoveryRequest> {
        self.kept = ResourceType::ALL
            .into_iter()
            .flat_map(|ty| {
                (self.held(ty).iter()).map(move |(name, r)| ((ty, name.clone()), r.clone()))
            })
            .collect();
        let versions = |held: &BTreeMap<String, Held>| {
            (held.iter())
                .map(|(name, r)| (name.clone(), r.version.clone()))
                .collect()
        };
        requests([
            DeltaDiscoveryRequest {
                initial_resource_versions: versions(&self.held_clusters),
                ..request(
                    ResourceType::Cluster,
                    self.clusters.iter().cloned().collect(),
                    Vec::new(),
                )
            },
            DeltaDiscoveryRequest {
                initial_resource_versions: versions(&self.held_endpoints),
                ..request(
                    ResourceType::Endpoints,
                    self.held_clusters.keys().cloned().collect(),
                    Vec::new(),
                )
            },
        ])
    }
}

/// `names` without repeats, in order.
fn distinct(names: &[&str]) -> Vec<String> {
    let mut seen = BTreeSet::new();
    (names.iter())
        .filter(|name| seen.insert(**name))
        .map(|name| name.to_string())
        .collect()
}

/// The control plane: a cache following the registry through a snapshot builder, as `main`
/// wires them, the metrics all its sessions count into, and the bound over all streams.
struct ControlPlane {
    cache: Cache,
    builder: SnapshotBuilder,
    metrics: Metrics,
    admission: Admission,
    max_subscriptions: usize,
    next_stream: u64,
}

impl ControlPlane {
    fn start(registry: Registry, options: XdsOptions, max_subscriptions: usize) -> ControlPlane {
        let mut builder = SnapshotBuilder::default();
        let snapshot = builder.update(Arc::new(registry)).snapshot;
        ControlPlane {
            cache: Cache::with_snapshot(options, snapshot),
            builder,
            metrics: Metrics::default(),
            admission: Admission::new(max_subscriptions),
            max_subscriptions,
            next_stream: 1,
        }
    }

    fn context(&self) -> Context<'_> {
        Context {
            cache: &self.cache,
            metrics: &self.metrics,
            admission: &self.admission,
            prewarm: None,
            eviction: None,
        }
    }

    /// Builds the snapshot of `registry`; the cache takes it if a cluster changed (as
    /// `model::follow` publishes only a new snapshot).
    fn registry_changed(&mut self, registry: Registry) {
        let snapshot = self.builder.update(Arc::new(registry)).snapshot;
        if !Arc::ptr_eq(&snapshot, &self.cache.snapshot()) {
            self.cache.set_snapshot(snapshot);
        }
    }

    /// A new stream, as `server` opens one: a session, and its inbox in the cache.
    fn open(&mut self, limits: SubscriptionLimits) -> (Session, Arc<Inbox>) {
        let id = self.next_stream;
        self.next_stream += 1;
        let inbox = self.cache.open_stream(id);
        (Session::new(id, Service::Ads, limits), inbox)
    }
}

/// The names of type `ty` a session subscribes (those waiting for room included).
fn tracked(session: &Session, ty: ResourceType) -> BTreeSet<String> {
    let status = session.status();
    BTreeSet::from_iter(match ty {
        ResourceType::Cluster => status.clusters,
        ResourceType::Endpoints => status.endpoints,
    })
}

/// The names of the resources in `response`.
fn sent(response: &Option<DeltaDiscoveryResponse>) -> BTreeSet<&str> {
    (response.iter())
        .flat_map(|r| &r.resources)
        .map(|r| r.name.as_str())
        .collect()
}

/// The head start on ADS (see the module docs): the first of `clusters`, just answered
/// with a cluster or about to be, whose load assignment did not come right behind it in
/// `responses`. Due for all but names answered with a removal (not odmesh cluster names,
/// refused ones), names whose load assignment the stream tracked already, and those beyond
/// `max_names`.
fn missing_head_start<'a>(
    clusters: impl IntoIterator<Item = &'a String>,
    stream: &Stream,
    endpoints_before: &BTreeSet<String>,
    responses: &[Option<DeltaDiscoveryResponse>; 2],
    max_names: usize,
) -> Option<&'a String> {
    let room = max_names.saturating_sub(endpoints_before.len());
    let endpoints = tracked(&stream.session, ResourceType::Endpoints);
    let sent = sent(&responses[1]);
    (clusters.into_iter())
        .filter(|name| {
            parse_cluster_name(name).is_ok()
                && !stream.bounds.refused.contains(*name)
                && !endpoints_before.contains(*name)
        })
        .take(room)
        .find(|name| !endpoints.contains(*name) || !sent.contains(name.as_str()))
}

/// What the bounds make of one request's subscribes, by the rules (see the module docs), in
/// the request's order: names over `max_names` first (a name waiting for room takes a place
/// under it), then the room over all streams, which names the client kept do not take.
#[derive(Debug, Default)]
struct Expected {
    /// Names the stream tracks, and counts, from now on.
    admitted: Vec<String>,
    /// Names over `max_names`: answered with a removal, not tracked.
    over_max_names: Vec<String>,
    /// New names beyond the room: tracked, answered with a removal, waiting for room.
    waiting: Vec<String>,
}

impl Expected {
    fn of(
        req: &DeltaDiscoveryRequest,
        tracked: &BTreeSet<String>,
        max_names: usize,
        mut room: usize,
    ) -> Expected {
        let mut expected = Expected::default();
        for name in &req.resource_names_subscribe {
            if tracked.contains(name)
                || expected.admitted.contains(name)
                || expected.waiting.contains(name)
            {
                continue;
            }
            let kept = req.initial_resource_versions.contains_key(name);
            let taken = tracked.len() + expected.admitted.len() + expected.waiting.len();
            if taken >= max_names {
                expected.over_max_names.push(name.clone());
            } else if kept {
                expected.admitted.push(name.clone());
            } else if room > 0 {
                room -= 1;
                expected.admitted.push(name.clone());
            } else {
                expected.waiting.push(name.clone());
            }
        }
        expected
    }
}

/// What one stream's bounds did to its names so far, by the rules.
#[derive(Debug, Default)]
struct Bounds {
    /// Names over `max_names` when asked for, not tracked: the proxy holds nothing for them.
    over_max_names: BTreeSet<(ResourceType, String)>,
    /// Cluster names admitted while unregistered (they count against `max_unregistered`)
    /// and not sent registered since.
    unregistered: BTreeSet<String>,
    /// Cluster names refused as unregistered: the proxy holds nothing for them until they
    /// are sent registered.
    refused: BTreeSet<String>,
    /// Cluster names ever refused on this stream and not unsubscribed since.
    once_refused: BTreeSet<String>,
    /// Cluster names waiting for room: tracked but not counted; the proxy holds nothing for
    /// them.
    waiting: BTreeSet<String>,
    /// Load-assignment names admitted while unregistered and not of a cluster the stream
    /// counts (they count against `max_unregistered`), not sent registered since.
    unregistered_endpoints: BTreeSet<String>,
    /// Load-assignment names refused as unregistered: tracked, neither counted nor watched.
    refused_endpoints: BTreeSet<String>,
    /// Cluster names admitted after they waited for room, and not unsubscribed since.
    waited: BTreeSet<String>,
}

impl Bounds {
    /// Follows a request the session handled, in which `expected.admitted` are new; returns
    /// how many names should have been refused. `clusters`: the cluster names the stream
    /// tracks.
    #[allow(clippy::too_many_arguments)]
    fn accepted(
        &mut self,
        req: &DeltaDiscoveryRequest,
        ty: ResourceType,
        expected: &Expected,
        max_unregistered: usize,
        snapshot: &Snapshot,
        clusters: &BTreeSet<String>,
        seen: &mut Seen,
    ) -> usize {
        for name in &req.resource_names_subscribe {
            self.over_max_names.remove(&(ty, name.clone()));
        }
        for name in &expected.over_max_names {
            self.over_max_names.insert((ty, name.clone()));
        }
        if ty == ResourceType::Cluster {
            self.waiting.extend(expected.waiting.iter().cloned());
        }
        for name in &req.resource_names_unsubscribe {
            self.over_max_names.remove(&(ty, name.clone()));
            if ty == ResourceType::Endpoints {
                self.unregistered_endpoints.remove(name);
                self.refused_endpoints.remove(name);
            }
            if ty == ResourceType::Cluster {
                self.unregistered.remove(name);
                self.refused.remove(name);
                self.once_refused.remove(name);
                self.waiting.remove(name);
                self.waited.remove(name);
            }
        }
        if !expected.over_max_names.is_empty() {
            seen.over_max_names += 1;
        }
        let mut refused = expected.over_max_names.len();
        if ty == ResourceType::Endpoints {
            for name in &expected.admitted {
                let kept = req.initial_resource_versions.contains_key(name);
                let covered = self.counts_cluster(clusters, name);
                refused += usize::from(self.admit_endpoints(
                    name,
                    kept,
                    covered,
                    max_unregistered,
                    snapshot,
                    seen,
                ));
            }
            return refused;
        }
        for name in &expected.admitted {
            let kept = req.initial_resource_versions.contains_key(name);
            refused += usize::from(self.admit(name, kept, max_unregistered, snapshot, seen));
        }
        refused
    }

    /// Room for `room` more cluster names: as many waiting names are admitted, the first by
    /// name. Returns them, and how many of them should have been refused.
    fn admit_waiting(
        &mut self,
        room: usize,
        max_unregistered: usize,
        snapshot: &Snapshot,
        seen: &mut Seen,
    ) -> (Vec<String>, usize) {
        let admitted: Vec<String> = self.waiting.iter().take(room).cloned().collect();
        let mut refused = 0;
        for name in &admitted {
            self.waiting.remove(name);
            self.waited.insert(name.clone());
            refused += usize::from(self.admit(name, false, max_unregistered, snapshot, seen));
        }
        (admitted, refused)
    }

    /// Follows a cluster name newly counted on the stream: over `max_unregistered`, an
    /// unregistered name, `kept` or not, is refused. Returns whether it is.
    fn admit(
        &mut self,
        name: &str,
        kept: bool,
        max_unregistered: usize,
        snapshot: &Snapshot,
        seen: &mut Seen,
    ) -> bool {
        if parse_cluster_name(name).is_err() {
            return false;
        }
        match Lookup::in_snapshot(snapshot, name) {
            Lookup::Registered(_) => false,
            Lookup::NotYetKnown => {
                seen.not_known_yet += 1;
                false
            }
            Lookup::Unregistered => {
                if self.unregistered.len() < max_unregistered {
                    if kept {
                        seen.kept_unregistered += 1;
                    }
                    self.unregistered.insert(name.to_owned());
                    false
                } else {
                    seen.refused_unregistered += 1;
                    self.refused.insert(name.to_owned());
                    self.once_refused.insert(name.to_owned());
                    true
                }
            }
        }
    }

    /// Whether the stream counts cluster `name`, of those it tracks (`clusters`): neither
    /// waiting for room nor refused.
    fn counts_cluster(&self, clusters: &BTreeSet<String>, name: &str) -> bool {
        clusters.contains(name) && !self.waiting.contains(name) && !self.refused.contains(name)
    }

    /// Follows a load-assignment name newly subscribed on the stream: over
    /// `max_unregistered`, an unregistered name not of a cluster the stream counts
    /// (`covered`), `kept` or not, is refused. Returns whether it is.
    fn admit_endpoints(
        &mut self,
        name: &str,
        kept: bool,
        covered: bool,
        max_unregistered: usize,
        snapshot: &Snapshot,
        seen: &mut Seen,
    ) -> bool {
        let unregistered = parse_cluster_name(name).is_ok()
            && matches!(Lookup::in_snapshot(snapshot, name), Lookup::Unregistered);
        if !unregistered || covered {
            return false;
        }
        if self.unregistered_endpoints.len() < max_unregistered {
            if kept {
                seen.kept_unregistered += 1;
            }
            self.unregistered_endpoints.insert(name.to_owned());
            false
        } else {
            seen.refused_unregistered += 1;
            self.refused_endpoints.insert(name.to_owned());
            true
        }
    }

    /// Follows a response to a request or a wake that `looked` at refused cluster names
    /// registered since: those `pushed` took room, at most `room`; the others wait for room,
    /// and only if no room was left. Returns how many wait.
    fn refused_registered(
        &mut self,
        looked: impl Fn(&str) -> bool,
        pushed: &[String],
        snapshot: &Snapshot,
        room: usize,
    ) -> Result<usize, String> {
        let registered: Vec<String> = (self.refused.iter())
            .filter(|name| looked(name))
            .filter(|name| matches!(Lookup::in_snapshot(snapshot, name), Lookup::Registered(_)))
            .cloned()
            .collect();
        let (sent, wait): (Vec<String>, Vec<String>) = registered
            .into_iter()
            .partition(|name| pushed.contains(name));
        if sent.len() > room || (!wait.is_empty() && sent.len() < room) {
            return Err(format!(
                "refused names registered since: {sent:?} sent and {wait:?} left waiting, with \
                 room for {room}"
            ));
        }
        let waiting = wait.len();
        for name in wait {
            self.refused.remove(&name);
            self.waiting.insert(name);
        }
        Ok(waiting)
    }

    /// Follows a response: a name sent registered counts against no bound from then on (a
    /// refused load assignment is sent only once registered).
    fn sent(&mut self, response: &DeltaDiscoveryResponse, snapshot: &Snapshot) {
        if response.type_url == xds::ENDPOINTS_TYPE_URL {
            for r in &response.resources {
                if matches!(
                    Lookup::in_snapshot(snapshot, &r.name),
                    Lookup::Registered(_)
                ) {
                    self.unregistered_endpoints.remove(&r.name);
                    self.refused_endpoints.remove(&r.name);
                }
            }
            return;
        }
        if response.type_url != xds::CLUSTER_TYPE_URL {
            return;
        }
        for r in &response.resources {
            if Held::received(r).registered() {
                self.unregistered.remove(&r.name);
                self.refused.remove(&r.name);
            }
        }
    }
}

/// One proxy's ADS stream: the server's session, and the messages in flight both ways (each
/// way in order, as on an HTTP/2 stream).
struct Stream {
    session: Session,
    /// Where the cache puts the changes to this stream's names.
    inbox: Arc<Inbox>,
    to_server: VecDeque<DeltaDiscoveryRequest>,
    to_proxy: VecDeque<ToProxy>,
    /// Whether the proxy has sent its first request (which names its node).
    named: bool,
    bounds: Bounds,
}

impl Stream {
    fn open(cp: &mut ControlPlane, limits: SubscriptionLimits) -> Stream {
        let (session, inbox) = cp.open(limits);
        Stream {
            session,
            inbox,
            to_server: VecDeque::new(),
            to_proxy: VecDeque::new(),
            named: false,
            bounds: Bounds::default(),
        }
    }

    /// The proxy sends `requests`.
    fn send(&mut self, p: usize, requests: Vec<DeltaDiscoveryRequest>) {
        for mut req in requests {
            if !self.named {
                self.named = true;
                req.node = Some(Node {
                    id: format!("proxy-{p}"),
                    cluster: caller_of(p),
                    ..Default::default()
                });
            }
            self.to_server.push_back(req);
        }
    }

    /// The server sends `responses`.
    fn respond(&mut self, cp: &ControlPlane, responses: [Option<DeltaDiscoveryResponse>; 2]) {
        let snapshot = cp.cache.snapshot();
        let while_loading = !snapshot.is_complete();
        for response in responses.into_iter().flatten() {
            self.bounds.sent(&response, &snapshot);
            self.to_proxy.push_back(ToProxy {
                response,
                while_loading,
            });
        }
    }

    /// Whether the session waits for room for the cluster names the rules say (it shows only
    /// how many).
    fn check_waiting(&self, when: impl FnOnce() -> String) -> Result<(), String> {
        let (waiting, is_waiting) = (self.session.status().waiting, self.session.is_waiting());
        if waiting != self.bounds.waiting.len() || is_waiting != (waiting > 0) {
            return Err(format!(
                "{}, the session has {waiting} cluster names waiting for room (is_waiting: \
                 {is_waiting}), but by the rules {:?} wait",
                when(),
                self.bounds.waiting
            ));
        }
        Ok(())
    }
}

/// Everything: the registry as its source has it, the control plane, the proxies and their
/// streams (stream `i` is proxy `i`'s).
struct World {
    options: XdsOptions,
    /// The policy file as the control plane reads it (a restart reads it again).
    policy: Arc<Policy>,
    limits: Limits,
    registry: Vec<Inst>,
    loading: bool,
    /// A full build of the registry now, not the control plane's incremental one.
    snapshot: Snapshot,
    cp: ControlPlane,
    proxies: Vec<Proxy>,
    streams: Vec<Stream>,
}

impl World {
    fn new(scenario: &Scenario) -> World {
        let options = XdsOptions::new(Some("/ca.pem".into()));
        let registry = registry(&scenario.registry, false);
        let snapshot = Snapshot::from_registry(&registry);
        let mut cp = ControlPlane::start(registry, options.clone(), scenario.limits.total);
        let streams = (0..scenario.proxies)
            .map(|_| Stream::open(&mut cp, scenario.limits.stream))
            .collect();
        World {
            options,
            policy: Arc::default(),
            limits: scenario.limits,
            registry: scenario.registry.clone(),
            loading: false,
            snapshot,
            cp,
            proxies: (0..scenario.proxies).map(|_| Proxy::default()).collect(),
            streams,
        }
    }

    fn registry(&self) -> Registry {
        registry(&self.registry, self.loading)
    }

    fn apply(&mut self, op: &Op, seen: &mut Seen) -> Result<(), String> {
        let n = self.proxies.len();
        match op {
            Op::Subscribe(p, names) => {
                let requests = self.proxies[*p].subscribe(names);
                self.streams[*p].send(*p, requests);
            }
            Op::Unsubscribe(p, names) => {
                let requests = self.proxies[*p].unsubscribe(names);
                self.streams[*p].send(*p, requests);
            }
            Op::Registry(change) => {
                self.change_registry(change);
                let registry = self.registry();
                self.snapshot = Snapshot::from_registry(&registry);
                self.cp.registry_changed(registry);
                self.count_not_woken(seen);
            }
            Op::Reconnect(p) => {
                self.streams[*p].session.close(&self.cp.context());
                self.reconnect(*p);
            }
            Op::Restart(loaded) => {
                if let Some(loaded) = loaded {
                    self.registry.truncate(*loaded);
                    self.loading = true;
                }
                let registry = self.registry();
                self.snapshot = Snapshot::from_registry(&registry);
                // The old control plane is gone with its streams: a fresh cache and metrics.
                self.cp = ControlPlane::start(registry, self.options.clone(), self.limits.total);
                self.cp.cache.set_policy(self.policy.clone());
                for p in 0..n {
                    self.reconnect(p);
                }
            }
            Op::Step(p, step) => {
                self.step(*p, *step, seen)?;
            }
            Op::Deliver => {
                self.deliver(seen)?;
                self.check(seen)?;
            }
            Op::Policy(i) => {
                let yaml = POLICIES[i % POLICIES.len()];
                self.policy = Arc::new(Policy::parse(yaml.as_bytes()).expect("a valid policy"));
                self.cp.cache.set_policy(self.policy.clone());
                self.count_not_woken(seen);
            }
        }
        Ok(())
    }

    /// Counts the streams with subscriptions whose inbox is empty after a change.
    fn count_not_woken(&self, seen: &mut Seen) {
        seen.not_woken += (self.streams.iter())
            .filter(|s| !tracked(&s.session, ResourceType::Cluster).is_empty())
            .filter(|s| !s.inbox.has_changes())
            .count();
    }

    fn change_registry(&mut self, change: &Change) {
        let len = self.registry.len();
        let at = |i: &usize| (len > 0).then(|| i % len);
        match change {
            Change::Add(inst) => self.registry.push(inst.clone()),
            Change::Remove(i) => {
                if let Some(i) = at(i) {
                    self.registry.remove(i);
                }
            }
            Change::Status(i, status) => {
                if let Some(i) = at(i) {
                    self.registry[i].status = *status;
                }
            }
            Change::Port(i, port) => {
                if let Some(i) = at(i) {
                    self.registry[i].port = *port;
                }
            }
            Change::Vips(i, vips) => {
                if let Some(i) = at(i) {
                    self.registry[i].vips = vips.clone();
                }
            }
            Change::Replace(all) => self.registry = all.clone(),
            Change::StillLoading(loading) => self.loading = *loading,
        }
    }

    /// Proxy `p` opens a new stream (what was in flight on its old one is lost).
    fn reconnect(&mut self, p: usize) {
        let mut stream = Stream::open(&mut self.cp, self.limits.stream);
        stream.send(p, self.proxies[p].reconnect());
        self.streams[p] = stream;
    }

    /// Cluster names counted over all open sessions, by the rules: those waiting for room
    /// and those refused left out.
    fn cluster_subscriptions(&self) -> usize {
        (self.streams.iter())
            .map(|s| {
                let tracked = s.session.status().clusters.len();
                tracked.saturating_sub(s.bounds.waiting.len() + s.bounds.refused.len())
            })
            .sum()
    }

    /// One step on stream `p`; returns whether anything happened.
    fn step(&mut self, p: usize, step: Step, seen: &mut Seen) -> Result<bool, String> {
        match step {
            Step::ServerReads => self.server_reads(p, seen),
            Step::ServerWakes => self.server_wakes(p, seen),
            Step::ProxyReads => {
                let stream = &mut self.streams[p];
                let Some(ToProxy {
                    response,
                    while_loading,
                }) = stream.to_proxy.pop_front()
                else {
                    return Ok(false);
                };
                let requests = self.proxies[p].apply(&response, while_loading, seen)?;
                stream.send(p, requests);
                Ok(true)
            }
        }
    }

    /// The server reads the next request on stream `p`, and the test checks what the
    /// session did with it against what the bounds say.
    fn server_reads(&mut self, p: usize, seen: &mut Seen) -> Result<bool, String> {
        let in_use = self.cluster_subscriptions();
        let (cp, limits) = (&self.cp, self.limits);
        let stream = &mut self.streams[p];
        let Some(req) = stream.to_server.pop_front() else {
            return Ok(false);
        };
        let ty = ResourceType::from_type_url(&req.type_url)
            .ok_or_else(|| format!("proxy {p} asked for type {:?}", req.type_url))?;
        let before = tracked(&stream.session, ty);
        let endpoints_before = tracked(&stream.session, ResourceType::Endpoints);
        let clusters_before = tracked(&stream.session, ResourceType::Cluster);
        let refused_before = stream.session.status().refused;
        let room = match ty {
            ResourceType::Cluster => cp.max_subscriptions.saturating_sub(in_use),
            ResourceType::Endpoints => usize::MAX,
        };
        let expected = Expected::of(&req, &before, limits.stream.max_names, room);
        let what = || {
            let room = match cp.max_subscriptions {
                usize::MAX => "no bound".to_owned(),
                _ => format!("room for {room}"),
            };
            format!(
                "proxy {p}'s request for {} {:?} (kept {:?}, unsubscribe {:?}; {room})",
                ty.as_str(),
                req.resource_names_subscribe,
                (req.initial_resource_versions.keys()).collect::<BTreeSet<_>>(),
                req.resource_names_unsubscribe,
            )
        };
        let responses = stream.session.on_request(&cp.context(), req.clone());
        let mut want = before;
        want.extend(expected.admitted.iter().cloned());
        want.extend(expected.waiting.iter().cloned());
        for name in &req.resource_names_unsubscribe {
            want.remove(name);
        }
        let now = tracked(&stream.session, ty);
        if now != want {
            return Err(format!(
                "after {}, the stream subscribes {} {now:?}, but should {want:?}",
                what(),
                ty.as_str(),
            ));
        }
        let refused = stream.bounds.accepted(
            &req,
            ty,
            &expected,
            limits.stream.max_unregistered,
            &self.snapshot,
            &clusters_before,
            seen,
        );
        let counted = stream.session.status().refused - refused_before;
        if counted != refused as u64 {
            return Err(format!(
                "after {}, the stream counted {counted} names refused, but should {refused}",
                what()
            ));
        }
        if ty == ResourceType::Cluster {
            // Refused names asked for again and registered since take what room is left.
            let taken = expected.admitted.len() - (refused - expected.over_max_names.len());
            let pushed: Vec<String> = sent(&responses[0]).into_iter().map(str::to_owned).collect();
            let looked = |name: &str| req.resource_names_subscribe.iter().any(|n| n == name);
            seen.refused_then_waiting += (stream.bounds)
                .refused_registered(looked, &pushed, &self.snapshot, room.saturating_sub(taken))
                .map_err(|e| format!("after {}, {e}", what()))?;
        }
        stream.check_waiting(|| format!("after {}", what()))?;
        if ty == ResourceType::Cluster {
            // A name that waits for room is answered with a removal right away.
            let removed: BTreeSet<&str> = (responses[0].iter())
                .flat_map(|r| &r.removed_resources)
                .map(String::as_str)
                .collect();
            if let Some(name) = (expected.waiting.iter()).find(|name| {
                stream.bounds.waiting.contains(*name) && !removed.contains(name.as_str())
            }) {
                return Err(format!(
                    "after {}, {name} waits for room but was not answered with a removal",
                    what()
                ));
            }
            let fresh = (expected.admitted.iter())
                .filter(|name| !req.initial_resource_versions.contains_key(*name));
            let max_names = limits.stream.max_names;
            if let Some(name) =
                missing_head_start(fresh, stream, &endpoints_before, &responses, max_names)
            {
                return Err(format!(
                    "after {}, the load assignment of {name} was not sent right behind its \
                     cluster",
                    what()
                ));
            }
        }
        stream.respond(cp, responses);
        Ok(true)
    }

    /// The server wakes on stream `p`: on a change in its inbox, and, while some of
    /// its cluster names wait, to look for room. The test checks which waiting names the
    /// session admitted and pushed against what the bounds say. Returns whether anything
    /// happened.
    fn server_wakes(&mut self, p: usize, seen: &mut Seen) -> Result<bool, String> {
        let in_use = self.cluster_subscriptions();
        let (cp, limits) = (&self.cp, self.limits);
        let stream = &mut self.streams[p];
        let changes = stream.inbox.take();
        let changed = !changes.is_empty();
        let told = changes.clone();
        if !changed && !stream.session.is_waiting() {
            return Ok(false);
        }
        let room = cp.max_subscriptions.saturating_sub(in_use);
        let endpoints_before = tracked(&stream.session, ResourceType::Endpoints);
        let refused_before = stream.session.status().refused;
        let waiting_before = stream.bounds.waiting.clone();
        let responses = stream.session.on_change(&cp.context(), changes);
        let (admitted, refused) =
            stream
                .bounds
                .admit_waiting(room, limits.stream.max_unregistered, &self.snapshot, seen);
        let what = || {
            format!(
                "when proxy {p}'s stream woke, with {waiting_before:?} waiting and room for \
                 {room}"
            )
        };
        // Refused names registered since take what room the admitted left; the rest wait.
        let left = room.saturating_sub(admitted.len() - refused);
        let pushed: Vec<String> = sent(&responses[0]).into_iter().map(str::to_owned).collect();
        let looked = |name: &str| told.all || told.names.contains(name);
        seen.refused_then_waiting += (stream.bounds)
            .refused_registered(looked, &pushed, &self.snapshot, left)
            .map_err(|e| format!("{}, {e}", what()))?;
        stream.check_waiting(what)?;
        let counted = stream.session.status().refused - refused_before;
        if counted != refused as u64 {
            return Err(format!(
                "{}, the stream counted {counted} names refused, but should {refused}",
                what()
            ));
        }
        // Admitted, a name is pushed: its cluster, unless answered with a removal...
        let pushed = sent(&responses[0]);
        if let Some(name) = admitted.iter().find(|name| {
            parse_cluster_name(name).is_ok()
                && !stream.bounds.refused.contains(*name)
                && !pushed.contains(name.as_str())
        }) {
            return Err(format!(
                "{}, {name} was admitted but its cluster was not pushed",
                what()
            ));
        }
        // ...and its load assignment right behind it.
        let max_names = limits.stream.max_names;
        if let Some(name) =
            missing_head_start(&admitted, stream, &endpoints_before, &responses, max_names)
        {
            return Err(format!(
                "{}, the load assignment of {name} was not sent right behind its cluster",
                what()
            ));
        }
        let busy = changed || !admitted.is_empty() || responses.iter().any(Option::is_some);
        stream.respond(cp, responses);
        Ok(busy)
    }

    /// Delivers everything, until nothing is in flight and no server has anything more to
    /// send. In every round each server wakes on what its inbox holds, and, while names wait,
    /// standing in for its once-a-second look for room.
    fn deliver(&mut self, seen: &mut Seen) -> Result<(), String> {
        for _ in 0..10_000 {
            let mut busy = false;
            for p in 0..self.proxies.len() {
                busy |= self.server_reads(p, seen)?;
                busy |= self.server_wakes(p, seen)?;
                busy |= self.step(p, Step::ProxyReads, seen)?;
            }
            if !busy {
                return Ok(());
            }
        }
        Err("the streams never settled".into())
    }

    /// The property (see the module docs), with everything delivered.
    fn check(&self, seen: &mut Seen) -> Result<(), String> {
        seen.checks += 1;
        let loading = !self.snapshot.is_complete();
        let in_use = self.cluster_subscriptions();
        let max = self.cp.max_subscriptions;
        for (p, (proxy, stream)) in self.proxies.iter().zip(&self.streams).enumerate() {
            for ty in ResourceType::ALL {
                if let Some(name) = proxy
                    .held(ty)
                    .keys()
                    .find(|name| !proxy.subscribes(ty, name))
                {
                    return Err(format!(
                        "proxy {p} holds {} {name}, which it does not subscribe",
                        ty.as_str()
                    ));
                }
            }
            stream.check_waiting(|| format!("with all delivered, proxy {p}"))?;
            for ty in ResourceType::ALL {
                let held = proxy.held(ty);
                let tracked = tracked(&stream.session, ty);
                for name in proxy.subscribed(ty) {
                    let key = (ty, name.clone());
                    let built = Held::built(
                        name,
                        ty,
                        &self.snapshot,
                        &self.options,
                        &self.policy,
                        &caller_of(p),
                    );
                    let kept = proxy.kept.get(&key).filter(|_| loading);
                    let cluster = ty == ResourceType::Cluster;
                    let refused = cluster
                        && stream.bounds.refused.contains(name)
                        && built.as_ref().is_some_and(|b| !b.registered());
                    // The bounds come first: the restart guard keeps what the server
                    // tracks, and a name over `max_names` is not tracked.
                    let (want, why) = if !tracked.contains(name) {
                        if !stream.bounds.over_max_names.contains(&key) {
                            return Err(format!(
                                "proxy {p} subscribes {} {name}, which its stream does not, \
                                 and it was not over max_names",
                                ty.as_str()
                            ));
                        }
                        (None, "refused over max_names")
                    } else if cluster && stream.bounds.waiting.contains(name) {
                        if in_use < max {
                            return Err(format!(
                                "proxy {p}'s cluster {name} still waits for room, but the open \
                                 streams count only {in_use} cluster names of {max}"
                            ));
                        }
                        seen.still_waiting += 1;
                        (None, "waiting for room")
                    } else if let Some(kept) = kept {
                        if !same(Some(kept), built.as_ref()) {
                            seen.kept_held_back += 1;
                        }
                        (Some(kept.clone()), "kept while the registry is loading")
                    } else if refused {
                        (None, "unregistered, refused over max_unregistered")
                    } else {
                        (built, "what the registry says")
                    };
                    let have = held.get(name);
                    if !same(have, want.as_ref()) {
                        return Err(format!(
                            "proxy {p}, {} {name}: holds {}, but should hold {} ({why})",
                            ty.as_str(),
                            describe(have),
                            describe(want.as_ref()),
                        ));
                    }
                    if cluster
                        && stream.bounds.once_refused.contains(name)
                        && have.is_some_and(Held::registered)
                    {
                        seen.refused_then_held += 1;
                    }
                    if cluster && stream.bounds.waited.contains(name) && have.is_some() {
                        seen.waited_then_served += 1;
                    }
                }
                if let Some(name) = tracked.iter().find(|name| !proxy.subscribes(ty, name)) {
                    return Err(format!(
                        "proxy {p}'s stream subscribes {} {name}, which the proxy does not",
                        ty.as_str()
                    ));
                }
            }
        }
        self.check_counts()
    }

    /// The control plane's own accounting of its open streams: names waiting for room are
    /// neither counted nor watched.
    fn check_counts(&self) -> Result<(), String> {
        let clusters = self.cluster_subscriptions();
        let endpoints: usize = (self.streams.iter())
            .map(|s| s.session.status().endpoints.len() - s.bounds.refused_endpoints.len())
            .sum();
        let all = clusters + endpoints;
        let names: BTreeSet<String> = (self.streams.iter())
            .flat_map(|s| {
                let status = s.session.status();
                let b = &s.bounds;
                let clusters = (status.clusters.into_iter())
                    .filter(|name| !b.waiting.contains(name) && !b.refused.contains(name));
                let endpoints = (status.endpoints.into_iter())
                    .filter(|name| !b.refused_endpoints.contains(name));
                clusters.chain(endpoints).collect::<Vec<_>>()
            })
            .collect();
        let metrics = &self.cp.metrics;
        let counted = (
            metrics.xds_cluster_subscriptions.load(Ordering::Relaxed),
            metrics.xds_subscriptions.load(Ordering::Relaxed),
            self.cp.cache.watched(),
        );
        if counted != (clusters as u64, all as u64, names.len()) {
            return Err(format!(
                "the control plane counts {} cluster subscriptions, {} subscriptions and \
                 {} names watched; its streams hold {clusters}, {all} and {} (names waiting \
                 for room and refused names left out)",
                counted.0,
                counted.1,
                counted.2,
                names.len()
            ));
        }
        let tracked: usize = (self.streams.iter())
            .map(|s| {
                let status = s.session.status();
                status.clusters.len() + status.endpoints.len()
            })
            .sum();
        let (told, _) = self.cp.admission.names_tracked(None);
        if told != tracked {
            return Err(format!(
                "the bound on names tracked counts {told}; the open streams track {tracked}"
            ));
        }
        Ok(())
    }
}

/// Whether two resources are the same: version, type, and message. The message is compared
/// decoded: prost writes the cluster's metadata map in `HashMap` order, so two builds of one
/// cluster may differ in their bytes.
fn same(a: Option<&Held>, b: Option<&Held>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => {
            let (Some(x), Some(y)) = (&a.resource, &b.resource) else {
                return false;
            };
            a.version == b.version
                && x.type_url == y.type_url
                && if x.type_url == xds::CLUSTER_TYPE_URL {
                    a.cluster().is_some_and(|c| Some(c) == b.cluster())
                } else {
                    let cla = |any| decode::<ClusterLoadAssignment>(any, xds::ENDPOINTS_TYPE_URL);
                    cla(x).is_some_and(|c| Some(c) == cla(y))
                }
        }
        _ => false,
    }
}

/// `any`'s message, if it is of `type_url`.
fn decode<M: Message + Default>(any: &Any, type_url: &str) -> Option<M> {
    (any.type_url == type_url)
        .then(|| M::decode(any.value.as_slice()).ok())
        .flatten()
}

/// A resource in a few words: its version and what it says.
fn describe(r: Option<&Held>) -> String {
    let Some(r) = r else {
        return "nothing".into();
    };
    let Some(any) = &r.resource else {
        return format!("version {} without a body", r.version);
    };
    let what = if any.type_url == xds::CLUSTER_TYPE_URL {
        (r.cluster())
            .and_then(|c| c.metadata)
            .and_then(|m| m.filter_metadata.get(xds::METADATA_NAMESPACE).cloned())
            .and_then(|s| s.fields.get("reason").cloned())
            .and_then(|v| match v.kind {
                Some(ValueKind::StringValue(s)) => Some(format!("\"{s}\"")),
                _ => None,
            })
            .unwrap_or_else(|| "a cluster without a reason".into())
    } else {
        let endpoints: Vec<String> = decode::<ClusterLoadAssignment>(any, xds::ENDPOINTS_TYPE_URL)
            .into_iter()
            .flat_map(|cla| cla.endpoints)
            .flat_map(|group| {
                let zone = group.locality.map(|l| l.zone).unwrap_or_default();
                group.lb_endpoints.into_iter().map(move |ep| {
                    let address = match ep.host_identifier {
                        Some(HostIdentifier::Endpoint(e)) => e.address.and_then(|a| a.address),
                        _ => None,
                    };
                    match address {
                        Some(address::Address::SocketAddress(s)) => {
                            let port = match s.port_specifier {
                                Some(PortSpecifier::PortValue(p)) => p,
                                _ => 0,
                            };
                            format!("{}:{port}{}", s.address, zone_suffix(&zone))
                        }
                        _ => "?".into(),
                    }
                })
            })
            .collect();
        format!("endpoints [{}]", endpoints.join(", "))
    };
    let registered = if any.type_url == xds::CLUSTER_TYPE_URL && !r.registered() {
        ", unregistered"
    } else {
        ""
    };
    format!("version {} ({what}{registered})", r.version)
}

fn zone_suffix(zone: &str) -> String {
    if zone.is_empty() {
        String::new()
    } else {
        format!(" in {zone}")
    }
}

// ---------------------------------------------------------------------------------------------
// Short forms, so that a shrunk counterexample reads as a story.

impl fmt::Debug for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{} proxies, bounds {:?}", self.proxies, self.limits)?;
        writeln!(f, "registry: {:?}", self.registry)?;
        for (at, op) in self.ops.iter().enumerate() {
            writeln!(f, "{:>3}. {:?}", at + 1, op.on(self.proxies))?;
        }
        Ok(())
    }
}

impl fmt::Debug for Limits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let total = match self.total {
            usize::MAX => "none".to_owned(),
            n => n.to_string(),
        };
        write!(
            f,
            "max_names {} max_unregistered {} total {total}",
            self.stream.max_names, self.stream.max_unregistered
        )
    }
}

impl fmt::Debug for Inst {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let port = |p: Option<u16>| p.map_or("-".to_owned(), |p| p.to_string());
        write!(
            f,
            "i{} 10.0.0.{} {} vips {:?}:{} svips {:?}:{}",
            self.id,
            self.ip,
            self.status.as_str(),
            self.vips,
            port(self.port),
            self.svips,
            port(self.secure_port),
        )?;
        if let Some(zone) = self.zone {
            write!(f, " {zone}")?;
        }
        Ok(())
    }
}
