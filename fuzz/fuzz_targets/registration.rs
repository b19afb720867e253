//! Registrations with the embedded Eureka registry (`EurekaRegistry::register`, what
//! `POST /eureka/apps/{APP}` calls), one after another on a fresh registry.
//!
//! Input: registrations separated by NUL bytes, each `APP \n BODY` (APP as from the URL
//! path, BODY meant as `{"instance": {...}}`). Checks:
//! - a refused registration is refused as invalid (400) with a reason, and leaves the
//!   registry exactly as it was;
//! - after an accepted one, the registry holds the instance under its uppercase app name,
//!   every instance's `app` is its application's name, and the registry's XML answers
//!   (`/apps`, `/apps/delta`, `/apps/{APP}`, the instance) are well-formed XML 1.0 and its
//!   JSON answers read back as the same document;
//! - at the end, the model the registry publishes to the mesh is that of its full document.
#![no_main]

use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use odmesh_eureka::server::{EurekaRegistry, Refusal, ServerConfig};
use odmesh_eureka::wire::json::{Applications, ApplicationsDocument, parse_document};
use odmesh_eureka::wire::xml;
use odmesh_fuzz::{assert_published_is_the_full_document, parse_xml};
use odmesh_registry::Registry;
use tokio::sync::watch;

/// At most this many registrations per input, so that each run stays short.
const MAX_REGISTRATIONS: usize = 8;

fuzz_target!(|data: &[u8]| {
    let (tx, rx) = watch::channel(Arc::new(Registry::default()));
    // Loopback instances accepted (as on one machine), so that more registrations get in;
    // complete at once: the warm-up after a start is not what this target checks.
    let config = ServerConfig {
        warmup: std::time::Duration::ZERO,
        ..ServerConfig::local()
    };
    let eureka = EurekaRegistry::new(config, tx, Arc::default(), Arc::default());

    for part in data.split(|&b| b == 0).take(MAX_REGISTRATIONS) {
        let (app, body) = match part.iter().position(|&b| b == b'\n') {
            Some(nl) => (&part[..nl], &part[nl + 1..]),
            None => (&b""[..], part),
        };
        let app = String::from_utf8_lossy(app);
        let before = eureka.applications();
        match eureka.register(&app, body) {
            Err(e) => {
                assert_eq!(e.refusal, Refusal::Invalid, "{e:?}");
                assert!(!e.reason.is_empty());
                assert_eq!(
                    eureka.applications(),
                    before,
                    "a refused registration changed the registry"
                );
            }
            Ok(()) => check_registered(&eureka, &app, body),
        }
    }

    // The publisher converts each instance when it changes; the full document, all at once.
    assert_published_is_the_full_document(&eureka, &rx);
});

fn check_registered(eureka: &EurekaRegistry, app: &str, body: &[u8]) {
    let name = app.trim().to_ascii_uppercase();
    let applications = eureka.applications();
    let application = eureka
        .application(&name)
        .unwrap_or_else(|| panic!("no application {name:?} after registering"));
    let id = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["instance"]["instanceId"].as_str().map(str::to_owned))
        .filter(|id| !id.trim().is_empty());
    let instance = match &id {
        Some(id) => application
            .instance
            .iter()
            .find(|i| i.instance_id.as_ref() == Some(id))
            .unwrap_or_else(|| panic!("instance {id:?} is not in {application:?}")),
        None => application.instance.first().expect("an instance"),
    };
    for app in &applications.application {
        for inst in &app.instance {
            assert_eq!(inst.app.as_ref(), Some(&app.name), "{inst:?}");
        }
    }

    parse_xml(&xml::applications(&applications));
    parse_xml(&xml::applications(&eureka.delta()));
    parse_xml(&xml::application(&application));
    parse_xml(&xml::instance(instance));

    json_round_trip(&applications);
    json_round_trip(&eureka.delta());
}

/// The JSON answer of `applications` reads back as the same document.
fn json_round_trip(applications: &Applications) {
    let document = ApplicationsDocument {
        applications: applications.clone(),
    };
    let json = serde_json::to_vec(&document).expect("the JSON answer can be written");
    match parse_document(&json) {
        Ok(again) => {
            assert!(again.rejected.is_empty(), "{:?}", again.rejected);
            assert_eq!(&again.applications, applications);
        }
        Err(e) => panic!(
            "the JSON answer does not read back ({e}): {}",
            String::from_utf8_lossy(&json)
        ),
    }
}
