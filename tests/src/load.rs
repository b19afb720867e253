//! Steady, bounded load through Envoy, with every request's outcome counted: what a chaos
//! test runs while it breaks something.
//!
//! A [`Load`] sends `rate` requests per second, spread evenly, from a pool of at most
//! `max_in_flight` threads, each request bounded by `timeout`, until [`Load::stop`] (or the
//! drop of the [`Load`], so a failing test leaves no thread behind). A tick that finds every
//! thread busy sends nothing and is counted as *not sent*: the load stays open-loop.
//!
//! A test asserts what the mesh did with the requests sent: none failed (a non-2xx answer or
//! a transport error, [`LoadReport::assert_no_failures`]) and none was answered late
//! ([`LoadReport::assert_answered_within`], with a bound far above what the mesh takes, so
//! that a busy machine makes requests slower but only a stall fails). Ticks not sent and
//! gaps between request starts are the generator's own misses (every thread busy, or its
//! scheduling thread not given the CPU): the report shows them, no assertion fails on them.
//! That a phase had load a test shows by waiting for it, [`Load::wait_completed`] while the
//! fault is in place.
//!
//! [`Load::mark`] notes an event ("killed the control plane"); the [`LoadReport`] places
//! every failure relative to the start and to the marks, and counts outcomes per label (the
//! `Host`) and per second:
//!
//! ```no_run
//! # use std::time::Duration;
//! # use odmesh_e2e::{Load, LoadConfig};
//! # let egress: std::net::SocketAddr = "127.0.0.1:15001".parse().unwrap();
//! let load = Load::hosts(egress, &["hello", "other"], LoadConfig::rate(100));
//! load.wait_completed(50, Duration::from_secs(5));
//! load.mark("killed the control plane");
//! // ... break something, wait for what must happen ...
//! load.wait_completed(50, Duration::from_secs(5)); // 50 requests while it is broken
//! // ... repair it ...
//! let report = load.stop();
//! eprintln!("{}", report.summary());
//! report.assert_no_failures(&["hello", "other"]);
//! report.assert_answered_within(Duration::from_millis(500));
//! ```

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::{self, Write as _};
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::http::{Connection, Request, Response, send_raw_within};
use crate::lock;
use crate::wait::wait_for;

/// The longest a request through the mesh may take while something breaks (a control plane,
/// a replica, a registry server dies; an upstream drains): Envoy answers a VIP it holds in
/// about a millisecond without asking the control plane or any registry, so only a request
/// the mesh held takes this long, not one a busy machine slowed. The bound of
/// [`LoadReport::assert_answered_within`] in the chaos tests; a test whose upstream or
/// machine is slower states its own.
pub const MAX_LATENCY: Duration = Duration::from_millis(500);
/// How many bytes of a failed response's body a [`Record`] keeps.
pub const BODY_PREFIX: usize = 300;
/// How many requests a list in a report shows: the failures in [`LoadReport::describe`], the
/// late requests of [`LoadReport::assert_answered_within`].
const RECORDS_SHOWN: usize = 20;

/// How a [`Load`] runs.
#[derive(Clone, Debug)]
pub struct LoadConfig {
    /// Requests per second, spread evenly (one every `1 s / rate`).
    pub rate: u32,
    /// At most this many requests in flight, one thread each.
    pub max_in_flight: usize,
    /// The bound on each request: connecting, sending and reading the whole response.
    pub timeout: Duration,
    /// Each thread keeps its connection alive across requests (otherwise every request
    /// opens its own and says `connection: close`).
    pub keep_alive: bool,
    /// A response header whose value each [`Record`] keeps (e.g. `x-echo-upstream`: which
    /// instance answered).
    pub record_header: Option<String>,
    /// Each [`Record`] keeps the start of its body, a 2xx's too (an upstream that names itself
    /// only in its body, e.g. a Eureka client driver's `hello from <id>`).
    pub record_body: bool,
}

impl LoadConfig {
    /// `rate` requests per second, at most 16 in flight, 2 s per request, a connection per
    /// request.
    pub fn rate(rate: u32) -> LoadConfig {
        LoadConfig {
            rate,
            max_in_flight: 16,
            timeout: Duration::from_secs(2),
            keep_alive: false,
            record_header: None,
            record_body: false,
        }
    }

    /// Sets how many requests may be in flight at once.
    pub fn max_in_flight(mut self, max_in_flight: usize) -> LoadConfig {
        self.max_in_flight = max_in_flight;
        self
    }

    /// Sets the bound on each request.
    pub fn timeout(mut self, timeout: Duration) -> LoadConfig {
        self.timeout = timeout;
        self
    }

    /// Keeps each thread's connection alive across requests.
    pub fn keep_alive(mut self) -> LoadConfig {
        self.keep_alive = true;
        self
    }

    /// Keeps the value of response header `name` in each [`Record`].
    pub fn record_header(mut self, name: &str) -> LoadConfig {
        self.record_header = Some(name.to_owned());
        self
    }

    /// Keeps the start of every response's body in its [`Record`], not only a failure's.
    pub fn record_body(mut self) -> LoadConfig {
        self.record_body = true;
        self
    }
}

/// What became of one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// A whole response with this status.
    Status(u16),
    /// No whole response: the transport failed (refused, reset, closed early, timed out).
    Error {
        /// The kind, e.g. `TimedOut`, `ConnectionRefused`, `UnexpectedEof`.
        kind: io::ErrorKind,
        /// The error's message.
        message: String,
    },
}

impl Outcome {
    /// Whether it is a 2xx response.
    pub fn is_success(&self) -> bool {
        matches!(self, Outcome::Status(s) if (200..300).contains(s))
    }

    /// The key the report counts it under: `200`, `503`, `error TimedOut`.
    pub fn key(&self) -> String {
        match self {
            Outcome::Status(status) => status.to_string(),
            Outcome::Error { kind, .. } => format!("error {kind:?}"),
        }
    }
}

/// One request that was sent.
#[derive(Clone, Debug)]
pub struct Record {
    /// Its number in the schedule (0, 1, ...; skipped ticks have numbers too).
    pub seq: u64,
    /// The `Host` for [`Load::hosts`], or the label the closure of [`Load::requests`] gave.
    pub label: Arc<str>,
    /// When the schedule wanted it sent, from the start of the load.
    pub scheduled: Duration,
    /// When a thread started it, from the start of the load.
    pub sent: Duration,
    /// From start to a whole response (or to the error).
    pub latency: Duration,
    /// The status, or the transport error.
    pub outcome: Outcome,
    /// For a non-2xx response (for any, with [`LoadConfig::record_body`]), the first
    /// [`BODY_PREFIX`] bytes of its body (lossy UTF-8).
    pub body: Option<String>,
    /// The value of [`LoadConfig::record_header`] in the response, if it had one.
    pub header: Option<String>,
}

/// A tick of the schedule that sent nothing, because `max_in_flight` requests were still
/// in flight: the generator's own miss, reported, never asserted.
#[derive(Clone, Debug)]
pub struct Skipped {
    /// Its number in the schedule.
    pub seq: u64,
    /// The label the request would have had.
    pub label: Arc<str>,
    /// When the schedule wanted it sent, from the start of the load.
    pub scheduled: Duration,
}

/// An event a test marked while the load ran.
#[derive(Clone, Debug)]
pub struct Mark {
    /// What happened, e.g. `killed the control plane`.
    pub name: String,
    /// When, from the start of the load.
    pub at: Duration,
}

/// Counts so far, while the load runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    /// Requests started.
    pub sent: u64,
    /// Requests finished (answered or failed in transport).
    pub completed: u64,
    /// Finished requests that were not a 2xx response.
    pub failed: u64,
    /// Ticks that sent nothing (every thread busy): reported, not asserted.
    pub skipped: u64,
}

/// A request the closure of [`Load::requests`] makes: a label to count it under, and the
/// request.
pub type Shot = (String, Request);

/// A running load; stopped by [`Load::stop`], or when dropped.
pub struct Load {
    shared: Arc<Shared>,
    config: LoadConfig,
    stop: Option<Sender<()>>,
    scheduler: Option<JoinHandle<()>>,
    workers: Vec<JoinHandle<()>>,
}

struct Shared {
    start: Instant,
    records: Mutex<Vec<Record>>,
    skipped: Mutex<Vec<Skipped>>,
    marks: Mutex<Vec<Mark>>,
    in_flight: AtomicUsize,
    dispatched: AtomicU64,
    failed: AtomicU64,
    retries: AtomicU64,
}

struct Job {
    seq: u64,
    label: Arc<str>,
    scheduled: Duration,
    request: Request,
}

impl Load {
    /// Sends `GET /` to `addr` with each of `hosts` in turn as `Host`, counted per Host.
    pub fn hosts(addr: SocketAddr, hosts: &[&str], config: LoadConfig) -> Load {
        assert!(!hosts.is_empty(), "a load needs at least one Host");
        let requests: Vec<(String, Request)> = hosts
            .iter()
            .map(|h| ((*h).to_owned(), Request::get("/").host(h)))
            .collect();
        Load::requests(addr, config, move |seq| {
            requests[(seq % requests.len() as u64) as usize].clone()
        })
    }

    /// Sends to `addr` the request `make(seq)` returns for each tick `seq` (0, 1, ...),
    /// counted under its label. `make` runs on the scheduling thread, once per tick (also
    /// for a tick that sends nothing), so it must be quick.
    pub fn requests(
        addr: SocketAddr,
        config: LoadConfig,
        make: impl FnMut(u64) -> Shot + Send + 'static,
    ) -> Load {
        assert!(config.rate > 0, "a load needs a rate above 0");
        assert!(
            config.max_in_flight > 0,
            "a load needs max_in_flight above 0"
        );
        let shared = Arc::new(Shared {
            start: Instant::now(),
            records: Mutex::new(Vec::new()),
            skipped: Mutex::new(Vec::new()),
            marks: Mutex::new(Vec::new()),
            in_flight: AtomicUsize::new(0),
            dispatched: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            retries: AtomicU64::new(0),
        });
        let (jobs_tx, jobs_rx) = mpsc::channel::<Job>();
        let jobs_rx = Arc::new(Mutex::new(jobs_rx));
        let workers = (0..config.max_in_flight)
            .map(|i| {
                let (shared, jobs, config) = (shared.clone(), jobs_rx.clone(), config.clone());
                thread::Builder::new()
                    .name(format!("load worker {i}"))
                    .spawn(move || work(&shared, &jobs, addr, &config))
                    .unwrap_or_else(|e| panic!("cannot start a load thread: {e}"))
            })
            .collect();
        let (stop_tx, stop_rx) = mpsc::channel::<()>();
        let scheduler = {
            let (shared, config) = (shared.clone(), config.clone());
            thread::Builder::new()
                .name("load scheduler".to_owned())
                .spawn(move || schedule(&shared, &config, &stop_rx, &jobs_tx, make))
                .unwrap_or_else(|e| panic!("cannot start the load's scheduler: {e}"))
        };
        Load {
            shared,
            config,
            stop: Some(stop_tx),
            scheduler: Some(scheduler),
            workers,
        }
    }

    /// Notes that `event` happened now (e.g. `killed the control plane`); returns the time
    /// since the load started.
    pub fn mark(&self, event: &str) -> Duration {
        let at = self.shared.start.elapsed();
        lock(&self.shared.marks).push(Mark {
            name: event.to_owned(),
            at,
        });
        at
    }

    /// The counts so far.
    pub fn progress(&self) -> Progress {
        Progress {
            sent: self.shared.dispatched.load(Ordering::SeqCst),
            completed: lock(&self.shared.records).len() as u64,
            failed: self.shared.failed.load(Ordering::SeqCst),
            skipped: lock(&self.shared.skipped).len() as u64,
        }
    }

    /// Waits at most `timeout` until `n` requests sent from now on have finished (answered,
    /// or failed in transport); returns the progress then. Panics if the time runs out.
    ///
    /// This is how a test shows that a phase had load: called while a fault is in place, it
    /// returns once `n` requests went through the mesh with the fault, however slowly the
    /// machine let the load send them (so the report has at least `n` requests
    /// [`LoadReport::sent_between`] a mark made just before the call and one made after it
    /// returns).
    pub fn wait_completed(&self, n: u64, timeout: Duration) -> Progress {
        let since = self.shared.start.elapsed();
        let what = format!(
            "the load to complete {n} requests sent from {:.3}s on",
            since.as_secs_f64()
        );
        wait_for(timeout, &what, || {
            let records = lock(&self.shared.records);
            let done = records.iter().filter(|r| r.sent >= since).count() as u64;
            drop(records);
            (done >= n).then(|| self.progress())
        })
    }

    /// Stops scheduling, waits for the requests in flight (each is bounded by the timeout),
    /// and returns the report. Panics if a request was sent but never recorded.
    pub fn stop(mut self) -> LoadReport {
        self.halt();
        let duration = self.shared.start.elapsed();
        let dispatched = self.shared.dispatched.load(Ordering::SeqCst);
        let mut records = std::mem::take(&mut *lock(&self.shared.records));
        records.sort_by_key(|r| (r.sent, r.seq));
        let skipped = std::mem::take(&mut *lock(&self.shared.skipped));
        let marks = std::mem::take(&mut *lock(&self.shared.marks));
        assert_eq!(
            records.len() as u64,
            dispatched,
            "the load sent {dispatched} requests but recorded {}: a load thread died",
            records.len()
        );
        LoadReport {
            config: self.config.clone(),
            duration,
            records,
            skipped,
            marks,
            retries: self.shared.retries.load(Ordering::SeqCst),
        }
    }

    /// Ends the scheduler, then the workers (after the requests in flight).
    fn halt(&mut self) {
        self.stop.take();
        let mut panicked = Vec::new();
        if let Some(scheduler) = self.scheduler.take()
            && scheduler.join().is_err()
        {
            panicked.push("the scheduler (the request closure panicked?)");
        }
        for worker in self.workers.drain(..) {
            if worker.join().is_err() {
                panicked.push("a worker");
            }
        }
        if !panicked.is_empty() && !thread::panicking() {
            panic!("load threads panicked: {}", panicked.join(", "));
        }
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.halt();
    }
}

/// The scheduling thread: one tick every `1 s / rate`, until told to stop.
fn schedule(
    shared: &Shared,
    config: &LoadConfig,
    stop: &Receiver<()>,
    jobs: &Sender<Job>,
    mut make: impl FnMut(u64) -> Shot,
) {
    let mut labels: HashMap<String, Arc<str>> = HashMap::new();
    for seq in 0u64.. {
        let scheduled = Duration::from_nanos(
            u64::try_from(u128::from(seq) * 1_000_000_000 / u128::from(config.rate))
                .unwrap_or(u64::MAX),
        );
        let wait = (shared.start + scheduled).saturating_duration_since(Instant::now());
        match stop.recv_timeout(wait) {
            Err(RecvTimeoutError::Timeout) => {}
            Ok(()) | Err(RecvTimeoutError::Disconnected) => return,
        }
        let (label, request) = make(seq);
        let label = match labels.get(&label) {
            Some(interned) => interned.clone(),
            None => {
                let interned: Arc<str> = Arc::from(label.as_str());
                labels.insert(label, interned.clone());
                interned
            }
        };
        if shared.in_flight.load(Ordering::SeqCst) >= config.max_in_flight {
            lock(&shared.skipped).push(Skipped {
                seq,
                label,
                scheduled,
            });
            continue;
        }
        shared.in_flight.fetch_add(1, Ordering::SeqCst);
        shared.dispatched.fetch_add(1, Ordering::SeqCst);
        let job = Job {
            seq,
            label,
            scheduled,
            request,
        };
        if jobs.send(job).is_err() {
            return;
        }
    }
}

/// A worker thread: takes jobs until the scheduler is gone and the queue is empty.
fn work(shared: &Shared, jobs: &Mutex<Receiver<Job>>, addr: SocketAddr, config: &LoadConfig) {
    let mut conn = config.keep_alive.then(|| Connection::new(addr));
    loop {
        let job = {
            let jobs = lock(jobs);
            jobs.recv()
        };
        let Ok(job) = job else {
            break;
        };
        let sent = shared.start.elapsed();
        let started = Instant::now();
        let result = match conn.as_mut() {
            Some(conn) => conn.send(&job.request, config.timeout),
            None => send_raw_within(addr, &job.request.to_bytes(), config.timeout),
        };
        let latency = started.elapsed();
        let record = record(job, sent, latency, result, config);
        if !record.outcome.is_success() {
            shared.failed.fetch_add(1, Ordering::SeqCst);
        }
        lock(&shared.records).push(record);
        shared.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
    if let Some(conn) = conn {
        shared.retries.fetch_add(conn.retries(), Ordering::SeqCst);
    }
}

fn record(
    job: Job,
    sent: Duration,
    latency: Duration,
    result: io::Result<Response>,
    config: &LoadConfig,
) -> Record {
    let kept = match (&result, config.record_header.as_deref()) {
        (Ok(response), Some(name)) => response.header(name).map(str::to_owned),
        _ => None,
    };
    let (outcome, body) = match result {
        Ok(response) => {
            let outcome = Outcome::Status(response.status);
            let body = (config.record_body || !outcome.is_success()).then(|| {
                let end = response.body.len().min(BODY_PREFIX);
                String::from_utf8_lossy(&response.body[..end]).into_owned()
            });
            (outcome, body)
        }
        Err(error) => (
            Outcome::Error {
                kind: error.kind(),
                message: error.to_string(),
            },
            None,
        ),
    };
    Record {
        seq: job.seq,
        label: job.label,
        scheduled: job.scheduled,
        sent,
        latency,
        outcome,
        body,
        header: kept,
    }
}

/// The longest time in which the load started no request: reported, not asserted (on a
/// busy machine the generator makes such gaps itself; a stall of the mesh shows in the
/// requests' latency).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pause {
    /// When it began (the start of the load, or a request's start), from the start.
    pub from: Duration,
    /// When it ended (a request's start, or the stop), from the start.
    pub to: Duration,
}

impl Pause {
    /// How long it lasted.
    pub fn length(&self) -> Duration {
        self.to.saturating_sub(self.from)
    }
}

/// What a [`Load`] did, from [`Load::stop`]: every request sent, every tick not sent, the
/// marks. Its [`Display`](fmt::Display) is [`LoadReport::describe`].
#[derive(Clone, Debug)]
pub struct LoadReport {
    /// How it ran.
    pub config: LoadConfig,
    /// From the start to the stop.
    pub duration: Duration,
    /// Every request sent, in the order they were sent.
    pub records: Vec<Record>,
    /// Every tick that sent nothing (reported, not asserted).
    pub skipped: Vec<Skipped>,
    /// The events the test marked, in order.
    pub marks: Vec<Mark>,
    /// Requests sent again on a new connection because a kept-alive one was found closed
    /// (see [`Connection`]).
    pub retries: u64,
}

impl LoadReport {
    /// Requests sent.
    pub fn sent(&self) -> usize {
        self.records.len()
    }

    /// Requests answered with a whole response (any status).
    pub fn answered(&self) -> usize {
        self.records
            .iter()
            .filter(|r| matches!(r.outcome, Outcome::Status(_)))
            .count()
    }

    /// Requests that got no whole response.
    pub fn transport_errors(&self) -> usize {
        self.records
            .iter()
            .filter(|r| matches!(r.outcome, Outcome::Error { .. }))
            .count()
    }

    /// Outcome counts per label: label → outcome key (`200`, `503`, `error TimedOut`, and
    /// `not sent` for skipped ticks) → count.
    pub fn totals(&self) -> BTreeMap<String, BTreeMap<String, usize>> {
        let mut totals: BTreeMap<String, BTreeMap<String, usize>> = BTreeMap::new();
        for r in &self.records {
            *totals
                .entry(r.label.to_string())
                .or_default()
                .entry(r.outcome.key())
                .or_default() += 1;
        }
        for s in &self.skipped {
            *totals
                .entry(s.label.to_string())
                .or_default()
                .entry("not sent".to_owned())
                .or_default() += 1;
        }
        totals
    }

    /// The requests of `labels` that were not a 2xx response, in the order sent. Panics if
    /// a label had no request sent (a typo must not pass as "no failures").
    pub fn failures(&self, labels: &[&str]) -> Vec<&Record> {
        self.check_labels(labels);
        self.records
            .iter()
            .filter(|r| labels.contains(&&*r.label) && !r.outcome.is_success())
            .collect()
    }

    /// Panics unless every one of `labels` had a request sent.
    fn check_labels(&self, labels: &[&str]) {
        assert!(!labels.is_empty(), "name the labels to check");
        for label in labels {
            assert!(
                self.records.iter().any(|r| &*r.label == *label),
                "the load sent no request for {label:?}; it sent {:?}",
                self.records
                    .iter()
                    .map(|r| &*r.label)
                    .collect::<BTreeSet<_>>()
            );
        }
    }

    /// The requests that took longer than `max` to their whole response (or to their error),
    /// in the order sent.
    pub fn slower_than(&self, max: Duration) -> Vec<&Record> {
        self.records.iter().filter(|r| r.latency > max).collect()
    }

    /// The requests of `label`, in the order sent.
    pub fn of(&self, label: &str) -> Vec<&Record> {
        self.records.iter().filter(|r| &*r.label == label).collect()
    }

    /// When the event `name` was marked; panics if it was not.
    pub fn mark_at(&self, name: &str) -> Duration {
        self.marks
            .iter()
            .find(|m| m.name == name)
            .map(|m| m.at)
            .unwrap_or_else(|| panic!("no event {name:?} was marked; marks: {:?}", self.marks))
    }

    /// The requests sent from the mark `from` until the mark `to` (or the stop, if `None`).
    pub fn sent_between(&self, from: &str, to: Option<&str>) -> Vec<&Record> {
        let start = self.mark_at(from);
        let end = to.map_or(self.duration, |to| self.mark_at(to));
        self.records
            .iter()
            .filter(|r| r.sent >= start && r.sent < end)
            .collect()
    }

    /// The longest latency of any request.
    pub fn max_latency(&self) -> Duration {
        self.records
            .iter()
            .map(|r| r.latency)
            .max()
            .unwrap_or_default()
    }

    /// Requests sent in each second of the load: `[0 s, 1 s)`, `[1 s, 2 s)`, ... up to the
    /// stop (the last second may be partial).
    pub fn per_second(&self) -> Vec<usize> {
        let seconds = self.duration.as_secs_f64().ceil().max(1.0) as usize;
        let mut counts = vec![0; seconds];
        for r in &self.records {
            let at = (r.sent.as_secs() as usize).min(seconds - 1);
            counts[at] += 1;
        }
        counts
    }

    /// The longest time without a request started, counting from the start and up to the
    /// stop.
    pub fn longest_pause(&self) -> Pause {
        let mut starts: Vec<Duration> = self.records.iter().map(|r| r.sent).collect();
        starts.sort();
        let mut longest = Pause {
            from: Duration::ZERO,
            to: self.duration,
        };
        let mut previous = Duration::ZERO;
        let mut first = true;
        for at in starts.into_iter().chain([self.duration]) {
            let pause = Pause {
                from: previous,
                to: at,
            };
            if first || pause.length() > longest.length() {
                longest = pause;
                first = false;
            }
            previous = at;
        }
        longest
    }

    /// Panics, printing [`LoadReport::describe`], if a request of `labels` was not a 2xx
    /// response (an error status, or no whole response within the timeout), or if a label
    /// had no request sent at all. Ticks not sent are not failures: the generator's own.
    pub fn assert_no_failures(&self, labels: &[&str]) {
        let failed = self.failures(labels).len();
        assert!(
            failed == 0,
            "{failed} requests to {labels:?} failed; the load:\n{self}"
        );
    }

    /// Panics, printing the requests that took longer and the report, if a request took
    /// longer than `max` to its whole response (or to its error).
    ///
    /// This is how a test catches the mesh stalling requests: with `max` far above what a
    /// request through the mesh takes (a millisecond or so), a busy machine makes requests
    /// slower and passes, a stall of the mesh holds them and fails. (A stall past the
    /// load's timeout is also a failure of [`LoadReport::assert_no_failures`].)
    pub fn assert_answered_within(&self, max: Duration) {
        let late = self.slower_than(max);
        let mut listed = String::new();
        self.list(
            &mut listed,
            &format!("requests took longer than {max:?}"),
            &late,
        );
        assert!(
            late.is_empty(),
            "{}\nthe load:\n{self}",
            listed.trim_start()
        );
    }

    /// A time from the start, with the latest mark at or before it: `12.345s (2.100s after
    /// «killed the control plane»)`.
    pub fn at(&self, t: Duration) -> String {
        match self.marks.iter().rev().find(|m| m.at <= t) {
            Some(mark) => format!(
                "{:.3}s ({:.3}s after «{}»)",
                t.as_secs_f64(),
                (t - mark.at).as_secs_f64(),
                mark.name
            ),
            None => format!("{:.3}s", t.as_secs_f64()),
        }
    }

    /// One line: rate, counts, outcomes per label, max latency, the generator's own misses
    /// (ticks not sent, the longest pause), marks.
    pub fn summary(&self) -> String {
        let mut out = format!(
            "load {:.1}s at {}/s (≤{} in flight, {:?} timeout{}): sent {} = {} answered + {} \
             transport errors",
            self.duration.as_secs_f64(),
            self.config.rate,
            self.config.max_in_flight,
            self.config.timeout,
            if self.config.keep_alive {
                ", keep-alive"
            } else {
                ""
            },
            self.sent(),
            self.answered(),
            self.transport_errors(),
        );
        for (label, outcomes) in self.totals() {
            let outcomes: Vec<String> = outcomes.iter().map(|(k, n)| format!("{k}×{n}")).collect();
            let _ = write!(out, "; {label}: {}", outcomes.join(" "));
        }
        if let Some(name) = &self.config.record_header {
            let mut values: BTreeMap<&str, usize> = BTreeMap::new();
            for r in &self.records {
                *values
                    .entry(r.header.as_deref().unwrap_or("-"))
                    .or_default() += 1;
            }
            let values: Vec<String> = values.iter().map(|(v, n)| format!("{v}×{n}")).collect();
            let _ = write!(out, "; {name}: {}", values.join(" "));
        }
        let pause = self.longest_pause();
        let _ = write!(
            out,
            "; max latency {:?}; the generator's own (not asserted): {} ticks not sent, longest \
             pause {:?} at {:.3}s",
            self.max_latency(),
            self.skipped.len(),
            pause.length(),
            pause.from.as_secs_f64()
        );
        if self.retries > 0 {
            let _ = write!(out, "; {} retried on a new connection", self.retries);
        }
        for mark in &self.marks {
            let _ = write!(out, "; «{}» at {:.3}s", mark.name, mark.at.as_secs_f64());
        }
        out
    }

    /// The summary, the requests per second, the marks, the first failures with their
    /// times, outcomes and bodies, and when ticks were first not sent.
    pub fn describe(&self) -> String {
        let mut out = self.summary();
        let _ = write!(out, "\n  requests sent per second: {:?}", self.per_second());
        for mark in &self.marks {
            let _ = write!(
                out,
                "\n  mark {:.3}s «{}»",
                mark.at.as_secs_f64(),
                mark.name
            );
        }
        let failures: Vec<&Record> = self
            .records
            .iter()
            .filter(|r| !r.outcome.is_success())
            .collect();
        if !failures.is_empty() {
            self.list(&mut out, "failures", &failures);
        }
        if let Some(first) = self.skipped.first() {
            let _ = write!(
                out,
                "\n  {} ticks not sent (every thread busy; the generator's own, not asserted), \
                 the first at {}",
                self.skipped.len(),
                self.at(first.scheduled)
            );
        }
        out
    }

    /// Writes `<how many> <what>:`, then a line for each of the first [`RECORDS_SHOWN`] of
    /// `records`: its number, label, when it was sent, its latency and its outcome (with the
    /// body of an error status).
    fn list(&self, out: &mut String, what: &str, records: &[&Record]) {
        let _ = write!(out, "\n  {} {what}", records.len());
        if records.len() > RECORDS_SHOWN {
            let _ = write!(out, ", the first {RECORDS_SHOWN}");
        }
        out.push(':');
        for r in records.iter().take(RECORDS_SHOWN) {
            let outcome = match &r.outcome {
                Outcome::Status(status) => format!(
                    "{status} {}",
                    r.body.as_deref().unwrap_or_default().replace('\n', " ")
                ),
                Outcome::Error { kind, message } => format!("{kind:?}: {message}"),
            };
            let _ = write!(
                out,
                "\n    #{} {} sent {} after {:?}: {}",
                r.seq,
                r.label,
                self.at(r.sent),
                r.latency,
                outcome.trim_end()
            );
        }
    }
}

impl fmt::Display for LoadReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{Ipv4Addr, TcpListener};

    use crate::echo::EchoUpstream;
    use crate::panic_message;
    use crate::serve::Acceptor;

    #[test]
    fn a_load_keeps_its_schedule_sends_nothing_early_and_accounts_for_every_tick() {
        let echo = EchoUpstream::start("steady");
        let load = Load::hosts(echo.addr(), &["a", "b"], LoadConfig::rate(50));
        load.wait_completed(60, Duration::from_secs(10));
        load.mark("sixty done");
        load.wait_completed(20, Duration::from_secs(10));
        let report = load.stop();
        eprintln!("{}", report.summary());
        report.assert_no_failures(&["a", "b"]);
        assert_eq!(report.sent(), report.answered() + report.transport_errors());
        assert_eq!(report.sent() as u64, echo.requests());
        // Every tick is a request sent or a tick not sent (however busy the machine), in the
        // order of the schedule: one every 20 ms, the Hosts in turn.
        let mut ticks: Vec<(u64, &str, Duration)> = (report.records.iter())
            .map(|r| (r.seq, &*r.label, r.scheduled))
            .chain(
                report
                    .skipped
                    .iter()
                    .map(|s| (s.seq, &*s.label, s.scheduled)),
            )
            .collect();
        ticks.sort();
        for (n, (seq, label, scheduled)) in ticks.into_iter().enumerate() {
            assert_eq!(seq, n as u64, "{report}");
            assert_eq!(label, ["a", "b"][n % 2], "tick {n}");
            assert_eq!(scheduled, Duration::from_millis(20) * n as u32, "tick {n}");
        }
        // Late on a busy machine, never early.
        for r in &report.records {
            assert!(r.sent >= r.scheduled, "sent before its time: {r:?}");
        }
        // The second wait counted only requests sent after it began, so after the mark.
        assert!(
            report.sent_between("sixty done", None).len() >= 20,
            "{report}"
        );
        assert!(
            report
                .at(report.mark_at("sixty done") + Duration::from_millis(5))
                .contains("after «sixty done»")
        );
    }

    #[test]
    fn a_keep_alive_load_reuses_its_connections() {
        let echo = EchoUpstream::start("kept");
        let load = Load::hosts(
            echo.addr(),
            &["a"],
            LoadConfig::rate(100).max_in_flight(2).keep_alive(),
        );
        load.wait_completed(50, Duration::from_secs(10));
        let report = load.stop();
        report.assert_no_failures(&["a"]);
        assert!(
            report.summary().contains("keep-alive"),
            "{}",
            report.summary()
        );
    }

    #[test]
    fn a_load_that_records_bodies_keeps_each_answers_body_and_otherwise_only_a_failures() {
        let echo = EchoUpstream::start("named");
        let config = LoadConfig::rate(100).record_body();
        let load = Load::hosts(echo.addr(), &["a"], config);
        load.wait_completed(3, Duration::from_secs(10));
        let report = load.stop();
        report.assert_no_failures(&["a"]);
        for r in &report.records {
            let body = r
                .body
                .as_deref()
                .unwrap_or_else(|| panic!("no body kept: {r:?}"));
            assert!(body.contains("\"upstream\""), "{body}");
        }
        let load = Load::hosts(echo.addr(), &["a"], LoadConfig::rate(100));
        load.wait_completed(3, Duration::from_secs(10));
        let report = load.stop();
        assert!(report.records.iter().all(|r| r.body.is_none()), "{report}");
    }

    #[test]
    fn a_closure_makes_each_request_and_names_the_label_it_is_counted_under() {
        let echo = EchoUpstream::start("made");
        let load = Load::requests(echo.addr(), LoadConfig::rate(100), |seq| {
            let label = if seq % 3 == 0 { "third" } else { "rest" };
            let request = Request::get(&format!("/{seq}")).host(label);
            (label.to_owned(), request)
        });
        load.wait_completed(9, Duration::from_secs(10));
        let report = load.stop();
        report.assert_no_failures(&["third", "rest"]);
        assert!(report.of("third").iter().all(|r| r.seq % 3 == 0));
        assert!(report.of("rest").iter().all(|r| r.seq % 3 != 0));
    }

    #[test]
    fn refused_connections_are_failures_placed_after_the_last_mark() {
        let refused = {
            let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
            l.local_addr().expect("addr")
        };
        let load = Load::hosts(refused, &["gone"], LoadConfig::rate(100));
        load.mark("nothing listens");
        load.wait_completed(5, Duration::from_secs(10));
        let report = load.stop();
        let failures = report.failures(&["gone"]);
        assert_eq!(failures.len(), report.sent());
        assert_eq!(report.transport_errors(), report.sent());
        assert_eq!(report.answered(), 0);
        assert!(
            matches!(
                failures[0].outcome,
                Outcome::Error {
                    kind: io::ErrorKind::ConnectionRefused,
                    ..
                }
            ),
            "{:?}",
            failures[0]
        );
        let message = panic_message(|| {
            report.assert_no_failures(&["gone"]);
        });
        assert!(message.contains("failed"), "{message}");
        assert!(message.contains("after «nothing listens»"), "{message}");
        assert!(message.contains("ConnectionRefused"), "{message}");
    }

    #[test]
    fn a_non_2xx_answer_is_a_failure_that_keeps_the_start_of_its_body() {
        let server = Acceptor::loopback("test server", |mut conn| {
            let mut buf = [0u8; 1024];
            let _ = conn.read(&mut buf);
            let body = format!("no healthy upstream {}", "x".repeat(1000));
            let head = format!(
                "HTTP/1.1 503 Service Unavailable\r\ncontent-length: {}\r\n\r\n",
                body.len()
            );
            let _ = conn.write_all(head.as_bytes());
            let _ = conn.write_all(body.as_bytes());
        });
        let load = Load::hosts(server.addr(), &["down"], LoadConfig::rate(50));
        load.wait_completed(3, Duration::from_secs(10));
        let report = load.stop();
        let failures = report.failures(&["down"]);
        assert!(!failures.is_empty());
        let body = failures[0].body.as_deref().expect("a body");
        assert!(body.starts_with("no healthy upstream"), "{body}");
        assert_eq!(body.len(), BODY_PREFIX);
        assert_eq!(report.totals()["down"]["503"], report.sent());
    }

    #[test]
    fn a_stalled_upstream_shows_as_timeouts_and_late_answers_not_as_a_quiet_pass() {
        // Accepts and never answers: every request times out.
        let server = Acceptor::loopback("test server", |mut conn| {
            let _ = io::copy(&mut conn, &mut io::sink());
        });
        let config = LoadConfig::rate(100)
            .max_in_flight(2)
            .timeout(Duration::from_millis(300));
        let load = Load::hosts(server.addr(), &["stuck"], config);
        load.wait_completed(4, Duration::from_secs(10));
        let report = load.stop();
        assert_eq!(report.transport_errors(), report.sent());
        assert!(report.records.iter().all(|r| matches!(
            r.outcome,
            Outcome::Error {
                kind: io::ErrorKind::TimedOut,
                ..
            }
        )));
        assert!(report.max_latency() >= Duration::from_millis(300));
        let message = panic_message(|| {
            report.assert_no_failures(&["stuck"]);
        });
        assert!(message.contains("failed"), "{message}");
        assert!(message.contains("TimedOut"), "{message}");
        let message = panic_message(|| {
            report.assert_answered_within(Duration::from_millis(100));
        });
        assert!(message.contains("took longer than 100ms"), "{message}");
    }

    #[test]
    fn ticks_not_sent_while_every_thread_is_busy_are_reported_and_fail_nothing() {
        // Answers every request, 200 ms late: one thread cannot keep 100/s.
        let server = Acceptor::loopback("test server", |mut conn| {
            let mut buf = [0u8; 1024];
            let _ = conn.read(&mut buf);
            thread::sleep(Duration::from_millis(200));
            let _ = conn.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n");
        });
        let load = Load::hosts(
            server.addr(),
            &["busy"],
            LoadConfig::rate(100).max_in_flight(1),
        );
        crate::wait::wait_until(Duration::from_secs(10), "a tick not sent", || {
            load.progress().skipped >= 1
        });
        load.wait_completed(1, Duration::from_secs(10));
        let report = load.stop();
        assert!(!report.skipped.is_empty());
        assert_eq!(report.totals()["busy"]["not sent"], report.skipped.len());
        assert!(report.summary().contains("ticks not sent"), "{report}");
        assert!(report.describe().contains("not asserted"), "{report}");
        report.assert_no_failures(&["busy"]);
        // Each answer took the upstream's 200 ms: late for a bound below that.
        assert!(report.max_latency() >= Duration::from_millis(200));
        let message = panic_message(|| report.assert_answered_within(Duration::from_millis(100)));
        assert!(message.contains("took longer than 100ms"), "{message}");
    }

    /// A report of requests of label `x`, each `(sent, latency)` in milliseconds, answered
    /// 200, of a load that ran `duration_ms`, with `marks` (name, ms).
    fn report_of(requests: &[(u64, u64)], duration_ms: u64, marks: &[(&str, u64)]) -> LoadReport {
        LoadReport {
            config: LoadConfig::rate(10),
            duration: Duration::from_millis(duration_ms),
            records: (requests.iter().enumerate())
                .map(|(i, (sent, latency))| Record {
                    seq: i as u64,
                    label: Arc::from("x"),
                    scheduled: Duration::from_millis(*sent),
                    sent: Duration::from_millis(*sent),
                    latency: Duration::from_millis(*latency),
                    outcome: Outcome::Status(200),
                    body: None,
                    header: None,
                })
                .collect(),
            skipped: Vec::new(),
            marks: (marks.iter())
                .map(|(name, at)| Mark {
                    name: (*name).to_owned(),
                    at: Duration::from_millis(*at),
                })
                .collect(),
            retries: 0,
        }
    }

    #[test]
    fn a_pause_in_the_load_is_measured_from_the_start_to_the_stop_and_only_reported() {
        let report = report_of(&[(100, 1), (200, 1), (1500, 1), (1600, 1)], 3000, &[]);
        assert_eq!(
            report.longest_pause(),
            Pause {
                from: Duration::from_millis(1600),
                to: Duration::from_secs(3)
            }
        );
        assert_eq!(report.per_second(), vec![2, 2, 0]);
        assert!(
            report.summary().contains("longest pause 1.4s at 1.600s"),
            "{}",
            report.summary()
        );
        report.assert_no_failures(&["x"]);
        report.assert_answered_within(Duration::from_millis(1));
    }

    #[test]
    fn a_request_answered_later_than_the_bound_fails_naming_it_and_its_time() {
        let report = report_of(
            &[(100, 1), (200, 700), (300, 2)],
            1000,
            &[("killed the control plane", 150)],
        );
        assert_eq!(report.slower_than(Duration::from_millis(2)).len(), 1);
        report.assert_answered_within(Duration::from_millis(700));
        let message = panic_message(|| {
            report.assert_answered_within(Duration::from_millis(500));
        });
        assert!(
            message.starts_with("1 requests took longer than 500ms:"),
            "{message}"
        );
        assert!(
            message.contains(
                "#1 x sent 0.200s (0.050s after «killed the control plane») after 700ms: 200"
            ),
            "{message}"
        );
    }

    #[test]
    fn an_unknown_label_is_refused_rather_than_passing_as_no_failures() {
        let echo = EchoUpstream::start("typo");
        let load = Load::hosts(echo.addr(), &["hello"], LoadConfig::rate(50));
        load.wait_completed(2, Duration::from_secs(10));
        let report = load.stop();
        let message = panic_message(|| {
            report.assert_no_failures(&["helo"]);
        });
        assert!(message.contains("helo"), "{message}");
    }

    #[test]
    fn dropping_a_load_stops_its_threads() {
        let echo = EchoUpstream::start("dropped");
        let load = Load::hosts(echo.addr(), &["a"], LoadConfig::rate(200));
        load.wait_completed(5, Duration::from_secs(10));
        drop(load);
        let after = echo.requests();
        crate::wait::hold_for(
            Duration::from_millis(200),
            "no request after the drop",
            || echo.requests() == after,
        );
    }
}
