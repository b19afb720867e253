# odmesh: the verbs a user types. `make help` lists them.
SHELL := /bin/bash
.DEFAULT_GOAL := help

CARGO      ?= cargo
JOBS       ?= 2
CARGOFLAGS := -j$(JOBS)
WASM_TARGET := wasm32-wasip1
WASM_OUT   := target/$(WASM_TARGET)/wasm/odmesh_filter_wasm.wasm
DIST_WASM  := dist/odmesh_filter.wasm
DIST_NATIVE := dist/libodmesh_filter.so
ENVOY_VERSION ?= 1.40.0
# ENVOY=/path/to/envoy overrides the Envoy that `make envoy` installs.
ENVOY      ?= $(CURDIR)/.tools/envoy-$(ENVOY_VERSION)/envoy/_bin/envoy
export ENVOY

.PHONY: help
help: ## list the verbs
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

# `make run FILTER=native` runs Envoy with the native filter instead of the wasm one;
# `make run NODES=3` runs three control-plane nodes with peered embedded registries.
FILTER ?= wasm
NODES ?= 1

.PHONY: run
run: $(FILTER) envoy ## run odmesh for real: control plane, demo upstreams, Envoy with the filter (FILTER=native for the .so, NODES=3 for three peered nodes)
	$(CARGO) build $(CARGOFLAGS) -p odmesh-control -p odmesh-demo
	FILTER=$(FILTER) NODES=$(NODES) scripts/run.sh

.PHONY: test
test: lint unit fuzz-quick wasm validate e2e ## everything CI runs: lint, unit tests (host and wasm), fuzzing, Envoy tests

.PHONY: wasm
wasm: ## build the filter: dist/odmesh_filter.wasm and its .sha256
	@scripts/ensure-toolchain.sh
	$(CARGO) build $(CARGOFLAGS) --target $(WASM_TARGET) --profile wasm -p odmesh-filter-wasm
	@mkdir -p dist
	cp $(WASM_OUT) $(DIST_WASM)
	cd dist && sha256sum odmesh_filter.wasm > odmesh_filter.wasm.sha256
	@echo "$(DIST_WASM): $$(stat -c %s $(DIST_WASM)) bytes, sha256 $$(cut -d' ' -f1 $(DIST_WASM).sha256)"

.PHONY: native
native: ## build the native filter (Envoy dynamic module): dist/libodmesh_filter.so and its .sha256
	$(CARGO) build $(CARGOFLAGS) --release -p odmesh-filter-native
	@mkdir -p dist
	cp target/release/libodmesh_filter_native.so $(DIST_NATIVE)
	cd dist && sha256sum libodmesh_filter.so > libodmesh_filter.so.sha256
	@echo "$(DIST_NATIVE): $$(stat -c %s $(DIST_NATIVE)) bytes, sha256 $$(cut -d' ' -f1 $(DIST_NATIVE).sha256)"

.PHONY: envoy
envoy: ## install stock Envoy 1.40.0 from PyPI into .tools/ (ENVOY=... overrides)
	@if [ -x "$(ENVOY)" ]; then "$(ENVOY)" --version | head -1; echo "$(ENVOY)"; \
	else ENVOY_VERSION=$(ENVOY_VERSION) scripts/install-envoy.sh; fi

.PHONY: control
control: ## build the control plane (release): target/release/odmesh-control
	$(CARGO) build $(CARGOFLAGS) --release -p odmesh-control

.PHONY: dist
dist: wasm native control ## a release bundle: dist/odmesh-<version>-x86_64-linux.tar.gz (binaries, filter, bootstraps, systemd unit, SHA256SUMS, SBOM), and OCI images of the wasm filter and the control plane in dist/oci/ (docs/images.md), all reproducible
	scripts/dist.sh

.PHONY: validate
validate: wasm native envoy ## check envoy/odmesh.yaml and envoy/odmesh-native.yaml with `envoy --mode validate`
	"$(ENVOY)" --mode validate -c envoy/odmesh.yaml --log-level warn
	@echo "envoy/odmesh.yaml: valid"
	"$(ENVOY)" --mode validate -c envoy/odmesh-native.yaml --log-level warn
	@echo "envoy/odmesh-native.yaml: valid"

.PHONY: lint
lint: ## cargo fmt --check, clippy on the host and on wasm32-wasip1 (warnings denied), also of fuzz/
	@scripts/ensure-toolchain.sh
	$(CARGO) fmt --all -- --check
	$(CARGO) fmt --manifest-path fuzz/Cargo.toml --all -- --check
	$(CARGO) clippy $(CARGOFLAGS) --workspace --all-targets -- -D warnings
	$(CARGO) clippy $(CARGOFLAGS) --target $(WASM_TARGET) -p odmesh-filter -p odmesh-filter-wasm -p odmesh-names -- -D warnings
	$(CARGO) clippy $(CARGOFLAGS) --manifest-path fuzz/Cargo.toml --all-targets -- -D warnings

.PHONY: unit
unit: ## unit tests on the host, and the filter's pure tests compiled for wasm32-wasip1
	@scripts/ensure-toolchain.sh
	@scripts/install-eureka-clients.sh
	@scripts/install-eureka-java.sh
	$(CARGO) test $(CARGOFLAGS) --workspace --exclude odmesh-e2e
	@scripts/check-prereqs.sh node
	$(CARGO) test $(CARGOFLAGS) --target $(WASM_TARGET) -p odmesh-filter -p odmesh-names

# Seconds per fuzz target (docs/fuzzing.md): `make fuzz FUZZ_SECONDS=60`.
FUZZ_SECONDS ?= 300
FUZZ_QUICK_SECONDS ?= 15

.PHONY: fuzz
fuzz: ## run every fuzz target for FUZZ_SECONDS each (5 minutes by default): docs/fuzzing.md
	FUZZ_SECONDS=$(FUZZ_SECONDS) JOBS=$(JOBS) scripts/fuzz.sh

.PHONY: fuzz-quick
fuzz-quick: ## run every fuzz target briefly (FUZZ_QUICK_SECONDS, 15 s each), as make test does
	FUZZ_SECONDS=$(FUZZ_QUICK_SECONDS) JOBS=$(JOBS) scripts/fuzz.sh

.PHONY: e2e
e2e: wasm native envoy ## end-to-end tests against real Envoy, once with each filter shell (wasm, native)
	@scripts/install-eureka-clients.sh
	@scripts/install-test-tools.sh
	@scripts/install-eureka-java.sh
	$(CARGO) build $(CARGOFLAGS) -p odmesh-control
	ODMESH_FILTER=wasm $(CARGO) test $(CARGOFLAGS) -p odmesh-e2e
	ODMESH_FILTER=native $(CARGO) test $(CARGOFLAGS) -p odmesh-e2e

.PHONY: bench-deps
bench-deps: ## install the benchmark tools (nginx-light, wrk, nghttp2-client) with apt
	@scripts/bench-deps.sh

.PHONY: bench-build
bench-build: wasm native envoy bench-deps
	$(CARGO) build $(CARGOFLAGS) --release -p odmesh-control -p odmesh-bench
	$(CARGO) build $(CARGOFLAGS) --release -p odmesh-e2e --bin odmesh-xds-flood

.PHONY: bench-quick
bench-quick: bench-build ## benchmarks, smaller counts (< 5 min): docs/bench/quick/latest.md
	python3 bench/run.py --quick

# Section 4 beside go-control-plane (bench/gcp, needs `go`; also part of `make bench`'s run.py):
# docs/bench/gcp-<commit>.json.
.PHONY: bench-gcp
bench-gcp: bench-build ## xds-load against go-control-plane and odmesh-control, alternating: docs/bench/gcp-<commit>.json
	python3 bench/run.py --only gcp

.PHONY: bench
bench: bench-build ## the full benchmarks (docs/benchmarks.md): docs/bench/latest.md, then the two shells, failover and the flood
	python3 bench/run.py
	$(MAKE) bench-shells
	$(MAKE) bench-features
	$(MAKE) bench-failover
	$(MAKE) bench-flood
	$(MAKE) bench-eureka-follow

# The request chains against a static route, alternating rounds of one run (docs/benchmarks.md,
# "6. Two shells"; bench/chains.py: static, floor, native, wasm, wasm-empty, every Envoy on CPU 0,
# nginx and wrk on CPU 1); SHELLS_ROUNDS rounds of SHELLS_SECONDS seconds each. Beside them, the
# wasm filter as it was before the SDK shell (its hand-written proxy-wasm ABI, built from commit
# SHELLS_HAND_ABI by bench/probes/hand_abi_wasm.sh); SHELLS_HAND_ABI= leaves it out.
# SHELLS_CHAINS: more chains, bench/chains.py's `--chain NAME=FILE` each (space-separated), e.g.
# `make bench-shells SHELLS_CHAINS="native-ca74098=$(bench/probes/native_at.sh ca74098)"` (the
# module as an HTTP filter, before ce73175).
# 72 rounds: a multiple of the six chains (each runs as often in each place of the order), and
# a 95% interval of about ±0.015 on native/static CPU per request at a pilot's per-round SD
# (0.06); the report prints the rounds the run's own SD asks for.
SHELLS_ROUNDS ?= 72
SHELLS_SECONDS ?= 4
SHELLS_HAND_ABI ?= 702a260
SHELLS_CHAINS ?=

.PHONY: bench-shells
bench-shells: bench-build ## the request chains (static, floor, native, wasm, wasm-empty) in alternating rounds: docs/bench/chains.json
	python3 bench/chains.py --rounds $(SHELLS_ROUNDS) --seconds $(SHELLS_SECONDS) \
	  $(if $(SHELLS_HAND_ABI),--chain wasm-hand-abi=$$(JOBS=$(JOBS) bench/probes/hand_abi_wasm.sh $(SHELLS_HAND_ABI) /tmp/odmesh-hand-abi.wasm)) \
	  $(foreach c,$(SHELLS_CHAINS),--chain $(c)) \
	  --out docs/bench/chains.json

# What hedging and faults cost the requests that use neither (docs/benchmarks.md, "6b. Hedging
# and faults elsewhere"; bench/features.py: native and wasm for a caller without them, for one
# with them on ten other VIPs, and with the bootstraps before the fault filter), FEATURES_ROUNDS
# rounds of SHELLS_SECONDS seconds each.
FEATURES_ROUNDS ?= 30

.PHONY: bench-features
bench-features: bench-build ## hedging and faults on other VIPs against none, alternating rounds: docs/bench/features.json
	python3 bench/features.py --rounds $(FEATURES_ROUNDS) --seconds $(SHELLS_SECONDS) \
	  --out docs/bench/features.json

# A replica's death, FAILOVER_ROUNDS times (docs/benchmarks.md, "8. Control-plane failover").
FAILOVER_ROUNDS ?= 20

.PHONY: bench-failover
bench-failover: bench-build ## kill the control-plane replica Envoy is connected to, time until it is served again: docs/bench/failover.json
	python3 bench/failover.py --rounds $(FAILOVER_ROUNDS) --out docs/bench/failover.json

# Another proxy's first requests beside a flood (docs/benchmarks.md, "9. Fairness under a
# flood"); FLOOD_VIPS first requests in each phase.
FLOOD_VIPS ?= 400

.PHONY: bench-flood
bench-flood: bench-build ## first requests while a raw client floods the control plane with a million names: docs/bench/flood.json
	python3 bench/flood.py --vips $(FLOOD_VIPS) --out docs/bench/flood.json

# A real Eureka server followed by odmesh (docs/benchmarks.md, "11. Following a real Eureka
# server"): registration → route and cancel → refused, EUREKA_ROUNDS rounds with a 1 s poll,
# EUREKA_SLOW_ROUNDS with Eureka's and odmesh's 30 s defaults.
EUREKA_ROUNDS ?= 10
EUREKA_SLOW_ROUNDS ?= 4

.PHONY: bench-eureka-follow
bench-eureka-follow: bench-build ## a real Eureka server's changes to Envoy, by its response cache and odmesh's poll: docs/bench/eureka-follow.json
	@scripts/install-eureka-java.sh
	python3 bench/eureka_follow.py --rounds $(EUREKA_ROUNDS) --slow-rounds $(EUREKA_SLOW_ROUNDS) --out docs/bench/eureka-follow.json

.PHONY: clean
clean: ## remove build output (keeps the installed Envoy)
	$(CARGO) clean
	rm -rf dist tests/logs
