//! What the harness's loopback servers (the echo upstream, the fake Eureka, and the
//! harness's own tests' servers) share: an accept loop that stops as a stopped process
//! would, and an HTTP/1.1 request reader.

use std::collections::{BTreeMap, HashMap};
use std::io::{self, BufRead};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use crate::lock;

/// Open connections by number, so that [`Acceptor::stop`] can close them.
type Conns = Arc<Mutex<HashMap<u64, TcpStream>>>;

/// Accepts connections on a listener and serves each on a thread of its own until
/// [`Acceptor::stop`] (or drop).
pub(crate) struct Acceptor {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    conns: Conns,
    conn_threads: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl Acceptor {
    /// Serves every connection `listener` accepts with `serve`; `name` names the threads.
    pub(crate) fn start(
        listener: TcpListener,
        name: &str,
        serve: impl Fn(TcpStream) + Send + Sync + 'static,
    ) -> Acceptor {
        let addr = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("{name}: no local address: {e}"));
        let stop = Arc::new(AtomicBool::new(false));
        let conns: Conns = Arc::default();
        let conn_threads: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let serve = Arc::new(serve);
        let thread = {
            let (stop, conns, conn_threads) = (stop.clone(), conns.clone(), conn_threads.clone());
            let conn_name = format!("{name} conn");
            let next = AtomicU64::new(0);
            thread::Builder::new()
                .name(name.to_owned())
                .spawn(move || {
                    for conn in listener.incoming() {
                        if stop.load(Ordering::SeqCst) {
                            return;
                        }
                        let Ok(conn) = conn else { continue };
                        let id = next.fetch_add(1, Ordering::SeqCst);
                        if let Ok(kept) = conn.try_clone() {
                            lock(&conns).insert(id, kept);
                        }
                        let (serve, open) = (serve.clone(), conns.clone());
                        let spawned =
                            thread::Builder::new()
                                .name(conn_name.clone())
                                .spawn(move || {
                                    serve(conn);
                                    lock(&open).remove(&id);
                                });
                        if let Ok(handle) = spawned {
                            let mut threads = lock(&conn_threads);
                            threads.retain(|t| !t.is_finished());
                            threads.push(handle);
                        }
                    }
                })
                .unwrap_or_else(|e| panic!("{name}: cannot start its thread: {e}"))
        };
        Acceptor {
            addr,
            stop,
            thread: Some(thread),
            conns,
            conn_threads,
        }
    }

    /// [`Acceptor::start`] on a loopback port the OS picks.
    pub(crate) fn loopback(
        name: &str,
        serve: impl Fn(TcpStream) + Send + Sync + 'static,
    ) -> Acceptor {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .unwrap_or_else(|e| panic!("{name}: cannot bind a loopback port: {e}"));
        Acceptor::start(listener, name, serve)
    }

    /// The address it listens on.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops as a stopped process would: when this returns, the port refuses connections
    /// and every connection is closed (a request in progress gets no answer) and served no
    /// more. A `serve` that waits for something must be woken before.
    pub(crate) fn stop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            // Wake the accept loop so that it sees the flag and drops the listener.
            let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
            let _ = thread.join();
        }
        for (_, conn) in lock(&self.conns).drain() {
            let _ = conn.shutdown(Shutdown::Both);
        }
        let threads = std::mem::take(&mut *lock(&self.conn_threads));
        for thread in threads {
            let _ = thread.join();
        }
    }
}

impl Drop for Acceptor {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One request as a test server read it.
pub(crate) struct Received {
    pub(crate) method: String,
    /// The request target as sent, query included.
    pub(crate) target: String,
    /// Header names lowercased; a repeated header's values joined with `,`.
    pub(crate) headers: BTreeMap<String, String>,
    pub(crate) body: Vec<u8>,
}

impl Received {
    /// The target without its query.
    pub(crate) fn path(&self) -> &str {
        self.target.split('?').next().unwrap_or_default()
    }

    /// Whether the client asked to close the connection after the answer.
    pub(crate) fn wants_close(&self) -> bool {
        self.headers
            .get("connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("close"))
    }
}

/// Reads one request (its body by `content-length`); `Ok(None)` at a clean end of the
/// connection.
pub(crate) fn read_request(reader: &mut impl BufRead) -> io::Result<Option<Received>> {
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Ok(None);
    }
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or_default().to_owned();
    let target = parts.next().unwrap_or_default().to_owned();
    let mut headers: BTreeMap<String, String> = BTreeMap::new();
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 {
            return Ok(None);
        }
        let header = line.trim_end_matches(['\r', '\n']);
        if header.is_empty() {
            break;
        }
        let Some((name, value)) = header.split_once(':') else {
            continue;
        };
        let (name, value) = (name.trim().to_ascii_lowercase(), value.trim());
        headers
            .entry(name)
            .and_modify(|joined| {
                joined.push(',');
                joined.push_str(value);
            })
            .or_insert_with(|| value.to_owned());
    }
    let length = headers
        .get("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0u8; length];
    reader.read_exact(&mut body)?;
    Ok(Some(Received {
        method,
        target,
        headers,
        body,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::BufReader;

    #[test]
    fn a_request_is_read_with_its_headers_joined_and_its_body() {
        let raw = b"POST /eureka/apps?x=1 HTTP/1.1\r\nHost: h\r\nX-A: 1\r\nx-a: 2\r\n\
                    Connection: close\r\nContent-Length: 5\r\n\r\nhelloGET / HTTP/1.1\r\n\r\n";
        let mut reader = BufReader::new(&raw[..]);
        let first = read_request(&mut reader).unwrap().expect("a request");
        assert_eq!(
            (first.method.as_str(), first.target.as_str()),
            ("POST", "/eureka/apps?x=1")
        );
        assert_eq!(first.path(), "/eureka/apps");
        assert_eq!(first.headers["x-a"], "1,2");
        assert!(first.wants_close());
        assert_eq!(first.body, b"hello");
        let second = read_request(&mut reader)
            .unwrap()
            .expect("a second request");
        assert_eq!((second.method.as_str(), second.path()), ("GET", "/"));
        assert!(!second.wants_close());
        assert!(read_request(&mut reader).unwrap().is_none(), "then the end");
    }

    #[test]
    fn a_connection_that_ends_inside_a_request_reads_as_its_end() {
        let mut reader = BufReader::new(&b"GET / HTTP/1.1\r\nhost: h\r\n"[..]);
        assert!(read_request(&mut reader).unwrap().is_none());
    }
}
