//! The whole chain as a user runs it: `odmesh-control` with a registry file (or another
//! registry [`Source`]), and Envoy started from the shipped bootstrap `envoy/odmesh.yaml`
//! with the filter.
//!
//! The bootstrap is used as shipped except for its three ports: the listener (15001) and the
//! admin (9901) bind port 0, and the xDS cluster points at the test's control plane instead
//! of 18000. Each replacement must happen exactly once, so a change to the shipped file
//! that the tests would not see fails loudly here.

use std::collections::BTreeMap;
use std::fs;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::control::{ControlPlane, Source};
use crate::envoy::Envoy;
use crate::http::{Request, Response};
use crate::paths::repo_root;
use crate::process::TestEnv;
use crate::registry::{Instance, RegistryFile};
use crate::shell::Shell;
use crate::wait::wait_until_since;

/// The egress listener's name in `envoy/odmesh.yaml`.
pub const EGRESS_LISTENER: &str = "odmesh_egress";

/// How long Envoy may take to open its xDS stream to a fresh control plane (or to one of
/// peered nodes).
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The xDS cluster's one endpoint in the shipped bootstrap: the control plane on 18000.
const XDS_ENDPOINT: &str =
    "        - endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: 18000}}}\n";

/// The shipped bootstrap of the filter shell under test (`envoy/odmesh.yaml`, or
/// `envoy/odmesh-native.yaml`: see [`Shell`]) with its listener and admin on port 0, its xDS
/// cluster on `xds_port`, and the filter at its absolute path.
pub fn odmesh_bootstrap(xds_port: u16) -> String {
    odmesh_bootstrap_replicas(&[xds_port])
}

/// [`odmesh_bootstrap`] with one endpoint of the xDS cluster (`odmesh_xds`) per control-plane
/// replica, on `xds_ports`, as a deployment with several replicas lists them.
pub fn odmesh_bootstrap_replicas(xds_ports: &[u16]) -> String {
    assert!(!xds_ports.is_empty(), "the xDS cluster needs an endpoint");
    let xds: String = (xds_ports.iter())
        .map(|port| XDS_ENDPOINT.replace("port_value: 18000", &format!("port_value: {port}")))
        .collect();
    let shell = Shell::current();
    // The wasm filter's file, or the native module's (for the route the control plane
    // serves: node metadata).
    // The wasm bootstrap loads it twice: the mapping and the limit, two plugins of one VM.
    let (key, times) = match shell {
        Shell::Wasm => ("filename", 2),
        Shell::Native => ("module", 1),
    };
    let artifact = shell.artifact();
    let file = artifact.file_name().expect("a file").to_string_lossy();
    let relative = format!("{key}: dist/{file}");
    let absolute = format!("{key}: {}", artifact.display());
    shipped_bootstrap(
        shell.bootstrap(),
        &[
            // The egress and inbound listeners, the admin, the control plane (xDS).
            ("port_value: 15001", "port_value: 0", 1),
            ("port_value: 15006", "port_value: 0", 1),
            ("port_value: 9901", "port_value: 0", 1),
            (XDS_ENDPOINT, &xds, 1),
            (&relative, &absolute, times),
        ],
    )
}

/// The shipped bootstrap `envoy/<name>` as Envoy reads it (without its comments, which name
/// the same ports and files in words), with each `(from, to, count)` of `edits` applied:
/// `from` must occur exactly `count` times, so that a changed bootstrap fails the test
/// instead of running with what it ships.
pub fn shipped_bootstrap(name: &str, edits: &[(&str, &str, usize)]) -> String {
    let path = repo_root().join("envoy").join(name);
    let shipped = fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read the bootstrap {}: {e}", path.display()));
    let mut out: String = shipped
        .lines()
        .filter(|line| !line.trim_start().starts_with('#'))
        .map(|line| format!("{line}\n"))
        .collect();
    for (from, to, count) in edits {
        let found = out.matches(from).count();
        assert_eq!(
            found,
            *count,
            "{} should say `{from}` {count} times, it does {found} times",
            path.display()
        );
        out = out.replace(from, to);
    }
    out
}

/// A control plane, and Envoy from the shipped bootstrap connected to it. Envoy is stopped
/// first, then the control plane, when dropped.
///
/// `R` is the registry the test edits: the [`RegistryFile`] of [`Mesh::start`], or `()` for
/// a [`Mesh::start_source`] whose registry lives elsewhere (Eureka).
pub struct Mesh<R = RegistryFile> {
    /// Envoy, started from `envoy/odmesh.yaml`.
    pub envoy: Envoy,
    /// The control plane.
    pub control: ControlPlane,
    /// The control plane's registry file, `registry.yaml` in the test's folder.
    pub registry: R,
}

impl Mesh<()> {
    /// Starts the control plane on `source` with `control_args` (e.g. `--lease-duration 3`),
    /// then Envoy, and waits until Envoy's xDS stream is up.
    pub fn start_source(env: &TestEnv, source: Source, control_args: &[&str]) -> Mesh<()> {
        Shell::current().artifact();
        let control = ControlPlane::start_source(env, "control", source, control_args);
        Mesh::connect(env, control, ())
    }
}

impl Mesh {
    /// Starts the control plane on a registry of `instances`, then Envoy, and waits until
    /// Envoy's xDS stream is up.
    pub fn start(env: &TestEnv, instances: &[Instance]) -> Mesh {
        Mesh::start_with(env, instances, &[])
    }

    /// [`Mesh::start`] with more arguments for `odmesh-control` (e.g. `--upstream-ca F`).
    pub fn start_with(env: &TestEnv, instances: &[Instance], control_args: &[&str]) -> Mesh {
        Shell::current().artifact();
        let registry = RegistryFile::create(&env.log_dir().join("registry.yaml"), instances);
        let control = ControlPlane::start(env, "control", registry.path(), control_args);
        Mesh::connect(env, control, registry)
    }
}

impl<R> Mesh<R> {
    /// Starts Envoy on `control` and waits until its xDS stream is up.
    fn connect(env: &TestEnv, control: ControlPlane, registry: R) -> Mesh<R> {
        let envoy = Envoy::start(env, "envoy", &odmesh_bootstrap(control.xds().port()));
        let mesh = Mesh {
            envoy,
            control,
            registry,
        };
        mesh.wait_connected(CONNECT_TIMEOUT);
        mesh
    }

    /// Waits until Envoy's ADS stream is connected (`control_plane.connected_state` 1) and
    /// the control plane sees it.
    pub fn wait_connected(&self, timeout: Duration) {
        let since = Instant::now();
        self.envoy.wait_xds_connected(true, timeout);
        wait_until_since(since, timeout, "the control plane to see Envoy", || {
            !self.control.proxies().is_empty()
        });
    }

    /// Stops Envoy and starts a new one from the same bootstrap (as a deploy or a restart of
    /// the proxy would; its log is `<label>.log`), and waits until its xDS stream is up. The
    /// new Envoy is ready (admin `/ready`) only once its first cluster answer arrived, so what
    /// the control plane sent it ahead is in it when this returns.
    pub fn restart_envoy(&mut self, env: &TestEnv, label: &str) {
        self.envoy.process().kill();
        self.envoy = Envoy::start(env, label, &odmesh_bootstrap(self.control.xds().port()));
        self.wait_connected(CONNECT_TIMEOUT);
    }

    /// The odmesh clusters (`*.vip`, `*.svip`) Envoy holds now, from its admin `/clusters`.
    pub fn envoy_clusters(&self) -> Vec<String> {
        let mut names: Vec<String> = (self.envoy.admin_get("/clusters").text().lines())
            .filter_map(|line| line.split_once("::added_via_api::"))
            .map(|(name, _)| name.to_owned())
            .filter(|name| name.ends_with(".vip") || name.ends_with(".svip"))
            .collect();
        names.sort();
        names
    }

    /// Envoy's egress listener, where services send their requests.
    pub fn egress(&self) -> SocketAddr {
        self.envoy.listener(EGRESS_LISTENER)
    }

    /// Sends `request` to the egress listener.
    pub fn send(&self, request: &Request) -> Response {
        request.send(self.egress())
    }

    /// `GET /` with `Host: host` through the egress listener.
    pub fn get(&self, host: &str) -> Response {
        self.send(&Request::get("/").host(host))
    }

    /// `GET /` with `Host: host`; asserts a 200 from an echo upstream and returns its name.
    pub fn route(&self, host: &str) -> String {
        let response = self.get(host);
        assert_eq!(
            response.status,
            200,
            "Host {host} was not routed: {}",
            response.text()
        );
        response.json()["upstream"]
            .as_str()
            .unwrap_or_else(|| panic!("not an echo answer: {}", response.text()))
            .to_owned()
    }

    /// Envoy's `cluster_manager.*` counters and gauges that count cluster discovery:
    /// `cluster_added`, `cluster_removed`, `active_clusters` and `odcds.*`.
    pub fn discovery_stats(&self) -> BTreeMap<String, u64> {
        self.envoy
            .stats()
            .into_iter()
            .filter(|(name, _)| {
                name.starts_with("cluster_manager.")
                    && (name.ends_with("cluster_added")
                        || name.ends_with("cluster_removed")
                        || name.ends_with("active_clusters")
                        || (name.starts_with("cluster_manager.odcds.update_")
                            && !name.ends_with("update_time")))
            })
            .collect()
    }

    /// One `cluster_manager.*` stat. Panics if Envoy has no such stat, so a renamed stat
    /// fails the test instead of reading as 0.
    pub fn cluster_manager_stat(&self, name: &str) -> u64 {
        self.envoy
            .stat(&format!("cluster_manager.{name}"))
            .unwrap_or_else(|| panic!("Envoy has no stat cluster_manager.{name}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_bootstrap_gets_free_ports_and_the_test_control_plane() {
        let yaml = odmesh_bootstrap(23456);
        assert!(yaml.contains("port_value: 23456"));
        assert_eq!(yaml.matches("port_value: 0").count(), 3);
        for port in ["15001", "15006", "9901", "18000"] {
            assert!(!yaml.contains(&format!("port_value: {port}")), "{port}");
        }
    }

    #[test]
    fn the_xds_cluster_lists_every_replica_as_an_endpoint() {
        let yaml = odmesh_bootstrap_replicas(&[23456, 23457, 23458]);
        // The xDS cluster's endpoints: up to the next cluster (the local service's).
        let start = yaml.find("- name: odmesh_xds").expect("the xDS cluster");
        let xds = &yaml[start..];
        let xds = &xds[..xds[1..].find("- name:").map_or(xds.len(), |end| end + 1)];
        let endpoints: Vec<&str> = (xds.lines())
            .filter(|line| line.contains("- endpoint: {address:"))
            .collect();
        assert_eq!(endpoints.len(), 3, "{endpoints:?}");
        for (line, port) in endpoints.iter().zip([23456, 23457, 23458]) {
            assert_eq!(
                format!("{line}\n"),
                XDS_ENDPOINT.replace("18000", &port.to_string())
            );
        }
    }
}
