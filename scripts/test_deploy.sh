#!/usr/bin/env bash
# make test-deploy: the compose stack for real (tests/deploy). Installs and starts Docker if
# needed (root), builds the Debian base (deploy/build_base.sh), the wheelhouse
# (deploy/wheelhouse.sh) and the images, then runs train -> export -> rec-server -> Prometheus in
# containers and checks them. Containers, networks and volumes it made are removed at the end;
# the images are kept, so a second run reuses their layers.
#   scripts/test_deploy.sh [--preflight]    (--preflight: only check Docker and say what's missing)
set -euo pipefail
cd "$(dirname "$0")/.."
BASE_IMAGE=${REC_BASE_IMAGE:-rec-base:bookworm}
mkdir -p build
log() { printf '\033[1m[deploy]\033[0m %s\n' "$*"; }
die() { echo "test-deploy: $*" >&2; exit 1; }

# Docker's CLI and a daemon it reaches; installed (Debian's docker.io) and started when root.
ensure_docker() {
  local root=0
  [ "$(id -u)" -eq 0 ] && root=1
  if ! command -v docker > /dev/null || ! command -v docker-compose > /dev/null; then
    [ $root -eq 1 ] || die "Docker is not installed, and installing it needs root (sudo make test-deploy)"
    log "installing Debian's docker.io, docker-compose and debootstrap"
    apt-get update -q > /dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends docker.io \
      docker-compose debootstrap > /dev/null
  fi
  docker info > /dev/null 2>&1 && return 0
  if [ -n "${DOCKER_HOST:-}" ]; then
    die "no Docker daemon answers at DOCKER_HOST=$DOCKER_HOST"
  fi
  [ $root -eq 1 ] || die "no Docker daemon answers (or this user may not use it), and starting one needs root (sudo make test-deploy)"
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

log "CPU: $(lscpu | sed -n 's/^Model name: *//p'), amx: $(grep -q amx_tile /proc/cpuinfo && echo yes || echo no)"
bash scripts/setup.sh > build/test-deploy-setup.log 2>&1 || { tail -20 build/test-deploy-setup.log; die "make setup failed"; }
start=$(date +%s)
bash deploy/build_base.sh "$BASE_IMAGE"
bash deploy/wheelhouse.sh
# Full build output goes to a log (CI keeps only the tail of a failure, not 2,000 lines).
build_image() {  # build_image NAME LOG docker-build-args...
  local name=$1 out=$2
  shift 2
  log "docker build $name (log: $out)"
  docker build "$@" > "$out" 2>&1 || { tail -30 "$out" >&2; die "docker build of $name failed (whole output: $out)"; }
}
build_image rec:latest build/docker-build-rec.log --build-arg BASE="$BASE_IMAGE" -t rec:latest .
build_image rec-prometheus:latest build/docker-build-prometheus.log -f deploy/prometheus.Dockerfile \
  --build-arg BASE="$BASE_IMAGE" -t rec-prometheus:latest deploy
log "images built in $(( $(date +%s) - start )) s; rec:latest is $(docker image inspect -f '{{.Size}}' rec:latest | awk '{printf "%.2f GB", $1/1e9}')"
REC_DEPLOY=1 REC_BASE_IMAGE="$BASE_IMAGE" .venv/bin/python -m pytest -q -ra -s tests/deploy "$@"
log "done in $(( $(date +%s) - start )) s"
