//! `odmesh-bench eureka-serve`: a Eureka server as the follower's benchmark needs one. Its
//! `/eureka/apps` holds `instances` generated Spring-like instances, 10 per app, each the
//! document a Spring Cloud Eureka server writes for a Spring Boot service (about 1 KB of
//! JSON), gzip when the request's `Accept-Encoding` asks for it (as Eureka's
//! `ApplicationsResource` does), plain otherwise.
//!
//! `/eureka/apps/delta` answers 404 (so every poll of a follower is a full fetch) until
//! changes start (`--change-every`, or `POST /bench/changes?every_ms=N`): then every round
//! flips the status (UP ↔ DOWN) of 1% of the instances, those with `index % 100 == (round - 1)
//! % 100`, and the delta carries the instances changed in the last `--delta-rounds` rounds as
//! `MODIFIED`, with the hash code of the whole registry, as Eureka's recently-changed queue
//! does. Each document is written once per round and kept (Eureka's response cache).
//!
//! When ready it prints one JSON line: its base URL and the size of the `/apps` document.

use std::fmt::Write as _;
use std::io::Write as _;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::header::{ACCEPT_ENCODING, CONTENT_ENCODING, CONTENT_TYPE};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use clap::Parser;
use flate2::Compression;
use flate2::write::GzEncoder;

/// Instances per app.
pub const PER_APP: usize = 10;

#[derive(Clone, Debug, Parser)]
pub struct ServeArgs {
    /// Instances in the registry (10 per app).
    #[arg(long, default_value_t = 1_000_000)]
    pub instances: usize,
    /// Where to listen.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    /// Start changing at once, a round every this many milliseconds (default: only on
    /// `POST /bench/changes`).
    #[arg(long)]
    pub change_every: Option<u64>,
    /// Rounds of changes a delta carries (Eureka keeps 3 minutes of them: 6 polls of 30 s).
    #[arg(long, default_value_t = 3)]
    pub delta_rounds: u64,
}

/// Instance `i` of the generated registry, as a Spring Cloud Eureka server writes it
/// (`InstanceInfoSerializer`'s fields and order; Spring Boot's defaults for the URLs).
pub fn write_instance(out: &mut String, i: usize, down: bool, action: &str) {
    let n = i + 1;
    let (a, b, c) = ((n >> 16) & 255, (n >> 8) & 255, n & 255);
    let app = i / PER_APP;
    let host = format!("ip-10-{a}-{b}-{c}.ec2.internal");
    let t = 1_716_812_345_678u64 + i as u64;
    let _ = write!(
        out,
        concat!(
            r#"{{"instanceId":"{host}:svc-{app:06}:8080","hostName":"{host}","app":"SVC-{app:06}","#,
            r#""ipAddr":"10.{a}.{b}.{c}","status":"{status}","overriddenStatus":"UNKNOWN","#,
            r#""port":{{"$":8080,"@enabled":"true"}},"securePort":{{"$":443,"@enabled":"false"}},"countryId":1,"#,
            r#""dataCenterInfo":{{"@class":"com.netflix.appinfo.InstanceInfo$DefaultDataCenterInfo","name":"MyOwn"}},"#,
            r#""leaseInfo":{{"renewalIntervalInSecs":30,"durationInSecs":90,"registrationTimestamp":{t},"#,
            r#""lastRenewalTimestamp":{t},"evictionTimestamp":0,"serviceUpTimestamp":{t}}},"#,
            r#""metadata":{{"management.port":"8080","zone":"us-east-1{zone}"}},"#,
            r#""homePageUrl":"http://{host}:8080/","statusPageUrl":"http://{host}:8080/actuator/info","#,
            r#""healthCheckUrl":"http://{host}:8080/actuator/health","vipAddress":"svc-{app:06}","#,
            r#""secureVipAddress":"svc-{app:06}","isCoordinatingDiscoveryServer":"false","#,
            r#""lastUpdatedTimestamp":"{t}","lastDirtyTimestamp":"{t}","actionType":"{action}"}}"#
        ),
        host = host,
        app = app,
        a = a,
        b = b,
        c = c,
        status = if down { "DOWN" } else { "UP" },
        t = t,
        zone = ["a", "b", "c"][i % 3],
        action = action,
    );
}

/// Whether instance `i` is DOWN after `round` rounds of changes: round `k` flips the
/// instances with `i % 100 == (k - 1) % 100`.
pub fn is_down(i: usize, round: u64) -> bool {
    let residue = (i % 100) as u64;
    let flips = if round > residue {
        (round - 1 - residue) / 100 + 1
    } else {
        0
    };
    flips % 2 == 1
}

/// Eureka's reconcile hash code of the registry after `round` rounds.
fn hash_code(instances: usize, round: u64) -> String {
    let down = (0..instances).filter(|&i| is_down(i, round)).count();
    let up = instances - down;
    let mut code = String::new();
    if down > 0 {
        let _ = write!(code, "DOWN_{down}_");
    }
    if up > 0 {
        let _ = write!(code, "UP_{up}_");
    }
    code
}

/// A document: written through gzip as it is generated, so that a million instances never
/// sit in memory as plain text; the plain text only when a request asks for it.
struct Rendered {
    round: u64,
    gzip: axum::body::Bytes,
    plain_bytes: u64,
    plain: Option<axum::body::Bytes>,
}

/// Writes the applications document of the instances `which` yields (in app order), after
/// `round` rounds, into `out`.
fn render(
    instances: usize,
    round: u64,
    which: impl Iterator<Item = usize>,
    action: &str,
    out: &mut dyn std::io::Write,
) -> std::io::Result<()> {
    let mut buf = String::with_capacity(1 << 17);
    let _ = write!(
        buf,
        r#"{{"applications":{{"versions__delta":"{}","apps__hashcode":"{}","application":["#,
        round + 1,
        hash_code(instances, round)
    );
    let mut app = None;
    for i in which {
        if app != Some(i / PER_APP) {
            if app.is_some() {
                buf.push_str("]},");
            }
            app = Some(i / PER_APP);
            let _ = write!(buf, r#"{{"name":"SVC-{:06}","instance":["#, i / PER_APP);
        } else {
            buf.push(',');
        }
        write_instance(&mut buf, i, is_down(i, round), action);
        if buf.len() > 1 << 16 {
            out.write_all(buf.as_bytes())?;
            buf.clear();
        }
    }
    if app.is_some() {
        buf.push_str("]}");
    }
    buf.push_str("]}}");
    out.write_all(buf.as_bytes())
}

/// Counts what goes through to the gzip encoder.
struct Counted<W> {
    inner: W,
    bytes: u64,
}

impl<W: std::io::Write> std::io::Write for Counted<W> {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(data)?;
        self.bytes += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

struct Served {
    instances: usize,
    delta_rounds: u64,
    round: u64,
    changing: bool,
    full: Option<Rendered>,
    delta: Option<Rendered>,
}

impl Served {
    /// The instances a delta after `self.round` carries, in app order.
    fn changed(&self) -> Vec<usize> {
        let first = self.round.saturating_sub(self.delta_rounds) + 1;
        let residues: Vec<usize> = (first..=self.round)
            .map(|k| ((k - 1) % 100) as usize)
            .collect();
        (0..self.instances)
            .filter(|i| residues.contains(&(i % 100)))
            .collect()
    }

    fn render(&self, delta: bool) -> Rendered {
        let gz = GzEncoder::new(Vec::new(), Compression::fast());
        let mut out = Counted {
            inner: gz,
            bytes: 0,
        };
        let done = if delta {
            render(
                self.instances,
                self.round,
                self.changed().into_iter(),
                "MODIFIED",
                &mut out,
            )
        } else {
            render(
                self.instances,
                self.round,
                0..self.instances,
                "ADDED",
                &mut out,
            )
        };
        done.expect("writing to memory");
        let plain_bytes = out.bytes;
        let gzip = out.inner.finish().expect("writing to memory");
        Rendered {
            round: self.round,
            gzip: gzip.into(),
            plain_bytes,
            plain: None,
        }
    }

    /// The document (`delta` or full) of the current round, rendered if need be; its plain
    /// form too when `plain`.
    fn document(&mut self, delta: bool, plain: bool) -> Response {
        let round = self.round;
        let stale = |r: &Option<Rendered>| r.as_ref().is_none_or(|r| r.round != round);
        let slot_stale = if delta {
            stale(&self.delta)
        } else {
            stale(&self.full)
        };
        if slot_stale {
            let rendered = self.render(delta);
            *(if delta {
                &mut self.delta
            } else {
                &mut self.full
            }) = Some(rendered);
        }
        let (instances, changed) = (
            self.instances,
            if delta { self.changed() } else { Vec::new() },
        );
        let slot = if delta {
            &mut self.delta
        } else {
            &mut self.full
        };
        let rendered = slot.as_mut().expect("rendered above");
        if plain {
            let text = rendered.plain.get_or_insert_with(|| {
                let mut out = Vec::with_capacity(rendered.plain_bytes as usize);
                let done = if delta {
                    render(instances, round, changed.into_iter(), "MODIFIED", &mut out)
                } else {
                    render(instances, round, 0..instances, "ADDED", &mut out)
                };
                done.expect("writing to memory");
                out.into()
            });
            return (
                [(CONTENT_TYPE, "application/json")],
                Body::from(text.clone()),
            )
                .into_response();
        }
        (
            [
                (CONTENT_TYPE, "application/json"),
                (CONTENT_ENCODING, "gzip"),
            ],
            Body::from(rendered.gzip.clone()),
        )
            .into_response()
    }
}

type Shared = Arc<Mutex<Served>>;

fn wants_gzip(headers: &HeaderMap) -> bool {
    headers
        .get(ACCEPT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("gzip"))
}

async fn apps(State(s): State<Shared>, headers: HeaderMap) -> Response {
    let plain = !wants_gzip(&headers);
    tokio::task::spawn_blocking(move || s.lock().expect("server state").document(false, plain))
        .await
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

async fn delta(State(s): State<Shared>, headers: HeaderMap) -> Response {
    let plain = !wants_gzip(&headers);
    tokio::task::spawn_blocking(move || {
        let mut served = s.lock().expect("server state");
        if !served.changing {
            return StatusCode::NOT_FOUND.into_response();
        }
        served.document(true, plain)
    })
    .await
    .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

#[derive(serde::Deserialize)]
struct Changes {
    every_ms: u64,
}

/// Starts the rounds of changes.
async fn changes(State(s): State<Shared>, Query(c): Query<Changes>) -> StatusCode {
    start_changes(s, Duration::from_millis(c.every_ms.max(1)));
    StatusCode::NO_CONTENT
}

fn start_changes(s: Shared, every: Duration) {
    {
        let mut served = s.lock().expect("server state");
        if served.changing {
            return;
        }
        served.changing = true;
    }
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.tick().await;
        loop {
            tick.tick().await;
            s.lock().expect("server state").round += 1;
        }
    });
}

/// `eureka-serve`: renders the first document, listens, prints its URL, serves until killed.
pub async fn run(a: ServeArgs) -> anyhow::Result<()> {
    let mut served = Served {
        instances: a.instances,
        delta_rounds: a.delta_rounds.max(1),
        round: 0,
        changing: false,
        full: None,
        delta: None,
    };
    let first = tokio::task::block_in_place(|| served.render(false));
    let report = serde_json::json!({
        "instances": a.instances,
        "apps_bytes": first.plain_bytes,
        "apps_gzip_bytes": first.gzip.len(),
    });
    served.full = Some(first);
    let shared: Shared = Arc::new(Mutex::new(served));
    let app = Router::new()
        .route("/eureka/apps", get(apps))
        .route("/eureka/apps/", get(apps))
        .route("/eureka/apps/delta", get(delta))
        .route("/bench/changes", post(changes))
        .with_state(shared.clone());
    let listener = tokio::net::TcpListener::bind(a.listen).await?;
    let addr = listener.local_addr()?;
    if let Some(ms) = a.change_every {
        start_changes(shared, Duration::from_millis(ms.max(1)));
    }
    let mut report = report;
    report["url"] = format!("http://{addr}/eureka").into();
    println!("{report}");
    std::io::stdout().flush()?;
    axum::serve(listener, app).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generated_instance_is_about_a_kilobyte_of_eurekas_json() {
        let mut s = String::new();
        write_instance(&mut s, 123_456, false, "ADDED");
        let v: serde_json::Value = serde_json::from_str(&s).unwrap();
        assert_eq!(v["app"], "SVC-012345");
        assert_eq!(v["ipAddr"], "10.1.226.65");
        assert!((900..1200).contains(&s.len()), "{} bytes", s.len());
    }

    #[test]
    fn a_round_flips_one_instance_in_a_hundred_and_the_hash_code_counts_them() {
        assert!(!is_down(5, 0));
        assert!(is_down(0, 1) && !is_down(1, 1));
        assert!(is_down(1, 2) && is_down(0, 2));
        assert!(!is_down(0, 101), "flipped back by round 101");
        assert_eq!(hash_code(1000, 3), "DOWN_30_UP_970_");
        assert_eq!(hash_code(0, 0), "");
    }

    #[test]
    fn the_document_reads_as_eurekas_and_the_delta_carries_the_last_rounds() {
        let mut served = Served {
            instances: 1000,
            delta_rounds: 2,
            round: 3,
            changing: true,
            full: None,
            delta: None,
        };
        let mut out = Vec::new();
        render(1000, 3, 0..1000, "ADDED", &mut out).unwrap();
        let parsed = odmesh_eureka::wire::json::parse_document(&out).unwrap();
        assert_eq!(parsed.applications.application.len(), 100);
        assert_eq!(
            parsed.applications.apps_hashcode.as_deref(),
            Some("DOWN_30_UP_970_")
        );
        assert_eq!(served.changed().len(), 20, "rounds 2 and 3: 2% of 1,000");
        let rendered = served.render(true);
        let mut plain = Vec::new();
        std::io::copy(
            &mut flate2::read::GzDecoder::new(&rendered.gzip[..]),
            &mut plain,
        )
        .unwrap();
        assert_eq!(plain.len() as u64, rendered.plain_bytes);
        let delta = odmesh_eureka::wire::json::parse_document(&plain).unwrap();
        let n: usize = (delta.applications.application.iter())
            .map(|a| a.instance.len())
            .sum();
        assert_eq!(n, 20);
        served.round = 4;
        assert_eq!(served.changed().len(), 20);
    }
}
