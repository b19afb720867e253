//! Property test of the cache and the stream logic, against simulated Envoys.
//!
//! **The property.** Several simulated proxies ([`Proxy`]), each on a simulated ADS stream
//! ([`Stream`]) to a control plane ([`ControlPlane`]), go through any sequence of subscribes,
//! unsubscribes, registry changes, reconnects, control-plane restarts and partial deliveries.
//! Whenever everything in flight has been delivered:
//! 1. every proxy holds, for every name it subscribes (cluster names by on-demand CDS; the load
//!    assignment of every cluster it holds), exactly what `xds::build` makes of that name from
//!    the registry now: the same version and the same message; nothing for a name that is not
//!    an odmesh cluster name; and nothing at all for a name it does not subscribe;
//! 2. except that, while the registry is still loading, what a proxy kept from an earlier
//!    stream (sent in `initial_resource_versions`) is left exactly as it held it (the restart
//!    guard); once the registry is complete, 1. holds for those names too;
//! 3. and except names over the bounds, which come first: over `max_names` or the server's
//!    total, a proxy holds nothing for the name (kept or not); refused because the stream
//!    asked for more than `max_unregistered` unregistered names, it holds nothing until the
//!    name is registered, and then holds it like any other;
//! 4. and no stream subscribes, on the server side, a name its proxy does not.
//!
//! [`Stream`] is `server::StreamTask` (`on_request`, `apply_request`, `respond`, `on_change`,
//! the presubscribe of load assignments on ADS) written again over the public API of
//! `cache`: keep the two in step.
//!
//! The proxies accept every response (a NACKed resource is, by design, not sent again until it
//! changes) and never ask for the wildcard (odmesh does not serve it).
//!
//! The number of cases is modest so the test stays quick in debug builds; for more, run
//! `PROPTEST_CASES=10000 cargo test -p odmesh-control --test cache_properties` (about 25 s).
//! A failure is saved in `cache_properties.proptest-regressions` beside this file and tried
//! first on later runs.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::core::v3::{address, socket_address::PortSpecifier};
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier;
use envoy_types::pb::google::protobuf::value::Kind as ValueKind;
use odmesh_control::cache::{Cache, SubscriptionLimits, Subscriptions};
use odmesh_control::model::{Snapshot, SnapshotBuilder};
use odmesh_control::registry::{Instance, Registry, Status};
use odmesh_control::xds::{self, Lookup, ResourceType, Versioned, XdsOptions};
use odmesh_names::parse_cluster_name;
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::{select, subsequence};
use proptest::test_runner::{Config, FileFailurePersistence, TestCaseError, TestRunner};
use prost::Message;
use tokio::sync::watch;

/// Cases run by default: about 2 s in a debug build on two cores.
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
    /// Requests with names over `max_names`.
    over_max_names: usize,
    /// Requests with names over the server's total.
    over_total: usize,
    /// Resources a proxy ignored, sent for a name it had dropped meanwhile.
    ignored: usize,
}

impl Seen {
    fn counts(&self) -> [(&'static str, usize); 7] {
        [
            ("a check", self.checks),
            ("a kept name held back", self.kept_held_back),
            ("a name refused as unregistered", self.refused_unregistered),
            (
                "a refused name held once registered",
                self.refused_then_held,
            ),
            ("names over max_names", self.over_max_names),
            ("names over the server's total", self.over_total),
            ("a resource sent for a dropped name", self.ignored),
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

/// The bounds of the server: per stream, and over all streams (`--xds-max-subscriptions`).
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
    /// A proxy's stream breaks; it opens another to the same control plane.
    Reconnect(usize),
    /// The control plane restarts: a new cache, and every proxy reconnects. With `Some(n)`
    /// its registry is still loading and has read only the first `n` instances so far.
    Restart(Option<usize>),
    /// One step on one stream.
    Step(usize, Step),
    /// Everything in flight is delivered until all is quiet, then the property is checked.
    Deliver,
}

#[derive(Clone, Copy, Debug)]
enum Step {
    /// The server reads the next request.
    ServerReads,
    /// The server wakes on a cache change, if there was one.
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
    ]
}

fn limits() -> impl Strategy<Value = Limits> {
    let generous = Limits {
        stream: SubscriptionLimits::default(),
        total: usize::MAX,
    };
    let small = (
        1..6usize,
        0..3usize,
        prop_oneof![Just(usize::MAX), 2..16usize],
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
        world.deliver(seen)?;
        world.check(seen).map_err(|e| format!("at the end: {e}"))
    }
}

fn registry(instances: &[Inst], loading: bool) -> Registry {
    Registry::from_iter(instances.iter().map(Inst::instance)).still_loading(loading)
}

impl Inst {
    fn instance(&self) -> Instance {
        Instance {
            app: format!("APP{}", self.id % 2),
            instance_id: format!("i{}", self.id),
            ip: IpAddr::from([10, 0, 0, self.ip]),
            port: self.port,
            secure_port: self.secure_port,
            vips: self.vips.iter().map(|v| v.to_string()).collect(),
            svips: self.svips.iter().map(|v| v.to_string()).collect(),
            status: self.status,
            zone: self.zone.map(str::to_owned),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The simulation.

/// A request as Envoy sends it, reduced to what changes subscriptions: ACKs change none on
/// the server and are left out.
#[derive(Clone, Debug)]
struct Request {
    ty: ResourceType,
    subscribe: Vec<String>,
    unsubscribe: Vec<String>,
    initial: HashMap<String, String>,
}

impl Request {
    fn subscribe(ty: ResourceType, names: Vec<String>) -> Request {
        Request {
            ty,
            subscribe: names,
            unsubscribe: Vec::new(),
            initial: HashMap::new(),
        }
    }

    fn unsubscribe(ty: ResourceType, names: Vec<String>) -> Request {
        Request {
            ty,
            subscribe: Vec::new(),
            unsubscribe: names,
            initial: HashMap::new(),
        }
    }
}

/// A delta response, and whether the registry was still loading when it was sent.
#[derive(Clone, Debug)]
struct Response {
    ty: ResourceType,
    resources: Vec<Arc<Versioned>>,
    removed: Vec<String>,
    while_loading: bool,
}

/// A simulated Envoy on one ADS stream, as its delta xDS client behaves with on-demand CDS:
/// - a response's resources replace what it holds of the names it subscribes, removals drop
///   them; anything for a name it does not subscribe is ignored;
/// - once it holds a cluster it subscribes the cluster's load assignment (its EDS service
///   name is the cluster name), and unsubscribes it when it drops the cluster;
/// - a cluster name answered with a removal stays subscribed: Envoy waits for the server;
/// - on a new stream, it subscribes again to every name, with the versions of those it holds
///   in `initial_resource_versions`.
#[derive(Debug, Default)]
struct Proxy {
    /// Cluster names on-demand CDS asked for and has not dropped.
    clusters: BTreeSet<String>,
    /// Clusters held: the last one received for each name.
    held_clusters: BTreeMap<String, Arc<Versioned>>,
    /// Load assignments held, of held clusters only.
    held_endpoints: BTreeMap<String, Arc<Versioned>>,
    /// What it told the current stream it kept, as it held it then: names it has not asked
    /// for again, nor been sent since while the registry was complete.
    kept: BTreeMap<(ResourceType, String), Arc<Versioned>>,
}

impl Proxy {
    fn held(&self, ty: ResourceType) -> &BTreeMap<String, Arc<Versioned>> {
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

    fn subscribe(&mut self, names: &[&str]) -> Vec<Request> {
        let names = distinct(names);
        for name in &names {
            self.clusters.insert(name.clone());
            self.kept.remove(&(ResourceType::Cluster, name.clone()));
        }
        vec![Request::subscribe(ResourceType::Cluster, names)]
    }

    fn unsubscribe(&mut self, names: &[&str]) -> Vec<Request> {
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
            Request::unsubscribe(ResourceType::Cluster, names),
            Request::unsubscribe(ResourceType::Endpoints, dropped),
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

    /// Applies a response; returns the load assignments to subscribe or unsubscribe.
    fn apply(&mut self, response: Response, seen: &mut Seen) -> Vec<Request> {
        let ty = response.ty;
        let (mut subscribe, mut unsubscribe) = (Vec::new(), Vec::new());
        for r in response.resources {
            if !self.subscribes(ty, &r.name) {
                seen.ignored += 1;
                continue;
            }
            if !response.while_loading {
                self.kept.remove(&(ty, r.name.clone()));
            }
            let name = r.name.clone();
            let new = match ty {
                ResourceType::Cluster => self.held_clusters.insert(name.clone(), r),
                ResourceType::Endpoints => self.held_endpoints.insert(name.clone(), r),
            }
            .is_none();
            if ty == ResourceType::Cluster && new {
                subscribe.push(name);
            }
        }
        for name in response.removed {
            if !self.subscribes(ty, &name) {
                continue;
            }
            if !response.while_loading {
                self.kept.remove(&(ty, name.clone()));
            }
            match ty {
                ResourceType::Cluster => {
                    if self.drop_cluster(&name) {
                        unsubscribe.push(name);
                    }
                }
                ResourceType::Endpoints => {
                    self.held_endpoints.remove(&name);
                }
            }
        }
        requests([
            Request::subscribe(ResourceType::Endpoints, subscribe),
            Request::unsubscribe(ResourceType::Endpoints, unsubscribe),
        ])
    }

    /// The first requests on a new stream.
    fn reconnect(&mut self) -> Vec<Request> {
        self.kept = ResourceType::ALL
            .into_iter()
            .flat_map(|ty| {
                (self.held(ty).iter()).map(move |(name, r)| ((ty, name.clone()), r.clone()))
            })
            .collect();
        let versions = |held: &BTreeMap<String, Arc<Versioned>>| {
            (held.iter())
                .map(|(name, r)| (name.clone(), r.version.clone()))
                .collect()
        };
        requests([
            Request {
                initial: versions(&self.held_clusters),
                ..Request::subscribe(
                    ResourceType::Cluster,
                    self.clusters.iter().cloned().collect(),
                )
            },
            Request {
                initial: versions(&self.held_endpoints),
                ..Request::subscribe(
                    ResourceType::Endpoints,
                    self.held_clusters.keys().cloned().collect(),
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

/// The requests that subscribe or unsubscribe something.
fn requests(all: [Request; 2]) -> Vec<Request> {
    (all.into_iter())
        .filter(|r| !r.subscribe.is_empty() || !r.unsubscribe.is_empty())
        .collect()
}

/// The control plane: a cache following the registry through a snapshot builder, as `main`
/// wires them, and the subscriptions over all its streams (the server's
/// `xds_subscriptions`, which the total bound is checked against).
struct ControlPlane {
    cache: Cache,
    builder: SnapshotBuilder,
    subscriptions: usize,
}

impl ControlPlane {
    fn start(registry: Registry, options: XdsOptions) -> ControlPlane {
        let mut builder = SnapshotBuilder::default();
        let snapshot = builder.update(Arc::new(registry)).snapshot;
        ControlPlane {
            cache: Cache::with_snapshot(options, snapshot),
            builder,
            subscriptions: 0,
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
}

/// One proxy's ADS stream as `server::StreamTask` runs it over the cache, with the messages
/// in flight both ways (each way in order, as on an HTTP/2 stream).
struct Stream {
    clusters: Subscriptions,
    endpoints: Subscriptions,
    changes: watch::Receiver<u64>,
    to_server: VecDeque<Request>,
    to_proxy: VecDeque<Response>,
    /// Cluster names refused as unregistered, until sent registered or unsubscribed.
    refused: BTreeSet<String>,
    /// Cluster names ever refused on this stream and not unsubscribed since.
    once_refused: BTreeSet<String>,
    /// Names over `max_names` or the server's total, not subscribed on the server.
    over_limit: BTreeSet<(ResourceType, String)>,
}

impl Stream {
    fn open(cp: &ControlPlane, limits: SubscriptionLimits) -> Stream {
        let mut changes = cp.cache.changes();
        changes.borrow_and_update();
        Stream {
            clusters: Subscriptions::with_limits(limits),
            endpoints: Subscriptions::with_limits(limits),
            changes,
            to_server: VecDeque::new(),
            to_proxy: VecDeque::new(),
            refused: BTreeSet::new(),
            once_refused: BTreeSet::new(),
            over_limit: BTreeSet::new(),
        }
    }

    /// The stream ends: what `StreamTask`'s `drop` does.
    fn close(&self, cp: &mut ControlPlane) {
        for subs in [&self.clusters, &self.endpoints] {
            cp.cache.unwatch(subs.names());
            cp.subscriptions -= subs.len();
        }
    }

    fn subs(&self, ty: ResourceType) -> &Subscriptions {
        match ty {
            ResourceType::Cluster => &self.clusters,
            ResourceType::Endpoints => &self.endpoints,
        }
    }

    fn subs_mut(&mut self, ty: ResourceType) -> &mut Subscriptions {
        match ty {
            ResourceType::Cluster => &mut self.clusters,
            ResourceType::Endpoints => &mut self.endpoints,
        }
    }

    /// The server reads one request: `StreamTask::on_request`. Returns whether there was one.
    fn read_request(
        &mut self,
        cp: &mut ControlPlane,
        limits: &Limits,
        seen: &mut Seen,
    ) -> Result<bool, String> {
        let Some(req) = self.to_server.pop_front() else {
            return Ok(false);
        };
        let ty = req.ty;
        let before: BTreeSet<String> = self.subs(ty).names().map(str::to_owned).collect();
        let room = limits.total.saturating_sub(cp.subscriptions);
        let change =
            self.subs_mut(ty)
                .update_within(&req.subscribe, &req.unsubscribe, &req.initial, room);
        cp.subscriptions += change.added.len();
        cp.subscriptions -= change.removed.len();
        cp.cache.watch(&change.added);
        cp.cache.unwatch(change.removed.iter().map(String::as_str));
        for name in &req.subscribe {
            let key = (ty, name.clone());
            if before.contains(name) || change.added.contains(name) {
                self.over_limit.remove(&key);
            } else {
                self.over_limit.insert(key);
            }
        }
        if ty == ResourceType::Cluster {
            let withdrawn = self.endpoints.withdraw_presubscribed(&change.removed);
            cp.subscriptions -= withdrawn.len();
            cp.cache.unwatch(withdrawn.iter().map(String::as_str));
        }
        for name in &req.unsubscribe {
            self.over_limit.remove(&(ty, name.clone()));
            if ty == ResourceType::Cluster {
                self.refused.remove(name);
                self.once_refused.remove(name);
            }
        }
        if change.over_limit > 0 {
            let full = self.subs(ty).len() >= limits.stream.max_names;
            if full {
                seen.over_max_names += 1;
            } else if change.added.len() == room {
                seen.over_total += 1;
            } else {
                return Err(format!(
                    "{} {} names refused with room left: {} subscribed, {} of {room} room used",
                    change.over_limit,
                    ty.as_str(),
                    self.subs(ty).len(),
                    change.added.len()
                ));
            }
        }
        if ty == ResourceType::Cluster {
            for name in &change.added {
                if cp.cache.is_registered(name) == Some(false)
                    && !self.clusters.admit_unregistered(name)
                {
                    seen.refused_unregistered += 1;
                    self.refused.insert(name.clone());
                    self.once_refused.insert(name.clone());
                }
            }
        }
        let fresh: Vec<String> = (change.added.into_iter())
            .filter(|name| !req.initial.contains_key(name))
            .collect();
        self.respond(cp, ty);
        if ty == ResourceType::Cluster && !fresh.is_empty() {
            let fresh: Vec<String> = (fresh.into_iter())
                .filter(|name| !self.clusters.is_refused(name) && parse_cluster_name(name).is_ok())
                .collect();
            let presubscribed = self.endpoints.presubscribe(&fresh);
            cp.subscriptions += presubscribed.len();
            cp.cache.watch(&presubscribed);
            for name in &presubscribed {
                self.over_limit
                    .remove(&(ResourceType::Endpoints, name.clone()));
            }
            self.respond(cp, ResourceType::Endpoints);
        }
        Ok(true)
    }

    /// The server wakes on a cache change: `StreamTask::on_change`. Returns whether there
    /// was one.
    fn wake(&mut self, cp: &ControlPlane) -> bool {
        if !self.changes.has_changed().unwrap_or(false) {
            return false;
        }
        self.changes.borrow_and_update();
        for ty in ResourceType::ALL {
            self.respond(cp, ty);
        }
        true
    }

    /// `StreamTask::respond`: queues what brings the proxy's `ty` up to date, if anything.
    fn respond(&mut self, cp: &ControlPlane, ty: ResourceType) {
        let subs = self.subs_mut(ty);
        if subs.is_idle() {
            return;
        }
        let delta = cp.cache.delta(ty, subs);
        if delta.is_empty() {
            return;
        }
        subs.record(&delta);
        if ty == ResourceType::Cluster {
            for r in delta.send.iter().filter(|r| r.registered) {
                self.refused.remove(&r.name);
            }
        }
        self.to_proxy.push_back(Response {
            ty,
            resources: delta.send,
            removed: delta.remove,
            while_loading: !cp.cache.snapshot().is_complete(),
        });
    }
}

/// Everything: the registry as its source has it, the control plane, the proxies and their
/// streams (stream `i` is proxy `i`'s).
struct World {
    options: XdsOptions,
    limits: Limits,
    registry: Vec<Inst>,
    loading: bool,
    cp: ControlPlane,
    proxies: Vec<Proxy>,
    streams: Vec<Stream>,
}

impl World {
    fn new(scenario: &Scenario) -> World {
        let options = XdsOptions::new(Some("/ca.pem".into()));
        let cp = ControlPlane::start(registry(&scenario.registry, false), options.clone());
        let streams = (0..scenario.proxies)
            .map(|_| Stream::open(&cp, scenario.limits.stream))
            .collect();
        World {
            options,
            limits: scenario.limits,
            registry: scenario.registry.clone(),
            loading: false,
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
                self.streams[*p].to_server.extend(requests);
            }
            Op::Unsubscribe(p, names) => {
                let requests = self.proxies[*p].unsubscribe(names);
                self.streams[*p].to_server.extend(requests);
            }
            Op::Registry(change) => {
                self.change_registry(change);
                self.cp.registry_changed(self.registry());
            }
            Op::Reconnect(p) => {
                self.streams[*p].close(&mut self.cp);
                self.reconnect(*p);
            }
            Op::Restart(loaded) => {
                if let Some(loaded) = loaded {
                    self.registry.truncate(*loaded);
                    self.loading = true;
                }
                self.cp = ControlPlane::start(self.registry(), self.options.clone());
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
        }
        Ok(())
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
        let mut stream = Stream::open(&self.cp, self.limits.stream);
        stream.to_server.extend(self.proxies[p].reconnect());
        self.streams[p] = stream;
    }

    /// One step on stream `p`; returns whether anything happened.
    fn step(&mut self, p: usize, step: Step, seen: &mut Seen) -> Result<bool, String> {
        let stream = &mut self.streams[p];
        match step {
            Step::ServerReads => stream.read_request(&mut self.cp, &self.limits, seen),
            Step::ServerWakes => Ok(stream.wake(&self.cp)),
            Step::ProxyReads => {
                let Some(response) = stream.to_proxy.pop_front() else {
                    return Ok(false);
                };
                let requests = self.proxies[p].apply(response, seen);
                stream.to_server.extend(requests);
                Ok(true)
            }
        }
    }

    /// Steps every stream in turn until nothing is in flight and no server has a change to
    /// wake on.
    fn deliver(&mut self, seen: &mut Seen) -> Result<(), String> {
        for _ in 0..10_000 {
            let mut busy = false;
            for p in 0..self.proxies.len() {
                for step in [Step::ServerReads, Step::ServerWakes, Step::ProxyReads] {
                    busy |= self.step(p, step, seen)?;
                }
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
        let registry = self.registry();
        // A full build, not the control plane's incremental one.
        let snapshot = Snapshot::from_registry(&registry);
        let loading = !registry.is_complete();
        for (p, (proxy, stream)) in self.proxies.iter().zip(&self.streams).enumerate() {
            for ty in ResourceType::ALL {
                let held = proxy.held(ty);
                if let Some(name) = held.keys().find(|name| !proxy.subscribes(ty, name)) {
                    return Err(format!(
                        "proxy {p} holds {} {name}, which it does not subscribe",
                        ty.as_str()
                    ));
                }
                let subscribed: Vec<&String> = match ty {
                    ResourceType::Cluster => proxy.clusters.iter().collect(),
                    ResourceType::Endpoints => proxy.held_clusters.keys().collect(),
                };
                for name in subscribed {
                    let key = (ty, name.clone());
                    let built =
                        xds::build(name, Lookup::in_snapshot(&snapshot, name), &self.options)
                            .ok()
                            .map(|r| Arc::new(r.get(ty).clone()));
                    let kept = proxy.kept.get(&key).filter(|_| loading);
                    let refused = ty == ResourceType::Cluster
                        && stream.refused.contains(name)
                        && built.as_ref().is_some_and(|b| !b.registered);
                    // The bounds come first: the restart guard keeps what the server
                    // tracks, and a name over a bound is not tracked.
                    let (want, why) = if stream.over_limit.contains(&key) {
                        (None, "over a bound")
                    } else if let Some(kept) = kept {
                        if !same(Some(kept), built.as_deref()) {
                            seen.kept_held_back += 1;
                        }
                        (Some(kept.clone()), "kept while the registry is loading")
                    } else if refused {
                        (None, "unregistered, refused over max_unregistered")
                    } else {
                        (built, "what the registry says")
                    };
                    let have = held.get(name);
                    if !same(have.map(|r| &**r), want.as_deref()) {
                        return Err(format!(
                            "proxy {p}, {} {name}: holds {}, but should hold {} ({why})",
                            ty.as_str(),
                            describe(have.map(|r| &**r)),
                            describe(want.as_deref()),
                        ));
                    }
                    if ty == ResourceType::Cluster
                        && stream.once_refused.contains(name)
                        && have.is_some_and(|r| r.registered)
                    {
                        seen.refused_then_held += 1;
                    }
                }
                if let Some(name) =
                    (stream.subs(ty).names()).find(|name| !proxy.subscribes(ty, name))
                {
                    return Err(format!(
                        "proxy {p}'s stream subscribes {} {name}, which the proxy does not",
                        ty.as_str()
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Whether two resources are the same: name, version, registration, and message. The
/// message is compared decoded: prost writes the cluster's metadata map in `HashMap`
/// order, so two builds of one cluster may differ in their bytes.
fn same(a: Option<&Versioned>, b: Option<&Versioned>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => {
            a.name == b.name
                && a.version == b.version
                && a.registered == b.registered
                && a.resource.type_url == b.resource.type_url
                && if a.resource.type_url == xds::CLUSTER_TYPE_URL {
                    decode::<Cluster>(a).is_some_and(|c| Some(c) == decode::<Cluster>(b))
                } else {
                    decode::<ClusterLoadAssignment>(a)
                        .is_some_and(|c| Some(c) == decode::<ClusterLoadAssignment>(b))
                }
        }
        _ => false,
    }
}

fn decode<M: Message + Default>(r: &Versioned) -> Option<M> {
    M::decode(r.resource.value.as_slice()).ok()
}

/// A resource in a few words: its version and what it says.
fn describe(r: Option<&Versioned>) -> String {
    let Some(r) = r else {
        return "nothing".into();
    };
    let what = if r.resource.type_url == xds::CLUSTER_TYPE_URL {
        decode::<Cluster>(r)
            .and_then(|c| c.metadata)
            .and_then(|m| m.filter_metadata.get(xds::METADATA_NAMESPACE).cloned())
            .and_then(|s| s.fields.get("reason").cloned())
            .and_then(|v| match v.kind {
                Some(ValueKind::StringValue(s)) => Some(format!("\"{s}\"")),
                _ => None,
            })
            .unwrap_or_else(|| "a cluster without a reason".into())
    } else {
        let endpoints: Vec<String> = decode::<ClusterLoadAssignment>(r)
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
    let registered = if r.registered { "" } else { ", unregistered" };
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
