//! odmesh-base: what every odmesh server shares. [`listen`] and [`http_server`] bound what
//! clients can make a server hold, [`logs`] bounds what they can make it log, [`tls`] reads
//! and checks TLS identities and CA bundles, and [`metrics`] declares and renders the
//! counters each crate owns.
#![forbid(unsafe_code)]

pub mod flags;
pub mod http_server;
pub mod listen;
pub mod logs;
pub mod metrics;
pub mod tls;
