//! Replicated embedded registries through real Envoy: `odmesh-control --serve-eureka ADDR
//! --peer URL ...` nodes, each also serving xDS, and one Envoy whose xDS cluster lists them
//! all. A node dies and comes back, two nodes lose each other and find each other again;
//! under steady load, not one request may fail or be held, and the nodes must end up listing
//! the same instances. Needs `make envoy`, `make wasm`, `cargo build -p odmesh-control`, and
//! py-eureka-client from `scripts/install-eureka-clients.sh`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use odmesh_e2e::{
    ClientDriver, ControlPlane, EchoUpstream, EurekaApi, EurekaClient, Load, LoadConfig, Node,
    PeeredMesh, Registration, Request, TcpProxy, TestEnv, eureka_url, hold_for, reserve_addrs,
    wait_converged, wait_until, wait_until_since,
};

/// The lease the nodes and the real clients use: short, so that a lease nobody renews
/// expires within the test.
const LEASE_SECS: u64 = 3;
/// Seconds between a real client's heartbeats.
const HEARTBEAT_SECS: u64 = 1;
/// Long enough for an unrenewed lease to expire and be evicted (the sweep runs every
/// second): holding a condition this long shows that heartbeats still arrive.
const LEASE_HOLD: Duration = Duration::from_secs(LEASE_SECS + 2);
/// How long a driver may take to start its runtime, serve and register.
const DRIVER_TIMEOUT: Duration = Duration::from_secs(20);
/// How soon a write on one node must be listed by its peers (replication is asynchronous).
const REPLICATION_DEADLINE: Duration = Duration::from_secs(3);
/// How soon a registry change must route through Envoy (2 s, README "How it works"), plus the
/// replication to the node Envoy is connected to.
const ROUTE_DEADLINE: Duration = Duration::from_secs(4);
/// How soon Envoy must hold an xDS stream to another node once its node died.
const RECONNECT_DEADLINE: Duration = Duration::from_secs(5);
/// How soon a restarted node must have filled itself from a peer.
const FILL_DEADLINE: Duration = Duration::from_secs(5);
/// The warm-up a restarted node is given: a node filled by its peers must not wait it out.
const RESTART_WARMUP: &str = "30";
/// How soon partitioned nodes must agree once the link is back.
const CONVERGE_DEADLINE: Duration = Duration::from_secs(10);
/// How soon a node must show that it could not replicate across the partition.
const PARTITION_DEADLINE: Duration = Duration::from_secs(5);
/// Batches each node must have failed to send across the partition before it heals: the
/// first and some retries.
const PARTITION_FAILURES: u64 = 3;
/// The load: requests per second.
const RATE: u32 = 50;
/// Requests the load completes between two steps: half a second's worth.
const PHASE: u64 = RATE as u64 / 2;
/// The longest a request may take while nodes die and partition: Envoy answers a VIP it
/// holds in about a millisecond without asking a node, so only a request it held takes
/// this long, not one a busy machine (three nodes, real clients, Envoy) slowed.
const MAX_LATENCY: Duration = Duration::from_secs(1);

/// Whether `GET /` with `Host: vip` through Envoy reaches a driver's server naming `id`.
fn routes_to_driver(egress: SocketAddr, vip: &str, id: &str) -> bool {
    let response = Request::get("/").host(vip).send(egress);
    response.status == 200 && response.text() == format!("hello from {id}\n")
}

/// Whether `GET /` with `Host: vip` through Envoy reaches the echo upstream `upstream`.
fn routes_to_echo(egress: SocketAddr, vip: &str, upstream: &str) -> bool {
    let response = Request::get("/").host(vip).send(egress);
    response.status == 200 && response.header("x-echo-upstream") == Some(upstream)
}

/// Whether the embedded registry of `node` lists each of `ids` with status `UP`.
fn lists_up(node: &ControlPlane, ids: &[&str]) -> bool {
    let statuses = EurekaApi::new(node.eureka_addr()).statuses();
    ids.iter()
        .all(|id| statuses.get(*id).map(String::as_str) == Some("UP"))
}

/// A metric of `node`, or `None` while `/metrics` has no such line.
fn metric_of(node: &ControlPlane, name: &str) -> Option<u64> {
    node.metrics().remove(name)
}

/// Now, in milliseconds since the Unix epoch, as Eureka clients write `lastDirtyTimestamp`.
fn unix_millis() -> u64 {
    let now = SystemTime::now().duration_since(UNIX_EPOCH);
    let now = now.unwrap_or_else(|e| panic!("the clock is before 1970: {e}"));
    u64::try_from(now.as_millis()).unwrap_or(u64::MAX)
}

/// Heartbeats `node` has renewed a lease with.
fn renewals(node: &ControlPlane) -> u64 {
    node.metric("odmesh_eureka_renewals_total")
}

/// The registration of a py-eureka-client driver for `app`, instance `<app>-1`.
fn registration(app: &str) -> Registration {
    Registration {
        app: app.to_owned(),
        id: format!("{app}-1"),
        heartbeat_secs: HEARTBEAT_SECS,
        lease_secs: LEASE_SECS,
        credentials: None,
    }
}

#[test]
fn a_node_of_three_peered_registries_dies_and_comes_back_without_losing_an_instance_or_a_request() {
    EurekaClient::Python.require_installed();
    let env = TestEnv::new("peers_node_loss");
    let lease = LEASE_SECS.to_string();
    let mut mesh = PeeredMesh::start(&env, 3, &["--lease-duration", &lease]);
    let egress = mesh.egress();
    // A is the node Envoy's xDS stream is on, so that its death also moves Envoy.
    let a = mesh
        .connected_node()
        .unwrap_or_else(|| panic!("no node holds Envoy's xDS stream"));
    let others: Vec<usize> = (0..3).filter(|i| *i != a).collect();
    let (b, c) = (others[0], others[1]);
    let a_label = mesh.nodes[a].process().label().to_owned();
    let [addr_a, addr_b, addr_c] = [a, b, c].map(|i| mesh.nodes[i].eureka_addr());

    // Two services register through A with a real client that knows all three, A first.
    let mut drivers: Vec<ClientDriver> = ["alpha", "beta"]
        .into_iter()
        .map(|app| {
            let label = format!("driver-{app}");
            let servers = [addr_a, addr_b, addr_c];
            let registration = registration(app);
            ClientDriver::start_with_servers(
                &env,
                &label,
                EurekaClient::Python,
                &servers,
                &registration,
            )
        })
        .collect();
    for driver in &mut drivers {
        driver.wait_report("registered", DRIVER_TIMEOUT);
    }
    let ids = ["alpha-1", "beta-1"];
    wait_until(
        REPLICATION_DEADLINE,
        "every node to list alpha-1 and beta-1 UP",
        || mesh.nodes.iter().all(|node| lists_up(node, &ids)),
    );
    for app in ["alpha", "beta"] {
        wait_until(ROUTE_DEADLINE, &format!("Host {app} to route"), || {
            routes_to_driver(egress, app, &format!("{app}-1"))
        });
    }

    let load = Load::hosts(
        egress,
        &["alpha", "beta"],
        LoadConfig::rate(RATE).keep_alive(),
    );
    load.wait_completed(PHASE, Duration::from_secs(10));
    // A replicates the heartbeats it receives: B and C keep the leases past their duration.
    hold_for(
        LEASE_HOLD,
        "B and C to list alpha-1 and beta-1 UP while their clients heartbeat A",
        || lists_up(&mesh.nodes[b], &ids) && lists_up(&mesh.nodes[c], &ids),
    );

    let renewed_before = renewals(&mesh.nodes[b]) + renewals(&mesh.nodes[c]);
    load.mark("killed A");
    mesh.nodes[a].kill();
    let killed = Instant::now();
    let to_reconnected = wait_until_since(
        killed,
        RECONNECT_DEADLINE,
        "Envoy's xDS stream to move to B or C",
        || mesh.connected_node().is_some(),
    );
    load.mark("Envoy on another node");
    load.wait_completed(PHASE, Duration::from_secs(10));
    // The clients fail over to B: their leases outlive A and the lease duration.
    hold_for(
        LEASE_HOLD,
        "B and C to keep listing alpha-1 and beta-1 UP after A died",
        || lists_up(&mesh.nodes[b], &ids) && lists_up(&mesh.nodes[c], &ids),
    );
    let renewed_after = renewals(&mesh.nodes[b]) + renewals(&mesh.nodes[c]);
    assert!(
        renewed_after > renewed_before,
        "no heartbeat reached B or C after A died: renewals {renewed_before} → {renewed_after}"
    );

    // A service that starts now registers through B, and reaches the proxy.
    let mut late = ClientDriver::start_with_servers(
        &env,
        "driver-gamma",
        EurekaClient::Python,
        &[addr_b, addr_c],
        &registration("gamma"),
    );
    late.wait_report("registered", DRIVER_TIMEOUT);
    let registered = Instant::now();
    let to_routed = wait_until_since(
        registered,
        ROUTE_DEADLINE,
        "Host gamma, registered through B after A died, to route through Envoy",
        || routes_to_driver(egress, "gamma", "gamma-1"),
    );
    let ids = ["alpha-1", "beta-1", "gamma-1"];
    wait_until(REPLICATION_DEADLINE, "B and C to list gamma-1 UP", || {
        lists_up(&mesh.nodes[b], &ids) && lists_up(&mesh.nodes[c], &ids)
    });
    drivers.push(late);

    // A comes back on the same addresses, with a warm-up it must not need: it fills itself
    // from a peer and is complete at once.
    load.mark("restarted A");
    mesh.nodes[a].restart_with(&env, &a_label, &["--registry-warmup", RESTART_WARMUP]);
    let restarted = Instant::now();
    let node_a = &mesh.nodes[a];
    let to_filled = wait_until_since(
        restarted,
        FILL_DEADLINE,
        "A to fill itself from a peer (odmesh_eureka_peer_fills_total)",
        || metric_of(node_a, "odmesh_eureka_peer_fills_total").is_some_and(|n| n >= 1),
    );
    assert_eq!(
        metric_of(node_a, "odmesh_eureka_peer_fills_total"),
        Some(1),
        "A filled itself more than once"
    );
    wait_until_since(
        restarted,
        FILL_DEADLINE,
        "A's registry to be complete without its warm-up (odmesh_registry_complete 1)",
        || metric_of(node_a, "odmesh_registry_complete") == Some(1),
    );
    let (listed, to_converged) = wait_converged(
        &[&mesh.nodes[a], &mesh.nodes[b], &mesh.nodes[c]],
        REPLICATION_DEADLINE,
        "A to list the same instances as B and C",
    );
    let statuses: BTreeMap<&str, &str> = (listed.iter())
        .map(|(id, l)| (id.as_str(), l.status.as_str()))
        .collect();
    assert_eq!(
        statuses,
        BTreeMap::from([("alpha-1", "UP"), ("beta-1", "UP"), ("gamma-1", "UP")]),
        "{listed:?}"
    );
    // B replicates to A again: A keeps the leases its clients renew at B.
    hold_for(
        LEASE_HOLD,
        "the restarted A to keep listing every instance UP",
        || lists_up(&mesh.nodes[a], &ids),
    );
    load.wait_completed(PHASE, Duration::from_secs(10));
    let report = load.stop();

    eprintln!("{}", report.summary());
    eprintln!(
        "A = {a_label}: killed → Envoy on another node {to_reconnected:?}; registered through B → \
         routed {to_routed:?}; restarted → filled {to_filled:?}, same /apps {to_converged:?}"
    );
    report.assert_no_failures(&["alpha", "beta"]);
    report.assert_answered_within(MAX_LATENCY);
}

#[test]
fn two_peered_registries_written_on_both_sides_of_a_partition_converge_once_it_heals() {
    let env = TestEnv::new("peers_partition");
    let steady = EchoUpstream::start("steady-1");
    let west = EchoUpstream::start("west-1");
    let east = EchoUpstream::start("east-1");
    let churn = EchoUpstream::start("churn");
    let addrs = reserve_addrs(2);
    // A reaches B only through `to_b`, B reaches A only through `to_a`.
    let to_b = TcpProxy::start(addrs[1]);
    let to_a = TcpProxy::start(addrs[0]);
    let nodes = [
        Node::new("node-a", addrs[0]).peer(&eureka_url(to_b.addr())),
        Node::new("node-b", addrs[1]).peer(&eureka_url(to_a.addr())),
    ];
    let mesh = PeeredMesh::start_nodes(&env, &nodes, &[]);
    let egress = mesh.egress();
    let (a, b) = (mesh.eureka(0), mesh.eureka(1));
    let both = [&mesh.nodes[0], &mesh.nodes[1]];

    a.register("steady", "steady-1", steady.port());
    for id in [
        "churn-1", "churn-2", "churn-3", "churn-4", "churn-5", "twin-1",
    ] {
        a.register("churn", id, churn.port());
    }
    a.set_status("churn", "churn-5", "OUT_OF_SERVICE");
    let (before, _) = wait_converged(&both, REPLICATION_DEADLINE, "A and B to agree at first");
    assert_eq!(before.len(), 7, "{before:?}");
    wait_until(ROUTE_DEADLINE, "Host steady to route", || {
        routes_to_echo(egress, "steady", "steady-1")
    });
    let load = Load::hosts(egress, &["steady"], LoadConfig::rate(RATE).keep_alive());
    load.wait_completed(PHASE, Duration::from_secs(10));

    load.mark("partitioned");
    to_b.block();
    to_a.block();
    let failures = |i: usize| {
        metric_of(
            &mesh.nodes[i],
            "odmesh_eureka_peer_replication_failures_total",
        )
    };
    let failed_before = [failures(0).unwrap_or(0), failures(1).unwrap_or(0)];
    // A's side.
    a.register("west", "west-1", west.port());
    a.cancel("churn", "churn-1");
    a.set_status("churn", "churn-2", "OUT_OF_SERVICE");
    // B's side.
    b.register("east", "east-1", east.port());
    b.cancel("churn", "churn-3");
    b.set_status("churn", "churn-4", "OUT_OF_SERVICE");
    b.remove_status_override("churn", "churn-5");
    // Both sides: the same instance registered again, on another port; B's registration is
    // the newer one by its lastDirtyTimestamp, which decides.
    let dirty = unix_millis();
    a.register_dirty("churn", "twin-1", west.port(), dirty);
    b.register_dirty("churn", "twin-1", east.port(), dirty + 1_000);

    // Each side tried to replicate, again and again, and failed; neither sees the other's
    // writes.
    for (i, name) in [(0, "A"), (1, "B")] {
        let node = &mesh.nodes[i];
        wait_until(
            PARTITION_DEADLINE,
            &format!("{name} to count {PARTITION_FAILURES} failed batches, writes pending"),
            || {
                failures(i).is_some_and(|n| n >= failed_before[i] + PARTITION_FAILURES)
                    && metric_of(node, "odmesh_eureka_peer_pending").is_some_and(|n| n >= 1)
            },
        );
    }
    load.wait_completed(PHASE, Duration::from_secs(10));
    let seen_by_a = a.statuses();
    let seen_by_b = b.statuses();
    assert!(
        !seen_by_a.contains_key("east-1") && seen_by_a.contains_key("churn-3"),
        "A saw B's writes through the partition: {seen_by_a:?}"
    );
    assert!(
        !seen_by_b.contains_key("west-1") && seen_by_b.contains_key("churn-1"),
        "B saw A's writes through the partition: {seen_by_b:?}"
    );
    assert!(
        to_a.dropped() + to_b.dropped() >= 1,
        "no node tried to reach the other while partitioned"
    );

    load.mark("healed");
    to_b.unblock();
    to_a.unblock();
    let (after, to_converged) = wait_converged(
        &both,
        CONVERGE_DEADLINE,
        "A and B to agree once the partition healed",
    );
    let statuses: BTreeMap<&str, &str> = (after.iter())
        .map(|(id, l)| (id.as_str(), l.status.as_str()))
        .collect();
    assert_eq!(
        statuses,
        BTreeMap::from([
            ("churn-2", "OUT_OF_SERVICE"),
            ("churn-4", "OUT_OF_SERVICE"),
            ("churn-5", "UP"),
            ("east-1", "UP"),
            ("steady-1", "UP"),
            ("twin-1", "UP"),
            ("west-1", "UP"),
        ]),
        "{after:?}"
    );
    assert_eq!(
        after["twin-1"].addr,
        east.addr().to_string(),
        "twin-1 kept A's older registration"
    );
    for (i, name) in [(0, "A"), (1, "B")] {
        wait_until(
            REPLICATION_DEADLINE,
            &format!("{name} to have no write pending for its peer"),
            || metric_of(&mesh.nodes[i], "odmesh_eureka_peer_pending") == Some(0),
        );
    }
    // Whichever node Envoy is on, both sides' registrations route.
    for (vip, upstream) in [("west", "west-1"), ("east", "east-1")] {
        wait_until(ROUTE_DEADLINE, &format!("Host {vip} to route"), || {
            routes_to_echo(egress, vip, upstream)
        });
    }
    load.wait_completed(PHASE, Duration::from_secs(10));
    let report = load.stop();

    eprintln!("{}", report.summary());
    eprintln!(
        "partition: {} + {} connections dropped; healed → converged {to_converged:?}",
        to_a.dropped(),
        to_b.dropped()
    );
    report.assert_no_failures(&["steady"]);
    report.assert_answered_within(MAX_LATENCY);
}
