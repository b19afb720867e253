//! Bounded polling: the only way tests wait for something to happen.

use std::fmt::Display;
use std::thread;
use std::time::{Duration, Instant};

/// How long [`wait_until`], [`wait_for`] and [`wait_ok`] sleep between two polls.
pub const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// How soon a registry change must reach Envoy and route (README, "How it works": within 2 s).
pub const CHANGE_DEADLINE: Duration = Duration::from_secs(2);

/// Polls `condition` until it holds, for at most `timeout`; panics naming `what` otherwise.
///
/// `what` completes the sentence "timed out after 5s waiting for ...".
pub fn wait_until(timeout: Duration, what: &str, mut condition: impl FnMut() -> bool) {
    wait_for(timeout, what, || condition().then_some(()));
}

/// Polls `poll` until it returns `Some`, for at most `timeout`, and returns the value; panics
/// naming `what` otherwise.
pub fn wait_for<T>(timeout: Duration, what: &str, mut poll: impl FnMut() -> Option<T>) -> T {
    wait_ok_every(POLL_INTERVAL, timeout, what, || poll().ok_or(""))
}

/// Polls `poll` until it returns `Ok`, for at most `timeout`, and returns the value; panics
/// naming `what` and the last `Err` (what it saw instead) otherwise.
pub fn wait_ok<T, E: Display>(
    timeout: Duration,
    what: &str,
    poll: impl FnMut() -> Result<T, E>,
) -> T {
    wait_ok_every(POLL_INTERVAL, timeout, what, poll)
}

/// [`wait_ok`] polling every `interval`: for a poll that costs its target something (e.g. a
/// line in its log).
pub fn wait_ok_every<T, E: Display>(
    interval: Duration,
    timeout: Duration,
    what: &str,
    mut poll: impl FnMut() -> Result<T, E>,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        match poll() {
            Ok(value) => return value,
            Err(last) if Instant::now() >= deadline => {
                let last = last.to_string();
                if last.is_empty() {
                    panic!("timed out after {timeout:?} waiting for {what}");
                }
                panic!("timed out after {timeout:?} waiting for {what}; last seen: {last}");
            }
            Err(_) => thread::sleep(interval),
        }
    }
}

/// Polls `condition` for the whole of `duration` and panics naming `what` the first time it
/// does not hold: a bounded check that something stays true (or stays quiet).
///
/// `what` completes the sentence "... stopped holding after 300ms: ...".
pub fn hold_for(duration: Duration, what: &str, mut condition: impl FnMut() -> bool) {
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
        thread::sleep(POLL_INTERVAL);
    }
}

/// Polls `condition` until it holds, at most until `limit` after `since` (an event in the
/// past, e.g. a file write); returns the time from `since` to the first poll that saw it
/// hold. Panics naming `what` when the deadline passes.
pub fn wait_until_since(
    since: Instant,
    limit: Duration,
    what: &str,
    mut condition: impl FnMut() -> bool,
) -> Duration {
    let timeout = limit.saturating_sub(since.elapsed());
    wait_for(
        timeout,
        &format!("{what} (at most {limit:?} after the change)"),
        || condition().then(|| since.elapsed()),
    )
}

/// Runs `f` and returns its value with how long it took.
pub fn timed<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let start = Instant::now();
    let value = f();
    (value, start.elapsed())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::panic_message;

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
    fn hold_for_panics_when_the_condition_stops_holding() {
        let mut calls = 0;
        let msg = panic_message(move || {
            hold_for(Duration::from_secs(5), "the first two calls", || {
                calls += 1;
                calls <= 2
            })
        });
        assert!(msg.contains("the first two calls stopped holding"), "{msg}");
    }

    #[test]
    fn wait_ok_panics_naming_what_it_waited_for_and_what_it_saw_last() {
        let mut calls = 0;
        let msg = panic_message(move || {
            wait_ok(Duration::from_millis(50), "a zero", || {
                calls += 1;
                Err::<(), _>(format!("call {calls} saw one"))
            })
        });
        assert!(
            msg.contains("waiting for a zero; last seen: call "),
            "{msg}"
        );
        assert!(msg.ends_with("saw one"), "{msg}");
    }

    #[test]
    fn wait_until_panics_naming_what_it_waited_for() {
        let msg = panic_message(move || {
            wait_until(
                Duration::from_millis(50),
                "a condition that never holds",
                || false,
            )
        });
        assert!(
            msg.contains("waiting for a condition that never holds"),
            "{msg}"
        );
    }
}
