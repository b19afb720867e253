//! odmesh-control: Envoy clusters and endpoints on demand over delta xDS, from a registry.
//!
//! Layers, each using only the ones below it:
//! the registry (`odmesh-registry`: the plain model of apps and instances and the file
//! source; `odmesh-eureka`: the Eureka sources) → [`model`] (snapshot: cluster → endpoints)
//! → [`xds`] (pure: snapshot → Envoy `Cluster` / `ClusterLoadAssignment`, versioned) →
//! [`cache`] (the resources every stream shares, and who is told of a change) → [`session`]
//! (one stream's protocol without the transport: subscriptions, the delta diff, admission) →
//! [`server`] (tonic and the delta streams' framing: the xDS streams). [`prewarm`] keeps which clusters each calling service
//! used, recorded by sessions and by Envoy's load reports ([`lrs`]), so that a connecting
//! proxy is sent them ahead. [`routes`] serves each proxy its route (RDS), with the
//! policy's timeouts for its calling service ([`xds::route`]). [`admin`] and [`metrics`]
//! watch from the side; [`dashboard`] is the admin's page for people. What every odmesh
//! server shares (bounded listeners and HTTP serving, log clipping, TLS files, the metrics
//! macro) is in `odmesh-base`. docs/architecture.md follows a first request through them.
#![forbid(unsafe_code)]

pub mod admin;
pub mod cache;
pub mod dashboard;
pub mod lrs;
pub mod metrics;
pub mod model;
pub mod policy;
pub mod prewarm;
pub mod routes;
pub mod server;
pub mod session;
pub mod xds;
