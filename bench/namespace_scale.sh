#!/usr/bin/env bash
# A large topology in namespace mode (issue 16.1): `up` until every link
# forwards, the whole machine's memory for it (MemAvailable before and after),
# ping and a 100 KB curl between the two farthest nodes, then `down` and a check
# that nothing is left. Prints a pass/miss line per target. A private state
# directory and PostgreSQL; everything is removed on exit, even on failure.
# Usage: sudo bench/namespace_scale.sh ring [nodes]      (default 10000; about 6 min)
#        sudo bench/namespace_scale.sh fattree [k]       (default 32: 9,472 nodes; about 7 min)
set -euo pipefail
shape=${1:-ring}
case $shape in
ring)
    size=${2:-10000}
    generator="ring: {nodes: $size}"
    near=n0 far=n$((size / 2)) label="$size-node ring" ;;
fattree)
    size=${2:-32}
    half=$((size / 2))
    generator="fatTree: {k: $size}"
    # The first host of the first pod and the last host of the last: 6 links apart.
    near=host-0-0-0 far=host-$((size - 1))-$((half - 1))-$((half - 1))
    label="k=$size fat-tree ($((size * size * size / 4 + 5 * size * size / 4)) nodes)" ;;
*)
    echo "usage: $0 ring [nodes] | fattree [k]" >&2; exit 2 ;;
esac
source "$(dirname "$0")/private_state.sh" "$shape"
printf 'apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata: {name: big}\nspec:\n  generator: {%s}\n' "$generator" > "$work/topology.yaml"
avail() { awk '/^MemAvailable/{print $2}' /proc/meminfo; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
verdict() { awk -v v="$1" -v l="$2" 'BEGIN { print (v <= l) ? "pass" : "miss" }'; }

# Live agents only: an exited one stays a zombie until this machine's init reaps it.
ours() { echo $(( $(ls /run/netns | grep -c '^nm-' || true) + $(pgrep -c -r R,S,D,T,t,I nextmini-agent || true) )); }
ours_before=$(ours)
# CPU-seconds so far: the machine's busy time, then the live processes' user +
# system time by part. PID 1 is the machine's own (a sandbox's supervisor here,
# whose share of a 9,472-node `up` grew from 33-49 to 146-180 CPU-s between two
# machines of the same kind): counted so a slow `up` says whose time it was.
cpu_parts() {
    awk '/^cpu /{ printf "%.1f ", ($2 + $3 + $4 + $7 + $8 + $9) / 100; exit }' /proc/stat
    # A process that exits between the glob and the read fails `cat`, not the script.
    { cat /proc/[0-9]*/stat 2>/dev/null || true; } | awk -v init="$(cut -d' ' -f2 /proc/1/stat)" '
        { line = $0; sub(/^[0-9]+ /, "", line); name = line; sub(/\) [^)]*$/, ")", name)
          sub(/^.*\) /, "", line); split(line, f, " "); t[name] += f[12] + f[13] }
        END { printf "%.1f %.1f %.1f %.1f", t["(nextmini-agent)"] / 100, t["(nextmini)"] / 100,
              t["(postgres)"] / 100, t[init] / 100 }'
}
cpu_before=$(cpu_parts)
before=$(avail)
echo "$label: up (progress on stderr)" >&2
start=$(now)
if ! "$bin" up -f "$work/topology.yaml" --timeout-secs 1800 > "$work/up.log"; then
    echo "miss: up failed after $(since "$start") s; its output:" >&2
    tail -n 40 "$work/up.log" >&2
    exit 1
fi
up_s=$(since "$start")
cpu_after=$(cpu_parts)
cpu_up=$(awk -v b="$cpu_before" -v a="$cpu_after" -v wall="$up_s" -v cores="$(nproc)" -v init="$(cut -d' ' -f2 /proc/1/stat)" 'BEGIN {
    split(b, x, " "); split(a, y, " ")
    printf "machine busy %.0f of %.0f CPU-s; agents %.0f, nextmini (hub and up) %.0f, postgres (live backends) %.0f, PID 1 %s %.0f",
        y[1] - x[1], cores * wall, y[2] - x[2], y[3] - x[3], y[4] - x[4], init, y[5] - x[5] }')
after=$(avail)
used_gib=$(awk -v b="$before" -v a="$after" 'BEGIN { printf "%.1f", (b - a) / 1048576 }')
hub_mib=$(awk '/^VmRSS/{printf "%.0f", $2 / 1024}' "/proc/$(cat "$NEXTMINI_STATE_DIR/hub.pid")/status")

# A lost ping is a miss to print below, not the end of the script.
ping_out=$("$bin" exec "$near" -- ping -c 3 -W 30 "$far" 2>&1 | tail -2 | tr '\n' ' ' || true)
received=$(sed -n 's/.* \([0-9]*\) received.*/\1/p' <<< "$ping_out")
head -c 100000 /dev/urandom > "$work/blob"
"$bin" exec "$far" -- sh -c "python3 -m http.server 8000 --directory $work >/dev/null 2>&1 &"
# The server starts slowly on a loaded machine; a refused connection is retried.
curl_start=$(now)
"$bin" exec "$near" -- curl -s -m 300 --retry 60 --retry-connrefused --retry-delay 2 \
    -o "$work/got" "http://$far:8000/blob" || true
curl_s=$(since "$curl_start")
if cmp -s "$work/blob" "$work/got"; then curl_ok=pass; else curl_ok=miss; fi
pkill -f "http.server 8000 --directory $work" || true

start=$(now)
"$bin" down big > "$work/down.log"
down_s=$(since "$start")
left=$(( $(ours) - ours_before ))

echo "topology=\"$label\" up_s=$up_s down_s=$down_s memory_gib=$used_gib hub_rss_mib=$hub_mib ping_${near}_${far}=\"$ping_out\" curl_100KB_s=$curl_s left=$left"
echo "$(verdict "$up_s" 120): up in $up_s s (target <= 120 s); during it: $cpu_up"
echo "$(verdict "$down_s" 60): down in $down_s s (target <= 60 s)"
echo "$(verdict "$used_gib" 16): whole machine $used_gib GiB (MemAvailable drop; target <= 16 GiB)"
echo "$( [ "${received:-0}" -gt 0 ] && echo pass || echo miss ): ping $near -> $far: ${received:-0}/3"
echo "$curl_ok: curl $near -> $far of 100 KB, equal bytes, $curl_s s"
echo "$( [ "$left" -eq 0 ] && echo pass || echo miss ): nothing left ($left namespaces and agents)"
