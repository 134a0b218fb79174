#!/usr/bin/env bash
# One-time (and cheap to repeat) set-up: Debian packages for the C++ server, a virtual
# environment in .venv with the pinned stack, the `rec` CLI, and the C++ server build.
# Each step is skipped when its inputs have not changed since it last succeeded.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=$ROOT/.venv
STAMPS=$VENV/.stamps
PYTHON=${PYTHON:-python3}

log() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }

APT_PACKAGES=(build-essential cmake pkg-config libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev
  protobuf-compiler nlohmann-json3-dev zlib1g-dev libgtest-dev clang-format docker-compose wrk
  clang libclang-rt-14-dev redis-server libhiredis-dev ninja-build)

install_debian_packages() {
  local missing=()
  for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  log "installing Debian packages: ${missing[*]}"
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
}

stamp_ok() { [ -f "$STAMPS/$1" ] && [ "$(cat "$STAMPS/$1")" = "$2" ]; }
stamp_set() { mkdir -p "$STAMPS"; echo "$2" > "$STAMPS/$1"; }

install_python() {
  [ -x "$VENV/bin/python" ] || { log "creating $VENV"; "$PYTHON" -m venv "$VENV"; }
  local key
  key=$(cat requirements.txt requirements-host.txt | sha256sum | cut -c1-16)
  if ! stamp_ok python-deps "$key"; then
    log "installing the pinned Python stack (requirements.txt, requirements-host.txt)"
    "$VENV/bin/pip" install -q --disable-pip-version-check --upgrade pip
    "$VENV/bin/pip" install -q --disable-pip-version-check -r requirements-host.txt
    # torchrec's metadata asks for the CUDA fbgemm-gpu; its real needs are in requirements.txt.
    "$VENV/bin/pip" install -q --disable-pip-version-check --no-deps torchrec==1.8.0
    stamp_set python-deps "$key"
  fi
  # The package builds rec's op library (setup.py, cpp/ops and the zch_home.h it includes)
  # into rec/_ops.so.
  key=$(cat pyproject.toml setup.py cpp/ops/* cpp/src/contract/zch_home.h | sha256sum | cut -c1-16)
  if ! stamp_ok rec-package "$key" || [ ! -f rec/_ops.so ]; then
    log "installing rec (editable) and building its op library"
    "$VENV/bin/pip" install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
    stamp_set rec-package "$key"
  fi
}

build_cpp() {
  [ -f cpp/CMakeLists.txt ] || return 0
  log "building the C++ server (build/cpp)"
  local prefix
  prefix=$("$VENV/bin/python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
  cmake -S cpp -B build/cpp -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" \
    -DPython3_EXECUTABLE="$VENV/bin/python" > build/cmake-configure.log 2>&1 \
    || { cat build/cmake-configure.log; exit 1; }
  # What rec serve and the benchmarks run. The unit tests (rec_unit_tests) are built where they
  # run: under ASan by the test stage (scripts/build_sanitized.sh), or by hand before ctest.
  cmake --build build/cpp -j "$(nproc)" --target rec-server rec-bench grpc-pingpong
}

mkdir -p build
install_debian_packages
install_python
build_cpp
log "ready: source .venv/bin/activate (or use .venv/bin/rec)"
