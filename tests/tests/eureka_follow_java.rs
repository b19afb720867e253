//! odmesh following real Eureka servers, through real Envoy: `odmesh-control --eureka URL` on
//! Spring Cloud Netflix Eureka servers ([`JavaEureka`]), with Spring Boot services on Spring
//! Cloud's Eureka client registered there ([`EurekaClient::Java`], its default RestClient
//! transport, and [`EurekaClient::JavaJersey`]), under steady load: the clients churning and an
//! operator's overrides, basic auth and a password changed under the follower, three peered
//! servers with the one it reads killed. Not one request to a VIP that keeps an UP instance
//! may fail or be held, and each change shows in Envoy within a bound.
//!
//! Needs `make envoy`, `make wasm`, `cargo build -p odmesh-control` and the jars of
//! `scripts/install-eureka-java.sh` (without them these tests fail saying so; there is no
//! skip). JVMs start slowly and weigh on a small machine: these tests take turns
//! ([`one_at_a_time`]), and each shares its servers and clients among its steps.

use std::collections::BTreeSet;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use odmesh_e2e::{
    ClientDriver, EchoUpstream, EurekaClient, JavaEureka, Load, LoadConfig, LoadReport, Mesh,
    Registration, Request, Source, TestEnv, wait_until, wait_until_since,
};

/// The Java clients' heartbeats and fetches.
const HEARTBEAT_SECS: u64 = 1;
/// Their lease: long beside the heartbeat, so that a JVM a busy machine starves for a few
/// seconds keeps its instance (no test here is about expiry).
const LEASE_SECS: u64 = 10;
/// How soon a change on a real server must show in Envoy: a poll (0.5 s), the server's
/// read-write cache (a read built during the write is kept at most 1 s, see `JavaEureka`),
/// the push to Envoy; with room for a busy machine.
const FOLLOW_DEADLINE: Duration = Duration::from_secs(5);
/// How soon an instance whose override was removed must be back in Envoy: a real server holds
/// it UNKNOWN until its client's next heartbeat gets 404 and it registers again, then as
/// [`FOLLOW_DEADLINE`].
const REREGISTER_DEADLINE: Duration = Duration::from_secs(5 + 2 * HEARTBEAT_SECS);
/// How soon a stopped service must be gone from Envoy: its application closes (Spring stops
/// its web server, then deregisters), then as [`FOLLOW_DEADLINE`].
const STOP_DEADLINE: Duration = Duration::from_secs(15);
/// Bounds a driver's answer to a command, and its exit after `stop`.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);

/// Requests per second on the VIP under load.
const RATE: u32 = 50;
/// Requests the load completes in each step (sent once the step shows in Envoy).
const PHASE: u64 = RATE as u64;
/// Bounds the wait for a phase's requests.
const PHASE_TIMEOUT: Duration = Duration::from_secs(30);
/// The bound on each request of the load.
const LOAD_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest a request may take: the mesh adds about a millisecond and a warm Spring
/// service answers in a few, so only a request the mesh held takes this long, not one a busy
/// machine slowed.
const MAX_LATENCY: Duration = Duration::from_secs(1);
/// After Envoy's admin shows a host gone (or back), the time its worker threads may take to
/// stop (or start) picking it.
const WORKER_MARGIN: Duration = Duration::from_millis(250);

/// Held by each test for its whole run: one test's JVMs at a time.
fn one_at_a_time() -> MutexGuard<'static, ()> {
    static JVMS: Mutex<()> = Mutex::new(());
    JVMS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The mesh: `odmesh-control --eureka <url> ...` polling every
/// [`odmesh_e2e::EUREKA_INTERVAL`] seconds, and Envoy.
fn follow(env: &TestEnv, urls: Vec<String>) -> Mesh<()> {
    Mesh::start_source(env, Source::Eureka(urls), &[])
}

/// Starts a Java client's driver registering instance `id` of `app` (also its VIP) with the
/// Eureka servers at `urls`, without waiting for it.
fn spawn_driver(
    env: &TestEnv,
    client: EurekaClient,
    urls: &[String],
    app: &str,
    id: &str,
) -> ClientDriver {
    client.require_installed();
    let registration = Registration {
        app: app.to_owned(),
        id: id.to_owned(),
        heartbeat_secs: HEARTBEAT_SECS,
        lease_secs: LEASE_SECS,
        credentials: None,
    };
    ClientDriver::start_with_urls(env, id, client, urls, &registration, &[])
}

/// Waits until the driver serves and has registered (the server answered 204); returns the
/// address its HTTP server serves, as Envoy lists it.
fn wait_registered(driver: &mut ClientDriver, client: EurekaClient) -> String {
    let port = driver.wait_listening(client.start_timeout());
    driver.wait_report("registered", client.start_timeout());
    format!("127.0.0.1:{port}")
}

/// Sends a few requests straight to the Spring service of instance `id` at `addr`: Spring
/// sets up its request dispatching on the first, which must not be the load's.
fn warm_up(addr: &str, id: &str) {
    let direct = addr.parse().expect("a loopback address");
    for _ in 0..5 {
        let response = Request::get("/").host(id).send(direct);
        assert_eq!(
            (response.status, response.text()),
            (200, format!("hello from {id}\n")),
            "{id} at {addr}"
        );
    }
}

/// The upstream addresses Envoy lists for the VIP.
fn hosts<R>(mesh: &Mesh<R>, vip: &str) -> BTreeSet<String> {
    mesh.envoy.cluster_hosts(&format!("{vip}.vip"))
}

/// `addrs` as a set.
fn set(addrs: &[&str]) -> BTreeSet<String> {
    addrs.iter().map(|a| (*a).to_owned()).collect()
}

/// Whether `GET /` with `Host: vip` through Envoy reaches the echo upstream `upstream`.
fn routes_to_echo<R>(mesh: &Mesh<R>, vip: &str, upstream: &str) -> bool {
    let response = mesh.get(vip);
    response.status == 200 && response.header("x-echo-upstream") == Some(upstream)
}

/// The instance a request of the load reached, from its body `hello from <id>`.
fn answered_by(body: Option<&str>) -> Option<&str> {
    body?.strip_prefix("hello from ").map(str::trim_end)
}

/// A step of a churn under load: what was done, and the instances (by id) Envoy must route
/// to once it shows.
struct Step {
    what: String,
    serving: BTreeSet<String>,
    to_envoy: Duration,
}

/// The churn of one VIP under load: each step is marked, done, and waited for in Envoy.
struct Churn<'a> {
    mesh: &'a Mesh<()>,
    load: &'a Load,
    vip: &'a str,
    /// Instance id → the address Envoy lists.
    addrs: Vec<(&'a str, String)>,
    steps: Vec<Step>,
}

impl Churn<'_> {
    /// Marks `what`, does it (`act`), and waits at most `deadline` from the start of `act` for
    /// Envoy to list exactly the instances `serving`; then waits for a phase of requests.
    fn step(&mut self, what: &str, serving: &[&str], deadline: Duration, act: impl FnOnce()) {
        let expected: BTreeSet<String> = (self.addrs.iter())
            .filter(|(id, _)| serving.contains(id))
            .map(|(_, addr)| addr.clone())
            .collect();
        self.load.mark(what);
        let since = Instant::now();
        act();
        let to_envoy = wait_until_since(
            since,
            deadline,
            &format!(
                "Envoy to list {serving:?} ({expected:?}) for {}.vip after «{what}»",
                self.vip
            ),
            || hosts(self.mesh, self.vip) == expected,
        );
        self.load.mark(&shown(what));
        self.load.wait_completed(PHASE, PHASE_TIMEOUT);
        eprintln!("«{what}» → Envoy routes to {serving:?}: {to_envoy:?}");
        self.steps.push(Step {
            what: what.to_owned(),
            serving: serving.iter().map(|id| (*id).to_owned()).collect(),
            to_envoy,
        });
    }
}

/// Asserts that the requests sent from [`WORKER_MARGIN`] after each step showed in Envoy until
/// the next step began reached exactly the instances it serves: none reached an instance out
/// of rotation, each one in rotation was reached.
fn assert_routed_as_shown(steps: &[Step], report: &LoadReport) {
    for (i, step) in steps.iter().enumerate() {
        let from = report.mark_at(&shown(&step.what)) + WORKER_MARGIN;
        let to = (steps.get(i + 1)).map_or(report.duration, |n| report.mark_at(&n.what));
        let reached: BTreeSet<String> = (report.records.iter())
            .filter(|r| r.sent >= from && r.sent < to)
            .filter_map(|r| answered_by(r.body.as_deref()))
            .map(str::to_owned)
            .collect();
        assert_eq!(
            reached,
            step.serving,
            "requests sent from {} to {} after «{}» reached {reached:?}; the load:\n{report}",
            report.at(from),
            report.at(to),
            step.what
        );
    }
}

/// The service of `driver` sets its own OUT_OF_SERVICE override (Spring's service registry),
/// and the server takes it.
fn drain_itself(driver: &mut ClientDriver) {
    driver.command("out_of_service");
    let answer = driver.wait_report("override ", COMMAND_TIMEOUT);
    assert_eq!(answer, "override OUT_OF_SERVICE 200");
}

/// The mark for "Envoy shows `what`".
fn shown(what: &str) -> String {
    format!("Envoy shows «{what}»")
}

#[test]
fn spring_services_on_a_real_eureka_server_drained_undrained_overridden_drained_and_stopped_fail_no_request_through_envoy()
 {
    let _turn = one_at_a_time();
    let started = Instant::now();
    let env = TestEnv::new("follow_java_eureka_churn");
    let eureka = JavaEureka::start(&env, "eureka");
    let mesh = follow(&env, vec![eureka.url()]);
    let vip = "churn";
    // Asked for before any instance exists: Envoy holds the cluster, registrations are pushed.
    assert_eq!(mesh.get(vip).status, 503);

    // Two Spring services on the VIP, one on each transport of the client. The RestClient one
    // does the drains: an override's removal leaves a real server's instance UNKNOWN until
    // its client registers again on its heartbeat's 404, which a Jersey 3 client never does
    // after a real server's 404 (Netflix/eureka#1540).
    let (rest, jersey) = ("churn-rest", "churn-jersey");
    let urls = [eureka.url()];
    let mut rest_driver = spawn_driver(&env, EurekaClient::Java, &urls, vip, rest);
    let mut jersey_driver = spawn_driver(&env, EurekaClient::JavaJersey, &urls, vip, jersey);
    let rest_addr = wait_registered(&mut rest_driver, EurekaClient::Java);
    let jersey_addr = wait_registered(&mut jersey_driver, EurekaClient::JavaJersey);
    let registered = Instant::now();
    let both = set(&[&rest_addr, &jersey_addr]);
    let to_routed = wait_until_since(
        registered,
        FOLLOW_DEADLINE,
        &format!("Envoy to list both Spring services for {vip}.vip"),
        || hosts(&mesh, vip) == both,
    );
    warm_up(&rest_addr, rest);
    warm_up(&jersey_addr, jersey);
    let up = started.elapsed();

    let config = LoadConfig::rate(RATE)
        .keep_alive()
        .timeout(LOAD_TIMEOUT)
        .record_body();
    let load = Load::hosts(mesh.egress(), &[vip], config);
    load.mark(&shown("load started"));
    load.wait_completed(PHASE, PHASE_TIMEOUT);
    let mut churn = Churn {
        mesh: &mesh,
        load: &load,
        vip,
        addrs: vec![(rest, rest_addr.clone()), (jersey, jersey_addr.clone())],
        steps: Vec::new(),
    };
    churn.steps.push(Step {
        what: "load started".to_owned(),
        serving: [rest, jersey].iter().map(|id| (*id).to_owned()).collect(),
        to_envoy: to_routed,
    });

    // 1. The service drains itself (Spring's service registry sets the OUT_OF_SERVICE
    // override on the server), and undrains (removes it).
    churn.step(
        "churn-rest: its client sets OUT_OF_SERVICE",
        &[jersey],
        FOLLOW_DEADLINE,
        || drain_itself(&mut rest_driver),
    );
    churn.step(
        "churn-rest: its client removes the override",
        &[rest, jersey],
        REREGISTER_DEADLINE,
        || {
            rest_driver.command("in_service");
            let answer = rest_driver.wait_report("override ", COMMAND_TIMEOUT);
            assert_eq!(answer, "override removed 200");
        },
    );

    // 2. An operator does the same with the server's REST API.
    let api = eureka.api();
    churn.step(
        "churn-rest: an operator PUTs status OUT_OF_SERVICE on the server",
        &[jersey],
        FOLLOW_DEADLINE,
        || api.set_status(vip, rest, "OUT_OF_SERVICE"),
    );
    churn.step(
        "churn-rest: an operator DELETEs the override on the server",
        &[rest, jersey],
        REREGISTER_DEADLINE,
        || api.remove_status_override(vip, rest),
    );

    // 3. The Jersey 3 one changes its own status (it registers again with it), and back.
    churn.step(
        "churn-jersey: its application sets its status DOWN",
        &[rest],
        FOLLOW_DEADLINE,
        || jersey_driver.set_status("DOWN"),
    );
    churn.step(
        "churn-jersey: its application sets its status UP",
        &[rest, jersey],
        FOLLOW_DEADLINE,
        || jersey_driver.set_status("UP"),
    );

    // 4. The RestClient one leaves the way a service leaves without losing a request: it
    // drains itself, then stops (closes, deregisters and exits). Stopped undrained, Spring
    // closes its web server before its client deregisters, and a request racing that close is
    // lost unless the destination's policy retries on `reset` (docs/failure-modes.md; the
    // undrained death is `chaos.rs`'s).
    churn.step(
        "churn-rest: its client sets OUT_OF_SERVICE before it stops",
        &[jersey],
        FOLLOW_DEADLINE,
        || drain_itself(&mut rest_driver),
    );
    churn.step("churn-rest: stopped", &[jersey], STOP_DEADLINE, || {
        rest_driver.command("stop")
    });
    let deregistered = rest_driver.wait_report("deregistered ", COMMAND_TIMEOUT);
    assert_eq!(deregistered, "deregistered 200");
    let status = rest_driver.process().wait_exit(COMMAND_TIMEOUT);
    assert!(status.success(), "churn-rest's driver exited with {status}");
    load.wait_completed(PHASE, PHASE_TIMEOUT);
    let Churn { steps, .. } = churn;

    let report = load.stop();
    eprintln!("{}", report.summary());
    eprintln!(
        "server start → both services registered and routed {up:?} (registered → Envoy lists \
         both {to_routed:?}); steps → Envoy: {}; whole test {:?}",
        (steps.iter())
            .map(|s| format!("«{}» {:?}", s.what, s.to_envoy))
            .collect::<Vec<_>>()
            .join(", "),
        started.elapsed()
    );
    report.assert_no_failures(&[vip]);
    report.assert_answered_within(MAX_LATENCY);
    assert_routed_as_shown(&steps, &report);
}

#[test]
fn odmesh_follows_a_real_eureka_server_with_basic_auth_reports_a_changed_password_keeps_routing_and_routes_with_the_new_one()
 {
    let _turn = one_at_a_time();
    let started = Instant::now();
    let env = TestEnv::new("follow_java_eureka_basic_auth");
    let (user, password, new_password) = ("odmesh", "s3cret-before", "s3cret-after");
    let secure = EchoUpstream::start("secure-1");
    let fresh = EchoUpstream::start("fresh-1");
    let mut eureka = JavaEureka::builder()
        .basic_auth(user, password)
        .start(&env, "eureka");
    eureka.api().register("secure", "secure-1", secure.port());

    // The credentials in the URL: the follower reads the server, the VIP routes.
    assert!(eureka.url().contains(&format!("{user}:{password}@")));
    let mut mesh = follow(&env, vec![eureka.url()]);
    wait_until(FOLLOW_DEADLINE, "Host secure to route to secure-1", || {
        routes_to_echo(&mesh, "secure", "secure-1")
    });
    let load = Load::hosts(
        mesh.egress(),
        &["secure"],
        LoadConfig::rate(RATE).keep_alive().timeout(LOAD_TIMEOUT),
    );
    load.wait_completed(PHASE, PHASE_TIMEOUT);

    // The server's password changes (it restarts with the new one, on its port); its
    // services, given it, register again. The follower still sends the old one.
    load.mark("the server restarts with a new password");
    eureka.kill();
    let eureka = JavaEureka::builder()
        .addr(eureka.addr())
        .basic_auth(user, new_password)
        .start(&env, "eureka-new-password");
    let serving = Instant::now();
    load.mark("the server serves with the new password");
    let api = eureka.api();
    api.register("secure", "secure-1", secure.port());
    api.register("fresh", "fresh-1", fresh.port());

    // Refused, the follower says so (401, check the credentials), shows no password, and
    // keeps its last good registry: the VIP keeps routing, the new registration is unseen.
    let to_reported = wait_until_since(
        serving,
        FOLLOW_DEADLINE,
        "/readyz to report the server's 401",
        || {
            let error = mesh.control.readyz()["registry"]["last_error"].clone();
            error.as_str().is_some_and(|e| e.contains("401"))
        },
    );
    load.wait_completed(PHASE, PHASE_TIMEOUT);
    let readyz = mesh.control.admin_get("/readyz");
    let json = readyz.json();
    assert_eq!(readyz.status, 200, "{}", readyz.text());
    assert_eq!(json["ready"], true, "{json}");
    let error = json["registry"]["last_error"].as_str().unwrap_or_default();
    assert!(
        error.contains("Eureka answered 401: check the credentials"),
        "{json}"
    );
    assert_eq!(json["registry"]["instances"], 1, "{json}");
    let log = mesh.control.process().log();
    assert!(
        log.contains("Eureka answered 401"),
        "the control plane's log does not say 401:\n{log}"
    );
    let shown = [
        readyz.text(),
        mesh.control.admin_get("/debug/registry").text(),
        log,
    ];
    for secret in [password, new_password] {
        assert!(
            shown.iter().all(|text| !text.contains(secret)),
            "the password {secret:?} shows in /readyz, /debug/registry or the log: {shown:#?}"
        );
    }
    assert!(mesh.control.metric("odmesh_eureka_fetch_errors_total") >= 1);
    let response = mesh.get("fresh");
    assert_eq!(response.status, 503, "{}", response.text());
    assert_eq!(
        response.json()["error"],
        "VIP fresh is not registered",
        "{}",
        response.text()
    );

    // Restarted with the new password, the follower reads the server again: both route.
    load.mark("odmesh restarts with the new password");
    let restart = Instant::now();
    mesh.control
        .restart_on(&env, "control", Source::Eureka(vec![eureka.url()]));
    mesh.wait_connected(FOLLOW_DEADLINE);
    let to_fresh = wait_until_since(
        restart,
        FOLLOW_DEADLINE,
        "Host fresh to route through odmesh with the new password",
        || routes_to_echo(&mesh, "fresh", "fresh-1"),
    );
    assert!(
        mesh.control.readyz()["registry"]["last_error"].is_null(),
        "{}",
        mesh.control.readyz()
    );
    load.mark("odmesh reads the server with the new password");
    load.wait_completed(PHASE, PHASE_TIMEOUT);

    let report = load.stop();
    eprintln!("{}", report.summary());
    eprintln!(
        "basic auth: server up with a new password → /readyz says 401 {to_reported:?}; odmesh \
         restarted with it → a new VIP routes {to_fresh:?}; whole test {:?}",
        started.elapsed()
    );
    report.assert_no_failures(&["secure"]);
    report.assert_answered_within(MAX_LATENCY);
}

#[test]
fn odmesh_following_three_peered_real_eureka_servers_fails_no_request_when_the_one_it_reads_is_killed()
 {
    let _turn = one_at_a_time();
    let started = Instant::now();
    let env = TestEnv::new("follow_java_eureka_peers");
    let late = [EchoUpstream::start("late-2"), EchoUpstream::start("late-3")];
    let mut nodes = JavaEureka::start_peered(&env, "eureka", 3);
    let urls: Vec<String> = nodes.iter().map(JavaEureka::url).collect();
    let mesh = follow(&env, urls.clone());
    let vip = "peered";
    assert_eq!(mesh.get(vip).status, 503);

    // A Spring service registered with the other two servers reaches the one the follower
    // reads (eureka-1, its first URL) by replication, and routes.
    let client = EurekaClient::Java;
    let mut driver = spawn_driver(&env, client, &urls[1..], vip, "peered-1");
    let addr = wait_registered(&mut driver, client);
    let to_routed = wait_until_since(
        Instant::now(),
        FOLLOW_DEADLINE,
        &format!("Envoy to list peered-1 for {vip}.vip"),
        || hosts(&mesh, vip) == set(&[&addr]),
    );
    warm_up(&addr, "peered-1");
    let up = started.elapsed();
    assert_eq!(mesh.control.metric("odmesh_eureka_failovers_total"), 0);

    let config = LoadConfig::rate(RATE).keep_alive().timeout(LOAD_TIMEOUT);
    let load = Load::hosts(mesh.egress(), &[vip], config);
    load.wait_completed(PHASE, PHASE_TIMEOUT);

    // The server it reads dies: it fails over to the next, and the VIP keeps routing.
    load.mark("eureka-1, the server odmesh reads, killed");
    nodes[0].kill();
    let killed = Instant::now();
    let to_failover = wait_until_since(
        killed,
        FOLLOW_DEADLINE,
        "odmesh to fail over to another Eureka server",
        || mesh.control.metric("odmesh_eureka_failovers_total") >= 1,
    );
    load.mark("odmesh failed over");
    load.wait_completed(PHASE, PHASE_TIMEOUT);

    // New registrations on either survivor route.
    let mut to_late = Vec::new();
    for (node, upstream) in nodes[1..].iter().zip(&late) {
        let name = upstream.name();
        let app = name.replace('-', "");
        node.api().register(&app, name, upstream.port());
        let took = wait_until_since(
            Instant::now(),
            FOLLOW_DEADLINE,
            &format!("Host {app}, registered on {}, to route", node.url()),
            || routes_to_echo(&mesh, &app, name),
        );
        to_late.push(took);
    }
    load.wait_completed(PHASE, PHASE_TIMEOUT);
    let readyz = mesh.control.readyz();
    assert_eq!(readyz["ready"], true, "{readyz}");
    assert!(readyz["registry"]["last_error"].is_null(), "{readyz}");

    let report = load.stop();
    eprintln!("{}", report.summary());
    eprintln!(
        "3 peers and a service up {up:?} (registered → routed {to_routed:?}); eureka-1 killed \
         → odmesh failed over {to_failover:?}; a registration on eureka-2, eureka-3 → routed \
         {to_late:?}; whole test {:?}",
        started.elapsed()
    );
    report.assert_no_failures(&[vip]);
    report.assert_answered_within(MAX_LATENCY);
    // The load reached the service through the kill.
    assert!(
        report.sent_between("odmesh failed over", None).len() >= PHASE as usize,
        "{report}"
    );
}
