//! Generated registries: `vips` VIPs named `<prefix><index:06>`, `instances` instances each,
//! optionally with 1% of all instances DOWN (the "change" of the scale benchmark).
//!
//! Instance `i` (counting over the whole file) belongs to VIP `i / instances`; with `--down`,
//! instances with `i % 100 == 0` are DOWN. Flipping `--down` on and off thus changes the status
//! of exactly 1% of the instances each time, always the same ones.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use odmesh_control::model::Snapshot;
use odmesh_eureka::wire::json::read_registry_file;
use odmesh_registry::file;

use crate::procstat;

/// What `gen-registry` writes.
#[derive(Clone, Debug, Args)]
pub struct GenArgs {
    /// Output file (written to `<file>.tmp`, then renamed over it).
    #[arg(long)]
    pub out: PathBuf,
    /// Number of VIPs.
    #[arg(long)]
    pub vips: usize,
    /// Instances per VIP.
    #[arg(long, default_value_t = 10)]
    pub instances: usize,
    /// VIP name prefix.
    #[arg(long, default_value = "svc-")]
    pub prefix: String,
    /// Every instance at 127.0.0.<1 + k>:<port> (k = its index within the VIP), for real
    /// traffic; by default each instance gets its own 10.x.y.z address.
    #[arg(long)]
    pub loopback: bool,
    /// The instances' port.
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Mark 1% of the instances DOWN (those with index % 100 == 0; see `--down-every`).
    #[arg(long)]
    pub down: bool,
    /// Which instances `--down` marks DOWN: those with index % N == 0.
    #[arg(long, default_value_t = 100)]
    pub down_every: usize,
    /// Write Eureka's `/eureka/apps` JSON instead of the YAML form.
    #[arg(long)]
    pub json: bool,
}

impl GenArgs {
    /// Settings for a scale registry (synthetic addresses).
    pub fn scale(out: PathBuf, vips: usize, instances: usize, down: bool) -> GenArgs {
        GenArgs {
            out,
            vips,
            instances,
            prefix: "svc-".into(),
            loopback: false,
            port: 8080,
            down,
            down_every: 100,
            json: false,
        }
    }
}

/// The name of VIP `index`.
pub fn vip_name(prefix: &str, index: usize) -> String {
    format!("{prefix}{index:06}")
}

/// The VIPs whose endpoints change when `--down` flips: those holding an instance with
/// `index % every == 0`.
pub fn changing_vips(vips: usize, instances: usize, every: usize) -> BTreeSet<usize> {
    (0..vips * instances)
        .filter(|&i| is_changing(i, every))
        .map(|i| i / instances)
        .collect()
}

fn address(a: &GenArgs, i: usize, k: usize) -> String {
    if a.loopback {
        format!("127.0.0.{}", 1 + k % 254)
    } else {
        let n = i + 1;
        format!("10.{}.{}.{}", (n >> 16) & 255, (n >> 8) & 255, n & 255)
    }
}

/// One generated instance: instance `k` of VIP `vip`, number `index` over the whole registry.
#[derive(Clone, Debug)]
pub struct GenInstance {
    pub index: usize,
    pub vip: String,
    pub app: String,
    pub id: String,
    pub ip: String,
    pub status: &'static str,
    pub zone: String,
}

/// Every instance of the registry `a` describes, VIP by VIP.
pub fn instances(a: &GenArgs) -> impl Iterator<Item = GenInstance> + '_ {
    (0..a.vips).flat_map(move |v| {
        let vip = vip_name(&a.prefix, v);
        (0..a.instances).map(move |k| {
            let index = v * a.instances + k;
            GenInstance {
                index,
                app: vip.to_uppercase(),
                id: format!("{vip}-{k}"),
                vip: vip.clone(),
                ip: address(a, index, k),
                status: if a.down && is_changing(index, a.down_every) {
                    "DOWN"
                } else {
                    "UP"
                },
                zone: format!("zone-{}", k % 3),
            }
        })
    })
}

/// Whether instance `index` is one of those whose status the scale benchmark changes (every
/// `every`th: 1% with 100).
pub fn is_changing(index: usize, every: usize) -> bool {
    index.is_multiple_of(every.max(1))
}

/// The instance as Eureka's JSON has it (in `/eureka/apps`, and as a registration).
pub fn eureka_json(i: &GenInstance, port: u16) -> String {
    format!(
        "{{\"instanceId\":\"{id}\",\"hostName\":\"{ip}\",\"app\":\"{app}\",\"ipAddr\":\"{ip}\",\"status\":\"{st}\",\"port\":{{\"$\":{port},\"@enabled\":\"true\"}},\"securePort\":{{\"$\":443,\"@enabled\":\"false\"}},\"vipAddress\":\"{vip}\",\"dataCenterInfo\":{{\"@class\":\"com.netflix.appinfo.InstanceInfo$DefaultDataCenterInfo\",\"name\":\"MyOwn\"}},\"metadata\":{{\"zone\":\"{zone}\"}}}}",
        id = i.id,
        ip = i.ip,
        app = i.app,
        st = i.status,
        vip = i.vip,
        zone = i.zone,
    )
}

/// The file's contents.
pub fn render(a: &GenArgs) -> String {
    let mut s = String::with_capacity(a.vips * a.instances * 96 + 64);
    if a.json {
        s.push_str(
            "{\"applications\":{\"versions__delta\":1,\"apps__hashcode\":\"\",\"application\":[",
        );
    } else {
        s.push_str("instances:\n");
    }
    for inst in instances(a) {
        let k = inst.index % a.instances.max(1);
        if a.json {
            if k == 0 {
                if inst.index > 0 {
                    s.push_str("]},");
                }
                let _ = write!(s, "{{\"name\":\"{}\",\"instance\":[", inst.app);
            } else {
                s.push(',');
            }
            s.push_str(&eureka_json(&inst, a.port));
        } else {
            let _ = writeln!(
                s,
                "  - {{app: {vip}, ip: {ip}, port: {port}, vip: {vip}, status: {st}, zone: {zone}}}",
                vip = inst.vip,
                ip = inst.ip,
                port = a.port,
                st = inst.status,
                zone = inst.zone,
            );
        }
    }
    if a.json {
        if a.vips * a.instances > 0 {
            s.push_str("]}");
        }
        s.push_str("]}}\n");
    }
    s
}

/// Writes the file atomically (temporary file, then rename).
pub fn write(a: &GenArgs) -> anyhow::Result<()> {
    let body = render(a);
    let tmp = a.out.with_extension("tmp");
    fs::write(&tmp, body).with_context(|| format!("writing {}", tmp.display()))?;
    fs::rename(&tmp, &a.out).with_context(|| format!("renaming to {}", a.out.display()))?;
    Ok(())
}

/// `gen-registry`.
pub fn run(a: &GenArgs) -> anyhow::Result<()> {
    write(a)?;
    let size = fs::metadata(&a.out)?.len();
    println!(
        "{}",
        serde_json::json!({"file": a.out, "vips": a.vips, "instances": a.vips * a.instances, "bytes": size})
    );
    Ok(())
}

/// `parse-registry`: the registry source's own parser and the snapshot build, timed.
pub fn parse_and_report(path: &Path) -> anyhow::Result<()> {
    let rss0 = procstat::own_rss_bytes().map_or(0, |r| r.0);
    let content = fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let t = Instant::now();
    let parsed = file::parse(path, &content, read_registry_file)?;
    let parse_s = t.elapsed().as_secs_f64();
    let (rss_parsed, hwm_parse) = procstat::own_rss_bytes().unwrap_or_default();
    drop(content);
    let t = Instant::now();
    let snapshot = Snapshot::from_registry(&parsed.registry);
    let snapshot_s = t.elapsed().as_secs_f64();
    let (rss_all, hwm_all) = procstat::own_rss_bytes().unwrap_or_default();
    println!(
        "{}",
        serde_json::json!({
            "file": path,
            "instances": parsed.registry.len(),
            "clusters": snapshot.len(),
            "parse_seconds": parse_s,
            "snapshot_seconds": snapshot_s,
            "rss_start_bytes": rss0,
            "rss_after_parse_bytes": rss_parsed,
            "peak_rss_during_parse_bytes": hwm_parse,
            "rss_with_registry_and_snapshot_bytes": rss_all,
            "peak_rss_bytes": hwm_all,
        })
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use odmesh_registry::Status;

    fn args(json: bool, down: bool) -> GenArgs {
        GenArgs {
            json,
            down,
            ..GenArgs::scale(PathBuf::from("unused"), 30, 10, false)
        }
    }

    fn parse(a: &GenArgs) -> odmesh_registry::Registry {
        let ext = if a.json { "r.json" } else { "r.yaml" };
        file::parse(Path::new(ext), render(a).as_bytes(), read_registry_file)
            .unwrap()
            .registry
    }

    #[test]
    fn both_formats_parse_to_the_same_registry_shape() {
        for json in [false, true] {
            let reg = parse(&args(json, false));
            assert_eq!(reg.len(), 300);
            assert_eq!(Snapshot::from_registry(&reg).len(), 30);
        }
    }

    #[test]
    fn the_down_flip_changes_one_percent_of_instances_in_the_vips_it_names() {
        let a = args(false, true);
        let reg = parse(&a);
        let down: Vec<_> = reg.instances().filter(|i| i.status != Status::Up).collect();
        assert_eq!(down.len(), 3);
        let vips: BTreeSet<String> = down.iter().map(|i| i.vips[0].to_string()).collect();
        let expected: BTreeSet<String> = changing_vips(30, 10, 100)
            .into_iter()
            .map(|v| vip_name("svc-", v))
            .collect();
        assert_eq!(vips, expected);
    }

    #[test]
    fn down_every_picks_which_instances_flip_one_in_a_vip_of_a_thousand() {
        let a = GenArgs {
            down: true,
            down_every: 1000,
            ..GenArgs::scale(PathBuf::from("unused"), 1, 1000, false)
        };
        let reg = parse(&a);
        let down: Vec<_> = reg.instances().filter(|i| i.status != Status::Up).collect();
        assert_eq!(down.len(), 1);
        assert_eq!(
            down[0].ip.to_string(),
            "10.0.0.1",
            "instance 0 of the registry"
        );
        assert_eq!(changing_vips(1, 1000, 1000), BTreeSet::from([0]));
    }
}
