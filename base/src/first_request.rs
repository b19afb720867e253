//! A deadline for an HTTP/2 connection's first request: a client that connects, sends the
//! preface and then nothing but settings and pings (or nothing at all) holds a connection slot
//! and costs a task for as long as it likes; [`FirstRequest`] fails its reads once the
//! deadline passes before the first `HEADERS` frame, which opens a stream (RFC 9113, 6.2),
//! so the server closes it. Envoy opens its ADS stream as soon as it connects.
//!
//! [`FrameScan`] is the plain part: it reads the client's bytes as frames only far enough to
//! see the first `HEADERS` frame, and holds nothing but a few counters.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, ReadBuf};
use tokio::time::{Sleep, sleep};

/// The client connection preface (RFC 9113, 3.4), before the first frame.
const PREFACE_LEN: usize = 24;
/// A frame's header: 24-bit length, type, flags, stream id (RFC 9113, 4.1).
const FRAME_HEADER_LEN: usize = 9;
/// The type of a `HEADERS` frame.
const HEADERS: u8 = 0x1;

/// Where a client's byte stream is, frame by frame, until its first `HEADERS` frame.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FrameScan {
    /// Bytes seen of the preface, then of the frames.
    preface_seen: usize,
    header: [u8; FRAME_HEADER_LEN],
    header_seen: usize,
    /// Bytes of the current frame's payload still to pass.
    payload_left: usize,
    /// A `HEADERS` frame's header was seen.
    opened: bool,
}

impl FrameScan {
    /// Takes the next `bytes` the client sent; returns whether it has opened a stream yet.
    pub fn feed(&mut self, mut bytes: &[u8]) -> bool {
        while !self.opened && !bytes.is_empty() {
            if self.preface_seen < PREFACE_LEN {
                let n = bytes.len().min(PREFACE_LEN - self.preface_seen);
                self.preface_seen += n;
                bytes = &bytes[n..];
            } else if self.payload_left > 0 {
                let n = bytes.len().min(self.payload_left);
                self.payload_left -= n;
                bytes = &bytes[n..];
            } else {
                let n = bytes.len().min(FRAME_HEADER_LEN - self.header_seen);
                self.header[self.header_seen..self.header_seen + n].copy_from_slice(&bytes[..n]);
                self.header_seen += n;
                bytes = &bytes[n..];
                if self.header_seen == FRAME_HEADER_LEN {
                    let h = self.header;
                    self.payload_left =
                        usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]);
                    self.header_seen = 0;
                    self.opened = h[3] == HEADERS;
                }
            }
        }
        self.opened
    }
}

/// Called for each connection given up because it opened no stream in time.
type Idle = Arc<dyn Fn() + Send + Sync>;

/// A server's side of a connection whose reads fail (`TimedOut`) once `deadline` has passed
/// before the client opened its first stream; then, it is `io` as it is.
pub struct FirstRequest<IO> {
    io: IO,
    /// Until the first stream: the scan, when the connection is given up, and who is told.
    waiting: Option<(FrameScan, Pin<Box<Sleep>>, Idle)>,
}

impl<IO> FirstRequest<IO> {
    /// `io`, accepted now, which must open a stream `within`; `idle` is told if it does not.
    pub fn new(io: IO, within: Duration, idle: Arc<dyn Fn() + Send + Sync>) -> FirstRequest<IO> {
        FirstRequest {
            io,
            waiting: Some((FrameScan::default(), Box::pin(sleep(within)), idle)),
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for FirstRequest<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let read = Pin::new(&mut self.io).poll_read(cx, buf);
        let Some((scan, deadline, idle)) = self.waiting.as_mut() else {
            return read;
        };
        if let Poll::Ready(Ok(())) = &read
            && scan.feed(&buf.filled()[before..])
        {
            self.waiting = None;
            return read;
        }
        // Settings and pings, or nothing: still no stream. The deadline is looked at on every
        // read, so a client that keeps sending frames is given up too.
        if deadline.as_mut().poll(cx).is_ready() {
            idle();
            self.waiting = None;
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "no request before the deadline",
            )));
        }
        read
    }
}

crate::listen::writes_pass_through!(FirstRequest);

impl<IO: tonic::transport::server::Connected> tonic::transport::server::Connected
    for FirstRequest<IO>
{
    type ConnectInfo = IO::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A frame of `kind` with a payload of `len` bytes.
    fn frame(kind: u8, len: usize) -> Vec<u8> {
        let mut out = vec![
            (len >> 16) as u8,
            (len >> 8) as u8,
            len as u8,
            kind,
            0,
            0,
            0,
            0,
            1,
        ];
        out.extend(std::iter::repeat_n(0xAB, len));
        out
    }

    fn preface() -> Vec<u8> {
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec()
    }

    #[test]
    fn a_stream_is_opened_by_the_first_headers_frame_and_not_before() {
        const SETTINGS: u8 = 0x4;
        const PING: u8 = 0x6;
        let mut client = preface();
        client.extend(frame(SETTINGS, 18));
        client.extend(frame(PING, 8));
        // A payload that looks like a HEADERS frame's header is skipped as payload.
        client.extend(frame(PING, FRAME_HEADER_LEN));
        let before = client.len();
        client.extend(frame(HEADERS, 40));
        let mut scan = FrameScan::default();
        assert!(!scan.feed(&client[..before]));
        assert!(scan.feed(&client[before..]));

        // The same bytes a byte at a time: opened at the HEADERS frame's header, not before.
        let mut scan = FrameScan::default();
        let opened_at = (0..client.len()).find(|&i| scan.feed(&client[i..=i]));
        assert_eq!(opened_at, Some(before + FRAME_HEADER_LEN - 1));
    }

    #[test]
    fn the_preface_alone_or_settings_and_pings_open_nothing() {
        let mut scan = FrameScan::default();
        assert!(!scan.feed(&preface()));
        for _ in 0..100 {
            assert!(!scan.feed(&frame(0x6, 8)));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_opens_no_stream_is_given_up_at_the_deadline_and_one_that_does_is_not() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let idle = Arc::new(AtomicUsize::new(0));
        let counter = idle.clone();
        let told: Idle = Arc::new(move || {
            counter.fetch_add(1, Ordering::Relaxed);
        });
        let within = Duration::from_secs(10);

        // Preface and pings, one a second: given up after 10 s.
        let (mut client, server) = tokio::io::duplex(1 << 16);
        let mut server = FirstRequest::new(server, within, told.clone());
        let pinger = tokio::spawn(async move {
            client.write_all(&preface()).await.unwrap();
            loop {
                if client.write_all(&frame(0x6, 8)).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
        let started = tokio::time::Instant::now();
        let mut buf = [0u8; 1024];
        let ended = loop {
            match server.read(&mut buf).await {
                Ok(0) => panic!("the client never closes"),
                Ok(_) => continue,
                Err(e) => break e,
            }
        };
        assert_eq!(ended.kind(), io::ErrorKind::TimedOut);
        assert!(started.elapsed() >= within && started.elapsed() < within + Duration::from_secs(2));
        assert_eq!(idle.load(Ordering::Relaxed), 1);
        drop(server);
        pinger.abort();

        // A stream opened within the deadline: read on well after it.
        let (mut client, server) = tokio::io::duplex(1 << 16);
        let mut server = FirstRequest::new(server, within, told);
        let mut bytes = preface();
        bytes.extend(frame(HEADERS, 10));
        client.write_all(&bytes).await.unwrap();
        let mut got = vec![0u8; bytes.len()];
        server.read_exact(&mut got).await.unwrap();
        tokio::time::sleep(within * 2).await;
        client.write_all(b"more").await.unwrap();
        let mut more = [0u8; 4];
        server.read_exact(&mut more).await.unwrap();
        assert_eq!(idle.load(Ordering::Relaxed), 1);
    }
}
