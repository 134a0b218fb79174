"""Peak RSS of a command and of each process it starts (Linux /proc), for the benchmarks.

Every `interval` seconds the process tree under the command is walked and each process's
VmHWM (the kernel's own high-water mark of its resident set) is recorded, so a short spike
between two polls is still counted, as long as the process is alive at the next poll (a spike
in a process's last 0.2 s before it exits is missed).

    .venv/bin/python benchmarks/procmem.py -- rec train -c examples/criteo_kaggle.yaml

The measurement is rec.benchmarking.run_watched, which the other benchmarks use too.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from rec.benchmarking import run_watched

if __name__ == "__main__":
    args = sys.argv[1:]
    if args and args[0] == "--":
        args = args[1:]
    wall, watch = run_watched(args, Path("procmem.log"))
    peaks = sorted(watch.peaks.values(), key=lambda x: -x[1])
    print(
        json.dumps(
            {
                "wall_s": round(wall, 2),
                "peaks_gb": [[c[:80], round(b / 1e9, 3)] for c, b in peaks[:8]],
            },
            indent=1,
        )
    )
