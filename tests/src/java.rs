//! Real Java Eureka: [`JavaEureka`], a Spring Cloud Netflix Eureka server in a child process,
//! and the JVM command line it and the Java client drivers ([`crate::EurekaClient::Java`])
//! run with. Both are built from `tests/eureka-java/` by `scripts/install-eureka-java.sh`
//! into `.tools/eureka-java/`.
//!
//! ```no_run
//! use odmesh_e2e::{JavaEureka, TestEnv};
//!
//! let env = TestEnv::new("a_real_eureka_server");
//! let eureka = JavaEureka::builder().basic_auth("odmesh", "secret").start(&env, "eureka");
//! let url = eureka.url(); // http://odmesh:secret@127.0.0.1:<port>/eureka, for clients
//! let apps = eureka.api().apps(); // GET /eureka/apps with the credentials
//! let peers = JavaEureka::start_peered(&env, "peer", 3); // each lists the other two
//! ```

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{ChildStdin, Command};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::eureka::EurekaApi;
use crate::http::Request;
use crate::paths::{free_port, repo_root};
use crate::peers::reserve_addrs;
use crate::process::{ChildGuard, TestEnv};
use crate::wait::wait_for;

/// How long a JVM (a server, or a Java client driver) may take to start and serve. Spring
/// Boot starts in 4-10 s on an idle 2-core machine; this bound is far above it, so a busy
/// machine makes a test slower, never red.
pub const JVM_START_TIMEOUT: Duration = Duration::from_secs(180);

/// The heap of a server's JVM, in MiB.
const SERVER_HEAP_MB: u32 = 384;

/// Where `scripts/install-eureka-java.sh` puts the jars.
fn tools() -> PathBuf {
    repo_root().join(".tools/eureka-java")
}

/// `.tools/eureka-java/<name>`; panics, saying how to build it, when it is missing or `java`
/// does not run: a test that needs a real Java piece never passes without it (no skip).
pub(crate) fn jar(name: &str) -> PathBuf {
    let jar = tools().join(name);
    assert!(
        jar.is_file(),
        "{} is missing: run scripts/install-eureka-java.sh (needs a JDK 17 or later and Maven)",
        jar.display()
    );
    let found = Command::new("java")
        .arg("-version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(found, "`java` is not on PATH; it runs {}", jar.display());
    jar
}

/// `java <flags> -Xmx<heap_mb>m -jar <jar>`, ready for the application's own arguments. The
/// flags keep a JVM light on a small shared machine: C1 only (it starts fast and a test's
/// JVM never runs long enough to gain from C2), the serial GC (no GC threads), small thread
/// stacks, and death on running out of memory rather than limping.
pub(crate) fn command(jar: &Path, heap_mb: u32) -> Command {
    let mut command = Command::new("java");
    command
        .args([
            "-XX:TieredStopAtLevel=1",
            "-XX:+UseSerialGC",
            "-Xss512k",
            "-XX:+ExitOnOutOfMemoryError",
        ])
        .arg(format!("-Xmx{heap_mb}m"))
        .arg("-jar")
        .arg(jar);
    command
}

/// How a [`JavaEureka`] is started; [`JavaEureka::builder`] makes one.
#[derive(Clone, Debug, Default)]
pub struct JavaEurekaBuilder {
    addr: Option<SocketAddr>,
    basic_auth: Option<(String, String)>,
    peers: Vec<String>,
}

impl JavaEurekaBuilder {
    /// Listen on `addr` (a loopback address reserved beforehand, e.g. one its peers list)
    /// instead of a free port.
    pub fn addr(mut self, addr: SocketAddr) -> Self {
        self.addr = Some(addr);
        self
    }

    /// Every request needs HTTP Basic with `user` and `password` (401 without); the server's
    /// [`JavaEureka::url`] carries them, as clients and peers give them.
    pub fn basic_auth(mut self, user: &str, password: &str) -> Self {
        self.basic_auth = Some((user.to_owned(), password.to_owned()));
        self
    }

    /// Replicate with the Eureka servers at these service URLs (e.g. another
    /// [`JavaEureka::url`], or an odmesh node's `http://127.0.0.1:<port>/eureka`): they become
    /// its `eureka.client.service-url.defaultZone`, and it registers with them and fetches
    /// from them as a peered Eureka server does. A URL naming this server itself is skipped.
    pub fn peers(mut self, urls: &[String]) -> Self {
        self.peers.extend(urls.iter().cloned());
        self
    }

    /// Starts the server; its log is `<label>.log` in the test's folder. Waits until it
    /// answers `GET /eureka/apps` (at most [`JVM_START_TIMEOUT`]).
    pub fn start(self, env: &TestEnv, label: &str) -> JavaEureka {
        let mut server = self.spawn(env, label);
        server.wait_serving();
        server
    }

    /// Starts the server without waiting for it to serve.
    fn spawn(self, env: &TestEnv, label: &str) -> JavaEureka {
        let addr = self
            .addr
            .unwrap_or_else(|| SocketAddr::from((Ipv4Addr::LOCALHOST, free_port())));
        let mut server = JavaEureka {
            label: label.to_owned(),
            addr,
            config: self,
            process: None,
            stdin: None,
            starts: 0,
        };
        server.spawn(env);
        server
    }
}

/// A Spring Cloud Netflix Eureka server (Spring Boot 4.0, spring-cloud-netflix 5.0, Eureka
/// 2.0) on a loopback port, killed when dropped. Started with test settings, each a Spring
/// property (see [`JavaEureka::args`]): no self-preservation, eviction every second, no
/// read-only response cache, one start-up
/// copy of the peers' registry without retries, peers given 5 s to answer.
pub struct JavaEureka {
    label: String,
    addr: SocketAddr,
    config: JavaEurekaBuilder,
    process: Option<ChildGuard>,
    /// The server stops when this pipe closes, even if the test was killed.
    stdin: Option<ChildStdin>,
    starts: usize,
}

impl JavaEureka {
    /// How to start a server with options.
    pub fn builder() -> JavaEurekaBuilder {
        JavaEurekaBuilder::default()
    }

    /// Starts one standalone server, without authentication, on a free port.
    pub fn start(env: &TestEnv, label: &str) -> JavaEureka {
        JavaEureka::builder().start(env, label)
    }

    /// Starts `n` peered servers, `<label>-1` to `<label>-<n>`, on free ports, each replicating
    /// with all the others; they start side by side, and this returns once all serve.
    pub fn start_peered(env: &TestEnv, label: &str, n: usize) -> Vec<JavaEureka> {
        let addrs = reserve_addrs(n);
        let urls: Vec<String> = (addrs.iter())
            .map(|addr| service_url(*addr, None))
            .collect();
        let mut nodes: Vec<JavaEureka> = (addrs.iter().enumerate())
            .map(|(i, addr)| {
                let others: Vec<String> = (urls.iter().enumerate())
                    .filter(|(j, _)| *j != i)
                    .map(|(_, url)| url.clone())
                    .collect();
                let node = JavaEureka::builder().addr(*addr).peers(&others);
                node.spawn(env, &format!("{label}-{}", i + 1))
            })
            .collect();
        for node in &mut nodes {
            node.wait_serving();
        }
        nodes
    }

    /// Its address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its service URL as clients and peers take it, `http://127.0.0.1:<port>/eureka`, with
    /// `user:password@` when basic auth is on.
    pub fn url(&self) -> String {
        service_url(self.addr, self.config.basic_auth.as_ref())
    }

    /// Its REST API, with its credentials when basic auth is on.
    pub fn api(&self) -> EurekaApi {
        match &self.config.basic_auth {
            Some((user, password)) => EurekaApi::with_basic_auth(self.addr, user, password),
            None => EurekaApi::new(self.addr),
        }
    }

    /// `GET /eureka/apps` as JSON (with its credentials); panics unless it answers 200.
    pub fn apps(&self) -> Value {
        self.api().apps()
    }

    /// The process (its log, its exit status); panics after [`JavaEureka::kill`].
    pub fn process(&self) -> &ChildGuard {
        self.process
            .as_ref()
            .unwrap_or_else(|| panic!("{} is not running", self.label))
    }

    /// Everything the current process has logged (`<label>.log`, `<label>-<n>.log` after
    /// the n-th start).
    pub fn log(&self) -> String {
        self.process().log()
    }

    /// Kills the JVM with SIGKILL, as a crash would, and reaps it.
    pub fn kill(&mut self) {
        if let Some(process) = self.process.as_mut() {
            process.kill();
        }
        self.stdin = None;
    }

    /// Starts the server again on the same port with the same settings, after
    /// [`JavaEureka::kill`] (kills it first if it still runs), and waits until it serves. The
    /// n-th start logs to `<label>-<n>.log`. A restarted server is empty until its clients
    /// register again or, with peers, until it has copied their registries.
    pub fn restart(&mut self, env: &TestEnv) {
        self.kill();
        self.spawn(env);
        self.wait_serving();
    }

    fn spawn(&mut self, env: &TestEnv) {
        self.starts += 1;
        let label = match self.starts {
            1 => self.label.clone(),
            n => format!("{}-{n}", self.label),
        };
        let mut command = command(&jar("eureka-server.jar"), SERVER_HEAP_MB);
        command.args(self.args());
        let (process, stdin) = env.spawn_interactive(&label, command);
        self.process = Some(process);
        self.stdin = Some(stdin);
    }

    /// The server's command-line properties: the harness's test settings and the builder's.
    fn args(&self) -> Vec<String> {
        let peered = !self.config.peers.is_empty();
        let me = service_url(self.addr, self.config.basic_auth.as_ref());
        let mut properties: Vec<(&str, String)> = vec![
            ("server.port", self.addr.port().to_string()),
            ("server.address", self.addr.ip().to_string()),
            ("odmesh.test.exit-on-stdin-eof", "true".into()),
            ("eureka.dashboard.enabled", "false".into()),
            // Its own instance (as a peer) is named localhost, its URLs 127.0.0.1: Eureka
            // compares the host of each peer URL with its own hostname to skip itself, and
            // every node here has the same host. my-url names this node exactly instead.
            ("eureka.instance.hostname", "localhost".into()),
            ("eureka.server.my-url", format!("{me}/")),
            // As a peer it registers itself: at loopback, not at the machine's own address.
            ("eureka.instance.ip-address", self.addr.ip().to_string()),
            (
                "eureka.instance.instance-id",
                format!("{}:eureka:{}", self.addr.ip(), self.addr.port()),
            ),
            ("eureka.server.enable-self-preservation", "false".into()),
            ("eureka.server.eviction-interval-timer-in-ms", "1000".into()),
            // Without self-preservation this only caps how many expired leases one eviction
            // run removes: 85% by default keeps some for the next runs; 10% lets one run
            // take almost all.
            ("eureka.server.renewal-percent-threshold", "0.1".into()),
            // Reads come from the read-write cache, which every write invalidates...
            ("eureka.server.use-read-only-response-cache", "false".into()),
            // ...but a read built while a write lands can be cached after the write's
            // invalidation (Guava's invalidate does not stop a load in flight), stale
            // until it expires, 180 s by default: this bounds it.
            (
                "eureka.server.response-cache-auto-expiration-in-seconds",
                "1".into(),
            ),
            // Peers: a (re)started node copies its peers' registry once, without the 30 s
            // waits between Spring's 5 tries that an empty copy costs (~2 min when all
            // start together); no wait either for an empty copy; and 5 s to answer a
            // replication instead of 200 ms on a busy machine.
            ("eureka.server.registry-sync-retries", "1".into()),
            ("eureka.server.wait-time-in-ms-when-sync-empty", "0".into()),
            ("eureka.server.peer-node-read-timeout-ms", "5000".into()),
            ("eureka.server.peer-node-connect-timeout-ms", "5000".into()),
            ("eureka.client.register-with-eureka", peered.to_string()),
            ("eureka.client.fetch-registry", peered.to_string()),
        ];
        if peered {
            properties.push((
                "eureka.client.service-url.defaultZone",
                self.config.peers.join(","),
            ));
        }
        if let Some((user, password)) = &self.config.basic_auth {
            properties.push(("odmesh.test.basic-auth", format!("{user}:{password}")));
        }
        (properties.iter())
            .map(|(name, value)| format!("--{name}={value}"))
            .collect()
    }

    /// Waits until `GET /eureka/apps` answers 200; panics if the JVM exits first.
    fn wait_serving(&mut self) {
        let started = Instant::now();
        let api = self.api();
        let addr = self.addr;
        let label = self.label.clone();
        let process = (self.process.as_mut()).unwrap_or_else(|| panic!("{label} was not started"));
        let what = format!(
            "{} to answer GET /eureka/apps at {addr} (its log: {})",
            process.label(),
            process.log_path().display()
        );
        wait_for(JVM_START_TIMEOUT, &what, || {
            if let Some(status) = process.exit_status() {
                panic!(
                    "{} exited ({status}) before it served:\n{}",
                    process.label(),
                    process.log()
                );
            }
            let request = Request::get("/eureka/apps")
                .host(&addr.to_string())
                .header("accept", "application/json");
            let request = api.authorize(request);
            let answer = request.try_send(addr).ok()?;
            (answer.status == 200).then_some(())
        });
        eprintln!("{label}: serving after {:?}", started.elapsed());
    }
}

/// `http://[user:password@]<addr>/eureka`.
fn service_url(addr: SocketAddr, basic_auth: Option<&(String, String)>) -> String {
    match basic_auth {
        Some((user, password)) => format!("http://{user}:{password}@{addr}/eureka"),
        None => format!("http://{addr}/eureka"),
    }
}
