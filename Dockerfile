# The Nextmini image: the operator, the node agent and the CLI in one image.
#   docker build -t docker.io/nextmini/nextmini:0.1.0 .     (the chart's appVersion)
# The worker image of packed topologies (spec.workerImage), with tools to run in the nodes:
#   docker build --target worker -t docker.io/nextmini/worker:0.1.0 .
# `make kind` builds both, loads them into a kind cluster and installs the Helm chart.

FROM rust:1-bookworm AS build
WORKDIR /src
# Protobuf is compiled by protox (pure Rust), so the builder needs no protoc.
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target,sharing=locked \
    cargo build --release --locked --bins \
 && mkdir -p /out \
 && cp target/release/nextmini-operator target/release/nextmini-agent target/release/nextmini /out/

FROM debian:bookworm-slim AS nextmini
# iproute2: the agent's namespaces and links; ca-certificates: TLS to external services
# (e.g. a managed PostgreSQL); fonts-dejavu-core: `nextmini results --plot` labels.
RUN apt-get update \
 && apt-get install -y --no-install-recommends iproute2 ca-certificates fonts-dejavu-core \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/ /usr/local/bin/
# The agent needs root (with NET_ADMIN) in its pod; the operator's pod runs as a non-root
# user through the Helm chart's securityContext.
ENTRYPOINT []
CMD ["nextmini", "--help"]
LABEL org.opencontainers.image.title="nextmini" \
      org.opencontainers.image.description="Nextmini network emulation testbed: operator, node agent and CLI" \
      org.opencontainers.image.licenses="Apache-2.0"

# Packed worker pods run applications inside their nodes (`kubectl exec <worker> --
# nextmini exec <node> -- curl …`); they need the tools in the pod's image.
FROM nextmini AS worker
RUN apt-get update \
 && apt-get install -y --no-install-recommends curl iputils-ping python3 iperf3 \
 && rm -rf /var/lib/apt/lists/*

# The chart's default PostgreSQL image (postgresql.image): the official one, under the name
# every images step gives it (`make images` builds the same from Debian's packages).
#   docker build --target postgres -t docker.io/nextmini/postgres:0.1.0 .
FROM docker.io/library/postgres:16 AS postgres

# The default target stays the Nextmini image.
FROM nextmini
