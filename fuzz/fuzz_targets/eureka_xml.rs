//! The embedded registry's XML writer (`odmesh_eureka::wire::xml`), for clients that read
//! Eureka's XML.
//!
//! Input: a Eureka JSON document (read with `parse_document`), or else any bytes, from which
//! `arbitrary` builds a document whose every text may hold any character. Checks, for
//! `applications`, `application` and `instance`:
//! - the output holds no character XML 1.0 forbids and is well-formed (roxmltree);
//! - reading it back gives every text of the document, with each forbidden character
//!   replaced by U+FFFD as the writer documents: every field of the writer's list of an
//!   instance's fields (`xml::fields`: names, ids, statuses, ports and whether they are
//!   enabled, the data center's class attribute and metadata, the lease), nothing else, and
//!   every metadata entry under its key, or under the valid name the writer makes of a key
//!   that is not one (unless another key has that name);
//! - each instance, stored as the embedded registry keeps it, reads back equal.
#![no_main]

use std::collections::{BTreeMap, BTreeSet};

use arbitrary::{Arbitrary, Unstructured};
use libfuzzer_sys::fuzz_target;
use odmesh_eureka::server::stored::Stored;
use odmesh_eureka::wire::json::{
    ActionType, Application, Applications, DataCenterInfo, InstanceInfo, LeaseInfo, Port,
    parse_document,
};
use odmesh_eureka::wire::xml::{self, Field};
use odmesh_fuzz::{as_read_back, elements, is_plain_xml_name, parse_xml, text_of};
use roxmltree::Node;

fuzz_target!(|data: &[u8]| {
    let apps = match parse_document(data) {
        Ok(parsed) => parsed.applications,
        Err(_) => match ArbApplications::arbitrary_take_rest(Unstructured::new(data)) {
            Ok(arb) => arb.into_applications(),
            Err(_) => return,
        },
    };

    // Every text, with any character, is kept by the embedded registry's stored form.
    for info in apps.application.iter().flat_map(|a| &a.instance) {
        assert_eq!(&Stored::from(info).info(), info);
    }

    let text = xml::applications(&apps);
    let doc = parse_xml(&text);
    let root = doc.root_element();
    assert_eq!(root.tag_name().name(), "applications");
    let mut children = elements(root).peekable();
    for (name, value) in [
        ("versions__delta", &apps.versions_delta),
        ("apps__hashcode", &apps.apps_hashcode),
    ] {
        if let Some(value) = value {
            let node = children.next().expect("the element");
            assert_eq!(node.tag_name().name(), name);
            assert_eq!(text_of(node), as_read_back(value));
        }
    }
    let written: Vec<Node> = children.collect();
    assert_eq!(written.len(), apps.application.len());
    for (node, app) in written.into_iter().zip(&apps.application) {
        check_application(node, app);
    }

    for app in apps.application.iter().take(2) {
        let text = xml::application(app);
        check_application(parse_xml(&text).root_element(), app);
        for info in app.instance.iter().take(2) {
            let text = xml::instance(info);
            check_instance(parse_xml(&text).root_element(), info);
        }
    }
});

fn check_application(node: Node, app: &Application) {
    assert_eq!(node.tag_name().name(), "application");
    let mut children = elements(node);
    let name = children.next().expect("<name>");
    assert_eq!(name.tag_name().name(), "name");
    assert_eq!(text_of(name), as_read_back(&app.name));
    let instances: Vec<Node> = children.collect();
    assert_eq!(instances.len(), app.instance.len());
    for (node, info) in instances.into_iter().zip(&app.instance) {
        check_instance(node, info);
    }
}

/// The element children of `node` by name, each name once.
fn by_name<'a, 'i>(node: Node<'a, 'i>) -> BTreeMap<&'a str, Node<'a, 'i>> {
    let mut out = BTreeMap::new();
    for child in elements(node) {
        let name = child.tag_name().name();
        assert!(out.insert(name, child).is_none(), "<{name}> twice");
    }
    out
}

/// Every field of the writer's list ([`xml::fields`]) is written under its name, as it reads
/// back, and nothing else.
fn check_instance(node: Node, i: &InstanceInfo) {
    assert_eq!(node.tag_name().name(), "instance");
    let fields = by_name(node);
    let mut written = 0;
    for field in xml::fields(i) {
        let name = match &field {
            Field::Text(name, _) | Field::Port(name, _, _) => *name,
            Field::DataCenter(_) => "dataCenterInfo",
            Field::Lease(_) => "leaseInfo",
            Field::Metadata(_) => "metadata",
        };
        let node = fields.get(name).copied();
        written += usize::from(node.is_some());
        check_field(name, node, field);
    }
    assert_eq!(
        written,
        fields.len(),
        "elements not in the list: {fields:?}"
    );
}

fn check_field(name: &str, node: Option<Node>, field: Field) {
    match (node, field) {
        (Some(node), Field::Text(_, Some(value))) => {
            assert_eq!(text_of(node), as_read_back(&value), "<{name}>");
        }
        (Some(node), Field::Port(_, Some(port), enabled_by_default)) => {
            assert_eq!(text_of(node), port.port.to_string());
            let enabled = port.enabled.unwrap_or(enabled_by_default).to_string();
            assert_eq!(node.attribute("enabled"), Some(enabled.as_str()));
        }
        (Some(node), Field::DataCenter(Some(dc))) => check_data_center(node, dc),
        (Some(node), Field::Lease(Some(lease))) => {
            let lease_fields = by_name(node);
            for (name, value) in xml::lease_fields(lease) {
                let node = lease_fields.get(name).expect("every lease field");
                assert_eq!(text_of(*node), value.unwrap_or(0).to_string());
            }
        }
        (Some(node), Field::Metadata(metadata)) => {
            if metadata.is_empty() {
                assert_eq!(
                    node.attribute("class"),
                    Some("java.util.Collections$EmptyMap")
                );
            }
            let entries = metadata.iter().map(|(k, v)| (k.clone(), v.clone()));
            check_metadata(node, &entries.collect());
        }
        (None, Field::Text(_, None) | Field::Port(_, None, _))
        | (None, Field::DataCenter(None) | Field::Lease(None)) => {}
        (node, field) => panic!("<{name}>: wrote {node:?}, expected {field:?}"),
    }
}

fn check_data_center(node: Node, dc: &DataCenterInfo) {
    let class = dc
        .class
        .as_deref()
        .unwrap_or(xml::DEFAULT_DATA_CENTER_CLASS);
    assert_eq!(node.attribute("class"), Some(as_read_back(class).as_str()));
    let dc_fields = by_name(node);
    assert_eq!(
        dc_fields.get("name").map(|n| text_of(*n)),
        dc.name.as_deref().map(as_read_back)
    );
    match dc_fields.get("metadata") {
        Some(node) => check_metadata(*node, &dc.metadata),
        None => assert!(dc.metadata.is_empty()),
    }
}

/// Every entry is written under its key, or under the name the writer makes of a key that is
/// not a valid name (every other character `_`, a `_` in front where needed), unless another
/// key already has that name; nothing else is written.
fn check_metadata(node: Node, entries: &BTreeMap<String, String>) {
    let written = by_name(node);
    let mut expected: BTreeMap<String, String> = BTreeMap::new();
    for (key, value) in entries {
        if is_plain_xml_name(key) {
            expected.insert(key.clone(), as_read_back(value));
        }
    }
    let mut taken: BTreeSet<String> = expected.keys().cloned().collect();
    for (key, value) in entries {
        if !is_plain_xml_name(key) {
            let mut name: String = key
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.') {
                        c
                    } else {
                        '_'
                    }
                })
                .collect();
            if !is_plain_xml_name(&name) {
                name.insert(0, '_');
            }
            assert!(is_plain_xml_name(&name), "{key:?} gave {name:?}");
            if taken.insert(name.clone()) {
                expected.insert(name, as_read_back(value));
            }
        }
    }
    let written: BTreeMap<String, String> = written
        .into_iter()
        .map(|(name, node)| (name.to_owned(), text_of(node)))
        .collect();
    assert_eq!(written, expected, "the metadata of {entries:?}");
}

/// A Eureka document in which every text may hold any character.
#[derive(Arbitrary, Debug)]
struct ArbApplications {
    versions_delta: Option<String>,
    apps_hashcode: Option<String>,
    application: Vec<(String, Vec<ArbInstance>)>,
}

#[derive(Arbitrary, Debug)]
struct ArbInstance {
    texts: [Option<String>; 16],
    port: Option<(u16, Option<bool>)>,
    secure_port: Option<(u16, Option<bool>)>,
    numbers: [Option<u64>; 3],
    coordinating: Option<bool>,
    action: Option<u8>,
    data_center: Option<ArbDataCenter>,
    lease: Option<[Option<u64>; 6]>,
    metadata: BTreeMap<String, String>,
}

#[derive(Arbitrary, Debug)]
struct ArbDataCenter {
    class: Option<String>,
    name: Option<String>,
    metadata: BTreeMap<String, String>,
}

impl ArbApplications {
    fn into_applications(self) -> Applications {
        Applications {
            versions_delta: self.versions_delta,
            apps_hashcode: self.apps_hashcode,
            application: (self.application.into_iter())
                .map(|(name, instance)| Application {
                    name,
                    instance: instance.into_iter().map(ArbInstance::into_info).collect(),
                    ..Application::default()
                })
                .collect(),
            ..Applications::default()
        }
    }
}

impl ArbInstance {
    fn into_info(self) -> InstanceInfo {
        let [
            instance_id,
            host_name,
            app,
            app_group_name,
            ip_addr,
            sid,
            status,
            overridden_status,
            overriddenstatus_legacy,
            home_page_url,
            status_page_url,
            health_check_url,
            secure_health_check_url,
            vip_address,
            secure_vip_address,
            asg_name,
        ] = self.texts;
        let port = |p: Option<(u16, Option<bool>)>| p.map(|(port, enabled)| Port { port, enabled });
        let [country_id, last_updated_timestamp, last_dirty_timestamp] = self.numbers;
        InstanceInfo {
            instance_id,
            host_name,
            app,
            app_group_name,
            ip_addr,
            sid,
            status,
            overridden_status,
            overriddenstatus_legacy,
            port: port(self.port),
            secure_port: port(self.secure_port),
            country_id,
            data_center_info: self.data_center.map(|dc| DataCenterInfo {
                class: dc.class,
                name: dc.name,
                metadata: dc.metadata,
                ..DataCenterInfo::default()
            }),
            lease_info: self.lease.map(|l| LeaseInfo {
                renewal_interval_in_secs: l[0],
                duration_in_secs: l[1],
                registration_timestamp: l[2],
                last_renewal_timestamp: l[3],
                eviction_timestamp: l[4],
                service_up_timestamp: l[5],
                ..LeaseInfo::default()
            }),
            metadata: self.metadata.into_iter().collect(),
            home_page_url,
            status_page_url,
            health_check_url,
            secure_health_check_url,
            vip_address,
            secure_vip_address,
            is_coordinating_discovery_server: self.coordinating,
            last_updated_timestamp,
            last_dirty_timestamp,
            action_type: self.action.map(|a| match a % 3 {
                0 => ActionType::Added,
                1 => ActionType::Modified,
                _ => ActionType::Deleted,
            }),
            asg_name,
            ..InstanceInfo::default()
        }
    }
}
