//! What a session does for `Cluster` requests only: the wildcard subscription, clusters sent
//! ahead from the service's history (prewarm) and removed again when idle, what is recorded
//! in that history, and the load assignments sent right behind new clusters.

use std::sync::atomic::Ordering;

use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse,
};
use odmesh_base::logs::clip;

use super::{Context, Delta, Diff, Service, Session, WILDCARD, response, unix_now};
use crate::xds::{ResourceName, ResourceType};

impl Session {
    /// Applies what a `Cluster` request (the stream's `first` of that type, or not) says of
    /// the wildcard subscription. Returns the names
    /// the proxy kept under it from an earlier stream, which `subscribe` must take too.
    ///
    /// Rule: a client's first request of a type with no names subscribes to the wildcard
    /// (every resource, "legacy wildcard"), as does `*` in any request; it stays subscribed
    /// to the names it adds besides. Envoy does so for clusters when its bootstrap has a
    /// `cds_config`: odmesh then sends it, ahead of any request, the clusters its service
    /// used before (see `prewarm`), never the whole registry.
    pub(super) fn apply_wildcard(
        &mut self,
        cx: &Context<'_>,
        first: bool,
        req: &DeltaDiscoveryRequest,
    ) -> Vec<String> {
        let legacy = first
            && req.resource_names_subscribe.is_empty()
            && req.resource_names_unsubscribe.is_empty();
        let explicit = req.resource_names_subscribe.iter().any(|n| n == WILDCARD);
        if self.wildcard && req.resource_names_unsubscribe.iter().any(|n| n == WILDCARD) {
            // Rule: unsubscribing `*` ends the wildcard. What was sent ahead stays subscribed
            // (and counted) as ordinary names; nothing more is sent ahead or evicted.
            self.wildcard = false;
            self.wildcard_answer_due = false;
            self.prewarm_due = false;
            self.ahead.clear();
        }
        if (legacy || explicit) && !self.wildcard {
            self.wildcard = true;
            self.wildcard_answer_due = true;
            self.prewarm_due = cx.prewarm.is_some();
        }
        // Names the proxy subscribed itself are not under the wildcard only.
        for name in (req.resource_names_subscribe.iter()).chain(&req.resource_names_unsubscribe) {
            self.ahead.remove(name);
        }
        if !self.wildcard {
            return Vec::new();
        }
        // Rule: on a new stream the client lists in `initial_resource_versions` every resource
        // it kept, including those it had under the wildcard, which it does not name in
        // `resource_names_subscribe`. They are this stream's too: kept, and brought up to
        // date like any other.
        (req.initial_resource_versions.keys())
            .filter(|name| !req.resource_names_subscribe.contains(name))
            .cloned()
            .collect()
    }

    /// Notes the names kept under the wildcard (see [`Session::apply_wildcard`]) that are
    /// subscribed now as held ahead: they may be evicted when idle.
    pub(super) fn hold_ahead(&mut self, held: Vec<String>) {
        let now = unix_now();
        for name in held {
            if self.clusters.contains(&name) {
                self.ahead.insert(name, now);
            }
        }
    }

    /// Records in the history the clusters the proxy just asked for on demand: registered
    /// ones, each a need the history did not predict for this proxy.
    pub(super) fn record_asked(&self, cx: &Context<'_>, names: &[ResourceName]) {
        let Some(prewarm) = cx.prewarm else {
            return;
        };
        let registered = cx.cache.registered();
        let asked: Vec<&str> = (names.iter())
            .map(ResourceName::as_str)
            .filter(|name| registered(name))
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
    pub(super) fn take_prewarm(&mut self, cx: &Context<'_>) -> Vec<ResourceName> {
        let Some(prewarm) = cx.prewarm else {
            return Vec::new();
        };
        if !self.prewarm_due || !cx.cache.is_complete() {
            return Vec::new();
        }
        self.prewarm_due = false;
        // Half the room left under --xds-max-subscriptions at most: the rest stays for what
        // proxies ask for themselves.
        let room = cx.admission.room_for(self.source) / 2;
        let predicted: Vec<ResourceName> = (prewarm
            .predict(&self.node_cluster, cx.cache.registered()))
        .into_iter()
        .map(ResourceName::new)
        .filter(|name| name.is_cluster() && !self.clusters.contains(name.as_str()))
        .take(room)
        .collect();
        let added = self.clusters.push_ahead(&predicted);
        if added.is_empty() {
            return added;
        }
        // Only registered clusters are sent ahead; one that left the registry between the
        // prediction and now is served as any unregistered name (admitted or refused).
        self.subscribe_counted(cx, ResourceType::Cluster, &added);
        self.prewarmed += added.len();
        let now = unix_now();
        self.ahead
            .extend(added.iter().map(|name| (name.to_string(), now)));
        (cx.metrics.prewarm_pushed_total).fetch_add(added.len() as u64, Ordering::Relaxed);
        let names: Vec<&str> = added.iter().map(ResourceName::as_str).collect();
        prewarm.pushed(&self.node_id, &self.node_cluster, &names);
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

    /// The response for the clusters `added`, and on ADS their load assignments right behind.
    pub(super) fn answer_clusters(
        &mut self,
        cx: &Context<'_>,
        added: Vec<ResourceName>,
        diff: Diff,
    ) -> [Option<DeltaDiscoveryResponse>; 2] {
        let first = self.respond(cx, ResourceType::Cluster, diff);
        // Envoy subscribes to an EDS cluster's load assignment only once it has accepted the
        // cluster: one more round trip (request, answer) before the cluster is warm, which the
        // first request to it waits for. On ADS, odmesh sends the load assignments of newly
        // subscribed clusters right behind them, as if Envoy had already asked. Envoy handles
        // the responses of one stream in order, so the cluster's EDS subscription exists when
        // its load assignment arrives; Envoy's own subscribe, which follows, is not answered
        // again (see `Subscriptions::presubscribe`).
        if self.service != Service::Ads || added.is_empty() {
            return [first, None];
        }
        // Only names answered with a cluster: Envoy never subscribes to the load assignment
        // of a name answered with a removal (refused, or not an odmesh cluster name), so such
        // a presubscription would never be taken up.
        let added: Vec<ResourceName> = (added.into_iter())
            .filter(|name| name.is_cluster() && !self.clusters.is_refused(name.as_str()))
            .collect();
        let presubscribed = self.endpoints.presubscribe(&added);
        cx.count_in(
            self.who(),
            &self.node_cluster,
            ResourceType::Endpoints,
            &presubscribed,
        );
        [first, self.respond(cx, ResourceType::Endpoints, diff)]
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
        let removal = self.evict(cx);
        self.settle_tracked(cx);
        self.prune_collections();
        removal
    }

    /// [`Session::evict_idle`] before the names the stream tracks are settled.
    fn evict(&mut self, cx: &Context<'_>) -> Option<DeltaDiscoveryResponse> {
        let (Some(eviction), Some(prewarm)) = (cx.eviction, cx.prewarm) else {
            return None;
        };
        // Once per load report interval at most: nothing can have changed in between.
        let now = unix_now();
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
        let removed = self.unsubscribe_clusters(cx, &idle);
        (cx.metrics.idle_clusters_evicted_total).fetch_add(removed.len() as u64, Ordering::Relaxed);
        self.evicted += removed.len();
        odmesh_base::limited!(
            info,
            stream = self.id,
            node = %clip(&self.node_id),
            clusters = removed.len(),
            first = %clip(removed.first().map_or("", ResourceName::as_str)),
            "removing clusters the proxy did not use (it asks for them again when needed)"
        );
        let nonce = self.next_nonce;
        self.next_nonce += 1;
        cx.metrics.sent("cluster", 0);
        let delta = Delta {
            send: Vec::new(),
            remove: removed.iter().map(ResourceName::to_string).collect(),
        };
        Some(response(
            ResourceType::Cluster,
            delta,
            nonce,
            cx.cache.generation(),
            self.id,
        ))
    }

    /// Unsubscribes the clusters `names` on the server's initiative, and the load assignments
    /// presubscribed behind them. Returns the clusters removed.
    fn unsubscribe_clusters(&mut self, cx: &Context<'_>, names: &[String]) -> Vec<ResourceName> {
        let change = self.clusters.update(&[], names, &Default::default());
        self.count_out(cx, ResourceType::Cluster, &change.removed);
        change.removed
    }
}
