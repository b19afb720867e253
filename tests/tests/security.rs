//! The production setup against real Envoy and real clients: xDS over mutual TLS with the
//! shipped `envoy/odmesh-production.yaml`, the embedded registry with a tokens file, and what
//! a hostile client gets from the registry (a clear answer, and nothing changed). Needs
//! `make envoy`, `make wasm`, `cargo build -p odmesh-control`, openssl, and the Eureka clients.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use odmesh_e2e::mesh::EGRESS_LISTENER;
use odmesh_e2e::{
    ClientDriver, ControlPlane, EchoUpstream, Envoy, EurekaClient, Instance, Mesh, Registration,
    RegistryFile, Request, Response, Source, TestCa, TestEnv, TlsClient, hold_for,
    odmesh_bootstrap, repo_root, shipped_bootstrap, timed, wait_until,
};
use serde_json::{Value, json};

/// How long anything here may take.
const DEADLINE: Duration = Duration::from_secs(15);

/// `envoy/odmesh-production.yaml` with the test's certificates, the control plane at
/// `localhost:<xds_port>`, and the listener and admin on free ports.
fn production_bootstrap(xds_port: u16, ca: &TestCa, proxy: &odmesh_e2e::CertifiedKey) -> String {
    let path_of = |p: &std::path::Path| p.to_string_lossy().into_owned();
    let xds = format!("port_value: {xds_port}");
    let (ca, cert, key) = (
        path_of(ca.cert()),
        path_of(&proxy.cert),
        path_of(&proxy.key),
    );
    shipped_bootstrap(
        "odmesh-production.yaml",
        &[
            ("port_value: 15001", "port_value: 0", 1),
            ("port_value: 15006", "port_value: 0", 1),
            ("port_value: 9901", "port_value: 0", 1),
            ("port_value: 18000", &xds, 1),
            ("/etc/odmesh/xds-ca.pem", &ca, 1),
            ("/etc/odmesh/proxy.pem", &cert, 1),
            ("/etc/odmesh/proxy.key", &key, 1),
            // SNI, the expected SAN, and the address: the test certificate names localhost.
            ("odmesh-control.mesh.internal", "localhost", 3),
        ],
    )
}

/// A bootstrap without its comments and without its `odmesh_xds` cluster (up to the
/// listeners): what the two shipped bootstraps must share.
fn without_xds_cluster(yaml: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_cluster = false;
    for line in yaml.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with('#') || trimmed.is_empty() {
            continue;
        }
        if trimmed == "- name: odmesh_xds" {
            in_cluster = true;
        } else if line == "  listeners:" {
            in_cluster = false;
        }
        if !in_cluster {
            out.push(line.to_owned());
        }
    }
    out
}

#[test]
fn the_production_bootstrap_differs_from_the_shipped_one_only_in_its_xds_cluster() {
    let read = |name: &str| {
        let path = repo_root().join("envoy").join(name);
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    };
    let (shipped, production) = (read("odmesh.yaml"), read("odmesh-production.yaml"));
    assert_eq!(
        without_xds_cluster(&shipped),
        without_xds_cluster(&production)
    );
    assert!(production.contains("UpstreamTlsContext") && production.contains("tls_certificates"));
}

#[test]
fn xds_over_mutual_tls_serves_the_production_bootstrap_and_no_proxy_without_a_certificate() {
    let env = TestEnv::new("security_xds_mtls");
    let ca = TestCa::new(env.log_dir(), "xds");
    let server = ca.issue("localhost");
    let proxy = ca.issue_client("proxy");
    let hello = EchoUpstream::start("hello-1");
    let registry = RegistryFile::create(
        &env.log_dir().join("registry.yaml"),
        &[Instance::new("hello", hello.port())],
    );
    let path = |p: &std::path::Path| p.to_string_lossy().into_owned();
    let control = ControlPlane::start(
        &env,
        "control",
        registry.path(),
        &[
            "--xds-tls-cert",
            &path(&server.cert),
            "--xds-tls-key",
            &path(&server.key),
            "--xds-client-ca",
            &path(ca.cert()),
        ],
    );
    let envoy = Envoy::start(
        &env,
        "envoy",
        &production_bootstrap(control.xds().port(), &ca, &proxy),
    );
    envoy.wait_xds_connected(true, DEADLINE);
    let response = Request::get("/")
        .host("hello")
        .send(envoy.listener(EGRESS_LISTENER));
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(response.json()["upstream"], "hello-1");

    // The shipped plaintext bootstrap, without a certificate: it never gets a stream, and a
    // new VIP fails after the discovery timeout.
    let plain = Envoy::start(&env, "envoy-plain", &odmesh_bootstrap(control.xds().port()));
    hold_for(
        Duration::from_secs(2),
        "the plaintext Envoy to get no stream",
        || control.proxies().len() == 1,
    );
    let (response, took) = timed(|| {
        Request::get("/")
            .host("hello")
            .send(plain.listener(EGRESS_LISTENER))
    });
    assert_eq!(response.status, 503, "{}", response.text());
    eprintln!("plaintext proxy: 503 after {took:?}; the mTLS proxy was served");
    assert_eq!(
        control.proxies().len(),
        1,
        "only the mTLS proxy has a stream"
    );
    assert_eq!(hello.requests(), 1);
}

/// A tokens file with the identity `secure` (VIP `secure`), an `intruder`, and an operator.
const TOKENS: &str = "identities:\n  - name: secure\n    token: secure-token-0123456789\n  - name: intruder\n    token: intruder-token-0123456789\n  - name: ops\n    token: ops-token-0123456789abc\n    operator: true\n";

/// A registration of `id` for app/VIP `app` at `ip:port`, as a Eureka client sends it.
fn registration(app: &str, id: &str, ip: &str, port: u16) -> Value {
    let mut instance = Instance::new(app, port).id(id).to_eureka();
    instance["ipAddr"] = json!(ip);
    json!({ "instance": instance })
}

/// Sends `method path` to the embedded registry of `mesh`, with `token` as Bearer if given
/// and `body` as JSON if given.
fn eureka<R>(
    mesh: &Mesh<R>,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<String>,
) -> Response {
    let addr = mesh.control.eureka_addr();
    let mut request = Request::new(method, &format!("/eureka{path}")).host(&addr.to_string());
    if let Some(token) = token {
        request = request.header("authorization", &format!("Bearer {token}"));
    }
    if let Some(body) = body {
        request = request
            .header("content-type", "application/json")
            .body(body);
    }
    request.send(addr)
}

#[test]
fn with_a_tokens_file_a_real_client_registers_and_nobody_else_can_hijack_or_drain_its_vip() {
    let client = EurekaClient::Python;
    client.require_installed();
    let env = TestEnv::new("security_eureka_auth");
    let tokens = env.write_file("tokens.yaml", TOKENS);
    let tokens = tokens.to_string_lossy().into_owned();
    let mesh = Mesh::start_source(&env, Source::ServeEureka, &["--eureka-auth", &tokens]);
    let registration = Registration {
        app: "secure".into(),
        id: "secure-1".into(),
        heartbeat_secs: 1,
        lease_secs: 10,
        credentials: Some(("secure".into(), "secure-token-0123456789".into())),
    };
    let mut driver = ClientDriver::start(
        &env,
        "driver",
        client,
        mesh.control.eureka_addr(),
        &registration,
    );
    driver.wait_report("registered", DEADLINE);
    wait_until(DEADLINE, "secure to route", || {
        mesh.get("secure").status == 200
    });
    let impostor = EchoUpstream::start("impostor");

    // Without credentials: 401, for writes and reads.
    let anonymous = eureka(
        &mesh,
        "POST",
        "/apps/SECURE",
        None,
        Some(registration_body("secure", "evil-1", impostor.port())),
    );
    assert_eq!(anonymous.status, 401, "{}", anonymous.text());
    assert!(anonymous.header("www-authenticate").is_some());
    assert_eq!(eureka(&mesh, "GET", "/apps", None, None).status, 401);
    // Another identity: may not register the VIP, drain or remove the instance.
    let intruder = Some("intruder-token-0123456789");
    let hijack = eureka(
        &mesh,
        "POST",
        "/apps/SECURE",
        intruder,
        Some(registration_body("secure", "evil-1", impostor.port())),
    );
    assert_eq!(hijack.status, 403, "{}", hijack.text());
    assert!(
        hijack
            .text()
            .contains("may not register instances of app \"SECURE\""),
        "{}",
        hijack.text()
    );
    for (method, path) in [
        ("PUT", "/apps/SECURE/secure-1/status?value=OUT_OF_SERVICE"),
        ("DELETE", "/apps/SECURE/secure-1"),
    ] {
        let answer = eureka(&mesh, method, path, intruder, None);
        assert_eq!(answer.status, 403, "{method} {path}: {}", answer.text());
    }
    for _ in 0..10 {
        assert_eq!(
            mesh.get("secure").status,
            200,
            "the VIP still routes to its owner"
        );
    }
    assert_eq!(impostor.requests(), 0);
    let metrics = mesh.control.metrics();
    assert_eq!(
        metrics[r#"odmesh_eureka_refused_total{reason="unauthenticated"}"#],
        2
    );
    assert_eq!(
        metrics[r#"odmesh_eureka_refused_total{reason="forbidden"}"#],
        3
    );
    // An operator may drain it.
    let drained = eureka(
        &mesh,
        "PUT",
        "/apps/SECURE/secure-1/status?value=OUT_OF_SERVICE",
        Some("ops-token-0123456789abc"),
        None,
    );
    assert_eq!(drained.status, 200, "{}", drained.text());
    wait_until(DEADLINE, "the drained VIP to answer 503", || {
        mesh.get("secure").status == 503
    });
}

/// The registration body of `id` of app `app` at 127.0.0.1:`port`.
fn registration_body(app: &str, id: &str, port: u16) -> String {
    registration(app, id, "127.0.0.1", port).to_string()
}

/// Sends `head` and then `body` in one go on a new connection and reads the whole answer.
fn post_raw(addr: std::net::SocketAddr, head: &str, body: &[u8]) -> String {
    let mut conn = TcpStream::connect(addr).unwrap();
    conn.set_read_timeout(Some(DEADLINE)).unwrap();
    conn.set_write_timeout(Some(DEADLINE)).unwrap();
    conn.write_all(head.as_bytes()).unwrap();
    // The server may answer before the body is all sent; it reads the rest away.
    let _ = conn.write_all(body);
    let mut out = String::new();
    let _ = conn.read_to_string(&mut out);
    out
}

#[test]
fn a_hostile_client_gets_a_clear_answer_from_the_registry_and_changes_nothing() {
    let env = TestEnv::new("security_eureka_bad_input");
    let mesh = Mesh::start_source(&env, Source::ServeEureka, &["--eureka-header-timeout", "1"]);
    let addr = mesh.control.eureka_addr();
    let cases: Vec<(&str, &str, String, u16, &str)> = vec![
        (
            "a browser page's text/plain POST",
            "text/plain",
            registration("x", "x-1", "10.0.0.1", 80).to_string(),
            415,
            "application/json",
        ),
        (
            "the cloud metadata address",
            "application/json",
            registration("x", "x-1", "169.254.169.254", 80).to_string(),
            400,
            "link-local",
        ),
        (
            "an app named ' '",
            "application/json",
            registration(" ", "x-1", "10.0.0.1", 80).to_string(),
            400,
            "`app`",
        ),
        (
            "an instance id that is a path",
            "application/json",
            {
                let mut body = registration("x", "x-1", "10.0.0.1", 80);
                body["instance"]["instanceId"] = json!("a b/../c");
                body.to_string()
            },
            400,
            "instanceId",
        ),
        (
            "not JSON",
            "application/json",
            "{\"instance\":".to_owned(),
            400,
            "not a Eureka registration",
        ),
    ];
    for (what, content_type, body, status, says) in cases {
        let path = if what.contains("' '") {
            "/eureka/apps/%20"
        } else {
            "/eureka/apps/X"
        };
        let answer = Request::new("POST", path)
            .host(&addr.to_string())
            .header("content-type", content_type)
            .body(body)
            .send(addr);
        assert_eq!(answer.status, status, "{what}: {}", answer.text());
        assert!(answer.text().contains(says), "{what}: {}", answer.text());
    }
    // 10 MB: a 413 the client reads, not a reset connection.
    let big = vec![b'x'; 10 * 1024 * 1024];
    let head = format!(
        "POST /eureka/apps/X HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        big.len()
    );
    let answer = post_raw(addr, &head, &big);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer:.200}");
    // Headers that never end: the connection is closed after --eureka-header-timeout.
    let started = Instant::now();
    let slow = post_raw(
        addr,
        &format!("GET /eureka/apps HTTP/1.1\r\nhost: {addr}\r\n"),
        b"",
    );
    assert!(!slow.contains("200 OK"), "{slow}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "cut after {:?}",
        started.elapsed()
    );

    // Nothing was registered.
    let apps = Request::get("/eureka/apps")
        .host(&addr.to_string())
        .header("accept", "application/json")
        .send(addr);
    assert_eq!(
        apps.json()["applications"]["application"],
        json!([]),
        "{}",
        apps.text()
    );
    let metrics = mesh.control.metrics();
    assert_eq!(
        metrics[r#"odmesh_eureka_refused_total{reason="body"}"#], 2,
        "415 and 413"
    );
    assert_eq!(
        metrics[r#"odmesh_eureka_refused_total{reason="invalid"}"#],
        4
    );
    assert!(metrics["odmesh_eureka_http_timeouts_total"] >= 1);
}

/// Writes `content` over `path` as an operator should: a new file renamed over it.
fn replace_file(path: &std::path::Path, content: &str) {
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, content).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// A tokens file: `keeper` (in every version), `revoked` (only in this one).
const TOKENS_BEFORE: &str = "identities:\n  - name: keeper\n    token: keeper-token-0123456789\n  - name: revoked\n    token: revoked-token-0123456789\n";
/// The next version: `revoked` gone, `fresh` added.
const TOKENS_AFTER: &str = "identities:\n  - name: keeper\n    token: keeper-token-0123456789\n  - name: fresh\n    token: fresh-token-0123456789\n";
/// A version that is not a tokens file (`operator` is not a boolean), with a token in it.
const TOKENS_BROKEN: &str = "identities:\n  - name: keeper\n    token: keeper-token-0123456789\n  - name: leaky\n    token: leaked-token-0123456789\n    operator: maybe\n";

/// `keeper` heartbeating its instance on the embedded registry at `addr` on its own thread
/// until stopped (also when the test fails): every answer not 200 is kept.
struct Keeper {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<(usize, Vec<String>)>>,
}

impl Keeper {
    fn start(addr: std::net::SocketAddr) -> Keeper {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            let (mut sent, mut failed) = (0, Vec::new());
            while !stopped.load(std::sync::atomic::Ordering::Relaxed) {
                let answer = Request::new("PUT", "/eureka/apps/KEEPER/keeper-1")
                    .host(&addr.to_string())
                    .header("authorization", "Bearer keeper-token-0123456789")
                    .try_send(addr);
                sent += 1;
                match answer {
                    Ok(answer) if answer.status == 200 => {}
                    Ok(answer) => failed.push(format!("{}: {}", answer.status, answer.text())),
                    Err(e) => failed.push(e.to_string()),
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            (sent, failed)
        });
        Keeper {
            stop,
            thread: Some(thread),
        }
    }

    /// Stops it; asserts that it sent requests and that none failed.
    fn assert_never_failed(mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let thread = self.thread.take().expect("running");
        let (sent, failed) = thread.join().unwrap();
        assert!(
            failed.is_empty(),
            "{} of {sent} failed: {failed:?}",
            failed.len()
        );
        assert!(sent > 10, "keeper sent {sent} requests");
        eprintln!("keeper: {sent} heartbeats, none failed");
    }
}

impl Drop for Keeper {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The status of `identity`'s heartbeat of its instance (registered first if `register`).
fn heartbeat_as(addr: std::net::SocketAddr, identity: &str, register: bool) -> u16 {
    let app = identity.to_ascii_uppercase();
    let token = format!("Bearer {identity}-token-0123456789");
    if register {
        let answer = Request::new("POST", &format!("/eureka/apps/{app}"))
            .host(&addr.to_string())
            .header("authorization", &token)
            .header("content-type", "application/json")
            .body(registration_body(identity, &format!("{identity}-1"), 9))
            .send(addr);
        assert_eq!(
            answer.status,
            204,
            "{identity} registers: {}",
            answer.text()
        );
    }
    let path = format!("/eureka/apps/{app}/{identity}-1");
    (Request::new("PUT", &path).host(&addr.to_string()))
        .header("authorization", &token)
        .send(addr)
        .status
}

#[test]
fn a_token_removed_from_the_tokens_file_is_refused_after_sighup_or_the_change_and_others_never_fail()
 {
    let env = TestEnv::new("security_tokens_reload");
    let tokens = env.write_file("tokens.yaml", TOKENS_BEFORE);
    let tokens_arg = tokens.to_string_lossy().into_owned();

    // On SIGHUP (the files are not looked at otherwise: --reload-interval 0).
    let control = ControlPlane::start_source(
        &env,
        "control-sighup",
        Source::ServeEureka,
        &["--eureka-auth", &tokens_arg, "--reload-interval", "0"],
    );
    let addr = control.eureka_addr();
    assert_eq!(heartbeat_as(addr, "keeper", true), 200);
    assert_eq!(heartbeat_as(addr, "revoked", true), 200);
    let keeper = Keeper::start(addr);
    replace_file(&tokens, TOKENS_AFTER);
    hold_for(
        Duration::from_secs(1),
        "the old file in force until SIGHUP",
        || heartbeat_as(addr, "revoked", false) == 200,
    );
    control.hangup();
    let (_, took) = timed(|| {
        wait_until(DEADLINE, "the removed identity refused", || {
            heartbeat_as(addr, "revoked", false) == 401
        })
    });
    eprintln!("SIGHUP: the removed identity refused {took:?} later");
    assert_eq!(heartbeat_as(addr, "fresh", true), 200, "the new identity");
    assert_eq!(control.metric("odmesh_eureka_tokens_reloads_total"), 1);

    // A broken version: refused, saying where and why and no token; the last good stays.
    replace_file(&tokens, TOKENS_BROKEN);
    control.hangup();
    wait_until(DEADLINE, "the broken file refused", || {
        control.metric("odmesh_eureka_tokens_reloads_refused_total") == 1
    });
    let log = control.process().log();
    let refusal = (log.lines())
        .find(|line| line.contains("--eureka-auth: not reloaded"))
        .unwrap_or_else(|| panic!("no refusal in the log:\n{log}"));
    assert!(
        refusal.contains("tokens.yaml") && refusal.contains("identities[1].operator"),
        "{refusal}"
    );
    assert!(!log.contains("leaked-token"), "a token in the log:\n{log}");
    assert_eq!(
        heartbeat_as(addr, "fresh", false),
        200,
        "the last good file"
    );
    assert_eq!(heartbeat_as(addr, "revoked", false), 401);
    assert!(control.process().log().contains("SIGHUP"));
    keeper.assert_never_failed();
    drop(control);

    // On the change alone, looked at every 200 ms.
    replace_file(&tokens, TOKENS_BEFORE);
    let control = ControlPlane::start_source(
        &env,
        "control-change",
        Source::ServeEureka,
        &["--eureka-auth", &tokens_arg, "--reload-interval", "0.2"],
    );
    let addr = control.eureka_addr();
    assert_eq!(heartbeat_as(addr, "keeper", true), 200);
    assert_eq!(heartbeat_as(addr, "revoked", true), 200);
    let keeper = Keeper::start(addr);
    replace_file(&tokens, TOKENS_AFTER);
    let (_, took) = timed(|| {
        wait_until(DEADLINE, "the removed identity refused", || {
            heartbeat_as(addr, "revoked", false) == 401
        })
    });
    eprintln!("file change: the removed identity refused {took:?} later");
    assert_eq!(heartbeat_as(addr, "fresh", true), 200);
    keeper.assert_never_failed();
    assert_eq!(control.metric("odmesh_eureka_tokens_reloads_total"), 1);
}

/// `POST /eureka/apps/<APP>` of `app`'s instance at 127.0.0.1:`port`, on a kept-alive
/// connection.
fn register_request(app: &str, port: u16) -> Request {
    Request::new(
        "POST",
        &format!("/eureka/apps/{}", app.to_ascii_uppercase()),
    )
    .host("localhost")
    .header("content-type", "application/json")
    .header("connection", "keep-alive")
    .body(registration_body(app, &format!("{app}-1"), port))
}

#[test]
fn rotated_certificates_serve_new_connections_and_connections_made_before_keep_going() {
    let env = TestEnv::new("security_certificates_reload");
    let ca = TestCa::new(env.log_dir(), "rotated");
    let proxy = ca.issue_client("proxy");
    let dir = env.log_dir();
    let (eureka_cert, eureka_key) = (dir.join("eureka.pem"), dir.join("eureka.key"));
    let (xds_cert, xds_key) = (dir.join("xds.pem"), dir.join("xds.key"));
    let first = ca.issue("localhost");
    first.install(&eureka_cert, &eureka_key);
    first.install(&xds_cert, &xds_key);
    let first_leaf = first.leaf();
    let path = |p: &std::path::Path| p.to_string_lossy().into_owned();
    let control = ControlPlane::start_source(
        &env,
        "control",
        Source::ServeEureka,
        &[
            "--eureka-tls-cert",
            &path(&eureka_cert),
            "--eureka-tls-key",
            &path(&eureka_key),
            "--xds-tls-cert",
            &path(&xds_cert),
            "--xds-tls-key",
            &path(&xds_key),
            "--xds-client-ca",
            &path(ca.cert()),
            "--reload-interval",
            "0.2",
            // The connection made before the rotation may sit idle meanwhile.
            "--eureka-header-timeout",
            "60",
        ],
    );
    let eureka = control.eureka_addr();
    let connect_eureka = || TlsClient::connect(eureka, ca.cert(), "localhost", None, &["http/1.1"]);
    let connect_xds =
        || TlsClient::connect(control.xds(), ca.cert(), "localhost", Some(&proxy), &["h2"]);
    let (hello, world) = (
        EchoUpstream::start("hello-1"),
        EchoUpstream::start("world-1"),
    );

    // A registry client and a proxy (xDS over mutual TLS) connected before the rotation.
    let mut before = connect_eureka().unwrap();
    assert_eq!(before.served(), first_leaf);
    let registered = before
        .send(&register_request("hello", hello.port()))
        .unwrap();
    assert_eq!(registered.status, 204, "{}", registered.text());
    let envoy = Envoy::start(
        &env,
        "envoy",
        &production_bootstrap(control.xds().port(), &ca, &proxy),
    );
    envoy.wait_xds_connected(true, DEADLINE);
    let route = |host: &str| {
        Request::get("/")
            .host(host)
            .send(envoy.listener(EGRESS_LISTENER))
    };
    wait_until(DEADLINE, "hello to route", || route("hello").status == 200);
    let stream = control.proxies()[0]["stream_id"].clone();
    let xds_before = connect_xds().unwrap();
    assert_eq!(xds_before.served(), first_leaf);
    assert_eq!(xds_before.alpn().as_deref(), Some("h2"));

    // A new key without its certificate: refused, and the first pair still serves.
    let second = ca.issue("localhost");
    let second_leaf = second.leaf();
    let tmp = eureka_key.with_extension("new");
    std::fs::copy(&second.key, &tmp).unwrap();
    std::fs::rename(&tmp, &eureka_key).unwrap();
    wait_until(DEADLINE, "the mismatched pair refused", || {
        control.metric("odmesh_eureka_tls_reloads_refused_total") == 1
    });
    let log = control.process().log();
    let refusal = (log.lines())
        .find(|line| line.contains("--eureka-tls-cert: not reloaded"))
        .unwrap_or_else(|| panic!("no refusal in the log:\n{log}"));
    assert!(
        refusal.contains("eureka.pem and ")
            && refusal.contains("eureka.key do not make a usable server identity"),
        "{refusal}"
    );
    assert_eq!(connect_eureka().unwrap().served(), first_leaf);

    // The whole pair, on both servers: new connections get it.
    second.install(&eureka_cert, &eureka_key);
    second.install(&xds_cert, &xds_key);
    let (_, took) = timed(|| {
        wait_until(
            DEADLINE,
            "new connections served the new certificate",
            || {
                connect_eureka().unwrap().served() == second_leaf
                    && connect_xds().unwrap().served() == second_leaf
            },
        )
    });
    eprintln!("the new certificates served {took:?} after they were installed");
    // A proxy without a certificate of the client CA is still refused.
    let anonymous = TlsClient::connect(control.xds(), ca.cert(), "localhost", None, &["h2"]);
    assert!(
        anonymous.is_ok_and(|c| c.refused(DEADLINE)),
        "served without a certificate"
    );

    // What was connected before keeps going: the registry client registers a new VIP on its
    // connection, and Envoy asks for it on its stream, never reconnected.
    let registered = before
        .send(&register_request("world", world.port()))
        .unwrap();
    assert_eq!(registered.status, 204, "{}", registered.text());
    wait_until(DEADLINE, "world to route", || route("world").status == 200);
    assert_eq!(route("hello").status, 200);
    let proxies = control.proxies();
    assert_eq!(proxies.len(), 1, "{proxies:?}");
    assert_eq!(
        proxies[0]["stream_id"], stream,
        "Envoy's stream is the one from before"
    );
    assert_eq!(envoy.stat("control_plane.connected_state"), Some(1));
    let metrics = control.metrics();
    assert_eq!(metrics["odmesh_eureka_tls_reloads_total"], 1);
    assert_eq!(metrics["odmesh_xds_tls_reloads_total"], 1);
    assert_eq!(metrics["odmesh_xds_tls_reloads_refused_total"], 0);
}
