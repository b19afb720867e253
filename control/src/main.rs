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

use odmesh_base::error::Chain;
use odmesh_base::http_server::{self, HttpEvent, HttpLimits};
use odmesh_base::metrics::{inc, set};
use odmesh_base::tls::ServerIdentity;
use odmesh_control::admin::{self, AdminView};
use odmesh_control::cache::{Cache, SubscriptionLimits};
use odmesh_control::metrics::{AllMetrics, Metrics};
use odmesh_control::model;
use odmesh_control::policy::{self, watch::PolicyStatus};
use odmesh_control::prewarm::{self, Prewarm};
use odmesh_control::server::{XdsConfig, XdsServer};
use odmesh_control::xds::XdsOptions;
use odmesh_eureka::server::auth::Authenticator;
use odmesh_eureka::server::peers::PeerConfig;
use odmesh_eureka::server::policy::{Cidr, NetworkPolicy, RegistrationLimits};
use odmesh_eureka::server::preservation::PreservationConfig;
use odmesh_eureka::wire::json::read_registry_file;
use odmesh_eureka::{client as eureka_client, server as eureka_server};
use odmesh_registry::guard::DropGuardConfig;
use odmesh_registry::{Registry, SourceHealth, file};

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
    /// Registry file: Eureka's `GET /eureka/apps` JSON, or the YAML form (`instances:
    /// [{app, ip, port, secure_port, vip, svip, status, zone, id, protocol}]`). Watched: a
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

    /// Seconds a call to a Eureka server may wait, to connect and for the answer's headers,
    /// then for each next part of its body, before the next server is tried; a hanging
    /// server costs no more than this. (A large registry may take longer to arrive; it only
    /// may not stall.)
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    eureka_request_timeout: f64,

    /// The largest answer read from a Eureka server (`/apps`, `/apps/delta`), in bytes once
    /// decoded from gzip (and as transferred). A larger one fails the fetch
    /// (odmesh_eureka_answers_too_large_total) and the last good registry stays. The default,
    /// 4 GiB, is about 3 million instances as Spring's Eureka server writes them; answers are
    /// read as they arrive, so this bounds time and traffic, not memory.
    #[arg(long, value_name = "BYTES", default_value_t = eureka_client::DEFAULT_MAX_ANSWER)]
    eureka_max_answer: u64,

    /// Seconds the control plane waits at start for Eureka's first answer before it serves
    /// xDS anyway (with a registry still loading: proxies keep what they hold).
    #[arg(long, value_name = "SECS", default_value_t = 5.0)]
    eureka_first_fetch_wait: f64,

    /// Seconds a client may take to complete a TLS handshake with the xDS server or the
    /// embedded registry's HTTPS.
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    tls_handshake_timeout: f64,

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

    /// Policy file (YAML): per-destination timeouts, retries, circuit breakers, outlier
    /// detection, load balancing and protocol, with defaults, per-VIP/SVIP entries and
    /// per-calling-service overrides (README, "Per-destination policy"). Watched: a change
    /// reaches the proxies holding the affected clusters within a second (the file is read
    /// five times a second); a file that fails to parse is reported (log, metric,
    /// /debug/policy) and the last good policy stays.
    #[arg(long, value_name = "FILE")]
    policy: Option<PathBuf>,

    /// CA bundle (PEM) with which Envoy verifies `.svip` upstreams. The path is Envoy's: it
    /// must exist where Envoy runs. Default: the system CA bundle.
    #[arg(long, value_name = "FILE")]
    upstream_ca: Option<PathBuf>,

    /// Accept any `.svip` upstream certificate that chains to the CA, without checking that
    /// it names the SVIP (DNS subject alternative name).
    #[arg(long)]
    no_upstream_san_check: bool,

    #[command(flatten)]
    guards: GuardArgs,

    #[command(flatten)]
    embedded: EmbeddedArgs,

    #[command(flatten)]
    xds_limits: XdsArgs,

    #[command(flatten)]
    prewarm: PrewarmArgs,
}

/// Prewarm: a connecting proxy is sent the clusters its service used before.
#[derive(Debug, clap::Args)]
struct PrewarmArgs {
    /// Where the request history is kept (JSON, written atomically every few seconds and at
    /// exit): per calling service (Envoy's `node.cluster`), the clusters its proxies used and
    /// when. A proxy that connects with a wildcard cluster subscription (`cds_config` in its
    /// bootstrap, as envoy/odmesh.yaml has) is sent those that are still registered before
    /// any request needs them. Replicas may share one file (each merges the others' writes).
    /// A file that is not a history is set aside as FILE.unreadable.<time> and a new one
    /// started; one that cannot be read at all is left alone (prewarm starts empty).
    #[arg(long, value_name = "FILE", default_value = "odmesh-prewarm.json")]
    prewarm_history: PathBuf,

    /// Turn prewarm off: no history is kept or read, proxies get only what they ask for.
    #[arg(long, conflicts_with_all = ["prewarm_history", "prewarm_max_clusters", "prewarm_max_age"])]
    no_prewarm: bool,

    /// Clusters kept per calling service (the most recently used); also the most one
    /// connecting proxy is sent ahead.
    #[arg(long, value_name = "N", default_value_t = 1_000)]
    prewarm_max_clusters: usize,

    /// Seconds after which a cluster nobody used is forgotten (default: 7 days).
    #[arg(long, value_name = "SECS", default_value_t = 604_800.0)]
    prewarm_max_age: f64,

    /// Seconds between two load reports from each proxy (Envoy's LRS), which tell which
    /// clusters carried requests: a cluster sent ahead is never asked for again, so this is how
    /// the history learns that it is still in use.
    #[arg(long, value_name = "SECS", default_value_t = 30.0)]
    load_report_interval: f64,

    /// Seconds after which a cluster sent ahead that carried no request (by the proxy's load
    /// reports) is removed from the proxy, which asks for it again by name when a request
    /// needs it; 0: never. Clusters a proxy asked for itself are never removed (Envoy would
    /// not ask for them again).
    #[arg(long, value_name = "SECS", default_value_t = 3600.0)]
    idle_cluster_timeout: f64,
}

/// Guards against a source that loses most of the registry at once.
#[derive(Debug, clap::Args)]
#[command(next_help_heading = "Registry source guards (--registry, --eureka)")]
struct GuardArgs {
    /// Share of the registry in use (from 10 instances up) that a new read of the file or of
    /// Eureka may lose at once and still be followed at once. A read that loses more (an
    /// empty Eureka after its restart, a truncated file) is held until the source still says
    /// so --registry-drop-confirm later. 1 turns the guard off.
    #[arg(long, value_name = "SHARE", default_value_t = 0.5)]
    max_registry_drop: f64,

    /// Seconds a drop held by --max-registry-drop must persist before it is followed (for
    /// Eureka, at the first fetch at least this long after the one that showed it).
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    registry_drop_confirm: f64,
}

/// The embedded registry's guards and bounds.
#[derive(Debug, clap::Args)]
#[command(next_help_heading = "Embedded registry (--serve-eureka)")]
struct EmbeddedArgs {
    /// Seconds after a start during which the registry counts as still loading, while its
    /// clients register again (their heartbeats get 404 after a restart): proxies keep the
    /// clusters they hold meanwhile. One renewal interval (30 s) and a margin.
    #[arg(long, value_name = "SECS", default_value_t = 35.0)]
    registry_warmup: f64,

    /// During the warm-up, answer a client's GET /apps and /apps/delta 403, as Netflix's
    /// Eureka server does, so that Java Eureka clients keep the registry they hold instead
    /// of taking a partial one; the npm and PyPI clients cannot start meanwhile. Off: they
    /// are answered with what the registry holds so far, as Spring Cloud's server does.
    #[arg(long)]
    eureka_refuse_reads_while_warming: bool,

    /// Self-preservation: lease eviction stops while the renewals of the last
    /// --self-preservation-window fall below this share of those expected, and one eviction
    /// round takes at most the rest (15 %). 0 turns it off.
    #[arg(long, value_name = "SHARE", default_value_t = 0.85)]
    self_preservation_threshold: f64,

    /// Seconds over which renewals are counted for self-preservation.
    #[arg(long, value_name = "SECS", default_value_t = 60.0)]
    self_preservation_window: f64,

    /// Self-preservation applies from this many registered instances (below, one dying
    /// instance cannot be told from a partition).
    #[arg(long, value_name = "N", default_value_t = 10)]
    self_preservation_min_instances: usize,

    /// The longest lease a registration may ask for (`leaseInfo.durationInSecs`); a longer
    /// one is refused with 400.
    #[arg(long, value_name = "SECS", default_value_t = 300)]
    max_lease_duration: u64,

    /// Accept instances at loopback addresses (127.0.0.0/8, ::1): for a registry whose
    /// services and proxies all run on one machine (`make run`, tests). Never in production:
    /// a registration would send the mesh's traffic to each proxy's own host.
    #[arg(long)]
    allow_loopback_instances: bool,

    /// Accept instances only at addresses in this network (CIDR, e.g. 10.0.0.0/8); repeat
    /// for several. Default: any address but loopback, link-local, unspecified, multicast.
    #[arg(long, value_name = "CIDR")]
    eureka_allow_network: Vec<Cidr>,

    /// Tokens file (YAML) of the identities that may use the registry; with it, every
    /// request needs `Authorization: Bearer <token>` or Basic name:token, and an identity
    /// may change only the instances it registered and register only its VIPs. See
    /// docs/production.md.
    #[arg(long, value_name = "FILE")]
    eureka_auth: Option<PathBuf>,

    /// Another embedded registry (its base URL, e.g. `http://10.0.0.2:8761/eureka`) to
    /// replicate with, as Eureka's servers do: writes made here are sent to it, and a
    /// starting node fills itself from the first peer that answers. Repeatable; a URL naming
    /// this node is skipped, so every node can get the same list. With --eureka-auth on the
    /// peers, give an operator's `name:token@` in the URL.
    #[arg(long, value_name = "URL")]
    peer: Vec<String>,

    /// CA bundle (PEM) that signs the `https://` peers' certificates. Default: the system CA
    /// bundle.
    #[arg(long, value_name = "FILE")]
    peer_ca: Option<PathBuf>,

    /// Seconds one call to a peer (a batch of writes, a fill) may take before it counts as
    /// failed and is tried again; a fill, which reads the peer's whole registry, may take
    /// longer as long as no part of it waits longer than this.
    #[arg(long, value_name = "SECS", default_value_t = 5.0)]
    peer_timeout: f64,

    /// The largest registry a starting node reads from a peer (its `/apps`), in bytes once
    /// decoded from gzip (and as transferred); a larger one is refused
    /// (odmesh_eureka_peer_fills_too_large_total) and the next peer tried. Read as it
    /// arrives, so this bounds time and traffic, not memory.
    #[arg(long, value_name = "BYTES", default_value_t = eureka_client::DEFAULT_MAX_ANSWER)]
    peer_max_answer: u64,

    /// Writes kept for one peer that does not take them; beyond, the oldest are dropped
    /// (odmesh_eureka_peer_dropped_total) and its heartbeats bring the registrations back.
    #[arg(long, value_name = "N", default_value_t = 100_000)]
    peer_max_pending: usize,

    /// Serve the registry over HTTPS with this certificate chain (PEM); needs
    /// --eureka-tls-key.
    #[arg(long, value_name = "FILE", requires = "eureka_tls_key")]
    eureka_tls_cert: Option<PathBuf>,

    /// The private key (PEM) of --eureka-tls-cert.
    #[arg(long, value_name = "FILE", requires = "eureka_tls_cert")]
    eureka_tls_key: Option<PathBuf>,

    /// Instances the registry holds at most; registering a new one beyond gets 503.
    #[arg(long, value_name = "N", default_value_t = 2_000_000)]
    eureka_max_instances: usize,

    /// Metadata entries one instance may carry.
    #[arg(long, value_name = "N", default_value_t = 64)]
    eureka_max_metadata_entries: usize,

    /// Bytes of metadata (keys and values) one instance may carry.
    #[arg(long, value_name = "BYTES", default_value_t = 8192)]
    eureka_max_metadata_bytes: usize,

    /// The largest request body accepted; a larger one gets 413.
    #[arg(long, value_name = "BYTES", default_value_t = 16384)]
    eureka_max_body: usize,

    /// Seconds a request body may take to arrive; a slower one gets 408.
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    eureka_body_timeout: f64,

    /// Seconds a client may take to send a request's headers, counted from when the server
    /// waits for them (so also how long a kept-alive connection may sit idle).
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    eureka_header_timeout: f64,

    /// Seconds an answer may wait for a client that reads none of it; then the connection
    /// is closed (a stalled reader holds no answer and no slot for longer).
    #[arg(long, value_name = "SECS", default_value_t = 30.0)]
    eureka_write_timeout: f64,

    /// Connections served at once; more are closed on arrival.
    #[arg(long, value_name = "N", default_value_t = 1024)]
    eureka_max_connections: usize,
}

/// The xDS server's security and bounds.
#[derive(Debug, clap::Args)]
#[command(next_help_heading = "xDS server")]
struct XdsArgs {
    /// Serve xDS over TLS with this certificate chain (PEM); needs --xds-tls-key.
    #[arg(long, value_name = "FILE", requires = "xds_tls_key")]
    xds_tls_cert: Option<PathBuf>,

    /// The private key (PEM) of --xds-tls-cert.
    #[arg(long, value_name = "FILE", requires = "xds_tls_cert")]
    xds_tls_key: Option<PathBuf>,

    /// Require proxies to present a client certificate signed by this CA (mTLS); needs
    /// --xds-tls-cert.
    #[arg(long, value_name = "FILE", requires = "xds_tls_cert")]
    xds_client_ca: Option<PathBuf>,

    /// Connections served at once; more are closed on arrival.
    #[arg(long, value_name = "N", default_value_t = 10_000)]
    xds_max_connections: usize,

    /// HTTP/2 streams one connection may open at once (Envoy opens one, for ADS).
    #[arg(long, value_name = "N", default_value_t = 8)]
    xds_max_streams_per_connection: u32,

    /// Names one stream may subscribe to, per type; more are answered with a removal.
    #[arg(long, value_name = "N", default_value_t = 10_000)]
    xds_max_names: usize,

    /// Cluster names subscribed over all streams (each with its load assignment): about
    /// 1.5 KB each at most, so this bounds the control plane's memory whatever the number
    /// of streams. Names beyond wait for room (answered with a removal, pushed once there
    /// is room). Raise it for more proxies per control plane.
    #[arg(long, value_name = "N", default_value_t = 1_000_000)]
    xds_max_subscriptions: usize,

    /// Names not registered when asked for that one stream is served as clusters (each is
    /// a cluster in that Envoy's memory); more are answered with a removal until they are
    /// registered. A flood of random Hosts through one Envoy stops here.
    #[arg(long, value_name = "N", default_value_t = 100)]
    xds_max_unregistered: usize,
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
async fn start_source(args: &Args, metrics: &AllMetrics) -> anyhow::Result<Source> {
    let guard = DropGuardConfig {
        max_drop: share("--max-registry-drop", args.guards.max_registry_drop)?,
        confirm_after: seconds("--registry-drop-confirm", args.guards.registry_drop_confirm)?,
    };
    if !args.embedded.peer.is_empty() && (args.registry.is_some() || !args.eureka.is_empty()) {
        anyhow::bail!(
            "--peer: peers are embedded registries; it takes --serve-eureka, not --registry or --eureka"
        );
    }
    if let Some(path) = &args.registry {
        let src = file::start_guarded(
            path.clone(),
            file::DEFAULT_POLL_INTERVAL,
            guard,
            read_registry_file,
            metrics.registry.clone(),
        )
        .await
        // The error names the file, the format and the problem in one line.
        .context("--registry")?;
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
            drop_guard: guard,
            request_timeout: seconds("--eureka-request-timeout", args.eureka_request_timeout)?,
            max_answer: at_least_one("--eureka-max-answer", args.eureka_max_answer)?,
            first_fetch_wait: seconds_or_zero(
                "--eureka-first-fetch-wait",
                args.eureka_first_fetch_wait,
            )?,
            ..eureka_client::ClientConfig::new(args.eureka.clone(), interval)
        };
        // The error names the flag and the problem; its chain says the cause.
        let src = eureka_client::start_with(
            config,
            metrics.registry.clone(),
            metrics.eureka_client.clone(),
        )
        .await?;
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
    let e = &args.embedded;
    let peers = match e.peer.as_slice() {
        [] => None,
        urls => Some(PeerConfig {
            timeout: seconds("--peer-timeout", e.peer_timeout)?,
            max_pending: at_least_one("--peer-max-pending", e.peer_max_pending)?,
            max_answer: at_least_one("--peer-max-answer", e.peer_max_answer)?,
            ..PeerConfig::new(urls, e.peer_ca.clone()).context("--peer")?
        }),
    };
    let auth = match &e.eureka_auth {
        Some(path) => Some(Arc::new(
            Authenticator::load(path).context("--eureka-auth")?,
        )),
        None => None,
    };
    let tls = match (&e.eureka_tls_cert, &e.eureka_tls_key) {
        (Some(cert), Some(key)) => Some(
            ServerIdentity::load(cert, key)
                .and_then(|id| id.https_acceptor())
                .context("--eureka-tls-cert")?,
        ),
        _ => None,
    };
    if !addr.ip().is_loopback() && auth.is_none() {
        tracing::warn!(
            %addr,
            "the embedded registry takes writes from other hosts without authentication: anyone who reaches it can register, drain or remove any instance (set --eureka-auth)"
        );
    }
    let config = eureka_server::ServerConfig {
        lease_duration: seconds("--lease-duration", args.lease_duration)?,
        warmup: seconds_or_zero("--registry-warmup", e.registry_warmup)?,
        refuse_reads_while_warming: e.eureka_refuse_reads_while_warming,
        preservation: PreservationConfig {
            threshold: share(
                "--self-preservation-threshold",
                e.self_preservation_threshold,
            )?,
            window: seconds("--self-preservation-window", e.self_preservation_window)?,
            min_instances: e.self_preservation_min_instances,
        },
        limits: RegistrationLimits {
            max_instances: at_least_one("--eureka-max-instances", e.eureka_max_instances)?,
            max_lease: seconds("--max-lease-duration", e.max_lease_duration as f64)?,
            max_metadata_entries: e.eureka_max_metadata_entries,
            max_metadata_bytes: e.eureka_max_metadata_bytes,
            networks: NetworkPolicy {
                allow_loopback: e.allow_loopback_instances,
                allowed: e.eureka_allow_network.clone(),
            },
        },
        http: HttpLimits {
            max_connections: at_least_one("--eureka-max-connections", e.eureka_max_connections)?,
            header_timeout: seconds("--eureka-header-timeout", e.eureka_header_timeout)?,
            tls_handshake_timeout: seconds("--tls-handshake-timeout", args.tls_handshake_timeout)?,
            write_timeout: seconds("--eureka-write-timeout", e.eureka_write_timeout)?,
        },
        max_body: e.eureka_max_body,
        body_timeout: seconds("--eureka-body-timeout", e.eureka_body_timeout)?,
        auth,
        peers,
        ..Default::default()
    };
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
    Ok(Source {
        registry: src.registry,
        health: src.health,
        description: format!(
            "embedded Eureka registry {scheme}://{}/eureka",
            src.local_addr
        ),
        task: src.task,
    })
}

/// The xDS server's configuration from the flags.
fn xds_config(args: &Args) -> anyhow::Result<XdsConfig> {
    let x = &args.xds_limits;
    let tls = match (&x.xds_tls_cert, &x.xds_tls_key) {
        (Some(cert), Some(key)) => Some(
            ServerIdentity::load(cert, key)
                .and_then(|id| id.grpc_config(x.xds_client_ca.as_deref()))
                .context("--xds-tls-cert")?,
        ),
        _ => None,
    };
    if !args.xds.ip().is_loopback() && x.xds_client_ca.is_none() {
        tracing::warn!(
            xds = %args.xds,
            "xDS is served to other hosts without client authentication: anyone who reaches it can read the registry's addresses (set --xds-tls-cert, --xds-tls-key and --xds-client-ca)"
        );
    }
    Ok(XdsConfig {
        subscriptions: SubscriptionLimits {
            max_names: at_least_one("--xds-max-names", x.xds_max_names)?,
            max_unregistered: x.xds_max_unregistered,
        },
        max_connections: at_least_one("--xds-max-connections", x.xds_max_connections)?,
        max_streams_per_connection: x.xds_max_streams_per_connection.max(1),
        max_subscriptions: at_least_one("--xds-max-subscriptions", x.xds_max_subscriptions)?,
        tls_handshake_timeout: seconds("--tls-handshake-timeout", args.tls_handshake_timeout)?,
        tls,
        prewarm: start_prewarm(&args.prewarm)?,
        load_report_interval: seconds("--load-report-interval", args.prewarm.load_report_interval)?,
        idle_cluster_timeout: Some(seconds_or_zero(
            "--idle-cluster-timeout",
            args.prewarm.idle_cluster_timeout,
        )?)
        .filter(|t| !t.is_zero()),
    })
}

/// The prewarm history from the flags, read from its file; `None` with --no-prewarm. A file
/// that is not a history is set aside (renamed to FILE.unreadable), not overwritten.
fn start_prewarm(args: &PrewarmArgs) -> anyhow::Result<Option<Arc<Prewarm>>> {
    if args.no_prewarm {
        return Ok(None);
    }
    let limits = prewarm::Limits {
        max_per_service: at_least_one("--prewarm-max-clusters", args.prewarm_max_clusters)?,
        max_age: seconds("--prewarm-max-age", args.prewarm_max_age)?,
    };
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
    tracing::info!(file = %path.display(), entries = history.len(), "prewarm history loaded");
    Ok(Some(Arc::new(Prewarm::new(
        limits,
        Some(path.clone()),
        history,
    ))))
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

/// A share from 0 to 1 from flag `flag`.
fn share(flag: &str, value: f64) -> anyhow::Result<f64> {
    if (0.0..=1.0).contains(&value) {
        Ok(value)
    } else {
        bail!("{flag} {value}: not a share from 0 to 1")
    }
}

/// A finite, non-negative number of seconds from flag `flag` (0 allowed).
fn seconds_or_zero(flag: &str, value: f64) -> anyhow::Result<Duration> {
    Duration::try_from_secs_f64(value)
        .ok()
        .filter(|d| *d <= MAX_SECONDS)
        .with_context(|| format!("{flag} {value}: not a number of seconds up to a year"))
}

/// A positive, finite number of seconds from flag `flag`.
fn seconds(flag: &str, value: f64) -> anyhow::Result<Duration> {
    Duration::try_from_secs_f64(value)
        .ok()
        .filter(|d| !d.is_zero() && *d <= MAX_SECONDS)
        .with_context(|| format!("{flag} {value}: not a positive number of seconds up to a year"))
}

/// The longest any duration flag may be: past it, adding it to a time could overflow.
const MAX_SECONDS: Duration = Duration::from_secs(365 * 24 * 3600);

/// A count of at least one from flag `flag`.
fn at_least_one<N: PartialEq + From<u8>>(flag: &str, value: N) -> anyhow::Result<N> {
    if value == N::from(0) {
        bail!("{flag} 0: must be at least 1");
    }
    Ok(value)
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

async fn run() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let all_metrics = AllMetrics::default();
    let metrics = all_metrics.control.clone();

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

    let source = start_source(&args, &all_metrics).await?;

    let (snapshots, _pipeline) =
        model::follow(source.registry.clone(), all_metrics.registry.clone());
    let cache = Arc::new(Cache::with_snapshot(options, snapshots.borrow().clone()));
    tokio::spawn({
        let cache = cache.clone();
        async move { cache.follow(snapshots).await }
    });
    let policy_status = match &args.policy {
        None => Arc::default(),
        Some(path) => {
            let source =
                policy::watch::start(path.clone(), file::DEFAULT_POLL_INTERVAL, metrics.clone())
                    .with_context(|| "--policy: the policy file is not valid".to_string())?;
            // In force before the xDS server starts: no proxy gets a cluster without it.
            cache.set_policy(source.policy.borrow().clone());
            let cache = cache.clone();
            let policies = source.policy.clone();
            tokio::spawn(async move { cache.follow_policy(policies).await });
            source.status
        }
    };
    let xds_config = xds_config(&args)?;
    let prewarm = xds_config.prewarm.clone();
    let xds = XdsServer::with_config(cache.clone(), metrics.clone(), xds_config);

    let xds_listener = TcpListener::bind(args.xds)
        .await
        .with_context(|| format!("--xds {}: cannot listen", args.xds))?;
    let admin_listener = TcpListener::bind(args.admin)
        .await
        .with_context(|| format!("--admin {}: cannot listen", args.admin))?;
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

    let view = Arc::new(View {
        metrics: all_metrics,
        health: source.health.clone(),
        registry: source.registry.clone(),
        xds: xds.clone(),
        cache,
        policy: policy_status,
        prewarm: prewarm.clone(),
    });
    let admin_metrics = metrics.clone();
    let mut admin_task = tokio::spawn(http_server::serve(
        admin_listener,
        admin::router(view),
        HttpLimits::default(),
        None,
        move |event| {
            if event == HttpEvent::ConnectionRefused {
                inc(&admin_metrics.admin_connections_refused_total);
            }
        },
        stopped(),
    ));
    let mut xds_task = tokio::spawn(xds.serve(xds_listener, stopped()));
    let prewarm_task = (prewarm.clone())
        .map(|p| tokio::spawn(keep_prewarm_history(p, metrics.clone(), stopped())));
    let mut source_task = source.task;
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
            out["effective"] = serde_json::json!([{
                "cluster": cluster,
                "caller": caller,
                "policy": self.cache.effective_policy(cluster, caller),
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
                let policy = self.cache.effective_policy(&cluster, &caller);
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

    fn metrics(&self) -> String {
        // A derived gauge, brought up to date for each scrape.
        let age = self
            .health
            .snapshot()
            .age_of_last_success(SystemTime::now());
        set(
            &self.metrics.registry.registry_last_success_age_seconds,
            age.map_or(0, |a| a.as_secs()),
        );
        self.metrics.render()
    }
}
