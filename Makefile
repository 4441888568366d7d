# Targets the README names. `make run` and `make test` work on a fresh machine.
SHELL := /bin/bash
CARGO ?= cargo
PROFILE ?= release
BIN := target/$(PROFILE)/nextmini
EXAMPLE ?= manifests/examples/line3.yaml

.PHONY: setup build run demo test lint unit e2e crds down clean

setup:
	@scripts/setup.sh

build: setup
	$(CARGO) build --workspace --$(PROFILE)

# Brings up line3, sends real traffic through it and shows what happened.
run: build
	@scripts/demo.sh $(BIN) $(EXAMPLE)

# Everything CI runs: formatting, lints, unit and end-to-end tests.
test: setup lint
	$(CARGO) build --workspace
	$(CARGO) test --workspace --no-fail-fast -- --test-threads=1

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

unit:
	$(CARGO) test --workspace --lib

e2e: setup
	$(CARGO) build --workspace
	$(CARGO) test -p nextmini-e2e -- --test-threads=1 --nocapture

crds:
	$(CARGO) run -q --bin nextmini -- crd --dir crds

down:
	$(BIN) down

clean: down
	$(CARGO) clean
