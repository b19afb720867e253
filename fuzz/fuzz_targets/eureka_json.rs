//! Reading Eureka's JSON (`odmesh_eureka::wire::json::parse_document`, `parse_registry`), as the
//! Eureka client source and a `--registry` JSON file do.
//!
//! Input: any bytes, meant as an `{"applications": ...}` document. Checks:
//! - a refused document says why;
//! - `parse_registry` accepts exactly what `parse_document` accepts, and gives the registry
//!   of its `to_registry`, with the skipped instances first among the warnings;
//! - every instance of the registry has valid VIPs and SVIPs, each list only with its port
//!   enabled, and no port 0;
//! - written back as JSON (as the embedded registry serves it) and read again, the document
//!   is the same, skips nothing, and gives the same registry;
//! - every instance, stored as the embedded registry keeps it (`server::stored::Stored`),
//!   reads back equal, and what the registry reads of it in place is what it says.
#![no_main]

use libfuzzer_sys::fuzz_target;
use odmesh_eureka::server::stored::Stored;
use odmesh_eureka::wire::json::{ApplicationsDocument, parse_document, parse_registry};

fuzz_target!(|data: &[u8]| {
    let parsed = match parse_document(data) {
        Ok(parsed) => parsed,
        Err(e) => {
            assert!(!e.to_string().is_empty());
            assert!(parse_registry(data).is_err(), "parse_registry accepted it");
            return;
        }
    };
    let full = parse_registry(data).expect("parse_document accepted it");
    let converted = parsed.applications.to_registry();
    assert_eq!(full.registry, converted.registry);
    assert_eq!(full.warnings[..parsed.rejected.len()], parsed.rejected[..]);
    assert_eq!(
        full.warnings.len(),
        parsed.rejected.len() + converted.warnings.len()
    );
    for warning in &full.warnings {
        assert!(!warning.to_string().is_empty());
    }

    for inst in full.registry.instances() {
        for vip in inst.vips.iter().chain(&inst.svips) {
            if let Err(e) = odmesh_names::validate_vip(vip) {
                panic!("instance {inst:?} has VIP {vip:?}: {e}");
            }
        }
        assert!(inst.port.is_some() || inst.vips.is_empty(), "{inst:?}");
        assert!(
            inst.secure_port.is_some() || inst.svips.is_empty(),
            "{inst:?}"
        );
        assert!(
            inst.port != Some(0) && inst.secure_port != Some(0),
            "{inst:?}"
        );
    }

    for info in (parsed.applications.application.iter()).flat_map(|a| &a.instance) {
        let stored = Stored::from(info);
        assert_eq!(&stored.info(), info);
        assert_eq!(stored.status(), info.status());
        assert_eq!(stored.app(), info.app.as_deref());
        assert_eq!(stored.instance_id(), info.instance_id.as_deref());
        assert_eq!(stored.vip_address(false), info.vip_address.as_deref());
        assert_eq!(stored.vip_address(true), info.secure_vip_address.as_deref());
        assert_eq!(stored.last_dirty_timestamp(), info.last_dirty_timestamp);
        let up = info
            .lease_info
            .as_ref()
            .and_then(|l| l.service_up_timestamp);
        assert_eq!(stored.service_up_timestamp(), up);
    }

    let document = ApplicationsDocument {
        applications: parsed.applications,
    };
    let json = serde_json::to_vec(&document).expect("a document can be written as JSON");
    let again = match parse_document(&json) {
        Ok(again) => again,
        Err(e) => panic!(
            "what was written does not read back ({e}): {}",
            String::from_utf8_lossy(&json)
        ),
    };
    assert!(again.rejected.is_empty(), "{:?}", again.rejected);
    assert_eq!(
        again.applications, document.applications,
        "the document changed on the way back"
    );
    assert_eq!(again.applications.to_registry(), converted);
});
