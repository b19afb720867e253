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
//! Eureka does), or after the configured `lease_duration` when it does not say; a background
//! task evicts expired instances every `eviction_interval`. There is no self-preservation
//! mode and no peer replication: this registry is for one control plane.
//!
//! Where this differs from Netflix's server, on purpose: removing a status override restores
//! the status the instance itself reported (Eureka sets `UNKNOWN` until the next heartbeat
//! fails and the client registers again, which would drain a healthy instance for up to a
//! heartbeat interval); a metadata update of an unknown instance answers 404, not 500;
//! registration fills in a missing `hostName` (with `ipAddr`) and `dataCenterInfo` (`MyOwn`)
//! instead of refusing the instance, so a hand-written `curl` registration works.

// Public so that the fuzz targets (fuzz/) can write any document with it.
pub mod xml;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::ops::Bound;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, State as AxState};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::metrics::Metrics;

use super::eureka::{
    ActionType, Application, ApplicationDocument, Applications, ApplicationsDocument,
    DataCenterInfo, InstanceDocument, InstanceInfo, LeaseInfo,
};
use super::{Group, Instance, InvalidInstance, Parsed, Registry, SourceHealth, Status, split_vips};

/// After a publish, the publisher waits this long before the next, so that changes
/// arriving together (a burst of registrations) are published together; a change after a
/// quiet time is published at once.
const PUBLISH_INTERVAL: Duration = Duration::from_millis(5);

/// Where the embedded registry listens unless told otherwise.
pub const DEFAULT_ADDR: &str = "127.0.0.1:8761";

/// How the embedded registry treats leases and deltas.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServerConfig {
    /// How long an instance lives without a heartbeat, when its registration does not say
    /// (`leaseInfo.durationInSecs`). Eureka's default: 90 s.
    pub lease_duration: Duration,
    /// How often expired leases are evicted.
    pub eviction_interval: Duration,
    /// How long a change stays in `/apps/delta`. Eureka's default: 3 minutes.
    pub delta_retention: Duration,
}

impl Default for ServerConfig {
    fn default() -> ServerConfig {
        ServerConfig {
            lease_duration: Duration::from_secs(90),
            eviction_interval: Duration::from_secs(1),
            delta_retention: Duration::from_secs(180),
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
    state: Mutex<Ledger>,
    tx: watch::Sender<Arc<Registry>>,
    health: SourceHealth,
    metrics: Arc<Metrics>,
    /// Counts changes; [`EurekaRegistry::run_publisher`] waits on it.
    changes: watch::Sender<u64>,
    /// The count of changes published so far.
    published: watch::Sender<u64>,
}

#[derive(Default)]
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
            format!("instance {id:?} of app {app:?} is not registered"),
        )
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
    /// the empty registry at once) and reports to `metrics` and its [`SourceHealth`].
    pub fn new(
        config: ServerConfig,
        tx: watch::Sender<Arc<Registry>>,
        metrics: Arc<Metrics>,
    ) -> EurekaRegistry {
        let health = SourceHealth::new("embedded Eureka registry");
        let registry = EurekaRegistry {
            shared: Arc::new(Shared {
                config,
                state: Mutex::new(Ledger::default()),
                tx,
                health,
                metrics,
                changes: watch::Sender::new(0),
                published: watch::Sender::new(0),
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
    pub fn config(&self) -> ServerConfig {
        self.shared.config
    }

    /// The REST API, under `/eureka` and `/eureka/v2`.
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
            .with_state(self.clone());
        Router::new()
            .nest("/eureka/v2", api.clone())
            .nest("/eureka", api)
    }

    /// Registers (or registers again) an instance of `app` from its JSON registration body.
    pub fn register(&self, app: &str, body: &[u8]) -> Result<(), InvalidRequest> {
        let app = app.trim().to_ascii_uppercase();
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
        let mut state = self.lock();
        let existing = state.apps.get(&app).and_then(|leases| leases.get(&id));
        let body_override = info
            .overridden_status
            .as_deref()
            .or(info.overriddenstatus_legacy.as_deref())
            .and_then(Status::parse)
            .filter(|s| *s != Status::Unknown);
        let overridden = existing.and_then(|l| l.overridden).or(body_override);
        let service_up = existing
            .and_then(|l| l.info.lease_info.as_ref())
            .and_then(|l| l.service_up_timestamp)
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
        let mut lease = Lease {
            info,
            reported,
            overridden,
            renewed: Instant::now(),
            duration,
        };
        lease.refresh_status();
        let snapshot = lease.info.clone();
        state
            .apps
            .entry(app.clone())
            .or_default()
            .insert(id.clone(), lease);
        state.convert(&app, &id);
        self.record(&mut state, &app, &id, snapshot, ActionType::Added);
        Metrics::inc(&self.shared.metrics.eureka_registrations_total);
        tracing::info!(app, id, status = reported.as_str(), "eureka: registered");
        drop(state);
        self.publish();
        Ok(())
    }

    /// Renews the lease of an instance (a heartbeat). A `last_dirty_timestamp` newer than
    /// the registered one answers 404, so that the client registers its newer data.
    pub fn renew(
        &self,
        app: &str,
        id: &str,
        last_dirty_timestamp: Option<u64>,
    ) -> Result<(), InvalidRequest> {
        let app = app.trim().to_ascii_uppercase();
        let mut state = self.lock();
        let Some(lease) = state.apps.get_mut(&app).and_then(|l| l.get_mut(id)) else {
            Metrics::inc(&self.shared.metrics.eureka_renewals_not_found_total);
            tracing::debug!(app, id, "eureka: heartbeat for an unknown instance");
            return Err(InvalidRequest::not_found(&app, id));
        };
        lease.renewed = Instant::now();
        if let Some(l) = lease.info.lease_info.as_mut() {
            l.last_renewal_timestamp = Some(now_ms());
        }
        Metrics::inc(&self.shared.metrics.eureka_renewals_total);
        match (last_dirty_timestamp, lease.info.last_dirty_timestamp) {
            (Some(theirs), Some(ours)) if theirs > ours => Err(InvalidRequest::new(
                StatusCode::NOT_FOUND,
                format!(
                    "instance {id:?} changed since it registered (lastDirtyTimestamp {theirs} > {ours}): register again"
                ),
            )),
            _ => Ok(()),
        }
    }

    /// Removes an instance (its client is shutting down).
    pub fn cancel(&self, app: &str, id: &str) -> Result<(), InvalidRequest> {
        let app = app.trim().to_ascii_uppercase();
        let mut state = self.lock();
        let Some(lease) = remove(&mut state, &app, id) else {
            return Err(InvalidRequest::not_found(&app, id));
        };
        self.record(&mut state, &app, id, lease.info, ActionType::Deleted);
        Metrics::inc(&self.shared.metrics.eureka_cancels_total);
        tracing::info!(app, id, "eureka: cancelled");
        drop(state);
        self.publish();
        Ok(())
    }

    /// Sets (`Some`) or removes (`None`) the status override of an instance. Removing it
    /// may also say which status the instance has now (`value` of `DELETE .../status`).
    pub fn set_status_override(
        &self,
        app: &str,
        id: &str,
        overridden: Option<Status>,
        reported: Option<Status>,
    ) -> Result<(), InvalidRequest> {
        self.modify(app, id, |lease| {
            lease.overridden = overridden;
            if let Some(reported) = reported {
                lease.reported = reported;
            }
            lease.refresh_status();
        })?;
        Metrics::inc(&self.shared.metrics.eureka_status_updates_total);
        tracing::info!(
            app,
            id,
            overridden = overridden.map_or("none", Status::as_str),
            "eureka: status override"
        );
        Ok(())
    }

    /// Sets metadata entries of an instance.
    pub fn update_metadata(
        &self,
        app: &str,
        id: &str,
        entries: impl IntoIterator<Item = (String, String)>,
    ) -> Result<(), InvalidRequest> {
        self.modify(app, id, |lease| lease.info.metadata.extend(entries))
    }

    fn modify(
        &self,
        app: &str,
        id: &str,
        change: impl FnOnce(&mut Lease),
    ) -> Result<(), InvalidRequest> {
        let app = app.trim().to_ascii_uppercase();
        let mut state = self.lock();
        let Some(lease) = state.apps.get_mut(&app).and_then(|l| l.get_mut(id)) else {
            return Err(InvalidRequest::not_found(&app, id));
        };
        change(lease);
        lease.info.last_updated_timestamp = Some(now_ms());
        let snapshot = lease.info.clone();
        state.convert(&app, id);
        self.record(&mut state, &app, id, snapshot, ActionType::Modified);
        drop(state);
        self.publish();
        Ok(())
    }

    /// Evicts every instance whose lease expired by now; returns how many.
    pub fn evict_expired(&self) -> usize {
        let now = Instant::now();
        let mut state = self.lock();
        let expired: Vec<(String, String)> = state
            .apps
            .iter()
            .flat_map(|(app, leases)| {
                leases
                    .iter()
                    .filter(|(_, lease)| lease.expired(now))
                    .map(move |(id, _)| (app.clone(), id.clone()))
            })
            .collect();
        for (app, id) in &expired {
            if let Some(mut lease) = remove(&mut state, app, id) {
                if let Some(l) = lease.info.lease_info.as_mut() {
                    l.eviction_timestamp = Some(now_ms());
                }
                tracing::info!(app, id, "eureka: lease expired; instance evicted");
                self.record(&mut state, app, id, lease.info, ActionType::Deleted);
                Metrics::inc(&self.shared.metrics.eureka_evictions_total);
            }
        }
        drop(state);
        if !expired.is_empty() {
            self.publish();
        }
        expired.len()
    }

    /// Evicts expired leases every `eviction_interval`, forever.
    pub async fn run_eviction(self) {
        let mut ticks = tokio::time::interval(self.shared.config.eviction_interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            self.evict_expired();
        }
    }

    /// Every application, as `GET /apps` answers, with the version and hash code.
    pub fn applications(&self) -> Applications {
        let state = self.lock();
        full_applications(&state)
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
        prune(&mut state, self.shared.config.delta_retention);
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
        prune(state, self.shared.config.delta_retention);
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
    pub async fn run_publisher(self) {
        let mut changes = self.shared.changes.subscribe();
        loop {
            let upto = *changes.borrow_and_update();
            self.publish_now();
            self.shared.published.send_replace(upto);
            if changes.changed().await.is_err() {
                return;
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
        let parsed = to_registry(&self.lock());
        let new_warnings =
            shared
                .health
                .record_success(&shared.metrics, &parsed.registry, &parsed.warnings);
        for w in new_warnings {
            tracing::warn!("eureka: registered instance not fully usable: {w}");
        }
        super::publish(&shared.tx, parsed.registry);
    }
}

fn remove(state: &mut Ledger, app: &str, id: &str) -> Option<Lease> {
    let leases = state.apps.get_mut(app)?;
    let lease = leases.remove(id)?;
    if leases.is_empty() {
        state.apps.remove(app);
    }
    state.convert(app, id);
    Some(lease)
}

/// Forgets the changes older than `retention`. Changes are made in order, so the oldest
/// are first.
fn prune(state: &mut Ledger, retention: Duration) {
    let now = Instant::now();
    while let Some(oldest) = state.recent.first_entry() {
        if now.saturating_duration_since(oldest.get().at) <= retention {
            break;
        }
        let change = oldest.remove();
        state.latest.remove(&(change.app, change.id));
    }
}

/// Eureka's reconcile hash code of every registered instance (`apps__hashcode`).
fn hash_code(state: &Ledger) -> String {
    super::reconcile_hash_code(
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

/// Runs the REST API on `listener`, the publisher of changes and the eviction of expired
/// leases, until the server fails.
pub async fn serve(listener: TcpListener, registry: EurekaRegistry) -> std::io::Result<()> {
    // One future for all three, so that dropping (or aborting) it stops them all.
    tokio::select! {
        result = axum::serve(listener, registry.router()) => result,
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

/// Binds `addr` and serves the embedded registry there (see [`serve`]).
pub async fn start(
    addr: SocketAddr,
    config: ServerConfig,
    metrics: Arc<Metrics>,
) -> std::io::Result<EmbeddedSource> {
    let listener = TcpListener::bind(addr).await?;
    let local_addr = listener.local_addr()?;
    let (tx, registry) = watch::channel(Arc::new(Registry::default()));
    let eureka = EurekaRegistry::new(config, tx, metrics);
    let health = eureka.health();
    let server = eureka.clone();
    let task = tokio::spawn(async move {
        if let Err(e) = serve(listener, server).await {
            tracing::error!(error = %e, "embedded Eureka registry stopped");
        }
    });
    tracing::info!(%local_addr, "embedded Eureka registry listening under /eureka");
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
    answer_applications(&headers, eureka.applications())
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

async fn register(AxState(eureka): Eureka, Path(app): Path<String>, body: Bytes) -> Response {
    match eureka.register(&app, &body) {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => {
            tracing::warn!(app, error = %e, "eureka: registration refused");
            e.into_response()
        }
    }
}

type Params = Query<HashMap<String, String>>;

async fn renew(
    AxState(eureka): Eureka,
    Path((app, id)): Path<(String, String)>,
    Query(params): Params,
) -> Response {
    let dirty = params
        .get("lastDirtyTimestamp")
        .and_then(|t| t.trim().parse().ok());
    match eureka.renew(&app, &id, dirty) {
        Ok(()) => StatusCode::OK.into_response(),
        Err(e) => e.into_response(),
    }
}

async fn cancel(AxState(eureka): Eureka, Path((app, id)): Path<(String, String)>) -> Response {
    match eureka.cancel(&app, &id) {
        Ok(()) => StatusCode::OK.into_response(),
        Err(e) => e.into_response(),
    }
}

fn status_param(params: &HashMap<String, String>) -> Result<Option<Status>, InvalidRequest> {
    match params.get("value") {
        None => Ok(None),
        Some(v) => Status::parse(v).map(Some).ok_or_else(|| {
            InvalidRequest::new(
                StatusCode::BAD_REQUEST,
                format!(
                    "value={v:?} is not a status (UP, DOWN, STARTING, OUT_OF_SERVICE, UNKNOWN)"
                ),
            )
        }),
    }
}

async fn put_status(
    AxState(eureka): Eureka,
    Path((app, id)): Path<(String, String)>,
    Query(params): Params,
) -> Response {
    let result = status_param(&params).and_then(|status| match status {
        Some(status) => eureka.set_status_override(&app, &id, Some(status), None),
        None => Err(InvalidRequest::new(
            StatusCode::BAD_REQUEST,
            "missing ?value=STATUS",
        )),
    });
    match result {
        Ok(()) => StatusCode::OK.into_response(),
        Err(e) => e.into_response(),
    }
}

async fn delete_status(
    AxState(eureka): Eureka,
    Path((app, id)): Path<(String, String)>,
    Query(params): Params,
) -> Response {
    let result = status_param(&params)
        .map(|s| s.filter(|s| *s != Status::Unknown))
        .and_then(|reported| eureka.set_status_override(&app, &id, None, reported));
    match result {
        Ok(()) => StatusCode::OK.into_response(),
        Err(e) => e.into_response(),
    }
}

async fn put_metadata(
    AxState(eureka): Eureka,
    Path((app, id)): Path<(String, String)>,
    Query(params): Params,
) -> Response {
    match eureka.update_metadata(&app, &id, params) {
        Ok(()) => StatusCode::OK.into_response(),
        Err(e) => e.into_response(),
    }
}

#[cfg(test)]
mod tests;
