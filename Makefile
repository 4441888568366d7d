# Targets the README names. `make run` and `make test` work on a fresh machine.
SHELL := /bin/bash
CARGO ?= cargo
PROFILE ?= release
BIN := target/$(PROFILE)/nextmini
EXAMPLE ?= manifests/examples/line3.yaml

.PHONY: setup build run demo test lint unit e2e crds down clean fuzz bench

setup:
	@scripts/setup.sh

build: setup
	$(CARGO) build --workspace --$(PROFILE)

# Brings up line3, sends real traffic through it and shows what happened.
run: build
	@scripts/demo.sh $(BIN) $(EXAMPLE)

# Everything CI runs: formatting, lints, unit and end-to-end tests. The e2e suites
# drive release binaries: link fidelity is measured at the speeds users get.
test: setup lint
	$(CARGO) build --workspace --release --bins
	NEXTMINI_BIN_DIR=$(CURDIR)/target/release $(CARGO) test --workspace --no-fail-fast -- --test-threads=1
	NEXTMINI_BIN=$(CURDIR)/target/release/nextmini python3 -m pytest -q python/tests

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

unit:
	$(CARGO) test --workspace --lib

e2e: setup
	$(CARGO) build --workspace --release --bins
	NEXTMINI_BIN_DIR=$(CURDIR)/target/release $(CARGO) test -p nextmini-e2e -- --test-threads=1 --nocapture

# Longer experiments whose figures are in BENCHMARKS.md; not part of `make test`.
# The synthetic-flow suite runs at full scale with NEXTMINI_BENCH=1 (about 15 min).
bench: setup
	$(CARGO) build --workspace --release --bins
	NEXTMINI_BENCH=1 NEXTMINI_BIN_DIR=$(CURDIR)/target/release $(CARGO) test -p nextmini-e2e --test synthetic_flows -- --test-threads=1 --nocapture

# Fuzz smoke run: builds the cargo-fuzz targets (nightly, or stable with
# RUSTC_BOOTSTRAP=1) and runs each for FUZZ_SECONDS (default 20). See fuzz/README.md.
fuzz:
	@fuzz/smoke.sh

crds:
	$(CARGO) run -q --bin nextmini -- crd --dir crds

down:
	$(BIN) down

clean: down
	$(CARGO) clean
