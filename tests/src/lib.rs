//! Test harness for odmesh's end-to-end tests: real Envoy (and later the control plane) as
//! child processes, a raw HTTP/1.1 client, an echo upstream, bounded waits.
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
#![forbid(unsafe_code)]

pub mod echo;
pub mod envoy;
pub mod http;
pub mod paths;
pub mod process;
pub mod wait;

pub use echo::EchoUpstream;
pub use envoy::{Envoy, render};
pub use http::{Request, Response};
pub use paths::{envoy_binary, filter_wasm, free_port, repo_root};
pub use process::{ChildGuard, TestEnv};
pub use wait::{wait_for, wait_until};
