//! The resource cache and the delta diff: what each subscriber has, and what it must be sent.
//!
//! Two halves, both free of streams and gRPC (the [`server`](crate::server) owns those):
//!
//! - [`Cache`] holds the current [`Snapshot`] and, for every cluster name some proxy has
//!   subscribed to, its built resources with their versions. Resources are built lazily, on the
//!   first subscription to a name (a registry may hold 100k VIPs; proxies ask for a few), and on
//!   a snapshot change rebuilt only for subscribed names whose cluster changed. It counts which
//!   stream watches which name, and hands each stream, in its [`Inbox`], the names that changed
//!   for it: a change wakes only the streams subscribed to a changed cluster.
//! - [`Subscriptions`] is one stream's state for one resource type (names, and which version
//!   the client has of each), and [`diff`] is the one pure function that turns that state and
//!   the current resources into a [`Delta`]: what to send, what to remove.
//!
//! The delta xDS rules this module implements are quoted (in our words) next to the code that
//! follows them; they come from Envoy's "xDS REST and gRPC protocol" page, section
//! "Incremental xDS", and the `DeltaDiscoveryRequest` field docs.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::{Notify, watch};

use crate::model::Snapshot;
use crate::policy::{Effective, Policy};
use crate::xds::{self, ResourceType, Versioned, XdsOptions};

/// What a client has of one subscribed resource, as far as this stream knows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Known {
    /// Nothing yet: the resource must be sent (or its removal, if it does not exist).
    Nothing,
    /// The client was sent this version.
    Version(String),
    /// The client said, subscribing on a new stream, that it kept this version from an
    /// earlier one (after a control-plane restart, say). Like [`Known::Version`], except
    /// that while the registry is still loading it is left alone: see [`diff`].
    Kept(String),
    /// The client was told the resource does not exist.
    Removed,
}

/// Names the wildcard subscription in delta xDS.
pub const WILDCARD: &str = "*";

/// Names the cache handles under one hold of its lock, for calls that take many; also the
/// most names the server handles for one stream on an async worker (see
/// [`server`](crate::server)), so nothing there waits between slices.
pub const SLICE: usize = 64;

/// Bounds on what one stream may subscribe, so that a client sending random names (a flood
/// of random `Host`s through Envoy, or a hostile xDS client) costs bounded memory here and
/// in Envoy. A name over a bound is answered with a removal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SubscriptionLimits {
    /// Names one stream may subscribe to, for one type.
    pub max_names: usize,
    /// Names not registered when first asked for that one stream is served as clusters
    /// (without endpoints). Each is a cluster in Envoy's memory, kept for the stream's life.
    pub max_unregistered: usize,
}

impl Default for SubscriptionLimits {
    /// Generous for any real proxy: 10,000 names, 100 of them unregistered.
    fn default() -> SubscriptionLimits {
        SubscriptionLimits {
            max_names: 10_000,
            max_unregistered: 100,
        }
    }
}

/// One stream's subscriptions for one resource type.
#[derive(Clone, Debug, Default)]
pub struct Subscriptions {
    names: BTreeMap<String, Known>,
    /// Names the server added on the client's behalf (see [`Subscriptions::presubscribe`])
    /// whose subscribe from the client has not arrived yet.
    presubscribed: BTreeSet<String>,
    limits: SubscriptionLimits,
    /// Subscribed names admitted while unregistered (at most `limits.max_unregistered`).
    unregistered: BTreeSet<String>,
    /// Subscribed names over `limits.max_unregistered`: answered with a removal until they
    /// are registered.
    refused: BTreeSet<String>,
    /// Names over `limits.max_names`, not tracked: each is answered with a removal once.
    overflow: Vec<String>,
    /// Subscribed names beyond the room other streams left under a shared bound
    /// ([`Subscriptions::update_within`]): answered with a removal, and sent once there is
    /// room ([`Subscriptions::admit_waiting`]) — Envoy stays subscribed to a removed name, and
    /// takes a resource pushed for it later. Neither watched in the cache nor counted under
    /// the shared bound meanwhile.
    waiting: BTreeSet<String>,
    /// Names whose answer may differ from what the client was last told: for a reason of this
    /// stream's own (subscribed or subscribed again, admitted, refused, sent ahead), or
    /// because the cache changed them ([`Subscriptions::mark_changed`]): what [`diff_pending`]
    /// looks at.
    pending: BTreeSet<String>,
}

/// How a request changed a [`Subscriptions`]: names new to it and names gone from it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SubscriptionChange {
    /// Names that were not subscribed before.
    pub added: Vec<String>,
    /// Names that were subscribed and are not any more.
    pub removed: Vec<String>,
    /// Names over [`SubscriptionLimits::max_names`]: not subscribed, answered with a removal.
    pub over_limit: usize,
    /// Names beyond the room left by other streams ([`Subscriptions::update_within`]):
    /// subscribed, but waiting for room (answered with a removal meanwhile); not in `added`.
    pub over_room: usize,
    /// The request named the wildcard (`*`): not tracked as a name (see
    /// [`Subscriptions::update`]).
    pub wildcard: bool,
}

impl Subscriptions {
    /// Empty subscriptions bounded by `limits`.
    pub fn with_limits(limits: SubscriptionLimits) -> Subscriptions {
        Subscriptions {
            limits,
            ..Subscriptions::default()
        }
    }

    /// Applies one request's `resource_names_subscribe`, `resource_names_unsubscribe` and
    /// `initial_resource_versions`.
    ///
    /// Wildcard: odmesh never sends the whole registry, so `*` is not a name here; it is
    /// reported in [`SubscriptionChange::wildcard`], and the [`session`](crate::session) sends
    /// a wildcard stream only what its proxy's service used before
    /// ([`Subscriptions::push_ahead`]).
    pub fn update(
        &mut self,
        subscribe: &[String],
        unsubscribe: &[String],
        initial_versions: &HashMap<String, String>,
    ) -> SubscriptionChange {
        self.update_within(subscribe, unsubscribe, initial_versions, usize::MAX)
    }

    /// [`Subscriptions::update`], adding at most `room` new names (what is left of a bound
    /// shared with other streams); the names beyond wait for room (counted in
    /// [`SubscriptionChange::over_room`]). Names the client kept (in `initial_versions`) need
    /// no room.
    pub fn update_within(
        &mut self,
        subscribe: &[String],
        unsubscribe: &[String],
        initial_versions: &HashMap<String, String>,
        mut room: usize,
    ) -> SubscriptionChange {
        let mut change = SubscriptionChange::default();
        for name in subscribe {
            if name == WILDCARD {
                change.wildcard = true;
                continue;
            }
            // Rule: the server must answer every name in `resource_names_subscribe`, even one
            // it believes the client has at the latest version (the client may have dropped it
            // and asked again before its unsubscribe went out). So a subscribe forgets what we
            // thought the client had...
            //
            // Rule: ...unless the client says what it has. On a new stream, the first request
            // of each type carries `initial_resource_versions`: the resources the client kept
            // from the previous stream, with their versions. The server sends only those whose
            // version differs, and everything the client does not list.
            //
            // odmesh's exception: a name the server subscribed on the client's behalf (and sent)
            // just before the client's own subscribe arrived is not resent. That subscribe was
            // already on its way; the client did not drop anything in between.
            if self.presubscribed.remove(name) && !initial_versions.contains_key(name) {
                continue;
            }
            let known = initial_versions
                .get(name)
                .map_or(Known::Nothing, |v| Known::Kept(v.clone()));
            if !self.names.contains_key(name) {
                // What the client kept from an earlier stream is in its memory already: it
                // takes no room from other streams (taking it away could cost requests).
                let kept = initial_versions.contains_key(name);
                if self.names.len() >= self.limits.max_names {
                    change.over_limit += 1;
                    self.overflow.push(name.clone());
                    continue;
                }
                if room == 0 && !kept {
                    change.over_room += 1;
                    self.names.insert(name.clone(), Known::Nothing);
                    self.waiting.insert(name.clone());
                    self.pending.insert(name.clone());
                    continue;
                }
                if !kept {
                    room -= 1;
                }
            }
            self.pending.insert(name.clone());
            if self.names.insert(name.clone(), known).is_none() {
                change.added.push(name.clone());
            }
        }
        // Rule: names in `resource_names_unsubscribe` leave the tracked set; the server sends
        // nothing for them, not even a removal.
        for name in unsubscribe {
            self.presubscribed.remove(name);
            self.pending.remove(name);
            self.unregistered.remove(name);
            self.refused.remove(name);
            // A name waiting for room was never counted nor watched: nothing to give back.
            let waited = self.waiting.remove(name);
            if self.names.remove(name).is_some() && !waited {
                change.removed.push(name.clone());
            }
        }
        change
    }

    /// Takes at most `room` of the names waiting for room: they are subscribed like any other
    /// from now on, and sent by the next diff. Returns them, for the caller to watch and
    /// count.
    pub fn admit_waiting(&mut self, room: usize) -> Vec<String> {
        let admitted: Vec<String> = self.waiting.iter().take(room).cloned().collect();
        for name in &admitted {
            self.waiting.remove(name);
            self.pending.insert(name.clone());
            if let Some(known) = self.names.get_mut(name) {
                *known = Known::Nothing;
            }
        }
        admitted
    }

    /// Whether some names wait for room.
    pub fn is_waiting(&self) -> bool {
        !self.waiting.is_empty()
    }

    /// How many names wait for room.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// The subscribed names that count (and are watched in the cache): every name but those
    /// waiting for room.
    pub fn counted_names(&self) -> impl Iterator<Item = &str> {
        (self.names.keys())
            .filter(|name| !self.waiting.contains(*name))
            .map(String::as_str)
    }

    /// How many subscribed names count (see [`Subscriptions::counted_names`]).
    pub fn counted_len(&self) -> usize {
        self.names.len() - self.waiting.len()
    }

    /// Admits `name`, subscribed and not registered, within
    /// [`SubscriptionLimits::max_unregistered`]; over it, the name is refused: answered with
    /// a removal until it is registered. Returns whether it was admitted. Names the client
    /// kept from an earlier stream are always admitted (it holds them already), and count.
    pub fn admit_unregistered(&mut self, name: &str) -> bool {
        if self.unregistered.contains(name) {
            return true;
        }
        // Counted, so that a reconnect cannot bring more in beside them.
        if matches!(self.names.get(name), Some(Known::Kept(_))) {
            self.unregistered.insert(name.to_owned());
            return true;
        }
        if self.unregistered.len() < self.limits.max_unregistered {
            self.unregistered.insert(name.to_owned());
            true
        } else {
            self.refused.insert(name.to_owned());
            self.pending.insert(name.to_owned());
            false
        }
    }

    /// Whether `name` is refused (see [`Subscriptions::admit_unregistered`]).
    pub fn is_refused(&self, name: &str) -> bool {
        self.refused.contains(name)
    }

    /// Subscribes `names` on the client's behalf, ahead of the client's own subscribe, which the
    /// server knows is coming (Envoy subscribes to an EDS cluster's load assignment once it
    /// has the cluster). Names already subscribed are left alone. When the client's subscribe
    /// arrives, it is not answered again with what was sent meanwhile. Returns the names added.
    pub fn presubscribe(&mut self, names: &[String]) -> Vec<String> {
        let added = self.push_ahead(names);
        self.presubscribed.extend(added.iter().cloned());
        added
    }

    /// Subscribes `names` on a wildcard stream on the server's initiative: clusters sent ahead
    /// of any request (prewarm), which the client takes under its wildcard subscription and
    /// will not subscribe to by name. Names already subscribed are left alone, and none beyond
    /// [`SubscriptionLimits::max_names`] is added. Returns the names added.
    pub fn push_ahead(&mut self, names: &[String]) -> Vec<String> {
        let mut added = Vec::new();
        for name in names {
            if name == WILDCARD
                || self.names.contains_key(name)
                || self.names.len() >= self.limits.max_names
            {
                continue;
            }
            self.names.insert(name.clone(), Known::Nothing);
            self.pending.insert(name.clone());
            added.push(name.clone());
        }
        added
    }

    /// Whether `name` is subscribed (waiting for room or not).
    pub fn contains(&self, name: &str) -> bool {
        self.names.contains_key(name)
    }

    /// Unsubscribes those of `names` that are still only presubscribed: the client dropped
    /// the cluster before its own subscribe to the load assignment went out (it ignored the
    /// cluster, or never got it), so it will never subscribe, nor unsubscribe. Kept, such a
    /// name would take a place under the bounds for the stream's life, and a later subscribe
    /// from the client would be taken for the one already on its way and not answered.
    /// Returns the names removed.
    pub fn withdraw_presubscribed(&mut self, names: &[String]) -> Vec<String> {
        let mut removed = Vec::new();
        for name in names {
            if self.presubscribed.remove(name) {
                self.names.remove(name);
                self.pending.remove(name);
                self.unregistered.remove(name);
                self.refused.remove(name);
                removed.push(name.clone());
            }
        }
        removed
    }

    /// Marks those of `names` that are subscribed as pending: their resources changed in the
    /// cache, so the next [`diff_pending`] looks at them.
    pub fn mark_changed<'a>(&mut self, names: impl IntoIterator<Item = &'a String>) {
        for name in names {
            if self.names.contains_key(name) {
                self.pending.insert(name.clone());
            }
        }
    }

    /// Records that `delta`, a [`diff`] or [`diff_pending`] of these subscriptions, went out
    /// (or that it was empty): the client now has those versions, or knows of the removals,
    /// and nothing is pending. A NACK does not undo this, on purpose: the client keeps its
    /// previous version, and the server sends the resource again only when it changes, never
    /// in a loop.
    pub fn record(&mut self, delta: &Delta) {
        self.pending.clear();
        for r in &delta.send {
            if let Some(known) = self.names.get_mut(&r.name) {
                *known = Known::Version(r.version.clone());
            }
            // A registered cluster is an ordinary subscription from now on, whatever it
            // becomes: it counts against no bound.
            if r.registered {
                self.unregistered.remove(&r.name);
                self.refused.remove(&r.name);
            }
        }
        for name in &delta.remove {
            if let Some(known) = self.names.get_mut(name) {
                *known = Known::Removed;
            }
        }
        self.overflow.clear();
    }

    /// The subscribed names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.names.keys().map(String::as_str)
    }

    /// How many names are subscribed.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// Whether no name is subscribed.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// Whether nothing is due to this client: no name is subscribed and no removal of a name
    /// over the bounds is pending.
    pub fn is_idle(&self) -> bool {
        self.names.is_empty() && self.overflow.is_empty()
    }
}

/// What one stream must be sent for one resource type.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Delta {
    /// Resources to send, new or changed, sorted by name.
    pub send: Vec<Arc<Versioned>>,
    /// Names to list in `removed_resources`, sorted.
    pub remove: Vec<String>,
}

impl Delta {
    /// Whether there is nothing to send.
    pub fn is_empty(&self) -> bool {
        self.send.is_empty() && self.remove.is_empty()
    }
}

/// The delta diff: for each subscribed name, compares what the client has with `current`
/// (the resource now, or `None` if the name cannot exist).
///
/// Rule: a delta response carries only resources that are new or changed for this client,
/// and `removed_resources` for resources that went away; it never needs to repeat what the
/// client already has. Rule: the server only sends resources the client tracks (odmesh never
/// volunteers others).
///
/// odmesh answers every valid cluster name with a resource (an unregistered VIP is a cluster
/// marked `registered: false`), so a removal is only ever sent for a name that is not an
/// odmesh cluster name at all (see [`Cache`]), or for a name over the stream's
/// [`SubscriptionLimits`] (a refused name, until it is registered).
///
/// `loading`: the registry is still loading (the control plane just restarted, say). What a
/// client kept from an earlier stream ([`Known::Kept`]) is then left as it is, whatever the
/// registry says so far: a registry that does not list a VIP *yet* must not take a working
/// cluster away from a proxy. Once the registry is complete, kept names are compared like
/// any other.
pub fn diff(
    subs: &Subscriptions,
    loading: bool,
    current: impl FnMut(&str) -> Option<Arc<Versioned>>,
) -> Delta {
    diff_of(subs, subs.names.keys(), loading, current)
}

/// [`diff`] restricted to the names whose answer may have changed since the stream's last
/// response ([`Subscriptions`]' pending names: subscribed, admitted, refused, sent ahead, or
/// changed in the cache, see [`Subscriptions::mark_changed`]): in time proportional to what
/// changed rather than to everything the stream holds. Equal to [`diff`] as long as every
/// cache change since the last response was marked; a change the cache cannot name per stream
/// (the registry finishing loading) is answered by a [`diff`].
pub fn diff_pending(
    subs: &Subscriptions,
    loading: bool,
    current: impl FnMut(&str) -> Option<Arc<Versioned>>,
) -> Delta {
    diff_of(subs, subs.pending.iter(), loading, current)
}

/// The diff of the subscribed ones of `names` (sorted), and the pending removals of names
/// over the bounds.
fn diff_of<'a>(
    subs: &Subscriptions,
    names: impl Iterator<Item = &'a String>,
    loading: bool,
    mut current: impl FnMut(&str) -> Option<Arc<Versioned>>,
) -> Delta {
    let mut delta = Delta::default();
    for name in names {
        let Some(known) = subs.names.get(name) else {
            continue;
        };
        if loading && matches!(known, Known::Kept(_)) {
            continue;
        }
        let now = if subs.waiting.contains(name) {
            None
        } else {
            current(name).filter(|r| r.registered || !subs.refused.contains(name))
        };
        match (known, now) {
            (Known::Version(have) | Known::Kept(have), Some(now)) if *have == now.version => {}
            (_, Some(now)) => delta.send.push(now),
            (Known::Removed, None) => {}
            (_, None) => delta.remove.push(name.clone()),
        }
    }
    delta.remove.extend(subs.overflow.iter().cloned());
    delta
}

/// Both resources of one subscribed cluster name, shared with the streams that send them.
#[derive(Clone, Debug)]
struct Built {
    cluster: Arc<Versioned>,
    endpoints: Arc<Versioned>,
}

impl Built {
    fn get(&self, ty: ResourceType) -> &Arc<Versioned> {
        match ty {
            ResourceType::Cluster => &self.cluster,
            ResourceType::Endpoints => &self.endpoints,
        }
    }
}

/// One subscribed cluster name: who subscribes, and its resources as each of them gets them.
#[derive(Debug, Default)]
struct Entry {
    /// Subscriptions to this name per stream (both types).
    streams: HashMap<StreamId, usize>,
    /// Subscriptions to this name per calling service (the proxies' `node.cluster`), over all
    /// streams and both types: which variants are needed.
    watchers: HashMap<Arc<str>, usize>,
    /// The resources, per variant: `None` for every caller without a policy override of its
    /// own for this name, `Some(caller)` for each caller with one. The inner `None` when the
    /// name is not an odmesh cluster name (`<vip>.vip` / `<svip>.svip`).
    built: HashMap<Option<Arc<str>>, Option<Built>>,
}

/// Identifies one stream to the cache (the server's stream id).
pub type StreamId = u64;

/// What changed in the cache for one stream since it last looked.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Changes {
    /// Something changed that the cache cannot name per stream (the registry finished
    /// loading, or started again): every subscription must be looked at.
    pub all: bool,
    /// The subscribed names whose resources changed.
    pub names: BTreeSet<String>,
}

impl Changes {
    /// Whether nothing changed.
    pub fn is_empty(&self) -> bool {
        !self.all && self.names.is_empty()
    }
}

/// One stream's mailbox in the cache: the [`Changes`] for it, and a wake. A change wakes only
/// the streams it concerns; the server's stream task waits on [`Inbox::notified`].
#[derive(Debug, Default)]
pub struct Inbox {
    changes: Mutex<Changes>,
    notify: Notify,
}

impl Inbox {
    /// Waits until a change is put here. A change put while nobody waited is not lost: the
    /// next wait returns at once.
    pub async fn notified(&self) {
        self.notify.notified().await;
    }

    /// Takes what changed since the last take.
    pub fn take(&self) -> Changes {
        std::mem::take(&mut *self.lock())
    }

    /// Whether a change waits to be taken.
    pub fn has_changes(&self) -> bool {
        !self.lock().is_empty()
    }

    fn lock(&self) -> MutexGuard<'_, Changes> {
        self.changes.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn put(&self, names: Vec<String>, all: bool) {
        {
            let mut changes = self.lock();
            changes.all |= all;
            changes.names.extend(names);
        }
        self.notify.notify_one();
    }
}

/// What the cache keeps of one stream: its calling service, the names it watches, its inbox.
#[derive(Debug, Default)]
struct Watcher {
    /// The caller of the stream's first watch (a stream's `node.cluster` never changes).
    caller: Option<Arc<str>>,
    names: HashSet<String>,
    inbox: Arc<Inbox>,
}

/// Both resources of cluster `name` in the variant `variant` (see [`Entry::built`]), from
/// `snapshot` and `policy`; `None` if `name` is not an odmesh cluster name.
fn build(
    snapshot: &Snapshot,
    policy: &Policy,
    name: &str,
    variant: Option<&str>,
    options: &XdsOptions,
) -> Option<Built> {
    let lookup = xds::Lookup::in_snapshot(snapshot, name);
    let r = xds::build_for(name, lookup, options, policy, variant).ok()?;
    Some(Built {
        cluster: Arc::new(r.cluster),
        endpoints: Arc::new(r.endpoints),
    })
}

/// One name's variant and its resources, built outside the lock.
type Building<'a> = (&'a str, Option<Arc<str>>, Option<Built>);

/// The names and variants a watch found unbuilt, with what building them reads: built
/// outside the cache's lock ([`Unbuilt::build`]), then kept under it ([`State::keep`]).
struct Unbuilt<'a> {
    /// The cache's generation when they were counted.
    generation: u64,
    snapshot: Arc<Snapshot>,
    policy: Arc<Policy>,
    caller: Arc<str>,
    names: Vec<(&'a String, Option<Arc<str>>)>,
}

impl<'a> Unbuilt<'a> {
    fn build(self, options: &XdsOptions) -> (u64, Arc<str>, Vec<Building<'a>>) {
        let built = (self.names.into_iter())
            .map(|(name, variant)| {
                let resources = build(
                    &self.snapshot,
                    &self.policy,
                    name,
                    variant.as_deref(),
                    options,
                );
                (name.as_str(), variant, resources)
            })
            .collect();
        (self.generation, self.caller, built)
    }
}

#[derive(Debug)]
struct State {
    snapshot: Arc<Snapshot>,
    policy: Arc<Policy>,
    generation: u64,
    entries: HashMap<String, Entry>,
    streams: HashMap<StreamId, Watcher>,
}

impl State {
    /// The variant of `name` that proxies of `caller` get.
    fn variant(&self, name: &str, caller: &Arc<str>) -> Option<Arc<str>> {
        let (vip, kind) = odmesh_names::parse_cluster_name(name).ok()?;
        (self.policy)
            .has_caller_override(kind, vip, caller)
            .then(|| caller.clone())
    }

    fn build(&self, name: &str, variant: Option<&str>, options: &XdsOptions) -> Option<Built> {
        build(&self.snapshot, &self.policy, name, variant, options)
    }

    /// Counts a subscription by `stream` (of a proxy of `caller`) to each of `names`, and
    /// returns what nobody had subscribed to yet, for the caller to build outside the lock.
    fn count<'a>(&mut self, stream: StreamId, caller: &str, names: &'a [String]) -> Unbuilt<'a> {
        let watcher = self.streams.entry(stream).or_default();
        let caller = watcher
            .caller
            .get_or_insert_with(|| Arc::from(caller))
            .clone();
        watcher.names.extend(names.iter().cloned());
        let mut unbuilt = Unbuilt {
            generation: self.generation,
            snapshot: self.snapshot.clone(),
            policy: self.policy.clone(),
            caller: caller.clone(),
            names: Vec::new(),
        };
        for name in names {
            let variant = self.variant(name, &caller);
            let entry = self.entries.entry(name.clone()).or_default();
            *entry.watchers.entry(caller.clone()).or_insert(0) += 1;
            *entry.streams.entry(stream).or_insert(0) += 1;
            if !entry.built.contains_key(&variant) {
                unbuilt.names.push((name, variant));
            }
        }
        unbuilt
    }

    /// Keeps what was built outside the lock from [`State::count`]'s [`Unbuilt`], where no
    /// one built it meanwhile; if the snapshot or the policy changed meanwhile, builds it
    /// again from the current ones.
    fn keep(
        &mut self,
        generation: u64,
        caller: &Arc<str>,
        built: Vec<Building<'_>>,
        options: &XdsOptions,
    ) {
        let current = self.generation == generation;
        for (name, variant, resources) in built {
            let (variant, resources) = if current {
                (variant, resources)
            } else {
                let variant = self.variant(name, caller);
                let resources = self.build(name, variant.as_deref(), options);
                (variant, resources)
            };
            if let Some(entry) = self.entries.get_mut(name) {
                entry.built.entry(variant).or_insert(resources);
            }
        }
    }

    /// Whether `name`, as proxies of `caller` get it, is known to be unregistered: an odmesh
    /// cluster name that the registry, complete, does not list.
    fn is_unregistered(&self, caller: &Arc<str>, name: &str) -> bool {
        let variant = self.variant(name, caller);
        self.snapshot.is_complete()
            && (self.entries.get(name))
                .and_then(|e| e.built.get(&variant))
                .and_then(Option::as_ref)
                .is_some_and(|b| !b.cluster.registered)
    }

    /// Hands each stream watching some of `names` those of them it watches, and wakes it;
    /// with `all`, wakes every stream for a full diff instead. Returns what to deliver,
    /// outside the lock.
    fn mail(&self, names: &[String], all: bool) -> Vec<(Arc<Inbox>, Vec<String>)> {
        if all {
            return (self.streams.values())
                .map(|w| (w.inbox.clone(), Vec::new()))
                .collect();
        }
        let mut per_stream: HashMap<StreamId, Vec<String>> = HashMap::new();
        for name in names {
            if let Some(entry) = self.entries.get(name) {
                for stream in entry.streams.keys() {
                    per_stream.entry(*stream).or_default().push(name.clone());
                }
            }
        }
        (per_stream.into_iter())
            .filter_map(|(id, names)| Some((self.streams.get(&id)?.inbox.clone(), names)))
            .collect()
    }

    /// Rebuilds every variant of `name` that its watchers need, and only those.
    fn rebuild(&mut self, name: &str, options: &XdsOptions) {
        let Some(entry) = self.entries.get(name) else {
            return;
        };
        let mut variants: Vec<Option<Arc<str>>> = entry
            .watchers
            .keys()
            .map(|c| self.variant(name, c))
            .collect();
        variants.sort();
        variants.dedup();
        let built = variants
            .into_iter()
            .map(|v| {
                let b = self.build(name, v.as_deref(), options);
                (v, b)
            })
            .collect();
        if let Some(entry) = self.entries.get_mut(name) {
            entry.built = built;
        }
    }

    /// Drops `count` subscriptions by `stream` (of a proxy of `caller`) to `name`; forgets its
    /// resources once nobody subscribes, and each variant no remaining watcher gets.
    /// Returns the entry forgotten, for the caller to drop after releasing the lock.
    #[must_use]
    fn forget(
        &mut self,
        stream: StreamId,
        caller: &Arc<str>,
        name: &str,
        count: usize,
    ) -> Option<Entry> {
        let entry = self.entries.get_mut(name)?;
        let by_stream = entry.streams.get_mut(&stream)?;
        let count = count.min(*by_stream);
        *by_stream -= count;
        if *by_stream == 0 {
            entry.streams.remove(&stream);
            if let Some(watcher) = self.streams.get_mut(&stream) {
                watcher.names.remove(name);
            }
        }
        let entry = self.entries.get_mut(name)?;
        let by_caller = entry.watchers.get_mut(caller)?;
        *by_caller = by_caller.saturating_sub(count);
        if *by_caller > 0 {
            return None;
        }
        entry.watchers.remove(caller);
        if entry.watchers.is_empty() {
            return self.entries.remove(name);
        }
        // A variant no remaining watcher gets (the caller's own, or the shared one when
        // only callers with an override are left) goes.
        let needed: Vec<Option<Arc<str>>> = (self.entries[name].watchers.keys())
            .map(|c| self.variant(name, c))
            .collect();
        if let Some(entry) = self.entries.get_mut(name) {
            entry.built.retain(|variant, _| needed.contains(variant));
        }
        None
    }

    /// The resources of `name` for proxies of `caller`: the built ones, or built on the spot
    /// if nobody subscribes to that variant.
    fn lookup(
        &self,
        options: &XdsOptions,
        caller: &Arc<str>,
        ty: ResourceType,
        name: &str,
    ) -> Option<Arc<Versioned>> {
        let variant = self.variant(name, caller);
        match self.entries.get(name).and_then(|e| e.built.get(&variant)) {
            Some(built) => built.as_ref().map(|b| b.get(ty).clone()),
            None => (self.build(name, variant.as_deref(), options)).map(|b| b.get(ty).clone()),
        }
    }
}

/// The current snapshot and policy, and the built resources of every subscribed cluster name.
///
/// Names that are not odmesh cluster names (anything but `<vip>.vip` / `<svip>.svip`, e.g. a
/// static cluster's name) have no resource: the diff answers them with a removal, once. odmesh
/// must never define a cluster it does not own, and Envoy asks for them only if it was
/// configured to.
///
/// A cluster is built once for all its subscribers, except for a calling service that the
/// policy gives an override of its own for that VIP: its proxies get their own variant.
///
/// Streams: each watches names under a [`StreamId`]; the cache counts which stream watches
/// which name, so a stream that ends is forgotten in one call ([`Cache::close_stream`]), and a
/// change is put only into the [`Inbox`] of the streams watching a changed name.
///
/// Locking: one mutex, never held across an `.await`. A call that takes many names holds it
/// for a slice of them at a time ([`SLICE`]), and a watch builds the resources it needs
/// outside it, so one stream's large request holds up no other stream for long (a registry or
/// policy change rebuilds the changed names under it). Inboxes are filled after it is
/// released.
#[derive(Debug)]
pub struct Cache {
    options: XdsOptions,
    state: Mutex<State>,
}

impl Cache {
    /// An empty cache (no cluster registered) that builds resources with `options`.
    pub fn new(options: XdsOptions) -> Cache {
        Cache::with_snapshot(options, Arc::default())
    }

    /// A cache that starts from `snapshot`, with the default policy.
    pub fn with_snapshot(options: XdsOptions, snapshot: Arc<Snapshot>) -> Cache {
        Cache {
            options,
            state: Mutex::new(State {
                snapshot,
                policy: Arc::default(),
                generation: 0,
                entries: HashMap::new(),
                streams: HashMap::new(),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves consistent data (every write is one insert or
        // one replace), so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The snapshot in use.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.lock().snapshot.clone()
    }

    /// The policy in use.
    pub fn policy(&self) -> Arc<Policy> {
        self.lock().policy.clone()
    }

    /// The generation: bumped by every [`Cache::set_snapshot`] and [`Cache::set_policy`].
    pub fn generation(&self) -> u64 {
        self.lock().generation
    }

    /// Registers stream `id` (if its first watch has not already) and returns its inbox, where
    /// the changes for it arrive.
    pub fn open_stream(&self, id: StreamId) -> Arc<Inbox> {
        self.lock().streams.entry(id).or_default().inbox.clone()
    }

    /// Forgets stream `id`: every name it watches, as if unwatched, and its inbox.
    pub fn close_stream(&self, id: StreamId) {
        let Some(watcher) = self.lock().streams.remove(&id) else {
            return;
        };
        let Some(caller) = watcher.caller else {
            return;
        };
        let names: Vec<String> = watcher.names.into_iter().collect();
        for (i, slice) in names.chunks(SLICE).enumerate() {
            if i > 0 {
                pause_between_slices();
            }
            let mut state = self.lock();
            let forgotten: Vec<Entry> = (slice.iter())
                .filter_map(|name| {
                    let count = (state.entries.get(name))
                        .and_then(|e| e.streams.get(&id))
                        .copied()
                        .unwrap_or(0);
                    state.forget(id, &caller, name, count)
                })
                .collect();
            drop(state);
            drop(forgotten);
        }
    }

    /// Replaces the snapshot; rebuilds the resources of subscribed names whose cluster changed
    /// (and only those), then wakes the streams watching them. Returns the names rebuilt.
    pub fn set_snapshot(&self, snapshot: Arc<Snapshot>) -> Vec<String> {
        let mut rebuilt = Vec::new();
        let old;
        let (generation, mail, streams, finishing) = {
            let mut state = self.lock();
            old = std::mem::replace(&mut state.snapshot, snapshot);
            // Only the clusters that changed, not every subscribed name: a registry of
            // 100,000 VIPs changes a few at a time.
            let changed: Vec<String> = (state.snapshot.changed_names(&old).into_iter())
                .filter(|name| state.entries.contains_key(*name))
                .map(str::to_owned)
                .collect();
            // A registry that finished loading turns every name it does not list from "not
            // known yet" into "not registered", and what clients kept is compared again: every
            // stream diffs all it holds.
            let finishing = state.snapshot.is_complete() != old.is_complete();
            let finished: Vec<String> = if finishing {
                (state.entries.iter())
                    .filter(|(_, e)| (e.built.values().flatten()).any(|b| !b.cluster.registered))
                    .map(|(name, _)| name.clone())
                    .collect()
            } else {
                Vec::new()
            };
            for name in changed.into_iter().chain(finished) {
                state.rebuild(&name, &self.options);
                rebuilt.push(name);
            }
            state.generation += 1;
            let mail = state.mail(&rebuilt, finishing);
            (state.generation, mail, state.streams.len(), finishing)
        };
        let woken = deliver(mail, finishing);
        tracing::debug!(
            generation,
            rebuilt = rebuilt.len(),
            woken,
            streams,
            "snapshot applied; subscribers woken"
        );
        // Freeing the old snapshot (a whole registry's worth of allocations) waits until the
        // lock is released and subscribers are woken.
        drop(old);
        rebuilt.sort();
        rebuilt.dedup();
        rebuilt
    }

    /// Replaces the policy; rebuilds the subscribed names whose entry (or the defaults)
    /// changed (a resource the policy does not change keeps its version, so its subscribers
    /// are sent nothing), then wakes the streams watching those. Returns the names whose
    /// resources changed for some caller.
    pub fn set_policy(&self, policy: Arc<Policy>) -> Vec<String> {
        let mut changed = Vec::new();
        let (generation, mail) = {
            let mut state = self.lock();
            let old = std::mem::replace(&mut state.policy, policy);
            // Only the names whose entry (or the defaults) changed.
            let names: Vec<String> = (state.entries.keys())
                .filter(|name| match odmesh_names::parse_cluster_name(name) {
                    Ok((vip, kind)) => old.changes_for(&state.policy, kind, vip),
                    Err(_) => false,
                })
                .cloned()
                .collect();
            for name in &names {
                let before = cluster_versions(&state.entries[name]);
                state.rebuild(name, &self.options);
                if cluster_versions(&state.entries[name]) != before {
                    changed.push(name.clone());
                }
            }
            state.generation += 1;
            // Every rebuilt name, not only those whose cluster changed: a caller's variant may
            // have changed while the shared one did not.
            (state.generation, state.mail(&names, false))
        };
        deliver(mail, false);
        changed.sort();
        tracing::info!(
            generation,
            changed = changed.len(),
            "policy applied; subscribers woken"
        );
        changed
    }

    /// Applies every snapshot `snapshots` yields, until its sender goes away. For `main`, to
    /// connect the registry watcher to the cache.
    pub async fn follow(&self, mut snapshots: watch::Receiver<Arc<Snapshot>>) {
        loop {
            let snap = snapshots.borrow_and_update().clone();
            self.set_snapshot(snap);
            if snapshots.changed().await.is_err() {
                return;
            }
        }
    }

    /// Applies every policy `policies` yields, until its sender goes away.
    pub async fn follow_policy(&self, mut policies: watch::Receiver<Arc<Policy>>) {
        loop {
            let policy = policies.borrow_and_update().clone();
            self.set_policy(policy);
            if policies.changed().await.is_err() {
                return;
            }
        }
    }

    /// Counts a subscription by stream `stream`, of a proxy of `caller`, to each of `names`
    /// (one type), building resources for names nobody had subscribed to. Returns those of
    /// `names` known to be unregistered: odmesh cluster names that the registry, complete,
    /// does not list (while it is still loading, a name it does not list yet is not known to
    /// be unregistered). A stream's caller is the one of its first watch.
    pub fn watch<'a>(&self, stream: StreamId, caller: &str, names: &'a [String]) -> Vec<&'a str> {
        let mut unregistered = Vec::new();
        // A slice at a time, building outside the lock: whatever one stream subscribes, the
        // others wait at most one slice's counting behind it (docs/benchmarks.md, section 9).
        let sliced = names.len() > SLICE;
        for (i, slice) in names.chunks(SLICE).enumerate() {
            if i > 0 {
                pause_between_slices();
            }
            let unbuilt = self.lock().count(stream, caller, slice);
            let (generation, caller, built) = unbuilt.build(&self.options);
            if sliced {
                pause_between_slices();
            }
            let mut state = self.lock();
            state.keep(generation, &caller, built, &self.options);
            unregistered.extend(
                (slice.iter())
                    .filter(|name| state.is_unregistered(&caller, name))
                    .map(String::as_str),
            );
        }
        unregistered
    }

    /// Drops a subscription by stream `stream` to each of `names`; forgets resources nobody
    /// subscribes to.
    pub fn unwatch<'a>(&self, stream: StreamId, names: impl IntoIterator<Item = &'a str>) {
        let Some(caller) = (self.lock().streams.get(&stream)).and_then(|w| w.caller.clone()) else {
            return;
        };
        let mut names = names.into_iter().peekable();
        while names.peek().is_some() {
            let mut state = self.lock();
            let forgotten: Vec<Entry> = (names.by_ref().take(SLICE))
                .filter_map(|name| state.forget(stream, &caller, name, 1))
                .collect();
            drop(state);
            drop(forgotten);
            if names.peek().is_some() {
                pause_between_slices();
            }
        }
    }

    /// How many names have resources built (the names some stream subscribes to).
    pub fn watched(&self) -> usize {
        self.lock().entries.len()
    }

    /// The resource of type `ty` for `name` now, as a caller without an override of its own
    /// gets it; built on the spot if nobody subscribes to it.
    pub fn resource(&self, ty: ResourceType, name: &str) -> Option<Arc<Versioned>> {
        self.resource_for("", ty, name)
    }

    /// [`Cache::resource`] as proxies of `caller` get it.
    pub fn resource_for(
        &self,
        caller: &str,
        ty: ResourceType,
        name: &str,
    ) -> Option<Arc<Versioned>> {
        let state = self.lock();
        state.lookup(&self.options, &Arc::from(caller), ty, name)
    }

    /// The effective policy of `name` for proxies of `caller`, with where each value came
    /// from; `None` if `name` is not an odmesh cluster name.
    pub fn effective_policy(&self, name: &str, caller: &str) -> Option<Effective> {
        let state = self.lock();
        let variant = state.variant(name, &Arc::from(caller));
        let lookup = xds::Lookup::in_snapshot(&state.snapshot, name);
        xds::effective_policy(name, lookup, &state.policy, variant.as_deref()).ok()
    }

    /// [`diff`] of `subs` (of type `ty`, a stream of a proxy of `caller`) against the
    /// resources now.
    pub fn delta(&self, caller: &str, ty: ResourceType, subs: &Subscriptions) -> Delta {
        self.delta_of(caller, ty, subs, false)
    }

    /// [`diff_pending`] of `subs` against the resources now: what a request calls for.
    pub fn delta_pending(&self, caller: &str, ty: ResourceType, subs: &Subscriptions) -> Delta {
        self.delta_of(caller, ty, subs, true)
    }

    fn delta_of(
        &self,
        caller: &str,
        ty: ResourceType,
        subs: &Subscriptions,
        pending: bool,
    ) -> Delta {
        let loading = !self.snapshot().is_complete();
        let caller: Arc<str> = Arc::from(caller);
        // The lock is taken for one name at a time: a stream with many names holds up no one.
        let current = |name: &str| self.lock().lookup(&self.options, &caller, ty, name);
        if pending {
            diff_pending(subs, loading, current)
        } else {
            diff(subs, loading, current)
        }
    }
}

/// Between two slices of a call that takes many names (made off the async workers, see
/// [`SLICE`]): gives the core to another thread that wants it, so that the scheduler takes
/// this thread off its core here rather than while it holds the lock
/// (docs/benchmarks.md, section 9).
fn pause_between_slices() {
    std::thread::yield_now();
}

/// Puts each stream's changed names into its inbox (with `all`, a full diff) and wakes it.
/// Returns how many streams were woken.
fn deliver(mail: Vec<(Arc<Inbox>, Vec<String>)>, all: bool) -> usize {
    let woken = mail.len();
    for (inbox, names) in mail {
        inbox.put(names, all);
    }
    woken
}

/// The cluster versions of every variant of an entry, to tell whether a rebuild changed it.
fn cluster_versions(entry: &Entry) -> Vec<(Option<Arc<str>>, Option<String>)> {
    let mut versions: Vec<_> = (entry.built.iter())
        .map(|(v, b)| (v.clone(), b.as_ref().map(|b| b.cluster.version.clone())))
        .collect();
    versions.sort();
    versions
}

#[cfg(test)]
mod tests {
    use super::*;
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
        let unregistered = cache.watch(stream_of(caller), caller, &change.added);
        unregistered.into_iter().map(str::to_owned).collect()
    }

    /// The stream the tests' proxies of `caller` use: one per calling service.
    fn stream_of(caller: &str) -> StreamId {
        let callers = ["", "checkout", "cart", "web"];
        callers.iter().position(|c| *c == caller).unwrap() as StreamId
    }

    /// [`send`] to a proxy of `caller`.
    fn send_as(cache: &Cache, caller: &str, ty: ResourceType, subs: &mut Subscriptions) -> Delta {
        let delta = cache.delta(caller, ty, subs);
        subs.record(&delta);
        delta
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
        let added = subs.presubscribe(&names(&["hello.vip"]));
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
        let added = eds.presubscribe(&names(&["hello.vip", "taken.vip"]));
        assert_eq!(added, ["hello.vip"]);
        send(&cache, ResourceType::Endpoints, &mut eds);

        // The client dropped hello.vip before it subscribed to its load assignment.
        let withdrawn = eds.withdraw_presubscribed(&names(&["hello.vip", "taken.vip"]));
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
        let pending = cache.delta_pending("", ResourceType::Endpoints, &subs);
        assert_eq!(pending, cache.delta("", ResourceType::Endpoints, &subs));
        subs.record(&pending);
        // `a` changes in the cache; before the stream hears of it, a request asks for `c`.
        cache.set_snapshot(snapshot(vec![
            inst("a", "10.0.0.9", Status::Up),
            inst("b", "10.0.0.2", Status::Up),
            inst("c", "10.0.0.3", Status::Up),
        ]));
        subscribe(&cache, &mut subs, &["c.vip"]);
        let answer = cache.delta_pending("", ResourceType::Endpoints, &subs);
        assert_eq!(sent_names(&answer), ["c.vip"]);
        subs.record(&answer);
        assert!(
            cache
                .delta_pending("", ResourceType::Endpoints, &subs)
                .is_empty()
        );
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
        let answer = cache.delta_pending("", ResourceType::Cluster, &subs);
        assert_eq!(answer, cache.delta("", ResourceType::Cluster, &subs));
        assert_eq!(sent_names(&answer), ["a.vip"]);
        assert_eq!(answer.remove, ["b.vip", "c.vip"]);
        subs.record(&answer);
        // Asked again, `a` is sent again (the client may have dropped it), and nothing else.
        subscribe(&cache, &mut subs, &["a.vip"]);
        let again = cache.delta_pending("", ResourceType::Cluster, &subs);
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
        cache.unwatch(0, change.removed.iter().map(String::as_str));
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
            ("same.vip".to_string(), same.version.clone()),
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

        let changed = cache.set_policy(policy("vips: {a: {request_timeout: 300ms}}"));
        assert_eq!(changed, ["a.vip"]);
        assert_eq!(
            sent_names(&send(&cache, ResourceType::Cluster, &mut on_a)),
            ["a.vip"]
        );
        assert!(send(&cache, ResourceType::Cluster, &mut on_b).is_empty());
        // The same policy again changes nothing.
        assert!(
            cache
                .set_policy(policy("vips: {a: {request_timeout: 300ms}}"))
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
            "vips: {pay: {callers: {checkout: {request_timeout: 1s}}}}",
        ));
        assert_eq!(changed, ["pay.vip"]);
        let to_checkout = send_as(&cache, "checkout", ResourceType::Cluster, &mut checkout);
        assert_eq!(sent_names(&to_checkout), ["pay.vip"]);
        assert!(send_as(&cache, "cart", ResourceType::Cluster, &mut cart).is_empty());

        // The last subscriber of each variant takes it along; the name stays for the other.
        cache.unwatch(stream_of("cart"), ["pay.vip"]);
        assert_eq!(cache.watched(), 1);
        let timeout = cache
            .effective_policy("pay.vip", "checkout")
            .unwrap()
            .request_timeout;
        assert_eq!(timeout.value, std::time::Duration::from_secs(1));
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
        cache.watch(1, "", &names(&["x.vip"]));
        cache.watch(2, "", &names(&["x.vip"]));
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
        let subscribed = names(&["hello.vip", "other.vip"]);
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
        assert!(cache.lock().is_unregistered(&caller, "other.vip"));
        assert_eq!(cache.watched(), 2);
    }

    #[test]
    fn a_watch_of_many_names_counts_and_builds_every_one() {
        // More names than one hold of the lock takes: each slice is counted and built.
        let cache = cache(vec![inst("hello", "10.0.0.1", Status::Up)]);
        let mut many: Vec<String> = (0..SLICE * 2 + 7)
            .map(|i| format!("nobody-{i}.vip"))
            .collect();
        many.push("hello.vip".to_owned());
        let unregistered = cache.watch(1, "billing", &many);
        assert_eq!(unregistered.len(), many.len() - 1);
        assert!(!unregistered.contains(&"hello.vip"));
        assert_eq!(cache.watched(), many.len());
        cache.unwatch(1, many.iter().map(String::as_str));
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
    fn a_name_the_client_kept_is_always_admitted_it_holds_it_already() {
        let mut cds = limited(100, 0);
        let initial = HashMap::from([("x.vip".to_string(), "v1".to_string())]);
        cds.update(&names(&["x.vip", "y.vip"]), &[], &initial);
        assert!(cds.admit_unregistered("x.vip"));
        assert!(!cds.admit_unregistered("y.vip"));
    }

    #[tokio::test]
    async fn follow_applies_each_snapshot_and_wakes_subscribers() {
        let cache = Arc::new(cache(vec![]));
        let inbox = cache.open_stream(1);
        cache.watch(1, "", &names(&["hello.vip"]));
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
        cache.watch(1, "", &names(&["a.vip"]));
        cache.watch(2, "", &names(&["a.vip"]));
        cache.watch(3, "", &names(&["b.vip"]));
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
        cache.watch(2, "", &names(&["b.vip", "a.vip"]));
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
}
