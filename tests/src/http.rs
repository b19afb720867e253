//! A raw HTTP/1.1 client over a `std` TcpStream, with timeouts.
//!
//! Raw, so tests can send what a real client library would refuse: an empty `Host`, a
//! 300-character one, none at all, duplicate or spoofed headers. Every request carries
//! `connection: close` (unless the test sets `connection` itself).
//!
//! [`Request::send`] bounds connecting and each read; [`Request::send_within`] bounds the
//! whole exchange; a [`Connection`] keeps one connection alive across requests.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// How long connecting may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one read or write may block.
pub const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// An HTTP/1.1 request, built up and then sent with [`Request::send`].
#[derive(Clone, Debug)]
pub struct Request {
    method: String,
    target: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Request {
    /// A request with `method` for `target` (e.g. `/`), with no headers yet (not even `Host`).
    pub fn new(method: &str, target: &str) -> Request {
        Request {
            method: method.to_owned(),
            target: target.to_owned(),
            headers: Vec::new(),
            body: Vec::new(),
        }
    }

    /// A `GET` request for `target`.
    pub fn get(target: &str) -> Request {
        Request::new("GET", target)
    }

    /// Adds a `Host` header with exactly this value (empty is allowed).
    pub fn host(self, host: &str) -> Request {
        self.header("host", host)
    }

    /// Adds a header, as given (no validation, duplicates allowed).
    pub fn header(mut self, name: &str, value: &str) -> Request {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }

    /// Sets the body; `content-length` is added when sending.
    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Request {
        self.body = body.into();
        self
    }

    /// The request as bytes on the wire.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(256 + self.body.len());
        out.extend_from_slice(format!("{} {} HTTP/1.1\r\n", self.method, self.target).as_bytes());
        for (name, value) in &self.headers {
            out.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
        }
        let has = |n: &str| self.headers.iter().any(|(h, _)| h.eq_ignore_ascii_case(n));
        if !has("connection") {
            out.extend_from_slice(b"connection: close\r\n");
        }
        if !self.body.is_empty() && !has("content-length") {
            out.extend_from_slice(format!("content-length: {}\r\n", self.body.len()).as_bytes());
        }
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(&self.body);
        out
    }

    /// Sends the request to `addr` and reads the response; panics saying what failed.
    pub fn send(&self, addr: SocketAddr) -> Response {
        self.try_send(addr)
            .unwrap_or_else(|e| panic!("{} {} to {addr} failed: {e}", self.method, self.target))
    }

    /// Sends the request to `addr` and reads the response.
    pub fn try_send(&self, addr: SocketAddr) -> io::Result<Response> {
        send_raw(addr, &self.to_bytes())
    }

    /// Sends the request to `addr` and reads the response, connecting, sending and reading
    /// all within `timeout`; past it, the error is [`io::ErrorKind::TimedOut`].
    pub fn send_within(&self, addr: SocketAddr, timeout: Duration) -> io::Result<Response> {
        send_raw_within(addr, &self.to_bytes(), timeout)
    }
}

/// Writes `request` on `stream`, a connection of any kind (e.g. TLS), and reads one response;
/// each read is bounded by the stream's own timeout. A request without a `connection`
/// header closes the connection after its answer.
pub fn exchange_on(stream: &mut (impl Read + Write), request: &Request) -> io::Result<Response> {
    stream.write_all(&request.to_bytes())?;
    stream.flush()?;
    let mut buf = Vec::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    loop {
        let n = stream.read(&mut chunk)?;
        buf.extend_from_slice(&chunk[..n]);
        if let Some((response, _)) = parse_response(&buf, n == 0)? {
            return Ok(response);
        }
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "connection closed after {} bytes, before a whole response",
                    buf.len()
                ),
            ));
        }
    }
}

/// Sends `raw` bytes to `addr` and reads one HTTP/1.1 response.
pub fn send_raw(addr: SocketAddr, raw: &[u8]) -> io::Result<Response> {
    let mut stream = TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT)?;
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    stream.write_all(raw)?;
    exchange(&mut stream, None)
        .map(|(response, _)| response)
        .map_err(|failed| failed.error)
}

/// Sends `raw` bytes to `addr` and reads one HTTP/1.1 response, all within `timeout`.
pub fn send_raw_within(addr: SocketAddr, raw: &[u8], timeout: Duration) -> io::Result<Response> {
    let deadline = Deadline::after(timeout);
    let mut stream = TcpStream::connect_timeout(&addr, deadline.left()?)?;
    stream.set_write_timeout(Some(deadline.left()?))?;
    stream.write_all(raw).map_err(|e| deadline.explain(e))?;
    exchange(&mut stream, Some(deadline))
        .map(|(response, _)| response)
        .map_err(|failed| failed.error)
}

/// One HTTP/1.1 connection kept alive across requests (requests get
/// `connection: keep-alive` unless they set `connection`), opened again when the server
/// closes it.
///
/// As HTTP clients do for idempotent requests, a request whose reused connection turns out
/// closed before any byte of an answer is sent once more on a new connection; [`Connection::retries`]
/// counts those.
#[derive(Debug)]
pub struct Connection {
    addr: SocketAddr,
    stream: Option<TcpStream>,
    opened: u64,
    retries: u64,
}

impl Connection {
    /// A connection to `addr`, opened on the first request.
    pub fn new(addr: SocketAddr) -> Connection {
        Connection {
            addr,
            stream: None,
            opened: 0,
            retries: 0,
        }
    }

    /// Sends `request` and reads its response, all within `timeout` (a retry included).
    pub fn send(&mut self, request: &Request, timeout: Duration) -> io::Result<Response> {
        let has_connection = request
            .headers
            .iter()
            .any(|(h, _)| h.eq_ignore_ascii_case("connection"));
        let raw = if has_connection {
            request.to_bytes()
        } else {
            request
                .clone()
                .header("connection", "keep-alive")
                .to_bytes()
        };
        let deadline = Deadline::after(timeout);
        let reused = self.stream.is_some();
        match self.exchange(&raw, deadline) {
            Err(failed) if reused && !failed.got_bytes && failed.stale => {
                self.retries += 1;
                self.exchange(&raw, deadline).map_err(|f| f.error)
            }
            result => result.map_err(|f| f.error),
        }
    }

    /// How many TCP connections it has opened.
    pub fn opened(&self) -> u64 {
        self.opened
    }

    /// How many requests were sent again because a reused connection was found closed.
    pub fn retries(&self) -> u64 {
        self.retries
    }

    fn exchange(&mut self, raw: &[u8], deadline: Deadline) -> Result<Response, Failed> {
        let fail = |error: io::Error| Failed {
            stale: false,
            got_bytes: false,
            error: deadline.explain(error),
        };
        let mut stream = match self.stream.take() {
            Some(stream) => stream,
            None => {
                let stream = TcpStream::connect_timeout(&self.addr, deadline.left().map_err(fail)?)
                    .map_err(fail)?;
                self.opened += 1;
                stream
            }
        };
        stream
            .set_write_timeout(Some(deadline.left().map_err(fail)?))
            .map_err(fail)?;
        if let Err(error) = stream.write_all(raw) {
            return Err(Failed {
                stale: is_stale(&error),
                ..fail(error)
            });
        }
        let (response, reusable) = exchange(&mut stream, Some(deadline))?;
        if reusable {
            self.stream = Some(stream);
        } else {
            let _ = stream.shutdown(Shutdown::Both);
        }
        Ok(response)
    }
}

/// Whether a write or read error says the peer had closed the connection.
fn is_stale(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::BrokenPipe
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::UnexpectedEof
    )
}

/// The end of a request's time.
#[derive(Clone, Copy, Debug)]
struct Deadline {
    at: Instant,
    timeout: Duration,
}

impl Deadline {
    fn after(timeout: Duration) -> Deadline {
        Deadline {
            at: Instant::now() + timeout,
            timeout,
        }
    }

    /// The time left, or a `TimedOut` error when none is.
    fn left(&self) -> io::Result<Duration> {
        let left = self.at.saturating_duration_since(Instant::now());
        if left.is_zero() {
            Err(self.timed_out())
        } else {
            Ok(left)
        }
    }

    fn timed_out(&self) -> io::Error {
        io::Error::new(
            io::ErrorKind::TimedOut,
            format!("no whole response within {:?}", self.timeout),
        )
    }

    /// A socket timeout (`WouldBlock` on Linux) as this deadline's `TimedOut`.
    fn explain(&self, error: io::Error) -> io::Error {
        if is_timeout(&error) {
            self.timed_out()
        } else {
            error
        }
    }
}

fn is_timeout(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// Why an exchange failed, and whether any byte of an answer had come.
struct Failed {
    error: io::Error,
    got_bytes: bool,
    /// The peer had closed the connection before the request (a reused connection).
    stale: bool,
}

/// Reads one response from `stream` (bounded per read by the stream's timeout, or by
/// `deadline`); returns it and whether the connection can carry another request.
fn exchange(
    stream: &mut TcpStream,
    deadline: Option<Deadline>,
) -> Result<(Response, bool), Failed> {
    let mut buf = Vec::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    let failed = |error: io::Error, buf: &[u8]| Failed {
        stale: buf.is_empty() && is_stale(&error),
        got_bytes: !buf.is_empty(),
        error: match deadline {
            Some(d) => d.explain(error),
            None => error,
        },
    };
    loop {
        if let Some(deadline) = deadline {
            let left = deadline.left().map_err(|e| failed(e, &buf))?;
            stream
                .set_read_timeout(Some(left))
                .map_err(|e| failed(e, &buf))?;
        }
        let n = match stream.read(&mut chunk) {
            Ok(n) => n,
            // A socket timeout counts in the kernel's ticks and can fire a little before
            // the deadline; read again for the time truly left.
            Err(e) if is_timeout(&e) && deadline.is_some_and(|d| d.left().is_ok()) => continue,
            Err(e) => return Err(failed(e, &buf)),
        };
        if n == 0 {
            let parsed = parse_response(&buf, true).map_err(|e| failed(e, &buf))?;
            return match parsed {
                Some((response, _)) => Ok((response, false)),
                None => {
                    let error = io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!(
                            "connection closed after {} bytes, before a whole response: {:?}",
                            buf.len(),
                            String::from_utf8_lossy(&buf)
                        ),
                    );
                    Err(failed(error, &buf))
                }
            };
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some((response, used)) = parse_response(&buf, false).map_err(|e| failed(e, &buf))? {
            let close = response
                .header("connection")
                .is_some_and(|v| v.eq_ignore_ascii_case("close"));
            return Ok((response, used == buf.len() && !close));
        }
    }
}

/// An HTTP response: status, headers in order (names lowercase), body (chunked decoded).
#[derive(Clone, Debug)]
pub struct Response {
    /// The status code, e.g. 200.
    pub status: u16,
    /// The headers in the order received, names lowercased.
    pub headers: Vec<(String, String)>,
    /// The body, de-chunked.
    pub body: Vec<u8>,
}

impl Response {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The body as text (lossy UTF-8).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON; panics with the body if it is not JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "response body is not JSON ({e}); status {}, body: {}",
                self.status,
                self.text()
            )
        })
    }
}

fn bad(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// Parses `buf` as one response and says how many bytes of `buf` it took: `Ok(None)` if more
/// bytes are needed (and `eof` is false).
fn parse_response(buf: &[u8], eof: bool) -> io::Result<Option<(Response, usize)>> {
    let Some(head_end) = find(buf, b"\r\n\r\n") else {
        return Ok(None);
    };
    let head = std::str::from_utf8(&buf[..head_end])
        .map_err(|e| bad(format!("response head is not UTF-8: {e}")))?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or_else(|| bad(format!("bad status line {status_line:?}")))?;
    let mut headers = Vec::new();
    for line in lines {
        let (name, value) = line
            .split_once(':')
            .ok_or_else(|| bad(format!("bad header line {line:?}")))?;
        headers.push((name.trim().to_ascii_lowercase(), value.trim().to_owned()));
    }
    let rest = &buf[head_end + 4..];
    let header = |n: &str| {
        headers
            .iter()
            .find(|(h, _)| h == n)
            .map(|(_, v)| v.as_str())
    };

    let body_at = head_end + 4;
    let (body, used) =
        if header("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
            match dechunk(rest)? {
                Some((body, used)) => (body, body_at + used),
                None if eof => return Err(bad("connection closed inside a chunked body".into())),
                None => return Ok(None),
            }
        } else if let Some(len) = header("content-length") {
            let len: usize = len
                .parse()
                .map_err(|_| bad(format!("bad content-length {len:?}")))?;
            if rest.len() < len {
                if eof {
                    return Err(bad(format!(
                        "connection closed after {} of {len} body bytes",
                        rest.len()
                    )));
                }
                return Ok(None);
            }
            (rest[..len].to_vec(), body_at + len)
        } else if status == 204 || status == 304 || (100..200).contains(&status) {
            (Vec::new(), body_at)
        } else if eof {
            (rest.to_vec(), buf.len())
        } else {
            return Ok(None);
        };
    let response = Response {
        status,
        headers,
        body,
    };
    Ok(Some((response, used)))
}

/// Decodes a chunked body and says how many bytes it took; `Ok(None)` if it is not complete
/// yet.
fn dechunk(data: &[u8]) -> io::Result<Option<(Vec<u8>, usize)>> {
    let whole = data.len();
    let mut data = data;
    let mut body = Vec::new();
    loop {
        let Some(line_end) = find(data, b"\r\n") else {
            return Ok(None);
        };
        let size_text = std::str::from_utf8(&data[..line_end]).unwrap_or("?");
        let size_text = size_text.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_text, 16)
            .map_err(|_| bad(format!("bad chunk size {size_text:?}")))?;
        data = &data[line_end + 2..];
        if size == 0 {
            // Trailers (ignored) end with an empty line.
            let Some(end) = find_line_end_of_trailers(data) else {
                return Ok(None);
            };
            return Ok(Some((body, whole - data.len() + end)));
        }
        if data.len() < size + 2 {
            return Ok(None);
        }
        body.extend_from_slice(&data[..size]);
        data = &data[size + 2..];
    }
}

/// Where the trailers after the last chunk end (the empty line included).
fn find_line_end_of_trailers(data: &[u8]) -> Option<usize> {
    if data.starts_with(b"\r\n") {
        return Some(2);
    }
    find(data, b"\r\n\r\n").map(|at| at + 4)
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, TcpListener};

    use crate::echo::EchoUpstream;
    use crate::serve::Acceptor;

    #[test]
    fn a_response_with_content_length_is_complete_at_its_length() {
        let raw = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 5\r\nX-A: b\r\n\r\nhello";
        let (r, used) = parse_response(raw, false)
            .expect("valid")
            .expect("complete");
        assert_eq!(r.status, 400);
        assert_eq!(r.header("x-a"), Some("b"));
        assert_eq!(r.text(), "hello");
        assert_eq!(used, raw.len());
        assert!(
            parse_response(&raw[..raw.len() - 1], false)
                .expect("valid")
                .is_none()
        );
    }

    #[test]
    fn a_chunked_body_is_decoded_and_ends_at_its_last_chunk() {
        let raw = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n";
        let mut with_more = raw.to_vec();
        with_more.extend_from_slice(b"HTTP/1.1 200 OK\r\n");
        let (r, used) = parse_response(&with_more, false)
            .expect("valid")
            .expect("complete");
        assert_eq!(r.text(), "abcde");
        assert_eq!(used, raw.len());
        let trailers =
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n1\r\na\r\n0\r\nx-t: 1\r\n";
        assert!(parse_response(trailers, false).expect("valid").is_none());
    }

    #[test]
    fn a_request_can_carry_an_empty_host_and_closes_the_connection() {
        let bytes = Request::get("/x").host("").header("x-y", "1").to_bytes();
        assert_eq!(
            String::from_utf8_lossy(&bytes),
            "GET /x HTTP/1.1\r\nhost: \r\nx-y: 1\r\nconnection: close\r\n\r\n"
        );
    }

    #[test]
    fn send_within_times_out_on_a_server_that_never_answers() {
        let silent = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
        let addr = silent.local_addr().expect("addr");
        let started = Instant::now();
        let error = Request::get("/")
            .host("h")
            .send_within(addr, Duration::from_millis(200))
            .expect_err("nothing answers");
        let took = started.elapsed();
        assert_eq!(error.kind(), io::ErrorKind::TimedOut, "{error}");
        assert!(error.to_string().contains("200ms"), "{error}");
        assert!(
            took >= Duration::from_millis(200) && took < Duration::from_secs(2),
            "{took:?}"
        );
    }

    #[test]
    fn a_connection_carries_several_requests_and_reopens_after_the_server_closes_it() {
        let echo = EchoUpstream::start("keep");
        let mut conn = Connection::new(echo.addr());
        for _ in 0..3 {
            let r = conn
                .send(&Request::get("/").host("h"), Duration::from_secs(5))
                .expect("answer");
            assert_eq!(r.status, 200);
            assert_eq!(r.json()["headers"]["connection"], "keep-alive");
        }
        assert_eq!(conn.opened(), 1);
        // `connection: close` makes the echo close it; the next request opens another.
        let close = Request::get("/").host("h").header("connection", "close");
        assert_eq!(
            conn.send(&close, Duration::from_secs(5))
                .expect("answer")
                .status,
            200
        );
        assert_eq!(
            conn.send(&Request::get("/").host("h"), Duration::from_secs(5))
                .expect("answer")
                .status,
            200
        );
        assert_eq!(conn.opened(), 2);
        assert_eq!(echo.requests(), 5);
    }

    #[test]
    fn a_reused_connection_the_server_closed_is_retried_once_on_a_new_one() {
        // Answers one request per connection with keep-alive, then closes it silently.
        let server = Acceptor::loopback("test server", |mut conn| {
            let mut buf = [0u8; 1024];
            let _ = conn.read(&mut buf);
            let _ = conn.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok");
            let _ = conn.shutdown(Shutdown::Both);
        });
        let addr = server.addr();
        let mut conn = Connection::new(addr);
        let request = Request::get("/").host("h");
        assert_eq!(
            conn.send(&request, Duration::from_secs(5))
                .expect("first")
                .text(),
            "ok"
        );
        // Wait (bounded) until the server's close has reached this side.
        crate::wait::wait_until(Duration::from_secs(5), "the server to close", || {
            conn.stream.as_ref().is_some_and(|s| {
                s.set_nonblocking(true).ok();
                let mut b = [0u8; 1];
                let closed = matches!(s.peek(&mut b), Ok(0));
                s.set_nonblocking(false).ok();
                closed
            })
        });
        assert_eq!(
            conn.send(&request, Duration::from_secs(5))
                .expect("second")
                .text(),
            "ok"
        );
        assert_eq!((conn.opened(), conn.retries()), (2, 1));
    }
}
