//! xDS streams (`odmesh_control::session::Session`, as the server runs one per gRPC stream)
//! over one cache, under small bounds: any sequence of delta requests of either type (names of
//! a small alphabet: registered and unregistered VIPs and SVIPs, names that are not odmesh
//! cluster names, the wildcard `*`, any text; unsubscribes, kept versions, ACKs and NACKs, a
//! node or none, a type URL or another), the changes the cache puts in a stream's inbox,
//! the server's periodic look (names waiting for room, idle clusters sent ahead), registry
//! and policy changes, load reports, and streams opened (ADS, CDS, EDS, from three source
//! addresses) and closed. Checks, after every operation:
//! - each stream subscribes at most `max_names` names of each type, and counts (by what the
//!   gauges moved while it ran) no more than it subscribes, less those waiting for room;
//! - the gauges (`xds_cluster_subscriptions`, `xds_subscriptions`) are the sums of what the
//!   open streams count, the admission counts for each source what its streams count
//!   (`used_by`), and `room` is what the bound leaves of their sum; a registry or policy
//!   change counts nothing;
//! - no operation takes a source's count over its share, nor (but for names a request says
//!   its proxy kept, which need room only from their source's share) the sum over the bound,
//!   further than it was (a refused name, once registered, takes room like any other: this
//!   target found that it did not; docs/fuzzing.md, "What it found");
//! - a closed stream gives back exactly what it counted;
//! - the cache watches no name when no stream counts one;
//! - a stream is sent only the types its service serves, and only resources of odmesh
//!   cluster names it subscribes; with large-VIP collections on (every registered VIP split),
//!   collection members only on ADS, only of load assignments it subscribes, and it holds no
//!   more collections than it subscribes load assignments (each VIP here has one locality);
//! - and, every stream closed at the end, the admission has all its room, no source uses
//!   any, the gauges are 0 and the cache watches nothing.
#![no_main]

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use arbitrary::Arbitrary;
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse,
};
use envoy_types::pb::google::rpc;
use libfuzzer_sys::fuzz_target;
use odmesh_control::cache::{Cache, Changes, Inbox};
use odmesh_control::metrics::Metrics;
use odmesh_control::model::Snapshot;
use odmesh_control::policy::Policy;
use odmesh_control::prewarm::{self, History, Prewarm};
use odmesh_control::session::{Admission, Context, Eviction, Service, Session, SubscriptionLimits};
use odmesh_control::xds::leds::{self, LB_ENDPOINT_TYPE_URL};
use odmesh_control::xds::{ResourceType, XdsOptions};
use odmesh_names::parse_cluster_name;
use odmesh_registry::{Instance, Protocol, Registry, Status};

/// The cluster names the registry may list.
const REGISTRABLE: &[&str] = &["a.vip", "b.vip", "c.vip", "d.vip", "a.svip", "b.svip"];
/// The names requests pick from (besides any text): those, VIPs never registered, names that
/// are not odmesh cluster names, the wildcard.
const NAMES: &[&str] = &[
    "a.vip",
    "b.vip",
    "c.vip",
    "d.vip",
    "a.svip",
    "b.svip",
    "e.vip",
    "e.svip",
    "xds_cluster",
    "A.vip",
    "*",
    "",
    "a..vip",
];
/// The calling services (`node.cluster`) of the proxies.
const CALLERS: &[&str] = &["svc-a", "svc-b", ""];
/// The policies the control plane may be given: none, one per VIP, a caller's own override
/// (its proxies get their own variant), new defaults.
const POLICIES: &[&str] = &[
    "",
    "vips: {a: {retries: {count: 1}}}",
    "vips: {a: {callers: {svc-a: {request_timeout: 1s}}}, b: {load_balancing: least_request}}",
    "defaults: {connect_timeout: 2s}",
];
/// The source addresses streams come from.
const SOURCES: [[u8; 4]; 3] = [[10, 9, 0, 1], [10, 9, 0, 2], [10, 9, 0, 3]];
/// Streams open at once, at most.
const SLOTS: usize = 4;
/// Operations per input, names per list, at most.
const MAX_OPS: usize = 64;
const MAX_NAMES: usize = 8;

#[derive(Arbitrary, Debug)]
struct Input {
    setup: Setup,
    ops: Vec<Op>,
}

/// The bounds and the registry at start.
#[derive(Arbitrary, Debug)]
struct Setup {
    /// `max_names`: 1 to 5.
    max_names: u8,
    /// `max_unregistered`: 0 to 2.
    max_unregistered: u8,
    /// The bound over all streams: 0 to 7.
    max: u8,
    /// The share of one source: 1 to 6; none if `None`.
    per_source: Option<u8>,
    /// Prewarm (and eviction of idle clusters sent ahead) on.
    prewarm: bool,
    /// Which of [`REGISTRABLE`] are registered (one bit each).
    registered: u8,
    /// The registry is still loading.
    loading: bool,
    /// Every registered VIP sends its endpoints one by one (`--leds-min-endpoints 1`).
    leds: bool,
}

#[derive(Arbitrary, Debug)]
enum Op {
    /// A stream opens in `slot` (the one there closes first).
    Open {
        slot: u8,
        service: Svc,
        source: u8,
    },
    Request {
        slot: u8,
        request: Request,
    },
    /// The stream wakes on its inbox (the cache's changes for it).
    Change {
        slot: u8,
    },
    /// The server's periodic look: names waiting for room, then idle clusters sent ahead.
    Tick {
        slot: u8,
    },
    Close {
        slot: u8,
    },
    Registry(RegistryChange),
    Policy(u8),
    /// A load report of the stream's proxy: these clusters carried requests.
    Report {
        slot: u8,
        names: Vec<Name>,
    },
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Svc {
    Ads,
    Cds,
    Eds,
}

#[derive(Arbitrary, Debug)]
struct Request {
    type_url: TypeUrl,
    node: Option<NodeOf>,
    subscribe: Vec<Name>,
    unsubscribe: Vec<Name>,
    kept: Vec<(Name, Version)>,
    nonce: Nonce,
    /// `error_detail` (a NACK, with a nonce) with this message.
    nack: Option<String>,
}

#[derive(Arbitrary, Debug)]
enum TypeUrl {
    Clusters,
    Endpoints,
    /// A large VIP's collection members (`LbEndpoint`).
    Collections,
    Empty,
    Other(String),
}

#[derive(Arbitrary, Debug)]
enum NodeOf {
    /// `proxy-<slot>` of one of [`CALLERS`].
    Caller(u8),
    Other {
        id: String,
        cluster: String,
    },
}

#[derive(Arbitrary, Debug)]
enum Name {
    Known(u8),
    Other(String),
    /// The collection of locality `locality` of [`NAMES`]`[name]`, as its load assignment
    /// names it on this stream now (or under another epoch), its locality written as odmesh
    /// writes it or with a leading `0` (another name for the same locality).
    Glob {
        name: u8,
        locality: u8,
        own_epoch: bool,
        alias: bool,
    },
}

/// What names a collection on a stream: the stream's epoch, and the version of each load
/// assignment as the stream's caller gets it now.
struct Globs<'a> {
    epoch: String,
    cache: &'a Cache,
    caller: String,
}

#[derive(Arbitrary, Debug)]
enum Version {
    /// The version the stream last sent of that name and type, if any.
    Sent,
    Other(String),
}

#[derive(Arbitrary, Debug)]
enum Nonce {
    None,
    /// The stream's last response's.
    Last,
    Other(String),
}

#[derive(Arbitrary, Debug)]
enum RegistryChange {
    /// One of [`REGISTRABLE`] registered or gone.
    Toggle(u8),
    /// Its instance moves to another address: its resources change.
    Move(u8),
    Loading(bool),
}

impl Name {
    /// The name on the stream `globs` describes.
    fn text(&self, globs: &Globs<'_>) -> String {
        match self {
            Name::Known(i) => NAMES[usize::from(*i) % NAMES.len()].to_owned(),
            Name::Other(s) => s.clone(),
            Name::Glob {
                name,
                locality,
                own_epoch,
                alias,
            } => {
                let cluster = NAMES[usize::from(*name) % NAMES.len()];
                let epoch = if *own_epoch { &globs.epoch } else { "0.0" };
                let version = (globs.cache)
                    .resource_for(&globs.caller, ResourceType::Endpoints, cluster)
                    .map_or_else(String::new, |v| v.version.to_string());
                let generation = leds::generation(epoch, &version);
                let name = leds::collection(cluster, &generation, usize::from(*locality % 3));
                match alias {
                    true => name.replace(
                        &format!("/{}/*", locality % 3),
                        &format!("/0{}/*", locality % 3),
                    ),
                    false => name,
                }
            }
        }
    }
}

fn names(names: &[Name], globs: &Globs<'_>) -> Vec<String> {
    names
        .iter()
        .take(MAX_NAMES)
        .map(|n| n.text(globs))
        .collect()
}

/// What every stream shares: the cache, the metrics, the bounds, the history.
struct Plane {
    limits: SubscriptionLimits,
    max: usize,
    per_source: Option<usize>,
    cache: Cache,
    metrics: Metrics,
    admission: Admission,
    prewarm: Option<Prewarm>,
    /// Per name of [`REGISTRABLE`], the address of its instance, if registered.
    registry: Vec<Option<u8>>,
    loading: bool,
}

/// What the plane counts: the gauges and each source's names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Counts {
    clusters: i64,
    all: i64,
    by_source: [i64; SOURCES.len()],
}

impl Counts {
    fn used(&self) -> i64 {
        self.by_source.iter().sum()
    }
}

impl Plane {
    fn new(setup: &Setup) -> Plane {
        let limits = SubscriptionLimits {
            max_names: 1 + usize::from(setup.max_names % 5),
            max_unregistered: usize::from(setup.max_unregistered % 3),
        };
        let max = usize::from(setup.max % 8);
        let per_source = setup.per_source.map(|n| 1 + usize::from(n % 6));
        let admission = Admission::with_share(max, per_source.unwrap_or(usize::MAX));
        let registry = (0..REGISTRABLE.len())
            .map(|i| (setup.registered & (1 << i) != 0).then_some(1))
            .collect();
        let prewarm = setup.prewarm.then(|| {
            let limits = prewarm::Limits {
                max_per_service: 3,
                max_entries: prewarm::DEFAULT_MAX_ENTRIES,
                max_age: Duration::from_secs(7 * 24 * 3600),
            };
            Prewarm::new(
                limits,
                None,
                History::default(),
                Arc::new(Metrics::default()),
            )
        });
        let mut plane = Plane {
            limits,
            max,
            per_source,
            cache: Cache::new(XdsOptions {
                leds_min_endpoints: usize::from(setup.leds),
                ..XdsOptions::new(Some("/ca.pem".into()))
            }),
            metrics: Metrics::default(),
            admission,
            prewarm,
            registry,
            loading: setup.loading,
        };
        plane.publish();
        plane
    }

    fn context(&self) -> Context<'_> {
        Context {
            cache: &self.cache,
            metrics: &self.metrics,
            admission: &self.admission,
            prewarm: self.prewarm.as_ref(),
            eviction: self.prewarm.as_ref().map(|_| Eviction {
                idle: Duration::ZERO,
                interval: Duration::from_secs(1),
            }),
        }
    }

    /// The registry as it is now, into the cache.
    fn publish(&mut self) {
        let instances = (REGISTRABLE.iter().zip(&self.registry))
            .enumerate()
            .filter_map(|(i, (name, ip))| Some(instance(i, name, (*ip)?)));
        let registry = Registry::from_iter(instances).still_loading(self.loading);
        self.cache
            .set_snapshot(Arc::new(Snapshot::from_registry(&registry)));
    }

    fn counts(&self) -> Counts {
        let gauge = |g: &std::sync::atomic::AtomicU64| {
            i64::try_from(g.load(Ordering::Relaxed)).expect("a gauge below 2^63")
        };
        Counts {
            clusters: gauge(&self.metrics.xds_cluster_subscriptions),
            all: gauge(&self.metrics.xds_subscriptions),
            by_source: SOURCES.map(|ip| self.admission.used_by(IpAddr::from(ip)) as i64),
        }
    }
}

/// The instance serving `name` (a VIP or an SVIP) at 10.0.0.`ip`.
fn instance(i: usize, name: &str, ip: u8) -> Instance {
    let (vip, secure) = match name.strip_suffix(".svip") {
        Some(svip) => (svip, true),
        None => (name.trim_end_matches(".vip"), false),
    };
    Instance {
        app: format!("APP{i}").into(),
        instance_id: format!("i{i}").into(),
        ip: IpAddr::from([10, 0, 0, ip]),
        port: (!secure).then_some(8080),
        secure_port: secure.then_some(8443),
        vips: if secure { vec![] } else { vec![vip.into()] },
        svips: if secure { vec![vip.into()] } else { vec![] },
        status: Status::Up,
        zone: None,
        protocol: Protocol::Auto,
    }
}

/// One open stream, and what the checks know of it.
struct Stream {
    session: Session,
    inbox: Arc<Inbox>,
    service: Service,
    /// Which of [`SOURCES`].
    source: usize,
    /// What it counts, by the gauges' moves while it ran.
    clusters: i64,
    all: i64,
    last_nonce: String,
}

struct World {
    plane: Plane,
    streams: Vec<Option<Stream>>,
    /// Per slot, the version last sent of each name, per type, on any of its streams: what a
    /// proxy that reconnects in that slot may say it kept.
    sent: Vec<BTreeMap<(ResourceType, String), String>>,
    next_id: u64,
}

fuzz_target!(|input: Input| {
    let mut world = World {
        plane: Plane::new(&input.setup),
        streams: (0..SLOTS).map(|_| None).collect(),
        sent: vec![BTreeMap::new(); SLOTS],
        next_id: 1,
    };
    for op in input.ops.iter().take(MAX_OPS) {
        world.apply(op);
        world.check();
    }
    for slot in 0..SLOTS {
        world.close(slot);
    }
    world.check();
    let plane = &world.plane;
    assert_eq!(plane.admission.room(), plane.max, "room not given back");
    let counts = plane.counts();
    assert_eq!(
        counts,
        Counts {
            clusters: 0,
            all: 0,
            by_source: [0; SOURCES.len()]
        },
        "every stream closed, something is still counted"
    );
    assert_eq!(
        plane.cache.watched(),
        0,
        "every stream closed, names watched"
    );
});

impl World {
    fn apply(&mut self, op: &Op) {
        let slot = |s: &u8| usize::from(*s) % SLOTS;
        match op {
            Op::Open {
                slot: s,
                service,
                source,
            } => {
                let s = slot(s);
                self.close(s);
                let id = self.next_id;
                self.next_id += 1;
                let service = match service {
                    Svc::Ads => Service::Ads,
                    Svc::Cds => Service::Cds,
                    Svc::Eds => Service::Eds,
                };
                let source = usize::from(*source) % SOURCES.len();
                let session = Session::new(id, service, self.plane.limits)
                    .from_source(Some(IpAddr::from(SOURCES[source])));
                self.streams[s] = Some(Stream {
                    session,
                    inbox: self.plane.cache.open_stream(id),
                    service,
                    source,
                    clusters: 0,
                    all: 0,
                    last_nonce: String::new(),
                });
            }
            Op::Request { slot: s, request } => {
                let s = slot(s);
                let Some(stream) = &mut self.streams[s] else {
                    return;
                };
                let req = stream.request(s, request, &self.sent[s], &self.plane.cache);
                let kept = !req.initial_resource_versions.is_empty();
                self.on_stream(s, kept, |session, cx| session.on_request(cx, req));
            }
            Op::Change { slot: s } => {
                let s = slot(s);
                let Some(stream) = &self.streams[s] else {
                    return;
                };
                let changes = stream.inbox.take();
                self.on_stream(s, false, |session, cx| session.on_change(cx, changes));
            }
            Op::Tick { slot: s } => {
                // As the server's ticker: only while names wait or clusters may be evicted.
                self.on_stream(slot(s), false, |session, cx| {
                    if session.is_waiting() {
                        let responses = session.on_change(cx, Changes::default());
                        if responses.iter().any(Option::is_some) {
                            return responses;
                        }
                    }
                    if session.may_evict(cx) {
                        return [session.evict_idle(cx), None];
                    }
                    [None, None]
                });
            }
            Op::Close { slot: s } => self.close(slot(s)),
            Op::Registry(change) => {
                let plane = &mut self.plane;
                match change {
                    RegistryChange::Toggle(i) => {
                        let at = &mut plane.registry[usize::from(*i) % REGISTRABLE.len()];
                        *at = if at.is_some() { None } else { Some(1) };
                    }
                    RegistryChange::Move(i) => {
                        let at = &mut plane.registry[usize::from(*i) % REGISTRABLE.len()];
                        *at = at.map(|ip| ip % 200 + 1);
                    }
                    RegistryChange::Loading(loading) => plane.loading = *loading,
                }
                self.unchanged(|plane| plane.publish());
            }
            Op::Policy(i) => {
                let yaml = POLICIES[usize::from(*i) % POLICIES.len()];
                let policy = Policy::parse(yaml.as_bytes()).expect("a valid policy");
                self.unchanged(|plane| {
                    plane.cache.set_policy(Arc::new(policy));
                });
            }
            Op::Report {
                slot: s,
                names: reported,
            } => {
                let (Some(stream), Some(prewarm)) = (&self.streams[slot(s)], &self.plane.prewarm)
                else {
                    return;
                };
                let status = stream.session.status();
                let reported = names(reported, &stream.globs(&self.plane.cache));
                let reported: Vec<&str> = reported.iter().map(String::as_str).collect();
                prewarm.report(
                    &status.node_id,
                    &status.node_cluster,
                    &reported,
                    Duration::from_secs(1),
                );
            }
        }
    }

    /// Runs `work`, which must count nothing.
    fn unchanged(&mut self, work: impl FnOnce(&mut Plane)) {
        let before = self.plane.counts();
        work(&mut self.plane);
        assert_eq!(
            self.plane.counts(),
            before,
            "a change outside every stream changed the counts"
        );
    }

    /// Runs `work` on the session in `slot`, if one is open, with its request carrying kept
    /// versions or not; follows what it counts and checks what it sends.
    fn on_stream(
        &mut self,
        slot: usize,
        kept: bool,
        work: impl FnOnce(&mut Session, &Context<'_>) -> [Option<DeltaDiscoveryResponse>; 2],
    ) {
        let Some(stream) = &mut self.streams[slot] else {
            return;
        };
        let plane = &self.plane;
        let before = plane.counts();
        let [clusters, endpoints] = work(&mut stream.session, &plane.context());
        // As the server does: a collections' response due goes after the load assignments.
        let responses = [clusters, endpoints, stream.session.take_collections()];
        let after = plane.counts();
        stream.counted(&before, &after);
        stream.sent(responses.into_iter().flatten(), &mut self.sent[slot]);
        // The bounds: an operation takes a source's count over its share, or the sum of all
        // sources over the bound, no further than it was; but names a request's client kept
        // need no room from other sources (only from their own source's share). A refused
        // name sent once registered takes room like any other.
        let source = stream.source;
        if let Some(share) = plane.per_source {
            let (was, is) = (before.by_source[source], after.by_source[source]);
            assert!(
                is <= (share as i64).max(was),
                "a source's streams count {is} cluster names ({was} before), over its share of \
                 {share}"
            );
        }
        let max = plane.max as i64;
        let allowed = if kept {
            i64::MAX
        } else {
            max.max(before.used())
        };
        assert!(
            after.used() <= allowed,
            "the streams count {} cluster names ({} before), over the bound of {max}, and the \
             request kept none",
            after.used(),
            before.used()
        );
    }

    /// Closes the stream in `slot`, if one is open: it gives back all it counted.
    fn close(&mut self, slot: usize) {
        let Some(stream) = self.streams[slot].take() else {
            return;
        };
        let plane = &self.plane;
        let before = plane.counts();
        stream.session.close(&plane.context());
        let after = plane.counts();
        assert_eq!(
            (after.clusters - before.clusters, after.all - before.all),
            (-stream.clusters, -stream.all),
            "a closed stream gave back other than it counted"
        );
        for (i, (a, b)) in after.by_source.iter().zip(before.by_source).enumerate() {
            let want = if i == stream.source {
                -stream.clusters
            } else {
                0
            };
            assert_eq!(
                a - b,
                want,
                "a closed stream gave back another source's names"
            );
        }
    }

    /// What holds whatever happened.
    fn check(&self) {
        let plane = &self.plane;
        let counts = plane.counts();
        let limits = plane.limits;
        let open = || self.streams.iter().flatten();
        let mut names = BTreeSet::new();
        for stream in open() {
            let status = stream.session.status();
            assert!(
                status.clusters.len() <= limits.max_names
                    && status.endpoints.len() <= limits.max_names,
                "a stream subscribes {} clusters and {} load assignments, over max_names {}",
                status.clusters.len(),
                status.endpoints.len(),
                limits.max_names
            );
            let endpoints = stream.all - stream.clusters;
            let counted_clusters = status.clusters.len() - status.waiting;
            assert!(
                (0..=counted_clusters as i64).contains(&stream.clusters)
                    && (0..=status.endpoints.len() as i64).contains(&endpoints),
                "a stream counts {} clusters and {endpoints} load assignments, but subscribes \
                 {} and {} ({} waiting)",
                stream.clusters,
                status.clusters.len(),
                status.endpoints.len(),
                status.waiting
            );
            names.extend(status.clusters);
            names.extend(status.endpoints);
        }
        let sum = |f: fn(&Stream) -> i64| open().map(f).sum::<i64>();
        assert_eq!(
            (counts.clusters, counts.all),
            (sum(|s| s.clusters), sum(|s| s.all)),
            "the gauges are not the sums over the open streams"
        );
        for (i, used) in counts.by_source.iter().enumerate() {
            let streams: i64 = open().filter(|s| s.source == i).map(|s| s.clusters).sum();
            assert_eq!(
                *used, streams,
                "the admission's count of a source is not its streams'"
            );
        }
        let used = usize::try_from(counts.used()).expect("counts are not negative");
        assert_eq!(
            plane.admission.room(),
            plane.max.saturating_sub(used),
            "the room is not what the bound leaves"
        );
        let watched = plane.cache.watched();
        assert_eq!(
            watched == 0,
            counts.all == 0,
            "the cache watches {watched} names, the streams count {}",
            counts.all
        );
        assert!(
            watched <= names.len(),
            "the cache watches {watched} names, the streams subscribe {}",
            names.len()
        );
    }
}

impl Stream {
    /// What names a collection on this stream now.
    fn globs<'a>(&self, cache: &'a Cache) -> Globs<'a> {
        Globs {
            epoch: self.session.epoch(),
            cache,
            caller: self.session.status().node_cluster,
        }
    }

    /// The delta request `request` on this stream in slot `slot`.
    fn request(
        &self,
        slot: usize,
        request: &Request,
        sent: &BTreeMap<(ResourceType, String), String>,
        cache: &Cache,
    ) -> DeltaDiscoveryRequest {
        let type_url = match &request.type_url {
            TypeUrl::Clusters => ResourceType::Cluster.type_url().to_owned(),
            TypeUrl::Endpoints => ResourceType::Endpoints.type_url().to_owned(),
            TypeUrl::Collections => LB_ENDPOINT_TYPE_URL.to_owned(),
            TypeUrl::Empty => String::new(),
            TypeUrl::Other(url) => url.clone(),
        };
        let ty = self.type_of(&type_url);
        let globs = self.globs(cache);
        let node = request.node.as_ref().map(|node| match node {
            NodeOf::Caller(i) => Node {
                id: format!("proxy-{slot}"),
                cluster: CALLERS[usize::from(*i) % CALLERS.len()].to_owned(),
                ..Default::default()
            },
            NodeOf::Other { id, cluster } => Node {
                id: id.clone(),
                cluster: cluster.clone(),
                ..Default::default()
            },
        });
        let initial_resource_versions = (request.kept.iter().take(MAX_NAMES))
            .map(|(name, version)| {
                let name = name.text(&globs);
                let version = match version {
                    Version::Sent => ty
                        .and_then(|ty| sent.get(&(ty, name.clone())).cloned())
                        .unwrap_or_default(),
                    Version::Other(v) => v.clone(),
                };
                (name, version)
            })
            .collect();
        let response_nonce = match &request.nonce {
            Nonce::None => String::new(),
            Nonce::Last => self.last_nonce.clone(),
            Nonce::Other(n) => n.clone(),
        };
        DeltaDiscoveryRequest {
            node,
            type_url,
            resource_names_subscribe: names(&request.subscribe, &globs),
            resource_names_unsubscribe: names(&request.unsubscribe, &globs),
            initial_resource_versions,
            response_nonce,
            error_detail: request.nack.as_ref().map(|message| rpc::Status {
                code: 13,
                message: message.clone(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// The type of a request for `type_url` on this stream (`None`: ignored).
    fn type_of(&self, type_url: &str) -> Option<ResourceType> {
        let ty = match (self.service, type_url) {
            (Service::Cds, "") => return Some(ResourceType::Cluster),
            (Service::Eds, "") => return Some(ResourceType::Endpoints),
            _ => ResourceType::from_type_url(type_url)?,
        };
        match self.service {
            Service::Ads => Some(ty),
            Service::Cds => (ty == ResourceType::Cluster).then_some(ty),
            Service::Eds => (ty == ResourceType::Endpoints).then_some(ty),
        }
    }

    /// Follows what the stream counted while it ran, from the counts `before` and `after`:
    /// only its own source's count moved, as the cluster gauge did.
    fn counted(&mut self, before: &Counts, after: &Counts) {
        let clusters = after.clusters - before.clusters;
        for (i, (a, b)) in after.by_source.iter().zip(before.by_source).enumerate() {
            let want = if i == self.source { clusters } else { 0 };
            assert_eq!(
                a - b,
                want,
                "a stream's source count moved by {}, its cluster gauge by {clusters} (source {i}, the stream's {})",
                a - b,
                self.source
            );
        }
        self.clusters += clusters;
        self.all += after.all - before.all;
    }

    /// Checks and notes what the stream sent (into `sent`, its slot's versions): types its
    /// service serves, resources of odmesh cluster names it subscribes.
    fn sent(
        &mut self,
        responses: impl Iterator<Item = DeltaDiscoveryResponse>,
        sent: &mut BTreeMap<(ResourceType, String), String>,
    ) {
        let status = self.session.status();
        assert!(
            status.collections <= status.endpoints.len(),
            "the stream holds {} collections for {} load assignments",
            status.collections,
            status.endpoints.len()
        );
        for response in responses {
            if response.type_url == LB_ENDPOINT_TYPE_URL {
                assert_eq!(
                    self.service,
                    Service::Ads,
                    "collection members on {:?}",
                    self.service
                );
                let names =
                    (response.resources.iter().map(|r| &r.name)).chain(&response.removed_resources);
                for name in names {
                    let cluster = leds::cluster_of(name)
                        .unwrap_or_else(|| panic!("a member {name:?} of no cluster"));
                    assert!(
                        status.endpoints.iter().any(|e| e == cluster),
                        "sent member {name:?} of a load assignment the stream does not subscribe"
                    );
                }
                for r in &response.resources {
                    assert_eq!(
                        r.resource.as_ref().map(|any| any.type_url.as_str()),
                        Some(LB_ENDPOINT_TYPE_URL),
                        "a member of another type"
                    );
                }
                self.last_nonce = response.nonce;
                continue;
            }
            let ty = ResourceType::from_type_url(&response.type_url)
                .unwrap_or_else(|| panic!("a response of type {:?}", response.type_url));
            let serves = match self.service {
                Service::Ads => true,
                Service::Cds => ty == ResourceType::Cluster,
                Service::Eds => ty == ResourceType::Endpoints,
            };
            assert!(
                serves,
                "a {:?} stream was sent {}",
                self.service,
                ty.as_str()
            );
            let subscribed = match ty {
                ResourceType::Cluster => &status.clusters,
                ResourceType::Endpoints => &status.endpoints,
            };
            for r in &response.resources {
                assert!(
                    parse_cluster_name(&r.name).is_ok(),
                    "sent a resource for {:?}, not an odmesh cluster name",
                    r.name
                );
                assert!(
                    subscribed.contains(&r.name),
                    "sent {} {:?}, which the stream does not subscribe",
                    ty.as_str(),
                    r.name
                );
                assert_eq!(
                    r.resource.as_ref().map(|any| any.type_url.as_str()),
                    Some(ty.type_url()),
                    "a resource of another type"
                );
                sent.insert((ty, r.name.clone()), r.version.clone());
            }
            self.last_nonce = response.nonce;
        }
    }
}
