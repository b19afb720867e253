//! An echo upstream: a small HTTP/1.1 server that answers every request with JSON naming
//! itself and listing the request it received, so a test can see where Envoy sent a request
//! and with which headers.
//!
//! ```json
//! {"upstream": "hello.vip", "method": "GET", "path": "/",
//!  "headers": {"host": "hello", "x-odmesh-cluster": "hello.vip", ...}}
//! ```
//! Header names are lowercased; repeated headers are joined with `,`.

use std::collections::HashMap;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use serde_json::{Map, Value, json};

/// The connections an echo server has open, by number, so [`EchoUpstream::stop`] can close
/// them.
type Conns = Arc<Mutex<HashMap<u64, TcpStream>>>;

/// A running echo server on a loopback port the OS picked; stopped
/// ([`EchoUpstream::stop`]) when dropped.
pub struct EchoUpstream {
    name: String,
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    requests: Arc<AtomicU64>,
    conns: Conns,
    acceptor: Option<JoinHandle<()>>,
}

impl EchoUpstream {
    /// Starts an echo server that calls itself `name` in its answers.
    pub fn start(name: &str) -> EchoUpstream {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .unwrap_or_else(|e| panic!("echo upstream {name}: cannot bind a loopback port: {e}"));
        let addr = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("echo upstream {name}: no local address: {e}"));
        let stop = Arc::new(AtomicBool::new(false));
        let requests = Arc::new(AtomicU64::new(0));
        let server = Server {
            name: Arc::from(name),
            requests: requests.clone(),
        };
        let stop_flag = stop.clone();
        let conns: Conns = Arc::default();
        let open = conns.clone();
        let acceptor = thread::Builder::new()
            .name(format!("echo {name}"))
            .spawn(move || {
                for (id, conn) in listener.incoming().enumerate() {
                    if stop_flag.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(conn) = conn else { continue };
                    let id = id as u64;
                    if let Ok(kept) = conn.try_clone() {
                        lock(&open).insert(id, kept);
                    }
                    let (server, open) = (server.clone(), open.clone());
                    let _ = thread::Builder::new()
                        .name(format!("echo {} conn", server.name))
                        .spawn(move || {
                            server.serve(conn);
                            lock(&open).remove(&id);
                        });
                }
            })
            .unwrap_or_else(|e| panic!("echo upstream {name}: cannot start its thread: {e}"));
        EchoUpstream {
            name: name.to_owned(),
            addr,
            stop,
            requests,
            conns,
            acceptor: Some(acceptor),
        }
    }

    /// Stops it as a stopped process would stop: when this returns, its port refuses
    /// connections and every connection it had open is closed (a request in progress gets
    /// no answer). Dropping it does the same.
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so it sees the flag and closes the listener.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
        for (_, conn) in lock(&self.conns).drain() {
            let _ = conn.shutdown(Shutdown::Both);
        }
    }

    /// The name it answers with.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its address, `127.0.0.1:<port>`.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// How many requests it has answered.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::SeqCst)
    }
}

impl Drop for EchoUpstream {
    fn drop(&mut self) {
        self.stop();
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[derive(Clone)]
struct Server {
    name: Arc<str>,
    requests: Arc<AtomicU64>,
}

impl Server {
    /// Answers requests on one connection until the peer closes it (keep-alive).
    fn serve(&self, conn: TcpStream) {
        let _ = conn.set_read_timeout(Some(Duration::from_secs(60)));
        let Ok(mut writer) = conn.try_clone() else {
            return;
        };
        let mut reader = BufReader::new(conn);
        while let Ok(Some(request)) = read_request(&mut reader) {
            self.requests.fetch_add(1, Ordering::SeqCst);
            let body = json!({
                "upstream": &*self.name,
                "method": request.method,
                "path": request.path,
                "headers": request.headers,
                "body": String::from_utf8_lossy(&request.body),
            })
            .to_string();
            let close = request
                .headers
                .get("connection")
                .and_then(Value::as_str)
                .is_some_and(|v| v.eq_ignore_ascii_case("close"));
            let head = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nx-echo-upstream: {}\r\n{}\r\n",
                body.len(),
                self.name,
                if close { "connection: close\r\n" } else { "" }
            );
            // One write: head and body in two would wait for the peer's delayed ACK (Nagle),
            // 40 ms per answer on a kept-alive connection.
            if writer
                .write_all(format!("{head}{body}").as_bytes())
                .is_err()
            {
                return;
            }
            if close {
                return;
            }
        }
    }
}

struct EchoedRequest {
    method: String,
    path: String,
    headers: Map<String, Value>,
    body: Vec<u8>,
}

/// Reads one request; `Ok(None)` at a clean end of the connection.
fn read_request(reader: &mut BufReader<TcpStream>) -> io::Result<Option<EchoedRequest>> {
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Ok(None);
    }
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or_default().to_owned();
    let path = parts.next().unwrap_or_default().to_owned();
    let mut headers = Map::new();
    let mut content_length = 0usize;
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
        let name = name.trim().to_ascii_lowercase();
        let value = value.trim();
        if name == "content-length" {
            content_length = value.parse().unwrap_or(0);
        }
        match headers.get_mut(&name) {
            Some(Value::String(joined)) => {
                joined.push(',');
                joined.push_str(value);
            }
            _ => {
                headers.insert(name, Value::String(value.to_owned()));
            }
        }
    }
    let mut body = vec![0u8; content_length];
    reader.read_exact(&mut body)?;
    Ok(Some(EchoedRequest {
        method,
        path,
        headers,
        body,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::Request;

    #[test]
    fn the_echo_upstream_names_itself_and_lists_the_headers_it_got() {
        let echo = EchoUpstream::start("test.vip");
        let r = Request::get("/p")
            .host("h")
            .header("X-Thing", "1")
            .header("x-thing", "2")
            .send(echo.addr());
        assert_eq!(r.status, 200);
        let body = r.json();
        assert_eq!(body["upstream"], "test.vip");
        assert_eq!(body["path"], "/p");
        assert_eq!(body["headers"]["host"], "h");
        assert_eq!(body["headers"]["x-thing"], "1,2");
        assert_eq!(echo.requests(), 1);
    }

    #[test]
    fn a_stopped_echo_refuses_connections_and_closes_the_open_ones() {
        let mut echo = EchoUpstream::start("stopping");
        let mut kept = crate::http::Connection::new(echo.addr());
        let request = Request::get("/").host("h");
        assert_eq!(
            kept.send(&request, Duration::from_secs(5))
                .expect("up")
                .status,
            200
        );
        echo.stop();
        let refused = TcpStream::connect_timeout(&echo.addr(), Duration::from_secs(1));
        assert!(refused.is_err(), "a stopped echo still accepts connections");
        assert!(kept.send(&request, Duration::from_secs(5)).is_err());
        assert_eq!(echo.requests(), 1);
    }
}
