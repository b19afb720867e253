//! Envoy's load reports (LRS) into the prewarm history: each report's `ClusterStats` (names
//! of a small alphabet or any text, any counts) through `odmesh_control::lrs::used_clusters`
//! with a `registered` predicate, then into a `Prewarm` (`Prewarm::report`) under small
//! limits, as the load reporting service does. Checks:
//! - the used clusters are exactly the report's odmesh cluster names (`parse_cluster_name`)
//!   that `registered` knows and that carried requests (issued, finished or in progress in
//!   some locality; dropped ones do not count), in the report's order;
//! - the history keeps each service within `max_per_service` (what a connecting proxy would
//!   be sent is then all the history holds), no more than `MAX_SERVICES` services, only
//!   services that reported, and only clusters a proxy of that service reported used.
#![no_main]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use arbitrary::Arbitrary;
use envoy_types::pb::envoy::config::endpoint::v3::{ClusterStats, UpstreamLocalityStats};
use libfuzzer_sys::fuzz_target;
use odmesh_control::lrs::used_clusters;
use odmesh_control::metrics::Metrics;
use odmesh_control::prewarm::{self, History, MAX_SERVICES, Prewarm};
use odmesh_names::parse_cluster_name;

/// The cluster names reports pick from (besides any text).
const NAMES: &[&str] = &[
    "a.vip",
    "b.vip",
    "c.vip",
    "a.svip",
    "b.svip",
    "gone.vip",
    "A.vip",
    "odmesh_xds",
    "",
    "a..vip",
    "*",
];
/// The calling services (the reporting proxies' `node.cluster`), besides any text.
const SERVICES: &[&str] = &["svc-a", "svc-b", ""];

#[derive(Arbitrary, Debug)]
struct Input {
    /// `max_per_service`: 0 to 4.
    max_per_service: u8,
    /// `max_entries`, over all services: 1 to 8.
    max_entries: u8,
    /// Which of [`NAMES`] are registered (one bit each); any other text is not.
    registered: u16,
    reports: Vec<Report>,
}

#[derive(Arbitrary, Debug)]
struct Report {
    node: u8,
    service: Text,
    clusters: Vec<Stats>,
}

#[derive(Arbitrary, Debug)]
struct Stats {
    name: Text,
    /// Per locality: issued, successful, error, in progress.
    localities: Vec<[u8; 4]>,
    dropped: u8,
}

#[derive(Arbitrary, Debug)]
enum Text {
    Known(u8),
    Other(String),
}

impl Text {
    fn of<'a>(&'a self, known: &[&'a str]) -> &'a str {
        match self {
            Text::Known(i) => known[usize::from(*i) % known.len()],
            Text::Other(s) => s,
        }
    }
}

/// A count from one byte: mostly 0, else small, or the largest (a hostile report).
fn count(b: u8) -> u64 {
    match b {
        0..=127 => 0,
        255 => u64::MAX,
        n => u64::from(n),
    }
}

fuzz_target!(|input: Input| {
    let limits = prewarm::Limits {
        max_per_service: usize::from(input.max_per_service % 5),
        max_entries: 1 + usize::from(input.max_entries % 8),
        max_age: Duration::from_secs(7 * 24 * 3600),
    };
    let registered_names: BTreeSet<&str> = (NAMES.iter().enumerate())
        .filter(|(i, _)| input.registered & (1 << i) != 0)
        .map(|(_, name)| *name)
        .collect();
    let registered = |name: &str| registered_names.contains(name);
    let metrics = Arc::new(Metrics::default());
    let prewarm = Prewarm::new(limits, None, History::default(), metrics);
    // Per service, the clusters its proxies reported used.
    let mut reported: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for report in input.reports.iter().take(16) {
        let stats: Vec<ClusterStats> = (report.clusters.iter().take(16))
            .map(|c| ClusterStats {
                cluster_name: c.name.of(NAMES).to_owned(),
                upstream_locality_stats: (c.localities.iter().take(4))
                    .map(|l| UpstreamLocalityStats {
                        total_issued_requests: count(l[0]),
                        total_successful_requests: count(l[1]),
                        total_error_requests: count(l[2]),
                        total_requests_in_progress: count(l[3]),
                        ..Default::default()
                    })
                    .collect(),
                total_dropped_requests: count(c.dropped),
                ..Default::default()
            })
            .collect();
        let used = used_clusters(&stats, registered);
        let expected: Vec<&str> = (stats.iter())
            .filter(|c| {
                c.upstream_locality_stats.iter().any(|l| {
                    l.total_issued_requests > 0
                        || l.total_successful_requests > 0
                        || l.total_error_requests > 0
                        || l.total_requests_in_progress > 0
                })
            })
            .map(|c| c.cluster_name.as_str())
            .filter(|name| parse_cluster_name(name).is_ok() && registered(name))
            .collect();
        assert_eq!(
            used, expected,
            "the used clusters are not the registered odmesh clusters that carried requests"
        );
        let service = report.service.of(SERVICES);
        let node = format!("proxy-{}", report.node % 4);
        prewarm.report(&node, service, &used, Duration::from_secs(10));
        if !service.is_empty() {
            (reported.entry(service.to_owned()).or_default())
                .extend(used.iter().map(|name| name.to_string()));
        }
    }

    // Every entry is fresh (reported just now), so what a connecting proxy of a service would
    // be sent (the admin's view, with every cluster registered) is all its history holds, but
    // for the bound per service: the sums agree only if every service is within it.
    let view = prewarm.view(|_| true);
    let services = view["services"].as_object().expect("services");
    assert!(services.len() <= MAX_SERVICES);
    let mut predicted = 0;
    for (service, entry) in services {
        let clusters: Vec<&str> = (entry["predicted"].as_array().expect("predicted").iter())
            .map(|c| c["cluster"].as_str().expect("a cluster"))
            .collect();
        predicted += clusters.len();
        let used = reported.get(service);
        assert!(
            used.is_some(),
            "the history has a service that reported nothing: {service:?}"
        );
        for cluster in clusters {
            assert!(
                used.is_some_and(|used| used.contains(cluster)),
                "service {service:?} has {cluster:?} in its history, which it did not report used"
            );
        }
    }
    assert_eq!(
        prewarm.len(),
        predicted,
        "some service holds more than max_per_service ({}) clusters",
        limits.max_per_service
    );
    assert!(
        prewarm.len() <= limits.max_entries,
        "the history holds {} entries, over max_entries ({})",
        prewarm.len(),
        limits.max_entries
    );
});
