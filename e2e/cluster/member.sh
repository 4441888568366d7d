#!/usr/bin/env bash
# A second control plane beside the cluster of up.sh, to register as a
# MemberCluster: its own etcd (own data directory and ports) and its own
# kube-apiserver on the node address at port 7443, with the first cluster's
# CA and certificates, and its own kube-controller-manager (which makes every
# namespace's default ServiceAccount, without which no pod is admitted, and
# collects garbage: an object there owned by one in another cluster would be
# deleted). It has no kubelet or scheduler, so pods made there stay Pending;
# it answers the API like any cluster, which is what the operator's probe,
# its pods in member clusters and the tests of an unreachable member need.
#
#   member.sh start             start all three; prints the member's kubeconfig path
#   member.sh stop-apiserver    stop the API server only (the member "goes away")
#   member.sh start-apiserver   start it again
#   member.sh stop              stop all three and remove the member's state
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
    --authorization-mode RBAC --allow-privileged=true \
    --profiling=false --v=1
  wait_for member-apiserver "member kube-apiserver /readyz" curl -sf --cacert "$PKI/ca.crt" \
    --cert "$PKI/admin.crt" --key "$PKI/admin.key" "$APISERVER/readyz"
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
  stop-apiserver) stop member-apiserver ;;
  start-apiserver) start_apiserver ;;
  stop)
    stop member-scheduler
    stop member-controller-manager
    stop member-apiserver
    stop member-etcd
    rm -rf "$MEMBER"
    ;;
  *) die "usage: member.sh start|stop-apiserver|start-apiserver|stop" ;;
esac
