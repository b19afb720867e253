//! Bounded polling for the crates' async tests (the `testing` feature, and this crate's own
//! tests): the one way a unit or integration test waits for something to happen. The
//! end-to-end harness has its blocking twin (`odmesh_e2e::wait`), with the same messages.
//!
//! In tokio's time: under a paused clock (`start_paused`) a wait takes no real time.

use std::fmt::Display;
use std::time::Duration;

use tokio::time::{Instant, sleep};

/// How long the waits sleep between two polls.
pub const POLL_INTERVAL: Duration = Duration::from_millis(10);

/// Polls `condition` until it holds, for at most `timeout`; panics naming `what` otherwise.
///
/// `what` completes the sentence "timed out after 5s waiting for ...".
pub async fn wait_until(timeout: Duration, what: &str, mut condition: impl FnMut() -> bool) {
    wait_ok(timeout, what, async || condition().then_some(()).ok_or("")).await;
}

/// Polls `poll` until it returns `Ok`, for at most `timeout`, and returns the value; panics
/// naming `what` and the last `Err` (what it saw instead) otherwise.
pub async fn wait_ok<T, E: Display>(
    timeout: Duration,
    what: &str,
    mut poll: impl AsyncFnMut() -> Result<T, E>,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        match poll().await {
            Ok(value) => return value,
            Err(last) if Instant::now() >= deadline => {
                let last = last.to_string();
                if last.is_empty() {
                    panic!("timed out after {timeout:?} waiting for {what}");
                }
                panic!("timed out after {timeout:?} waiting for {what}; last seen: {last}");
            }
            Err(_) => sleep(POLL_INTERVAL).await,
        }
    }
}

/// A connection to `addr` from the loopback address `from` (all of 127.0.0.0/8 is the
/// loopback interface's on Linux): a second client address for tests of per-source bounds.
pub async fn connect_from(from: [u8; 4], addr: std::net::SocketAddr) -> tokio::net::TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().expect("a socket");
    let local = (std::net::Ipv4Addr::from(from), 0).into();
    socket
        .bind(local)
        .unwrap_or_else(|e| panic!("bind {local}: {e}"));
    (socket.connect(addr).await).unwrap_or_else(|e| panic!("connect {addr} from {local}: {e}"))
}

/// Polls `condition` for the whole of `duration` and panics naming `what` the first time it
/// does not hold: a bounded check that something stays true.
///
/// `what` completes the sentence "... stopped holding after 300ms".
pub async fn hold_for(duration: Duration, what: &str, mut condition: impl FnMut() -> bool) {
    let start = Instant::now();
    loop {
        assert!(
            condition(),
            "{what} stopped holding after {:?}",
            start.elapsed()
        );
        if start.elapsed() >= duration {
            return;
        }
        sleep(POLL_INTERVAL).await;
    }
}

/// The path of fixture `name` under `base/testdata/` (the TLS test certificates).
pub fn testdata(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("testdata")
        .join(name)
}

/// A server's certificate and key in a folder of their own, which a test replaces as an
/// operator would (a copy renamed into place); the folder goes when this is dropped.
pub struct TlsFolder {
    dir: std::path::PathBuf,
}

impl TlsFolder {
    /// A new folder, `label` and the process id in its name, holding the test server
    /// certificate and key as `cert.pem` and `key.pem`.
    pub fn new(label: &str) -> TlsFolder {
        let dir = std::env::temp_dir().join(format!("odmesh-{label}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let folder = TlsFolder { dir };
        folder.install("tls/server.pem", "cert.pem");
        folder.install("tls/server.key", "key.pem");
        folder
    }

    /// Puts fixture `fixture` in the folder as `name`, renamed into place; returns its path.
    pub fn install(&self, fixture: &str, name: &str) -> std::path::PathBuf {
        let (tmp, path) = (self.dir.join(format!("{name}.tmp")), self.dir.join(name));
        std::fs::copy(testdata(fixture), &tmp).unwrap_or_else(|e| panic!("{fixture}: {e}"));
        std::fs::rename(&tmp, &path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        path
    }

    /// The certificate and key, with no client CA.
    pub fn files(&self) -> crate::tls::ServerTlsFiles {
        crate::tls::ServerTlsFiles {
            cert: self.dir.join("cert.pem"),
            key: self.dir.join("key.pem"),
            client_ca: None,
        }
    }
}

impl Drop for TlsFolder {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;

    use futures::FutureExt;

    use super::*;

    /// The message `wait` panicked with.
    async fn panic_message(wait: impl Future<Output = ()>) -> String {
        let payload = std::panic::AssertUnwindSafe(wait)
            .catch_unwind()
            .await
            .expect_err("must panic");
        payload
            .downcast_ref::<String>()
            .cloned()
            .unwrap_or_default()
    }

    #[tokio::test]
    async fn wait_ok_returns_the_first_value_the_poll_yields() {
        let mut calls = 0;
        let v = wait_ok(Duration::from_secs(1), "the third call", async || {
            calls += 1;
            if calls == 3 { Ok(calls) } else { Err("") }
        })
        .await;
        assert_eq!(v, 3);
    }

    #[tokio::test]
    async fn wait_until_panics_naming_what_it_waited_for() {
        let msg = panic_message(wait_until(
            Duration::from_millis(50),
            "a condition that never holds",
            || false,
        ))
        .await;
        assert_eq!(
            msg,
            "timed out after 50ms waiting for a condition that never holds"
        );
    }

    #[tokio::test]
    async fn wait_ok_panics_naming_what_it_saw_last() {
        let msg = panic_message(async {
            wait_ok(Duration::from_millis(50), "a zero", async || {
                Err::<(), _>("a one")
            })
            .await;
        })
        .await;
        assert_eq!(
            msg,
            "timed out after 50ms waiting for a zero; last seen: a one"
        );
    }

    #[tokio::test]
    async fn hold_for_panics_when_the_condition_stops_holding() {
        let mut calls = 0;
        let msg = panic_message(hold_for(
            Duration::from_secs(5),
            "the first two calls",
            || {
                calls += 1;
                calls <= 2
            },
        ))
        .await;
        assert!(msg.contains("the first two calls stopped holding"), "{msg}");
    }
}
