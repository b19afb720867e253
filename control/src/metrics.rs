//! Process-wide counters, gauges and histograms, rendered for the admin `/metrics` in
//! OpenMetrics or Prometheus text (docs/production.md, "Metrics").
//!
//! Every layer bumps the ones it owns; only the admin endpoint reads them all.
//! [`Metrics`] are the control plane's own; the registry source counts in those of its crates
//! (`odmesh-registry`, `odmesh-eureka`), and [`AllMetrics`] holds every part.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use odmesh_base::metrics::prometheus_client::collector::Collector;
use odmesh_base::metrics::{Exposition, Format, inc};
use odmesh_eureka::{ClientMetrics, ServerMetrics};
use odmesh_registry::RegistryMetrics;

odmesh_base::metrics! {
    /// The metrics the control plane itself keeps. `counter`s only go up; `gauge`s are set.
    pub struct Metrics {
        /// Policy file loads that succeeded (`--policy`).
        policy_loads_total: "counter",
        /// Policy file loads that failed (the last good policy stayed in use).
        policy_load_errors_total: "counter",
        /// 1 while a policy file that lost most of its entries at once (an emptied or
        /// truncated file) is held: the policy in use stays until the file says so for
        /// --registry-drop-confirm.
        policy_drop_held: "gauge",
        /// Policy files held because they lost most of the entries in use at once.
        policy_drops_held_total: "counter",
        /// Entries of the policy in use (a VIP's, or a caller's in it) with `hedge: true`.
        policy_hedge_entries: "gauge",
        /// Entries of the policy in use with a fault that applies now (a chaos experiment
        /// running; an entry whose `until` has passed is not counted).
        policy_fault_entries: "gauge",
        /// Entries of the policy in use with a `concurrency_limit`.
        policy_concurrency_limit_entries: "gauge",
        /// Admin connections closed on arrival because 1,024 were open.
        admin_connections_refused_total: "counter",
        /// Route (RDS) streams open now.
        rds_streams_active: "gauge",
        /// Routes sent (RDS responses): at a proxy's start, and when its route-level policy
        /// (timeouts, hedging, faults) changes or a fault entry ends.
        rds_responses_total: "counter",
        /// Routes sent without part of their policy, which they could not carry (logged,
        /// with what and why).
        rds_policy_dropped_total: "counter",
        /// Routes Envoy rejected (NACK); each is logged with Envoy's error.
        rds_nacks_total: "counter",
        /// Inbound-limiter configuration (ECDS) streams open now.
        ecds_streams_active: "gauge",
        /// Inbound-limiter configurations sent: at a proxy's start, and when its service's
        /// entry in the policy file's `services:` changes.
        ecds_responses_total: "counter",
        /// Inbound-limiter configurations Envoy rejected (NACK), each logged.
        ecds_nacks_total: "counter",
        /// Route streams answered with nothing because the proxy's node metadata `odmesh`
        /// is invalid (logged, with what is wrong).
        rds_invalid_nodes_total: "counter",
        /// xDS streams open now.
        xds_streams_active: "gauge",
        /// xDS streams opened since start.
        xds_streams_total: "counter",
        /// Delta discovery requests received.
        xds_requests_total: "counter",
        /// Delta discovery responses sent, by resource type: `cluster`, `endpoints`, or
        /// `lb_endpoint` (a large VIP's endpoints one by one).
        xds_cluster_responses_total: "counter" in xds_responses_total { type = "cluster" },
        /// (the same family)
        xds_endpoints_responses_total: "counter" in xds_responses_total { type = "endpoints" },
        /// (the same family)
        xds_lb_endpoint_responses_total: "counter" in xds_responses_total { type = "lb_endpoint" },
        /// Resources sent in responses (updates, not removals), by resource type.
        xds_cluster_resources_sent_total: "counter" in xds_resources_sent_total { type = "cluster" },
        /// (the same family)
        xds_endpoints_resources_sent_total: "counter" in xds_resources_sent_total { type = "endpoints" },
        /// (the same family)
        xds_lb_endpoint_resources_sent_total: "counter" in xds_resources_sent_total { type = "lb_endpoint" },
        /// Responses Envoy accepted (ACK), by resource type.
        xds_cluster_acks_total: "counter" in xds_acks_total { type = "cluster" },
        /// (the same family)
        xds_endpoints_acks_total: "counter" in xds_acks_total { type = "endpoints" },
        /// (the same family)
        xds_lb_endpoint_acks_total: "counter" in xds_acks_total { type = "lb_endpoint" },
        /// Responses Envoy rejected (NACK), by resource type; each is logged with Envoy's error.
        xds_cluster_nacks_total: "counter" in xds_nacks_total { type = "cluster" },
        /// (the same family)
        xds_endpoints_nacks_total: "counter" in xds_nacks_total { type = "endpoints" },
        /// (the same family)
        xds_lb_endpoint_nacks_total: "counter" in xds_nacks_total { type = "lb_endpoint" },
        /// Cluster subscriptions held by connected proxies now.
        xds_cluster_subscriptions: "gauge",
        /// Subscribed names now, over all streams and both types (bounded by
        /// --xds-max-subscriptions).
        xds_subscriptions: "gauge",
        /// Cluster names that had to wait for room under --xds-max-subscriptions (answered with
        /// a removal, pushed once there was room).
        xds_names_waiting_total: "counter",
        /// Of those, names that waited because their stream's source address had taken its
        /// share (--xds-max-subscriptions-per-source) while there was room over all streams.
        xds_names_waiting_for_source_total: "counter",
        /// Requests, changes and stream closes handled in the heavy lane, apart from the async
        /// workers, because they touched many names (a reconnecting proxy's, a flood's).
        xds_heavy_jobs_total: "counter",
        /// xDS connections closed on arrival because --xds-max-connections were open.
        xds_connections_refused_total: "counter",
        /// xDS connections closed on arrival because their address had
        /// --xds-max-connections-per-source open.
        xds_connections_refused_source_total: "counter",
        /// xDS connections closed because they sent nothing within --xds-first-bytes-timeout.
        xds_connections_silent_total: "counter",
        /// xDS connections closed because they opened no stream within
        /// --xds-first-request-timeout.
        xds_connections_idle_total: "counter",
        /// xDS TLS handshakes that failed or took longer than --tls-handshake-timeout (a
        /// proxy without a certificate of --xds-client-ca, a plaintext client, say).
        xds_tls_failures_total: "counter",
        /// The xDS certificate, key and client CA (--xds-tls-cert, --xds-tls-key,
        /// --xds-client-ca) read again and put in force for new connections (they changed,
        /// or SIGHUP).
        xds_tls_reloads_total: "counter",
        /// New xDS certificates, keys or client CAs refused (unreadable, not a matching pair,
        /// no usable CA): those in force stayed.
        xds_tls_reloads_refused_total: "counter",
        /// Names answered with a removal because a stream was over --xds-max-names or
        /// --xds-max-unregistered, or the names tracked over all streams or by its source's
        /// over theirs (--xds-max-names-total, --xds-max-names-per-source).
        xds_names_refused_total: "counter",
        /// Of those, names answered with a removal and not tracked because the streams tracked
        /// --xds-max-names-total names, or their source's streams --xds-max-names-per-source.
        xds_names_untracked_total: "counter",
        /// Names listed with kept versions after a stream's first request of their type:
        /// ignored (only the first request of a type may list them).
        xds_late_versions_ignored_total: "counter",
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
        /// Prewarm history entries refused, or forgotten for a later use of their own service,
        /// because the history held --prewarm-max-entries (or 10,000 services); and load reports
        /// not kept because the proxies' reports held as many clusters: clients claiming many
        /// services or node ids, or a bound to raise.
        prewarm_entries_refused_total: "counter",
    }
    histograms {
        /// Requests that subscribed clusters by name, and nothing else (Envoy's on-demand
        /// discovery: a first request to a VIP pauses in Envoy meanwhile): from the request's
        /// arrival to its answer (the clusters and their load assignments, or a removal for a
        /// name refused) handed to the stream. A reconnect's first request is not counted,
        /// nor an answer put off until there is room under --xds-max-subscriptions or the
        /// registry has loaded.
        xds_on_demand_answer_seconds: (0.0001, 2.0, 16),
        /// A registry or policy change, from the cache taking it to each subscribed stream's
        /// response handed to the stream (one observation per stream and change).
        xds_push_lag_seconds: (0.0001, 2.0, 16),
        /// A registry change, from the registry source publishing it (a Eureka fetch answered,
        /// the registry file read, a batch of the embedded registry's writes) to each proxy's
        /// ACK of the response carrying it.
        registry_change_to_proxy_seconds: (0.0005, 2.0, 16),
    }
}

impl Metrics {
    /// Counts a response of resource type `ty` (`cluster`, `endpoints` or `lb_endpoint`)
    /// carrying `resources` resources.
    pub fn sent(&self, ty: &str, resources: usize) {
        let (responses, sent) = match ty {
            "endpoints" => (
                &self.xds_endpoints_responses_total,
                &self.xds_endpoints_resources_sent_total,
            ),
            "lb_endpoint" => (
                &self.xds_lb_endpoint_responses_total,
                &self.xds_lb_endpoint_resources_sent_total,
            ),
            _ => (
                &self.xds_cluster_responses_total,
                &self.xds_cluster_resources_sent_total,
            ),
        };
        inc(responses);
        sent.fetch_add(resources as u64, Ordering::Relaxed);
    }

    /// Counts an ACK (`accepted`) or a NACK of a response of resource type `ty`.
    pub fn answered(&self, ty: &str, accepted: bool) {
        let (acks, nacks) = match ty {
            "endpoints" => (
                &self.xds_endpoints_acks_total,
                &self.xds_endpoints_nacks_total,
            ),
            "lb_endpoint" => (
                &self.xds_lb_endpoint_acks_total,
                &self.xds_lb_endpoint_nacks_total,
            ),
            _ => (&self.xds_cluster_acks_total, &self.xds_cluster_nacks_total),
        };
        inc(if accepted { acks } else { nacks });
    }

    /// NACKs of every resource type.
    pub fn nacks(&self) -> u64 {
        [
            &self.xds_cluster_nacks_total,
            &self.xds_endpoints_nacks_total,
            &self.xds_lb_endpoint_nacks_total,
        ]
        .iter()
        .map(|n| n.load(Ordering::Relaxed))
        .sum()
    }
}

/// Every metric of the process, each part kept by the crate that counts it, and the
/// exposition that renders them all.
#[derive(Debug)]
pub struct AllMetrics {
    /// The control plane's own.
    pub control: Arc<Metrics>,
    /// The registry's (`registry_*`), kept by the source and the snapshot pipeline.
    pub registry: Arc<RegistryMetrics>,
    /// The Eureka client source's (`eureka_*`).
    pub eureka_client: Arc<ClientMetrics>,
    /// The embedded Eureka registry's (`eureka_*`).
    pub eureka_server: Arc<ServerMetrics>,
    /// Renders the parts above, `odmesh_build_info`, and what is added later
    /// ([`AllMetrics::add`]).
    exposition: Exposition,
}

impl Default for AllMetrics {
    fn default() -> AllMetrics {
        let m = AllMetrics {
            control: Arc::default(),
            registry: Arc::default(),
            eureka_client: Arc::default(),
            eureka_server: Arc::default(),
            exposition: Exposition::default(),
        };
        m.exposition.add_info(
            "build",
            "The odmesh-control build, by version",
            vec![("version".into(), env!("CARGO_PKG_VERSION").into())],
        );
        m.exposition.add(m.control.clone());
        m.exposition.add(m.registry.clone());
        m.exposition.add(m.eureka_client.clone());
        m.exposition.add(m.eureka_server.clone());
        m
    }
}

impl AllMetrics {
    /// Every metric in `format`: the build, the control plane's, the registry's, Eureka's
    /// (the client's, the embedded registry's), then what was added.
    pub fn render(&self, format: Format) -> String {
        self.exposition.render(format)
    }

    /// Adds metrics a part keeps apart (the embedded registry's per peer, say).
    pub fn add(&self, collector: impl Collector) {
        self.exposition.add(collector);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use odmesh_base::metrics::set;

    #[test]
    fn render_writes_help_type_and_value_for_each_metric() {
        let m = AllMetrics::default();
        m.control.answered("endpoints", false);
        m.control.answered("endpoints", false);
        m.control.answered("cluster", true);
        set(&m.registry.registry_clusters, 7);
        let text = m.render(Format::Prometheus);
        assert!(
            text.contains("# TYPE odmesh_xds_nacks_total counter\n"),
            "{text}"
        );
        assert!(
            text.contains("odmesh_xds_nacks_total{type=\"endpoints\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("odmesh_xds_nacks_total{type=\"cluster\"} 0\n"),
            "{text}"
        );
        assert!(
            text.contains("odmesh_xds_acks_total{type=\"cluster\"} 1\n"),
            "{text}"
        );
        assert!(text.contains("# HELP odmesh_registry_clusters Clusters (VIPs and SVIPs)"));
        assert!(text.contains("odmesh_registry_clusters 7\n"));
        assert!(text.contains("odmesh_build_info{version=\""), "{text}");
        assert_eq!(m.control.nacks(), 2);
    }

    #[test]
    fn every_metric_is_rendered_once() {
        let text = AllMetrics::default().render(Format::Prometheus);
        let names: Vec<&str> = (text.lines())
            .filter_map(|line| line.strip_prefix("# TYPE "))
            .filter_map(|rest| rest.split(' ').next())
            .collect();
        let unique: std::collections::HashSet<&str> = names.iter().copied().collect();
        assert_eq!(unique.len(), names.len(), "a metric twice: {names:?}");
        // What neither text format lets a help text hold unescaped (base::metrics::help).
        for help in text.lines().filter(|line| line.starts_with("# HELP ")) {
            assert!(!help.contains(['"', '\\']), "{help}");
        }
        for histogram in [
            "odmesh_xds_on_demand_answer_seconds",
            "odmesh_xds_push_lag_seconds",
            "odmesh_registry_change_to_proxy_seconds",
            "odmesh_eureka_fetch_seconds",
        ] {
            let declared = format!("# TYPE {histogram} histogram\n");
            assert!(text.contains(&declared), "{histogram} missing: {text}");
        }
    }
}
