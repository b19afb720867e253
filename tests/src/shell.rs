//! Which of the filter's two shells the real-Envoy tests run: the proxy-wasm module
//! (`dist/odmesh_filter.wasm`) or the native dynamic module (`dist/libodmesh_filter.so`).
//!
//! `ODMESH_FILTER=wasm` (the default) or `ODMESH_FILTER=native` chooses, for the whole run:
//! [`Mesh`](crate::Mesh) starts Envoy from `envoy/odmesh.yaml` or `envoy/odmesh-native.yaml`,
//! and the filter tests put [`Shell::http_filter`] where their bootstraps say `${FILTER}`.
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
    /// configuration), as YAML lines indented by `indent` spaces (a list item). Wasm filters
    /// share one VM (`vm_id: odmesh`), the way the shipped bootstrap configures it.
    pub fn http_filter(self, config: &str, indent: usize) -> String {
        let artifact = self.artifact();
        let artifact = artifact.to_string_lossy();
        // A YAML single-quoted string: a quote is written twice.
        let config = config.replace('\'', "''");
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
        value: '{config}'
      vm_config:
        vm_id: odmesh
        runtime: envoy.wasm.runtime.v8
        code: {{local: {{filename: '{artifact}'}}}}"
            ),
            Shell::Native => format!(
                "- name: envoy.filters.http.dynamic_modules
  typed_config:
    \"@type\": type.googleapis.com/envoy.extensions.filters.http.dynamic_modules.v3.DynamicModuleFilter
    dynamic_module_config:
      module: {{local: {{filename: '{artifact}'}}}}
      do_not_close: true
    filter_name: odmesh
    filter_config:
      \"@type\": type.googleapis.com/google.protobuf.StringValue
      value: '{config}'"
            ),
        };
        let pad = " ".repeat(indent);
        lines.lines().map(|line| format!("{pad}{line}\n")).collect()
    }
}
