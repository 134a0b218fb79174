"""Training across real hosts: 1 host x 2 ranks against 2 hosts x 1 rank and 2 hosts x 2 ranks,
on the small default model and at Criteo Kaggle size, all in one run.

Every host is a network namespace (scripts/multihost.sh: a veth pair, gloo and the rendezvous on
the namespaces' own addresses), running the README's `torchrun ... -m rec.train.worker`. From
each run's metrics.jsonl and plan.json:

- step time: the profiled window's mean step (train.step_profile), the slowest rank, split into
  data, forward, backward, optimizer, communication and other; samples/s of the whole world;
- peak RSS per rank;
- bytes each rank's collectives send per step, measured from their tensor sizes, next to the
  plan's estimate of the same send buffers (plan_stats.send_buffers), and the plan's bytes that
  cross hosts.

The small model gets table_row_wise, grid_shard and row_wise tables so every collective runs;
Kaggle size keeps examples/criteo_kaggle.yaml's constraints. Both see the same samples per
rank per step. Needs root (network namespaces). The machine has 2 cores: 4 ranks share them,
so compare the topologies as ratios measured here, not as absolute speeds.

    sudo .venv/bin/python benchmarks/multihost_train.py            # default and Kaggle, ~10 min
    sudo .venv/bin/python benchmarks/multihost_train.py --sizes default

Writes benchmarks/results/multihost_train.json and prints the table of benchmarks/README.md.
Large runs belong here, never in CI.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "multihost_train.json"
SCRIPT = ROOT / "scripts" / "multihost.sh"
KAGGLE = ROOT / "examples" / "criteo_kaggle.yaml"
TOPOLOGIES = ((1, 2), (2, 1), (2, 2))  # hosts x ranks per host
COLLECTIVES = ("ids_all_to_all", "all_to_all", "reduce_scatter", "all_gather", "all_reduce")
PHASES = ("data", "forward", "backward", "optimizer", "communication", "other")


def log(msg: str) -> None:
    print(f"[multihost_train {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def size_config(size: str, steps: int, batch: int) -> dict:
    """One size's config, for at most 4 ranks x `steps` steps of `batch` samples."""
    if size == "default":
        cfg: dict = {"sharding": {"constraints": {
            "t1": {"sharding_types": ["table_row_wise"]},
            "t4": {"sharding_types": ["grid_shard"]},
            "t6": {"sharding_types": ["row_wise"]},
        }}}  # fmt: skip
    else:
        cfg = yaml.safe_load(KAGGLE.read_text())
    cfg.setdefault("data", {}).setdefault("synthetic", {})
    cfg["data"]["synthetic"].update({"train_samples": 4 * steps * batch, "eval_samples": 4096})
    cfg["training"] = {**cfg.get("training", {}), "steps": steps, "batch_size": batch,
                       "eval_every": 0, "eval_batches": 1, "log_every": 10,
                       "profile_steps": 10}  # fmt: skip
    cfg["checkpoint"] = {"every_steps": 0, "keep_last": 1}
    return cfg


def records(run: Path, kind: str) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("kind") == kind]


def measure(size: str, hosts: int, nproc: int, cfg: dict, work: Path) -> dict:
    config, run = work / f"{size}.yaml", work / f"{size}-{hosts}x{nproc}"
    config.write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "HOSTS": str(hosts), "NPROC": str(nproc), "PYTHON": sys.executable}
    t0 = time.perf_counter()
    proc = subprocess.run(["bash", str(SCRIPT), str(config), str(run)], env=env,
                          capture_output=True, text=True)  # fmt: skip
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"{size} {hosts}x{nproc} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    (split,) = records(run, "step_time")
    (memory,) = records(run, "memory")
    plan = json.loads((run / "plan.json").read_text())
    world = hosts * nproc
    slowest = max(range(world), key=lambda r: split["step_ms"][r])
    step_ms = split["step_ms"][slowest]
    result = {
        "hosts": hosts,
        "ranks_per_host": nproc,
        "wall_s": round(wall, 1),
        "step_ms": step_ms,
        "split_ms": {p: split[f"{p}_ms"][slowest] for p in PHASES},
        "samples_per_s": round(world * cfg["training"]["batch_size"] / step_ms * 1000, 1),
        "peak_rss_bytes": memory["peak_rss_bytes"],
        "sent_bytes": {c: split[f"{c}_bytes"] for c in COLLECTIVES},
        "plan_bytes": {c: split[f"plan_{c}_bytes"] for c in COLLECTIVES},
        "plan_cross_host_bytes": sum(h["sent_cross_host"] for h in plan["host_totals"]),
        "sharding": sorted({t["sharding_type"] for t in plan["tables"]}),
    }
    shutil.rmtree(run)  # a Kaggle-size checkpoint is 9 GB
    return result


def cpu() -> str:
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = next((line.split(":", 1)[1].strip() for line in out.splitlines()
                  if line.startswith("Model name")), platform.processor())  # fmt: skip
    flags = Path("/proc/cpuinfo").read_text()
    isa = "AMX" if "amx_tile" in flags else "AVX-512" if "avx512f" in flags else "AVX2"
    return f"{model}, {isa}, {os.cpu_count()} cores"


def _kib(n: float) -> str:
    return f"{n / 1024:,.1f}"


def table(results: list[dict]) -> str:
    head = ("| model | hosts x ranks | step ms (slowest rank) | comm ms | samples/s | vs 1x2 | "
            "peak RSS GiB (max rank) | a2a KiB measured / plan | ids a2a KiB measured / plan | "
            "RS + AG KiB measured / plan | cross-host KiB (plan) |")  # fmt: skip
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    base = {r["size"]: r for r in results if (r["hosts"], r["ranks_per_host"]) == (1, 2)}
    for r in results:
        s, p = r["sent_bytes"], r["plan_bytes"]
        worst = max(range(len(s["all_to_all"])), key=lambda i: s["all_to_all"][i])
        rsag = [s["reduce_scatter"][worst] + s["all_gather"][worst],
                p["reduce_scatter"][worst] + p["all_gather"][worst]]  # fmt: skip
        ratio = r["samples_per_s"] / base[r["size"]]["samples_per_s"] if r["size"] in base else 0
        lines.append(
            f"| {r['size']} | {r['hosts']} x {r['ranks_per_host']} | {r['step_ms']:.1f} | "
            f"{r['split_ms']['communication']:.1f} | {r['samples_per_s']:,.0f} | {ratio:.2f}x | "
            f"{max(r['peak_rss_bytes']) / 2**30:.2f} | "
            f"{_kib(s['all_to_all'][worst])} / {_kib(p['all_to_all'][worst])} | "
            f"{_kib(s['ids_all_to_all'][worst])} / {_kib(p['ids_all_to_all'][worst])} | "
            f"{_kib(rsag[0])} / {_kib(rsag[1])} | {_kib(r['plan_cross_host_bytes'])} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="default,kaggle", help="default and/or kaggle")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch-size", type=int, default=512)
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("multihost_train.py: needs root to create network namespaces (ip netns); "
                 "nothing was started")  # fmt: skip
    results = []
    with tempfile.TemporaryDirectory(dir=ROOT / "runs" if (ROOT / "runs").is_dir() else None) as t:
        for size in args.sizes.split(","):
            cfg = size_config(size, args.steps, args.batch_size)
            for hosts, nproc in TOPOLOGIES:
                log(f"{size}: {hosts} host(s) x {nproc} rank(s), {args.steps} steps")
                r = {"size": size, **measure(size, hosts, nproc, cfg, Path(t))}
                log(f"  step {r['step_ms']:.1f} ms, {r['samples_per_s']:,.0f} samples/s, "
                    f"wall {r['wall_s']} s")  # fmt: skip
                results.append(r)
    out = {
        "cpu": cpu(),
        "measured": time.strftime("%Y-%m-%d"),
        "command": "benchmarks/multihost_train.py " + " ".join(sys.argv[1:]),
        "steps": args.steps,
        "batch_size_per_rank": args.batch_size,
        "results": results,
    }
    RESULTS.write_text(json.dumps(out, indent=1) + "\n")
    print(f"\n{out['cpu']}, {out['measured']}\n\n{table(results)}\n\nwritten: {RESULTS}")


if __name__ == "__main__":
    main()
