//! A peer's replication batch (`POST /peerreplication/batch`, Eureka's `{"replicationList":
//! [...]}`), decoded and applied to a registry that already holds one instance, as a node
//! does for the batches its peers send. Checks:
//! - a batch that does not decode is refused as invalid (400) with a reason, and leaves the
//!   registry as it was;
//! - each write of one that decodes is applied or refused, without a panic;
//! - afterwards every instance's `app` is its application's name, the registry's XML answers
//!   are well-formed XML 1.0, and the model it publishes is that of its full document.
#![no_main]

use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use odmesh_eureka::server::peers;
use odmesh_eureka::server::{EurekaRegistry, Refusal, ServerConfig};
use odmesh_eureka::wire::xml;
use odmesh_fuzz::{assert_published_is_the_full_document, parse_xml};
use odmesh_registry::Registry;
use tokio::sync::watch;

/// A registration already in the registry, for the batch's writes to meet.
const HELLO: &[u8] = br#"{"instance": {"instanceId": "h1", "app": "HELLO", "ipAddr": "127.0.0.1",
  "status": "UP", "port": {"$": 8080, "@enabled": "true"}, "vipAddress": "hello",
  "leaseInfo": {"durationInSecs": 90, "renewalIntervalInSecs": 30}}}"#;

fuzz_target!(|data: &[u8]| {
    let (tx, rx) = watch::channel(Arc::new(Registry::default()));
    let config = ServerConfig {
        warmup: std::time::Duration::ZERO,
        ..ServerConfig::local()
    };
    let eureka = EurekaRegistry::new(config, tx, Arc::default(), Arc::default());
    eureka
        .register("HELLO", HELLO)
        .expect("the seed registration");
    let before = eureka.applications();
    match peers::decode(data) {
        Err(e) => {
            assert_eq!(e.refusal, Refusal::Invalid, "{e:?}");
            assert!(!e.reason.is_empty());
            assert_eq!(
                eureka.applications(),
                before,
                "a refused batch changed the registry"
            );
            return;
        }
        Ok(writes) => {
            for write in writes.into_iter().take(64) {
                let _ = eureka.apply_replicated(write);
            }
        }
    }
    let applications = eureka.applications();
    for app in &applications.application {
        for instance in &app.instance {
            assert_eq!(instance.app.as_ref(), Some(&app.name), "{instance:?}");
        }
    }
    parse_xml(&xml::applications(&applications));
    parse_xml(&xml::applications(&eureka.delta()));

    assert_published_is_the_full_document(&eureka, &rx);
});
