//! Eureka from the outside: [`EurekaApi`] speaks Eureka's REST API as a client library
//! would (register, change status), and [`ClientDriver`] runs a real, unmodified Eureka
//! client library (npm `eureka-js-client`, PyPI `py-eureka-client`) in a child process.
//!
//! The drivers are the scripts the Eureka crate's own tests use,
//! `eureka/tests/clients/*/register.*`: each serves HTTP on a free port (answering `hello from
//! <instance id>`), registers it, heartbeats, obeys `out_of_service` / `in_service` / `stop` on
//! stdin, and reports on stdout as lines `odmesh-driver: ...`. The libraries come from
//! `scripts/install-eureka-clients.sh` (into `.tools/eureka-clients/`).

use std::fmt;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{ChildStdin, Command};
use std::time::Duration;

use serde_json::json;

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
        let body = json!({ "instance": instance.to_eureka() });
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
        let drivers = repo_root().join("eureka/tests/clients");
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
                        format!("http://{auth}{eureka}/eureka")
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
