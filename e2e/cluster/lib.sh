# Shared settings and helpers for the e2e/cluster scripts. Sourced, not run.
# shellcheck shell=bash disable=SC2034

CACHE=${NEXTMINI_K8S_CACHE:-/var/cache/nextmini/k8s}
STATE=${NEXTMINI_K8S_STATE:-/var/lib/nextmini-k8s}
BIN=$CACHE/bin
CNI_BIN=$BIN/cni

# Versions that are known to build from the Go module proxy (see README.md).
K8S_VERSION=${K8S_VERSION:-v1.30.14}
K8S_STAGING_VERSION=${K8S_STAGING_VERSION:-v0.30.14}
# The checksum database has no entry for k8s.io/kube-proxy v0.30.14.
KUBE_PROXY_STAGING_VERSION=${KUBE_PROXY_STAGING_VERSION:-v0.30.4}
ETCD_VERSION=${ETCD_VERSION:-v3.5.21}
CONTAINERD_VERSION=${CONTAINERD_VERSION:-v1.7.27}
RUNC_VERSION=${RUNC_VERSION:-v1.2.6}
CNI_VERSION=${CNI_VERSION:-v1.6.2}
COREDNS_VERSION=${COREDNS_VERSION:-v1.11.3}
HELM_VERSION=${HELM_VERSION:-v3.22.0}
GGCR_VERSION=${GGCR_VERSION:-v0.20.6}

# Network layout: everything inside 198.19.128.0/17, away from the topology
# pools (overlay 198.18.0.0/16, underlay 198.19.0.0/17).
NODE_IP=${NEXTMINI_K8S_NODE_IP:-198.19.255.1}
NODE_BRIDGE=nmk8s0
POD_BRIDGE=nmk8scni0
POD_CIDR=198.19.192.0/20
POD_GW=198.19.192.1
SERVICE_CIDR=198.19.224.0/20
KUBERNETES_SVC_IP=198.19.224.1
DNS_IP=198.19.224.10
NODE_NAME=${NEXTMINI_K8S_NODE_NAME:-nextmini-node}

# Another cluster's containerd (k3s: /run/k3s/containerd/containerd.sock) takes
# the images the same way: NEXTMINI_CONTAINERD_SOCK=... make images.
CONTAINERD_SOCK=${NEXTMINI_CONTAINERD_SOCK:-$STATE/containerd/containerd.sock}
PAUSE_IMAGE=registry.k8s.io/pause:3.9

if [[ -z ${GO:-} ]]; then
  if [[ -x /usr/local/go/bin/go ]]; then GO=/usr/local/go/bin/go; else GO=$(command -v go || true); fi
fi

_T0=${_T0:-$SECONDS}
log() { printf '[%s %5ss] %s\n' "$(date +%H:%M:%S)" "$((SECONDS - _T0))" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# Debian packages: install the missing ones (apt-get update once, only if needed).
ensure_packages() {
  local missing=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep "install ok installed" >/dev/null || missing+=("$p")
  done
  ((${#missing[@]} == 0)) && return 0
  log "apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null || apt-get update
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

go_env() {
  [[ -n $GO ]] || die "no Go toolchain (expected /usr/local/go/bin/go or go in PATH)"
  export GOMODCACHE=$CACHE/gomod GOCACHE=$CACHE/gocache GOPATH=$CACHE/gopath
  export GOTOOLCHAIN=local GOFLAGS=-buildvcs=false
  mkdir -p "$GOMODCACHE" "$GOCACHE" "$GOPATH" "$BIN" "$CNI_BIN"
}
