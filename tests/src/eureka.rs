//! Eureka from the outside: [`EurekaApi`] speaks Eureka's REST API as a client library
//! would (register, change status), and [`ClientDriver`] runs a real, unmodified Eureka
//! client library (npm `eureka-js-client`, PyPI `py-eureka-client`, Spring Cloud Netflix's
//! Java client on either of its transports) in a child process.
//!
//! The drivers are the scripts the Eureka crate's own tests use,
//! `eureka/tests/clients/*/register.*`, and a Spring Boot service, `tests/eureka-java/client`:
//! each serves HTTP on a free port (answering `hello from <instance id>`), registers it,
//! heartbeats, obeys `out_of_service` / `in_service` / `stop` on stdin, and reports on stdout
//! as lines `odmesh-driver: ...`; the Java one also takes `status`, `metadata`, `fetch` and
//! `fetches` ([`ClientDriver::set_status`], [`ClientDriver::set_metadata`],
//! [`ClientDriver::fetch`], [`ClientDriver::fetches`]). The libraries come from
//! `scripts/install-eureka-clients.sh` (into `.tools/eureka-clients/`), the Java service from
//! `scripts/install-eureka-java.sh` (into `.tools/eureka-java/`).

use std::collections::BTreeMap;
use std::fmt;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{ChildStdin, Command};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::{Value, json};

use crate::fake_eureka::instances_of;
use crate::http::{Request, Response};
use crate::java::{self, JVM_START_TIMEOUT};
use crate::paths::repo_root;
use crate::process::{ChildGuard, TestEnv};
use crate::registry::Instance;
use crate::wait::{wait_for, wait_ok_every};

/// Eureka's REST API at `http://<addr>/eureka`, as a client library calls it.
#[derive(Clone, Debug)]
pub struct EurekaApi {
    addr: SocketAddr,
    /// The `Authorization` header every request carries, if any.
    authorization: Option<String>,
}

impl EurekaApi {
    /// The Eureka server at `addr` (base path `/eureka`).
    pub fn new(addr: SocketAddr) -> EurekaApi {
        EurekaApi {
            addr,
            authorization: None,
        }
    }

    /// The Eureka server at `addr`, every request with HTTP Basic `user` and `password`.
    pub fn with_basic_auth(addr: SocketAddr, user: &str, password: &str) -> EurekaApi {
        let credentials = BASE64.encode(format!("{user}:{password}"));
        EurekaApi {
            addr,
            authorization: Some(format!("Basic {credentials}")),
        }
    }

    /// The server's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `request` with this API's `Authorization` header, if it has one.
    pub fn authorize(&self, request: Request) -> Request {
        match &self.authorization {
            Some(value) => request.header("authorization", value),
            None => request,
        }
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
        let request = self.authorize(
            request
                .clone()
                .host(&self.addr.to_string())
                .header("accept", "application/json"),
        );
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
    (instances_of(apps).into_iter())
        .map(|(_, instance)| {
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
    /// A Spring Boot service on Spring Cloud Netflix's Eureka client with its default
    /// transport, Spring's RestClient (Apache HttpClient 5, Jackson): JSON both ways.
    Java,
    /// The same service on Eureka's own Jersey 3 transport (`eureka-client-jersey3`, what
    /// Netflix's eureka-client and Eureka servers use): JSON both ways, Eureka's codec.
    JavaJersey,
}

impl fmt::Display for EurekaClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            EurekaClient::Js => "eureka-js-client",
            EurekaClient::Python => "py-eureka-client",
            EurekaClient::Java => "Spring Cloud Eureka client (RestClient)",
            EurekaClient::JavaJersey => "Spring Cloud Eureka client (Jersey 3)",
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
            EurekaClient::Java | EurekaClient::JavaJersey => {
                java::jar(JAVA_CLIENT_JAR);
                return;
            }
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

    /// Whether this is the Java client, on either transport.
    pub fn is_java(self) -> bool {
        matches!(self, EurekaClient::Java | EurekaClient::JavaJersey)
    }

    /// How long its driver may take to start serving and register: a JVM's start is slow,
    /// and far slower on a busy machine.
    pub fn start_timeout(self) -> Duration {
        if self.is_java() {
            JVM_START_TIMEOUT
        } else {
            Duration::from_secs(20)
        }
    }
}

/// The Java client driver's jar, in `.tools/eureka-java/`.
const JAVA_CLIENT_JAR: &str = "eureka-client.jar";

/// The heap of a Java client driver's JVM, in MiB.
const JAVA_CLIENT_HEAP_MB: u32 = 192;

/// How long the Java driver may take to answer a command (`fetch`, `status`, ...).
const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);

/// How often [`ClientDriver::wait_fetch`] asks the Java driver for its cache.
const FETCH_POLL_INTERVAL: Duration = Duration::from_millis(200);

/// What a [`ClientDriver`] registers.
#[derive(Clone, Debug)]
pub struct Registration {
    /// The app name (also the VIP).
    pub app: String,
    /// The instance id; the driver's server answers `hello from <id>`.
    pub id: String,
    /// Seconds between heartbeats (and, for the js and Java clients, between registry fetches).
    pub heartbeat_secs: u64,
    /// The lease duration it registers with (`leaseInfo.durationInSecs`).
    pub lease_secs: u64,
    /// `(identity, token)` it sends as Basic credentials (in its Eureka URL), for a registry
    /// with a tokens file or a server with basic auth; not eureka-js-client.
    pub credentials: Option<(String, String)>,
}

/// A real Eureka client library in a child process, registering its own HTTP server with
/// the Eureka server at `eureka`; killed (SIGKILL) when dropped. Its output is
/// `<label>.log` in the test's log folder.
pub struct ClientDriver {
    process: ChildGuard,
    stdin: Option<ChildStdin>,
    client: EurekaClient,
    /// The reports read from its log so far.
    reports: Reports,
    /// How many reports [`ClientDriver::wait_report`] has consumed.
    seen: usize,
}

/// The `odmesh-driver: ` lines of a driver's log, read as it grows: each poll reads only what
/// was written since the last (a Java driver logs a lot, and waits poll every 20 ms).
#[derive(Default)]
struct Reports {
    /// Bytes of the log read so far.
    offset: u64,
    /// The start of a line not yet ended.
    partial: Vec<u8>,
    /// Every report, without its prefix, in order.
    lines: Vec<String>,
}

impl Reports {
    /// Reads what the log at `path` gained since the last call.
    fn read(&mut self, path: &Path) {
        let Ok(mut file) = File::open(path) else {
            return;
        };
        let mut fresh = Vec::new();
        if file.seek(SeekFrom::Start(self.offset)).is_err() || file.read_to_end(&mut fresh).is_err()
        {
            return;
        }
        self.offset += fresh.len() as u64;
        self.partial.extend_from_slice(&fresh);
        let Some(end) = self.partial.iter().rposition(|b| *b == b'\n') else {
            return;
        };
        let complete: Vec<u8> = self.partial.drain(..=end).collect();
        let text = String::from_utf8_lossy(&complete);
        let reports = text
            .lines()
            .filter_map(|l| l.strip_prefix("odmesh-driver: "));
        self.lines.extend(reports.map(str::to_owned));
    }
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
    /// path `/eureka`, with `registration.credentials` if any). eureka-js-client's driver
    /// takes one.
    pub fn start_with_servers(
        env: &TestEnv,
        label: &str,
        client: EurekaClient,
        servers: &[SocketAddr],
        registration: &Registration,
    ) -> ClientDriver {
        let auth = (registration.credentials.as_ref())
            .map(|(user, token)| format!("{user}:{token}@"))
            .unwrap_or_default();
        let urls: Vec<String> = (servers.iter())
            .map(|server| format!("http://{auth}{server}/eureka"))
            .collect();
        ClientDriver::start_with_urls(env, label, client, &urls, registration, &[])
    }

    /// Starts `client`'s driver registering `registration` with the Eureka servers at the
    /// service URLs `urls` (e.g. [`crate::JavaEureka::url`], credentials in them if any;
    /// `registration.credentials` is not read), tried in this order. `properties` are Spring
    /// properties for the Java client (`eureka.client.disable-delta`, `true`, ...), set after
    /// the driver's own; the other clients take none. eureka-js-client's driver takes one URL
    /// of the form `http://<ip>:<port>/eureka`.
    pub fn start_with_urls(
        env: &TestEnv,
        label: &str,
        client: EurekaClient,
        urls: &[String],
        registration: &Registration,
        properties: &[(&str, &str)],
    ) -> ClientDriver {
        assert!(!urls.is_empty(), "a driver needs a Eureka server");
        assert!(
            properties.is_empty() || client.is_java(),
            "the {client} driver takes no properties, got {properties:?}"
        );
        let drivers = repo_root().join("eureka/tests/clients");
        let mut command = match client {
            EurekaClient::Js => {
                let eureka = match urls {
                    [url] => (url.strip_prefix("http://"))
                        .and_then(|rest| rest.strip_suffix("/eureka"))
                        .and_then(|addr| addr.parse::<SocketAddr>().ok()),
                    _ => None,
                };
                let eureka = eureka.unwrap_or_else(|| {
                    panic!(
                        "the {client} driver takes one URL http://<ip>:<port>/eureka (no \
                         credentials), got {urls:?}"
                    )
                });
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
                    // py-eureka-client takes a comma-separated list, tried in order.
                    .env("EUREKA_URL", urls.join(","))
                    .env("HEARTBEAT_SECS", registration.heartbeat_secs.to_string());
                c
            }
            EurekaClient::Java | EurekaClient::JavaJersey => {
                // tests/eureka-java/client/src/main/resources/application.properties reads
                // these; `eureka.client.service-url.defaultZone` takes a comma-separated list.
                let mut c = java::command(&java::jar(JAVA_CLIENT_JAR), JAVA_CLIENT_HEAP_MB);
                c.env("EUREKA_URL", urls.join(","))
                    .env("HEARTBEAT_SECS", registration.heartbeat_secs.to_string())
                    .env("FETCH_SECS", registration.heartbeat_secs.to_string());
                if client == EurekaClient::JavaJersey {
                    c.arg("--eureka.client.jersey.enabled=true");
                }
                for (name, value) in properties {
                    c.arg(format!("--{name}={value}"));
                }
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
            client,
            reports: Reports::default(),
            seen: 0,
        }
    }

    /// The driver's process (its log, its exit status).
    pub fn process(&mut self) -> &mut ChildGuard {
        &mut self.process
    }

    /// Waits at most `timeout` for the next report (after those already waited for) that
    /// starts with `prefix`, and returns it without the `odmesh-driver: ` prefix. Panics if
    /// the driver exits or the time runs out.
    pub fn wait_report(&mut self, prefix: &str, timeout: Duration) -> String {
        self.wait_report_of(&[prefix], timeout)
    }

    /// [`ClientDriver::wait_report`] for the first report that starts with any of `prefixes`.
    fn wait_report_of(&mut self, prefixes: &[&str], timeout: Duration) -> String {
        let what = format!(
            "{} to report {prefixes:?} (its output: {})",
            self.process.label(),
            self.process.log_path().display()
        );
        wait_for(timeout, &what, || {
            // Whether it exited is asked first: its last reports are then in the log.
            let exited = self.process.exit_status();
            self.reports.read(self.process.log_path());
            let fresh = self.reports.lines.get(self.seen..).unwrap_or_default();
            let wanted = |r: &String| prefixes.iter().any(|p| r.starts_with(p));
            if let Some(i) = fresh.iter().position(wanted) {
                let report = fresh[i].clone();
                self.seen += i + 1;
                return Some(report);
            }
            if let Some(status) = exited {
                panic!(
                    "{} exited ({status}) before it reported {prefixes:?}:\n{}",
                    self.process.label(),
                    self.process.log()
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

    /// Sends `command` and waits for the report that answers it (starting with `reply`).
    fn ask(&mut self, command: &str, reply: &str) -> String {
        assert!(
            self.client.is_java(),
            "only the Java driver takes {command:?}, not {}",
            self.client
        );
        self.command(command);
        let report = self.wait_report_of(
            &[reply, "unknown command", "command failed"],
            COMMAND_TIMEOUT,
        );
        assert!(
            report.starts_with(reply),
            "{} answered {command:?} with {report:?}",
            self.process.label()
        );
        report
    }

    /// `status <status>`: the instance sets its own status (`UP`, `DOWN`, `STARTING`,
    /// `OUT_OF_SERVICE`, ...) as an application does, with Eureka's
    /// `ApplicationInfoManager.setInstanceStatus`; the client registers again with it at once.
    /// Returns when the client has taken it, not when the server has. Java only.
    pub fn set_status(&mut self, status: &str) {
        self.ask(&format!("status {status}"), &format!("status {status}"));
    }

    /// `metadata <key>=<value>`: adds the pair to the instance's metadata
    /// (`ApplicationInfoManager.registerAppMetadata`); the client sends it with its next
    /// periodic registration, within a heartbeat interval. Java only.
    pub fn set_metadata(&mut self, key: &str, value: &str) {
        let pair = format!("metadata {key}={value}");
        self.ask(&pair, &pair);
    }

    /// `fetch`: what the client's local registry cache holds now (its last full or delta
    /// fetch), every instance whatever its status. Java only.
    pub fn fetch(&mut self) -> Fetched {
        let report = self.ask("fetch", "fetched ");
        Fetched::parse(&report["fetched ".len()..])
    }

    /// Asks for [`ClientDriver::fetch`] every 200 ms until `condition` holds of it, for at
    /// most `timeout`, and returns that cache; panics naming `what` otherwise.
    pub fn wait_fetch(
        &mut self,
        timeout: Duration,
        what: &str,
        mut condition: impl FnMut(&Fetched) -> bool,
    ) -> Fetched {
        let label = self.process.label().to_owned();
        wait_ok_every(FETCH_POLL_INTERVAL, timeout, what, || {
            let fetched = self.fetch();
            if condition(&fetched) {
                return Ok(fetched);
            }
            Err(format!("{label} holds {fetched:#?}"))
        })
    }

    /// `fetches`: how many full and delta fetches the client made, and how many deltas it
    /// found inconsistent (a hash mismatch, answered by another full fetch). Java only.
    pub fn fetches(&mut self) -> Fetches {
        let report = self.ask("fetches", "fetches ");
        let json: Value = serde_json::from_str(&report["fetches ".len()..])
            .unwrap_or_else(|e| panic!("bad report {report:?}: {e}"));
        let count = |name: &str| {
            json[name]
                .as_u64()
                .unwrap_or_else(|| panic!("report {report:?} has no count {name}"))
        };
        Fetches {
            full: count("full"),
            delta: count("delta"),
            mismatch: count("mismatch"),
            failed: count("failed"),
        }
    }

    /// Kills the driver with SIGKILL, as a crash would: its client never cancels.
    pub fn kill(&mut self) {
        // Killed before its stdin closes: a driver that stops at the end of its input (the
        // Java one) must not get the chance to cancel.
        self.process.kill();
        self.stdin = None;
    }
}

/// What a Java client's local registry cache holds ([`ClientDriver::fetch`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fetched {
    /// The app names, sorted.
    pub apps: Vec<String>,
    /// Every instance, by instance id.
    pub instances: BTreeMap<String, Cached>,
    /// The apps hash code of the cache, e.g. `UP_2_` (what a delta is checked against).
    pub hash: String,
}

/// An instance in a Java client's cache.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cached {
    /// The app name, `HELLO`.
    pub app: String,
    /// `UP`, `OUT_OF_SERVICE`, ...
    pub status: String,
    /// The override the server told it of, `UNKNOWN` if none.
    pub overridden_status: String,
    /// `ipAddr`.
    pub ip: String,
    /// The (non-secure) port.
    pub port: u16,
    /// Its VIP (`vipAddress`).
    pub vip: String,
    /// Its metadata.
    pub metadata: BTreeMap<String, String>,
}

impl Fetched {
    /// Reads the driver's `fetched` report: `{"apps": [...], "instances": [{"id", "app",
    /// "status", "overriddenStatus", "ip", "port", "vip", "metadata"}], "hash"}`.
    fn parse(report: &str) -> Fetched {
        let json: Value = serde_json::from_str(report)
            .unwrap_or_else(|e| panic!("bad fetched report {report:?}: {e}"));
        let text = |v: &Value, name: &str| {
            (v[name].as_str())
                .unwrap_or_else(|| panic!("{name} is not text in the fetched report {report}"))
                .to_owned()
        };
        let list = |v: &Value| v.as_array().cloned().unwrap_or_default();
        let instances = (list(&json["instances"]).iter())
            .map(|i| {
                let port = (i["port"].as_u64())
                    .and_then(|p| u16::try_from(p).ok())
                    .unwrap_or_else(|| panic!("no port in the fetched report {report}"));
                let metadata = (i["metadata"].as_object().into_iter().flatten())
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                    .collect();
                let cached = Cached {
                    app: text(i, "app"),
                    status: text(i, "status"),
                    overridden_status: text(i, "overriddenStatus"),
                    ip: text(i, "ip"),
                    port,
                    vip: text(i, "vip"),
                    metadata,
                };
                (text(i, "id"), cached)
            })
            .collect();
        Fetched {
            apps: (list(&json["apps"]).iter())
                .filter_map(|a| a.as_str().map(str::to_owned))
                .collect(),
            instances,
            hash: text(&json, "hash"),
        }
    }
}

/// A Java client's fetches so far ([`ClientDriver::fetches`]), counted on its HTTP client:
/// `GET .../apps/` and `GET .../apps/delta` answered 200.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fetches {
    /// Full fetches: the first, after an empty cache or a refused delta, after a mismatch.
    pub full: u64,
    /// Delta fetches.
    pub delta: u64,
    /// Deltas after which the cache's hash differed from the server's (Eureka's
    /// `DiscoveryClient_ReconcileHashCodeMismatch`), each followed by a full fetch.
    pub mismatch: u64,
    /// Fetches of either kind that failed (no answer, or not a 2xx).
    pub failed: u64,
}

/// Where `scripts/install-eureka-clients.sh` installs the client libraries.
fn tools() -> PathBuf {
    repo_root().join(".tools/eureka-clients")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_are_read_as_the_log_grows_a_line_at_a_time() {
        let path = std::env::temp_dir().join(format!("odmesh-reports-{}.log", std::process::id()));
        let mut log = File::create(&path).expect("a temporary log");
        let mut reports = Reports::default();
        log.write_all(b"INFO starting\nodmesh-driver: listening 80\nodmesh-driver: regis")
            .expect("written");
        reports.read(&path);
        assert_eq!(reports.lines, ["listening 80"]);
        log.write_all(b"tered\nINFO done \xc3").expect("written");
        reports.read(&path);
        assert_eq!(reports.lines, ["listening 80", "registered"]);
        log.write_all(b"\xa9\nodmesh-driver: fetched {}\n")
            .expect("written");
        reports.read(&path);
        assert_eq!(reports.lines, ["listening 80", "registered", "fetched {}"]);
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn a_java_drivers_fetched_report_reads_as_its_cache() {
        let report = r#"{"apps":["HELLO"],"instances":[{"id":"hello-1","app":"HELLO",
            "status":"OUT_OF_SERVICE","overriddenStatus":"OUT_OF_SERVICE","ip":"127.0.0.1",
            "port":8080,"vip":"hello","metadata":{"zone":"z1"}}],"hash":"OUT_OF_SERVICE_1_"}"#;
        let fetched = Fetched::parse(report);
        assert_eq!(fetched.apps, ["HELLO"]);
        assert_eq!(fetched.hash, "OUT_OF_SERVICE_1_");
        let cached = &fetched.instances["hello-1"];
        assert_eq!(
            (cached.app.as_str(), cached.status.as_str(), cached.port),
            ("HELLO", "OUT_OF_SERVICE", 8080)
        );
        assert_eq!(cached.overridden_status, "OUT_OF_SERVICE");
        assert_eq!(
            (cached.ip.as_str(), cached.vip.as_str()),
            ("127.0.0.1", "hello")
        );
        assert_eq!(cached.metadata["zone"], "z1");
        let empty = Fetched::parse(r#"{"apps":[],"instances":[],"hash":""}"#);
        assert!(empty.apps.is_empty() && empty.instances.is_empty());
    }

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
