//! `/metrics` read as Prometheus reads it: a control plane following another's embedded
//! Eureka registry serves a first request, a registry change and a refused write, and both of
//! its expositions (OpenMetrics, and Prometheus' text format) pass the Prometheus project's
//! own parsers (`prometheus-client` for Python, installed by `scripts/install-test-tools.sh`)
//! with the labelled families and the four histograms filled. Needs `make envoy`,
//! `make wasm` and `cargo build -p odmesh-control`.

use std::process::Command;
use std::time::Duration;

use odmesh_e2e::paths::repo_root;
use odmesh_e2e::{
    ControlPlane, EchoUpstream, EurekaApi, Mesh, Request, Source, TestEnv, wait_until,
};
use serde_json::Value;

/// How soon a change in the Eureka server reaches the follower's Envoy: a poll, the push.
const FOLLOW_DEADLINE: Duration = Duration::from_secs(10);

/// The OpenMetrics media type Prometheus asks for.
const OPENMETRICS: &str = "application/openmetrics-text;version=1.0.0,text/plain;q=0.5";

/// `/metrics` of `control` (called `label`), asked with `accept` (if any), saved in the
/// test's log folder, and parsed by the Python client's `format` parser: the families it read.
fn parsed(
    env: &TestEnv,
    (label, control): (&str, &ControlPlane),
    accept: Option<&str>,
    format: &str,
) -> Value {
    let mut request = Request::get("/metrics").host("admin");
    if let Some(accept) = accept {
        request = request.header("accept", accept);
    }
    let response = request.send(control.admin());
    assert_eq!(response.status, 200, "{}", response.text());
    let expected_type = match format {
        "openmetrics" => "application/openmetrics-text; version=1.0.0",
        _ => "text/plain; version=0.0.4",
    };
    let content_type = response.header("content-type").unwrap_or_default();
    assert!(content_type.starts_with(expected_type), "{content_type}");
    let file = env.log_dir().join(format!("metrics-{label}.{format}.txt"));
    std::fs::write(&file, &response.body).expect("write the metrics");
    let python = repo_root().join(".tools/test-python");
    let out = Command::new("python3")
        .arg(repo_root().join("tests/tools/check_metrics.py"))
        .arg(format)
        .arg(&file)
        .env("PYTHONPATH", &python)
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "the Python client refused {}: {} (installed by scripts/install-test-tools.sh into {})",
        file.display(),
        String::from_utf8_lossy(&out.stderr),
        python.display()
    );
    let read: Value = serde_json::from_slice(&out.stdout).expect("the checker prints JSON");
    read["families"].clone()
}

/// The value of sample `name` with `labels` (a JSON object) in `family`.
fn sample(families: &Value, family: &str, name: &str, labels: Value) -> Option<f64> {
    let samples = families[family]["samples"].as_array()?;
    (samples.iter())
        .find(|s| s[0] == name && s[1] == labels)
        .and_then(|s| s[2].as_f64())
}

/// How many observations histogram `family` holds, after checking its shape: buckets up to
/// `+Inf`, rising, the last equal to the count.
fn observations(families: &Value, family: &str) -> f64 {
    let f = &families[family];
    assert_eq!(f["type"], "histogram", "{family}: {f}");
    let samples = f["samples"].as_array().expect("samples");
    let buckets: Vec<f64> = (samples.iter())
        .filter(|s| s[0] == format!("{family}_bucket"))
        .map(|s| s[2].as_f64().expect("a number"))
        .collect();
    assert!(buckets.len() >= 10, "{family}: {buckets:?}");
    assert!(
        buckets.windows(2).all(|w| w[0] <= w[1]),
        "{family}: {buckets:?}"
    );
    let count = sample(
        families,
        family,
        &format!("{family}_count"),
        serde_json::json!({}),
    );
    let count = count.unwrap_or_else(|| panic!("{family}_count missing: {f}"));
    assert_eq!(
        buckets.last().copied(),
        Some(count),
        "{family}: +Inf = count"
    );
    count
}

const HISTOGRAMS: [&str; 4] = [
    "odmesh_xds_on_demand_answer_seconds",
    "odmesh_xds_push_lag_seconds",
    "odmesh_registry_change_to_proxy_seconds",
    "odmesh_eureka_fetch_seconds",
];

#[test]
fn metrics_pass_the_prometheus_parsers_with_labels_and_the_four_histograms_filled() {
    let env = TestEnv::new("metrics_exposition");
    let first = EchoUpstream::start("metrics-1");
    let second = EchoUpstream::start("metrics-2");
    let server = ControlPlane::start_source(&env, "eureka-server", Source::ServeEureka, &[]);
    let eureka = EurekaApi::new(server.eureka_addr());
    let mesh = Mesh::start_source(&env, Source::Eureka(vec![server.eureka_url()]), &[]);

    // A first request to a VIP: the cluster is asked for on demand.
    eureka.register("metered", "metrics-1", first.port());
    wait_until(FOLLOW_DEADLINE, "Host metered to route", || {
        mesh.get("metered").status == 200
    });
    // A registry change of a cluster the proxy holds: pushed, and acknowledged.
    eureka.register("metered", "metrics-2", second.port());
    wait_until(
        FOLLOW_DEADLINE,
        "the change to reach Envoy and be timed",
        || {
            let metrics = mesh.control.metrics();
            metrics.get("odmesh_registry_change_to_proxy_seconds_count") >= Some(&1)
        },
    );
    // A write the registry refuses: a web page's form post.
    let refused = Request::new("POST", "/eureka/apps/METERED")
        .host(&server.eureka_addr().to_string())
        .header("content-type", "text/plain")
        .body("hello")
        .send(server.eureka_addr());
    assert_eq!(refused.status, 415, "{}", refused.text());

    for (accept, format) in [(Some(OPENMETRICS), "openmetrics"), (None, "prometheus")] {
        let families = parsed(&env, ("follower", &mesh.control), accept, format);
        for histogram in HISTOGRAMS {
            let n = observations(&families, histogram);
            assert!(n >= 1.0, "{format}: nothing observed in {histogram}");
        }
        // Both parsers name a counter's family without `_total`.
        let counter = |name: &str| name.strip_suffix("_total").unwrap_or(name).to_owned();
        let responses = counter("odmesh_xds_responses_total");
        assert_eq!(families[&responses]["type"], "counter", "{format}");
        for ty in ["cluster", "endpoints", "lb_endpoint"] {
            let labels = serde_json::json!({ "type": ty });
            let sent = sample(&families, &responses, "odmesh_xds_responses_total", labels);
            assert!(
                sent.is_some(),
                "{format}: no {ty} series: {}",
                families[&responses]
            );
        }
        let clusters = serde_json::json!({ "type": "cluster" });
        let sent = sample(
            &families,
            &responses,
            "odmesh_xds_responses_total",
            clusters,
        );
        assert!(sent >= Some(1.0), "{format}: {}", families[&responses]);
        let build = match format {
            "openmetrics" => "odmesh_build",
            _ => "odmesh_build_info",
        };
        let version = &families[build]["samples"][0][1]["version"];
        assert_eq!(
            version,
            env!("CARGO_PKG_VERSION"),
            "{format}: {}",
            families[build]
        );

        // The Eureka server's own: refusals are one family, by reason.
        let families = parsed(&env, ("eureka-server", &server), accept, format);
        let refused = counter("odmesh_eureka_refused_total");
        let body = serde_json::json!({ "reason": "body" });
        let by_body = sample(&families, &refused, "odmesh_eureka_refused_total", body);
        assert_eq!(by_body, Some(1.0), "{format}: {}", families[&refused]);
        let reasons = families[&refused]["samples"].as_array().map_or(0, Vec::len);
        assert_eq!(reasons, 7, "{format}: {}", families[&refused]);
    }
    eprintln!("the answers parsed are in {}", env.log_dir().display());
}
