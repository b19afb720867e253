//! Eureka's XML wire format, written (never read) for clients that ask for XML.
//!
//! A Eureka server answers XML unless the `Accept` header mentions `json`; some clients
//! (PyPI `py-eureka-client`) send `Accept: */*` and parse only XML. The element names and
//! attributes follow Netflix's XStream codec: `<port enabled="true">8080</port>`,
//! `<dataCenterInfo class="...">`, `<overriddenstatus>`, metadata entries as child elements.

use std::fmt::Write as _;

use crate::registry::eureka::{Application, Applications, InstanceInfo, Port};

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

fn write_instance(out: &mut String, i: &InstanceInfo) {
    out.push_str("<instance>");
    element(out, "instanceId", i.instance_id.as_deref());
    element(out, "hostName", i.host_name.as_deref());
    element(out, "app", i.app.as_deref());
    element(out, "appGroupName", i.app_group_name.as_deref());
    element(out, "ipAddr", i.ip_addr.as_deref());
    element(out, "sid", i.sid.as_deref());
    element(out, "status", i.status.as_deref());
    let overridden = i
        .overridden_status
        .as_deref()
        .or(i.overriddenstatus_legacy.as_deref());
    element(out, "overriddenstatus", overridden);
    port(out, "port", i.port, true);
    port(out, "securePort", i.secure_port, false);
    element(
        out,
        "countryId",
        i.country_id.map(|c| c.to_string()).as_deref(),
    );
    if let Some(dc) = &i.data_center_info {
        let class = dc
            .class
            .as_deref()
            .unwrap_or("com.netflix.appinfo.InstanceInfo$DefaultDataCenterInfo");
        let _ = write!(out, "<dataCenterInfo class=\"{}\">", escape(class));
        element(out, "name", dc.name.as_deref());
        if !dc.metadata.is_empty() {
            map(out, "metadata", &dc.metadata);
        }
        out.push_str("</dataCenterInfo>");
    }
    if let Some(lease) = &i.lease_info {
        out.push_str("<leaseInfo>");
        let fields = [
            ("renewalIntervalInSecs", lease.renewal_interval_in_secs),
            ("durationInSecs", lease.duration_in_secs),
            ("registrationTimestamp", lease.registration_timestamp),
            ("lastRenewalTimestamp", lease.last_renewal_timestamp),
            ("evictionTimestamp", lease.eviction_timestamp),
            ("serviceUpTimestamp", lease.service_up_timestamp),
        ];
        for (name, value) in fields {
            element(out, name, Some(&value.unwrap_or(0).to_string()));
        }
        out.push_str("</leaseInfo>");
    }
    if i.metadata.is_empty() {
        out.push_str("<metadata class=\"java.util.Collections$EmptyMap\"/>");
    } else {
        map(out, "metadata", &i.metadata);
    }
    element(out, "homePageUrl", i.home_page_url.as_deref());
    element(out, "statusPageUrl", i.status_page_url.as_deref());
    element(out, "healthCheckUrl", i.health_check_url.as_deref());
    element(
        out,
        "secureHealthCheckUrl",
        i.secure_health_check_url.as_deref(),
    );
    element(out, "vipAddress", i.vip_address.as_deref());
    element(out, "secureVipAddress", i.secure_vip_address.as_deref());
    let flag = i.is_coordinating_discovery_server.map(|b| b.to_string());
    element(out, "isCoordinatingDiscoveryServer", flag.as_deref());
    let stamp = |t: Option<u64>| t.map(|t| t.to_string());
    element(
        out,
        "lastUpdatedTimestamp",
        stamp(i.last_updated_timestamp).as_deref(),
    );
    element(
        out,
        "lastDirtyTimestamp",
        stamp(i.last_dirty_timestamp).as_deref(),
    );
    if let Some(action) = i.action_type {
        let action = match action {
            crate::registry::eureka::ActionType::Added => "ADDED",
            crate::registry::eureka::ActionType::Modified => "MODIFIED",
            crate::registry::eureka::ActionType::Deleted => "DELETED",
        };
        element(out, "actionType", Some(action));
    }
    element(out, "asgName", i.asg_name.as_deref());
    out.push_str("</instance>");
}

/// `<name enabled="...">n</name>`; `@enabled` absent means Eureka's default for the kind.
fn port(out: &mut String, name: &str, port: Option<Port>, default_enabled: bool) {
    if let Some(p) = port {
        let enabled = p.enabled.unwrap_or(default_enabled);
        let _ = write!(out, "<{name} enabled=\"{enabled}\">{}</{name}>", p.port);
    }
}

/// A string map as child elements; keys that are not XML names are left out.
fn map(out: &mut String, name: &str, entries: &std::collections::BTreeMap<String, String>) {
    let _ = write!(out, "<{name}>");
    for (key, value) in entries {
        if is_xml_name(key) {
            element(out, key, Some(value));
        }
    }
    let _ = write!(out, "</{name}>");
}

fn element(out: &mut String, name: &str, text: Option<&str>) {
    if let Some(text) = text {
        let _ = write!(out, "<{name}>{}</{name}>", escape(text));
    }
}

fn is_xml_name(name: &str) -> bool {
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    first_ok
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        && !name.to_ascii_lowercase().starts_with("xml")
}

fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c if (c as u32) < 0x20 && !matches!(c, '\t' | '\n' | '\r') => {}
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::eureka::{DataCenterInfo, LeaseInfo};

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
    fn empty_metadata_carries_the_class_marker_and_odd_keys_are_left_out() {
        let mut info = sample();
        info.metadata.clear();
        assert!(instance(&info).contains("<metadata class=\"java.util.Collections$EmptyMap\"/>"));
        info.metadata.insert("bad key".into(), "x".into());
        info.metadata
            .insert("management.port".into(), "8080".into());
        let xml = instance(&info);
        assert!(xml.contains("<metadata><management.port>8080</management.port></metadata>"));
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
