//! Per-destination policy (`odmesh-control --policy FILE`) against real Envoy: each knob takes
//! effect in the shipped bootstrap (a request timeout, a per-try timeout, a circuit breaker,
//! retries on reset), a timeout change reaches Envoy live as a new route, a
//! per-caller override applies to that caller only, a bad file keeps the last good policy and
//! says where it is wrong, and a change reaches only the proxies holding the affected cluster,
//! without cutting a request in flight. Needs `make envoy`, `make wasm` and
//! `cargo build -p odmesh-control`.

use std::fs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use odmesh_e2e::{
    Envoy, HttpUpstream, Instance, Mesh, Request, Response, TestEnv, Versions, block_on_within,
    grpc_call, hold_for, odmesh_bootstrap, wait_until,
};

/// How soon a policy file change must reach Envoy (the file is read five times a second;
/// a registry change has the harness's `CHANGE_DEADLINE`).
const POLICY_DEADLINE: Duration = Duration::from_secs(3);
/// The bound on any one request of these tests.
const REQUEST_BOUND: Duration = Duration::from_secs(20);

/// Writes the policy file atomically (a temporary file renamed over it).
fn write_policy(path: &Path, yaml: &str) {
    let tmp = path.with_extension("tmp");
    fs::write(&tmp, yaml).unwrap_or_else(|e| panic!("cannot write {}: {e}", tmp.display()));
    fs::rename(&tmp, path).unwrap_or_else(|e| panic!("cannot rename over {}: {e}", path.display()));
}

/// A mesh whose control plane follows the policy file `policy.yaml` (written with `yaml`).
fn mesh_with_policy(env: &TestEnv, instances: &[Instance], yaml: &str) -> (Mesh, PathBuf) {
    let path = env.log_dir().join("policy.yaml");
    write_policy(&path, yaml);
    let arg = path.to_string_lossy().into_owned();
    (Mesh::start_with(env, instances, &["--policy", &arg]), path)
}

/// `GET path` with `Host: host` to `addr`, bounded; the response and how long it took.
fn timed_get(addr: SocketAddr, host: &str, path: &str) -> (Response, Duration) {
    let start = Instant::now();
    let response = Request::get(path)
        .host(host)
        .send_within(addr, REQUEST_BOUND)
        .unwrap_or_else(|e| panic!("GET {path} to {host}: {e}"));
    (response, start.elapsed())
}

/// `GET /` with `Host: host` and one more header, bounded.
fn timed_get_with(addr: SocketAddr, host: &str, name: &str, value: &str) -> (Response, Duration) {
    let start = Instant::now();
    let response = Request::get("/")
        .host(host)
        .header(name, value)
        .send_within(addr, REQUEST_BOUND)
        .unwrap_or_else(|e| panic!("GET / to {host} with {name}: {e}"));
    (response, start.elapsed())
}

/// A second Envoy on the mesh's control plane, from the shipped bootstrap, for the calling
/// service `service`.
fn envoy_of_service(env: &TestEnv, mesh: &Mesh, service: &str) -> Envoy {
    let yaml = odmesh_bootstrap(mesh.control.xds().port())
        .replace("  id: odmesh-local\n", &format!("  id: {service}-1\n"))
        .replace("  cluster: odmesh\n", &format!("  cluster: {service}\n"));
    let envoy = Envoy::start(env, service, &yaml);
    envoy.wait_xds_connected(true, Duration::from_secs(10));
    envoy
}

/// How many xDS responses the proxies of `service` acknowledged (`/debug/proxies`).
fn acks_of(mesh: &Mesh, service: &str) -> u64 {
    (mesh.control.proxies().iter())
        .filter(|p| p["node_cluster"] == service)
        .map(|p| p["acks"].as_u64().unwrap_or(0))
        .sum()
}

fn egress(envoy: &Envoy) -> SocketAddr {
    envoy.listener(odmesh_e2e::mesh::EGRESS_LISTENER)
}

#[test]
fn a_request_timeout_cuts_a_slow_upstream_at_the_configured_time_even_on_the_first_request() {
    let env = TestEnv::new("policy_request_timeout");
    let slow = HttpUpstream::start("slow-1", Versions::Both);
    let (mesh, _) = mesh_with_policy(
        &env,
        &[
            Instance::new("slow", slow.port()),
            Instance::new("patient", slow.port()),
            Instance::new("posted", slow.port()),
        ],
        "vips: {slow: {request_timeout: 500ms}, posted: {request_timeout: 500ms}}",
    );

    // The first request to the VIP (discovery, then the timeout from the new cluster).
    let (cut, took) = timed_get(mesh.egress(), "slow", "/slow?ms=3000");
    assert_eq!(cut.status, 504, "{}", cut.text());
    // Envoy's timers count from its event loop's clock, read when the loop last woke, which
    // may be a few milliseconds before the request reached the router (seen in CI: 498.3 ms,
    // on a first request whose loop turn also took in the new cluster).
    assert!(
        took >= Duration::from_millis(490) && took < Duration::from_millis(2500),
        "cut after {took:?}, not at 500 ms"
    );
    // A first request with a body: on_demand resumes it instead of starting it again.
    let start = Instant::now();
    let posted = Request::new("POST", "/slow?ms=3000")
        .host("posted")
        .body("payload")
        .send_within(mesh.egress(), REQUEST_BOUND)
        .unwrap_or_else(|e| panic!("POST to posted: {e}"));
    let took = start.elapsed();
    assert_eq!(posted.status, 504, "{}", posted.text());
    assert!(
        took < Duration::from_millis(2500),
        "the POST was cut after {took:?}"
    );
    let (fast, _) = timed_get(mesh.egress(), "slow", "/slow?ms=50");
    assert_eq!(fast.status, 200, "{}", fast.text());
    // A VIP without the policy waits as long as the upstream takes, and a caller cannot set
    // a timeout of its own through Envoy's header (the listener strips it).
    let start = Instant::now();
    let waited = Request::get("/slow?ms=1500")
        .host("patient")
        .header("x-envoy-upstream-rq-timeout-ms", "100")
        .send_within(mesh.egress(), REQUEST_BOUND)
        .unwrap_or_else(|e| panic!("GET to patient: {e}"));
    let took = start.elapsed();
    assert_eq!(waited.status, 200, "{}", waited.text());
    assert!(took >= Duration::from_millis(1500), "{took:?}");
    assert!(
        mesh.envoy
            .stat("cluster.slow.vip.upstream_rq_timeout")
            .unwrap_or(0)
            >= 1
    );
}

#[test]
fn a_circuit_breaker_overflow_answers_503_with_the_overflow_flag_at_the_configured_limit() {
    let env = TestEnv::new("policy_circuit_breaker");
    let upstream = HttpUpstream::start("busy-1", Versions::Both);
    // HTTP/1.1 upstream: two connections, each carrying one request, and one request queued.
    let (mesh, _) = mesh_with_policy(
        &env,
        &[Instance::new("busy", upstream.port())],
        "vips: {busy: {circuit_breakers: {max_connections: 2, max_pending_requests: 1}}}",
    );
    assert_eq!(timed_get(mesh.egress(), "busy", "/").0.status, 200, "warm");

    let egress = mesh.egress();
    let slow = |_| thread::spawn(move || timed_get(egress, "busy", "/slow?ms=2000").0.status);
    let mut admitted: Vec<_> = (0..2).map(slow).collect();
    wait_until(Duration::from_secs(5), "two requests in flight", || {
        mesh.envoy.stat("cluster.busy.vip.upstream_rq_active") == Some(2)
    });
    admitted.push(slow(2));
    wait_until(Duration::from_secs(5), "a third request queued", || {
        mesh.envoy
            .stat("cluster.busy.vip.upstream_rq_pending_active")
            == Some(1)
    });
    // The fourth finds both limits reached: refused at once.
    let (overflow, took) = timed_get(egress, "busy", "/");
    assert_eq!(overflow.status, 503, "{}", overflow.text());
    assert_eq!(
        overflow.header("x-envoy-overloaded"),
        Some("true"),
        "the overflow flag (UO): {:?}",
        overflow.headers
    );
    assert!(
        took < Duration::from_secs(1),
        "answered after {took:?}, not at once"
    );
    assert_eq!(
        mesh.envoy
            .stat("cluster.busy.vip.upstream_rq_pending_overflow"),
        Some(1)
    );
    for request in admitted {
        assert_eq!(request.join().expect("a slow request"), 200);
    }
    assert_eq!(timed_get(egress, "busy", "/").0.status, 200, "room again");
}

#[test]
fn a_retry_on_reset_turns_a_killed_instance_into_a_success() {
    let env = TestEnv::new("policy_retry_on_reset");
    let good = HttpUpstream::start("good-1", Versions::Both);
    let dying = HttpUpstream::start_dying("dying-1");
    let (mesh, _) = mesh_with_policy(
        &env,
        &[
            Instance::new("fragile", good.port()).id("fragile-good"),
            Instance::new("fragile", dying.port()).id("fragile-dying"),
            Instance::new("sturdy", good.port()).id("sturdy-good"),
            Instance::new("sturdy", dying.port()).id("sturdy-dying"),
        ],
        "vips: {sturdy: {retries: {on: [reset, connect-failure], count: 2}}}",
    );
    let failures = |host: &str| {
        (0..20)
            .filter(|_| timed_get(mesh.egress(), host, "/").0.status != 200)
            .count()
    };
    // Without the policy, a request the dying instance took is lost (it may have been
    // processed: only a request that never reached an instance is retried by default).
    assert!(
        failures("fragile") > 0,
        "the dying instance should cost requests by default"
    );
    assert_eq!(
        failures("sturdy"),
        0,
        "every request retried on the other instance"
    );
    assert!(
        mesh.envoy
            .stat("cluster.sturdy.vip.upstream_rq_retry")
            .unwrap_or(0)
            >= 1
    );
}

#[test]
fn a_callers_override_applies_only_to_that_caller() {
    let env = TestEnv::new("policy_per_caller");
    let slow = HttpUpstream::start("slow-1", Versions::Both);
    let (mesh, _) = mesh_with_policy(
        &env,
        &[Instance::new("slow", slow.port())],
        "vips: {slow: {request_timeout: 10s, callers: {checkout: {request_timeout: 300ms}}}}",
    );
    let checkout = envoy_of_service(&env, &mesh, "checkout");

    let (cut, took) = timed_get(egress(&checkout), "slow", "/slow?ms=1500");
    assert_eq!(
        cut.status,
        504,
        "checkout's timeout is 300 ms: {}",
        cut.text()
    );
    assert!(took < Duration::from_millis(1400), "{took:?}");
    let (whole, _) = timed_get(mesh.egress(), "slow", "/slow?ms=1500");
    assert_eq!(
        whole.status,
        200,
        "another caller's timeout is 10 s: {}",
        whole.text()
    );

    let shown = mesh.control.admin_get("/debug/policy").json();
    let effective = shown["effective"].as_array().expect("effective policies");
    let of = |caller: &str| {
        (effective.iter())
            .find(|e| e["cluster"] == "slow.vip" && e["caller"] == caller)
            .unwrap_or_else(|| panic!("no effective policy for {caller}: {shown}"))
            ["policy"]["request_timeout"]
            .clone()
    };
    assert_eq!(of("checkout")["from"], "caller", "{shown}");
    assert_eq!(of("odmesh")["from"], "vip", "{shown}");
    // Written as the policy file writes it.
    assert_eq!(of("checkout")["value"], "300ms", "{shown}");
    assert_eq!(of("odmesh")["value"], "10s", "{shown}");
}

#[test]
fn a_bad_policy_file_keeps_the_last_good_policy_and_says_where_it_is_wrong() {
    let env = TestEnv::new("policy_bad_file");
    let slow = HttpUpstream::start("slow-1", Versions::Both);
    let (mesh, path) = mesh_with_policy(
        &env,
        &[Instance::new("slow", slow.port())],
        "vips: {slow: {request_timeout: 300ms}}",
    );
    assert_eq!(
        timed_get(mesh.egress(), "slow", "/slow?ms=1000").0.status,
        504
    );

    write_policy(
        &path,
        "vips:\n  slow:\n    request_timeout: 300ms\n    retries: {count: many}\n",
    );
    wait_until(POLICY_DEADLINE, "the bad file to be reported", || {
        mesh.control.metric("odmesh_policy_load_errors_total") >= 1
    });
    let status = mesh.control.admin_get("/debug/policy").json();
    let error = status["source"]["last_error"].as_str().unwrap_or_default();
    assert!(
        error.contains("line 4"),
        "the error should say where: {status}"
    );
    assert!(error.contains("retries.count"), "and which field: {status}");
    // The last good policy is still in force.
    assert_eq!(
        timed_get(mesh.egress(), "slow", "/slow?ms=1000").0.status,
        504
    );

    // A good file again: no timeout.
    write_policy(&path, "vips: {slow: {request_timeout: 0s}}");
    wait_until(POLICY_DEADLINE, "the good file to apply", || {
        timed_get(mesh.egress(), "slow", "/slow?ms=700").0.status == 200
    });
}

#[test]
fn a_policy_change_updates_only_the_proxies_holding_the_cluster_and_cuts_no_request_in_flight() {
    let env = TestEnv::new("policy_live_change");
    let upstream = HttpUpstream::start("svc-1", Versions::Both);
    let (mesh, path) = mesh_with_policy(
        &env,
        &[
            Instance::new("alpha", upstream.port()),
            Instance::new("beta", upstream.port()),
        ],
        "",
    );
    let other = envoy_of_service(&env, &mesh, "other");
    assert_eq!(timed_get(mesh.egress(), "alpha", "/").0.status, 200);
    assert_eq!(timed_get(egress(&other), "beta", "/").0.status, 200);
    let modified = |envoy: &Envoy| envoy.stat("cluster_manager.cluster_modified").unwrap_or(0);
    let (alpha_before, beta_before) = (modified(&mesh.envoy), modified(&other));
    mesh.control.wait_all_answered(Duration::from_secs(5));
    let other_acks = acks_of(&mesh, "other");

    // A request in flight on alpha when its cluster changes.
    let egress_alpha = mesh.egress();
    let in_flight = thread::spawn(move || timed_get(egress_alpha, "alpha", "/slow?ms=2000"));
    wait_until(
        Duration::from_secs(5),
        "the slow request to be in flight",
        || mesh.envoy.stat("cluster.alpha.vip.upstream_rq_active") == Some(1),
    );
    write_policy(
        &path,
        "vips: {alpha: {circuit_breakers: {max_requests: 50}}}",
    );
    wait_until(
        POLICY_DEADLINE,
        "alpha's proxy to get the new cluster",
        || modified(&mesh.envoy) > alpha_before,
    );
    let (response, _) = in_flight.join().expect("the request in flight");
    assert_eq!(
        response.status,
        200,
        "the update cut a request: {}",
        response.text()
    );
    // The other proxy holds only beta, which did not change: over several polls of the
    // file it is sent nothing (no response to acknowledge) and changes nothing.
    hold_for(
        Duration::from_millis(1500),
        "beta's proxy left alone",
        || modified(&other) == beta_before && acks_of(&mesh, "other") == other_acks,
    );
    assert_eq!(timed_get(egress(&other), "beta", "/").0.status, 200);
}

#[test]
fn a_hashing_balancer_sends_every_request_with_one_key_to_one_instance() {
    let env = TestEnv::new("policy_ring_hash");
    let one = HttpUpstream::start("sticky-1", Versions::Both);
    let two = HttpUpstream::start("sticky-2", Versions::Both);
    let (mesh, _) = mesh_with_policy(
        &env,
        &[
            Instance::new("sticky", one.port()).id("sticky-1"),
            Instance::new("sticky", two.port()).id("sticky-2"),
        ],
        "vips: {sticky: {load_balancing: ring_hash, hash_header: x-user}}",
    );
    let mut used = std::collections::BTreeSet::new();
    for user in 0..16 {
        let answers: std::collections::BTreeSet<String> = (0..4)
            .map(|_| {
                let response = Request::get("/")
                    .host("sticky")
                    .header("x-user", &format!("user-{user}"))
                    .send_within(mesh.egress(), REQUEST_BOUND)
                    .unwrap_or_else(|e| panic!("GET to sticky: {e}"));
                assert_eq!(response.status, 200, "{}", response.text());
                response.json()["upstream"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned()
            })
            .collect();
        assert_eq!(answers.len(), 1, "user-{user} went to {answers:?}");
        used.extend(answers);
    }
    assert_eq!(
        used.len(),
        2,
        "16 keys should spread over both instances: {used:?}"
    );
}

#[test]
fn a_per_try_timeout_retries_a_slow_try_on_another_instance() {
    let env = TestEnv::new("policy_per_try_timeout");
    let slow = HttpUpstream::start("slow-1", Versions::Both);
    let fast = HttpUpstream::start("fast-1", Versions::Both);
    let (mesh, _) = mesh_with_policy(
        &env,
        &[
            Instance::new("tries", slow.port()),
            Instance::new("tries", fast.port()),
        ],
        "vips: {tries: {per_try_timeout: 200ms, retries: {on: [5xx, reset], count: 2}}}",
    );
    // Round robin: every other first try goes to slow-1, which answers after 3 s; its try is
    // cut at 200 ms and the request retried on fast-1 (never the same instance again).
    for round in 0..6 {
        let (answer, took) = timed_get(mesh.egress(), "tries", "/slow?ms=3000&on=slow-1");
        assert_eq!(answer.status, 200, "round {round}: {}", answer.text());
        assert_eq!(answer.json()["upstream"], "fast-1", "round {round}");
        assert!(
            took < Duration::from_millis(2500),
            "round {round}: {took:?}"
        );
    }
    let cut = mesh
        .envoy
        .stat("cluster.tries.vip.upstream_rq_per_try_timeout");
    assert!(cut.unwrap_or(0) >= 1, "no try was cut: {cut:?}");
}

#[test]
fn a_timeout_change_reaches_the_proxy_as_a_new_route_and_its_removal_too() {
    let env = TestEnv::new("policy_timeout_live");
    let slow = HttpUpstream::start("slow-1", Versions::Both);
    let (mesh, policy) = mesh_with_policy(&env, &[Instance::new("live", slow.port())], "");
    let (answer, _) = timed_get(mesh.egress(), "live", "/slow?ms=1000");
    assert_eq!(answer.status, 200, "{}", answer.text());
    let routes_before = mesh.control.metric("odmesh_rds_responses_total");

    write_policy(&policy, "vips: {live: {request_timeout: 300ms}}");
    let written = Instant::now();
    // Each look sends a request that would take 1 s: cut at 300 ms once the route arrived.
    wait_until(POLICY_DEADLINE * 3, "the request timeout to apply", || {
        timed_get(mesh.egress(), "live", "/slow?ms=1000").0.status == 504
    });
    eprintln!(
        "request timeout applied {:?} after the write",
        written.elapsed()
    );
    assert!(mesh.control.metric("odmesh_rds_responses_total") > routes_before);
    let (cut, took) = timed_get(mesh.egress(), "live", "/slow?ms=1000");
    assert_eq!(cut.status, 504, "{}", cut.text());
    assert!(took < Duration::from_millis(900), "{took:?}");

    // (The entry stays, with no timeout: a file that loses every entry at once is held.)
    write_policy(&policy, "vips: {live: {request_timeout: 0s}}");
    wait_until(POLICY_DEADLINE * 3, "the request timeout to go", || {
        timed_get(mesh.egress(), "live", "/slow?ms=1000").0.status == 200
    });
}

#[test]
fn a_hedge_at_the_per_try_timeout_lets_the_first_answer_win_without_cutting_the_first_try() {
    let env = TestEnv::new("policy_hedge");
    let stall = HttpUpstream::start("stall-1", Versions::Both);
    let fast = HttpUpstream::start("fast-1", Versions::Both);
    let (mesh, _) = mesh_with_policy(
        &env,
        &[
            Instance::new("hedged", stall.port()),
            Instance::new("hedged", fast.port()),
        ],
        "vips: {hedged: {per_try_timeout: 100ms, hedge: true, retries: {count: 1}}}",
    );
    let stat = |name: &str| (mesh.envoy.stat(&format!("cluster.hedged.vip.{name}"))).unwrap_or(0);
    // Hedges sent (Envoy counts a hedge as a retry), and requests a hedge answered.
    let hedges = || (stat("upstream_rq_retry"), stat("upstream_rq_retry_success"));
    // stall-1 stalls 3 s: a request whose first try goes there is answered by the hedge to
    // fast-1, sent after 100 ms: every hedge wins.
    for round in 0..6 {
        let (answer, took) = timed_get(mesh.egress(), "hedged", "/slow?ms=3000&on=stall-1");
        assert_eq!(answer.status, 200, "round {round}: {}", answer.text());
        assert_eq!(answer.json()["upstream"], "fast-1", "round {round}");
        assert!(
            took < Duration::from_millis(2500),
            "round {round}: {took:?}"
        );
        eprintln!("round {round}: {took:?}");
    }
    let (sent, won) = hedges();
    eprintln!("stall-1 3 s: hedges sent {sent}, won {won}");
    assert!(sent >= 1, "no first try went to stall-1 in 6 rounds");
    assert_eq!(won, sent, "every hedge answered");
    // Both answer in 1 s: every request sends a hedge at 100 ms, and every first try wins.
    for round in 0..3 {
        let (answer, took) = timed_get(mesh.egress(), "hedged", "/slow?ms=1000");
        assert_eq!(answer.status, 200, "round {round}: {}", answer.text());
        assert!(
            took >= Duration::from_millis(1000),
            "round {round}: {took:?}"
        );
    }
    let (sent_slow, won_slow) = hedges();
    eprintln!(
        "both 1 s: hedges sent {}, won {}",
        sent_slow - sent,
        won_slow - won
    );
    assert_eq!(sent_slow - sent, 3, "a hedge per request");
    assert_eq!(
        won_slow, won,
        "no hedge won: the first tries answered first"
    );
    // A hedge, not a retry: the first try is not cut. stall-1 answers after 300 ms and fast-1
    // after 2 s; whichever gets the first try, stall-1's answer wins. (A per-try timeout
    // without hedging would cut both tries at 100 ms each and answer 504.)
    for round in 0..4 {
        let (answer, took) = timed_get(
            mesh.egress(),
            "hedged",
            "/slow?ms=300&on=stall-1&others=2000",
        );
        assert_eq!(answer.status, 200, "round {round}: {}", answer.text());
        assert_eq!(answer.json()["upstream"], "stall-1", "round {round}");
        assert!(
            took >= Duration::from_millis(300),
            "round {round}: {took:?}"
        );
    }
    let (all, _) = hedges();
    eprintln!("hedges sent {all}");
    assert!(all >= sent_slow + 4, "{all}");
}

/// `n` GETs of `host` to `addr`: how many were aborted by the policy's fault.
fn aborted(addr: SocketAddr, host: &str, n: usize, header: Option<&str>) -> usize {
    (0..n)
        .filter(|_| {
            let mut request = Request::get("/").host(host);
            if let Some(name) = header {
                request = request.header(name, "1");
            }
            let answer = request
                .send_within(addr, REQUEST_BOUND)
                .unwrap_or_else(|e| panic!("GET / to {host}: {e}"));
            match answer.status {
                200 => false,
                503 => {
                    assert_eq!(answer.text(), FAULT_BODY, "an abort says why");
                    true
                }
                other => panic!("{other}: {}", answer.text()),
            }
        })
        .count()
}

/// The text an aborted request gets (control/src/xds/route.rs).
const FAULT_BODY: &str = "odmesh: fault injected by the policy file (a chaos experiment)";

#[test]
fn a_fault_aborts_its_share_of_requests_on_the_callers_it_names_only() {
    let env = TestEnv::new("policy_fault_abort");
    let up = HttpUpstream::start("chaos-1", Versions::Both);
    let (mesh, policy) = mesh_with_policy(
        &env,
        &[Instance::new("chaos", up.port())],
        "vips: {chaos: {retries: {count: 1}}}",
    );
    let checkout = envoy_of_service(&env, &mesh, "checkout");
    assert_eq!(aborted(egress(&checkout), "chaos", 5, None), 0);

    write_policy(
        &policy,
        "vips: {chaos: {callers: {checkout: {fault: {abort: {status: 503, percent: 50}}}}}}",
    );
    let written = Instant::now();
    wait_until(POLICY_DEADLINE * 3, "the fault to apply", || {
        aborted(egress(&checkout), "chaos:8080", 1, None) == 1
    });
    eprintln!("fault applied {:?} after the write", written.elapsed());
    // 50%: over 400 requests, 200 ± 50 aborts (five standard deviations of a fair coin).
    let n = aborted(egress(&checkout), "chaos", 400, None);
    eprintln!("aborted {n} of 400");
    assert!((150..=250).contains(&n), "{n} of 400 aborted");
    // The mesh's own proxy is another caller: untouched.
    assert_eq!(aborted(mesh.egress(), "chaos", 40, None), 0);
    // What the control plane applies, and for whom.
    let shown = |caller: &str| {
        let path = format!("/debug/policy?cluster=chaos.vip&caller={caller}");
        let shown = mesh.control.admin_get(&path).json();
        shown["effective"][0]["policy"]["fault"].clone()
    };
    let fault = shown("checkout");
    assert_eq!(fault["from"], "caller", "{fault}");
    assert_eq!(fault["value"]["abort"]["with"]["status"], 503, "{fault}");
    assert_eq!(fault["value"]["abort"]["percent"], 50.0, "{fault}");
    assert_eq!(shown("odmesh")["value"], serde_json::Value::Null);
    let injected = checkout.stat("http.odmesh_egress.fault.aborts_injected");
    assert_eq!(injected, Some(n as u64 + 1), "Envoy counts each abort");
    let elsewhere = mesh.envoy.stat("http.odmesh_egress.fault.aborts_injected");
    assert_eq!(elsewhere.unwrap_or(0), 0);

    // Only requests with the header: the rest pass. (Once checkout's proxy took the new
    // route: requests without an abort prove nothing while the 50% fault may still apply.)
    let routes_taken = || {
        let name = "http.odmesh_egress.rds.odmesh.config_reload";
        checkout
            .stat(name)
            .unwrap_or_else(|| panic!("Envoy has no {name}"))
    };
    let taken = routes_taken();
    write_policy(
        &policy,
        "vips: {chaos: {callers: {checkout: {fault: {abort: {status: 503}, header: x-chaos}}}}}",
    );
    wait_until(
        POLICY_DEADLINE * 3,
        "checkout's proxy to take the new route",
        || routes_taken() > taken,
    );
    assert_eq!(aborted(egress(&checkout), "chaos", 20, Some("x-chaos")), 20);
    assert_eq!(aborted(egress(&checkout), "chaos", 20, None), 0);

    // Removed (the VIP's entry stays: a file that loses every entry at once is held).
    write_policy(&policy, "vips: {chaos: {retries: {count: 1}}}");
    let removed = Instant::now();
    wait_until(POLICY_DEADLINE * 3, "the fault to go", || {
        aborted(egress(&checkout), "chaos", 1, Some("x-chaos")) == 0
    });
    eprintln!("fault removed {:?} after the write", removed.elapsed());
    assert_eq!(aborted(egress(&checkout), "chaos", 20, Some("x-chaos")), 0);
}

#[test]
fn a_fault_delay_adds_its_time_and_a_fault_with_an_end_stops_by_itself() {
    let env = TestEnv::new("policy_fault_delay");
    let up = HttpUpstream::start("chaos-1", Versions::Both);
    let (mesh, policy) = mesh_with_policy(&env, &[Instance::new("chaos", up.port())], "");
    assert_eq!(timed_get(mesh.egress(), "chaos", "/").0.status, 200);

    // Ends a few seconds from now, with no file change.
    let end = SystemTime::now() + Duration::from_secs(6);
    let end_secs = end.duration_since(UNIX_EPOCH).unwrap().as_secs() + 1;
    let until = rfc3339(end_secs);
    write_policy(
        &policy,
        &format!("vips: {{chaos: {{fault: {{delay: {{fixed: 500ms}}, until: {until}}}}}}}"),
    );
    wait_until(POLICY_DEADLINE * 3, "the delay to apply", || {
        timed_get(mesh.egress(), "chaos", "/").1 >= Duration::from_millis(480)
    });
    for _ in 0..3 {
        let (answer, took) = timed_get(mesh.egress(), "chaos", "/");
        assert_eq!(answer.status, 200, "{}", answer.text());
        // (Envoy's timer may fire a few milliseconds early.)
        assert!(took >= Duration::from_millis(480), "{took:?}");
        if SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs()
            + 1
            >= end_secs
        {
            break;
        }
    }
    // The fault filter runs on this route, but a caller cannot ask it for a fault of its own.
    let (answer, _) = timed_get_with(mesh.egress(), "chaos", "x-envoy-fault-abort-request", "503");
    assert_eq!(answer.status, 200, "{}", answer.text());
    let (_, took) = timed_get_with(
        mesh.egress(),
        "chaos",
        "x-envoy-fault-delay-request",
        "3000",
    );
    assert!(took < Duration::from_millis(2500), "{took:?}");
    let delayed = mesh.envoy.stat("http.odmesh_egress.fault.delays_injected");
    assert!(delayed.unwrap_or(0) >= 2, "{delayed:?}");
    // What the control plane shows of it: one experiment running, and the VIP's fault applying
    // until its end.
    let fault_shown = || {
        let shown = (mesh.control)
            .admin_get("/debug/policy?cluster=chaos.vip&caller=odmesh")
            .json();
        shown["effective"][0]["policy"]["fault"].clone()
    };
    if SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
        < end_secs
    {
        assert_eq!(mesh.control.metric("odmesh_policy_fault_entries"), 1);
        assert_eq!(fault_shown()["applies"], true, "{}", fault_shown());
    }
    // (Well under the delay: a delayed request may come a few milliseconds early.)
    wait_until(
        Duration::from_secs(20),
        "the delay to end at its until",
        || timed_get(mesh.egress(), "chaos", "/").1 < Duration::from_millis(300),
    );
    let ended = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    eprintln!(
        "delay ended {:.2} s after its until",
        ended.as_secs_f64() - end_secs as f64
    );
    assert!(ended.as_secs() >= end_secs, "not before its until");
    assert_eq!(mesh.control.metric("odmesh_policy_fault_entries"), 0);
    let after = fault_shown();
    assert_eq!(after["applies"], false, "{after}");
    assert_eq!(after["value"]["until"], until.as_str(), "{after}");
}

/// `unix_secs` as `2026-12-05T10:00:00Z`, through `date`.
fn rfc3339(unix_secs: u64) -> String {
    let out = std::process::Command::new("date")
        .args(["-u", "-d", &format!("@{unix_secs}"), "+%Y-%m-%dT%H:%M:%SZ"])
        .output()
        .expect("date");
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

#[test]
fn a_grpc_fault_ends_a_call_with_its_grpc_status() {
    let env = TestEnv::new("policy_fault_grpc");
    let up = HttpUpstream::start("rpc-1", Versions::Both);
    let (mesh, _) = mesh_with_policy(
        &env,
        &[Instance::new("rpc", up.port())],
        "vips: {rpc: {fault: {abort: {grpc_status: 14}}}}",
    );
    let answer = block_on_within(REQUEST_BOUND, async {
        let call = odmesh_demo::EchoRequest::new("hi");
        grpc_call(mesh.egress(), "rpc", "/", &call, "5S").await
    });
    assert_eq!(
        answer.get("grpc-status").map(String::as_str),
        Some("14"),
        "UNAVAILABLE: {answer:?}"
    );
    let injected = mesh.envoy.stat("http.odmesh_egress.fault.aborts_injected");
    assert_eq!(injected, Some(1));
}
