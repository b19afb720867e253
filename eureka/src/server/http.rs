//! The embedded registry's REST API: the edge, where requests become calls on
//! [`EurekaRegistry`] and results become answers (JSON or XML, as the client asks). The one
//! place the registry's outcomes become HTTP statuses: [`status_of`] answers each
//! [`Refusal`], and [`reply`] each peer's write.

use std::collections::HashMap;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Extension, Path, Query, Request, State as AxState};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};

use odmesh_base::error::Chain;
use odmesh_base::http_server::{self, Source};
use odmesh_base::logs::{self, clip};
use odmesh_base::metrics::inc;
use odmesh_registry::Status;

use super::auth::{self, Caller};
use super::dashboard;
use super::peers::{self, Applied, REPLICATION_HEADER, Replicated};
use super::{Document, EurekaRegistry, InvalidRequest, Refusal};
use crate::wire::json::{
    ApplicationDocument, Applications, ApplicationsDocument, InstanceDocument, InstanceInfo,
};
use crate::wire::replication::{Action, Replies, Reply};
use crate::wire::xml;

/// The REST API, under `/eureka` and `/eureka/v2`, over `eureka`.
pub(super) fn router(eureka: EurekaRegistry) -> Router {
    let api = Router::new()
        .route("/apps", get(get_apps))
        .route("/apps/", get(get_apps))
        .route("/apps/delta", get(get_delta))
        .route("/apps/{app}", get(get_app).post(register))
        .route(
            "/apps/{app}/{id}",
            get(get_instance).put(renew).delete(cancel),
        )
        .route(
            "/apps/{app}/{id}/status",
            put(put_status).delete(delete_status),
        )
        .route("/apps/{app}/{id}/metadata", put(put_metadata))
        .route("/instances/{id}", get(get_instance_by_id))
        .route("/vips/{vip}", get(get_vip))
        .route("/svips/{svip}", get(get_svip))
        // Eureka's servers post to `peerreplication/batch/`.
        .route("/peerreplication/batch", post(replication_batch))
        .route("/peerreplication/batch/", post(replication_batch))
        .layer(middleware::from_fn_with_state(eureka.clone(), authenticate))
        .with_state(eureka.clone());
    // The status page for people, behind the same authentication as `GET /apps`.
    let page = Router::new()
        .route("/", get(status_page))
        .layer(middleware::from_fn_with_state(eureka.clone(), authenticate))
        .with_state(eureka);
    Router::new()
        .nest("/eureka/v2", api.clone())
        .nest("/eureka", api)
        .merge(page)
}

/// `GET /`: the status page ([`dashboard`]); `?app=NAME` for one app's instances. Taken
/// and written on a blocking thread, off the workers that serve heartbeats, by at most
/// [`WHOLE_READERS`](super::WHOLE_READERS) readers of the registry at once.
async fn status_page(AxState(eureka): Eureka, Query(params): Params) -> Response {
    let only = params.get("app").cloned();
    // The permit goes with the work: a client that leaves does not free it early.
    let thread = eureka.whole_reader().await;
    let reader = eureka.clone();
    let page = move || {
        let _thread = thread;
        dashboard::render(&reader.status_view(only.as_deref()))
    };
    match tokio::task::spawn_blocking(page).await {
        Ok(page) => odmesh_base::html::response(page),
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(_) => StatusCode::SERVICE_UNAVAILABLE.into_response(),
    }
}

type Eureka = AxState<EurekaRegistry>;

/// The HTTP status that answers a refusal.
fn status_of(refusal: Refusal) -> StatusCode {
    match refusal {
        Refusal::Invalid => StatusCode::BAD_REQUEST,
        Refusal::Forbidden => StatusCode::FORBIDDEN,
        Refusal::NotFound => StatusCode::NOT_FOUND,
        Refusal::Full => StatusCode::SERVICE_UNAVAILABLE,
        Refusal::Older => StatusCode::CONFLICT,
    }
}

/// The answer to a peer's write: an entry of a batch's `responseList`, or the answer to a
/// single replicated call.
fn reply(applied: Result<Applied, InvalidRequest>) -> Reply {
    let (status, response_entity) = match applied {
        Ok(Applied::Done) => (StatusCode::OK, None),
        Ok(Applied::Registered) => (StatusCode::NO_CONTENT, None),
        Ok(Applied::OursOlder) => (StatusCode::NOT_FOUND, None),
        Ok(Applied::OursNewer(info)) => (StatusCode::CONFLICT, Some(*info)),
        Err(e) => (status_of(e.refusal), None),
    };
    Reply {
        status_code: status.as_u16(),
        response_entity,
    }
}

/// `status`, with `reason` as the body.
fn text_answer(status: StatusCode, reason: &str) -> Response {
    (status, format!("{reason}\n")).into_response()
}

impl IntoResponse for InvalidRequest {
    fn into_response(self) -> Response {
        text_answer(status_of(self.refusal), &self.reason)
    }
}

/// Eureka's rule: JSON when `Accept` mentions `json`, XML otherwise.
fn wants_json(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .any(|v| v.to_str().is_ok_and(|v| v.contains("json")))
}

fn json_response(body: &impl serde::Serialize) -> Response {
    match serde_json::to_vec(body) {
        Ok(body) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

fn xml_response(body: String) -> Response {
    ([(header::CONTENT_TYPE, "application/xml")], body).into_response()
}

/// Whether the client takes a gzip answer: `Accept-Encoding` lists `gzip` (or `*`) without
/// `q=0`. Eureka's Java clients ask for it; its server compresses `/apps` and `/apps/delta`.
fn accepts_gzip(headers: &HeaderMap) -> bool {
    let values = headers.get_all(header::ACCEPT_ENCODING).iter();
    values
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|coding| {
            let mut parts = coding.split(';').map(str::trim);
            let name = parts.next().unwrap_or_default();
            let refused = parts.any(|p| {
                p.strip_prefix("q=")
                    .and_then(|q| q.parse::<f32>().ok())
                    .is_some_and(|q| q == 0.0)
            });
            (name.eq_ignore_ascii_case("gzip") || name == "*") && !refused
        })
}

/// A registry answer (`/apps`, `/apps/delta`): `body` in `content_type`, already compressed
/// when `gzip`. Caches between must keep the two encodings apart (`Vary`).
fn registry_answer(content_type: &'static str, gzip: bool, body: axum::body::Bytes) -> Response {
    let mut answer = ([(header::CONTENT_TYPE, content_type)], body).into_response();
    let headers = answer.headers_mut();
    let vary = HeaderValue::from_static("Accept-Encoding");
    headers.insert(header::VARY, vary);
    if gzip {
        let encoding = HeaderValue::from_static("gzip");
        headers.insert(header::CONTENT_ENCODING, encoding);
    }
    answer
}

fn content_type(json: bool) -> &'static str {
    if json {
        "application/json"
    } else {
        "application/xml"
    }
}

fn answer_applications(headers: &HeaderMap, applications: Applications) -> Response {
    let json = wants_json(headers);
    let body = if json {
        match serde_json::to_vec(&ApplicationsDocument { applications }) {
            Ok(body) => body,
            Err(e) => return (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
        }
    } else {
        xml::applications(&applications).into_bytes()
    };
    let gzip = accepts_gzip(headers);
    let body = if gzip { crate::wire::gzip(&body) } else { body };
    registry_answer(content_type(json), gzip, body.into())
}

fn answer_instance(headers: &HeaderMap, instance: InstanceInfo) -> Response {
    if wants_json(headers) {
        json_response(&InstanceDocument { instance })
    } else {
        xml_response(xml::instance(&instance))
    }
}

/// With `refuse_reads_while_warming`, while the registry warms up, a client's `GET /apps`
/// and `/apps/delta` are answered 403 without a body, as Netflix's Eureka server answers
/// them then: a Java Eureka client keeps the registry it has rather than take a partial one
/// (the npm and PyPI clients fail to start instead). A peer filling itself (it names itself
/// in [`peers::NODE_HEADER`]) is answered, marked as warming up.
fn warming_up_for(eureka: &EurekaRegistry, headers: &HeaderMap) -> Option<Response> {
    let refused = eureka.shared.config.refuse_reads_while_warming
        && eureka.is_warming_up()
        && !headers.contains_key(peers::NODE_HEADER);
    refused.then(|| name_node(eureka, StatusCode::FORBIDDEN.into_response()))
}

async fn get_apps(AxState(eureka): Eureka, headers: HeaderMap) -> Response {
    if let Some(refused) = warming_up_for(&eureka, &headers) {
        return refused;
    }
    let (json, gzip) = (wants_json(&headers), accepts_gzip(&headers));
    let body = whole(&eureka, Document::Apps, json, gzip).await;
    let mut answer = registry_answer(content_type(json), gzip, body);
    if eureka.is_warming_up() {
        let warming = HeaderValue::from_static("true");
        answer
            .headers_mut()
            .insert(peers::WARMING_UP_HEADER, warming);
    }
    name_node(&eureka, answer)
}

/// Names this node in `answer`, for a peer list that holds it ([`peers::NODE_HEADER`]).
fn name_node(eureka: &EurekaRegistry, mut answer: Response) -> Response {
    if let Ok(node) = HeaderValue::from_str(&eureka.shared.node) {
        answer.headers_mut().insert(peers::NODE_HEADER, node);
    }
    answer
}

async fn get_delta(AxState(eureka): Eureka, headers: HeaderMap) -> Response {
    if let Some(refused) = warming_up_for(&eureka, &headers) {
        return refused;
    }
    let (json, gzip) = (wants_json(&headers), accepts_gzip(&headers));
    let body = whole(&eureka, Document::Delta, json, gzip).await;
    registry_answer(content_type(json), gzip, body)
}

/// The written answer of `document`, shared by every reader (see `answers`): taken here if
/// it is up to date, else written, or waited for, on a blocking thread, off the workers that
/// serve heartbeats and xDS, by at most [`WHOLE_READERS`](super::WHOLE_READERS) readers at once.
async fn whole(
    eureka: &EurekaRegistry,
    document: Document,
    json: bool,
    gzip: bool,
) -> axum::body::Bytes {
    if let Some(body) = eureka.fresh_answer(document, json, gzip) {
        return body;
    }
    // The permit goes with the work: a client that leaves does not free it early.
    let thread = eureka.whole_reader().await;
    let reader = eureka.clone();
    let answer = move || {
        let _thread = thread;
        reader.answer(document, json, gzip)
    };
    match tokio::task::spawn_blocking(answer).await {
        Ok(body) => body,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        // The runtime is shutting down: nobody will read the answer.
        Err(_) => axum::body::Bytes::new(),
    }
}

async fn get_app(AxState(eureka): Eureka, Path(app): Path<String>, headers: HeaderMap) -> Response {
    let name = app.trim().to_ascii_uppercase();
    match eureka.application(&name) {
        Some(application) if wants_json(&headers) => {
            json_response(&ApplicationDocument { application })
        }
        Some(application) => xml_response(xml::application(&application)),
        None => text_answer(
            StatusCode::NOT_FOUND,
            &format!("app {name:?} is not registered"),
        ),
    }
}

async fn get_instance(
    AxState(eureka): Eureka,
    Path((app, id)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    let name = app.trim().to_ascii_uppercase();
    match eureka.instance(&name, &id) {
        Some(info) => answer_instance(&headers, info),
        None => InvalidRequest::not_found(&name, &id).into_response(),
    }
}

async fn get_instance_by_id(
    AxState(eureka): Eureka,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    match eureka.instance_by_id(&id) {
        Some(info) => answer_instance(&headers, info),
        None => text_answer(
            StatusCode::NOT_FOUND,
            &format!("instance {id:?} is not registered"),
        ),
    }
}

async fn get_vip(AxState(eureka): Eureka, Path(vip): Path<String>, headers: HeaderMap) -> Response {
    by_vip(&eureka, &headers, &vip, false)
}

async fn get_svip(
    AxState(eureka): Eureka,
    Path(vip): Path<String>,
    headers: HeaderMap,
) -> Response {
    by_vip(&eureka, &headers, &vip, true)
}

fn by_vip(eureka: &EurekaRegistry, headers: &HeaderMap, vip: &str, secure: bool) -> Response {
    let vip = vip.trim().to_ascii_lowercase();
    let apps = eureka.serving(&vip, secure);
    if apps.application.is_empty() {
        return text_answer(
            StatusCode::NOT_FOUND,
            &format!("no instance serves {vip:?}"),
        );
    }
    answer_applications(headers, apps)
}

/// With a tokens file, every request must name its caller (401 otherwise); the caller is
/// handed to the handlers. Without one, everyone is [`Caller::Anyone`].
async fn authenticate(AxState(eureka): Eureka, mut request: Request, next: Next) -> Response {
    let source = (request.extensions().get::<Source>()).map(|s| s.0.ip());
    let caller = match &eureka.shared.config.auth {
        None => auth::ANYONE.clone(),
        Some(_) if let Some(left) = source.and_then(|ip| eureka.auth_throttled(ip)) => {
            inc(&eureka.shared.metrics.eureka_refused_throttled_total);
            odmesh_base::limited!(
                warn,
                source = ?source,
                "eureka: too many requests without valid credentials from one address; refused (429)"
            );
            // Whole seconds, rounded up.
            let wait = (left.as_secs() + u64::from(left.subsec_nanos() > 0)).max(1);
            let reason = format!(
                "too many requests without valid credentials from this address: try again in {wait} s"
            );
            let mut answer = text_answer(StatusCode::TOO_MANY_REQUESTS, &reason);
            answer
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(wait));
            return answer;
        }
        Some(auth) => match auth.authenticate(request.headers().get(header::AUTHORIZATION)) {
            Ok(caller) => caller,
            Err(e) => {
                if let Some(ip) = source {
                    eureka.auth_failed(ip);
                }
                inc(&eureka.shared.metrics.eureka_refused_unauthenticated_total);
                odmesh_base::limited!(
                    warn,
                    method = %request.method(),
                    path = %clip(request.uri().path()),
                    "eureka: request without valid credentials refused (401)"
                );
                let mut answer = text_answer(StatusCode::UNAUTHORIZED, &e.to_string());
                answer.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static("Bearer realm=\"odmesh\", Basic realm=\"odmesh\""),
                );
                return answer;
            }
        },
    };
    request.extensions_mut().insert(caller);
    next.run(request).await
}

/// Answers a refused write, counting it and logging it (clipped, rate-limited). A 404 (an
/// unknown instance: its client registers again) has no body, as Eureka's: its Jersey client
/// reads any body of a heartbeat's 404 as an instance, fails, and never registers again.
fn refuse(eureka: &EurekaRegistry, what: &str, app: &str, e: InvalidRequest) -> Response {
    let metrics = &eureka.shared.metrics;
    let counter = match e.refusal {
        Refusal::NotFound => return StatusCode::NOT_FOUND.into_response(),
        Refusal::Forbidden => Some(&metrics.eureka_refused_forbidden_total),
        Refusal::Invalid => Some(&metrics.eureka_refused_invalid_total),
        // The registry-full and older-registration counts are taken where they are decided.
        Refusal::Full | Refusal::Older => None,
    };
    refused(what, app, status_of(e.refusal), counter, &e.reason)
}

/// Answers a body refused before it reached the registry: not JSON nor XML (415), too large
/// (413), too slow (408), broken off (400).
fn refuse_body(
    eureka: &EurekaRegistry,
    what: &str,
    app: &str,
    status: StatusCode,
    reason: &str,
) -> Response {
    let metrics = &eureka.shared.metrics;
    let counter = match status {
        StatusCode::BAD_REQUEST => &metrics.eureka_refused_invalid_total,
        _ => &metrics.eureka_refused_body_total,
    };
    refused(what, app, status, Some(counter), reason)
}

/// Counts (with `counter`) and logs a refused write, and answers it `status` with `reason`.
fn refused(
    what: &str,
    app: &str,
    status: StatusCode,
    counter: Option<&std::sync::atomic::AtomicU64>,
    reason: &str,
) -> Response {
    if let Some(counter) = counter {
        inc(counter);
    }
    odmesh_base::limited!(
        warn,
        app = %clip(app),
        status = status.as_u16(),
        error = %logs::clip_at(reason, 300),
        "eureka: {what} refused"
    );
    text_answer(status, reason)
}

/// Whether a body's `Content-Type` says JSON (`application/json`, or any `+json` type).
fn is_json(headers: &HeaderMap) -> bool {
    media_type(headers).is_some_and(|mime| mime == "application/json" || mime.ends_with("+json"))
}

/// Whether a body's `Content-Type` is `application/xml`, which Eureka's server also takes.
fn is_xml(headers: &HeaderMap) -> bool {
    media_type(headers).is_some_and(|mime| mime == "application/xml")
}

/// A body's media type, lowercase, without parameters.
fn media_type(headers: &HeaderMap) -> Option<String> {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(|mime| mime.trim().to_ascii_lowercase())
}

async fn register(
    AxState(eureka): Eureka,
    Extension(caller): Extension<Arc<Caller>>,
    Path(app): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let config = &eureka.shared.config;
    // A form or text/plain POST (what a web page may send anywhere without asking) is not a
    // registration.
    if !is_json(&headers) && !is_xml(&headers) {
        let reason = "a registration is JSON or XML: send Content-Type: application/json and {\"instance\": {...}}, or application/xml and <instance>...</instance>";
        return refuse_body(
            &eureka,
            "registration",
            &app,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            reason,
        );
    }
    let body =
        match http_server::read_body(&headers, body, config.max_body, config.body_timeout).await {
            Ok(body) => body,
            Err(e) => {
                let reason = format!("registration: {}", Chain(&e));
                return refuse_body(&eureka, "registration", &app, e.status(), &reason);
            }
        };
    if from_peer(&headers) {
        let write = match peers::decode_instance(&app, &body) {
            Ok(write) => write,
            Err(e) => return refuse(&eureka, "registration", &app, e),
        };
        return apply_from_peer(&eureka, &caller, &headers, write);
    }
    match eureka.register_as(&caller, &app, &body) {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => refuse(&eureka, "registration", &app, e),
    }
}

type Params = Query<HashMap<String, String>>;

/// Whether a request is a peer's write (Eureka's replication header).
fn from_peer(headers: &HeaderMap) -> bool {
    headers
        .get(REPLICATION_HEADER)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true"))
}

/// Applies a peer's single write (a REST call with the replication header), if `caller`
/// may send one.
fn apply_from_peer(
    eureka: &EurekaRegistry,
    caller: &Caller,
    headers: &HeaderMap,
    write: Replicated,
) -> Response {
    if let Some(answer) = sent_by_this_node(eureka, headers) {
        return answer;
    }
    if let Err(e) = caller.may_replicate() {
        return refuse(
            eureka,
            "peer write",
            &write.app,
            InvalidRequest::forbidden(e),
        );
    }
    let answer = reply(eureka.apply_replicated(write));
    let status = StatusCode::from_u16(answer.status_code).unwrap_or(StatusCode::BAD_REQUEST);
    match answer.response_entity {
        Some(instance) => (status, json_response(&InstanceDocument { instance })).into_response(),
        None => status.into_response(),
    }
}

/// A 421 that names this node, when `headers` say this node sent the request: a peer list
/// that holds this node under another address; the sender then leaves that URL out.
fn sent_by_this_node(eureka: &EurekaRegistry, headers: &HeaderMap) -> Option<Response> {
    let sender = headers.get(peers::NODE_HEADER)?;
    if sender.as_bytes() != eureka.shared.node.as_bytes() {
        return None;
    }
    let answer = (
        StatusCode::MISDIRECTED_REQUEST,
        "this is the sending node itself\n",
    );
    Some(name_node(eureka, answer.into_response()))
}

/// `POST /peerreplication/batch`: a peer's writes, each answered in `responseList`.
async fn replication_batch(
    AxState(eureka): Eureka,
    Extension(caller): Extension<Arc<Caller>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    if let Some(answer) = sent_by_this_node(&eureka, &headers) {
        return answer;
    }
    if let Err(e) = caller.may_replicate() {
        return refuse(&eureka, "peer batch", "", InvalidRequest::forbidden(e));
    }
    let config = &eureka.shared.config;
    // A batch holds up to 250 whole instances.
    let limit = config.max_body.saturating_mul(256);
    let body = match http_server::read_body(&headers, body, limit, config.body_timeout).await {
        Ok(body) => body,
        Err(e) => {
            let reason = format!("peer batch: {}", Chain(&e));
            return refuse_body(&eureka, "peer batch", "", e.status(), &reason);
        }
    };
    let writes = match peers::decode(&body) {
        Ok(writes) => writes,
        Err(e) => return refuse(&eureka, "peer batch", "", e),
    };
    let replies: Vec<_> = (writes.into_iter())
        .map(|w| reply(eureka.apply_replicated(w)))
        .collect();
    name_node(
        &eureka,
        json_response(&Replies {
            response_list: replies,
        }),
    )
}

async fn renew(
    AxState(eureka): Eureka,
    Extension(caller): Extension<Arc<Caller>>,
    Path((app, id)): Path<(String, String)>,
    Query(params): Params,
    headers: HeaderMap,
) -> Response {
    let dirty = params
        .get("lastDirtyTimestamp")
        .and_then(|t| t.trim().parse().ok());
    if from_peer(&headers) {
        let mut write = Replicated::new(Action::Heartbeat, &app, &id);
        write.last_dirty_timestamp = dirty;
        return apply_from_peer(&eureka, &caller, &headers, write);
    }
    match eureka.renew(&caller, &app, &id, dirty) {
        Ok(()) => StatusCode::OK.into_response(),
        Err(e) => refuse(&eureka, "heartbeat", &app, e),
    }
}

async fn cancel(
    AxState(eureka): Eureka,
    Extension(caller): Extension<Arc<Caller>>,
    Path((app, id)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    if from_peer(&headers) {
        return apply_from_peer(&eureka, &caller, &headers, Replicated::cancel(&app, &id));
    }
    match eureka.cancel(&caller, &app, &id) {
        Ok(()) => StatusCode::OK.into_response(),
        Err(e) => refuse(&eureka, "cancel", &app, e),
    }
}

fn status_param(params: &HashMap<String, String>) -> Result<Option<Status>, InvalidRequest> {
    match params.get("value") {
        None => Ok(None),
        Some(v) => Status::parse(v).map(Some).ok_or_else(|| {
            InvalidRequest::invalid(format!(
                "value={} is not a status (UP, DOWN, STARTING, OUT_OF_SERVICE, UNKNOWN)",
                clip(v)
            ))
        }),
    }
}

async fn put_status(
    AxState(eureka): Eureka,
    Extension(caller): Extension<Arc<Caller>>,
    Path((app, id)): Path<(String, String)>,
    Query(params): Params,
    headers: HeaderMap,
) -> Response {
    if from_peer(&headers) {
        let mut write = Replicated::new(Action::StatusUpdate, &app, &id);
        match status_param(&params) {
            Ok(Some(status)) => write.status = Some(status),
            Ok(None) => {}
            Err(e) => return refuse(&eureka, "status change", &app, e),
        }
        return apply_from_peer(&eureka, &caller, &headers, write);
    }
    let result = status_param(&params).and_then(|status| match status {
        Some(status) => eureka.set_status_override(&caller, &app, &id, Some(status), None),
        None => Err(InvalidRequest::invalid("missing ?value=STATUS")),
    });
    match result {
        Ok(()) => StatusCode::OK.into_response(),
        Err(e) => refuse(&eureka, "status change", &app, e),
    }
}

async fn delete_status(
    AxState(eureka): Eureka,
    Extension(caller): Extension<Arc<Caller>>,
    Path((app, id)): Path<(String, String)>,
    Query(params): Params,
    headers: HeaderMap,
) -> Response {
    if from_peer(&headers) {
        let write = Replicated::new(Action::DeleteStatusOverride, &app, &id);
        return apply_from_peer(&eureka, &caller, &headers, write);
    }
    let result = status_param(&params)
        .map(|s| s.filter(|s| *s != Status::Unknown))
        .and_then(|reported| eureka.set_status_override(&caller, &app, &id, None, reported));
    match result {
        Ok(()) => StatusCode::OK.into_response(),
        Err(e) => refuse(&eureka, "status change", &app, e),
    }
}

async fn put_metadata(
    AxState(eureka): Eureka,
    Extension(caller): Extension<Arc<Caller>>,
    Path((app, id)): Path<(String, String)>,
    Query(params): Params,
) -> Response {
    match eureka.update_metadata(&caller, &app, &id, params) {
        Ok(()) => StatusCode::OK.into_response(),
        Err(e) => refuse(&eureka, "metadata update", &app, e),
    }
}
