//! The embedded registry's ledger: every lease, the `/apps/delta` history, the instances as
//! the mesh sees them, and what self-preservation counts, as plain state. It is told the
//! time ([`Now`]) and does no I/O; [`super::EurekaRegistry`] checks and authorises requests,
//! takes the lock, counts metrics and publishes.
//!
//! Every operation costs what it touches, not the registry, so that a million instances
//! register as fast as ten thousand:
//! - a lease's instance document is one [`Stored`] (one compact allocation), shared by the
//!   lease, the delta history and every answer being written, and written again only when
//!   the instance changes; a heartbeat stamps the lease, not the document (answers write
//!   `lastRenewalTimestamp` from it);
//! - app names and instance ids are [`Name`]s, one allocation shared by every index;
//! - an eviction round pops the leases due from a queue ordered by deadline (a lease renewed
//!   since goes back in with its new one), instead of walking every lease;
//! - a round that runs late credits every lease with the delay by bumping one counter (a
//!   lease renewed after it, whose deadline may then come sooner, is queued again);
//! - the delta history is a queue in the order of changes (`ledger/history.rs`), each lease
//!   keeping the version of its latest change, not a tree with an index of every instance;
//! - self-preservation's expected renewals ([`Expected`]) and the reconcile hash code's
//!   status counts are kept as instances come and go;
//! - an instance is converted for the mesh when it changes; its app's group is rebuilt at the
//!   next publish, once however many of its instances changed, and only the shards of changed
//!   apps are;
//! - the deadline queue is rebuilt from the leases when churn has left it twice their number.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, VecDeque};
use std::ops::Bound;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use odmesh_registry::{
    Group, Instance, InvalidInstance, Parsed, Registry, Shard, Status, split_vips,
};

use super::preservation::{self, Expected, PreservationConfig, SelfPreservation, Verdict};
use super::stored::Stored;
use crate::wire::json::{
    ActionType, Application, Applications, InstanceInfo, LeaseInfo, reconcile_hash_code_of_counts,
};
use history::{Change, History};

/// An app name (uppercase) or an instance id, shared by every index that names it.
pub type Name = Arc<str>;

/// The time, as the ledger is told it (by the server's clock): an instant for leases, and
/// milliseconds since the epoch for the documents.
#[derive(Clone, Copy, Debug)]
pub struct Now {
    pub at: Instant,
    pub ms: u64,
}

/// How far ahead of this server's clock a document's `lastDirtyTimestamp` may be: a later one
/// is taken as this much ahead. Unbounded, one registration dated far in the future would win
/// every later registration and peer conflict of its instance (docs/eureka.md, "Conflicts").
pub const MAX_CLOCK_AHEAD: Duration = Duration::from_secs(60);

impl Now {
    /// The latest `lastDirtyTimestamp` taken as it is now (see [`MAX_CLOCK_AHEAD`]).
    fn latest_dirty(self) -> u64 {
        self.ms.saturating_add(MAX_CLOCK_AHEAD.as_millis() as u64)
    }
}

/// What the ledger keeps to.
#[derive(Clone, Copy, Debug)]
pub struct Terms {
    /// How long a change stays in the delta.
    pub delta_retention: Duration,
    /// Bounds the delta history and the kept overrides of cancelled instances.
    pub max_instances: usize,
    /// When eviction stops.
    pub preservation: PreservationConfig,
}

/// One registered instance.
#[derive(Debug)]
pub struct Lease {
    /// The instance as served, but for `leaseInfo.lastRenewalTimestamp` (see
    /// [`Lease::served`]).
    doc: Stored,
    /// The status the instance itself reported when it registered.
    pub reported: Status,
    /// An operator's override (`PUT .../status`).
    pub overridden: Option<Status>,
    /// The override was set by an operator of the tokens file: only an operator changes or
    /// lifts it (an instance's owner may not undo a drain).
    pub override_by_operator: bool,
    renewed: Instant,
    renewed_ms: u64,
    /// The ledger's late-round credit when this lease was last renewed: every late round
    /// since extends it.
    credit_at: Duration,
    duration: Duration,
    /// Since when self-preservation expects renewals of it, and the ticket its expectation
    /// goes by ([`Expected`] wants them in time order): from its first renewal, not its
    /// registration (see [`Ledger::renew`]); `None` until then.
    expected_since: Option<(u64, Instant)>,
    /// How often the client says it renews, within 1 s and the lease (self-preservation
    /// expects it floored: [`Ledger::expected_interval`]).
    renewal_interval: Duration,
    /// When a renewal of it last counted for self-preservation.
    counted: Instant,
    /// The identity that registered it, when authentication is on.
    pub owner: Option<Arc<str>>,
    /// Names this registration (a registration again gets a new one) in the expiry queue and
    /// the expectations.
    token: u64,
    /// As the mesh sees it; `None` when it cannot be used (see `Ledger::warned`).
    converted: Option<Arc<Instance>>,
    /// The version of its latest change, which the delta history may hold.
    changed: u64,
}

impl Lease {
    /// The instance document, as registered and changed since (read out of its stored
    /// form: [`Lease::stored`] reads single fields in place).
    pub fn doc(&self) -> InstanceInfo {
        self.doc.info()
    }

    /// The instance document as stored.
    pub fn stored(&self) -> &Stored {
        &self.doc
    }

    /// Changes the instance document with `change`; an answer or the delta that holds it
    /// keeps the one it has.
    pub fn change_doc<T>(&mut self, change: impl FnOnce(&mut InstanceInfo) -> T) -> T {
        let mut info = self.doc.info();
        let out = change(&mut info);
        self.doc = Stored::from(&info);
        out
    }

    /// How long the lease lasts without a heartbeat.
    pub fn duration(&self) -> Duration {
        self.duration
    }

    /// When the lease was last renewed (or registered), in ms since the Unix epoch.
    pub fn renewed_ms(&self) -> u64 {
        self.renewed_ms
    }

    /// Writes the effective and overridden status into the document.
    pub fn refresh_status(&mut self) {
        let [status, overridden] = status_words(self.reported, self.overridden);
        if self.doc.status_texts() == [Some(status), Some(overridden), Some(overridden)] {
            return;
        }
        self.change_doc(|doc| write_status(doc, [status, overridden]));
    }

    /// When the lease runs out, with the late rounds since its renewal credited.
    fn deadline(&self, credit: Duration) -> Instant {
        let extended = self.duration + credit.saturating_sub(self.credit_at);
        // Past what an Instant can hold: as late as it can.
        (self.renewed.checked_add(extended))
            .or_else(|| self.renewed.checked_add(Duration::from_secs(1 << 32)))
            .unwrap_or(self.renewed)
    }

    /// The document as served now.
    fn served(&self) -> Served {
        Served {
            doc: self.doc.clone(),
            renewed_ms: Some(self.renewed_ms),
            action: None,
        }
    }
}

/// The status an instance is served with, and its override (`UNKNOWN` for none), by
/// Eureka's rule (its `DownOrStartingRule`): an override wins only over an instance that says
/// `UP` or `OUT_OF_SERVICE`; one that says `DOWN`, `STARTING` or `UNKNOWN` is that.
fn status_words(reported: Status, overridden: Option<Status>) -> [&'static str; 2] {
    let effective = match reported {
        Status::Up | Status::OutOfService => overridden.unwrap_or(reported),
        other => other,
    };
    [effective, overridden.unwrap_or(Status::Unknown)].map(Status::as_str)
}

/// Writes `status` and its override into `doc` (both spellings of the override).
fn write_status(doc: &mut InstanceInfo, [status, overridden]: [&str; 2]) {
    doc.status = Some(status.to_owned());
    doc.overridden_status = Some(overridden.to_owned());
    doc.overriddenstatus_legacy = Some(overridden.to_owned());
}

/// An instance document to answer with, taken under the lock (one pointer) and written out
/// after it ([`Served::info`]).
#[derive(Clone, Debug)]
pub struct Served {
    doc: Stored,
    /// The lease's last renewal (for a delta's document, as of its change), written into
    /// `leaseInfo`.
    renewed_ms: Option<u64>,
    action: Option<ActionType>,
}

impl Served {
    /// The document, as Eureka's JSON and XML writers take it.
    pub fn info(&self) -> InstanceInfo {
        let mut info = self.doc.info();
        if let (Some(ms), Some(lease)) = (self.renewed_ms, info.lease_info.as_mut()) {
            lease.last_renewal_timestamp = Some(ms);
        }
        info.action_type = self.action;
        info
    }
}

/// Applications as a registry answer lists them: taken under the lock, written after.
#[derive(Clone, Debug, Default)]
pub struct AppsView {
    pub version: u64,
    pub hash_code: String,
    pub apps: Vec<(Name, Vec<Served>)>,
}

impl AppsView {
    /// The document every reader answers with.
    pub fn applications(&self) -> Applications {
        Applications {
            versions_delta: Some(self.version.to_string()),
            apps_hashcode: Some(self.hash_code.clone()),
            application: (self.apps.iter())
                .map(|(name, served)| Application {
                    name: name.to_string(),
                    instance: served.iter().map(Served::info).collect(),
                    ..Application::default()
                })
                .collect(),
            ..Applications::default()
        }
    }

    /// The document as JSON, `{"applications": ...}`, the same bytes as
    /// [`AppsView::applications`] written by serde, but each instance read out of its
    /// stored form only while it is written: a million decoded documents are never held at
    /// once.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(&JsonDocument(self)).unwrap_or_default()
    }
}

/// [`AppsView::to_json`]'s writer: the field order and names of `ApplicationsDocument`,
/// `Applications` and `Application` (their unknown fields are empty here).
struct JsonDocument<'a>(&'a AppsView);

impl serde::Serialize for JsonDocument<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{SerializeMap, SerializeSeq};
        struct Instances<'a>(&'a [Served]);
        impl serde::Serialize for Instances<'_> {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                let mut seq = s.serialize_seq(Some(self.0.len()))?;
                for served in self.0 {
                    seq.serialize_element(&served.info())?;
                }
                seq.end()
            }
        }
        struct App<'a>(&'a str, &'a [Served]);
        impl serde::Serialize for App<'_> {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                let mut map = s.serialize_map(None)?;
                map.serialize_entry("name", self.0)?;
                map.serialize_entry("instance", &Instances(self.1))?;
                map.end()
            }
        }
        struct Apps<'a>(&'a AppsView);
        impl serde::Serialize for Apps<'_> {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                let view = self.0;
                let mut map = s.serialize_map(None)?;
                map.serialize_entry("versions__delta", &view.version.to_string())?;
                map.serialize_entry("apps__hashcode", &view.hash_code)?;
                map.serialize_entry("application", &AppList(&view.apps))?;
                map.end()
            }
        }
        struct AppList<'a>(&'a [(Name, Vec<Served>)]);
        impl serde::Serialize for AppList<'_> {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_seq((self.0.iter()).map(|(name, served)| App(name, served)))
            }
        }
        let mut map = s.serialize_map(Some(1))?;
        map.serialize_entry("applications", &Apps(self.0))?;
        map.end()
    }
}

/// A registration, checked: its document with its app and id set, and the lease's terms.
/// The ledger writes the status and the lease's timestamps.
#[derive(Debug)]
pub struct Registration {
    pub info: InstanceInfo,
    /// The status the instance reports.
    pub reported: Status,
    /// The override the registration carries (`overriddenStatus`), if any.
    pub body_override: Option<Status>,
    pub duration: Duration,
    pub renewal_interval: Duration,
    pub owner: Option<Arc<str>>,
    /// A peer's copy ([`super::peers`]): `body_override` is the override, exactly (none
    /// removes one), instead of what a client's registration again may not take away.
    pub replicated: bool,
    /// Self-preservation expects renewals of it from now on, as of any instance that has
    /// renewed: a peer's live instance, copied at a fill. Otherwise only from its first
    /// renewal (or at once if it registers again while expected).
    pub expected_now: bool,
}

/// A registration's document as the registry serves it, stamped `now`: its lease's terms
/// and timestamps (`service_up`: when it came up, if it did), Eureka's defaults filled in.
fn stamped(
    mut info: InstanceInfo,
    duration: Duration,
    service_up: Option<u64>,
    now: Now,
) -> InstanceInfo {
    let stated = info.lease_info.take().unwrap_or_default();
    info.lease_info = Some(LeaseInfo {
        renewal_interval_in_secs: Some(stated.renewal_interval_in_secs.unwrap_or(30)),
        duration_in_secs: Some(duration.as_secs()),
        registration_timestamp: Some(now.ms),
        last_renewal_timestamp: Some(now.ms),
        eviction_timestamp: Some(0),
        service_up_timestamp: Some(service_up.unwrap_or(0)),
        other: stated.other,
    });
    info.last_updated_timestamp = Some(now.ms);
    info.last_dirty_timestamp = Some(info.last_dirty_timestamp.unwrap_or(now.ms));
    info.is_coordinating_discovery_server.get_or_insert(false);
    info.action_type = None;
    info
}

/// What a registration keeps of the instance registered before ([`Ledger::carried_over`]).
struct Carried {
    overridden: Option<Status>,
    /// The override was an operator's.
    by_operator: bool,
    /// When the instance came up.
    service_up: Option<u64>,
    /// The override was restored from a cancel.
    restored: bool,
}

/// What a registration did.
#[derive(Debug, PartialEq, Eq)]
pub struct Registered {
    /// A new instance (not a registration again).
    pub new: bool,
    /// The override it had when it was cancelled came back (see [`Ledger::cancel`]).
    pub override_restored: bool,
    /// The registered document is newer (its `lastDirtyTimestamp`): it stays, and the
    /// registration only renewed its lease (Eureka's rule, for a peer's late copy).
    pub kept_newer: bool,
}

/// Why a heartbeat was not taken.
#[derive(Debug, PartialEq, Eq)]
pub enum RenewRefused {
    /// No such instance: the client registers again.
    Unknown,
    /// Renewed, but the client's document is newer than the registered one: it registers
    /// again.
    Newer { theirs: u64, ours: u64 },
}

/// What an eviction round did.
#[derive(Debug)]
pub struct Eviction {
    /// The instances evicted, most overdue first.
    pub evicted: Vec<(Name, Name)>,
    /// Expired leases kept, for self-preservation or its per-round share.
    pub held: usize,
    pub verdict: Verdict,
}

/// The embedded registry's state.
#[derive(Debug)]
pub struct Ledger {
    terms: Terms,
    /// APP → instance id → lease.
    apps: BTreeMap<Name, BTreeMap<Name, Lease>>,
    /// How many leases there are (all apps).
    leases: usize,
    /// For `/apps/delta`: the latest change of each instance within the retention.
    recent: History,
    /// The usable instances as published, in [`SHARDS`] shards by app. A publish copies one
    /// pointer per shard and rebuilds the shards that changed.
    published: Vec<PublishedShard>,
    /// (APP, id) → what was left out of the instance, and why; only instances with warnings.
    warned: BTreeMap<(Name, Name), Vec<InvalidInstance>>,
    /// Bumped on every change; served as `versions__delta`.
    version: u64,
    /// Every lease's deadline as last seen, soonest first, with the lease's token: an entry
    /// whose lease was renewed since goes back with the new deadline, one whose lease is
    /// gone or registered again (another token) is dropped.
    expiry: BinaryHeap<Reverse<(Instant, u64, Name, Name)>>,
    /// The sum of every late round's delay (see [`Ledger::evict`]).
    credit: Duration,
    next_token: u64,
    preservation: SelfPreservation,
    expected: Expected,
    /// Leases by their document's status, for the reconcile hash code.
    statuses: [usize; 5],
    /// Instances per owner (the identity that registered them, with authentication).
    owned: HashMap<Arc<str>, usize>,
    /// The apps with instances serving each VIP (`false`) and SVIP (`true`), and how many:
    /// `GET /vips/{vip}` looks at those apps only, not at every lease.
    /// Indexed by `secure`; the names are shared with the instances the mesh sees.
    vip_apps: [HashMap<Name, HashMap<Name, usize>>; 2],
    /// (APP, id) → the status override of a cancelled instance, and until when it comes
    /// back with a registration of the same instance.
    cancelled_overrides: CancelledOverrides,
}

fn status_slot(status: Status) -> usize {
    match status {
        Status::Up => 0,
        Status::Down => 1,
        Status::Starting => 2,
        Status::OutOfService => 3,
        Status::Unknown => 4,
    }
}

/// Some apps' usable instances as published.
#[derive(Debug, Default)]
struct PublishedShard {
    /// APP → its group, in id order.
    apps: BTreeMap<Name, Group>,
    /// Apps whose instances changed since their group was built.
    changed: std::collections::BTreeSet<Name>,
    /// The shard as last published; `None` once one of its apps changed.
    built: Option<Arc<Shard>>,
}

/// How many shards the published registry has: a publish costs one pointer per shard and
/// one per app of each changed shard; at 100,000 apps, about a hundred per shard.
pub const SHARDS: usize = 1024;

/// The shard of `app`: FNV-1a, so that it is the same in every run.
pub(crate) fn shard_of(app: &str) -> usize {
    let hash = (app.bytes()).fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    (hash % SHARDS as u64) as usize
}

pub(crate) const STATUSES: [Status; 5] = [
    Status::Up,
    Status::Down,
    Status::Starting,
    Status::OutOfService,
    Status::Unknown,
];

impl Ledger {
    /// An empty ledger, started `now`.
    pub fn new(terms: Terms, now: Instant) -> Ledger {
        Ledger {
            terms,
            apps: BTreeMap::new(),
            leases: 0,
            recent: History::default(),
            published: (0..SHARDS).map(|_| Default::default()).collect(),
            warned: BTreeMap::new(),
            version: 0,
            expiry: BinaryHeap::new(),
            credit: Duration::ZERO,
            next_token: 0,
            preservation: SelfPreservation::new(terms.preservation, now),
            expected: Expected::new(terms.preservation.window, now),
            statuses: [0; 5],
            owned: HashMap::new(),
            vip_apps: Default::default(),
            cancelled_overrides: CancelledOverrides::default(),
        }
    }

    /// How many instances are registered.
    pub fn len(&self) -> usize {
        self.leases
    }

    /// How often self-preservation expects `lease` to renew: its interval, floored
    /// ([`PreservationConfig::expected_interval`]).
    fn expected_interval(&self, lease: &Lease) -> Duration {
        (self.terms.preservation).expected_interval(lease.renewal_interval)
    }

    /// Whether no instance is registered.
    pub fn is_empty(&self) -> bool {
        self.leases == 0
    }

    /// The registry's version: bumped on every change.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// The lease of `app`/`id`.
    pub fn lease(&self, app: &str, id: &str) -> Option<&Lease> {
        self.apps.get(app)?.get(id)
    }

    /// The shared name of `app`, if registered, or a new one.
    fn app_name(&self, app: &str) -> Name {
        (self.apps.get_key_value(app)).map_or_else(|| Name::from(app), |(k, _)| k.clone())
    }

    /// Registers (or registers again) `app`/`id`. The checks are the caller's: this only
    /// records.
    pub fn register(&mut self, app: &str, id: &str, mut r: Registration, now: Now) -> Registered {
        let app = self.app_name(app);
        let dirty = &mut r.info.last_dirty_timestamp;
        *dirty = dirty.map(|t| t.min(now.latest_dirty()));
        let ours = self
            .lease(&app, id)
            .and_then(|l| l.doc.last_dirty_timestamp());
        if let (Some(ours), Some(theirs)) = (ours, r.info.last_dirty_timestamp)
            && ours > theirs
        {
            // Known already: renewing cannot fail.
            let _ = self.renew(&app, id, None, now);
            return Registered {
                new: false,
                override_restored: false,
                kept_newer: true,
            };
        }
        let id: Name = (self.apps.get(&app))
            .and_then(|leases| leases.get_key_value(id))
            .map_or_else(|| Name::from(id), |(k, _)| k.clone());
        let carried = self.carried_over(&app, &id, &r, now);
        let (overridden, service_up, override_restored) =
            (carried.overridden, carried.service_up, carried.restored);
        let service_up = service_up
            .filter(|t| *t > 0)
            .or((r.reported == Status::Up).then_some(now.ms));
        let token = self.next_token;
        self.next_token += 1;
        // A client registering again (a changed document) while it renews stays expected.
        let was_expected = (self.lease(&app, &id)).is_some_and(|l| l.expected_since.is_some());
        let expected_since = (r.expected_now || was_expected).then_some((token, now.at));
        let mut info = stamped(r.info, r.duration, service_up, now);
        write_status(&mut info, status_words(r.reported, overridden));
        let lease = Lease {
            doc: Stored::from(&info),
            reported: r.reported,
            overridden,
            override_by_operator: carried.by_operator,
            renewed: now.at,
            renewed_ms: now.ms,
            credit_at: self.credit,
            duration: r.duration,
            expected_since,
            renewal_interval: r.renewal_interval,
            counted: now.at,
            owner: r.owner,
            token,
            converted: None,
            changed: 0,
        };
        let new = self.insert(app, id, lease, now);
        Registered {
            new,
            override_restored,
            kept_newer: false,
        }
    }

    /// What a registration of `app`/`id` keeps of the instance registered before: its
    /// override (a client's registration again may not take it away; a peer's copy states
    /// it), or the one it had if cancelled within one lease duration (then restored), and
    /// when it came up.
    fn carried_over(&mut self, app: &Name, id: &Name, r: &Registration, now: Now) -> Carried {
        let known = self.lease(app, id).map(|l| {
            let up = l.doc.service_up_timestamp();
            (l.overridden, l.override_by_operator, up)
        });
        let (overridden, by_operator, service_up, restored) = match known {
            Some((_, _, up)) if r.replicated => (r.body_override, false, up, false),
            Some((Some(overridden), by_operator, up)) => (Some(overridden), by_operator, up, false),
            Some((None, _, up)) => (r.body_override, false, up, false),
            None if r.replicated => (r.body_override, false, None, false),
            None => {
                let key = (app.clone(), id.clone());
                match self.cancelled_overrides.take(&key, now.at) {
                    Some((status, by_operator)) => (Some(status), by_operator, None, true),
                    None => (r.body_override, false, None, false),
                }
            }
        };
        Carried {
            overridden,
            by_operator,
            service_up,
            restored,
        }
    }

    /// Puts `lease` in place of whatever `app`/`id` held, in every index; whether it is a
    /// new instance.
    fn insert(&mut self, app: Name, id: Name, lease: Lease, now: Now) -> bool {
        let (token, deadline) = (lease.token, lease.deadline(self.credit));
        if let Some((ticket, since)) = lease.expected_since {
            let interval = self.expected_interval(&lease);
            self.expected.add(ticket, since, interval);
        }
        self.statuses[status_slot(lease.doc.status())] += 1;
        if let Some(owner) = &lease.owner {
            *self.owned.entry(owner.clone()).or_insert(0) += 1;
        }
        for (secure, vip) in vips_of(&lease.doc) {
            let vips = &mut self.vip_apps[usize::from(secure)];
            let apps = match vips.get_mut(vip.as_str()) {
                Some(apps) => apps,
                None => vips.entry(Name::from(vip)).or_default(),
            };
            *apps.entry(app.clone()).or_insert(0) += 1;
        }
        let served = lease.served();
        let mut lease = lease;
        lease.changed = self.version + 1;
        let old = (self.apps.entry(app.clone()).or_default()).insert(id.clone(), lease);
        match &old {
            Some(old) => self.forget(&app, old),
            None => self.leases += 1,
        }
        let older = old.as_ref().map(|old| old.changed);
        self.expiry
            .push(Reverse((deadline, token, app.clone(), id.clone())));
        self.compact_expiry();
        self.convert(&app, &id);
        self.record(app, id, ActionType::Added, served, older, now);
        old.is_none()
    }

    /// Rebuilds the deadline queue from the leases when entries of cancelled, registered
    /// again or queued again leases (dropped only when their deadline comes) outnumber the
    /// leases: churn must not grow it beyond twice the registry. Linear, and at most once
    /// per as many registrations or renewals after a late round as there are leases.
    fn compact_expiry(&mut self) {
        if self.expiry.len() <= 2 * self.leases + 1024 {
            return;
        }
        let credit = self.credit;
        self.expiry = (self.apps.iter())
            .flat_map(|(app, leases)| {
                leases.iter().map(move |(id, lease)| {
                    Reverse((lease.deadline(credit), lease.token, app.clone(), id.clone()))
                })
            })
            .collect();
    }

    /// Takes the part of `app`'s `lease` out of the expectations, the counts and the index.
    fn forget(&mut self, app: &Name, lease: &Lease) {
        for (secure, vip) in vips_of(&lease.doc) {
            let vips = &mut self.vip_apps[usize::from(secure)];
            if let Some(apps) = vips.get_mut(vip.as_str())
                && let Some(n) = apps.get_mut(app)
            {
                *n -= 1;
                if *n == 0 {
                    apps.remove(app);
                    if apps.is_empty() {
                        vips.remove(vip.as_str());
                    }
                }
            }
        }
        if let Some((ticket, since)) = lease.expected_since {
            let interval = self.expected_interval(lease);
            (self.expected).remove(ticket, since, interval);
        }
        self.statuses[status_slot(lease.doc.status())] -= 1;
        if let Some(owner) = &lease.owner
            && let Some(n) = self.owned.get_mut(owner)
        {
            *n -= 1;
            if *n == 0 {
                self.owned.remove(owner);
            }
        }
    }

    /// How many instances `owner` registered (that hold it as their owner).
    pub fn owned_by(&self, owner: &str) -> usize {
        self.owned.get(owner).copied().unwrap_or(0)
    }

    /// Renews the lease of `app`/`id` (a heartbeat). A `last_dirty_timestamp` newer than the
    /// registered one renews it but is refused, so that the client registers its newer data.
    pub fn renew(
        &mut self,
        app: &str,
        id: &str,
        last_dirty_timestamp: Option<u64>,
        now: Now,
    ) -> Result<(), RenewRefused> {
        let credit = self.credit;
        let preservation = self.terms.preservation;
        let lease = (self.apps.get_mut(app))
            .and_then(|l| l.get_mut(id))
            .ok_or(RenewRefused::Unknown)?;
        let expected_interval = preservation.expected_interval(lease.renewal_interval);
        // A renewal drops the credit of late rounds since the last one, so its deadline may
        // come before the one queued (at most the deadline it had): queued again, it is not
        // evicted late.
        let before = lease.deadline(credit);
        lease.renewed = now.at;
        lease.renewed_ms = now.ms;
        lease.credit_at = credit;
        let after = lease.deadline(credit);
        let requeue = (after < before).then_some((after, lease.token));
        // Renewals are expected from the first one on: an instance that registers and never
        // renews (a client that died at once, or one that means to keep eviction off by
        // holding leases nobody renews) weighs nothing in self-preservation, while one that
        // renewed and then went quiet (a partition) does.
        if lease.expected_since.is_none() {
            let ticket = self.next_token;
            self.next_token += 1;
            lease.expected_since = Some((ticket, now.at));
            (self.expected).add(ticket, now.at, expected_interval);
        }
        // Self-preservation counts about one renewal per expected interval: a client
        // heartbeating faster than it is expected to cannot hide that others went quiet.
        let since = now.at.saturating_duration_since(lease.counted);
        let counts = preservation::counts(since, lease.renewal_interval, expected_interval);
        if counts {
            lease.counted = now.at;
        }
        // A timestamp beyond the clock's reach is not compared: the registration it came with
        // was taken as now + MAX_CLOCK_AHEAD, and asking for it again would loop.
        let theirs = last_dirty_timestamp.filter(|t| *t <= now.latest_dirty());
        let answer = match (theirs, lease.doc.last_dirty_timestamp()) {
            (Some(theirs), Some(ours)) if theirs > ours => {
                Err(RenewRefused::Newer { theirs, ours })
            }
            _ => Ok(()),
        };
        if counts {
            self.preservation.renewed(now.at);
        }
        if let Some((deadline, token)) = requeue
            && let Some((app, leases)) = self.apps.get_key_value(app)
            && let Some((id, _)) = leases.get_key_value(id)
        {
            let entry = (deadline, token, app.clone(), id.clone());
            self.expiry.push(Reverse(entry));
            self.compact_expiry();
        }
        answer
    }

    /// Removes `app`/`id` (its client is shutting down); `None` if unknown.
    ///
    /// An operator's override (a drain: `OUT_OF_SERVICE`) outlives the cancel for one lease
    /// duration: a client that registers again while it shuts down (py-eureka-client's
    /// heartbeat, racing its own stop, gets 404 and registers the instance `UP`) does not
    /// bring a drained instance back into traffic just as it exits. Netflix's server forgets
    /// the override at once.
    pub fn cancel(&mut self, app: &str, id: &str, now: Now) -> Option<()> {
        let (app, id, lease) = self.remove(app, id)?;
        if let Some(overridden) = lease.overridden {
            let until = now.at.checked_add(lease.duration).unwrap_or(now.at);
            // Bounded like the registry: the oldest go first.
            let max = self.terms.max_instances.max(1);
            let kept = (overridden, lease.override_by_operator);
            (self.cancelled_overrides).keep((app.clone(), id.clone()), kept, until, max);
        }
        self.record(
            app,
            id,
            ActionType::Deleted,
            lease.served(),
            Some(lease.changed),
            now,
        );
        Some(())
    }

    /// Changes the lease of `app`/`id` with `change` (which leaves it as it was when it
    /// fails); `None` if unknown.
    pub fn modify<E>(
        &mut self,
        app: &str,
        id: &str,
        now: Now,
        change: impl FnOnce(&mut Lease) -> Result<(), E>,
    ) -> Option<Result<(), E>> {
        let app = self.app_name(app);
        let id = self.apps.get(&app)?.get_key_value(id)?.0.clone();
        let lease = self.apps.get_mut(&app)?.get_mut(&id)?;
        let before = lease.doc.status();
        if let Err(e) = change(lease) {
            return Some(Err(e));
        }
        lease.change_doc(|doc| doc.last_updated_timestamp = Some(now.ms));
        let older = std::mem::replace(&mut lease.changed, self.version + 1);
        let (served, after) = (lease.served(), lease.doc.status());
        self.statuses[status_slot(before)] -= 1;
        self.statuses[status_slot(after)] += 1;
        self.convert(&app, &id);
        self.record(app, id, ActionType::Modified, served, Some(older), now);
        Some(Ok(()))
    }

    /// One eviction round at `now`, running `late` later than planned: evicts the leases
    /// that ran out, unless self-preservation holds eviction, and at most its per-round
    /// share (the most overdue first).
    ///
    /// The registry could not take a heartbeat while it ran late either (the process was
    /// paused, or starved), so every lease is first extended by `late`: a registry that
    /// stalls must not evict instances that did nothing wrong.
    pub fn evict(&mut self, now: Now, late: Duration) -> Eviction {
        self.credit += late;
        let mut due = Vec::new();
        while let Some(Reverse((deadline, ..))) = self.expiry.peek()
            && *deadline <= now.at
        {
            let Some(Reverse((_, token, app, id))) = self.expiry.pop() else {
                break;
            };
            let Some(lease) = self.lease(&app, &id).filter(|l| l.token == token) else {
                continue;
            };
            let deadline = lease.deadline(self.credit);
            if deadline <= now.at {
                due.push((deadline, token, app, id));
            } else {
                self.expiry.push(Reverse((deadline, token, app, id)));
            }
        }
        let expected = self.expected.at(now.at);
        let verdict = (self.preservation).allows_eviction(now.at, self.leases, expected);
        let limit = if verdict.allows_eviction {
            self.preservation.eviction_limit(self.leases)
        } else {
            0
        };
        // A lease queued twice (see `renew`) is due once.
        due.sort();
        due.dedup();
        let held = due.len().saturating_sub(limit);
        for entry in due.drain(limit.min(due.len())..) {
            self.expiry.push(Reverse(entry));
        }
        let mut evicted = Vec::with_capacity(due.len());
        for (_, _, app, id) in due {
            if let Some((app, id, mut lease)) = self.remove(&app, &id) {
                lease.change_doc(|doc| {
                    if let Some(l) = doc.lease_info.as_mut() {
                        l.eviction_timestamp = Some(now.ms);
                    }
                });
                let served = lease.served();
                let older = Some(lease.changed);
                self.record(
                    app.clone(),
                    id.clone(),
                    ActionType::Deleted,
                    served,
                    older,
                    now,
                );
                evicted.push((app, id));
            }
        }
        Eviction {
            evicted,
            held,
            verdict,
        }
    }

    /// Whether self-preservation holds eviction (as of the last round).
    pub fn is_preserving(&self) -> bool {
        self.preservation.is_engaged()
    }

    /// The renewals counted within self-preservation's window before `now`, and those
    /// expected of the registered instances (what the next eviction round compares).
    pub fn renewals(&mut self, now: Instant) -> (u64, f64) {
        let expected = self.expected.at(now);
        (self.preservation.renewals(now), expected)
    }

    /// Every lease, by app (uppercase) and instance id, in name order.
    pub fn leases(&self) -> &BTreeMap<Name, BTreeMap<Name, Lease>> {
        &self.apps
    }

    /// How many registered instances have each status, as served.
    pub fn status_counts(&self) -> [(Status, usize); 5] {
        STATUSES.map(|s| (s, self.statuses[status_slot(s)]))
    }

    fn remove(&mut self, app: &str, id: &str) -> Option<(Name, Name, Lease)> {
        let app = self.apps.get_key_value(app)?.0.clone();
        let leases = self.apps.get_mut(&app)?;
        let (id, lease) = leases.remove_entry(id)?;
        if leases.is_empty() {
            self.apps.remove(&app);
        }
        self.leases -= 1;
        self.forget(&app, &lease);
        self.convert(&app, &id);
        Some((app, id, lease))
    }

    /// Converts `app`/`id` for the mesh again after its lease changed (or went), and
    /// rebuilds its app's group.
    fn convert(&mut self, app: &Name, id: &Name) {
        let mut warnings = Vec::new();
        if let Some(lease) = self.apps.get_mut(app).and_then(|l| l.get_mut(id)) {
            lease.converted = match lease.doc.info().to_instance(app, 0, &mut warnings) {
                Ok(mut instance) => {
                    // The ledger's names, shared, in place of copies.
                    if instance.app == *app {
                        instance.app = app.clone();
                    }
                    if instance.instance_id == *id {
                        instance.instance_id = id.clone();
                    }
                    for (secure, list) in [(false, &mut instance.vips), (true, &mut instance.svips)]
                    {
                        for vip in list.iter_mut() {
                            let vips = &self.vip_apps[usize::from(secure)];
                            if let Some((shared, _)) = vips.get_key_value(&**vip) {
                                *vip = shared.clone();
                            }
                        }
                    }
                    Some(Arc::new(instance))
                }
                Err(e) => {
                    warnings.push(e);
                    None
                }
            };
        }
        // Its group is rebuilt at the next publish, once however many of its instances changed.
        let shard = &mut self.published[shard_of(app)];
        shard.changed.insert(app.clone());
        shard.built = None;
        let key = (app.clone(), id.clone());
        if warnings.is_empty() {
            self.warned.remove(&key);
        } else {
            self.warned.insert(key, warnings);
        }
    }

    /// Records a change of `app`/`id` as the next version; `older` is the version of its
    /// change before, if its lease had one.
    fn record(
        &mut self,
        app: Name,
        id: Name,
        action: ActionType,
        lease: Served,
        older: Option<u64>,
        now: Now,
    ) {
        self.version += 1;
        let change = Change {
            version: self.version,
            at: now.at,
            app,
            id,
            action,
            doc: Some(lease.doc),
            renewed_ms: lease.renewed_ms.unwrap_or(now.ms),
        };
        self.recent.record(change, older);
        // Register-and-cancel churn with new ids must not grow the delta without bound:
        // past the registry's own bound, the oldest changes go (a client that misses one
        // sees a hash code mismatch and fetches the whole registry).
        self.prune(now.at);
    }

    /// Forgets the changes older than the retention, and the oldest beyond the registry's
    /// bound.
    fn prune(&mut self, now: Instant) {
        let max_len = self.terms.max_instances.max(1);
        (self.recent).prune(now, self.terms.delta_retention, max_len);
    }

    /// Eureka's reconcile hash code of every registered instance (`apps__hashcode`).
    pub fn hash_code(&self) -> String {
        reconcile_hash_code_of_counts(
            STATUSES
                .into_iter()
                .map(|s| (s, self.statuses[status_slot(s)])),
        )
    }

    fn view(&self, apps: Vec<(Name, Vec<Served>)>) -> AppsView {
        AppsView {
            version: self.version,
            hash_code: self.hash_code(),
            apps,
        }
    }

    /// Every application, as `GET /apps` answers.
    pub fn applications(&self) -> AppsView {
        let apps = (self.apps.iter())
            .map(|(name, leases)| (name.clone(), leases.values().map(Lease::served).collect()))
            .collect();
        self.view(apps)
    }

    /// One application (`name` uppercase), as `GET /apps/{APP}` answers.
    pub fn application(&self, name: &str) -> Option<Vec<Served>> {
        let leases = self.apps.get(name)?;
        Some(leases.values().map(Lease::served).collect())
    }

    /// One instance, as `GET /apps/{APP}/{ID}` answers.
    pub fn instance(&self, app: &str, id: &str) -> Option<Served> {
        self.lease(app, id).map(Lease::served)
    }

    /// The instance `id` of whichever app, as `GET /instances/{ID}` answers.
    pub fn instance_by_id(&self, id: &str) -> Option<Served> {
        (self.apps.values()).find_map(|leases| leases.get(id).map(Lease::served))
    }

    /// The instances whose `vipAddress` (or, `secure`, `secureVipAddress`) lists `vip`
    /// (lowercase), by application.
    pub fn serving(&self, vip: &str, secure: bool) -> AppsView {
        let field = |doc: &Stored| {
            split_vips(doc.vip_address(secure).unwrap_or_default())
                .iter()
                .any(|v| v == vip)
        };
        let mut names: Vec<&Name> = (self.vip_apps[usize::from(secure)].get(vip))
            .map(|apps| apps.keys().collect())
            .unwrap_or_default();
        names.sort();
        let apps = (names.into_iter())
            .filter_map(|name| {
                let (name, leases) = self.apps.get_key_value(name)?;
                let served: Vec<Served> = (leases.values())
                    .filter(|l| field(&l.doc))
                    .map(Lease::served)
                    .collect();
                (!served.is_empty()).then(|| (name.clone(), served))
            })
            .collect();
        self.view(apps)
    }

    /// The changes within the delta retention, as `GET /apps/delta` answers: the latest
    /// change of each instance, oldest first, grouped by app in order of first appearance.
    pub fn delta(&mut self, now: Instant) -> AppsView {
        self.prune(now);
        let mut apps: Vec<(Name, Vec<Served>)> = Vec::new();
        let mut index: HashMap<&str, usize> = HashMap::new();
        for (change, doc) in self.recent.iter() {
            let i = *index.entry(&change.app).or_insert_with(|| {
                apps.push((change.app.clone(), Vec::new()));
                apps.len() - 1
            });
            apps[i].1.push(Served {
                doc: doc.clone(),
                renewed_ms: Some(change.renewed_ms),
                action: Some(change.action),
            });
        }
        self.view(apps)
    }

    /// How many changes the delta holds (for tests and bounds).
    pub fn delta_len(&self) -> usize {
        self.recent.len()
    }

    /// The plain model of the registry: what the full document converts to, from the
    /// instances converted when their leases changed.
    pub fn to_registry(&mut self) -> Parsed {
        let leases = &self.apps;
        let shards = self.published.iter_mut().map(|shard| {
            for app in std::mem::take(&mut shard.changed) {
                let group: Vec<Arc<Instance>> = (leases.get(&app).into_iter())
                    .flat_map(BTreeMap::values)
                    .filter_map(|l| l.converted.clone())
                    .collect();
                if group.is_empty() {
                    shard.apps.remove(&app);
                } else {
                    shard.apps.insert(app, group.into());
                }
            }
            let apps = &shard.apps;
            let built =
                (shard.built).get_or_insert_with(|| Arc::new(Shard::new(apps.values().cloned())));
            built.clone()
        });
        let registry = Registry::from_shards(shards);
        let mut warnings = Vec::new();
        for ((app, id), list) in &self.warned {
            // The instance's position in its app, as the full document counts.
            let index = self.apps.get(app).map_or(0, |leases| {
                leases
                    .range::<str, _>((Bound::Unbounded, Bound::Excluded(&**id)))
                    .count()
            });
            warnings.extend(list.iter().map(|w| InvalidInstance { index, ..w.clone() }));
        }
        Parsed { registry, warnings }
    }
}

/// The overrides of cancelled instances, each until a time, oldest first: what
/// [`Ledger::cancel`] keeps. Every operation costs what it removes, not the map.
#[derive(Debug, Default)]
struct CancelledOverrides {
    /// The override, whether an operator set it, and until when it is kept.
    by_key: HashMap<(Name, Name), ((Status, bool), Instant)>,
    /// Keys in the order they were kept, with the time they were kept until; an entry whose
    /// key was kept again since, or taken, is skipped.
    order: VecDeque<(Instant, (Name, Name))>,
}

impl CancelledOverrides {
    /// Keeps `status` for `key` until `until`; then forgets the oldest beyond `max`.
    fn keep(&mut self, key: (Name, Name), status: (Status, bool), until: Instant, max: usize) {
        self.by_key.insert(key.clone(), (status, until));
        self.order.push_back((until, key));
        while self.by_key.len() > max {
            self.pop_oldest();
        }
    }

    /// The override kept for `key`, if it has not run out by `now`; forgets it, and every
    /// kept override at the front that has run out.
    fn take(&mut self, key: &(Name, Name), now: Instant) -> Option<(Status, bool)> {
        while self.order.front().is_some_and(|(until, _)| *until <= now) {
            self.pop_oldest();
        }
        let (status, until) = self.by_key.remove(key)?;
        (until > now).then_some(status)
    }

    fn pop_oldest(&mut self) {
        if let Some((until, key)) = self.order.pop_front()
            && self.by_key.get(&key).is_some_and(|(_, u)| *u == until)
        {
            self.by_key.remove(&key);
        }
    }
}

/// The VIPs (`false`) and SVIPs (`true`) an instance document serves, as `GET /vips/{vip}`
/// matches them.
fn vips_of(doc: &Stored) -> Vec<(bool, String)> {
    let list = |secure: bool| {
        split_vips(doc.vip_address(secure).unwrap_or_default())
            .into_iter()
            .map(move |vip| (secure, vip))
    };
    list(false).chain(list(true)).collect()
}

mod history;
#[cfg(test)]
mod tests;
