//! odmesh-base: what every odmesh server shares. [`listen`], [`first_request`] and
//! [`http_server`] bound what clients can make a server hold, [`html`] writes the pages people read (escaped, script-free), [`logs`] bounds what they can make it log, [`tls`] reads
//! and checks TLS identities and CA bundles, [`reload`] reads such files again when they
//! change or when asked, and [`metrics`] declares and renders the counters each crate owns. [`error`] states the errors' one rule, and prints an error with
//! its causes. `testing` (a feature) holds the tests' one bounded wait.
#![forbid(unsafe_code)]

pub mod error;
pub mod first_request;
pub mod flags;
pub mod html;
pub mod http_server;
pub mod listen;
pub mod logs;
pub mod metrics;
pub mod reload;
/// The tests' bounded waits, for other crates' tests (the `testing` feature) and this crate's.
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod tls;
