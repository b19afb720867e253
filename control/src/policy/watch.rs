//! Follows the policy file: reads it every interval (200 ms), and publishes each new good policy. A
//! file that fails to parse (or goes missing) is reported, and the last good policy stays.
//!
//! The file is small, so it is simply read whole and compared with what was read last: no
//! modification-time heuristics, and an atomic rename over it is seen like any other change.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::{InvalidPolicy, Policy};
use crate::metrics::Metrics;
use odmesh_base::error::Chain;
use odmesh_base::metrics::inc;

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
}

/// A followed policy file: the policy in use, and the source's status.
#[derive(Debug)]
pub struct PolicySource {
    pub policy: watch::Receiver<Arc<Policy>>,
    pub status: Arc<Mutex<PolicyStatus>>,
    pub task: JoinHandle<()>,
}

/// Loads `path` (an error if it is missing or invalid: the control plane does not start on
/// a bad policy), then follows it every `interval`.
pub fn start(
    path: PathBuf,
    interval: Duration,
    metrics: Arc<Metrics>,
) -> Result<PolicySource, PolicyFileError> {
    let content = std::fs::read(&path).map_err(PolicyFileError::read(&path))?;
    let first = Policy::parse(&content).map_err(PolicyFileError::invalid(&path))?;
    inc(&metrics.policy_loads_total);
    let status = Arc::new(Mutex::new(PolicyStatus {
        path: Some(path.clone()),
        loaded_at: Some(unix_now()),
        last_error: None,
    }));
    let (tx, policy) = watch::channel(Arc::new(first));
    let task = tokio::spawn(follow(path, interval, content, tx, status.clone(), metrics));
    Ok(PolicySource {
        policy,
        status,
        task,
    })
}

async fn follow(
    path: PathBuf,
    interval: Duration,
    last: Vec<u8>,
    tx: watch::Sender<Arc<Policy>>,
    status: Arc<Mutex<PolicyStatus>>,
    metrics: Arc<Metrics>,
) {
    // What was read last: `None` after a read failed (reported once; the file coming back is
    // read again, even empty).
    let mut last = Some(last);
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if tx.is_closed() {
            return;
        }
        let read = tokio::fs::read(&path).await;
        let outcome = match read {
            Ok(content) if last.as_ref() == Some(&content) => continue,
            Ok(content) => {
                let parsed = Policy::parse(&content).map_err(PolicyFileError::invalid(&path));
                last = Some(content);
                parsed
            }
            Err(_) if last.is_none() => continue,
            Err(e) => {
                last = None;
                Err(PolicyFileError::read(&path)(e))
            }
        };
        let mut st = status.lock().unwrap_or_else(PoisonError::into_inner);
        match outcome {
            Ok(policy) => {
                tracing::info!(path = %path.display(), "policy loaded");
                inc(&metrics.policy_loads_total);
                st.loaded_at = Some(unix_now());
                st.last_error = None;
                // An edit that changes nothing (a comment) rebuilds nothing.
                if **tx.borrow() != policy {
                    tx.send_replace(Arc::new(policy));
                }
            }
            Err(e) => {
                // The error names the file.
                tracing::warn!(error = %Chain(&e), "policy file not loaded; keeping the last good policy");
                inc(&metrics.policy_load_errors_total);
                st.last_error = Some(Chain(&e).to_string());
            }
        }
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
