//! Large VIPs' endpoints one by one (LEDS): pure naming, splitting and diffing.
//!
//! A whole `ClusterLoadAssignment` is one delta-xDS resource, so one instance's change in a VIP
//! of 1,000 resends all 1,000 endpoints to every subscribed proxy (23 KB each). For a VIP with
//! at least `--leds-min-endpoints` endpoints, odmesh instead sends a load assignment whose
//! localities name an `LbEndpoint` glob collection (`leds_cluster_locality_config`); Envoy
//! subscribes to each glob on the same delta ADS stream, and each endpoint is a resource of
//! its own: a change costs the endpoints that changed (docs/envoy.md, "Large VIPs: endpoints
//! one by one").
//!
//! The collection's name carries a generation: the stream's epoch, new on every stream, and a
//! tag of the assignment's version. Envoy re-subscribes a glob after a reconnect without
//! saying which members it holds, so a server could not remove the ones that went away
//! meanwhile: a new epoch makes the load assignment a new resource for that stream (its
//! version carries the epoch), and Envoy swaps the old collection for the new one, keeping its
//! hosts until the new one's first answer. And a changed cluster (a policy edit) is a new
//! cluster in Envoy, whose collections must be new names: Envoy sends no subscribe for a glob
//! the old cluster still watches, and the new one would never be answered.

use std::sync::{Arc, OnceLock};

use envoy_types::pb::envoy::config::core::v3::{
    AggregatedConfigSource, ApiVersion, ConfigSource, config_source::ConfigSourceSpecifier,
};
use envoy_types::pb::envoy::config::endpoint::v3::{
    ClusterLoadAssignment, LbEndpoint, LedsClusterLocalityConfig, lb_endpoint::HostIdentifier,
    locality_lb_endpoints::LbConfig,
};
use envoy_types::pb::envoy::service::discovery::v3::Resource;
use envoy_types::pb::google::protobuf::Any;
use prost::Message;

use super::{ENDPOINTS_TYPE_URL, Versioned, any, duration, version};

/// The type of one endpoint of a collection.
pub const LB_ENDPOINT_TYPE_URL: &str = "type.googleapis.com/envoy.config.endpoint.v3.LbEndpoint";

/// Every collection's name starts so: Envoy 1.40 takes only `xdstp://` glob collections, and
/// checks that the type in the name is the resource's.
const PREFIX: &str = "xdstp://odmesh/envoy.config.endpoint.v3.LbEndpoint/";

/// How long Envoy waits for a collection's first answer: for ever (0). On a timeout Envoy
/// installs the collection empty, which for a cluster being replaced (a reconnect, a policy
/// edit) takes a working cluster's hosts away; odmesh answers every collection it names at
/// once, and until then Envoy keeps the hosts it has.
const INITIAL_FETCH_TIMEOUT: std::time::Duration = std::time::Duration::ZERO;

/// Characters of the assignment's version in a collection's generation.
const TAG: usize = 8;

/// Different in every process, so that two control planes (a restart, another replica) never
/// name a collection alike.
fn process_epoch() -> u64 {
    static EPOCH: OnceLock<u64> = OnceLock::new();
    *EPOCH.get_or_init(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        nanos ^ (u64::from(std::process::id()) << 40)
    })
}

/// The epoch of stream `stream` in this process: new on every stream.
pub fn epoch(stream: u64) -> String {
    format!("{:x}.{stream}", process_epoch())
}

/// The generation of the collections of an assignment of version `version` on the stream with
/// `epoch`: what names them there.
pub fn generation(epoch: &str, version: &str) -> String {
    let tag = version.get(..TAG).unwrap_or(version);
    format!("{epoch}.{tag}")
}

/// One endpoint of a collection, ready for the wire but for its name.
#[derive(Clone, Debug, PartialEq)]
pub struct Member {
    /// The endpoint's own part of its name: `<ip>_<port>`, with `:` as `-` (only
    /// `[A-Za-z0-9._-]` goes into a name, so that Envoy's normalised form is the same bytes).
    pub id: Box<str>,
    pub version: u64,
    /// The encoded `LbEndpoint`.
    pub body: Vec<u8>,
}

/// A large VIP's load assignment, split: the assignment without its endpoints, and each
/// locality's endpoints, sorted by id.
#[derive(Clone, Debug, PartialEq)]
pub struct Leds {
    /// The load assignment with its localities' endpoints taken out; the collection names are
    /// filled in per stream ([`Leds::assignment`]).
    template: ClusterLoadAssignment,
    pub localities: Vec<Vec<Member>>,
    /// The whole load assignment, versioned by all of it, for a stream that cannot take
    /// collections (a standalone EDS stream: Envoy takes collections only over ADS).
    pub whole: Arc<Versioned>,
}

/// A collection name read: its cluster, generation and locality.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Glob<'a> {
    pub cluster: &'a str,
    pub epoch: &'a str,
    pub locality: usize,
}

/// The glob collection of `cluster`'s locality `locality` in `generation` (see
/// [`generation`]).
pub fn collection(cluster: &str, generation: &str, locality: usize) -> String {
    format!("{PREFIX}{cluster}/{generation}/{locality}/*")
}

/// The name of member `id` in the collection [`collection`] names.
pub fn member_name(cluster: &str, generation: &str, locality: usize, id: &str) -> String {
    format!("{PREFIX}{cluster}/{generation}/{locality}/{id}")
}

/// Whether `name` is in odmesh's collection namespace (read or not).
pub fn is_collection_name(name: &str) -> bool {
    name.starts_with(PREFIX)
}

/// Reads a glob collection name of odmesh's; `None` for anything else. (Only the name
/// [`collection`] writes is served: see `session::leds`.)
pub fn parse_glob(name: &str) -> Option<Glob<'_>> {
    let rest = name.strip_prefix(PREFIX)?.strip_suffix("/*")?;
    let (rest, locality) = rest.rsplit_once('/')?;
    let (cluster, epoch) = rest.rsplit_once('/')?;
    let plain = |s: &str| !s.is_empty() && !s.contains('/');
    let locality = locality.parse().ok().filter(|_| plain(locality))?;
    (plain(cluster) && plain(epoch)).then_some(Glob {
        cluster,
        epoch,
        locality,
    })
}

impl Leds {
    /// Splits `cla`; `None` if some locality has no endpoint (Envoy warms a cluster only once
    /// every collection has answered, and an empty answer never reaches a glob: such a VIP
    /// keeps its whole load assignment).
    pub fn split(mut cla: ClusterLoadAssignment, whole: Versioned) -> Option<Leds> {
        let mut localities = Vec::with_capacity(cla.endpoints.len());
        for locality in &mut cla.endpoints {
            let mut members: Vec<Member> = (std::mem::take(&mut locality.lb_endpoints).iter())
                .filter_map(member)
                .collect();
            members.sort_by(|a, b| a.id.cmp(&b.id));
            // Two instances on one address are one host to Envoy.
            members.dedup_by(|a, b| a.id == b.id);
            if members.is_empty() {
                return None;
            }
            localities.push(members);
        }
        (!localities.is_empty()).then_some(Leds {
            template: cla,
            localities,
            whole: Arc::new(whole),
        })
    }

    /// The load assignment with its localities naming their collections in `generation`.
    pub fn assignment(&self, generation: &str) -> ClusterLoadAssignment {
        let mut cla = self.template.clone();
        let cluster = cla.cluster_name.clone();
        for (i, locality) in cla.endpoints.iter_mut().enumerate() {
            locality.lb_config = Some(LbConfig::LedsClusterLocalityConfig(
                LedsClusterLocalityConfig {
                    leds_config: Some(ConfigSource {
                        config_source_specifier: Some(ConfigSourceSpecifier::Ads(
                            AggregatedConfigSource {},
                        )),
                        resource_api_version: ApiVersion::V3 as i32,
                        initial_fetch_timeout: Some(duration(INITIAL_FETCH_TIMEOUT)),
                        ..Default::default()
                    }),
                    leds_collection_name: collection(&cluster, generation, i),
                },
            ));
        }
        cla
    }

    /// The stream-independent content that versions the assignment: the template (a change of
    /// endpoints within the localities leaves it as it is).
    pub fn template_bytes(&self) -> Vec<u8> {
        self.template.encode_to_vec()
    }

    /// The assignment of version `version` (the cache's) as it goes out on stream `stream`:
    /// its version carries the stream's epoch, so a proxy that kept it from another stream
    /// gets it again.
    pub fn resource(&self, name: &str, version: &str, stream: u64) -> Resource {
        let epoch = epoch(stream);
        Resource {
            name: name.to_owned(),
            version: format!("{version}.{epoch}"),
            resource: Some(any(
                ENDPOINTS_TYPE_URL,
                &self.assignment(&generation(&epoch, version)),
            )),
            ..Default::default()
        }
    }
}

/// `ep` as a member; `None` without a socket address (odmesh builds none such).
fn member(ep: &LbEndpoint) -> Option<Member> {
    use envoy_types::pb::envoy::config::core::v3::{address, socket_address::PortSpecifier};
    let Some(HostIdentifier::Endpoint(endpoint)) = &ep.host_identifier else {
        return None;
    };
    let Some(address::Address::SocketAddress(sa)) = endpoint.address.as_ref()?.address.as_ref()
    else {
        return None;
    };
    let Some(PortSpecifier::PortValue(port)) = sa.port_specifier else {
        return None;
    };
    let body = ep.encode_to_vec();
    Some(Member {
        id: format!("{}_{port}", sa.address.replace(':', "-")).into(),
        version: version::encoded(&body),
        body,
    })
}

/// What a collection's subscriber must be sent to go from `old` to `new` (both sorted by id):
/// the members new or changed, and the ids gone.
pub fn diff<'a>(old: &'a [Member], new: &'a [Member]) -> (Vec<&'a Member>, Vec<&'a str>) {
    let (mut send, mut gone) = (Vec::new(), Vec::new());
    let (mut i, mut j) = (0, 0);
    while i < old.len() || j < new.len() {
        match (old.get(i), new.get(j)) {
            (Some(o), Some(n)) if o.id == n.id => {
                if o.version != n.version {
                    send.push(n);
                }
                i += 1;
                j += 1;
            }
            (Some(o), Some(n)) if o.id < n.id => {
                gone.push(&*o.id);
                i += 1;
            }
            (Some(o), None) => {
                gone.push(&*o.id);
                i += 1;
            }
            (_, Some(n)) => {
                send.push(n);
                j += 1;
            }
            (None, None) => break,
        }
    }
    (send, gone)
}

/// Member `m` of `glob` as it goes out.
pub fn member_resource(glob: &Glob<'_>, m: &Member) -> Resource {
    Resource {
        name: member_name(glob.cluster, glob.epoch, glob.locality, &m.id),
        version: format!("{:016x}", m.version),
        resource: Some(Any {
            type_url: LB_ENDPOINT_TYPE_URL.to_owned(),
            value: m.body.clone(),
        }),
        ..Default::default()
    }
}

/// The locality `i` of `leds`, empty if it has no such locality (any more).
pub fn locality(leds: Option<&Arc<Leds>>, i: usize) -> &[Member] {
    leds.and_then(|l| l.localities.get(i))
        .map_or(&[], Vec::as_slice)
}

/// The cluster a member or glob name of odmesh's belongs to.
pub fn cluster_of(name: &str) -> Option<&str> {
    let cluster = name.strip_prefix(PREFIX)?.split('/').next()?;
    (!cluster.is_empty()).then_some(cluster)
}

/// The collections a load assignment names instead of endpoints, as a proxy subscribes them.
pub fn collections_in(cla: &ClusterLoadAssignment) -> Vec<String> {
    (cla.endpoints.iter())
        .filter_map(|l| match &l.lb_config {
            Some(LbConfig::LedsClusterLocalityConfig(c)) => Some(c.leds_collection_name.clone()),
            _ => None,
        })
        .collect()
}
