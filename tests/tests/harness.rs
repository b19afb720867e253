//! The chaos harness's pieces against the real `odmesh-control`: the xDS flood client
//! subscribes and ACKs as Envoy would, and the fake Eureka server is followed by odmesh's
//! Eureka source through its modes. Needs `cargo build -p odmesh-control` (and `cargo test`
//! builds the flood client).

use std::time::{Duration, Instant};

use odmesh_e2e::fake_eureka::ALL_GARBAGE;
use odmesh_e2e::{
    ControlPlane, FakeEureka, FloodOptions, Instance, Mode, RegistryFile, RssSampler, Source,
    TestEnv, XdsFlood, mib, wait_for, wait_until,
};

/// Long enough for a few polls, their backoff after failures, and a slow machine.
const POLLS: Duration = Duration::from_secs(10);

#[test]
fn a_flood_of_names_is_answered_within_the_control_planes_bounds_and_every_answer_acked() {
    let env = TestEnv::new("harness_xds_flood");
    let registry = RegistryFile::create(&env.log_dir().join("registry.yaml"), &[]);
    let control = ControlPlane::start(&env, "control", registry.path(), &[]);
    let sampler = RssSampler::of(control.process());
    let names = 20_000;
    let options = FloodOptions {
        batch: 500,
        ..FloodOptions::names(names)
    };
    let started = Instant::now();
    let mut flood = XdsFlood::start_with(&env, "xds-flood", control.xds(), &options);
    let answered = flood.wait_all_answered(names, Duration::from_secs(60));
    let took = started.elapsed();

    // The control plane sees one stream, the flood's, with every name subscribed.
    let proxy = wait_for(
        Duration::from_secs(10),
        "the control plane to list the flood's stream",
        || {
            control
                .proxies()
                .into_iter()
                .find(|p| p["node_id"] == "odmesh-xds-flood")
        },
    );
    // Within the control plane's default bounds: 10,000 names kept per stream, 100 of them
    // served as (unregistered) clusters, every other name answered with a removal.
    let clusters = proxy["clusters"].as_array().map_or(0, Vec::len);
    assert_eq!(
        clusters, 10_000,
        "subscribed clusters kept for the flood's stream"
    );
    assert_eq!(proxy["refused"], names - 100, "{proxy}");
    let metrics = control.wait_all_answered(Duration::from_secs(10));
    let memory = sampler.stop();

    let report = flood.stop(Duration::from_secs(10));
    eprintln!(
        "flood of {names} names: all answered after {:?} (seen {took:?} here); report: {}",
        answered.all_answered, report.json
    );
    eprintln!("{}", memory.summary());
    assert_eq!(report.ended.as_deref(), Some("stdin closed"));
    assert_eq!(report.names_sent, names);
    assert_eq!(report.clusters, 100, "{}", report.json);
    assert_eq!(report.removed, names - 100, "{}", report.json);
    assert_eq!(report.acks_sent, report.responses, "{}", report.json);
    assert_eq!(
        metrics["odmesh_xds_acks_total"], report.acks_sent,
        "the control plane counted the flood's ACKs: {metrics:?}"
    );
    assert_eq!(metrics["odmesh_xds_nacks_total"], 0);
    assert!(memory.peak().0 > 0);
}

#[test]
fn the_xds_flood_ends_by_itself_after_its_duration_and_reports_a_refused_connection() {
    let env = TestEnv::new("harness_xds_flood_duration");
    let registry = RegistryFile::create(&env.log_dir().join("registry.yaml"), &[]);
    let control = ControlPlane::start(&env, "control", registry.path(), &[]);
    let options = FloodOptions {
        rate: Some(1000.0),
        duration: Some(Duration::from_millis(1500)),
        endpoints: true,
        ..FloodOptions::names(1_000_000)
    };
    let report = XdsFlood::start_with(&env, "paced", control.xds(), &options)
        .wait_report(Duration::from_secs(20));
    eprintln!("paced flood: {}", report.json);
    assert_eq!(report.ended.as_deref(), Some("duration"));
    assert!(
        report.elapsed >= Duration::from_millis(1500),
        "{}",
        report.json
    );
    // 1000 names per second in batches of 1000: a batch as the stream opens and one a second
    // later, at most two in 1.5 s (unpaced, it would send names as fast as the stream takes
    // them). How many it managed is the flood's own timing: a slow start sends fewer.
    assert!(report.names_sent <= 2000, "{}", report.json);
    assert!(report.all_answered.is_none());
    // --endpoints: every cluster received, its load assignment subscribed.
    assert_eq!(
        report.json["endpoint_subscriptions_sent"], report.clusters,
        "{}",
        report.json
    );

    let nowhere = std::net::SocketAddr::from(([127, 0, 0, 1], odmesh_e2e::free_port()));
    let report = XdsFlood::start_with(&env, "nowhere", nowhere, &FloodOptions::names(10))
        .wait_report(Duration::from_secs(20));
    let ended = report.ended.unwrap_or_default();
    assert!(ended.starts_with("cannot connect"), "{ended}");
}

#[test]
fn odmesh_control_follows_the_fake_eureka_by_its_delta_and_counts_every_bad_mode() {
    let env = TestEnv::new("harness_fake_eureka");
    let one = [Instance::new("hello", 8080).id("hello-1")];
    let fake = FakeEureka::start(&one);
    let control =
        ControlPlane::start_source(&env, "control", Source::Eureka(vec![fake.url()]), &[]);
    let metric = |name: &str| control.metric(name);
    assert_eq!(metric("odmesh_registry_instances"), 1);

    // In step: it polls the delta, and the hash code agrees, so no full fetch follows.
    fake.wait_requests(3, POLLS);
    assert_eq!(fake.full_fetches(), 1, "{:?}", fake.request_counts());
    assert_eq!(metric("odmesh_eureka_hash_mismatches_total"), 0);

    // A change reaches it through the delta alone.
    fake.set_instances(&[
        Instance::new("hello", 8080).id("hello-1"),
        Instance::new("hello", 8081).id("hello-2"),
    ]);
    wait_until(POLLS, "the control plane to see hello-2", || {
        metric("odmesh_registry_instances") == 2
    });
    assert_eq!(fake.full_fetches(), 1, "{:?}", fake.request_counts());

    // Every bad mode is a failed fetch that keeps the last good registry.
    let mut modes: Vec<Mode> = ALL_GARBAGE.iter().map(|g| Mode::Garbage(*g)).collect();
    modes.push(Mode::Down);
    for mode in modes {
        let errors = metric("odmesh_eureka_fetch_errors_total");
        fake.set_mode(mode);
        wait_until(POLLS, &format!("a fetch error in mode {mode:?}"), || {
            metric("odmesh_eureka_fetch_errors_total") > errors
        });
        assert_eq!(metric("odmesh_registry_instances"), 2, "mode {mode:?}");
        fake.set_mode(Mode::Normal);
        let fetches = metric("odmesh_eureka_fetches_total");
        wait_until(POLLS, &format!("a good fetch after {mode:?}"), || {
            metric("odmesh_eureka_fetches_total") > fetches
        });
    }

    // Hanging: the poll is held; released when the mode changes, the next poll is good.
    let fetches = metric("odmesh_eureka_fetches_total");
    fake.set_mode(Mode::Hanging);
    fake.wait_requests(1, POLLS);
    fake.set_mode(Mode::Normal);
    wait_until(POLLS, "a good fetch after the hang", || {
        metric("odmesh_eureka_fetches_total") > fetches
    });

    // Empty: the fake serves a restarted Eureka's registry. Two instances are too few for
    // the drop guard to hold (the chaos tests hold a large drop): odmesh follows it.
    fake.set_mode(Mode::Empty);
    wait_until(POLLS, "odmesh to follow the empty registry", || {
        metric("odmesh_registry_instances") == 0
    });
    eprintln!("fake Eureka requests {:?}", fake.request_counts());
    eprintln!("control plane RSS {}", mib(control.process().rss_bytes()));
}
