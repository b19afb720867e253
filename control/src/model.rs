//! An immutable snapshot of the registry as Envoy needs it: cluster name → endpoints.
//!
//! Built from a [`Registry`] in one pass. A cluster exists for every VIP or SVIP that some
//! instance lists, whatever its status; only `UP` instances with the matching port become
//! endpoints. A name with no entry here is not registered at all.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use odmesh_names::{Kind, cluster_name};
use tokio::sync::watch;

use crate::metrics::Metrics;
use crate::registry::{Registry, Status};

/// One address traffic can go to.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Endpoint {
    /// The locality; `None` sorts first.
    pub zone: Option<String>,
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
}

/// The registry, indexed by cluster name. Cheap to share: clusters are behind `Arc`.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    clusters: HashMap<String, Arc<ClusterInfo>>,
}

impl Snapshot {
    /// Indexes `registry` by cluster name.
    pub fn from_registry(registry: &Registry) -> Snapshot {
        let mut building: HashMap<String, ClusterInfo> = HashMap::new();
        for inst in &registry.instances {
            let sides = [
                (Kind::Vip, &inst.vips, inst.port),
                (Kind::Svip, &inst.svips, inst.secure_port),
            ];
            for (kind, vips, port) in sides {
                for vip in vips {
                    let info =
                        building
                            .entry(cluster_name(vip, kind))
                            .or_insert_with(|| ClusterInfo {
                                vip: vip.clone(),
                                kind,
                                endpoints: Vec::new(),
                                instances: 0,
                            });
                    info.instances += 1;
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
        let clusters = building
            .into_iter()
            .map(|(name, mut info)| {
                info.endpoints.sort();
                info.endpoints.dedup();
                (name, Arc::new(info))
            })
            .collect();
        Snapshot { clusters }
    }

    /// The cluster called `name`, if the registry lists its VIP.
    pub fn get(&self, name: &str) -> Option<&Arc<ClusterInfo>> {
        self.clusters.get(name)
    }

    /// How many clusters the registry defines.
    pub fn len(&self) -> usize {
        self.clusters.len()
    }

    /// Whether the registry defines no cluster.
    pub fn is_empty(&self) -> bool {
        self.clusters.is_empty()
    }

    /// Every cluster, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Arc<ClusterInfo>)> {
        self.clusters.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// Whether cluster `name` differs between `self` and `older` (added, removed or changed).
    pub fn changed_since(&self, older: &Snapshot, name: &str) -> bool {
        match (self.get(name), older.get(name)) {
            (None, None) => false,
            (Some(a), Some(b)) => !Arc::ptr_eq(a, b) && a != b,
            _ => true,
        }
    }
}

/// Follows a registry source: publishes a new [`Snapshot`] each time the registry changes.
///
/// The task ends when the source's sender is dropped or nobody listens to the snapshots.
pub fn follow(
    mut registry: watch::Receiver<Arc<Registry>>,
    metrics: Arc<Metrics>,
) -> (watch::Receiver<Arc<Snapshot>>, tokio::task::JoinHandle<()>) {
    let build = move |reg: &Registry| {
        let started = std::time::Instant::now();
        let snap = Snapshot::from_registry(reg);
        Metrics::set(&metrics.registry_clusters, snap.len() as u64);
        tracing::debug!(
            clusters = snap.len(),
            instances = reg.instances.len(),
            elapsed_ms = started.elapsed().as_secs_f64() * 1e3,
            "snapshot built"
        );
        Arc::new(snap)
    };
    let first = build(&registry.borrow_and_update());
    let (tx, rx) = watch::channel(first);
    let task = tokio::spawn(async move {
        while registry.changed().await.is_ok() {
            let snap = build(&registry.borrow_and_update());
            if tx.send(snap).is_err() {
                break;
            }
        }
    });
    (rx, task)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::Instance;

    fn inst(id: &str, ip: &str, status: Status, vips: &[&str], svips: &[&str]) -> Instance {
        Instance {
            app: "HELLO".into(),
            instance_id: id.into(),
            ip: ip.parse().unwrap(),
            port: Some(8080),
            secure_port: (!svips.is_empty()).then_some(8443),
            vips: vips.iter().map(|s| s.to_string()).collect(),
            svips: svips.iter().map(|s| s.to_string()).collect(),
            status,
            zone: None,
        }
    }

    #[test]
    fn up_instances_become_endpoints_of_each_vip_they_list() {
        let reg = Registry {
            instances: vec![
                inst("a", "10.0.0.2", Status::Up, &["hello", "greet"], &["hello"]),
                inst("b", "10.0.0.1", Status::Up, &["hello"], &[]),
            ],
        };
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
        let reg = Registry {
            instances: vec![inst("a", "10.0.0.1", Status::Down, &["hello"], &[])],
        };
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
        let snap = Snapshot::from_registry(&Registry { instances: vec![i] });
        assert!(snap.get("hello.vip").unwrap().endpoints.is_empty());
    }

    #[tokio::test]
    async fn follow_publishes_a_snapshot_for_each_registry_change() {
        let (tx, rx) = watch::channel(Arc::new(Registry::default()));
        let (mut snaps, _task) = follow(rx, Arc::new(Metrics::default()));
        assert!(snaps.borrow_and_update().is_empty());
        let reg = Registry {
            instances: vec![inst("a", "10.0.0.1", Status::Up, &["hello"], &[])],
        };
        tx.send(Arc::new(reg)).unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(5), snaps.changed())
            .await
            .expect("a new snapshot within 5 s")
            .unwrap();
        assert!(snaps.borrow().get("hello.vip").is_some());
    }

    #[test]
    fn changed_since_sees_only_the_clusters_that_changed() {
        let before = Snapshot::from_registry(&Registry {
            instances: vec![
                inst("a", "10.0.0.1", Status::Up, &["one"], &[]),
                inst("b", "10.0.0.2", Status::Up, &["two"], &[]),
            ],
        });
        let after = Snapshot::from_registry(&Registry {
            instances: vec![
                inst("a", "10.0.0.1", Status::Up, &["one"], &[]),
                inst("b", "10.0.0.2", Status::Down, &["two"], &[]),
                inst("c", "10.0.0.3", Status::Up, &["three"], &[]),
            ],
        });
        assert!(!after.changed_since(&before, "one.vip"));
        assert!(after.changed_since(&before, "two.vip"));
        assert!(after.changed_since(&before, "three.vip"));
        assert!(!after.changed_since(&before, "none.vip"));
    }
}
