#!/usr/bin/env bash
# The whole path on the embedded default config:
#   train (2 ranks) -> export int8 -> C++ server -> rec predict over HTTP and gRPC -> stop,
#   then the largest tables in a Redis Cluster (the same scores from rec-server reading them
#   there), then fresh embeddings: the server applies rows training publishes while it serves.
# Every artifact goes under artifacts/demo/ (removed and rebuilt on each run).
set -euo pipefail
cd "$(dirname "$0")/.."
REC=.venv/bin/rec
OUT=${DEMO_DIR:-artifacts/demo}
NPROC=${DEMO_NPROC:-2}
rm -rf "$OUT"
mkdir -p "$OUT"

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "1/7 train: default DLRM on synthetic data, $NPROC ranks"
$REC train --run-dir "$OUT/run" --nproc "$NPROC"

step "2/7 export: int8 FBGEMM TorchScript + Triton model repository, verified"
$REC export "$OUT/run" --repo "$OUT/model_repository" --quantize int8

step "3/7 serve: the C++ LibTorch server on the repository"
LOG="$OUT/server.log"
$REC serve "$OUT/model_repository" --backend cpp --http-port 0 --grpc-port 0 --metrics-port 0 \
  > "$LOG" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true; wait $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 1 240); do
  grep -q " ready " "$LOG" && break
  kill -0 $SERVER 2>/dev/null || { cat "$LOG"; exit 1; }
  sleep 0.5
done
grep " ready " "$LOG" || { cat "$LOG"; echo "the server did not become ready"; exit 1; }
HTTP=$(grep -o 'http=[^ ]*' "$LOG" | head -1 | cut -d= -f2)
GRPC=$(grep -o 'grpc=[^ ]*' "$LOG" | head -1 | cut -d= -f2)
METRICS=$(grep -o 'metrics=[^ ]*' "$LOG" | head -1 | cut -d= -f2)

step "4/7 predict: 4 synthetic rows over HTTP, then the same rows over gRPC"
$REC predict --url "$HTTP" --protocol http --synthetic 4 --repo "$OUT/model_repository"
$REC predict --url "$GRPC" --protocol grpc --synthetic 4 --repo "$OUT/model_repository"
kill -TERM $SERVER
wait $SERVER || true
trap - EXIT

step "5/7 tables beyond one server: the largest tables in a Redis Cluster, read through rec-server's cache"
.venv/bin/python scripts/demo_store.py --run "$OUT/run" --repo "$OUT/model_repository"

step "6/7 fresh embeddings: training goes on, publishing its rows; the server applies them while serving"
.venv/bin/python scripts/demo_fresh.py --run "$OUT/run" --repo "$OUT/model_repository" --nproc "$NPROC"

step "7/7 a live stream: online AUC as events arrive, collision-free ids admitted and evicted, a new id's served score changing"
.venv/bin/python scripts/demo_stream.py --out "$OUT" --nproc "$NPROC"

step "done"
echo "run directory:    $OUT/run   (config.yaml, plan.json, metrics.jsonl, checkpoints/)"
echo "model repository: $OUT/model_repository/rec/   (config.pbtxt, 1/model.pt, rec.json)"
echo "store-backed one: $OUT/model_repository_store   (rec.json \"store\": where its tables are)"
echo "server log:       $LOG   (metrics were at http://$METRICS/metrics)"
echo "stream run:       $OUT/stream_run   (trained from the stream; metrics.jsonl's \"online\" records)"
echo "next: $REC serve $OUT/model_repository --backend triton   # the same repository in Triton"
