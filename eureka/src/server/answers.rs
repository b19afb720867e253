//! Written answers to the reads of the whole registry (`GET /apps`, `GET /apps/delta`), shared
//! by every reader: a thousand clients reading the registry cost one copy of it and one
//! conversion (and one compression), however they read and whatever is written meanwhile.
//!
//! - **One writer at a time.** For each document and form (JSON or XML, gzip or not), at most
//!   one answer is being written; readers that find the written one out of date wait for the
//!   next instead of writing their own (a single flight). Under a steady stream of writes to
//!   the registry, answers are written back to back by one thread, never by every reader at
//!   once: the memory and CPU that reads take are those of one writer per form.
//! - **Up to date.** A reader gets an answer written from the registry as it was when the
//!   reader arrived, or later: it waits for a write that started after its arrival, if the one
//!   in flight started before. Except that an answer is reused for `min_age` whatever was
//!   written since (`--eureka-response-cache-interval`, 0 by default: Eureka's servers reuse
//!   theirs for 30 s), and for at most [`MAX_AGE`] while nothing was written.
//! - **Off the async workers.** Writing an answer (a whole registry) is blocking work: the
//!   caller runs [`Answers::get`] on a blocking thread, and readers wait there, not on the
//!   workers that serve heartbeats and xDS.

use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

use axum::body::Bytes;
use tokio::time::Instant;

/// How long an answer is reused while the registry does not change (lease timestamps in it
/// move on meanwhile): Eureka's response cache does the same.
pub const MAX_AGE: Duration = Duration::from_secs(30);

/// A written answer, and the registry version it shows.
#[derive(Clone, Debug)]
pub struct Written {
    pub version: u64,
    pub at: Instant,
    pub body: Bytes,
}

/// The answers of one document, in each of its four forms ([`Answers::slot`]).
#[derive(Debug, Default)]
pub struct Answers {
    slots: [Slot; 4],
}

#[derive(Debug, Default)]
struct Slot {
    state: Mutex<SlotState>,
    written: Condvar,
}

#[derive(Debug, Default)]
struct SlotState {
    answer: Option<Written>,
    writing: bool,
}

impl Answers {
    /// The slot of a form.
    pub fn slot(json: bool, gzip: bool) -> usize {
        usize::from(json) + 2 * usize::from(gzip)
    }

    /// The answer in `slot` for a reader that arrived at `version`, at `now`, if the one
    /// written is fresh enough for it (see the module docs); never blocks for long, nor
    /// writes: the caller on an async worker takes it there, and goes to a blocking thread
    /// ([`Answers::get`]) only when it is not.
    pub fn fresh(
        &self,
        slot: usize,
        version: u64,
        now: Instant,
        min_age: Duration,
    ) -> Option<Bytes> {
        lock(&self.slots[slot].state).fresh(version, now, min_age)
    }

    /// The answer in `slot` for a reader that arrived at `version`, at `now` (see the module
    /// docs); written by `write` if it falls to this reader. Blocks while another reader
    /// writes it. `write` returns the version it wrote and the body.
    pub fn get(
        &self,
        slot: usize,
        version: u64,
        now: impl Fn() -> Instant,
        min_age: Duration,
        write: impl FnOnce() -> (u64, Bytes),
    ) -> Bytes {
        let slot = &self.slots[slot];
        let mut state = lock(&slot.state);
        loop {
            if let Some(body) = state.fresh(version, now(), min_age) {
                return body;
            }
            if !state.writing {
                break;
            }
            state = slot.written.wait(state).unwrap_or_else(|e| e.into_inner());
        }
        state.writing = true;
        drop(state);
        // Cleared even if `write` panics, so that no reader waits forever.
        let done = Done(slot);
        let (written, body) = write();
        let mut state = lock(&slot.state);
        state.answer = Some(Written {
            version: written,
            at: now(),
            body: body.clone(),
        });
        drop(state);
        drop(done);
        body
    }
}

impl SlotState {
    /// The written answer, if a reader that arrived at `version` may have it at `now`.
    fn fresh(&self, version: u64, now: Instant, min_age: Duration) -> Option<Bytes> {
        let answer = self.answer.as_ref()?;
        let age = now.saturating_duration_since(answer.at);
        (age < min_age || (answer.version >= version && age < MAX_AGE)).then(|| answer.body.clone())
    }
}

/// Ends a write: the slot is free again, and its waiters look at what was written.
struct Done<'a>(&'a Slot);

impl Drop for Done<'_> {
    fn drop(&mut self) {
        lock(&self.0.state).writing = false;
        self.0.written.notify_all();
    }
}

fn lock(state: &Mutex<SlotState>) -> MutexGuard<'_, SlotState> {
    state.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

    fn body(version: u64) -> (u64, Bytes) {
        (version, Bytes::from(format!("v{version}")))
    }

    #[test]
    fn readers_share_an_up_to_date_answer_and_a_newer_version_is_written_again() {
        let answers = Answers::default();
        let t0 = Instant::now();
        let now = || t0;
        let writes = AtomicUsize::new(0);
        let write = |v| {
            writes.fetch_add(1, Ordering::Relaxed);
            body(v)
        };
        assert_eq!(answers.get(0, 1, now, Duration::ZERO, || write(1)), "v1");
        assert_eq!(answers.get(0, 1, now, Duration::ZERO, || write(1)), "v1");
        assert_eq!(writes.load(Ordering::Relaxed), 1);
        assert_eq!(answers.get(0, 2, now, Duration::ZERO, || write(2)), "v2");
        assert_eq!(writes.load(Ordering::Relaxed), 2);
        // Another form has its own answer.
        assert_eq!(answers.get(1, 2, now, Duration::ZERO, || write(2)), "v2");
        assert_eq!(writes.load(Ordering::Relaxed), 3);
    }

    #[test]
    fn a_fresh_answer_is_taken_without_writing_and_a_stale_one_is_not() {
        let answers = Answers::default();
        let t0 = Instant::now();
        assert_eq!(
            answers.fresh(0, 1, t0, Duration::ZERO),
            None,
            "nothing written yet"
        );
        answers.get(0, 1, || t0, Duration::ZERO, || body(1));
        assert_eq!(answers.fresh(0, 1, t0, Duration::ZERO).unwrap(), "v1");
        assert_eq!(
            answers.fresh(1, 1, t0, Duration::ZERO),
            None,
            "another form"
        );
        // A reader that arrived at a later version, or once the answer is MAX_AGE old, must
        // wait for a new one: what `get` would write.
        assert_eq!(answers.fresh(0, 2, t0, Duration::ZERO), None);
        assert_eq!(answers.fresh(0, 1, t0 + MAX_AGE, Duration::ZERO), None);
        // Within min_age, whatever was written since.
        assert_eq!(
            answers.fresh(0, 2, t0, Duration::from_secs(1)).unwrap(),
            "v1"
        );
    }

    #[test]
    fn an_answer_is_reused_for_min_age_and_for_max_age_while_nothing_changes() {
        let answers = Answers::default();
        let t0 = Instant::now();
        let min_age = Duration::from_secs(5);
        answers.get(0, 1, || t0, min_age, || body(1));
        // Version 2 within min_age: the answer of version 1.
        let soon = || t0 + Duration::from_secs(4);
        assert_eq!(answers.get(0, 2, soon, min_age, || body(2)), "v1");
        let later = || t0 + Duration::from_secs(5);
        assert_eq!(answers.get(0, 2, later, min_age, || body(2)), "v2");
        // Nothing changes: written again once it is MAX_AGE old.
        let old = || t0 + Duration::from_secs(5) + MAX_AGE;
        assert_eq!(answers.get(0, 2, old, min_age, || body(3)), "v3");
    }

    #[test]
    fn concurrent_readers_wait_for_one_writer_instead_of_writing_their_own() {
        let answers = Arc::new(Answers::default());
        let writes = Arc::new(AtomicUsize::new(0));
        let version = Arc::new(AtomicU64::new(1));
        let t0 = Instant::now();
        let readers: Vec<_> = (0..16)
            .map(|_| {
                let (answers, writes, version) = (answers.clone(), writes.clone(), version.clone());
                std::thread::spawn(move || {
                    for _ in 0..20 {
                        let arrived = version.load(Ordering::SeqCst);
                        let got = answers.get(
                            0,
                            arrived,
                            || t0,
                            Duration::ZERO,
                            || {
                                writes.fetch_add(1, Ordering::SeqCst);
                                std::thread::sleep(Duration::from_millis(2));
                                let v = version.load(Ordering::SeqCst);
                                body(v)
                            },
                        );
                        // Never older than the registry when the reader arrived.
                        let shown: u64 = std::str::from_utf8(&got[1..]).unwrap().parse().unwrap();
                        assert!(shown >= arrived, "{shown} < {arrived}");
                    }
                })
            })
            .collect();
        // A writer changes the registry meanwhile.
        for _ in 0..50 {
            version.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(1));
        }
        for r in readers {
            r.join().unwrap();
        }
        // 320 reads; at most one write per version change (51 versions), and far fewer than
        // the reads.
        let writes = writes.load(Ordering::SeqCst);
        assert!(
            writes <= 52,
            "{writes} answers written for 320 reads of 51 versions"
        );
    }
}
