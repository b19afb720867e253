//! The Eureka source against recorded Eureka documents served by a scripted HTTP server on a
//! loopback port, and its pure parts (URLs, backoff, delta application).

use super::*;
use std::sync::Mutex;
use std::sync::atomic::Ordering;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use crate::registry::Status;

/// Bounds every wait; the intervals below make the real latencies tens of milliseconds.
const DEADLINE: Duration = Duration::from_secs(10);

use crate::registry::testdata::read as testdata;

/// What the scripted server answers on one path.
#[derive(Clone, Debug)]
enum Reply {
    Body(Vec<u8>),
    Status(u16),
    /// Never answers (until the client's timeout).
    Hang,
}

#[derive(Debug)]
struct Script {
    full: Reply,
    delta: Reply,
    full_hits: usize,
    delta_hits: usize,
    accept: Vec<String>,
}

/// A scripted Eureka server on a free loopback port.
#[derive(Clone)]
struct Mock(Arc<Mutex<Script>>);

impl Mock {
    async fn start(full: Reply, delta: Reply) -> (Mock, String) {
        let mock = Mock(Arc::new(Mutex::new(Script {
            full,
            delta,
            full_hits: 0,
            delta_hits: 0,
            accept: Vec::new(),
        })));
        let app = Router::new()
            .route("/eureka/apps", get(full_handler))
            .route("/eureka/apps/delta", get(delta_handler))
            .with_state(mock.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        (mock, format!("http://{addr}/eureka/"))
    }

    fn set(&self, full: Option<Reply>, delta: Option<Reply>) {
        let mut s = self.0.lock().unwrap();
        if let Some(full) = full {
            s.full = full;
        }
        if let Some(delta) = delta {
            s.delta = delta;
        }
    }

    fn hits(&self) -> (usize, usize) {
        let s = self.0.lock().unwrap();
        (s.full_hits, s.delta_hits)
    }

    /// Waits until the client has asked for the delta `n` more times than now.
    async fn wait_delta_hits(&self, n: usize) {
        let target = self.hits().1 + n;
        wait_until(|| self.hits().1 >= target).await;
    }
}

async fn reply(r: Reply) -> Response {
    match r {
        Reply::Body(b) => ([("content-type", "application/json")], b).into_response(),
        Reply::Status(s) => StatusCode::from_u16(s).unwrap().into_response(),
        Reply::Hang => {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            StatusCode::GATEWAY_TIMEOUT.into_response()
        }
    }
}

async fn full_handler(State(m): State<Mock>, headers: HeaderMap) -> Response {
    let r = {
        let mut s = m.0.lock().unwrap();
        s.full_hits += 1;
        let accept = headers
            .get("accept")
            .map(|v| v.to_str().unwrap().to_owned());
        s.accept.push(accept.unwrap_or_default());
        s.full.clone()
    };
    reply(r).await
}

async fn delta_handler(State(m): State<Mock>) -> Response {
    let r = {
        let mut s = m.0.lock().unwrap();
        s.delta_hits += 1;
        s.delta.clone()
    };
    reply(r).await
}

async fn wait_until(mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while !cond() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "condition not met within {DEADLINE:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn config(urls: Vec<String>) -> ClientConfig {
    ClientConfig {
        urls,
        interval: Duration::from_millis(50),
        request_timeout: Duration::from_millis(300),
        max_backoff: Duration::from_millis(100),
        first_fetch_wait: Duration::from_secs(5),
    }
}

async fn follow(urls: Vec<String>) -> (EurekaSource, Arc<Metrics>) {
    let metrics = Arc::new(Metrics::default());
    let source = start_with(config(urls), metrics.clone()).await.unwrap();
    (source, metrics)
}

fn ids(reg: &Registry) -> Vec<String> {
    let mut ids: Vec<_> = reg.instances().map(|i| i.instance_id.clone()).collect();
    ids.sort();
    ids
}

fn has(reg: &Registry, id: &str) -> bool {
    reg.instances().any(|i| i.instance_id == id)
}

/// A port on which nothing listens.
async fn dead_url() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    format!("http://{addr}/eureka")
}

async fn wait_registry(
    source: &EurekaSource,
    cond: impl FnMut(&Arc<Registry>) -> bool,
) -> Arc<Registry> {
    let mut rx = source.registry.clone();
    tokio::time::timeout(DEADLINE, rx.wait_for(cond))
        .await
        .expect("registry condition within the deadline")
        .expect("source alive")
        .clone()
}

fn count(c: &std::sync::atomic::AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}

#[test]
fn urls_are_normalized_and_non_http_urls_refused() {
    assert_eq!(
        normalize_url("http://eureka:8761/eureka/").unwrap(),
        "http://eureka:8761/eureka"
    );
    assert_eq!(
        normalize_url("http://eureka:8761").unwrap(),
        "http://eureka:8761/eureka"
    );
    assert_eq!(
        normalize_url(" http://10.0.0.1/eureka/v2 ").unwrap(),
        "http://10.0.0.1/eureka/v2"
    );
    for bad in [
        "eureka:8761",
        "https://eureka/eureka",
        "ftp://x/",
        "http://u:p@eureka/eureka",
        "",
    ] {
        assert!(normalize_url(bad).is_err(), "{bad:?} accepted");
    }
}

#[test]
fn backoff_doubles_from_its_base_up_to_its_bound() {
    let s = Duration::from_secs;
    let waits: Vec<_> = (1..=7).map(|n| backoff(n, s(1), s(30))).collect();
    assert_eq!(waits, [s(1), s(2), s(4), s(8), s(16), s(30), s(30)]);
    assert_eq!(backoff(1000, s(1), s(30)), s(30), "no overflow");
}

#[test]
fn a_delta_applied_to_the_full_fixture_adds_modifies_and_deletes() {
    let mut local = eureka::parse_document(&testdata("eureka-apps.json"))
        .unwrap()
        .applications;
    let delta = eureka::parse_document(&testdata("eureka-delta.json"))
        .unwrap()
        .applications;
    apply_delta(&mut local, &delta);
    assert_eq!(Some(local.reconcile_hash_code()), delta.apps_hashcode);
    let reg = local.to_registry().registry;
    assert!(has(&reg, "hello-4"));
    assert!(!has(&reg, "greeter-2"));
    let hello3 = reg
        .instances()
        .find(|i| i.instance_id == "hello-3.internal:hello:8080")
        .unwrap();
    assert_eq!(hello3.status, Status::Up, "was DOWN before the delta");
    let hello4 = local
        .application
        .iter()
        .flat_map(|a| &a.instance)
        .find(|i| i.id() == Some("hello-4"))
        .unwrap();
    assert_eq!(
        hello4.action_type, None,
        "the local copy keeps no delta action"
    );
}

#[test]
fn a_delta_for_an_unknown_app_adds_it_and_deleting_its_last_instance_drops_it() {
    let mut local = Applications::default();
    let added = eureka::parse_document(&testdata("eureka-delta-missed-change.json"))
        .unwrap()
        .applications;
    apply_delta(&mut local, &added);
    assert_eq!(local.application.len(), 1);
    let mut deleted = added.clone();
    deleted.application[0].instance[0].action_type = Some(ActionType::Deleted);
    apply_delta(&mut local, &deleted);
    assert!(local.application.is_empty());
}

#[tokio::test]
async fn the_first_full_fetch_asks_for_json_and_publishes_the_fixture_registry() {
    let (mock, url) = Mock::start(
        Reply::Body(testdata("eureka-apps.json")),
        Reply::Status(404),
    )
    .await;
    let (source, metrics) = follow(vec![url]).await;
    assert!(source.health.is_loaded(), "start waits for the first fetch");
    let reg = source.registry.borrow().clone();
    assert_eq!(reg.len(), 9);
    assert_eq!(mock.0.lock().unwrap().accept[0], "application/json");
    assert!(source.age_of_last_fetch().unwrap() < Duration::from_secs(5));
    assert_eq!(count(&metrics.eureka_full_fetches_total), 1);
    assert!(
        source
            .health
            .snapshot()
            .description
            .starts_with("eureka http://")
    );
}

#[tokio::test]
async fn a_single_application_document_with_string_numbers_is_followed() {
    let (_mock, url) = Mock::start(
        Reply::Body(testdata("eureka-apps-single.json")),
        Reply::Status(404),
    )
    .await;
    let (source, _) = follow(vec![url]).await;
    assert_eq!(ids(&source.registry.borrow()), ["centos43"]);
}

#[tokio::test]
async fn a_delta_whose_hash_code_matches_is_published_without_a_full_fetch() {
    let (mock, url) = Mock::start(
        Reply::Body(testdata("eureka-apps.json")),
        Reply::Body(testdata("eureka-delta.json")),
    )
    .await;
    let (source, metrics) = follow(vec![url]).await;
    let reg = wait_registry(&source, |r| has(r, "hello-4")).await;
    assert!(!has(&reg, "greeter-2"));
    mock.wait_delta_hits(3).await;
    assert_eq!(mock.hits().0, 1, "no full fetch after the first");
    assert_eq!(count(&metrics.eureka_hash_mismatches_total), 0);
    assert!(count(&metrics.eureka_fetches_total) >= 4);
}

#[tokio::test]
async fn a_delta_whose_hash_code_does_not_match_forces_a_full_fetch() {
    let (mock, url) = Mock::start(
        Reply::Body(testdata("eureka-apps.json")),
        Reply::Status(404),
    )
    .await;
    let (source, metrics) = follow(vec![url]).await;
    // The server now has two more instances, but its delta only shows one of them.
    mock.set(
        Some(Reply::Body(testdata(
            "eureka-apps-after-missed-change.json",
        ))),
        Some(Reply::Body(testdata("eureka-delta-missed-change.json"))),
    );
    let reg = wait_registry(&source, |r| has(r, "billing-2")).await;
    assert!(has(&reg, "payments-3"));
    assert_eq!(reg.len(), 11);
    assert!(count(&metrics.eureka_hash_mismatches_total) >= 1);
    assert!(mock.hits().0 >= 2);
    // Once in step, the same delta (with the same hash) needs no more full fetches.
    mock.wait_delta_hits(1).await;
    let full = mock.hits().0;
    mock.wait_delta_hits(3).await;
    assert_eq!(mock.hits().0, full);
}

#[tokio::test]
async fn an_empty_garbled_or_refused_delta_answer_forces_a_full_fetch() {
    for bad in [
        Reply::Body(Vec::new()),
        Reply::Body(b"<html>oops</html>".to_vec()),
        Reply::Body(br#"{"applications": "none"}"#.to_vec()),
        Reply::Status(403),
    ] {
        let (mock, url) = Mock::start(Reply::Body(testdata("eureka-apps.json")), bad.clone()).await;
        let (source, metrics) = follow(vec![url]).await;
        mock.set(
            Some(Reply::Body(testdata(
                "eureka-apps-after-missed-change.json",
            ))),
            None,
        );
        wait_registry(&source, |r| has(r, "billing-2")).await;
        assert_eq!(count(&metrics.eureka_fetch_errors_total), 0, "{bad:?}");
        assert!(source.health.snapshot().last_error.is_none(), "{bad:?}");
    }
}

#[tokio::test]
async fn an_outage_keeps_the_last_good_registry_and_recovery_resumes_following() {
    let (mock, url) = Mock::start(
        Reply::Body(testdata("eureka-apps.json")),
        Reply::Body(testdata("eureka-delta.json")),
    )
    .await;
    let (source, metrics) = follow(vec![url]).await;
    let good = wait_registry(&source, |r| has(r, "hello-4")).await;

    for outage in [
        Reply::Status(500),
        Reply::Body(b"garbage".to_vec()),
        Reply::Hang,
    ] {
        let errors = count(&metrics.eureka_fetch_errors_total);
        mock.set(Some(outage.clone()), Some(outage.clone()));
        wait_until(|| count(&metrics.eureka_fetch_errors_total) >= errors + 2).await;
        assert_eq!(*source.registry.borrow(), good, "{outage:?}");
        let st = source.health.snapshot();
        assert!(st.loaded);
        assert!(st.last_error.is_some(), "{outage:?}");
    }
    let err = source.health.snapshot().last_error.unwrap();
    assert!(err.contains("no answer within"), "{err}");

    mock.set(
        Some(Reply::Body(testdata(
            "eureka-apps-after-missed-change.json",
        ))),
        Some(Reply::Status(404)),
    );
    wait_registry(&source, |r| has(r, "billing-2")).await;
    wait_until(|| source.health.snapshot().last_error.is_none()).await;
}

#[tokio::test]
async fn the_next_url_is_used_when_the_first_does_not_answer() {
    let (_mock, url) = Mock::start(
        Reply::Body(testdata("eureka-apps.json")),
        Reply::Status(404),
    )
    .await;
    let (source, metrics) = follow(vec![dead_url().await, url]).await;
    assert!(source.health.is_loaded());
    assert_eq!(source.registry.borrow().len(), 9);
    assert_eq!(count(&metrics.eureka_failovers_total), 1);
    assert_eq!(count(&metrics.eureka_fetch_errors_total), 0);
}

#[tokio::test]
async fn a_server_that_fails_later_is_replaced_by_the_next_one() {
    let (first, url1) = Mock::start(
        Reply::Body(testdata("eureka-apps.json")),
        Reply::Body(testdata("eureka-delta.json")),
    )
    .await;
    let (_second, url2) = Mock::start(
        Reply::Body(testdata("eureka-apps-after-missed-change.json")),
        Reply::Status(404),
    )
    .await;
    let (source, metrics) = follow(vec![url1, url2]).await;
    wait_registry(&source, |r| has(r, "hello-4")).await;
    first.set(Some(Reply::Hang), Some(Reply::Hang));
    wait_registry(&source, |r| has(r, "billing-2")).await;
    assert_eq!(count(&metrics.eureka_failovers_total), 1);
}

#[tokio::test]
async fn start_returns_unloaded_when_no_server_answers_in_time_and_loads_later() {
    let (mock, url) = Mock::start(Reply::Hang, Reply::Status(404)).await;
    let metrics = Arc::new(Metrics::default());
    let mut cfg = config(vec![url]);
    cfg.first_fetch_wait = Duration::from_millis(200);
    let started = tokio::time::Instant::now();
    let source = start_with(cfg, metrics).await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(2));
    assert!(!source.health.is_loaded());
    assert!(source.age_of_last_fetch().is_none());
    assert!(source.registry.borrow().is_empty());

    mock.set(Some(Reply::Body(testdata("eureka-apps.json"))), None);
    wait_registry(&source, |r| r.len() == 9).await;
    assert!(source.health.is_loaded());
}

#[tokio::test]
async fn an_unchanged_registry_is_not_published_again() {
    let empty_delta = br#"{"applications": {"versions__delta": "7",
        "apps__hashcode": "DOWN_1_OUT_OF_SERVICE_1_STARTING_1_UP_6_", "application": []}}"#;
    let (mock, url) = Mock::start(
        Reply::Body(testdata("eureka-apps.json")),
        Reply::Body(empty_delta.to_vec()),
    )
    .await;
    let (source, metrics) = follow(vec![url]).await;
    let mut rx = source.registry.clone();
    rx.mark_unchanged();
    mock.wait_delta_hits(3).await;
    assert!(!rx.has_changed().unwrap());
    assert_eq!(mock.hits().0, 1);
    assert!(
        count(&metrics.registry_loads_total) >= 3,
        "each poll is a good fetch"
    );
}

#[tokio::test]
async fn no_urls_or_a_bad_url_is_an_error() {
    let metrics = Arc::new(Metrics::default());
    assert!(
        start(vec![], DEFAULT_INTERVAL, metrics.clone())
            .await
            .is_err()
    );
    let err = start(vec!["https://x/eureka".into()], DEFAULT_INTERVAL, metrics)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("https"), "{err}");
}
