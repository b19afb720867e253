//! The control plane's command line: bad input is refused at start with one clear line.

use std::process::Command;
use std::time::Duration;

use odmesh_e2e::{TestEnv, control_binary, free_port};

/// Starts odmesh-control with `args` and returns its exit status and output; it must exit.
fn start_expecting_exit(env: &TestEnv, label: &str, args: &[&str]) -> (bool, String) {
    let mut cmd = Command::new(control_binary());
    let xds = format!("127.0.0.1:{}", free_port());
    let admin = format!("127.0.0.1:{}", free_port());
    cmd.args(["--xds", &xds, "--admin", &admin]).args(args);
    let mut child = env.spawn(label, cmd);
    let status = child.wait_exit(Duration::from_secs(10));
    (status.success(), child.log())
}

#[test]
fn a_registry_file_that_does_not_parse_is_refused_at_start_naming_the_file_and_line() {
    let env = TestEnv::new("cli_bad_registry");
    let reg = env.write_file(
        "registry.yaml",
        "instances: [\n  {app: hello, ip: 127.0.0.1\n",
    );
    let reg = reg.to_string_lossy().into_owned();
    let (ok, log) = start_expecting_exit(&env, "control", &["--registry", &reg]);
    assert!(!ok, "odmesh-control started with a broken registry: {log}");
    let line = log.lines().last().unwrap_or_default();
    assert!(line.starts_with("error: --registry:"), "{log}");
    assert!(
        line.contains("registry.yaml") && line.contains("line"),
        "{log}"
    );
}

#[test]
fn an_upstream_ca_without_a_certificate_is_refused_at_start() {
    let env = TestEnv::new("cli_bad_ca");
    let reg = env.write_file("registry.yaml", "instances: []\n");
    let ca = env.write_file("ca.pem", "not a certificate\n");
    let (reg, ca) = (reg.to_string_lossy(), ca.to_string_lossy());
    let (ok, log) =
        start_expecting_exit(&env, "control", &["--registry", &reg, "--upstream-ca", &ca]);
    assert!(
        !ok,
        "odmesh-control started with a CA bundle Envoy cannot use: {log}"
    );
    assert!(
        log.contains("--upstream-ca") && log.contains("no PEM certificate"),
        "{log}"
    );
}

#[test]
fn a_duration_share_or_count_that_is_not_one_is_refused_at_start_naming_the_flag_and_why() {
    let env = TestEnv::new("cli_bad_values");
    let reg = env.write_file("registry.yaml", "instances: []\n");
    let reg = reg.to_string_lossy().into_owned();
    for (i, (flag, value, says)) in [
        ("--eureka-interval", "0", "must be more than 0"),
        ("--load-report-interval", "2y", "unknown unit \"y\""),
        ("--registry-drop-confirm", "soon", "is not a duration"),
        ("--max-registry-drop", "1.5", "not a share from 0 to 1"),
        ("--xds-max-names", "0", "must be at least 1"),
    ]
    .into_iter()
    .enumerate()
    {
        let label = format!("control-{i}");
        let (ok, log) = start_expecting_exit(&env, &label, &["--registry", &reg, flag, value]);
        assert!(!ok, "odmesh-control started with {flag} {value}: {log}");
        assert!(
            log.contains(&format!("'{value}' for '{flag}")) && log.contains(says),
            "{flag} {value}: {log}"
        );
    }
}
