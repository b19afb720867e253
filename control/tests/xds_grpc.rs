//! In-process gRPC tests: a real tonic server on a free loopback port, a delta xDS client.
//!
//! Every wait is bounded; "nothing was sent" is shown by a later, expected response being the
//! next one on the stream, never by sleeping.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::config::endpoint::v3::{
    ClusterLoadAssignment, ClusterStats, UpstreamLocalityStats,
};
use envoy_types::pb::envoy::service::cluster::v3::cluster_discovery_service_client::ClusterDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest,
};
use envoy_types::pb::envoy::service::load_stats::v3::load_reporting_service_client::LoadReportingServiceClient;
use envoy_types::pb::envoy::service::load_stats::v3::{LoadStatsRequest, LoadStatsResponse};
use envoy_types::pb::google::protobuf::value::Kind as ValueKind;
use envoy_types::pb::google::rpc::Status as RpcStatus;
use odmesh_base::testing::{wait_ok, wait_until};
use odmesh_base::tls::{ALPN_H2, ServerTls, ServerTlsFiles};
use odmesh_control::cache::Cache;
use odmesh_control::metrics::Metrics;
use odmesh_control::model::Snapshot;
use odmesh_control::prewarm::{History, Limits, Prewarm};
use odmesh_control::server::{ProxyStatus, XdsConfig, XdsServer};
use odmesh_control::xds::{CLUSTER_TYPE_URL, ENDPOINTS_TYPE_URL, XdsOptions};
use odmesh_registry::{Instance, Protocol, Registry, Status};
use prost::Message;
use tokio::io::AsyncReadExt;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

const WAIT: Duration = Duration::from_secs(5);

/// A fixture under `base/testdata/`: the test certificates live with the TLS code.
fn testdata(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../base/testdata")
        .join(name)
}

fn inst(vip: &str, ip: &str, status: Status) -> Instance {
    Instance {
        app: vip.to_uppercase().into(),
        instance_id: format!("{vip}-{ip}").into(),
        ip: ip.parse().unwrap(),
        port: Some(8080),
        secure_port: None,
        vips: vec![vip.into()],
        svips: vec![],
        status,
        zone: None,
        protocol: Protocol::Auto,
    }
}

fn snapshot(instances: Vec<Instance>) -> Arc<Snapshot> {
    Arc::new(Snapshot::from_registry(&Registry::from_iter(instances)))
}

/// A running server and what a test needs to drive and observe it.
struct Harness {
    addr: SocketAddr,
    cache: Arc<Cache>,
    metrics: Arc<Metrics>,
    server: XdsServer,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl Harness {
    async fn start(instances: Vec<Instance>) -> Harness {
        Harness::start_with(instances, XdsConfig::default()).await
    }

    async fn start_with(instances: Vec<Instance>, config: XdsConfig) -> Harness {
        let cache = Arc::new(Cache::with_snapshot(
            XdsOptions::new(Some("/ca.pem".into())),
            snapshot(instances),
        ));
        let metrics = Arc::new(Metrics::default());
        let server = XdsServer::with_config(cache.clone(), metrics.clone(), config);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn({
            let server = server.clone();
            async move {
                server
                    .serve(listener, async {
                        let _ = stopped.await;
                    })
                    .await
                    .unwrap();
            }
        });
        Harness {
            addr,
            cache,
            metrics,
            server,
            stop: Some(stop),
            task,
        }
    }

    /// An ADS stream whose connection comes from `source`, another loopback address (the
    /// whole of 127.0.0.0/8 is the loopback interface's on Linux).
    async fn ads_from(&self, source: std::net::IpAddr, node: &str) -> Client {
        self.try_ads_from(source, node).await.unwrap()
    }

    /// [`Harness::ads_from`], or why the stream could not be opened.
    async fn try_ads_from(&self, source: std::net::IpAddr, node: &str) -> Result<Client, String> {
        let addr = self.addr;
        let connector = tower::service_fn(move |_: tonic::codegen::http::Uri| async move {
            let socket = tokio::net::TcpSocket::new_v4()?;
            socket.bind(SocketAddr::new(source, 0))?;
            let stream = socket.connect(addr).await?;
            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
        });
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect_with_connector(connector)
            .await
            .map_err(|e| e.to_string())?;
        let client = AggregatedDiscoveryServiceClient::new(channel);
        Client::open(client, node).await
    }

    async fn ads(&self, node: &str) -> Client {
        let client = AggregatedDiscoveryServiceClient::connect(format!("http://{}", self.addr))
            .await
            .unwrap();
        Client::open(client, node).await.unwrap()
    }

    /// An ADS stream over TLS (server name `localhost`, the test CA), with a client
    /// certificate when `identity` is given; `Err` when the server refuses it.
    async fn ads_tls(&self, node: &str, identity: Option<Identity>) -> Result<Client, String> {
        self.ads_tls_trusting("tls/ca.pem", node, identity).await
    }

    /// [`Harness::ads_tls`] trusting only the CA of fixture `ca`.
    async fn ads_tls_trusting(
        &self,
        ca: &str,
        node: &str,
        identity: Option<Identity>,
    ) -> Result<Client, String> {
        let channel = self.tls_channel_trusting(ca, identity).await?;
        Client::open(AggregatedDiscoveryServiceClient::new(channel), node).await
    }

    /// A channel over TLS (server name `localhost`, the test CA), with a client certificate
    /// when `identity` is given.
    async fn tls_channel(&self, identity: Option<Identity>) -> Result<Channel, String> {
        self.tls_channel_trusting("tls/ca.pem", identity).await
    }

    /// [`Harness::tls_channel`] trusting only the CA of fixture `ca`.
    async fn tls_channel_trusting(
        &self,
        ca: &str,
        identity: Option<Identity>,
    ) -> Result<Channel, String> {
        let read = |name: &str| std::fs::read(testdata(name)).unwrap();
        let mut tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(read(ca)))
            .domain_name("localhost");
        if let Some(identity) = identity {
            tls = tls.identity(identity);
        }
        Channel::from_shared(format!("https://{}", self.addr))
            .unwrap()
            .tls_config(tls)
            .map_err(|e| e.to_string())?
            .connect()
            .await
            .map_err(|e| format!("{e:?}"))
    }

    /// Polls the proxies view until `cond` holds for some stream of `node`.
    async fn until_proxy(&self, node: &str, cond: impl Fn(&ProxyStatus) -> bool) {
        let what = format!("a stream of proxy {node} to get there");
        wait_until(WAIT, &what, || {
            (self.server.proxies().iter()).any(|p| p.node_id == node && cond(p))
        })
        .await;
    }

    async fn until_metric(&self, what: &str, cond: impl Fn(&Metrics) -> bool) {
        wait_until(WAIT, what, || cond(&self.metrics)).await;
    }

    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(WAIT, self.task)
            .await
            .expect("server stops promptly, xDS streams included")
            .unwrap();
    }
}

/// A delta xDS client on one stream.
struct Client {
    tx: mpsc::Sender<DeltaDiscoveryRequest>,
    inbound: Streaming<DeltaDiscoveryResponse>,
    /// Sent with the first request only, as Envoy does.
    node: Option<String>,
}

impl Client {
    /// Opens a delta ADS stream on `client`.
    async fn open(
        mut client: AggregatedDiscoveryServiceClient<Channel>,
        node: &str,
    ) -> Result<Client, String> {
        let (tx, rx) = mpsc::channel(16);
        let inbound = client
            .delta_aggregated_resources(ReceiverStream::new(rx))
            .await
            .map_err(|e| e.to_string())?
            .into_inner();
        Ok(Client {
            tx,
            inbound,
            node: Some(node.to_owned()),
        })
    }

    async fn send(&mut self, mut req: DeltaDiscoveryRequest) {
        if let Some(id) = self.node.take() {
            req.node = Some(Node {
                id,
                cluster: "test".into(),
                ..Default::default()
            });
        }
        self.tx.send(req).await.unwrap();
    }

    async fn subscribe(&mut self, type_url: &str, names: &[&str]) {
        self.send(DeltaDiscoveryRequest {
            type_url: type_url.into(),
            resource_names_subscribe: names.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        })
        .await;
    }

    async fn unsubscribe(&mut self, type_url: &str, names: &[&str]) {
        self.send(DeltaDiscoveryRequest {
            type_url: type_url.into(),
            resource_names_unsubscribe: names.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        })
        .await;
    }

    async fn ack(&mut self, resp: &DeltaDiscoveryResponse) {
        self.send(DeltaDiscoveryRequest {
            type_url: resp.type_url.clone(),
            response_nonce: resp.nonce.clone(),
            ..Default::default()
        })
        .await;
    }

    async fn nack(&mut self, resp: &DeltaDiscoveryResponse, message: &str) {
        self.send(DeltaDiscoveryRequest {
            type_url: resp.type_url.clone(),
            response_nonce: resp.nonce.clone(),
            error_detail: Some(RpcStatus {
                code: 3,
                message: message.into(),
                details: vec![],
            }),
            ..Default::default()
        })
        .await;
    }

    /// The next response, acknowledged.
    async fn recv(&mut self) -> DeltaDiscoveryResponse {
        let resp = self.recv_no_ack().await;
        self.ack(&resp).await;
        resp
    }

    async fn recv_no_ack(&mut self) -> DeltaDiscoveryResponse {
        tokio::time::timeout(WAIT, self.inbound.message())
            .await
            .expect("a response in time")
            .expect("stream healthy")
            .expect("stream open")
    }
}

fn names(resp: &DeltaDiscoveryResponse) -> Vec<&str> {
    resp.resources.iter().map(|r| r.name.as_str()).collect()
}

fn cluster(resp: &DeltaDiscoveryResponse, i: usize) -> Cluster {
    let any = resp.resources[i].resource.as_ref().unwrap();
    assert_eq!(any.type_url, CLUSTER_TYPE_URL);
    Cluster::decode(any.value.as_slice()).unwrap()
}

fn cla(resp: &DeltaDiscoveryResponse, i: usize) -> ClusterLoadAssignment {
    let any = resp.resources[i].resource.as_ref().unwrap();
    assert_eq!(any.type_url, ENDPOINTS_TYPE_URL);
    ClusterLoadAssignment::decode(any.value.as_slice()).unwrap()
}

fn endpoint_count(c: &ClusterLoadAssignment) -> usize {
    c.endpoints.iter().map(|g| g.lb_endpoints.len()).sum()
}

fn registered(c: &Cluster) -> bool {
    let meta = &c.metadata.as_ref().unwrap().filter_metadata["odmesh"].fields;
    match meta["registered"].kind {
        Some(ValueKind::BoolValue(b)) => b,
        ref other => panic!("registered is not a bool: {other:?}"),
    }
}

#[tokio::test]
async fn a_request_over_the_size_bound_ends_its_stream_with_out_of_range_and_others_are_served() {
    let h = Harness::start(vec![inst("hello", "10.0.0.1", Status::Up)]).await;
    let channel = Channel::from_shared(format!("http://{}", h.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let client = AggregatedDiscoveryServiceClient::new(channel).max_encoding_message_size(64 << 20);
    let mut hostile = Client::open(client, "hostile").await.unwrap();
    // About 5.4 MiB of names: over the 4 MiB a request may have.
    let many: Vec<String> = (0..300_000).map(|i| format!("svc-{i:08}.vip")).collect();
    let request = DeltaDiscoveryRequest {
        type_url: CLUSTER_TYPE_URL.into(),
        resource_names_subscribe: many,
        ..Default::default()
    };
    assert!(request.encoded_len() > 4 << 20);
    hostile.send(request).await;
    let ended = tokio::time::timeout(WAIT, hostile.inbound.message())
        .await
        .expect("the stream ends");
    let status = ended.expect_err("an error status, not a response or a quiet end");
    assert_eq!(status.code(), tonic::Code::OutOfRange, "{status}");
    assert_eq!(h.cache.watched(), 0, "nothing of it was subscribed");

    let mut envoy = h.ads("envoy-1").await;
    envoy.subscribe(CLUSTER_TYPE_URL, &["hello.vip"]).await;
    assert_eq!(names(&envoy.recv().await), ["hello.vip"]);
}

#[tokio::test]
async fn a_subscribed_vip_gets_its_cluster_then_its_endpoints() {
    let h = Harness::start(vec![
        inst("hello", "10.0.0.1", Status::Up),
        inst("hello", "10.0.0.2", Status::Up),
        inst("hello", "10.0.0.3", Status::Down),
    ])
    .await;
    let mut envoy = h.ads("envoy-1").await;

    let started = Instant::now();
    envoy.subscribe(CLUSTER_TYPE_URL, &["hello.vip"]).await;
    let resp = envoy.recv().await;
    let cluster_latency = started.elapsed();
    assert_eq!(resp.type_url, CLUSTER_TYPE_URL);
    assert_eq!(names(&resp), ["hello.vip"]);
    let c = cluster(&resp, 0);
    assert_eq!(c.eds_cluster_config.unwrap().service_name, "hello.vip");

    let started = Instant::now();
    envoy.subscribe(ENDPOINTS_TYPE_URL, &["hello.vip"]).await;
    let resp = envoy.recv().await;
    let endpoints_latency = started.elapsed();
    assert_eq!(resp.type_url, ENDPOINTS_TYPE_URL);
    assert_eq!(endpoint_count(&cla(&resp, 0)), 2, "only UP instances");
    eprintln!("answer latency: cluster {cluster_latency:?}, endpoints {endpoints_latency:?}");

    h.until_proxy("envoy-1", |p| {
        p.clusters == ["hello.vip"] && p.endpoints == ["hello.vip"] && p.acks == 2
    })
    .await;
    assert_eq!(
        h.metrics.xds_cluster_subscriptions.load(Ordering::Relaxed),
        1
    );
    assert_eq!(h.metrics.xds_streams_active.load(Ordering::Relaxed), 1);
    h.stop().await;
}

#[tokio::test]
async fn a_new_cluster_on_ads_comes_with_its_endpoints_without_a_second_round_trip() {
    let h = Harness::start(vec![inst("hello", "10.0.0.1", Status::Up)]).await;
    let mut envoy = h.ads("envoy-1").await;

    envoy.subscribe(CLUSTER_TYPE_URL, &["hello.vip"]).await;
    let first = envoy.recv().await;
    assert_eq!(first.type_url, CLUSTER_TYPE_URL);
    let second = envoy.recv().await;
    assert_eq!(second.type_url, ENDPOINTS_TYPE_URL);
    assert_eq!(names(&second), ["hello.vip"]);
    assert_eq!(endpoint_count(&cla(&second, 0)), 1);

    // Envoy's own subscribe, which follows, is not answered with the same thing again.
    // The stream answers requests in order: had it resent the load assignment, that would
    // come before the answer to the next request.
    envoy.subscribe(ENDPOINTS_TYPE_URL, &["hello.vip"]).await;
    envoy.subscribe(CLUSTER_TYPE_URL, &["other.vip"]).await;
    let next = envoy.recv().await;
    assert_eq!(
        (next.type_url.as_str(), names(&next)),
        (CLUSTER_TYPE_URL, vec!["other.vip"])
    );
    h.stop().await;
}

#[tokio::test]
async fn an_unknown_vip_gets_an_unregistered_cluster_and_empty_endpoints_then_the_real_ones() {
    let h = Harness::start(vec![]).await;
    let mut envoy = h.ads("envoy-1").await;
    envoy.subscribe(CLUSTER_TYPE_URL, &["late.vip"]).await;
    let resp = envoy.recv().await;
    assert!(resp.removed_resources.is_empty(), "never a removal");
    assert!(!registered(&cluster(&resp, 0)));
    envoy.subscribe(ENDPOINTS_TYPE_URL, &["late.vip"]).await;
    let resp = envoy.recv().await;
    assert_eq!(endpoint_count(&cla(&resp, 0)), 0);

    // The VIP registers: the cluster (now registered) comes first, then its endpoints.
    h.cache
        .set_snapshot(snapshot(vec![inst("late", "10.0.0.1", Status::Up)]));
    let resp = envoy.recv().await;
    assert_eq!(resp.type_url, CLUSTER_TYPE_URL);
    assert!(registered(&cluster(&resp, 0)));
    let resp = envoy.recv().await;
    assert_eq!(resp.type_url, ENDPOINTS_TYPE_URL);
    assert_eq!(endpoint_count(&cla(&resp, 0)), 1);
    h.stop().await;
}

#[tokio::test]
async fn a_change_to_one_cluster_reaches_only_its_subscribers_and_only_that_cluster() {
    let mut instances: Vec<Instance> = (0..20)
        .map(|i| inst(&format!("svc{i}"), "10.0.0.1", Status::Up))
        .collect();
    let h = Harness::start(instances.clone()).await;
    let mut a = h.ads("a").await;
    let mut b = h.ads("b").await;
    a.subscribe(ENDPOINTS_TYPE_URL, &["svc1.vip", "svc2.vip"])
        .await;
    assert_eq!(names(&a.recv().await), ["svc1.vip", "svc2.vip"]);
    b.subscribe(ENDPOINTS_TYPE_URL, &["svc3.vip"]).await;
    assert_eq!(names(&b.recv().await), ["svc3.vip"]);

    instances.push(inst("svc2", "10.0.0.2", Status::Up));
    h.cache.set_snapshot(snapshot(instances.clone()));
    let resp = a.recv().await;
    assert_eq!(names(&resp), ["svc2.vip"], "only the changed cluster");
    assert_eq!(endpoint_count(&cla(&resp, 0)), 2);

    // b is not subscribed to svc2: the next thing it hears of is its own svc3.
    instances.push(inst("svc3", "10.0.0.2", Status::Up));
    h.cache.set_snapshot(snapshot(instances));
    assert_eq!(names(&b.recv().await), ["svc3.vip"]);
    h.stop().await;
}

#[tokio::test]
async fn a_nack_is_counted_and_logged_and_not_resent() {
    let h = Harness::start(vec![
        inst("hello", "10.0.0.1", Status::Up),
        inst("marker", "10.0.0.1", Status::Up),
    ])
    .await;
    let mut envoy = h.ads("envoy-1").await;
    envoy
        .subscribe(ENDPOINTS_TYPE_URL, &["hello.vip", "marker.vip"])
        .await;
    let resp = envoy.recv_no_ack().await;
    envoy.nack(&resp, "bad endpoints, says Envoy").await;
    h.until_proxy("envoy-1", |p| p.nacks == 1).await;
    let proxy = &h.server.proxies()[0];
    let nack = proxy.last_nack.as_ref().unwrap();
    assert_eq!(nack.message, "bad endpoints, says Envoy");
    assert_eq!(nack.nonce, resp.nonce);
    assert_eq!(h.metrics.nacks(), 1);

    // Only marker changes; the NACKed hello is not re-sent with it.
    h.cache.set_snapshot(snapshot(vec![
        inst("hello", "10.0.0.1", Status::Up),
        inst("marker", "10.0.0.2", Status::Up),
    ]));
    assert_eq!(names(&envoy.recv().await), ["marker.vip"]);
    // hello goes again once it changes.
    h.cache.set_snapshot(snapshot(vec![
        inst("hello", "10.0.0.3", Status::Up),
        inst("marker", "10.0.0.2", Status::Up),
    ]));
    assert_eq!(names(&envoy.recv().await), ["hello.vip"]);
    h.stop().await;
}

#[tokio::test]
async fn a_reconnect_with_initial_versions_gets_only_what_differs() {
    let h = Harness::start(vec![
        inst("same", "10.0.0.1", Status::Up),
        inst("moved", "10.0.0.1", Status::Up),
    ])
    .await;
    let mut first = h.ads("envoy-1").await;
    first
        .subscribe(ENDPOINTS_TYPE_URL, &["same.vip", "moved.vip"])
        .await;
    let resp = first.recv().await;
    let versions: HashMap<String, String> = resp
        .resources
        .iter()
        .map(|r| (r.name.clone(), r.version.clone()))
        .collect();
    drop(first);
    h.until_metric("stream closed", |m| {
        m.xds_streams_active.load(Ordering::Relaxed) == 0
    })
    .await;
    assert_eq!(
        h.cache.watched(),
        0,
        "a closed stream drops its subscriptions"
    );

    h.cache.set_snapshot(snapshot(vec![
        inst("same", "10.0.0.1", Status::Up),
        inst("moved", "10.0.0.2", Status::Up),
    ]));
    let mut again = h.ads("envoy-1").await;
    again
        .send(DeltaDiscoveryRequest {
            type_url: ENDPOINTS_TYPE_URL.into(),
            resource_names_subscribe: vec!["same.vip".into(), "moved.vip".into()],
            initial_resource_versions: versions,
            ..Default::default()
        })
        .await;
    let resp = again.recv().await;
    assert_eq!(names(&resp), ["moved.vip"]);
    h.stop().await;
}

#[tokio::test]
async fn an_unsubscribed_name_gets_no_more_updates() {
    let h = Harness::start(vec![
        inst("hello", "10.0.0.1", Status::Up),
        inst("marker", "10.0.0.1", Status::Up),
    ])
    .await;
    let mut envoy = h.ads("envoy-1").await;
    envoy
        .subscribe(ENDPOINTS_TYPE_URL, &["hello.vip", "marker.vip"])
        .await;
    envoy.recv().await;
    envoy.unsubscribe(ENDPOINTS_TYPE_URL, &["hello.vip"]).await;
    h.until_proxy("envoy-1", |p| p.endpoints == ["marker.vip"])
        .await;

    h.cache.set_snapshot(snapshot(vec![
        inst("hello", "10.0.0.2", Status::Up),
        inst("marker", "10.0.0.2", Status::Up),
    ]));
    let resp = envoy.recv().await;
    assert_eq!(names(&resp), ["marker.vip"]);
    assert!(resp.removed_resources.is_empty());
    h.stop().await;
}

#[tokio::test]
async fn a_name_that_is_not_an_odmesh_cluster_is_answered_with_a_removal() {
    let h = Harness::start(vec![]).await;
    let mut envoy = h.ads("envoy-1").await;
    envoy.subscribe(CLUSTER_TYPE_URL, &["xds_cluster"]).await;
    let resp = envoy.recv().await;
    assert!(resp.resources.is_empty());
    assert_eq!(resp.removed_resources, ["xds_cluster"]);
    h.stop().await;
}

#[tokio::test]
async fn the_standalone_cluster_service_serves_clusters_on_its_own_stream() {
    let h = Harness::start(vec![inst("hello", "10.0.0.1", Status::Up)]).await;
    let mut client = ClusterDiscoveryServiceClient::connect(format!("http://{}", h.addr))
        .await
        .unwrap();
    let (tx, rx) = mpsc::channel(4);
    let mut inbound = client
        .delta_clusters(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    tx.send(DeltaDiscoveryRequest {
        resource_names_subscribe: vec!["hello.vip".into()],
        ..Default::default()
    })
    .await
    .unwrap();
    let resp = tokio::time::timeout(WAIT, inbound.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(resp.type_url, CLUSTER_TYPE_URL);
    assert_eq!(names(&resp), ["hello.vip"]);

    let sotw = client
        .fetch_clusters(DiscoveryRequest::default())
        .await
        .unwrap_err();
    assert_eq!(sotw.code(), tonic::Code::Unimplemented);
    h.stop().await;
}

/// A server over TLS with the test certificate, requiring client certificates of the test CA.
fn mtls() -> XdsConfig {
    let files = ServerTlsFiles {
        cert: testdata("tls/server.pem"),
        key: testdata("tls/server.key"),
        client_ca: Some(testdata("tls/ca.pem")),
    };
    XdsConfig {
        tls: Some(Arc::new(ServerTls::load(files, ALPN_H2).unwrap())),
        ..XdsConfig::default()
    }
}

/// A copy of fixture `name` as `dir/as_name`, renamed into place.
fn install(dir: &std::path::Path, name: &str, as_name: &str) -> std::path::PathBuf {
    let (path, tmp) = (dir.join(as_name), dir.join(format!("{as_name}.tmp")));
    std::fs::copy(testdata(name), &tmp).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    path
}

#[tokio::test]
async fn over_mtls_a_reloaded_certificate_serves_new_connections_and_open_streams_keep_going() {
    let dir = std::env::temp_dir().join(format!("odmesh-xds-reload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let files = ServerTlsFiles {
        cert: install(&dir, "tls/server.pem", "xds.pem"),
        key: install(&dir, "tls/server.key", "xds.key"),
        client_ca: Some(install(&dir, "tls/ca.pem", "proxies.pem")),
    };
    let tls = Arc::new(ServerTls::load(files, ALPN_H2).unwrap());
    let config = XdsConfig {
        tls: Some(tls.clone()),
        ..XdsConfig::default()
    };
    let instances = vec![
        inst("hello", "10.0.0.1", Status::Up),
        inst("other", "10.0.0.2", Status::Up),
        inst("third", "10.0.0.3", Status::Up),
    ];
    let h = Harness::start_with(instances, config).await;
    let read = |name: &str| std::fs::read(testdata(name)).unwrap();
    let identity = || Identity::from_pem(read("tls/client.pem"), read("tls/client.key"));
    let mut before = h.ads_tls("before", Some(identity())).await.unwrap();
    before.subscribe(CLUSTER_TYPE_URL, &["hello.vip"]).await;
    assert_eq!(names(&before.recv().await), ["hello.vip"]);
    assert_eq!(names(&before.recv().await), ["hello.vip"], "its endpoints");

    // Another certificate, of another CA: new connections get it.
    install(&dir, "tls/other-server.pem", "xds.pem");
    install(&dir, "tls/other-server.key", "xds.key");
    tls.reload().unwrap();
    let old_ca = h.ads_tls("trusts-the-old", Some(identity())).await;
    assert!(old_ca.is_err(), "a new connection got the old certificate");
    let mut after = (h
        .ads_tls_trusting("tls/other-ca.pem", "after", Some(identity()))
        .await)
        .expect("a new connection trusting the new CA is served");
    after.subscribe(CLUSTER_TYPE_URL, &["other.vip"]).await;
    assert_eq!(names(&after.recv().await), ["other.vip"]);
    // The stream opened before keeps going, on its connection.
    before.subscribe(CLUSTER_TYPE_URL, &["third.vip"]).await;
    assert_eq!(names(&before.recv().await), ["third.vip"]);

    // A certificate without its key: refused, the pair in force still serves.
    install(&dir, "tls/server.pem", "xds.pem");
    assert!(tls.reload().is_err());
    let mut still = (h
        .ads_tls_trusting("tls/other-ca.pem", "still", Some(identity()))
        .await)
        .expect("the pair in force still serves");
    still.subscribe(CLUSTER_TYPE_URL, &["hello.vip"]).await;
    assert_eq!(names(&still.recv().await), ["hello.vip"]);
    assert_eq!(h.server.proxies().len(), 3);
    h.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn over_tls_silent_connections_are_closed_after_the_first_bytes_timeout_and_free_their_slots()
{
    let config = XdsConfig {
        max_connections: 2,
        first_bytes_timeout: Duration::from_millis(300),
        ..mtls()
    };
    let h = Harness::start_with(vec![inst("hello", "10.0.0.1", Status::Up)], config).await;
    // Two connections that never send their TLS hello take both slots, for a while.
    let mut silent = Vec::new();
    for _ in 0..2 {
        silent.push(tokio::net::TcpStream::connect(h.addr).await.unwrap());
    }
    for conn in &mut silent {
        let mut sent = Vec::new();
        let closed = tokio::time::timeout(WAIT, conn.read_to_end(&mut sent)).await;
        assert!(matches!(closed, Ok(Ok(_) | Err(_))), "closed: {closed:?}");
    }
    h.until_metric("both silent connections counted", |m| {
        m.xds_connections_silent_total.load(Ordering::Relaxed) == 2
    })
    .await;
    // Their slots are free: a proxy is served; one without a certificate is not, and counted.
    let read = |name: &str| std::fs::read(testdata(name)).unwrap();
    let identity = Identity::from_pem(read("tls/client.pem"), read("tls/client.key"));
    let mut proxy = h.ads_tls("proxy-1", Some(identity)).await.unwrap();
    proxy.subscribe(CLUSTER_TYPE_URL, &["hello.vip"]).await;
    assert_eq!(names(&proxy.recv().await), ["hello.vip"]);
    let failed = h.metrics.xds_tls_failures_total.load(Ordering::Relaxed);
    assert!(h.ads_tls("anonymous", None).await.is_err());
    h.until_metric("the refused handshake counted", |m| {
        m.xds_tls_failures_total.load(Ordering::Relaxed) > failed
    })
    .await;
    h.stop().await;
}

#[tokio::test]
async fn over_mtls_a_proxy_with_a_certificate_of_the_ca_is_served_and_one_without_is_refused() {
    let h = Harness::start_with(vec![inst("hello", "10.0.0.1", Status::Up)], mtls()).await;
    let read = |name: &str| std::fs::read(testdata(name)).unwrap();
    let identity = Identity::from_pem(read("tls/client.pem"), read("tls/client.key"));
    let mut proxy = h.ads_tls("proxy-1", Some(identity)).await.unwrap();
    proxy.subscribe(CLUSTER_TYPE_URL, &["hello.vip"]).await;
    assert_eq!(names(&proxy.recv().await), ["hello.vip"]);

    // Without a client certificate, or with one from another CA, no stream opens.
    assert!(h.ads_tls("anonymous", None).await.is_err());
    let stranger = Identity::from_pem(read("tls/other-server.pem"), read("tls/other-server.key"));
    assert!(h.ads_tls("stranger", Some(stranger)).await.is_err());
    // Nor in plaintext.
    let plain = AggregatedDiscoveryServiceClient::connect(format!("http://{}", h.addr)).await;
    let refused = match plain {
        Err(_) => true,
        Ok(client) => Client::open(client, "plain").await.is_err(),
    };
    assert!(refused, "a plaintext client was served");
    assert_eq!(h.server.proxies().len(), 1);
    h.stop().await;
}

/// Opens a load report stream (LRS) on `channel` and sends one report, from the proxy `node`
/// of `service`, in which `cluster` carried a request; `Ok` with the server's answer, `Err`
/// if the server refuses the stream or does not answer.
async fn load_report(
    channel: Channel,
    node: &str,
    service: &str,
    cluster: &str,
) -> Result<LoadStatsResponse, String> {
    let report = LoadStatsRequest {
        node: Some(Node {
            id: node.into(),
            cluster: service.into(),
            ..Default::default()
        }),
        cluster_stats: vec![ClusterStats {
            cluster_name: cluster.into(),
            upstream_locality_stats: vec![UpstreamLocalityStats {
                total_issued_requests: 1,
                ..Default::default()
            }],
            ..Default::default()
        }],
    };
    let (tx, rx) = mpsc::channel(1);
    tx.send(report).await.unwrap();
    let exchange = async {
        let mut answers = LoadReportingServiceClient::new(channel)
            .stream_load_stats(ReceiverStream::new(rx))
            .await
            .map_err(|e| e.to_string())?
            .into_inner();
        match answers.message().await {
            Ok(Some(answer)) => Ok(answer),
            Ok(None) => Err("the stream ended unanswered".to_owned()),
            Err(e) => Err(e.to_string()),
        }
    };
    let answer = tokio::time::timeout(WAIT, exchange).await;
    drop(tx);
    answer.map_err(|_| "no answer in time".to_owned())?
}

#[tokio::test]
async fn over_mtls_load_reports_too_are_taken_only_from_a_certificate_of_the_ca() {
    // Load reports add to the prewarm history: the LRS service, served beside xDS, must
    // refuse whom xDS refuses.
    let prewarm = Arc::new(Prewarm::new(
        Limits::default(),
        None,
        History::default(),
        Default::default(),
    ));
    let config = XdsConfig {
        prewarm: Some(prewarm.clone()),
        ..mtls()
    };
    let h = Harness::start_with(vec![inst("hello", "10.0.0.1", Status::Up)], config).await;
    let read = |name: &str| std::fs::read(testdata(name)).unwrap();
    let proxy = Identity::from_pem(read("tls/client.pem"), read("tls/client.key"));
    let channel = h.tls_channel(Some(proxy)).await.unwrap();
    let answer = load_report(channel, "proxy-1", "billing", "hello.vip").await;
    assert!(answer.unwrap().send_all_clusters);
    assert_eq!(prewarm.predict("billing", |_| true), ["hello.vip"]);

    // Without a client certificate, with one of another CA, or in plaintext: no report.
    let stranger = Identity::from_pem(read("tls/other-server.pem"), read("tls/other-server.key"));
    for identity in [None, Some(stranger)] {
        let refused = match h.tls_channel(identity).await {
            Err(_) => true,
            Ok(channel) => {
                (load_report(channel, "intruder-1", "intruder", "hello.vip").await).is_err()
            }
        };
        assert!(
            refused,
            "a load report stream without a certificate of the CA"
        );
    }
    let plain = Channel::from_shared(format!("http://{}", h.addr)).unwrap();
    let refused = match plain.connect().await {
        Err(_) => true,
        Ok(channel) => (load_report(channel, "intruder-2", "intruder", "hello.vip").await).is_err(),
    };
    assert!(refused, "a plaintext load report stream");
    assert!(prewarm.predict("intruder", |_| true).is_empty());
    assert_eq!(h.metrics.load_reports_total.load(Ordering::Relaxed), 1);
    h.stop().await;
}

#[tokio::test]
async fn a_connection_over_the_limit_is_closed_and_counted_and_the_others_are_served() {
    let config = XdsConfig {
        max_connections: 1,
        ..XdsConfig::default()
    };
    let h = Harness::start_with(vec![inst("hello", "10.0.0.1", Status::Up)], config).await;
    let mut first = h.ads("proxy-1").await;
    first.subscribe(CLUSTER_TYPE_URL, &["hello.vip"]).await;
    assert_eq!(names(&first.recv().await), ["hello.vip"]);
    assert_eq!(names(&first.recv().await), ["hello.vip"], "its endpoints");

    let second = match AggregatedDiscoveryServiceClient::connect(format!("http://{}", h.addr)).await
    {
        Err(_) => None,
        Ok(client) => Client::open(client, "proxy-2").await.ok(),
    };
    if let Some(mut second) = second {
        // The connection was accepted and closed: the stream cannot carry a request.
        second.subscribe(CLUSTER_TYPE_URL, &["hello.vip"]).await;
        let answer = tokio::time::timeout(WAIT, second.inbound.message()).await;
        assert!(
            !matches!(answer, Ok(Ok(Some(_)))),
            "the second connection was served"
        );
    }
    h.until_metric("the refused connection counted", |m| {
        m.xds_connections_refused_total.load(Ordering::Relaxed) >= 1
    })
    .await;
    // The first is still served.
    first.subscribe(CLUSTER_TYPE_URL, &["other.vip"]).await;
    assert_eq!(names(&first.recv().await), ["other.vip"]);
    h.stop().await;
}

#[tokio::test]
async fn a_connection_over_its_addresss_bound_is_closed_and_counted_and_other_addresses_are_served()
{
    let config = XdsConfig {
        max_connections_per_source: 1,
        ..XdsConfig::default()
    };
    let h = Harness::start_with(vec![inst("hello", "10.0.0.1", Status::Up)], config).await;
    let (busy, other): (std::net::IpAddr, std::net::IpAddr) =
        ("127.0.0.1".parse().unwrap(), "127.0.0.2".parse().unwrap());
    let mut first = h.ads_from(busy, "proxy-1").await;
    first.subscribe(CLUSTER_TYPE_URL, &["hello.vip"]).await;
    assert_eq!(names(&first.recv().await), ["hello.vip"]);

    // A second connection from the same address is closed on arrival.
    if let Ok(mut second) = h.try_ads_from(busy, "proxy-2").await {
        second.subscribe(CLUSTER_TYPE_URL, &["hello.vip"]).await;
        let answer = tokio::time::timeout(WAIT, second.inbound.message()).await;
        assert!(
            !matches!(answer, Ok(Ok(Some(_)))),
            "the second connection of the address was served"
        );
    }
    h.until_metric("the refused connection counted", |m| {
        m.xds_connections_refused_source_total
            .load(Ordering::Relaxed)
            >= 1
    })
    .await;
    // Another address is served, and so is the first connection.
    let mut real = h.ads_from(other, "proxy-3").await;
    real.subscribe(CLUSTER_TYPE_URL, &["hello.vip"]).await;
    assert_eq!(names(&real.recv().await), ["hello.vip"]);
    first.subscribe(CLUSTER_TYPE_URL, &["other.vip"]).await;
    assert_eq!(
        names(&first.recv().await),
        ["hello.vip"],
        "its endpoints, then"
    );
    assert_eq!(names(&first.recv().await), ["other.vip"]);
    assert_eq!(
        h.metrics
            .xds_connections_refused_total
            .load(Ordering::Relaxed),
        0
    );
    h.stop().await;
}

#[tokio::test]
async fn the_streams_of_one_source_address_share_its_part_of_the_room_and_other_sources_keep_theirs()
 {
    let config = XdsConfig {
        max_subscriptions: 10,
        max_subscriptions_per_source: 2,
        ..XdsConfig::default()
    };
    let vips = ["a", "b", "c", "d"];
    let instances = vips
        .iter()
        .map(|v| inst(v, "10.0.0.1", Status::Up))
        .collect();
    let h = Harness::start_with(instances, config).await;
    let hog: std::net::IpAddr = "127.0.0.1".parse().unwrap();
    let other: std::net::IpAddr = "127.0.0.2".parse().unwrap();

    // Two connections of one source, with two node ids: two names in all are served.
    let mut first = h.ads_from(hog, "hog-1").await;
    first.subscribe(CLUSTER_TYPE_URL, &["a.vip", "b.vip"]).await;
    assert_eq!(names(&first.recv().await), ["a.vip", "b.vip"]);
    let mut second = h.ads_from(hog, "hog-2").await;
    second.subscribe(CLUSTER_TYPE_URL, &["c.vip"]).await;
    let waiting = second.recv().await;
    assert_eq!(
        (names(&waiting), waiting.removed_resources.clone()),
        (vec![], vec!["c.vip".to_owned()]),
        "over the source's share: a removal, as a name waiting for room"
    );
    assert_eq!(
        (h.metrics.xds_names_waiting_for_source_total).load(Ordering::Relaxed),
        1
    );

    // A proxy from another address is served.
    let mut real = h.ads_from(other, "real").await;
    real.subscribe(CLUSTER_TYPE_URL, &["c.vip", "d.vip"]).await;
    assert_eq!(names(&real.recv().await), ["c.vip", "d.vip"]);
    let sources: Vec<_> = (h.server.proxies().iter())
        .map(|p| (p.node_id.clone(), p.source))
        .collect();
    assert!(
        sources.contains(&("hog-1".to_owned(), Some(hog))),
        "{sources:?}"
    );
    assert!(
        sources.contains(&("real".to_owned(), Some(other))),
        "{sources:?}"
    );

    // The source's first stream ends: its room goes to its waiting name.
    drop(first);
    let pushed = second.recv().await;
    assert_eq!(names(&pushed), ["c.vip"]);
    h.stop().await;
}

#[tokio::test]
async fn silent_connections_are_closed_after_the_first_bytes_timeout_and_free_their_slots() {
    let config = XdsConfig {
        max_connections: 2,
        first_bytes_timeout: Duration::from_millis(300),
        ..XdsConfig::default()
    };
    let h = Harness::start_with(vec![inst("hello", "10.0.0.1", Status::Up)], config).await;
    // Two connections that never send the HTTP/2 preface take both slots, for a while.
    let mut silent = Vec::new();
    for _ in 0..2 {
        silent.push(tokio::net::TcpStream::connect(h.addr).await.unwrap());
    }
    for conn in &mut silent {
        // The server's own preface (its SETTINGS), then the end.
        let mut sent = Vec::new();
        let closed = tokio::time::timeout(WAIT, conn.read_to_end(&mut sent)).await;
        assert!(matches!(closed, Ok(Ok(_) | Err(_))), "closed: {closed:?}");
    }
    h.until_metric("both silent connections counted", |m| {
        m.xds_connections_silent_total.load(Ordering::Relaxed) == 2
    })
    .await;
    // Their slots are free: a proxy is served.
    let mut proxy = h.ads("proxy-1").await;
    proxy.subscribe(CLUSTER_TYPE_URL, &["hello.vip"]).await;
    assert_eq!(names(&proxy.recv().await), ["hello.vip"]);
    h.stop().await;
}

#[tokio::test]
async fn connections_that_open_no_stream_are_closed_after_the_first_request_timeout() {
    use tokio::io::AsyncWriteExt;
    let within = Duration::from_millis(500);
    let config = XdsConfig {
        max_connections: 2,
        first_request_timeout: within,
        ..XdsConfig::default()
    };
    let h = Harness::start_with(vec![inst("hello", "10.0.0.1", Status::Up)], config).await;
    // A proxy whose stream is open stays, well past the deadline.
    let mut proxy = h.ads("proxy-1").await;
    proxy.subscribe(CLUSTER_TYPE_URL, &["hello.vip"]).await;
    assert_eq!(names(&proxy.recv().await), ["hello.vip"]);
    // A client that sends the preface, its settings and then a ping every 100 ms, and never
    // a request, takes the other slot until the deadline.
    let mut idle = tokio::net::TcpStream::connect(h.addr).await.unwrap();
    let mut hello = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    hello.extend([0, 0, 0, 0x4, 0, 0, 0, 0, 0]); // SETTINGS, empty
    idle.write_all(&hello).await.unwrap();
    let pinging = tokio::spawn(async move {
        let ping = [0, 0, 8, 0x6, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8];
        while idle.write_all(&ping).await.is_ok() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    h.until_metric("the idle connection closed and counted", |m| {
        m.xds_connections_idle_total.load(Ordering::Relaxed) == 1
    })
    .await;
    tokio::time::timeout(WAIT, pinging)
        .await
        .expect("its writes fail once it is closed")
        .unwrap();
    // Its slot is free, and the proxy is still served.
    let mut other = h.ads("proxy-2").await;
    other.subscribe(CLUSTER_TYPE_URL, &["hello.vip"]).await;
    assert_eq!(names(&other.recv().await), ["hello.vip"]);
    tokio::time::sleep(within).await;
    proxy.subscribe(CLUSTER_TYPE_URL, &["other.vip"]).await;
    assert_eq!(
        names(&proxy.recv().await),
        ["hello.vip"],
        "its endpoints, then"
    );
    assert_eq!(names(&proxy.recv().await), ["other.vip"]);
    assert_eq!(
        h.metrics.xds_connections_idle_total.load(Ordering::Relaxed),
        1
    );
    h.stop().await;
}

#[tokio::test]
async fn a_name_beyond_the_servers_subscription_bound_waits_and_is_pushed_once_there_is_room() {
    let config = XdsConfig {
        max_subscriptions: 1,
        ..XdsConfig::default()
    };
    let h = Harness::start_with(vec![inst("hello", "10.0.0.1", Status::Up)], config).await;
    let mut a = h.ads("proxy-a").await;
    a.subscribe(CLUSTER_TYPE_URL, &["hello.vip"]).await;
    // The cluster and, right behind it, its endpoints: one cluster subscription.
    assert_eq!(names(&a.recv().await), ["hello.vip"]);
    assert_eq!(names(&a.recv().await), ["hello.vip"]);

    // No room for proxy-b's name: a removal now (its first request fails fast)...
    let mut b = h.ads("proxy-b").await;
    b.subscribe(CLUSTER_TYPE_URL, &["hello.vip"]).await;
    let waiting = b.recv().await;
    assert!(waiting.resources.is_empty());
    assert_eq!(waiting.removed_resources, ["hello.vip"]);
    assert_eq!(h.metrics.xds_names_waiting_total.load(Ordering::Relaxed), 1);
    h.until_proxy("proxy-b", |p| p.waiting == 1).await;

    // ...and the cluster, with its endpoints, once proxy-a's stream gives its room back,
    // without a new subscribe from proxy-b (Envoy stays subscribed to a removed name); even
    // while proxy-b keeps talking (an empty request every 200 ms must not hold the retry off).
    drop(a);
    let pushed = wait_ok(WAIT, "the waiting name to be pushed", async || {
        b.send(DeltaDiscoveryRequest {
            type_url: CLUSTER_TYPE_URL.into(),
            ..Default::default()
        })
        .await;
        match tokio::time::timeout(Duration::from_millis(200), b.inbound.message()).await {
            Ok(message) => Ok(message.unwrap().unwrap()),
            Err(_) => Err("no answer within 200 ms"),
        }
    })
    .await;
    assert_eq!(names(&pushed), ["hello.vip"]);
    assert_eq!(names(&b.recv().await), ["hello.vip"]);
    h.until_proxy("proxy-b", |p| p.waiting == 0).await;
    h.stop().await;
}

#[tokio::test]
async fn a_request_of_many_names_is_answered_whole_from_the_heavy_lane_and_closing_frees_them() {
    let h = Harness::start(vec![
        inst("hello", "10.0.0.1", Status::Up),
        inst("world", "10.0.0.2", Status::Up),
    ])
    .await;
    let mut envoy = h.ads("envoy-1").await;
    let heavy = || h.metrics.xds_heavy_jobs_total.load(Ordering::Relaxed);

    // A reconnecting proxy's share of names (or a flood's): more than an async worker handles
    // for one stream at a time.
    let mut many: Vec<String> = (0..999).map(|i| format!("nobody-{i:03}.vip")).collect();
    many.push("hello.vip".to_owned());
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    envoy.subscribe(CLUSTER_TYPE_URL, &many).await;
    let clusters = envoy.recv().await;
    // Every name is answered: hello.vip and the 100 unregistered names the stream may hold
    // with a cluster, the others with a removal.
    assert_eq!(clusters.resources.len(), 101);
    assert_eq!(clusters.removed_resources.len(), 899);
    assert!(names(&clusters).contains(&"hello.vip"));
    let endpoints = envoy.recv().await;
    assert_eq!(endpoints.type_url, ENDPOINTS_TYPE_URL);
    assert_eq!(endpoints.resources.len(), 101);
    assert_eq!(heavy(), 1, "one heavy job: the big request");

    // A small request (and every ACK) is handled on the async workers.
    envoy.subscribe(CLUSTER_TYPE_URL, &["world.vip"]).await;
    assert_eq!(names(&envoy.recv().await), ["world.vip"]);
    assert_eq!(names(&envoy.recv().await), ["world.vip"]);
    assert_eq!(heavy(), 1);

    // Closing the stream forgets its thousand names, a heavy job too.
    drop(envoy);
    h.until_metric("the closed stream's names to be forgotten", |m| {
        m.xds_subscriptions.load(Ordering::Relaxed) == 0
            && m.xds_cluster_subscriptions.load(Ordering::Relaxed) == 0
    })
    .await;
    assert_eq!(h.cache.watched(), 0);
    assert_eq!(heavy(), 2);
    h.stop().await;
}
