//! Probe: does stock Envoy take a cluster's endpoints one by one (LEDS) over delta ADS, and
//! what does one endpoint's change then cost on the wire?
//!
//! `odmesh-bench leds-probe --envoy PATH --instances N` runs, in this process, N + 1 tiny HTTP
//! upstreams on loopback and a delta ADS server; and one Envoy whose static cluster `big.vip`
//! takes its load assignment over ADS. The load assignment names, for its one locality, an
//! LbEndpoint glob collection instead of endpoints; the server answers Envoy's subscription
//! to the glob with one `LbEndpoint` resource per upstream. The probe then:
//! 1. waits until Envoy's `/clusters` lists the N hosts, and routes requests through it;
//! 2. removes one endpoint and adds another in one response, and waits until Envoy has both
//!    changes; routes again.
//!
//! It prints, as JSON, what Envoy subscribed to, the bytes of the first answer and of the
//! change, the size the same change takes as a whole load assignment, NACKs, and timings.
//! Not part of odmesh: what the control plane would build on (docs/benchmarks.md 4, "One
//! instance's change in a large VIP").

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use envoy_types::pb::envoy::config::core::v3::{
    AggregatedConfigSource, ApiVersion, ConfigSource, Locality, SocketAddress, address,
    config_source::ConfigSourceSpecifier, socket_address::PortSpecifier,
};
use envoy_types::pb::envoy::config::endpoint::v3::{
    ClusterLoadAssignment, Endpoint, LbEndpoint, LedsClusterLocalityConfig, LocalityLbEndpoints,
    lb_endpoint::HostIdentifier, locality_lb_endpoints::LbConfig,
};
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse, Resource,
};
use envoy_types::pb::google::protobuf::Any;
use prost::Message;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::{Mutex, mpsc};
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::{Request, Response, Status, Streaming};

use crate::http1::Conn;
use odmesh_control::xds::ENDPOINTS_TYPE_URL;

const LB_ENDPOINT_TYPE_URL: &str = "type.googleapis.com/envoy.config.endpoint.v3.LbEndpoint";
const CLUSTER: &str = "big.vip";
/// The collection the load assignment names; its members are `<prefix><id>`.
const GLOB: &str = "xdstp://odmesh/envoy.config.endpoint.v3.LbEndpoint/big.vip/1/*";
const WAIT: Duration = Duration::from_secs(30);

/// What `leds-probe` does.
#[derive(Clone, Debug, Args)]
pub struct LedsArgs {
    /// The Envoy binary.
    #[arg(long)]
    pub envoy: PathBuf,
    /// Endpoints of the cluster.
    #[arg(long, default_value_t = 1000)]
    pub instances: usize,
}

fn member(id: usize) -> String {
    format!("{}ep-{id}", GLOB.trim_end_matches('*'))
}

fn lb_endpoint(port: u16) -> LbEndpoint {
    LbEndpoint {
        host_identifier: Some(HostIdentifier::Endpoint(Endpoint {
            address: Some(envoy_types::pb::envoy::config::core::v3::Address {
                address: Some(address::Address::SocketAddress(SocketAddress {
                    address: "127.0.0.1".into(),
                    port_specifier: Some(PortSpecifier::PortValue(u32::from(port))),
                    ..Default::default()
                })),
            }),
            ..Default::default()
        })),
        ..Default::default()
    }
}

fn resource(id: usize, port: u16) -> Resource {
    Resource {
        name: member(id),
        version: port.to_string(),
        resource: Some(Any {
            type_url: LB_ENDPOINT_TYPE_URL.into(),
            value: lb_endpoint(port).encode_to_vec(),
        }),
        ..Default::default()
    }
}

fn ads() -> ConfigSource {
    ConfigSource {
        config_source_specifier: Some(ConfigSourceSpecifier::Ads(AggregatedConfigSource {})),
        resource_api_version: ApiVersion::V3 as i32,
        ..Default::default()
    }
}

/// `big.vip`'s load assignment with one locality, `locality` (its endpoints or its LEDS
/// collection) in it.
fn assignment(locality: LocalityLbEndpoints) -> ClusterLoadAssignment {
    ClusterLoadAssignment {
        cluster_name: CLUSTER.into(),
        endpoints: vec![LocalityLbEndpoints {
            locality: Some(Locality {
                zone: "zone-0".into(),
                ..Default::default()
            }),
            ..locality
        }],
        ..Default::default()
    }
}

/// The load assignment that names the collection instead of endpoints.
fn leds_assignment() -> ClusterLoadAssignment {
    assignment(LocalityLbEndpoints {
        lb_config: Some(LbConfig::LedsClusterLocalityConfig(
            LedsClusterLocalityConfig {
                leds_config: Some(ads()),
                leds_collection_name: GLOB.into(),
            },
        )),
        ..Default::default()
    })
}

/// The same endpoints as a plain load assignment: what EDS sends on any change.
fn whole_assignment(ports: &[u16]) -> ClusterLoadAssignment {
    assignment(LocalityLbEndpoints {
        lb_endpoints: ports.iter().map(|&p| lb_endpoint(p)).collect(),
        ..Default::default()
    })
}

/// What the server saw and sent, for the report.
#[derive(Debug, Default)]
struct Seen {
    requests: Vec<serde_json::Value>,
    nacks: Vec<String>,
    sent: Vec<(String, usize)>,
}

#[derive(Clone)]
struct Server {
    ports: Vec<u16>,
    seen: std::sync::Arc<Mutex<Seen>>,
    /// Changes to push on the LbEndpoint collection, taken by the first stream.
    changes: std::sync::Arc<Mutex<Option<mpsc::Receiver<DeltaDiscoveryResponse>>>>,
}

impl Server {
    async fn stream(
        self,
        mut inbound: Streaming<DeltaDiscoveryRequest>,
        tx: mpsc::Sender<Result<DeltaDiscoveryResponse, Status>>,
    ) {
        let mut changes = self.changes.lock().await.take();
        let mut nonce = 0u64;
        loop {
            let out = tokio::select! {
                msg = inbound.message() => {
                    let Ok(Some(req)) = msg else { return };
                    let mut seen = self.seen.lock().await;
                    seen.requests.push(json!({
                        "type_url": req.type_url,
                        "subscribe": req.resource_names_subscribe,
                        "unsubscribe": req.resource_names_unsubscribe,
                        "initial_resource_versions": req.initial_resource_versions.len(),
                        "nonce": req.response_nonce,
                    }));
                    if let Some(error) = &req.error_detail {
                        seen.nacks.push(format!("{}: {}", req.type_url, error.message));
                    }
                    drop(seen);
                    let subscribe = req.resource_names_subscribe;
                    if req.type_url == ENDPOINTS_TYPE_URL && subscribe.iter().any(|n| n == CLUSTER) {
                        DeltaDiscoveryResponse {
                            type_url: ENDPOINTS_TYPE_URL.into(),
                            resources: vec![Resource {
                                name: CLUSTER.into(),
                                version: "1".into(),
                                resource: Some(Any {
                                    type_url: ENDPOINTS_TYPE_URL.into(),
                                    value: leds_assignment().encode_to_vec(),
                                }),
                                ..Default::default()
                            }],
                            ..Default::default()
                        }
                    } else if req.type_url == LB_ENDPOINT_TYPE_URL && !subscribe.is_empty() {
                        DeltaDiscoveryResponse {
                            type_url: LB_ENDPOINT_TYPE_URL.into(),
                            resources: (self.ports.iter().enumerate())
                                .map(|(id, &port)| resource(id, port))
                                .collect(),
                            ..Default::default()
                        }
                    } else {
                        continue;
                    }
                }
                Some(change) = async { changes.as_mut()?.recv().await } => change,
            };
            nonce += 1;
            let out = DeltaDiscoveryResponse {
                nonce: nonce.to_string(),
                system_version_info: nonce.to_string(),
                ..out
            };
            let kind = out.type_url.clone();
            self.seen.lock().await.sent.push((kind, out.encoded_len()));
            if tx.send(Ok(out)).await.is_err() {
                return;
            }
        }
    }
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for Server {
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

/// An upstream that answers every HTTP/1.1 request with its own port.
async fn upstream() -> anyhow::Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    let Ok(n) = socket.read(&mut chunk).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        buf.drain(..end + 4);
                        let body = port.to_string();
                        let answer = format!(
                            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
                            body.len()
                        );
                        if socket.write_all(answer.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    Ok(port)
}

/// Stops Envoy however the probe ends.
struct Envoy(Child);

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0").await?.local_addr()?.port())
}

fn bootstrap(admin: u16, listen: u16, xds: u16) -> serde_json::Value {
    let socket =
        |port: u16| json!({"socket_address": {"address": "127.0.0.1", "port_value": port}});
    json!({
        "node": {"id": "leds-probe", "cluster": "probe"},
        "admin": {"address": socket(admin)},
        "dynamic_resources": {"ads_config": {"api_type": "DELTA_GRPC", "transport_api_version": "V3",
            "grpc_services": [{"envoy_grpc": {"cluster_name": "xds"}}]}},
        "static_resources": {
            "clusters": [
                {"name": "xds", "type": "STATIC", "connect_timeout": "1s",
                 "typed_extension_protocol_options": {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                     "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                     "explicit_http_config": {"http2_protocol_options": {}}}},
                 "load_assignment": {"cluster_name": "xds", "endpoints": [{"lb_endpoints": [
                     {"endpoint": {"address": socket(xds)}}]}]}},
                {"name": CLUSTER, "type": "EDS", "connect_timeout": "1s",
                 "eds_cluster_config": {"eds_config": {"ads": {}, "resource_api_version": "V3"}}}
            ],
            "listeners": [{"name": "l", "address": socket(listen), "filter_chains": [{"filters": [{
                "name": "envoy.filters.network.http_connection_manager",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                    "stat_prefix": "l",
                    "route_config": {"name": "r", "virtual_hosts": [{"name": "v", "domains": ["*"],
                        "routes": [{"match": {"prefix": "/"}, "route": {"cluster": CLUSTER}}]}]},
                    "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]}}]}]}]
        }
    })
}

/// Envoy's admin answer to `GET path` (read to the connection's close; a chunked body is
/// joined).
async fn admin_get(admin: u16, path: &str) -> anyhow::Result<String> {
    let mut socket = tokio::net::TcpStream::connect(("127.0.0.1", admin)).await?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n");
    socket.write_all(request.as_bytes()).await?;
    let mut answer = Vec::new();
    socket.read_to_end(&mut answer).await?;
    let answer = String::from_utf8_lossy(&answer);
    let (head, mut body) = answer.split_once("\r\n\r\n").context("no HTTP answer")?;
    if !head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        return Ok(body.to_owned());
    }
    let mut joined = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let size = usize::from_str_radix(size.trim(), 16).context("bad chunk size")?;
        if size == 0 || rest.len() < size {
            break;
        }
        joined.push_str(&rest[..size]);
        body = rest[size..].trim_start_matches("\r\n");
    }
    Ok(joined)
}

/// The ports of `big.vip`'s hosts in Envoy's `/clusters`.
async fn hosts(admin: u16) -> anyhow::Result<BTreeSet<u16>> {
    let body = admin_get(admin, "/clusters").await?;
    let prefix = format!("{CLUSTER}::127.0.0.1:");
    Ok(body
        .lines()
        .filter_map(|l| l.strip_prefix(&prefix))
        .filter(|rest| rest.contains("::cx_active::"))
        .filter_map(|rest| rest.split("::").next()?.parse().ok())
        .collect())
}

async fn wait_hosts(admin: u16, want: &BTreeSet<u16>) -> anyhow::Result<Duration> {
    let started = Instant::now();
    loop {
        if hosts(admin).await.ok().as_ref() == Some(want) {
            return Ok(started.elapsed());
        }
        if started.elapsed() > WAIT {
            let have = hosts(admin).await.unwrap_or_default();
            bail!(
                "Envoy has {} hosts of big.vip, not the {} expected, after {WAIT:?}",
                have.len(),
                want.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `requests` requests through the listener: (answered 200, distinct upstreams).
async fn route(listen: u16, requests: usize) -> anyhow::Result<(usize, usize)> {
    let mut conn = Conn::connect(&format!("127.0.0.1:{listen}")).await?;
    let mut ok = 0;
    let mut seen = BTreeSet::new();
    for _ in 0..requests {
        let (status, body) = conn.request("GET", "/", b"").await?;
        if status == 200 {
            ok += 1;
            seen.insert(body);
        }
    }
    Ok((ok, seen.len()))
}

/// `leds-probe`.
pub async fn run(a: LedsArgs) -> anyhow::Result<()> {
    let mut ports = Vec::with_capacity(a.instances + 1);
    for _ in 0..=a.instances {
        ports.push(upstream().await?);
    }
    let added_port = ports.pop().context("no upstream")?;
    let (change_tx, change_rx) = mpsc::channel(1);
    let server = Server {
        ports: ports.clone(),
        seen: Default::default(),
        changes: std::sync::Arc::new(Mutex::new(Some(change_rx))),
    };
    let xds = TcpListener::bind("127.0.0.1:0").await?;
    let xds_port = xds.local_addr()?.port();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(AggregatedDiscoveryServiceServer::new(server.clone()))
            .serve_with_incoming(TcpListenerStream::new(xds)),
    );
    let (admin, listen) = (free_port().await?, free_port().await?);
    let dir = std::env::temp_dir().join(format!("odmesh-leds-probe-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let config = dir.join("envoy.json");
    std::fs::write(
        &config,
        serde_json::to_vec(&bootstrap(admin, listen, xds_port))?,
    )?;
    let log = std::fs::File::create(dir.join("envoy.log"))?;
    let started = Instant::now();
    let _envoy = Envoy(
        Command::new(&a.envoy)
            .args(["-c", &config.to_string_lossy(), "--concurrency", "1"])
            .args(["--base-id", &xds_port.to_string(), "-l", "info"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", a.envoy.display()))?,
    );
    let all: BTreeSet<u16> = ports.iter().copied().collect();
    let warm = wait_hosts(admin, &all).await.map(|_| started.elapsed());
    let first = match &warm {
        Ok(_) => Some(route(listen, 50).await?),
        Err(_) => None,
    };
    let mut change = None;
    if warm.is_ok() {
        // One endpoint gone, one new: a removal and an addition in one response.
        let response = DeltaDiscoveryResponse {
            type_url: LB_ENDPOINT_TYPE_URL.into(),
            resources: vec![resource(a.instances, added_port)],
            removed_resources: vec![member(0)],
            ..Default::default()
        };
        let mut want = all.clone();
        want.remove(&ports[0]);
        want.insert(added_port);
        let sent = Instant::now();
        change_tx.send(response).await.ok().context("stream gone")?;
        let applied = wait_hosts(admin, &want).await;
        let mut after: Vec<u16> = want.iter().copied().collect();
        after.sort_unstable();
        change = Some(json!({
            "applied_ms": applied.as_ref().ok().map(|_| sent.elapsed().as_secs_f64() * 1e3),
            "error": applied.err().map(|e| e.to_string()),
            "routed_after": route(listen, 50).await.ok(),
            "as_whole_assignment_bytes": whole_assignment(&after).encoded_len(),
        }));
    }
    let seen = server.seen.lock().await;
    let out = json!({
        "instances": a.instances,
        "warm_ms": warm.as_ref().ok().map(|d| d.as_secs_f64() * 1e3),
        "warm_error": warm.as_ref().err().map(|e| e.to_string()),
        "routed_first": first,
        "change": change,
        "requests": seen.requests,
        "nacks": seen.nacks,
        "sent_bytes": seen.sent.iter().map(|(t, b)| json!({"type_url": t, "bytes": b})).collect::<Vec<_>>(),
        "envoy_log": dir.join("envoy.log"),
    });
    println!("{out}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_are_named_so_that_envoy_matches_them_to_the_glob() {
        // Envoy looks a member up by its name with the last segment replaced by `*`.
        let name = member(7);
        let (dir, last) = name.rsplit_once('/').unwrap();
        assert_eq!((format!("{dir}/*"), last), (GLOB.to_owned(), "ep-7"));
    }

    #[test]
    fn the_assignment_names_the_collection_and_carries_no_endpoints() {
        let cla = leds_assignment();
        let locality = &cla.endpoints[0];
        assert!(locality.lb_endpoints.is_empty());
        let Some(LbConfig::LedsClusterLocalityConfig(leds)) = &locality.lb_config else {
            panic!("no LEDS config");
        };
        assert_eq!(leds.leds_collection_name, GLOB);
        assert!(matches!(
            leds.leds_config
                .as_ref()
                .and_then(|c| c.config_source_specifier.as_ref()),
            Some(ConfigSourceSpecifier::Ads(_))
        ));
    }
}
