//! Peers (`--peer URL`, repeatable): embedded registries that replicate each other, the way
//! a cluster of Eureka servers does, so that losing one loses no registration.
//!
//! - **What goes to the peers.** Every write a client makes on this node (registration,
//!   heartbeat, cancellation, status override set or removed, metadata) is queued for each
//!   peer and sent in batches, `POST {peer}/peerreplication/batch` with Eureka's
//!   `{"replicationList": [...]}` ([`crate::wire::replication`]), entries with Eureka's
//!   fields only, so that a real Eureka server takes them (and `/peerreplication/batch/`,
//!   where Eureka's servers post, is served too). An override goes as Eureka's
//!   `StatusUpdate` and its removal as `DeleteStatusOverride`; a metadata change as a
//!   `Register` of the whole instance. The owner of an instance travels in its document
//!   (see [`document`](super::document)). Evictions are not sent: each node evicts on its
//!   own, as in Eureka.
//! - **Not forwarded again.** A write that came from a peer (a batch, or a single REST call
//!   with `x-netflix-discovery-replication: true`) is applied here and goes nowhere else.
//!   Only an operator may send those when the registry has a tokens file; put its
//!   `name:token@` in the peer URLs.
//! - **Conflicts** go by `lastDirtyTimestamp`, as in Eureka. A registration older than the
//!   registered document only renews its lease. A replicated heartbeat answers 404 when
//!   the peer does not know the instance or holds an older document (this node then sends
//!   the registration), and 409 with its own document when it holds a newer one (this node
//!   then takes it).
//! - **The registration after a 404 waits** `resend_after` (2 s) and is read from the
//!   registry when it is sent, not when the 404 came. A real Eureka server answers 404 to a
//!   replicated heartbeat also right after an operator removed an override there without
//!   `?value=` (the status is `UNKNOWN` until the instance registers again), and sends that
//!   removal here only after its batching delay (500 ms). A registration sent at once would
//!   carry the override back to it, where it would stay; sent after the removal arrived, it
//!   carries the instance as it now is (docs/eureka.md, "Replication between peers").
//! - **A peer that is down or unreachable.** Its queue keeps the writes in order and is
//!   sent when the peer answers again, retried with a backoff (50 ms to 1 s); as Eureka's
//!   servers do, only when the peer was not reached, did not answer in time or answered 503:
//!   a batch it refuses otherwise (a 4xx, another 5xx, an answer that is not one) is
//!   dropped and counted, so that one refused write cannot hold up all those behind it.
//!   The queue is bounded (`max_pending`, the oldest writes go first): after a longer outage the
//!   heartbeats, refused with 404, bring the registrations back, and instances cancelled
//!   meanwhile expire with their lease.
//! - **A starting node** fills itself from the first peer that answers `GET /apps`. It is
//!   complete at once, without the warm-up. If no peer answers, it warms up as a lone
//!   registry does, and the peers' heartbeats fill it within one renewal interval. The answer
//!   is asked for gzip and read as it arrives, each instance taken as it is read (so a fill
//!   never holds the peer's whole document), within `max_answer` bytes and with at most
//!   `timeout` between two parts of it; a fill that fails half-way keeps what it took, and
//!   the node stays warming up.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use hyper::header::{ACCEPT, ACCEPT_ENCODING, AUTHORIZATION, CONTENT_TYPE};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use tokio::sync::Notify;

use odmesh_base::error::Chain;
use odmesh_base::logs::clip;
use odmesh_base::metrics::prometheus_client::collector::Collector;
use odmesh_base::metrics::prometheus_client::encoding::DescriptorEncoder;
use odmesh_base::metrics::{encode_labelled, inc};
use odmesh_registry::Status;

use self::queue::PeerQueue;
use super::admission::PeerCopy;
use super::auth::Caller;
use super::ledger::{Lease, RenewRefused};
use super::stored::Stored;
use super::{EurekaRegistry, InvalidRequest};
use crate::client::access::Access;
use crate::client::answer::{self, Bounds, Unread};
use crate::client::{ClientConfig, DEFAULT_MAX_ANSWER, InvalidEurekaConfig, ServerUrl, backoff};
use crate::wire::json::{self, InstanceInfo, InvalidDocument};
use crate::wire::read;
use crate::wire::replication::{Action, Batch, Entry, Replies, Reply};

/// The header that marks a write as a peer's: applied, never forwarded.
pub const REPLICATION_HEADER: &str = "x-netflix-discovery-replication";

/// Set on `GET /apps` answers while the registry warms up (it may not hold every instance
/// yet): a starting peer that fills from it stays warming up too.
pub const WARMING_UP_HEADER: &str = "x-odmesh-warming-up";

/// Names the node that answers (`/apps`, batches), so that a node listed among its own peers
/// under another name than its listening address (a host name, an address of a node
/// listening on every address) finds out, and sends itself nothing.
pub const NODE_HEADER: &str = "x-odmesh-node";

/// A name for this process, different at every start.
pub(super) fn node_name() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    format!("{:016x}", hasher.finish())
}

/// Writes in one batch (Eureka's default).
const BATCH: usize = 250;

/// How long a registration asked for by a peer's 404 waits: past Eureka's batching delay
/// (500 ms), with room for a busy peer (see the module's docs).
const RESEND_AFTER: Duration = Duration::from_secs(2);

/// The largest answer to a batch read from a peer.
const MAX_BODY: usize = 256 * 1024 * 1024;

/// The peers, and how to reach them.
#[derive(Clone)]
pub struct PeerConfig {
    /// Their base URLs (`http(s)://[user:token@]host:port/eureka`).
    pub urls: Vec<ServerUrl>,
    /// The TLS client for `https://` peers.
    pub tls: rustls::ClientConfig,
    /// The bound on one call to a peer.
    pub timeout: Duration,
    /// Writes kept for one peer that does not answer; beyond, the oldest are dropped.
    pub max_pending: usize,
    /// The largest `/apps` answer a fill reads, in bytes, decoded (and as transferred).
    pub max_answer: u64,
    /// How long the registration a peer's 404 asks for waits before it is read and sent.
    pub resend_after: Duration,
}

impl std::fmt::Debug for PeerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerConfig")
            .field("urls", &self.urls)
            .field("timeout", &self.timeout)
            .field("max_pending", &self.max_pending)
            .field("max_answer", &self.max_answer)
            .field("resend_after", &self.resend_after)
            .finish_non_exhaustive()
    }
}

impl PeerConfig {
    /// The peers at `urls`, `https://` ones verified against `ca_file` (or the system CA
    /// bundle).
    pub fn new(
        urls: &[String],
        ca_file: Option<PathBuf>,
        allow_plain_credentials: bool,
    ) -> Result<PeerConfig, InvalidEurekaConfig> {
        let config = ClientConfig {
            ca_file,
            allow_plain_credentials,
            ..ClientConfig::new(urls.to_vec(), Duration::from_secs(30))
        };
        let access = Access::new(&config, odmesh_base::tls::SYSTEM_CA_BUNDLES)?;
        // A peer listed twice (or with other credentials) is one peer, with one queue and
        // one series per metric.
        let mut urls = access.urls;
        let mut seen = std::collections::HashSet::new();
        urls.retain(|url| seen.insert(url.to_string()));
        Ok(PeerConfig {
            urls,
            tls: access.tls,
            timeout: Duration::from_secs(5),
            max_pending: 100_000,
            max_answer: DEFAULT_MAX_ANSWER,
            resend_after: RESEND_AFTER,
        })
    }

    /// No peer.
    pub fn none() -> PeerConfig {
        PeerConfig {
            urls: Vec::new(),
            tls: odmesh_base::tls::client_config(rustls::RootCertStore::empty())
                .expect("the default TLS client configuration"),
            timeout: Duration::from_secs(5),
            max_pending: 100_000,
            max_answer: DEFAULT_MAX_ANSWER,
            resend_after: RESEND_AFTER,
        }
    }

    /// Leaves out the URLs that name `own` (this node), so that every node can be given the
    /// same list.
    pub fn without(mut self, own: SocketAddr) -> PeerConfig {
        self.urls.retain(|url| !names(url, own));
        self
    }
}

/// Whether `url` points at `own`: the same port, and the same address (any loopback
/// address or `localhost` for a node listening on loopback or on every address).
fn names(url: &ServerUrl, own: SocketAddr) -> bool {
    let Ok(uri) = url.base().parse::<hyper::Uri>() else {
        return false;
    };
    let port = uri
        .port_u16()
        .unwrap_or(if url.is_tls() { 443 } else { 80 });
    let Some(host) = uri
        .host()
        .map(|h| h.trim_start_matches('[').trim_end_matches(']'))
    else {
        return false;
    };
    if port != own.port() {
        return false;
    }
    let local = own.ip().is_loopback() || own.ip().is_unspecified();
    match host.parse::<std::net::IpAddr>() {
        Ok(ip) => ip == own.ip() || (local && ip.is_loopback()),
        Err(_) => local && host.eq_ignore_ascii_case("localhost"),
    }
}

/// One write for the peers, or from one.
#[derive(Clone, Debug)]
pub struct Replicated {
    pub action: Action,
    /// Uppercase.
    pub app: String,
    pub id: String,
    pub last_dirty_timestamp: Option<u64>,
    /// For `Register`: the status the instance reports; for `StatusUpdate`: the override.
    pub status: Option<Status>,
    /// The override, for `Register` and `Heartbeat`.
    pub overridden: Option<Status>,
    /// The whole instance, for `Register` (its owner in its metadata, see
    /// [`document`](super::document)).
    pub info: Option<Stored>,
    /// A `Register` of what a peer held when this node filled itself from it: an instance
    /// that was live there, which self-preservation expects renewals of at once (see
    /// [`Registration::expected_now`](super::ledger::Registration::expected_now)).
    pub held: bool,
}

impl Replicated {
    /// A write naming `app`/`id` and nothing else yet.
    pub fn new(action: Action, app: &str, id: &str) -> Replicated {
        Replicated {
            action,
            app: app.trim().to_ascii_uppercase(),
            id: id.to_owned(),
            last_dirty_timestamp: None,
            status: None,
            overridden: None,
            info: None,
            held: false,
        }
    }

    /// The whole state of a lease, as a `Register`.
    pub fn register(lease: &Lease) -> Replicated {
        let doc = lease.stored().clone();
        let app = doc.app().unwrap_or_default().to_owned();
        let id = doc.instance_id().unwrap_or_default().to_owned();
        Replicated {
            last_dirty_timestamp: doc.last_dirty_timestamp(),
            status: Some(lease.reported),
            overridden: lease.overridden,
            info: Some(doc),
            ..Replicated::new(Action::Register, &app, &id)
        }
    }

    /// A heartbeat for `lease`, with its document's `lastDirtyTimestamp`.
    pub fn heartbeat(app: &str, id: &str, lease: &Lease) -> Replicated {
        Replicated {
            last_dirty_timestamp: lease.stored().last_dirty_timestamp(),
            status: Some(lease.stored().status()),
            overridden: lease.overridden,
            ..Replicated::new(Action::Heartbeat, app, id)
        }
    }

    pub fn cancel(app: &str, id: &str) -> Replicated {
        Replicated::new(Action::Cancel, app, id)
    }

    /// An operator's override of `lease`, `status`, as Eureka replicates it: its
    /// `StatusUpdate`.
    pub fn status_update(lease: &Lease, status: Status) -> Replicated {
        let doc = lease.stored();
        Replicated {
            last_dirty_timestamp: doc.last_dirty_timestamp(),
            status: Some(status),
            ..Replicated::new(
                Action::StatusUpdate,
                doc.app().unwrap_or_default(),
                doc.instance_id().unwrap_or_default(),
            )
        }
    }

    /// The override of `lease` removed, as Eureka replicates it: its `DeleteStatusOverride`,
    /// with the status the instance is back to (a real Eureka server takes that as its
    /// status).
    pub fn delete_override(lease: &Lease) -> Replicated {
        let doc = lease.stored();
        Replicated {
            last_dirty_timestamp: doc.last_dirty_timestamp(),
            status: Some(lease.reported),
            ..Replicated::new(
                Action::DeleteStatusOverride,
                doc.app().unwrap_or_default(),
                doc.instance_id().unwrap_or_default(),
            )
        }
    }

    /// A `Register` of `info` under `app` as a peer holds it: the status and override it
    /// shows (a peer's `/apps`, its answer to a heartbeat, a single replicated call).
    fn held(app: &str, info: InstanceInfo) -> Replicated {
        let id = info.id().unwrap_or_default().to_owned();
        Replicated {
            last_dirty_timestamp: info.last_dirty_timestamp,
            status: Some(info.status()),
            overridden: override_of(info.overridden_status.as_deref()),
            info: Some(Stored::from(&info)),
            held: true,
            ..Replicated::new(Action::Register, app, &id)
        }
    }
}

/// What a peer's write did here (the edge answers each in `responseList`).
#[derive(Debug)]
pub enum Applied {
    /// A heartbeat, cancellation or override applied.
    Done,
    /// A peer's copy of an instance registered.
    Registered,
    /// A heartbeat renewed the lease, but the peer's document is newer than this registry's:
    /// the peer sends its registration.
    OursOlder,
    /// A heartbeat renewed the lease, and this registry's document is newer: the peer takes
    /// it.
    OursNewer(Box<InstanceInfo>),
}

/// `status` as Eureka writes it; `UNKNOWN` stands for no override.
fn status_text(status: Option<Status>) -> String {
    status.unwrap_or(Status::Unknown).as_str().to_owned()
}

/// An override as sent: `UNKNOWN`, or none, is none.
fn override_of(text: Option<&str>) -> Option<Status> {
    text.and_then(Status::parse)
        .filter(|s| *s != Status::Unknown)
}

/// A batch body for `writes`.
pub fn encode(writes: &[Replicated]) -> Vec<u8> {
    let docs: Vec<Option<InstanceInfo>> = (writes.iter())
        .map(|w| w.info.as_ref().map(Stored::info))
        .collect();
    let batch = Batch {
        replication_list: (writes.iter().zip(&docs))
            .map(|(w, doc)| Entry {
                app_name: w.app.clone(),
                id: w.id.clone(),
                last_dirty_timestamp: w.last_dirty_timestamp,
                overridden_status: (w.action != Action::Cancel).then(|| status_text(w.overridden)),
                status: w.status.map(|s| s.as_str().to_owned()),
                instance_info: doc.as_ref(),
                action: w.action,
            })
            .collect(),
    };
    // Plain data with string keys: writing it cannot fail.
    serde_json::to_vec(&batch).unwrap_or_default()
}

/// The writes of a batch body.
pub fn decode(body: &[u8]) -> Result<Vec<Replicated>, InvalidRequest> {
    let batch: Batch<InstanceInfo> = serde_json::from_slice(body).map_err(|e| {
        InvalidRequest::invalid(format!(
            "not a replication batch ({{\"replicationList\": [...]}}): {e}"
        ))
    })?;
    Ok((batch.replication_list.into_iter())
        .map(|e| Replicated {
            action: e.action,
            app: e.app_name.trim().to_ascii_uppercase(),
            id: e.id,
            last_dirty_timestamp: e.last_dirty_timestamp,
            status: e.status.as_deref().and_then(Status::parse),
            overridden: override_of(e.overridden_status.as_deref()),
            info: e.instance_info.as_ref().map(Stored::from),
            // What a peer sends in a batch is one write, not the fill's whole registry.
            held: false,
        })
        .collect())
}

/// A peer's registration sent as a single REST call (`POST /apps/{APP}` with the
/// replication header): the instance as the peer holds it.
pub fn decode_instance(app: &str, body: &[u8]) -> Result<Replicated, InvalidRequest> {
    let doc: json::InstanceDocument = serde_json::from_slice(body).map_err(|e| {
        InvalidRequest::invalid(format!(
            "not a Eureka registration ({{\"instance\": {{...}}}}): {e}"
        ))
    })?;
    Ok(Replicated::held(app, doc.instance))
}

/// The writes waiting for one peer.
struct Peer {
    url: ServerUrl,
    /// Its replication counts, per peer in `/metrics` ([`PeerMetrics`]).
    counts: Arc<PeerCounts>,
    queue: Mutex<PeerQueue>,
    ready: Notify,
    /// The registrations this peer asked for, held until due.
    resends: Mutex<Resends>,
    /// The URL turned out to name this node: nothing is queued for it.
    is_self: std::sync::atomic::AtomicBool,
    /// How sending to it goes, for the status page.
    health: Mutex<PeerHealth>,
}

/// How replication to one peer is going, for the status page.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PeerHealth {
    /// When the peer last took a batch, in ms since the Unix epoch.
    pub last_success_ms: Option<u64>,
    /// Tries that failed since then (the writes stay queued and are sent again).
    pub failures: u32,
    /// Why the last try failed, or the last batch was refused.
    pub last_error: Option<String>,
    /// Writes the peer refused, dropped since the start.
    pub discarded: u64,
}

/// One peer, as the status page shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerState {
    /// Its URL, without credentials.
    pub url: String,
    /// Writes queued for it, and sent but not yet answered (as `odmesh_eureka_peer_pending`).
    pub pending: usize,
    /// Registrations it asked for (by a 404), held until due.
    pub resends: usize,
    /// The URL names this node: nothing is sent to it.
    pub is_self: bool,
    pub health: PeerHealth,
}

/// The registrations a peer asked for (by a 404), each held until due, in the order asked
/// (every one waits as long); an instance is held once however often it is asked for.
#[derive(Default)]
struct Resends {
    due: VecDeque<(tokio::time::Instant, (String, String))>,
    held: std::collections::HashSet<(String, String)>,
}

impl Resends {
    /// Holds the registration of `app`/`id` until `at`, unless it is held already.
    fn hold(&mut self, at: tokio::time::Instant, app: &str, id: &str) {
        let key = (app.to_owned(), id.to_owned());
        if self.held.insert(key.clone()) {
            self.due.push_back((at, key));
        }
    }

    /// The registrations due by `now` (`app`, `id`), taken out.
    fn take_due(&mut self, now: tokio::time::Instant) -> Vec<(String, String)> {
        let mut taken = Vec::new();
        while let Some((at, _)) = self.due.front()
            && *at <= now
            && let Some((_, key)) = self.due.pop_front()
        {
            self.held.remove(&key);
            taken.push(key);
        }
        taken
    }

    /// When the next held registration is due.
    fn next(&self) -> Option<tokio::time::Instant> {
        self.due.front().map(|(at, _)| *at)
    }
}

/// The queues of every peer.
pub(super) struct Peers {
    config: PeerConfig,
    peers: Vec<Arc<Peer>>,
}

/// One peer's replication counts.
#[derive(Debug, Default)]
struct PeerCounts {
    /// Writes queued for it, and sent but not yet answered.
    pending: AtomicU64,
    /// Writes it took.
    replicated: AtomicU64,
    /// Batches that did not reach it (sent again).
    failures: AtomicU64,
    /// Queued writes dropped, the oldest first, while it was unreachable too long.
    dropped: AtomicU64,
}

/// The peers' replication counts, one series per peer URL (`peer`): a collector for
/// `/metrics`.
#[derive(Clone, Debug, Default)]
pub struct PeerMetrics(Vec<(String, Arc<PeerCounts>)>);

/// The counts of every peer, added up.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PeerTotals {
    pub pending: u64,
    pub replicated: u64,
    pub failures: u64,
    pub dropped: u64,
}

impl PeerMetrics {
    /// The counts of every peer, added up.
    pub fn totals(&self) -> PeerTotals {
        let sum = |count: fn(&PeerCounts) -> &AtomicU64| {
            (self.0.iter())
                .map(|(_, c)| count(c).load(Ordering::Relaxed))
                .sum()
        };
        PeerTotals {
            pending: sum(|c| &c.pending),
            replicated: sum(|c| &c.replicated),
            failures: sum(|c| &c.failures),
            dropped: sum(|c| &c.dropped),
        }
    }
}

/// A per-peer family: its name, kind, help, and the count it shows.
type PeerFamily = (
    &'static str,
    &'static str,
    &'static str,
    fn(&PeerCounts) -> &AtomicU64,
);

impl Collector for PeerMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let families: [PeerFamily; 4] = [
            (
                "eureka_peer_pending",
                "gauge",
                "Embedded Eureka registry: writes queued for each peer (--peer), or sent and not yet answered.",
                |c| &c.pending,
            ),
            (
                "eureka_peer_replicated_total",
                "counter",
                "Embedded Eureka registry: writes each peer took.",
                |c| &c.replicated,
            ),
            (
                "eureka_peer_replication_failures_total",
                "counter",
                "Embedded Eureka registry: batches of writes that did not reach each peer (sent again).",
                |c| &c.failures,
            ),
            (
                "eureka_peer_dropped_total",
                "counter",
                "Embedded Eureka registry: queued writes dropped, the oldest first, for each peer unreachable too long (its heartbeats bring the registrations back).",
                |c| &c.dropped,
            ),
        ];
        for (name, kind, help, count) in families {
            let series: Vec<(&str, u64)> = (self.0.iter())
                .map(|(url, c)| (url.as_str(), count(c).load(Ordering::Relaxed)))
                .collect();
            encode_labelled(&mut encoder, name, help, kind, "peer", &series)?;
        }
        Ok(())
    }
}

impl Peers {
    /// The peers' replication counts, for `/metrics`.
    pub(super) fn metrics(&self) -> PeerMetrics {
        PeerMetrics(
            (self.peers.iter())
                .map(|p| (p.url.to_string(), p.counts.clone()))
                .collect(),
        )
    }

    pub(super) fn new(config: PeerConfig) -> Peers {
        let peers = (config.urls.iter())
            .map(|url| {
                Arc::new(Peer {
                    url: url.clone(),
                    counts: Arc::default(),
                    queue: Mutex::new(PeerQueue::default()),
                    ready: Notify::new(),
                    resends: Mutex::new(Resends::default()),
                    is_self: std::sync::atomic::AtomicBool::new(false),
                    health: Mutex::new(PeerHealth::default()),
                })
            })
            .collect();
        Peers { config, peers }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.peers.is_empty()
    }
}

impl Peer {
    fn queue(&self) -> std::sync::MutexGuard<'_, PeerQueue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn resends(&self) -> std::sync::MutexGuard<'_, Resends> {
        self.resends.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn health(&self) -> std::sync::MutexGuard<'_, PeerHealth> {
        self.health.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Notes how a try went, with `change`.
    fn note(&self, change: impl FnOnce(&mut PeerHealth)) {
        change(&mut self.health());
    }
}

type HttpClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>;

/// Why a call to a peer failed.
#[derive(Debug, thiserror::Error)]
enum CallError {
    /// The request could not be sent, or its answer broke off: the cause says why.
    #[error("{url}")]
    Transport {
        url: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("{url}: no answer within {after:?}")]
    Timeout { url: String, after: Duration },
    #[error("{url}: HTTP {status}: {body}")]
    Status {
        url: String,
        status: u16,
        body: String,
    },
    #[error("{url}: not a replication answer")]
    Undecodable {
        url: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("{url}: the answer is larger than --peer-max-answer ({limit} bytes)")]
    TooLarge { url: String, limit: u64 },
    #[error("{url}")]
    Document {
        url: String,
        source: InvalidDocument,
    },
}

impl CallError {
    /// Whether the same call may succeed later: the peer was not reached, did not answer in
    /// time, or said it is busy (503). Eureka's servers send such a batch again and drop one
    /// refused otherwise (docs/eureka.md, "Replication between peers").
    fn is_transient(&self) -> bool {
        match self {
            CallError::Transport { .. } | CallError::Timeout { .. } => true,
            CallError::Status { status, .. } => *status == 503,
            CallError::Undecodable { .. }
            | CallError::TooLarge { .. }
            | CallError::Document { .. } => false,
        }
    }
}

impl EurekaRegistry {
    /// Whether writes go to peers.
    pub(super) fn has_peers(&self) -> bool {
        !self.shared.peers.is_empty()
    }

    /// Every peer and how replicating to it goes.
    pub fn peer_states(&self) -> Vec<PeerState> {
        (self.shared.peers.peers.iter())
            .map(|peer| PeerState {
                url: peer.url.to_string(),
                pending: peer.counts.pending.load(Ordering::Relaxed) as usize,
                resends: peer.resends().held.len(),
                is_self: peer.is_self.load(Ordering::Relaxed),
                health: peer.health().clone(),
            })
            .collect()
    }

    /// Queues `write` for every peer.
    pub(super) fn replicate(&self, write: Replicated) {
        let peers = &self.shared.peers;
        let Some((last, others)) = peers.peers.split_last() else {
            return;
        };
        for peer in others {
            self.enqueue(peer, write.clone());
        }
        self.enqueue(last, write);
    }

    fn enqueue(&self, peer: &Peer, write: Replicated) {
        if peer.is_self.load(Ordering::Relaxed) {
            return;
        }
        let peers = &self.shared.peers;
        let metrics = &self.shared.metrics;
        let mut queue = peer.queue();
        if queue.push(write) {
            inc(&metrics.eureka_peer_merged_total);
        } else if queue.len() > peers.config.max_pending {
            queue.pop_oldest();
            inc(&peer.counts.dropped);
        } else {
            inc(&peer.counts.pending);
        }
        drop(queue);
        peer.ready.notify_one();
    }

    /// Applies a peer's write here, forwarding it nowhere: what it did, or why not.
    pub fn apply_replicated(&self, write: Replicated) -> Result<Applied, InvalidRequest> {
        let applied = self.apply(write);
        if let Err(e) = &applied {
            odmesh_base::limited!(
                debug,
                refusal = ?e.refusal,
                error = %clip(&e.reason),
                "eureka: a peer's write was not applied"
            );
        }
        applied
    }

    fn apply(&self, write: Replicated) -> Result<Applied, InvalidRequest> {
        let (app, id) = (write.app.as_str(), write.id.as_str());
        match write.action {
            Action::Register => {
                let held = write.held;
                self.apply_register(app, write.status, write.overridden, write.info, held)
            }
            Action::Heartbeat => self.apply_heartbeat(app, id, write.last_dirty_timestamp),
            Action::Cancel => {
                let cancelled = self.lock().cancel(app, id, self.now());
                cancelled.ok_or_else(|| InvalidRequest::not_found(app, id))?;
                self.received()
            }
            Action::StatusUpdate => {
                let status = write
                    .status
                    .ok_or_else(|| InvalidRequest::invalid("a status update without status"))?;
                self.apply_override(app, id, Some(status))
            }
            Action::DeleteStatusOverride => self.apply_override(app, id, None),
        }
    }

    /// A peer's copy of an instance, registered as the peer holds it.
    fn apply_register(
        &self,
        app: &str,
        reported: Option<Status>,
        overridden: Option<Status>,
        info: Option<Stored>,
        held: bool,
    ) -> Result<Applied, InvalidRequest> {
        let Some(info) = info else {
            return Err(InvalidRequest::invalid(
                "a replicated registration without its instanceInfo",
            ));
        };
        let info = info.info();
        let copy = PeerCopy {
            reported: reported.unwrap_or_else(|| info.status()),
            overridden,
            held,
        };
        super::policy::check_app(app)?;
        self.admit(&Caller::Anyone, app.to_owned(), info, Some(copy))?;
        Ok(Applied::Registered)
    }

    /// A peer's heartbeat: renewed, and whose document is newer said.
    fn apply_heartbeat(
        &self,
        app: &str,
        id: &str,
        theirs: Option<u64>,
    ) -> Result<Applied, InvalidRequest> {
        let mut state = self.lock();
        match state.renew(app, id, theirs, self.now()) {
            Err(RenewRefused::Unknown) => Err(InvalidRequest::not_found(app, id)),
            Err(RenewRefused::Newer { .. }) => Ok(Applied::OursOlder),
            Ok(()) => {
                inc(&self.shared.metrics.eureka_peer_received_total);
                let ours = (state.lease(app, id)).and_then(|l| l.stored().last_dirty_timestamp());
                // Ours is newer: the peer takes it (the document is copied only then).
                if let (Some(ours), Some(theirs)) = (ours, theirs)
                    && ours > theirs
                    && let Some(served) = state.instance(app, id)
                {
                    return Ok(Applied::OursNewer(Box::new(served.info())));
                }
                Ok(Applied::Done)
            }
        }
    }

    /// A peer's override of an instance set (`Some`) or removed.
    fn apply_override(
        &self,
        app: &str,
        id: &str,
        overridden: Option<Status>,
    ) -> Result<Applied, InvalidRequest> {
        let changed = self.lock().modify(app, id, self.now(), |lease| {
            lease.overridden = overridden;
            // Who set it is not replicated: a peer's override is nobody's in particular.
            lease.override_by_operator = false;
            lease.refresh_status();
            Ok::<(), InvalidRequest>(())
        });
        changed.ok_or_else(|| InvalidRequest::not_found(app, id))??;
        self.received()
    }

    /// Counts a peer's write applied, and publishes it.
    fn received(&self) -> Result<Applied, InvalidRequest> {
        inc(&self.shared.metrics.eureka_peer_received_total);
        self.publish();
        Ok(Applied::Done)
    }

    /// Sends each peer its writes, as they come; runs until dropped.
    pub async fn run_peers(self) {
        let peers = &self.shared.peers;
        let http = http_client(&peers.config);
        // Dropping this future (the server stopping) aborts the senders with the set.
        let mut senders = tokio::task::JoinSet::new();
        for peer in &peers.peers {
            let (registry, http, peer) = (self.clone(), http.clone(), peer.clone());
            senders.spawn(async move { registry.send_to(&http, &peer).await });
        }
        while senders.join_next().await.is_some() {}
        // Without peers there is nothing to send; the server runs on.
        std::future::pending::<()>().await;
    }

    /// Sends `peer` its queue, a batch at a time, in order; a batch that fails is sent
    /// again after a backoff.
    async fn send_to(&self, http: &HttpClient, peer: &Peer) {
        let metrics = &self.shared.metrics;
        let mut failures = 0u32;
        loop {
            self.queue_resends(peer);
            let taken = peer.queue().take(BATCH);
            let batch = &taken.writes;
            if batch.is_empty() {
                let next_resend = peer.resends().next();
                match next_resend {
                    Some(at) => {
                        let _ = tokio::time::timeout_at(at, peer.ready.notified()).await;
                    }
                    None => peer.ready.notified().await,
                }
                continue;
            }
            match self.send_batch(http, peer, batch).await {
                // The peer is this node: it took nothing, and gets nothing more.
                Ok(None) => self.unqueued(peer, batch.len()),
                Ok(Some(replies)) => {
                    if failures > 0 {
                        tracing::info!(peer = %peer.url, "eureka: peer answers again; sending its queued writes");
                    }
                    failures = 0;
                    let now = self.now().ms;
                    peer.note(|h| (h.last_success_ms, h.failures) = (Some(now), 0));
                    self.unqueued(peer, batch.len());
                    let replicated = &peer.counts.replicated;
                    replicated.fetch_add(batch.len() as u64, Ordering::Relaxed);
                    self.answered(peer, batch, replies);
                }
                Err(e) if !e.is_transient() => {
                    self.unqueued(peer, batch.len());
                    let discarded = &metrics.eureka_peer_discarded_total;
                    discarded.fetch_add(batch.len() as u64, Ordering::Relaxed);
                    peer.note(|h| {
                        h.discarded += batch.len() as u64;
                        h.last_error = Some(Chain(&e).to_string());
                    });
                    odmesh_base::limited!(
                        warn,
                        error = %Chain(&e),
                        writes = batch.len(),
                        "eureka: a peer refused a batch of writes; dropped (its heartbeats bring the registrations back once it takes them)"
                    );
                }
                Err(e) => {
                    failures += 1;
                    peer.note(|h| {
                        h.failures = failures;
                        h.last_error = Some(Chain(&e).to_string());
                    });
                    inc(&peer.counts.failures);
                    let wait = backoff(failures, Duration::from_millis(50), Duration::from_secs(1));
                    odmesh_base::limited!(
                        warn,
                        error = %Chain(&e),
                        pending = peer.queue().len() + batch.len(),
                        "eureka: a peer did not take its writes; they stay queued"
                    );
                    let merged = peer.queue().put_back(taken);
                    self.unqueued(peer, merged);
                    (metrics.eureka_peer_merged_total).fetch_add(merged as u64, Ordering::Relaxed);
                    tokio::time::sleep(wait).await;
                }
            }
        }
    }

    /// Acts on a peer's answers: what it did not know gets the registration, what it holds
    /// newer is taken.
    fn answered(&self, peer: &Peer, batch: &[Replicated], replies: Vec<Reply>) {
        for (write, reply) in batch.iter().zip(replies) {
            match (write.action, reply.status_code) {
                (Action::Heartbeat, 404) => {
                    inc(&self.shared.metrics.eureka_peer_resends_total);
                    let at = tokio::time::Instant::now() + self.shared.peers.config.resend_after;
                    peer.resends().hold(at, &write.app, &write.id);
                }
                (Action::Heartbeat, 409) => {
                    if let Some(theirs) = reply.response_entity {
                        // Refused or not, there is nothing more to do with it.
                        let _ = self.apply_replicated(Replicated::held(&write.app, theirs));
                    }
                }
                (_, code) if code >= 400 && code != 404 => {
                    odmesh_base::limited!(
                        warn,
                        peer = %peer.url,
                        action = ?write.action,
                        app = %clip(&write.app),
                        id = %clip(&write.id),
                        status = code,
                        "eureka: a peer refused a write"
                    );
                }
                _ => {}
            }
        }
    }

    /// Queues the registrations due for `peer`, each as the registry holds it now (an
    /// instance gone since is not sent).
    fn queue_resends(&self, peer: &Peer) {
        let due = peer.resends().take_due(tokio::time::Instant::now());
        for (app, id) in due {
            let lease = self.lock().lease(&app, &id).map(Replicated::register);
            if let Some(register) = lease {
                self.enqueue(peer, register);
            }
        }
    }

    async fn send_batch(
        &self,
        http: &HttpClient,
        peer: &Peer,
        batch: &[Replicated],
    ) -> Result<Option<Vec<Reply>>, CallError> {
        let body = encode(batch);
        let answer = call(
            &self.shared.node,
            http,
            &peer.url,
            hyper::Method::POST,
            "/peerreplication/batch",
            Some(body),
            self.shared.peers.config.timeout,
        )
        .await?;
        if self.is_me(peer, answer.node.as_deref()) {
            return Ok(None);
        }
        let replies: Replies =
            serde_json::from_slice(&answer.body).map_err(|source| CallError::Undecodable {
                url: format!("{}/peerreplication/batch", peer.url),
                source,
            })?;
        if replies.response_list.len() != batch.len() {
            // Eureka's servers take such a batch as sent, without looking at the answers.
            odmesh_base::limited!(
                warn,
                peer = %peer.url,
                answers = replies.response_list.len(),
                writes = batch.len(),
                "eureka: a peer answered a batch with another number of answers; taken as sent"
            );
            return Ok(Some(Vec::new()));
        }
        Ok(Some(replies.response_list))
    }

    /// Whether `node` (a peer's answer's name) is this node; if so, `peer` is marked so, its
    /// queue emptied, and nothing is sent to it again.
    fn is_me(&self, peer: &Peer, node: Option<&str>) -> bool {
        if node != Some(self.shared.node.as_str()) {
            return false;
        }
        if !peer.is_self.swap(true, Ordering::Relaxed) {
            tracing::info!(peer = %peer.url, "eureka: this peer URL names this node; nothing is sent to it");
        }
        let dropped = peer.queue().clear();
        self.unqueued(peer, dropped);
        true
    }

    /// Counts `n` writes out of the queues (sent, or for nobody).
    fn unqueued(&self, peer: &Peer, n: usize) {
        peer.counts.pending.fetch_sub(n as u64, Ordering::Relaxed);
    }

    /// Fills this registry from the peers' `GET /apps`, in turn, until one that is not
    /// warming up itself answers; whether one did (this registry is then complete).
    pub async fn fill_from_peers(&self) -> bool {
        let peers = &self.shared.peers;
        if peers.is_empty() {
            return false;
        }
        let config = &peers.config;
        let http = http_client(config);
        for peer in &peers.peers {
            let url = &peer.url;
            let (complete, filled) = match self.fill_from(&http, peer).await {
                Ok(Some(filled)) => filled,
                Ok(None) => continue,
                Err(e) => {
                    if matches!(e, CallError::TooLarge { .. }) {
                        inc(&self.shared.metrics.eureka_peer_fills_too_large_total);
                    }
                    tracing::warn!(error = %Chain(&e), "eureka: could not fill from this peer; trying the next");
                    continue;
                }
            };
            inc(&self.shared.metrics.eureka_peer_fills_total);
            if !complete {
                tracing::info!(peer = %url, instances = filled, "eureka: filled from a peer that is warming up itself; trying the next");
                continue;
            }
            self.shared.filled.store(true, Ordering::Relaxed);
            self.publish();
            tracing::info!(peer = %url, instances = filled, "eureka: filled from a peer; the registry is complete");
            return true;
        }
        tracing::warn!(
            "eureka: no complete peer answered; warming up as a lone registry, while clients and peers register again"
        );
        self.publish();
        false
    }

    /// Fills this registry from `peer`'s `GET /apps`, each instance taken as it is read:
    /// whether the peer is complete (not warming up itself), and how many instances were
    /// taken; `None` when the peer is this node.
    async fn fill_from(
        &self,
        http: &HttpClient,
        peer: &Peer,
    ) -> Result<Option<(bool, usize)>, CallError> {
        let config = &self.shared.peers.config;
        let url = format!("{}/apps", peer.url);
        let transport = |source: Box<dyn std::error::Error + Send + Sync>| CallError::Transport {
            url: url.clone(),
            source,
        };
        let mut request = hyper::Request::get(format!("{}/apps", peer.url.base()))
            .header(ACCEPT, "application/json")
            .header(ACCEPT_ENCODING, answer::ACCEPT_GZIP)
            .header(REPLICATION_HEADER, "true")
            .header(NODE_HEADER, &self.shared.node);
        if let Some(authorization) = peer.url.authorization() {
            request = request.header(AUTHORIZATION, authorization.clone());
        }
        let request = request
            .body(Full::new(Bytes::new()))
            .map_err(|e| transport(e.into()))?;
        let response = tokio::time::timeout(config.timeout, http.request(request))
            .await
            .map_err(|_| CallError::Timeout {
                url: url.clone(),
                after: config.timeout,
            })?
            .map_err(|e| transport(e.into()))?;
        let complete = !response.headers().contains_key(WARMING_UP_HEADER);
        let node = (response.headers().get(NODE_HEADER)).and_then(|v| v.to_str().ok());
        if self.is_me(peer, node) {
            return Ok(None);
        }
        if !response.status().is_success() {
            return Err(CallError::Status {
                url,
                status: response.status().as_u16(),
                body: String::new(),
            });
        }
        let bounds = Bounds {
            max_bytes: config.max_answer,
            idle: config.timeout,
        };
        let registry = self.clone();
        let read = answer::read(response, bounds, move |reader| {
            let mut filled = 0;
            read::read_document(reader, &mut |app, _, info| {
                let Ok(info) = info else { return };
                if registry
                    .apply_replicated(Replicated::held(app, info))
                    .is_ok()
                {
                    filled += 1;
                }
            })
            .map(|_| filled)
        })
        .await;
        match read {
            Ok(Ok(filled)) => Ok(Some((complete, filled))),
            Ok(Err(source)) => Err(CallError::Document { url, source }),
            Err(Unread::TooLarge(limit)) => Err(CallError::TooLarge { url, limit }),
            Err(Unread::Idle(after)) => Err(CallError::Timeout { url, after }),
            Err(e) => Err(transport(e.into())),
        }
    }
}

/// The HTTP client to the peers (the follower's, [`crate::client::access::http_client`]).
fn http_client(config: &PeerConfig) -> HttpClient {
    crate::client::access::http_client(config.tls.clone(), config.timeout)
}

/// A peer's answer.
struct Answer {
    /// The answering node's name ([`NODE_HEADER`]).
    node: Option<String>,
    body: Bytes,
}

/// One call to a peer, with its credentials, marked as replication and naming this node
/// (`own`). A peer that turns out to be this node answers without acting (421, named): that
/// is an answer too.
async fn call(
    own: &str,
    http: &HttpClient,
    peer: &ServerUrl,
    method: hyper::Method,
    path: &str,
    body: Option<Vec<u8>>,
    timeout: Duration,
) -> Result<Answer, CallError> {
    let url = format!("{peer}{path}");
    let transport = |source: Box<dyn std::error::Error + Send + Sync>| CallError::Transport {
        url: url.clone(),
        source,
    };
    let mut request = hyper::Request::builder()
        .method(method)
        .uri(format!("{}{path}", peer.base()))
        .header(ACCEPT, "application/json")
        .header(REPLICATION_HEADER, "true")
        .header(NODE_HEADER, own);
    if body.is_some() {
        request = request.header(CONTENT_TYPE, "application/json");
    }
    if let Some(authorization) = peer.authorization() {
        request = request.header(AUTHORIZATION, authorization.clone());
    }
    let request = request
        .body(Full::new(Bytes::from(body.unwrap_or_default())))
        .map_err(|e| transport(e.into()))?;
    let exchange = async {
        let response = (http.request(request).await).map_err(|e| transport(e.into()))?;
        let status = response.status();
        let node = (response.headers().get(NODE_HEADER))
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        if node.as_deref() == Some(own) {
            return Ok(Answer {
                node,
                body: Bytes::new(),
            });
        }
        let body = Limited::new(response.into_body(), MAX_BODY)
            .collect()
            .await
            .map_err(|e| transport(Unread::Transport(e).into()))?
            .to_bytes();
        if !status.is_success() {
            return Err(CallError::Status {
                url: url.clone(),
                status: status.as_u16(),
                body: clip(&String::from_utf8_lossy(&body)).to_string(),
            });
        }
        Ok(Answer { node, body })
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| CallError::Timeout {
            url: url.clone(),
            after: timeout,
        })?
}

mod queue;

#[cfg(test)]
mod fill_tests;
#[cfg(test)]
mod tests;
