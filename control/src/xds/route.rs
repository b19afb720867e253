//! The route each proxy gets (RDS): the mesh routes, carrying the policy's request and per-try
//! timeouts for the proxy's calling service, so that no filter has to write them on every
//! request (docs/envoy.md, "Timeouts live in the route").
//!
//! What Envoy 1.40 does, and this follows (docs/envoy.md):
//! - a request's timeout is its route's (`timeout`; a cluster has none), and a per-try timeout
//!   is read from the route's retry policy only, even where the cluster's retry policy decides
//!   the retries;
//! - a route with `max_stream_duration` ignores its `timeout`: that is how a gRPC call's own
//!   deadline (`grpc-timeout`) is honoured, and ends the call with DEADLINE_EXCEEDED. So gRPC
//!   calls (`content-type: application/grpc...`) take a route of their own, first, where their
//!   deadline decides, and every other request a route with the request timeout;
//! - the native module (the routes' cluster specifier) may set the request's timeout and pick
//!   a route action override (which carries a retry policy, hence a per-try timeout) while the
//!   route resolves.
//!
//! The routes, by mapping:
//! - **native**: the gRPC route and the catch-all, both choosing the cluster with the module
//!   (one `cluster_specifier_plugins` entry). The defaults' timeouts are the routes' own; the
//!   module's `specifier_config` gets a `timeouts` table (cluster → request timeout in ms and
//!   the name of the override that holds its per-try timeout) for the clusters whose timeouts
//!   differ;
//! - **header** (the wasm filter writes the cluster header): for each cluster whose timeouts
//!   differ, a gRPC route and a route for the rest, matching that header's value; then the
//!   gRPC route and the catch-all with the defaults. With no timeouts in the policy, two
//!   routes.
//!
//! Which one a proxy gets, and the module's path and configuration, its bootstrap says in the
//! node metadata `odmesh` ([`RouteShell::from_node`]). Pure: the RDS service is
//! [`crate::routes`].

use std::collections::BTreeSet;
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::{
    AsyncDataSource, DataSource, Node, TypedExtensionConfig, async_data_source,
    data_source::Specifier,
};
use envoy_types::pb::envoy::config::route::v3::{
    ClusterSpecifierPlugin, HeaderMatcher, RetryPolicy, Route, RouteAction, RouteConfiguration,
    RouteMatch, VirtualHost,
    header_matcher::HeaderMatchSpecifier,
    route::Action,
    route_action::{ClusterSpecifier, MaxStreamDuration},
    route_match::PathSpecifier,
};
use envoy_types::pb::envoy::extensions::dynamic_modules::v3::DynamicModuleConfig;
use envoy_types::pb::envoy::extensions::router::cluster_specifiers::dynamic_modules::v3::{
    DynamicModuleClusterSpecifier, RouteActionOverride,
};
use envoy_types::pb::envoy::r#type::matcher::v3::{StringMatcher, string_matcher::MatchPattern};
use envoy_types::pb::google::protobuf::{Any, StringValue, value};
use odmesh_filter::config::Config as FilterConfig;
use prost::Message;

use super::{duration, version};
use crate::policy::{RouteTimeouts, Timeouts};

/// Type URL of `envoy.config.route.v3.RouteConfiguration` (RDS).
pub const ROUTE_TYPE_URL: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";
/// The node metadata key a bootstrap describes its mapping under.
pub const NODE_METADATA_KEY: &str = "odmesh";
/// Envoy's name for the dynamic-module cluster specifier.
const SPECIFIER: &str = "envoy.router.cluster_specifier_plugin.dynamic_modules";
const SPECIFIER_TYPE_URL: &str = "type.googleapis.com/envoy.extensions.router.cluster_specifiers.dynamic_modules.v3.DynamicModuleClusterSpecifier";
const STRING_VALUE_TYPE_URL: &str = "type.googleapis.com/google.protobuf.StringValue";
/// The module's name for its specifier (the module has one).
const SPECIFIER_NAME: &str = "odmesh";
/// The `specifier_config` key of the timeouts table (filter/native/src/shell.rs).
pub const TIMEOUTS_KEY: &str = "timeouts";
/// The header a caller might send to pick a cluster: removed before the upstream in the
/// native routes, where nothing reads it.
const CLUSTER_HEADER: &str = "x-odmesh-cluster";
/// What a gRPC call's `content-type` starts with.
const GRPC_CONTENT_TYPE: &str = "application/grpc";

/// How a proxy maps a request to its cluster, as its bootstrap describes it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum RouteShell {
    /// The native module as the route's cluster specifier: its file, and its configuration
    /// (the filter's JSON, checked).
    Native { module: String, config: String },
    /// A filter writes the cluster's name into `cluster_header` (the wasm filter).
    Header { cluster_header: String },
}

impl Default for RouteShell {
    /// A proxy that says nothing: the wasm filter's default header.
    fn default() -> RouteShell {
        RouteShell::Header {
            cluster_header: odmesh_filter::config::DEFAULT_CLUSTER_HEADER.to_owned(),
        }
    }
}

/// The node metadata `odmesh`, from a bootstrap:
/// `{mapping: native, module: <path>, filter_config: <json>}` or
/// `{mapping: wasm, filter_config: <json>}`; `filter_config` is optional (`{}`).
impl RouteShell {
    /// The mapping `node` describes; the default (the wasm filter's header) when its metadata
    /// says nothing. An error says what is wrong, for the control plane's log.
    pub fn from_node(node: Option<&Node>) -> Result<RouteShell, String> {
        let Some(fields) = (node.and_then(|n| n.metadata.as_ref()))
            .and_then(|m| m.fields.get(NODE_METADATA_KEY))
            .and_then(|v| match &v.kind {
                Some(value::Kind::StructValue(s)) => Some(&s.fields),
                _ => None,
            })
        else {
            return Ok(RouteShell::default());
        };
        let text = |key: &str| -> Result<Option<&str>, String> {
            match fields.get(key).and_then(|v| v.kind.as_ref()) {
                None => Ok(None),
                Some(value::Kind::StringValue(s)) => Ok(Some(s.as_str())),
                Some(_) => Err(format!("node metadata odmesh.{key}: not a string")),
            }
        };
        let config = text("filter_config")?.unwrap_or("{}");
        let parsed = FilterConfig::parse(config.as_bytes())
            .map_err(|e| format!("node metadata odmesh.filter_config: {e}"))?;
        match text("mapping")? {
            Some("native") => {
                let module = text("module")?
                    .filter(|m| !m.is_empty())
                    .ok_or("node metadata odmesh.module: the native module's file is required")?;
                Ok(RouteShell::Native {
                    module: module.to_owned(),
                    config: config.to_owned(),
                })
            }
            Some("wasm") | None => Ok(RouteShell::Header {
                cluster_header: parsed.cluster_header,
            }),
            Some(other) => Err(format!(
                "node metadata odmesh.mapping: {other:?} is neither `native` nor `wasm`"
            )),
        }
    }
}

/// A built route and its version.
#[derive(Clone, Debug, PartialEq)]
pub struct BuiltRoute {
    pub route: Any,
    pub version: String,
}

/// The route configuration `name` for a proxy mapping with `shell`, with `timeouts` (its
/// calling service's), and its version (the same in every process for the same route).
pub fn build(name: &str, shell: &RouteShell, timeouts: &RouteTimeouts) -> BuiltRoute {
    let (routes, plugins) = match shell {
        RouteShell::Native { module, config } => native_routes(module, config, timeouts),
        RouteShell::Header { cluster_header } => (header_routes(cluster_header, timeouts), vec![]),
    };
    let config = RouteConfiguration {
        name: name.to_owned(),
        virtual_hosts: vec![VirtualHost {
            name: "all".to_owned(),
            domains: vec!["*".to_owned()],
            routes,
            ..Default::default()
        }],
        cluster_specifier_plugins: plugins,
        ..Default::default()
    };
    // Canonical: the one map (the overrides) is encoded in key order, and every other map
    // is empty.
    let bytes = config.encode_to_vec();
    BuiltRoute {
        version: format!("{:016x}", version::encoded(&bytes)),
        route: Any {
            type_url: ROUTE_TYPE_URL.to_owned(),
            value: bytes,
        },
    }
}

/// The native module's routes (gRPC, then the rest) and its plugin: the module with its
/// configuration and the timeouts table; the default timeouts on the routes themselves.
fn native_routes(
    module: &str,
    config: &str,
    timeouts: &RouteTimeouts,
) -> (Vec<Route>, Vec<ClusterSpecifierPlugin>) {
    let filter = FilterConfig::parse(config.as_bytes()).unwrap_or_default();
    let plugin = ClusterSpecifierPlugin {
        extension: Some(TypedExtensionConfig {
            name: SPECIFIER.to_owned(),
            typed_config: Some(Any {
                type_url: SPECIFIER_TYPE_URL.to_owned(),
                value: specifier(module, config, timeouts),
            }),
        }),
        is_optional: false,
    };
    let route = |name: &str, grpc: bool| Route {
        name: name.to_owned(),
        r#match: Some(route_match(Vec::new(), grpc)),
        // The mapping read the secure header while the route resolved; the upstream does not
        // see it, nor a cluster header a caller sent (nothing reads one here).
        request_headers_to_remove: vec![filter.secure_header.clone(), CLUSTER_HEADER.to_owned()],
        action: Some(Action::Route(RouteAction {
            cluster_specifier: Some(ClusterSpecifier::ClusterSpecifierPlugin(
                SPECIFIER.to_owned(),
            )),
            ..timed_action(timeouts.default, grpc)
        })),
        ..Default::default()
    };
    (
        vec![route("mesh-grpc", true), route("mesh", false)],
        vec![plugin],
    )
}

/// The module's configuration, encoded: its file, the mapping's configuration with the
/// timeouts table, and the overrides the table names.
fn specifier(module: &str, config: &str, timeouts: &RouteTimeouts) -> Vec<u8> {
    let differs = |t: &Timeouts| t.per_try != timeouts.default.per_try;
    let table: serde_json::Map<String, serde_json::Value> = (timeouts.clusters.iter())
        .map(|(cluster, t)| {
            // Whole milliseconds, at least one for a timeout (0 means none).
            let ms = match t.request.as_millis() {
                0 if !t.request.is_zero() => 1,
                ms => u64::try_from(ms).unwrap_or(u64::MAX),
            };
            let mut entry = serde_json::json!({ "request_ms": ms });
            if differs(t) {
                entry["per_try"] = override_name(t.per_try).into();
            }
            (cluster.clone(), entry)
        })
        .collect();
    let mut specifier_config: serde_json::Value =
        serde_json::from_str(config).unwrap_or_else(|_| serde_json::json!({}));
    if !table.is_empty() {
        specifier_config[TIMEOUTS_KEY] = table.into();
    }
    let specifier = DynamicModuleClusterSpecifier {
        dynamic_module_config: Some(DynamicModuleConfig {
            do_not_close: true,
            module: Some(AsyncDataSource {
                specifier: Some(async_data_source::Specifier::Local(DataSource {
                    specifier: Some(Specifier::Filename(module.to_owned())),
                    ..Default::default()
                })),
            }),
            ..Default::default()
        }),
        specifier_name: SPECIFIER_NAME.to_owned(),
        specifier_config: Some(Any {
            type_url: STRING_VALUE_TYPE_URL.to_owned(),
            value: StringValue {
                value: specifier_config.to_string(),
            }
            .encode_to_vec(),
        }),
        ..Default::default()
    };
    // The overrides in name order: prost would write its `HashMap` in any order, and the same
    // route must give the same bytes (a protobuf message may repeat a map field: the entries
    // add up).
    let overrides: BTreeSet<Duration> = (timeouts.clusters.values())
        .filter(|t| differs(t))
        .map(|t| t.per_try)
        .collect();
    let mut encoded = specifier.encode_to_vec();
    for per_try in overrides {
        let one = DynamicModuleClusterSpecifier {
            route_action_overrides: [(
                override_name(per_try),
                RouteActionOverride {
                    retry_policy: Some(per_try_policy(per_try)),
                    ..Default::default()
                },
            )]
            .into(),
            ..Default::default()
        };
        encoded.extend(one.encode_to_vec());
    }
    encoded
}

/// The routes of a mapping that writes `cluster_header`: a gRPC route and a route for the
/// rest for each cluster with timeouts of its own, then the two with the defaults.
fn header_routes(cluster_header: &str, timeouts: &RouteTimeouts) -> Vec<Route> {
    let route = |name: String, cluster: Option<&str>, t: Timeouts, grpc: bool| {
        let headers = cluster
            .map(|c| exact(cluster_header, c))
            .into_iter()
            .collect();
        Route {
            name,
            r#match: Some(route_match(headers, grpc)),
            action: Some(Action::Route(RouteAction {
                cluster_specifier: Some(ClusterSpecifier::ClusterHeader(cluster_header.to_owned())),
                ..timed_action(t, grpc)
            })),
            ..Default::default()
        }
    };
    let mut routes = Vec::new();
    for (cluster, t) in &timeouts.clusters {
        routes.push(route(
            format!("mesh-grpc:{cluster}"),
            Some(cluster),
            *t,
            true,
        ));
        routes.push(route(format!("mesh:{cluster}"), Some(cluster), *t, false));
    }
    routes.push(route("mesh-grpc".to_owned(), None, timeouts.default, true));
    routes.push(route("mesh".to_owned(), None, timeouts.default, false));
    routes
}

/// A route action with `timeouts`. For a gRPC call, its own deadline (`grpc-timeout`), with
/// no cap, in place of the request timeout; for the rest, the request timeout (zero: none,
/// not Envoy's default of 15 s: the caller's own timeout decides). The per-try timeout either
/// way.
fn timed_action(timeouts: Timeouts, grpc: bool) -> RouteAction {
    let deadline = MaxStreamDuration {
        grpc_timeout_header_max: Some(duration(Duration::ZERO)),
        ..Default::default()
    };
    RouteAction {
        timeout: (!grpc).then(|| duration(timeouts.request)),
        max_stream_duration: grpc.then_some(deadline),
        retry_policy: (!timeouts.per_try.is_zero()).then(|| per_try_policy(timeouts.per_try)),
        ..Default::default()
    }
}

/// Every path, the `headers` given, and for a gRPC call its content type.
fn route_match(mut headers: Vec<HeaderMatcher>, grpc: bool) -> RouteMatch {
    if grpc {
        headers.push(HeaderMatcher {
            name: "content-type".to_owned(),
            header_match_specifier: Some(HeaderMatchSpecifier::StringMatch(StringMatcher {
                match_pattern: Some(MatchPattern::Prefix(GRPC_CONTENT_TYPE.to_owned())),
                ..Default::default()
            })),
            ..Default::default()
        });
    }
    RouteMatch {
        path_specifier: Some(PathSpecifier::Prefix("/".to_owned())),
        headers,
        ..Default::default()
    }
}

/// Header `name` is exactly `value`.
fn exact(name: &str, value: &str) -> HeaderMatcher {
    HeaderMatcher {
        name: name.to_owned(),
        header_match_specifier: Some(HeaderMatchSpecifier::StringMatch(StringMatcher {
            match_pattern: Some(MatchPattern::Exact(value.to_owned())),
            ..Default::default()
        })),
        ..Default::default()
    }
}

/// A retry policy that only carries a per-try timeout: the cluster's own retry policy decides
/// what is retried and how often (it replaces the route's), but the per-try timeout is read
/// from the route's (docs/envoy.md).
fn per_try_policy(per_try: Duration) -> RetryPolicy {
    RetryPolicy {
        per_try_timeout: (!per_try.is_zero()).then(|| duration(per_try)),
        ..Default::default()
    }
}

/// The name of the override that sets per-try timeout `per_try` (`per-try-none` for none).
fn override_name(per_try: Duration) -> String {
    match per_try.as_millis() {
        0 => "per-try-none".to_owned(),
        ms => format!("per-try-{ms}ms"),
    }
}

/// The native plugin's specifier and its configuration, read back: for tests.
#[cfg(test)]
fn specifier_of(config: &RouteConfiguration) -> (DynamicModuleClusterSpecifier, serde_json::Value) {
    let [plugin] = &config.cluster_specifier_plugins[..] else {
        panic!("one plugin: {config:?}");
    };
    let any = plugin
        .extension
        .as_ref()
        .unwrap()
        .typed_config
        .as_ref()
        .unwrap();
    assert_eq!(any.type_url, SPECIFIER_TYPE_URL);
    let specifier = DynamicModuleClusterSpecifier::decode(any.value.as_slice()).unwrap();
    let config = StringValue::decode(
        specifier
            .specifier_config
            .as_ref()
            .unwrap()
            .value
            .as_slice(),
    )
    .unwrap()
    .value;
    (specifier, serde_json::from_str(&config).unwrap())
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashMap};

    use envoy_types::pb::google::protobuf::{Struct, Value};

    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn node(fields: &[(&str, &str)]) -> Node {
        let odmesh = Struct {
            fields: (fields.iter())
                .map(|(k, v)| {
                    let v = Value {
                        kind: Some(value::Kind::StringValue((*v).to_owned())),
                    };
                    ((*k).to_owned(), v)
                })
                .collect(),
        };
        let value = Value {
            kind: Some(value::Kind::StructValue(odmesh)),
        };
        Node {
            metadata: Some(Struct {
                fields: HashMap::from([(NODE_METADATA_KEY.to_owned(), value)]),
            }),
            ..Default::default()
        }
    }

    fn timeouts() -> RouteTimeouts {
        RouteTimeouts {
            default: Timeouts {
                request: ms(2000),
                per_try: Duration::ZERO,
            },
            clusters: BTreeMap::from([
                (
                    "slow.vip".to_owned(),
                    Timeouts {
                        request: ms(500),
                        per_try: ms(100),
                    },
                ),
                (
                    "free.svip".to_owned(),
                    Timeouts {
                        request: Duration::ZERO,
                        per_try: Duration::ZERO,
                    },
                ),
            ]),
        }
    }

    fn decode(built: &BuiltRoute) -> RouteConfiguration {
        assert_eq!(built.route.type_url, ROUTE_TYPE_URL);
        RouteConfiguration::decode(built.route.value.as_slice()).unwrap()
    }

    fn action(route: &Route) -> &RouteAction {
        match &route.action {
            Some(Action::Route(action)) => action,
            other => panic!("not a route action: {other:?}"),
        }
    }

    #[test]
    fn the_node_metadata_names_the_mapping_and_a_bad_one_is_refused_with_its_reason() {
        assert_eq!(RouteShell::from_node(None), Ok(RouteShell::default()));
        let native = node(&[
            ("mapping", "native"),
            ("module", "/opt/odmesh/libodmesh_filter.so"),
            ("filter_config", r#"{"secure_header": "x-secure"}"#),
        ]);
        assert_eq!(
            RouteShell::from_node(Some(&native)),
            Ok(RouteShell::Native {
                module: "/opt/odmesh/libodmesh_filter.so".to_owned(),
                config: r#"{"secure_header": "x-secure"}"#.to_owned()
            })
        );
        let wasm = node(&[
            ("mapping", "wasm"),
            ("filter_config", r#"{"cluster_header": "x-to"}"#),
        ]);
        assert_eq!(
            RouteShell::from_node(Some(&wasm)),
            Ok(RouteShell::Header {
                cluster_header: "x-to".to_owned()
            })
        );
        for (fields, says) in [
            (&[("mapping", "native")][..], "odmesh.module"),
            (&[("mapping", "lua")], "neither"),
            (
                &[("filter_config", r#"{"secure_ports": [0]}"#)],
                "secure_ports",
            ),
        ] {
            let err = RouteShell::from_node(Some(&node(fields))).unwrap_err();
            assert!(err.contains(says), "{fields:?}: {err}");
        }
    }

    #[test]
    fn the_native_routes_carry_the_default_timeouts_and_a_table_for_the_others() {
        let shell = RouteShell::Native {
            module: "/m.so".to_owned(),
            config: r#"{"secure_header": "x-secure"}"#.to_owned(),
        };
        let config = decode(&build("odmesh", &shell, &timeouts()));
        assert_eq!(config.name, "odmesh");
        let [grpc, rest] = &config.virtual_hosts[0].routes[..] else {
            panic!("two routes: {config:?}");
        };
        assert_eq!(
            (grpc.name.as_str(), rest.name.as_str()),
            ("mesh-grpc", "mesh")
        );
        for route in [grpc, rest] {
            assert_eq!(
                route.request_headers_to_remove,
                ["x-secure", CLUSTER_HEADER]
            );
            let chosen = ClusterSpecifier::ClusterSpecifierPlugin(SPECIFIER.to_owned());
            assert_eq!(action(route).cluster_specifier, Some(chosen));
            assert_eq!(action(route).retry_policy, None);
        }
        // gRPC: the call's deadline, not the request timeout.
        assert!(format!("{:?}", grpc.r#match).contains("application/grpc"));
        assert_eq!(action(grpc).timeout, None);
        let deadline = action(grpc).max_stream_duration.as_ref().unwrap();
        assert_eq!(
            deadline.grpc_timeout_header_max,
            Some(duration(Duration::ZERO))
        );
        assert_eq!(action(rest).timeout, Some(duration(ms(2000))));
        assert_eq!(action(rest).max_stream_duration, None);
        let (specifier, json) = specifier_of(&config);
        let expected = serde_json::json!({
            "secure_header": "x-secure",
            "timeouts": {
                "slow.vip": {"request_ms": 500, "per_try": "per-try-100ms"},
                "free.svip": {"request_ms": 0},
            },
        });
        assert_eq!(json, expected);
        let overrides: Vec<(&String, Option<_>)> = (specifier.route_action_overrides.iter())
            .map(|(name, o)| (name, o.retry_policy.as_ref().unwrap().per_try_timeout))
            .collect();
        assert_eq!(
            overrides,
            [(&"per-try-100ms".to_owned(), Some(duration(ms(100))))]
        );
        let module = specifier.dynamic_module_config.unwrap().module.unwrap();
        assert!(format!("{module:?}").contains("/m.so"), "{module:?}");
    }

    #[test]
    fn without_timeouts_the_native_routes_have_no_table() {
        let shell = RouteShell::Native {
            module: "/m.so".to_owned(),
            config: "{}".to_owned(),
        };
        let config = decode(&build("odmesh", &shell, &RouteTimeouts::default()));
        let rest = &config.virtual_hosts[0].routes[1];
        assert_eq!(action(rest).timeout, Some(duration(Duration::ZERO)));
        let (specifier, json) = specifier_of(&config);
        assert_eq!(json, serde_json::json!({}));
        assert!(specifier.route_action_overrides.is_empty());
    }

    #[test]
    fn the_header_routes_match_each_cluster_with_timeouts_before_the_catch_alls() {
        let config = decode(&build("odmesh", &RouteShell::default(), &timeouts()));
        assert!(config.cluster_specifier_plugins.is_empty());
        let routes = &config.virtual_hosts[0].routes;
        let names: Vec<&str> = routes.iter().map(|r| r.name.as_str()).collect();
        let expected = [
            "mesh-grpc:free.svip",
            "mesh:free.svip",
            "mesh-grpc:slow.vip",
            "mesh:slow.vip",
            "mesh-grpc",
            "mesh",
        ];
        assert_eq!(names, expected);
        let slow = &routes[3];
        let matcher = &slow.r#match.as_ref().unwrap().headers[..];
        assert_eq!(matcher.len(), 1);
        assert_eq!(matcher[0].name, CLUSTER_HEADER);
        assert!(format!("{matcher:?}").contains("Exact(\"slow.vip\")"));
        assert_eq!(action(slow).timeout, Some(duration(ms(500))));
        let per_try = action(slow).retry_policy.as_ref().unwrap().per_try_timeout;
        assert_eq!(per_try, Some(duration(ms(100))));
        let slow_grpc = &routes[2];
        assert_eq!(slow_grpc.r#match.as_ref().unwrap().headers.len(), 2);
        assert_eq!(action(slow_grpc).timeout, None);
        let per_try = action(slow_grpc)
            .retry_policy
            .as_ref()
            .unwrap()
            .per_try_timeout;
        assert_eq!(per_try, Some(duration(ms(100))));
        assert_eq!(action(&routes[5]).timeout, Some(duration(ms(2000))));
        assert!(routes[5].r#match.as_ref().unwrap().headers.is_empty());
        let only = decode(&build(
            "odmesh",
            &RouteShell::default(),
            &RouteTimeouts::default(),
        ));
        assert_eq!(only.virtual_hosts[0].routes.len(), 2);
    }

    #[test]
    fn the_same_route_has_the_same_version_and_a_changed_timeout_another() {
        let shell = RouteShell::Native {
            module: "/m.so".to_owned(),
            config: "{}".to_owned(),
        };
        let mut many = timeouts();
        for n in 0..20 {
            let t = Timeouts {
                request: ms(n),
                per_try: ms(n + 1),
            };
            many.clusters.insert(format!("v{n}.vip"), t);
        }
        let versions: BTreeSet<String> = (0..10)
            .map(|_| build("odmesh", &shell, &many).version)
            .collect();
        assert_eq!(versions.len(), 1, "{versions:?}");
        let mut changed = many.clone();
        changed.clusters.get_mut("v3.vip").unwrap().per_try = ms(999);
        assert_ne!(
            build("odmesh", &shell, &changed).version,
            build("odmesh", &shell, &many).version
        );
        assert_ne!(
            build("odmesh", &RouteShell::default(), &many).version,
            build("odmesh", &shell, &many).version
        );
    }
}
