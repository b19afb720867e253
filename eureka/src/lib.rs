//! odmesh-eureka: Eureka's protocol, for the registry. Its wire forms ([`wire`]: the JSON
//! that servers and clients exchange, the XML some clients read), the Eureka client source
//! that follows Eureka servers ([`client`]), and the embedded Eureka-compatible registry that
//! clients register with ([`server`]). Both sources produce the plain model of
//! `odmesh-registry`, and count in its `RegistryMetrics` and in their own ([`ClientMetrics`],
//! [`ServerMetrics`]).
#![forbid(unsafe_code)]

pub mod client;
mod metrics;
pub mod server;
pub mod wire;

pub use metrics::{ClientMetrics, ServerMetrics};

/// Fixtures for the tests: the files under `eureka/testdata/`, the test certificates, which
/// live with the TLS code in `base/testdata/tls/`, and reading a counter.
#[cfg(test)]
pub(crate) mod testdata {
    use std::path::PathBuf;

    /// The path of fixture `name`.
    pub(crate) fn path(name: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("testdata")
            .join(name)
    }

    /// The path of TLS fixture `name`.
    pub(crate) fn tls(name: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../base/testdata/tls")
            .join(name)
    }

    /// The bytes of fixture `name`; panics naming the file if it cannot be read.
    pub(crate) fn read(name: &str) -> Vec<u8> {
        let path = path(name);
        std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    /// A counter's value.
    pub(crate) fn count(metric: &std::sync::atomic::AtomicU64) -> u64 {
        metric.load(std::sync::atomic::Ordering::Relaxed)
    }
}
