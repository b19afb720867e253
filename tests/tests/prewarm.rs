//! Prewarm against real Envoy and `odmesh-control`: a proxy that restarts holds the clusters
//! its service used before it serves its first request; the history survives a restart of
//! the control plane (SIGKILL included); a VIP gone from the registry is not sent ahead;
//! Envoy's load reports count a cluster sent ahead as used (the hit rate); a cluster sent ahead
//! that carries no request is removed, and comes back on demand; with prewarm off the wildcard
//! subscription of the shipped bootstrap is still answered at once. Needs
//! `make envoy`, `make wasm`/`make native` and `cargo build -p odmesh-control`.

use std::fs;
use std::time::{Duration, Instant};

use odmesh_e2e::{EchoUpstream, Instance, Mesh, TestEnv, wait_until_since};
use serde_json::Value;

/// How long the history may take to reach its file (written every 2 s).
const SAVED: Duration = Duration::from_secs(10);
/// How long a load report may take to arrive (the tests ask for one every second).
const REPORTED: Duration = Duration::from_secs(10);

/// The clusters `/debug/prewarm` predicts for the calling service `odmesh` (the shipped
/// bootstrap's `node.cluster`), sorted.
fn predicted(prewarm: &Value) -> Vec<String> {
    let mut names: Vec<String> = (prewarm["services"]["odmesh"]["predicted"].as_array())
        .map(|entries| {
            (entries.iter())
                .filter_map(|e| e["cluster"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// Whether the history file names `cluster`.
fn file_names(path: &std::path::Path, cluster: &str) -> bool {
    fs::read_to_string(path).is_ok_and(|text| text.contains(&format!("\"{cluster}\"")))
}

/// Asserts that Envoy holds exactly `clusters`, each with the upstreams of `hosts`, before
/// any request was sent to it.
fn assert_held(mesh: &Mesh, clusters: &[&str]) {
    assert_eq!(
        mesh.envoy_clusters(),
        clusters,
        "clusters Envoy holds at start"
    );
    for cluster in clusters {
        assert!(
            !mesh.envoy.cluster_hosts(cluster).is_empty(),
            "{cluster} was sent ahead without its endpoints"
        );
    }
}

/// Echo upstreams `hello-1` and `world-1` for the VIPs hello and world, a mesh over them
/// (`control_args` for the control plane), and a request to each through the first Envoy,
/// which held nothing before: the history of the service `odmesh` then holds both.
fn mesh_that_used_hello_and_world(
    env: &TestEnv,
    control_args: &[&str],
) -> (Mesh, EchoUpstream, EchoUpstream) {
    let hello = EchoUpstream::start("hello-1");
    let world = EchoUpstream::start("world-1");
    let mesh = Mesh::start_with(
        env,
        &[
            Instance::new("hello", hello.port()),
            Instance::new("world", world.port()),
        ],
        control_args,
    );
    assert!(
        mesh.envoy_clusters().is_empty(),
        "no history yet: nothing ahead"
    );
    assert_eq!(mesh.route("hello"), "hello-1");
    assert_eq!(mesh.route("world"), "world-1");
    (mesh, hello, world)
}

#[test]
fn a_restarted_proxy_holds_its_services_clusters_before_its_first_request() {
    let env = TestEnv::new("prewarm_proxy_restart");
    let (mut mesh, _hello, _world) = mesh_that_used_hello_and_world(&env, &[]);
    assert_eq!(
        predicted(&mesh.control.prewarm()),
        ["hello.vip", "world.vip"]
    );

    let asked_before = mesh.control.metric("odmesh_prewarm_asked_total");
    mesh.restart_envoy(&env, "envoy-2");
    assert_held(&mesh, &["hello.vip", "world.vip"]);

    // Routed without asking the control plane: no on-demand request reached it.
    assert_eq!(mesh.route("hello"), "hello-1");
    assert_eq!(
        mesh.control.metric("odmesh_prewarm_asked_total"),
        asked_before
    );
    let proxy = mesh.control.proxies().pop().expect("a connected proxy");
    assert_eq!(proxy["wildcard"], true);
    assert_eq!(proxy["prewarmed"], 2);

    // Envoy's load reports say hello.vip carries requests: one of the two sent ahead was
    // used; world.vip was not (yet). (Envoy reports on a cluster only from the control plane's
    // answer after it got it, so requests keep coming meanwhile, as a service's would.)
    let since = Instant::now();
    wait_until_since(
        since,
        REPORTED,
        "a load report to count hello.vip as used",
        || {
            assert_eq!(mesh.route("hello"), "hello-1");
            mesh.control.prewarm()["services"]["odmesh"]["used"] == 1
        },
    );
    let service = &mesh.control.prewarm()["services"]["odmesh"];
    assert_eq!(service["pushed"], 2);
    assert_eq!(service["hit_rate"], 0.5);
}

#[test]
fn the_history_survives_a_control_plane_killed_and_restarted() {
    let env = TestEnv::new("prewarm_control_restart");
    let hello = EchoUpstream::start("hello-1");
    let mut mesh = Mesh::start(&env, &[Instance::new("hello", hello.port())]);
    assert_eq!(mesh.route("hello"), "hello-1");
    let file = env.log_dir().join("control-prewarm.json");
    let since = Instant::now();
    wait_until_since(since, SAVED, "the history file to name hello.vip", || {
        file_names(&file, "hello.vip")
    });

    // A crash: no chance to write anything more. The new process reads the file.
    mesh.control.kill();
    mesh.control.restart(&env, "control");
    assert_eq!(predicted(&mesh.control.prewarm()), ["hello.vip"]);
    mesh.restart_envoy(&env, "envoy-2");
    assert_held(&mesh, &["hello.vip"]);
    assert_eq!(mesh.route("hello"), "hello-1");
}

#[test]
fn a_vip_gone_from_the_registry_is_not_sent_ahead_and_still_answers_on_demand() {
    let env = TestEnv::new("prewarm_deregistered");
    let (mut mesh, hello, _world) = mesh_that_used_hello_and_world(&env, &[]);

    mesh.registry
        .write_atomic(&[Instance::new("hello", hello.port())]);
    let since = Instant::now();
    wait_until_since(
        since,
        Duration::from_secs(5),
        "world to leave the registry",
        || predicted(&mesh.control.prewarm()) == ["hello.vip"],
    );
    mesh.restart_envoy(&env, "envoy-2");
    assert_held(&mesh, &["hello.vip"]);
    // Asked for, world is answered as any unknown VIP: a fast 503 that says so.
    let response = mesh.get("world");
    assert_eq!(response.status, 503, "{}", response.text());
    assert!(
        response.text().contains("not registered"),
        "{}",
        response.text()
    );
    assert_eq!(mesh.route("hello"), "hello-1");
}

#[test]
fn with_prewarm_off_the_shipped_bootstrap_starts_at_once_and_discovers_on_demand() {
    let env = TestEnv::new("prewarm_off");
    let hello = EchoUpstream::start("hello-1");
    let started = Instant::now();
    let mut mesh = Mesh::start_with(
        &env,
        &[Instance::new("hello", hello.port())],
        &["--no-prewarm"],
    );
    // The wildcard subscription is answered at once: Envoy does not wait out the 1 s
    // initial_fetch_timeout before it serves.
    let took = started.elapsed();
    eprintln!("control plane and Envoy ready in {took:?}");
    assert_eq!(mesh.route("hello"), "hello-1");
    assert_eq!(mesh.control.prewarm()["enabled"], false);
    mesh.restart_envoy(&env, "envoy-2");
    assert!(mesh.envoy_clusters().is_empty(), "nothing sent ahead");
    assert_eq!(
        mesh.envoy
            .stat("cluster_manager.cds.init_fetch_timeout")
            .expect("Envoy counts its CDS initial fetch timeouts"),
        0,
        "Envoy waited for its first cluster answer until the timeout"
    );
    assert_eq!(mesh.route("hello"), "hello-1");
}

#[test]
fn an_idle_cluster_sent_ahead_is_removed_and_comes_back_on_demand_when_needed() {
    let env = TestEnv::new("prewarm_idle_eviction");
    let (mut mesh, _hello, _world) =
        mesh_that_used_hello_and_world(&env, &["--idle-cluster-timeout", "3"]);
    mesh.restart_envoy(&env, "envoy-2");
    assert_held(&mesh, &["hello.vip", "world.vip"]);

    // hello.vip carries requests all along; world.vip none: after 3 s of load reports saying
    // so, world.vip is removed, and hello.vip never is.
    let since = Instant::now();
    wait_until_since(
        since,
        Duration::from_secs(20),
        "world.vip removed as idle",
        || {
            assert_eq!(mesh.route("hello"), "hello-1");
            let held = mesh.envoy_clusters();
            assert!(
                held.contains(&"hello.vip".to_owned()),
                "a used cluster was removed: {held:?}"
            );
            held == ["hello.vip"]
        },
    );
    assert_eq!(mesh.control.metric("odmesh_idle_clusters_evicted_total"), 1);

    // Needed again, it is asked for by name and routes (a cluster Envoy had asked for itself
    // would not be asked for again: the request would get a 503 after the discovery timeout).
    let asked = mesh.control.metric("odmesh_prewarm_asked_total");
    assert_eq!(mesh.route("world"), "world-1");
    assert_eq!(mesh.control.metric("odmesh_prewarm_asked_total"), asked + 1);
    assert_eq!(mesh.envoy_clusters(), ["hello.vip", "world.vip"]);
}
