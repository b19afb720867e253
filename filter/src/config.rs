//! The filter's plugin configuration: parsed and validated once, in `on_configure`.
//!
//! The configuration is a JSON object; every field is optional and an empty configuration
//! means the defaults (README, "The filter's configuration"):
//!
//! | field            | default            |
//! |------------------|--------------------|
//! | `source_header`  | `:authority`       |
//! | `cluster_header` | `x-odmesh-cluster` |
//! | `secure_header`  | `x-odmesh-secure`  |
//! | `secure_ports`   | `[443, 8443]`      |
//! | `strip_suffixes` | `[]`               |
//!
//! An unknown field or a bad value is an [`InvalidConfig`] whose text names the field and
//! says what is wrong with it.

use core::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer};

/// The default header that names the destination.
pub const DEFAULT_SOURCE_HEADER: &str = ":authority";
/// The default header the filter writes the cluster name into.
pub const DEFAULT_CLUSTER_HEADER: &str = "x-odmesh-cluster";
/// The default header that marks a request as secure.
pub const DEFAULT_SECURE_HEADER: &str = "x-odmesh-secure";
/// The default ports that mark a request as secure.
pub const DEFAULT_SECURE_PORTS: [u16; 2] = [443, 8443];

/// The validated filter configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Header that names the destination; the filter falls back to `host` when it is absent.
    pub source_header: String,
    /// Header the filter always overwrites with the cluster name.
    pub cluster_header: String,
    /// Header that, set to `true` or `1`, selects the `.svip` cluster; removed before upstream.
    pub secure_header: String,
    /// Host ports that select the `.svip` cluster.
    pub secure_ports: Vec<u16>,
    /// Domain suffixes stripped from the host, lowercase, each starting with a dot; sorted
    /// longest first so the most specific suffix wins.
    pub strip_suffixes: Vec<String>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            source_header: DEFAULT_SOURCE_HEADER.to_owned(),
            cluster_header: DEFAULT_CLUSTER_HEADER.to_owned(),
            secure_header: DEFAULT_SECURE_HEADER.to_owned(),
            secure_ports: DEFAULT_SECURE_PORTS.to_vec(),
            strip_suffixes: Vec::new(),
        }
    }
}

/// Why a plugin configuration was refused. The `Display` text is what the filter logs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InvalidConfig {
    /// What serde_json reported: not a JSON object, a syntax error, an unknown field, or a
    /// value of the wrong type (the message names the field: "field `secure_ports`: ...").
    Json { reason: String },
    /// A known field holds a bad value.
    Field {
        /// The configuration field, e.g. `secure_ports`.
        field: &'static str,
        /// What is wrong with its value.
        reason: String,
    },
}

impl fmt::Display for InvalidConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InvalidConfig::Json { reason } => {
                write!(f, "invalid odmesh filter configuration: {reason}")
            }
            InvalidConfig::Field { field, reason } => {
                write!(
                    f,
                    "invalid odmesh filter configuration: field `{field}`: {reason}"
                )
            }
        }
    }
}

impl std::error::Error for InvalidConfig {}

/// The configuration as written, every field optional. Each field is read through [`named`],
/// so that a value of the wrong type is reported with its field's name.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default, deserialize_with = "source_header")]
    source_header: Option<String>,
    #[serde(default, deserialize_with = "cluster_header")]
    cluster_header: Option<String>,
    #[serde(default, deserialize_with = "secure_header")]
    secure_header: Option<String>,
    #[serde(default, deserialize_with = "secure_ports")]
    secure_ports: Option<Vec<u16>>,
    #[serde(default, deserialize_with = "strip_suffixes")]
    strip_suffixes: Option<Vec<String>>,
}

/// Reads one field's value, prefixing a type error with the field's name.
fn named<'de, D, T>(field: &'static str, deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(deserializer)
        .map_err(|e| de::Error::custom(format_args!("field `{field}`: {e}")))
}

fn source_header<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    named("source_header", d)
}
fn cluster_header<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    named("cluster_header", d)
}
fn secure_header<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    named("secure_header", d)
}
fn secure_ports<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<u16>>, D::Error> {
    named("secure_ports", d)
}
fn strip_suffixes<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<String>>, D::Error> {
    named("strip_suffixes", d)
}

impl Config {
    /// Parses and validates the plugin configuration. Empty (or only whitespace) means the
    /// defaults.
    pub fn parse(bytes: &[u8]) -> Result<Config, InvalidConfig> {
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(Config::default());
        }
        if bytes.trim_ascii_start().first() != Some(&b'{') {
            return Err(InvalidConfig::Json {
                reason:
                    "it must be a JSON object, such as {\"strip_suffixes\": [\".mesh.internal\"]}"
                        .to_owned(),
            });
        }
        let raw: RawConfig = serde_json::from_slice(bytes).map_err(|e| InvalidConfig::Json {
            reason: e.to_string(),
        })?;
        let defaults = Config::default();

        let source_header = raw.source_header.unwrap_or(defaults.source_header);
        check_header_name("source_header", &source_header, true)?;

        let cluster_header = raw.cluster_header.unwrap_or(defaults.cluster_header);
        check_header_name("cluster_header", &cluster_header, false)?;

        let secure_header = raw.secure_header.unwrap_or(defaults.secure_header);
        check_header_name("secure_header", &secure_header, false)?;

        if cluster_header == source_header {
            return Err(field_error(
                "cluster_header",
                format!("must differ from source_header (both are {cluster_header:?})"),
            ));
        }
        if secure_header == cluster_header || secure_header == source_header {
            return Err(field_error(
                "secure_header",
                format!(
                    "must differ from source_header and cluster_header (it is {secure_header:?})"
                ),
            ));
        }

        let secure_ports = raw.secure_ports.unwrap_or(defaults.secure_ports);
        if secure_ports.contains(&0) {
            return Err(field_error(
                "secure_ports",
                "port 0 is not a port; use 1 to 65535".to_owned(),
            ));
        }

        let mut strip_suffixes = raw.strip_suffixes.unwrap_or(defaults.strip_suffixes);
        for suffix in &mut strip_suffixes {
            check_suffix(suffix)?;
        }
        // Longest first: with `.internal` and `.mesh.internal`, `a.mesh.internal` becomes `a`.
        strip_suffixes.sort_unstable_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        strip_suffixes.dedup();

        Ok(Config {
            source_header,
            cluster_header,
            secure_header,
            secure_ports,
            strip_suffixes,
        })
    }
}

fn field_error(field: &'static str, reason: String) -> InvalidConfig {
    InvalidConfig::Field { field, reason }
}

/// A header name Envoy can match: lowercase token characters (RFC 9110), or a pseudo-header
/// such as `:authority` where `pseudo_ok`.
fn check_header_name(
    field: &'static str,
    name: &str,
    pseudo_ok: bool,
) -> Result<(), InvalidConfig> {
    let token = match name.strip_prefix(':') {
        Some(rest) if pseudo_ok => rest,
        Some(_) => {
            return Err(field_error(
                field,
                format!("{name:?} is a pseudo-header; name a regular header"),
            ));
        }
        None => name,
    };
    if token.is_empty() {
        return Err(field_error(field, "the header name is empty".to_owned()));
    }
    if let Some(ch) = token.chars().find(char::is_ascii_uppercase) {
        return Err(field_error(
            field,
            format!("{name:?} has uppercase {ch:?}; header names are lowercase"),
        ));
    }
    let is_tchar = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
    if let Some(ch) = token.chars().find(|&c| !is_tchar(c)) {
        return Err(field_error(
            field,
            format!("{name:?} has {ch:?}, which is not allowed in a header name"),
        ));
    }
    Ok(())
}

/// A suffix is a dot followed by a valid name; it is lowercased here, once.
fn check_suffix(suffix: &mut String) -> Result<(), InvalidConfig> {
    let Some(name) = suffix.strip_prefix('.') else {
        return Err(field_error(
            "strip_suffixes",
            format!("{suffix:?} does not start with a dot (write \".{suffix}\")"),
        ));
    };
    let lower = name.to_ascii_lowercase();
    odmesh_names::validate_vip(&lower)
        .map_err(|e| field_error("strip_suffixes", format!("{suffix:?}: {e}")))?;
    suffix.make_ascii_lowercase();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Asserts that the error's text names `field`.
    fn assert_names(err: &InvalidConfig, field: &str) {
        let text = err.to_string();
        assert!(text.contains(&format!("field `{field}`: ")), "{text}");
    }

    #[test]
    fn an_empty_configuration_means_the_defaults() {
        assert_eq!(Config::parse(b""), Ok(Config::default()));
        assert_eq!(Config::parse(b"  \n"), Ok(Config::default()));
        assert_eq!(Config::parse(b"{}"), Ok(Config::default()));
        let c = Config::default();
        assert_eq!(c.source_header, ":authority");
        assert_eq!(c.cluster_header, "x-odmesh-cluster");
        assert_eq!(c.secure_header, "x-odmesh-secure");
        assert_eq!(c.secure_ports, vec![443, 8443]);
        assert!(c.strip_suffixes.is_empty());
    }

    #[test]
    fn every_field_can_be_set() {
        let c = Config::parse(include_bytes!("../testdata/config-full.json")).expect("valid");
        assert_eq!(c.source_header, "x-destination");
        assert_eq!(c.cluster_header, "x-route-to");
        assert_eq!(c.secure_header, "x-tls");
        assert_eq!(c.secure_ports, vec![9443]);
        assert_eq!(c.strip_suffixes, vec![".mesh.internal", ".svc"]);
    }

    #[test]
    fn null_fields_mean_their_defaults() {
        let c = Config::parse(br#"{"secure_ports": null}"#).expect("valid");
        assert_eq!(c.secure_ports, vec![443, 8443]);
    }

    #[test]
    fn an_unknown_field_is_refused_by_name() {
        let err = Config::parse(br#"{"strip_sufixes": [".x"]}"#).expect_err("unknown field");
        let msg = err.to_string();
        assert!(msg.contains("unknown field `strip_sufixes`"), "{msg}");
    }

    #[test]
    fn a_configuration_that_is_not_a_json_object_is_refused() {
        for bad in [&b"none"[..], b"[]", b"{", b"\"x\""] {
            let err = Config::parse(bad).expect_err("not an object");
            assert!(matches!(err, InvalidConfig::Json { .. }), "{err}");
        }
    }

    #[test]
    fn a_value_of_the_wrong_type_names_its_field() {
        let err = Config::parse(br#"{"secure_ports": "443"}"#).expect_err("wrong type");
        assert_names(&err, "secure_ports");
        let err = Config::parse(br#"{"cluster_header": 7}"#).expect_err("wrong type");
        assert_names(&err, "cluster_header");
    }

    #[test]
    fn ports_outside_1_to_65535_are_refused() {
        for bad in [
            &br#"{"secure_ports": [0]}"#[..],
            br#"{"secure_ports": [65536]}"#,
            br#"{"secure_ports": [-1]}"#,
        ] {
            let err = Config::parse(bad).expect_err("bad port");
            assert_names(&err, "secure_ports");
        }
        let c = Config::parse(br#"{"secure_ports": [1, 65535]}"#).expect("valid");
        assert_eq!(c.secure_ports, vec![1, 65535]);
        let c = Config::parse(br#"{"secure_ports": []}"#).expect("no secure ports is valid");
        assert!(c.secure_ports.is_empty());
    }

    #[test]
    fn header_names_must_be_lowercase_tokens() {
        for (json, field) in [
            (r#"{"cluster_header": "X-Cluster"}"#, "cluster_header"),
            (r#"{"cluster_header": ""}"#, "cluster_header"),
            (r#"{"secure_header": "x secure"}"#, "secure_header"),
            (r#"{"source_header": "x:y"}"#, "source_header"),
            (r#"{"source_header": ":"}"#, "source_header"),
        ] {
            let err = Config::parse(json.as_bytes()).expect_err(json);
            assert_names(&err, field);
        }
    }

    #[test]
    fn only_the_source_header_may_be_a_pseudo_header() {
        assert!(Config::parse(br#"{"source_header": ":path"}"#).is_ok());
        let err = Config::parse(br#"{"cluster_header": ":authority"}"#).expect_err("pseudo");
        assert_names(&err, "cluster_header");
    }

    #[test]
    fn the_three_headers_must_be_different() {
        let err = Config::parse(br#"{"secure_header": "x-odmesh-cluster"}"#).expect_err("same");
        assert_names(&err, "secure_header");
        let err = Config::parse(br#"{"source_header": "x-odmesh-cluster"}"#).expect_err("same");
        assert_names(&err, "cluster_header");
    }

    #[test]
    fn suffixes_must_start_with_a_dot_and_be_valid_names() {
        for bad in [
            r#"{"strip_suffixes": ["mesh.internal"]}"#,
            r#"{"strip_suffixes": ["."]}"#,
            r#"{"strip_suffixes": [".mesh..internal"]}"#,
            r#"{"strip_suffixes": [".mesh.internal."]}"#,
            r#"{"strip_suffixes": [".bad!"]}"#,
        ] {
            let err = Config::parse(bad.as_bytes()).expect_err(bad);
            assert_names(&err, "strip_suffixes");
        }
    }

    #[test]
    fn suffixes_are_lowercased_and_sorted_longest_first() {
        let c =
            Config::parse(br#"{"strip_suffixes": [".internal", ".Mesh.Internal", ".internal"]}"#)
                .expect("valid");
        assert_eq!(c.strip_suffixes, vec![".mesh.internal", ".internal"]);
    }
}
