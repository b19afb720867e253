//! The admin HTTP endpoint: health, readiness, Prometheus metrics and debug views.
//!
//! | path | answer |
//! |---|---|
//! | `/` | HTML: the mesh dashboard for people: registry, proxies and their clusters, on-demand answers, prewarm, policy ([`dashboard`](crate::dashboard)) |
//! | `/healthz` | 200 while the process serves |
//! | `/readyz` | 200 once a registry is loaded, else 503; JSON says why |
//! | `/metrics` | every metric: OpenMetrics if the scraper's `Accept` asks for it, else Prometheus text |
//! | `/debug/registry` | JSON: the source's state and every instance in use |
//! | `/debug/proxies` | JSON: each connected proxy and what it subscribed |
//! | `/debug/prewarm` | JSON: per calling service, the clusters a connecting proxy is sent ahead (prewarm), with when each was last used, and how many sent ahead were then used (hit rate) |
//! | `/debug/policy` | JSON: the policy file's state, and the effective policy of every cluster a proxy holds, per calling service, with where each value came from; `?cluster=<name>&caller=<service>` for any other |
//!
//! The admin only renders what the other layers hand it, through [`AdminView`]. It checks no
//! credentials: it listens on loopback unless `--admin` says otherwise (docs/production.md).

use std::sync::Arc;

use axum::Router;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use odmesh_base::metrics::Format;
use serde_json::json;

/// What the admin endpoint shows, supplied by the layers that own it.
pub trait AdminView: Send + Sync + 'static {
    /// Whether a registry has been loaded, and a JSON description of the source's state.
    fn registry_status(&self) -> (bool, serde_json::Value);
    /// The registry in use, as JSON.
    fn registry(&self) -> serde_json::Value;
    /// The connected proxies and their subscriptions, as JSON.
    fn proxies(&self) -> serde_json::Value;
    /// The policy: the file's state and the effective policy of the clusters proxies hold,
    /// or of `cluster` for proxies of `caller` when asked for one.
    fn policy(&self, cluster: Option<&str>, caller: &str) -> serde_json::Value;
    /// The prewarm history per calling service, and its hit rate.
    fn prewarm(&self) -> serde_json::Value;
    /// Every metric of the process, in `format`.
    fn metrics(&self, format: Format) -> String;
    /// On-demand answer time percentiles, for the dashboard; `None`: none measured yet,
    /// which the dashboard says.
    fn answer_time_percentiles(&self) -> Option<crate::dashboard::AnswerTimes>;
}

/// Runs `serve` on `listener` on a thread of its own with a runtime of its own, so that it
/// answers however busy the xDS server keeps the main runtime's workers (a flood of
/// requests); the handle ends when `serve` does.
pub fn on_own_thread<F>(
    name: &str,
    listener: tokio::net::TcpListener,
    serve: impl FnOnce(tokio::net::TcpListener) -> F + Send + 'static,
) -> std::io::Result<tokio::task::JoinHandle<std::io::Result<()>>>
where
    F: std::future::Future<Output = std::io::Result<()>>,
{
    // The listener moves to the thread's runtime: it was registered with this one.
    let listener = listener.into_std()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (done, ended) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || {
            let served = runtime
                .block_on(async move { serve(tokio::net::TcpListener::from_std(listener)?).await });
            let _ = done.send(served);
        })?;
    Ok(tokio::spawn(async move {
        ended
            .await
            .unwrap_or_else(|_| Err(std::io::Error::other("its thread panicked")))
    }))
}

/// The admin routes over `view`.
pub fn router(view: Arc<dyn AdminView>) -> Router {
    Router::new()
        .route("/", get(dashboard))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/debug/registry", get(debug_registry))
        .route("/debug/proxies", get(debug_proxies))
        .route("/debug/policy", get(debug_policy))
        .route("/debug/prewarm", get(debug_prewarm))
        .with_state(view)
}

type View = State<Arc<dyn AdminView>>;

async fn readyz(State(view): View) -> Response {
    let (ready, status) = view.registry_status();
    let code = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, pretty(&json!({ "ready": ready, "registry": status }))).into_response()
}

/// OpenMetrics for a scraper that asks for it (Prometheus does), Prometheus text otherwise.
async fn metrics(State(view): View, headers: HeaderMap) -> Response {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    let format = Format::for_accept(accept.unwrap_or(""));
    (
        [(header::CONTENT_TYPE, format.content_type())],
        view.metrics(format),
    )
        .into_response()
}

async fn debug_registry(State(view): View) -> Response {
    let (_, status) = view.registry_status();
    pretty(&json!({ "source": status, "registry": view.registry() })).into_response()
}

async fn debug_proxies(State(view): View) -> Response {
    pretty(&view.proxies()).into_response()
}

async fn debug_policy(
    State(view): View,
    Query(query): Query<std::collections::HashMap<String, String>>,
) -> Response {
    let caller = query.get("caller").map_or("", String::as_str);
    pretty(&view.policy(query.get("cluster").map(String::as_str), caller)).into_response()
}

async fn dashboard(State(view): View) -> Response {
    let page = crate::dashboard::render(&crate::dashboard::MeshView::of(view.as_ref()));
    odmesh_base::html::response(page)
}

async fn debug_prewarm(State(view): View) -> Response {
    pretty(&view.prewarm()).into_response()
}

fn pretty(value: &serde_json::Value) -> Response {
    let mut value = value.clone();
    durations_as_text(&mut value);
    let mut body =
        serde_json::to_string_pretty(&value).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"));
    body.push('\n');
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// Writes every duration serde wrote as `{"secs": 2, "nanos": 0}` as the flags and the policy
/// file write it (`"2s"`: [`odmesh_base::flags::duration_text`]).
fn durations_as_text(value: &mut serde_json::Value) {
    use serde_json::Value;
    match value {
        Value::Object(map) => {
            let secs = map.get("secs").and_then(Value::as_u64);
            let nanos = map.get("nanos").and_then(Value::as_u64);
            if let (2, Some(secs), Some(nanos)) = (map.len(), secs, nanos)
                && let Ok(nanos) = u32::try_from(nanos)
                && nanos < 1_000_000_000
            {
                let d = std::time::Duration::new(secs, nanos);
                *value = Value::String(odmesh_base::flags::duration_text(d));
                return;
            }
            map.values_mut().for_each(durations_as_text);
        }
        Value::Array(items) => items.iter_mut().for_each(durations_as_text),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;
    use axum::body::Body;
    use axum::http::Request;
    use tower::ServiceExt;

    struct Fake {
        loaded: bool,
        metrics: Arc<Metrics>,
    }

    impl AdminView for Fake {
        fn registry_status(&self) -> (bool, serde_json::Value) {
            (self.loaded, json!({ "description": "file test.yaml" }))
        }
        fn registry(&self) -> serde_json::Value {
            json!({ "instances": [{ "app": "HELLO" }] })
        }
        fn proxies(&self) -> serde_json::Value {
            json!([{ "node": "proxy-1", "clusters": ["hello.vip"] }])
        }
        fn policy(&self, cluster: Option<&str>, caller: &str) -> serde_json::Value {
            let effective = crate::policy::Effective::builtin();
            let effective = effective.debug_view(std::time::SystemTime::now());
            json!({ "cluster": cluster, "caller": caller, "effective": effective })
        }
        fn prewarm(&self) -> serde_json::Value {
            json!({ "enabled": false })
        }
        fn metrics(&self, format: Format) -> String {
            let exposition = odmesh_base::metrics::Exposition::default();
            exposition.add(self.metrics.clone());
            exposition.render(format)
        }
        fn answer_time_percentiles(&self) -> Option<crate::dashboard::AnswerTimes> {
            let answers = &self.metrics.xds_on_demand_answer_seconds;
            Some(crate::dashboard::AnswerTimes::of(answers))
        }
    }

    async fn get(loaded: bool, path: &str) -> (StatusCode, String) {
        let view = Arc::new(Fake {
            loaded,
            metrics: Arc::default(),
        });
        view.metrics.answered("cluster", true);
        let resp = router(view)
            .oneshot(Request::get(path).body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = resp.status();
        let body = axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .unwrap();
        (status, String::from_utf8(body.to_vec()).unwrap())
    }

    #[tokio::test]
    async fn debug_answers_write_durations_as_the_policy_file_does() {
        let (status, body) = get(true, "/debug/policy?cluster=a.vip").await;
        assert_eq!(status, StatusCode::OK);
        let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
        let effective = &answer["effective"];
        assert_eq!(effective["connect_timeout"]["value"], "1s", "{body}");
        assert_eq!(effective["idle_timeout"]["value"], "1h", "{body}");
        assert_eq!(effective["request_timeout"]["value"], "0s", "{body}");
        assert!(!body.contains("\"secs\""), "{body}");
        // An object that only looks like one is left alone.
        let mut other = json!({ "secs": 1, "nanos": 2, "more": 3 });
        durations_as_text(&mut other);
        assert_eq!(other["secs"], 1);
    }

    /// The answer to `GET /healthz` from `addr`, read with a blocking socket within `limit`.
    fn healthz(addr: std::net::SocketAddr, limit: std::time::Duration) -> std::io::Result<String> {
        use std::io::{Read, Write};
        let mut socket = std::net::TcpStream::connect_timeout(&addr, limit)?;
        socket.set_read_timeout(Some(limit))?;
        socket.write_all(b"GET /healthz HTTP/1.1\r\nhost: admin\r\nconnection: close\r\n\r\n")?;
        let mut answer = String::new();
        socket.read_to_string(&mut answer)?;
        Ok(answer)
    }

    #[test]
    fn on_its_own_thread_the_admin_answers_while_every_worker_of_the_main_runtime_is_busy() {
        use std::sync::atomic::{AtomicBool, Ordering};
        // The main runtime has one worker, which a task then keeps busy without yielding,
        // as a flood's work could.
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let (busy, release) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicBool::new(false)),
        );
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (addr, admin) = runtime.block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let view = Arc::new(Fake {
                loaded: true,
                metrics: Arc::default(),
            });
            let shutdown = async move {
                let _ = stopped.await;
            };
            let serve = move |listener| {
                let limits = odmesh_base::http_server::HttpLimits::default();
                odmesh_base::http_server::serve(
                    listener,
                    router(view),
                    limits,
                    None,
                    |_| {},
                    shutdown,
                )
            };
            let admin = on_own_thread("test-admin", listener, serve).unwrap();
            let (busy, release) = (busy.clone(), release.clone());
            tokio::spawn(async move {
                busy.store(true, Ordering::SeqCst);
                while !release.load(Ordering::SeqCst) {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
            });
            (addr, admin)
        });
        let limit = std::time::Duration::from_secs(10);
        let started = std::time::Instant::now();
        while !busy.load(Ordering::SeqCst) {
            assert!(started.elapsed() < limit, "the busy task never ran");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }

        let answer = healthz(addr, limit);
        release.store(true, Ordering::SeqCst);
        let answer = answer.expect("the admin answers while the main runtime is busy");
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        let _ = stop.send(());
        let ended = runtime.block_on(async { tokio::time::timeout(limit, admin).await });
        assert!(matches!(ended, Ok(Ok(Ok(())))), "{ended:?}");
    }

    #[tokio::test]
    async fn the_dashboard_at_the_root_is_html_showing_the_proxies_and_their_clusters() {
        let (code, body) = get(true, "/").await;
        assert_eq!(code, StatusCode::OK);
        for shown in [
            "<h2>Connected proxies (1)</h2>",
            "<td class=\"w\">hello.vip</td>",
            "<td>file test.yaml</td>",
            "<th>responses accepted (ACK)</th><td class=\"n\">1</td>",
            "<td class=\"muted\">no answer measured yet</td>",
        ] {
            assert!(body.contains(shown), "{shown}\n{body}");
        }
    }

    #[tokio::test]
    async fn readyz_is_503_until_a_registry_is_loaded() {
        let (code, body) = get(false, "/readyz").await;
        assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
        assert!(body.contains("\"ready\": false"), "{body}");
        let (code, _) = get(true, "/readyz").await;
        assert_eq!(code, StatusCode::OK);
    }

    #[tokio::test]
    async fn metrics_are_prometheus_text_or_openmetrics_as_asked() {
        let (code, body) = get(true, "/metrics").await;
        assert_eq!(code, StatusCode::OK);
        assert!(
            body.contains("odmesh_xds_acks_total{type=\"cluster\"} 1\n"),
            "{body}"
        );
        assert!(!body.contains("# EOF"), "{body}");
        let view = Arc::new(Fake {
            loaded: true,
            metrics: Arc::default(),
        });
        let openmetrics = "application/openmetrics-text;version=1.0.0,text/plain;q=0.5";
        let resp = router(view)
            .oneshot(
                Request::get("/metrics")
                    .header("accept", openmetrics)
                    .body(Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap();
        let content_type = resp.headers()[header::CONTENT_TYPE]
            .to_str()
            .unwrap()
            .to_owned();
        assert!(content_type.starts_with("application/openmetrics-text; version=1.0.0"));
        let body = axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .unwrap();
        assert!(String::from_utf8_lossy(&body).ends_with("# EOF\n"));
    }

    #[tokio::test]
    async fn debug_views_show_the_registry_and_the_proxies() {
        let (_, body) = get(true, "/debug/registry").await;
        assert!(
            body.contains("file test.yaml") && body.contains("HELLO"),
            "{body}"
        );
        let (_, body) = get(true, "/debug/proxies").await;
        assert!(
            body.contains("proxy-1") && body.contains("hello.vip"),
            "{body}"
        );
        let (code, _) = get(true, "/healthz").await;
        assert_eq!(code, StatusCode::OK);
    }
}
