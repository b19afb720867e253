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
//! with a tokens file, authenticated and authorised ([`auth`]). There is no peer replication:
//! this registry is for one control plane.
//!
//! Where this differs from Netflix's server, on purpose: removing a status override restores
//! the status the instance itself reported (Eureka sets `UNKNOWN` until the next heartbeat
//! fails and the client registers again, which would drain a healthy instance for up to a
//! heartbeat interval); a metadata update of an unknown instance answers 404, not 500;
//! registration fills in a missing `hostName` (with `ipAddr`) and `dataCenterInfo` (`MyOwn`)
//! instead of refusing the instance, so a hand-written `curl` registration works.

pub mod auth;
pub mod policy;
pub mod preservation;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::ops::Bound;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Body;
use axum::extract::{Extension, Path, Query, Request, State as AxState};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use odmesh_base::http_server::{self, HttpEvent, HttpLimits};
use odmesh_base::logs::{self, clip};
use odmesh_base::metrics::{inc, set};

use self::auth::{Authenticator, Caller};
use self::policy::RegistrationLimits;
use self::preservation::{PreservationConfig, SelfPreservation};

use odmesh_registry::{
    Group, Instance, InvalidInstance, Parsed, Registry, RegistryMetrics, SourceHealth, Status,
    split_vips,
};

use crate::ServerMetrics;
use crate::wire::json::{
    ActionType, Application, ApplicationDocument, Applications, ApplicationsDocument,
    DataCenterInfo, InstanceDocument, InstanceInfo, LeaseInfo, reconcile_hash_code,
};
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
            preservation: PreservationConfig::default(),
            limits: RegistrationLimits::default(),
            http: HttpLimits::default(),
            max_body: 16 * 1024,
            body_timeout: Duration::from_secs(10),
            auth: None,
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
    /// `GET /apps` as last written, in JSON and in XML: readers share one copy.
    apps_answers: Mutex<[Option<CachedAnswer>; 2]>,
}

/// A written `GET /apps` answer, and the registry version it shows.
#[derive(Clone)]
struct CachedAnswer {
    version: u64,
    written: Instant,
    body: axum::body::Bytes,
}

/// How long a written `GET /apps` answer is served while the registry does not change
/// (lease timestamps in it move on meanwhile): Eureka's response cache does the same.
const ANSWER_MAX_AGE: Duration = Duration::from_secs(30);

struct Ledger {
    /// APP (uppercase) → instance id → lease.
    apps: BTreeMap<String, BTreeMap<String, Lease>>,
    /// For `/apps/delta`: the latest change of each instance within the retention, keyed
    /// by the `version` it made (so oldest first). One entry per instance, however often it
    /// changes.
    recent: BTreeMap<u64, Change>,
    /// (APP, id) → the key of that instance's change in `recent`.
    latest: HashMap<(String, String), u64>,
    /// APP → its instances as the mesh sees them, converted when their lease changed: what
    /// is published, kept apart from the leases, one shared group per app, so that a publish
    /// copies one pointer per app.
    published: BTreeMap<String, Published>,
    /// (APP, id) → what was left out of the instance, and why; only instances with warnings.
    warned: BTreeMap<(String, String), Vec<InvalidInstance>>,
    /// Bumped on every change; served as `versions__delta`.
    version: u64,
    /// Renewals counted for self-preservation.
    preservation: SelfPreservation,
    /// (APP, id) → the status override of a cancelled instance, and until when it comes
    /// back with a registration of the same instance (see [`EurekaRegistry::cancel`]).
    cancelled_overrides: CancelledOverrides,
    /// How many leases there are (all apps).
    leases: usize,
}

struct Lease {
    /// As served, with the server's status and timestamps.
    info: InstanceInfo,
    /// The status the instance itself reported when it registered.
    reported: Status,
    /// An operator's override (`PUT .../status`).
    overridden: Option<Status>,
    renewed: Instant,
    duration: Duration,
    /// When this lease began (registration), for self-preservation's expectations.
    registered: Instant,
    /// How often the client says it renews (`leaseInfo.renewalIntervalInSecs`), within 1 s
    /// and the lease.
    renewal_interval: Duration,
    /// When a renewal of it last counted for self-preservation.
    counted: Instant,
    /// The identity that registered it, when authentication is on.
    owner: Option<String>,
}

/// One app's instances, converted for the mesh.
#[derive(Default)]
struct Published {
    /// id → instance.
    by_id: BTreeMap<String, Arc<Instance>>,
    /// The same instances, in id order, as they are published.
    group: Group,
}

impl Ledger {
    /// Converts the instance `app`/`id` for the mesh again after its lease changed, or
    /// forgets it if the lease is gone, and rebuilds its app's group. Publishing a registry
    /// of a million instances thus converts none of them.
    fn convert(&mut self, app: &str, id: &str) {
        let key = (app.to_owned(), id.to_owned());
        let mut warnings = Vec::new();
        let instance = match self.apps.get(app).and_then(|leases| leases.get(id)) {
            None => None,
            Some(lease) => match lease.info.to_instance(app, 0, &mut warnings) {
                Ok(instance) => Some(Arc::new(instance)),
                Err(e) => {
                    warnings.push(e);
                    None
                }
            },
        };
        let published = self.published.entry(app.to_owned()).or_default();
        match instance {
            Some(instance) => published.by_id.insert(id.to_owned(), instance),
            None => published.by_id.remove(id),
        };
        if published.by_id.is_empty() {
            self.published.remove(app);
        } else {
            published.group = published.by_id.values().cloned().collect::<Vec<_>>().into();
        }
        if warnings.is_empty() {
            self.warned.remove(&key);
        } else {
            self.warned.insert(key, warnings);
        }
    }
}

impl Lease {
    /// Eureka's rule (its `DownOrStartingRule`): an override wins only over an instance
    /// that says `UP` or `OUT_OF_SERVICE`; one that says `DOWN`, `STARTING` or `UNKNOWN` is
    /// that.
    fn effective_status(&self) -> Status {
        match self.reported {
            Status::Up | Status::OutOfService => self.overridden.unwrap_or(self.reported),
            other => other,
        }
    }

    /// Writes the effective and overridden status into `info`.
    fn refresh_status(&mut self) {
        let status = self.effective_status();
        let overridden = self.overridden.unwrap_or(Status::Unknown).as_str();
        self.info.status = Some(status.as_str().to_owned());
        self.info.overridden_status = Some(overridden.to_owned());
        self.info.overriddenstatus_legacy = Some(overridden.to_owned());
    }

    fn expired(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.renewed) >= self.duration
    }
}

struct Change {
    at: Instant,
    app: String,
    id: String,
    /// The instance as it was after the change, with its `actionType`.
    info: InstanceInfo,
}

/// Why a request to the embedded registry was refused: the answer's status and text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct InvalidRequest {
    /// The HTTP status of the answer.
    pub status: u16,
    /// What was wrong, for the client.
    pub reason: String,
}

impl InvalidRequest {
    fn new(status: StatusCode, reason: impl Into<String>) -> InvalidRequest {
        InvalidRequest {
            status: status.as_u16(),
            reason: reason.into(),
        }
    }

    fn not_found(app: &str, id: &str) -> InvalidRequest {
        InvalidRequest::new(
            StatusCode::NOT_FOUND,
            format!(
                "instance {} of app {} is not registered",
                clip(id),
                clip(app)
            ),
        )
    }

    fn forbidden(reason: String) -> InvalidRequest {
        InvalidRequest::new(StatusCode::FORBIDDEN, reason)
    }
}

impl From<policy::Refused> for InvalidRequest {
    fn from(refused: policy::Refused) -> InvalidRequest {
        InvalidRequest::new(StatusCode::BAD_REQUEST, refused.to_string())
    }
}

impl IntoResponse for InvalidRequest {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::BAD_REQUEST);
        (status, format!("{}\n", self.reason)).into_response()
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
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
        let health = SourceHealth::new("embedded Eureka registry");
        let started = Instant::now();
        let ledger = Ledger {
            apps: BTreeMap::new(),
            recent: BTreeMap::new(),
            latest: HashMap::new(),
            published: BTreeMap::new(),
            warned: BTreeMap::new(),
            version: 0,
            preservation: SelfPreservation::new(config.preservation, started),
            cancelled_overrides: CancelledOverrides::default(),
            leases: 0,
        };
        let registry = EurekaRegistry {
            shared: Arc::new(Shared {
                config,
                started,
                state: Mutex::new(ledger),
                tx,
                health,
                registry_metrics,
                metrics,
                changes: watch::Sender::new(0),
                published: watch::Sender::new(0),
                apps_answers: Mutex::new([None, None]),
            }),
        };
        registry.publish_now();
        registry
    }

    /// How the registry is doing, for `/readyz` and `/debug/registry` (always loaded).
    pub fn health(&self) -> SourceHealth {
        self.shared.health.clone()
    }

    /// The configuration it was made with.
    pub fn config(&self) -> &ServerConfig {
        &self.shared.config
    }

    /// Whether the registry is still warming up after its start (see the module docs).
    pub fn is_warming_up(&self) -> bool {
        self.shared.started.elapsed() < self.shared.config.warmup
    }

    /// The REST API, under `/eureka` and `/eureka/v2`; with a tokens file, every request
    /// must authenticate (see [`auth`]).
    pub fn router(&self) -> Router {
        let api = Router::new()
            .route("/apps", get(get_apps))
            .route("/apps/", get(get_apps))
            .route("/apps/delta", get(get_delta))
            .route("/apps/{app}", get(get_app).post(register))
            .route(
                "/apps/{app}/{id}",
                get(get_instance).put(renew).delete(cancel),
            )
            .route(
                "/apps/{app}/{id}/status",
                put(put_status).delete(delete_status),
            )
            .route("/apps/{app}/{id}/metadata", put(put_metadata))
            .route("/instances/{id}", get(get_instance_by_id))
            .route("/vips/{vip}", get(get_vip))
            .route("/svips/{svip}", get(get_svip))
            .layer(middleware::from_fn_with_state(self.clone(), authenticate))
            .with_state(self.clone());
        Router::new()
            .nest("/eureka/v2", api.clone())
            .nest("/eureka", api)
    }

    /// Registers (or registers again) an instance of `app` from its JSON registration body,
    /// as anyone (authentication off): see [`EurekaRegistry::register_as`].
    pub fn register(&self, app: &str, body: &[u8]) -> Result<(), InvalidRequest> {
        self.register_as(&Caller::Anyone, app, body)
    }

    /// Registers (or registers again) an instance of `app` from its JSON registration body,
    /// for `caller`. Refused, leaving the registry as it was: a body that is not a Eureka
    /// registration or breaks the [`policy`] (400), a VIP the caller may not claim or an
    /// instance another identity registered (403), a new instance in a full registry (503).
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
        if body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'<') {
            return Err(InvalidRequest::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "XML registrations are not supported: send {\"instance\": {...}} as JSON",
            ));
        }
        let doc: InstanceDocument = serde_json::from_slice(body).map_err(|e| {
            InvalidRequest::new(
                StatusCode::BAD_REQUEST,
                format!("not a Eureka registration ({{\"instance\": {{...}}}}): {e}"),
            )
        })?;
        let mut info = doc.instance;
        match info.app.as_deref().map(str::trim) {
            Some(named) if !named.is_empty() && !named.eq_ignore_ascii_case(&app) => {
                return Err(InvalidRequest::new(
                    StatusCode::BAD_REQUEST,
                    format!("mismatched app name: the path says {app:?}, the instance {named:?}"),
                ));
            }
            _ => info.app = Some(app.clone()),
        }
        let Some(ip) = info.ip_addr.clone().filter(|ip| !ip.trim().is_empty()) else {
            return Err(InvalidRequest::new(
                StatusCode::BAD_REQUEST,
                "missing ipAddr",
            ));
        };
        if info
            .host_name
            .as_deref()
            .is_none_or(|h| h.trim().is_empty())
        {
            info.host_name = Some(ip);
        }
        let Some(id) = info.id().map(str::to_owned) else {
            return Err(InvalidRequest::new(
                StatusCode::BAD_REQUEST,
                "missing instanceId",
            ));
        };
        info.instance_id = Some(id.clone());
        let limits = &self.shared.config.limits;
        policy::check_instance(&info, limits)?;
        let claimed = split_vips(info.vip_address.as_deref().unwrap_or_default())
            .into_iter()
            .chain(split_vips(
                info.secure_vip_address.as_deref().unwrap_or_default(),
            ));
        for vip in claimed {
            caller.may_claim(&vip).map_err(InvalidRequest::forbidden)?;
        }
        info.data_center_info
            .get_or_insert_with(DataCenterInfo::my_own);
        info.action_type = None;

        let now = now_ms();
        let mut lease_info = info.lease_info.take().unwrap_or_default();
        let duration = match lease_info.duration_in_secs {
            Some(secs) if secs > 0 => Duration::from_secs(secs),
            _ => self.shared.config.lease_duration,
        };
        let reported = info.status();
        // What the client says, within 1 s and its lease (a lease it cannot renew in time
        // makes no sense, and would weigh more in self-preservation than it should).
        let renewal_interval =
            Duration::from_secs(lease_info.renewal_interval_in_secs.unwrap_or(30))
                .clamp(Duration::from_secs(1), duration.max(Duration::from_secs(1)));
        let mut state = self.lock();
        let existing = state.apps.get(&app).and_then(|leases| leases.get(&id));
        match existing {
            Some(lease) => caller
                .may_change(lease.owner.as_deref())
                .map_err(InvalidRequest::forbidden)?,
            None if state.leases >= limits.max_instances => {
                inc(&self.shared.metrics.eureka_refused_full_total);
                return Err(InvalidRequest::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!(
                        "the registry is full: it holds {} instances, the most it may (odmesh-control --eureka-max-instances)",
                        limits.max_instances
                    ),
                ));
            }
            None => {}
        }
        let body_override = info
            .overridden_status
            .as_deref()
            .or(info.overriddenstatus_legacy.as_deref())
            .and_then(Status::parse)
            .filter(|s| *s != Status::Unknown);
        let known = existing.map(|l| {
            let up = (l.info.lease_info.as_ref()).and_then(|l| l.service_up_timestamp);
            (l.overridden, up)
        });
        let (overridden, service_up) = match known {
            Some((overridden, up)) => (overridden.or(body_override), up),
            None => {
                // The override it had if it was cancelled within one lease duration.
                let key = (app.clone(), id.clone());
                let restored = state.cancelled_overrides.take(&key, Instant::now());
                if restored.is_some() {
                    inc(&self.shared.metrics.eureka_overrides_restored_total);
                    odmesh_base::limited!(
                        info,
                        app = %clip(&app),
                        id = %clip(&id),
                        "eureka: an instance cancelled while overridden registered again; its override stays",
                    );
                }
                (restored.or(body_override), None)
            }
        };
        let service_up = service_up
            .filter(|t| *t > 0)
            .or((reported == Status::Up).then_some(now));
        lease_info = LeaseInfo {
            renewal_interval_in_secs: Some(lease_info.renewal_interval_in_secs.unwrap_or(30)),
            duration_in_secs: Some(duration.as_secs()),
            registration_timestamp: Some(now),
            last_renewal_timestamp: Some(now),
            eviction_timestamp: Some(0),
            service_up_timestamp: Some(service_up.unwrap_or(0)),
            other: lease_info.other,
        };
        info.lease_info = Some(lease_info);
        info.last_updated_timestamp = Some(now);
        info.last_dirty_timestamp = Some(info.last_dirty_timestamp.unwrap_or(now));
        info.is_coordinating_discovery_server.get_or_insert(false);
        let now_instant = Instant::now();
        let mut lease = Lease {
            info,
            reported,
            overridden,
            renewed: now_instant,
            duration,
            registered: now_instant,
            counted: now_instant,
            renewal_interval,
            owner: caller.owner().map(str::to_owned),
        };
        lease.refresh_status();
        let snapshot = lease.info.clone();
        if (state.apps.entry(app.clone()).or_default())
            .insert(id.clone(), lease)
            .is_none()
        {
            state.leases += 1;
        }
        state.convert(&app, &id);
        self.record(&mut state, &app, &id, snapshot, ActionType::Added);
        inc(&self.shared.metrics.eureka_registrations_total);
        odmesh_base::limited!(
            info,
            app = %clip(&app),
            id = %clip(&id),
            status = reported.as_str(),
            "eureka: registered",
        );
        drop(state);
        self.publish();
        Ok(())
    }

    /// Renews the lease of an instance (a heartbeat), for `caller`. A `last_dirty_timestamp`
    /// newer than the registered one answers 404, so that the client registers its newer
    /// data.
    pub fn renew(
        &self,
        caller: &Caller,
        app: &str,
        id: &str,
        last_dirty_timestamp: Option<u64>,
    ) -> Result<(), InvalidRequest> {
        let app = app.trim().to_ascii_uppercase();
        let now = Instant::now();
        let mut state = self.lock();
        let Some(lease) = state.apps.get_mut(&app).and_then(|l| l.get_mut(id)) else {
            inc(&self.shared.metrics.eureka_renewals_not_found_total);
            tracing::debug!(app = %clip(&app), id = %clip(id), "eureka: heartbeat for an unknown instance");
            return Err(InvalidRequest::not_found(&app, id));
        };
        caller
            .may_change(lease.owner.as_deref())
            .map_err(InvalidRequest::forbidden)?;
        lease.renewed = now;
        if let Some(l) = lease.info.lease_info.as_mut() {
            l.last_renewal_timestamp = Some(now_ms());
        }
        // Self-preservation counts at most one renewal per half the lease's interval: a client
        // heartbeating faster than it said cannot hide that others went quiet.
        let counts = now.saturating_duration_since(lease.counted) >= lease.renewal_interval / 2;
        if counts {
            lease.counted = now;
        }
        let answer = match (last_dirty_timestamp, lease.info.last_dirty_timestamp) {
            (Some(theirs), Some(ours)) if theirs > ours => Err(InvalidRequest::new(
                StatusCode::NOT_FOUND,
                format!(
                    "instance {} changed since it registered (lastDirtyTimestamp {theirs} > {ours}): register again",
                    clip(id)
                ),
            )),
            _ => Ok(()),
        };
        if counts {
            state.preservation.renewed(now);
        }
        inc(&self.shared.metrics.eureka_renewals_total);
        answer
    }

    /// Removes an instance (its client is shutting down), for `caller`.
    ///
    /// An operator's override (a drain: `OUT_OF_SERVICE`) outlives the cancel for one lease
    /// duration: a client that registers again while it shuts down (py-eureka-client's
    /// heartbeat, racing its own stop, gets 404 and registers the instance `UP`) does not
    /// bring a drained instance back into traffic just as it exits. Netflix's server forgets
    /// the override at once.
    pub fn cancel(&self, caller: &Caller, app: &str, id: &str) -> Result<(), InvalidRequest> {
        let app = app.trim().to_ascii_uppercase();
        let mut state = self.lock();
        let Some(lease) = state.apps.get(&app).and_then(|l| l.get(id)) else {
            return Err(InvalidRequest::not_found(&app, id));
        };
        caller
            .may_change(lease.owner.as_deref())
            .map_err(InvalidRequest::forbidden)?;
        let Some(lease) = remove(&mut state, &app, id) else {
            return Err(InvalidRequest::not_found(&app, id));
        };
        if let Some(overridden) = lease.overridden {
            let now = Instant::now();
            let until = now.checked_add(lease.duration).unwrap_or(now);
            // Bounded like the registry: the oldest go first.
            let max = self.shared.config.limits.max_instances.max(1);
            (state.cancelled_overrides).keep((app.clone(), id.to_owned()), overridden, until, max);
        }
        self.record(&mut state, &app, id, lease.info, ActionType::Deleted);
        inc(&self.shared.metrics.eureka_cancels_total);
        odmesh_base::limited!(info, app = %clip(&app), id = %clip(id), "eureka: cancelled");
        drop(state);
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
        self.modify(caller, app, id, |lease| {
            lease.overridden = overridden;
            if let Some(reported) = reported {
                lease.reported = reported;
            }
            lease.refresh_status();
            Ok(())
        })?;
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
        self.modify(caller, app, id, |lease| {
            let mut merged = lease.info.metadata.clone();
            merged.extend(entries);
            let data_center = lease
                .info
                .data_center_info
                .iter()
                .flat_map(|dc| dc.metadata.iter());
            policy::check_metadata(merged.iter().chain(data_center), limits)?;
            lease.info.metadata = merged;
            Ok(())
        })
    }

    fn modify(
        &self,
        caller: &Caller,
        app: &str,
        id: &str,
        change: impl FnOnce(&mut Lease) -> Result<(), InvalidRequest>,
    ) -> Result<(), InvalidRequest> {
        let app = app.trim().to_ascii_uppercase();
        let mut state = self.lock();
        let Some(lease) = state.apps.get_mut(&app).and_then(|l| l.get_mut(id)) else {
            return Err(InvalidRequest::not_found(&app, id));
        };
        caller
            .may_change(lease.owner.as_deref())
            .map_err(InvalidRequest::forbidden)?;
        change(lease)?;
        lease.info.last_updated_timestamp = Some(now_ms());
        let snapshot = lease.info.clone();
        state.convert(&app, id);
        self.record(&mut state, &app, id, snapshot, ActionType::Modified);
        drop(state);
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
        let now = Instant::now();
        let metrics = &self.shared.metrics;
        let mut state = self.lock();
        if !late.is_zero() {
            for lease in state.apps.values_mut().flat_map(BTreeMap::values_mut) {
                lease.renewed += late;
            }
            inc(&metrics.eureka_late_eviction_rounds_total);
            tracing::warn!(
                late_ms = late.as_millis() as u64,
                "eureka: an eviction round ran late; every lease is extended by the delay"
            );
        }
        let mut expired: Vec<(Instant, String, String)> = state
            .apps
            .iter()
            .flat_map(|(app, leases)| {
                leases
                    .iter()
                    .filter(|(_, lease)| lease.expired(now))
                    .map(move |(id, lease)| (lease.renewed, app.clone(), id.clone()))
            })
            .collect();
        let leases = state.leases;
        let Ledger {
            apps, preservation, ..
        } = &mut *state;
        let instances = (apps.values().flat_map(BTreeMap::values))
            .map(|lease| (lease.registered, lease.renewal_interval));
        let verdict = preservation.allows_eviction(now, instances);
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
        let limit = if verdict.allows_eviction {
            preservation.eviction_limit(leases)
        } else {
            0
        };
        let held = expired.len().saturating_sub(limit);
        set(&metrics.eureka_evictions_held, held as u64);
        if held > 0 {
            // The longest silent go first.
            expired.sort();
            expired.truncate(limit);
        }
        for (_, app, id) in &expired {
            if let Some(mut lease) = remove(&mut state, app, id) {
                if let Some(l) = lease.info.lease_info.as_mut() {
                    l.eviction_timestamp = Some(now_ms());
                }
                odmesh_base::limited!(
                    info,
                    app = %clip(app),
                    id = %clip(id),
                    "eureka: lease expired; instance evicted",
                );
                self.record(&mut state, app, id, lease.info, ActionType::Deleted);
                inc(&metrics.eureka_evictions_total);
            }
        }
        drop(state);
        if !expired.is_empty() {
            self.publish();
        }
        expired.len()
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
            let now = Instant::now();
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
        let state = self.lock();
        full_applications(&state)
    }

    /// `GET /apps` written as JSON or XML. Written once per registry version (and at most
    /// every 30 s), and shared by every reader meanwhile: a thousand clients reading the
    /// registry, slowly or not, cost one copy of it and one conversion.
    pub fn applications_answer(&self, json: bool) -> axum::body::Bytes {
        let version = self.lock().version;
        let slot = usize::from(json);
        let answers = || (self.shared.apps_answers.lock()).unwrap_or_else(|e| e.into_inner());
        if let Some(hit) = &answers()[slot]
            && hit.version == version
            && hit.written.elapsed() < ANSWER_MAX_AGE
        {
            return hit.body.clone();
        }
        let (version, applications) = {
            let state = self.lock();
            (state.version, full_applications(&state))
        };
        let body: axum::body::Bytes = if json {
            serde_json::to_vec(&ApplicationsDocument { applications })
                .unwrap_or_default()
                .into()
        } else {
            xml::applications(&applications).into()
        };
        let answer = CachedAnswer {
            version,
            written: Instant::now(),
            body: body.clone(),
        };
        answers()[slot] = Some(answer);
        body
    }

    /// One application (`name` uppercase), as `GET /apps/{APP}` answers.
    pub fn application(&self, name: &str) -> Option<Application> {
        let state = self.lock();
        state.apps.get(name).map(|leases| Application {
            name: name.to_owned(),
            instance: leases.values().map(|l| l.info.clone()).collect(),
            ..Application::default()
        })
    }

    /// The instances that `field` (`vipAddress` or `secureVipAddress`) says serve `vip`
    /// (lowercase), by application, with the version and hash code of the whole registry.
    fn serving(&self, vip: &str, field: impl Fn(&InstanceInfo) -> &Option<String>) -> Applications {
        let state = self.lock();
        let application = state
            .apps
            .iter()
            .filter_map(|(name, leases)| {
                let instance: Vec<InstanceInfo> = leases
                    .values()
                    .map(|l| &l.info)
                    .filter(|i| {
                        split_vips(field(i).as_deref().unwrap_or_default())
                            .iter()
                            .any(|v| v == vip)
                    })
                    .cloned()
                    .collect();
                (!instance.is_empty()).then(|| Application {
                    name: name.clone(),
                    instance,
                    ..Application::default()
                })
            })
            .collect();
        document(&state, application)
    }

    /// The changes within the delta retention, as `GET /apps/delta` answers: the latest
    /// change of each instance, oldest first, and the hash code of the whole registry.
    pub fn delta(&self) -> Applications {
        let mut state = self.lock();
        let config = &self.shared.config;
        prune(
            &mut state,
            config.delta_retention,
            config.limits.max_instances.max(1),
        );
        let mut apps: Vec<Application> = Vec::new();
        let mut index: HashMap<&str, usize> = HashMap::new();
        for change in state.recent.values() {
            let i = *index.entry(change.app.as_str()).or_insert_with(|| {
                apps.push(Application {
                    name: change.app.clone(),
                    ..Application::default()
                });
                apps.len() - 1
            });
            apps[i].instance.push(change.info.clone());
        }
        document(&state, apps)
    }

    fn lock(&self) -> MutexGuard<'_, Ledger> {
        // The state stays consistent between statements; keep serving after a panic.
        self.shared.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn record(
        &self,
        state: &mut Ledger,
        app: &str,
        id: &str,
        mut info: InstanceInfo,
        action: ActionType,
    ) {
        info.action_type = Some(action);
        state.version += 1;
        let version = state.version;
        let key = (app.to_owned(), id.to_owned());
        if let Some(older) = state.latest.insert(key, version) {
            state.recent.remove(&older);
        }
        state.recent.insert(
            version,
            Change {
                at: Instant::now(),
                app: app.to_owned(),
                id: id.to_owned(),
                info,
            },
        );
        // Register-and-cancel churn with new ids must not grow the delta without bound:
        // past the registry's own bound, the oldest changes go (a client that misses one
        // sees a hash code mismatch and fetches the whole registry).
        let config = &self.shared.config;
        prune(
            state,
            config.delta_retention,
            config.limits.max_instances.max(1),
        );
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
            let warming = Instant::now() < warm;
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
        let mut parsed = to_registry(&self.lock());
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

/// The overrides of cancelled instances, each until a time, oldest first: what
/// [`EurekaRegistry::cancel`] keeps. Every operation costs what it removes, not the map.
#[derive(Default)]
struct CancelledOverrides {
    by_key: HashMap<(String, String), (Status, Instant)>,
    /// Keys in the order they were kept, with the time they were kept until; an entry whose
    /// key was kept again since, or taken, is skipped.
    order: std::collections::VecDeque<(Instant, (String, String))>,
}

impl CancelledOverrides {
    /// Keeps `status` for `key` until `until`; then forgets the oldest beyond `max`.
    fn keep(&mut self, key: (String, String), status: Status, until: Instant, max: usize) {
        self.by_key.insert(key.clone(), (status, until));
        self.order.push_back((until, key));
        while self.by_key.len() > max {
            self.pop_oldest();
        }
    }

    /// The override kept for `key`, if it has not run out by `now`; forgets it, and every
    /// kept override at the front that has run out.
    fn take(&mut self, key: &(String, String), now: Instant) -> Option<Status> {
        while self.order.front().is_some_and(|(until, _)| *until <= now) {
            self.pop_oldest();
        }
        let (status, until) = self.by_key.remove(key)?;
        (until > now).then_some(status)
    }

    fn pop_oldest(&mut self) {
        if let Some((until, key)) = self.order.pop_front()
            && self.by_key.get(&key).is_some_and(|(_, u)| *u == until)
        {
            self.by_key.remove(&key);
        }
    }
}

fn remove(state: &mut Ledger, app: &str, id: &str) -> Option<Lease> {
    let leases = state.apps.get_mut(app)?;
    let lease = leases.remove(id)?;
    if leases.is_empty() {
        state.apps.remove(app);
    }
    state.leases -= 1;
    state.convert(app, id);
    Some(lease)
}

/// Forgets the changes older than `retention`, and the oldest beyond `max_len`. Changes are
/// made in order, so the oldest are first.
fn prune(state: &mut Ledger, retention: Duration, max_len: usize) {
    let now = Instant::now();
    loop {
        let len = state.recent.len();
        let Some(oldest) = state.recent.first_entry() else {
            return;
        };
        if len <= max_len && now.saturating_duration_since(oldest.get().at) <= retention {
            return;
        }
        let change = oldest.remove();
        state.latest.remove(&(change.app, change.id));
    }
}

/// Eureka's reconcile hash code of every registered instance (`apps__hashcode`).
fn hash_code(state: &Ledger) -> String {
    reconcile_hash_code(
        state
            .apps
            .values()
            .flat_map(BTreeMap::values)
            .map(|lease| lease.info.status()),
    )
}

/// A registry document of `application`, with the registry's version and hash code.
fn document(state: &Ledger, application: Vec<Application>) -> Applications {
    Applications {
        versions_delta: Some(state.version.to_string()),
        apps_hashcode: Some(hash_code(state)),
        application,
        ..Applications::default()
    }
}

fn full_applications(state: &Ledger) -> Applications {
    let application: Vec<Application> = state
        .apps
        .iter()
        .map(|(name, leases)| Application {
            name: name.clone(),
            instance: leases.values().map(|l| l.info.clone()).collect(),
            ..Application::default()
        })
        .collect();
    document(state, application)
}

/// The plain model of the registry: what `full_applications(state).to_registry()` gives,
/// from the instances converted when their leases changed.
fn to_registry(state: &Ledger) -> Parsed {
    let registry = Registry::from_groups(state.published.values().map(|p| p.group.clone()));
    let mut warnings = Vec::new();
    for ((app, id), list) in &state.warned {
        // The instance's position in its app, as the full document counts.
        let index = state.apps.get(app).map_or(0, |leases| {
            leases
                .range::<str, _>((Bound::Unbounded, Bound::Excluded(id.as_str())))
                .count()
        });
        warnings.extend(list.iter().map(|w| InvalidInstance { index, ..w.clone() }));
    }
    Parsed { registry, warnings }
}

/// Runs the REST API on `listener` (over TLS with `tls`), within the configured
/// [`HttpLimits`], beside the publisher of changes and the eviction of expired leases,
/// until the server fails.
pub async fn serve(
    listener: TcpListener,
    registry: EurekaRegistry,
    tls: Option<tokio_rustls::TlsAcceptor>,
) -> std::io::Result<()> {
    let metrics = registry.shared.metrics.clone();
    let on_event = move |event| {
        let counter = match event {
            HttpEvent::ConnectionRefused => &metrics.eureka_http_connections_refused_total,
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
    tls: Option<tokio_rustls::TlsAcceptor>,
    registry_metrics: Arc<RegistryMetrics>,
    metrics: Arc<ServerMetrics>,
) -> std::io::Result<EmbeddedSource> {
    let listener = TcpListener::bind(addr).await?;
    let local_addr = listener.local_addr()?;
    let (tx, registry) = watch::channel(Arc::new(Registry::loading()));
    let scheme = if tls.is_some() { "https" } else { "http" };
    let authenticated = config.auth.is_some();
    let warmup = config.warmup;
    let eureka = EurekaRegistry::new(config, tx, registry_metrics, metrics);
    let health = eureka.health();
    let server = eureka.clone();
    let task = tokio::spawn(async move {
        if let Err(e) = serve(listener, server, tls).await {
            tracing::error!(error = %e, "embedded Eureka registry stopped");
        }
    });
    tracing::info!(
        url = %format!("{scheme}://{local_addr}/eureka"),
        authenticated,
        warmup_s = warmup.as_secs_f64(),
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

// ---- HTTP handlers: the edge, where requests become calls and results become answers ----

type Eureka = AxState<EurekaRegistry>;

/// Eureka's rule: JSON when `Accept` mentions `json`, XML otherwise.
fn wants_json(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .any(|v| v.to_str().is_ok_and(|v| v.contains("json")))
}

fn json_response(body: &impl serde::Serialize) -> Response {
    match serde_json::to_vec(body) {
        Ok(body) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

fn xml_response(body: String) -> Response {
    ([(header::CONTENT_TYPE, "application/xml")], body).into_response()
}

fn answer_applications(headers: &HeaderMap, applications: Applications) -> Response {
    if wants_json(headers) {
        json_response(&ApplicationsDocument { applications })
    } else {
        xml_response(xml::applications(&applications))
    }
}

fn answer_instance(headers: &HeaderMap, instance: InstanceInfo) -> Response {
    if wants_json(headers) {
        json_response(&InstanceDocument { instance })
    } else {
        xml_response(xml::instance(&instance))
    }
}

async fn get_apps(AxState(eureka): Eureka, headers: HeaderMap) -> Response {
    let json = wants_json(&headers);
    let content_type = if json {
        "application/json"
    } else {
        "application/xml"
    };
    let body = eureka.applications_answer(json);
    ([(header::CONTENT_TYPE, content_type)], body).into_response()
}

async fn get_delta(AxState(eureka): Eureka, headers: HeaderMap) -> Response {
    answer_applications(&headers, eureka.delta())
}

async fn get_app(AxState(eureka): Eureka, Path(app): Path<String>, headers: HeaderMap) -> Response {
    let name = app.trim().to_ascii_uppercase();
    match eureka.application(&name) {
        Some(application) if wants_json(&headers) => {
            json_response(&ApplicationDocument { application })
        }
        Some(application) => xml_response(xml::application(&application)),
        None => InvalidRequest::new(
            StatusCode::NOT_FOUND,
            format!("app {name:?} is not registered"),
        )
        .into_response(),
    }
}

async fn get_instance(
    AxState(eureka): Eureka,
    Path((app, id)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    let name = app.trim().to_ascii_uppercase();
    let found = eureka
        .lock()
        .apps
        .get(&name)
        .and_then(|l| l.get(&id))
        .map(|l| l.info.clone());
    match found {
        Some(info) => answer_instance(&headers, info),
        None => InvalidRequest::not_found(&name, &id).into_response(),
    }
}

async fn get_instance_by_id(
    AxState(eureka): Eureka,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let found = eureka
        .lock()
        .apps
        .values()
        .find_map(|leases| leases.get(&id))
        .map(|l| l.info.clone());
    match found {
        Some(info) => answer_instance(&headers, info),
        None => InvalidRequest::new(
            StatusCode::NOT_FOUND,
            format!("instance {id:?} is not registered"),
        )
        .into_response(),
    }
}

async fn get_vip(AxState(eureka): Eureka, Path(vip): Path<String>, headers: HeaderMap) -> Response {
    by_vip(&eureka, &headers, &vip, |i| &i.vip_address)
}

async fn get_svip(
    AxState(eureka): Eureka,
    Path(vip): Path<String>,
    headers: HeaderMap,
) -> Response {
    by_vip(&eureka, &headers, &vip, |i| &i.secure_vip_address)
}

fn by_vip(
    eureka: &EurekaRegistry,
    headers: &HeaderMap,
    vip: &str,
    list: impl Fn(&InstanceInfo) -> &Option<String>,
) -> Response {
    let vip = vip.trim().to_ascii_lowercase();
    let apps = eureka.serving(&vip, list);
    if apps.application.is_empty() {
        return InvalidRequest::new(StatusCode::NOT_FOUND, format!("no instance serves {vip:?}"))
            .into_response();
    }
    answer_applications(headers, apps)
}

/// With a tokens file, every request must name its caller (401 otherwise); the caller is
/// handed to the handlers. Without one, everyone is [`Caller::Anyone`].
async fn authenticate(AxState(eureka): Eureka, mut request: Request, next: Next) -> Response {
    let caller = match &eureka.shared.config.auth {
        None => auth::ANYONE.clone(),
        Some(auth) => match auth.authenticate(request.headers().get(header::AUTHORIZATION)) {
            Ok(caller) => caller,
            Err(e) => {
                inc(&eureka.shared.metrics.eureka_refused_unauthenticated_total);
                odmesh_base::limited!(
                    warn,
                    method = %request.method(),
                    path = %clip(request.uri().path()),
                    "eureka: request without valid credentials refused (401)"
                );
                let mut answer =
                    InvalidRequest::new(StatusCode::UNAUTHORIZED, e.to_string()).into_response();
                answer.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static("Bearer realm=\"odmesh\", Basic realm=\"odmesh\""),
                );
                return answer;
            }
        },
    };
    request.extensions_mut().insert(caller);
    next.run(request).await
}

/// Answers a refused write, counting it and logging it (clipped, rate-limited).
fn refuse(eureka: &EurekaRegistry, what: &str, app: &str, e: InvalidRequest) -> Response {
    let metrics = &eureka.shared.metrics;
    let counter = match e.status {
        404 => return e.into_response(),
        403 => Some(&metrics.eureka_refused_forbidden_total),
        408 | 413 | 415 => Some(&metrics.eureka_refused_body_total),
        // The registry-full count is taken where it is decided.
        503 => None,
        _ => Some(&metrics.eureka_refused_invalid_total),
    };
    if let Some(counter) = counter {
        inc(counter);
    }
    odmesh_base::limited!(
        warn,
        app = %clip(app),
        status = e.status,
        error = %logs::clip_at(&e.reason, 300),
        "eureka: {what} refused"
    );
    e.into_response()
}

/// Whether a body's `Content-Type` says JSON (`application/json`, or any `+json` type).
fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(|mime| mime.trim().to_ascii_lowercase())
        .is_some_and(|mime| mime == "application/json" || mime.ends_with("+json"))
}

async fn register(
    AxState(eureka): Eureka,
    Extension(caller): Extension<Arc<Caller>>,
    Path(app): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let config = &eureka.shared.config;
    // A form or text/plain POST (what a web page may send anywhere without asking) is not a
    // registration.
    if !is_json(&headers) {
        let e = InvalidRequest::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "a registration is JSON: send Content-Type: application/json and {\"instance\": {...}}",
        );
        return refuse(&eureka, "registration", &app, e);
    }
    let body =
        match http_server::read_body(&headers, body, config.max_body, config.body_timeout).await {
            Ok(body) => body,
            Err(e) => {
                let e = InvalidRequest::new(e.status(), format!("registration: {e}"));
                return refuse(&eureka, "registration", &app, e);
            }
        };
    match eureka.register_as(&caller, &app, &body) {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => refuse(&eureka, "registration", &app, e),
    }
}

type Params = Query<HashMap<String, String>>;

async fn renew(
    AxState(eureka): Eureka,
    Extension(caller): Extension<Arc<Caller>>,
    Path((app, id)): Path<(String, String)>,
    Query(params): Params,
) -> Response {
    let dirty = params
        .get("lastDirtyTimestamp")
        .and_then(|t| t.trim().parse().ok());
    match eureka.renew(&caller, &app, &id, dirty) {
        Ok(()) => StatusCode::OK.into_response(),
        Err(e) => refuse(&eureka, "heartbeat", &app, e),
    }
}

async fn cancel(
    AxState(eureka): Eureka,
    Extension(caller): Extension<Arc<Caller>>,
    Path((app, id)): Path<(String, String)>,
) -> Response {
    match eureka.cancel(&caller, &app, &id) {
        Ok(()) => StatusCode::OK.into_response(),
        Err(e) => refuse(&eureka, "cancel", &app, e),
    }
}

fn status_param(params: &HashMap<String, String>) -> Result<Option<Status>, InvalidRequest> {
    match params.get("value") {
        None => Ok(None),
        Some(v) => Status::parse(v).map(Some).ok_or_else(|| {
            InvalidRequest::new(
                StatusCode::BAD_REQUEST,
                format!(
                    "value={} is not a status (UP, DOWN, STARTING, OUT_OF_SERVICE, UNKNOWN)",
                    clip(v)
                ),
            )
        }),
    }
}

async fn put_status(
    AxState(eureka): Eureka,
    Extension(caller): Extension<Arc<Caller>>,
    Path((app, id)): Path<(String, String)>,
    Query(params): Params,
) -> Response {
    let result = status_param(&params).and_then(|status| match status {
        Some(status) => eureka.set_status_override(&caller, &app, &id, Some(status), None),
        None => Err(InvalidRequest::new(
            StatusCode::BAD_REQUEST,
            "missing ?value=STATUS",
        )),
    });
    match result {
        Ok(()) => StatusCode::OK.into_response(),
        Err(e) => refuse(&eureka, "status change", &app, e),
    }
}

async fn delete_status(
    AxState(eureka): Eureka,
    Extension(caller): Extension<Arc<Caller>>,
    Path((app, id)): Path<(String, String)>,
    Query(params): Params,
) -> Response {
    let result = status_param(&params)
        .map(|s| s.filter(|s| *s != Status::Unknown))
        .and_then(|reported| eureka.set_status_override(&caller, &app, &id, None, reported));
    match result {
        Ok(()) => StatusCode::OK.into_response(),
        Err(e) => refuse(&eureka, "status change", &app, e),
    }
}

async fn put_metadata(
    AxState(eureka): Eureka,
    Extension(caller): Extension<Arc<Caller>>,
    Path((app, id)): Path<(String, String)>,
    Query(params): Params,
) -> Response {
    match eureka.update_metadata(&caller, &app, &id, params) {
        Ok(()) => StatusCode::OK.into_response(),
        Err(e) => refuse(&eureka, "metadata update", &app, e),
    }
}

#[cfg(test)]
mod tests;
