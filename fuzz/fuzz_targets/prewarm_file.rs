//! The prewarm history file (`--prewarm-history`, JSON), any bytes, through
//! `odmesh_control::prewarm::parse` (what `prewarm::load` reads from the file), then as the
//! control plane runs with it: a `Prewarm` over it, whose first `save` (2 s after start)
//! prunes it to its limits and writes it back to the file. Checks:
//! - a refusal says why: the cause at the end of the chain `load` reports has a message;
//! - an accepted history written by `store` reads back the same (`load`);
//! - what the first save writes reads back within the limits: per service, of the clusters
//!   used within `max_age`, the `max_per_service` most recently used (ties either way), each
//!   with its time; no service without a cluster; at most `MAX_SERVICES` services.
#![no_main]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use odmesh_control::prewarm::{self, History, LoadError, MAX_SERVICES, Prewarm};
use odmesh_fuzz::assert_says_why;

const LIMITS: prewarm::Limits = prewarm::Limits {
    max_per_service: 3,
    // The bound over all services is load_report's to check; here it takes nothing.
    max_entries: prewarm::DEFAULT_MAX_ENTRIES,
    max_age: Duration::from_secs(7 * 24 * 3600),
};

/// Per service, each cluster and when it was last used: the history as its file has it.
type Services = BTreeMap<String, BTreeMap<String, u64>>;

fuzz_target!(|data: &[u8]| {
    let history = match prewarm::parse(data) {
        Ok(history) => history,
        Err(source) => {
            let e = LoadError::Parse {
                path: "history.json".into(),
                source,
            };
            assert_says_why(&e);
            return;
        }
    };
    let path = file();
    prewarm::store(&path, &history).expect("the history written");
    let back = prewarm::load(&path).expect("the history written read back");
    assert_eq!(back, history, "the history written reads back otherwise");

    // As the control plane runs: the file holds the input, the history is read from it, and
    // the first save prunes it and writes it back.
    std::fs::write(&path, data).expect("the file written");
    let before = prewarm::unix_now();
    let metrics = std::sync::Arc::new(odmesh_control::metrics::Metrics::default());
    let running = Prewarm::new(LIMITS, Some(path.clone()), history.clone(), metrics);
    running.save().expect("the first save");
    let after = prewarm::unix_now();
    let saved = services(&prewarm::load(&path).expect("the saved history read back"));
    assert!(saved.len() <= MAX_SERVICES, "{} services", saved.len());
    // What an entry last used at `last` is, by the age limit, whichever second the save ran.
    let max_age = LIMITS.max_age.as_secs();
    let fresh = |last: u64| last >= after.saturating_sub(max_age);
    let stale = |last: u64| last < before.saturating_sub(max_age);
    let original = services(&history);
    for (service, clusters) in &original {
        if service.is_empty() {
            // Nothing is kept for no service (`History::record` takes none), from a file too.
            assert!(!saved.contains_key(service), "the empty service is kept");
            continue;
        }
        let kept = saved.get(service);
        assert!(
            kept.is_none_or(|kept| !kept.is_empty()),
            "service {service:?} kept without a cluster"
        );
        let kept = kept.cloned().unwrap_or_default();
        assert!(
            kept.len() <= LIMITS.max_per_service,
            "service {service:?} keeps {} clusters",
            kept.len()
        );
        for (cluster, last) in &kept {
            assert_eq!(
                clusters.get(cluster),
                Some(last),
                "service {service:?} keeps {cluster:?} at another time, or one it did not have"
            );
            assert!(
                !stale(*last),
                "service {service:?} keeps {cluster:?}, too old"
            );
        }
        let dropped: Vec<(&String, &u64)> = (clusters.iter())
            .filter(|(cluster, _)| !kept.contains_key(*cluster))
            .collect();
        let oldest_kept = kept.values().min().copied();
        for (cluster, last) in dropped {
            if !fresh(*last) {
                continue;
            }
            // A cluster used within the age limit goes only for the bound, and only if every
            // kept one was used as recently at least.
            assert!(
                kept.len() == LIMITS.max_per_service && oldest_kept.is_some_and(|o| o >= *last),
                "service {service:?} dropped {cluster:?} (last used {last}), keeping {kept:?}"
            );
        }
    }
    for service in saved.keys() {
        assert!(
            original.contains_key(service),
            "the saved history has a service the file did not: {service:?}"
        );
    }
    let _ = std::fs::remove_file(&path);
});

/// The history's services and clusters, as its file has them.
fn services(history: &History) -> Services {
    let value = serde_json::to_value(history).expect("a history as JSON");
    serde_json::from_value(value["services"].clone()).expect("services")
}

/// The file the history goes to: in memory where there is a `/dev/shm`, one per process (removed
/// after each input).
fn file() -> PathBuf {
    let dir = ["/dev/shm"]
        .iter()
        .map(PathBuf::from)
        .find(|d| d.is_dir())
        .unwrap_or_else(std::env::temp_dir)
        .join("odmesh-fuzz-prewarm");
    std::fs::create_dir_all(&dir).expect("a folder for the history file");
    dir.join(format!("history-{}.json", std::process::id()))
}
