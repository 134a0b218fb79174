"""Training throughput: world size 1 vs 2, TrainPipelineSparseDist vs the plain loop, one run.

Each configuration is a real `rec train` (elastic launcher, gloo, CPU) on the embedded default
model; the rate is the median samples/s over its logged intervals after the first (warm-up).
All four run back to back in one invocation so they share the machine's conditions; compare
them as ratios.

    .venv/bin/python benchmarks/train_throughput.py [--steps 300] [--batch-size 256]

Writes benchmarks/results/train_throughput.json and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

RESULTS = Path(__file__).parent / "results" / "train_throughput.json"
REC = str(Path(sys.executable).parent / "rec")


def measure(nproc: int, pipeline: str, steps: int, batch_size: int, log_every: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        cfg = {
            "training": {
                "steps": steps, "batch_size": batch_size, "pipeline": pipeline,
                "eval_every": 0, "eval_batches": 1, "log_every": log_every,
            },
            "checkpoint": {"every_steps": 0},
        }  # fmt: skip
        path = Path(tmp) / "cfg.yaml"
        path.write_text(yaml.safe_dump(cfg))
        run = Path(tmp) / "run"
        t0 = time.perf_counter()
        subprocess.run(
            [REC, "train", "--config", str(path), "--run-dir", str(run), "--nproc", str(nproc)],
            check=True, stdout=subprocess.DEVNULL, env={"OMP_NUM_THREADS": "1", **_env()},
        )  # fmt: skip
        wall = time.perf_counter() - t0
        lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    rates = [x["samples_per_s"] for x in lines if x["kind"] == "train"][1:]
    return {
        "nproc": nproc,
        "pipeline": pipeline,
        "samples_per_s": round(statistics.median(rates), 1),
        "wall_s": round(wall, 1),
    }


def _env() -> dict:
    import os

    return dict(os.environ)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch-size", type=int, default=256)
    args = p.parse_args()
    log_every = max(10, args.steps // 10)
    rows = []
    for nproc in (1, 2):
        for pipeline in ("sparse_dist", "base"):
            print(f"measuring nproc={nproc} pipeline={pipeline} ...", flush=True)
            rows.append(measure(nproc, pipeline, args.steps, args.batch_size, log_every))
            print(f"  {rows[-1]}", flush=True)
    base = rows[0]["samples_per_s"]
    for r in rows:
        r["ratio_vs_1rank_pipelined"] = round(r["samples_per_s"] / base, 3)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({
        "machine": f"{platform.machine()} {__import__('os').cpu_count()} cores",
        "steps": args.steps, "batch_size_per_rank": args.batch_size, "results": rows,
    }, indent=2) + "\n")  # fmt: skip
    print("\n| ranks | pipeline | samples/s | ratio |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['nproc']} | {r['pipeline']} | {r['samples_per_s']:.0f} | "
              f"{r['ratio_vs_1rank_pipelined']:.2f} |")  # fmt: skip
    print(f"\nwritten: {RESULTS}")


if __name__ == "__main__":
    main()
