//! Instance churn done right, under steady load through real Envoy: an instance is drained
//! in the registry (`OUT_OF_SERVICE`), and stopped only once Envoy no longer lists it. Not
//! one request may fail or be held, and each phase has its second of requests. Also the
//! worked example of the chaos harness: [`Load`] with marks, waits for requests in each
//! phase, the report, [`RssSampler`]s on Envoy and the control plane. Needs `make envoy`,
//! `make wasm` and `cargo build -p odmesh-control`.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use odmesh_e2e::{
    CHANGE_DEADLINE, EchoUpstream, Instance, Load, LoadConfig, MAX_LATENCY, Mesh, RssSampler,
    TestEnv, wait_until, wait_until_since,
};

/// The load: requests per second on the VIP.
const RATE: u32 = 100;
/// Requests the load completes in each phase (sent in it): one second's worth at [`RATE`].
const PHASE: u64 = RATE as u64;

#[test]
fn an_instance_drained_in_the_registry_then_stopped_fails_no_request_of_its_vip() {
    let env = TestEnv::new("drain_then_stop");
    let first = EchoUpstream::start("hello-1");
    let mut second = EchoUpstream::start("hello-2");
    let one = Instance::new("hello", first.port()).id("hello-1");
    let two = Instance::new("hello", second.port()).id("hello-2");
    let mesh = Mesh::start(&env, &[one.clone(), two.clone()]);
    let envoy_memory = RssSampler::of(mesh.envoy.child());
    let control_memory = RssSampler::of(mesh.control.process());

    // Envoy discovers hello.vip on the first request, with both instances.
    mesh.route("hello");
    let both: BTreeSet<String> = [first.addr(), second.addr()]
        .iter()
        .map(ToString::to_string)
        .collect();
    wait_until(
        CHANGE_DEADLINE,
        "Envoy to list both instances of hello.vip",
        || mesh.envoy.cluster_hosts("hello.vip") == both,
    );

    let config = LoadConfig::rate(RATE)
        .keep_alive()
        .record_header("x-echo-upstream");
    let load = Load::hosts(mesh.egress(), &["hello"], config);
    load.wait_completed(PHASE, Duration::from_secs(10));

    load.mark("hello-2 OUT_OF_SERVICE in the registry");
    mesh.registry
        .write_atomic(&[one.clone(), two.clone().status("OUT_OF_SERVICE")]);
    let drained = Instant::now();
    let gone = second.addr().to_string();
    let to_unlisted = wait_until_since(
        drained,
        CHANGE_DEADLINE,
        "Envoy to stop listing hello-2 in hello.vip",
        || !mesh.envoy.cluster_hosts("hello.vip").contains(&gone),
    );
    load.mark("Envoy no longer lists hello-2");
    load.wait_completed(PHASE, Duration::from_secs(10));

    second.stop();
    load.mark("hello-2 stopped");
    load.wait_completed(PHASE, Duration::from_secs(10));
    let report = load.stop();
    let envoy_memory = envoy_memory.stop();
    let control_memory = control_memory.stop();

    eprintln!("{}", report.summary());
    eprintln!("OUT_OF_SERVICE → Envoy no longer lists hello-2: {to_unlisted:?}");
    eprintln!("{}", envoy_memory.summary());
    eprintln!("{}", control_memory.summary());
    report.assert_no_failures(&["hello"]);
    report.assert_answered_within(MAX_LATENCY);
    // Both served before the drain; hello-2 none once Envoy had let it go.
    let before: BTreeSet<String> = report
        .records
        .iter()
        .filter(|r| r.sent < report.mark_at("hello-2 OUT_OF_SERVICE in the registry"))
        .filter_map(|r| r.header.clone())
        .collect();
    assert_eq!(
        before,
        BTreeSet::from(["hello-1".to_owned(), "hello-2".to_owned()]),
        "{report}"
    );
    let after: BTreeSet<String> = report
        .sent_between("Envoy no longer lists hello-2", None)
        .iter()
        .filter_map(|r| r.header.clone())
        .collect();
    assert_eq!(after, BTreeSet::from(["hello-1".to_owned()]), "{report}");
}
