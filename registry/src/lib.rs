//! odmesh-registry: the one plain model of apps and instances that every registry source
//! produces, and what the sources share: the registry file source ([`file`], [`yaml`]), the
//! guard against a source that suddenly loses most of the registry ([`guard`]), how a source
//! is doing ([`status`]), and the `registry_*` metrics ([`RegistryMetrics`]).
//!
//! A source (a watched file here; a Eureka server or the embedded Eureka registry in
//! `odmesh-eureka`) turns what it reads into a [`Registry`]; everything above this layer sees
//! only that.
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};

/// The status of an instance, as Eureka names it. Only [`Status::Up`] carries traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Status {
    Up,
    Down,
    Starting,
    OutOfService,
    Unknown,
}

impl Status {
    /// Eureka's spelling: `UP`, `DOWN`, `STARTING`, `OUT_OF_SERVICE`, `UNKNOWN`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Status::Up => "UP",
            Status::Down => "DOWN",
            Status::Starting => "STARTING",
            Status::OutOfService => "OUT_OF_SERVICE",
            Status::Unknown => "UNKNOWN",
        }
    }

    /// Parses Eureka's spelling, case-insensitively; `None` for anything else.
    pub fn parse(s: &str) -> Option<Status> {
        [
            Status::Up,
            Status::Down,
            Status::Starting,
            Status::OutOfService,
            Status::Unknown,
        ]
        .into_iter()
        .find(|st| st.as_str().eq_ignore_ascii_case(s.trim()))
    }
}

/// The HTTP protocol the mesh speaks to an instance, as the instance declares it with the
/// metadata entry `odmesh.protocol` (Eureka) or the field `protocol` (registry file).
///
/// Without a declaration ([`Protocol::Auto`]) a `.vip` cluster speaks what the caller spoke
/// (HTTP/1.1 or HTTP/2) and a `.svip` cluster what TLS ALPN settles (h2 first). A declaration
/// is for what that rule cannot serve: a caller and a server that share no version (an
/// HTTP/1.1 client calling a gRPC server, an h2c client calling an HTTP/1.1-only server), or
/// a `.svip` server that prefers h2 but must be sent HTTP/1.1 (WebSocket).
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// The caller's protocol (`.vip`), or ALPN (`.svip`).
    #[default]
    Auto,
    /// Always HTTP/1.1.
    Http1,
    /// Always HTTP/2: cleartext with prior knowledge (`.vip`), ALPN `h2` (`.svip`).
    Http2,
}

impl Protocol {
    /// Every protocol, in the order of their names in messages.
    pub const ALL: [Protocol; 3] = [Protocol::Auto, Protocol::Http1, Protocol::Http2];

    /// The spelling in metadata, the registry file and the admin endpoints.
    pub const fn as_str(self) -> &'static str {
        match self {
            Protocol::Auto => "auto",
            Protocol::Http1 => "http1",
            Protocol::Http2 => "http2",
        }
    }

    /// Parses [`Protocol::as_str`], case-insensitively; the error says what is accepted.
    pub fn parse(s: &str) -> Result<Protocol, String> {
        Protocol::ALL
            .into_iter()
            .find(|p| p.as_str().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| format!("{s:?} is not one of auto, http1, http2"))
    }

    /// The protocol of a cluster whose instances declare `declared`: the one they declare
    /// when those that declare one agree; [`Protocol::Auto`] when none does, or when two
    /// instances contradict each other (a registry mistake that must not pick a winner by
    /// the order of registration).
    pub fn of_cluster(declared: impl IntoIterator<Item = Protocol>) -> Protocol {
        let mut chosen = Protocol::Auto;
        for p in declared.into_iter().filter(|p| *p != Protocol::Auto) {
            if chosen == Protocol::Auto {
                chosen = p;
            } else if chosen != p {
                return Protocol::Auto;
            }
        }
        chosen
    }
}

/// One registered instance of an app, in the terms every source shares.
///
/// VIP and SVIP names are lowercase and valid (see `odmesh_names::validate_vip`); a source
/// drops or reports names that are not.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct Instance {
    /// The app name, as registered (Eureka uppercases it); shared with the source's own
    /// copy where it has one (the embedded registry's ledger).
    pub app: Arc<str>,
    /// Unique within the app; the file form derives one from ip and ports when absent.
    pub instance_id: Arc<str>,
    /// The address traffic goes to.
    pub ip: std::net::IpAddr,
    /// The plain port, when enabled.
    pub port: Option<u16>,
    /// The secure port, when enabled.
    pub secure_port: Option<u16>,
    /// VIPs served on `port`; shared with the source's own copy where it has one (the
    /// embedded registry's ledger).
    pub vips: Vec<Arc<str>>,
    /// SVIPs served on `secure_port`.
    pub svips: Vec<Arc<str>>,
    pub status: Status,
    /// Availability zone, used as the endpoint's locality; shared by every instance in it
    /// ([`zone`]).
    pub zone: Option<Zone>,
    /// The HTTP protocol the instance declares (default: follow the caller).
    pub protocol: Protocol,
}

/// An availability zone's name, one allocation shared by every instance and endpoint in it.
pub type Zone = Arc<str>;

/// The shared name of zone `name`: a million instances name a handful of zones, and each
/// instance would otherwise hold its own copy, as would each endpoint made of it. Zones no
/// instance names any more are forgotten as new ones come (the table stays within twice
/// the zones in use), so clients naming ever new zones cannot grow it.
pub fn zone(name: &str) -> Zone {
    let mut zones = ZONES.lock().unwrap_or_else(PoisonError::into_inner);
    let zones = zones.get_or_insert_with(|| Zones {
        names: HashMap::new(),
        prune_at: 64,
    });
    if let Some(zone) = zones.names.get(name).and_then(Weak::upgrade) {
        return zone;
    }
    if zones.names.len() >= zones.prune_at {
        zones.names.retain(|_, zone| zone.strong_count() > 0);
        zones.prune_at = (2 * zones.names.len()).max(64);
    }
    let zone = Zone::from(name);
    zones.names.insert(name.into(), Arc::downgrade(&zone));
    zone
}

/// The zone names [`zone`] shares.
struct Zones {
    names: HashMap<Box<str>, Weak<str>>,
    /// How many names the table may hold before the unused ones go.
    prune_at: usize,
}

static ZONES: Mutex<Option<Zones>> = Mutex::new(None);

/// The instances of one app (or of part of one), next to each other.
pub type Group = Arc<[Arc<Instance>]>;

/// Groups of a registry, next to each other, with how many instances they hold: a source
/// that changes a few apps at a time shares the shards it did not touch.
#[derive(Debug, PartialEq, Eq)]
pub struct Shard {
    groups: Box<[Group]>,
    len: usize,
}

impl Shard {
    /// A shard of `groups` (empty groups left out).
    pub fn new(groups: impl IntoIterator<Item = Group>) -> Shard {
        let groups: Box<[Group]> = groups.into_iter().filter(|g| !g.is_empty()).collect();
        let len = groups.iter().map(|g| g.len()).sum();
        Shard { groups, len }
    }
}

/// Every instance a source knows of, in the order it read them, in groups of one app, the
/// groups in shards.
///
/// Shared, in three levels: a source that keeps what it converted (the embedded registry)
/// publishes a new registry by sharing the shards, then the groups, of the apps that did not
/// change (one pointer per shard, not per app or instance), and
/// [`Registry::changes_since`] skips a shared shard, group or instance by pointer.
///
/// A registry is *complete* when it is all its source knows, or *still loading* when the
/// source may not have everything yet: a Eureka source before its first good fetch, the
/// embedded registry while its clients register again after a restart. What a proxy already
/// holds is not taken away on the word of a registry that is still loading (see
/// odmesh-control's `cache`).
#[derive(Clone, Eq)]
pub struct Registry {
    shards: Vec<Arc<Shard>>,
    len: usize,
    complete: bool,
}

impl std::fmt::Debug for Registry {
    /// Its instances in order, not its (mostly empty) shards.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("len", &self.len)
            .field("complete", &self.complete)
            .field("instances", &self.instances().collect::<Vec<_>>())
            .finish()
    }
}

impl Default for Registry {
    /// An empty, complete registry.
    fn default() -> Registry {
        Registry {
            shards: Vec::new(),
            len: 0,
            complete: true,
        }
    }
}

impl PartialEq for Registry {
    /// The same instances in the same groups, and equally complete; a shared shard or group
    /// is equal without a look inside.
    fn eq(&self, other: &Registry) -> bool {
        if self.len != other.len || self.complete != other.complete {
            return false;
        }
        let same_group = |(a, b): (&Group, &Group)| Arc::ptr_eq(a, b) || a == b;
        let aligned = self.shards.len() == other.shards.len()
            && (self.shards.iter().zip(&other.shards))
                .all(|(a, b)| a.groups.len() == b.groups.len());
        if aligned {
            // Shard by shard, group by group: a shared shard is skipped.
            return (self.shards.iter().zip(&other.shards)).all(|(a, b)| {
                Arc::ptr_eq(a, b) || a.groups.iter().zip(b.groups.iter()).all(same_group)
            });
        }
        let count = |r: &Registry| r.groups().count();
        count(self) == count(other) && self.groups().zip(other.groups()).all(same_group)
    }
}

impl Registry {
    /// A registry of `groups`, each the instances of one app (an app may have several), in
    /// one shard.
    pub fn from_groups(groups: impl IntoIterator<Item = Group>) -> Registry {
        Registry::from_shards([Arc::new(Shard::new(groups))])
    }

    /// A registry of `shards`, in order.
    pub fn from_shards(shards: impl IntoIterator<Item = Arc<Shard>>) -> Registry {
        let shards: Vec<Arc<Shard>> = shards.into_iter().collect();
        let len = shards.iter().map(|s| s.len).sum();
        Registry {
            shards,
            len,
            complete: true,
        }
    }

    fn groups(&self) -> impl Iterator<Item = &Group> {
        self.shards.iter().flat_map(|s| s.groups.iter())
    }

    /// An empty registry of a source that has loaded nothing yet.
    pub fn loading() -> Registry {
        Registry::default().still_loading(true)
    }

    /// This registry, marked as still loading (`true`) or complete (`false`).
    pub fn still_loading(mut self, loading: bool) -> Registry {
        self.complete = !loading;
        self
    }

    /// Whether this is all the source knows (see the type's docs).
    pub fn is_complete(&self) -> bool {
        self.complete
    }

    /// Every instance, in order.
    pub fn instances(&self) -> impl Iterator<Item = &Arc<Instance>> {
        self.groups().flat_map(|g| g.iter())
    }

    /// How many instances there are.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there is no instance.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl FromIterator<Arc<Instance>> for Registry {
    /// Groups consecutive instances of the same app.
    fn from_iter<I: IntoIterator<Item = Arc<Instance>>>(instances: I) -> Registry {
        let mut groups: Vec<Group> = Vec::new();
        let mut group: Vec<Arc<Instance>> = Vec::new();
        for inst in instances {
            if group.last().is_some_and(|last| last.app != inst.app) {
                groups.push(std::mem::take(&mut group).into());
            }
            group.push(inst);
        }
        groups.push(group.into());
        Registry::from_groups(groups)
    }
}

impl FromIterator<Instance> for Registry {
    fn from_iter<I: IntoIterator<Item = Instance>>(instances: I) -> Registry {
        instances.into_iter().map(Arc::new).collect()
    }
}

impl serde::Serialize for Registry {
    /// As `{"complete": bool, "instances": [...]}`, every instance in order.
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        struct Instances<'a>(&'a Registry);
        impl serde::Serialize for Instances<'_> {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.collect_seq(self.0.instances())
            }
        }
        let mut out = serializer.serialize_struct("Registry", 2)?;
        out.serialize_field("complete", &self.complete)?;
        out.serialize_field("instances", &Instances(self))?;
        out.end()
    }
}

/// What changed between two registries, as multisets of instances: the instances of the
/// older registry that are gone, and those of the newer one that are new. An instance that
/// changed is in both (its old and its new form).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RegistryChanges {
    pub removed: Vec<Arc<Instance>>,
    pub added: Vec<Arc<Instance>>,
}

impl RegistryChanges {
    /// Whether the registries hold the same instances.
    pub fn is_empty(&self) -> bool {
        self.removed.is_empty() && self.added.is_empty()
    }
}

pub mod file;
pub mod guard;
mod metrics;
pub mod status;
pub mod yaml;

pub use metrics::RegistryMetrics;
pub use status::{SourceHealth, SourceStatus};

/// What a parser made of a document: the registry, and the instances it had to leave out.
///
/// Only sources that read what a machine wrote (Eureka's JSON) skip bad instances with a
/// warning; the hand-written YAML form fails as a whole instead.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Parsed {
    pub registry: Registry,
    /// One entry per instance, VIP or port that was left out, and why.
    pub warnings: Vec<InvalidInstance>,
}

/// One instance of a registry document that is not valid, and what is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, serde::Serialize)]
#[error(
    "instance {index} (app {app:?}{}): field `{field}`: {reason}",
    instance_id.as_deref().map(|id| format!(", id {id:?}")).unwrap_or_default()
)]
pub struct InvalidInstance {
    /// Position of the instance: in `instances` (YAML), or in its application's `instance`
    /// list (Eureka JSON). Counted from 0.
    pub index: usize,
    /// The app it claims to belong to (empty when even that is missing).
    pub app: String,
    /// Its instance id, when it has one.
    pub instance_id: Option<String>,
    /// The field that is wrong, spelled as in the document.
    pub field: String,
    /// What is wrong with it.
    pub reason: String,
}

/// Splits a comma-separated VIP list: trims, lowercases, drops empty entries and repeats.
///
/// Names are not validated here; see [`check_vip`].
pub fn split_vips(list: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for vip in list.split(',') {
        let vip = vip.trim().to_ascii_lowercase();
        if !vip.is_empty() && !out.contains(&vip) {
            out.push(vip);
        }
    }
    out
}

/// Checks one (already lowercased) VIP or SVIP name, with a reason a user can act on (the
/// name quoted, and clipped: it may come from a hostile client).
pub fn check_vip(vip: &str) -> Result<(), String> {
    odmesh_names::validate_vip(vip)
        .map_err(|e| format!("{} is not a valid VIP: {e}", odmesh_base::logs::clip(vip)))
}

/// Sends `registry` on `tx` if it differs from the one there (receivers are woken only by
/// a real change); returns whether it was sent.
pub fn publish(tx: &tokio::sync::watch::Sender<Arc<Registry>>, registry: Registry) -> bool {
    tx.send_if_modified(|current| {
        if **current == registry {
            false
        } else {
            *current = Arc::new(registry);
            true
        }
    })
}

impl Registry {
    /// What changed from `older` to `self`: one pointer comparison per shard shared with
    /// `older` (when both have as many shards), per group shared within the others, and per
    /// instance shared within the groups that are not.
    ///
    /// Both are walked side by side, ordered by app and then instance id, as every source
    /// lists them or nearly: a group (then an instance) at the same position with the same
    /// key is compared, the one with the smaller key is taken as removed or added. The
    /// result is always correct,
    /// whatever the order: what is paired is equal and cancels out, everything else is
    /// listed. Out of order, it lists more than changed (a moved instance is removed and
    /// added again), which costs the caller work but no accuracy.
    pub fn changes_since(&self, older: &Registry) -> RegistryChanges {
        let mut changes = RegistryChanges::default();
        if self.shards.len() == older.shards.len() {
            // Shard by shard: a shared shard is skipped whole.
            for (o, n) in older.shards.iter().zip(&self.shards) {
                if !Arc::ptr_eq(o, n) {
                    changed_groups(&o.groups, &n.groups, &mut changes);
                }
            }
        } else {
            // Sharded otherwise (another source, or the first registry of this one): the
            // groups side by side in app order.
            let groups = |r: &Registry| {
                let mut groups: Vec<Group> = r.groups().cloned().collect();
                groups.sort_by(|a, b| a[0].app.cmp(&b[0].app));
                groups
            };
            changed_groups(&groups(older), &groups(self), &mut changes);
        }
        changes
    }
}

/// What changed from the groups `old` to `new` (see [`Registry::changes_since`]).
fn changed_groups(old: &[Group], new: &[Group], changes: &mut RegistryChanges) {
    {
        // Group by group first: a shared group is skipped whole.
        let by_app = |o: &[Arc<Instance>], n: &[Arc<Instance>]| o[0].app.cmp(&n[0].app);
        merge(old, new, by_app, |step| match step {
            Step::Removed(group) => changes.removed.extend(group.iter().cloned()),
            Step::Added(group) => changes.added.extend(group.iter().cloned()),
            Step::Paired(o, n) => {
                let by_id = |o: &Instance, n: &Instance| {
                    (&o.app, &o.instance_id).cmp(&(&n.app, &n.instance_id))
                };
                merge(o, n, by_id, |step| match step {
                    Step::Removed(inst) => changes.removed.push(inst.clone()),
                    Step::Added(inst) => changes.added.push(inst.clone()),
                    Step::Paired(o, n) if o != n => {
                        changes.removed.push(o.clone());
                        changes.added.push(n.clone());
                    }
                    Step::Paired(..) => {}
                });
            }
        });
    }
}

/// One step of [`merge`].
enum Step<'a, T: ?Sized> {
    /// Only in the older list.
    Removed(&'a Arc<T>),
    /// Only in the newer list.
    Added(&'a Arc<T>),
    /// At the same place in both, with the same key, not the same `Arc`.
    Paired(&'a Arc<T>, &'a Arc<T>),
}

/// Walks `old` and `new` side by side, ordered by `cmp`: an element shared by pointer is
/// skipped; of two with different keys, the smaller is removed or added; two with the same
/// key are paired. Elements out of order come out as removed and added.
fn merge<'a, T: ?Sized>(
    old: &'a [Arc<T>],
    new: &'a [Arc<T>],
    cmp: impl Fn(&T, &T) -> std::cmp::Ordering,
    mut step: impl FnMut(Step<'a, T>),
) {
    use std::cmp::Ordering;
    let (mut i, mut j) = (0, 0);
    while i < old.len() && j < new.len() {
        let (o, n) = (&old[i], &new[j]);
        if Arc::ptr_eq(o, n) {
            i += 1;
            j += 1;
            continue;
        }
        match cmp(o, n) {
            Ordering::Less => {
                step(Step::Removed(o));
                i += 1;
            }
            Ordering::Greater => {
                step(Step::Added(n));
                j += 1;
            }
            Ordering::Equal => {
                step(Step::Paired(o, n));
                i += 1;
                j += 1;
            }
        }
    }
    old[i..].iter().for_each(|o| step(Step::Removed(o)));
    new[j..].iter().for_each(|n| step(Step::Added(n)));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_zone_in_use_is_one_allocation_and_unused_ones_are_forgotten() {
        let a = zone("zone-shared-test-a");
        assert!(Arc::ptr_eq(&a, &zone("zone-shared-test-a")));
        assert!(!Arc::ptr_eq(&a, &zone("zone-shared-test-b")));
        assert_eq!(&*a, "zone-shared-test-a");
        // Ever new names, each dropped at once: the table stays small.
        for i in 0..10_000 {
            drop(zone(&format!("zone-churn-{i}")));
        }
        let held = (ZONES.lock().unwrap().as_ref()).map_or(0, |z| z.names.len());
        assert!(held < 1_000, "{held} names held");
        assert!(
            Arc::ptr_eq(&a, &zone("zone-shared-test-a")),
            "a live one stays"
        );
    }

    #[test]
    fn protocols_parse_as_written_in_metadata_and_files() {
        for p in Protocol::ALL {
            assert_eq!(Protocol::parse(p.as_str()), Ok(p));
        }
        assert_eq!(Protocol::parse(" HTTP2 "), Ok(Protocol::Http2));
        assert!(Protocol::parse("h2").unwrap_err().contains("\"h2\""));
    }

    #[test]
    fn a_cluster_speaks_what_its_instances_declare_when_they_agree() {
        use Protocol::{Auto, Http1, Http2};
        assert_eq!(Protocol::of_cluster([]), Auto);
        assert_eq!(Protocol::of_cluster([Auto, Auto]), Auto);
        // One declaration speaks for the VIP: the others did not say (a rolling deploy).
        assert_eq!(Protocol::of_cluster([Auto, Http2, Auto]), Http2);
        assert_eq!(Protocol::of_cluster([Http1, Http1]), Http1);
        // A contradiction picks no winner.
        assert_eq!(Protocol::of_cluster([Http2, Auto, Http1]), Auto);
        assert_eq!(Protocol::of_cluster([Http1, Http2, Http1]), Auto);
    }

    #[test]
    fn split_vips_trims_lowercases_and_drops_empties_and_repeats() {
        assert_eq!(
            split_vips(" Hello , ,hello.internal,HELLO,"),
            vec!["hello".to_string(), "hello.internal".to_string()]
        );
        assert!(split_vips(" , ").is_empty());
    }

    #[test]
    fn publish_sends_only_a_changed_registry() {
        let (tx, mut rx) = tokio::sync::watch::channel(Arc::new(Registry::default()));
        assert!(!publish(&tx, Registry::default()));
        assert!(!rx.has_changed().unwrap());
        let one = Registry::from_iter([instance("h1", Status::Up)]);
        assert!(publish(&tx, one.clone()));
        assert_eq!(**rx.borrow_and_update(), one);
        assert!(!publish(&tx, one));
        assert!(!rx.has_changed().unwrap());
    }

    fn instance(id: &str, status: Status) -> Instance {
        Instance {
            status,
            ..testdata::instance("hello", id, "127.0.0.1")
        }
    }

    fn ids(list: &[Arc<Instance>]) -> Vec<(&str, Status)> {
        list.iter().map(|i| (&*i.instance_id, i.status)).collect()
    }

    #[test]
    fn changes_since_lists_what_was_removed_added_and_changed() {
        use Status::*;
        let old = Registry::from_iter([instance("a", Up), instance("b", Up), instance("c", Up)]);
        // b goes down, c leaves, d arrives; a is the very same instance (shared).
        let new = Registry::from_iter([
            old.instances().next().unwrap().clone(),
            Arc::new(instance("b", Down)),
            Arc::new(instance("d", Up)),
        ]);
        let changes = new.changes_since(&old);
        assert_eq!(ids(&changes.removed), [("b", Up), ("c", Up)]);
        assert_eq!(ids(&changes.added), [("b", Down), ("d", Up)]);
        assert!(new.changes_since(&new).is_empty());
        // Equal instances read again (nothing shared) are no change either.
        let reread = Registry::from_iter(new.instances().map(|i| (**i).clone()));
        assert!(reread.changes_since(&new).is_empty());
    }

    #[test]
    fn a_shared_group_is_skipped_and_others_are_compared_instance_by_instance() {
        use Status::*;
        let mut other = instance("x", Up);
        other.app = "OTHER".into();
        let hello: Group = vec![Arc::new(instance("a", Up)), Arc::new(instance("b", Up))].into();
        let old = Registry::from_groups([hello.clone(), vec![Arc::new(other.clone())].into()]);
        let mut other_down = other.clone();
        other_down.status = Down;
        let new = Registry::from_groups([hello, vec![Arc::new(other_down)].into()]);
        let changes = new.changes_since(&old);
        assert_eq!(ids(&changes.removed), [("x", Up)]);
        assert_eq!(ids(&changes.added), [("x", Down)]);
        assert_eq!((new.len(), new.is_empty()), (3, false));
        let json = serde_json::to_value(&new).unwrap();
        assert_eq!(json["instances"].as_array().unwrap().len(), 3);
    }

    #[test]
    fn a_shared_shard_is_skipped_and_sharded_groups_in_any_order_compare_by_app() {
        use Status::*;
        let app = |name: &str, id: &str, status: Status| -> Group {
            let mut i = instance(id, status);
            i.app = name.into();
            vec![Arc::new(i)].into()
        };
        let kept = Arc::new(Shard::new([app("B", "b", Up), app("A", "a", Up)]));
        let old = Registry::from_shards([kept.clone(), Arc::new(Shard::new([app("C", "c", Up)]))]);
        let new = Registry::from_shards([kept, Arc::new(Shard::new([app("C", "c", Down)]))]);
        let changes = new.changes_since(&old);
        assert_eq!(ids(&changes.removed), [("c", Up)]);
        assert_eq!(ids(&changes.added), [("c", Down)]);
        assert_ne!(new, old);
        // Against one shard in app order (another source; a first registry): exact too.
        let flat =
            Registry::from_groups([app("A", "a", Up), app("B", "b", Up), app("C", "c", Down)]);
        assert!(new.changes_since(&flat).is_empty());
        assert!(flat.changes_since(&new).is_empty());
        assert_eq!((new.len(), flat.len()), (3, 3));
    }

    #[test]
    fn changes_since_is_right_whatever_the_order() {
        use Status::*;
        let old = Registry::from_iter([instance("c", Up), instance("a", Up), instance("b", Up)]);
        let new = Registry::from_iter([instance("a", Up), instance("b", Down), instance("c", Up)]);
        let changes = new.changes_since(&old);
        // Whatever it lists, old - removed + added must be new.
        let all: Vec<Arc<Instance>> = old.instances().cloned().collect();
        let mut result = ids(&all);
        for gone in ids(&changes.removed) {
            let at = result
                .iter()
                .position(|x| *x == gone)
                .expect("removed from old");
            result.remove(at);
        }
        result.extend(ids(&changes.added));
        result.sort();
        assert_eq!(result, [("a", Up), ("b", Down), ("c", Up)]);
    }

    #[test]
    fn invalid_instance_names_index_app_id_field_and_reason() {
        let e = InvalidInstance {
            index: 2,
            app: "hello".into(),
            instance_id: Some("h1".into()),
            field: "ip".into(),
            reason: "not an IP address".into(),
        };
        assert_eq!(
            e.to_string(),
            "instance 2 (app \"hello\", id \"h1\"): field `ip`: not an IP address"
        );
    }
}

/// Fixtures for other crates' tests (the `testing` feature) and this crate's.
#[cfg(any(test, feature = "testing"))]
pub mod testing {
    use super::{Instance, Protocol, Status};

    /// An UP instance `id` of app `VIP` (the VIP upper-cased) serving `vip` on `ip:8080`.
    pub fn instance(vip: &str, id: &str, ip: &str) -> Instance {
        Instance {
            app: vip.to_ascii_uppercase().into(),
            instance_id: id.into(),
            ip: ip.parse().expect("an IP address"),
            port: Some(8080),
            secure_port: None,
            vips: vec![vip.into()],
            svips: Vec::new(),
            status: Status::Up,
            zone: None,
            protocol: Protocol::Auto,
        }
    }
}

/// Fixtures for the tests: the files under `registry/testdata/`, and a plain instance.
#[cfg(test)]
pub(crate) mod testdata {
    use std::path::PathBuf;

    pub(crate) use crate::testing::instance;

    /// The path of fixture `name`.
    pub(crate) fn path(name: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("testdata")
            .join(name)
    }

    /// The bytes of fixture `name`; panics naming the file if it cannot be read.
    pub(crate) fn read(name: &str) -> Vec<u8> {
        let path = path(name);
        std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }
}
