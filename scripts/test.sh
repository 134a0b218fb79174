#!/usr/bin/env bash
# `make test` after its set-up: lint, the main suite, then the server suites against the
# ASan/UBSan build and the decoders' fuzz run (scripts/test_sanitized.sh). Extra arguments go to
# the main suite's pytest.
#
# The instrumented builds take about 3.5 min of CPU (build/asan and build/fuzz; Intel Xeon). They
# run beside the main suite at the lowest priority, on what CPU its waits on servers, subprocesses
# and sockets leave (about a tenth of the 2 cores), and the sanitized stage finishes them.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
log() { printf '\033[1m[test]\033[0m %s\n' "$*"; }
# pytest-xdist workers of both suites (REC_TEST_WORKERS=0: one process, as plain pytest).
export REC_TEST_WORKERS=${REC_TEST_WORKERS:-2}
# Trained runs and exports shared by both suites (tests/artifacts.py), made afresh by each run.
REC_TEST_ARTIFACTS=$(mktemp -d "${TMPDIR:-/tmp}/rec-test-artifacts.XXXXXX")
export REC_TEST_ARTIFACTS

$BIN/ruff check .
$BIN/ruff format --check .

mkdir -p build
log "building the sanitized server and the fuzz targets in the background (build/sanitized-build.log)"
setsid nice -n 19 bash scripts/build_sanitized.sh all > build/sanitized-build.log 2>&1 &
builder=$!
# Its own process group (setsid), so that a failed or interrupted suite stops the whole build.
trap 'kill -- "-$builder" 2> /dev/null || true; rm -rf "$REC_TEST_ARTIFACTS"' EXIT

# test_fuzz.py runs once, in the sanitized stage, where its targets are built.
# Two workers (pytest-xdist), a test file each at a time, so that a module's shared run or server
# stays in one process. One suite alone keeps about half of the 2 cores busy: 22.9 min of wall
# for 25 min of CPU, serially, against 14.2 min on two workers (Intel Xeon, AVX-512). Every
# port, network namespace and temporary path a test takes is its own (port 0, named after the
# process, tmp_path), so the workers do not collide.
started=$SECONDS
$BIN/python -m pytest -q -ra --durations=30 -n "$REC_TEST_WORKERS" --dist loadfile \
  --ignore=tests/reliability/test_fuzz.py "$@"
log "main suite: $(((SECONDS - started) / 60)) min $(((SECONDS - started) % 60)) s"

log "waiting for the sanitized builds"
wait "$builder" || { tail -60 build/sanitized-build.log; echo "sanitized build failed" >&2; exit 1; }
trap 'rm -rf "$REC_TEST_ARTIFACTS"' EXIT
started=$SECONDS
bash scripts/test_sanitized.sh
log "sanitized stage: $(((SECONDS - started) / 60)) min $(((SECONDS - started) % 60)) s"
