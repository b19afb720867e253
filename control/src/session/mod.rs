//! One xDS stream's protocol, without the transport: how a delta request changes a stream's
//! subscriptions and what is sent back, and what a change of the cache sends. The
//! [`server`](crate::server) runs one [`Session`] per gRPC stream and only moves its messages;
//! tests drive sessions directly, as simulated proxies would.
//!
//! See [`cache`](crate::cache) for the delta xDS rules (subscriptions, the diff, kept
//! resources, bounds) that a session applies.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::{SystemTime, UNIX_EPOCH};

use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse,
};
use odmesh_names::parse_cluster_name;
use serde::Serialize;
use tracing::debug;

use crate::cache::{Cache, Changes};
use crate::metrics::Metrics;
use crate::prewarm::Prewarm;
use crate::xds::ResourceType;
use odmesh_base::logs::{self, clip};
use odmesh_base::metrics::inc;

mod subscriptions;
pub use subscriptions::{
    Delta, Known, SubscriptionChange, SubscriptionLimits, Subscriptions, WILDCARD, diff,
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
    /// Cluster names subscribed over all streams at most (`--xds-max-subscriptions`).
    pub max_subscriptions: usize,
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
}

/// A response a proxy rejected.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct NackStatus {
    /// `cluster` or `endpoints`.
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
    /// Whether a `Cluster` request has arrived (the first, if empty, is a wildcard).
    cluster_request_seen: bool,
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
            cluster_request_seen: false,
            wildcard: false,
            wildcard_answer_due: false,
            prewarm_due: false,
            prewarmed: 0,
            ahead: BTreeMap::new(),
            evicted: 0,
            next_idle_check: 0,
            limits,
        }
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
        // The two ways a request starts a wildcard (see `apply_request`).
        let clusters = self.service.resource_type(&req.type_url) == Some(ResourceType::Cluster);
        let legacy = !self.cluster_request_seen
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
        }
    }

    /// Handles one request; returns the response for the request's type, if one is due, and,
    /// for new `Cluster` subscriptions on ADS, the load assignments that go with them.
    ///
    /// New cluster names beyond the room `--xds-max-subscriptions` leaves over all streams
    /// wait for room: answered with a removal (the first request fails fast), and pushed
    /// once there is room ([`Session::on_change`]; Envoy stays subscribed to a removed name
    /// and takes the resource then). The stream's other clusters are served all along.
    pub fn on_request(
        &mut self,
        cx: &Context<'_>,
        req: DeltaDiscoveryRequest,
    ) -> [Option<DeltaDiscoveryResponse>; 2] {
        let Some((ty, added)) = self.apply_request(cx, req) else {
            return [None, None];
        };
        self.answer(cx, ty, added, Diff::Pending)
    }

    /// The response for `ty`, and, for clusters `added` on ADS, their load assignments.
    fn answer(
        &mut self,
        cx: &Context<'_>,
        ty: ResourceType,
        added: Vec<String>,
        diff: Diff,
    ) -> [Option<DeltaDiscoveryResponse>; 2] {
        let first = self.respond(cx, ty, diff);
        // Envoy subscribes to an EDS cluster's load assignment only once it has accepted the
        // cluster: one more round trip (request, answer) before the cluster is warm, which the
        // first request to it waits for. On ADS, odmesh sends the load assignments of newly
        // subscribed clusters right behind them, as if Envoy had already asked. Envoy handles
        // the responses of one stream in order, so the cluster's EDS subscription exists when
        // its load assignment arrives; Envoy's own subscribe, which follows, is not answered
        // again (see `Subscriptions::presubscribe`).
        if ty != ResourceType::Cluster || self.service != Service::Ads || added.is_empty() {
            return [first, None];
        }
        // Only names answered with a cluster: Envoy never subscribes to the load assignment
        // of a name answered with a removal (refused, or not an odmesh cluster name), so such
        // a presubscription would never be taken up.
        let added: Vec<String> = (added.into_iter())
            .filter(|name| !self.clusters.is_refused(name) && parse_cluster_name(name).is_ok())
            .collect();
        let presubscribed = self.endpoints.presubscribe(&added);
        (cx.metrics.xds_subscriptions).fetch_add(presubscribed.len() as u64, Ordering::Relaxed);
        cx.cache.watch(self.id, &self.node_cluster, &presubscribed);
        [first, self.respond(cx, ResourceType::Endpoints, diff)]
    }

    /// Applies one request to the stream's state: node, ACK/NACK, subscription changes. Returns
    /// its type and the names it newly subscribed that the client has no version of, when the
    /// subscriptions changed.
    fn apply_request(
        &mut self,
        cx: &Context<'_>,
        req: DeltaDiscoveryRequest,
    ) -> Option<(ResourceType, Vec<String>)> {
        let metrics = cx.metrics;
        inc(&metrics.xds_requests_total);
        // The node counts once, from the first request that carries one: the subscriptions
        // are counted under its `cluster` (the calling service), which must not change.
        // A first request without a node leaves the caller empty for the stream's life.
        let first = !std::mem::replace(&mut self.node_seen, true);
        if let Some(node) = &req.node
            && first
        {
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
        tracing::trace!(
            stream = self.id,
            type_url = %req.type_url,
            subscribe = ?req.resource_names_subscribe,
            unsubscribe = ?req.resource_names_unsubscribe,
            initial = ?req.initial_resource_versions.keys().collect::<Vec<_>>(),
            nonce = %req.response_nonce,
            nack = req.error_detail.is_some(),
            "request"
        );
        let Some(ty) = self.service.resource_type(&req.type_url) else {
            debug!(stream = self.id, type_url = %req.type_url, "ignoring a request for a type odmesh does not serve");
            return None;
        };

        // Rule: a request that carries the `response_nonce` of a response acknowledges it;
        // with `error_detail` set it rejects it (NACK), and the client keeps what it had.
        if !req.response_nonce.is_empty() {
            match &req.error_detail {
                None => {
                    self.acks += 1;
                    inc(&metrics.xds_acks_total);
                }
                Some(error) => {
                    self.nacks += 1;
                    inc(&metrics.xds_nacks_total);
                    odmesh_base::limited!(
                        warn,
                        stream = self.id,
                        node = %clip(&self.node_id),
                        resource_type = ty.as_str(),
                        nonce = %clip(&req.response_nonce),
                        error = %logs::clip_at(&error.message, MAX_NACK_MESSAGE),
                        "proxy rejected an xDS response (NACK); it is sent again only when it changes"
                    );
                    self.last_nack = Some(NackStatus {
                        resource_type: ty.as_str(),
                        nonce: logs::truncated(&req.response_nonce, MAX_NODE_FIELD),
                        message: logs::truncated(&error.message, MAX_NACK_MESSAGE),
                        at_unix: unix_seconds(SystemTime::now()),
                    });
                }
            }
        }

        // Rule: a client's first request of a type with no names subscribes to the wildcard
        // (every resource, "legacy wildcard"), as does `*` in any request; it stays subscribed
        // to the names it adds besides. Envoy does so for clusters when its bootstrap has a
        // `cds_config`: odmesh then sends it, ahead of any request, the clusters its service
        // used before (see `prewarm`), never the whole registry.
        let first_of_type =
            ty == ResourceType::Cluster && !std::mem::replace(&mut self.cluster_request_seen, true);
        let legacy_wildcard = first_of_type
            && req.resource_names_subscribe.is_empty()
            && req.resource_names_unsubscribe.is_empty();
        let explicit_wildcard = req.resource_names_subscribe.iter().any(|n| n == WILDCARD);
        let mut subscribe = req.resource_names_subscribe;
        if ty == ResourceType::Cluster
            && self.wildcard
            && req.resource_names_unsubscribe.iter().any(|n| n == WILDCARD)
        {
            // Rule: unsubscribing `*` ends the wildcard. What was sent ahead stays subscribed
            // (and counted) as ordinary names; nothing more is sent ahead or evicted.
            self.wildcard = false;
            self.wildcard_answer_due = false;
            self.prewarm_due = false;
            self.ahead.clear();
        }
        if ty == ResourceType::Cluster && (legacy_wildcard || explicit_wildcard) && !self.wildcard {
            self.wildcard = true;
            self.wildcard_answer_due = true;
            self.prewarm_due = cx.prewarm.is_some();
        }
        let mut held = Vec::new();
        if ty == ResourceType::Cluster {
            // Names the proxy subscribed itself are not under the wildcard only.
            for name in subscribe.iter().chain(&req.resource_names_unsubscribe) {
                self.ahead.remove(name);
            }
        }
        if ty == ResourceType::Cluster && self.wildcard {
            // Rule: on a new stream the client lists in `initial_resource_versions` every
            // resource it kept, including those it had under the wildcard, which it does not
            // name in `resource_names_subscribe`. They are this stream's too: kept, and brought
            // up to date like any other.
            held = (req.initial_resource_versions.keys())
                .filter(|name| !subscribe.contains(name))
                .cloned()
                .collect();
            subscribe.extend(held.iter().cloned());
        }
        if subscribe.is_empty() && req.resource_names_unsubscribe.is_empty() {
            let due = ty == ResourceType::Cluster && self.wildcard_answer_due;
            return due.then(|| (ty, self.take_prewarm(cx)));
        }
        // The bound over all streams is on cluster names; each brings its load assignment.
        let room = match ty {
            ResourceType::Cluster => cx
                .max_subscriptions
                .saturating_sub(metrics.xds_cluster_subscriptions.load(Ordering::Relaxed) as usize),
            ResourceType::Endpoints => usize::MAX,
        };
        let change = self.subs(ty).update_within(
            &subscribe,
            &req.resource_names_unsubscribe,
            &req.initial_resource_versions,
            room,
        );
        let now = crate::prewarm::unix_now();
        for name in held {
            if self.clusters.contains(&name) {
                self.ahead.insert(name, now);
            }
        }
        let total = &metrics.xds_subscriptions;
        total.fetch_sub(change.removed.len() as u64, Ordering::Relaxed);
        if ty == ResourceType::Cluster {
            let gauge = &metrics.xds_cluster_subscriptions;
            gauge.fetch_sub(change.removed.len() as u64, Ordering::Relaxed);
        }
        if change.wildcard && ty == ResourceType::Endpoints {
            debug!(
                stream = self.id,
                "proxy asked for every load assignment (wildcard); it gets those of its clusters"
            );
        }
        let cache = cx.cache;
        cache.unwatch(self.id, change.removed.iter().map(String::as_str));
        if change.over_room > 0 {
            (metrics.xds_names_waiting_total).fetch_add(change.over_room as u64, Ordering::Relaxed);
            odmesh_base::limited!(
                warn,
                stream = self.id,
                node = %clip(&self.node_id),
                waiting = change.over_room,
                max = cx.max_subscriptions,
                "cluster names beyond --xds-max-subscriptions wait for room (answered with a removal meanwhile)"
            );
        }
        let mut refused = change.over_limit;
        if ty == ResourceType::Cluster {
            // A cluster dropped before Envoy subscribed to its load assignment: that subscribe
            // will never come, so the one made on its behalf goes too.
            let withdrawn = self.endpoints.withdraw_presubscribed(&change.removed);
            total.fetch_sub(withdrawn.len() as u64, Ordering::Relaxed);
            cache.unwatch(self.id, withdrawn.iter().map(String::as_str));
        }
        refused += self.count_in(cx, ty, &change.added);
        if refused > 0 {
            self.refused += refused as u64;
            metrics
                .xds_names_refused_total
                .fetch_add(refused as u64, Ordering::Relaxed);
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
        let kept = req.initial_resource_versions.len();
        if kept > 0 && !cache.snapshot().is_complete() {
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
            unsubscribed = req.resource_names_unsubscribe.len(),
            first = ?subscribe.first().map(|n| clip(n)),
            "subscriptions changed"
        );
        // Names the client says it has (on reconnect) are not new to it: their load
        // assignments need no head start.
        let mut fresh = change.added;
        fresh.retain(|name| !req.initial_resource_versions.contains_key(name));
        if ty == ResourceType::Cluster {
            self.record_asked(cx, &fresh);
            fresh.extend(self.take_prewarm(cx));
        }
        Some((ty, fresh))
    }

    /// Records in the history the clusters the proxy just asked for on demand: registered
    /// ones, each a need the history did not predict for this proxy.
    fn record_asked(&self, cx: &Context<'_>, names: &[String]) {
        let Some(prewarm) = cx.prewarm else {
            return;
        };
        let snapshot = cx.cache.snapshot();
        let asked: Vec<&str> = (names.iter())
            .map(String::as_str)
            .filter(|name| snapshot.get(name).is_some())
            .collect();
        if asked.is_empty() {
            return;
        }
        (cx.metrics.prewarm_asked_total).fetch_add(asked.len() as u64, Ordering::Relaxed);
        prewarm.asked(&self.node_cluster, asked);
    }

    /// Sends ahead, once per stream, the clusters the proxy's service used before (its wildcard
    /// subscription takes them), as soon as the registry is complete (until then, which VIPs
    /// are gone is not known). Only registered ones, within the stream's bound and the room
    /// left under `--xds-max-subscriptions`. Returns the names added.
    fn take_prewarm(&mut self, cx: &Context<'_>) -> Vec<String> {
        let Some(prewarm) = cx.prewarm else {
            return Vec::new();
        };
        let snapshot = cx.cache.snapshot();
        if !self.prewarm_due || !snapshot.is_complete() {
            return Vec::new();
        }
        self.prewarm_due = false;
        let used = cx.metrics.xds_cluster_subscriptions.load(Ordering::Relaxed) as usize;
        // Half the room left under --xds-max-subscriptions at most: the rest stays for what
        // proxies ask for themselves.
        let room = cx.max_subscriptions.saturating_sub(used) / 2;
        let mut predicted = prewarm.predict(&self.node_cluster, |name| {
            snapshot.get(name).is_some() && parse_cluster_name(name).is_ok()
        });
        predicted.retain(|name| !self.clusters.contains(name));
        predicted.truncate(room);
        let added = self.clusters.push_ahead(&predicted);
        if added.is_empty() {
            return added;
        }
        // Only registered clusters are sent ahead; one that left the registry between the
        // prediction and now is served as any unregistered name (admitted or refused).
        self.count_in(cx, ResourceType::Cluster, &added);
        self.prewarmed += added.len();
        let now = crate::prewarm::unix_now();
        self.ahead
            .extend(added.iter().map(|name| (name.clone(), now)));
        (cx.metrics.prewarm_pushed_total).fetch_add(added.len() as u64, Ordering::Relaxed);
        prewarm.pushed(&self.node_id, &self.node_cluster, &added);
        odmesh_base::limited!(
            info,
            stream = self.id,
            node = %clip(&self.node_id),
            service = %clip(&self.node_cluster),
            clusters = added.len(),
            "sending a connecting proxy its service's clusters ahead (prewarm)"
        );
        added
    }

    /// Counts newly subscribed `names` of type `ty` (the gauges, the cache's watch) and, for
    /// clusters, admits unregistered ones within the stream's bound. Returns how many were
    /// refused.
    fn count_in(&mut self, cx: &Context<'_>, ty: ResourceType, names: &[String]) -> usize {
        let metrics = cx.metrics;
        (metrics.xds_subscriptions).fetch_add(names.len() as u64, Ordering::Relaxed);
        let unregistered = cx.cache.watch(self.id, &self.node_cluster, names);
        if ty != ResourceType::Cluster {
            return 0;
        }
        (metrics.xds_cluster_subscriptions).fetch_add(names.len() as u64, Ordering::Relaxed);
        // Every unregistered name is a cluster in Envoy for the stream's life: a client
        // sending random `Host`s must not grow that without bound.
        (unregistered.into_iter())
            .filter(|name| !self.clusters.admit_unregistered(name))
            .count()
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
        let diff = if changes.all {
            Diff::All
        } else {
            self.clusters.mark_changed(&changes.names);
            self.endpoints.mark_changed(&changes.names);
            Diff::Pending
        };
        // The registry became complete: what was to be sent ahead goes now.
        let ahead = self.take_prewarm(cx);
        if !ahead.is_empty() {
            let [clusters, endpoints] = self.answer(cx, ResourceType::Cluster, ahead, diff);
            let endpoints = endpoints.or_else(|| self.respond(cx, ResourceType::Endpoints, diff));
            return [clusters, endpoints];
        }
        if self.clusters.is_waiting() {
            let used = cx.metrics.xds_cluster_subscriptions.load(Ordering::Relaxed) as usize;
            let admitted = self
                .clusters
                .admit_waiting(cx.max_subscriptions.saturating_sub(used));
            if !admitted.is_empty() {
                let refused = self.count_in(cx, ResourceType::Cluster, &admitted);
                self.refused += refused as u64;
                (cx.metrics.xds_names_refused_total).fetch_add(refused as u64, Ordering::Relaxed);
                let [clusters, endpoints] = self.answer(cx, ResourceType::Cluster, admitted, diff);
                // Whatever else changed for the load assignments goes in the same round.
                let endpoints =
                    endpoints.or_else(|| self.respond(cx, ResourceType::Endpoints, diff));
                return [clusters, endpoints];
            }
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

    /// Whether this stream holds clusters that may become idle (the server then calls
    /// [`Session::evict_idle`] now and then).
    pub fn may_evict(&self, cx: &Context<'_>) -> bool {
        cx.eviction.is_some() && cx.prewarm.is_some() && !self.ahead.is_empty()
    }

    /// Removes from the proxy the clusters it holds under its wildcard subscription that
    /// carried no request for the eviction timeout, by its load reports: it drops them (and
    /// their load assignments), and asks for any of them by name when a request needs it
    /// again. Returns the removal to send, if any.
    pub fn evict_idle(&mut self, cx: &Context<'_>) -> Option<DeltaDiscoveryResponse> {
        let (Some(eviction), Some(prewarm)) = (cx.eviction, cx.prewarm) else {
            return None;
        };
        // Once per load report interval at most: nothing can have changed in between.
        let now = crate::prewarm::unix_now();
        if now < self.next_idle_check {
            return None;
        }
        self.next_idle_check = now + eviction.interval.as_secs().max(1);
        let held = self.ahead.iter().map(|(name, got)| (name.as_str(), *got));
        let idle = prewarm.idle(&self.node_id, held, eviction.idle, eviction.interval);
        if idle.is_empty() {
            return None;
        }
        for name in &idle {
            self.ahead.remove(name);
        }
        let change = self.clusters.update(&[], &idle, &Default::default());
        let removed = change.removed;
        let metrics = cx.metrics;
        (metrics.xds_subscriptions).fetch_sub(removed.len() as u64, Ordering::Relaxed);
        (metrics.xds_cluster_subscriptions).fetch_sub(removed.len() as u64, Ordering::Relaxed);
        (metrics.idle_clusters_evicted_total).fetch_add(removed.len() as u64, Ordering::Relaxed);
        cx.cache
            .unwatch(self.id, removed.iter().map(String::as_str));
        // A load assignment sent ahead that Envoy has not subscribed to yet: it never will.
        let withdrawn = self.endpoints.withdraw_presubscribed(&removed);
        (metrics.xds_subscriptions).fetch_sub(withdrawn.len() as u64, Ordering::Relaxed);
        cx.cache
            .unwatch(self.id, withdrawn.iter().map(String::as_str));
        self.evicted += removed.len();
        odmesh_base::limited!(
            info,
            stream = self.id,
            node = %clip(&self.node_id),
            clusters = removed.len(),
            first = %clip(removed.first().map_or("", String::as_str)),
            "removing clusters the proxy did not use (it asks for them again when needed)"
        );
        let nonce = self.next_nonce;
        self.next_nonce += 1;
        inc(&metrics.xds_responses_total);
        let delta = Delta {
            send: Vec::new(),
            remove: removed,
        };
        Some(response(
            ResourceType::Cluster,
            delta,
            nonce,
            cx.cache.generation(),
        ))
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
        let subs = self.subs(ty);
        let loading = !cache.snapshot().is_complete();
        let delta = match diff {
            _ if subs.is_idle() => Delta::default(),
            Diff::All => subscriptions::diff(subs, loading, cache.current(&caller, ty)),
            Diff::Pending => diff_pending(subs, loading, cache.current(&caller, ty)),
        };
        subs.record(&delta);
        if delta.is_empty() && !answer_due {
            return None;
        }
        let nonce = self.next_nonce;
        self.next_nonce += 1;
        let metrics = cx.metrics;
        inc(&metrics.xds_responses_total);
        metrics
            .xds_resources_sent_total
            .fetch_add(delta.send.len() as u64, Ordering::Relaxed);
        debug!(
            stream = self.id,
            resource_type = ty.as_str(),
            nonce,
            sent = delta.send.len(),
            removed = delta.remove.len(),
            "sending delta response"
        );
        Some(response(ty, delta, nonce, cache.generation()))
    }

    /// The stream ended: its subscriptions no longer count.
    pub fn close(&self, cx: &Context<'_>) {
        cx.cache.close_stream(self.id);
        let metrics = cx.metrics;
        metrics
            .xds_cluster_subscriptions
            .fetch_sub(self.clusters.counted_len() as u64, Ordering::Relaxed);
        metrics.xds_subscriptions.fetch_sub(
            (self.clusters.counted_len() + self.endpoints.counted_len()) as u64,
            Ordering::Relaxed,
        );
    }
}

fn response(ty: ResourceType, delta: Delta, nonce: u64, generation: u64) -> DeltaDiscoveryResponse {
    DeltaDiscoveryResponse {
        system_version_info: generation.to_string(),
        resources: delta.send.iter().map(|r| r.to_resource()).collect(),
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

fn unix_seconds(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests;
