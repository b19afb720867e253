//! The odmesh proxy-wasm HTTP filter: maps a request's Host to the Envoy cluster
//! `<vip>.vip` or `<svip>.svip` and writes it into the header the route's `cluster_header`
//! reads.
//!
//! The decisions are plain functions with native tests ([`config`], [`mapping`], and
//! [`contexts`]: which plugin a request belongs to); the glue below only reads headers, calls
//! them and writes the result:
//!
//! - the root context parses the plugin configuration once, in `on_configure`, and refuses a
//!   bad one (Envoy then refuses the filter), and defines the filter's counters;
//! - per request, the filter does one read of the destination header, one mapping, one write
//!   of the cluster header (always overwritten, so a client cannot pick a cluster) and removes
//!   the secure header; an invalid host gets a local 400 whose body says what was wrong.
//!
//! The glue speaks the proxy-wasm ABI itself, without an SDK, so that the module exports only
//! the callbacks the filter uses: Envoy enters the wasm VM for every exported callback of
//! every request (`abi` lists what is exported and why). `abi` is the one module allowed
//! `unsafe` code.
#![deny(unsafe_code, clippy::undocumented_unsafe_blocks)]

pub mod config;
pub mod contexts;
pub mod mapping;

// The glue needs the proxy-wasm host, so it is built for the wasm target only; unit tests
// (native and wasm) exercise the pure modules above.
#[cfg(all(target_arch = "wasm32", not(test)))]
#[allow(unsafe_code)]
mod abi;
#[cfg(all(target_arch = "wasm32", not(test)))]
mod glue;
