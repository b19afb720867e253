//! The admin's mesh dashboard (`GET /`): the registry source, the connected proxies and the
//! clusters each holds, how on-demand answers go, prewarm's hit rate per service and the
//! policy file, on one page for people.
//!
//! It renders what [`AdminView`] hands the JSON endpoints (`/readyz`, `/debug/proxies`,
//! `/debug/prewarm`, `/debug/policy`, `/metrics`), so it shows nothing they do not. Bounded:
//! at most [`MAX_PROXIES`] proxies with [`MAX_CLUSTERS`] cluster names each, and
//! [`MAX_SERVICES`] prewarm services, saying how many it left out. The page is written
//! through [`odmesh_base::html::Page`], which escapes every text (a proxy's node id is
//! whatever it sent).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use odmesh_base::html::{Cell, Page, age, utc};
use odmesh_base::metrics::{self, prometheus_client::metrics::histogram::Histogram};
use serde_json::Value;

use crate::admin::AdminView;

/// Proxies listed on the page.
pub const MAX_PROXIES: usize = 200;
/// Cluster names listed per proxy.
pub const MAX_CLUSTERS: usize = 40;
/// Calling services listed in the prewarm table.
pub const MAX_SERVICES: usize = 200;

/// On-demand answer times (a request for a cluster to the answer that carries it), as
/// percentiles, when the process measures them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AnswerTimes {
    /// Answers measured.
    pub count: u64,
    /// `(percentile, time)`, e.g. `(50.0, 1 ms)`, `(99.0, 4 ms)`, lowest first.
    pub percentiles: Vec<(f64, Duration)>,
}

impl AnswerTimes {
    /// The median, the 90th and the 99th percentile of `histogram`
    /// (`odmesh_xds_on_demand_answer_seconds`), as `histogram_quantile` would give them.
    pub fn of(histogram: &Histogram) -> AnswerTimes {
        let buckets = metrics::buckets(histogram);
        let percentiles = [50.0, 90.0, 99.0]
            .into_iter()
            .filter_map(|p| Some((p, metrics::quantile(&buckets, p / 100.0)?)))
            .map(|(p, seconds)| (p, Duration::from_secs_f64(seconds)))
            .collect();
        AnswerTimes {
            count: buckets.last().map_or(0, |&(_, n)| n),
            percentiles,
        }
    }
}

/// The counters of `/metrics` the dashboard shows, with what it calls them.
const COUNTERS: [(&str, &str); 8] = [
    ("odmesh_xds_streams_active", "xDS streams open"),
    ("odmesh_xds_requests_total", "discovery requests received"),
    ("odmesh_xds_responses_total", "discovery responses sent"),
    ("odmesh_xds_acks_total", "responses accepted (ACK)"),
    ("odmesh_xds_nacks_total", "responses rejected (NACK)"),
    (
        "odmesh_xds_names_waiting_total",
        "names that waited for room (--xds-max-subscriptions)",
    ),
    (
        "odmesh_xds_names_refused_total",
        "names refused (over a stream's bounds)",
    ),
    (
        "odmesh_prewarm_asked_total",
        "clusters asked for on demand, not sent ahead",
    ),
];

/// What the dashboard shows, as the admin's layers hand it over.
#[derive(Debug)]
pub struct MeshView {
    /// Now, in seconds since the Unix epoch.
    pub now_unix: u64,
    /// `/readyz`'s `registry`: the source's state.
    pub registry: Value,
    /// `/debug/proxies`.
    pub proxies: Value,
    /// `/debug/prewarm`.
    pub prewarm: Value,
    /// `/debug/policy`'s `source` (the file's state) and `file` (its entries).
    pub policy: Value,
    /// Some counters of `/metrics` (what the page calls each, its value), `None` where absent.
    pub counters: Vec<(&'static str, Option<u64>)>,
    /// On-demand answer time percentiles; `None`: not measured.
    pub answer_times: Option<AnswerTimes>,
}

impl MeshView {
    /// What `view` shows now.
    pub fn of(view: &dyn AdminView) -> MeshView {
        let now_unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        // A cluster nobody holds: the file's state without the effective policy of every
        // cluster every proxy holds, which `/debug/policy` computes.
        let policy = view.policy(Some(""), "");
        let metrics = view.metrics(odmesh_base::metrics::Format::Prometheus);
        MeshView {
            now_unix,
            registry: view.registry_status().1,
            proxies: view.proxies(),
            prewarm: view.prewarm(),
            policy,
            counters: (COUNTERS.iter())
                .map(|(name, label)| (*label, sample(&metrics, name)))
                .collect(),
            answer_times: view.answer_time_percentiles(),
        }
    }
}

/// The value of metric `name` in Prometheus text `metrics`: its one series, or the sum of
/// its labelled family's (`odmesh_xds_acks_total{type="cluster"}`, ...).
fn sample(metrics: &str, name: &str) -> Option<u64> {
    let values = (metrics.lines().filter(|line| !line.starts_with('#'))).filter_map(|line| {
        let (series, value) = line.rsplit_once(' ')?;
        let family = series.split_once('{').map_or(series, |(family, _)| family);
        (family == name).then(|| value.trim().parse::<f64>().ok())?
    });
    values
        .fold(None, |sum, v| Some(sum.unwrap_or(0.0) + v))
        .map(|sum| sum as u64)
}

/// `value` as text, `""` for null.
fn text(value: &Value) -> String {
    match value {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// How long before `now` the Unix time `then` was, `""` for none.
fn ago(now: u64, then: &Value) -> String {
    then.as_u64().map_or_else(String::new, |then| {
        format!("{} ago", age(Duration::from_secs(now.saturating_sub(then))))
    })
}

/// The mesh dashboard of `view`, as HTML.
pub fn render(view: &MeshView) -> String {
    let mut page = Page::new("odmesh control plane");
    page.el("h1", "", "odmesh control plane");
    page.el("p", "muted", &utc(view.now_unix.saturating_mul(1000)));
    registry(&mut page, view);
    proxies(&mut page, view);
    answers(&mut page, view);
    prewarm(&mut page, view);
    policy(&mut page, view);
    page.finish()
}

fn registry(page: &mut Page, view: &MeshView) {
    let r = &view.registry;
    page.el("h2", "", "Registry");
    if r["holding"].is_string() {
        let held = format!("A drop of the registry is held: {}", text(&r["holding"]));
        page.el("div", "alert", &held);
    }
    let state = match (r["loaded"].as_bool(), r["complete"].as_bool()) {
        (Some(true), Some(false)) => Cell::with("loading: proxies keep what they hold", "warn"),
        (Some(true), _) => Cell::with("loaded", "ok"),
        _ => Cell::with("not loaded yet", "bad"),
    };
    let error = match &r["last_error"] {
        Value::Null => Cell::with("none", "muted"),
        e => Cell::with(text(e), "bad"),
    };
    let age = r["last_success_age_seconds"].as_f64().map_or_else(
        || "never".to_owned(),
        |s| format!("{} ago", age(Duration::from_secs_f64(s.max(0.0)))),
    );
    page.facts(&[
        ("source", Cell::new(text(&r["description"]))),
        ("state", state),
        ("instances", Cell::new(text(&r["instances"]))),
        ("last good load", Cell::new(age)),
        ("last error", error),
    ]);
    let warnings = r["warnings"].as_array().map_or(&[][..], Vec::as_slice);
    if !warnings.is_empty() {
        page.el("p", "warn", "Left out of the registry:");
        page.open("ul", "");
        for w in warnings {
            page.el("li", "", &text(w));
        }
        page.close("ul");
    }
}

fn proxies(page: &mut Page, view: &MeshView) {
    let proxies = view.proxies.as_array().map_or(&[][..], Vec::as_slice);
    page.el("h2", "", &format!("Connected proxies ({})", proxies.len()));
    if proxies.is_empty() {
        page.el("p", "muted", "No proxy is connected.");
        return;
    }
    page.table(&[
        "node id",
        "service (node.cluster)",
        "from",
        "connected",
        "stream",
        "clusters held",
        "clusters",
        "ACK / NACK",
        "last NACK",
        "sent ahead",
        "waiting / refused",
    ]);
    for p in proxies.iter().take(MAX_PROXIES) {
        let clusters = p["clusters"].as_array().map_or(&[][..], Vec::as_slice);
        let mut names: Vec<String> = clusters.iter().take(MAX_CLUSTERS).map(text).collect();
        if clusters.len() > MAX_CLUSTERS {
            names.push(format!("and {} more", clusters.len() - MAX_CLUSTERS));
        }
        let nack = &p["last_nack"];
        let last_nack = match nack {
            Value::Null => Cell::with("none", "muted"),
            n => Cell::with(
                format!(
                    "{} ({}): {}",
                    text(&n["resource_type"]),
                    ago(view.now_unix, &n["at_unix"]),
                    text(&n["message"])
                ),
                "bad",
            ),
        };
        let ahead = if p["wildcard"].as_bool() == Some(true) {
            format!(
                "{} ({} removed unused)",
                text(&p["prewarmed"]),
                text(&p["evicted"])
            )
        } else {
            "no (no cds_config)".to_owned()
        };
        page.row(&[
            Cell::wrap(text(&p["node_id"])),
            Cell::new(text(&p["node_cluster"])),
            Cell::new(text(&p["source"])),
            Cell::new(ago(view.now_unix, &p["connected_since_unix"])),
            Cell::new(text(&p["service"])),
            Cell::number(clusters.len()),
            Cell::wrap(names.join(", ")),
            Cell::new(format!("{} / {}", text(&p["acks"]), text(&p["nacks"]))),
            last_nack,
            Cell::new(ahead),
            Cell::new(format!("{} / {}", text(&p["waiting"]), text(&p["refused"]))),
        ]);
    }
    page.close("table");
    if proxies.len() > MAX_PROXIES {
        let left = proxies.len() - MAX_PROXIES;
        page.el(
            "p",
            "muted",
            &format!("{left} more proxies not shown: /debug/proxies lists every one."),
        );
    }
}

fn answers(page: &mut Page, view: &MeshView) {
    page.el("h2", "", "On-demand answers");
    let times = match &view.answer_times {
        Some(t) if t.count > 0 => {
            let shown: Vec<String> = (t.percentiles.iter())
                .map(|(p, d)| format!("p{p} {:.1} ms", d.as_secs_f64() * 1000.0))
                .collect();
            Cell::new(format!("{} ({} answers)", shown.join(", "), t.count))
        }
        Some(_) => Cell::with("no answer measured yet", "muted"),
        None => Cell::with("not measured", "muted"),
    };
    let mut facts: Vec<(&str, Cell)> = vec![("answer time percentiles", times)];
    for (label, value) in &view.counters {
        let value = value.map_or(Cell::with("absent", "muted"), Cell::number);
        facts.push((label, value));
    }
    page.facts(&facts);
}

fn prewarm(page: &mut Page, view: &MeshView) {
    let p = &view.prewarm;
    page.el("h2", "", "Prewarm");
    if p["enabled"].as_bool() != Some(true) {
        page.el("p", "muted", "Off (--no-prewarm).");
        return;
    }
    page.el(
        "p",
        "",
        &format!(
            "History {} ({} entries); each service keeps its {} most recently used clusters, for {}.",
            text(&p["file"]),
            text(&p["entries"]),
            text(&p["max_per_service"]),
            p["max_age_seconds"]
                .as_u64()
                .map_or_else(String::new, |s| age(Duration::from_secs(s)))
        ),
    );
    let empty = serde_json::Map::new();
    let services = p["services"].as_object().unwrap_or(&empty);
    if services.is_empty() {
        page.el("p", "muted", "No service has used a cluster yet.");
        return;
    }
    page.table(&[
        "service",
        "clusters predicted",
        "sent ahead",
        "then used",
        "hit rate",
        "asked on demand (misses)",
    ]);
    for (service, s) in services.iter().take(MAX_SERVICES) {
        let predicted = s["predicted"].as_array().map_or(0, Vec::len);
        let rate = s["hit_rate"]
            .as_f64()
            .map_or(Cell::with("none sent yet", "muted"), |r| {
                Cell::number(format!("{:.0} %", r * 100.0))
            });
        page.row(&[
            Cell::new(service.as_str()),
            Cell::number(predicted),
            Cell::number(text(&s["pushed"])),
            Cell::number(text(&s["used"])),
            rate,
            Cell::number(text(&s["asked_on_demand"])),
        ]);
    }
    page.close("table");
    if services.len() > MAX_SERVICES {
        let left = services.len() - MAX_SERVICES;
        page.el(
            "p",
            "muted",
            &format!("{left} more services not shown: /debug/prewarm lists every one."),
        );
    }
}

fn policy(page: &mut Page, view: &MeshView) {
    let source = &view.policy["source"];
    let file = &view.policy["file"];
    page.el("h2", "", "Policy");
    if source["path"].is_null() {
        page.el(
            "p",
            "muted",
            "No policy file (--policy): every cluster has odmesh's defaults.",
        );
        return;
    }
    let loaded = source["loaded_at"]
        .as_u64()
        .map_or(Cell::with("never", "bad"), |t| {
            Cell::new(format!(
                "{} ({})",
                utc(t * 1000),
                ago(view.now_unix, &source["loaded_at"])
            ))
        });
    let error = match &source["last_error"] {
        Value::Null => Cell::with("none", "muted"),
        e => Cell::with(
            format!("{}; the last good policy stays in use", text(e)),
            "bad",
        ),
    };
    let held = match &source["held"] {
        Value::Null => Cell::with("none", "muted"),
        h => Cell::with(text(h), "warn"),
    };
    let count = |key: &str| file[key].as_object().map_or(0, serde_json::Map::len);
    page.facts(&[
        ("file", Cell::new(text(&source["path"]))),
        ("loaded", loaded),
        ("error", error),
        ("held drop", held),
        (
            "entries",
            Cell::new(format!(
                "{} VIPs, {} SVIPs, {} services",
                count("vips"),
                count("svips"),
                count("services")
            )),
        ),
    ]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const NOW: u64 = 1_796_518_923;

    fn view() -> MeshView {
        MeshView {
            now_unix: NOW,
            registry: json!({
                "description": "embedded Eureka registry", "loaded": true, "complete": true,
                "instances": 3, "last_success_age_seconds": 2.0, "last_error": null,
                "warnings": [], "holding": null,
            }),
            proxies: json!([{
                "stream_id": 1, "service": "ads", "node_id": "node-1", "node_cluster": "checkout",
                "source": "127.0.0.1", "connected_since_unix": NOW - 65,
                "clusters": ["hello.vip", "payments.vip"], "endpoints": ["hello.vip"],
                "acks": 4, "nacks": 0, "last_nack": null, "refused": 0, "waiting": 0,
                "wildcard": true, "prewarmed": 1, "evicted": 0,
            }]),
            prewarm: json!({
                "enabled": true, "file": "odmesh-prewarm.json", "max_per_service": 1000,
                "max_entries": 1_000_000, "max_age_seconds": 604_800, "entries": 2,
                "services": {"checkout": {
                    "predicted": [{"cluster": "hello.vip"}, {"cluster": "payments.vip"}],
                    "pushed": 4, "used": 3, "asked_on_demand": 1, "hit_rate": 0.75,
                }},
            }),
            policy: json!({
                "source": {"path": "/etc/odmesh/policy.yaml", "loaded_at": NOW - 10,
                           "last_error": "bad: line 3", "held": null},
                "file": {"vips": {"payments": {"callers": []}}, "svips": {}, "services": {}},
            }),
            counters: vec![
                ("discovery requests received", Some(9)),
                ("absent one", None),
            ],
            answer_times: None,
        }
    }

    #[test]
    fn the_dashboard_shows_each_proxy_with_the_clusters_it_holds() {
        let html = render(&view());
        for shown in [
            "<h2>Connected proxies (1)</h2>",
            "<td class=\"w\">node-1</td><td>checkout</td><td>127.0.0.1</td><td>1 min 5 s ago</td><td>ads</td><td class=\"n\">2</td><td class=\"w\">hello.vip, payments.vip</td><td>4 / 0</td>",
            "<td>embedded Eureka registry</td>",
            "<td class=\"ok\">loaded</td>",
            "<td>checkout</td><td class=\"n\">2</td><td class=\"n\">4</td><td class=\"n\">3</td><td class=\"n\">75 %</td><td class=\"n\">1</td>",
            "<td>/etc/odmesh/policy.yaml</td>",
            "bad: line 3; the last good policy stays in use",
            "1 VIPs, 0 SVIPs, 0 services",
            "<th>discovery requests received</th><td class=\"n\">9</td>",
            "<th>absent one</th><td class=\"muted\">absent</td>",
        ] {
            assert!(html.contains(shown), "{shown}\n{html}");
        }
    }

    #[test]
    fn answer_time_percentiles_read_not_measured_until_the_view_hands_them_over() {
        let mut v = view();
        assert!(
            render(&v)
                .contains("<th>answer time percentiles</th><td class=\"muted\">not measured</td>")
        );
        v.answer_times = Some(AnswerTimes {
            count: 120,
            percentiles: vec![
                (50.0, Duration::from_micros(1200)),
                (99.0, Duration::from_millis(4)),
            ],
        });
        assert!(render(&v).contains("<td>p50 1.2 ms, p99 4.0 ms (120 answers)</td>"));
    }

    #[test]
    fn hostile_node_ids_and_cluster_names_are_text() {
        let mut v = view();
        let evil = "<script>alert(1)</script>\"><img src=x onerror=alert(2)>";
        v.proxies[0]["node_id"] = evil.into();
        v.proxies[0]["node_cluster"] = evil.into();
        v.proxies[0]["clusters"] = json!([evil]);
        v.prewarm["services"] = json!({ evil: {"predicted": [], "pushed": 0, "used": 0} });
        let html = render(&v);
        assert!(
            !html.contains("<script") && !html.contains("<img"),
            "{html}"
        );
        assert_eq!(
            html.matches("&lt;script&gt;alert(1)&lt;/script&gt;&quot;&gt;&lt;img")
                .count(),
            4,
            "{html}"
        );
    }

    #[test]
    fn many_proxies_and_clusters_are_cut_with_a_count_of_what_is_left() {
        let mut v = view();
        let clusters: Vec<String> = (0..MAX_CLUSTERS + 7).map(|i| format!("c{i}.vip")).collect();
        let mut proxy = v.proxies[0].clone();
        proxy["clusters"] = json!(clusters);
        v.proxies = Value::Array(vec![proxy; MAX_PROXIES + 3]);
        let html = render(&v);
        assert_eq!(
            html.matches("<td class=\"w\">node-1</td>").count(),
            MAX_PROXIES
        );
        assert!(
            html.contains(&format!("c{}.vip, and 7 more</td>", MAX_CLUSTERS - 1)),
            "{html}"
        );
        assert!(!html.contains(&format!("c{MAX_CLUSTERS}.vip")), "{html}");
        assert!(html.contains("3 more proxies not shown"), "{html}");
    }

    #[test]
    fn answer_times_are_the_histograms_percentiles() {
        let histogram = metrics::histogram(0.001, 10.0, 3);
        assert_eq!(AnswerTimes::of(&histogram), AnswerTimes::default());
        for ms in [2, 3, 4, 50] {
            metrics::observe(&histogram, Duration::from_millis(ms));
        }
        let times = AnswerTimes::of(&histogram);
        assert_eq!(times.count, 4);
        let want = [(50.0, 0.007), (90.0, 0.064), (99.0, 0.0964)];
        assert_eq!(times.percentiles.len(), want.len());
        for ((p, d), (want_p, want_s)) in times.percentiles.iter().zip(want) {
            assert_eq!(*p, want_p);
            assert!((d.as_secs_f64() - want_s).abs() < 1e-6, "p{p}: {d:?}");
        }
    }

    #[test]
    fn counters_are_read_from_prometheus_text_by_exact_name_and_families_summed() {
        let text = "# HELP odmesh_xds_requests_total x\nodmesh_xds_requests_total_more 1\nodmesh_xds_requests_total 42\n\
                    odmesh_xds_acks_total{type=\"cluster\"} 3\nodmesh_xds_acks_total{type=\"endpoints\"} 4\n";
        assert_eq!(sample(text, "odmesh_xds_requests_total"), Some(42));
        assert_eq!(sample(text, "odmesh_xds_acks_total"), Some(7));
        assert_eq!(sample(text, "odmesh_xds_nacks_total"), None);
    }

    #[test]
    fn without_a_policy_file_or_prewarm_the_page_says_so() {
        let mut v = view();
        v.policy = json!({"source": {"path": null}, "file": {}});
        v.prewarm = json!({"enabled": false});
        v.proxies = json!([]);
        let html = render(&v);
        assert!(html.contains("No policy file (--policy)"), "{html}");
        assert!(html.contains("Off (--no-prewarm)."), "{html}");
        assert!(html.contains("No proxy is connected."), "{html}");
    }
}
