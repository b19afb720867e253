//! Resource versions: a hash of the resource itself.
//!
//! A version is 64-bit FNV-1a over a canonical encoding of the resource as it is sent, so it
//! changes with anything that changes what Envoy gets and with nothing else, and no list of
//! fields has to follow the builder. It must come out the same in every process and every
//! build that sends the same resource: a proxy reconnecting to a restarted control plane (or
//! to another replica) names the versions it holds (`initial_resource_versions`) and is sent
//! only those that differ. Hence FNV-1a, whose definition is fixed, and not `DefaultHasher`,
//! whose algorithm may change from one Rust release to the next.
//!
//! Canonical, because prost's bytes are not: prost writes a `map<>` field (generated as a
//! `HashMap`) in iteration order, and two equal `HashMap`s iterate in different orders, each
//! with its own random seed. The canonical encoding is prost's bytes of the message with its
//! map fields taken out, then each map's entries in key order, a value that holds maps
//! itself (a `Struct`) walked the same way. Every part is length- or count-prefixed, so no
//! two different resources give the same bytes.
//!
//! Which maps: a `Cluster` odmesh builds fills two, `typed_extension_protocol_options` and
//! its `metadata` (`filter_metadata` holds the `odmesh` `Struct`); both are walked, and so is
//! the metadata's other map. The `Any` payloads inside it (HTTP protocol options, TLS
//! context) and the `ClusterLoadAssignment` fill no map field, so their prost bytes are
//! already canonical and are hashed as they are. The tests rebuild every shape of resource
//! and compare versions: a map with two entries or more appearing there fails them.

use std::collections::HashMap;

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::core::v3::Metadata;
use envoy_types::pb::google::protobuf::{Struct, Value, value};
use prost::Message;

/// The version of `cluster`. A cluster holds no endpoints, so an endpoint change leaves it
/// alone and never re-warms the cluster (which would drain its connection pools). Takes the
/// cluster by value, to take the maps out without a copy.
pub(super) fn cluster(mut cluster: Cluster) -> u64 {
    let options = std::mem::take(&mut cluster.typed_extension_protocol_options);
    let metadata = cluster.metadata.take();
    let mut h = Fnv64::default();
    h.message(&cluster);
    h.map(&options, Fnv64::message);
    h.len(usize::from(metadata.is_some()));
    if let Some(Metadata {
        filter_metadata,
        typed_filter_metadata,
    }) = &metadata
    {
        h.map(filter_metadata, Fnv64::structure);
        h.map(typed_filter_metadata, Fnv64::message);
    }
    h.0
}

/// The version of a load assignment, from its encoding (canonical: it has no map field) and
/// its cluster's version. A changed cluster thus always comes with a changed load
/// assignment, which the cache pushes right after it: a re-warming cluster never waits for
/// endpoints Envoy already has.
pub(super) fn load_assignment(cluster_version: u64, encoded: &[u8]) -> u64 {
    let mut h = Fnv64::default();
    h.bytes(&cluster_version.to_le_bytes());
    h.prefixed(encoded);
    h.0
}

/// The version of a resource whose encoding is canonical already (no map field holds more
/// than one entry, or the builder wrote the entries in key order): a hash of its bytes.
pub(super) fn encoded(encoded: &[u8]) -> u64 {
    let mut h = Fnv64::default();
    h.prefixed(encoded);
    h.0
}

/// FNV-1a, 64 bits, fed the canonical encoding.
struct Fnv64(u64);

impl Default for Fnv64 {
    fn default() -> Fnv64 {
        Fnv64(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv64 {
    fn bytes(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    fn len(&mut self, n: usize) {
        self.bytes(&(n as u64).to_le_bytes());
    }

    fn prefixed(&mut self, bytes: &[u8]) {
        self.len(bytes.len());
        self.bytes(bytes);
    }

    /// A message without map fields (or whose maps hold one entry at most): prost's bytes.
    fn message(&mut self, message: &impl Message) {
        self.prefixed(&message.encode_to_vec());
    }

    /// The entries in key order.
    fn map<V>(&mut self, map: &HashMap<String, V>, mut value: impl FnMut(&mut Self, &V)) {
        let mut entries: Vec<_> = map.iter().collect();
        entries.sort_unstable_by_key(|(key, _)| *key);
        self.len(entries.len());
        for (key, v) in entries {
            self.prefixed(key.as_bytes());
            value(self, v);
        }
    }

    fn structure(&mut self, s: &Struct) {
        self.map(&s.fields, Fnv64::value);
    }

    fn value(&mut self, v: &Value) {
        match &v.kind {
            Some(value::Kind::StructValue(s)) => {
                self.bytes(&[1]);
                self.structure(s);
            }
            Some(value::Kind::ListValue(list)) => {
                self.bytes(&[2]);
                self.len(list.values.len());
                for v in &list.values {
                    self.value(v);
                }
            }
            _ => {
                self.bytes(&[0]);
                self.message(v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::google::protobuf::{Any, ListValue};

    fn text(s: &str) -> Value {
        Value {
            kind: Some(value::Kind::StringValue(s.to_owned())),
        }
    }

    fn object(fields: &[(&str, Value)]) -> Value {
        Value {
            kind: Some(value::Kind::StructValue(Struct {
                fields: fields
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), v.clone()))
                    .collect(),
            })),
        }
    }

    /// A cluster with metadata of many fields (a nested `Struct` and a list among them) and
    /// three protocol options, each map filled in the order of `keys`.
    fn with_maps(keys: &[usize]) -> Cluster {
        let mut fields = HashMap::new();
        let mut options = HashMap::new();
        for &k in keys {
            fields.insert(format!("key{k}"), text(&format!("value {k}")));
            options.insert(
                format!("option{}", k % 3),
                Any {
                    type_url: format!("type.googleapis.com/o{}", k % 3),
                    value: vec![k as u8 % 3],
                },
            );
        }
        fields.insert(
            "nested".to_owned(),
            object(&[("a", text("1")), ("b", text("2")), ("c", text("3"))]),
        );
        fields.insert(
            "list".to_owned(),
            Value {
                kind: Some(value::Kind::ListValue(ListValue {
                    values: vec![text("x"), object(&[("y", text("1")), ("z", text("2"))])],
                })),
            },
        );
        Cluster {
            name: "hello.vip".to_owned(),
            metadata: Some(Metadata {
                filter_metadata: HashMap::from([("odmesh".to_owned(), Struct { fields })]),
                ..Default::default()
            }),
            typed_extension_protocol_options: options,
            ..Default::default()
        }
    }

    #[test]
    fn maps_filled_in_any_order_give_one_version_though_prost_encodes_them_apart() {
        let forward: Vec<usize> = (0..8).collect();
        let backward: Vec<usize> = (0..8).rev().collect();
        let first = with_maps(&forward);
        let mut encodings = std::collections::HashSet::new();
        for keys in [&forward, &backward].into_iter().cycle().take(40) {
            let again = with_maps(keys);
            assert_eq!(again, first, "the same cluster");
            encodings.insert(again.encode_to_vec());
            assert_eq!(cluster(again), cluster(first.clone()));
        }
        // What the canonical walk is for: equal clusters, different prost bytes.
        assert!(
            encodings.len() > 1,
            "prost encoded 40 fresh HashMaps alike: this test no longer shows the walk's use"
        );
    }

    #[test]
    fn a_change_in_any_map_changes_the_version() {
        let keys: Vec<usize> = (0..8).collect();
        let base = cluster(with_maps(&keys));
        fn meta(c: &mut Cluster) -> &mut HashMap<String, Value> {
            let metadata = c.metadata.as_mut().unwrap();
            &mut metadata.filter_metadata.get_mut("odmesh").unwrap().fields
        }
        type Change = fn(&mut Cluster);
        let changes: [(&str, Change); 8] = [
            ("a metadata value", |c| {
                meta(c).insert("key1".into(), text("other"));
            }),
            ("a metadata key", |c| {
                let v = meta(c).remove("key1").unwrap();
                meta(c).insert("key1b".into(), v);
            }),
            ("a field removed", |c| {
                meta(c).remove("key7");
            }),
            ("a nested value", |c| {
                meta(c).insert("nested".into(), object(&[("a", text("9"))]));
            }),
            ("a list", |c| {
                meta(c).insert("list".into(), text("x"));
            }),
            ("a protocol option", |c| {
                let option = c.typed_extension_protocol_options.get_mut("option0");
                option.unwrap().value = vec![7];
            }),
            ("typed metadata", |c| {
                let metadata = c.metadata.as_mut().unwrap();
                metadata
                    .typed_filter_metadata
                    .insert("odmesh".into(), Any::default());
            }),
            ("no metadata", |c| c.metadata = None),
        ];
        for (what, change) in changes {
            let mut changed = with_maps(&keys);
            change(&mut changed);
            assert_ne!(cluster(changed), base, "{what}");
        }
        let empty = Cluster {
            metadata: Some(Metadata::default()),
            ..Default::default()
        };
        assert_ne!(
            cluster(empty),
            cluster(Cluster::default()),
            "empty metadata is sent"
        );
    }

    #[test]
    fn a_load_assignments_version_follows_its_bytes_and_its_clusters_version() {
        let base = load_assignment(1, b"ab");
        assert_eq!(load_assignment(1, b"ab"), base);
        assert_ne!(load_assignment(2, b"ab"), base);
        assert_ne!(load_assignment(1, b"abc"), base);
    }
}
