//! What the registry keeps of a registration: the instance document in the form Eureka's
//! own writers give it, which every Eureka reader takes, and its owner.
//!
//! Eureka's Java readers are strict where its writers are regular (docs/eureka.md,
//! "What a Eureka reader requires"): the Spring client's default transport fails a whole
//! `/apps` on one field it does not know, and the Jersey one on an unknown field holding an
//! object; a `dataCenterInfo` needs one of three `@class` names, and a port its `@enabled`.
//! Eureka's server drops the fields it does not know when it reads a registration, and so
//! does this registry: what it stores is [`canonical`], written back the same way to every
//! reader (clients, the follower, peers of either kind).
//!
//! The owner of an instance (the identity that registered it, with a tokens file) travels
//! with the document as the metadata entry [`OWNER_KEY`], so that it survives everything
//! that copies documents between registries: batches, a starting node's fill, a 409's
//! document, and a real Eureka server in between. Only peers may set it (see
//! [`owner_of_copy`]); a client's own value is dropped.

use crate::wire::json::{DataCenterInfo, InstanceInfo, Port};

/// The metadata entry that names an instance's owner; set by the registry, never by a
/// client.
pub const OWNER_KEY: &str = "odmesh.owner";

/// The `@class` names Eureka's readers know for a `dataCenterInfo`.
const MY_OWN_CLASS: &str = "com.netflix.appinfo.InstanceInfo$DefaultDataCenterInfo";
const MY_DATA_CENTER_CLASS: &str = "com.netflix.appinfo.MyDataCenterInfo";
const AMAZON_CLASS: &str = "com.netflix.appinfo.AmazonInfo";

/// Turns a registration into the document the registry keeps: only the fields Eureka knows
/// (unknown ones dropped at every level), a `dataCenterInfo` Eureka's readers take, both
/// ports with `@enabled` (absent ones disabled), the status under its exact name, the
/// country, and the data center's `metadata` only for Amazon. The lease and timestamps are
/// the ledger's to fill in.
pub fn canonical(info: &mut InstanceInfo) {
    info.other.clear();
    if let Some(lease) = &mut info.lease_info {
        lease.other.clear();
    }
    info.data_center_info = Some(data_center(info.data_center_info.take()));
    info.port = Some(port(info.port, info.plain_port()));
    info.secure_port = Some(port(info.secure_port, info.secure_port()));
    info.status = Some(info.status().as_str().to_owned());
    info.country_id.get_or_insert(1);
}

/// A port as Eureka writes it: the number, and whether it is enabled.
fn port(stated: Option<Port>, enabled: Option<u16>) -> Port {
    match (stated, enabled) {
        (_, Some(port)) => Port::enabled(port),
        (Some(stated), None) => Port::disabled(stated.port),
        (None, None) => Port::disabled(0),
    }
}

/// A `dataCenterInfo` Eureka's readers take: `Amazon` (with its metadata) when it says so
/// by name or class, `Netflix` as named, anything else `MyOwn`.
fn data_center(stated: Option<DataCenterInfo>) -> DataCenterInfo {
    let stated = stated.unwrap_or_default();
    let named = |name: &str| stated.name.as_deref() == Some(name);
    if named("Amazon") || stated.class.as_deref() == Some(AMAZON_CLASS) {
        return DataCenterInfo {
            class: Some(AMAZON_CLASS.to_owned()),
            name: Some("Amazon".to_owned()),
            metadata: stated.metadata,
            ..DataCenterInfo::default()
        };
    }
    let class = match stated.class.as_deref() {
        Some(MY_DATA_CENTER_CLASS) => MY_DATA_CENTER_CLASS,
        _ => MY_OWN_CLASS,
    };
    let name = if named("Netflix") { "Netflix" } else { "MyOwn" };
    DataCenterInfo {
        class: Some(class.to_owned()),
        name: Some(name.to_owned()),
        ..DataCenterInfo::default()
    }
}

/// Records `owner` in a client's registration, in place of whatever the client wrote there.
pub fn set_owner(info: &mut InstanceInfo, owner: Option<&str>) {
    info.metadata.remove(OWNER_KEY);
    if let Some(owner) = owner {
        info.metadata.insert(OWNER_KEY.to_owned(), owner.to_owned());
    }
}

/// The owner a peer's copy of an instance names.
pub fn owner_of_copy(info: &InstanceInfo) -> Option<&str> {
    info.metadata.get(OWNER_KEY).map(String::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn read(value: Value) -> InstanceInfo {
        serde_json::from_value(value).expect("an instance")
    }

    #[test]
    fn a_registration_keeps_only_what_eureka_knows_in_the_form_its_readers_take() {
        let mut info = read(json!({
            "instanceId": "a-1", "app": "A", "ipAddr": "10.0.0.1", "status": "up",
            "port": {"$": "8080"}, "securePort": 8443,
            "dataCenterInfo": {"@class": "com.amazonaws.appinfo.AmazonInfo", "name": "MyOwn",
                               "metadata": {"x": "y"}, "extra": {"deep": 1}},
            "leaseInfo": {"durationInSecs": 30, "weird": [1]},
            "somethingNew": {"nested": true}, "flag": "x",
        }));
        canonical(&mut info);
        let written = serde_json::to_value(&info).unwrap();
        assert_eq!(written["status"], "UP");
        assert_eq!(written["port"], json!({"$": 8080, "@enabled": "true"}));
        assert_eq!(
            written["securePort"],
            json!({"$": 8443, "@enabled": "false"})
        );
        assert_eq!(
            written["dataCenterInfo"],
            json!({"@class": MY_OWN_CLASS, "name": "MyOwn"})
        );
        assert_eq!(written["leaseInfo"], json!({"durationInSecs": 30}));
        assert_eq!(written["countryId"], 1);
        for unknown in ["somethingNew", "flag"] {
            assert!(
                written.get(unknown).is_none(),
                "{unknown} written: {written}"
            );
        }
    }

    #[test]
    fn an_amazon_data_center_keeps_its_metadata_and_absent_ports_are_written_disabled() {
        let mut info = read(json!({
            "instanceId": "a-1", "ipAddr": "10.0.0.1",
            "dataCenterInfo": {"name": "Amazon", "metadata": {"availability-zone": "z1"}},
        }));
        canonical(&mut info);
        let written = serde_json::to_value(&info).unwrap();
        assert_eq!(
            written["dataCenterInfo"],
            json!({"@class": AMAZON_CLASS, "name": "Amazon", "metadata": {"availability-zone": "z1"}})
        );
        assert_eq!(written["port"], json!({"$": 0, "@enabled": "false"}));
        assert_eq!(written["status"], "UP", "Eureka's default");
    }

    #[test]
    fn the_owner_is_the_registrys_to_write_never_the_clients() {
        let mut info = read(json!({"metadata": {"odmesh.owner": "mallory", "zone": "z1"}}));
        set_owner(&mut info, None);
        assert_eq!(owner_of_copy(&info), None);
        assert_eq!(info.metadata.get("zone").map(String::as_str), Some("z1"));
        set_owner(&mut info, Some("billing"));
        assert_eq!(owner_of_copy(&info), Some("billing"));
    }
}
