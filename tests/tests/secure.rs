//! The secure path against real Envoy and `odmesh-control`: `Host: <svip>:8443` reaches the
//! `.svip` cluster, which speaks TLS to the upstream and verifies its certificate with the
//! CA given by `--upstream-ca` and the SVIP as DNS name; a certificate from another CA, or
//! for another name, is refused. The CA and certificates are made by the test with the
//! `openssl` command. Needs `make envoy`, `make wasm`, `cargo build -p odmesh-control`,
//! `openssl` and `python3`.

use odmesh_e2e::{EchoUpstream, Instance, Mesh, Request, Response, TestCa, TestEnv, TlsUpstream};

/// Starts a mesh whose `--upstream-ca` is `ca`, with a plain echo upstream for VIP `hello`
/// and `tls` as the only instance of SVIP `hello`.
fn secure_mesh(env: &TestEnv, ca: &TestCa, plain: &EchoUpstream, tls: &TlsUpstream) -> Mesh {
    let ca_path = ca.cert().to_string_lossy().into_owned();
    Mesh::start_with(
        env,
        &[
            Instance::new("hello", plain.port()),
            Instance::secure("hello", tls.port()),
        ],
        &["--upstream-ca", &ca_path],
    )
}

/// Envoy's stat for the `hello.svip` cluster, 0 if it does not exist yet.
fn svip_stat(mesh: &Mesh, name: &str) -> u64 {
    mesh.envoy
        .stat(&format!("cluster.hello.svip.{name}"))
        .unwrap_or(0)
}

/// Asserts that a request to the SVIP was refused before any HTTP reached the upstream.
fn assert_refused(mesh: &Mesh, response: &Response, verify_stat: &str) {
    let body = response.text();
    assert_eq!(response.status, 503, "{body}");
    // The bootstrap's local reply for flag UF: JSON naming the failure and its TLS reason.
    let json = response.json();
    assert_eq!(json["error"], "upstream connection failed", "{body}");
    assert_eq!(json["cluster"], "hello.svip", "{body}");
    assert!(
        json["reason"]
            .as_str()
            .is_some_and(|r| r.contains("CERTIFICATE_VERIFY_FAILED")),
        "the 503 should give the TLS failure reason: {body}"
    );
    assert!(
        svip_stat(mesh, &format!("ssl.{verify_stat}")) >= 1,
        "Envoy did not count ssl.{verify_stat}"
    );
    assert_eq!(
        svip_stat(mesh, "ssl.handshake"),
        0,
        "a TLS handshake succeeded"
    );
    assert_eq!(
        svip_stat(mesh, "upstream_rq_total"),
        0,
        "a request reached the upstream"
    );
}

#[test]
fn a_secure_port_reaches_the_svip_over_tls_verified_with_the_test_ca() {
    let env = TestEnv::new("secure_svip_over_tls");
    let ca = TestCa::new(env.log_dir(), "mesh");
    let tls = TlsUpstream::start(&env, "hello-tls", "hello", &ca.issue("hello"));
    let plain = EchoUpstream::start("hello-plain");
    let mesh = secure_mesh(&env, &ca, &plain, &tls);

    for request in [
        Request::get("/s").host("hello:8443"),
        Request::get("/s")
            .host("hello")
            .header("x-odmesh-secure", "true"),
    ] {
        let response = mesh.send(&request);
        assert_eq!(response.status, 200, "{request:?}: {}", response.text());
        let answer = response.json();
        assert_eq!(answer["app"], "hello", "{answer}");
        assert_eq!(answer["tls"], true, "{answer}");
        assert_eq!(answer["path"], "/s", "{answer}");
    }
    assert!(svip_stat(&mesh, "ssl.handshake") >= 1);
    assert_eq!(
        plain.requests(),
        0,
        "a secure request went to the plain upstream"
    );

    // The plain side of the same VIP stays plain.
    let response = mesh.get("hello");
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(response.json()["upstream"], "hello-plain");
    assert_eq!(
        mesh.control.subscribed_clusters(),
        ["hello.svip", "hello.vip"]
    );
}

#[test]
fn an_upstream_certificate_from_another_ca_is_refused() {
    let env = TestEnv::new("secure_other_ca_refused");
    let ca = TestCa::new(env.log_dir(), "mesh");
    let rogue = TestCa::new(env.log_dir(), "rogue");
    let tls = TlsUpstream::start(&env, "hello-rogue", "hello", &rogue.issue("hello"));
    let plain = EchoUpstream::start("hello-plain");
    let mesh = secure_mesh(&env, &ca, &plain, &tls);

    let response = mesh.get("hello:8443");
    assert_refused(&mesh, &response, "fail_verify_error");
    assert_eq!(plain.requests(), 0);
}

#[test]
fn an_upstream_certificate_for_another_name_is_refused() {
    let env = TestEnv::new("secure_other_name_refused");
    let ca = TestCa::new(env.log_dir(), "mesh");
    let tls = TlsUpstream::start(&env, "hello-impostor", "hello", &ca.issue("impostor"));
    let plain = EchoUpstream::start("hello-plain");
    let mesh = secure_mesh(&env, &ca, &plain, &tls);

    let response = mesh.get("hello:8443");
    assert_refused(&mesh, &response, "fail_verify_san");
    assert_eq!(plain.requests(), 0);
}
