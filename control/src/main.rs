//! `odmesh-control`: the composition root. Parses the command line, starts the registry
//! source, the snapshot pipeline, the xDS server and the admin endpoint, and stops them on
//! SIGINT or SIGTERM.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, bail};
use clap::Parser;
use tokio::net::TcpListener;
use tokio::sync::watch;

use odmesh_control::admin::{self, AdminView};
use odmesh_control::cache::Cache;
use odmesh_control::metrics::Metrics;
use odmesh_control::model;
use odmesh_control::registry::{self, Registry, SourceHealth};
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
struct Args {
    /// Registry file: Eureka's `GET /eureka/apps` JSON, or the YAML form
    /// (`instances: [{app, ip, port, secure_port, vip, svip, status, zone}]`). Watched: a
    /// change, including an atomic rename over it, takes effect within a second; a file that
    /// fails to parse is reported and the last good registry stays in use.
    #[arg(long, value_name = "FILE")]
    registry: PathBuf,

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
    }

    let source = registry::file::start(
        args.registry.clone(),
        registry::file::DEFAULT_POLL_INTERVAL,
        metrics.clone(),
    )
    .await
    // The error names the file, the format and the problem in one line.
    .map_err(|e| anyhow::anyhow!("--registry: {e}"))?;

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
    let admin_task = tokio::spawn(
        axum::serve(admin_listener, admin::router(view))
            .with_graceful_shutdown(stopped())
            .into_future(),
    );
    let xds_task = tokio::spawn(xds.serve(xds_listener, stopped()));
    tracing::info!(xds = %args.xds, admin = %args.admin, registry = %args.registry.display(), "odmesh-control serving");

    shutdown_signal().await;
    tracing::info!("stopping");
    let _ = stop_tx.send(true);
    xds_task.await?.context("xDS server")?;
    admin_task.await?.context("admin server")?;
    Ok(())
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
        (
            status.loaded,
            serde_json::to_value(&status).unwrap_or_default(),
        )
    }

    fn registry(&self) -> serde_json::Value {
        serde_json::to_value(&**self.registry.borrow()).unwrap_or_default()
    }

    fn proxies(&self) -> serde_json::Value {
        serde_json::to_value(self.xds.proxies()).unwrap_or_default()
    }

    fn metrics(&self) -> &Metrics {
        &self.metrics
    }
}
