#!/usr/bin/env bash
# CI smoke run of the fuzz targets: builds them, then runs each for a short time
# (FUZZ_SECONDS, default 20) starting from the committed corpus. Exits non-zero
# when a build fails or a target crashes (panic, failed invariant, sanitizer
# report, timeout or out-of-memory); the crashing input is left in
# fuzz/artifacts/<target>/ and cargo fuzz prints how to reproduce it.
#
#   fuzz/smoke.sh                  # every target
#   fuzz/smoke.sh flow_key         # some targets
#   FUZZ_SECONDS=300 fuzz/smoke.sh # longer
#
# New inputs the fuzzer finds go to a temporary directory, never into the
# committed corpus (see README.md for how to grow and minimise it).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
seconds=${FUZZ_SECONDS:-20}
targets=("$@")
if [[ ${#targets[@]} -eq 0 ]]; then
  targets=(frame_decoder flow_key control_messages socks5)
fi

if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "smoke: cargo-fuzz is missing; installing it" >&2
  cargo install --locked cargo-fuzz
fi

# libFuzzer and the sanitizers need nightly flags: use a nightly toolchain when
# rustup has one, or let stable accept them.
if cargo +nightly --version >/dev/null 2>&1; then
  cargo=(cargo +nightly)
else
  echo "smoke: no nightly toolchain; using stable with RUSTC_BOOTSTRAP=1" >&2
  cargo=(cargo)
  export RUSTC_BOOTSTRAP=1
fi

# Debug assertions on: integer overflow is a crash, as in the unit tests.
flags=(--fuzz-dir "$here" --debug-assertions)

echo "smoke: building fuzz targets with $("${cargo[@]}" --version)"
"${cargo[@]}" fuzz build "${flags[@]}"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failed=()
for t in "${targets[@]}"; do
  mkdir -p "$work/$t"
  echo "smoke: $t for ${seconds}s"
  # From $work so libFuzzer's stray files stay out of the tree; the first corpus
  # directory receives new inputs, the committed one is only read.
  if (cd "$work" && "${cargo[@]}" fuzz run "${flags[@]}" "$t" "$work/$t" "$here/corpus/$t" -- \
    -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    2>"$work/$t.log"); then
    grep -E '^(Done|stat::number_of_executed_units|stat::average_exec_per_sec)' "$work/$t.log" || true
  else
    failed+=("$t")
    tail -n 60 "$work/$t.log"
  fi
done

if [[ ${#failed[@]} -gt 0 ]]; then
  echo "smoke: FAILED: ${failed[*]} (inputs in $here/artifacts/)" >&2
  exit 1
fi
echo "smoke: ${#targets[@]} targets ran ${seconds}s each without a crash"
