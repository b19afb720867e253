//! The embedded registry's REST API, driven through its router without sockets, on a clock
//! that follows tokio's, so that lease expiry runs on paused time and every timestamp is
//! exact.

use super::*;
use crate::server::auth::Authenticator;
use crate::server::ledger::MAX_CLOCK_AHEAD;
use crate::server::policy::RegistrationLimits;
use crate::server::preservation::PreservationConfig;
use crate::testdata::count;
use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use http_body_util::BodyExt;
use odmesh_base::testing::wait_until;
use serde_json::{Value, json};
use tower::ServiceExt;

struct Fixture {
    eureka: EurekaRegistry,
    rx: watch::Receiver<Arc<Registry>>,
    registry_metrics: Arc<RegistryMetrics>,
    metrics: Arc<ServerMetrics>,
    publisher: tokio::task::JoinHandle<()>,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        self.publisher.abort();
    }
}

/// A registry on one machine (the registrations below are at 127.0.0.1), complete at once
/// (no warm-up) unless a test says otherwise.
fn config() -> ServerConfig {
    ServerConfig {
        warmup: Duration::ZERO,
        ..ServerConfig::local()
    }
}

fn fixture() -> Fixture {
    fixture_with(config())
}

/// The wall clock's reading when a fixture starts, in ms since the epoch (2027).
const T0: u64 = 1_800_000_000_000;

fn fixture_with(config: ServerConfig) -> Fixture {
    let registry_metrics = Arc::new(RegistryMetrics::default());
    let metrics = Arc::new(ServerMetrics::default());
    let (tx, rx) = watch::channel(Arc::new(Registry::default()));
    let clock = Clock::following_tokio(T0);
    let (shared, own) = (registry_metrics.clone(), metrics.clone());
    let eureka = EurekaRegistry::with_clock(config, clock, tx, shared, own);
    let publisher = tokio::spawn(eureka.clone().run_publisher());
    Fixture {
        eureka,
        rx,
        registry_metrics,
        metrics,
        publisher,
    }
}

/// A response's status, content type and body.
struct Answer {
    status: StatusCode,
    content_type: String,
    body: String,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
}

impl Fixture {
    async fn call(&self, method: Method, uri: &str, accept: &str, body: Option<Value>) -> Answer {
        let mut req = Request::builder().method(method).uri(uri);
        if !accept.is_empty() {
            req = req.header(header::ACCEPT, accept);
        }
        let body = match body {
            Some(v) => {
                req = req.header(header::CONTENT_TYPE, "application/json");
                Body::from(v.to_string())
            }
            None => Body::empty(),
        };
        self.answer(req.body(body).unwrap(), header::CONTENT_TYPE)
            .await
    }

    /// `req` through the router: the status, the value of the answer's header `shown`, and
    /// the body.
    async fn answer(&self, req: Request<Body>, shown: header::HeaderName) -> Answer {
        let resp = self.eureka.router().oneshot(req).await.unwrap();
        let status = resp.status();
        let content_type = resp
            .headers()
            .get(shown)
            .map(|v| v.to_str().unwrap().to_owned())
            .unwrap_or_default();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        Answer {
            status,
            content_type,
            body: String::from_utf8_lossy(&bytes).into_owned(),
        }
    }

    async fn get_json(&self, uri: &str) -> Answer {
        self.call(Method::GET, uri, "application/json", None).await
    }

    async fn send(&self, method: Method, uri: &str) -> StatusCode {
        self.call(method, uri, "", None).await.status
    }

    /// A heartbeat from each of `ids`, instances of app HELLO.
    async fn renew(&self, ids: &[String]) {
        for id in ids {
            self.send(Method::PUT, &format!("/eureka/apps/HELLO/{id}"))
                .await;
        }
    }

    async fn register(&self, app: &str, instance: Value) -> StatusCode {
        self.call(
            Method::POST,
            &format!("/eureka/apps/{app}"),
            "",
            Some(json!({ "instance": instance })),
        )
        .await
        .status
    }

    /// The registry the mesh has, once every change made so far is published.
    async fn published(&self) -> Arc<Registry> {
        let wait = tokio::time::timeout(Duration::from_secs(10), self.eureka.published());
        wait.await.expect("changes published within 10 s");
        self.rx.borrow().clone()
    }

    async fn status_of(&self, id: &str) -> Option<Status> {
        self.published()
            .await
            .instances()
            .find(|i| &*i.instance_id == id)
            .map(|i| i.status)
    }
}

/// A registration as Eureka clients send it.
fn instance(id: &str, app: &str, vip: &str, port: u16) -> Value {
    json!({
        "instanceId": id,
        "hostName": "localhost",
        "app": app,
        "ipAddr": "127.0.0.1",
        "status": "UP",
        "overriddenstatus": "UNKNOWN",
        "port": {"$": port, "@enabled": "true"},
        "securePort": {"$": 443, "@enabled": "false"},
        "countryId": 1,
        "dataCenterInfo": {"@class": "com.netflix.appinfo.InstanceInfo$DefaultDataCenterInfo", "name": "MyOwn"},
        "leaseInfo": {"renewalIntervalInSecs": 30, "durationInSecs": 90},
        "metadata": {"version": "1"},
        "vipAddress": vip,
        "secureVipAddress": vip,
        "isCoordinatingDiscoveryServer": "false",
        "lastUpdatedTimestamp": "1700000000000",
        "lastDirtyTimestamp": "1700000000000"
    })
}

#[tokio::test]
async fn a_registration_is_answered_204_and_published_at_once() {
    let f = fixture();
    assert!(f.eureka.health().is_loaded(), "an empty registry is loaded");
    let status = f
        .register(
            "hello",
            instance("h1", "HELLO", "hello,hello.internal", 8080),
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);

    let reg = f.published().await;
    assert_eq!(reg.len(), 1);
    let inst = &reg.instances().next().unwrap();
    assert_eq!(&*inst.app, "HELLO");
    assert_eq!(&*inst.instance_id, "h1");
    assert_eq!(inst.port, Some(8080));
    assert_eq!(inst.vips, ["hello", "hello.internal"].map(Arc::<str>::from));
    assert_eq!(inst.status, Status::Up);
    assert_eq!(
        f.metrics
            .eureka_registrations_total
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
}

#[tokio::test]
async fn a_registration_declares_its_protocol_in_metadata() {
    let f = fixture();
    let mut body = instance("h1", "HELLO", "hello", 8080);
    body["metadata"] = json!({"odmesh.protocol": "http2"});
    assert_eq!(f.register("hello", body).await, StatusCode::NO_CONTENT);
    let reg = f.published().await;
    let protocol = reg.instances().next().unwrap().protocol;
    assert_eq!(protocol, odmesh_registry::Protocol::Http2);
    // And it reads back as registered, for the clients that fetch it.
    let back = f.get_json("/eureka/apps/HELLO/h1").await.json();
    assert_eq!(back["instance"]["metadata"]["odmesh.protocol"], "http2");
}

#[tokio::test]
async fn app_names_are_case_insensitive_and_stored_uppercase() {
    let f = fixture();
    f.register("Hello", instance("h1", "hello", "hello", 8080))
        .await;
    let a = f.get_json("/eureka/apps/HELLO/h1").await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.json()["instance"]["app"], "HELLO");
    assert_eq!(
        f.get_json("/eureka/apps/hello").await.json()["application"]["name"],
        "HELLO"
    );
    assert_eq!(
        f.send(Method::PUT, "/eureka/apps/hElLo/h1").await,
        StatusCode::OK
    );
}

#[tokio::test]
async fn a_registration_for_another_app_than_the_path_is_refused() {
    let f = fixture();
    let status = f
        .register("OTHER", instance("h1", "HELLO", "hello", 8080))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let mut no_ip = instance("h1", "HELLO", "hello", 8080);
    no_ip.as_object_mut().unwrap().remove("ipAddr");
    assert_eq!(f.register("HELLO", no_ip).await, StatusCode::BAD_REQUEST);
    assert!(f.published().await.is_empty());
}

#[tokio::test]
async fn a_bare_registration_gets_a_host_name_a_data_center_and_a_lease() {
    let f = fixture();
    let bare = json!({"instanceId": "b1", "ipAddr": "10.0.0.1", "port": 80, "vipAddress": "bare"});
    assert_eq!(f.register("bare", bare).await, StatusCode::NO_CONTENT);
    let inst = f.get_json("/eureka/apps/BARE/b1").await.json();
    let inst = &inst["instance"];
    assert_eq!(inst["hostName"], "10.0.0.1");
    assert_eq!(inst["dataCenterInfo"]["name"], "MyOwn");
    assert_eq!(inst["status"], "UP");
    assert_eq!(inst["overriddenStatus"], "UNKNOWN");
    assert_eq!(inst["leaseInfo"]["durationInSecs"], 90);
    assert!(inst["leaseInfo"]["registrationTimestamp"].as_u64().unwrap() > 0);
    assert!(
        inst["lastUpdatedTimestamp"]
            .as_str()
            .unwrap()
            .parse::<u64>()
            .unwrap()
            > 0
    );
}

#[tokio::test]
async fn an_xml_registration_is_taken_as_eurekas_server_takes_it() {
    let f = fixture();
    // As Netflix's XStream codec writes an instance.
    let xml = r#"<instance>
      <instanceId>h1</instanceId><hostName>localhost</hostName><app>HELLO</app>
      <ipAddr>127.0.0.1</ipAddr><status>UP</status><overriddenstatus>UNKNOWN</overriddenstatus>
      <port enabled="true">8080</port><securePort enabled="false">443</securePort>
      <countryId>1</countryId>
      <dataCenterInfo class="com.netflix.appinfo.InstanceInfo$DefaultDataCenterInfo"><name>MyOwn</name></dataCenterInfo>
      <leaseInfo><renewalIntervalInSecs>30</renewalIntervalInSecs><durationInSecs>90</durationInSecs></leaseInfo>
      <metadata><zone>z1</zone></metadata>
      <vipAddress>hello</vipAddress><secureVipAddress>hello</secureVipAddress>
      <isCoordinatingDiscoveryServer>false</isCoordinatingDiscoveryServer>
      <lastDirtyTimestamp>1700000000000</lastDirtyTimestamp><unknownThing>x</unknownThing>
    </instance>"#;
    let answer = f
        .raw(
            Method::POST,
            "/eureka/apps/HELLO",
            "application/xml",
            None,
            xml,
        )
        .await;
    assert_eq!(answer.status, StatusCode::NO_CONTENT, "{}", answer.body);
    let served = f.get_json("/eureka/apps/HELLO/h1").await.json();
    let inst = &served["instance"];
    assert_eq!(inst["port"], json!({"$": 8080, "@enabled": "true"}));
    assert_eq!(inst["vipAddress"], "hello");
    assert_eq!(inst["metadata"], json!({"zone": "z1"}));
    assert_eq!(inst["lastDirtyTimestamp"], "1700000000000");
    assert!(inst.get("unknownThing").is_none());
    let reg = f.published().await;
    assert_eq!(reg.instances().count(), 1);

    // What is not a registration, in either language, says so; a web page's POST is 415.
    let bad = f
        .raw(
            Method::POST,
            "/eureka/apps/HELLO",
            "application/xml",
            None,
            "<apps/>",
        )
        .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    assert!(bad.body.contains("<instance>"), "{}", bad.body);
    let form = f
        .raw(Method::POST, "/eureka/apps/HELLO", "text/plain", None, xml)
        .await;
    assert_eq!(form.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
}

#[tokio::test]
async fn a_heartbeat_for_an_unknown_instance_is_answered_404_so_the_client_registers_again() {
    let f = fixture();
    assert_eq!(
        f.send(Method::PUT, "/eureka/apps/HELLO/nope").await,
        StatusCode::NOT_FOUND
    );
    f.register("HELLO", instance("h1", "HELLO", "hello", 8080))
        .await;
    assert_eq!(
        f.send(Method::PUT, "/eureka/apps/HELLO/nope").await,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        f.send(
            Method::PUT,
            "/eureka/apps/HELLO/h1?status=UP&lastDirtyTimestamp=1700000000000"
        )
        .await,
        StatusCode::OK
    );
}

#[tokio::test]
async fn a_registration_as_the_spring_client_writes_it_is_taken() {
    // Spring Cloud's client writes its instance with Jackson: numbers for timestamps, a
    // boolean, explicit nulls, and `overriddenstatus` spelled both ways.
    let f = fixture();
    let spring = json!({
        "instanceId": "host:hello:8080", "app": "HELLO", "appGroupName": null,
        "ipAddr": "127.0.0.1", "sid": "na", "homePageUrl": "http://127.0.0.1:8080/",
        "statusPageUrl": "http://127.0.0.1:8080/actuator/info",
        "healthCheckUrl": "http://127.0.0.1:8080/actuator/health",
        "secureHealthCheckUrl": null, "vipAddress": "hello", "secureVipAddress": "hello",
        "countryId": 1,
        "dataCenterInfo": {"@class": "com.netflix.appinfo.InstanceInfo$DefaultDataCenterInfo", "name": "MyOwn"},
        "hostName": "127.0.0.1", "status": "UP", "overriddenStatus": "UNKNOWN",
        "overriddenstatus": "UNKNOWN",
        "leaseInfo": {"renewalIntervalInSecs": 30, "durationInSecs": 90, "registrationTimestamp": 0,
                      "lastRenewalTimestamp": 0, "evictionTimestamp": 0, "serviceUpTimestamp": 0},
        "isCoordinatingDiscoveryServer": false, "lastUpdatedTimestamp": 1_700_000_000_000u64,
        "lastDirtyTimestamp": 1_700_000_000_000u64, "actionType": null, "asgName": null,
        "port": {"$": 8080, "@enabled": "true"}, "securePort": {"$": 443, "@enabled": "false"},
        "metadata": {"management.port": "8080"},
    });
    let answer = f.try_register("HELLO", spring).await;
    assert_eq!(answer.status, StatusCode::NO_CONTENT, "{}", answer.body);
    let served = f
        .get_json("/eureka/apps/HELLO/host:hello:8080")
        .await
        .json();
    assert_eq!(served["instance"]["lastDirtyTimestamp"], "1700000000000");
    assert_eq!(served["instance"]["isCoordinatingDiscoveryServer"], "false");
}

#[tokio::test]
async fn a_write_to_an_unknown_instance_is_answered_404_without_a_body() {
    // Eureka's Jersey client reads the body of a heartbeat's 404 as an instance: with a
    // body it fails, and never registers again.
    let f = fixture();
    for (method, uri) in [
        (Method::PUT, "/eureka/apps/HELLO/nope"),
        (
            Method::PUT,
            "/eureka/apps/HELLO/nope?status=UP&lastDirtyTimestamp=1",
        ),
        (Method::DELETE, "/eureka/apps/HELLO/nope"),
        (
            Method::PUT,
            "/eureka/apps/HELLO/nope/status?value=OUT_OF_SERVICE",
        ),
    ] {
        let answer = f.call(method.clone(), uri, "application/json", None).await;
        assert_eq!(
            (answer.status, answer.body.as_str()),
            (StatusCode::NOT_FOUND, ""),
            "{method} {uri}"
        );
    }
    f.register("HELLO", instance("h1", "HELLO", "hello", 8080))
        .await;
    let newer = (f.call(
        Method::PUT,
        "/eureka/apps/HELLO/h1?lastDirtyTimestamp=1700000009999",
        "application/json",
        None,
    ))
    .await;
    assert_eq!(
        (newer.status, newer.body.as_str()),
        (StatusCode::NOT_FOUND, "")
    );
}

#[tokio::test]
async fn a_registration_is_written_back_with_eurekas_fields_only_in_the_form_its_readers_take() {
    // Eureka's Spring client fails a whole /apps on one field it does not know, its Jersey
    // client on an unknown field holding an object, both on a data center class they do not
    // know or a port without @enabled.
    let f = fixture();
    let mut odd = instance("h1", "HELLO", "hello", 8080);
    odd["somethingNew"] = json!({"nested": [1, 2]});
    odd["flag"] = json!("x");
    odd["port"] = json!({"$": "8080"});
    odd["dataCenterInfo"] = json!({"@class": "com.amazonaws.appinfo.AmazonInfo", "name": "MyOwn", "metadata": {"a": "b"}});
    odd["leaseInfo"]["extra"] = json!({"x": 1});
    f.register("HELLO", odd).await;
    let known = [
        "instanceId",
        "app",
        "appGroupName",
        "ipAddr",
        "sid",
        "port",
        "securePort",
        "homePageUrl",
        "statusPageUrl",
        "healthCheckUrl",
        "secureHealthCheckUrl",
        "vipAddress",
        "secureVipAddress",
        "countryId",
        "dataCenterInfo",
        "hostName",
        "status",
        "overriddenstatus",
        "overriddenStatus",
        "leaseInfo",
        "isCoordinatingDiscoveryServer",
        "metadata",
        "lastUpdatedTimestamp",
        "lastDirtyTimestamp",
        "actionType",
        "asgName",
    ];
    let lease_fields = [
        "renewalIntervalInSecs",
        "durationInSecs",
        "registrationTimestamp",
        "lastRenewalTimestamp",
        "renewalTimestamp",
        "evictionTimestamp",
        "serviceUpTimestamp",
    ];
    for uri in ["/eureka/apps", "/eureka/apps/delta"] {
        let doc = f.get_json(uri).await.json();
        let inst = &doc["applications"]["application"][0]["instance"][0];
        for key in inst.as_object().expect("an instance").keys() {
            assert!(known.contains(&key.as_str()), "{uri}: {key} in {inst}");
        }
        for key in inst["leaseInfo"].as_object().expect("a lease").keys() {
            assert!(
                lease_fields.contains(&key.as_str()),
                "{uri}: leaseInfo.{key}"
            );
        }
        assert_eq!(
            inst["dataCenterInfo"],
            json!({"@class": "com.netflix.appinfo.InstanceInfo$DefaultDataCenterInfo", "name": "MyOwn"}),
            "{uri}"
        );
        assert_eq!(
            inst["port"],
            json!({"$": 8080, "@enabled": "true"}),
            "{uri}"
        );
        assert_eq!(inst["securePort"]["@enabled"], "false", "{uri}");
        assert!(
            inst["leaseInfo"]["durationInSecs"].as_u64().is_some(),
            "{uri}"
        );
        assert!(doc["applications"]["apps__hashcode"].is_string(), "{uri}");
        assert!(doc["applications"]["versions__delta"].is_string(), "{uri}");
    }
}

#[tokio::test]
async fn a_heartbeat_with_a_newer_dirty_timestamp_asks_the_client_to_register_again() {
    let f = fixture();
    f.register("HELLO", instance("h1", "HELLO", "hello", 8080))
        .await;
    let status = f
        .send(
            Method::PUT,
            "/eureka/apps/HELLO/h1?lastDirtyTimestamp=1700000009999",
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let older = f
        .send(
            Method::PUT,
            "/eureka/apps/HELLO/h1?lastDirtyTimestamp=1600000000000",
        )
        .await;
    assert_eq!(older, StatusCode::OK);
}

#[tokio::test(start_paused = true)]
async fn a_registration_dated_ahead_wins_for_a_minute_at_most_and_an_older_one_is_answered_409() {
    let f = fixture();
    let year = 365 * 86_400_000;
    let mut ahead = instance("h1", "HELLO", "hello", 8080);
    ahead["lastDirtyTimestamp"] = json!((T0 + year).to_string());
    assert_eq!(f.register("HELLO", ahead).await, StatusCode::NO_CONTENT);
    // The instance's registration a moment later, by the server's clock, is older than the
    // one dated ahead as it was taken (now + MAX_CLOCK_AHEAD): kept, and the client told.
    tokio::time::advance(Duration::from_secs(1)).await;
    let mut current = instance("h1", "HELLO", "hello", 8081);
    current["lastDirtyTimestamp"] = json!((T0 + 1_000).to_string());
    let older = f.register("HELLO", current.clone()).await;
    assert_eq!(older, StatusCode::CONFLICT);
    assert_eq!(count(&f.metrics.eureka_registrations_older_total), 1);
    // A heartbeat still dated ahead renews: it is not sent to register again, in a loop.
    let uri = format!("/eureka/apps/HELLO/h1?lastDirtyTimestamp={}", T0 + year);
    assert_eq!(f.send(Method::PUT, &uri).await, StatusCode::OK);
    // A minute on, a registration by the server's clock wins.
    tokio::time::advance(MAX_CLOCK_AHEAD).await;
    current["lastDirtyTimestamp"] = json!((T0 + 62_000).to_string());
    assert_eq!(f.register("HELLO", current).await, StatusCode::NO_CONTENT);
    let port = (f.published().await.instances())
        .find(|i| &*i.instance_id == "h1")
        .and_then(|i| i.port);
    assert_eq!(port, Some(8081));
}

#[tokio::test]
async fn cancel_removes_the_instance_and_its_vip() {
    let f = fixture();
    f.register("HELLO", instance("h1", "HELLO", "hello", 8080))
        .await;
    f.register("HELLO", instance("h2", "HELLO", "hello", 8081))
        .await;
    assert_eq!(
        f.send(Method::DELETE, "/eureka/apps/HELLO/h1").await,
        StatusCode::OK
    );
    let ids: Vec<_> = f
        .published()
        .await
        .instances()
        .map(|i| i.instance_id.to_string())
        .collect();
    assert_eq!(ids, ["h2"]);
    assert_eq!(
        f.send(Method::DELETE, "/eureka/apps/HELLO/h1").await,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        f.send(Method::DELETE, "/eureka/apps/HELLO/h2").await,
        StatusCode::OK
    );
    assert!(f.published().await.is_empty());
    assert_eq!(
        f.get_json("/eureka/vips/hello").await.status,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn an_out_of_service_override_drains_the_instance_and_deleting_it_restores_up() {
    let f = fixture();
    f.register("HELLO", instance("h1", "HELLO", "hello", 8080))
        .await;
    let st = f
        .send(
            Method::PUT,
            "/eureka/apps/HELLO/h1/status?value=OUT_OF_SERVICE&lastDirtyTimestamp=1",
        )
        .await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(f.status_of("h1").await, Some(Status::OutOfService));
    let json = f.get_json("/eureka/apps/HELLO/h1").await.json();
    assert_eq!(json["instance"]["status"], "OUT_OF_SERVICE");
    assert_eq!(json["instance"]["overriddenStatus"], "OUT_OF_SERVICE");

    // The override survives heartbeats and a new registration reporting UP.
    assert_eq!(
        f.send(Method::PUT, "/eureka/apps/HELLO/h1?status=UP").await,
        StatusCode::OK
    );
    f.register("HELLO", instance("h1", "HELLO", "hello", 8080))
        .await;
    assert_eq!(f.status_of("h1").await, Some(Status::OutOfService));

    assert_eq!(
        f.send(Method::DELETE, "/eureka/apps/HELLO/h1/status").await,
        StatusCode::OK
    );
    assert_eq!(f.status_of("h1").await, Some(Status::Up));
    assert_eq!(
        f.get_json("/eureka/apps/HELLO/h1").await.json()["instance"]["overriddenStatus"],
        "UNKNOWN"
    );
}

#[tokio::test]
async fn a_status_update_needs_a_known_instance_and_a_valid_value() {
    let f = fixture();
    assert_eq!(
        f.send(
            Method::PUT,
            "/eureka/apps/HELLO/h1/status?value=OUT_OF_SERVICE"
        )
        .await,
        StatusCode::NOT_FOUND
    );
    f.register("HELLO", instance("h1", "HELLO", "hello", 8080))
        .await;
    assert_eq!(
        f.send(Method::PUT, "/eureka/apps/HELLO/h1/status?value=SLEEPY")
            .await,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        f.send(Method::PUT, "/eureka/apps/HELLO/h1/status").await,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        f.send(Method::DELETE, "/eureka/apps/HELLO/zz/status").await,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn an_instance_that_reports_down_stays_down_under_an_up_override() {
    let f = fixture();
    let mut down = instance("h1", "HELLO", "hello", 8080);
    down["status"] = json!("DOWN");
    f.register("HELLO", down).await;
    f.send(Method::PUT, "/eureka/apps/HELLO/h1/status?value=UP")
        .await;
    assert_eq!(f.status_of("h1").await, Some(Status::Down));
}

#[tokio::test]
async fn an_instance_that_reports_unknown_stays_unknown_under_an_up_override() {
    let f = fixture();
    let mut unknown = instance("h1", "HELLO", "hello", 8080);
    unknown["status"] = json!("UNKNOWN");
    f.register("HELLO", unknown).await;
    f.send(Method::PUT, "/eureka/apps/HELLO/h1/status?value=UP")
        .await;
    assert_eq!(f.status_of("h1").await, Some(Status::Unknown));
    let served = f.get_json("/eureka/apps/HELLO/h1").await.json();
    assert_eq!(served["instance"]["status"], "UNKNOWN");
    assert_eq!(served["instance"]["overriddenStatus"], "UP");
}

#[tokio::test]
async fn metadata_updates_merge_into_the_instance() {
    let f = fixture();
    f.register("HELLO", instance("h1", "HELLO", "hello", 8080))
        .await;
    assert_eq!(
        f.send(
            Method::PUT,
            "/eureka/apps/HELLO/h1/metadata?zone=zone-a&owner=team"
        )
        .await,
        StatusCode::OK
    );
    let json = f.get_json("/eureka/apps/HELLO/h1").await.json();
    assert_eq!(
        json["instance"]["metadata"],
        json!({"version": "1", "zone": "zone-a", "owner": "team"})
    );
    assert_eq!(
        f.published()
            .await
            .instances()
            .next()
            .unwrap()
            .zone
            .as_deref(),
        Some("zone-a")
    );
    assert_eq!(
        f.send(Method::PUT, "/eureka/apps/HELLO/nope/metadata?a=b")
            .await,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn the_read_side_answers_json_when_asked_and_xml_otherwise() {
    let f = fixture();
    f.register("HELLO", instance("h1", "HELLO", "hello", 8080))
        .await;
    let mut other = instance("g1", "GREETER", "greeter", 9090);
    other["secureVipAddress"] = json!("greeter-secure");
    other["securePort"] = json!({"$": 9443, "@enabled": "true"});
    f.register("GREETER", other).await;

    let apps = f.get_json("/eureka/apps").await;
    assert_eq!(apps.content_type, "application/json");
    let apps = apps.json();
    assert_eq!(apps["applications"]["apps__hashcode"], "UP_2_");
    let names: Vec<_> = apps["applications"]["application"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(names, ["GREETER", "HELLO"]);
    assert_eq!(
        apps["applications"]["application"][1]["instance"][0]["port"],
        json!({"$": 8080, "@enabled": "true"})
    );

    let xml = f.call(Method::GET, "/eureka/apps/", "*/*", None).await;
    assert_eq!(xml.status, StatusCode::OK);
    assert_eq!(xml.content_type, "application/xml");
    assert!(
        xml.body.contains("<apps__hashcode>UP_2_</apps__hashcode>"),
        "{}",
        xml.body
    );
    let xml = f.call(Method::GET, "/eureka/apps/HELLO/h1", "", None).await;
    assert!(
        xml.body.contains("<instance><instanceId>h1</instanceId>"),
        "{}",
        xml.body
    );

    let by_id = f.get_json("/eureka/instances/g1").await.json();
    assert_eq!(by_id["instance"]["app"], "GREETER");
    assert_eq!(
        f.get_json("/eureka/instances/zz").await.status,
        StatusCode::NOT_FOUND
    );

    let vip = f.get_json("/eureka/vips/HELLO").await.json();
    assert_eq!(
        vip["applications"]["application"][0]["instance"][0]["instanceId"],
        "h1"
    );
    assert_eq!(
        vip["applications"]["application"].as_array().unwrap().len(),
        1
    );
    assert_eq!(
        vip["applications"]["apps__hashcode"], "UP_2_",
        "the hash code of the whole registry"
    );
    let svip = f.get_json("/eureka/svips/greeter-secure").await.json();
    assert_eq!(svip["applications"]["application"][0]["name"], "GREETER");
    assert_eq!(
        f.get_json("/eureka/svips/nothing").await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        f.get_json("/eureka/apps/NOPE").await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        f.get_json("/eureka/apps/HELLO/zz").await.status,
        StatusCode::NOT_FOUND
    );

    // The path of some clients' defaults.
    assert_eq!(f.get_json("/eureka/v2/apps").await.status, StatusCode::OK);
}

#[tokio::test]
async fn the_delta_lists_recent_changes_with_action_types_and_the_full_hash_code() {
    let f = fixture();
    f.register("HELLO", instance("h1", "HELLO", "hello", 8080))
        .await;
    f.register("HELLO", instance("h2", "HELLO", "hello", 8081))
        .await;
    f.send(
        Method::PUT,
        "/eureka/apps/HELLO/h2/status?value=OUT_OF_SERVICE",
    )
    .await;
    f.register("GREETER", instance("g1", "GREETER", "greeter", 9090))
        .await;
    f.send(Method::DELETE, "/eureka/apps/GREETER/g1").await;

    let delta = f.get_json("/eureka/apps/delta").await.json();
    let apps = &delta["applications"];
    assert_eq!(apps["apps__hashcode"], "OUT_OF_SERVICE_1_UP_1_");
    assert_eq!(apps["versions__delta"], "5");
    let actions: Vec<(String, String)> = apps["application"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|a| a["instance"].as_array().unwrap().clone())
        .map(|i| {
            (
                i["instanceId"].as_str().unwrap().to_owned(),
                i["actionType"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        actions,
        [
            ("h1".to_owned(), "ADDED".to_owned()),
            ("h2".to_owned(), "MODIFIED".to_owned()),
            ("g1".to_owned(), "DELETED".to_owned()),
        ]
    );
    // The full document carries no action types.
    let full = f.get_json("/eureka/apps").await.json();
    assert!(
        full["applications"]["application"][0]["instance"][0]
            .get("actionType")
            .is_none()
    );
}

#[tokio::test]
async fn the_delta_keeps_one_change_per_instance_however_often_it_changes() {
    let f = fixture();
    f.register("HELLO", instance("h1", "HELLO", "hello", 8080))
        .await;
    f.register("HELLO", instance("h2", "HELLO", "hello", 8081))
        .await;
    for _ in 0..50 {
        f.register("HELLO", instance("h1", "HELLO", "hello", 8080))
            .await;
    }
    f.register("GREETER", instance("g1", "GREETER", "greeter", 9090))
        .await;
    {
        let state = f.eureka.lock();
        assert_eq!(state.delta_len(), 3, "one change per instance");
    }

    let delta = f.eureka.delta();
    assert_eq!(delta.versions_delta.as_deref(), Some("53"));
    assert_eq!(delta.apps_hashcode.as_deref(), Some("UP_3_"));
    let listed: Vec<(&str, Vec<&str>)> = delta
        .application
        .iter()
        .map(|a| {
            let ids = a.instance.iter().map(|i| i.id().unwrap()).collect();
            (a.name.as_str(), ids)
        })
        .collect();
    // By the latest change of each instance: h2, then h1, then g1.
    assert_eq!(
        listed,
        [("HELLO", vec!["h2", "h1"]), ("GREETER", vec!["g1"])]
    );
}

#[tokio::test]
async fn the_published_model_is_that_of_the_full_document() {
    let f = fixture();
    f.register("HELLO", instance("h1", "HELLO", "hello", 8080))
        .await;
    // Enabled with port 0: registered, with a warning.
    f.register("HELLO", instance("h2", "HELLO", "hello", 0))
        .await;
    f.register("GREETER", instance("g1", "GREETER", "greeter", 9090))
        .await;
    let mut state = f.eureka.lock();
    let direct = state.to_registry();
    let full = state.applications().applications().to_registry();
    // The same instances and warnings; the ledger publishes its groups in shards, in
    // another order.
    let sorted = |r: &Registry| {
        let mut all: Vec<Arc<odmesh_registry::Instance>> = r.instances().cloned().collect();
        all.sort_by(|a, b| (&a.app, &a.instance_id).cmp(&(&b.app, &b.instance_id)));
        all
    };
    assert_eq!(sorted(&direct.registry), sorted(&full.registry));
    assert_eq!(direct.warnings, full.warnings);
    assert!(direct.registry.changes_since(&full.registry).is_empty());
    assert_eq!(direct.registry.len(), 3);
    assert_eq!(direct.warnings.len(), 1, "{:?}", direct.warnings);
}

#[tokio::test(start_paused = true)]
async fn the_delta_forgets_changes_older_than_its_retention() {
    let f = fixture_with(ServerConfig {
        delta_retention: Duration::from_secs(180),
        ..config()
    });
    f.register("HELLO", instance("h1", "HELLO", "hello", 8080))
        .await;
    tokio::time::advance(Duration::from_secs(181)).await;
    let delta = f.get_json("/eureka/apps/delta").await.json();
    assert_eq!(delta["applications"]["application"], json!([]));
    assert_eq!(delta["applications"]["apps__hashcode"], "UP_1_");
    let state = f.eureka.lock();
    assert_eq!(state.delta_len(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_lease_expires_after_its_duration_without_heartbeat_and_the_instance_leaves_the_vip() {
    let f = fixture();
    let mut short = instance("h1", "HELLO", "hello", 8080);
    short["leaseInfo"]["durationInSecs"] = json!(10);
    f.register("HELLO", short).await;
    f.register("HELLO", instance("h2", "HELLO", "hello", 8081))
        .await; // 90 s

    tokio::time::advance(Duration::from_secs(8)).await;
    assert_eq!(
        f.send(Method::PUT, "/eureka/apps/HELLO/h1").await,
        StatusCode::OK
    );
    tokio::time::advance(Duration::from_secs(8)).await;
    assert_eq!(
        f.eureka.evict_expired(),
        0,
        "the heartbeat renewed the lease"
    );

    tokio::time::advance(Duration::from_secs(3)).await;
    assert_eq!(f.eureka.evict_expired(), 1);
    let ids: Vec<_> = f
        .published()
        .await
        .instances()
        .map(|i| i.instance_id.to_string())
        .collect();
    assert_eq!(ids, ["h2"]);
    assert_eq!(
        f.send(Method::PUT, "/eureka/apps/HELLO/h1").await,
        StatusCode::NOT_FOUND
    );

    let delta = f.get_json("/eureka/apps/delta").await.json();
    let h1 = delta["applications"]["application"][0]["instance"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["instanceId"] == "h1")
        .cloned()
        .unwrap();
    assert_eq!(h1["actionType"], "DELETED");
    // Registered at T0, renewed 8 s later, evicted 19 s after T0, by the registry's clock.
    let lease = &h1["leaseInfo"];
    assert_eq!(lease["registrationTimestamp"], T0);
    assert_eq!(lease["lastRenewalTimestamp"], T0 + 8_000);
    assert_eq!(lease["evictionTimestamp"], T0 + 19_000);
    assert_eq!(
        f.metrics
            .eureka_evictions_total
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
}

#[tokio::test(start_paused = true)]
async fn the_configured_lease_duration_applies_to_instances_that_do_not_say() {
    let f = fixture_with(ServerConfig {
        lease_duration: Duration::from_secs(5),
        eviction_interval: Duration::from_secs(1),
        ..config()
    });
    let mut silent = instance("h1", "HELLO", "hello", 8080);
    silent.as_object_mut().unwrap().remove("leaseInfo");
    f.register("HELLO", silent).await;
    let eviction = tokio::spawn(f.eureka.clone().run_eviction());
    let mut rx = f.rx.clone();
    tokio::time::timeout(Duration::from_secs(10), rx.wait_for(|r| r.is_empty()))
        .await
        .expect("evicted within the lease and one eviction interval")
        .unwrap();
    eviction.abort();
}

#[tokio::test]
async fn heartbeats_and_reads_do_not_publish() {
    let f = fixture();
    f.register("HELLO", instance("h1", "HELLO", "hello", 8080))
        .await;
    f.published().await;
    let mut rx = f.rx.clone();
    rx.mark_unchanged();
    f.send(Method::PUT, "/eureka/apps/HELLO/h1").await;
    f.get_json("/eureka/apps").await;
    f.get_json("/eureka/apps/delta").await;
    f.published().await;
    assert!(!rx.has_changed().unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registrations_from_many_threads_are_all_published() {
    // The publisher takes in whatever changed since its last publish, while registrations
    // go on: none may be lost.
    let f = fixture();
    std::thread::scope(|scope| {
        for t in 0..8 {
            let eureka = &f.eureka;
            scope.spawn(move || {
                for i in 0..50 {
                    let id = format!("t{t}-{i}");
                    let body = json!({ "instance": instance(&id, "HELLO", "hello", 8080) });
                    eureka
                        .register("HELLO", body.to_string().as_bytes())
                        .unwrap();
                }
            });
        }
    });
    assert_eq!(f.published().await.len(), 400);
    let m = f.registry_metrics.render();
    assert!(m.contains("odmesh_registry_instances 400"), "{m}");
}

// ---- What a client may send: type, size, names, addresses, leases, metadata ----

impl Fixture {
    /// A request with a body of `content_type` (and optional `Authorization`), answered
    /// through the router.
    async fn raw(
        &self,
        method: Method,
        uri: &str,
        content_type: &str,
        authorization: Option<&str>,
        body: impl Into<Body>,
    ) -> Answer {
        let mut req = Request::builder().method(method).uri(uri);
        if !content_type.is_empty() {
            req = req.header(header::CONTENT_TYPE, content_type);
        }
        if let Some(auth) = authorization {
            req = req.header(header::AUTHORIZATION, auth);
        }
        // `content_type` of the answer holds its WWW-Authenticate, for the 401 tests.
        self.answer(req.body(body.into()).unwrap(), header::WWW_AUTHENTICATE)
            .await
    }

    /// Registers `instance` of `app` and returns the answer; asserts that a refused
    /// registration left the registry exactly as it was.
    async fn try_register(&self, app: &str, instance: Value) -> Answer {
        let before = self.eureka.applications();
        let body = json!({ "instance": instance }).to_string();
        let uri = format!("/eureka/apps/{app}");
        let answer = self
            .raw(Method::POST, &uri, "application/json", None, body)
            .await;
        if answer.status != StatusCode::NO_CONTENT {
            assert_eq!(
                self.eureka.applications(),
                before,
                "a refusal changed the registry"
            );
        }
        answer
    }
}

#[tokio::test]
async fn a_registration_that_is_not_json_is_refused_with_415_whatever_its_body() {
    let f = fixture();
    let body = json!({ "instance": instance("h1", "HELLO", "hello", 8080) }).to_string();
    for content_type in ["text/plain", "application/x-www-form-urlencoded", ""] {
        let answer = f
            .raw(
                Method::POST,
                "/eureka/apps/HELLO",
                content_type,
                None,
                body.clone(),
            )
            .await;
        assert_eq!(
            answer.status,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "{content_type:?}"
        );
        assert!(answer.body.contains("application/json"), "{}", answer.body);
    }
    assert_eq!(count(&f.metrics.eureka_refused_body_total), 3);
    let answer = f
        .raw(
            Method::POST,
            "/eureka/apps/HELLO",
            "application/json; charset=utf-8",
            None,
            body,
        )
        .await;
    assert_eq!(answer.status, StatusCode::NO_CONTENT, "{}", answer.body);
}

#[tokio::test]
async fn a_body_over_the_limit_is_refused_with_413() {
    let f = fixture_with(ServerConfig {
        max_body: 1024,
        ..config()
    });
    let mut big = instance("h1", "HELLO", "hello", 8080);
    big["homePageUrl"] = json!("x".repeat(2000));
    let answer = f.try_register("HELLO", big).await;
    assert_eq!(answer.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(answer.body.contains("1024 bytes"), "{}", answer.body);
    assert_eq!(count(&f.metrics.eureka_refused_body_total), 1);
}

#[tokio::test]
async fn an_instance_at_a_loopback_or_link_local_address_is_refused_by_default() {
    let f = fixture_with(ServerConfig::default());
    let answer = f
        .try_register("HELLO", instance("h1", "HELLO", "hello", 8080))
        .await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST);
    assert!(
        answer.body.contains("ipAddr") && answer.body.contains("--allow-loopback-instances"),
        "{}",
        answer.body
    );
    for ip in [
        "169.254.169.254",
        "0.0.0.0",
        "::ffff:127.0.0.1",
        "224.0.0.1",
    ] {
        let mut bad = instance("h1", "HELLO", "hello", 8080);
        bad["ipAddr"] = json!(ip);
        assert_eq!(
            f.try_register("HELLO", bad).await.status,
            StatusCode::BAD_REQUEST,
            "{ip}"
        );
    }
    let mut ok = instance("h1", "HELLO", "hello", 8080);
    ok["ipAddr"] = json!("10.1.2.3");
    assert_eq!(
        f.try_register("HELLO", ok).await.status,
        StatusCode::NO_CONTENT
    );
    assert_eq!(count(&f.metrics.eureka_refused_invalid_total), 5);
}

#[tokio::test]
async fn names_out_of_bounds_are_refused_with_the_field_named() {
    let f = fixture();
    let mut bad_id = instance("h1", "HELLO", "hello", 8080);
    bad_id["instanceId"] = json!("a b/../c");
    let cases = [
        ("%20", instance("h1", "HELLO", "hello", 8080), "app"),
        ("A%20B", instance("h1", "A B", "hello", 8080), "app"),
        ("HELLO", bad_id, "instanceId"),
    ];
    for (app, body, field) in cases {
        let answer = f.try_register(app, body).await;
        assert_eq!(
            answer.status,
            StatusCode::BAD_REQUEST,
            "{app:?} {field}: {}",
            answer.body
        );
        assert!(
            answer.body.contains(&format!("`{field}`")),
            "{field}: {}",
            answer.body
        );
    }
    assert!(f.published().await.is_empty());
}

#[tokio::test]
async fn a_lease_or_metadata_out_of_bounds_is_registered_within_them_and_counted() {
    // Eureka takes any lease and any metadata, and a Java client whose registration is not
    // answered 204 never appears: the registry keeps what fits, and says what it left out.
    let f = fixture_with(ServerConfig {
        limits: RegistrationLimits {
            max_metadata_entries: 3,
            ..config().limits
        },
        ..config()
    });
    let mut eternal = instance("h1", "HELLO", "hello", 8080);
    eternal["leaseInfo"]["durationInSecs"] = json!(u64::from(u32::MAX));
    assert_eq!(
        f.try_register("HELLO", eternal).await.status,
        StatusCode::NO_CONTENT
    );
    let served = f.get_json("/eureka/apps/HELLO/h1").await.json();
    let max_lease = config().limits.max_lease.as_secs();
    assert_eq!(served["instance"]["leaseInfo"]["durationInSecs"], max_lease);
    assert_eq!(count(&f.metrics.eureka_leases_clamped_total), 1);

    let mut chatty = instance("h2", "HELLO", "hello", 8080);
    chatty["metadata"] =
        json!({"d": "4", "c": "3", "b": "2", "odmesh.protocol": "http2", "<script>": "x"});
    assert_eq!(
        f.try_register("HELLO", chatty).await.status,
        StatusCode::NO_CONTENT
    );
    let served = f.get_json("/eureka/apps/HELLO/h2").await.json();
    assert_eq!(
        served["instance"]["metadata"],
        json!({"b": "2", "c": "3", "odmesh.protocol": "http2"}),
        "odmesh's own entries first, then in key order; a key that is no XML name left out"
    );
    assert_eq!(count(&f.metrics.eureka_metadata_dropped_total), 2);
    assert_eq!(count(&f.metrics.eureka_refused_invalid_total), 0);
}

#[tokio::test]
async fn a_metadata_update_over_the_bounds_is_refused_and_changes_nothing() {
    let f = fixture_with(ServerConfig {
        limits: RegistrationLimits {
            max_metadata_entries: 2,
            ..config().limits
        },
        ..config()
    });
    f.register("HELLO", instance("h1", "HELLO", "hello", 8080))
        .await;
    let before = f.eureka.applications();
    let status = f
        .send(Method::PUT, "/eureka/apps/HELLO/h1/metadata?a=1&b=2")
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(f.eureka.applications(), before);
    assert_eq!(
        f.send(Method::PUT, "/eureka/apps/HELLO/h1/metadata?a=1")
            .await,
        StatusCode::OK
    );
}

#[tokio::test]
async fn a_full_registry_refuses_new_instances_with_503_but_takes_registrations_again() {
    let f = fixture_with(ServerConfig {
        limits: RegistrationLimits {
            max_instances: 2,
            ..config().limits
        },
        ..config()
    });
    for id in ["h1", "h2"] {
        f.register("HELLO", instance(id, "HELLO", "hello", 8080))
            .await;
    }
    let answer = f
        .try_register("HELLO", instance("h3", "HELLO", "hello", 8080))
        .await;
    assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        answer.body.contains("--eureka-max-instances"),
        "{}",
        answer.body
    );
    assert_eq!(count(&f.metrics.eureka_refused_full_total), 1);
    let again = f
        .try_register("HELLO", instance("h1", "HELLO", "hello", 8080))
        .await;
    assert_eq!(
        again.status,
        StatusCode::NO_CONTENT,
        "a known instance registers again"
    );
    f.send(Method::DELETE, "/eureka/apps/HELLO/h2").await;
    let room = f
        .try_register("HELLO", instance("h3", "HELLO", "hello", 8080))
        .await;
    assert_eq!(room.status, StatusCode::NO_CONTENT);
}

#[tokio::test]
async fn register_and_cancel_churn_keeps_the_delta_within_the_registry_bound() {
    let f = fixture_with(ServerConfig {
        limits: RegistrationLimits {
            max_instances: 3,
            ..config().limits
        },
        ..config()
    });
    for n in 0..10 {
        let id = format!("churn-{n}");
        f.register("HELLO", instance(&id, "HELLO", "hello", 8080))
            .await;
        f.send(Method::DELETE, &format!("/eureka/apps/HELLO/{id}"))
            .await;
    }
    let delta = f.eureka.delta();
    let changes: usize = delta.application.iter().map(|a| a.instance.len()).sum();
    assert_eq!(changes, 3);
}

// ---- Authentication and ownership ----

const TOKENS: &str = "identities:\n  - name: hello\n    token: hello-token-0123456789\n  - name: other\n    token: other-token-0123456789\n  - name: ops\n    token: ops-token-0123456789ab\n    operator: true\n";

fn authenticated() -> Fixture {
    let auth = Authenticator::parse("tokens.yaml", TOKENS.as_bytes()).unwrap();
    fixture_with(ServerConfig {
        auth: Some(Arc::new(auth)),
        ..config()
    })
}

const HELLO: Option<&str> = Some("Bearer hello-token-0123456789");
const OTHER: Option<&str> = Some("Bearer other-token-0123456789");
const OPS: Option<&str> = Some("Bearer ops-token-0123456789ab");

impl Fixture {
    async fn register_with(&self, auth: Option<&str>, id: &str, vip: &str) -> StatusCode {
        let body = json!({ "instance": instance(id, "HELLO", vip, 8080) }).to_string();
        self.raw(
            Method::POST,
            "/eureka/apps/HELLO",
            "application/json",
            auth,
            body,
        )
        .await
        .status
    }

    async fn send_with(&self, auth: Option<&str>, method: Method, uri: &str) -> StatusCode {
        self.raw(method, uri, "", auth, Body::empty()).await.status
    }
}

#[tokio::test]
async fn an_identity_registers_at_most_its_quota_of_instances_and_others_are_not_held_up() {
    let auth = Authenticator::parse("tokens.yaml", TOKENS.as_bytes()).unwrap();
    let f = fixture_with(ServerConfig {
        auth: Some(Arc::new(auth)),
        limits: RegistrationLimits {
            max_instances_per_identity: 2,
            ..config().limits
        },
        ..config()
    });
    for id in ["h1", "h2"] {
        assert_eq!(
            f.register_with(HELLO, id, "hello").await,
            StatusCode::NO_CONTENT
        );
    }
    assert_eq!(
        f.register_with(HELLO, "h3", "hello").await,
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(count(&f.metrics.eureka_refused_identity_full_total), 1);
    // Its own instances register again (no new one); another identity, and an operator,
    // are not held up.
    assert_eq!(
        f.register_with(HELLO, "h1", "hello").await,
        StatusCode::NO_CONTENT
    );
    let other = json!({ "instance": instance("o1", "OTHER", "other", 8080) });
    let json = "application/json";
    let answer = (f.raw(
        Method::POST,
        "/eureka/apps/OTHER",
        json,
        OTHER,
        other.to_string(),
    ))
    .await;
    assert_eq!(answer.status, StatusCode::NO_CONTENT);
    assert_eq!(
        f.register_with(OPS, "x1", "hello").await,
        StatusCode::NO_CONTENT
    );
    // One cancelled, one more fits.
    assert_eq!(
        f.send_with(HELLO, Method::DELETE, "/eureka/apps/HELLO/h2")
            .await,
        StatusCode::OK
    );
    assert_eq!(
        f.register_with(HELLO, "h3", "hello").await,
        StatusCode::NO_CONTENT
    );
    assert_eq!(f.published().await.len(), 4, "h1, h3, o1, x1");
}

impl Fixture {
    /// `GET /eureka/apps` from `source` (as the HTTP server marks requests) with `auth`:
    /// the status, and `Retry-After`.
    async fn get_from(&self, source: &str, auth: Option<&str>) -> Answer {
        let mut req = Request::builder().uri("/eureka/apps");
        if let Some(auth) = auth {
            req = req.header(header::AUTHORIZATION, auth);
        }
        let mut req = req.body(Body::empty()).unwrap();
        let source = odmesh_base::http_server::Source(source.parse().unwrap());
        req.extensions_mut().insert(source);
        self.answer(req, header::RETRY_AFTER).await
    }
}

#[tokio::test(start_paused = true)]
async fn an_address_sending_many_bad_credentials_is_refused_for_a_while_and_others_are_not() {
    let f = authenticated();
    let (guesser, other) = ("192.0.2.1:4000", "192.0.2.2:4000");
    let wrong = Some("Bearer not-a-token-0123456789");
    for _ in 0..20 {
        assert_eq!(
            f.get_from(guesser, wrong).await.status,
            StatusCode::UNAUTHORIZED
        );
    }
    // Its 21st request is refused before its credentials are looked at, right ones too.
    for auth in [wrong, HELLO] {
        let answer = f.get_from(guesser, auth).await;
        assert_eq!(
            answer.status,
            StatusCode::TOO_MANY_REQUESTS,
            "{}",
            answer.body
        );
        assert_eq!(answer.content_type, "10", "Retry-After");
    }
    assert_eq!(count(&f.metrics.eureka_refused_throttled_total), 2);
    assert_eq!(count(&f.metrics.eureka_refused_unauthenticated_total), 20);
    // Another address, and the same one once its 10 s are over, are served.
    assert_eq!(f.get_from(other, HELLO).await.status, StatusCode::OK);
    tokio::time::advance(Duration::from_secs(10)).await;
    assert_eq!(f.get_from(guesser, HELLO).await.status, StatusCode::OK);
}

#[tokio::test]
async fn with_a_tokens_file_a_request_without_valid_credentials_gets_401() {
    let f = authenticated();
    let answer = f
        .raw(
            Method::POST,
            "/eureka/apps/HELLO",
            "application/json",
            None,
            "{}",
        )
        .await;
    assert_eq!(answer.status, StatusCode::UNAUTHORIZED);
    assert!(
        answer.content_type.contains("Bearer"),
        "WWW-Authenticate: {}",
        answer.content_type
    );
    assert_eq!(
        f.register_with(Some("Bearer not-a-token-0123456789"), "h1", "hello")
            .await,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        f.send_with(None, Method::GET, "/eureka/apps").await,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        f.send_with(HELLO, Method::GET, "/eureka/apps").await,
        StatusCode::OK
    );
    assert_eq!(count(&f.metrics.eureka_refused_unauthenticated_total), 3);
    assert!(f.published().await.is_empty());
}

#[tokio::test]
async fn an_identity_registers_only_its_vips_and_changes_only_its_instances() {
    let f = authenticated();
    assert_eq!(
        f.register_with(HELLO, "h1", "hello").await,
        StatusCode::NO_CONTENT
    );
    // Hijacking: another identity's VIP, or another identity's instance.
    assert_eq!(
        f.register_with(HELLO, "h2", "payments").await,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        f.register_with(OTHER, "h1", "other").await,
        StatusCode::FORBIDDEN
    );
    for (method, uri) in [
        (Method::PUT, "/eureka/apps/HELLO/h1"),
        (Method::DELETE, "/eureka/apps/HELLO/h1"),
        (
            Method::PUT,
            "/eureka/apps/HELLO/h1/status?value=OUT_OF_SERVICE",
        ),
        (Method::DELETE, "/eureka/apps/HELLO/h1/status"),
        (Method::PUT, "/eureka/apps/HELLO/h1/metadata?k=v"),
    ] {
        assert_eq!(
            f.send_with(OTHER, method.clone(), uri).await,
            StatusCode::FORBIDDEN,
            "{method} {uri}"
        );
    }
    assert_eq!(count(&f.metrics.eureka_refused_forbidden_total), 7);
    assert_eq!(f.status_of("h1").await, Some(Status::Up), "nothing changed");
    // The owner and an operator may.
    assert_eq!(
        f.send_with(HELLO, Method::PUT, "/eureka/apps/HELLO/h1")
            .await,
        StatusCode::OK
    );
    assert_eq!(
        f.send_with(
            OPS,
            Method::PUT,
            "/eureka/apps/HELLO/h1/status?value=OUT_OF_SERVICE"
        )
        .await,
        StatusCode::OK
    );
    assert_eq!(f.status_of("h1").await, Some(Status::OutOfService));
    assert_eq!(
        f.send_with(OPS, Method::DELETE, "/eureka/apps/HELLO/h1")
            .await,
        StatusCode::OK
    );
    assert!(f.published().await.is_empty());
}

#[tokio::test]
async fn an_operators_drain_is_lifted_only_by_an_operator_and_an_owners_own_override_by_the_owner()
{
    let f = authenticated();
    assert_eq!(
        f.register_with(HELLO, "h1", "hello").await,
        StatusCode::NO_CONTENT
    );
    let drain = "/eureka/apps/HELLO/h1/status?value=OUT_OF_SERVICE";
    let lift = "/eureka/apps/HELLO/h1/status";
    let up = "/eureka/apps/HELLO/h1/status?value=UP";
    assert_eq!(f.send_with(OPS, Method::PUT, drain).await, StatusCode::OK);
    // The owner may neither lift the operator's drain nor override it with UP.
    assert_eq!(
        f.send_with(HELLO, Method::DELETE, lift).await,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        f.send_with(HELLO, Method::PUT, up).await,
        StatusCode::FORBIDDEN
    );
    // Nor does its registration again take it away.
    assert_eq!(
        f.register_with(HELLO, "h1", "hello").await,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        f.send_with(HELLO, Method::DELETE, lift).await,
        StatusCode::FORBIDDEN
    );
    assert_eq!(f.status_of("h1").await, Some(Status::OutOfService));
    // The operator lifts it; then the owner's own override is the owner's to lift.
    assert_eq!(f.send_with(OPS, Method::DELETE, lift).await, StatusCode::OK);
    assert_eq!(f.status_of("h1").await, Some(Status::Up));
    assert_eq!(f.send_with(HELLO, Method::PUT, drain).await, StatusCode::OK);
    assert_eq!(
        f.send_with(HELLO, Method::DELETE, lift).await,
        StatusCode::OK
    );
    assert_eq!(f.status_of("h1").await, Some(Status::Up));
}

// ---- Warm-up, self-preservation, late eviction rounds ----

#[tokio::test(start_paused = true)]
async fn after_a_start_the_registry_is_still_loading_for_the_warm_up_then_complete() {
    let f = fixture_with(ServerConfig {
        warmup: Duration::from_secs(30),
        ..config()
    });
    f.register("HELLO", instance("h1", "HELLO", "hello", 8080))
        .await;
    let reg = f.published().await;
    assert_eq!(
        reg.len(),
        1,
        "registrations are published during the warm-up"
    );
    assert!(!reg.is_complete());
    let mut rx = f.rx.clone();
    tokio::time::timeout(Duration::from_secs(31), rx.wait_for(|r| r.is_complete()))
        .await
        .expect("complete once the warm-up is over")
        .unwrap();
    assert_eq!(rx.borrow().len(), 1);
}

#[tokio::test]
async fn refusing_reads_while_warming_answers_clients_403_without_a_body_and_peers_as_ever() {
    let f = fixture_with(ServerConfig {
        warmup: Duration::from_secs(600),
        refuse_reads_while_warming: true,
        ..config()
    });
    f.register("HELLO", instance("h1", "HELLO", "hello", 8080))
        .await;
    for uri in ["/eureka/apps", "/eureka/apps/delta"] {
        let answer = f.get_json(uri).await;
        assert_eq!(
            (answer.status, answer.body.as_str()),
            (StatusCode::FORBIDDEN, ""),
            "{uri}"
        );
    }
    // A peer filling itself names itself, and is answered, marked as warming up.
    let req = Request::get("/eureka/apps")
        .header(header::ACCEPT, "application/json")
        .header(peers::NODE_HEADER, "another-node")
        .body(Body::empty())
        .unwrap();
    let answer = f
        .answer(
            req,
            header::HeaderName::from_static(peers::WARMING_UP_HEADER),
        )
        .await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.content_type, "true", "the warming-up header");
    assert!(answer.body.contains("\"h1\""), "{}", answer.body);
    // Without the option, clients are answered during the warm-up too.
    let serving = fixture_with(ServerConfig {
        warmup: Duration::from_secs(600),
        ..config()
    });
    assert_eq!(
        serving.get_json("/eureka/apps").await.status,
        StatusCode::OK
    );
}

/// A fixture whose self-preservation counts over 10 s, from 3 instances, each expected at
/// the interval it states (from 1 s).
fn preserving() -> Fixture {
    fixture_with(ServerConfig {
        preservation: PreservationConfig {
            threshold: 0.85,
            window: Duration::from_secs(10),
            min_instances: 3,
            min_interval: Duration::from_secs(1),
        },
        ..config()
    })
}

/// An instance with a `lease` s lease that says it renews every `every` s.
fn leased(id: &str, lease: u64, every: u64) -> Value {
    let mut i = instance(id, "HELLO", "hello", 8080);
    i["leaseInfo"] = json!({"durationInSecs": lease, "renewalIntervalInSecs": every});
    i
}

/// Registers ten instances of HELLO (5 s leases, a renewal a second) and renews each every
/// second for 10 s, which evicts none; returns their ids.
async fn ten_renewing(f: &Fixture) -> Vec<String> {
    let ids: Vec<String> = (0..10).map(|n| format!("h{n}")).collect();
    for id in &ids {
        f.register("HELLO", leased(id, 5, 1)).await;
    }
    for _ in 0..10 {
        tokio::time::advance(Duration::from_secs(1)).await;
        f.renew(&ids).await;
        assert_eq!(f.eureka.evict_expired(), 0);
    }
    ids
}

/// Registers twelve instances of HELLO (8 s leases, a renewal every 2 s), and renews them for
/// 30 s with eviction rounds; returns their ids. Self-preservation as shipped: one minute,
/// from 10 instances, every instance expected at most every 30 s.
async fn twelve_renewing_every_2_s(f: &Fixture) -> Vec<String> {
    let ids: Vec<String> = (0..12).map(|n| format!("h{n}")).collect();
    for id in &ids {
        f.register("HELLO", leased(id, 8, 2)).await;
    }
    renew_every_2_s(f, 30, &ids).await;
    ids
}

/// For `secs`, a heartbeat from each of `ids` and an eviction round every 2 s.
async fn renew_every_2_s(f: &Fixture, secs: u64, ids: &[String]) {
    for _ in 0..secs / 2 {
        tokio::time::advance(Duration::from_secs(2)).await;
        f.renew(ids).await;
        f.eureka.evict_expired();
    }
}

/// The ids of the instances published, having checked that `h0` (stopped) is not among them.
async fn listed_without_h0(f: &Fixture) -> Vec<String> {
    let published = f.published().await;
    let listed: Vec<String> = (published.instances())
        .map(|i| i.instance_id.to_string())
        .collect();
    assert!(
        !listed.iter().any(|id| id == "h0"),
        "the stopped instance is still listed: {listed:?}"
    );
    listed
}

#[tokio::test(start_paused = true)]
async fn one_registration_stating_a_1_s_interval_weighs_as_one_instance_not_thirty() {
    let f = fixture();
    let ids = twelve_renewing_every_2_s(&f).await;
    // One more registration states a 1 s interval, with a 5 min lease, and never renews.
    f.register("HELLO", leased("quiet", 300, 1)).await;
    renew_every_2_s(&f, 90, &ids).await;
    assert_eq!(count(&f.metrics.eureka_self_preservation), 0);
    // One instance stops: it is evicted when its lease runs out, as without the quiet one.
    renew_every_2_s(&f, 20, &ids[1..]).await;
    assert_eq!(count(&f.metrics.eureka_self_preservation), 0);
    let listed = listed_without_h0(&f).await;
    assert_eq!(listed.len(), 12, "{listed:?}");
}

#[tokio::test(start_paused = true)]
async fn registrations_that_never_renew_do_not_switch_eviction_off() {
    let f = fixture();
    let ids = twelve_renewing_every_2_s(&f).await;
    // Ten registrations, with 5 min leases, that never renew: a client that means to hold
    // leases nobody renews, as many as a partition would leave quiet.
    for n in 0..10 {
        f.register("HELLO", leased(&format!("quiet-{n}"), 300, 30))
            .await;
    }
    renew_every_2_s(&f, 90, &ids).await;
    assert_eq!(count(&f.metrics.eureka_self_preservation), 0);
    // One instance stops: it is evicted when its lease runs out.
    renew_every_2_s(&f, 20, &ids[1..]).await;
    assert_eq!(count(&f.metrics.eureka_self_preservation), 0);
    let listed = listed_without_h0(&f).await;
    assert_eq!(listed.len(), 21, "{listed:?}");
}

#[tokio::test(start_paused = true)]
async fn half_of_the_fast_renewers_going_quiet_engages_self_preservation_despite_the_floor() {
    // Expected at most every 30 s, instances renewing every 2 s count about once per 30 s:
    // the six that still renew cannot hide the six that went quiet (90 s leases: a lease
    // shorter than the window runs out before the window shows the silence).
    let f = fixture();
    let ids: Vec<String> = (0..12).map(|n| format!("h{n}")).collect();
    for id in &ids {
        f.register("HELLO", leased(id, 90, 2)).await;
    }
    for round in 0..100 {
        tokio::time::advance(Duration::from_secs(2)).await;
        let renewing = if round < 45 { &ids[..] } else { &ids[6..] };
        f.renew(renewing).await;
        f.eureka.evict_expired();
    }
    assert_eq!(count(&f.metrics.eureka_self_preservation), 1);
    assert_eq!(f.published().await.len(), 12, "the quiet six are kept");
}

#[tokio::test(start_paused = true)]
async fn when_renewals_stop_arriving_self_preservation_keeps_every_lease() {
    let f = preserving();
    let ids = ten_renewing(&f).await;
    assert_eq!(count(&f.metrics.eureka_self_preservation), 0);
    // The registry loses touch with every client: no heartbeat for longer than the lease.
    tokio::time::advance(Duration::from_secs(8)).await;
    assert_eq!(
        f.eureka.evict_expired(),
        0,
        "self-preservation holds eviction"
    );
    assert_eq!(count(&f.metrics.eureka_self_preservation), 1);
    assert_eq!(count(&f.metrics.eureka_evictions_held), 10);
    assert_eq!(f.published().await.len(), 10);
    // Heartbeats come back: eviction resumes (here nobody is expired any more).
    for _ in 0..10 {
        tokio::time::advance(Duration::from_secs(1)).await;
        f.renew(&ids[..9]).await;
        f.eureka.evict_expired();
    }
    assert_eq!(count(&f.metrics.eureka_self_preservation), 0);
    let left: Vec<String> = f
        .published()
        .await
        .instances()
        .map(|i| i.instance_id.to_string())
        .collect();
    assert_eq!(
        left.len(),
        9,
        "h9, silent all along, was evicted once renewals recovered: {left:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn one_round_evicts_at_most_the_share_above_the_threshold_oldest_first() {
    let f = preserving();
    // 15 instances: 10 renew every second, 5 say they renew rarely and go silent.
    let chatty: Vec<String> = (0..10).map(|n| format!("c{n}")).collect();
    for id in &chatty {
        f.register("HELLO", leased(id, 60, 1)).await;
    }
    for n in 0..5 {
        f.register("HELLO", leased(&format!("s{n}"), 3 + n, 300))
            .await;
    }
    for _ in 0..10 {
        tokio::time::advance(Duration::from_secs(1)).await;
        f.renew(&chatty).await;
    }
    // All 5 silent leases have expired; one round takes 15 - floor(15 * 0.85) = 3.
    assert_eq!(f.eureka.evict_expired(), 3);
    assert_eq!(count(&f.metrics.eureka_evictions_held), 2);
    let left: Vec<String> = f
        .published()
        .await
        .instances()
        .map(|i| i.instance_id.to_string())
        .collect();
    assert!(
        left.contains(&"s3".to_owned()) && left.contains(&"s4".to_owned()),
        "the last to expire stay: {left:?}"
    );
    assert_eq!(f.eureka.evict_expired(), 2);
}

#[tokio::test(start_paused = true)]
async fn an_eviction_round_that_runs_late_extends_every_lease_by_its_delay() {
    let f = fixture();
    f.register("HELLO", leased("h1", 10, 30)).await;
    let eviction = tokio::spawn(f.eureka.clone().run_eviction());
    for _ in 0..3 {
        tokio::task::yield_now().await;
        tokio::time::advance(Duration::from_secs(1)).await;
    }
    tokio::task::yield_now().await;
    assert_eq!(count(&f.metrics.eureka_late_eviction_rounds_total), 0);
    // The registry stalls for a minute (a paused process): no heartbeat could arrive.
    tokio::time::advance(Duration::from_secs(60)).await;
    tokio::task::yield_now().await;
    wait_until(
        Duration::from_secs(2),
        "a late eviction round counted",
        || count(&f.metrics.eureka_late_eviction_rounds_total) > 0,
    )
    .await;
    assert_eq!(
        f.published().await.len(),
        1,
        "not evicted for the registry's own stall"
    );
    assert_eq!(
        f.send(Method::PUT, "/eureka/apps/HELLO/h1").await,
        StatusCode::OK
    );
    // Silent for a whole lease after that: evicted as usual.
    let mut rx = f.rx.clone();
    tokio::time::timeout(Duration::from_secs(15), rx.wait_for(|r| r.is_empty()))
        .await
        .expect("evicted a lease after its last heartbeat")
        .unwrap();
    eviction.abort();
}

#[tokio::test(start_paused = true)]
async fn a_drained_instance_that_registers_again_right_after_its_cancel_stays_drained() {
    let f = fixture();
    f.register("HELLO", leased("h1", 10, 1)).await;
    assert_eq!(
        f.send(
            Method::PUT,
            "/eureka/apps/HELLO/h1/status?value=OUT_OF_SERVICE"
        )
        .await,
        StatusCode::OK
    );
    assert_eq!(
        f.send(Method::DELETE, "/eureka/apps/HELLO/h1").await,
        StatusCode::OK
    );
    // The client's last heartbeat raced its stop: 404, and it registers UP again.
    f.register("HELLO", leased("h1", 10, 1)).await;
    assert_eq!(f.status_of("h1").await, Some(Status::OutOfService));
    assert_eq!(count(&f.metrics.eureka_overrides_restored_total), 1);
    // One lease later, a new registration of the same id is a new instance.
    f.send(Method::DELETE, "/eureka/apps/HELLO/h1").await;
    tokio::time::advance(Duration::from_secs(11)).await;
    f.register("HELLO", leased("h1", 10, 1)).await;
    assert_eq!(f.status_of("h1").await, Some(Status::Up));
    // A cancel without an override leaves nothing behind.
    f.send(Method::DELETE, "/eureka/apps/HELLO/h1").await;
    f.register("HELLO", leased("h1", 10, 1)).await;
    assert_eq!(f.status_of("h1").await, Some(Status::Up));
}

#[tokio::test(start_paused = true)]
async fn a_client_heartbeating_far_faster_than_it_said_cannot_hide_that_the_others_went_quiet() {
    let f = preserving();
    ten_renewing(&f).await;
    // Nine go quiet; one heartbeats 50 times a second.
    for _ in 0..(8 * 50) {
        tokio::time::advance(Duration::from_millis(20)).await;
        f.send(Method::PUT, "/eureka/apps/HELLO/h0").await;
    }
    assert_eq!(
        f.eureka.evict_expired(),
        0,
        "self-preservation holds eviction"
    );
    assert_eq!(count(&f.metrics.eureka_self_preservation), 1);
}

#[tokio::test]
async fn an_identity_may_not_pose_as_another_app_nor_squat_its_instance_ids() {
    let f = authenticated();
    // `other` may register VIP `other`, but not under app HELLO, which is `hello`'s.
    let body = json!({ "instance": instance("hello-1", "HELLO", "other", 8080) }).to_string();
    let answer = f
        .raw(
            Method::POST,
            "/eureka/apps/HELLO",
            "application/json",
            OTHER,
            body,
        )
        .await;
    assert_eq!(answer.status, StatusCode::FORBIDDEN);
    assert!(
        answer
            .body
            .contains("may not register instances of app \"HELLO\""),
        "{}",
        answer.body
    );
    // So `hello` registers its instance id as usual.
    assert_eq!(
        f.register_with(HELLO, "hello-1", "hello").await,
        StatusCode::NO_CONTENT
    );
}

#[tokio::test]
async fn a_vip_lists_the_instances_serving_it_as_they_register_again_elsewhere_and_leave() {
    let f = fixture();
    let ids = |vip: &str| {
        let apps = f.eureka.serving(vip, false).application;
        let mut ids: Vec<String> = (apps.iter())
            .flat_map(|a| {
                a.instance
                    .iter()
                    .map(|i| i.id().unwrap_or_default().to_owned())
            })
            .collect();
        ids.sort();
        ids
    };
    f.register("HELLO", instance("h1", "HELLO", "hello,shared", 8080))
        .await;
    f.register("HELLO", instance("h2", "HELLO", "hello", 8081))
        .await;
    f.register("OTHER", instance("o1", "OTHER", "shared", 8082))
        .await;
    assert_eq!(ids("hello"), ["h1", "h2"]);
    assert_eq!(ids("shared"), ["h1", "o1"]);
    // h1 registers again with another VIP; o1 leaves.
    f.register("HELLO", instance("h1", "HELLO", "elsewhere", 8080))
        .await;
    f.send(Method::DELETE, "/eureka/apps/OTHER/o1").await;
    assert_eq!(ids("hello"), ["h2"]);
    assert_eq!(ids("elsewhere"), ["h1"]);
    assert!(ids("shared").is_empty());
    assert_eq!(
        f.get_json("/eureka/vips/shared").await.status,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn readers_of_the_delta_share_one_written_copy_too() {
    let f = fixture();
    f.register("HELLO", instance("h1", "HELLO", "hello", 8080))
        .await;
    let delta = |json| f.eureka.answer(Document::Delta, json, false);
    let (a, b) = (delta(true), delta(true));
    assert_eq!(a.as_ptr(), b.as_ptr(), "one copy for both readers");
    let doc: Value = serde_json::from_slice(&a).unwrap();
    assert_eq!(
        doc["applications"]["application"][0]["instance"][0]["instanceId"],
        "h1"
    );
    assert!(delta(false).starts_with(b"<?xml"));
    f.register("HELLO", instance("h2", "HELLO", "hello", 8081))
        .await;
    assert_ne!(
        delta(true).as_ptr(),
        a.as_ptr(),
        "a change writes a new one"
    );
    assert_eq!(count(&f.metrics.eureka_registry_answers_written_total), 3);
}

#[tokio::test(start_paused = true)]
async fn with_a_response_cache_interval_an_answer_is_reused_that_long_whatever_changed() {
    let f = fixture_with(ServerConfig {
        response_cache_interval: Duration::from_secs(30),
        ..config()
    });
    let listed = |document| {
        let body = f.eureka.answer(document, true, false);
        let doc: Value = serde_json::from_slice(&body).unwrap();
        let apps = doc["applications"]["application"].as_array().cloned();
        (apps.iter().flatten())
            .map(|a| a["instance"].as_array().map_or(0, Vec::len))
            .sum::<usize>()
    };
    f.register("HELLO", instance("h1", "HELLO", "hello", 8080))
        .await;
    assert_eq!((listed(Document::Apps), listed(Document::Delta)), (1, 1));
    f.register("HELLO", instance("h2", "HELLO", "hello", 8081))
        .await;
    tokio::time::advance(Duration::from_secs(29)).await;
    assert_eq!((listed(Document::Apps), listed(Document::Delta)), (1, 1));
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!((listed(Document::Apps), listed(Document::Delta)), (2, 2));
}

#[tokio::test]
async fn readers_of_the_whole_registry_share_one_written_copy_until_it_changes() {
    let f = fixture();
    f.register("HELLO", instance("h1", "HELLO", "hello", 8080))
        .await;
    let (a, b) = (
        f.eureka.applications_answer(true, false),
        f.eureka.applications_answer(true, false),
    );
    assert_eq!(a.as_ptr(), b.as_ptr(), "one copy for both readers");
    let xml = f.eureka.applications_answer(false, false);
    assert!(xml.starts_with(b"<?xml"));
    f.register("HELLO", instance("h2", "HELLO", "hello", 8081))
        .await;
    let c = f.eureka.applications_answer(true, false);
    assert_ne!(a.as_ptr(), c.as_ptr());
    let doc: Value = serde_json::from_slice(&c).unwrap();
    assert_eq!(
        doc["applications"]["application"][0]["instance"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    // And what the REST API answers is that copy.
    assert_eq!(f.get_json("/eureka/apps").await.body.as_bytes(), &c[..]);
}

#[tokio::test]
async fn readers_beyond_the_threads_that_read_the_whole_registry_wait_for_one_without_a_thread() {
    let f = fixture();
    f.register("HELLO", instance("h1", "HELLO", "hello", 8080))
        .await;
    const WAIT: Duration = Duration::from_secs(5);
    // Every thread that may read the whole registry is taken.
    let mut taken = Vec::new();
    for _ in 0..super::WHOLE_READERS {
        taken.push(f.eureka.whole_reader().await);
    }
    assert_eq!(count(&f.metrics.eureka_registry_readers_queued_total), 0);
    // A reader that needs the answer written waits for a thread.
    let router = f.eureka.router();
    let reader = tokio::spawn(async move {
        let req = Request::get("/eureka/apps").header(header::ACCEPT, "application/json");
        let resp = router
            .oneshot(req.body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = resp.status();
        (status, resp.into_body().collect().await.unwrap().to_bytes())
    });
    wait_until(WAIT, "the reader queued", || {
        count(&f.metrics.eureka_registry_readers_queued_total) == 1
    })
    .await;
    assert!(!reader.is_finished());
    drop(taken);
    let (status, body) = tokio::time::timeout(WAIT, reader).await.unwrap().unwrap();
    assert_eq!(status, StatusCode::OK);
    // Up to date now: a reader takes it without a thread, while every one is taken again.
    let mut taken = Vec::new();
    for _ in 0..super::WHOLE_READERS {
        taken.push(f.eureka.whole_reader().await);
    }
    let again = tokio::time::timeout(WAIT, f.get_json("/eureka/apps")).await;
    assert_eq!(
        again.unwrap().body.as_bytes(),
        &body[..],
        "the shared answer"
    );
    assert_eq!(count(&f.metrics.eureka_registry_readers_queued_total), 1);
}

/// `GET uri` with `Accept: application/json` and `accept_encoding`: the answer's
/// `Content-Encoding` and `Vary`, and its body as sent.
async fn get_encoded(f: &Fixture, uri: &str, accept_encoding: &str) -> (String, String, Vec<u8>) {
    let mut req = Request::builder()
        .uri(uri)
        .header(header::ACCEPT, "application/json");
    if !accept_encoding.is_empty() {
        req = req.header(header::ACCEPT_ENCODING, accept_encoding);
    }
    let resp = f
        .eureka
        .router()
        .oneshot(req.body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let header =
        |name| (resp.headers().get(name)).map_or(String::new(), |v| v.to_str().unwrap().to_owned());
    let (encoding, vary) = (header(header::CONTENT_ENCODING), header(header::VARY));
    let body = resp
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .to_vec();
    (encoding, vary, body)
}

fn gunzip(bytes: &[u8]) -> Vec<u8> {
    use std::io::Read;
    let mut plain = Vec::new();
    let mut decoder = flate2::read::GzDecoder::new(bytes);
    decoder.read_to_end(&mut plain).expect("a gzip answer");
    plain
}

#[tokio::test]
async fn the_registry_and_its_delta_are_gzip_compressed_for_a_client_that_asks() {
    let f = fixture();
    for i in 0..50 {
        let id = format!("h{i}");
        f.register("HELLO", instance(&id, "HELLO", "hello", 8000 + i))
            .await;
    }
    for uri in ["/eureka/apps", "/eureka/apps/delta"] {
        let (encoding, vary, plain) = get_encoded(&f, uri, "").await;
        assert_eq!(
            (encoding.as_str(), vary.as_str()),
            ("", "Accept-Encoding"),
            "{uri}"
        );
        // What Eureka's Java clients send, and other spellings.
        for asked in ["gzip", "gzip, deflate", "deflate, GZIP;q=0.5", "*"] {
            let (encoding, vary, zipped) = get_encoded(&f, uri, asked).await;
            assert_eq!(
                (encoding.as_str(), vary.as_str()),
                ("gzip", "Accept-Encoding"),
                "{uri} {asked}"
            );
            assert!(
                zipped.len() * 4 < plain.len(),
                "{uri}: {} of {} bytes",
                zipped.len(),
                plain.len()
            );
            let doc: Value = serde_json::from_slice(&gunzip(&zipped)).unwrap();
            assert_eq!(
                doc,
                serde_json::from_slice::<Value>(&plain).unwrap(),
                "{uri} {asked}"
            );
        }
        for refused in ["deflate", "gzip;q=0", "identity"] {
            let (encoding, _, body) = get_encoded(&f, uri, refused).await;
            assert_eq!(encoding, "", "{uri} {refused}");
            assert_eq!(body, plain, "{uri} {refused}");
        }
    }
    // Readers share one compressed copy of the registry, and a change writes a new one.
    let a = f.eureka.applications_answer(true, true);
    assert_eq!(
        a.as_ptr(),
        f.eureka.applications_answer(true, true).as_ptr()
    );
    f.register("HELLO", instance("h-new", "HELLO", "hello", 9000))
        .await;
    let b = f.eureka.applications_answer(true, true);
    assert_ne!(gunzip(&a), gunzip(&b));
    assert_eq!(gunzip(&b), &f.eureka.applications_answer(true, false)[..]);
}

#[tokio::test(start_paused = true)]
async fn the_status_page_says_emergency_while_self_preservation_holds_eviction() {
    let f = preserving();
    let ids = ten_renewing(&f).await;
    let page = || dashboard::render(&f.eureka.status_view(None));
    assert!(!page().contains("EMERGENCY"), "{}", page());
    tokio::time::advance(Duration::from_secs(8)).await;
    assert_eq!(f.eureka.evict_expired(), 0);
    let view = f.eureka.status_view(None);
    let p = &view.preservation;
    assert!(p.engaged);
    assert!((p.renewals as f64) < 0.85 * p.expected, "{p:?}");
    let html = page();
    assert!(
        html.contains("<div class=\"alert\">EMERGENCY! Self-preservation is on:"),
        "{html}"
    );
    assert!(
        html.contains("<td class=\"bad\">ON: eviction held</td>"),
        "{html}"
    );
    for _ in 0..10 {
        tokio::time::advance(Duration::from_secs(1)).await;
        f.renew(&ids).await;
        f.eureka.evict_expired();
    }
    assert!(!page().contains("EMERGENCY"), "{}", page());
}
