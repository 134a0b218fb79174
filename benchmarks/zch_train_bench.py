"""ZCH training against modulo at the same rows: the run's mean step and each rank's peak RSS,
on the default model and the Kaggle-size one (issue #50 item 7's training part), one run.

    .venv/bin/python benchmarks/zch_train_bench.py                       # ~15 minutes
    .venv/bin/python benchmarks/zch_train_bench.py --models default      # ~2 minutes
    .venv/bin/python benchmarks/zch_train_bench.py --kaggle-scale 0.01   # a quick look
    .venv/bin/python benchmarks/zch_train_bench.py --report              # the table again

Each run is a real `rec train` (2 ranks, gloo, `OMP_NUM_THREADS=1`, batch 256 per rank, the
model's own `training.pipeline` (the default model's `sparse_dist`, the Kaggle example's `base`;
`--pipeline` sets one for both), no evaluation, checkpoints only the last): every table `ids:
modulo`, or every table `ids: {zch: {}}` (slots = rows - 1, the last row the default: the same
rows; probes min(16, slots), since a table of 3 rows has 2 slots). Both read the same synthetic
ids, `data.synthetic.live_ids` = each table's rows of large int64 ids, as a hashed id space
does. The Kaggle model is examples/criteo_kaggle.yaml (33.8M rows, dim 64) without its
`data_parallel` constraints (a ZCH table's rows must live in the embedding kernel), in both
modes, so the two share one plan.

Measured per run: the run's mean step from metrics.jsonl (`measured_step_ms`: every step and
every admission round, evaluation and checkpoints left out), each rank's peak RSS (VmHWM,
polled by rec.benchmarking.run_watched), the wall time and the load average before and after.
The runs alternate modulo/ZCH in pairs, the second pair in the other order, so that the
shared machine's drift hits both alike; the ratio is ZCH's median over modulo's, and each
pair's own ratio is kept. Memory per slot in training: ZCH's peak RSS over modulo's, per rank,
over the run's slots (every rank holds every map).

Writes benchmarks/results/zch_train.json (after every run) and prints a Markdown table.
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
RESULTS = ROOT / "benchmarks" / "results" / "zch_train.json"
REC = str(Path(sys.executable).parent / "rec")
KAGGLE = ROOT / "examples" / "criteo_kaggle.yaml"
DEFAULT_PROBES = 16


def log(msg: str) -> None:
    print(f"[zch_train_bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def load() -> float:
    return round(os.getloadavg()[0], 2)


def base_config(model: str, kaggle_scale: float) -> dict:
    """The model's config as a dict, every table with its rows written out."""
    if model == "default":
        from rec.config import default_config

        cfg = default_config().to_dict()
        return {"tables": cfg["tables"]}
    cfg = yaml.safe_load(KAGGLE.read_text())
    for t in cfg["tables"]:
        t["rows"] = max(2, round(t["rows"] * kaggle_scale))
    constraints = cfg.get("sharding", {}).get("constraints", {})
    cfg["sharding"]["constraints"] = {  # a ZCH table is never data_parallel; so neither here
        k: v for k, v in constraints.items() if "data_parallel" not in v["sharding_types"]
    }
    return cfg


def run_config(base: dict, ids: str, steps: int, batch: int, nproc: int,
               pipeline: str | None = None) -> dict:  # fmt: skip
    cfg = json.loads(json.dumps(base))
    for t in cfg["tables"]:
        t.pop("ids", None)
        if ids == "zch":
            t["ids"] = {"zch": {"probes": min(DEFAULT_PROBES, t["rows"] - 1)}}
    cfg["training"] = {
        **cfg.get("training", {}),
        "steps": steps, "batch_size": batch,
        "eval_every": 0, "eval_batches": 1, "log_every": max(5, steps // 10),
    }  # fmt: skip
    if pipeline:
        cfg["training"]["pipeline"] = pipeline
    synthetic = {
        "train_samples": steps * batch * nproc,
        "eval_samples": batch * nproc,
        "live_ids": {t["name"]: t["rows"] for t in cfg["tables"]},
    }
    cfg["data"] = {"source": "synthetic", "synthetic": synthetic}
    cfg["checkpoint"] = {"every_steps": 0, "keep_last": 1}
    return cfg


def measure(cfg: dict, nproc: int, tmp_root: Path) -> dict:
    with tempfile.TemporaryDirectory(dir=tmp_root) as tmp:
        path = Path(tmp) / "cfg.yaml"
        path.write_text(yaml.safe_dump(cfg))
        run = Path(tmp) / "run"
        argv = [REC, "train", "--config", str(path), "--run-dir", str(run), "--nproc", str(nproc)]
        before = load()
        wall, watch = run_watched(
            argv, Path(tmp) / "train.log", env={**os.environ, "OMP_NUM_THREADS": "1"}
        )
        after = load()
        records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    memory = next(r for r in reversed(records) if r["kind"] == "memory")
    if memory["step"] != cfg["training"]["steps"]:  # a run that stops early is not a sample
        raise RuntimeError(f"the run ended at step {memory['step']} of {cfg['training']['steps']}")
    zch = [r for r in records if r["kind"] == "zch"]
    ranks = watch.ranks()
    return {
        "mean_step_ms": round(memory["measured_step_ms"], 2),
        "rank_peak_rss_gb": [round(ranks[r] / 1e9, 3) for r in sorted(ranks)],
        "rank_peak_rss_gb_self": [round(b / 1e9, 3) for b in memory["peak_rss_bytes"]],
        "wall_s": round(wall, 1),
        "load_before": before,
        "load_after": after,
        "live_ids": sum(v for k, v in zch[-1].items() if k.endswith("_live")) if zch else None,
    }


def summarize(entry: dict) -> None:
    """Medians, ZCH / modulo, the pairs' own ratios and the memory per slot, into `entry`."""
    runs = entry["runs"]
    mod = [r for r in runs if r["ids"] == "modulo"]
    zch = [r for r in runs if r["ids"] == "zch"]
    if not mod or not zch:
        return
    med = lambda rs, k: statistics.median(r[k] for r in rs)  # noqa: E731
    entry["modulo_step_ms"] = round(med(mod, "mean_step_ms"), 2)
    entry["zch_step_ms"] = round(med(zch, "mean_step_ms"), 2)
    entry["ratio"] = round(entry["zch_step_ms"] / entry["modulo_step_ms"], 3)
    pairs = {}
    for r in runs:
        pairs.setdefault(r["pair"], {})[r["ids"]] = r["mean_step_ms"]
    entry["pair_ratios"] = [round(p["zch"] / p["modulo"], 3) for p in pairs.values() if len(p) == 2]
    peak = lambda rs: [statistics.median(r["rank_peak_rss_gb"][i] for r in rs)  # noqa: E731
                       for i in range(len(rs[0]["rank_peak_rss_gb"]))]  # fmt: skip
    entry["modulo_rank_peak_rss_gb"] = [round(x, 3) for x in peak(mod)]
    entry["zch_rank_peak_rss_gb"] = [round(x, 3) for x in peak(zch)]
    entry["train_bytes_per_slot_measured"] = [
        round((z - m) * 1e9 / entry["slots"], 1)
        for z, m in zip(
            entry["zch_rank_peak_rss_gb"], entry["modulo_rank_peak_rss_gb"], strict=True
        )
    ]
    entry["loads"] = [x for r in runs for x in (r["load_before"], r["load_after"])]


def markdown(doc: dict) -> str:
    out = [
        f"**{doc['cpu']}, 2 cores, {doc['date']}**, 2 ranks, batch {doc['batch_size_per_rank']} "
        "per rank, `OMP_NUM_THREADS=1`:",
        "",
        "| model | slots | steps | runs | mean step modulo | mean step ZCH | ZCH / modulo "
        "| pairs' ratios | peak RSS per rank modulo GB | peak RSS per rank ZCH GB "
        "| training bytes per slot (measured) | load average |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for model, e in doc["models"].items():
        if "ratio" not in e:
            continue
        gb = lambda xs: " / ".join(f"{x:.2f}" for x in xs)  # noqa: E731
        per_slot = " / ".join(f"{x:.0f}" for x in e["train_bytes_per_slot_measured"])
        out.append(
            f"| {model} | {e['slots']:,} | {e['steps']} | {len(e['runs'])} "
            f"| {e['modulo_step_ms']:.1f} ms | {e['zch_step_ms']:.1f} ms | **{e['ratio']:.2f}x** "
            f"| {', '.join(f'{x:.2f}' for x in e['pair_ratios'])} "
            f"| {gb(e['modulo_rank_peak_rss_gb'])} | {gb(e['zch_rank_peak_rss_gb'])} "
            f"| {per_slot} | {min(e['loads']):.1f}-{max(e['loads']):.1f} |"
        )
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="default,kaggle", help="comma-separated: default,kaggle")
    p.add_argument("--pairs", type=int, default=3, help="modulo/ZCH pairs of the default model")
    p.add_argument("--kaggle-pairs", type=int, default=2, help="pairs of the Kaggle model")
    p.add_argument("--steps", type=int, default=300, help="steps of the default model")
    p.add_argument("--kaggle-steps", type=int, default=150, help="steps of the Kaggle model")
    p.add_argument("--batch-size", type=int, default=256, help="per rank")
    p.add_argument(
        "--pipeline",
        choices=("sparse_dist", "base"),
        default=None,
        help="training.pipeline of both models (default: each model's own)",
    )
    p.add_argument("--kaggle-scale", type=float, default=1.0, help="row factor of Kaggle's tables")
    p.add_argument("--out", default=str(RESULTS), help="results JSON")
    p.add_argument("--report", action="store_true", help="print the table of the last results")
    args = p.parse_args()
    out = Path(args.out)
    if args.report:
        print(markdown(json.loads(out.read_text())))
        return
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = set(models) - {"default", "kaggle"}
    if unknown:
        p.error(f"--models: unknown {sorted(unknown)}; the models are default and kaggle")
    (ROOT / "runs").mkdir(exist_ok=True)
    nproc = 2
    doc = {
        "cpu": describe(cpu_info()),
        "cpu_info": cpu_info(),
        "date": time.strftime("%Y-%m-%d"),
        "batch_size_per_rank": args.batch_size,
        "kaggle_scale": args.kaggle_scale,
        "load_start": load(),
        "models": {},
    }
    for model in models:
        base = base_config(model, args.kaggle_scale)
        steps = args.steps if model == "default" else args.kaggle_steps
        pairs = args.pairs if model == "default" else args.kaggle_pairs
        entry = doc["models"][model] = {
            "steps": steps,
            "slots": sum(t["rows"] - 1 for t in base["tables"]),
            "rows": sum(t["rows"] for t in base["tables"]),
            "runs": [],
        }
        for pair in range(pairs):
            order = ("modulo", "zch") if pair % 2 == 0 else ("zch", "modulo")
            for ids in order:
                log(f"{model} pair {pair + 1}/{pairs}: {ids}, {steps} steps, load {load()}")
                cfg = run_config(base, ids, steps, args.batch_size, nproc, args.pipeline)
                r = measure(cfg, nproc, ROOT / "runs")
                r.update(ids=ids, pair=pair)
                entry["runs"].append(r)
                log(
                    f"  mean step {r['mean_step_ms']} ms, peak RSS {r['rank_peak_rss_gb']} GB, "
                    f"wall {r['wall_s']} s, load {r['load_before']} -> {r['load_after']}"
                )
                summarize(entry)
                out.write_text(json.dumps(doc, indent=1) + "\n")
    doc["load_end"] = load()
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(markdown(doc))


if __name__ == "__main__":
    main()
