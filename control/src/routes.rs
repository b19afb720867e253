//! The route discovery service (RDS, state of the world): each proxy's mesh route, built for
//! its calling service's route-level policy (timeouts, hedging, faults: [`crate::xds::route`]),
//! sent when the proxy asks and again whenever a policy change, or a fault's end, changes it.
//!
//! A proxy asks for its route configuration by name (the bootstrap's `route_config_name`,
//! `odmesh`) on a stream of its own; the route depends on the proxy (its node metadata says how
//! it maps requests, its node `cluster` is its calling service) and on the policy, never on
//! the registry, so a registry change sends nothing here. Protocol (state of the world):
//! a response carries every name the proxy asked for; a request whose `response_nonce` is the
//! last response's acknowledges it (or, with `error_detail`, rejects it: the proxy keeps its
//! route, and is sent another only when it changes); a request with an older nonce is stale
//! and ignored. A proxy reconnecting with the version it holds (`version_info`) is sent
//! nothing if that is still its route.
//!
//! The same protocol serves the inbound listener's adaptive concurrency filter by extension
//! config discovery (ECDS, [`Served::Extensions`]): its configuration for the proxy's own
//! service ([`crate::xds::inbound`]).
//!
//! [`RouteStream`] is the protocol, pure; [`Routes`] the tonic services.

use std::sync::Arc;
use std::time::SystemTime;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse,
};
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use envoy_types::pb::envoy::service::extension::v3::extension_config_discovery_service_server::{
    ExtensionConfigDiscoveryService, ExtensionConfigDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::route::v3::route_discovery_service_server::{
    RouteDiscoveryService, RouteDiscoveryServiceServer,
};
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};
use tracing::debug;

use crate::cache::Cache;
use crate::metrics::Metrics;
use crate::policy::{Policy, RoutePolicy};
use crate::xds::inbound;
use crate::xds::route::{self, ROUTE_TYPE_URL, RouteShell};
use odmesh_base::logs::{self, clip};
use odmesh_base::metrics::inc;

/// At most so many route names per stream (a proxy asks for one), each at most
/// [`MAX_NAME`] bytes: a stream costs a few routes whatever a client asks.
pub const MAX_NAMES: usize = 4;
/// At most so many bytes of a route name, a node's `cluster` and a NACK's message are kept.
const MAX_NAME: usize = 256;
const MAX_NACK_MESSAGE: usize = 4096;

/// What a stream serves.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Served {
    /// The mesh route (RDS).
    #[default]
    Routes,
    /// The inbound limiter's configuration (ECDS).
    Extensions,
}

impl Served {
    fn type_url(self) -> &'static str {
        match self {
            Served::Routes => ROUTE_TYPE_URL,
            Served::Extensions => inbound::EXTENSION_TYPE_URL,
        }
    }
}

/// One route (or extension) stream's protocol state.
#[derive(Debug, Default)]
pub struct RouteStream {
    /// What the stream serves.
    served: Served,
    /// The proxy's mapping, from its first request's node (`Err`: its metadata is invalid,
    /// and it is answered nothing).
    shell: Option<Result<RouteShell, String>>,
    /// The proxy's calling service (`node.cluster`).
    caller: String,
    node_id: String,
    /// The names the proxy asked for last.
    names: Vec<String>,
    /// The last version the proxy was sent, or the one it said it holds when the stream
    /// began.
    holds: String,
    /// The nonce of the last response (0: none yet).
    nonce: u64,
    /// Whether the invalid node was reported (once per stream).
    reported: bool,
    /// The policy the route left out, as last reported (each change once per stream, whether
    /// or not the route itself changed).
    dropped: Option<String>,
}

/// What [`RouteStream`] tells its service besides responses.
#[derive(Debug, PartialEq, Eq)]
pub enum Event {
    /// The proxy rejected a response, with Envoy's message.
    Nack(String),
    /// The proxy's node metadata is invalid: nothing is sent.
    InvalidNode(String),
    /// The route sent could not carry some of the policy: why.
    Dropped(String),
}

impl RouteStream {
    /// A stream that serves `served`.
    pub fn new(served: Served) -> RouteStream {
        RouteStream {
            served,
            ..RouteStream::default()
        }
    }

    /// Applies one request; returns the response due, if any, and what to log and count.
    pub fn on_request(
        &mut self,
        req: &DiscoveryRequest,
        policy: &Policy,
        now: SystemTime,
    ) -> (Option<DiscoveryResponse>, Option<Event>) {
        if self.shell.is_none() {
            self.note_node(req.node.as_ref(), &req.version_info);
        }
        let mut event = None;
        if !req.response_nonce.is_empty() {
            if req.response_nonce != self.nonce.to_string() {
                // Stale: about an older response; the proxy's next request tells.
                return (None, None);
            }
            if let Some(error) = &req.error_detail {
                // The proxy keeps the route it had; this one is sent again only if it changes.
                event = Some(Event::Nack(logs::truncated(
                    &error.message,
                    MAX_NACK_MESSAGE,
                )));
            }
        }
        self.names = (req.resource_names.iter())
            .take(MAX_NAMES)
            .map(|name| logs::truncated(name, MAX_NAME))
            .collect();
        if let (Served::Routes, Some(Err(why))) = (self.served, &self.shell) {
            let first = !std::mem::replace(&mut self.reported, true);
            return (None, first.then(|| Event::InvalidNode(why.clone())));
        }
        let (response, dropped) = self.respond(policy, now);
        (response, event.or(dropped))
    }

    /// The policy changed, or a fault entry ended: the route, if it changed for this proxy.
    pub fn on_policy(
        &mut self,
        policy: &Policy,
        now: SystemTime,
    ) -> (Option<DiscoveryResponse>, Option<Event>) {
        match (self.served, &self.shell) {
            (Served::Extensions, Some(_)) | (Served::Routes, Some(Ok(_))) => {
                self.respond(policy, now)
            }
            _ => (None, None),
        }
    }

    /// The node, from the stream's first request.
    pub fn note_node(&mut self, node: Option<&Node>, version_info: &str) {
        self.shell = Some(RouteShell::from_node(node));
        self.caller = logs::truncated(node.map_or("", |n| n.cluster.as_str()), MAX_NAME);
        self.node_id = logs::truncated(node.map_or("", |n| n.id.as_str()), MAX_NAME);
        self.holds = logs::truncated(version_info, MAX_NAME);
    }

    /// The proxy's node id and calling service, for logs.
    pub fn who(&self) -> (&str, &str) {
        (&self.node_id, &self.caller)
    }

    /// The route now, if it is not the last one the proxy was sent (or, at the stream's
    /// start, the one it holds). After a NACK the proxy keeps its older route, and the one it
    /// rejected is not sent again until the policy changes it.
    fn respond(
        &mut self,
        policy: &Policy,
        now: SystemTime,
    ) -> (Option<DiscoveryResponse>, Option<Event>) {
        let (built, dropped) = match (self.served, &self.shell) {
            (Served::Routes, Some(Ok(shell))) => {
                let levels: RoutePolicy = policy.routes(&self.caller, now);
                let built: Vec<_> = (self.names.iter())
                    .map(|name| route::build(name, shell, &levels))
                    .collect();
                let dropped = built.iter().find_map(|b| b.dropped.clone());
                let built: Vec<_> = (built.into_iter()).map(|b| (b.route, b.version)).collect();
                (built, dropped)
            }
            (Served::Extensions, Some(_)) => {
                // The one extension odmesh serves; any other name is left unanswered, and the
                // proxy keeps its default configuration.
                let limiter = policy.inbound(&self.caller);
                let built = (self.names.iter())
                    .filter(|name| *name == inbound::LIMITER)
                    .map(|name| inbound::build(name, limiter))
                    .map(|b| (b.resource, b.version))
                    .collect();
                (built, None)
            }
            _ => return (None, None),
        };
        if built.is_empty() {
            return (None, None);
        }
        let event = (dropped != self.dropped)
            .then(|| dropped.clone())
            .flatten()
            .map(Event::Dropped);
        self.dropped = dropped;
        let version = (built.iter())
            .map(|(_, v)| v.as_str())
            .collect::<Vec<_>>()
            .join("-");
        if version == self.holds {
            return (None, event);
        }
        self.nonce += 1;
        self.holds = version.clone();
        let response = DiscoveryResponse {
            version_info: version,
            resources: built.into_iter().map(|(resource, _)| resource).collect(),
            type_url: self.served.type_url().to_owned(),
            nonce: self.nonce.to_string(),
            ..Default::default()
        };
        (Some(response), event)
    }
}

/// Sleeps `wait` (and just past it: the moment itself must have passed), or for ever.
async fn sleep_for(wait: Option<std::time::Duration>) {
    match wait {
        Some(wait) => tokio::time::sleep(wait + std::time::Duration::from_millis(1)).await,
        None => std::future::pending().await,
    }
}

/// The route discovery service.
#[derive(Clone, Debug)]
pub struct Routes {
    cache: Arc<Cache>,
    metrics: Arc<Metrics>,
    /// `true` on shutdown: every stream ends.
    closing: watch::Receiver<bool>,
}

impl Routes {
    /// A service answering from `cache`'s policy.
    pub fn new(cache: Arc<Cache>, metrics: Arc<Metrics>, closing: watch::Receiver<bool>) -> Routes {
        Routes {
            cache,
            metrics,
            closing,
        }
    }

    /// The gRPC service of routes.
    pub fn into_service(self) -> RouteDiscoveryServiceServer<Routes> {
        RouteDiscoveryServiceServer::new(self)
    }

    /// The gRPC service of extension configurations (the inbound limiter).
    pub fn into_extension_service(self) -> ExtensionConfigDiscoveryServiceServer<Routes> {
        ExtensionConfigDiscoveryServiceServer::new(self)
    }

    /// The counters of a stream serving `served`: responses, NACKs, streams open.
    fn counters(&self, served: Served) -> [&AtomicU64; 3] {
        let m = &self.metrics;
        match served {
            Served::Routes => [
                &m.rds_responses_total,
                &m.rds_nacks_total,
                &m.rds_streams_active,
            ],
            Served::Extensions => [
                &m.ecds_responses_total,
                &m.ecds_nacks_total,
                &m.ecds_streams_active,
            ],
        }
    }

    /// Starts a stream serving `served`.
    fn open(
        &self,
        served: Served,
        inbound: Streaming<DiscoveryRequest>,
    ) -> ReceiverStream<Result<DiscoveryResponse, Status>> {
        let (tx, rx) = mpsc::channel(4);
        let service = self.clone();
        inc(self.counters(served)[2]);
        tokio::spawn(async move {
            service.run(served, inbound, tx).await;
            service.counters(served)[2].fetch_sub(1, Ordering::Relaxed);
        });
        ReceiverStream::new(rx)
    }

    async fn run(
        &self,
        served: Served,
        mut inbound: Streaming<DiscoveryRequest>,
        tx: mpsc::Sender<Result<DiscoveryResponse, Status>>,
    ) {
        let mut closing = self.closing.clone();
        let mut policies = self.cache.policy_changes();
        let mut stream = RouteStream::new(served);
        loop {
            // A fault entry that ends changes the route then, with no policy change.
            let expiry = (self.cache.policy().next_expiry(SystemTime::now()))
                .and_then(|at| at.duration_since(SystemTime::now()).ok());
            let (response, event) = tokio::select! {
                msg = inbound.message() => match msg {
                    Ok(Some(req)) => {
                        stream.on_request(&req, &self.cache.policy(), SystemTime::now())
                    }
                    Ok(None) | Err(_) => break,
                },
                changed = policies.changed() => match changed {
                    Ok(()) => stream.on_policy(&self.cache.policy(), SystemTime::now()),
                    Err(_) => break,
                },
                () = sleep_for(expiry) => {
                    stream.on_policy(&self.cache.policy(), SystemTime::now())
                }
                _ = closing.changed() => break,
            };
            self.log(&stream, event);
            if let Some(response) = response {
                inc(self.counters(served)[0]);
                debug!(version = %response.version_info, ?served, "sending");
                if tx.send(Ok(response)).await.is_err() {
                    break;
                }
            }
        }
    }

    fn log(&self, stream: &RouteStream, event: Option<Event>) {
        let (node, caller) = stream.who();
        match event {
            None => {}
            Some(Event::Nack(message)) => {
                inc(self.counters(stream.served)[1]);
                odmesh_base::limited!(
                    warn,
                    node = %clip(node),
                    caller = %clip(caller),
                    served = ?stream.served,
                    error = %message,
                    "proxy rejected its configuration (NACK); it keeps the one it had"
                );
            }
            Some(Event::Dropped(why)) => {
                inc(&self.metrics.rds_policy_dropped_total);
                odmesh_base::limited!(
                    warn,
                    node = %clip(node),
                    caller = %clip(caller),
                    why = %why,
                    "this proxy's route leaves out part of its policy"
                );
            }
            Some(Event::InvalidNode(why)) => {
                inc(&self.metrics.rds_invalid_nodes_total);
                odmesh_base::limited!(
                    warn,
                    node = %clip(node),
                    error = %why,
                    "no route for this proxy: its bootstrap's node metadata is invalid"
                );
            }
        }
    }
}

#[tonic::async_trait]
impl RouteDiscoveryService for Routes {
    type StreamRoutesStream = ReceiverStream<Result<DiscoveryResponse, Status>>;

    async fn stream_routes(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamRoutesStream>, Status> {
        Ok(Response::new(
            self.open(Served::Routes, request.into_inner()),
        ))
    }

    type DeltaRoutesStream = ReceiverStream<Result<DeltaDiscoveryResponse, Status>>;

    async fn delta_routes(
        &self,
        _request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaRoutesStream>, Status> {
        Err(Status::unimplemented(
            "odmesh serves routes over the state-of-the-world stream (api_type: GRPC)",
        ))
    }

    async fn fetch_routes(
        &self,
        _request: Request<DiscoveryRequest>,
    ) -> Result<Response<DiscoveryResponse>, Status> {
        Err(Status::unimplemented(
            "odmesh serves routes over the state-of-the-world stream (api_type: GRPC)",
        ))
    }
}

#[tonic::async_trait]
impl ExtensionConfigDiscoveryService for Routes {
    type StreamExtensionConfigsStream = ReceiverStream<Result<DiscoveryResponse, Status>>;

    async fn stream_extension_configs(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamExtensionConfigsStream>, Status> {
        Ok(Response::new(
            self.open(Served::Extensions, request.into_inner()),
        ))
    }

    type DeltaExtensionConfigsStream = ReceiverStream<Result<DeltaDiscoveryResponse, Status>>;

    async fn delta_extension_configs(
        &self,
        _request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaExtensionConfigsStream>, Status> {
        Err(Status::unimplemented(
            "odmesh serves extension configurations over the state-of-the-world stream (api_type: GRPC)",
        ))
    }

    async fn fetch_extension_configs(
        &self,
        _request: Request<DiscoveryRequest>,
    ) -> Result<Response<DiscoveryResponse>, Status> {
        Err(Status::unimplemented(
            "odmesh serves extension configurations over the state-of-the-world stream (api_type: GRPC)",
        ))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use envoy_types::pb::google::protobuf::{Struct, Value, value};
    use envoy_types::pb::google::rpc::Status as RpcStatus;

    use super::*;

    /// "Now", for streams whose policy has no fault.
    const T0: SystemTime = SystemTime::UNIX_EPOCH;

    fn node(caller: &str, mapping: Option<&str>) -> Node {
        let metadata = mapping.map(|m| {
            let odmesh = Struct {
                fields: HashMap::from([(
                    "mapping".to_owned(),
                    Value {
                        kind: Some(value::Kind::StringValue(m.to_owned())),
                    },
                )]),
            };
            Struct {
                fields: HashMap::from([(
                    "odmesh".to_owned(),
                    Value {
                        kind: Some(value::Kind::StructValue(odmesh)),
                    },
                )]),
            }
        });
        Node {
            id: "proxy-1".to_owned(),
            cluster: caller.to_owned(),
            metadata,
            ..Default::default()
        }
    }

    fn request(node: Option<Node>, version: &str, nonce: &str) -> DiscoveryRequest {
        DiscoveryRequest {
            node,
            version_info: version.to_owned(),
            resource_names: vec!["odmesh".to_owned()],
            type_url: ROUTE_TYPE_URL.to_owned(),
            response_nonce: nonce.to_owned(),
            ..Default::default()
        }
    }

    fn policy(yaml: &str) -> Policy {
        Policy::parse(yaml.as_bytes()).unwrap()
    }

    #[test]
    fn a_proxy_gets_its_route_once_then_only_when_its_timeouts_change() {
        let mut stream = RouteStream::default();
        let p1 = policy("vips: {slow: {request_timeout: 500ms}}");
        let (first, event) = stream.on_request(&request(Some(node("web", None)), "", ""), &p1, T0);
        let first = first.expect("the first request is answered");
        assert_eq!(event, None);
        assert_eq!(first.nonce, "1");
        assert_eq!(first.resources.len(), 1);
        // The ACK: nothing more.
        let ack = request(None, &first.version_info, "1");
        assert_eq!(stream.on_request(&ack, &p1, T0), (None, None));
        // A policy change that changes nothing for this route: nothing; one that does: sent.
        let p2 =
            policy("vips: {slow: {request_timeout: 500ms, circuit_breakers: {max_requests: 5}}}");
        assert_eq!(stream.on_policy(&p2, T0).0, None);
        let p3 = policy("vips: {slow: {request_timeout: 600ms}}");
        let second = stream
            .on_policy(&p3, T0)
            .0
            .expect("a changed timeout is sent");
        assert_eq!(second.nonce, "2");
        assert_ne!(second.version_info, first.version_info);
    }

    #[test]
    fn a_reconnecting_proxy_that_holds_its_route_is_sent_nothing() {
        let p = policy("vips: {slow: {request_timeout: 500ms}}");
        let mut first = RouteStream::default();
        let sent = (first
            .on_request(&request(Some(node("web", None)), "", ""), &p, T0)
            .0)
            .unwrap();
        let mut again = RouteStream::default();
        let resumed = request(Some(node("web", None)), &sent.version_info, "");
        assert_eq!(again.on_request(&resumed, &p, T0), (None, None));
        // Another caller's route differs.
        let mut other = RouteStream::default();
        let theirs = request(Some(node("batch", None)), &sent.version_info, "");
        let p_batch = policy(
            "vips: {slow: {request_timeout: 500ms, callers: {batch: {request_timeout: 9s}}}}",
        );
        assert!(other.on_request(&theirs, &p_batch, T0).0.is_some());
    }

    #[test]
    fn a_nack_is_reported_and_the_rejected_route_is_not_sent_again_until_it_changes() {
        let p = policy("vips: {slow: {request_timeout: 500ms}}");
        let mut stream = RouteStream::default();
        stream.on_request(&request(Some(node("web", None)), "", ""), &p, T0);
        let mut nack = request(None, "", "1");
        nack.error_detail = Some(RpcStatus {
            message: "bad route".to_owned(),
            ..Default::default()
        });
        let (response, event) = stream.on_request(&nack, &p, T0);
        assert_eq!(
            (response, event),
            (None, Some(Event::Nack("bad route".to_owned())))
        );
        assert_eq!(stream.on_policy(&p, T0).0, None);
        let changed = policy("vips: {slow: {request_timeout: 700ms}}");
        assert_eq!(
            stream.on_policy(&changed, T0).0.map(|r| r.nonce),
            Some("2".to_owned())
        );
    }

    #[test]
    fn a_stale_nonce_is_ignored() {
        let p = policy("");
        let mut stream = RouteStream::default();
        stream.on_request(&request(Some(node("web", None)), "", ""), &p, T0);
        stream.on_policy(&policy("defaults: {request_timeout: 1s}"), T0);
        assert_eq!(
            stream.on_request(&request(None, "", "1"), &p, T0),
            (None, None)
        );
    }

    #[test]
    fn an_invalid_node_is_answered_nothing_and_said_once() {
        let p = policy("");
        let mut stream = RouteStream::default();
        let (response, event) =
            stream.on_request(&request(Some(node("web", Some("lua"))), "", ""), &p, T0);
        assert_eq!(response, None);
        assert!(matches!(event, Some(Event::InvalidNode(ref why)) if why.contains("lua")));
        assert_eq!(
            stream.on_request(&request(None, "", ""), &p, T0),
            (None, None)
        );
        assert_eq!(
            stream
                .on_policy(&policy("defaults: {request_timeout: 1s}"), T0)
                .0,
            None
        );
    }

    #[test]
    fn a_stream_keeps_a_few_names_whatever_it_asks() {
        let p = policy("");
        let mut stream = RouteStream::default();
        let mut req = request(Some(node("web", None)), "", "");
        req.resource_names = (0..1000).map(|i| format!("r{i}")).collect();
        let response = stream.on_request(&req, &p, T0).0.unwrap();
        assert_eq!(response.resources.len(), MAX_NAMES);
    }

    #[test]
    fn a_fault_that_ends_changes_the_route_with_no_policy_change() {
        let p = policy("vips: {pay: {fault: {abort: {status: 503}, until: 2026-12-05T10:00:00Z}}}");
        let end = p.next_expiry(T0).unwrap();
        let before = end - std::time::Duration::from_secs(1);
        let mut stream = RouteStream::default();
        let first = (stream
            .on_request(&request(Some(node("web", None)), "", ""), &p, before)
            .0)
            .unwrap();
        assert_eq!(stream.on_policy(&p, before).0, None);
        let after = stream
            .on_policy(&p, end)
            .0
            .expect("the route without the fault");
        assert_ne!(after.version_info, first.version_info);
        // The same as a proxy that never had the fault gets.
        let mut fresh = RouteStream::default();
        let plain = (fresh
            .on_request(&request(Some(node("web", None)), "", ""), &policy(""), T0)
            .0)
            .unwrap();
        assert_eq!(after.version_info, plain.version_info);
    }

    /// A node of the native module, with the mapping's configuration `config`.
    fn native(config: &str) -> Node {
        let mut n = node("web", Some("native"));
        let odmesh = n
            .metadata
            .as_mut()
            .unwrap()
            .fields
            .get_mut("odmesh")
            .unwrap();
        let Some(value::Kind::StructValue(fields)) = &mut odmesh.kind else {
            unreachable!()
        };
        for (k, v) in [("module", "/m.so"), ("filter_config", config)] {
            let v = Value {
                kind: Some(value::Kind::StringValue(v.to_owned())),
            };
            fields.fields.insert(k.to_owned(), v);
        }
        n
    }

    #[test]
    fn a_route_that_cannot_carry_its_policy_says_so() {
        let p = policy("vips: {pay: {fault: {delay: {fixed: 1s}}}}");
        let mut stream = RouteStream::default();
        let other = native(r#"{"source_header": "x-vip"}"#);
        let (response, event) = stream.on_request(&request(Some(other), "", ""), &p, T0);
        assert!(response.is_some());
        assert!(matches!(event, Some(Event::Dropped(ref why)) if why.contains("pay")));
        let mut fine = RouteStream::default();
        let (response, event) = fine.on_request(&request(Some(native("{}")), "", ""), &p, T0);
        assert!(response.is_some());
        assert_eq!(event, None);
    }

    #[test]
    fn policy_left_out_is_reported_once_per_change_though_the_route_stays() {
        // The native module reading another header than :authority cannot carry a limit, and
        // leaving it out gives the very route the proxy has.
        let mut stream = RouteStream::default();
        let other = || request(Some(native(r#"{"source_header": "x-vip"}"#)), "", "");
        let (first, event) = stream.on_request(&other(), &policy(""), T0);
        assert!(first.is_some());
        assert_eq!(event, None);
        let limited = policy("vips: {pay: {concurrency_limit: {}}}");
        let (again, event) = stream.on_request(&other(), &limited, T0);
        assert!(again.is_none(), "the same route: nothing to send");
        assert!(
            matches!(event, Some(Event::Dropped(ref why)) if why.contains("pay")),
            "{event:?}"
        );
        let (_, event) = stream.on_request(&other(), &limited, T0);
        assert_eq!(event, None, "said once");
        let (_, event) = stream.on_request(&other(), &policy(""), T0);
        assert_eq!(event, None, "nothing left out any more");
        let (_, event) = stream.on_request(&other(), &limited, T0);
        assert!(
            matches!(event, Some(Event::Dropped(_))),
            "left out again: said again"
        );
        // The wasm filter carries limits: nothing is left out.
        let mut wasm = RouteStream::default();
        let (route, event) = wasm.on_request(
            &request(Some(node("web", Some("wasm"))), "", ""),
            &limited,
            T0,
        );
        assert!(route.is_some());
        assert_eq!(event, None);
    }

    #[test]
    fn an_extension_stream_serves_the_services_inbound_limit_and_its_changes() {
        let mut stream = RouteStream::new(Served::Extensions);
        let mut req = request(Some(node("payments", Some("lua"))), "", "");
        req.resource_names = vec![inbound::LIMITER.to_owned(), "another.filter".to_owned()];
        req.type_url = inbound::EXTENSION_TYPE_URL.to_owned();
        let off = policy("");
        let (first, event) = stream.on_request(&req, &off, T0);
        let first = first.expect("answered, whatever the node metadata says of routes");
        assert_eq!(event, None);
        assert_eq!(first.type_url, inbound::EXTENSION_TYPE_URL);
        assert_eq!(first.resources.len(), 1, "only the limiter is odmesh's");
        assert_eq!(
            first.resources[0],
            inbound::build(inbound::LIMITER, None).resource
        );
        let ack = DiscoveryRequest {
            response_nonce: first.nonce.clone(),
            version_info: first.version_info.clone(),
            ..req.clone()
        };
        assert_eq!(stream.on_request(&ack, &off, T0), (None, None));
        // Another service's limit changes nothing here; this one's does.
        let other = policy("services: {ledger: {adaptive_concurrency: {}}}");
        assert_eq!(stream.on_policy(&other, T0).0, None);
        let on = policy("services: {payments: {adaptive_concurrency: {max_limit: 10}}}");
        let second = stream.on_policy(&on, T0).0.expect("the limit switched on");
        let limiter = on.inbound("payments");
        assert_eq!(
            second.resources[0],
            inbound::build(inbound::LIMITER, limiter).resource
        );
        // A stream that asks for nothing odmesh serves is answered nothing.
        let mut unknown = RouteStream::new(Served::Extensions);
        let mut req = request(Some(node("payments", None)), "", "");
        req.resource_names = vec!["another.filter".to_owned()];
        assert_eq!(unknown.on_request(&req, &on, T0), (None, None));
    }
}
