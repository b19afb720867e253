//! The pages people read, in a real browser: the embedded registry's status page (`/` of its
//! port) and the admin's mesh dashboard (`/` of the admin port), read with headless Chromium
//! from a real control plane (and, for the dashboard, a real Envoy). They show what the
//! registry and the mesh hold; what a hostile client registered (or a proxy named itself)
//! stays text; the registry's
//! page asks for the credentials `GET /apps` asks for. Needs `cargo build -p odmesh-control`,
//! chromium (`scripts/install-test-tools.sh`), and for the dashboard `make envoy` and
//! `make wasm`. Each page's screenshot is in the test's log folder (its path is printed).

use std::time::Duration;

use odmesh_e2e::browser::{start_tags, tag_name};
use odmesh_e2e::mesh::EGRESS_LISTENER;
use odmesh_e2e::{
    Chromium, ControlPlane, EchoUpstream, Envoy, EurekaApi, Request, Response, Source, TestEnv,
    eureka_url, odmesh_bootstrap, reserve_addrs, wait_until,
};
use serde_json::{Value, json};

/// How long anything here may take.
const DEADLINE: Duration = Duration::from_secs(15);

/// Markup a hostile client puts where the registry lets it, each with a mark of its own, so
/// that each one is looked for on the page.
const HOSTILE_HOST: &str = "\"><img/src=x/onerror=alert(1)><script>alert(2)</script>";
const HOSTILE_NOTE: &str = "<script>alert(3)</script>";
const HOSTILE_ZONE: &str = "\"><img src=x onerror=alert(4)>";
const HOSTILE_URL: &str = "javascript:alert(5)";
const HOSTILE_NODE: &str = "<script>alert(6)</script>\"><img src=x onerror=alert(7)>";
/// [`HOSTILE_NODE`] as text in a serialised document.
const HOSTILE_NODE_SHOWN: &str =
    "&lt;script&gt;alert(6)&lt;/script&gt;\"&gt;&lt;img src=x onerror=alert(7)&gt;";

/// The Content-Security-Policy both pages are answered with: no script at all.
const NO_SCRIPT: &str = "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// A registration body for `app`/`id` at `ip`, with `fields` over the usual ones.
fn registration(app: &str, id: &str, fields: Value) -> String {
    let mut instance = json!({
        "instanceId": id, "app": app, "hostName": "127.0.0.1", "ipAddr": "127.0.0.1",
        "status": "UP", "port": {"$": 8080, "@enabled": "true"},
        "vipAddress": app.to_ascii_lowercase(),
        "dataCenterInfo": {"@class": "com.netflix.appinfo.InstanceInfo$DefaultDataCenterInfo", "name": "MyOwn"},
        "leaseInfo": {"durationInSecs": 90},
    });
    for (key, value) in fields.as_object().into_iter().flatten() {
        instance[key] = value.clone();
    }
    json!({ "instance": instance }).to_string()
}

/// `POST /eureka/apps/{path_app}` of `body`, with `authorization` if given.
fn post(api: &EurekaApi, path_app: &str, body: String, authorization: Option<&str>) -> Response {
    let mut request = Request::new("POST", &format!("/eureka/apps/{path_app}"))
        .host(&api.addr().to_string())
        .header("content-type", "application/json")
        .body(body);
    if let Some(value) = authorization {
        request = request.header("authorization", value);
    }
    request.send(api.addr())
}

/// `GET path` on `addr`, with `authorization` if given.
fn get(addr: std::net::SocketAddr, path: &str, authorization: Option<&str>) -> Response {
    let mut request = Request::get(path).host(&addr.to_string());
    if let Some(value) = authorization {
        request = request.header("authorization", value);
    }
    request.send(addr)
}

/// Asserts that `dom` (a page as the browser built it) holds no element a page's data could
/// have made: no script, image, frame, object, form or link elsewhere, and no event handler
/// attribute.
fn assert_no_element_from_data(dom: &str) {
    let tags = start_tags(dom);
    assert!(tags.len() > 20, "not a page: {dom}");
    let allowed = [
        "html", "head", "meta", "title", "style", "body", "h1", "h2", "p", "div", "table", "tbody",
        "tr", "th", "td", "a", "section", "ul", "li",
    ];
    for tag in &tags {
        let name = tag_name(tag);
        assert!(
            allowed.contains(&name),
            "element <{tag}> on the page:\n{dom}"
        );
        let handler = tag
            .split_whitespace()
            .skip(1)
            .any(|attribute| attribute.starts_with("on"));
        assert!(!handler, "an event handler in <{tag}>:\n{dom}");
        if name == "a" {
            assert!(
                tag.contains("href=\"/"),
                "a link off the page: <{tag}>\n{dom}"
            );
        }
    }
}

/// Asserts that `answer` is a page answered as HTML under a policy that runs no script.
fn assert_html_without_script(answer: &Response) {
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(
        answer.header("content-type"),
        Some("text/html; charset=utf-8")
    );
    assert_eq!(answer.header("content-security-policy"), Some(NO_SCRIPT));
    assert_eq!(answer.header("x-content-type-options"), Some("nosniff"));
    assert!(!answer.text().contains("<script"), "{}", answer.text());
}

#[test]
fn the_registry_status_page_shows_the_fleet_and_what_a_hostile_client_registered_only_as_text() {
    let chromium = Chromium::find();
    let env = TestEnv::new("dashboards_registry_page");
    // A long warm-up, so that the page shows it however slow the machine.
    let control = ControlPlane::start_source(
        &env,
        "control",
        Source::ServeEureka,
        &["--registry-warmup", "600"],
    );
    let api = EurekaApi::new(control.eureka_addr());
    api.register("HELLO", "hello-1", 8081);
    api.register("HELLO", "hello-2", 8082);
    api.register("WORLD", "world-1", 8083);
    api.set_status("HELLO", "hello-2", "OUT_OF_SERVICE");

    // Where the registry refuses markup, it says so: the app, the id, the address, the VIP,
    // and a host name with spaces.
    let evil = "%3Cscript%3Ealert(1)%3C%2Fscript%3E";
    let refused = [
        (
            evil,
            registration("<script>alert(1)</script>", "e-0", json!({})),
        ),
        (
            "EVIL",
            registration("EVIL", "<script>alert(1)</script>", json!({})),
        ),
        (
            "EVIL",
            registration("EVIL", "e-1", json!({"ipAddr": HOSTILE_HOST})),
        ),
        (
            "EVIL",
            registration("EVIL", "e-2", json!({"vipAddress": HOSTILE_NOTE})),
        ),
        (
            "EVIL",
            registration("EVIL", "e-3", json!({"hostName": HOSTILE_ZONE})),
        ),
        (
            "EVIL",
            registration("EVIL", "e-4", json!({"secureVipAddress": HOSTILE_NOTE})),
        ),
    ];
    for (path_app, body) in refused {
        let answer = post(&api, path_app, body.clone(), None);
        assert_eq!(answer.status, 400, "{body}: {}", answer.text());
    }
    // What it takes: a host name without spaces, metadata values, the status page URL.
    let hostile = registration(
        "EVIL",
        "evil-1",
        json!({
            "hostName": HOSTILE_HOST,
            "metadata": {"note": HOSTILE_NOTE, "zone": HOSTILE_ZONE},
            "statusPageUrl": HOSTILE_URL,
            "homePageUrl": HOSTILE_URL,
        }),
    );
    let answer = post(&api, "EVIL", hostile, None);
    assert_eq!(answer.status, 204, "{}", answer.text());
    // And what it reads as something else: a status it does not know (UNKNOWN), an override
    // that is none, a metadata key that is not an XML name (left out).
    let odd = registration(
        "EVIL",
        "evil-2",
        json!({
            "status": HOSTILE_NOTE,
            "overriddenStatus": HOSTILE_NOTE,
            "metadata": {"<script>": "left-out", "kept": "yes"},
        }),
    );
    let answer = post(&api, "EVIL", odd, None);
    assert_eq!(answer.status, 204, "{}", answer.text());
    assert_eq!(api.instances().len(), 5);

    let url = format!("http://{}/", control.eureka_addr());
    let dom = chromium.dump_dom(&env, "registry-page", &url);
    for shown in [
        "<h1>odmesh embedded registry</h1>",
        "Warming up: for another",
        "5 instances in 3 apps; by status: UP 3, OUT_OF_SERVICE 1, UNKNOWN 1.",
        "<h2>HELLO (2 instances)</h2>",
        "<h2>WORLD (1 instances)</h2>",
        "<td>hello-1</td><td class=\"ok\">UP</td><td class=\"muted\">none</td>",
        "<td>hello-2</td><td class=\"warn\">OUT_OF_SERVICE (reports UP)</td><td class=\"warn\">OUT_OF_SERVICE</td>",
        "<td>127.0.0.1:8083</td><td>world</td>",
        "<td>evil-2</td><td class=\"warn\">UNKNOWN</td><td class=\"muted\">none</td>",
        "<td class=\"w\">kept=yes</td>",
        "No peers: this registry replicates with nobody",
        "<th>authentication (--eureka-auth)</th><td>off</td>",
        "<th>self-preservation</th><td class=\"ok\">off: eviction runs</td>",
    ] {
        assert!(
            dom.contains(shown),
            "the page does not show {shown:?}:\n{dom}"
        );
    }
    // The hostile text is on the page as text (a `<` in text is written `&lt;` by the
    // browser's serialiser; a quote is not escaped there), and made no element.
    for text in [
        "<td class=\"w\">\"&gt;&lt;img/src=x/onerror=alert(1)&gt;&lt;script&gt;alert(2)&lt;/script&gt;</td>",
        "note=&lt;script&gt;alert(3)&lt;/script&gt;",
        "zone=\"&gt;&lt;img src=x onerror=alert(4)&gt;",
        "<td class=\"w\">javascript:alert(5)</td>",
    ] {
        assert!(
            dom.contains(text),
            "the page does not show {text:?} as text:\n{dom}"
        );
    }
    assert!(!dom.contains("left-out"), "{dom}");
    assert_no_element_from_data(&dom);
    // And what the browser was told: HTML, under a policy that runs no script at all.
    assert_html_without_script(&get(control.eureka_addr(), "/", None));

    // One app's page.
    let hello = get(control.eureka_addr(), "/?app=hello", None);
    assert_html_without_script(&hello);
    let hello = hello.text();
    assert!(hello.contains("Only app HELLO."), "{hello}");
    assert!(
        hello.contains("hello-2") && !hello.contains("world-1"),
        "{hello}"
    );

    let png = chromium.screenshot(&env, "registry-page", &url);
    println!(
        "screenshot of the registry's status page: {}",
        png.display()
    );
}

#[test]
fn the_registry_status_page_shows_each_peer_replicating_then_failing_when_it_is_gone() {
    let chromium = Chromium::find();
    let env = TestEnv::new("dashboards_registry_page_peers");
    let addrs = reserve_addrs(2);
    let node = |label: &str, own: usize, other: usize| {
        let source = Source::Peer {
            addr: addrs[own],
            peers: vec![eureka_url(addrs[other])],
        };
        ControlPlane::start_source(&env, label, source, &["--registry-warmup", "0"])
    };
    let a = node("node-a", 0, 1);
    let mut b = node("node-b", 1, 0);
    let (peer_b, page_of_a) = (eureka_url(addrs[1]), |path: &str| {
        let page = get(addrs[0], path, None);
        assert_html_without_script(&page);
        page.text()
    });
    EurekaApi::new(addrs[0]).register("HELLO", "hello-1", 8081);
    wait_until(DEADLINE, "B to hold hello-1", || {
        EurekaApi::new(addrs[1]).instances().contains_key("hello-1")
    });
    wait_until(DEADLINE, "A's page to show B replicating", || {
        let page = page_of_a("/");
        // B's row: replicating, nothing queued, and a last success some seconds ago (no
        // exact age: the page may be read any time after).
        let start = format!(
            "<td class=\"w\">{peer_b}</td><td class=\"ok\">replicating</td><td class=\"n\">0</td>"
        );
        page.find(&start).is_some_and(|at| {
            let row = &page[at..];
            let row = &row[..row.find("</tr>").unwrap_or(row.len())];
            row.contains("<td class=\"n\">0</td><td>") && row.contains(" s ago</td>")
        })
    });

    b.kill();
    EurekaApi::new(addrs[0]).register("HELLO", "hello-2", 8082);
    wait_until(
        DEADLINE,
        "A's page to show B failing, with the write queued",
        || {
            let page = page_of_a("/");
            page.contains(&format!(
                "<td class=\"w\">{peer_b}</td><td class=\"bad\">failing</td><td class=\"n\">1</td>"
            )) && page.contains(&format!("<td class=\"w\">{peer_b}/peerreplication/batch"))
        },
    );
    let url = format!("http://{}/", addrs[0]);
    let dom = chromium.dump_dom(&env, "registry-page-peers", &url);
    assert!(dom.contains("<h2>Peers (DS replicas)</h2>"), "{dom}");
    assert!(dom.contains("<td class=\"bad\">failing</td>"), "{dom}");
    assert_no_element_from_data(&dom);
    let png = chromium.screenshot(&env, "registry-page-peers", &url);
    println!(
        "screenshot of a registry's page with a peer gone: {}",
        png.display()
    );
    drop(a);
}

/// A tokens file: a client that may register HELLO, and an operator.
const TOKENS: &str = "identities:
  - name: hello
    token: hello-token-0123456789
  - name: '<b>evil</b>'
    token: evil-token-0123456789
    apps: [EVIL]
    vips: [evil]
  - name: ops
    token: ops-token-0123456789abc
    operator: true
";

#[test]
fn with_eureka_auth_the_status_page_asks_for_the_credentials_get_apps_asks_for() {
    let env = TestEnv::new("dashboards_registry_page_auth");
    let tokens = env.write_file("tokens.yaml", TOKENS);
    let tokens = tokens.to_string_lossy().into_owned();
    let control = ControlPlane::start_source(
        &env,
        "control",
        Source::ServeEureka,
        &["--eureka-auth", &tokens, "--registry-warmup", "0"],
    );
    let addr = control.eureka_addr();
    let hello = "Bearer hello-token-0123456789";
    let api = EurekaApi::new(addr);
    let answer = post(
        &api,
        "HELLO",
        registration("HELLO", "hello-1", json!({})),
        Some(hello),
    );
    assert_eq!(answer.status, 204, "{}", answer.text());

    // An identity named with markup: its name is shown as text.
    let evil = "Bearer evil-token-0123456789";
    let answer = post(
        &api,
        "EVIL",
        registration("EVIL", "evil-1", json!({})),
        Some(evil),
    );
    assert_eq!(answer.status, 204, "{}", answer.text());

    // Refused as `GET /apps` is: 401, the same answer, the same challenge.
    for authorization in [None, Some("Bearer wrong-token-0123456789")] {
        let apps = get(addr, "/eureka/apps", authorization);
        let page = get(addr, "/", authorization);
        assert_eq!(apps.status, 401, "{}", apps.text());
        assert_eq!(page.status, 401, "{}", page.text());
        assert_eq!(page.text(), apps.text());
        assert_eq!(
            page.header("www-authenticate"),
            apps.header("www-authenticate")
        );
        assert!(!page.text().contains("hello-1"));
    }
    // With an identity's credentials, Bearer or Basic, it is the page.
    let basic = "Basic aGVsbG86aGVsbG8tdG9rZW4tMDEyMzQ1Njc4OQ==";
    for authorization in [hello, basic, "Bearer ops-token-0123456789abc"] {
        assert_eq!(get(addr, "/eureka/apps", Some(authorization)).status, 200);
        let page = get(addr, "/", Some(authorization));
        assert_html_without_script(&page);
        let page = page.text();
        assert!(
            page.contains("<th>authentication (--eureka-auth)</th><td>on</td>"),
            "{page}"
        );
        // The instance, and the identity that registered it.
        assert!(page.contains("<td>hello-1</td>"), "{page}");
        assert!(page.contains("<td>1 min 30 s</td><td>hello</td>"), "{page}");
        assert!(
            page.contains("<td>1 min 30 s</td><td>&lt;b&gt;evil&lt;/b&gt;</td>"),
            "{page}"
        );
        assert!(!page.contains("<b>"), "{page}");
    }
    // Read-only: nothing but GET.
    for method in ["POST", "PUT", "DELETE"] {
        let answer = Request::new(method, "/")
            .host(&addr.to_string())
            .header("authorization", hello)
            .send(addr);
        assert_eq!(answer.status, 405, "{method}: {}", answer.text());
    }
}

#[test]
fn the_mesh_dashboard_shows_each_connected_proxy_and_the_clusters_it_holds() {
    let chromium = Chromium::find();
    let env = TestEnv::new("dashboards_mesh");
    let control = ControlPlane::start_source(
        &env,
        "control",
        Source::ServeEureka,
        &["--registry-warmup", "0"],
    );
    // The shipped bootstrap, but for its node id: markup (the page shows what a proxy says
    // it is).
    let bootstrap = odmesh_bootstrap(control.xds().port())
        .replace("  id: odmesh-local\n", &format!("  id: '{HOSTILE_NODE}'\n"));
    assert!(bootstrap.contains(HOSTILE_NODE));
    let envoy = Envoy::start(&env, "envoy", &bootstrap);
    envoy.wait_xds_connected(true, DEADLINE);
    let hello = || {
        let egress = envoy.listener(EGRESS_LISTENER);
        Request::get("/").host("hello").send(egress).status
    };
    let upstream = EchoUpstream::start("hello");
    let api = EurekaApi::new(control.eureka_addr());
    api.register("HELLO", "hello-1", upstream.port());
    wait_until(DEADLINE, "hello to route", || hello() == 200);
    wait_until(DEADLINE, "the proxy to hold hello.vip", || {
        (control.subscribed_clusters()).contains(&"hello.vip".to_owned())
    });
    let proxy = control.proxies().remove(0);
    assert_eq!(proxy["node_id"], HOSTILE_NODE);
    let service = proxy["node_cluster"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    // Its proxy's load reports (every second here) put hello.vip, which carries requests, in
    // its service's history.
    wait_until(
        DEADLINE,
        "the service's prewarm history to hold hello.vip",
        || {
            assert_eq!(hello(), 200);
            let predicted = &control.prewarm()["services"][&service]["predicted"];
            predicted.as_array().is_some_and(|p| !p.is_empty())
        },
    );

    let url = format!("http://{}/", control.admin());
    let dom = chromium.dump_dom(&env, "mesh-dashboard", &url);
    for shown in [
        "<h1>odmesh control plane</h1>".to_owned(),
        "<td>embedded Eureka registry</td>".to_owned(),
        "<h2>Connected proxies (1)</h2>".to_owned(),
        format!("<td class=\"w\">{HOSTILE_NODE_SHOWN}</td><td>{service}</td><td>127.0.0.1</td>"),
        "<td class=\"w\">hello.vip</td>".to_owned(),
        // The first request's answer, at least, timed.
        "<th>answer time percentiles</th><td>p50 ".to_owned(),
        " answers)</td>".to_owned(),
        // The service in prewarm's table, hello.vip predicted for it.
        format!("<td>{service}</td><td class=\"n\">1</td>"),
        "No policy file (--policy)".to_owned(),
    ] {
        assert!(
            dom.contains(&shown),
            "the dashboard does not show {shown:?}:\n{dom}"
        );
    }
    assert!(
        !dom.contains("<th>responses accepted (ACK)</th><td class=\"n\">0</td>"),
        "{dom}"
    );
    assert_no_element_from_data(&dom);
    assert_html_without_script(&get(control.admin(), "/", None));

    let png = chromium.screenshot(&env, "mesh-dashboard", &url);
    println!("screenshot of the mesh dashboard: {}", png.display());
}
