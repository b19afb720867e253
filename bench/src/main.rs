//! `odmesh-bench`: the tools behind `make bench`. Each subcommand does one measurement job and
//! prints JSON on stdout; `bench/run.py` runs them against real processes and writes the report.
#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, Subcommand};

mod first_request;
mod follow_load;
mod http1;
mod leds_probe;
mod log_time;
mod procstat;
mod push_all;
mod registry_gen;
mod registry_load;
mod replication_lag;
mod spring_eureka;
mod xds_dump;
mod xds_load;

/// odmesh benchmark tools (see docs/benchmarks.md).
#[derive(Debug, Parser)]
#[command(name = "odmesh-bench")]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Writes a generated registry file (YAML form, or Eureka JSON with --json), atomically.
    GenRegistry(registry_gen::GenArgs),
    /// Times parsing a registry file and building the snapshot, in this process (JSON out).
    ParseRegistry {
        /// The registry file.
        file: PathBuf,
    },
    /// Simulated Envoys over delta ADS against a running odmesh-control (JSON out).
    XdsLoad(xds_load::LoadArgs),
    /// Whether stock Envoy takes a cluster's endpoints one by one (LEDS) over delta ADS, and
    /// what one endpoint's change then costs on the wire (JSON out).
    LedsProbe(leds_probe::LedsArgs),
    /// Writes every Cluster and ClusterLoadAssignment odmesh serves for a registry, for
    /// another control plane to serve (bench/gcp): length-delimited xDS `Resource`s.
    XdsDump(xds_dump::DumpArgs),
    /// A delta ADS server that pushes every cluster of a registry to whoever connects.
    PushAll {
        /// The registry file to serve.
        #[arg(long)]
        registry: PathBuf,
        /// Where to listen for gRPC.
        #[arg(long, default_value = "127.0.0.1:18100")]
        listen: SocketAddr,
        /// The clusters as odmesh serves them (`odmesh`), or changed to measure what a cluster
        /// option costs Envoy: `inline` (STATIC, endpoints in the cluster, no EDS),
        /// `no-outlier` (without outlier detection), `no-breakers` (without circuit breakers),
        /// `bare` (all three, and no protocol options or metadata).
        #[arg(long, default_value = "odmesh")]
        variant: push_all::Variant,
    },
    /// The embedded Eureka registry in this process: registrations/s and RSS as it grows to
    /// a million instances, an eviction round and a publish at that size (JSON out).
    RegistryLoad(registry_load::RegistryLoadArgs),
    /// First request vs warm requests for never-seen VIPs through an Envoy listener (JSON out).
    FirstRequest(first_request::FirstArgs),
    /// How long a registration on one embedded registry takes to reach its peer, under a
    /// steady registration load (JSON out).
    ReplicationLag(replication_lag::LagArgs),
    /// A Eureka server of generated Spring-like instances (gzip when asked), with deltas
    /// once it starts changing; prints its URL as JSON and serves until killed.
    EurekaServe(spring_eureka::ServeArgs),
    /// `odmesh-control --eureka` (or `--peer-fill`: `--serve-eureka --peer`) following an
    /// `eureka-serve` of N instances: time to the first complete registry, RSS after full
    /// fetches and after deltas (JSON out).
    FollowLoad(follow_load::FollowArgs),
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    match args.command {
        Command::GenRegistry(a) => registry_gen::run(&a),
        Command::ParseRegistry { file } => registry_gen::parse_and_report(&file),
        Command::FirstRequest(a) => first_request::run(&a),
        Command::RegistryLoad(a) => runtime()?.block_on(registry_load::run(a)),
        Command::ReplicationLag(a) => runtime()?.block_on(replication_lag::run(a)),
        Command::EurekaServe(a) => runtime()?.block_on(spring_eureka::run(a)),
        Command::FollowLoad(a) => runtime()?.block_on(follow_load::run(a)),
        Command::XdsDump(a) => xds_dump::run(&a),
        Command::LedsProbe(a) => runtime()?.block_on(leds_probe::run(a)),
        Command::XdsLoad(a) => runtime()?.block_on(xds_load::run(a)),
        Command::PushAll {
            registry,
            listen,
            variant,
        } => runtime()?.block_on(push_all::serve(&registry, listen, variant)),
    }
}

fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
}
