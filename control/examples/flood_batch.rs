//! Probe (docs/benchmarks.md, 9.): what a flood's requests cost a session and the cache, and
//! how long another stream's one-name request takes meanwhile, in this process, without gRPC
//! or Envoy.
//!
//! ```sh
//! cargo run --release -p odmesh-control --example flood_batch
//! ```
//!
//! A flooding stream sends `BATCHES` requests of 10,000 random cluster names (the first is the
//! heavy one: 10,000 clusters to build, all but 100 refused; the others are over the stream's
//! bound) and closes. Meanwhile, on another thread, a second stream subscribes one new
//! registered name after another, each timed. Prints one JSON object.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;
use odmesh_control::cache::Cache;
use odmesh_control::metrics::Metrics;
use odmesh_control::model::Snapshot;
use odmesh_control::session::SubscriptionLimits;
use odmesh_control::session::{Admission, Context, Service, Session};
use odmesh_control::xds::{CLUSTER_TYPE_URL, XdsOptions};
use odmesh_registry::{Instance, Protocol, Registry, Status};

const BATCH: usize = 10_000;
const BATCHES: usize = 4;
const REGISTERED: usize = 20_000;

fn subscribe(names: Vec<String>) -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest {
        type_url: CLUSTER_TYPE_URL.into(),
        resource_names_subscribe: names,
        ..Default::default()
    }
}

fn instance(i: usize) -> Instance {
    Instance {
        app: format!("APP-{i}").into(),
        instance_id: format!("app-{i}").into(),
        ip: [10, 0, (i >> 8) as u8, i as u8].into(),
        port: Some(8080),
        secure_port: None,
        vips: vec![format!("app-{i}").into()],
        svips: vec![],
        status: Status::Up,
        zone: None,
        protocol: Protocol::Auto,
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn main() {
    let registry = Registry::from_iter((0..REGISTERED).map(instance));
    let cache = Cache::with_snapshot(
        XdsOptions::new(None),
        Snapshot::from_registry(&registry).into(),
    );
    let metrics = Metrics::default();
    let admission = Admission::new(1_000_000);
    let cx = Context {
        cache: &cache,
        metrics: &metrics,
        admission: &admission,
        prewarm: None,
        eviction: None,
    };
    let flooding = AtomicBool::new(true);
    let (batches, close, others) = std::thread::scope(|scope| {
        let other = scope.spawn(|| {
            let mut session = Session::new(2, Service::Ads, SubscriptionLimits::default());
            let mut took = Vec::new();
            while flooding.load(Ordering::Relaxed) && took.len() < REGISTERED {
                let name = format!("app-{}.vip", took.len());
                let started = Instant::now();
                session.on_request(&cx, subscribe(vec![name]));
                took.push(ms(started.elapsed()));
            }
            took
        });
        let mut session = Session::new(1, Service::Ads, SubscriptionLimits::default());
        let mut batches = Vec::new();
        for batch in 0..BATCHES {
            let names = (0..BATCH)
                .map(|i| format!("flood-{batch}-{i:06x}.vip"))
                .collect();
            let started = Instant::now();
            session.on_request(&cx, subscribe(names));
            batches.push(ms(started.elapsed()));
        }
        let started = Instant::now();
        session.close(&cx);
        let close = ms(started.elapsed());
        flooding.store(false, Ordering::Relaxed);
        (batches, close, other.join().expect("the other stream"))
    });
    let mut sorted = others.clone();
    sorted.sort_by(f64::total_cmp);
    let at = |p: f64| sorted[((sorted.len() - 1) as f64 * p) as usize];
    println!(
        "{}",
        serde_json::json!({
            "flood_batches_ms": batches,
            "flood_close_ms": close,
            "other_stream_requests": sorted.len(),
            "other_stream_ms": {"p50": at(0.5), "p99": at(0.99), "max": at(1.0)},
        })
    );
}
