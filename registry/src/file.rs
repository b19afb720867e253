//! The registry file source (`--registry FILE`): Eureka JSON or the YAML form, loaded once at
//! start and then watched.
//!
//! The YAML form is read here ([`yaml`]); Eureka's JSON is read by the [`JsonReader`] the
//! caller passes (`odmesh_eureka::wire::json::read_registry_file`): the format is Eureka's, and
//! this crate does not depend on the one that knows it.
//!
//! Watching polls the file's metadata (device, inode, size, mtime, ctime) every interval
//! (200 ms by default) and re-reads on any change, so an edit in place, an atomic rename over
//! the file, and a deletion followed by re-creation all take effect within one interval. A
//! content hash skips reloads that change nothing. Because a write within the same mtime
//! tick can keep the metadata unchanged, a file modified in the last two seconds is also
//! re-read (and re-hashed) on every poll. A modification time in the future (clock skew)
//! counts from when the watcher first saw it instead, so such a file is re-read for two
//! seconds too, not on every poll forever.
//!
//! A file that fails to load is reported (log, `registry_load_errors_total`, the
//! [`SourceHealth`]) once per distinct content, and the last good registry stays in use.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use odmesh_base::error::Chain;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::guard::{DropGuard, DropGuardConfig, publish_guarded};
use crate::{Parsed, Registry, RegistryMetrics, SourceHealth, yaml};

/// How often the file source looks at the file, unless told otherwise.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(200);

/// A file modified this recently is re-read on every poll (see the module docs).
const RACY_WINDOW: Duration = Duration::from_secs(2);

/// The two formats a registry file may have.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Eureka's `/apps` JSON (the content starts with `{`).
    EurekaJson,
    /// The short YAML form (anything else).
    Yaml,
}

impl Format {
    /// Tells the format by content: JSON starts with `{` (after whitespace and a BOM).
    pub fn detect(content: &[u8]) -> Format {
        let content = content.strip_prefix(b"\xef\xbb\xbf").unwrap_or(content);
        match content.iter().find(|b| !b.is_ascii_whitespace()) {
            Some(b'{') => Format::EurekaJson,
            _ => Format::Yaml,
        }
    }
}

/// Reads a registry file of the JSON form, Eureka's `/apps` document (see the module docs).
pub type JsonReader = fn(&[u8]) -> Result<Parsed, JsonError>;

/// Why a [`JsonReader`] could not read a file, in its own words.
pub type JsonError = Box<dyn std::error::Error + Send + Sync>;

/// Why a registry file could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot read registry file {path}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("registry file {path} (Eureka JSON)")]
    Eureka { path: PathBuf, source: JsonError },
    #[error("registry file {path} (YAML)")]
    Yaml {
        path: PathBuf,
        source: yaml::InvalidYaml,
    },
}

/// Parses registry file content of either format, the JSON form with `json`. `path` only
/// names the file in errors.
pub fn parse(path: &Path, content: &[u8], json: JsonReader) -> Result<Parsed, LoadError> {
    let content = content.strip_prefix(b"\xef\xbb\xbf").unwrap_or(content);
    match Format::detect(content) {
        Format::EurekaJson => json(content).map_err(|source| LoadError::Eureka {
            path: path.to_owned(),
            source,
        }),
        Format::Yaml => yaml::parse(content)
            .map(|registry| Parsed {
                registry,
                warnings: Vec::new(),
            })
            .map_err(|source| LoadError::Yaml {
                path: path.to_owned(),
                source,
            }),
    }
}

/// Reads and parses the file once, the JSON form with `json`.
pub fn load(path: &Path, json: JsonReader) -> Result<Parsed, LoadError> {
    let content = std::fs::read(path).map_err(|source| LoadError::Io {
        path: path.to_owned(),
        source,
    })?;
    parse(path, &content, json)
}

/// A running file source: the registry in use, how the source is doing, and its task.
#[derive(Debug)]
pub struct FileSource {
    /// The last good registry; changes when the file does.
    pub registry: watch::Receiver<Arc<Registry>>,
    /// For `/readyz` and `/debug/registry`.
    pub health: SourceHealth,
    /// The watcher; it ends when every receiver of `registry` is dropped.
    pub task: JoinHandle<()>,
}

/// Loads `path` (a missing or invalid file is an error for the caller), then spawns a task
/// that watches it every `interval` and publishes each new good registry. The JSON form is
/// read with `json`.
pub async fn start(
    path: impl Into<PathBuf>,
    interval: Duration,
    json: JsonReader,
    metrics: Arc<RegistryMetrics>,
) -> Result<FileSource, LoadError> {
    start_guarded(path, interval, DropGuardConfig::default(), json, metrics).await
}

/// [`start`], with a drop guard of `guard` (see [`crate::guard`]).
pub async fn start_guarded(
    path: impl Into<PathBuf>,
    interval: Duration,
    guard: DropGuardConfig,
    json: JsonReader,
    metrics: Arc<RegistryMetrics>,
) -> Result<FileSource, LoadError> {
    let path = path.into();
    let health = SourceHealth::new(format!("file {}", path.display()));
    let mut watcher = Watcher::new(path, json, metrics, health.clone());
    let first = match watcher.poll().await {
        Poll::Loaded(parsed) => parsed.registry,
        Poll::Failed(e) => return Err(e),
        // Not reachable on a first poll; treat as empty rather than panic.
        Poll::Unchanged => Registry::default(),
    };
    let (tx, registry) = watch::channel(Arc::new(first));
    let task = tokio::spawn(watcher.run(interval, DropGuard::new(guard), tx));
    Ok(FileSource {
        registry,
        health,
        task,
    })
}

/// What identifies one version of the file without reading it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: Option<SystemTime>,
    ctime: (i64, i64),
}

impl Stamp {
    fn of(meta: &std::fs::Metadata) -> Stamp {
        #[cfg(unix)]
        let (dev, ino, ctime) = {
            use std::os::unix::fs::MetadataExt;
            (meta.dev(), meta.ino(), (meta.ctime(), meta.ctime_nsec()))
        };
        #[cfg(not(unix))]
        let (dev, ino, ctime) = (0, 0, (0, 0));
        Stamp {
            dev,
            ino,
            len: meta.len(),
            mtime: meta.modified().ok(),
            ctime,
        }
    }

    /// Whether a later write could have kept this stamp (same mtime tick), `seen_for` after
    /// the watcher first saw it. An mtime in the future (clock skew) has no age: the time
    /// since it was first seen stands for it.
    fn is_recent(&self, now: SystemTime, seen_for: Duration) -> bool {
        match self.mtime {
            Some(m) => now.duration_since(m).unwrap_or(seen_for) < RACY_WINDOW,
            None => true,
        }
    }
}

/// What one look at the file found.
#[derive(Debug)]
enum Poll {
    /// Same file, same content (or the same failure as last time).
    Unchanged,
    Loaded(Parsed),
    Failed(LoadError),
}

/// What the watcher knows of the file as it last read it.
struct LastRead {
    stamp: Stamp,
    /// The hash of its content.
    hash: u64,
    /// When the watcher first saw this stamp (re-reads of the same stamp keep it).
    seen: Instant,
}

/// The polling state of one file, and where it reports.
struct Watcher {
    path: PathBuf,
    json: JsonReader,
    metrics: Arc<RegistryMetrics>,
    health: SourceHealth,
    /// The last read, good or bad; `None` when the file was missing (or never read).
    last: Option<LastRead>,
    missing_reported: bool,
}

impl Watcher {
    fn new(
        path: PathBuf,
        json: JsonReader,
        metrics: Arc<RegistryMetrics>,
        health: SourceHealth,
    ) -> Watcher {
        Watcher {
            path,
            json,
            metrics,
            health,
            last: None,
            missing_reported: false,
        }
    }

    /// Looks at the file; reads and parses it if it may have changed; records the outcome
    /// in the health and metrics.
    async fn poll(&mut self) -> Poll {
        let outcome = self.look().await;
        match &outcome {
            Poll::Unchanged => {}
            Poll::Loaded(parsed) => {
                for w in &parsed.warnings {
                    tracing::warn!(path = %self.path.display(), "registry entry skipped: {w}");
                }
                self.health
                    .record_success(&self.metrics, &parsed.registry, &parsed.warnings);
                tracing::info!(
                    path = %self.path.display(),
                    instances = parsed.registry.len(),
                    "registry loaded"
                );
            }
            Poll::Failed(e) => {
                tracing::warn!(error = %Chain(e), "registry file not loaded; keeping the last good registry");
                self.health.record_error(&self.metrics, e);
            }
        }
        outcome
    }

    async fn look(&mut self) -> Poll {
        // Metadata first, content second: a change in between shows in the next stamp.
        let stamp = match tokio::fs::metadata(&self.path).await {
            Ok(meta) => Stamp::of(&meta),
            Err(e) => return self.gone(e),
        };
        if !self.may_have_changed(&stamp) {
            return Poll::Unchanged;
        }
        let content = match tokio::fs::read(&self.path).await {
            Ok(content) => content,
            Err(e) => return self.gone(e),
        };
        self.missing_reported = false;
        let hash = {
            let mut h = DefaultHasher::new();
            content.hash(&mut h);
            h.finish()
        };
        let same_content = self.last.as_ref().is_some_and(|last| last.hash == hash);
        let seen = match &self.last {
            Some(last) if last.stamp == stamp => last.seen,
            _ => Instant::now(),
        };
        self.last = Some(LastRead { stamp, hash, seen });
        if same_content {
            return Poll::Unchanged;
        }
        match parse(&self.path, &content, self.json) {
            Ok(parsed) => Poll::Loaded(parsed),
            Err(e) => Poll::Failed(e),
        }
    }

    /// Whether the file must be read: its stamp changed since the last read, or a later
    /// write could have kept it.
    fn may_have_changed(&self, stamp: &Stamp) -> bool {
        match &self.last {
            Some(last) if last.stamp == *stamp => {
                stamp.is_recent(SystemTime::now(), last.seen.elapsed())
            }
            _ => true,
        }
    }

    /// The file cannot be read: report it once until it can be again.
    fn gone(&mut self, source: std::io::Error) -> Poll {
        self.last = None;
        if self.missing_reported {
            return Poll::Unchanged;
        }
        self.missing_reported = true;
        Poll::Failed(LoadError::Io {
            path: self.path.clone(),
            source,
        })
    }

    /// Publishes each new good registry, through `guard`: a file that lost most of the
    /// registry is held until it has said so for the guard's confirmation time (every poll
    /// of the unchanged file says so again).
    async fn run(
        mut self,
        interval: Duration,
        mut guard: DropGuard,
        tx: watch::Sender<Arc<Registry>>,
    ) {
        let mut ticks = tokio::time::interval(interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut held: Option<Registry> = None;
        loop {
            tokio::select! {
                _ = ticks.tick() => {}
                () = tx.closed() => return,
            }
            let next = match self.poll().await {
                Poll::Loaded(parsed) => Some(parsed.registry),
                // The file still says what it said: a held drop may be confirmed.
                Poll::Unchanged => held.take(),
                // Unreadable now: that confirms nothing. The drop stays held, and a file that
                // says it again later is timed afresh.
                Poll::Failed(_) => {
                    held = None;
                    guard.restart();
                    None
                }
            };
            if let Some(next) = next {
                publish_guarded(&mut guard, &tx, next.clone(), &self.health, &self.metrics);
                held = guard.is_holding().then_some(next);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use odmesh_base::error::repeats_its_cause;
    use odmesh_base::testing::{hold_for, wait_until};
    use std::sync::atomic::Ordering;

    /// Generous: the poll interval bounds the real latency; this only bounds a slow CI.
    const DEADLINE: Duration = Duration::from_secs(5);

    const ONE: &str = "instances:\n  - {app: hello, ip: 127.0.0.1, port: 8081}\n";
    const TWO: &str = "instances:\n  - {app: hello, ip: 127.0.0.1, port: 8081}\n  - {app: hello, ip: 127.0.0.2, port: 8081}\n";
    const THREE: &str = "instances:\n  - {app: hello, ip: 127.0.0.1, port: 8081}\n  - {app: hello, ip: 127.0.0.2, port: 8081}\n  - {app: hello, ip: 127.0.0.3, port: 8081}\n";
    const BROKEN: &str = "instances:\n  - {app: hello, ip: not-an-ip, port: 8081}\n";

    /// A directory under the system temp dir, removed on drop.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(name: &str) -> TempDir {
            let nanos = SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap()
                .as_nanos();
            let dir =
                std::env::temp_dir().join(format!("odmesh-{name}-{}-{nanos}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            TempDir(dir)
        }

        fn file(&self, name: &str, content: &str) -> PathBuf {
            let path = self.0.join(name);
            std::fs::write(&path, content).unwrap();
            path
        }

        /// Writes `content` next to `path` and renames it over `path`, as editors and
        /// config-management tools do.
        fn replace_atomically(&self, path: &Path, content: &str) {
            let tmp = self.0.join(".registry.tmp");
            std::fs::write(&tmp, content).unwrap();
            std::fs::rename(&tmp, path).unwrap();
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    use crate::testdata::path as testdata;

    /// Stands in for Eureka's JSON reader (odmesh-eureka reads its fixtures through this
    /// source with the real one): `{}` is an empty registry, anything else is refused.
    fn json(content: &[u8]) -> Result<Parsed, JsonError> {
        match content.trim_ascii() {
            b"{}" => Ok(Parsed::default()),
            _ => Err("not valid JSON".into()),
        }
    }

    async fn wait_for_instances(source: &mut FileSource, n: usize) {
        let found =
            tokio::time::timeout(DEADLINE, source.registry.wait_for(|r| r.len() == n)).await;
        assert!(
            matches!(found, Ok(Ok(_))),
            "registry never had {n} instances; status {:?}",
            source.health.snapshot()
        );
    }

    #[test]
    fn json_is_told_from_yaml_by_its_first_character() {
        assert_eq!(
            Format::detect(b"  \n{\"applications\": {}}"),
            Format::EurekaJson
        );
        assert_eq!(Format::detect(b"\xef\xbb\xbf{}"), Format::EurekaJson);
        assert_eq!(Format::detect(b"instances: []"), Format::Yaml);
        assert_eq!(Format::detect(b"# {not json}\ninstances: []"), Format::Yaml);
    }

    #[test]
    fn yaml_is_read_here_and_json_by_the_json_reader() {
        assert_eq!(
            load(&testdata("registry.yaml"), json)
                .unwrap()
                .registry
                .len(),
            5
        );
        let parsed = parse(Path::new("r.json"), b"\xef\xbb\xbf {}\n", json).unwrap();
        assert_eq!(parsed, Parsed::default());
    }

    #[test]
    fn a_broken_file_is_an_error_that_names_the_file_and_format() {
        let err = parse(Path::new("broken.json"), b"{", json).unwrap_err();
        assert!(matches!(err, LoadError::Eureka { .. }));
        let err = Chain(&err).to_string();
        assert!(
            err.contains("broken.json (Eureka JSON): not valid JSON"),
            "{err}"
        );
        let err = load(&testdata("registry-bad-ip.yaml"), json).unwrap_err();
        let err = Chain(&err).to_string();
        assert!(
            err.contains("(YAML): instance 2 (app \"greeter\")"),
            "{err}"
        );
    }

    #[test]
    fn a_load_error_shows_its_cause_once() {
        for err in [
            load(Path::new("/nonexistent/odmesh/r.yaml"), json).unwrap_err(),
            parse(Path::new("broken.json"), b"{", json).unwrap_err(),
            load(&testdata("registry-bad-ip.yaml"), json).unwrap_err(),
            parse(Path::new("r.yaml"), b"instances: 3\n", json).unwrap_err(),
        ] {
            assert!(std::error::Error::source(&err).is_some(), "{err}");
            assert!(!repeats_its_cause(&err), "{}", Chain(&err));
        }
    }

    #[tokio::test]
    async fn a_missing_file_at_start_is_an_error_for_the_caller() {
        let dir = TempDir::new("missing");
        let metrics = Arc::new(RegistryMetrics::default());
        let err = start(
            dir.0.join("nope.yaml"),
            DEFAULT_POLL_INTERVAL,
            json,
            metrics,
        )
        .await
        .unwrap_err();
        assert!(matches!(err, LoadError::Io { .. }), "{err}");
    }

    #[tokio::test]
    async fn a_broken_file_at_start_is_an_error_for_the_caller() {
        let dir = TempDir::new("broken-start");
        let path = dir.file("registry.yaml", BROKEN);
        let metrics = Arc::new(RegistryMetrics::default());
        let err = start(path, DEFAULT_POLL_INTERVAL, json, metrics.clone())
            .await
            .unwrap_err();
        assert!(matches!(err, LoadError::Yaml { .. }), "{err}");
        assert_eq!(
            metrics.registry_load_errors_total.load(Ordering::Relaxed),
            1
        );
    }

    #[tokio::test]
    async fn start_loads_the_file_and_records_success() {
        let dir = TempDir::new("start");
        let path = dir.file("registry.yaml", TWO);
        let metrics = Arc::new(RegistryMetrics::default());
        let source = start(&path, DEFAULT_POLL_INTERVAL, json, metrics.clone())
            .await
            .unwrap();
        assert_eq!(source.registry.borrow().len(), 2);
        let st = source.health.snapshot();
        assert!(st.loaded && st.last_error.is_none() && st.last_success.is_some());
        assert_eq!(st.instances, 2);
        assert!(st.description.ends_with("registry.yaml"));
        assert_eq!(metrics.registry_loads_total.load(Ordering::Relaxed), 1);
        assert_eq!(metrics.registry_instances.load(Ordering::Relaxed), 2);
    }

    #[tokio::test]
    async fn an_in_place_write_is_reloaded() {
        let dir = TempDir::new("write");
        let path = dir.file("registry.yaml", ONE);
        let metrics = Arc::new(RegistryMetrics::default());
        let mut source = start(&path, DEFAULT_POLL_INTERVAL, json, metrics.clone())
            .await
            .unwrap();

        std::fs::write(&path, TWO).unwrap();
        wait_for_instances(&mut source, 2).await;
        std::fs::write(&path, THREE).unwrap();
        wait_for_instances(&mut source, 3).await;
        assert_eq!(metrics.registry_instances.load(Ordering::Relaxed), 3);
    }

    #[tokio::test]
    async fn an_atomic_rename_over_the_file_is_reloaded() {
        let dir = TempDir::new("rename");
        let path = dir.file("registry.yaml", ONE);
        let metrics = Arc::new(RegistryMetrics::default());
        let mut source = start(&path, DEFAULT_POLL_INTERVAL, json, metrics)
            .await
            .unwrap();

        dir.replace_atomically(&path, TWO);
        wait_for_instances(&mut source, 2).await;
        dir.replace_atomically(&path, THREE);
        wait_for_instances(&mut source, 3).await;
    }

    #[tokio::test]
    async fn a_file_can_switch_format_from_yaml_to_eureka_json() {
        let dir = TempDir::new("switch");
        let path = dir.file("registry", TWO);
        let metrics = Arc::new(RegistryMetrics::default());
        let mut source = start(&path, DEFAULT_POLL_INTERVAL, json, metrics)
            .await
            .unwrap();

        dir.replace_atomically(&path, "{}\n");
        wait_for_instances(&mut source, 0).await;
    }

    #[tokio::test]
    async fn a_broken_file_keeps_the_last_good_registry_until_it_is_fixed() {
        let dir = TempDir::new("broken");
        let path = dir.file("registry.yaml", TWO);
        let metrics = Arc::new(RegistryMetrics::default());
        let mut source = start(&path, DEFAULT_POLL_INTERVAL, json, metrics.clone())
            .await
            .unwrap();

        dir.replace_atomically(&path, BROKEN);
        let health = source.health.clone();
        wait_until(DEADLINE, "the error to be reported", || {
            health.snapshot().last_error.is_some()
        })
        .await;
        let st = source.health.snapshot();
        assert!(st.loaded, "still serving the last good registry");
        assert!(st.last_error.unwrap().contains("not-an-ip"));
        assert_eq!(source.registry.borrow().len(), 2);
        assert!(
            !source.registry.has_changed().unwrap(),
            "nothing was published"
        );
        assert_eq!(
            metrics.registry_load_errors_total.load(Ordering::Relaxed),
            1
        );
        assert_eq!(metrics.registry_instances.load(Ordering::Relaxed), 2);

        dir.replace_atomically(&path, THREE);
        wait_for_instances(&mut source, 3).await;
        assert_eq!(source.health.snapshot().last_error, None);
        assert_eq!(
            metrics.registry_load_errors_total.load(Ordering::Relaxed),
            1,
            "the broken content was reported once, not on every poll"
        );
    }

    #[tokio::test]
    async fn a_file_with_an_unknown_field_keeps_the_last_good_registry_and_says_where() {
        let dir = TempDir::new("unknown-field");
        let path = dir.file("registry.yaml", TWO);
        let metrics = Arc::new(RegistryMetrics::default());
        let source = start(&path, DEFAULT_POLL_INTERVAL, json, metrics.clone())
            .await
            .unwrap();

        dir.replace_atomically(
            &path,
            &format!("{TWO}  - {{app: hello, ip: 127.0.0.3, prot: 8081}}\n"),
        );
        let health = source.health.clone();
        wait_until(DEADLINE, "the error to be reported", || {
            health.snapshot().last_error.is_some()
        })
        .await;
        let st = source.health.snapshot();
        assert!(st.loaded, "still serving the last good registry");
        let error = st.last_error.unwrap();
        assert!(error.contains("unknown field `prot`"), "{error}");
        assert!(error.contains("line 4, column 33"), "{error}");
        assert_eq!(source.registry.borrow().len(), 2);
        assert!(
            !source.registry.has_changed().unwrap(),
            "nothing was published"
        );
        assert_eq!(metrics.registry_instances.load(Ordering::Relaxed), 2);
    }

    #[tokio::test]
    async fn a_deleted_file_keeps_the_last_good_registry_and_its_recreation_is_loaded() {
        let dir = TempDir::new("delete");
        let path = dir.file("registry.yaml", ONE);
        let metrics = Arc::new(RegistryMetrics::default());
        let mut source = start(&path, DEFAULT_POLL_INTERVAL, json, metrics.clone())
            .await
            .unwrap();

        std::fs::remove_file(&path).unwrap();
        let health = source.health.clone();
        wait_until(DEADLINE, "the deletion to be reported", || {
            health.snapshot().last_error.is_some()
        })
        .await;
        assert_eq!(source.registry.borrow().len(), 1);

        std::fs::write(&path, TWO).unwrap();
        wait_for_instances(&mut source, 2).await;
        assert_eq!(source.health.snapshot().last_error, None);
        assert_eq!(
            metrics.registry_load_errors_total.load(Ordering::Relaxed),
            1
        );
    }

    #[tokio::test]
    async fn rewriting_the_same_content_is_not_a_reload() {
        let dir = TempDir::new("same");
        let path = dir.file("registry.yaml", ONE);
        let metrics = Arc::new(RegistryMetrics::default());
        let health = SourceHealth::new("test");
        let mut watcher = Watcher::new(path.clone(), json, metrics.clone(), health);

        assert!(matches!(watcher.poll().await, Poll::Loaded(_)));
        assert!(matches!(watcher.poll().await, Poll::Unchanged));
        dir.replace_atomically(&path, ONE);
        assert!(matches!(watcher.poll().await, Poll::Unchanged));
        std::fs::write(&path, TWO).unwrap();
        assert!(matches!(watcher.poll().await, Poll::Loaded(_)));
        assert_eq!(metrics.registry_loads_total.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn an_mtime_in_the_future_is_recent_only_for_the_window_after_it_was_first_seen() {
        let now = SystemTime::now();
        let stamp = |mtime: SystemTime| Stamp {
            dev: 1,
            ino: 2,
            len: 3,
            mtime: Some(mtime),
            ctime: (0, 0),
        };
        let past = stamp(now - Duration::from_secs(1));
        assert!(past.is_recent(now, Duration::from_secs(60)), "1 s old");
        let old = stamp(now - Duration::from_secs(3));
        assert!(!old.is_recent(now, Duration::ZERO), "3 s old");
        let future = stamp(now + Duration::from_secs(3600));
        assert!(future.is_recent(now, Duration::ZERO));
        assert!(future.is_recent(now, Duration::from_secs(1)));
        assert!(!future.is_recent(now, RACY_WINDOW));
    }

    #[tokio::test]
    async fn a_file_dated_in_the_future_is_not_read_on_every_poll_forever() {
        let dir = TempDir::new("future");
        let path = dir.file("registry.yaml", ONE);
        std::fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(SystemTime::now() + Duration::from_secs(3600))
            .unwrap();
        let mut watcher = Watcher::new(
            path.clone(),
            json,
            Arc::new(RegistryMetrics::default()),
            SourceHealth::new("test"),
        );
        assert!(matches!(watcher.poll().await, Poll::Loaded(_)));
        let stamp = Stamp::of(&std::fs::metadata(&path).unwrap());
        assert!(watcher.may_have_changed(&stamp), "just seen: re-read");
        assert!(matches!(watcher.poll().await, Poll::Unchanged));
        // As if the stamp had been seen a window ago (re-reads did not reset that).
        let last = watcher.last.as_mut().unwrap();
        last.seen = Instant::now().checked_sub(RACY_WINDOW).unwrap();
        assert!(
            !watcher.may_have_changed(&stamp),
            "no re-read after the window"
        );
        let other = Stamp {
            len: stamp.len + 1,
            ..stamp
        };
        assert!(watcher.may_have_changed(&other), "a new stamp is read");
    }

    /// The YAML of `n` instances of hello.
    fn instances(n: usize) -> String {
        let mut yaml = String::from("instances:\n");
        for i in 0..n {
            yaml.push_str(&format!(
                "  - {{app: hello, ip: 10.0.0.{}, port: 8081}}\n",
                i + 1
            ));
        }
        yaml
    }

    async fn start_with_guard(
        path: &Path,
        confirm_after: Duration,
    ) -> (FileSource, Arc<RegistryMetrics>) {
        let metrics = Arc::new(RegistryMetrics::default());
        let guard = DropGuardConfig {
            max_drop: 0.5,
            confirm_after,
        };
        let source = start_guarded(
            path,
            Duration::from_millis(50),
            guard,
            json,
            metrics.clone(),
        )
        .await
        .unwrap();
        (source, metrics)
    }

    #[tokio::test]
    async fn a_file_that_loses_most_of_the_registry_is_held_until_it_has_said_so_long_enough() {
        let dir = TempDir::new("drop");
        let path = dir.file("registry.yaml", &instances(20));
        let confirm = Duration::from_millis(600);
        let (mut source, metrics) = start_with_guard(&path, confirm).await;
        assert_eq!(source.registry.borrow().len(), 20);

        // A truncated file: 2 of 20 instances left.
        dir.replace_atomically(&path, &instances(2));
        let health = source.health.clone();
        wait_until(DEADLINE, "the drop to be held", || {
            health.snapshot().holding.is_some()
        })
        .await;
        let held_at = Instant::now();
        assert_eq!(source.registry.borrow().len(), 20);
        assert_eq!(metrics.registry_drops_held_total.load(Ordering::Relaxed), 1);
        assert_eq!(source.health.snapshot().instances, 20, "what is in use");
        assert_eq!(metrics.registry_instances.load(Ordering::Relaxed), 20);

        // The file keeps saying so: followed once the confirmation time has passed.
        wait_for_instances(&mut source, 2).await;
        assert!(
            held_at.elapsed() + Duration::from_millis(100) >= confirm,
            "followed after {:?}",
            held_at.elapsed()
        );
        assert!(source.health.snapshot().holding.is_none());
    }

    #[tokio::test]
    async fn a_held_drop_is_not_confirmed_by_a_file_that_then_breaks() {
        let dir = TempDir::new("drop-broken");
        let path = dir.file("registry.yaml", &instances(20));
        let confirm = Duration::from_millis(300);
        let (source, _metrics) = start_with_guard(&path, confirm).await;
        dir.replace_atomically(&path, &instances(2));
        let health = source.health.clone();
        wait_until(DEADLINE, "the drop to be held", || {
            health.snapshot().holding.is_some()
        })
        .await;
        dir.replace_atomically(&path, BROKEN);
        wait_until(DEADLINE, "the broken file to be reported", || {
            health.snapshot().last_error.is_some()
        })
        .await;
        // Well past the confirmation time, still the registry in use before the drop.
        hold_for(
            confirm * 3,
            "the registry in use before the drop (20 instances)",
            || source.registry.borrow().len() == 20,
        )
        .await;
        assert!(health.snapshot().holding.is_some());
    }

    #[tokio::test]
    async fn a_file_fixed_before_its_drop_is_confirmed_is_followed_and_the_drop_never_applied() {
        let dir = TempDir::new("drop-fixed");
        let path = dir.file("registry.yaml", &instances(20));
        let (mut source, _metrics) = start_with_guard(&path, Duration::from_secs(3600)).await;
        source.registry.mark_unchanged();
        dir.replace_atomically(&path, "instances: []\n");
        let health = source.health.clone();
        wait_until(DEADLINE, "the drop to be held", || {
            health.snapshot().holding.is_some()
        })
        .await;
        dir.replace_atomically(&path, &instances(19));
        wait_for_instances(&mut source, 19).await;
        assert!(source.health.snapshot().holding.is_none());
    }

    #[tokio::test]
    async fn the_watcher_stops_when_every_receiver_is_gone() {
        let dir = TempDir::new("stop");
        let path = dir.file("registry.yaml", ONE);
        let source = start(
            &path,
            DEFAULT_POLL_INTERVAL,
            json,
            Arc::new(RegistryMetrics::default()),
        )
        .await
        .unwrap();
        let FileSource { registry, task, .. } = source;
        drop(registry);
        tokio::time::timeout(DEADLINE, task)
            .await
            .expect("the task ended")
            .expect("without panicking");
    }
}
