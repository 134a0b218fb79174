"""Training throughput and memory: the Kaggle-size model next to the default, world size 1 vs 2,
TrainPipelineSparseDist vs the plain loop, one run.

Each configuration is a real `rec train` (elastic launcher, gloo, CPU, OMP_NUM_THREADS=1); the
rate is the median samples/s over its logged intervals after the first (warm-up), and the
memory each rank's peak RSS (VmHWM, rec/benchmarking.py's run_watched). The large model is
examples/criteo_kaggle.yaml (33.8M rows, 8.64 GB of fp32 tables) with its rows scaled by
--kaggle-scale. All eight configurations run back to back in one invocation so they share the
machine's conditions; compare them as ratios.

    .venv/bin/python benchmarks/train_throughput.py                       # about 10 minutes
    .venv/bin/python benchmarks/train_throughput.py --kaggle-scale 0.05   # a quick look

Writes benchmarks/results/train_throughput.json and prints Markdown tables.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

from rec.benchmarking import run_watched
from rec.cpu import cpu_info, describe

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "train_throughput.json"
REC = str(Path(sys.executable).parent / "rec")
KAGGLE = ROOT / "examples" / "criteo_kaggle.yaml"
CONFIGS = [(1, "sparse_dist"), (1, "base"), (2, "sparse_dist"), (2, "base")]


def log(msg: str) -> None:
    print(f"[train_throughput {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def model_config(model: str, kaggle_scale: float) -> dict:
    """'default': the embedded model (an empty config); 'kaggle': criteo_kaggle.yaml, scaled."""
    if model == "default":
        return {}
    cfg = yaml.safe_load(KAGGLE.read_text())
    for t in cfg["tables"]:
        t["rows"] = max(1, round(t["rows"] * kaggle_scale))
    return cfg


def measure(base_cfg: dict, nproc: int, pipeline: str, steps: int, batch_size: int) -> dict:
    cfg = dict(base_cfg)
    cfg["training"] = {
        **cfg.get("training", {}),
        "steps": steps, "batch_size": batch_size, "pipeline": pipeline,
        "eval_every": 0, "eval_batches": 1, "log_every": max(5, steps // 10),
    }  # fmt: skip
    # Exactly enough synthetic samples for every rank's steps, so no time goes to unused data.
    synthetic = {"train_samples": steps * batch_size * nproc, "eval_samples": batch_size * nproc}
    cfg["data"] = {**cfg.get("data", {}), "source": "synthetic", "synthetic": synthetic}
    cfg["checkpoint"] = {"every_steps": 0, "keep_last": 1}
    with tempfile.TemporaryDirectory(dir=ROOT / "runs") as tmp:
        path = Path(tmp) / "cfg.yaml"
        path.write_text(yaml.safe_dump(cfg))
        run = Path(tmp) / "run"
        argv = [REC, "train", "--config", str(path), "--run-dir", str(run), "--nproc", str(nproc)]
        wall, watch = run_watched(
            argv, Path(tmp) / "train.log", env={**os.environ, "OMP_NUM_THREADS": "1"}
        )
        lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    rates = [x["samples_per_s"] for x in lines if x["kind"] == "train"][1:]
    ranks = watch.ranks()
    return {
        "nproc": nproc,
        "pipeline": pipeline,
        "steps": steps,
        "samples_per_s": round(statistics.median(rates), 1),
        "wall_s": round(wall, 1),
        "rank_peak_rss_gb": [round(ranks[r] / 1e9, 3) for r in sorted(ranks)],
    }


def markdown(doc: dict) -> str:
    out = [
        f"**{doc['cpu']}, 2 cores, {doc['date']}**, batch {doc['batch_size_per_rank']} per rank, "
        f"Kaggle tables x {doc['kaggle_scale']}:",
        "",
        "| model | ranks | pipeline | steps | samples/s | vs 1 rank sparse_dist | "
        "peak RSS per rank GB | wall s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for model, rows in doc["models"].items():
        for r in rows:
            rss = " / ".join(f"{g:.2f}" for g in r["rank_peak_rss_gb"])
            out.append(
                f"| {model} | {r['nproc']} | `{r['pipeline']}` | {r['steps']} | "
                f"{r['samples_per_s']:,.0f} | {r['vs_1rank_sparse_dist']:.2f}x | {rss} | "
                f"{r['wall_s']} |"
            )
    if {"default", "kaggle"} <= doc["models"].keys():
        out += [
            "",
            "| ranks | pipeline | Kaggle / default samples/s | Kaggle / default peak RSS |",
            "|---|---|---|---|",
        ]
        for d, k in zip(doc["models"]["default"], doc["models"]["kaggle"], strict=True):
            rate = k["samples_per_s"] / d["samples_per_s"]
            rss = max(k["rank_peak_rss_gb"]) / max(d["rank_peak_rss_gb"])
            out.append(f"| {d['nproc']} | `{d['pipeline']}` | {rate:.2f}x | {rss:.1f}x |")
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="default,kaggle", help="comma-separated: default,kaggle")
    p.add_argument("--steps", type=int, default=300, help="steps of the default model")
    p.add_argument("--kaggle-steps", type=int, default=100, help="steps of the Kaggle model")
    p.add_argument("--batch-size", type=int, default=256, help="per rank")
    p.add_argument("--kaggle-scale", type=float, default=1.0, help="row factor of Kaggle's tables")
    p.add_argument("--report", action="store_true", help="print the tables of the last results")
    args = p.parse_args()
    if args.report:
        print(markdown(json.loads(RESULTS.read_text())))
        return
    (ROOT / "runs").mkdir(exist_ok=True)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = set(models) - {"default", "kaggle"}
    if unknown:
        p.error(f"--models: unknown {sorted(unknown)}; the models are default and kaggle")
    doc = {
        "cpu": describe(cpu_info()),
        "cpu_info": cpu_info(),
        "date": time.strftime("%Y-%m-%d"),
        "batch_size_per_rank": args.batch_size,
        "kaggle_scale": args.kaggle_scale,
        "models": {},
    }
    todo = len(models) * len(CONFIGS)
    t0 = time.perf_counter()
    for model in models:
        base = model_config(model, args.kaggle_scale)
        steps = args.steps if model == "default" else args.kaggle_steps
        rows = []
        for nproc, pipeline in CONFIGS:
            done = sum(len(v) for v in doc["models"].values()) + len(rows)
            left = (time.perf_counter() - t0) / done * (todo - done) if done else 0.0
            eta = f", ETA {left:.0f} s at the mean so far" if done else ""
            log(f"[{done + 1}/{todo}] {model}: {nproc} rank(s), {pipeline}, {steps} steps{eta}")
            rows.append(measure(base, nproc, pipeline, steps, args.batch_size))
            log(f"  {rows[-1]}")
        for r in rows:
            r["vs_1rank_sparse_dist"] = round(r["samples_per_s"] / rows[0]["samples_per_s"], 3)
        doc["models"][model] = rows
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(doc, indent=2) + "\n")
    print("\n" + markdown(doc))
    print(f"\nwritten: {RESULTS}")


if __name__ == "__main__":
    main()
