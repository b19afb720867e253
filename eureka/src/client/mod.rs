//! The Eureka source (`--eureka URL`, repeatable): follows one or more Eureka servers the way
//! Eureka's own clients do.
//!
//! - First a full fetch, `GET {URL}/apps` with `Accept: application/json`.
//! - Then every `interval` (30 s by default, Eureka's) `GET {URL}/apps/delta`: the
//!   `ADDED`/`MODIFIED`/`DELETED` instances are applied to the local copy, and its reconcile
//!   hash code is compared with the delta's `apps__hashcode`. A mismatch, a delta without a
//!   hash code, or a delta answer that is not a usable document (an error status, an empty or
//!   garbled body) means a full fetch right away.
//! - When a server does not answer (connection refused, timeout, 5xx, garbage), the next URL
//!   is tried, in turn; when none answers, the error is recorded (log, metric
//!   `eureka_fetch_errors_total`, [`SourceHealth`]), the last good registry stays in use, and
//!   the next attempt, a full fetch, comes after a backoff that doubles from
//!   `min(interval, 1 s)` up to `max_backoff` (the interval by default).
//! - Every HTTP call has a timeout (`request_timeout`, 10 s by default): to connect and for the
//!   answer's headers, then for each next part of its body, as Eureka's own client bounds its
//!   socket reads; a registry of millions takes longer than that to arrive, and may.
//! - Answers are asked for gzip (`Accept-Encoding: gzip`, which a Eureka server honours for
//!   `/apps` and `/apps/delta`) and read as they arrive (plain ones too), one instance at a
//!   time, into a copy of the registry kept as the plain model ([`local`]): never the whole
//!   document in memory. An answer larger than `max_answer` (decoded, or as transferred) is
//!   refused: a fetch error, counted in `eureka_answers_too_large_total`.
//! - A new registry is published only when the plain model changed.
//! - `https://` URLs are verified by rustls against `--eureka-ca` (a PEM bundle) or the
//!   system CA bundle: the certificate must chain to one of those CAs and name the URL's
//!   host. `http://` and `https://` URLs can be mixed. A failed handshake is an unreachable
//!   server (the next URL is tried) and its error carries rustls's reason.
//! - Credentials: `user:password@` in a URL (percent-encoded, as in Eureka's `serviceUrl`)
//!   is sent as `Authorization: Basic`, and a `--eureka-token-file` as `Authorization:
//!   Bearer` to the URLs without their own. A 401 or 403 says to check them. Wherever a URL
//!   is shown (logs, errors, `/readyz`, `/debug/registry`) its password is `***`; sending
//!   credentials over plain http to a host other than loopback is warned about at start.
//!
//! The age of the last good fetch is the [`SourceHealth`]'s `last_success` (also the gauge
//! `registry_last_success_seconds`); see [`EurekaSource::age_of_last_fetch`].
//!
//! Limits: the token file and the CA bundle are read once, at start (a rotated token needs a
//! restart); no client certificates (mutual TLS); an instance on the server that odmesh
//! cannot read at all (see [`read::read_document`]) is missing from the local copy, so
//! its status is missing from the hash code and every poll becomes a full fetch (still
//! correct, logged as a hash mismatch).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http_body_util::Empty;
use hyper::body::{Bytes, Incoming};
use hyper::header::{ACCEPT, ACCEPT_ENCODING, AUTHORIZATION};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

use odmesh_base::error::Chain;
use odmesh_base::flags::duration_text;
use odmesh_base::metrics::{inc, observe};

use crate::ClientMetrics;
use odmesh_base::tls::{self, InvalidCaBundle, SYSTEM_CA_BUNDLES};

use odmesh_registry::guard::{self, DropGuard, DropGuardConfig};
use odmesh_registry::{Registry, RegistryMetrics, SourceHealth};

use crate::wire::json::InvalidDocument;
use crate::wire::read;

pub(crate) mod access;
pub(crate) mod answer;
pub(crate) mod local;

use access::Access;
pub use access::{ServerUrl, redact_url};
use answer::{Bounds, Unread};
use local::{Change, Full, Local};

/// Eureka clients poll every 30 s.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(30);
/// The bound on every HTTP call (connect, answer and body).
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How long [`start`] waits for the first good fetch before it returns an unloaded source.
pub const DEFAULT_FIRST_FETCH_WAIT: Duration = Duration::from_secs(5);
/// The largest answer read, decoded: about 3 million Spring instances (1-1.5 KB of JSON each).
pub const DEFAULT_MAX_ANSWER: u64 = 4 << 30;

/// How to follow the Eureka servers.
#[derive(Clone, PartialEq)]
pub struct ClientConfig {
    /// Base URLs of the Eureka servers, e.g. `https://user:password@eureka:8761/eureka`,
    /// tried in turn (see [`ServerUrl::parse`]).
    pub urls: Vec<String>,
    /// The CAs (PEM bundle) that sign the `https://` servers' certificates; `None`: the
    /// system CA bundle.
    pub ca_file: Option<PathBuf>,
    /// A file holding a token sent as `Authorization: Bearer` to every server whose URL has
    /// no `user:password@` of its own.
    pub token_file: Option<PathBuf>,
    /// Time between two polls of the delta.
    pub interval: Duration,
    /// The bound on every HTTP call: to connect and for the answer's headers, then for each
    /// next part of its body.
    pub request_timeout: Duration,
    /// The largest answer read, in bytes, decoded (and as transferred); a larger one fails
    /// the fetch.
    pub max_answer: u64,
    /// The longest wait between two attempts after failures.
    pub max_backoff: Duration,
    /// How long [`start_with`] waits for the first good fetch.
    pub first_fetch_wait: Duration,
    /// When a fetch that lost most of the registry is held rather than followed.
    pub drop_guard: DropGuardConfig,
    /// Send credentials over plain `http://` to a host that is not this one (refused
    /// otherwise: anyone on the way reads them).
    pub allow_plain_credentials: bool,
}

impl ClientConfig {
    /// Defaults for everything but the servers and the poll interval.
    pub fn new(urls: Vec<String>, interval: Duration) -> ClientConfig {
        ClientConfig {
            urls,
            ca_file: None,
            token_file: None,
            interval,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            max_answer: DEFAULT_MAX_ANSWER,
            max_backoff: interval,
            first_fetch_wait: DEFAULT_FIRST_FETCH_WAIT,
            drop_guard: DropGuardConfig::default(),
            allow_plain_credentials: false,
        }
    }
}

// By hand, so that a logged configuration never shows a password.
impl std::fmt::Debug for ClientConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let urls: Vec<String> = self.urls.iter().map(|u| redact_url(u)).collect();
        f.debug_struct("ClientConfig")
            .field("urls", &urls)
            .field("ca_file", &self.ca_file)
            .field("token_file", &self.token_file)
            .field("interval", &self.interval)
            .field("request_timeout", &self.request_timeout)
            .field("max_answer", &self.max_answer)
            .field("max_backoff", &self.max_backoff)
            .field("first_fetch_wait", &self.first_fetch_wait)
            .finish()
    }
}

/// A `--eureka` URL that cannot be followed.
#[derive(Debug, thiserror::Error)]
#[error("invalid Eureka URL {url:?}{}", reason.map(|r| format!(": {r}")).unwrap_or_default())]
pub struct InvalidEurekaUrl {
    /// The URL as given, with any password shown as `***` ([`redact_url`]).
    pub url: String,
    /// What is wrong with it, when it is a URL.
    pub reason: Option<&'static str>,
    /// Why it is not a URL.
    #[source]
    pub source: Option<hyper::http::uri::InvalidUri>,
}

/// Why the Eureka source cannot start: a flag names something it cannot use.
#[derive(Debug, thiserror::Error)]
pub enum InvalidEurekaConfig {
    #[error(transparent)]
    Url(#[from] InvalidEurekaUrl),
    #[error("no Eureka URL given")]
    NoUrl,
    #[error("--eureka-ca")]
    CaBundle(#[source] InvalidCaBundle),
    #[error("https:// Eureka URLs need trusted CAs: give --eureka-ca FILE")]
    NoCa(#[source] InvalidCaBundle),
    #[error("TLS client for Eureka")]
    Tls(#[source] rustls::Error),
    #[error("--eureka-token-file {}: cannot read it", path.display())]
    TokenFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("--eureka-token-file {}: empty", path.display())]
    EmptyToken { path: PathBuf },
    #[error("--eureka-token-file {}: the token holds characters no HTTP header can carry", path.display())]
    BadToken { path: PathBuf },
    #[error(
        "{url}: credentials would go over plain http to another host, readable on the way; use https:// (or --allow-plain-credentials)"
    )]
    PlainCredentials { url: String },
}

/// Why one fetch from one Eureka server failed.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The request could not be sent, or its answer broke off: the cause says why.
    #[error("{url}")]
    Transport {
        url: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("{url}: no answer within {after:?}")]
    Timeout { url: String, after: Duration },
    #[error("{url}: the answer is larger than --eureka-max-answer ({limit} bytes)")]
    TooLarge { url: String, limit: u64 },
    #[error("{url}: answered HTTP {status}")]
    Status { url: String, status: u16 },
    #[error("{url}: Eureka answered {status}: {}", unauthorized_hint(*.credentials))]
    Unauthorized {
        url: String,
        status: u16,
        /// Whether credentials were sent.
        credentials: bool,
    },
    #[error("{url}: TLS handshake failed (trusted CAs: {trust})")]
    Tls {
        url: String,
        /// Which CAs the client trusts: `--eureka-ca FILE` or the system bundle.
        trust: String,
        #[source]
        source: rustls::Error,
    },
    #[error("{url}")]
    Document {
        url: String,
        source: InvalidDocument,
    },
}

impl FetchError {
    /// Whether the server is unreachable (as opposed to answering something unusable).
    fn is_unreachable(&self) -> bool {
        match self {
            FetchError::Transport { .. } | FetchError::Timeout { .. } | FetchError::Tls { .. } => {
                true
            }
            FetchError::Status { status, .. } => *status >= 500,
            FetchError::Unauthorized { .. }
            | FetchError::Document { .. }
            | FetchError::TooLarge { .. } => false,
        }
    }
}

fn unauthorized_hint(credentials: bool) -> &'static str {
    if credentials {
        "check the credentials"
    } else {
        "it wants credentials: user:password@ in the URL, or --eureka-token-file"
    }
}

/// A running Eureka source: the registry in use, how the source is doing, and its task.
#[derive(Debug)]
pub struct EurekaSource {
    /// The last good registry; changes when Eureka's does.
    pub registry: watch::Receiver<Arc<Registry>>,
    /// For `/readyz` (loaded once a fetch succeeded) and `/debug/registry`.
    pub health: SourceHealth,
    /// The follower; it ends when every receiver of `registry` is dropped.
    pub task: JoinHandle<()>,
}

impl EurekaSource {
    /// Time since the last good fetch (full or delta); `None` before the first.
    pub fn age_of_last_fetch(&self) -> Option<Duration> {
        self.health
            .snapshot()
            .age_of_last_success(SystemTime::now())
    }
}

/// Follows `urls` with the default timeouts: see [`start_with`].
pub async fn start(
    urls: Vec<String>,
    interval: Duration,
    registry_metrics: Arc<RegistryMetrics>,
    metrics: Arc<ClientMetrics>,
) -> Result<EurekaSource, InvalidEurekaConfig> {
    start_with(ClientConfig::new(urls, interval), registry_metrics, metrics).await
}

/// Checks the URLs, the CA bundle and the token file, spawns the follower, and waits for
/// its first good fetch for at most `first_fetch_wait`. When Eureka does not answer in time,
/// the source is returned unloaded (`health.is_loaded()` is false, `/readyz` says not ready,
/// the registry is empty) and keeps trying in the background. Loads and held drops count in
/// `registry_metrics`, what only Eureka does in `metrics`.
pub async fn start_with(
    config: ClientConfig,
    registry_metrics: Arc<RegistryMetrics>,
    metrics: Arc<ClientMetrics>,
) -> Result<EurekaSource, InvalidEurekaConfig> {
    start_trusting(config, registry_metrics, metrics, SYSTEM_CA_BUNDLES).await
}

/// [`start_with`], with the system CA bundle looked for in `system_bundles`.
async fn start_trusting(
    config: ClientConfig,
    registry_metrics: Arc<RegistryMetrics>,
    metrics: Arc<ClientMetrics>,
    system_bundles: &[&str],
) -> Result<EurekaSource, InvalidEurekaConfig> {
    let access = Access::new(&config, system_bundles)?;
    let shown: Vec<String> = access.urls.iter().map(ToString::to_string).collect();
    let health = SourceHealth::new(format!("eureka {}", shown.join(" ")));
    // Nothing fetched yet: what proxies hold is not taken away meanwhile.
    let (tx, registry) = watch::channel(Arc::new(Registry::loading()));
    let loaded = Arc::new(Notify::new());
    let follower = Follower::new(
        access,
        config.clone(),
        registry_metrics,
        metrics,
        health.clone(),
        &loaded,
    );
    let task = tokio::spawn(follower.run(tx));
    if tokio::time::timeout(config.first_fetch_wait, loaded.notified())
        .await
        .is_err()
    {
        tracing::warn!(
            wait = %duration_text(config.first_fetch_wait),
            "no Eureka server answered yet; starting without a registry and retrying"
        );
    }
    Ok(EurekaSource {
        registry,
        health,
        task,
    })
}

/// The wait before attempt `failures + 1`: `base` doubled per failure beyond the first,
/// at most `cap`.
pub fn backoff(failures: u32, base: Duration, cap: Duration) -> Duration {
    let factor = 1u32 << failures.saturating_sub(1).min(20);
    base.saturating_mul(factor).min(cap)
}

type HttpClient = Client<HttpsConnector<HttpConnector>, Empty<Bytes>>;

/// The polling state, and where it reports.
struct Follower {
    http: HttpClient,
    urls: Vec<ServerUrl>,
    /// Which CAs are trusted, for TLS errors.
    trust: String,
    /// The URL that answered last; tried first.
    current: usize,
    config: ClientConfig,
    registry_metrics: Arc<RegistryMetrics>,
    metrics: Arc<ClientMetrics>,
    health: SourceHealth,
    /// The local copy of the server's registry (empty before the first fetch).
    local: Arc<Local>,
    /// The next poll must be a full fetch (the first, and after a failure).
    need_full: bool,
    failures: u32,
    /// Holds a fetch that lost most of the registry until the next fetch confirms it.
    guard: DropGuard,
    loaded: Arc<Notify>,
}

impl Follower {
    fn new(
        access: Access,
        config: ClientConfig,
        registry_metrics: Arc<RegistryMetrics>,
        metrics: Arc<ClientMetrics>,
        health: SourceHealth,
        loaded: &Arc<Notify>,
    ) -> Follower {
        let http = access::http_client(access.tls, config.request_timeout);
        let drop_guard = config.drop_guard;
        Follower {
            http,
            urls: access.urls,
            trust: access.trust,
            current: 0,
            config,
            registry_metrics,
            metrics,
            health,
            local: Arc::new(Local::default()),
            need_full: true,
            failures: 0,
            guard: DropGuard::new(drop_guard),
            loaded: Arc::clone(loaded),
        }
    }

    async fn run(mut self, tx: watch::Sender<Arc<Registry>>) {
        let base = self.config.interval.min(Duration::from_secs(1));
        loop {
            let wait = match self.poll().await {
                Ok(local) => {
                    self.failures = 0;
                    self.publish(&local, &tx);
                    self.local = Arc::new(local);
                    self.need_full = false;
                    self.config.interval
                }
                Err(e) => {
                    self.failures += 1;
                    self.need_full = true;
                    inc(&self.metrics.eureka_fetch_errors_total);
                    if matches!(e, FetchError::TooLarge { .. }) {
                        inc(&self.metrics.eureka_answers_too_large_total);
                    }
                    self.health.record_error(&self.registry_metrics, &e);
                    let wait = backoff(self.failures, base, self.config.max_backoff);
                    tracing::warn!(
                        error = %Chain(&e),
                        failures = self.failures,
                        retry_in = %duration_text(wait),
                        "no Eureka server gave a usable registry; keeping the last good registry"
                    );
                    wait
                }
            };
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = tx.closed() => return,
            }
        }
    }

    /// One poll: a delta applied to the local copy, or a full fetch; the new local copy.
    async fn poll(&mut self) -> Result<Local, FetchError> {
        if self.need_full {
            return self.fetch_full(false).await;
        }
        let delta = self
            .fetch_one(self.current, "/apps/delta", |reader| {
                let mut changes = Vec::new();
                let head = read::read_document(reader, &mut |app, index, inst| match inst {
                    Ok(info) => changes.extend(Change::of(app, index, &info)),
                    Err(w) => tracing::debug!("Eureka instance unreadable: {w}"),
                })?;
                Ok((head, changes))
            })
            .await;
        let (head, changes) = match delta {
            Ok(delta) => delta,
            Err(e) => {
                tracing::info!(error = %Chain(&e), "Eureka delta not usable; fetching the full registry");
                return self.fetch_full(e.is_unreachable()).await;
            }
        };
        let next = self.local.apply(changes);
        let theirs = head.apps_hashcode.as_deref();
        let ours = next.hash_code();
        if theirs == Some(ours.as_str()) {
            return Ok(next);
        }
        inc(&self.metrics.eureka_hash_mismatches_total);
        tracing::info!(
            ours,
            theirs = theirs.unwrap_or("(none)"),
            "Eureka delta does not match the server's hash code; fetching the full registry"
        );
        drop(next);
        self.fetch_full(false).await
    }

    /// `GET /apps` from each URL in turn, from the current one (or the one after it, when
    /// the current one just failed), until one answers.
    async fn fetch_full(&mut self, skip_current: bool) -> Result<Local, FetchError> {
        let n = self.urls.len();
        let first = if skip_current && n > 1 {
            self.current + 1
        } else {
            self.current
        };
        let mut last_error = None;
        for k in 0..n {
            let i = (first + k) % n;
            let previous = Arc::clone(&self.local);
            let full = self.fetch_one(i, "/apps", move |reader| {
                let mut full = Full::new(previous);
                read::read_document(reader, &mut |app, index, inst| match inst {
                    Ok(info) => full.add(app, index, &info),
                    Err(w) => tracing::debug!("Eureka instance unreadable: {w}"),
                })?;
                Ok(full.finish())
            });
            match full.await {
                Ok(local) => {
                    if i != self.current {
                        inc(&self.metrics.eureka_failovers_total);
                        tracing::info!(url = %self.urls[i], "following another Eureka server");
                        self.current = i;
                    }
                    inc(&self.metrics.eureka_full_fetches_total);
                    return Ok(local);
                }
                Err(e) => {
                    if n > 1 {
                        tracing::warn!(error = %Chain(&e), "Eureka server failed; trying the next");
                    }
                    last_error = Some(e);
                }
            }
        }
        Err(last_error.unwrap_or_else(|| FetchError::Transport {
            url: String::new(),
            source: "no URL".into(),
        }))
    }

    /// One `GET` from URL `i`, its answer read through `parse` as it arrives (see
    /// [`answer::read`]); counted and timed.
    async fn fetch_one<T: Send + 'static>(
        &self,
        i: usize,
        path: &str,
        parse: impl FnOnce(&mut dyn std::io::Read) -> Result<T, InvalidDocument> + Send + 'static,
    ) -> Result<T, FetchError> {
        let started = std::time::Instant::now();
        let fetched = self.get_and_read(i, path, parse).await;
        observe(&self.metrics.eureka_fetch_seconds, started.elapsed());
        if fetched.is_ok() {
            inc(&self.metrics.eureka_fetches_total);
        }
        fetched
    }

    /// [`fetch_one`](Self::fetch_one)'s request and read.
    async fn get_and_read<T: Send + 'static>(
        &self,
        i: usize,
        path: &str,
        parse: impl FnOnce(&mut dyn std::io::Read) -> Result<T, InvalidDocument> + Send + 'static,
    ) -> Result<T, FetchError> {
        let server = &self.urls[i];
        let url = format!("{server}{path}");
        let after = self.config.request_timeout;
        let response = tokio::time::timeout(after, get(&self.http, server, path, &self.trust))
            .await
            .map_err(|_| FetchError::Timeout {
                url: url.clone(),
                after,
            })??;
        let bounds = Bounds {
            max_bytes: self.config.max_answer,
            idle: after,
        };
        let parsed = answer::read(response, bounds, parse)
            .await
            .map_err(|e| match e {
                Unread::Idle(after) => FetchError::Timeout {
                    url: url.clone(),
                    after,
                },
                Unread::TooLarge(limit) => FetchError::TooLarge {
                    url: url.clone(),
                    limit,
                },
                Unread::Transport(_) | Unread::Reader(_) | Unread::Encoding(_) => {
                    FetchError::Transport {
                        url: url.clone(),
                        source: e.into(),
                    }
                }
            })?
            .map_err(|source| FetchError::Document { url, source })?;
        Ok(parsed)
    }

    /// Records the good fetch and publishes the registry if it changed.
    fn publish(&mut self, local: &Local, tx: &watch::Sender<Arc<Registry>>) {
        let registry = local.registry();
        let new_warnings =
            self.health
                .record_success(&self.registry_metrics, &registry, &local.warnings());
        for w in new_warnings {
            tracing::warn!("Eureka instance left out: {w}");
        }
        self.loaded.notify_one();
        let instances = registry.len();
        let published = guard::publish_guarded(
            &mut self.guard,
            tx,
            registry,
            &self.health,
            &self.registry_metrics,
        );
        if published {
            tracing::info!(instances, "Eureka registry changed");
        }
    }
}

/// `GET` of `path` under `server`, with its credentials, asking for gzip: the answer, once
/// its headers are in and say 2xx. Errors show the URL redacted.
async fn get(
    http: &HttpClient,
    server: &ServerUrl,
    path: &str,
    trust: &str,
) -> Result<hyper::Response<Incoming>, FetchError> {
    let url = format!("{server}{path}");
    let transport = |source: Box<dyn std::error::Error + Send + Sync>| FetchError::Transport {
        url: url.clone(),
        source,
    };
    let mut request = hyper::Request::get(format!("{}{path}", server.base()))
        .header(ACCEPT, "application/json")
        .header(ACCEPT_ENCODING, answer::ACCEPT_GZIP);
    if let Some(authorization) = server.authorization() {
        request = request.header(AUTHORIZATION, authorization.clone());
    }
    let request = request
        .body(Empty::new())
        .map_err(|e| transport(e.into()))?;
    let response = http.request(request).await.map_err(|e| {
        if let Some(source) = tls::find_rustls_error(&e) {
            return FetchError::Tls {
                url: url.clone(),
                trust: trust.to_owned(),
                source: source.clone(),
            };
        }
        // The legacy client's error says little; its causes say what happened.
        transport(e.into())
    })?;
    let status = response.status();
    if matches!(status.as_u16(), 401 | 403) {
        return Err(FetchError::Unauthorized {
            url,
            status: status.as_u16(),
            credentials: server.authorization().is_some(),
        });
    }
    if !status.is_success() {
        return Err(FetchError::Status {
            url,
            status: status.as_u16(),
        });
    }
    Ok(response)
}

#[cfg(test)]
mod tests;
