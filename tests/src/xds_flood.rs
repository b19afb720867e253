//! [`XdsFlood`]: the raw xDS flood client `odmesh-xds-flood` (this crate's binary, see
//! `src/bin/odmesh-xds-flood.rs`) as a child process: it subscribes a large number of random
//! cluster names (`flood-<hex>.vip`) on one delta ADS stream to a control plane, ACKs every
//! response, and reports what it got.
//!
//! `cargo test -p odmesh-e2e` builds the binary with the integration tests; the harness
//! finds it beside the test executable ([`xds_flood_binary`]). Its progress and report are
//! JSON lines in its log (`<label>.log` in the test's folder), read as [`FloodStats`].

use std::env;
use std::path::PathBuf;
use std::process::{ChildStdin, Command};
use std::time::Duration;

use serde_json::Value;

use crate::paths::binary;
use crate::process::{ChildGuard, TestEnv};
use crate::wait::wait_for;

/// The prefix of the flood's progress lines (stderr).
const PROGRESS: &str = "odmesh-xds-flood progress ";

/// What to flood with. [`FloodOptions::names`] gives the defaults.
#[derive(Clone, Debug)]
pub struct FloodOptions {
    /// How many random names to subscribe.
    pub names: u64,
    /// Names per subscribe request.
    pub batch: u64,
    /// Names per second; `None`: as fast as the stream takes them.
    pub rate: Option<f64>,
    /// Also subscribe every received cluster's load assignment, as Envoy does.
    pub endpoints: bool,
    /// Subscribe the names as load assignments, with no cluster.
    pub load_assignments: bool,
    /// Streams, each on a connection of its own, each subscribing `names` names.
    pub streams: u64,
    /// Read responses but never ACK one.
    pub no_ack: bool,
    /// Never read a response (nor ACK one): the server's answers stay queued.
    pub no_read: bool,
    /// List every subscribed name in the kept versions too (`initial_resource_versions`).
    pub kept_versions: bool,
    /// Seed of the random names (the same seed, the same names).
    pub seed: u64,
    /// Stop by itself after this long (it also stops when [`XdsFlood::stop`] closes its
    /// stdin).
    pub duration: Option<Duration>,
    /// The node id it sends.
    pub node_id: String,
}

impl FloodOptions {
    /// `names` names in batches of 1000, as fast as the stream takes them, clusters only,
    /// seed 1, node `odmesh-xds-flood`.
    pub fn names(names: u64) -> FloodOptions {
        FloodOptions {
            names,
            batch: 1000,
            rate: None,
            endpoints: false,
            load_assignments: false,
            streams: 1,
            no_ack: false,
            no_read: false,
            kept_versions: false,
            seed: 1,
            duration: None,
            node_id: "odmesh-xds-flood".to_owned(),
        }
    }
}

/// A progress line or the final report of the flood.
#[derive(Clone, Debug)]
pub struct FloodStats {
    /// Why it ended (`stdin closed`, `duration`, `stream ended: ...`, `cannot connect ...`);
    /// `None` in a progress line.
    pub ended: Option<String>,
    /// Seconds since it started.
    pub elapsed: Duration,
    /// Names it subscribed so far.
    pub names_sent: u64,
    /// Responses it got.
    pub responses: u64,
    /// `Cluster` resources it got.
    pub clusters: u64,
    /// `ClusterLoadAssignment` resources it got.
    pub endpoints: u64,
    /// Names the server removed, all types.
    pub removed: u64,
    /// ACKs it sent.
    pub acks_sent: u64,
    /// When, on every stream, as many resources and removals of the type asked for had come
    /// as names were asked for.
    pub all_answered: Option<Duration>,
    /// The whole JSON line.
    pub json: Value,
}

impl FloodStats {
    fn parse(json: Value) -> Option<FloodStats> {
        let count = |pointer: &str| json.pointer(pointer).and_then(Value::as_u64);
        let secs = |key: &str| json[key].as_f64().map(Duration::from_secs_f64);
        let removed = ["cluster", "endpoints", "other"]
            .iter()
            .map(|t| count(&format!("/removed/{t}")).unwrap_or(0))
            .sum();
        Some(FloodStats {
            ended: json["ended"].as_str().map(str::to_owned),
            elapsed: secs("elapsed_seconds")?,
            names_sent: count("/names_sent")?,
            responses: count("/responses")?,
            clusters: count("/resources/cluster")?,
            endpoints: count("/resources/endpoints")?,
            removed,
            acks_sent: count("/acks_sent")?,
            all_answered: secs("all_answered_seconds"),
            json,
        })
    }
}

/// The flood client, `odmesh-xds-flood`: `$ODMESH_XDS_FLOOD` if set, else beside the test
/// executable (`target/<profile>/`, where cargo puts the crate's binaries). Panics with what
/// to do if it is missing.
pub fn xds_flood_binary() -> PathBuf {
    let how = "`cargo test -p odmesh-e2e` builds it (or `cargo build -p odmesh-e2e --bin \
               odmesh-xds-flood`)";
    binary(
        "ODMESH_XDS_FLOOD",
        "the xDS flood client is not built",
        how,
        || {
            let exe =
                env::current_exe().unwrap_or_else(|e| panic!("cannot find this executable: {e}"));
            let mut dir = exe.parent().map(PathBuf::from).unwrap_or_default();
            if dir.ends_with("deps") {
                dir.pop();
            }
            dir.join("odmesh-xds-flood")
        },
    )
}

/// `odmesh-xds-flood` running against a control plane; killed when dropped.
pub struct XdsFlood {
    process: ChildGuard,
    stdin: Option<ChildStdin>,
}

impl XdsFlood {
    /// Floods the control plane at `xds` as `options` say; the log is `<label>.log`.
    pub fn start_with(
        env: &TestEnv,
        label: &str,
        xds: std::net::SocketAddr,
        options: &FloodOptions,
    ) -> XdsFlood {
        let mut command = Command::new(xds_flood_binary());
        command
            .arg("--xds")
            .arg(xds.to_string())
            .arg("--names")
            .arg(options.names.to_string())
            .arg("--batch")
            .arg(options.batch.to_string())
            .arg("--seed")
            .arg(options.seed.to_string())
            .arg("--node-id")
            .arg(&options.node_id)
            .args(["--progress-interval", "0.2"]);
        if let Some(rate) = options.rate {
            command.arg("--rate").arg(rate.to_string());
        }
        if let Some(duration) = options.duration {
            command
                .arg("--duration")
                .arg(duration.as_secs_f64().to_string());
        }
        if options.endpoints {
            command.arg("--endpoints");
        }
        if options.load_assignments {
            command.arg("--load-assignments");
        }
        command.arg("--streams").arg(options.streams.to_string());
        if options.no_ack {
            command.arg("--no-ack");
        }
        if options.no_read {
            command.arg("--no-read");
        }
        if options.kept_versions {
            command.arg("--kept-versions");
        }
        let (process, stdin) = env.spawn_interactive(label, command);
        XdsFlood {
            process,
            stdin: Some(stdin),
        }
    }

    /// The latest progress line, if one was written yet.
    pub fn progress(&self) -> Option<FloodStats> {
        self.process
            .log()
            .lines()
            .rev()
            .find_map(|line| line.strip_prefix(PROGRESS))
            .and_then(|json| serde_json::from_str(json).ok())
            .and_then(FloodStats::parse)
    }

    /// Waits at most `timeout` for a progress line for which `condition` holds; `what`
    /// completes "waiting for ...". Panics with the log if the flood ends first.
    pub fn wait_progress(
        &mut self,
        timeout: Duration,
        what: &str,
        mut condition: impl FnMut(&FloodStats) -> bool,
    ) -> FloodStats {
        wait_for(timeout, what, || {
            if let Some(status) = self.process.exit_status() {
                panic!(
                    "the xDS flood exited ({status}) while waiting for {what}; log:\n{}",
                    self.process.log()
                );
            }
            self.progress().filter(|p| condition(p))
        })
    }

    /// Waits until the server has answered every one of the `names` names of every stream
    /// with a resource or a removal (at most `timeout`).
    pub fn wait_all_answered(&mut self, names: u64, timeout: Duration) -> FloodStats {
        self.wait_progress(
            timeout,
            &format!("the control plane to answer all {names} flooded names"),
            |p| p.all_answered.is_some(),
        )
    }

    /// Closes its stdin, which ends it, and returns its report (waiting at most `timeout`).
    pub fn stop(mut self, timeout: Duration) -> FloodStats {
        self.stdin.take();
        self.report(timeout)
    }

    /// Waits at most `timeout` for it to end by itself (its duration, or the server ending
    /// the stream) and returns its report.
    pub fn wait_report(mut self, timeout: Duration) -> FloodStats {
        self.report(timeout)
    }

    fn report(&mut self, timeout: Duration) -> FloodStats {
        let status = self.process.wait_exit(timeout);
        let log = self.process.log();
        assert!(
            status.success(),
            "the xDS flood failed ({status}); log:\n{log}"
        );
        log.lines()
            .rev()
            .filter(|line| line.starts_with('{'))
            .find_map(|line| serde_json::from_str(line).ok())
            .and_then(FloodStats::parse)
            .unwrap_or_else(|| panic!("the xDS flood wrote no report; log:\n{log}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_report_line_reads_as_stats() {
        let stats = FloodStats::parse(json!({
            "ended": "stdin closed", "elapsed_seconds": 1.5, "names_sent": 10,
            "responses": 3, "resources": {"cluster": 10, "endpoints": 2, "other": 0},
            "removed": {"cluster": 1, "endpoints": 0, "other": 1}, "acks_sent": 3,
            "all_answered_seconds": 0.25
        }))
        .expect("a report");
        assert_eq!(stats.ended.as_deref(), Some("stdin closed"));
        assert_eq!(
            (stats.names_sent, stats.clusters, stats.endpoints),
            (10, 10, 2)
        );
        assert_eq!(stats.removed, 2);
        assert_eq!(stats.all_answered, Some(Duration::from_millis(250)));
        assert!(FloodStats::parse(json!({"ended": null})).is_none());
    }
}
