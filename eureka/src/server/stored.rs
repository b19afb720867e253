//! The form in which the registry keeps an instance document: one shared allocation of a
//! few hundred bytes, where [`InstanceInfo`] takes 712 bytes inline and one more allocation
//! per text (docs/benchmarks.md 4, "The embedded registry at a million instances": the
//! document was 40% of the live heap).
//!
//! A [`Stored`] is written from an [`InstanceInfo`] and read back into an equal one
//! ([`Stored::info`]), whatever it holds: fields Eureka does not know are kept as their JSON
//! text. The ledger reads the few fields it decides on (status, `lastDirtyTimestamp`, the
//! VIPs) in place, and decodes the whole document only to answer with it or to change it.
//!
//! The bytes are a list of fields, each a tag byte and its value, in tag order, absent
//! fields left out:
//! - a text is a LEB128 number `n`: odd, it is word `n >> 1` of [`WORDS`] (the status words
//!   and data-center names that every instance repeats); even, `n >> 1` bytes of UTF-8
//!   follow;
//! - a number is LEB128; a timestamp (of the instance or its lease) after the first is its
//!   difference from the one before, zigzag-encoded, so that the five a registration stamps
//!   with the same or a close time take a byte or two each instead of six; a port is its
//!   number and a byte for `@enabled` (0 absent, 1 false, 2 true); a flag or an action is
//!   one byte;
//! - a metadata entry is two texts, one tagged field per entry, in key order.

use std::sync::Arc;

use serde_json::{Map, Value};

use odmesh_registry::Status;

use crate::wire::json::{ActionType, DataCenterInfo, InstanceInfo, LeaseInfo, Metadata, Port};

/// Texts that most instances carry, stored as their index: the status words and the
/// data-center names and classes Eureka writes.
const WORDS: [&str; 13] = [
    "UP",
    "DOWN",
    "STARTING",
    "OUT_OF_SERVICE",
    "UNKNOWN",
    "MyOwn",
    "Amazon",
    "Netflix",
    "com.netflix.appinfo.InstanceInfo$DefaultDataCenterInfo",
    "com.netflix.appinfo.MyDataCenterInfo",
    "com.netflix.appinfo.AmazonInfo",
    "true",
    "false",
];

/// The tags of the texts of an instance, in the order of [`texts`].
const TEXT_TAGS: std::ops::Range<u8> = 1..17;
const PORT: u8 = 17;
const SECURE_PORT: u8 = 18;
/// The tags of the numbers of an instance, in the order of [`numbers`].
const NUMBER_TAGS: std::ops::Range<u8> = 19..22;
const COORDINATING: u8 = 22;
const ACTION: u8 = 23;
const METADATA: u8 = 24;
const DATA_CENTER: u8 = 30;
const DATA_CENTER_CLASS: u8 = 31;
const DATA_CENTER_NAME: u8 = 32;
const DATA_CENTER_METADATA: u8 = 33;
const DATA_CENTER_OTHER: u8 = 34;
const LEASE: u8 = 40;
/// The tags of the lease's numbers, in the order of [`lease_numbers`].
const LEASE_NUMBER_TAGS: std::ops::Range<u8> = 41..47;
const LEASE_OTHER: u8 = 47;
const OTHER: u8 = 50;

/// The tags of the texts [`Stored`] reads in place.
const APP: u8 = 3;
const STATUS: u8 = 7;
const OVERRIDDEN_STATUS: u8 = 8;
const OVERRIDDEN_STATUS_LEGACY: u8 = 9;
const INSTANCE_ID: u8 = 1;
const VIP_ADDRESS: u8 = 14;
const SECURE_VIP_ADDRESS: u8 = 15;
const LAST_DIRTY: u8 = 21;
const SERVICE_UP: u8 = 46;

/// Whether the number tagged `tag` is a timestamp: `lastUpdatedTimestamp`,
/// `lastDirtyTimestamp`, and the lease's registration, last renewal and service-up times
/// (not its eviction time, 0 until evicted).
fn is_stamp(tag: u8) -> bool {
    matches!(tag, 20 | 21 | 43 | 44 | 46)
}

fn texts(i: &InstanceInfo) -> [&Option<String>; 16] {
    [
        &i.instance_id,
        &i.host_name,
        &i.app,
        &i.app_group_name,
        &i.ip_addr,
        &i.sid,
        &i.status,
        &i.overridden_status,
        &i.overriddenstatus_legacy,
        &i.home_page_url,
        &i.status_page_url,
        &i.health_check_url,
        &i.secure_health_check_url,
        &i.vip_address,
        &i.secure_vip_address,
        &i.asg_name,
    ]
}

fn texts_mut(i: &mut InstanceInfo) -> [&mut Option<String>; 16] {
    [
        &mut i.instance_id,
        &mut i.host_name,
        &mut i.app,
        &mut i.app_group_name,
        &mut i.ip_addr,
        &mut i.sid,
        &mut i.status,
        &mut i.overridden_status,
        &mut i.overriddenstatus_legacy,
        &mut i.home_page_url,
        &mut i.status_page_url,
        &mut i.health_check_url,
        &mut i.secure_health_check_url,
        &mut i.vip_address,
        &mut i.secure_vip_address,
        &mut i.asg_name,
    ]
}

fn numbers(i: &InstanceInfo) -> [Option<u64>; 3] {
    [
        i.country_id,
        i.last_updated_timestamp,
        i.last_dirty_timestamp,
    ]
}

fn numbers_mut(i: &mut InstanceInfo) -> [&mut Option<u64>; 3] {
    [
        &mut i.country_id,
        &mut i.last_updated_timestamp,
        &mut i.last_dirty_timestamp,
    ]
}

fn lease_numbers(l: &LeaseInfo) -> [Option<u64>; 6] {
    [
        l.renewal_interval_in_secs,
        l.duration_in_secs,
        l.registration_timestamp,
        l.last_renewal_timestamp,
        l.eviction_timestamp,
        l.service_up_timestamp,
    ]
}

fn lease_numbers_mut(l: &mut LeaseInfo) -> [&mut Option<u64>; 6] {
    [
        &mut l.renewal_interval_in_secs,
        &mut l.duration_in_secs,
        &mut l.registration_timestamp,
        &mut l.last_renewal_timestamp,
        &mut l.eviction_timestamp,
        &mut l.service_up_timestamp,
    ]
}

/// An instance document as the registry keeps it; cloning shares it.
#[derive(Clone, PartialEq, Eq)]
pub struct Stored(Arc<[u8]>);

impl std::fmt::Debug for Stored {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Stored").field(&self.info()).finish()
    }
}

impl From<&InstanceInfo> for Stored {
    fn from(info: &InstanceInfo) -> Stored {
        let mut w = Writer {
            bytes: Vec::with_capacity(256),
            stamp: None,
        };
        for (tag, text) in TEXT_TAGS.zip(texts(info)) {
            if let Some(text) = text {
                w.tag(tag).text(text);
            }
        }
        for (tag, port) in [(PORT, info.port), (SECURE_PORT, info.secure_port)] {
            if let Some(port) = port {
                w.tag(tag).number(port.port.into());
                w.byte(match port.enabled {
                    None => 0,
                    Some(false) => 1,
                    Some(true) => 2,
                });
            }
        }
        for (tag, number) in NUMBER_TAGS.zip(numbers(info)) {
            if let Some(number) = number {
                w.tag(tag).value(tag, number);
            }
        }
        if let Some(flag) = info.is_coordinating_discovery_server {
            w.tag(COORDINATING).byte(flag.into());
        }
        if let Some(action) = info.action_type {
            w.tag(ACTION).byte(match action {
                ActionType::Added => 0,
                ActionType::Modified => 1,
                ActionType::Deleted => 2,
            });
        }
        for (key, value) in info.metadata.iter() {
            w.tag(METADATA).text(key).text(value);
        }
        if let Some(dc) = &info.data_center_info {
            w.tag(DATA_CENTER);
            if let Some(class) = &dc.class {
                w.tag(DATA_CENTER_CLASS).text(class);
            }
            if let Some(name) = &dc.name {
                w.tag(DATA_CENTER_NAME).text(name);
            }
            for (key, value) in &dc.metadata {
                w.tag(DATA_CENTER_METADATA).text(key).text(value);
            }
            w.other(DATA_CENTER_OTHER, &dc.other);
        }
        if let Some(lease) = &info.lease_info {
            w.tag(LEASE);
            for (tag, number) in LEASE_NUMBER_TAGS.zip(lease_numbers(lease)) {
                if let Some(number) = number {
                    w.tag(tag).value(tag, number);
                }
            }
            w.other(LEASE_OTHER, &lease.other);
        }
        w.other(OTHER, &info.other);
        Stored(w.bytes.into())
    }
}

impl Stored {
    /// The document, as it was stored.
    pub fn info(&self) -> InstanceInfo {
        let mut info = InstanceInfo::default();
        let mut metadata = Vec::new();
        for (tag, field) in self.fields() {
            match (tag, field) {
                (t, Field::Text(text)) if TEXT_TAGS.contains(&t) => {
                    *texts_mut(&mut info)[usize::from(t - TEXT_TAGS.start)] = Some(text.into());
                }
                (PORT | SECURE_PORT, Field::Port(port)) => {
                    let slot = if tag == PORT {
                        &mut info.port
                    } else {
                        &mut info.secure_port
                    };
                    *slot = Some(port);
                }
                (t, Field::Number(n)) if NUMBER_TAGS.contains(&t) => {
                    *numbers_mut(&mut info)[usize::from(t - NUMBER_TAGS.start)] = Some(n);
                }
                (COORDINATING, Field::Flag(flag)) => {
                    info.is_coordinating_discovery_server = Some(flag);
                }
                (ACTION, Field::Action(action)) => info.action_type = Some(action),
                (METADATA, Field::Entry(key, value)) => metadata.push((key.into(), value.into())),
                (DATA_CENTER, Field::Marker) => info.data_center_info = Some(Default::default()),
                (LEASE, Field::Marker) => info.lease_info = Some(Default::default()),
                (DATA_CENTER_CLASS, Field::Text(t)) => {
                    data_center(&mut info).class = Some(t.into())
                }
                (DATA_CENTER_NAME, Field::Text(t)) => data_center(&mut info).name = Some(t.into()),
                (DATA_CENTER_METADATA, Field::Entry(k, v)) => {
                    data_center(&mut info).metadata.insert(k.into(), v.into());
                }
                (DATA_CENTER_OTHER, Field::Other(other)) => {
                    data_center(&mut info).other = map(other)
                }
                (t, Field::Number(n)) if LEASE_NUMBER_TAGS.contains(&t) => {
                    *lease_numbers_mut(lease(&mut info))
                        [usize::from(t - LEASE_NUMBER_TAGS.start)] = Some(n);
                }
                (LEASE_OTHER, Field::Other(other)) => lease(&mut info).other = map(other),
                (OTHER, Field::Other(other)) => info.other = map(other),
                (tag, _) => unreachable!("tag {tag} is written with another kind"),
            }
        }
        info.metadata = Metadata::from_iter(metadata);
        info
    }

    /// Whether `other` is this very document, shared (not a copy).
    pub fn same(&self, other: &Stored) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// How many bytes it takes (not counting the allocation's own).
    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The field tagged `wanted`: fields are in tag order, so the scan stops past it.
    fn field(&self, wanted: u8) -> Option<Field<'_>> {
        (self.fields())
            .take_while(|(tag, _)| *tag <= wanted)
            .find_map(|(tag, field)| (tag == wanted).then_some(field))
    }

    fn text(&self, wanted: u8) -> Option<&str> {
        match self.field(wanted)? {
            Field::Text(text) => Some(text),
            _ => None,
        }
    }

    fn number(&self, wanted: u8) -> Option<u64> {
        match self.field(wanted)? {
            Field::Number(n) => Some(n),
            _ => None,
        }
    }

    /// `app`.
    pub fn app(&self) -> Option<&str> {
        self.text(APP)
    }

    /// `instanceId`.
    pub fn instance_id(&self) -> Option<&str> {
        self.text(INSTANCE_ID)
    }

    /// The status, with Eureka's rules (see [`InstanceInfo::status`]).
    pub fn status(&self) -> Status {
        match self.text(STATUS) {
            None => Status::Up,
            Some(s) => Status::parse(s).unwrap_or(Status::Unknown),
        }
    }

    /// The `status`, `overriddenStatus` and `overriddenstatus` texts, as stored.
    pub fn status_texts(&self) -> [Option<&str>; 3] {
        [STATUS, OVERRIDDEN_STATUS, OVERRIDDEN_STATUS_LEGACY].map(|tag| self.text(tag))
    }

    /// `vipAddress`, or with `secure`, `secureVipAddress`.
    pub fn vip_address(&self, secure: bool) -> Option<&str> {
        self.text(if secure {
            SECURE_VIP_ADDRESS
        } else {
            VIP_ADDRESS
        })
    }

    /// `lastDirtyTimestamp`.
    pub fn last_dirty_timestamp(&self) -> Option<u64> {
        self.number(LAST_DIRTY)
    }

    /// `leaseInfo.serviceUpTimestamp`.
    pub fn service_up_timestamp(&self) -> Option<u64> {
        self.number(SERVICE_UP)
    }

    fn fields(&self) -> Fields<'_> {
        Fields {
            rest: &self.0,
            stamp: None,
        }
    }
}

/// Fields not known, read back from their JSON text.
fn map(json: &str) -> Map<String, Value> {
    serde_json::from_str(json).expect("stored as JSON")
}

fn data_center(info: &mut InstanceInfo) -> &mut DataCenterInfo {
    info.data_center_info
        .get_or_insert_with(DataCenterInfo::default)
}

fn lease(info: &mut InstanceInfo) -> &mut LeaseInfo {
    info.lease_info.get_or_insert_with(LeaseInfo::default)
}

/// A field's value, as read.
#[derive(Debug)]
enum Field<'a> {
    Text(&'a str),
    Number(u64),
    Port(Port),
    Flag(bool),
    Action(ActionType),
    Entry(&'a str, &'a str),
    /// Fields not known, as JSON text (read only when the whole document is).
    Other(&'a str),
    /// A record (the data center, the lease) is present; its fields follow.
    Marker,
}

/// The fields of a [`Stored`], in order.
struct Fields<'a> {
    rest: &'a [u8],
    /// The last timestamp read.
    stamp: Option<u64>,
}

impl<'a> Iterator for Fields<'a> {
    type Item = (u8, Field<'a>);

    fn next(&mut self) -> Option<(u8, Field<'a>)> {
        let (&tag, _) = self.rest.split_first()?;
        self.rest = &self.rest[1..];
        let field = match tag {
            t if TEXT_TAGS.contains(&t) => Field::Text(self.text()),
            DATA_CENTER_CLASS | DATA_CENTER_NAME => Field::Text(self.text()),
            PORT | SECURE_PORT => {
                let port = u16::try_from(self.number()).expect("stored as a port");
                let enabled = match self.byte() {
                    0 => None,
                    flag => Some(flag == 2),
                };
                Field::Port(Port { port, enabled })
            }
            t if NUMBER_TAGS.contains(&t) || LEASE_NUMBER_TAGS.contains(&t) => {
                Field::Number(self.value(t))
            }
            COORDINATING => Field::Flag(self.byte() != 0),
            ACTION => Field::Action(match self.byte() {
                0 => ActionType::Added,
                1 => ActionType::Modified,
                _ => ActionType::Deleted,
            }),
            METADATA | DATA_CENTER_METADATA => Field::Entry(self.text(), self.text()),
            DATA_CENTER_OTHER | LEASE_OTHER | OTHER => Field::Other(self.text()),
            DATA_CENTER | LEASE => Field::Marker,
            tag => unreachable!("no field is tagged {tag}"),
        };
        Some((tag, field))
    }
}

impl<'a> Fields<'a> {
    fn byte(&mut self) -> u8 {
        let (&b, rest) = self.rest.split_first().expect("a stored byte");
        self.rest = rest;
        b
    }

    fn number(&mut self) -> u64 {
        let mut n = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte();
            n |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                break;
            }
        }
        n
    }

    /// The number tagged `tag` (see [`is_stamp`]).
    fn value(&mut self, tag: u8) -> u64 {
        let n = self.number();
        if !is_stamp(tag) {
            return n;
        }
        let stamp = match self.stamp {
            None => n,
            Some(before) => before.wrapping_add(((n >> 1) as i64 ^ -((n & 1) as i64)) as u64),
        };
        self.stamp = Some(stamp);
        stamp
    }

    fn text(&mut self) -> &'a str {
        let n = self.number();
        if n & 1 == 1 {
            return WORDS[(n >> 1) as usize];
        }
        let (text, rest) = self.rest.split_at((n >> 1) as usize);
        self.rest = rest;
        std::str::from_utf8(text).expect("stored as UTF-8")
    }
}

struct Writer {
    bytes: Vec<u8>,
    /// The last timestamp written.
    stamp: Option<u64>,
}

impl Writer {
    /// Number `n`, tagged `tag`: a timestamp as its difference from the one before.
    fn value(&mut self, tag: u8, n: u64) -> &mut Writer {
        if !is_stamp(tag) {
            return self.number(n);
        }
        let written = match self.stamp {
            None => n,
            Some(before) => {
                let difference = n.wrapping_sub(before) as i64;
                ((difference << 1) ^ (difference >> 63)) as u64
            }
        };
        self.stamp = Some(n);
        self.number(written)
    }

    fn tag(&mut self, tag: u8) -> &mut Writer {
        self.bytes.push(tag);
        self
    }

    fn byte(&mut self, b: u8) -> &mut Writer {
        self.bytes.push(b);
        self
    }

    fn number(&mut self, mut n: u64) -> &mut Writer {
        while n >= 0x80 {
            self.bytes.push((n as u8) | 0x80);
            n >>= 7;
        }
        self.bytes.push(n as u8);
        self
    }

    fn text(&mut self, text: &str) -> &mut Writer {
        match WORDS.iter().position(|w| *w == text) {
            Some(i) => self.number(((i as u64) << 1) | 1),
            None => {
                self.number((text.len() as u64) << 1);
                self.bytes.extend_from_slice(text.as_bytes());
                self
            }
        }
    }

    /// Fields not known, as their JSON text, if there are any.
    fn other(&mut self, tag: u8, other: &Map<String, Value>) {
        if !other.is_empty() {
            let json = Value::Object(other.clone()).to_string();
            self.tag(tag).text(&json);
        }
    }
}

#[cfg(test)]
mod tests;
