//! A mixed Eureka cluster, through real Envoy: odmesh's embedded registry (`odmesh-control
//! --serve-eureka ADDR --peer URL`) as a peer of a real Spring Cloud Netflix Eureka server,
//! the real server listing odmesh as its peer, and a Spring Boot service on Eureka's client
//! registered with the real server, as a fleet that moves onto odmesh starts. Its VIP routes
//! through Envoy, drains and comes back, and keeps routing when the real server dies: nothing
//! is lost. Needs `make envoy`, `make wasm`, `cargo build -p odmesh-control`, Java and the
//! jars from `scripts/install-eureka-java.sh`.

use std::time::{Duration, Instant};

use odmesh_e2e::{
    ClientDriver, EurekaClient, JavaEureka, Load, LoadConfig, MAX_LATENCY, Mesh, Registration,
    Source, TestEnv, reserve_addrs, wait_until,
};

/// Bounds a change's way from the real server to Envoy: a batch to odmesh (the real server
/// sends one within half a second), the push; far above it, for a busy machine.
const CHANGE_TIMEOUT: Duration = Duration::from_secs(30);

/// Whether `GET /` with `Host: vip` through Envoy reaches the driver's server of `id`.
fn routes_to<R>(mesh: &Mesh<R>, vip: &str, id: &str) -> bool {
    let response = mesh.get(vip);
    response.status == 200 && response.text() == format!("hello from {id}\n")
}

#[test]
fn a_service_registered_with_a_real_eureka_server_routes_through_its_odmesh_peer_and_outlives_the_server()
 {
    let client = EurekaClient::Java;
    client.require_installed();
    let env = TestEnv::new("eureka_mixed_cluster");
    let [odmesh_addr, real_addr] = reserve_addrs(2)[..] else {
        unreachable!("two addresses")
    };
    let real_url = format!("http://{real_addr}/eureka");
    let odmesh_url = format!("http://{odmesh_addr}/eureka");
    let mesh = Mesh::start_source(
        &env,
        Source::Peer {
            addr: odmesh_addr,
            peers: vec![real_url.clone()],
        },
        &["--registry-warmup", "0", "--lease-duration", "3"],
    );
    let mut real = JavaEureka::builder()
        .addr(real_addr)
        .peers(std::slice::from_ref(&odmesh_url))
        .start(&env, "eureka");

    // The service knows both servers, the real one first, as a fleet's clients list theirs.
    let registration = Registration {
        app: "javademo".into(),
        id: "javademo-1".into(),
        heartbeat_secs: 1,
        lease_secs: 3,
        credentials: None,
    };
    let mut driver = ClientDriver::start_with_urls(
        &env,
        "javademo",
        client,
        &[real.url(), odmesh_url],
        &registration,
        &[],
    );
    driver.wait_listening(client.start_timeout());
    driver.wait_report("registered", client.start_timeout());
    let registered = Instant::now();
    wait_until(CHANGE_TIMEOUT, "javademo to route through Envoy", || {
        routes_to(&mesh, "javademo", "javademo-1")
    });
    let to_routed = registered.elapsed();

    // An operator drains it on the real server: odmesh takes the override, Envoy lets it go;
    // removed, it comes back (the client registers again on the real server).
    real.api()
        .set_status("javademo", "javademo-1", "OUT_OF_SERVICE");
    wait_until(CHANGE_TIMEOUT, "javademo drained through Envoy", || {
        mesh.get("javademo").status == 503
    });
    real.api().remove_status_override("javademo", "javademo-1");
    wait_until(CHANGE_TIMEOUT, "javademo back through Envoy", || {
        routes_to(&mesh, "javademo", "javademo-1")
    });

    // The real server dies under load: the service heartbeats to odmesh instead, and not one
    // request fails.
    let load = Load::hosts(
        mesh.egress(),
        &["javademo"],
        LoadConfig::rate(50).keep_alive(),
    );
    load.wait_completed(25, CHANGE_TIMEOUT);
    load.mark("real server killed");
    real.kill();
    // Longer than the instance's lease: only heartbeats reaching odmesh keep it.
    load.wait_completed(250, CHANGE_TIMEOUT);
    let report = load.stop();
    eprintln!("{}", report.summary());
    report.assert_no_failures(&["javademo"]);
    report.assert_answered_within(MAX_LATENCY);
    eprintln!("registered on the real server → routed through its odmesh peer in {to_routed:?}");
}
