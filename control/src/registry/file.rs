//! The registry file source (`--registry FILE`): Eureka JSON or the YAML form, loaded once at
//! start and then watched.
//!
//! Watching polls the file's metadata (device, inode, size, mtime, ctime) every interval
//! (200 ms by default) and re-reads on any change, so an edit in place, an atomic rename over
//! the file, and a deletion followed by re-creation all take effect within one interval. A
//! content hash skips reloads that change nothing. Because a write within the same mtime
//! tick can keep the metadata unchanged, a file modified in the last two seconds is also
//! re-read (and re-hashed) on every poll.
//!
//! A file that fails to load is reported (log, `registry_load_errors_total`, the
//! [`SourceHealth`]) once per distinct content, and the last good registry stays in use.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::metrics::Metrics;

use super::{Parsed, Registry, SourceHealth, eureka, yaml};

/// How often [`watch_file`] looks at the file, unless told otherwise.
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

/// Why a registry file could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot read registry file {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("registry file {path} (Eureka JSON): {source}")]
    Eureka {
        path: PathBuf,
        source: eureka::InvalidDocument,
    },
    #[error("registry file {path} (YAML): {source}")]
    Yaml {
        path: PathBuf,
        source: yaml::InvalidYaml,
    },
}

/// Parses registry file content of either format. `path` only names the file in errors.
pub fn parse(path: &Path, content: &[u8]) -> Result<Parsed, LoadError> {
    let content = content.strip_prefix(b"\xef\xbb\xbf").unwrap_or(content);
    match Format::detect(content) {
        Format::EurekaJson => eureka::parse_registry(content).map_err(|source| LoadError::Eureka {
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

/// Reads and parses the file once.
pub fn load(path: &Path) -> Result<Parsed, LoadError> {
    let content = std::fs::read(path).map_err(|source| LoadError::Io {
        path: path.to_owned(),
        source,
    })?;
    parse(path, &content)
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
/// that watches it every `interval` and publishes each new good registry.
pub async fn start(
    path: impl Into<PathBuf>,
    interval: Duration,
    metrics: Arc<Metrics>,
) -> Result<FileSource, LoadError> {
    let path = path.into();
    let health = SourceHealth::new(format!("file {}", path.display()));
    let mut watcher = Watcher::new(path, metrics, health.clone());
    let first = match watcher.poll().await {
        Poll::Loaded(parsed) => parsed.registry,
        Poll::Failed(e) => return Err(e),
        // Not reachable on a first poll; treat as empty rather than panic.
        Poll::Unchanged => Registry::default(),
    };
    let (tx, registry) = watch::channel(Arc::new(first));
    let task = tokio::spawn(watcher.run(interval, tx));
    Ok(FileSource {
        registry,
        health,
        task,
    })
}

/// Watches `path` every `interval` and sends each new good registry on `tx`, until every
/// receiver is gone. For callers that did the first load themselves (see [`start`]): the
/// first poll re-reads the file and sends its registry if it differs from `tx`'s.
pub async fn watch_file(
    path: PathBuf,
    interval: Duration,
    tx: watch::Sender<Arc<Registry>>,
    metrics: Arc<Metrics>,
    health: SourceHealth,
) {
    Watcher::new(path, metrics, health).run(interval, tx).await;
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

    /// Whether a later write could have kept this stamp (same mtime tick).
    fn is_recent(&self, now: SystemTime) -> bool {
        match self.mtime {
            Some(m) => now.duration_since(m).map_or(true, |age| age < RACY_WINDOW),
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

/// The polling state of one file, and where it reports.
struct Watcher {
    path: PathBuf,
    metrics: Arc<Metrics>,
    health: SourceHealth,
    /// The stamp and content hash of the last read, good or bad; `None` when the file was
    /// missing (or never read).
    last: Option<(Stamp, u64)>,
    missing_reported: bool,
}

impl Watcher {
    fn new(path: PathBuf, metrics: Arc<Metrics>, health: SourceHealth) -> Watcher {
        Watcher {
            path,
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
                    instances = parsed.registry.instances.len(),
                    "registry loaded"
                );
            }
            Poll::Failed(e) => {
                tracing::warn!(error = %e, "registry file not loaded; keeping the last good registry");
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
        if let Some((last_stamp, _)) = &self.last
            && *last_stamp == stamp
            && !stamp.is_recent(SystemTime::now())
        {
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
        let same_content = matches!(&self.last, Some((_, last_hash)) if *last_hash == hash);
        self.last = Some((stamp, hash));
        if same_content {
            return Poll::Unchanged;
        }
        match parse(&self.path, &content) {
            Ok(parsed) => Poll::Loaded(parsed),
            Err(e) => Poll::Failed(e),
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

    async fn run(mut self, interval: Duration, tx: watch::Sender<Arc<Registry>>) {
        let mut ticks = tokio::time::interval(interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticks.tick() => {}
                () = tx.closed() => return,
            }
            if let Poll::Loaded(parsed) = self.poll().await {
                let registry = parsed.registry;
                tx.send_if_modified(|current| {
                    if **current == registry {
                        false
                    } else {
                        *current = Arc::new(registry);
                        true
                    }
                });
            }
        }
    }
}
