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
    if let Some(path) = env::var_os("ENVOY").filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        assert!(
            path.is_file(),
            "ENVOY={} does not exist; unset ENVOY to use the one `make envoy` installs",
            path.display()
        );
        return path;
    }
    let path = repo_root().join(format!(".tools/envoy-{ENVOY_VERSION}/envoy/_bin/envoy"));
    assert!(
        path.is_file(),
        "Envoy is not installed at {}: run `make envoy` (or set ENVOY=/path/to/envoy)",
        path.display()
    );
    path
}

/// A loopback TCP port that was free a moment ago (the OS picked it).
///
/// Another process may take it before it is used; where a server can bind port 0 itself and
/// report its port (the echo upstream, Envoy's listeners and admin), prefer that.
pub fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("cannot get a free loopback port from the OS: {e}"))
}

/// The control plane binary: `$ODMESH_CONTROL` if set, else `target/debug/odmesh-control`
/// (under `$CARGO_TARGET_DIR` if set). Panics with what to do if it is missing.
pub fn control_binary() -> PathBuf {
    if let Some(path) = env::var_os("ODMESH_CONTROL").filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        assert!(
            path.is_file(),
            "ODMESH_CONTROL={} does not exist; unset it to use target/debug/odmesh-control",
            path.display()
        );
        return path;
    }
    let target = env::var_os("CARGO_TARGET_DIR")
        .filter(|p| !p.is_empty())
        .map_or_else(|| repo_root().join("target"), PathBuf::from);
    let path = target.join("debug/odmesh-control");
    assert!(
        path.is_file(),
        "the control plane is not built: {} is missing; run `cargo build -p odmesh-control` \
         (or set ODMESH_CONTROL=/path/to/odmesh-control)",
        path.display()
    );
    path
}
