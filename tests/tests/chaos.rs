//! Faults under steady load, through real Envoy and `odmesh-control`, with every request's
//! outcome counted: the control plane killed (SIGKILL) and restarted with each registry
//! source (the embedded registry, Eureka up, Eureka down, a file); Eureka down, hanging and
//! answering garbage or an empty registry; an instance drained and then stopped; a flood of
//! random Hosts through one Envoy and of xDS names from a raw client. Not one request to a
//! VIP that keeps an UP instance may fail or be held, and memory stays bounded.
//! Needs `make envoy`, `make wasm`, `cargo build -p odmesh-control` and the Eureka clients
//! (`scripts/install-eureka-clients.sh`).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use odmesh_e2e::fake_eureka::{ALL_GARBAGE, Mode};
use odmesh_e2e::mesh::EGRESS_LISTENER;
use odmesh_e2e::{
    ClientDriver, EchoUpstream, Envoy, EurekaClient, FakeEureka, FloodOptions, Instance, Load,
    LoadConfig, LoadReport, MAX_LATENCY, Mesh, Registration, Request, RssSampler, Source, TestEnv,
    XdsFlood, odmesh_bootstrap, wait_for, wait_until,
};
use serde_json::Value;

/// Requests per second on each VIP under load.
const RATE: u32 = 50;
/// Requests the load completes in a phase: one second's worth.
const PHASE: u64 = RATE as u64;
/// The longest a first request to a new VIP may take while another client floods the control
/// plane: about a millisecond when nothing else runs (docs/benchmarks.md, 1.), a few more
/// beside a flood (9.); a request held behind the flood's batch waited 400-600 ms here.
const MAX_FIRST_REQUEST: Duration = Duration::from_millis(250);
/// VIPs registered for the flood test's first requests (50 a second while it runs).
const FRESH_VIPS: u64 = 500;
/// How long anything in a scenario may take: a restart, a reconnect, a re-registration.
const DEADLINE: Duration = Duration::from_secs(15);
/// The lease of the real clients' instances, and their heartbeat.
const LEASE_SECS: u64 = 5;
const HEARTBEAT_SECS: u64 = 1;
/// How long a driver's `stop_within` lets the client deregister before it exits anyway.
const STOP_WITHIN: Duration = Duration::from_secs(5);

/// Steady load on `hosts` through `mesh`'s Envoy.
fn load<R>(mesh: &Mesh<R>, hosts: &[&str]) -> Load {
    let load = Load::hosts(mesh.egress(), hosts, LoadConfig::rate(RATE).keep_alive());
    load.wait_completed(PHASE, DEADLINE);
    load
}

/// Stops `load`, prints its report, and asserts that no request to `hosts` failed and that
/// none was held.
fn assert_nothing_failed(load: Load, hosts: &[&str]) -> LoadReport {
    let report = load.stop();
    eprintln!("{}", report.summary());
    report.assert_no_failures(hosts);
    report.assert_answered_within(MAX_LATENCY);
    report
}

/// Waits until `/readyz` says the registry in use is complete.
fn wait_complete<R>(mesh: &Mesh<R>) {
    wait_until(DEADLINE, "the registry to be complete", || {
        mesh.control.readyz()["registry"]["complete"] == true
    });
}

/// Waits until the control plane's log (of its latest start) says a reconnecting proxy kept
/// what it held while the registry was loading. The control plane lists the proxy as soon as
/// its stream opens, a moment before it reads the first request and logs this.
fn wait_kept_while_loading<R>(mesh: &Mesh<R>, what: &str) {
    wait_until(DEADLINE, what, || {
        mesh.control
            .process()
            .log()
            .contains("proxy reconnected with resources it kept")
    });
}

/// The error of a 503 answer's JSON body.
fn error_of(response: &odmesh_e2e::Response) -> String {
    let body: Value = serde_json::from_slice(&response.body).unwrap_or_default();
    body["error"].as_str().unwrap_or_default().to_owned()
}

#[test]
fn restarting_the_control_plane_with_its_embedded_registry_fails_no_request_to_a_known_vip() {
    let client = EurekaClient::Js;
    client.require_installed();
    let env = TestEnv::new("chaos_restart_embedded");
    let lease = LEASE_SECS.to_string();
    // A short warm-up: the clients heartbeat every second, so all are back within it.
    let args = ["--registry-warmup", "3", "--lease-duration", &lease];
    let mut mesh = Mesh::start_source(&env, Source::ServeEureka, &args);
    let registration = Registration {
        app: "chaos".into(),
        id: "chaos-1".into(),
        heartbeat_secs: HEARTBEAT_SECS,
        lease_secs: LEASE_SECS,
        credentials: None,
    };
    let mut driver = ClientDriver::start(
        &env,
        "driver",
        client,
        mesh.control.eureka_addr(),
        &registration,
    );
    driver.wait_report("registered", DEADLINE);
    wait_until(DEADLINE, "chaos to route", || {
        mesh.get("chaos").status == 200
    });

    let load = load(&mesh, &["chaos"]);
    load.mark("control plane killed");
    mesh.control.kill();
    mesh.envoy.wait_xds_connected(false, DEADLINE);
    load.wait_completed(PHASE / 2, DEADLINE);
    load.mark("control plane restarted");
    mesh.control.restart(&env, "control");
    mesh.wait_connected(DEADLINE);
    // Requests while Envoy is back on a control plane whose registry is loading.
    load.wait_completed(PHASE / 2, DEADLINE);
    // The client's next heartbeat gets 404, and it registers again.
    wait_until(DEADLINE, "the client to register again", || {
        mesh.control.debug_registry()["registry"]["instances"]
            .as_array()
            .is_some_and(|list| list.iter().any(|i| i["instance_id"] == "chaos-1"))
    });
    load.mark("the client registered again");
    wait_complete(&mesh);
    load.mark("the registry is complete");
    load.wait_completed(PHASE, DEADLINE);
    assert_nothing_failed(load, &["chaos"]);
    wait_kept_while_loading(
        &mesh,
        "the restarted control plane to see Envoy reconnect with what it held",
    );
}

#[test]
fn restarting_the_control_plane_that_follows_eureka_fails_no_request_whether_eureka_is_up_or_down()
{
    let env = TestEnv::new("chaos_restart_eureka");
    let upstream = EchoUpstream::start("chaos-1");
    let eureka = FakeEureka::start(&[Instance::new("chaos", upstream.port())]);
    let mut mesh = Mesh::start_source(&env, Source::Eureka(vec![eureka.url()]), &[]);
    assert_eq!(mesh.route("chaos"), "chaos-1");
    let load = load(&mesh, &["chaos"]);

    // Eureka up: the restarted control plane loads it at once.
    load.mark("control plane killed, Eureka up");
    mesh.control.kill();
    mesh.envoy.wait_xds_connected(false, DEADLINE);
    mesh.control.restart(&env, "control");
    mesh.wait_connected(DEADLINE);
    load.mark("restarted, Eureka up");
    load.wait_completed(PHASE, DEADLINE);

    // Eureka down: the restarted control plane has no registry at all for a while.
    eureka.set_mode(Mode::Down);
    load.mark("control plane killed, Eureka down");
    mesh.control.kill();
    mesh.envoy.wait_xds_connected(false, DEADLINE);
    mesh.control.restart_unready(&env, "control");
    mesh.wait_connected(DEADLINE);
    load.mark("restarted, Eureka down");
    assert_eq!(mesh.control.readyz()["ready"], false);
    wait_kept_while_loading(&mesh, "Envoy's kept clusters to be left alone");
    load.wait_completed(2 * PHASE, DEADLINE);
    // A VIP nobody asked for before is not known yet, and says so.
    let response = mesh.get("fresh");
    assert_eq!(response.status, 503, "{}", response.text());
    assert_eq!(
        error_of(&response),
        "VIP fresh is not known yet: the control plane is still loading its registry"
    );

    eureka.set_mode(Mode::Normal);
    load.mark("Eureka back");
    wait_complete(&mesh);
    load.wait_completed(PHASE, DEADLINE);
    assert_nothing_failed(load, &["chaos"]);
    // "fresh" was a new VIP: once Eureka is back it is simply not registered.
    wait_until(DEADLINE, "fresh to be not registered", || {
        error_of(&mesh.get("fresh")) == "VIP fresh is not registered"
    });
}

#[test]
fn restarting_the_control_plane_over_a_registry_file_fails_no_request() {
    let env = TestEnv::new("chaos_restart_file");
    let upstream = EchoUpstream::start("chaos-1");
    let mut mesh = Mesh::start(&env, &[Instance::new("chaos", upstream.port())]);
    assert_eq!(mesh.route("chaos"), "chaos-1");
    let load = load(&mesh, &["chaos"]);
    for round in 1..=2 {
        load.mark(&format!("control plane killed ({round})"));
        mesh.control.kill();
        mesh.envoy.wait_xds_connected(false, DEADLINE);
        load.wait_completed(PHASE / 2, DEADLINE);
        mesh.control.restart(&env, "control");
        mesh.wait_connected(DEADLINE);
        load.mark(&format!("restarted ({round})"));
        load.wait_completed(PHASE, DEADLINE);
    }
    assert_nothing_failed(load, &["chaos"]);
}

/// `n` instances of VIPs that no request asks for: enough registry for the drop guard to
/// judge a drop (it holds one only from 10 instances up).
fn bystanders(n: u16) -> Vec<Instance> {
    (0..n)
        .map(|i| Instance::new(&format!("bystander-{i}"), 9).id(&format!("b-{i}")))
        .collect()
}

#[test]
fn eureka_down_hanging_answering_garbage_or_an_empty_registry_fails_no_request() {
    let env = TestEnv::new("chaos_eureka_outages");
    let upstream = EchoUpstream::start("chaos-1");
    let mut instances = bystanders(12);
    instances.push(Instance::new("chaos", upstream.port()));
    let eureka = FakeEureka::start(&instances);
    let mesh = Mesh::start_source(
        &env,
        Source::Eureka(vec![eureka.url()]),
        &[
            "--eureka-interval",
            "0.3",
            "--eureka-request-timeout",
            "1",
            "--registry-drop-confirm",
            "60",
        ],
    );
    assert_eq!(mesh.route("chaos"), "chaos-1");
    let load = load(&mesh, &["chaos"]);
    let errors = |mesh: &Mesh<()>| mesh.control.metric("odmesh_eureka_fetch_errors_total");

    let mut modes = vec![Mode::Down, Mode::Hanging, Mode::Empty];
    modes.extend(ALL_GARBAGE.iter().map(|g| Mode::Garbage(*g)));
    for mode in modes {
        let before = errors(&mesh);
        eureka.set_mode(mode);
        load.mark(&format!("Eureka {mode:?}"));
        if mode == Mode::Empty {
            // A good answer, but one that loses the whole registry: held, not followed.
            wait_until(DEADLINE, "the empty registry to be held", || {
                mesh.control.metric("odmesh_registry_drop_held") == 1
            });
        } else {
            // A hanging Eureka fails a fetch at --eureka-request-timeout.
            wait_until(
                DEADLINE,
                "the control plane to count a failed fetch",
                || errors(&mesh) > before,
            );
        }
        load.wait_completed(PHASE, DEADLINE);
        eureka.set_mode(Mode::Normal);
        load.mark(&format!("Eureka back from {mode:?}"));
        wait_until(DEADLINE, "a good fetch again", || {
            mesh.control.readyz()["registry"]["last_error"].is_null()
                && mesh.control.metric("odmesh_registry_drop_held") == 0
        });
    }
    load.wait_completed(PHASE, DEADLINE);
    let report = assert_nothing_failed(load, &["chaos"]);
    assert_eq!(mesh.control.metric("odmesh_registry_drops_held_total"), 1);
    assert_eq!(mesh.control.metric("odmesh_registry_instances"), 13);
    eprintln!(
        "fetch errors counted: {}; {} requests, none failed",
        errors(&mesh),
        report.sent()
    );
}

/// The ports Envoy lists for `cluster`.
fn envoy_ports<R>(mesh: &Mesh<R>, cluster: &str) -> BTreeSet<u16> {
    (mesh.envoy.cluster_hosts(cluster).iter())
        .filter_map(|address| address.rsplit_once(':')?.1.parse().ok())
        .collect()
}

#[test]
fn an_instance_drained_with_its_client_then_stopped_fails_no_request_of_its_vip() {
    let client = EurekaClient::Python;
    client.require_installed();
    let env = TestEnv::new("chaos_churn_embedded");
    let lease = LEASE_SECS.to_string();
    let mesh = Mesh::start_source(&env, Source::ServeEureka, &["--lease-duration", &lease]);
    let eureka = mesh.control.eureka_addr();
    let mut drivers: Vec<(ClientDriver, u16)> = (1..=2)
        .map(|n| {
            let registration = Registration {
                app: "churn".into(),
                id: format!("churn-{n}"),
                heartbeat_secs: HEARTBEAT_SECS,
                lease_secs: LEASE_SECS,
                credentials: None,
            };
            let mut driver =
                ClientDriver::start(&env, &format!("driver-{n}"), client, eureka, &registration);
            let port = driver.wait_listening(DEADLINE);
            driver.wait_report("registered", DEADLINE);
            (driver, port)
        })
        .collect();
    let both: BTreeSet<u16> = drivers.iter().map(|(_, port)| *port).collect();
    wait_until(DEADLINE, "churn to route", || {
        mesh.get("churn").status == 200
    });
    wait_until(DEADLINE, "Envoy to list both instances", || {
        envoy_ports(&mesh, "churn.vip") == both
    });

    let load = load(&mesh, &["churn"]);
    let (mut leaving, port) = drivers.pop().expect("two drivers");
    load.mark("churn-2 drained (OUT_OF_SERVICE)");
    leaving.command("out_of_service");
    let drained = Instant::now();
    wait_until(DEADLINE, "Envoy to stop listing churn-2", || {
        !envoy_ports(&mesh, "churn.vip").contains(&port)
    });
    eprintln!(
        "OUT_OF_SERVICE → Envoy no longer lists churn-2: {:?}",
        drained.elapsed()
    );
    load.mark("Envoy no longer lists churn-2");
    load.wait_completed(PHASE, DEADLINE);
    // A deployment stops the service with a deadline. py-eureka-client's stop() can race its
    // own heartbeat thread and hang (see register.py); then the process exits without
    // cancelling, and its lease must run out with no request lost either.
    leaving.command(&format!("stop_within {}", STOP_WITHIN.as_secs()));
    let stopped = leaving.wait_report("stop", DEADLINE);
    eprintln!("churn-2: {stopped}");
    load.mark(&format!("churn-2: {stopped}"));
    wait_for(DEADLINE, "churn-2 to leave the registry", || {
        let registry = mesh.control.debug_registry();
        let list = registry["registry"]["instances"].as_array()?.clone();
        (!list.iter().any(|i| i["instance_id"] == "churn-2")).then_some(())
    });
    load.wait_completed(PHASE, DEADLINE);
    assert_nothing_failed(load, &["churn"]);
}

#[test]
fn a_flood_of_random_hosts_and_of_xds_names_keeps_memory_bounded_and_other_proxies_served() {
    let env = TestEnv::new("chaos_flood");
    let hello = EchoUpstream::start("hello-1");
    let late = EchoUpstream::start("late-1");
    // VIPs the other proxy never asked for, one for each of its first requests.
    let fresh = EchoUpstream::start("fresh");
    let registered: Vec<Instance> = std::iter::once(Instance::new("hello", hello.port()))
        .chain((0..FRESH_VIPS).map(|i| Instance::new(&fresh_vip(i), fresh.port())))
        .collect();
    let mut mesh = Mesh::start(&env, &registered);
    // Another proxy of the mesh, which the floods must not hurt.
    let other = Envoy::start(
        &env,
        "envoy-b",
        &odmesh_bootstrap(mesh.control.xds().port()),
    );
    other.wait_xds_connected(true, DEADLINE);
    let other_get = |host: &str| {
        Request::get("/")
            .host(host)
            .send(other.listener(EGRESS_LISTENER))
    };
    assert_eq!(mesh.route("hello"), "hello-1");
    assert_eq!(other_get("hello").status, 200);
    let control_memory = RssSampler::of(mesh.control.process());
    let envoy_memory = RssSampler::of(mesh.envoy.child());
    let clusters_before = mesh.cluster_manager_stat("active_clusters");

    // A service keeps calling hello through the flooded proxy.
    let steady = load(&mesh, &["hello"]);
    // A buggy (or hostile) client sends a new Host with every request through the same proxy.
    let random = Load::requests(
        mesh.egress(),
        LoadConfig::rate(300).timeout(Duration::from_secs(3)),
        |seq| {
            (
                "random".to_owned(),
                Request::get("/").host(&format!("rnd-{seq:08x}")),
            )
        },
    );
    // And a raw xDS client subscribes a million names, the first 10,000 in its first request:
    // the control plane builds a cluster for each before it refuses all but 100.
    let names = 1_000_000;
    let options = FloodOptions {
        batch: 10_000,
        ..FloodOptions::names(names)
    };
    let mut flood = XdsFlood::start_with(&env, "xds-flood", mesh.control.xds(), &options);
    // Meanwhile the other proxy asks for VIPs it never asked for: each a first request.
    let firsts = Load::requests(
        other.listener(EGRESS_LISTENER),
        LoadConfig::rate(50).timeout(Duration::from_secs(3)),
        |seq| ("first".to_owned(), Request::get("/").host(&fresh_vip(seq))),
    );
    firsts.mark("flood started");
    let answered = flood.wait_all_answered(names, Duration::from_secs(120));
    firsts.mark("a million names answered");
    // Enough random Hosts to pass the proxy's bound on unregistered names many times over,
    // however slowly the machine lets them go.
    wait_until(
        Duration::from_secs(60),
        "1,000 random Hosts answered",
        || random.progress().completed >= 1000,
    );

    // The other proxy is served on time afterwards too: a registry change, and a new VIP.
    let mut changed = registered.clone();
    changed.push(Instance::new("late", late.port()));
    mesh.registry.write_atomic(&changed);
    let written = Instant::now();
    let took = wait_for(
        Duration::from_secs(2),
        "late to route through the other Envoy",
        || (other_get("late").status == 200).then(|| written.elapsed()),
    );
    steady.wait_completed(PHASE, DEADLINE);
    let firsts = firsts.stop();
    let random = random.stop();
    let flood = flood.stop(DEADLINE);
    let steady = assert_nothing_failed(steady, &["hello"]);
    let control_memory = control_memory.stop();
    let envoy_memory = envoy_memory.stop();
    eprintln!(
        "first requests through the other Envoy: {}",
        firsts.summary()
    );
    eprintln!("random hosts: {}", random.summary());
    eprintln!(
        "xDS flood: all {names} answered after {:?}: {}",
        answered.all_answered, flood.json
    );
    eprintln!("new VIP routed through the other Envoy {took:?} after the registry change");
    eprintln!("control plane: {}", control_memory.summary());
    eprintln!("flooded Envoy: {}", envoy_memory.summary());

    // The other proxy's first requests during the flood routed, none held behind it.
    let during = firsts.sent_between("flood started", Some("a million names answered"));
    assert!(during.len() >= 20, "{firsts}");
    firsts.assert_no_failures(&["first"]);
    firsts.assert_answered_within(MAX_FIRST_REQUEST);
    assert_eq!(fresh.requests() as usize, firsts.sent());
    // Every random Host got a fast, clear answer: not registered, or refused over the
    // proxy's bound; none waited for discovery's timeout, none reached an upstream.
    let statuses: BTreeSet<String> = random.records.iter().map(|r| r.outcome.key()).collect();
    assert_eq!(statuses, BTreeSet::from(["503".to_owned()]), "{random}");
    random.assert_answered_within(MAX_FIRST_REQUEST);
    for record in &random.records {
        let body = record.body.as_deref().unwrap_or_default();
        assert!(
            body.contains("is not registered") || body.contains("not discovered"),
            "{record:?}"
        );
    }
    // hello served the steady load and the two requests before it, nothing else.
    assert_eq!(hello.requests() as usize, steady.sent() + 2);
    // The flooded proxy holds at most --xds-max-unregistered (100) clusters it was flooded with.
    let flooded = mesh.cluster_manager_stat("active_clusters") - clusters_before;
    assert!(
        flooded <= 100,
        "the flooded Envoy holds {flooded} more clusters"
    );
    // The flood's stream holds at most --xds-max-names (10,000) names; the rest were refused.
    assert_eq!(flood.clusters, 100, "{}", flood.json);
    assert_eq!(flood.removed, names - 100, "{}", flood.json);
    // Memory: the control plane stays far below what a million subscriptions would take
    // (1.5 KB each unbounded: 1.5 GB), and the flooded Envoy grows by its 100 clusters.
    control_memory.assert_peak_below(256 * 1024 * 1024);
    let envoy_growth = envoy_memory.peak().0.saturating_sub(envoy_memory.first());
    assert!(
        envoy_growth < 64 * 1024 * 1024,
        "the flooded Envoy grew by {} MiB",
        envoy_growth / (1024 * 1024)
    );
    assert!(mesh.envoy.process().exit_status().is_none(), "Envoy exited");
}

#[test]
fn hostile_xds_streams_of_random_names_take_no_room_from_a_real_proxys_new_vips() {
    let env = TestEnv::new("chaos_hostile_streams");
    let (hello, fresh) = (EchoUpstream::start("hello-1"), EchoUpstream::start("fresh"));
    let registered = hello_and_new_vips(&hello, &fresh);
    // Room for 2,000 cluster names over all streams: the 10,000 random cluster names below
    // would take all of it if names refused as unregistered took room.
    let mesh = Mesh::start_with(&env, &registered, &["--xds-max-subscriptions", "2000"]);
    assert_eq!(mesh.route("hello"), "hello-1");
    let control_memory = RssSampler::of(mesh.control.process());
    // Ten raw clients subscribe 1,000 random cluster names each, ten others 1,000 random
    // load-assignment names each, with no cluster.
    let (streams, names) = (10, 1000);
    let hostile = |node: &str, seed, load_assignments| FloodOptions {
        streams,
        batch: names,
        load_assignments,
        seed,
        node_id: node.to_owned(),
        ..FloodOptions::names(names)
    };
    let xds = mesh.control.xds();
    let clusters = hostile("hostile-clusters", 1, false);
    let mut clusters = XdsFlood::start_with(&env, "flood-clusters", xds, &clusters);
    let loads = hostile("hostile-load-assignments", 2, true);
    let mut loads = XdsFlood::start_with(&env, "flood-load-assignments", xds, &loads);
    let timeout = Duration::from_secs(120);
    clusters.wait_all_answered(streams * names, timeout);
    loads.wait_all_answered(streams * names, timeout);

    // While they hold their names, the real proxy's first requests to new VIPs route.
    for i in 0..NEW_VIPS {
        let vip = fresh_vip(i);
        let response = mesh.get(&vip);
        assert_eq!(response.status, 200, "{vip}: {}", response.text());
    }
    let metrics = mesh.control.metrics();
    let clusters = clusters.stop(DEADLINE);
    let loads = loads.stop(DEADLINE);
    let control_memory = control_memory.stop();
    eprintln!("clusters flood: {}", clusters.json);
    eprintln!("load-assignments flood: {}", loads.json);
    eprintln!("control plane: {}", control_memory.summary());
    // Each hostile stream was served 100 names (--xds-max-unregistered) and refused the
    // rest, which took no room: nothing waited.
    let served = streams * 100;
    assert_eq!(
        (clusters.clusters, clusters.removed),
        (served, streams * names - served)
    );
    assert_eq!(
        (loads.endpoints, loads.removed),
        (served, streams * names - served)
    );
    assert_eq!(metrics["odmesh_xds_names_waiting_total"], 0, "{metrics:?}");
    assert_eq!(
        metrics["odmesh_xds_names_refused_total"],
        2 * (streams * names - served)
    );
    // Counted: the served clusters, their load assignments sent behind them, the served
    // load assignments, and the real proxy's hello and new VIPs with theirs.
    let real = 1 + NEW_VIPS;
    assert_eq!(metrics["odmesh_xds_cluster_subscriptions"], served + real);
    assert_eq!(metrics["odmesh_xds_subscriptions"], 3 * served + 2 * real);
}

/// Asks the control plane's admin endpoint for `/healthz` and `/metrics` in turn, every
/// 50 ms, until stopped; counts the asks that got no answer within [`ADMIN_ANSWER`].
struct AdminProbe {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<(u64, Vec<String>, Duration)>,
}

/// How long an admin ask may take before it counts as unanswered: an endpoint that answers,
/// however busy the machine.
const ADMIN_ANSWER: Duration = Duration::from_secs(10);

impl AdminProbe {
    fn start(admin: std::net::SocketAddr) -> AdminProbe {
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::spawn(move || {
            let (mut answered, mut failures, mut longest) = (0, Vec::new(), Duration::ZERO);
            for path in ["/healthz", "/metrics"].iter().cycle() {
                if stopping.load(Ordering::Relaxed) {
                    break;
                }
                let started = Instant::now();
                match Request::get(path)
                    .host("admin")
                    .send_within(admin, ADMIN_ANSWER)
                {
                    Ok(response) if response.status == 200 => answered += 1,
                    Ok(response) => failures.push(format!("{path}: {}", response.status)),
                    Err(e) => failures.push(format!("{path}: {e}")),
                }
                longest = longest.max(started.elapsed());
                std::thread::sleep(Duration::from_millis(50));
            }
            (answered, failures, longest)
        });
        AdminProbe { stop, thread }
    }

    /// Stops asking; panics if an ask went unanswered or none was made.
    fn assert_always_answered(self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let (answered, failures, longest) = self.thread.join().expect("the admin probe");
        eprintln!("admin: {answered} answered, the longest in {longest:?}");
        assert!(
            failures.is_empty(),
            "the admin endpoint did not answer: {failures:?}"
        );
        assert!(answered > 0, "no admin ask was made");
    }
}

#[test]
fn a_hostile_xds_client_at_scale_leaves_the_admin_answering_memory_bounded_and_new_vips_routing() {
    let env = TestEnv::new("chaos_hostile_scale");
    let (hello, fresh) = (EchoUpstream::start("hello-1"), EchoUpstream::start("fresh"));
    let registered = hello_and_new_vips(&hello, &fresh);
    // The defaults: the bounds a platform team runs with.
    let mesh = Mesh::start(&env, &registered);
    assert_eq!(mesh.route("hello"), "hello-1");
    let before = mesh.control.metrics();
    let control_memory = RssSampler::of(mesh.control.process());
    let admin = AdminProbe::start(mesh.control.admin());

    // Many connections at once, each a stream of 2,000 random names: load assignments with
    // kept versions never ACKed, clusters never ACKed, clusters with kept versions, and
    // clusters never read.
    let (streams, names) = (30, 2000);
    let hostile = |node: &str, seed| FloodOptions {
        streams,
        batch: names,
        seed,
        node_id: node.to_owned(),
        ..FloodOptions::names(names)
    };
    let xds = mesh.control.xds();
    let kinds = [
        FloodOptions {
            load_assignments: true,
            kept_versions: true,
            no_ack: true,
            ..hostile("kept-loads", 1)
        },
        FloodOptions {
            no_ack: true,
            ..hostile("no-ack", 2)
        },
        FloodOptions {
            kept_versions: true,
            ..hostile("kept-clusters", 3)
        },
        FloodOptions {
            no_read: true,
            ..hostile("no-read", 4)
        },
    ];
    let mut floods: Vec<XdsFlood> = (kinds.iter())
        .map(|options| XdsFlood::start_with(&env, &options.node_id, xds, options))
        .collect();
    let timeout = Duration::from_secs(180);
    for (flood, options) in floods.iter_mut().zip(&kinds) {
        match options.no_read {
            true => flood.wait_progress(timeout, "every name sent", |p| {
                p.names_sent == streams * names
            }),
            false => flood.wait_all_answered(streams * names, timeout),
        };
    }

    // While they hold their names, the real proxy's first requests to new VIPs route.
    for i in 0..NEW_VIPS {
        let vip = fresh_vip(i);
        let response = mesh.get(&vip);
        assert_eq!(response.status, 200, "{vip}: {}", response.text());
    }
    let metrics = mesh.control.metrics();
    let reports: Vec<_> = floods.into_iter().map(|f| f.stop(DEADLINE)).collect();
    let control_memory = control_memory.stop();
    admin.assert_always_answered();
    for (report, options) in reports.iter().zip(&kinds) {
        eprintln!("{}: {}", options.node_id, report.json);
    }
    eprintln!("control plane: {}", control_memory.summary());
    let delta = |name: &str| metrics[name] - before.get(name).copied().unwrap_or(0);

    // Every stream was served 100 names (--xds-max-unregistered), kept versions or not; the
    // rest were refused, and nothing waited for room.
    let served = streams * 100;
    let refused = streams * names - served;
    for (report, options) in reports.iter().zip(&kinds) {
        let got = match options.load_assignments {
            true => report.endpoints,
            false => report.clusters,
        };
        match options.no_read {
            true => assert_eq!(report.responses, 0, "{}", options.node_id),
            false => assert_eq!(
                (got, report.removed),
                (served, refused),
                "{}",
                options.node_id
            ),
        }
    }
    assert_eq!(delta("odmesh_xds_names_refused_total"), 4 * refused);
    assert_eq!(delta("odmesh_xds_names_waiting_total"), 0);
    // Counted: the three cluster floods' served names, the load assignments sent behind the
    // clusters of the two that listed no kept versions, the load-assignment flood's, and
    // the real proxy's.
    let real = 1 + NEW_VIPS;
    assert_eq!(
        metrics["odmesh_xds_cluster_subscriptions"],
        3 * served + real
    );
    assert_eq!(metrics["odmesh_xds_subscriptions"], 6 * served + 2 * real);

    // Memory within what docs/production.md states a name and a connection cost at most.
    let connections = kinds.len() as u64 * streams;
    let bound = 4 * refused * REFUSED_NAME_BYTES
        + (6 * served + 2 * real) * COUNTED_NAME_BYTES
        + connections * CONNECTION_BYTES;
    let grown = control_memory
        .peak()
        .0
        .saturating_sub(control_memory.first());
    assert!(
        grown <= bound,
        "the control plane grew {grown} bytes, over the documented {bound}"
    );
}

/// The most a refused name costs the control plane, by docs/production.md ("Bounds").
const REFUSED_NAME_BYTES: u64 = 512;
/// The most a counted name costs, by docs/production.md.
const COUNTED_NAME_BYTES: u64 = 1536;
/// The most an xDS connection costs, by docs/production.md.
const CONNECTION_BYTES: u64 = 100 * 1024;

/// How many VIPs the hostile-client tests register for a real proxy's first requests.
const NEW_VIPS: u64 = 20;

/// VIP `hello` on `hello`, and [`NEW_VIPS`] VIPs on `fresh` that no proxy has asked for.
fn hello_and_new_vips(hello: &EchoUpstream, fresh: &EchoUpstream) -> Vec<Instance> {
    std::iter::once(Instance::new("hello", hello.port()))
        .chain((0..NEW_VIPS).map(|i| Instance::new(&fresh_vip(i), fresh.port())))
        .collect()
}

/// The `i`th VIP registered for the other proxy's first requests in the flood test.
fn fresh_vip(i: u64) -> String {
    format!("fresh-{:04}", i % FRESH_VIPS)
}

#[test]
fn an_instance_that_dies_without_being_drained_fails_no_request_sent_after_its_death() {
    let env = TestEnv::new("chaos_sudden_death");
    let first = EchoUpstream::start("hello-1");
    let mut second = EchoUpstream::start("hello-2");
    let mesh = Mesh::start(
        &env,
        &[
            Instance::new("hello", first.port()).id("hello-1"),
            Instance::new("hello", second.port()).id("hello-2"),
        ],
    );
    mesh.route("hello");
    wait_until(DEADLINE, "Envoy to list both instances", || {
        envoy_ports(&mesh, "hello.vip") == BTreeSet::from([first.port(), second.port()])
    });
    let load = load(&mesh, &["hello"]);
    // The process dies; the registry still lists it (its lease has not run out yet).
    let dying = load.mark("hello-2 dying");
    second.stop();
    let dead = load.mark("hello-2 dead, still registered");
    load.wait_completed(2 * PHASE, DEADLINE);
    let report = load.stop();
    eprintln!("{}", report.summary());
    report.assert_answered_within(MAX_LATENCY);
    // A request hello-2 had already taken when it died is lost with it (it reached the
    // instance: no proxy can know whether it was done). Every other one is not: Envoy
    // retries a request that never reached an instance on the other one.
    let lost = report.failures(&["hello"]);
    for r in &lost {
        assert!(
            r.sent <= dead && r.sent + r.latency >= dying,
            "a request not in flight at the death failed: {r:?}\n{report}"
        );
    }
    let after = report.sent_between("hello-2 dead, still registered", None);
    let retried = mesh
        .envoy
        .stat("cluster.hello.vip.upstream_rq_retry")
        .unwrap_or_else(|| panic!("Envoy has no stat cluster.hello.vip.upstream_rq_retry"));
    eprintln!(
        "{} requests after the death, none failed; {} lost in flight; Envoy retried {retried}",
        after.len(),
        lost.len()
    );
    assert!(
        retried > 0,
        "nothing was retried: was hello-2 ever tried after its death?"
    );
}
