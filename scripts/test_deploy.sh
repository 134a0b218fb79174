#!/usr/bin/env bash
# make test-deploy: the compose stack for real (tests/deploy). Installs and starts Docker if
# needed (root), builds the Debian base (deploy/build_base.sh), the wheelhouse
# (deploy/wheelhouse.sh) and the images, then runs train -> export -> rec-server -> Prometheus in
# containers and checks them. Containers, networks and volumes it made are removed at the end;
# the images are kept, so a second run reuses their layers.
#   scripts/test_deploy.sh [--preflight | --images]
# --preflight: only install and start Docker, or say why it cannot. --images: only build the base,
# the wheelhouse and the images (after make setup, whose pip makes the wheelhouse); .ci/run does
# that beside make test, and the full run after it then finds every layer built.
set -euo pipefail
cd "$(dirname "$0")/.."
BASE_IMAGE=${REC_BASE_IMAGE:-rec-base:bookworm}
mkdir -p build
log() { printf '\033[1m[deploy]\033[0m %s\n' "$*"; }
die() { echo "test-deploy: $*" >&2; exit 1; }
# Exit status 77 (automake's "skipped") means the stage cannot run on this machine at all (not
# root, no apt-get, no package); .ci/run reports that as a skip with this reason, never as green.
cannot() { echo "test-deploy: cannot run here: $*" >&2; exit 77; }

# Docker's CLI, a daemon it reaches, docker-compose and debootstrap; whichever is missing is
# installed from Debian (docker.io, docker-compose, debootstrap) when root. Each is checked on its
# own: some machines ship a static `docker` CLI without `dockerd`, and make setup already installs
# docker-compose, so the presence of one says nothing about the others.
ensure_docker() {
  local root=0 missing=()
  [ "$(id -u)" -eq 0 ] && root=1
  command -v docker > /dev/null || missing+=(docker.io)
  command -v dockerd > /dev/null || [ -n "${DOCKER_HOST:-}" ] || missing+=(docker.io)
  command -v docker-compose > /dev/null || missing+=(docker-compose)
  command -v debootstrap > /dev/null || missing+=(debootstrap)
  if [ ${#missing[@]} -gt 0 ]; then
    # shellcheck disable=SC2207  # package names have no spaces
    missing=($(printf '%s\n' "${missing[@]}" | sort -u))
    [ $root -eq 1 ] || cannot "missing ${missing[*]}, and installing needs root (sudo make test-deploy)"
    command -v apt-get > /dev/null || cannot "missing ${missing[*]}, and this machine has no apt-get to install them"
    log "installing from Debian: ${missing[*]}"
    apt-get update -q > /dev/null || die "apt-get update failed"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" \
      > build/test-deploy-apt.log 2>&1 \
      || {
        tail -20 build/test-deploy-apt.log >&2
        grep -qE 'Unable to locate package|has no installation candidate' build/test-deploy-apt.log \
          && cannot "Debian's archive here has no ${missing[*]} (build/test-deploy-apt.log)"
        die "apt-get install ${missing[*]} failed (build/test-deploy-apt.log)"
      }
  fi
  docker info > /dev/null 2>&1 && return 0
  if [ -n "${DOCKER_HOST:-}" ]; then
    die "no Docker daemon answers at DOCKER_HOST=$DOCKER_HOST"
  fi
  [ $root -eq 1 ] || cannot "no Docker daemon answers (or this user may not use it), and starting one needs root (sudo make test-deploy)"
  command -v dockerd > /dev/null || die "no Docker daemon: dockerd is missing (apt-get install docker.io)"
  log "starting dockerd (log: build/dockerd.log)"
  nohup dockerd > build/dockerd.log 2>&1 &
  for _ in $(seq 1 60); do
    docker info > /dev/null 2>&1 && return 0
    sleep 0.5
  done
  tail -5 build/dockerd.log >&2
  die "no Docker daemon: dockerd did not come up in 30 s (build/dockerd.log)"
}

ensure_docker
[ "${1:-}" = --preflight ] && { log "Docker $(docker version -f '{{.Server.Version}}') is up"; exit 0; }

BUILD_ARGS=()  # extra docker build arguments for both images
since() { echo "$(( $(date +%s) - $1 )) s"; }
# Full build output goes to a log (CI keeps only the tail of a failure, not 2,000 lines).
build_image() {  # build_image NAME LOG docker-build-args...
  local name=$1 out=$2
  shift 2
  local t
  t=$(date +%s)
  log "docker build $name (log: $out)"
  docker build "$@" > "$out" 2>&1 || { tail -30 "$out" >&2; die "docker build of $name failed (whole output: $out)"; }
  log "$name built in $(since "$t")"
}
build_images() {
  local start t
  start=$(date +%s)
  bash deploy/build_base.sh "$BASE_IMAGE"
  log "base image ready after $(since "$start")"
  t=$(date +%s)
  bash deploy/wheelhouse.sh
  log "wheelhouse ready after $(since "$t")"
  build_image rec:latest build/docker-build-rec.log "${BUILD_ARGS[@]}" --build-arg BASE="$BASE_IMAGE" \
    -t rec:latest .
  build_image rec-prometheus:latest build/docker-build-prometheus.log "${BUILD_ARGS[@]}" \
    -f deploy/prometheus.Dockerfile --build-arg BASE="$BASE_IMAGE" -t rec-prometheus:latest deploy
  log "images built in $(since "$start"); rec:latest is $(docker image inspect -f '{{.Size}}' rec:latest | awk '{printf "%.2f GB", $1/1e9}')"
}

log "CPU: $(lscpu | sed -n 's/^Model name: *//p'), amx: $(grep -q amx_tile /proc/cpuinfo && echo yes || echo no)"
if [ "${1:-}" = --images ]; then
  [ -x .venv/bin/pip ] || die "--images needs make setup first (deploy/wheelhouse.sh uses its pip)"
  # A build's RUN steps are dockerd's children, not this script's, so its nice does not reach
  # them. Beside make test they go in a cgroup with nice 19's CPU weight (cgroup v1, Docker's
  # cgroupfs driver); elsewhere they run at normal priority, and the log says so.
  low=/sys/fs/cgroup/cpu/rec-deploy-images
  if [ "$(docker info -f '{{.CgroupDriver}}' 2>/dev/null)" = cgroupfs ] \
    && mkdir -p "$low" 2> /dev/null && echo 15 > "$low/cpu.shares" 2> /dev/null; then
    BUILD_ARGS+=(--cgroup-parent /rec-deploy-images)
    log "the image builds run at low CPU weight (cgroup $low)"
  else
    log "the image builds run at normal CPU priority (no cgroup v1 cpu controller for them here)"
  fi
  build_images
  exit 0
fi
bash scripts/setup.sh > build/test-deploy-setup.log 2>&1 || { tail -20 build/test-deploy-setup.log; die "make setup failed"; }
start=$(date +%s)
build_images
REC_DEPLOY=1 REC_BASE_IMAGE="$BASE_IMAGE" .venv/bin/python -m pytest -q -ra -s tests/deploy "$@"
log "done in $(since "$start")"
