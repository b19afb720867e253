//! `odmesh-bench replication-lag`: how long a registration made on one embedded registry
//! takes to be served by its peer (`odmesh-control --serve-eureka ... --peer ...`), while
//! the origin takes a steady load of registrations.
//!
//! - Load: `--rate` registrations a second on the origin, spread over `--connections`
//!   keep-alive connections, each paced on its own schedule, over `--ids` instance ids
//!   (registering an id again replaces it, so the registry stays that size).
//! - Probes: one at a time, every `--probe-every-ms`: register `PROBE/p<n>` on the origin,
//!   then ask the peer for it (`GET /eureka/apps/PROBE/p<n>`) in a loop until it answers
//!   200. The lag is from the origin's answer (204) to the peer's first 200; the poll loop
//!   adds its own round trip (about 0.1 ms on loopback) to each sample. The probe is then
//!   cancelled on the origin.
//!
//! Prints one JSON object: the load achieved, and the lag's p50, p99 and max.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use serde_json::json;

use crate::http1::Conn;

#[derive(Debug, Parser)]
pub struct LagArgs {
    /// The origin's Eureka address (host:port).
    #[arg(long)]
    pub origin: String,
    /// The peer's Eureka address (host:port).
    #[arg(long)]
    pub peer: String,
    /// Registrations a second on the origin, beside the probes.
    #[arg(long, default_value_t = 10_000)]
    pub rate: u64,
    /// Keep-alive connections carrying the load.
    #[arg(long, default_value_t = 16)]
    pub connections: u64,
    /// Distinct instance ids the load registers, in turn.
    #[arg(long, default_value_t = 50_000)]
    pub ids: u64,
    /// How long to measure.
    #[arg(long, default_value_t = 20)]
    pub seconds: u64,
    /// Time between two probes.
    #[arg(long, default_value_t = 10)]
    pub probe_every_ms: u64,
}

fn load_body(n: u64) -> String {
    let app = format!("LOAD{}", n % 1000);
    let octet = |k: u64| (k % 250) + 1;
    format!(
        "{{\"instance\":{{\"instanceId\":\"load-{n}\",\"app\":\"{app}\",\"ipAddr\":\"10.{}.{}.{}\",\"status\":\"UP\",\"port\":{{\"$\":8080,\"@enabled\":\"true\"}},\"vipAddress\":\"{}\",\"leaseInfo\":{{\"durationInSecs\":3600}}}}}}",
        octet(n / 62_500),
        octet(n / 250),
        octet(n),
        app.to_ascii_lowercase(),
    )
}

fn probe_body(n: u64) -> String {
    format!(
        "{{\"instance\":{{\"instanceId\":\"p{n}\",\"app\":\"PROBE\",\"ipAddr\":\"10.255.0.1\",\"status\":\"UP\",\"port\":{{\"$\":8080,\"@enabled\":\"true\"}},\"vipAddress\":\"probe\",\"leaseInfo\":{{\"durationInSecs\":3600}}}}}}"
    )
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

pub async fn run(a: LagArgs) -> anyhow::Result<()> {
    let sent = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let until = started + Duration::from_secs(a.seconds);
    let mut load = Vec::new();
    for c in 0..a.connections {
        let (origin, sent, failed) = (a.origin.clone(), sent.clone(), failed.clone());
        let every = Duration::from_secs_f64(a.connections as f64 / a.rate.max(1) as f64);
        let ids = a.ids.max(a.connections);
        load.push(tokio::spawn(async move {
            let mut conn = Conn::connect(&origin).await?;
            let mut next = Instant::now() + every.mul_f64(c as f64 / a.connections as f64);
            let mut k = c;
            while Instant::now() < until {
                tokio::time::sleep_until(next.into()).await;
                next += every;
                let n = k % ids;
                k += a.connections;
                let app = format!("LOAD{}", n % 1000);
                let path = format!("/eureka/apps/{app}");
                let (status, _) = conn.request("POST", &path, load_body(n).as_bytes()).await?;
                sent.fetch_add(1, Ordering::Relaxed);
                if status != 204 {
                    failed.fetch_add(1, Ordering::Relaxed);
                }
            }
            anyhow::Ok(())
        }));
    }

    let mut origin = Conn::connect(&a.origin).await?;
    let mut peer = Conn::connect(&a.peer).await?;
    let mut lags = Vec::new();
    let mut polls = 0u64;
    let mut n = 0u64;
    // The first second is the load's ramp: not measured.
    tokio::time::sleep(Duration::from_secs(1)).await;
    while Instant::now() < until {
        n += 1;
        let (status, body) = origin
            .request("POST", "/eureka/apps/PROBE", probe_body(n).as_bytes())
            .await?;
        anyhow::ensure!(
            status == 204,
            "probe registration: {status} {}",
            String::from_utf8_lossy(&body)
        );
        let acked = Instant::now();
        let path = format!("/eureka/apps/PROBE/p{n}");
        loop {
            polls += 1;
            let (status, _) = peer.request("GET", &path, b"").await?;
            if status == 200 {
                break;
            }
            anyhow::ensure!(
                acked.elapsed() < Duration::from_secs(30),
                "probe p{n} not on the peer after 30 s"
            );
        }
        lags.push(acked.elapsed().as_secs_f64() * 1000.0);
        let (status, _) = origin.request("DELETE", &path, b"").await?;
        anyhow::ensure!(status == 200, "probe cancel: {status}");
        tokio::time::sleep(Duration::from_millis(a.probe_every_ms)).await;
    }
    for task in load {
        task.await??;
    }
    let elapsed = started.elapsed().as_secs_f64();
    lags.sort_by(f64::total_cmp);
    let out = json!({
        "rate_asked": a.rate,
        "registrations_sent": sent.load(Ordering::Relaxed),
        "registrations_per_s": sent.load(Ordering::Relaxed) as f64 / elapsed,
        "registrations_failed": failed.load(Ordering::Relaxed),
        "probes": lags.len(),
        "peer_polls": polls,
        "lag_ms_p50": pct(&lags, 0.5),
        "lag_ms_p99": pct(&lags, 0.99),
        "lag_ms_max": lags.last().copied().unwrap_or(f64::NAN),
    });
    println!("{out}");
    Ok(())
}
