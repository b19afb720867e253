//! Process-wide counters and gauges, rendered as Prometheus text for the admin `/metrics`.
//!
//! Plain atomics: every layer bumps the ones it owns; only the admin endpoint reads them all.
//! [`Metrics`] are the control plane's own; the registry source counts in those of its crate,
//! and [`AllMetrics`] holds every part.

use std::sync::Arc;

use odmesh_registry::RegistryMetrics;

odmesh_base::metrics! {
    /// The metrics the control plane itself keeps. `counter`s only go up; `gauge`s are set.
    pub struct Metrics {
        /// Policy file loads that succeeded (`--policy`).
        policy_loads_total: "counter",
        /// Policy file loads that failed (the last good policy stayed in use).
        policy_load_errors_total: "counter",
        /// Eureka source: fetches (full or delta) that a Eureka server answered with a usable document.
        eureka_fetches_total: "counter",
        /// Eureka source: full registry fetches (the first, and after a mismatch, bad delta or outage).
        eureka_full_fetches_total: "counter",
        /// Eureka source: fetch rounds that failed on every configured server (the last good registry stayed).
        eureka_fetch_errors_total: "counter",
        /// Eureka source: deltas whose result did not match the server's `apps__hashcode`.
        eureka_hash_mismatches_total: "counter",
        /// Eureka source: switches to another configured server after a failure.
        eureka_failovers_total: "counter",
        /// Embedded Eureka registry: registrations accepted.
        eureka_registrations_total: "counter",
        /// Embedded Eureka registry: heartbeats that renewed a lease.
        eureka_renewals_total: "counter",
        /// Embedded Eureka registry: heartbeats for an unknown instance (answered 404).
        eureka_renewals_not_found_total: "counter",
        /// Embedded Eureka registry: cancellations.
        eureka_cancels_total: "counter",
        /// Embedded Eureka registry: instances evicted after their lease expired.
        eureka_evictions_total: "counter",
        /// Embedded Eureka registry: status overrides set or removed.
        eureka_status_updates_total: "counter",
        /// Embedded Eureka registry: writes refused as invalid (400: names, address, lease,
        /// metadata, not a registration).
        eureka_refused_invalid_total: "counter",
        /// Embedded Eureka registry: requests without valid credentials (401), with --eureka-auth.
        eureka_refused_unauthenticated_total: "counter",
        /// Embedded Eureka registry: writes an identity may not make (403): another's instance,
        /// a VIP not granted to it.
        eureka_refused_forbidden_total: "counter",
        /// Embedded Eureka registry: bodies refused: too large (413), too slow (408), not JSON (415).
        eureka_refused_body_total: "counter",
        /// Embedded Eureka registry: registrations refused because --eureka-max-instances were
        /// registered (503).
        eureka_refused_full_total: "counter",
        /// Embedded Eureka registry: registrations of an instance cancelled while overridden
        /// (drained) that got its override back.
        eureka_overrides_restored_total: "counter",
        /// Embedded Eureka registry: 1 while self-preservation holds lease eviction.
        eureka_self_preservation: "gauge",
        /// Embedded Eureka registry: expired leases the last eviction round kept, held by
        /// self-preservation or by the per-round eviction bound.
        eureka_evictions_held: "gauge",
        /// Embedded Eureka registry: eviction rounds that ran late, whose delay was added to
        /// every lease.
        eureka_late_eviction_rounds_total: "counter",
        /// Embedded Eureka registry: connections closed on arrival because
        /// --eureka-max-connections were open.
        eureka_http_connections_refused_total: "counter",
        /// Embedded Eureka registry: connections closed because their client did not send a
        /// request's headers within --eureka-header-timeout (or sat idle that long), or read
        /// nothing of an answer for --eureka-write-timeout.
        eureka_http_timeouts_total: "counter",
        /// Embedded Eureka registry: TLS handshakes that failed or timed out.
        eureka_http_tls_failures_total: "counter",
        /// Admin connections closed on arrival because 1,024 were open.
        admin_connections_refused_total: "counter",
        /// xDS streams open now.
        xds_streams_active: "gauge",
        /// xDS streams opened since start.
        xds_streams_total: "counter",
        /// Delta discovery requests received.
        xds_requests_total: "counter",
        /// Delta discovery responses sent.
        xds_responses_total: "counter",
        /// Resources sent in responses (updates, not removals).
        xds_resources_sent_total: "counter",
        /// Responses Envoy accepted (ACK).
        xds_acks_total: "counter",
        /// Responses Envoy rejected (NACK); each is logged with Envoy's error.
        xds_nacks_total: "counter",
        /// Cluster subscriptions held by connected proxies now.
        xds_cluster_subscriptions: "gauge",
        /// Subscribed names now, over all streams and both types (bounded by
        /// --xds-max-subscriptions).
        xds_subscriptions: "gauge",
        /// Cluster names that had to wait for room under --xds-max-subscriptions (answered with
        /// a removal, pushed once there was room).
        xds_names_waiting_total: "counter",
        /// xDS connections closed on arrival because --xds-max-connections were open.
        xds_connections_refused_total: "counter",
        /// Names answered with a removal because a stream was over --xds-max-names or
        /// --xds-max-unregistered.
        xds_names_refused_total: "counter",
        /// Clusters sent to connecting proxies from their service's history, before any request.
        prewarm_pushed_total: "counter",
        /// Clusters asked for on demand that a proxy needed and was not sent ahead (misses).
        prewarm_asked_total: "counter",
        /// Clusters sent ahead that were removed from a proxy again, unused for
        /// --idle-cluster-timeout (it asks for them by name when a request needs them).
        idle_clusters_evicted_total: "counter",
        /// Load reports (LRS) received from proxies: each tells which clusters carried requests.
        load_reports_total: "counter",
        /// Writes of the prewarm history file that failed (the history stays in memory).
        prewarm_save_errors_total: "counter",
        /// (calling service, cluster) entries in the prewarm history.
        prewarm_history_entries: "gauge",
    }
}

/// Every metric of the process, each part kept by the crate that counts it.
#[derive(Debug, Default)]
pub struct AllMetrics {
    /// The control plane's own.
    pub control: Arc<Metrics>,
    /// The registry's (`registry_*`), kept by the source and the snapshot pipeline.
    pub registry: Arc<RegistryMetrics>,
}

impl AllMetrics {
    /// The Prometheus text of every metric: the control plane's, then the registry's.
    pub fn render(&self) -> String {
        let mut out = self.control.render();
        out.push_str(&self.registry.render());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use odmesh_base::metrics::{inc, set};

    #[test]
    fn render_writes_help_type_and_value_for_each_metric() {
        let m = AllMetrics::default();
        inc(&m.control.xds_nacks_total);
        inc(&m.control.xds_nacks_total);
        set(&m.registry.registry_clusters, 7);
        let text = m.render();
        assert!(text.contains("# TYPE odmesh_xds_nacks_total counter\nodmesh_xds_nacks_total 2\n"));
        assert!(text.contains("# HELP odmesh_registry_clusters Clusters (VIPs and SVIPs)"));
        assert!(text.contains("odmesh_registry_clusters 7\n"));
    }

    #[test]
    fn every_metric_is_rendered_once() {
        let text = AllMetrics::default().render();
        let names: Vec<&str> = (text.lines())
            .filter_map(|line| line.strip_prefix("# TYPE "))
            .filter_map(|rest| rest.split(' ').next())
            .collect();
        let unique: std::collections::HashSet<&str> = names.iter().copied().collect();
        assert_eq!(unique.len(), names.len(), "a metric twice: {names:?}");
    }
}
