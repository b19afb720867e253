//! A resource name as a proxy asked for it, parsed once where its request enters the session.

use std::borrow::Borrow;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use odmesh_names::{Kind, parse_cluster_name};

/// A name a proxy subscribes to: an odmesh cluster name (`<vip>.vip` / `<svip>.svip`, the VIP
/// validated), or any other name, which odmesh owns no resource for and answers with a
/// removal. The cluster name and the load assignment of one cluster share it.
///
/// Parsed once, when a request first names it ([`ResourceName::new`]); everything after (the
/// stream's subscriptions, the cache's entries, building the resources) reads the parts.
/// Compares, orders and hashes as its text, so maps keyed by it are looked up by `&str`.
/// A copy shares the text (every stream holds its names in several sets, and the cache its
/// own: docs/benchmarks.md, "Memory per connected proxy").
#[derive(Clone)]
pub struct ResourceName {
    text: Arc<str>,
    /// The kind, for an odmesh cluster name; the VIP is the text before its suffix.
    kind: Option<Kind>,
}

impl ResourceName {
    /// Parses `text`.
    pub fn new(text: impl Into<String>) -> ResourceName {
        let text: Arc<str> = Arc::from(text.into());
        let kind = parse_cluster_name(&text).ok().map(|(_, kind)| kind);
        ResourceName { text, kind }
    }

    /// The name as the proxy sent it.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The VIP and kind, for an odmesh cluster name.
    pub fn cluster(&self) -> Option<(&str, Kind)> {
        let kind = self.kind?;
        Some((&self.text[..self.text.len() - kind.suffix().len()], kind))
    }

    /// Whether it is an odmesh cluster name.
    pub fn is_cluster(&self) -> bool {
        self.kind.is_some()
    }
}

impl From<&str> for ResourceName {
    fn from(text: &str) -> ResourceName {
        ResourceName::new(text)
    }
}

impl Borrow<str> for ResourceName {
    fn borrow(&self) -> &str {
        &self.text
    }
}

impl PartialEq for ResourceName {
    fn eq(&self, other: &ResourceName) -> bool {
        self.text == other.text
    }
}

impl Eq for ResourceName {}

impl PartialOrd for ResourceName {
    fn partial_cmp(&self, other: &ResourceName) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for ResourceName {
    fn cmp(&self, other: &ResourceName) -> std::cmp::Ordering {
        self.text.cmp(&other.text)
    }
}

impl Hash for ResourceName {
    /// As `str` hashes, as [`Borrow`] requires.
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.text.hash(state);
    }
}

impl PartialEq<str> for ResourceName {
    fn eq(&self, other: &str) -> bool {
        &*self.text == other
    }
}

impl PartialEq<&str> for ResourceName {
    fn eq(&self, other: &&str) -> bool {
        &*self.text == *other
    }
}

impl fmt::Debug for ResourceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.text, f)
    }
}

impl fmt::Display for ResourceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, HashMap};

    #[test]
    fn a_cluster_name_is_parsed_into_its_vip_and_kind_and_any_other_name_is_kept_as_text() {
        assert_eq!(
            ResourceName::new("hello.vip").cluster(),
            Some(("hello", Kind::Vip))
        );
        assert_eq!(
            ResourceName::new("pay.svip").cluster(),
            Some(("pay", Kind::Svip))
        );
        for other in ["xds_cluster", "A.vip", ".vip", "*"] {
            let name = ResourceName::new(other);
            assert_eq!((name.cluster(), name.as_str()), (None, other));
        }
    }

    #[test]
    fn maps_keyed_by_a_name_are_looked_up_by_its_text() {
        let hashed: HashMap<ResourceName, u8> = [(ResourceName::new("a.vip"), 1)].into();
        let ordered: BTreeMap<ResourceName, u8> = [(ResourceName::new("a.vip"), 1)].into();
        assert_eq!(
            (hashed.get("a.vip"), ordered.get("a.vip")),
            (Some(&1), Some(&1))
        );
        assert_eq!(hashed.get("b.vip"), None);
    }
}
