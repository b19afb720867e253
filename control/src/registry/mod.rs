//! Eureka's JSON wire format, the Eureka client source and the embedded Eureka registry, over
//! the plain model of `odmesh-registry` (re-exported here for them).

pub use odmesh_registry::*;

pub mod eureka;
pub mod eureka_client;
pub mod eureka_server;

/// Fixtures for the tests: the files under `control/testdata/`, the TLS ones under
/// `base/testdata/tls/`, and a plain instance.
#[cfg(test)]
pub(crate) mod testdata {
    use std::path::PathBuf;

    use super::{Instance, Protocol, Status};

    /// An UP instance `id` of app `VIP` (the VIP upper-cased) serving `vip` on `ip:8080`.
    pub(crate) fn instance(vip: &str, id: &str, ip: &str) -> Instance {
        Instance {
            app: vip.to_ascii_uppercase(),
            instance_id: id.into(),
            ip: ip.parse().expect("an IP address"),
            port: Some(8080),
            secure_port: None,
            vips: vec![vip.into()],
            svips: Vec::new(),
            status: Status::Up,
            zone: None,
            protocol: Protocol::Auto,
        }
    }

    /// The path of fixture `name`.
    pub(crate) fn path(name: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("testdata")
            .join(name)
    }

    /// The path of TLS fixture `name`: the test certificates live with the TLS code, in
    /// `base/testdata/tls/`.
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
}
