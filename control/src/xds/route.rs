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
//! Hedging and faults are route settings too (docs/envoy.md, "Hedging and faults live in the
//! route"). The routes, by mapping:
//! - **native**: the gRPC route and the catch-all, both choosing the cluster with the module
//!   (one `cluster_specifier_plugins` entry). The defaults' timeouts are the routes' own; the
//!   module's `specifier_config` gets a `timeouts` table (cluster → request timeout in ms and
//!   the name of the override that holds its per-try timeout) for the clusters whose timeouts
//!   differ. A VIP with hedging or a fault gets virtual hosts for its hosts, since the module
//!   cannot set those ([`native_hosts`]);
//! - **header** (the wasm filter writes the cluster header): a virtual host for the hosts of
//!   each VIP with route-level policy of its own, whose routes match that header's value for
//!   each of its clusters set apart, then take the defaults; every other host the catch-all's
//!   gRPC route and route for the rest ([`header_hosts`]). With no policy, two routes.
//!
//! Which one a proxy gets, and the module's path and configuration, its bootstrap says in the
//! node metadata `odmesh` ([`RouteShell::from_node`]). Pure: the RDS service is
//! [`crate::routes`].

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::{
    AsyncDataSource, DataSource, Metadata, Node, TypedExtensionConfig, async_data_source,
    data_source::Specifier,
};
use envoy_types::pb::envoy::config::route::v3::{
    ClusterSpecifierPlugin, FilterConfig as RouteFilterConfig, HeaderMatcher, HedgePolicy,
    RetryPolicy, Route, RouteAction, RouteConfiguration, RouteMatch, VirtualHost,
    header_matcher::HeaderMatchSpecifier,
    route::Action,
    route_action::{ClusterSpecifier, MaxStreamDuration},
    route_match::PathSpecifier,
};
use envoy_types::pb::envoy::extensions::dynamic_modules::v3::DynamicModuleConfig;
use envoy_types::pb::envoy::extensions::filters::common::fault::v3::{
    FaultDelay, fault_delay::FaultDelaySecifier,
};
use envoy_types::pb::envoy::extensions::filters::http::dynamic_modules::v3::DynamicModuleFilterPerRoute;
use envoy_types::pb::envoy::extensions::filters::http::fault::v3::{
    FaultAbort, HttpFault, fault_abort::ErrorType,
};
use envoy_types::pb::envoy::extensions::router::cluster_specifiers::dynamic_modules::v3::{
    DynamicModuleClusterSpecifier, RouteActionOverride,
};
use envoy_types::pb::envoy::r#type::matcher::v3::{
    RegexMatcher, StringMatcher, string_matcher::MatchPattern,
};
use envoy_types::pb::envoy::r#type::v3::{FractionalPercent, fractional_percent};
use envoy_types::pb::google::protobuf::{Any, StringValue, Struct, Value as ProtoValue, value};
use odmesh_filter::config::Config as FilterConfig;
use prost::Message;

use odmesh_names::Kind;

use super::{duration, version};
use crate::policy::fault::{AbortWith, Percent};
use crate::policy::{ConcurrencyLimit, RouteLevel, RoutePolicy, Timeouts};

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
/// The fault filter's name in the bootstraps' chain, where it is off unless a route says.
pub const FAULT_FILTER: &str = "envoy.filters.http.fault";
const FAULT_TYPE_URL: &str = "type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault";
const FILTER_CONFIG_TYPE_URL: &str = "type.googleapis.com/envoy.config.route.v3.FilterConfig";
/// The native module's concurrency-limit filter in the native bootstrap's chain, off unless a
/// route says (README, "Adaptive concurrency"), and its name inside the module.
pub const LIMIT_FILTER: &str = "odmesh.limit";
/// The key, under the route metadata's `odmesh`, of the wasm limit filter's setting.
const LIMIT_METADATA_KEY: &str = "limit";
const LIMIT_FILTER_NAME: &str = "odmesh-limit";
const LIMIT_PER_ROUTE_TYPE_URL: &str = "type.googleapis.com/envoy.extensions.filters.http.dynamic_modules.v3.DynamicModuleFilterPerRoute";
/// The body of an answer the fault filter aborted: whoever reads it learns why.
pub const FAULT_BODY: &str = "odmesh: fault injected by the policy file (a chaos experiment)";

/// How a proxy maps a request to its cluster, as its bootstrap describes it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum RouteShell {
    /// The native module as the route's cluster specifier: its file, and its configuration
    /// (the filter's JSON, checked).
    Native { module: String, config: String },
    /// A filter writes the cluster's name into `cluster_header` (the wasm filter), with its
    /// configuration (JSON, checked).
    Header {
        cluster_header: String,
        config: String,
    },
}

impl Default for RouteShell {
    /// A proxy that says nothing: the wasm filter's default header.
    fn default() -> RouteShell {
        RouteShell::Header {
            cluster_header: odmesh_filter::config::DEFAULT_CLUSTER_HEADER.to_owned(),
            config: "{}".to_owned(),
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
                config: config.to_owned(),
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
    /// Route-level policy the route could not carry, for the control plane's log: hedging and
    /// faults with the native module reading another header than `:authority`.
    pub dropped: Option<String>,
}

/// The route configuration `name` for a proxy mapping with `shell`, with `policy` (its
/// calling service's), and its version (the same in every process for the same route).
pub fn build(name: &str, shell: &RouteShell, policy: &RoutePolicy) -> BuiltRoute {
    let (virtual_hosts, plugins, dropped) = match shell {
        RouteShell::Native { module, config } => native_hosts(module, config, policy),
        RouteShell::Header {
            cluster_header,
            config,
        } => (header_hosts(cluster_header, config, policy), vec![], None),
    };
    let config = RouteConfiguration {
        name: name.to_owned(),
        // A VIP's own virtual hosts match its name with any port (docs/envoy.md); without
        // them, Envoy has nothing to strip.
        ignore_port_in_host_matching: virtual_hosts.len() > 1,
        virtual_hosts,
        cluster_specifier_plugins: plugins,
        ..Default::default()
    };
    // Canonical: the maps (the overrides; each route's filter configurations) are encoded in
    // key order, and every other map is empty.
    let bytes = canonical(config);
    BuiltRoute {
        version: format!("{:016x}", version::encoded(&bytes)),
        route: Any {
            type_url: ROUTE_TYPE_URL.to_owned(),
            value: bytes,
        },
        dropped,
    }
}

/// The virtual host every request without one of its own takes.
fn catch_all(routes: Vec<Route>) -> VirtualHost {
    VirtualHost {
        name: "all".to_owned(),
        domains: vec!["*".to_owned()],
        routes,
        ..Default::default()
    }
}

/// The native module's virtual hosts and its plugin (the module with its configuration and
/// the timeouts table). Every route chooses the cluster with the module; the catch-all's
/// routes carry the defaults. A VIP with route-level policy beyond timeouts (hedging, a
/// fault) gets virtual hosts of its own, matched on the host before the module runs, since
/// the module can set a request's timeouts but not its hedging or filters
/// (docs/envoy.md, "Route-level policy on the native mapping").
fn native_hosts(
    module: &str,
    config: &str,
    policy: &RoutePolicy,
) -> (
    Vec<VirtualHost>,
    Vec<ClusterSpecifierPlugin>,
    Option<String>,
) {
    let filter = FilterConfig::parse(config.as_bytes()).unwrap_or_default();
    let plugin = ClusterSpecifierPlugin {
        extension: Some(TypedExtensionConfig {
            name: SPECIFIER.to_owned(),
            typed_config: Some(Any {
                type_url: SPECIFIER_TYPE_URL.to_owned(),
                value: specifier(module, config, policy),
            }),
        }),
        is_optional: false,
    };
    let route = |name: String,
                 cluster: Option<&str>,
                 level: &RouteLevel,
                 headers: Vec<HeaderMatcher>,
                 grpc: bool| {
        let mut filters = fault_config(level);
        if let (Some(cluster), Some(limit)) = (cluster, &level.limit) {
            filters.insert(
                LIMIT_FILTER.to_owned(),
                limit_config(module, cluster, limit),
            );
        }
        Route {
            name,
            r#match: Some(route_match(headers, grpc)),
            // The mapping read the secure header while the route resolved; the upstream does
            // not see it, nor a cluster header a caller sent (nothing reads one here).
            request_headers_to_remove: vec![
                filter.secure_header.clone(),
                CLUSTER_HEADER.to_owned(),
            ],
            action: Some(Action::Route(RouteAction {
                cluster_specifier: Some(ClusterSpecifier::ClusterSpecifierPlugin(
                    SPECIFIER.to_owned(),
                )),
                ..level_action(level, grpc)
            })),
            typed_per_filter_config: filters,
            ..Default::default()
        }
    };
    // The gRPC route and the route for the rest, named after what they serve; `cluster`: the
    // one cluster its requests go to, if it is known before the module runs.
    let pair =
        |name: &str, cluster: Option<&str>, level: &RouteLevel, headers: Vec<HeaderMatcher>| {
            vec![
                route(
                    format!("mesh-grpc{name}"),
                    cluster,
                    level,
                    headers.clone(),
                    true,
                ),
                route(format!("mesh{name}"), cluster, level, headers, false),
            ]
        };
    let vips: BTreeSet<&str> = (policy.clusters.iter())
        .filter(|(_, level)| level.beyond_timeouts())
        .filter_map(|(cluster, _)| odmesh_names::split_cluster_name(cluster))
        .map(|(vip, _)| vip)
        .collect();
    let mut hosts = Vec::new();
    let mut dropped = None;
    if filter.source_header != odmesh_filter::config::DEFAULT_SOURCE_HEADER && !vips.is_empty() {
        dropped = Some(format!(
            "hedging, faults and concurrency limits for {} are not applied: with the native \
             module they need its source_header to be :authority, not {}",
            vips.into_iter().collect::<Vec<_>>().join(", "),
            filter.source_header
        ));
    } else {
        for vip in vips {
            let plain = policy.level(&odmesh_names::cluster_name(vip, Kind::Vip));
            let secure = policy.level(&odmesh_names::cluster_name(vip, Kind::Svip));
            for (kind, level) in [(Kind::Vip, plain), (Kind::Svip, secure)] {
                if level.beyond_timeouts() {
                    let cluster = odmesh_names::cluster_name(vip, kind);
                    hosts.push(VirtualHost {
                        name: cluster.clone(),
                        domains: domains(&cluster, &filter),
                        routes: pair(&format!(":{cluster}"), Some(&cluster), level, vec![]),
                        ..Default::default()
                    });
                }
            }
            // The bare name: the secure rule picks the cluster, and so the policy.
            let mut routes = Vec::new();
            let (svip, plain_vip) = (
                odmesh_names::cluster_name(vip, Kind::Svip),
                odmesh_names::cluster_name(vip, Kind::Vip),
            );
            if plain != secure {
                for (how, matcher) in secure_matchers(&filter) {
                    let name = format!(":{svip}:{how}");
                    routes.extend(pair(&name, Some(&svip), secure, vec![matcher]));
                }
            }
            routes.extend(pair(&format!(":{vip}"), Some(&plain_vip), plain, vec![]));
            hosts.push(VirtualHost {
                name: vip.to_owned(),
                domains: domains(vip, &filter),
                routes,
                ..Default::default()
            });
        }
    }
    hosts.push(catch_all(pair("", None, &policy.default, vec![])));
    (hosts, vec![plugin], dropped)
}

/// The hosts the mapping takes to `name` (a VIP, or a cluster name): with or without one of
/// the suffixes it strips and a trailing dot (filter/src/mapping.rs); with any port, since the
/// route configuration that has them ignores ports in host matching. Envoy compares hosts
/// without case. Exact domains only: Envoy finds one with a single hash lookup, where a
/// wildcard would cost every other request more lookups.
fn domains(name: &str, filter: &FilterConfig) -> Vec<String> {
    let suffixes = std::iter::once("").chain(filter.strip_suffixes.iter().map(String::as_str));
    suffixes
        .flat_map(|suffix| {
            let host = format!("{name}{suffix}");
            let dotted = format!("{host}.");
            [host, dotted]
        })
        .collect()
}

/// The request matchers of the secure rule, for a bare VIP name: the secure header asks for
/// it (`true` or `1`, any case), or the host's port is a secure one.
fn secure_matchers(filter: &FilterConfig) -> Vec<(&'static str, HeaderMatcher)> {
    let mut matchers = vec![(
        "header",
        regex(&filter.secure_header, r"(?i)\s*(?:true|1)\s*"),
    )];
    if !filter.secure_ports.is_empty() {
        let ports: Vec<String> = filter.secure_ports.iter().map(u16::to_string).collect();
        let pattern = format!(".*:0*(?:{})", ports.join("|"));
        matchers.push(("port", regex(":authority", &pattern)));
    }
    matchers
}

/// The module's configuration, encoded: its file, the mapping's configuration with the
/// timeouts table, and the overrides the table names.
fn specifier(module: &str, config: &str, policy: &RoutePolicy) -> Vec<u8> {
    let default = policy.default.timeouts;
    let differs = |t: &Timeouts| t.per_try != default.per_try;
    let own: Vec<(&String, Timeouts)> = (policy.clusters.iter())
        .map(|(cluster, level)| (cluster, level.timeouts))
        .filter(|(_, t)| *t != default)
        .collect();
    let table: serde_json::Map<String, serde_json::Value> = (own.iter())
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
            ((*cluster).clone(), entry)
        })
        .collect();
    let mut specifier_config: serde_json::Value =
        serde_json::from_str(config).unwrap_or_else(|_| serde_json::json!({}));
    if !table.is_empty() {
        specifier_config[TIMEOUTS_KEY] = table.into();
    }
    let specifier = DynamicModuleClusterSpecifier {
        dynamic_module_config: Some(module_config(module)),
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
    let overrides: BTreeSet<Duration> = (own.iter())
        .filter(|(_, t)| differs(t))
        .map(|(_, t)| t.per_try)
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

/// The virtual hosts of a mapping that writes `cluster_header`. Each VIP with route-level
/// policy of its own gets a virtual host for its hosts (as with the native module), whose
/// routes match the cluster header for each of its clusters set apart, then take its defaults;
/// every other host takes the catch-all's two routes with the defaults. So a request to a VIP
/// without policy matches two routes, however many VIPs have some, and Envoy creates the fault
/// filter only for requests to a VIP with a fault: it builds a request's filters from the
/// route matched before the wasm filter names the cluster, by host (docs/envoy.md, "Hedging
/// and faults live in the route"). With a mapping that reads another header than
/// `:authority`, the host says nothing: every route is in the catch-all, each cluster's
/// matched by the header, and while any cluster has a fault every route switches the fault
/// filter on.
fn header_hosts(cluster_header: &str, config: &str, policy: &RoutePolicy) -> Vec<VirtualHost> {
    let filter = FilterConfig::parse(config.as_bytes()).unwrap_or_default();
    let route = |name: String, cluster: Option<&str>, level: &RouteLevel, grpc: bool| {
        let headers = cluster
            .map(|c| exact(cluster_header, c))
            .into_iter()
            .collect();
        Route {
            name,
            r#match: Some(route_match(headers, grpc)),
            action: Some(Action::Route(RouteAction {
                cluster_specifier: Some(ClusterSpecifier::ClusterHeader(cluster_header.to_owned())),
                ..level_action(level, grpc)
            })),
            typed_per_filter_config: fault_config(level),
            metadata: cluster
                .zip(level.limit.as_ref())
                .map(|(cluster, limit)| limit_metadata(cluster, limit)),
            ..Default::default()
        }
    };
    // The routes of `clusters` (each matched by the header), then the defaults' pair, the
    // fault filter switched on in every route that has no fault of its own if `fault_on`, the
    // limit filter in every route if `limit_on` (it reads the limit from the route the request
    // takes once its cluster is named: a route's metadata).
    let routes = |clusters: &[(&String, &RouteLevel)], fault_on: bool, limit_on: bool| {
        let mut routes = Vec::new();
        for (cluster, level) in clusters {
            routes.push(route(
                format!("mesh-grpc:{cluster}"),
                Some(cluster),
                level,
                true,
            ));
            routes.push(route(
                format!("mesh:{cluster}"),
                Some(cluster),
                level,
                false,
            ));
        }
        routes.push(route("mesh-grpc".to_owned(), None, &policy.default, true));
        routes.push(route("mesh".to_owned(), None, &policy.default, false));
        for r in &mut routes {
            if fault_on && !r.typed_per_filter_config.contains_key(FAULT_FILTER) {
                r.typed_per_filter_config
                    .insert(FAULT_FILTER.to_owned(), filter_on());
            }
            if limit_on {
                r.typed_per_filter_config
                    .insert(LIMIT_FILTER.to_owned(), filter_on());
            }
        }
        routes
    };
    let all: Vec<(&String, &RouteLevel)> = policy.clusters.iter().collect();
    let has_fault =
        |clusters: &[(&String, &RouteLevel)]| clusters.iter().any(|(_, l)| l.fault.is_some());
    let has_limit =
        |clusters: &[(&String, &RouteLevel)]| clusters.iter().any(|(_, l)| l.limit.is_some());
    if filter.source_header != odmesh_filter::config::DEFAULT_SOURCE_HEADER {
        return vec![catch_all(routes(&all, has_fault(&all), has_limit(&all)))];
    }
    let mut by_vip: std::collections::BTreeMap<&str, Vec<(&String, &RouteLevel)>> =
        std::collections::BTreeMap::new();
    for (cluster, level) in all {
        if let Some((vip, _)) = odmesh_names::split_cluster_name(cluster) {
            by_vip.entry(vip).or_default().push((cluster, level));
        }
    }
    let mut hosts: Vec<VirtualHost> = (by_vip.into_iter())
        .map(|(vip, clusters)| {
            let domains = [vip.to_owned(), format!("{vip}.vip"), format!("{vip}.svip")];
            VirtualHost {
                name: vip.to_owned(),
                domains: domains
                    .iter()
                    .flat_map(|d| self::domains(d, &filter))
                    .collect(),
                routes: routes(&clusters, has_fault(&clusters), has_limit(&clusters)),
                ..Default::default()
            }
        })
        .collect();
    hosts.push(catch_all(routes(&[], false, false)));
    hosts
}

/// A route action with `level`'s timeouts ([`timed_action`]) and hedging.
fn level_action(level: &RouteLevel, grpc: bool) -> RouteAction {
    RouteAction {
        hedge_policy: level.hedge.then(|| HedgePolicy {
            hedge_on_per_try_timeout: true,
            ..Default::default()
        }),
        ..timed_action(level.timeouts, grpc)
    }
}

/// The concurrency limit's setting for `cluster` (JSON; `odmesh_filter::limiter::Setting`).
fn limit_setting(cluster: &str, limit: &ConcurrencyLimit) -> String {
    serde_json::json!({ "cluster": cluster, "params": limit.params() }).to_string()
}

/// The route metadata that gives the wasm limit filter its setting: `odmesh.limit`, the
/// setting's JSON (filter/wasm/src/limit.rs reads it as the request takes the route).
fn limit_metadata(cluster: &str, limit: &ConcurrencyLimit) -> Metadata {
    let fields = [(
        LIMIT_METADATA_KEY.to_owned(),
        ProtoValue {
            kind: Some(value::Kind::StringValue(limit_setting(cluster, limit))),
        },
    )];
    Metadata {
        filter_metadata: [(
            NODE_METADATA_KEY.to_owned(),
            Struct {
                fields: fields.into(),
            },
        )]
        .into(),
        ..Default::default()
    }
}

/// The native module's concurrency-limit filter switched on for a route to `cluster`, with
/// the limiter's settings (filter/native/src/limit.rs reads them).
fn limit_config(module: &str, cluster: &str, limit: &ConcurrencyLimit) -> Any {
    let settings = limit_setting(cluster, limit);
    let per_route = DynamicModuleFilterPerRoute {
        dynamic_module_config: Some(module_config(module)),
        filter_name: LIMIT_FILTER_NAME.to_owned(),
        filter_config: Some(Any {
            type_url: STRING_VALUE_TYPE_URL.to_owned(),
            value: StringValue { value: settings }.encode_to_vec(),
        }),
        ..Default::default()
    };
    let on = RouteFilterConfig {
        config: Some(Any {
            type_url: LIMIT_PER_ROUTE_TYPE_URL.to_owned(),
            value: per_route.encode_to_vec(),
        }),
        ..Default::default()
    };
    Any {
        type_url: FILTER_CONFIG_TYPE_URL.to_owned(),
        value: on.encode_to_vec(),
    }
}

/// The native module, by its file (Envoy opens it once, whoever names it).
fn module_config(module: &str) -> DynamicModuleConfig {
    DynamicModuleConfig {
        do_not_close: true,
        module: Some(AsyncDataSource {
            specifier: Some(async_data_source::Specifier::Local(DataSource {
                specifier: Some(Specifier::Filename(module.to_owned())),
                ..Default::default()
            })),
        }),
        ..Default::default()
    }
}

/// `config` encoded with each route's filter configurations in name order: prost writes a
/// `HashMap` in any order, and the same route must give the same bytes (and version). A
/// message may list a repeated or map field's entries in several runs, so each map entry is
/// written as a message of its own after the rest of its route, and each route and host
/// after the rest of its parent.
fn canonical(mut config: RouteConfiguration) -> Vec<u8> {
    /// Appends `bytes` as field `tag` (length-delimited) of the message in `out`.
    fn field(out: &mut Vec<u8>, tag: u32, bytes: &[u8]) {
        prost::encoding::encode_key(tag, prost::encoding::WireType::LengthDelimited, out);
        prost::encoding::encode_varint(bytes.len() as u64, out);
        out.extend_from_slice(bytes);
    }
    fn route(mut route: Route) -> Vec<u8> {
        let filters: std::collections::BTreeMap<String, Any> =
            std::mem::take(&mut route.typed_per_filter_config)
                .into_iter()
                .collect();
        let mut out = route.encode_to_vec();
        for (name, config) in filters {
            let one = Route {
                typed_per_filter_config: HashMap::from([(name, config)]),
                ..Default::default()
            };
            out.extend(one.encode_to_vec());
        }
        out
    }
    let hosts = std::mem::take(&mut config.virtual_hosts);
    let mut out = config.encode_to_vec();
    for mut host in hosts {
        let routes = std::mem::take(&mut host.routes);
        let mut bytes = host.encode_to_vec();
        for r in routes {
            field(&mut bytes, 3, &route(r));
        }
        field(&mut out, 2, &bytes);
    }
    out
}

/// A filter of the bootstrap's chain switched on with its own configuration (the fault filter
/// with no fault; the wasm limit filter, which finds its settings in the route's metadata),
/// for a route whose requests may go on to one that has a fault or a limit.
fn filter_on() -> Any {
    let on = RouteFilterConfig {
        // Present and empty: "on, with the filter's own configuration" (Envoy 1.40).
        config: Some(Any::default()),
        ..Default::default()
    };
    Any {
        type_url: FILTER_CONFIG_TYPE_URL.to_owned(),
        value: on.encode_to_vec(),
    }
}

/// The fault filter's configuration for a route with `level`'s fault, which switches the
/// filter on for that route (it is off for every other: `disabled: true` in the bootstraps,
/// docs/envoy.md, "Faults only where the policy has one").
fn fault_config(level: &RouteLevel) -> HashMap<String, Any> {
    let Some(fault) = &level.fault else {
        return HashMap::new();
    };
    let percentage = |p: Percent| FractionalPercent {
        numerator: p.per_million,
        denominator: fractional_percent::DenominatorType::Million as i32,
    };
    let http = HttpFault {
        delay: fault.delay.as_ref().map(|d| FaultDelay {
            percentage: Some(percentage(d.percent)),
            fault_delay_secifier: Some(FaultDelaySecifier::FixedDelay(duration(d.fixed.0))),
        }),
        abort: fault.abort.as_ref().map(|a| FaultAbort {
            percentage: Some(percentage(a.percent)),
            response_body: FAULT_BODY.to_owned(),
            error_type: Some(match a.with {
                AbortWith::Status(s) => ErrorType::HttpStatus(s),
                AbortWith::GrpcStatus(g) => ErrorType::GrpcStatus(g),
            }),
        }),
        headers: (fault.header.iter())
            .map(|h| HeaderMatcher {
                name: h.0.clone(),
                header_match_specifier: Some(HeaderMatchSpecifier::PresentMatch(true)),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    };
    HashMap::from([(
        FAULT_FILTER.to_owned(),
        Any {
            type_url: FAULT_TYPE_URL.to_owned(),
            value: http.encode_to_vec(),
        },
    )])
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

/// Header `name` matches `pattern` whole (RE2).
fn regex(name: &str, pattern: &str) -> HeaderMatcher {
    HeaderMatcher {
        name: name.to_owned(),
        header_match_specifier: Some(HeaderMatchSpecifier::StringMatch(StringMatcher {
            match_pattern: Some(MatchPattern::SafeRegex(RegexMatcher {
                regex: pattern.to_owned(),
                ..Default::default()
            })),
            ..Default::default()
        })),
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

    fn level(request: u64, per_try: u64) -> RouteLevel {
        RouteLevel {
            timeouts: Timeouts {
                request: ms(request),
                per_try: ms(per_try),
            },
            ..Default::default()
        }
    }

    fn timeouts() -> RoutePolicy {
        RoutePolicy {
            default: level(2000, 0),
            clusters: BTreeMap::from([
                ("slow.vip".to_owned(), level(500, 100)),
                ("free.svip".to_owned(), level(0, 0)),
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
                cluster_header: "x-to".to_owned(),
                config: r#"{"cluster_header": "x-to"}"#.to_owned(),
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
        let config = decode(&build("odmesh", &shell, &RoutePolicy::default()));
        let rest = &config.virtual_hosts[0].routes[1];
        assert_eq!(action(rest).timeout, Some(duration(Duration::ZERO)));
        let (specifier, json) = specifier_of(&config);
        assert_eq!(json, serde_json::json!({}));
        assert!(specifier.route_action_overrides.is_empty());
    }

    #[test]
    fn the_header_routes_give_each_vip_with_policy_a_virtual_host_matching_its_clusters() {
        let config = decode(&build("odmesh", &RouteShell::default(), &timeouts()));
        assert!(config.cluster_specifier_plugins.is_empty());
        assert!(config.ignore_port_in_host_matching);
        let names =
            |v: &VirtualHost| -> Vec<String> { v.routes.iter().map(|r| r.name.clone()).collect() };
        let hosts: Vec<&str> = (config.virtual_hosts.iter())
            .map(|v| v.name.as_str())
            .collect();
        assert_eq!(hosts, ["free", "slow", "all"]);
        let slow = &config.virtual_hosts[1];
        assert_eq!(
            slow.domains,
            [
                "slow",
                "slow.",
                "slow.vip",
                "slow.vip.",
                "slow.svip",
                "slow.svip."
            ]
        );
        assert_eq!(
            names(slow),
            ["mesh-grpc:slow.vip", "mesh:slow.vip", "mesh-grpc", "mesh"]
        );
        let rest = &slow.routes[1];
        let matcher = &rest.r#match.as_ref().unwrap().headers[..];
        assert_eq!(matcher.len(), 1);
        assert_eq!(matcher[0].name, CLUSTER_HEADER);
        assert!(format!("{matcher:?}").contains("Exact(\"slow.vip\")"));
        assert_eq!(action(rest).timeout, Some(duration(ms(500))));
        let per_try = action(rest).retry_policy.as_ref().unwrap().per_try_timeout;
        assert_eq!(per_try, Some(duration(ms(100))));
        let grpc = &slow.routes[0];
        assert_eq!(grpc.r#match.as_ref().unwrap().headers.len(), 2);
        assert_eq!(action(grpc).timeout, None);
        let per_try = action(grpc).retry_policy.as_ref().unwrap().per_try_timeout;
        assert_eq!(per_try, Some(duration(ms(100))));
        // Its other cluster (slow.svip), and a request before the filter named one: the
        // defaults.
        assert_eq!(action(&slow.routes[3]).timeout, Some(duration(ms(2000))));
        assert!(slow.routes[3].r#match.as_ref().unwrap().headers.is_empty());
        // Every other host: the defaults' two routes.
        let all = &config.virtual_hosts[2];
        assert_eq!(all.domains, ["*"]);
        assert_eq!(names(all), ["mesh-grpc", "mesh"]);
        assert_eq!(action(&all.routes[1]).timeout, Some(duration(ms(2000))));
        let only = decode(&build(
            "odmesh",
            &RouteShell::default(),
            &RoutePolicy::default(),
        ));
        assert_eq!(only.virtual_hosts.len(), 1);
        assert_eq!(only.virtual_hosts[0].routes.len(), 2);
        assert!(!only.ignore_port_in_host_matching);
    }

    #[test]
    fn with_another_source_header_the_header_routes_are_all_in_the_catch_all() {
        let shell = RouteShell::Header {
            cluster_header: CLUSTER_HEADER.to_owned(),
            config: r#"{"source_header": "x-vip"}"#.to_owned(),
        };
        let mut policy = timeouts();
        policy.clusters.insert("pay.vip".to_owned(), chaos());
        let config = decode(&build("odmesh", &shell, &policy));
        let [all] = &config.virtual_hosts[..] else {
            panic!("one virtual host: {config:?}");
        };
        let names: Vec<&str> = all.routes.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "mesh-grpc:free.svip",
                "mesh:free.svip",
                "mesh-grpc:pay.vip",
                "mesh:pay.vip",
                "mesh-grpc:slow.vip",
                "mesh:slow.vip",
                "mesh-grpc",
                "mesh",
            ]
        );
        // The fault filter is on for every request: the host says nothing of the cluster.
        assert!(
            all.routes
                .iter()
                .all(|r| !r.typed_per_filter_config.is_empty())
        );
        assert!(fault_of(&all.routes[3]).is_some());
        assert!(switches_fault_filter_on(&all.routes[7]));
    }

    #[test]
    fn the_same_route_has_the_same_version_and_a_changed_timeout_another() {
        let shell = RouteShell::Native {
            module: "/m.so".to_owned(),
            config: "{}".to_owned(),
        };
        let mut many = timeouts();
        for n in 0..20 {
            many.clusters.insert(format!("v{n}.vip"), level(n, n + 1));
        }
        let versions: BTreeSet<String> = (0..10)
            .map(|_| build("odmesh", &shell, &many).version)
            .collect();
        assert_eq!(versions.len(), 1, "{versions:?}");
        let mut changed = many.clone();
        changed.clusters.get_mut("v3.vip").unwrap().timeouts.per_try = ms(999);
        assert_ne!(
            build("odmesh", &shell, &changed).version,
            build("odmesh", &shell, &many).version
        );
        assert_ne!(
            build("odmesh", &RouteShell::default(), &many).version,
            build("odmesh", &shell, &many).version
        );
    }

    fn chaos() -> RouteLevel {
        let fault: crate::policy::Fault = serde_json::from_value(serde_json::json!({
            "delay": {"fixed": "500ms", "percent": 25},
            "abort": {"grpc_status": 14, "percent": 50},
            "header": "x-chaos",
        }))
        .unwrap();
        RouteLevel {
            fault: Some(fault),
            ..level(2000, 0)
        }
    }

    fn hedged() -> RouteLevel {
        RouteLevel {
            hedge: true,
            ..level(0, 100)
        }
    }

    fn fault_of(route: &Route) -> Option<HttpFault> {
        let any = route.typed_per_filter_config.get(FAULT_FILTER)?;
        (any.type_url == FAULT_TYPE_URL).then(|| HttpFault::decode(any.value.as_slice()).unwrap())
    }

    /// Whether the route switches the fault filter on without a fault of its own.
    fn switches_fault_filter_on(route: &Route) -> bool {
        let Some(any) = route.typed_per_filter_config.get(FAULT_FILTER) else {
            return false;
        };
        if any.type_url == FAULT_TYPE_URL {
            return false;
        }
        assert_eq!(any.type_url, FILTER_CONFIG_TYPE_URL);
        let on = RouteFilterConfig::decode(any.value.as_slice()).unwrap();
        assert!(!on.disabled && !on.is_optional);
        on.config == Some(Any::default())
    }

    #[test]
    fn a_fault_is_the_fault_filters_configuration_on_its_clusters_routes_only() {
        let mut policy = RoutePolicy::default();
        policy.clusters.insert("pay.vip".to_owned(), chaos());
        let config = decode(&build("odmesh", &RouteShell::default(), &policy));
        let routes = &config.virtual_hosts[0].routes;
        let faulty: Vec<&str> = (routes.iter())
            .filter(|r| fault_of(r).is_some())
            .map(|r| r.name.as_str())
            .collect();
        assert_eq!(faulty, ["mesh-grpc:pay.vip", "mesh:pay.vip"]);
        // The VIP's other routes switch the filter on, since a request matches its first
        // route (by host) before the wasm filter names its cluster; no other host's does.
        let on: Vec<&str> = (routes.iter())
            .filter(|r| switches_fault_filter_on(r))
            .map(|r| r.name.as_str())
            .collect();
        assert_eq!(on, ["mesh-grpc", "mesh"]);
        assert_eq!(config.virtual_hosts[0].name, "pay");
        let elsewhere = &config.virtual_hosts[1];
        assert_eq!(elsewhere.name, "all");
        assert!(
            elsewhere
                .routes
                .iter()
                .all(|r| r.typed_per_filter_config.is_empty())
        );
        let no_fault = decode(&build("odmesh", &RouteShell::default(), &timeouts()));
        let routes = &no_fault.virtual_hosts[0].routes;
        assert!(routes.iter().all(|r| r.typed_per_filter_config.is_empty()));
        let routes = &config.virtual_hosts[0].routes;
        let fault = fault_of(&routes[1]).unwrap();
        let delay = fault.delay.unwrap();
        assert_eq!(
            delay.fault_delay_secifier,
            Some(FaultDelaySecifier::FixedDelay(duration(ms(500))))
        );
        let million = fractional_percent::DenominatorType::Million as i32;
        let quarter = FractionalPercent {
            numerator: 250_000,
            denominator: million,
        };
        assert_eq!(delay.percentage, Some(quarter));
        let abort = fault.abort.unwrap();
        assert_eq!(abort.error_type, Some(ErrorType::GrpcStatus(14)));
        assert_eq!(abort.percentage.unwrap().numerator, 500_000);
        assert_eq!(abort.response_body, FAULT_BODY);
        assert_eq!(fault.headers.len(), 1);
        assert_eq!(fault.headers[0].name, "x-chaos");
        assert_eq!(
            fault.headers[0].header_match_specifier,
            Some(HeaderMatchSpecifier::PresentMatch(true))
        );
        // Nothing else is asked of the filter: no limit on faults, no client-set faults.
        assert!(fault.upstream_cluster.is_empty() && fault.downstream_nodes.is_empty());
        assert_eq!(fault.max_active_faults, None);
    }

    #[test]
    fn a_hedge_is_the_routes_hedge_policy_beside_its_per_try_timeout() {
        let mut policy = RoutePolicy::default();
        policy.clusters.insert("search.vip".to_owned(), hedged());
        let config = decode(&build("odmesh", &RouteShell::default(), &policy));
        for route in &config.virtual_hosts[0].routes {
            let hedge = action(route).hedge_policy.as_ref();
            let per_try = (action(route).retry_policy.as_ref()).and_then(|r| r.per_try_timeout);
            if route.name.ends_with(":search.vip") {
                assert!(hedge.unwrap().hedge_on_per_try_timeout, "{route:?}");
                assert_eq!(per_try, Some(duration(ms(100))));
            } else {
                assert_eq!((hedge, per_try), (None, None), "{route:?}");
            }
        }
    }

    /// The virtual host Envoy would pick for `host` (docs/envoy.md: without its port when the
    /// configuration says so; exact domains first, then the longest prefix wildcard, then `*`;
    /// without case).
    fn host_for<'a>(config: &'a RouteConfiguration, host: &str) -> &'a VirtualHost {
        let mut host = host.to_ascii_lowercase();
        if config.ignore_port_in_host_matching
            && let Some((name, port)) = host.rsplit_once(':')
            && port.bytes().all(|b| b.is_ascii_digit())
        {
            host = name.to_owned();
        }
        let all = || config.virtual_hosts.iter();
        let exact = all().find(|v| v.domains.contains(&host));
        let prefix = (all().flat_map(|v| v.domains.iter().map(move |d| (v, d))))
            .filter_map(|(v, d)| {
                let p = d.strip_suffix('*').filter(|p| !p.is_empty())?;
                host.starts_with(p).then_some((p.len(), v))
            })
            .max_by_key(|(len, _)| *len)
            .map(|(_, v)| v);
        let star = all().find(|v| v.domains == ["*"]);
        exact.or(prefix).or(star).unwrap()
    }

    #[test]
    fn with_the_native_module_a_vip_with_hedging_or_a_fault_gets_virtual_hosts_for_its_hosts() {
        let shell = RouteShell::Native {
            module: "/m.so".to_owned(),
            config: r#"{"strip_suffixes": [".svc.local"]}"#.to_owned(),
        };
        let mut policy = timeouts();
        policy.clusters.insert("pay.vip".to_owned(), chaos());
        policy.clusters.insert("search.svip".to_owned(), hedged());
        let config = decode(&build("odmesh", &shell, &policy));
        let names: Vec<&str> = (config.virtual_hosts.iter())
            .map(|v| v.name.as_str())
            .collect();
        assert_eq!(names, ["pay.vip", "pay", "search.svip", "search", "all"]);
        assert!(config.ignore_port_in_host_matching);
        let wildcards = (config.virtual_hosts.iter().flat_map(|v| &v.domains))
            .filter(|d| d.contains('*') && *d != "*")
            .count();
        assert_eq!(wildcards, 0, "exact domains only");
        // Every host form the mapping takes to a VIP's clusters lands on its virtual hosts,
        // and no other host does.
        for (host, vhost) in [
            ("pay", "pay"),
            ("PAY:8080", "pay"),
            ("pay.", "pay"),
            ("pay.:80", "pay"),
            ("pay.svc.local", "pay"),
            ("pay.svc.local.:8080", "pay"),
            ("pay.vip", "pay.vip"),
            ("pay.vip:80", "pay.vip"),
            ("pay.vip.svc.local", "pay.vip"),
            ("pay.svip", "all"),
            ("payments", "all"),
            ("payments:80", "all"),
            ("pa:80", "all"),
            ("search:443", "search"),
            ("search.svip.", "search.svip"),
            ("search.vip", "all"),
            ("slow", "all"),
        ] {
            assert_eq!(host_for(&config, host).name, vhost, "{host}");
        }
        // The hedged SVIP: on its own host, and on the bare name when the secure rule picks
        // it (the secure header, or a secure port); the bare name's plain VIP has the
        // defaults.
        let search = &config.virtual_hosts[3];
        let route_names: Vec<&str> = search.routes.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(
            route_names,
            [
                "mesh-grpc:search.svip:header",
                "mesh:search.svip:header",
                "mesh-grpc:search.svip:port",
                "mesh:search.svip:port",
                "mesh-grpc:search",
                "mesh:search",
            ]
        );
        let header = format!("{:?}", search.routes[1].r#match);
        assert!(header.contains("x-odmesh-secure") && header.contains("(?:true|1)"));
        let port = format!("{:?}", search.routes[3].r#match);
        assert!(port.contains(":authority") && port.contains(".*:0*(?:443|8443)"));
        assert!(action(&search.routes[1]).hedge_policy.is_some());
        assert!(action(&search.routes[3]).hedge_policy.is_some());
        assert!(action(&search.routes[5]).hedge_policy.is_none());
        // The faulty VIP: its own host carries the fault; on the bare name, the secure rule
        // leads its SVIP's requests (the defaults) past it.
        let faulty = |vhost: &VirtualHost| -> Vec<bool> {
            vhost.routes.iter().map(|r| fault_of(r).is_some()).collect()
        };
        assert_eq!(faulty(&config.virtual_hosts[0]), [true, true]);
        let pay = &config.virtual_hosts[1];
        assert_eq!(faulty(pay), [false, false, false, false, true, true]);
        for route in config.virtual_hosts.iter().flat_map(|v| &v.routes) {
            let chosen = ClusterSpecifier::ClusterSpecifierPlugin(SPECIFIER.to_owned());
            assert_eq!(action(route).cluster_specifier, Some(chosen));
            assert_eq!(route.request_headers_to_remove.len(), 2);
        }
        let all = config.virtual_hosts.last().unwrap();
        assert!(all.routes.iter().all(|r| fault_of(r).is_none()));
        assert!(all.routes.iter().all(|r| action(r).hedge_policy.is_none()));
        // Timeouts stay the module's table's business.
        let (_, json) = specifier_of(&config);
        let table = json[TIMEOUTS_KEY].as_object().unwrap();
        let listed: Vec<&String> = table.keys().collect();
        assert_eq!(listed, ["free.svip", "search.svip", "slow.vip"]);
    }

    #[test]
    fn without_hedging_or_faults_the_native_route_has_the_catch_all_only() {
        let shell = RouteShell::Native {
            module: "/m.so".to_owned(),
            config: "{}".to_owned(),
        };
        let config = decode(&build("odmesh", &shell, &timeouts()));
        assert_eq!(config.virtual_hosts.len(), 1);
        assert!(
            !config.ignore_port_in_host_matching,
            "nothing to strip a port for"
        );
    }

    #[test]
    fn with_another_source_header_the_native_route_says_what_it_leaves_out() {
        let shell = RouteShell::Native {
            module: "/m.so".to_owned(),
            config: r#"{"source_header": "x-vip"}"#.to_owned(),
        };
        let mut policy = timeouts();
        policy.clusters.insert("pay.vip".to_owned(), chaos());
        let built = build("odmesh", &shell, &policy);
        assert_eq!(decode(&built).virtual_hosts.len(), 1);
        let dropped = built.dropped.unwrap();
        assert!(
            dropped.contains("pay") && dropped.contains("x-vip"),
            "{dropped}"
        );
        assert_eq!(build("odmesh", &shell, &timeouts()).dropped, None);
    }

    fn limited(max: u32) -> RouteLevel {
        let limit: ConcurrencyLimit =
            serde_json::from_value(serde_json::json!({"max_limit": max})).unwrap();
        RouteLevel {
            limit: Some(limit),
            ..level(0, 0)
        }
    }

    /// The cluster and settings of the route's concurrency limit, if it switches it on.
    fn limit_of(route: &Route) -> Option<serde_json::Value> {
        let any = route.typed_per_filter_config.get(LIMIT_FILTER)?;
        assert_eq!(any.type_url, FILTER_CONFIG_TYPE_URL);
        let on = RouteFilterConfig::decode(any.value.as_slice()).unwrap();
        assert!(!on.disabled && !on.is_optional);
        let inner = on.config.unwrap();
        assert_eq!(inner.type_url, LIMIT_PER_ROUTE_TYPE_URL);
        let per_route = DynamicModuleFilterPerRoute::decode(inner.value.as_slice()).unwrap();
        assert_eq!(per_route.filter_name, LIMIT_FILTER_NAME);
        assert_eq!(
            per_route.dynamic_module_config,
            Some(module_config("/m.so"))
        );
        let text = StringValue::decode(per_route.filter_config.unwrap().value.as_slice()).unwrap();
        Some(serde_json::from_str(&text.value).unwrap())
    }

    #[test]
    fn with_the_native_module_a_limit_switches_the_limit_filter_on_for_its_cluster_only() {
        let shell = RouteShell::Native {
            module: "/m.so".to_owned(),
            config: "{}".to_owned(),
        };
        let mut policy = timeouts();
        policy.clusters.insert("pay.vip".to_owned(), limited(7));
        policy.clusters.insert("pay.svip".to_owned(), limited(9));
        let mut both = chaos();
        both.limit = limited(3).limit;
        policy.clusters.insert("search.vip".to_owned(), both);
        let config = decode(&build("odmesh", &shell, &policy));
        // Each host form, with and without the secure header: the cluster the mapping picks.
        for (host, secure, cluster, max) in [
            ("pay", false, "pay.vip", 7),
            ("pay:443", false, "pay.svip", 9),
            ("pay", true, "pay.svip", 9),
            ("pay.vip", false, "pay.vip", 7),
            ("pay.svip", false, "pay.svip", 9),
            ("search", false, "search.vip", 3),
            ("search.vip", false, "search.vip", 3),
        ] {
            let vhost = host_for(&config, host);
            let route = (vhost.routes.iter())
                .filter(|r| !r.name.starts_with("mesh-grpc"))
                .find(|r| {
                    let m = r.r#match.as_ref().unwrap();
                    m.headers.is_empty()
                        || (secure && m.headers[0].name != ":authority")
                        || (host.ends_with(":443") && m.headers[0].name == ":authority")
                })
                .unwrap();
            let limit = limit_of(route).unwrap_or_else(|| panic!("{host}: {}", route.name));
            assert_eq!(limit["cluster"], cluster, "{host} {secure}");
            assert_eq!(limit["params"]["max_limit"], max, "{host}");
            assert_eq!(limit["params"]["initial_limit"], max.min(20), "{host}");
        }
        // The fault and the limit side by side on search's routes (search.svip, reached by
        // the secure rule, has neither); nothing elsewhere.
        for route in &host_for(&config, "search").routes {
            let plain = !route.name.contains("search.svip");
            assert_eq!(fault_of(route).is_some(), plain, "{}", route.name);
            assert_eq!(limit_of(route).is_some(), plain, "{}", route.name);
        }
        let all = host_for(&config, "other");
        assert!(
            all.routes
                .iter()
                .all(|r| r.typed_per_filter_config.is_empty())
        );
    }

    #[test]
    fn routes_with_a_fault_and_a_limit_encode_the_same_every_time() {
        let shell = RouteShell::Native {
            module: "/m.so".to_owned(),
            config: "{}".to_owned(),
        };
        let mut policy = timeouts();
        for n in 0..10 {
            let mut both = chaos();
            both.limit = limited(n + 2).limit;
            policy.clusters.insert(format!("v{n}.vip"), both);
        }
        let built: Vec<BuiltRoute> = (0..20).map(|_| build("odmesh", &shell, &policy)).collect();
        assert!(
            built.iter().all(|b| b.route == built[0].route),
            "bytes differ"
        );
        // And they say what was built: the canonical bytes decode to the same configuration.
        let mut plain = decode(&built[0]);
        let again = decode(&build("odmesh", &shell, &policy));
        assert_eq!(plain, again);
        plain.virtual_hosts.clear();
        assert_ne!(plain, again);
    }

    /// The wasm limit filter's setting in a route's metadata, if it has one.
    fn limit_in_metadata(route: &Route) -> Option<serde_json::Value> {
        let odmesh = route.metadata.as_ref()?.filter_metadata.get("odmesh")?;
        let Some(value::Kind::StringValue(json)) = &odmesh.fields.get("limit")?.kind else {
            panic!("{}: not a string", route.name)
        };
        Some(serde_json::from_str(json).unwrap())
    }

    /// Whether the route switches a filter of the chain on, with its own configuration.
    fn switches_on(route: &Route, filter: &str) -> bool {
        route.typed_per_filter_config.get(filter) == Some(&filter_on())
    }

    #[test]
    fn with_the_wasm_filter_a_limit_is_in_its_cluster_routes_metadata_and_its_vip_switches_it_on() {
        let mut policy = timeouts();
        policy.clusters.insert("pay.vip".to_owned(), limited(7));
        let mut both = chaos();
        both.limit = limited(3).limit;
        policy.clusters.insert("search.svip".to_owned(), both);
        let built = build("odmesh", &RouteShell::default(), &policy);
        assert_eq!(built.dropped, None);
        let config = decode(&built);
        for host in &config.virtual_hosts {
            for route in &host.routes {
                let setting = limit_in_metadata(route);
                let name = route.name.as_str();
                // The cluster's own routes, matched once the wasm filter named it, carry it.
                let expected = match name.split_once(':').map(|(_, c)| c) {
                    Some("pay.vip") => Some(("pay.vip", 7)),
                    Some("search.svip") => Some(("search.svip", 3)),
                    _ => None,
                };
                assert_eq!(
                    setting.as_ref().map(|s| (
                        s["cluster"].as_str().unwrap(),
                        s["params"]["max_limit"].clone()
                    )),
                    expected.map(|(c, m)| (c, serde_json::json!(m))),
                    "{name}"
                );
                if let Some(s) = &setting {
                    let parsed = odmesh_filter::limiter::Setting::parse(s.to_string().as_bytes());
                    assert!(parsed.is_ok(), "{parsed:?}");
                }
                // Every route of those VIPs' hosts switches the filter on (a request's
                // filters come from the route its host matched first); no other does.
                let vip_with_limit = ["pay", "search"].contains(&host.name.as_str());
                assert_eq!(switches_on(route, LIMIT_FILTER), vip_with_limit, "{name}");
                assert_eq!(limit_of_native(route), None, "{name}");
            }
        }
        // The fault stays beside the limit.
        let routes = config.virtual_hosts.iter().flat_map(|v| &v.routes);
        assert!(routes.clone().any(|r| fault_of(r).is_some()));
        // A caller reading another header than the host: every route switches it on.
        let other = RouteShell::Header {
            cluster_header: "x-odmesh-cluster".to_owned(),
            config: r#"{"source_header": "x-vip"}"#.to_owned(),
        };
        let config = decode(&build("odmesh", &other, &policy));
        let routes: Vec<&Route> = config
            .virtual_hosts
            .iter()
            .flat_map(|v| &v.routes)
            .collect();
        assert!(routes.iter().all(|r| switches_on(r, LIMIT_FILTER)));
        assert_eq!(
            routes
                .iter()
                .filter(|r| limit_in_metadata(r).is_some())
                .count(),
            4
        );
        // Without limits, no route has metadata or the filter.
        let config = decode(&build("odmesh", &RouteShell::default(), &timeouts()));
        let routes = config.virtual_hosts.iter().flat_map(|v| &v.routes);
        assert!(
            routes
                .clone()
                .all(|r| r.metadata.is_none()
                    && !r.typed_per_filter_config.contains_key(LIMIT_FILTER))
        );
    }

    /// A native per-route limit configuration on the route, which a wasm route never has.
    fn limit_of_native(route: &Route) -> Option<()> {
        let any = route.typed_per_filter_config.get(LIMIT_FILTER)?;
        let on = RouteFilterConfig::decode(any.value.as_slice()).unwrap();
        on.config
            .filter(|c| c.type_url == LIMIT_PER_ROUTE_TYPE_URL)
            .map(|_| ())
    }
}
