//! The two shells of the filter side by side: the native bootstrap is the wasm one with the
//! other filter, both bootstraps validate, and Envoy treats a native module built for another
//! ABI version as it says (a warning, and the module still runs). The rest of the real-Envoy
//! suite runs once per shell (`make e2e`; `odmesh_e2e::Shell`). Needs `make envoy`,
//! `make wasm` and `make native`.

use std::fs;

use odmesh_e2e::{EchoUpstream, Envoy, Request, Shell, TestEnv, render, shipped_bootstrap};

/// The ABI version the native module is built for (filter/native/src/abi.rs), as it sits in
/// the `.so`: NUL-terminated.
const ABI_VERSION: &[u8] = b"v0.2.0\0";

/// `yaml` without its first HTTP filter entry (from its `- name:` line to the next one).
fn without_first_http_filter(yaml: &str) -> String {
    let lines: Vec<&str> = yaml.lines().collect();
    let start = (lines.iter())
        .position(|l| l.trim_start().starts_with("- name: envoy.filters.http."))
        .expect("an HTTP filter");
    let indent = lines[start].len() - lines[start].trim_start().len();
    let end = (start + 1..lines.len())
        .find(|&i| {
            let l = lines[i];
            l.len() - l.trim_start().len() == indent && l.trim_start().starts_with("- ")
        })
        .expect("a filter after the first");
    let mut out: Vec<&str> = lines[..start].to_vec();
    out.extend(&lines[end..]);
    out.join("\n")
}

#[test]
fn the_native_bootstrap_is_the_wasm_one_with_the_native_filter() {
    let wasm = shipped_bootstrap("odmesh.yaml", &[]);
    let native = shipped_bootstrap("odmesh-native.yaml", &[]);
    assert!(wasm.contains("envoy.filters.http.wasm"));
    assert!(native.contains("envoy.filters.http.dynamic_modules"));
    assert!(native.contains("filename: dist/libodmesh_filter.so"));
    assert_eq!(
        without_first_http_filter(&wasm),
        without_first_http_filter(&native),
        "envoy/odmesh-native.yaml must differ from envoy/odmesh.yaml in its first HTTP filter only"
    );
}

#[test]
fn both_shipped_bootstraps_validate_with_their_filter() {
    let env = TestEnv::new("shells_validate");
    for shell in [Shell::Wasm, Shell::Native] {
        shell.artifact();
        let yaml = shipped_bootstrap(shell.bootstrap(), &[]);
        let (status, log) = Envoy::validate(&env, shell.bootstrap(), &yaml);
        assert!(
            status.success(),
            "{} did not validate:\n{log}",
            shell.bootstrap()
        );
    }
}

#[test]
fn a_native_module_of_another_abi_version_loads_with_envoys_warning() {
    let env = TestEnv::new("shells_abi_version");
    let built = fs::read(Shell::Native.artifact()).expect("the native module");
    let at: Vec<usize> = (built.windows(ABI_VERSION.len()).enumerate())
        .filter(|(_, w)| *w == ABI_VERSION)
        .map(|(i, _)| i)
        .collect();
    assert_eq!(at.len(), 1, "the module should hold its ABI version once");
    // The same module, saying it was built for v0.1.9.
    let mut other = built.clone();
    other[at[0]..at[0] + ABI_VERSION.len()].copy_from_slice(b"v0.1.9\0");
    let path = env.log_dir().join("libodmesh_filter_v0.1.9.so");
    fs::write(&path, &other).expect("write the module copy");

    let vip = EchoUpstream::start("hello.vip");
    let svip = EchoUpstream::start("hello.svip");
    let filter = Shell::Native.http_filter("{}", 10).replace(
        &Shell::Native.artifact().to_string_lossy().into_owned(),
        &path.to_string_lossy(),
    );
    let bootstrap = render(
        include_str!("../envoy/filter-test.yaml"),
        &[
            ("FILTER", &filter),
            ("VIP_PORT", &vip.port().to_string()),
            ("SVIP_PORT", &svip.port().to_string()),
        ],
    );
    let envoy = Envoy::start(&env, "envoy", &bootstrap);
    let log = envoy.log();
    assert!(
        log.contains("Dynamic module ABI version v0.1.9 is deprecated"),
        "Envoy should warn about the other ABI version:\n{log}"
    );
    let response = Request::get("/")
        .host("hello")
        .send(envoy.listener("egress"));
    assert_eq!(response.status, 200, "{}", response.text());
}
