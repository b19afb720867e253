//! Eureka's `{"applications": ...}` documents (`GET /apps`, `/apps/delta`) read as they
//! arrive: each instance is handed over as soon as it is read, and no tree of the document is
//! built, so a registry of millions of instances costs the reader one instance at a time.
//!
//! Lenient as [`json::parse_document`] is: `application` and `instance` may be one object
//! instead of a list (or null), an instance that cannot be read is reported and skipped, and
//! only a document that is not JSON, or not shaped like Eureka's, fails. An application's
//! `name` may come after its `instance` list: that list is then kept as text until the name
//! is known. Values this reader skips (fields it does not know, above the instances) are
//! checked only for balanced brackets and strings.

use std::io;

use serde::{Deserialize, Deserializer};
use serde_json::Value;

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
///
/// The levels above the instances are walked by [`Scanner`], which cuts out each instance's
/// bytes; serde_json reads those from a slice (reading the whole stream through serde_json's
/// `io::Read` path took twice the time, a byte at a time: docs/benchmarks.md, section 10).
pub fn read_document(reader: impl io::Read, sink: &mut Sink<'_>) -> Result<Head, InvalidDocument> {
    Scanner::new(reader).document(sink)
}

/// [`read_document`] over a document in memory.
pub fn read_document_slice(json: &[u8], sink: &mut Sink<'_>) -> Result<Head, InvalidDocument> {
    read_document(json, sink)
}

fn shape(what: &str) -> InvalidDocument {
    InvalidDocument::Shape(what.to_owned())
}

/// A document's bytes as they are read, kept from the start of the value being cut out
/// (`mark`) or from the read position.
struct Scanner<R> {
    reader: R,
    buf: Vec<u8>,
    pos: usize,
    end: usize,
    mark: Option<usize>,
    eof: bool,
}

impl<R: io::Read> Scanner<R> {
    fn new(reader: R) -> Scanner<R> {
        Scanner {
            reader,
            buf: vec![0; 1 << 16],
            pos: 0,
            end: 0,
            mark: None,
            eof: false,
        }
    }

    /// Reads more; false at the end of the document.
    fn fill(&mut self) -> Result<bool, InvalidDocument> {
        if self.eof {
            return Ok(false);
        }
        let keep = self.mark.unwrap_or(self.pos);
        if keep > 0 {
            self.buf.copy_within(keep..self.end, 0);
            self.end -= keep;
            self.pos -= keep;
            self.mark = self.mark.map(|_| 0);
        }
        if self.end == self.buf.len() {
            let grown = self.buf.len() * 2;
            self.buf.resize(grown, 0);
        }
        let n = loop {
            match self.reader.read(&mut self.buf[self.end..]) {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(InvalidDocument::Unreadable(e)),
            }
        };
        self.end += n;
        self.eof = n == 0;
        Ok(n > 0)
    }

    /// The next byte that is not white space, not consumed; `None` at the end.
    fn peek(&mut self) -> Result<Option<u8>, InvalidDocument> {
        loop {
            while self.pos < self.end {
                match self.buf[self.pos] {
                    b' ' | b'\t' | b'\n' | b'\r' => self.pos += 1,
                    b => return Ok(Some(b)),
                }
            }
            if !self.fill()? {
                return Ok(None);
            }
        }
    }

    fn syntax(&self, what: &str) -> InvalidDocument {
        InvalidDocument::Syntax(what.to_owned())
    }

    /// The next byte that is not white space, consumed.
    fn next(&mut self) -> Result<u8, InvalidDocument> {
        let b = self
            .peek()?
            .ok_or_else(|| self.syntax("the document ends early"))?;
        self.pos += 1;
        Ok(b)
    }

    fn expect(&mut self, want: u8) -> Result<(), InvalidDocument> {
        let got = self.next()?;
        if got != want {
            return Err(self.syntax(&format!(
                "expected `{}`, found `{}`",
                want as char,
                got.escape_ascii()
            )));
        }
        Ok(())
    }

    /// Past the rest of a string whose opening quote was consumed.
    fn skip_string(&mut self) -> Result<(), InvalidDocument> {
        loop {
            let rest = &self.buf[self.pos..self.end];
            match rest.iter().position(|b| matches!(b, b'"' | b'\\')) {
                Some(i) if rest[i] == b'"' => {
                    self.pos += i + 1;
                    return Ok(());
                }
                Some(i) if self.pos + i + 1 < self.end => self.pos += i + 2,
                Some(i) => {
                    // A backslash at the end of what is read: read on, then skip it and its character.
                    self.pos += i;
                    if !self.fill()? || self.end - self.pos < 2 && !self.fill()? {
                        return Err(self.syntax("the document ends in a string"));
                    }
                    self.pos += 2;
                }
                None => {
                    self.pos = self.end;
                    if !self.fill()? {
                        return Err(self.syntax("the document ends in a string"));
                    }
                }
            }
        }
    }

    /// Past one value: a string, a scalar, or a whole object or array (brackets matched;
    /// what is inside is checked only by whoever reads it).
    fn skip_value(&mut self) -> Result<(), InvalidDocument> {
        let mut open: Vec<u8> = Vec::new();
        loop {
            let b = self.next()?;
            match b {
                b'"' => self.skip_string()?,
                b'{' => open.push(b'}'),
                b'[' => open.push(b']'),
                b'}' | b']' => {
                    if open.pop() != Some(b) {
                        return Err(self.syntax(&format!("unexpected `{}`", b as char)));
                    }
                }
                b',' | b':' if !open.is_empty() => continue,
                b',' | b':' => return Err(self.syntax(&format!("unexpected `{}`", b as char))),
                _ => loop {
                    // A number or a literal: up to the next delimiter.
                    while self.pos < self.end {
                        if matches!(
                            self.buf[self.pos],
                            b',' | b':' | b'}' | b']' | b'"' | b'{' | b'['
                        ) || self.buf[self.pos].is_ascii_whitespace()
                        {
                            break;
                        }
                        self.pos += 1;
                    }
                    if self.pos < self.end || !self.fill()? {
                        break;
                    }
                },
            }
            if open.is_empty() {
                return Ok(());
            }
        }
    }

    /// The bytes of the next value, which the caller reads.
    fn value(&mut self) -> Result<&[u8], InvalidDocument> {
        self.peek()?;
        self.mark = Some(self.pos);
        let skipped = self.skip_value();
        let start = self.mark.take().unwrap_or(self.pos);
        skipped?;
        Ok(&self.buf[start..self.pos])
    }

    /// A value read by serde_json from its bytes; a value of the wrong kind is a shape error.
    fn read<T: serde::de::DeserializeOwned>(&mut self) -> Result<T, InvalidDocument> {
        let bytes = self.value()?;
        serde_json::from_slice(bytes).map_err(invalid)
    }

    /// Calls `entry` with each key of the object whose `{` was consumed, the value next.
    fn entries(
        &mut self,
        mut entry: impl FnMut(&mut Self, String) -> Result<(), InvalidDocument>,
    ) -> Result<(), InvalidDocument> {
        if self.peek()? == Some(b'}') {
            self.pos += 1;
            return Ok(());
        }
        loop {
            if self.peek()? != Some(b'"') {
                return Err(self.syntax("expected a key"));
            }
            let key: String = self.read()?;
            self.expect(b':')?;
            entry(self, key)?;
            match self.next()? {
                b',' => continue,
                b'}' => return Ok(()),
                b => {
                    return Err(self.syntax(&format!(
                        "expected `,` or `}}`, found `{}`",
                        b.escape_ascii()
                    )));
                }
            }
        }
    }

    /// Calls `element` with each element of the array whose `[` was consumed.
    fn elements(
        &mut self,
        mut element: impl FnMut(&mut Self, usize) -> Result<(), InvalidDocument>,
    ) -> Result<(), InvalidDocument> {
        if self.peek()? == Some(b']') {
            self.pos += 1;
            return Ok(());
        }
        for index in 0.. {
            element(self, index)?;
            match self.next()? {
                b',' => continue,
                b']' => break,
                b => {
                    return Err(self.syntax(&format!(
                        "expected `,` or `]`, found `{}`",
                        b.escape_ascii()
                    )));
                }
            }
        }
        Ok(())
    }

    fn document(mut self, sink: &mut Sink<'_>) -> Result<Head, InvalidDocument> {
        match self.peek()? {
            Some(b'{') => self.pos += 1,
            Some(b'[' | b'"' | b'0'..=b'9' | b'-' | b't' | b'f' | b'n') => {
                return Err(shape("the top level is not an object with `applications`"));
            }
            _ => return Err(self.syntax("not a JSON document")),
        }
        let mut head = None;
        self.entries(|s, key| {
            if key == "applications" && head.is_none() {
                head = Some(s.applications(sink)?);
                Ok(())
            } else {
                s.skip_value()
            }
        })?;
        if self.peek()?.is_some() {
            return Err(self.syntax("more after the document"));
        }
        head.ok_or_else(|| shape("no `applications` at the top level"))
    }

    fn applications(&mut self, sink: &mut Sink<'_>) -> Result<Head, InvalidDocument> {
        if self.peek()? != Some(b'{') {
            self.skip_value()?;
            return Err(shape("`applications` is not an object"));
        }
        self.pos += 1;
        let mut head = Head::default();
        self.entries(|s, key| {
            match key.as_str() {
                "versions__delta" => head.versions_delta = s.read::<Text>()?.0,
                "apps__hashcode" => head.apps_hashcode = s.read::<Text>()?.0,
                "application" => s.app_list(sink)?,
                _ => s.skip_value()?,
            }
            Ok(())
        })?;
        Ok(head)
    }

    fn app_list(&mut self, sink: &mut Sink<'_>) -> Result<(), InvalidDocument> {
        match self.peek()? {
            Some(b'[') => {
                self.pos += 1;
                self.elements(|s, index| s.app(index, sink))
            }
            Some(b'{') => self.app(0, sink),
            Some(b'n') => self.read::<()>(),
            _ => Err(shape("`application` is not a list of application objects")),
        }
    }

    fn app(&mut self, index: usize, sink: &mut Sink<'_>) -> Result<(), InvalidDocument> {
        if self.peek()? != Some(b'{') {
            return Err(shape(&format!(
                "application {index}: expected an application object"
            )));
        }
        self.pos += 1;
        let mut name: Option<String> = None;
        // The instances met before the name, as text.
        let mut early: Vec<Vec<u8>> = Vec::new();
        self.entries(|s, key| {
            match key.as_str() {
                "name" => name = Some(s.read::<Text>()?.0.unwrap_or_default()),
                "instance" => match &name {
                    Some(app) => s.instance_list(app, sink)?,
                    None => early.push(s.value()?.to_vec()),
                },
                _ => s.skip_value()?,
            }
            Ok(())
        })?;
        let app = name.unwrap_or_default();
        for text in early {
            Scanner::new(&text[..]).instance_list(&app, sink)?;
        }
        Ok(())
    }

    /// An application's `instance`: a list, one instance, or null. Each instance is read on
    /// its own, so that one that does not read as an instance is skipped, not the document.
    fn instance_list(&mut self, app: &str, sink: &mut Sink<'_>) -> Result<(), InvalidDocument> {
        match self.peek()? {
            Some(b'[') => {
                self.pos += 1;
                self.elements(|s, index| {
                    let text = s.value()?;
                    one(app, index, text, sink);
                    Ok(())
                })
            }
            Some(b'n') => self.read::<()>(),
            _ => {
                let text = self.value()?;
                one(app, 0, text, sink);
                Ok(())
            }
        }
    }
}

/// Instance `index` of `app`, from its bytes, to `sink`.
fn one(app: &str, index: usize, text: &[u8], sink: &mut Sink<'_>) {
    let read = serde_json::from_slice::<InstanceInfo>(text).map_err(|e| {
        let instance_id = serde_json::from_slice::<Value>(text)
            .ok()
            .and_then(|v| v.get("instanceId")?.as_str().map(str::to_owned));
        InvalidInstance {
            index,
            app: app.to_owned(),
            instance_id,
            field: "instance".into(),
            reason: e.to_string(),
        }
    });
    sink(app, index, read);
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
        json::lenient::text::deserialize(d).map(Text)
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
            Err(InvalidDocument::Json(_) | InvalidDocument::Syntax(_))
        ));
        assert!(matches!(
            read_all(&testdata("broken.json")),
            Err(InvalidDocument::Json(_) | InvalidDocument::Syntax(_))
        ));
        assert!(matches!(
            read_all(br#"{"applications": {}} trailing"#),
            Err(InvalidDocument::Json(_) | InvalidDocument::Syntax(_))
        ));
    }

    /// Reads one byte at a time: every value crosses a refill.
    struct Trickle<'a>(&'a [u8]);

    impl io::Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let Some((first, rest)) = self.0.split_first() else {
                return Ok(0);
            };
            buf[0] = *first;
            self.0 = rest;
            Ok(1)
        }
    }

    #[test]
    fn a_document_arriving_a_byte_at_a_time_reads_the_same() {
        let doc =
            br#" {"other": {"x": ["]}\"{", {"y": [1, -2.5e3, true, null]}]}, "applications": {
            "apps__hashcode": "UP_2_", "versions__delta": 7, "ignored": "a\"b\\",
            "application": [{"name": "HELLO", "instance": [
                {"instanceId": "a\"1", "ipAddr": "10.0.0.1", "metadata": {"k": "v\\\""}},
                {"instanceId": "b", "ipAddr": "10.0.0.2", "port": {"$": "8080"}}]}]}} "#;
        let (head, whole) = read_all(doc).unwrap();
        assert_eq!(head.apps_hashcode.as_deref(), Some("UP_2_"));
        assert_eq!(head.versions_delta.as_deref(), Some("7"));
        let ids: Vec<_> = (whole.iter())
            .map(|(_, _, i)| i.as_ref().unwrap().id().unwrap().to_owned())
            .collect();
        assert_eq!(ids, ["a\"1", "b"]);
        let mut trickled = Vec::new();
        let head2 = read_document(Trickle(doc), &mut |app, index, inst| {
            trickled.push((app.to_owned(), index, inst))
        })
        .unwrap();
        assert_eq!(head2, head);
        assert_eq!(trickled, whole);
        for fixture in [
            "eureka-apps.json",
            "eureka-delta.json",
            "eureka-apps-single.json",
        ] {
            let bytes = testdata(fixture);
            let mut trickled = Vec::new();
            read_document(Trickle(&bytes), &mut |app, index, inst| {
                trickled.push((app.to_owned(), index, inst))
            })
            .unwrap();
            assert_eq!(trickled, read_all(&bytes).unwrap().1, "{fixture}");
        }
    }
}
