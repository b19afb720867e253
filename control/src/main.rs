//! `odmesh-control`: the composition root. Parses the command line, starts the registry
//! source, the snapshot pipeline, the xDS server and the admin endpoint, and stops them on
//! SIGINT or SIGTERM. The TLS files and the tokens file are read again when they change and
//! on SIGHUP.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, SystemTime};

mod cli;

use anyhow::{Context, bail};

use cli::{Args, LogFormat, PrewarmArgs};
use tokio::net::TcpListener;
use tokio::sync::watch;

use odmesh_base::error::Chain;
use odmesh_base::http_server::{self, HttpEvent, HttpLimits};
use odmesh_base::metrics::{Format, inc, set};
use odmesh_base::reload::{Outcome, Reloader, Watched};
use odmesh_base::tls::{self, ServerTls, ServerTlsFiles};
use odmesh_control::admin::{self, AdminView};
use odmesh_control::cache::Cache;
use odmesh_control::dashboard::AnswerTimes;
use odmesh_control::metrics::{AllMetrics, Metrics};
use odmesh_control::model;
use odmesh_control::policy::{self, watch::PolicyStatus};
use odmesh_control::prewarm::{self, Prewarm};
use odmesh_control::server::{XdsConfig, XdsServer};
use odmesh_control::xds::XdsOptions;
use odmesh_eureka::server::auth::TokensFile;
use odmesh_eureka::wire::json::read_registry_file;
use odmesh_eureka::{ServerMetrics, client as eureka_client, server as eureka_server};
use odmesh_registry::guard::DropGuardConfig;
use odmesh_registry::{Registry, SourceHealth, file};

/// The registry source in use, whichever it is.
struct Source {
    registry: watch::Receiver<Arc<Registry>>,
    health: SourceHealth,
    description: String,
    /// The source's own task (watcher, poller or server); it runs as long as odmesh does.
    task: tokio::task::JoinHandle<()>,
    /// Its files to read again when they change (the embedded registry's TLS and tokens).
    reload: Vec<Watched>,
}

/// Starts the source the flags name (the embedded registry when none is named).
async fn start_source(args: &Args, metrics: &AllMetrics) -> anyhow::Result<Source> {
    args.check()?;
    if let Some(path) = &args.registry {
        start_file(path, args.guards.drop_guard(), metrics).await
    } else if !args.eureka.is_empty() {
        start_eureka(args.eureka_client(), metrics).await
    } else {
        start_embedded(args, metrics).await
    }
}

/// The registry file (`--registry`), watched.
async fn start_file(
    path: &std::path::Path,
    guard: DropGuardConfig,
    metrics: &AllMetrics,
) -> anyhow::Result<Source> {
    let src = file::start_guarded(
        path.to_owned(),
        file::DEFAULT_POLL_INTERVAL,
        guard,
        read_registry_file,
        metrics.registry.clone(),
    )
    .await
    // The error names the file, the format and the problem in one line.
    .context("--registry")?;
    Ok(Source {
        registry: src.registry,
        health: src.health,
        description: format!("registry file {}", path.display()),
        task: src.task,
        reload: Vec::new(),
    })
}

/// The Eureka follower (`--eureka`).
async fn start_eureka(
    config: eureka_client::ClientConfig,
    metrics: &AllMetrics,
) -> anyhow::Result<Source> {
    // The error names the flag and the problem; its chain says the cause.
    let src = eureka_client::start_with(
        config,
        metrics.registry.clone(),
        metrics.eureka_client.clone(),
    )
    .await?;
    Ok(Source {
        registry: src.registry,
        // The URLs as the source shows them: passwords as ***.
        description: src.health.snapshot().description,
        health: src.health,
        task: src.task,
        reload: Vec::new(),
    })
}

/// Counts each reload's outcome into one of two counters of `metrics`.
fn count_into<M: Send + Sync + 'static>(
    metrics: Arc<M>,
    reloaded: fn(&M) -> &AtomicU64,
    refused: fn(&M) -> &AtomicU64,
) -> impl Fn(Outcome) + Send + Sync + 'static {
    move |outcome| match outcome {
        Outcome::Reloaded => inc(reloaded(&metrics)),
        Outcome::Refused => inc(refused(&metrics)),
    }
}

/// The embedded registry (`--serve-eureka`, the default).
async fn start_embedded(args: &Args, metrics: &AllMetrics) -> anyhow::Result<Source> {
    let addr = args.serve_eureka_addr();
    let config = args.eureka_server()?;
    let e = &args.embedded;
    let m = &metrics.eureka_server;
    let mut reload = Vec::new();
    if let (Some(path), Some(auth)) = (&e.eureka_auth, &config.auth) {
        let file = TokensFile::new(path.clone(), auth.clone());
        reload.push(Watched::new(
            "--eureka-auth",
            Arc::new(file),
            count_into(
                m.clone(),
                |m: &ServerMetrics| &m.eureka_tokens_reloads_total,
                |m| &m.eureka_tokens_reloads_refused_total,
            ),
        ));
    }
    let tls = match (&e.eureka_tls_cert, &e.eureka_tls_key) {
        (Some(cert), Some(key)) => {
            let files = ServerTlsFiles {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: None,
            };
            let tls =
                Arc::new(ServerTls::load(files, tls::ALPN_HTTP1).context("--eureka-tls-cert")?);
            reload.push(Watched::new(
                "--eureka-tls-cert",
                tls.clone(),
                count_into(
                    m.clone(),
                    |m: &ServerMetrics| &m.eureka_tls_reloads_total,
                    |m| &m.eureka_tls_reloads_refused_total,
                ),
            ));
            Some(tls)
        }
        _ => None,
    };
    if !addr.ip().is_loopback() && config.auth.is_none() {
        tracing::warn!(
            %addr,
            "the embedded registry takes writes from other hosts without authentication: anyone who reaches it can register, drain or remove any instance (set --eureka-auth)"
        );
    }
    let scheme = if tls.is_some() { "https" } else { "http" };
    let src = eureka_server::start(
        addr,
        config,
        tls,
        metrics.registry.clone(),
        metrics.eureka_server.clone(),
    )
    .await
    .with_context(|| format!("--serve-eureka {addr}: cannot listen"))?;
    metrics.add(src.eureka.peer_metrics());
    Ok(Source {
        registry: src.registry,
        health: src.health,
        description: format!(
            "embedded Eureka registry {scheme}://{}/eureka",
            src.local_addr
        ),
        task: src.task,
        reload,
    })
}

/// The xDS server's configuration from the flags, and its TLS files to read again when they
/// change.
fn xds_config(args: &Args, metrics: &Arc<Metrics>) -> anyhow::Result<(XdsConfig, Vec<Watched>)> {
    let x = &args.xds_limits;
    let mut reload = Vec::new();
    let tls = match (&x.xds_tls_cert, &x.xds_tls_key) {
        (Some(cert), Some(key)) => {
            let files = ServerTlsFiles {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: x.xds_client_ca.clone(),
            };
            let tls = Arc::new(ServerTls::load(files, tls::ALPN_H2).context("--xds-tls-cert")?);
            reload.push(Watched::new(
                "--xds-tls-cert",
                tls.clone(),
                count_into(
                    metrics.clone(),
                    |m: &Metrics| &m.xds_tls_reloads_total,
                    |m| &m.xds_tls_reloads_refused_total,
                ),
            ));
            Some(tls)
        }
        _ => None,
    };
    if !args.xds.ip().is_loopback() && x.xds_client_ca.is_none() {
        tracing::warn!(
            xds = %args.xds,
            "xDS is served to other hosts without client authentication: anyone who reaches it can read the registry's addresses (set --xds-tls-cert, --xds-tls-key and --xds-client-ca)"
        );
    }
    let config = XdsConfig {
        subscriptions: x.subscriptions(),
        max_connections: x.xds_max_connections,
        max_connections_per_source: x.xds_max_connections_per_source,
        max_streams_per_connection: x.xds_max_streams_per_connection.max(1),
        max_subscriptions: x.xds_max_subscriptions,
        max_subscriptions_per_source: x.xds_max_subscriptions_per_source,
        max_names_total: x.xds_max_names_total,
        max_names_per_source: x.xds_max_names_per_source,
        tls_handshake_timeout: args.tls_handshake_timeout,
        first_bytes_timeout: x.xds_first_bytes_timeout,
        first_request_timeout: x.xds_first_request_timeout,
        tls,
        prewarm: start_prewarm(&args.prewarm, metrics)?,
        load_report_interval: args.prewarm.load_report_interval,
        idle_cluster_timeout: Some(args.prewarm.idle_cluster_timeout).filter(|t| !t.is_zero()),
    };
    Ok((config, reload))
}

/// The prewarm history from the flags, read from its file; `None` with --no-prewarm. A file
/// that is not a history is set aside (renamed to FILE.unreadable), not overwritten.
fn start_prewarm(
    args: &PrewarmArgs,
    metrics: &Arc<Metrics>,
) -> anyhow::Result<Option<Arc<Prewarm>>> {
    if args.no_prewarm {
        return Ok(None);
    }
    let limits = args.limits();
    let path = &args.prewarm_history;
    // Prewarm is an optimisation: a history that cannot be read never stops the control plane.
    let history = match prewarm::load(path) {
        Ok(history) => history,
        Err(e @ prewarm::LoadError::Parse { .. }) => {
            // Not ours to overwrite: kept beside it, with the time, so an earlier one stays too.
            let mut aside = path.clone().into_os_string();
            aside.push(format!(".unreadable.{}", prewarm::unix_now()));
            let aside = PathBuf::from(aside);
            match std::fs::rename(path, &aside) {
                Ok(()) => {
                    tracing::error!(error = %Chain(&e), aside = %aside.display(), "the prewarm history was not readable: set aside, starting a new one")
                }
                // Another replica set it aside first.
                Err(rename) => {
                    tracing::error!(error = %Chain(&e), %rename, "the prewarm history was not readable, nor could it be set aside: starting a new one")
                }
            }
            prewarm::History::default()
        }
        Err(e) => {
            tracing::error!(error = %Chain(&e), "cannot read the prewarm history: starting without it (writing it will be tried every 2 s)");
            prewarm::History::default()
        }
    };
    let read = history.len();
    let prewarm = Prewarm::new(limits, Some(path.clone()), history, metrics.clone());
    tracing::info!(file = %path.display(), entries = prewarm.len(), read, "prewarm history loaded");
    Ok(Some(Arc::new(prewarm)))
}

/// How often the prewarm history is written to its file (when it changed).
const PREWARM_SAVE_INTERVAL: Duration = Duration::from_secs(2);

/// Writes the prewarm history every [`PREWARM_SAVE_INTERVAL`], until `stop` completes; then
/// once more.
async fn keep_prewarm_history(
    prewarm: Arc<Prewarm>,
    metrics: Arc<Metrics>,
    stop: impl std::future::Future<Output = ()>,
) {
    // File I/O (read, merge, write, fsync) off the async workers.
    let save = |prewarm: Arc<Prewarm>, metrics: Arc<Metrics>| async move {
        let saved = tokio::task::spawn_blocking({
            let prewarm = prewarm.clone();
            move || prewarm.save()
        })
        .await;
        if let Ok(Err(e)) = saved {
            inc(&metrics.prewarm_save_errors_total);
            tracing::warn!(error = %e, "cannot write the prewarm history (kept in memory, tried again)");
        }
        set(&metrics.prewarm_history_entries, prewarm.len() as u64);
    };
    let mut tick = tokio::time::interval(PREWARM_SAVE_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = tick.tick() => save(prewarm.clone(), metrics.clone()).await,
            _ = &mut stop => break,
        }
    }
    save(prewarm, metrics).await;
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    match run().await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // One line that says what was wrong and where, e.g.
            // "error: --registry r.yaml: registry file r.yaml (YAML): ... at line 4, column 1".
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// How clusters are built (`--upstream-ca`, `--no-upstream-san-check`); a CA bundle Envoy
/// could not use is refused here.
fn xds_options(args: &Args) -> anyhow::Result<XdsOptions> {
    let mut options = XdsOptions::new(args.upstream_ca.clone());
    options.verify_upstream_san = !args.no_upstream_san_check;
    options.leds_min_endpoints = args.leds_min_endpoints;
    if let Some(ca) = &args.upstream_ca {
        check_ca_bundle(ca)?;
    } else if !options.upstream_ca.is_file() {
        tracing::warn!(
            path = %options.upstream_ca.display(),
            "no system CA bundle found: Envoy will reject .svip clusters until --upstream-ca names one"
        );
    }
    Ok(options)
}

/// The policy file (`--policy`), in force in `cache` before the xDS server starts (no proxy
/// gets a cluster without it), and followed as it changes.
fn start_policy(
    args: &Args,
    cache: &Arc<Cache>,
    metrics: &Arc<Metrics>,
) -> anyhow::Result<Arc<std::sync::Mutex<PolicyStatus>>> {
    let Some(path) = &args.policy else {
        return Ok(Arc::default());
    };
    let guard = args.guards.drop_guard();
    let source = policy::watch::start(
        path.clone(),
        file::DEFAULT_POLL_INTERVAL,
        guard,
        metrics.clone(),
    )
    .with_context(|| "--policy: the policy file is not valid".to_string())?;
    cache.set_policy(source.policy.borrow().clone());
    let cache = cache.clone();
    let policies = source.policy.clone();
    tokio::spawn(async move { cache.follow_policy(policies).await });
    Ok(source.status)
}

/// A listener on the address of `flag`.
async fn listen(flag: &str, addr: std::net::SocketAddr) -> anyhow::Result<TcpListener> {
    (TcpListener::bind(addr).await).with_context(|| format!("{flag} {addr}: cannot listen"))
}

/// The admin endpoint over `view`, until `stop` resolves.
async fn serve_admin(
    listener: TcpListener,
    view: View,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let metrics = view.metrics.control.clone();
    let refused = move |event| {
        if event == HttpEvent::ConnectionRefused {
            inc(&metrics.admin_connections_refused_total);
        }
    };
    let router = admin::router(Arc::new(view));
    http_server::serve(listener, router, HttpLimits::default(), None, refused, stop).await
}

async fn run() -> anyhow::Result<()> {
    // Bad arguments are clap's to print, before any log line.
    let args = Args::parse_with_env();
    let logs = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr);
    match args.log_format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs.json().init(),
    }
    // Before any file is read: from here on, a SIGHUP reads them again, and never stops the
    // process (its default action).
    let hangups = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .context("cannot handle SIGHUP")?;
    let all_metrics = AllMetrics::default();
    let metrics = all_metrics.control.clone();

    let options = xds_options(&args)?;
    let mut source = start_source(&args, &all_metrics).await?;
    let mut reload = std::mem::take(&mut source.reload);

    let (snapshots, _pipeline) =
        model::follow(source.registry.clone(), all_metrics.registry.clone());
    let cache = Arc::new(Cache::with_snapshot(options, snapshots.borrow().clone()));
    tokio::spawn({
        let cache = cache.clone();
        async move { cache.follow(snapshots).await }
    });
    let policy_status = start_policy(&args, &cache, &metrics)?;
    let (xds_config, xds_reload) = xds_config(&args, &metrics)?;
    reload.extend(xds_reload);
    let prewarm = xds_config.prewarm.clone();
    let xds = XdsServer::with_config(cache.clone(), metrics.clone(), xds_config);

    let xds_listener = listen("--xds", args.xds).await?;
    let admin_listener = listen("--admin", args.admin).await?;
    if !args.admin.ip().is_loopback() {
        tracing::warn!(
            admin = %args.admin,
            "the admin endpoint is reachable from other hosts, without authentication: /debug/registry lists every instance's address"
        );
    }

    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|stop| *stop).await;
        }
    };

    let view = View {
        metrics: all_metrics,
        health: source.health.clone(),
        registry: source.registry.clone(),
        xds: xds.clone(),
        cache,
        policy: policy_status,
        prewarm: prewarm.clone(),
    };
    let mut admin_task = admin::on_own_thread("odmesh-admin", admin_listener, {
        let stop = stopped();
        move |listener| serve_admin(listener, view, stop)
    })?;
    let mut xds_task = tokio::spawn(xds.serve(xds_listener, stopped()));
    let prewarm_task = (prewarm.clone())
        .map(|p| tokio::spawn(keep_prewarm_history(p, metrics.clone(), stopped())));
    let mut source_task = source.task;
    start_reloads(reload, args.reload_interval, hangups);
    tracing::info!(xds = %args.xds, admin = %args.admin, source = %source.description, "odmesh-control serving");

    // Serve until a signal, or until a part stops by itself: then exit non-zero rather than
    // carry on without it (e.g. answering /readyz with no registry API behind it).
    let outcome = tokio::select! {
        _ = shutdown_signal() => Ok(()),
        ended = &mut xds_task => Err(anyhow::anyhow!("the xDS server stopped: {}", ended_why(ended))),
        ended = &mut admin_task => Err(anyhow::anyhow!("the admin server stopped: {}", ended_why(ended))),
        ended = &mut source_task => Err(anyhow::anyhow!("the registry source stopped: {}", ended_why(ended.map(Ok::<(), std::convert::Infallible>)))),
    };
    tracing::info!("stopping");
    let _ = stop_tx.send(true);
    source_task.abort();
    // Open streams end at once on shutdown; a proxy that stopped reading must not hold us.
    stop_within("xDS server", &mut xds_task).await;
    stop_within("admin server", &mut admin_task).await;
    if let Some(mut task) = prewarm_task {
        stop_within("prewarm history", &mut task).await;
    }
    outcome
}

/// Reads `watched` again when their files change (looked at every `interval`; never with 0)
/// and, all of them, on every SIGHUP.
fn start_reloads(
    watched: Vec<Watched>,
    interval: Duration,
    mut hangups: tokio::signal::unix::Signal,
) {
    let reloader = Reloader::new(watched);
    let now = Arc::new(tokio::sync::Notify::new());
    let nothing = reloader.is_empty();
    tokio::spawn({
        let now = now.clone();
        async move {
            while hangups.recv().await.is_some() {
                if nothing {
                    tracing::info!("SIGHUP: no TLS or tokens file to read again");
                } else {
                    tracing::info!("SIGHUP: reading the TLS files and the tokens file again");
                    now.notify_one();
                }
            }
        }
    });
    if !nothing {
        tokio::spawn(reloader.run(interval, now));
    }
}

/// Waits for a server task to finish closing its connections, for at most [`STOP_TIMEOUT`].
async fn stop_within<T>(name: &str, task: &mut tokio::task::JoinHandle<T>) {
    // A task that already ended was awaited by the select above; awaiting it again panics.
    if task.is_finished() {
        return;
    }
    if tokio::time::timeout(STOP_TIMEOUT, &mut *task)
        .await
        .is_err()
    {
        tracing::warn!("the {name} did not stop within {STOP_TIMEOUT:?}; stopping it");
        task.abort();
    }
}

/// How long the servers get to close their connections on shutdown.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a task ended, in words.
fn ended_why<E: std::error::Error + 'static>(
    ended: Result<Result<(), E>, tokio::task::JoinError>,
) -> String {
    match ended {
        Ok(Ok(())) => "it ended".to_owned(),
        Ok(Err(e)) => Chain(&e).to_string(),
        Err(e) => e.to_string(),
    }
}

/// Refuses a CA bundle Envoy could not use: every `.svip` cluster would be rejected (NACK)
/// and each first request to one would wait for the discovery timeout.
fn check_ca_bundle(path: &std::path::Path) -> anyhow::Result<()> {
    let pem = std::fs::read_to_string(path)
        .with_context(|| format!("--upstream-ca {}: cannot read", path.display()))?;
    if !pem.contains("-----BEGIN CERTIFICATE-----") {
        bail!(
            "--upstream-ca {}: no PEM certificate in it (expected -----BEGIN CERTIFICATE-----)",
            path.display()
        );
    }
    Ok(())
}

/// Waits for SIGINT (Ctrl-C) or SIGTERM.
async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
}

/// What the admin endpoint shows, from the live parts.
struct View {
    metrics: AllMetrics,
    health: SourceHealth,
    registry: watch::Receiver<Arc<Registry>>,
    xds: XdsServer,
    cache: Arc<Cache>,
    policy: Arc<std::sync::Mutex<PolicyStatus>>,
    prewarm: Option<Arc<Prewarm>>,
}

impl AdminView for View {
    fn registry_status(&self) -> (bool, serde_json::Value) {
        let status = self.health.snapshot();
        let age = status.age_of_last_success(SystemTime::now());
        let mut json = serde_json::to_value(&status).unwrap_or_default();
        json["last_success_age_seconds"] = age.map(|a| a.as_secs_f64()).into();
        // Still loading: proxies keep what they hold until it is complete.
        json["complete"] = self.registry.borrow().is_complete().into();
        (status.loaded, json)
    }

    fn registry(&self) -> serde_json::Value {
        serde_json::to_value(&**self.registry.borrow()).unwrap_or_default()
    }

    fn proxies(&self) -> serde_json::Value {
        serde_json::to_value(self.xds.proxies()).unwrap_or_default()
    }

    fn policy(&self, cluster: Option<&str>, caller: &str) -> serde_json::Value {
        let status = self.policy.lock().map(|s| s.clone()).unwrap_or_default();
        let mut out = serde_json::json!({
            "source": status,
            "file": self.cache.policy().summary(),
        });
        if let Some(cluster) = cluster {
            let policy = (self.cache.effective_policy(cluster, caller))
                .map(|p| p.debug_view(SystemTime::now()));
            out["effective"] = serde_json::json!([{
                "cluster": cluster,
                "caller": caller,
                "policy": policy,
            }]);
            return out;
        }
        // Every (cluster, calling service) that a connected proxy holds.
        let mut held = std::collections::BTreeSet::new();
        for proxy in self.xds.proxies() {
            for cluster in proxy.clusters {
                held.insert((cluster, proxy.node_cluster.clone()));
            }
        }
        out["effective"] = (held.into_iter())
            .map(|(cluster, caller)| {
                let policy = (self.cache.effective_policy(&cluster, &caller))
                    .map(|p| p.debug_view(SystemTime::now()));
                serde_json::json!({ "cluster": cluster, "caller": caller, "policy": policy })
            })
            .collect::<Vec<_>>()
            .into();
        out
    }

    fn prewarm(&self) -> serde_json::Value {
        match &self.prewarm {
            Some(prewarm) => {
                let snapshot = self.cache.snapshot();
                prewarm.view(|name| snapshot.get(name).is_some())
            }
            None => serde_json::json!({ "enabled": false }),
        }
    }

    fn metrics(&self, format: Format) -> String {
        // A derived gauge, brought up to date for each scrape.
        let age = self
            .health
            .snapshot()
            .age_of_last_success(SystemTime::now());
        set(
            &self.metrics.registry.registry_last_success_age_seconds,
            age.map_or(0, |a| a.as_secs()),
        );
        // What the policy in use switches on, now (a fault ends at its `until`).
        let features = self.cache.policy().features(SystemTime::now());
        let control = &self.metrics.control;
        set(&control.policy_hedge_entries, features.hedges as u64);
        set(&control.policy_fault_entries, features.faults as u64);
        set(
            &control.policy_concurrency_limit_entries,
            features.limits as u64,
        );
        self.metrics.render(format)
    }

    fn answer_time_percentiles(&self) -> Option<AnswerTimes> {
        let answers = &self.metrics.control.xds_on_demand_answer_seconds;
        Some(AnswerTimes::of(answers))
    }
}
