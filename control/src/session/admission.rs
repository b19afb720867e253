//! Admission: what a subscription costs outside its stream. Every name a session starts or
//! stops subscribing goes through [`Context::count_in`] and [`Context::count_out`], which
//! watch or unwatch it in the cache, keep the gauges, and take from or give back to the bound
//! over all streams ([`Admission`]).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use super::Context;
use crate::cache::StreamId;
use crate::xds::{ResourceName, ResourceType};

/// The bound on cluster names subscribed over all streams (`--xds-max-subscriptions`), and how
/// many are counted under it now. Each cluster brings its load assignment, which takes no room
/// of its own.
#[derive(Debug)]
pub struct Admission {
    max: usize,
    used: AtomicUsize,
}

impl Admission {
    /// A bound of `max` cluster names, none counted yet.
    pub const fn new(max: usize) -> Admission {
        Admission {
            max,
            used: AtomicUsize::new(0),
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

    fn take(&self, n: usize) {
        self.used.fetch_add(n, Ordering::Relaxed);
    }

    fn give_back(&self, n: usize) {
        self.used.fetch_sub(n, Ordering::Relaxed);
    }
}

impl Context<'_> {
    /// Counts `names` of type `ty`, newly subscribed by stream `stream` of a proxy of
    /// `caller`: watched in the cache (which builds what nobody had), in the gauges and, for
    /// clusters, under the bound.
    pub(super) fn count_in(
        &self,
        stream: StreamId,
        caller: &str,
        ty: ResourceType,
        names: &[ResourceName],
    ) {
        if names.is_empty() {
            return;
        }
        self.count(ty, names.len(), AtomicU64::fetch_add);
        if ty == ResourceType::Cluster {
            self.admission.take(names.len());
        }
        self.cache.watch(stream, caller, names);
    }

    /// Gives back `names` of type `ty` that stream `stream` no longer subscribes.
    pub(super) fn count_out(&self, stream: StreamId, ty: ResourceType, names: &[ResourceName]) {
        self.forget(ty, names.len());
        self.cache
            .unwatch(stream, names.iter().map(ResourceName::as_str));
    }

    /// Gives back `n` names of type `ty` whose watches the cache dropped already (a stream
    /// that closed).
    pub(super) fn forget(&self, ty: ResourceType, n: usize) {
        self.count(ty, n, AtomicU64::fetch_sub);
        if ty == ResourceType::Cluster {
            self.admission.give_back(n);
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
