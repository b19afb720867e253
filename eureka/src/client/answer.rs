//! An answer's body read as it arrives, for the follower's fetches and a peer fill: decoded
//! from gzip when the server says so (`Content-Encoding: gzip`), bounded in size (counted
//! both as transferred and decoded) and in the time the server may leave it waiting, and
//! handed to a parser on a blocking thread. So a registry of millions of instances never sits
//! in memory as one document, plain or compressed.

use std::io::{self, BufReader, Read};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use flate2::read::MultiGzDecoder;
use http_body_util::BodyExt;
use hyper::body::{Body, Bytes};
use hyper::header::{CONTENT_ENCODING, CONTENT_LENGTH};
use tokio::sync::mpsc;

/// What the requests that read an answer this way send: the encoding they can read.
pub(crate) const ACCEPT_GZIP: &str = "gzip";

/// The bounds on one answer.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Bounds {
    /// The most bytes read, as transferred and once decoded.
    pub(crate) max_bytes: u64,
    /// The longest wait for the next part of the body.
    pub(crate) idle: Duration,
}

/// Why an answer's body could not be read (what the parser made of it is its own result).
#[derive(Debug, thiserror::Error)]
pub(crate) enum Unread {
    /// The body broke off: the connection's error.
    #[error("reading the answer")]
    Transport(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The thread that parsed it failed.
    #[error("reading the answer: the reader failed")]
    Reader(#[source] tokio::task::JoinError),
    #[error("the answer stalled: no data for {0:?}")]
    Idle(Duration),
    #[error("the answer is larger than {0} bytes")]
    TooLarge(u64),
    #[error("the answer's Content-Encoding is {0:?}; odmesh reads gzip or none")]
    Encoding(String),
}

/// Reads `response`'s body through `parse`, on a blocking thread, as the body arrives.
pub(crate) async fn read<B, T>(
    response: hyper::Response<B>,
    bounds: Bounds,
    parse: impl FnOnce(&mut dyn Read) -> T + Send + 'static,
) -> Result<T, Unread>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    T: Send + 'static,
{
    let headers = response.headers();
    let gzip = match headers
        .get(CONTENT_ENCODING)
        .map(|v| v.to_str().map(str::trim))
    {
        None => false,
        Some(Ok(e)) if e.is_empty() || e.eq_ignore_ascii_case("identity") => false,
        Some(Ok(e)) if e.eq_ignore_ascii_case("gzip") || e.eq_ignore_ascii_case("x-gzip") => true,
        Some(e) => return Err(Unread::Encoding(e.unwrap_or("(not text)").to_owned())),
    };
    let length = (headers.get(CONTENT_LENGTH)).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if length.is_some_and(|n| n > bounds.max_bytes) {
        return Err(Unread::TooLarge(bounds.max_bytes));
    }
    let (tx, rx) = mpsc::channel(16);
    let over = Arc::new(AtomicBool::new(false));
    let decoded_over = Arc::clone(&over);
    let parser = tokio::task::spawn_blocking(move || {
        let arrived = Arrived {
            rx,
            current: Bytes::new(),
        };
        let decoded: Box<dyn Read> = if gzip {
            Box::new(MultiGzDecoder::new(arrived))
        } else {
            Box::new(arrived)
        };
        let bounded = Bounded {
            inner: decoded,
            left: bounds.max_bytes,
            over: decoded_over,
        };
        parse(&mut BufReader::with_capacity(1 << 16, bounded))
    });
    let mut body = response.into_body();
    let mut transferred = 0u64;
    let fed = loop {
        let frame = match tokio::time::timeout(bounds.idle, body.frame()).await {
            Err(_) => break Err(Unread::Idle(bounds.idle)),
            Ok(None) => break Ok(()),
            Ok(Some(Err(e))) => break Err(Unread::Transport(e.into())),
            Ok(Some(Ok(frame))) => frame,
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        transferred += data.len() as u64;
        if transferred > bounds.max_bytes {
            break Err(Unread::TooLarge(bounds.max_bytes));
        }
        if tx.send(Ok(data)).await.is_err() {
            // The parser is done: it read a whole document, or failed on one.
            break Ok(());
        }
    };
    if fed.is_err() {
        let _ = tx.send(Err(())).await;
    }
    drop(tx);
    let parsed = parser.await.map_err(Unread::Reader)?;
    fed?;
    if over.load(Ordering::Relaxed) {
        return Err(Unread::TooLarge(bounds.max_bytes));
    }
    Ok(parsed)
}

/// The body's data as it arrives; `Err` when its reading broke off.
struct Arrived {
    rx: mpsc::Receiver<Result<Bytes, ()>>,
    current: Bytes,
}

impl Read for Arrived {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.current.is_empty() {
            match self.rx.blocking_recv() {
                None => return Ok(0),
                Some(Err(())) => return Err(io::Error::other("the answer broke off")),
                Some(Ok(data)) => self.current = data,
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current[..n]);
        self.current = self.current.slice(n..);
        Ok(n)
    }
}

/// At most `left` more bytes; beyond, an error, and `over` is set.
struct Bounded<R> {
    inner: R,
    left: u64,
    over: Arc<AtomicBool>,
}

impl<R: Read> Read for Bounded<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n as u64 > self.left {
            self.over.store(true, Ordering::Relaxed);
            return Err(io::Error::other("the answer is over its size limit"));
        }
        self.left -= n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::gzip;
    use http_body_util::Full;
    use hyper::body::Frame;

    fn answer(body: Vec<u8>, encoding: Option<&str>) -> hyper::Response<Full<Bytes>> {
        let mut r = hyper::Response::builder();
        if let Some(e) = encoding {
            r = r.header(CONTENT_ENCODING, e);
        }
        r.body(Full::new(Bytes::from(body))).unwrap()
    }

    fn bounds(max_bytes: u64) -> Bounds {
        Bounds {
            max_bytes,
            idle: Duration::from_secs(5),
        }
    }

    async fn text<B>(response: hyper::Response<B>, max: u64) -> Result<String, Unread>
    where
        B: Body<Data = Bytes> + Unpin,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        read(response, bounds(max), |r| {
            let mut s = String::new();
            r.read_to_string(&mut s).map(|_| s)
        })
        .await
        .map(|read| read.unwrap_or_else(|e| format!("error: {e}")))
    }

    #[tokio::test]
    async fn a_gzip_answer_is_decoded_and_a_plain_one_read_as_it_is() {
        let doc = "{\"applications\": {}}".repeat(100);
        let plain = text(answer(doc.clone().into_bytes(), None), 1 << 20).await;
        assert_eq!(plain.unwrap(), doc);
        let zipped = text(answer(gzip(doc.as_bytes()), Some("gzip")), 1 << 20).await;
        assert_eq!(zipped.unwrap(), doc);
        let identity = text(answer(doc.clone().into_bytes(), Some("identity")), 1 << 20).await;
        assert_eq!(identity.unwrap(), doc);
    }

    /// A body of `chunks`, then the end, or (`stall`) nothing ever again.
    struct Chunks {
        chunks: std::collections::VecDeque<Bytes>,
        stall: bool,
    }

    impl Body for Chunks {
        type Data = Bytes;
        type Error = std::convert::Infallible;
        fn poll_frame(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            match self.chunks.pop_front() {
                Some(data) => std::task::Poll::Ready(Some(Ok(Frame::data(data)))),
                None if self.stall => std::task::Poll::Pending,
                None => std::task::Poll::Ready(None),
            }
        }
    }

    fn chunked(data: &[u8], size: usize, stall: bool) -> hyper::Response<Chunks> {
        let chunks = data.chunks(size).map(Bytes::copy_from_slice).collect();
        hyper::Response::new(Chunks { chunks, stall })
    }

    #[tokio::test]
    async fn an_answer_over_the_bound_is_refused_decoded_or_not() {
        let doc = vec![b' '; 10_000];
        // Its length says so: refused before reading.
        let err = text(answer(doc.clone(), None), 9_999).await.unwrap_err();
        assert!(matches!(err, Unread::TooLarge(9_999)), "{err}");
        // Small compressed, too large decoded (a gzip bomb, in small).
        let zipped = gzip(&doc);
        assert!(zipped.len() < 1_000);
        let err = text(answer(zipped, Some("gzip")), 9_999).await.unwrap_err();
        assert!(matches!(err, Unread::TooLarge(9_999)), "{err}");
        // Without a length, as it streams in.
        let err = text(chunked(&doc, 1000, false), 9_999).await.unwrap_err();
        assert!(matches!(err, Unread::TooLarge(9_999)), "{err}");
        assert_eq!(
            text(chunked(&doc, 1000, false), 10_000)
                .await
                .unwrap()
                .len(),
            10_000
        );
    }

    #[tokio::test]
    async fn an_unknown_encoding_or_a_broken_gzip_answer_is_an_error() {
        let err = text(answer(b"{}".to_vec(), Some("br")), 100)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("\"br\""), "{err}");
        let broken = text(answer(b"not gzip".to_vec(), Some("gzip")), 100)
            .await
            .unwrap();
        assert!(broken.starts_with("error:"), "{broken}");
    }

    #[tokio::test]
    async fn an_answer_that_stalls_is_given_up_after_the_idle_bound() {
        // Real time: a blocking reader keeps paused time from advancing.
        let idle = Duration::from_millis(100);
        let stalled = chunked(b"{\"applications\"", 4, true);
        let bounds = Bounds {
            max_bytes: 1000,
            idle,
        };
        let err = read(stalled, bounds, |r| r.read_to_end(&mut Vec::new()))
            .await
            .unwrap_err();
        assert!(matches!(err, Unread::Idle(d) if d == idle), "{err}");
    }
}
