//! Where requests go, against real Envoy and `odmesh-control`: round robin over the `UP`
//! instances of a VIP, registry edits (atomic or in place) that move traffic within 2 s, and
//! requests that must reach nothing (invalid hosts) or not the cluster a client named
//! (spoofed `x-odmesh-cluster`); a plain JDK client with Envoy as its HTTP proxy; how many
//! times Envoy resolves each request's route (once with the native module). Needs
//! `make envoy`, `make wasm`, `cargo build -p odmesh-control` and Java 17.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use odmesh_e2e::mesh::EGRESS_LISTENER;
use odmesh_e2e::{
    CHANGE_DEADLINE, ControlPlane, EchoUpstream, Envoy, Instance, Mesh, RegistryFile, Request,
    Shell, TestEnv, odmesh_bootstrap, wait_for, wait_until_since,
};

/// With strict round robin, an instance shows up once in every `n` requests to `n`
/// instances; this many in a row without it means it is out of the rotation.
const OUT_OF_ROTATION: usize = 6;

/// Sends `n` requests for `host` and counts them per upstream.
fn spread(mesh: &Mesh, host: &str, n: usize) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for _ in 0..n {
        *counts.entry(mesh.route(host)).or_default() += 1;
    }
    counts
}

/// Asserts that `counts` holds exactly `upstreams`, each within one of an even share.
fn assert_even(counts: &BTreeMap<String, usize>, upstreams: &[&str]) {
    let names: Vec<&str> = counts.keys().map(String::as_str).collect();
    assert_eq!(names, upstreams, "requests went to {counts:?}");
    let total: usize = counts.values().sum();
    let share = total / upstreams.len();
    for (name, count) in counts {
        assert!(
            count.abs_diff(share) <= 1,
            "{name} got {count} of {total} requests, not about {share}: {counts:?}"
        );
    }
}

/// Polls `host` until `OUT_OF_ROTATION` answers in a row came from somewhere other than
/// `gone`, at most 2 s after `since`; returns the time from `since` to the first of them.
fn wait_out_of_rotation(mesh: &Mesh, host: &str, gone: &str, since: Instant) -> Duration {
    let mut streak_start: Option<Duration> = None;
    let mut streak = 0;
    wait_until_since(
        since,
        CHANGE_DEADLINE,
        &format!("{gone} to leave {host}"),
        || {
            for _ in 0..OUT_OF_ROTATION {
                let at = since.elapsed();
                if mesh.route(host) == gone {
                    streak = 0;
                    streak_start = None;
                    return false;
                }
                streak += 1;
                streak_start.get_or_insert(at);
                if streak >= OUT_OF_ROTATION {
                    return true;
                }
            }
            false
        },
    );
    streak_start.unwrap_or_default()
}

/// Polls `host` until `upstream` answers, at most 2 s after `since`; returns the time.
fn wait_in_rotation(mesh: &Mesh, host: &str, upstream: &EchoUpstream, since: Instant) -> Duration {
    let what = format!("{} to join {host}", upstream.name());
    wait_until_since(since, CHANGE_DEADLINE, &what, || {
        (0..OUT_OF_ROTATION).any(|_| mesh.route(host) == upstream.name())
    })
}

#[test]
fn requests_are_spread_round_robin_over_the_up_instances_only() {
    let env = TestEnv::new("routing_round_robin");
    let ups: Vec<EchoUpstream> = (1..=4)
        .map(|i| EchoUpstream::start(&format!("hello-{i}")))
        .collect();
    let mesh = Mesh::start(
        &env,
        &[
            Instance::new("hello", ups[0].port()),
            Instance::new("hello", ups[1].port()),
            Instance::new("hello", ups[2].port()),
            Instance::new("hello", ups[3].port()).status("DOWN"),
        ],
    );

    let counts = spread(&mesh, "hello", 30);
    eprintln!("30 requests to VIP hello: {counts:?}");
    assert_even(&counts, &["hello-1", "hello-2", "hello-3"]);
    assert_eq!(ups[3].requests(), 0, "the DOWN instance got requests");
}

#[test]
fn an_instance_marked_down_leaves_and_an_added_one_joins_within_two_seconds_of_an_atomic_write() {
    let env = TestEnv::new("routing_atomic_registry_write");
    let ups: Vec<EchoUpstream> = (1..=4)
        .map(|i| EchoUpstream::start(&format!("hello-{i}")))
        .collect();
    let instance = |i: usize| Instance::new("hello", ups[i].port()).id(&format!("hello-{}", i + 1));
    let mesh = Mesh::start(&env, &[instance(0), instance(1), instance(2)]);
    assert_even(
        &spread(&mesh, "hello", 9),
        &["hello-1", "hello-2", "hello-3"],
    );

    mesh.registry
        .write_atomic(&[instance(0), instance(1), instance(2).status("DOWN")]);
    let written = Instant::now();
    let took = wait_out_of_rotation(&mesh, "hello", "hello-3", written);
    eprintln!("hello-3 marked DOWN (atomic write): out of rotation after {took:?}");
    let seen = ups[2].requests();
    assert_even(&spread(&mesh, "hello", 20), &["hello-1", "hello-2"]);
    assert_eq!(
        ups[2].requests(),
        seen,
        "the DOWN instance still gets requests"
    );

    mesh.registry.write_atomic(&[
        instance(0),
        instance(1),
        instance(2).status("DOWN"),
        instance(3),
    ]);
    let written = Instant::now();
    let took = wait_in_rotation(&mesh, "hello", &ups[3], written);
    eprintln!("hello-4 added (atomic write): first request after {took:?}");
    assert_even(
        &spread(&mesh, "hello", 30),
        &["hello-1", "hello-2", "hello-4"],
    );
}

#[test]
fn an_in_place_edit_of_the_registry_file_moves_traffic_within_two_seconds() {
    let env = TestEnv::new("routing_in_place_registry_write");
    let old = EchoUpstream::start("hello-old");
    let new = EchoUpstream::start("hello-new");
    let mesh = Mesh::start(&env, &[Instance::new("hello", old.port())]);
    assert_eq!(mesh.route("hello"), "hello-old");

    // The old instance is removed from the file, the new one added, in one write.
    mesh.registry
        .write_in_place(&[Instance::new("hello", new.port())]);
    let written = Instant::now();
    let joined = wait_in_rotation(&mesh, "hello", &new, written);
    let left = wait_out_of_rotation(&mesh, "hello", "hello-old", written);
    eprintln!(
        "in-place write replacing hello-old by hello-new: hello-new answered after {joined:?}, \
         hello-old out of rotation after {left:?}"
    );
    let seen = old.requests();
    assert_eq!(
        spread(&mesh, "hello", 10).into_iter().collect::<Vec<_>>(),
        [("hello-new".to_owned(), 10)]
    );
    assert_eq!(old.requests(), seen);
}

#[test]
fn invalid_hosts_get_a_400_and_reach_no_cluster() {
    let env = TestEnv::new("routing_invalid_hosts");
    let hello = EchoUpstream::start("hello-1");
    let mesh = Mesh::start(&env, &[Instance::new("hello", hello.port())]);
    let added = mesh.cluster_manager_stat("cluster_added");
    let control_before = mesh.control.wait_all_answered(Duration::from_secs(5));

    for host in [
        "",
        ".",
        "127.0.0.1",
        "[::1]:8080",
        "bad_name!",
        "hello..vip",
    ] {
        for spoof in [None, Some("hello.vip"), Some("odmesh_xds")] {
            let mut request = Request::get("/").host(host);
            if let Some(cluster) = spoof {
                request = request.header("x-odmesh-cluster", cluster);
            }
            let response = mesh.send(&request);
            let body = response.text();
            assert_eq!(
                response.status, 400,
                "Host {host:?}, x-odmesh-cluster {spoof:?}: {body}"
            );
            assert!(
                body.starts_with("odmesh: cannot route this request: "),
                "Host {host:?}: the body should say why: {body:?}"
            );
        }
    }
    assert_eq!(hello.requests(), 0, "an invalid host reached an upstream");
    assert_eq!(mesh.cluster_manager_stat("cluster_added"), added);
    let control_after = mesh.control.wait_all_answered(Duration::from_secs(5));
    assert_eq!(
        control_after["odmesh_xds_requests_total"], control_before["odmesh_xds_requests_total"],
        "an invalid host made Envoy ask the control plane for a cluster"
    );
    assert!(mesh.control.subscribed_clusters().is_empty());
}

#[test]
fn a_spoofed_cluster_header_reaches_only_the_vip_of_the_host() {
    let env = TestEnv::new("routing_spoofed_cluster_header");
    let hello = EchoUpstream::start("hello-1");
    let other = EchoUpstream::start("other-1");
    let mesh = Mesh::start(
        &env,
        &[
            Instance::new("hello", hello.port()),
            Instance::new("other", other.port()),
        ],
    );
    // Both clusters exist in Envoy, so a spoofed name would have somewhere to go.
    assert_eq!(mesh.route("other"), "other-1");
    assert_eq!(mesh.route("hello"), "hello-1");
    let xds_requests = |m: &Mesh| m.envoy.stat("cluster.odmesh_xds.upstream_rq_total");
    let xds_before = xds_requests(&mesh);

    for spoofs in [
        &["odmesh_xds"][..],
        &["other.vip"],
        &["other.svip"],
        &["odmesh_xds", "other.vip"],
    ] {
        let mut request = Request::get("/").host("hello");
        for spoof in spoofs {
            request = request.header("x-odmesh-cluster", spoof);
        }
        let response = mesh.send(&request);
        assert_eq!(response.status, 200, "{spoofs:?}: {}", response.text());
        let echo = response.json();
        assert_eq!(echo["upstream"], "hello-1", "{spoofs:?}");
        assert_eq!(
            echo["headers"]["x-odmesh-cluster"],
            Shell::current().cluster_header_upstream("hello.vip"),
            "{spoofs:?}"
        );
    }
    assert_eq!(hello.requests(), 5);
    assert_eq!(other.requests(), 1, "a spoofed header reached other.vip");
    assert_eq!(
        xds_requests(&mesh),
        xds_before,
        "a spoofed header reached the xDS cluster"
    );
    assert_eq!(
        mesh.control.subscribed_clusters(),
        ["hello.vip", "other.vip"],
        "a spoofed header made Envoy discover a cluster"
    );
}

/// `java` from the machine (Java 17, as the Eureka tests use).
fn java() -> std::process::Command {
    let found = std::process::Command::new("java")
        .arg("-version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        found,
        "`java` (17 or later) is not on PATH; it runs the JDK client of this test"
    );
    std::process::Command::new("java")
}

#[test]
fn a_plain_jdk_client_with_envoy_as_its_http_proxy_reaches_the_vip_its_url_names() {
    // The zero-code entry for a JDK service: `-Dhttp.proxyHost` pointing at its Envoy; the
    // request goes out as `GET http://hello/ HTTP/1.1`, and the URL's host is the VIP.
    let env = TestEnv::new("routing_jdk_proxy");
    let hello = EchoUpstream::start("hello-1");
    let mesh = Mesh::start(&env, &[Instance::new("hello", hello.port())]);
    let source = odmesh_e2e::repo_root().join("tests/jdk/ProxyGet.java");
    for client in ["urlconnection", "httpclient"] {
        let output = java()
            .arg(format!("-Dhttp.proxyHost={}", mesh.egress().ip()))
            .arg(format!("-Dhttp.proxyPort={}", mesh.egress().port()))
            .arg(&source)
            .args([client, "http://hello/jdk"])
            .output()
            .expect("java runs");
        let out = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "{client}: {out}{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let (status, body) = out.trim().split_once(' ').expect("status and body");
        assert_eq!(status, "200", "{client}: {out}");
        let body: serde_json::Value = serde_json::from_str(body).expect("the echo's JSON");
        assert_eq!(body["upstream"], "hello-1", "{client}");
        assert_eq!(body["path"], "/jdk", "{client}");
    }
    assert_eq!(hello.requests(), 2);
}

/// The format the route-resolution test gives the shipped bootstrap's access log.
const RESOLUTIONS_FORMAT: &str = "                  inline_string: \"RESOLVED host=%REQ(:AUTHORITY)% status=%RESPONSE_CODE% flags=%RESPONSE_FLAGS% resolutions=%ROUTE_RESOLUTION_COUNT%\\n\"";

#[test]
fn each_request_resolves_its_route_once_with_the_native_module_and_twice_with_wasm() {
    let env = TestEnv::new("routing_route_resolutions");
    let hello = EchoUpstream::start("hello-1");
    let registry = RegistryFile::create(
        &env.log_dir().join("registry.yaml"),
        &[Instance::new("hello", hello.port())],
    );
    let control = ControlPlane::start(&env, "control", registry.path(), &[]);
    let shipped = odmesh_bootstrap(control.xds().port());
    let anchor = "          stat_prefix: odmesh_egress\n";
    assert_eq!(shipped.matches(anchor).count(), 1, "{shipped}");
    // The shipped access log, with a format of this test's.
    let format = (shipped.lines())
        .find(|line| {
            line.trim_start()
                .starts_with("inline_string: \"[%START_TIME%]")
        })
        .expect("the shipped access log's format");
    let bootstrap = (shipped.replace(format, RESOLUTIONS_FORMAT)).replace(
        anchor,
        &format!("{anchor}          record_route_resolution_stats: true\n"),
    );
    let envoy = Envoy::start(&env, "envoy", &bootstrap);
    envoy.wait_xds_connected(true, Duration::from_secs(10));

    // A first request (the cluster is discovered on demand), a second, a secure one to an
    // unregistered VIP, an unregistered VIP, and a host that names no VIP.
    let sent = [
        ("hello", 200),
        ("hello", 200),
        ("hello:8443", 503),
        ("late", 503),
        ("bad_name!", 400),
    ];
    let listener = envoy.listener(EGRESS_LISTENER);
    for (host, status) in sent {
        let response = Request::get("/").host(host).send(listener);
        assert_eq!(response.status, status, "Host {host}: {}", response.text());
    }
    assert_eq!(hello.requests(), 2);

    // The wasm filter writes the cluster header after the route was resolved, so Envoy
    // resolves it again (not for the host it refuses itself); the native module chooses the
    // cluster while the route resolves.
    let expected = |host: &str| match Shell::current() {
        Shell::Wasm if host == "bad_name!" => 1,
        Shell::Wasm => 2,
        Shell::Native => 1,
    };
    // Envoy writes access logs out every 10 s (`--file-flush-interval-msec`).
    let lines = wait_for(Duration::from_secs(30), "the access log lines", || {
        let log = envoy.log();
        let lines: Vec<String> = (log.lines())
            .filter(|line| line.starts_with("RESOLVED "))
            .map(str::to_owned)
            .collect();
        (lines.len() >= sent.len()).then_some(lines)
    });
    assert_eq!(lines.len(), sent.len(), "{lines:#?}");
    for ((host, status), line) in sent.iter().zip(&lines) {
        let want = format!("RESOLVED host={host} status={status} ");
        assert!(line.starts_with(&want), "{line:?} should start {want:?}");
        let resolutions = expected(host);
        assert!(
            line.ends_with(&format!(" resolutions={resolutions}")),
            "{:?}: the route of a request to {host} should be resolved {resolutions} time(s): \
             {line}",
            Shell::current()
        );
    }
    eprintln!("{:?}: {lines:#?}", Shell::current());
}

/// The shipped bootstrap's example access log (docs/envoy.md, "The access log"): a routed
/// request's line on Envoy's standard output names its cluster and upstream, a request for
/// an unregistered VIP's names its cluster and the flag UH.
#[test]
fn each_request_is_logged_on_envoys_stdout_with_its_cluster_and_upstream() {
    let env = TestEnv::new("routing_access_log");
    let hello = EchoUpstream::start("hello-1");
    let mesh = Mesh::start(&env, &[Instance::new("hello", hello.port())]);
    let routed = mesh.send(&Request::get("/logged?n=1").host("hello"));
    assert_eq!(routed.status, 200, "{}", routed.text());
    assert_eq!(mesh.get("nosuch").status, 503);

    let upstream = format!("upstream=127.0.0.1:{}", hello.port());
    let line_of = |path: &str| {
        let log = mesh.envoy.log();
        (log.lines())
            .find(|line| line.contains(path))
            .map(str::to_owned)
    };
    // Envoy writes access logs out every 10 s (`--file-flush-interval-msec`).
    let logged = wait_for(ACCESS_LOG_FLUSH, "the request's access log line", || {
        line_of("\"GET hello /logged?n=1 HTTP/1.1\"")
    });
    for part in [" 200 - ", "cluster=hello.vip", &upstream] {
        assert!(logged.contains(part), "{part:?} is not in {logged:?}");
    }
    let refused = wait_for(ACCESS_LOG_FLUSH, "the refused request's line", || {
        line_of("\"GET nosuch / HTTP/1.1\"")
    });
    for part in [" 503 UH ", "cluster=nosuch.vip"] {
        assert!(refused.contains(part), "{part:?} is not in {refused:?}");
    }
}

/// How long an access log line may take to reach Envoy's output: its flush interval (10 s)
/// and room for a slow machine.
const ACCESS_LOG_FLUSH: Duration = Duration::from_secs(15);
