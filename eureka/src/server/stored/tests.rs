use serde_json::json;

use super::*;
use crate::server::document::canonical;
use crate::testdata::read as testdata;
use crate::wire::json::parse_document;

fn read(value: Value) -> InstanceInfo {
    serde_json::from_value(value).expect("an instance")
}

/// What a Spring Cloud client registers, as the registry keeps it.
fn spring() -> InstanceInfo {
    let mut info = read(json!({
        "instanceId": "ip-10-0-0-1.ec2.internal:svc-000001:8080",
        "hostName": "ip-10-0-0-1.ec2.internal", "app": "SVC-000001", "ipAddr": "10.0.0.1",
        "status": "UP", "overriddenStatus": "UNKNOWN",
        "port": {"$": 8080, "@enabled": "true"}, "securePort": {"$": 443, "@enabled": "false"},
        "countryId": 1,
        "dataCenterInfo": {"@class": "com.netflix.appinfo.InstanceInfo$DefaultDataCenterInfo",
                           "name": "MyOwn"},
        "leaseInfo": {"renewalIntervalInSecs": 30, "durationInSecs": 90,
                      "registrationTimestamp": 1716812345678u64,
                      "lastRenewalTimestamp": 1716812345678u64, "evictionTimestamp": 0,
                      "serviceUpTimestamp": 1716812345678u64},
        "metadata": {"management.port": "8080", "zone": "us-east-1a"},
        "homePageUrl": "http://ip-10-0-0-1.ec2.internal:8080/",
        "statusPageUrl": "http://ip-10-0-0-1.ec2.internal:8080/actuator/info",
        "healthCheckUrl": "http://ip-10-0-0-1.ec2.internal:8080/actuator/health",
        "vipAddress": "svc-000001", "secureVipAddress": "svc-000001",
        "isCoordinatingDiscoveryServer": "false",
        "lastUpdatedTimestamp": "1716812345678", "lastDirtyTimestamp": "1716812345678",
    }));
    canonical(&mut info);
    info
}

fn round_trip(info: &InstanceInfo) -> Stored {
    let stored = Stored::from(info);
    assert_eq!(&stored.info(), info, "read back as stored");
    stored
}

#[test]
fn every_instance_of_the_sample_documents_reads_back_equal() {
    let mut seen = 0;
    for file in [
        "eureka-apps.json",
        "eureka-apps-big-numbers.json",
        "eureka-apps-single.json",
        "eureka-delta.json",
        "eureka-apps-one-bad-instance.json",
    ] {
        let doc = parse_document(&testdata(file)).expect(file);
        for info in (doc.applications.application.iter()).flat_map(|a| &a.instance) {
            round_trip(info);
            let mut kept = info.clone();
            canonical(&mut kept);
            round_trip(&kept);
            seen += 1;
        }
    }
    assert!(seen >= 8, "only {seen} instances in the samples");
}

#[test]
fn absent_empty_and_word_texts_stay_apart() {
    let mut info = InstanceInfo {
        instance_id: Some(String::new()),
        host_name: None,
        status: Some("UP".into()),
        overridden_status: Some("up".into()),
        app_group_name: Some("false".into()),
        vip_address: Some("a,b , c".into()),
        asg_name: Some("é ✓ \u{0}".into()),
        ..InstanceInfo::default()
    };
    info.metadata.insert("".into(), "".into());
    info.metadata.insert("UP".into(), "MyOwn".into());
    let stored = round_trip(&info);
    assert_eq!(stored.instance_id(), Some(""));
    assert_eq!(stored.app(), None);
    assert_eq!(stored.status_texts(), [Some("UP"), Some("up"), None]);
    round_trip(&InstanceInfo::default());
}

#[test]
fn unknown_fields_at_every_level_are_kept() {
    let info = read(json!({
        "instanceId": "a-1", "somethingNew": {"nested": [1, "x", null]}, "flag": "x",
        "dataCenterInfo": {"@class": "x.Y", "name": "Elsewhere",
                           "metadata": {"availability-zone": "z1", "instance-id": "i-1"},
                           "extra": {"deep": 1}},
        "leaseInfo": {"durationInSecs": 30, "weird": [1]},
        "port": 8080, "securePort": {"$": "8443"}, "actionType": "DELETED",
    }));
    assert!(!info.other.is_empty());
    let stored = round_trip(&info);
    assert_eq!(
        stored.info().other["somethingNew"],
        json!({"nested": [1, "x", null]})
    );
}

#[test]
fn every_number_width_and_action_reads_back() {
    for n in [
        0,
        1,
        127,
        128,
        16_383,
        16_384,
        u64::from(u32::MAX),
        u64::MAX,
    ] {
        for action in [ActionType::Added, ActionType::Modified, ActionType::Deleted] {
            let info = InstanceInfo {
                country_id: Some(n),
                last_dirty_timestamp: Some(n),
                port: Some(Port::enabled(u16::try_from(n % 65_536).unwrap())),
                secure_port: Some(Port::disabled(u16::MAX)),
                is_coordinating_discovery_server: Some(n % 2 == 0),
                action_type: Some(action),
                lease_info: Some(LeaseInfo {
                    service_up_timestamp: Some(n),
                    ..LeaseInfo::default()
                }),
                ..InstanceInfo::default()
            };
            let stored = round_trip(&info);
            assert_eq!(stored.last_dirty_timestamp(), Some(n));
            assert_eq!(stored.service_up_timestamp(), Some(n));
        }
    }
}

#[test]
fn what_the_ledger_reads_in_place_is_what_the_document_says() {
    let info = spring();
    let stored = round_trip(&info);
    assert_eq!(stored.app(), info.app.as_deref());
    assert_eq!(stored.instance_id(), info.instance_id.as_deref());
    assert_eq!(stored.status(), info.status());
    assert_eq!(stored.vip_address(false), Some("svc-000001"));
    assert_eq!(stored.vip_address(true), Some("svc-000001"));
    assert_eq!(stored.last_dirty_timestamp(), Some(1_716_812_345_678));
    for (status, expected) in [(None, Status::Up), (Some("DOWN"), Status::Down)] {
        let mut info = info.clone();
        info.status = status.map(str::to_owned);
        assert_eq!(Stored::from(&info).status(), expected);
    }
    let mut odd = info.clone();
    odd.status = Some("SLEEPY".into());
    assert_eq!(
        Stored::from(&odd).status(),
        Status::Unknown,
        "as InstanceInfo::status"
    );
    assert_eq!(odd.status(), Status::Unknown);
}

#[test]
fn a_spring_instance_takes_its_texts_and_little_more() {
    let info = spring();
    let stored = round_trip(&info);
    let metadata = info.metadata.iter().map(|(k, v)| k.len() + v.len());
    let texts: usize = (texts(&info).into_iter().flatten())
        .map(String::len)
        .chain(metadata)
        .sum();
    assert!(texts > 250, "{texts}");
    // The rest is a tag per field and eleven numbers, six of them timestamps (InstanceInfo
    // takes 712 bytes before its texts, each in an allocation of its own).
    assert!(
        stored.len() <= texts + 96,
        "{} bytes stored for {texts} bytes of text",
        stored.len()
    );
}

#[test]
fn timestamps_far_apart_in_any_order_read_back() {
    let stamps = [u64::MAX, 0, 1 << 63, 1_716_812_345_678, (1 << 63) - 1, 1];
    for shift in 0..stamps.len() {
        let at = |i: usize| Some(stamps[(i + shift) % stamps.len()]);
        let info = InstanceInfo {
            last_updated_timestamp: at(0),
            last_dirty_timestamp: at(1),
            lease_info: Some(LeaseInfo {
                registration_timestamp: at(2),
                last_renewal_timestamp: at(3),
                eviction_timestamp: at(4),
                service_up_timestamp: at(5),
                ..LeaseInfo::default()
            }),
            ..InstanceInfo::default()
        };
        let stored = round_trip(&info);
        assert_eq!(stored.last_dirty_timestamp(), at(1));
        assert_eq!(stored.service_up_timestamp(), at(5));
    }
}

#[test]
fn a_registrations_timestamps_take_a_byte_each_after_the_first() {
    let mut info = spring();
    let stored = round_trip(&info);
    info.last_dirty_timestamp = None;
    info.lease_info = None;
    let without = Stored::from(&info);
    // The lease's tag, then a tag and a byte for each of its six numbers (two intervals,
    // eviction 0, three timestamps of the same millisecond as lastUpdatedTimestamp), and
    // the same for lastDirtyTimestamp: each of those four timestamps takes one byte where
    // its milliseconds would take six.
    assert_eq!(stored.len() - without.len(), 1 + 6 * 2 + 2);
}
