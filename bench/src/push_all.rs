//! "Push all": the alternative odmesh is measured against. A delta ADS server that sends every
//! cluster of a registry to a proxy that subscribes to clusters by wildcard, and the load
//! assignments it then asks for. Resources come from `odmesh_control::xds`, so each cluster is
//! exactly what odmesh would serve on demand.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::cluster::v3::cluster::{ClusterDiscoveryType, DiscoveryType};
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::google::protobuf::Any;
use odmesh_control::model::Snapshot;
use odmesh_control::xds::{ResourceType, Versioned};
use odmesh_eureka::wire::json::read_registry_file;
use odmesh_registry::file;
use prost::Message;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::xds_dump;

#[derive(Debug)]
struct Resources {
    clusters: Vec<Versioned>,
    endpoints: HashMap<String, Versioned>,
}

#[derive(Clone, Debug)]
struct PushAll {
    resources: Arc<Resources>,
}

fn response(ty: ResourceType, resources: Vec<&Versioned>, nonce: u64) -> DeltaDiscoveryResponse {
    DeltaDiscoveryResponse {
        system_version_info: "1".into(),
        type_url: ty.type_url().into(),
        nonce: nonce.to_string(),
        resources: resources.into_iter().map(|r| r.to_resource()).collect(),
        ..Default::default()
    }
}

impl PushAll {
    async fn stream(
        self,
        mut inbound: Streaming<DeltaDiscoveryRequest>,
        tx: mpsc::Sender<Result<DeltaDiscoveryResponse, Status>>,
    ) {
        let started = Instant::now();
        let mut nonce = 0u64;
        let mut clusters_sent = false;
        let mut endpoints_sent = 0usize;
        while let Ok(Some(req)) = inbound.message().await {
            let Some(ty) = ResourceType::from_type_url(&req.type_url) else {
                continue;
            };
            let out = match ty {
                ResourceType::Cluster => {
                    let wildcard = req.resource_names_subscribe.iter().any(|n| n == "*")
                        || (req.response_nonce.is_empty()
                            && req.resource_names_subscribe.is_empty());
                    if clusters_sent || !wildcard {
                        continue;
                    }
                    clusters_sent = true;
                    eprintln!(
                        "push-all: sending {} clusters at {:.3}s",
                        self.resources.clusters.len(),
                        started.elapsed().as_secs_f64()
                    );
                    self.resources.clusters.iter().collect()
                }
                ResourceType::Endpoints => {
                    let found: Vec<&Versioned> = req
                        .resource_names_subscribe
                        .iter()
                        .filter_map(|n| self.resources.endpoints.get(n))
                        .collect();
                    if found.is_empty() {
                        continue;
                    }
                    endpoints_sent += found.len();
                    eprintln!(
                        "push-all: sending {} load assignments ({endpoints_sent} so far) at {:.3}s",
                        found.len(),
                        started.elapsed().as_secs_f64()
                    );
                    found
                }
            };
            nonce += 1;
            if tx.send(Ok(response(ty, out, nonce))).await.is_err() {
                return;
            }
        }
    }
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for PushAll {
    type StreamAggregatedResourcesStream = tokio_stream::Empty<Result<DiscoveryResponse, Status>>;
    type DeltaAggregatedResourcesStream = ReceiverStream<Result<DeltaDiscoveryResponse, Status>>;

    async fn stream_aggregated_resources(
        &self,
        _: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        Err(Status::unimplemented("delta only"))
    }

    async fn delta_aggregated_resources(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        let (tx, rx) = mpsc::channel(16);
        tokio::spawn(self.clone().stream(request.into_inner(), tx));
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// How the clusters are changed from what odmesh serves, to measure what an option costs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Variant {
    /// As odmesh serves them.
    Odmesh,
    /// `STATIC`, with the load assignment inside the cluster: no EDS subscription.
    Inline,
    /// Without outlier detection.
    NoOutlier,
    /// Without circuit breakers (Envoy's defaults apply).
    NoBreakers,
    /// `inline`, `no-outlier` and `no-breakers`, and no protocol options or metadata.
    Bare,
}

impl Variant {
    /// `cluster` changed as the variant says; `endpoints` is its load assignment.
    fn apply(self, cluster: &Versioned, endpoints: &Versioned) -> anyhow::Result<Versioned> {
        if self == Variant::Odmesh {
            return Ok(cluster.clone());
        }
        let mut c = Cluster::decode(cluster.resource.value.as_slice())?;
        let inline = matches!(self, Variant::Inline | Variant::Bare);
        if inline {
            let cla = ClusterLoadAssignment::decode(endpoints.resource.value.as_slice())?;
            c.cluster_discovery_type =
                Some(ClusterDiscoveryType::Type(DiscoveryType::Static as i32));
            c.eds_cluster_config = None;
            c.load_assignment = Some(cla);
        }
        if matches!(self, Variant::NoOutlier | Variant::Bare) {
            c.outlier_detection = None;
        }
        if matches!(self, Variant::NoBreakers | Variant::Bare) {
            c.circuit_breakers = None;
        }
        if self == Variant::Bare {
            c.typed_extension_protocol_options.clear();
            c.metadata = None;
        }
        Ok(Versioned {
            resource: Any {
                type_url: cluster.resource.type_url.clone(),
                value: c.encode_to_vec(),
            },
            ..cluster.clone()
        })
    }
}

/// `push-all`: builds every resource up front, then serves until killed.
pub async fn serve(registry: &Path, listen: SocketAddr, variant: Variant) -> anyhow::Result<()> {
    let parsed = file::load(registry, read_registry_file)
        .with_context(|| format!("{}", registry.display()))?;
    let snapshot = Snapshot::from_registry(&parsed.registry);
    let mut clusters = Vec::with_capacity(snapshot.len());
    let mut endpoints = HashMap::with_capacity(snapshot.len());
    for built in xds_dump::build_all(&snapshot)? {
        clusters.push(variant.apply(&built.cluster, &built.endpoints)?);
        endpoints.insert(built.cluster.name.clone(), built.endpoints);
    }
    eprintln!("push-all: {} clusters ready on {listen}", clusters.len());
    let svc = PushAll {
        resources: Arc::new(Resources {
            clusters,
            endpoints,
        }),
    };
    tonic::transport::Server::builder()
        .add_service(AggregatedDiscoveryServiceServer::new(svc))
        .serve(listen)
        .await?;
    Ok(())
}
