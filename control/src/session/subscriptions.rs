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

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use crate::xds::Versioned;

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
