//! What ships beside the binaries: the systemd unit and its example environment file
//! (`packaging/systemd/`), the release bundle and the two OCI images (`make dist`), read back
//! with real OCI tools (skopeo, umoci).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use odmesh_e2e::paths::repo_root;
use odmesh_e2e::{TestEnv, control_binary, free_port};

const SHIPPED_EXEC: &str = "ExecStart=/usr/local/bin/odmesh-control";

/// The release's version (the workspace's), the images' tag.
const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The images `make dist` writes, as OCI layout folders under its output folder.
const WASM_IMAGE: &str = "oci/odmesh-filter-wasm";
const CONTROL_IMAGE: &str = "oci/odmesh-control";

/// `systemd-analyze verify` on `unit`: whether it passed, and what it said.
fn verify(unit: &std::path::Path) -> (bool, String) {
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(unit)
        .output()
        .expect("systemd-analyze runs (Debian's systemd package)");
    let said =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    (out.status.success(), said)
}

#[test]
fn the_systemd_unit_passes_systemd_analyze_verify() {
    let env = TestEnv::new("packaging_unit");
    let shipped =
        std::fs::read_to_string(repo_root().join("packaging/systemd/odmesh-control.service"))
            .expect("the unit");
    assert_eq!(shipped.matches(SHIPPED_EXEC).count(), 1, "{shipped}");
    // The binary at the path the unit names is this build's (verify checks it exists).
    let exec = format!("ExecStart={}", control_binary().display());
    let unit = env.write_file(
        "odmesh-control.service",
        &shipped.replace(SHIPPED_EXEC, &exec),
    );
    let (ok, said) = verify(&unit);
    assert!(ok && said.trim().is_empty(), "{said}");
    // What it would say of a broken one.
    let broken = shipped
        .replace(SHIPPED_EXEC, &exec)
        .replace("Type=exec", "Type=sometimes");
    let (_, said) = verify(&env.write_file("broken.service", &broken));
    assert!(said.contains("sometimes"), "a broken unit passed: {said}");
}

#[test]
fn the_example_environment_file_starts_a_control_plane() {
    let env = TestEnv::new("packaging_env_file");
    let example = std::fs::read_to_string(repo_root().join("packaging/systemd/odmesh-control.env"))
        .expect("the example");
    let mut cmd = Command::new(control_binary());
    let mut set = 0;
    for line in example.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (name, value) = line.split_once('=').expect("NAME=value");
        assert!(name.starts_with("ODMESH_"), "{line}");
        cmd.env(name, value);
        set += 1;
    }
    assert!(set >= 3, "{example}");
    // Its addresses, on ports of the test's own (a flag wins over its variable).
    let (registry, xds, admin) = (free_port(), free_port(), free_port());
    cmd.args(["--serve-eureka", &format!("127.0.0.1:{registry}")])
        .args(["--xds", &format!("127.0.0.1:{xds}")])
        .args(["--admin", &format!("127.0.0.1:{admin}")]);
    let child = env.spawn("control", cmd);
    let accepts = |port: u16| std::net::TcpStream::connect(("127.0.0.1", port)).is_ok();
    odmesh_e2e::wait::wait_until(Duration::from_secs(20), "the control plane's ports", || {
        accepts(registry) && accepts(xds) && accepts(admin)
    });
    assert!(
        child.log().contains("\"level\""),
        "the example's JSON logs: {}",
        child.log()
    );
}

/// `scripts/dist.sh` (`make dist`) on this build, into `<log folder>/<out>`: the folder, and
/// the bundle in it (`odmesh-<version>-x86_64-linux.tar.gz`).
fn pack(env: &TestEnv, out: &str) -> (PathBuf, PathBuf) {
    let out = env.log_dir().join(out);
    let status = Command::new(repo_root().join("scripts/dist.sh"))
        .env("CONTROL", control_binary())
        .env("OUT", &out)
        .status()
        .expect("dist.sh runs");
    assert!(status.success(), "dist.sh failed");
    let tarball = out.join(format!("odmesh-{VERSION}-x86_64-linux.tar.gz"));
    assert!(tarball.is_file(), "no {}", tarball.display());
    (out, tarball)
}

/// `scripts/dist.sh` (`make dist`) on this build: what the bundle holds, its checksums, its
/// SBOM, and the same bytes when packed again (the images too).
#[test]
fn the_release_bundle_holds_what_ships_checks_out_and_packs_the_same_twice() {
    let env = TestEnv::new("packaging_dist");
    let (one, tarball) = pack(&env, "one");
    let (two, again) = pack(&env, "two");
    assert!(
        std::fs::read(&tarball).unwrap() == std::fs::read(again).unwrap(),
        "packed twice, the bundles differ"
    );
    // An image's index names its manifest by digest, which covers its config and layers.
    for image in [WASM_IMAGE, CONTROL_IMAGE] {
        let index = |out: &Path| std::fs::read(out.join(image).join("index.json")).unwrap();
        assert!(index(&one) == index(&two), "packed twice, {image} differs");
    }
    let unpacked = env.log_dir().join("unpacked");
    std::fs::create_dir_all(&unpacked).unwrap();
    let status = Command::new("tar")
        .arg("xzf")
        .arg(&tarball)
        .arg("-C")
        .arg(&unpacked)
        .status()
        .unwrap();
    assert!(status.success());
    let name = tarball.file_name().unwrap().to_string_lossy();
    let bundle = unpacked.join(name.trim_end_matches(".tar.gz"));
    for file in [
        "odmesh-control",
        "odmesh_filter.wasm",
        "libodmesh_filter.so",
        "envoy/odmesh.yaml",
        "envoy/odmesh-native.yaml",
        "packaging/systemd/odmesh-control.service",
        "LICENSE",
        "BUILD.txt",
        "sbom.cdx.json",
    ] {
        assert!(bundle.join(file).is_file(), "{file} is not in the bundle");
    }
    let check = Command::new("sha256sum")
        .args(["--check", "--strict", "SHA256SUMS"])
        .current_dir(&bundle)
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stdout)
    );
    let checked = String::from_utf8_lossy(&check.stdout).lines().count();
    assert!(checked >= 10, "{checked} files checked");
    let build = std::fs::read_to_string(bundle.join("BUILD.txt")).unwrap();
    assert!(build.contains("glibc 2."), "{build}");
    let sbom: serde_json::Value =
        serde_json::from_slice(&std::fs::read(bundle.join("sbom.cdx.json")).unwrap()).unwrap();
    assert_eq!(sbom["bomFormat"], "CycloneDX");
    let components = sbom["components"].as_array().expect("components");
    let names: Vec<&str> = components
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    for linked in ["tokio", "tonic", "prost", "proxy-wasm"] {
        assert!(
            names.contains(&linked),
            "{linked} not in the SBOM: {names:?}"
        );
    }
    assert!(!names.iter().any(|n| n.starts_with("odmesh")), "{names:?}");
    assert!(!names.contains(&"cargo-fuzz") && !names.contains(&"libfuzzer-sys"));
    for c in components {
        assert!(
            c["purl"]
                .as_str()
                .is_some_and(|p| p.starts_with("pkg:cargo/")),
            "{c}"
        );
    }
}

/// Runs `program` with `args`; panics with what it said unless it succeeds; returns stdout.
fn run(program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program} runs (scripts/install-test-tools.sh): {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8")
}

/// `skopeo inspect <flag> oci:<layout>:<version>` (`--raw`: the manifest; `--config`: the
/// image configuration), as JSON.
fn skopeo_inspect(layout: &Path, flag: &str) -> serde_json::Value {
    let image = format!("oci:{}:{VERSION}", layout.display());
    serde_json::from_str(&run("skopeo", &["inspect", flag, &image])).expect("skopeo answers JSON")
}

/// Checks the labels every image carries (docs/images.md).
fn assert_labels(config: &serde_json::Value) {
    let labels = &config["config"]["Labels"];
    assert_eq!(
        labels["org.opencontainers.image.version"], VERSION,
        "{config}"
    );
    assert_eq!(labels["org.opencontainers.image.licenses"], "Apache-2.0");
    assert!(
        labels["org.opencontainers.image.source"].is_string(),
        "{config}"
    );
}

/// The wasm image in the layout Istio's and Envoy Gateway's pullers read as the "compat"
/// variant (docs/images.md): one tar+gzip layer whose `plugin.wasm` is the shipped filter.
/// Read with skopeo (copied out of the layout as a registry would serve it) and unpacked
/// with umoci.
#[test]
fn the_wasm_image_is_a_compat_wasm_image_holding_the_shipped_filter() {
    let env = TestEnv::new("packaging_wasm_image");
    let (out, _) = pack(&env, "dist");
    let layout = out.join(WASM_IMAGE);
    let manifest = skopeo_inspect(&layout, "--raw");
    assert_eq!(
        manifest["mediaType"],
        "application/vnd.oci.image.manifest.v1+json"
    );
    assert_eq!(
        manifest["annotations"]["module.wasm.image/variant"],
        "compat"
    );
    let layers = manifest["layers"].as_array().expect("layers");
    assert_eq!(layers.len(), 1, "{manifest}");
    assert_eq!(
        layers[0]["mediaType"],
        "application/vnd.oci.image.layer.v1.tar+gzip"
    );
    assert_labels(&skopeo_inspect(&layout, "--config"));

    let shipped = std::fs::read(repo_root().join("dist/odmesh_filter.wasm")).unwrap();
    let shipped_sum = std::fs::read_to_string(repo_root().join("dist/odmesh_filter.wasm.sha256"))
        .expect("dist/odmesh_filter.wasm.sha256");
    let shipped_sum = shipped_sum.split_whitespace().next().expect("a sum");
    // As a puller gets it: the layer blob, by its digest, then plugin.wasm in it.
    let copied = env.log_dir().join("copied");
    let from = format!("oci:{}:{VERSION}", layout.display());
    let to = format!("dir:{}", copied.display());
    run("skopeo", &["copy", "--quiet", &from, &to]);
    let digest = layers[0]["digest"].as_str().expect("a digest");
    let blob = copied.join(digest.trim_start_matches("sha256:"));
    let blob = blob.to_str().expect("a UTF-8 path");
    let listed = run("tar", &["-tzf", blob]);
    assert_eq!(
        listed.trim(),
        "plugin.wasm",
        "the layer holds more: {listed}"
    );
    let extracted = env.log_dir().join("extracted");
    std::fs::create_dir_all(&extracted).unwrap();
    run("tar", &["-xzf", blob, "-C", extracted.to_str().unwrap()]);
    let plugin = extracted.join("plugin.wasm");
    assert!(
        std::fs::read(&plugin).unwrap() == shipped,
        "plugin.wasm is not the shipped filter"
    );
    let sum = run("sha256sum", &[plugin.to_str().unwrap()]);
    assert_eq!(sum.split_whitespace().next(), Some(shipped_sum));
    // A standard unpacker reads it too.
    let bundle = umoci_unpack(&env, &layout);
    assert!(std::fs::read(bundle.join("rootfs/plugin.wasm")).unwrap() == shipped);
}

/// The image of OCI layout `layout` unpacked by umoci (rootless) into the test's log folder:
/// the bundle's folder (its `rootfs/` holds the files).
fn umoci_unpack(env: &TestEnv, layout: &Path) -> PathBuf {
    let bundle = env.log_dir().join("unpacked");
    let image = format!("{}:{VERSION}", layout.display());
    let unpack = ["unpack", "--rootless", "--image", &image];
    run(
        "umoci",
        &[&unpack[..], &[bundle.to_str().unwrap()]].concat(),
    );
    bundle
}

/// The control plane's image: unpacked by umoci, its odmesh-control runs on the image's own
/// dynamic loader and libraries alone (the loader's `--library-path`, and LD_DEBUG shows
/// every library it loaded came from the image); its configuration runs it as a non-root
/// user, on the ports of the README's "Default addresses".
#[test]
fn the_control_image_runs_odmesh_control_on_its_own_libraries_as_a_non_root_user() {
    let env = TestEnv::new("packaging_control_image");
    let (out, _) = pack(&env, "dist");
    let layout = out.join(CONTROL_IMAGE);
    let manifest = skopeo_inspect(&layout, "--raw");
    assert_eq!(
        manifest["layers"].as_array().map(Vec::len),
        Some(1),
        "{manifest}"
    );
    let config = skopeo_inspect(&layout, "--config");
    assert_labels(&config);
    let run_config = &config["config"];
    assert_eq!(run_config["User"], "65532:65532", "{config}");
    assert_eq!(
        run_config["Entrypoint"],
        serde_json::json!(["/usr/local/bin/odmesh-control"])
    );
    for port in ["18000/tcp", "18001/tcp", "8761/tcp"] {
        assert!(
            run_config["ExposedPorts"].get(port).is_some(),
            "{port}: {config}"
        );
    }
    assert_eq!(
        (config["os"].as_str(), config["architecture"].as_str()),
        (Some("linux"), Some("amd64"))
    );

    let bundle = umoci_unpack(&env, &layout);
    let rootfs = bundle.join("rootfs");
    let binary = rootfs.join("usr/local/bin/odmesh-control");
    assert!(
        std::fs::read(&binary).unwrap() == std::fs::read(control_binary()).unwrap(),
        "the image's odmesh-control is not the one packed"
    );
    let state = std::fs::metadata(rootfs.join("var/lib/odmesh")).expect("the working folder");
    assert!(state.is_dir());
    let out = Command::new(rootfs.join("lib64/ld-linux-x86-64.so.2"))
        .arg("--library-path")
        .arg(rootfs.join("lib/x86_64-linux-gnu"))
        .arg(&binary)
        .arg("--version")
        .env_clear()
        .env("LD_DEBUG", "libs")
        .output()
        .expect("the image's dynamic loader runs");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("odmesh-control {VERSION}")
    );
    let loaded: Vec<&str> = (said.lines())
        .filter_map(|line| {
            line.split_once("calling init: ")
                .map(|(_, path)| path.trim())
        })
        .collect();
    assert!(
        loaded.len() >= 3,
        "LD_DEBUG named too few libraries: {said}"
    );
    let inside = rootfs.to_string_lossy();
    for path in &loaded {
        assert!(
            path.starts_with(&*inside),
            "{path} is not from the image: {loaded:?}"
        );
    }
}
