//! The control plane's command line: bad input is refused at start with one clear line.

use std::process::Command;
use std::time::Duration;

use odmesh_e2e::{TestEnv, control_binary, free_port};

/// Starts odmesh-control with `args` and returns its exit status and output; it must exit.
fn start_expecting_exit(env: &TestEnv, label: &str, args: &[&str]) -> (bool, String) {
    exit_of(env, label, control_on_free_ports(args))
}

/// odmesh-control with `args`, its xDS and admin servers on free loopback ports.
fn control_on_free_ports(args: &[&str]) -> Command {
    let mut cmd = Command::new(control_binary());
    let xds = format!("127.0.0.1:{}", free_port());
    let admin = format!("127.0.0.1:{}", free_port());
    cmd.args(["--xds", &xds, "--admin", &admin]).args(args);
    cmd
}

/// Starts `cmd` and returns its exit status and output; it must exit.
fn exit_of(env: &TestEnv, label: &str, cmd: Command) -> (bool, String) {
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

/// Every flag can come from its environment variable (`ODMESH_<FLAG>`), and a flag given on
/// the command line wins over it.
#[test]
fn flags_come_from_odmesh_variables_and_a_flag_given_wins() {
    let env = TestEnv::new("cli_env_flags");
    let reg = env.write_file(
        "registry.yaml",
        "instances: [{app: hello, ip: 127.0.0.1, port: 8080}]\n",
    );
    let (xds, from_env, from_flag) = (free_port(), free_port(), free_port());
    let mut cmd = Command::new(control_binary());
    cmd.env("ODMESH_REGISTRY", &reg)
        .env("ODMESH_XDS", format!("127.0.0.1:{xds}"))
        .env("ODMESH_ADMIN", format!("127.0.0.1:{from_env}"))
        .args(["--admin", &format!("127.0.0.1:{from_flag}")]);
    let child = env.spawn("control", cmd);
    let accepts = |port: u16| std::net::TcpStream::connect(("127.0.0.1", port)).is_ok();
    odmesh_e2e::wait::wait_until(Duration::from_secs(20), "the xDS and admin ports", || {
        accepts(xds) && accepts(from_flag)
    });
    assert!(
        !accepts(from_env),
        "the admin port of the variable: {}",
        child.log()
    );
}

#[test]
fn a_bad_value_in_a_variable_is_refused_at_start_naming_the_flag() {
    let env = TestEnv::new("cli_env_bad_value");
    let mut cmd = control_on_free_ports(&["--eureka", "http://127.0.0.1:9/eureka"]);
    cmd.env("ODMESH_EUREKA_INTERVAL", "soon");
    let (ok, log) = exit_of(&env, "control", cmd);
    assert!(!ok, "{log}");
    assert!(
        log.contains("--eureka-interval") && log.contains("soon"),
        "{log}"
    );
}

#[test]
fn with_log_format_json_every_log_line_is_one_json_object() {
    let env = TestEnv::new("cli_log_json");
    let reg = env.write_file(
        "registry.yaml",
        "instances: [{app: hello, ip: 127.0.0.1, port: 8080}]\n",
    );
    let mut cmd = control_on_free_ports(&["--registry", &reg.to_string_lossy()]);
    cmd.env("ODMESH_LOG_FORMAT", "json");
    let child = env.spawn("control", cmd);
    // The registry's load is logged.
    let lines = odmesh_e2e::wait::wait_for(Duration::from_secs(20), "a log line", || {
        let log = child.log();
        // Whole lines only: the last one may be still being written.
        let whole = &log[..log.rfind('\n').map_or(0, |end| end + 1)];
        (whole.contains("registry")).then(|| whole.lines().map(str::to_owned).collect::<Vec<_>>())
    });
    for line in &lines {
        let object: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert!(
            object["level"].is_string() && object["timestamp"].is_string(),
            "{line}"
        );
        assert!(object["fields"]["message"].is_string(), "{line}");
    }
}
