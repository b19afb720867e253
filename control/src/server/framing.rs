//! The delta xDS streams' gRPC framing, done here rather than by tonic's codec so that a
//! connected proxy holds no buffer between its responses.
//!
//! tonic encodes a stream's responses into one buffer per stream, which grows to the largest
//! batch the stream has sent and keeps that size for the stream's life (64 KB after a proxy's
//! first answer of 30 clusters and their load assignments), and decodes its requests into an
//! 8 KB buffer per stream. At 10,000 proxies those were most of the control plane's memory
//! (docs/benchmarks.md, "Memory per connected proxy"). Here each response is encoded into a
//! buffer of its own exact size, handed to HTTP/2 and freed once written, and requests are
//! read by tonic's [`Streaming`] from a small first buffer (it grows for a large request, as
//! before). Only the delta methods are served here: [`DeltaFraming`] hands every other path
//! to the tonic service it wraps.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse,
};
use http_body::Frame;
use prost::Message;
use tokio::sync::mpsc;
use tonic::body::Body;
use tonic::codec::{BufferSettings, Streaming};
use tonic::codegen::http::{self, HeaderMap, HeaderValue};
use tonic::codegen::{BoxFuture, Service};
use tonic::server::NamedService;
use tonic::{Request, Status};
use tonic_prost::ProstDecoder;

use super::{MAX_REQUEST_BYTES, XdsServer};
use crate::session::Service as Kind;

/// The first size of a stream's request buffer. Envoy's requests are mostly ACKs and
/// on-demand asks of one name (a few hundred bytes); a larger one grows it.
const REQUEST_BUFFER: usize = 1024;

/// The delta method of each service, and the stream kind it opens.
const METHODS: [(&str, Kind); 3] = [
    (
        "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources",
        Kind::Ads,
    ),
    (
        "/envoy.service.cluster.v3.ClusterDiscoveryService/DeltaClusters",
        Kind::Cds,
    ),
    (
        "/envoy.service.endpoint.v3.EndpointDiscoveryService/DeltaEndpoints",
        Kind::Eds,
    ),
];

/// A tonic service whose delta method (if it has one) is served by [`XdsServer`] with this
/// module's framing.
#[derive(Clone)]
pub(super) struct DeltaFraming<S> {
    inner: S,
    server: XdsServer,
}

impl<S> DeltaFraming<S> {
    pub(super) fn new(inner: S, server: XdsServer) -> Self {
        DeltaFraming { inner, server }
    }
}

impl<S: NamedService> NamedService for DeltaFraming<S> {
    const NAME: &'static str = S::NAME;
}

impl<S> Service<http::Request<Body>> for DeltaFraming<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Infallible>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // As tonic's generated services: always ready; each call clones what it needs.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let path = request.uri().path();
        match METHODS.iter().find(|(method, _)| *method == path) {
            Some(&(_, kind)) => {
                let response = open(&self.server, kind, request);
                Box::pin(async move { Ok(response) })
            }
            None => {
                let mut inner = self.inner.clone();
                Box::pin(async move { inner.call(request).await })
            }
        }
    }
}

/// Opens a delta stream: its requests decoded by tonic, its responses framed by [`Responses`].
fn open(server: &XdsServer, kind: Kind, request: http::Request<Body>) -> http::Response<Body> {
    // No compression is offered (tonic would refuse it the same way).
    if let Some(encoding) = request.headers().get("grpc-encoding")
        && encoding != "identity"
    {
        let refused = Status::unimplemented(format!(
            "requests compressed with {encoding:?} are not supported; send them uncompressed"
        ));
        return refused.into_http();
    }
    let decoder = ProstDecoder::<DeltaDiscoveryRequest>::new(BufferSettings::new(
        REQUEST_BUFFER,
        REQUEST_BUFFER,
    ));
    let request =
        request.map(|body| Streaming::new_request(decoder, body, None, Some(MAX_REQUEST_BYTES)));
    let responses = server.open(kind, Request::from_http(request));
    let mut response = http::Response::new(Body::new(Responses {
        queue: responses,
        ended: false,
    }));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    response
}

/// A stream's responses as an HTTP/2 body: each message one gRPC frame, then `grpc-status: 0`
/// when the stream's task ends.
struct Responses {
    queue: mpsc::Receiver<Box<DeltaDiscoveryResponse>>,
    ended: bool,
}

impl http_body::Body for Responses {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.ended {
            return Poll::Ready(None);
        }
        let frame = match ready!(self.queue.poll_recv(cx)) {
            Some(message) => match frame(message.as_ref()) {
                Some(data) => Frame::data(data),
                None => {
                    self.ended = true;
                    let status = Status::internal("a response over 4 GiB cannot be framed");
                    Frame::trailers(trailers(&status))
                }
            },
            None => {
                self.ended = true;
                Frame::trailers(trailers(&Status::ok("")))
            }
        };
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.ended
    }
}

/// `message` as one gRPC message frame (uncompressed, its 4-byte big-endian length, the
/// message), in a buffer of exactly that size; `None` if it is too large for the length.
pub(crate) fn frame(message: &impl Message) -> Option<Bytes> {
    let len = message.encoded_len();
    let prefix = u32::try_from(len).ok()?.to_be_bytes();
    let mut buf = Vec::with_capacity(5 + len);
    buf.push(0);
    buf.extend_from_slice(&prefix);
    message.encode_raw(&mut buf);
    Some(Bytes::from(buf))
}

fn trailers(status: &Status) -> HeaderMap {
    let mut map = HeaderMap::new();
    if status.add_header(&mut map).is_err() {
        map.insert(Status::GRPC_STATUS, HeaderValue::from_static("13"));
    }
    map
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::google::protobuf::Any;

    #[test]
    fn a_frame_is_the_flag_the_length_and_the_message_in_a_buffer_of_its_size() {
        let message = DeltaDiscoveryResponse {
            type_url: "type.googleapis.com/envoy.config.cluster.v3.Cluster".into(),
            nonce: "7".into(),
            resources: vec![Default::default(); 3],
            ..Default::default()
        };
        let data = frame(&message).unwrap();
        assert_eq!(data[0], 0, "not compressed");
        let len = u32::from_be_bytes(data[1..5].try_into().unwrap()) as usize;
        assert_eq!(len, data.len() - 5);
        assert_eq!(DeltaDiscoveryResponse::decode(&data[5..]).unwrap(), message);
        let empty = frame(&Any::default()).unwrap();
        assert_eq!(&empty[..], &[0, 0, 0, 0, 0]);
    }

    #[test]
    fn trailers_carry_the_status() {
        assert_eq!(trailers(&Status::ok(""))["grpc-status"], "0");
        let t = trailers(&Status::internal("too large"));
        assert_eq!(t["grpc-status"], "13");
        assert_eq!(t["grpc-message"], "too%20large");
    }
}
