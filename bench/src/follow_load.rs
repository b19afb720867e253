//! `odmesh-bench follow-load`: the Eureka follower at scale. Starts `eureka-serve` (this
//! binary) with `--instances N`, then `odmesh-control --eureka URL` on it, and measures from
//! `/proc` and the control plane's `/metrics`:
//!
//! - the time from the control plane's start to its first complete registry (N instances),
//!   its RSS then and its peak;
//! - after `--full-fetches` more full fetches (the delta answers 404 meanwhile): RSS and peak;
//! - after the server starts changing (1% of the instances per round, a round per poll
//!   interval) and `--deltas` deltas were applied: RSS and peak, and how many deltas did not
//!   match the server's hash code.
//!
//! With `--peer-fill` the control plane is an embedded registry (`--serve-eureka --peer URL`)
//! that fills itself from the server's `/apps` at start; only the first phase applies.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use serde_json::{Value, json};

use crate::http1::Conn;
use crate::procstat::rss_bytes;

#[derive(Debug, Parser)]
pub struct FollowArgs {
    /// The odmesh-control binary.
    #[arg(long, default_value = "target/release/odmesh-control")]
    pub control: PathBuf,
    /// Instances the server holds (10 per app).
    #[arg(long, default_value_t = 100_000)]
    pub instances: usize,
    /// An embedded registry filling from the server as its peer, instead of a follower.
    #[arg(long)]
    pub peer_fill: bool,
    /// Full fetches to wait for after the first.
    #[arg(long, default_value_t = 3)]
    pub full_fetches: u64,
    /// Deltas to wait for once the server changes.
    #[arg(long, default_value_t = 3)]
    pub deltas: u64,
    /// `--eureka-interval` (seconds), and the time between two rounds of changes.
    #[arg(long, default_value_t = 1.0)]
    pub interval: f64,
    /// The longest wait for each phase, in seconds.
    #[arg(long, default_value_t = 600.0)]
    pub timeout: f64,
    /// One more flag for odmesh-control (repeatable), e.g. `--control-arg=--eureka-max-answer=1000`.
    #[arg(long = "control-arg", allow_hyphen_values = true)]
    pub control_args: Vec<String>,
}

/// Kills its child when dropped.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// The control plane's metrics, by name (every one is a count).
async fn metrics(admin: &str) -> anyhow::Result<HashMap<String, u64>> {
    let mut conn = Conn::connect(admin).await?;
    let (status, body) = conn.request("GET", "/metrics", b"").await?;
    if status != 200 {
        bail!("/metrics answered {status}");
    }
    Ok(String::from_utf8_lossy(&body)
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once(' '))
        .filter_map(|(k, v)| Some((k.to_owned(), v.trim().parse::<f64>().ok()? as u64)))
        .collect())
}

struct Watched {
    control: Killed,
    admin: String,
    log: PathBuf,
    started: Instant,
}

impl Watched {
    fn memory(&self) -> Value {
        let (rss, peak) = rss_bytes(self.control.0.id()).unwrap_or((0, 0));
        json!({"rss_bytes": rss, "peak_rss_bytes": peak})
    }

    /// Polls the metrics every 100 ms until `done` says so; fails when the control plane
    /// exits or `timeout` passes, with its last metrics and log.
    async fn until(
        &mut self,
        what: &str,
        timeout: Duration,
        mut done: impl FnMut(&HashMap<String, u64>) -> bool,
    ) -> anyhow::Result<HashMap<String, u64>> {
        let deadline = Instant::now() + timeout;
        let mut last = HashMap::new();
        loop {
            if let Some(status) = self.control.0.try_wait()? {
                bail!(
                    "{what}: the control plane exited ({status}); {}",
                    self.tail()
                );
            }
            if let Ok(m) = metrics(&self.admin).await {
                if done(&m) {
                    return Ok(m);
                }
                last = m;
            }
            if Instant::now() > deadline {
                let errors = last.get("odmesh_eureka_fetch_errors_total").copied();
                bail!(
                    "{what}: not within {timeout:?} (instances {:?}, fetch errors {errors:?}); {}",
                    last.get("odmesh_registry_instances"),
                    self.tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn tail(&self) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let start = log.len().saturating_sub(1500);
        let start = (start..log.len())
            .find(|&i| log.is_char_boundary(i))
            .unwrap_or(log.len());
        format!("log {}: ...{}", self.log.display(), &log[start..])
    }
}

fn count(m: &HashMap<String, u64>, name: &str) -> u64 {
    m.get(name).copied().unwrap_or(0)
}

pub async fn run(a: FollowArgs) -> anyhow::Result<()> {
    let exe = std::env::current_exe()?;
    let mut server = Killed(
        Command::new(exe)
            .args(["eureka-serve", "--instances", &a.instances.to_string()])
            .stdout(Stdio::piped())
            .spawn()
            .context("starting eureka-serve")?,
    );
    let mut line = String::new();
    let stdout = server.0.stdout.take().context("eureka-serve's stdout")?;
    BufReader::new(stdout).read_line(&mut line)?;
    let served: Value = serde_json::from_str(&line).context("eureka-serve's first line")?;
    let url = served["url"]
        .as_str()
        .context("eureka-serve's URL")?
        .to_owned();
    let server_addr = url
        .trim_start_matches("http://")
        .trim_end_matches("/eureka")
        .to_owned();

    let admin = format!("127.0.0.1:{}", free_port()?);
    let xds = format!("127.0.0.1:{}", free_port()?);
    let mut args: Vec<String> = if a.peer_fill {
        let eureka = format!("127.0.0.1:{}", free_port()?);
        vec![
            "--serve-eureka".into(),
            eureka,
            "--peer".into(),
            url.clone(),
        ]
    } else {
        vec![
            "--eureka".into(),
            url.clone(),
            "--eureka-interval".into(),
            a.interval.to_string(),
        ]
    };
    args.extend(["--xds".into(), xds, "--admin".into(), admin.clone()]);
    args.push("--no-prewarm".into());
    args.extend(a.control_args.iter().cloned());
    let log = std::env::temp_dir().join(format!("odmesh-follow-load-{}.log", std::process::id()));
    let started = Instant::now();
    let control = Command::new(&a.control)
        .args(&args)
        .env("RUST_LOG", "warn")
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log)?)
        .spawn()
        .with_context(|| format!("starting {}", a.control.display()))?;
    let mut w = Watched {
        control: Killed(control),
        admin,
        log,
        started,
    };
    let timeout = Duration::from_secs_f64(a.timeout);
    let n = a.instances as u64;
    let mut report = json!({
        "instances": a.instances,
        "mode": if a.peer_fill { "peer-fill" } else { "follow" },
        "control": a.control.display().to_string(),
        "control_args": args,
        "server": served,
    });

    let m = match w
        .until("first complete registry", timeout, |m| {
            count(m, "odmesh_registry_instances") == n
        })
        .await
    {
        Ok(m) => m,
        Err(e) => {
            report["failed"] = e.to_string().into();
            report["memory"] = w.memory();
            println!("{report}");
            return Ok(());
        }
    };
    let mut first = w.memory();
    first["seconds"] = w.started.elapsed().as_secs_f64().into();
    first["fetch_errors"] = count(&m, "odmesh_eureka_fetch_errors_total").into();
    report["first"] = first;
    if a.peer_fill {
        println!("{report}");
        return Ok(());
    }

    // Full fetches: the delta answers 404 until the changes start.
    let full0 = count(&m, "odmesh_eureka_full_fetches_total");
    let mut seen = full0;
    let mut stamps = vec![Instant::now()];
    let m = w
        .until("full fetches", timeout, |m| {
            let full = count(m, "odmesh_eureka_full_fetches_total");
            if full > seen {
                seen = full;
                stamps.push(Instant::now());
            }
            full >= full0 + a.full_fetches
        })
        .await?;
    let mut full = w.memory();
    full["count"] = (count(&m, "odmesh_eureka_full_fetches_total") - full0).into();
    full["seconds_between"] = stamps
        .windows(2)
        .map(|w| (w[1] - w[0]).as_secs_f64())
        .collect::<Vec<_>>()
        .into();
    full["instances"] = count(&m, "odmesh_registry_instances").into();
    report["full_fetches"] = full;

    // Deltas: the server changes 1% of the instances per round.
    let deltas = |m: &HashMap<String, u64>| {
        count(m, "odmesh_eureka_fetches_total") - count(m, "odmesh_eureka_full_fetches_total")
    };
    let delta0 = deltas(&m);
    let mismatches0 = count(&m, "odmesh_eureka_hash_mismatches_total");
    let full1 = count(&m, "odmesh_eureka_full_fetches_total");
    let every_ms = (a.interval * 1000.0) as u64;
    let mut conn = Conn::connect(&server_addr).await?;
    let (status, _) = conn
        .request("POST", &format!("/bench/changes?every_ms={every_ms}"), b"")
        .await?;
    if status != 204 {
        bail!("eureka-serve refused to start changing: {status}");
    }
    let m = w
        .until("deltas", timeout, |m| deltas(m) >= delta0 + a.deltas)
        .await?;
    let mut delta = w.memory();
    delta["count"] = (deltas(&m) - delta0).into();
    delta["hash_mismatches"] =
        (count(&m, "odmesh_eureka_hash_mismatches_total") - mismatches0).into();
    delta["full_fetches"] = (count(&m, "odmesh_eureka_full_fetches_total") - full1).into();
    delta["instances"] = count(&m, "odmesh_registry_instances").into();
    report["deltas"] = delta;
    report["fetch_errors"] = count(&m, "odmesh_eureka_fetch_errors_total").into();
    println!("{report}");
    Ok(())
}
