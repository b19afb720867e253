//! Pure translation of the model into Envoy resources: `Cluster` and `ClusterLoadAssignment`.
//!
//! No I/O, no state: one cluster name and what the [`Snapshot`](crate::model::Snapshot) says
//! about it in, protobufs and their versions out. Every odmesh cluster is an EDS cluster over
//! ADS whose EDS service name is the cluster name itself, so no two clusters ever share one
//! (Envoy can stall a cluster for 15 s on a shared, already-subscribed EDS name).
//!
//! A name the registry does not know is still answered with a normal cluster, marked
//! `registered: false` in its metadata, and an empty load assignment: Envoy then fails every
//! request for it fast with `503 UH`, and starts routing as soon as a later push brings
//! endpoints (docs/envoy.md, "On-demand discovery").
//!
//! Each cluster also says which HTTP it speaks upstream (see [`Protocol`]): by default what
//! the caller spoke (`.vip`) or what TLS ALPN settles (`.svip`), so HTTP/1.1, h2c, gRPC and
//! WebSocket callers all work with no configuration; an instance's declaration overrides it.
//!
//! A resource's version is a hash of the resource itself, maps taken in key order: see
//! [`version`].

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use envoy_types::pb::envoy::config::cluster::v3::{
    CircuitBreakers, Cluster, OutlierDetection,
    circuit_breakers::{Thresholds, thresholds::RetryBudget},
    cluster::{ClusterDiscoveryType, DiscoveryType, EdsClusterConfig, LbPolicy},
};
use envoy_types::pb::envoy::config::core::v3::{
    AggregatedConfigSource, ApiVersion, ConfigSource, DataSource, Http1ProtocolOptions,
    Http2ProtocolOptions, HttpProtocolOptions as CoreHttpProtocolOptions, Locality, Metadata,
    SocketAddress, TransportSocket, address, config_source::ConfigSourceSpecifier,
    data_source::Specifier, socket_address::PortSpecifier, transport_socket,
};
use envoy_types::pb::envoy::config::endpoint::v3::{
    ClusterLoadAssignment, Endpoint as PbEndpoint, LbEndpoint, LocalityLbEndpoints,
    lb_endpoint::HostIdentifier,
};
use envoy_types::pb::envoy::config::route::v3::{
    RetryPolicy,
    retry_policy::{RetryBackOff, RetryHostPredicate, retry_host_predicate},
    route_action::{HashPolicy, hash_policy},
};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    CertificateValidationContext, CommonTlsContext, SubjectAltNameMatcher, UpstreamTlsContext,
    common_tls_context::ValidationContextType, subject_alt_name_matcher::SanType,
};
use envoy_types::pb::envoy::extensions::upstreams::http::v3::{
    HttpProtocolOptions,
    http_protocol_options::{
        AutoHttpConfig, ExplicitHttpConfig, UpstreamProtocolOptions, UseDownstreamHttpConfig,
        explicit_http_config::ProtocolConfig,
    },
};
use envoy_types::pb::envoy::service::discovery::v3::Resource;
use envoy_types::pb::envoy::r#type::matcher::v3::{StringMatcher, string_matcher::MatchPattern};
use envoy_types::pb::envoy::r#type::v3::Percent;
use envoy_types::pb::google::protobuf::{
    Any, Duration as PbDuration, Struct, UInt32Value, Value, value,
};
use odmesh_names::{InvalidClusterName, Kind, parse_cluster_name};
use prost::Message;

use crate::model::{ClusterInfo, Endpoint, Snapshot};
use crate::policy::{Effective, LoadBalancing, Policy};
use odmesh_registry::Protocol;

mod version;

/// Type URL of `envoy.config.cluster.v3.Cluster` (CDS).
pub const CLUSTER_TYPE_URL: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
/// Type URL of `envoy.config.endpoint.v3.ClusterLoadAssignment` (EDS).
pub const ENDPOINTS_TYPE_URL: &str =
    "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
/// The `filter_metadata` namespace odmesh writes on every cluster.
pub const METADATA_NAMESPACE: &str = "odmesh";
/// The key of `typed_extension_protocol_options` that carries a cluster's HTTP settings.
const HTTP_PROTOCOL_OPTIONS: &str = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions";
const HTTP_PROTOCOL_OPTIONS_TYPE_URL: &str =
    "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions";
/// The cluster metadata keys (namespace `odmesh`) of the request and per-try timeouts, in
/// milliseconds; absent for none.
pub const REQUEST_TIMEOUT_KEY: &str = "request_timeout_ms";
pub const PER_TRY_TIMEOUT_KEY: &str = "per_try_timeout_ms";
const PREVIOUS_HOSTS: &str = "envoy.retry_host_predicates.previous_hosts";
const PREVIOUS_HOSTS_TYPE_URL: &str =
    "type.googleapis.com/envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate";
/// Envoy's name for the TLS transport socket.
const TLS_SOCKET: &str = "envoy.transport_sockets.tls";
const UPSTREAM_TLS_TYPE_URL: &str =
    "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext";

/// Envoy 1.40 has no working "use the system roots" switch (`system_root_certs` is not
/// implemented), so odmesh names a bundle file: the first of these that exists.
pub use odmesh_base::tls::SYSTEM_CA_BUNDLES;

/// The two resource types odmesh serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ResourceType {
    /// `Cluster`, asked for by on-demand CDS.
    Cluster,
    /// `ClusterLoadAssignment`, asked for by each EDS cluster.
    Endpoints,
}

impl ResourceType {
    /// Both types, clusters first: a push sends a changed cluster before its endpoints.
    pub const ALL: [ResourceType; 2] = [ResourceType::Cluster, ResourceType::Endpoints];

    /// The type URL on the wire.
    pub const fn type_url(self) -> &'static str {
        match self {
            ResourceType::Cluster => CLUSTER_TYPE_URL,
            ResourceType::Endpoints => ENDPOINTS_TYPE_URL,
        }
    }

    /// The type a type URL names, if odmesh serves it.
    pub fn from_type_url(url: &str) -> Option<ResourceType> {
        match url {
            CLUSTER_TYPE_URL => Some(ResourceType::Cluster),
            ENDPOINTS_TYPE_URL => Some(ResourceType::Endpoints),
            _ => None,
        }
    }

    /// A short word for logs and JSON: `cluster` or `endpoints`.
    pub const fn as_str(self) -> &'static str {
        match self {
            ResourceType::Cluster => "cluster",
            ResourceType::Endpoints => "endpoints",
        }
    }
}

/// Settings that shape every cluster, fixed for the life of the process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct XdsOptions {
    /// CA bundle that verifies `.svip` upstreams (`--upstream-ca`, else the system bundle).
    pub upstream_ca: PathBuf,
    /// Whether a `.svip` upstream's certificate must name the SVIP (DNS SAN), on top of the
    /// chain check. On by default: a valid chain alone proves nothing about who answered.
    pub verify_upstream_san: bool,
}

impl XdsOptions {
    /// Options with `upstream_ca`, or the first system CA bundle that exists.
    pub fn new(upstream_ca: Option<PathBuf>) -> XdsOptions {
        let upstream_ca = upstream_ca.unwrap_or_else(|| {
            let found = SYSTEM_CA_BUNDLES.iter().find(|p| Path::new(p).exists());
            PathBuf::from(found.unwrap_or(&SYSTEM_CA_BUNDLES[0]))
        });
        XdsOptions {
            upstream_ca,
            verify_upstream_san: true,
        }
    }
}

impl Default for XdsOptions {
    fn default() -> XdsOptions {
        XdsOptions::new(None)
    }
}

/// One resource ready for the wire: its name, content-hash version and encoded body.
#[derive(Clone, Debug, PartialEq)]
pub struct Versioned {
    pub name: String,
    pub version: String,
    pub resource: Any,
    /// Whether the registry lists the cluster (a resource for an unregistered name is a
    /// cluster without endpoints).
    pub registered: bool,
}

impl Versioned {
    /// The resource as it goes out in a `DeltaDiscoveryResponse`.
    pub fn to_resource(&self) -> Resource {
        Resource {
            name: self.name.clone(),
            version: self.version.clone(),
            resource: Some(self.resource.clone()),
            ..Default::default()
        }
    }
}

/// The two resources of one cluster name, built together.
#[derive(Clone, Debug, PartialEq)]
pub struct ClusterResources {
    pub cluster: Versioned,
    pub endpoints: Versioned,
}

impl ClusterResources {
    /// The resource of type `ty`.
    pub fn get(&self, ty: ResourceType) -> &Versioned {
        match ty {
            ResourceType::Cluster => &self.cluster,
            ResourceType::Endpoints => &self.endpoints,
        }
    }
}

/// What the registry says about one cluster name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lookup<'a> {
    /// Some instance lists the VIP.
    Registered(&'a ClusterInfo),
    /// No instance lists the VIP, and the registry is complete.
    Unregistered,
    /// No instance lists the VIP so far, but the registry is still loading (after a
    /// restart, before the source's first good read): it may well exist.
    NotYetKnown,
}

impl<'a> Lookup<'a> {
    /// What `snapshot` says about `name`.
    pub fn in_snapshot(snapshot: &'a Snapshot, name: &str) -> Lookup<'a> {
        match snapshot.get(name) {
            Some(info) => Lookup::Registered(info),
            None if snapshot.is_complete() => Lookup::Unregistered,
            None => Lookup::NotYetKnown,
        }
    }
}

/// Builds and versions both resources for cluster `name`, with odmesh's default policy.
/// Fails only when `name` is not an odmesh cluster name.
pub fn build(
    name: &str,
    lookup: Lookup<'_>,
    opts: &XdsOptions,
) -> Result<ClusterResources, InvalidClusterName> {
    build_for(name, lookup, opts, &Policy::default(), None)
}

/// [`build`] under `policy`, for the proxies of `caller` (`None`: a caller without an
/// override of its own; see [`Policy::has_caller_override`]).
pub fn build_for(
    name: &str,
    lookup: Lookup<'_>,
    opts: &XdsOptions,
    policy: &Policy,
    caller: Option<&str>,
) -> Result<ClusterResources, InvalidClusterName> {
    let target = Target::new(name, lookup, policy, caller)?;
    let cluster = target.cluster(opts);
    let cluster_resource = any(CLUSTER_TYPE_URL, &cluster);
    let cluster_version = version::cluster(cluster);
    let endpoints_resource = any(ENDPOINTS_TYPE_URL, &target.load_assignment());
    let endpoints_version = version::load_assignment(cluster_version, &endpoints_resource.value);
    let registered = target.state == State::Registered;
    Ok(ClusterResources {
        cluster: Versioned {
            name: name.to_owned(),
            version: format!("{cluster_version:016x}"),
            resource: cluster_resource,
            registered,
        },
        endpoints: Versioned {
            name: name.to_owned(),
            version: format!("{endpoints_version:016x}"),
            resource: endpoints_resource,
            registered,
        },
    })
}

/// The `Cluster` for `name` with odmesh's default policy; see the module docs.
pub fn cluster(
    name: &str,
    lookup: Lookup<'_>,
    opts: &XdsOptions,
) -> Result<Cluster, InvalidClusterName> {
    Ok(Target::new(name, lookup, &Policy::default(), None)?.cluster(opts))
}

/// The policy `name` gets under `policy` for `caller`, with where each value came from.
pub fn effective_policy(
    name: &str,
    lookup: Lookup<'_>,
    policy: &Policy,
    caller: Option<&str>,
) -> Result<Effective, InvalidClusterName> {
    Ok(Target::new(name, lookup, policy, caller)?.policy)
}

/// The `ClusterLoadAssignment` for `name`: UP endpoints grouped by zone (empty when unknown).
pub fn load_assignment(
    name: &str,
    lookup: Lookup<'_>,
) -> Result<ClusterLoadAssignment, InvalidClusterName> {
    Ok(Target::new(name, lookup, &Policy::default(), None)?.load_assignment())
}

/// [`Lookup`] without the cluster, as it shapes a resource.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Unregistered,
    Registered,
    NotYetKnown,
}

/// Everything a resource is made of, checked once.
struct Target<'a> {
    name: &'a str,
    vip: &'a str,
    kind: Kind,
    state: State,
    endpoints: &'a [Endpoint],
    /// What the policy (and the instances' declared protocol) give this cluster.
    policy: Effective,
}

impl<'a> Target<'a> {
    fn new(
        name: &'a str,
        lookup: Lookup<'a>,
        policy: &Policy,
        caller: Option<&str>,
    ) -> Result<Target<'a>, InvalidClusterName> {
        let (vip, kind) = parse_cluster_name(name)?;
        let (vip, state, endpoints, declared): (&str, _, &[Endpoint], _) = match lookup {
            Lookup::Registered(info) => {
                (&info.vip, State::Registered, &info.endpoints, info.protocol)
            }
            Lookup::Unregistered => (vip, State::Unregistered, &[], Protocol::Auto),
            Lookup::NotYetKnown => (vip, State::NotYetKnown, &[], Protocol::Auto),
        };
        Ok(Target {
            name,
            vip,
            kind,
            state,
            endpoints,
            policy: policy.resolve(kind, vip, caller, declared),
        })
    }

    fn protocol(&self) -> Protocol {
        self.policy.protocol.value
    }

    fn cluster(&self, opts: &XdsOptions) -> Cluster {
        Cluster {
            name: self.name.to_owned(),
            cluster_discovery_type: Some(ClusterDiscoveryType::Type(DiscoveryType::Eds as i32)),
            eds_cluster_config: Some(EdsClusterConfig {
                eds_config: Some(ConfigSource {
                    config_source_specifier: Some(ConfigSourceSpecifier::Ads(
                        AggregatedConfigSource {},
                    )),
                    resource_api_version: ApiVersion::V3 as i32,
                    ..Default::default()
                }),
                service_name: self.name.to_owned(),
            }),
            connect_timeout: Some(duration(self.policy.connect_timeout.value)),
            lb_policy: match self.policy.load_balancing.value {
                LoadBalancing::RoundRobin => LbPolicy::RoundRobin,
                LoadBalancing::LeastRequest => LbPolicy::LeastRequest,
                LoadBalancing::RingHash => LbPolicy::RingHash,
                LoadBalancing::Maglev => LbPolicy::Maglev,
            } as i32,
            circuit_breakers: Some(self.circuit_breakers()),
            outlier_detection: Some(self.outlier_detection()),
            metadata: Some(self.metadata()),
            transport_socket: (self.kind == Kind::Svip).then(|| self.tls_socket(opts)),
            typed_extension_protocol_options: HashMap::from([(
                HTTP_PROTOCOL_OPTIONS.to_owned(),
                any(
                    HTTP_PROTOCOL_OPTIONS_TYPE_URL,
                    &self.http_protocol_options(),
                ),
            )]),
            ..Default::default()
        }
    }

    /// Which HTTP the cluster speaks upstream; see [`Protocol`] for the rule. With no
    /// declaration a `.vip` cluster keeps one connection pool per protocol and uses the
    /// caller's (`use_downstream_protocol_config`): an h2c or gRPC caller gets HTTP/2
    /// upstream, an HTTP/1.1 caller (and its WebSocket upgrade) HTTP/1.1. A `.svip` cluster
    /// offers `h2,http/1.1` in ALPN and speaks what the server picks (`auto_config`).
    fn circuit_breakers(&self) -> CircuitBreakers {
        let p = &self.policy;
        let budget = (p.retry_budget_percent.value > 0).then(|| RetryBudget {
            budget_percent: Some(Percent {
                value: f64::from(p.retry_budget_percent.value),
            }),
            min_retry_concurrency: Some(UInt32Value { value: 3 }),
            ..Default::default()
        });
        CircuitBreakers {
            thresholds: vec![Thresholds {
                max_connections: Some(UInt32Value {
                    value: p.max_connections.value,
                }),
                max_pending_requests: Some(UInt32Value {
                    value: p.max_pending_requests.value,
                }),
                max_requests: Some(UInt32Value {
                    value: p.max_requests.value,
                }),
                max_retries: Some(UInt32Value {
                    value: p.max_retries.value,
                }),
                retry_budget: budget,
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    fn outlier_detection(&self) -> OutlierDetection {
        let p = &self.policy;
        OutlierDetection {
            consecutive_5xx: Some(UInt32Value {
                value: p.consecutive_5xx.value,
            }),
            interval: Some(duration(p.outlier_interval.value)),
            base_ejection_time: Some(duration(p.base_ejection_time.value)),
            max_ejection_percent: Some(UInt32Value {
                value: p.max_ejection_percent.value,
            }),
            ..Default::default()
        }
    }

    /// What `ring_hash` and `maglev` hash: the policy's header (a cluster's hash policy
    /// replaces the route's); nothing for the other balancers.
    fn hash_policy(&self) -> Vec<HashPolicy> {
        match self.policy.load_balancing.value {
            LoadBalancing::RingHash | LoadBalancing::Maglev => vec![HashPolicy {
                policy_specifier: Some(hash_policy::PolicySpecifier::Header(hash_policy::Header {
                    header_name: self.policy.hash_header.value.0.clone(),
                    ..Default::default()
                })),
                ..Default::default()
            }],
            LoadBalancing::RoundRobin | LoadBalancing::LeastRequest => Vec::new(),
        }
    }

    /// The cluster's retry policy (Envoy 1.37+: it replaces the route's). A retry goes to
    /// another instance when there is one (`previous_hosts`).
    fn retry_policy(&self) -> RetryPolicy {
        let p = &self.policy;
        let on: Vec<&str> = p.retry_on.value.iter().map(|r| r.as_str()).collect();
        RetryPolicy {
            retry_on: on.join(","),
            num_retries: Some(UInt32Value {
                value: p.retries.value,
            }),
            retry_back_off: Some(RetryBackOff {
                base_interval: Some(duration(p.retry_backoff_base.value)),
                max_interval: Some(duration(p.retry_backoff_max.value)),
            }),
            retry_host_predicate: vec![RetryHostPredicate {
                name: PREVIOUS_HOSTS.to_owned(),
                config_type: Some(retry_host_predicate::ConfigType::TypedConfig(Any {
                    type_url: PREVIOUS_HOSTS_TYPE_URL.to_owned(),
                    value: Vec::new(),
                })),
            }],
            host_selection_retry_max_attempts: 3,
            ..Default::default()
        }
    }

    fn http_protocol_options(&self) -> HttpProtocolOptions {
        let http1 = || Some(Http1ProtocolOptions::default());
        let http2 = || Some(Http2ProtocolOptions::default());
        let choice = match (self.protocol(), self.kind) {
            (Protocol::Auto, Kind::Vip) => {
                UpstreamProtocolOptions::UseDownstreamProtocolConfig(UseDownstreamHttpConfig {
                    http_protocol_options: http1(),
                    http2_protocol_options: http2(),
                    ..Default::default()
                })
            }
            (Protocol::Auto, Kind::Svip) => UpstreamProtocolOptions::AutoConfig(AutoHttpConfig {
                http_protocol_options: http1(),
                http2_protocol_options: http2(),
                ..Default::default()
            }),
            (Protocol::Http1, _) => {
                UpstreamProtocolOptions::ExplicitHttpConfig(ExplicitHttpConfig {
                    protocol_config: Some(ProtocolConfig::HttpProtocolOptions(
                        Http1ProtocolOptions::default(),
                    )),
                })
            }
            (Protocol::Http2, _) => {
                UpstreamProtocolOptions::ExplicitHttpConfig(ExplicitHttpConfig {
                    protocol_config: Some(ProtocolConfig::Http2ProtocolOptions(
                        Http2ProtocolOptions::default(),
                    )),
                })
            }
        };
        HttpProtocolOptions {
            upstream_protocol_options: Some(choice),
            common_http_protocol_options: Some(CoreHttpProtocolOptions {
                idle_timeout: Some(duration(self.policy.idle_timeout.value)),
                ..Default::default()
            }),
            retry_policy: Some(self.retry_policy()),
            hash_policy: self.hash_policy(),
            ..Default::default()
        }
    }

    /// The ALPN list a `.svip` cluster offers: empty for [`Protocol::Auto`], where Envoy's
    /// `auto_config` offers `h2,http/1.1` itself; the one declared protocol otherwise.
    fn alpn(&self) -> Vec<String> {
        match self.protocol() {
            Protocol::Auto => Vec::new(),
            Protocol::Http1 => vec!["http/1.1".to_owned()],
            Protocol::Http2 => vec!["h2".to_owned()],
        }
    }

    /// `filter_metadata.odmesh = {vip, kind, protocol, registered, reason}`, read by Envoy's
    /// `local_reply_config`: `reason` is the error a client gets when no endpoint can take
    /// its request, telling "not registered" from "no healthy endpoint".
    fn metadata(&self) -> Metadata {
        let fields = HashMap::from([
            ("vip".to_owned(), string_value(self.vip)),
            ("kind".to_owned(), string_value(self.kind.as_str())),
            (
                "protocol".to_owned(),
                string_value(self.protocol().as_str()),
            ),
            ("reason".to_owned(), string_value(&self.reason())),
            (
                "registered".to_owned(),
                Value {
                    kind: Some(value::Kind::BoolValue(self.state == State::Registered)),
                },
            ),
        ]);
        let mut fields = fields;
        // Read by the bootstrap's `header_mutation` filter, which turns them into the router's
        // `x-envoy-upstream-rq-timeout-ms` and `x-envoy-upstream-rq-per-try-timeout-ms`: the
        // one way a cluster can give its requests a timeout with a single shared route.
        for (key, timeout) in [
            (REQUEST_TIMEOUT_KEY, &self.policy.request_timeout),
            (PER_TRY_TIMEOUT_KEY, &self.policy.per_try_timeout),
        ] {
            if !timeout.value.is_zero() {
                let ms = timeout.value.as_millis().max(1).to_string();
                fields.insert(key.to_owned(), string_value(&ms));
            }
        }
        Metadata {
            filter_metadata: HashMap::from([(METADATA_NAMESPACE.to_owned(), Struct { fields })]),
            ..Default::default()
        }
    }

    /// Why a request to this cluster finds no endpoint, in words for the client.
    fn reason(&self) -> String {
        let side = match self.kind {
            Kind::Vip => "VIP",
            Kind::Svip => "SVIP",
        };
        match self.state {
            State::Registered => format!(
                "{side} {} has no healthy endpoint: no instance of it is UP",
                self.vip
            ),
            State::Unregistered => format!("{side} {} is not registered", self.vip),
            State::NotYetKnown => format!(
                "{side} {} is not known yet: the control plane is still loading its registry",
                self.vip
            ),
        }
    }

    /// TLS to the upstream: SNI = the SVIP, chain checked against the configured CA bundle,
    /// and (by default) the certificate must name the SVIP.
    fn tls_socket(&self, opts: &XdsOptions) -> TransportSocket {
        let san = opts.verify_upstream_san.then(|| SubjectAltNameMatcher {
            san_type: SanType::Dns as i32,
            matcher: Some(StringMatcher {
                match_pattern: Some(MatchPattern::Exact(self.vip.to_owned())),
                ignore_case: true,
            }),
            ..Default::default()
        });
        let tls = UpstreamTlsContext {
            common_tls_context: Some(CommonTlsContext {
                validation_context_type: Some(ValidationContextType::ValidationContext(
                    CertificateValidationContext {
                        trusted_ca: Some(DataSource {
                            specifier: Some(Specifier::Filename(
                                opts.upstream_ca.to_string_lossy().into_owned(),
                            )),
                            ..Default::default()
                        }),
                        match_typed_subject_alt_names: san.into_iter().collect(),
                        ..Default::default()
                    },
                )),
                alpn_protocols: self.alpn(),
                ..Default::default()
            }),
            sni: self.vip.to_owned(),
            ..Default::default()
        };
        TransportSocket {
            name: TLS_SOCKET.to_owned(),
            config_type: Some(transport_socket::ConfigType::TypedConfig(any(
                UPSTREAM_TLS_TYPE_URL,
                &tls,
            ))),
        }
    }

    /// Endpoints grouped by zone, one `LocalityLbEndpoints` per zone. The model keeps
    /// endpoints sorted by zone first, so each group is a run of neighbours.
    fn load_assignment(&self) -> ClusterLoadAssignment {
        let mut groups: Vec<LocalityLbEndpoints> = Vec::new();
        let mut current_zone: Option<Option<&str>> = None;
        for ep in self.endpoints {
            let zone = ep.zone.as_deref();
            if current_zone != Some(zone) {
                current_zone = Some(zone);
                groups.push(LocalityLbEndpoints {
                    locality: zone.map(|z| Locality {
                        zone: z.to_owned(),
                        ..Default::default()
                    }),
                    ..Default::default()
                });
            }
            if let Some(group) = groups.last_mut() {
                group.lb_endpoints.push(lb_endpoint(ep));
            }
        }
        ClusterLoadAssignment {
            cluster_name: self.name.to_owned(),
            endpoints: groups,
            ..Default::default()
        }
    }
}

fn lb_endpoint(ep: &Endpoint) -> LbEndpoint {
    let address = envoy_types::pb::envoy::config::core::v3::Address {
        address: Some(address::Address::SocketAddress(SocketAddress {
            address: ep.ip.to_string(),
            port_specifier: Some(PortSpecifier::PortValue(u32::from(ep.port))),
            ..Default::default()
        })),
    };
    LbEndpoint {
        host_identifier: Some(HostIdentifier::Endpoint(PbEndpoint {
            address: Some(address),
            ..Default::default()
        })),
        ..Default::default()
    }
}

fn string_value(s: &str) -> Value {
    Value {
        kind: Some(value::Kind::StringValue(s.to_owned())),
    }
}

pub(crate) fn duration(d: Duration) -> PbDuration {
    PbDuration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}

fn any(type_url: &str, msg: &impl Message) -> Any {
    Any {
        type_url: type_url.to_owned(),
        value: msg.encode_to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::config::cluster::v3::cluster::ClusterDiscoveryType as Cdt;

    fn ep(zone: Option<&str>, ip: &str, port: u16) -> Endpoint {
        Endpoint {
            zone: zone.map(str::to_owned),
            ip: ip.parse().unwrap(),
            port,
        }
    }

    fn info(vip: &str, kind: Kind, mut endpoints: Vec<Endpoint>) -> ClusterInfo {
        endpoints.sort();
        ClusterInfo {
            vip: vip.into(),
            kind,
            instances: endpoints.len(),
            endpoints,
            protocol: Protocol::Auto,
        }
    }

    fn opts() -> XdsOptions {
        XdsOptions::new(Some("/ca.pem".into()))
    }

    fn odmesh_meta(c: &Cluster) -> &HashMap<String, Value> {
        &c.metadata.as_ref().unwrap().filter_metadata[METADATA_NAMESPACE].fields
    }

    #[test]
    fn a_vip_cluster_is_eds_over_ads_with_its_own_service_name() {
        let hello = info("hello", Kind::Vip, vec![ep(None, "10.0.0.1", 8080)]);
        let c = cluster("hello.vip", Lookup::Registered(&hello), &opts()).unwrap();
        assert_eq!(c.name, "hello.vip");
        assert_eq!(
            c.cluster_discovery_type,
            Some(Cdt::Type(DiscoveryType::Eds as i32))
        );
        let eds = c.eds_cluster_config.unwrap();
        assert_eq!(eds.service_name, "hello.vip");
        let source = eds.eds_config.unwrap();
        assert!(matches!(
            source.config_source_specifier,
            Some(ConfigSourceSpecifier::Ads(_))
        ));
        assert_eq!(source.resource_api_version, ApiVersion::V3 as i32);
        assert_eq!(c.connect_timeout.unwrap().seconds, 1);
        assert_eq!(c.lb_policy, LbPolicy::RoundRobin as i32);
        assert!(c.outlier_detection.is_some());
        assert!(c.transport_socket.is_none(), "plain VIPs have no TLS");
    }

    #[test]
    fn cluster_metadata_says_vip_kind_and_registered() {
        let hello = info("hello", Kind::Vip, vec![]);
        let c = cluster("hello.vip", Lookup::Registered(&hello), &opts()).unwrap();
        let meta = odmesh_meta(&c);
        assert_eq!(meta["vip"], string_value("hello"));
        assert_eq!(meta["kind"], string_value("vip"));
        assert_eq!(meta["registered"].kind, Some(value::Kind::BoolValue(true)));
        assert_eq!(
            meta["reason"],
            string_value("VIP hello has no healthy endpoint: no instance of it is UP")
        );
    }

    #[test]
    fn an_unknown_vip_is_a_normal_cluster_marked_unregistered_with_no_endpoints() {
        let c = cluster("nobody.vip", Lookup::Unregistered, &opts()).unwrap();
        assert_eq!(
            c.eds_cluster_config.as_ref().unwrap().service_name,
            "nobody.vip",
            "still an EDS cluster of its own"
        );
        let meta = odmesh_meta(&c);
        assert_eq!(meta["registered"].kind, Some(value::Kind::BoolValue(false)));
        assert_eq!(
            meta["reason"].kind,
            Some(value::Kind::StringValue(
                "VIP nobody is not registered".into()
            ))
        );
        assert_eq!(meta["vip"], string_value("nobody"));
        let cla = load_assignment("nobody.vip", Lookup::Unregistered).unwrap();
        assert_eq!(cla.cluster_name, "nobody.vip");
        assert!(cla.endpoints.is_empty());
    }

    #[test]
    fn a_vip_not_known_yet_says_so_and_is_versioned_apart_from_an_unregistered_one() {
        let c = cluster("late.vip", Lookup::NotYetKnown, &opts()).unwrap();
        let meta = odmesh_meta(&c);
        assert_eq!(meta["registered"].kind, Some(value::Kind::BoolValue(false)));
        assert_eq!(
            meta["reason"],
            string_value(
                "VIP late is not known yet: the control plane is still loading its registry"
            )
        );
        let not_yet = build("late.vip", Lookup::NotYetKnown, &opts()).unwrap();
        let unregistered = build("late.vip", Lookup::Unregistered, &opts()).unwrap();
        assert_ne!(not_yet.cluster.version, unregistered.cluster.version);
        assert!(!not_yet.cluster.registered && !unregistered.endpoints.registered);
        let hello = info("hello", Kind::Vip, vec![]);
        assert!(
            build("hello.vip", Lookup::Registered(&hello), &opts())
                .unwrap()
                .cluster
                .registered
        );
    }

    #[test]
    fn an_svip_cluster_talks_tls_with_the_svip_as_sni_and_the_configured_ca() {
        let secure = info("hello", Kind::Svip, vec![ep(None, "10.0.0.1", 8443)]);
        let c = cluster("hello.svip", Lookup::Registered(&secure), &opts()).unwrap();
        let socket = c.transport_socket.unwrap();
        assert_eq!(socket.name, "envoy.transport_sockets.tls");
        let Some(transport_socket::ConfigType::TypedConfig(any)) = socket.config_type else {
            panic!("typed config expected");
        };
        assert_eq!(any.type_url, UPSTREAM_TLS_TYPE_URL);
        let tls = UpstreamTlsContext::decode(any.value.as_slice()).unwrap();
        assert_eq!(tls.sni, "hello");
        let Some(ValidationContextType::ValidationContext(vc)) =
            tls.common_tls_context.unwrap().validation_context_type
        else {
            panic!("validation context expected");
        };
        assert_eq!(
            vc.trusted_ca.unwrap().specifier,
            Some(Specifier::Filename("/ca.pem".into()))
        );
        assert_eq!(vc.match_typed_subject_alt_names.len(), 1);
        assert_eq!(
            vc.match_typed_subject_alt_names[0]
                .matcher
                .as_ref()
                .unwrap()
                .match_pattern,
            Some(MatchPattern::Exact("hello".into()))
        );
    }

    /// The cluster's HTTP protocol options and, for a `.svip`, the ALPN it offers.
    fn protocol_of(kind: Kind, protocol: Protocol) -> (UpstreamProtocolOptions, Vec<String>) {
        let name = odmesh_names::cluster_name("svc", kind);
        let svc = ClusterInfo {
            protocol,
            ..info("svc", kind, vec![])
        };
        let c = cluster(&name, Lookup::Registered(&svc), &opts()).unwrap();
        let any = &c.typed_extension_protocol_options[HTTP_PROTOCOL_OPTIONS];
        assert_eq!(any.type_url, HTTP_PROTOCOL_OPTIONS_TYPE_URL);
        let options = HttpProtocolOptions::decode(any.value.as_slice()).unwrap();
        let alpn = match c.transport_socket.and_then(|s| s.config_type) {
            Some(transport_socket::ConfigType::TypedConfig(tls)) => {
                let tls = UpstreamTlsContext::decode(tls.value.as_slice()).unwrap();
                tls.common_tls_context.unwrap().alpn_protocols
            }
            _ => Vec::new(),
        };
        (options.upstream_protocol_options.unwrap(), alpn)
    }

    #[test]
    fn without_a_declaration_a_vip_speaks_the_callers_protocol_and_an_svip_what_alpn_settles() {
        let (vip, _) = protocol_of(Kind::Vip, Protocol::Auto);
        let UpstreamProtocolOptions::UseDownstreamProtocolConfig(both) = vip else {
            panic!("a .vip follows the caller: {vip:?}");
        };
        assert!(both.http_protocol_options.is_some() && both.http2_protocol_options.is_some());

        let (svip, alpn) = protocol_of(Kind::Svip, Protocol::Auto);
        let UpstreamProtocolOptions::AutoConfig(auto) = svip else {
            panic!("a .svip follows ALPN: {svip:?}");
        };
        assert!(auto.http_protocol_options.is_some() && auto.http2_protocol_options.is_some());
        assert!(
            alpn.is_empty(),
            "Envoy's auto_config offers h2,http/1.1 itself: {alpn:?}"
        );
    }

    #[test]
    fn a_declared_protocol_is_spoken_whatever_the_caller_spoke() {
        for kind in [Kind::Vip, Kind::Svip] {
            let (http2, alpn) = protocol_of(kind, Protocol::Http2);
            assert_eq!(
                http2,
                UpstreamProtocolOptions::ExplicitHttpConfig(ExplicitHttpConfig {
                    protocol_config: Some(ProtocolConfig::Http2ProtocolOptions(
                        Http2ProtocolOptions::default()
                    )),
                }),
                "{kind:?}"
            );
            let expected: &[&str] = if kind == Kind::Svip { &["h2"] } else { &[] };
            assert_eq!(alpn, expected, "{kind:?}");

            let (http1, alpn) = protocol_of(kind, Protocol::Http1);
            assert!(
                matches!(
                    http1,
                    UpstreamProtocolOptions::ExplicitHttpConfig(ExplicitHttpConfig {
                        protocol_config: Some(ProtocolConfig::HttpProtocolOptions(_)),
                    })
                ),
                "{kind:?}: {http1:?}"
            );
            let expected: &[&str] = if kind == Kind::Svip {
                &["http/1.1"]
            } else {
                &[]
            };
            assert_eq!(alpn, expected, "{kind:?}");
        }
    }

    #[test]
    fn a_protocol_declaration_changes_the_cluster_version_and_its_metadata() {
        let auto = info("hello", Kind::Vip, vec![ep(None, "10.0.0.1", 8080)]);
        let http2 = ClusterInfo {
            protocol: Protocol::Http2,
            ..auto.clone()
        };
        let a = build("hello.vip", Lookup::Registered(&auto), &opts()).unwrap();
        let b = build("hello.vip", Lookup::Registered(&http2), &opts()).unwrap();
        assert_ne!(a.cluster.version, b.cluster.version);
        let c = cluster("hello.vip", Lookup::Registered(&http2), &opts()).unwrap();
        assert_eq!(odmesh_meta(&c)["protocol"], string_value("http2"));
    }

    /// The cluster `hello.vip` builds under `yaml`, for proxies of `caller`.
    fn under_policy(yaml: &str, caller: Option<&str>) -> (Cluster, HttpProtocolOptions) {
        let policy = Policy::parse(yaml.as_bytes()).unwrap();
        let hello = info("hello", Kind::Vip, vec![ep(None, "10.0.0.1", 8080)]);
        let built = build_for(
            "hello.vip",
            Lookup::Registered(&hello),
            &opts(),
            &policy,
            caller,
        )
        .unwrap();
        let c = Cluster::decode(built.cluster.resource.value.as_slice()).unwrap();
        let any = &c.typed_extension_protocol_options[HTTP_PROTOCOL_OPTIONS];
        let options = HttpProtocolOptions::decode(any.value.as_slice()).unwrap();
        (c, options)
    }

    #[test]
    fn without_a_policy_a_request_that_never_reached_an_instance_is_retried_on_another() {
        let (c, options) = under_policy("", None);
        let retry = options.retry_policy.unwrap();
        assert_eq!(
            retry.retry_on,
            "connect-failure,refused-stream,reset-before-request"
        );
        assert_eq!(retry.num_retries, Some(UInt32Value { value: 2 }));
        assert_eq!(retry.retry_host_predicate[0].name, PREVIOUS_HOSTS);
        assert_eq!(retry.host_selection_retry_max_attempts, 3);
        assert_eq!(c.connect_timeout.unwrap().seconds, 1);
        assert_eq!(c.lb_policy, LbPolicy::RoundRobin as i32);
        let meta = odmesh_meta(&c);
        assert!(
            !meta.contains_key(REQUEST_TIMEOUT_KEY),
            "no request timeout by default"
        );
        assert!(!meta.contains_key(PER_TRY_TIMEOUT_KEY));
    }

    #[test]
    fn each_policy_value_lands_in_its_envoy_field() {
        let (c, options) = under_policy(
            "vips:
  hello:
    connect_timeout: 250ms
    request_timeout: 2s
    per_try_timeout: 500ms
    idle_timeout: 5m
    load_balancing: least_request
    retries: {on: [5xx, reset], count: 3, backoff: {base: 10ms, max: 1s}, budget_percent: 20}
    circuit_breakers: {max_connections: 10, max_pending_requests: 11, max_requests: 12, max_retries: 2}
    outlier_detection: {consecutive_5xx: 7, interval: 2s, base_ejection_time: 9s, max_ejection_percent: 50}
",
            None,
        );
        assert_eq!(c.connect_timeout.unwrap().nanos, 250_000_000);
        assert_eq!(c.lb_policy, LbPolicy::LeastRequest as i32);
        let retry = options.retry_policy.unwrap();
        assert_eq!(retry.retry_on, "5xx,reset");
        assert_eq!(retry.num_retries, Some(UInt32Value { value: 3 }));
        let backoff = retry.retry_back_off.unwrap();
        assert_eq!(backoff.base_interval.unwrap().nanos, 10_000_000);
        assert_eq!(backoff.max_interval.unwrap().seconds, 1);
        let idle = options.common_http_protocol_options.unwrap().idle_timeout;
        assert_eq!(idle.unwrap().seconds, 300);
        let limits = &c.circuit_breakers.as_ref().unwrap().thresholds[0];
        let n = |v: &Option<UInt32Value>| v.as_ref().unwrap().value;
        assert_eq!(
            (n(&limits.max_connections), n(&limits.max_pending_requests)),
            (10, 11)
        );
        assert_eq!((n(&limits.max_requests), n(&limits.max_retries)), (12, 2));
        let budget = limits.retry_budget.as_ref().unwrap();
        assert_eq!(budget.budget_percent.as_ref().unwrap().value, 20.0);
        let outliers = c.outlier_detection.as_ref().unwrap();
        assert_eq!(n(&outliers.consecutive_5xx), 7);
        assert_eq!(outliers.interval.unwrap().seconds, 2);
        assert_eq!(outliers.base_ejection_time.unwrap().seconds, 9);
        assert_eq!(n(&outliers.max_ejection_percent), 50);
        // The timeouts travel in the metadata, for the bootstrap's header_mutation filter.
        let meta = odmesh_meta(&c);
        assert_eq!(meta[REQUEST_TIMEOUT_KEY], string_value("2000"));
        assert_eq!(meta[PER_TRY_TIMEOUT_KEY], string_value("500"));
    }

    #[test]
    fn hashing_balancers_hash_the_policys_header_and_the_others_hash_nothing() {
        let (c, options) = under_policy(
            "vips: {hello: {load_balancing: maglev, hash_header: x-user}}",
            None,
        );
        assert_eq!(c.lb_policy, LbPolicy::Maglev as i32);
        let Some(hash_policy::PolicySpecifier::Header(header)) =
            &options.hash_policy[0].policy_specifier
        else {
            panic!("a header hash policy: {:?}", options.hash_policy);
        };
        assert_eq!(header.header_name, "x-user");
        let (_, round_robin) = under_policy("", None);
        assert!(round_robin.hash_policy.is_empty());
    }

    /// One change of each policy value, away from its default.
    const POLICY_KNOBS: [&str; 20] = [
        "connect_timeout: 2s",
        "request_timeout: 1s",
        "per_try_timeout: 1s",
        "idle_timeout: 1m",
        "protocol: http2",
        "load_balancing: least_request",
        "load_balancing: maglev",
        "retries: {on: [5xx]}",
        "retries: {count: 1}",
        "retries: {backoff: {base: 1s}}",
        "retries: {backoff: {base: 25ms, max: 7s}}",
        "retries: {budget_percent: 10}",
        "circuit_breakers: {max_connections: 1}",
        "circuit_breakers: {max_pending_requests: 1}",
        "circuit_breakers: {max_requests: 1}",
        "circuit_breakers: {max_retries: 1}",
        "outlier_detection: {consecutive_5xx: 1}",
        "outlier_detection: {interval: 1s}",
        "outlier_detection: {base_ejection_time: 1s}",
        "outlier_detection: {max_ejection_percent: 1}",
    ];

    #[test]
    fn every_policy_knob_changes_the_cluster_version() {
        let hello = info("hello", Kind::Vip, vec![ep(None, "10.0.0.1", 8080)]);
        let version = |yaml: &str| {
            let policy = Policy::parse(yaml.as_bytes()).unwrap();
            build_for(
                "hello.vip",
                Lookup::Registered(&hello),
                &opts(),
                &policy,
                None,
            )
            .unwrap()
            .cluster
            .version
        };
        let base = version("");
        for knob in POLICY_KNOBS {
            let changed = version(&format!("vips: {{hello: {{{knob}}}}}"));
            assert_ne!(changed, base, "{knob} did not change the version");
        }
        assert_eq!(version("vips: {other: {retries: {count: 1}}}"), base);
        assert_ne!(
            version("vips: {hello: {load_balancing: ring_hash, hash_header: a}}"),
            version("vips: {hello: {load_balancing: ring_hash, hash_header: b}}"),
            "the hash header"
        );
    }

    #[test]
    fn a_callers_override_and_a_policy_change_change_the_cluster_version() {
        let yaml = "vips: {hello: {callers: {checkout: {circuit_breakers: {max_requests: 5}}}}}";
        let policy = Policy::parse(yaml.as_bytes()).unwrap();
        let hello = info("hello", Kind::Vip, vec![ep(None, "10.0.0.1", 8080)]);
        let lookup = Lookup::Registered(&hello);
        let version = |policy: &Policy, caller| {
            build_for("hello.vip", lookup, &opts(), policy, caller)
                .unwrap()
                .cluster
                .version
        };
        let shared = version(&policy, None);
        assert_eq!(
            shared,
            version(&Policy::default(), None),
            "no change for the others"
        );
        assert_ne!(shared, version(&policy, Some("checkout")));
        let hash = Policy::parse(b"vips: {hello: {load_balancing: maglev}}").unwrap();
        assert_ne!(shared, version(&hash, None));
    }

    #[test]
    fn without_an_upstream_ca_the_system_bundle_is_used() {
        let o = XdsOptions::new(None);
        assert!(
            SYSTEM_CA_BUNDLES
                .iter()
                .any(|p| Path::new(p) == o.upstream_ca)
        );
    }

    #[test]
    fn endpoints_are_grouped_by_zone_into_localities() {
        let hello = info(
            "hello",
            Kind::Vip,
            vec![
                ep(Some("b"), "10.0.0.3", 80),
                ep(None, "10.0.0.9", 80),
                ep(Some("a"), "10.0.0.1", 80),
                ep(Some("a"), "10.0.0.2", 81),
            ],
        );
        let cla = load_assignment("hello.vip", Lookup::Registered(&hello)).unwrap();
        assert_eq!(cla.cluster_name, "hello.vip");
        let zones: Vec<Option<&str>> = cla
            .endpoints
            .iter()
            .map(|g| g.locality.as_ref().map(|l| l.zone.as_str()))
            .collect();
        assert_eq!(zones, [None, Some("a"), Some("b")]);
        let counts: Vec<usize> = cla.endpoints.iter().map(|g| g.lb_endpoints.len()).collect();
        assert_eq!(counts, [1, 2, 1]);
        let Some(HostIdentifier::Endpoint(first)) =
            &cla.endpoints[1].lb_endpoints[1].host_identifier
        else {
            panic!("endpoint expected");
        };
        let Some(address::Address::SocketAddress(sa)) = &first.address.as_ref().unwrap().address
        else {
            panic!("socket address expected");
        };
        assert_eq!(sa.address, "10.0.0.2");
        assert_eq!(sa.port_specifier, Some(PortSpecifier::PortValue(81)));
    }

    #[test]
    fn names_that_are_not_odmesh_clusters_are_refused() {
        assert!(build("xds_cluster", Lookup::Unregistered, &opts()).is_err());
        assert!(build("Bad!.vip", Lookup::Unregistered, &opts()).is_err());
    }

    #[test]
    fn equal_inputs_give_equal_versions_however_the_metadata_map_encodes() {
        let a = build("hello.vip", Lookup::Unregistered, &opts()).unwrap();
        for _ in 0..20 {
            let b = build("hello.vip", Lookup::Unregistered, &opts()).unwrap();
            assert_eq!(a.cluster.version, b.cluster.version);
            assert_eq!(a.endpoints.version, b.endpoints.version);
        }
    }

    #[test]
    fn an_endpoint_change_changes_only_the_load_assignment_version() {
        let one = info("hello", Kind::Vip, vec![ep(None, "10.0.0.1", 80)]);
        let two = info(
            "hello",
            Kind::Vip,
            vec![ep(None, "10.0.0.1", 80), ep(None, "10.0.0.2", 80)],
        );
        let a = build("hello.vip", Lookup::Registered(&one), &opts()).unwrap();
        let b = build("hello.vip", Lookup::Registered(&two), &opts()).unwrap();
        assert_eq!(a.cluster.version, b.cluster.version);
        assert_ne!(a.endpoints.version, b.endpoints.version);
    }

    #[test]
    fn registering_a_vip_changes_both_versions_even_with_no_endpoints() {
        let empty = info("hello", Kind::Vip, vec![]);
        let before = build("hello.vip", Lookup::Unregistered, &opts()).unwrap();
        let after = build("hello.vip", Lookup::Registered(&empty), &opts()).unwrap();
        assert_ne!(before.cluster.version, after.cluster.version);
        assert_ne!(
            before.endpoints.version, after.endpoints.version,
            "the load assignment follows its cluster so a re-warming cluster gets it"
        );
    }

    #[test]
    fn the_upstream_ca_is_part_of_the_version_of_svip_clusters_only() {
        let other = XdsOptions::new(Some("/other.pem".into()));
        let a = build("hello.svip", Lookup::Unregistered, &opts()).unwrap();
        let b = build("hello.svip", Lookup::Unregistered, &other).unwrap();
        assert_ne!(a.cluster.version, b.cluster.version);
        let a = build("hello.vip", Lookup::Unregistered, &opts()).unwrap();
        let b = build("hello.vip", Lookup::Unregistered, &other).unwrap();
        assert_eq!(a.cluster.version, b.cluster.version);
    }

    #[test]
    fn resources_carry_their_type_url_and_decode_back() {
        let r = build("hello.vip", Lookup::Unregistered, &opts()).unwrap();
        assert_eq!(
            r.get(ResourceType::Cluster).resource.type_url,
            CLUSTER_TYPE_URL
        );
        assert_eq!(
            r.get(ResourceType::Endpoints).resource.type_url,
            ENDPOINTS_TYPE_URL
        );
        let c = Cluster::decode(r.cluster.resource.value.as_slice()).unwrap();
        assert_eq!(c.name, "hello.vip");
        assert_eq!(
            ResourceType::from_type_url(ENDPOINTS_TYPE_URL),
            Some(ResourceType::Endpoints)
        );
        assert_eq!(ResourceType::from_type_url("type.googleapis.com/x"), None);
    }

    /// A resource of every shape the builder makes, each one thing away from another: the
    /// endpoints (none, a port, an address, a zone, one added), the protocol, the registry's
    /// answer, the VIP, TLS (`.svip`, the CA, the SAN check), a hash header and every policy
    /// value.
    fn catalogue() -> Vec<(String, ClusterResources)> {
        let endpoint_sets = [
            vec![],
            vec![ep(Some("a"), "10.0.0.1", 8080)],
            vec![ep(Some("a"), "10.0.0.1", 8081)],
            vec![ep(Some("a"), "10.0.0.2", 8080)],
            vec![ep(Some("b"), "10.0.0.1", 8080)],
            vec![ep(None, "10.0.0.1", 8080)],
            vec![
                ep(Some("a"), "10.0.0.1", 8080),
                ep(Some("a"), "10.0.0.2", 8080),
            ],
        ];
        let no_san = XdsOptions {
            verify_upstream_san: false,
            ..opts()
        };
        let other_ca = XdsOptions::new(Some("/other.pem".into()));
        let mut out = Vec::new();
        for kind in [Kind::Vip, Kind::Svip] {
            let name = odmesh_names::cluster_name("hello", kind);
            let mut add = |what: String, lookup: Lookup<'_>, opts: &XdsOptions, yaml: &str| {
                let policy = Policy::parse(yaml.as_bytes()).unwrap();
                let built = build_for(&name, lookup, opts, &policy, None).unwrap();
                out.push((format!("{name}: {what}"), built));
            };
            for (i, endpoints) in endpoint_sets.iter().enumerate() {
                let hello = info("hello", kind, endpoints.clone());
                add(
                    format!("endpoints {i}"),
                    Lookup::Registered(&hello),
                    &opts(),
                    "",
                );
            }
            let one = info("hello", kind, endpoint_sets[1].clone());
            // HTTP/2 comes from the policy's knobs below.
            let http1 = ClusterInfo {
                protocol: Protocol::Http1,
                ..one.clone()
            };
            add("HTTP/1.1".into(), Lookup::Registered(&http1), &opts(), "");
            add("unregistered".into(), Lookup::Unregistered, &opts(), "");
            add("not yet known".into(), Lookup::NotYetKnown, &opts(), "");
            let other = info("other", kind, endpoint_sets[1].clone());
            add(
                "another VIP".into(),
                Lookup::Registered(&other),
                &opts(),
                "",
            );
            let registered = Lookup::Registered(&one);
            if kind == Kind::Svip {
                add("no SAN check".into(), registered, &no_san, "");
                add("another CA".into(), registered, &other_ca, "");
            }
            let section = format!("{}s", kind.as_str());
            for knob in POLICY_KNOBS
                .iter()
                .chain(&["load_balancing: ring_hash, hash_header: a"])
            {
                let yaml = format!("{section}: {{hello: {{{knob}}}}}");
                add(knob.to_string(), registered, &opts(), &yaml);
            }
        }
        out
    }

    #[test]
    fn versions_are_equal_exactly_when_the_resources_are() {
        let built = catalogue();
        let decoded: Vec<(Cluster, ClusterLoadAssignment)> = (built.iter())
            .map(|(_, r)| {
                let cluster = Cluster::decode(r.cluster.resource.value.as_slice()).unwrap();
                let endpoints = r.endpoints.resource.value.as_slice();
                (cluster, ClusterLoadAssignment::decode(endpoints).unwrap())
            })
            .collect();
        for (i, (what, a)) in built.iter().enumerate() {
            for (j, (other, b)) in built.iter().enumerate().skip(i + 1) {
                let same_cluster = decoded[i].0 == decoded[j].0;
                let same_endpoints = same_cluster && decoded[i].1 == decoded[j].1;
                assert!(
                    !same_endpoints,
                    "{what} and {other} build the same resources"
                );
                assert_eq!(
                    a.cluster.version == b.cluster.version,
                    same_cluster,
                    "cluster versions of {what} and {other}"
                );
                assert_ne!(
                    a.endpoints.version, b.endpoints.version,
                    "{what} and {other}"
                );
            }
        }
        // Built again, with fresh maps (each iterating in an order of its own): equal versions.
        for ((what, a), (_, b)) in built.iter().zip(catalogue()) {
            assert_eq!(a.cluster.version, b.cluster.version, "{what}");
            assert_eq!(a.endpoints.version, b.endpoints.version, "{what}");
        }
    }

    /// What this guards: stability across runs. A restarted control plane (or another
    /// replica, or a later build) must give a resource the version it had, or every
    /// reconnecting proxy is sent again all it holds; a version that came from anything but
    /// the resource's bytes (a process's random seed, `DefaultHasher`) would fail here. The
    /// values were computed from the encoding: when a change to the builder changes what
    /// this cluster is, they change too, and are to be updated with it.
    #[test]
    fn a_known_resource_has_the_same_version_in_every_process() {
        let hello = info("hello", Kind::Svip, vec![ep(Some("a"), "10.0.0.1", 8443)]);
        let built = build("hello.svip", Lookup::Registered(&hello), &opts()).unwrap();
        assert_eq!(
            (
                built.cluster.version.as_str(),
                built.endpoints.version.as_str()
            ),
            ("b886c7b90f574fda", "ade5b3c3290fc45d")
        );
    }
}
