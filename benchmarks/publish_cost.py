"""Publishing's cost to training: samples/s of `rec train` with and without --publish, at the
default publish settings, runs interleaved (off, on, off, on, ...) on the same machine.

    .venv/bin/python benchmarks/publish_cost.py --steps 200 --repeats 2

The default model; evaluations and checkpoints off (the rate excludes their pauses anyway). The
rate of a run is the median of its metrics.jsonl samples/s records after the first 30 steps.
Writes benchmarks/results/publish_cost.json.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml
from freshness_parts import RESULTS, log, rec

WARMUP = 30


def one(work: Path, k: int, url: str, steps: int, nproc: int) -> float:
    from rec.config import load_config

    data = yaml.safe_load(load_config(None).to_yaml())
    data["training"].update(steps=steps, eval_every=0, eval_batches=2, log_every=10)
    data["checkpoint"]["every_steps"] = 0
    data["publish"]["url"] = url  # "": no publishing; every other publish setting the default
    path = work / f"config{k}.yaml"
    path.write_text(yaml.safe_dump(data))
    run = work / f"run{k}"
    rec("train", "--config", str(path), "--run-dir", str(run), "--nproc", str(nproc))
    lines = (run / "metrics.jsonl").read_text().splitlines()
    rates = [r["samples_per_s"] for r in map(json.loads, lines)
             if r.get("kind") == "train" and r["step"] > WARMUP]  # fmt: skip
    return float(np.median(rates))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--nproc", type=int, default=2)
    args = parser.parse_args()
    from rec.broker import RedisBroker
    from rec.config import load_config
    from rec.cpu import cpu_info, describe

    work = Path(tempfile.mkdtemp(prefix="rec-pubcost-"))
    broker = RedisBroker(work / "redis")
    rates: dict[str, list[float]] = {"off": [], "on": []}
    loads = []
    try:
        for k in range(args.repeats):
            for mode in ("off", "on"):
                url = broker.url(f"rec:cost{k}") if mode == "on" else ""
                rates[mode].append(one(work, 2 * k + (mode == "on"), url, args.steps, args.nproc))
                loads.append(Path("/proc/loadavg").read_text().split()[0])
                log(f"repeat {k}, publish {mode}: {rates[mode][-1]:.0f} samples/s")
    finally:
        broker.stop()
    off, on = np.median(rates["off"]), np.median(rates["on"])
    p = load_config(None).publish
    out = {
        "benchmark": "publish_cost",
        "cpu": describe(cpu_info()),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "command": f"benchmarks/publish_cost.py --steps {args.steps} --repeats {args.repeats}",
        "publish": {"every_seconds": p.every_seconds, "every_steps": p.every_steps},
        "samples_per_s": rates,
        "loadavg_1min_after_each_run": loads,
        "on_over_off": round(float(on / off), 4),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / "publish_cost.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    log(json.dumps(out, indent=1))
    log(f"wrote {path}")


if __name__ == "__main__":
    main()
