//! Eureka's JSON wire format (`GET /eureka/apps`, `/apps/delta`, registrations), kept at the
//! edge: serde types as Eureka writes them, converted to the plain [`Registry`] here.
//!
//! Real Eureka servers (Netflix's Jackson codec, Spring Cloud, and other implementations) are
//! not consistent, so reading is lenient where they differ: `application` and `instance` may
//! be one object instead of a list; numbers may be strings (`"$": "8080"`,
//! `"versions__delta": 1`); booleans may be strings (`"@enabled": "true"`); `metadata` may
//! hold only `{"@class": "java.util.Collections$EmptyMap"}`; unknown fields are kept in
//! `other` and written back. Writing follows Netflix's codec (`"@enabled": "true"`, numeric
//! `$`), so a standard Eureka client can read what an embedded server writes.
//!
//! [`parse_document`] skips an instance it cannot read, with a warning, instead of failing the
//! whole document: one odd registration on a real server must not blind the mesh.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};

use odmesh_registry::file::JsonError;
use odmesh_registry::{
    Group, Instance, InvalidInstance, Parsed, Protocol, Registry, Status, check_vip, split_vips,
};

/// The instance metadata entry that declares its [`Protocol`]: `auto`, `http1` or `http2`.
pub const PROTOCOL_METADATA_KEY: &str = "odmesh.protocol";

/// The whole answer of `GET /apps` or `GET /apps/delta`: `{"applications": {...}}`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
pub struct ApplicationsDocument {
    pub applications: Applications,
}

/// The answer of `GET /apps/{APP}`: `{"application": {...}}`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
pub struct ApplicationDocument {
    pub application: Application,
}

/// A registration body (`POST /apps/{APP}`) or the answer of `GET /apps/{APP}/{ID}`:
/// `{"instance": {...}}`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
pub struct InstanceDocument {
    pub instance: InstanceInfo,
}

/// Every application a Eureka server knows, or the changes of a delta.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(default)]
pub struct Applications {
    /// The registry version of a delta; `"-1"` or absent for a full fetch on some servers.
    #[serde(rename = "versions__delta")]
    #[serde(with = "lenient::text", skip_serializing_if = "Option::is_none")]
    pub versions_delta: Option<String>,
    /// The reconcile hash code of the server's full registry after this document (for a
    /// delta: after applying it). See [`reconcile_hash_code`].
    #[serde(rename = "apps__hashcode")]
    #[serde(with = "lenient::text", skip_serializing_if = "Option::is_none")]
    pub apps_hashcode: Option<String>,
    #[serde(deserialize_with = "lenient::one_or_many")]
    pub application: Vec<Application>,
    /// Fields this module does not know, kept as read.
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

/// One application: its name (Eureka uppercases it) and its instances.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(default)]
pub struct Application {
    #[serde(deserialize_with = "lenient::string")]
    pub name: String,
    #[serde(deserialize_with = "lenient::one_or_many")]
    pub instance: Vec<InstanceInfo>,
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

/// What a delta says happened to an instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ActionType {
    Added,
    Modified,
    Deleted,
}

/// One instance, as Eureka's `InstanceInfo` JSON. Every field is optional on reading; the
/// helper methods apply Eureka's defaults.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(default, rename_all = "camelCase")]
pub struct InstanceInfo {
    #[serde(with = "lenient::text", skip_serializing_if = "Option::is_none")]
    pub instance_id: Option<String>,
    #[serde(with = "lenient::text", skip_serializing_if = "Option::is_none")]
    pub host_name: Option<String>,
    #[serde(with = "lenient::text", skip_serializing_if = "Option::is_none")]
    pub app: Option<String>,
    #[serde(with = "lenient::text", skip_serializing_if = "Option::is_none")]
    pub app_group_name: Option<String>,
    #[serde(with = "lenient::text", skip_serializing_if = "Option::is_none")]
    pub ip_addr: Option<String>,
    #[serde(with = "lenient::text", skip_serializing_if = "Option::is_none")]
    pub sid: Option<String>,
    /// `UP`, `DOWN`, `STARTING`, `OUT_OF_SERVICE` or `UNKNOWN`; see [`InstanceInfo::status`].
    #[serde(with = "lenient::text", skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    /// The status override an operator set (`overriddenStatus`, newer servers).
    #[serde(with = "lenient::text", skip_serializing_if = "Option::is_none")]
    pub overridden_status: Option<String>,
    /// The same, as older servers spell it (`overriddenstatus`); some servers write both.
    #[serde(rename = "overriddenstatus")]
    #[serde(with = "lenient::text", skip_serializing_if = "Option::is_none")]
    pub overriddenstatus_legacy: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<Port>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secure_port: Option<Port>,
    #[serde(with = "lenient::number", skip_serializing_if = "Option::is_none")]
    pub country_id: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_center_info: Option<DataCenterInfo>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease_info: Option<LeaseInfo>,
    /// Free-form metadata; values that are not strings are kept as their JSON text, and
    /// Jackson's `@class` marker is dropped.
    #[serde(deserialize_with = "lenient::metadata")]
    pub metadata: Metadata,
    #[serde(with = "lenient::text", skip_serializing_if = "Option::is_none")]
    pub home_page_url: Option<String>,
    #[serde(with = "lenient::text", skip_serializing_if = "Option::is_none")]
    pub status_page_url: Option<String>,
    #[serde(with = "lenient::text", skip_serializing_if = "Option::is_none")]
    pub health_check_url: Option<String>,
    #[serde(with = "lenient::text", skip_serializing_if = "Option::is_none")]
    pub secure_health_check_url: Option<String>,
    /// Comma-separated VIPs served on `port`.
    #[serde(with = "lenient::text", skip_serializing_if = "Option::is_none")]
    pub vip_address: Option<String>,
    /// Comma-separated SVIPs served on `securePort`.
    #[serde(with = "lenient::text", skip_serializing_if = "Option::is_none")]
    pub secure_vip_address: Option<String>,
    /// Written as a string (`"false"`), as Netflix's codec does.
    #[serde(with = "lenient::flag", skip_serializing_if = "Option::is_none")]
    pub is_coordinating_discovery_server: Option<bool>,
    /// Milliseconds since the epoch; written as a string, as Netflix's codec does.
    #[serde(with = "lenient::stamp", skip_serializing_if = "Option::is_none")]
    pub last_updated_timestamp: Option<u64>,
    /// Milliseconds since the epoch; written as a string, as Netflix's codec does.
    #[serde(with = "lenient::stamp", skip_serializing_if = "Option::is_none")]
    pub last_dirty_timestamp: Option<u64>,
    /// Set on the instances of a delta document.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub action_type: Option<ActionType>,
    #[serde(with = "lenient::text", skip_serializing_if = "Option::is_none")]
    pub asg_name: Option<String>,
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

/// Free-form metadata, key → value, in key order. One sorted list, not a tree: an instance
/// carries a few entries, and a registry holds a million instances (a `BTreeMap` of one
/// entry allocates room for eleven).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Metadata(Vec<(String, String)>);

impl Metadata {
    fn find(&self, key: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|(k, _)| k.as_str().cmp(key))
    }

    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<&String> {
        self.find(key).ok().map(|i| &self.0[i].1)
    }

    /// Whether `key` has a value.
    pub fn contains_key(&self, key: &str) -> bool {
        self.find(key).is_ok()
    }

    /// Sets `key` to `value`; the value it had, if any.
    pub fn insert(&mut self, key: String, value: String) -> Option<String> {
        match self.find(&key) {
            Ok(i) => Some(std::mem::replace(&mut self.0[i].1, value)),
            Err(i) => {
                self.0.insert(i, (key, value));
                None
            }
        }
    }

    /// Every entry, in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &String)> {
        self.0.iter().map(|(k, v)| (k, v))
    }

    /// Removes `key`; the value it had, if any.
    pub fn remove(&mut self, key: &str) -> Option<String> {
        self.find(key).ok().map(|i| self.0.remove(i).1)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn clear(&mut self) {
        self.0.clear();
    }
}

impl Extend<(String, String)> for Metadata {
    fn extend<I: IntoIterator<Item = (String, String)>>(&mut self, entries: I) {
        for (key, value) in entries {
            self.insert(key, value);
        }
    }
}

impl FromIterator<(String, String)> for Metadata {
    /// The entries, the last value of a key repeated winning.
    fn from_iter<I: IntoIterator<Item = (String, String)>>(entries: I) -> Metadata {
        let mut all: Vec<(String, String)> = entries.into_iter().collect();
        // Stable: equal keys stay in order, and the last of them is kept.
        all.sort_by(|a, b| a.0.cmp(&b.0));
        let mut kept: Vec<(String, String)> = Vec::with_capacity(all.len());
        for entry in all {
            match kept.last_mut() {
                Some(last) if last.0 == entry.0 => *last = entry,
                _ => kept.push(entry),
            }
        }
        kept.shrink_to_fit();
        Metadata(kept)
    }
}

impl<const N: usize> From<[(String, String); N]> for Metadata {
    fn from(entries: [(String, String); N]) -> Metadata {
        entries.into_iter().collect()
    }
}

impl Serialize for Metadata {
    /// As a JSON object.
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.iter())
    }
}

/// A port and whether it is enabled: `{"$": 8080, "@enabled": "true"}`.
///
/// Read leniently: `$` as a number or a string, `@enabled` as a string or a bool, or a bare
/// number for the whole port. `@enabled` absent means Eureka's default for the kind of port
/// (see [`InstanceInfo::plain_port`], [`InstanceInfo::secure_port`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Port {
    #[serde(rename = "$")]
    pub port: u16,
    #[serde(rename = "@enabled")]
    #[serde(with = "lenient::flag", skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
}

impl Port {
    /// An enabled port, as a server writes it.
    pub fn enabled(port: u16) -> Port {
        Port {
            port,
            enabled: Some(true),
        }
    }

    /// A disabled port, as a server writes it.
    pub fn disabled(port: u16) -> Port {
        Port {
            port,
            enabled: Some(false),
        }
    }
}

impl<'de> Deserialize<'de> for Port {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Port, D::Error> {
        use serde::de::Error;
        match Value::deserialize(d)? {
            Value::Object(obj) => {
                let port = obj
                    .get("$")
                    .ok_or_else(|| D::Error::custom("port has no `$`"))
                    .and_then(|v| lenient::u16_of(v).map_err(D::Error::custom))?;
                let enabled = match obj.get("@enabled") {
                    None | Some(Value::Null) => None,
                    Some(v) => Some(lenient::bool_of(v).map_err(D::Error::custom)?),
                };
                Ok(Port { port, enabled })
            }
            other => Ok(Port {
                port: lenient::u16_of(&other).map_err(D::Error::custom)?,
                enabled: None,
            }),
        }
    }
}

/// Where the instance runs: `{"@class": "...", "name": "MyOwn" | "Amazon", "metadata": {...}}`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(default)]
pub struct DataCenterInfo {
    #[serde(rename = "@class")]
    #[serde(with = "lenient::text", skip_serializing_if = "Option::is_none")]
    pub class: Option<String>,
    #[serde(with = "lenient::text", skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// For Amazon: `availability-zone`, `instance-id`, `local-ipv4`, ...
    #[serde(
        deserialize_with = "lenient::metadata",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub metadata: BTreeMap<String, String>,
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

impl DataCenterInfo {
    /// What a Eureka client outside a cloud sends.
    pub fn my_own() -> DataCenterInfo {
        DataCenterInfo {
            class: Some("com.netflix.appinfo.InstanceInfo$DefaultDataCenterInfo".into()),
            name: Some("MyOwn".into()),
            ..DataCenterInfo::default()
        }
    }
}

/// The lease of an instance. Durations in seconds, timestamps in ms since the epoch.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(default, rename_all = "camelCase")]
pub struct LeaseInfo {
    #[serde(with = "lenient::number", skip_serializing_if = "Option::is_none")]
    pub renewal_interval_in_secs: Option<u64>,
    #[serde(with = "lenient::number", skip_serializing_if = "Option::is_none")]
    pub duration_in_secs: Option<u64>,
    #[serde(with = "lenient::number", skip_serializing_if = "Option::is_none")]
    pub registration_timestamp: Option<u64>,
    #[serde(with = "lenient::number", skip_serializing_if = "Option::is_none")]
    pub last_renewal_timestamp: Option<u64>,
    #[serde(with = "lenient::number", skip_serializing_if = "Option::is_none")]
    pub eviction_timestamp: Option<u64>,
    #[serde(with = "lenient::number", skip_serializing_if = "Option::is_none")]
    pub service_up_timestamp: Option<u64>,
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

/// Why a Eureka JSON document could not be read at all.
#[derive(Debug, thiserror::Error)]
pub enum InvalidDocument {
    #[error("not valid JSON")]
    Json(#[from] serde_json::Error),
    #[error("not a Eureka applications document: {0}")]
    Shape(String),
    /// Not valid JSON, as a streamed read finds it (`wire::read`).
    #[error("not valid JSON: {0}")]
    Syntax(String),
    /// The document's bytes could not be read (a gzip answer that does not decode).
    #[error("the answer could not be read")]
    Unreadable(#[source] std::io::Error),
}

/// A Eureka document as read, with the instances that had to be skipped.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ParsedApplications {
    /// The document, without the skipped instances.
    pub applications: Applications,
    /// Instances that could not be read at all (a field of the wrong type or shape).
    pub rejected: Vec<InvalidInstance>,
}

/// Reads a `{"applications": ...}` document (full or delta). An instance that cannot be
/// read is skipped and reported in `rejected`; only a document that is not JSON, or not
/// shaped like Eureka's, fails.
pub fn parse_document(json: &[u8]) -> Result<ParsedApplications, InvalidDocument> {
    let root: Value = serde_json::from_slice(json)?;
    let Value::Object(mut root) = root else {
        return Err(InvalidDocument::Shape(
            "the top level is not an object".into(),
        ));
    };
    let mut apps = match root.remove("applications") {
        Some(Value::Object(apps)) => apps,
        Some(_) => {
            return Err(InvalidDocument::Shape(
                "`applications` is not an object".into(),
            ));
        }
        None => {
            return Err(InvalidDocument::Shape(
                "no `applications` at the top level".into(),
            ));
        }
    };
    let app_values = match apps.remove("application") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(list)) => list,
        Some(one) => vec![one],
    };
    let mut applications: Applications = serde_json::from_value(Value::Object(apps))
        .map_err(|e| InvalidDocument::Shape(format!("`applications`: {e}")))?;

    let mut rejected = Vec::new();
    for (app_index, app_value) in app_values.into_iter().enumerate() {
        let Value::Object(mut app_obj) = app_value else {
            return Err(InvalidDocument::Shape(format!(
                "application {app_index} is not an object"
            )));
        };
        let instance_values = match app_obj.remove("instance") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(list)) => list,
            Some(one) => vec![one],
        };
        let mut app: Application = serde_json::from_value(Value::Object(app_obj))
            .map_err(|e| InvalidDocument::Shape(format!("application {app_index}: {e}")))?;
        for (index, value) in instance_values.into_iter().enumerate() {
            let instance_id = value
                .get("instanceId")
                .and_then(Value::as_str)
                .map(str::to_owned);
            match serde_json::from_value::<InstanceInfo>(value) {
                Ok(inst) => app.instance.push(inst),
                Err(e) => rejected.push(InvalidInstance {
                    index,
                    app: app.name.clone(),
                    instance_id,
                    field: "instance".into(),
                    reason: e.to_string(),
                }),
            }
        }
        applications.application.push(app);
    }
    Ok(ParsedApplications {
        applications,
        rejected,
    })
}

/// Reads a Eureka `/apps` document into a [`Registry`], with a warning for each instance,
/// port or VIP left out.
pub fn parse_registry(json: &[u8]) -> Result<Parsed, InvalidDocument> {
    let ParsedApplications {
        applications,
        rejected,
    } = parse_document(json)?;
    let mut parsed = applications.to_registry();
    let mut warnings = rejected;
    warnings.append(&mut parsed.warnings);
    parsed.warnings = warnings;
    Ok(parsed)
}

/// [`parse_registry`] as the registry file source takes it (its `JsonReader`), for
/// `--registry` files of Eureka's JSON.
pub fn read_registry_file(json: &[u8]) -> Result<Parsed, JsonError> {
    Ok(parse_registry(json)?)
}

/// Eureka's reconcile hash code (`apps__hashcode`) over instance statuses: for each status,
/// alphabetically, `STATUS_count_` (e.g. `DOWN_1_UP_2_`); empty when there are no instances.
///
/// A Eureka client compares this with the server's `apps__hashcode` after applying a delta
/// and fetches the full registry on a mismatch.
pub fn reconcile_hash_code(statuses: impl IntoIterator<Item = Status>) -> String {
    let mut counts = BTreeMap::<Status, usize>::new();
    for status in statuses {
        *counts.entry(status).or_default() += 1;
    }
    reconcile_hash_code_of_counts(counts)
}

/// The same, from how many instances have each status (statuses counted 0 are left out).
pub fn reconcile_hash_code_of_counts(counts: impl IntoIterator<Item = (Status, usize)>) -> String {
    let mut counts: Vec<(&'static str, usize)> = (counts.into_iter())
        .filter(|(_, n)| *n > 0)
        .map(|(status, n)| (status.as_str(), n))
        .collect();
    counts.sort_unstable();
    counts
        .into_iter()
        .map(|(status, n)| format!("{status}_{n}_"))
        .collect()
}

impl Applications {
    /// The plain registry: every instance that has a valid IP address, with the VIPs of
    /// its enabled ports that are valid names. What is left out is in `warnings`.
    pub fn to_registry(&self) -> Parsed {
        let mut warnings = Vec::new();
        let mut groups: Vec<Group> = Vec::new();
        for app in &self.application {
            let mut group = Vec::with_capacity(app.instance.len());
            for (index, info) in app.instance.iter().enumerate() {
                match info.to_instance(&app.name, index, &mut warnings) {
                    Ok(inst) => group.push(Arc::new(inst)),
                    Err(e) => warnings.push(e),
                }
            }
            groups.push(group.into());
        }
        Parsed {
            registry: Registry::from_groups(groups),
            warnings,
        }
    }

    /// Eureka's reconcile hash code of this document's instances, as a Eureka client
    /// computes it over its local copy (counting every instance it holds, readable or not
    /// by odmesh). Compare with `apps_hashcode`.
    pub fn reconcile_hash_code(&self) -> String {
        reconcile_hash_code(
            self.application
                .iter()
                .flat_map(|app| &app.instance)
                .map(InstanceInfo::status),
        )
    }
}

impl InstanceInfo {
    /// The status, with Eureka's rules: absent means `UP` (the builder's default), an
    /// unknown word means `UNKNOWN`.
    pub fn status(&self) -> Status {
        match &self.status {
            None => Status::Up,
            Some(s) => Status::parse(s).unwrap_or(Status::Unknown),
        }
    }

    /// The plain port, if enabled (`@enabled` defaults to true for it).
    pub fn plain_port(&self) -> Option<u16> {
        self.port
            .filter(|p| p.enabled.unwrap_or(true))
            .map(|p| p.port)
    }

    /// The secure port, if enabled (`@enabled` defaults to false for it).
    pub fn secure_port(&self) -> Option<u16> {
        self.secure_port
            .filter(|p| p.enabled.unwrap_or(false))
            .map(|p| p.port)
    }

    /// The instance id as Eureka derives it: `instanceId`, else the Amazon `instance-id`,
    /// else `hostName`; `None` if there is none of these.
    pub fn id(&self) -> Option<&str> {
        fn non_empty(s: &Option<String>) -> Option<&str> {
            s.as_deref().filter(|s| !s.trim().is_empty())
        }
        non_empty(&self.instance_id)
            .or_else(|| {
                self.data_center_info
                    .as_ref()
                    .and_then(|dc| dc.metadata.get("instance-id"))
                    .map(String::as_str)
                    .filter(|s| !s.trim().is_empty())
            })
            .or_else(|| non_empty(&self.host_name))
    }

    /// The availability zone: the data center's `availability-zone` (Amazon), else the
    /// `zone` metadata entry (Spring Cloud).
    pub fn zone(&self) -> Option<&str> {
        self.data_center_info
            .as_ref()
            .and_then(|dc| dc.metadata.get("availability-zone"))
            .or_else(|| self.metadata.get("zone"))
            .map(|z| z.trim())
            .filter(|z| !z.is_empty())
    }

    /// Converts to the plain [`Instance`]. `app_name` (the enclosing application's name) is
    /// used when the instance has no `app`; `index` only names the instance in messages.
    ///
    /// Fails for an instance without a valid `ipAddr`. VIPs that are not valid names, and
    /// enabled ports numbered 0, are left out with a warning pushed onto `warnings`.
    pub fn to_instance(
        &self,
        app_name: &str,
        index: usize,
        warnings: &mut Vec<InvalidInstance>,
    ) -> Result<Instance, InvalidInstance> {
        let app = self
            .app
            .as_deref()
            .filter(|a| !a.trim().is_empty())
            .unwrap_or(app_name)
            .to_owned();
        let ip_text = self.ip_addr.as_deref().unwrap_or_default().trim();
        let problem = |field: &str, reason: String| InvalidInstance {
            index,
            app: app.clone(),
            instance_id: self.id().map(str::to_owned),
            field: field.to_owned(),
            reason,
        };
        let ip: IpAddr = ip_text.parse().map_err(|_| {
            let reason = if ip_text.is_empty() {
                "missing; the instance is skipped".to_string()
            } else {
                format!("{ip_text:?} is not an IP address; the instance is skipped")
            };
            problem("ipAddr", reason)
        })?;

        let (port, vips) = serving(
            self.plain_port(),
            &self.vip_address,
            ("port", "vipAddress"),
            &problem,
            warnings,
        );
        let (secure_port, svips) = serving(
            self.secure_port(),
            &self.secure_vip_address,
            ("securePort", "secureVipAddress"),
            &problem,
            warnings,
        );

        let instance_id = match self.id() {
            Some(id) => id.to_owned(),
            None => format!("{ip}:{}", port.or(secure_port).unwrap_or_default()),
        };
        let protocol = match self.metadata.get(PROTOCOL_METADATA_KEY) {
            None => Protocol::Auto,
            Some(text) => Protocol::parse(text).unwrap_or_else(|reason| {
                let field = format!("metadata.{PROTOCOL_METADATA_KEY}");
                warnings.push(problem(&field, format!("{reason}; auto is used")));
                Protocol::Auto
            }),
        };
        Ok(Instance {
            app: app.into(),
            instance_id: instance_id.into(),
            ip,
            port,
            secure_port,
            vips,
            svips,
            status: self.status(),
            zone: self.zone().map(odmesh_registry::zone),
            protocol,
        })
    }
}

/// One side of an instance (plain or secure): its port, unless it is 0, and the VIPs it
/// serves that are valid names; what is left out is warned about (`fields`: the port's and
/// the list's names, for [`InvalidInstance::field`]).
fn serving(
    port: Option<u16>,
    list: &Option<String>,
    (port_field, list_field): (&str, &str),
    problem: &dyn Fn(&str, String) -> InvalidInstance,
    warnings: &mut Vec<InvalidInstance>,
) -> (Option<u16>, Vec<Arc<str>>) {
    let port = match port {
        Some(0) => {
            warnings.push(problem(port_field, "enabled with port 0; ignored".into()));
            None
        }
        other => other,
    };
    let mut vips = Vec::new();
    if port.is_some() {
        for vip in split_vips(list.as_deref().unwrap_or_default()) {
            match check_vip(&vip) {
                Ok(()) => vips.push(vip.into()),
                Err(reason) => warnings.push(problem(list_field, format!("{reason}; skipped"))),
            }
        }
    }
    // Pushed one at a time, a list of one VIP has room for four.
    vips.shrink_to_fit();
    (port, vips)
}

/// Serde helpers for the number/string/bool confusion of real Eureka servers.
pub(crate) mod lenient {

    use serde::Serializer;
    use serde::de::{Deserialize, DeserializeOwned, Deserializer, Error};
    use serde_json::Value;

    pub fn one_or_many<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
    where
        D: Deserializer<'de>,
        T: DeserializeOwned,
    {
        match Value::deserialize(d)? {
            Value::Null => Ok(Vec::new()),
            Value::Array(list) => list
                .into_iter()
                .map(|v| serde_json::from_value(v).map_err(D::Error::custom))
                .collect(),
            one => Ok(vec![serde_json::from_value(one).map_err(D::Error::custom)?]),
        }
    }

    fn string_of(v: Value) -> Result<Option<String>, String> {
        match v {
            Value::Null => Ok(None),
            Value::String(s) => Ok(Some(s)),
            Value::Number(n) => Ok(Some(n.to_string())),
            Value::Bool(b) => Ok(Some(b.to_string())),
            other => Err(format!("expected a string, found {other}")),
        }
    }

    pub fn opt_string<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
        string_of(Value::deserialize(d)?).map_err(D::Error::custom)
    }

    pub fn string<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
        opt_string(d).map(Option::unwrap_or_default)
    }

    pub fn u64_of(v: &Value) -> Result<u64, String> {
        match v {
            Value::Number(n) => n.as_u64(),
            Value::String(s) => s.trim().parse().ok(),
            _ => None,
        }
        .ok_or_else(|| format!("expected a non-negative integer, found {v}"))
    }

    pub fn u16_of(v: &Value) -> Result<u16, String> {
        u64_of(v)
            .ok()
            .and_then(|n| u16::try_from(n).ok())
            .ok_or_else(|| format!("expected a port number, found {v}"))
    }

    pub fn bool_of(v: &Value) -> Result<bool, String> {
        match v {
            Value::Bool(b) => Some(*b),
            Value::String(s) if s.trim().eq_ignore_ascii_case("true") => Some(true),
            Value::String(s) if s.trim().eq_ignore_ascii_case("false") => Some(false),
            _ => None,
        }
        .ok_or_else(|| format!("expected true or false, found {v}"))
    }

    pub fn opt_u64<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
        match Value::deserialize(d)? {
            Value::Null => Ok(None),
            v => u64_of(&v).map(Some).map_err(D::Error::custom),
        }
    }

    pub fn opt_bool<'de, D: Deserializer<'de>>(d: D) -> Result<Option<bool>, D::Error> {
        match Value::deserialize(d)? {
            Value::Null => Ok(None),
            v => bool_of(&v).map(Some).map_err(D::Error::custom),
        }
    }

    /// A string map; `@class` (Jackson's type marker) is dropped, other scalars become
    /// their text, nested values their JSON.
    pub fn metadata<'de, D, T>(d: D) -> Result<T, D::Error>
    where
        D: Deserializer<'de>,
        T: FromIterator<(String, String)>,
    {
        match Value::deserialize(d)? {
            Value::Null => Ok(T::from_iter([])),
            Value::Object(obj) => Ok(obj
                .into_iter()
                .filter(|(k, _)| k != "@class")
                .filter_map(|(k, v)| match v {
                    Value::Null => None,
                    Value::String(s) => Some((k, s)),
                    other => Some((k, other.to_string())),
                })
                .collect()),
            other => Err(D::Error::custom(format!(
                "metadata: expected an object, found {other}"
            ))),
        }
    }

    // Only called for `Some` (the fields skip `None`).
    pub fn ser_opt_as_string<S: Serializer, T: ToString>(
        v: &Option<T>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        match v {
            Some(v) => s.serialize_str(&v.to_string()),
            None => s.serialize_none(),
        }
    }

    /// Written as it is: the writing half of the fields read leniently.
    pub fn as_is<S: Serializer, T: serde::Serialize>(v: &T, s: S) -> Result<S::Ok, S::Error> {
        v.serialize(s)
    }

    /// A field of text (`#[serde(with = "lenient::text")]`): read from a string, number or
    /// bool, written as a string.
    pub mod text {
        pub use super::as_is as serialize;
        pub use super::opt_string as deserialize;
    }

    /// A field of a number: read from a number or a string, written as a number.
    pub mod number {
        pub use super::as_is as serialize;
        pub use super::opt_u64 as deserialize;
    }

    /// A field of a timestamp: read from a number or a string, written as a string, as
    /// Netflix's codec does.
    pub mod stamp {
        pub use super::opt_u64 as deserialize;
        pub use super::ser_opt_as_string as serialize;
    }

    /// A field of a bool, read from a bool or a string, written as a string, as Netflix's
    /// codec does.
    pub mod flag {
        pub use super::opt_bool as deserialize;
        pub use super::ser_opt_as_string as serialize;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testdata::path as testdata_path;
    use crate::testdata::read as testdata;

    fn one_instance(json: &str) -> Parsed {
        let doc = format!(
            r#"{{"applications": {{"application": [{{"name": "HELLO", "instance": [{json}]}}]}}}}"#
        );
        parse_registry(doc.as_bytes()).unwrap()
    }

    fn find<'a>(reg: &'a Registry, id: &str) -> &'a Instance {
        reg.instances()
            .find(|i| &*i.instance_id == id)
            .unwrap_or_else(|| panic!("no instance {id}"))
    }

    #[test]
    fn a_document_written_back_as_json_reads_back_the_same_even_with_big_numbers() {
        // Found by fuzzing (fuzz/, eureka_json): a number in a field odmesh does not know
        // was kept as the nearest f64 only approximately, so it changed on every round trip.
        let parsed = parse_document(&testdata("eureka-apps-big-numbers.json")).unwrap();
        assert!(parsed.rejected.is_empty(), "{:?}", parsed.rejected);
        let document = ApplicationsDocument {
            applications: parsed.applications,
        };
        let json = serde_json::to_vec(&document).unwrap();
        let again = parse_document(&json).unwrap();
        assert_eq!(again.applications, document.applications);
        let weight = &document.applications.application[0].instance[0].other["weight"];
        assert_eq!(
            weight.as_f64(),
            Some(555_555_555_555_555_555_555_555_555_555_555.0)
        );
    }

    #[test]
    fn a_real_apps_document_parses_every_instance() {
        let parsed = parse_registry(&testdata("eureka-apps.json")).unwrap();
        let reg = &parsed.registry;
        assert_eq!(reg.len(), 9, "{:#?}", reg);
        assert!(parsed.warnings.is_empty(), "{:#?}", parsed.warnings);

        let hello = find(reg, "hello-1.internal:hello:8080");
        assert_eq!(&*hello.app, "HELLO");
        assert_eq!(hello.ip, "10.0.1.11".parse::<IpAddr>().unwrap());
        assert_eq!(hello.port, Some(8080));
        assert_eq!(hello.secure_port, Some(8443));
        assert_eq!(
            hello.vips,
            ["hello", "hello.internal"].map(Arc::<str>::from)
        );
        assert_eq!(hello.svips, ["hello"].map(Arc::<str>::from));
        assert_eq!(hello.status, Status::Up);
        assert_eq!(hello.zone.as_deref(), Some("us-east-1a"));
    }

    #[test]
    fn the_hash_code_of_a_real_apps_document_matches_its_apps_hashcode() {
        let doc = parse_document(&testdata("eureka-apps.json")).unwrap();
        let written = doc.applications.apps_hashcode.clone().unwrap();
        assert_eq!(written, "DOWN_1_OUT_OF_SERVICE_1_STARTING_1_UP_6_");
        assert_eq!(doc.applications.reconcile_hash_code(), written);
        let parsed = doc.applications.to_registry();
        let statuses = parsed.registry.instances().map(|i| i.status);
        assert_eq!(reconcile_hash_code(statuses), written);
    }

    #[test]
    fn reconcile_hash_code_counts_statuses_in_alphabetical_order() {
        use Status::*;
        let code = reconcile_hash_code([Up, Down, Up, Starting, OutOfService, Unknown, Up]);
        assert_eq!(code, "DOWN_1_OUT_OF_SERVICE_1_STARTING_1_UNKNOWN_1_UP_3_");
    }

    #[test]
    fn reconcile_hash_code_of_no_instances_is_empty() {
        assert_eq!(reconcile_hash_code([]), "");
    }

    #[test]
    fn a_registry_file_of_eureka_json_is_read_through_the_file_source() {
        use odmesh_registry::file::{self, LoadError};
        let parsed = file::load(&testdata_path("eureka-apps.json"), read_registry_file).unwrap();
        assert_eq!(parsed.registry.len(), 9);
        let err = file::load(&testdata_path("broken.json"), read_registry_file).unwrap_err();
        assert!(matches!(err, LoadError::Eureka { .. }));
        let err = odmesh_base::error::Chain(&err).to_string();
        assert!(
            err.contains("broken.json (Eureka JSON): not valid JSON"),
            "{err}"
        );
    }

    #[test]
    fn an_application_with_a_single_instance_object_is_read_as_a_list_of_one() {
        let reg = parse_registry(&testdata("eureka-apps.json"))
            .unwrap()
            .registry;
        let billing: Vec<_> = reg.instances().filter(|i| &*i.app == "BILLING").collect();
        assert_eq!(billing.len(), 1);
        assert_eq!(billing[0].vips, ["billing"].map(Arc::<str>::from));
    }

    #[test]
    fn a_single_application_object_is_read_as_a_list_of_one() {
        let reg = parse_registry(&testdata("eureka-apps-single.json"))
            .unwrap()
            .registry;
        assert_eq!(reg.len(), 1);
        let inst = &reg.instances().next().unwrap();
        assert_eq!(&*inst.app, "MSDA-DEMO-SERVICE");
        assert_eq!(inst.port, Some(8080), "`$` given as a string");
        assert_eq!(inst.secure_port, None);
        assert_eq!(&*inst.instance_id, "centos43", "falls back to hostName");
    }

    #[test]
    fn non_up_statuses_are_kept_with_their_status() {
        let reg = parse_registry(&testdata("eureka-apps.json"))
            .unwrap()
            .registry;
        let status_of = |id| find(&reg, id).status;
        assert_eq!(status_of("hello-3.internal:hello:8080"), Status::Down);
        assert_eq!(status_of("greeter-2"), Status::OutOfService);
        assert_eq!(status_of("greeter-3"), Status::Starting);
    }

    #[test]
    fn a_disabled_secure_port_takes_no_svips() {
        let reg = parse_registry(&testdata("eureka-apps.json"))
            .unwrap()
            .registry;
        let greeter = find(&reg, "greeter-1");
        assert_eq!(greeter.secure_port, None);
        assert!(
            greeter.svips.is_empty(),
            "secureVipAddress is set but port 443 is disabled"
        );
        assert_eq!(
            greeter.vips,
            ["greeter", "greeter-v2"].map(Arc::<str>::from)
        );
    }

    #[test]
    fn a_disabled_plain_port_takes_no_vips() {
        let p = one_instance(
            r#"{"instanceId": "a", "ipAddr": "10.0.0.1", "vipAddress": "hello",
                "secureVipAddress": "hello", "port": {"$": 80, "@enabled": false},
                "securePort": {"$": 443, "@enabled": true}}"#,
        );
        let inst = &p.registry.instances().next().unwrap();
        assert_eq!((inst.port, inst.secure_port), (None, Some(443)));
        assert!(inst.vips.is_empty());
        assert_eq!(inst.svips, ["hello"].map(Arc::<str>::from));
    }

    #[test]
    fn enabled_may_be_a_bool_or_a_string_and_port_a_number_or_a_string() {
        let p = one_instance(
            r#"{"instanceId": "a", "ipAddr": "10.0.0.1", "vipAddress": "hello",
                "port": {"$": "8080", "@enabled": true},
                "securePort": {"$": 8443, "@enabled": "TRUE"}}"#,
        );
        let inst = &p.registry.instances().next().unwrap();
        assert_eq!((inst.port, inst.secure_port), (Some(8080), Some(8443)));
    }

    #[test]
    fn enabled_defaults_to_true_for_the_plain_port_and_false_for_the_secure_port() {
        let p = one_instance(
            r#"{"instanceId": "a", "ipAddr": "10.0.0.1", "vipAddress": "hello",
                "secureVipAddress": "hello", "port": {"$": 8080}, "securePort": 8443}"#,
        );
        let inst = &p.registry.instances().next().unwrap();
        assert_eq!((inst.port, inst.secure_port), (Some(8080), None));
    }

    #[test]
    fn metadata_holding_only_the_class_marker_is_empty() {
        let doc = parse_document(&testdata("eureka-apps.json")).unwrap();
        let greeter = doc.applications.application[1].instance[0].clone();
        assert_eq!(greeter.instance_id.as_deref(), Some("greeter-1"));
        assert!(greeter.metadata.is_empty(), "{:?}", greeter.metadata);
    }

    #[test]
    fn comma_separated_vips_are_trimmed_lowercased_and_deduplicated() {
        let p = one_instance(
            r#"{"instanceId": "a", "ipAddr": "10.0.0.1",
                "vipAddress": " Hello, HELLO.internal ,,hello ", "port": {"$": 80, "@enabled": "true"}}"#,
        );
        assert_eq!(
            p.registry.instances().next().unwrap().vips,
            ["hello", "hello.internal"].map(Arc::<str>::from)
        );
        assert!(p.warnings.is_empty());
    }

    #[test]
    fn an_invalid_vip_is_skipped_with_a_warning_and_the_rest_of_the_instance_kept() {
        let p = one_instance(
            r#"{"instanceId": "a", "ipAddr": "10.0.0.1",
                "vipAddress": "hello,bad vip!,10.1.2.3", "port": {"$": 80, "@enabled": "true"}}"#,
        );
        assert_eq!(
            p.registry.instances().next().unwrap().vips,
            ["hello"].map(Arc::<str>::from)
        );
        assert_eq!(p.warnings.len(), 2, "{:#?}", p.warnings);
        assert_eq!(p.warnings[0].field, "vipAddress");
        assert_eq!(p.warnings[0].instance_id.as_deref(), Some("a"));
        assert!(
            p.warnings[0].reason.contains("\"bad vip!\""),
            "{}",
            p.warnings[0]
        );
    }

    #[test]
    fn an_instance_with_a_bad_ip_is_skipped_with_a_warning() {
        let p = one_instance(
            r#"{"instanceId": "a", "app": "HELLO", "ipAddr": "hello-1.internal",
                "vipAddress": "hello", "port": {"$": 80, "@enabled": "true"}}"#,
        );
        assert!(p.registry.is_empty());
        assert_eq!(p.warnings.len(), 1);
        assert_eq!(p.warnings[0].field, "ipAddr");
        assert_eq!(p.warnings[0].app, "HELLO");
    }

    #[test]
    fn an_unreadable_instance_is_skipped_and_the_others_kept() {
        let parsed = parse_registry(&testdata("eureka-apps-one-bad-instance.json")).unwrap();
        assert_eq!(parsed.registry.len(), 1);
        assert_eq!(parsed.warnings.len(), 1, "{:#?}", parsed.warnings);
        let w = &parsed.warnings[0];
        assert_eq!((w.index, w.app.as_str()), (1, "HELLO"));
        assert_eq!(w.instance_id.as_deref(), Some("hello-2"));
        assert!(w.reason.contains("port"), "{w}");
    }

    #[test]
    fn the_zone_comes_from_amazon_data_center_info_or_from_metadata() {
        let reg = parse_registry(&testdata("eureka-apps.json"))
            .unwrap()
            .registry;
        assert_eq!(
            find(&reg, "hello-1.internal:hello:8080").zone.as_deref(),
            Some("us-east-1a")
        );
        assert_eq!(find(&reg, "greeter-2").zone.as_deref(), Some("zone-b"));
        assert_eq!(find(&reg, "greeter-1").zone, None);
    }

    #[test]
    fn missing_optional_fields_and_unknown_fields_are_fine() {
        let p =
            one_instance(r#"{"ipAddr": "::1", "port": 8080, "vipAddress": "hello", "novel": [1]}"#);
        let inst = &p.registry.instances().next().unwrap();
        assert_eq!(&*inst.app, "HELLO", "from the application");
        assert_eq!(&*inst.instance_id, "::1:8080");
        assert_eq!(inst.status, Status::Up, "Eureka's default");
        assert_eq!(inst.vips, ["hello"].map(Arc::<str>::from));
    }

    #[test]
    fn the_protocol_metadata_entry_declares_the_upstream_protocol() {
        let declared = |metadata: &str| {
            let p = one_instance(&format!(
                r#"{{"ipAddr": "10.0.0.1", "port": 8080, "vipAddress": "hello", "metadata": {metadata}}}"#
            ));
            let protocol = p.registry.instances().next().unwrap().protocol;
            (protocol, p.warnings)
        };
        assert_eq!(
            declared(r#"{"odmesh.protocol": "http2"}"#).0,
            Protocol::Http2
        );
        assert_eq!(
            declared(r#"{"odmesh.protocol": " HTTP1 "}"#).0,
            Protocol::Http1
        );
        assert_eq!(declared(r#"{"odmesh.protocol": "auto"}"#).0, Protocol::Auto);
        assert_eq!(declared(r#"{"zone": "a"}"#).0, Protocol::Auto);
        // A value odmesh does not know keeps the instance, speaking the caller's protocol,
        // and says why.
        let (protocol, warnings) = declared(r#"{"odmesh.protocol": "spdy"}"#);
        assert_eq!(protocol, Protocol::Auto);
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert_eq!(warnings[0].field, "metadata.odmesh.protocol");
        assert!(
            warnings[0]
                .reason
                .contains("\"spdy\" is not one of auto, http1, http2")
        );
    }

    #[test]
    fn an_unknown_status_word_means_unknown() {
        let p = one_instance(r#"{"ipAddr": "10.0.0.1", "status": "SLEEPY"}"#);
        assert_eq!(
            p.registry.instances().next().unwrap().status,
            Status::Unknown
        );
    }

    #[test]
    fn a_delta_document_carries_action_types() {
        let doc = parse_document(&testdata("eureka-delta.json")).unwrap();
        assert!(doc.rejected.is_empty());
        let apps = &doc.applications;
        assert_eq!(apps.versions_delta.as_deref(), Some("42"));
        assert_eq!(apps.apps_hashcode.as_deref(), Some("STARTING_1_UP_8_"));
        let actions: Vec<_> = apps
            .application
            .iter()
            .flat_map(|a| &a.instance)
            .map(|i| (i.id().unwrap_or_default().to_owned(), i.action_type))
            .collect();
        assert_eq!(
            actions,
            [
                ("hello-4".to_owned(), Some(ActionType::Added)),
                (
                    "hello-3.internal:hello:8080".to_owned(),
                    Some(ActionType::Modified)
                ),
                ("greeter-2".to_owned(), Some(ActionType::Deleted)),
            ]
        );
    }

    #[test]
    fn the_delta_fixture_applied_to_the_full_fixture_gives_the_deltas_hash_code() {
        let mut full = parse_document(&testdata("eureka-apps.json"))
            .unwrap()
            .applications;
        let delta = parse_document(&testdata("eureka-delta.json"))
            .unwrap()
            .applications;
        for app in &delta.application {
            let target = full
                .application
                .iter_mut()
                .find(|a| a.name == app.name)
                .unwrap();
            for inst in &app.instance {
                target.instance.retain(|i| i.id() != inst.id());
                if inst.action_type != Some(ActionType::Deleted) {
                    target.instance.push(inst.clone());
                }
            }
        }
        assert_eq!(Some(full.reconcile_hash_code()), delta.apps_hashcode);
    }

    #[test]
    fn an_empty_registry_has_no_applications() {
        let p = parse_registry(
            br#"{"applications": {"versions__delta": "1", "apps__hashcode": "", "application": []}}"#,
        )
        .unwrap();
        assert!(p.registry.is_empty());
    }

    #[test]
    fn a_document_without_applications_fails() {
        let err = parse_registry(br#"{"apps": []}"#).unwrap_err();
        assert!(matches!(err, InvalidDocument::Shape(_)), "{err}");
        let err = parse_registry(&testdata("broken.json")).unwrap_err();
        assert!(matches!(err, InvalidDocument::Json(_)), "{err}");
    }

    #[test]
    fn written_json_reads_back_the_same_and_uses_eurekas_spelling() {
        let doc = parse_document(&testdata("eureka-apps.json"))
            .unwrap()
            .applications;
        let written = serde_json::to_value(ApplicationsDocument {
            applications: doc.clone(),
        })
        .unwrap();
        let again: ApplicationsDocument = serde_json::from_value(written.clone()).unwrap();
        assert_eq!(again.applications, doc);

        let inst = &written["applications"]["application"][0]["instance"][0];
        assert_eq!(
            inst["port"],
            serde_json::json!({"$": 8080, "@enabled": "true"})
        );
        assert_eq!(inst["isCoordinatingDiscoveryServer"], "false");
        assert_eq!(inst["lastUpdatedTimestamp"], "1716812345678");
        assert_eq!(inst["leaseInfo"]["durationInSecs"], 90);
        assert_eq!(
            inst["dataCenterInfo"]["@class"],
            "com.amazonaws.appinfo.AmazonInfo"
        );
    }

    #[test]
    fn a_registration_body_reads_as_an_instance_document() {
        let body = r#"{"instance": {"instanceId": "a", "app": "HELLO", "ipAddr": "10.0.0.1",
            "status": "STARTING", "port": {"$": 8080, "@enabled": "true"},
            "dataCenterInfo": {"@class": "com.netflix.appinfo.InstanceInfo$DefaultDataCenterInfo", "name": "MyOwn"}}}"#;
        let doc: InstanceDocument = serde_json::from_str(body).unwrap();
        assert_eq!(doc.instance.status(), Status::Starting);
        assert_eq!(
            doc.instance.data_center_info,
            Some(DataCenterInfo::my_own())
        );
    }
}
