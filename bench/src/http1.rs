//! A minimal HTTP/1.1 client for driving odmesh-control's REST endpoints at load: one
//! keep-alive connection, one request at a time, bodies framed by `Content-Length` (what
//! odmesh answers with). Enough for a benchmark; not a general client.

use anyhow::{Context, bail};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// One connection to `addr` (`host:port`).
pub struct Conn {
    addr: String,
    stream: BufReader<TcpStream>,
}

impl Conn {
    pub async fn connect(addr: &str) -> anyhow::Result<Conn> {
        let stream = TcpStream::connect(addr)
            .await
            .with_context(|| format!("connecting to {addr}"))?;
        stream.set_nodelay(true)?;
        Ok(Conn {
            addr: addr.to_owned(),
            stream: BufReader::new(stream),
        })
    }

    /// Sends one request; returns the answer's status and body.
    pub async fn request(
        &mut self,
        method: &str,
        path: &str,
        body: &[u8],
    ) -> anyhow::Result<(u16, Vec<u8>)> {
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            self.addr,
            body.len()
        );
        let out = self.stream.get_mut();
        out.write_all(head.as_bytes()).await?;
        out.write_all(body).await?;

        let mut line = String::new();
        self.stream.read_line(&mut line).await?;
        let status: u16 = line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .with_context(|| format!("{method} {path}: not an HTTP answer: {line:?}"))?;
        let mut length = 0usize;
        loop {
            line.clear();
            if self.stream.read_line(&mut line).await? == 0 {
                bail!("{method} {path}: connection closed in the headers");
            }
            let header = line.trim_end();
            if header.is_empty() {
                break;
            }
            let (name, value) = header.split_once(':').unwrap_or((header, ""));
            if name.eq_ignore_ascii_case("content-length") {
                length = value.trim().parse().context("bad content-length")?;
            } else if name.eq_ignore_ascii_case("transfer-encoding") {
                bail!("{method} {path}: chunked answers are not supported here");
            }
        }
        let mut answer = vec![0; length];
        self.stream.read_exact(&mut answer).await?;
        Ok((status, answer))
    }
}
