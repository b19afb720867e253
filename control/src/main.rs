//! `odmesh-control`: the composition root. Parses the command line, starts the registry
//! source, the snapshot pipeline, the xDS server and the admin endpoint, and stops them on
//! SIGINT or SIGTERM.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::{Context, bail};
use clap::Parser;
use tokio::net::TcpListener;
use tokio::sync::watch;

use odmesh_control::admin::{self, AdminView};
use odmesh_control::cache::Cache;
use odmesh_control::metrics::Metrics;
use odmesh_control::model;
use odmesh_control::registry::{self, Registry, SourceHealth, eureka_client, eureka_server, file};
use odmesh_control::server::XdsServer;
use odmesh_control::xds::XdsOptions;

/// The odmesh control plane: serves Envoy the clusters `<vip>.vip` and `<svip>.svip` on
/// demand over delta xDS (ADS), with endpoints from a Eureka-style registry.
///
/// Envoy asks for a cluster the first time a request needs it; odmesh-control answers from
/// the registry and keeps the endpoints current as the registry changes. A VIP that is not
/// registered is answered too, with a cluster that has no endpoints, so requests for it fail
/// fast (503) until it appears.
#[derive(Debug, Parser)]
#[command(name = "odmesh-control", version, verbatim_doc_comment)]
#[command(group(clap::ArgGroup::new("source").args(["registry", "eureka", "serve_eureka"])))]
struct Args {
    /// Registry file: Eureka's `GET /eureka/apps` JSON, or the YAML form
    /// (`instances: [{app, ip, port, secure_port, vip, svip, status, zone}]`). Watched: a
    /// change, including an atomic rename over it, takes effect within a second; a file that
    /// fails to parse is reported and the last good registry stays in use.
    #[arg(long, value_name = "FILE")]
    registry: Option<PathBuf>,

    /// Follow a Eureka server, e.g. `http://eureka:8761/eureka`: a full fetch of `/apps`,
    /// then `/apps/delta` every --eureka-interval, reconciled by Eureka's hash code. Repeat
    /// the flag for several servers, tried in turn. While none answers, the last good
    /// registry stays in use. `https://` URLs are verified against --eureka-ca;
    /// `https://user:password@eureka/eureka` (percent-encoded) sends Basic authentication,
    /// but other users of this host can read a password here in the process list.
    #[arg(long, value_name = "URL")]
    eureka: Vec<String>,

    /// CA bundle (PEM) that signs the certificates of the `https://` Eureka servers, which
    /// must also name the URL's host. Default: the system CA bundle.
    #[arg(long, value_name = "FILE", requires = "eureka")]
    eureka_ca: Option<PathBuf>,

    /// File whose content (trimmed) is sent to the Eureka servers as `Authorization: Bearer`;
    /// a URL with its own `user:password@` sends that instead. Read once, at start.
    #[arg(long, value_name = "FILE", requires = "eureka")]
    eureka_token_file: Option<PathBuf>,

    /// Seconds between two polls of Eureka's delta (as Eureka's own clients do).
    #[arg(long, value_name = "SECS", default_value_t = 30.0)]
    eureka_interval: f64,

    /// Be the registry: serve a Eureka-compatible REST API (base path /eureka) that standard
    /// Eureka clients register with. This is the default when no source is given.
    #[arg(long, value_name = "ADDR", num_args = 0..=1, default_missing_value = eureka_server::DEFAULT_ADDR)]
    serve_eureka: Option<SocketAddr>,

    /// Seconds an instance of the embedded registry lives without a heartbeat, unless its
    /// registration says otherwise (`leaseInfo.durationInSecs`).
    #[arg(long, value_name = "SECS", default_value_t = 90.0)]
    lease_duration: f64,

    /// Address of the xDS gRPC server (delta ADS, and delta CDS/EDS).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:18000")]
    xds: SocketAddr,

    /// Address of the admin HTTP server: /healthz, /readyz, /metrics, /debug/registry,
    /// /debug/proxies.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:18001")]
    admin: SocketAddr,

    /// CA bundle (PEM) with which Envoy verifies `.svip` upstreams. The path is Envoy's: it
    /// must exist where Envoy runs. Default: the system CA bundle.
    #[arg(long, value_name = "FILE")]
    upstream_ca: Option<PathBuf>,

    /// Accept any `.svip` upstream certificate that chains to the CA, without checking that
    /// it names the SVIP (DNS subject alternative name).
    #[arg(long)]
    no_upstream_san_check: bool,
}

/// The registry source in use, whichever it is.
struct Source {
    registry: watch::Receiver<Arc<Registry>>,
    health: SourceHealth,
    description: String,
    /// The source's own task (watcher, poller or server); it runs as long as odmesh does.
    task: tokio::task::JoinHandle<()>,
}

/// Starts the source the flags name (the embedded registry when none is named).
async fn start_source(args: &Args, metrics: &Arc<Metrics>) -> anyhow::Result<Source> {
    if let Some(path) = &args.registry {
        let src = registry::file::start(path.clone(), file::DEFAULT_POLL_INTERVAL, metrics.clone())
            .await
            // The error names the file, the format and the problem in one line.
            .map_err(|e| anyhow::anyhow!("--registry: {e}"))?;
        return Ok(Source {
            registry: src.registry,
            health: src.health,
            description: format!("registry file {}", path.display()),
            task: src.task,
        });
    }
    if !args.eureka.is_empty() {
        let interval = seconds("--eureka-interval", args.eureka_interval)?;
        let config = eureka_client::ClientConfig {
            ca_file: args.eureka_ca.clone(),
            token_file: args.eureka_token_file.clone(),
            ..eureka_client::ClientConfig::new(args.eureka.clone(), interval)
        };
        // The error names the flag and the problem; its chain says the cause.
        let src = eureka_client::start_with(config, metrics.clone()).await?;
        return Ok(Source {
            registry: src.registry,
            // The URLs as the source shows them: passwords as ***.
            description: src.health.snapshot().description,
            health: src.health,
            task: src.task,
        });
    }
    let addr = match args.serve_eureka {
        Some(addr) => addr,
        None => eureka_server::DEFAULT_ADDR.parse()?,
    };
    let config = eureka_server::ServerConfig {
        lease_duration: seconds("--lease-duration", args.lease_duration)?,
        ..Default::default()
    };
    let src = eureka_server::start(addr, config, metrics.clone())
        .await
        .with_context(|| format!("--serve-eureka {addr}: cannot listen"))?;
    Ok(Source {
        registry: src.registry,
        health: src.health,
        description: format!("embedded Eureka registry http://{}/eureka", src.local_addr),
        task: src.task,
    })
}

/// A positive, finite number of seconds from flag `flag`.
fn seconds(flag: &str, value: f64) -> anyhow::Result<Duration> {
    Duration::try_from_secs_f64(value)
        .ok()
        .filter(|d| !d.is_zero())
        .with_context(|| format!("{flag} {value}: not a positive number of seconds"))
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    match run().await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // One line that says what was wrong and where, e.g.
            // "error: --registry r.yaml: registry file r.yaml (YAML): ... at line 4 column 1".
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let metrics = Arc::new(Metrics::default());

    let mut options = XdsOptions::new(args.upstream_ca.clone());
    options.verify_upstream_san = !args.no_upstream_san_check;
    if let Some(ca) = &args.upstream_ca {
        check_ca_bundle(ca)?;
    } else if !options.upstream_ca.is_file() {
        tracing::warn!(
            path = %options.upstream_ca.display(),
            "no system CA bundle found: Envoy will reject .svip clusters until --upstream-ca names one"
        );
    }

    let source = start_source(&args, &metrics).await?;

    let (snapshots, _pipeline) = model::follow(source.registry.clone(), metrics.clone());
    let cache = Arc::new(Cache::with_snapshot(options, snapshots.borrow().clone()));
    tokio::spawn({
        let cache = cache.clone();
        async move { cache.follow(snapshots).await }
    });
    let xds = XdsServer::new(cache, metrics.clone());

    let xds_listener = TcpListener::bind(args.xds)
        .await
        .with_context(|| format!("--xds {}: cannot listen", args.xds))?;
    let admin_listener = TcpListener::bind(args.admin)
        .await
        .with_context(|| format!("--admin {}: cannot listen", args.admin))?;

    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|stop| *stop).await;
        }
    };

    let view = Arc::new(View {
        metrics: metrics.clone(),
        health: source.health.clone(),
        registry: source.registry.clone(),
        xds: xds.clone(),
    });
    let mut admin_task = tokio::spawn(
        axum::serve(admin_listener, admin::router(view))
            .with_graceful_shutdown(stopped())
            .into_future(),
    );
    let mut xds_task = tokio::spawn(xds.serve(xds_listener, stopped()));
    let mut source_task = source.task;
    tracing::info!(xds = %args.xds, admin = %args.admin, source = %source.description, "odmesh-control serving");

    // Serve until a signal, or until a part stops by itself: then exit non-zero rather than
    // carry on without it (e.g. answering /readyz with no registry API behind it).
    let outcome = tokio::select! {
        _ = shutdown_signal() => Ok(()),
        ended = &mut xds_task => Err(anyhow::anyhow!("the xDS server stopped: {}", ended_why(ended))),
        ended = &mut admin_task => Err(anyhow::anyhow!("the admin server stopped: {}", ended_why(ended))),
        ended = &mut source_task => Err(anyhow::anyhow!("the registry source stopped: {}", ended_why(ended.map(Ok::<(), String>)))),
    };
    tracing::info!("stopping");
    let _ = stop_tx.send(true);
    source_task.abort();
    // Open streams end at once on shutdown; a proxy that stopped reading must not hold us.
    stop_within("xDS server", &mut xds_task).await;
    stop_within("admin server", &mut admin_task).await;
    outcome
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
fn ended_why<E: std::fmt::Display>(ended: Result<Result<(), E>, tokio::task::JoinError>) -> String {
    match ended {
        Ok(Ok(())) => "it ended".to_owned(),
        Ok(Err(e)) => e.to_string(),
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
    metrics: Arc<Metrics>,
    health: SourceHealth,
    registry: watch::Receiver<Arc<Registry>>,
    xds: XdsServer,
}

impl AdminView for View {
    fn registry_status(&self) -> (bool, serde_json::Value) {
        let status = self.health.snapshot();
        let age = status.age_of_last_success(SystemTime::now());
        let mut json = serde_json::to_value(&status).unwrap_or_default();
        json["last_success_age_seconds"] = age.map(|a| a.as_secs_f64()).into();
        (status.loaded, json)
    }

    fn registry(&self) -> serde_json::Value {
        serde_json::to_value(&**self.registry.borrow()).unwrap_or_default()
    }

    fn proxies(&self) -> serde_json::Value {
        serde_json::to_value(self.xds.proxies()).unwrap_or_default()
    }

    fn metrics(&self) -> &Metrics {
        // A derived gauge, brought up to date for each scrape.
        let age = self
            .health
            .snapshot()
            .age_of_last_success(SystemTime::now());
        Metrics::set(
            &self.metrics.registry_last_success_age_seconds,
            age.map_or(0, |a| a.as_secs()),
        );
        &self.metrics
    }
}
