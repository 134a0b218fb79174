#!/usr/bin/env bash
# Two hosts on this machine, for real: two network namespaces joined by a veth pair, each with
# its own address (10.231.0.1 and 10.231.0.2, which exist only inside them), each running the
# README's `torchrun ... -m rec.train.worker` with --nnodes 2. Rendezvous and gloo use only
# those two addresses, so no traffic leaves the namespaces. Needs root (ip netns).
#
#   scripts/multihost.sh CONFIG RUN_DIR [--resume]
#   NPROC=2 (ranks per host)  HOSTS=2 (1 runs host 0 alone, for comparison)  PORT=29500
#   PYTHON=.venv/bin/python  MAX_RESTARTS=0
#
# The namespaces and the veth pair are named after this script's PID and removed on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "multihost.sh: $*" >&2; exit 2; }
[ $# -ge 2 ] || die "usage: scripts/multihost.sh CONFIG RUN_DIR [--resume]"
[ "$(id -u)" -eq 0 ] || die "needs root to create network namespaces (ip netns); run it as root (sudo), nothing was started"
command -v ip > /dev/null || die "needs iproute2's ip command"

CONFIG=$(realpath "$1")
RUN=$(realpath -m "$2")
RESUME=${3:-}
NPROC=${NPROC:-2}
HOSTS=${HOSTS:-2}
PORT=${PORT:-29500}
PYTHON=${PYTHON:-$PWD/.venv/bin/python}
MAX_RESTARTS=${MAX_RESTARTS:-0}
[ -f "$CONFIG" ] || die "config $CONFIG does not exist"
[ "$HOSTS" = 1 ] || [ "$HOSTS" = 2 ] || die "HOSTS must be 1 or 2, got $HOSTS"
[ -z "$RESUME" ] || [ "$RESUME" = "--resume" ] || die "third argument must be --resume, got $RESUME"

TAG=rec$$
ADDRS=(10.231.0.1 10.231.0.2)

cleanup() {
  for i in 0 1; do ip netns del "${TAG}h$i" 2> /dev/null || true; done
}
trap cleanup EXIT
trap 'kill 0 2> /dev/null' INT TERM

ip netns add "${TAG}h0" || die "cannot create a network namespace here (a container without CAP_SYS_ADMIN?)"
ip netns add "${TAG}h1"
ip link add "${TAG}v0" type veth peer name "${TAG}v1"
for i in 0 1; do
  ip link set "${TAG}v$i" netns "${TAG}h$i"
  ip -n "${TAG}h$i" addr add "${ADDRS[$i]}/24" dev "${TAG}v$i"
  ip -n "${TAG}h$i" link set lo up
  ip -n "${TAG}h$i" link set "${TAG}v$i" up
done

host() {  # one host: torchrun in namespace $1, with gloo on its veth
  local i=$1
  ip netns exec "${TAG}h$i" env GLOO_SOCKET_IFNAME="${TAG}v$i" OMP_NUM_THREADS=1 \
    "$PYTHON" -m torch.distributed.run --nnodes "$HOSTS" --nproc-per-node "$NPROC" \
    --rdzv-backend c10d --rdzv-endpoint "${ADDRS[0]}:$PORT" --rdzv-id "$TAG" \
    --rdzv-conf "is_host=$([ "$i" = 0 ] && echo true || echo false)" --local-addr "${ADDRS[$i]}" \
    --max-restarts "$MAX_RESTARTS" --monitor-interval 0.5 \
    -m rec.train.worker --config "$CONFIG" --run-dir "$RUN" $RESUME
}

echo "[multihost] $HOSTS host(s) x $NPROC ranks: ${TAG}h0 (${ADDRS[0]}), ${TAG}h1 (${ADDRS[1]}) -> $RUN"
pids=()
for ((i = 0; i < HOSTS; i++)); do
  host "$i" &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
[ "$status" -eq 0 ] && echo "[multihost] done: $RUN" || echo "[multihost] failed (exit $status)" >&2
exit "$status"
