#!/usr/bin/env bash
# Runs a command on a CPU emulated at half its speed (or 1/F of it), to check CI's time budget
# (45 of 90 min on the slowest CPU seen) on a faster machine:
#   sudo scripts/half_speed_cpu.sh env CI=true bash .ci/run
#   sudo SLOWDOWN=1.5 scripts/half_speed_cpu.sh env CI=true bash .ci/run
# On each core a SCHED_FIFO thread is busy 1 ms of every 2 (1 - 1/SLOWDOWN of every 2 ms).
# Real-time threads preempt every normal task whatever its nice level or cgroup weight, so each
# core gives everything else half its time: one, two or four CPU-bound processes each take
# 2.0-2.1x as long. (Busy loops at
# normal priority do not emulate it: the scheduler shares a core by weight, so a many-threaded
# job keeps most of it and a low-weight one, like CI's image build, starves.) The stalls last
# 1 ms, so latency-sensitive tests see a jittery machine as well as a slow one.
# Needs root (chrt -f) and a C compiler. The loops end with the command, also on Ctrl-C.
set -euo pipefail
if [ "$#" -eq 0 ]; then
  echo "usage: $0 COMMAND [ARG...]" >&2
  exit 2
fi
slowdown=${SLOWDOWN:-2}
busy_us=$(awk -v s="$slowdown" 'BEGIN { if (s + 0 < 1 || s + 0 > 20) exit 1; printf "%d", 2000 * (1 - 1 / s) }') || {
  echo "half_speed_cpu: SLOWDOWN=$slowdown: give a factor from 1 to 20" >&2
  exit 2
}
if [ "$(id -u)" -ne 0 ]; then
  echo "half_speed_cpu: needs root, to run its busy loops at real-time priority (chrt -f)" >&2
  exit 2
fi
hog=$(mktemp -d)/half_busy
trap 'rm -rf "$(dirname "$hog")"' EXIT
cc -O2 -x c -DBUSY_NS="${busy_us}000ull" -o "$hog" - << 'EOF'
#include <stdint.h>
#include <time.h>
static uint64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}
int main(void) {
  uint64_t next = now_ns();
  for (;;) {
    uint64_t busy_end = next + BUSY_NS;
    while (now_ns() < busy_end) {
    }
    next += 2000000;  // of every 2 ms
    struct timespec t = {(time_t)(next / 1000000000u), (long)(next % 1000000000u)};
    clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &t, 0);
  }
}
EOF
pids=()
for ((core = 0; core < $(nproc); core++)); do
  taskset -c "$core" chrt -f 50 "$hog" &
  pids+=($!)
done
trap 'kill "${pids[@]}" 2> /dev/null || true; rm -rf "$(dirname "$hog")"' EXIT
echo "half_speed_cpu: $(nproc) cores at 1/$slowdown of their speed; running: $*" >&2
start=$SECONDS
rc=0
"$@" || rc=$?
echo "half_speed_cpu: '$*' exited $rc after $(((SECONDS - start) / 60)) min $(((SECONDS - start) % 60)) s" >&2
exit "$rc"
