#!/usr/bin/env bash
# Builds the libFuzzer targets of the C++ request decoders (cpp/fuzz/, clang with ASan and UBSan,
# in build/fuzz) and runs each for a bounded time from a seed corpus written by tritonclient's
# request builders. Prints executions, coverage and crashes per target; exits 1 on any crash or
# sanitizer report (the reproducer is left in build/fuzz/crashes/).
#
# Usage: benchmarks/fuzz.sh [SECONDS_PER_TARGET]   (default 60)
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_TARGET=${1:-60}
BUILD=build/fuzz
PY=${PYTHON:-.venv/bin/python}
TARGETS=(fuzz_http_request fuzz_infer_body fuzz_grpc_infer fuzz_settings_body)

mkdir -p build
bash scripts/build_sanitized.sh fuzz > build/fuzz-build.log 2>&1 || { tail -40 build/fuzz-build.log >&2; exit 1; }

rm -rf "$BUILD/seeds"
"$PY" benchmarks/fuzz_seeds.py "$BUILD/seeds" > /dev/null
mkdir -p "$BUILD/crashes"
failed=0
printf '%-18s %8s %10s %8s %6s %8s\n' target seconds execs cov ft crashes
for t in "${TARGETS[@]}"; do
  corpus="$BUILD/corpus/$t"
  mkdir -p "$corpus"
  log="$BUILD/$t.log"
  rc=0
  # Inputs that once crashed a target run first, every time (cpp/fuzz/regressions/<target>/).
  regressions=()
  [ -d "cpp/fuzz/regressions/$t" ] && regressions=("cpp/fuzz/regressions/$t")
  # -fork-free run: one process, stops at the first crash (reproducer written to crashes/).
  "$BUILD/$t" "$corpus" "$BUILD/seeds/$t" "${regressions[@]}" -max_total_time="$SECONDS_PER_TARGET" -max_len=8192 \
    -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$BUILD/crashes/$t-" \
    > "$log" 2>&1 || rc=$?
  execs=$(grep -oP 'stat::number_of_executed_units:\s*\K[0-9]+' "$log" | tail -1 || true)
  cov=$(grep -oP 'cov: \K[0-9]+' "$log" | tail -1 || true)
  ft=$(grep -oP 'ft: \K[0-9]+' "$log" | tail -1 || true)
  crashes=$(grep -cE 'ERROR: (AddressSanitizer|UndefinedBehaviorSanitizer|libFuzzer)|runtime error:|deadly signal' "$log" || true)
  if [ "$rc" -ne 0 ] && [ "$crashes" -eq 0 ]; then crashes=1; fi
  printf '%-18s %8s %10s %8s %6s %8s\n' "$t" "$SECONDS_PER_TARGET" "${execs:-?}" "${cov:-?}" "${ft:-?}" "$crashes"
  if [ "$crashes" -ne 0 ]; then
    failed=1
    grep -E -A20 'ERROR:|runtime error:|deadly signal' "$log" | head -40 >&2
  fi
done
exit $failed
