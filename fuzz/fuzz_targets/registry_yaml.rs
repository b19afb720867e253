//! Reading a `--registry` file: the short YAML form (`odmesh_registry::yaml::parse`, which
//! reads it with serde-saphyr into derived types, one instance at a time) and
//! `odmesh_registry::file::parse`, which tells the format by content.
//!
//! Input: any bytes, meant as a YAML registry. Checks:
//! - a refused file says why, and an invalid instance says its line and column;
//! - an accepted registry keeps the YAML form's rules: every instance has an app, a port or a
//!   secure port (never 0), valid VIPs only on an enabled side, and no two instances of an
//!   app share an id;
//! - written back in the YAML form (flow style, as JSON writes it) and read again, it is the
//!   same registry;
//! - `file::parse` gives what the parser of the format it detects gives.
#![no_main]

use std::collections::HashSet;
use std::path::Path;

use libfuzzer_sys::fuzz_target;
use odmesh_eureka::wire::json::{parse_registry, read_registry_file};
use odmesh_registry::Registry;
use odmesh_registry::file::{self, Format};
use odmesh_registry::yaml::{self, InvalidYaml};
use serde_json::{Map, Value};

fuzz_target!(|data: &[u8]| {
    match &yaml::parse(data) {
        Err(e @ InvalidYaml::Instance { line, column, .. }) => {
            assert!(*line >= 1 && *column >= 1, "{e}")
        }
        Err(e) => assert!(!e.to_string().is_empty()),
        Ok(registry) => check(registry),
    }

    let from_file = file::parse(Path::new("fuzz.yaml"), data, read_registry_file);
    let content = data.strip_prefix(b"\xef\xbb\xbf").unwrap_or(data);
    match Format::detect(data) {
        Format::Yaml => match (&from_file, yaml::parse(content)) {
            (Ok(p), Ok(registry)) => assert!(p.registry == registry && p.warnings.is_empty()),
            (Err(e), Err(_)) => assert!(!e.to_string().is_empty()),
            (file, yaml) => panic!("file::parse gave {file:?}, yaml::parse {yaml:?}"),
        },
        Format::EurekaJson => match (&from_file, parse_registry(content)) {
            (Ok(p), Ok(q)) => assert_eq!(p, &q),
            (Err(e), Err(_)) => assert!(!e.to_string().is_empty()),
            (file, json) => panic!("file::parse gave {file:?}, parse_registry {json:?}"),
        },
    }
});

/// The YAML form's rules, and the registry reads back the same from the YAML it gives.
fn check(registry: &Registry) {
    let mut ids = HashSet::new();
    let mut rows = Vec::new();
    for inst in registry.instances() {
        assert!(
            !inst.app.trim().is_empty() && inst.app.trim() == &*inst.app,
            "{inst:?}"
        );
        assert!(
            inst.port.is_some() || inst.secure_port.is_some(),
            "{inst:?}"
        );
        assert!(
            inst.port != Some(0) && inst.secure_port != Some(0),
            "{inst:?}"
        );
        assert_eq!(inst.port.is_some(), !inst.vips.is_empty(), "{inst:?}");
        assert_eq!(
            inst.secure_port.is_some(),
            !inst.svips.is_empty(),
            "{inst:?}"
        );
        for vip in inst.vips.iter().chain(&inst.svips) {
            odmesh_names::validate_vip(vip).expect("a valid VIP");
        }
        assert!(
            ids.insert((&inst.app, &inst.instance_id)),
            "id twice: {inst:?}"
        );

        let mut row = Map::new();
        let mut put = |key: &str, value: Value| {
            row.insert(key.into(), value);
        };
        put("app", (*inst.app).into());
        put("id", (*inst.instance_id).into());
        put("ip", inst.ip.to_string().into());
        if let Some(port) = inst.port {
            put("port", port.into());
            put("vip", inst.vips.join(",").into());
        }
        if let Some(port) = inst.secure_port {
            put("secure_port", port.into());
            put("svip", inst.svips.join(",").into());
        }
        put("status", inst.status.as_str().into());
        if let Some(zone) = &inst.zone {
            put("zone", (**zone).into());
        }
        rows.push(Value::Object(row));
    }
    // JSON is YAML's flow style.
    let text = serde_json::json!({ "instances": rows }).to_string();
    match yaml::parse(text.as_bytes()) {
        Ok(again) => assert_eq!(
            &again, registry,
            "the registry changed on the way back: {text}"
        ),
        Err(e) => panic!("what was written does not read back ({e}): {text}"),
    }
}
