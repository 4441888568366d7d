#!/usr/bin/env bash
# End-to-end check of the local cluster: build (cached) → up → tools image →
#   1. a pod with NET_ADMIN and /dev/net/tun creates a TUN device and gets Ready
#   2. a Deployment scaled to 1
#   3. its Service answers another pod by DNS name (curl → python http.server),
#      both from a one-shot pod and through kubectl exec
#   4. deleting the Deployment removes its ReplicaSet and pods (owner references)
# → down.sh, then checks that no process, mount, bridge, iptables chain or
# cgroup of the cluster is left. NEXTMINI_K8S_KEEP=1 leaves the cluster up.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
. "$HERE/lib.sh"

PASSED=0 FAILED=0
ok() { PASSED=$((PASSED + 1)); log "PASS: $*"; }
bad() { FAILED=$((FAILED + 1)); log "FAIL: $*"; }
NS=nextmini-smoke
KUBECONFIG=$STATE/kubeconfig
export KUBECONFIG
kc() { "$BIN/kubectl" "$@"; }

summary() {
  echo "smoke: $PASSED passed, $FAILED failed"
}
diagnose() {
  [[ -f $KUBECONFIG ]] || return 0
  log "diagnostics:"
  kc get all -n "$NS" -o wide >&2 || true
  kc describe pods -n "$NS" 2>&1 | tail -n 60 >&2 || true
  kc get events -A --sort-by=.lastTimestamp 2>&1 | tail -n 30 >&2 || true
  tail -n 20 "$STATE/logs/kubelet.log" >&2 || true
}
on_exit() {
  local rc=$?
  if ((rc != 0)); then
    bad "aborted (exit $rc)"
    diagnose
    [[ ${NEXTMINI_K8S_KEEP:-0} == 1 ]] || "$HERE/down.sh" || true
    summary
  fi
}
trap on_exit EXIT

# wait_until WHAT SECS CMD...
wait_until() {
  local what=$1 secs=$2 t0=$SECONDS; shift 2
  until "$@" >/dev/null 2>&1; do
    ((SECONDS - t0 < secs)) || { log "timed out after ${secs}s: $what"; return 1; }
    sleep 0.2
  done
  log "$what ($((SECONDS - t0))s)"
}

t=$SECONDS; "$HERE/build.sh"; T_BUILD=$((SECONDS - t))
UP_LOG=$(mktemp /tmp/nextmini-smoke-up.XXXXXX)
t=$SECONDS
"$HERE/up.sh" 2>&1 | tee "$UP_LOG"
((PIPESTATUS[0] == 0)) || exit 1
T_UP=$((SECONDS - t))
T_NODE_READY=$(grep -oE 'node [^ ]+ Ready \([0-9]+s\)' "$UP_LOG" || true)
rm -f "$UP_LOG"
t=$SECONDS; "$HERE/images.sh" tools; T_IMAGES=$((SECONDS - t))

kc create namespace "$NS" --dry-run=client -o yaml | kc apply -f - >/dev/null

# ------------------------------------------------------------------ 1. TUN pod
t=$SECONDS
kc apply -n "$NS" -f - >/dev/null <<'EOF'
apiVersion: v1
kind: Pod
metadata: {name: tun, labels: {app: tun}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: tun
    image: docker.io/nextmini/tools:dev
    imagePullPolicy: Never
    securityContext:
      capabilities: {add: [NET_ADMIN]}
    command:
    - python3
    - -c
    - |
      import fcntl, os, struct, subprocess, time
      TUNSETIFF, IFF_TUN, IFF_NO_PI = 0x400454CA, 0x0001, 0x1000
      fd = os.open("/dev/net/tun", os.O_RDWR)
      fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", b"nmtun0", IFF_TUN | IFF_NO_PI))
      subprocess.check_call(["ip", "addr", "add", "198.18.255.1/30", "dev", "nmtun0"])
      subprocess.check_call(["ip", "link", "set", "nmtun0", "up"])
      open("/tmp/ready", "w").write("ok")
      print("tun nmtun0 up", flush=True)
      while True:
          time.sleep(3600)
    readinessProbe:
      exec: {command: [cat, /tmp/ready]}
      periodSeconds: 1
    volumeMounts:
    - {name: tun, mountPath: /dev/net/tun}
  volumes:
  - name: tun
    hostPath: {path: /dev/net/tun, type: CharDevice}
EOF
if kc wait -n "$NS" --for=condition=Ready pod/tun --timeout=90s >/dev/null; then
  T_POD_READY=$((SECONDS - t))
  ok "TUN pod Ready in ${T_POD_READY}s ($(kc logs -n "$NS" tun | tail -n1))"
else
  T_POD_READY=-1
  bad "TUN pod not Ready"; diagnose
fi
if kc exec -n "$NS" tun -- ip -o link show nmtun0 | grep nmtun0 >/dev/null; then
  ok "kubectl exec sees nmtun0 in the pod"
else
  bad "nmtun0 not visible through kubectl exec"
fi

# ------------------------------------------------------------------ 2. Deployment + Service
kc apply -n "$NS" -f - >/dev/null <<'EOF'
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: web
        image: docker.io/nextmini/tools:dev
        imagePullPolicy: Never
        command: [sh, -c, "mkdir -p /srv && echo hello-from-$(hostname) > /srv/index.html && cd /srv && exec python3 -m http.server 8080"]
        ports: [{containerPort: 8080}]
        readinessProbe:
          tcpSocket: {port: 8080}
          periodSeconds: 1
---
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  selector: {app: web}
  ports: [{port: 80, targetPort: 8080}]
EOF
kc scale -n "$NS" deployment/web --replicas=1 >/dev/null
replicas_one() {
  [[ $(kc get -n "$NS" deployment web -o jsonpath='{.status.readyReplicas}/{.status.replicas}') == 1/1 ]] &&
    [[ $(kc get pods -n "$NS" -l app=web --no-headers | wc -l) == 1 ]]
}
if wait_until "Deployment web at 1/1" 90 replicas_one; then
  ok "Deployment scaled to 1"
else
  bad "Deployment not at 1 ready replica"; diagnose
fi

kc apply -n "$NS" -f - >/dev/null <<'EOF'
apiVersion: v1
kind: Pod
metadata: {name: client}
spec:
  restartPolicy: Never
  containers:
  - name: curl
    image: docker.io/nextmini/tools:dev
    imagePullPolicy: Never
    command: [sh, -c, "for i in $(seq 1 30); do curl -sf --max-time 2 http://web.nextmini-smoke.svc/ && exit 0; sleep 1; done; exit 1"]
EOF
client_done() {
  local p; p=$(kc get -n "$NS" pod client -o jsonpath='{.status.phase}'); [[ $p == Succeeded || $p == Failed ]]
}
wait_until "client pod finished" 90 client_done || true
if [[ $(kc get -n "$NS" pod client -o jsonpath='{.status.phase}') == Succeeded ]] &&
  kc logs -n "$NS" client | grep hello-from-web >/dev/null; then
  ok "Service by DNS name from another pod: $(kc logs -n "$NS" client | tail -n1)"
else
  bad "client pod could not reach web.nextmini-smoke.svc"; kc logs -n "$NS" client >&2 || true
fi
if kc exec -n "$NS" tun -- curl -sf --max-time 5 http://web/ | grep hello-from-web >/dev/null; then
  ok "Service by short DNS name through kubectl exec"
else
  bad "curl http://web/ from the tun pod failed"
fi
if kc exec -n "$NS" tun -- python3 -c 'import socket; print(socket.gethostbyname("kubernetes.default.svc.cluster.local"))' |
  grep -x "$KUBERNETES_SVC_IP" >/dev/null; then
  ok "kubernetes.default.svc.cluster.local resolves to $KUBERNETES_SVC_IP in a pod"
else
  bad "kubernetes.default.svc.cluster.local does not resolve in a pod"
fi

# ------------------------------------------------------------------ 4. cascade
rs=$(kc get rs -n "$NS" -l app=web -o name | head -n1)
kc delete -n "$NS" deployment web --wait=false >/dev/null
web_gone() {
  [[ -z $(kc get pods -n "$NS" -l app=web -o name) && -z $(kc get rs -n "$NS" -l app=web -o name) ]]
}
if [[ -n $rs ]] && wait_until "Deployment's ReplicaSet and pods collected" 60 web_gone; then
  ok "owner-reference cascade removed $rs and its pods"
else
  bad "garbage collector did not remove the Deployment's ReplicaSet/pods"; diagnose
fi

[[ ${NEXTMINI_K8S_KEEP:-0} == 1 ]] && { log "NEXTMINI_K8S_KEEP=1: leaving the cluster up"; trap - EXIT; summary; exit $((FAILED > 0)); }

# ------------------------------------------------------------------ down and leftovers
t=$SECONDS; "$HERE/down.sh"; T_DOWN=$((SECONDS - t))
left=""
for p in /proc/[0-9]*; do
  exe=$(readlink "$p/exe" 2>/dev/null) || continue
  [[ $exe == "$BIN"/* ]] && left+=" ${p#/proc/}:$(basename "$exe")"
done
[[ -z $left ]] && ok "no cluster process left" || bad "processes left:$left"
mounts=$(awk '{print $5}' /proc/self/mountinfo | grep -E "^($STATE|/var/lib/kubelet|/run/containerd|/var/lib/cni)" || true)
[[ -z $mounts ]] && ok "no mount left" || bad "mounts left: $mounts"
links=$(ip -o link show | grep -E "$NODE_BRIDGE|$POD_BRIDGE" || true)
[[ -z $links ]] && ok "no bridge left" || bad "links left: $links"
chains=$( (iptables-save; ip6tables-save) 2>/dev/null | grep -E '^:(KUBE-|CNI-|NMK8S-)' || true)
[[ -z $chains ]] && ok "no KUBE-/CNI-/NMK8S- iptables chain left" || bad "chains left: $(echo $chains)"
cgs=$(ls -d /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods 2>/dev/null || true)
[[ -z $cgs ]] && ok "no kubepods cgroup left" || bad "cgroups left: $cgs"
dirs=$(ls -d /var/lib/kubelet /var/lib/cni /var/log/pods /var/log/containers /run/containerd 2>/dev/null || true)
[[ -z $dirs ]] && ok "no kubelet/CNI/containerd directory left" || bad "directories left: $dirs"

trap - EXIT
log "timings: build ${T_BUILD}s (cached), up ${T_UP}s, ${T_NODE_READY:-node Ready n/a}, images ${T_IMAGES}s, pod apply→Ready ${T_POD_READY}s, down ${T_DOWN}s"
summary
exit $((FAILED > 0))
