"""ZCH against modulo on ids shaped like a real log's: consecutive integers (issue #59 item 2).

benchmarks/zch_quality.py draws random 64-bit ids, which `id % rows` collides as a hash does.
A real log numbers its users and items 1, 2, 3, ... in the order they signed up or were listed,
and modulo over rows >= the largest id collides nothing. This benchmark generates such a log,
writes it as the Parquet files a user would have, and trains on them with `rec train`:

  - users 1..U and items 1..I, numbered by birth; 40 % exist when the log starts, the others
    are born evenly over the training period and the evaluation period after it, so an id's
    first sighting is spread over the run and the evaluation meets ids training never saw;
  - Zipf popularity (a user's activity, alpha 0.8; an item's appeal, alpha 0.9, fading with
    the item's age over a third of the training period), over the ids born so far;
  - time order: event t is at time t; the training file holds the first `steps x 512` events,
    the evaluation file the next 65,536 (the period after training, data.eval_paths);
  - a click with probability sigmoid(bias + 1.1 x (a_user + b_item + <p_user, q_item>) + a weak
    hour-of-day term): per-id parameters, so what a model learns about an id is in its rows.

Each cell is `rec train` on the same files (2 ranks, gloo, OMP_NUM_THREADS=1, batch 256 per
rank, one epoch, final evaluation over the whole evaluation file), once per training seed (0
and 1; the cell shows their mean): both tables `ids: modulo`, then both `ids: {zch: {}}` (the
defaults), at rows = 0.25x, 0.5x, 1x, 2x and 4x each table's distinct ids in the training file
(what `rec plan` counts). The model is DCN-v2: with DLRM, whose only view of a user and an item
is their one dot product, two training seeds moved a cell's AUC by up to 0.008, more than the
differences measured; DCN-v2's by 0.0004. "colliding" is the share of the training file's
distinct ids whose row `id % rows` holds another of them; "held" is ZCH's live ids at the end
over min(distinct ids, slots).

    .venv/bin/python benchmarks/zch_quality_real.py           # 20 runs, about 9 minutes
    .venv/bin/python benchmarks/zch_quality_real.py --quick   # 0.5x and 2x, 300 steps
    .venv/bin/python benchmarks/zch_quality_real.py --report  # the table again from the JSON

Writes benchmarks/results/zch_quality_real.json (after every run; --quick:
zch_quality_real_quick.json, or --out) and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from rec.benchmarking import train_records
from rec.cpu import cpu_info, describe
from rec.data.churn import colliding_share

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "zch_quality_real.json"
NPROC = 2
BATCH = 256  # per rank
BLOCK = 4096  # events drawn from one snapshot of who is born and how popular


def log(msg: str) -> None:
    print(f"[zch_quality_real {time.strftime('%H:%M:%S')}] {msg}", flush=True)


@dataclass(frozen=True)
class LogShape:
    """The generated log: who exists when, how popular, and what makes a click."""

    users: int = 12_000
    items: int = 4_000
    train_events: int = 600 * NPROC * BATCH
    eval_events: int = 65_536
    born_at_start: float = 0.4
    """Share of the ids that exist when the log starts; the rest are born evenly over it."""
    user_alpha: float = 0.8
    item_alpha: float = 0.9
    item_fade: float = 1 / 3
    """An item's appeal halves every item_fade x train_events events after its birth."""
    latent: int = 8
    signal: float = 1.1
    ctr: float = 0.25
    seed: int = 0


class Population:
    """One kind of id (users or items): ids 1..n in birth order, each with a Zipf weight."""

    def __init__(self, rng: np.random.Generator, n: int, alpha: float, shape: LogShape) -> None:
        span = shape.train_events + shape.eval_events
        start = round(n * shape.born_at_start)
        self.birth = np.concatenate([np.zeros(start), np.sort(rng.uniform(0, span, n - start))])
        # popularity does not follow the id: a random rank per id
        self.weight = (rng.permutation(n) + 1.0) ** -alpha
        self.bias = rng.standard_normal(n)
        self.vec = rng.standard_normal((n, shape.latent)) / math.sqrt(shape.latent)

    def draw(self, rng: np.random.Generator, at: float, k: int, half_life: float) -> np.ndarray:
        """k ids (0-based) among those born by time `at`, by weight (faded by age)."""
        born = int(np.searchsorted(self.birth, at, side="right"))
        w = self.weight[:born]
        if math.isfinite(half_life):
            w = w * np.exp2(-(at - self.birth[:born]) / half_life)
        cum = np.cumsum(w)
        return np.minimum(np.searchsorted(cum, rng.random(k) * cum[-1]), born - 1)


def generate(shape: LogShape) -> dict[str, np.ndarray]:
    """The whole log, time-ordered: user, item (1-based ids), hour, label; events
    [0, train_events) are the training period, the rest the evaluation period."""
    rng = np.random.default_rng(shape.seed)
    users = Population(rng, shape.users, shape.user_alpha, shape)
    items = Population(rng, shape.items, shape.item_alpha, shape)
    total = shape.train_events + shape.eval_events
    u, i = np.empty(total, np.int64), np.empty(total, np.int64)
    for lo in range(0, total, BLOCK):
        hi = min(lo + BLOCK, total)
        at = (lo + hi) / 2
        u[lo:hi] = users.draw(rng, at, hi - lo, math.inf)
        i[lo:hi] = items.draw(rng, at, hi - lo, shape.item_fade * shape.train_events)
    hour = (np.arange(total) / total * 24 * 14) % 24  # two weeks, a day every 1/14 of the log
    z = users.bias[u] + items.bias[i] + (users.vec[u] * items.vec[i]).sum(1) * 2.0
    z = z / z.std() * shape.signal + 0.3 * np.sin(hour / 24 * 2 * math.pi)
    bias = _bias_for_ctr(z, shape.ctr)
    label = (rng.random(total) < 1 / (1 + np.exp(-(z + bias)))).astype(np.float32)
    return {"user": u + 1, "item": i + 1, "hour": hour.astype(np.float32), "label": label,
            "prob": 1 / (1 + np.exp(-(z + bias)))}  # fmt: skip


def _bias_for_ctr(z: np.ndarray, ctr: float) -> float:
    lo, hi = -20.0, 20.0
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if np.mean(1 / (1 + np.exp(-(z + mid)))) < ctr else (lo, mid)
    return (lo + hi) / 2


def write_files(data: dict[str, np.ndarray], shape: LogShape, folder: Path) -> dict:
    """train.parquet and eval.parquet as a user would have them; what the log holds."""
    cut = shape.train_events
    for name, part in (("train", slice(0, cut)), ("eval", slice(cut, None))):
        table = pa.table({k: data[k][part] for k in ("label", "hour", "user", "item")})
        pq.write_table(table, folder / f"{name}.parquet")
    facts: dict = {}
    share = lambda mask: round(float(np.mean(mask)), 4)  # noqa: E731
    for col in ("user", "item"):
        train, evals = np.unique(data[col][:cut]), np.unique(data[col][cut:])
        facts[col] = {
            "distinct_train": int(train.size), "largest_train": int(train.max()),
            "distinct_eval": int(evals.size),
            "eval_ids_new": share(np.isin(evals, train, invert=True)),
            "eval_events_new": share(np.isin(data[col][cut:], train, invert=True)),
            "train_ids_seen_once": share(np.bincount(data[col][:cut])[train] == 1),
        }  # fmt: skip
    facts["bayes_auc_eval"] = round(_auc(data["label"][cut:], data["prob"][cut:]), 4)
    facts["ctr_train"] = round(float(data["label"][:cut].mean()), 4)
    return facts


def _auc(labels: np.ndarray, scores: np.ndarray) -> float:
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(labels, scores))


def config(folder: Path, rows: dict[str, int], ids, steps: int, seed: int = 0,
           arch: str = "dcn_v2") -> dict:  # fmt: skip
    """Two tables (user, item) on the Parquet files, a small DLRM, one final evaluation."""
    return {
        "tables": [
            {"name": t, "rows": rows[t], "dim": 16, "features": [t], "ids": ids}
            for t in ("user", "item")
        ],  # fmt: skip
        "features": {"dense": 1, "dense_names": ["hour"], "sparse": ["user", "item"]},
        "model": {"arch": arch},
        "data": {
            "source": "parquet",
            "train_paths": [str(folder / "train.parquet")],
            "eval_paths": [str(folder / "eval.parquet")],
            "columns": {"label": "label", "dense": ["hour"]},
        },
        "training": {
            "steps": steps,
            "batch_size": BATCH,
            "eval_every": 0,
            "eval_batches": 0,
            "seed": seed,
            "log_every": max(50, steps // 4),
        },  # fmt: skip
        "checkpoint": {"every_steps": 0, "keep_last": 1},
    }


def train(cfg: dict) -> dict:
    """One `rec train` on 2 ranks; its final eval and the ZCH tables' last statistics."""
    records, wall = train_records(cfg, NPROC, ROOT / "runs")
    final = [r for r in records if r["kind"] == "eval"][-1]
    out = {"auc": final["auc"], "log_loss": final["log_loss"], "wall_s": round(wall, 1)}
    zch = [r for r in records if r["kind"] == "zch"]
    if zch:
        totals: dict[str, int] = {}
        for r in zch:  # the lines' counters restart after each line
            for k, v in r.items():
                if k.endswith(("_admitted", "_evicted", "_default_reads")):
                    totals[k] = totals.get(k, 0) + v
        out["zch"] = {**{k: v for k, v in zch[-1].items() if k.endswith(("_live", "_slots"))},
                      **totals}  # fmt: skip
    return out


def markdown(doc: dict) -> str:
    facts = doc["log"]
    title = (f"**{doc['cpu']}, {doc['date']}**: {doc['steps']} steps, 2 ranks x batch {BATCH}, "
             f"{doc['shape']['eval_events']:,} eval events; users "
             f"{facts['user']['distinct_train']:,}"
             f" and items {facts['item']['distinct_train']:,} distinct in training; "
             f"Bayes AUC {facts['bayes_auc_eval']}")  # fmt: skip
    out = [title, "",
           "| rows / distinct ids | colliding: users; items | AUC modulo | AUC ZCH | ZCH - modulo |"
           " per seed | log loss modulo | log loss ZCH | held: users; items | evicted |",
           "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in doc["results"]:
        m, z = r["modulo"], r["zch"]
        held = "; ".join(f"{r['held'][t]:.1%}" for t in ("user", "item")) if "held" in r else "-"
        ev = sum(z["zch"].get(f"{t}_evicted", 0) for t in ("user", "item"))
        per_seed = ", ".join(f"{a['auc'] - b['auc']:+.4f}"
                             for a, b in zip(z["runs"], m["runs"], strict=True))  # fmt: skip
        out.append(
            f"| {r['budget']}x | {r['colliding']['user']:.1%}; {r['colliding']['item']:.1%} | "
            f"{m['auc']:.4f} | {z['auc']:.4f} | {z['auc'] - m['auc']:+.4f} | {per_seed} | "
            f"{m['log_loss']:.4f} | {z['log_loss']:.4f} | {held} | {ev:,} |"
        )
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="budgets 0.5x and 2x, 300 steps")
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--budgets", default="0.25,0.5,1,2,4", help="rows / distinct ids")
    p.add_argument("--arch", default="dcn_v2", help="model.arch")
    p.add_argument("--zch", default="{}", help="JSON ids.zch settings of the ZCH runs")
    p.add_argument("--seeds", default="0,1", help="training.seed of each cell's runs (the log's"
                   " is 0); a cell's AUC and log loss are their means")  # fmt: skip
    p.add_argument("--out", default="", help="results JSON (default: results/zch_quality_real"
                   ".json; --quick: zch_quality_real_quick.json)")  # fmt: skip
    p.add_argument("--report", action="store_true", help="print the table of the last results")
    args = p.parse_args()
    if args.report:
        print(markdown(json.loads(Path(args.out or RESULTS).read_text())))
        return
    if args.quick:
        args.steps, args.budgets = 300, "0.5,2"
        args.out = args.out or str(RESULTS.with_name("zch_quality_real_quick.json"))
    out = Path(args.out) if args.out else RESULTS
    budgets = [float(b) for b in args.budgets.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    shape = LogShape(train_events=args.steps * NPROC * BATCH)
    (ROOT / "runs").mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=ROOT / "runs") as tmp:
        folder = Path(tmp)
        data = generate(shape)
        facts = write_files(data, shape, folder)
        log(f"log: {json.dumps(facts)}")
        doc = {
            "cpu": describe(cpu_info()), "cpu_info": cpu_info(), "date": time.strftime("%Y-%m-%d"),
            "steps": args.steps, "train_seeds": seeds, "nproc": NPROC,
            "batch_size_per_rank": BATCH, "arch": args.arch, "zch": json.loads(args.zch),
            "shape": asdict(shape), "log": facts, "results": [],
        }  # fmt: skip
        train_ids = {t: np.unique(data[t][: shape.train_events]) for t in ("user", "item")}
        modes = {"modulo": "modulo", "zch": {"zch": json.loads(args.zch)}}
        todo, done, t0 = len(budgets) * len(modes) * len(seeds), 0, time.perf_counter()
        for budget in budgets:
            rows = {t: max(2, round(facts[t]["distinct_train"] * budget)) for t in train_ids}
            row: dict = {"budget": budget, "rows": rows,
                         "colliding": {t: colliding_share(ids, rows[t])
                                       for t, ids in train_ids.items()}}  # fmt: skip
            for mode, ids in modes.items():
                runs = []
                for seed in seeds:
                    eta = (time.perf_counter() - t0) / done * (todo - done) if done else 0
                    log(f"[{done + 1}/{todo}] {budget}x {mode} seed {seed}"
                        + (f", ETA {eta:.0f} s" * bool(done)))  # fmt: skip
                    runs.append(train(config(folder, rows, ids, args.steps, seed, args.arch)))
                    done += 1
                    log(f"  {runs[-1]}")
                row[mode] = {k: float(np.mean([r[k] for r in runs])) for k in ("auc", "log_loss")}
                row[mode].update(zch=runs[0].get("zch", {}), runs=runs)
            z = row["zch"]["zch"]
            row["held"] = {t: z[f"{t}_live"] / min(facts[t]["distinct_train"], z[f"{t}_slots"])
                           for t in train_ids if f"{t}_live" in z}  # fmt: skip
            doc["results"].append(row)
            out.write_text(json.dumps(doc, indent=2) + "\n")
    print("\n" + markdown(doc))
    print(f"\nwritten: {out}")


if __name__ == "__main__":
    main()
