//! The resource cache: the resources every subscriber shares, and who is told of a change.
//!
//! [`Cache`] holds the current [`Snapshot`] and, for every cluster name some proxy has
//! subscribed to, its built resources with their versions. Resources are built lazily, on the
//! first subscription to a name (a registry may hold 100k VIPs; proxies ask for a few), and on
//! a snapshot change rebuilt only for subscribed names whose cluster changed. It counts which
//! stream watches which name, and hands each stream, in its [`Inbox`], the names that changed
//! for it: a change wakes only the streams subscribed to a changed cluster. It knows nothing
//! of streams' subscriptions nor of gRPC: a [`session`](crate::session) keeps what its proxy
//! has and diffs it against [`Cache::current`].

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use tokio::sync::{Notify, watch};

use crate::model::Snapshot;
use crate::policy::{Effective, Policy};
use crate::xds::{self, ResourceName, ResourceType, Versioned, XdsOptions};

/// Names the cache handles under one hold of its lock, for calls that take many; also the
/// most names the server handles for one stream on an async worker (see
/// [`server`](crate::server)), so nothing there waits between slices.
pub const SLICE: usize = 64;

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

/// When the changes waiting in an [`Inbox`] were made: for the push lag and the registry
/// change → proxy latency (docs/production.md, "Metrics").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stamps {
    /// When the cache took the earliest of them (before rebuilding what it changed).
    pub queued: Option<Instant>,
    /// When the registry source published the earliest registry change among them (`None`:
    /// only policy changes, or a snapshot not stamped).
    pub registry: Option<Instant>,
}

impl Stamps {
    fn merge(&mut self, taken: Instant, registry: Option<Instant>) {
        let earliest = |a: Option<Instant>, b: Option<Instant>| match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.queued = earliest(self.queued, Some(taken));
        self.registry = earliest(self.registry, registry);
    }
}

/// One stream's mailbox in the cache: the [`Changes`] for it, and a wake. A change wakes only
/// the streams it concerns; the server's stream task waits on [`Inbox::notified`].
#[derive(Debug, Default)]
pub struct Inbox {
    changes: Mutex<(Changes, Stamps)>,
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
        self.take_stamped().0
    }

    /// Takes what changed since the last take, and when it was made.
    pub fn take_stamped(&self) -> (Changes, Stamps) {
        std::mem::take(&mut *self.lock())
    }

    /// Whether a change waits to be taken.
    pub fn has_changes(&self) -> bool {
        !self.lock().0.is_empty()
    }

    fn lock(&self) -> MutexGuard<'_, (Changes, Stamps)> {
        self.changes.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn put(&self, names: Vec<String>, all: bool, (taken, registry): (Instant, Option<Instant>)) {
        {
            let mut pending = self.lock();
            let (changes, stamps) = &mut *pending;
            changes.all |= all;
            changes.names.extend(names);
            stamps.merge(taken, registry);
        }
        self.notify.notify_one();
    }
}

/// What the cache keeps of one stream: its calling service, the names it watches, its inbox.
#[derive(Debug, Default)]
struct Watcher {
    /// The caller of the stream's first watch (a stream's `node.cluster` never changes).
    caller: Option<Arc<str>>,
    names: HashSet<ResourceName>,
    inbox: Arc<Inbox>,
}

/// Both resources of cluster `name` in the variant `variant` (see [`Entry::built`]), from
/// `snapshot` and `policy`; `None` if `name` is not an odmesh cluster name.
fn build(
    snapshot: &Snapshot,
    policy: &Policy,
    name: &ResourceName,
    variant: Option<&str>,
    options: &XdsOptions,
) -> Option<Built> {
    let lookup = xds::Lookup::in_snapshot(snapshot, name.as_str());
    let r = xds::build_named(name, lookup, options, policy, variant)?;
    Some(Built {
        cluster: Arc::new(r.cluster),
        endpoints: Arc::new(r.endpoints),
    })
}

/// One name's variant and its resources, built outside the lock.
type Building<'a> = (&'a ResourceName, Option<Arc<str>>, Option<Built>);

/// The names and variants a watch found unbuilt, with what building them reads: built
/// outside the cache's lock ([`Unbuilt::build`]), then kept under it ([`State::keep`]).
struct Unbuilt<'a> {
    /// The cache's generation when they were counted.
    generation: u64,
    snapshot: Arc<Snapshot>,
    policy: Arc<Policy>,
    caller: Arc<str>,
    names: Vec<(&'a ResourceName, Option<Arc<str>>)>,
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
                (name, variant, resources)
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
    entries: HashMap<ResourceName, Entry>,
    streams: HashMap<StreamId, Watcher>,
    /// The streams holding names they refused as unregistered, which they do not watch
    /// ([`Cache::set_refusing`]): told of every name newly registered.
    refusing: HashSet<StreamId>,
}

impl State {
    /// The variant of `name` that proxies of `caller` get.
    fn variant(&self, name: &ResourceName, caller: &Arc<str>) -> Option<Arc<str>> {
        let (vip, kind) = name.cluster()?;
        (self.policy)
            .has_caller_override(kind, vip, caller)
            .then(|| caller.clone())
    }

    fn build(
        &self,
        name: &ResourceName,
        variant: Option<&str>,
        options: &XdsOptions,
    ) -> Option<Built> {
        build(&self.snapshot, &self.policy, name, variant, options)
    }

    /// Counts a subscription by `stream` (of a proxy of `caller`) to each of `names`, and
    /// returns what nobody had subscribed to yet, for the caller to build outside the lock.
    fn count<'a>(
        &mut self,
        stream: StreamId,
        caller: &str,
        names: &'a [ResourceName],
    ) -> Unbuilt<'a> {
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

    /// Hands each stream watching some of `names` those of them it watches, and wakes it;
    /// with `all`, wakes every stream for a full diff instead. Returns what to deliver,
    /// outside the lock.
    /// Streams that refuse names (see [`State::refusing`]) get `registered` besides, the
    /// names newly registered.
    fn mail(
        &self,
        names: &[String],
        registered: &[String],
        all: bool,
    ) -> Vec<(Arc<Inbox>, Vec<String>)> {
        if all {
            return (self.streams.values())
                .map(|w| (w.inbox.clone(), Vec::new()))
                .collect();
        }
        let mut per_stream: HashMap<StreamId, Vec<String>> = HashMap::new();
        for name in names {
            if let Some(entry) = self.entries.get(name.as_str()) {
                for stream in entry.streams.keys() {
                    per_stream.entry(*stream).or_default().push(name.clone());
                }
            }
        }
        if !registered.is_empty() {
            for stream in &self.refusing {
                per_stream
                    .entry(*stream)
                    .or_default()
                    .extend(registered.iter().cloned());
            }
        }
        (per_stream.into_iter())
            .filter_map(|(id, names)| Some((self.streams.get(&id)?.inbox.clone(), names)))
            .collect()
    }

    /// Rebuilds every variant of `name` that its watchers need, and only those.
    fn rebuild(&mut self, name: &str, options: &XdsOptions) {
        let Some((name, entry)) = self.entries.get_key_value(name) else {
            return;
        };
        let name = name.clone();
        let mut variants: Vec<Option<Arc<str>>> = entry
            .watchers
            .keys()
            .map(|c| self.variant(&name, c))
            .collect();
        variants.sort();
        variants.dedup();
        // A VIP split before stays split within a band below the threshold.
        let split = |v: &Option<Arc<str>>| {
            let built = entry.built.get(v).and_then(Option::as_ref);
            built.is_some_and(|b| b.endpoints.leds.is_some())
        };
        let split: Vec<bool> = variants.iter().map(split).collect();
        let staying = split.contains(&true).then(|| options.staying_split());
        let built = (variants.into_iter().zip(split))
            .map(|(v, split)| {
                let options = staying.as_ref().filter(|_| split).unwrap_or(options);
                let b = self.build(&name, v.as_deref(), options);
                (v, b)
            })
            .collect();
        if let Some(entry) = self.entries.get_mut(&name) {
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
        let (key, entry) = self.entries.get_key_value(name)?;
        let needed: Vec<Option<Arc<str>>> = (entry.watchers.keys())
            .map(|c| self.variant(key, c))
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
        name: &ResourceName,
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
    /// The generation of the last policy applied: the route streams watch it.
    policies: watch::Sender<u64>,
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
            policies: watch::channel(0).0,
            state: Mutex::new(State {
                snapshot,
                policy: Arc::default(),
                generation: 0,
                entries: HashMap::new(),
                streams: HashMap::new(),
                refusing: HashSet::new(),
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

    /// The settings every resource is built with.
    pub fn options(&self) -> &XdsOptions {
        &self.options
    }

    /// Whether the registry finished loading: until then, a name it does not list may be
    /// registered still.
    pub fn is_complete(&self) -> bool {
        self.lock().snapshot.is_complete()
    }

    /// Whether a name is a registered cluster, by the registry now (one snapshot, taken
    /// once: for many names at a time).
    pub fn registered(&self) -> impl Fn(&str) -> bool + use<> {
        let snapshot = self.snapshot();
        move |name| snapshot.get(name).is_some()
    }

    /// The policy in use.
    pub fn policy(&self) -> Arc<Policy> {
        self.lock().policy.clone()
    }

    /// Changes with every policy applied ([`Cache::set_policy`]): what a route stream waits
    /// on, as a proxy's route depends on the policy only.
    pub fn policy_changes(&self) -> watch::Receiver<u64> {
        self.policies.subscribe()
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
        let watcher = {
            let mut state = self.lock();
            state.refusing.remove(&id);
            state.streams.remove(&id)
        };
        let Some(watcher) = watcher else {
            return;
        };
        let Some(caller) = watcher.caller else {
            return;
        };
        let names: Vec<ResourceName> = watcher.names.into_iter().collect();
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
                    state.forget(id, &caller, name.as_str(), count)
                })
                .collect();
            drop(state);
            drop(forgotten);
        }
    }

    /// Replaces the snapshot; rebuilds the resources of subscribed names whose cluster changed
    /// (and only those), then wakes the streams watching them. Returns the names rebuilt.
    pub fn set_snapshot(&self, snapshot: Arc<Snapshot>) -> Vec<String> {
        let taken = Instant::now();
        let mut rebuilt = Vec::new();
        let old;
        let (generation, mail, streams, finishing, published) = {
            let mut state = self.lock();
            old = std::mem::replace(&mut state.snapshot, snapshot);
            // Only the clusters that changed, not every subscribed name: a registry of
            // 100,000 VIPs changes a few at a time.
            let changed_names = state.snapshot.changed_names(&old);
            // Names registered now and not before, for the streams that refused them.
            let registered: Vec<String> = match state.refusing.is_empty() {
                true => Vec::new(),
                false => (changed_names.iter())
                    .filter(|name| state.snapshot.get(name).is_some() && old.get(name).is_none())
                    .map(|name| (*name).to_owned())
                    .collect(),
            };
            let changed: Vec<String> = (changed_names.into_iter())
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
                    .map(|(name, _)| name.to_string())
                    .collect()
            } else {
                Vec::new()
            };
            for name in changed.into_iter().chain(finished) {
                state.rebuild(&name, &self.options);
                rebuilt.push(name);
            }
            state.generation += 1;
            let mail = state.mail(&rebuilt, &registered, finishing);
            let published = state.snapshot.take_published();
            (
                state.generation,
                mail,
                state.streams.len(),
                finishing,
                published,
            )
        };
        let woken = deliver(mail, finishing, (taken, published));
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
        let taken = Instant::now();
        let mut changed = Vec::new();
        let (generation, mail) = {
            let mut state = self.lock();
            let old = std::mem::replace(&mut state.policy, policy);
            // Only the names whose entry (or the defaults) changed.
            let names: Vec<String> = (state.entries.keys())
                .filter(|name| match name.cluster() {
                    Some((vip, kind)) => old.changes_for(&state.policy, kind, vip),
                    None => false,
                })
                .map(ResourceName::to_string)
                .collect();
            for name in &names {
                let before = cluster_versions(&state.entries[name.as_str()]);
                state.rebuild(name, &self.options);
                if cluster_versions(&state.entries[name.as_str()]) != before {
                    changed.push(name.clone());
                }
            }
            state.generation += 1;
            // Every rebuilt name, not only those whose cluster changed: a caller's variant may
            // have changed while the shared one did not.
            (state.generation, state.mail(&names, &[], false))
        };
        deliver(mail, false, (taken, None));
        self.policies.send_replace(generation);
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

    /// Those of `names` known to be unregistered: odmesh cluster names that the registry,
    /// complete, does not list (while it is still loading, a name it does not list yet is not
    /// known to be unregistered).
    pub fn unregistered<'a>(&self, names: &'a [ResourceName]) -> Vec<&'a ResourceName> {
        let snapshot = self.snapshot();
        if !snapshot.is_complete() {
            return Vec::new();
        }
        (names.iter())
            .filter(|name| name.is_cluster() && snapshot.get(name.as_str()).is_none())
            .collect()
    }

    /// Notes whether stream `stream` holds names it refused as unregistered, which it does
    /// not watch: while it does, every snapshot that registers a name new to the registry
    /// puts that name in its inbox, so that it sends the name once registered.
    pub fn set_refusing(&self, stream: StreamId, refusing: bool) {
        let mut state = self.lock();
        match refusing {
            true => state.refusing.insert(stream),
            false => state.refusing.remove(&stream),
        };
    }

    /// Counts a subscription by stream `stream`, of a proxy of `caller`, to each of `names`
    /// (one type), building resources for names nobody had subscribed to. A stream's caller
    /// is the one of its first watch.
    pub fn watch(&self, stream: StreamId, caller: &str, names: &[ResourceName]) {
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
            self.lock().keep(generation, &caller, built, &self.options);
        }
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
        let name = ResourceName::new(name);
        let state = self.lock();
        state.lookup(&self.options, &Arc::from(caller), ty, &name)
    }

    /// The effective policy of `name` for proxies of `caller`, with where each value came
    /// from; `None` if `name` is not an odmesh cluster name.
    pub fn effective_policy(&self, name: &str, caller: &str) -> Option<Effective> {
        let state = self.lock();
        let variant = state.variant(&ResourceName::new(name), &Arc::from(caller));
        let lookup = xds::Lookup::in_snapshot(&state.snapshot, name);
        xds::effective_policy(name, lookup, &state.policy, variant.as_deref()).ok()
    }

    /// The resources of type `ty` now, as proxies of `caller` get them: what a stream's diff
    /// compares its subscriptions with. The lock is taken for one name at a time: a stream
    /// with many names holds up no one.
    pub fn current(
        &self,
        caller: &str,
        ty: ResourceType,
    ) -> impl FnMut(&ResourceName) -> Option<Arc<Versioned>> + '_ {
        let caller: Arc<str> = Arc::from(caller);
        move |name| self.lock().lookup(&self.options, &caller, ty, name)
    }
}

/// Between two slices of a call that takes many names (made off the async workers, see
/// [`SLICE`]): gives the core to another thread that wants it, so that the scheduler takes
/// this thread off its core here rather than while it holds the lock
/// (docs/benchmarks.md, section 9).
fn pause_between_slices() {
    std::thread::yield_now();
}

/// Puts each stream's changed names into its inbox (with `all`, a full diff; `at`: when the
/// cache took the change, and when the registry source published it) and wakes it. Returns
/// how many streams were woken.
fn deliver(
    mail: Vec<(Arc<Inbox>, Vec<String>)>,
    all: bool,
    at: (Instant, Option<Instant>),
) -> usize {
    let woken = mail.len();
    for (inbox, names) in mail {
        inbox.put(names, all, at);
    }
    woken
}

/// A variant of an entry (`None`: for every caller without an override) and its cluster's
/// version (`None`: not an odmesh cluster name).
type VariantVersion = (Option<Arc<str>>, Option<Arc<str>>);

/// The cluster versions of every variant of an entry, to tell whether a rebuild changed it.
fn cluster_versions(entry: &Entry) -> Vec<VariantVersion> {
    let mut versions: Vec<_> = (entry.built.iter())
        .map(|(v, b)| (v.clone(), b.as_ref().map(|b| b.cluster.version.clone())))
        .collect();
    versions.sort();
    versions
}

#[cfg(test)]
mod tests;
