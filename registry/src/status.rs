//! How a registry source is doing, shared with the admin endpoints (`/readyz`,
//! `/debug/registry`) and mirrored in the registry metrics.

use std::collections::HashSet;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use odmesh_base::error::Chain;
use odmesh_base::metrics::{inc, set};

use crate::{InvalidInstance, Registry, RegistryMetrics};

/// At most this many warnings are kept for the admin (the log has them all).
pub const MAX_WARNINGS: usize = 100;

/// The state of one registry source, as the admin shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct SourceStatus {
    /// What the source reads, e.g. `file /etc/odmesh/registry.yaml`.
    pub description: String,
    /// Whether a registry was ever loaded (what `/readyz` needs).
    pub loaded: bool,
    /// The error of the last load, if it failed; cleared by the next good load.
    pub last_error: Option<String>,
    /// When the last good load happened.
    #[serde(serialize_with = "unix_seconds")]
    pub last_success: Option<SystemTime>,
    /// Instances in the registry in use.
    pub instances: usize,
    /// What the last good load left out (bad instances or VIPs), one line each.
    pub warnings: Vec<String>,
    /// A drop of most of the registry that is held, not followed yet (see
    /// [`guard`](crate::guard)).
    pub holding: Option<String>,
}

impl SourceStatus {
    /// Seconds since the last good load, `None` before the first one.
    pub fn age_of_last_success(&self, now: SystemTime) -> Option<std::time::Duration> {
        self.last_success
            .map(|t| now.duration_since(t).unwrap_or_default())
    }
}

fn unix_seconds<S: serde::Serializer>(t: &Option<SystemTime>, s: S) -> Result<S::Ok, S::Error> {
    match t.and_then(|t| t.duration_since(UNIX_EPOCH).ok()) {
        Some(d) => s.serialize_some(&d.as_secs()),
        None => s.serialize_none(),
    }
}

/// A [`SourceStatus`] shared between the source's task and the admin. Cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct SourceHealth(Arc<RwLock<Health>>);

#[derive(Debug, Default)]
struct Health {
    status: SourceStatus,
    /// Every warning of the last good load (`status.warnings` keeps only the first ones).
    warnings: HashSet<String>,
}

impl SourceHealth {
    /// A source that has loaded nothing yet.
    pub fn new(description: impl Into<String>) -> SourceHealth {
        SourceHealth(Arc::new(RwLock::new(Health {
            status: SourceStatus {
                description: description.into(),
                ..SourceStatus::default()
            },
            warnings: HashSet::new(),
        })))
    }

    /// A copy of the current status.
    pub fn snapshot(&self) -> SourceStatus {
        self.read().status.clone()
    }

    /// Whether a registry was ever loaded.
    pub fn is_loaded(&self) -> bool {
        self.read().status.loaded
    }

    /// Records a good load: status, and the metrics `registry_loads_total`,
    /// `registry_last_success_seconds` and `registry_instances`.
    ///
    /// Returns the warnings, as text and in order, that the previous good load did not
    /// have: what a source that reloads often logs, so that each is logged once.
    pub fn record_success(
        &self,
        metrics: &RegistryMetrics,
        registry: &Registry,
        warnings: &[InvalidInstance],
    ) -> Vec<String> {
        let now = SystemTime::now();
        let texts: Vec<String> = warnings.iter().map(ToString::to_string).collect();
        let new = {
            let mut health = self.write();
            let new: Vec<String> = texts
                .iter()
                .filter(|w| !health.warnings.contains(*w))
                .cloned()
                .collect();
            let st = &mut health.status;
            st.loaded = true;
            st.last_error = None;
            st.last_success = Some(now);
            st.instances = registry.len();
            st.warnings = texts.iter().take(MAX_WARNINGS).cloned().collect();
            if texts.len() > MAX_WARNINGS {
                let more = texts.len() - MAX_WARNINGS;
                st.warnings.push(format!("... and {more} more"));
            }
            health.warnings = texts.into_iter().collect();
            new
        };
        inc(&metrics.registry_loads_total);
        let secs = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        set(&metrics.registry_last_success_seconds, secs);
        set(&metrics.registry_instances, registry.len() as u64);
        new
    }

    /// Records that the source's last good load is held (`Some`, saying why) or not, and the
    /// number of instances of the registry in use (`registry_instances`).
    pub fn set_holding(&self, holding: Option<String>, in_use: usize, metrics: &RegistryMetrics) {
        let mut health = self.write();
        health.status.holding = holding;
        health.status.instances = in_use;
        set(&metrics.registry_instances, in_use as u64);
    }

    /// Records a failed load: status (the error with its causes), and the metric
    /// `registry_load_errors_total`. The registry in use (and its metrics) stay as they were.
    pub fn record_error(
        &self,
        metrics: &RegistryMetrics,
        error: &(dyn std::error::Error + 'static),
    ) {
        self.write().status.last_error = Some(Chain(error).to_string());
        inc(&metrics.registry_load_errors_total);
    }

    // A panic while holding the lock leaves plain data behind; keep serving it.
    fn read(&self) -> RwLockReadGuard<'_, Health> {
        self.0.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, Health> {
        self.0.write().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    #[test]
    fn an_error_after_a_good_load_keeps_the_source_loaded_and_counts_the_error() {
        let metrics = RegistryMetrics::default();
        let health = SourceHealth::new("file x");
        assert!(!health.is_loaded());

        health.record_success(&metrics, &Registry::default(), &[]);
        health.record_error(&metrics, &std::io::Error::other("bad file"));

        let st = health.snapshot();
        assert!(st.loaded);
        assert_eq!(st.last_error.as_deref(), Some("bad file"));
        assert!(st.last_success.is_some());
        assert_eq!(metrics.registry_loads_total.load(Ordering::Relaxed), 1);
        assert_eq!(
            metrics.registry_load_errors_total.load(Ordering::Relaxed),
            1
        );
        assert!(
            metrics
                .registry_last_success_seconds
                .load(Ordering::Relaxed)
                > 0
        );
    }

    #[test]
    fn only_the_first_warnings_are_kept() {
        let w = InvalidInstance {
            index: 0,
            app: "a".into(),
            instance_id: None,
            field: "ipAddr".into(),
            reason: "missing".into(),
        };
        let health = SourceHealth::new("x");
        let warnings = vec![w; MAX_WARNINGS + 5];
        health.record_success(&RegistryMetrics::default(), &Registry::default(), &warnings);
        let kept = health.snapshot().warnings;
        assert_eq!(kept.len(), MAX_WARNINGS + 1);
        assert_eq!(kept.last().unwrap(), "... and 5 more");
    }

    /// Warning number `index` of a load: the same index gives the same warning.
    fn warning(index: usize) -> InvalidInstance {
        InvalidInstance {
            index,
            app: "a".into(),
            instance_id: None,
            field: "ipAddr".into(),
            reason: "missing".into(),
        }
    }

    #[test]
    fn a_good_load_returns_only_the_warnings_the_previous_good_load_did_not_have() {
        let metrics = RegistryMetrics::default();
        let health = SourceHealth::new("x");
        let (w0, w1, w2) = (warning(0), warning(1), warning(2));
        let first =
            health.record_success(&metrics, &Registry::default(), &[w0.clone(), w1.clone()]);
        assert_eq!(first, [w0.to_string(), w1.to_string()]);
        let second =
            health.record_success(&metrics, &Registry::default(), &[w1.clone(), w2.clone()]);
        assert_eq!(second, [w2.to_string()], "w1 was already there");
        health.record_error(&metrics, &std::io::Error::other("unreachable"));
        let third = health.record_success(&metrics, &Registry::default(), &[w0.clone(), w2]);
        assert_eq!(third, [w0.to_string()], "a failed load forgets nothing");
        assert!(
            health
                .record_success(&metrics, &Registry::default(), &[])
                .is_empty()
        );
        assert_eq!(
            health.record_success(&metrics, &Registry::default(), std::slice::from_ref(&w1)),
            [w1.to_string()],
            "a warning that went away and came back is new again"
        );
    }

    #[test]
    fn every_warning_counts_for_the_next_load_not_only_the_kept_ones() {
        let warnings: Vec<InvalidInstance> = (0..MAX_WARNINGS + 5).map(warning).collect();
        let health = SourceHealth::new("x");
        let metrics = RegistryMetrics::default();
        assert_eq!(
            health
                .record_success(&metrics, &Registry::default(), &warnings)
                .len(),
            MAX_WARNINGS + 5
        );
        assert!(
            health
                .record_success(&metrics, &Registry::default(), &warnings)
                .is_empty()
        );
    }

    #[test]
    fn a_good_load_clears_the_last_error() {
        let metrics = RegistryMetrics::default();
        let health = SourceHealth::new("file x");
        health.record_error(&metrics, &std::io::Error::other("bad file"));
        health.record_success(&metrics, &Registry::default(), &[]);
        assert_eq!(health.snapshot().last_error, None);
    }

    #[test]
    fn status_serializes_last_success_as_unix_seconds() {
        let st = SourceStatus {
            last_success: Some(UNIX_EPOCH + std::time::Duration::from_secs(42)),
            ..SourceStatus::default()
        };
        let json = serde_json::to_value(&st).unwrap();
        assert_eq!(json["last_success"], 42);
    }
}
