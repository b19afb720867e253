//! Bounded polling: the only way tests wait for something to happen.

use std::thread;
use std::time::{Duration, Instant};

/// How long [`wait_until`] and [`wait_for`] sleep between two polls.
pub const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// Polls `condition` until it holds, for at most `timeout`; panics naming `what` otherwise.
///
/// `what` completes the sentence "timed out after 5s waiting for ...".
pub fn wait_until(timeout: Duration, what: &str, mut condition: impl FnMut() -> bool) {
    wait_for(timeout, what, || condition().then_some(()));
}

/// Polls `poll` until it returns `Some`, for at most `timeout`, and returns the value; panics
/// naming `what` otherwise.
pub fn wait_for<T>(timeout: Duration, what: &str, mut poll: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = poll() {
            return value;
        }
        if Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        thread::sleep(POLL_INTERVAL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_for_returns_the_first_value_the_poll_yields() {
        let mut calls = 0;
        let v = wait_for(Duration::from_secs(1), "the third call", || {
            calls += 1;
            (calls == 3).then_some(calls)
        });
        assert_eq!(v, 3);
    }

    #[test]
    fn wait_until_panics_naming_what_it_waited_for() {
        let result = std::panic::catch_unwind(|| {
            wait_until(
                Duration::from_millis(50),
                "a condition that never holds",
                || false,
            )
        });
        let payload = result.expect_err("must time out");
        let msg = payload
            .downcast_ref::<String>()
            .cloned()
            .unwrap_or_default();
        assert!(
            msg.contains("waiting for a condition that never holds"),
            "{msg}"
        );
    }
}
