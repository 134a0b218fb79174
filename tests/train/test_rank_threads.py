"""A training rank's intra-op threads: its share of the host's cores, not torch's default of
every core in every rank (2 ranks x 2 threads on 2 cores made the default model's step 5-12x
slower: benchmarks/README.md, training throughput)."""

from __future__ import annotations

import os
import subprocess
import sys

_PROBE = (
    "import sys, torch; from rec.train.distributed import set_rank_threads; "
    "print(set_rank_threads(int(sys.argv[1])), torch.get_num_threads())"
)


def _threads(local_ranks: int, omp: str | None = None) -> tuple[int, int]:
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    if omp is not None:
        env["OMP_NUM_THREADS"] = omp
    out = subprocess.run([sys.executable, "-c", _PROBE, str(local_ranks)], env=env,
                         capture_output=True, text=True, check=True).stdout.split()  # fmt: skip
    return int(out[0]), int(out[1])


def test_a_rank_takes_its_share_of_the_cores_unless_omp_num_threads_says():
    cores = len(os.sched_getaffinity(0))
    assert _threads(1) == (cores, cores)
    share = max(1, cores // 2)
    assert _threads(2) == (share, share)
    assert _threads(4 * cores) == (1, 1)
    assert _threads(1, omp="1") == (1, 1)  # the user's setting wins (its share: every core)
