//! The xDS gRPC server: delta ADS, plus delta CDS and EDS, over the [`Cache`].
//!
//! The only layer that knows tonic and streams. Each stream runs as one task over a
//! [`Session`] (the stream's protocol, without the transport) that
//! - reads requests and hands each to the session, which subscribes and unsubscribes names
//!   per type, counts ACKs and NACKs, and answers new subscriptions at once;
//! - wakes when the cache puts a change for it in its [`Inbox`] (only changes to names it
//!   subscribes) and sends what the session says changed: clusters first, then their load
//!   assignments.
//!
//! tonic serves the connections and every method; the delta streams' messages are framed by
//! `server/framing.rs` instead of tonic's codec, so that a connected proxy holds no buffer
//! between its messages.
//!
//! State-of-the-world methods answer `UNIMPLEMENTED`: on-demand cluster discovery needs delta
//! xDS. See [`cache`](crate::cache) for the protocol rules, wildcard and invalid-name policy.
//!
//! For the admin, [`XdsServer::proxies`] lists each connected stream: node, since when, what
//! it subscribed to, and its last NACK.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

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
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::{Stream, StreamExt};
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status, Streaming};
use tracing::{debug, info};

use crate::cache::{Cache, Changes, Inbox, Stamps};
use crate::lrs::LoadReports;
use crate::metrics::Metrics;
use crate::prewarm::Prewarm;
use crate::session::SubscriptionLimits;
use crate::session::{Admission, Context, Eviction, Service, Session, WILDCARD};
use crate::xds::ResourceType;
use odmesh_base::first_request::FirstRequest;
use odmesh_base::listen::{ConnectionLimit, tls_handshakes};
use odmesh_base::logs::clip;
use odmesh_base::metrics::{inc, observe};
use odmesh_base::tls::ServerTls;

pub use crate::session::{NackStatus, ProxyStatus};

mod framing;

use framing::DeltaFraming;

/// Responses a stream may have queued before its task waits for the proxy to read.
const STREAM_BUFFER: usize = 16;
/// Names a request or a change may touch and still be handled on the async workers, which all
/// streams share: one slice of the cache's. A heavier one (a reconnecting proxy's thousands of
/// names, a flood) runs on a blocking thread of the heavy lane, so that it holds up no other
/// stream's small request (docs/benchmarks.md, section 9).
const INLINE_NAMES: usize = crate::cache::SLICE;
/// How often a stream whose cluster names wait for room looks for room again.
const WAITING_RETRY: Duration = Duration::from_secs(1);
/// HTTP/2 pings on idle connections, so a vanished proxy's stream is noticed and dropped.
const KEEPALIVE: Duration = Duration::from_secs(30);
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
    /// Of `max_connections`, connections at once from one address; more are closed when
    /// accepted (metric `xds_connections_refused_source_total`).
    pub max_connections_per_source: usize,
    /// HTTP/2 streams one connection may open at once (Envoy needs one, for ADS).
    pub max_streams_per_connection: u32,
    /// Cluster names subscribed over all streams (each with its load assignment); beyond,
    /// new names wait for room (answered with a removal meanwhile, pushed once there is
    /// room). Bounds the cache, whatever the number of streams. Names a reconnecting proxy
    /// says it holds need no room.
    pub max_subscriptions: usize,
    /// Of `max_subscriptions`, the cluster names the streams of one source address may hold
    /// together (see [`Admission`]).
    pub max_subscriptions_per_source: usize,
    /// Names of either type all streams track together, however each stands; new names
    /// beyond are answered with a removal and not tracked (see [`Admission`]).
    pub max_names_total: usize,
    /// Of `max_names_total`, the names the streams of one source address track together.
    pub max_names_per_source: usize,
    /// TLS (and, with a client CA, mTLS) on the gRPC server, each new connection with the
    /// certificate, key and client CA in force when it arrives ([`ServerTls::reload`]);
    /// `None` for plaintext.
    pub tls: Option<Arc<ServerTls>>,
    /// How long a client may take to complete its TLS handshake.
    pub tls_handshake_timeout: Duration,
    /// How long a connection may take to send its first bytes (the HTTP/2 preface, or the
    /// TLS handshake's first message); one that sends nothing is closed then, so silent
    /// connections cannot hold every slot.
    pub first_bytes_timeout: Duration,
    /// How long a connection may take to open its first HTTP/2 stream (a request); one that
    /// opens none is closed then (metric `xds_connections_idle_total`).
    pub first_request_timeout: Duration,
    /// The request history that connecting proxies are prewarmed from and that on-demand
    /// requests and load reports are recorded into; `None`: prewarm is off, and the load
    /// reporting service is not served.
    pub prewarm: Option<Arc<Prewarm>>,
    /// How often proxies are asked for their load reports.
    pub load_report_interval: Duration,
    /// Clusters sent ahead that carried no request for this long are removed from the proxy
    /// (it asks for them again when needed); `None`: never. Needs `prewarm`.
    pub idle_cluster_timeout: Option<Duration>,
}

impl Default for XdsConfig {
    /// Plaintext; 10,000 connections (256 from one address) of at most 8 streams; [`SubscriptionLimits::default`]
    /// per stream, 1,000,000 cluster subscriptions in all, 100,000 per source address;
    /// 4,000,000 names tracked in all, 400,000 per source address.
    fn default() -> XdsConfig {
        XdsConfig {
            subscriptions: SubscriptionLimits::default(),
            max_connections: 10_000,
            max_connections_per_source: 256,
            max_streams_per_connection: 8,
            max_subscriptions: 1_000_000,
            max_subscriptions_per_source: 100_000,
            max_names_total: 4_000_000,
            max_names_per_source: 400_000,
            tls: None,
            tls_handshake_timeout: Duration::from_secs(10),
            first_bytes_timeout: Duration::from_secs(10),
            first_request_timeout: Duration::from_secs(10),
            prewarm: None,
            load_report_interval: Duration::from_secs(30),
            idle_cluster_timeout: None,
        }
    }
}

/// Why the xDS server stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The gRPC transport failed (accepting connections, HTTP/2).
    #[error("xDS gRPC server failed")]
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
    /// The bound over all streams, `config.max_subscriptions`.
    admission: Admission,
    streams: Mutex<BTreeMap<u64, Arc<Mutex<Session>>>>,
    next_stream_id: AtomicU64,
    /// The heavy lane: a permit per heavy job running at once (see [`INLINE_NAMES`]).
    heavy_lane: Arc<Semaphore>,
    /// Set to `true` on shutdown: every stream task ends, so graceful shutdown is not held up
    /// by xDS streams, which never end on their own.
    closing: watch::Sender<bool>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section leaves the data consistent, so a poisoned lock is still usable.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Heavy jobs that run at once: half the cores, at least one; the async workers keep the
/// rest (the OS shares the cores between them).
fn heavy_lanes() -> usize {
    std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).max(1))
}

impl Shared {
    /// Runs `job` in the heavy lane: on a blocking thread, once one of the [`heavy_lanes`]
    /// permits is free, after the heavy jobs of other streams that waited before it. `None`
    /// if the runtime shuts down first.
    async fn in_heavy_lane<R: Send + 'static>(
        &self,
        job: impl FnOnce() -> R + Send + 'static,
    ) -> Option<R> {
        let permit = self.heavy_lane.clone().acquire_owned().await.ok()?;
        inc(&self.metrics.xds_heavy_jobs_total);
        let job = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            job()
        });
        match job.await {
            Ok(done) => Some(done),
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(_) => None,
        }
    }

    fn context(&self) -> Context<'_> {
        Context {
            cache: &self.cache,
            metrics: &self.metrics,
            admission: &self.admission,
            prewarm: self.config.prewarm.as_deref(),
            eviction: (self.config.idle_cluster_timeout).map(|idle| Eviction {
                idle,
                interval: self.config.load_report_interval,
            }),
        }
    }
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
                admission: Admission::with_share(
                    config.max_subscriptions,
                    config.max_subscriptions_per_source,
                )
                .tracking(config.max_names_total, config.max_names_per_source),
                config,
                streams: Mutex::new(BTreeMap::new()),
                next_stream_id: AtomicU64::new(1),
                heavy_lane: Arc::new(Semaphore::new(heavy_lanes())),
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

    /// The gRPC services (delta ADS, CDS, EDS, RDS, ECDS; with prewarm, load reporting), for a caller
    /// that runs its own tonic server.
    pub fn routes(&self) -> tonic::service::Routes {
        // The delta methods with odmesh's own framing (see `framing`), the rest through tonic.
        let routes = tonic::service::Routes::new(DeltaFraming::new(
            AggregatedDiscoveryServiceServer::new(self.clone())
                .max_decoding_message_size(MAX_REQUEST_BYTES),
            self.clone(),
        ))
        .add_service(DeltaFraming::new(
            ClusterDiscoveryServiceServer::new(self.clone())
                .max_decoding_message_size(MAX_REQUEST_BYTES),
            self.clone(),
        ))
        .add_service(DeltaFraming::new(
            EndpointDiscoveryServiceServer::new(self.clone())
                .max_decoding_message_size(MAX_REQUEST_BYTES),
            self.clone(),
        ));
        let shared = &self.shared;
        let sotw = crate::routes::Routes::new(
            shared.cache.clone(),
            shared.metrics.clone(),
            shared.closing.subscribe(),
        );
        let routes = routes
            .add_service(
                sotw.clone()
                    .into_service()
                    .max_decoding_message_size(MAX_REQUEST_BYTES),
            )
            .add_service(
                sotw.into_extension_service()
                    .max_decoding_message_size(MAX_REQUEST_BYTES),
            );
        match &shared.config.prewarm {
            Some(prewarm) => routes.add_service(
                LoadReports::new(
                    prewarm.clone(),
                    shared.cache.clone(),
                    shared.metrics.clone(),
                    shared.config.load_report_interval,
                    shared.closing.subscribe(),
                )
                .into_service()
                .max_decoding_message_size(MAX_REQUEST_BYTES),
            ),
            None => routes,
        }
    }

    /// Serves xDS on `listener` (with `TCP_NODELAY`) until `shutdown` completes; then ends
    /// every stream and returns once connections are closed. Connections over
    /// [`XdsConfig::max_connections`] are closed when accepted (metric
    /// `xds_connections_refused_total`). With TLS, each connection's handshake runs on its
    /// own task, with the configuration in force when it arrived: a reloaded certificate
    /// serves new connections, and open ones keep theirs.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), ServeError> {
        let config = &self.shared.config;
        if let Ok(addr) = listener.local_addr() {
            let security = match &config.tls {
                Some(tls) if tls.files().client_ca.is_some() => "mutual TLS",
                Some(_) => "TLS",
                None => "plaintext",
            };
            info!(%addr, security, "xDS server listening (delta ADS, CDS, EDS)");
        }
        let incoming = TcpIncoming::from(listener)
            .with_nodelay(Some(true))
            .with_keepalive(Some(KEEPALIVE));
        let (metrics, silent) = (self.shared.metrics.clone(), self.shared.metrics.clone());
        let by_source = self.shared.metrics.clone();
        let limit = (ConnectionLimit::new(config.max_connections))
            .first_read_within(config.first_bytes_timeout, move || {
                inc(&silent.xds_connections_silent_total);
            })
            .per_source(config.max_connections_per_source, move || {
                inc(&by_source.xds_connections_refused_source_total);
            });
        let incoming = limit.incoming(incoming, move || {
            inc(&metrics.xds_connections_refused_total);
        });
        let idle = self.shared.metrics.clone();
        let idle: Arc<dyn Fn() + Send + Sync> =
            Arc::new(move || inc(&idle.xds_connections_idle_total));
        let first_request = config.first_request_timeout;
        let shared = self.shared.clone();
        let signal = async move {
            shutdown.await;
            shared.closing.send_replace(true);
        };
        let routes = tonic::transport::Server::builder()
            .http2_keepalive_interval(Some(KEEPALIVE))
            .max_concurrent_streams(Some(config.max_streams_per_connection))
            .add_routes(self.routes());
        // TLS here rather than in tonic, whose configuration is fixed once it serves.
        match &config.tls {
            Some(tls) => {
                let failed = self.shared.metrics.clone();
                let incoming = tls_handshakes(
                    incoming,
                    tls.clone(),
                    config.tls_handshake_timeout,
                    move || inc(&failed.xds_tls_failures_total),
                )
                .map(move |accepted| {
                    accepted.map(|io| FirstRequest::new(io, first_request, idle.clone()))
                });
                routes
                    .serve_with_incoming_shutdown(incoming, signal)
                    .await?
            }
            None => {
                let incoming = incoming.map(move |accepted| {
                    accepted.map(|io| FirstRequest::new(io, first_request, idle.clone()))
                });
                routes
                    .serve_with_incoming_shutdown(incoming, signal)
                    .await?
            }
        }
        Ok(())
    }

    /// Opens a stream: registers its state and spawns its task, which queues its responses.
    fn open(
        &self,
        service: Service,
        source: Option<IpAddr>,
        inbound: impl Inbound,
    ) -> mpsc::Receiver<Queued> {
        let shared = &self.shared;
        let id = shared.next_stream_id.fetch_add(1, Ordering::Relaxed);
        let session = Session::new(id, service, shared.config.subscriptions).from_source(source);
        let state = Arc::new(Mutex::new(session));
        lock(&shared.streams).insert(id, state.clone());
        inc(&shared.metrics.xds_streams_total);
        shared
            .metrics
            .xds_streams_active
            .fetch_add(1, Ordering::Relaxed);
        debug!(stream = id, service = service.as_str(), "xDS stream opened");

        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        let stream = StreamTask {
            shared: shared.clone(),
            inbox: shared.cache.open_stream(id),
            state,
        };
        tokio::spawn(stream.run(inbound, tx));
        rx
    }
}

/// One stream's task. Dropping it (the task ended, however) unregisters the stream.
struct StreamTask {
    shared: Arc<Shared>,
    /// Where the cache puts the changes to this stream's names.
    inbox: Arc<Inbox>,
    state: Arc<Mutex<Session>>,
}

/// A stream's requests, as tonic's [`Streaming`] or [`framing`] reads them.
trait Inbound: Stream<Item = Result<DeltaDiscoveryRequest, Status>> + Unpin + Send + 'static {}
impl<S: Stream<Item = Result<DeltaDiscoveryRequest, Status>> + Unpin + Send + 'static> Inbound
    for S
{
}

/// A stream's queue of responses, ended by an error status if the stream fails. Boxed, so
/// that the queue's slots are a pointer each rather than a whole response.
type Queued = Result<Box<DeltaDiscoveryResponse>, Box<Status>>;
type Outbound = mpsc::Sender<Queued>;
/// What a session answers with: the response for a request's type, or the clusters of a
/// change, the load assignments that go with them, and the members of large VIPs'
/// collections (sent after their load assignments).
type Responses = [Option<DeltaDiscoveryResponse>; 3];

/// `two` and the collections' response the session has due.
fn with_collections(state: &mut Session, two: [Option<DeltaDiscoveryResponse>; 2]) -> Responses {
    let [clusters, endpoints] = two;
    [clusters, endpoints, state.take_collections()]
}

/// What a stream's answer is timed from (docs/production.md, "Metrics").
enum Timed {
    /// A request that subscribed clusters, which arrived then.
    OnDemand(Instant),
    /// A change of the cache, made then.
    Change(Stamps),
}

impl Timed {
    /// Records the answer just handed to the stream, whose last response is `nonce`.
    fn observe(self, metrics: &Metrics, nonce: String, receipts: &mut Receipts) {
        match self {
            Timed::OnDemand(arrived) => {
                observe(&metrics.xds_on_demand_answer_seconds, arrived.elapsed())
            }
            Timed::Change(stamps) => {
                if let Some(queued) = stamps.queued {
                    observe(&metrics.xds_push_lag_seconds, queued.elapsed());
                }
                if let Some(published) = stamps.registry {
                    receipts.sent(nonce, published);
                }
            }
        }
    }
}

/// The responses of registry changes a proxy has not acknowledged yet: their nonces, and when
/// the change was published. A few at most: a proxy acknowledges in order, and one that lags
/// further loses only its oldest timings.
#[derive(Default)]
struct Receipts(std::collections::VecDeque<(String, Instant)>);

impl Receipts {
    const MOST: usize = 4;

    fn sent(&mut self, nonce: String, published: Instant) {
        if self.0.len() == Self::MOST {
            self.0.pop_front();
        }
        self.0.push_back((nonce, published));
    }

    /// Times the change `req` acknowledges, if it does, and forgets those sent before it.
    fn acked(&mut self, metrics: &Metrics, req: &DeltaDiscoveryRequest) {
        if self.0.is_empty() || req.response_nonce.is_empty() || req.error_detail.is_some() {
            return;
        }
        let Some(at) = self
            .0
            .iter()
            .position(|(nonce, _)| *nonce == req.response_nonce)
        else {
            return;
        };
        let (_, published) = self.0[at];
        self.0.drain(..=at);
        observe(
            &metrics.registry_change_to_proxy_seconds,
            published.elapsed(),
        );
    }
}

/// Whether `req` subscribes cluster names by name, and nothing else: Envoy's on-demand
/// discovery of a cluster a request needs. A stream's first request of a reconnect (the
/// wildcard, the names it holds, their kept versions) is not one.
fn subscribes_clusters(req: &DeltaDiscoveryRequest) -> bool {
    ResourceType::from_type_url(&req.type_url) == Some(ResourceType::Cluster)
        && req.initial_resource_versions.is_empty()
        && !req.resource_names_subscribe.is_empty()
        && !req
            .resource_names_subscribe
            .iter()
            .any(|name| name == WILDCARD)
}

impl StreamTask {
    async fn run(self, mut inbound: impl Inbound, tx: Outbound) {
        let inbox = self.inbox.clone();
        let mut closing = self.shared.closing.subscribe();
        if *closing.borrow_and_update() {
            return;
        }
        // One ticker for the stream's life: a proxy's requests must not keep resetting it.
        let mut retry = tokio::time::interval(WAITING_RETRY);
        retry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut receipts = Receipts::default();
        loop {
            // The work runs boxed: the task then holds only what it waits on between
            // requests (its size is paid by every connected proxy).
            let (responses, timed) = tokio::select! {
                msg = inbound.next() => match msg {
                    Some(Ok(req)) => {
                        let arrived = Instant::now();
                        receipts.acked(&self.shared.metrics, &req);
                        let on_demand = subscribes_clusters(&req);
                        let responses = Box::pin(self.on_request(req)).await;
                        (responses, on_demand.then_some(Timed::OnDemand(arrived)))
                    }
                    None => break,
                    Some(Err(status)) => {
                        debug!(stream = self.id(), %status, "xDS stream failed");
                        // The proxy is told why (a request too large, say), if it still listens.
                        let _ = tx.try_send(Err(Box::new(status)));
                        break;
                    }
                },
                () = inbox.notified() => {
                    let (changes, stamps) = inbox.take_stamped();
                    (Box::pin(self.on_change(changes)).await, Some(Timed::Change(stamps)))
                }
                _ = closing.changed() => break,
                // Room under --xds-max-subscriptions frees up without any registry change, and
                // clusters sent ahead become idle.
                _ = retry.tick(), if self.ticks() => (Box::pin(self.on_tick()).await, None),
            };
            let last_nonce = responses.iter().flatten().last().map(|r| r.nonce.clone());
            for response in responses.into_iter().flatten() {
                // A proxy that stops reading fills the stream's buffer; shutdown must still
                // end this task rather than wait on the send.
                tokio::select! {
                    sent = tx.send(Ok(Box::new(response))) => if sent.is_err() { return },
                    _ = closing.changed() => return,
                }
            }
            if let (Some(nonce), Some(timed)) = (last_nonce, timed) {
                timed.observe(&self.shared.metrics, nonce, &mut receipts);
            }
        }
    }

    fn id(&self) -> u64 {
        lock(&self.state).id()
    }

    async fn on_request(&self, req: DeltaDiscoveryRequest) -> Responses {
        let weight = lock(&self.state).request_weight(&self.shared.context(), &req);
        self.run_session(weight, move |state, cx| {
            let two = state.on_request(cx, req);
            with_collections(state, two)
        })
        .await
    }

    /// Whether the stream has something to look at on the ticker.
    fn ticks(&self) -> bool {
        let state = lock(&self.state);
        state.is_waiting() || state.may_evict(&self.shared.context())
    }

    /// Names waiting for room, then idle clusters sent ahead.
    async fn on_tick(&self) -> Responses {
        let weight = lock(&self.state).tick_weight();
        self.run_session(weight, |state, cx| {
            if state.is_waiting() {
                let responses = state.on_change(cx, Changes::default());
                if responses.iter().any(Option::is_some) {
                    return with_collections(state, responses);
                }
            }
            [state.evict_idle(cx), None, None]
        })
        .await
    }

    async fn on_change(&self, changes: Changes) -> Responses {
        let weight = lock(&self.state).change_weight(&self.shared.context(), &changes);
        self.run_session(weight, move |state, cx| {
            let two = state.on_change(cx, changes);
            with_collections(state, two)
        })
        .await
    }

    /// Runs `work` on the stream's session: right here, on the async worker, if it touches
    /// at most [`INLINE_NAMES`] names (`weight`); otherwise in the heavy lane.
    async fn run_session(
        &self,
        weight: usize,
        work: impl FnOnce(&mut Session, &Context<'_>) -> Responses + Send + 'static,
    ) -> Responses {
        if weight <= INLINE_NAMES {
            return work(&mut lock(&self.state), &self.shared.context());
        }
        let (shared, state) = (self.shared.clone(), self.state.clone());
        let job = move || work(&mut lock(&state), &shared.context());
        // `None`: the runtime is shutting down, and the stream ends with it.
        self.shared.in_heavy_lane(job).await.unwrap_or_default()
    }
}

impl Drop for StreamTask {
    fn drop(&mut self) {
        let (id, subscribed) = {
            let state = lock(&self.state);
            odmesh_base::limited!(
                info,
                stream = state.id(),
                node = %clip(state.node_id()),
                "xDS stream closed",
            );
            (state.id(), state.subscribed())
        };
        lock(&self.shared.streams).remove(&id);
        (self.shared.metrics.xds_streams_active).fetch_sub(1, Ordering::Relaxed);
        let (shared, state) = (self.shared.clone(), self.state.clone());
        let close = move || lock(&state).close(&shared.context());
        // Forgetting thousands of names is a heavy job too (see `run_session`).
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) if subscribed > INLINE_NAMES => {
                let shared = self.shared.clone();
                runtime.spawn(async move { shared.in_heavy_lane(close).await });
            }
            _ => close(),
        }
    }
}

/// A stream opened through tonic's generated service (the tests' in-process calls; the
/// server itself frames delta streams in [`framing`]).
type DeltaStream = tokio_stream::adapters::Map<
    ReceiverStream<Queued>,
    fn(Queued) -> Result<DeltaDiscoveryResponse, Status>,
>;

impl XdsServer {
    /// Opens a stream that tonic's generated service reads.
    fn open_tonic(
        &self,
        service: Service,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> mpsc::Receiver<Queued> {
        let source = request.remote_addr().map(|addr| addr.ip().to_canonical());
        self.open(service, source, request.into_inner())
    }
}

fn tonic_stream(queue: mpsc::Receiver<Queued>) -> DeltaStream {
    ReceiverStream::new(queue).map(|queued| queued.map(|r| *r).map_err(|s| *s))
}
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
        Ok(Response::new(tonic_stream(
            self.open_tonic(Service::Ads, request),
        )))
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
        Ok(Response::new(tonic_stream(
            self.open_tonic(Service::Cds, request),
        )))
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
        Ok(Response::new(tonic_stream(
            self.open_tonic(Service::Eds, request),
        )))
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
    use envoy_types::pb::google::rpc::Status as RpcStatus;

    fn ack(nonce: &str) -> DeltaDiscoveryRequest {
        DeltaDiscoveryRequest {
            response_nonce: nonce.to_owned(),
            ..DeltaDiscoveryRequest::default()
        }
    }

    fn timed(metrics: &Metrics) -> u64 {
        metrics.registry_change_to_proxy_seconds.count()
    }

    #[test]
    fn a_change_is_timed_once_at_the_ack_of_its_response_and_never_at_a_nack() {
        let metrics = Metrics::default();
        let mut receipts = Receipts::default();
        let published = Instant::now();
        receipts.sent("1".into(), published);
        receipts.sent("2".into(), published);
        receipts.acked(&metrics, &ack("unknown"));
        let nack = DeltaDiscoveryRequest {
            error_detail: Some(RpcStatus::default()),
            ..ack("1")
        };
        receipts.acked(&metrics, &nack);
        assert_eq!(
            timed(&metrics),
            0,
            "an unknown nonce and a NACK time nothing"
        );
        // The ACK of the second also answers for the first: one observation, none left.
        receipts.acked(&metrics, &ack("2"));
        assert_eq!(timed(&metrics), 1);
        receipts.acked(&metrics, &ack("1"));
        assert_eq!(timed(&metrics), 1);
        assert!(receipts.0.is_empty());
    }

    #[test]
    fn a_proxy_that_lags_keeps_the_latest_few_receipts() {
        let metrics = Metrics::default();
        let mut receipts = Receipts::default();
        for nonce in 1..=10 {
            receipts.sent(nonce.to_string(), Instant::now());
        }
        assert_eq!(receipts.0.len(), Receipts::MOST);
        receipts.acked(&metrics, &ack("6"));
        assert_eq!(timed(&metrics), 0, "forgotten");
        receipts.acked(&metrics, &ack("10"));
        assert_eq!(timed(&metrics), 1);
    }

    #[test]
    fn only_cluster_names_asked_for_by_name_are_on_demand() {
        let request = |type_url: &str, names: &[&str]| DeltaDiscoveryRequest {
            type_url: type_url.to_owned(),
            resource_names_subscribe: names.iter().map(|n| (*n).to_owned()).collect(),
            ..DeltaDiscoveryRequest::default()
        };
        let clusters = ResourceType::Cluster.type_url();
        let endpoints = ResourceType::Endpoints.type_url();
        assert!(subscribes_clusters(&request(clusters, &["hello.vip"])));
        assert!(!subscribes_clusters(&request(clusters, &[WILDCARD])));
        // A reconnect: the wildcard and the names held, with their versions.
        assert!(!subscribes_clusters(&request(
            clusters,
            &[WILDCARD, "hello.vip"]
        )));
        let kept = DeltaDiscoveryRequest {
            initial_resource_versions: [("hello.vip".to_owned(), "v1".to_owned())].into(),
            ..request(clusters, &["hello.vip"])
        };
        assert!(!subscribes_clusters(&kept));
        assert!(!subscribes_clusters(&request(clusters, &[])));
        assert!(!subscribes_clusters(&request(endpoints, &["hello.vip"])));
    }
}
