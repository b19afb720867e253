//! Serving HTTP/1.1 within bounds, for the embedded registry and the admin endpoint: a
//! connection limit, over all and per source address, a time limit on each request's headers (which is also the idle limit of
//! a kept-alive connection), optional TLS with a handshake time limit, and a graceful stop.
//!
//! Bodies are the handlers' business: [`read_body`] reads one within a size and a time
//! limit, and answers 413 or 408 in words.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, StatusCode, header};
use http_body_util::BodyExt;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::tls::ServerTls;

use crate::listen::{ConnectionLimit, SourceLimit};

/// The bounds of one HTTP server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HttpLimits {
    /// Connections served at once; one more is closed as soon as it is accepted.
    pub max_connections: usize,
    /// Connections served at once from one source address; one more from it is closed as
    /// soon as it is accepted, so that one client cannot take every slot.
    pub max_connections_per_source: usize,
    /// How long a client may take to send a request's headers, counted from when the server
    /// waits for them: on a kept-alive connection that includes the idle time before the
    /// next request, so this is also the idle timeout.
    pub header_timeout: Duration,
    /// How long a client may take to complete a TLS handshake.
    pub tls_handshake_timeout: Duration,
    /// How long an answer may wait for a client that does not read it (no byte written for
    /// that long): a reader that stalls is disconnected rather than holding the answer.
    pub write_timeout: Duration,
    /// The slowest a client may read an answer, in bytes per second, counted over the time
    /// the server waits on it: one that reads less than `write_timeout` of it in
    /// `write_timeout` of waiting is disconnected, so a reader that takes a byte now and then
    /// cannot keep its slot and the answer for ever.
    pub min_read_rate: u64,
}

impl Default for HttpLimits {
    /// 1,024 connections, 256 from one address, 10 s for headers (and idle), 10 s for a TLS
    /// handshake, 30 s for a stalled reader, which must read 1 KiB a second.
    fn default() -> HttpLimits {
        HttpLimits {
            max_connections: 1024,
            max_connections_per_source: 256,
            header_timeout: Duration::from_secs(10),
            tls_handshake_timeout: Duration::from_secs(10),
            write_timeout: Duration::from_secs(30),
            min_read_rate: 1024,
        }
    }
}

/// What a server reports for its metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HttpEvent {
    /// A connection over [`HttpLimits::max_connections`] was closed on arrival.
    ConnectionRefused,
    /// A connection over [`HttpLimits::max_connections_per_source`] was closed on arrival.
    SourceRefused,
    /// A connection was closed because its client did not send headers in time (or sat
    /// idle for longer than that), or did not read an answer in time.
    Timeout,
    /// A TLS handshake failed or took too long.
    TlsFailed,
}

/// How long a graceful stop waits for open requests before it drops their connections.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// Serves `router` on `listener` within `limits`, over TLS when `tls` is given (each new
/// connection's handshake with the configuration in force when it arrives: see
/// [`ServerTls::reload`]), until `shutdown` completes; then lets open requests finish (for at
/// most 5 s). Reports each [`HttpEvent`] to `on_event`.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: HttpLimits,
    tls: Option<Arc<ServerTls>>,
    on_event: impl Fn(HttpEvent) + Send + Sync + 'static,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let slots = ConnectionLimit::new(limits.max_connections);
    let per_source = SourceLimit::new(limits.max_connections_per_source);
    let graceful = GracefulShutdown::new();
    let on_event = Arc::new(on_event);
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .keep_alive(true);
    tokio::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                // Out of file descriptors, say: wait a moment rather than spin.
                Err(e) => {
                    tracing::warn!(error = %e, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let Some(source_slot) = per_source.try_acquire(peer.ip()) else {
            on_event(HttpEvent::SourceRefused);
            drop(tcp);
            continue;
        };
        let Some(slot) = slots.try_acquire() else {
            on_event(HttpEvent::ConnectionRefused);
            drop(tcp);
            continue;
        };
        let _ = tcp.set_nodelay(true);
        // Every request of the connection says where it came from.
        let service = router.clone().layer(axum::Extension(Source(peer)));
        let connection = Connection {
            service: TowerToHyperService::new(service),
            builder: builder.clone(),
            watcher: graceful.watcher(),
            limits,
        };
        let on_event = on_event.clone();
        let tls = tls.as_ref().map(|tls| tls.acceptor());
        tokio::spawn(async move {
            let _slots = (slot, source_slot);
            connection.serve(tcp, tls, &*on_event).await;
        });
    }
    drop(listener);
    if tokio::time::timeout(STOP_GRACE, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::debug!("open HTTP connections dropped after the grace period");
    }
    Ok(())
}

/// The address a request came from, in its extensions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Source(pub SocketAddr);

/// What serving one accepted connection takes.
struct Connection {
    service: TowerToHyperService<Router>,
    builder: hyper::server::conn::http1::Builder,
    watcher: hyper_util::server::graceful::Watcher,
    limits: HttpLimits,
}

impl Connection {
    /// Serves HTTP on `tcp` (after a TLS handshake with `tls`, if given) until the client
    /// closes it, a timeout ends it, or the graceful stop does.
    async fn serve(
        self,
        tcp: tokio::net::TcpStream,
        tls: Option<TlsAcceptor>,
        on_event: &(impl Fn(HttpEvent) + ?Sized),
    ) {
        let write_timeout = (self.limits.write_timeout, self.limits.min_read_rate);
        let result =
            match tls {
                None => {
                    let io = TokioIo::new(WriteDeadline::new(tcp, write_timeout));
                    let conn = self.builder.serve_connection(io, self.service);
                    self.watcher.watch(conn).await
                }
                Some(acceptor) => {
                    let handshake = acceptor.accept(tcp);
                    let stream =
                        match tokio::time::timeout(self.limits.tls_handshake_timeout, handshake)
                            .await
                        {
                            Ok(Ok(stream)) => stream,
                            Ok(Err(e)) => {
                                on_event(HttpEvent::TlsFailed);
                                tracing::debug!(error = %e, "TLS handshake failed");
                                return;
                            }
                            Err(_) => {
                                on_event(HttpEvent::TlsFailed);
                                tracing::debug!("TLS handshake timed out");
                                return;
                            }
                        };
                    let io = TokioIo::new(WriteDeadline::new(stream, write_timeout));
                    let conn = self.builder.serve_connection(io, self.service);
                    self.watcher.watch(conn).await
                }
            };
        if let Err(e) = result {
            let stalled = std::error::Error::source(&e)
                .and_then(|s| s.downcast_ref::<std::io::Error>())
                .is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut);
            if e.is_timeout() || stalled {
                on_event(HttpEvent::Timeout);
            }
            tracing::debug!(error = %e, "HTTP connection ended with an error");
        }
    }
}

/// A connection whose writes fail (`TimedOut`) when its peer reads too slowly: less than
/// `min_read` bytes in `timeout` of writes waiting on it (nothing at all, or a byte now and
/// then). hyper waits for a slow reader forever otherwise. Only the time a write waits for
/// the peer counts, so a kept-alive connection's idle time never does.
struct WriteDeadline<IO> {
    io: IO,
    timeout: Duration,
    min_read: u64,
    /// The writes' waiting time in the current window, and the bytes the peer took in it. A
    /// window ends when the peer has taken `min_read`.
    waited: Duration,
    taken: u64,
    /// While a write waits: since when, and when the window's time runs out.
    waiting: Option<(tokio::time::Instant, std::pin::Pin<Box<tokio::time::Sleep>>)>,
}

impl<IO> WriteDeadline<IO> {
    /// `io` whose peer must read `min_rate` bytes a second, over `timeout` of waiting.
    fn new(io: IO, (timeout, min_rate): (Duration, u64)) -> WriteDeadline<IO> {
        WriteDeadline {
            io,
            timeout,
            min_read: (min_rate as f64 * timeout.as_secs_f64()) as u64,
            waited: Duration::ZERO,
            taken: 0,
            waiting: None,
        }
    }

    /// What to make of a write that returned `poll` (of `written(ready)` bytes): waiting
    /// counts against the window, the bytes taken toward it, and a window whose time ran out
    /// before the peer took enough is an error.
    fn judge<T>(
        &mut self,
        cx: &mut std::task::Context<'_>,
        poll: std::task::Poll<std::io::Result<T>>,
        written: impl Fn(&T) -> usize,
    ) -> std::task::Poll<std::io::Result<T>> {
        use std::future::Future;
        use std::task::Poll;
        if let Poll::Ready(result) = poll {
            if let Some((since, _)) = self.waiting.take() {
                self.waited += since.elapsed();
            }
            if let Ok(done) = &result {
                self.taken += written(done) as u64;
            }
            if self.taken >= self.min_read.max(1) {
                (self.waited, self.taken) = (Duration::ZERO, 0);
            } else if self.waited >= self.timeout {
                return Poll::Ready(Err(self.too_slow()));
            }
            return Poll::Ready(result);
        }
        let left = self.timeout.saturating_sub(self.waited);
        let (_, sleep) = self.waiting.get_or_insert_with(|| {
            let now = tokio::time::Instant::now();
            (now, Box::pin(tokio::time::sleep_until(now + left)))
        });
        match sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(self.too_slow())),
            Poll::Pending => Poll::Pending,
        }
    }

    fn too_slow(&self) -> std::io::Error {
        std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!(
                "the client read {} bytes in {:?} (at least {} expected)",
                self.taken, self.timeout, self.min_read
            ),
        )
    }
}

impl<IO: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for WriteDeadline<IO> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<IO: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for WriteDeadline<IO> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let poll = std::pin::Pin::new(&mut self.io).poll_write(cx, buf);
        self.judge(cx, poll, |n| *n)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let poll = std::pin::Pin::new(&mut self.io).poll_flush(cx);
        self.judge(cx, poll, |()| 0)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// Why a request body was not read.
#[derive(Debug, thiserror::Error)]
pub enum InvalidBody {
    /// Larger than allowed: answer 413.
    #[error("the body is larger than the limit of {max} bytes")]
    TooLarge { max: usize },
    /// Not all there in time: answer 408.
    #[error("the body did not arrive within {after:?}")]
    TooSlow { after: Duration },
    /// The connection failed while reading it.
    #[error("reading the body failed")]
    Broken {
        #[source]
        source: axum::Error,
    },
}

impl InvalidBody {
    /// The HTTP status that answers it.
    pub fn status(&self) -> StatusCode {
        match self {
            InvalidBody::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            InvalidBody::TooSlow { .. } => StatusCode::REQUEST_TIMEOUT,
            InvalidBody::Broken { .. } => StatusCode::BAD_REQUEST,
        }
    }
}

/// How much of a refused body is read and thrown away (and for how long), so the client,
/// still sending, reads the answer instead of a reset connection.
const DRAIN_BYTES: usize = 16 * 1024 * 1024;

/// Reads `body`, of at most `max` bytes, within `timeout`. A body announced larger
/// (`Content-Length`) is refused before a byte of it is read; one that turns out larger, or
/// too slow, is refused too. Either way, the rest of a refused body is read and discarded in
/// the background (up to 16 MiB, within `timeout`), so the client gets the answer.
pub async fn read_body(
    headers: &HeaderMap,
    body: Body,
    max: usize,
    timeout: Duration,
) -> Result<Bytes, InvalidBody> {
    let announced = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if announced.is_some_and(|n| n > max as u64) {
        drain(body, timeout);
        return Err(InvalidBody::TooLarge { max });
    }
    let mut stream = body.into_data_stream();
    let mut out: Vec<u8> = Vec::new();
    let read = tokio::time::timeout(timeout, async {
        use futures::StreamExt;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|source| InvalidBody::Broken { source })?;
            if out.len() + chunk.len() > max {
                return Err(InvalidBody::TooLarge { max });
            }
            out.extend_from_slice(&chunk);
        }
        Ok(())
    })
    .await;
    let refused = match read {
        Ok(Ok(())) => return Ok(Bytes::from(out)),
        Ok(Err(e)) => e,
        Err(_) => InvalidBody::TooSlow { after: timeout },
    };
    if !matches!(refused, InvalidBody::Broken { .. }) {
        drain(Body::from_stream(stream), timeout);
    }
    Err(refused)
}

/// Reads and discards what is left of a refused body, in the background, bounded in bytes
/// and time; each piece is dropped as soon as it is read, so a refused body costs no memory.
fn drain(body: Body, timeout: Duration) {
    tokio::spawn(async move {
        let mut body = body;
        let mut left = DRAIN_BYTES;
        let _ = tokio::time::timeout(timeout, async {
            while let Some(Ok(frame)) = body.frame().await {
                let n = frame.data_ref().map_or(0, |d| d.len());
                if n >= left {
                    break;
                }
                left -= n;
            }
        })
        .await;
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::testdata;
    use crate::testing::{connect_from, wait_until};
    use axum::routing::post;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    const WAIT: Duration = Duration::from_secs(10);

    /// A server whose one route echoes the body's length, read with a 1 KiB limit.
    async fn start(
        limits: HttpLimits,
    ) -> (
        std::net::SocketAddr,
        Arc<[AtomicUsize; 4]>,
        tokio::sync::oneshot::Sender<()>,
    ) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let router = Router::new().route(
            "/",
            post(|headers: HeaderMap, body: Body| async move {
                match read_body(&headers, body, 1024, Duration::from_secs(1)).await {
                    Ok(bytes) => (StatusCode::OK, format!("{}", bytes.len())),
                    Err(e) => (e.status(), crate::error::Chain(&e).to_string()),
                }
            }),
        );
        let events = Arc::new([const { AtomicUsize::new(0) }; 4]);
        let counts = events.clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(serve(
            listener,
            router,
            limits,
            None,
            move |event| {
                let i = match event {
                    HttpEvent::ConnectionRefused => 0,
                    HttpEvent::Timeout => 1,
                    HttpEvent::TlsFailed => 2,
                    HttpEvent::SourceRefused => 3,
                };
                counts[i].fetch_add(1, Ordering::Relaxed);
            },
            async move {
                let _ = stopped.await;
            },
        ));
        (addr, events, stop)
    }

    /// Sends `raw`, then reads until the server closes or `WAIT` passes.
    async fn exchange(addr: std::net::SocketAddr, raw: &[u8]) -> String {
        let mut conn = TcpStream::connect(addr).await.unwrap();
        conn.write_all(raw).await.unwrap();
        let mut out = Vec::new();
        let _ = tokio::time::timeout(WAIT, conn.read_to_end(&mut out)).await;
        String::from_utf8_lossy(&out).into_owned()
    }

    /// Whether the server answers a request on `conn` (it was not closed on arrival).
    async fn answers(conn: &mut TcpStream) -> bool {
        let raw = b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\nhi";
        if conn.write_all(raw).await.is_err() {
            return false;
        }
        let mut buf = [0u8; 64];
        match tokio::time::timeout(WAIT, conn.read(&mut buf)).await {
            Ok(Ok(n)) => buf[..n].starts_with(b"HTTP/1.1 200"),
            _ => false,
        }
    }

    #[tokio::test]
    async fn one_source_holds_at_most_its_share_of_connections_and_others_are_served() {
        let limits = HttpLimits {
            max_connections_per_source: 2,
            ..HttpLimits::default()
        };
        let (addr, events, _stop) = start(limits).await;
        let mut first = connect_from([127, 0, 0, 1], addr).await;
        let mut second = connect_from([127, 0, 0, 1], addr).await;
        assert!(answers(&mut first).await && answers(&mut second).await);
        let mut third = connect_from([127, 0, 0, 1], addr).await;
        assert!(!answers(&mut third).await, "a third from the same address");
        assert_eq!(events[3].load(Ordering::Relaxed), 1);
        let mut elsewhere = connect_from([127, 0, 0, 2], addr).await;
        assert!(answers(&mut elsewhere).await, "another address is served");
        // One closes: its source may open another.
        drop(first);
        crate::testing::wait_ok(WAIT, "a slot given back", async || {
            let mut again = connect_from([127, 0, 0, 1], addr).await;
            answers(&mut again).await.then_some(()).ok_or("refused")
        })
        .await;
        assert_eq!(events[0].load(Ordering::Relaxed), 0);
    }

    #[tokio::test]
    async fn a_body_announced_too_large_gets_413_before_it_is_sent() {
        let (addr, _, _stop) = start(HttpLimits::default()).await;
        let answer = exchange(
            addr,
            b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 100000\r\nexpect: 100-continue\r\nconnection: close\r\n\r\n",
        )
        .await;
        assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
        assert!(
            answer.contains("larger than the limit of 1024 bytes"),
            "{answer}"
        );
    }

    #[tokio::test]
    async fn a_client_that_sends_a_huge_body_anyway_reads_the_413_not_a_reset() {
        let (addr, _, _stop) = start(HttpLimits::default()).await;
        let mut conn = TcpStream::connect(addr).await.unwrap();
        let body = vec![b'x'; 10 * 1024 * 1024];
        let head = format!(
            "POST / HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        );
        let (mut rd, mut wr) = conn.split();
        let send = async {
            wr.write_all(head.as_bytes()).await?;
            wr.write_all(&body).await
        };
        let mut out = Vec::new();
        let receive = tokio::time::timeout(WAIT, rd.read_to_end(&mut out));
        let (sent, received) = tokio::join!(send, receive);
        let answer = String::from_utf8_lossy(&out);
        assert!(sent.is_ok(), "the whole body could be sent: {sent:?}");
        assert!(matches!(received, Ok(Ok(_))), "{received:?}");
        assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    }

    #[tokio::test]
    async fn a_body_without_length_that_grows_too_large_gets_413() {
        let (addr, _, _stop) = start(HttpLimits::default()).await;
        let chunk = format!("{:x}\r\n{}\r\n", 2000, "y".repeat(2000));
        let raw = format!(
            "POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n{chunk}0\r\n\r\n"
        );
        let answer = exchange(addr, raw.as_bytes()).await;
        assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    }

    #[tokio::test]
    async fn a_body_that_stalls_gets_408() {
        let (addr, _, _stop) = start(HttpLimits::default()).await;
        let answer = exchange(
            addr,
            b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 10\r\nconnection: close\r\n\r\nabc",
        )
        .await;
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    }

    #[tokio::test]
    async fn a_small_body_is_read() {
        let (addr, _, _stop) = start(HttpLimits::default()).await;
        let answer = exchange(
            addr,
            b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\nconnection: close\r\n\r\nhello",
        )
        .await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(answer.ends_with("\r\n\r\n5"), "{answer}");
    }

    #[tokio::test]
    async fn a_client_that_never_finishes_its_headers_is_cut_off_and_counted() {
        let limits = HttpLimits {
            header_timeout: Duration::from_millis(300),
            ..HttpLimits::default()
        };
        let (addr, events, _stop) = start(limits).await;
        let started = std::time::Instant::now();
        let answer = exchange(addr, b"POST / HTTP/1.1\r\nhost: x\r\n").await;
        assert!(
            started.elapsed() < WAIT,
            "closed by the server, not the test"
        );
        assert!(!answer.contains("200"), "{answer}");
        wait_until(WAIT, "a header timeout counted", || {
            events[1].load(Ordering::Relaxed) > 0
        })
        .await;
    }

    #[tokio::test]
    async fn a_client_that_does_not_read_its_answer_is_disconnected_and_counted() {
        let limits = HttpLimits {
            write_timeout: Duration::from_millis(300),
            ..HttpLimits::default()
        };
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        // A 64 MiB answer: far more than the socket buffers take.
        let big = Bytes::from(vec![b'x'; 64 * 1024 * 1024]);
        let router = Router::new().route(
            "/",
            axum::routing::get(move || {
                let big = big.clone();
                async move { big }
            }),
        );
        let events = Arc::new(AtomicUsize::new(0));
        let counted = events.clone();
        tokio::spawn(serve(
            listener,
            router,
            limits,
            None,
            move |event| {
                if event == HttpEvent::Timeout {
                    counted.fetch_add(1, Ordering::Relaxed);
                }
            },
            std::future::pending(),
        ));
        let mut conn = TcpStream::connect(addr).await.unwrap();
        conn.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        // Never read: the server gives up on it.
        wait_until(WAIT, "the stalled reader cut off and counted", || {
            events.load(Ordering::Relaxed) > 0
        })
        .await;
    }

    /// A peer that takes `chunk` bytes every `every`, and keeps writes waiting in between.
    struct Reader {
        chunk: usize,
        every: Duration,
        next: std::pin::Pin<Box<tokio::time::Sleep>>,
    }

    impl Reader {
        fn new(chunk: usize, every: Duration) -> Reader {
            let next = Box::pin(tokio::time::sleep(every));
            Reader { chunk, every, next }
        }
    }

    impl tokio::io::AsyncWrite for Reader {
        fn poll_write(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
            buf: &[u8],
        ) -> std::task::Poll<std::io::Result<usize>> {
            use std::future::Future;
            std::task::ready!(self.next.as_mut().poll(cx));
            let at = tokio::time::Instant::now() + self.every;
            self.next.as_mut().reset(at);
            std::task::Poll::Ready(Ok(buf.len().min(self.chunk)))
        }

        fn poll_flush(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }

        fn poll_shutdown(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_reader_that_takes_a_little_now_and_then_is_cut_off_and_one_that_keeps_pace_is_not() {
        // 200 ms of waiting on the reader may pass with less than 40 KiB read.
        let limits = (Duration::from_millis(200), 200 * 1024);
        let answer = vec![b'x'; 4 * 1024 * 1024];
        // 1 KiB every 20 ms: something well within every 200 ms, but 10 KiB in 200 ms.
        let mut slow = WriteDeadline::new(Reader::new(1024, Duration::from_millis(20)), limits);
        let started = tokio::time::Instant::now();
        let cut = slow.write_all(&answer).await.unwrap_err();
        assert_eq!(cut.kind(), std::io::ErrorKind::TimedOut, "{cut}");
        assert!(
            started.elapsed() <= Duration::from_millis(260),
            "{:?}",
            started.elapsed()
        );
        // 64 KiB every 20 ms: the whole answer.
        let mut fast =
            WriteDeadline::new(Reader::new(64 * 1024, Duration::from_millis(20)), limits);
        fast.write_all(&answer).await.unwrap();
        fast.flush().await.unwrap();
    }

    #[tokio::test]
    async fn connections_over_the_limit_are_closed_and_counted() {
        let limits = HttpLimits {
            max_connections: 1,
            ..HttpLimits::default()
        };
        let (addr, events, _stop) = start(limits).await;
        // The first connection is served (so it holds the only slot), and kept alive.
        let mut held = TcpStream::connect(addr).await.unwrap();
        held.write_all(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n")
            .await
            .unwrap();
        let mut first = [0u8; 12];
        tokio::time::timeout(WAIT, held.read_exact(&mut first))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&first, b"HTTP/1.1 200");
        let answer = exchange(
            addr,
            b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
        )
        .await;
        assert!(answer.is_empty(), "{answer}");
        assert_eq!(events[0].load(Ordering::Relaxed), 1);
    }

    /// A TLS connection to `addr` trusting both test CAs, and the certificate it was served.
    async fn connect_tls(
        addr: std::net::SocketAddr,
    ) -> (
        tokio_rustls::client::TlsStream<TcpStream>,
        rustls::pki_types::CertificateDer<'static>,
    ) {
        let mut roots = crate::tls::load_bundle(&testdata("tls/ca.pem")).unwrap();
        for ca in crate::tls::load_bundle(&testdata("tls/other-ca.pem"))
            .unwrap()
            .roots
        {
            roots.roots.push(ca);
        }
        let config = crate::tls::client_config(roots).unwrap();
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let tcp = TcpStream::connect(addr).await.unwrap();
        let stream = tokio::time::timeout(WAIT, connector.connect(name, tcp))
            .await
            .unwrap()
            .unwrap();
        let leaf = stream.get_ref().1.peer_certificates().unwrap()[0].clone();
        (stream, leaf)
    }

    /// Sends a kept-alive POST on `conn` and reads its answer's first line.
    async fn post_kept_alive<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
        conn: &mut S,
    ) -> String {
        conn.write_all(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\nhi")
            .await
            .unwrap();
        let mut buf = [0u8; 256];
        let n = tokio::time::timeout(WAIT, conn.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        let answer = String::from_utf8_lossy(&buf[..n]).into_owned();
        answer.lines().next().unwrap_or_default().to_owned()
    }

    #[tokio::test]
    async fn a_new_connection_gets_the_reloaded_certificate_and_an_open_one_keeps_going() {
        use rustls::pki_types::{CertificateDer, pem::PemObject};
        let folder = crate::testing::TlsFolder::new("https");
        let files = folder.files();
        let tls = Arc::new(crate::tls::ServerTls::load(files, crate::tls::ALPN_HTTP1).unwrap());
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let router = Router::new().route("/", post(|| async { "ok" }));
        tokio::spawn(serve(
            listener,
            router,
            HttpLimits::default(),
            Some(tls.clone()),
            |_| {},
            std::future::pending(),
        ));
        let leaf = |name: &str| CertificateDer::from_pem_file(testdata(name)).unwrap();

        let (mut open, served) = connect_tls(addr).await;
        assert_eq!(served, leaf("tls/server.pem"));
        assert_eq!(post_kept_alive(&mut open).await, "HTTP/1.1 200 OK");

        folder.install("tls/other-server.pem", "cert.pem");
        folder.install("tls/other-server.key", "key.pem");
        tls.reload().unwrap();
        let (mut new, served) = connect_tls(addr).await;
        assert_eq!(served, leaf("tls/other-server.pem"), "the new certificate");
        assert_eq!(post_kept_alive(&mut new).await, "HTTP/1.1 200 OK");
        // The connection made before the reload is still served, on its old session.
        assert_eq!(post_kept_alive(&mut open).await, "HTTP/1.1 200 OK");
    }

    #[test]
    fn a_broken_body_shows_its_cause_once() {
        use crate::error::{Chain, repeats_its_cause};
        let cause = axum::Error::new(std::io::Error::other("connection reset"));
        let e = InvalidBody::Broken { source: cause };
        assert!(!repeats_its_cause(&e), "{e}");
        // axum's error writes its own cause into its message; the chain shows it once.
        assert_eq!(
            Chain(&e).to_string(),
            "reading the body failed: connection reset"
        );
    }
}
