#!/usr/bin/env bash
# The line3 demo: up, real traffic with unmodified applications, status.
set -euo pipefail
bin=${1:-target/release/nextmini}
manifest=${2:-manifests/examples/line3.yaml}
www=$(mktemp -d)
trap 'kill "${server:-0}" 2>/dev/null || true; rm -rf "$www"' EXIT

echo "== nextmini up -f $manifest"
"$bin" up -f "$manifest"

echo "== c serves a 50 MB file with python3 -m http.server"
head -c 50000000 /dev/urandom > "$www/big"
"$bin" exec c -- python3 -m http.server 8000 --directory "$www" >/dev/null 2>&1 &
server=$!
for _ in $(seq 50); do
  "$bin" exec a -- curl -s -o /dev/null --max-time 1 http://c:8000/ && break
  sleep 0.2
done

echo "== nextmini exec a -- ping -c 3 c"
"$bin" exec a -- ping -c 3 c

echo "== nextmini exec a -- curl http://c:8000/big"
"$bin" exec a -- curl -sS -o "$www/fetched" -w 'fetched %{size_download} bytes in %{time_total} s (%{speed_download} B/s)\n' http://c:8000/big
echo "sha256 sent:     $(sha256sum < "$www/big" | cut -d' ' -f1)"
echo "sha256 received: $(sha256sum < "$www/fetched" | cut -d' ' -f1)"

sleep 1.5  # one report interval, so the counters below include the transfer
echo "== nextmini status"
"$bin" status
echo
echo "line3 is still running. Try: $bin exec a -- ping c   |   remove it: $bin down"
