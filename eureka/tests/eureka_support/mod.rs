//! Helpers shared by the Eureka integration tests: a small HTTP client and bounded waits.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use odmesh_registry::{Instance, Registry};
use tokio::sync::watch;

/// Bounds every wait in these tests.
pub const DEADLINE: Duration = Duration::from_secs(20);

/// Sends one request; returns the status and the body as text.
pub async fn http(method: &str, url: &str, json: Option<serde_json::Value>) -> (u16, String) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let mut req = hyper::Request::builder()
        .method(method)
        .uri(url)
        .header("accept", "application/json");
    let body = match json {
        Some(v) => {
            req = req.header("content-type", "application/json");
            Full::new(Bytes::from(v.to_string()))
        }
        None => Full::new(Bytes::new()),
    };
    let resp = tokio::time::timeout(
        Duration::from_secs(5),
        client.request(req.body(body).unwrap()),
    )
    .await
    .expect("answer within 5 s")
    .expect("request sent");
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

/// Waits (bounded by `deadline`) until the published registry satisfies `cond`; says what
/// it was waiting for, and what the registry held, when it times out.
pub async fn wait_registry(
    rx: &watch::Receiver<Arc<Registry>>,
    what: &str,
    deadline: Duration,
    cond: impl FnMut(&Arc<Registry>) -> bool,
) -> Arc<Registry> {
    let mut waiting = rx.clone();
    match tokio::time::timeout(deadline, waiting.wait_for(cond)).await {
        Ok(Ok(reg)) => reg.clone(),
        Ok(Err(_)) => panic!("{what}: the registry source stopped"),
        Err(_) => panic!(
            "{what}: not within {deadline:?}; registry: {:#?}",
            rx.borrow().instances().collect::<Vec<_>>()
        ),
    }
}

/// The instance with this id in the registry, if any.
pub fn find<'a>(reg: &'a Registry, id: &str) -> Option<&'a Instance> {
    reg.instances()
        .find(|i| &*i.instance_id == id)
        .map(|i| &**i)
}
