//! A VIP of 1,000 instances against real Envoy: its endpoints go one by one (LEDS, above
//! `--leds-min-endpoints`), and Envoy routes to exactly the instances the registry lists
//! through additions, removals and a control-plane restart; one instance's change sends that
//! instance, not the VIP. Needs `make envoy`, the filter and `cargo build -p odmesh-control`.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use odmesh_e2e::{EchoUpstream, Instance, Mesh, TestEnv, timed, wait_until, wait_until_since};

/// How long a change may take to reach Envoy: a file read, a push, and Envoy's rebuild of a
/// 1,000-host list, on a busy machine.
const APPLIED: Duration = Duration::from_secs(20);

fn instances(upstreams: &[EchoUpstream]) -> Vec<Instance> {
    (upstreams.iter())
        .map(|u| Instance::new("big", u.port()))
        .collect()
}

fn addresses(upstreams: &[EchoUpstream]) -> BTreeSet<String> {
    upstreams.iter().map(|u| u.addr().to_string()).collect()
}

/// Waits until Envoy's `big.vip` holds exactly `upstreams`.
fn wait_hosts(mesh: &Mesh, upstreams: &[EchoUpstream], what: &str) {
    let want = addresses(upstreams);
    let took = wait_until_since(Instant::now(), APPLIED, what, || {
        mesh.envoy.cluster_hosts("big.vip") == want
    });
    eprintln!("{what}: {took:?}");
}

/// Sends twice as many requests as `upstreams` (round robin: every host gets one at least,
/// whichever worker takes them) and asserts each is answered by one of them, and that each
/// of `must_reach` answered.
fn assert_routes(mesh: &Mesh, upstreams: &[EchoUpstream], must_reach: &[&EchoUpstream]) {
    let names: BTreeSet<&str> = upstreams.iter().map(EchoUpstream::name).collect();
    let before: Vec<u64> = must_reach.iter().map(|u| u.requests()).collect();
    for i in 0..2 * upstreams.len() {
        let response = mesh.get("big");
        assert_eq!(response.status, 200, "request {i}: {}", response.text());
        let upstream = response.json()["upstream"]
            .as_str()
            .unwrap_or("")
            .to_owned();
        assert!(
            names.contains(upstream.as_str()),
            "request {i} reached {upstream}"
        );
    }
    for (u, before) in must_reach.iter().zip(before) {
        assert!(u.requests() > before, "{} got no request", u.name());
    }
}

/// Waits until Envoy's `big.vip` holds exactly `upstreams`, from one collection, and routes to
/// them.
fn assert_held_one_by_one(mesh: &Mesh, upstreams: &[EchoUpstream], what: &str) {
    wait_hosts(mesh, upstreams, what);
    assert_eq!(collections(mesh), 1, "{what}: {:?}", mesh.control.proxies());
    assert_routes(mesh, upstreams, &[]);
}

/// Takes the first `n` of `upstreams` out, stopped (a request routed to one would fail).
fn stop_first(upstreams: &mut Vec<EchoUpstream>, n: usize) -> Vec<EchoUpstream> {
    let mut gone: Vec<EchoUpstream> = upstreams.drain(..n).collect();
    for u in &mut gone {
        u.stop();
    }
    gone
}

/// Writes `text` to `path` atomically (a temporary file renamed over it).
fn write_atomic(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap_or_else(|e| panic!("cannot write {}: {e}", tmp.display()));
    std::fs::rename(&tmp, path).unwrap_or_else(|e| panic!("cannot rename {}: {e}", path.display()));
}

/// The collections the proxies subscribe, by the control plane's `/debug/proxies`.
fn collections(mesh: &Mesh) -> u64 {
    (mesh.control.proxies().iter())
        .map(|p| p["collections"].as_u64().unwrap_or(0))
        .sum()
}

#[test]
fn a_vip_of_a_thousand_instances_takes_changes_one_instance_at_a_time_and_routes_through_them() {
    let env = TestEnv::new("large_vip_changes");
    let mut upstreams: Vec<EchoUpstream> = (0..1000)
        .map(|i| EchoUpstream::start(&format!("big-{i}")))
        .collect();
    // The test drops 80% of the VIP at once below: no guard holding such a drop for 10 s.
    let policy = env.log_dir().join("policy.yaml");
    write_atomic(&policy, "vips: {}\n");
    let policy_arg = policy.to_string_lossy().into_owned();
    let mut mesh = Mesh::start_with(
        &env,
        &instances(&upstreams),
        &["--max-registry-drop", "1", "--policy", &policy_arg],
    );

    // The first request waits for the cluster, its load assignment and the collection.
    let (response, took) = timed(|| mesh.get("big"));
    assert_eq!(response.status, 200, "{}", response.text());
    eprintln!("first request to a VIP of 1,000 instances, discovery included: {took:?}");
    assert_held_one_by_one(&mesh, &upstreams, "Envoy holds the 1,000 instances");

    // A policy edit changes the cluster: Envoy builds it anew, and the new cluster must get
    // its endpoints (its collection has a name of its own) to replace the old one.
    let modified = mesh.cluster_manager_stat("cluster_modified");
    write_atomic(&policy, "vips: {big: {connect_timeout: 2s}}\n");
    let took = wait_until_since(Instant::now(), APPLIED, "the changed cluster warm", || {
        mesh.cluster_manager_stat("cluster_modified") > modified
            && mesh.cluster_manager_stat("warming_clusters") == 0
    });
    eprintln!("the changed cluster replaced the old one: {took:?}");
    assert_held_one_by_one(
        &mesh,
        &upstreams,
        "the changed cluster holds the 1,000 instances",
    );

    // Ten instances leave (and stop: a request routed to one would fail), ten arrive.
    let sent_before = mesh.control.metric("odmesh_xds_resources_sent_total");
    let _gone = stop_first(&mut upstreams, 10);
    let arrived: Vec<EchoUpstream> = (0..10)
        .map(|i| EchoUpstream::start(&format!("new-{i}")))
        .collect();
    upstreams.extend(arrived);
    mesh.registry.write_atomic(&instances(&upstreams));
    wait_hosts(&mesh, &upstreams, "Envoy holds the change of 20 instances");
    let sent = mesh.control.metric("odmesh_xds_resources_sent_total") - sent_before;
    // The ten new members, and nothing else: neither the load assignment nor the other 990.
    assert_eq!(sent, 10, "resources sent for a change of 20 instances");
    let new: Vec<&EchoUpstream> = upstreams[upstreams.len() - 10..].iter().collect();
    assert_routes(&mesh, &upstreams, &new);

    // The control plane restarts while five more leave: the new stream's collection must
    // not keep them (Envoy re-subscribes without saying what it holds).
    mesh.control.kill();
    let _gone = stop_first(&mut upstreams, 5);
    mesh.registry.write_atomic(&instances(&upstreams));
    mesh.control.restart(&env, "control-restarted");
    assert_held_one_by_one(
        &mesh,
        &upstreams,
        "Envoy holds 995 instances after the restart",
    );

    // Below three quarters of the threshold (192 of 256) the VIP's whole assignment goes out,
    // and at the threshold again its collection comes back with every member.
    let few: Vec<EchoUpstream> = upstreams.drain(150..).collect();
    mesh.registry.write_atomic(&instances(&upstreams));
    wait_hosts(&mesh, &upstreams, "Envoy holds 150 instances, whole");
    wait_until(APPLIED, "the collection dropped", || {
        collections(&mesh) == 0
    });
    upstreams.extend(few.into_iter().take(150));
    mesh.registry.write_atomic(&instances(&upstreams));
    assert_held_one_by_one(
        &mesh,
        &upstreams,
        "Envoy holds 300 instances, one by one again",
    );
}
