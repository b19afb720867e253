//! The odmesh filter's pure core: the plugin configuration ([`config`]) and the mapping of a
//! request's Host to the Envoy cluster `<vip>.vip` or `<svip>.svip` ([`mapping`]), down to
//! the whole per-request decision ([`mapping::decide`]).
//!
//! Nothing here knows which shell runs it: the proxy-wasm module (`filter/wasm`) and the
//! native Envoy dynamic module (`filter/native`) each read the headers, call
//! [`mapping::decide`] and write its verdict.
#![forbid(unsafe_code)]

pub mod config;
pub mod limiter;
pub mod mapping;
