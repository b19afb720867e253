//! Where things are: the repository, the Envoy binary, the built filter, free ports.

use std::env;
use std::net::{Ipv4Addr, TcpListener};
use std::path::PathBuf;

/// The Envoy version `make envoy` installs.
pub const ENVOY_VERSION: &str = "1.40.0";

/// The repository root (the folder holding the workspace `Cargo.toml`).
pub fn repo_root() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(PathBuf::from)
        .unwrap_or_default();
    assert!(
        root.join("Cargo.toml").is_file() && root.join("filter").is_dir(),
        "cannot find the odmesh repository root above {}",
        env!("CARGO_MANIFEST_DIR")
    );
    root
}

/// The Envoy binary: `$ENVOY` if set, else the one `make envoy` installs under `.tools/`.
///
/// Panics with what to do if it is missing: a test that needs Envoy must not pass without it.
pub fn envoy_binary() -> PathBuf {
    binary(
        "ENVOY",
        "Envoy is not installed",
        "run `make envoy`",
        || repo_root().join(format!(".tools/envoy-{ENVOY_VERSION}/envoy/_bin/envoy")),
    )
}

/// A program a test runs: `$var` if set, else `default()`. Panics if the file is missing:
/// `what` says so and `how` what to do, e.g. which command builds it.
pub(crate) fn binary(
    var: &str,
    what: &str,
    how: &str,
    default: impl FnOnce() -> PathBuf,
) -> PathBuf {
    if let Some(path) = env::var_os(var).filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        assert!(
            path.is_file(),
            "{var}={} does not exist; unset {var} to use the default",
            path.display()
        );
        return path;
    }
    let path = default();
    assert!(
        path.is_file(),
        "{what}: {} is missing; {how} (or set {var}=/path/to/it)",
        path.display()
    );
    path
}

/// A loopback TCP port that was free a moment ago, for a server in another process.
///
/// Taken below the kernel's ephemeral range (`net.ipv4.ip_local_port_range`), where the OS
/// would pick it: there, the source port of any outgoing connection on the machine (Envoy's,
/// a JVM's, the load's) can take it between this check and the server's bind, and the server
/// fails with "address already in use" (seen in a suite run). Below the range only another
/// test's pick can, and each test process starts at its own place in it and never hands a
/// port out twice. Where a server can bind port 0 itself and report its port (the echo
/// upstream, Envoy's listeners and admin), prefer that.
pub fn free_port() -> u16 {
    reserve_ports(1)[0]
}

/// `n` distinct ports as [`free_port`] picks them.
pub fn reserve_ports(n: usize) -> Vec<u16> {
    use std::sync::atomic::{AtomicU32, Ordering};
    // Where the picks go: [FIRST_PORT, the ephemeral range's start).
    const FIRST_PORT: u32 = 10_000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let end = ephemeral_start().max(FIRST_PORT + 1_000);
    let span = end - FIRST_PORT;
    // Each test process starts at its own place: two suites on one machine rarely meet.
    let start = (std::process::id().wrapping_mul(2_654_435_761)) % span;
    let mut held = Vec::with_capacity(n);
    for _ in 0..span {
        if held.len() == n {
            break;
        }
        let offset = (start + NEXT.fetch_add(1, Ordering::Relaxed)) % span;
        let port = u16::try_from(FIRST_PORT + offset).expect("below the ephemeral range");
        if let Ok(listener) = TcpListener::bind((Ipv4Addr::LOCALHOST, port)) {
            held.push(listener);
        }
    }
    assert_eq!(held.len(), n, "no {n} free loopback ports below {end}");
    held.iter()
        .map(|l| l.local_addr().expect("a bound listener's address").port())
        .collect()
}

/// The first port of the kernel's ephemeral range (Linux's default 32768 if unreadable).
fn ephemeral_start() -> u32 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

/// The control plane binary: `$ODMESH_CONTROL` if set, else `target/debug/odmesh-control`
/// (under `$CARGO_TARGET_DIR` if set). Panics with what to do if it is missing.
pub fn control_binary() -> PathBuf {
    let how = "run `cargo build -p odmesh-control`";
    binary(
        "ODMESH_CONTROL",
        "the control plane is not built",
        how,
        || {
            let target = env::var_os("CARGO_TARGET_DIR")
                .filter(|p| !p.is_empty())
                .map_or_else(|| repo_root().join("target"), PathBuf::from);
            target.join("debug/odmesh-control")
        },
    )
}
