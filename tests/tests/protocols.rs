//! Every protocol a service speaks over HTTP, through the shipped bootstrap with no
//! per-service configuration: gRPC (unary, each streaming kind, deadlines, statuses and
//! trailers), HTTP/1.1 and h2c callers to the same VIP, an HTTP/2-only server declared in the
//! registry, ALPN on the secure side, WebSocket, and streams and answers longer than Envoy's
//! default 15 s route timeout. Real clients and servers: tonic (the demo service
//! `odmesh.demo.Echo`), hyper, rustls, tungstenite. Needs `make envoy`, `make wasm` and
//! `cargo build -p odmesh-control`.

use std::time::{Duration, Instant};

use odmesh_demo::{EchoClient, EchoRequest, SENT_TRAILER, SERVER_TRAILER};
use odmesh_e2e::{
    CHANGE_DEADLINE, GrpcUpstream, HttpUpstream, Instance, Mesh, Request, TestCa, TestEnv,
    Versions, WebSocketClient, block_on_within, grpc_call, h2c_get, wait_until,
};
use tonic::Code;

/// The bound on one message of a stream through the mesh.
const STEP: Duration = Duration::from_secs(5);
/// The bound on all the calls of one test (but the 60 s stream's).
const CALLS: Duration = Duration::from_secs(30);

/// A request stream of `messages` as the client-streaming and bidi calls take it.
fn requests(messages: &[&str]) -> impl tokio_stream::Stream<Item = EchoRequest> + use<> {
    let owned: Vec<EchoRequest> = messages.iter().map(|m| EchoRequest::new(m)).collect();
    tokio_stream::iter(owned)
}

/// Envoy's stat for cluster `cluster`, 0 if Envoy does not have it (yet).
fn cluster_stat(mesh: &Mesh, cluster: &str, name: &str) -> u64 {
    mesh.envoy
        .stat(&format!("cluster.{cluster}.{name}"))
        .unwrap_or(0)
}

#[test]
fn grpc_unary_and_every_streaming_kind_pass_through_with_statuses_and_trailers() {
    let env = TestEnv::new("protocols_grpc_calls");
    let server = GrpcUpstream::start("greeter-1");
    let mesh = Mesh::start(&env, &[Instance::new("greeter", server.port())]);
    assert!(
        mesh.envoy
            .stat("cluster.greeter.vip.upstream_rq_total")
            .is_none(),
        "Envoy held greeter.vip before any call"
    );
    let egress = mesh.egress();

    block_on_within(CALLS, async {
        let mut client = EchoClient::connect(egress, "greeter")
            .await
            .expect("connect");

        // Unary, and the first call to the VIP: it waits for discovery like HTTP/1.1 does.
        let reply = client
            .unary(tonic::Request::new(EchoRequest::new("hi")))
            .await
            .expect("the first unary call succeeds")
            .into_inner();
        assert_eq!(
            (reply.message.as_str(), reply.server.as_str()),
            ("hi", "greeter-1")
        );

        // Server streaming: every reply in order, then the trailers the server wrote.
        let request = EchoRequest {
            count: 5,
            interval_ms: 20,
            ..EchoRequest::new("tick")
        };
        let mut stream = client
            .server_stream(tonic::Request::new(request))
            .await
            .expect("server stream")
            .into_inner();
        let mut indexes = Vec::new();
        while let Some(reply) = stream.message().await.expect("a stream message") {
            indexes.push(reply.index);
        }
        assert_eq!(indexes, [0, 1, 2, 3, 4]);
        let trailers = stream
            .trailers()
            .await
            .expect("trailers")
            .expect("trailers");
        assert_eq!(
            trailers.get(SENT_TRAILER).map(|v| v.to_str().unwrap()),
            Some("5")
        );
        assert_eq!(
            trailers.get(SERVER_TRAILER).map(|v| v.to_str().unwrap()),
            Some("greeter-1")
        );

        // Client streaming: one reply once everything was sent.
        let reply = client
            .client_stream(tonic::Request::new(requests(&["a", "b", "c"])))
            .await
            .expect("client stream")
            .into_inner();
        assert_eq!((reply.message.as_str(), reply.received), ("a b c", 3));

        // Bidirectional: each reply arrives before the next request is sent, so the stream is
        // really interactive through Envoy, not buffered until the end.
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        let outbound = tokio_stream::wrappers::ReceiverStream::new(rx);
        let mut replies = client
            .bidi(tonic::Request::new(outbound))
            .await
            .expect("bidi")
            .into_inner();
        for (i, word) in ["one", "two", "three"].into_iter().enumerate() {
            tx.send(EchoRequest::new(word)).await.expect("send");
            let reply = tokio::time::timeout(STEP, replies.message())
                .await
                .unwrap_or_else(|_| panic!("no reply to {word:?} in {STEP:?}"))
                .expect("a bidi reply")
                .expect("the stream is still open");
            assert_eq!((reply.message.as_str(), reply.index), (word, i as u32));
        }
        drop(tx);
        assert!(replies.message().await.expect("the end").is_none());

        // A failed call: its status, message and trailer come back as the server sent them.
        let failing = EchoRequest {
            fail_code: Code::NotFound as i32,
            ..EchoRequest::new("nobody")
        };
        let status = client
            .unary(tonic::Request::new(failing))
            .await
            .expect_err("the server fails the call");
        assert_eq!(status.code(), Code::NotFound, "{status:?}");
        assert_eq!(status.message(), "failed as asked: nobody");
        assert_eq!(
            status
                .metadata()
                .get(SERVER_TRAILER)
                .map(|v| v.to_str().unwrap()),
            Some("greeter-1")
        );
    });

    let discovered = mesh.cluster_manager_stat("odcds.update_success");
    assert!(
        discovered >= 1,
        "the first call did not go through on-demand discovery"
    );
    // Five calls, each one request upstream.
    assert_eq!(cluster_stat(&mesh, "greeter.vip", "upstream_rq_total"), 5);
}

#[test]
fn a_grpc_deadline_that_passes_ends_the_call_with_deadline_exceeded_and_resets_the_upstream() {
    let env = TestEnv::new("protocols_grpc_deadline");
    // A server that knows nothing of gRPC deadlines (a tonic server would end the call itself
    // at its deadline and race Envoy): whatever ends the call at 300 ms is Envoy.
    let server = HttpUpstream::start("slow-1", Versions::Both);
    let mesh = Mesh::start(&env, &[Instance::new("slow", server.port())]);
    let egress = mesh.egress();

    let (answer, took) = block_on_within(CALLS, async {
        // Warm: the deadline below must not include discovery.
        assert_eq!(h2c_get(egress, "slow", "/").await.status, 200);
        // The server answers after 10 s; the caller allows 300 ms, in the header every gRPC
        // library sends, `grpc-timeout`. The call is made by hand over HTTP/2 because a gRPC
        // client library would give up at the deadline by itself.
        let start = Instant::now();
        let late = EchoRequest::new("late");
        let answer = grpc_call(egress, "slow", "/slow?ms=10000", &late, "300m").await;
        (answer, start.elapsed())
    });
    assert_eq!(
        answer.get("grpc-status").map(String::as_str),
        Some("4"),
        "DEADLINE_EXCEEDED: {answer:?}"
    );
    // Envoy's timers count from its event loop's clock, read when the loop last woke, so
    // they may end a call a few milliseconds before the caller's own clock says (seen in CI:
    // 299.9 ms; policy.rs saw 498.3 ms for 500 ms).
    assert!(
        took >= Duration::from_millis(290) && took < Duration::from_secs(5),
        "the call ended after {took:?}, not at its 300 ms deadline"
    );
    // And the instance's stream was reset, so it can stop working on the call.
    wait_until(CHANGE_DEADLINE, "Envoy to count the upstream reset", || {
        cluster_stat(&mesh, "slow.vip", "upstream_rq_tx_reset") >= 1
    });
}

#[test]
fn grpc_calls_that_no_instance_can_take_get_unavailable_saying_why() {
    let env = TestEnv::new("protocols_grpc_unavailable");
    let server = GrpcUpstream::start("drained-1");
    let closed = odmesh_e2e::free_port(); // nothing listens there
    let mut mesh = Mesh::start(
        &env,
        &[
            Instance::new("drained", server.port()).status("OUT_OF_SERVICE"),
            Instance::new("gone", closed),
        ],
    );
    let egress = mesh.egress();
    let unavailable = |vip: &'static str| async move {
        let mut client = EchoClient::connect(egress, vip).await.expect("connect");
        let status = client
            .unary(tonic::Request::new(EchoRequest::new("hi")))
            .await
            .expect_err("no instance can answer");
        assert_eq!(status.code(), Code::Unavailable, "{vip}: {status:?}");
        status.message().to_owned()
    };

    block_on_within(CALLS, async {
        // Each reason in words, naming the cluster: not registered (flag UH), registered
        // without a healthy instance (UH), the instance refuses connections (UF).
        for (vip, says) in [
            (
                "nosuch",
                "VIP nosuch is not registered (cluster nosuch.vip)",
            ),
            ("drained", "VIP drained has no healthy endpoint"),
            ("gone", "upstream connection failed (cluster gone.vip"),
        ] {
            let message = unavailable(vip).await;
            assert!(message.starts_with(says), "{vip}: {message:?}");
        }
    });

    // The control plane is gone: a VIP Envoy never saw cannot be discovered (NC).
    mesh.control.kill();
    let message = block_on_within(CALLS, unavailable("newcomer"));
    assert!(
        message.starts_with("cluster newcomer.vip not discovered"),
        "{message:?}"
    );
}

#[test]
fn a_sixty_second_grpc_stream_and_a_twenty_second_http1_answer_are_not_cut() {
    let env = TestEnv::new("protocols_long_streams");
    let grpc = GrpcUpstream::start("ticker-1");
    let http = HttpUpstream::start("slowpoke-1", Versions::Both);
    let mesh = Mesh::start(
        &env,
        &[
            Instance::new("ticker", grpc.port()),
            Instance::new("slowpoke", http.port()),
        ],
    );
    let egress = mesh.egress();

    std::thread::scope(|scope| {
        // An HTTP/1.1 answer that takes 20 s, past Envoy's default 15 s route timeout.
        let slow = scope.spawn(|| {
            let request = Request::get("/slow?ms=20000").host("slowpoke");
            let start = Instant::now();
            let response = request
                .send_within(mesh.egress(), Duration::from_secs(40))
                .unwrap_or_else(|e| {
                    panic!("the 20 s request failed after {:?}: {e}", start.elapsed())
                });
            (response, start.elapsed())
        });

        // A server stream of 61 replies a second apart: 60 s.
        let ticks = block_on_within(Duration::from_secs(90), async {
            let mut client = EchoClient::connect(egress, "ticker")
                .await
                .expect("connect");
            let request = EchoRequest {
                count: 61,
                interval_ms: 1000,
                ..EchoRequest::new("tick")
            };
            let start = Instant::now();
            let mut stream = client
                .server_stream(tonic::Request::new(request))
                .await
                .expect("server stream")
                .into_inner();
            let mut ticks = 0;
            loop {
                let next = tokio::time::timeout(STEP, stream.message()).await;
                match next.unwrap_or_else(|_| panic!("the stream stalled after {ticks} replies")) {
                    Ok(Some(_)) => ticks += 1,
                    Ok(None) => break,
                    Err(status) => panic!(
                        "the stream was cut after {ticks} replies and {:?}: {status:?}",
                        start.elapsed()
                    ),
                }
            }
            assert!(
                start.elapsed() >= Duration::from_secs(60),
                "{:?}",
                start.elapsed()
            );
            ticks
        });
        assert_eq!(ticks, 61);

        let (response, took) = slow.join().expect("the slow request's thread");
        assert_eq!(response.status, 200, "{}", response.text());
        assert!(took >= Duration::from_secs(20), "answered after {took:?}");
    });
}

#[test]
fn h2c_and_http1_callers_to_the_same_vip_each_reach_it_over_their_own_protocol() {
    let env = TestEnv::new("protocols_downstream_protocol");
    let upstream = HttpUpstream::start("both-1", Versions::Both);
    let mesh = Mesh::start(&env, &[Instance::new("both", upstream.port())]);

    let http1 = mesh.get("both");
    assert_eq!(http1.status, 200, "{}", http1.text());
    assert_eq!(http1.json()["version"], "HTTP/1.1", "{}", http1.text());

    let h2 = block_on_within(CALLS, h2c_get(mesh.egress(), "both", "/h2"));
    assert_eq!(h2.status, 200, "{}", h2.text);
    assert_eq!(h2.json["version"], "HTTP/2.0", "{}", h2.text);
    assert_eq!(h2.json["path"], "/h2", "{}", h2.text);
    assert_eq!(h2.json["upstream"], "both-1", "{}", h2.text);
}

#[test]
fn an_http1_caller_reaches_an_http2_only_server_once_the_registry_declares_http2() {
    let env = TestEnv::new("protocols_declared_http2");
    let upstream = HttpUpstream::start("h2only-1", Versions::Http2Only);
    let instance = Instance::new("h2only", upstream.port());
    let mesh = Mesh::start(&env, std::slice::from_ref(&instance));

    // The one case the zero-config rule cannot serve: HTTP/1.1 in, an HTTP/2-only server.
    let refused = mesh.get("h2only");
    assert!(
        refused.status == 502 || refused.status == 503,
        "an HTTP/1.1 request to an HTTP/2-only server should fail without a declaration: {} {}",
        refused.status,
        refused.text()
    );
    // An h2c caller is fine without it.
    let h2 = block_on_within(CALLS, h2c_get(mesh.egress(), "h2only", "/"));
    assert_eq!(h2.status, 200, "{}", h2.text);

    // The instance declares HTTP/2; the proxy holding the cluster gets it within seconds.
    mesh.registry.write_atomic(&[instance.protocol("http2")]);
    let mut last = String::new();
    wait_until(
        CHANGE_DEADLINE,
        "HTTP/1.1 to reach the HTTP/2-only server",
        || {
            let response = mesh.get("h2only");
            last = format!("{} {}", response.status, response.text());
            response.status == 200 && response.json()["version"] == "HTTP/2.0"
        },
    );
    // What Envoy holds: the cluster now speaks HTTP/2 whatever the caller spoke.
    let dump = mesh
        .envoy
        .admin_get("/config_dump?resource=dynamic_active_clusters")
        .json();
    let cluster = (dump["configs"].as_array().into_iter().flatten())
        .map(|c| &c["cluster"])
        .find(|c| c["name"] == "h2only.vip")
        .unwrap_or_else(|| panic!("Envoy does not hold h2only.vip: {dump}"));
    let options = &cluster["typed_extension_protocol_options"]["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"];
    assert!(
        options["explicit_http_config"]["http2_protocol_options"].is_object(),
        "h2only.vip should be an explicit HTTP/2 cluster (last answer {last}): {cluster}"
    );
}

#[test]
fn an_h2c_caller_reaches_an_http1_only_server_once_the_registry_declares_http1() {
    let env = TestEnv::new("protocols_declared_http1");
    let upstream = HttpUpstream::start("h1only-1", Versions::Http1Only);
    let instance = Instance::new("h1only", upstream.port());
    let mesh = Mesh::start(&env, std::slice::from_ref(&instance));

    // The other mismatch: HTTP/2 in, a server that speaks only HTTP/1.1.
    let refused = block_on_within(CALLS, h2c_get(mesh.egress(), "h1only", "/"));
    assert!(
        refused.status == 502 || refused.status == 503,
        "h2c to an HTTP/1.1-only server should fail without a declaration: {refused:?}"
    );
    assert_eq!(
        mesh.get("h1only").status,
        200,
        "HTTP/1.1 needs no declaration"
    );

    mesh.registry.write_atomic(&[instance.protocol("http1")]);
    wait_until(
        CHANGE_DEADLINE,
        "h2c to reach the HTTP/1.1-only server",
        || {
            let response = block_on_within(CALLS, h2c_get(mesh.egress(), "h1only", "/"));
            response.status == 200 && response.json["version"] == "HTTP/1.1"
        },
    );
}

#[test]
fn a_secure_vip_speaks_http2_or_http1_as_alpn_settles() {
    let env = TestEnv::new("protocols_svip_alpn");
    let ca = TestCa::new(env.log_dir(), "alpn");
    let modern = HttpUpstream::start_tls("modern-1", &ca.issue("modern"), &["h2", "http/1.1"]);
    let legacy = HttpUpstream::start_tls("legacy-1", &ca.issue("legacy"), &["http/1.1"]);
    let ca_path = ca.cert().to_string_lossy().into_owned();
    let mesh = Mesh::start_with(
        &env,
        &[
            Instance::secure("modern", modern.port()),
            Instance::secure("legacy", legacy.port()),
        ],
        &["--upstream-ca", &ca_path],
    );

    for (host, version, alpn) in [
        ("modern:8443", "HTTP/2.0", "h2"),
        ("legacy:8443", "HTTP/1.1", "http/1.1"),
    ] {
        // An HTTP/1.1 caller: the upstream protocol follows ALPN, not the caller.
        let response = mesh.get(host);
        assert_eq!(response.status, 200, "{host}: {}", response.text());
        let answer = response.json();
        assert_eq!(answer["version"], version, "{host}: {answer}");
        assert_eq!(answer["alpn"], alpn, "{host}: {answer}");
    }
    // An h2c caller to the HTTP/1.1-only server: Envoy translates.
    let h2 = block_on_within(CALLS, h2c_get(mesh.egress(), "legacy:8443", "/"));
    assert_eq!(h2.status, 200, "{}", h2.text);
    assert_eq!(h2.json["version"], "HTTP/1.1", "{}", h2.text);
}

#[test]
fn a_websocket_upgrade_to_a_new_vip_passes_through_and_echoes() {
    let env = TestEnv::new("protocols_websocket");
    let upstream = HttpUpstream::start("chat-1", Versions::Both);
    let mesh = Mesh::start(&env, &[Instance::new("chat", upstream.port())]);
    let egress = mesh.egress();

    block_on_within(CALLS, async {
        // The first request to the VIP is the upgrade itself: discovery pauses it too.
        let mut ws = WebSocketClient::connect(egress, "chat", "/socket")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        for text in ["hello", "through", "the mesh"] {
            let echoed = ws.echo(text, STEP).await.unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(echoed, text);
        }
        ws.close(STEP).await;
    });
    assert_eq!(cluster_stat(&mesh, "chat.vip", "upstream_rq_total"), 1);
}
