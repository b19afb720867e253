//! Prewarm from request history: which clusters each calling service's proxies used, and
//! when, so that a proxy of that service that connects (a deploy, a restart, autoscaling) is
//! sent them before any request has to wait for their discovery.
//!
//! - [`History`] is plain state with plain tests: per calling service (the Envoy node's
//!   `cluster`), each cluster name and when a proxy of that service last used it, bounded by
//!   count and age; the prediction for a proxy that connects; the merge of two histories.
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
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// Bounds on the history.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Cluster names kept per calling service (the most recently used win); also the most a
    /// connecting proxy is sent.
    pub max_per_service: usize,
    /// A cluster not used for this long is forgotten.
    pub max_age: Duration,
}

impl Default for Limits {
    /// 1,000 clusters per service, forgotten after 7 days unused.
    fn default() -> Limits {
        Limits {
            max_per_service: 1_000,
            max_age: Duration::from_secs(7 * 24 * 3600),
        }
    }
}

/// Per calling service, each cluster name and when it was last used (seconds since the Unix
/// epoch).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct History {
    services: BTreeMap<String, BTreeMap<String, u64>>,
}

impl History {
    /// Records that a proxy of `service` used `cluster` at `now`; keeps the service within
    /// `limits.max_per_service` by forgetting its least recently used cluster. Returns
    /// whether anything changed.
    pub fn record(&mut self, limits: &Limits, service: &str, cluster: &str, now: u64) -> bool {
        if service.is_empty() || limits.max_per_service == 0 {
            return false;
        }
        // A client naming ever new services (node.cluster is whatever it says) stops here.
        if !self.services.contains_key(service) && self.services.len() >= MAX_SERVICES {
            return false;
        }
        let clusters = self.services.entry(service.to_owned()).or_default();
        match clusters.get_mut(cluster) {
            Some(last) if *last >= now => return false,
            Some(last) => *last = now,
            None => {
                clusters.insert(cluster.to_owned(), now);
                if clusters.len() > limits.max_per_service {
                    evict_oldest(clusters, clusters.len() - limits.max_per_service);
                }
            }
        }
        true
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
    /// within `limits.max_per_service`. Returns whether anything was forgotten.
    pub fn prune(&mut self, limits: &Limits, now: u64) -> bool {
        let oldest = now.saturating_sub(limits.max_age.as_secs());
        let before = self.len();
        for clusters in self.services.values_mut() {
            clusters.retain(|_, last| *last >= oldest);
            if clusters.len() > limits.max_per_service {
                evict_oldest(clusters, clusters.len() - limits.max_per_service);
            }
        }
        self.services.retain(|_, clusters| !clusters.is_empty());
        self.len() != before
    }

    /// Takes in `other` (another replica's history, read from the shared file): for each
    /// cluster the later use wins; then the bounds apply.
    pub fn merge(&mut self, limits: &Limits, other: &History, now: u64) {
        for (service, clusters) in &other.services {
            // The same bound as for what this replica records: a file (another replica's, or
            // anyone's who can write it) naming ever new services stops here too.
            if !self.services.contains_key(service) && self.services.len() >= MAX_SERVICES {
                continue;
            }
            let mine = self.services.entry(service.clone()).or_default();
            for (cluster, last) in clusters {
                let entry = mine.entry(cluster.clone()).or_insert(*last);
                *entry = (*entry).max(*last);
            }
        }
        self.prune(limits, now);
    }

    /// How many (service, cluster) entries the history holds.
    pub fn len(&self) -> usize {
        self.services.values().map(BTreeMap::len).sum()
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
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct HistoryFile {
    /// Format version; 1 is the only one.
    odmesh_prewarm_history: u32,
    #[serde(flatten)]
    history: History,
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
    let bytes = match fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(History::default()),
        Err(source) => {
            return Err(LoadError::Read {
                path: path.to_owned(),
                source,
            });
        }
    };
    parse(&bytes).map_err(|source| LoadError::Parse {
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
    let file = HistoryFile {
        odmesh_prewarm_history: FORMAT,
        history: history.clone(),
    };
    let json = serde_json::to_vec_pretty(&file).map_err(io::Error::other)?;
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
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)?;
    let written = f.write_all(&json).and_then(|()| f.sync_all());
    if let Err(e) = written.and_then(|()| fs::rename(&tmp, path)) {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    // The rename is in the folder's entries: flushed too, or a crash may bring back the old
    // file (or none).
    fs::File::open(dir.unwrap_or(Path::new(".")))?.sync_all()
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
    /// A prewarm over `history` (as read from `path`, if it is kept in a file).
    pub fn new(limits: Limits, path: Option<PathBuf>, history: History) -> Prewarm {
        Prewarm {
            limits,
            path,
            state: Mutex::new(State {
                history,
                ..State::default()
            }),
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
        if !state.nodes.contains_key(node) && state.nodes.len() >= MAX_NODES {
            let oldest = (state.nodes.iter())
                .min_by_key(|(_, r)| r.last_report)
                .map(|(n, _)| n.clone());
            if let Some(oldest) = oldest {
                state.nodes.remove(&oldest);
            }
        }
        let reports = state.nodes.entry(node.to_owned()).or_default();
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
    }

    /// The proxy `node`'s load reports ended (its stream closed): what they said is dropped, so
    /// nothing it holds counts as idle until it reports again for a whole timeout.
    pub fn reports_ended(&self, node: &str) {
        self.lock().nodes.remove(node);
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
            state.history.record(&self.limits, service, name, minute);
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
    pub fn save(&self) -> io::Result<bool> {
        let Some(path) = &self.path else {
            return Ok(false);
        };
        let now = unix_now();
        // A file that cannot be read now (an I/O error, or something another writer left that
        // is not a history of this format) is not overwritten: the error is reported, the
        // history stays in memory, and the next save tries again.
        let theirs = Some(load(path).map_err(io::Error::other)?);
        let history = {
            let mut state = self.lock();
            state.history.prune(&self.limits, now);
            if let Some(theirs) = &theirs {
                state.history.merge(&self.limits, theirs, now);
            }
            if theirs.as_ref() == Some(&state.history) {
                return Ok(false);
            }
            state.history.clone()
        };
        store(path, &history)?;
        Ok(true)
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
        assert!(h.record(&l, "billing", "users.vip", 100));
        assert!(h.record(&l, "billing", "ledger.svip", 200));
        assert!(h.record(&l, "search", "index.vip", 300));
        assert!(
            !h.record(&l, "billing", "users.vip", 50),
            "an older use changes nothing"
        );
        assert_eq!(
            h.predict(&l, "billing", 400, all),
            ["ledger.svip", "users.vip"]
        );
        assert_eq!(h.predict(&l, "search", 400, all), ["index.vip"]);
        assert!(h.predict(&l, "unknown", 400, all).is_empty());
        assert!(
            !h.record(&l, "", "users.vip", 100),
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
        let p = Prewarm::new(limits(10), None, History::default());
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
        let p = Prewarm::new(limits(10), None, History::default());
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
    fn replicas_sharing_a_file_each_end_up_with_both_histories() {
        let dir = std::env::temp_dir().join(format!("odmesh-prewarm-share-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("history.json");
        let _ = fs::remove_file(&path);
        let a = Prewarm::new(limits(10), Some(path.clone()), History::default());
        let b = Prewarm::new(limits(10), Some(path.clone()), History::default());
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
