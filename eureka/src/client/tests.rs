//! The Eureka source against recorded Eureka documents served by a scripted HTTP (or HTTPS,
//! with the test certificates of `base/testdata/tls/`) server on a loopback port, and its pure
//! parts (URLs and credentials, backoff, delta application).

use super::*;
use crate::testdata::count;
use std::sync::Mutex;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tower::ServiceExt;

use crate::testdata::path as testdata_path;
use crate::testdata::tls as tls_path;
use crate::wire::gzip;
use crate::wire::json::reconcile_hash_code_of_counts;
use odmesh_base::testing::wait_until;
use odmesh_registry::Status;

/// What a source under test counts in: the registry's metrics and the Eureka client's.
#[derive(Clone, Default)]
struct Counters {
    registry: Arc<RegistryMetrics>,
    client: Arc<ClientMetrics>,
}

impl Counters {
    /// A source of `config` ([`start_with`]) counting here.
    async fn start(&self, config: ClientConfig) -> Result<EurekaSource, InvalidEurekaConfig> {
        start_with(config, self.registry.clone(), self.client.clone()).await
    }
}

/// Bounds every wait; the intervals below make the real latencies tens of milliseconds.
const DEADLINE: Duration = Duration::from_secs(10);

use crate::testdata::read as testdata;

/// What the scripted server answers on one path.
#[derive(Clone, Debug)]
enum Reply {
    Body(Vec<u8>),
    /// The body, compressed, with `Content-Encoding: gzip`.
    Gzip(Vec<u8>),
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
    /// The `Accept-Encoding` of every request, in order.
    accept_encoding: Vec<String>,
    /// When set, a request without exactly this `Authorization` is answered 401.
    authorization: Option<String>,
    /// The `Authorization` of every request, in order.
    seen_authorization: Vec<Option<String>>,
    /// The certificate an HTTPS mock presents to the next connection.
    tls: Option<Arc<rustls::ServerConfig>>,
}

/// A scripted Eureka server on a free loopback port.
#[derive(Clone)]
struct Mock(Arc<Mutex<Script>>);

impl Mock {
    fn new(full: Reply, delta: Reply) -> Mock {
        Mock(Arc::new(Mutex::new(Script {
            full,
            delta,
            full_hits: 0,
            delta_hits: 0,
            accept: Vec::new(),
            accept_encoding: Vec::new(),
            authorization: None,
            seen_authorization: Vec::new(),
            tls: None,
        })))
    }

    fn app(&self) -> Router {
        Router::new()
            .route("/eureka/apps", get(full_handler))
            .route("/eureka/apps/delta", get(delta_handler))
            .with_state(self.clone())
    }

    async fn start(full: Reply, delta: Reply) -> (Mock, String) {
        let mock = Mock::new(full, delta);
        let app = mock.app();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        (mock, format!("http://{addr}/eureka/"))
    }

    /// An HTTPS mock presenting the test certificate `cert` (see [`server_tls`]); its URL
    /// is `https://127.0.0.1:PORT/eureka/`. Each connection serves one request, so that
    /// every request shakes hands with the certificate of the moment.
    async fn start_tls(full: Reply, delta: Reply, cert: &str) -> (Mock, String) {
        let mock = Mock::new(full, delta);
        mock.set_certificate(cert);
        let app = mock.app();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let script = mock.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let tls = script.0.lock().unwrap().tls.clone().unwrap();
                let app = app.clone();
                tokio::spawn(async move {
                    // A refused handshake is what some tests want; nothing to serve then.
                    let Ok(stream) = tokio_rustls::TlsAcceptor::from(tls).accept(tcp).await else {
                        return;
                    };
                    let service = hyper::service::service_fn(
                        move |request: hyper::Request<hyper::body::Incoming>| {
                            app.clone().oneshot(request)
                        },
                    );
                    let _ = hyper::server::conn::http1::Builder::new()
                        .keep_alive(false)
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        (mock, format!("https://{addr}/eureka/"))
    }

    /// Presents the test certificate `cert` to the next connections.
    fn set_certificate(&self, cert: &str) {
        self.0.lock().unwrap().tls = Some(server_tls(cert));
    }

    /// Answers 401 to every request without exactly this `Authorization`.
    fn require_authorization(&self, value: &str) {
        self.0.lock().unwrap().authorization = Some(value.to_owned());
    }

    fn seen_authorization(&self) -> Vec<Option<String>> {
        self.0.lock().unwrap().seen_authorization.clone()
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
        wait_until(DEADLINE, &format!("{n} more delta fetches"), || {
            self.hits().1 >= target
        })
        .await;
    }
}

async fn reply(r: Reply) -> Response {
    match r {
        Reply::Body(b) => ([("content-type", "application/json")], b).into_response(),
        Reply::Gzip(b) => {
            let headers = [
                ("content-type", "application/json"),
                ("content-encoding", "gzip"),
            ];
            (headers, gzip(&b)).into_response()
        }
        Reply::Status(s) => StatusCode::from_u16(s).unwrap().into_response(),
        Reply::Hang => {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            StatusCode::GATEWAY_TIMEOUT.into_response()
        }
    }
}

/// Records the request's `Authorization`; the 401 to answer when it is not the one required.
fn check_authorization(s: &mut Script, headers: &HeaderMap) -> Option<Reply> {
    let encoding = headers.get("accept-encoding");
    let encoding = encoding.map(|v| v.to_str().unwrap().to_owned());
    s.accept_encoding.push(encoding.unwrap_or_default());
    let seen = headers
        .get("authorization")
        .map(|v| v.to_str().unwrap().to_owned());
    let refused = s.authorization.is_some() && s.authorization != seen;
    s.seen_authorization.push(seen);
    refused.then_some(Reply::Status(401))
}

async fn full_handler(State(m): State<Mock>, headers: HeaderMap) -> Response {
    let r = {
        let mut s = m.0.lock().unwrap();
        s.full_hits += 1;
        let accept = headers
            .get("accept")
            .map(|v| v.to_str().unwrap().to_owned());
        s.accept.push(accept.unwrap_or_default());
        check_authorization(&mut s, &headers).unwrap_or_else(|| s.full.clone())
    };
    reply(r).await
}

async fn delta_handler(State(m): State<Mock>, headers: HeaderMap) -> Response {
    let r = {
        let mut s = m.0.lock().unwrap();
        s.delta_hits += 1;
        check_authorization(&mut s, &headers).unwrap_or_else(|| s.delta.clone())
    };
    reply(r).await
}

/// A rustls server configuration presenting `base/testdata/tls/{cert}.pem` with its key.
fn server_tls(cert: &str) -> Arc<rustls::ServerConfig> {
    let certs = CertificateDer::pem_file_iter(tls_path(&format!("{cert}.pem")))
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_file(tls_path(&format!("{cert}.key"))).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
    Arc::new(config)
}

/// A configuration that trusts the test CA (`base/testdata/tls/ca.pem`).
fn tls_config(urls: Vec<String>) -> ClientConfig {
    ClientConfig {
        ca_file: Some(tls_path("ca.pem")),
        ..config(urls)
    }
}

/// An error and its sources, as `main` shows them.
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    odmesh_base::error::Chain(e).to_string()
}

/// The source's last error, once there is one.
async fn wait_error(source: &EurekaSource) -> String {
    wait_until(DEADLINE, "the source to report an error", || {
        source.health.snapshot().last_error.is_some()
    })
    .await;
    source.health.snapshot().last_error.unwrap()
}

/// A source that does not wait for its first fetch (which the test expects to fail).
async fn follow_unloaded(cfg: ClientConfig) -> (EurekaSource, Counters) {
    let metrics = Counters::default();
    let cfg = ClientConfig {
        first_fetch_wait: Duration::ZERO,
        ..cfg
    };
    let source = metrics.start(cfg).await.unwrap();
    (source, metrics)
}

fn config(urls: Vec<String>) -> ClientConfig {
    ClientConfig {
        urls,
        ca_file: None,
        token_file: None,
        interval: Duration::from_millis(50),
        request_timeout: Duration::from_millis(300),
        max_answer: DEFAULT_MAX_ANSWER,
        max_backoff: Duration::from_millis(100),
        first_fetch_wait: Duration::from_secs(5),
        drop_guard: DropGuardConfig::default(),
        allow_plain_credentials: false,
    }
}

async fn follow(urls: Vec<String>) -> (EurekaSource, Counters) {
    let metrics = Counters::default();
    let source = metrics.start(config(urls)).await.unwrap();
    (source, metrics)
}

fn ids(reg: &Registry) -> Vec<String> {
    let mut ids: Vec<_> = reg.instances().map(|i| i.instance_id.to_string()).collect();
    ids.sort();
    ids
}

fn has(reg: &Registry, id: &str) -> bool {
    reg.instances().any(|i| &*i.instance_id == id)
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

fn base(url: &str) -> String {
    ServerUrl::parse(url).unwrap().base().to_owned()
}

#[test]
fn urls_are_normalized_and_bad_urls_refused() {
    assert_eq!(
        base("http://eureka:8761/eureka/"),
        "http://eureka:8761/eureka"
    );
    assert_eq!(base("http://eureka:8761"), "http://eureka:8761/eureka");
    assert_eq!(
        base(" http://10.0.0.1/eureka/v2 "),
        "http://10.0.0.1/eureka/v2"
    );
    assert_eq!(base("https://eureka/eureka/"), "https://eureka/eureka");
    assert!(ServerUrl::parse("https://eureka/eureka").unwrap().is_tls());
    assert_eq!(base("http://u:p@eureka/eureka"), "http://eureka/eureka");
    assert_eq!(base("http://[::1]:8761/eureka"), "http://[::1]:8761/eureka");
    for bad in [
        "eureka:8761",
        "ftp://x/",
        "http://eureka/eureka?x=1",
        "http://eureka:port/eureka",
        "http://eureka:/eureka",
        "http://[::1]:99999/eureka",
        "http://user@eureka/eureka",
        "http://:password@eureka/eureka",
        "http://a%3Ab:password@eureka/eureka",
        "",
    ] {
        assert!(ServerUrl::parse(bad).is_err(), "{bad:?} accepted");
    }
}

#[test]
fn credentials_in_a_url_are_percent_decoded_into_basic_authentication_and_shown_as_stars() {
    let url = ServerUrl::parse("https://app%40corp:p%3Ass%2Fw0rd@eureka:8761/eureka/").unwrap();
    assert_eq!(url.base(), "https://eureka:8761/eureka");
    assert_eq!(url.to_string(), "https://app%40corp:***@eureka:8761/eureka");
    assert_eq!(
        format!("{url:?}"),
        "https://app%40corp:***@eureka:8761/eureka"
    );
    let authorization = url.authorization().unwrap();
    // base64("app@corp:p:ss/w0rd")
    assert_eq!(authorization, "Basic YXBwQGNvcnA6cDpzcy93MHJk");
    assert!(
        authorization.is_sensitive(),
        "kept out of hyper's debug output"
    );
    assert_eq!(
        ServerUrl::parse("http://eureka/eureka")
            .unwrap()
            .authorization(),
        None
    );
}

#[test]
fn a_bad_url_or_a_logged_configuration_never_shows_the_password() {
    for (bad, shown) in [
        (
            "http://user:s3cret@eureka:port/eureka",
            "http://user:***@eureka:port/eureka",
        ),
        (
            "http://user:s3/cret@eureka/eureka",
            "http://user:***@eureka/eureka",
        ),
        (
            "http://user:s3cr@t@eureka/eureka?x",
            "http://user:***@eureka/eureka?x",
        ),
        ("ftp://user:s3cret@eureka/", "ftp://user:***@eureka/"),
        ("user:s3cret@eureka:8761", "user:***@eureka:8761"),
        ("http://s3cret@eureka/", "http://***@eureka/"),
    ] {
        let err = ServerUrl::parse(bad).unwrap_err();
        assert_eq!(err.url, shown);
        assert!(!err.to_string().contains("s3"), "{err}");
    }
    assert_eq!(redact_url("http://eureka/eureka"), "http://eureka/eureka");
    let cfg = config(vec!["https://user:s3cret@eureka/eureka".into()]);
    let debug = format!("{cfg:?}");
    assert!(debug.contains("https://user:***@eureka/eureka"), "{debug}");
    assert!(!debug.contains("s3cret"), "{debug}");
}

#[test]
fn credentials_over_plain_http_to_another_host_are_flagged() {
    let in_clear = |url: &str| ServerUrl::parse(url).unwrap().sends_credentials_in_clear();
    assert!(in_clear("http://u:p@eureka/eureka"));
    assert!(in_clear("http://u:p@10.0.0.1/eureka"));
    assert!(!in_clear("https://u:p@eureka/eureka"));
    assert!(!in_clear("http://u:p@127.0.0.1:8761/eureka"));
    assert!(!in_clear("http://u:p@LOCALHOST:8761/eureka"));
    assert!(!in_clear("http://u:p@[::1]:8761/eureka"));
    assert!(!in_clear("http://eureka/eureka"), "nothing to read");

    let cfg = ClientConfig {
        token_file: Some(testdata_path("eureka-token.txt")),
        allow_plain_credentials: true,
        ..config(vec!["http://eureka/eureka".into()])
    };
    let access = Access::new(&cfg, &[]).unwrap();
    assert!(access.urls[0].sends_credentials_in_clear(), "the token too");
}

#[test]
fn credentials_over_plain_http_to_another_host_are_refused_unless_allowed() {
    for (url, token_file) in [
        ("http://ops:TOKEN@eureka.mesh.internal/eureka", None),
        (
            "http://10.0.0.1:8761/eureka",
            Some(testdata_path("eureka-token.txt")),
        ),
    ] {
        let cfg = ClientConfig {
            token_file,
            ..config(vec![url.into()])
        };
        let err = Access::new(&cfg, &[]).err().expect("refused");
        let shown = err.to_string();
        assert!(shown.contains("plain http"), "{shown}");
        assert!(
            !shown.contains("TOKEN"),
            "the password is not shown: {shown}"
        );
        let allowed = ClientConfig {
            allow_plain_credentials: true,
            ..cfg
        };
        assert!(Access::new(&allowed, &[]).is_ok(), "{url}");
    }
    // To this host, or over https, credentials are fine.
    for url in [
        "http://ops:TOKEN@127.0.0.1:8761/eureka",
        "http://ops:TOKEN@localhost/eureka",
    ] {
        assert!(Access::new(&config(vec![url.into()]), &[]).is_ok(), "{url}");
    }
}

#[test]
fn the_token_goes_to_every_url_without_credentials_of_its_own() {
    let cfg = ClientConfig {
        token_file: Some(testdata_path("eureka-token.txt")),
        allow_plain_credentials: true,
        ..config(vec![
            "http://eureka-1/eureka".into(),
            "http://odmesh:p%40ss@eureka-2/eureka".into(),
        ])
    };
    let access = Access::new(&cfg, &[]).unwrap();
    let sent: Vec<_> = access
        .urls
        .iter()
        .map(|u| u.authorization().unwrap())
        .collect();
    // base64("odmesh:p@ss")
    assert_eq!(sent, ["Bearer s3cret-token", "Basic b2RtZXNoOnBAc3M="]);
    assert!(sent[0].is_sensitive());
}

#[test]
fn an_unreadable_empty_or_unsendable_token_file_is_a_clear_start_error() {
    for (file, expected) in [
        ("nosuch-token.txt", "nosuch-token.txt: cannot read it: "),
        ("eureka-token-empty.txt", "eureka-token-empty.txt: empty"),
        (
            "eureka-token-bad.txt",
            "eureka-token-bad.txt: the token holds characters no HTTP header can carry",
        ),
    ] {
        let cfg = ClientConfig {
            token_file: Some(testdata_path(file)),
            ..config(vec!["http://eureka/eureka".into()])
        };
        let err = chain(&Access::new(&cfg, &[]).err().unwrap());
        assert!(err.starts_with("--eureka-token-file "), "{err}");
        assert!(err.contains(expected), "{err}");
    }
}

#[test]
fn a_bad_eureka_ca_is_a_start_error_naming_the_file_even_for_http_urls() {
    for (file, expected) in [
        ("nosuch.pem", "tls/nosuch.pem: cannot read it: "),
        ("server.key", "tls/server.key: no certificate in it"),
        (
            "broken-ca.pem",
            "tls/broken-ca.pem: certificate 2 is not a usable CA",
        ),
    ] {
        let cfg = ClientConfig {
            ca_file: Some(tls_path(file)),
            ..config(vec!["http://eureka/eureka".into()])
        };
        let err = chain(&Access::new(&cfg, &[]).err().unwrap());
        assert!(err.starts_with("--eureka-ca: CA bundle "), "{err}");
        assert!(err.contains(expected), "{err}");
    }
}

#[test]
fn https_without_eureka_ca_uses_the_system_bundle_and_fails_clearly_without_one() {
    let https = config(vec![
        "http://eureka-1/eureka".into(),
        "https://eureka-2/eureka".into(),
    ]);
    let err = chain(&Access::new(&https, &["/nonexistent/ca.crt"]).err().unwrap());
    assert_eq!(
        err,
        "https:// Eureka URLs need trusted CAs: give --eureka-ca FILE: \
         no system CA bundle (looked for /nonexistent/ca.crt)"
    );
    let ca = tls_path("ca.pem");
    let access = Access::new(&https, &["/nonexistent/ca.crt", ca.to_str().unwrap()]).unwrap();
    assert_eq!(
        access.trust,
        format!("the system CA bundle {}", ca.display())
    );
    let http = config(vec!["http://eureka/eureka".into()]);
    assert!(
        Access::new(&http, &["/nonexistent/ca.crt"]).is_ok(),
        "plain http needs no CA"
    );
}

#[test]
fn backoff_doubles_from_its_base_up_to_its_bound() {
    let s = Duration::from_secs;
    let waits: Vec<_> = (1..=7).map(|n| backoff(n, s(1), s(30))).collect();
    assert_eq!(waits, [s(1), s(2), s(4), s(8), s(16), s(30), s(30)]);
    assert_eq!(backoff(1000, s(1), s(30)), s(30), "no overflow");
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
    assert_eq!(count(&metrics.client.eureka_full_fetches_total), 1);
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
    assert_eq!(count(&metrics.client.eureka_hash_mismatches_total), 0);
    assert!(count(&metrics.client.eureka_fetches_total) >= 4);
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
    assert!(count(&metrics.client.eureka_hash_mismatches_total) >= 1);
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
        assert_eq!(
            count(&metrics.client.eureka_fetch_errors_total),
            0,
            "{bad:?}"
        );
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
        let errors = count(&metrics.client.eureka_fetch_errors_total);
        mock.set(Some(outage.clone()), Some(outage.clone()));
        wait_until(DEADLINE, &format!("two fetch errors on {outage:?}"), || {
            count(&metrics.client.eureka_fetch_errors_total) >= errors + 2
        })
        .await;
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
    wait_until(DEADLINE, "the source's error to clear", || {
        source.health.snapshot().last_error.is_none()
    })
    .await;
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
    assert_eq!(count(&metrics.client.eureka_failovers_total), 1);
    assert_eq!(count(&metrics.client.eureka_fetch_errors_total), 0);
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
    assert_eq!(count(&metrics.client.eureka_failovers_total), 1);
}

#[tokio::test]
async fn start_returns_unloaded_when_no_server_answers_in_time_and_loads_later() {
    let (mock, url) = Mock::start(Reply::Hang, Reply::Status(404)).await;
    let metrics = Counters::default();
    let mut cfg = config(vec![url]);
    cfg.first_fetch_wait = Duration::from_millis(200);
    let started = tokio::time::Instant::now();
    let source = metrics.start(cfg).await.unwrap();
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
        count(&metrics.registry.registry_loads_total) >= 3,
        "each poll is a good fetch"
    );
}

#[tokio::test]
async fn no_urls_or_a_bad_url_is_an_error() {
    let metrics = Counters::default();
    assert!(
        start(
            vec![],
            DEFAULT_INTERVAL,
            metrics.registry.clone(),
            metrics.client.clone()
        )
        .await
        .is_err()
    );
    let err = start(
        vec!["ftp://x/eureka".into()],
        DEFAULT_INTERVAL,
        metrics.registry,
        metrics.client,
    )
    .await
    .unwrap_err();
    assert!(err.to_string().contains("http(s)://"), "{err}");
}

#[tokio::test]
async fn https_is_followed_with_the_eureka_ca() {
    let (mock, url) = Mock::start_tls(
        Reply::Body(testdata("eureka-apps.json")),
        Reply::Body(testdata("eureka-delta.json")),
        "server",
    )
    .await;
    let metrics = Counters::default();
    let source = metrics.start(tls_config(vec![url])).await.unwrap();
    assert!(source.health.is_loaded(), "start waits for the first fetch");
    assert_eq!(source.registry.borrow().len(), 9);
    wait_registry(&source, |r| has(r, "hello-4")).await;
    mock.wait_delta_hits(2).await;
    assert_eq!(mock.hits().0, 1, "deltas over https too");
    assert_eq!(count(&metrics.client.eureka_fetch_errors_total), 0);
    let description = source.health.snapshot().description;
    assert!(
        description.starts_with("eureka https://127.0.0.1:"),
        "{description}"
    );
}

#[tokio::test]
async fn the_system_bundle_is_trusted_without_eureka_ca() {
    let (_mock, url) = Mock::start_tls(
        Reply::Body(testdata("eureka-apps.json")),
        Reply::Status(404),
        "server",
    )
    .await;
    let ca = tls_path("ca.pem");
    let source = start_trusting(
        config(vec![url]),
        Arc::default(),
        Arc::default(),
        &[ca.to_str().unwrap()],
    )
    .await
    .unwrap();
    assert_eq!(source.registry.borrow().len(), 9);
}

#[tokio::test]
async fn a_host_name_is_checked_against_the_certificate() {
    let (mock, url) = Mock::start_tls(
        Reply::Body(testdata("eureka-apps.json")),
        Reply::Status(404),
        "server",
    )
    .await;
    let by_name = url.replace("127.0.0.1", "localhost");
    let (source, _) = follow_unloaded(tls_config(vec![by_name])).await;
    wait_registry(&source, |r| r.len() == 9).await;

    mock.set_certificate("wrong-name");
    let (source, _) = follow_unloaded(tls_config(vec![url])).await;
    let err = wait_error(&source).await;
    assert!(err.contains("TLS handshake failed"), "{err}");
    assert!(err.contains("not valid for name"), "{err}");
    assert!(source.registry.borrow().is_empty());
}

#[tokio::test]
async fn a_certificate_from_another_ca_is_refused_clearly_and_the_last_good_registry_stays() {
    let (mock, url) = Mock::start_tls(
        Reply::Body(testdata("eureka-apps.json")),
        Reply::Status(404),
        "server",
    )
    .await;
    let metrics = Counters::default();
    let source = metrics.start(tls_config(vec![url])).await.unwrap();
    let good = source.registry.borrow().clone();
    assert_eq!(good.len(), 9);

    mock.set_certificate("other-server");
    let errors = count(&metrics.client.eureka_fetch_errors_total);
    wait_until(
        DEADLINE,
        "two fetch errors on the other certificate",
        || count(&metrics.client.eureka_fetch_errors_total) >= errors + 2,
    )
    .await;
    let err = wait_error(&source).await;
    assert!(err.contains("TLS handshake failed"), "{err}");
    assert!(err.contains("UnknownIssuer"), "rustls's reason: {err}");
    assert!(err.contains("(trusted CAs: --eureka-ca "), "{err}");
    assert!(err.contains("tls/ca.pem)"), "{err}");
    assert_eq!(*source.registry.borrow(), good);
    assert!(source.health.is_loaded());

    mock.set_certificate("server");
    mock.set(
        Some(Reply::Body(testdata(
            "eureka-apps-after-missed-change.json",
        ))),
        None,
    );
    wait_registry(&source, |r| has(r, "billing-2")).await;
    wait_until(DEADLINE, "the source's error to clear", || {
        source.health.snapshot().last_error.is_none()
    })
    .await;
}

#[tokio::test]
async fn basic_authentication_from_the_url_is_sent_with_every_request() {
    let (mock, url) = Mock::start_tls(
        Reply::Body(testdata("eureka-apps.json")),
        Reply::Body(testdata("eureka-delta.json")),
        "server",
    )
    .await;
    // base64("odmesh:p@ss")
    mock.require_authorization("Basic b2RtZXNoOnBAc3M=");
    let url = url.replace("https://", "https://odmesh:p%40ss@");
    let metrics = Counters::default();
    let source = metrics.start(tls_config(vec![url])).await.unwrap();
    assert_eq!(source.registry.borrow().len(), 9);
    mock.wait_delta_hits(2).await;
    let seen = mock.seen_authorization();
    assert!(seen.len() >= 3);
    assert!(
        seen.iter()
            .all(|a| a.as_deref() == Some("Basic b2RtZXNoOnBAc3M=")),
        "{seen:?}"
    );
    assert_eq!(count(&metrics.client.eureka_fetch_errors_total), 0);
    let description = source.health.snapshot().description;
    assert!(
        description.contains("https://odmesh:***@127.0.0.1:"),
        "{description}"
    );
    assert!(!description.contains("p%40ss"), "{description}");
}

#[tokio::test]
async fn a_bearer_token_from_the_token_file_is_sent_trimmed() {
    let (mock, url) = Mock::start_tls(
        Reply::Body(testdata("eureka-apps.json")),
        Reply::Status(404),
        "server",
    )
    .await;
    mock.require_authorization("Bearer s3cret-token");
    let cfg = ClientConfig {
        token_file: Some(testdata_path("eureka-token.txt")),
        ..tls_config(vec![url])
    };
    let source = Counters::default().start(cfg).await.unwrap();
    assert_eq!(source.registry.borrow().len(), 9);
    assert_eq!(
        mock.seen_authorization()[0].as_deref(),
        Some("Bearer s3cret-token")
    );
}

#[tokio::test]
async fn wrong_or_missing_credentials_are_a_clear_error_that_never_shows_the_password() {
    let (mock, url) = Mock::start_tls(
        Reply::Body(testdata("eureka-apps.json")),
        Reply::Status(404),
        "server",
    )
    .await;
    mock.require_authorization("Basic b2RtZXNoOnBAc3M=");

    let wrong = url.replace("https://", "https://odmesh:wr0ng-s3cret@");
    let (source, metrics) = follow_unloaded(tls_config(vec![wrong])).await;
    let err = wait_error(&source).await;
    assert!(
        err.ends_with("/eureka/apps: Eureka answered 401: check the credentials"),
        "{err}"
    );
    assert!(err.starts_with("https://odmesh:***@127.0.0.1:"), "{err}");
    let status = serde_json::to_string(&source.health.snapshot()).unwrap();
    assert!(!status.contains("wr0ng-s3cret"), "{status}");
    assert!(!source.health.is_loaded());
    assert!(count(&metrics.client.eureka_fetch_errors_total) >= 1);

    let (source, _) = follow_unloaded(tls_config(vec![url])).await;
    let err = wait_error(&source).await;
    assert!(
        err.contains("Eureka answered 401: it wants credentials"),
        "{err}"
    );
}

#[tokio::test]
async fn the_next_url_is_used_when_an_https_server_fails_its_handshake() {
    let (_bad, bad_url) = Mock::start_tls(
        Reply::Body(testdata("eureka-apps-single.json")),
        Reply::Status(404),
        "other-server",
    )
    .await;
    let (_good, good_url) = Mock::start_tls(
        Reply::Body(testdata("eureka-apps.json")),
        Reply::Status(404),
        "server",
    )
    .await;
    let metrics = Counters::default();
    let urls = vec![dead_url().await, bad_url, good_url];
    let source = metrics.start(tls_config(urls)).await.unwrap();
    assert!(source.health.is_loaded());
    assert_eq!(source.registry.borrow().len(), 9);
    assert_eq!(count(&metrics.client.eureka_failovers_total), 1);
    assert_eq!(count(&metrics.client.eureka_fetch_errors_total), 0);
}

/// A Eureka `/apps` document with `n` UP instances of app HELLO.
fn apps_document(n: usize) -> Vec<u8> {
    let instances: Vec<serde_json::Value> = (0..n)
        .map(|i| {
            serde_json::json!({
                "instanceId": format!("h{i}"), "app": "HELLO", "ipAddr": format!("10.0.0.{}", i + 1),
                "status": "UP", "port": {"$": 8080, "@enabled": "true"}, "vipAddress": "hello"
            })
        })
        .collect();
    let code = if n == 0 {
        String::new()
    } else {
        format!("UP_{n}_")
    };
    serde_json::json!({"applications": {"versions__delta": "1", "apps__hashcode": code,
        "application": [{"name": "HELLO", "instance": instances}]}})
    .to_string()
    .into_bytes()
}

/// Follows `url` (whose delta answers 404, so every poll is a full fetch) with a drop guard
/// that confirms after `confirm_after`.
async fn follow_guarded(url: String, confirm_after: Duration) -> (EurekaSource, Counters) {
    let metrics = Counters::default();
    let cfg = ClientConfig {
        drop_guard: DropGuardConfig {
            max_drop: 0.5,
            confirm_after,
        },
        ..config(vec![url])
    };
    (metrics.start(cfg).await.unwrap(), metrics)
}

#[tokio::test]
async fn an_answer_that_loses_most_of_the_registry_is_held_until_a_later_fetch_confirms_it() {
    let (mock, url) = Mock::start(Reply::Body(apps_document(12)), Reply::Status(404)).await;
    let confirm = Duration::from_millis(400);
    let (source, metrics) = follow_guarded(url, confirm).await;
    wait_registry(&source, |r| r.len() == 12).await;

    // Eureka restarted empty.
    mock.set(Some(Reply::Body(apps_document(0))), None);
    wait_until(DEADLINE, "the drop to be held", || {
        source.health.snapshot().holding.is_some()
    })
    .await;
    let held_at = tokio::time::Instant::now();
    assert_eq!(
        source.registry.borrow().len(),
        12,
        "the registry in use stays"
    );
    let text = source.health.snapshot().holding.unwrap();
    assert!(text.contains("lost 12 of 12"), "{text}");
    assert_eq!(count(&metrics.registry.registry_drops_held_total), 1);
    assert_eq!(count(&metrics.registry.registry_drop_held), 1);

    // Still empty a fetch later than the confirmation time: followed.
    wait_registry(&source, |r| r.is_empty()).await;
    assert!(
        held_at.elapsed() + Duration::from_millis(100) >= confirm,
        "followed after {:?}, before the confirmation time {confirm:?}",
        held_at.elapsed()
    );
    assert!(source.health.snapshot().holding.is_none());
    assert_eq!(count(&metrics.registry.registry_drop_held), 0);
    assert_eq!(count(&metrics.registry.registry_drops_held_total), 1);
}

#[tokio::test]
async fn a_server_that_recovers_before_its_drop_is_confirmed_is_followed_and_the_drop_never_applied()
 {
    let (mock, url) = Mock::start(Reply::Body(apps_document(12)), Reply::Status(404)).await;
    let (source, _metrics) = follow_guarded(url, Duration::from_secs(3600)).await;
    let mut rx = source.registry.clone();
    wait_registry(&source, |r| r.len() == 12).await;
    rx.mark_unchanged();

    mock.set(Some(Reply::Body(apps_document(2))), None);
    wait_until(DEADLINE, "the drop to be held", || {
        source.health.snapshot().holding.is_some()
    })
    .await;
    mock.set(Some(Reply::Body(apps_document(12))), None);
    wait_until(DEADLINE, "the held drop to be let go", || {
        source.health.snapshot().holding.is_none()
    })
    .await;
    assert!(
        !rx.has_changed().unwrap(),
        "the 2-instance registry was never published"
    );
    // A smaller loss is followed at once.
    mock.set(Some(Reply::Body(apps_document(7))), None);
    wait_registry(&source, |r| r.len() == 7).await;
}

#[tokio::test]
async fn before_its_first_fetch_the_source_is_still_loading_and_complete_after() {
    let (_mock, url) = Mock::start(Reply::Hang, Reply::Status(404)).await;
    let metrics = Counters::default();
    let cfg = ClientConfig {
        first_fetch_wait: Duration::from_millis(10),
        ..config(vec![url])
    };
    let source = metrics.start(cfg).await.unwrap();
    assert!(!source.registry.borrow().is_complete());
    let (_mock, url) = Mock::start(Reply::Body(apps_document(1)), Reply::Status(404)).await;
    let (source, _) = follow(vec![url]).await;
    assert!(wait_registry(&source, |r| r.len() == 1).await.is_complete());
}

#[tokio::test]
async fn the_follower_asks_for_gzip_and_reads_a_gzip_answer_and_a_plain_one() {
    let (mock, url) = Mock::start(
        Reply::Gzip(testdata("eureka-apps.json")),
        Reply::Status(404),
    )
    .await;
    let (source, metrics) = follow(vec![url]).await;
    assert_eq!(source.registry.borrow().len(), 9);
    assert_eq!(mock.0.lock().unwrap().accept_encoding[0], "gzip");
    // The same server answering plain now, with one instance fewer.
    let doc = apps_document(8);
    mock.set(Some(Reply::Body(doc)), None);
    wait_registry(&source, |r| r.len() == 8).await;
    mock.set(Some(Reply::Gzip(apps_document(7))), None);
    wait_registry(&source, |r| r.len() == 7).await;
    assert_eq!(count(&metrics.client.eureka_fetch_errors_total), 0);
}

#[tokio::test]
async fn a_delta_answered_in_gzip_is_applied() {
    let (mock, url) = Mock::start(
        Reply::Body(testdata("eureka-apps.json")),
        Reply::Gzip(testdata("eureka-delta.json")),
    )
    .await;
    let (source, metrics) = follow(vec![url]).await;
    let reg = wait_registry(&source, |r| has(r, "hello-4")).await;
    assert!(!has(&reg, "greeter-2"));
    assert_eq!(count(&metrics.client.eureka_hash_mismatches_total), 0);
    assert_eq!(mock.hits().0, 1, "no full fetch after the first");
}

#[tokio::test]
async fn an_answer_over_the_limit_is_refused_counted_and_the_last_good_registry_kept() {
    let small = apps_document(12);
    let large = apps_document(40);
    let (mock, url) = Mock::start(Reply::Body(small.clone()), Reply::Status(404)).await;
    let metrics = Counters::default();
    let cfg = ClientConfig {
        max_answer: small.len() as u64 + 100,
        ..config(vec![url])
    };
    let source = metrics.start(cfg).await.unwrap();
    assert_eq!(source.registry.borrow().len(), 12);

    // Plain, and gzip: small as transferred, over the limit once decoded.
    for over in [Reply::Body(large.clone()), Reply::Gzip(large.clone())] {
        let before = count(&metrics.client.eureka_answers_too_large_total);
        mock.set(Some(over), None);
        wait_until(DEADLINE, "the answer counted too large", || {
            count(&metrics.client.eureka_answers_too_large_total) > before
        })
        .await;
        let error = wait_error(&source).await;
        assert!(error.contains("larger than --eureka-max-answer"), "{error}");
        assert_eq!(source.registry.borrow().len(), 12, "the last good registry");
    }
    assert!(count(&metrics.client.eureka_fetch_errors_total) >= 2);
    mock.set(Some(Reply::Body(apps_document(11))), None);
    wait_registry(&source, |r| r.len() == 11).await;
}

/// A registry of `n` instances, 10 per app, each a small instance document.
fn generated_document(n: usize, status: impl Fn(usize) -> &'static str) -> (Vec<u8>, String) {
    use std::fmt::Write;
    let mut s = String::from(r#"{"applications":{"versions__delta":"1","application":["#);
    for app in 0..n.div_ceil(10) {
        if app > 0 {
            s.push(',');
        }
        let _ = write!(s, r#"{{"name":"SVC-{app}","instance":["#);
        for i in app * 10..(app * 10 + 10).min(n) {
            if i > app * 10 {
                s.push(',');
            }
            let _ = write!(
                s,
                r#"{{"instanceId":"i-{i}","app":"SVC-{app}","ipAddr":"10.{}.{}.{}","status":"{}","port":{{"$":8080,"@enabled":"true"}},"vipAddress":"svc-{app}","actionType":"MODIFIED"}}"#,
                i >> 16,
                (i >> 8) & 255,
                i & 255,
                status(i)
            );
        }
        s.push_str("]}");
    }
    s.push_str("]}}");
    let down = (0..n).filter(|&i| status(i) == "DOWN").count();
    let code = reconcile_hash_code_of_counts([(Status::Down, down), (Status::Up, n - down)]);
    let s = s.replacen(
        r#""versions__delta":"1""#,
        &format!(r#""versions__delta":"1","apps__hashcode":"{code}""#),
        1,
    );
    (s.into_bytes(), code)
}

#[tokio::test]
async fn a_registry_of_a_hundred_thousand_instances_is_followed_in_full_and_by_deltas() {
    const N: usize = 100_000;
    let (full, _) = generated_document(N, |_| "UP");
    let (mock, url) = Mock::start(Reply::Gzip(full), Reply::Status(404)).await;
    let metrics = Counters::default();
    let cfg = ClientConfig {
        request_timeout: Duration::from_secs(10),
        interval: Duration::from_millis(200),
        ..config(vec![url])
    };
    let source = metrics.start(cfg).await.unwrap();
    let reg = wait_registry(&source, |r| r.len() == N).await;
    assert_eq!(
        reg.instances().filter(|i| i.status == Status::Up).count(),
        N
    );

    // A delta: one instance in a hundred goes DOWN; its hash code is the whole registry's.
    let down = |i: usize| if i.is_multiple_of(100) { "DOWN" } else { "UP" };
    let (changed, _) = generated_document(N, down);
    let changed = String::from_utf8(changed).unwrap();
    // Only the changed instances go in the delta.
    let delta = only_instances(&changed, |i| i.is_multiple_of(100));
    mock.set(None, Some(Reply::Gzip(delta.into_bytes())));
    let reg = wait_registry(&source, |r| {
        r.instances().filter(|i| i.status == Status::Down).count() == N / 100
    })
    .await;
    assert_eq!(reg.len(), N);
    assert_eq!(count(&metrics.client.eureka_hash_mismatches_total), 0);
    assert_eq!(mock.hits().0, 1, "followed by deltas alone");
    assert_eq!(count(&metrics.client.eureka_fetch_errors_total), 0);
}

/// `doc` (of [`generated_document`]) with only the instances `keep` says.
fn only_instances(doc: &str, keep: impl Fn(usize) -> bool) -> String {
    let mut v: serde_json::Value = serde_json::from_str(doc).unwrap();
    let apps = v["applications"]["application"].as_array_mut().unwrap();
    for app in apps.iter_mut() {
        let list = app["instance"].as_array_mut().unwrap();
        list.retain(|inst| {
            let id = inst["instanceId"].as_str().unwrap();
            keep(id[2..].parse().unwrap())
        });
    }
    apps.retain(|a| !a["instance"].as_array().unwrap().is_empty());
    v.to_string()
}

#[test]
fn each_fetch_error_shows_its_cause_once() {
    use odmesh_base::error::repeats_its_cause;
    let url = || "http://eureka/eureka/apps".to_owned();
    let not_json = || serde_json::from_slice::<serde_json::Value>(b"{").unwrap_err();
    let no_ca = ClientConfig {
        ca_file: Some("/nonexistent/odmesh/ca.pem".into()),
        ..config(vec![url()])
    };
    let errors: [Box<dyn std::error::Error>; 7] = [
        Box::new(FetchError::Transport {
            url: url(),
            source: std::io::Error::other("connection reset").into(),
        }),
        Box::new(FetchError::Tls {
            url: url(),
            trust: "--eureka-ca ca.pem".into(),
            source: rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer),
        }),
        Box::new(FetchError::Document {
            url: url(),
            source: InvalidDocument::Json(not_json()),
        }),
        Box::new(InvalidDocument::Json(not_json())),
        Box::new(Unread::Transport(std::io::Error::other("reset").into())),
        Box::new(ServerUrl::parse("http://eu reka/").unwrap_err()),
        Box::new(Access::new(&no_ca, &[]).map(drop).unwrap_err()),
    ];
    for e in errors {
        let e = e.as_ref();
        assert!(e.source().is_some(), "{e}: its cause is kept");
        assert!(!repeats_its_cause(e), "{}", chain(e));
    }
}

#[tokio::test]
async fn an_unreachable_server_is_reported_with_each_cause_once() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let (source, _) = follow_unloaded(config(vec![format!("http://{closed}/eureka")])).await;
    let err = wait_error(&source).await;
    assert!(
        err.starts_with(&format!(
            "http://{closed}/eureka/apps: client error (Connect): "
        )),
        "{err}"
    );
    assert_eq!(err.matches("refused").count(), 1, "{err}");
}
