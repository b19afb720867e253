//! Reading Eureka's JSON as it streams in (`odmesh_eureka::wire::read::read_document`), as the
//! Eureka follower and a peer fill do, against `parse_document`, which reads the whole
//! document as a tree.
//!
//! Input: any bytes, meant as an `{"applications": ...}` document. Checks:
//! - a document `parse_document` accepts, and that repeats no key in any object (where a tree
//!   keeps the last value and the streamed read the first, or every one), is accepted, with the same `versions__delta` and
//!   `apps__hashcode`, every instance it read in the same order under the same application
//!   name, and the same instances skipped (their application, index and id). (The streamed
//!   read only checks the brackets and strings of what it skips, so it may accept more.)
//! - read a byte at a time, the document gives exactly what it gives read at once;
//! - a refused document says why.
#![no_main]

use std::io::Read;

use libfuzzer_sys::fuzz_target;
use odmesh_eureka::wire::json::{InstanceInfo, parse_document};
use odmesh_eureka::wire::read::{Head, read_document};
use odmesh_registry::InvalidInstance;

type Handed = (String, usize, Result<InstanceInfo, InvalidInstance>);

fn read_all(reader: impl Read) -> Result<(Head, Vec<Handed>), String> {
    let mut got = Vec::new();
    let head = read_document(reader, &mut |app, index, inst| {
        got.push((app.to_owned(), index, inst))
    })
    .map_err(|e| e.to_string())?;
    Ok((head, got))
}

/// One byte per read.
struct Trickle<'a>(&'a [u8]);

impl Read for Trickle<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let Some((first, rest)) = self.0.split_first() else {
            return Ok(0);
        };
        buf[0] = *first;
        self.0 = rest;
        Ok(1)
    }
}

/// Whether some object of the JSON `data` repeats a key (`None`: not JSON).
fn repeats_a_key(data: &[u8]) -> Option<bool> {
    use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
    struct Checked(bool);
    impl<'de> Deserialize<'de> for Checked {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Checked, D::Error> {
            d.deserialize_any(CheckedVisitor)
        }
    }
    struct CheckedVisitor;
    impl<'de> Visitor<'de> for CheckedVisitor {
        type Value = Checked;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("JSON")
        }
        fn visit_bool<E>(self, _: bool) -> Result<Checked, E> {
            Ok(Checked(false))
        }
        fn visit_i64<E>(self, _: i64) -> Result<Checked, E> {
            Ok(Checked(false))
        }
        fn visit_u64<E>(self, _: u64) -> Result<Checked, E> {
            Ok(Checked(false))
        }
        fn visit_f64<E>(self, _: f64) -> Result<Checked, E> {
            Ok(Checked(false))
        }
        fn visit_str<E>(self, _: &str) -> Result<Checked, E> {
            Ok(Checked(false))
        }
        fn visit_unit<E>(self) -> Result<Checked, E> {
            Ok(Checked(false))
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Checked, A::Error> {
            let mut repeats = false;
            while let Some(Checked(r)) = seq.next_element()? {
                repeats |= r;
            }
            Ok(Checked(repeats))
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Checked, A::Error> {
            let mut keys = std::collections::HashSet::new();
            let mut repeats = false;
            while let Some(key) = map.next_key::<String>()? {
                repeats |= !keys.insert(key);
                repeats |= map.next_value::<Checked>()?.0;
            }
            Ok(Checked(repeats))
        }
    }
    serde_json::from_slice::<Checked>(data).ok().map(|c| c.0)
}

fuzz_target!(|data: &[u8]| {
    let streamed = read_all(data);
    let trickled = read_all(Trickle(data));
    match (&streamed, &trickled) {
        (Ok(a), Ok(b)) => assert_eq!(a, b, "read a byte at a time, it reads otherwise"),
        (Err(a), Err(_)) => assert!(!a.is_empty()),
        _ => panic!("at once: {streamed:?}; a byte at a time: {trickled:?}"),
    }
    let Ok(whole) = parse_document(data) else {
        return;
    };
    if repeats_a_key(data) != Some(false) {
        return;
    }
    let (head, handed) = match streamed {
        Ok(read) => read,
        Err(e) => panic!("parse_document accepted it, the streamed read refused it: {e}"),
    };
    let apps = &whole.applications;
    assert_eq!(head.versions_delta, apps.versions_delta);
    assert_eq!(head.apps_hashcode, apps.apps_hashcode);
    let read: Vec<(&str, &InstanceInfo)> = (apps.application.iter())
        .flat_map(|a| a.instance.iter().map(move |i| (a.name.as_str(), i)))
        .collect();
    let streamed: Vec<(&str, &InstanceInfo)> = (handed.iter())
        .filter_map(|(app, _, i)| Some((app.as_str(), i.as_ref().ok()?)))
        .collect();
    assert_eq!(streamed, read);
    let skipped: Vec<(&str, usize, Option<&str>)> = (handed.iter())
        .filter_map(|(_, _, i)| i.as_ref().err())
        .map(|w| (w.app.as_str(), w.index, w.instance_id.as_deref()))
        .collect();
    let rejected: Vec<(&str, usize, Option<&str>)> = (whole.rejected.iter())
        .map(|w| (w.app.as_str(), w.index, w.instance_id.as_deref()))
        .collect();
    assert_eq!(skipped, rejected);
});
