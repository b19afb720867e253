//! Adaptive concurrency limits against real Envoy, in front of an upstream whose latency grows
//! with the requests it holds ([`CongestedUpstream`]): the inbound listener of the shipped
//! bootstrap, with the limit the policy file's `services:` gives the proxy's service, delivered
//! live by extension config discovery; and the caller's side, the limit a VIP's
//! `concurrency_limit` gives every caller's proxy, delivered live in its route. Needs
//! `make envoy`, `make wasm` (or `make native`) and `cargo build -p odmesh-control`.

use std::fs;
use std::net::SocketAddr;
use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

use odmesh_e2e::{
    CongestedUpstream, ControlPlane, Envoy, HttpUpstream, Instance, Load, LoadConfig, Mesh,
    Outcome, RegistryFile, Request, Shell, TestEnv, Versions, block_on_within, grpc_call,
    odmesh_bootstrap, wait_until,
};

/// The inbound listener in the shipped bootstraps.
const INGRESS: &str = "odmesh_ingress";
/// Envoy's gauge of the limit now.
const LIMIT: &str =
    "http.odmesh_ingress.adaptive_concurrency.gradient_controller.concurrency_limit";
const BLOCKED: &str = "http.odmesh_ingress.adaptive_concurrency.gradient_controller.rq_blocked";
/// The header of the caller-side limit's refusals: the cluster whose limit was reached.
const LIMITED_HEADER: &str = "x-odmesh-limited";

/// Where the shell under test keeps its stats (Envoy's prefix for a module's own).
fn custom() -> &'static str {
    match Shell::current() {
        Shell::Native => "dynamicmodulescustom",
        Shell::Wasm => "wasmcustom",
    }
}

/// The shell's gauge of `cluster`'s caller-side limit.
fn caller_limit(cluster: &str) -> String {
    format!("{}.odmesh_concurrency_limit.cluster.{cluster}", custom())
}

/// The shell's count of requests its caller-side limits refused.
fn caller_limited() -> String {
    format!("{}.odmesh_concurrency_limited", custom())
}
/// Envoy's count of the configurations it took for the limiter (ECDS).
const RELOADED: &str =
    "extension_config_discovery.http_filter.odmesh.inbound.adaptive_concurrency.config_reload";
/// The load of every phase: a steady rate the congested upstream cannot take unlimited.
const RATE: u32 = 200;
const IN_FLIGHT: usize = 64;
/// Requests per phase (about 5 s at [`RATE`]).
const PER_PHASE: u64 = 1000;
const PHASE_BOUND: Duration = Duration::from_secs(60);

fn write_policy(path: &Path, yaml: &str) {
    let tmp = path.with_extension("tmp");
    fs::write(&tmp, yaml).unwrap_or_else(|e| panic!("cannot write {}: {e}", tmp.display()));
    fs::rename(&tmp, path).unwrap_or_else(|e| panic!("cannot rename {}: {e}", path.display()));
}

/// What one phase of load got.
#[derive(Debug)]
struct Phase {
    answered: usize,
    limited: usize,
    /// Of the 503s, those that name the cluster whose limit was reached.
    named: usize,
    p50: Duration,
    /// The most requests the upstream held at once.
    max_in_flight: usize,
    /// Envoy's limit at the end.
    limit: Option<u64>,
}

/// Where a phase sends its load, and which of Envoy's gauges holds the limit.
struct Target<'a> {
    addr: SocketAddr,
    host: &'a str,
    limit: String,
}

/// [`PER_PHASE`] requests to `target`, with the upstream's peak in flight.
fn phase(name: &str, envoy: &Envoy, target: &Target, upstream: &CongestedUpstream) -> Phase {
    upstream.reset_max();
    let config = LoadConfig::rate(RATE)
        .max_in_flight(IN_FLIGHT)
        .timeout(Duration::from_secs(10))
        .record_header(LIMITED_HEADER);
    let load = Load::hosts(target.addr, &[target.host], config);
    // The limit every quarter second while the phase runs, for the output.
    let mut limits = Vec::new();
    let end = Instant::now() + PHASE_BOUND;
    while load.progress().completed < PER_PHASE {
        assert!(
            Instant::now() < end,
            "{name}: the load did not finish in {PHASE_BOUND:?}"
        );
        limits.push(envoy.stat(&target.limit).unwrap_or(0));
        thread::sleep(Duration::from_millis(250));
    }
    let report = load.stop();
    eprintln!("{name}: the limit every 250 ms: {limits:?}");
    let mut latencies: Vec<Duration> = (report.records.iter())
        .filter(|r| r.outcome == Outcome::Status(200))
        .map(|r| r.latency)
        .collect();
    latencies.sort();
    let at = |q: f64| {
        let i = ((latencies.len() as f64 * q) as usize).min(latencies.len().saturating_sub(1));
        latencies.get(i).copied().unwrap_or_default()
    };
    let refused = || (report.records.iter()).filter(|r| r.outcome == Outcome::Status(503));
    let limited = refused().count();
    let named = refused()
        .filter(|r| r.header.as_deref() == Some(&format!("{}.vip", target.host)))
        .count();
    let others: Vec<&Outcome> = (report.records.iter())
        .map(|r| &r.outcome)
        .filter(|o| !matches!(o, Outcome::Status(200 | 503)))
        .collect();
    assert!(
        others.is_empty(),
        "{name}: {:?}",
        &others[..others.len().min(5)]
    );
    let phase = Phase {
        answered: latencies.len(),
        limited,
        named,
        p50: at(0.5),
        max_in_flight: upstream.max_in_flight(),
        limit: envoy.stat(&target.limit),
    };
    eprintln!(
        "{name}: {phase:?}\n  {}",
        report.summary().lines().next().unwrap_or("")
    );
    phase
}

/// What a working limit does, `limited` against `unlimited`: some requests refused, far fewer
/// held by the upstream at once, answers far faster. The limit it settled at.
fn assert_the_limit_helped(unlimited: &Phase, limited: &Phase) -> u64 {
    assert!(limited.limited > 0 && limited.answered > 0, "{limited:?}");
    assert!(
        limited.max_in_flight * 2 <= unlimited.max_in_flight,
        "in flight: {} limited, {} unlimited",
        limited.max_in_flight,
        unlimited.max_in_flight
    );
    // The upstream answers in 10 ms alone, a few tens of ms with the few requests a limit
    // allows; piled up, in about 500 ms.
    assert!(
        limited.p50 * 4 < unlimited.p50,
        "{:?} limited, {:?} unlimited",
        limited.p50,
        unlimited.p50
    );
    limited.limit.expect("the limit's gauge")
}

/// The upstream recovers: under `rate`, the limit grows from `settled` to `to` (within a
/// generous bound), with the time it took in the output.
fn assert_it_grows_back(
    envoy: &Envoy,
    target: &Target,
    upstream: &CongestedUpstream,
    rate: u32,
    settled: u64,
    to: u64,
) {
    upstream.set_per(Duration::ZERO);
    let config = LoadConfig::rate(rate)
        .max_in_flight(IN_FLIGHT)
        .timeout(Duration::from_secs(10));
    let load = Load::hosts(target.addr, &[target.host], config);
    let recovering = Instant::now();
    wait_until(Duration::from_secs(30), "the limit to grow back", || {
        envoy.stat(&target.limit).is_some_and(|l| l >= to)
    });
    let report = load.stop();
    eprintln!(
        "limit grew from {settled} to {:?} in {:?}\n  {}",
        envoy.stat(&target.limit),
        recovering.elapsed(),
        report.summary().lines().next().unwrap_or("")
    );
}

#[test]
fn an_adaptive_limit_keeps_a_congested_service_near_its_unloaded_latency_and_grows_back() {
    let env = TestEnv::new("limits_inbound_adaptive");
    // 10 ms alone, 8 ms more for each request it already holds: at 200 requests a second it
    // cannot keep up (each request adds more than the 5 ms between two), so without a limit
    // the requests pile up to what the load allows in flight.
    let upstream = CongestedUpstream::start(Duration::from_millis(10), Duration::from_millis(8));
    let policy = env.log_dir().join("policy.yaml");
    write_policy(&policy, "");
    let registry = RegistryFile::create(&env.log_dir().join("registry.yaml"), &[]);
    let arg = policy.to_string_lossy().into_owned();
    let control = ControlPlane::start(&env, "control", registry.path(), &["--policy", &arg]);
    let bootstrap = odmesh_bootstrap(control.xds().port())
        .replace("  cluster: odmesh\n", "  cluster: payments\n")
        .replace(
            "port_value: 8080",
            &format!("port_value: {}", upstream.port()),
        );
    let envoy = Envoy::start(&env, "payments", &bootstrap);
    let target = Target {
        addr: envoy.listener(INGRESS),
        host: "payments",
        limit: LIMIT.to_owned(),
    };

    // Without a limit, the load piles up in the upstream.
    let unlimited = phase("unlimited", &envoy, &target, &upstream);
    assert_eq!(unlimited.limited, 0, "no limit yet");

    write_policy(
        &policy,
        "services:
  payments:
    adaptive_concurrency: {update_interval: 100ms, min_rtt_interval: 30s, min_rtt_requests: 20}
",
    );
    let written = Instant::now();
    // The first configuration was the switched-off one, at Envoy's start.
    wait_until(Duration::from_secs(10), "the limit to reach Envoy", || {
        control.metric("odmesh_ecds_responses_total") >= 2
            && envoy.stat(RELOADED).is_some_and(|n| n >= 2)
    });
    eprintln!("limit configured {:?} after the write", written.elapsed());
    let limited = phase("limited", &envoy, &target, &upstream);
    assert!(
        envoy.stat(BLOCKED).unwrap_or(0) > 0,
        "no request was limited"
    );
    let settled = assert_the_limit_helped(&unlimited, &limited);
    assert_it_grows_back(&envoy, &target, &upstream, RATE, settled, settled * 2);
}

#[test]
fn a_caller_side_limit_keeps_a_congested_vip_near_its_unloaded_latency_and_grows_back() {
    let env = TestEnv::new("limits_caller_side");
    // As above: 10 ms alone, 8 ms more per request it holds; here it is the VIP `slow`, and
    // the limit is the caller's, in its own Envoy's route.
    let upstream = CongestedUpstream::start(Duration::from_millis(10), Duration::from_millis(8));
    let policy = env.log_dir().join("policy.yaml");
    write_policy(&policy, "");
    let arg = policy.to_string_lossy().into_owned();
    let mesh = Mesh::start_with(
        &env,
        &[Instance::new("slow", upstream.port())],
        &["--policy", &arg],
    );
    let target = Target {
        addr: mesh.egress(),
        host: "slow",
        limit: caller_limit("slow.vip"),
    };
    let unlimited = phase("unlimited", &mesh.envoy, &target, &upstream);
    assert_eq!(unlimited.limited, 0, "no limit yet");

    let routes = mesh.control.metric("odmesh_rds_responses_total");
    write_policy(&policy, "vips: {slow: {concurrency_limit: {}}}");
    wait_until(
        Duration::from_secs(10),
        "the route with the limit to reach Envoy",
        || mesh.control.metric("odmesh_rds_responses_total") > routes,
    );
    // A quiet start, as before any trouble: the limiter learns the VIP's usual latency.
    let quiet = LoadConfig::rate(20)
        .max_in_flight(IN_FLIGHT)
        .timeout(Duration::from_secs(10));
    let load = Load::hosts(mesh.egress(), &["slow"], quiet);
    load.wait_completed(40, PHASE_BOUND);
    let report = load.stop();
    assert_eq!(report.answered(), report.sent(), "{}", report.summary());

    let limited = phase("limited", &mesh.envoy, &target, &upstream);
    let settled = assert_the_limit_helped(&unlimited, &limited);
    assert_eq!(
        limited.named, limited.limited,
        "every refusal names slow.vip"
    );
    assert_eq!(
        mesh.envoy.stat(&caller_limited()),
        Some(limited.limited as u64),
        "Envoy counts each refusal"
    );
    assert_eq!(
        mesh.control.metric("odmesh_rds_policy_dropped_total"),
        0,
        "nothing of the policy left out"
    );
    // A heavier load than before: the limit grows only while at least half of it is in use.
    let to = (settled * 2).max(settled + 2);
    assert_it_grows_back(&mesh.envoy, &target, &upstream, RATE * 3, settled, to);
}

/// The egress listener's line in the shipped bootstrap, as the tests render it.
const EGRESS_LISTENER: &str =
    "  - name: odmesh_egress\n    address: {socket_address: {address: 127.0.0.1, port_value: 0}}\n";

#[test]
fn a_call_over_the_limit_is_refused_at_once_naming_it_and_a_grpc_call_gets_unavailable() {
    let env = TestEnv::new("limits_caller_refusal");
    let up = HttpUpstream::start("rpc-1", Versions::Both);
    let policy = env.log_dir().join("policy.yaml");
    write_policy(
        &policy,
        "vips: {rpc: {concurrency_limit: {initial_limit: 1, max_limit: 1}}}",
    );
    let arg = policy.to_string_lossy().into_owned();
    let registry = RegistryFile::create(
        &env.log_dir().join("registry.yaml"),
        &[Instance::new("rpc", up.port())],
    );
    let control = ControlPlane::start(&env, "control", registry.path(), &["--policy", &arg]);
    // Two workers, each new connection to the one with fewer open (`exact_balance`): the
    // request holding the slot and the calls after it are on different workers, so they are
    // refused only if the workers share the limit (the wasm shell runs a VM per worker).
    let bootstrap = odmesh_bootstrap(control.xds().port());
    assert_eq!(bootstrap.matches(EGRESS_LISTENER).count(), 1, "{bootstrap}");
    let balanced = format!(
        "{EGRESS_LISTENER}    connection_balance_config: {{exact_balance: {{}}}}\n    \
         stat_prefix: odmesh_egress\n"
    );
    let envoy = Envoy::start_workers(
        &env,
        "envoy",
        &bootstrap.replace(EGRESS_LISTENER, &balanced),
        2,
    );
    envoy.wait_xds_connected(true, Duration::from_secs(10));
    let egress = envoy.listener("odmesh_egress");
    // One slow request holds the only slot.
    let held = thread::spawn(move || {
        Request::get("/slow?ms=4000")
            .host("rpc")
            .send_within(egress, Duration::from_secs(20))
            .map(|r| r.status)
            .map_err(|e| e.to_string())
    });
    // Nothing else is sent before it holds the slot (else a call could take it first).
    wait_until(
        Duration::from_secs(10),
        "the slow request to hold the only slot",
        || envoy.stat("cluster.rpc.vip.upstream_rq_active") == Some(1),
    );
    let bound = Instant::now() + Duration::from_secs(3);
    let call = odmesh_demo::EchoRequest::new("hi");
    let mut answers = Vec::new();
    let refused = loop {
        let answer = block_on_within(Duration::from_secs(20), async {
            grpc_call(egress, "rpc", "/", &call, "5S").await
        });
        if answer.get("grpc-status").map(String::as_str) == Some("14") || Instant::now() > bound {
            break answer;
        }
        answers.push(answer);
        thread::sleep(Duration::from_millis(20));
    };
    let plain = Request::get("/")
        .host("rpc")
        .send_within(egress, Duration::from_secs(20))
        .expect("a plain request while the slot is held");
    assert_eq!(held.join().expect("the held request"), Ok(200));
    assert_eq!(
        refused.get("grpc-status").map(String::as_str),
        Some("14"),
        "UNAVAILABLE once the slot was held; {} answers before, the last: {:?}",
        answers.len(),
        answers.last()
    );
    let message = refused.get("grpc-message").cloned().unwrap_or_default();
    assert!(message.contains("concurrency"), "{refused:?}");
    assert_eq!(plain.status, 503, "{}", plain.text());
    assert_eq!(plain.header("x-odmesh-limited"), Some("rpc.vip"));
    assert!(
        plain
            .text()
            .contains("concurrency limit of rpc.vip reached (1 in flight)"),
        "{}",
        plain.text()
    );
    assert_eq!(envoy.stat(&caller_limited()), Some(2));
    let per_worker: Vec<u64> = (0..2)
        .map(|w| {
            let name = format!("listener.odmesh_egress.worker_{w}.downstream_cx_total");
            envoy.stat(&name).unwrap_or(0)
        })
        .collect();
    assert!(
        per_worker.iter().all(|&n| n > 0),
        "both workers took connections: {per_worker:?}"
    );
    // The slot is free again once the held request is over.
    let after = Request::get("/")
        .host("rpc")
        .send_within(egress, Duration::from_secs(20))
        .expect("a request after");
    assert_eq!(after.status, 200, "{}", after.text());
}
