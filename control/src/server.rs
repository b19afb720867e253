//! The xDS gRPC server: delta ADS, plus delta CDS and EDS, over the [`Cache`].
//!
//! The only layer that knows tonic and streams. Each stream runs as one task that
//! - reads requests: subscribes and unsubscribes names per type, counts ACKs and NACKs (by
//!   `response_nonce`; a NACK is logged with Envoy's message and never answered by a re-send),
//!   and answers new subscriptions at once;
//! - wakes on every cache generation and pushes, as delta updates, only the subscribed
//!   resources whose version changed: clusters first, then their load assignments.
//!
//! State-of-the-world methods answer `UNIMPLEMENTED`: on-demand cluster discovery needs delta
//! xDS. See [`cache`](crate::cache) for the protocol rules, wildcard and invalid-name policy.
//!
//! For the admin, [`XdsServer::proxies`] lists each connected stream: node, since when, what
//! it subscribed to, and its last NACK.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use envoy_types::pb::envoy::service::cluster::v3::cluster_discovery_service_server::{
    ClusterDiscoveryService, ClusterDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::envoy::service::endpoint::v3::endpoint_discovery_service_server::{
    EndpointDiscoveryService, EndpointDiscoveryServiceServer,
};
use odmesh_names::parse_cluster_name;
use serde::Serialize;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status, Streaming};
use tracing::{debug, info, warn};

use crate::cache::{Cache, Delta, SubscriptionLimits, Subscriptions};
use crate::listen::ConnectionLimit;
use crate::logs::{self, RateLimit, clip};
use crate::metrics::Metrics;
use crate::xds::ResourceType;

/// Responses a stream may have queued before its task waits for the proxy to read.
const STREAM_BUFFER: usize = 16;
/// HTTP/2 pings on idle connections, so a vanished proxy's stream is noticed and dropped.
const KEEPALIVE: Duration = Duration::from_secs(30);
/// How long a client may take to complete its TLS handshake.
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// At most so many bytes of a proxy's node id, node cluster and nonces are kept.
const MAX_NODE_FIELD: usize = 256;
/// At most so many bytes of a NACK's message are kept and logged.
const MAX_NACK_MESSAGE: usize = 4096;
/// The largest request the server decodes (tonic's default): bounds the names one request
/// can subscribe.
const MAX_REQUEST_BYTES: usize = 4 * 1024 * 1024;

/// Bounds and transport security of the xDS server.
#[derive(Clone, Debug)]
pub struct XdsConfig {
    /// What one stream may subscribe (per type).
    pub subscriptions: SubscriptionLimits,
    /// Connections served at once; one more is closed as soon as it is accepted.
    pub max_connections: usize,
    /// HTTP/2 streams one connection may open at once (Envoy needs one, for ADS).
    pub max_streams_per_connection: u32,
    /// Subscribed names over all streams and both types; beyond, new names are answered
    /// with a removal. Bounds the cache, whatever the number of streams.
    pub max_subscriptions: usize,
    /// TLS (and, with a client CA, mTLS) on the gRPC server; `None` for plaintext.
    pub tls: Option<tonic::transport::ServerTlsConfig>,
}

impl Default for XdsConfig {
    /// Plaintext; 10,000 connections of at most 8 streams; [`SubscriptionLimits::default`]
    /// per stream, 5,000,000 subscriptions in all.
    fn default() -> XdsConfig {
        XdsConfig {
            subscriptions: SubscriptionLimits::default(),
            max_connections: 10_000,
            max_streams_per_connection: 8,
            max_subscriptions: 5_000_000,
            tls: None,
        }
    }
}

/// Why the xDS server stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The gRPC transport failed (accepting connections, HTTP/2).
    #[error("xDS gRPC server failed: {0}")]
    Transport(#[from] tonic::transport::Error),
}

/// Handle to the xDS server: the gRPC services, and the admin's view of connected proxies.
/// Cheap to clone; every clone is the same server.
#[derive(Clone, Debug)]
pub struct XdsServer {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    cache: Arc<Cache>,
    metrics: Arc<Metrics>,
    config: XdsConfig,
    streams: Mutex<BTreeMap<u64, Arc<Mutex<StreamState>>>>,
    next_stream_id: AtomicU64,
    /// Set to `true` on shutdown: every stream task ends, so graceful shutdown is not held up
    /// by xDS streams, which never end on their own.
    closing: watch::Sender<bool>,
}

/// One connected stream, as the admin's `/debug/proxies` shows it.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ProxyStatus {
    /// Unique per stream since start.
    pub stream_id: u64,
    /// `ads`, `cds` or `eds`: which gRPC service the stream uses.
    pub service: &'static str,
    /// `node.id` from the proxy's first request (empty until it sends one).
    pub node_id: String,
    /// `node.cluster` from the proxy's first request.
    pub node_cluster: String,
    /// When the stream opened, in seconds since the Unix epoch.
    pub connected_since_unix: u64,
    /// Subscribed `Cluster` names, sorted.
    pub clusters: Vec<String>,
    /// Subscribed `ClusterLoadAssignment` names, sorted.
    pub endpoints: Vec<String>,
    /// Responses the proxy accepted.
    pub acks: u64,
    /// Responses the proxy rejected.
    pub nacks: u64,
    /// The last rejection, with Envoy's message.
    pub last_nack: Option<NackStatus>,
    /// Names answered with a removal because they were over the stream's bounds.
    pub refused: u64,
}

/// A response a proxy rejected.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct NackStatus {
    /// `cluster` or `endpoints`.
    pub resource_type: &'static str,
    /// The nonce of the rejected response.
    pub nonce: String,
    /// Envoy's error message.
    pub message: String,
    /// When it arrived, in seconds since the Unix epoch.
    pub at_unix: u64,
}

/// Which gRPC service a stream came in on; decides the types it may ask for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Service {
    Ads,
    Cds,
    Eds,
}

impl Service {
    const fn as_str(self) -> &'static str {
        match self {
            Service::Ads => "ads",
            Service::Cds => "cds",
            Service::Eds => "eds",
        }
    }

    /// The type of a request on this service; a standalone service may leave `type_url` empty.
    fn resource_type(self, type_url: &str) -> Option<ResourceType> {
        let ty = match (self, type_url) {
            (Service::Cds, "") => return Some(ResourceType::Cluster),
            (Service::Eds, "") => return Some(ResourceType::Endpoints),
            _ => ResourceType::from_type_url(type_url)?,
        };
        self.serves(ty).then_some(ty)
    }

    fn serves(self, ty: ResourceType) -> bool {
        match self {
            Service::Ads => true,
            Service::Cds => ty == ResourceType::Cluster,
            Service::Eds => ty == ResourceType::Endpoints,
        }
    }
}

/// Everything one stream knows; the stream task changes it, the admin reads it.
#[derive(Debug)]
struct StreamState {
    id: u64,
    service: Service,
    connected_since: SystemTime,
    node_id: String,
    node_cluster: String,
    clusters: Subscriptions,
    endpoints: Subscriptions,
    next_nonce: u64,
    acks: u64,
    nacks: u64,
    last_nack: Option<NackStatus>,
    refused: u64,
    wildcard_warned: bool,
}

impl StreamState {
    fn new(id: u64, service: Service, limits: SubscriptionLimits) -> StreamState {
        StreamState {
            id,
            service,
            connected_since: SystemTime::now(),
            node_id: String::new(),
            node_cluster: String::new(),
            clusters: Subscriptions::with_limits(limits),
            endpoints: Subscriptions::with_limits(limits),
            next_nonce: 1,
            acks: 0,
            nacks: 0,
            last_nack: None,
            refused: 0,
            wildcard_warned: false,
        }
    }

    fn subs(&mut self, ty: ResourceType) -> &mut Subscriptions {
        match ty {
            ResourceType::Cluster => &mut self.clusters,
            ResourceType::Endpoints => &mut self.endpoints,
        }
    }

    fn status(&self) -> ProxyStatus {
        ProxyStatus {
            stream_id: self.id,
            service: self.service.as_str(),
            node_id: self.node_id.clone(),
            node_cluster: self.node_cluster.clone(),
            connected_since_unix: unix_seconds(self.connected_since),
            clusters: self.clusters.names().map(str::to_owned).collect(),
            endpoints: self.endpoints.names().map(str::to_owned).collect(),
            acks: self.acks,
            nacks: self.nacks,
            last_nack: self.last_nack.clone(),
            refused: self.refused,
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section leaves the data consistent, so a poisoned lock is still usable.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn unix_seconds(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

impl XdsServer {
    /// A server answering from `cache`, counting into `metrics`, with the default
    /// [`XdsConfig`].
    pub fn new(cache: Arc<Cache>, metrics: Arc<Metrics>) -> XdsServer {
        XdsServer::with_config(cache, metrics, XdsConfig::default())
    }

    /// A server answering from `cache`, counting into `metrics`, bounded by `config`.
    pub fn with_config(cache: Arc<Cache>, metrics: Arc<Metrics>, config: XdsConfig) -> XdsServer {
        let (closing, _) = watch::channel(false);
        XdsServer {
            shared: Arc::new(Shared {
                cache,
                metrics,
                config,
                streams: Mutex::new(BTreeMap::new()),
                next_stream_id: AtomicU64::new(1),
                closing,
            }),
        }
    }

    /// The cache this server answers from.
    pub fn cache(&self) -> &Arc<Cache> {
        &self.shared.cache
    }

    /// Every connected stream, oldest first.
    pub fn proxies(&self) -> Vec<ProxyStatus> {
        let streams: Vec<_> = lock(&self.shared.streams).values().cloned().collect();
        streams.iter().map(|s| lock(s).status()).collect()
    }

    /// The gRPC services (delta ADS, CDS, EDS), for a caller that runs its own tonic server.
    pub fn routes(&self) -> tonic::service::Routes {
        tonic::service::Routes::new(
            AggregatedDiscoveryServiceServer::new(self.clone())
                .max_decoding_message_size(MAX_REQUEST_BYTES),
        )
        .add_service(
            ClusterDiscoveryServiceServer::new(self.clone())
                .max_decoding_message_size(MAX_REQUEST_BYTES),
        )
        .add_service(
            EndpointDiscoveryServiceServer::new(self.clone())
                .max_decoding_message_size(MAX_REQUEST_BYTES),
        )
    }

    /// Serves xDS on `listener` (with `TCP_NODELAY`) until `shutdown` completes; then ends
    /// every stream and returns once connections are closed. Connections over
    /// [`XdsConfig::max_connections`] are closed when accepted (metric
    /// `xds_connections_refused_total`).
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), ServeError> {
        let config = &self.shared.config;
        if let Ok(addr) = listener.local_addr() {
            let security = match &config.tls {
                Some(_) => "TLS",
                None => "plaintext",
            };
            info!(%addr, security, "xDS server listening (delta ADS, CDS, EDS)");
        }
        let incoming = TcpIncoming::from(listener)
            .with_nodelay(Some(true))
            .with_keepalive(Some(KEEPALIVE));
        let metrics = self.shared.metrics.clone();
        let incoming = ConnectionLimit::new(config.max_connections).incoming(incoming, move || {
            Metrics::inc(&metrics.xds_connections_refused_total);
        });
        let shared = self.shared.clone();
        let signal = async move {
            shutdown.await;
            shared.closing.send_replace(true);
        };
        let mut builder = tonic::transport::Server::builder()
            .http2_keepalive_interval(Some(KEEPALIVE))
            .max_concurrent_streams(Some(config.max_streams_per_connection));
        if let Some(tls) = &config.tls {
            builder = builder.tls_config(tls.clone().timeout(TLS_HANDSHAKE_TIMEOUT))?;
        }
        builder
            .add_routes(self.routes())
            .serve_with_incoming_shutdown(incoming, signal)
            .await?;
        Ok(())
    }

    /// Opens a stream: registers its state and spawns its task.
    fn open(
        &self,
        service: Service,
        inbound: Streaming<DeltaDiscoveryRequest>,
    ) -> ReceiverStream<Result<DeltaDiscoveryResponse, Status>> {
        let shared = &self.shared;
        let id = shared.next_stream_id.fetch_add(1, Ordering::Relaxed);
        let state = Arc::new(Mutex::new(StreamState::new(
            id,
            service,
            shared.config.subscriptions,
        )));
        lock(&shared.streams).insert(id, state.clone());
        Metrics::inc(&shared.metrics.xds_streams_total);
        shared
            .metrics
            .xds_streams_active
            .fetch_add(1, Ordering::Relaxed);
        debug!(stream = id, service = service.as_str(), "xDS stream opened");

        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        let stream = StreamTask {
            shared: shared.clone(),
            state,
            service,
        };
        tokio::spawn(stream.run(inbound, tx));
        ReceiverStream::new(rx)
    }
}

/// One stream's task. Dropping it (the task ended, however) unregisters the stream.
struct StreamTask {
    shared: Arc<Shared>,
    state: Arc<Mutex<StreamState>>,
    service: Service,
}

type Outbound = mpsc::Sender<Result<DeltaDiscoveryResponse, Status>>;

impl StreamTask {
    async fn run(self, mut inbound: Streaming<DeltaDiscoveryRequest>, tx: Outbound) {
        let mut changes = self.shared.cache.changes();
        changes.borrow_and_update();
        let mut closing = self.shared.closing.subscribe();
        if *closing.borrow_and_update() {
            return;
        }
        loop {
            let responses = tokio::select! {
                msg = inbound.message() => match msg {
                    Ok(Some(req)) => self.on_request(req),
                    Ok(None) => break,
                    Err(status) => {
                        debug!(stream = self.id(), %status, "xDS stream failed");
                        break;
                    }
                },
                changed = changes.changed() => {
                    if changed.is_err() {
                        break;
                    }
                    changes.borrow_and_update();
                    self.on_change()
                }
                _ = closing.changed() => break,
            };
            for response in responses.into_iter().flatten() {
                // A proxy that stops reading fills the stream's buffer; shutdown must still
                // end this task rather than wait on the send.
                tokio::select! {
                    sent = tx.send(Ok(response)) => if sent.is_err() { return },
                    _ = closing.changed() => return,
                }
            }
        }
    }

    fn id(&self) -> u64 {
        lock(&self.state).id
    }

    /// Handles one request; returns the response for the request's type, if one is due, and,
    /// for new `Cluster` subscriptions on ADS, the load assignments that go with them.
    fn on_request(&self, req: DeltaDiscoveryRequest) -> [Option<DeltaDiscoveryResponse>; 2] {
        let mut state = lock(&self.state);
        let Some((ty, added)) = self.apply_request(&mut state, req) else {
            return [None, None];
        };
        let first = self.respond(&mut state, ty);
        // Envoy subscribes to an EDS cluster's load assignment only once it has accepted the
        // cluster: one more round trip (request, answer) before the cluster is warm, which the
        // first request to it waits for. On ADS, odmesh sends the load assignments of newly
        // subscribed clusters right behind them, as if Envoy had already asked. Envoy handles
        // the responses of one stream in order, so the cluster's EDS subscription exists when
        // its load assignment arrives; Envoy's own subscribe, which follows, is not answered
        // again (see `Subscriptions::presubscribe`).
        if ty != ResourceType::Cluster || self.service != Service::Ads || added.is_empty() {
            return [first, None];
        }
        // Only names answered with a cluster: Envoy never subscribes to the load assignment
        // of a name answered with a removal (refused, or not an odmesh cluster name), so such
        // a presubscription would never be taken up.
        let added: Vec<String> = (added.into_iter())
            .filter(|name| !state.clusters.is_refused(name) && parse_cluster_name(name).is_ok())
            .collect();
        let presubscribed = state.endpoints.presubscribe(&added);
        (self.shared.metrics.xds_subscriptions)
            .fetch_add(presubscribed.len() as u64, Ordering::Relaxed);
        self.shared.cache.watch(&presubscribed);
        [first, self.respond(&mut state, ResourceType::Endpoints)]
    }

    /// Applies one request to the stream's state: node, ACK/NACK, subscription changes. Returns
    /// its type and the names it newly subscribed that the client has no version of, when the
    /// subscriptions changed.
    fn apply_request(
        &self,
        state: &mut StreamState,
        req: DeltaDiscoveryRequest,
    ) -> Option<(ResourceType, Vec<String>)> {
        let metrics = &self.shared.metrics;
        Metrics::inc(&metrics.xds_requests_total);
        if let Some(node) = &req.node
            && state.node_id.is_empty()
        {
            // Kept for the admin: bounded, whatever the client sent.
            state.node_id = logs::truncated(&node.id, MAX_NODE_FIELD);
            state.node_cluster = logs::truncated(&node.cluster, MAX_NODE_FIELD);
            info!(stream = state.id, node = %clip(&node.id), service = self.service.as_str(), "proxy connected");
        }
        let Some(ty) = self.service.resource_type(&req.type_url) else {
            debug!(stream = state.id, type_url = %req.type_url, "ignoring a request for a type odmesh does not serve");
            return None;
        };

        // Rule: a request that carries the `response_nonce` of a response acknowledges it;
        // with `error_detail` set it rejects it (NACK), and the client keeps what it had.
        if !req.response_nonce.is_empty() {
            match &req.error_detail {
                None => {
                    state.acks += 1;
                    Metrics::inc(&metrics.xds_acks_total);
                }
                Some(error) => {
                    state.nacks += 1;
                    Metrics::inc(&metrics.xds_nacks_total);
                    static LOG: RateLimit = logs::per_second();
                    if let Some(suppressed) = LOG.check() {
                        warn!(
                            suppressed,
                            stream = state.id,
                            node = %clip(&state.node_id),
                            resource_type = ty.as_str(),
                            nonce = %clip(&req.response_nonce),
                            error = %logs::clip_at(&error.message, MAX_NACK_MESSAGE),
                            "proxy rejected an xDS response (NACK); it is sent again only when it changes"
                        );
                    }
                    state.last_nack = Some(NackStatus {
                        resource_type: ty.as_str(),
                        nonce: logs::truncated(&req.response_nonce, MAX_NODE_FIELD),
                        message: logs::truncated(&error.message, MAX_NACK_MESSAGE),
                        at_unix: unix_seconds(SystemTime::now()),
                    });
                }
            }
        }

        if req.resource_names_subscribe.is_empty() && req.resource_names_unsubscribe.is_empty() {
            return None;
        }
        let room = (self.shared.config.max_subscriptions)
            .saturating_sub(metrics.xds_subscriptions.load(Ordering::Relaxed) as usize);
        let change = state.subs(ty).update_within(
            &req.resource_names_subscribe,
            &req.resource_names_unsubscribe,
            &req.initial_resource_versions,
            room,
        );
        let total = &metrics.xds_subscriptions;
        total.fetch_add(change.added.len() as u64, Ordering::Relaxed);
        total.fetch_sub(change.removed.len() as u64, Ordering::Relaxed);
        if change.wildcard && !state.wildcard_warned {
            state.wildcard_warned = true;
            warn!(
                stream = state.id,
                node = %clip(&state.node_id),
                resource_type = ty.as_str(),
                "proxy asked for every resource (wildcard); odmesh serves named, on-demand subscriptions only"
            );
        }
        let cache = &self.shared.cache;
        cache.watch(&change.added);
        cache.unwatch(change.removed.iter().map(String::as_str));
        let mut refused = change.over_limit;
        if ty == ResourceType::Cluster {
            let gauge = &metrics.xds_cluster_subscriptions;
            gauge.fetch_add(change.added.len() as u64, Ordering::Relaxed);
            gauge.fetch_sub(change.removed.len() as u64, Ordering::Relaxed);
            // A cluster dropped before Envoy subscribed to its load assignment: that subscribe
            // will never come, so the one made on its behalf goes too.
            let withdrawn = state.endpoints.withdraw_presubscribed(&change.removed);
            total.fetch_sub(withdrawn.len() as u64, Ordering::Relaxed);
            cache.unwatch(withdrawn.iter().map(String::as_str));
            // Every unregistered name is a cluster in Envoy for the stream's life: a client
            // sending random `Host`s must not grow that without bound.
            for name in &change.added {
                if cache.is_registered(name) == Some(false)
                    && !state.clusters.admit_unregistered(name)
                {
                    refused += 1;
                }
            }
        }
        if refused > 0 {
            state.refused += refused as u64;
            metrics
                .xds_names_refused_total
                .fetch_add(refused as u64, Ordering::Relaxed);
            static LOG: RateLimit = logs::per_second();
            if let Some(suppressed) = LOG.check() {
                warn!(
                    suppressed,
                    stream = state.id,
                    node = %clip(&state.node_id),
                    resource_type = ty.as_str(),
                    refused,
                    limits = ?self.shared.config.subscriptions,
                    "names over the stream's bounds answered with a removal"
                );
            }
        }
        let kept = req.initial_resource_versions.len();
        if kept > 0 && !cache.snapshot().is_complete() {
            info!(
                stream = state.id,
                node = %clip(&state.node_id),
                resource_type = ty.as_str(),
                kept,
                "proxy reconnected with resources it kept; they stay as they are until the registry is loaded"
            );
        }
        debug!(
            stream = state.id,
            resource_type = ty.as_str(),
            subscribed = req.resource_names_subscribe.len(),
            unsubscribed = req.resource_names_unsubscribe.len(),
            first = ?req.resource_names_subscribe.first().map(|n| clip(n)),
            "subscriptions changed"
        );
        // Names the client says it has (on reconnect) are not new to it: their load
        // assignments need no head start.
        let mut fresh = change.added;
        fresh.retain(|name| !req.initial_resource_versions.contains_key(name));
        Some((ty, fresh))
    }

    /// Pushes what changed in the cache, clusters before their load assignments.
    fn on_change(&self) -> [Option<DeltaDiscoveryResponse>; 2] {
        let mut state = lock(&self.state);
        ResourceType::ALL.map(|ty| {
            self.service
                .serves(ty)
                .then(|| self.respond(&mut state, ty))
                .flatten()
        })
    }

    /// The response bringing this stream's `ty` subscriptions up to date, if any is needed.
    fn respond(&self, state: &mut StreamState, ty: ResourceType) -> Option<DeltaDiscoveryResponse> {
        let cache = &self.shared.cache;
        let subs = state.subs(ty);
        if subs.is_idle() {
            return None;
        }
        let delta = cache.delta(ty, subs);
        if delta.is_empty() {
            return None;
        }
        subs.record(&delta);
        let nonce = state.next_nonce;
        state.next_nonce += 1;
        let metrics = &self.shared.metrics;
        Metrics::inc(&metrics.xds_responses_total);
        metrics
            .xds_resources_sent_total
            .fetch_add(delta.send.len() as u64, Ordering::Relaxed);
        debug!(
            stream = state.id,
            resource_type = ty.as_str(),
            nonce,
            sent = delta.send.len(),
            removed = delta.remove.len(),
            "sending delta response"
        );
        Some(response(ty, delta, nonce, cache.generation()))
    }
}

impl Drop for StreamTask {
    fn drop(&mut self) {
        let shared = &self.shared;
        let state = lock(&self.state);
        lock(&shared.streams).remove(&state.id);
        for subs in [&state.clusters, &state.endpoints] {
            shared.cache.unwatch(subs.names());
        }
        let metrics = &shared.metrics;
        metrics
            .xds_cluster_subscriptions
            .fetch_sub(state.clusters.len() as u64, Ordering::Relaxed);
        metrics.xds_subscriptions.fetch_sub(
            (state.clusters.len() + state.endpoints.len()) as u64,
            Ordering::Relaxed,
        );
        metrics.xds_streams_active.fetch_sub(1, Ordering::Relaxed);
        info!(stream = state.id, node = %clip(&state.node_id), "xDS stream closed");
    }
}

fn response(ty: ResourceType, delta: Delta, nonce: u64, generation: u64) -> DeltaDiscoveryResponse {
    DeltaDiscoveryResponse {
        system_version_info: generation.to_string(),
        resources: delta.send.iter().map(|r| r.to_resource()).collect(),
        type_url: ty.type_url().to_owned(),
        removed_resources: delta.remove,
        nonce: nonce.to_string(),
        ..Default::default()
    }
}

type DeltaStream = ReceiverStream<Result<DeltaDiscoveryResponse, Status>>;
type SotwStream = tokio_stream::Empty<Result<DiscoveryResponse, Status>>;

fn sotw_unimplemented() -> Status {
    Status::unimplemented(
        "odmesh serves delta xDS only (on-demand cluster discovery needs it); use DELTA_GRPC",
    )
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for XdsServer {
    type StreamAggregatedResourcesStream = SotwStream;
    type DeltaAggregatedResourcesStream = DeltaStream;

    async fn stream_aggregated_resources(
        &self,
        _: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<SotwStream>, Status> {
        Err(sotw_unimplemented())
    }

    async fn delta_aggregated_resources(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<DeltaStream>, Status> {
        Ok(Response::new(self.open(Service::Ads, request.into_inner())))
    }
}

#[tonic::async_trait]
impl ClusterDiscoveryService for XdsServer {
    type StreamClustersStream = SotwStream;
    type DeltaClustersStream = DeltaStream;

    async fn stream_clusters(
        &self,
        _: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<SotwStream>, Status> {
        Err(sotw_unimplemented())
    }

    async fn delta_clusters(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<DeltaStream>, Status> {
        Ok(Response::new(self.open(Service::Cds, request.into_inner())))
    }

    async fn fetch_clusters(
        &self,
        _: Request<DiscoveryRequest>,
    ) -> Result<Response<DiscoveryResponse>, Status> {
        Err(sotw_unimplemented())
    }
}

#[tonic::async_trait]
impl EndpointDiscoveryService for XdsServer {
    type StreamEndpointsStream = SotwStream;
    type DeltaEndpointsStream = DeltaStream;

    async fn stream_endpoints(
        &self,
        _: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<SotwStream>, Status> {
        Err(sotw_unimplemented())
    }

    async fn delta_endpoints(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<DeltaStream>, Status> {
        Ok(Response::new(self.open(Service::Eds, request.into_inner())))
    }

    async fn fetch_endpoints(
        &self,
        _: Request<DiscoveryRequest>,
    ) -> Result<Response<DiscoveryResponse>, Status> {
        Err(sotw_unimplemented())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Snapshot;
    use crate::registry::{Instance, Registry};
    use crate::xds::{CLUSTER_TYPE_URL, ENDPOINTS_TYPE_URL, XdsOptions};

    /// An ADS stream's task on a cache where `hello` has one instance, driven without gRPC.
    fn ads_stream() -> StreamTask {
        let hello = Instance {
            app: "HELLO".into(),
            instance_id: "hello-1".into(),
            ip: "10.0.0.1".parse().unwrap(),
            port: Some(8080),
            secure_port: None,
            vips: vec!["hello".into()],
            svips: vec![],
            status: crate::registry::Status::Up,
            zone: None,
        };
        let snapshot = Snapshot::from_registry(&Registry::from_iter([hello]));
        let cache = Cache::with_snapshot(XdsOptions::new(Some("/ca.pem".into())), snapshot.into());
        let server = XdsServer::new(Arc::new(cache), Arc::new(Metrics::default()));
        let state = StreamState::new(1, Service::Ads, SubscriptionLimits::default());
        StreamTask {
            shared: server.shared.clone(),
            state: Arc::new(Mutex::new(state)),
            service: Service::Ads,
        }
    }

    fn request(type_url: &str, subscribe: &[&str], unsubscribe: &[&str]) -> DeltaDiscoveryRequest {
        DeltaDiscoveryRequest {
            type_url: type_url.into(),
            resource_names_subscribe: subscribe.iter().map(|s| s.to_string()).collect(),
            resource_names_unsubscribe: unsubscribe.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    fn sent(response: &Option<DeltaDiscoveryResponse>) -> Vec<&str> {
        (response.iter())
            .flat_map(|r| &r.resources)
            .map(|r| r.name.as_str())
            .collect()
    }

    #[test]
    fn a_cluster_dropped_before_envoy_asked_for_its_endpoints_gets_them_when_asked_for_again() {
        let stream = ads_stream();
        // Envoy asks for hello.vip and drops it before the answer arrives: it ignores the
        // cluster, and the load assignment sent behind it.
        let [cluster, endpoints] =
            stream.on_request(request(CLUSTER_TYPE_URL, &["hello.vip"], &[]));
        assert_eq!(
            (sent(&cluster), sent(&endpoints)),
            (vec!["hello.vip"], vec!["hello.vip"])
        );
        stream.on_request(request(CLUSTER_TYPE_URL, &[], &["hello.vip"]));
        assert!(
            lock(&stream.state).status().endpoints.is_empty(),
            "Envoy will never subscribe to it now"
        );

        // It asks again, gets the cluster, and subscribes to the load assignment: it has it.
        let [cluster, endpoints] =
            stream.on_request(request(CLUSTER_TYPE_URL, &["hello.vip"], &[]));
        assert_eq!(
            (sent(&cluster), sent(&endpoints)),
            (vec!["hello.vip"], vec!["hello.vip"])
        );
        let [again, _] = stream.on_request(request(ENDPOINTS_TYPE_URL, &["hello.vip"], &[]));
        assert!(again.is_none(), "what was just sent is not sent again");
    }

    #[test]
    fn a_name_that_is_not_an_odmesh_cluster_gets_no_load_assignment_on_envoys_behalf() {
        let stream = ads_stream();
        let [cluster, endpoints] =
            stream.on_request(request(CLUSTER_TYPE_URL, &["xds_cluster"], &[]));
        assert_eq!(
            cluster.map(|r| r.removed_resources),
            Some(vec!["xds_cluster".to_owned()])
        );
        assert!(endpoints.is_none());
        assert!(lock(&stream.state).status().endpoints.is_empty());
    }

    #[test]
    fn each_service_serves_only_its_own_types() {
        assert_eq!(
            Service::Ads.resource_type(CLUSTER_TYPE_URL),
            Some(ResourceType::Cluster)
        );
        assert_eq!(
            Service::Ads.resource_type(ENDPOINTS_TYPE_URL),
            Some(ResourceType::Endpoints)
        );
        assert_eq!(Service::Ads.resource_type(""), None);
        assert_eq!(Service::Cds.resource_type(""), Some(ResourceType::Cluster));
        assert_eq!(Service::Cds.resource_type(ENDPOINTS_TYPE_URL), None);
        assert_eq!(
            Service::Eds.resource_type(""),
            Some(ResourceType::Endpoints)
        );
        assert_eq!(
            Service::Ads.resource_type("type.googleapis.com/envoy.config.listener.v3.Listener"),
            None
        );
    }
}
