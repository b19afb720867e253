//! `xds-dump`: every `Cluster` and `ClusterLoadAssignment` odmesh serves for a registry, built
//! with `odmesh_control::xds` (as `push-all` builds them), written for another control plane to
//! serve (`bench/gcp`, go-control-plane).
//!
//! The file is a sequence of `envoy.service.discovery.v3.Resource` messages, each preceded by
//! its length as a protobuf varint (prost's `encode_length_delimited`, Go's `protodelim`): the
//! clusters by name, then the load assignments by name. Each carries odmesh's version (a hash
//! of a canonical encoding); the bytes are not canonical (prost writes a map field in a random
//! order), so a reader finds what changed by version.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use envoy_types::pb::envoy::service::discovery::v3::Resource;
use odmesh_control::model::Snapshot;
use odmesh_control::xds::{self, ClusterResources, XdsOptions};
use odmesh_eureka::wire::json::read_registry_file;
use odmesh_registry::file;
use prost::Message;
use serde_json::json;

/// What `xds-dump` writes.
#[derive(Clone, Debug, Args)]
pub struct DumpArgs {
    /// The registry file (YAML form or Eureka JSON).
    #[arg(long)]
    pub registry: PathBuf,
    /// The dump (written to `<file>.tmp`, then renamed over it).
    #[arg(long)]
    pub out: PathBuf,
}

/// Every cluster of `snapshot` with its load assignment, as odmesh-control serves them (its
/// default options and policy), by name.
pub fn build_all(snapshot: &Snapshot) -> anyhow::Result<Vec<ClusterResources>> {
    let opts = XdsOptions::default();
    let mut out = Vec::with_capacity(snapshot.len());
    for (name, info) in snapshot.iter() {
        let built = xds::build(name, xds::Lookup::Registered(info), &opts)
            .map_err(|e| anyhow::anyhow!("{name}: {e:?}"))?;
        out.push(built);
    }
    out.sort_by(|a, b| a.cluster.name.cmp(&b.cluster.name));
    Ok(out)
}

/// The resources of a registry file's content (`path` only names it in errors): the clusters,
/// then the load assignments.
pub fn resources(path: &Path, content: &[u8]) -> anyhow::Result<Vec<Resource>> {
    let parsed = file::parse(path, content, read_registry_file)
        .with_context(|| format!("{}", path.display()))?;
    let built = build_all(&Snapshot::from_registry(&parsed.registry))?;
    let clusters = built.iter().map(|b| b.cluster.to_resource());
    let endpoints = built.iter().map(|b| b.endpoints.to_resource());
    Ok(clusters.chain(endpoints).collect())
}

/// `resources`, each preceded by its varint length.
pub fn encode(resources: &[Resource]) -> Vec<u8> {
    let mut out = Vec::new();
    for r in resources {
        // Writing to a Vec cannot run out of room.
        let _ = r.encode_length_delimited(&mut out);
    }
    out
}

/// The resources of a dump (the reader is `bench/gcp`; this one is for tests).
#[cfg(test)]
pub fn decode(mut bytes: &[u8]) -> Result<Vec<Resource>, prost::DecodeError> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        out.push(Resource::decode_length_delimited(&mut bytes)?);
    }
    Ok(out)
}

/// Writes `bytes` to `<path>.tmp` and renames it over `path`, so a reader never sees half.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}

/// `xds-dump`.
pub fn run(a: &DumpArgs) -> anyhow::Result<()> {
    let t = Instant::now();
    let content =
        std::fs::read(&a.registry).with_context(|| format!("{}", a.registry.display()))?;
    let resources = resources(&a.registry, &content)?;
    let bytes = encode(&resources);
    write_atomic(&a.out, &bytes).with_context(|| format!("{}", a.out.display()))?;
    println!(
        "{}",
        json!({
            "resources": resources.len(),
            "bytes": bytes.len(),
            "seconds": t.elapsed().as_secs_f64(),
        })
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use odmesh_control::xds::{CLUSTER_TYPE_URL, ENDPOINTS_TYPE_URL};

    use super::*;
    use crate::registry_gen::{self, GenArgs};

    fn dump_of(vips: usize, down: bool) -> Vec<Resource> {
        let args = GenArgs::scale(PathBuf::new(), vips, 10, down);
        let yaml = registry_gen::render(&args);
        resources(Path::new("generated.yaml"), yaml.as_bytes()).unwrap()
    }

    #[test]
    fn a_dump_decodes_to_the_resources_it_was_encoded_from() {
        let resources = dump_of(20, false);
        assert_eq!(decode(&encode(&resources)).unwrap(), resources);
        assert_eq!(decode(&[]).unwrap(), Vec::<Resource>::new());
    }

    #[test]
    fn a_truncated_dump_is_an_error() {
        let bytes = encode(&dump_of(3, false));
        assert!(decode(&bytes[..bytes.len() - 1]).is_err());
    }

    #[test]
    fn a_registry_dumps_one_cluster_and_one_load_assignment_per_vip() {
        let resources = dump_of(20, false);
        assert_eq!(resources.len(), 40);
        let (clusters, endpoints) = resources.split_at(20);
        for (c, e) in clusters.iter().zip(endpoints) {
            assert_eq!(c.name, e.name);
            assert!(c.name.ends_with(".vip"), "{}", c.name);
            let type_url = |r: &Resource| r.resource.as_ref().unwrap().type_url.clone();
            assert_eq!(type_url(c), CLUSTER_TYPE_URL);
            assert_eq!(type_url(e), ENDPOINTS_TYPE_URL);
        }
    }

    #[test]
    fn flipping_the_changing_instances_changes_only_their_vips_load_assignments() {
        // By version: prost writes a cluster's map fields in a random order, so equal clusters
        // may differ in bytes; odmesh's version hashes a canonical encoding.
        let (up, down) = (dump_of(20, false), dump_of(20, true));
        let changed: Vec<(&str, &str)> = up
            .iter()
            .zip(&down)
            .filter(|(a, b)| a.version != b.version)
            .map(|(a, b)| {
                (
                    a.name.as_str(),
                    b.resource.as_ref().unwrap().type_url.as_str(),
                )
            })
            .collect();
        let expected: Vec<String> = registry_gen::changing_vips(20, 10, 100)
            .into_iter()
            .map(|v| format!("{}.vip", registry_gen::vip_name("svc-", v)))
            .collect();
        assert_eq!(
            changed
                .iter()
                .map(|(n, _)| n.to_string())
                .collect::<Vec<_>>(),
            expected
        );
        assert!(changed.iter().all(|(_, t)| *t == ENDPOINTS_TYPE_URL));
    }
}
