"""One user, many candidates (#61): the context form against the flat form on rec-server, one run.

    .venv/bin/python benchmarks/context_bench.py                      # both models, ~15 min
    .venv/bin/python benchmarks/context_bench.py --models default     # the default model only
    .venv/bin/python benchmarks/context_bench.py --rounds 2           # closed loops twice, ~22 min
    .venv/bin/python benchmarks/context_bench.py --quick              # smoke: default, N=16
    .venv/bin/python benchmarks/context_bench.py --report [--label L] # the table again

Each model (the default config, and examples/criteo_kaggle.yaml with its tables scaled by
--kaggle-scale) is trained once and that run exported twice: plain, and with features.context
(`rec export -c`). The context features follow one rule: the sparse features the synthetic data
makes multi-hot (rec/data/synthetic.py's seeded `multi_hot` mask: several ids, a user's
history) are the user's, the one-hot ones (one id per attribute) the item's, and every dense
feature is the user's, so the bottom MLP runs once per request. The mask is drawn at random with
respect to table size, so the context tables are not chosen for being small. It gives the
default model 4 of its 8 sparse features and the Kaggle-size model 13 of 26 (the JSON has the
context tables' share of rows).

For N in --candidates, three rows, each with the same pairs (one user's context and N random
candidates; rec-bench builds them from the context export, so the plain model gets the flat
form of the very pairs the context form sends):
  - flat_plain: the flat form (the context repeated in every row) on the plain export;
  - flat_ctxmodel: the flat form on the context export (the server splits each row);
  - context: the context form (the context once, batch 1) on the context export.
Per row:
  - request bytes: the body tritonclient sends (rec.serve.client.request_bytes) over HTTP JSON,
    HTTP binary and gRPC, for a request shaped like the training data (multi-hot
    features 1..max_hotness ids, one-hot ones 1);
  - pairs/s at saturation: the best of rec-bench gRPC closed loops at --concurrency;
  - server CPU per pair: rec-server's utime + stime (/proc/<pid>/stat) over that best run,
    divided by the pairs it scored there (its nv_inference_count, which counts pairs);
  - p99 in an open loop (Poisson arrivals) at the same pair rate for all three rows:
    --open-load x flat_plain's saturation pairs/s, i.e. that / N requests per second.
Both exports are served at once by rec-server with its defaults (an idle one sleeps after its
--busy-poll-us), and the three rows take turns at every point, so a slow spell of this shared
machine falls on all of them. Ratios context / flat_plain are computed in the run; targets
(#61) at N = 128: pairs/s >= 1.5x, request bytes <= 1/3. rec-bench's requests draw 0..3 ids
for every bag (it takes no hotness); its own request_bytes are in the JSON beside the sizes
above. Results: benchmarks/results/context_bench[_<label>].json and a table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from rec.benchmarking import (
    BUILD,
    model_configs,
    print_results,
    process_cpu_s,
    results_file,
    train_export_both,
    write_results,
)
from rec.config import load_config
from rec.contract import ModelDir
from rec.contract.context import ContextSplit
from rec.cpu import cpu_info, describe
from rec.data.synthetic import World
from rec.serve.client import request_bytes, synthetic_request
from rec.serve.cpp import launch_cpp

MODEL = "rec"
ROWS = (  # name, export served, form sent
    ("flat_plain", "plain", "flat"),
    ("flat_ctxmodel", "context", "flat"),
    ("context", "context", "context"),
)
BYTES = (("http_json", "http", False), ("http_binary", "http", True), ("grpc", "grpc", True))
TARGETS = {"pairs_per_s_ratio_n128": ">= 1.5", "request_bytes_ratio_n128": "<= 0.333"}


def context_features(cfg) -> dict:
    """The split rule on a config: multi-hot sparse features and every dense feature are
    context; with the context tables' share of the rows."""
    world = World(cfg)
    sparse = [f for f, multi in zip(world.features, world.multi_hot, strict=True) if multi]
    owner, rows = cfg.feature_to_table(), {t.name: t.rows for t in cfg.tables}
    context_tables = {owner[f] for f in sparse}
    return {
        "sparse": sparse,
        "dense": list(cfg.features.dense_names),
        "sparse_columns": [i for i, multi in enumerate(world.multi_hot) if multi],
        "candidate_sparse": [f for f in cfg.features.sparse if f not in sparse],
        "context_rows_share": round(sum(rows[t] for t in context_tables) / sum(rows.values()), 4),
        # Bag sizes as the training data draws them (one-hot: 1): request_bytes' requests.
        "hotness": [(1, world.max_hotness) if m else (1, 1) for m in world.multi_hot],
    }


def served_split(repo: Path, split: dict) -> ContextSplit:
    """The context export's rec.json "context" section, checked to be the split asked for."""
    manifest = json.loads(ModelDir.of(repo, MODEL).manifest.read_text())
    served = ContextSplit.from_dict(manifest["context"])
    if served.sparse != tuple(split["sparse_columns"]) or len(served.dense) != len(split["dense"]):
        raise SystemExit(f"{repo}: rec.json's context {manifest['context']} is not {split}")
    return served


def sizes(context: ContextSplit, split: dict, n: int, form: str) -> dict:
    """Request body bytes of one request of N pairs per protocol, and per pair."""
    request = synthetic_request(context, n, form, seed=n, hotness=tuple(split["hotness"]))
    out = {key: request_bytes(request, proto, binary) for key, proto, binary in BYTES}
    return out | {f"{k}_per_pair": round(v / n, 1) for k, v in list(out.items())}


def pairs_counted(server) -> float:
    """The server's nv_inference_count (pairs scored, every model) from its metrics port."""
    with urllib.request.urlopen(f"http://{server.endpoints.metrics}/metrics", timeout=10) as r:
        text = r.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("nv_inference_count"))  # fmt: skip


def load(server, requests_repo: Path, n: int, form: str, seconds: float, clients: int,
         rate: float = 0.0) -> dict:  # fmt: skip
    """One rec-bench gRPC run (closed loop, or open at `rate` requests/s) of N pairs per
    request, with the server's CPU and pairs counted over it."""
    argv = [str(BUILD / "rec-bench"), "grpc", "--model-repository", str(requests_repo)]
    argv += ["--model", MODEL, "--target", server.endpoints.grpc, "--candidates", str(n)]
    argv += ["--form", form, "--concurrency", str(clients), "--seconds", str(seconds)]
    argv += ["--rate", str(rate)] if rate else []
    cpu0, pairs0 = process_cpu_s(server.proc.pid), pairs_counted(server)
    out = subprocess.run(argv, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"rec-bench failed ({out.returncode}): {' '.join(argv)}\n{out.stderr}")
    cpu, pairs = process_cpu_s(server.proc.pid) - cpu0, pairs_counted(server) - pairs0
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if result["failures"]:
        raise SystemExit(f"{result['failures']} failed requests: {' '.join(argv)}")
    result["server_cpu_s"] = round(cpu, 3)
    result["server_pairs"] = int(pairs)
    result["cpu_us_per_pair"] = round(cpu / max(pairs, 1) * 1e6, 3)
    return result


class Progress:
    """`[k/total] what ... ETA` lines at the mean time per step so far."""

    def __init__(self, total: int) -> None:
        self.total, self.done, self.t0 = total, 0, time.perf_counter()

    def step(self, what: str) -> None:
        elapsed = time.perf_counter() - self.t0
        eta = f", ETA {elapsed / self.done * (self.total - self.done):.0f} s" if self.done else ""
        print(f"  [{self.done + 1}/{self.total}] {what}{eta}", flush=True)
        self.done += 1


def measure_n(servers: dict, repos: dict, n: int, args, progress: Progress) -> dict:
    """The three rows at N: closed loops in turns at each concurrency (--rounds times), then
    the open loop. A row's saturation is its best closed loop (rec-bench's "concurrency")."""
    runs: dict[str, dict] = {name: {"closed": []} for name, _, _ in ROWS}
    for clients in [c for _ in range(args.rounds) for c in args.concurrency]:
        for name, kind, form in ROWS:
            progress.step(f"N={n} {name} closed loop, {clients} client(s)")
            r = load(servers[kind], repos["context"], n, form, args.seconds, clients)
            runs[name]["closed"].append(r)
            print(f"      {r['rows_per_s']:10.0f} pairs/s p99={r['p99_us']:9.0f} us "
                  f"cpu/pair={r['cpu_us_per_pair']:.2f} us", flush=True)  # fmt: skip
    for run in runs.values():
        run["saturation"] = max(run["closed"], key=lambda r: r["rows_per_s"])
    pair_rate = args.open_load * runs["flat_plain"]["saturation"]["rows_per_s"]
    for name, kind, form in ROWS:
        progress.step(f"N={n} {name} open loop at {pair_rate:.0f} pairs/s")
        r = load(servers[kind], repos["context"], n, form, args.open_seconds, args.open_clients,
                 rate=pair_rate / n)  # fmt: skip
        runs[name]["open"] = {"pairs_per_s_target": round(pair_rate, 1), **r}
        print(f"      p99={r['p99_us']:9.0f} us late={r.get('late', 0)} "
              f"cpu/pair={r['cpu_us_per_pair']:.2f} us", flush=True)  # fmt: skip
    return runs


def row_summary(run: dict, size: dict) -> dict:
    sat, open_ = run["saturation"], run["open"]
    return {
        **{f"bytes_{k}": v for k, v in size.items()},
        "rec_bench_grpc_bytes": sat["request_bytes"],
        "pairs_per_s": round(sat["rows_per_s"], 1),
        "best_concurrency": sat["concurrency"],
        "cpu_us_per_pair": sat["cpu_us_per_pair"],
        "cpu_us_per_pair_open": open_["cpu_us_per_pair"],
        "p99_us_open": open_["p99_us"],
        "p50_us_open": open_["p50_us"],
        "late_open": open_.get("late", 0),
        # Requests sent over 1 ms behind their schedule: the client, or the CPU, fell behind.
        "late_share_open": round(open_.get("late", 0) / max(open_["requests"], 1), 3),
    }


RATIO_KEYS = ("bytes_http_json", "bytes_http_binary", "bytes_grpc", "cpu_us_per_pair",
              "pairs_per_s", "p99_us_open")  # fmt: skip


def ratios(rows: dict) -> dict:
    """context / flat_plain and flat_ctxmodel / flat_plain of each measure."""
    base = rows["flat_plain"]
    return {name: {k: round(rows[name][k] / base[k], 3) if base[k] else None for k in RATIO_KEYS}
            for name in ("context", "flat_ctxmodel")}  # fmt: skip


def measure_model(built: dict, split: dict, args) -> dict:
    repos = built["repos"]
    context = served_split(repos["context"], split)
    servers, started = {}, {}
    try:
        for kind in ("plain", "context"):
            t0 = time.perf_counter()
            servers[kind] = launch_cpp(repos[kind].resolve(), "--model", MODEL)
            started[kind] = round(time.perf_counter() - t0, 2)
        closed = args.rounds * len(args.concurrency)
        progress = Progress(len(args.candidates) * (closed + 1) * len(ROWS))
        per_n = {}
        for n in args.candidates:
            runs = measure_n(servers, repos, n, args, progress)
            rows = {r: row_summary(runs[r], sizes(context, split, n, form)) for r, _, form in ROWS}
            per_n[str(n)] = {"rows": rows, "ratios": ratios(rows), "runs": runs}
        peak = {kind: s.peak_rss_bytes() for kind, s in servers.items()}
    finally:
        for s in servers.values():
            s.stop(timeout=30)
    return {
        "split": split,
        "train_s": built["train_s"],
        "export_s": built["export_s"],
        "export_peak_rss_gb": built["export_peak_rss_gb"],
        "server_start_s": started,
        "server_peak_rss_gb": {k: round(v / 1e9, 3) for k, v in peak.items()},
        "candidates": per_n,
    }


def headline(doc: dict) -> dict:
    """The targets' numbers at N = 128, per model."""
    out = {}
    for name, m in doc["models"].items():
        r = m["candidates"].get("128", {}).get("ratios", {}).get("context")
        if r:
            out[name] = {"pairs_per_s_ratio_n128": r["pairs_per_s"],
                         "request_bytes_ratio_n128": r["bytes_http_binary"]}  # fmt: skip
    return out


def table(doc: dict) -> str:
    lines = [f"CPU: {doc['cpu']}, {doc['cores']} cores; rec-server with its defaults", ""]
    head = (
        "| model | N | row | bytes JSON / binary / gRPC per pair | pairs/s (clients) | "
        "CPU µs/pair | open p99 µs | vs flat_plain: bytes (binary), pairs/s, CPU, p99 |"
    )
    lines += [head, "|---|---|---|---|---|---|---|---|"]
    for name, m in doc["models"].items():
        for n, point in m["candidates"].items():
            for row, r in point["rows"].items():
                ratio = point["ratios"].get(row)
                late = " (late)" if r.get("late_share_open", 0) > 0.01 else ""
                rt = (f"{ratio['bytes_http_binary']:.2f}, {ratio['pairs_per_s']:.2f}x, "
                      f"{ratio['cpu_us_per_pair']:.2f}, {ratio['p99_us_open']:.2f}"
                      if ratio else "1")  # fmt: skip
                lines.append(
                    f"| {name} | {n} | {row} | {r['bytes_http_json_per_pair']:.0f} / "
                    f"{r['bytes_http_binary_per_pair']:.0f} / {r['bytes_grpc_per_pair']:.0f} | "
                    f"{r['pairs_per_s']:,.0f} ({r['best_concurrency']}) | "
                    f"{r['cpu_us_per_pair']:.2f} | {r['p99_us_open']:,.0f}{late} | {rt} |"
                )
        rss = m["server_peak_rss_gb"]
        lines.append(f"\n{name}: context {len(m['split']['sparse'])} of "
                     f"{len(m['split']['sparse']) + len(m['split']['candidate_sparse'])} sparse "
                     f"features ({m['split']['context_rows_share']:.0%} of rows) + "
                     f"{len(m['split']['dense'])} dense; server peak RSS plain {rss['plain']} GB,"
                     f" context {rss['context']} GB; train {m['train_s']} s\n")  # fmt: skip
    lines.append("(late): over 1 % of the open loop's requests left over 1 ms behind schedule.")
    return "\n".join(lines)


def parse_args() -> argparse.Namespace:
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="default,kaggle", help="comma-separated: default,kaggle")
    p.add_argument("--kaggle-scale", type=float, default=1.0,
                   help="rows of every Kaggle table x this (1.0: 33.8M rows)")  # fmt: skip
    p.add_argument("--candidates", type=ints, default=[16, 128, 512], help="N, comma-separated")
    p.add_argument("--concurrency", type=ints, default=[1, 2, 4, 8],
                   help="closed-loop clients tried for saturation")  # fmt: skip
    p.add_argument("--seconds", type=float, default=4.0, help="per closed-loop run")
    p.add_argument("--rounds", type=int, default=1,
                   help="closed-loop sweeps per N (saturation: the best run of all)")  # fmt: skip
    p.add_argument("--open-seconds", type=float, default=8.0, help="per open-loop run")
    p.add_argument("--open-load", type=float, default=0.5,
                   help="open-loop pair rate, x flat_plain's saturation pairs/s")  # fmt: skip
    p.add_argument("--open-clients", type=int, default=8, help="open-loop sending threads")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: the default model, N = 16, 1 s per closed loop, 2 s open "
                   "(results as context_bench_quick.json unless --label)")  # fmt: skip
    p.add_argument("--label", help="results as context_bench_<label>.json")
    p.add_argument("--report", action="store_true", help="the table of the results file again")
    args = p.parse_args()
    if args.quick:
        args.models, args.candidates = "default", [16]
        args.seconds, args.open_seconds = 1.0, 2.0
        args.label = args.label or "quick"
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = set(args.models) - {"default", "kaggle"}
    if unknown:
        p.error(f"--models: unknown {sorted(unknown)}; the models are default and kaggle")
    return args


def main() -> None:
    args = parse_args()
    out = results_file("context_bench", args.label)
    if args.report:
        print_results(out, table)
        return
    if not (BUILD / "rec-bench").exists():
        raise SystemExit(f"{BUILD / 'rec-bench'} is missing: run make setup")
    t0 = time.perf_counter()
    doc = {
        "cpu": describe(cpu_info()),
        "cpu_info": cpu_info(),
        "cores": len(os.sched_getaffinity(0)),
        "machine": platform.machine(),
        "date": time.strftime("%Y-%m-%d"),
        "server": "rec-server --model rec (its defaults); rec-bench grpc on the same cores",
        "settings": {k: getattr(args, k) for k in ("kaggle_scale", "candidates", "concurrency",
                     "seconds", "rounds", "open_seconds", "open_load", "open_clients", "quick")},
        "targets": TARGETS,
        "models": {},
    }  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="context_bench-") as tmp:
        configs = model_configs(Path(tmp), args.kaggle_scale)
        for name in args.models:
            cfg = load_config(configs[name])
            split = context_features(cfg)
            print(f"[{name}] context: {split['sparse']} + {len(split['dense'])} dense", flush=True)
            context = split["sparse"] + split["dense"]
            built = train_export_both(Path(tmp), name, configs[name], context)
            doc["models"][name] = measure_model(built, split, args)
    doc["headline"] = headline(doc)
    doc["wall_s"] = round(time.perf_counter() - t0, 1)
    write_results(out, doc)
    print("\n" + table(doc))
    print(json.dumps(doc["headline"], indent=2))
    print(f"\nwritten: {out} ({doc['wall_s']:.0f} s)")


if __name__ == "__main__":
    main()
