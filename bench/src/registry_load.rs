//! `odmesh-bench registry-load`: the embedded Eureka registry in this process, without HTTP.
//! Registers generated instances one by one (the JSON body parsed as a REST registration
//! is), with the registry's publisher and lease eviction running beside, as `odmesh-control
//! --serve-eureka` runs them; reports the registration rate and this process's RSS at each
//! checkpoint, then times an eviction round and a publish at the full size.
//!
//! What it leaves out, on purpose: HTTP, and the control plane's snapshot of the registry. It
//! measures the registry's own cost as it grows; `xds-load --eureka` measures the whole path.

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use serde_json::json;
use tokio::sync::watch;

use odmesh_eureka::ServerMetrics;
use odmesh_eureka::server::{EurekaRegistry, ServerConfig};
use odmesh_registry::{Registry, RegistryMetrics};

use crate::procstat::own_rss_bytes;
use crate::registry_gen::{GenArgs, eureka_json, instances};

#[derive(Debug, Parser)]
pub struct RegistryLoadArgs {
    /// Instances to register in all (10 per app).
    #[arg(long, default_value_t = 1_000_000)]
    pub instances: usize,
    /// Report after this many instances, and after every multiple of ten of it.
    #[arg(long, default_value_t = 10_000)]
    pub first_checkpoint: usize,
    /// Registrations timed at each checkpoint (the rate is theirs).
    #[arg(long, default_value_t = 5_000)]
    pub window: usize,
    /// Stop after registering: no eviction round, no reads (for a heap profile whose peak is
    /// the registered registry, bench/probes/registry_heap.py).
    #[arg(long)]
    pub registrations_only: bool,
}

pub async fn run(a: RegistryLoadArgs) -> anyhow::Result<()> {
    let (tx, rx) = watch::channel(Arc::new(Registry::loading()));
    let mut config = ServerConfig::local();
    config.limits.max_instances = a.instances.max(1);
    config.limits.max_lease = Duration::from_secs(3600);
    config.warmup = Duration::ZERO;
    let eureka = EurekaRegistry::new(
        config,
        tx,
        Arc::new(RegistryMetrics::default()),
        Arc::new(ServerMetrics::default()),
    );
    let publisher = tokio::spawn(eureka.clone().run_publisher());
    let eviction = tokio::spawn(eureka.clone().run_eviction());
    let base_rss = own_rss_bytes().map_or(0, |(rss, _)| rss);

    let generated = GenArgs::scale("unused".into(), a.instances.div_ceil(10), 10, false);
    let mut checkpoints = Vec::new();
    let registering = eureka.clone();
    let total = a.instances;
    let window = a.window.max(1);
    let first = a.first_checkpoint.max(1);
    // Registration runs on a blocking thread, as a request handler takes the lock; it
    // reports only at the start of each timed window and at each checkpoint.
    let (report_tx, mut report_rx) = tokio::sync::mpsc::unbounded_channel();
    let worker = tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
        let mut next = first;
        let mut window_start = None;
        for inst in instances(&generated).take(total) {
            let done = inst.index;
            if done + window == next {
                window_start = Some(Instant::now());
            }
            let body = format!(
                "{{\"instance\":{{\"leaseInfo\":{{\"durationInSecs\":3600}},{}}}",
                &eureka_json(&inst, 8080)[1..]
            );
            registering
                .register(&inst.app, body.as_bytes())
                .map_err(|e| anyhow::anyhow!("registration {}: {e}", inst.index))?;
            if done + 1 == next {
                let rate =
                    window_start.map(|t0: Instant| window as f64 / t0.elapsed().as_secs_f64());
                // The checkpoint is read before registering on.
                let (read_tx, read_rx) = std::sync::mpsc::channel::<()>();
                let _ = report_tx.send((next, rate, read_tx));
                let _ = read_rx.recv();
                next *= 10;
                window_start = None;
            }
        }
        Ok(())
    });
    while let Some((done, rate, read)) = report_rx.recv().await {
        // Publishing what was registered, then reading memory.
        let t0 = Instant::now();
        eureka.published().await;
        let publish_wait = t0.elapsed();
        let rss = own_rss_bytes().map_or(0, |(rss, _)| rss);
        let published = rx.borrow().len();
        eprintln!(
            "registry-load: {done} instances, {:.0} registrations/s, rss {} MiB",
            rate.unwrap_or(0.0),
            rss >> 20
        );
        checkpoints.push(json!({
            "instances": done,
            "registrations_per_second": rate,
            "rss_bytes": rss,
            "bytes_per_instance": (rss.saturating_sub(base_rss)) as f64 / done as f64,
            "published_instances": published,
            "publish_wait_ms": publish_wait.as_secs_f64() * 1e3,
        }));
        let _ = read.send(());
    }
    worker.await??;
    eureka.published().await;
    if a.registrations_only {
        publisher.abort();
        eviction.abort();
        println!(
            "{}",
            json!({"instances": total, "checkpoints": checkpoints})
        );
        return Ok(());
    }

    let t0 = Instant::now();
    let evicted = eureka.evict_expired();
    let eviction_round = t0.elapsed();
    let t0 = Instant::now();
    eureka.applications_answer(true, false);
    let apps_json = t0.elapsed();
    let t0 = Instant::now();
    eureka.answer(odmesh_eureka::server::Document::Delta, true, false);
    let delta = t0.elapsed();
    publisher.abort();
    eviction.abort();
    let (rss, peak) = own_rss_bytes().unwrap_or_default();
    println!(
        "{}",
        json!({
            "instances": total,
            "checkpoints": checkpoints,
            "rss_bytes": rss,
            "peak_rss_bytes": peak,
            "base_rss_bytes": base_rss,
            "eviction_round_ms": eviction_round.as_secs_f64() * 1e3,
            "evicted": evicted,
            "apps_json_ms": apps_json.as_secs_f64() * 1e3,
            "delta_ms": delta.as_secs_f64() * 1e3,
            // What one instance's parts take inline (their strings and maps are apart). A
            // registration is read into the parsed document, and kept in its stored form
            // (eureka/src/server/stored.rs), of the size of its content.
            "inline_bytes": {
                "parsed_document": size_of::<odmesh_eureka::wire::json::InstanceInfo>(),
                "lease": size_of::<odmesh_eureka::server::ledger::Lease>(),
                "mesh_instance": size_of::<odmesh_registry::Instance>(),
            },
        })
    );
    Ok(())
}
