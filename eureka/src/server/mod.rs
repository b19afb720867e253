//! The embedded Eureka-compatible registry (`--serve-eureka [ADDR]`): standard Eureka clients
//! register with odmesh itself, and every change is published to the mesh at once.
//!
//! The REST API is Netflix Eureka's, under `/eureka` (and `/eureka/v2`, the default path of
//! some clients):
//!
//! | request | answer |
//! |---|---|
//! | `POST /apps/{APP}` with `{"instance": {...}}` | 204: registered (or registered again) |
//! | `PUT /apps/{APP}/{ID}` | 200: lease renewed; 404: unknown instance, the client registers again |
//! | `DELETE /apps/{APP}/{ID}` | 200: cancelled; 404: unknown |
//! | `PUT /apps/{APP}/{ID}/status?value=OUT_OF_SERVICE` | 200: status override set |
//! | `DELETE /apps/{APP}/{ID}/status` | 200: override removed |
//! | `PUT /apps/{APP}/{ID}/metadata?key=value` | 200: metadata entries set |
//! | `GET /apps`, `/apps/delta`, `/apps/{APP}`, `/apps/{APP}/{ID}`, `/instances/{ID}`, `/vips/{VIP}`, `/svips/{SVIP}` | the registry, JSON or XML |
//! | `POST /peerreplication/batch` with `{"replicationList": [...]}` | a peer's writes, each answered in `responseList` ([`peers`]) |
//!
//! And, at `/` (outside `/eureka`), a status page for people, as Eureka's servers have
//! ([`dashboard`]): HTML, behind the same authentication as `GET /apps`.
//!
//! As in Eureka: app names are case-insensitive (stored uppercase); a read answers JSON when
//! the `Accept` header mentions `json`, XML otherwise; the delta lists the instances that
//! changed within the last `delta_retention` (3 minutes) with `actionType`, and the
//! `apps__hashcode` of the whole registry; a heartbeat whose `lastDirtyTimestamp` is newer
//! than the registered one answers 404 so the client registers its newer data; a status
//! override wins over the status an instance reports only when it reports `UP` or
//! `OUT_OF_SERVICE` (one that reports `DOWN`, `STARTING` or `UNKNOWN` keeps it); the
//! `status` and `overriddenstatus` parameters of a heartbeat are ignored (Eureka uses them
//! only between peers).
//!
//! Leases: an instance expires `leaseInfo.durationInSecs` after its last heartbeat (as
//! Eureka does, up to `max_lease`), or after the configured `lease_duration` when it does not
//! say; a background task evicts expired instances every `eviction_interval`. Three guards,
//! as in Eureka's server, keep a registry in trouble from emptying the mesh:
//! - self-preservation ([`preservation`]): when far fewer renewals arrive than expected,
//!   eviction stops; and one round evicts at most the share above the threshold;
//! - late eviction rounds are compensated: if a round runs late (the process was paused, the
//!   host overloaded), every lease is extended by the delay, since no heartbeat could be
//!   received meanwhile;
//! - warm-up: after a start, the registry is published as still loading for `warmup` (one
//!   renewal interval and a margin), while its clients register again (their heartbeats get
//!   404); meanwhile proxies keep the clusters they hold (see odmesh-control's `cache`).
//!
//! Writes are checked ([`policy`]: names, addresses, lease, metadata, body size and type) and,
//! with a tokens file, authenticated and authorised ([`auth`]). Registries started with
//! `--peer URL` replicate each other as Eureka's servers do ([`peers`]).
//!
//! Where this differs from Netflix's server, on purpose: removing a status override restores
//! the status the instance itself reported (Eureka sets `UNKNOWN` until the next heartbeat
//! fails and the client registers again, which would drain a healthy instance for up to a
//! heartbeat interval); a metadata update of an unknown instance answers 404, not 500;
//! registration fills in a missing `hostName` (with `ipAddr`) and `dataCenterInfo` (`MyOwn`)
//! instead of refusing the instance, so a hand-written `curl` registration works.

mod admission;
mod answers;
pub mod auth;
mod clock;
pub mod dashboard;
pub mod document;
mod http;
pub mod ledger;
pub mod peers;
pub mod policy;
pub mod preservation;
pub mod stored;
mod throttle;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::Router;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use odmesh_base::flags::duration_text;
use odmesh_base::http_server::{self, HttpEvent, HttpLimits};
use odmesh_base::logs::clip;
use odmesh_base::metrics::{inc, set};
use odmesh_base::tls::ServerTls;

use self::admission::PeerCopy;
use self::answers::Answers;
use self::auth::{Authenticator, Caller};
use self::clock::Clock;
use self::ledger::{
    Eviction, Lease, Ledger, Now, Registered, Registration, RenewRefused, Served, Terms,
};
use self::peers::{PeerConfig, Peers, Replicated};
pub use self::peers::{PeerMetrics, PeerTotals};
use self::policy::RegistrationLimits;
use self::preservation::PreservationConfig;

use odmesh_registry::{Registry, RegistryMetrics, SourceHealth, Status};

use crate::ServerMetrics;
use crate::wire::json::{Application, Applications, InstanceInfo};
use crate::wire::xml;

/// After a publish, the publisher waits this long before the next, so that changes
/// arriving together (a burst of registrations) are published together; a change after a
/// quiet time is published at once.
const PUBLISH_INTERVAL: Duration = Duration::from_millis(5);

/// Where the embedded registry listens unless told otherwise.
pub const DEFAULT_ADDR: &str = "127.0.0.1:8761";

/// How the embedded registry treats leases, deltas and clients.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// How long an instance lives without a heartbeat, when its registration does not say
    /// (`leaseInfo.durationInSecs`). Eureka's default: 90 s.
    pub lease_duration: Duration,
    /// How often expired leases are evicted.
    pub eviction_interval: Duration,
    /// How long a change stays in `/apps/delta`. Eureka's default: 3 minutes.
    pub delta_retention: Duration,
    /// After a start, how long the registry is published as still loading, while clients
    /// register again (see the module docs). 0: complete at once.
    pub warmup: Duration,
    /// Whether a client's `GET /apps` and `/apps/delta` are refused (403, no body) during the
    /// warm-up, as Netflix's Eureka server does, instead of answered with what the registry
    /// holds so far, as Spring Cloud's does by default (docs/eureka.md, "After a restart").
    pub refuse_reads_while_warming: bool,
    /// When lease eviction stops.
    pub preservation: PreservationConfig,
    /// What a registration may hold, and how many instances the registry may hold.
    pub limits: RegistrationLimits,
    /// The HTTP server's bounds.
    pub http: HttpLimits,
    /// The largest request body accepted (413 beyond).
    pub max_body: usize,
    /// How long a request body may take to arrive (408 beyond).
    pub body_timeout: Duration,
    /// Who may use the registry; `None`: anyone.
    pub auth: Option<Arc<Authenticator>>,
    /// The registries this one replicates with; `None`: none.
    pub peers: Option<PeerConfig>,
    /// Requests without valid credentials one source address may send per 10 s; beyond,
    /// its requests are answered 429 for the rest of those 10 s ([`throttle`]). 0: no limit.
    pub max_auth_failures: u32,
    /// How long a written `GET /apps` or `/apps/delta` answer is served whatever was
    /// written since (see [`answers`]); 0: every reader gets the registry as it was when it
    /// asked, or later.
    pub response_cache_interval: Duration,
}

impl ServerConfig {
    /// The defaults, with instances at loopback addresses accepted: for a registry whose
    /// services and proxies all run on one machine (`make run`, tests).
    pub fn local() -> ServerConfig {
        let mut config = ServerConfig::default();
        config.limits.networks.allow_loopback = true;
        config
    }
}

/// After a start, the registry is still loading for one renewal interval of Eureka's clients
/// (30 s) and a margin for their clocks and a slow network.
pub const DEFAULT_WARMUP: Duration = Duration::from_secs(35);

impl Default for ServerConfig {
    /// Eureka's lease and delta defaults, [`DEFAULT_WARMUP`], self-preservation at 85 %, the
    /// default [`RegistrationLimits`] and [`HttpLimits`], 16 KiB bodies within 10 s, no
    /// authentication.
    fn default() -> ServerConfig {
        ServerConfig {
            lease_duration: Duration::from_secs(90),
            eviction_interval: Duration::from_secs(1),
            delta_retention: Duration::from_secs(180),
            warmup: DEFAULT_WARMUP,
            refuse_reads_while_warming: false,
            preservation: PreservationConfig::default(),
            limits: RegistrationLimits::default(),
            http: HttpLimits::default(),
            max_body: 16 * 1024,
            body_timeout: Duration::from_secs(10),
            auth: None,
            peers: None,
            response_cache_interval: Duration::ZERO,
            max_auth_failures: 20,
        }
    }
}

/// The embedded registry: its state, and where it publishes. Cheap to clone.
#[derive(Clone)]
pub struct EurekaRegistry {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for EurekaRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EurekaRegistry")
            .field("config", &self.shared.config)
            .finish_non_exhaustive()
    }
}

struct Shared {
    config: ServerConfig,
    /// Where the registry takes the time from.
    clock: Clock,
    /// When this registry started: it is still loading until `config.warmup` after.
    started: Instant,
    state: Mutex<Ledger>,
    tx: watch::Sender<Arc<Registry>>,
    health: SourceHealth,
    registry_metrics: Arc<RegistryMetrics>,
    metrics: Arc<ServerMetrics>,
    /// Counts changes; [`EurekaRegistry::run_publisher`] waits on it.
    changes: watch::Sender<u64>,
    /// The count of changes published so far.
    published: watch::Sender<u64>,
    /// `GET /apps` and `GET /apps/delta` as last written ([`Document`]): readers share one
    /// copy.
    answers: [Answers; 2],
    /// A permit per thread that may read (write, or wait for) a whole-registry answer at once
    /// ([`WHOLE_READERS`]): other readers wait for one without a thread.
    whole_readers: Arc<tokio::sync::Semaphore>,
    /// Failed authentications per source address.
    auth_throttle: Mutex<throttle::AuthThrottle>,
    peers: Peers,
    /// Filled from a peer at start: complete, no warm-up.
    filled: AtomicBool,
    /// This process's name among its peers ([`peers::NODE_HEADER`]).
    node: String,
}

/// Threads that may read the whole registry's answers at once: one writes each form of each
/// document at most, the others wait for it on their thread. Readers beyond wait for a
/// permit without a thread, so that a thousand readers of a changing registry take no more of
/// tokio's blocking threads (512), which the xDS server's heavy work shares, than these. Not
/// fewer: every reader waiting on a write gets that write's answer, and with 4 (measured,
/// 16 readers of a registry changing all the time) readers got a third of the answers.
pub const WHOLE_READERS: usize = 64;

/// A read of the whole registry, whose written answers readers share ([`answers`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Document {
    /// `GET /apps`.
    Apps,
    /// `GET /apps/delta`.
    Delta,
}

/// Why a request to the embedded registry was refused: the kind of refusal, and the text
/// for the client. The edge (`http.rs`) answers each kind with its HTTP status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct InvalidRequest {
    /// What kind of refusal.
    pub refusal: Refusal,
    /// What was wrong, for the client.
    pub reason: String,
}

/// The kinds of refusal of the registry's operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Not a valid request: a body that is not a registration, a name, field or value the
    /// [`policy`] refuses.
    Invalid,
    /// The caller may not do this ([`auth`]).
    Forbidden,
    /// No such app or instance.
    NotFound,
    /// A new instance, in a registry that holds as many as it may.
    Full,
    /// A registration older than the one registered (by `lastDirtyTimestamp`): the newer is
    /// kept, and the lease renewed.
    Older,
}

impl InvalidRequest {
    fn new(refusal: Refusal, reason: impl Into<String>) -> InvalidRequest {
        InvalidRequest {
            refusal,
            reason: reason.into(),
        }
    }

    fn invalid(reason: impl Into<String>) -> InvalidRequest {
        InvalidRequest::new(Refusal::Invalid, reason)
    }

    fn not_found(app: &str, id: &str) -> InvalidRequest {
        InvalidRequest::new(
            Refusal::NotFound,
            format!(
                "instance {} of app {} is not registered",
                clip(id),
                clip(app)
            ),
        )
    }

    fn forbidden(reason: String) -> InvalidRequest {
        InvalidRequest::new(Refusal::Forbidden, reason)
    }
}

impl From<policy::Refused> for InvalidRequest {
    fn from(refused: policy::Refused) -> InvalidRequest {
        InvalidRequest::invalid(refused.to_string())
    }
}

impl EurekaRegistry {
    /// An empty registry that publishes every change of its instances on `tx` (it publishes
    /// the empty registry at once) and reports to its [`SourceHealth`], to `registry_metrics`
    /// (what every source counts) and to `metrics` (what only the embedded registry does).
    pub fn new(
        config: ServerConfig,
        tx: watch::Sender<Arc<Registry>>,
        registry_metrics: Arc<RegistryMetrics>,
        metrics: Arc<ServerMetrics>,
    ) -> EurekaRegistry {
        EurekaRegistry::with_clock(config, Clock::default(), tx, registry_metrics, metrics)
    }

    /// [`EurekaRegistry::new`], taking the time from `clock`.
    fn with_clock(
        config: ServerConfig,
        clock: Clock,
        tx: watch::Sender<Arc<Registry>>,
        registry_metrics: Arc<RegistryMetrics>,
        metrics: Arc<ServerMetrics>,
    ) -> EurekaRegistry {
        let health = SourceHealth::new("embedded Eureka registry");
        let started = clock.instant();
        let terms = Terms {
            delta_retention: config.delta_retention,
            max_instances: config.limits.max_instances,
            preservation: config.preservation,
        };
        let ledger = Ledger::new(terms, started);
        let peers = Peers::new(config.peers.clone().unwrap_or_else(PeerConfig::none));
        let auth_throttle = Mutex::new(throttle::AuthThrottle::new(config.max_auth_failures));
        let registry = EurekaRegistry {
            shared: Arc::new(Shared {
                config,
                clock,
                started,
                state: Mutex::new(ledger),
                tx,
                health,
                registry_metrics,
                metrics,
                changes: watch::Sender::new(0),
                published: watch::Sender::new(0),
                answers: Default::default(),
                whole_readers: Arc::new(tokio::sync::Semaphore::new(WHOLE_READERS)),
                auth_throttle,
                peers,
                filled: AtomicBool::new(false),
                node: peers::node_name(),
            }),
        };
        registry.publish_now();
        registry
    }

    /// How the registry is doing, for `/readyz` and `/debug/registry` (always loaded).
    pub fn health(&self) -> SourceHealth {
        self.shared.health.clone()
    }

    /// The peers' replication counts, one series per peer: a collector for `/metrics`.
    pub fn peer_metrics(&self) -> PeerMetrics {
        self.shared.peers.metrics()
    }

    /// The configuration it was made with.
    pub fn config(&self) -> &ServerConfig {
        &self.shared.config
    }

    /// Whether the registry is still warming up after its start (see the module docs).
    pub fn is_warming_up(&self) -> bool {
        self.since(self.shared.started) < self.shared.config.warmup
            && !self.shared.filled.load(Ordering::Relaxed)
    }

    /// The REST API, under `/eureka` and `/eureka/v2`; with a tokens file, every request
    /// must authenticate (see [`auth`]).
    pub fn router(&self) -> Router {
        http::router(self.clone())
    }

    /// Registers (or registers again) an instance of `app` from its JSON registration body,
    /// as anyone (authentication off): see [`EurekaRegistry::register_as`].
    pub fn register(&self, app: &str, body: &[u8]) -> Result<(), InvalidRequest> {
        self.register_as(&Caller::Anyone, app, body)
    }

    /// Registers (or registers again) an instance of `app` from its JSON registration body,
    /// for `caller`. Refused, leaving the registry as it was: a body that is not a Eureka
    /// registration or breaks the [`policy`] ([`Refusal::Invalid`]), a VIP the caller may not
    /// claim or an instance another identity registered ([`Refusal::Forbidden`]), a new
    /// instance in a full registry ([`Refusal::Full`]).
    pub fn register_as(
        &self,
        caller: &Caller,
        app: &str,
        body: &[u8],
    ) -> Result<(), InvalidRequest> {
        let app = app.trim().to_ascii_uppercase();
        policy::check_app(&app)?;
        caller
            .may_register_app(&app)
            .map_err(InvalidRequest::forbidden)?;
        let info = admission::read_body(body)?;
        self.admit(caller, app, info, None)
    }

    /// Checks and records a registration of `info` under `app` (uppercase, checked): a
    /// client's (`copy` is `None`), whose owner is `caller`, or a peer's copy.
    fn admit(
        &self,
        caller: &Caller,
        app: String,
        info: InstanceInfo,
        copy: Option<PeerCopy>,
    ) -> Result<(), InvalidRequest> {
        let replicated = copy.is_some();
        let config = &self.shared.config;
        let admitted = admission::admit(caller, &app, info, copy, config)?;
        let (id, reported) = (admitted.id, admitted.registration.reported);
        self.report_fitted(&app, &id, &admitted.fitted);
        let (registered, forward) = self.record(caller, &app, &id, admitted.registration)?;
        if replicated {
            inc(&self.shared.metrics.eureka_peer_received_total);
            self.publish();
            return Ok(());
        }
        if let Some(forward) = forward {
            self.replicate(forward);
        }
        if registered.kept_newer {
            inc(&self.shared.metrics.eureka_registrations_older_total);
            return Err(InvalidRequest::new(
                Refusal::Older,
                "an instance registered with a newer lastDirtyTimestamp is kept (its lease is renewed); register with a newer one to change it",
            ));
        }
        self.registered(&app, &id, reported, &registered);
        Ok(())
    }

    /// Records `registration` of `app`/`id` in the ledger, if `caller` may change the
    /// instance registered there and the registry has room for a new one: what it did, and
    /// the write for the peers of a client's registration that changed something.
    fn record(
        &self,
        caller: &Caller,
        app: &str,
        id: &str,
        registration: Registration,
    ) -> Result<(Registered, Option<Replicated>), InvalidRequest> {
        let limits = &self.shared.config.limits;
        let max_instances = limits.max_instances;
        let replicated = registration.replicated;
        let mut state = self.lock();
        // A peer's copy was admitted by the node its client registered with; an operator has
        // no quota.
        let quota = (registration.owner.as_deref())
            .filter(|_| !replicated && !caller.is_operator())
            .map(|owner| (owner, state.owned_by(owner)));
        match state.lease(app, id) {
            Some(lease) => caller
                .may_change(lease.owner.as_deref())
                .map_err(InvalidRequest::forbidden)?,
            None if state.len() >= max_instances => {
                inc(&self.shared.metrics.eureka_refused_full_total);
                return Err(InvalidRequest::new(
                    Refusal::Full,
                    format!(
                        "the registry is full: it holds {max_instances} instances, the most it may (odmesh-control --eureka-max-instances)"
                    ),
                ));
            }
            None if let Some((owner, owned)) = quota
                && owned >= limits.max_instances_per_identity =>
            {
                inc(&self.shared.metrics.eureka_refused_identity_full_total);
                let max = limits.max_instances_per_identity;
                return Err(InvalidRequest::new(
                    Refusal::Full,
                    format!(
                        "{} has registered {owned} instances, the most one identity may (odmesh-control --eureka-max-instances-per-identity {max})",
                        clip(owner)
                    ),
                ));
            }
            None => {}
        }
        let registered = state.register(app, id, registration, self.now());
        let forward = (!replicated && !registered.kept_newer && self.has_peers())
            .then(|| state.lease(app, id).map(Replicated::register))
            .flatten();
        Ok((registered, forward))
    }

    /// Counts, logs and publishes a client's registration.
    fn registered(&self, app: &str, id: &str, reported: Status, registered: &Registered) {
        if registered.override_restored {
            inc(&self.shared.metrics.eureka_overrides_restored_total);
            odmesh_base::limited!(
                info,
                app = %clip(app),
                id = %clip(id),
                "eureka: an instance cancelled while overridden registered again; its override stays",
            );
        }
        inc(&self.shared.metrics.eureka_registrations_total);
        odmesh_base::limited!(
            info,
            app = %clip(app),
            id = %clip(id),
            status = reported.as_str(),
            "eureka: registered",
        );
        self.publish();
    }

    /// Says what [`policy::fit`] changed in a registration (log, metrics).
    fn report_fitted(&self, app: &str, id: &str, fitted: &policy::Fitted) {
        if fitted.is_unchanged() {
            return;
        }
        let metrics = &self.shared.metrics;
        if fitted.lease_clamped.is_some() {
            inc(&metrics.eureka_leases_clamped_total);
        }
        let dropped = fitted.metadata_dropped.len() as u64;
        (metrics.eureka_metadata_dropped_total).fetch_add(dropped, Ordering::Relaxed);
        odmesh_base::limited!(
            warn,
            app = %clip(app),
            id = %clip(id),
            lease_asked_secs = ?fitted.lease_clamped,
            max_lease = %duration_text(self.shared.config.limits.max_lease),
            metadata_left_out = ?fitted.metadata_dropped.iter().take(8).map(|k| clip(k)).collect::<Vec<_>>(),
            "eureka: registered within the limits: a lease shortened to --max-lease-duration, or metadata entries left out"
        );
    }

    /// Renews the lease of an instance (a heartbeat), for `caller`. A `last_dirty_timestamp`
    /// newer than the registered one is refused as not found, so that the client registers
    /// its newer data.
    pub fn renew(
        &self,
        caller: &Caller,
        app: &str,
        id: &str,
        last_dirty_timestamp: Option<u64>,
    ) -> Result<(), InvalidRequest> {
        let app = app.trim().to_ascii_uppercase();
        let mut state = self.lock();
        let Some(lease) = state.lease(&app, id) else {
            inc(&self.shared.metrics.eureka_renewals_not_found_total);
            tracing::debug!(app = %clip(&app), id = %clip(id), "eureka: heartbeat for an unknown instance");
            return Err(InvalidRequest::not_found(&app, id));
        };
        caller
            .may_change(lease.owner.as_deref())
            .map_err(InvalidRequest::forbidden)?;
        let renewed = state.renew(&app, id, last_dirty_timestamp, self.now());
        let forward = (renewed.is_ok() && self.has_peers())
            .then(|| {
                state
                    .lease(&app, id)
                    .map(|lease| Replicated::heartbeat(&app, id, lease))
            })
            .flatten();
        drop(state);
        inc(&self.shared.metrics.eureka_renewals_total);
        match renewed {
            Ok(()) => {
                if let Some(forward) = forward {
                    self.replicate(forward);
                }
                Ok(())
            }
            Err(RenewRefused::Unknown) => Err(InvalidRequest::not_found(&app, id)),
            Err(RenewRefused::Newer { theirs, ours }) => Err(InvalidRequest::new(
                Refusal::NotFound,
                format!(
                    "instance {} changed since it registered (lastDirtyTimestamp {theirs} > {ours}): register again",
                    clip(id)
                ),
            )),
        }
    }

    /// Removes an instance (its client is shutting down), for `caller`.
    ///
    /// An operator's override (a drain) outlives the cancel for one lease duration (see
    /// [`Ledger::cancel`]).
    pub fn cancel(&self, caller: &Caller, app: &str, id: &str) -> Result<(), InvalidRequest> {
        let app = app.trim().to_ascii_uppercase();
        let mut state = self.lock();
        may_change(caller, &state, &app, id)?;
        if state.cancel(&app, id, self.now()).is_none() {
            return Err(InvalidRequest::not_found(&app, id));
        }
        drop(state);
        self.replicate(Replicated::cancel(&app, id));
        inc(&self.shared.metrics.eureka_cancels_total);
        odmesh_base::limited!(info, app = %clip(&app), id = %clip(id), "eureka: cancelled");
        self.publish();
        Ok(())
    }

    /// Sets (`Some`) or removes (`None`) the status override of an instance, for `caller`.
    /// Removing it may also say which status the instance has now (`value` of
    /// `DELETE .../status`).
    pub fn set_status_override(
        &self,
        caller: &Caller,
        app: &str,
        id: &str,
        overridden: Option<Status>,
        reported: Option<Status>,
    ) -> Result<(), InvalidRequest> {
        let operator = caller.is_operator();
        let change = |lease: &mut Lease| {
            if lease.override_by_operator && !operator {
                return Err(InvalidRequest::forbidden(
                    "an operator set this instance's status override: only an operator changes or lifts it".to_owned(),
                ));
            }
            lease.overridden = overridden;
            lease.override_by_operator = overridden.is_some() && operator;
            if let Some(reported) = reported {
                lease.reported = reported;
            }
            lease.refresh_status();
            Ok(())
        };
        // As Eureka's servers replicate them: a Register would not change a real server's
        // override, and a real server's Register clears this one's.
        let replicated = |lease: &Lease| match overridden {
            Some(status) => Replicated::status_update(lease, status),
            None => Replicated::delete_override(lease),
        };
        self.modify(caller, app, id, change, replicated)?;
        inc(&self.shared.metrics.eureka_status_updates_total);
        odmesh_base::limited!(
            info,
            app = %clip(app),
            id = %clip(id),
            overridden = overridden.map_or("none", Status::as_str),
            "eureka: status override"
        );
        Ok(())
    }

    /// Sets metadata entries of an instance, for `caller`, within the metadata bounds of
    /// the [`policy`] (all or none).
    pub fn update_metadata(
        &self,
        caller: &Caller,
        app: &str,
        id: &str,
        entries: impl IntoIterator<Item = (String, String)>,
    ) -> Result<(), InvalidRequest> {
        let limits = &self.shared.config.limits;
        let entries: Vec<(String, String)> = entries.into_iter().collect();
        if entries.iter().any(|(key, _)| key == document::OWNER_KEY) {
            return Err(InvalidRequest::invalid(format!(
                "the metadata entry {} is the registry's own",
                document::OWNER_KEY
            )));
        }
        let change = |lease: &mut Lease| {
            let doc = lease.doc();
            let mut merged = doc.metadata.clone();
            merged.extend(entries);
            let data_center = (doc.data_center_info.iter()).flat_map(|dc| dc.metadata.iter());
            policy::check_metadata(merged.iter().chain(data_center), limits)?;
            lease.change_doc(|doc| doc.metadata = merged);
            Ok(())
        };
        self.modify(caller, app, id, change, Replicated::register)
    }

    fn modify(
        &self,
        caller: &Caller,
        app: &str,
        id: &str,
        change: impl FnOnce(&mut Lease) -> Result<(), InvalidRequest>,
        replicated: impl FnOnce(&Lease) -> Replicated,
    ) -> Result<(), InvalidRequest> {
        let app = app.trim().to_ascii_uppercase();
        let mut state = self.lock();
        may_change(caller, &state, &app, id)?;
        let changed = state.modify(&app, id, self.now(), change);
        let forward = (changed.as_ref().is_some_and(Result::is_ok) && self.has_peers())
            .then(|| state.lease(&app, id).map(replicated))
            .flatten();
        drop(state);
        changed.unwrap_or_else(|| Err(InvalidRequest::not_found(&app, id)))?;
        if let Some(forward) = forward {
            self.replicate(forward);
        }
        self.publish();
        Ok(())
    }

    /// One eviction round, with no delay to make up: see [`EurekaRegistry::evict_round`].
    pub fn evict_expired(&self) -> usize {
        self.evict_round(Duration::ZERO)
    }

    /// One eviction round: evicts the instances whose lease expired by now, unless
    /// self-preservation holds eviction, and at most its per-round share (oldest first);
    /// returns how many were evicted.
    ///
    /// `late`: how much later than planned this round runs. The registry could not take a
    /// heartbeat meanwhile either (the process was paused, or starved), so every lease is
    /// first extended by that much: a registry that stalls must not evict instances that
    /// did nothing wrong.
    pub fn evict_round(&self, late: Duration) -> usize {
        let metrics = &self.shared.metrics;
        let mut state = self.lock();
        let Eviction {
            evicted,
            held,
            verdict,
        } = state.evict(self.now(), late);
        drop(state);
        if !late.is_zero() {
            inc(&metrics.eureka_late_eviction_rounds_total);
            tracing::warn!(
                late = %duration_text(late),
                "eureka: an eviction round ran late; every lease is extended by the delay"
            );
        }
        set(
            &metrics.eureka_self_preservation,
            u64::from(!verdict.allows_eviction),
        );
        if verdict.changed {
            if verdict.allows_eviction {
                tracing::info!(
                    renewals = verdict.renewals,
                    expected = verdict.expected,
                    "eureka: renewals recovered; self-preservation released, eviction resumes"
                );
            } else {
                tracing::warn!(
                    renewals = verdict.renewals,
                    expected = verdict.expected,
                    "eureka: renewals fell below the self-preservation threshold; eviction stops until they recover"
                );
            }
        }
        set(&metrics.eureka_evictions_held, held as u64);
        for (app, id) in &evicted {
            odmesh_base::limited!(
                info,
                app = %clip(app),
                id = %clip(id),
                "eureka: lease expired; instance evicted",
            );
            inc(&metrics.eureka_evictions_total);
        }
        if !evicted.is_empty() {
            self.publish();
        }
        evicted.len()
    }

    /// Runs an eviction round every `eviction_interval`, forever, telling each round how
    /// late it runs (see [`EurekaRegistry::evict_round`]).
    pub async fn run_eviction(self) {
        let interval = self.shared.config.eviction_interval;
        let mut ticks = tokio::time::interval(interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last: Option<Instant> = None;
        loop {
            ticks.tick().await;
            let now = self.shared.clock.instant();
            // A little jitter is normal; a round more than one interval late is not.
            let late = last
                .map(|last| now.saturating_duration_since(last).saturating_sub(interval))
                .filter(|late| *late > interval)
                .unwrap_or_default();
            last = Some(now);
            self.evict_round(late);
        }
    }

    /// Every application, as `GET /apps` answers, with the version and hash code.
    pub fn applications(&self) -> Applications {
        let view = self.lock().applications();
        view.applications()
    }

    /// `GET /apps` written as JSON or XML, gzip-compressed or not, and shared by every reader
    /// (see [`answers`]). Blocking: call it off the async workers.
    pub fn applications_answer(&self, json: bool, gzip: bool) -> axum::body::Bytes {
        self.answer(Document::Apps, json, gzip)
    }

    /// [`Self::answer`] if the one written is up to date for a reader arriving now; `None`
    /// if it must be written or waited for (which blocks: see [`Self::answer`]).
    pub fn fresh_answer(
        &self,
        document: Document,
        json: bool,
        gzip: bool,
    ) -> Option<axum::body::Bytes> {
        let version = self.lock().version();
        let answers = &self.shared.answers[document as usize];
        let now = self.shared.clock.instant();
        let min_age = self.shared.config.response_cache_interval;
        answers.fresh(Answers::slot(json, gzip), version, now, min_age)
    }

    /// A permit to read a whole-registry answer on a blocking thread ([`WHOLE_READERS`]);
    /// waited for, and counted in `eureka_registry_readers_queued_total`, when every one is
    /// taken.
    pub async fn whole_reader(&self) -> tokio::sync::OwnedSemaphorePermit {
        let readers = &self.shared.whole_readers;
        if let Ok(permit) = readers.clone().try_acquire_owned() {
            return permit;
        }
        inc(&self.shared.metrics.eureka_registry_readers_queued_total);
        (readers.clone().acquire_owned())
            .await
            .expect("the semaphore is never closed")
    }

    /// `GET /apps` or `GET /apps/delta`, as [`Self::applications_answer`].
    pub fn answer(&self, document: Document, json: bool, gzip: bool) -> axum::body::Bytes {
        let version = self.lock().version();
        let answers = &self.shared.answers[document as usize];
        let slot = Answers::slot(json, gzip);
        let now = || self.shared.clock.instant();
        let min_age = self.shared.config.response_cache_interval;
        answers.get(slot, version, now, min_age, || {
            inc(&self.shared.metrics.eureka_registry_answers_written_total);
            if gzip {
                // The plain answer of the same version (or later), compressed.
                let plain = self.answer(document, json, false);
                return (version, crate::wire::gzip(&plain).into());
            }
            let view = match document {
                Document::Apps => self.lock().applications(),
                Document::Delta => self.lock().delta(self.shared.clock.instant()),
            };
            let body = if json {
                view.to_json()
            } else {
                xml::applications(&view.applications()).into_bytes()
            };
            (view.version, body.into())
        })
    }

    /// One application (`name` uppercase), as `GET /apps/{APP}` answers.
    pub fn application(&self, name: &str) -> Option<Application> {
        let served = self.lock().application(name)?;
        Some(Application {
            name: name.to_owned(),
            instance: served.iter().map(Served::info).collect(),
            ..Application::default()
        })
    }

    /// One instance of `app` (uppercase), as `GET /apps/{APP}/{ID}` answers.
    pub fn instance(&self, app: &str, id: &str) -> Option<InstanceInfo> {
        let served = self.lock().instance(app, id)?;
        Some(served.info())
    }

    /// The instance `id`, of whichever app, as `GET /instances/{ID}` answers.
    pub fn instance_by_id(&self, id: &str) -> Option<InstanceInfo> {
        let served = self.lock().instance_by_id(id)?;
        Some(served.info())
    }

    /// The instances whose `vipAddress` (`secure`: `secureVipAddress`) lists `vip`
    /// (lowercase), by application, with the version and hash code of the whole registry.
    pub fn serving(&self, vip: &str, secure: bool) -> Applications {
        let view = self.lock().serving(vip, secure);
        view.applications()
    }

    /// The changes within the delta retention, as `GET /apps/delta` answers: the latest
    /// change of each instance, oldest first, and the hash code of the whole registry.
    pub fn delta(&self) -> Applications {
        let view = self.lock().delta(self.shared.clock.instant());
        view.applications()
    }

    /// How long requests from `ip` are still refused for failed authentications, if they are.
    fn auth_throttled(&self, ip: std::net::IpAddr) -> Option<Duration> {
        let throttle = (self.shared.auth_throttle.lock()).unwrap_or_else(|e| e.into_inner());
        throttle.throttled(ip, self.shared.clock.instant())
    }

    /// Counts a request from `ip` without valid credentials.
    fn auth_failed(&self, ip: std::net::IpAddr) {
        let mut throttle = (self.shared.auth_throttle.lock()).unwrap_or_else(|e| e.into_inner());
        throttle.failed(ip, self.shared.clock.instant());
    }

    /// Now, as the ledger is told it.
    fn now(&self) -> Now {
        self.shared.clock.now()
    }

    /// How long ago `then` was.
    fn since(&self, then: Instant) -> Duration {
        self.shared.clock.instant().saturating_duration_since(then)
    }

    /// The ledger, locked.
    fn lock(&self) -> MutexGuard<'_, Ledger> {
        // The state stays consistent between statements; keep serving after a panic.
        self.shared.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Notes a change for the publisher ([`EurekaRegistry::run_publisher`]).
    fn publish(&self) {
        self.shared.changes.send_modify(|n| *n += 1);
    }

    /// Publishes every change, until the registry is dropped. Runs beside the REST API
    /// (see [`serve`]).
    ///
    /// Publishing is linear in the registry's size (cheap: instances are converted when they
    /// change, and shared), so it is kept off the requests: a registration or status change
    /// only counts a change and returns, and this task publishes whatever changed since its
    /// last publish. A burst of registrations is published in a few batches, not once per
    /// registration.
    ///
    /// It also publishes the end of the warm-up: the same instances, no longer loading.
    pub async fn run_publisher(self) {
        let mut changes = self.shared.changes.subscribe();
        let warm = self.shared.started + self.shared.config.warmup;
        loop {
            let upto = *changes.borrow_and_update();
            self.publish_now();
            self.shared.published.send_replace(upto);
            let warming = self.shared.clock.instant() < warm;
            tokio::select! {
                changed = changes.changed() => if changed.is_err() { return },
                () = tokio::time::sleep_until(warm), if warming => {
                    tracing::info!(
                        instances = self.shared.tx.borrow().len(),
                        "eureka: warm-up over; the registry is complete"
                    );
                    continue;
                }
            }
            // Changes right behind this one are published together, after a short wait.
            tokio::time::sleep(PUBLISH_INTERVAL).await;
        }
    }

    /// Waits until every change made before the call is published (its registry sent to
    /// the mesh). Needs [`EurekaRegistry::run_publisher`] running.
    pub async fn published(&self) {
        let want = *self.shared.changes.borrow();
        let mut published = self.shared.published.subscribe();
        // The sender lives in `self`, so the wait cannot fail.
        let _ = published.wait_for(|&n| n >= want).await;
    }

    /// Converts the state to the plain model and publishes it if it changed.
    fn publish_now(&self) {
        let shared = &self.shared;
        let mut parsed = self.lock().to_registry();
        parsed.registry = parsed.registry.still_loading(self.is_warming_up());
        let new_warnings = shared.health.record_success(
            &shared.registry_metrics,
            &parsed.registry,
            &parsed.warnings,
        );
        for w in new_warnings {
            odmesh_base::limited!(
                warn,
                "eureka: registered instance not fully usable: {}",
                odmesh_base::logs::clip_at(&w, 300),
            );
        }
        odmesh_registry::publish(&shared.tx, parsed.registry);
    }
}

/// Whether `caller` may change the registered instance `app`/`id`: not if there is none, nor
/// if another identity registered it.
fn may_change(caller: &Caller, state: &Ledger, app: &str, id: &str) -> Result<(), InvalidRequest> {
    let lease = state
        .lease(app, id)
        .ok_or_else(|| InvalidRequest::not_found(app, id))?;
    caller
        .may_change(lease.owner.as_deref())
        .map_err(InvalidRequest::forbidden)
}

/// Runs the REST API on `listener` (over TLS with `tls`, each new connection with the
/// certificate in force when it arrives), within the configured
/// [`HttpLimits`], beside the publisher of changes and the eviction of expired leases,
/// until the server fails.
pub async fn serve(
    listener: TcpListener,
    registry: EurekaRegistry,
    tls: Option<Arc<ServerTls>>,
) -> std::io::Result<()> {
    let metrics = registry.shared.metrics.clone();
    let on_event = move |event| {
        let counter = match event {
            HttpEvent::ConnectionRefused => &metrics.eureka_http_connections_refused_total,
            HttpEvent::SourceRefused => &metrics.eureka_http_source_refused_total,
            HttpEvent::Timeout => &metrics.eureka_http_timeouts_total,
            HttpEvent::TlsFailed => &metrics.eureka_http_tls_failures_total,
        };
        inc(counter);
    };
    let limits = registry.shared.config.http;
    let http = http_server::serve(
        listener,
        registry.router(),
        limits,
        tls,
        on_event,
        std::future::pending(),
    );
    // One future for all three, so that dropping (or aborting) it stops them all.
    tokio::select! {
        result = http => result,
        () = registry.clone().run_publisher() => Ok(()),
        () = registry.clone().run_eviction() => Ok(()),
        () = registry.clone().run_peers() => Ok(()),
    }
}

/// A running embedded registry: the registry in use, how it is doing, and its task.
#[derive(Debug)]
pub struct EmbeddedSource {
    /// The registered instances; changes on every registration, cancel, status change and
    /// eviction.
    pub registry: watch::Receiver<Arc<Registry>>,
    /// For `/readyz` and `/debug/registry`: loaded from the start.
    pub health: SourceHealth,
    /// The HTTP server and the eviction; runs until aborted.
    pub task: JoinHandle<()>,
    /// Where it listens (useful with port 0).
    pub local_addr: SocketAddr,
    /// The registry itself, for in-process use.
    pub eureka: EurekaRegistry,
}

/// Binds `addr` and serves the embedded registry there, over TLS with `tls` (see [`serve`]).
pub async fn start(
    addr: SocketAddr,
    config: ServerConfig,
    tls: Option<Arc<ServerTls>>,
    registry_metrics: Arc<RegistryMetrics>,
    metrics: Arc<ServerMetrics>,
) -> std::io::Result<EmbeddedSource> {
    let listener = TcpListener::bind(addr).await?;
    let local_addr = listener.local_addr()?;
    let (tx, registry) = watch::channel(Arc::new(Registry::loading()));
    let scheme = if tls.is_some() { "https" } else { "http" };
    let authenticated = config.auth.is_some();
    let warmup = config.warmup;
    let mut config = config;
    config.peers = config.peers.map(|peers| peers.without(local_addr));
    let peers: Vec<String> = (config.peers.iter())
        .flat_map(|p| p.urls.iter().map(ToString::to_string))
        .collect();
    let eureka = EurekaRegistry::new(config, tx, registry_metrics, metrics);
    let health = eureka.health();
    let server = eureka.clone();
    let task = tokio::spawn(async move {
        let fill = server.clone();
        let filling = tokio::spawn(async move { fill.fill_from_peers().await });
        let served = serve(listener, server, tls).await;
        filling.abort();
        if let Err(e) = served {
            tracing::error!(error = %e, "embedded Eureka registry stopped");
        }
    });
    tracing::info!(
        url = %format!("{scheme}://{local_addr}/eureka"),
        authenticated,
        warmup = %duration_text(warmup),
        ?peers,
        "embedded Eureka registry listening"
    );
    Ok(EmbeddedSource {
        registry,
        health,
        task,
        local_addr,
        eureka,
    })
}

#[cfg(test)]
mod tests;
