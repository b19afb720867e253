//! Eureka's XML wire format, written for clients that ask for XML, and read for clients that
//! register in XML ([`read_instance`]).
//!
//! A Eureka server answers XML unless the `Accept` header mentions `json`; some clients
//! (PyPI `py-eureka-client`) send `Accept: */*` and parse only XML. The element names and
//! attributes follow Netflix's XStream codec: `<port enabled="true">8080</port>`,
//! `<dataCenterInfo class="...">`, `<overriddenstatus>`, metadata entries as child elements.
//!
//! The output is always well-formed XML 1.0, whatever the registrations held:
//!
//! - a character XML 1.0 forbids (a control character other than tab, LF and CR; U+FFFE;
//!   U+FFFF) is written as U+FFFD, the replacement character;
//! - a CR is written as `&#13;`, and in an attribute so are tab and LF (`&#9;`, `&#10;`), so
//!   that a parser reads back exactly the text written (it would turn a literal CR into LF,
//!   and a literal tab or LF in an attribute into a space);
//! - a metadata key, written as an element name, that is not an XML name (ASCII letters,
//!   digits, `_ - .`, starting with a letter or `_`, not with `xml`) is written with every
//!   other character replaced by `_`, then a `_` in front if that still does not start with
//!   a letter or `_`, or starts with `xml`; if another key already has that name, the entry
//!   is left out.

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::fmt::Write as _;

use serde_json::{Map, Value};

use super::json::{
    ActionType, Application, Applications, DataCenterInfo, InstanceInfo, LeaseInfo, Metadata, Port,
};

/// Reads a registration in XML, `<instance>...</instance>` as Netflix's XStream codec writes
/// it: element names are the JSON field names, a port's number is its text and `enabled` an
/// attribute, the data center's `class` an attribute, metadata entries child elements.
/// Elements it does not know are left out (as Eureka's reader does). No DTD is read.
pub fn read_instance(text: &str) -> Result<InstanceInfo, String> {
    let doc = roxmltree::Document::parse(text).map_err(|e| format!("not XML: {e}"))?;
    let root = doc.root_element();
    if root.tag_name().name() != "instance" {
        return Err(format!(
            "the root element is <{}>, not <instance>",
            root.tag_name().name()
        ));
    }
    let mut fields = Map::new();
    for child in root.children().filter(roxmltree::Node::is_element) {
        let name = child.tag_name().name();
        let value = match name {
            "port" | "securePort" => {
                let mut port = Map::new();
                port.insert("$".into(), Value::String(text_of(child)));
                if let Some(enabled) = child.attribute("enabled") {
                    port.insert("@enabled".into(), Value::String(enabled.into()));
                }
                Value::Object(port)
            }
            "dataCenterInfo" => {
                let mut dc = children(child);
                if let Some(class) = child.attribute("class") {
                    dc.insert("@class".into(), Value::String(class.into()));
                }
                if let Some(metadata) = child.children().find(|c| c.has_tag_name("metadata")) {
                    dc.insert("metadata".into(), Value::Object(children(metadata)));
                }
                Value::Object(dc)
            }
            "leaseInfo" | "metadata" => Value::Object(children(child)),
            _ => Value::String(text_of(child)),
        };
        fields.insert(name.to_owned(), value);
    }
    serde_json::from_value(Value::Object(fields)).map_err(|e| e.to_string())
}

/// The text of `node` (empty if none).
fn text_of(node: roxmltree::Node<'_, '_>) -> String {
    node.text().unwrap_or_default().trim().to_owned()
}

/// The element children of `node` with only text, name → text.
fn children(node: roxmltree::Node<'_, '_>) -> Map<String, Value> {
    (node.children())
        .filter(|c| c.is_element() && !c.children().any(|g| g.is_element()))
        .map(|c| (c.tag_name().name().to_owned(), Value::String(text_of(c))))
        .collect()
}

/// `<applications>` with `versions__delta`, `apps__hashcode` and every application.
pub fn applications(apps: &Applications) -> String {
    let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<applications>");
    element(&mut out, "versions__delta", apps.versions_delta.as_deref());
    element(&mut out, "apps__hashcode", apps.apps_hashcode.as_deref());
    for app in &apps.application {
        write_application(&mut out, app);
    }
    out.push_str("</applications>\n");
    out
}

/// One `<application>` document.
pub fn application(app: &Application) -> String {
    let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    write_application(&mut out, app);
    out.push('\n');
    out
}

/// One `<instance>` document.
pub fn instance(info: &InstanceInfo) -> String {
    let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    write_instance(&mut out, info);
    out.push('\n');
    out
}

fn write_application(out: &mut String, app: &Application) {
    out.push_str("<application>");
    element(out, "name", Some(&app.name));
    for info in &app.instance {
        write_instance(out, info);
    }
    out.push_str("</application>");
}

/// One field of an instance, as Eureka's XML writes it.
#[derive(Clone, Debug)]
pub enum Field<'a> {
    /// An element of text (numbers and bools as their text), left out when `None`.
    Text(&'static str, Option<Cow<'a, str>>),
    /// A port: its name, the port, and whether it is enabled when it does not say.
    Port(&'static str, Option<Port>, bool),
    DataCenter(Option<&'a DataCenterInfo>),
    Lease(Option<&'a LeaseInfo>),
    Metadata(&'a Metadata),
}

/// An instance's fields in the order Eureka's XML writer gives them: the one list the writer
/// writes (and the fuzz target checks what it wrote against).
pub fn fields(i: &InstanceInfo) -> [Field<'_>; 25] {
    use Field::{DataCenter, Lease, Metadata, Port, Text};
    fn text(value: &Option<String>) -> Option<Cow<'_, str>> {
        value.as_deref().map(Cow::Borrowed)
    }
    fn shown<'a>(value: Option<impl ToString>) -> Option<Cow<'a, str>> {
        value.map(|v| Cow::Owned(v.to_string()))
    }
    let overridden = (i.overridden_status.as_ref()).or(i.overriddenstatus_legacy.as_ref());
    let action = i.action_type.map(|action| match action {
        ActionType::Added => "ADDED",
        ActionType::Modified => "MODIFIED",
        ActionType::Deleted => "DELETED",
    });
    [
        Text("instanceId", text(&i.instance_id)),
        Text("hostName", text(&i.host_name)),
        Text("app", text(&i.app)),
        Text("appGroupName", text(&i.app_group_name)),
        Text("ipAddr", text(&i.ip_addr)),
        Text("sid", text(&i.sid)),
        Text("status", text(&i.status)),
        Text(
            "overriddenstatus",
            overridden.map(|s| Cow::Borrowed(s.as_str())),
        ),
        Port("port", i.port, true),
        Port("securePort", i.secure_port, false),
        Text("countryId", shown(i.country_id)),
        DataCenter(i.data_center_info.as_ref()),
        Lease(i.lease_info.as_ref()),
        Metadata(&i.metadata),
        Text("homePageUrl", text(&i.home_page_url)),
        Text("statusPageUrl", text(&i.status_page_url)),
        Text("healthCheckUrl", text(&i.health_check_url)),
        Text("secureHealthCheckUrl", text(&i.secure_health_check_url)),
        Text("vipAddress", text(&i.vip_address)),
        Text("secureVipAddress", text(&i.secure_vip_address)),
        Text(
            "isCoordinatingDiscoveryServer",
            shown(i.is_coordinating_discovery_server),
        ),
        Text("lastUpdatedTimestamp", shown(i.last_updated_timestamp)),
        Text("lastDirtyTimestamp", shown(i.last_dirty_timestamp)),
        Text("actionType", action.map(Cow::Borrowed)),
        Text("asgName", text(&i.asg_name)),
    ]
}

/// A lease's fields in the order Eureka's XML writer gives them; each is written, 0 when
/// absent.
pub fn lease_fields(lease: &LeaseInfo) -> [(&'static str, Option<u64>); 6] {
    [
        ("renewalIntervalInSecs", lease.renewal_interval_in_secs),
        ("durationInSecs", lease.duration_in_secs),
        ("registrationTimestamp", lease.registration_timestamp),
        ("lastRenewalTimestamp", lease.last_renewal_timestamp),
        ("evictionTimestamp", lease.eviction_timestamp),
        ("serviceUpTimestamp", lease.service_up_timestamp),
    ]
}

/// The class a `dataCenterInfo` is written with when it does not say.
pub const DEFAULT_DATA_CENTER_CLASS: &str =
    "com.netflix.appinfo.InstanceInfo$DefaultDataCenterInfo";

fn write_instance(out: &mut String, i: &InstanceInfo) {
    out.push_str("<instance>");
    for field in fields(i) {
        match field {
            Field::Text(name, text) => element(out, name, text.as_deref()),
            Field::Port(name, stated, enabled) => port(out, name, stated, enabled),
            Field::DataCenter(Some(dc)) => data_center(out, dc),
            Field::Lease(Some(lease)) => {
                out.push_str("<leaseInfo>");
                for (name, value) in lease_fields(lease) {
                    element(out, name, Some(&value.unwrap_or(0).to_string()));
                }
                out.push_str("</leaseInfo>");
            }
            Field::DataCenter(None) | Field::Lease(None) => {}
            Field::Metadata(metadata) if metadata.is_empty() => {
                out.push_str("<metadata class=\"java.util.Collections$EmptyMap\"/>");
            }
            Field::Metadata(metadata) => map(out, "metadata", &metadata.iter().collect::<Vec<_>>()),
        }
    }
    out.push_str("</instance>");
}

/// `<dataCenterInfo class="...">` with its name and metadata.
fn data_center(out: &mut String, dc: &DataCenterInfo) {
    let class = dc.class.as_deref().unwrap_or(DEFAULT_DATA_CENTER_CLASS);
    let _ = write!(
        out,
        "<dataCenterInfo class=\"{}\">",
        escape(class, Context::Attribute)
    );
    element(out, "name", dc.name.as_deref());
    if !dc.metadata.is_empty() {
        map(out, "metadata", &dc.metadata.iter().collect::<Vec<_>>());
    }
    out.push_str("</dataCenterInfo>");
}

/// `<name enabled="...">n</name>`; `@enabled` absent means Eureka's default for the kind.
fn port(out: &mut String, name: &str, port: Option<Port>, default_enabled: bool) {
    if let Some(p) = port {
        let enabled = p.enabled.unwrap_or(default_enabled);
        let _ = write!(out, "<{name} enabled=\"{enabled}\">{}</{name}>", p.port);
    }
}

/// A string map as child elements, one per key (see the module's docs for keys that are not
/// XML names).
fn map(out: &mut String, name: &str, entries: &[(&String, &String)]) {
    let _ = write!(out, "<{name}>");
    let mut renamed = BTreeSet::new();
    for &(key, value) in entries {
        if is_xml_name(key) {
            element(out, key, Some(value));
        }
    }
    for &(key, value) in entries {
        if !is_xml_name(key) {
            let key = xml_name(key);
            // A key with that very name, or another key renamed alike, comes first.
            if !entries.iter().any(|(k, _)| **k == key) && !renamed.contains(&key) {
                element(out, &key, Some(value));
                renamed.insert(key);
            }
        }
    }
    let _ = write!(out, "</{name}>");
}

fn element(out: &mut String, name: &str, text: Option<&str>) {
    if let Some(text) = text {
        let _ = write!(out, "<{name}>{}</{name}>", escape(text, Context::Text));
    }
}

/// Whether `name` is written as an element name as it is: ASCII letters, digits and
/// `_ - .`, starting with a letter or `_`, and not with `xml` (reserved).
fn is_xml_name(name: &str) -> bool {
    let mut chars = name.chars();
    let first_ok = chars.next().is_some_and(is_name_start);
    first_ok && chars.all(is_name_char) && !starts_with_xml(name)
}

fn is_name_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_'
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')
}

fn starts_with_xml(name: &str) -> bool {
    name.get(..3)
        .is_some_and(|start| start.eq_ignore_ascii_case("xml"))
}

/// `name` as a valid element name ([`is_xml_name`]): every other character becomes `_`,
/// then a `_` goes in front if it still does not start with a letter or `_`, or starts with
/// `xml`.
fn xml_name(name: &str) -> String {
    let mut out: String = name
        .chars()
        .map(|c| if is_name_char(c) { c } else { '_' })
        .collect();
    if !out.chars().next().is_some_and(is_name_start) || starts_with_xml(&out) {
        out.insert(0, '_');
    }
    out
}

/// Whether XML 1.0 allows `c` in a document (its `Char` production; Rust has no surrogates).
fn is_xml_char(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\r' | '\u{20}'..='\u{fffd}' | '\u{10000}'..)
}

/// Where escaped text goes: character data, or a double-quoted attribute value.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Context {
    Text,
    Attribute,
}

/// `text` as XML character data or attribute value: markup characters as entities, CR (and
/// in an attribute tab and LF) as character references, forbidden characters as U+FFFD.
fn escape(text: &str, context: Context) -> Cow<'_, str> {
    let plain = |c: char| {
        is_xml_char(c)
            && !matches!(c, '&' | '<' | '>' | '"' | '\'' | '\r')
            && !(context == Context::Attribute && matches!(c, '\t' | '\n'))
    };
    if text.chars().all(plain) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\r' => out.push_str("&#13;"),
            '\t' if context == Context::Attribute => out.push_str("&#9;"),
            '\n' if context == Context::Attribute => out.push_str("&#10;"),
            c if !is_xml_char(c) => out.push(char::REPLACEMENT_CHARACTER),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::json::{DataCenterInfo, LeaseInfo};

    fn sample() -> InstanceInfo {
        InstanceInfo {
            instance_id: Some("h1".into()),
            host_name: Some("localhost".into()),
            app: Some("HELLO".into()),
            ip_addr: Some("127.0.0.1".into()),
            status: Some("UP".into()),
            overridden_status: Some("UNKNOWN".into()),
            port: Some(Port::enabled(8080)),
            secure_port: Some(Port::disabled(443)),
            country_id: Some(1),
            data_center_info: Some(DataCenterInfo::my_own()),
            lease_info: Some(LeaseInfo {
                duration_in_secs: Some(90),
                ..LeaseInfo::default()
            }),
            metadata: [("version".to_string(), "1 & <2>".to_string())].into(),
            vip_address: Some("hello".into()),
            last_dirty_timestamp: Some(42),
            ..InstanceInfo::default()
        }
    }

    #[test]
    fn an_instance_is_written_with_eurekas_element_names_and_attributes() {
        let xml = instance(&sample());
        for part in [
            "<instance><instanceId>h1</instanceId>",
            "<status>UP</status><overriddenstatus>UNKNOWN</overriddenstatus>",
            "<port enabled=\"true\">8080</port><securePort enabled=\"false\">443</securePort>",
            "<dataCenterInfo class=\"com.netflix.appinfo.InstanceInfo$DefaultDataCenterInfo\"><name>MyOwn</name></dataCenterInfo>",
            "<durationInSecs>90</durationInSecs><registrationTimestamp>0</registrationTimestamp>",
            "<metadata><version>1 &amp; &lt;2&gt;</version></metadata>",
            "<lastDirtyTimestamp>42</lastDirtyTimestamp></instance>",
        ] {
            assert!(xml.contains(part), "{part} not in {xml}");
        }
    }

    #[test]
    fn empty_metadata_carries_the_class_marker() {
        let mut info = sample();
        info.metadata.clear();
        assert!(instance(&info).contains("<metadata class=\"java.util.Collections$EmptyMap\"/>"));
        info.metadata
            .insert("management.port".into(), "8080".into());
        let xml = instance(&info);
        assert!(xml.contains("<metadata><management.port>8080</management.port></metadata>"));
    }

    fn metadata_xml(entries: &[(&str, &str)]) -> String {
        let mut info = sample();
        info.metadata = (entries.iter())
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let xml = instance(&info);
        let start = xml.find("<metadata>").expect("a metadata element");
        let end = xml.find("</metadata>").expect("its end") + "</metadata>".len();
        xml[start..end].to_owned()
    }

    #[test]
    fn metadata_keys_that_are_not_xml_names_are_written_as_names() {
        let xml = metadata_xml(&[
            ("bad key", "1"),
            ("1st", "2"),
            ("", "3"),
            ("a:b", "4"),
            ("caf\u{e9}", "5"),
            ("xmlns", "6"),
            ("XML-thing", "7"),
            ("<tag>", "8"),
            ("-x", "9"),
        ]);
        assert_eq!(
            xml,
            "<metadata><_>3</_><_-x>9</_-x><_1st>2</_1st><_tag_>8</_tag_>\
             <_XML-thing>7</_XML-thing><a_b>4</a_b><bad_key>1</bad_key><caf_>5</caf_>\
             <_xmlns>6</_xmlns></metadata>"
        );
    }

    #[test]
    fn a_renamed_metadata_key_never_takes_the_name_of_another_key() {
        // `a b` and `a?b` both become `a_b`, which is a key of its own: it wins.
        let xml = metadata_xml(&[("a b", "renamed"), ("a?b", "renamed too"), ("a_b", "real")]);
        assert_eq!(xml, "<metadata><a_b>real</a_b></metadata>");
        // Of two keys renamed alike, the first (in key order) is written.
        let xml = metadata_xml(&[("a?b", "second"), ("a b", "first")]);
        assert_eq!(xml, "<metadata><a_b>first</a_b></metadata>");
    }

    #[test]
    fn control_characters_that_xml_forbids_become_the_replacement_character() {
        let mut info = sample();
        info.host_name = Some("a\u{0}b\u{1}c\u{8}d\u{b}e\u{c}f\u{e}g\u{1f}h".into());
        let xml = instance(&info);
        assert!(
            xml.contains("<hostName>a\u{fffd}b\u{fffd}c\u{fffd}d\u{fffd}e\u{fffd}f\u{fffd}g\u{fffd}h</hostName>"),
            "{xml}"
        );
        assert!(!xml.chars().any(|c| c < ' ' && c != '\n'), "{xml:?}");
    }

    #[test]
    fn the_noncharacters_fffe_and_ffff_become_the_replacement_character() {
        let mut info = sample();
        info.metadata = [("v".to_string(), "\u{fffe}x\u{ffff}".to_string())].into();
        let xml = instance(&info);
        assert!(xml.contains("<v>\u{fffd}x\u{fffd}</v>"), "{xml}");
    }

    #[test]
    fn characters_xml_allows_are_kept_as_they_are() {
        let mut info = sample();
        let text = "tab\tnew\nline \u{7f}\u{85}\u{d7ff}\u{e000}\u{fffd}\u{10000}\u{10ffff}";
        info.status_page_url = Some(text.into());
        let xml = instance(&info);
        assert!(
            xml.contains(&format!("<statusPageUrl>{text}</statusPageUrl>")),
            "{xml:?}"
        );
    }

    #[test]
    fn a_carriage_return_is_written_as_a_reference_so_it_reads_back_as_one() {
        let mut info = sample();
        info.app_group_name = Some("a\r\nb\rc".into());
        let xml = instance(&info);
        assert!(
            xml.contains("<appGroupName>a&#13;\nb&#13;c</appGroupName>"),
            "{xml:?}"
        );
    }

    #[test]
    fn tabs_and_line_ends_in_an_attribute_are_written_as_references() {
        let mut info = sample();
        info.data_center_info = Some(DataCenterInfo {
            class: Some("a\tb\nc\rd\"e\u{0}f".into()),
            ..DataCenterInfo::default()
        });
        let xml = instance(&info);
        assert!(
            xml.contains("<dataCenterInfo class=\"a&#9;b&#10;c&#13;d&quot;e\u{fffd}f\">"),
            "{xml:?}"
        );
    }

    #[test]
    fn an_applications_document_has_the_version_and_hash_code_first() {
        let apps = Applications {
            versions_delta: Some("3".into()),
            apps_hashcode: Some("UP_1_".into()),
            application: vec![Application {
                name: "HELLO".into(),
                instance: vec![sample()],
                ..Application::default()
            }],
            ..Applications::default()
        };
        let xml = applications(&apps);
        assert!(xml.contains(
            "<applications><versions__delta>3</versions__delta><apps__hashcode>UP_1_</apps__hashcode><application><name>HELLO</name><instance>"
        ), "{xml}");
    }
}
