//! Stock Envoy as a child process: start it from a bootstrap YAML string, wait until it is
//! ready, find its listeners, read its `/stats`.
//!
//! Bootstraps are templates with `${NAME}` placeholders ([`render`]). Envoy's admin and
//! listeners should bind port 0: the harness reads the admin address from
//! `--admin-address-path` and each listener's port from the admin `/listeners`, so parallel
//! tests never race for a port.

use std::collections::BTreeMap;
use std::fs;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, ExitStatus};
use std::time::Duration;

use crate::http::{Request, Response};
use crate::paths::{envoy_binary, repo_root};
use crate::process::{ChildGuard, TestEnv};
use crate::wait::wait_for;

/// How long Envoy may take to become ready (V8 compiles the wasm; CI machines are slow).
pub const START_TIMEOUT: Duration = Duration::from_secs(30);

/// Replaces every `${NAME}` in `template` by its value; panics if a placeholder is left.
pub fn render(template: &str, vars: &[(&str, &str)]) -> String {
    let mut out = template.to_owned();
    for (name, value) in vars {
        let placeholder = format!("${{{name}}}");
        assert!(
            out.contains(&placeholder),
            "the template has no placeholder {placeholder}"
        );
        out = out.replace(&placeholder, value);
    }
    if let Some(at) = out.find("${") {
        let rest = &out[at..];
        let end = rest.find('}').map_or(rest.len(), |e| e + 1);
        panic!("the template's placeholder {} has no value", &rest[..end]);
    }
    out
}

/// A running Envoy, killed when dropped.
pub struct Envoy {
    process: ChildGuard,
    admin: SocketAddr,
    listeners: BTreeMap<String, SocketAddr>,
}

impl Envoy {
    /// Starts Envoy from `bootstrap` (YAML) and waits until its admin `/ready` says `LIVE`.
    ///
    /// The bootstrap and the log go to the test's log folder as `<label>.yaml` and
    /// `<label>.log`. Envoy runs from the repository root with `--concurrency 1` and
    /// `--disable-hot-restart`. Panics with the log if Envoy exits first.
    pub fn start(env: &TestEnv, label: &str, bootstrap: &str) -> Envoy {
        Envoy::start_workers(env, label, bootstrap, 1)
    }

    /// [`Envoy::start`] with `workers` worker threads (`--concurrency`).
    pub fn start_workers(env: &TestEnv, label: &str, bootstrap: &str, workers: u32) -> Envoy {
        let admin_path = env.log_dir().join(format!("{label}.admin-address"));
        let mut process = spawn(env, label, bootstrap, &admin_path, workers);
        let what = format!("{label} to be ready (admin /ready says LIVE)");
        let admin = wait_for(START_TIMEOUT, &what, || {
            if let Some(status) = process.exit_status() {
                panic!(
                    "{label} exited with {status} before it was ready; log {}:\n{}",
                    process.log_path().display(),
                    process.log()
                );
            }
            let admin: SocketAddr = fs::read_to_string(&admin_path).ok()?.trim().parse().ok()?;
            let ready = Request::get("/ready").host("admin").try_send(admin).ok()?;
            (ready.status == 200 && ready.text().trim() == "LIVE").then_some(admin)
        });
        let listeners = read_listeners(admin);
        Envoy {
            process,
            admin,
            listeners,
        }
    }

    /// Starts Envoy from `bootstrap`, expecting it to refuse it: waits at most `timeout` for
    /// it to exit, and returns its exit status and log. Panics if it becomes ready instead.
    pub fn start_expecting_exit(
        env: &TestEnv,
        label: &str,
        bootstrap: &str,
        timeout: Duration,
    ) -> (ExitStatus, String) {
        let admin_path = env.log_dir().join(format!("{label}.admin-address"));
        let mut process = spawn(env, label, bootstrap, &admin_path, 1);
        let what = format!("{label} to refuse its bootstrap and exit");
        let status = wait_for(timeout, &what, || {
            if let Some(status) = process.exit_status() {
                return Some(status);
            }
            if let Some(admin) = fs::read_to_string(&admin_path)
                .ok()
                .and_then(|a| a.trim().parse::<SocketAddr>().ok())
            {
                let ready = Request::get("/ready").host("admin").try_send(admin).ok();
                if ready.is_some_and(|r| r.status == 200) {
                    panic!(
                        "{label} accepted a bootstrap it should have refused; log:\n{}",
                        process.log()
                    );
                }
            }
            None
        });
        (status, process.log())
    }

    /// Runs `envoy --mode validate` on `bootstrap` (which also loads the wasm and runs its
    /// `on_configure`) and returns its exit status and log.
    pub fn validate(env: &TestEnv, label: &str, bootstrap: &str) -> (ExitStatus, String) {
        let config = env.write_file(&format!("{label}.yaml"), bootstrap);
        let mut command = Command::new(envoy_binary());
        command
            .current_dir(repo_root())
            .args(["--mode", "validate", "--config-path"])
            .arg(&config);
        let mut process = env.spawn(label, command);
        let status = process.wait_exit(START_TIMEOUT);
        (status, process.log())
    }

    /// The admin address.
    pub fn admin(&self) -> SocketAddr {
        self.admin
    }

    /// The address the listener named `name` is bound to; panics listing the listeners if
    /// there is none of that name.
    pub fn listener(&self, name: &str) -> SocketAddr {
        match self.listeners.get(name) {
            Some(addr) => *addr,
            None => panic!(
                "Envoy has no listener {name:?}; it has {:?}",
                self.listeners.keys().collect::<Vec<_>>()
            ),
        }
    }

    /// The upstream addresses Envoy lists for `cluster` in its admin `/clusters`
    /// (`<cluster>::<address>::<stat>::<value>` lines), e.g. `127.0.0.1:8080`.
    pub fn cluster_hosts(&self, cluster: &str) -> std::collections::BTreeSet<String> {
        let prefix = format!("{cluster}::");
        self.admin_get("/clusters")
            .text()
            .lines()
            .filter_map(|line| line.strip_prefix(&prefix))
            .filter_map(|rest| rest.split("::").next())
            .filter(|address| address.contains(':'))
            .map(str::to_owned)
            .collect()
    }

    /// `GET path` on the admin interface; panics if the admin does not answer.
    pub fn admin_get(&self, path: &str) -> Response {
        Request::get(path).host("admin").send(self.admin)
    }

    /// Every counter and gauge in `/stats`, by name.
    pub fn stats(&self) -> BTreeMap<String, u64> {
        let response = self.admin_get("/stats");
        assert_eq!(response.status, 200, "admin /stats: {}", response.text());
        response
            .text()
            .lines()
            .filter_map(|line| {
                let (name, value) = line.split_once(": ")?;
                Some((name.to_owned(), value.trim().parse().ok()?))
            })
            .collect()
    }

    /// The value of stat `name` (a counter or gauge), or `None` if Envoy has no such stat.
    pub fn stat(&self, name: &str) -> Option<u64> {
        self.stats().remove(name)
    }

    /// Waits at most `timeout` until its ADS stream is up (`connected`) or down: the stat
    /// `control_plane.connected_state`.
    pub fn wait_xds_connected(&self, connected: bool, timeout: Duration) {
        let what = if connected {
            "Envoy to connect to the control plane"
        } else {
            "Envoy to see the control plane gone"
        };
        let state = u64::from(connected);
        wait_for(timeout, what, || {
            (self.stat("control_plane.connected_state") == Some(state)).then_some(())
        });
    }

    /// The process, read-only (its log, its memory).
    pub fn child(&self) -> &ChildGuard {
        &self.process
    }

    /// The process (its log, its id, whether it exited).
    pub fn process(&mut self) -> &mut ChildGuard {
        &mut self.process
    }

    /// Everything Envoy has logged so far.
    pub fn log(&self) -> String {
        self.process.log()
    }
}

fn spawn(
    env: &TestEnv,
    label: &str,
    bootstrap: &str,
    admin_path: &Path,
    workers: u32,
) -> ChildGuard {
    let config = env.write_file(&format!("{label}.yaml"), bootstrap);
    let mut command = Command::new(envoy_binary());
    command
        .current_dir(repo_root())
        .arg("--config-path")
        .arg(&config)
        .args([
            "--concurrency",
            &workers.to_string(),
            "--disable-hot-restart",
        ])
        .arg("--admin-address-path")
        .arg(admin_path);
    env.spawn(label, command)
}

/// Reads `/listeners?format=json`: listener name → bound address.
fn read_listeners(admin: SocketAddr) -> BTreeMap<String, SocketAddr> {
    let response = Request::get("/listeners?format=json")
        .host("admin")
        .send(admin);
    let json = response.json();
    let mut listeners = BTreeMap::new();
    for status in json["listener_statuses"].as_array().into_iter().flatten() {
        let (Some(name), Some(ip), Some(port)) = (
            status["name"].as_str(),
            status["local_address"]["socket_address"]["address"].as_str(),
            status["local_address"]["socket_address"]["port_value"].as_u64(),
        ) else {
            continue;
        };
        if let (Ok(ip), Ok(port)) = (ip.parse(), u16::try_from(port)) {
            listeners.insert(name.to_owned(), SocketAddr::new(ip, port));
        }
    }
    listeners
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_fills_every_placeholder() {
        let out = render("a: ${A}\nb: ${B}\n", &[("A", "1"), ("B", "two")]);
        assert_eq!(out, "a: 1\nb: two\n");
    }

    #[test]
    fn render_refuses_a_template_with_a_placeholder_left() {
        let msg = crate::panic_message(|| render("a: ${A}\nb: ${B}\n", &[("A", "1")]));
        assert!(msg.contains("${B}"), "{msg}");
    }
}
