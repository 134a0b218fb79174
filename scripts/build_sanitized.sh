#!/usr/bin/env bash
# The instrumented builds: rec-server and its unit tests with ASan + UBSan (build/asan, g++), and
# the request decoders' libFuzzer targets (build/fuzz, clang with ASan + UBSan). Incremental:
# a second run only relinks what changed.
#
# Usage: scripts/build_sanitized.sh [asan|fuzz|all]   (default all)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=$PWD/.venv
what=${1:-all}
mkdir -p build

# The protocol code protoc generated, compiled once by make setup (build/cpp) and linked by both
# instrumented builds (REC_PROTO_FROM in cpp/CMakeLists.txt says why it is not instrumented).
PROTO_FROM=$PWD/build/cpp
[ -f "$PROTO_FROM/libkserve_proto.a" ] \
  || { echo "build_sanitized.sh: $PROTO_FROM/libkserve_proto.a is missing: run make setup first" >&2; exit 2; }

build_asan() {
  local prefix
  prefix=$("$VENV/bin/python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
  cmake -S cpp -B build/asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DREC_SANITIZE=ON -DREC_PROTO_FROM="$PROTO_FROM" \
    -DCMAKE_PREFIX_PATH="$prefix" -DPython3_EXECUTABLE="$VENV/bin/python" \
    > build/asan-configure.log 2>&1 || { cat build/asan-configure.log; exit 1; }
  cmake --build build/asan -j "$(nproc)" --target rec-server rec_unit_tests
}

build_fuzz() {
  command -v clang++ > /dev/null \
    || { echo "build_sanitized.sh: clang++ not found (apt-get install clang libclang-rt-14-dev)" >&2; exit 2; }
  cmake -S cpp -B build/fuzz -DREC_FUZZ=ON -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=Debug \
    -DREC_PROTO_FROM="$PROTO_FROM" \
    -DPython3_EXECUTABLE="$VENV/bin/python" > build/fuzz-configure.log 2>&1 \
    || { cat build/fuzz-configure.log; exit 1; }
  cmake --build build/fuzz -j "$(nproc)"
}

case "$what" in
  asan) build_asan ;;
  fuzz) build_fuzz ;;
  all) build_fuzz; build_asan ;;
  *) echo "usage: $0 [asan|fuzz|all]" >&2; exit 2 ;;
esac
