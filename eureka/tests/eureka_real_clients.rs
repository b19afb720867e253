//! Real, unmodified Eureka clients against odmesh's embedded registry: npm `eureka-js-client`
//! (registers JSON, reads JSON) and PyPI `py-eureka-client` (registers JSON, reads XML),
//! driven by `tests/clients/*/register.*` in child processes.
//!
//! Each client registers a real HTTP server, heartbeats, is set OUT_OF_SERVICE and back,
//! registers again after an operator removed it (its heartbeat got 404), and stops
//! (cancel); a second instance is killed and its lease expires.
//!
//! The clients come from `scripts/install-eureka-clients.sh` (into `.tools/eureka-clients/`).
//! When they are missing these tests FAIL and say how to install them; there is no skip.

mod eureka_support;

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use eureka_support::{DEADLINE, find, http, wait_registry};
use odmesh_base::testing::wait_ok;
use odmesh_eureka::ServerMetrics;
use odmesh_eureka::server::{self, EmbeddedSource, ServerConfig};
use odmesh_registry::Status;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;

/// Short leases and heartbeats so that the whole life of an instance fits in seconds.
const LEASE_SECS: u64 = 3;
const HEARTBEAT_SECS: u64 = 1;

#[derive(Clone, Copy, Debug)]
enum Kind {
    Js,
    Python,
}

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("eureka/ is in the repository")
        .to_owned()
}

fn tools() -> PathBuf {
    repo_root().join(".tools/eureka-clients")
}

/// Panics, saying how to install them, when the client or its runtime is missing.
fn require_installed(kind: Kind) {
    let (installed, runtime) = match kind {
        Kind::Js => (tools().join("node/node_modules/eureka-js-client"), "node"),
        Kind::Python => (tools().join("python/py_eureka_client"), "python3"),
    };
    assert!(
        installed.is_dir(),
        "{} is missing: run scripts/install-eureka-clients.sh (needs npm and pip and the \
         registries)",
        installed.display()
    );
    let found = std::process::Command::new(runtime)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        found,
        "`{runtime}` is not on PATH; it runs the {kind:?} Eureka client"
    );
}

/// One client process and what it printed.
struct Driver {
    name: String,
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::UnboundedReceiver<String>,
    output: Arc<Mutex<String>>,
}

impl Driver {
    fn spawn(kind: Kind, registry: &EmbeddedSource, app: &str, id: &str) -> Driver {
        let clients = repo_root().join("eureka/tests/clients");
        let addr = registry.local_addr;
        let mut cmd = match kind {
            Kind::Js => {
                let mut c = Command::new("node");
                c.arg(clients.join("eureka-js-client/register.js"))
                    .env("NODE_PATH", tools().join("node/node_modules"))
                    .env("EUREKA_HOST", addr.ip().to_string())
                    .env("EUREKA_PORT", addr.port().to_string())
                    .env("HEARTBEAT_MS", (HEARTBEAT_SECS * 1000).to_string());
                c
            }
            Kind::Python => {
                let mut c = Command::new("python3");
                c.arg("-u")
                    .arg(clients.join("py-eureka-client/register.py"))
                    .env("PYTHONPATH", tools().join("python"))
                    .env("EUREKA_URL", format!("http://{addr}/eureka"))
                    .env("HEARTBEAT_SECS", HEARTBEAT_SECS.to_string());
                c
            }
        };
        cmd.env("APP", app)
            .env("INSTANCE_ID", id)
            .env("VIP", app)
            .env("LEASE_SECS", LEASE_SECS.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd.spawn().expect("client process starts");
        let stdin = child.stdin.take().unwrap();
        let output = Arc::new(Mutex::new(String::new()));
        let (tx, lines) = mpsc::unbounded_channel();
        let stdout = child.stdout.take().unwrap();
        let stderr = child.stderr.take().unwrap();
        let out = output.clone();
        tokio::spawn(async move {
            let mut rd = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = rd.next_line().await {
                out.lock().unwrap().push_str(&format!("{line}\n"));
                if let Some(report) = line.strip_prefix("odmesh-driver: ") {
                    let _ = tx.send(report.to_owned());
                }
            }
        });
        let err = output.clone();
        tokio::spawn(async move {
            let mut rd = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = rd.next_line().await {
                err.lock().unwrap().push_str(&format!("stderr: {line}\n"));
            }
        });
        Driver {
            name: format!("{kind:?} client {id}"),
            child,
            stdin,
            lines,
            output,
        }
    }

    /// Waits for a report starting with `prefix`; returns it.
    async fn expect(&mut self, prefix: &str) -> String {
        let deadline = tokio::time::Instant::now() + DEADLINE;
        loop {
            match tokio::time::timeout_at(deadline, self.lines.recv()).await {
                Ok(Some(line)) if line.starts_with(prefix) => return line,
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => panic!(
                    "{}: no report {prefix:?} within {DEADLINE:?}; its output:\n{}",
                    self.name,
                    self.output.lock().unwrap()
                ),
            }
        }
    }

    async fn send(&mut self, command: &str) {
        self.stdin
            .write_all(format!("{command}\n").as_bytes())
            .await
            .unwrap_or_else(|e| panic!("{}: cannot send {command}: {e}", self.name));
        self.stdin.flush().await.unwrap();
    }

    fn output(&self) -> String {
        self.output.lock().unwrap().clone()
    }
}

async fn start_registry() -> (EmbeddedSource, Arc<ServerMetrics>) {
    let metrics = Arc::new(ServerMetrics::default());
    let config = ServerConfig {
        lease_duration: Duration::from_secs(LEASE_SECS),
        eviction_interval: Duration::from_millis(200),
        // The clients run on this machine.
        ..ServerConfig::local()
    };
    let source = server::start(
        "127.0.0.1:0".parse().unwrap(),
        config,
        None,
        Arc::default(),
        metrics.clone(),
    )
    .await
    .unwrap();
    (source, metrics)
}

/// The whole life of one client's instances in the embedded registry.
async fn a_real_client_registers_heartbeats_drains_reregisters_stops_and_expires(kind: Kind) {
    require_installed(kind);
    let (registry, metrics) = start_registry().await;
    let app = match kind {
        Kind::Js => "jsdemo",
        Kind::Python => "pydemo",
    };
    let app_upper = app.to_ascii_uppercase();
    let base = format!("http://{}/eureka", registry.local_addr);
    let rx = registry.registry.clone();

    // Register: the instance is published UP, on the VIP, with the port the client serves.
    let id = format!("{app}-1");
    let spawned = Instant::now();
    let mut driver = Driver::spawn(kind, &registry, app, &id);
    let port: u16 = driver.expect("listening ").await["listening ".len()..]
        .parse()
        .unwrap();
    let reg = wait_registry(&rx, &format!("{id} registered"), DEADLINE, |r| {
        find(r, &id).is_some_and(|i| i.status == Status::Up)
    })
    .await;
    println!(
        "{kind:?}: process start to published registration: {:?}",
        spawned.elapsed()
    );
    let inst = find(&reg, &id).unwrap();
    assert_eq!(inst.vips, [app].map(Arc::<str>::from));
    assert_eq!(inst.port, Some(port));
    assert_eq!(inst.ip.to_string(), "127.0.0.1");
    // The client read the registry back (JS: JSON, Python: XML) and found itself UP.
    driver.expect("discovered 1").await;

    // Heartbeats renew the lease past its duration.
    let renewals = metrics.eureka_renewals_total.load(Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs(LEASE_SECS + 1)).await;
    assert!(metrics.eureka_renewals_total.load(Ordering::Relaxed) >= renewals + 2);
    assert!(
        find(&rx.borrow(), &id).is_some(),
        "{} expired despite heartbeats:\n{}",
        driver.name,
        driver.output()
    );

    // OUT_OF_SERVICE drains it: no longer UP, so no endpoint; then back in service.
    driver.send("out_of_service").await;
    let drained = Instant::now();
    wait_registry(&rx, &format!("{id} OUT_OF_SERVICE"), DEADLINE, |r| {
        find(r, &id).is_some_and(|i| i.status == Status::OutOfService)
    })
    .await;
    println!(
        "{kind:?}: status command to published OUT_OF_SERVICE: {:?}",
        drained.elapsed()
    );
    if let Kind::Js = kind {
        // Its delta fetch saw the change (it keeps UP instances only).
        driver.expect("discovered 0").await;
    }
    driver.send("in_service").await;
    wait_registry(&rx, &format!("{id} back UP"), DEADLINE, |r| {
        find(r, &id).is_some_and(|i| i.status == Status::Up)
    })
    .await;

    // An operator removes it: its next heartbeat gets 404 and it registers again.
    let (status, _) = http("DELETE", &format!("{base}/apps/{app_upper}/{id}"), None).await;
    assert_eq!(status, 200);
    // The removal is published at once (the client's next heartbeat is a second away).
    wait_registry(&rx, &format!("{id} removed"), DEADLINE, |r| {
        find(r, &id).is_none()
    })
    .await;
    wait_registry(
        &rx,
        &format!("{id} registered again after a 404 heartbeat"),
        DEADLINE,
        |r| find(r, &id).is_some_and(|i| i.status == Status::Up),
    )
    .await;
    assert!(
        metrics
            .eureka_renewals_not_found_total
            .load(Ordering::Relaxed)
            >= 1
    );
    // Let it heartbeat normally again before the next step: py-eureka-client 0.13.3 retries
    // a failed call under an asyncio lock shared between its heartbeat thread's event loop
    // and the application's, which can deadlock a call (here: stop) made in that window.
    let renewals = metrics.eureka_renewals_total.load(Ordering::Relaxed);
    let what = format!("{}: two heartbeats after registering again", driver.name);
    wait_ok(DEADLINE, &what, async || {
        let renewed = metrics.eureka_renewals_total.load(Ordering::Relaxed) - renewals;
        if renewed >= 2 {
            return Ok(());
        }
        Err(format!(
            "{renewed} heartbeats; its output:\n{}",
            driver.output()
        ))
    })
    .await;

    // Stop: the client cancels its registration.
    driver.send("stop").await;
    driver.expect("stopped").await;
    wait_registry(&rx, &format!("{id} cancelled"), DEADLINE, |r| {
        find(r, &id).is_none()
    })
    .await;
    assert!(metrics.eureka_cancels_total.load(Ordering::Relaxed) >= 2);
    let status = tokio::time::timeout(DEADLINE, driver.child.wait()).await;
    assert!(
        matches!(status, Ok(Ok(s)) if s.success()),
        "{}: {status:?}\n{}",
        driver.name,
        driver.output()
    );

    // A client killed without cancelling: its lease expires and it leaves the VIP.
    let id2 = format!("{app}-2");
    let mut doomed = Driver::spawn(kind, &registry, app, &id2);
    wait_registry(&rx, &format!("{id2} registered"), DEADLINE, |r| {
        find(r, &id2).is_some()
    })
    .await;
    doomed.child.kill().await.unwrap();
    let killed = Instant::now();
    let evictions = metrics.eureka_evictions_total.load(Ordering::Relaxed);
    let reg = wait_registry(&rx, &format!("{id2} expired"), DEADLINE, |r| {
        find(r, &id2).is_none()
    })
    .await;
    println!(
        "{kind:?}: killed to evicted: {:?} (lease {LEASE_SECS} s)",
        killed.elapsed()
    );
    assert_eq!(
        metrics.eureka_evictions_total.load(Ordering::Relaxed),
        evictions + 1
    );
    assert!(reg.instances().all(|i| !i.vips.iter().any(|v| **v == *app)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn npm_eureka_js_client_registers_heartbeats_drains_reregisters_stops_and_expires() {
    a_real_client_registers_heartbeats_drains_reregisters_stops_and_expires(Kind::Js).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pypi_py_eureka_client_registers_heartbeats_drains_reregisters_stops_and_expires() {
    a_real_client_registers_heartbeats_drains_reregisters_stops_and_expires(Kind::Python).await;
}
