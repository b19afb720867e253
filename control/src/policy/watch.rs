//! Follows the policy file: reads it every interval (200 ms), and publishes each new good policy. A
//! file that fails to parse (or goes missing) is reported, and the last good policy stays. A
//! good file that lost most of the entries in use at once (emptied, or truncated by an edit
//! that is not an atomic rename) is held by the registry's drop guard
//! (`odmesh_registry::guard`): the policy in use stays until the file has said so for the
//! guard's confirmation time.
//!
//! The file is small, so it is simply read whole and compared with what was read last: no
//! modification-time heuristics, and an atomic rename over it is seen like any other change.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::{InvalidPolicy, Policy};
use crate::metrics::Metrics;
use odmesh_base::error::Chain;
use odmesh_base::metrics::{inc, set};
use odmesh_registry::guard::{DropGuard, DropGuardConfig, Verdict};

/// Why the policy file is not in use.
#[derive(Debug, thiserror::Error)]
pub enum PolicyFileError {
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}")]
    Invalid {
        path: PathBuf,
        #[source]
        source: InvalidPolicy,
    },
}

impl PolicyFileError {
    fn read(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> PolicyFileError {
        |source| PolicyFileError::Read {
            path: path.to_owned(),
            source,
        }
    }

    fn invalid(path: &std::path::Path) -> impl FnOnce(InvalidPolicy) -> PolicyFileError {
        |source| PolicyFileError::Invalid {
            path: path.to_owned(),
            source,
        }
    }
}

/// What the admin endpoint shows of the policy source.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct PolicyStatus {
    /// The file, or `None` without `--policy`.
    pub path: Option<PathBuf>,
    /// Unix seconds of the last good load.
    pub loaded_at: Option<u64>,
    /// Why the file in place now is not in use (the last good policy is).
    pub last_error: Option<String>,
    /// A held drop: the file lost most of the entries in use at once, and waits to be
    /// confirmed.
    pub held: Option<String>,
}

/// A followed policy file: the policy in use, and the source's status.
#[derive(Debug)]
pub struct PolicySource {
    pub policy: watch::Receiver<Arc<Policy>>,
    pub status: Arc<Mutex<PolicyStatus>>,
    pub task: JoinHandle<()>,
}

/// Loads `path` (an error if it is missing or invalid: the control plane does not start on
/// a bad policy), then follows it every `interval`, holding drops by `guard`.
pub fn start(
    path: PathBuf,
    interval: Duration,
    guard: DropGuardConfig,
    metrics: Arc<Metrics>,
) -> Result<PolicySource, PolicyFileError> {
    let content = std::fs::read(&path).map_err(PolicyFileError::read(&path))?;
    let first = Policy::parse(&content).map_err(PolicyFileError::invalid(&path))?;
    inc(&metrics.policy_loads_total);
    let status = Arc::new(Mutex::new(PolicyStatus {
        path: Some(path.clone()),
        loaded_at: Some(unix_now()),
        last_error: None,
        held: None,
    }));
    let (tx, policy) = watch::channel(Arc::new(first));
    let follower = Follower {
        path,
        tx,
        status: status.clone(),
        metrics,
        guard: (DropGuard::new(guard), guard),
    };
    let task = tokio::spawn(follower.run(interval, content));
    Ok(PolicySource {
        policy,
        status,
        task,
    })
}

/// What follows the file: where it is, where its policies go.
struct Follower {
    path: PathBuf,
    tx: watch::Sender<Arc<Policy>>,
    status: Arc<Mutex<PolicyStatus>>,
    metrics: Arc<Metrics>,
    guard: (DropGuard, DropGuardConfig),
}

impl Follower {
    async fn run(mut self, interval: Duration, last: Vec<u8>) {
        // What was read last: `None` after a read failed (reported once; the file coming back
        // is read again, even empty).
        let mut last = Some(last);
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if self.tx.is_closed() {
                return;
            }
            let read = tokio::fs::read(&self.path).await;
            let outcome = match read {
                // The file still says what it said: only a held drop needs another look.
                Ok(content) if last.as_ref() == Some(&content) && !self.guard.0.is_holding() => {
                    continue;
                }
                Ok(content) => {
                    let parsed =
                        Policy::parse(&content).map_err(PolicyFileError::invalid(&self.path));
                    last = Some(content);
                    parsed
                }
                Err(_) if last.is_none() => continue,
                Err(e) => {
                    last = None;
                    // Unreadable now: that confirms no drop.
                    self.guard.0.restart();
                    Err(PolicyFileError::read(&self.path)(e))
                }
            };
            match outcome {
                Ok(policy) => self.loaded(policy),
                Err(e) => self.failed(&e),
            }
        }
    }

    /// A good file: followed, unless it drops most of the policy in use.
    fn loaded(&mut self, policy: Policy) {
        let in_use = self.tx.borrow().entries();
        let verdict = (self.guard.0).check_counts(in_use, policy.entries(), 1, Instant::now());
        let mut st = self.status.lock().unwrap_or_else(PoisonError::into_inner);
        if let Verdict::Hold { since, .. } = verdict {
            if since.is_zero() {
                inc(&self.metrics.policy_drops_held_total);
                let held = verdict.describe(&self.guard.1).unwrap_or_default();
                tracing::warn!(path = %self.path.display(), %held, "policy file held");
            }
            set(&self.metrics.policy_drop_held, 1);
            st.held = verdict.describe(&self.guard.1);
            return;
        }
        set(&self.metrics.policy_drop_held, 0);
        st.held = None;
        tracing::info!(path = %self.path.display(), "policy loaded");
        inc(&self.metrics.policy_loads_total);
        st.loaded_at = Some(unix_now());
        st.last_error = None;
        // An edit that changes nothing (a comment) rebuilds nothing.
        if **self.tx.borrow() != policy {
            self.tx.send_replace(Arc::new(policy));
        }
    }

    /// A file that cannot be used: the last good policy stays.
    fn failed(&self, e: &PolicyFileError) {
        // The error names the file.
        tracing::warn!(error = %Chain(e), "policy file not loaded; keeping the last good policy");
        inc(&self.metrics.policy_load_errors_total);
        let mut st = self.status.lock().unwrap_or_else(PoisonError::into_inner);
        st.last_error = Some(Chain(e).to_string());
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;
    use odmesh_base::testing::wait_until;
    use std::sync::atomic::Ordering;

    const ONE_VIP: &str = "vips: {slow: {request_timeout: 300ms}}\n";
    const DEADLINE: Duration = Duration::from_secs(10);

    /// A policy file in a folder of its own, followed every 20 ms, a drop confirmed after
    /// `confirm`.
    fn follow(confirm: Duration) -> (PathBuf, PolicySource, Arc<Metrics>) {
        let dir = std::env::temp_dir().join(format!(
            "odmesh-policy-watch-{}-{}",
            std::process::id(),
            confirm.as_millis()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("policy.yaml");
        std::fs::write(&path, ONE_VIP).unwrap();
        let metrics = Arc::new(Metrics::default());
        let guard = DropGuardConfig {
            max_drop: 0.5,
            confirm_after: confirm,
        };
        let source = start(
            path.clone(),
            Duration::from_millis(20),
            guard,
            metrics.clone(),
        );
        (path, source.unwrap(), metrics)
    }

    #[tokio::test]
    async fn an_emptied_policy_file_is_held_and_one_written_back_meanwhile_changes_nothing() {
        let (path, mut source, metrics) = follow(Duration::from_secs(60));
        source.policy.mark_unchanged();
        std::fs::write(&path, "").unwrap();
        wait_until(DEADLINE, "the emptied file to be held", || {
            metrics.policy_drop_held.load(Ordering::Relaxed) == 1
        })
        .await;
        assert_eq!(
            source.policy.borrow().entries(),
            1,
            "the policy in use stays"
        );
        assert!(source.status.lock().unwrap().held.is_some());
        std::fs::write(&path, ONE_VIP).unwrap();
        wait_until(DEADLINE, "the file written back to end the hold", || {
            metrics.policy_drop_held.load(Ordering::Relaxed) == 0
        })
        .await;
        assert!(
            !source.policy.has_changed().unwrap(),
            "no push to any proxy"
        );
        assert_eq!(metrics.policy_drops_held_total.load(Ordering::Relaxed), 1);
        std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
    }

    #[tokio::test]
    async fn an_emptied_policy_file_that_stays_empty_is_followed_once_confirmed() {
        let (path, source, metrics) = follow(Duration::from_millis(300));
        std::fs::write(&path, "").unwrap();
        wait_until(DEADLINE, "the empty policy to be followed", || {
            source.policy.borrow().entries() == 0
        })
        .await;
        assert_eq!(metrics.policy_drops_held_total.load(Ordering::Relaxed), 1);
        assert_eq!(metrics.policy_drop_held.load(Ordering::Relaxed), 0);
        std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
    }
}
