#!/usr/bin/env bash
# Runs `make test`'s stages one after another, every one even when an earlier
# one failed, and ends with a short summary: each stage's result and time, and
# for a failed stage the names of its failed tests and the first lines of why.
# CI keeps only the tail of the output, so the summary is the last thing printed.
#
#   scripts/test-stages.sh NAME 'COMMAND' [NAME 'COMMAND' ...]
set -uo pipefail

logdir=$(mktemp -d /tmp/nextmini-test-logs.XXXXXX)
names=()
results=()
seconds=()
free_after=()

# Free space on the disk that holds target/ and /tmp, in GB: a build or a
# database that fills the disk fails with messages that do not say so plainly.
free_gb() {
  df -P -BG "$PWD" /tmp | awk 'NR > 1 { gsub("G", "", $4); if (min == "" || $4 < min) min = $4 } END { print min }'
}

echo "== make test: $(free_gb) GB free on the disk of $PWD and /tmp"

while [[ $# -ge 2 ]]; do
  name=$1 command=$2
  shift 2
  echo "== make test: stage $name"
  start=$(date +%s)
  bash -c "$command" 2>&1 | tee "$logdir/$name.log"
  status=${PIPESTATUS[0]}
  names+=("$name")
  results+=("$status")
  seconds+=($(($(date +%s) - start)))
  free_after+=("$(free_gb)")
done

# The lines that say what failed: libtest's "test x ... FAILED" and the panic
# message under it, pytest's "FAILED file::test", a fuzz crash, cargo's summary.
why_failed() {
  awk '
    after_panic { print; after_panic = 0; next }
    /panicked at/ { print; after_panic = 1; next }
    /^test .* \.\.\. FAILED|^FAILED |^ERROR |deadly signal|SUMMARY: |No space left on device|^error(\[|:)/ &&
      !/^error: (test failed, to rerun|[0-9]+ targets? failed)/ { print }
  ' "$1" | awk '!seen[$0]++' | head -n 10 | cut -c1-240
}

failed=0
echo
echo "== make test summary (logs in $logdir)"
for i in "${!names[@]}"; do
  if [[ ${results[$i]} -eq 0 ]]; then
    printf '  %-8s passed  %5ss  %4s GB free after\n' "${names[$i]}" "${seconds[$i]}" "${free_after[$i]}"
  else
    failed=1
    printf '  %-8s FAILED  %5ss  %4s GB free after (exit %s)\n' "${names[$i]}" "${seconds[$i]}" \
      "${free_after[$i]}" "${results[$i]}"
    why_failed "$logdir/${names[$i]}.log" | sed 's/^/      /'
    grep -aE '^error: [0-9]+ targets? failed' -A 12 "$logdir/${names[$i]}.log" | grep -aE '^\s+`' |
      head -n 6 | sed 's/^\s*/      target /'
  fi
done
if [[ $failed -ne 0 ]]; then
  echo "make test: some stage failed (see the summary above)"
fi
exit $failed
