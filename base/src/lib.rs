//! odmesh-base: what every odmesh server shares. [`listen`] and [`http_server`] bound what
//! clients can make a server hold, [`logs`] bounds what they can make it log, [`tls`] reads
//! and checks TLS identities and CA bundles, and [`metrics`] declares and renders the
//! counters each crate owns. [`error`] states the errors' one rule, and prints an error with
//! its causes.
#![forbid(unsafe_code)]

pub mod error;
pub mod flags;
pub mod http_server;
pub mod listen;
pub mod logs;
pub mod metrics;
pub mod tls;
