//! Eureka's `{"applications": ...}` documents (`GET /apps`, `/apps/delta`) read as they
//! arrive: each instance is handed over as soon as it is read, and no tree of the document is
//! built, so a registry of millions of instances costs the reader one instance at a time.
//!
//! Lenient as [`json::parse_document`] is: `application` and `instance` may be one object
//! instead of a list (or null), an instance that cannot be read is reported and skipped, and
//! only a document that is not JSON, or not shaped like Eureka's, fails. An application's
//! `name` may come after its `instance` list: that list is then kept as text until the name
//! is known.

use std::fmt;
use std::io;

use serde::Deserialize;
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value;
use serde_json::value::RawValue;

use odmesh_registry::InvalidInstance;

use super::json::{self, InstanceInfo, InvalidDocument};

/// What a document says besides its instances.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Head {
    /// `versions__delta`.
    pub versions_delta: Option<String>,
    /// `apps__hashcode`: the reconcile hash code of the server's whole registry.
    pub apps_hashcode: Option<String>,
}

/// One instance as read: its application's name, its position in that application's list
/// (counted from 0), and the instance, or why it could not be read.
pub type Sink<'a> = dyn FnMut(&str, usize, Result<InstanceInfo, InvalidInstance>) + 'a;

/// Reads a document from `reader`, handing each instance to `sink` in the order of the
/// document. A document that fails after some instances were handed over fails as a whole:
/// the caller drops what it got.
pub fn read_document(reader: impl io::Read, sink: &mut Sink<'_>) -> Result<Head, InvalidDocument> {
    let mut de = serde_json::Deserializer::from_reader(reader);
    let head = Root { sink }.deserialize(&mut de).map_err(invalid)?;
    de.end().map_err(invalid)?;
    Ok(head)
}

/// [`read_document`] over a document in memory.
pub fn read_document_slice(json: &[u8], sink: &mut Sink<'_>) -> Result<Head, InvalidDocument> {
    let mut de = serde_json::Deserializer::from_slice(json);
    let head = Root { sink }.deserialize(&mut de).map_err(invalid)?;
    de.end().map_err(invalid)?;
    Ok(head)
}

fn invalid(e: serde_json::Error) -> InvalidDocument {
    match e.classify() {
        serde_json::error::Category::Data => InvalidDocument::Shape(e.to_string()),
        serde_json::error::Category::Io => InvalidDocument::Unreadable(e.into()),
        _ => InvalidDocument::Json(e),
    }
}

/// A lenient string (see `json::lenient`).
struct Text(Option<String>);

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Text, D::Error> {
        json::lenient::opt_string(d).map(Text)
    }
}

/// The top level: `{"applications": {...}}`, other keys ignored.
struct Root<'s, 'a> {
    sink: &'s mut Sink<'a>,
}

impl<'de> DeserializeSeed<'de> for Root<'_, '_> {
    type Value = Head;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Head, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Root<'_, '_> {
    type Value = Head;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object with `applications` at the top level")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Head, A::Error> {
        let mut head = None;
        while let Some(key) = map.next_key::<String>()? {
            if key == "applications" && head.is_none() {
                head = Some(map.next_value_seed(Applications {
                    sink: &mut *self.sink,
                })?);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        head.ok_or_else(|| de::Error::custom("no `applications` at the top level"))
    }
}

/// `{"versions__delta": ..., "apps__hashcode": ..., "application": [...]}`.
struct Applications<'s, 'a> {
    sink: &'s mut Sink<'a>,
}

impl<'de> DeserializeSeed<'de> for Applications<'_, '_> {
    type Value = Head;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Head, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Applications<'_, '_> {
    type Value = Head;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("`applications` as an object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Head, A::Error> {
        let mut head = Head::default();
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "versions__delta" => head.versions_delta = map.next_value::<Text>()?.0,
                "apps__hashcode" => head.apps_hashcode = map.next_value::<Text>()?.0,
                "application" => map.next_value_seed(AppList {
                    sink: &mut *self.sink,
                })?,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(head)
    }
}

/// `application`: a list of applications, one application, or null.
struct AppList<'s, 'a> {
    sink: &'s mut Sink<'a>,
}

impl<'de> DeserializeSeed<'de> for AppList<'_, '_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for AppList<'_, '_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("`application` as a list of application objects")
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq
            .next_element_seed(App {
                sink: &mut *self.sink,
            })?
            .is_some()
        {}
        Ok(())
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<(), A::Error> {
        App { sink: self.sink }.visit_map(map)
    }
}

/// One application: `{"name": ..., "instance": [...]}`.
struct App<'s, 'a> {
    sink: &'s mut Sink<'a>,
}

impl<'de> DeserializeSeed<'de> for App<'_, '_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for App<'_, '_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an application object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut name: Option<String> = None;
        // The instances met before the name, as text.
        let mut early: Vec<Box<RawValue>> = Vec::new();
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "name" => name = Some(map.next_value::<Text>()?.0.unwrap_or_default()),
                "instance" => match &name {
                    Some(app) => map.next_value_seed(InstanceList {
                        app,
                        sink: &mut *self.sink,
                    })?,
                    None => early.push(map.next_value::<Box<RawValue>>()?),
                },
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        let app = name.unwrap_or_default();
        for raw in early {
            let mut de = serde_json::Deserializer::from_str(raw.get());
            InstanceList {
                app: &app,
                sink: &mut *self.sink,
            }
            .deserialize(&mut de)
            .map_err(de::Error::custom)?;
        }
        Ok(())
    }
}

/// An application's `instance`: a list, one instance, or null. Each instance is read as
/// text first, so that one that does not read as an instance is skipped, not the document.
struct InstanceList<'s, 'a, 'n> {
    app: &'n str,
    sink: &'s mut Sink<'a>,
}

impl InstanceList<'_, '_, '_> {
    fn one(&mut self, index: usize, text: &str) {
        let read = serde_json::from_str::<InstanceInfo>(text).map_err(|e| {
            let instance_id = serde_json::from_str::<Value>(text)
                .ok()
                .and_then(|v| v.get("instanceId")?.as_str().map(str::to_owned));
            InvalidInstance {
                index,
                app: self.app.to_owned(),
                instance_id,
                field: "instance".into(),
                reason: e.to_string(),
            }
        });
        (self.sink)(self.app, index, read);
    }
}

impl<'de> DeserializeSeed<'de> for InstanceList<'_, '_, '_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for InstanceList<'_, '_, '_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("`instance` as a list of instances")
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<(), A::Error> {
        let mut index = 0;
        while let Some(raw) = seq.next_element::<Box<RawValue>>()? {
            self.one(index, raw.get());
            index += 1;
        }
        Ok(())
    }
    fn visit_map<A: MapAccess<'de>>(mut self, map: A) -> Result<(), A::Error> {
        let value = Value::deserialize(de::value::MapAccessDeserializer::new(map))?;
        self.one(0, &value.to_string());
        Ok(())
    }
    // Anything else as one instance, which then does not read.
    fn visit_str<E: de::Error>(mut self, v: &str) -> Result<(), E> {
        self.one(0, &Value::from(v).to_string());
        Ok(())
    }
    fn visit_bool<E: de::Error>(mut self, v: bool) -> Result<(), E> {
        self.one(0, &v.to_string());
        Ok(())
    }
    fn visit_u64<E: de::Error>(mut self, v: u64) -> Result<(), E> {
        self.one(0, &v.to_string());
        Ok(())
    }
    fn visit_i64<E: de::Error>(mut self, v: i64) -> Result<(), E> {
        self.one(0, &v.to_string());
        Ok(())
    }
    fn visit_f64<E: de::Error>(mut self, v: f64) -> Result<(), E> {
        self.one(0, &Value::from(v).to_string());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testdata::read as testdata;

    /// An instance as handed over: its app, its index, the instance or why not.
    type Handed = (String, usize, Result<InstanceInfo, InvalidInstance>);

    /// Every instance `read_document` hands over.
    fn read_all(json: &[u8]) -> Result<(Head, Vec<Handed>), InvalidDocument> {
        let mut got = Vec::new();
        let head = read_document(json, &mut |app, index, inst| {
            got.push((app.to_owned(), index, inst))
        })?;
        Ok((head, got))
    }

    #[test]
    fn a_document_read_as_it_streams_gives_what_parse_document_gives() {
        for fixture in [
            "eureka-apps.json",
            "eureka-apps-single.json",
            "eureka-delta.json",
            "eureka-apps-one-bad-instance.json",
            "eureka-apps-big-numbers.json",
        ] {
            let bytes = testdata(fixture);
            let whole = json::parse_document(&bytes).unwrap();
            let (head, got) = read_all(&bytes).unwrap();
            assert_eq!(
                head.apps_hashcode, whole.applications.apps_hashcode,
                "{fixture}"
            );
            assert_eq!(
                head.versions_delta, whole.applications.versions_delta,
                "{fixture}"
            );
            let instances: Vec<&InstanceInfo> = (whole.applications.application.iter())
                .flat_map(|a| &a.instance)
                .collect();
            let streamed: Vec<&InstanceInfo> =
                got.iter().filter_map(|(_, _, i)| i.as_ref().ok()).collect();
            assert_eq!(streamed, instances, "{fixture}");
            let rejected: Vec<&InvalidInstance> = got
                .iter()
                .filter_map(|(_, _, i)| i.as_ref().err())
                .collect();
            assert_eq!(rejected.len(), whole.rejected.len(), "{fixture}");
            for (r, w) in rejected.iter().zip(&whole.rejected) {
                assert_eq!(
                    (r.index, &r.app, &r.instance_id),
                    (w.index, &w.app, &w.instance_id)
                );
            }
        }
    }

    #[test]
    fn an_application_whose_name_comes_after_its_instances_still_names_them() {
        let doc = br#"{"applications": {"application": [
            {"instance": [{"instanceId": "a", "ipAddr": "10.0.0.1"}], "name": "LATE"},
            {"name": "ONE", "instance": {"instanceId": "b", "ipAddr": "10.0.0.2"}},
            {"name": "NONE", "instance": null}]}}"#;
        let (head, got) = read_all(doc).unwrap();
        assert_eq!(head, Head::default());
        let names: Vec<(&str, usize, Option<&str>)> = got
            .iter()
            .map(|(app, index, i)| (app.as_str(), *index, i.as_ref().unwrap().id()))
            .collect();
        assert_eq!(names, [("LATE", 0, Some("a")), ("ONE", 0, Some("b"))]);
    }

    #[test]
    fn a_document_that_is_not_eurekas_or_not_json_fails_and_says_why() {
        let shape = |doc: &[u8]| match read_all(doc) {
            Err(InvalidDocument::Shape(why)) => why,
            other => panic!("{other:?}"),
        };
        assert!(shape(br#"{"apps": []}"#).contains("no `applications`"));
        assert!(shape(br#"[1]"#).contains("an object with `applications`"));
        assert!(shape(br#"{"applications": {"application": [7]}}"#).contains("application object"));
        assert!(matches!(
            read_all(b"{\"applications\": {"),
            Err(InvalidDocument::Json(_))
        ));
        assert!(matches!(
            read_all(&testdata("broken.json")),
            Err(InvalidDocument::Json(_))
        ));
        assert!(matches!(
            read_all(br#"{"applications": {}} trailing"#),
            Err(InvalidDocument::Json(_))
        ));
    }
}
