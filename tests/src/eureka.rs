//! Eureka from the outside: [`EurekaApi`] speaks Eureka's REST API as a client library
//! would (register, change status), and [`ClientDriver`] runs a real, unmodified Eureka
//! client library (npm `eureka-js-client`, PyPI `py-eureka-client`) in a child process.
//!
//! The drivers are the scripts the Eureka crate's own tests use,
//! `eureka/tests/clients/*/register.*`: each serves HTTP on a free port (answering `hello from
//! <instance id>`), registers it, heartbeats, obeys `out_of_service` / `in_service` / `stop` on
//! stdin, and reports on stdout as lines `odmesh-driver: ...`. The libraries come from
//! `scripts/install-eureka-clients.sh` (into `.tools/eureka-clients/`).

use std::collections::BTreeMap;
use std::fmt;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{ChildStdin, Command};
use std::time::Duration;

use serde_json::{Value, json};

use crate::http::{Request, Response};
use crate::paths::repo_root;
use crate::process::{ChildGuard, TestEnv};
use crate::registry::Instance;
use crate::wait::wait_for;

/// Eureka's REST API at `http://<addr>/eureka`, as a client library calls it.
#[derive(Clone, Copy, Debug)]
pub struct EurekaApi {
    addr: SocketAddr,
}

impl EurekaApi {
    /// The Eureka server at `addr` (base path `/eureka`).
    pub fn new(addr: SocketAddr) -> EurekaApi {
        EurekaApi { addr }
    }

    /// `POST /eureka/apps/{APP}` with the JSON a Eureka client sends: an `UP` instance `id`
    /// of `app` on `127.0.0.1:port`, VIP `app`. Panics unless the server answers 204.
    pub fn register(&self, app: &str, id: &str, port: u16) {
        let instance = Instance::new(&app.to_ascii_lowercase(), port).id(id);
        self.post_registration(&instance, instance.to_eureka());
    }

    /// [`EurekaApi::register`] with the instance's `lastDirtyTimestamp` (and
    /// `lastUpdatedTimestamp`) set to `last_dirty_ms`, as a client writes it: between two
    /// registrations of one instance, the one with the newer timestamp wins.
    pub fn register_dirty(&self, app: &str, id: &str, port: u16, last_dirty_ms: u64) {
        let instance = Instance::new(&app.to_ascii_lowercase(), port).id(id);
        let mut document = instance.to_eureka();
        document["lastDirtyTimestamp"] = Value::String(last_dirty_ms.to_string());
        document["lastUpdatedTimestamp"] = Value::String(last_dirty_ms.to_string());
        self.post_registration(&instance, document);
    }

    /// `POST /eureka/apps/{APP}` of `document`; panics unless the server answers 204.
    fn post_registration(&self, instance: &Instance, document: Value) {
        let body = json!({ "instance": document });
        let app = instance.eureka_app();
        let request = Request::new("POST", &format!("/eureka/apps/{app}"))
            .header("content-type", "application/json")
            .body(body.to_string());
        self.expect(&request, 204);
    }

    /// `PUT /eureka/apps/{APP}/{id}/status?value=<status>`: an operator's status override
    /// (e.g. `OUT_OF_SERVICE`). Panics unless the server answers 200.
    pub fn set_status(&self, app: &str, id: &str, status: &str) {
        let app = app.to_ascii_uppercase();
        let path = format!("/eureka/apps/{app}/{id}/status?value={status}");
        self.expect(&Request::new("PUT", &path), 200);
    }

    /// `DELETE /eureka/apps/{APP}/{id}/status`: removes the override, the instance is back to
    /// the status it registered with. Panics unless the server answers 200.
    pub fn remove_status_override(&self, app: &str, id: &str) {
        let app = app.to_ascii_uppercase();
        let path = format!("/eureka/apps/{app}/{id}/status");
        self.expect(&Request::new("DELETE", &path), 200);
    }

    /// `DELETE /eureka/apps/{APP}/{id}`: the instance leaves the registry, as a client that
    /// shuts down does. Panics unless the server answers 200.
    pub fn cancel(&self, app: &str, id: &str) {
        let app = app.to_ascii_uppercase();
        let path = format!("/eureka/apps/{app}/{id}");
        self.expect(&Request::new("DELETE", &path), 200);
    }

    /// `GET /eureka/apps` as JSON. Panics unless the server answers 200.
    pub fn apps(&self) -> Value {
        self.expect(&Request::get("/eureka/apps"), 200).json()
    }

    /// Every instance in `GET /eureka/apps`, by instance id.
    pub fn instances(&self) -> BTreeMap<String, Listed> {
        listed_instances(&self.apps())
    }

    /// Every instance in `GET /eureka/apps`, by instance id, with its status.
    pub fn statuses(&self) -> BTreeMap<String, String> {
        (self.instances().into_iter())
            .map(|(id, listed)| (id, listed.status))
            .collect()
    }

    /// Sends `request` (with `Host` and `Accept: application/json`) and checks the status.
    fn expect(&self, request: &Request, status: u16) -> Response {
        let request = request
            .clone()
            .host(&self.addr.to_string())
            .header("accept", "application/json");
        let response = request.send(self.addr);
        assert_eq!(
            response.status,
            status,
            "Eureka at {} answered {request:?} with: {}",
            self.addr,
            response.text()
        );
        response
    }
}

/// An instance as `GET /eureka/apps` lists it: what peers must agree on.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Listed {
    /// `UP`, `OUT_OF_SERVICE`, ...
    pub status: String,
    /// `ipAddr:port`.
    pub addr: String,
}

/// Every instance of a `GET /eureka/apps` JSON document, by instance id. As Eureka writes
/// them, `application` and `instance` may each be one object or a list, and a port's `$` a
/// number or a string.
pub fn listed_instances(apps: &Value) -> BTreeMap<String, Listed> {
    fn each(value: &Value) -> Vec<&Value> {
        match value {
            Value::Array(items) => items.iter().collect(),
            Value::Null => Vec::new(),
            one => vec![one],
        }
    }
    let applications = &apps["applications"]["application"];
    each(applications)
        .into_iter()
        .flat_map(|app| each(&app["instance"]))
        .map(|instance| {
            let text = |v: &Value| match v {
                Value::String(s) => Some(s.clone()),
                Value::Number(n) => Some(n.to_string()),
                _ => None,
            };
            let id = text(&instance["instanceId"]);
            let status = text(&instance["status"]);
            let ip = text(&instance["ipAddr"]);
            let port = text(&instance["port"]["$"]);
            match (id, status, ip, port) {
                (Some(id), Some(status), Some(ip), Some(port)) => {
                    let addr = format!("{ip}:{port}");
                    (id, Listed { status, addr })
                }
                _ => panic!("an instance without instanceId, status, ipAddr or port: {instance}"),
            }
        })
        .collect()
}

/// A real Eureka client library.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EurekaClient {
    /// npm `eureka-js-client`: registers and reads JSON.
    Js,
    /// PyPI `py-eureka-client`: registers JSON, reads XML.
    Python,
}

impl fmt::Display for EurekaClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            EurekaClient::Js => "eureka-js-client",
            EurekaClient::Python => "py-eureka-client",
        })
    }
}

impl EurekaClient {
    /// Panics saying how to install this client when its library or its runtime is missing:
    /// a test that needs a real client never passes without it (there is no skip).
    pub fn require_installed(self) {
        let (library, runtime) = match self {
            EurekaClient::Js => (tools().join("node/node_modules/eureka-js-client"), "node"),
            EurekaClient::Python => (tools().join("python/py_eureka_client"), "python3"),
        };
        assert!(
            library.is_dir(),
            "{self} is not installed ({} is missing): run scripts/install-eureka-clients.sh \
             (needs node, npm, python3 and pip)",
            library.display()
        );
        let found = Command::new(runtime)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
        assert!(found, "`{runtime}` is not on PATH; it runs {self}");
    }
}

/// What a [`ClientDriver`] registers.
#[derive(Clone, Debug)]
pub struct Registration {
    /// The app name (also the VIP).
    pub app: String,
    /// The instance id; the driver's server answers `hello from <id>`.
    pub id: String,
    /// Seconds between heartbeats.
    pub heartbeat_secs: u64,
    /// The lease duration it registers with (`leaseInfo.durationInSecs`).
    pub lease_secs: u64,
    /// `(identity, token)` it sends as Basic credentials (in its Eureka URL), for a registry
    /// with a tokens file; py-eureka-client only.
    pub credentials: Option<(String, String)>,
}

/// A real Eureka client library in a child process, registering its own HTTP server with
/// the Eureka server at `eureka`; killed (SIGKILL) when dropped. Its output is
/// `<label>.log` in the test's log folder.
pub struct ClientDriver {
    process: ChildGuard,
    stdin: Option<ChildStdin>,
    /// How many reports [`ClientDriver::wait_report`] has consumed.
    seen: usize,
}

impl ClientDriver {
    /// Starts `client`'s driver registering `registration` with the Eureka server at `eureka`.
    pub fn start(
        env: &TestEnv,
        label: &str,
        client: EurekaClient,
        eureka: SocketAddr,
        registration: &Registration,
    ) -> ClientDriver {
        ClientDriver::start_with_servers(env, label, client, &[eureka], registration)
    }

    /// Starts `client`'s driver registering `registration` with the Eureka servers at
    /// `servers`, which the client tries in this order and fails over between (each at base
    /// path `/eureka`). Only py-eureka-client's driver takes several.
    pub fn start_with_servers(
        env: &TestEnv,
        label: &str,
        client: EurekaClient,
        servers: &[SocketAddr],
        registration: &Registration,
    ) -> ClientDriver {
        let drivers = repo_root().join("eureka/tests/clients");
        let eureka = match (client, servers) {
            (_, [one]) => *one,
            (EurekaClient::Python, [_, _, ..]) => servers[0],
            _ => panic!("the {client} driver takes one Eureka server, got {servers:?}"),
        };
        let mut command = match client {
            EurekaClient::Js => {
                assert!(
                    registration.credentials.is_none(),
                    "the eureka-js-client driver sends no credentials"
                );
                let mut c = Command::new("node");
                c.arg(drivers.join("eureka-js-client/register.js"))
                    .env("NODE_PATH", tools().join("node/node_modules"))
                    .env("EUREKA_HOST", eureka.ip().to_string())
                    .env("EUREKA_PORT", eureka.port().to_string())
                    .env(
                        "HEARTBEAT_MS",
                        (registration.heartbeat_secs * 1000).to_string(),
                    );
                c
            }
            EurekaClient::Python => {
                let mut c = Command::new("python3");
                c.arg("-u")
                    .arg(drivers.join("py-eureka-client/register.py"))
                    .env("PYTHONPATH", tools().join("python"))
                    .env("EUREKA_URL", {
                        let auth = (registration.credentials.as_ref())
                            .map(|(user, token)| format!("{user}:{token}@"))
                            .unwrap_or_default();
                        // py-eureka-client takes a comma-separated list, tried in order.
                        let urls: Vec<String> = servers
                            .iter()
                            .map(|server| format!("http://{auth}{server}/eureka"))
                            .collect();
                        urls.join(",")
                    })
                    .env("HEARTBEAT_SECS", registration.heartbeat_secs.to_string());
                c
            }
        };
        command
            .env("APP", &registration.app)
            .env("INSTANCE_ID", &registration.id)
            .env("VIP", &registration.app)
            .env("LEASE_SECS", registration.lease_secs.to_string());
        let (process, stdin) = env.spawn_interactive(label, command);
        ClientDriver {
            process,
            stdin: Some(stdin),
            seen: 0,
        }
    }

    /// Waits at most `timeout` for the next report (after those already waited for) that
    /// starts with `prefix`, and returns it without the `odmesh-driver: ` prefix. Panics if
    /// the driver exits or the time runs out.
    pub fn wait_report(&mut self, prefix: &str, timeout: Duration) -> String {
        let what = format!(
            "{} to report {prefix:?} (its output: {})",
            self.process.label(),
            self.process.log_path().display()
        );
        wait_for(timeout, &what, || {
            let log = self.process.log();
            let reports: Vec<&str> = log
                .lines()
                .filter_map(|l| l.strip_prefix("odmesh-driver: "))
                .collect();
            let fresh = reports.get(self.seen..).unwrap_or_default();
            if let Some(i) = fresh.iter().position(|r| r.starts_with(prefix)) {
                let report = fresh[i].to_owned();
                self.seen += i + 1;
                return Some(report);
            }
            if let Some(status) = self.process.exit_status() {
                panic!(
                    "{} exited ({status}) before it reported {prefix:?}:\n{log}",
                    self.process.label()
                );
            }
            None
        })
    }

    /// Waits for the driver's `listening <port>` report and returns the port its HTTP server
    /// serves.
    pub fn wait_listening(&mut self, timeout: Duration) -> u16 {
        let report = self.wait_report("listening ", timeout);
        report["listening ".len()..]
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("bad report {report:?}: {e}"))
    }

    /// Sends one command line (`out_of_service`, `in_service`, `stop`) to the driver.
    pub fn command(&mut self, command: &str) {
        let label = self.process.label().to_owned();
        let stdin = self
            .stdin
            .as_mut()
            .unwrap_or_else(|| panic!("{label} has no stdin any more"));
        stdin
            .write_all(format!("{command}\n").as_bytes())
            .and_then(|()| stdin.flush())
            .unwrap_or_else(|e| panic!("cannot send {command:?} to {label}: {e}"));
    }

    /// Kills the driver with SIGKILL, as a crash would: its client never cancels.
    pub fn kill(&mut self) {
        self.stdin = None;
        self.process.kill();
    }
}

/// Where `scripts/install-eureka-clients.sh` installs the client libraries.
fn tools() -> PathBuf {
    repo_root().join(".tools/eureka-clients")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listed_instances_reads_lists_and_single_objects_as_eureka_writes_them() {
        let apps = json!({"applications": {"application": [
            {"name": "HELLO", "instance": [
                {"instanceId": "hello-1", "status": "UP", "ipAddr": "127.0.0.1",
                 "port": {"$": 8080, "@enabled": "true"}},
                {"instanceId": "hello-2", "status": "OUT_OF_SERVICE", "ipAddr": "127.0.0.1",
                 "port": {"$": "8081", "@enabled": "true"}}
            ]},
            {"name": "OTHER", "instance":
                {"instanceId": "other-1", "status": "DOWN", "ipAddr": "10.0.0.1",
                 "port": {"$": 80, "@enabled": "true"}}}
        ]}});
        let listed = listed_instances(&apps);
        let view: Vec<(&str, &str, &str)> = (listed.iter())
            .map(|(id, l)| (id.as_str(), l.status.as_str(), l.addr.as_str()))
            .collect();
        assert_eq!(
            view,
            [
                ("hello-1", "UP", "127.0.0.1:8080"),
                ("hello-2", "OUT_OF_SERVICE", "127.0.0.1:8081"),
                ("other-1", "DOWN", "10.0.0.1:80"),
            ]
        );
        let one = json!({"applications": {"application":
            {"name": "HELLO", "instance": {"instanceId": "hello-1", "status": "UP",
             "ipAddr": "127.0.0.1", "port": {"$": 8080}}}}});
        assert_eq!(listed_instances(&one).len(), 1);
        assert!(listed_instances(&json!({"applications": {}})).is_empty());
    }
}
