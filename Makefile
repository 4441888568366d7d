# Targets the README names. `make run` and `make test` work on a fresh machine.
SHELL := /bin/bash
CARGO ?= cargo
PROFILE ?= release
BIN := target/$(PROFILE)/nextmini
EXAMPLE ?= manifests/examples/line3.yaml
# Seconds per fuzz target in `make test`'s smoke stage.
FUZZ_SMOKE_SECONDS ?= 10

.PHONY: setup setup-test build run demo test test-kube bench-kube lint unit e2e crds down clean fuzz bench bench-load

# What `make run` needs; the test and bench targets add their own tools.
setup:
	@scripts/setup.sh

setup-test:
	@scripts/setup.sh --test

build: setup
	$(CARGO) build --workspace --$(PROFILE)

# Brings up line3, sends real traffic through it and shows what happened.
run: build
	@scripts/demo.sh $(BIN) $(EXAMPLE)

# Everything CI runs: formatting, lints, unit and end-to-end tests in local
# namespace mode, the Python package, a short fuzz run of every cargo-fuzz target
# (FUZZ_SMOKE_SECONDS each), then the operator on a real Kubernetes cluster built
# from source (cached in /var/cache/nextmini/k8s). The e2e suites
# drive release binaries: link fidelity is measured at the speeds users get.
# Every stage runs even when an earlier one failed; the last lines name each
# stage's result and the tests that failed (scripts/test-stages.sh).
# A CI machine builds once from nothing and its disk is shared: incremental
# state (gigabytes, useless on a fresh clone) and the release profile's debug
# info (the profiler's, `make bench` keeps it) stay off here.
test: export CARGO_INCREMENTAL = 0
test: export CARGO_PROFILE_RELEASE_DEBUG = 0
test: setup-test lint cluster-build
	$(CARGO) build --workspace --release --bins
	@NEXTMINI_BIN_DIR=$(CURDIR)/target/release NEXTMINI_BIN=$(CURDIR)/target/release/nextmini \
	scripts/test-stages.sh \
	  cargo '$(CARGO) test --workspace --no-fail-fast -- --test-threads=1' \
	  python 'python3 -m pytest -q python/tests' \
	  fuzz 'FUZZ_SECONDS=$(FUZZ_SMOKE_SECONDS) fuzz/smoke.sh' \
	  kube '$(MAKE) --no-print-directory test-kube'

# The cluster suite alone: starts the local cluster, imports the images, runs
# e2e/tests/kube.rs and stops the cluster again, also when the suite fails.
# With KUBECONFIG_EXTERNAL set, runs against that cluster instead.
test-kube:
	@if [ -n "$$KUBECONFIG_EXTERNAL" ]; then \
	  KUBECONFIG=$$KUBECONFIG_EXTERNAL $(CARGO) test -p nextmini-e2e --test kube -- --ignored --nocapture; \
	else \
	  status=0; \
	  e2e/cluster/up.sh && NEXTMINI_BIN_DIR=$(CURDIR)/target/release e2e/cluster/images.sh && \
	  KUBECONFIG=/var/lib/nextmini-k8s/kubeconfig $(CARGO) test -p nextmini-e2e --test kube -- --ignored --nocapture || status=1; \
	  e2e/cluster/down.sh; \
	  exit $$status; \
	fi

# On the local cluster like test-kube: time to Ready of packed placement against one
# pod per node (6 and 60 nodes; NEXTMINI_E2E_SCALE_NODES changes the sizes), and a
# packed ring of 2,000 nodes (NEXTMINI_E2E_RING_NODES) with the operator's memory.
# KUBE_BENCH=packed_ring_at_scale runs one of them.
KUBE_BENCH ?=
bench-kube:
	@status=0; \
	e2e/cluster/up.sh && NEXTMINI_BIN_DIR=$(CURDIR)/target/release e2e/cluster/images.sh nextmini postgres worker && \
	KUBECONFIG=/var/lib/nextmini-k8s/kubeconfig $(CARGO) test --release -p nextmini-e2e --test kube_scale -- --ignored --nocapture --test-threads=1 $(KUBE_BENCH) || status=1; \
	e2e/cluster/down.sh; \
	exit $$status

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

unit:
	$(CARGO) test --workspace --lib

e2e: setup-test
	$(CARGO) build --workspace --release --bins
	NEXTMINI_BIN_DIR=$(CURDIR)/target/release $(CARGO) test -p nextmini-e2e -- --test-threads=1 --nocapture

# Longer experiments whose figures are in BENCHMARKS.md; not part of `make test`.
# Each part writes bench/results/<part>.json; bench/plot.py then draws
# bench/results/hops.png and regenerates the marked section of BENCHMARKS.md
# from every stored result, so one part can be rerun alone:
#   make bench BENCH=hops HOPS="1 2 4"
# Parts:
#   flows   the synthetic-flow suite at full scale (NEXTMINI_BENCH=1, about 15 min)
#   hops    curl <- http.server through TUN and SOCKS5 (normal, max) at HOPS hops,
#           against a kernel-forwarding chain and loopback (about 10 min)
#   memory  RSS and PSS of an idle agent and of one with 10 links (1 min)
#   scale   start-up of SCALE nodes, then a change fanning out to the largest (about 5 min)
#   load    LOAD_ARGS agents reporting to one hub (RELIABILITY.md; about 7 min)
#   processors  TCP through a 3-node line against PROCESSORS per agent and 1-8
#           flows, both mappings (the paper's Fig. 4; about 3 min)
#   shaped  CPU per packet of a 200 Mbit/s, 5 ms line, plain and impaired, against
#           an unshaped one (issue 14.1; about 1 min)
#   fidelity  a fat-tree (k=4) at 300 Mbit/s with one and four TCP flows, and a
#           7-node line at 1 Gbit/s, against their expected goodput, with what the
#           fidelity guard said (issue 14.2; about 2 min)
#   queues  Flexplane's queue-occupancy experiment: 5 CUBIC flows through one
#           100 Mbit/s bottleneck under DropTail, RED and ECN threshold marking,
#           median and p99 queue depth (issue 18.5; about 1.5 min)
#   ring    a RING-node ring in namespace mode: up, whole-machine memory, ping
#           and curl between the farthest nodes, down (issue 16.1; about 6 min
#           at 10,000; not in the default list: it needs 14 GiB)
#   fattree the same for a k=FATTREE fat-tree (k=32: 9,472 nodes, 24,576 links;
#           about 7 min, 15 GiB; not in the default list)
BENCH ?= flows hops memory scale load processors shaped fidelity queues
RING ?= 10000
FATTREE ?= 32
PROCESSORS ?= 1 2 4
HOPS ?= 1 2 4 8 16 40
SCALE ?= 100 500 1000
LOAD_ARGS ?= 1000 300 100
BENCH_TARGET_DIR := $(or $(CARGO_TARGET_DIR),$(CURDIR)/target)
bench:
	@for part in $(BENCH); do case $$part in flows|hops|memory|scale|load|processors|shaped|fidelity|queues|ring|fattree) ;; \
	  *) echo "make bench: unknown part '$$part' (flows, hops, memory, scale, load, processors, shaped, fidelity, queues, ring, fattree)" >&2; exit 2 ;; esac; done
	@scripts/setup.sh --bench
	$(CARGO) build --workspace --release --bins
	$(CARGO) build --release -p nextmini-e2e --examples
	@set -e; export NEXTMINI_BIN_DIR=$(BENCH_TARGET_DIR)/release; \
	for part in $(BENCH); do \
	  echo "== make bench: $$part"; \
	  case $$part in \
	    flows) NEXTMINI_BENCH=1 $(CARGO) test -p nextmini-e2e --test synthetic_flows -- --test-threads=1 --nocapture ;; \
	    hops) $(BENCH_TARGET_DIR)/release/examples/bench_hops $(HOPS) ;; \
	    memory) $(BENCH_TARGET_DIR)/release/examples/bench_memory ;; \
	    scale) $(BENCH_TARGET_DIR)/release/examples/bench_scale $(SCALE) ;; \
	    load) $(BENCH_TARGET_DIR)/release/examples/control_load $(LOAD_ARGS) ;; \
	    processors) $(BENCH_TARGET_DIR)/release/examples/bench_processors $(PROCESSORS) ;; \
	    shaped) $(BENCH_TARGET_DIR)/release/examples/bench_shaped ;; \
	    fidelity) $(BENCH_TARGET_DIR)/release/examples/bench_fidelity ;; \
	    queues) $(BENCH_TARGET_DIR)/release/examples/bench_queues ;; \
	    ring) bench/namespace_scale.sh ring $(RING) ;; \
	    fattree) bench/namespace_scale.sh fattree $(FATTREE) ;; \
	  esac; \
	done
	/usr/bin/python3 bench/plot.py

# Control-plane load (RELIABILITY.md): 1,000 agents reporting every 100 ms to one
# hub for 5 minutes (about 7 min in all). LOAD_ARGS: agents, seconds, interval in ms.
bench-load: setup-test
	$(CARGO) build --workspace --release --bins
	NEXTMINI_BIN_DIR=$(CURDIR)/target/release $(CARGO) run --release -p nextmini-e2e --example control_load -- $(LOAD_ARGS)

# Fuzz smoke run: builds the cargo-fuzz targets (nightly, or stable with
# RUSTC_BOOTSTRAP=1) and runs each for FUZZ_SECONDS (default 20). See fuzz/README.md.
fuzz:
	@fuzz/smoke.sh

crds:
	$(CARGO) run -q --bin nextmini -- crd --dir crds
	cp crds/nextmini.yaml helm/nextmini/crds/nextmini.yaml

down:
	$(BIN) down

clean: down
	$(CARGO) clean

# The Helm chart (helm/nextmini). HELM defaults to helm on PATH, else the one that
# `make cluster-build` (e2e/cluster/build.sh) builds.
HELM ?= $(shell command -v helm 2>/dev/null || echo /var/cache/nextmini/k8s/bin/helm)
IMAGE_REPO ?= docker.io/nextmini/nextmini
# The chart's appVersion: what its defaults run.
IMAGE_TAG ?= $(shell sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$$/\1/p' helm/nextmini/Chart.yaml)
IMAGE := $(IMAGE_REPO):$(IMAGE_TAG)
WORKER_IMAGE ?= docker.io/nextmini/worker:$(IMAGE_TAG)
POSTGRES_IMAGE ?= docker.io/nextmini/postgres:$(IMAGE_TAG)
KIND_CLUSTER ?= nextmini
# helm built by `go install` has no Kubernetes version stamped in (it assumes 1.20), so
# `helm template` is told which version to render for.
HELM_KUBE_VERSION ?= 1.30.14

.PHONY: helm-lint kind

# Lints the chart and renders it with the default values, CI's values and an external database.
helm-lint:
	$(HELM) lint --strict helm/nextmini
	$(HELM) lint --strict helm/nextmini -f helm/nextmini/ci/ci-values.yaml
	$(HELM) lint --strict helm/nextmini -f helm/nextmini/ci/external-db-values.yaml
	$(HELM) template nextmini helm/nextmini -n nextmini --kube-version $(HELM_KUBE_VERSION) >/dev/null
	$(HELM) template nextmini helm/nextmini -n nextmini --kube-version $(HELM_KUBE_VERSION) -f helm/nextmini/ci/ci-values.yaml >/dev/null
	$(HELM) template nextmini helm/nextmini -n nextmini --kube-version $(HELM_KUBE_VERSION) --set postgresql.enabled=false \
		--set externalDatabase.url=postgres://nextmini:secret@db.example:5432/nextmini >/dev/null
	@echo "helm-lint: chart OK"

# With Docker: builds the image, starts a three-node kind cluster (kind-config.yaml) unless it
# exists, loads the image into it and installs the chart.
kind:
	docker build -t $(IMAGE) .
	docker build --target worker -t $(WORKER_IMAGE) .
	docker build --target postgres -t $(POSTGRES_IMAGE) .
	kind get clusters 2>/dev/null | grep -qx '$(KIND_CLUSTER)' || kind create cluster --name $(KIND_CLUSTER) --config kind-config.yaml
	kind load docker-image $(IMAGE) $(WORKER_IMAGE) $(POSTGRES_IMAGE) --name $(KIND_CLUSTER)
	$(HELM) upgrade --install nextmini helm/nextmini -n nextmini --create-namespace --wait
	@echo "kind: try  kubectl apply -f manifests/examples/line3.yaml && kubectl wait --for=condition=Ready topology/line3 --timeout=180s"

# A real single-node Kubernetes built from source, without Docker or a registry
# (e2e/cluster/README.md): build into /var/cache/nextmini/k8s, start, stop, and the
# project's images imported into its containerd. KUBECONFIG=/var/lib/nextmini-k8s/kubeconfig.
.PHONY: cluster-build cluster-up cluster-down cluster-env images cluster-smoke

cluster-build:
	@e2e/cluster/build.sh

cluster-up: cluster-build
	@e2e/cluster/up.sh

cluster-down:
	@e2e/cluster/down.sh

# The environment to use the from-source cluster: eval "$(make -s cluster-env)".
cluster-env:
	@echo "export KUBECONFIG=$${NEXTMINI_K8S_STATE:-/var/lib/nextmini-k8s}/kubeconfig PATH=$${NEXTMINI_K8S_CACHE:-/var/cache/nextmini/k8s}/bin:\$$PATH"

# Images from NEXTMINI_BIN_DIR (default target/release) and Debian's packages.
images:
	@e2e/cluster/images.sh

# up, pods with TUN/Service/DNS/owner cascade, down, and nothing left behind.
cluster-smoke: cluster-build
	@e2e/cluster/smoke.sh
