//! One xDS stream's protocol, without the transport: how a delta request changes a stream's
//! subscriptions and what is sent back, and what a change of the cache sends. The
//! [`server`](crate::server) runs one [`Session`] per gRPC stream and only moves its messages;
//! tests drive sessions directly, as simulated proxies would.
//!
//! The delta xDS rules (subscriptions, the diff, kept resources, bounds) are quoted beside
//! the code that follows them in `subscriptions.rs`; `admission.rs` counts what a subscription
//! costs outside its stream; `clusters.rs` holds what only `Cluster` requests do.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::time::{SystemTime, UNIX_EPOCH};

use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse,
};
use serde::Serialize;
use tracing::debug;

use crate::cache::{Cache, Changes};
use crate::metrics::Metrics;
use crate::prewarm::Prewarm;
use crate::xds::{ResourceName, ResourceType};
use odmesh_base::logs::{self, clip};
use odmesh_base::metrics::inc;

mod admission;
mod clusters;
mod leds;
mod subscriptions;
pub use admission::Admission;
pub use subscriptions::{
    Delta, Known, Room, SubscriptionChange, SubscriptionLimits, Subscriptions, WILDCARD, diff,
    diff_pending,
};

/// At most so many bytes of a proxy's node id, node cluster and nonces are kept.
const MAX_NODE_FIELD: usize = 256;
/// At most so many bytes of a NACK's message are kept and logged.
const MAX_NACK_MESSAGE: usize = 4096;

/// What a session works with: the cache it answers from, the metrics it counts into, the
/// bound on cluster subscriptions over all streams, and the request history it records into
/// and prewarms from (`None`: prewarm is off).
#[derive(Clone, Copy, Debug)]
pub struct Context<'a> {
    pub cache: &'a Cache,
    pub metrics: &'a Metrics,
    /// Cluster names subscribed over all streams (`--xds-max-subscriptions`).
    pub admission: &'a Admission,
    pub prewarm: Option<&'a Prewarm>,
    /// Evicting idle clusters sent ahead (`None`: off).
    pub eviction: Option<Eviction>,
}

/// When a cluster sent ahead counts as idle: no request for `idle`, by the load reports the
/// proxy sends every `interval` (see [`Prewarm::idle`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Eviction {
    pub idle: std::time::Duration,
    pub interval: std::time::Duration,
}

/// One connected stream, as the admin's `/debug/proxies` shows it.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ProxyStatus {
    /// Unique per stream since start.
    pub stream_id: u64,
    /// `ads`, `cds` or `eds`: which gRPC service the stream uses.
    pub service: &'static str,
    /// `node.id` from the proxy's first request (empty until it sends one).
    pub node_id: String,
    /// `node.cluster` from the proxy's first request.
    pub node_cluster: String,
    /// The address the stream's connection came from, if known.
    pub source: Option<IpAddr>,
    /// When the stream opened, in seconds since the Unix epoch.
    pub connected_since_unix: u64,
    /// Subscribed `Cluster` names, sorted.
    pub clusters: Vec<String>,
    /// Subscribed `ClusterLoadAssignment` names, sorted.
    pub endpoints: Vec<String>,
    /// Responses the proxy accepted.
    pub acks: u64,
    /// Responses the proxy rejected.
    pub nacks: u64,
    /// The last rejection, with Envoy's message.
    pub last_nack: Option<NackStatus>,
    /// Names answered with a removal because they were over the stream's bounds.
    pub refused: u64,
    /// Cluster names waiting for room under `--xds-max-subscriptions`.
    pub waiting: usize,
    /// Whether the proxy subscribed to every cluster (`cds_config` in its bootstrap): it then
    /// takes the clusters odmesh sends it ahead, from its service's history.
    pub wildcard: bool,
    /// Clusters sent ahead from the history on this stream.
    pub prewarmed: usize,
    /// Clusters sent ahead that were removed again, unused (they come back on demand).
    pub evicted: usize,
    /// `LbEndpoint` collections subscribed: large VIPs' localities, their endpoints one by one.
    pub collections: usize,
    /// Large VIPs go to this proxy as whole load assignments: it rejected a load assignment,
    /// or named a collection odmesh cannot read.
    pub whole_assignments: bool,
}

/// A response a proxy rejected.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct NackStatus {
    /// `cluster`, `endpoints` or `lb_endpoint` (a large VIP's collection).
    pub resource_type: &'static str,
    /// The nonce of the rejected response.
    pub nonce: String,
    /// Envoy's error message.
    pub message: String,
    /// When it arrived, in seconds since the Unix epoch.
    pub at_unix: u64,
}

/// Which gRPC service a stream came in on; decides the types it may ask for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Service {
    /// Aggregated (ADS): both types on one stream.
    Ads,
    /// Clusters only (CDS).
    Cds,
    /// Load assignments only (EDS).
    Eds,
}

impl Service {
    /// `ads`, `cds` or `eds`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Service::Ads => "ads",
            Service::Cds => "cds",
            Service::Eds => "eds",
        }
    }

    /// The type of a request on this service; a standalone service may leave `type_url` empty.
    fn resource_type(self, type_url: &str) -> Option<ResourceType> {
        let ty = match (self, type_url) {
            (Service::Cds, "") => return Some(ResourceType::Cluster),
            (Service::Eds, "") => return Some(ResourceType::Endpoints),
            _ => ResourceType::from_type_url(type_url)?,
        };
        self.serves(ty).then_some(ty)
    }

    fn serves(self, ty: ResourceType) -> bool {
        match self {
            Service::Ads => true,
            Service::Cds => ty == ResourceType::Cluster,
            Service::Eds => ty == ResourceType::Endpoints,
        }
    }
}

/// Which subscriptions a response looks at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Diff {
    /// All of them: the registry finished loading (or started again), which the cache does
    /// not name per stream.
    All,
    /// The pending ones ([`diff_pending`](crate::cache::diff_pending)): those the stream's own
    /// request changed, and those the cache said changed for this stream: a response costs
    /// what changed, not what the stream holds.
    Pending,
}

/// One stream's protocol state: who the proxy is, what it subscribed, what it was sent.
#[derive(Debug)]
pub struct Session {
    id: u64,
    service: Service,
    connected_since: SystemTime,
    node_id: String,
    node_cluster: String,
    /// Whether the stream's first request has been applied (see `apply_request`).
    node_seen: bool,
    clusters: Subscriptions,
    endpoints: Subscriptions,
    next_nonce: u64,
    acks: u64,
    nacks: u64,
    last_nack: Option<NackStatus>,
    refused: u64,
    /// Whether the cache knows this stream holds refused names (see
    /// [`Session::note_refusing`]).
    refusing: bool,
    /// Whether a request of each type has arrived ([`ResourceType::index`]): the first of a
    /// type alone may list kept versions, and the first `Cluster` one, if empty, is a
    /// wildcard.
    seen: [bool; 2],
    /// The proxy subscribed to every cluster: it takes what is sent ahead.
    wildcard: bool,
    /// The wildcard subscription awaits its first answer (sent even if empty: Envoy holds its
    /// listeners until it comes).
    wildcard_answer_due: bool,
    /// The history's clusters are to be sent ahead, once the registry is complete.
    prewarm_due: bool,
    prewarmed: usize,
    /// Clusters the proxy holds under its wildcard subscription (sent ahead, or kept from an
    /// earlier stream without naming them), with when: the only ones that can be evicted, as
    /// the proxy asks for them again by name when a request needs them. (A name the proxy
    /// subscribed itself stays subscribed in Envoy after a removal, and is never asked for
    /// again: those are never evicted.)
    ahead: BTreeMap<String, u64>,
    evicted: usize,
    /// When `ahead` is looked at for idle clusters next (seconds since the Unix epoch): once
    /// per load report interval at most.
    next_idle_check: u64,
    limits: SubscriptionLimits,
    /// The address the stream's connection came from: its cluster names count under that
    /// source's share of `--xds-max-subscriptions` (`None`: not known, the whole bound only).
    source: Option<IpAddr>,
    /// The names of either type the stream tracks, as told to the bound over all streams
    /// ([`Session::settle_tracked`]).
    tracked: usize,
    /// The `LbEndpoint` collections the stream subscribes (large VIPs' endpoints one by one),
    /// if any.
    leds: Option<Box<leds::Collections>>,
    /// Their response due after a change, sent after the load assignments.
    collections_due: Option<Box<DeltaDiscoveryResponse>>,
    /// Large VIPs go to this proxy whole: it rejected a load assignment, or named a
    /// collection odmesh cannot read (see [`Session::fall_back_to_whole`]).
    whole_only: bool,
}

impl Session {
    /// A new stream `id` on `service`, bounded by `limits`.
    pub fn new(id: u64, service: Service, limits: SubscriptionLimits) -> Session {
        Session {
            id,
            service,
            connected_since: SystemTime::now(),
            node_id: String::new(),
            node_cluster: String::new(),
            node_seen: false,
            clusters: Subscriptions::with_limits(limits),
            endpoints: Subscriptions::with_limits(limits),
            next_nonce: 1,
            acks: 0,
            nacks: 0,
            last_nack: None,
            refused: 0,
            refusing: false,
            seen: [false; 2],
            wildcard: false,
            wildcard_answer_due: false,
            prewarm_due: false,
            prewarmed: 0,
            ahead: BTreeMap::new(),
            evicted: 0,
            next_idle_check: 0,
            limits,
            source: None,
            tracked: 0,
            leds: None,
            collections_due: None,
            whole_only: false,
        }
    }

    /// The same stream, its connection from `source` (see [`Admission`]).
    pub fn from_source(self, source: Option<IpAddr>) -> Session {
        Session { source, ..self }
    }

    /// The stream and its source, as [`Context::count_in`] and `count_out` take them.
    fn who(&self) -> (u64, Option<IpAddr>) {
        (self.id, self.source)
    }

    /// The stream's id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The proxy's node id (empty until its first request names it).
    pub fn node_id(&self) -> &str {
        &self.node_id
    }

    /// About how many names handling `req` touches: those it lists, and what a wildcard
    /// subscription it starts may send ahead. The server runs heavy requests apart.
    pub fn request_weight(&self, cx: &Context<'_>, req: &DeltaDiscoveryRequest) -> usize {
        let listed = req.resource_names_subscribe.len()
            + req.resource_names_unsubscribe.len()
            + req.initial_resource_versions.len();
        // A collection subscribed brings its members, at least the split threshold's worth; a
        // member (a name and a small body) weighs about a sixteenth of a cluster name (both
        // resources built and hashed). One or two collections of a VIP of a few hundred run
        // here: through the heavy lane a first request to a VIP of 1,000 took 11-16 ms
        // instead of 10-11 (bench/probes/large_vip_first_request.py).
        if req.type_url == crate::xds::leds::LB_ENDPOINT_TYPE_URL {
            let members = cx.cache.options().leds_min_endpoints.max(16);
            return listed.saturating_mul(members / 16);
        }
        // The two ways a request starts a wildcard (see `apply_wildcard`).
        let clusters = self.service.resource_type(&req.type_url) == Some(ResourceType::Cluster);
        let legacy = !self.seen[ResourceType::Cluster.index()]
            && req.resource_names_subscribe.is_empty()
            && req.resource_names_unsubscribe.is_empty();
        let explicit = req.resource_names_subscribe.iter().any(|n| n == WILDCARD);
        let starts_wildcard = clusters && !self.wildcard && (legacy || explicit);
        listed + if starts_wildcard { ahead_most(cx) } else { 0 }
    }

    /// About how many names handling `changes` ([`Session::on_change`]) touches: those that
    /// changed (all it subscribes, for a full diff), those waiting for room, and what is due
    /// to be sent ahead.
    pub fn change_weight(&self, cx: &Context<'_>, changes: &Changes) -> usize {
        let changed = if changes.all {
            self.subscribed()
        } else {
            changes.names.len()
        };
        let ahead = if self.prewarm_due { ahead_most(cx) } else { 0 };
        changed + self.clusters.waiting() + ahead
    }

    /// About how many names the server's periodic look ([`Session::is_waiting`],
    /// [`Session::evict_idle`]) touches.
    pub fn tick_weight(&self) -> usize {
        self.clusters.waiting() + self.ahead.len()
    }

    /// How many names the stream subscribes (both types): what [`Session::close`] forgets.
    pub fn subscribed(&self) -> usize {
        self.clusters.len() + self.endpoints.len()
    }

    fn subs(&mut self, ty: ResourceType) -> &mut Subscriptions {
        match ty {
            ResourceType::Cluster => &mut self.clusters,
            ResourceType::Endpoints => &mut self.endpoints,
        }
    }

    /// The stream as the admin shows it.
    pub fn status(&self) -> ProxyStatus {
        ProxyStatus {
            stream_id: self.id,
            service: self.service.as_str(),
            node_id: self.node_id.clone(),
            node_cluster: self.node_cluster.clone(),
            source: self.source,
            connected_since_unix: unix_seconds(self.connected_since),
            clusters: self.clusters.names().map(str::to_owned).collect(),
            endpoints: self.endpoints.names().map(str::to_owned).collect(),
            acks: self.acks,
            nacks: self.nacks,
            last_nack: self.last_nack.clone(),
            refused: self.refused,
            waiting: self.clusters.waiting(),
            wildcard: self.wildcard,
            prewarmed: self.prewarmed,
            evicted: self.evicted,
            collections: self.collections(),
            whole_assignments: self.whole_only,
        }
    }

    /// Handles one request; returns the response for the request's type, if one is due, and,
    /// for new `Cluster` subscriptions on ADS, the load assignments that go with them.
    ///
    /// New cluster names beyond the room `--xds-max-subscriptions` leaves over all streams
    /// wait for room: answered with a removal (the first request fails fast), and pushed
    /// once there is room ([`Session::on_change`]; Envoy stays subscribed to a removed name
    /// and takes the resource then). The stream's other clusters are served all along.
    ///
    /// The steps are numbered below; docs/architecture.md, "A first request", walks them.
    pub fn on_request(
        &mut self,
        cx: &Context<'_>,
        req: DeltaDiscoveryRequest,
    ) -> [Option<DeltaDiscoveryResponse>; 2] {
        let answer = self.apply_request(cx, req);
        self.settle_tracked(cx);
        self.prune_collections();
        answer
    }

    /// [`Session::on_request`] before the names the stream tracks are settled.
    fn apply_request(
        &mut self,
        cx: &Context<'_>,
        mut req: DeltaDiscoveryRequest,
    ) -> [Option<DeltaDiscoveryResponse>; 2] {
        inc(&cx.metrics.xds_requests_total);
        // 1. Who the proxy is, from its first request.
        self.note_node(&req);
        trace_request(self.id, &req);
        // 2. Which type it asks for; another service's types are ignored. A large VIP's
        // endpoints come one by one, in collections on the aggregated stream.
        if req.type_url == crate::xds::leds::LB_ENDPOINT_TYPE_URL && self.service == Service::Ads {
            return self.on_collections_request(cx, &req);
        }
        let Some(ty) = self.service.resource_type(&req.type_url) else {
            debug!(stream = self.id, type_url = %req.type_url, "ignoring a request for a type odmesh does not serve");
            return [None, None];
        };
        // 3. What it says of the last response: accepted or rejected. A rejected load
        // assignment may be a large VIP's: from now on they all go whole.
        self.note_ack(cx, ty.as_str(), &req);
        let nacked = ty == ResourceType::Endpoints && req.error_detail.is_some();
        let whole = nacked && self.fall_back_to_whole("the proxy rejected a load assignment");
        let first = !std::mem::replace(&mut self.seen[ty.index()], true);
        self.keep_versions_if_first(cx, ty, first, &mut req);
        // 4. Clusters only: the wildcard, and what the proxy kept under it.
        let held = match ty {
            ResourceType::Cluster => self.apply_wildcard(cx, first, &req),
            ResourceType::Endpoints => Vec::new(),
        };
        // 5. The subscriptions: each new name parsed once, counted, admitted or refused.
        let Some(added) = self.subscribe(cx, ty, &req, held) else {
            // No subscription changed: only a wildcard's first answer can be due.
            let due = ty == ResourceType::Cluster && self.wildcard_answer_due;
            let ahead = if due {
                self.take_prewarm(cx)
            } else {
                Vec::new()
            };
            return match (due, whole) {
                (true, _) => self.answer_clusters(cx, ahead, Diff::Pending),
                (false, true) => [self.respond(cx, ty, Diff::All), None],
                (false, false) => [None, None],
            };
        };
        // 6. The answer: what changed for the proxy, and the load assignments of new clusters.
        let diff = if whole { Diff::All } else { Diff::Pending };
        match ty {
            ResourceType::Cluster => self.answer_clusters(cx, added, Diff::Pending),
            ResourceType::Endpoints => [self.respond(cx, ty, diff), None],
        }
    }

    /// Keeps the node of the stream's first request that carries one: the subscriptions are
    /// counted under its `cluster` (the calling service), which must not change. A first
    /// request without a node leaves the caller empty for the stream's life.
    fn note_node(&mut self, req: &DeltaDiscoveryRequest) {
        let first = !std::mem::replace(&mut self.node_seen, true);
        let Some(node) = req.node.as_ref().filter(|_| first) else {
            return;
        };
        // Kept for the admin: bounded, whatever the client sent.
        self.node_id = logs::truncated(&node.id, MAX_NODE_FIELD);
        self.node_cluster = logs::truncated(&node.cluster, MAX_NODE_FIELD);
        odmesh_base::limited!(
            info,
            stream = self.id,
            node = %clip(&node.id),
            service = self.service.as_str(),
            "proxy connected",
        );
    }

    /// Rule: a request that carries the `response_nonce` of a response acknowledges it; with
    /// `error_detail` set it rejects it (NACK), and the client keeps what it had.
    fn note_ack(&mut self, cx: &Context<'_>, ty: &'static str, req: &DeltaDiscoveryRequest) {
        if req.response_nonce.is_empty() {
            return;
        }
        cx.metrics.answered(ty, req.error_detail.is_none());
        let Some(error) = &req.error_detail else {
            self.acks += 1;
            return;
        };
        self.nacks += 1;
        odmesh_base::limited!(
            warn,
            stream = self.id,
            node = %clip(&self.node_id),
            resource_type = ty,
            nonce = %clip(&req.response_nonce),
            error = %logs::clip_at(&error.message, MAX_NACK_MESSAGE),
            "proxy rejected an xDS response (NACK); it is sent again only when it changes"
        );
        self.last_nack = Some(NackStatus {
            resource_type: ty,
            nonce: logs::truncated(&req.response_nonce, MAX_NODE_FIELD),
            message: logs::truncated(&error.message, MAX_NACK_MESSAGE),
            at_unix: unix_seconds(SystemTime::now()),
        });
    }

    /// Rule: a client lists the versions it kept (`initial_resource_versions`) only in a
    /// stream's first request of a type; after that the server tracks what it has. A later
    /// list is ignored, and counted: honoured, it would let a client claim names it was never
    /// sent, which take no room under the bounds.
    fn keep_versions_if_first(
        &self,
        cx: &Context<'_>,
        ty: ResourceType,
        first: bool,
        req: &mut DeltaDiscoveryRequest,
    ) {
        if first || req.initial_resource_versions.is_empty() {
            return;
        }
        let ignored = std::mem::take(&mut req.initial_resource_versions).len();
        (cx.metrics.xds_late_versions_ignored_total).fetch_add(ignored as u64, Ordering::Relaxed);
        odmesh_base::limited!(
            warn,
            stream = self.id,
            node = %clip(&self.node_id),
            resource_type = ty.as_str(),
            ignored,
            "kept versions after a stream's first request of a type are ignored"
        );
    }

    /// Applies the request's subscribes and unsubscribes (and `held`, the names kept under the
    /// wildcard) to the stream's `ty` subscriptions, within the room left under
    /// `--xds-max-subscriptions`: what leaves is given back, what arrives is counted, and
    /// unregistered clusters are admitted or refused. Returns the names newly subscribed that
    /// the proxy has no version of (for clusters, with those sent ahead now), or `None` if the
    /// request changes no subscription.
    fn subscribe(
        &mut self,
        cx: &Context<'_>,
        ty: ResourceType,
        req: &DeltaDiscoveryRequest,
        held: Vec<String>,
    ) -> Option<Vec<ResourceName>> {
        let unsubscribe = &req.resource_names_unsubscribe;
        let mut subscribe = req.resource_names_subscribe.clone();
        subscribe.extend(held.iter().cloned());
        if subscribe.is_empty() && unsubscribe.is_empty() {
            return None;
        }
        // The bound over all streams is on cluster names; each brings its load assignment.
        let room = match ty {
            ResourceType::Cluster => Room {
                any: cx.admission.room(),
                share: cx.admission.share_left(self.source),
                names: cx.admission.names_room_for(self.source),
            },
            ResourceType::Endpoints => Room {
                names: cx.admission.names_room_for(self.source),
                ..Room::UNBOUNDED
            },
        };
        let initial = &req.initial_resource_versions;
        let change = self
            .subs(ty)
            .update_within_share(&subscribe, unsubscribe, initial, room);
        if ty == ResourceType::Cluster {
            self.hold_ahead(held);
        }
        self.count_out(cx, ty, &change.removed);
        let refused =
            change.over_limit + change.over_tracked + self.subscribe_counted(cx, ty, &change.added);
        // Refused names unsubscribed may leave none.
        self.note_refusing(cx);
        self.log_change(cx, ty, &change, refused, &subscribe, initial.len());
        // Names the client says it has (on reconnect) are not new to it: their load
        // assignments need no head start.
        let mut fresh = change.added;
        fresh.retain(|name| !initial.contains_key(name.as_str()));
        if ty == ResourceType::Cluster {
            self.record_asked(cx, &fresh);
            fresh.extend(self.take_prewarm(cx));
        }
        Some(fresh)
    }

    /// Admits those of `names` of `ty`, newly subscribed, that are not registered within the
    /// stream's bound, and counts the others and those admitted ([`Context::count_in`]).
    /// Returns how many were refused: those are neither counted nor watched.
    ///
    /// Every unregistered cluster name is a cluster in Envoy for the stream's life, and every
    /// name a client subscribes costs the control plane: a client sending random `Host`s, or
    /// random load-assignment names, must not grow either without bound. The load assignment
    /// of a cluster the stream counts is that cluster's, and needs no room of its own.
    fn subscribe_counted(
        &mut self,
        cx: &Context<'_>,
        ty: ResourceType,
        names: &[ResourceName],
    ) -> usize {
        let unregistered = cx.cache.unregistered(names);
        let mut refused = std::collections::HashSet::new();
        for name in unregistered {
            let name = name.as_str();
            let covered = ty == ResourceType::Endpoints && self.clusters.counts(name);
            if !covered && !self.subs(ty).admit_unregistered(name) {
                refused.insert(name);
            }
        }
        if refused.is_empty() {
            cx.count_in(self.who(), &self.node_cluster, ty, names);
            return 0;
        }
        let counted: Vec<ResourceName> = (names.iter())
            .filter(|name| !refused.contains(name.as_str()))
            .cloned()
            .collect();
        cx.count_in(self.who(), &self.node_cluster, ty, &counted);
        self.note_refusing(cx);
        refused.len()
    }

    /// Tells the cache whether this stream holds refused names, which it does not watch (see
    /// [`Cache::set_refusing`](crate::cache::Cache::set_refusing)), when that changes.
    fn note_refusing(&mut self, cx: &Context<'_>) {
        let refusing = self.clusters.has_refused() || self.endpoints.has_refused();
        if refusing != self.refusing {
            self.refusing = refusing;
            cx.cache.set_refusing(self.id, refusing);
        }
    }

    /// Gives back `names` of `ty`, no longer subscribed ([`Context::count_out`]). A cluster
    /// dropped before Envoy subscribed to its load assignment: that subscribe will never come,
    /// so the one made on its behalf goes too.
    fn count_out(&mut self, cx: &Context<'_>, ty: ResourceType, names: &[ResourceName]) {
        cx.count_out(self.who(), ty, names);
        if ty == ResourceType::Cluster {
            let withdrawn = self.endpoints.withdraw_presubscribed(names);
            cx.count_out(self.who(), ResourceType::Endpoints, &withdrawn);
        }
    }

    /// Counts and logs what a request's subscription change did beyond the plain case: names
    /// waiting for room, names refused, kept names left alone while the registry loads.
    fn log_change(
        &mut self,
        cx: &Context<'_>,
        ty: ResourceType,
        change: &SubscriptionChange,
        refused: usize,
        subscribe: &[String],
        kept: usize,
    ) {
        let metrics = cx.metrics;
        if change.wildcard && ty == ResourceType::Endpoints {
            debug!(
                stream = self.id,
                "proxy asked for every load assignment (wildcard); it gets those of its clusters"
            );
        }
        if change.over_room > 0 {
            let waiting = change.over_room as u64;
            (metrics.xds_names_waiting_total).fetch_add(waiting, Ordering::Relaxed);
            let admission = cx.admission;
            if admission.share_left(self.source) < admission.room() {
                (metrics.xds_names_waiting_for_source_total).fetch_add(waiting, Ordering::Relaxed);
                odmesh_base::limited!(
                    warn,
                    stream = self.id,
                    node = %clip(&self.node_id),
                    source = ?self.source,
                    waiting,
                    "cluster names beyond the source's share, --xds-max-subscriptions-per-source, wait for room (answered with a removal meanwhile)"
                );
            } else {
                odmesh_base::limited!(
                    warn,
                    stream = self.id,
                    node = %clip(&self.node_id),
                    waiting,
                    max = admission.max(),
                    "cluster names beyond --xds-max-subscriptions wait for room (answered with a removal meanwhile)"
                );
            }
        }
        if change.over_tracked > 0 {
            let over = change.over_tracked as u64;
            (metrics.xds_names_untracked_total).fetch_add(over, Ordering::Relaxed);
            let (total, by_source) = cx.admission.names_tracked(self.source);
            odmesh_base::limited!(
                warn,
                stream = self.id,
                node = %clip(&self.node_id),
                source = ?self.source,
                over,
                tracked = total,
                tracked_by_source = by_source,
                "names over --xds-max-names-total or --xds-max-names-per-source answered with a removal and not tracked"
            );
        }
        if refused > 0 {
            self.refused += refused as u64;
            (metrics.xds_names_refused_total).fetch_add(refused as u64, Ordering::Relaxed);
            odmesh_base::limited!(
                warn,
                stream = self.id,
                node = %clip(&self.node_id),
                resource_type = ty.as_str(),
                refused,
                limits = ?self.limits,
                "names over the stream's bounds answered with a removal"
            );
        }
        if kept > 0 && !cx.cache.is_complete() {
            odmesh_base::limited!(
                info,
                stream = self.id,
                node = %clip(&self.node_id),
                resource_type = ty.as_str(),
                kept,
                "proxy reconnected with resources it kept; they stay as they are until the registry is loaded"
            );
        }
        debug!(
            stream = self.id,
            resource_type = ty.as_str(),
            subscribed = subscribe.len(),
            unsubscribed = change.removed.len(),
            first = ?subscribe.first().map(|n| clip(n)),
            "subscriptions changed"
        );
    }

    /// Pushes what `changes` says changed in the cache for this stream (taken from its
    /// [`Inbox`](crate::cache::Inbox)), clusters before their load assignments; and the
    /// clusters that waited for room, if there is room now (with no changes: the server's
    /// retry).
    pub fn on_change(
        &mut self,
        cx: &Context<'_>,
        changes: Changes,
    ) -> [Option<DeltaDiscoveryResponse>; 2] {
        self.note_collections_change(cx, &changes);
        let answer = self.apply_change(cx, changes);
        self.settle_tracked(cx);
        self.prune_collections();
        answer
    }

    /// [`Session::on_change`] before the names the stream tracks are settled.
    fn apply_change(
        &mut self,
        cx: &Context<'_>,
        changes: Changes,
    ) -> [Option<DeltaDiscoveryResponse>; 2] {
        let diff = if changes.all {
            Diff::All
        } else {
            self.clusters.mark_changed(&changes.names);
            self.endpoints.mark_changed(&changes.names);
            Diff::Pending
        };
        // The registry became complete: what was to be sent ahead goes now. Or room freed up
        // for clusters that waited for it.
        let mut added = self.take_prewarm(cx);
        if added.is_empty() && self.clusters.is_waiting() {
            added = (self.clusters).admit_waiting(cx.admission.room_for(self.source));
            let refused = self.subscribe_counted(cx, ResourceType::Cluster, &added);
            self.refused += refused as u64;
            (cx.metrics.xds_names_refused_total).fetch_add(refused as u64, Ordering::Relaxed);
        }
        if !added.is_empty() {
            let [clusters, endpoints] = self.answer_clusters(cx, added, diff);
            // Whatever else changed for the load assignments goes in the same round.
            let endpoints = endpoints.or_else(|| self.respond(cx, ResourceType::Endpoints, diff));
            return [clusters, endpoints];
        }
        ResourceType::ALL.map(|ty| {
            self.service
                .serves(ty)
                .then(|| self.respond(cx, ty, diff))
                .flatten()
        })
    }

    /// Whether some cluster names of this stream wait for room (the server then calls
    /// [`Session::on_change`] now and then, as room may free up without a registry change).
    pub fn is_waiting(&self) -> bool {
        self.clusters.is_waiting()
    }

    /// The response bringing this stream's `ty` subscriptions up to date, if any is needed:
    /// all of them, or only those the stream's own requests changed.
    fn respond(
        &mut self,
        cx: &Context<'_>,
        ty: ResourceType,
        diff: Diff,
    ) -> Option<DeltaDiscoveryResponse> {
        let cache = cx.cache;
        let caller = self.node_cluster.clone();
        // Rule: the first request of a wildcard subscription gets an answer, even one with no
        // resources; Envoy holds its listeners until it comes (or `initial_fetch_timeout`).
        let answer_due =
            ty == ResourceType::Cluster && std::mem::take(&mut self.wildcard_answer_due);
        // A refused cluster name, once registered, takes room like any new name: sent within
        // the room left, else it waits for room.
        let room = std::cell::Cell::new(match ty {
            ResourceType::Cluster => cx.admission.room_for(self.source),
            ResourceType::Endpoints => usize::MAX,
        });
        let no_room = std::cell::RefCell::new(Vec::new());
        let split = self.service == Service::Ads && !self.whole_only;
        let subs = self.subs(ty);
        let loading = !cache.is_complete();
        let delta = {
            // A refused name (not watched) is looked at only once registered.
            let registered = cache.registered();
            let mut cached = cache.current(&caller, ty);
            // Envoy takes a large VIP's collections only over ADS; a standalone EDS stream
            // gets its whole load assignment, as does a proxy that cannot take them.
            let mut lookup = |name: &ResourceName| match cached(name) {
                Some(v) if !split && v.leds.is_some() => v.leds.as_ref().map(|l| l.whole.clone()),
                v => v,
            };
            let subs: &Subscriptions = subs;
            let current = |name: &ResourceName| match subs.is_refused(name.as_str()) {
                true if !registered(name.as_str()) => None,
                true if room.get() == 0 => {
                    no_room.borrow_mut().push(name.clone());
                    None
                }
                true => {
                    room.set(room.get() - 1);
                    lookup(name)
                }
                false => lookup(name),
            };
            match diff {
                _ if subs.is_idle() => Delta::default(),
                Diff::All => subscriptions::diff(subs, loading, current),
                Diff::Pending => diff_pending(subs, loading, current),
            }
        };
        let waiting = no_room.into_inner();
        if !waiting.is_empty() {
            subs.wait_for_room(&waiting);
            (cx.metrics.xds_names_waiting_total).fetch_add(waiting.len() as u64, Ordering::Relaxed);
        }
        let counted = subs.record(&delta);
        if !counted.is_empty() || !waiting.is_empty() {
            cx.count_in(self.who(), &caller, ty, &counted);
            self.note_refusing(cx);
        }
        if delta.is_empty() && !answer_due {
            return None;
        }
        let nonce = self.next_nonce;
        self.next_nonce += 1;
        cx.metrics.sent(ty.as_str(), delta.send.len());
        debug!(
            stream = self.id,
            resource_type = ty.as_str(),
            nonce,
            sent = delta.send.len(),
            removed = delta.remove.len(),
            "sending delta response"
        );
        Some(response(ty, delta, nonce, cache.generation(), self.id))
    }

    /// Tells the bound on names tracked over all streams how many this stream tracks now (of
    /// either type, however they stand), after whatever changed them.
    pub(super) fn settle_tracked(&mut self, cx: &Context<'_>) {
        let now = self.clusters.len() + self.endpoints.len();
        cx.admission.track(self.source, self.tracked, now);
        self.tracked = now;
    }

    /// The stream ended: its subscriptions no longer count.
    pub fn close(&self, cx: &Context<'_>) {
        cx.admission.track(self.source, self.tracked, 0);
        cx.cache.close_stream(self.id);
        cx.forget(
            self.source,
            ResourceType::Cluster,
            self.clusters.counted_len(),
        );
        cx.forget(
            self.source,
            ResourceType::Endpoints,
            self.endpoints.counted_len(),
        );
    }
}

/// Logs a request in full, at trace level.
fn trace_request(stream: u64, req: &DeltaDiscoveryRequest) {
    tracing::trace!(
        stream,
        type_url = %req.type_url,
        subscribe = ?req.resource_names_subscribe,
        unsubscribe = ?req.resource_names_unsubscribe,
        initial = ?req.initial_resource_versions.keys().collect::<Vec<_>>(),
        nonce = %req.response_nonce,
        nack = req.error_detail.is_some(),
        "request"
    );
}

/// The response carrying `delta` on stream `stream`.
fn response(
    ty: ResourceType,
    delta: Delta,
    nonce: u64,
    generation: u64,
    stream: u64,
) -> DeltaDiscoveryResponse {
    DeltaDiscoveryResponse {
        system_version_info: generation.to_string(),
        resources: delta
            .send
            .iter()
            .map(|r| r.to_resource_on(stream))
            .collect(),
        type_url: ty.type_url().to_owned(),
        removed_resources: delta.remove,
        nonce: nonce.to_string(),
        ..Default::default()
    }
}

/// The most names a wildcard subscription may be sent ahead.
fn ahead_most(cx: &Context<'_>) -> usize {
    cx.prewarm.map_or(0, |p| p.limits().max_per_service)
}

/// The time now, in seconds since the Unix epoch.
fn unix_now() -> u64 {
    unix_seconds(SystemTime::now())
}

fn unix_seconds(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests;
