//! The odmesh filter in real Envoy: hosts reach the right static cluster, invalid hosts get a
//! clear 400, clients cannot pick a cluster or leak the secure header, counters move, a
//! bad plugin configuration is refused, and two plugins in one VM keep their own
//! configurations. For the shell under test (`ODMESH_FILTER`, see `odmesh_e2e::Shell`): needs
//! `make envoy` and `make wasm` or `make native`.

use std::time::Duration;

use odmesh_e2e::{EchoUpstream, Envoy, Request, Response, Shell, TestEnv, render};

const BOOTSTRAP: &str = include_str!("../envoy/filter-test.yaml");

/// Envoy with the filter, and the echo upstreams behind `hello.vip` and `hello.svip`.
struct Mesh {
    envoy: Envoy,
    vip: EchoUpstream,
    svip: EchoUpstream,
}

impl Mesh {
    /// Starts the upstreams and Envoy, the filter configured with `plugin_config` (JSON).
    fn start(env: &TestEnv, plugin_config: &str) -> Mesh {
        let vip = EchoUpstream::start("hello.vip");
        let svip = EchoUpstream::start("hello.svip");
        let bootstrap = bootstrap(plugin_config, &vip, &svip);
        let envoy = Envoy::start(env, "envoy", &bootstrap);
        Mesh { envoy, vip, svip }
    }

    /// Sends `request` to Envoy's egress listener.
    fn send(&self, request: Request) -> Response {
        request.send(self.envoy.listener("egress"))
    }

    /// Sends `GET /` with `Host: host` and returns the echo upstream's JSON, after checking
    /// that the request was routed (200 from an upstream).
    fn routed(&self, request: Request) -> serde_json::Value {
        let response = self.send(request.clone());
        assert_eq!(
            response.status,
            200,
            "{request:?} was not routed: {}",
            response.text()
        );
        response.json()
    }

    /// The filter's counter `name` (`wasmcustom.<name>` or `dynamicmodulescustom.<name>` in
    /// `/stats`).
    fn counter(&self, name: &str) -> u64 {
        let stat = Shell::current().counter(name);
        self.envoy.stat(&stat).unwrap_or_else(|| {
            let stats = self.envoy.stats();
            let ours: Vec<_> = stats.keys().filter(|k| k.contains("odmesh")).collect();
            panic!("Envoy has no stat {stat}; its odmesh stats: {ours:?}")
        })
    }
}

fn bootstrap(plugin_config: &str, vip: &EchoUpstream, svip: &EchoUpstream) -> String {
    render(
        BOOTSTRAP,
        &[
            ("FILTER", &Shell::current().http_filter(plugin_config, 10)),
            ("ROUTE", &Shell::current().route(plugin_config, 16)),
            ("VIP_PORT", &vip.port().to_string()),
            ("SVIP_PORT", &svip.port().to_string()),
        ],
    )
}

fn get(host: &str) -> Request {
    Request::get("/").host(host)
}

#[test]
fn a_plain_host_reaches_the_vip_cluster() {
    let env = TestEnv::new("filter_plain_host");
    let mesh = Mesh::start(&env, "");

    let echo = mesh.routed(get("hello"));
    assert_eq!(echo["upstream"], "hello.vip");
    let cluster_header = Shell::current().cluster_header_upstream("hello.vip");
    assert_eq!(echo["headers"]["x-odmesh-cluster"], cluster_header);
    assert_eq!(echo["headers"]["host"], "hello");

    let echo = mesh.routed(get("Hello.:8080"));
    assert_eq!(echo["upstream"], "hello.vip");
    assert_eq!(mesh.svip.requests(), 0);
}

#[test]
fn a_secure_port_or_the_secure_header_reaches_the_svip_cluster() {
    let env = TestEnv::new("filter_secure");
    let mesh = Mesh::start(&env, "");

    let echo = mesh.routed(get("hello:8443"));
    assert_eq!(echo["upstream"], "hello.svip");

    for value in ["true", "1"] {
        let echo = mesh.routed(get("hello").header("x-odmesh-secure", value));
        assert_eq!(echo["upstream"], "hello.svip", "x-odmesh-secure: {value}");
        assert!(
            echo["headers"].get("x-odmesh-secure").is_none(),
            "the upstream saw the secure header: {echo}"
        );
    }

    // Any other value means plain, and the header is removed all the same.
    let echo = mesh.routed(get("hello").header("x-odmesh-secure", "false"));
    assert_eq!(echo["upstream"], "hello.vip");
    assert!(
        echo["headers"].get("x-odmesh-secure").is_none(),
        "the upstream saw the secure header: {echo}"
    );
}

#[test]
fn a_configured_suffix_is_stripped_from_the_host() {
    let env = TestEnv::new("filter_suffix");
    let mesh = Mesh::start(&env, r#"{"strip_suffixes": [".mesh.internal"]}"#);

    let echo = mesh.routed(get("HELLO.mesh.internal"));
    assert_eq!(echo["upstream"], "hello.vip");
    let echo = mesh.routed(get("hello.mesh.internal:443"));
    assert_eq!(echo["upstream"], "hello.svip");
}

#[test]
fn a_cluster_header_sent_by_the_client_is_overwritten() {
    let env = TestEnv::new("filter_spoofed_cluster");
    let mesh = Mesh::start(&env, "");

    let echo = mesh.routed(get("hello").header("x-odmesh-cluster", "hello.svip"));
    assert_eq!(echo["upstream"], "hello.vip");
    let cluster_header = Shell::current().cluster_header_upstream("hello.vip");
    assert_eq!(echo["headers"]["x-odmesh-cluster"], cluster_header);

    // An invalid host with a spoofed cluster never reaches that cluster either.
    let response = mesh.send(get("bad_name!").header("x-odmesh-cluster", "hello.vip"));
    assert_eq!(response.status, 400, "{}", response.text());
    assert_eq!(mesh.vip.requests(), 1);
}

#[test]
fn invalid_hosts_get_a_400_that_says_what_was_wrong() {
    let env = TestEnv::new("filter_invalid_hosts");
    let mesh = Mesh::start(&env, "");

    let long = "a".repeat(300);
    for (host, says) in [
        ("", "the host is empty"),
        ("127.0.0.1", "is an IP address"),
        ("[::1]:8080", "is an IP address"),
        ("bad_name!", "'!' at position 8"),
        (long.as_str(), "300 characters, longer than 253"),
        ("hello:99999", "port"),
    ] {
        let response = mesh.send(get(host));
        let body = response.text();
        assert_eq!(response.status, 400, "Host {host:?}: {body}");
        assert!(
            body.starts_with("odmesh: cannot route this request: ") && body.contains(says),
            "Host {host:?}: the body should say {says:?}, it says {body:?}"
        );
        assert_eq!(
            response.header("content-type"),
            Some("text/plain; charset=utf-8")
        );
    }
    assert_eq!(mesh.vip.requests() + mesh.svip.requests(), 0);
}

#[test]
fn the_counters_count_mapped_and_rejected_requests() {
    let env = TestEnv::new("filter_counters");
    let mesh = Mesh::start(&env, "");

    mesh.routed(get("hello"));
    mesh.routed(get("hello.vip"));
    mesh.routed(get("hello:443"));
    let rejected = mesh.send(get("bad_name!"));
    assert_eq!(rejected.status, 400);

    assert_eq!(mesh.counter("odmesh_requests_vip"), 2);
    assert_eq!(mesh.counter("odmesh_requests_svip"), 1);
    assert_eq!(mesh.counter("odmesh_requests_rejected"), 1);
}

#[test]
fn a_plugin_configuration_with_an_unknown_field_is_refused() {
    let env = TestEnv::new("filter_unknown_field");
    let vip = EchoUpstream::start("hello.vip");
    let svip = EchoUpstream::start("hello.svip");
    let bootstrap = bootstrap(r#"{"strip_sufixes": [".mesh.internal"]}"#, &vip, &svip);

    let (status, log) =
        Envoy::start_expecting_exit(&env, "envoy", &bootstrap, Duration::from_secs(30));
    assert!(!status.success(), "Envoy exited with {status}");
    assert!(
        log.contains("unknown field `strip_sufixes`"),
        "Envoy's log should name the unknown field:\n{log}"
    );
    let refused = match Shell::current() {
        Shell::Wasm => "Unable to create Wasm plugin odmesh",
        Shell::Native => "Failed to initialize dynamic module",
    };
    assert!(
        log.contains(refused),
        "Envoy's log should say it refused the filter ({refused}):\n{log}"
    );
}

#[test]
fn envoy_validate_mode_refuses_a_plugin_configuration_with_a_bad_value() {
    let env = TestEnv::new("filter_validate_bad_value");
    let vip = EchoUpstream::start("hello.vip");
    let svip = EchoUpstream::start("hello.svip");

    let good = bootstrap(r#"{"secure_ports": [9443]}"#, &vip, &svip);
    let (status, log) = Envoy::validate(&env, "validate-good", &good);
    assert!(
        status.success(),
        "a good configuration failed validation:\n{log}"
    );

    let bad = bootstrap(r#"{"secure_ports": [0]}"#, &vip, &svip);
    let (status, log) = Envoy::validate(&env, "validate-bad", &bad);
    assert!(
        !status.success(),
        "a bad configuration passed validation:\n{log}"
    );
    assert!(
        log.contains("field `secure_ports`: port 0 is not a port"),
        "Envoy's log should name the bad field:\n{log}"
    );
}

#[test]
fn two_plugins_in_one_vm_each_route_with_their_own_configuration() {
    let env = TestEnv::new("filter_two_plugins");
    let vip = EchoUpstream::start("hello.vip");
    let svip = EchoUpstream::start("hello.svip");
    let shell = Shell::current();
    let internal = r#"{"strip_suffixes": [".mesh.internal"], "cluster_header": "x-route-to"}"#;
    let bootstrap = render(
        include_str!("../envoy/filter-two-plugins.yaml"),
        &[
            ("FILTER_EGRESS", &shell.http_filter("{}", 10)),
            ("FILTER_INTERNAL", &shell.http_filter(internal, 10)),
            ("ROUTE_EGRESS", &shell.route("{}", 16)),
            ("ROUTE_INTERNAL", &shell.route(internal, 16)),
            ("VIP_PORT", &vip.port().to_string()),
            ("SVIP_PORT", &svip.port().to_string()),
        ],
    );
    let envoy = Envoy::start(&env, "envoy", &bootstrap);
    // Wasm: both plugins share each VM: with one plugin Envoy 1.40 also has 3 (the base VM, the
    // main thread's and the worker's, at --concurrency 1); with a VM per plugin it has 6. The
    // native module is loaded once, whatever the number of configurations.
    if shell == Shell::Wasm {
        assert_eq!(envoy.stat("wasm.envoy.wasm.runtime.v8.active"), Some(3));
    }
    let egress = envoy.listener("egress");
    let internal = envoy.listener("internal");

    // Alternating, so that each request follows one of the other plugin.
    for round in 0..3 {
        let response = get("hello.mesh.internal").send(internal);
        assert_eq!(response.status, 200, "round {round}: {}", response.text());
        let echo = response.json();
        assert_eq!(echo["upstream"], "hello.vip");
        let route_to = shell.cluster_header_upstream("hello.vip");
        assert_eq!(echo["headers"]["x-route-to"], route_to);
        assert!(echo["headers"].get("x-odmesh-cluster").is_none(), "{echo}");

        // The default configuration strips no suffix: no such cluster.
        let response = get("hello.mesh.internal").send(egress);
        assert_eq!(response.status, 503, "round {round}: {}", response.text());

        let response = get("hello:8443").send(egress);
        assert_eq!(response.status, 200, "round {round}: {}", response.text());
        let echo = response.json();
        assert_eq!(echo["upstream"], "hello.svip");
        let cluster_header = shell.cluster_header_upstream("hello.svip");
        assert_eq!(echo["headers"]["x-odmesh-cluster"], cluster_header);
        assert!(echo["headers"].get("x-route-to").is_none(), "{echo}");
    }
    assert_eq!(vip.requests(), 3);
    assert_eq!(svip.requests(), 3);
}
