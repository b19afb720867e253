//! Native micro-benchmark of the filter's per-request work: Host (and secure flag) to cluster
//! name, with the default configuration and with a suffix to strip. `cargo bench -p
//! odmesh-filter` (host only: criterion does not build for wasm32-wasip1).

#[cfg(not(target_arch = "wasm32"))]
mod native {
    use std::hint::black_box;

    use criterion::{Criterion, criterion_group};
    use odmesh_filter::config::Config;
    use odmesh_filter::mapping::map_host;

    const HOSTS: &[(&str, &str)] = &[
        ("plain", "hello"),
        ("with_port", "Hello-World.example:8080"),
        ("secure_port", "payments:8443"),
        ("explicit_cluster", "orders.svip"),
        (
            "long",
            "a-rather-long-service-name.with.several.labels.inside.the.mesh",
        ),
        ("invalid", "10.0.0.1"),
    ];

    fn mapping(c: &mut Criterion) {
        let default = Config::parse(b"{}").expect("the default configuration parses");
        let suffix =
            Config::parse(br#"{"strip_suffixes": [".mesh.internal", ".svc.cluster.local"]}"#)
                .expect("a suffix configuration parses");
        let mut group = c.benchmark_group("map_host");
        for (label, host) in HOSTS {
            group.bench_function(*label, |b| {
                b.iter(|| map_host(black_box(host.to_string()), black_box(false), &default))
            });
        }
        group.bench_function("strip_suffix", |b| {
            b.iter(|| {
                map_host(
                    black_box("orders.mesh.internal:80".to_string()),
                    black_box(false),
                    &suffix,
                )
            })
        });
        group.finish();
    }

    criterion_group!(benches, mapping);
}

#[cfg(not(target_arch = "wasm32"))]
criterion::criterion_main!(native::benches);

#[cfg(target_arch = "wasm32")]
fn main() {}
