//! Failures around the chain, against real Envoy and `odmesh-control`: the control plane dies
//! and comes back, a proxy starts while it is down, the registry file breaks and is fixed,
//! Envoy rejects a cluster (NACK).
//! Traffic that can flow keeps flowing, what cannot fails in bounded time, and nothing
//! loops. Needs `make envoy`, `make wasm` and `cargo build -p odmesh-control`.

use std::time::{Duration, Instant};

use odmesh_e2e::{
    CHANGE_DEADLINE, EchoUpstream, Envoy, Instance, Mesh, Request, TestEnv, hold_for,
    odmesh_bootstrap, timed, wait_for, wait_until, wait_until_since,
};
use serde_json::Value;

/// The bootstrap's on-demand discovery timeout (`odcds.timeout` in envoy/odmesh.yaml).
const DISCOVERY_TIMEOUT: Duration = Duration::from_secs(1);
/// How long Envoy may take to rejoin a restarted control plane (its retry backoff is
/// 0.25 s to 2 s) and route a new VIP.
const RECONNECT_DEADLINE: Duration = Duration::from_secs(10);

#[test]
fn a_dead_control_plane_keeps_known_vips_working_fails_new_ones_in_bounded_time_and_is_rejoined() {
    let env = TestEnv::new("resilience_control_plane_restart");
    let hello = EchoUpstream::start("hello-1");
    let late = EchoUpstream::start("late-1");
    let again = EchoUpstream::start("again-1");
    let mut mesh = Mesh::start(
        &env,
        &[
            Instance::new("hello", hello.port()),
            Instance::new("late", late.port()),
            Instance::new("again", again.port()),
        ],
    );
    let envoy_pid = mesh.envoy.process().id();
    assert_eq!(mesh.route("hello"), "hello-1");

    mesh.control.kill();
    let killed = Instant::now();
    mesh.envoy.wait_xds_connected(false, Duration::from_secs(5));
    for _ in 0..5 {
        assert_eq!(mesh.route("hello"), "hello-1");
    }

    let (response, took) = timed(|| mesh.get("late"));
    eprintln!(
        "new VIP late while the control plane is down: {} after {took:?}",
        response.status
    );
    assert_eq!(response.status, 503, "{}", response.text());
    let body: Value = response.json();
    assert_eq!(
        body["error"], "cluster not discovered: the control plane did not answer in time",
        "{body}"
    );
    assert_eq!(body["cluster"], "late.vip", "{body}");
    assert!(
        took >= DISCOVERY_TIMEOUT.mul_f32(0.8) && took < DISCOVERY_TIMEOUT * 3,
        "the request for a new VIP should fail after about the discovery timeout \
         ({DISCOVERY_TIMEOUT:?}), it took {took:?}"
    );
    assert_eq!(late.requests(), 0);

    mesh.control.restart(&env, "control");
    let restarted = Instant::now();
    let took = wait_until_since(restarted, RECONNECT_DEADLINE, "VIP again to route", || {
        mesh.get("again").status == 200
    });
    eprintln!(
        "control plane restarted on the same xDS port ({:?} after it was killed): \
         a new VIP routes {took:?} later",
        restarted - killed
    );
    assert_eq!(mesh.route("again"), "again-1");
    assert_eq!(mesh.route("late"), "late-1");
    assert_eq!(mesh.route("hello"), "hello-1");
    assert_eq!(mesh.envoy.process().id(), envoy_pid);
    assert!(mesh.envoy.process().exit_status().is_none(), "Envoy exited");
    // On reconnect Envoy subscribed again to what it had, plus the new VIPs.
    let clusters = mesh.control.subscribed_clusters();
    for cluster in ["again.vip", "hello.vip", "late.vip"] {
        assert!(
            clusters.iter().any(|c| c == cluster),
            "{cluster} not in {clusters:?}"
        );
    }
}

#[test]
fn a_proxy_started_while_the_control_plane_is_down_answers_503_until_it_comes_then_routes() {
    let env = TestEnv::new("resilience_cold_start");
    let hello = EchoUpstream::start("hello-1");
    let mut mesh = Mesh::start(&env, &[Instance::new("hello", hello.port())]);
    assert_eq!(mesh.route("hello"), "hello-1");
    mesh.control.kill();

    // A new proxy, with no route and no cluster yet: it serves once its wait for the control
    // plane (`initial_fetch_timeout`) is over, and says why it cannot route.
    let cold = Envoy::start(&env, "cold", &odmesh_bootstrap(mesh.control.xds().port()));
    let egress = cold.listener(odmesh_e2e::mesh::EGRESS_LISTENER);
    let response = Request::get("/").host("hello").send(egress);
    assert_eq!(response.status, 503, "{}", response.text());
    let body: Value = response.json();
    assert_eq!(
        body["error"], "no route yet: the control plane has not answered",
        "{body}"
    );
    assert_eq!(hello.requests(), 1);

    mesh.control.restart(&env, "control");
    let restarted = Instant::now();
    let took = wait_until_since(
        restarted,
        RECONNECT_DEADLINE,
        "the new proxy to route",
        || Request::get("/").host("hello").send(egress).status == 200,
    );
    eprintln!("a proxy started while the control plane was down routes {took:?} after it came");
    // The proxy that had its route kept it all along.
    assert_eq!(mesh.route("hello"), "hello-1");
}

#[test]
fn a_broken_registry_file_keeps_the_last_good_registry_until_it_is_fixed() {
    let env = TestEnv::new("resilience_broken_registry");
    let first = EchoUpstream::start("hello-1");
    let second = EchoUpstream::start("hello-2");
    let mesh = Mesh::start(&env, &[Instance::new("hello", first.port())]);
    assert_eq!(mesh.route("hello"), "hello-1");
    assert_eq!(mesh.control.metric("odmesh_registry_load_errors_total"), 0);

    mesh.registry
        .write_text_in_place("instances:\n  - app: hello\n    ip: [127.0.0.1\n");
    wait_until(
        CHANGE_DEADLINE,
        "the control plane to count the broken registry file",
        || mesh.control.metric("odmesh_registry_load_errors_total") >= 1,
    );
    let source = mesh.control.debug_registry()["source"].clone();
    assert!(
        source["last_error"].as_str().is_some_and(|e| !e.is_empty()),
        "/debug/registry should show the error: {source}"
    );
    eprintln!("broken registry reported: {}", source["last_error"]);
    assert_eq!(mesh.control.admin_get("/readyz").status, 200);
    for _ in 0..5 {
        assert_eq!(mesh.route("hello"), "hello-1");
    }
    // A VIP asked for now is answered from the last good registry too.
    assert_eq!(mesh.get("other").status, 503);

    mesh.registry
        .write_in_place(&[Instance::new("hello", second.port())]);
    let written = Instant::now();
    let took = wait_until_since(written, CHANGE_DEADLINE, "hello to move to hello-2", || {
        mesh.route("hello") == "hello-2"
    });
    eprintln!("fixed registry file: routing follows it after {took:?}");
    let fixed = mesh.control.debug_registry()["source"].clone();
    assert!(
        fixed["last_error"].is_null(),
        "the error is still shown: {fixed}"
    );
    assert_eq!(mesh.route("hello"), "hello-2");
}

#[test]
fn a_cluster_envoy_rejects_is_reported_once_and_not_sent_again_in_a_loop() {
    let env = TestEnv::new("resilience_nack");
    // A CA file that looks like PEM (the control plane checks that much at start) but that
    // Envoy cannot load: every .svip cluster is rejected.
    let bad_ca = env.write_file(
        "bad-ca.pem",
        "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n",
    );
    let bad_ca = bad_ca.to_string_lossy().into_owned();
    let hello = EchoUpstream::start("hello-1");
    let mesh = Mesh::start_with(
        &env,
        &[
            Instance::new("hello", hello.port()),
            Instance::secure("hello", hello.port()),
        ],
        &["--upstream-ca", &bad_ca],
    );

    let (response, took) = timed(|| mesh.get("hello:8443"));
    eprintln!(
        "request to a rejected .svip cluster: {} after {took:?}",
        response.status
    );
    assert_eq!(response.status, 503, "{}", response.text());
    assert!(took < DISCOVERY_TIMEOUT * 3, "it took {took:?}");
    let nack = wait_for(
        Duration::from_secs(5),
        "the control plane to see the NACK",
        || {
            let proxies = mesh.control.proxies();
            let proxy = proxies.first()?;
            (proxy["nacks"] == 1).then(|| proxy["last_nack"].clone())
        },
    );
    let message = nack["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("hello.svip") && message.contains(&bad_ca),
        "the NACK should carry Envoy's error: {nack}"
    );
    assert_eq!(nack["resource_type"], "cluster", "{nack}");

    // A second request for the same cluster does not make the control plane send it again.
    assert_eq!(mesh.get("hello:8443").status, 503);
    let sent = mesh.control.metric("odmesh_xds_responses_total");
    hold_for(
        Duration::from_secs(1),
        "one NACK and no further responses",
        || {
            let m = mesh.control.metrics();
            m["odmesh_xds_nacks_total"] == 1 && m["odmesh_xds_responses_total"] == sent
        },
    );
    // The stream is still good for everything else.
    assert_eq!(mesh.route("hello"), "hello-1");
    assert_eq!(mesh.control.metric("odmesh_xds_nacks_total"), 1);
    assert_eq!(
        mesh.control.proxies().len(),
        1,
        "the xDS stream was replaced"
    );
}
