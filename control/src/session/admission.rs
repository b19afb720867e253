//! Admission: what a subscription costs outside its stream. Every name a session starts or
//! stops subscribing goes through [`Context::count_in`] and [`Context::count_out`], which
//! watch or unwatch it in the cache, keep the gauges, and take from or give back to the bound
//! over all streams ([`Admission`]).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

use super::Context;
use crate::cache::StreamId;
use crate::xds::{ResourceName, ResourceType};

/// The bounds on what all streams subscribe together, each over all streams and over the
/// streams of one source address:
/// - cluster names counted (`--xds-max-subscriptions`, `--xds-max-subscriptions-per-source`):
///   what the cache builds and keeps for them. Each cluster brings its load assignment, which
///   takes no room of its own. New names beyond wait for room.
/// - every name a stream tracks, of either type and however it stands (counted, refused,
///   waiting: `--xds-max-names-total`, `--xds-max-names-per-source`): what the streams' own
///   entries cost. New names beyond are answered with a removal and not tracked, as names
///   over a stream's `--xds-max-names` are.
///
/// The share per source keeps one client (one host, however many connections and node ids
/// it opens) from taking the room every other proxy's new VIPs need. A stream whose address
/// is not known (in-process tests) counts under the whole bounds only.
#[derive(Debug)]
pub struct Admission {
    clusters: Budget,
    names: Budget,
}

/// One bound over all streams, with a share per source address, and what is used of both.
#[derive(Debug)]
struct Budget {
    max: usize,
    per_source: usize,
    used: AtomicUsize,
    /// What each source address uses; a source using nothing has no entry.
    sources: Mutex<BTreeMap<IpAddr, usize>>,
}

impl Budget {
    const fn new(max: usize, per_source: usize) -> Budget {
        Budget {
            max,
            per_source,
            used: AtomicUsize::new(0),
            sources: Mutex::new(BTreeMap::new()),
        }
    }

    fn room(&self) -> usize {
        self.max.saturating_sub(self.used.load(Ordering::Relaxed))
    }

    fn share_left(&self, source: Option<IpAddr>) -> usize {
        match source {
            Some(ip) if self.per_source != usize::MAX => {
                self.per_source.saturating_sub(self.used_by(ip))
            }
            _ => usize::MAX,
        }
    }

    fn used_by(&self, source: IpAddr) -> usize {
        self.sources().get(&source).copied().unwrap_or(0)
    }

    fn sources(&self) -> std::sync::MutexGuard<'_, BTreeMap<IpAddr, usize>> {
        // Every critical section leaves the map consistent.
        self.sources.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn take(&self, source: Option<IpAddr>, n: usize) {
        self.used.fetch_add(n, Ordering::Relaxed);
        if let (Some(ip), true) = (source, n > 0) {
            *self.sources().entry(ip).or_default() += n;
        }
    }

    fn give_back(&self, source: Option<IpAddr>, n: usize) {
        self.used.fetch_sub(n, Ordering::Relaxed);
        if let (Some(ip), true) = (source, n > 0) {
            let mut sources = self.sources();
            if let Some(used) = sources.get_mut(&ip) {
                *used = used.saturating_sub(n);
                if *used == 0 {
                    sources.remove(&ip);
                }
            }
        }
    }
}

impl Admission {
    /// A bound of `max` cluster names, with no share per source and no bound on the names
    /// tracked, none counted yet.
    pub const fn new(max: usize) -> Admission {
        Admission::with_share(max, usize::MAX)
    }

    /// A bound of `max` cluster names, of which one source address may take `per_source`;
    /// no bound on the names tracked.
    pub const fn with_share(max: usize, per_source: usize) -> Admission {
        Admission {
            clusters: Budget::new(max, per_source),
            names: Budget::new(usize::MAX, usize::MAX),
        }
    }

    /// The same, with at most `max` names tracked over all streams, `per_source` of them by
    /// the streams of one source address.
    pub fn tracking(self, max: usize, per_source: usize) -> Admission {
        Admission {
            names: Budget::new(max, per_source),
            ..self
        }
    }

    /// The bound on cluster names.
    pub fn max(&self) -> usize {
        self.clusters.max
    }

    /// How many more cluster names fit under the bound now.
    pub fn room(&self) -> usize {
        self.clusters.room()
    }

    /// How many more cluster names a stream from `source` may take now: the room under the
    /// bound, within what is left of the source's share.
    pub fn room_for(&self, source: Option<IpAddr>) -> usize {
        self.room().min(self.share_left(source))
    }

    /// What is left of `source`'s share of cluster names (unlimited for an unknown source).
    pub fn share_left(&self, source: Option<IpAddr>) -> usize {
        self.clusters.share_left(source)
    }

    /// How many cluster names `source`'s streams count now.
    pub fn used_by(&self, source: IpAddr) -> usize {
        self.clusters.used_by(source)
    }

    /// How many more names a stream from `source` may track now, over all streams and within
    /// its source's share.
    pub fn names_room_for(&self, source: Option<IpAddr>) -> usize {
        self.names.room().min(self.names.share_left(source))
    }

    /// How many names all streams track now, and `source`'s streams.
    pub fn names_tracked(&self, source: Option<IpAddr>) -> (usize, usize) {
        let total = self.names.used.load(Ordering::Relaxed);
        (total, source.map_or(0, |ip| self.names.used_by(ip)))
    }

    /// A stream from `source` went from tracking `was` names to `now`.
    pub(super) fn track(&self, source: Option<IpAddr>, was: usize, now: usize) {
        match now.cmp(&was) {
            std::cmp::Ordering::Greater => self.names.take(source, now - was),
            std::cmp::Ordering::Less => self.names.give_back(source, was - now),
            std::cmp::Ordering::Equal => {}
        }
    }

    fn take(&self, source: Option<IpAddr>, n: usize) {
        self.clusters.take(source, n);
    }

    fn give_back(&self, source: Option<IpAddr>, n: usize) {
        self.clusters.give_back(source, n);
    }
}

impl Context<'_> {
    /// Counts `names` of type `ty`, newly subscribed by stream `stream` (from `source`) of a
    /// proxy of `caller`: watched in the cache (which builds what nobody had), in the gauges
    /// and, for clusters, under the bounds.
    pub(super) fn count_in(
        &self,
        (stream, source): (StreamId, Option<IpAddr>),
        caller: &str,
        ty: ResourceType,
        names: &[ResourceName],
    ) {
        if names.is_empty() {
            return;
        }
        self.count(ty, names.len(), AtomicU64::fetch_add);
        if ty == ResourceType::Cluster {
            self.admission.take(source, names.len());
        }
        self.cache.watch(stream, caller, names);
    }

    /// Gives back `names` of type `ty` that stream `stream` (from `source`) no longer
    /// subscribes.
    pub(super) fn count_out(
        &self,
        (stream, source): (StreamId, Option<IpAddr>),
        ty: ResourceType,
        names: &[ResourceName],
    ) {
        self.forget(source, ty, names.len());
        self.cache
            .unwatch(stream, names.iter().map(ResourceName::as_str));
    }

    /// Gives back `n` names of type `ty` of a stream from `source` whose watches the cache
    /// dropped already (a stream that closed).
    pub(super) fn forget(&self, source: Option<IpAddr>, ty: ResourceType, n: usize) {
        self.count(ty, n, AtomicU64::fetch_sub);
        if ty == ResourceType::Cluster {
            self.admission.give_back(source, n);
        }
    }

    /// Adds or takes `n` from the gauges of type `ty`.
    fn count(&self, ty: ResourceType, n: usize, op: fn(&AtomicU64, u64, Ordering) -> u64) {
        op(&self.metrics.xds_subscriptions, n as u64, Ordering::Relaxed);
        if ty == ResourceType::Cluster {
            op(
                &self.metrics.xds_cluster_subscriptions,
                n as u64,
                Ordering::Relaxed,
            );
        }
    }
}
