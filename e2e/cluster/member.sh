#!/usr/bin/env bash
# A second control plane beside the cluster of up.sh, to register as a
# MemberCluster: its own etcd (own data directory and ports) and its own
# kube-apiserver on the node address at port 7443, with the first cluster's
# CA and certificates, and its own kube-controller-manager (which makes every
# namespace's default ServiceAccount, without which no pod is admitted, and
# collects garbage: an object there owned by one in another cluster would be
# deleted) and scheduler. Until `start-node`, it has no node, so pods made
# there stay Pending (its scheduler says why); `start-node` gives it one, in a
# network namespace of its own (see start_node).
#
#   member.sh start             start the control plane; prints the member's kubeconfig path
#   member.sh start-node        give it a node: containerd and a kubelet in their own namespace
#   member.sh stop-apiserver    stop the API server only (the member "goes away")
#   member.sh start-apiserver   start it again
#   member.sh stop              stop everything and remove the member's state
#
# down.sh stops these processes too (it stops every process running one of the
# cluster's binaries).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
. "$HERE/lib.sh"

PKI=$STATE/pki
RUN=$STATE/run
LOGS=$STATE/logs
MEMBER=$STATE/member
PORT=${NEXTMINI_K8S_MEMBER_PORT:-7443}
ETCD_PORT=22379
# Its own service range, inside the cluster block and away from the first's.
MEMBER_SERVICE_CIDR=198.19.208.0/20
MEMBER_DNS_IP=198.19.208.10
APISERVER=https://$NODE_IP:$PORT
KUBECONFIG_MEMBER=$MEMBER/kubeconfig
WAIT_SECS=${NEXTMINI_K8S_WAIT:-120}

[[ -f $PKI/apiserver.crt && -f $STATE/kubeconfig ]] || die "no cluster at $STATE: run up.sh first"

alive() { [[ -f $RUN/$1.pid ]] && kill -0 "$(cat "$RUN/$1.pid")" 2>/dev/null; }
start() {
  local name=$1; shift
  setsid "$@" >>"$LOGS/$name.log" 2>&1 </dev/null &
  echo $! >"$RUN/$name.pid"
}
stop() {
  local name=$1 pid i
  alive "$name" || { rm -f "$RUN/$name.pid"; return 0; }
  pid=$(cat "$RUN/$name.pid")
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < 100; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
  rm -f "$RUN/$name.pid"
  log "stopped $name"
}
wait_for() {
  local name=$1 what=$2 t0=$SECONDS; shift 2
  until "$@" >/dev/null 2>&1; do
    alive "$name" || { tail -n 30 "$LOGS/$name.log" >&2; die "$name exited while waiting for $what"; }
    ((SECONDS - t0 < WAIT_SECS)) || { tail -n 30 "$LOGS/$name.log" >&2; die "timed out waiting for $what"; }
    sleep 0.2
  done
  log "$what ($((SECONDS - t0))s)"
}

start_apiserver() {
  alive member-apiserver && return 0
  start member-apiserver "$BIN/kube-apiserver" \
    --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
    --bind-address "$NODE_IP" --advertise-address "$NODE_IP" --secure-port "$PORT" \
    --service-cluster-ip-range "$MEMBER_SERVICE_CIDR" \
    --tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
    --client-ca-file "$PKI/ca.crt" \
    --service-account-key-file "$PKI/sa.pub" --service-account-signing-key-file "$PKI/sa.key" \
    --service-account-issuer https://member.kubernetes.default.svc.cluster.local \
    --kubelet-client-certificate "$PKI/apiserver-kubelet-client.crt" --kubelet-client-key "$PKI/apiserver-kubelet-client.key" \
    --kubelet-certificate-authority "$PKI/ca.crt" --kubelet-preferred-address-types InternalIP \
    --authorization-mode Node,RBAC --allow-privileged=true \
    --enable-admission-plugins NodeRestriction \
    --profiling=false --v=1
  wait_for member-apiserver "member kube-apiserver /readyz" curl -sf --cacert "$PKI/ca.crt" \
    --cert "$PKI/admin.crt" --key "$PKI/admin.key" "$APISERVER/readyz"
}

# ------------------------------------------------------------------ the member's node
# A node of its own for the member: containerd, the kubelet (its node IP on
# a veth into a network namespace of its own, its pods' cgroups under a root
# of their own) and a bridge for its pods, all inside that namespace. Pod
# addresses are routed between the two clusters through the host, as
# Submariner or a ClusterMesh would route them (MemberCluster exposure
# Address); nothing of the member's node listens in the host's namespace.
NETNS=$MEMBER_NETNS
HOST_VETH=$MEMBER_HOST_VETH
MEMBER_NODE=nextmini-member-node
MEMBER_POD_BRIDGE=nmk8smcni0
CTRD=$MEMBER/containerd
MEMBER_SOCK=$CTRD/containerd.sock
in_netns() { nsenter --net="/run/netns/$NETNS" "$@"; }

start_node() {
  alive member-kubelet && return 0
  [[ -f $KUBECONFIG_MEMBER ]] || die "the member's control plane is not up: member.sh start first"
  # The namespace, its veth and the routes between the clusters' pods.
  if ! ip netns list | grep -qx "$NETNS\( .*\)\?"; then
    ip netns add "$NETNS"
    ip link add "$HOST_VETH" type veth peer name eth0 netns "$NETNS"
    ip addr add "$MEMBER_GW/30" dev "$HOST_VETH"
    ip link set "$HOST_VETH" up
    in_netns ip addr add "$MEMBER_NODE_IP/30" dev eth0
    in_netns ip link set eth0 up
    in_netns ip link set lo up
    in_netns ip route add default via "$MEMBER_GW"
    in_netns sysctl -qw net.ipv4.ip_forward=1
    ip route add "$MEMBER_POD_CIDR" via "$MEMBER_NODE_IP"
    # The member's kubelet reaches its API server on the node address.
    iptables -w -I NMK8S-INPUT -i "$HOST_VETH" -j RETURN
    # Forwarding between the clusters' pods and to the node address.
    iptables -w -I NMK8S-FORWARD -i "$HOST_VETH" -d 198.18.0.0/15 -j ACCEPT
    iptables -w -I NMK8S-FORWARD -o "$HOST_VETH" -s 198.18.0.0/15 -j ACCEPT
  fi
  # Its cgroup root, in every hierarchy (cgroup v1 hybrid here).
  local h
  for h in /sys/fs/cgroup/*/; do
    [[ -f $h/cgroup.procs ]] && mkdir -p "$h$MEMBER_CGROUP"
  done
  [[ -f /sys/fs/cgroup/cgroup.procs ]] && mkdir -p "/sys/fs/cgroup/$MEMBER_CGROUP"

  mkdir -p "$MEMBER/kubelet" "$MEMBER/pod-logs"
  containerd_config "$CTRD" "$MEMBER_SOCK" "$MEMBER/runc" "$MEMBER/cni/net.d"
  cni_conflist "$MEMBER/cni/net.d/10-nextmini-member.conflist" nextmini-k8s-member "$MEMBER_POD_BRIDGE" \
    "$MEMBER_POD_CIDR" "$MEMBER_POD_GW" "$MEMBER/cni/ipam"
  start member-containerd nsenter --net="/run/netns/$NETNS" "$BIN/containerd" --config "$CTRD/config.toml" --log-level warn
  wait_for member-containerd "member containerd serving" "$BIN/ctr" --address "$MEMBER_SOCK" version
  # The images its pods use, from the archives images.sh made for up.sh's.
  local image
  for image in "$CACHE"/images/{pause,nextmini,tools}.tar; do
    [[ -f $image ]] || die "$image is missing: run images.sh first"
    "$BIN/ctr" --address "$MEMBER_SOCK" -n k8s.io images import "$image" >>"$LOGS/member-images.log" 2>&1 ||
      { tail -n 20 "$LOGS/member-images.log" >&2; die "importing $image into the member's containerd failed"; }
  done
  # Under the chart's appVersion too, as images.sh tags them for up.sh's.
  local app_version
  app_version=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' "$HERE/../../helm/nextmini/Chart.yaml")
  [[ -n $app_version ]] || die "no appVersion in helm/nextmini/Chart.yaml"
  for image in nextmini tools; do
    "$BIN/ctr" --address "$MEMBER_SOCK" -n k8s.io images tag --force \
      "docker.io/nextmini/$image:dev" "docker.io/nextmini/$image:$app_version" >/dev/null
  done
  log "member images imported (pause, nextmini, tools; dev and $app_version)"

  cert "$MEMBER" kubelet "/O=system:nodes/CN=system:node:$MEMBER_NODE" "extendedKeyUsage=clientAuth"
  cert "$MEMBER" kubelet-server "/CN=$MEMBER_NODE" "extendedKeyUsage=serverAuth
subjectAltName=IP:$MEMBER_NODE_IP,DNS:$MEMBER_NODE"
  kubeconfig_file "$MEMBER/kubelet.kubeconfig" "$APISERVER" "$MEMBER/kubelet" kubelet
  # Its pods' cgroups under a root of their own: the two kubelets never
  # see each other's pods.
  kubelet_config "$MEMBER/kubelet-config.yaml" "$MEMBER_NODE_IP" "$MEMBER/kubelet-server" "$MEMBER_SOCK" \
    "$MEMBER_DNS_IP" "$MEMBER_POD_CIDR" 512Mi "cgroupRoot: /$MEMBER_CGROUP
podLogsDir: $MEMBER/pod-logs"
  start member-kubelet nsenter --net="/run/netns/$NETNS" "$BIN/kubelet" --config "$MEMBER/kubelet-config.yaml" \
    --kubeconfig "$MEMBER/kubelet.kubeconfig" --root-dir "$MEMBER/kubelet" \
    --hostname-override "$MEMBER_NODE" --node-ip "$MEMBER_NODE_IP" --v=1
  member_node_ready() {
    [[ $("$BIN/kubectl" --kubeconfig "$KUBECONFIG_MEMBER" get node "$MEMBER_NODE" \
      -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}') == True ]]
  }
  wait_for member-kubelet "member node $MEMBER_NODE Ready" member_node_ready
}

# Stops the member's node: kubelet, its pods, containerd; removes the
# namespace, its routes and rules, the pods' cgroups and mounts.
stop_node() {
  stop member-kubelet
  local procs d
  for ((i = 0; i < 50; i++)); do
    procs=$(find /sys/fs/cgroup/*/"$MEMBER_CGROUP" /sys/fs/cgroup/"$MEMBER_CGROUP" -name cgroup.procs -exec cat {} + 2>/dev/null | sort -u || true)
    [[ -z $procs ]] && break
    # shellcheck disable=SC2086
    kill -KILL $procs 2>/dev/null || true
    sleep 0.1
  done
  stop member-containerd
  # The shims of the member's pods (their address names the member's socket).
  pkill -KILL -f "containerd-shim-runc-v2 .*-address $MEMBER_SOCK" 2>/dev/null || true
  awk '{print $5}' /proc/self/mountinfo | grep "^$MEMBER/" | sort -r | while read -r mp; do
    umount "$mp" 2>/dev/null || umount -l "$mp" 2>/dev/null || true
  done
  for d in /sys/fs/cgroup/*/"$MEMBER_CGROUP" /sys/fs/cgroup/"$MEMBER_CGROUP"; do
    [[ -d $d ]] && { find "$d" -depth -type d -exec rmdir {} + 2>/dev/null || true; }
  done
  iptables -w -D NMK8S-INPUT -i "$HOST_VETH" -j RETURN 2>/dev/null || true
  iptables -w -D NMK8S-FORWARD -i "$HOST_VETH" -d 198.18.0.0/15 -j ACCEPT 2>/dev/null || true
  iptables -w -D NMK8S-FORWARD -o "$HOST_VETH" -s 198.18.0.0/15 -j ACCEPT 2>/dev/null || true
  ip route del "$MEMBER_POD_CIDR" 2>/dev/null || true
  ip netns del "$NETNS" 2>/dev/null || true
}

case ${1:-} in
  start)
    mkdir -p "$MEMBER/etcd"
    chmod 700 "$MEMBER"
    if ! alive member-etcd; then
      start member-etcd "$BIN/etcd" --name member --data-dir "$MEMBER/etcd" \
        --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
        --listen-peer-urls http://127.0.0.1:22380 --initial-advertise-peer-urls http://127.0.0.1:22380 \
        --initial-cluster member=http://127.0.0.1:22380 --listen-metrics-urls "" \
        --unsafe-no-fsync --log-level warn
      wait_for member-etcd "member etcd healthy" curl -sf "http://127.0.0.1:$ETCD_PORT/health"
    fi
    start_apiserver
    # The first cluster's admin credentials, at the member's address.
    sed "s|server: https://$NODE_IP:6443|server: $APISERVER|" "$STATE/kubeconfig" >"$KUBECONFIG_MEMBER"
    chmod 600 "$KUBECONFIG_MEMBER"
    grep -q "server: $APISERVER" "$KUBECONFIG_MEMBER" || die "could not point the kubeconfig at $APISERVER"
    sed "s|server: https://$NODE_IP:6443|server: $APISERVER|" "$PKI/controller-manager.kubeconfig" \
      >"$MEMBER/controller-manager.kubeconfig"
    chmod 600 "$MEMBER/controller-manager.kubeconfig"
    if ! alive member-controller-manager; then
      start member-controller-manager "$BIN/kube-controller-manager" \
        --kubeconfig "$MEMBER/controller-manager.kubeconfig" \
        --authentication-kubeconfig "$MEMBER/controller-manager.kubeconfig" \
        --authorization-kubeconfig "$MEMBER/controller-manager.kubeconfig" \
        --bind-address 127.0.0.1 --secure-port 20257 --leader-elect=false \
        --cluster-signing-cert-file "$PKI/ca.crt" --cluster-signing-key-file "$PKI/ca.key" \
        --root-ca-file "$PKI/ca.crt" --service-account-private-key-file "$PKI/sa.key" \
        --use-service-account-credentials=true --service-cluster-ip-range "$MEMBER_SERVICE_CIDR" \
        --allocate-node-cidrs=false --controllers '*' --profiling=false --v=1
      wait_for member-controller-manager "member kube-controller-manager healthy" \
        curl -sfk https://127.0.0.1:20257/healthz
    fi
    # A scheduler, so the member says (in its events) why a pod there
    # cannot run: it has no kubelet.
    sed "s|server: https://$NODE_IP:6443|server: $APISERVER|" "$PKI/scheduler.kubeconfig" \
      >"$MEMBER/scheduler.kubeconfig"
    chmod 600 "$MEMBER/scheduler.kubeconfig"
    if ! alive member-scheduler; then
      start member-scheduler "$BIN/kube-scheduler" \
        --kubeconfig "$MEMBER/scheduler.kubeconfig" \
        --authentication-kubeconfig "$MEMBER/scheduler.kubeconfig" \
        --authorization-kubeconfig "$MEMBER/scheduler.kubeconfig" \
        --bind-address 127.0.0.1 --secure-port 20259 --leader-elect=false --profiling=false --v=1
      wait_for member-scheduler "member kube-scheduler healthy" curl -sfk https://127.0.0.1:20259/healthz
    fi
    echo "$KUBECONFIG_MEMBER"
    ;;
  start-node) start_node ;;
  stop-apiserver) stop member-apiserver ;;
  start-apiserver) start_apiserver ;;
  stop)
    stop_node
    stop member-scheduler
    stop member-controller-manager
    stop member-apiserver
    stop member-etcd
    rm -rf "$MEMBER"
    ;;
  *) die "usage: member.sh start|start-node|stop-apiserver|start-apiserver|stop" ;;
esac
