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

log "building rec-server with ASan + UBSan (build/asan)"
prefix=$("$VENV/bin/python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
mkdir -p build
cmake -S cpp -B build/asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DREC_SANITIZE=ON \
  -DCMAKE_PREFIX_PATH="$prefix" -DPython3_EXECUTABLE="$VENV/bin/python" \
  > build/asan-configure.log 2>&1 || { cat build/asan-configure.log; exit 1; }
cmake --build build/asan -j "$(nproc)" --target rec-server rec_unit_tests

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
"$VENV/bin/python" -m pytest -q -ra --durations=20 -p no:cacheprovider \
  tests/serve_cpp tests/reliability tests/serve_cli \
  tests/serve_triton/test_triton.py::test_cpp_and_triton_agree "$@"
