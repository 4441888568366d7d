#!/bin/bash
# TUN offloads, before and after, in one run: iperf3 TCP through a 2-node and a
# 3-node line of unshaped links, with the agents' TUN offload off
# (NEXTMINI_TUN_OFFLOAD=false, the baseline) and on. Prints a Markdown table.
#
#   sudo scripts/tun-offload-bench.sh [BIN_DIR] [SECONDS] [REPEATS]
#
# BIN_DIR holds release builds of nextmini and nextmini-agent (default:
# target/release). Uses its own state directory and PostgreSQL port, and
# removes its topologies on exit.
set -euo pipefail
BIN=$(realpath "${1:-target/release}")
SECS=${2:-5}
REPEATS=${3:-3}
WORK=$(mktemp -d /tmp/nextmini-offload-bench.XXXXXX)
chmod 755 "$WORK"
export NEXTMINI_STATE_DIR=$WORK/state NEXTMINI_PG_PORT=${NEXTMINI_PG_PORT:-56992}
export NEXTMINI_AGENT_BIN=$BIN/nextmini-agent
NM=$BIN/nextmini
SERVER=

cleanup() {
    [ -n "$SERVER" ] && kill "$SERVER" 2>/dev/null
    wait 2>/dev/null || true
    "$NM" down >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT

# line NAME N: a Topology of N nodes n1 … nN in a line, MTU 1400, unshaped links.
line() {
    local name=$1 n=$2
    printf 'apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata:\n  name: %s\nspec:\n  dataplane:\n    mtu: 1400\n  nodes:\n' "$name"
    for i in $(seq 1 "$n"); do printf '    - name: n%d\n' "$i"; done
    for i in $(seq 1 $((n - 1))); do
        printf -- '---\napiVersion: nextmini.io/v1alpha1\nkind: Link\nmetadata:\n  name: l%d\nspec:\n  topology: %s\n  endpoints: [n%d, n%d]\n' "$i" "$name" "$i" $((i + 1))
    done
}

# measure N OFFLOAD: median iperf3 goodput n1 -> nN in Gbit/s over REPEATS runs.
measure() {
    local n=$1 offload=$2 name=offb$1 results=()
    line "$name" "$n" >"$WORK/$name.yaml"
    NEXTMINI_TUN_OFFLOAD=$offload "$NM" up -f "$WORK/$name.yaml" >/dev/null
    timeout 300 "$NM" exec -t "$name" "n$n" -- iperf3 -s >/dev/null 2>&1 &
    SERVER=$!
    sleep 0.5
    for _ in $(seq 1 "$REPEATS"); do
        results+=("$(timeout $((SECS + 20)) "$NM" exec -t "$name" n1 -- iperf3 -c "n$n" -t "$SECS" -J |
            python3 -c 'import json,sys; print("%.2f" % (json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"] / 1e9))')")
    done
    kill "$SERVER" 2>/dev/null; wait "$SERVER" 2>/dev/null || true
    SERVER=
    "$NM" down "$name" >/dev/null
    printf '%s\n' "${results[@]}" | sort -n | sed -n "$(((REPEATS + 1) / 2))p"
    echo "  n=$n offload=$offload runs: ${results[*]}" >&2
}

echo "| nodes (hops) | offload off | offload on | ratio |"
echo "|---|---|---|---|"
for n in 2 3; do
    off=$(measure "$n" false)
    on=$(measure "$n" true)
    ratio=$(python3 -c "print('%.1f' % ($on / $off))")
    echo "| $n ($((n - 1)) link$([ "$n" -gt 2 ] && echo s)) | $off Gbit/s | $on Gbit/s | ${ratio}× |"
done
