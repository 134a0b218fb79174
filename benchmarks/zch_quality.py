"""ZCH against modulo at the same row budget: eval AUC and log loss, and how many ids modulo
makes collide (issue #50, item 6).

Two data sets, both the default config's eight tables and features on synthetic data with
`data.synthetic.live_ids` set for every table (each table's default rows: 500 to 5,000 live
ids, 19,500 in all), so that ids are large int64 values and `id % rows` collides as a hash
does:

  - churn: ids churn (`churn` 1.0: the whole live set is replaced once over the training
    stream) and their popularity drifts (`popularity_drift` 2.0); the eval samples come just
    after training (`eval_time: after`), so some eval ids were born after training;
  - criteo: the same tables with a fixed live set (no churn, no drift).

For each, every table gets rows = 0.5x, 1x, 2x and 4x its live ids, and one `rec train` runs
per (data set, budget, mode): `ids: modulo`, `ids: {zch: {}}` (the defaults: lfu,
admit_after 1, every_steps 25) and a labelled variant ZCH (`--variant`, default
`every_steps: 100`, the default until this benchmark showed that rounds that far apart keep
new ids on the default row too long under churn). Every run has the same data, the
same seeds and the same steps; all tables of a run use the same mode. The AUC and log loss are
the run's final evaluation (metrics.jsonl) on the whole eval split. The collision shares are
rec.data.churn's helpers on the same streams: the share of distinct ids (and of lookups) of the
training stream and of the eval stream whose row `id % rows` holds another id of that stream,
and over the live set at the start of training (`live_collisions`).

Each run: 2 ranks (elastic launcher, gloo, OMP_NUM_THREADS=1), batch 256 per rank, 600 steps
(307,200 samples, one epoch), 32,768 eval samples. About 40 s a run on a shared 2-core
machine, 24 runs: 14 minutes on the Xeon of the results.

    .venv/bin/python benchmarks/zch_quality.py            # the full comparison
    .venv/bin/python benchmarks/zch_quality.py --quick    # 2 budgets, 200 steps, no variant run
    .venv/bin/python benchmarks/zch_quality.py --report   # the table again from the results

Writes benchmarks/results/zch_quality.json (after every run; --quick: zch_quality_quick.json,
or --out) and the plot beside it (AUC against the budget, with matplotlib), and prints a
Markdown table. `--train-seed` changes training's seed only (the data stay the same): a
second seed shows how far two runs of one cell differ.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import yaml

from rec.benchmarking import train_records
from rec.config import RecConfig, config_from_dict, default_config
from rec.cpu import cpu_info, describe
from rec.data.churn import TableCollisions, live_collisions, modulo_collisions
from rec.data.synthetic import SyntheticSource

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "zch_quality.json"
NPROC = 2
BATCH = 256  # per rank
DATASETS = {
    "churn": {"churn": 1.0, "popularity_drift": 2.0, "eval_time": "after"},
    "criteo": {},
}


def log(msg: str) -> None:
    print(f"[zch_quality {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def live_ids() -> dict[str, int]:
    """Each default table's rows, as its live ids: the Criteo-shaped spread of cardinalities."""
    return {t.name: t.rows for t in default_config().tables}


def config(dataset: str, budget: float, ids, steps: int, eval_samples: int, seed: int = 0) -> dict:
    """The default config with rows = budget x live ids and `ids` on every table."""
    live = live_ids()
    cfg = yaml.safe_load(default_config().to_yaml())
    for t in cfg["tables"]:
        t["rows"] = max(2, round(live[t["name"]] * budget))
        t["ids"] = ids
    cfg["data"]["synthetic"].update(
        train_samples=steps * BATCH * NPROC, eval_samples=eval_samples, live_ids=live,
        **DATASETS[dataset],
    )  # fmt: skip
    # One final evaluation over the whole eval split, no checkpoints but the last.
    cfg["training"].update(steps=steps, batch_size=BATCH, eval_every=0, eval_batches=0, seed=seed,
                           log_every=max(50, steps // 4))  # fmt: skip
    cfg["checkpoint"] = {"every_steps": 0, "keep_last": 1}
    return cfg


def train(cfg: dict) -> dict:
    """One `rec train` on 2 ranks; its final eval and the ZCH tables' last statistics."""
    records, wall = train_records(cfg, NPROC, ROOT / "runs")
    final = [r for r in records if r["kind"] == "eval"][-1]
    zch = [r for r in records if r["kind"] == "zch"]
    out = {"auc": final["auc"], "log_loss": final["log_loss"], "wall_s": round(wall, 1)}
    if zch:
        last = zch[-1]
        live = sum(v for k, v in last.items() if k.endswith("_live"))
        slots = sum(v for k, v in last.items() if k.endswith("_slots"))
        out["zch_live"], out["zch_slots"] = live, slots
    return out


def _share(tables: list[TableCollisions], weights: list[float], attr: str) -> float:
    return float(np.dot([getattr(t, attr) for t in tables], weights) / max(sum(weights), 1))


def collisions(cfg: dict, streams: dict) -> dict:
    """Modulo's collision shares at this budget, over all tables (per table in "tables")."""
    rc = config_from_dict(cfg)
    out: dict = {}
    for split, rows in streams.items():
        per = modulo_collisions(rc, rows)
        lookups = _lookups_per_table(rc, rows)
        out[split] = {
            "ids": sum(t.ids for t in per),
            "colliding_ids": _share(per, [t.ids for t in per], "colliding"),
            "colliding_lookups": _share(per, lookups, "lookups_colliding"),
            "tables": {t.table: round(t.colliding, 4) for t in per},
        }
    live = live_collisions(rc, 0.0)
    out["live"] = {
        "ids": sum(t.ids for t in live),
        "colliding_ids": _share(live, [t.ids for t in live], "colliding"),
        "expected": _share(live, [t.ids for t in live], "expected"),
    }
    return out


def _lookups_per_table(rc: RecConfig, rows) -> list[float]:
    per_feature = np.asarray(rows.lengths).sum(axis=0)
    owner = rc.feature_to_table()
    return [
        float(sum(per_feature[f] for f, n in enumerate(rc.features.sparse) if owner[n] == t.name))
        for t in rc.tables
    ]


def streams(cfg: dict) -> dict:
    """The training and eval streams' rows (the same at every budget: live_ids is set for
    every table, so nothing in the samples depends on the rows)."""
    rc = config_from_dict(cfg)
    return {
        split: (src := SyntheticSource(rc, split)).take(0, src.num_samples()).rows
        for split in ("train", "eval")
    }


def markdown(doc: dict) -> str:
    tuned = doc.get("tuned")
    head = "| data | rows / live ids | collide: live set; train ids; lookups; eval ids | "
    head += "AUC modulo | AUC ZCH | ZCH - modulo | log loss modulo | log loss ZCH |"
    sep = "|---|---|---|---|---|---|---|---|"
    if tuned:
        head += " AUC ZCH variant | variant - modulo | log loss ZCH variant |"
        sep += "---|---|---|"
    title = f"**{doc['cpu']}, {doc['date']}**: {doc['steps']} steps, 2 ranks x batch {BATCH}, "
    title += f"{doc['eval_samples']:,} eval samples"
    if tuned:
        title += f"; ZCH variant: `ids: {{zch: {json.dumps(tuned)}}}`"
    out = [title, "", head, sep]
    for r in doc["results"]:
        c = r["collisions"]
        m, z = r["modulo"], r["zch"]
        line = (
            f"| {r['dataset']} | {r['budget']}x | {c['live']['colliding_ids']:.1%}; "
            f"{c['train']['colliding_ids']:.1%}; {c['train']['colliding_lookups']:.1%}; "
            f"{c['eval']['colliding_ids']:.1%} | "
            f"{m['auc']:.4f} | {z['auc']:.4f} | {z['auc'] - m['auc']:+.4f} | "
            f"{m['log_loss']:.4f} | {z['log_loss']:.4f} |"
        )
        if tuned and "zch_tuned" in r:
            t = r["zch_tuned"]
            line += f" {t['auc']:.4f} | {t['auc'] - m['auc']:+.4f} | {t['log_loss']:.4f} |"
        out.append(line)
    return "\n".join(out)


def plot(doc: dict, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("no matplotlib: no plot")
        return
    sets = list(dict.fromkeys(r["dataset"] for r in doc["results"]))
    fig, axes = plt.subplots(1, len(sets), figsize=(5 * len(sets), 3.8), squeeze=False)
    for ax, name in zip(axes[0], sets, strict=True):
        rows = [r for r in doc["results"] if r["dataset"] == name]
        x = [r["budget"] for r in rows]
        for mode, style in (("modulo", "o-"), ("zch", "s-"), ("zch_tuned", "^--")):
            if all(mode in r for r in rows):
                ax.plot(
                    x,
                    [r[mode]["auc"] for r in rows],
                    style,
                    label=mode.replace("_tuned", " variant"),
                )
        ax.set_xscale("log", base=2)
        ax.set_xticks(x, [f"{b}x" for b in x])
        ax.set_xlabel("rows / live ids")
        ax.set_ylabel("eval AUC")
        ax.set_title(name)
        ax.legend()
    fig.suptitle(f"ZCH vs modulo, {doc['steps']} steps ({doc['cpu']})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    log(f"plot: {path}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--quick", action="store_true", help="budgets 0.5x and 2x, 200 steps, no variant"
    )
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--eval-samples", type=int, default=32_768)
    p.add_argument("--budgets", default="0.5,1,2,4", help="rows / live ids, comma-separated")
    p.add_argument("--datasets", default="churn,criteo")
    p.add_argument("--variant", default='{"every_steps": 100}',
                   help="JSON ids.zch settings of a labelled extra run ('' for none)")  # fmt: skip
    p.add_argument("--train-seed", type=int, default=0, help="training.seed (the data's is 0)")
    p.add_argument("--out", default="", help="results JSON (default: results/zch_quality.json;"
                   " --quick: zch_quality_quick.json); the plot beside it")  # fmt: skip
    p.add_argument("--report", action="store_true", help="print the table of the last results")
    args = p.parse_args()
    if args.report:
        print(markdown(json.loads(Path(args.out or RESULTS).read_text())))
        return
    if args.quick:
        args.steps, args.budgets, args.variant = 200, "0.5,2", ""
        args.out = args.out or str(RESULTS.with_name("zch_quality_quick.json"))
    out = Path(args.out) if args.out else RESULTS
    budgets = [float(b) for b in args.budgets.split(",")]
    datasets = [d for d in args.datasets.split(",") if d]
    unknown = set(datasets) - DATASETS.keys()
    if unknown:
        p.error(f"--datasets: unknown {sorted(unknown)}; the data sets are {sorted(DATASETS)}")
    tuned = json.loads(args.variant) if args.variant else None
    modes = {"modulo": "modulo", "zch": {"zch": {}}}
    if tuned:
        modes["zch_tuned"] = {"zch": tuned}
    (ROOT / "runs").mkdir(exist_ok=True)
    doc = {
        "cpu": describe(cpu_info()), "cpu_info": cpu_info(), "date": time.strftime("%Y-%m-%d"),
        "steps": args.steps, "train_seed": args.train_seed, "nproc": NPROC,
        "batch_size_per_rank": BATCH,
        "eval_samples": args.eval_samples, "live_ids": live_ids(), "datasets": DATASETS,
        "tuned": tuned, "results": [],
    }  # fmt: skip
    todo, done, t0 = len(datasets) * len(budgets) * len(modes), 0, time.perf_counter()
    for dataset in datasets:
        data = streams(config(dataset, 1.0, "modulo", args.steps, args.eval_samples))
        for budget in budgets:
            row = {"dataset": dataset, "budget": budget}
            cfg = config(dataset, budget, "modulo", args.steps, args.eval_samples)
            row["collisions"] = collisions(cfg, data)
            share = row["collisions"]["train"]["colliding_ids"]
            log(f"{dataset} {budget}x: modulo collides {share:.1%} of the training stream's ids")
            for mode, ids in modes.items():
                eta = (time.perf_counter() - t0) / done * (todo - done) if done else 0
                log(f"[{done + 1}/{todo}] {dataset} {budget}x {mode}"
                    + (f", ETA {eta:.0f} s" if done else ""))  # fmt: skip
                cfg = config(dataset, budget, ids, args.steps, args.eval_samples, args.train_seed)
                row[mode] = train(cfg)
                done += 1
                log(f"  {row[mode]}")
            doc["results"].append(row)
            out.write_text(json.dumps(doc, indent=2) + "\n")
    print("\n" + markdown(doc))
    plot(doc, out.with_suffix(".png"))
    print(f"\nwritten: {out}")


if __name__ == "__main__":
    main()
