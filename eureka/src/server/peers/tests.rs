//! Peers over real sockets: registries on loopback, replicating to each other.

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::*;
use crate::server::auth::Authenticator;
use crate::server::{EmbeddedSource, ServerConfig, start};
use crate::testdata::count;
use crate::{ServerMetrics, wire::json::Port};
use odmesh_base::testing::wait_until;
use odmesh_registry::RegistryMetrics;

/// A free loopback port, for a peer that must be named before it starts.
fn free_addr() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr")
}

fn url(addr: SocketAddr) -> String {
    format!("http://{addr}/eureka")
}

struct Node {
    source: EmbeddedSource,
    metrics: Arc<ServerMetrics>,
}

impl Drop for Node {
    fn drop(&mut self) {
        self.source.task.abort();
    }
}

impl Node {
    /// The node's replication counts, over its peers.
    fn peers(&self) -> PeerTotals {
        self.source.eureka.peer_metrics().totals()
    }

    async fn start(addr: SocketAddr, peers: &[SocketAddr]) -> Node {
        Node::start_with(addr, peers, |_| {}).await
    }

    async fn start_with(
        addr: SocketAddr,
        peers: &[SocketAddr],
        edit: impl FnOnce(&mut ServerConfig),
    ) -> Node {
        let mut config = ServerConfig::local();
        config.warmup = Duration::ZERO;
        if !peers.is_empty() {
            let urls: Vec<String> = peers.iter().map(|a| url(*a)).collect();
            config.peers = Some(PeerConfig::new(&urls, None, false).expect("peer URLs"));
        }
        edit(&mut config);
        let metrics = Arc::new(ServerMetrics::default());
        let registry_metrics = Arc::new(RegistryMetrics::default());
        let source = start(addr, config, None, registry_metrics, metrics.clone())
            .await
            .expect("start");
        Node { source, metrics }
    }

    fn addr(&self) -> SocketAddr {
        self.source.local_addr
    }

    fn eureka(&self) -> &EurekaRegistry {
        &self.source.eureka
    }

    fn port_of(&self, id: &str) -> Option<u16> {
        let info = self.eureka().instance("HELLO", id)?;
        info.port.map(|p| p.port)
    }

    fn status_of(&self, id: &str) -> Option<String> {
        self.eureka().instance("HELLO", id)?.status
    }
}

/// One HTTP/1.1 exchange on a new connection: the status and the body.
async fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[&str],
    body: &str,
) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    let mut request = format!("{method} {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n");
    for h in headers {
        request.push_str(h);
        request.push_str("\r\n");
    }
    if !body.is_empty() {
        request.push_str("content-type: application/json\r\n");
    }
    request.push_str(&format!("content-length: {}\r\n\r\n{body}", body.len()));
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer))
        .await
        .expect("an answer within 10 s")
        .expect("read");
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let status = answer.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = answer
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_owned();
    (status, body)
}

fn instance(id: &str, port: u16) -> Value {
    json!({"instance": {
        "instanceId": id, "app": "HELLO", "ipAddr": "127.0.0.1", "status": "UP",
        "port": {"$": port, "@enabled": "true"}, "vipAddress": "hello",
        "leaseInfo": {"durationInSecs": 90, "renewalIntervalInSecs": 30},
    }})
}

async fn register(node: &Node, id: &str, port: u16) {
    let body = instance(id, port).to_string();
    let (status, answer) = http(node.addr(), "POST", "/eureka/apps/HELLO", &[], &body).await;
    assert_eq!(status, 204, "{answer}");
}

/// How long the peer tests wait for a node to get somewhere.
pub(super) const WAIT: Duration = Duration::from_secs(10);

#[test]
fn a_batch_is_written_with_eurekas_field_names_only_and_reads_back() {
    let mut info = InstanceInfo {
        instance_id: Some("h1".into()),
        app: Some("HELLO".into()),
        last_dirty_timestamp: Some(7),
        port: Some(Port::enabled(8080)),
        ..InstanceInfo::default()
    };
    super::super::document::set_owner(&mut info, Some("hello"));
    let register = Replicated {
        last_dirty_timestamp: Some(7),
        status: Some(Status::Up),
        overridden: Some(Status::OutOfService),
        info: Some(Stored::from(&info)),
        ..Replicated::new(Action::Register, "hello", "h1")
    };
    let writes = [
        register,
        Replicated::cancel("HELLO", "h2"),
        Replicated::new(Action::Heartbeat, "HELLO", "h3"),
    ];
    let body: Value = serde_json::from_slice(&encode(&writes)).expect("JSON");
    let first = &body["replicationList"][0];
    assert_eq!(first["appName"], "HELLO");
    assert_eq!(first["action"], "Register");
    assert_eq!(first["lastDirtyTimestamp"], 7);
    assert_eq!(first["overriddenStatus"], "OUT_OF_SERVICE");
    assert_eq!(first["instanceInfo"]["instanceId"], "h1");
    // Eureka's server reads an entry strictly: a field it does not know fails the batch.
    let eurekas = [
        "appName",
        "id",
        "lastDirtyTimestamp",
        "overriddenStatus",
        "status",
        "instanceInfo",
        "action",
    ];
    for entry in body["replicationList"].as_array().expect("a list") {
        for key in entry.as_object().expect("an entry").keys() {
            assert!(eurekas.contains(&key.as_str()), "{key} in {entry}");
        }
    }
    assert_eq!(body["replicationList"][1]["action"], "Cancel");
    // Eureka writes timestamps as text too.
    let text = r#"{"replicationList":[{"appName":"hello","id":"h3","lastDirtyTimestamp":"9","action":"Heartbeat","overriddenStatus":"UNKNOWN"}]}"#;
    let read = decode(text.as_bytes()).expect("a batch");
    assert_eq!(read[0].app, "HELLO");
    assert_eq!(read[0].last_dirty_timestamp, Some(9));
    assert_eq!(read[0].overridden, None);
    let back = decode(&encode(&writes)).expect("a batch");
    assert_eq!(back[0].overridden, Some(Status::OutOfService));
    let info = back[0]
        .info
        .as_ref()
        .map(Stored::info)
        .expect("its document");
    let owner = super::super::document::owner_of_copy(&info);
    assert_eq!(
        owner,
        Some("hello"),
        "the owner travels in the instance's metadata"
    );
    assert_eq!(info.port.as_ref().map(|p| p.port), Some(8080));
    assert!(decode(b"{\"replicationList\": 1}").is_err());
}

#[test]
fn a_peer_url_naming_this_node_is_left_out() {
    let own: SocketAddr = "127.0.0.1:8761".parse().unwrap();
    let any: SocketAddr = "0.0.0.0:8761".parse().unwrap();
    let named = |u: &str, own| names(&ServerUrl::parse(u).unwrap(), own);
    assert!(named("http://127.0.0.1:8761/eureka", own));
    assert!(named("http://localhost:8761/eureka", own));
    assert!(named("http://127.0.0.2:8761/eureka", any));
    assert!(!named("http://127.0.0.1:8762/eureka", own));
    assert!(!named("http://10.0.0.1:8761/eureka", own));
    let config = PeerConfig::new(
        &[url(own), "http://127.0.0.1:8762/eureka".into()],
        None,
        false,
    )
    .unwrap()
    .without(own);
    assert_eq!(config.urls.len(), 1);
}

#[tokio::test]
async fn writes_reach_the_peer_and_are_not_sent_back() {
    let b_addr = free_addr();
    let a = Node::start(free_addr(), &[b_addr]).await;
    let b = Node::start(b_addr, &[a.addr()]).await;
    wait_until(WAIT, "B filled from A", || {
        count(&b.metrics.eureka_peer_fills_total) == 1
    })
    .await;
    register(&a, "h1", 8080).await;
    wait_until(WAIT, "B holds h1", || b.port_of("h1") == Some(8080)).await;

    let drain = "/eureka/apps/HELLO/h1/status?value=OUT_OF_SERVICE";
    assert_eq!(http(a.addr(), "PUT", drain, &[], "").await.0, 200);
    wait_until(WAIT, "B drains h1", || {
        b.status_of("h1").as_deref() == Some("OUT_OF_SERVICE")
    })
    .await;
    assert_eq!(
        http(a.addr(), "DELETE", "/eureka/apps/HELLO/h1/status", &[], "")
            .await
            .0,
        200
    );
    wait_until(WAIT, "B restores h1", || {
        b.status_of("h1").as_deref() == Some("UP")
    })
    .await;
    let meta = "/eureka/apps/HELLO/h1/metadata?zone=z1";
    assert_eq!(http(a.addr(), "PUT", meta, &[], "").await.0, 200);
    let zone = || {
        b.eureka()
            .instance("HELLO", "h1")
            .and_then(|i| i.metadata.get("zone").map(ToString::to_string))
    };
    wait_until(WAIT, "B has the metadata", || {
        zone().as_deref() == Some("z1")
    })
    .await;
    assert_eq!(
        http(a.addr(), "PUT", "/eureka/apps/HELLO/h1", &[], "")
            .await
            .0,
        200
    );
    assert_eq!(
        http(a.addr(), "DELETE", "/eureka/apps/HELLO/h1", &[], "")
            .await
            .0,
        200
    );
    wait_until(WAIT, "B cancels h1", || b.port_of("h1").is_none()).await;

    // Register, drain, restore, metadata, heartbeat, cancel: six writes, each applied once,
    // and none came back to A.
    wait_until(WAIT, "six writes taken", || a.peers().replicated == 6).await;
    let received = count(&b.metrics.eureka_peer_received_total);
    assert_eq!(received, 6, "{:?}", b.metrics);
    assert_eq!(count(&a.metrics.eureka_peer_received_total), 0);
    assert_eq!(b.peers().replicated, 0);
    assert_eq!(count(&b.metrics.eureka_registrations_total), 0);
}

#[tokio::test]
async fn a_peer_down_gets_its_queued_writes_in_order_when_it_is_back() {
    let b_addr = free_addr();
    let a = Node::start(free_addr(), &[b_addr]).await;
    register(&a, "h1", 8080).await;
    register(&a, "h2", 8081).await;
    assert_eq!(
        http(a.addr(), "DELETE", "/eureka/apps/HELLO/h2", &[], "")
            .await
            .0,
        200
    );
    register(&a, "h1", 9090).await;
    wait_until(WAIT, "a failed batch", || a.peers().failures >= 1).await;
    // Four writes, or three if h1's second registration took the place of its first (which
    // it does unless the first was on its way to B just then).
    let pending = a.peers().pending;
    assert!((3..=4).contains(&pending), "{pending} writes pending");

    let b = Node::start(b_addr, &[]).await;
    wait_until(WAIT, "B holds h1 as last registered", || {
        b.port_of("h1") == Some(9090)
    })
    .await;
    wait_until(WAIT, "the queue is sent", || a.peers().pending == 0).await;
    assert_eq!(
        b.port_of("h2"),
        None,
        "h2 was cancelled after its registration"
    );
}

#[tokio::test]
async fn a_peers_state_says_how_many_tries_failed_why_and_when_it_last_took_a_batch() {
    let b_addr = free_addr();
    let a = Node::start(free_addr(), &[b_addr]).await;
    let state = || a.eureka().peer_states().remove(0);
    assert_eq!(state().url, url(b_addr));
    assert_eq!(state().health, PeerHealth::default());
    register(&a, "h1", 8080).await;
    wait_until(WAIT, "two failed tries", || state().health.failures >= 2).await;
    let down = state();
    assert_eq!((down.pending, down.is_self), (1, false));
    assert_eq!(down.health.last_success_ms, None);
    let error = down.health.last_error.unwrap_or_default();
    assert!(error.contains(&url(b_addr)), "{error}");

    let _b = Node::start(b_addr, &[]).await;
    wait_until(WAIT, "B takes the batch", || state().health.failures == 0).await;
    let up = state();
    assert_eq!(up.pending, 0);
    assert!(up.health.last_success_ms.is_some());
}

#[tokio::test]
async fn a_peer_down_costs_one_queued_heartbeat_per_instance_not_one_per_heartbeat() {
    let b_addr = free_addr();
    let a = Node::start(free_addr(), &[b_addr]).await;
    register(&a, "h1", 8080).await;
    for _ in 0..500 {
        let (status, _) = http(a.addr(), "PUT", "/eureka/apps/HELLO/h1", &[], "").await;
        assert_eq!(status, 200);
    }
    // Each heartbeat took the place of the one queued before it, unless that one was on its
    // way to B just then (once per try, a few times a second).
    let merged = count(&a.metrics.eureka_peer_merged_total);
    let pending = a.peers().pending;
    assert!(merged >= 400, "{merged} merged");
    assert!(pending <= 4, "{pending} writes pending");
    let b = Node::start(b_addr, &[]).await;
    wait_until(WAIT, "B holds h1", || b.port_of("h1") == Some(8080)).await;
    wait_until(WAIT, "the queue is sent", || a.peers().pending == 0).await;
}

#[tokio::test]
async fn a_heartbeat_the_peer_does_not_know_brings_it_the_registration() {
    let b = Node::start(free_addr(), &[]).await;
    let a = Node::start(free_addr(), &[b.addr()]).await;
    register(&a, "h1", 8080).await;
    wait_until(WAIT, "B holds h1", || b.port_of("h1") == Some(8080)).await;
    // B loses it (as after an eviction there, or its own restart without a fill).
    assert_eq!(
        http(b.addr(), "DELETE", "/eureka/apps/HELLO/h1", &[], "")
            .await
            .0,
        200
    );
    assert_eq!(b.port_of("h1"), None);
    assert_eq!(
        http(a.addr(), "PUT", "/eureka/apps/HELLO/h1", &[], "")
            .await
            .0,
        200
    );
    wait_until(WAIT, "B holds h1 again", || b.port_of("h1") == Some(8080)).await;
}

#[tokio::test]
async fn the_registration_a_peers_404_asks_for_is_sent_as_this_node_holds_it_when_due() {
    // A real Eureka server answers 404 to a replicated heartbeat right after its operator
    // removed an override there (the status is UNKNOWN until a registration), and sends
    // that removal here only after its batching delay. The registration it asked for must
    // not carry the removed override back to it.
    let b = Node::start(free_addr(), &[]).await;
    let a = Node::start_with(free_addr(), &[b.addr()], |config| {
        if let Some(peers) = &mut config.peers {
            peers.resend_after = Duration::from_secs(5);
        }
    })
    .await;
    register(&a, "h1", 8080).await;
    wait_until(WAIT, "B holds h1", || b.port_of("h1") == Some(8080)).await;
    let status = "/eureka/apps/HELLO/h1/status";
    let drain = format!("{status}?value=OUT_OF_SERVICE");
    let from_peer = ["x-netflix-discovery-replication: true"];
    // B's operator drains h1, and B's replication brings the override here.
    assert_eq!(http(b.addr(), "PUT", &drain, &[], "").await.0, 200);
    assert_eq!(http(a.addr(), "PUT", &drain, &from_peer, "").await.0, 200);
    // B stops holding h1 as A does (here: at all), so A's next heartbeat gets a 404.
    let path = "/eureka/apps/HELLO/h1";
    assert_eq!(http(b.addr(), "DELETE", path, &[], "").await.0, 200);
    assert_eq!(http(a.addr(), "PUT", path, &[], "").await.0, 200);
    wait_until(WAIT, "B answered A's heartbeat 404", || {
        count(&a.metrics.eureka_peer_resends_total) == 1
    })
    .await;
    // The removal of B's override arrives while the registration waits.
    assert_eq!(
        http(a.addr(), "DELETE", status, &from_peer, "").await.0,
        200
    );
    assert_eq!(a.status_of("h1").as_deref(), Some("UP"));
    wait_until(WAIT, "B holds h1 UP again", || {
        b.status_of("h1").as_deref() == Some("UP")
    })
    .await;
    let held = b.eureka().instance("HELLO", "h1").expect("h1 on B");
    let overridden = held.overridden_status.as_deref();
    assert!(matches!(overridden, None | Some("UNKNOWN")), "{held:?}");
}

#[tokio::test]
async fn a_peer_holding_a_newer_document_answers_409_and_its_document_is_taken() {
    let b = Node::start(free_addr(), &[]).await;
    let a = Node::start(free_addr(), &[b.addr()]).await;
    let mut old = instance("h1", 8080);
    old["instance"]["lastDirtyTimestamp"] = json!(1_000);
    let (status, _) = http(
        a.addr(),
        "POST",
        "/eureka/apps/HELLO",
        &[],
        &old.to_string(),
    )
    .await;
    assert_eq!(status, 204);
    wait_until(WAIT, "B holds h1", || b.port_of("h1") == Some(8080)).await;
    // B learns a newer document (a client that failed over to B registered there).
    let mut newer = instance("h1", 9090);
    newer["instance"]["lastDirtyTimestamp"] = json!(2_000);
    let (status, _) = http(
        b.addr(),
        "POST",
        "/eureka/apps/HELLO",
        &[],
        &newer.to_string(),
    )
    .await;
    assert_eq!(status, 204);
    assert_eq!(
        http(a.addr(), "PUT", "/eureka/apps/HELLO/h1", &[], "")
            .await
            .0,
        200
    );
    wait_until(WAIT, "A takes B's newer document", || {
        a.port_of("h1") == Some(9090)
    })
    .await;
    // And an older copy sent to B later does not undo it.
    let peer = [concat!("x-netflix-discovery-replication", ": true")];
    let (status, _) = http(
        b.addr(),
        "POST",
        "/eureka/apps/HELLO",
        &peer,
        &old.to_string(),
    )
    .await;
    assert_eq!(status, 204);
    assert_eq!(b.port_of("h1"), Some(9090));
}

#[tokio::test]
async fn a_starting_node_fills_from_a_complete_peer_and_is_complete_at_once() {
    let a = Node::start(free_addr(), &[]).await;
    register(&a, "h1", 8080).await;
    register(&a, "h2", 8081).await;
    let drain = "/eureka/apps/HELLO/h2/status?value=OUT_OF_SERVICE";
    assert_eq!(http(a.addr(), "PUT", drain, &[], "").await.0, 200);
    let c = Node::start_with(free_addr(), &[a.addr()], |c| {
        c.warmup = Duration::from_secs(600)
    })
    .await;
    wait_until(WAIT, "C is filled", || {
        count(&c.metrics.eureka_peer_fills_total) == 1
    })
    .await;
    wait_until(WAIT, "C holds both", || {
        c.port_of("h1") == Some(8080) && c.port_of("h2") == Some(8081)
    })
    .await;
    assert_eq!(c.status_of("h2").as_deref(), Some("OUT_OF_SERVICE"));
    assert!(!c.eureka().is_warming_up());
    // A node warming up says so, and one filled from it warms up too.
    let (_, answer) = http(
        c.addr(),
        "GET",
        "/eureka/apps",
        &["accept: application/json"],
        "",
    )
    .await;
    assert!(answer.contains("\"h2\""), "{answer}");
    let warming = Node::start_with(free_addr(), &[], |c| c.warmup = Duration::from_secs(600)).await;
    register(&warming, "h3", 8082).await;
    let d = Node::start_with(free_addr(), &[warming.addr()], |c| {
        c.warmup = Duration::from_secs(600)
    })
    .await;
    wait_until(WAIT, "D took h3", || d.port_of("h3") == Some(8082)).await;
    assert!(d.eureka().is_warming_up());
}

#[tokio::test]
async fn only_an_operator_may_send_a_peers_writes() {
    let tokens = r#"
identities:
  - {name: hello, token: "hello-token-0123456789"}
  - {name: ops, token: "ops-token-0123456789", operator: true}
"#;
    let auth = Arc::new(Authenticator::parse("tokens.yaml", tokens.as_bytes()).expect("tokens"));
    let b = Node::start_with(free_addr(), &[], |c| c.auth = Some(auth)).await;
    let body = instance("h1", 8080).to_string();
    let hello = "authorization: Bearer hello-token-0123456789";
    let peer = "x-netflix-discovery-replication: true";
    let (status, _) = http(
        b.addr(),
        "POST",
        "/eureka/apps/HELLO",
        &[hello, peer],
        &body,
    )
    .await;
    assert_eq!(status, 403);
    let batch = String::from_utf8(encode(&[Replicated::cancel("HELLO", "h1")])).unwrap();
    let (status, _) = http(
        b.addr(),
        "POST",
        "/eureka/peerreplication/batch",
        &[hello],
        &batch,
    )
    .await;
    assert_eq!(status, 403);
    assert_eq!(b.port_of("h1"), None);

    // A peer with an operator's credentials in its URL.
    let a = Node::start_with(free_addr(), &[], |c| {
        let url = format!("http://ops:ops-token-0123456789@{}/eureka", b.addr());
        c.peers = Some(PeerConfig::new(&[url], None, false).expect("peer URL"));
    })
    .await;
    register(&a, "h1", 8080).await;
    wait_until(WAIT, "B holds h1", || b.port_of("h1") == Some(8080)).await;
}

/// Forwards connections from a free loopback port to `to`, until dropped.
async fn forwarder(to: SocketAddr) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let task = tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            tokio::spawn(async move {
                if let Ok(mut outbound) = TcpStream::connect(to).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    });
    (addr, task)
}

#[tokio::test]
async fn a_node_listed_among_its_peers_under_another_address_sends_itself_nothing() {
    let addr = free_addr();
    let (alias, forwarding) = forwarder(addr).await;
    let b = Node::start(free_addr(), &[]).await;
    let a = Node::start(addr, &[alias, b.addr()]).await;
    // Its fill finds itself behind the alias, then fills from B.
    wait_until(WAIT, "A filled from B", || {
        count(&a.metrics.eureka_peer_fills_total) == 1
    })
    .await;
    register(&a, "h1", 8080).await;
    wait_until(WAIT, "B holds h1", || b.port_of("h1") == Some(8080)).await;
    wait_until(WAIT, "nothing left queued", || a.peers().pending == 0).await;
    // None of its own writes came back to it.
    assert_eq!(count(&a.metrics.eureka_peer_received_total), 0);
    assert_eq!(a.peers().replicated, 1);
    forwarding.abort();
}

#[tokio::test]
async fn a_peer_down_too_long_loses_the_oldest_writes_beyond_the_bound() {
    let b_addr = free_addr();
    let a = Node::start_with(free_addr(), &[b_addr], |c| {
        if let Some(peers) = c.peers.as_mut() {
            peers.max_pending = 2;
        }
    })
    .await;
    for (i, id) in ["h1", "h2", "h3", "h4"].into_iter().enumerate() {
        register(&a, id, 8080 + i as u16).await;
    }
    wait_until(WAIT, "two dropped", || a.peers().dropped == 2).await;
    assert_eq!(a.peers().pending, 2);
    // The peer, back, gets the two newest.
    let b = Node::start(b_addr, &[]).await;
    wait_until(WAIT, "B holds h3 and h4", || {
        b.port_of("h3").is_some() && b.port_of("h4").is_some()
    })
    .await;
    wait_until(WAIT, "the queue is sent", || a.peers().pending == 0).await;
    assert_eq!((b.port_of("h1"), b.port_of("h2")), (None, None));
}

#[tokio::test]
async fn a_peer_that_never_answers_costs_one_timeout_per_try_and_keeps_the_writes() {
    // Accepts connections and never answers.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let silent_addr = silent.local_addr().expect("addr");
    let holding = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = silent.accept().await {
            held.push(stream);
        }
    });
    let a = Node::start_with(free_addr(), &[silent_addr], |c| {
        if let Some(peers) = c.peers.as_mut() {
            peers.timeout = Duration::from_millis(200);
        }
    })
    .await;
    register(&a, "h1", 8080).await;
    wait_until(WAIT, "two timed-out batches", || a.peers().failures >= 2).await;
    assert_eq!(a.peers().pending, 1);
    // The registry itself answers meanwhile.
    assert_eq!(a.port_of("h1"), Some(8080));
    holding.abort();
}

/// A peer that answers a fill with an empty registry, records every batch it is sent and
/// answers each with `answer(n)`, where `n` counts the batches from 0 (`Err(status)`: that status without a body; `Ok(())`: 200 with
/// an OK for each write).
struct Capture {
    addr: SocketAddr,
    batches: Arc<Mutex<Vec<Value>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Capture {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Capture {
    async fn start(answer: fn(usize) -> Result<(), u16>) -> Capture {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let batches = Arc::new(Mutex::new(Vec::new()));
        let seen = batches.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let seen = seen.clone();
                tokio::spawn(async move { Capture::serve(stream, &seen, answer).await });
            }
        });
        Capture {
            addr,
            batches,
            task,
        }
    }

    /// Serves the requests of one connection (keep-alive).
    async fn serve(
        mut stream: TcpStream,
        seen: &Mutex<Vec<Value>>,
        answer: fn(usize) -> Result<(), u16>,
    ) {
        let mut buffer = Vec::new();
        loop {
            let head_end = loop {
                if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                    break end + 4;
                }
                let mut chunk = [0u8; 4096];
                match stream.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => buffer.extend_from_slice(&chunk[..n]),
                }
            };
            let head = String::from_utf8_lossy(&buffer[..head_end]).to_ascii_lowercase();
            let length: usize = (head.lines())
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            while buffer.len() < head_end + length {
                let mut chunk = [0u8; 4096];
                match stream.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => buffer.extend_from_slice(&chunk[..n]),
                }
            }
            let body: Value =
                serde_json::from_slice(&buffer[head_end..head_end + length]).unwrap_or(Value::Null);
            buffer.drain(..head_end + length);
            if head.starts_with("get ") {
                // A starting node's fill: an empty registry.
                let text = r#"{"applications":{"application":[]}}"#;
                let reply = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{text}",
                    text.len()
                );
                if stream.write_all(reply.as_bytes()).await.is_err() {
                    return;
                }
                continue;
            }
            let n = {
                let mut seen = seen.lock().unwrap();
                seen.push(body.clone());
                seen.len() - 1
            };
            let writes = body["replicationList"].as_array().map_or(0, Vec::len);
            let reply = match answer(n) {
                Ok(()) => {
                    let ok = vec![json!({"statusCode": 200}); writes];
                    let text = json!({ "responseList": ok }).to_string();
                    format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{text}",
                        text.len()
                    )
                }
                Err(status) => format!("HTTP/1.1 {status} No\r\ncontent-length: 0\r\n\r\n"),
            };
            if stream.write_all(reply.as_bytes()).await.is_err() {
                return;
            }
        }
    }

    /// The actions of every write sent so far, in order.
    fn actions(&self) -> Vec<String> {
        let batches = self.batches.lock().unwrap();
        (batches.iter())
            .flat_map(|b| b["replicationList"].as_array().cloned().unwrap_or_default())
            .map(|w| w["action"].as_str().unwrap_or_default().to_owned())
            .collect()
    }
}

#[tokio::test]
async fn an_operators_override_goes_to_peers_as_eurekas_status_update_and_delete() {
    // A real Eureka server keeps its own override on a Register, and a Register from it
    // clears this node's: overrides go as the actions Eureka's servers send.
    let peer = Capture::start(|_| Ok(())).await;
    let a = Node::start(free_addr(), &[peer.addr]).await;
    register(&a, "h1", 8080).await;
    let path = "/eureka/apps/HELLO/h1/status";
    assert_eq!(
        http(
            a.addr(),
            "PUT",
            &format!("{path}?value=OUT_OF_SERVICE"),
            &[],
            ""
        )
        .await
        .0,
        200
    );
    assert_eq!(http(a.addr(), "DELETE", path, &[], "").await.0, 200);
    wait_until(WAIT, "three writes sent", || peer.actions().len() == 3).await;
    assert_eq!(
        peer.actions(),
        ["Register", "StatusUpdate", "DeleteStatusOverride"]
    );
    let batches = peer.batches.lock().unwrap().clone();
    let all: Vec<&Value> = (batches.iter())
        .flat_map(|b| b["replicationList"].as_array().into_iter().flatten())
        .collect();
    assert_eq!(all[1]["status"], "OUT_OF_SERVICE");
    assert_eq!(all[2]["status"], "UP", "the status the instance is back to");
    for write in &all[1..] {
        assert!(write["lastDirtyTimestamp"].is_u64(), "{write}");
    }
}

#[tokio::test]
async fn a_batch_a_peer_refuses_is_dropped_and_counted_and_the_writes_after_it_go_on() {
    // The first batch is refused (400, as a real server refuses one it cannot read); a 503
    // is sent again, as Eureka's servers do.
    let peer = Capture::start(|n| match n {
        0 => Err(400),
        1 => Err(503),
        _ => Ok(()),
    })
    .await;
    let a = Node::start(free_addr(), &[peer.addr]).await;
    register(&a, "h1", 8080).await;
    wait_until(WAIT, "the refused batch dropped", || {
        count(&a.metrics.eureka_peer_discarded_total) == 1
    })
    .await;
    register(&a, "h2", 8081).await;
    wait_until(WAIT, "h2 sent, again after the 503", || {
        a.peers().replicated == 1
    })
    .await;
    let registered: Vec<String> = {
        let batches = peer.batches.lock().unwrap();
        (batches.iter())
            .map(|b| {
                b["replicationList"][0]["id"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned()
            })
            .collect()
    };
    assert_eq!(registered, ["h1", "h2", "h2"]);
    assert_eq!(a.peers().failures, 1);
    assert_eq!(a.peers().pending, 0);
}

#[tokio::test]
async fn a_real_eureka_servers_batch_to_the_path_with_its_trailing_slash_is_taken() {
    let b = Node::start(free_addr(), &[]).await;
    // As Eureka's servers write one: no odmesh field, the timestamp a number.
    let batch = json!({"replicationList": [{
        "appName": "HELLO", "id": "h1", "lastDirtyTimestamp": 1_700_000_000_000u64,
        "status": "UP", "action": "Register",
        "instanceInfo": instance("h1", 8080)["instance"].clone(),
    }]})
    .to_string();
    let (status, answer) = http(
        b.addr(),
        "POST",
        "/eureka/peerreplication/batch/",
        &[],
        &batch,
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    let replies: Value = serde_json::from_str(&answer).expect("JSON");
    assert_eq!(replies["responseList"].as_array().map(Vec::len), Some(1));
    assert_eq!(b.port_of("h1"), Some(8080));
}

/// Identities for the owner tests: `hello` owns VIP hello, `other` VIP other, `ops` is an
/// operator (peers send its credentials). Returns the authenticator and the `authorization`
/// headers of `hello` and `other`.
fn owners() -> (Arc<Authenticator>, &'static str, &'static str) {
    let tokens = r#"
identities:
  - {name: hello, token: "hello-token-0123456789", vips: [hello]}
  - {name: other, token: "other-token-0123456789", vips: [other]}
  - {name: ops, token: "ops-token-0123456789", operator: true}
"#;
    let auth = Arc::new(Authenticator::parse("tokens.yaml", tokens.as_bytes()).expect("tokens"));
    let hello = "authorization: Bearer hello-token-0123456789";
    let other = "authorization: Bearer other-token-0123456789";
    (auth, hello, other)
}

#[tokio::test]
async fn an_owner_survives_a_starting_nodes_fill_and_keeps_its_instance_there() {
    let (auth, hello, other) = owners();
    let a = Node::start_with(free_addr(), &[], |c| c.auth = Some(auth.clone())).await;
    let body = instance("h1", 8080).to_string();
    let (status, answer) = http(a.addr(), "POST", "/eureka/apps/HELLO", &[hello], &body).await;
    assert_eq!(status, 204, "{answer}");
    // C starts with A as its peer, an operator's credentials in the URL, and fills from it.
    let c = Node::start_with(free_addr(), &[], |c| {
        let url = format!("http://ops:ops-token-0123456789@{}/eureka", a.addr());
        c.peers = Some(PeerConfig::new(&[url], None, false).expect("peer URL"));
        c.auth = Some(auth.clone());
    })
    .await;
    wait_until(WAIT, "C filled from A", || c.port_of("h1") == Some(8080)).await;
    // The owner renews, drains and cancels its instance on C; no other identity may.
    let renew = "/eureka/apps/HELLO/h1";
    assert_eq!(http(c.addr(), "PUT", renew, &[other], "").await.0, 403);
    assert_eq!(http(c.addr(), "PUT", renew, &[hello], "").await.0, 200);
    let drain = "/eureka/apps/HELLO/h1/status?value=OUT_OF_SERVICE";
    assert_eq!(http(c.addr(), "PUT", drain, &[hello], "").await.0, 200);
    assert_eq!(http(c.addr(), "DELETE", renew, &[hello], "").await.0, 200);
    assert_eq!(c.port_of("h1"), None);
}

#[tokio::test]
async fn an_owner_survives_a_409s_document_and_keeps_its_instance() {
    let (auth, hello, other) = owners();
    let b = Node::start_with(free_addr(), &[], |c| c.auth = Some(auth.clone())).await;
    let a = Node::start_with(free_addr(), &[], |c| {
        let url = format!("http://ops:ops-token-0123456789@{}/eureka", b.addr());
        c.peers = Some(PeerConfig::new(&[url], None, false).expect("peer URL"));
        c.auth = Some(auth.clone());
    })
    .await;
    let mut old = instance("h1", 8080);
    old["instance"]["lastDirtyTimestamp"] = json!(1_000);
    let (status, answer) = http(
        a.addr(),
        "POST",
        "/eureka/apps/HELLO",
        &[hello],
        &old.to_string(),
    )
    .await;
    assert_eq!(status, 204, "{answer}");
    wait_until(WAIT, "B holds h1", || b.port_of("h1") == Some(8080)).await;
    // Its owner registers a newer document on B (its client failed over there).
    let mut newer = instance("h1", 9090);
    newer["instance"]["lastDirtyTimestamp"] = json!(2_000);
    let (status, answer) = http(
        b.addr(),
        "POST",
        "/eureka/apps/HELLO",
        &[hello],
        &newer.to_string(),
    )
    .await;
    assert_eq!(status, 204, "{answer}");
    // A heartbeat on A goes to B, which answers 409 with its document; A takes it, owner
    // included: the owner keeps its instance on A, and no other identity gets it.
    let renew = "/eureka/apps/HELLO/h1";
    assert_eq!(http(a.addr(), "PUT", renew, &[hello], "").await.0, 200);
    wait_until(WAIT, "A takes B's newer document", || {
        a.port_of("h1") == Some(9090)
    })
    .await;
    assert_eq!(http(a.addr(), "PUT", renew, &[other], "").await.0, 403);
    assert_eq!(http(a.addr(), "PUT", renew, &[hello], "").await.0, 200);
    let drain = "/eureka/apps/HELLO/h1/status?value=OUT_OF_SERVICE";
    assert_eq!(http(a.addr(), "PUT", drain, &[other], "").await.0, 403);
    assert_eq!(http(a.addr(), "PUT", drain, &[hello], "").await.0, 200);
}

#[test]
fn each_call_error_shows_its_cause_once() {
    use odmesh_base::error::{Chain, repeats_its_cause};
    let url = || "http://peer/eureka/peerreplication/batch".to_owned();
    let not_json = || serde_json::from_slice::<Value>(b"{").unwrap_err();
    for e in [
        CallError::Transport {
            url: url(),
            source: std::io::Error::other("connection reset").into(),
        },
        CallError::Transport {
            url: url(),
            source: Unread::Transport(std::io::Error::other("reset").into()).into(),
        },
        CallError::Undecodable {
            url: url(),
            source: not_json(),
        },
        CallError::Document {
            url: url(),
            source: InvalidDocument::Json(not_json()),
        },
    ] {
        assert!(!repeats_its_cause(&e), "{}", Chain(&e));
        assert!(Chain(&e).to_string().starts_with(&format!("{}: ", url())));
    }
}

#[test]
fn a_peer_listed_twice_is_one_peer_with_one_queue_and_one_series() {
    let url = "http://10.0.0.2:8761/eureka".to_owned();
    let config = PeerConfig::new(&[url.clone(), url.clone()], None, false).expect("peer URLs");
    assert_eq!(config.urls.len(), 1);
    let peers = Peers::new(config);
    assert_eq!(peers.metrics().0.len(), 1);
}
