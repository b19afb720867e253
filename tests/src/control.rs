//! The control plane, `odmesh-control`, as a child process: started on free loopback ports
//! with a registry [`Source`] (a file, its embedded Eureka registry alone or peered with
//! others, or Eureka servers to follow), ready once its admin `/readyz` says so, and read through its admin endpoint
//! (`/readyz`, `/metrics`, `/debug/proxies`, `/debug/registry`).

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::http::{Request, Response};
use crate::paths::{control_binary, free_port};
use crate::process::{ChildGuard, TestEnv};
use crate::wait::wait_for;

/// How long the control plane may take to load its registry and serve.
pub const START_TIMEOUT: Duration = Duration::from_secs(10);

/// How often [`ControlPlane::start`] tries new ports when another process took the free
/// ones first.
const PORT_ATTEMPTS: usize = 3;

/// Where the control plane gets its registry from.
#[derive(Clone, Debug)]
pub enum Source {
    /// `--registry FILE`.
    File(PathBuf),
    /// `--serve-eureka 127.0.0.1:<free port>`: it is the registry, and Eureka clients register
    /// with it ([`ControlPlane::eureka_url`]).
    ServeEureka,
    /// `--eureka URL` for each URL (e.g. `http://127.0.0.1:8761/eureka`), tried in turn.
    Eureka(Vec<String>),
    /// `--serve-eureka <addr> --peer URL ...`: one node of a replicated embedded registry,
    /// on an address reserved before it starts (its peers need it first; see
    /// [`crate::peers`]), replicating with the Eureka servers at `peers`.
    Peer {
        /// Where its embedded registry listens.
        addr: SocketAddr,
        /// Its peers' Eureka URLs, e.g. `http://127.0.0.1:8762/eureka`.
        peers: Vec<String>,
    },
}

impl Source {
    /// The source's command line arguments; `eureka` is the address `ServeEureka` binds.
    fn args(&self, eureka: Option<SocketAddr>) -> Vec<OsString> {
        match self {
            Source::File(path) => vec!["--registry".into(), path.into()],
            // The test's services register at 127.0.0.1, which a production registry refuses.
            Source::ServeEureka => {
                let addr = eureka.map(|a| a.to_string()).unwrap_or_default();
                vec![
                    "--serve-eureka".into(),
                    addr.into(),
                    "--allow-loopback-instances".into(),
                ]
            }
            Source::Eureka(urls) => urls
                .iter()
                .flat_map(|url| ["--eureka".into(), url.into()])
                .collect(),
            Source::Peer { addr, peers } => {
                let mut args: Vec<OsString> = vec![
                    "--serve-eureka".into(),
                    addr.to_string().into(),
                    "--allow-loopback-instances".into(),
                ];
                for url in peers {
                    args.extend(["--peer".into(), url.into()]);
                }
                args
            }
        }
    }

    /// The address the embedded registry binds: a free port for `ServeEureka`, the given
    /// one for `Peer`.
    fn eureka_addr(&self) -> Option<SocketAddr> {
        match self {
            Source::ServeEureka => Some(loopback(free_port())),
            Source::Peer { addr, .. } => Some(*addr),
            Source::File(_) | Source::Eureka(_) => None,
        }
    }
}

/// How often, in seconds, a follower ([`Source::Eureka`]) polls its Eureka servers unless
/// a test says otherwise (`--eureka-interval`): a change reaches Envoy well within a test's
/// bounds.
pub const EUREKA_INTERVAL: &str = "0.5";

/// A running `odmesh-control`, killed when dropped.
pub struct ControlPlane {
    process: Option<ChildGuard>,
    source: Source,
    args: Vec<String>,
    xds: SocketAddr,
    admin: SocketAddr,
    eureka: Option<SocketAddr>,
    starts: usize,
}

impl ControlPlane {
    /// Starts `odmesh-control --registry <registry>` plus `extra_args` on free loopback ports
    /// for xDS and admin, and waits until `/readyz` answers 200. Its log is `<label>.log`.
    pub fn start(env: &TestEnv, label: &str, registry: &Path, extra_args: &[&str]) -> Self {
        ControlPlane::start_source(env, label, Source::File(registry.to_owned()), extra_args)
    }

    /// Starts `odmesh-control` on `source` plus `extra_args` (e.g. `--registry-warmup 30`) on
    /// free loopback ports for xDS, admin and (for [`Source::ServeEureka`]) the embedded
    /// registry, and waits until `/readyz` answers 200. Its log is `<label>.log`.
    ///
    /// Unless `extra_args` say otherwise, its prewarm history is `<label>-prewarm.json` in the
    /// test's folder (kept across [`ControlPlane::restart`]s; never the working folder),
    /// proxies report their load every second, and a follower ([`Source::Eureka`]) polls
    /// every [`EUREKA_INTERVAL`] seconds.
    pub fn start_source(env: &TestEnv, label: &str, source: Source, extra_args: &[&str]) -> Self {
        let mut args: Vec<String> = extra_args.iter().map(|a| (*a).to_owned()).collect();
        let given = |flag: &str| extra_args.contains(&flag);
        if !given("--prewarm-history") && !given("--no-prewarm") {
            let history = env.log_dir().join(format!("{label}-prewarm.json"));
            args.extend(["--prewarm-history".into(), history.display().to_string()]);
        }
        if !given("--load-report-interval") {
            args.extend(["--load-report-interval".into(), "1".into()]);
        }
        if matches!(source, Source::Eureka(_)) && !given("--eureka-interval") {
            args.extend(["--eureka-interval".into(), EUREKA_INTERVAL.into()]);
        }
        let mut last_log = String::new();
        for attempt in 1..=PORT_ATTEMPTS {
            let xds = loopback(free_port());
            let admin = loopback(free_port());
            let eureka = source.eureka_addr();
            let label = if attempt == 1 {
                label.to_owned()
            } else {
                format!("{label}-attempt{attempt}")
            };
            let source_args = source.args(eureka);
            match spawn(env, &label, &source_args, &args, xds, admin, "/readyz") {
                Ok(process) => {
                    return ControlPlane {
                        process: Some(process),
                        source,
                        args,
                        xds,
                        admin,
                        eureka,
                        starts: 1,
                    };
                }
                Err(log) if log.contains("cannot listen") => last_log = log,
                Err(log) => panic!("{label} exited before it was ready; log:\n{log}"),
            }
        }
        panic!("the control plane found no free ports in {PORT_ATTEMPTS} attempts:\n{last_log}")
    }

    /// The latest process started (its log, its memory; after [`ControlPlane::kill`], the
    /// killed one).
    pub fn process(&self) -> &ChildGuard {
        match &self.process {
            Some(process) => process,
            None => panic!("the control plane is not running"),
        }
    }

    /// The xDS (gRPC) address.
    pub fn xds(&self) -> SocketAddr {
        self.xds
    }

    /// The admin HTTP address.
    pub fn admin(&self) -> SocketAddr {
        self.admin
    }

    /// `/debug/prewarm`: per calling service, what a connecting proxy is sent ahead.
    pub fn prewarm(&self) -> Value {
        self.admin_get("/debug/prewarm").json()
    }

    /// The embedded Eureka registry's address; panics unless started with
    /// [`Source::ServeEureka`].
    pub fn eureka_addr(&self) -> SocketAddr {
        self.eureka
            .unwrap_or_else(|| panic!("this control plane serves no Eureka registry"))
    }

    /// The embedded Eureka registry's service URL, `http://127.0.0.1:<port>/eureka`, as
    /// Eureka clients and `--eureka` take it.
    pub fn eureka_url(&self) -> String {
        format!("http://{}/eureka", self.eureka_addr())
    }

    /// Kills the process with SIGKILL, as a crash would, and reaps it.
    pub fn kill(&mut self) {
        if let Some(process) = self.process.as_mut() {
            process.kill();
        }
    }

    /// Sends the running process SIGHUP: it reads its TLS files and tokens file again.
    pub fn hangup(&self) {
        let pid = self.process().id().to_string();
        let status = Command::new("kill")
            .args(["-HUP", &pid])
            .status()
            .unwrap_or_else(|e| panic!("cannot run kill -HUP {pid}: {e}"));
        assert!(status.success(), "kill -HUP {pid}: {status}");
    }

    /// Starts the control plane again, with the same source, arguments and addresses,
    /// after [`ControlPlane::kill`]; the log of the n-th start is `<label>-<n>.log`.
    pub fn restart(&mut self, env: &TestEnv, label: &str) {
        self.restart_until(env, label, "/readyz", &[]);
    }

    /// [`ControlPlane::restart`] on another `source`, on the same xDS and admin addresses (e.g.
    /// a `--eureka` URL with new credentials, as an operator restarts it with a corrected
    /// configuration); a [`Source::ServeEureka`] gets a new free port. Later restarts keep it.
    pub fn restart_on(&mut self, env: &TestEnv, label: &str, source: Source) {
        self.eureka = source.eureka_addr();
        self.source = source;
        self.restart(env, label);
    }

    /// [`ControlPlane::restart`], but waiting only until the admin serves (`/healthz`), not
    /// until the registry is loaded: for a restart while the registry source is down.
    pub fn restart_unready(&mut self, env: &TestEnv, label: &str) {
        self.restart_until(env, label, "/healthz", &[]);
    }

    /// [`ControlPlane::restart_unready`] with `extra_args` added for this start only (e.g.
    /// `--registry-warmup 30`, to see whether a restarted node of peers warms up).
    pub fn restart_with(&mut self, env: &TestEnv, label: &str, extra_args: &[&str]) {
        self.restart_until(env, label, "/healthz", extra_args);
    }

    fn restart_until(&mut self, env: &TestEnv, label: &str, ready: &str, extra_args: &[&str]) {
        self.kill();
        self.starts += 1;
        let label = format!("{label}-{}", self.starts);
        let source_args = self.source.args(self.eureka);
        let mut args = self.args.clone();
        args.extend(extra_args.iter().map(|a| (*a).to_owned()));
        let spawned = spawn(
            env,
            &label,
            &source_args,
            &args,
            self.xds,
            self.admin,
            ready,
        );
        match spawned {
            Ok(process) => self.process = Some(process),
            Err(log) => panic!(
                "{label} did not start again on xDS {} and admin {}; log:\n{log}",
                self.xds, self.admin
            ),
        }
    }

    /// `GET path` on the admin endpoint; panics if it does not answer.
    pub fn admin_get(&self, path: &str) -> Response {
        Request::get(path).host("admin").send(self.admin)
    }

    /// `GET path` on the admin endpoint, or `None` if it does not answer (a killed process).
    pub fn try_admin_get(&self, path: &str) -> Option<Response> {
        Request::get(path).host("admin").try_send(self.admin).ok()
    }

    /// Every count in `/metrics`, by series (`odmesh_xds_acks_total{type="cluster"}`), and
    /// each labelled family's sum by its bare name (`odmesh_xds_acks_total`). Histograms'
    /// sums, which are not counts, are left out.
    pub fn metrics(&self) -> BTreeMap<String, u64> {
        let mut metrics = BTreeMap::new();
        let text = self.admin_get("/metrics").text();
        let samples = (text.lines().filter(|line| !line.starts_with('#')))
            .filter_map(|line| line.rsplit_once(' '))
            .filter_map(|(series, value)| Some((series, value.trim().parse::<u64>().ok()?)));
        for (series, value) in samples {
            if let Some((family, _labels)) = series.split_once('{') {
                *metrics.entry(family.to_owned()).or_default() += value;
            }
            metrics.insert(series.to_owned(), value);
        }
        metrics
    }

    /// The value of the Prometheus metric `name` (e.g. `odmesh_xds_nacks_total`); panics if
    /// `/metrics` has no such metric.
    pub fn metric(&self, name: &str) -> u64 {
        let mut metrics = self.metrics();
        metrics
            .remove(name)
            .unwrap_or_else(|| panic!("the control plane's /metrics has no {name}: {metrics:?}"))
    }

    /// Waits until Envoy has answered (ACK or NACK) every xDS response the control plane
    /// sent, so that counters read next do not race an answer on its way; returns the
    /// metrics then.
    pub fn wait_all_answered(&self, timeout: Duration) -> BTreeMap<String, u64> {
        wait_for(timeout, "Envoy to answer every xDS response", || {
            let m = self.metrics();
            let answered = m.get("odmesh_xds_acks_total")? + m.get("odmesh_xds_nacks_total")?;
            (answered == *m.get("odmesh_xds_responses_total")?).then_some(m)
        })
    }

    /// `/debug/proxies`: one object per xDS stream (node_id, clusters, endpoints, acks,
    /// nacks, last_nack).
    pub fn proxies(&self) -> Vec<Value> {
        match self.admin_get("/debug/proxies").json() {
            Value::Array(proxies) => proxies,
            other => panic!("/debug/proxies is not a JSON list: {other}"),
        }
    }

    /// The cluster names the proxies subscribed, over all streams, sorted, with repeats (a
    /// name subscribed on two streams shows twice).
    pub fn subscribed_clusters(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .proxies()
            .iter()
            .flat_map(|p| p["clusters"].as_array().cloned().unwrap_or_default())
            .filter_map(|c| c.as_str().map(str::to_owned))
            .collect();
        names.sort();
        names
    }

    /// `/readyz` as JSON, `{"ready": bool, "registry": {...}}`, whatever its status code.
    pub fn readyz(&self) -> Value {
        self.admin_get("/readyz").json()
    }

    /// `/debug/registry`: `{"source": {...}, "registry": {...}}`.
    pub fn debug_registry(&self) -> Value {
        self.admin_get("/debug/registry").json()
    }
}

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, port))
}

/// Starts the process and waits until the admin `ready` path answers 200; `Err(log)` if it
/// exits first.
fn spawn(
    env: &TestEnv,
    label: &str,
    source_args: &[OsString],
    args: &[String],
    xds: SocketAddr,
    admin: SocketAddr,
    ready: &str,
) -> Result<ChildGuard, String> {
    let mut command = Command::new(control_binary());
    command
        .args(source_args)
        .arg("--xds")
        .arg(xds.to_string())
        .arg("--admin")
        .arg(admin.to_string())
        .args(args);
    // A fresh embedded registry is complete at once unless the test is about its warm-up
    // after a restart (and says --registry-warmup): otherwise a VIP not registered yet would
    // answer "not known yet" for the first 35 s of every test.
    let embedded = source_args.iter().any(|a| a == "--serve-eureka");
    if embedded && !args.iter().any(|a| a == "--registry-warmup") {
        command.args(["--registry-warmup", "0"]);
    }
    if std::env::var_os("RUST_LOG").is_none() {
        command.env("RUST_LOG", "info");
    }
    let mut process = env.spawn(label, command);
    let what = format!("{label} to be ready (admin {ready} at {admin} answers 200)");
    let exited = wait_for(START_TIMEOUT, &what, || {
        if process.exit_status().is_some() {
            return Some(true);
        }
        let answer = Request::get(ready).host("admin").try_send(admin).ok()?;
        (answer.status == 200).then_some(false)
    });
    if exited {
        Err(process.log())
    } else {
        Ok(process)
    }
}
