//! One stream's subscriptions for one resource type, and the delta diff: what the stream's
//! proxy has, and what it must be sent.
//!
//! [`Subscriptions`] is the state (names, and which version the client has of each), and
//! [`diff`] is the one pure function that turns that state and the current resources into a
//! [`Delta`]: what to send, what to remove.
//!
//! The delta xDS rules this module follows are quoted (in our words) next to the code that
//! follows them; they come from Envoy's "xDS REST and gRPC protocol" page, section
//! "Incremental xDS", and the `DeltaDiscoveryRequest` field docs (see docs/envoy.md).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use crate::xds::{ResourceName, Versioned};

/// What a client has of one subscribed resource, as far as this stream knows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Known {
    /// Nothing yet: the resource must be sent (or its removal, if it does not exist).
    Nothing,
    /// The client was sent this version.
    Version(Arc<str>),
    /// The client said, subscribing on a new stream, that it kept this version from an
    /// earlier one (after a control-plane restart, say). Like [`Known::Version`], except
    /// that while the registry is still loading it is left alone: see [`diff`].
    Kept(Arc<str>),
    /// The client was told the resource does not exist.
    Removed,
}

/// Names the wildcard subscription in delta xDS.
pub const WILDCARD: &str = "*";

/// Bounds on what one stream may subscribe, so that a client sending random names (a flood
/// of random `Host`s through Envoy, or a hostile xDS client) costs bounded memory here and
/// in Envoy. A name over a bound is answered with a removal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SubscriptionLimits {
    /// Names one stream may subscribe to, for one type.
    pub max_names: usize,
    /// Names not registered when first asked for that one stream is served, per type: as
    /// clusters (without endpoints), each a cluster in Envoy's memory kept for the stream's
    /// life; as load assignments, those not of a cluster the stream counts. Beyond, a name is
    /// refused: answered with a removal, and neither counted nor watched until registered.
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

/// One stream's subscriptions for one resource type: one entry per subscribed name, whose
/// standing says how it counts under the bounds (counted, unregistered, refused, waiting).
#[derive(Clone, Debug, Default)]
pub struct Subscriptions {
    names: BTreeMap<ResourceName, Subscription>,
    limits: SubscriptionLimits,
    /// How many entries are [`Standing::Unregistered`] (at most `limits.max_unregistered`).
    unregistered: usize,
    /// How many entries are [`Standing::Refused`].
    refused: usize,
    /// The entries that are [`Standing::Waiting`], in name order: the first admitted when
    /// room frees up.
    waiting: BTreeSet<ResourceName>,
    /// Names whose answer may differ from what the client was last told: for a reason of this
    /// stream's own (subscribed or subscribed again, admitted, refused, sent ahead), or
    /// because the cache changed them ([`Subscriptions::mark_changed`]): what [`diff_pending`]
    /// looks at. Always subscribed names.
    pending: BTreeSet<ResourceName>,
    /// Names over `limits.max_names`, not tracked: each is answered with a removal once.
    overflow: Vec<String>,
}

/// One subscribed name.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Subscription {
    known: Known,
    standing: Standing,
    /// The server subscribed it on the client's behalf (see [`Subscriptions::presubscribe`]),
    /// and the client's own subscribe has not arrived yet.
    presubscribed: bool,
}

/// How a subscribed name counts under the bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Standing {
    /// Counted and watched in the cache, like any registered cluster.
    Counted,
    /// Counted and watched, admitted while not registered: one of the
    /// [`SubscriptionLimits::max_unregistered`] such names of the stream, until it is
    /// registered.
    Unregistered,
    /// Over [`SubscriptionLimits::max_unregistered`]: answered with a removal until it is
    /// registered. Neither watched in the cache nor counted (a client sending random names
    /// costs only its own entries here): the cache tells the stream of names newly
    /// registered ([`Cache::set_refusing`](crate::cache::Cache::set_refusing)), and one sent
    /// registered is counted from then on ([`Subscriptions::record`]).
    Refused,
    /// Beyond the room other streams left under a shared bound
    /// ([`Subscriptions::update_within`]): answered with a removal, and sent once there is room
    /// ([`Subscriptions::admit_waiting`]) — Envoy stays subscribed to a removed name, and takes
    /// a resource pushed for it later. Neither watched in the cache nor counted under the
    /// shared bound meanwhile.
    Waiting,
}

impl Standing {
    /// Whether a name of this standing is counted and watched in the cache.
    fn counts(self) -> bool {
        matches!(self, Standing::Counted | Standing::Unregistered)
    }
}

impl Subscription {
    fn new(known: Known, standing: Standing) -> Subscription {
        Subscription {
            known,
            standing,
            presubscribed: false,
        }
    }
}

/// How a request changed a [`Subscriptions`]: names new to it and names gone from it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SubscriptionChange {
    /// Names that were not subscribed before.
    pub added: Vec<ResourceName>,
    /// Names that were subscribed and are not any more.
    pub removed: Vec<ResourceName>,
    /// Names over [`SubscriptionLimits::max_names`]: not subscribed, answered with a removal.
    pub over_limit: usize,
    /// Names beyond [`Room::names`], the names tracked over all streams or by the stream's
    /// source: not subscribed, answered with a removal, as those over `max_names`.
    pub over_tracked: usize,
    /// Names beyond the room left by other streams ([`Subscriptions::update_within`]):
    /// subscribed, but waiting for room (answered with a removal meanwhile); not in `added`.
    pub over_room: usize,
    /// The request named the wildcard (`*`): not tracked as a name (see
    /// [`Subscriptions::update`]).
    pub wildcard: bool,
}

/// The room a request's new names may take: `any` under every bound on counted names over
/// all streams, and `share` of the stream's source's share alone (see
/// [`Subscriptions::update_within_share`]); and `names`, the names the stream may track
/// beyond those it does (see [`Admission`](super::Admission)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Room {
    pub any: usize,
    pub share: usize,
    pub names: usize,
}

impl Room {
    /// No bound beyond the stream's own.
    pub const UNBOUNDED: Room = Room {
        any: usize::MAX,
        share: usize::MAX,
        names: usize::MAX,
    };
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
    /// `initial_resource_versions`. Each name new to the stream is parsed here, once.
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
        room: usize,
    ) -> SubscriptionChange {
        let room = Room {
            any: room,
            ..Room::UNBOUNDED
        };
        self.update_within_share(subscribe, unsubscribe, initial_versions, room)
    }

    /// [`Subscriptions::update_within`] where kept names too take from `room.share`, what is
    /// left of the stream's source's share (see [`Admission`](super::Admission)): the names a
    /// proxy kept need no room from other sources, but no more than its own source's share.
    /// New names take from both.
    pub fn update_within_share(
        &mut self,
        subscribe: &[String],
        unsubscribe: &[String],
        initial_versions: &HashMap<String, String>,
        mut room: Room,
    ) -> SubscriptionChange {
        let mut change = SubscriptionChange::default();
        for name in subscribe {
            if name == WILDCARD {
                change.wildcard = true;
                continue;
            }
            self.subscribe(name, initial_versions.get(name), &mut room, &mut change);
        }
        // Rule: names in `resource_names_unsubscribe` leave the tracked set; the server sends
        // nothing for them, not even a removal.
        for name in unsubscribe {
            // A name waiting for room or refused was never counted nor watched: nothing to
            // give back.
            if let Some((name, Standing::Counted | Standing::Unregistered)) = self.remove(name) {
                change.removed.push(name);
            }
        }
        // A name this request both subscribed and unsubscribed was not subscribed before and
        // is not now: neither added (it must not be counted, nor its load assignment
        // subscribed) nor removed (nothing counted it, nothing to give back).
        if !change.added.is_empty() && !change.removed.is_empty() {
            let added: HashSet<&ResourceName> = change.added.iter().collect();
            let both: HashSet<ResourceName> = (change.removed.iter())
                .filter(|name| added.contains(name))
                .cloned()
                .collect();
            if !both.is_empty() {
                change.added.retain(|name| !both.contains(name));
                change.removed.retain(|name| !both.contains(name));
            }
        }
        change
    }

    /// Subscribes `name`, of which the client says it kept version `kept`, taking room from
    /// `room` if it is new (only from its share if kept).
    fn subscribe(
        &mut self,
        name: &str,
        kept: Option<&String>,
        room: &mut Room,
        change: &mut SubscriptionChange,
    ) {
        // Rule: the server must answer every name in `resource_names_subscribe`, even one it
        // believes the client has at the latest version (the client may have dropped it and
        // asked again before its unsubscribe went out). So a subscribe forgets what we thought
        // the client had...
        //
        // Rule: ...unless the client says what it has. On a new stream, the first request of
        // each type carries `initial_resource_versions`: the resources the client kept from
        // the previous stream, with their versions. The server sends only those whose version
        // differs, and everything the client does not list.
        let known = kept.map_or(Known::Nothing, |v| Known::Kept(Arc::from(v.as_str())));
        if let Some(sub) = self.names.get_mut(name) {
            // odmesh's exception: a name the server subscribed on the client's behalf (and
            // sent) just before the client's own subscribe arrived is not resent. That
            // subscribe was already on its way; the client did not drop anything in between.
            if std::mem::take(&mut sub.presubscribed) && kept.is_none() {
                return;
            }
            if sub.standing != Standing::Waiting {
                sub.known = known;
            }
            let name = self.key(name);
            self.pending.insert(name);
            return;
        }
        if self.names.len() >= self.limits.max_names || room.names == 0 {
            match room.names {
                0 => change.over_tracked += 1,
                _ => change.over_limit += 1,
            }
            self.overflow.push(name.to_owned());
            return;
        }
        room.names -= 1;
        let name = ResourceName::new(name);
        // What the client kept from an earlier stream is in its memory already: it takes no
        // room from other sources' streams (taking it away could cost requests); only from its
        // own source's share, which a real proxy never held more than.
        let free = match kept {
            Some(_) => room.share,
            None => room.any.min(room.share),
        };
        if free == 0 {
            change.over_room += 1;
            self.waiting.insert(name.clone());
            self.pending.insert(name.clone());
            self.names
                .insert(name, Subscription::new(Known::Nothing, Standing::Waiting));
            return;
        }
        room.share = room.share.saturating_sub(1);
        if kept.is_none() {
            room.any -= 1;
        }
        self.pending.insert(name.clone());
        self.names
            .insert(name.clone(), Subscription::new(known, Standing::Counted));
        change.added.push(name);
    }

    /// The key of subscribed `name`, shared (a clone of the map's own).
    fn key(&self, name: &str) -> ResourceName {
        let (key, _) = self.names.get_key_value(name).expect("subscribed");
        key.clone()
    }

    /// Forgets `name` wherever it is kept. Returns it and how it stood, if it was subscribed.
    fn remove(&mut self, name: &str) -> Option<(ResourceName, Standing)> {
        let (name, sub) = self.names.remove_entry(name)?;
        self.pending.remove(&name);
        match sub.standing {
            Standing::Unregistered => self.unregistered -= 1,
            Standing::Refused => self.refused -= 1,
            Standing::Waiting => {
                self.waiting.remove(&name);
            }
            Standing::Counted => {}
        }
        Some((name, sub.standing))
    }

    /// Changes how `name`, subscribed, stands, keeping the counts in step.
    fn set_standing(&mut self, name: &ResourceName, standing: Standing) {
        let Some(sub) = self.names.get_mut(name) else {
            return;
        };
        let was = std::mem::replace(&mut sub.standing, standing);
        match was {
            Standing::Unregistered => self.unregistered -= 1,
            Standing::Refused => self.refused -= 1,
            Standing::Waiting => {
                self.waiting.remove(name);
            }
            Standing::Counted => {}
        }
        match standing {
            Standing::Unregistered => self.unregistered += 1,
            Standing::Refused => self.refused += 1,
            Standing::Waiting => {
                self.waiting.insert(name.clone());
            }
            Standing::Counted => {}
        }
    }

    /// Makes `names`, refused and registered since, wait for room like names beyond the room
    /// when they were asked for: the client still holds nothing for them, and they are sent
    /// once admitted ([`Subscriptions::admit_waiting`]).
    pub fn wait_for_room(&mut self, names: &[ResourceName]) {
        for name in names {
            if self.is_refused(name.as_str()) {
                self.set_standing(name, Standing::Waiting);
            }
        }
    }

    /// Takes at most `room` of the names waiting for room: they are subscribed like any other
    /// from now on, and sent by the next diff. Returns them, for the caller to watch and
    /// count.
    pub fn admit_waiting(&mut self, room: usize) -> Vec<ResourceName> {
        let admitted: Vec<ResourceName> = self.waiting.iter().take(room).cloned().collect();
        for name in &admitted {
            self.set_standing(name, Standing::Counted);
            self.pending.insert(name.clone());
            if let Some(sub) = self.names.get_mut(name) {
                sub.known = Known::Nothing;
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
    /// waiting for room and those refused.
    pub fn counted_names(&self) -> impl Iterator<Item = &str> {
        (self.names.iter())
            .filter(|(_, sub)| sub.standing.counts())
            .map(|(name, _)| name.as_str())
    }

    /// How many subscribed names count (see [`Subscriptions::counted_names`]).
    pub fn counted_len(&self) -> usize {
        self.names.len() - self.waiting.len() - self.refused
    }

    /// Whether `name` is subscribed and counts (see [`Subscriptions::counted_names`]).
    pub fn counts(&self, name: &str) -> bool {
        (self.names.get(name)).is_some_and(|sub| sub.standing.counts())
    }

    /// Whether some names are refused (see [`Subscriptions::admit_unregistered`]).
    pub fn has_refused(&self) -> bool {
        self.refused > 0
    }

    /// Admits `name`, subscribed and not registered, within
    /// [`SubscriptionLimits::max_unregistered`]; over it, the name is refused: answered with
    /// a removal until it is registered, and neither counted nor watched meanwhile. Returns
    /// whether it was admitted. Names the client kept from an earlier stream count the same
    /// (a real proxy held no more than the bound of them, and an unregistered cluster, with no
    /// endpoints, carries no request that would work: a kept list cannot bring in more).
    pub fn admit_unregistered(&mut self, name: &str) -> bool {
        let Some(sub) = self.names.get(name) else {
            return true;
        };
        match sub.standing {
            Standing::Unregistered => return true,
            Standing::Refused | Standing::Waiting => return false,
            Standing::Counted => {}
        }
        let name = self.key(name);
        if self.unregistered < self.limits.max_unregistered {
            self.set_standing(&name, Standing::Unregistered);
            true
        } else {
            self.set_standing(&name, Standing::Refused);
            self.pending.insert(name);
            false
        }
    }

    /// Whether `name` is refused (see [`Subscriptions::admit_unregistered`]).
    pub fn is_refused(&self, name: &str) -> bool {
        (self.names.get(name)).is_some_and(|sub| sub.standing == Standing::Refused)
    }

    /// Subscribes `names` on the client's behalf, ahead of the client's own subscribe, which the
    /// server knows is coming (Envoy subscribes to an EDS cluster's load assignment once it
    /// has the cluster). Names already subscribed are left alone. When the client's subscribe
    /// arrives, it is not answered again with what was sent meanwhile. Returns the names added.
    pub fn presubscribe(&mut self, names: &[ResourceName]) -> Vec<ResourceName> {
        let added = self.push_ahead(names);
        for name in &added {
            if let Some(sub) = self.names.get_mut(name) {
                sub.presubscribed = true;
            }
        }
        added
    }

    /// Subscribes `names` on a wildcard stream on the server's initiative: clusters sent ahead
    /// of any request (prewarm), which the client takes under its wildcard subscription and
    /// will not subscribe to by name. Names already subscribed are left alone, and none beyond
    /// [`SubscriptionLimits::max_names`] is added. Returns the names added.
    pub fn push_ahead(&mut self, names: &[ResourceName]) -> Vec<ResourceName> {
        let mut added = Vec::new();
        for name in names {
            if name == WILDCARD
                || self.names.contains_key(name)
                || self.names.len() >= self.limits.max_names
            {
                continue;
            }
            let sub = Subscription::new(Known::Nothing, Standing::Counted);
            self.names.insert(name.clone(), sub);
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
    pub fn withdraw_presubscribed(&mut self, names: &[ResourceName]) -> Vec<ResourceName> {
        let mut removed = Vec::new();
        for name in names {
            if (self.names.get(name)).is_some_and(|sub| sub.presubscribed) {
                removed.extend(self.remove(name.as_str()).map(|(name, _)| name));
            }
        }
        removed
    }

    /// Marks those of `names` that are subscribed as pending: their resources changed in the
    /// cache, so the next [`diff_pending`] looks at them.
    pub fn mark_changed<'a>(&mut self, names: impl IntoIterator<Item = &'a String>) {
        for name in names {
            if let Some((name, _)) = self.names.get_key_value(name.as_str()) {
                self.pending.insert(name.clone());
            }
        }
    }

    /// Records that `delta`, a [`diff`] or [`diff_pending`] of these subscriptions, went out
    /// (or that it was empty): the client now has those versions, or knows of the removals,
    /// and nothing is pending. A NACK does not undo this, on purpose: the client keeps its
    /// previous version, and the server sends the resource again only when it changes, never
    /// in a loop. Returns the names that were refused and were sent, registered: they count
    /// from now on, and the caller counts them (watches them in the cache).
    #[must_use]
    pub fn record(&mut self, delta: &Delta) -> Vec<ResourceName> {
        self.pending.clear();
        let mut counted = Vec::new();
        for r in &delta.send {
            let Some(sub) = self.names.get_mut(r.name.as_str()) else {
                continue;
            };
            sub.known = Known::Version(r.version.clone());
            // A registered cluster is an ordinary subscription from now on, whatever it
            // becomes: it counts against no bound of the stream's.
            let was = sub.standing;
            if r.registered && matches!(was, Standing::Unregistered | Standing::Refused) {
                let name = self.key(&r.name);
                self.set_standing(&name, Standing::Counted);
                if was == Standing::Refused {
                    counted.push(name);
                }
            }
        }
        for name in &delta.remove {
            if let Some(sub) = self.names.get_mut(name.as_str()) {
                sub.known = Known::Removed;
            }
        }
        self.overflow.clear();
        counted
    }

    /// The subscribed names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.names.keys().map(ResourceName::as_str)
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
    current: impl FnMut(&ResourceName) -> Option<Arc<Versioned>>,
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
    current: impl FnMut(&ResourceName) -> Option<Arc<Versioned>>,
) -> Delta {
    diff_of(subs, subs.pending.iter(), loading, current)
}

/// The diff of the subscribed ones of `names` (sorted), and the pending removals of names
/// over the bounds.
fn diff_of<'a>(
    subs: &Subscriptions,
    names: impl Iterator<Item = &'a ResourceName>,
    loading: bool,
    mut current: impl FnMut(&ResourceName) -> Option<Arc<Versioned>>,
) -> Delta {
    let mut delta = Delta::default();
    for name in names {
        let Some(sub) = subs.names.get(name) else {
            continue;
        };
        if loading && matches!(sub.known, Known::Kept(_)) {
            continue;
        }
        let now = match sub.standing {
            Standing::Waiting => None,
            Standing::Refused => current(name).filter(|r| r.registered),
            Standing::Counted | Standing::Unregistered => current(name),
        };
        match (&sub.known, now) {
            (Known::Version(have) | Known::Kept(have), Some(now)) if *have == now.version => {}
            (_, Some(now)) => delta.send.push(now),
            (Known::Removed, None) => {}
            (_, None) => delta.remove.push(name.to_string()),
        }
    }
    delta.remove.extend(subs.overflow.iter().cloned());
    delta
}
