//! What the setup scripts cannot install, they check for and name: a C compiler and Node.js 20
//! (`scripts/check-prereqs.sh`). The missing or old tools are stand-ins on a PATH of the
//! test's own: a machine cannot be made to lack its compiler for a test.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use odmesh_e2e::TestEnv;
use odmesh_e2e::paths::repo_root;

/// Runs the check for `needs` with PATH set to `path` only; its exit status and stderr.
fn check(path: &Path, needs: &[&str]) -> (bool, String) {
    let out = Command::new("/bin/bash")
        .arg(repo_root().join("scripts/check-prereqs.sh"))
        .args(needs)
        .env_clear()
        .env("PATH", path)
        .output()
        .expect("bash runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A stand-in `name` on the test's PATH that prints `output`.
fn stand_in(env: &TestEnv, name: &str, output: &str) {
    let path = env.write_file(name, &format!("#!/bin/sh\necho '{output}'\n"));
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

#[test]
fn this_machine_has_what_the_scripts_need() {
    let path = std::env::var_os("PATH").expect("a PATH");
    let (ok, err) = check(Path::new(&path), &["cc", "node"]);
    assert!(ok, "{err}");
    assert!(err.is_empty(), "{err}");
}

#[test]
fn a_missing_compiler_and_node_are_each_named_with_what_to_install() {
    let env = TestEnv::new("setup_missing");
    let (ok, err) = check(env.log_dir(), &["cc", "node"]);
    assert!(!ok);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 2, "{err}");
    assert!(
        lines[0].contains("no C compiler") && lines[0].contains("build-essential"),
        "{err}"
    );
    assert!(
        lines[1].contains("Node.js 20 or later") && lines[1].contains("nodejs.org"),
        "{err}"
    );
}

#[test]
fn node_older_than_20_is_refused_naming_its_version_and_20_is_taken() {
    let env = TestEnv::new("setup_node_versions");
    stand_in(&env, "cc", "");
    stand_in(&env, "node", "18.19.1");
    let (ok, err) = check(env.log_dir(), &["cc", "node"]);
    assert!(!ok);
    assert!(
        err.contains("found '18.19.1'") && err.contains("20 or later"),
        "{err}"
    );
    assert!(!err.contains("C compiler"), "{err}");
    for taken in ["20.0.0", "22.11.0"] {
        stand_in(&env, "node", taken);
        let (ok, err) = check(env.log_dir(), &["cc", "node"]);
        assert!(ok, "{taken}: {err}");
    }
    stand_in(&env, "node", "garbage");
    assert!(!check(env.log_dir(), &["node"]).0);
}
