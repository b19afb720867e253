//! A TCP forwarding proxy for partition tests: it listens on a free loopback port and
//! forwards each connection to a target; [`TcpProxy::block`] cuts the link (existing
//! connections are shut down, new ones closed as soon as they are accepted) until
//! [`TcpProxy::unblock`]. Put one between two processes that talk to each other's addresses
//! and the test decides when they can.

use std::collections::HashMap;
use std::io;
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;
use std::time::Duration;

use crate::lock;
use crate::serve::Acceptor;

/// How long the proxy waits to connect to its target before it closes the client's
/// connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// A running proxy; it stops accepting, and every connection through it is closed, when it
/// is dropped (its [`Acceptor`] closes the clients' ends, which ends each link).
pub struct TcpProxy {
    shared: Arc<Shared>,
    acceptor: Acceptor,
}

struct Shared {
    target: SocketAddr,
    /// Open links, and whether new ones may open: one lock, so that a connection accepted
    /// while [`TcpProxy::block`] runs is either shut down by it or sees the block.
    links: Mutex<Links>,
    /// Connections forwarded to the target.
    forwarded: AtomicU64,
    /// Connections closed on arrival, or cut, because the proxy was blocked.
    dropped: AtomicU64,
}

#[derive(Default)]
struct Links {
    blocked: bool,
    /// Both sockets of each open link (clones: shutting one down ends its pumps).
    open: HashMap<u64, (TcpStream, TcpStream)>,
    next_id: u64,
}

impl TcpProxy {
    /// Listens on a free loopback port and forwards every connection to `target` (which
    /// need not be listening yet: a connection that finds it down is closed).
    pub fn start(target: SocketAddr) -> TcpProxy {
        let shared = Arc::new(Shared {
            target,
            links: Mutex::default(),
            forwarded: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
        });
        let acceptor = {
            let shared = shared.clone();
            Acceptor::loopback("tcp proxy", move |client| link(client, &shared))
        };
        TcpProxy { shared, acceptor }
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.acceptor.addr()
    }

    /// The address it forwards to.
    pub fn target(&self) -> SocketAddr {
        self.shared.target
    }

    /// Cuts the link: shuts down every open connection through the proxy, and closes each new
    /// one as soon as it is accepted (its client reads the end of the stream), until
    /// [`TcpProxy::unblock`].
    pub fn block(&self) {
        let mut links = self.shared.lock();
        links.blocked = true;
        for (_, (client, upstream)) in links.open.drain() {
            cut(&client, &upstream);
            self.shared.dropped.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Forwards new connections again.
    pub fn unblock(&self) {
        self.shared.lock().blocked = false;
    }

    /// Whether it is blocked.
    pub fn is_blocked(&self) -> bool {
        self.shared.lock().blocked
    }

    /// Connections it forwarded to the target so far.
    pub fn forwarded(&self) -> u64 {
        self.shared.forwarded.load(Ordering::SeqCst)
    }

    /// Connections it closed on arrival or cut because it was blocked, so far.
    pub fn dropped(&self) -> u64 {
        self.shared.dropped.load(Ordering::SeqCst)
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Links> {
        lock(&self.links)
    }
}

/// Serves one accepted connection: links it to the target, unless the proxy is blocked,
/// and copies both ways until either side ends or the link is cut.
fn link(client: TcpStream, shared: &Shared) {
    if shared.lock().blocked {
        shared.dropped.fetch_add(1, Ordering::SeqCst);
        let _ = client.shutdown(Shutdown::Both);
        return;
    }
    let Ok(upstream) = TcpStream::connect_timeout(&shared.target, CONNECT_TIMEOUT) else {
        let _ = client.shutdown(Shutdown::Both);
        return;
    };
    let clones = (client.try_clone(), upstream.try_clone());
    let (Ok(client_out), Ok(upstream_out)) = clones else {
        cut(&client, &upstream);
        return;
    };
    let clones = (client.try_clone(), upstream.try_clone());
    let (Ok(client_kept), Ok(upstream_kept)) = clones else {
        cut(&client, &upstream);
        return;
    };
    let id = {
        let mut links = shared.lock();
        if links.blocked {
            drop(links);
            shared.dropped.fetch_add(1, Ordering::SeqCst);
            cut(&client, &upstream);
            return;
        }
        let id = links.next_id;
        links.next_id += 1;
        links.open.insert(id, (client_kept, upstream_kept));
        id
    };
    shared.forwarded.fetch_add(1, Ordering::SeqCst);
    let to_client = thread::spawn(move || pump(upstream, client_out));
    pump(client, upstream_out);
    let _ = to_client.join();
    shared.lock().open.remove(&id);
}

/// Copies `from` to `to` until either ends, then ends the link (both ways: a half-closed
/// link is not what a partition test wants to reason about).
fn pump(mut from: TcpStream, mut to: TcpStream) {
    let _ = io::copy(&mut from, &mut to);
    cut(&from, &to);
}

fn cut(a: &TcpStream, b: &TcpStream) {
    let _ = a.shutdown(Shutdown::Both);
    let _ = b.shutdown(Shutdown::Both);
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::{Ipv4Addr, TcpListener};

    use super::*;

    /// Bounds every read in these tests, so a proxy that hangs fails them.
    const READ_TIMEOUT: Duration = Duration::from_secs(5);

    /// Reads from `stream` until it ends or `timeout` passes between two reads; what it read,
    /// and how it ended (a reset counts as the end).
    fn read_until_closed(stream: &mut TcpStream, timeout: Duration) -> (Vec<u8>, io::Result<()>) {
        let mut out = Vec::new();
        if let Err(e) = stream.set_read_timeout(Some(timeout)) {
            return (out, Err(e));
        }
        let mut buf = [0u8; 4096];
        loop {
            match stream.read(&mut buf) {
                Ok(0) => return (out, Ok(())),
                Ok(n) => out.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::ConnectionReset => return (out, Ok(())),
                Err(e) => return (out, Err(e)),
            }
        }
    }

    /// A target that echoes what it reads, line by line.
    fn echo_target() -> Acceptor {
        Acceptor::loopback("test server", |mut conn| {
            let mut buf = [0u8; 1024];
            while let Ok(n) = conn.read(&mut buf) {
                if n == 0 || conn.write_all(&buf[..n]).is_err() {
                    return;
                }
            }
        })
    }

    /// Sends `line` and reads back as many bytes.
    fn round_trip(conn: &mut TcpStream, line: &str) -> io::Result<String> {
        conn.set_read_timeout(Some(READ_TIMEOUT))?;
        conn.write_all(line.as_bytes())?;
        let mut back = vec![0u8; line.len()];
        conn.read_exact(&mut back)?;
        Ok(String::from_utf8_lossy(&back).into_owned())
    }

    #[test]
    fn a_connection_through_the_proxy_reaches_the_target_both_ways() {
        let target = echo_target();
        let proxy = TcpProxy::start(target.addr());
        assert_ne!(proxy.addr(), target.addr());
        let mut conn = TcpStream::connect(proxy.addr()).expect("connect to the proxy");
        assert_eq!(round_trip(&mut conn, "hello\n").expect("echo"), "hello\n");
        assert_eq!(round_trip(&mut conn, "again\n").expect("echo"), "again\n");
        assert_eq!(proxy.forwarded(), 1);
        assert_eq!(proxy.dropped(), 0);
    }

    #[test]
    fn a_block_cuts_open_connections_and_closes_new_ones_until_unblocked() {
        let target = echo_target();
        let proxy = TcpProxy::start(target.addr());
        let mut open = TcpStream::connect(proxy.addr()).expect("connect to the proxy");
        assert_eq!(round_trip(&mut open, "before\n").expect("echo"), "before\n");

        proxy.block();
        assert!(proxy.is_blocked());
        let (read, ended) = read_until_closed(&mut open, READ_TIMEOUT);
        assert!(ended.is_ok(), "the open connection was not cut: {ended:?}");
        assert!(read.is_empty(), "read {read:?} after the block");

        let mut new = TcpStream::connect(proxy.addr()).expect("the listener stays open");
        let _ = new.write_all(b"during\n");
        let (read, ended) = read_until_closed(&mut new, READ_TIMEOUT);
        assert!(ended.is_ok(), "a new connection was not closed: {ended:?}");
        assert!(
            read.is_empty(),
            "the target answered {read:?} through a blocked proxy"
        );
        assert_eq!(
            proxy.forwarded(),
            1,
            "a connection reached the target while blocked"
        );
        assert_eq!(proxy.dropped(), 2);

        proxy.unblock();
        let mut after = TcpStream::connect(proxy.addr()).expect("connect to the proxy");
        assert_eq!(round_trip(&mut after, "after\n").expect("echo"), "after\n");
        assert_eq!(proxy.forwarded(), 2);
    }

    #[test]
    fn a_connection_finding_the_target_down_is_closed() {
        let target = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
        let down = target.local_addr().expect("address");
        drop(target);
        let proxy = TcpProxy::start(down);
        let mut conn = TcpStream::connect(proxy.addr()).expect("connect to the proxy");
        let (read, ended) = read_until_closed(&mut conn, READ_TIMEOUT);
        assert!(ended.is_ok() && read.is_empty(), "{read:?} {ended:?}");
        assert_eq!(proxy.forwarded(), 0);
    }

    #[test]
    fn dropping_the_proxy_closes_its_connections_and_its_port() {
        let target = echo_target();
        let proxy = TcpProxy::start(target.addr());
        let addr = proxy.addr();
        let mut open = TcpStream::connect(addr).expect("connect to the proxy");
        assert_eq!(round_trip(&mut open, "hello\n").expect("echo"), "hello\n");
        drop(proxy);
        let (read, ended) = read_until_closed(&mut open, READ_TIMEOUT);
        assert!(ended.is_ok() && read.is_empty(), "{read:?} {ended:?}");
        assert!(
            TcpStream::connect(addr).is_err(),
            "the proxy's port {addr} still accepts after the drop"
        );
    }
}
