//! The per-request mapping from a Host value to an odmesh cluster name (README, "The filter's
//! configuration").
//!
//! In order: lowercase; strip the port (`name:port`, `[v6]:port`) and one trailing dot;
//! strip one configured suffix (the longest that matches); a name that already ends in `.vip`
//! or `.svip` is taken as that cluster; otherwise the secure rule (secure header, or a port in
//! `secure_ports`) picks `<vip>.svip`, else `<vip>.vip`. The VIP must be valid
//! ([`odmesh_names::validate_vip`]); anything else is an [`InvalidHost`].
//!
//! [`map_host`] works in place on the `String` the host call returned: no allocation except
//! when appending the cluster suffix outgrows it, no `format!`, no regex.

use core::fmt;

use odmesh_names::{InvalidVip, Kind, split_cluster_name, validate_vip};

use crate::config::Config;

/// Where a request goes: its cluster name and the kind of cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    /// The cluster name, `<vip>.vip` or `<svip>.svip`.
    pub cluster: String,
    /// Whether that is a plain or a secure cluster.
    pub kind: Kind,
}

/// Why a request cannot be routed. The `Display` text is the body of the 400 answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InvalidHost {
    /// The request has neither the source header nor `host`.
    Missing,
    /// The host value is not UTF-8.
    NotUtf8,
    /// The port after the name is not a number from 1 to 65535.
    BadPort,
    /// The name left after stripping is not a valid VIP.
    Vip(InvalidVip),
}

impl fmt::Display for InvalidHost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("odmesh: cannot route this request: ")?;
        match self {
            InvalidHost::Missing => f.write_str("it has no host header to name a destination"),
            InvalidHost::NotUtf8 => f.write_str("the host is not valid UTF-8"),
            InvalidHost::BadPort => {
                f.write_str("the port in the host is not a number from 1 to 65535")
            }
            InvalidHost::Vip(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for InvalidHost {}

impl From<InvalidVip> for InvalidHost {
    fn from(e: InvalidVip) -> Self {
        InvalidHost::Vip(e)
    }
}

/// Whether a secure header value asks for the secure cluster: `true` or `1`, any case.
pub fn is_secure_value(value: &[u8]) -> bool {
    let value = value.trim_ascii();
    value == b"1" || value.eq_ignore_ascii_case(b"true")
}

/// Maps the raw value of the request's destination header (`None`: the request has none) to
/// its route: the whole per-request decision of the filter.
pub fn route_request(
    host: Option<Vec<u8>>,
    secure: bool,
    config: &Config,
) -> Result<Route, InvalidHost> {
    match host {
        None => Err(InvalidHost::Missing),
        Some(bytes) => match String::from_utf8(bytes) {
            Ok(host) => map_host(host, secure, config),
            Err(_) => Err(InvalidHost::NotUtf8),
        },
    }
}

/// Maps a host value to its route, reusing `host`'s buffer for the cluster name.
///
/// `secure` is whether the request's secure header asked for the secure cluster.
pub fn map_host(mut host: String, secure: bool, config: &Config) -> Result<Route, InvalidHost> {
    host.make_ascii_lowercase();

    let (name_len, port) = split_port(&host)?;
    host.truncate(name_len);
    if host.ends_with('.') {
        host.pop();
    }
    if let Some(suffix) = config
        .strip_suffixes
        .iter()
        .find(|suffix| host.ends_with(suffix.as_str()))
    {
        host.truncate(host.len() - suffix.len());
    }

    if let Some((vip, kind)) = split_cluster_name(&host) {
        validate_vip(vip)?;
        return Ok(Route {
            cluster: host,
            kind,
        });
    }

    validate_vip(&host)?;
    let secure_port = port.is_some_and(|p| config.secure_ports.contains(&p));
    let kind = if secure || secure_port {
        Kind::Svip
    } else {
        Kind::Vip
    };
    host.push_str(kind.suffix());
    Ok(Route {
        cluster: host,
        kind,
    })
}

/// Finds the port in a host value: returns the length of the name part and the port, if any.
///
/// `[v6]` and `[v6]:port` keep their brackets in the name, which validation then reports as an
/// IP literal; a bare IPv6 address (several colons) is reported as one here.
fn split_port(host: &str) -> Result<(usize, Option<u16>), InvalidHost> {
    let (name_len, port) = if host.starts_with('[') {
        match host.find(']') {
            Some(close) => match &host[close + 1..] {
                "" => (close + 1, ""),
                rest => match rest.strip_prefix(':') {
                    Some(port) => (close + 1, port),
                    None => return Err(InvalidVip::IpLiteral.into()),
                },
            },
            None => return Err(InvalidVip::IpLiteral.into()),
        }
    } else {
        match host.rfind(':') {
            None => return Ok((host.len(), None)),
            Some(colon) if host[..colon].contains(':') => return Err(InvalidVip::IpLiteral.into()),
            Some(colon) => (colon, &host[colon + 1..]),
        }
    };
    if port.is_empty() {
        // RFC 3986 allows `host:` with an empty port: the same as no port.
        return Ok((name_len, None));
    }
    match parse_port(port) {
        Some(port) => Ok((name_len, Some(port))),
        None => Err(InvalidHost::BadPort),
    }
}

/// A decimal port from 1 to 65535, digits only (no sign, no spaces).
fn parse_port(digits: &str) -> Option<u16> {
    if digits.is_empty() || digits.len() > 5 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse::<u16>().ok().filter(|&p| p != 0)
}

/// The header the filter falls back to when the configured source header is absent.
pub const HOST_HEADER: &str = "host";
/// Counter: requests mapped to a `.vip` cluster.
pub const METRIC_VIP: &str = "odmesh_requests_vip";
/// Counter: requests mapped to a `.svip` cluster.
pub const METRIC_SVIP: &str = "odmesh_requests_svip";
/// Counter: requests answered with 400 because their host names no valid VIP.
pub const METRIC_REJECTED: &str = "odmesh_requests_rejected";
/// The `content-type` of the filter's local replies.
pub const TEXT_PLAIN: &str = "text/plain; charset=utf-8";

/// What a shell does with one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Write `cluster` into the cluster header (always, over whatever the client sent), remove
    /// the secure header if `remove_secure`, count one request of `kind`, and continue.
    Route {
        cluster: String,
        kind: Kind,
        remove_secure: bool,
    },
    /// Answer 400 with `body` (text), count one rejected request, and stop.
    Reject { body: String },
}

/// The whole per-request decision, from the request's headers as the shell reads them
/// (`header(name)`: the value, `None` if absent): one read of the destination header (or
/// `host`), one of the secure header, one mapping. Every shell does exactly this, so they
/// behave the same.
pub fn decide(config: &Config, header: impl Fn(&str) -> Option<Vec<u8>>) -> Verdict {
    let host = header(&config.source_header).or_else(|| header(HOST_HEADER));
    let secure_value = header(&config.secure_header);
    let secure = secure_value.as_deref().is_some_and(is_secure_value);
    match route_request(host, secure, config) {
        Ok(route) => Verdict::Route {
            cluster: route.cluster,
            kind: route.kind,
            remove_secure: secure_value.is_some(),
        },
        Err(e) => {
            let mut body = e.to_string();
            body.push('\n');
            Verdict::Reject { body }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config_with_suffixes(suffixes: &[&str]) -> Config {
        let json = serde_json::json!({ "strip_suffixes": suffixes }).to_string();
        Config::parse(json.as_bytes()).expect("valid test configuration")
    }

    fn map(host: &str) -> Result<String, InvalidHost> {
        map_host(host.to_owned(), false, &Config::default()).map(|r| r.cluster)
    }

    fn map_secure(host: &str) -> Result<String, InvalidHost> {
        map_host(host.to_owned(), true, &Config::default()).map(|r| r.cluster)
    }

    #[test]
    fn a_plain_name_maps_to_its_vip_cluster() {
        let route = map_host("hello".to_owned(), false, &Config::default()).expect("valid");
        assert_eq!(route.cluster, "hello.vip");
        assert_eq!(route.kind, Kind::Vip);
        assert_eq!(map("edge.api_v2-x"), Ok("edge.api_v2-x.vip".to_owned()));
    }

    #[test]
    fn the_host_is_lowercased() {
        assert_eq!(map("HeLLo"), Ok("hello.vip".to_owned()));
    }

    #[test]
    fn the_port_is_stripped() {
        assert_eq!(map("hello:8080"), Ok("hello.vip".to_owned()));
        assert_eq!(map("hello:"), Ok("hello.vip".to_owned()));
    }

    #[test]
    fn a_secure_port_picks_the_svip_cluster() {
        let route = map_host("hello:8443".to_owned(), false, &Config::default()).expect("valid");
        assert_eq!(route.cluster, "hello.svip");
        assert_eq!(route.kind, Kind::Svip);
        assert_eq!(map("hello:443"), Ok("hello.svip".to_owned()));
    }

    #[test]
    fn configured_secure_ports_replace_the_defaults() {
        let config = Config::parse(br#"{"secure_ports": [9443]}"#).expect("valid");
        let cluster = |h: &str| map_host(h.to_owned(), false, &config).map(|r| r.cluster);
        assert_eq!(cluster("hello:9443"), Ok("hello.svip".to_owned()));
        assert_eq!(cluster("hello:8443"), Ok("hello.vip".to_owned()));
    }

    #[test]
    fn the_secure_header_picks_the_svip_cluster() {
        assert_eq!(map_secure("hello"), Ok("hello.svip".to_owned()));
        assert_eq!(map_secure("hello:8080"), Ok("hello.svip".to_owned()));
    }

    #[test]
    fn secure_header_values_true_and_1_mean_secure_and_others_do_not() {
        for yes in [&b"true"[..], b"1", b"TRUE", b" True "] {
            assert!(is_secure_value(yes), "{yes:?}");
        }
        for no in [&b"false"[..], b"0", b"", b"yes", b"11", b"truee"] {
            assert!(!is_secure_value(no), "{no:?}");
        }
    }

    #[test]
    fn one_trailing_dot_is_stripped() {
        assert_eq!(map("hello."), Ok("hello.vip".to_owned()));
        assert_eq!(map("hello.:8080"), Ok("hello.vip".to_owned()));
        assert_eq!(
            map("hello.."),
            Err(InvalidHost::Vip(InvalidVip::EmptyLabel))
        );
    }

    #[test]
    fn one_configured_suffix_is_stripped() {
        let config = config_with_suffixes(&[".mesh.internal", ".svc"]);
        let cluster = |h: &str| map_host(h.to_owned(), false, &config).map(|r| r.cluster);
        assert_eq!(cluster("HELLO.mesh.internal"), Ok("hello.vip".to_owned()));
        assert_eq!(
            cluster("hello.mesh.internal.:80"),
            Ok("hello.vip".to_owned())
        );
        assert_eq!(cluster("hello.svc:8443"), Ok("hello.svip".to_owned()));
        // Only one suffix goes.
        assert_eq!(cluster("hello.svc.svc"), Ok("hello.svc.vip".to_owned()));
        // A suffix must match whole labels: `xsvc` keeps its name.
        assert_eq!(cluster("hello.xsvc"), Ok("hello.xsvc.vip".to_owned()));
    }

    #[test]
    fn the_longest_matching_suffix_wins() {
        let config = config_with_suffixes(&[".internal", ".mesh.internal"]);
        let route = map_host("a.mesh.internal".to_owned(), false, &config).expect("valid");
        assert_eq!(route.cluster, "a.vip");
    }

    #[test]
    fn a_host_that_is_only_a_suffix_names_nothing() {
        let config = config_with_suffixes(&[".mesh.internal"]);
        assert_eq!(
            map_host(".mesh.internal".to_owned(), false, &config),
            Err(InvalidHost::Vip(InvalidVip::Empty))
        );
    }

    #[test]
    fn a_name_ending_in_vip_or_svip_is_taken_as_that_cluster() {
        assert_eq!(map("hello.vip"), Ok("hello.vip".to_owned()));
        assert_eq!(map("hello.svip"), Ok("hello.svip".to_owned()));
        assert_eq!(map("Hello.SVIP:8080"), Ok("hello.svip".to_owned()));
        // The secure rule does not override an explicit cluster name.
        assert_eq!(map_secure("hello.vip"), Ok("hello.vip".to_owned()));
        assert_eq!(map("hello.vip:8443"), Ok("hello.vip".to_owned()));
        let route = map_host("hello.svip".to_owned(), false, &Config::default()).expect("valid");
        assert_eq!(route.kind, Kind::Svip);
    }

    #[test]
    fn an_explicit_cluster_name_must_still_hold_a_valid_vip() {
        assert_eq!(map(".vip"), Err(InvalidHost::Vip(InvalidVip::Empty)));
        assert_eq!(
            map("a..svip"),
            Err(InvalidHost::Vip(InvalidVip::EmptyLabel))
        );
        assert_eq!(
            map("1.2.3.4.vip"),
            Err(InvalidHost::Vip(InvalidVip::IpLiteral))
        );
    }

    #[test]
    fn a_suffix_is_stripped_before_the_cluster_suffix_is_read() {
        let config = config_with_suffixes(&[".mesh.internal"]);
        let route = map_host("hello.svip.mesh.internal".to_owned(), false, &config).expect("valid");
        assert_eq!(route.cluster, "hello.svip");
    }

    #[test]
    fn an_empty_host_is_rejected() {
        assert_eq!(map(""), Err(InvalidHost::Vip(InvalidVip::Empty)));
        assert_eq!(map(":8080"), Err(InvalidHost::Vip(InvalidVip::Empty)));
        assert_eq!(map("."), Err(InvalidHost::Vip(InvalidVip::Empty)));
    }

    #[test]
    fn ip_literals_are_rejected() {
        for host in [
            "127.0.0.1",
            "127.0.0.1:8080",
            "10.0.0.1.",
            "[::1]",
            "[::1]:8080",
            "[fe80::1%25eth0]:443",
            "[::1",
            "[::1]x",
            "::1",
            "fe80::1:8080",
        ] {
            assert_eq!(
                map(host),
                Err(InvalidHost::Vip(InvalidVip::IpLiteral)),
                "{host}"
            );
        }
    }

    #[test]
    fn bad_characters_are_rejected_with_their_position() {
        assert_eq!(
            map("bad_name!"),
            Err(InvalidHost::Vip(InvalidVip::BadChar { ch: '!', at: 8 }))
        );
        assert_eq!(
            map("caf\u{e9}"),
            Err(InvalidHost::Vip(InvalidVip::BadChar {
                ch: '\u{e9}',
                at: 3
            }))
        );
        assert_eq!(
            map("a b"),
            Err(InvalidHost::Vip(InvalidVip::BadChar { ch: ' ', at: 1 }))
        );
    }

    #[test]
    fn names_longer_than_253_characters_are_rejected() {
        let ok = "a".repeat(253);
        assert_eq!(map(&ok), Ok(format!("{ok}.vip")));
        let long = "a".repeat(300);
        assert_eq!(
            map(&long),
            Err(InvalidHost::Vip(InvalidVip::TooLong { len: 300 }))
        );
    }

    #[test]
    fn bad_ports_are_rejected() {
        for host in [
            "hello:0",
            "hello:65536",
            "hello:http",
            "hello:+80",
            "hello:123456",
            "hello:8 0",
        ] {
            assert_eq!(map(host), Err(InvalidHost::BadPort), "{host}");
        }
        assert_eq!(map("hello:65535"), Ok("hello.vip".to_owned()));
    }

    #[test]
    fn the_error_text_says_what_was_wrong() {
        let body = map("bad_name!").expect_err("invalid").to_string();
        assert!(
            body.starts_with("odmesh: cannot route this request: "),
            "{body}"
        );
        assert!(body.contains("'!' at position 8"), "{body}");
        let body = map("").expect_err("invalid").to_string();
        assert!(body.contains("empty"), "{body}");
        let body = map("127.0.0.1").expect_err("invalid").to_string();
        assert!(body.contains("IP address"), "{body}");
        let body = map(&"a".repeat(300)).expect_err("invalid").to_string();
        assert!(body.contains("300 characters"), "{body}");
        assert!(InvalidHost::Missing.to_string().contains("no host"));
        assert!(InvalidHost::BadPort.to_string().contains("port"));
    }

    #[test]
    fn a_request_without_a_host_or_with_one_not_in_utf8_is_refused() {
        let config = Config::default();
        assert_eq!(
            route_request(None, false, &config),
            Err(InvalidHost::Missing)
        );
        assert_eq!(
            route_request(Some(b"hel\xfflo".to_vec()), false, &config),
            Err(InvalidHost::NotUtf8)
        );
        let route = route_request(Some(b"Hello:8443".to_vec()), false, &config).expect("valid");
        assert_eq!(route.cluster, "hello.svip");
    }

    #[test]
    fn the_mapping_reuses_the_host_buffer_when_it_has_room() {
        let mut host = String::with_capacity(32);
        host.push_str("Hello:8080");
        let before = host.as_ptr();
        let route = map_host(host, false, &Config::default()).expect("valid");
        assert_eq!(route.cluster, "hello.vip");
        assert_eq!(route.cluster.as_ptr(), before);
    }

    fn headers<'a>(list: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<Vec<u8>> + 'a {
        move |name| {
            (list.iter())
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.as_bytes().to_vec())
        }
    }

    #[test]
    fn decide_reads_the_source_header_then_host_and_the_secure_header() {
        let config = Config::default();
        let routed = |list: &[(&str, &str)]| decide(&config, headers(list));
        assert_eq!(
            routed(&[(":authority", "Hello"), ("host", "other")]),
            Verdict::Route {
                cluster: "hello.vip".into(),
                kind: Kind::Vip,
                remove_secure: false
            }
        );
        assert_eq!(
            routed(&[("host", "hello:8443")]),
            Verdict::Route {
                cluster: "hello.svip".into(),
                kind: Kind::Svip,
                remove_secure: false
            }
        );
        assert_eq!(
            routed(&[(":authority", "hello"), ("x-odmesh-secure", "no")]),
            Verdict::Route {
                cluster: "hello.vip".into(),
                kind: Kind::Vip,
                remove_secure: true
            },
            "a secure header is removed whatever it says"
        );
        let Verdict::Reject { body } = routed(&[]) else {
            panic!("no host must be rejected");
        };
        assert!(
            body.ends_with('\n') && body.starts_with("odmesh: "),
            "{body}"
        );
    }
}
