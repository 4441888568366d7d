#!/usr/bin/env bash
# Builds every binary of the local single-node Kubernetes cluster from the Go
# module proxy into $NEXTMINI_K8S_CACHE/bin (default /var/cache/nextmini/k8s/bin).
# The module cache, build cache and wrapper modules live in the same cache, so a
# second run only builds what is missing. Nothing here needs Docker or a registry.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
. "$HERE/lib.sh"

ensure_packages ca-certificates gcc libc6-dev pkg-config libseccomp-dev iptables conntrack \
  socat ethtool ebtables kmod jq openssl busybox-static iproute2 util-linux tar
go_env
mkdir -p "$CACHE/src" "$CACHE/logs"
log "cache: $CACHE ($($GO version | cut -d' ' -f3))"

have() { local b; for b in "$@"; do [[ -x $BIN/$b ]] || return 1; done; }

# Runs a step with its output in $CACHE/logs/NAME.log; on failure shows the tail.
step() {
  local name=$1 t0=$SECONDS; shift
  log "$name: building"
  if "$@" >"$CACHE/logs/$name.log" 2>&1; then
    log "$name: done in $((SECONDS - t0))s"
  else
    log "$name: FAILED after $((SECONDS - t0))s; tail of $CACHE/logs/$name.log:"
    tail -n 30 "$CACHE/logs/$name.log" >&2
    return 1
  fi
}

# ---------------------------------------------------------------- Kubernetes
K8S_CMDS=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl)

k8s_module() {
  local dir=$CACHE/src/k8s-$K8S_VERSION
  [[ -f $dir/go.sum && -f $dir/.ready ]] && return 0
  mkdir -p "$dir"
  local gomod
  gomod=$($GO mod download -json "k8s.io/kubernetes@$K8S_VERSION" | jq -r .GoMod)
  {
    echo "module nextmini.invalid/k8s"
    echo
    echo "go 1.22.0"
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    # k8s.io/kubernetes replaces its staging modules with ./staging/...; a
    # wrapper module has to name their published versions instead.
    grep -oE '^[[:space:]]*k8s\.io/[a-z0-9-]+ => \./staging' "$gomod" | awk '{print $1}' | sort -u |
      while read -r m; do
        v=$K8S_STAGING_VERSION
        [[ $m == k8s.io/kube-proxy ]] && v=$KUBE_PROXY_STAGING_VERSION
        echo "replace $m => $m $v"
      done
  } >"$dir/go.mod"
  {
    echo "//go:build tools"
    echo
    echo "package tools"
    echo
    echo "import ("
    for c in "${K8S_CMDS[@]}"; do echo "	_ \"k8s.io/kubernetes/cmd/$c\""; done
    echo ")"
  } >"$dir/tools.go"
  (cd "$dir" && $GO mod tidy)
  touch "$dir/.ready"
}

k8s_build() {
  local missing=() c
  for c in "${K8S_CMDS[@]}"; do have "$c" || missing+=("k8s.io/kubernetes/cmd/$c"); done
  ((${#missing[@]})) || return 0
  local minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
  local ld="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION"
  ld+=" -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor"
  ld+=" -X k8s.io/component-base/version.gitTreeState=clean"
  ld+=" -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION"
  (cd "$CACHE/src/k8s-$K8S_VERSION" &&
    CGO_ENABLED=0 $GO build -trimpath -ldflags "$ld" -o "$BIN/" "${missing[@]}")
}

lane_k8s() {
  have "${K8S_CMDS[@]}" && { log "kubernetes: all present, skipped"; return 0; }
  step k8s-module k8s_module
  step kubernetes k8s_build
}

# ---------------------------------------------------------------- etcd
etcd_build() {
  local dir=$CACHE/src/etcd-$ETCD_VERSION
  mkdir -p "$dir"
  if [[ ! -f $dir/.ready ]]; then
    cat >"$dir/main.go" <<'EOF'
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
EOF
    printf 'module nextmini.invalid/etcd\n\ngo 1.22\n\nrequire go.etcd.io/etcd/server/v3 %s\n' "$ETCD_VERSION" >"$dir/go.mod"
    (cd "$dir" && $GO mod tidy)
    touch "$dir/.ready"
  fi
  (cd "$dir" && CGO_ENABLED=0 $GO build -trimpath -ldflags "-s -w" -o "$BIN/etcd" .)
}

# ---------------------------------------------------------------- containerd
containerd_build() {
  local dir=$CACHE/src/containerd-$CONTAINERD_VERSION src
  if [[ ! -f $dir/.ready ]]; then
    src=$($GO mod download -json "github.com/containerd/containerd@$CONTAINERD_VERSION" | jq -r .Dir)
    rm -rf "$dir"
    cp -r "$src" "$dir"
    chmod -R u+w "$dir"
    touch "$dir/.ready"
  fi
  local ld="-s -w -X github.com/containerd/containerd/version.Version=$CONTAINERD_VERSION"
  ld+=" -X github.com/containerd/containerd/version.Package=github.com/containerd/containerd"
  # go.mod has exclude directives, so `go install pkg@version` refuses it.
  # Snapshotters and plugins the cluster does not use are left out.
  (cd "$dir" && CGO_ENABLED=0 $GO build -mod=mod -trimpath -tags "no_btrfs no_devmapper no_zfs no_aufs no_tracing" \
    -ldflags "$ld" -o "$BIN/" \
    ./cmd/containerd ./cmd/ctr ./cmd/containerd-shim-runc-v2)
}

runc_build() {
  GOBIN=$BIN CGO_ENABLED=1 $GO install -trimpath -tags seccomp \
    -ldflags "-s -w -X main.version=${RUNC_VERSION#v}" "github.com/opencontainers/runc@$RUNC_VERSION"
}

cni_build() {
  local p=github.com/containernetworking/plugins/plugins
  GOBIN=$CNI_BIN CGO_ENABLED=0 $GO install -trimpath -ldflags "-s -w" \
    "$p/main/bridge@$CNI_VERSION" "$p/main/loopback@$CNI_VERSION" \
    "$p/ipam/host-local@$CNI_VERSION" "$p/meta/portmap@$CNI_VERSION"
}

# CoreDNS with only the plugins the cluster uses (the full set brings in the
# AWS, Azure and Google SDKs): its plugin list is generated from plugin.cfg.
COREDNS_PLUGINS=(bind ready health errors log cache kubernetes)
coredns_build() {
  local dir=$CACHE/src/coredns-$COREDNS_VERSION src p
  if [[ ! -f $dir/.ready ]]; then
    src=$($GO mod download -json "github.com/coredns/coredns@$COREDNS_VERSION" | jq -r .Dir)
    rm -rf "$dir"
    cp -r "$src" "$dir"
    chmod -R u+w "$dir"
    for p in "${COREDNS_PLUGINS[@]}"; do echo "$p:$p"; done >"$dir/plugin.cfg"
    (cd "$dir" && GOFLAGS=-mod=mod $GO run directives_generate.go)
    touch "$dir/.ready"
  fi
  (cd "$dir" && CGO_ENABLED=0 $GO build -mod=mod -trimpath \
    -ldflags "-s -w -X github.com/coredns/coredns/coremain.GitCommit=$COREDNS_VERSION" -o "$BIN/coredns" .)
}

helm_build() {
  GOBIN=$BIN CGO_ENABLED=0 $GO install -trimpath \
    -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
}

# Our own two small tools: rebuilt when their source changes.
tool_sum() { cat "$HERE/tools/$1/main.go" <(echo "$GGCR_VERSION") | sha256sum | cut -c1-16; }
tool_fresh() { [[ -x $BIN/$1 && -f $BIN/.$1.sum && $(cat "$BIN/.$1.sum") == "$(tool_sum "$1")" ]]; }
tool_build() {
  local tool=$1 dir=$CACHE/src/$1 sum
  sum=$(tool_sum "$tool")
  rm -rf "$dir" && mkdir -p "$dir"
  cp "$HERE/tools/$tool/main.go" "$dir/"
  printf 'module nextmini.invalid/%s\n\ngo 1.22\n' "$tool" >"$dir/go.mod"
  if [[ $tool == mkimage ]]; then
    (cd "$dir" && $GO get "github.com/google/go-containerregistry@$GGCR_VERSION" && $GO mod tidy)
  fi
  (cd "$dir" && CGO_ENABLED=0 $GO build -trimpath -ldflags "-s -w" -o "$BIN/$tool" .)
  echo "$sum" >"$BIN/.$tool.sum"
}

lane_rest() {
  local t
  for t in pause mkimage; do
    if tool_fresh "$t"; then log "$t: up to date, skipped"; else step "$t" tool_build "$t"; fi
  done
  if have etcd; then log "etcd: present, skipped"; else step etcd etcd_build; fi
  if have containerd ctr containerd-shim-runc-v2; then log "containerd: present, skipped"; else step containerd containerd_build; fi
  if have runc; then log "runc: present, skipped"; else step runc runc_build; fi
  if [[ -x $CNI_BIN/bridge && -x $CNI_BIN/loopback && -x $CNI_BIN/host-local && -x $CNI_BIN/portmap ]]; then
    log "cni plugins: present, skipped"
  else step cni cni_build; fi
  if have coredns; then log "coredns: present, skipped"; else step coredns coredns_build; fi
  if have helm; then log "helm: present, skipped"; else step helm helm_build; fi
}

# Two lanes in parallel: Kubernetes (the longest) and everything else, so that
# one lane's downloads overlap the other's compilation.
lane_k8s &
k8s_pid=$!
rest_rc=0
lane_rest || rest_rc=$?
k8s_rc=0
wait "$k8s_pid" || k8s_rc=$?
((k8s_rc == 0 && rest_rc == 0)) || die "build failed (see $CACHE/logs)"

log "binaries in $BIN:"
(cd "$BIN" && ls -1 | grep -v '^cni$' | tr '\n' ' ' && echo && echo "cni: $(ls "$CNI_BIN" | tr '\n' ' ')") >&2
log "total build time: $((SECONDS - _T0))s"

# The module and build caches (about 9 GB) only serve a later rebuild, which
# happens when a pinned version changes; CI's disk cannot spare them beside the
# Rust builds. NEXTMINI_K8S_KEEP_GO_CACHE=1 keeps them for work on this script.
if [[ ${NEXTMINI_K8S_KEEP_GO_CACHE:-0} != 1 ]] && [[ -d $GOCACHE || -d $GOMODCACHE ]]; then
  log "removing the Go caches: $(du -sch "$GOCACHE" "$GOMODCACHE" 2>/dev/null | tail -n1 | cut -f1)"
  $GO clean -modcache >/dev/null 2>&1 || chmod -R u+w "$GOMODCACHE"
  rm -rf "$GOCACHE" "$GOMODCACHE"
fi
