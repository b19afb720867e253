//! The admin HTTP endpoint: health, readiness, Prometheus metrics and debug views.
//!
//! | path | answer |
//! |---|---|
//! | `/healthz` | 200 while the process serves |
//! | `/readyz` | 200 once a registry is loaded, else 503; JSON says why |
//! | `/metrics` | Prometheus text |
//! | `/debug/registry` | JSON: the source's state and every instance in use |
//! | `/debug/proxies` | JSON: each connected proxy and what it subscribed |
//!
//! The admin only renders what the other layers hand it, through [`AdminView`].

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::json;

use crate::metrics::Metrics;

/// What the admin endpoint shows, supplied by the layers that own it.
pub trait AdminView: Send + Sync + 'static {
    /// Whether a registry has been loaded, and a JSON description of the source's state.
    fn registry_status(&self) -> (bool, serde_json::Value);
    /// The registry in use, as JSON.
    fn registry(&self) -> serde_json::Value;
    /// The connected proxies and their subscriptions, as JSON.
    fn proxies(&self) -> serde_json::Value;
    /// The process metrics.
    fn metrics(&self) -> &Metrics;
}

/// The admin routes over `view`.
pub fn router(view: Arc<dyn AdminView>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/debug/registry", get(debug_registry))
        .route("/debug/proxies", get(debug_proxies))
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

async fn metrics(State(view): View) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        view.metrics().render(),
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

fn pretty(value: &serde_json::Value) -> Response {
    let mut body =
        serde_json::to_string_pretty(value).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"));
    body.push('\n');
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}
