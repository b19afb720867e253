//! The filter's decisions: its configuration (`Config::parse`) and the per-request mapping
//! of a Host to a cluster (`mapping::route_request`, what both shells call through `decide`).
//!
//! Input: `HOST`, or `CONFIG-JSON \0 HOST` (any bytes; HOST need not be UTF-8). Checks:
//! - a refused configuration says why, naming odmesh; an accepted one keeps its rules
//!   (lowercase header names, all different; no port 0; suffixes lowercase, starting with a
//!   dot, longest first, no repeats) and reads back the same from its own JSON;
//! - a route is a valid odmesh cluster name: `parse_cluster_name` accepts it and agrees on
//!   its kind; a refused host renders the text of the 400 answer;
//! - the mapping ignores ASCII case; the secure flag changes the kind at most, never which
//!   VIP; a cluster name maps to itself.
#![no_main]

use libfuzzer_sys::fuzz_target;
use odmesh_filter::config::Config;
use odmesh_filter::mapping::{InvalidHost, Route, route_request};
use odmesh_names::{Kind, parse_cluster_name};

fuzz_target!(|data: &[u8]| {
    let (config, host) = match data.iter().position(|&b| b == 0) {
        None => (Config::default(), data),
        Some(nul) => (config(&data[..nul]), &data[nul + 1..]),
    };

    let plain = route(host, false, &config);
    let secure = route(host, true, &config);
    match (&plain, &secure) {
        (Ok(plain), Ok(secure)) => {
            let (vip, _) = parse_cluster_name(&plain.cluster).expect("checked by route");
            let (secure_vip, _) = parse_cluster_name(&secure.cluster).expect("checked by route");
            assert_eq!(vip, secure_vip, "the secure flag changed the VIP");
            if plain.kind == Kind::Svip {
                assert_eq!(secure.kind, Kind::Svip);
            }
        }
        (Err(plain), Err(secure)) => assert_eq!(plain, secure, "the secure flag changed the error"),
        _ => panic!("the secure flag decided whether {host:?} routes: {plain:?} / {secure:?}"),
    }

    let upper = host.to_ascii_uppercase();
    assert_eq!(
        route(&upper, false, &config),
        plain,
        "ASCII case changed the mapping of {host:?}"
    );

    if let Ok(route) = plain {
        let again = route_request(
            Some(route.cluster.clone().into_bytes()),
            false,
            &Config::default(),
        );
        assert_eq!(again, Ok(route), "a cluster name does not map to itself");
    }
});

/// Parses a configuration and checks it; a refused one gives the defaults.
fn config(json: &[u8]) -> Config {
    let config = match Config::parse(json) {
        Ok(config) => config,
        Err(e) => {
            let text = e.to_string();
            assert!(
                text.starts_with("invalid odmesh filter configuration: ") && text.len() > 40,
                "{text}"
            );
            return Config::default();
        }
    };
    let headers = [
        &config.source_header,
        &config.cluster_header,
        &config.secure_header,
    ];
    for (i, header) in headers.iter().enumerate() {
        let token = header
            .strip_prefix(':')
            .filter(|_| i == 0)
            .unwrap_or(header);
        assert!(
            !token.is_empty()
                && token
                    .bytes()
                    .all(|b| b.is_ascii_graphic() && !b.is_ascii_uppercase()),
            "header {header:?}"
        );
        assert!(!headers[..i].contains(header), "header {header:?} twice");
    }
    assert!(!config.secure_ports.contains(&0));
    for pair in config.strip_suffixes.windows(2) {
        assert!(
            pair[0].len() >= pair[1].len() && pair[0] != pair[1],
            "{pair:?}"
        );
    }
    for suffix in &config.strip_suffixes {
        let name = suffix
            .strip_prefix('.')
            .expect("a suffix starts with a dot");
        odmesh_names::validate_vip(name).expect("a suffix is a valid name");
    }

    let json = serde_json::json!({
        "source_header": config.source_header,
        "cluster_header": config.cluster_header,
        "secure_header": config.secure_header,
        "secure_ports": config.secure_ports,
        "strip_suffixes": config.strip_suffixes,
    });
    let again = Config::parse(json.to_string().as_bytes());
    assert_eq!(
        again.as_ref(),
        Ok(&config),
        "the configuration does not read back"
    );
    config
}

/// Routes `host` and checks the answer: a valid cluster name, or the text of a 400.
fn route(host: &[u8], secure: bool, config: &Config) -> Result<Route, InvalidHost> {
    let result = route_request(Some(host.to_vec()), secure, config);
    match &result {
        Ok(route) => match parse_cluster_name(&route.cluster) {
            Ok((_, kind)) => assert_eq!(kind, route.kind, "{route:?}"),
            Err(e) => panic!("{host:?} mapped to {route:?}, not a cluster name: {e}"),
        },
        Err(e) => {
            let body = e.to_string();
            let reason = body
                .strip_prefix("odmesh: cannot route this request: ")
                .unwrap_or_else(|| panic!("400 body {body:?}"));
            assert!(!reason.is_empty(), "400 body {body:?}");
        }
    }
    result
}
