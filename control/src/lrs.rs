//! Envoy's load reports (LRS): which clusters carried requests, for the prewarm history.
//!
//! A cluster sent ahead (prewarm) is never asked for on demand, so the on-demand requests
//! alone cannot tell whether a proxy still uses it. Envoy's load reporting service can: with
//! `cluster_manager.load_stats_config` in its bootstrap pointing at the control plane, Envoy
//! opens one stream, names its node, and (asked to report every cluster at an interval) sends
//! for each cluster the requests it issued since the last report. Envoy reports only on the
//! clusters it had when the last answer came, so every report is answered. Each cluster that carried
//! requests counts as used by the node's service ([`Prewarm::used`]).
//!
//! [`used_clusters`] is the pure part; [`LoadReports`] the tonic service.

use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::config::endpoint::v3::ClusterStats;
use envoy_types::pb::envoy::service::load_stats::v3::load_reporting_service_server::{
    LoadReportingService, LoadReportingServiceServer,
};
use envoy_types::pb::envoy::service::load_stats::v3::{LoadStatsRequest, LoadStatsResponse};
use odmesh_names::parse_cluster_name;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};
use tracing::debug;

use crate::cache::Cache;
use crate::metrics::Metrics;
use crate::prewarm::Prewarm;
use odmesh_base::logs;
use odmesh_base::metrics::inc;

/// At most so many bytes of a node's `cluster` are kept (as for xDS streams).
const MAX_NODE_FIELD: usize = 256;

/// The odmesh clusters in one report that carried requests (issued, finished or in
/// progress in some locality) and that `registered` knows: what the reporting proxy used.
pub fn used_clusters(stats: &[ClusterStats], registered: impl Fn(&str) -> bool) -> Vec<&str> {
    (stats.iter())
        .filter(|c| {
            c.upstream_locality_stats.iter().any(|l| {
                // Any of them non-zero (a sum could overflow on a hostile report).
                [
                    l.total_issued_requests,
                    l.total_successful_requests,
                    l.total_error_requests,
                    l.total_requests_in_progress,
                ]
                .iter()
                .any(|n| *n > 0)
            })
        })
        .map(|c| c.cluster_name.as_str())
        .filter(|name| parse_cluster_name(name).is_ok() && registered(name))
        .collect()
}

/// The load reporting service: records each report into the prewarm history.
#[derive(Clone, Debug)]
pub struct LoadReports {
    prewarm: Arc<Prewarm>,
    cache: Arc<Cache>,
    metrics: Arc<Metrics>,
    /// How often Envoy is asked to report.
    interval: Duration,
    /// `true` on shutdown: every stream ends.
    closing: watch::Receiver<bool>,
}

impl LoadReports {
    /// A service recording into `prewarm`, asking for reports every `interval`.
    pub fn new(
        prewarm: Arc<Prewarm>,
        cache: Arc<Cache>,
        metrics: Arc<Metrics>,
        interval: Duration,
        closing: watch::Receiver<bool>,
    ) -> LoadReports {
        LoadReports {
            prewarm,
            cache,
            metrics,
            interval,
            closing,
        }
    }

    /// The gRPC service.
    pub fn into_service(self) -> LoadReportingServiceServer<LoadReports> {
        LoadReportingServiceServer::new(self)
    }

    async fn run(
        self,
        mut inbound: Streaming<LoadStatsRequest>,
        tx: mpsc::Sender<Result<LoadStatsResponse, Status>>,
    ) {
        let mut closing = self.closing.clone();
        let mut service: Option<String> = None;
        let mut node_id = String::new();
        loop {
            let req = tokio::select! {
                msg = inbound.message() => match msg {
                    Ok(Some(req)) => req,
                    Ok(None) | Err(_) => break,
                },
                _ = closing.changed() => break,
            };
            inc(&self.metrics.load_reports_total);
            if service.is_none() {
                // The first message names the node.
                let node = req.node.as_ref();
                let cluster = node.map(|n| n.cluster.as_str()).unwrap_or("");
                service = Some(logs::truncated(cluster, MAX_NODE_FIELD));
                node_id =
                    logs::truncated(node.map(|n| n.id.as_str()).unwrap_or(""), MAX_NODE_FIELD);
            }
            let service = service.as_deref().unwrap_or("");
            let snapshot = self.cache.snapshot();
            let used = used_clusters(&req.cluster_stats, |name| snapshot.get(name).is_some());
            debug!(service, used = used.len(), "load report");
            self.prewarm.report(&node_id, service, &used, self.interval);
            // Every message is answered: Envoy reports on the clusters it had when the last
            // answer came (with `send_all_clusters`), so each answer takes in the clusters it
            // got since (on demand, or sent ahead after its reports began), and starts the
            // next interval. The stats of a cluster already reported on carry over.
            let answer = LoadStatsResponse {
                send_all_clusters: true,
                load_reporting_interval: Some(crate::xds::duration(self.interval)),
                ..Default::default()
            };
            if tx.send(Ok(answer)).await.is_err() {
                break;
            }
        }
        // Until this proxy reports again for a whole timeout, none of its clusters is idle.
        if service.is_some() {
            self.prewarm.reports_ended(&node_id);
        }
    }
}

#[tonic::async_trait]
impl LoadReportingService for LoadReports {
    type StreamLoadStatsStream = ReceiverStream<Result<LoadStatsResponse, Status>>;

    async fn stream_load_stats(
        &self,
        request: Request<Streaming<LoadStatsRequest>>,
    ) -> Result<Response<Self::StreamLoadStatsStream>, Status> {
        let (tx, rx) = mpsc::channel(1);
        tokio::spawn(self.clone().run(request.into_inner(), tx));
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::config::endpoint::v3::UpstreamLocalityStats;

    use super::*;

    fn stats(name: &str, issued: u64, in_progress: u64) -> ClusterStats {
        ClusterStats {
            cluster_name: name.into(),
            upstream_locality_stats: vec![UpstreamLocalityStats {
                total_issued_requests: issued,
                total_requests_in_progress: in_progress,
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn a_report_names_the_registered_odmesh_clusters_that_carried_requests() {
        let report = [
            stats("hello.vip", 3, 0),
            stats("idle.vip", 0, 0),
            stats("stream.svip", 0, 1),
            stats("odmesh_xds", 10, 0),
            stats("gone.vip", 2, 0),
            ClusterStats {
                cluster_name: "no-locality.vip".into(),
                ..Default::default()
            },
        ];
        assert_eq!(
            used_clusters(&report, |name| name != "gone.vip"),
            ["hello.vip", "stream.svip"]
        );
    }
}
