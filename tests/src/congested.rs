//! An upstream that slows down as it gets busy: each request takes `base` plus `per` for every
//! request already in flight when it arrives, as a server whose threads, locks or database
//! queue up does. What an adaptive concurrency limit is tested against (`tests/tests/limits.rs`).
//!
//! HTTP/1.1, one thread per connection (Envoy opens one per request in flight), every request
//! answered `200` with a small JSON body once its time has passed. [`CongestedUpstream::set_per`]
//! changes `per` while it runs (0: the upstream "recovers"); [`CongestedUpstream::max_in_flight`]
//! is the most requests it ever held at once since the last [`CongestedUpstream::reset_max`].

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::thread;
use std::time::Duration;

/// The upstream; dropping it stops accepting (connections end with their client).
pub struct CongestedUpstream {
    addr: SocketAddr,
    state: Arc<State>,
}

struct State {
    base_ms: u64,
    per_ms: AtomicU64,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    stopped: AtomicBool,
}

impl CongestedUpstream {
    /// Starts on a free loopback port: `base` plus `per` per request in flight.
    pub fn start(base: Duration, per: Duration) -> CongestedUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the congested upstream");
        let addr = listener.local_addr().expect("its address");
        let state = Arc::new(State {
            base_ms: u64::try_from(base.as_millis()).unwrap_or(u64::MAX),
            per_ms: AtomicU64::new(u64::try_from(per.as_millis()).unwrap_or(u64::MAX)),
            in_flight: AtomicUsize::new(0),
            max_in_flight: AtomicUsize::new(0),
            stopped: AtomicBool::new(false),
        });
        let shared = state.clone();
        thread::spawn(move || {
            for stream in listener.incoming() {
                if shared.stopped.load(Ordering::Relaxed) {
                    break;
                }
                let Ok(stream) = stream else { continue };
                let state = shared.clone();
                thread::spawn(move || serve(&state, stream));
            }
        });
        CongestedUpstream { addr, state }
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// From now on, each request in flight adds `per`.
    pub fn set_per(&self, per: Duration) {
        let ms = u64::try_from(per.as_millis()).unwrap_or(u64::MAX);
        self.state.per_ms.store(ms, Ordering::Relaxed);
    }

    /// The most requests held at once since the start or the last [`Self::reset_max`].
    pub fn max_in_flight(&self) -> usize {
        self.state.max_in_flight.load(Ordering::Relaxed)
    }

    pub fn reset_max(&self) {
        self.state.max_in_flight.store(0, Ordering::Relaxed);
    }
}

impl Drop for CongestedUpstream {
    fn drop(&mut self) {
        self.state.stopped.store(true, Ordering::Relaxed);
        // Wake the accepting thread so that it sees the flag.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(100));
    }
}

/// Answers the requests of one connection until it closes.
fn serve(state: &State, stream: TcpStream) {
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    loop {
        // The request head (Envoy's requests here have no body: GETs).
        let mut line = String::new();
        let mut head_lines = 0;
        loop {
            line.clear();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) if line == "\r\n" || line == "\n" => break,
                Ok(_) => head_lines += 1,
            }
        }
        if head_lines == 0 || state.stopped.load(Ordering::Relaxed) {
            return;
        }
        let before = state.in_flight.fetch_add(1, Ordering::Relaxed);
        state.max_in_flight.fetch_max(before + 1, Ordering::Relaxed);
        let wait = state.base_ms + state.per_ms.load(Ordering::Relaxed) * before as u64;
        thread::sleep(Duration::from_millis(wait));
        state.in_flight.fetch_sub(1, Ordering::Relaxed);
        let body = format!("{{\"in_flight\": {before}, \"ms\": {wait}}}");
        let answer = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        if writer.write_all(answer.as_bytes()).is_err() {
            return;
        }
    }
}
