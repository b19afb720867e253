//! An echo upstream: a small HTTP/1.1 server that answers every request with JSON naming
//! itself and listing the request it received, so a test can see where Envoy sent a request
//! and with which headers.
//!
//! ```json
//! {"upstream": "hello.vip", "method": "GET", "path": "/",
//!  "headers": {"host": "hello", "x-odmesh-cluster": "hello.vip", ...}}
//! ```
//! Header names are lowercased; repeated headers are joined with `,`.

use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde_json::json;

use crate::serve::{Acceptor, read_request};

/// A running echo server on a loopback port the OS picked; stopped
/// ([`EchoUpstream::stop`]) when dropped.
pub struct EchoUpstream {
    name: String,
    addr: SocketAddr,
    requests: Arc<AtomicU64>,
    acceptor: Acceptor,
}

impl EchoUpstream {
    /// Starts an echo server that calls itself `name` in its answers.
    pub fn start(name: &str) -> EchoUpstream {
        let requests = Arc::new(AtomicU64::new(0));
        let server = Server {
            name: Arc::from(name),
            requests: requests.clone(),
        };
        let acceptor = Acceptor::loopback(&format!("echo {name}"), move |conn| server.serve(conn));
        EchoUpstream {
            name: name.to_owned(),
            addr: acceptor.addr(),
            requests,
            acceptor,
        }
    }

    /// Stops it as a stopped process would stop: when this returns, its port refuses
    /// connections and every connection it had open is closed (a request in progress gets
    /// no answer). Dropping it does the same.
    pub fn stop(&mut self) {
        self.acceptor.stop();
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
                "path": request.target,
                "headers": request.headers,
                "body": String::from_utf8_lossy(&request.body),
            })
            .to_string();
            let close = request.wants_close();
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
