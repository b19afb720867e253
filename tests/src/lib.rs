//! Test harness for odmesh's end-to-end tests: real Envoy and the control plane as child
//! processes ([`Mesh`] runs both from the shipped bootstrap), registry files, a raw HTTP/1.1
//! client, echo and TLS upstreams, upstreams and clients of every protocol
//! ([`protocols`]: gRPC, h2c, TLS with ALPN, WebSocket), a headless browser for the pages
//! people read ([`Chromium`]), bounded waits.
//!
//! A test starts with a [`TestEnv`], which owns the test's log folder (`tests/logs/<name>/`)
//! and prints where it is, with the tail of each log, when the test fails:
//!
//! ```no_run
//! use odmesh_e2e::{EchoUpstream, Envoy, Request, TestEnv, render};
//!
//! let env = TestEnv::new("a_plain_host_reaches_its_vip_cluster");
//! let upstream = EchoUpstream::start("hello.vip");
//! let port = upstream.port().to_string();
//! let bootstrap = render("...${VIP_PORT}...", &[("VIP_PORT", &port)]);
//! let envoy = Envoy::start(&env, "envoy", &bootstrap);
//! let response = Request::get("/").host("hello").send(envoy.listener("egress"));
//! assert_eq!(response.status, 200);
//! assert_eq!(response.json()["upstream"], "hello.vip");
//! ```
//!
//! ## Chaos tests
//!
//! A chaos test breaks something while traffic flows and counts what every request got.
//! It starts a [`Load`] on the egress listener (N requests per second over some Hosts,
//! bounded in flight, each with a timeout), [`Load::mark`]s each thing it does ("killed the
//! control plane"), waits with bounded polls for what must follow and, while the fault is
//! in place, for requests through it ([`Load::wait_completed`]), and ends with
//! [`Load::stop`]: the [`LoadReport`] says what each Host got, places every failure after
//! the last mark, and asserts that no request failed ([`LoadReport::assert_no_failures`])
//! and that none was held ([`LoadReport::assert_answered_within`], a bound far above what
//! the mesh takes). What the load itself missed on a busy machine (ticks not sent, pauses)
//! the report shows and no assertion fails on. The breakage comes from the
//! pieces: [`ControlPlane::kill`] and `restart`, a [`RegistryFile`] rewrite, an
//! [`EchoUpstream`] stopped, a [`FakeEureka`] switched to down, hanging, garbage or empty
//! ([`FakeEureka::set_mode`]), an [`XdsFlood`] subscribing a million names, or a node of a
//! [`PeeredMesh`] killed or cut off from its peers by a blocked [`TcpProxy`]; an
//! [`RssSampler`] on Envoy and the control plane ([`ChildGuard::rss_bytes`] for one reading)
//! says whether memory stayed bounded. `tests/tests/drain.rs` is a whole example.
//!
//! ## Real Eureka
//!
//! Beside odmesh's own registry, tests run the real thing: [`JavaEureka`] is a Spring Cloud
//! Netflix Eureka server (one node, peers, basic auth), and [`ClientDriver`] runs real Eureka
//! clients: npm's and PyPI's, and a Spring Boot service on Spring Cloud's Eureka client with
//! either transport ([`EurekaClient::Java`], [`EurekaClient::JavaJersey`]), which also reports
//! what its cache holds ([`ClientDriver::fetch`]) and how it fetched it
//! ([`ClientDriver::fetches`]). `eureka/tests/eureka_java.rs` shows them.
#![forbid(unsafe_code)]

pub mod browser;
pub mod congested;
pub mod control;
pub mod echo;
pub mod envoy;
pub mod eureka;
pub mod fake_eureka;
pub mod http;
pub mod java;
pub mod load;
pub mod memory;
pub mod mesh;
pub mod paths;
pub mod peers;
pub mod process;
pub mod protocols;
pub mod registry;
mod serve;
pub mod shell;
pub mod tcp_proxy;
pub mod tls;
pub mod wait;
pub mod xds_flood;

pub use browser::Chromium;
pub use congested::CongestedUpstream;
pub use control::{ControlPlane, EUREKA_INTERVAL, Source};
pub use echo::EchoUpstream;
pub use envoy::{Envoy, render};
pub use eureka::{
    Cached, ClientDriver, EurekaApi, EurekaClient, Fetched, Fetches, Listed, Registration,
    listed_instances,
};
pub use fake_eureka::{FakeEureka, Garbage, Mode};
pub use http::{Connection, Request, Response, exchange_on};
pub use java::{JVM_START_TIMEOUT, JavaEureka, JavaEurekaBuilder};
pub use load::{Load, LoadConfig, LoadReport, MAX_LATENCY, Outcome};
pub use memory::{Rss, RssReport, RssSampler, mib, rss_of};
pub use mesh::{Mesh, odmesh_bootstrap, odmesh_bootstrap_replicas, shipped_bootstrap};
pub use paths::{control_binary, envoy_binary, free_port, repo_root};
pub use peers::{Node, PeeredMesh, eureka_url, reserve_addrs, wait_converged};
pub use process::{ChildGuard, TestEnv};
pub use protocols::{
    GrpcUpstream, H2Response, HttpUpstream, Versions, WebSocketClient, block_on_within, grpc_call,
    h2c_get, runtime,
};
pub use registry::{Instance, RegistryFile};
pub use shell::Shell;
pub use tcp_proxy::TcpProxy;
pub use tls::{CertifiedKey, TestCa, TlsClient, TlsUpstream};
pub use wait::{
    CHANGE_DEADLINE, hold_for, timed, wait_for, wait_ok, wait_ok_every, wait_until,
    wait_until_since,
};
pub use xds_flood::{FloodOptions, FloodStats, XdsFlood};

/// Locks `mutex`, also after a thread panicked holding it (a test's panic must not turn
/// into another one in the harness's threads).
pub(crate) fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The message `f` panicked with, for the harness's own tests; panics if `f` returned.
#[cfg(test)]
pub(crate) fn panic_message<R>(f: impl FnOnce() -> R) -> String {
    let Err(payload) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) else {
        panic!("it returned: it must panic");
    };
    (payload.downcast_ref::<String>().cloned())
        .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_default()
}
