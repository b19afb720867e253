//! The embedded registry's status page (`GET /`), for the people who look at their fleet
//! there as they do on a Eureka server's: the apps and their instances (status, override,
//! lease), the peers and their replication, self-preservation and the warm-up.
//!
//! Bounded for large registries: the page lists at most [`MAX_APPS`] apps with their counts
//! and [`MAX_ROWS`] instances ([`PER_APP`] per app), and says how many it left out;
//! `/?app=NAME` lists one app's instances (up to [`MAX_ROWS`]). Taking what it shows holds
//! the registry's lock for one pointer per row shown, not the registry; the page is written
//! after, through [`odmesh_base::html::Page`], which escapes every text.

use std::time::Duration;

use odmesh_base::html::{Cell, Page, age, utc};
use odmesh_registry::Status;

use super::EurekaRegistry;
use super::ledger::{Lease, Name};
use super::peers::PeerState;
use super::preservation::PreservationConfig;
use super::stored::Stored;

/// Apps listed (with their instance counts) on one page.
pub const MAX_APPS: usize = 1000;
/// Instances listed on one page, over all apps.
pub const MAX_ROWS: usize = 500;
/// Instances listed per app on the page of every app.
pub const PER_APP: usize = 25;
/// Characters shown of one text field (a host name, a metadata value).
const MAX_TEXT: usize = 120;
/// Metadata entries shown per instance.
const MAX_METADATA: usize = 8;

/// Everything the page shows, taken under the registry's lock (counts and shared pointers)
/// and written after.
#[derive(Debug)]
pub struct StatusView {
    /// Now, in ms since the Unix epoch.
    pub now_ms: u64,
    /// This process's name among its peers.
    pub node: String,
    pub uptime: Duration,
    pub general: General,
    pub preservation: Preservation,
    /// Registered instances by status, as served.
    pub statuses: [(Status, usize); 5],
    pub instances: usize,
    pub apps: usize,
    /// The apps listed, each with its instance count and the rows shown.
    pub listed: Vec<AppRows>,
    /// `?app=NAME`: only this app was asked for.
    pub only: Option<String>,
    pub peers: Vec<PeerState>,
}

/// The registry's settings and state, for "General info".
#[derive(Debug)]
pub struct General {
    pub lease_duration: Duration,
    pub eviction_interval: Duration,
    pub delta_retention: Duration,
    pub warmup: Duration,
    /// Still warming up: published as loading.
    pub warming_up: bool,
    /// Filled from a peer at start (complete, no warm-up).
    pub filled: bool,
    pub refuse_reads_while_warming: bool,
    pub authenticated: bool,
    pub max_instances: usize,
    /// The registry's version (`versions__delta`).
    pub version: u64,
}

/// Self-preservation's settings and figures.
#[derive(Debug)]
pub struct Preservation {
    pub config: PreservationConfig,
    /// Eviction is held (as of the last eviction round).
    pub engaged: bool,
    /// Renewals counted within the window.
    pub renewals: u64,
    /// Renewals expected within the window.
    pub expected: f64,
}

/// One app listed: its instance count, and the instances shown (the first, by id).
#[derive(Debug)]
pub struct AppRows {
    pub name: Name,
    pub count: usize,
    pub rows: Vec<Row>,
}

/// One instance shown, as taken under the lock.
#[derive(Debug)]
pub struct Row {
    pub doc: Stored,
    pub reported: Status,
    pub overridden: Option<Status>,
    pub override_by_operator: bool,
    pub renewed_ms: u64,
    pub duration: Duration,
    pub owner: Option<std::sync::Arc<str>>,
}

impl Row {
    fn of(lease: &Lease) -> Row {
        Row {
            doc: lease.stored().clone(),
            reported: lease.reported,
            overridden: lease.overridden,
            override_by_operator: lease.override_by_operator,
            renewed_ms: lease.renewed_ms(),
            duration: lease.duration(),
            owner: lease.owner.clone(),
        }
    }
}

impl EurekaRegistry {
    /// What the status page shows now; `only`: one app's page (its name, any case).
    pub fn status_view(&self, only: Option<&str>) -> StatusView {
        let config = &self.shared.config;
        let now = self.now();
        let only = only.map(|app| app.trim().to_ascii_uppercase());
        let mut state = self.lock();
        let (renewals, expected) = state.renewals(now.at);
        let leases = state.leases();
        let listed = match &only {
            Some(app) => (leases.get_key_value(app.as_str()).into_iter())
                .map(|(name, leases)| AppRows {
                    name: name.clone(),
                    count: leases.len(),
                    rows: leases.values().take(MAX_ROWS).map(Row::of).collect(),
                })
                .collect(),
            None => {
                let mut budget = MAX_ROWS;
                (leases.iter().take(MAX_APPS))
                    .map(|(name, leases)| {
                        let rows: Vec<Row> = (leases.values().take(PER_APP.min(budget)))
                            .map(Row::of)
                            .collect();
                        budget -= rows.len();
                        AppRows {
                            name: name.clone(),
                            count: leases.len(),
                            rows,
                        }
                    })
                    .collect()
            }
        };
        let view = StatusView {
            now_ms: now.ms,
            node: self.shared.node.clone(),
            uptime: self.since(self.shared.started),
            general: General {
                lease_duration: config.lease_duration,
                eviction_interval: config.eviction_interval,
                delta_retention: config.delta_retention,
                warmup: config.warmup,
                warming_up: self.is_warming_up(),
                filled: self
                    .shared
                    .filled
                    .load(std::sync::atomic::Ordering::Relaxed),
                refuse_reads_while_warming: config.refuse_reads_while_warming,
                authenticated: config.auth.is_some(),
                max_instances: config.limits.max_instances,
                version: state.version(),
            },
            preservation: Preservation {
                config: config.preservation,
                engaged: state.is_preserving(),
                renewals,
                expected,
            },
            statuses: state.status_counts(),
            instances: state.len(),
            apps: state.leases().len(),
            listed,
            only,
            peers: Vec::new(),
        };
        drop(state);
        StatusView {
            peers: self.peer_states(),
            ..view
        }
    }
}

/// `text`, at most [`MAX_TEXT`] characters (then `…`).
fn clipped(text: &str) -> String {
    clipped_at(text, MAX_TEXT)
}

/// `text`, at most `max` characters (then `…`).
fn clipped_at(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_owned(),
    }
}

fn status_class(status: &str) -> &'static str {
    match status {
        "UP" => "ok",
        "DOWN" => "bad",
        _ => "warn",
    }
}

/// The status page of `view`, as HTML.
pub fn render(view: &StatusView) -> String {
    let mut page = Page::new("odmesh registry");
    page.el("h1", "", "odmesh embedded registry");
    page.el(
        "p",
        "muted",
        &format!(
            "Node {} · {} · up {} · {} instances in {} apps",
            view.node,
            utc(view.now_ms),
            age(view.uptime),
            view.instances,
            view.apps
        ),
    );
    alerts(&mut page, view);
    replicas(&mut page, view);
    instances(&mut page, view);
    general(&mut page, view);
    page.finish()
}

/// The self-preservation and warm-up warnings, at the top as on Eureka's page.
fn alerts(page: &mut Page, view: &StatusView) {
    let p = &view.preservation;
    if p.engaged {
        page.el(
            "div",
            "alert",
            &format!(
                "EMERGENCY! Self-preservation is on: {} renewals in the last {}, below {:.0} % of the {:.0} expected. Expired leases are not evicted, so instances that are gone may still be listed and routed to.",
                p.renewals,
                age(p.config.window),
                p.config.threshold * 100.0,
                p.expected
            ),
        );
    }
    if p.config.threshold <= 0.0 {
        page.el(
            "div",
            "note",
            "Self-preservation is off (--self-preservation-threshold 0): if the registry loses touch with its clients, their leases expire and they are evicted.",
        );
    }
    let g = &view.general;
    if g.warming_up {
        let left = g.warmup.saturating_sub(view.uptime);
        let reads = if g.refuse_reads_while_warming {
            "clients' reads of /apps are refused (403) meanwhile"
        } else {
            "clients read what it holds so far"
        };
        page.el(
            "div",
            "note",
            &format!(
                "Warming up: for another {} the registry is published as still loading while its clients register again; proxies keep the clusters they hold, and {reads}.",
                age(left)
            ),
        );
    }
}

/// "DS Replicas", as Eureka calls its peers.
fn replicas(page: &mut Page, view: &StatusView) {
    page.el("h2", "", "Peers (DS replicas)");
    if view.peers.is_empty() {
        page.el(
            "p",
            "muted",
            "No peers: this registry replicates with nobody (--peer URL).",
        );
        return;
    }
    page.table(&[
        "peer",
        "state",
        "writes queued",
        "registrations held for resend",
        "failed tries since the last success",
        "last success",
        "writes refused and dropped",
        "last error",
    ]);
    for peer in &view.peers {
        let h = &peer.health;
        let state = if peer.is_self {
            Cell::with("this node (nothing sent)", "muted")
        } else if h.failures > 0 {
            Cell::with("failing", "bad")
        } else if h.last_success_ms.is_some() {
            Cell::with("replicating", "ok")
        } else {
            Cell::with("nothing sent yet", "muted")
        };
        let last = h
            .last_success_ms
            .map_or(Cell::with("never", "muted"), |ms| {
                ago(view.now_ms, ms).into()
            });
        page.row(&[
            Cell::wrap(clipped(&peer.url)),
            state,
            Cell::number(peer.pending),
            Cell::number(peer.resends),
            Cell::number(h.failures),
            last,
            Cell::number(h.discarded),
            Cell::wrap(
                h.last_error
                    .as_deref()
                    .map_or_else(String::new, |e| clipped_at(e, 400)),
            ),
        ]);
    }
    page.close("table");
}

/// How long before `now_ms` `then_ms` was.
fn ago(now_ms: u64, then_ms: u64) -> String {
    format!(
        "{} ago",
        age(Duration::from_millis(now_ms.saturating_sub(then_ms)))
    )
}

fn instances(page: &mut Page, view: &StatusView) {
    page.el("h2", "", "Instances currently registered");
    let counts: Vec<String> = (view.statuses.iter())
        .filter(|(_, n)| *n > 0)
        .map(|(s, n)| format!("{} {n}", s.as_str()))
        .collect();
    let counts = if counts.is_empty() {
        "none".to_owned()
    } else {
        counts.join(", ")
    };
    page.el(
        "p",
        "",
        &format!(
            "{} instances in {} apps; by status: {counts}.",
            view.instances, view.apps
        ),
    );
    if let Some(app) = &view.only {
        page.open("p", "")
            .text(&format!("Only app {app}. "))
            .link("/", "Every app")
            .close("p");
        if view.listed.is_empty() {
            page.el(
                "p",
                "muted",
                &format!("No instance of {app} is registered."),
            );
        }
    } else if view.apps > 0 {
        apps_table(page, view);
    }
    for app in view.listed.iter().filter(|a| !a.rows.is_empty()) {
        page.open_with_id("section", &format!("app-{}", app.name));
        page.el("h2", "", &format!("{} ({} instances)", app.name, app.count));
        instance_table(page, view.now_ms, app);
        let left = app.count - app.rows.len();
        if left > 0 {
            page.open("p", "muted")
                .text(&format!(
                    "{left} more instances of {} not shown: ",
                    app.name
                ))
                .link(&app_link(&app.name), "this app alone")
                .text(&format!(" lists up to {MAX_ROWS}."))
                .close("p");
        }
        page.close("section");
    }
}

/// The page of one app.
fn app_link(app: &str) -> String {
    let name = percent_encoding::utf8_percent_encode(app, percent_encoding::NON_ALPHANUMERIC);
    format!("/?app={name}")
}

fn apps_table(page: &mut Page, view: &StatusView) {
    page.table(&["application", "instances", "shown below"]);
    for app in &view.listed {
        page.open("tr", "").open("td", "");
        page.link(&app_link(&app.name), &app.name).close("td");
        page.el("td", "n", &app.count.to_string());
        let shown = match app.rows.len() {
            0 => "none (this page's rows are used up)".to_owned(),
            n if n == app.count => "all".to_owned(),
            n => format!("the first {n}"),
        };
        page.el("td", "muted", &shown).close("tr");
    }
    page.close("table");
    let left = view.apps - view.listed.len();
    if left > 0 {
        page.el(
            "p",
            "muted",
            &format!("{left} more apps not listed (a page lists {MAX_APPS}); ask for one with /?app=NAME."),
        );
    }
}

fn instance_table(page: &mut Page, now_ms: u64, app: &AppRows) {
    page.table(&[
        "instance id",
        "status",
        "override",
        "host",
        "address",
        "VIPs",
        "secure VIPs",
        "registered",
        "last renewal",
        "lease",
        "owner",
        "status page",
        "metadata",
    ]);
    for row in &app.rows {
        let info = row.doc.info();
        let status = info.status.clone().unwrap_or_else(|| "UNKNOWN".into());
        let reported = row.reported.as_str();
        let status_cell = if reported == status {
            Cell::with(status.clone(), status_class(&status))
        } else {
            let text = format!("{status} (reports {reported})");
            Cell::with(text, status_class(&status))
        };
        let overridden = match row.overridden {
            None => Cell::with("none", "muted"),
            Some(s) if row.override_by_operator => {
                Cell::with(format!("{} (operator)", s.as_str()), "warn")
            }
            Some(s) => Cell::with(s.as_str(), "warn"),
        };
        let ip = info.ip_addr.as_deref().unwrap_or_default();
        let mut address = clipped(ip);
        let enabled = |port: &Option<crate::wire::json::Port>| {
            (port.as_ref())
                .filter(|p| p.enabled != Some(false))
                .map(|p| p.port)
        };
        if let Some(port) = enabled(&info.port) {
            address.push_str(&format!(":{port}"));
        }
        if let Some(port) = enabled(&info.secure_port) {
            address.push_str(&format!(" (secure {port})"));
        }
        let lease = info.lease_info.as_ref();
        let registered = lease
            .and_then(|l| l.registration_timestamp)
            .map_or_else(String::new, |ms| ago(now_ms, ms));
        let entries: Vec<String> = (info.metadata.iter())
            .filter(|(k, _)| k.as_str() != super::document::OWNER_KEY)
            .map(|(k, v)| format!("{}={}", clipped(k), clipped(v)))
            .collect();
        let mut metadata = entries[..entries.len().min(MAX_METADATA)].join(" ");
        if entries.len() > MAX_METADATA {
            let left = entries.len() - MAX_METADATA;
            metadata.push_str(&format!(" and {left} more"));
        }
        page.row(&[
            Cell::new(clipped(info.instance_id.as_deref().unwrap_or_default())),
            status_cell,
            overridden,
            Cell::wrap(clipped(info.host_name.as_deref().unwrap_or_default())),
            Cell::new(address),
            Cell::new(clipped(info.vip_address.as_deref().unwrap_or_default())),
            Cell::new(clipped(
                info.secure_vip_address.as_deref().unwrap_or_default(),
            )),
            Cell::new(registered),
            Cell::new(ago(now_ms, row.renewed_ms)),
            Cell::new(age(row.duration)),
            Cell::new(row.owner.as_deref().map(clipped).unwrap_or_default()),
            Cell::wrap(clipped(info.status_page_url.as_deref().unwrap_or_default())),
            Cell::wrap(metadata),
        ]);
    }
    page.close("table");
}

fn general(page: &mut Page, view: &StatusView) {
    let g = &view.general;
    let p = &view.preservation;
    page.el("h2", "", "General info");
    let on_off = |on: bool| if on { "on" } else { "off" };
    let warm = if g.filled {
        Cell::with("complete: filled from a peer at start", "ok")
    } else if g.warming_up {
        Cell::with(format!("warming up ({} in all)", age(g.warmup)), "warn")
    } else {
        Cell::with(
            format!("complete (after a warm-up of {})", age(g.warmup)),
            "ok",
        )
    };
    let preserving = if p.engaged {
        Cell::with("ON: eviction held", "bad")
    } else {
        Cell::with("off: eviction runs", "ok")
    };
    let threshold = p.config.threshold * p.expected;
    page.facts(&[
        ("node", Cell::new(view.node.as_str())),
        ("current time", Cell::new(utc(view.now_ms))),
        ("uptime", Cell::new(age(view.uptime))),
        ("registry", warm),
        (
            "authentication (--eureka-auth)",
            Cell::new(on_off(g.authenticated)),
        ),
        ("registry version", Cell::number(g.version)),
        (
            "instances registered / most allowed",
            Cell::new(format!("{} / {}", view.instances, g.max_instances)),
        ),
        (
            "lease duration (when a registration does not say)",
            Cell::new(age(g.lease_duration)),
        ),
        ("eviction interval", Cell::new(age(g.eviction_interval))),
        ("delta retention", Cell::new(age(g.delta_retention))),
        ("self-preservation", preserving),
        (
            "renewals in the last window (counted / expected)",
            Cell::new(format!(
                "{} / {:.0} in {}",
                p.renewals,
                p.expected,
                age(p.config.window)
            )),
        ),
        (
            "renewals threshold",
            Cell::new(format!(
                "{threshold:.0} ({:.0} % of expected; from {} instances)",
                p.config.threshold * 100.0,
                p.config.min_instances
            )),
        ),
    ]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::json::InstanceInfo;

    fn row(id: &str, host: &str, status: Status, overridden: Option<Status>) -> Row {
        let mut info: InstanceInfo = serde_json::from_value(serde_json::json!({
            "instanceId": id, "app": "HELLO", "hostName": host, "ipAddr": "10.0.0.5",
            "status": status.as_str(), "port": {"$": 8080, "@enabled": "true"},
            "vipAddress": "hello",
            "statusPageUrl": "javascript:alert(1)",
            "leaseInfo": {"registrationTimestamp": 1_000_000},
            "metadata": {"zone": "<img src=x onerror=alert(1)>", "odmesh.owner": "ops"},
        }))
        .unwrap();
        info.status = Some(overridden.unwrap_or(status).as_str().to_owned());
        Row {
            doc: Stored::from(&info),
            reported: status,
            overridden,
            override_by_operator: overridden.is_some(),
            renewed_ms: 1_060_000,
            duration: Duration::from_secs(90),
            owner: Some("ops".into()),
        }
    }

    fn view(apps: Vec<AppRows>) -> StatusView {
        let instances = apps.iter().map(|a| a.count).sum();
        StatusView {
            now_ms: 1_090_000,
            node: "node-1".into(),
            uptime: Duration::from_secs(100),
            general: General {
                lease_duration: Duration::from_secs(90),
                eviction_interval: Duration::from_secs(1),
                delta_retention: Duration::from_secs(180),
                warmup: Duration::from_secs(35),
                warming_up: false,
                filled: false,
                refuse_reads_while_warming: false,
                authenticated: false,
                max_instances: 2_000_000,
                version: 7,
            },
            preservation: Preservation {
                config: PreservationConfig::default(),
                engaged: false,
                renewals: 40,
                expected: 42.0,
            },
            statuses: [
                (Status::Up, instances),
                (Status::Down, 0),
                (Status::Starting, 0),
                (Status::OutOfService, 0),
                (Status::Unknown, 0),
            ],
            instances,
            apps: apps.len(),
            listed: apps,
            only: None,
            peers: Vec::new(),
        }
    }

    fn hello(rows: Vec<Row>, count: usize) -> AppRows {
        AppRows {
            name: "HELLO".into(),
            count,
            rows,
        }
    }

    #[test]
    fn the_page_lists_each_instance_with_its_status_override_and_lease() {
        let rows = vec![
            row("hello-1", "host-1", Status::Up, None),
            row("hello-2", "host-2", Status::Up, Some(Status::OutOfService)),
        ];
        let html = render(&view(vec![hello(rows, 2)]));
        for shown in [
            "Instances currently registered",
            "2 instances in 1 apps; by status: UP 2.",
            "HELLO (2 instances)",
            "<td>hello-1</td><td class=\"ok\">UP</td><td class=\"muted\">none</td><td class=\"w\">host-1</td><td>10.0.0.5:8080</td>",
            "<td class=\"warn\">OUT_OF_SERVICE (reports UP)</td><td class=\"warn\">OUT_OF_SERVICE (operator)</td>",
            // Registered 90 s ago, renewed 30 s ago.
            "<td>1 min 30 s ago</td><td>30 s ago</td><td>1 min 30 s</td><td>ops</td>",
            "No peers",
            "General info",
            "40 / 42 in 1 min 0 s",
        ] {
            assert!(html.contains(shown), "{shown}\n{html}");
        }
        assert!(!html.contains("EMERGENCY"), "{html}");
        assert!(!html.contains("Warming up"), "{html}");
        // The owner is its own column, not metadata.
        assert!(!html.contains("odmesh.owner"), "{html}");
    }

    #[test]
    fn hostile_fields_are_text_and_never_a_link_or_markup() {
        let host = "<script>alert(1)</script>\"><img/src=x/onerror=alert(2)>";
        let html = render(&view(vec![hello(
            vec![row("a", host, Status::Up, None)],
            1,
        )]));
        assert!(!html.contains("<script"), "{html}");
        assert!(!html.contains("<img"), "{html}");
        assert!(
            html.contains(
                "&lt;script&gt;alert(1)&lt;/script&gt;&quot;&gt;&lt;img/src=x/onerror=alert(2)&gt;"
            ),
            "{html}"
        );
        assert!(
            html.contains("zone=&lt;img src=x onerror=alert(1)&gt;"),
            "{html}"
        );
        // An instance's URL is shown, not followed: no href but the page's own.
        assert!(
            html.contains("<td class=\"w\">javascript:alert(1)</td>"),
            "{html}"
        );
        assert!(
            html.match_indices("href=\"")
                .all(|(i, _)| html[i + 6..].starts_with("/")),
            "{html}"
        );
    }

    #[test]
    fn an_instance_shows_its_first_metadata_entries_and_how_many_more_it_has() {
        let mut r = row("a", "host", Status::Up, None);
        let mut info = r.doc.info();
        for n in 0..MAX_METADATA + 2 {
            info.metadata.insert(format!("k{n:02}"), "v".to_owned());
        }
        r.doc = Stored::from(&info);
        let html = render(&view(vec![hello(vec![r], 1)]));
        // The owner's entry is not counted; `zone` sorts after the k entries.
        assert!(html.contains("k00=v k01=v"), "{html}");
        assert!(
            html.contains(&format!("k{:02}=v and 3 more</td>", MAX_METADATA - 1)),
            "{html}"
        );
    }

    #[test]
    fn self_preservation_and_the_warm_up_are_announced_at_the_top() {
        let mut v = view(Vec::new());
        v.preservation.engaged = true;
        v.preservation.renewals = 10;
        v.preservation.expected = 120.0;
        v.general.warming_up = true;
        v.uptime = Duration::from_secs(5);
        let html = render(&v);
        assert!(
            html.contains("<div class=\"alert\">EMERGENCY! Self-preservation is on: 10 renewals in the last 1 min 0 s, below 85 % of the 120 expected."),
            "{html}"
        );
        assert!(html.contains("Warming up: for another 30 s"), "{html}");
        assert!(html.contains("ON: eviction held"), "{html}");
        assert!(
            html.contains("0 instances in 0 apps; by status: none."),
            "{html}"
        );
        assert!(!html.contains("Self-preservation is off"), "{html}");
        v.preservation.config.threshold = 0.0;
        v.preservation.engaged = false;
        let html = render(&v);
        let off = "<div class=\"note\">Self-preservation is off (--self-preservation-threshold 0)";
        assert!(html.contains(off), "{html}");
    }

    #[test]
    fn peers_show_their_queue_failures_and_last_success() {
        use super::super::peers::PeerHealth;
        let mut v = view(Vec::new());
        v.peers = vec![
            PeerState {
                url: "http://node-2:8761/eureka".into(),
                pending: 12,
                resends: 1,
                is_self: false,
                health: PeerHealth {
                    last_success_ms: Some(1_080_000),
                    failures: 3,
                    last_error: Some(
                        "http://node-2:8761/eureka/peerreplication/batch: no answer within 5s"
                            .into(),
                    ),
                    discarded: 2,
                },
            },
            PeerState {
                url: "http://node-1:8761/eureka".into(),
                pending: 0,
                resends: 0,
                is_self: true,
                health: PeerHealth::default(),
            },
        ];
        let html = render(&v);
        assert!(
            html.contains("<td class=\"w\">http://node-2:8761/eureka</td><td class=\"bad\">failing</td><td class=\"n\">12</td><td class=\"n\">1</td><td class=\"n\">3</td><td>10 s ago</td><td class=\"n\">2</td><td class=\"w\">http://node-2"),
            "{html}"
        );
        assert!(html.contains("this node (nothing sent)"), "{html}");
    }

    /// A registry on one machine, complete at once, with `auth`.
    fn registry(auth: Option<&str>) -> EurekaRegistry {
        use super::super::{ServerConfig, auth::Authenticator};
        let config = ServerConfig {
            warmup: Duration::ZERO,
            auth: auth.map(|yaml| {
                std::sync::Arc::new(Authenticator::parse("t", yaml.as_bytes()).unwrap())
            }),
            ..ServerConfig::local()
        };
        let (tx, _) = tokio::sync::watch::channel(Default::default());
        EurekaRegistry::new(config, tx, Default::default(), Default::default())
    }

    fn register(eureka: &EurekaRegistry, app: &str, id: &str) {
        let body = serde_json::json!({"instance": {
            "instanceId": id, "app": app, "ipAddr": "127.0.0.1", "status": "UP",
            "port": {"$": 8080, "@enabled": "true"}, "vipAddress": app.to_ascii_lowercase(),
        }});
        eureka.register(app, body.to_string().as_bytes()).unwrap();
    }

    async fn get(
        eureka: &EurekaRegistry,
        method: &str,
        uri: &str,
        authorization: Option<&str>,
    ) -> (u16, axum::http::HeaderMap, String) {
        use tower::ServiceExt;
        let mut request = axum::http::Request::builder().method(method).uri(uri);
        if let Some(value) = authorization {
            request = request.header("authorization", value);
        }
        let answer = (eureka.router())
            .oneshot(request.body(axum::body::Body::empty()).unwrap())
            .await
            .unwrap();
        let (parts, body) = answer.into_parts();
        let body = axum::body::to_bytes(body, 64 << 20).await.unwrap();
        (
            parts.status.as_u16(),
            parts.headers,
            String::from_utf8(body.to_vec()).unwrap(),
        )
    }

    #[tokio::test]
    async fn a_large_registry_gets_a_bounded_page_that_says_what_it_left_out() {
        let eureka = registry(None);
        for app in 0..MAX_APPS + 5 {
            register(&eureka, &format!("APP-{app:05}"), "only");
        }
        for id in 0..MAX_ROWS + 10 {
            register(&eureka, "APP-00000", &format!("big-{id:04}"));
        }
        let (status, headers, html) = get(&eureka, "GET", "/", None).await;
        assert_eq!(status, 200);
        assert_eq!(headers["content-type"], "text/html; charset=utf-8");
        let apps = html.matches("<tr><td><a href=").count();
        let rows = html.matches("<tr><td>").count() - apps;
        assert!(rows <= MAX_ROWS, "{rows} instance rows");
        assert_eq!(apps, MAX_APPS, "apps listed");
        assert!(html.contains("5 more apps not listed"), "{html}");
        let left = MAX_ROWS + 11 - PER_APP;
        assert!(
            html.contains(&format!("{left} more instances of APP-00000 not shown")),
            "{html}"
        );
        assert!(
            html.contains("none (this page&#39;s rows are used up)"),
            "{html}"
        );
        assert!(html.len() < 2 << 20, "{} bytes", html.len());
        // One app alone: up to MAX_ROWS of its instances.
        let (status, _, html) = get(&eureka, "GET", "/?app=app-00000", None).await;
        assert_eq!(status, 200);
        assert_eq!(html.matches("<tr><td>").count(), MAX_ROWS);
        assert!(html.contains("Only app APP-00000."), "{html}");
        assert!(
            html.contains("11 more instances of APP-00000 not shown"),
            "{html}"
        );
        let (_, _, html) = get(&eureka, "GET", "/?app=NOSUCH", None).await;
        assert!(
            html.contains("No instance of NOSUCH is registered."),
            "{html}"
        );
    }

    #[tokio::test]
    async fn the_page_is_read_only_and_asks_for_what_get_apps_asks_for() {
        let tokens = "identities:\n  - {name: hello, token: hello-token-0123456789}\n";
        let eureka = registry(Some(tokens));
        let (apps, _, refusal) = get(&eureka, "GET", "/eureka/apps", None).await;
        assert_eq!(apps, 401);
        let (status, headers, body) = get(&eureka, "GET", "/", None).await;
        assert_eq!((status, body), (401, refusal));
        assert!(headers.contains_key("www-authenticate"));
        let (status, _, _) = get(&eureka, "GET", "/", Some("Bearer wrong-token-0123456789")).await;
        assert_eq!(status, 401);
        let bearer = Some("Bearer hello-token-0123456789");
        let (status, headers, html) = get(&eureka, "GET", "/", bearer).await;
        assert_eq!(status, 200, "{html}");
        assert!(
            html.contains("authentication (--eureka-auth)</th><td>on"),
            "{html}"
        );
        let csp = headers["content-security-policy"].to_str().unwrap();
        assert!(
            csp.starts_with("default-src 'none'; style-src 'unsafe-inline'"),
            "{csp}"
        );
        assert_eq!(headers["x-content-type-options"], "nosniff");
        let (status, _, _) = get(&eureka, "POST", "/", bearer).await;
        assert_eq!(status, 405);
    }
}
