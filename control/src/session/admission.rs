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

/// The bounds on cluster names subscribed over all streams (`--xds-max-subscriptions`) and
/// over the streams of one source address (`--xds-max-subscriptions-per-source`), and how
/// many are counted under them now. Each cluster brings its load assignment, which takes no
/// room of its own.
///
/// The share per source keeps one client (one host, however many connections and node ids
/// it opens) from taking the room every other proxy's new VIPs need: names over its share
/// wait, as names over the whole bound do. A stream whose address is not known (in-process
/// tests) counts under the whole bound only.
#[derive(Debug)]
pub struct Admission {
    max: usize,
    per_source: usize,
    used: AtomicUsize,
    /// Names counted per source address; a source with none has no entry.
    sources: Mutex<BTreeMap<IpAddr, usize>>,
}

impl Admission {
    /// A bound of `max` cluster names, with no share per source, none counted yet.
    pub const fn new(max: usize) -> Admission {
        Admission::with_share(max, usize::MAX)
    }

    /// A bound of `max` cluster names, of which one source address may take `per_source`.
    pub const fn with_share(max: usize, per_source: usize) -> Admission {
        Admission {
            max,
            per_source,
            used: AtomicUsize::new(0),
            sources: Mutex::new(BTreeMap::new()),
        }
    }

    /// The bound.
    pub fn max(&self) -> usize {
        self.max
    }

    /// How many more cluster names fit under the bound now.
    pub fn room(&self) -> usize {
        self.max.saturating_sub(self.used.load(Ordering::Relaxed))
    }

    /// How many more cluster names a stream from `source` may take now: the room under the
    /// bound, within what is left of the source's share.
    pub fn room_for(&self, source: Option<IpAddr>) -> usize {
        self.room().min(self.share_left(source))
    }

    /// What is left of `source`'s share (unlimited for an unknown source).
    pub fn share_left(&self, source: Option<IpAddr>) -> usize {
        match source {
            Some(ip) if self.per_source != usize::MAX => {
                let used = self.sources().get(&ip).copied().unwrap_or(0);
                self.per_source.saturating_sub(used)
            }
            _ => usize::MAX,
        }
    }

    /// How many names `source`'s streams count now.
    pub fn used_by(&self, source: IpAddr) -> usize {
        self.sources().get(&source).copied().unwrap_or(0)
    }

    fn sources(&self) -> std::sync::MutexGuard<'_, BTreeMap<IpAddr, usize>> {
        // Every critical section leaves the map consistent.
        self.sources.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn take(&self, source: Option<IpAddr>, n: usize) {
        self.used.fetch_add(n, Ordering::Relaxed);
        if let Some(ip) = source {
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
