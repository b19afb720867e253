//! Real Java Eureka: Spring Cloud Netflix's Eureka server and a Spring Boot service on its
//! Eureka client, on both of the client's transports (Spring's RestClient, the default, and
//! Eureka's own Jersey 3), as the end-to-end harness runs them (`odmesh_e2e::JavaEureka`,
//! `odmesh_e2e::ClientDriver`; built from `tests/eureka-java/` by
//! `scripts/install-eureka-java.sh`).
//!
//! First the real pieces with each other, which is what odmesh has to match: the client with
//! a server alone, three peered servers, a server with basic auth. Then the client with
//! odmesh's embedded registry: registering, reading every change from deltas (never a full
//! fetch after the first), registered within the bounds when it asks for more; and a real
//! server and an odmesh node peered both ways. When the jars or `java` are missing these
//! tests FAIL and say how to build them; there is no skip.
//!
//! JVMs start slowly and weigh on a small machine: these tests take turns ([`one_at_a_time`]).

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use odmesh_e2e::{
    ClientDriver, EurekaApi, EurekaClient, JavaEureka, Registration, Request, TestEnv, hold_for,
    wait_until,
};
use odmesh_eureka::ServerMetrics;
use odmesh_eureka::server::{self, ServerConfig};
use serde_json::Value;

/// Short leases and heartbeats so that the whole life of an instance fits in seconds.
const LEASE_SECS: u64 = 3;
const HEARTBEAT_SECS: u64 = 1;

/// Bounds a change's way to a server and on to a client's cache (clients fetch every
/// second, peers replicate at once): far above what it takes, for a busy machine.
const CHANGE_TIMEOUT: Duration = Duration::from_secs(30);

/// Bounds a driver's `stop`: its application closes, deregisters and exits.
const STOP_TIMEOUT: Duration = Duration::from_secs(60);

/// Held by each test for its whole run: one test's JVMs at a time.
fn one_at_a_time() -> MutexGuard<'static, ()> {
    static JVMS: Mutex<()> = Mutex::new(());
    JVMS.lock().unwrap_or_else(PoisonError::into_inner)
}

fn registration(app: &str, id: &str) -> Registration {
    Registration {
        app: app.to_owned(),
        id: id.to_owned(),
        heartbeat_secs: HEARTBEAT_SECS,
        lease_secs: LEASE_SECS,
        credentials: None,
    }
}

/// The instance `id` in a `GET /eureka/apps` document, if it is there.
fn listed<'a>(apps: &'a Value, id: &str) -> Option<&'a Value> {
    fn each(value: &Value) -> Vec<&Value> {
        match value {
            Value::Array(items) => items.iter().collect(),
            Value::Null => Vec::new(),
            one => vec![one],
        }
    }
    each(&apps["applications"]["application"])
        .into_iter()
        .flat_map(|app| each(&app["instance"]))
        .find(|instance| instance["instanceId"] == id)
}

/// Java client drivers started side by side, each `(client, app)` registering instance
/// `<app>-1` with the Eureka servers at `urls`; returns them once all have registered, each
/// with the port its HTTP server serves.
fn registered_drivers(
    env: &TestEnv,
    clients: &[(EurekaClient, &str)],
    urls: &[String],
) -> Vec<(ClientDriver, u16)> {
    let drivers: Vec<ClientDriver> = (clients.iter())
        .map(|(client, app)| {
            let registration = registration(app, &format!("{app}-1"));
            ClientDriver::start_with_urls(env, app, *client, urls, &registration, &[])
        })
        .collect();
    (drivers.into_iter().zip(clients))
        .map(|(mut driver, (client, _))| {
            let port = driver.wait_listening(client.start_timeout());
            driver.wait_report("registered", client.start_timeout());
            (driver, port)
        })
        .collect()
}

/// An operator cancels `<app>-1`'s registration (`DELETE /eureka/apps/<APP>/<app>-1`): its
/// client's next heartbeat gets 404, and it registers again, UP.
fn registers_again_after_an_operator_removed_it(
    eureka: &EurekaApi,
    driver: &mut ClientDriver,
    client: EurekaClient,
    app: &str,
) {
    let id = format!("{app}-1");
    eureka.cancel(app, &id);
    driver.wait_report("heartbeat 404", CHANGE_TIMEOUT);
    wait_until(
        CHANGE_TIMEOUT,
        &format!("{client} to register {id} again after its heartbeat got 404"),
        || eureka.statuses().get(&id).is_some_and(|s| s == "UP"),
    );
}

/// Sends `stop` and waits until the driver has deregistered and exited 0.
fn stop(driver: &mut ClientDriver) {
    driver.command("stop");
    let deregistered = driver.wait_report("deregistered ", STOP_TIMEOUT);
    assert_eq!(deregistered, "deregistered 200");
    driver.wait_report("stopped", STOP_TIMEOUT);
    let status = driver.process().wait_exit(STOP_TIMEOUT);
    assert!(status.success(), "the driver exited with {status}");
}

#[test]
fn spring_clients_on_both_transports_register_with_a_real_eureka_server_fetch_and_leave_on_stop() {
    let _turn = one_at_a_time();
    let env = TestEnv::new("java_clients_with_a_real_eureka_server");
    let clients = [
        (EurekaClient::Java, "javademo"),
        (EurekaClient::JavaJersey, "jerseydemo"),
    ];
    let started = Instant::now();
    let eureka = JavaEureka::start(&env, "eureka");
    let mut drivers = registered_drivers(&env, &clients, &[eureka.url()]);
    let registered = started.elapsed();

    // The server lists each instance UP, on its VIP (the app name, Spring's default), at the
    // port its driver serves: the driver reported "registered" once the server said 204.
    let apps = eureka.apps();
    for ((client, app), (_, port)) in clients.iter().zip(&drivers) {
        let id = format!("{app}-1");
        let instance = listed(&apps, &id)
            .unwrap_or_else(|| panic!("{client}: {id} is not in the server's /apps: {apps}"));
        assert_eq!(instance["status"], "UP", "{client}: {instance}");
        assert_eq!(instance["vipAddress"], *app, "{client}: {instance}");
        assert_eq!(instance["ipAddr"], "127.0.0.1", "{client}: {instance}");
        assert_eq!(instance["port"]["$"], *port, "{client}: {instance}");
    }

    // Each client's cache, from its own fetches, lists itself and the other, UP.
    let ids: Vec<String> = clients.iter().map(|(_, app)| format!("{app}-1")).collect();
    for ((client, app), (driver, port)) in clients.iter().zip(&mut drivers) {
        // The hash is the cache's once a fetch is applied whole (a fetch in progress may
        // hold the new instance and the old hash).
        let what = format!("{client}'s cache to list {ids:?} UP, hash UP_2_");
        let fetched = driver.wait_fetch(CHANGE_TIMEOUT, &what, |f| {
            (ids.iter()).all(|id| f.instances.get(id).is_some_and(|i| i.status == "UP"))
                && f.hash == "UP_2_"
        });
        let mine = &fetched.instances[&format!("{app}-1")];
        assert_eq!(
            (mine.app.as_str(), mine.vip.as_str(), mine.port),
            (app.to_ascii_uppercase().as_str(), *app, *port),
            "{client}: {fetched:?}"
        );
    }
    let fetched = started.elapsed();

    // Driven, each changes what the server holds: its own status (a registration), its
    // metadata (sent with the next periodic registration); and, for the RestClient one, an
    // operator's override and its removal. Removing an override leaves the instance UNKNOWN
    // on a real server, whose next heartbeat answer is 404 to make the client register again:
    // the RestClient one does, the Jersey 3 one cannot (below) and would expire.
    for ((client, app), (driver, _)) in clients.iter().zip(&mut drivers) {
        let id = format!("{app}-1");
        let api = eureka.api();
        let holds = |what: &str, check: &dyn Fn(&Value) -> bool| {
            wait_until(
                CHANGE_TIMEOUT,
                &format!("the server to hold {id} {what}"),
                || listed(&api.apps(), &id).is_some_and(check),
            )
        };
        if *client == EurekaClient::Java {
            driver.command("out_of_service");
            let answer = driver.wait_report("override ", CHANGE_TIMEOUT);
            assert_eq!(answer, "override OUT_OF_SERVICE 200");
            holds("OUT_OF_SERVICE", &|i| i["status"] == "OUT_OF_SERVICE");
            driver.command("in_service");
            let answer = driver.wait_report("override ", CHANGE_TIMEOUT);
            assert_eq!(answer, "override removed 200");
            holds("UP again", &|i| i["status"] == "UP");
        }
        driver.set_status("DOWN");
        holds("DOWN", &|i| i["status"] == "DOWN");
        driver.set_status("UP");
        driver.set_metadata("zone", "z1");
        holds("UP with metadata zone=z1", &|i| {
            i["status"] == "UP" && i["metadata"]["zone"] == "z1"
        });
    }

    // Removed by an operator, the RestClient one is told so by its next heartbeat (404) and
    // registers again. The Jersey 3 one would not: a Spring Eureka server's 404 carries Spring's
    // JSON error page, which that transport reads as an instance ("Root name ('timestamp') does
    // not match expected ('instance')") and fails on, every heartbeat (Netflix/eureka#1540).
    let (rest, (driver, _)) = (clients.iter().zip(&mut drivers))
        .find(|((client, _), _)| *client == EurekaClient::Java)
        .expect("a RestClient driver");
    registers_again_after_an_operator_removed_it(&eureka.api(), driver, rest.0, rest.1);

    // Stopped, each deregisters and leaves the server's registry.
    for ((client, app), (driver, _)) in clients.iter().zip(&mut drivers) {
        let fetches = driver.fetches();
        eprintln!("{client}: {fetches:?}");
        stop(driver);
        let id = format!("{app}-1");
        wait_until(
            CHANGE_TIMEOUT,
            &format!("the server to drop {id} after {client} stopped"),
            || listed(&eureka.apps(), &id).is_none(),
        );
    }
    eprintln!(
        "server start → both registered {registered:?}, both fetched both {fetched:?}, \
         both stopped and gone {:?}",
        started.elapsed()
    );
}

#[test]
fn three_peered_real_eureka_servers_replicate_a_registration_fill_a_restarted_node_and_replicate_a_cancel()
 {
    let _turn = one_at_a_time();
    let env = TestEnv::new("three_peered_real_eureka_servers");
    let started = Instant::now();
    let mut nodes = JavaEureka::start_peered(&env, "eureka", 3);
    let serving = started.elapsed();
    let has = |node: &JavaEureka, id: &str| node.api().statuses().get(id).cloned();

    nodes[0].api().register("hello", "hello-1", 8080);
    let sent = Instant::now();
    for node in &nodes[1..] {
        wait_until(
            CHANGE_TIMEOUT,
            &format!(
                "hello-1, registered on {}, UP on {}",
                nodes[0].url(),
                node.url()
            ),
            || has(node, "hello-1").as_deref() == Some("UP"),
        );
    }
    let replicated = sent.elapsed();

    // Restarted, a node copies the registry from its peers as it starts.
    let restarted = Instant::now();
    nodes[2].restart(&env);
    assert_eq!(
        has(&nodes[2], "hello-1").as_deref(),
        Some("UP"),
        "{} restarted without hello-1",
        nodes[2].url()
    );
    let restarted = restarted.elapsed();

    nodes[1].api().cancel("hello", "hello-1");
    let sent = Instant::now();
    for node in [&nodes[0], &nodes[2]] {
        wait_until(
            CHANGE_TIMEOUT,
            &format!(
                "hello-1, cancelled on {}, gone from {}",
                nodes[1].url(),
                node.url()
            ),
            || has(node, "hello-1").is_none(),
        );
    }
    eprintln!(
        "3 peers serving after {serving:?}; a registration on one reached both others in \
         {replicated:?}; a node restarted and filled in {restarted:?}; a cancel reached both \
         others in {:?}",
        sent.elapsed()
    );
}

#[test]
fn a_real_eureka_server_with_basic_auth_takes_clients_with_credentials_and_refuses_requests_without()
 {
    let _turn = one_at_a_time();
    let env = TestEnv::new("a_real_eureka_server_with_basic_auth");
    let eureka = JavaEureka::builder()
        .basic_auth("odmesh", "s3cret")
        .start(&env, "eureka");

    // Without credentials, or with wrong ones: 401, to a read and to a registration.
    let apps = Request::get("/eureka/apps")
        .host(&eureka.addr().to_string())
        .header("accept", "application/json");
    assert_eq!(apps.send(eureka.addr()).status, 401);
    let wrong = EurekaApi::with_basic_auth(eureka.addr(), "odmesh", "wrong");
    assert_eq!(wrong.authorize(apps).send(eureka.addr()).status, 401);
    let register = Request::new("POST", "/eureka/apps/HELLO")
        .host(&eureka.addr().to_string())
        .header("content-type", "application/json")
        .body(r#"{"instance": {"instanceId": "hello-1", "app": "HELLO"}}"#);
    assert_eq!(register.send(eureka.addr()).status, 401);

    // Clients with the credentials in their service URL register, on both transports.
    assert!(eureka.url().starts_with("http://odmesh:s3cret@"));
    let clients = [
        (EurekaClient::Java, "javademo"),
        (EurekaClient::JavaJersey, "jerseydemo"),
    ];
    let _drivers = registered_drivers(&env, &clients, &[eureka.url()]);
    let statuses = eureka.api().statuses();
    for (client, app) in clients {
        let id = format!("{app}-1");
        assert_eq!(
            statuses.get(&id).map(String::as_str),
            Some("UP"),
            "{client}: {statuses:?}"
        );
    }
}

/// One Java client's instance in odmesh's embedded registry (in this process, as
/// `odmesh-control --serve-eureka` runs it): it registers, heartbeats past its lease, finds
/// itself in its own fetch of the registry, registers again when an operator removed it, and
/// leaves on stop.
fn a_spring_client_registers_with_the_embedded_registry(client: EurekaClient, test: &str) {
    let _turn = one_at_a_time();
    client.require_installed();
    let env = TestEnv::new(test);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let metrics = Arc::new(ServerMetrics::default());
    let config = ServerConfig {
        lease_duration: Duration::from_secs(LEASE_SECS),
        eviction_interval: Duration::from_millis(200),
        // As the harness runs odmesh-control: complete at once, no warm-up.
        warmup: Duration::ZERO,
        // The client runs on this machine.
        ..ServerConfig::local()
    };
    let any_port: SocketAddr = "127.0.0.1:0".parse().expect("an address");
    let registry = runtime
        .block_on(server::start(
            any_port,
            config,
            None,
            Arc::default(),
            metrics.clone(),
        ))
        .expect("the embedded registry starts");
    let odmesh = EurekaApi::new(registry.local_addr);
    let url = format!("http://{}/eureka", registry.local_addr);
    let app = match client {
        EurekaClient::JavaJersey => "jerseydemo",
        _ => "javademo",
    };
    let id = format!("{app}-1");

    let started = Instant::now();
    let (mut driver, port) =
        (registered_drivers(&env, &[(client, app)], &[url]).pop()).expect("one driver");
    let registered = started.elapsed();
    let listed = odmesh.instances();
    let instance = (listed.get(&id)).unwrap_or_else(|| panic!("{id} is not in {listed:?}"));
    assert_eq!(instance.status, "UP");
    assert_eq!(instance.addr, format!("127.0.0.1:{port}"));

    // Heartbeats keep it past its lease.
    let renewals = metrics.eureka_renewals_total.load(Ordering::Relaxed);
    hold_for(
        Duration::from_secs(LEASE_SECS + 1),
        &format!("{id} listed UP while it heartbeats"),
        || odmesh.statuses().get(&id).is_some_and(|s| s == "UP"),
    );
    let renewed = metrics.eureka_renewals_total.load(Ordering::Relaxed) - renewals;
    assert!(renewed >= 2, "{id}: {renewed} renewals in {LEASE_SECS} s");

    // Its own fetch of odmesh's registry lists it.
    let fetched = driver.wait_fetch(CHANGE_TIMEOUT, &format!("{id} UP in its cache"), |f| {
        f.instances.get(&id).is_some_and(|i| i.status == "UP")
    });
    let mine = &fetched.instances[&id];
    assert_eq!(
        (mine.vip.as_str(), mine.ip.as_str(), mine.port),
        (app, "127.0.0.1", port)
    );
    let fetches = driver.fetches();

    // Removed by an operator, it registers again when its heartbeat gets 404.
    registers_again_after_an_operator_removed_it(&odmesh, &mut driver, client, app);

    stop(&mut driver);
    wait_until(
        CHANGE_TIMEOUT,
        &format!("{id} gone from the registry"),
        || !odmesh.instances().contains_key(&id),
    );
    eprintln!(
        "{client}: start → registered {registered:?}; {renewed} renewals in {} s; fetches \
         {fetches:?}; whole run {:?}",
        LEASE_SECS + 1,
        started.elapsed()
    );
    registry.task.abort();
}

#[test]
fn a_spring_client_on_rest_client_registers_with_the_embedded_registry_fetches_itself_and_reregisters()
 {
    a_spring_client_registers_with_the_embedded_registry(
        EurekaClient::Java,
        "java_client_with_the_embedded_registry",
    );
}

#[test]
fn a_spring_client_on_jersey_3_registers_with_the_embedded_registry_fetches_itself_and_reregisters()
{
    a_spring_client_registers_with_the_embedded_registry(
        EurekaClient::JavaJersey,
        "jersey_client_with_the_embedded_registry",
    );
}

/// odmesh's embedded registry in this process, as `odmesh-control --serve-eureka` runs it
/// (no warm-up, instances at loopback accepted), on `addr` (port 0 for any), with `peers`;
/// with the runtime that serves it.
fn embedded(
    addr: SocketAddr,
    peers: &[String],
    edit: impl FnOnce(&mut ServerConfig),
) -> (
    tokio::runtime::Runtime,
    server::EmbeddedSource,
    Arc<ServerMetrics>,
) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let metrics = Arc::new(ServerMetrics::default());
    let mut config = ServerConfig {
        lease_duration: Duration::from_secs(LEASE_SECS),
        eviction_interval: Duration::from_millis(200),
        warmup: Duration::ZERO,
        ..ServerConfig::local()
    };
    if !peers.is_empty() {
        config.peers = Some(server::peers::PeerConfig::new(peers, None, false).expect("peer URLs"));
    }
    edit(&mut config);
    let registry = runtime
        .block_on(server::start(
            addr,
            config,
            None,
            Arc::default(),
            metrics.clone(),
        ))
        .expect("the embedded registry starts");
    (runtime, registry, metrics)
}

/// A change to make, and how a client's cache shows it.
type Step<'a> = (
    &'a str,
    Box<dyn Fn() + 'a>,
    Box<dyn Fn(&odmesh_e2e::Fetched) -> bool>,
);

#[test]
fn spring_clients_read_every_change_of_the_embedded_registry_from_deltas_without_a_full_fetch() {
    // Eureka's client checks each delta against the server's hash code of its whole registry,
    // and fetches it all again on a mismatch (or when it cannot read a document at all).
    let _turn = one_at_a_time();
    let env = TestEnv::new("java_clients_read_deltas_from_the_embedded_registry");
    let (_runtime, registry, _) = embedded("127.0.0.1:0".parse().unwrap(), &[], |_| {});
    let odmesh = EurekaApi::new(registry.local_addr);
    let url = format!("http://{}/eureka", registry.local_addr);
    let clients = [
        (EurekaClient::Java, "javademo"),
        (EurekaClient::JavaJersey, "jerseydemo"),
    ];
    let mut drivers = registered_drivers(&env, &clients, &[url]);
    let both_up = |f: &odmesh_e2e::Fetched| {
        ["javademo-1", "jerseydemo-1"]
            .iter()
            .all(|id| f.instances.get(*id).is_some_and(|i| i.status == "UP"))
    };
    for (driver, _) in &mut drivers {
        driver.wait_fetch(CHANGE_TIMEOUT, "both clients UP in its cache", both_up);
    }
    let before: Vec<_> = drivers.iter_mut().map(|(d, _)| d.fetches()).collect();

    // Changes of every kind, each waited for in both clients' caches.
    let steps: [Step<'_>; 4] = [
        (
            "other-1 registered",
            Box::new(|| odmesh.register("other", "other-1", 9090)),
            Box::new(|f| f.instances.contains_key("other-1")),
        ),
        (
            "other-1 drained",
            Box::new(|| odmesh.set_status("other", "other-1", "OUT_OF_SERVICE")),
            Box::new(|f| {
                f.instances
                    .get("other-1")
                    .is_some_and(|i| i.status == "OUT_OF_SERVICE")
            }),
        ),
        (
            "other-1 undrained",
            Box::new(|| odmesh.remove_status_override("other", "other-1")),
            Box::new(|f| f.instances.get("other-1").is_some_and(|i| i.status == "UP")),
        ),
        (
            "other-1 cancelled",
            Box::new(|| odmesh.cancel("other", "other-1")),
            Box::new(|f| !f.instances.contains_key("other-1")),
        ),
    ];
    for (what, change, seen) in &steps {
        change();
        for ((client, _), (driver, _)) in clients.iter().zip(&mut drivers) {
            driver.wait_fetch(CHANGE_TIMEOUT, &format!("{client}: {what}"), |f| seen(f));
        }
    }
    for ((client, _), ((driver, _), before)) in clients.iter().zip(drivers.iter_mut().zip(&before))
    {
        let after = driver.fetches();
        eprintln!("{client}: fetches before the changes {before:?}, after {after:?}");
        assert_eq!(
            after.mismatch, 0,
            "{client}: a delta disagreed with the hash code"
        );
        assert_eq!(
            after.full, before.full,
            "{client}: a full fetch after the first"
        );
        assert!(after.delta > before.delta, "{client}: no delta fetched");
        assert_eq!(after.failed, 0, "{client}: a fetch failed");
    }
    registry.task.abort();
}

#[test]
fn a_spring_client_asking_more_than_the_registrys_bounds_is_registered_within_them() {
    // Eureka takes any lease and any metadata, and a Java client whose registration is not
    // answered 204 never appears: odmesh registers it within its bounds.
    let _turn = one_at_a_time();
    let env = TestEnv::new("java_client_beyond_the_bounds");
    let (_runtime, registry, metrics) = embedded("127.0.0.1:0".parse().unwrap(), &[], |_| {});
    let odmesh = EurekaApi::new(registry.local_addr);
    let url = format!("http://{}/eureka", registry.local_addr);
    let keys: Vec<String> = (0..80)
        .map(|i| format!("eureka.instance.metadata-map.k{i:02}"))
        .collect();
    let mut properties: Vec<(&str, &str)> = keys.iter().map(|k| (k.as_str(), "v")).collect();
    properties.push((
        "eureka.instance.lease-expiration-duration-in-seconds",
        "3600",
    ));
    let registration = registration("bigdemo", "bigdemo-1");
    let mut driver = ClientDriver::start_with_urls(
        &env,
        "bigdemo",
        EurekaClient::Java,
        &[url],
        &registration,
        &properties,
    );
    driver.wait_listening(EurekaClient::Java.start_timeout());
    let registered = driver.wait_report("registered", EurekaClient::Java.start_timeout());
    let document = odmesh.apps();
    let instance =
        listed(&document, "bigdemo-1").unwrap_or_else(|| panic!("not listed: {document}"));
    assert_eq!(instance["status"], "UP", "{registered}: {instance}");
    let max_lease = ServerConfig::local().limits.max_lease.as_secs();
    assert_eq!(instance["leaseInfo"]["durationInSecs"], max_lease);
    let kept = instance["metadata"]
        .as_object()
        .map_or(0, serde_json::Map::len);
    assert_eq!(kept, ServerConfig::local().limits.max_metadata_entries);
    assert!(metrics.eureka_leases_clamped_total.load(Ordering::Relaxed) >= 1);
    assert!(
        metrics
            .eureka_metadata_dropped_total
            .load(Ordering::Relaxed)
            >= 16
    );
    stop(&mut driver);
    registry.task.abort();
}

/// The status of instance `id` in a registry's `/eureka/apps`, if it is listed.
fn status_on(api: &EurekaApi, id: &str) -> Option<String> {
    api.statuses().get(id).cloned()
}

/// Waits until the real server and odmesh both list `id` with `want` (`None`: neither
/// lists it).
fn both_say(real: &JavaEureka, odmesh: &EurekaApi, id: &str, want: Option<&str>, what: &str) {
    wait_until(CHANGE_TIMEOUT, what, || {
        status_on(&real.api(), id).as_deref() == want && status_on(odmesh, id).as_deref() == want
    });
}

#[test]
fn a_real_eureka_server_and_an_odmesh_node_peered_both_ways_converge_and_lose_nothing() {
    let _turn = one_at_a_time();
    let env = TestEnv::new("a_mixed_eureka_cluster");
    let odmesh_addr = odmesh_e2e::reserve_addrs(1)[0];
    let odmesh_url = format!("http://{odmesh_addr}/eureka");
    // The real server lists odmesh as its peer, and odmesh the real server.
    let mut real = JavaEureka::builder()
        .peers(std::slice::from_ref(&odmesh_url))
        .start(&env, "eureka");
    let (runtime, registry, metrics) = embedded(odmesh_addr, &[real.url()], |_| {});
    let mut running = Some((runtime, registry));
    let odmesh = EurekaApi::new(odmesh_addr);

    // A client of each, each knowing both servers (as a fleet's clients list every server).
    let clients = [
        (
            EurekaClient::Java,
            "realdemo",
            [real.url(), odmesh_url.clone()],
        ),
        (
            EurekaClient::JavaJersey,
            "meshdemo",
            [odmesh_url.clone(), real.url()],
        ),
    ];
    let mut drivers: Vec<ClientDriver> = (clients.iter())
        .map(|(client, app, urls)| {
            let registration = registration(app, &format!("{app}-1"));
            ClientDriver::start_with_urls(&env, app, *client, urls, &registration, &[])
        })
        .collect();
    for ((client, _, _), driver) in clients.iter().zip(&mut drivers) {
        driver.wait_listening(client.start_timeout());
        driver.wait_report("registered", client.start_timeout());
    }
    // Each write reaches the other side: the real server's batches to
    // /peerreplication/batch/, odmesh's with Eureka's fields only.
    for id in ["realdemo-1", "meshdemo-1"] {
        both_say(&real, &odmesh, id, Some("UP"), &format!("{id} UP on both"));
    }
    // (A client may have registered with either server; these are made on one each.)
    real.api().register("onreal", "onreal-1", 9001);
    odmesh.register("onmesh", "onmesh-1", 9002);
    for id in ["onreal-1", "onmesh-1"] {
        both_say(&real, &odmesh, id, Some("UP"), &format!("{id} UP on both"));
    }
    assert!(metrics.eureka_peer_received_total.load(Ordering::Relaxed) > 0);
    real.api().cancel("onreal", "onreal-1");
    odmesh.cancel("onmesh", "onmesh-1");
    for id in ["onreal-1", "onmesh-1"] {
        both_say(&real, &odmesh, id, None, &format!("{id} cancelled on both"));
    }

    // An operator's override on either side reaches the other.
    odmesh.set_status("meshdemo", "meshdemo-1", "OUT_OF_SERVICE");
    both_say(
        &real,
        &odmesh,
        "meshdemo-1",
        Some("OUT_OF_SERVICE"),
        "odmesh's drain on both",
    );
    odmesh.remove_status_override("meshdemo", "meshdemo-1");
    both_say(
        &real,
        &odmesh,
        "meshdemo-1",
        Some("UP"),
        "odmesh's undrain on both",
    );
    real.api()
        .set_status("realdemo", "realdemo-1", "OUT_OF_SERVICE");
    let what = "the real server's drain on both";
    both_say(&real, &odmesh, "realdemo-1", Some("OUT_OF_SERVICE"), what);
    real.api().remove_status_override("realdemo", "realdemo-1");
    both_say(
        &real,
        &odmesh,
        "realdemo-1",
        Some("UP"),
        "the real server's undrain on both",
    );

    // odmesh restarts: it fills from the real server and holds both at once.
    if let Some((runtime, registry)) = running.take() {
        registry.task.abort();
        drop(runtime);
    }
    let (runtime, registry, metrics) = embedded(odmesh_addr, &[real.url()], |_| {});
    wait_until(CHANGE_TIMEOUT, "odmesh filled from the real server", || {
        metrics.eureka_peer_fills_total.load(Ordering::Relaxed) == 1
    });
    for id in ["realdemo-1", "meshdemo-1"] {
        let now = status_on(&odmesh, id);
        assert_eq!(now.as_deref(), Some("UP"), "{id} after odmesh's restart");
    }
    running = Some((runtime, registry));

    // The real server dies: odmesh loses nothing (the clients heartbeat to it instead), and
    // the restarted server fills from odmesh.
    real.kill();
    hold_for(
        Duration::from_secs(LEASE_SECS * 2),
        "both UP on odmesh while the real server is down",
        || {
            ["realdemo-1", "meshdemo-1"]
                .iter()
                .all(|id| status_on(&odmesh, id).as_deref() == Some("UP"))
        },
    );
    real.restart(&env);
    for id in ["realdemo-1", "meshdemo-1"] {
        let what = format!("{id} on both after the real server's restart");
        both_say(&real, &odmesh, id, Some("UP"), &what);
    }
    drop(drivers);
    drop(running);
}
