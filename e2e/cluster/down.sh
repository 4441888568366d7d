#!/usr/bin/env bash
# Stops everything up.sh started (pods' containers and shims too) and removes
# what the cluster left on the host: mounts, kubelet/CNI/containerd directories,
# the KUBE-*/CNI-*/NMK8S-* iptables chains, the bridges and the kubepods cgroups,
# and member.sh's node (network namespace, route, cgroups).
# The build cache is left alone. Safe to run twice and when nothing runs.
#   down.sh [--quiet] [--keep-logs]
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
. "$HERE/lib.sh"

QUIET=0 KEEP_LOGS=1
for a in "$@"; do
  case $a in
    --quiet) QUIET=1 ;;
    --no-logs) KEEP_LOGS=0 ;;
    --keep-logs) KEEP_LOGS=1 ;;
    *) die "unknown argument $a" ;;
  esac
done
say() { ((QUIET)) || log "$@"; }
[[ $(id -u) == 0 ]] || die "must run as root"

RUN=$STATE/run
CGROOT=/sys/fs/cgroup
# Kernel settings up.sh changed, restored at the end.
SAVED_SYSCTLS=""
[[ -f $RUN/sysctl.saved ]] && SAVED_SYSCTLS=$(cat "$RUN/sysctl.saved")

# Processes of this cluster: the ones in our pid files, and any process whose
# executable is one of our binaries (catches the leftovers of a killed run).
# our_procs prints "PID EXE" for every process running a file under $BIN.
our_procs() {
  find /proc/[0-9]*/exe -maxdepth 0 -lname "$BIN/*" -printf '%h %l\n' 2>/dev/null | sed 's|^/proc/||; s| (deleted)$||' || true
}
pids_of() {
  local name f pid
  for name in "$@"; do
    f=$RUN/$name.pid
    if [[ -f $f ]]; then
      pid=$(cat "$f")
      [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null && echo "$pid"
      rm -f "$f"
    fi
    our_procs | awk -v exe="$BIN/$name" '$2 == exe {print $1}'
  done | sort -u
}
# stop NAME...: SIGTERM to all of them at once, SIGKILL whatever is left after 10 s.
stop() {
  local pids i p left
  pids=$(pids_of "$@")
  [[ -n $pids ]] || return 0
  say "stopping $* ($(echo $pids))"
  # shellcheck disable=SC2086
  kill -TERM $pids 2>/dev/null || true
  for ((i = 0; i < 100; i++)); do
    left=""
    for p in $pids; do kill -0 "$p" 2>/dev/null && left+=" $p"; done
    [[ -z $left ]] && return 0
    sleep 0.1
  done
  say "killing$left"
  # shellcheck disable=SC2086
  kill -KILL $left 2>/dev/null || true
}

# All processes in the kubepods cgroup trees (the pods' containers).
pod_pids() {
  local d
  for d in "$CGROOT"/*/kubepods "$CGROOT"/kubepods "$CGROOT"/*/"$MEMBER_CGROUP" "$CGROOT"/"$MEMBER_CGROUP"; do
    [[ -d $d ]] || continue
    find "$d" -name cgroup.procs -exec cat {} + 2>/dev/null
  done | sort -u
}

# 1. The kubelet first, so that it restarts nothing; then the pods' processes,
#    their shims, and the rest of the control plane.
stop kubelet
pids=$(pod_pids)
if [[ -n $pids ]]; then
  say "killing $(echo "$pids" | wc -l) pod processes"
  for ((i = 0; i < 50; i++)); do
    # shellcheck disable=SC2086
    kill -KILL $pids 2>/dev/null || true
    sleep 0.1
    pids=$(pod_pids)
    [[ -z $pids ]] && break
  done
fi
stop containerd-shim-runc-v2
stop coredns kube-proxy containerd kube-scheduler kube-controller-manager
stop kube-apiserver
stop etcd
# Anything else still running one of our binaries (ctr, runc, CNI plugins...).
left=$(our_procs | awk '{print $1}')
if [[ -n $left ]]; then
  say "killing leftover processes $(echo $left)"
  # shellcheck disable=SC2086
  kill -KILL $left 2>/dev/null || true
  sleep 0.2
fi

# 2. Mounts under our directories (deepest first), then the directories.
PREFIXES=("$STATE" /var/lib/kubelet /run/containerd /var/run/containerd /var/lib/cni)
unmount_all() {
  local mp pre n=0
  while read -r mp; do
    for pre in "${PREFIXES[@]}"; do
      if [[ $mp == "$pre" || $mp == "$pre"/* ]]; then
        umount "$mp" 2>/dev/null || umount -l "$mp" 2>/dev/null || true
        n=$((n + 1))
      fi
    done
  done < <(awk '{print $5}' /proc/self/mountinfo | sed 's/\\040/ /g' | sort -r -u)
  ((n == 0)) || say "unmounted $n mounts"
}
unmount_all
unmount_all # mounts can be stacked on one mount point

if [[ -d $STATE ]]; then
  [[ -n $(ls -A "$STATE" | grep -vx logs) ]] && say "removing $STATE"
  if ((KEEP_LOGS)) && [[ -d $STATE/logs ]]; then
    find "$STATE" -mindepth 1 -maxdepth 1 ! -name logs -exec rm -rf {} +
  else
    rm -rf "$STATE"
  fi
fi
# What the kubelet, libcni and the shim write outside any configured directory.
rm -rf /var/lib/kubelet /var/lib/cni /var/log/pods /var/log/containers
if ! pgrep -x containerd >/dev/null 2>&1; then rm -rf /run/containerd; fi

# 3. iptables (IPv4 and IPv6): rules that jump to KUBE-*/CNI-*/NMK8S-* chains,
#    then the chains themselves.
if command -v iptables >/dev/null 2>&1; then
  [[ -x $BIN/kube-proxy ]] && "$BIN/kube-proxy" --cleanup >/dev/null 2>&1 || true
  for ipt in iptables ip6tables; do
    command -v "$ipt-save" >/dev/null 2>&1 || continue
    for table in filter nat mangle raw; do
      dump=$("$ipt-save" -t "$table" 2>/dev/null || true)
      chains=$(grep -oE '^:(KUBE-|CNI-|NMK8S-)[^ ]+' <<<"$dump" | cut -c2- || true)
      [[ -n $chains ]] || continue
      # Jumps from other chains (the built-in ones).
      grep -E -- '^-A .* -j (KUBE-|CNI-|NMK8S-)' <<<"$dump" | grep -vE '^-A (KUBE-|CNI-|NMK8S-)' |
        while read -r rule; do
          eval "$ipt -w -t $table -D ${rule#-A }" 2>/dev/null || true
        done || true
      for ch in $chains; do "$ipt" -w -t "$table" -F "$ch" 2>/dev/null || true; done
      for ch in $chains; do "$ipt" -w -t "$table" -X "$ch" 2>/dev/null || true; done
      say "removed $(echo "$chains" | wc -w) $ipt chains from $table"
    done
  done
fi

# 4. member.sh's node: its network namespace (with its veth and pod bridge)
#    and the route to its pods; then the bridges (the pods' veths went with
#    their network namespaces).
if ip netns list 2>/dev/null | grep -q "^$MEMBER_NETNS\b"; then
  ip netns del "$MEMBER_NETNS" && say "removed network namespace $MEMBER_NETNS"
fi
ip route del "$MEMBER_POD_CIDR" 2>/dev/null || true
for br in "$POD_BRIDGE" "$NODE_BRIDGE"; do
  if ip link show "$br" >/dev/null 2>&1; then
    ip link del "$br" && say "removed bridge $br"
  fi
done

# 5. kubepods cgroups (and those of member.sh's node), deepest first.
for d in "$CGROOT"/*/kubepods "$CGROOT"/kubepods "$CGROOT"/*/"$MEMBER_CGROUP" "$CGROOT"/"$MEMBER_CGROUP"; do
  [[ -d $d ]] || continue
  find "$d" -depth -type d -exec rmdir {} + 2>/dev/null || true
  [[ -d $d ]] && say "warning: could not remove cgroup $d" || say "removed cgroup $d"
done

# 6. Kernel settings up.sh saved.
if [[ -n $SAVED_SYSCTLS ]]; then
  while IFS='=' read -r k v; do sysctl -qw "$k=$v" 2>/dev/null || true; done <<<"$SAVED_SYSCTLS"
  say "restored kernel settings"
fi
say "cluster down"
