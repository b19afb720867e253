//! The demo gRPC service `odmesh.demo.Echo` (`demo/echo.proto`): a server that `make run`
//! registers and the end-to-end tests call through the mesh, and a client for it.
//!
//! Written by hand on tonic and prost, the way tonic's generated code is, so that building it
//! needs no `protoc`: the messages are `prost::Message` structs with the tags of the `.proto`,
//! and the server routes the four methods by path. Any gRPC client that has `echo.proto` can
//! call it (grpcurl, grpcio...).
#![forbid(unsafe_code)]

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tokio_stream::{Stream, StreamExt};
use tonic::body::Body;
use tonic::codegen::http;
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::server::{
    ClientStreamingService, NamedService, ServerStreamingService, StreamingService, UnaryService,
};
use tonic::transport::{Channel, Endpoint, Uri};
use tonic::{Code, Request, Response, Status, Streaming};
use tonic_prost::ProstCodec;

/// The service's full name, as in the request paths (`/odmesh.demo.Echo/Unary`).
pub const SERVICE: &str = "odmesh.demo.Echo";
/// The trailer of every failed call and of every server stream: the answering instance.
pub const SERVER_TRAILER: &str = "x-demo-server";
/// The trailer that ends a server stream: how many replies it sent.
pub const SENT_TRAILER: &str = "x-demo-sent";

/// `odmesh.demo.EchoRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct EchoRequest {
    #[prost(string, tag = "1")]
    pub message: String,
    /// Replies of a server stream.
    #[prost(uint32, tag = "2")]
    pub count: u32,
    /// Delay before a unary reply, or between the replies of a server stream.
    #[prost(uint32, tag = "3")]
    pub interval_ms: u32,
    /// Non-zero: the call ends with this gRPC status code.
    #[prost(int32, tag = "4")]
    pub fail_code: i32,
}

impl EchoRequest {
    /// A request carrying `message` and nothing else.
    pub fn new(message: &str) -> EchoRequest {
        EchoRequest {
            message: message.to_owned(),
            ..Default::default()
        }
    }
}

/// `odmesh.demo.EchoReply`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct EchoReply {
    #[prost(string, tag = "1")]
    pub message: String,
    /// The instance that answered.
    #[prost(string, tag = "2")]
    pub server: String,
    #[prost(uint32, tag = "3")]
    pub index: u32,
    /// How many requests the call carried.
    #[prost(uint32, tag = "4")]
    pub received: u32,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;
type ReplyStream = Pin<Box<dyn Stream<Item = Result<EchoReply, Status>> + Send + 'static>>;

/// The server side: the four methods, answering as instance `name`.
#[derive(Clone, Debug)]
pub struct EchoServer {
    name: Arc<str>,
}

impl EchoServer {
    /// A server that names itself `name` in every reply.
    pub fn new(name: &str) -> EchoServer {
        EchoServer { name: name.into() }
    }

    /// Serves gRPC on `listener` until `shutdown` completes.
    pub async fn serve(
        self,
        listener: tokio::net::TcpListener,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), tonic::transport::Error> {
        tonic::transport::Server::builder()
            .add_service(self)
            .serve_with_incoming_shutdown(TcpListenerStream::new(listener), shutdown)
            .await
    }

    fn reply(&self, message: String, index: u32, received: u32) -> EchoReply {
        EchoReply {
            message,
            server: self.name.to_string(),
            index,
            received,
        }
    }

    /// The status of a request that asks to fail, with the server's name as a trailer.
    fn failure(&self, request: &EchoRequest) -> Option<Status> {
        (request.fail_code != 0).then(|| {
            let message = format!("failed as asked: {}", request.message);
            let mut status = Status::new(Code::from(request.fail_code), message);
            self.trailer(status.metadata_mut(), SERVER_TRAILER, &self.name);
            status
        })
    }

    fn trailer(&self, map: &mut MetadataMap, key: &'static str, value: &str) {
        if let Ok(value) = MetadataValue::try_from(value) {
            map.insert(key, value);
        }
    }

    async fn unary(self, request: EchoRequest) -> Result<EchoReply, Status> {
        tokio::time::sleep(Duration::from_millis(request.interval_ms.into())).await;
        match self.failure(&request) {
            Some(status) => Err(status),
            None => Ok(self.reply(request.message, 0, 1)),
        }
    }

    fn server_stream(self, request: EchoRequest) -> ReplyStream {
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(async move {
            let interval = Duration::from_millis(request.interval_ms.into());
            for index in 0..request.count {
                if index > 0 {
                    tokio::time::sleep(interval).await;
                }
                let reply = self.reply(request.message.clone(), index, 1);
                if tx.send(Ok(reply)).await.is_err() {
                    return; // the caller went away
                }
            }
            // A status with code OK ends the stream normally; its metadata go out as trailers.
            let end = match self.failure(&request) {
                Some(status) => status,
                None => {
                    let mut end = Status::new(Code::Ok, "");
                    self.trailer(end.metadata_mut(), SERVER_TRAILER, &self.name);
                    self.trailer(end.metadata_mut(), SENT_TRAILER, &request.count.to_string());
                    end
                }
            };
            let _ = tx.send(Err(end)).await;
        });
        Box::pin(ReceiverStream::new(rx))
    }

    async fn client_stream(
        self,
        mut requests: Streaming<EchoRequest>,
    ) -> Result<EchoReply, Status> {
        let mut messages = Vec::new();
        while let Some(request) = requests.message().await? {
            if let Some(status) = self.failure(&request) {
                return Err(status);
            }
            messages.push(request.message);
        }
        let received = u32::try_from(messages.len()).unwrap_or(u32::MAX);
        Ok(self.reply(messages.join(" "), 0, received))
    }

    fn bidi(self, requests: Streaming<EchoRequest>) -> ReplyStream {
        let mut index = 0;
        let replies = requests.map(move |request| {
            let request = request?;
            match self.failure(&request) {
                Some(status) => Err(status),
                None => {
                    index += 1;
                    Ok(self.reply(request.message, index - 1, index))
                }
            }
        });
        Box::pin(replies)
    }
}

impl NamedService for EchoServer {
    const NAME: &'static str = SERVICE;
}

/// One method of [`EchoServer`], in the shape tonic's `Grpc` drives (what generated code
/// writes as four small structs).
struct Method(EchoServer);

impl UnaryService<EchoRequest> for Method {
    type Response = EchoReply;
    type Future = BoxFuture<Result<Response<EchoReply>, Status>>;
    fn call(&mut self, request: Request<EchoRequest>) -> Self::Future {
        let server = self.0.clone();
        Box::pin(async move { server.unary(request.into_inner()).await.map(Response::new) })
    }
}

impl ServerStreamingService<EchoRequest> for Method {
    type Response = EchoReply;
    type ResponseStream = ReplyStream;
    type Future = BoxFuture<Result<Response<ReplyStream>, Status>>;
    fn call(&mut self, request: Request<EchoRequest>) -> Self::Future {
        let stream = self.0.clone().server_stream(request.into_inner());
        Box::pin(async move { Ok(Response::new(stream)) })
    }
}

impl ClientStreamingService<EchoRequest> for Method {
    type Response = EchoReply;
    type Future = BoxFuture<Result<Response<EchoReply>, Status>>;
    fn call(&mut self, request: Request<Streaming<EchoRequest>>) -> Self::Future {
        let server = self.0.clone();
        Box::pin(
            async move { (server.client_stream(request.into_inner()).await).map(Response::new) },
        )
    }
}

impl StreamingService<EchoRequest> for Method {
    type Response = EchoReply;
    type ResponseStream = ReplyStream;
    type Future = BoxFuture<Result<Response<ReplyStream>, Status>>;
    fn call(&mut self, request: Request<Streaming<EchoRequest>>) -> Self::Future {
        let stream = self.0.clone().bidi(request.into_inner());
        Box::pin(async move { Ok(Response::new(stream)) })
    }
}

impl tonic::codegen::Service<http::Request<Body>> for EchoServer {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<http::Response<Body>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let method = Method(self.clone());
        let path = request.uri().path();
        let path = path.strip_prefix('/').and_then(|p| p.strip_prefix(SERVICE));
        let path = path.unwrap_or_default();
        let mut grpc = tonic::server::Grpc::new(ProstCodec::<EchoReply, EchoRequest>::default());
        match path {
            "/Unary" => Box::pin(async move { Ok(grpc.unary(method, request).await) }),
            "/ServerStream" => {
                Box::pin(async move { Ok(grpc.server_streaming(method, request).await) })
            }
            "/ClientStream" => {
                Box::pin(async move { Ok(grpc.client_streaming(method, request).await) })
            }
            "/Bidi" => Box::pin(async move { Ok(grpc.streaming(method, request).await) }),
            _ => Box::pin(async move {
                Ok(
                    Status::unimplemented(format!("no method {}", request.uri().path()))
                        .into_http(),
                )
            }),
        }
    }
}

/// The client side: calls `odmesh.demo.Echo` over one HTTP/2 connection.
#[derive(Clone, Debug)]
pub struct EchoClient {
    grpc: tonic::client::Grpc<Channel>,
}

impl EchoClient {
    /// Connects to `addr` (a local Envoy, say) and sends every call with `:authority`
    /// `authority` (the VIP, say), as a service calling through the mesh does.
    pub async fn connect(addr: SocketAddr, authority: &str) -> Result<EchoClient, ClientError> {
        let origin: Uri = format!("http://{authority}")
            .parse()
            .map_err(|e| ClientError(format!("{authority:?} is not an authority: {e}")))?;
        let channel = Endpoint::from_shared(format!("http://{addr}"))
            .map_err(|e| ClientError(e.to_string()))?
            .origin(origin)
            .connect_timeout(Duration::from_secs(5))
            .connect()
            .await
            .map_err(|e| ClientError(format!("cannot connect to {addr}: {e}")))?;
        Ok(EchoClient {
            grpc: tonic::client::Grpc::new(channel),
        })
    }

    async fn ready(&mut self) -> Result<(), Status> {
        self.grpc
            .ready()
            .await
            .map_err(|e| Status::unavailable(format!("channel not ready: {e}")))
    }

    fn path(method: &str) -> http::uri::PathAndQuery {
        http::uri::PathAndQuery::from_maybe_shared(format!("/{SERVICE}/{method}"))
            .expect("a valid path")
    }

    /// `Unary`.
    pub async fn unary(
        &mut self,
        request: Request<EchoRequest>,
    ) -> Result<Response<EchoReply>, Status> {
        self.ready().await?;
        let codec = ProstCodec::<EchoRequest, EchoReply>::default();
        self.grpc.unary(request, Self::path("Unary"), codec).await
    }

    /// `ServerStream`.
    pub async fn server_stream(
        &mut self,
        request: Request<EchoRequest>,
    ) -> Result<Response<Streaming<EchoReply>>, Status> {
        self.ready().await?;
        let codec = ProstCodec::<EchoRequest, EchoReply>::default();
        let path = Self::path("ServerStream");
        self.grpc.server_streaming(request, path, codec).await
    }

    /// `ClientStream`.
    pub async fn client_stream<S>(
        &mut self,
        requests: Request<S>,
    ) -> Result<Response<EchoReply>, Status>
    where
        S: Stream<Item = EchoRequest> + Send + 'static,
    {
        self.ready().await?;
        let codec = ProstCodec::<EchoRequest, EchoReply>::default();
        let path = Self::path("ClientStream");
        self.grpc.client_streaming(requests, path, codec).await
    }

    /// `Bidi`.
    pub async fn bidi<S>(
        &mut self,
        requests: Request<S>,
    ) -> Result<Response<Streaming<EchoReply>>, Status>
    where
        S: Stream<Item = EchoRequest> + Send + 'static,
    {
        self.ready().await?;
        let codec = ProstCodec::<EchoRequest, EchoReply>::default();
        self.grpc
            .streaming(requests, Self::path("Bidi"), codec)
            .await
    }
}

/// A client that could not connect.
#[derive(Debug)]
pub struct ClientError(String);

impl std::fmt::Display for ClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ClientError {}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server on a loopback port and a client that calls it directly (no mesh).
    async fn pair() -> (EchoClient, tokio::sync::oneshot::Sender<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let shutdown = async {
            let _ = stopped.await;
        };
        tokio::spawn(EchoServer::new("s1").serve(listener, shutdown));
        (EchoClient::connect(addr, "echo").await.unwrap(), stop)
    }

    #[tokio::test]
    async fn each_method_answers_as_echo_proto_says() {
        let (mut client, _stop) = pair().await;
        let reply = client
            .unary(Request::new(EchoRequest::new("hi")))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            (reply.message.as_str(), reply.server.as_str()),
            ("hi", "s1")
        );

        let request = EchoRequest {
            count: 3,
            ..EchoRequest::new("t")
        };
        let mut stream = client
            .server_stream(Request::new(request))
            .await
            .unwrap()
            .into_inner();
        let mut indexes = Vec::new();
        while let Some(reply) = stream.message().await.unwrap() {
            indexes.push(reply.index);
        }
        assert_eq!(indexes, [0, 1, 2]);
        let trailers = stream.trailers().await.unwrap().unwrap();
        assert_eq!(trailers.get(SENT_TRAILER).unwrap(), "3");

        let words = tokio_stream::iter(["a", "b"].map(EchoRequest::new));
        let reply = client
            .client_stream(Request::new(words))
            .await
            .unwrap()
            .into_inner();
        assert_eq!((reply.message.as_str(), reply.received), ("a b", 2));

        let words = tokio_stream::iter(["x", "y"].map(EchoRequest::new));
        let mut replies = client.bidi(Request::new(words)).await.unwrap().into_inner();
        let mut got = Vec::new();
        while let Some(reply) = replies.message().await.unwrap() {
            got.push((reply.message, reply.index));
        }
        assert_eq!(got, [("x".to_owned(), 0), ("y".to_owned(), 1)]);
    }

    #[tokio::test]
    async fn a_request_that_asks_to_fail_gets_that_status_and_the_server_trailer() {
        let (mut client, _stop) = pair().await;
        let request = EchoRequest {
            fail_code: Code::PermissionDenied as i32,
            ..EchoRequest::new("no")
        };
        let status = client.unary(Request::new(request)).await.unwrap_err();
        assert_eq!(status.code(), Code::PermissionDenied);
        assert_eq!(status.message(), "failed as asked: no");
        assert_eq!(status.metadata().get(SERVER_TRAILER).unwrap(), "s1");
    }
}
