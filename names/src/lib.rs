//! The odmesh cluster-name grammar, defined once for the filter and the control plane.
//!
//! A client names a destination by its VIP (plain traffic) or SVIP (secure traffic), as it
//! would with Eureka. In Envoy each of those is one cluster:
//!
//! | destination | cluster        |
//! |-------------|----------------|
//! | VIP `hello` | `hello.vip`    |
//! | SVIP `hello`| `hello.svip`   |
//!
//! A VIP is 1 to 253 characters: labels of `a-z 0-9 - _` joined by single dots. Names are
//! lowercase; callers lowercase what they read before asking. An IPv4 literal is not a VIP.
//!
//! Everything here is allocation-free except [`cluster_name`], so the filter can call it on
//! every request.
#![forbid(unsafe_code)]
#![no_std]

extern crate alloc;

use alloc::string::String;
use core::fmt;

/// The longest VIP accepted, as for a DNS name.
pub const MAX_VIP_LEN: usize = 253;

/// Whether a cluster carries plain (`.vip`) or secure (`.svip`) traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// Plain traffic to a VIP: cluster `<vip>.vip`.
    Vip,
    /// Secure traffic to an SVIP: cluster `<svip>.svip`, TLS to the upstream.
    Svip,
}

impl Kind {
    /// The cluster-name suffix of this kind, with its dot: `.vip` or `.svip`.
    pub const fn suffix(self) -> &'static str {
        match self {
            Kind::Vip => ".vip",
            Kind::Svip => ".svip",
        }
    }

    /// The word used in logs and JSON: `vip` or `svip`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Kind::Vip => "vip",
            Kind::Svip => "svip",
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a name is not a valid VIP. The `Display` text is what a client is told.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InvalidVip {
    /// Nothing is left to name a destination.
    Empty,
    /// Longer than [`MAX_VIP_LEN`].
    TooLong { len: usize },
    /// A character outside `a-z 0-9 - _ .` at byte offset `at`.
    BadChar { ch: char, at: usize },
    /// Two dots in a row, or a dot at either end.
    EmptyLabel,
    /// An IP address, not a name.
    IpLiteral,
}

impl fmt::Display for InvalidVip {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InvalidVip::Empty => f.write_str("no destination: the host is empty"),
            InvalidVip::TooLong { len } => write!(
                f,
                "destination name is {len} characters, longer than {MAX_VIP_LEN}"
            ),
            InvalidVip::BadChar { ch, at } => write!(
                f,
                "destination name has {ch:?} at position {at}; a VIP uses only a-z 0-9 - _ and dots"
            ),
            InvalidVip::EmptyLabel => f.write_str(
                "destination name has an empty label (a leading, trailing or double dot)",
            ),
            InvalidVip::IpLiteral => {
                f.write_str("destination is an IP address; name a VIP instead")
            }
        }
    }
}

/// Checks that `vip` is a valid, lowercase VIP or SVIP name.
pub fn validate_vip(vip: &str) -> Result<(), InvalidVip> {
    if vip.is_empty() {
        return Err(InvalidVip::Empty);
    }
    if vip.starts_with('[') {
        return Err(InvalidVip::IpLiteral);
    }
    if vip.len() > MAX_VIP_LEN {
        return Err(InvalidVip::TooLong { len: vip.len() });
    }
    let mut label_len = 0usize;
    let mut labels = 0usize;
    let mut all_digits_or_dots = true;
    for (at, b) in vip.bytes().enumerate() {
        match b {
            b'.' => {
                if label_len == 0 {
                    return Err(InvalidVip::EmptyLabel);
                }
                labels += 1;
                label_len = 0;
            }
            b'0'..=b'9' => label_len += 1,
            b'a'..=b'z' | b'-' | b'_' => {
                all_digits_or_dots = false;
                label_len += 1;
            }
            _ => {
                // Report the whole character, not a byte of it.
                let ch = vip[at..].chars().next().unwrap_or('\u{fffd}');
                return Err(InvalidVip::BadChar { ch, at });
            }
        }
    }
    if label_len == 0 {
        return Err(InvalidVip::EmptyLabel);
    }
    labels += 1;
    if all_digits_or_dots && labels == 4 {
        return Err(InvalidVip::IpLiteral);
    }
    Ok(())
}

/// Splits a cluster name into its VIP and kind, if it ends in `.vip` or `.svip`.
///
/// The VIP part is not validated; use [`parse_cluster_name`] for that.
pub fn split_cluster_name(name: &str) -> Option<(&str, Kind)> {
    if let Some(vip) = name.strip_suffix(Kind::Svip.suffix()) {
        Some((vip, Kind::Svip))
    } else {
        name.strip_suffix(Kind::Vip.suffix())
            .map(|vip| (vip, Kind::Vip))
    }
}

/// Why a name is not an odmesh cluster name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InvalidClusterName {
    /// It ends in neither `.vip` nor `.svip`.
    NoSuffix,
    /// The part before the suffix is not a valid VIP.
    Vip(InvalidVip),
}

impl fmt::Display for InvalidClusterName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InvalidClusterName::NoSuffix => {
                f.write_str("cluster name ends in neither .vip nor .svip")
            }
            InvalidClusterName::Vip(e) => e.fmt(f),
        }
    }
}

/// Parses `<vip>.vip` or `<svip>.svip` into the VIP and its kind, validating the VIP.
pub fn parse_cluster_name(name: &str) -> Result<(&str, Kind), InvalidClusterName> {
    let (vip, kind) = split_cluster_name(name).ok_or(InvalidClusterName::NoSuffix)?;
    validate_vip(vip).map_err(InvalidClusterName::Vip)?;
    Ok((vip, kind))
}

/// The cluster name for `vip` of `kind`: `<vip>.vip` or `<vip>.svip`.
pub fn cluster_name(vip: &str, kind: Kind) -> String {
    let suffix = kind.suffix();
    let mut name = String::with_capacity(vip.len() + suffix.len());
    name.push_str(vip);
    name.push_str(suffix);
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_names_are_valid_vips() {
        for vip in [
            "hello",
            "a",
            "my-service_v2",
            "edge.api.prod",
            "0abc",
            "1.2.3",
        ] {
            assert_eq!(validate_vip(vip), Ok(()), "{vip}");
        }
    }

    #[test]
    fn a_253_character_name_is_valid_and_254_is_too_long() {
        let ok = "a".repeat(253);
        assert_eq!(validate_vip(&ok), Ok(()));
        let long = "a".repeat(254);
        assert_eq!(validate_vip(&long), Err(InvalidVip::TooLong { len: 254 }));
    }

    #[test]
    fn empty_labels_are_rejected() {
        for vip in [".a", "a.", "a..b", "."] {
            assert_eq!(validate_vip(vip), Err(InvalidVip::EmptyLabel), "{vip}");
        }
    }

    #[test]
    fn bad_characters_are_reported_with_their_position() {
        assert_eq!(
            validate_vip("bad_name!"),
            Err(InvalidVip::BadChar { ch: '!', at: 8 })
        );
        assert_eq!(
            validate_vip("Hello"),
            Err(InvalidVip::BadChar { ch: 'H', at: 0 })
        );
        assert_eq!(
            validate_vip("caf\u{e9}"),
            Err(InvalidVip::BadChar {
                ch: '\u{e9}',
                at: 3
            })
        );
    }

    #[test]
    fn ip_literals_are_not_vips() {
        assert_eq!(validate_vip("127.0.0.1"), Err(InvalidVip::IpLiteral));
        assert_eq!(validate_vip("[::1]"), Err(InvalidVip::IpLiteral));
    }

    #[test]
    fn cluster_names_round_trip() {
        assert_eq!(cluster_name("hello", Kind::Vip), "hello.vip");
        assert_eq!(cluster_name("hello", Kind::Svip), "hello.svip");
        assert_eq!(parse_cluster_name("hello.vip"), Ok(("hello", Kind::Vip)));
        assert_eq!(parse_cluster_name("hello.svip"), Ok(("hello", Kind::Svip)));
    }

    #[test]
    fn names_without_an_odmesh_suffix_are_not_clusters() {
        assert_eq!(
            parse_cluster_name("xds_cluster"),
            Err(InvalidClusterName::NoSuffix)
        );
        assert_eq!(
            parse_cluster_name(".vip"),
            Err(InvalidClusterName::Vip(InvalidVip::Empty))
        );
    }

    #[test]
    fn messages_say_what_was_wrong() {
        use alloc::string::ToString;
        let msg = InvalidVip::BadChar { ch: '!', at: 8 }.to_string();
        assert!(msg.contains("'!'") && msg.contains("position 8"), "{msg}");
        assert!(InvalidVip::TooLong { len: 300 }.to_string().contains("300"));
    }
}
