//! What only `LbEndpoint` collections do: a large VIP's endpoints one by one
//! ([`xds::leds`](crate::xds::leds)). Envoy subscribes to a glob per locality once it has the
//! VIP's load assignment; the stream remembers, per glob, the endpoints it last sent (shared
//! with the cache, not copied) and sends each change as the members that changed.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse,
};
use tracing::debug;

use super::{Context, Diff, Service, Session};
use crate::cache::Changes;
use crate::xds::leds::{self, LB_ENDPOINT_TYPE_URL, Leds};
use crate::xds::{ResourceName, ResourceType};

/// The collections one stream subscribes: glob name → what it was sent.
#[derive(Debug, Default)]
pub(super) struct Collections {
    globs: BTreeMap<String, Sent>,
}

/// One subscribed glob: its cluster and locality, and the split assignment whose members
/// it was last sent (`None`: nothing yet).
#[derive(Debug)]
struct Sent {
    cluster: ResourceName,
    locality: usize,
    leds: Option<Arc<Leds>>,
}

impl Session {
    /// The stream's epoch in its collections' names: new on every stream (see
    /// [`xds::leds`](crate::xds::leds)).
    pub fn epoch(&self) -> String {
        leds::epoch(self.id)
    }

    /// How many collections the stream subscribes.
    pub fn collections(&self) -> usize {
        self.leds.as_ref().map_or(0, |c| c.globs.len())
    }

    /// Handles a request for `LbEndpoint` collections: the globs it subscribes (again, or for
    /// the first time) get every member, those it unsubscribes are forgotten (and, once none
    /// is left, the stream's collections with them).
    ///
    /// A glob is taken only if it is, byte for byte, the name of a locality of a split load
    /// assignment the stream subscribes and counts, in the stream's current generation: a
    /// client can make the stream hold no more globs than its clusters have localities, and
    /// nothing is looked up in the cache for a name the stream does not count. Any other (one
    /// of an earlier stream or generation, whose assignment is on its way again) is left
    /// unanswered; a name in odmesh's namespace that cannot be read (Envoy adds the
    /// bootstrap's `node_context_params` to it) turns the stream to whole assignments.
    pub(super) fn on_collections_request(
        &mut self,
        cx: &Context<'_>,
        req: &DeltaDiscoveryRequest,
    ) -> [Option<DeltaDiscoveryResponse>; 2] {
        self.note_ack(cx, "lb_endpoint", req);
        let unreadable = (req.resource_names_subscribe.iter())
            .any(|n| leds::is_collection_name(n) && leds::parse_glob(n).is_none());
        if unreadable && self.fall_back_to_whole("the proxy names collections odmesh cannot read") {
            return [self.respond(cx, ResourceType::Endpoints, Diff::All), None];
        }
        let epoch = self.epoch();
        let mut lookup = cx
            .cache
            .current(&self.node_cluster, ResourceType::Endpoints);
        let collections = self.leds.get_or_insert_with(Box::default);
        for name in &req.resource_names_unsubscribe {
            collections.globs.remove(name.as_str());
        }
        let mut fresh = HashSet::new();
        for name in &req.resource_names_subscribe {
            // Subscribed again (Envoy dropped the collection, say for a whole assignment,
            // and took it up again): it holds none of the members.
            if let Some(sent) = collections.globs.get_mut(name.as_str()) {
                sent.leds = None;
                fresh.insert(name.as_str());
                continue;
            }
            let taken = leds::parse_glob(name).and_then(|glob| {
                let ours = !self.whole_only
                    && glob.epoch.starts_with(&epoch)
                    && self.endpoints.counts(glob.cluster);
                let cluster = ResourceName::new(glob.cluster);
                let current = lookup(&cluster).filter(|_| ours)?;
                let split = current.leds.as_ref()?;
                let generation = leds::generation(&epoch, &current.version);
                let canonical = leds::collection(glob.cluster, &generation, glob.locality);
                (glob.locality < split.localities.len() && canonical == *name)
                    .then_some((cluster, glob.locality))
            });
            let Some((cluster, locality)) = taken else {
                debug!(stream = self.id, glob = %odmesh_base::logs::clip(name), "collection not served on this stream");
                continue;
            };
            let sent = Sent {
                cluster,
                locality,
                leds: None,
            };
            collections.globs.insert(name.clone(), sent);
            fresh.insert(name.as_str());
        }
        drop(lookup);
        [
            self.send_collections(cx, |name, _| fresh.contains(name)),
            None,
        ]
    }

    /// From now on, large VIPs go to this proxy as whole load assignments, and what it holds
    /// is compared again (by the caller's full diff): it rejected one, or cannot take
    /// collections, and a split VIP would otherwise stay without endpoints in it. Returns
    /// whether this turned it (once per stream).
    pub(super) fn fall_back_to_whole(&mut self, why: &str) -> bool {
        if self.whole_only || self.service != Service::Ads {
            return false;
        }
        self.whole_only = true;
        self.leds = None;
        odmesh_base::limited!(
            warn,
            stream = self.id,
            node = %odmesh_base::logs::clip(&self.node_id),
            why,
            "large VIPs go to this proxy as whole load assignments from now on"
        );
        true
    }

    /// After a change: what changed in the collections of the clusters `changes` names (all,
    /// for a full diff). Kept for the server to send after the load assignments
    /// ([`Session::take_collections`]).
    pub(super) fn note_collections_change(&mut self, cx: &Context<'_>, changes: &Changes) {
        if self.leds.is_none() {
            return;
        }
        let response = self.send_collections(cx, |_, cluster| {
            changes.all || changes.names.contains(cluster.as_str())
        });
        self.collections_due = response.map(Box::new);
    }

    /// Forgets the collections of load assignments no longer subscribed (Envoy drops them
    /// with the assignment): a stream holds no more collections than its assignments have
    /// localities.
    pub(super) fn prune_collections(&mut self) {
        let Some(collections) = self.leds.as_mut() else {
            return;
        };
        let endpoints = &self.endpoints;
        (collections.globs).retain(|_, s| endpoints.contains(s.cluster.as_str()));
        if collections.globs.is_empty() {
            self.leds = None;
        }
    }

    /// The collections' response due after a change, if any.
    pub fn take_collections(&mut self) -> Option<DeltaDiscoveryResponse> {
        self.collections_due.take().map(|r| *r)
    }

    /// The response bringing the globs `which` picks (by name and cluster) up to date, if
    /// anything changed for them. Globs of a load assignment no longer subscribed are dropped
    /// (Envoy unsubscribes them with it).
    fn send_collections(
        &mut self,
        cx: &Context<'_>,
        which: impl Fn(&str, &ResourceName) -> bool,
    ) -> Option<DeltaDiscoveryResponse> {
        self.prune_collections();
        let collections = self.leds.as_mut()?;
        let mut lookup = cx
            .cache
            .current(&self.node_cluster, ResourceType::Endpoints);
        let (mut resources, mut removed) = (Vec::new(), Vec::new());
        let epoch = leds::epoch(self.id);
        let mut stale = Vec::new();
        for (name, sent) in &mut collections.globs {
            if !which(name, &sent.cluster) {
                continue;
            }
            // A VIP no longer split, or split anew (another generation: its cluster changed,
            // or its localities), gets its load assignment again, which drops this collection
            // in Envoy: nothing more to say in it, and it is forgotten now, so that a glob
            // taken up again starts from nothing.
            let current = lookup(&sent.cluster);
            let now = current.as_ref().and_then(|v| {
                let generation = leds::generation(&epoch, &v.version);
                let same =
                    leds::collection(sent.cluster.as_str(), &generation, sent.locality) == *name;
                v.leds
                    .clone()
                    .filter(|l| same && sent.locality < l.localities.len())
            });
            let (Some(now), Some(glob)) = (now, leds::parse_glob(name)) else {
                stale.push(name.clone());
                continue;
            };
            let old = leds::locality(sent.leds.as_ref(), sent.locality);
            let (send, gone) = leds::diff(old, leds::locality(Some(&now), sent.locality));
            resources.extend(send.into_iter().map(|m| leds::member_resource(&glob, m)));
            removed.extend(
                gone.into_iter()
                    .map(|id| leds::member_name(glob.cluster, glob.epoch, glob.locality, id)),
            );
            sent.leds = Some(now);
        }
        drop(lookup);
        for name in stale {
            collections.globs.remove(&name);
        }
        if resources.is_empty() && removed.is_empty() {
            return None;
        }
        let nonce = self.next_nonce;
        self.next_nonce += 1;
        cx.metrics.sent("lb_endpoint", resources.len());
        debug!(
            stream = self.id,
            nonce,
            sent = resources.len(),
            removed = removed.len(),
            "sending collection members"
        );
        Some(DeltaDiscoveryResponse {
            system_version_info: cx.cache.generation().to_string(),
            resources,
            type_url: LB_ENDPOINT_TYPE_URL.to_owned(),
            removed_resources: removed,
            nonce: nonce.to_string(),
            ..Default::default()
        })
    }
}
