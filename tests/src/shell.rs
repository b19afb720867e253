//! Which of the filter's two shells the real-Envoy tests run: the proxy-wasm module
//! (`dist/odmesh_filter.wasm`) or the native dynamic module (`dist/libodmesh_filter.so`).
//!
//! `ODMESH_FILTER=wasm` (the default) or `ODMESH_FILTER=native` chooses, for the whole run:
//! [`Mesh`](crate::Mesh) starts Envoy from `envoy/odmesh.yaml` or `envoy/odmesh-native.yaml`,
//! and the filter tests put [`Shell::http_filter`] and [`Shell::route`] where their
//! bootstraps say `${FILTER}` and `${ROUTE}`.
//! `make e2e` runs the suite once with each, so every test runs against both.

use std::env;
use std::path::PathBuf;

use crate::paths::repo_root;

/// One of the filter's shells.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shell {
    Wasm,
    Native,
}

impl Shell {
    /// The shell this run tests: `ODMESH_FILTER` (`wasm` or `native`), `wasm` if unset.
    /// Panics on anything else, so a typo cannot quietly test the other one.
    pub fn current() -> Shell {
        match env::var("ODMESH_FILTER").as_deref() {
            Err(_) | Ok("") | Ok("wasm") => Shell::Wasm,
            Ok("native") => Shell::Native,
            Ok(other) => panic!("ODMESH_FILTER={other:?}: expected `wasm` or `native`"),
        }
    }

    /// The built filter; panics telling which `make` target builds it if it is missing.
    pub fn artifact(self) -> PathBuf {
        let (file, target) = match self {
            Shell::Wasm => ("dist/odmesh_filter.wasm", "make wasm"),
            Shell::Native => ("dist/libodmesh_filter.so", "make native"),
        };
        let path = repo_root().join(file);
        assert!(
            path.is_file(),
            "the filter is not built: {} is missing; run `{target}`",
            path.display()
        );
        path
    }

    /// The shipped bootstrap that loads this shell, in `envoy/`.
    pub fn bootstrap(self) -> &'static str {
        match self {
            Shell::Wasm => "odmesh.yaml",
            Shell::Native => "odmesh-native.yaml",
        }
    }

    /// The name in Envoy's `/stats` of the filter's counter `name` (`odmesh_requests_vip`...).
    pub fn counter(self, name: &str) -> String {
        match self {
            Shell::Wasm => format!("wasmcustom.{name}"),
            Shell::Native => format!("dynamicmodulescustom.{name}"),
        }
    }

    /// The HTTP filter entry that runs this shell with `config` (the filter's JSON
    /// configuration), as YAML lines indented by `indent` spaces (a list item); nothing for
    /// the native module, which runs in the route ([`Shell::route`]). Wasm filters share one
    /// VM (`vm_id: odmesh`), the way the shipped bootstrap configures it.
    pub fn http_filter(self, config: &str, indent: usize) -> String {
        let artifact = self.artifact();
        let artifact = artifact.to_string_lossy();
        let config = yaml_quoted(config);
        let lines = match self {
            Shell::Wasm => format!(
                "- name: envoy.filters.http.wasm
  typed_config:
    \"@type\": type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm
    config:
      name: odmesh
      root_id: odmesh
      configuration:
        \"@type\": type.googleapis.com/google.protobuf.StringValue
        value: {config}
      vm_config:
        vm_id: odmesh
        runtime: envoy.wasm.runtime.v8
        code: {{local: {{filename: '{artifact}'}}}}"
            ),
            Shell::Native => return String::new(),
        };
        indented(&lines, indent)
    }

    /// The test bootstraps' route to the mapped cluster, as YAML lines indented by `indent`
    /// spaces (the route's keys after its `match`): for wasm, the cluster header the filter
    /// writes (`cluster_header` in `config`, `x-odmesh-cluster` by default); for the native
    /// module, the module as the route's cluster specifier with `config`, and the headers the
    /// shipped route removes (envoy/odmesh-native.yaml).
    pub fn route(self, config: &str, indent: usize) -> String {
        let lines = match self {
            Shell::Wasm => {
                let configured: Option<serde_json::Value> = serde_json::from_str(config).ok();
                let header = (configured.as_ref())
                    .and_then(|c| c["cluster_header"].as_str())
                    .unwrap_or("x-odmesh-cluster");
                format!("route: {{cluster_header: {header}}}")
            }
            Shell::Native => {
                let artifact = self.artifact();
                let artifact = artifact.to_string_lossy();
                let config = yaml_quoted(config);
                format!(
                    "request_headers_to_remove: [x-odmesh-secure, x-odmesh-cluster]
route:
  inline_cluster_specifier_plugin:
    extension:
      name: envoy.router.cluster_specifier_plugin.dynamic_modules
      typed_config:
        \"@type\": type.googleapis.com/envoy.extensions.router.cluster_specifiers.dynamic_modules.v3.DynamicModuleClusterSpecifier
        dynamic_module_config:
          module: {{local: {{filename: '{artifact}'}}}}
          do_not_close: true
        specifier_name: odmesh
        specifier_config:
          \"@type\": type.googleapis.com/google.protobuf.StringValue
          value: {config}"
                )
            }
        };
        indented(&lines, indent)
    }

    /// What an upstream sees in the cluster header of a request routed to `cluster`: the wasm
    /// filter writes the header (its route reads it); the native module writes none, and its
    /// route removes one a caller sent.
    pub fn cluster_header_upstream(self, cluster: &str) -> serde_json::Value {
        match self {
            Shell::Wasm => serde_json::Value::from(cluster),
            Shell::Native => serde_json::Value::Null,
        }
    }
}

/// `text` as a YAML single-quoted string: a quote is written twice.
fn yaml_quoted(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// `lines`, each indented by `indent` spaces and ended by a newline.
fn indented(lines: &str, indent: usize) -> String {
    let pad = " ".repeat(indent);
    lines.lines().map(|line| format!("{pad}{line}\n")).collect()
}
