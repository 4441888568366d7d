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
# member.sh's node (a second cluster's): its network namespace, veth, node
# address, pod range and the cgroup root of its pods.
MEMBER_NETNS=nmk8s-member
MEMBER_HOST_VETH=nmk8sm0
MEMBER_GW=198.19.254.1
MEMBER_NODE_IP=198.19.254.2
MEMBER_POD_CIDR=198.19.176.0/20
MEMBER_POD_GW=198.19.176.1
MEMBER_CGROUP=nm-member

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

# containerd_config DIR SOCKET RUNC_ROOT CNI_CONF_DIR: writes DIR/config.toml,
# a containerd that keeps root, state and opt under DIR and serves SOCKET.
containerd_config() {
  local dir=$1 sock=$2 runc_root=$3 cni_conf=$4
  mkdir -p "$dir/root" "$dir/state" "$dir/opt"
  cat >"$dir/config.toml" <<EOF
version = 2
root = "$dir/root"
state = "$dir/state"
[grpc]
  address = "$sock"
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "$dir/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  restrict_oom_score_adj = true
  enable_selinux = false
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "$BIN/runc"
        Root = "$runc_root"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$CNI_BIN"
    conf_dir = "$cni_conf"
    max_conf_num = 1
EOF
}

# cni_conflist FILE NAME BRIDGE SUBNET GATEWAY IPAM_DIR: pods on BRIDGE with
# addresses from SUBNET (host-local, state in IPAM_DIR), and port maps.
cni_conflist() {
  local file=$1 name=$2 bridge=$3 subnet=$4 gateway=$5 ipam=$6
  mkdir -p "$(dirname "$file")" "$ipam"
  cat >"$file" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "$name",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$bridge",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$ipam",
        "ranges": [[{"subnet": "$subnet", "gateway": "$gateway"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
}

# kubelet_config FILE NODE_IP CERT_PREFIX SOCKET DNS_IP POD_CIDR DISK_RESERVE [EXTRA]:
# a kubelet serving on NODE_IP:10250 with CERT_PREFIX.crt/.key, its pods on
# the containerd at SOCKET; EXTRA (YAML lines) is appended.
kubelet_config() {
  local file=$1 node_ip=$2 cert=$3 sock=$4 dns=$5 pods=$6 reserve=$7 extra=${8:-}
  cat >"$file" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $node_ip
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
tlsCertFile: $cert.crt
tlsPrivateKeyFile: $cert.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $STATE/pki/ca.crt}
authorization:
  mode: Webhook
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://$sock
clusterDNS: [$dns]
clusterDomain: cluster.local
podCIDR: $pods
failSwapOn: false
resolvConf: /etc/resolv.conf
rotateCertificates: false
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
# Absolute disk floors: 1% of a large disk shared with builds is gigabytes, and
# a node under disk pressure schedules nothing.
# No memory eviction ("0%" turns the signal off): on cgroup v1 the kubelet
# counts active page cache as used, and after a build has read and written
# gigabytes the cache alone crosses any floor. It then evicted PostgreSQL in
# the middle of a test (psql: "the database system is shutting down"). The
# kernel's OOM killer still guards real exhaustion.
evictionHard:
  memory.available: "0%"
  nodefs.available: $reserve
  imagefs.available: $reserve
  nodefs.inodesFree: 1%
maxPods: 110
$extra
EOF
}

# gen_key FILE: a P-256 private key, readable by root only.
gen_key() { openssl ecparam -name prime256v1 -genkey -noout -out "$1" 2>/dev/null; chmod 600 "$1"; }

# cert DIR NAME SUBJECT EXT: DIR/NAME.key and a leaf certificate DIR/NAME.crt
# signed by the cluster CA ($STATE/pki).
cert() {
  local dir=$1 name=$2 subj=$3 ext=$4 ca=$STATE/pki
  gen_key "$dir/$name.key"
  openssl req -new -key "$dir/$name.key" -subj "$subj" -out "$dir/$name.csr" 2>/dev/null
  openssl x509 -req -in "$dir/$name.csr" -CA "$ca/ca.crt" -CAkey "$ca/ca.key" -set_serial "0x$(openssl rand -hex 16)" \
    -days 3650 -sha256 -extfile <(printf '%s\n' "basicConstraints=critical,CA:FALSE" \
      "keyUsage=critical,digitalSignature,keyEncipherment" "$ext") -out "$dir/$name.crt" 2>/dev/null
  rm -f "$dir/$name.csr"
}

# kubeconfig_file OUT SERVER CERT_PREFIX USER: a kubeconfig for the client
# certificate CERT_PREFIX.crt/.key at SERVER, trusting the cluster CA.
kubeconfig_file() {
  local out=$1 server=$2 cert=$3 user=$4
  cat >"$out" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: nextmini
  cluster:
    server: $server
    certificate-authority-data: $(base64 -w0 <"$STATE/pki/ca.crt")
users:
- name: $user
  user:
    client-certificate-data: $(base64 -w0 <"$cert.crt")
    client-key-data: $(base64 -w0 <"$cert.key")
contexts:
- name: nextmini
  context: {cluster: nextmini, user: $user}
current-context: nextmini
EOF
  chmod 600 "$out"
}
