//! Eureka both ways, through real Envoy: real, unmodified Eureka client libraries (npm
//! `eureka-js-client`, PyPI `py-eureka-client`, and a Spring Boot service on Spring Cloud's
//! Eureka client, on each of its transports) register with odmesh's embedded registry and
//! their VIP routes, drains and expires; and odmesh follows a Eureka server in another
//! process (another `odmesh-control --serve-eureka`) through changes, an outage and a
//! failover. Needs `make envoy`, `make wasm`, `cargo build -p odmesh-control`, and the
//! clients from `scripts/install-eureka-clients.sh` and `scripts/install-eureka-java.sh` (the
//! client tests fail without them).

use std::net::TcpStream;
use std::time::{Duration, Instant};

use odmesh_e2e::{
    CHANGE_DEADLINE, ClientDriver, ControlPlane, EUREKA_INTERVAL, EchoUpstream, EurekaApi,
    EurekaClient, Mesh, Registration, Source, TestEnv, free_port, wait_for, wait_until,
    wait_until_since,
};
use serde_json::Value;

/// The lease the embedded registry and the real clients use: short, so expiry fits a test.
const LEASE_SECS: u64 = 3;
/// A killed client's instance must be gone by then: its lease, the eviction sweep (1 s),
/// and the push to Envoy.
const EXPIRY_DEADLINE: Duration = Duration::from_secs(LEASE_SECS + 5);
/// How soon a change in the other Eureka server must route through the follower: a poll,
/// then the push.
const FOLLOW_DEADLINE: Duration = Duration::from_secs(3);
/// How long the outage tests watch the follower on its last good state.
const OUTAGE_TIMEOUT: Duration = Duration::from_secs(10);

/// The 503 body's `error` for a VIP that is not registered (or no longer is).
fn not_registered(vip: &str) -> String {
    format!("VIP {vip} is not registered")
}

/// The 503 body's `error` for a VIP whose instances are all out of service.
fn no_healthy_endpoint(vip: &str) -> String {
    format!("VIP {vip} has no healthy endpoint: no instance of it is UP")
}

/// Whether `GET /` with `Host: vip` through Envoy reaches a driver's server that names
/// instance `id`.
fn routes_to_driver<R>(mesh: &Mesh<R>, vip: &str, id: &str) -> bool {
    let response = mesh.get(vip);
    response.status == 200 && response.text() == format!("hello from {id}\n")
}

/// Whether `GET /` with `Host: vip` through Envoy reaches the echo upstream `upstream`.
fn routes_to_echo<R>(mesh: &Mesh<R>, vip: &str, upstream: &str) -> bool {
    let response = mesh.get(vip);
    response.status == 200 && response.header("x-echo-upstream") == Some(upstream)
}

/// Whether `GET /` with `Host: vip` through Envoy fails with the mesh's 503 saying `error`
/// for the cluster `<vip>.vip`.
fn fails_with<R>(mesh: &Mesh<R>, vip: &str, error: &str) -> bool {
    let response = mesh.get(vip);
    let body: Value = serde_json::from_slice(&response.body).unwrap_or_default();
    response.status == 503 && body["error"] == error && body["cluster"] == format!("{vip}.vip")
}

/// Asserts the route to the echo upstream, with the answer when it is something else.
fn assert_routed_to_echo<R>(mesh: &Mesh<R>, vip: &str, upstream: &str) {
    let response = mesh.get(vip);
    assert!(
        response.status == 200 && response.header("x-echo-upstream") == Some(upstream),
        "Host {vip} did not reach {upstream}: {} {}",
        response.status,
        response.text()
    );
}

/// Asserts that Envoy still holds the cluster `<vip>.vip` (it was never removed).
fn assert_cluster_kept<R>(mesh: &Mesh<R>, vip: &str) {
    let clusters = mesh.envoy.admin_get("/clusters").text();
    assert!(
        clusters.contains(&format!("{vip}.vip::")),
        "Envoy no longer has the cluster {vip}.vip:\n{clusters}"
    );
    assert_eq!(mesh.cluster_manager_stat("cluster_removed"), 0);
}

/// The follower's `/readyz`: whether it answered 200, and the age of its last good fetch.
fn readiness<R>(mesh: &Mesh<R>) -> (bool, f64) {
    let response = mesh.control.admin_get("/readyz");
    let json = response.json();
    let age = json["registry"]["last_success_age_seconds"]
        .as_f64()
        .unwrap_or_else(|| panic!("/readyz has no registry.last_success_age_seconds: {json}"));
    (response.status == 200 && json["ready"] == true, age)
}

/// One real client's instance through the whole chain: register → routed, OUT_OF_SERVICE →
/// drained, back in service → routed, killed → lease expired, 503.
fn a_real_client_registers_routes_drains_and_expires(client: EurekaClient, test: &str) {
    client.require_installed();
    let env = TestEnv::new(test);
    let lease = LEASE_SECS.to_string();
    let mesh = Mesh::start_source(&env, Source::ServeEureka, &["--lease-duration", &lease]);
    let app = match client {
        EurekaClient::Js => "jsdemo",
        EurekaClient::Python => "pydemo",
        EurekaClient::Java => "javademo",
        EurekaClient::JavaJersey => "jerseydemo",
    };
    let id = format!("{app}-1");

    // Asked for before it exists: Envoy holds its empty cluster, the registration is pushed.
    assert!(
        fails_with(&mesh, app, &not_registered(app)),
        "{}",
        mesh.get(app).text()
    );

    let registration = Registration {
        app: app.to_owned(),
        id: id.clone(),
        heartbeat_secs: 1,
        lease_secs: LEASE_SECS,
        credentials: None,
    };
    let eureka = mesh.control.eureka_addr();
    let spawned = Instant::now();
    let mut driver = ClientDriver::start(&env, "driver", client, eureka, &registration);
    let port = driver.wait_listening(client.start_timeout());
    driver.wait_report("registered", client.start_timeout());
    let registered = Instant::now();
    let to_routed = wait_until_since(
        registered,
        CHANGE_DEADLINE,
        &format!("Host {app} to reach {id} through Envoy"),
        || routes_to_driver(&mesh, app, &id),
    );
    let from_spawn = spawned.elapsed();

    driver.command("out_of_service");
    let sent = Instant::now();
    let to_drained = wait_until_since(
        sent,
        CHANGE_DEADLINE,
        &format!("Host {app} to answer 503 no healthy endpoint after OUT_OF_SERVICE"),
        || fails_with(&mesh, app, &no_healthy_endpoint(app)),
    );
    let response = mesh.get(app);
    assert_eq!(response.json()["registered"], true, "{}", response.text());

    driver.command("in_service");
    let sent = Instant::now();
    let to_back = wait_until_since(
        sent,
        CHANGE_DEADLINE,
        &format!("Host {app} to reach {id} again once back in service"),
        || routes_to_driver(&mesh, app, &id),
    );

    // Killed hard, the client never cancels: only the lease expiry removes the instance.
    driver.kill();
    let killed = Instant::now();
    assert!(
        TcpStream::connect(("127.0.0.1", port)).is_err(),
        "the driver's server on port {port} still accepts connections after SIGKILL"
    );
    let to_expired = wait_until_since(
        killed,
        EXPIRY_DEADLINE,
        &format!("Host {app} to answer 503 not registered once the lease of {id} expired"),
        || fails_with(&mesh, app, &not_registered(app)),
    );
    // The lease runs from the last heartbeat, at most one heartbeat before the kill.
    let earliest = Duration::from_secs(LEASE_SECS - registration.heartbeat_secs);
    assert!(
        to_expired >= earliest,
        "{id} left {to_expired:?} after the kill, before its {LEASE_SECS} s lease could expire"
    );
    assert_cluster_kept(&mesh, app);
    assert!(mesh.control.metric("odmesh_eureka_evictions_total") >= 1);

    eprintln!(
        "{client}: registered → routed {to_routed:?} (process start → routed {from_spawn:?}); \
         OUT_OF_SERVICE → drained {to_drained:?}; \
         in service → routed {to_back:?}; SIGKILL → lease expired, 503 {to_expired:?} \
         (lease {LEASE_SECS} s)"
    );
}

#[test]
fn npm_eureka_js_client_registers_with_odmesh_and_its_vip_routes_drains_and_expires_through_envoy()
{
    a_real_client_registers_routes_drains_and_expires(EurekaClient::Js, "eureka_js_client");
}

#[test]
fn pypi_py_eureka_client_registers_with_odmesh_and_its_vip_routes_drains_and_expires_through_envoy()
{
    a_real_client_registers_routes_drains_and_expires(EurekaClient::Python, "eureka_py_client");
}

#[test]
fn a_spring_service_on_rest_client_registers_with_odmesh_and_its_vip_routes_drains_and_expires_through_envoy()
 {
    a_real_client_registers_routes_drains_and_expires(EurekaClient::Java, "eureka_java_client");
}

#[test]
fn a_spring_service_on_jersey_3_registers_with_odmesh_and_its_vip_routes_drains_and_expires_through_envoy()
 {
    a_real_client_registers_routes_drains_and_expires(
        EurekaClient::JavaJersey,
        "eureka_jersey_client",
    );
}

#[test]
fn odmesh_follows_a_eureka_server_in_another_process_through_changes_and_an_outage() {
    let env = TestEnv::new("eureka_follower");
    let follow = EchoUpstream::start("follow-1");
    let mut server = ControlPlane::start_source(&env, "eureka-server", Source::ServeEureka, &[]);
    let eureka = EurekaApi::new(server.eureka_addr());
    let mesh = Mesh::start_source(&env, Source::Eureka(vec![server.eureka_url()]), &[]);
    assert!(fails_with(&mesh, "follow", &not_registered("follow")));

    // A registration in the other process routes through the follower's Envoy.
    eureka.register("follow", "follow-1", follow.port());
    let to_routed = wait_until_since(
        Instant::now(),
        FOLLOW_DEADLINE,
        "Host follow to route through the follower",
        || routes_to_echo(&mesh, "follow", "follow-1"),
    );

    // A status change there drains it here, and back.
    eureka.set_status("follow", "follow-1", "OUT_OF_SERVICE");
    let to_drained = wait_until_since(
        Instant::now(),
        FOLLOW_DEADLINE,
        "Host follow to drain through the follower",
        || fails_with(&mesh, "follow", &no_healthy_endpoint("follow")),
    );
    eureka.remove_status_override("follow", "follow-1");
    let to_back = wait_until_since(
        Instant::now(),
        FOLLOW_DEADLINE,
        "Host follow to route again through the follower",
        || routes_to_echo(&mesh, "follow", "follow-1"),
    );

    // The Eureka server dies: the follower keeps its last good state, counts failed fetches,
    // and its registry ages, while it stays ready.
    let errors_before = mesh.control.metric("odmesh_eureka_fetch_errors_total");
    server.kill();
    let killed = Instant::now();
    let mut routed = 0;
    let mut during_outage = || {
        assert_routed_to_echo(&mesh, "follow", "follow-1");
        routed += 1;
        let errors = mesh.control.metric("odmesh_eureka_fetch_errors_total");
        let metric_age = mesh
            .control
            .metric("odmesh_registry_last_success_age_seconds");
        let (ready, age) = readiness(&mesh);
        assert!(ready, "the follower is not ready while Eureka is down");
        (errors, metric_age, age)
    };
    let (errors_1, _, age_1) = wait_for(
        OUTAGE_TIMEOUT,
        "the follower to count failed fetches",
        || {
            let sample = during_outage();
            (sample.0 >= errors_before + 2).then_some(sample)
        },
    );
    let (errors_2, metric_age_2, age_2) = wait_for(
        OUTAGE_TIMEOUT,
        "the follower's failed fetches and registry age to grow",
        || {
            let sample = during_outage();
            (sample.0 > errors_1 && sample.1 >= 2 && sample.2 >= age_1 + 1.0).then_some(sample)
        },
    );
    let outage = killed.elapsed();

    // Back on the same port (empty, as a restarted Eureka server is): the follower fetches
    // again, follows it to empty, then routes a new registration.
    server.restart(&env, "eureka-server");
    let restarted = Instant::now();
    let to_fetched = wait_until_since(
        restarted,
        FOLLOW_DEADLINE,
        "the follower to fetch from the restarted Eureka server",
        || readiness(&mesh).1 < 1.0 && fails_with(&mesh, "follow", &not_registered("follow")),
    );
    let errors_after = mesh.control.metric("odmesh_eureka_fetch_errors_total");
    eureka.register("follow", "follow-1", follow.port());
    let to_rerouted = wait_until_since(
        Instant::now(),
        FOLLOW_DEADLINE,
        "Host follow to route through the follower after the restart",
        || routes_to_echo(&mesh, "follow", "follow-1"),
    );
    assert_eq!(
        mesh.control.metric("odmesh_eureka_fetch_errors_total"),
        errors_after,
        "the follower still fails to fetch from the restarted server"
    );
    assert_cluster_kept(&mesh, "follow");

    eprintln!(
        "follower (interval {EUREKA_INTERVAL} s): registered → routed {to_routed:?}; \
         OUT_OF_SERVICE → drained {to_drained:?}; override removed → routed {to_back:?}"
    );
    eprintln!(
        "follower outage of {outage:?}: {routed} requests routed on the last good state; \
         fetch errors {errors_before} → {errors_2}; /readyz age {age_1:.2} s → {age_2:.2} s \
         (metric {metric_age_2} s); server back → follower fetched {to_fetched:?}; \
         registered again → routed {to_rerouted:?}"
    );
}

#[test]
fn odmesh_fails_over_to_the_next_eureka_server_when_the_first_is_down() {
    let env = TestEnv::new("eureka_failover");
    let early = EchoUpstream::start("early-1");
    let late = EchoUpstream::start("late-1");
    let server = ControlPlane::start_source(&env, "eureka-server", Source::ServeEureka, &[]);
    let eureka = EurekaApi::new(server.eureka_addr());
    eureka.register("early", "early-1", early.port());

    let dead = format!("http://127.0.0.1:{}/eureka", free_port());
    let mesh = Mesh::start_source(&env, Source::Eureka(vec![dead, server.eureka_url()]), &[]);
    // The first fetch failed over to the live server.
    wait_until(
        FOLLOW_DEADLINE,
        "Host early to route through the follower",
        || routes_to_echo(&mesh, "early", "early-1"),
    );
    assert!(mesh.control.metric("odmesh_eureka_failovers_total") >= 1);

    // Later changes come from the live server too.
    eureka.register("late", "late-1", late.port());
    let to_routed = wait_until_since(
        Instant::now(),
        FOLLOW_DEADLINE,
        "Host late to route through the follower",
        || routes_to_echo(&mesh, "late", "late-1"),
    );
    assert!(readiness(&mesh).0, "the follower is not ready");
    eprintln!("failover: a registration on the second Eureka server routes in {to_routed:?}");
}
