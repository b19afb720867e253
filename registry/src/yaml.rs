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
//!     protocol: http2       # optional: auto (default), http1 or http2 (see `Protocol`)
//! ```
//!
//! Strict, because a person wrote it: an unknown field, a missing or ill-typed value, an
//! invalid VIP, or two instances with the same id fail the whole file, and the error names
//! the instance (index and app), the field and the reason.
//!
//! The file is read in one pass, straight from the YAML events: each instance is checked and
//! converted as soon as its mapping has been read, so no tree of the whole document is ever
//! built (a registry of a million instances would take gigabytes as a `serde_yaml::Value`).
//! Only the values of one instance's fields are held as small `Value`s, so that every error
//! can name its field and show what was found. Whatever a `Value` tree would refuse (broken
//! YAML, a key given twice, several documents) is refused the same way, and anywhere in the
//! file, even after an invalid instance: syntax errors come first, then the shape of the top
//! level, then the first invalid instance.

use std::collections::HashSet;
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use serde::Deserialize;
use serde::de::value::{
    EnumAccessDeserializer, MapAccessDeserializer, SeqAccessDeserializer, UnitDeserializer,
};
use serde::de::{
    self, DeserializeOwned, DeserializeSeed, Deserializer, EnumAccess, IntoDeserializer, MapAccess,
    SeqAccess, Visitor,
};
use serde_yaml::Value;

use crate::{Instance, InvalidInstance, Protocol, Registry, Status, check_vip, split_vips};

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
    "protocol",
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
    let top = Any(TopShape).deserialize(serde_yaml::Deserializer::from_slice(yaml))?;
    let (unknown, instances) = match top {
        Top::Null => {
            return Err(InvalidYaml::Shape(
                "the file is empty; expected `instances:` (write `instances: []` for none)".into(),
            ));
        }
        Top::NotMapping => {
            return Err(InvalidYaml::Shape(
                "the top level must be a mapping with `instances`".into(),
            ));
        }
        Top::Mapping { unknown, instances } => (unknown, instances),
    };
    if let Some(key) = unknown {
        return Err(InvalidYaml::Shape(format!(
            "unknown top-level field {}; only `instances` is allowed",
            describe_key(&key)
        )));
    }
    match instances {
        Some(Instances::List(Ok(registry))) => Ok(registry),
        Some(Instances::List(Err(e))) => Err(e.into()),
        Some(Instances::Null) => Ok(Registry::default()),
        Some(Instances::NotList) => Err(InvalidYaml::Shape("`instances` must be a list".into())),
        None => Err(InvalidYaml::Shape("no `instances` list at the top".into())),
    }
}

fn describe_key(key: &Value) -> String {
    match key {
        Value::String(s) => format!("`{s}`"),
        other => format!("{other:?}"),
    }
}

/// What is expected of one YAML node: a mapping or a sequence may be read as it comes (the
/// default builds a `Value` of it); a string may be looked at without copying it; anything
/// else arrives as the `Value` serde_yaml would have built.
trait Shape<'de>: Sized {
    type Out;

    fn value<E: de::Error>(self, value: Value) -> Result<Self::Out, E>;

    fn str<E: de::Error>(self, s: &str) -> Result<Self::Out, E> {
        self.value(Value::String(s.to_owned()))
    }

    fn seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Out, A::Error> {
        let value = Value::deserialize(SeqAccessDeserializer::new(seq))?;
        self.value(value)
    }

    fn map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Out, A::Error> {
        let value = Value::deserialize(MapAccessDeserializer::new(map))?;
        self.value(value)
    }
}

/// Reads any YAML node into a [`Shape`]. Whatever the shape does not read itself goes through
/// `Value`'s own `Deserialize`, so it is accepted or refused exactly as in a `Value` tree.
struct Any<S>(S);

impl<'de, S: Shape<'de>> DeserializeSeed<'de> for Any<S> {
    type Value = S::Out;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<S::Out, D::Error> {
        deserializer.deserialize_any(self)
    }
}

fn forward<'de, S, D>(shape: S, deserializer: D) -> Result<S::Out, D::Error>
where
    S: Shape<'de>,
    D: Deserializer<'de>,
{
    let value = Value::deserialize(deserializer)?;
    shape.value(value)
}

impl<'de, S: Shape<'de>> Visitor<'de> for Any<S> {
    type Value = S::Out;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any YAML value")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<S::Out, E> {
        forward(self.0, v.into_deserializer())
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<S::Out, E> {
        forward(self.0, v.into_deserializer())
    }

    fn visit_i128<E: de::Error>(self, v: i128) -> Result<S::Out, E> {
        forward(self.0, v.into_deserializer())
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<S::Out, E> {
        forward(self.0, v.into_deserializer())
    }

    fn visit_u128<E: de::Error>(self, v: u128) -> Result<S::Out, E> {
        forward(self.0, v.into_deserializer())
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<S::Out, E> {
        forward(self.0, v.into_deserializer())
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<S::Out, E> {
        self.0.str(v)
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<S::Out, E> {
        self.0.str(&v)
    }

    fn visit_unit<E: de::Error>(self) -> Result<S::Out, E> {
        forward(self.0, UnitDeserializer::new())
    }

    fn visit_none<E: de::Error>(self) -> Result<S::Out, E> {
        forward(self.0, UnitDeserializer::new())
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<S::Out, D::Error> {
        forward(self.0, deserializer)
    }

    fn visit_newtype_struct<D: Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<S::Out, D::Error> {
        forward(self.0, deserializer)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<S::Out, A::Error> {
        self.0.seq(seq)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<S::Out, A::Error> {
        self.0.map(map)
    }

    fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<S::Out, A::Error> {
        forward(self.0, EnumAccessDeserializer::new(data))
    }
}

/// serde_yaml's own words for a key given twice in a mapping.
fn duplicate_key<E: de::Error>(key: &Value) -> E {
    let which = match key {
        Value::Null => "with null key".to_owned(),
        Value::Bool(b) => format!("with key `{b}`"),
        Value::Number(n) => format!("with key {n}"),
        Value::String(s) => format!("with key {s:?}"),
        Value::Sequence(_) | Value::Mapping(_) | Value::Tagged(_) => "in YAML map".to_owned(),
    };
    E::custom(format_args!("duplicate entry {which}"))
}

/// The document's top level.
enum Top {
    Null,
    NotMapping,
    Mapping {
        /// The key a `Value` mapping would name first once `instances` is removed from it.
        unknown: Option<Value>,
        instances: Option<Instances>,
    },
}

struct TopShape;

impl<'de> Shape<'de> for TopShape {
    type Out = Top;

    fn value<E: de::Error>(self, value: Value) -> Result<Top, E> {
        Ok(match value {
            Value::Null => Top::Null,
            _ => Top::NotMapping,
        })
    }

    fn map<A: MapAccess<'de>>(self, mut map: A) -> Result<Top, A::Error> {
        // Every key, in order: there are few at the top.
        let mut keys: Vec<Value> = Vec::new();
        let mut instances = None;
        while let Some(key) = map.next_key::<Value>()? {
            if keys.contains(&key) {
                return Err(duplicate_key(&key));
            }
            if is_instances(&key) {
                instances = Some(map.next_value_seed(Any(InstancesShape))?);
            } else {
                map.next_value::<Value>()?;
            }
            keys.push(key);
        }
        // As `Mapping::remove` (a swap remove) left them.
        if let Some(at) = keys.iter().position(is_instances) {
            keys.swap_remove(at);
        }
        Ok(Top::Mapping {
            unknown: keys.into_iter().next(),
            instances,
        })
    }
}

fn is_instances(key: &Value) -> bool {
    matches!(key, Value::String(s) if s == "instances")
}

/// The value of `instances`.
enum Instances {
    /// A list, read as it came: the registry, or the first invalid instance.
    List(Result<Registry, InvalidInstance>),
    Null,
    NotList,
}

struct InstancesShape;

impl<'de> Shape<'de> for InstancesShape {
    type Out = Instances;

    fn value<E: de::Error>(self, value: Value) -> Result<Instances, E> {
        Ok(match value {
            Value::Null => Instances::Null,
            _ => Instances::NotList,
        })
    }

    fn seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Instances, A::Error> {
        let mut instances = Vec::new();
        let mut error = None;
        while let Some(inst) = seq.next_element_seed(Any(InstanceShape {
            index: instances.len(),
        }))? {
            match inst {
                Ok(inst) => instances.push(Arc::new(inst)),
                Err(e) => {
                    error = Some(e);
                    break;
                }
            }
        }
        if error.is_some() {
            // The rest of the list must still be valid YAML, as in a `Value` tree.
            while seq.next_element::<Value>()?.is_some() {}
        }
        // Two instances with the same id, before the first invalid instance, come first.
        if let Some(e) = first_duplicate_id(&instances) {
            return Ok(Instances::List(Err(e)));
        }
        Ok(Instances::List(match error {
            Some(e) => Err(e),
            None => Ok(instances.into_iter().collect()),
        }))
    }
}

/// The first instance whose app and id an earlier instance already has.
fn first_duplicate_id(instances: &[Arc<Instance>]) -> Option<InvalidInstance> {
    let mut ids = HashSet::with_capacity(instances.len());
    let (index, inst) = instances
        .iter()
        .enumerate()
        .find(|(_, inst)| !ids.insert((inst.app.as_str(), inst.instance_id.as_str())))?;
    Some(InvalidInstance {
        index,
        app: inst.app.clone(),
        instance_id: Some(inst.instance_id.clone()),
        field: "id".into(),
        reason: "another instance of this app has the same id; set `id` to tell them apart".into(),
    })
}

/// One element of `instances`, checked and converted as soon as it has been read.
struct InstanceShape {
    index: usize,
}

impl<'de> Shape<'de> for InstanceShape {
    type Out = Result<Instance, InvalidInstance>;

    fn value<E: de::Error>(self, value: Value) -> Result<Self::Out, E> {
        Ok(Err(InvalidInstance {
            index: self.index,
            app: value
                .get("app")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
            instance_id: None,
            field: "instance".into(),
            reason: "expected a mapping of fields".into(),
        }))
    }

    fn map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Out, A::Error> {
        let mut f = Fields::default();
        let mut seen = [false; FIELDS.len()];
        let mut other_keys: Vec<Value> = Vec::new();
        // The first field in error; the rest is still read, for the app and for syntax.
        let mut first_error: Option<(String, String)> = None;
        // The app as `Value::as_str` reads it, when it is not a plain string.
        let mut app_hint = None;
        while let Some(key) = map.next_key_seed(Any(KeyShape))? {
            let result = match key {
                Key::Field(i) => {
                    if std::mem::replace(&mut seen[i], true) {
                        return Err(duplicate_key(&Value::String(FIELDS[i].into())));
                    }
                    let value: Value = map.next_value()?;
                    if FIELDS[i] == "app" && !matches!(value, Value::String(_)) {
                        app_hint = value.as_str().map(str::to_owned);
                    }
                    read_field(&mut f, FIELDS[i], value)
                }
                Key::Other(key) => {
                    if other_keys.contains(&key) {
                        return Err(duplicate_key(&key));
                    }
                    map.next_value::<Value>()?;
                    let error = match &key {
                        Value::String(name) => (
                            name.clone(),
                            format!("unknown field; expected one of {}", FIELDS.join(", ")),
                        ),
                        other => (format!("{other:?}"), "field names must be strings".into()),
                    };
                    other_keys.push(key);
                    Err(error)
                }
            };
            if let Err(e) = result {
                first_error.get_or_insert(e);
            }
        }
        if let Some((field, reason)) = first_error {
            return Ok(Err(InvalidInstance {
                index: self.index,
                app: f.app.or(app_hint).unwrap_or_default(),
                instance_id: None,
                field,
                reason,
            }));
        }
        Ok(convert(self.index, f))
    }
}

/// A key of an instance's mapping: one of [`FIELDS`] (by position), or anything else.
enum Key {
    Field(usize),
    Other(Value),
}

struct KeyShape;

impl<'de> Shape<'de> for KeyShape {
    type Out = Key;

    fn value<E: de::Error>(self, value: Value) -> Result<Key, E> {
        Ok(Key::Other(value))
    }

    fn str<E: de::Error>(self, s: &str) -> Result<Key, E> {
        Ok(match FIELDS.iter().position(|f| *f == s) {
            Some(i) => Key::Field(i),
            None => Key::Other(Value::String(s.to_owned())),
        })
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
    protocol: Option<String>,
}

/// A field in error: its name and the reason.
type FieldError = (String, String);

const TEXT: &str = "a string";
const PORT: &str = "a port number (1-65535)";

fn read_field(f: &mut Fields, field: &str, value: Value) -> Result<(), FieldError> {
    match field {
        "app" => f.app = text(field, value)?,
        "ip" => f.ip = text(field, value)?,
        "port" => f.port = port(field, value)?,
        "secure_port" => f.secure_port = port(field, value)?,
        "vip" => f.vip = text(field, value)?,
        "svip" => f.svip = text(field, value)?,
        "status" => f.status = text(field, value)?,
        "zone" => f.zone = text(field, value)?,
        "id" => f.id = text(field, value)?,
        "protocol" => f.protocol = text(field, value)?,
        _ => unreachable!("{field} is not in FIELDS"),
    }
    Ok(())
}

fn text(field: &str, value: Value) -> Result<Option<String>, FieldError> {
    match value {
        Value::String(s) => Ok(Some(s)),
        other => typed(field, other, TEXT),
    }
}

fn port(field: &str, value: Value) -> Result<Option<u16>, FieldError> {
    match &value {
        Value::Number(n) => match n.as_u64().map(u16::try_from) {
            Some(Ok(p)) => Ok(Some(p)),
            _ => typed(field, value, PORT),
        },
        _ => typed(field, value, PORT),
    }
}

/// Any value, as serde_yaml converts it to `T`.
fn typed<T: DeserializeOwned>(
    field: &str,
    value: Value,
    expected: &str,
) -> Result<Option<T>, FieldError> {
    if value.is_null() {
        return Err((field.to_owned(), format!("empty; expected {expected}")));
    }
    serde_yaml::from_value(value.clone())
        .map(Some)
        .map_err(|_| {
            (
                field.to_owned(),
                format!("expected {expected}, found {}", show(&value)),
            )
        })
}

/// Checks one instance's fields together and applies the defaults.
fn convert(index: usize, f: Fields) -> Result<Instance, InvalidInstance> {
    // The app, as written, to name the instance in every error.
    let fail = |field: &str, reason: String| InvalidInstance {
        index,
        app: f.app.clone().unwrap_or_default(),
        instance_id: None,
        field: field.to_owned(),
        reason,
    };

    let app = f
        .app
        .as_deref()
        .map(str::trim)
        .unwrap_or_default()
        .to_owned();
    if app.is_empty() {
        return Err(fail("app", "required".into()));
    }
    let ip_text =
        f.ip.as_deref()
            .ok_or_else(|| fail("ip", "required".into()))?;
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

    // A `vip` that is written is checked even where it is not used; the app's name, only
    // where it names a VIP: an app that serves only an explicit `svip` may have any name.
    let app_names_vip = f.port.is_some() || (f.secure_port.is_some() && f.svip.is_none());
    let vip_names = match &f.vip {
        Some(vip) => vip_list("vip", vip, &fail)?,
        None if app_names_vip => vip_list("app", &app, &fail)?,
        None => Vec::new(),
    };
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
    let zone = match f.zone.as_deref() {
        Some(z) if z.trim().is_empty() => return Err(fail("zone", "empty".into())),
        z => z.map(|z| z.trim().to_owned()),
    };
    let instance_id = match f.id.as_deref() {
        Some(id) if id.trim().is_empty() => return Err(fail("id", "empty".into())),
        Some(id) => id.trim().to_owned(),
        None => derived_id(&app, ip, f.port, f.secure_port),
    };

    let protocol = match f.protocol.as_deref() {
        None => Protocol::Auto,
        Some(p) => Protocol::parse(p).map_err(|reason| fail("protocol", reason))?,
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
        protocol,
    })
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
    use crate::testdata::read as testdata;

    fn instance_error(yaml: &str) -> InvalidInstance {
        match parse(yaml.as_bytes()) {
            Err(InvalidYaml::Instance(e)) => *e,
            other => panic!("expected an instance error, got {other:?}"),
        }
    }

    #[test]
    fn the_example_registry_parses_with_its_defaults() {
        let reg = parse(&testdata("registry.yaml")).unwrap();
        assert_eq!(reg.len(), 5);

        let first = &reg.instances().next().unwrap();
        assert_eq!(first.app, "hello");
        assert_eq!(first.instance_id, "hello:127.0.0.1:8081:s8443");
        assert_eq!((first.port, first.secure_port), (Some(8081), Some(8443)));
        assert_eq!(first.vips, ["hello"], "vip defaults to app");
        assert_eq!(first.svips, ["hello"], "svip defaults to vip");
        assert_eq!(first.status, Status::Up);
        assert_eq!(first.zone.as_deref(), Some("local-a"));

        assert_eq!(
            reg.instances().nth(1).unwrap().vips,
            ["hello", "hello.internal"]
        );
        assert!(reg.instances().nth(1).unwrap().svips.is_empty());
        assert_eq!(reg.instances().nth(2).unwrap().status, Status::Down);

        let payments = &reg.instances().nth(3).unwrap();
        assert_eq!(payments.ip, "::1".parse::<IpAddr>().unwrap());
        assert!(payments.vips.is_empty(), "no port, so no VIP side");
        assert_eq!(payments.svips, ["payments.secure"]);
        assert_eq!(payments.instance_id, "payments:[::1]:s9443");

        let greeter = &reg.instances().nth(4).unwrap();
        assert_eq!(greeter.instance_id, "greeter-canary");
        assert_eq!(greeter.vips, ["greeter-v2"]);
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
        assert_eq!(reg.instances().next().unwrap().svips, ["hi"]);
        assert!(reg.instances().next().unwrap().vips.is_empty());
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
    fn an_app_that_serves_only_an_explicit_svip_may_have_any_name() {
        // Found by fuzzing (fuzz/, registry_yaml): the app's name was checked as the default
        // VIP even where no VIP defaults to it, so this registry was refused.
        let reg = parse(
            b"instances: [{app: Payments Team, ip: 10.0.0.1, secure_port: 9443, svip: payments}]",
        )
        .unwrap();
        let inst = reg.instances().next().unwrap();
        assert_eq!(inst.app, "Payments Team");
        assert!(inst.vips.is_empty());
        assert_eq!(inst.svips, ["payments"]);
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
        assert!(matches!(parse(yaml.as_bytes()), Err(InvalidYaml::Shape(_))));
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
    fn broken_yaml_is_a_syntax_error() {
        assert!(matches!(
            parse(&testdata("broken.yaml")),
            Err(InvalidYaml::Syntax(_))
        ));
    }
}
