#!/usr/bin/env -S node --no-warnings
// Runs a wasm32-wasip1 command module (a `cargo test` binary) under Node's built-in WASI
// (preview1), so `cargo test --target wasm32-wasip1` runs the filter's pure tests on the
// target that ships. `.cargo/config.toml` names this script as the target's runner:
//   node scripts/wasi-run.mjs <module.wasm> [args...]
//
// - argv after the module is passed through (test filters, --nocapture, ...);
// - the current directory is preopened, so tests may read fixtures under testdata/;
// - imports from any non-WASI module (proxy-wasm's `env.proxy_*` host calls) are stubbed with
//   functions that throw: pure tests never call them, and a test that does fails loudly;
// - the exit code is the module's (a failing test exits 101); a trap (a panic aborts on
//   wasm32-wasip1) or any other error exits 1.
import { readFile } from "node:fs/promises";
import { WASI } from "node:wasi";
import process from "node:process";

const [modulePath, ...args] = process.argv.slice(2);
if (!modulePath) {
  console.error("usage: wasi-run.mjs <module.wasm> [args...]");
  process.exit(2);
}

try {
  const wasi = new WASI({
    version: "preview1",
    args: [modulePath, ...args],
    env: process.env,
    preopens: { ".": process.cwd() },
    returnOnExit: true,
  });
  const module = await WebAssembly.compile(await readFile(modulePath));

  const imports = { wasi_snapshot_preview1: wasi.wasiImport };
  for (const imp of WebAssembly.Module.imports(module)) {
    if (imp.module === "wasi_snapshot_preview1") continue;
    if (imp.kind !== "function") {
      throw new Error(`cannot stub the non-function import ${imp.module}.${imp.name}`);
    }
    imports[imp.module] ??= {};
    imports[imp.module][imp.name] = () => {
      throw new Error(`host function ${imp.module}.${imp.name} called in a WASI test run`);
    };
  }

  const instance = await WebAssembly.instantiate(module, imports);
  const code = wasi.start(instance);
  process.exit(code);
} catch (e) {
  if (e instanceof WebAssembly.RuntimeError) {
    // A Rust panic aborts on wasm32-wasip1: the trap ends the whole test binary, and libtest's
    // output capture swallows the panic message.
    console.error(`\nwasi-run: ${modulePath} trapped (${e.message}): a test panicked, which aborts ` +
      "the whole run on wasm32-wasip1.\nwasi-run: rerun with `-- --nocapture` to see its message.");
  } else {
    console.error(`wasi-run: ${modulePath}: ${e && e.stack ? e.stack : e}`);
  }
  process.exit(1);
}
