//! The delta xDS streams' gRPC framing, done here rather than by tonic's codec so that a
//! connected proxy holds no buffer between its responses.
//!
//! tonic encodes a stream's responses into one buffer per stream, which grows to the largest
//! batch the stream has sent and keeps that size for the stream's life (64 KB after a proxy's
//! first answer of 30 clusters and their load assignments), and decodes its requests into an
//! 8 KB buffer per stream. At 10,000 proxies those were most of the control plane's memory
//! (docs/benchmarks.md, "Memory per connected proxy"). Here each response is encoded into a
//! buffer of its own exact size, handed to HTTP/2 and freed once written, and a request is
//! kept only until it is whole: the buffer is let go whenever it holds no part of a message.
//! Only the delta methods are served here: [`DeltaFraming`] hands every other path to the
//! tonic service it wraps.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes, BytesMut};
use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;
use http_body::{Body as _, Frame};
use prost::Message;
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tonic::body::Body;
use tonic::codegen::http::{self, HeaderMap, HeaderValue};
use tonic::codegen::{BoxFuture, Service};
use tonic::server::NamedService;
use tonic::{Request, Status};

use super::{MAX_REQUEST_BYTES, XdsServer};
use crate::session::Service as Kind;

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
    let (parts, body) = request.into_parts();
    // tonic finds the peer's address (plain or TLS) in the request's extensions.
    let peer = Request::from_http(http::Request::from_parts(parts, ()));
    let source = peer.remote_addr().map(|addr| addr.ip().to_canonical());
    let requests = Requests {
        body,
        buf: BytesMut::new(),
        ended: false,
    };
    let responses = server.open(kind, source, requests);
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

/// A stream's requests, read from its HTTP/2 body: each message decoded once whole.
struct Requests {
    body: Body,
    /// The part of a message that has arrived; empty (no allocation) between messages.
    buf: BytesMut,
    ended: bool,
}

impl Stream for Requests {
    type Item = Result<DeltaDiscoveryRequest, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            match next_message(&mut self.buf, MAX_REQUEST_BYTES) {
                Ok(Some(message)) => {
                    if self.buf.is_empty() {
                        self.buf = BytesMut::new();
                    }
                    let request = DeltaDiscoveryRequest::decode(message).map_err(|e| {
                        Status::invalid_argument(format!(
                            "a request is not a DeltaDiscoveryRequest: {e}"
                        ))
                    });
                    return Poll::Ready(Some(request));
                }
                Ok(None) if self.ended => return Poll::Ready(None),
                Ok(None) => {}
                Err(status) => {
                    self.ended = true;
                    self.buf = BytesMut::new();
                    return Poll::Ready(Some(Err(status)));
                }
            }
            match ready!(Pin::new(&mut self.body).poll_frame(cx)) {
                Some(Ok(frame)) => {
                    // Trailers end nothing here: the stream ends with the body.
                    if let Ok(data) = frame.into_data() {
                        self.buf.extend_from_slice(&data);
                    }
                }
                Some(Err(status)) => {
                    self.ended = true;
                    return Poll::Ready(Some(Err(status)));
                }
                None if self.buf.is_empty() => return Poll::Ready(None),
                None => {
                    self.ended = true;
                    self.buf = BytesMut::new();
                    let status = Status::invalid_argument("the stream ended inside a message");
                    return Poll::Ready(Some(Err(status)));
                }
            }
        }
    }
}

/// The next whole gRPC message at the front of `buf`, taken out of it; `None` until one has
/// arrived. Nothing is reserved for a message announced and not yet sent.
fn next_message(buf: &mut BytesMut, max: usize) -> Result<Option<Bytes>, Status> {
    let Some(&[flag, a, b, c, d]) = buf.get(..5) else {
        return Ok(None);
    };
    match flag {
        0 => {}
        1 => {
            return Err(Status::unimplemented(
                "compressed messages are not supported",
            ));
        }
        _ => {
            return Err(Status::invalid_argument(format!(
                "bad gRPC message flag {flag}"
            )));
        }
    }
    let len = u32::from_be_bytes([a, b, c, d]) as usize;
    if len > max {
        return Err(Status::out_of_range(format!(
            "a request of {len} bytes is over the limit of {max} bytes"
        )));
    }
    if buf.len() < 5 + len {
        return Ok(None);
    }
    buf.advance(5);
    Ok(Some(buf.split_to(len).freeze()))
}

/// A stream's responses as an HTTP/2 body: each message one gRPC frame, then `grpc-status: 0`
/// when the stream's task ends.
struct Responses {
    queue: mpsc::Receiver<super::Queued>,
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
            Some(Err(status)) => {
                self.ended = true;
                Frame::trailers(trailers(&status))
            }
            Some(Ok(message)) => match frame(message.as_ref()) {
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
    use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryResponse;
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
    fn a_message_is_taken_once_whole_and_the_rest_stays() {
        let one = DeltaDiscoveryRequest {
            type_url: "t".into(),
            resource_names_subscribe: vec!["a.vip".into()],
            ..Default::default()
        };
        let two = DeltaDiscoveryRequest {
            response_nonce: "9".into(),
            ..Default::default()
        };
        let wire = [frame(&one).unwrap(), frame(&two).unwrap()].concat();
        let mut buf = BytesMut::new();
        // Byte by byte: nothing until the first message is whole.
        let mut got = Vec::new();
        for byte in wire {
            buf.extend_from_slice(&[byte]);
            while let Some(message) = next_message(&mut buf, 1024).unwrap() {
                got.push(DeltaDiscoveryRequest::decode(message).unwrap());
            }
        }
        assert_eq!(got, [one, two]);
        assert!(buf.is_empty());
    }

    #[test]
    fn a_message_over_the_limit_compressed_or_with_a_bad_flag_is_refused() {
        let mut over = BytesMut::from(&[0, 0, 0, 4, 1][..]);
        assert_eq!(
            next_message(&mut over, 1024).unwrap_err().code(),
            tonic::Code::OutOfRange
        );
        let mut compressed = BytesMut::from(&[1, 0, 0, 0, 0][..]);
        assert_eq!(
            next_message(&mut compressed, 1024).unwrap_err().code(),
            tonic::Code::Unimplemented
        );
        let mut bad = BytesMut::from(&[7, 0, 0, 0, 0][..]);
        assert_eq!(
            next_message(&mut bad, 1024).unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
        // Announced but not sent: waits, and reserves nothing for it.
        let mut announced = BytesMut::from(&[0, 0, 0, 3, 0][..]);
        assert_eq!(next_message(&mut announced, 1024).unwrap(), None);
        assert!(announced.capacity() < 64);
    }

    #[test]
    fn trailers_carry_the_status() {
        assert_eq!(trailers(&Status::ok(""))["grpc-status"], "0");
        let t = trailers(&Status::internal("too large"));
        assert_eq!(t["grpc-status"], "13");
        assert_eq!(t["grpc-message"], "too%20large");
    }
}
