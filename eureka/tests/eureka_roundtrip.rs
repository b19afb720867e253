//! The Eureka source following odmesh's own embedded registry, both in this process on
//! loopback ports: what a client registers there reaches the follower after a poll.

mod eureka_support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use eureka_support::{DEADLINE, find, http, wait_registry};
use odmesh_eureka::client::{self, ClientConfig};
use odmesh_eureka::server::{self, ServerConfig};
use odmesh_registry::Status;
use serde_json::json;

fn registration(id: &str, port: u16) -> serde_json::Value {
    json!({"instance": {
        "instanceId": id, "hostName": "localhost", "app": "ROUNDTRIP", "ipAddr": "127.0.0.1",
        "status": "UP", "port": {"$": port, "@enabled": "true"},
        "dataCenterInfo": {"@class": "com.netflix.appinfo.InstanceInfo$DefaultDataCenterInfo", "name": "MyOwn"},
        "vipAddress": "roundtrip"
    }})
}

/// One machine (loopback instances), and complete at once: these tests are not about the
/// warm-up after a restart.
fn local_config() -> ServerConfig {
    ServerConfig {
        warmup: Duration::ZERO,
        ..ServerConfig::local()
    }
}

#[tokio::test]
async fn the_eureka_source_follows_registrations_status_changes_and_cancels_of_the_embedded_registry()
 {
    let embedded = server::start(
        "127.0.0.1:0".parse().unwrap(),
        local_config(),
        None,
        Arc::default(),
        Arc::default(),
    )
    .await
    .unwrap();
    let base = format!("http://{}/eureka", embedded.local_addr);

    let mut config = ClientConfig::new(vec![base.clone()], Duration::from_millis(100));
    config.first_fetch_wait = Duration::from_secs(5);
    let follower = client::start_with(config, Arc::default(), Arc::default())
        .await
        .unwrap();
    assert!(
        follower.health.is_loaded(),
        "an empty registry is a good fetch"
    );

    let (status, body) = http(
        "POST",
        &format!("{base}/apps/roundtrip"),
        Some(registration("r1", 9001)),
    )
    .await;
    assert_eq!(status, 204, "{body}");
    let reg = wait_registry(&follower.registry, "r1 registered", DEADLINE, |r| {
        find(r, "r1").is_some()
    })
    .await;
    assert_eq!(
        find(&reg, "r1").unwrap().vips,
        ["roundtrip"].map(Arc::<str>::from)
    );

    http(
        "POST",
        &format!("{base}/apps/roundtrip"),
        Some(registration("r2", 9002)),
    )
    .await;
    http(
        "PUT",
        &format!("{base}/apps/ROUNDTRIP/r1/status?value=OUT_OF_SERVICE"),
        None,
    )
    .await;
    wait_registry(
        &follower.registry,
        "r2 added and r1 drained",
        DEADLINE,
        |r| {
            find(r, "r2").is_some()
                && find(r, "r1").is_some_and(|i| i.status == Status::OutOfService)
        },
    )
    .await;

    let (status, _) = http("DELETE", &format!("{base}/apps/ROUNDTRIP/r1"), None).await;
    assert_eq!(status, 200);
    let reg = wait_registry(&follower.registry, "r1 cancelled", DEADLINE, |r| {
        find(r, "r1").is_none()
    })
    .await;
    assert_eq!(reg.len(), 1);
    // The follower and the registry agree on the whole model.
    assert_eq!(*reg, **embedded.registry.borrow());
}

#[tokio::test]
async fn a_registration_is_published_by_the_embedded_registry_within_milliseconds() {
    let embedded = server::start(
        "127.0.0.1:0".parse().unwrap(),
        local_config(),
        None,
        Arc::default(),
        Arc::default(),
    )
    .await
    .unwrap();
    let base = format!("http://{}/eureka", embedded.local_addr);
    let mut worst = Duration::ZERO;
    for n in 0..20u16 {
        let id = format!("m{n}");
        let sent = Instant::now();
        let (status, _) = http(
            "POST",
            &format!("{base}/apps/roundtrip"),
            Some(registration(&id, 9000 + n)),
        )
        .await;
        assert_eq!(status, 204);
        wait_registry(
            &embedded.registry,
            "published",
            Duration::from_secs(1),
            |r| find(r, &id).is_some(),
        )
        .await;
        worst = worst.max(sent.elapsed());
    }
    println!("registration (HTTP POST) to published registry: worst of 20 = {worst:?}");
    assert!(worst < Duration::from_secs(1), "{worst:?}");
}
