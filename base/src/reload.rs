//! Files read at start and read again while the process runs (TLS certificates and keys, the
//! embedded registry's tokens file): when their content changes, looked at every interval,
//! and whenever asked (odmesh-control asks on SIGHUP). What they say is put in force in one
//! swap, so a user of it sees either the old or the new whole; files that cannot be used are
//! refused, logged with the file and the reason, and what was in force stays.
//!
//! A change is told by content: the files are read and hashed each interval (they are small),
//! so an edit in place, an atomic rename over a file and a Kubernetes secret's symlink swap
//! all count, and a refused version is logged once, not at every look. A change is put in
//! force once the files have stayed as they are for one interval, so that a certificate and
//! its key renamed into place one after the other are read as one pair, not refused as a
//! mismatched one in between: a change takes between one and two intervals. When asked, the
//! files are read at once.

use std::error::Error;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use crate::error::Chain;

/// Why a reload was refused.
pub type BoxError = Box<dyn Error + Send + Sync + 'static>;

/// Something read from files that can be read again and swapped in whole.
pub trait Reload: Send + Sync {
    /// The files it is read from: a change to any of them reloads it.
    fn files(&self) -> Vec<PathBuf>;

    /// Reads the files again and puts what they say in force, in one swap; or says why they
    /// cannot be used, leaving what is in force. On success, what is in force now, for the
    /// log (never a secret).
    fn reload(&self) -> Result<String, BoxError>;
}

/// What came of one reload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The files were read and put in force.
    Reloaded,
    /// The files could not be used; what was in force stays.
    Refused,
}

/// One thing to reload, and where its outcomes are counted.
pub struct Watched {
    /// What it is, for the log: its flag, e.g. `--eureka-auth`.
    name: String,
    target: Arc<dyn Reload>,
    count: Box<dyn Fn(Outcome) + Send + Sync>,
    /// The hash of its files' contents as last read: at start, or by the last reload, put in
    /// force or refused.
    seen: u64,
    /// The hash of its files' contents at the last look.
    looked: u64,
}

impl std::fmt::Debug for Watched {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watched")
            .field("name", &self.name)
            .field("files", &self.target.files())
            .finish_non_exhaustive()
    }
}

impl Watched {
    /// `target`, called `name` in the log, as it is now (just read from its files); `count`
    /// is told of every reload's outcome.
    pub fn new(
        name: impl Into<String>,
        target: Arc<dyn Reload>,
        count: impl Fn(Outcome) + Send + Sync + 'static,
    ) -> Watched {
        let seen = fingerprint(&target.files());
        Watched {
            name: name.into(),
            target,
            count: Box::new(count),
            seen,
            looked: seen,
        }
    }

    /// Reloads it if its files changed since they were last read and have stayed so since the
    /// last look, or if `force`d.
    fn check(&mut self, force: bool) -> Option<Outcome> {
        let files = self.target.files();
        // Hashed before the reload reads them: a change in between shows at the next look.
        let now = fingerprint(&files);
        let settled = now == self.looked;
        self.looked = now;
        if !force && (now == self.seen || !settled) {
            return None;
        }
        self.seen = now;
        let shown: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
        let outcome = match self.target.reload() {
            Ok(in_force) => {
                tracing::info!(files = ?shown, "{}: reloaded: {in_force}", self.name);
                Outcome::Reloaded
            }
            Err(e) => {
                tracing::error!(
                    files = ?shown,
                    error = %Chain(&*e),
                    "{}: not reloaded, what was in force stays",
                    self.name
                );
                Outcome::Refused
            }
        };
        (self.count)(outcome);
        Some(outcome)
    }
}

/// A hash of the files' contents; a file that cannot be read hashes as such.
fn fingerprint(files: &[PathBuf]) -> u64 {
    let mut h = DefaultHasher::new();
    for file in files {
        std::fs::read(file).ok().hash(&mut h);
    }
    h.finish()
}

/// Reloads what it watches when its files change, and when asked.
#[derive(Debug, Default)]
pub struct Reloader {
    watched: Vec<Watched>,
}

impl Reloader {
    /// A reloader of `watched`.
    pub fn new(watched: Vec<Watched>) -> Reloader {
        Reloader { watched }
    }

    /// Whether it watches nothing.
    pub fn is_empty(&self) -> bool {
        self.watched.is_empty()
    }

    /// Reloads each watched thing whose files changed since they were last read and have not
    /// changed since the last look; with `force`, each. Logs and counts every outcome; returns
    /// them, in order.
    pub fn check(&mut self, force: bool) -> Vec<Outcome> {
        (self.watched.iter_mut())
            .filter_map(|w| w.check(force))
            .collect()
    }

    /// Looks for changes every `interval` (never with 0), and reloads everything each time
    /// `now` is notified; the files are read on a blocking thread. Runs until dropped.
    pub async fn run(self, interval: Duration, now: Arc<Notify>) {
        let mut ticks = (!interval.is_zero()).then(|| {
            let start = tokio::time::Instant::now() + interval;
            let mut ticks = tokio::time::interval_at(start, interval);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ticks
        });
        let mut reloader = self;
        loop {
            let force = tokio::select! {
                () = now.notified() => true,
                _ = async {
                    match &mut ticks {
                        Some(ticks) => ticks.tick().await,
                        None => std::future::pending().await,
                    }
                } => false,
            };
            let checked = tokio::task::spawn_blocking(move || {
                reloader.check(force);
                reloader
            })
            .await;
            reloader = match checked {
                Ok(reloader) => reloader,
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                // The runtime is shutting down.
                Err(_) => return,
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;
    use std::sync::Mutex;

    /// A number read from a file: what a reload puts in force, or refuses when the file
    /// is not a number.
    struct Number {
        path: PathBuf,
        value: Mutex<u32>,
    }

    impl Reload for Number {
        fn files(&self) -> Vec<PathBuf> {
            vec![self.path.clone()]
        }

        fn reload(&self) -> Result<String, BoxError> {
            let text = std::fs::read_to_string(&self.path)?;
            let value: u32 = text.trim().parse()?;
            *self.value.lock().unwrap() = value;
            Ok(format!("{value}"))
        }
    }

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("odmesh-reload-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// Writes `content` to `path` as operators should: a new file renamed over it.
    fn replace(path: &Path, content: &str) {
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, content).unwrap();
        std::fs::rename(&tmp, path).unwrap();
    }

    /// A number read from `dir/number`, first `initial`, watched; and its outcomes counted.
    fn watched_number(
        dir: &Path,
        initial: &str,
    ) -> (Arc<Number>, Reloader, Arc<Mutex<Vec<Outcome>>>) {
        let path = dir.join("number");
        std::fs::write(&path, initial).unwrap();
        let number = Arc::new(Number {
            path,
            value: Mutex::new(initial.trim().parse().unwrap()),
        });
        let counted = Arc::new(Mutex::new(Vec::new()));
        let count = counted.clone();
        let reloader = Reloader::new(vec![Watched::new("--number", number.clone(), move |o| {
            count.lock().unwrap().push(o)
        })]);
        (number, reloader, counted)
    }

    #[test]
    fn a_changed_file_is_put_in_force_once_it_stayed_so_for_a_look_and_then_not_read_again() {
        let dir = temp_dir("changed");
        let (number, mut reloader, counted) = watched_number(&dir, "1");
        assert_eq!(reloader.check(false), [], "unchanged since start");
        replace(&number.path, "2");
        assert_eq!(reloader.check(false), [], "changed since the last look");
        assert_eq!(*number.value.lock().unwrap(), 1);
        assert_eq!(reloader.check(false), [Outcome::Reloaded]);
        assert_eq!(*number.value.lock().unwrap(), 2);
        assert_eq!(reloader.check(false), []);
        // Written in place, same length: the content tells.
        std::fs::write(&number.path, "3").unwrap();
        assert_eq!(reloader.check(false), []);
        assert_eq!(reloader.check(false), [Outcome::Reloaded]);
        assert_eq!(*number.value.lock().unwrap(), 3);
        assert_eq!(*counted.lock().unwrap(), [Outcome::Reloaded; 2]);
    }

    #[test]
    fn a_bad_file_is_refused_once_and_what_was_in_force_stays_until_a_good_one() {
        let dir = temp_dir("bad");
        let (number, mut reloader, counted) = watched_number(&dir, "1");
        replace(&number.path, "not a number");
        assert_eq!(reloader.check(false), []);
        assert_eq!(reloader.check(false), [Outcome::Refused]);
        assert_eq!(*number.value.lock().unwrap(), 1, "the old value stays");
        assert_eq!(reloader.check(false), [], "refused once, not at every look");
        std::fs::remove_file(&number.path).unwrap();
        assert_eq!(reloader.check(false), []);
        assert_eq!(reloader.check(false), [Outcome::Refused], "a file gone");
        assert_eq!(reloader.check(false), []);
        assert_eq!(*number.value.lock().unwrap(), 1);
        replace(&number.path, "4");
        assert_eq!(reloader.check(false), []);
        assert_eq!(reloader.check(false), [Outcome::Reloaded]);
        assert_eq!(*number.value.lock().unwrap(), 4);
        assert_eq!(
            *counted.lock().unwrap(),
            [Outcome::Refused, Outcome::Refused, Outcome::Reloaded]
        );
    }

    #[test]
    fn files_changing_between_two_looks_are_read_once_they_stop() {
        let dir = temp_dir("settle");
        let (number, mut reloader, counted) = watched_number(&dir, "1");
        // A half-done change (a certificate renamed into place before its key, say), then the
        // rest of it: neither look reads the files.
        replace(&number.path, "not yet");
        assert_eq!(reloader.check(false), []);
        replace(&number.path, "6");
        assert_eq!(reloader.check(false), []);
        assert_eq!(reloader.check(false), [Outcome::Reloaded]);
        assert_eq!(*number.value.lock().unwrap(), 6);
        assert_eq!(
            *counted.lock().unwrap(),
            [Outcome::Reloaded],
            "nothing refused"
        );
    }

    #[test]
    fn forced_everything_is_read_at_once_changed_or_not() {
        let dir = temp_dir("forced");
        let (number, mut reloader, _) = watched_number(&dir, "1");
        assert_eq!(reloader.check(true), [Outcome::Reloaded]);
        replace(&number.path, "7");
        assert_eq!(reloader.check(true), [Outcome::Reloaded], "at once");
        assert_eq!(*number.value.lock().unwrap(), 7);
        assert_eq!(reloader.check(false), [], "not again");
        replace(&number.path, "x");
        assert_eq!(reloader.check(true), [Outcome::Refused]);
        // Asked again, a refused file is refused (and logged) again.
        assert_eq!(reloader.check(true), [Outcome::Refused]);
        assert_eq!(reloader.check(false), []);
        assert_eq!(*number.value.lock().unwrap(), 7);
    }

    #[tokio::test]
    async fn running_it_reloads_when_a_file_changes_and_when_asked() {
        let dir = temp_dir("run");
        let (number, reloader, counted) = watched_number(&dir, "1");
        let now = Arc::new(Notify::new());
        let task = tokio::spawn(reloader.run(Duration::from_millis(50), now.clone()));
        replace(&number.path, "2");
        let wait = Duration::from_secs(10);
        crate::testing::wait_until(wait, "the change put in force", || {
            *number.value.lock().unwrap() == 2
        })
        .await;
        now.notify_one();
        crate::testing::wait_until(wait, "the forced reload", || {
            counted.lock().unwrap().len() == 2
        })
        .await;
        task.abort();

        // With no interval, only when asked.
        let (number, reloader, _) = watched_number(&temp_dir("asked"), "1");
        let now = Arc::new(Notify::new());
        let task = tokio::spawn(reloader.run(Duration::ZERO, now.clone()));
        replace(&number.path, "5");
        crate::testing::hold_for(
            Duration::from_millis(300),
            "the file not read unasked",
            || *number.value.lock().unwrap() == 1,
        )
        .await;
        now.notify_one();
        crate::testing::wait_until(wait, "the reload asked for", || {
            *number.value.lock().unwrap() == 5
        })
        .await;
        task.abort();
    }
}
