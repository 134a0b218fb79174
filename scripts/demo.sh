#!/usr/bin/env bash
# The whole path on the embedded default config: train -> export int8 -> serve (C++) -> predict.
# Every artifact goes under artifacts/demo/ (removed and rebuilt on each run).
set -euo pipefail
cd "$(dirname "$0")/.."
REC=.venv/bin/rec
OUT=${DEMO_DIR:-artifacts/demo}
NPROC=${DEMO_NPROC:-2}
rm -rf "$OUT"
mkdir -p "$OUT"

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "1/4 train: default DLRM on synthetic data, $NPROC ranks"
$REC train --run-dir "$OUT/run" --nproc "$NPROC"

if ! $REC --help | grep -q "^  export"; then
  echo "rec export is not available yet; the demo stops after training."
  exit 0
fi
step "2/4 export: int8 FBGEMM TorchScript + model repository"
$REC export "$OUT/run" --repo "$OUT/model_repository"

if ! $REC --help | grep -q "^  serve" || [ ! -x build/cpp/rec-server ]; then
  echo "serving is not available yet; the demo stops after export."
  exit 0
fi
step "3/4 serve: C++ LibTorch server on the repository"
LOG="$OUT/server.log"
$REC serve "$OUT/model_repository" --backend cpp --http-port 0 --grpc-port 0 --metrics-port 0 \
  > "$LOG" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true; wait $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 1 120); do
  grep -q "ready" "$LOG" && break
  kill -0 $SERVER 2>/dev/null || { cat "$LOG"; exit 1; }
  sleep 0.5
done
cat "$LOG"
HTTP=$(grep -o 'http=[^ ]*' "$LOG" | head -1 | cut -d= -f2)
GRPC=$(grep -o 'grpc=[^ ]*' "$LOG" | head -1 | cut -d= -f2)

step "4/4 predict: 4 synthetic rows over HTTP and over gRPC"
$REC predict --url "$HTTP" --protocol http --synthetic 4
$REC predict --url "$GRPC" --protocol grpc --synthetic 4

step "artifacts"
echo "run directory:    $OUT/run (config.yaml, plan.json, metrics.jsonl, checkpoints/)"
echo "model repository: $OUT/model_repository"
echo "server log:       $LOG"
