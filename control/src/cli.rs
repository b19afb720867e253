//! The command line: every flag of `odmesh-control`, parsed into typed values
//! ([`odmesh_base::flags`]), and the configuration of each part built from them beside its
//! flags. `main.rs` only wires the parts together.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;

use odmesh_base::flags;
use odmesh_base::http_server::HttpLimits;
use odmesh_control::prewarm;
use odmesh_control::session::SubscriptionLimits;
use odmesh_eureka::server::auth::Authenticator;
use odmesh_eureka::server::peers::PeerConfig;
use odmesh_eureka::server::policy::{Cidr, NetworkPolicy, RegistrationLimits};
use odmesh_eureka::server::preservation::PreservationConfig;
use odmesh_eureka::{client as eureka_client, server as eureka_server};
use odmesh_registry::guard::DropGuardConfig;

/// The odmesh control plane: serves Envoy the clusters `<vip>.vip` and `<svip>.svip` on
/// demand over delta xDS (ADS), with endpoints from a Eureka-style registry.
///
/// Envoy asks for a cluster the first time a request needs it; odmesh-control answers from
/// the registry and keeps the endpoints current as the registry changes. A VIP that is not
/// registered is answered too, with a cluster that has no endpoints, so requests for it fail
/// fast (503) until it appears.
///
/// Durations take a unit (`300ms`, `2s`, `5m`, `2h`, `7d`) or are seconds (`0.5`).
///
/// Every flag can also be set in the environment as `ODMESH_<FLAG>` (`--eureka-interval` is
/// `ODMESH_EUREKA_INTERVAL`); a flag given on the command line wins.
#[derive(Debug, Parser)]
#[command(name = "odmesh-control", version, verbatim_doc_comment)]
#[command(group(clap::ArgGroup::new("source").args(["registry", "eureka", "serve_eureka"])))]
pub(crate) struct Args {
    /// Registry file: Eureka's `GET /eureka/apps` JSON, or the YAML form (`instances:
    /// [{app, ip, port, secure_port, vip, svip, status, zone, id, protocol}]`). Watched: a
    /// change, including an atomic rename over it, takes effect within a second; a file that
    /// fails to parse is reported and the last good registry stays in use.
    #[arg(long, value_name = "FILE")]
    pub(crate) registry: Option<PathBuf>,

    /// Follow a Eureka server, e.g. `http://eureka:8761/eureka`: a full fetch of `/apps`,
    /// then `/apps/delta` every --eureka-interval, reconciled by Eureka's hash code. Repeat
    /// the flag for several servers, tried in turn. While none answers, the last good
    /// registry stays in use. `https://` URLs are verified against --eureka-ca;
    /// `https://user:password@eureka/eureka` (percent-encoded) sends Basic authentication,
    /// but other users of this host can read a password here in the process list.
    #[arg(long, value_name = "URL")]
    pub(crate) eureka: Vec<String>,

    /// CA bundle (PEM) that signs the certificates of the `https://` Eureka servers, which
    /// must also name the URL's host. Default: the system CA bundle.
    #[arg(long, value_name = "FILE", requires = "eureka")]
    pub(crate) eureka_ca: Option<PathBuf>,

    /// File whose content (trimmed) is sent to the Eureka servers as `Authorization: Bearer`;
    /// a URL with its own `user:password@` sends that instead. Read once, at start.
    #[arg(long, value_name = "FILE", requires = "eureka")]
    pub(crate) eureka_token_file: Option<PathBuf>,

    /// Send credentials (a URL's `user:password@`, --eureka-token-file) over plain `http://`
    /// to a --eureka server or --peer on another host. Refused otherwise: anyone on the way
    /// reads them. Use https:// instead.
    #[arg(long)]
    pub(crate) allow_plain_credentials: bool,

    /// Time between two polls of Eureka's delta (as Eureka's own clients do).
    #[arg(long, value_name = "DURATION", value_parser = flags::duration, default_value = "30s")]
    pub(crate) eureka_interval: Duration,

    /// How long a call to a Eureka server may wait, to connect and for the answer's headers,
    /// then for each next part of its body, before the next server is tried; a hanging
    /// server costs no more than this. (A large registry may take longer to arrive; it only
    /// may not stall.)
    #[arg(long, value_name = "DURATION", value_parser = flags::duration, default_value = "10s")]
    pub(crate) eureka_request_timeout: Duration,

    /// The largest answer read from a Eureka server (`/apps`, `/apps/delta`), in bytes once
    /// decoded from gzip (and as transferred). A larger one fails the fetch
    /// (odmesh_eureka_answers_too_large_total) and the last good registry stays. The default,
    /// 4 GiB, is about 3 million instances as Spring's Eureka server writes them; answers are
    /// read as they arrive, so this bounds time and traffic, not memory.
    #[arg(long, value_name = "BYTES", value_parser = flags::at_least_one::<u64>, default_value_t = eureka_client::DEFAULT_MAX_ANSWER)]
    pub(crate) eureka_max_answer: u64,

    /// How long the control plane waits at start for Eureka's first answer before it serves
    /// xDS anyway (with a registry still loading: proxies keep what they hold).
    #[arg(long, value_name = "DURATION", value_parser = flags::duration_or_zero, default_value = "5s")]
    pub(crate) eureka_first_fetch_wait: Duration,

    /// How long a client may take to complete a TLS handshake with the xDS server or the
    /// embedded registry's HTTPS.
    #[arg(long, value_name = "DURATION", value_parser = flags::duration, default_value = "10s")]
    pub(crate) tls_handshake_timeout: Duration,

    /// How often the TLS files (--xds-tls-cert, --xds-tls-key, --xds-client-ca,
    /// --eureka-tls-cert, --eureka-tls-key) and the tokens file (--eureka-auth) are looked
    /// at: files whose content changed, and then stayed so until the next look, are read
    /// again and put in force (new TLS connections get the new certificate, established ones
    /// keep theirs; each request is checked against one whole tokens file). Files that cannot
    /// be used are refused and logged, and those in force stay. SIGHUP reads them all again
    /// at once. 0: only on SIGHUP.
    #[arg(long, value_name = "DURATION", value_parser = flags::duration_or_zero, default_value = "5s")]
    pub(crate) reload_interval: Duration,

    /// Be the registry: serve a Eureka-compatible REST API (base path /eureka) that standard
    /// Eureka clients register with, and a status page at / for a browser. This is the
    /// default when no source is given.
    #[arg(long, value_name = "ADDR", num_args = 0..=1, default_missing_value = eureka_server::DEFAULT_ADDR)]
    pub(crate) serve_eureka: Option<SocketAddr>,

    /// How long an instance of the embedded registry lives without a heartbeat, unless its
    /// registration says otherwise (`leaseInfo.durationInSecs`).
    #[arg(long, value_name = "DURATION", value_parser = flags::duration, default_value = "90s")]
    pub(crate) lease_duration: Duration,

    /// Address of the xDS gRPC server (delta ADS, and delta CDS/EDS).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:18000")]
    pub(crate) xds: SocketAddr,

    /// Address of the admin HTTP server: / (the mesh dashboard, for a browser), /healthz,
    /// /readyz, /metrics, /debug/registry, /debug/proxies, /debug/prewarm, /debug/policy. It
    /// checks no credentials: keep it on loopback.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:18001")]
    pub(crate) admin: SocketAddr,

    /// How log lines are written to stderr: `text`, for people, or `json`, one object per
    /// line (`timestamp`, `level`, `fields` with the `message`, `target`), for a log pipeline.
    /// `RUST_LOG` chooses what is logged (`info` by default).
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub(crate) log_format: LogFormat,

    /// Policy file (YAML): per-destination timeouts, retries, circuit breakers, outlier
    /// detection, load balancing and protocol, with defaults, per-VIP/SVIP entries and
    /// per-calling-service overrides (README, "Per-destination policy"). Watched: a change
    /// reaches the proxies holding the affected clusters within a second (the file is read
    /// five times a second); a file that fails to parse is reported (log, metric,
    /// /debug/policy) and the last good policy stays.
    #[arg(long, value_name = "FILE")]
    pub(crate) policy: Option<PathBuf>,

    /// CA bundle (PEM) with which Envoy verifies `.svip` upstreams. The path is Envoy's: it
    /// must exist where Envoy runs. Default: the system CA bundle.
    #[arg(long, value_name = "FILE")]
    pub(crate) upstream_ca: Option<PathBuf>,

    /// Accept any `.svip` upstream certificate that chains to the CA, without checking that
    /// it names the SVIP (DNS subject alternative name).
    #[arg(long)]
    pub(crate) no_upstream_san_check: bool,

    /// A VIP with at least so many endpoints sends them one by one (Envoy's LEDS): one
    /// instance's change then costs each proxy that instance, not the whole VIP; the first
    /// answer is larger and a new VIP's first request takes one more round trip. A split VIP
    /// stays split down to three quarters of N. 0: never.
    #[arg(long, value_name = "N", default_value_t = odmesh_control::xds::LEDS_MIN_ENDPOINTS)]
    pub(crate) leds_min_endpoints: usize,

    #[command(flatten)]
    pub(crate) guards: GuardArgs,

    #[command(flatten)]
    pub(crate) embedded: EmbeddedArgs,

    #[command(flatten)]
    pub(crate) xds_limits: XdsArgs,

    #[command(flatten)]
    pub(crate) prewarm: PrewarmArgs,
}

/// Prewarm: a connecting proxy is sent the clusters its service used before.
#[derive(Debug, clap::Args)]
pub(crate) struct PrewarmArgs {
    /// Where the request history is kept (JSON, written atomically every few seconds and at
    /// exit): per calling service (Envoy's `node.cluster`), the clusters its proxies used and
    /// when. A proxy that connects with a wildcard cluster subscription (`cds_config` in its
    /// bootstrap, as envoy/odmesh.yaml has) is sent those that are still registered before
    /// any request needs them. Replicas may share one file (each merges the others' writes).
    /// A file that is not a history is set aside as FILE.unreadable.<time> and a new one
    /// started; one that cannot be read at all is left alone (prewarm starts empty).
    #[arg(long, value_name = "FILE", default_value = "odmesh-prewarm.json")]
    pub(crate) prewarm_history: PathBuf,

    /// Turn prewarm off: no history is kept or read, proxies get only what they ask for.
    #[arg(long, conflicts_with_all = ["prewarm_history", "prewarm_max_clusters", "prewarm_max_entries", "prewarm_max_age"])]
    pub(crate) no_prewarm: bool,

    /// Clusters kept per calling service (the most recently used); also the most one
    /// connecting proxy is sent ahead.
    #[arg(long, value_name = "N", value_parser = flags::at_least_one::<usize>, default_value_t = 1_000)]
    pub(crate) prewarm_max_clusters: usize,

    /// (calling service, cluster) entries the history keeps over all services: about 100
    /// bytes of memory each and 40 in the file (with names of 20 characters; the default,
    /// 1,000 services × 1,000 clusters: ~95 MB and a 40 MB file), so this bounds prewarm
    /// whatever services clients claim to be (a proxy's `node.cluster` is whatever it
    /// says). When full, a new
    /// entry takes the place of its own service's least recently used cluster, never another
    /// service's, and a service without history gets none until entries age out
    /// (--prewarm-max-age): odmesh_prewarm_entries_refused_total counts what did not fit.
    /// Apart, the load reports kept per connected proxy (for --idle-cluster-timeout) hold at
    /// most as many clusters; a proxy whose report does not fit has no idle cluster.
    #[arg(long, value_name = "N", value_parser = flags::at_least_one::<usize>, default_value_t = prewarm::DEFAULT_MAX_ENTRIES)]
    pub(crate) prewarm_max_entries: usize,

    /// Time after which a cluster nobody used is forgotten (default: 7 days).
    #[arg(long, value_name = "DURATION", value_parser = flags::duration, default_value = "7d")]
    pub(crate) prewarm_max_age: Duration,

    /// Time between two load reports from each proxy (Envoy's LRS), which tell which
    /// clusters carried requests: a cluster sent ahead is never asked for again, so this is how
    /// the history learns that it is still in use.
    #[arg(long, value_name = "DURATION", value_parser = flags::duration, default_value = "30s")]
    pub(crate) load_report_interval: Duration,

    /// Time after which a cluster sent ahead that carried no request (by the proxy's load
    /// reports) is removed from the proxy, which asks for it again by name when a request
    /// needs it; 0: never. Clusters a proxy asked for itself are never removed (Envoy would
    /// not ask for them again).
    #[arg(long, value_name = "DURATION", value_parser = flags::duration_or_zero, default_value = "1h")]
    pub(crate) idle_cluster_timeout: Duration,
}

/// Guards against a source that loses most of the registry at once.
#[derive(Debug, clap::Args)]
#[command(next_help_heading = "Registry source guards (--registry, --eureka)")]
pub(crate) struct GuardArgs {
    /// Share of the registry in use (from 10 instances up) that a new read of the file or of
    /// Eureka may lose at once and still be followed at once. A read that loses more (an
    /// empty Eureka after its restart, a truncated file) is held until the source still says
    /// so --registry-drop-confirm later. 1 turns the guard off. The same holds a --policy
    /// file that loses more than this share of its entries (from one up: an emptied file).
    #[arg(long, value_name = "SHARE", value_parser = flags::share, default_value_t = 0.5)]
    pub(crate) max_registry_drop: f64,

    /// How long a drop held by --max-registry-drop must persist before it is followed (for
    /// Eureka, at the first fetch at least this long after the one that showed it).
    #[arg(long, value_name = "DURATION", value_parser = flags::duration, default_value = "10s")]
    pub(crate) registry_drop_confirm: Duration,
}

/// The embedded registry's guards and bounds.
#[derive(Debug, clap::Args)]
#[command(next_help_heading = "Embedded registry (--serve-eureka)")]
pub(crate) struct EmbeddedArgs {
    /// Time after a start during which the registry counts as still loading, while its
    /// clients register again (their heartbeats get 404 after a restart): proxies keep the
    /// clusters they hold meanwhile. One renewal interval (30 s) and a margin.
    #[arg(long, value_name = "DURATION", value_parser = flags::duration_or_zero, default_value = "35s")]
    pub(crate) registry_warmup: Duration,

    /// During the warm-up, answer a client's GET /apps and /apps/delta 403, as Netflix's
    /// Eureka server does, so that Java Eureka clients keep the registry they hold instead
    /// of taking a partial one; the npm and PyPI clients cannot start meanwhile. Off: they
    /// are answered with what the registry holds so far, as Spring Cloud's server does.
    #[arg(long)]
    pub(crate) eureka_refuse_reads_while_warming: bool,

    /// Self-preservation: lease eviction stops while the renewals of the last
    /// --self-preservation-window fall below this share of those expected, and one eviction
    /// round takes at most the rest (15 %). 0 turns it off.
    #[arg(long, value_name = "SHARE", value_parser = flags::share, default_value_t = 0.85)]
    pub(crate) self_preservation_threshold: f64,

    /// The time over which renewals are counted for self-preservation.
    #[arg(long, value_name = "DURATION", value_parser = flags::duration, default_value = "1m")]
    pub(crate) self_preservation_window: Duration,

    /// Self-preservation applies from this many registered instances (below, one dying
    /// instance cannot be told from a partition).
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub(crate) self_preservation_min_instances: usize,

    /// Self-preservation expects no instance to renew more often than this, whatever its
    /// registration states (`renewalIntervalInSecs`), as Eureka's servers expect every client
    /// at 30 s: one registration stating 1 s and never renewing weighs as one instance.
    #[arg(long, value_name = "DURATION", value_parser = flags::duration, default_value = "30s")]
    pub(crate) self_preservation_min_interval: Duration,

    /// The longest lease a registration may ask for (`leaseInfo.durationInSecs`); a longer
    /// one is refused with 400.
    #[arg(long, value_name = "DURATION", value_parser = flags::duration, default_value = "5m")]
    pub(crate) max_lease_duration: Duration,

    /// Accept instances at loopback addresses (127.0.0.0/8, ::1): for a registry whose
    /// services and proxies all run on one machine (`make run`, tests). Never in production:
    /// a registration would send the mesh's traffic to each proxy's own host.
    #[arg(long)]
    pub(crate) allow_loopback_instances: bool,

    /// Accept instances only at addresses in this network (CIDR, e.g. 10.0.0.0/8); repeat
    /// for several. Default: any address but loopback, link-local, unspecified, multicast.
    #[arg(long, value_name = "CIDR")]
    pub(crate) eureka_allow_network: Vec<Cidr>,

    /// Tokens file (YAML) of the identities that may use the registry; with it, every
    /// request needs `Authorization: Bearer <token>` or Basic name:token, and an identity
    /// may change only the instances it registered and register only its VIPs. Read again
    /// when it changes and on SIGHUP (--reload-interval): a new file replaces every identity
    /// at once, one that cannot be used is refused and the identities in force stay. See
    /// docs/production.md.
    #[arg(long, value_name = "FILE")]
    pub(crate) eureka_auth: Option<PathBuf>,

    /// Another embedded registry (its base URL, e.g. `http://10.0.0.2:8761/eureka`) to
    /// replicate with, as Eureka's servers do: writes made here are sent to it, and a
    /// starting node fills itself from the first peer that answers. Repeatable; a URL naming
    /// this node is skipped, so every node can get the same list. With --eureka-auth on the
    /// peers, give an operator's `name:token@` in the URL.
    #[arg(long, value_name = "URL")]
    pub(crate) peer: Vec<String>,

    /// CA bundle (PEM) that signs the `https://` peers' certificates. Default: the system CA
    /// bundle.
    #[arg(long, value_name = "FILE")]
    pub(crate) peer_ca: Option<PathBuf>,

    /// How long one call to a peer (a batch of writes, a fill) may take before it counts as
    /// failed and is tried again; a fill, which reads the peer's whole registry, may take
    /// longer as long as no part of it waits longer than this.
    #[arg(long, value_name = "DURATION", value_parser = flags::duration, default_value = "5s")]
    pub(crate) peer_timeout: Duration,

    /// The largest registry a starting node reads from a peer (its `/apps`), in bytes once
    /// decoded from gzip (and as transferred); a larger one is refused
    /// (odmesh_eureka_peer_fills_too_large_total) and the next peer tried. Read as it
    /// arrives, so this bounds time and traffic, not memory.
    #[arg(long, value_name = "BYTES", value_parser = flags::at_least_one::<u64>, default_value_t = eureka_client::DEFAULT_MAX_ANSWER)]
    pub(crate) peer_max_answer: u64,

    /// Writes kept for one peer that does not take them; beyond, the oldest are dropped
    /// (odmesh_eureka_peer_dropped_total) and its heartbeats bring the registrations back.
    #[arg(long, value_name = "N", value_parser = flags::at_least_one::<usize>, default_value_t = 100_000)]
    pub(crate) peer_max_pending: usize,

    /// Serve the registry over HTTPS with this certificate chain (PEM); needs
    /// --eureka-tls-key. Read again when it changes and on SIGHUP (--reload-interval).
    #[arg(long, value_name = "FILE", requires = "eureka_tls_key")]
    pub(crate) eureka_tls_cert: Option<PathBuf>,

    /// The private key (PEM) of --eureka-tls-cert.
    #[arg(long, value_name = "FILE", requires = "eureka_tls_cert")]
    pub(crate) eureka_tls_key: Option<PathBuf>,

    /// Instances the registry holds at most; registering a new one beyond gets 503.
    #[arg(long, value_name = "N", value_parser = flags::at_least_one::<usize>, default_value_t = 2_000_000)]
    pub(crate) eureka_max_instances: usize,

    /// Instances one identity (`--eureka-auth`) may have registered; registering a new one
    /// beyond gets 503. One identity can then neither fill the registry nor hold
    /// self-preservation on with instances it lets lapse.
    #[arg(long, value_name = "N", value_parser = flags::at_least_one::<usize>, default_value_t = 10_000)]
    pub(crate) eureka_max_instances_per_identity: usize,

    /// How long a written answer to GET /apps or /apps/delta is served whatever is
    /// registered since. 0: every reader gets the registry as it was when it asked, or later;
    /// readers share one written copy either way, written by one at a time. Eureka's servers
    /// reuse theirs for 30 s (`responseCacheUpdateIntervalMs`).
    #[arg(long, value_name = "DURATION", value_parser = flags::duration_or_zero, default_value = "0s")]
    pub(crate) eureka_response_cache_interval: Duration,

    /// Metadata entries one instance may carry.
    #[arg(long, value_name = "N", default_value_t = 64)]
    pub(crate) eureka_max_metadata_entries: usize,

    /// Bytes of metadata (keys and values) one instance may carry.
    #[arg(long, value_name = "BYTES", default_value_t = 8192)]
    pub(crate) eureka_max_metadata_bytes: usize,

    /// The largest request body accepted; a larger one gets 413.
    #[arg(long, value_name = "BYTES", default_value_t = 16384)]
    pub(crate) eureka_max_body: usize,

    /// How long a request body may take to arrive; a slower one gets 408.
    #[arg(long, value_name = "DURATION", value_parser = flags::duration, default_value = "10s")]
    pub(crate) eureka_body_timeout: Duration,

    /// How long a client may take to send a request's headers, counted from when the server
    /// waits for them (so also how long a kept-alive connection may sit idle).
    #[arg(long, value_name = "DURATION", value_parser = flags::duration, default_value = "10s")]
    pub(crate) eureka_header_timeout: Duration,

    /// How long an answer may wait for a client that reads none of it (or too little: see
    /// --eureka-min-read-rate); then the connection is closed (a stalled reader holds no
    /// answer and no slot for longer).
    #[arg(long, value_name = "DURATION", value_parser = flags::duration, default_value = "30s")]
    pub(crate) eureka_write_timeout: Duration,

    /// The slowest a client may read an answer, in bytes a second, over the time the registry
    /// waits on it: one that reads less than that over --eureka-write-timeout of waiting is
    /// disconnected, so a byte now and then keeps no slot.
    #[arg(long, value_name = "BYTES", value_parser = flags::at_least_one::<u64>, default_value_t = 1024)]
    pub(crate) eureka_min_read_rate: u64,

    /// Connections served at once; more are closed on arrival.
    #[arg(long, value_name = "N", value_parser = flags::at_least_one::<usize>, default_value_t = 1024)]
    pub(crate) eureka_max_connections: usize,

    /// Connections served at once from one source address; more from it are closed on
    /// arrival, so that one client cannot take every slot. A registry behind a proxy or NAT
    /// that funnels many clients into one address needs this raised.
    #[arg(long, value_name = "N", value_parser = flags::at_least_one::<usize>, default_value_t = 256)]
    pub(crate) eureka_max_connections_per_source: usize,

    /// Requests without valid credentials (--eureka-auth) one address may send per 10 s;
    /// beyond, every request from it gets 429 for the rest of those 10 s, its credentials
    /// not looked at, so that nobody guesses tokens at network speed. 0: no limit.
    #[arg(long, value_name = "N", default_value_t = 20)]
    pub(crate) eureka_max_auth_failures: u32,
}

/// The xDS server's security and bounds.
#[derive(Debug, clap::Args)]
#[command(next_help_heading = "xDS server")]
pub(crate) struct XdsArgs {
    /// Serve xDS over TLS with this certificate chain (PEM); needs --xds-tls-key. Read again,
    /// with the key and --xds-client-ca, when they change and on SIGHUP (--reload-interval).
    #[arg(long, value_name = "FILE", requires = "xds_tls_key")]
    pub(crate) xds_tls_cert: Option<PathBuf>,

    /// The private key (PEM) of --xds-tls-cert.
    #[arg(long, value_name = "FILE", requires = "xds_tls_cert")]
    pub(crate) xds_tls_key: Option<PathBuf>,

    /// Require proxies to present a client certificate signed by this CA (mTLS); needs
    /// --xds-tls-cert.
    #[arg(long, value_name = "FILE", requires = "xds_tls_cert")]
    pub(crate) xds_client_ca: Option<PathBuf>,

    /// Connections served at once; more are closed on arrival.
    #[arg(long, value_name = "N", value_parser = flags::at_least_one::<usize>, default_value_t = 10_000)]
    pub(crate) xds_max_connections: usize,

    /// Of --xds-max-connections, the connections served at once from one address, so that one
    /// client cannot take every slot; more are closed on arrival. An Envoy opens one. Raise it
    /// where many proxies reach the control plane from one address (NAT).
    #[arg(long, value_name = "N", value_parser = flags::at_least_one::<usize>, default_value_t = 256)]
    pub(crate) xds_max_connections_per_source: usize,

    /// How long an xDS connection may take to send its first bytes; one that sends nothing is
    /// closed then, so silent connections cannot hold every slot of --xds-max-connections.
    #[arg(long, value_name = "DURATION", value_parser = flags::duration, default_value = "10s")]
    pub(crate) xds_first_bytes_timeout: Duration,

    /// How long an xDS connection may take to open its first stream (Envoy opens its ADS
    /// stream at once); one that sends only settings and pings until then is closed, so idle
    /// connections cannot hold slots either.
    #[arg(long, value_name = "DURATION", value_parser = flags::duration, default_value = "10s")]
    pub(crate) xds_first_request_timeout: Duration,

    /// HTTP/2 streams one connection may open at once (Envoy opens one, for ADS).
    #[arg(long, value_name = "N", default_value_t = 8)]
    pub(crate) xds_max_streams_per_connection: u32,

    /// Names one stream may subscribe to, per type; more are answered with a removal.
    #[arg(long, value_name = "N", value_parser = flags::at_least_one::<usize>, default_value_t = 10_000)]
    pub(crate) xds_max_names: usize,

    /// Cluster names subscribed over all streams (each with its load assignment): about
    /// 1.5 KB each at most, so this bounds the control plane's memory whatever the number
    /// of streams. Names beyond wait for room (answered with a removal, pushed once there
    /// is room). Raise it for more proxies per control plane.
    #[arg(long, value_name = "N", value_parser = flags::at_least_one::<usize>, default_value_t = 1_000_000)]
    pub(crate) xds_max_subscriptions: usize,

    /// Of --xds-max-subscriptions, the cluster names the streams of one source address may
    /// hold together, however many connections and node ids it opens: one host cannot take
    /// the room other proxies' new VIPs need. Names beyond wait for room, as above. Raise it
    /// where many proxies share an address (behind NAT).
    #[arg(long, value_name = "N", value_parser = flags::at_least_one::<usize>, default_value_t = 100_000)]
    pub(crate) xds_max_subscriptions_per_source: usize,

    /// Names of either type that all streams track together, however each stands (counted,
    /// refused, waiting for room): what their entries cost the control plane, about 0.5 KB a
    /// name. New names beyond are answered with a removal and not tracked, as those over
    /// --xds-max-names are.
    #[arg(long, value_name = "N", value_parser = flags::at_least_one::<usize>, default_value_t = 4_000_000)]
    pub(crate) xds_max_names_total: usize,

    /// Of --xds-max-names-total, the names the streams of one source address track together.
    #[arg(long, value_name = "N", value_parser = flags::at_least_one::<usize>, default_value_t = 400_000)]
    pub(crate) xds_max_names_per_source: usize,

    /// Names not registered when asked for that one stream is served, per type: as clusters
    /// (each is a cluster in that Envoy's memory), and as load assignments not of a cluster
    /// the stream holds. More are answered with a removal, and neither counted nor watched,
    /// until they are registered. A flood of random Hosts through one Envoy stops here.
    #[arg(long, value_name = "N", default_value_t = 100)]
    pub(crate) xds_max_unregistered: usize,
}

/// How log lines are written ([`Args::log_format`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum LogFormat {
    Text,
    Json,
}

/// The environment variable of flag `--long`: `ODMESH_` and its name in capitals, `-` as `_`
/// (`--eureka-interval` is `ODMESH_EUREKA_INTERVAL`).
pub(crate) fn env_name(long: &str) -> String {
    format!("ODMESH_{}", long.to_ascii_uppercase().replace('-', "_"))
}

impl Args {
    /// The command line, with every flag also read from its environment variable
    /// ([`env_name`]) when it is not given: a flag given wins. A repeatable flag's variable
    /// holds one value. `--help` names each variable, never its value (one may hold a secret).
    pub(crate) fn command() -> clap::Command {
        <Args as clap::CommandFactory>::command().mut_args(|arg| {
            match arg.get_long().map(env_name) {
                Some(name) if !matches!(arg.get_id().as_str(), "help" | "version") => {
                    arg.env(name).hide_env_values(true)
                }
                _ => arg,
            }
        })
    }

    /// The arguments of this process ([`Args::command`]); exits with clap's message on bad
    /// ones.
    pub(crate) fn parse_with_env() -> Args {
        let matches = Args::command().get_matches();
        <Args as clap::FromArgMatches>::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
    }

    /// Checks what clap cannot check alone: `--peer` takes the embedded registry only.
    pub(crate) fn check(&self) -> anyhow::Result<()> {
        if !self.embedded.peer.is_empty() && (self.registry.is_some() || !self.eureka.is_empty()) {
            anyhow::bail!(
                "--peer: peers are embedded registries; it takes --serve-eureka, not --registry or --eureka"
            );
        }
        Ok(())
    }

    /// The Eureka follower's configuration (`--eureka` and its flags).
    pub(crate) fn eureka_client(&self) -> eureka_client::ClientConfig {
        eureka_client::ClientConfig {
            ca_file: self.eureka_ca.clone(),
            token_file: self.eureka_token_file.clone(),
            allow_plain_credentials: self.allow_plain_credentials,
            drop_guard: self.guards.drop_guard(),
            request_timeout: self.eureka_request_timeout,
            max_answer: self.eureka_max_answer,
            first_fetch_wait: self.eureka_first_fetch_wait,
            ..eureka_client::ClientConfig::new(self.eureka.clone(), self.eureka_interval)
        }
    }

    /// Where the embedded registry listens: `--serve-eureka`, or its default address.
    pub(crate) fn serve_eureka_addr(&self) -> SocketAddr {
        self.serve_eureka.unwrap_or_else(|| {
            (eureka_server::DEFAULT_ADDR.parse()).expect("the default address parses")
        })
    }

    /// The embedded registry's configuration; reads the tokens file (`--eureka-auth`).
    pub(crate) fn eureka_server(&self) -> anyhow::Result<eureka_server::ServerConfig> {
        let e = &self.embedded;
        let peers = match e.peer.as_slice() {
            [] => None,
            urls => Some(PeerConfig {
                timeout: e.peer_timeout,
                max_pending: e.peer_max_pending,
                max_answer: e.peer_max_answer,
                ..PeerConfig::new(urls, e.peer_ca.clone(), self.allow_plain_credentials)
                    .context("--peer")?
            }),
        };
        let auth = match &e.eureka_auth {
            Some(path) => Some(Arc::new(
                Authenticator::load(path).context("--eureka-auth")?,
            )),
            None => None,
        };
        Ok(eureka_server::ServerConfig {
            lease_duration: self.lease_duration,
            warmup: e.registry_warmup,
            refuse_reads_while_warming: e.eureka_refuse_reads_while_warming,
            preservation: PreservationConfig {
                threshold: e.self_preservation_threshold,
                window: e.self_preservation_window,
                min_instances: e.self_preservation_min_instances,
                min_interval: e.self_preservation_min_interval,
            },
            limits: RegistrationLimits {
                max_instances: e.eureka_max_instances,
                max_instances_per_identity: e.eureka_max_instances_per_identity,
                max_lease: e.max_lease_duration,
                max_metadata_entries: e.eureka_max_metadata_entries,
                max_metadata_bytes: e.eureka_max_metadata_bytes,
                networks: NetworkPolicy {
                    allow_loopback: e.allow_loopback_instances,
                    allowed: e.eureka_allow_network.clone(),
                },
            },
            http: HttpLimits {
                max_connections: e.eureka_max_connections,
                max_connections_per_source: e.eureka_max_connections_per_source,
                header_timeout: e.eureka_header_timeout,
                tls_handshake_timeout: self.tls_handshake_timeout,
                write_timeout: e.eureka_write_timeout,
                min_read_rate: e.eureka_min_read_rate,
            },
            max_body: e.eureka_max_body,
            body_timeout: e.eureka_body_timeout,
            auth,
            peers,
            response_cache_interval: e.eureka_response_cache_interval,
            max_auth_failures: e.eureka_max_auth_failures,
            ..Default::default()
        })
    }
}

impl GuardArgs {
    /// The guard of the file and Eureka sources against a read that loses most of the
    /// registry, and of the policy file against one that loses most of its entries.
    pub(crate) fn drop_guard(&self) -> DropGuardConfig {
        DropGuardConfig {
            max_drop: self.max_registry_drop,
            confirm_after: self.registry_drop_confirm,
        }
    }
}

impl PrewarmArgs {
    /// The bounds on the prewarm history.
    pub(crate) fn limits(&self) -> prewarm::Limits {
        prewarm::Limits {
            max_per_service: self.prewarm_max_clusters,
            max_entries: self.prewarm_max_entries,
            max_age: self.prewarm_max_age,
        }
    }
}

impl XdsArgs {
    /// Bounds on what the proxies' streams may hold.
    pub(crate) fn subscriptions(&self) -> SubscriptionLimits {
        SubscriptionLimits {
            max_names: self.xds_max_names,
            max_unregistered: self.xds_max_unregistered,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_flag_has_its_own_environment_variable_named_in_help_without_its_value() {
        let mut command = Args::command();
        let mut names = std::collections::BTreeSet::new();
        for arg in command.get_arguments() {
            let Some(long) = arg.get_long() else { continue };
            let env = arg.get_env().map(|e| e.to_string_lossy().into_owned());
            assert_eq!(env, Some(env_name(long)), "--{long}");
            assert!(
                names.insert(env_name(long)),
                "--{long}: its variable is taken"
            );
        }
        assert!(names.len() > 40, "{} flags", names.len());
        assert!(names.contains("ODMESH_EUREKA_INTERVAL") && names.contains("ODMESH_XDS"));
        let help = command.render_long_help().to_string();
        assert!(help.contains("[env: ODMESH_LEDS_MIN_ENDPOINTS]"), "{help}");
        assert!(!help.contains("ODMESH_HELP") && !help.contains("ODMESH_VERSION"));
    }

    #[test]
    fn every_source_starts_with_the_defaults_and_they_are_the_registrys_own() {
        // A default a value parser refuses would stop the control plane at start.
        for source in [
            &["--registry", "r.yaml"][..],
            &["--eureka", "http://eureka:8761/eureka"],
            &["--serve-eureka", "127.0.0.1:8761"],
        ] {
            let args = Args::try_parse_from(
                std::iter::once("odmesh-control").chain(source.iter().copied()),
            )
            .unwrap_or_else(|e| panic!("{source:?}: {e}"));
            args.check().unwrap_or_else(|e| panic!("{source:?}: {e:#}"));
        }
        let args =
            Args::try_parse_from(["odmesh-control", "--serve-eureka", "127.0.0.1:8761"]).unwrap();
        let server = args.eureka_server().unwrap();
        let defaults = eureka_server::ServerConfig::default();
        assert_eq!(
            server.response_cache_interval,
            defaults.response_cache_interval
        );
        assert_eq!(server.preservation, defaults.preservation);
        assert_eq!(
            server.limits.max_instances_per_identity,
            defaults.limits.max_instances_per_identity
        );
        assert_eq!(args.prewarm.limits(), prewarm::Limits::default());
    }
}
