//! Fixtures for the tests: a plain instance.

use odmesh_registry::{Instance, Protocol, Status};

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
