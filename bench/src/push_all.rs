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
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use odmesh_control::model::Snapshot;
use odmesh_control::registry::file;
use odmesh_control::xds::{self, ResourceType, Versioned, XdsOptions};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

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

/// `push-all`: builds every resource up front, then serves until killed.
pub async fn serve(registry: &Path, listen: SocketAddr) -> anyhow::Result<()> {
    let parsed = file::load(registry).with_context(|| format!("{}", registry.display()))?;
    let snapshot = Snapshot::from_registry(&parsed.registry);
    let opts = XdsOptions::default();
    let mut clusters = Vec::with_capacity(snapshot.len());
    let mut endpoints = HashMap::with_capacity(snapshot.len());
    for (name, info) in snapshot.iter() {
        let built = xds::build(name, xds::Lookup::Registered(info), &opts)
            .map_err(|e| anyhow::anyhow!("{name}: {e:?}"))?;
        clusters.push(built.cluster);
        endpoints.insert(name.to_owned(), built.endpoints);
    }
    clusters.sort_by(|a, b| a.name.cmp(&b.name));
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
