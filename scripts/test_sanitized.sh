#!/usr/bin/env bash
# The integration suites that start rec-server, run again against an ASan/UBSan build of it
# (build/asan). Any sanitizer report from any server process fails the run (tests/conftest.py
# collects the reports from $REC_SANITIZER_LOGS). `make test` calls this after the main suite;
# extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=$ROOT/.venv
log() { printf '\033[1m[sanitized]\033[0m %s\n' "$*"; }

log "building rec-server with ASan + UBSan (build/asan) and the fuzz targets (build/fuzz)"
bash scripts/build_sanitized.sh all

logs=$(mktemp -d "${TMPDIR:-/tmp}/rec-sanitizer.XXXXXX")
export REC_SERVER=$ROOT/build/asan/rec-server
export REC_SANITIZER_LOGS=$logs
# Reports go to files (one per process) so none is lost in a server's stderr pipe; leaks are
# checked at every server exit; UBSan stops at its first finding like ASan does.
# intercept_tls_get_addr=0: GCC 12's libasan guesses where a dynamic TLS block starts from a
# glibc 2.19 header (any block at 16 mod 4096 is taken to have one). glibc 2.36 mallocs those
# blocks, so now and then the guess reads a bogus range and LeakSanitizer's tracer segfaults
# at exit ("Tracer caught signal 11", seen with the dcn_v2 fp32 export; google/sanitizers#1409,
# fixed in LLVM 17, which neither Debian 12 compiler has). With the interception off the blocks
# are ordinary heap chunks reachable from glibc's dtv, so leak checking still covers them.
export ASAN_OPTIONS="log_path=$logs/asan:detect_leaks=1:intercept_tls_get_addr=0:strict_string_checks=1:check_initialization_order=1:detect_stack_use_after_return=1"
export UBSAN_OPTIONS="log_path=$logs/ubsan:print_stacktrace=1:halt_on_error=1"
export LSAN_OPTIONS="suppressions=$ROOT/cpp/sanitizers/lsan.supp:print_suppressions=0"

log "unit tests (ctest)"
(cd build/asan && ctest --output-on-failure -j "$(nproc)" > ctest.log 2>&1) || { cat build/asan/ctest.log; exit 1; }
tail -n 3 build/asan/ctest.log

log "integration suites against $REC_SERVER"
# tests/reliability includes the libFuzzer run of the decoders (test_fuzz.py), which `make test`
# runs only here. Of tests/serve_cli, only test_architectures: the server's C++ path differs by a
# model's output width (one task, two), which it covers. `rec serve`, `rec predict` and the raw
# rows are Python on the client's side, and what they send reaches paths tests/serve_cpp covers
# under the sanitizers (ids, strings the server hashes itself: test_sparse_strings.py; signals:
# tests/reliability/test_sigterm.py). Also left out: what never starts rec-server (Triton's side,
# the compose file's checks), which the main suite ran and the sanitizers cannot see.
"$VENV/bin/python" -m pytest -q -ra --durations=20 -p no:cacheprovider \
  -n "${REC_TEST_WORKERS:-2}" --dist loadfile \
  tests/serve_cpp tests/reliability tests/serve_cli/test_architectures.py \
  tests/serve_triton/test_triton.py::test_cpp_and_triton_agree \
  --ignore tests/reliability/test_deploy.py "$@"
