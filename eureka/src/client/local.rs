//! The follower's copy of a Eureka server's registry, kept as the plain model it publishes
//! rather than as Eureka's documents: per app, its instances converted once (sorted by id),
//! the ids and statuses of the instances odmesh cannot use (they count in the hash code), and
//! what was left out; the status counts of Eureka's hash code; and the published registry in
//! [`SHARDS`] shards by app, each rebuilt only when one of its apps changed.
//!
//! A full fetch is read into a new copy that takes every instance, app and shard that did not
//! change from the copy before it, and a delta is applied to a new copy that shares every
//! shard it does not touch; so following a registry holds one copy of it, whatever the fetch,
//! and the control plane compares only what changed (docs/benchmarks.md, section 10).

use std::collections::BTreeMap;
use std::sync::Arc;

use odmesh_registry::{Group, Instance, InvalidInstance, Registry, Shard, Status};

use crate::server::ledger::{SHARDS, STATUSES, shard_of};
use crate::wire::json::{ActionType, InstanceInfo, reconcile_hash_code_of_counts};

/// One instance as read and converted.
#[derive(Debug)]
pub(crate) struct Entry {
    /// The instance id as Eureka derives it, else the one odmesh derives (the instance's
    /// own, shared).
    id: Arc<str>,
    status: Status,
    /// The plain instance; `None` when odmesh cannot use it (no valid address).
    usable: Option<Arc<Instance>>,
    /// What was left out of it, or why it is unusable.
    warnings: Vec<InvalidInstance>,
}

impl Entry {
    /// Converts instance `index` of application `app` (see [`InstanceInfo::to_instance`]).
    pub(crate) fn convert(app: &str, index: usize, info: &InstanceInfo) -> Entry {
        let mut warnings = Vec::new();
        let (usable, id) = match info.to_instance(app, index, &mut warnings) {
            Ok(inst) => {
                let id = inst.instance_id.clone();
                (Some(Arc::new(inst)), id)
            }
            Err(e) => {
                warnings.push(e);
                (None, info.id().unwrap_or_default().into())
            }
        };
        Entry {
            id,
            status: info.status(),
            usable,
            warnings,
        }
    }
}

/// A change a delta makes: the instance `id` of `app` is gone (`entry` is `None`), or is
/// now `entry`.
#[derive(Debug)]
pub(crate) struct Change {
    app: Box<str>,
    id: Arc<str>,
    entry: Option<Entry>,
}

impl Change {
    /// The change instance `index` of a delta's application `app` makes; `None` for an
    /// instance without an id or an action type (ignored: the hash code check catches what
    /// that misses).
    pub(crate) fn of(app: &str, index: usize, info: &InstanceInfo) -> Option<Change> {
        let id = info.id()?;
        let Some(action) = info.action_type else {
            tracing::debug!(app, id, "delta instance without actionType ignored");
            return None;
        };
        let entry = (action != ActionType::Deleted).then(|| Entry::convert(app, index, info));
        Some(Change {
            app: app.to_ascii_uppercase().into(),
            id: entry.as_ref().map_or_else(|| id.into(), |e| e.id.clone()),
            entry,
        })
    }
}

/// The instances of one app.
#[derive(Clone, Debug, Default, PartialEq)]
struct App {
    /// Its usable instances, by id.
    group: Group,
    /// Its instances odmesh cannot use: id and status.
    unusable: Vec<(Arc<str>, Status)>,
    /// What was left out of its instances, with the instance's id.
    warnings: Vec<(Arc<str>, InvalidInstance)>,
}

impl App {
    fn is_empty(&self) -> bool {
        self.group.is_empty() && self.unusable.is_empty()
    }

    fn statuses(&self) -> impl Iterator<Item = Status> + '_ {
        (self.group.iter().map(|i| i.status)).chain(self.unusable.iter().map(|(_, s)| *s))
    }

    /// Whether `other` holds the same instances, sharing them.
    fn shares(&self, other: &App) -> bool {
        Arc::ptr_eq(&self.group, &other.group)
            && self.unusable == other.unusable
            && self.warnings == other.warnings
    }
}

/// The apps of one shard, and the shard as published.
#[derive(Debug)]
struct Part {
    apps: BTreeMap<Arc<str>, App>,
    built: Arc<Shard>,
}

impl Part {
    fn new(apps: BTreeMap<Arc<str>, App>) -> Part {
        let built = Arc::new(Shard::new(apps.values().map(|a| a.group.clone())));
        Part { apps, built }
    }
}

impl Default for Part {
    fn default() -> Part {
        Part::new(BTreeMap::new())
    }
}

/// The follower's copy of the server's registry. Cloning it copies a pointer per shard.
#[derive(Clone, Debug)]
pub(crate) struct Local {
    parts: Vec<Arc<Part>>,
    /// How many instances have each status of [`STATUSES`], usable or not.
    counts: [usize; 5],
}

impl Default for Local {
    fn default() -> Local {
        let empty = Arc::new(Part::default());
        Local {
            parts: vec![empty; SHARDS],
            counts: [0; 5],
        }
    }
}

fn status_index(status: Status) -> usize {
    STATUSES.iter().position(|s| *s == status).unwrap_or(0)
}

impl Local {
    /// The registry to publish.
    pub(crate) fn registry(&self) -> Registry {
        Registry::from_shards(self.parts.iter().map(|p| p.built.clone()))
    }

    /// What was left out of the instances, app by app.
    pub(crate) fn warnings(&self) -> Vec<InvalidInstance> {
        (self.parts.iter().flat_map(|p| p.apps.values()))
            .flat_map(|a| a.warnings.iter().map(|(_, w)| w.clone()))
            .collect()
    }

    /// Eureka's reconcile hash code of every instance held, as a Eureka client computes it
    /// over its local copy.
    pub(crate) fn hash_code(&self) -> String {
        reconcile_hash_code_of_counts(STATUSES.into_iter().zip(self.counts))
    }

    /// How many instances are held, usable or not.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.counts.iter().sum()
    }

    fn app(&self, key: &str) -> Option<&App> {
        self.parts[shard_of(key)].apps.get(key)
    }

    /// This copy with `changes` applied in order: a new copy that shares every shard none
    /// of them touches. Apps left without instances are dropped.
    pub(crate) fn apply(&self, changes: Vec<Change>) -> Local {
        let mut next = self.clone();
        let mut touched: BTreeMap<Box<str>, Vec<Change>> = BTreeMap::new();
        for change in changes {
            touched.entry(change.app.clone()).or_default().push(change);
        }
        for (key, changes) in touched {
            let part = part_mut(&mut next.parts[shard_of(&key)]);
            let (key, mut app): (Arc<str>, App) = match part.apps.remove_entry(&*key) {
                Some(found) => found,
                None => (key.into(), App::default()),
            };
            for s in app.statuses() {
                next.counts[status_index(s)] -= 1;
            }
            let mut group: Vec<Arc<Instance>> = app.group.to_vec();
            for change in changes {
                let id = &*change.id;
                group.retain(|i| &*i.instance_id != id);
                app.unusable.retain(|(u, _)| &**u != id);
                app.warnings.retain(|(w, _)| &**w != id);
                let Some(entry) = change.entry else { continue };
                app.warnings
                    .extend(entry.warnings.into_iter().map(|w| (entry.id.clone(), w)));
                match entry.usable {
                    Some(inst) => {
                        let at = group.partition_point(|i| *i.instance_id < *inst.instance_id);
                        group.insert(at, inst);
                    }
                    None => app.unusable.push((entry.id, entry.status)),
                }
            }
            app.group = group.into();
            for s in app.statuses() {
                next.counts[status_index(s)] += 1;
            }
            if !app.is_empty() {
                part.apps.insert(key, app);
            }
        }
        for (new, old) in next.parts.iter_mut().zip(&self.parts) {
            if !Arc::ptr_eq(new, old) {
                *new = Arc::new(Part::new(std::mem::take(&mut part_mut(new).apps)));
            }
        }
        next
    }
}

/// `Arc::make_mut` for a part, which is not `Clone`: its `built` shard is rebuilt after.
fn part_mut(this: &mut Arc<Part>) -> &mut Part {
    if Arc::get_mut(this).is_none() {
        *this = Arc::new(Part {
            apps: this.apps.clone(),
            built: this.built.clone(),
        });
    }
    Arc::get_mut(this).expect("just made unique")
}

/// A full fetch being read: a new copy that takes from `previous` what did not change.
pub(crate) struct Full {
    previous: Arc<Local>,
    apps: BTreeMap<Box<str>, Building>,
}

/// An app being read.
#[derive(Default)]
struct Building {
    group: Vec<Arc<Instance>>,
    unusable: Vec<(Arc<str>, Status)>,
    warnings: Vec<(Arc<str>, InvalidInstance)>,
}

impl Full {
    pub(crate) fn new(previous: Arc<Local>) -> Full {
        Full {
            previous,
            apps: BTreeMap::new(),
        }
    }

    /// Adds instance `index` of application `app`, as read; an equal instance of the
    /// previous copy is kept instead of the new one.
    pub(crate) fn add(&mut self, app: &str, index: usize, info: &InstanceInfo) {
        let entry = Entry::convert(app, index, info);
        let key = app.to_ascii_uppercase();
        let building = match self.apps.get_mut(key.as_str()) {
            Some(b) => b,
            None => self.apps.entry(key.clone().into()).or_default(),
        };
        building
            .warnings
            .extend(entry.warnings.into_iter().map(|w| (entry.id.clone(), w)));
        let Some(inst) = entry.usable else {
            building.unusable.push((entry.id, entry.status));
            return;
        };
        let before = (self.previous.app(&key)).and_then(|a| {
            let at = a
                .group
                .binary_search_by(|i| (*i.instance_id).cmp(&inst.instance_id))
                .ok()?;
            Some(&a.group[at])
        });
        building.group.push(match before {
            Some(same) if **same == *inst => Arc::clone(same),
            _ => inst,
        });
    }

    /// The new copy.
    pub(crate) fn finish(self) -> Local {
        let previous = self.previous;
        let mut parts: Vec<BTreeMap<Arc<str>, App>> = vec![BTreeMap::new(); SHARDS];
        let mut counts = [0; 5];
        for (key, mut b) in self.apps {
            // By id; of two instances with one id, the later in the document stays.
            b.group.sort_by(|x, y| x.instance_id.cmp(&y.instance_id));
            b.group.reverse();
            b.group
                .dedup_by(|later, earlier| later.instance_id == earlier.instance_id);
            b.group.reverse();
            let old = previous.parts[shard_of(&key)].apps.get_key_value(&*key);
            let same_group = old.is_some_and(|(_, a)| {
                a.group.len() == b.group.len()
                    && a.group.iter().zip(&b.group).all(|(x, y)| Arc::ptr_eq(x, y))
            });
            let app = App {
                group: match old {
                    Some((_, a)) if same_group => a.group.clone(),
                    _ => b.group.into(),
                },
                unusable: b.unusable,
                warnings: b.warnings,
            };
            for s in app.statuses() {
                counts[status_index(s)] += 1;
            }
            let key: Arc<str> = old.map_or_else(|| key.into(), |(k, _)| k.clone());
            parts[shard_of(&key)].insert(key, app);
        }
        let parts = (parts.into_iter().zip(&previous.parts))
            .map(|(apps, old)| {
                let same = apps.len() == old.apps.len()
                    && (apps.iter().zip(&old.apps))
                        .all(|((k, a), (ok, oa))| k == ok && a.shares(oa));
                if same {
                    Arc::clone(old)
                } else {
                    Arc::new(Part::new(apps))
                }
            })
            .collect();
        Local { parts, counts }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testdata::read as testdata;
    use crate::wire::json::parse_document;

    fn full(previous: &Arc<Local>, doc: &[u8]) -> Local {
        let mut full = Full::new(Arc::clone(previous));
        for app in parse_document(doc).unwrap().applications.application {
            for (index, info) in app.instance.iter().enumerate() {
                full.add(&app.name, index, info);
            }
        }
        full.finish()
    }

    fn changes(doc: &[u8]) -> Vec<Change> {
        let mut out = Vec::new();
        for app in parse_document(doc).unwrap().applications.application {
            for (index, info) in app.instance.iter().enumerate() {
                out.extend(Change::of(&app.name, index, info));
            }
        }
        out
    }

    fn ids(local: &Local) -> Vec<String> {
        let mut ids: Vec<String> = (local.registry().instances())
            .map(|i| i.instance_id.to_string())
            .collect();
        ids.sort();
        ids
    }

    #[test]
    fn a_full_fetch_holds_what_to_registry_gives_and_the_documents_hash_code() {
        let doc = testdata("eureka-apps.json");
        let local = full(&Arc::new(Local::default()), &doc);
        let whole = parse_document(&doc).unwrap().applications;
        let converted = whole.to_registry();
        let mut expected: Vec<Arc<Instance>> = converted.registry.instances().cloned().collect();
        expected.sort_by(|a, b| (&a.app, &a.instance_id).cmp(&(&b.app, &b.instance_id)));
        let mut got: Vec<Arc<Instance>> = local.registry().instances().cloned().collect();
        got.sort_by(|a, b| (&a.app, &a.instance_id).cmp(&(&b.app, &b.instance_id)));
        assert_eq!(got, expected);
        assert_eq!(local.hash_code(), whole.reconcile_hash_code());
        assert_eq!(local.len(), 9);
        assert_eq!(local.warnings().len(), converted.warnings.len());
    }

    #[test]
    fn an_unchanged_full_fetch_shares_every_shard_with_the_copy_before_it() {
        let doc = testdata("eureka-apps.json");
        let first = Arc::new(full(&Arc::new(Local::default()), &doc));
        let again = full(&first, &doc);
        assert!((first.parts.iter().zip(&again.parts)).all(|(a, b)| Arc::ptr_eq(a, b)));
        assert_eq!(again.registry(), first.registry());
        assert!(again.registry().changes_since(&first.registry()).is_empty());
    }

    #[test]
    fn a_full_fetch_that_changes_one_instance_shares_the_others() {
        let doc = testdata("eureka-apps.json");
        let first = Arc::new(full(&Arc::new(Local::default()), &doc));
        let text = String::from_utf8(doc).unwrap();
        let changed = text.replacen("\"UP\"", "\"DOWN\"", 1);
        let second = full(&first, changed.as_bytes());
        let changes = second.registry().changes_since(&first.registry());
        assert_eq!((changes.removed.len(), changes.added.len()), (1, 1));
        assert_eq!(changes.added[0].status, Status::Down);
        let shared = (second.registry().instances())
            .filter(|i| first.registry().instances().any(|j| Arc::ptr_eq(i, j)))
            .count();
        assert_eq!(shared, 8);
    }

    #[test]
    fn a_delta_adds_modifies_and_deletes_and_gives_the_servers_hash_code() {
        let base = Arc::new(full(
            &Arc::new(Local::default()),
            &testdata("eureka-apps.json"),
        ));
        let delta = testdata("eureka-delta.json");
        let next = base.apply(changes(&delta));
        let theirs = parse_document(&delta).unwrap().applications.apps_hashcode;
        assert_eq!(Some(next.hash_code()), theirs);
        let got = ids(&next);
        assert!(got.contains(&"hello-4".to_owned()));
        assert!(!got.contains(&"greeter-2".to_owned()));
        assert_eq!(ids(&base).len(), 9, "the copy applied to is left as it was");
        let modified = (next.registry().instances())
            .find(|i| &*i.instance_id == "hello-3.internal:hello:8080")
            .unwrap()
            .status;
        assert_eq!(modified, Status::Up);
        let touched = (base.parts.iter().zip(&next.parts))
            .filter(|(a, b)| !Arc::ptr_eq(a, b))
            .count();
        assert!(
            touched <= 2,
            "only the shards of the changed apps: {touched}"
        );
    }

    #[test]
    fn a_delta_for_an_unknown_app_adds_it_and_deleting_its_last_instance_drops_it() {
        let base = Arc::new(Local::default());
        let added = base.apply(changes(&testdata("eureka-delta-missed-change.json")));
        assert!(added.len() > 0);
        let deleted: Vec<Change> = changes(&testdata("eureka-delta-missed-change.json"))
            .into_iter()
            .map(|c| Change { entry: None, ..c })
            .collect();
        let gone = added.apply(deleted);
        assert_eq!(gone.len(), 0);
        assert!(gone.parts.iter().all(|p| p.apps.is_empty()));
        assert_eq!(gone.hash_code(), "");
    }

    #[test]
    fn an_instance_odmesh_cannot_use_counts_in_the_hash_code_and_is_left_out_with_a_warning() {
        let doc = br#"{"applications": {"application": [{"name": "HELLO", "instance": [
            {"instanceId": "a", "ipAddr": "10.0.0.1", "status": "UP"},
            {"instanceId": "b", "ipAddr": "not an address", "status": "DOWN"}]}]}}"#;
        let local = full(&Arc::new(Local::default()), doc);
        assert_eq!(local.registry().len(), 1);
        assert_eq!(local.hash_code(), "DOWN_1_UP_1_");
        assert_eq!(local.warnings().len(), 1);
        assert_eq!(local.warnings()[0].field, "ipAddr");
    }
}
