//! Prewarm from request history: which clusters each calling service's proxies used, and
//! when, so that a proxy of that service that connects (a deploy, a restart, autoscaling) is
//! sent them before any request has to wait for their discovery.
//!
//! - [`History`] is plain state with plain tests: per calling service (the Envoy node's
//!   `cluster`), each cluster name and when a proxy of that service last used it, bounded by
//!   count (per service and over all services) and age; the prediction for a proxy that
//!   connects; the merge of two histories.
//! - [`Prewarm`] is a running control plane's history behind a lock, with the counts the admin
//!   shows (pushed, used, asked without a prediction), and the file it is kept in.
//!
//! Where "used" comes from: an on-demand request for a cluster (the proxy needed it and did not
//! have it), and Envoy's load reports (LRS, [`crate::lrs`]) for clusters that carried requests
//! (a prewarmed cluster is never asked for on demand, so only the reports tell that it was
//! used). A cluster nobody uses any more ages out after [`Limits::max_age`].
//!
//! The file (JSON, written to a temporary file and renamed over the old one) is read at start
//! and written every few seconds while something changed. Several replicas may share one file:
//! each merges what is in the file into its own history before writing (the later use of a
//! cluster wins), so what one replica learnt reaches the others through the file.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::hash::{DefaultHasher, Hasher};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use odmesh_base::metrics::inc;
use serde::{Deserialize, Serialize};

use crate::metrics::Metrics;

/// Bounds on the history.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Cluster names kept per calling service (the most recently used win); also the most a
    /// connecting proxy is sent.
    pub max_per_service: usize,
    /// (service, cluster) entries kept over all services: what bounds the history's memory,
    /// whatever services clients claim to be. See [`History::record`] for what happens when
    /// it is reached. Apart, the most cluster names kept from the load reports of connected
    /// proxies (for [`Prewarm::idle`]), whatever node ids they claim.
    pub max_entries: usize,
    /// A cluster not used for this long is forgotten.
    pub max_age: Duration,
}

/// The default of [`Limits::max_entries`]: the 1,000 services × 1,000 clusters the production
/// guide sizes for. Measured with 20-character cluster names: 83-86 bytes of heap an entry
/// (the name, its time, the map's nodes), about 95 MB of resident memory in all, and 42 bytes
/// an entry in the file, 40 MB (docs/production.md, "Several replicas").
pub const DEFAULT_MAX_ENTRIES: usize = 1_000_000;

impl Default for Limits {
    /// 1,000 clusters per service, [`DEFAULT_MAX_ENTRIES`] in all, forgotten after 7 days
    /// unused.
    fn default() -> Limits {
        Limits {
            max_per_service: 1_000,
            max_entries: DEFAULT_MAX_ENTRIES,
            max_age: Duration::from_secs(7 * 24 * 3600),
        }
    }
}

/// One service's clusters, each with when it was last used. Shared with a save in progress
/// (see [`Prewarm::save`]): a change copies only the service it changes, and only while a
/// save holds it.
type Clusters = Arc<BTreeMap<String, u64>>;

/// Per calling service, each cluster name and when it was last used (seconds since the Unix
/// epoch).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "HistoryData")]
pub struct History {
    services: BTreeMap<String, Clusters>,
    /// The (service, cluster) entries, over all services.
    #[serde(skip)]
    entries: usize,
}

/// What a history file holds, before its entries are counted.
#[derive(Deserialize)]
struct HistoryData {
    services: BTreeMap<String, Clusters>,
}

impl From<HistoryData> for History {
    fn from(data: HistoryData) -> History {
        let entries = data.services.values().map(|c| c.len()).sum();
        History {
            services: data.services,
            entries,
        }
    }
}

/// What [`History::record`] did with a use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recorded {
    /// Nothing: the history knew of a later use, or the service keeps
    /// [`Limits::max_per_service`] clusters all used later.
    Unchanged,
    /// Kept (within the service's bound, its least recently used cluster forgotten).
    Kept,
    /// The history was full: kept in the place of its service's least recently used cluster.
    Replaced,
    /// The history was full, and the use was not kept (a new service, or one whose clusters
    /// were all used later).
    Refused,
}

impl Recorded {
    /// Whether the history changed.
    pub fn changed(self) -> bool {
        matches!(self, Recorded::Kept | Recorded::Replaced)
    }

    /// Whether the bound over all services took something: an entry forgotten or refused.
    pub fn over_bound(self) -> bool {
        matches!(self, Recorded::Replaced | Recorded::Refused)
    }
}

impl History {
    /// Records that a proxy of `service` used `cluster` at `now`. Keeps the service within
    /// `limits.max_per_service` by forgetting its least recently used cluster, and the whole
    /// history within `limits.max_entries` and [`MAX_SERVICES`].
    ///
    /// When the history is full, a new entry takes the place of its own service's least
    /// recently used cluster (if it was used later), never another service's, and a service
    /// without a history gets none until there is room again (entries age out after
    /// `limits.max_age`). Not the least recently used entry over all services: a proxy's
    /// `node.cluster` is whatever it says, and a client naming ever new services is always
    /// the most recent, so it would push out every real service's history (which a
    /// restarted proxy needs) a minute at a time. This way such a client takes only the room
    /// that is free, each service keeps what it has and keeps learning within it, and what
    /// is refused costs one on-demand discovery when needed.
    pub fn record(&mut self, limits: &Limits, service: &str, cluster: &str, now: u64) -> Recorded {
        if service.is_empty() || limits.max_per_service == 0 {
            return Recorded::Unchanged;
        }
        let full = self.entries >= limits.max_entries;
        let Some(clusters) = self.services.get_mut(service) else {
            // A client naming ever new services (node.cluster is whatever it says) stops here.
            if full || self.services.len() >= MAX_SERVICES {
                return Recorded::Refused;
            }
            let clusters = BTreeMap::from([(cluster.to_owned(), now)]);
            self.services.insert(service.to_owned(), Arc::new(clusters));
            self.entries += 1;
            return Recorded::Kept;
        };
        if let Some(last) = clusters.get(cluster) {
            if *last >= now {
                return Recorded::Unchanged;
            }
            if let Some(last) = Arc::make_mut(clusters).get_mut(cluster) {
                *last = now;
            }
            return Recorded::Kept;
        }
        let service_full = clusters.len() >= limits.max_per_service;
        if !full && !service_full {
            Arc::make_mut(clusters).insert(cluster.to_owned(), now);
            self.entries += 1;
            return Recorded::Kept;
        }
        // In the place of the service's least recently used cluster, if used later.
        let oldest = (clusters.iter())
            .min_by(|a, b| (a.1, a.0).cmp(&(b.1, b.0)))
            .map(|(name, last)| (name.clone(), *last));
        match oldest {
            Some((name, last)) if (last, name.as_str()) < (now, cluster) => {
                let clusters = Arc::make_mut(clusters);
                clusters.remove(&name);
                clusters.insert(cluster.to_owned(), now);
                if service_full {
                    Recorded::Kept
                } else {
                    Recorded::Replaced
                }
            }
            _ if service_full => Recorded::Unchanged,
            _ => Recorded::Refused,
        }
    }

    /// The clusters to send a proxy of `service` that connects at `now`: used within
    /// `limits.max_age`, for which `registered` holds (a VIP gone from the registry is not
    /// sent), most recently used first.
    pub fn predict(
        &self,
        limits: &Limits,
        service: &str,
        now: u64,
        registered: impl Fn(&str) -> bool,
    ) -> Vec<String> {
        let Some(clusters) = self.services.get(service) else {
            return Vec::new();
        };
        let oldest = now.saturating_sub(limits.max_age.as_secs());
        let mut fresh: Vec<(&String, u64)> = (clusters.iter())
            .filter(|(name, last)| **last >= oldest && registered(name))
            .map(|(name, last)| (name, *last))
            .collect();
        // Most recent first; names break ties, so the order is the same on every replica.
        fresh.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0)));
        (fresh.into_iter())
            .take(limits.max_per_service)
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// Forgets what was last used before `now - limits.max_age`, and keeps every service
    /// within `limits.max_per_service`. Returns whether anything was forgotten. Copies no
    /// service it leaves as it is.
    pub fn prune(&mut self, limits: &Limits, now: u64) -> bool {
        let oldest = now.saturating_sub(limits.max_age.as_secs());
        let before = self.entries;
        for clusters in self.services.values_mut() {
            let aged = clusters.values().any(|last| *last < oldest);
            if !aged && clusters.len() <= limits.max_per_service {
                continue;
            }
            let clusters = Arc::make_mut(clusters);
            clusters.retain(|_, last| *last >= oldest);
            if clusters.len() > limits.max_per_service {
                evict_oldest(clusters, clusters.len() - limits.max_per_service);
            }
        }
        self.services.retain(|_, clusters| !clusters.is_empty());
        self.entries = self.services.values().map(|c| c.len()).sum();
        self.entries != before
    }

    /// Takes in `other` (another replica's history, read from the shared file, or this
    /// replica's own at start): for each cluster the later use wins, and each new entry is
    /// recorded as [`History::record`] does, within the same bounds. The services this
    /// history knows come first: entries already held are not pushed out for those of a file
    /// (which anyone who can write it fills as they like).
    pub fn merge(&mut self, limits: &Limits, other: &History, now: u64) -> Merged {
        let oldest = now.saturating_sub(limits.max_age.as_secs());
        let mut merged = Merged::default();
        let (known, new): (Vec<_>, Vec<_>) =
            (other.services.iter()).partition(|(service, _)| self.services.contains_key(*service));
        for (service, clusters) in known.into_iter().chain(new) {
            for (cluster, last) in clusters.iter().filter(|(_, last)| **last >= oldest) {
                let recorded = self.record(limits, service, cluster, *last);
                merged.changed |= recorded.changed();
                merged.refused += usize::from(recorded.over_bound());
            }
        }
        merged.changed |= self.prune(limits, now);
        merged
    }

    /// How many (service, cluster) entries the history holds.
    pub fn len(&self) -> usize {
        self.entries
    }

    /// Whether the history is empty.
    pub fn is_empty(&self) -> bool {
        self.services.is_empty()
    }

    /// The calling services with a history.
    pub fn services(&self) -> impl Iterator<Item = &str> {
        self.services.keys().map(String::as_str)
    }

    /// When `service` last used `cluster`, if it did.
    pub fn last_used(&self, service: &str, cluster: &str) -> Option<u64> {
        self.services.get(service)?.get(cluster).copied()
    }
}

/// What [`History::merge`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Merged {
    /// Whether the history changed.
    pub changed: bool,
    /// Entries the bound over all services refused or forgot (see [`Recorded::over_bound`]).
    pub refused: usize,
}

/// At most so many calling services have a history.
pub const MAX_SERVICES: usize = 10_000;

/// History times are kept to the minute: a cluster used all along changes its entry (and the
/// file) once a minute, not at every load report.
const RESOLUTION: u64 = 60;

/// Forgets the `n` least recently used of `clusters` (names break ties).
fn evict_oldest(clusters: &mut BTreeMap<String, u64>, n: usize) {
    let mut by_age: Vec<(u64, String)> = (clusters.iter())
        .map(|(name, last)| (*last, name.clone()))
        .collect();
    by_age.sort();
    for (_, name) in by_age.into_iter().take(n) {
        clusters.remove(&name);
    }
}

/// The history file: a format tag, then the history.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct HistoryFile {
    /// Format version; 1 is the only one.
    odmesh_prewarm_history: u32,
    #[serde(flatten)]
    history: History,
}

/// The history file, written from a history it borrows.
#[derive(Serialize)]
struct HistoryFileOf<'a> {
    odmesh_prewarm_history: u32,
    #[serde(flatten)]
    history: &'a History,
}

const FORMAT: u32 = 1;

/// Why the history file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// Reading it failed (other than its absence).
    #[error("cannot read {path}")]
    Read { path: PathBuf, source: io::Error },
    /// It is not a history file of a format this control plane knows.
    #[error("{path} is not an odmesh prewarm history (format {FORMAT})")]
    Parse {
        path: PathBuf,
        source: serde_json::Error,
    },
}

/// Reads the history at `path`; an absent file is an empty history.
pub fn load(path: &Path) -> Result<History, LoadError> {
    parse_file(path, read(path)?.as_deref())
}

/// The bytes of the file at `path`; `None` if there is none.
fn read(path: &Path) -> Result<Option<Vec<u8>>, LoadError> {
    match fs::read(path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(LoadError::Read {
            path: path.to_owned(),
            source,
        }),
    }
}

/// The history in `bytes`, read from `path` (`None`: no file, an empty history).
fn parse_file(path: &Path, bytes: Option<&[u8]>) -> Result<History, LoadError> {
    let Some(bytes) = bytes else {
        return Ok(History::default());
    };
    parse(bytes).map_err(|source| LoadError::Parse {
        path: path.to_owned(),
        source,
    })
}

/// Reads a history file's content (what [`load`] reads from the file): the error says why it
/// is not a history of this format.
pub fn parse(bytes: &[u8]) -> Result<History, serde_json::Error> {
    let parsed: HistoryFile = serde_json::from_slice(bytes)?;
    if parsed.odmesh_prewarm_history != FORMAT {
        return Err(serde::de::Error::custom(format!(
            "format {} is not {FORMAT}",
            parsed.odmesh_prewarm_history
        )));
    }
    Ok(parsed.history)
}

/// Writes `history` to `path` atomically: to a temporary file beside it, flushed to disk, then
/// renamed over it, and the folder flushed. A reader sees the old file or the new one, never
/// a part.
pub fn store(path: &Path, history: &History) -> io::Result<()> {
    write(path, history).map(drop)
}

/// [`store`]; returns the [`digest`] of what it wrote. The JSON goes to the file as it is
/// written, through a buffer, not whole into memory first.
fn write(path: &Path, history: &History) -> io::Result<u64> {
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty());
    let name = path.file_name().map_or_else(
        || "odmesh-prewarm".into(),
        |n| n.to_string_lossy().into_owned(),
    );
    // Unique among writers sharing the folder (replicas in containers may all be pid 1).
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let tmp = dir
        .unwrap_or(Path::new("."))
        .join(format!(".{name}.{}.{nanos}.tmp", std::process::id()));
    let f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)?;
    let mut out = Digesting {
        inner: io::BufWriter::new(f),
        digest: DefaultHasher::new(),
    };
    let file = HistoryFileOf {
        odmesh_prewarm_history: FORMAT,
        history,
    };
    let written = serde_json::to_writer_pretty(&mut out, &file)
        .map_err(io::Error::other)
        .and_then(|()| {
            out.inner
                .into_inner()
                .map_err(io::IntoInnerError::into_error)
        })
        .and_then(|f| f.sync_all());
    if let Err(e) = written.and_then(|()| fs::rename(&tmp, path)) {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    // The rename is in the folder's entries: flushed too, or a crash may bring back the old
    // file (or none).
    fs::File::open(dir.unwrap_or(Path::new(".")))?.sync_all()?;
    Ok(out.digest.finish())
}

/// A digest of a history file's bytes: whether the file is still the one this replica last
/// wrote or read (not a defence against whoever can write it, who can write anything).
fn digest(bytes: &[u8]) -> u64 {
    let mut digest = DefaultHasher::new();
    digest.write(bytes);
    digest.finish()
}

/// A writer that digests what goes through it, as [`digest`] does (one digest over the
/// bytes, however they are split).
struct Digesting<W> {
    inner: W,
    digest: DefaultHasher,
}

impl<W: Write> Write for Digesting<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.digest.write(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Seconds since the Unix epoch.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// What prewarm did for one calling service, since this control plane started.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    /// Clusters sent to connecting proxies ahead of any request.
    pub pushed: u64,
    /// Of those, how many then carried requests (Envoy's load reports).
    pub used: u64,
    /// Clusters the service's proxies asked for on demand: needed and not predicted.
    pub asked: u64,
}

/// A running control plane's history: shared by every stream, kept in a file.
#[derive(Debug)]
pub struct Prewarm {
    limits: Limits,
    path: Option<PathBuf>,
    state: Mutex<State>,
    /// Counts what the bound over all services refused (`prewarm_entries_refused_total`).
    metrics: Arc<Metrics>,
    /// What the last save knew of the file; taken by saves only.
    file: Mutex<FileState>,
}

/// What [`Prewarm::save`] knows of the file.
#[derive(Debug, Default)]
struct FileState {
    /// The generation of the history the file holds, as this replica last wrote or read it.
    generation: Option<u64>,
    /// The [`digest`] of the file as this replica last wrote or read it.
    digest: Option<u64>,
    /// The minute (since the Unix epoch) the history was last pruned in.
    pruned: Option<u64>,
}

#[derive(Debug, Default)]
struct State {
    history: History,
    counts: BTreeMap<String, Counts>,
    /// (proxy node id, cluster) sent ahead and not yet seen carrying requests, with how many
    /// times (proxies may share a node id).
    pending: BTreeMap<(String, String), u32>,
    /// Per proxy (node id), what its load reports said: for evicting idle clusters.
    nodes: BTreeMap<String, NodeReports>,
    /// The clusters `nodes` hold, over all proxies (within [`Limits::max_entries`]).
    node_entries: usize,
    /// Counts the changes of `history`: a save writes only a generation the file lacks.
    generation: u64,
}

/// What one proxy's load reports said, for [`Prewarm::idle`].
#[derive(Debug, Default)]
struct NodeReports {
    /// Since when reports came without a gap (seconds since the Unix epoch).
    reporting_since: u64,
    /// The last report.
    last_report: u64,
    /// Each cluster that carried requests, and when it last did.
    used: BTreeMap<String, u64>,
}

/// At most so many proxies' reports are kept (the least recently reporting go first).
const MAX_NODES: usize = 100_000;
/// At most so many clusters sent ahead wait to be seen used (for the hit rate).
const MAX_PENDING: usize = 1_000_000;

impl Prewarm {
    /// A prewarm over `history` (as read from `path`, if it is kept in a file), within
    /// `limits` (a file may hold more than they allow: what it holds is taken in as
    /// [`History::merge`] does), counting into `metrics`.
    pub fn new(
        limits: Limits,
        path: Option<PathBuf>,
        history: History,
        metrics: Arc<Metrics>,
    ) -> Prewarm {
        let mut bounded = History::default();
        let merged = bounded.merge(&limits, &history, unix_now());
        (metrics.prewarm_entries_refused_total).fetch_add(merged.refused as u64, Ordering::Relaxed);
        Prewarm {
            limits,
            path,
            state: Mutex::new(State {
                history: bounded,
                ..State::default()
            }),
            metrics,
            file: Mutex::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every critical section leaves the state consistent.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The bounds in force.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// The clusters to send a connecting proxy of `service` (see [`History::predict`]).
    pub fn predict(&self, service: &str, registered: impl Fn(&str) -> bool) -> Vec<String> {
        (self.lock().history).predict(&self.limits, service, unix_now(), registered)
    }

    /// `names` were sent to the proxy `node` of `service` ahead of any request.
    pub fn pushed(&self, node: &str, service: &str, names: &[&str]) {
        let mut state = self.lock();
        if !state.counts.contains_key(service) && state.counts.len() >= MAX_SERVICES {
            return;
        }
        state.counts.entry(service.to_owned()).or_default().pushed += names.len() as u64;
        for name in names {
            if state.pending.len() >= MAX_PENDING {
                break;
            }
            *state
                .pending
                .entry((node.to_owned(), (*name).to_owned()))
                .or_default() += 1;
        }
    }

    /// A proxy of `service` asked for `names` on demand (each registered, and not sent ahead).
    pub fn asked<'a>(&self, service: &str, names: impl IntoIterator<Item = &'a str>) {
        self.used_at("", service, names, true, unix_now());
    }

    /// One load report of the proxy `node` (of `service`), sent every `interval`: `names`
    /// carried requests. Besides [`Prewarm::used`], remembers per proxy what it used, for
    /// [`Prewarm::idle`].
    pub fn report(&self, node: &str, service: &str, names: &[&str], interval: Duration) {
        self.report_at(node, service, names, interval, unix_now());
    }

    fn report_at(&self, node: &str, service: &str, names: &[&str], interval: Duration, now: u64) {
        self.used_at(node, service, names.iter().copied(), false, now);
        let mut state = self.lock();
        let state = &mut *state;
        if !state.nodes.contains_key(node) && state.nodes.len() >= MAX_NODES {
            let oldest = (state.nodes.iter())
                .min_by_key(|(_, r)| r.last_report)
                .map(|(n, _)| n.clone());
            if let Some(gone) = oldest.and_then(|oldest| state.nodes.remove(&oldest)) {
                state.node_entries -= gone.used.len();
            }
        }
        let reports = state.nodes.entry(node.to_owned()).or_default();
        let before = reports.used.len();
        // A report later than three intervals after the last one: what happened in between
        // is not known, so the proxy counts as reporting only from now.
        let gap = 3 * interval.as_secs().max(1);
        if reports.last_report == 0 || now > reports.last_report + gap {
            reports.reporting_since = now;
        }
        reports.last_report = now;
        for name in names {
            reports.used.insert((*name).to_owned(), now);
        }
        let oldest = now.saturating_sub(self.limits.max_age.as_secs());
        reports.used.retain(|_, last| *last >= oldest);
        if reports.used.len() > self.limits.max_per_service {
            let excess = reports.used.len() - self.limits.max_per_service;
            evict_oldest(&mut reports.used, excess);
        }
        let entries = state.node_entries - before + reports.used.len();
        if entries > self.limits.max_entries {
            // Over the bound (proxies claiming ever new node ids): this proxy's reports are
            // not kept, so it counts as not reporting and none of its clusters is idle (the
            // safe side) until its reports fit again. Not another proxy's: those are kept.
            state.nodes.remove(node);
            state.node_entries -= before;
            inc(&self.metrics.prewarm_entries_refused_total);
        } else {
            state.node_entries = entries;
        }
    }

    /// The proxy `node`'s load reports ended (its stream closed): what they said is dropped, so
    /// nothing it holds counts as idle until it reports again for a whole timeout.
    pub fn reports_ended(&self, node: &str) {
        let mut state = self.lock();
        if let Some(gone) = state.nodes.remove(node) {
            state.node_entries -= gone.used.len();
        }
    }

    /// Those of `held` (clusters the proxy `node` holds, each with when it got it) that
    /// carried no request for `timeout`, as far as its load reports tell: only if the proxy
    /// has reported without a gap for at least `timeout`, and still does (a report within the
    /// last three `interval`s). A proxy that does not report has no idle cluster.
    pub fn idle<'a>(
        &self,
        node: &str,
        held: impl IntoIterator<Item = (&'a str, u64)>,
        timeout: Duration,
        interval: Duration,
    ) -> Vec<String> {
        self.idle_at(node, held, timeout, interval, unix_now())
    }

    fn idle_at<'a>(
        &self,
        node: &str,
        held: impl IntoIterator<Item = (&'a str, u64)>,
        timeout: Duration,
        interval: Duration,
        now: u64,
    ) -> Vec<String> {
        let state = self.lock();
        let Some(reports) = state.nodes.get(node) else {
            return Vec::new();
        };
        let since = now.saturating_sub(timeout.as_secs());
        let fresh = now <= reports.last_report + 3 * interval.as_secs().max(1);
        if !fresh || reports.reporting_since > since {
            return Vec::new();
        }
        (held.into_iter())
            .filter(|(name, got)| {
                *got <= since && reports.used.get(*name).is_none_or(|last| *last < since)
            })
            .map(|(name, _)| name.to_owned())
            .collect()
    }

    /// `names` used by a proxy (`node`, for a load report) of `service`: into the history, and
    /// into the counts (a miss when `asked` on demand; a hit when sent ahead to that proxy).
    fn used_at<'a>(
        &self,
        node: &str,
        service: &str,
        names: impl IntoIterator<Item = &'a str>,
        asked: bool,
        now: u64,
    ) {
        if service.is_empty() {
            return;
        }
        let minute = now - now % RESOLUTION;
        let mut state = self.lock();
        let state = &mut *state;
        let mut counts = Counts::default();
        for name in names {
            if asked {
                counts.asked += 1;
            } else if let Some(waiting) = state.pending.get_mut(&(node.to_owned(), name.to_owned()))
            {
                counts.used += 1;
                *waiting -= 1;
                if *waiting == 0 {
                    state.pending.remove(&(node.to_owned(), name.to_owned()));
                }
            }
            let recorded = state.history.record(&self.limits, service, name, minute);
            state.generation += u64::from(recorded.changed());
            if recorded.over_bound() {
                inc(&self.metrics.prewarm_entries_refused_total);
            }
        }
        if counts != Counts::default()
            && (state.counts.contains_key(service) || state.counts.len() < MAX_SERVICES)
        {
            let total = state.counts.entry(service.to_owned()).or_default();
            total.asked += counts.asked;
            total.used += counts.used;
        }
    }

    /// Brings the history and its file together: merges in what the file holds (another
    /// replica's writes), then writes the result if the file does not hold it already.
    /// Returns whether it wrote. Called every few seconds, and at shutdown.
    ///
    /// The state's lock, which every stream takes on its subscriptions, is held only to take
    /// a snapshot of the history, which copies no service's clusters (see [`Clusters`]), and
    /// to put the merged history in its place; the file is read, parsed, merged, pruned,
    /// compared, written and flushed without it. A history unchanged since the last save,
    /// into a file unchanged since (read, and its digest compared with the one written), is
    /// neither parsed, merged, compared nor copied. Putting the merged history in place
    /// takes in the uses streams recorded meanwhile: a look at each service, and the clusters
    /// of those they changed.
    pub fn save(&self) -> io::Result<bool> {
        self.save_with(unix_now(), || (), write)
    }

    /// [`Prewarm::save`] at `now`, calling `meanwhile` once the snapshot is taken and writing
    /// with `write`, which returns the [`digest`] of what it wrote (the tests' hooks).
    fn save_with(
        &self,
        now: u64,
        meanwhile: impl FnOnce(),
        write: impl FnOnce(&Path, &History) -> io::Result<u64>,
    ) -> io::Result<bool> {
        let Some(path) = &self.path else {
            return Ok(false);
        };
        // One save at a time; the streams never take this lock.
        let mut file = self.file.lock().unwrap_or_else(PoisonError::into_inner);
        // A file that cannot be read now (an I/O error, or something another writer left that
        // is not a history of this format) is not overwritten: the error is reported, the
        // history stays in memory, and the next save tries again.
        let bytes = read(path).map_err(io::Error::other)?;
        let seen = bytes.as_deref().map(digest);
        let theirs = match seen {
            // As this replica last wrote or read it: nothing in it is new here.
            Some(seen) if file.digest == Some(seen) => None,
            _ => Some(parse_file(path, bytes.as_deref()).map_err(io::Error::other)?),
        };
        drop(bytes);
        // Times are kept to the minute: nothing ages out between two saves in one minute.
        let prune = file.pruned != Some(now / RESOLUTION);
        let (taken, generation) = {
            let state = self.lock();
            if theirs.is_none() && !prune && file.generation == Some(state.generation) {
                return Ok(false);
            }
            (state.history.clone(), state.generation)
        };
        meanwhile();
        let mut history = taken.clone();
        let mut changed = false;
        if let Some(theirs) = &theirs {
            let merged = history.merge(&self.limits, theirs, now);
            (self.metrics.prewarm_entries_refused_total)
                .fetch_add(merged.refused as u64, Ordering::Relaxed);
            changed |= merged.changed;
        }
        if prune {
            changed |= history.prune(&self.limits, now);
            file.pruned = Some(now / RESOLUTION);
        }
        // What the file holds once written: this generation, or one the state has passed.
        let mut holds = generation;
        if changed {
            holds = self.install(&taken, history.clone(), generation, now);
        }
        drop(taken);
        let held = match &theirs {
            Some(theirs) => *theirs == history,
            None => !changed && file.generation == Some(generation),
        };
        if held {
            (file.generation, file.digest) = (Some(holds), seen);
            return Ok(false);
        }
        let written = write(path, &history)?;
        (file.generation, file.digest) = (Some(holds), Some(written));
        Ok(true)
    }

    /// Puts `merged` (`taken` at `generation`, merged and pruned) in the place of the history,
    /// with the uses streams recorded since `taken` was (the services whose clusters are no
    /// longer `taken`'s). Returns the generation `merged` is now, or `generation` if the
    /// history has more than `merged`.
    fn install(&self, taken: &History, mut merged: History, generation: u64, now: u64) -> u64 {
        let oldest = now.saturating_sub(self.limits.max_age.as_secs());
        let mut state = self.lock();
        let since = state.generation != generation;
        if since {
            for (service, clusters) in &state.history.services {
                if (taken.services.get(service)).is_some_and(|c| Arc::ptr_eq(c, clusters)) {
                    continue;
                }
                for (cluster, last) in clusters.iter().filter(|(_, last)| **last >= oldest) {
                    if merged
                        .record(&self.limits, service, cluster, *last)
                        .over_bound()
                    {
                        inc(&self.metrics.prewarm_entries_refused_total);
                    }
                }
            }
        }
        let replaced = std::mem::replace(&mut state.history, merged);
        state.generation += 1;
        let holds = if since { generation } else { state.generation };
        drop(state);
        // The clusters only the replaced history held are freed without the lock.
        drop(replaced);
        holds
    }

    /// The admin's view: per service, what a connecting proxy would be sent now (with when
    /// each was last used), and the counts with the hit rate (used / pushed).
    pub fn view(&self, registered: impl Fn(&str) -> bool) -> serde_json::Value {
        let state = self.lock();
        let now = unix_now();
        let mut services = serde_json::Map::new();
        let names: BTreeSet<&str> = (state.history.services())
            .chain(state.counts.keys().map(String::as_str))
            .collect();
        for service in names {
            let predicted: Vec<serde_json::Value> = (state.history)
                .predict(&self.limits, service, now, &registered)
                .into_iter()
                .map(|cluster| {
                    let last = state.history.last_used(service, &cluster).unwrap_or(0);
                    serde_json::json!({ "cluster": cluster, "last_used_unix": last })
                })
                .collect();
            let counts = state.counts.get(service).cloned().unwrap_or_default();
            let hit_rate = (counts.pushed > 0).then(|| counts.used as f64 / counts.pushed as f64);
            services.insert(
                service.to_owned(),
                serde_json::json!({
                    "predicted": predicted,
                    "pushed": counts.pushed,
                    "used": counts.used,
                    "asked_on_demand": counts.asked,
                    "hit_rate": hit_rate,
                }),
            );
        }
        serde_json::json!({
            "enabled": true,
            "file": self.path.as_ref().map(|p| p.display().to_string()),
            "max_per_service": self.limits.max_per_service,
            "max_entries": self.limits.max_entries,
            "max_age_seconds": self.limits.max_age.as_secs(),
            "entries": state.history.len(),
            "services": services,
        })
    }

    /// How many (service, cluster) entries the history holds.
    pub fn len(&self) -> usize {
        self.lock().history.len()
    }

    /// Whether the history is empty.
    pub fn is_empty(&self) -> bool {
        self.lock().history.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use odmesh_base::error::{Chain, repeats_its_cause};

    const DAY: u64 = 24 * 3600;

    fn limits(max: usize) -> Limits {
        Limits {
            max_per_service: max,
            max_entries: DEFAULT_MAX_ENTRIES,
            max_age: Duration::from_secs(7 * DAY),
        }
    }

    fn all(_: &str) -> bool {
        true
    }

    #[test]
    fn a_service_is_predicted_what_its_proxies_used_most_recent_first() {
        let l = limits(10);
        let mut h = History::default();
        assert!(h.record(&l, "billing", "users.vip", 100).changed());
        assert!(h.record(&l, "billing", "ledger.svip", 200).changed());
        assert!(h.record(&l, "search", "index.vip", 300).changed());
        assert_eq!(
            h.record(&l, "billing", "users.vip", 50),
            Recorded::Unchanged,
            "an older use changes nothing"
        );
        assert_eq!(
            h.predict(&l, "billing", 400, all),
            ["ledger.svip", "users.vip"]
        );
        assert_eq!(h.predict(&l, "search", 400, all), ["index.vip"]);
        assert!(h.predict(&l, "unknown", 400, all).is_empty());
        assert_eq!(
            h.record(&l, "", "users.vip", 100),
            Recorded::Unchanged,
            "no service, no history"
        );
    }

    #[test]
    fn a_merged_history_keeps_to_the_bound_on_services() {
        let l = limits(10);
        let mut full = History::default();
        for i in 0..MAX_SERVICES {
            full.record(&l, &format!("service-{i}"), "users.vip", DAY);
        }
        let mut theirs = History::default();
        theirs.record(&l, "service-0", "ledger.vip", DAY);
        theirs.record(&l, "one-more", "users.vip", DAY);
        full.merge(&l, &theirs, DAY);
        assert_eq!(
            full.services().count(),
            MAX_SERVICES,
            "no service beyond the bound"
        );
        assert_eq!(
            full.last_used("service-0", "ledger.vip"),
            Some(DAY),
            "a known one merges"
        );
        assert_eq!(full.last_used("one-more", "users.vip"), None);
    }

    /// At most `entries` over all services, 10 per service.
    fn bounded(entries: usize) -> Limits {
        Limits {
            max_entries: entries,
            ..limits(10)
        }
    }

    #[test]
    fn a_full_history_takes_no_service_s_entries_for_a_flood_of_new_services() {
        let l = bounded(4);
        let mut h = History::default();
        h.record(&l, "billing", "a.vip", 10);
        h.record(&l, "billing", "b.vip", 10);
        h.record(&l, "search", "c.vip", 20);
        // A client naming ever new services, each use later than every real one.
        let flood: Vec<Recorded> = (0..100)
            .map(|i| h.record(&l, &format!("flood-{i}"), "c.vip", 100 + i))
            .collect();
        assert_eq!(flood[0], Recorded::Kept, "the room that was free");
        assert!(
            flood[1..].iter().all(|r| *r == Recorded::Refused),
            "{flood:?}"
        );
        assert_eq!(h.len(), 4);
        assert_eq!(h.predict(&l, "billing", 200, all), ["a.vip", "b.vip"]);
        assert_eq!(h.predict(&l, "search", 200, all), ["c.vip"]);

        // A known service keeps learning, in the place of its own least recently used.
        assert_eq!(h.record(&l, "billing", "d.vip", 200), Recorded::Replaced);
        assert_eq!(h.predict(&l, "billing", 200, all), ["d.vip", "b.vip"]);
        assert_eq!(
            h.predict(&l, "search", 200, all),
            ["c.vip"],
            "not another's"
        );
        assert_eq!(
            h.record(&l, "billing", "e.vip", 5),
            Recorded::Refused,
            "used before all it keeps"
        );
        assert_eq!(
            h.record(&l, "billing", "b.vip", 210),
            Recorded::Kept,
            "a later use of a kept one needs no room"
        );
        assert_eq!(h.len(), 4);

        // Once entries age out (search's, flood-0's), there is room again.
        assert!(h.prune(&l, 100 + 7 * DAY + 1));
        assert_eq!(h.len(), 2);
        assert_eq!(
            h.record(&l, "new", "c.vip", 8 * DAY),
            Recorded::Kept,
            "room again"
        );
    }

    #[test]
    fn a_merged_history_keeps_to_the_bound_on_entries_and_what_is_held_comes_first() {
        let l = bounded(4);
        let mut mine = History::default();
        mine.record(&l, "billing", "a.vip", 10);
        mine.record(&l, "billing", "b.vip", 20);
        mine.record(&l, "search", "c.vip", 30);
        // A file (another replica's, or anyone's who can write it) of many services, named to
        // come first, and of later uses of billing's.
        let mut theirs = History::default();
        let free = limits(10);
        for i in 0..50 {
            theirs.record(&free, &format!("aaa-{i}"), "x.vip", 1_000);
        }
        theirs.record(&free, "billing", "a.vip", 500);
        theirs.record(&free, "billing", "z.vip", 600);
        theirs.record(&free, "billing", "y.vip", 550);
        let over = mine.merge(&l, &theirs, 1_000).refused;
        assert_eq!(mine.len(), 4);
        assert_eq!(
            mine.predict(&l, "billing", 1_000, all),
            ["z.vip", "y.vip", "a.vip"],
            "a later use of a.vip; y.vip in the room left, z.vip in the place of b.vip"
        );
        assert_eq!(mine.predict(&l, "search", 1_000, all), ["c.vip"]);
        assert_eq!(mine.services().count(), 2, "no service of the file");
        assert_eq!(over, 51, "b.vip forgotten, the 50 services refused");

        // A file larger than the bound, read at start, is taken in within it.
        let metrics = Arc::new(Metrics::default());
        let ageless = Limits {
            max_age: Duration::from_secs(100 * 365 * DAY),
            ..l
        };
        let p = Prewarm::new(ageless, None, theirs, metrics.clone());
        assert_eq!(p.len(), 4);
        assert_eq!(
            metrics
                .prewarm_entries_refused_total
                .load(Ordering::Relaxed),
            49
        );
    }

    #[test]
    fn uses_beyond_the_bound_on_entries_are_counted_wherever_they_come_from() {
        let l = Limits {
            max_age: Duration::from_secs(100 * 365 * DAY),
            ..bounded(2)
        };
        let metrics = Arc::new(Metrics::default());
        let p = Prewarm::new(l, None, History::default(), metrics.clone());
        p.asked("billing", ["a.vip"]);
        let interval = Duration::from_secs(30);
        // Load reports of proxies claiming new services; on-demand asks of others.
        for i in 0..10 {
            p.report(
                &format!("node-{i}"),
                &format!("lrs-{i}"),
                &["a.vip"],
                interval,
            );
            p.asked(&format!("xds-{i}"), ["a.vip"]);
        }
        assert_eq!(p.len(), 2);
        assert_eq!(p.predict("billing", all), ["a.vip"]);
        assert_eq!(
            metrics
                .prewarm_entries_refused_total
                .load(Ordering::Relaxed),
            19 + 8,
            "lrs-0 took the room left in the history, node-0 and node-1 in the reports kept"
        );
    }

    #[test]
    fn a_cluster_gone_from_the_registry_is_not_predicted_and_an_unused_one_ages_out() {
        let l = limits(10);
        let mut h = History::default();
        h.record(&l, "billing", "users.vip", DAY);
        h.record(&l, "billing", "gone.vip", DAY);
        h.record(&l, "billing", "old.vip", 0);
        let now = 7 * DAY + 10;
        assert_eq!(
            h.predict(&l, "billing", now, |name| name != "gone.vip"),
            ["users.vip"],
            "old.vip was last used more than 7 days ago"
        );
        assert!(h.prune(&l, now));
        assert_eq!(h.last_used("billing", "old.vip"), None);
        assert_eq!(h.len(), 2, "gone.vip stays: it may come back");
        // Nothing used for 7 days: the service goes.
        assert!(h.prune(&l, 9 * DAY));
        assert!(h.is_empty());
    }

    #[test]
    fn each_service_keeps_its_most_recently_used_clusters_within_the_bound() {
        let l = limits(3);
        let mut h = History::default();
        for (i, name) in ["a.vip", "b.vip", "c.vip", "d.vip"].iter().enumerate() {
            h.record(&l, "svc", name, 10 + i as u64);
        }
        assert_eq!(h.len(), 3);
        assert_eq!(
            h.last_used("svc", "a.vip"),
            None,
            "the least recently used goes"
        );
        // b.vip used again: c.vip is now the oldest.
        h.record(&l, "svc", "b.vip", 20);
        h.record(&l, "svc", "e.vip", 21);
        assert_eq!(h.predict(&l, "svc", 30, all), ["e.vip", "b.vip", "d.vip"]);
    }

    #[test]
    fn merging_keeps_the_later_use_of_each_cluster_and_the_bounds() {
        let l = limits(2);
        let mut mine = History::default();
        mine.record(&l, "svc", "a.vip", 10);
        mine.record(&l, "svc", "b.vip", 30);
        let mut theirs = History::default();
        theirs.record(&l, "svc", "a.vip", 40);
        theirs.record(&l, "svc", "c.vip", 20);
        theirs.record(&l, "other", "x.vip", 5);
        mine.merge(&l, &theirs, 50);
        assert_eq!(mine.predict(&l, "svc", 50, all), ["a.vip", "b.vip"]);
        assert_eq!(mine.predict(&l, "other", 50, all), ["x.vip"]);
        // Merging is symmetric in what it keeps.
        let mut theirs_first = theirs.clone();
        let mut mine_again = History::default();
        mine_again.record(&l, "svc", "a.vip", 10);
        mine_again.record(&l, "svc", "b.vip", 30);
        theirs_first.merge(&l, &mine_again, 50);
        assert_eq!(theirs_first, mine);
    }

    #[test]
    fn the_file_reads_back_what_was_written_and_refuses_what_is_not_a_history() {
        let dir = std::env::temp_dir().join(format!("odmesh-prewarm-test-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("history.json");
        let _ = fs::remove_file(&path);
        assert_eq!(load(&path).unwrap(), History::default(), "absent: empty");

        let l = limits(10);
        let mut h = History::default();
        h.record(&l, "billing", "users.vip", 123);
        store(&path, &h).unwrap();
        assert_eq!(load(&path).unwrap(), h);
        let leftovers: Vec<_> = (fs::read_dir(&dir).unwrap())
            .map(|e| e.unwrap().file_name())
            .filter(|n| n.to_string_lossy().ends_with(".tmp"))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");

        fs::write(&path, b"{\"services\": {}}").unwrap();
        let err = Chain(&load(&path).unwrap_err()).to_string();
        assert!(err.contains("not an odmesh prewarm history"), "{err}");
        fs::write(&path, b"{\"odmesh_prewarm_history\": 2, \"services\": {}}").unwrap();
        let err = load(&path).unwrap_err();
        assert!(!repeats_its_cause(&err), "{}", Chain(&err));
        let err = Chain(&err).to_string();
        assert!(err.contains("format 2 is not 1"), "{err}");
        // A directory in its place cannot be read.
        let err = load(&dir).unwrap_err();
        assert!(matches!(err, LoadError::Read { .. }), "{err}");
        assert!(!repeats_its_cause(&err), "{}", Chain(&err));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn hits_are_pushed_clusters_that_then_carried_requests() {
        let p = Prewarm::new(limits(10), None, History::default(), Default::default());
        let interval = Duration::from_secs(1);
        // Two proxies of billing were sent users.vip and ledger.vip; proxy-1 used users.vip
        // (in two reports) and other.vip; proxy-2 nothing.
        for node in ["proxy-1", "proxy-2"] {
            p.pushed(node, "billing", &["users.vip", "ledger.vip"]);
        }
        p.report("proxy-1", "billing", &["users.vip", "other.vip"], interval);
        p.report("proxy-1", "billing", &["users.vip"], interval);
        p.asked("billing", ["new.vip"]);
        let view = p.view(all);
        let billing = &view["services"]["billing"];
        assert_eq!(billing["pushed"], 4);
        assert_eq!(
            billing["used"], 1,
            "counted once per push, for the proxy it was sent to"
        );
        assert_eq!(billing["asked_on_demand"], 1);
        assert_eq!(billing["hit_rate"], 0.25);
        let predicted: Vec<&str> = (billing["predicted"].as_array().unwrap().iter())
            .map(|e| e["cluster"].as_str().unwrap())
            .collect();
        let mut sorted = predicted.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, ["new.vip", "other.vip", "users.vip"]);
        assert_eq!(p.len(), 3);
    }

    #[test]
    fn a_cluster_is_idle_only_when_the_proxys_reports_cover_the_whole_timeout() {
        let p = Prewarm::new(limits(10), None, History::default(), Default::default());
        let (timeout, interval) = (Duration::from_secs(60), Duration::from_secs(10));
        let held = || [("used.vip", 0), ("idle.vip", 0), ("new.vip", 95)];
        assert!(
            p.idle_at("n1", held(), timeout, interval, 100).is_empty(),
            "no reports: nothing is idle"
        );
        for t in (0..=100).step_by(10) {
            let used: &[&str] = if t == 80 { &["used.vip"] } else { &[] };
            p.report_at("n1", "svc", used, interval, t);
        }
        // Reporting since 0, every 10 s: idle.vip carried nothing for 60 s; used.vip did at
        // 80; new.vip arrived 5 s ago.
        assert_eq!(
            p.idle_at("n1", held(), timeout, interval, 100),
            ["idle.vip"]
        );
        assert!(
            p.idle_at("n1", held(), timeout, interval, 131).is_empty(),
            "reports stopped: unknown"
        );
        // A gap in the reports: the window starts again.
        p.report_at("n1", "svc", &[], interval, 200);
        assert!(p.idle_at("n1", held(), timeout, interval, 200).is_empty());
        for t in (210..=260).step_by(10) {
            p.report_at("n1", "svc", &[], interval, t);
        }
        let mut idle = p.idle_at("n1", held(), timeout, interval, 260);
        idle.sort();
        assert_eq!(idle, ["idle.vip", "new.vip", "used.vip"]);
        assert!(
            p.idle_at("n2", held(), timeout, interval, 260).is_empty(),
            "another proxy"
        );
    }

    #[test]
    fn load_reports_of_new_node_ids_beyond_the_bound_are_not_kept_and_take_nothing_from_others() {
        let metrics = Arc::new(Metrics::default());
        let p = Prewarm::new(bounded(3), None, History::default(), metrics.clone());
        let (timeout, interval) = (Duration::from_secs(60), Duration::from_secs(10));
        let held = || [("a.vip", 0), ("b.vip", 0), ("idle.vip", 0)];
        let refused = || {
            metrics
                .prewarm_entries_refused_total
                .load(Ordering::Relaxed)
        };
        for t in (0..=100).step_by(10) {
            p.report_at("real", "svc", &["a.vip", "b.vip"], interval, t);
            // Proxies claiming a new node id at every report, each with two clusters (the
            // same: the history has room for them).
            p.report_at(
                &format!("flood-{t}"),
                "svc",
                &["a.vip", "b.vip"],
                interval,
                t,
            );
        }
        assert_eq!(refused(), 11, "no flood node fits beside the real one");
        assert_eq!(p.lock().node_entries, 2);
        assert_eq!(
            p.idle_at("real", held(), timeout, interval, 100),
            ["idle.vip"],
            "the real proxy's reports are all there"
        );
        // A report of the real proxy that no longer fits: its reports go, so nothing of it
        // is idle (the safe side).
        p.report_at("real", "svc", &["c.vip", "d.vip"], interval, 110);
        assert_eq!(
            refused(),
            11 + 2,
            "its reports, and d.vip in the full history"
        );
        assert!(p.idle_at("real", held(), timeout, interval, 110).is_empty());
        assert_eq!(p.lock().node_entries, 0);
        // Room again: it reports, and is idle-checked once it has for a whole timeout.
        p.report_at("real", "svc", &["a.vip"], interval, 120);
        assert_eq!(p.lock().node_entries, 1);
        p.reports_ended("real");
        assert_eq!(p.lock().node_entries, 0);
    }

    /// A history kept in a new file under the temporary folder, named `test`.
    fn in_a_file(test: &str) -> (PathBuf, Prewarm) {
        let dir =
            std::env::temp_dir().join(format!("odmesh-prewarm-{test}-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("history.json");
        let _ = fs::remove_file(&path);
        let p = Prewarm::new(
            limits(10),
            Some(path.clone()),
            History::default(),
            Default::default(),
        );
        (path, p)
    }

    #[test]
    fn a_save_holds_the_lock_only_for_a_snapshot_and_writes_without_it() {
        let (path, p) = in_a_file("unlocked");
        let now = unix_now();
        p.asked("billing", ["a.vip"]);
        p.asked("search", ["b.vip"]);
        assert!(p.save_with(now, || (), write).unwrap());
        p.asked("billing", ["c.vip"]);
        let mut wrote = false;
        let saved = p.save_with(
            now,
            || (),
            |path, snapshot| {
                // The streams' lock is free while the snapshot is serialised and written...
                let state = (p.state.try_lock()).expect("the state's lock is held while writing");
                // ... and the snapshot copied no service: search's, unchanged, is the state's.
                assert!(Arc::ptr_eq(
                    &snapshot.services["search"],
                    &state.history.services["search"]
                ));
                drop(state);
                // A stream records meanwhile: into the history, not into what is written.
                p.asked("billing", ["d.vip"]);
                assert_eq!(snapshot.last_used("billing", "d.vip"), None);
                wrote = true;
                write(path, snapshot)
            },
        );
        assert!(saved.unwrap() && wrote);
        let file = load(&path).unwrap();
        assert!(file.last_used("billing", "c.vip").is_some());
        assert_eq!(file.last_used("billing", "d.vip"), None);
        assert!(
            p.save_with(now, || (), write).unwrap(),
            "what was recorded meanwhile is written next"
        );
        assert!(load(&path).unwrap().last_used("billing", "d.vip").is_some());

        // Nothing recorded since, and the file as it was written: no snapshot, no write.
        let written = digest(&fs::read(&path).unwrap());
        assert_eq!(p.file.lock().unwrap().digest, Some(written), "it is known");
        let unchanged = p.save_with(
            now,
            || panic!("a snapshot was taken"),
            |_, _| panic!("written"),
        );
        assert!(!unchanged.unwrap());
        let next_minute = now + RESOLUTION;
        let pruned = p.save_with(next_minute, || (), |_, _| panic!("nothing aged: written"));
        assert!(
            !pruned.unwrap(),
            "a minute later: pruned, and nothing to write"
        );
        // A file someone else changed is read again, and one that is not a history is kept.
        fs::write(&path, b"not a history").unwrap();
        assert!(p.save_with(now, || (), write).is_err());
        assert_eq!(fs::read(&path).unwrap(), b"not a history");
        fs::remove_dir_all(path.parent().unwrap()).unwrap();
    }

    #[test]
    fn uses_recorded_while_a_save_merges_another_replicas_file_are_kept() {
        let (path, a) = in_a_file("meanwhile");
        let b = Prewarm::new(
            limits(10),
            Some(path.clone()),
            History::default(),
            Default::default(),
        );
        b.asked("search", ["b.vip"]);
        assert!(b.save().unwrap());
        a.asked("billing", ["a.vip"]);
        let saved = a.save_with(
            unix_now(),
            || {
                // The snapshot is taken; the file is merged into it without the lock, while a
                // stream records into a service of the snapshot, and into a new one.
                assert!(a.state.try_lock().is_ok());
                a.asked("billing", ["late.vip"]);
                a.asked("late", ["c.vip"]);
            },
            write,
        );
        assert!(saved.unwrap());
        let sorted = |mut names: Vec<String>| {
            names.sort();
            names
        };
        assert_eq!(sorted(a.predict("billing", all)), ["a.vip", "late.vip"]);
        assert_eq!(a.predict("search", all), ["b.vip"], "the file's");
        assert_eq!(a.predict("late", all), ["c.vip"]);
        let file = load(&path).unwrap();
        assert!(file.last_used("search", "b.vip").is_some());
        assert!(file.last_used("billing", "a.vip").is_some());
        assert_eq!(file.last_used("billing", "late.vip"), None, "not yet");
        assert!(
            a.save().unwrap(),
            "what was recorded meanwhile is written next"
        );
        let file = load(&path).unwrap();
        assert!(file.last_used("billing", "late.vip").is_some());
        assert!(file.last_used("late", "c.vip").is_some());
        assert!(!a.save().unwrap());
        fs::remove_dir_all(path.parent().unwrap()).unwrap();
    }

    #[test]
    fn replicas_sharing_a_file_each_end_up_with_both_histories() {
        let dir = std::env::temp_dir().join(format!("odmesh-prewarm-share-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("history.json");
        let _ = fs::remove_file(&path);
        let a = Prewarm::new(
            limits(10),
            Some(path.clone()),
            History::default(),
            Default::default(),
        );
        let b = Prewarm::new(
            limits(10),
            Some(path.clone()),
            History::default(),
            Default::default(),
        );
        a.asked("svc", ["a.vip"]);
        b.asked("svc", ["b.vip"]);
        assert!(a.save().unwrap());
        assert!(b.save().unwrap(), "b merges a's write into its own");
        assert!(!b.save().unwrap(), "nothing changed since");
        assert!(
            !a.save().unwrap(),
            "a takes b's part from the file, and has nothing to add"
        );
        for replica in [&a, &b] {
            let mut predicted = replica.predict("svc", all);
            predicted.sort();
            assert_eq!(predicted, ["a.vip", "b.vip"]);
        }
        fs::remove_dir_all(&dir).unwrap();
    }
}
