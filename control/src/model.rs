//! An immutable snapshot of the registry as Envoy needs it: cluster name → endpoints.
//!
//! A cluster exists for every VIP or SVIP that some instance lists, whatever its status;
//! only `UP` instances with the matching port become endpoints. A name with no entry here is
//! not registered at all.
//!
//! [`SnapshotBuilder`] follows a registry from change to change and rebuilds only the
//! clusters whose instances changed, sharing the others with the previous snapshot: a
//! status change of one instance in a registry of a million costs one cluster, not a
//! million instances.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use odmesh_names::{Kind, cluster_name};
use tokio::sync::watch;

use odmesh_base::metrics::set;

use odmesh_registry::{Instance, Protocol, Registry, RegistryMetrics, Status, Zone};

/// One address traffic can go to.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Endpoint {
    /// The locality; `None` sorts first.
    pub zone: Option<Zone>,
    pub ip: IpAddr,
    pub port: u16,
}

/// What the registry says about one cluster (`<vip>.vip` or `<svip>.svip`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ClusterInfo {
    /// The VIP or SVIP, lowercase.
    pub vip: String,
    pub kind: Kind,
    /// Endpoints of the `UP` instances, sorted and without duplicates.
    pub endpoints: Vec<Endpoint>,
    /// How many instances list this VIP, whatever their status.
    pub instances: usize,
    /// The HTTP protocol its instances declare ([`Protocol::of_cluster`]).
    pub protocol: Protocol,
}

impl ClusterInfo {
    /// The cluster of `vip` (of `kind`) made of `members`, the instances that list it.
    fn of(vip: &str, kind: Kind, members: &[Arc<Instance>]) -> ClusterInfo {
        let mut endpoints: Vec<Endpoint> = members
            .iter()
            .filter(|inst| inst.status == Status::Up)
            .filter_map(|inst| {
                let port = match kind {
                    Kind::Vip => inst.port,
                    Kind::Svip => inst.secure_port,
                }?;
                Some(Endpoint {
                    zone: inst.zone.clone(),
                    ip: inst.ip,
                    port,
                })
            })
            .collect();
        endpoints.sort();
        endpoints.dedup();
        ClusterInfo {
            vip: vip.to_owned(),
            kind,
            endpoints,
            instances: members.len(),
            protocol: Protocol::of_cluster(members.iter().map(|inst| inst.protocol)),
        }
    }
}

/// How many parts a snapshot's index is cut into. A new snapshot copies only the parts
/// holding a cluster that changed and shares the others: with 100,000 clusters, a change
/// copies about a hundred entries per part it touches, not 100,000. (With 256 parts and
/// `String` names, copying the touched parts was 30% of the control plane's CPU under the
/// embedded registry's churn at 100,000 VIPs.)
const SHARDS: usize = 1024;

/// Part of the index: names are shared (`Arc<str>`), so copying a part allocates no name.
type Shard = Arc<HashMap<Arc<str>, Arc<ClusterInfo>>>;

/// The part of the index `name` is in (FNV-1a, so the same in every process).
fn shard_of(name: &str) -> usize {
    let hash = name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    (hash % SHARDS as u64) as usize
}

/// The registry, indexed by cluster name. Cheap to share: clusters are behind `Arc`, and so
/// are the parts of the index.
#[derive(Clone, Debug)]
pub struct Snapshot {
    shards: Vec<Shard>,
    len: usize,
    /// Whether the registry was complete (see [`Registry::is_complete`]).
    complete: bool,
    /// When the registry source published the changes of the snapshots [`follow`] sent that
    /// the cache has not applied yet (shared by every snapshot of one pipeline; `None`: not
    /// built by one).
    published: Option<Arc<Oldest>>,
}

/// The oldest of some moments not yet taken: when the registry source published the changes
/// not yet built, or not yet applied. Taken by the next step, so that a step that skips an
/// intermediate version (a `watch` keeps only the latest) still counts from its first change.
#[derive(Debug, Default)]
pub struct Oldest(std::sync::Mutex<Option<Instant>>);

impl Oldest {
    /// Notes `at`, unless an older moment waits.
    pub fn note(&self, at: Instant) {
        self.lock().get_or_insert(at);
    }

    /// The oldest moment noted since the last take.
    pub fn take(&self) -> Option<Instant> {
        self.lock().take()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Instant>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Default for Snapshot {
    /// An empty snapshot of a complete (empty) registry.
    fn default() -> Snapshot {
        Snapshot {
            shards: vec![Shard::default(); SHARDS],
            len: 0,
            complete: true,
            published: None,
        }
    }
}

impl Snapshot {
    /// When the registry source published the oldest change of the snapshots sent that the
    /// cache has not applied yet, if known; taken: the cache calls it once per snapshot it
    /// applies.
    pub fn take_published(&self) -> Option<Instant> {
        self.published.as_ref()?.take()
    }

    /// Indexes `registry` by cluster name.
    pub fn from_registry(registry: &Registry) -> Snapshot {
        let mut builder = SnapshotBuilder::default();
        let snapshot = builder.update(Arc::new(registry.clone())).snapshot;
        drop(builder);
        Arc::unwrap_or_clone(snapshot)
    }

    /// The cluster called `name`, if the registry lists its VIP.
    pub fn get(&self, name: &str) -> Option<&Arc<ClusterInfo>> {
        self.shards[shard_of(name)].get(name)
    }

    /// How many clusters the registry defines.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the registry is all its source knows; `false` while the source is still
    /// loading, when a cluster missing here may just not be known yet.
    pub fn is_complete(&self) -> bool {
        self.complete
    }

    /// Whether the registry defines no cluster.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Every cluster, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Arc<ClusterInfo>)> {
        (self.shards.iter())
            .flat_map(|shard| shard.iter())
            .map(|(k, v)| (&**k, v))
    }

    /// The names of the clusters that differ between `self` and `older` (added, removed or
    /// changed), in no particular order: a look inside only the parts of the index that are
    /// not shared.
    pub fn changed_names<'a>(&'a self, older: &'a Snapshot) -> Vec<&'a str> {
        let mut names = Vec::new();
        for (new, old) in self.shards.iter().zip(&older.shards) {
            if Arc::ptr_eq(new, old) {
                continue;
            }
            for (name, info) in new.iter() {
                if old
                    .get(name)
                    .is_none_or(|o| !Arc::ptr_eq(o, info) && o != info)
                {
                    names.push(&**name);
                }
            }
            names.extend(
                (old.keys())
                    .filter(|name| !new.contains_key(*name))
                    .map(|name| &**name),
            );
        }
        names
    }
}

/// The instances that list one cluster's VIP.
#[derive(Debug)]
struct Members {
    vip: String,
    kind: Kind,
    /// Shared with the registry; in no particular order.
    instances: Vec<Arc<Instance>>,
}

/// Builds a [`Snapshot`] for each registry of a source, from the previous one.
///
/// Keeps, for every cluster, the instances that list it, so that a registry change
/// rebuilds only the clusters of the instances that changed ([`Registry::changes_since`]);
/// every other cluster is shared, by pointer, with the previous snapshot.
#[derive(Debug, Default)]
pub struct SnapshotBuilder {
    registry: Arc<Registry>,
    members: HashMap<String, Members>,
    snapshot: Arc<Snapshot>,
}

/// What one [`SnapshotBuilder::update`] did.
#[derive(Clone, Debug)]
pub struct Update {
    /// The snapshot of the new registry; the previous one itself (same `Arc`) when no
    /// cluster changed.
    pub snapshot: Arc<Snapshot>,
    /// Instances removed and added (a changed instance counts in both).
    pub instances_changed: usize,
    /// Clusters that changed, were added or were removed.
    pub clusters_rebuilt: usize,
}

impl SnapshotBuilder {
    /// A builder whose snapshots share `published` ([`Snapshot::take_published`]).
    pub fn with_published(published: Arc<Oldest>) -> SnapshotBuilder {
        let mut builder = SnapshotBuilder::default();
        Arc::make_mut(&mut builder.snapshot).published = Some(published);
        builder
    }

    /// Moves to `registry` and returns its snapshot.
    pub fn update(&mut self, registry: Arc<Registry>) -> Update {
        let changes = registry.changes_since(&self.registry);
        self.registry = registry;
        let touched = self.move_members(&changes.removed, &changes.added);
        // Clusters whose members changed but whose content did not (an instance moved, or
        // changed in a field Envoy does not see) keep their `Arc`, and if no cluster changed,
        // the snapshot is the previous one.
        let mut next: Option<Snapshot> = None;
        let mut clusters_rebuilt = 0;
        for name in &touched {
            let info = self.cluster_info(name);
            if self.snapshot.get(name).map(|old| &**old) == info.as_ref() {
                continue;
            }
            clusters_rebuilt += 1;
            // The parts of the index are shared with the previous snapshot until one is
            // written to: `make_mut` copies that part then, once.
            next.get_or_insert_with(|| (*self.snapshot).clone())
                .set(name, info);
        }
        // A registry that finished loading (or, rarely, started again) is news even when
        // no cluster changed: the cache stops holding back what proxies kept.
        let complete = self.registry.is_complete();
        if next.is_none() && self.snapshot.complete != complete {
            next = Some((*self.snapshot).clone());
        }
        if let Some(mut next) = next {
            next.complete = complete;
            self.snapshot = Arc::new(next);
        }
        Update {
            snapshot: self.snapshot.clone(),
            instances_changed: changes.removed.len() + changes.added.len(),
            clusters_rebuilt,
        }
    }

    /// Takes the `removed` instances out of the members of their clusters and puts the
    /// `added` ones in. Returns the clusters touched.
    fn move_members(
        &mut self,
        removed: &[Arc<Instance>],
        added: &[Arc<Instance>],
    ) -> HashSet<String> {
        let mut touched = HashSet::new();
        for inst in removed {
            for (name, _, _) in clusters_of(inst) {
                // Equal instances cannot be told apart, so any equal one goes: the members
                // stay the multiset of instances that list the cluster.
                if let Some(members) = self.members.get_mut(&name) {
                    let list = &mut members.instances;
                    if let Some(at) = list
                        .iter()
                        .position(|m| Arc::ptr_eq(m, inst) || **m == **inst)
                    {
                        list.swap_remove(at);
                    }
                }
                touched.insert(name);
            }
        }
        for inst in added {
            for (name, vip, kind) in clusters_of(inst) {
                self.members
                    .entry(name.clone())
                    .or_insert_with(|| Members {
                        vip: vip.to_owned(),
                        kind,
                        instances: Vec::new(),
                    })
                    .instances
                    .push(inst.clone());
                touched.insert(name);
            }
        }
        touched
    }

    /// Cluster `name` from its members now; `None` (and its members forgotten) when it has
    /// none left.
    fn cluster_info(&mut self, name: &str) -> Option<ClusterInfo> {
        match self.members.get(name) {
            Some(m) if !m.instances.is_empty() => {
                Some(ClusterInfo::of(&m.vip, m.kind, &m.instances))
            }
            _ => {
                self.members.remove(name);
                None
            }
        }
    }
}

impl Snapshot {
    /// Sets cluster `name` to `info`, or removes it (`None`).
    fn set(&mut self, name: &str, info: Option<ClusterInfo>) {
        let shard = Arc::make_mut(&mut self.shards[shard_of(name)]);
        match info {
            Some(info) => {
                if shard.insert(Arc::from(name), Arc::new(info)).is_none() {
                    self.len += 1;
                }
            }
            None => {
                if shard.remove(name).is_some() {
                    self.len -= 1;
                }
            }
        }
    }
}

/// Every cluster `inst` is a member of: its name, VIP and kind.
fn clusters_of(inst: &Instance) -> impl Iterator<Item = (String, &str, Kind)> {
    let vips = inst.vips.iter().map(|v| (v, Kind::Vip));
    let svips = inst.svips.iter().map(|v| (v, Kind::Svip));
    vips.chain(svips)
        .map(|(vip, kind)| (cluster_name(vip, kind), &**vip, kind))
}

/// After building a snapshot, [`follow`] waits this long before it builds the next, so
/// that the registry changes arriving meanwhile (a burst of registrations, a rolling
/// restart) are taken together: the first change after a quiet time goes out at once, the
/// ones right behind it wait at most this long. Each snapshot costs time whatever it holds:
/// every proxy stream is woken to check its subscriptions.
pub const SNAPSHOT_INTERVAL: std::time::Duration = std::time::Duration::from_millis(20);

/// Follows a registry source: publishes a new [`Snapshot`] each time the registry changes
/// in a way that changes a cluster, at most one per [`SNAPSHOT_INTERVAL`].
///
/// The task ends when the source's sender is dropped or nobody listens to the snapshots.
/// Sets the gauges `registry_clusters` and `registry_complete` of `metrics`.
pub fn follow(
    mut registry: watch::Receiver<Arc<Registry>>,
    metrics: Arc<RegistryMetrics>,
) -> (watch::Receiver<Arc<Snapshot>>, tokio::task::JoinHandle<()>) {
    // When the source published what is not built yet, noted as it comes (a build may take
    // a while), and what is sent and not yet applied (shared by the snapshots).
    let unbuilt = Arc::new(Oldest::default());
    let unapplied = Arc::new(Oldest::default());
    let mut builder = SnapshotBuilder::with_published(unapplied.clone());
    let mut build = move |reg: Arc<Registry>| {
        let started = Instant::now();
        let instances = reg.len();
        let update = builder.update(reg);
        set(&metrics.registry_clusters, update.snapshot.len() as u64);
        set(
            &metrics.registry_complete,
            u64::from(update.snapshot.is_complete()),
        );
        tracing::debug!(
            clusters = update.snapshot.len(),
            instances,
            instances_changed = update.instances_changed,
            clusters_rebuilt = update.clusters_rebuilt,
            elapsed = ?started.elapsed(),
            "snapshot built"
        );
        update.snapshot
    };
    let first = build(registry.borrow_and_update().clone());
    // Cloned once the first version is read: it notes the changes after it.
    let stamper = tokio::spawn({
        let (mut published, unbuilt) = (registry.clone(), unbuilt.clone());
        async move {
            while published.changed().await.is_ok() {
                published.borrow_and_update();
                unbuilt.note(Instant::now());
            }
        }
    });
    let (tx, rx) = watch::channel(first);
    let task = tokio::spawn(async move {
        while registry.changed().await.is_ok() {
            let reg = registry.borrow_and_update().clone();
            // Taken after the version read: a later change's moment is left for its build.
            let published = unbuilt.take();
            let snap = build(reg);
            // An unchanged snapshot (no cluster changed) wakes nobody.
            tx.send_if_modified(|current| {
                if Arc::ptr_eq(current, &snap) {
                    return false;
                }
                if let Some(at) = published {
                    unapplied.note(at);
                }
                *current = snap;
                true
            });
            if tx.is_closed() {
                break;
            }
            tokio::time::sleep(SNAPSHOT_INTERVAL).await;
        }
        stamper.abort();
    });
    (rx, task)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inst(id: &str, ip: &str, status: Status, vips: &[&str], svips: &[&str]) -> Instance {
        Instance {
            app: "HELLO".into(),
            instance_id: id.into(),
            ip: ip.parse().unwrap(),
            port: Some(8080),
            secure_port: (!svips.is_empty()).then_some(8443),
            vips: vips.iter().map(|s| (*s).into()).collect(),
            svips: svips.iter().map(|s| (*s).into()).collect(),
            status,
            zone: None,
            protocol: Protocol::Auto,
        }
    }

    #[test]
    fn up_instances_become_endpoints_of_each_vip_they_list() {
        let reg = Registry::from_iter([
            inst("a", "10.0.0.2", Status::Up, &["hello", "greet"], &["hello"]),
            inst("b", "10.0.0.1", Status::Up, &["hello"], &[]),
        ]);
        let snap = Snapshot::from_registry(&reg);
        let hello = snap.get("hello.vip").unwrap();
        let ips: Vec<String> = hello.endpoints.iter().map(|e| e.ip.to_string()).collect();
        assert_eq!(ips, ["10.0.0.1", "10.0.0.2"], "sorted");
        assert_eq!(snap.get("greet.vip").unwrap().endpoints.len(), 1);
        let secure = snap.get("hello.svip").unwrap();
        assert_eq!(secure.endpoints[0].port, 8443);
        assert_eq!(secure.kind, Kind::Svip);
        assert_eq!(snap.len(), 3);
    }

    #[test]
    fn instances_that_are_not_up_register_the_vip_without_endpoints() {
        let reg = Registry::from_iter([inst("a", "10.0.0.1", Status::Down, &["hello"], &[])]);
        let snap = Snapshot::from_registry(&reg);
        let hello = snap.get("hello.vip").unwrap();
        assert!(hello.endpoints.is_empty());
        assert_eq!(hello.instances, 1);
        assert!(snap.get("other.vip").is_none());
    }

    #[test]
    fn a_vip_without_its_port_has_no_endpoints() {
        let mut i = inst("a", "10.0.0.1", Status::Up, &["hello"], &[]);
        i.port = None;
        let snap = Snapshot::from_registry(&Registry::from_iter([i]));
        assert!(snap.get("hello.vip").unwrap().endpoints.is_empty());
    }

    #[tokio::test]
    async fn follow_publishes_a_snapshot_for_each_registry_change() {
        let (tx, rx) = watch::channel(Arc::new(Registry::default()));
        let (mut snaps, _task) = follow(rx, Arc::new(RegistryMetrics::default()));
        assert!(snaps.borrow_and_update().is_empty());
        let reg = Registry::from_iter([inst("a", "10.0.0.1", Status::Up, &["hello"], &[])]);
        tx.send(Arc::new(reg)).unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(5), snaps.changed())
            .await
            .expect("a new snapshot within 5 s")
            .unwrap();
        assert!(snaps.borrow().get("hello.vip").is_some());
    }

    #[test]
    fn a_registry_that_finishes_loading_is_a_new_snapshot_even_with_the_same_clusters() {
        let one = inst("a", "10.0.0.1", Status::Up, &["one"], &[]);
        let mut builder = SnapshotBuilder::default();
        let loading = Registry::from_iter([one.clone()]).still_loading(true);
        let first = builder.update(Arc::new(loading)).snapshot;
        assert!(!first.is_complete());
        let second = builder
            .update(Arc::new(Registry::from_iter([one])))
            .snapshot;
        assert!(second.is_complete());
        assert!(!Arc::ptr_eq(&first, &second));
        assert!(
            second.changed_names(&first).is_empty(),
            "no cluster changed"
        );
    }

    #[test]
    fn changed_names_lists_added_removed_and_changed_clusters() {
        let mut builder = SnapshotBuilder::default();
        let one = inst("a", "10.0.0.1", Status::Up, &["one"], &[]);
        let two = inst("b", "10.0.0.2", Status::Up, &["two"], &[]);
        let before = builder
            .update(Arc::new(Registry::from_iter([one.clone(), two.clone()])))
            .snapshot;
        let mut two_down = two.clone();
        two_down.status = Status::Down;
        let three = inst("c", "10.0.0.3", Status::Up, &["three"], &[]);
        let after = builder
            .update(Arc::new(Registry::from_iter([two_down, three])))
            .snapshot;
        let mut names = after.changed_names(&before);
        names.sort();
        assert_eq!(names, ["one.vip", "three.vip", "two.vip"]);
        assert!(after.changed_names(&after).is_empty());
        assert_eq!(after.len(), 2);
    }

    /// The snapshot's clusters built the plain way, one pass over every instance: what
    /// [`SnapshotBuilder`] must agree with.
    fn reference(reg: &Registry) -> HashMap<String, ClusterInfo> {
        let mut out: HashMap<String, ClusterInfo> = HashMap::new();
        let mut declared: HashMap<String, Vec<Protocol>> = HashMap::new();
        for inst in reg.instances() {
            let sides = [
                (Kind::Vip, &inst.vips, inst.port),
                (Kind::Svip, &inst.svips, inst.secure_port),
            ];
            for (kind, vips, port) in sides {
                for vip in vips {
                    let info = out
                        .entry(cluster_name(vip, kind))
                        .or_insert_with(|| ClusterInfo {
                            vip: vip.to_string(),
                            kind,
                            endpoints: Vec::new(),
                            instances: 0,
                            protocol: Protocol::Auto,
                        });
                    info.instances += 1;
                    (declared.entry(cluster_name(vip, kind)).or_default()).push(inst.protocol);
                    if let (Status::Up, Some(port)) = (inst.status, port) {
                        info.endpoints.push(Endpoint {
                            zone: inst.zone.clone(),
                            ip: inst.ip,
                            port,
                        });
                    }
                }
            }
        }
        for (name, info) in &mut out {
            info.endpoints.sort();
            info.endpoints.dedup();
            info.protocol = Protocol::of_cluster(declared[name].iter().copied());
        }
        out
    }

    fn clusters(snap: &Snapshot) -> HashMap<String, ClusterInfo> {
        snap.iter()
            .map(|(name, info)| (name.to_owned(), (**info).clone()))
            .collect()
    }

    #[test]
    fn every_update_gives_what_a_full_build_gives() {
        // xorshift64: a fixed, varied sequence of registry changes.
        let mut state = 0x2545_F491_4F6C_DD1D_u64;
        let mut next = move |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % n) as usize
        };
        let vips = ["a", "b", "c", "d", "e"];
        let statuses = [Status::Up, Status::Down, Status::OutOfService];
        let make = |id: usize, next: &mut dyn FnMut(u64) -> usize| {
            let mut i = inst(
                &format!("i{id}"),
                &format!("10.0.0.{}", next(6)),
                statuses[next(3)],
                &[vips[next(5)], vips[next(5)]],
                if next(3) == 0 { &["s"] } else { &[] },
            );
            i.vips.dedup();
            i.zone = (next(2) == 0).then(|| "z1".into());
            i.protocol = Protocol::ALL[next(3)];
            Arc::new(i)
        };
        let mut instances: Vec<Arc<Instance>> = (0..12).map(|id| make(id, &mut next)).collect();
        let mut builder = SnapshotBuilder::default();
        let mut previous = Arc::new(Snapshot::default());
        for step in 0..400 {
            match next(7) {
                // One instance changes (status, VIPs, address...), under the same id.
                0 | 1 => {
                    let at = next(instances.len() as u64);
                    let id: usize = instances[at].instance_id[1..].parse().unwrap();
                    instances[at] = make(id, &mut next);
                }
                2 if instances.len() > 1 => {
                    instances.remove(next(instances.len() as u64));
                }
                // A new instance, sometimes with the id of one already there.
                3 => {
                    let id = next(30);
                    let at = next(instances.len() as u64 + 1);
                    instances.insert(at, make(id, &mut next));
                }
                // Two instances swap places.
                4 => {
                    let (x, y) = (next(instances.len() as u64), next(instances.len() as u64));
                    instances.swap(x, y);
                }
                // Every instance read again (a file source): equal, but nothing shared.
                5 => instances = instances.iter().map(|i| Arc::new((**i).clone())).collect(),
                // An exact copy of an instance.
                _ => instances.push(instances[next(instances.len() as u64)].clone()),
            }
            let reg = Registry::from_iter(instances.clone());
            let snap = builder.update(Arc::new(reg.clone())).snapshot;
            let want = reference(&reg);
            assert_eq!(snap.len(), want.len(), "step {step}");
            assert_eq!(clusters(&snap), want, "step {step}");
            let mut changed = snap.changed_names(&previous);
            changed.sort();
            let (now, before) = (clusters(&snap), clusters(&previous));
            let mut differ: Vec<&str> = (now.keys().chain(before.keys()))
                .filter(|name| now.get(*name) != before.get(*name))
                .map(String::as_str)
                .collect();
            differ.sort();
            differ.dedup();
            assert_eq!(changed, differ, "step {step}");
            for (name, info) in snap.iter() {
                if let Some(old) = previous.get(name) {
                    assert!(
                        Arc::ptr_eq(info, old) || **info != **old,
                        "step {step}: {name} unchanged but not shared"
                    );
                }
            }
            previous = snap;
        }
    }

    #[test]
    fn a_change_rebuilds_only_the_clusters_of_the_instances_that_changed() {
        let mut instances: Vec<Arc<Instance>> = (0..100)
            .map(|i| {
                let vip = format!("v{}", i / 10);
                let ip = format!("10.0.0.{i}");
                Arc::new(inst(&format!("i{i}"), &ip, Status::Up, &[&vip], &[]))
            })
            .collect();
        let mut builder = SnapshotBuilder::default();
        let first = builder.update(Arc::new(Registry::from_iter(instances.clone())));
        assert_eq!(first.clusters_rebuilt, 10);
        let mut down = (*instances[42]).clone();
        down.status = Status::Down;
        instances[42] = Arc::new(down);
        let second = builder.update(Arc::new(Registry::from_iter(instances.clone())));
        assert_eq!(
            second.instances_changed, 2,
            "the old and the new form of i42"
        );
        assert_eq!(second.clusters_rebuilt, 1);
        assert_eq!(second.snapshot.get("v4.vip").unwrap().endpoints.len(), 9);
        assert!(Arc::ptr_eq(
            first.snapshot.get("v3.vip").unwrap(),
            second.snapshot.get("v3.vip").unwrap()
        ));
        // The same registry again: the same snapshot, nothing built.
        let third = builder.update(Arc::new(Registry::from_iter(instances)));
        assert!(Arc::ptr_eq(&third.snapshot, &second.snapshot));
        assert_eq!(third.clusters_rebuilt, 0);
    }
}
