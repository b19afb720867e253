//! On-demand discovery against real Envoy and `odmesh-control`: the first request to a VIP
//! fetches its cluster once, however many requests arrive at once; many VIPs each get their
//! own cluster; an unknown VIP fails fast with a body that says so, every time, and routes
//! once it is registered. Needs `make envoy`, `make wasm` and `cargo build -p odmesh-control`.

use std::collections::BTreeMap;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use odmesh_e2e::{CHANGE_DEADLINE, EchoUpstream, Instance, Mesh, TestEnv, timed, wait_until_since};
use serde_json::Value;

/// The bound on a first request that includes discovery: well under the bootstrap's 1 s
/// discovery timeout, so a request that waited for the timeout fails the test.
const FAST_FIRST: Duration = Duration::from_millis(500);
/// The bound on a 503 from a cluster Envoy already holds ("well under 100 ms", README, "How it
/// works"; it takes about a millisecond, so the bound leaves ample room on a loaded machine).
const FAST: Duration = Duration::from_millis(100);
/// How long counters may take to settle after a request (Envoy's ACKs are on their way).
const SETTLE: Duration = Duration::from_secs(5);

/// `after[name] - before[name]` (0 for a stat missing in both).
fn delta(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>, name: &str) -> u64 {
    let b = before.get(name).copied().unwrap_or(0);
    let a = after.get(name).copied().unwrap_or(0);
    a.checked_sub(b)
        .unwrap_or_else(|| panic!("{name} went down from {b} to {a}"))
}

/// Asserts a 200 from the echo upstream `upstream`.
fn assert_routed_to(mesh: &Mesh, host: &str, upstream: &str) {
    let response = mesh.get(host);
    assert_eq!(
        response.status,
        200,
        "Host {host} was not routed: {}",
        response.text()
    );
    assert_eq!(response.json()["upstream"], upstream, "Host {host}");
}

#[test]
fn the_first_request_to_a_vip_discovers_its_cluster_and_later_ones_do_not_ask_again() {
    let env = TestEnv::new("discovery_first_request");
    let hello = EchoUpstream::start("hello-1");
    let mesh = Mesh::start(&env, &[Instance::new("hello", hello.port())]);
    assert!(mesh.control.subscribed_clusters().is_empty());
    let envoy_before = mesh.discovery_stats();
    let control_before = mesh.control.wait_all_answered(SETTLE);

    let (response, took) = timed(|| mesh.get("hello"));
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(response.json()["upstream"], "hello-1");
    eprintln!("first request to VIP hello, discovery included: {took:?}");

    let control_first = mesh.control.wait_all_answered(SETTLE);
    let envoy_first = mesh.discovery_stats();
    assert_eq!(mesh.control.subscribed_clusters(), ["hello.vip"]);
    assert_eq!(
        delta(&envoy_before, &envoy_first, "cluster_manager.cluster_added"),
        1
    );
    assert_eq!(
        delta(
            &envoy_before,
            &envoy_first,
            "cluster_manager.odcds.update_success"
        ),
        1
    );
    // One Cluster and one ClusterLoadAssignment.
    assert_eq!(
        delta(
            &control_before,
            &control_first,
            "odmesh_xds_resources_sent_total"
        ),
        2
    );

    for _ in 0..20 {
        assert_routed_to(&mesh, "hello", "hello-1");
    }
    let control_later = mesh.control.wait_all_answered(SETTLE);
    assert_eq!(
        mesh.discovery_stats(),
        envoy_first,
        "later requests changed Envoy's discovery stats"
    );
    assert_eq!(
        control_later["odmesh_xds_requests_total"], control_first["odmesh_xds_requests_total"],
        "later requests made Envoy ask the control plane again"
    );
    assert_eq!(mesh.control.subscribed_clusters(), ["hello.vip"]);
    assert_eq!(hello.requests(), 21);
}

#[test]
fn fifty_concurrent_first_requests_to_a_new_vip_all_succeed_with_one_discovery() {
    let env = TestEnv::new("discovery_concurrent_first_requests");
    let hello = EchoUpstream::start("hello-1");
    let mesh = Arc::new(Mesh::start(&env, &[Instance::new("hello", hello.port())]));
    let envoy_before = mesh.discovery_stats();
    let control_before = mesh.control.wait_all_answered(SETTLE);

    const CLIENTS: usize = 50;
    let start = Arc::new(Barrier::new(CLIENTS));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let (mesh, start) = (mesh.clone(), start.clone());
            thread::spawn(move || {
                start.wait();
                timed(|| mesh.get("hello"))
            })
        })
        .collect();
    let mut slowest = Duration::ZERO;
    for client in clients {
        let (response, took) = client.join().expect("a client thread panicked");
        assert_eq!(response.status, 200, "{}", response.text());
        assert_eq!(response.json()["upstream"], "hello-1");
        slowest = slowest.max(took);
    }
    eprintln!("{CLIENTS} concurrent first requests to VIP hello: slowest {slowest:?}");

    let control_after = mesh.control.wait_all_answered(SETTLE);
    let envoy_after = mesh.discovery_stats();
    assert_eq!(hello.requests(), CLIENTS as u64);
    assert_eq!(
        delta(&envoy_before, &envoy_after, "cluster_manager.cluster_added"),
        1
    );
    assert_eq!(
        delta(
            &envoy_before,
            &envoy_after,
            "cluster_manager.odcds.update_success"
        ),
        1
    );
    assert_eq!(
        delta(
            &control_before,
            &control_after,
            "odmesh_xds_resources_sent_total"
        ),
        2
    );
    assert_eq!(mesh.control.subscribed_clusters(), ["hello.vip"]);
}

#[test]
fn twenty_vips_through_one_envoy_are_each_discovered_once_and_routed_to_their_own_upstream() {
    let env = TestEnv::new("discovery_twenty_vips");
    let upstreams: Vec<EchoUpstream> = (1..=20)
        .map(|i| EchoUpstream::start(&format!("svc-{i:02}-1")))
        .collect();
    let instances: Vec<Instance> = upstreams
        .iter()
        .enumerate()
        .map(|(i, u)| Instance::new(&format!("svc-{:02}", i + 1), u.port()))
        .collect();
    let mesh = Mesh::start(&env, &instances);
    let envoy_before = mesh.discovery_stats();
    let control_before = mesh.control.wait_all_answered(SETTLE);

    for round in 0..2 {
        for i in 1..=20 {
            assert_routed_to(&mesh, &format!("svc-{i:02}"), &format!("svc-{i:02}-1"));
        }
        let control_after = mesh.control.wait_all_answered(SETTLE);
        let envoy_after = mesh.discovery_stats();
        assert_eq!(
            delta(&envoy_before, &envoy_after, "cluster_manager.cluster_added"),
            20,
            "after round {round}"
        );
        assert_eq!(
            delta(
                &control_before,
                &control_after,
                "odmesh_xds_resources_sent_total"
            ),
            40,
            "after round {round}"
        );
    }
    let expected: Vec<String> = (1..=20).map(|i| format!("svc-{i:02}.vip")).collect();
    assert_eq!(mesh.control.subscribed_clusters(), expected);
    for upstream in &upstreams {
        assert_eq!(upstream.requests(), 2, "{}", upstream.name());
    }
}

/// Asserts a fast 503 whose JSON body gives `error` for `cluster`; returns how long it took.
/// `first`: the request also discovers the cluster.
fn assert_fast_503(mesh: &Mesh, host: &str, cluster: &str, error: &str, first: bool) -> Duration {
    let (response, took) = timed(|| mesh.get(host));
    assert_eq!(response.status, 503, "Host {host}: {}", response.text());
    let body: Value = serde_json::from_slice(&response.body).unwrap_or_else(|e| {
        panic!(
            "Host {host}: the 503 body is not JSON ({e}): {}",
            response.text()
        )
    });
    assert_eq!(body["error"], error, "Host {host}: {body}");
    assert_eq!(body["cluster"], cluster, "Host {host}: {body}");
    let bound = if first { FAST_FIRST } else { FAST };
    assert!(
        took < bound,
        "Host {host}: the 503 took {took:?}, over {bound:?}"
    );
    took
}

#[test]
fn an_unknown_vip_fails_fast_every_time_and_routes_within_two_seconds_once_registered() {
    let env = TestEnv::new("discovery_unknown_vip");
    let hello = EchoUpstream::start("hello-1");
    let mesh = Mesh::start(&env, &[Instance::new("hello", hello.port())]);
    // The bootstrap's own clusters (the control plane, the local service).
    let added_before = mesh.cluster_manager_stat("cluster_added");

    let not_registered = "VIP nobody is not registered";
    let mut times = Vec::new();
    for i in 0..10 {
        times.push(assert_fast_503(
            &mesh,
            "nobody",
            "nobody.vip",
            not_registered,
            i == 0,
        ));
    }
    let response = mesh.get("nobody");
    assert_eq!(response.json()["registered"], false, "{}", response.text());
    eprintln!(
        "unknown VIP nobody: 503 on the 1st try in {:?}, on the 10th in {:?} (slowest {:?})",
        times[0],
        times[9],
        times.iter().max().copied().unwrap_or_default()
    );
    // It was asked for once; later requests use the empty cluster Envoy holds.
    assert_eq!(mesh.control.subscribed_clusters(), ["nobody.vip"]);
    assert_eq!(
        mesh.cluster_manager_stat("cluster_added"),
        added_before + 1,
        "one cluster added: nobody.vip"
    );

    let nobody = EchoUpstream::start("nobody-1");
    mesh.registry.write_atomic(&[
        Instance::new("hello", hello.port()),
        Instance::new("nobody", nobody.port()),
    ]);
    let written = Instant::now();
    let took = wait_until_since(written, CHANGE_DEADLINE, "VIP nobody to route", || {
        let response = mesh.get("nobody");
        response.status == 200 && response.json()["upstream"] == "nobody-1"
    });
    eprintln!("VIP nobody routes {took:?} after it was added to the registry file");
    assert_routed_to(&mesh, "nobody", "nobody-1");
}

#[test]
fn a_registered_vip_whose_only_instance_is_down_answers_no_healthy_endpoint() {
    let env = TestEnv::new("discovery_vip_down");
    let lonely = EchoUpstream::start("lonely-1");
    let mesh = Mesh::start(
        &env,
        &[Instance::new("lonely", lonely.port()).status("DOWN")],
    );

    for i in 0..3 {
        assert_fast_503(
            &mesh,
            "lonely",
            "lonely.vip",
            "VIP lonely has no healthy endpoint: no instance of it is UP",
            i == 0,
        );
    }
    let response = mesh.get("lonely");
    assert_eq!(response.json()["registered"], true, "{}", response.text());
    assert_eq!(lonely.requests(), 0, "the DOWN instance got a request");
}

#[test]
fn a_vip_whose_instances_all_go_away_stays_a_cluster_that_fails_fast() {
    let env = TestEnv::new("discovery_vip_goes_away");
    let hello = EchoUpstream::start("hello-1");
    let other = EchoUpstream::start("other-1");
    let mesh = Mesh::start(
        &env,
        &[
            Instance::new("hello", hello.port()),
            Instance::new("other", other.port()),
        ],
    );
    assert_routed_to(&mesh, "hello", "hello-1");
    let added = mesh.cluster_manager_stat("cluster_added");

    mesh.registry
        .write_atomic(&[Instance::new("other", other.port())]);
    let written = Instant::now();
    let took = wait_until_since(written, CHANGE_DEADLINE, "VIP hello to answer 503", || {
        mesh.get("hello").status == 503
    });
    eprintln!("VIP hello answers 503 {took:?} after its instances left the registry file");
    for _ in 0..3 {
        // The cluster is held already (it answered 503 above): no discovery here.
        assert_fast_503(
            &mesh,
            "hello",
            "hello.vip",
            "VIP hello is not registered",
            false,
        );
    }
    assert_eq!(mesh.cluster_manager_stat("cluster_removed"), 0);
    assert_eq!(mesh.cluster_manager_stat("cluster_added"), added);
    let clusters = mesh.envoy.admin_get("/clusters").text();
    assert!(
        clusters.contains("hello.vip::"),
        "Envoy no longer has the cluster hello.vip:\n{clusters}"
    );
    assert_eq!(mesh.control.subscribed_clusters(), ["hello.vip"]);

    mesh.registry.write_atomic(&[
        Instance::new("other", other.port()),
        Instance::new("hello", hello.port()),
    ]);
    let written = Instant::now();
    let took = wait_until_since(written, CHANGE_DEADLINE, "VIP hello to route again", || {
        mesh.get("hello").status == 200
    });
    eprintln!("VIP hello routes again {took:?} after it came back to the registry file");
    assert_routed_to(&mesh, "hello", "hello-1");
    assert_eq!(mesh.cluster_manager_stat("cluster_added"), added);
}
