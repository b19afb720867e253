//! Replicated embedded registries: N `odmesh-control --serve-eureka ADDR --peer URL ...`
//! nodes, each also serving xDS, and one Envoy whose xDS cluster lists them all.
//!
//! Each node must know its peers' URLs before it starts, so their Eureka addresses are
//! reserved first ([`reserve_addrs`]); a test that cuts links puts a [`TcpProxy`] on each
//! and gives the nodes the proxies' URLs instead ([`Node::peer`]).
//!
//! [`TcpProxy`]: crate::tcp_proxy::TcpProxy

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::control::{ControlPlane, Source};
use crate::envoy::Envoy;
use crate::eureka::{EurekaApi, Listed};
use crate::mesh::{CONNECT_TIMEOUT, EGRESS_LISTENER, odmesh_bootstrap_replicas};
use crate::process::TestEnv;
use crate::shell::Shell;
use crate::wait::{timed, wait_ok, wait_until_since};

/// `n` loopback addresses on ports that were free a moment ago, all distinct
/// ([`crate::paths::reserve_ports`]).
pub fn reserve_addrs(n: usize) -> Vec<SocketAddr> {
    (crate::paths::reserve_ports(n).into_iter())
        .map(|port| SocketAddr::from((Ipv4Addr::LOCALHOST, port)))
        .collect()
}

/// The Eureka service URL of a registry at `addr`, as `--peer` and clients take it.
pub fn eureka_url(addr: SocketAddr) -> String {
    format!("http://{addr}/eureka")
}

/// One node to start: its label (its log is `<label>.log`), the address its embedded
/// registry binds, and the URLs of its peers.
#[derive(Clone, Debug)]
pub struct Node {
    /// Its label.
    pub label: String,
    /// Where its embedded registry listens.
    pub addr: SocketAddr,
    /// Its `--peer` URLs.
    pub peers: Vec<String>,
}

impl Node {
    /// A node at `addr` with no peers yet.
    pub fn new(label: &str, addr: SocketAddr) -> Node {
        Node {
            label: label.to_owned(),
            addr,
            peers: Vec::new(),
        }
    }

    /// Adds a `--peer URL`.
    pub fn peer(mut self, url: &str) -> Node {
        self.peers.push(url.to_owned());
        self
    }
}

/// Peered control planes, and Envoy from the shipped bootstrap connected to one of them.
/// Envoy is stopped first, then the nodes, when dropped.
pub struct PeeredMesh {
    /// Envoy, its xDS cluster listing every node.
    pub envoy: Envoy,
    /// The nodes, in the order given.
    pub nodes: Vec<ControlPlane>,
}

impl PeeredMesh {
    /// Starts `n` nodes (labels `node-1`...), each given every node's URL as a peer (its
    /// own too: a node skips the URL of its own address), each with `control_args`; then
    /// Envoy.
    pub fn start(env: &TestEnv, n: usize, control_args: &[&str]) -> PeeredMesh {
        let addrs = reserve_addrs(n);
        let nodes: Vec<Node> = (addrs.iter().enumerate())
            .map(|(i, addr)| {
                (addrs.iter()).fold(Node::new(&format!("node-{}", i + 1), *addr), |node, a| {
                    node.peer(&eureka_url(*a))
                })
            })
            .collect();
        PeeredMesh::start_nodes(env, &nodes, control_args)
    }

    /// Starts `nodes`, in order, each with `control_args`; then Envoy, and waits until its
    /// xDS stream is up and one node sees it.
    pub fn start_nodes(env: &TestEnv, nodes: &[Node], control_args: &[&str]) -> PeeredMesh {
        Shell::current().artifact();
        let nodes: Vec<ControlPlane> = nodes
            .iter()
            .map(|node| {
                let source = Source::Peer {
                    addr: node.addr,
                    peers: node.peers.clone(),
                };
                ControlPlane::start_source(env, &node.label, source, control_args)
            })
            .collect();
        let ports: Vec<u16> = nodes.iter().map(|n| n.xds().port()).collect();
        let envoy = Envoy::start(env, "envoy", &odmesh_bootstrap_replicas(&ports));
        let mesh = PeeredMesh { envoy, nodes };
        let since = Instant::now();
        mesh.envoy.wait_xds_connected(true, CONNECT_TIMEOUT);
        wait_until_since(since, CONNECT_TIMEOUT, "a node to see Envoy", || {
            mesh.connected_node().is_some()
        });
        mesh
    }

    /// The node whose xDS server holds Envoy's stream now, if one does (a killed node is
    /// not asked).
    pub fn connected_node(&self) -> Option<usize> {
        self.nodes.iter().position(|node| {
            let Some(answer) = node.try_admin_get("/debug/proxies") else {
                return false;
            };
            let proxies: Value = serde_json::from_slice(&answer.body).unwrap_or_default();
            proxies.as_array().is_some_and(|p| !p.is_empty())
        })
    }

    /// Envoy's egress listener.
    pub fn egress(&self) -> SocketAddr {
        self.envoy.listener(EGRESS_LISTENER)
    }

    /// The embedded registry of node `i`, through its REST API.
    pub fn eureka(&self, i: usize) -> EurekaApi {
        EurekaApi::new(self.nodes[i].eureka_addr())
    }
}

/// Waits at most `timeout` until every registry in `nodes` lists the same instances with
/// the same statuses and addresses (`GET /eureka/apps`), and returns them with the time it
/// took. Panics showing what each node listed last.
pub fn wait_converged(
    nodes: &[&ControlPlane],
    timeout: Duration,
    what: &str,
) -> (BTreeMap<String, Listed>, Duration) {
    timed(|| {
        wait_ok(timeout, what, || {
            let views: Vec<BTreeMap<String, Listed>> = nodes
                .iter()
                .map(|node| EurekaApi::new(node.eureka_addr()).instances())
                .collect();
            if views.windows(2).all(|pair| pair[0] == pair[1]) {
                return Ok(views.into_iter().next().unwrap_or_default());
            }
            let shown: Vec<String> = (nodes.iter().zip(&views))
                .map(|(node, view)| format!("{}: {view:?}", node.process().label()))
                .collect();
            Err(format!("the nodes list\n{}", shown.join("\n")))
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserved_addresses_are_distinct_loopback_ports() {
        let addrs = reserve_addrs(5);
        let mut ports: Vec<u16> = addrs.iter().map(SocketAddr::port).collect();
        ports.sort_unstable();
        ports.dedup();
        assert_eq!(ports.len(), 5, "{addrs:?}");
        assert!(addrs.iter().all(|a| a.ip().is_loopback()), "{addrs:?}");
    }
}
