//! Accepting connections within a bound, for the xDS and HTTP servers: a connection over
//! the limit is closed as soon as it is accepted, so a flood of connections costs a file
//! descriptor for a moment, not a task and buffers for as long as the client likes; and one
//! that sends nothing at all is closed after a deadline, so silent connections cannot hold
//! every slot. [`tls_handshakes`] then does each accepted connection's TLS handshake on its
//! own task, within a time limit, with the certificate in force when it arrived.

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use futures::{Stream, StreamExt};
use std::future::Future;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio::time::{Sleep, sleep};
use tokio_rustls::server::TlsStream;

use crate::tls::ServerTls;

/// At most so many connections at once.
#[derive(Clone)]
pub struct ConnectionLimit {
    slots: Arc<Semaphore>,
    /// How long a connection may take to send its first bytes (`None`: for ever), and what
    /// is told when one did not.
    first_read_within: Option<(Duration, Silent)>,
    /// At most so many connections from one address (`None`: no such bound), and what is
    /// told of one refused over it.
    per_source: Option<(SourceLimit, Silent)>,
}

/// Called for each connection given up because it sent nothing in time (or, for
/// [`ConnectionLimit::per_source`], refused over its source's bound).
type Silent = Arc<dyn Fn() + Send + Sync>;

/// Connections at once per source address.
#[derive(Clone)]
pub(crate) struct SourceLimit {
    max: usize,
    open: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

/// One connection from `ip`, given back when dropped.
pub(crate) struct SourceSlot {
    ip: IpAddr,
    open: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

impl SourceLimit {
    pub(crate) fn new(max: usize) -> SourceLimit {
        SourceLimit {
            max,
            open: Arc::default(),
        }
    }

    /// A slot for one more connection from `ip`, if it has fewer than the bound open.
    pub(crate) fn try_acquire(&self, ip: IpAddr) -> Option<SourceSlot> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let n = open.entry(ip).or_insert(0);
        if *n >= self.max {
            return None;
        }
        *n += 1;
        Some(SourceSlot {
            ip,
            open: self.open.clone(),
        })
    }
}

impl Drop for SourceSlot {
    fn drop(&mut self) {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = open.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

impl ConnectionLimit {
    /// At most `max` connections at once.
    pub fn new(max: usize) -> ConnectionLimit {
        ConnectionLimit {
            slots: Arc::new(Semaphore::new(max.min(Semaphore::MAX_PERMITS))),
            first_read_within: None,
            per_source: None,
        }
    }

    /// Of the bound, at most `max` connections at once from one address, so that one client
    /// cannot take every slot; one over is closed on arrival, calling `refused`.
    pub fn per_source(
        self,
        max: usize,
        refused: impl Fn() + Send + Sync + 'static,
    ) -> ConnectionLimit {
        ConnectionLimit {
            per_source: Some((SourceLimit::new(max), Arc::new(refused))),
            ..self
        }
    }

    /// Closes a connection that has sent nothing `within` after it was accepted (its reads
    /// fail with `TimedOut`), calling `silent` for each.
    pub fn first_read_within(
        self,
        within: Duration,
        silent: impl Fn() + Send + Sync + 'static,
    ) -> ConnectionLimit {
        ConnectionLimit {
            first_read_within: Some((within, Arc::new(silent))),
            ..self
        }
    }

    /// A slot for one more connection, if there is one; the connection holds it until it
    /// is dropped.
    pub fn try_acquire(&self) -> Option<OwnedSemaphorePermit> {
        self.slots.clone().try_acquire_owned().ok()
    }

    /// `incoming` with every connection over the limit closed at once (`refused` is called
    /// for each); the others hold a slot while they live.
    pub fn incoming<S>(
        self,
        incoming: S,
        refused: impl Fn() + Send + 'static,
    ) -> impl Stream<Item = io::Result<Counted<TcpStream>>> + Send + 'static
    where
        S: Stream<Item = io::Result<TcpStream>> + Send + 'static,
    {
        incoming.filter_map(move |accepted| {
            let out = match accepted {
                Ok(io) => {
                    let source = match &self.per_source {
                        None => Ok(None),
                        Some((limit, refused)) => {
                            let ip = io.peer_addr().map(|addr| addr.ip().to_canonical());
                            match ip.ok().map(|ip| limit.try_acquire(ip)) {
                                Some(None) => Err(refused),
                                // An address not known (the peer already gone) holds no slot.
                                Some(slot) => Ok(slot),
                                None => Ok(None),
                            }
                        }
                    };
                    match (source, self.try_acquire()) {
                        (Err(refused_by_source), _) => {
                            refused_by_source();
                            None
                        }
                        (Ok(source), Some(permit)) => Some(Ok(Counted {
                            io,
                            _slot: permit,
                            _source: source,
                            first_read: (self.first_read_within.as_ref())
                                .map(|(d, silent)| (Box::pin(sleep(*d)), silent.clone())),
                        })),
                        (Ok(_), None) => {
                            refused();
                            None
                        }
                    }
                }
                Err(e) => Some(Err(e)),
            };
            std::future::ready(out)
        })
    }
}

/// A connection holding one slot of a [`ConnectionLimit`].
pub struct Counted<IO> {
    io: IO,
    _slot: OwnedSemaphorePermit,
    _source: Option<SourceSlot>,
    /// Until the first bytes arrive: when the connection is given up, and who is told.
    first_read: Option<(Pin<Box<Sleep>>, Silent)>,
}

impl<IO: std::fmt::Debug> std::fmt::Debug for Counted<IO> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Counted")
            .field("io", &self.io)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for ConnectionLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        (f.debug_struct("ConnectionLimit"))
            .field("available", &self.slots.available_permits())
            .field(
                "first_read_within",
                &self.first_read_within.as_ref().map(|(d, _)| d),
            )
            .finish()
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Counted<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let read = Pin::new(&mut self.io).poll_read(cx, buf);
        let Some((deadline, silent)) = self.first_read.as_mut() else {
            return read;
        };
        match read {
            Poll::Ready(Ok(())) if buf.filled().len() > before => {
                self.first_read = None;
                Poll::Ready(Ok(()))
            }
            Poll::Pending if deadline.as_mut().poll(cx).is_ready() => {
                silent();
                self.first_read = None;
                Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "nothing sent before the deadline",
                )))
            }
            other => other,
        }
    }
}

/// `impl AsyncWrite for $wrapper<IO>`, every call passed to its `io` field as it is: the
/// wrappers that bound a connection act on its reads only.
macro_rules! writes_pass_through {
    ($wrapper:ident) => {
        impl<IO: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for $wrapper<IO> {
            fn poll_write(
                mut self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                buf: &[u8],
            ) -> std::task::Poll<std::io::Result<usize>> {
                std::pin::Pin::new(&mut self.io).poll_write(cx, buf)
            }

            fn poll_flush(
                mut self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                std::pin::Pin::new(&mut self.io).poll_flush(cx)
            }

            fn poll_shutdown(
                mut self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                std::pin::Pin::new(&mut self.io).poll_shutdown(cx)
            }

            fn poll_write_vectored(
                mut self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                bufs: &[std::io::IoSlice<'_>],
            ) -> std::task::Poll<std::io::Result<usize>> {
                std::pin::Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
            }

            fn is_write_vectored(&self) -> bool {
                self.io.is_write_vectored()
            }
        }
    };
}
pub(crate) use writes_pass_through;

writes_pass_through!(Counted);

impl tonic::transport::server::Connected for Counted<TcpStream> {
    type ConnectInfo = <TcpStream as tonic::transport::server::Connected>::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

/// `incoming` with a TLS handshake done on each connection, with the configuration `tls`
/// has in force when the connection arrives (see [`ServerTls::reload`]): each handshake runs
/// on its own task, so a slow client holds up no other, and one that fails or takes longer
/// than `timeout` closes its connection (`failed` is told). Errors of `incoming` pass through.
pub fn tls_handshakes<S, IO, E>(
    incoming: S,
    tls: Arc<ServerTls>,
    timeout: Duration,
    failed: impl Fn() + Send + Sync + 'static,
) -> TlsHandshakes<S, IO>
where
    S: Stream<Item = Result<IO, E>>,
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    TlsHandshakes {
        incoming: Box::pin(incoming),
        tls,
        timeout,
        failed: Arc::new(failed),
        running: JoinSet::new(),
        ended: false,
    }
}

/// The connections of [`tls_handshakes`] whose handshake is done.
pub struct TlsHandshakes<S, IO> {
    incoming: Pin<Box<S>>,
    tls: Arc<ServerTls>,
    timeout: Duration,
    failed: Silent,
    /// The handshakes under way; aborted when this is dropped.
    running: JoinSet<Option<TlsStream<IO>>>,
    /// `incoming` has ended.
    ended: bool,
}

impl<S, IO> std::fmt::Debug for TlsHandshakes<S, IO> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsHandshakes")
            .field("tls", &self.tls)
            .field("running", &self.running.len())
            .finish_non_exhaustive()
    }
}

impl<S, IO, E> Stream for TlsHandshakes<S, IO>
where
    S: Stream<Item = Result<IO, E>>,
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Item = Result<TlsStream<IO>, E>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        while !this.ended {
            match this.incoming.as_mut().poll_next(cx) {
                Poll::Ready(Some(Ok(io))) => {
                    // The configuration in force now, for this connection's whole life.
                    let acceptor = this.tls.acceptor();
                    let (within, failed) = (this.timeout, this.failed.clone());
                    this.running.spawn(async move {
                        let why = match tokio::time::timeout(within, acceptor.accept(io)).await {
                            Ok(Ok(stream)) => return Some(stream),
                            Ok(Err(e)) => e.to_string(),
                            Err(_) => format!("no handshake within {within:?}"),
                        };
                        failed();
                        crate::limited!(debug, error = %why, "TLS handshake failed");
                        None
                    });
                }
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(None) => this.ended = true,
                Poll::Pending => break,
            }
        }
        loop {
            match this.running.poll_join_next(cx) {
                Poll::Ready(Some(Ok(Some(stream)))) => return Poll::Ready(Some(Ok(stream))),
                Poll::Ready(Some(Ok(None))) => continue,
                Poll::Ready(Some(Err(e))) if e.is_panic() => {
                    std::panic::resume_unwind(e.into_panic())
                }
                Poll::Ready(Some(Err(_))) => continue,
                // None under way: wait for `incoming`, unless it has ended.
                Poll::Ready(None) if this.ended => return Poll::Ready(None),
                Poll::Ready(None) | Poll::Pending => return Poll::Pending,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::connect_from;
    use crate::testing::testdata;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::AsyncReadExt;
    use tokio::net::TcpListener;
    use tokio_stream::wrappers::TcpListenerStream;

    #[tokio::test]
    async fn one_source_holds_at_most_its_bound_and_others_are_served_meanwhile() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let refused = Arc::new(AtomicUsize::new(0));
        let counter = refused.clone();
        let limit = ConnectionLimit::new(10).per_source(1, move || {
            counter.fetch_add(1, Ordering::Relaxed);
        });
        let mut incoming = Box::pin(limit.incoming(TcpListenerStream::new(listener), || {
            panic!("the bound over all connections is not reached")
        }));
        let wait = std::time::Duration::from_secs(5);
        let mut next = async || {
            let accepted = tokio::time::timeout(wait, incoming.next()).await;
            accepted.unwrap().unwrap().unwrap()
        };

        let _first = connect_from([127, 0, 0, 1], addr).await;
        let held = next().await;
        // A second from the same address is closed on arrival; one from another is served.
        let mut second = connect_from([127, 0, 0, 1], addr).await;
        let _other = connect_from([127, 0, 0, 2], addr).await;
        let served = next().await;
        assert_eq!(served.io.peer_addr().unwrap().ip().to_string(), "127.0.0.2");
        assert_eq!(refused.load(Ordering::Relaxed), 1);
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(wait, second.read(&mut byte)).await;
        assert!(matches!(read, Ok(Ok(0) | Err(_))), "closed: {read:?}");

        // The first address's connection ends: it may connect again.
        drop(held);
        let _again = connect_from([127, 0, 0, 1], addr).await;
        let again = next().await;
        assert_eq!(again.io.peer_addr().unwrap().ip().to_string(), "127.0.0.1");
        assert_eq!(refused.load(Ordering::Relaxed), 1);
    }

    #[tokio::test]
    async fn a_connection_over_the_limit_is_closed_and_counted_and_a_freed_slot_is_reused() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let refused = Arc::new(AtomicUsize::new(0));
        let counter = refused.clone();
        let mut incoming = Box::pin(ConnectionLimit::new(1).incoming(
            TcpListenerStream::new(listener),
            move || {
                counter.fetch_add(1, Ordering::Relaxed);
            },
        ));
        let wait = std::time::Duration::from_secs(5);

        let _first = TcpStream::connect(addr).await.unwrap();
        let held = tokio::time::timeout(wait, incoming.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();

        // The second is accepted and closed while the first holds the only slot.
        let mut second = TcpStream::connect(addr).await.unwrap();
        let pending = tokio::time::timeout(std::time::Duration::from_millis(300), incoming.next());
        assert!(
            pending.await.is_err(),
            "no connection over the limit is yielded"
        );
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(wait, second.read(&mut byte))
            .await
            .unwrap();
        assert!(matches!(read, Ok(0) | Err(_)), "closed: {read:?}");
        assert_eq!(refused.load(Ordering::Relaxed), 1);

        drop(held);
        let _third = TcpStream::connect(addr).await.unwrap();
        let third = tokio::time::timeout(wait, incoming.next()).await.unwrap();
        assert!(matches!(third, Some(Ok(_))), "a freed slot is used again");
        assert_eq!(refused.load(Ordering::Relaxed), 1);
    }

    #[tokio::test]
    async fn a_connection_that_sends_nothing_is_given_up_and_one_that_speaks_is_kept() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let within = std::time::Duration::from_millis(200);
        let given_up = Arc::new(AtomicUsize::new(0));
        let counter = given_up.clone();
        let limit = ConnectionLimit::new(2).first_read_within(within, move || {
            counter.fetch_add(1, Ordering::Relaxed);
        });
        let mut incoming = Box::pin(limit.incoming(TcpListenerStream::new(listener), || {}));
        let wait = std::time::Duration::from_secs(5);
        let _silent = TcpStream::connect(addr).await.unwrap();
        let mut silent = tokio::time::timeout(wait, incoming.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(wait, silent.read(&mut byte))
            .await
            .unwrap();
        assert_eq!(read.map_err(|e| e.kind()), Err(io::ErrorKind::TimedOut));
        assert_eq!(given_up.load(Ordering::Relaxed), 1);

        let mut talker = TcpStream::connect(addr).await.unwrap();
        let mut kept = tokio::time::timeout(wait, incoming.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        tokio::io::AsyncWriteExt::write_all(&mut talker, b"x")
            .await
            .unwrap();
        assert_eq!(kept.read(&mut byte).await.unwrap(), 1);
        // Past the deadline, a connection that spoke waits as long as it likes.
        let quiet = tokio::time::timeout(within * 3, kept.read(&mut byte)).await;
        assert!(quiet.is_err(), "still open and waiting: {quiet:?}");
        assert_eq!(given_up.load(Ordering::Relaxed), 1);
    }

    /// A TLS client handshake with `addr` trusting both test CAs: the server's certificate.
    async fn served_certificate(
        addr: std::net::SocketAddr,
    ) -> rustls::pki_types::CertificateDer<'static> {
        let mut roots = crate::tls::load_bundle(&testdata("tls/ca.pem")).unwrap();
        for ca in crate::tls::load_bundle(&testdata("tls/other-ca.pem"))
            .unwrap()
            .roots
        {
            roots.roots.push(ca);
        }
        let mut config = crate::tls::client_config(roots).unwrap();
        config.alpn_protocols = vec![b"h2".to_vec()];
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let tcp = TcpStream::connect(addr).await.unwrap();
        let wait = Duration::from_secs(5);
        let stream = tokio::time::timeout(wait, connector.connect(name, tcp))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(stream.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
        stream.get_ref().1.peer_certificates().unwrap()[0].clone()
    }

    #[tokio::test]
    async fn tls_handshakes_run_apart_within_their_time_each_with_the_certificate_in_force() {
        use rustls::pki_types::{CertificateDer, pem::PemObject};
        use tokio::io::AsyncWriteExt;
        let folder = crate::testing::TlsFolder::new("handshakes");
        let files = folder.files();
        let tls = Arc::new(crate::tls::ServerTls::load(files, crate::tls::ALPN_H2).unwrap());
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let failed = Arc::new(AtomicUsize::new(0));
        let counter = failed.clone();
        let within = Duration::from_millis(300);
        let incoming = ConnectionLimit::new(10).incoming(TcpListenerStream::new(listener), || {});
        let mut handshaken = Box::pin(tls_handshakes(incoming, tls.clone(), within, move || {
            counter.fetch_add(1, Ordering::Relaxed);
        }));
        // What the server yields: only connections whose handshake is done.
        let (done_tx, mut done) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Some(Ok(stream)) = handshaken.next().await {
                let _ = done_tx.send(stream);
            }
        });
        let wait = Duration::from_secs(5);
        let leaf = |name: &str| CertificateDer::from_pem_file(testdata(name)).unwrap();

        // One that never sends its hello, and one that sends garbage: neither holds up a
        // client that does its handshake.
        let _silent = TcpStream::connect(addr).await.unwrap();
        let mut garbage = TcpStream::connect(addr).await.unwrap();
        garbage.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        assert_eq!(served_certificate(addr).await, leaf("tls/server.pem"));
        let stream = tokio::time::timeout(wait, done.recv()).await.unwrap();
        assert!(stream.is_some());
        crate::testing::wait_until(wait, "the garbage and the silent one given up", || {
            failed.load(Ordering::Relaxed) == 2
        })
        .await;

        // Reloaded: the next connection gets the new certificate.
        folder.install("tls/other-server.pem", "cert.pem");
        folder.install("tls/other-server.key", "key.pem");
        tls.reload().unwrap();
        assert_eq!(served_certificate(addr).await, leaf("tls/other-server.pem"));
        assert!(
            tokio::time::timeout(wait, done.recv())
                .await
                .unwrap()
                .is_some()
        );
        assert_eq!(failed.load(Ordering::Relaxed), 2);
    }
}
