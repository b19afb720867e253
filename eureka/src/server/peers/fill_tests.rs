//! A starting node's fill from a peer that answers `/apps` in gzip, and from one whose
//! registry is over `--peer-max-answer`: peers played by a small HTTP server on loopback.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::http::HeaderMap;
use axum::response::IntoResponse;
use axum::routing::get;

use super::tests::WAIT;
use super::*;
use crate::ServerMetrics;
use crate::server::{EmbeddedSource, ServerConfig, start};
use crate::testdata::count;
use odmesh_base::testing::wait_until;
use odmesh_registry::RegistryMetrics;

/// A registry of `n` UP instances of app HELLO, as `/apps` answers it.
fn apps(n: usize) -> Vec<u8> {
    let mut s = String::from(
        r#"{"applications":{"versions__delta":"1","application":[{"name":"HELLO","instance":["#,
    );
    for i in 0..n {
        if i > 0 {
            s.push(',');
        }
        let _ = write!(
            s,
            r#"{{"instanceId":"h{i}","app":"HELLO","ipAddr":"10.0.{}.{}","status":"UP","port":{{"$":8080,"@enabled":"true"}},"vipAddress":"hello","leaseInfo":{{"durationInSecs":90}},"dataCenterInfo":{{"@class":"com.netflix.appinfo.InstanceInfo$DefaultDataCenterInfo","name":"MyOwn"}}}}"#,
            i / 250,
            i % 250 + 1
        );
    }
    s.push_str("]}]}}");
    s.into_bytes()
}

/// A peer answering `/eureka/apps` with `doc`, gzip when asked; the `Accept-Encoding` it
/// was sent goes to `seen`.
async fn peer(doc: Vec<u8>, seen: Arc<Mutex<Vec<String>>>) -> SocketAddr {
    let zipped = crate::wire::gzip(&doc);
    let handler = move |headers: HeaderMap| async move {
        let asked = (headers.get("accept-encoding"))
            .map(|v| v.to_str().unwrap_or_default().to_owned())
            .unwrap_or_default();
        let gzip = asked.contains("gzip");
        seen.lock().unwrap().push(asked);
        if gzip {
            let headers = [
                ("content-type", "application/json"),
                ("content-encoding", "gzip"),
            ];
            (headers, zipped.clone()).into_response()
        } else {
            ([("content-type", "application/json")], doc.clone()).into_response()
        }
    };
    let app = Router::new().route("/eureka/apps", get(handler));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

/// A node filling from `peers`, with `max_answer`.
async fn node(peers: &[SocketAddr], max_answer: u64) -> (EmbeddedSource, Arc<ServerMetrics>) {
    let mut config = ServerConfig::local();
    config.warmup = Duration::from_secs(600);
    let urls: Vec<String> = peers.iter().map(|a| format!("http://{a}/eureka")).collect();
    config.peers = Some(PeerConfig {
        max_answer,
        ..PeerConfig::new(&urls, None, false).unwrap()
    });
    let metrics = Arc::new(ServerMetrics::default());
    let source = start(
        "127.0.0.1:0".parse().unwrap(),
        config,
        None,
        Arc::new(RegistryMetrics::default()),
        metrics.clone(),
    )
    .await
    .unwrap();
    (source, metrics)
}

#[tokio::test]
async fn a_node_fills_from_a_peer_answering_in_gzip() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let a = peer(apps(3_000), seen.clone()).await;
    let (b, metrics) = node(&[a], DEFAULT_MAX_ANSWER).await;
    wait_until(WAIT, "B is filled", || {
        count(&metrics.eureka_peer_fills_total) == 1
    })
    .await;
    wait_until(WAIT, "B holds all", || b.registry.borrow().len() == 3_000).await;
    assert!(!b.eureka.is_warming_up());
    assert_eq!(seen.lock().unwrap()[0], "gzip");
    b.task.abort();
}

#[tokio::test]
async fn a_peer_registry_over_the_limit_is_refused_counted_and_the_next_peer_fills() {
    let big = apps(400);
    let small = apps(3);
    let limit = small.len() as u64 + 100;
    assert!(big.len() as u64 > limit);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (a, c) = (peer(big, seen.clone()).await, peer(small, seen).await);
    let (b, metrics) = node(&[a, c], limit).await;
    wait_until(WAIT, "B is filled", || {
        count(&metrics.eureka_peer_fills_total) == 1
    })
    .await;
    assert_eq!(count(&metrics.eureka_peer_fills_too_large_total), 1);
    // What was read of the big one before the limit stays (instances the peer holds); the
    // rest comes from the next.
    let held = |id: &str| b.eureka.instance("HELLO", id).is_some();
    wait_until(WAIT, "B holds the small peer's", || {
        held("h0") && held("h1") && held("h2")
    })
    .await;
    assert!(b.registry.borrow().len() < 400, "not the big registry");
    b.task.abort();
}
