//! The short YAML registry form for hand-written registries (its fields and defaults:
//! docs/registry-formats.md, "The short YAML form").
//!
//! Strict, because a person wrote it: an unknown field, a missing or ill-typed value, an
//! invalid VIP, or two instances with the same id fail the whole file, and the error says the
//! line and column, the field, and (once the instance has been read) its index and app.
//!
//! The file is read by serde-saphyr into the derived [`Document`] and [`RawInstance`]: a
//! streaming parser, so no tree of the document is built. Each instance is checked and
//! converted as soon as it has been read, so a million of them are never held raw. Whatever
//! the derived types refuse (broken YAML, an unknown field, a key given twice, a list where a
//! value belongs, several documents) is refused anywhere in the file, even after an invalid
//! instance: those errors come first, then the first invalid instance.

use std::collections::HashSet;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::net::IpAddr;
use std::sync::Arc;

use serde::Deserialize;
use serde::de::{Deserializer, SeqAccess, Visitor};
use serde_saphyr::{Location, Spanned};

use crate::{Instance, InvalidInstance, Protocol, Registry, Status, check_vip, split_vips};

/// Why a YAML registry was refused.
#[derive(Debug, thiserror::Error)]
pub enum InvalidYaml {
    /// Not YAML, or not this form: broken syntax, an unknown field, a list or a mapping where
    /// a value belongs, no `instances`. The message ends with the line and column. Boxed, as
    /// is `Instance`: an error is rare and this keeps `Result`s small.
    #[error(transparent)]
    Syntax(Box<serde_saphyr::Error>),
    /// The file is empty.
    #[error("{0}")]
    Shape(String),
    /// An instance that is not valid, and where: the field's value, or the instance when the
    /// field is missing. The instance is what is wrong, not a cause beneath it: it is the
    /// message, with the place after it (and not a `source`, which would show it twice).
    #[error("{instance} at line {line}, column {column}")]
    Instance {
        instance: Box<InvalidInstance>,
        line: u64,
        column: u64,
    },
}

impl From<serde_saphyr::Error> for InvalidYaml {
    fn from(e: serde_saphyr::Error) -> InvalidYaml {
        InvalidYaml::Syntax(Box::new(e))
    }
}

/// Reads the short YAML form. Any invalid instance fails the whole file.
pub fn parse(yaml: &[u8]) -> Result<Registry, InvalidYaml> {
    let document: Option<Document> = serde_saphyr::from_slice_with_options(yaml, options())?;
    match document {
        None => Err(InvalidYaml::Shape(
            "the file is empty; expected `instances:` (write `instances: []` for none)".into(),
        )),
        Some(Document { instances: None }) => Ok(Registry::default()),
        Some(Document {
            instances: Some(InstanceList(registry)),
        }) => registry,
    }
}

/// serde-saphyr's defaults (duplicate keys refused, alias limits against expansion bombs),
/// except: the limits that grow with the file are lifted, because a registry of a million
/// instances is some 20 million YAML events and the default budget stops at one million; and
/// an error is one line, without a snippet of the file, for logs and `/debug/registry`.
fn options() -> serde_saphyr::Options {
    let mut budget = serde_saphyr::Budget::default();
    budget.max_events = usize::MAX;
    budget.max_nodes = usize::MAX;
    budget.max_total_scalar_bytes = usize::MAX;
    let mut options = serde_saphyr::Options::default();
    options.budget = Some(budget);
    options.with_snippet = false;
    options
}

/// The whole file: `instances` and nothing else.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Document {
    /// Required; `instances:` with no value is an empty list.
    #[serde(deserialize_with = "nullable")]
    instances: Option<InstanceList>,
}

/// A value that may be empty (`None`); with `deserialize_with`, leaving the field out is still
/// an error, unlike a plain `Option` field.
fn nullable<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    Option::deserialize(d)
}

/// One element of `instances`, as written: each field left out (`None`), or where its value
/// is and its text (`None` inside when the value is empty, as in `zone:`). Every scalar reads
/// as text; the types are checked in [`convert`], so that a wrong one names the instance.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawInstance {
    #[serde(default, deserialize_with = "written")]
    app: Field,
    #[serde(default, deserialize_with = "written")]
    ip: Field,
    #[serde(default, deserialize_with = "written")]
    port: Field,
    #[serde(default, deserialize_with = "written")]
    secure_port: Field,
    #[serde(default, deserialize_with = "written")]
    vip: Field,
    #[serde(default, deserialize_with = "written")]
    svip: Field,
    #[serde(default, deserialize_with = "written")]
    status: Field,
    #[serde(default, deserialize_with = "written")]
    zone: Field,
    #[serde(default, deserialize_with = "written")]
    id: Field,
    #[serde(default, deserialize_with = "written")]
    protocol: Field,
}

type Field = Option<Spanned<Option<String>>>;

/// A field that is written, even with an empty value; only a field left out is `None`.
fn written<'de, D: Deserializer<'de>>(d: D) -> Result<Field, D::Error> {
    Spanned::deserialize(d).map(Some)
}

/// The `instances` list, converted as it is read: the registry, or the first invalid
/// instance.
struct InstanceList(Result<Registry, InvalidYaml>);

impl<'de> Deserialize<'de> for InstanceList {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<InstanceList, D::Error> {
        d.deserialize_seq(InstanceListVisitor)
    }
}

struct InstanceListVisitor;

impl<'de> Visitor<'de> for InstanceListVisitor {
    type Value = InstanceList;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a list of instances")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<InstanceList, A::Error> {
        let mut instances = Vec::new();
        let mut ids = HashSet::new();
        let mut error = None;
        while let Some(raw) = seq.next_element::<Spanned<RawInstance>>()? {
            // After the first invalid instance the rest is still read, for what serde refuses.
            if error.is_some() {
                continue;
            }
            match convert(instances.len(), &raw) {
                Ok(inst) => {
                    let inst = Arc::new(inst);
                    if ids.insert(AppAndId(inst.clone())) {
                        instances.push(inst);
                    } else {
                        error = Some(duplicate_id(instances.len(), &inst, &raw.referenced));
                    }
                }
                Err(e) => error = Some(e),
            }
        }
        Ok(InstanceList(match error {
            Some(e) => Err(e),
            None => Ok(instances.into_iter().collect()),
        }))
    }
}

/// An instance, compared by app and id: no two instances of an app may share an id.
struct AppAndId(Arc<Instance>);

impl PartialEq for AppAndId {
    fn eq(&self, other: &AppAndId) -> bool {
        (&self.0.app, &self.0.instance_id) == (&other.0.app, &other.0.instance_id)
    }
}

impl Eq for AppAndId {}

impl Hash for AppAndId {
    fn hash<H: Hasher>(&self, state: &mut H) {
        (&self.0.app, &self.0.instance_id).hash(state);
    }
}

fn duplicate_id(index: usize, inst: &Instance, at: &Location) -> InvalidYaml {
    located(
        InvalidInstance {
            index,
            app: inst.app.to_string(),
            instance_id: Some(inst.instance_id.to_string()),
            field: "id".into(),
            reason: "another instance of this app has the same id; set `id` to tell them apart"
                .into(),
        },
        at,
    )
}

fn located(instance: InvalidInstance, at: &Location) -> InvalidYaml {
    InvalidYaml::Instance {
        instance: Box::new(instance),
        line: at.line(),
        column: at.column(),
    }
}

const TEXT: &str = "a string";
const PORT: &str = "a port number (1-65535)";

/// Checks one instance's fields, alone and together, and applies the defaults.
fn convert(index: usize, raw: &Spanned<RawInstance>) -> Result<Instance, InvalidYaml> {
    let r = &raw.value;
    // The app, as written, to name the instance in every error.
    let app_written = r
        .app
        .as_ref()
        .and_then(|f| f.value.as_deref())
        .unwrap_or_default();
    // At the field's value, or at the instance when the field is left out.
    let fail = |field: &str, place: &Field, reason: String| {
        located(
            InvalidInstance {
                index,
                app: app_written.to_owned(),
                instance_id: None,
                field: field.to_owned(),
                reason,
            },
            place.as_ref().map_or(&raw.referenced, |f| &f.referenced),
        )
    };
    let text = |field, place| text(field, place, &fail);
    let port = |field, place| port(field, place, &fail);

    // Each field's type first, then the fields together.
    let app_text = text("app", &r.app)?;
    let ip_text = text("ip", &r.ip)?;
    let port_number = port("port", &r.port)?;
    let secure_port = port("secure_port", &r.secure_port)?;
    let vip = text("vip", &r.vip)?;
    let svip = text("svip", &r.svip)?;
    let status = text("status", &r.status)?;
    let zone = text("zone", &r.zone)?;
    let id = text("id", &r.id)?;
    let protocol = text("protocol", &r.protocol)?;

    let app = app_text.map(str::trim).unwrap_or_default().to_owned();
    if app.is_empty() {
        return Err(fail("app", &r.app, "required".into()));
    }
    let ip = ip_address(ip_text, r, &fail)?;
    let ports = Ports {
        port: port_number,
        secure_port,
    };
    ports.check(r, svip, &fail)?;
    let (vips, svips) = ports.vip_lists(r, &app, vip, svip, &fail)?;
    let status = match status {
        None => Status::Up,
        Some(s) => Status::parse(s).ok_or_else(|| {
            let reason = format!("{s:?} is not one of UP, DOWN, STARTING, OUT_OF_SERVICE, UNKNOWN");
            fail("status", &r.status, reason)
        })?,
    };
    let zone = not_blank("zone", zone, &r.zone, &fail)?;
    let instance_id = match not_blank("id", id, &r.id, &fail)? {
        Some(id) => id,
        None => derived_id(&app, ip, port_number, secure_port),
    };
    let protocol = match protocol {
        None => Protocol::Auto,
        Some(p) => Protocol::parse(p).map_err(|reason| fail("protocol", &r.protocol, reason))?,
    };

    Ok(Instance {
        app: app.into(),
        instance_id: instance_id.into(),
        ip,
        port: port_number,
        secure_port,
        vips: vips.into_iter().map(Into::into).collect(),
        svips: svips.into_iter().map(Into::into).collect(),
        status,
        zone: zone.as_deref().map(crate::zone),
        protocol,
    })
}

type Fail<'a> = &'a dyn Fn(&str, &Field, String) -> InvalidYaml;

/// The required `ip` field, an IP address.
fn ip_address(text: Option<&str>, r: &RawInstance, fail: Fail) -> Result<IpAddr, InvalidYaml> {
    let text = text.ok_or_else(|| fail("ip", &r.ip, "required".into()))?;
    (text.trim().parse()).map_err(|_| fail("ip", &r.ip, format!("{text:?} is not an IP address")))
}

/// An optional text field, trimmed; written but blank is an error.
fn not_blank(
    field: &str,
    text: Option<&str>,
    place: &Field,
    fail: Fail,
) -> Result<Option<String>, InvalidYaml> {
    match text.map(str::trim) {
        Some("") => Err(fail(field, place, "empty".into())),
        text => Ok(text.map(str::to_owned)),
    }
}

/// An instance's two ports, as written.
struct Ports {
    port: Option<u16>,
    secure_port: Option<u16>,
}

impl Ports {
    /// Checks the ports together, and with `svip`.
    fn check(&self, r: &RawInstance, svip: Option<&str>, fail: Fail) -> Result<(), InvalidYaml> {
        for (field, number, place) in [
            ("port", self.port, &r.port),
            ("secure_port", self.secure_port, &r.secure_port),
        ] {
            if number == Some(0) {
                return Err(fail(field, place, "0 is not a usable port".into()));
            }
        }
        if self.port.is_none() && self.secure_port.is_none() {
            let reason = "an instance needs `port`, `secure_port` or both".into();
            return Err(fail("port", &r.port, reason));
        }
        if svip.is_some() && self.secure_port.is_none() {
            return Err(fail("svip", &r.svip, "set without `secure_port`".into()));
        }
        Ok(())
    }

    /// The VIPs and SVIPs an instance of `app` with these ports serves, from its `vip` and
    /// `svip` fields or the app's name.
    fn vip_lists(
        &self,
        r: &RawInstance,
        app: &str,
        vip: Option<&str>,
        svip: Option<&str>,
        fail: Fail,
    ) -> Result<(Vec<String>, Vec<String>), InvalidYaml> {
        // A `vip` that is written is checked even where it is not used; the app's name, only
        // where it names a VIP: an app that serves only an explicit `svip` may have any name.
        let vip_list = |field: &str, place: &Field, list: &str| {
            vip_list(list).map_err(|reason| fail(field, place, reason))
        };
        let app_names_vip = self.port.is_some() || (self.secure_port.is_some() && svip.is_none());
        let vip_names = match vip {
            Some(vip) => vip_list("vip", &r.vip, vip)?,
            None if app_names_vip => vip_list("app", &r.app, app)?,
            None => Vec::new(),
        };
        let vips = if self.port.is_some() {
            vip_names.clone()
        } else {
            Vec::new()
        };
        let svips = match (self.secure_port, svip) {
            (None, _) => Vec::new(),
            (Some(_), Some(svip)) => vip_list("svip", &r.svip, svip)?,
            (Some(_), None) => vip_names,
        };
        Ok((vips, svips))
    }
}

/// A field's text: `None` when it is left out, an error when it is empty.
fn text<'a>(field: &str, place: &'a Field, fail: Fail) -> Result<Option<&'a str>, InvalidYaml> {
    match place {
        None => Ok(None),
        Some(Spanned { value: None, .. }) => {
            Err(fail(field, place, format!("empty; expected {TEXT}")))
        }
        Some(Spanned { value: Some(s), .. }) => Ok(Some(s)),
    }
}

/// A field's port number.
fn port(field: &str, place: &Field, fail: Fail) -> Result<Option<u16>, InvalidYaml> {
    match text(field, place, fail)? {
        None => Ok(None),
        Some(s) if s.trim().is_empty() => {
            Err(fail(field, place, format!("empty; expected {PORT}")))
        }
        Some(s) => s
            .trim()
            .parse::<u16>()
            .map(Some)
            .map_err(|_| fail(field, place, format!("expected {PORT}, found {s}"))),
    }
}

/// The VIPs of a comma-separated list, each checked; why not, if one is not valid.
fn vip_list(list: &str) -> Result<Vec<String>, String> {
    let vips = split_vips(list);
    if vips.is_empty() {
        return Err("names no VIP".into());
    }
    for vip in &vips {
        check_vip(vip)?;
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
    use crate::testdata::read as testdata;

    fn instance_error(yaml: &str) -> InvalidInstance {
        match parse(yaml.as_bytes()) {
            Err(InvalidYaml::Instance { instance, .. }) => *instance,
            other => panic!("expected an instance error, got {other:?}"),
        }
    }

    #[test]
    fn the_example_registry_parses_with_its_defaults() {
        let reg = parse(&testdata("registry.yaml")).unwrap();
        assert_eq!(reg.len(), 5);

        let first = &reg.instances().next().unwrap();
        assert_eq!(&*first.app, "hello");
        assert_eq!(&*first.instance_id, "hello:127.0.0.1:8081:s8443");
        assert_eq!((first.port, first.secure_port), (Some(8081), Some(8443)));
        assert_eq!(
            first.vips,
            ["hello"].map(Arc::<str>::from),
            "vip defaults to app"
        );
        assert_eq!(
            first.svips,
            ["hello"].map(Arc::<str>::from),
            "svip defaults to vip"
        );
        assert_eq!(first.status, Status::Up);
        assert_eq!(first.zone.as_deref(), Some("local-a"));

        assert_eq!(
            reg.instances().nth(1).unwrap().vips,
            ["hello", "hello.internal"].map(Arc::<str>::from)
        );
        assert!(reg.instances().nth(1).unwrap().svips.is_empty());
        assert_eq!(reg.instances().nth(2).unwrap().status, Status::Down);

        let payments = &reg.instances().nth(3).unwrap();
        assert_eq!(payments.ip, "::1".parse::<IpAddr>().unwrap());
        assert!(payments.vips.is_empty(), "no port, so no VIP side");
        assert_eq!(payments.svips, ["payments.secure"].map(Arc::<str>::from));
        assert_eq!(&*payments.instance_id, "payments:[::1]:s9443");

        let greeter = &reg.instances().nth(4).unwrap();
        assert_eq!(&*greeter.instance_id, "greeter-canary");
        assert_eq!(greeter.vips, ["greeter-v2"].map(Arc::<str>::from));
        assert_eq!(greeter.status, Status::OutOfService);
    }

    #[test]
    fn protocol_declares_the_upstream_protocol_and_defaults_to_auto() {
        let reg = parse(
            b"instances: [{app: a, ip: 10.0.0.1, port: 80, protocol: http2}, {app: b, ip: 10.0.0.2, port: 80}]",
        )
        .unwrap();
        let protocols: Vec<Protocol> = reg.instances().map(|i| i.protocol).collect();
        assert_eq!(protocols, [Protocol::Http2, Protocol::Auto]);

        let err = instance_error("instances: [{app: a, ip: 10.0.0.1, port: 80, protocol: h3}]");
        assert_eq!((err.index, err.field.as_str()), (0, "protocol"));
        assert!(
            err.reason.contains("not one of auto, http1, http2"),
            "{err}"
        );
    }

    #[test]
    fn svip_defaults_to_an_explicit_vip() {
        let reg =
            parse(b"instances: [{app: hello, ip: 10.0.0.1, secure_port: 443, vip: Hi}]").unwrap();
        assert_eq!(
            reg.instances().next().unwrap().svips,
            ["hi"].map(Arc::<str>::from)
        );
        assert!(reg.instances().next().unwrap().vips.is_empty());
    }

    #[test]
    fn an_unknown_field_names_the_field_and_its_line() {
        let err = match parse(&testdata("registry-unknown-field.yaml")) {
            Err(InvalidYaml::Syntax(e)) => e,
            other => panic!("{other:?}"),
        };
        let at = err.location().expect("a location");
        assert_eq!((at.line(), at.column()), (8, 5));
        assert!(err.to_string().contains("unknown field `vipp`"), "{err}");
        assert!(err.to_string().contains("line 8, column 5"), "{err}");
    }

    #[test]
    fn a_bad_ip_names_the_instance_and_the_field() {
        let err = match parse(&testdata("registry-bad-ip.yaml")) {
            Err(InvalidYaml::Instance { instance, .. }) => instance,
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
    fn an_app_that_serves_only_an_explicit_svip_may_have_any_name() {
        // Found by fuzzing (fuzz/, registry_yaml): the app's name was checked as the default
        // VIP even where no VIP defaults to it, so this registry was refused.
        let reg = parse(
            b"instances: [{app: Payments Team, ip: 10.0.0.1, secure_port: 9443, svip: payments}]",
        )
        .unwrap();
        let inst = reg.instances().next().unwrap();
        assert_eq!(&*inst.app, "Payments Team");
        assert!(inst.vips.is_empty());
        assert_eq!(inst.svips, ["payments"].map(Arc::<str>::from));
        // Where the app's name is the VIP (a port, or the secure side's default), it is checked.
        for yaml in [
            "instances: [{app: Payments Team, ip: 10.0.0.1, port: 80, svip: payments, secure_port: 443}]",
            "instances: [{app: Payments Team, ip: 10.0.0.1, secure_port: 443}]",
        ] {
            assert_eq!(instance_error(yaml).field, "app", "{yaml}");
        }
        // A `vip` that is written is checked even where it is not used.
        let err = instance_error(
            "instances: [{app: payments, ip: 10.0.0.1, secure_port: 443, svip: payments, vip: 'bad!'}]",
        );
        assert_eq!(err.field, "vip");
    }

    #[test]
    fn an_unknown_status_is_refused_and_status_is_case_insensitive() {
        let err =
            instance_error("instances: [{app: hello, ip: 10.0.0.1, port: 80, status: sleepy}]");
        assert_eq!(err.field, "status");
        let reg =
            parse(b"instances: [{app: hello, ip: 10.0.0.1, port: 80, status: out_of_service}]")
                .unwrap();
        assert_eq!(reg.instances().next().unwrap().status, Status::OutOfService);
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
    fn errors_come_in_the_order_of_a_whole_document_check() {
        // Broken YAML after an invalid instance is still a syntax error...
        let yaml = "instances: [{app: a, ip: x, port: 80}, {app: b, app: c}]";
        assert!(matches!(
            parse(yaml.as_bytes()),
            Err(InvalidYaml::Syntax(_))
        ));
        // ...a wrong top level comes before an invalid instance...
        let yaml = "instances: [{app: a, ip: x, port: 80}]\nextra: 1";
        assert!(matches!(
            parse(yaml.as_bytes()),
            Err(InvalidYaml::Syntax(_))
        ));
        // ...and the first invalid instance comes first, whether a field or a repeated id.
        let err = instance_error(
            "instances: [{app: a, ip: 10.0.0.1, port: 80}, {app: a, ip: 10.0.0.1, port: 80}, {app: b}]",
        );
        assert_eq!((err.index, err.field.as_str()), (1, "id"));
        let err = instance_error(
            "instances: [{app: a, ip: 10.0.0.1, port: 80}, {app: b}, {app: a, ip: 10.0.0.1, port: 80}]",
        );
        assert_eq!((err.index, err.field.as_str()), (1, "ip"));
    }

    #[test]
    fn a_field_error_names_the_app_even_when_it_comes_later() {
        let err = instance_error("instances: [{port: http, app: hello, ip: 10.0.0.1}]");
        assert_eq!((err.app.as_str(), err.field.as_str()), ("hello", "port"));
        assert_eq!(err.reason, "expected a port number (1-65535), found http");
    }

    #[test]
    fn an_invalid_value_says_its_line_and_column() {
        match parse(&testdata("registry-bad-ip.yaml")) {
            Err(
                e @ InvalidYaml::Instance {
                    line: 9, column: 9, ..
                },
            ) => assert!(
                e.to_string()
                    .ends_with("is not an IP address at line 9, column 9"),
                "{e}"
            ),
            other => panic!("{other:?}"),
        }
        // A field left out: where its instance starts.
        match parse(b"instances:\n  - app: hello\n    port: 80\n") {
            Err(
                e @ InvalidYaml::Instance {
                    line: 2, column: 5, ..
                },
            ) => {
                assert!(e.to_string().contains("field `ip`: required"), "{e}")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_value_of_the_wrong_type_names_its_line() {
        // A scalar of the wrong type is the instance's error, with the field.
        match parse(b"instances:\n  - app: hello\n    ip: 10.0.0.1\n    port: http\n") {
            Err(InvalidYaml::Instance {
                instance,
                line: 4,
                column: 11,
            }) => assert_eq!(instance.field, "port"),
            other => panic!("{other:?}"),
        }
        // A list or a mapping where a value belongs, or a list that is not one, is the parser's.
        for (yaml, line) in [
            ("instances:\n  - app: hello\n    ip: [10.0.0.1]\n", 3),
            ("instances:\n  - app: hello\n    port: {n: 80}\n", 3),
            ("instances:\n  - 10.0.0.1\n", 2),
            ("instances: 3\n", 1),
        ] {
            match parse(yaml.as_bytes()) {
                Err(InvalidYaml::Syntax(e)) => {
                    assert_eq!(e.location().map(|at| at.line()), Some(line), "{yaml}: {e}");
                    assert!(e.to_string().contains(&format!("line {line}")), "{e}");
                }
                other => panic!("{yaml}: {other:?}"),
            }
        }
    }

    #[test]
    fn a_truncated_file_is_an_error() {
        // Cut inside a quoted value, inside a flow mapping, and after a key.
        for cut in [
            "instances:\n  - app: 'hel",
            "instances: [{app: hello, ip: 1",
            "instances:\n  - app: hello\n    ip",
        ] {
            assert!(
                matches!(parse(cut.as_bytes()), Err(InvalidYaml::Syntax(_))),
                "{cut}"
            );
        }
        // A cut at the end of a line can leave valid YAML; then the instance it cut is checked.
        let err = instance_error("instances:\n  - app: hello\n    ip: 10.0.0.1\n");
        assert_eq!(err.field, "port");
    }

    #[test]
    fn a_missing_instances_list_or_several_documents_are_refused() {
        for yaml in ["{}", "zone: a", "instances: []\n---\ninstances: []\n"] {
            assert!(
                matches!(parse(yaml.as_bytes()), Err(InvalidYaml::Syntax(_))),
                "{yaml}"
            );
        }
        assert_eq!(parse(b"instances:\n").unwrap(), Registry::default());
    }

    #[test]
    fn broken_yaml_is_a_syntax_error() {
        assert!(matches!(
            parse(&testdata("broken.yaml")),
            Err(InvalidYaml::Syntax(_))
        ));
    }
}
