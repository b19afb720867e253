//! The delta xDS load generator: simulated Envoys on real gRPC connections against a running
//! `odmesh-control`.
//!
//! 1. Connect `proxies` streams (one HTTP/2 connection each, as real proxies have), each
//!    subscribing to `subs` random clusters and then their load assignments, ACKing every
//!    response like Envoy does.
//! 2. Answer time: `samples` times, one proxy subscribes to one more cluster, as Envoy's
//!    on-demand discovery does (the `Cluster`, then its load assignment unless the server
//!    pushed it along); the times from sending the request to having the `Cluster`, and to
//!    having its load assignment (the cluster is warm).
//! 3. Fan-out: `flips` times, rewrite the registry file with 1% of the instances changing
//!    status (see `registry_gen`) and time, for every proxy subscribed to a changed VIP, the
//!    arrival of its new load assignments. Times are from the control plane's
//!    `registry loaded` log line (the file is parsed; the change now goes through the snapshot,
//!    cache and streams), and also from the rename.
//!
//! With `--dump`, the control plane is a go-control-plane server (`bench/gcp`) serving a dump of
//! the same resources (`xds_dump`): each flip also writes the flipped registry's dump, and
//! times run from the dump's rename and from that server's log lines.
//!
//! With `--eureka`, the registry is the control plane's embedded one (`--serve-eureka`):
//! every instance is registered over its REST API first (timed), and a flip sets or removes
//! the `OUT_OF_SERVICE` status override of the same 1% of instances, one request each, over
//! a few connections; each changed VIP's time runs from sending its request to each
//! subscribed proxy's receipt of the new load assignment.
//!
//! The control plane's RSS and CPU seconds come from `/proc/<control-pid>`.

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use clap::Args;
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse,
};
use odmesh_control::xds::leds::{self, LB_ENDPOINT_TYPE_URL};
use odmesh_control::xds::{CLUSTER_TYPE_URL, ENDPOINTS_TYPE_URL};
use prost::Message;
use serde_json::json;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Endpoint;
use tonic::{Status, Streaming};

use crate::http1::Conn;
use crate::registry_gen::{self, GenArgs, GenInstance, vip_name};
use crate::{log_time, procstat, xds_dump};

/// Connections the REST requests are spread over.
const REST_CONNECTIONS: usize = 8;

/// What `xds-load` does.
#[derive(Clone, Debug, Args)]
pub struct LoadArgs {
    /// The control plane's xDS address.
    #[arg(long, default_value = "127.0.0.1:18000")]
    pub xds: String,
    /// The control plane's pid (for RSS and CPU).
    #[arg(long)]
    pub control_pid: u32,
    /// The control plane's log file (for the `registry loaded` times).
    #[arg(long)]
    pub control_log: PathBuf,
    /// The registry file the control plane watches; rewritten for each flip.
    #[arg(long, required_unless_present = "eureka")]
    pub registry: Option<PathBuf>,
    /// Instead of a file: the control plane's embedded Eureka registry (`host:port`), which
    /// this tool fills and changes over REST.
    #[arg(long, requires = "admin")]
    pub eureka: Option<String>,
    /// The control plane's admin address (`host:port`), to see when the registry is in.
    #[arg(long)]
    pub admin: Option<String>,
    /// Instead of odmesh-control's file source: the dump (`xds-dump`) a go-control-plane
    /// server (`bench/gcp`) serves. Each flip also writes the flipped registry's dump there
    /// (renamed into place), and times are from that rename and from the server's `dump read`,
    /// `dump diffed` and `resources updated` log lines.
    #[arg(long, requires = "registry")]
    pub dump: Option<PathBuf>,
    /// VIPs in the registry.
    #[arg(long)]
    pub vips: usize,
    /// Instances per VIP in the registry.
    #[arg(long, default_value_t = 10)]
    pub instances: usize,
    /// Which instances a change flips: those whose index over the registry is a multiple of
    /// this (100: 1% of them; with `--vips 1 --instances N --change-every N`, one instance).
    #[arg(long, default_value_t = 100)]
    pub change_every: usize,
    /// Simulated proxies.
    #[arg(long, default_value_t = 1000)]
    pub proxies: usize,
    /// Clusters each proxy subscribes to.
    #[arg(long, default_value_t = 30)]
    pub subs: usize,
    /// On-demand requests timed.
    #[arg(long, default_value_t = 1000)]
    pub samples: usize,
    /// Registry changes timed.
    #[arg(long, default_value_t = 4)]
    pub flips: usize,
    /// Seed of the random subscriptions.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

/// A tiny deterministic generator (SplitMix64), enough to pick VIPs.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// A load-assignment response one proxy received (or the members of a large VIP's
/// collections, which stand for it).
#[derive(Debug)]
struct Arrival {
    proxy: usize,
    at: f64,
    /// The clusters whose endpoints it brought.
    names: Vec<String>,
    /// The response's size on the wire (its protobuf encoding).
    bytes: usize,
}

/// Subscribe to clusters like Envoy's on-demand discovery does: ask for the `Cluster`s; when
/// they arrive, ask for their load assignments (unless already pushed); done when every
/// load assignment is in. Answers (time to the clusters, time to the load assignments).
struct Cmd {
    names: Vec<String>,
    done: oneshot::Sender<(Duration, Duration)>,
}

struct Pending {
    clusters: BTreeSet<String>,
    endpoints: BTreeSet<String>,
    sent: Instant,
    clusters_at: Option<Duration>,
    done: oneshot::Sender<(Duration, Duration)>,
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// One simulated proxy: its stream task and the handle to command it.
struct Proxy {
    cmds: mpsc::Sender<Cmd>,
    subscribed: BTreeSet<usize>,
}

/// The delta ADS call: answered when the server's response headers arrive.
type Call = Pin<
    Box<
        dyn Future<Output = Result<tonic::Response<Streaming<DeltaDiscoveryResponse>>, Status>>
            + Send,
    >,
>;

/// A proxy's inbound half: the call until the server's response headers are in, then the
/// response stream.
enum Inbound {
    Calling(Call),
    // Boxed: the stream is 232 bytes, the call 16 (clippy's large_enum_variant).
    Open(Box<Streaming<DeltaDiscoveryResponse>>),
}

impl Inbound {
    /// The next response. Cancel-safe, for `select!`: the call is kept in `self` while it
    /// is pending, and `Streaming::message` is cancel-safe.
    async fn message(&mut self) -> Result<Option<DeltaDiscoveryResponse>, Status> {
        loop {
            match self {
                Inbound::Open(stream) => return stream.message().await,
                Inbound::Calling(call) => {
                    *self = Inbound::Open(Box::new(call.await?.into_inner()));
                }
            }
        }
    }
}

fn request(type_url: &str, names: Vec<String>) -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest {
        type_url: type_url.into(),
        resource_names_subscribe: names,
        ..Default::default()
    }
}

async fn connect(
    id: usize,
    addr: String,
    arrivals: mpsc::UnboundedSender<Arrival>,
) -> anyhow::Result<mpsc::Sender<Cmd>> {
    let channel = Endpoint::from_shared(format!("http://{addr}"))?
        .tcp_nodelay(true)
        .connect()
        .await?;
    let mut client =
        AggregatedDiscoveryServiceClient::new(channel).max_decoding_message_size(64 << 20);
    let (tx, rx) = mpsc::channel::<DeltaDiscoveryRequest>(64);
    // The call is awaited inside the task, beside the commands: the first request goes out
    // before the response headers arrive, as Envoy sends it (grpc-go sends its headers only
    // with the first response).
    let call = Box::pin(async move {
        client
            .delta_aggregated_resources(ReceiverStream::new(rx))
            .await
    });
    let mut inbound = Inbound::Calling(call);
    let (cmds, mut cmd_rx) = mpsc::channel::<Cmd>(8);
    tokio::spawn(async move {
        let mut node = Some(Node {
            id: format!("bench-proxy-{id}"),
            cluster: "bench".into(),
            ..Default::default()
        });
        let mut pending: Option<Pending> = None;
        // Load assignments this proxy has (pushed or asked for), and those it asked for.
        let mut have: BTreeSet<String> = BTreeSet::new();
        let mut asked: BTreeSet<String> = BTreeSet::new();
        loop {
            let mut out = Vec::new();
            tokio::select! {
                cmd = cmd_rx.recv() => {
                    let Some(Cmd { names, done }) = cmd else { return };
                    let mut req = request(CLUSTER_TYPE_URL, names.clone());
                    req.node = node.take();
                    out.push(req);
                    pending = Some(Pending {
                        clusters: names.iter().cloned().collect(),
                        endpoints: names.into_iter().collect(),
                        sent: Instant::now(),
                        clusters_at: None,
                        done,
                    });
                }
                msg = inbound.message() => {
                    let resp = match msg {
                        Ok(Some(resp)) => resp,
                        Ok(None) => return,
                        Err(status) => {
                            eprintln!("proxy {id}: {status}");
                            return;
                        }
                    };
                    let at = unix_now();
                    let names: Vec<String> = resp.resources.iter().map(|r| r.name.clone()).collect();
                    // ACK first, as Envoy does, then subscribe to new clusters' endpoints.
                    out.push(DeltaDiscoveryRequest {
                        type_url: resp.type_url.clone(),
                        response_nonce: resp.nonce.clone(),
                        ..Default::default()
                    });
                    if resp.type_url == CLUSTER_TYPE_URL {
                        let new: Vec<String> = names.iter().filter(|n| asked.insert((*n).clone())).cloned().collect();
                        if !new.is_empty() {
                            out.push(request(ENDPOINTS_TYPE_URL, new));
                        }
                        if let Some(p) = pending.as_mut() {
                            for n in &names {
                                p.clusters.remove(n);
                            }
                            if p.clusters.is_empty() && p.clusters_at.is_none() {
                                p.clusters_at = Some(p.sent.elapsed());
                            }
                        }
                    } else if resp.type_url == ENDPOINTS_TYPE_URL {
                        // A large VIP's assignment names collections, as Envoy subscribes them;
                        // its endpoints are in once their members are.
                        let mut globs = Vec::new();
                        for r in &resp.resources {
                            // Decoded only if it names one: decoding every whole assignment
                            // would make this generator the slowest part of a fan-out.
                            let cla = (r.resource.as_ref())
                                .filter(|a| a.value.windows(8).any(|w| w == b"xdstp://"))
                                .and_then(|a| ClusterLoadAssignment::decode(&*a.value).ok());
                            match cla.map(|c| leds::collections_in(&c)).unwrap_or_default() {
                                g if g.is_empty() => { have.insert(r.name.clone()); }
                                g => globs.extend(g),
                            }
                        }
                        if !globs.is_empty() {
                            out.push(request(LB_ENDPOINT_TYPE_URL, globs));
                        }
                        let bytes = resp.encoded_len();
                        let _ = arrivals.send(Arrival { proxy: id, at, names, bytes });
                    } else if resp.type_url == LB_ENDPOINT_TYPE_URL {
                        let clusters: BTreeSet<String> = (names.iter().chain(&resp.removed_resources))
                            .filter_map(|n| leds::cluster_of(n))
                            .map(str::to_owned)
                            .collect();
                        have.extend(clusters.iter().cloned());
                        let bytes = resp.encoded_len();
                        let names = clusters.into_iter().collect();
                        let _ = arrivals.send(Arrival { proxy: id, at, names, bytes });
                    }
                    if let Some(p) = pending.take() {
                        let mut p = p;
                        p.endpoints.retain(|n| !have.contains(n));
                        match p.clusters_at {
                            Some(c) if p.endpoints.is_empty() => {
                                let _ = p.done.send((c, p.sent.elapsed()));
                            }
                            _ => pending = Some(p),
                        }
                    }
                }
            }
            for req in out {
                if tx.send(req).await.is_err() {
                    return;
                }
            }
        }
    });
    Ok(cmds)
}

async fn subscribe(
    cmds: &mpsc::Sender<Cmd>,
    names: Vec<String>,
) -> anyhow::Result<(Duration, Duration)> {
    let (done, wait) = oneshot::channel();
    cmds.send(Cmd { names, done })
        .await
        .ok()
        .context("proxy task ended")?;
    tokio::time::timeout(Duration::from_secs(30), wait)
        .await
        .context("no answer within 30 s")?
        .context("proxy task ended")
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (p / 100.0 * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

fn summary(mut v: Vec<f64>) -> serde_json::Value {
    v.sort_by(f64::total_cmp);
    json!({
        "n": v.len(),
        "p50": percentile(&v, 50.0),
        "p90": percentile(&v, 90.0),
        "p99": percentile(&v, 99.0),
        "max": v.last().copied().unwrap_or(f64::NAN),
    })
}

fn cluster_name(prefix_vip: usize) -> String {
    format!("{}.vip", vip_name("svc-", prefix_vip))
}

fn rss(pid: u32) -> serde_json::Value {
    let (rss, hwm) = procstat::rss_bytes(pid).unwrap_or_default();
    json!({"rss_bytes": rss, "peak_rss_bytes": hwm})
}

/// `xds-load`.
pub async fn run(a: LoadArgs) -> anyhow::Result<()> {
    if a.vips == 0 || a.subs > a.vips {
        bail!("need --vips >= --subs > 0");
    }
    let pid = a.control_pid;
    let mut rng = Rng(a.seed);
    let idle = rss(pid);
    let registered = match (&a.eureka, &a.admin) {
        (Some(eureka), Some(admin)) => Some(register_all(&a, eureka, admin).await?),
        _ => None,
    };
    let (arrivals_tx, mut arrivals) = mpsc::unbounded_channel::<Arrival>();

    // 1. Connect and subscribe, 50 proxies at a time.
    let cpu0 = procstat::cpu_seconds(pid).unwrap_or(0.0);
    let t_connect = Instant::now();
    let mut proxies: Vec<Proxy> = Vec::with_capacity(a.proxies);
    let (mut setup_cds, mut setup_eds) = (Vec::new(), Vec::new());
    for chunk_start in (0..a.proxies).step_by(50) {
        let mut joins = Vec::new();
        for id in chunk_start..(chunk_start + 50).min(a.proxies) {
            let mut subscribed = BTreeSet::new();
            while subscribed.len() < a.subs {
                subscribed.insert(rng.below(a.vips));
            }
            let addr = a.xds.clone();
            let arrivals_tx = arrivals_tx.clone();
            joins.push(tokio::spawn(async move {
                let cmds = connect(id, addr, arrivals_tx).await?;
                let names: Vec<String> = subscribed.iter().map(|&v| cluster_name(v)).collect();
                let (cds, eds) = subscribe(&cmds, names).await?;
                anyhow::Ok((Proxy { cmds, subscribed }, cds, eds))
            }));
        }
        for j in joins {
            let (proxy, cds, eds) = j.await??;
            setup_cds.push(cds.as_secs_f64() * 1e3);
            setup_eds.push(eds.as_secs_f64() * 1e3);
            proxies.push(proxy);
        }
    }
    let connect_s = t_connect.elapsed().as_secs_f64();
    let connect_cpu = procstat::cpu_seconds(pid).unwrap_or(0.0) - cpu0;
    // Let the ACKs land before reading memory.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let connected = rss(pid);

    // 2. Answer time of one more cluster, one request at a time.
    let mut cds_ms = Vec::with_capacity(a.samples);
    let mut eds_ms = Vec::with_capacity(a.samples);
    for s in 0..a.samples {
        let p = s % proxies.len();
        let vip = loop {
            let v = rng.below(a.vips);
            if !proxies[p].subscribed.contains(&v) {
                break v;
            }
        };
        proxies[p].subscribed.insert(vip);
        let cmds = &proxies[p].cmds;
        let (cds, eds) = subscribe(cmds, vec![cluster_name(vip)]).await?;
        cds_ms.push(cds.as_secs_f64() * 1e3);
        eds_ms.push(eds.as_secs_f64() * 1e3);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    // What the subscriptions so far brought each proxy in endpoint bytes (load assignments,
    // and the collections' members of large VIPs).
    let mut setup_bytes: HashMap<usize, usize> = HashMap::new();
    while let Ok(arr) = arrivals.try_recv() {
        *setup_bytes.entry(arr.proxy).or_default() += arr.bytes;
    }

    // 3. Registry changes.
    let changing = registry_gen::changing_vips(a.vips, a.instances, a.change_every);
    let fanout = match (&a.eureka, &a.registry) {
        (Some(eureka), _) => flip_eureka(&a, eureka, &proxies, &changing, &mut arrivals).await?,
        (None, Some(registry)) => {
            flip_file(&a, registry, &proxies, &changing, &mut arrivals).await?
        }
        (None, None) => bail!("need --registry or --eureka"),
    };

    let out = json!({
        "vips": a.vips,
        "instances_per_vip": a.instances,
        "endpoints": a.vips * a.instances,
        "proxies": a.proxies,
        "subs_per_proxy": a.subs,
        "rss_idle": idle,
        "rss_connected": connected,
        "connect_seconds": connect_s,
        "connect_cpu_seconds": connect_cpu,
        "setup_cds_ms": summary(setup_cds),
        "setup_eds_ms": summary(setup_eds),
        "setup_endpoint_bytes_per_proxy": summary(setup_bytes.values().map(|&b| b as f64).collect()),
        "answer_cds_ms": summary(cds_ms),
        "answer_eds_ms": summary(eds_ms),
        "changing_vips": changing.len(),
        "registered": registered,
        "rss_end": rss(pid),
    });
    let mut out = out;
    if let (Some(out), serde_json::Value::Object(fanout)) = (out.as_object_mut(), fanout) {
        out.extend(fanout);
    }
    println!("{out}");
    drop(proxies);
    Ok(())
}

/// The control plane's log lines that split a registry change: parsed, the new resources
/// ready for the cache, the cache holding them.
struct Stamps {
    loaded: &'static str,
    built: &'static str,
    applied: &'static str,
}

/// odmesh-control's file source, model and cache.
const ODMESH_STAMPS: Stamps = Stamps {
    loaded: "registry loaded",
    built: "snapshot built",
    applied: "snapshot applied",
};

/// `bench/gcp`: the dump read and decoded, the changed resources found, `UpdateResources`
/// returned.
const GCP_STAMPS: Stamps = Stamps {
    loaded: "dump read",
    built: "dump diffed",
    applied: "resources updated",
};

/// Rewrites the registry file `flips` times, 1% of the instances changing status each time,
/// and times each change to every proxy subscribed to a changed VIP.
async fn flip_file(
    a: &LoadArgs,
    registry: &std::path::Path,
    proxies: &[Proxy],
    changing: &BTreeSet<usize>,
    arrivals: &mut mpsc::UnboundedReceiver<Arrival>,
) -> anyhow::Result<serde_json::Value> {
    let changing_names: BTreeSet<String> = changing.iter().map(|&v| cluster_name(v)).collect();
    let expected: BTreeSet<usize> = proxies
        .iter()
        .enumerate()
        .filter(|(_, p)| p.subscribed.iter().any(|v| changing.contains(v)))
        .map(|(i, _)| i)
        .collect();
    let stamps = match a.dump {
        Some(_) => GCP_STAMPS,
        None => ODMESH_STAMPS,
    };
    let mut flips = Vec::new();
    let mut all_from_loaded = Vec::new();
    let mut all_from_built = Vec::new();
    let mut all_from_applied = Vec::new();
    let mut all_from_rename = Vec::new();
    for f in 0..a.flips {
        let down = f % 2 == 0;
        let gen_args = GenArgs {
            down_every: a.change_every,
            ..GenArgs::scale(registry.to_path_buf(), a.vips, a.instances, down)
        };
        let body = registry_gen::render(&gen_args);
        let cpu_before = procstat::cpu_seconds(a.control_pid).unwrap_or(0.0);
        let tmp = registry.with_extension("tmp");
        std::fs::write(&tmp, &body)?;
        std::fs::rename(&tmp, registry)?;
        let mut t_rename = unix_now();
        let mut dump_ms = None;
        if let Some(dump) = &a.dump {
            // Built here, before the clock starts: the server only reads it.
            let t = Instant::now();
            let bytes = xds_dump::encode(&xds_dump::resources(registry, body.as_bytes())?);
            xds_dump::write_atomic(dump, &bytes)?;
            t_rename = unix_now();
            dump_ms = Some(t.elapsed().as_secs_f64() * 1e3);
        }
        let mut got: HashMap<usize, f64> = HashMap::new();
        // Load-assignment bytes each proxy received for the change (all its responses naming
        // a changed VIP until every expected proxy has one).
        let mut bytes: HashMap<usize, usize> = HashMap::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        while got.len() < expected.len() {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, arrivals.recv()).await {
                Ok(Some(arr)) => {
                    if arr.names.iter().any(|n| changing_names.contains(n)) {
                        got.entry(arr.proxy).or_insert(arr.at);
                        *bytes.entry(arr.proxy).or_default() += arr.bytes;
                    }
                }
                _ => break,
            }
        }
        let cpu_to_last = procstat::cpu_seconds(a.control_pid).unwrap_or(0.0) - cpu_before;
        let peak = rss(a.control_pid);
        // The file source re-reads a recently modified file on each poll for two seconds:
        // that is part of what a change costs.
        tokio::time::sleep(Duration::from_millis(2500)).await;
        let cpu_total = procstat::cpu_seconds(a.control_pid).unwrap_or(0.0) - cpu_before;
        let log = std::fs::read_to_string(&a.control_log).unwrap_or_default();
        let loaded = log_time::times_of(&log, stamps.loaded)
            .into_iter()
            .filter(|&t| t >= t_rename - 0.001)
            .fold(f64::NAN, f64::min);
        let after = |needle: &str| {
            log_time::times_of(&log, needle)
                .into_iter()
                .filter(|&t| t >= loaded)
                .fold(f64::NAN, f64::min)
        };
        let built = after(stamps.built);
        let applied = after(stamps.applied);
        let from = |base: f64| -> Vec<f64> { got.values().map(|&t| (t - base) * 1e3).collect() };
        let (from_loaded, from_built) = (from(loaded), from(built));
        let (from_applied, from_rename) = (from(applied), from(t_rename));
        all_from_loaded.extend(from_loaded.iter().copied());
        all_from_built.extend(from_built.iter().copied());
        all_from_applied.extend(from_applied.iter().copied());
        all_from_rename.extend(from_rename.iter().copied());
        flips.push(json!({
            "dump_build_ms": dump_ms,
            "down": down,
            "expected_proxies": expected.len(),
            "reached_proxies": got.len(),
            "rename_to_loaded_ms": (loaded - t_rename) * 1e3,
            "loaded_to_snapshot_built_ms": (built - loaded) * 1e3,
            "loaded_to_snapshot_applied_ms": (applied - loaded) * 1e3,
            "fanout_from_loaded_ms": summary(from_loaded),
            "fanout_from_built_ms": summary(from_built),
            "fanout_from_applied_ms": summary(from_applied),
            "fanout_from_rename_ms": summary(from_rename),
            "cpu_seconds_to_last_proxy": cpu_to_last,
            "cpu_seconds_incl_rereads": cpu_total,
            "bytes_per_proxy": summary(bytes.values().map(|&b| b as f64).collect()),
            "bytes_total": bytes.values().sum::<usize>(),
            "rss": peak,
        }));
        while arrivals.try_recv().is_ok() {}
    }

    Ok(json!({
        "flips": flips,
        "log_stamps": [stamps.loaded, stamps.built, stamps.applied],
        "fanout_from_loaded_ms": summary(all_from_loaded),
        "fanout_from_built_ms": summary(all_from_built),
        "fanout_from_applied_ms": summary(all_from_applied),
        "fanout_from_rename_ms": summary(all_from_rename),
    }))
}

/// Sends `requests` over [`REST_CONNECTIONS`] connections to `addr`; answers, per request,
/// when it was sent (Unix seconds). Any answer but 2xx is an error.
async fn send_all(
    addr: &str,
    requests: Vec<(&'static str, String, String)>,
) -> anyhow::Result<Vec<f64>> {
    let requests = std::sync::Arc::new(requests);
    let mut tasks = Vec::new();
    for c in 0..REST_CONNECTIONS {
        let (addr, requests) = (addr.to_owned(), requests.clone());
        tasks.push(tokio::spawn(async move {
            let mut conn = Conn::connect(&addr).await?;
            let mut sent = Vec::new();
            for i in (c..requests.len()).step_by(REST_CONNECTIONS) {
                let (method, path, body) = &requests[i];
                let at = unix_now();
                let (status, answer) = conn.request(method, path, body.as_bytes()).await?;
                if !(200..300).contains(&status) {
                    bail!(
                        "{method} {path}: HTTP {status}: {}",
                        String::from_utf8_lossy(&answer)
                    );
                }
                sent.push((i, at));
            }
            anyhow::Ok(sent)
        }));
    }
    let mut at = vec![f64::NAN; requests.len()];
    for t in tasks {
        for (i, sent) in t.await?? {
            at[i] = sent;
        }
    }
    Ok(at)
}

/// Registers every instance of the generated registry with the embedded Eureka registry
/// at `eureka`, then waits until the control plane serves every VIP (its `/metrics`).
async fn register_all(
    a: &LoadArgs,
    eureka: &str,
    admin: &str,
) -> anyhow::Result<serde_json::Value> {
    let gen_args = GenArgs::scale(PathBuf::new(), a.vips, a.instances, false);
    let requests: Vec<_> = registry_gen::instances(&gen_args)
        .map(|i| {
            // A lease of an hour: this tool sends no heartbeats, and registering a million
            // instances takes longer than Eureka's default lease (90 s).
            let instance = registry_gen::eureka_json(&i, 8080);
            let body = format!(
                "{{\"instance\":{{\"leaseInfo\":{{\"durationInSecs\":3600}},{}}}",
                &instance[1..]
            );
            ("POST", format!("/eureka/apps/{}", i.app), body)
        })
        .collect();
    let n = requests.len();
    let cpu0 = procstat::cpu_seconds(a.control_pid).unwrap_or(0.0);
    let t = Instant::now();
    send_all(eureka, requests).await?;
    let sent_s = t.elapsed().as_secs_f64();
    let want = format!("odmesh_registry_clusters {}\n", a.vips);
    let mut conn = Conn::connect(admin).await?;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let (_, metrics) = conn.request("GET", "/metrics", b"").await?;
        if String::from_utf8_lossy(&metrics).contains(&want) {
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "the control plane did not serve {} VIPs within 120 s",
                a.vips
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let loaded_s = t.elapsed().as_secs_f64();
    Ok(json!({
        "instances": n,
        "register_seconds": sent_s,
        "registrations_per_second": n as f64 / sent_s,
        "registered_to_served_seconds": loaded_s,
        "cpu_seconds": procstat::cpu_seconds(a.control_pid).unwrap_or(0.0) - cpu0,
        "rss": rss(a.control_pid),
    }))
}

/// Sets, then removes, the `OUT_OF_SERVICE` override of 1% of the instances, `flips` times,
/// and times each changed VIP to every proxy subscribed to it.
async fn flip_eureka(
    a: &LoadArgs,
    eureka: &str,
    proxies: &[Proxy],
    changing: &BTreeSet<usize>,
    arrivals: &mut mpsc::UnboundedReceiver<Arrival>,
) -> anyhow::Result<serde_json::Value> {
    let gen_args = GenArgs::scale(PathBuf::new(), a.vips, a.instances, false);
    let changed: Vec<GenInstance> = registry_gen::instances(&gen_args)
        .filter(|i| registry_gen::is_changing(i.index, a.change_every))
        .collect();
    let mut flips = Vec::new();
    let mut all = Vec::new();
    for f in 0..a.flips {
        let down = f % 2 == 0;
        while arrivals.try_recv().is_ok() {}
        let requests: Vec<_> = changed
            .iter()
            .map(|i| {
                let path = format!("/eureka/apps/{}/{}/status", i.app, i.id);
                if down {
                    ("PUT", format!("{path}?value=OUT_OF_SERVICE"), String::new())
                } else {
                    ("DELETE", format!("{path}?value=UP"), String::new())
                }
            })
            .collect();
        let cpu_before = procstat::cpu_seconds(a.control_pid).unwrap_or(0.0);
        let t = Instant::now();
        let sent_at = send_all(eureka, requests).await?;
        let send_s = t.elapsed().as_secs_f64();
        // When each changed VIP's request went out.
        let mut vip_sent: HashMap<String, f64> = HashMap::new();
        for (i, at) in changed.iter().zip(&sent_at) {
            vip_sent.insert(cluster_name(i.index / a.instances), *at);
        }
        // Every (proxy, changed cluster) pair still to arrive.
        let mut waiting: BTreeSet<(usize, String)> = proxies
            .iter()
            .enumerate()
            .flat_map(|(p, proxy)| {
                proxy
                    .subscribed
                    .iter()
                    .filter(|v| changing.contains(v))
                    .map(move |&v| (p, cluster_name(v)))
            })
            .collect();
        let expected = waiting.len();
        let mut times = Vec::with_capacity(expected);
        let mut bytes: HashMap<usize, usize> = HashMap::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        while !waiting.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, arrivals.recv()).await {
                Ok(Some(arr)) => {
                    if arr.names.iter().any(|n| vip_sent.contains_key(n)) {
                        *bytes.entry(arr.proxy).or_default() += arr.bytes;
                    }
                    for name in &arr.names {
                        let Some(&sent) = vip_sent.get(name) else {
                            continue;
                        };
                        if arr.at >= sent && waiting.remove(&(arr.proxy, name.clone())) {
                            times.push((arr.at - sent) * 1e3);
                        }
                    }
                }
                _ => break,
            }
        }
        let cpu = procstat::cpu_seconds(a.control_pid).unwrap_or(0.0) - cpu_before;
        all.extend(times.iter().copied());
        flips.push(json!({
            "down": down,
            "requests": changed.len(),
            "send_seconds": send_s,
            "expected": expected,
            "reached": times.len(),
            "change_to_proxy_ms": summary(times),
            "cpu_seconds": cpu,
            "bytes_per_proxy": summary(bytes.values().map(|&b| b as f64).collect()),
            "bytes_total": bytes.values().sum::<usize>(),
            "rss": rss(a.control_pid),
        }));
    }
    Ok(json!({
        "flips": flips,
        "change_to_proxy_ms": summary(all),
    }))
}
