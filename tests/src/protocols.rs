//! Upstreams and clients for every protocol a service speaks through the mesh: HTTP/1.1 and
//! HTTP/2 (cleartext or TLS with ALPN), WebSocket, and gRPC (the demo service
//! `odmesh.demo.Echo`, from the `odmesh-demo` crate).
//!
//! Each upstream runs on its own small tokio runtime on a loopback port the OS picked, and
//! stops when dropped. An [`HttpUpstream`] answers every request with JSON that says which
//! protocol it arrived over, so a test can see what Envoy spoke upstream:
//!
//! ```json
//! {"upstream": "hello", "version": "HTTP/2.0", "alpn": "h2", "path": "/", "authority": "hello"}
//! ```
//!
//! `/slow?ms=N` answers after N milliseconds (with `&on=NAME`, only on the instance called
//! NAME, and after `&others=M` milliseconds on the others); an HTTP/1.1 `Upgrade: websocket` request is
//! accepted and every message is sent back.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use odmesh_demo::EchoServer;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Runtime;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role;
use tokio_tungstenite::{WebSocketStream, client_async};

use crate::tls::CertifiedKey;

/// A tokio runtime for a test's clients (2 worker threads).
pub fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("cannot start a tokio runtime: {e}"))
}

/// Runs `body` on a new runtime and fails the test if it takes longer than `bound`: every
/// call a test makes through the mesh is bounded, whatever the client library does.
pub fn block_on_within<T>(bound: Duration, body: impl Future<Output = T>) -> T {
    runtime().block_on(async {
        (tokio::time::timeout(bound, body).await)
            .unwrap_or_else(|_| panic!("the test's calls did not finish within {bound:?}"))
    })
}

/// A new runtime for upstream `name` and a listener on a loopback port the OS picked.
fn bind_loopback(name: &str) -> (Runtime, TcpListener, SocketAddr) {
    let runtime = runtime();
    let listener = runtime
        .block_on(TcpListener::bind((Ipv4Addr::LOCALHOST, 0)))
        .unwrap_or_else(|e| panic!("upstream {name}: cannot bind a loopback port: {e}"));
    let addr = listener
        .local_addr()
        .unwrap_or_else(|e| panic!("upstream {name}: no local address: {e}"));
    (runtime, listener, addr)
}

/// Which HTTP versions a cleartext [`HttpUpstream`] accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Versions {
    /// HTTP/1.1 and HTTP/2 with prior knowledge (told apart by the HTTP/2 preface).
    Both,
    /// HTTP/1.1 only, as most HTTP servers: HTTP/2 is a protocol error.
    Http1Only,
    /// HTTP/2 only, as a gRPC server: an HTTP/1.1 request is a protocol error.
    Http2Only,
}

/// How an [`HttpUpstream`] listens.
enum Listen {
    Cleartext(Versions),
    /// TLS offering these ALPN protocols, in order of preference.
    Tls(Arc<rustls::ServerConfig>),
    /// Reads a request's head, then closes the connection.
    Dying,
}

/// An HTTP server on its own runtime; stopped when dropped.
pub struct HttpUpstream {
    addr: SocketAddr,
    /// Dropping the runtime stops the server and every connection.
    _runtime: Runtime,
}

impl HttpUpstream {
    /// A cleartext server that calls itself `name` and accepts `versions`.
    pub fn start(name: &str, versions: Versions) -> HttpUpstream {
        HttpUpstream::spawn(name, Listen::Cleartext(versions))
    }

    /// A TLS server with `cert` that offers `alpn` (e.g. `["h2", "http/1.1"]`, or only
    /// `["http/1.1"]`) and speaks what the handshake settles (HTTP/1.1 without ALPN).
    pub fn start_tls(name: &str, cert: &CertifiedKey, alpn: &[&str]) -> HttpUpstream {
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&cert.cert)
            .and_then(|certs| certs.collect())
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", cert.cert.display()));
        let key = PrivateKeyDer::from_pem_file(&cert.key)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", cert.key.display()));
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .and_then(|b| b.with_no_client_auth().with_single_cert(chain, key))
            .unwrap_or_else(|e| panic!("TLS upstream {name}: {e}"));
        config.alpn_protocols = alpn.iter().map(|p| p.as_bytes().to_vec()).collect();
        HttpUpstream::spawn(name, Listen::Tls(Arc::new(config)))
    }

    /// An instance that dies with every request: it reads the request, then closes the
    /// connection without answering, as a process killed mid-request does.
    pub fn start_dying(name: &str) -> HttpUpstream {
        HttpUpstream::spawn(name, Listen::Dying)
    }

    fn spawn(name: &str, listen: Listen) -> HttpUpstream {
        let (runtime, listener, addr) = bind_loopback(name);
        let name: Arc<str> = Arc::from(name);
        let listen = Arc::new(listen);
        runtime.spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve_connection(name.clone(), listen.clone(), stream));
            }
        });
        HttpUpstream {
            addr,
            _runtime: runtime,
        }
    }

    /// The port it listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.addr.port()
    }
}

async fn serve_connection(name: Arc<str>, listen: Arc<Listen>, stream: TcpStream) {
    match &*listen {
        Listen::Cleartext(Versions::Both) => {
            let service = service(name, None);
            let builder = auto::Builder::new(TokioExecutor::new());
            let _ = (builder.serve_connection_with_upgrades(TokioIo::new(stream), service)).await;
        }
        Listen::Cleartext(Versions::Http1Only) => serve_http1(name, None, stream).await,
        Listen::Dying => {
            let mut stream = stream;
            let mut head = Vec::new();
            let mut buf = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                match tokio::io::AsyncReadExt::read(&mut stream, &mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => head.extend_from_slice(&buf[..n]),
                }
            }
            drop(stream);
        }
        Listen::Cleartext(Versions::Http2Only) => serve_http2(name, None, stream).await,
        Listen::Tls(config) => {
            let acceptor = tokio_rustls::TlsAcceptor::from(config.clone());
            let Ok(tls) = acceptor.accept(stream).await else {
                return;
            };
            let alpn = tls.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
            let alpn_text = String::from_utf8_lossy(alpn.as_deref().unwrap_or_default()).into();
            if alpn.as_deref() == Some(b"h2") {
                serve_http2(name, Some(alpn_text), tls).await;
            } else {
                serve_http1(name, Some(alpn_text), tls).await;
            }
        }
    }
}

/// Serves HTTP/1.1 only (with upgrades): an HTTP/2 preface is a protocol error.
async fn serve_http1<S>(name: Arc<str>, alpn: Option<String>, stream: S)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let builder = hyper::server::conn::http1::Builder::new();
    let connection = builder.serve_connection(TokioIo::new(stream), service(name, alpn));
    let _ = connection.with_upgrades().await;
}

/// Serves HTTP/2 only, as a gRPC server does: anything else is a protocol error.
async fn serve_http2<S>(name: Arc<str>, alpn: Option<String>, stream: S)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    let _ = (builder.serve_connection(TokioIo::new(stream), service(name, alpn))).await;
}

type Answer = Result<Response<Full<Bytes>>, Infallible>;

/// [`answer`] as a hyper service, for one connection.
fn service(
    name: Arc<str>,
    alpn: Option<String>,
) -> impl hyper::service::Service<
    Request<Incoming>,
    Response = Response<Full<Bytes>>,
    Error = Infallible,
    Future = impl Future<Output = Answer> + Send,
> + Clone {
    hyper::service::service_fn(move |req| answer(name.clone(), alpn.clone(), req))
}

/// One request: a WebSocket upgrade, or JSON describing what arrived (after `ms` for
/// `/slow?ms=N`). `alpn` is `None` on cleartext, `Some("")` on TLS without ALPN.
async fn answer(name: Arc<str>, alpn: Option<String>, req: Request<Incoming>) -> Answer {
    if is_websocket_upgrade(&req) {
        return Ok(accept_websocket(req));
    }
    if req.uri().path() == "/slow" {
        let query = req.uri().query().unwrap_or_default();
        let param = |key: &str| {
            (query.split('&')).find_map(|pair| pair.strip_prefix(key)?.strip_prefix('='))
        };
        let ms = |key| param(key).and_then(|ms| ms.parse().ok()).unwrap_or(0);
        // `on=NAME`: only the instance called NAME takes `ms`; the others take `others`.
        let wait = match param("on") {
            Some(on) if on != &*name => ms("others"),
            _ => ms("ms"),
        };
        tokio::time::sleep(Duration::from_millis(wait)).await;
    }
    let authority = (req.uri().authority().map(|a| a.to_string()))
        .or_else(|| header(&req, "host").map(str::to_owned));
    let body = json!({
        "upstream": &*name,
        "version": format!("{:?}", req.version()),
        "alpn": alpn,
        "path": req.uri().path(),
        "authority": authority,
    });
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    Ok(response)
}

fn header<'a>(req: &'a Request<Incoming>, name: &str) -> Option<&'a str> {
    req.headers().get(name).and_then(|v| v.to_str().ok())
}

fn is_websocket_upgrade(req: &Request<Incoming>) -> bool {
    header(req, "upgrade").is_some_and(|u| u.eq_ignore_ascii_case("websocket"))
}

/// Answers `101 Switching Protocols` and echoes every message on the upgraded connection.
fn accept_websocket(mut req: Request<Incoming>) -> Response<Full<Bytes>> {
    let Some(key) = header(&req, "sec-websocket-key").map(|k| derive_accept_key(k.as_bytes()))
    else {
        let mut bad = Response::new(Full::new(Bytes::from("no Sec-WebSocket-Key")));
        *bad.status_mut() = StatusCode::BAD_REQUEST;
        return bad;
    };
    let upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        let Ok(upgraded) = upgrade.await else { return };
        let mut ws =
            WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None).await;
        while let Some(Ok(message)) = ws.next().await {
            if message.is_close() {
                break;
            }
            if (message.is_text() || message.is_binary()) && ws.send(message).await.is_err() {
                break;
            }
        }
    });
    let mut response = Response::new(Full::new(Bytes::new()));
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let headers = response.headers_mut();
    headers.insert("upgrade", "websocket".parse().expect("a header value"));
    headers.insert("connection", "Upgrade".parse().expect("a header value"));
    headers.insert(
        "sec-websocket-accept",
        key.parse().expect("base64 is a header value"),
    );
    response
}

/// A gRPC server of `odmesh.demo.Echo` on its own runtime; stopped when dropped.
pub struct GrpcUpstream {
    addr: SocketAddr,
    _runtime: Runtime,
}

impl GrpcUpstream {
    /// Starts the demo service, naming itself `name` in every reply.
    pub fn start(name: &str) -> GrpcUpstream {
        let (runtime, listener, addr) = bind_loopback(name);
        let server = EchoServer::new(name);
        runtime.spawn(server.serve(listener, std::future::pending()));
        GrpcUpstream {
            addr,
            _runtime: runtime,
        }
    }

    /// The port it listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.addr.port()
    }
}

/// An HTTP/2 answer: status and body as JSON (`Value::Null` if the body is not JSON), with the
/// body's text for messages.
#[derive(Debug)]
pub struct H2Response {
    pub status: u16,
    pub text: String,
    pub json: Value,
}

/// Sends `GET path` with `:authority` `authority` to `addr` over HTTP/2 with prior
/// knowledge (h2c), as a service's HTTP/2 client does.
pub async fn h2c_get(addr: SocketAddr, authority: &str, path: &str) -> H2Response {
    let request = Request::get(format!("http://{authority}{path}"))
        .body(Full::default())
        .expect("a valid request");
    let (head, body, _) = h2c_send(addr, request).await;
    let text = String::from_utf8_lossy(&body).into_owned();
    let json = serde_json::from_str(&text).unwrap_or(Value::Null);
    H2Response {
        status: head.status.as_u16(),
        text,
        json,
    }
}

/// Makes one gRPC call by hand (HTTP/2 with prior knowledge, one length-prefixed message)
/// with `grpc-timeout: timeout` and no deadline of its own, and returns the response's
/// headers and trailers together (`grpc-status`, `grpc-message`...).
pub async fn grpc_call(
    addr: SocketAddr,
    authority: &str,
    path: &str,
    message: &impl prost::Message,
    timeout: &str,
) -> BTreeMap<String, String> {
    let encoded = message.encode_to_vec();
    let length = u32::try_from(encoded.len()).expect("a small message");
    let mut body = vec![0u8]; // not compressed
    body.extend_from_slice(&length.to_be_bytes());
    body.extend_from_slice(&encoded);
    let request = Request::post(format!("http://{authority}{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("grpc-timeout", timeout)
        .body(Full::new(Bytes::from(body)))
        .expect("a valid request");
    let (head, _, trailers) = h2c_send(addr, request).await;
    let mut fields = BTreeMap::new();
    for (name, value) in head.headers.iter().chain(trailers.iter().flatten()) {
        let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
        fields.insert(name.to_string(), value);
    }
    fields
}

/// Sends `request` to `addr` on a new HTTP/2 connection (prior knowledge) and reads the
/// whole response: head, body and trailers. Panics saying what failed.
async fn h2c_send(
    addr: SocketAddr,
    request: Request<Full<Bytes>>,
) -> (
    hyper::http::response::Parts,
    Bytes,
    Option<hyper::HeaderMap>,
) {
    let what = format!("{} {}", request.method(), request.uri());
    let stream = TcpStream::connect(addr)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {addr}: {e}"));
    let (mut sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap_or_else(|e| panic!("HTTP/2 handshake with {addr}: {e}"));
    tokio::spawn(connection);
    let response = (sender.send_request(request).await)
        .unwrap_or_else(|e| panic!("{what} through {addr}: {e}"));
    let (head, body) = response.into_parts();
    let collected = (body.collect().await)
        .unwrap_or_else(|e| panic!("{what} through {addr}: reading the body: {e}"));
    let trailers = collected.trailers().cloned();
    (head, collected.to_bytes(), trailers)
}

/// A WebSocket client connected through `addr` (Envoy) to `ws://{host}{path}`.
pub struct WebSocketClient {
    ws: WebSocketStream<TcpStream>,
}

impl WebSocketClient {
    /// Opens the connection and does the HTTP/1.1 upgrade with `Host: host`; the error says
    /// what the upgrade got instead of `101`.
    pub async fn connect(addr: SocketAddr, host: &str, path: &str) -> Result<Self, String> {
        let stream = TcpStream::connect(addr)
            .await
            .map_err(|e| format!("cannot connect to {addr}: {e}"))?;
        let url = format!("ws://{host}{path}");
        match client_async(url.as_str(), stream).await {
            Ok((ws, _response)) => Ok(WebSocketClient { ws }),
            Err(tokio_tungstenite::tungstenite::Error::Http(response)) => Err(format!(
                "upgrade refused: {} {}",
                response.status(),
                String::from_utf8_lossy(response.body().as_deref().unwrap_or_default())
            )),
            Err(e) => Err(format!("upgrade to {url} failed: {e}")),
        }
    }

    /// Sends `text` and waits (at most `timeout`) for the next text message.
    pub async fn echo(&mut self, text: &str, timeout: Duration) -> Result<String, String> {
        self.ws
            .send(Message::text(text))
            .await
            .map_err(|e| format!("send: {e}"))?;
        match tokio::time::timeout(timeout, self.ws.next()).await {
            Err(_) => Err(format!("no answer to {text:?} in {timeout:?}")),
            Ok(None) => Err("the connection closed".to_owned()),
            Ok(Some(Err(e))) => Err(format!("receive: {e}")),
            Ok(Some(Ok(message))) => message
                .into_text()
                .map(|t| t.as_str().to_owned())
                .map_err(|e| format!("not text: {e}")),
        }
    }

    /// Closes the connection (the close handshake, bounded by `timeout`).
    pub async fn close(mut self, timeout: Duration) {
        let _ = tokio::time::timeout(timeout, self.ws.close(None)).await;
    }
}
