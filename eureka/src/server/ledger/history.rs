//! The `/apps/delta` history: the latest change of each instance within the retention, oldest
//! first.
//!
//! Changes are appended in the order they are made (their versions rise), so the history is
//! a queue: no tree and no index of every instance. A change that a later change of the same
//! instance supersedes is marked, and dropped when it reaches the front or when marked ones
//! outnumber the rest. Finding the change to mark takes its version, which the lease keeps
//! ([`super::Lease`]); for an instance whose lease is gone (its latest change is a delete)
//! the history keeps it (`History::gone`).

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use tokio::time::Instant;

use super::super::stored::Stored;
use super::Name;
use crate::wire::json::ActionType;

/// A change, as the delta lists it.
#[derive(Debug)]
pub(super) struct Change {
    pub version: u64,
    pub at: Instant,
    pub app: Name,
    pub id: Name,
    pub action: ActionType,
    /// The instance as it was after the change, and its lease's last renewal then; `None`
    /// once a later change of the instance superseded it.
    pub doc: Option<Stored>,
    pub renewed_ms: u64,
}

#[derive(Debug, Default)]
pub(super) struct History {
    /// In version order, superseded ones among them.
    changes: VecDeque<Change>,
    /// How many are not superseded.
    live: usize,
    /// (APP, id) → the version of its change, for the instances whose latest change is a
    /// delete.
    gone: HashMap<(Name, Name), u64>,
}

impl History {
    /// Appends `change`, superseding the instance's change of version `older` (the lease's,
    /// for an instance registered before it), or the delete it had if its lease was gone.
    pub fn record(&mut self, change: Change, older: Option<u64>) {
        let key = (change.app.clone(), change.id.clone());
        for older in older.into_iter().chain(self.gone.remove(&key)) {
            self.supersede(older);
        }
        debug_assert!(
            self.changes
                .back()
                .is_none_or(|c| c.version < change.version)
        );
        if change.action == ActionType::Deleted {
            self.gone.insert(key, change.version);
        }
        self.changes.push_back(change);
        self.live += 1;
        if self.changes.len() > 2 * self.live + 1024 {
            self.changes.retain(|c| c.doc.is_some());
        }
    }

    fn supersede(&mut self, version: u64) {
        let Ok(i) = self.changes.binary_search_by_key(&version, |c| c.version) else {
            return;
        };
        if self.changes[i].doc.take().is_some() {
            self.live -= 1;
        }
    }

    /// Drops the changes older than `retention` at `now`, and the oldest beyond `max_len`.
    pub fn prune(&mut self, now: Instant, retention: Duration, max_len: usize) {
        while let Some(oldest) = self.changes.front() {
            let superseded = oldest.doc.is_none();
            let age = now.saturating_duration_since(oldest.at);
            if !superseded && self.live <= max_len && age <= retention {
                return;
            }
            let Some(change) = self.changes.pop_front() else {
                return;
            };
            if superseded {
                continue;
            }
            self.live -= 1;
            if change.action == ActionType::Deleted {
                let key = (change.app, change.id);
                if self.gone.get(&key) == Some(&change.version) {
                    self.gone.remove(&key);
                }
            }
        }
    }

    /// The changes held, oldest first.
    pub fn iter(&self) -> impl Iterator<Item = (&Change, &Stored)> {
        (self.changes.iter()).filter_map(|c| c.doc.as_ref().map(|doc| (c, doc)))
    }

    /// How many changes it holds.
    pub fn len(&self) -> usize {
        self.live
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::json::InstanceInfo;

    const MINUTE: Duration = Duration::from_secs(60);

    struct Made {
        history: History,
        version: u64,
        /// The version of each instance's latest change while its lease lives, as the
        /// lease keeps it.
        leases: HashMap<&'static str, u64>,
        t0: Instant,
    }

    impl Made {
        fn new() -> Made {
            Made {
                history: History::default(),
                version: 0,
                leases: HashMap::new(),
                t0: Instant::now(),
            }
        }

        fn change(&mut self, id: &'static str, action: ActionType, at: Duration) {
            self.version += 1;
            let older = match action {
                ActionType::Deleted => self.leases.remove(id),
                _ => self.leases.insert(id, self.version),
            };
            let info = InstanceInfo {
                instance_id: Some(id.into()),
                ..InstanceInfo::default()
            };
            let change = Change {
                version: self.version,
                at: self.t0 + at,
                app: "APP".into(),
                id: id.into(),
                action,
                doc: Some(Stored::from(&info)),
                renewed_ms: 0,
            };
            self.history.record(change, older);
        }

        /// The instances and actions held, oldest first.
        fn held(&self) -> Vec<(String, ActionType)> {
            (self.history.iter())
                .map(|(c, doc)| {
                    assert_eq!(doc.instance_id(), Some(&*c.id));
                    (c.id.to_string(), c.action)
                })
                .collect()
        }
    }

    use ActionType::{Added, Deleted, Modified};

    #[test]
    fn it_holds_the_latest_change_of_each_instance_in_the_order_made() {
        let mut m = Made::new();
        m.change("a", Added, Duration::ZERO);
        m.change("b", Added, Duration::ZERO);
        m.change("a", Modified, Duration::ZERO);
        m.change("b", Deleted, Duration::ZERO);
        m.change("c", Added, Duration::ZERO);
        m.change("b", Added, Duration::ZERO);
        let held = m.held();
        assert_eq!(
            held,
            [
                ("a".into(), Modified),
                ("c".into(), Added),
                ("b".into(), Added)
            ]
        );
        assert_eq!(m.history.len(), 3);
        assert!(m.history.gone.is_empty(), "b registered again");
        m.change("c", Deleted, Duration::ZERO);
        assert_eq!(m.history.gone.len(), 1);
        assert_eq!(m.held().last(), Some(&("c".into(), Deleted)));
    }

    #[test]
    fn the_retention_and_the_bound_drop_the_oldest_and_what_they_drop_is_forgotten() {
        let mut m = Made::new();
        m.change("a", Added, Duration::ZERO);
        m.change("a", Deleted, MINUTE);
        m.change("b", Added, 2 * MINUTE);
        m.change("c", Added, 3 * MINUTE);
        // At 4 min with 3 min kept: the change at 1 min still is, and the delete is known.
        m.history.prune(m.t0 + 4 * MINUTE, 3 * MINUTE, 10);
        assert_eq!(m.history.len(), 3);
        m.history
            .prune(m.t0 + 4 * MINUTE + Duration::from_millis(1), 3 * MINUTE, 10);
        assert_eq!(m.held(), [("b".into(), Added), ("c".into(), Added)]);
        assert!(m.history.gone.is_empty(), "a pruned delete is forgotten");
        m.history.prune(m.t0 + 3 * MINUTE, 3 * MINUTE, 1);
        assert_eq!(m.held(), [("c".into(), Added)]);
        // A change of an instance whose change was pruned supersedes nothing else.
        m.change("b", Modified, 3 * MINUTE);
        assert_eq!(m.held(), [("c".into(), Added), ("b".into(), Modified)]);
    }

    #[test]
    fn superseded_changes_do_not_pile_up() {
        let mut m = Made::new();
        m.change("steady", Added, Duration::ZERO);
        for _ in 0..10_000 {
            m.change("flapping", Modified, Duration::ZERO);
        }
        assert_eq!(m.history.len(), 2);
        assert!(
            m.history.changes.len() <= 2 * 2 + 1024 + 1,
            "{}",
            m.history.changes.len()
        );
        assert_eq!(
            m.held(),
            [("steady".into(), Added), ("flapping".into(), Modified)]
        );
    }
}
