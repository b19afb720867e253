//! Control-plane replicas (issue 17): several `odmesh-control` processes over one registry
//! file, and one Envoy whose xDS cluster lists them all, as README.md ("Running several
//! control planes") deploys them. Killing the replica Envoy is connected to must fail no
//! request to a VIP Envoy holds, and a VIP first asked after the kill routes within 2 s.
//! Needs `make envoy`, `make wasm` (or `make native`) and `cargo build -p odmesh-control`.

use std::time::{Duration, Instant};

use odmesh_e2e::mesh::EGRESS_LISTENER;
use odmesh_e2e::{
    ControlPlane, EchoUpstream, Envoy, Instance, Load, LoadConfig, MAX_LATENCY, RegistryFile,
    Request, Response, TestEnv, odmesh_bootstrap_replicas, wait_for, wait_ok,
};
use serde_json::Value;

/// How many replicas the test runs: the README's recommendation.
const REPLICAS: usize = 3;
/// Requests per second under load, spread over the known VIPs.
const RATE: u32 = 100;
/// Requests the load completes in a second.
const PHASE: u64 = RATE as u64;
/// The bound on anything that is not the measured failover: starts, connects, the load.
const DEADLINE: Duration = Duration::from_secs(10);
/// Issue 17: a VIP first asked after the replica's death routes within this.
const NEW_VIP_BOUND: Duration = Duration::from_secs(2);
/// The node id in the shipped bootstrap (`node.id`).
const NODE_ID: &str = "odmesh-local";

/// The ADS stream of Envoy (`node.id` [`NODE_ID`]) that `control` lists in `/debug/proxies`,
/// if it lists one; panics if it lists more than one.
fn envoy_stream(control: &ControlPlane) -> Option<Value> {
    let mut streams: Vec<Value> = (control.proxies().into_iter())
        .filter(|p| p["service"] == "ads" && p["node_id"] == NODE_ID)
        .collect();
    assert!(
        streams.len() <= 1,
        "{} holds {} ADS streams of one Envoy: {streams:?}",
        control.process().label(),
        streams.len()
    );
    streams.pop()
}

/// The index of the one replica that holds Envoy's ADS stream, once exactly one of `alive`
/// does (waits at most `timeout`).
fn connected_replica(replicas: &[ControlPlane], alive: &[usize], timeout: Duration) -> usize {
    wait_for(
        timeout,
        "exactly one replica to hold Envoy's ADS stream",
        || {
            let holding: Vec<usize> = (alive.iter().copied())
                .filter(|&i| envoy_stream(&replicas[i]).is_some())
                .collect();
            (holding.len() == 1).then(|| holding[0])
        },
    )
}

/// The cluster names `stream` (an entry of `/debug/proxies`) subscribed.
fn clusters_of(stream: &Value) -> Vec<String> {
    (stream["clusters"].as_array().into_iter().flatten())
        .filter_map(|c| c.as_str().map(str::to_owned))
        .collect()
}

fn describe(response: &Response) -> String {
    format!("{} {}", response.status, response.text().trim())
}

#[test]
fn killing_the_replica_envoy_is_connected_to_fails_no_request_and_a_new_vip_routes_within_2s() {
    let env = TestEnv::new("replicas_failover");
    let hello = EchoUpstream::start("hello-1");
    let other = EchoUpstream::start("other-1");
    let fresh = EchoUpstream::start("fresh-1");
    let registry = RegistryFile::create(
        &env.log_dir().join("registry.yaml"),
        &[
            Instance::new("hello", hello.port()),
            Instance::new("other", other.port()),
            Instance::new("fresh", fresh.port()),
        ],
    );
    let mut replicas: Vec<ControlPlane> = (0..REPLICAS)
        .map(|i| ControlPlane::start(&env, &format!("control-{i}"), registry.path(), &[]))
        .collect();
    let ports: Vec<u16> = replicas.iter().map(|r| r.xds().port()).collect();
    let envoy = Envoy::start(&env, "envoy", &odmesh_bootstrap_replicas(&ports));
    let egress = envoy.listener(EGRESS_LISTENER);
    envoy.wait_xds_connected(true, DEADLINE);
    let all: Vec<usize> = (0..REPLICAS).collect();
    let first = connected_replica(&replicas, &all, DEADLINE);
    let get = |host: &str| Request::get("/").host(host).send(egress);
    for (host, upstream) in [("hello", "hello-1"), ("other", "other-1")] {
        let response = get(host);
        assert_eq!(response.status, 200, "{host}: {}", describe(&response));
        assert_eq!(response.json()["upstream"], upstream);
    }
    let held = clusters_of(&envoy_stream(&replicas[first]).expect("the stream"));
    assert!(
        ["hello.vip", "other.vip"]
            .iter()
            .all(|c| held.iter().any(|h| h == c)),
        "control-{first} should hold Envoy's subscriptions: {held:?}"
    );

    let known = ["hello", "other"];
    let load = Load::hosts(egress, &known, LoadConfig::rate(RATE).keep_alive());
    load.wait_completed(PHASE, DEADLINE);
    let sent_before: Vec<u64> = (replicas.iter())
        .map(|r| r.metric("odmesh_xds_resources_sent_total"))
        .collect();
    load.mark(&format!("killed control-{first}"));
    replicas[first].kill();
    let killed = Instant::now();

    // A VIP nobody asked for yet: its first request waits for discovery, which needs a live
    // replica. Asked at once, so the time includes Envoy noticing the death and reconnecting.
    let mut attempts = Vec::new();
    let routed = wait_ok(DEADLINE, "VIP fresh to route after the kill", || {
        let response = get("fresh");
        let took = killed.elapsed();
        attempts.push(format!("{took:?}: {}", describe(&response)));
        if response.status == 200 {
            assert_eq!(response.json()["upstream"], "fresh-1");
            return Ok(took);
        }
        // Only "not discovered yet" (NC) may come before it routes: anything else is wrong.
        assert_eq!(response.status, 503, "{attempts:#?}");
        assert!(
            response.text().contains("cluster not discovered"),
            "{attempts:#?}"
        );
        Err(format!("{attempts:#?}"))
    });
    eprintln!(
        "VIP fresh, first asked as control-{first} died, routed {routed:?} after the kill: {attempts:#?}"
    );
    assert!(
        routed < NEW_VIP_BOUND,
        "a VIP first asked after the kill routed {routed:?} after it, over {NEW_VIP_BOUND:?}: {attempts:#?}"
    );

    let alive: Vec<usize> = all.iter().copied().filter(|&i| i != first).collect();
    let second = connected_replica(&replicas, &alive, DEADLINE);
    envoy.wait_xds_connected(true, DEADLINE);
    let stream = envoy_stream(&replicas[second]).expect("the stream");
    let mut clusters = clusters_of(&stream);
    clusters.sort();
    assert_eq!(
        clusters,
        ["fresh.vip", "hello.vip", "other.vip"],
        "Envoy should have re-sent its subscriptions to control-{second}: {stream}"
    );
    // Envoy re-sent the names it held with their versions, which are content hashes of the
    // same registry: control-{second} sent nothing for them, only the new VIP's cluster and
    // load assignment.
    let sent = replicas[second].wait_all_answered(DEADLINE)["odmesh_xds_resources_sent_total"]
        - sent_before[second];
    assert_eq!(
        sent, 2,
        "control-{second} should have sent only fresh.vip's Cluster and ClusterLoadAssignment"
    );
    // The load keeps running on the survivors for a few seconds.
    load.wait_completed(3 * PHASE, DEADLINE);
    let report = load.stop();
    eprintln!("{}", report.summary());
    report.assert_no_failures(&known);
    report.assert_answered_within(MAX_LATENCY);
}
