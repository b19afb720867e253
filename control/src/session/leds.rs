//! What only `LbEndpoint` collections do: a large VIP's endpoints one by one
//! ([`xds::leds`](crate::xds::leds)). Envoy subscribes to a glob per locality once it has the
//! VIP's load assignment; the stream remembers, per glob, the endpoints it last sent (shared
//! with the cache, not copied) and sends each change as the members that changed.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse,
};
use tracing::debug;

use super::{Context, Session};
use crate::cache::Changes;
use crate::xds::leds::{self, LB_ENDPOINT_TYPE_URL, Leds};
use crate::xds::{ResourceName, ResourceType};
use odmesh_base::metrics::inc;

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

/// Different in every process, so that two control planes (a restart, another replica) never
/// name a collection alike.
fn process_epoch() -> u64 {
    static EPOCH: OnceLock<u64> = OnceLock::new();
    *EPOCH.get_or_init(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        nanos ^ (u64::from(std::process::id()) << 40)
    })
}

impl Session {
    /// The stream's epoch in its collections' names: new on every stream (see
    /// [`xds::leds`](crate::xds::leds)).
    pub fn epoch(&self) -> String {
        format!("{:x}.{}", process_epoch(), self.id)
    }

    /// How many collections the stream subscribes.
    pub fn collections(&self) -> usize {
        self.leds.as_ref().map_or(0, |c| c.globs.len())
    }

    /// Handles a request for `LbEndpoint` collections: the globs it subscribes (again, or for
    /// the first time) get every member, those it unsubscribes are forgotten (and, once none
    /// is left, the stream's collections with them). A glob is taken only if it names a
    /// locality of a load assignment this stream subscribes, under the stream's own epoch: a
    /// client can make the stream hold no more globs than its clusters have localities. Any
    /// other (one from an earlier stream, whose load assignment is on its way again) is left
    /// unanswered.
    pub(super) fn on_collections_request(
        &mut self,
        cx: &Context<'_>,
        req: &DeltaDiscoveryRequest,
    ) -> Option<DeltaDiscoveryResponse> {
        self.note_ack(cx, "lb_endpoint", req);
        let epoch = self.epoch();
        let mut lookup = cx
            .cache
            .current(&self.node_cluster, ResourceType::Endpoints);
        let collections = self.leds.get_or_insert_with(Box::default);
        for name in &req.resource_names_unsubscribe {
            collections.globs.remove(name.as_str());
        }
        let mut fresh = Vec::new();
        for name in &req.resource_names_subscribe {
            // Subscribed again (Envoy dropped the collection, say for a whole assignment,
            // and took it up again): it holds none of the members.
            if let Some(sent) = collections.globs.get_mut(name.as_str()) {
                sent.leds = None;
                fresh.push(name.clone());
                continue;
            }
            let taken = leds::parse_glob(name).and_then(|glob| {
                let cluster = ResourceName::new(glob.cluster);
                let ours = glob.epoch == epoch && self.endpoints.contains(glob.cluster);
                let current = lookup(&cluster).filter(|_| ours)?.leds.clone()?;
                (glob.locality < current.localities.len()).then_some((cluster, glob.locality))
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
            fresh.push(name.clone());
        }
        drop(lookup);
        self.send_collections(cx, |name, _| fresh.iter().any(|f| f == name))
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
        for (name, sent) in &mut collections.globs {
            if !which(name, &sent.cluster) {
                continue;
            }
            // A VIP no longer split gets its whole load assignment again, which drops its
            // collections in Envoy: nothing to say in them.
            let Some(now) = lookup(&sent.cluster).and_then(|v| v.leds.clone()) else {
                continue;
            };
            let Some(glob) = leds::parse_glob(name) else {
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
        if resources.is_empty() && removed.is_empty() {
            return None;
        }
        let nonce = self.next_nonce;
        self.next_nonce += 1;
        inc(&cx.metrics.xds_responses_total);
        (cx.metrics.xds_resources_sent_total)
            .fetch_add(resources.len() as u64, std::sync::atomic::Ordering::Relaxed);
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
