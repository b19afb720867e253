//! What ships beside the binaries: the systemd unit and its example environment file
//! (`packaging/systemd/`).

use std::process::Command;
use std::time::Duration;

use odmesh_e2e::paths::repo_root;
use odmesh_e2e::{TestEnv, control_binary, free_port};

const SHIPPED_EXEC: &str = "ExecStart=/usr/local/bin/odmesh-control";

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

/// `scripts/dist.sh` (`make dist`) on this build: what the bundle holds, its checksums, its
/// SBOM, and the same bytes when packed again.
#[test]
fn the_release_bundle_holds_what_ships_checks_out_and_packs_the_same_twice() {
    let env = TestEnv::new("packaging_dist");
    let pack = |out: &str| {
        let out = env.log_dir().join(out);
        let status = Command::new(repo_root().join("scripts/dist.sh"))
            .env("CONTROL", control_binary())
            .env("OUT", &out)
            .status()
            .expect("dist.sh runs");
        assert!(status.success(), "dist.sh failed");
        let mut found = std::fs::read_dir(&out).unwrap().map(|e| e.unwrap().path());
        let tarball = found
            .find(|p| p.extension().is_some_and(|e| e == "gz"))
            .expect("a .tar.gz");
        (tarball.clone(), std::fs::read(tarball).unwrap())
    };
    let (tarball, first) = pack("one");
    let (_, second) = pack("two");
    assert!(first == second, "packed twice, the bundles differ");
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
