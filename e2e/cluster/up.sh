#!/usr/bin/env bash
# Starts a real single-node Kubernetes cluster as host processes: etcd,
# kube-apiserver, controller-manager, scheduler, containerd, kubelet,
# kube-proxy and CoreDNS, all state under $NEXTMINI_K8S_STATE
# (default /var/lib/nextmini-k8s). Binaries come from build.sh's cache.
# Idempotent: a healthy cluster is left alone; anything else (including the
# leftovers of a killed run) is torn down with down.sh and started afresh.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
. "$HERE/lib.sh"

PKI=$STATE/pki
RUN=$STATE/run
LOGS=$STATE/logs
KUBECONFIG_ADMIN=$STATE/kubeconfig
APISERVER=https://$NODE_IP:6443
ETCD_PORT=12379
DNS_PORT=10053
WAIT_SECS=${NEXTMINI_K8S_WAIT:-120}
# Free disk below which the kubelet reports disk pressure and evicts.
DISK_RESERVE=${NEXTMINI_K8S_DISK_RESERVE:-512Mi}

for b in etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl \
  containerd containerd-shim-runc-v2 ctr runc coredns pause mkimage; do
  [[ -x $BIN/$b ]] || die "$BIN/$b is missing: run e2e/cluster/build.sh first"
done
for b in bridge host-local loopback portmap; do
  [[ -x $CNI_BIN/$b ]] || die "$CNI_BIN/$b is missing: run e2e/cluster/build.sh first"
done
[[ $(id -u) == 0 ]] || die "must run as root"
ensure_packages iptables conntrack socat ethtool ebtables kmod jq openssl iproute2 util-linux busybox-static curl

export PATH=$BIN:$PATH
kc() { "$BIN/kubectl" --kubeconfig "$KUBECONFIG_ADMIN" "$@"; }

COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler containerd kubelet kube-proxy coredns)

alive() { [[ -f $RUN/$1.pid ]] && kill -0 "$(cat "$RUN/$1.pid")" 2>/dev/null; }

already_up() {
  local c
  for c in "${COMPONENTS[@]}"; do alive "$c" || return 1; done
  [[ -f $KUBECONFIG_ADMIN ]] || return 1
  kc get --raw /readyz >/dev/null 2>&1 || return 1
  [[ $(kc get node "$NODE_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null) == True ]]
}

# What to use the cluster with: its own kubectl and helm first on PATH (an
# older kubectl elsewhere on the machine may not speak to this API server).
print_env() {
  echo "export KUBECONFIG=$KUBECONFIG_ADMIN PATH=$BIN:\$PATH"
  log "to use it:  eval \"\$(make -s cluster-env)\"   (KUBECONFIG=$KUBECONFIG_ADMIN, kubectl and helm from $BIN)"
}

if already_up; then
  log "cluster already up"
  print_env
  exit 0
fi

log "cleaning up any previous cluster"
"$HERE/down.sh" --quiet
mkdir -p "$PKI" "$RUN" "$LOGS" "$STATE/cni/net.d" "$STATE/cni/ipam" "$STATE/containerd" "$STATE/kubelet" "$STATE/etcd"
chmod 700 "$STATE" "$PKI"
rm -f "$LOGS"/*.log

fail() {
  local name=$1; shift
  log "ERROR: $*"
  if [[ -f $LOGS/$name.log ]]; then
    log "tail of $LOGS/$name.log:"
    tail -n 40 "$LOGS/$name.log" >&2
  fi
  exit 1
}

# start NAME CMD...: runs CMD in its own session, logs to $LOGS/NAME.log.
start() {
  local name=$1; shift
  setsid "$@" >>"$LOGS/$name.log" 2>&1 </dev/null &
  echo $! >"$RUN/$name.pid"
}

# wait_for NAME WHAT CMD...: polls CMD until it succeeds; fails with NAME's log
# tail when NAME's process dies or the time is up.
wait_for() {
  local name=$1 what=$2 t0=$SECONDS; shift 2
  until "$@" >/dev/null 2>&1; do
    alive "$name" || fail "$name" "$name exited while waiting for $what"
    ((SECONDS - t0 < WAIT_SECS)) || fail "$name" "timed out after ${WAIT_SECS}s waiting for $what"
    sleep 0.2
  done
  log "$what ($((SECONDS - t0))s)"
}

# ------------------------------------------------------------------ host setup
# Kernel settings the kubelet and pod networking change; down.sh restores them.
SYSCTLS=(net.ipv4.ip_forward vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops
  kernel.keys.root_maxkeys kernel.keys.root_maxbytes net.bridge.bridge-nf-call-iptables)
: >"$RUN/sysctl.saved"
for s in "${SYSCTLS[@]}"; do
  v=$(sysctl -n "$s" 2>/dev/null) && echo "$s=$v" >>"$RUN/sysctl.saved"
done
sysctl -qw net.ipv4.ip_forward=1
sysctl -qw net.bridge.bridge-nf-call-iptables=1 2>/dev/null || true

# The node IP: a /32 on an empty bridge (the kubelet refuses loopback addresses).
ip link add "$NODE_BRIDGE" type bridge
ip addr add "$NODE_IP/32" dev "$NODE_BRIDGE"
ip link set "$NODE_BRIDGE" up
# Service addresses never leave the machine, even with no endpoints.
ip route add "$SERVICE_CIDR" dev "$NODE_BRIDGE"
# Nothing from outside reaches the node IP, and pods reach nothing outside the
# benchmarking range 198.18.0.0/15 (the cluster's and the topologies' addresses).
iptables -w -N NMK8S-INPUT
iptables -w -A NMK8S-INPUT -i lo -j RETURN
iptables -w -A NMK8S-INPUT -i "$POD_BRIDGE" -j RETURN
iptables -w -A NMK8S-INPUT -j DROP
iptables -w -I INPUT -d "$NODE_IP" -j NMK8S-INPUT
iptables -w -N NMK8S-FORWARD
iptables -w -A NMK8S-FORWARD -i "$POD_BRIDGE" -d 198.18.0.0/15 -j ACCEPT
iptables -w -A NMK8S-FORWARD -o "$POD_BRIDGE" -s 198.18.0.0/15 -j ACCEPT
iptables -w -A NMK8S-FORWARD -i "$POD_BRIDGE" -j DROP
iptables -w -A NMK8S-FORWARD -o "$POD_BRIDGE" -j DROP
iptables -w -I FORWARD -j NMK8S-FORWARD
log "node IP $NODE_IP on bridge $NODE_BRIDGE"

# ------------------------------------------------------------------ certificates
# kubeconfig NAME: a kubeconfig for the client certificate NAME.
kubeconfig() { kubeconfig_file "$PKI/$1.kubeconfig" "$APISERVER" "$PKI/$1" "$1"; }

t=$SECONDS
gen_key "$PKI/ca.key"
openssl req -x509 -new -key "$PKI/ca.key" -sha256 -days 3650 -subj "/CN=nextmini-k8s-ca" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" \
  -out "$PKI/ca.crt" 2>/dev/null
CLIENT="extendedKeyUsage=clientAuth"
cert "$PKI" apiserver "/CN=kube-apiserver" "extendedKeyUsage=serverAuth
subjectAltName=IP:$NODE_IP,IP:$KUBERNETES_SVC_IP,IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
cert "$PKI" apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" "$CLIENT"
cert "$PKI" admin "/O=system:masters/CN=nextmini-admin" "$CLIENT"
cert "$PKI" controller-manager "/CN=system:kube-controller-manager" "$CLIENT"
cert "$PKI" scheduler "/CN=system:kube-scheduler" "$CLIENT"
cert "$PKI" kube-proxy "/CN=system:kube-proxy" "$CLIENT"
cert "$PKI" coredns "/CN=nextmini:coredns" "$CLIENT"
cert "$PKI" kubelet "/O=system:nodes/CN=system:node:$NODE_NAME" "$CLIENT"
cert "$PKI" kubelet-server "/CN=$NODE_NAME" "extendedKeyUsage=serverAuth
subjectAltName=IP:$NODE_IP,DNS:$NODE_NAME"
gen_key "$PKI/sa.key"
openssl ec -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
for n in admin controller-manager scheduler kube-proxy coredns kubelet; do kubeconfig "$n"; done
cp "$PKI/admin.kubeconfig" "$KUBECONFIG_ADMIN"
log "certificates and kubeconfigs ($((SECONDS - t))s)"

# ------------------------------------------------------------------ etcd
start etcd "$BIN/etcd" --name nextmini --data-dir "$STATE/etcd" \
  --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
  --listen-peer-urls http://127.0.0.1:12380 --initial-advertise-peer-urls http://127.0.0.1:12380 \
  --initial-cluster nextmini=http://127.0.0.1:12380 --listen-metrics-urls "" \
  --unsafe-no-fsync --log-level warn
wait_for etcd "etcd healthy" curl -sf "http://127.0.0.1:$ETCD_PORT/health"

# ------------------------------------------------------------------ kube-apiserver
start kube-apiserver "$BIN/kube-apiserver" \
  --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
  --bind-address "$NODE_IP" --advertise-address "$NODE_IP" --secure-port 6443 \
  --service-cluster-ip-range "$SERVICE_CIDR" \
  --tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
  --client-ca-file "$PKI/ca.crt" \
  --kubelet-client-certificate "$PKI/apiserver-kubelet-client.crt" --kubelet-client-key "$PKI/apiserver-kubelet-client.key" \
  --kubelet-certificate-authority "$PKI/ca.crt" --kubelet-preferred-address-types InternalIP \
  --service-account-key-file "$PKI/sa.pub" --service-account-signing-key-file "$PKI/sa.key" \
  --service-account-issuer https://kubernetes.default.svc.cluster.local \
  --authorization-mode Node,RBAC --allow-privileged=true \
  --enable-admission-plugins NodeRestriction \
  --profiling=false --v=1
wait_for kube-apiserver "kube-apiserver /readyz" curl -sf --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" "$APISERVER/readyz"

# ------------------------------------------------------------------ controllers
start kube-controller-manager "$BIN/kube-controller-manager" \
  --kubeconfig "$PKI/controller-manager.kubeconfig" \
  --authentication-kubeconfig "$PKI/controller-manager.kubeconfig" \
  --authorization-kubeconfig "$PKI/controller-manager.kubeconfig" \
  --bind-address 127.0.0.1 --secure-port 10257 --leader-elect=false \
  --cluster-signing-cert-file "$PKI/ca.crt" --cluster-signing-key-file "$PKI/ca.key" \
  --root-ca-file "$PKI/ca.crt" --service-account-private-key-file "$PKI/sa.key" \
  --use-service-account-credentials=true --service-cluster-ip-range "$SERVICE_CIDR" \
  --allocate-node-cidrs=false --controllers '*' --profiling=false --v=1
start kube-scheduler "$BIN/kube-scheduler" \
  --kubeconfig "$PKI/scheduler.kubeconfig" \
  --authentication-kubeconfig "$PKI/scheduler.kubeconfig" \
  --authorization-kubeconfig "$PKI/scheduler.kubeconfig" \
  --bind-address 127.0.0.1 --secure-port 10259 --leader-elect=false --profiling=false --v=1

# ------------------------------------------------------------------ containerd
CTRD=$STATE/containerd
containerd_config "$CTRD" "$CONTAINERD_SOCK" "$STATE/runc" "$STATE/cni/net.d"
cni_conflist "$STATE/cni/net.d/10-nextmini.conflist" nextmini-k8s "$POD_BRIDGE" "$POD_CIDR" "$POD_GW" "$STATE/cni/ipam"
start containerd "$BIN/containerd" --config "$CTRD/config.toml" --log-level warn
wait_for containerd "containerd serving" "$BIN/ctr" --address "$CONTAINERD_SOCK" version

# The sandbox image: our pause program.
t=$SECONDS
"$HERE/image.sh" --ref "$PAUSE_IMAGE" --out "$CACHE/images/pause.tar" --file "$BIN/pause:/pause" \
  --entrypoint /pause --quiet >"$LOGS/pause-image.log" 2>&1 || fail pause-image "pause image failed"
log "pause image $PAUSE_IMAGE imported ($((SECONDS - t))s)"

# ------------------------------------------------------------------ kubelet
kubelet_config "$STATE/kubelet-config.yaml" "$NODE_IP" "$PKI/kubelet-server" "$CONTAINERD_SOCK" \
  "$DNS_IP" "$POD_CIDR" "$DISK_RESERVE"
start kubelet "$BIN/kubelet" --config "$STATE/kubelet-config.yaml" \
  --kubeconfig "$PKI/kubelet.kubeconfig" --root-dir "$STATE/kubelet" \
  --hostname-override "$NODE_NAME" --node-ip "$NODE_IP" --v=1

# ------------------------------------------------------------------ kube-proxy
cat >"$STATE/kube-proxy-config.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: $PKI/kube-proxy.kubeconfig
mode: iptables
clusterCIDR: $POD_CIDR
hostnameOverride: $NODE_NAME
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
nodePortAddresses: ["$NODE_IP/32"]
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
iptables:
  minSyncPeriod: 1s
  syncPeriod: 30s
EOF
start kube-proxy "$BIN/kube-proxy" --config "$STATE/kube-proxy-config.yaml" --v=1

# ------------------------------------------------------------------ cluster objects
# CoreDNS runs on the host, listening on the node IP; the kube-dns Service
# (the DNS IP the kubelet hands to pods) points at it through an EndpointSlice.
kc apply -f - >"$LOGS/bootstrap.log" 2>&1 <<EOF || fail bootstrap "applying the bootstrap objects failed"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "nextmini:coredns"}
rules:
- apiGroups: [""]
  resources: [endpoints, services, pods, namespaces]
  verbs: [list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "nextmini:coredns"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "nextmini:coredns"}
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: User, name: "nextmini:coredns"}
---
apiVersion: v1
kind: Service
metadata:
  name: kube-dns
  namespace: kube-system
  labels: {k8s-app: kube-dns, kubernetes.io/name: CoreDNS}
spec:
  clusterIP: $DNS_IP
  ports:
  - {name: dns, port: 53, protocol: UDP, targetPort: $DNS_PORT}
  - {name: dns-tcp, port: 53, protocol: TCP, targetPort: $DNS_PORT}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: kube-dns-host
  namespace: kube-system
  labels:
    kubernetes.io/service-name: kube-dns
    endpointslice.kubernetes.io/managed-by: nextmini.invalid-up.sh
addressType: IPv4
endpoints:
- addresses: ["$NODE_IP"]
  conditions: {ready: true}
ports:
- {name: dns, port: $DNS_PORT, protocol: UDP}
- {name: dns-tcp, port: $DNS_PORT, protocol: TCP}
EOF

# ------------------------------------------------------------------ CoreDNS
cat >"$STATE/Corefile" <<EOF
.:$DNS_PORT {
    bind $NODE_IP
    errors
    health 127.0.0.1:18080
    ready 127.0.0.1:18181
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig $PKI/coredns.kubeconfig nextmini
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }
    cache 5
}
EOF
start coredns "$BIN/coredns" -conf "$STATE/Corefile"

# ------------------------------------------------------------------ readiness
node_ready() {
  [[ $(kc get node "$NODE_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}') == True ]]
}
wait_for kubelet "node $NODE_NAME Ready" node_ready
wait_for kube-controller-manager "default ServiceAccount" kc get serviceaccount default -n default
wait_for coredns "CoreDNS ready" curl -sf http://127.0.0.1:18181/ready
# Through the Service IP, i.e. through kube-proxy's rules, as a pod would.
wait_for kube-proxy "DNS answering on $DNS_IP" sh -c \
  "busybox nslookup kubernetes.default.svc.cluster.local $DNS_IP | grep '$KUBERNETES_SVC_IP' >/dev/null"
for c in "${COMPONENTS[@]}"; do alive "$c" || fail "$c" "$c is not running"; done

log "cluster up in $((SECONDS - _T0))s: node $NODE_NAME ($NODE_IP), containerd socket $CONTAINERD_SOCK"
print_env
