//! `odmesh-xds-flood`: a raw xDS client that floods a control plane with subscriptions.
//!
//! It opens one delta ADS stream (`envoy.service.discovery.v3.AggregatedDiscoveryService/
//! DeltaAggregatedResources`) to `--xds`, subscribes `--names` random cluster names
//! (`flood-<16 hex digits>.vip`) in requests of `--batch` names, as fast as the stream takes
//! them (or at `--rate` names per second), ACKs every response as Envoy does, and with
//! `--endpoints` also subscribes the load assignment of every cluster it gets (as Envoy
//! does). With `--load-assignments` it subscribes the names as load assignments
//! (`ClusterLoadAssignment`) instead, with no cluster. With `--streams N` it does all of this
//! on N streams at once, each on a connection of its own with names of its own, and reports
//! their sums. With `--no-read` it never reads a response. It counts what it gets.
//!
//! Every `--progress-interval` it writes `odmesh-xds-flood progress {json}` on stderr; when
//! stdin closes (unless `--ignore-stdin`), after `--duration`, with `--until-answered` once
//! every name is answered, or when the server ends the stream, it writes the same JSON, with `ended` saying why, as one line on stdout and exits
//! (0; 2 for bad arguments). The JSON: `ended`, `elapsed_seconds`, `names_requested`,
//! `names_sent`, `batches_sent`, `all_sent_seconds`, `responses`, `resources` and `removed`
//! (per type: `cluster`, `endpoints`, `other`), `response_bytes`, `acks_sent`,
//! `endpoint_subscriptions_sent`, `first_response_seconds`, `all_answered_seconds` (when
//! as many clusters and cluster removals had come as names were requested).
//!
//! The end-to-end tests run it through `odmesh_e2e::XdsFlood`.
#![forbid(unsafe_code)]

use std::cell::RefCell;
use std::io::Read;
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Parser;
use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse,
};
use prost::Message;
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::{ReceiverStream, UnboundedReceiverStream};
use tonic::transport::Endpoint;

const CLUSTER_TYPE_URL: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
const ENDPOINTS_TYPE_URL: &str =
    "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";

/// Floods a control plane's delta ADS with random cluster subscriptions.
#[derive(Parser, Debug)]
#[command(name = "odmesh-xds-flood")]
struct Args {
    /// The control plane's xDS address, `host:port`.
    #[arg(long)]
    xds: String,
    /// How many random cluster names to subscribe.
    #[arg(long, default_value_t = 1_000_000)]
    names: u64,
    /// Names per subscribe request.
    #[arg(long, default_value_t = 1000)]
    batch: u64,
    /// Names per second; 0: as fast as the stream takes them.
    #[arg(long, default_value_t = 0.0)]
    rate: f64,
    /// Seed of the random names (default: from the clock).
    #[arg(long)]
    seed: Option<u64>,
    /// Stop after this many seconds.
    #[arg(long)]
    duration: Option<f64>,
    /// Also subscribe the load assignment of every cluster received, as Envoy does.
    #[arg(long)]
    endpoints: bool,
    /// Subscribe the names as load assignments, with no cluster.
    #[arg(long, conflicts_with = "endpoints")]
    load_assignments: bool,
    /// Never read a response (nor ACK one), as a client that leaves the server's answers
    /// queued; end with `--duration` or stdin.
    #[arg(long, conflicts_with = "until_answered")]
    no_read: bool,
    /// Read responses but never ACK one, as a client that leaves every response pending.
    #[arg(long, conflicts_with = "no_read")]
    no_ack: bool,
    /// List every subscribed name in the request's kept versions too
    /// (`initial_resource_versions`), as a client claiming to hold them already.
    #[arg(long)]
    kept_versions: bool,
    /// Streams, each on a connection of its own, each subscribing `--names` names.
    #[arg(long, default_value_t = 1)]
    streams: u64,
    /// Do not stop when stdin closes.
    #[arg(long)]
    ignore_stdin: bool,
    /// Stop once every name is answered (by a cluster or a removal), closing the stream.
    #[arg(long)]
    until_answered: bool,
    /// The node id in the first request.
    #[arg(long, default_value = "odmesh-xds-flood")]
    node_id: String,
    /// Seconds between progress lines on stderr.
    #[arg(long, default_value_t = 1.0)]
    progress_interval: f64,
    /// Seconds to wait for the connection.
    #[arg(long, default_value_t = 5.0)]
    connect_timeout: f64,
}

/// SplitMix64: enough for names nobody registered.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// What the flood counted.
#[derive(Clone, Debug, Default)]
struct Stats {
    names_sent: u64,
    batches_sent: u64,
    all_sent: Option<Duration>,
    responses: u64,
    resources: [u64; 3],
    removed: [u64; 3],
    response_bytes: u64,
    acks_sent: u64,
    endpoint_subscriptions_sent: u64,
    first_response: Option<Duration>,
    all_answered: Option<Duration>,
}

fn type_index(type_url: &str) -> usize {
    match type_url {
        CLUSTER_TYPE_URL => 0,
        ENDPOINTS_TYPE_URL => 1,
        _ => 2,
    }
}

fn per_type(counts: &[u64; 3]) -> Value {
    json!({"cluster": counts[0], "endpoints": counts[1], "other": counts[2]})
}

fn seconds(d: Option<Duration>) -> Value {
    d.map_or(Value::Null, |d| json!(d.as_secs_f64()))
}

impl Stats {
    /// The counts of several streams together; a time is the latest stream's, and known
    /// only once every stream's is.
    fn sum(all: &[Stats]) -> Stats {
        let latest = |time: fn(&Stats) -> Option<Duration>| {
            all.iter()
                .map(time)
                .collect::<Option<Vec<_>>>()?
                .into_iter()
                .max()
        };
        let mut total = Stats {
            all_sent: latest(|s| s.all_sent),
            first_response: all.iter().filter_map(|s| s.first_response).min(),
            all_answered: latest(|s| s.all_answered),
            ..Stats::default()
        };
        for s in all {
            total.names_sent += s.names_sent;
            total.batches_sent += s.batches_sent;
            total.responses += s.responses;
            for i in 0..3 {
                total.resources[i] += s.resources[i];
                total.removed[i] += s.removed[i];
            }
            total.response_bytes += s.response_bytes;
            total.acks_sent += s.acks_sent;
            total.endpoint_subscriptions_sent += s.endpoint_subscriptions_sent;
        }
        total
    }

    fn json(&self, args: &Args, elapsed: Duration, ended: Option<&str>) -> Value {
        json!({
            "ended": ended,
            "xds": args.xds,
            "node_id": args.node_id,
            "elapsed_seconds": elapsed.as_secs_f64(),
            "streams": args.streams,
            "names_requested": args.names * args.streams,
            "names_sent": self.names_sent,
            "batches_sent": self.batches_sent,
            "all_sent_seconds": seconds(self.all_sent),
            "responses": self.responses,
            "resources": per_type(&self.resources),
            "removed": per_type(&self.removed),
            "response_bytes": self.response_bytes,
            "acks_sent": self.acks_sent,
            "endpoint_subscriptions_sent": self.endpoint_subscriptions_sent,
            "first_response_seconds": seconds(self.first_response),
            "all_answered_seconds": seconds(self.all_answered),
        })
    }
}

/// Events from the batch sender to the main loop.
enum Sent {
    Batch(u64),
    Done,
}

fn main() -> ExitCode {
    let args = match Args::try_parse() {
        Ok(args) => args,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    if args.batch == 0
        || args.streams == 0
        || args.rate.is_nan()
        || args.rate < 0.0
        || args.progress_interval.is_nan()
        || args.progress_interval <= 0.0
    {
        eprintln!(
            "odmesh-xds-flood: --batch and --streams must be above 0, --rate 0 or more, --progress-interval above 0"
        );
        return ExitCode::from(2);
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("odmesh-xds-flood: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let started = Instant::now();
    let (stats, ended) = runtime.block_on(flood_all(&args, started));
    println!("{}", stats.json(&args, started.elapsed(), Some(&ended)));
    ExitCode::SUCCESS
}

/// Runs `--streams` floods at once; their summed counts, and why the first one ended.
async fn flood_all(args: &Args, started: Instant) -> (Stats, String) {
    // Where each stream posts its counts at every progress tick, for stream 0 to write
    // their sum (one thread: the streams take turns).
    let board = RefCell::new(vec![Stats::default(); args.streams as usize]);
    let mut each: Vec<Stats> = (0..args.streams).map(|_| Stats::default()).collect();
    let runs = (each.iter_mut().enumerate())
        .map(|(i, stats)| flood(args, started, stats, i as u64, &board));
    let ended = futures::future::join_all(runs).await;
    let ended = ended.into_iter().next().unwrap_or_default();
    (Stats::sum(&each), ended)
}

/// Closes `tx` when stdin reaches its end (a blocking thread: std's stdin).
fn watch_stdin(tx: oneshot::Sender<()>) {
    std::thread::spawn(move || {
        let mut sink = [0u8; 1024];
        let mut stdin = std::io::stdin();
        while matches!(stdin.read(&mut sink), Ok(n) if n > 0) {}
        let _ = tx.send(());
    });
}

/// Runs the flood on stream `index`, posting its counts on `board` at every progress tick;
/// returns why it ended.
async fn flood(
    args: &Args,
    started: Instant,
    stats: &mut Stats,
    index: u64,
    board: &RefCell<Vec<Stats>>,
) -> String {
    let (stdin_tx, mut stdin_closed) = oneshot::channel();
    // With --ignore-stdin the sender stays here, unused, so the end of stdin never comes.
    let _never_sent = if args.ignore_stdin {
        Some(stdin_tx)
    } else {
        watch_stdin(stdin_tx);
        None
    };
    let deadline = args
        .duration
        .map(|s| tokio::time::Instant::from_std(started) + Duration::from_secs_f64(s.max(0.0)));
    let until_deadline = async {
        match deadline {
            Some(at) => tokio::time::sleep_until(at).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(until_deadline);

    let endpoint = match Endpoint::from_shared(format!("http://{}", args.xds)) {
        Ok(e) => e
            .connect_timeout(Duration::from_secs_f64(args.connect_timeout))
            .tcp_nodelay(true),
        Err(e) => return format!("bad --xds {}: {e}", args.xds),
    };
    let channel = tokio::select! {
        c = endpoint.connect() => match c {
            Ok(c) => c,
            Err(e) => return format!("cannot connect to {}: {e}", args.xds),
        },
        _ = &mut stdin_closed => return "stdin closed".into(),
        () = &mut until_deadline => return "duration".into(),
    };
    let mut client =
        AggregatedDiscoveryServiceClient::new(channel).max_decoding_message_size(256 << 20);

    // ACKs (and endpoint subscriptions) never wait behind the batches: the reader must not
    // block while the server blocks on a full stream.
    let (ack_tx, ack_rx) = mpsc::unbounded_channel::<DeltaDiscoveryRequest>();
    let (batch_tx, batch_rx) = mpsc::channel::<DeltaDiscoveryRequest>(2);
    let outbound = UnboundedReceiverStream::new(ack_rx).merge(ReceiverStream::new(batch_rx));
    let (sent_tx, mut sent_rx) = mpsc::unbounded_channel::<Sent>();
    let seed = args.seed.unwrap_or_else(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
            ^ u64::from(std::process::id())
    }) ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let type_url = match args.load_assignments {
        true => ENDPOINTS_TYPE_URL,
        false => CLUSTER_TYPE_URL,
    };
    let sender = tokio::spawn(send_batches(
        batch_tx,
        sent_tx,
        Node {
            id: match index {
                0 => args.node_id.clone(),
                i => format!("{}-{i}", args.node_id),
            },
            cluster: "odmesh-xds-flood".into(),
            ..Default::default()
        },
        Batches {
            seed,
            type_url,
            names: args.names,
            batch: args.batch,
            rate: args.rate,
            kept_versions: args.kept_versions,
        },
    ));

    let mut inbound = tokio::select! {
        r = client.delta_aggregated_resources(outbound) => match r {
            Ok(r) => r.into_inner(),
            Err(status) => {
                sender.abort();
                return format!("stream refused: {:?}: {}", status.code(), status.message());
            }
        },
        _ = &mut stdin_closed => return "stdin closed".into(),
        () = &mut until_deadline => return "duration".into(),
    };

    let mut progress = tokio::time::interval(Duration::from_secs_f64(args.progress_interval));
    progress.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut sending = true;
    let ended = loop {
        tokio::select! {
            message = inbound.message(), if !args.no_read => match message {
                Ok(Some(response)) => {
                    on_response(args, started, stats, &ack_tx, response);
                    if args.until_answered && stats.all_answered.is_some() {
                        break "all answered".to_owned();
                    }
                }
                Ok(None) => break "stream closed by the server".to_owned(),
                Err(status) => {
                    break format!("stream ended: {:?}: {}", status.code(), status.message())
                }
            },
            sent = sent_rx.recv(), if sending => match sent {
                Some(Sent::Batch(n)) => {
                    stats.names_sent += n;
                    stats.batches_sent += 1;
                }
                Some(Sent::Done) | None => {
                    sending = false;
                    if stats.names_sent == args.names {
                        stats.all_sent = Some(started.elapsed());
                    }
                }
            },
            _ = progress.tick() => {
                let mut board = board.borrow_mut();
                board[index as usize] = stats.clone();
                if index == 0 {
                    let all = Stats::sum(&board);
                    eprintln!("odmesh-xds-flood progress {}", all.json(args, started.elapsed(), None));
                }
            }
            _ = &mut stdin_closed => break "stdin closed".to_owned(),
            () = &mut until_deadline => break "duration".to_owned(),
        }
    };
    sender.abort();
    // Count what was handed to the stream before the end.
    while let Ok(Sent::Batch(n)) = sent_rx.try_recv() {
        stats.names_sent += n;
        stats.batches_sent += 1;
    }
    ended
}

/// Counts a response, ACKs it, and with `--endpoints` subscribes its clusters' load
/// assignments.
fn on_response(
    args: &Args,
    started: Instant,
    stats: &mut Stats,
    ack_tx: &mpsc::UnboundedSender<DeltaDiscoveryRequest>,
    response: DeltaDiscoveryResponse,
) {
    let at = started.elapsed();
    stats.first_response.get_or_insert(at);
    stats.responses += 1;
    stats.response_bytes += response.encoded_len() as u64;
    let kind = type_index(&response.type_url);
    stats.resources[kind] += response.resources.len() as u64;
    stats.removed[kind] += response.removed_resources.len() as u64;
    // Each name is answered by a resource or by a removal (over the server's bounds).
    let asked = usize::from(args.load_assignments);
    if stats.all_answered.is_none() && stats.resources[asked] + stats.removed[asked] >= args.names {
        stats.all_answered = Some(at);
    }
    let mut out = Vec::new();
    if !args.no_ack {
        out.push(DeltaDiscoveryRequest {
            type_url: response.type_url.clone(),
            response_nonce: response.nonce.clone(),
            ..Default::default()
        });
        stats.acks_sent += 1;
    }
    if args.endpoints && kind == 0 {
        let names: Vec<String> = response
            .resources
            .iter()
            .map(|r| {
                r.resource
                    .as_ref()
                    .and_then(|any| Cluster::decode(any.value.as_slice()).ok())
                    .and_then(|c| c.eds_cluster_config)
                    .map(|eds| eds.service_name)
                    .filter(|name| !name.is_empty())
                    .unwrap_or_else(|| r.name.clone())
            })
            .collect();
        if !names.is_empty() {
            stats.endpoint_subscriptions_sent += names.len() as u64;
            out.push(DeltaDiscoveryRequest {
                type_url: ENDPOINTS_TYPE_URL.into(),
                resource_names_subscribe: names,
                ..Default::default()
            });
        }
    }
    for request in out {
        let _ = ack_tx.send(request);
    }
}

/// What one stream subscribes: `names` random names of `type_url` (from `seed`) in requests
/// of `batch`, paced at `rate` names per second (0: as fast as the stream takes them).
struct Batches {
    seed: u64,
    type_url: &'static str,
    names: u64,
    batch: u64,
    rate: f64,
    /// Every name listed in the kept versions too.
    kept_versions: bool,
}

/// Sends the requests of `batches`; the first carries the node.
async fn send_batches(
    tx: mpsc::Sender<DeltaDiscoveryRequest>,
    sent: mpsc::UnboundedSender<Sent>,
    node: Node,
    batches: Batches,
) {
    let Batches {
        seed,
        type_url,
        names,
        batch,
        rate,
        kept_versions,
    } = batches;
    let mut rng = Rng(seed);
    let mut node = Some(node);
    let start = tokio::time::Instant::now();
    let mut done = 0u64;
    while done < names {
        if rate > 0.0 {
            tokio::time::sleep_until(start + Duration::from_secs_f64(done as f64 / rate)).await;
        }
        let n = batch.min(names - done);
        let names: Vec<String> = (0..n)
            .map(|_| format!("flood-{:016x}.vip", rng.next()))
            .collect();
        let kept = match kept_versions {
            true => names
                .iter()
                .map(|name| (name.clone(), "1".into()))
                .collect(),
            false => Default::default(),
        };
        let request = DeltaDiscoveryRequest {
            node: node.take(),
            type_url: type_url.into(),
            resource_names_subscribe: names,
            initial_resource_versions: kept,
            ..Default::default()
        };
        if tx.send(request).await.is_err() {
            break;
        }
        done += n;
        let _ = sent.send(Sent::Batch(n));
    }
    let _ = sent.send(Sent::Done);
    // Keep the request stream open: closing it would end the stream for the server.
    std::future::pending::<()>().await;
}
