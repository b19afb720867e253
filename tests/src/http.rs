//! A raw HTTP/1.1 client over a `std` TcpStream, with timeouts.
//!
//! Raw, so tests can send what a real client library would refuse: an empty `Host`, a
//! 300-character one, none at all, duplicate or spoofed headers. Every request carries
//! `connection: close` (unless the test sets `connection` itself).

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

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
}

/// Sends `raw` bytes to `addr` and reads one HTTP/1.1 response.
pub fn send_raw(addr: SocketAddr, raw: &[u8]) -> io::Result<Response> {
    let mut stream = TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT)?;
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    stream.write_all(raw)?;
    let mut buf = Vec::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    loop {
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            return parse_response(&buf, true)?.ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!(
                        "connection closed after {} bytes, before a whole response: {:?}",
                        buf.len(),
                        String::from_utf8_lossy(&buf)
                    ),
                )
            });
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(response) = parse_response(&buf, false)? {
            return Ok(response);
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

/// Parses `buf` as one response: `Ok(None)` if more bytes are needed (and `eof` is false).
fn parse_response(buf: &[u8], eof: bool) -> io::Result<Option<Response>> {
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

    let body = if header("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        match dechunk(rest)? {
            Some(body) => body,
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
        rest[..len].to_vec()
    } else if status == 204 || status == 304 || (100..200).contains(&status) {
        Vec::new()
    } else if eof {
        rest.to_vec()
    } else {
        return Ok(None);
    };
    Ok(Some(Response {
        status,
        headers,
        body,
    }))
}

/// Decodes a chunked body; `Ok(None)` if it is not complete yet.
fn dechunk(mut data: &[u8]) -> io::Result<Option<Vec<u8>>> {
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
            return Ok(find(data, b"\r\n").map(|_| body));
        }
        if data.len() < size + 2 {
            return Ok(None);
        }
        body.extend_from_slice(&data[..size]);
        data = &data[size + 2..];
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_response_with_content_length_is_complete_at_its_length() {
        let raw = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 5\r\nX-A: b\r\n\r\nhello";
        let r = parse_response(raw, false)
            .expect("valid")
            .expect("complete");
        assert_eq!(r.status, 400);
        assert_eq!(r.header("x-a"), Some("b"));
        assert_eq!(r.text(), "hello");
        assert!(
            parse_response(&raw[..raw.len() - 1], false)
                .expect("valid")
                .is_none()
        );
    }

    #[test]
    fn a_chunked_body_is_decoded() {
        let raw = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n";
        let r = parse_response(raw, false)
            .expect("valid")
            .expect("complete");
        assert_eq!(r.text(), "abcde");
    }

    #[test]
    fn a_request_can_carry_an_empty_host_and_closes_the_connection() {
        let bytes = Request::get("/x").host("").header("x-y", "1").to_bytes();
        assert_eq!(
            String::from_utf8_lossy(&bytes),
            "GET /x HTTP/1.1\r\nhost: \r\nx-y: 1\r\nconnection: close\r\n\r\n"
        );
    }
}
