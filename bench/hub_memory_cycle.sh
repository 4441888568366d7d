#!/usr/bin/env bash
# The hub's memory before a 1,000-node ring's `up` and after its `down`, twice
# (issue 16.3), in a private state directory with a 2-node line running all along.
# Usage: sudo bench/hub_memory_cycle.sh [nodes]   (GLIBC_TUNABLES is passed to the hub)
set -euo pipefail
nodes=${1:-1000}
source "$(dirname "$0")/private_state.sh" hubmem
printf 'apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata: {name: hubline}\nspec:\n  generator: {line: {nodes: 2}}\n' > "$work/line2.yaml"
printf 'apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata: {name: hubring}\nspec:\n  generator: {ring: {nodes: %d}}\n' "$nodes" > "$work/ring.yaml"
"$bin" up -f "$work/line2.yaml" > "$work/up-line.log" 2>&1
hub=$(cat "$NEXTMINI_STATE_DIR/hub.pid")
sleep 3
rss() { awk '/^Rss/{print $2}' "/proc/$hub/smaps_rollup"; }
anon() { awk '/^Anonymous/{print $2}' "/proc/$hub/smaps_rollup"; }
before=$(rss)
before_anon=$(anon)
for cycle in 1 2; do
    echo "cycle $cycle: $nodes-node ring up" >&2
    "$bin" up -f "$work/ring.yaml" > "$work/up-ring.log" 2>&1
    "$bin" down hubring > "$work/down-ring.log" 2>&1
    sleep 17   # the hub trims on its 5 s ticks after sessions fall
    after=$(rss)
    after_anon=$(anon)
    awk -v c="$cycle" -v b="$before" -v a="$after" -v ba="$before_anon" -v aa="$after_anon" -v t="${GLIBC_TUNABLES:-}" \
        'BEGIN { printf "cycle %d: hub RSS %.1f MiB before up, %.1f MiB after down (%.2fx); anonymous %.1f -> %.1f MiB; GLIBC_TUNABLES=%s\n", c, b/1024, a/1024, a/b, ba/1024, aa/1024, t }'
done
