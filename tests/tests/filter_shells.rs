//! The two shells of the filter side by side: the native bootstrap is the wasm one with the
//! mapping in the route instead of a filter, both bootstraps validate, the native module's ABI
//! is the shipped Envoy's (each callback it imports is one Envoy exports, each hook it exports
//! one Envoy looks up), and Envoy treats a native module built for another ABI version as it
//! says (a warning, and the module still runs). The rest of the real-Envoy suite runs once per
//! shell (`make e2e`; `odmesh_e2e::Shell`). Needs `make envoy`, `make wasm`, `make native` and
//! binutils' `nm`.

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;
use std::process::Command;

use odmesh_e2e::{
    EchoUpstream, Envoy, Request, Shell, TestEnv, envoy_binary, render, shipped_bootstrap,
};

/// The ABI version the native module is built for (filter/native/src/abi.rs), as it sits in
/// the `.so`: NUL-terminated.
const ABI_VERSION: &[u8] = b"v0.2.0\0";

/// `yaml` split at its local replies: what comes before `local_reply_config:` (without the
/// node's metadata, which names the mapping), the local replies up to `http_filters:`, and
/// the HTTP filters to the end.
fn sections(yaml: &str) -> (String, &str, &str) {
    let replies = yaml
        .find("local_reply_config:")
        .expect("a local_reply_config");
    let filters = yaml.find("http_filters:").expect("http_filters");
    let mut in_metadata = false;
    let before: Vec<&str> = (yaml[..replies].lines())
        .filter(|line| {
            let indent = line.len() - line.trim_start().len();
            if line.trim_start().starts_with("metadata:") && indent == 2 {
                in_metadata = true;
                return false;
            }
            in_metadata &= indent > 2;
            !in_metadata
        })
        .collect();
    (before.join("\n"), &yaml[replies..filters], &yaml[filters..])
}

/// `filters` (an `http_filters:` list) without the entry named `name`.
fn without_http_filter(filters: &str, name: &str) -> String {
    let lines: Vec<&str> = filters.lines().collect();
    let entry = format!("- name: {name}");
    let start = (lines.iter())
        .position(|l| l.trim_start() == entry)
        .unwrap_or_else(|| panic!("no HTTP filter {name}"));
    let indent = lines[start].len() - lines[start].trim_start().len();
    let end = (start + 1..lines.len())
        .find(|&i| {
            let l = lines[i];
            l.len() - l.trim_start().len() == indent && l.trim_start().starts_with("- ")
        })
        .expect("a filter after it");
    let mut out: Vec<&str> = lines[..start].to_vec();
    out.extend(&lines[end..]);
    out.join("\n")
}

#[test]
fn the_native_bootstrap_is_the_wasm_one_with_the_mapping_in_the_route() {
    let wasm = shipped_bootstrap("odmesh.yaml", &[]);
    let native = shipped_bootstrap("odmesh-native.yaml", &[]);
    assert!(wasm.contains("envoy.filters.http.wasm"));
    assert!(wasm.contains("mapping: wasm"));
    // The native module's one HTTP filter is the concurrency limit, switched off unless a
    // route switches it on; the wasm bootstrap's is the same module's second plugin.
    assert_eq!(native.matches("DynamicModuleFilter").count(), 1);
    assert!(!wasm.contains("dynamic_modules"));
    let limit_off = "- name: odmesh.limit\n            disabled: true\n";
    assert!(native.contains(limit_off));
    assert!(wasm.contains(limit_off));
    assert!(wasm.contains("root_id: odmesh_limit\n"));
    assert_eq!(
        wasm.matches("vm_id: odmesh\n").count(),
        2,
        "one VM for both plugins"
    );
    assert!(native.contains("mapping: native"));
    assert!(native.contains("module: dist/libodmesh_filter.so"));
    let (wasm_before, wasm_replies, wasm_filters) = sections(&wasm);
    let (native_before, native_replies, native_filters) = sections(&native);
    assert_eq!(
        wasm_before, native_before,
        "the two bootstraps must be the same up to their local replies, but for the node's \
         metadata"
    );
    let wasm_rest = without_http_filter(wasm_filters, "envoy.filters.http.wasm");
    assert_eq!(
        without_http_filter(&wasm_rest, "odmesh.limit"),
        without_http_filter(native_filters.trim_end(), "odmesh.limit"),
        "the native bootstrap's HTTP filters must be the wasm one's without the mapping filter, \
         each with its shell's concurrency limit"
    );
    // The local replies: the native ones hold every line of the wasm ones except those that
    // read the cluster header the wasm filter writes.
    let native_lines: BTreeSet<&str> = native_replies.lines().collect();
    let missing: Vec<&str> = (wasm_replies.lines())
        .filter(|l| !l.contains("x-odmesh-cluster") && !native_lines.contains(l))
        .collect();
    assert!(
        missing.is_empty(),
        "envoy/odmesh-native.yaml's local replies lack these lines of envoy/odmesh.yaml's: \
         {missing:#?}"
    );
}

/// The dynamic symbols of `file` that start with `prefix`: defined ones, or undefined ones.
fn symbols(file: &Path, defined: bool, prefix: &str) -> BTreeSet<String> {
    let which = if defined {
        "--defined-only"
    } else {
        "--undefined-only"
    };
    let out = Command::new("nm")
        .args(["-D", which])
        .arg(file)
        .output()
        .unwrap_or_else(|e| panic!("cannot run nm (binutils) on {}: {e}", file.display()));
    assert!(out.status.success(), "nm {}: {out:?}", file.display());
    (String::from_utf8_lossy(&out.stdout).lines())
        .filter_map(|line| line.split_whitespace().last())
        .filter(|name| name.starts_with(prefix))
        .map(str::to_owned)
        .collect()
}

#[test]
fn every_callback_the_native_module_imports_is_one_envoy_exports() {
    let prefix = "envoy_dynamic_module_callback_";
    let imported = symbols(&Shell::Native.artifact(), false, prefix);
    let exported = symbols(&envoy_binary(), true, prefix);
    assert!(
        imported.contains("envoy_dynamic_module_callback_cluster_specifier_set_cluster_name"),
        "the module should import the specifier's callbacks: {imported:?}"
    );
    let missing: Vec<&String> = imported.difference(&exported).collect();
    assert!(
        missing.is_empty(),
        "the native module calls these, which the shipped Envoy does not export: {missing:?}"
    );
}

#[test]
fn every_hook_the_native_module_exports_is_one_envoy_looks_up() {
    let hooks = symbols(&Shell::Native.artifact(), true, "envoy_dynamic_module_on_");
    // The cluster specifier's hooks, and the HTTP filter's (the concurrency limit): every one
    // Envoy 1.40 looks up for an HTTP filter, since it refuses a module that lacks one.
    let specifier = [
        "program_init",
        "cluster_specifier_config_new",
        "cluster_specifier_config_destroy",
        "cluster_specifier_select",
    ];
    let http_filter = [
        "config_new",
        "config_destroy",
        "per_route_config_new",
        "per_route_config_destroy",
        "new",
        "destroy",
        "request_headers",
        "request_body",
        "request_trailers",
        "response_headers",
        "response_body",
        "response_trailers",
        "stream_complete",
        "local_reply",
        "scheduled",
        "http_callout_done",
        "http_stream_headers",
        "http_stream_data",
        "http_stream_trailers",
        "http_stream_complete",
        "http_stream_reset",
        "config_scheduled",
        "config_http_callout_done",
        "config_http_stream_headers",
        "config_http_stream_data",
        "config_http_stream_trailers",
        "config_http_stream_complete",
        "config_http_stream_reset",
        "downstream_above_write_buffer_high_watermark",
        "downstream_below_write_buffer_low_watermark",
    ];
    let expected: BTreeSet<String> = (specifier.iter())
        .map(|h| format!("envoy_dynamic_module_on_{h}"))
        .chain(
            http_filter
                .iter()
                .map(|h| format!("envoy_dynamic_module_on_http_filter_{h}")),
        )
        .collect();
    assert_eq!(hooks, expected, "the module's hooks");
    // Envoy finds hooks by name (dlsym), so each name is a string in its binary.
    let envoy = fs::read(envoy_binary()).expect("the Envoy binary");
    for hook in &hooks {
        let needle = format!("{hook}\0");
        assert!(
            envoy.windows(needle.len()).any(|w| w == needle.as_bytes()),
            "the shipped Envoy never looks up {hook}"
        );
    }
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
    let route = Shell::Native.route("{}", 16).replace(
        &Shell::Native.artifact().to_string_lossy().into_owned(),
        &path.to_string_lossy(),
    );
    let bootstrap = render(
        include_str!("../envoy/filter-test.yaml"),
        &[
            ("FILTER", ""),
            ("ROUTE", &route),
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
