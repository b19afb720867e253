//! The short YAML registry form for hand-written registries (SPEC.md, "Registry formats").
//!
//! ```yaml
//! instances:
//!   - app: hello            # required
//!     ip: 127.0.0.1         # required
//!     port: 8080            # the VIP side; omit for none
//!     secure_port: 8443     # the SVIP side; omit for none
//!     vip: hello            # default: app; comma-separated list allowed
//!     svip: hello           # default: vip, when secure_port is set
//!     status: UP            # default UP
//!     zone: us-east-1a      # optional
//!     id: hello-1           # optional; default derived from app, ip and ports
//! ```
//!
//! Strict, because a person wrote it: an unknown field, a missing or ill-typed value, an
//! invalid VIP, or two instances with the same id fail the whole file, and the error names
//! the instance (index and app), the field and the reason. Fields are read one by one (not
//! with a derived `deny_unknown_fields` struct) so that every error can name its field.

use std::collections::HashSet;
use std::net::IpAddr;

use serde::de::DeserializeOwned;
use serde_yaml::{Mapping, Value};

use super::{Instance, InvalidInstance, Registry, Status, check_vip, split_vips};

/// The fields an instance may have.
pub const FIELDS: &[&str] = &[
    "app",
    "ip",
    "port",
    "secure_port",
    "vip",
    "svip",
    "status",
    "zone",
    "id",
];

/// Why a YAML registry was refused.
#[derive(Debug, thiserror::Error)]
pub enum InvalidYaml {
    #[error("not valid YAML: {0}")]
    Syntax(#[from] serde_yaml::Error),
    #[error("{0}")]
    Shape(String),
    /// Boxed: an error is rare and this keeps `Result`s small.
    #[error(transparent)]
    Instance(Box<InvalidInstance>),
}

impl From<InvalidInstance> for InvalidYaml {
    fn from(e: InvalidInstance) -> InvalidYaml {
        InvalidYaml::Instance(Box::new(e))
    }
}

/// Reads the short YAML form. Any invalid instance fails the whole file.
pub fn parse(yaml: &[u8]) -> Result<Registry, InvalidYaml> {
    let root: Value = serde_yaml::from_slice(yaml)?;
    let list = match root {
        Value::Null => {
            return Err(InvalidYaml::Shape(
                "the file is empty; expected `instances:` (write `instances: []` for none)".into(),
            ));
        }
        Value::Mapping(mut top) => {
            let instances = top.remove("instances");
            if let Some((key, _)) = top.into_iter().next() {
                return Err(InvalidYaml::Shape(format!(
                    "unknown top-level field {}; only `instances` is allowed",
                    describe_key(&key)
                )));
            }
            match instances {
                Some(Value::Sequence(list)) => list,
                Some(Value::Null) => Vec::new(),
                Some(_) => return Err(InvalidYaml::Shape("`instances` must be a list".into())),
                None => return Err(InvalidYaml::Shape("no `instances` list at the top".into())),
            }
        }
        _ => {
            return Err(InvalidYaml::Shape(
                "the top level must be a mapping with `instances`".into(),
            ));
        }
    };

    let mut registry = Registry::default();
    let mut ids = HashSet::new();
    for (index, value) in list.into_iter().enumerate() {
        let inst = parse_instance(index, value)?;
        if !ids.insert((inst.app.clone(), inst.instance_id.clone())) {
            return Err(InvalidInstance {
                index,
                app: inst.app.clone(),
                instance_id: Some(inst.instance_id.clone()),
                field: "id".into(),
                reason: "another instance of this app has the same id; set `id` to tell them apart"
                    .into(),
            }
            .into());
        }
        registry.instances.push(inst);
    }
    Ok(registry)
}

fn describe_key(key: &Value) -> String {
    match key {
        Value::String(s) => format!("`{s}`"),
        other => format!("{other:?}"),
    }
}

/// The raw fields of one instance, each checked for its type only.
#[derive(Default)]
struct Fields {
    app: Option<String>,
    ip: Option<String>,
    port: Option<u16>,
    secure_port: Option<u16>,
    vip: Option<String>,
    svip: Option<String>,
    status: Option<String>,
    zone: Option<String>,
    id: Option<String>,
}

fn parse_instance(index: usize, value: Value) -> Result<Instance, InvalidInstance> {
    // The app, as far as it can be read, to name the instance in every error.
    let app_hint = value
        .get("app")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let fail = |field: &str, reason: String| InvalidInstance {
        index,
        app: app_hint.clone(),
        instance_id: None,
        field: field.to_owned(),
        reason,
    };
    let Value::Mapping(map) = value else {
        return Err(fail("instance", "expected a mapping of fields".into()));
    };
    let f = read_fields(map, &fail)?;

    let app = f.app.map(|a| a.trim().to_owned()).unwrap_or_default();
    if app.is_empty() {
        return Err(fail("app", "required".into()));
    }
    let ip_text = f.ip.ok_or_else(|| fail("ip", "required".into()))?;
    let ip: IpAddr = ip_text
        .trim()
        .parse()
        .map_err(|_| fail("ip", format!("{ip_text:?} is not an IP address")))?;
    for (field, port) in [("port", f.port), ("secure_port", f.secure_port)] {
        if port == Some(0) {
            return Err(fail(field, "0 is not a usable port".into()));
        }
    }
    if f.port.is_none() && f.secure_port.is_none() {
        return Err(fail(
            "port",
            "an instance needs `port`, `secure_port` or both".into(),
        ));
    }
    if f.svip.is_some() && f.secure_port.is_none() {
        return Err(fail("svip", "set without `secure_port`".into()));
    }

    let vip_field = if f.vip.is_some() { "vip" } else { "app" };
    let vip_names = vip_list(vip_field, f.vip.as_deref().unwrap_or(&app), &fail)?;
    let vips = if f.port.is_some() {
        vip_names.clone()
    } else {
        Vec::new()
    };
    let svips = match (f.secure_port, &f.svip) {
        (None, _) => Vec::new(),
        (Some(_), Some(svip)) => vip_list("svip", svip, &fail)?,
        (Some(_), None) => vip_names,
    };

    let status = match &f.status {
        None => Status::Up,
        Some(s) => Status::parse(s).ok_or_else(|| {
            fail(
                "status",
                format!("{s:?} is not one of UP, DOWN, STARTING, OUT_OF_SERVICE, UNKNOWN"),
            )
        })?,
    };
    let zone = match f.zone {
        Some(z) if z.trim().is_empty() => return Err(fail("zone", "empty".into())),
        z => z.map(|z| z.trim().to_owned()),
    };
    let instance_id = match f.id {
        Some(id) if id.trim().is_empty() => return Err(fail("id", "empty".into())),
        Some(id) => id.trim().to_owned(),
        None => derived_id(&app, ip, f.port, f.secure_port),
    };

    Ok(Instance {
        app,
        instance_id,
        ip,
        port: f.port,
        secure_port: f.secure_port,
        vips,
        svips,
        status,
        zone,
    })
}

fn read_fields(
    map: Mapping,
    fail: &dyn Fn(&str, String) -> InvalidInstance,
) -> Result<Fields, InvalidInstance> {
    fn typed<T: DeserializeOwned>(
        field: &str,
        value: Value,
        expected: &str,
        fail: &dyn Fn(&str, String) -> InvalidInstance,
    ) -> Result<Option<T>, InvalidInstance> {
        if value.is_null() {
            return Err(fail(field, format!("empty; expected {expected}")));
        }
        serde_yaml::from_value(value.clone())
            .map(Some)
            .map_err(|_| {
                fail(
                    field,
                    format!("expected {expected}, found {}", show(&value)),
                )
            })
    }
    const TEXT: &str = "a string";
    const PORT: &str = "a port number (1-65535)";

    let mut f = Fields::default();
    for (key, value) in map {
        let Value::String(key) = key else {
            return Err(fail(
                &format!("{key:?}"),
                "field names must be strings".into(),
            ));
        };
        match key.as_str() {
            "app" => f.app = typed("app", value, TEXT, fail)?,
            "ip" => f.ip = typed("ip", value, TEXT, fail)?,
            "port" => f.port = typed("port", value, PORT, fail)?,
            "secure_port" => f.secure_port = typed("secure_port", value, PORT, fail)?,
            "vip" => f.vip = typed("vip", value, TEXT, fail)?,
            "svip" => f.svip = typed("svip", value, TEXT, fail)?,
            "status" => f.status = typed("status", value, TEXT, fail)?,
            "zone" => f.zone = typed("zone", value, TEXT, fail)?,
            "id" => f.id = typed("id", value, TEXT, fail)?,
            other => {
                return Err(fail(
                    other,
                    format!("unknown field; expected one of {}", FIELDS.join(", ")),
                ));
            }
        }
    }
    Ok(f)
}

/// A short rendering of a YAML value for error messages.
fn show(value: &Value) -> String {
    match serde_yaml::to_string(value) {
        Ok(s) => s.trim_end().to_owned(),
        Err(_) => format!("{value:?}"),
    }
}

fn vip_list(
    field: &str,
    list: &str,
    fail: &dyn Fn(&str, String) -> InvalidInstance,
) -> Result<Vec<String>, InvalidInstance> {
    let vips = split_vips(list);
    if vips.is_empty() {
        return Err(fail(field, "names no VIP".into()));
    }
    for vip in &vips {
        check_vip(vip).map_err(|reason| fail(field, reason))?;
    }
    Ok(vips)
}

/// `app:ip:port`, with `:s<secure_port>` when there is a secure port; IPv6 in brackets.
fn derived_id(app: &str, ip: IpAddr, port: Option<u16>, secure_port: Option<u16>) -> String {
    let host = match ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => format!("[{v6}]"),
    };
    let mut id = format!("{app}:{host}");
    if let Some(p) = port {
        id.push_str(&format!(":{p}"));
    }
    if let Some(p) = secure_port {
        id.push_str(&format!(":s{p}"));
    }
    id
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::testdata::read as testdata;

    fn instance_error(yaml: &str) -> InvalidInstance {
        match parse(yaml.as_bytes()) {
            Err(InvalidYaml::Instance(e)) => *e,
            other => panic!("expected an instance error, got {other:?}"),
        }
    }

    #[test]
    fn the_example_registry_parses_with_its_defaults() {
        let reg = parse(&testdata("registry.yaml")).unwrap();
        assert_eq!(reg.instances.len(), 5);

        let first = &reg.instances[0];
        assert_eq!(first.app, "hello");
        assert_eq!(first.instance_id, "hello:127.0.0.1:8081:s8443");
        assert_eq!((first.port, first.secure_port), (Some(8081), Some(8443)));
        assert_eq!(first.vips, ["hello"], "vip defaults to app");
        assert_eq!(first.svips, ["hello"], "svip defaults to vip");
        assert_eq!(first.status, Status::Up);
        assert_eq!(first.zone.as_deref(), Some("local-a"));

        assert_eq!(reg.instances[1].vips, ["hello", "hello.internal"]);
        assert!(reg.instances[1].svips.is_empty());
        assert_eq!(reg.instances[2].status, Status::Down);

        let payments = &reg.instances[3];
        assert_eq!(payments.ip, "::1".parse::<IpAddr>().unwrap());
        assert!(payments.vips.is_empty(), "no port, so no VIP side");
        assert_eq!(payments.svips, ["payments.secure"]);
        assert_eq!(payments.instance_id, "payments:[::1]:s9443");

        let greeter = &reg.instances[4];
        assert_eq!(greeter.instance_id, "greeter-canary");
        assert_eq!(greeter.vips, ["greeter-v2"]);
        assert_eq!(greeter.status, Status::OutOfService);
    }

    #[test]
    fn svip_defaults_to_an_explicit_vip() {
        let reg =
            parse(b"instances: [{app: hello, ip: 10.0.0.1, secure_port: 443, vip: Hi}]").unwrap();
        assert_eq!(reg.instances[0].svips, ["hi"]);
        assert!(reg.instances[0].vips.is_empty());
    }

    #[test]
    fn an_unknown_field_names_the_instance_and_the_field() {
        let err = match parse(&testdata("registry-unknown-field.yaml")) {
            Err(InvalidYaml::Instance(e)) => e,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            (err.index, err.app.as_str(), err.field.as_str()),
            (1, "greeter", "vipp")
        );
        assert!(err.reason.contains("unknown field"), "{err}");
        assert!(
            err.to_string().contains("instance 1 (app \"greeter\")"),
            "{err}"
        );
    }

    #[test]
    fn a_bad_ip_names_the_instance_and_the_field() {
        let err = match parse(&testdata("registry-bad-ip.yaml")) {
            Err(InvalidYaml::Instance(e)) => e,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            (err.index, err.app.as_str(), err.field.as_str()),
            (2, "greeter", "ip")
        );
        assert!(
            err.reason
                .contains("\"greeter.local\" is not an IP address"),
            "{err}"
        );
    }

    #[test]
    fn a_missing_app_or_ip_is_required() {
        let err = instance_error("instances: [{ip: 10.0.0.1, port: 80}]");
        assert_eq!(
            (err.field.as_str(), err.reason.as_str()),
            ("app", "required")
        );
        let err = instance_error("instances: [{app: hello, port: 80}]");
        assert_eq!((err.field.as_str(), err.app.as_str()), ("ip", "hello"));
    }

    #[test]
    fn a_port_out_of_range_or_of_the_wrong_type_is_refused() {
        let err = instance_error("instances: [{app: hello, ip: 10.0.0.1, port: 70000}]");
        assert_eq!(err.field, "port");
        assert!(err.reason.contains("70000"), "{err}");
        let err = instance_error("instances: [{app: hello, ip: 10.0.0.1, secure_port: https}]");
        assert_eq!(err.field, "secure_port");
        let err = instance_error("instances: [{app: hello, ip: 10.0.0.1, port: 0}]");
        assert_eq!(err.field, "port");
    }

    #[test]
    fn an_instance_without_any_port_is_refused() {
        let err = instance_error("instances: [{app: hello, ip: 10.0.0.1}]");
        assert_eq!(err.field, "port");
    }

    #[test]
    fn an_svip_without_a_secure_port_is_refused() {
        let err = instance_error("instances: [{app: hello, ip: 10.0.0.1, port: 80, svip: hello}]");
        assert_eq!(err.field, "svip");
    }

    #[test]
    fn an_invalid_vip_is_refused_with_the_reason() {
        let err =
            instance_error("instances: [{app: hello, ip: 10.0.0.1, port: 80, vip: 'ok, not ok'}]");
        assert_eq!(err.field, "vip");
        assert!(err.reason.contains("\"not ok\""), "{err}");
        let err = instance_error("instances: [{app: Hello World, ip: 10.0.0.1, port: 80}]");
        assert_eq!(err.field, "app", "the default VIP comes from app");
        let err = instance_error("instances: [{app: hello, ip: 10.0.0.1, port: 80, vip: ' , '}]");
        assert_eq!(
            (err.field.as_str(), err.reason.as_str()),
            ("vip", "names no VIP")
        );
    }

    #[test]
    fn an_unknown_status_is_refused_and_status_is_case_insensitive() {
        let err =
            instance_error("instances: [{app: hello, ip: 10.0.0.1, port: 80, status: sleepy}]");
        assert_eq!(err.field, "status");
        let reg =
            parse(b"instances: [{app: hello, ip: 10.0.0.1, port: 80, status: out_of_service}]")
                .unwrap();
        assert_eq!(reg.instances[0].status, Status::OutOfService);
    }

    #[test]
    fn two_instances_with_the_same_id_are_refused() {
        let err = instance_error(
            "instances: [{app: hello, ip: 10.0.0.1, port: 80}, {app: hello, ip: 10.0.0.1, port: 80}]",
        );
        assert_eq!((err.index, err.field.as_str()), (1, "id"));
    }

    #[test]
    fn an_empty_field_value_is_refused() {
        let err = instance_error("instances: [{app: hello, ip: 10.0.0.1, port: 80, zone: }]");
        assert_eq!(err.field, "zone");
    }

    #[test]
    fn an_empty_list_is_an_empty_registry_but_an_empty_file_is_an_error() {
        assert_eq!(parse(b"instances: []").unwrap(), Registry::default());
        assert!(matches!(parse(b""), Err(InvalidYaml::Shape(_))));
        assert!(matches!(parse(b"# nothing\n"), Err(InvalidYaml::Shape(_))));
    }

    #[test]
    fn an_unknown_top_level_field_is_refused() {
        let err = parse(b"instances: []\nextra: 1").unwrap_err();
        assert!(err.to_string().contains("`extra`"), "{err}");
    }

    #[test]
    fn broken_yaml_is_a_syntax_error() {
        assert!(matches!(
            parse(&testdata("broken.yaml")),
            Err(InvalidYaml::Syntax(_))
        ));
    }
}
