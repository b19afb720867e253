//! The odmesh mapping as a native Envoy dynamic module (`dist/libodmesh_filter.so`), run while
//! Envoy resolves the route (`envoy.router.cluster_specifier_plugin.dynamic_modules`): no HTTP
//! filter, no second route resolution. The same mapping as the wasm filter
//! (`odmesh_filter::mapping::decide`), the same JSON configuration (the specifier's
//! `specifier_config`), the same answers (docs/envoy.md, "The native module").
//!
//! [`shell`] is the specifier, on two small traits; [`limit`] is the per-destination
//! concurrency limit, an HTTP filter the route switches on for the VIPs that have one; [`abi`]
//! binds Envoy 1.40's C ABI to both and is the only module with `unsafe` code. It is left out of the unit tests, which run the
//! shell on a recording fake instead of Envoy.
#![deny(unsafe_code, clippy::undocumented_unsafe_blocks)]

#[cfg(not(test))]
#[allow(unsafe_code)]
mod abi;
pub mod limit;
pub mod shell;
