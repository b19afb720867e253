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
use std::sync::Arc;
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

pub mod inbound;
pub mod leds;
mod name;
pub mod route;
mod version;

pub use name::ResourceName;

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

    /// The type's place in [`ResourceType::ALL`], for per-type arrays.
    pub const fn index(self) -> usize {
        match self {
            ResourceType::Cluster => 0,
            ResourceType::Endpoints => 1,
        }
    }

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
    /// VIPs with at least so many endpoints send them one by one ([`leds`]); 0: never.
    pub leds_min_endpoints: usize,
}

/// The default of [`XdsOptions::leds_min_endpoints`] (`--leds-min-endpoints`): see
/// docs/envoy.md, "Large VIPs: endpoints one by one", for what it trades.
pub const LEDS_MIN_ENDPOINTS: usize = 256;

impl XdsOptions {
    /// The options a VIP split already is rebuilt with: it stays split down to three quarters
    /// of [`XdsOptions::leds_min_endpoints`]. A VIP whose size hovers at the threshold would
    /// otherwise go whole and split again with every instance that comes and goes, and each
    /// split sends every proxy all its members again.
    pub fn staying_split(&self) -> XdsOptions {
        let min = self.leds_min_endpoints;
        XdsOptions {
            leds_min_endpoints: min - min / 4,
            ..self.clone()
        }
    }
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
            leds_min_endpoints: LEDS_MIN_ENDPOINTS,
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
    pub version: Arc<str>,
    pub resource: Any,
    /// Whether the registry lists the cluster (a resource for an unregistered name is a
    /// cluster without endpoints).
    pub registered: bool,
    /// A large VIP's load assignment, its endpoints apart (see [`leds`]); `resource` is then
    /// the assignment as [`Versioned::to_resource_on`] fills it in per stream.
    pub leds: Option<Arc<leds::Leds>>,
}

impl Versioned {
    /// The resource as it goes out on stream `stream` (which only a large VIP's load
    /// assignment depends on, see [`leds`]).
    pub fn to_resource_on(&self, stream: u64) -> Resource {
        match &self.leds {
            Some(leds) => leds.resource(&self.name, &self.version, stream),
            None => self.to_resource(),
        }
    }

    /// The resource as it goes out in a `DeltaDiscoveryResponse`.
    pub fn to_resource(&self) -> Resource {
        Resource {
            name: self.name.clone(),
            version: self.version.to_string(),
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
    let (vip, kind) = parse_cluster_name(name)?;
    Ok(Target::new(name, vip, kind, lookup, policy, caller).resources(opts))
}

/// [`build_for`] of a name parsed already; `None` if it is not an odmesh cluster name.
pub fn build_named(
    name: &ResourceName,
    lookup: Lookup<'_>,
    opts: &XdsOptions,
    policy: &Policy,
    caller: Option<&str>,
) -> Option<ClusterResources> {
    let (vip, kind) = name.cluster()?;
    Some(Target::new(name.as_str(), vip, kind, lookup, policy, caller).resources(opts))
}

/// The `Cluster` for `name` with odmesh's default policy; see the module docs.
pub fn cluster(
    name: &str,
    lookup: Lookup<'_>,
    opts: &XdsOptions,
) -> Result<Cluster, InvalidClusterName> {
    Ok(Target::parse(name, lookup, &Policy::default(), None)?.cluster(opts))
}

/// The policy `name` gets under `policy` for `caller`, with where each value came from.
pub fn effective_policy(
    name: &str,
    lookup: Lookup<'_>,
    policy: &Policy,
    caller: Option<&str>,
) -> Result<Effective, InvalidClusterName> {
    Ok(Target::parse(name, lookup, policy, caller)?.policy)
}

/// The `ClusterLoadAssignment` for `name`: UP endpoints grouped by zone (empty when unknown).
pub fn load_assignment(
    name: &str,
    lookup: Lookup<'_>,
) -> Result<ClusterLoadAssignment, InvalidClusterName> {
    Ok(Target::parse(name, lookup, &Policy::default(), None)?.load_assignment())
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
    /// The target of cluster `name`, which must be `<vip>` of `kind`.
    fn new(
        name: &'a str,
        vip: &'a str,
        kind: Kind,
        lookup: Lookup<'a>,
        policy: &Policy,
        caller: Option<&str>,
    ) -> Target<'a> {
        let (vip, state, endpoints, declared): (&str, _, &[Endpoint], _) = match lookup {
            Lookup::Registered(info) => {
                (&info.vip, State::Registered, &info.endpoints, info.protocol)
            }
            Lookup::Unregistered => (vip, State::Unregistered, &[], Protocol::Auto),
            Lookup::NotYetKnown => (vip, State::NotYetKnown, &[], Protocol::Auto),
        };
        Target {
            name,
            vip,
            kind,
            state,
            endpoints,
            policy: policy.resolve(kind, vip, caller, declared),
        }
    }

    /// [`Target::new`] of a name not parsed yet.
    fn parse(
        name: &'a str,
        lookup: Lookup<'a>,
        policy: &Policy,
        caller: Option<&str>,
    ) -> Result<Target<'a>, InvalidClusterName> {
        let (vip, kind) = parse_cluster_name(name)?;
        Ok(Target::new(name, vip, kind, lookup, policy, caller))
    }

    /// Both resources, versioned.
    fn resources(&self, opts: &XdsOptions) -> ClusterResources {
        let cluster = self.cluster(opts);
        let cluster_resource = any(CLUSTER_TYPE_URL, &cluster);
        let cluster_version = version::cluster(cluster);
        let assignment = self.load_assignment();
        let registered = self.state == State::Registered;
        let whole_resource = any(ENDPOINTS_TYPE_URL, &assignment);
        let whole = Versioned {
            name: self.name.to_owned(),
            version: hex(version::load_assignment(
                cluster_version,
                &whole_resource.value,
            )),
            resource: whole_resource,
            registered,
            leds: None,
        };
        let min = opts.leds_min_endpoints;
        let leds = match min > 0 && self.endpoints.len() >= min {
            true => leds::Leds::split(assignment, whole.clone()),
            false => None,
        };
        // A split assignment is versioned by what stays in it: a change of endpoints alone
        // goes to the collections.
        let endpoints = match leds {
            Some(leds) => Versioned {
                resource: any(ENDPOINTS_TYPE_URL, &leds.assignment("0")),
                version: hex(version::load_assignment(
                    cluster_version,
                    &leds.template_bytes(),
                )),
                leds: Some(Arc::new(leds)),
                ..whole
            },
            None => whole,
        };
        ClusterResources {
            cluster: Versioned {
                name: self.name.to_owned(),
                version: hex(cluster_version),
                resource: cluster_resource,
                registered,
                leds: None,
            },
            endpoints,
        }
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

/// A version as it goes on the wire.
fn hex(version: u64) -> Arc<str> {
    format!("{version:016x}").into()
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
mod tests;
