"""MLPerf DLRM-v2's shape on rec-server (#61): pairs/s per core and p99, beside MLPerf's.

    .venv/bin/python benchmarks/mlperf_shape.py --cores 4 --label L   # full size: ~15 min
    .venv/bin/python benchmarks/mlperf_shape.py --quick               # smoke: tiny tables, ~75 s
    .venv/bin/python benchmarks/mlperf_shape.py --report [--label L]  # the table again

Full size wants about 12 GB of RAM at its peak (training, 2 ranks: `rec plan` estimates ~10 GiB;
each export ~3 GB, the server ~2.5 GB) and --cores + 2 CPUs (the client's) kept quiet.

The model is examples/dlrm_v2.yaml (DLRM_DCN, dim 128, MLPerf's 26 cardinalities with its five
40M tables capped at 2.5M rows, MLPerf's per-feature ids per sample, int8 tables and dense
layers). It is trained for --steps steps only, so that its tables and layers exist: the scores
mean nothing and the export is told to accept any quality (export.accept_quality_loss); what is
measured is the cost of scoring, which does not depend on the weights' values. The run is
exported twice (rec.benchmarking.train_export_both): plain, and with the example's
features.context (its 15 multi-valued features and 13 dense ones are the user's).

Queries are shaped like MLPerf's: one user and N candidates, N uniform in --n-range (100..440,
mean 270; MLPerf's queries hold 100 to 700 pairs, about 270 on average), MLPerf's ids per bag
for every feature (cat_20 holds 100 ids), ids uniform over each table (MLPerf's come from
Criteo's skewed data: our lookups hit the caches less). Every query is another user: MLPerf's
queries share none. So the like-for-like row is the flat form (the user's features repeated
in each of the N rows) on the plain export; the context form (the user once) on the context
export is beside it. rec-server runs pinned to --cores cores (its process and every thread,
as `taskset -c` would) with one executor per core and one intra-op thread each; the client
(rec.serve.loadgen over gRPC, --clients processes) runs on the other cores.

Per form:
  - saturation: the best pairs/s of closed loops at --concurrency (x cores) queries in flight;
  - p99 (and p50, p99.9) in an open loop at --open-load x the flat form's saturation pairs/s,
    the same query rate for both forms (loadgen's fixed schedule, latency from the scheduled
    send; MLPerf's Server scenario sends Poisson arrivals and reports the highest rate whose
    p99 stays under its bound, 60 ms for DLRM-v2, so our saturation is an upper bound of that);
  - the server's peak RSS, the exports' peak RSS and wall time, the training ranks' peak RSS.
Pairs/s per core is pairs/s / --cores (logical CPUs: an SMT sibling counts as one); MLPerf's
per core is its samples/s x 270 / its physical cores. Results:
benchmarks/results/mlperf_shape[_<label>].json and a table.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import multiprocessing
import os
import platform
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import yaml

from rec.benchmarking import ROOT, print_results, results_file, train_export_both, write_results
from rec.contract import ModelDir
from rec.contract.context import ContextSplit
from rec.cpu import cpu_info, describe
from rec.serve.cpp import launch_cpp
from rec.serve.loadgen import Job, Outcome, run_job

MODEL = "rec"
EXAMPLE = ROOT / "examples" / "dlrm_v2.yaml"
FORMS = (("flat", "plain"), ("context", "context"))  # form sent, export served
PAIRS_PER_SAMPLE = 270  # MLPerf DLRM-v2: a sample is one query of about 270 user-item pairs
# MLPerf Inference v4.1, closed division, dlrm-v2-99.9, Server scenario, as published
# (mlcommons/inference_results_v4.1: closed/Intel/results/*/dlrm-v2-99.9/Server/performance/
# run_1/mlperf_log_summary.txt, closed/Intel/systems/*.json).
MLPERF = (
    {"system": "2x Intel Xeon 6980P (Granite Rapids, preview)", "samples_per_s": 17749.5,
     "cores": 256, "p99_ms": 42.3},
    {"system": "2x Intel Xeon Platinum 8592+ (Emerald Rapids)", "samples_per_s": 9731.5,
     "cores": 128, "p99_ms": 52.9},
)  # fmt: skip


def bench_config(tmp: Path, args) -> tuple[Path, list[str], dict]:
    """The example without features.context (the run exports both ways), trained --steps
    steps, its quality accepted; --max-rows caps every table. Returns the config's path, the
    context features and the config as a dict."""
    data = yaml.safe_load(EXAMPLE.read_text())
    context = data["features"].pop("context")
    if args.max_rows:
        for t in data["tables"]:
            t["rows"] = min(t["rows"], args.max_rows)
    training = data["training"]
    training.update(steps=args.steps, warmup_steps=min(training["warmup_steps"], args.steps))
    data["checkpoint"]["every_steps"] = 0
    # A few dozen steps learn nothing that int8 dense layers must keep: quality is not measured.
    data["export"]["accept_quality_loss"] = True
    if args.quick:
        data["data"]["synthetic"].update(train_samples=1024, eval_samples=512)
        training.update(batch_size=64, eval_batches=2)
        data["export"]["eval_batches"] = 2
    path = tmp / "dlrm_v2.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path, context, data


def query_sizes(args) -> list[int]:
    """N of each query a client process sends in turn (every process the same sizes, its own
    users): --queries evenly spread over --n-range, shuffled, so their mean is the range's
    middle exactly (a random draw of 64 would miss 270 by ~12)."""
    lo, hi = args.n_range
    sizes = np.linspace(lo, hi, args.queries).round().astype(int)
    return [int(n) for n in np.random.default_rng(0).permutation(sizes)]


def hotness(data: dict) -> tuple[tuple[int, int], ...]:
    """MLPerf's fixed ids per bag, (h, h) per sparse feature in column order."""
    per_feature = data["data"]["synthetic"]["hotness"]
    sparse = [f for t in data["tables"] for f in t["features"]]
    return tuple((per_feature[f], per_feature[f]) for f in sparse)


@contextmanager
def pinned(cores: set[int]):
    """This thread (and what it starts: processes, threads) on `cores` until the block ends."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cores)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def server_affinity(pid: int) -> list[int]:
    """The union of the CPUs every thread of `pid` may run on (the pinning, checked)."""
    cpus: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        cpus |= os.sched_getaffinity(int(task.name))
    return sorted(cpus)


def start_server(repo: Path, cores: set[int], args):
    """rec-server on `repo`, pinned to `cores`: one executor per core, one intra-op thread."""
    flags = ["--model", MODEL, "--executor-threads", str(args.executors or len(cores))]
    flags += ["--intra-op-threads", "1", "--grpc-threads", "1", "--http-threads", "1"]
    with pinned(cores):
        return launch_cpp(repo.resolve(), *flags, ready_timeout=600)


def summarize(outcomes: list[Outcome], open_s: float = 0.0) -> dict:
    """Queries/s, pairs/s and latency percentiles (ms) of one point's client processes; the
    window is the open loop's schedule, or first send to last answer."""
    lat = np.concatenate([o.latencies_s for o in outcomes]) * 1e3
    errors: dict[str, int] = {}
    for o in outcomes:
        for k, v in o.errors.items():
            errors[k] = errors.get(k, 0) + v
    first = min((o.first_send for o in outcomes if o.first_send), default=0.0)
    window = open_s or max((o.last_done for o in outcomes), default=0.0) - first
    pairs = sum(o.pairs for o in outcomes)
    pct = {f"p{p:g}_ms": round(float(np.percentile(lat, p)), 2) if lat.size else None
           for p in (50, 99, 99.9)}  # fmt: skip
    return {
        "queries": int(lat.size),
        "pairs": pairs,
        "window_s": round(window, 3),
        "queries_per_s": round(lat.size / window, 2) if window > 0 else 0.0,
        "pairs_per_s": round(pairs / window, 1) if window > 0 else 0.0,
        **pct,
        "errors": errors,
    }


def run_point(pool, server, split: ContextSplit, form: str, shape: dict, args,
              in_flight: int, rate: float = 0.0) -> dict:  # fmt: skip
    """One closed loop (`in_flight` queries kept in flight) or open loop (`rate` queries/s)."""
    procs = min(args.clients, in_flight)
    shares = [in_flight // procs + (i < in_flight % procs) for i in range(procs)]
    seconds = args.open_seconds if rate else args.seconds
    start_at = time.monotonic() + 0.5
    jobs = [
        Job(url=server.endpoints.grpc, protocol="grpc", model=MODEL, num_dense=split.num_dense,
            num_sparse=split.num_sparse, batch=0, in_flight=share,
            rate=rate * share / in_flight, start_at=start_at, warmup_s=args.warmup,
            duration_s=seconds, max_requests=0, seed=1_000_000 * (i + 1),
            candidates=max(shape["sizes"]), form=form, context=split, hotness=shape["hotness"],
            queries=tuple(shape["sizes"]))
        for i, share in enumerate(shares)
    ]  # fmt: skip
    row = summarize(list(pool.map(run_job, jobs)), seconds if rate else 0.0)
    if row["errors"]:
        raise SystemExit(f"{form}: failed queries {row['errors']}")
    return {"in_flight": in_flight, "rate_qps": round(rate, 2) or None, **row}


def measure_form(pool, repo: Path, form: str, split: ContextSplit, shape: dict, args,
                 cores: set[int], open_qps: float | None) -> dict:  # fmt: skip
    """Saturation and (at `open_qps`, else --open-load x this form's saturation) the open
    loop of one form on its own pinned server, with the server's peak RSS."""
    t0 = time.perf_counter()
    server = start_server(repo, cores, args)
    out: dict = {"server_start_s": round(time.perf_counter() - t0, 1)}
    try:
        out["server_cpus"] = server_affinity(server.proc.pid)
        # Unrecorded: TorchScript's profiling executor re-optimizes on its first calls with new
        # shapes (about a second each here), and every N is a new shape.
        prime = argparse.Namespace(**{**vars(args), "seconds": args.prime, "warmup": 0.0})
        out["prime"] = run_point(pool, server, split, form, shape, prime, len(cores))
        closed = []
        for k in args.concurrency:
            r = run_point(pool, server, split, form, shape, args, k * len(cores))
            closed.append(r)
            print(
                f"  {form:7s} closed {r['in_flight']:3d} in flight: {r['pairs_per_s']:10,.0f} "
                f"pairs/s {r['queries_per_s']:8.1f} q/s p99 {r['p99_ms']} ms",
                flush=True,
            )
        best = max(closed, key=lambda r: r["pairs_per_s"])
        qps = open_qps or args.open_load * best["queries_per_s"]
        r = run_point(pool, server, split, form, shape, args, args.open_in_flight, rate=qps)
        print(f"  {form:7s} open at {qps:.1f} q/s: p50 {r['p50_ms']} ms p99 {r['p99_ms']} ms "
              f"p99.9 {r['p99.9_ms']} ms", flush=True)  # fmt: skip
        out |= {"closed": closed, "saturation": best, "open": r}
        out["server_peak_rss_gb"] = round(server.peak_rss_bytes() / 1e9, 3)
    finally:
        server.stop(timeout=60)
    return out


def cores_split(n: int) -> tuple[set[int], set[int]]:
    """The server's first `n` CPUs of this process's, and the client's: the rest (or, with
    none left, the same ones, which the table then says)."""
    mine = sorted(os.sched_getaffinity(0))
    if n > len(mine):
        raise SystemExit(f"--cores {n}: this process may run on {len(mine)} CPUs only")
    server, client = set(mine[:n]), set(mine[n:])
    return server, client or server


def summary_rows(doc: dict) -> list[dict]:
    """Ours (each form) and MLPerf's systems, per core."""
    cores = len(doc["server_cpus"])
    rows = []
    for form, r in doc["forms"].items():
        sat = r["saturation"]
        rows.append({"who": f"rec {form}" + (" (like-for-like)" if form == "flat" else ""),
                     "cpu": doc["cpu"], "cores": cores, "pairs_per_s": sat["pairs_per_s"],
                     "pairs_per_s_per_core": round(sat["pairs_per_s"] / cores, 1),
                     "p99_ms": r["open"]["p99_ms"], "at_qps": r["open"]["rate_qps"]})  # fmt: skip
    for m in MLPERF:
        pairs = m["samples_per_s"] * PAIRS_PER_SAMPLE
        rows.append({"who": "MLPerf v4.1 (published)", "cpu": m["system"], "cores": m["cores"],
                     "pairs_per_s": round(pairs, 1),
                     "pairs_per_s_per_core": round(pairs / m["cores"], 1),
                     "p99_ms": m["p99_ms"], "at_qps": m["samples_per_s"]})  # fmt: skip
    return rows


def table(doc: dict) -> str:
    lines = [
        f"rec-server pinned to CPUs {doc['server_cpus']} ({len(doc['server_cpus'])} cores) of "
        f"{doc['cpu']}; client on {doc['client_cpus']}"
        + (" (the same CPUs: none left)" if doc["client_cpus"] == doc["server_cpus"] else ""),
        f"queries: N uniform in {doc['settings']['n_range']} (mean "
        f"{doc['shape']['mean_n']:.0f}), each another user; tables: {doc['rows']:,} rows; "
        f"trained {doc['settings']['steps']} steps (quality not the point)",
        "",
        "| who | CPU | cores | pairs/s | pairs/s per core | p99 ms (at queries/s) |",
        "|---|---|---|---|---|---|",
    ]
    for r in summary_rows(doc):
        lines.append(f"| {r['who']} | {r['cpu']} | {r['cores']} | {r['pairs_per_s']:,.0f} | "
                     f"{r['pairs_per_s_per_core']:,.0f} | {r['p99_ms']} "
                     f"({r['at_qps']:,.1f}) |")  # fmt: skip
    lines.append(
        "\nrec: saturation = best closed loop; p99 in an open loop at "
        f"{doc['settings']['open_load']} x flat's saturation query rate. MLPerf: Server "
        "scenario samples/s (Poisson, p99 under 60 ms), one sample = one query of ~270 pairs."
    )
    mem = {f: r["server_peak_rss_gb"] for f, r in doc["forms"].items()}
    lines.append(f"server peak RSS GB {mem}; export peak RSS GB {doc['export_peak_rss_gb']}, "
                 f"export s {doc['export_s']}; train s {doc['train_s']}, ranks' peak RSS GB "
                 f"{doc['train_peak_rss_gb']}")  # fmt: skip
    return "\n".join(lines)


def parse_args() -> argparse.Namespace:
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cores", type=int, default=1, help="CPUs rec-server is pinned to")
    p.add_argument("--executors", type=int, default=0, help="executor threads (0: --cores)")
    p.add_argument("--clients", type=int, default=2, help="client processes")
    p.add_argument("--steps", type=int, default=40, help="training steps (tables must exist)")
    p.add_argument("--max-rows", type=int, default=0, help="cap every table (0: the example's)")
    p.add_argument("--n-range", type=ints, default=[100, 440], help="N per query: LO,HI")
    p.add_argument("--queries", type=int, default=64, help="distinct queries per client process")
    p.add_argument("--concurrency", type=ints, default=[1, 2, 4],
                   help="closed loops: queries in flight, x --cores")  # fmt: skip
    p.add_argument("--seconds", type=float, default=10.0, help="per closed loop")
    p.add_argument("--warmup", type=float, default=3.0, help="before each loop's window")
    p.add_argument("--prime", type=float, default=10.0, help="a closed loop, not kept, first")
    p.add_argument("--open-seconds", type=float, default=20.0, help="the open loop")
    p.add_argument("--open-load", type=float, default=0.5, help="x flat's saturation q/s")
    p.add_argument("--open-in-flight", type=int, default=64, help="open loop's in-flight cap")
    p.add_argument("--quick", action="store_true",
                   help="smoke: tables capped at 1000 rows, N in 8..32, 4 steps, 2 s loops "
                   "(results as mlperf_shape_quick.json unless --label)")  # fmt: skip
    p.add_argument("--label", help="results as mlperf_shape_<label>.json")
    p.add_argument("--report", action="store_true", help="the table of the results file again")
    args = p.parse_args()
    if args.quick:
        args.max_rows = args.max_rows or 1000
        args.n_range, args.queries, args.steps = [8, 32], 8, 4
        args.concurrency, args.seconds, args.warmup, args.open_seconds = [1, 2], 2.0, 1.0, 3.0
        args.prime = 2.0
        args.label = args.label or "quick"
    if len(args.n_range) != 2 or not 1 <= args.n_range[0] <= args.n_range[1]:
        p.error(f"--n-range: LO,HI with 1 <= LO <= HI, got {args.n_range}")
    return args


def main() -> None:
    args = parse_args()
    out = results_file("mlperf_shape", args.label)
    if args.report:
        print_results(out, table)
        return
    server_cpus, client_cpus = cores_split(args.cores)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="mlperf_shape-") as tmp:
        config, context, data = bench_config(Path(tmp), args)
        built = train_export_both(Path(tmp), "dlrm_v2", config, context)
        manifest = json.loads(ModelDir.of(built["repos"]["context"], MODEL).manifest.read_text())
        split = ContextSplit.from_dict(manifest["context"])
        sizes = query_sizes(args)
        shape = {"sizes": sizes, "mean_n": float(np.mean(sizes)), "hotness": hotness(data)}
        doc = {
            "cpu": describe(cpu_info()), "cpu_info": cpu_info(), "machine": platform.machine(),
            "date": time.strftime("%Y-%m-%d"), "server_cpus": sorted(server_cpus),
            "client_cpus": sorted(client_cpus), "rows": sum(t["rows"] for t in data["tables"]),
            "settings": {k: v for k, v in vars(args).items() if k not in ("report",)},
            "shape": {k: v for k, v in shape.items() if k != "hotness"},
            "context": context, "mlperf": MLPERF, "forms": {},
            **{k: built[k] for k in ("train_s", "train_peak_rss_gb", "export_s",
                                     "export_peak_rss_gb")},
        }  # fmt: skip
        spawn = multiprocessing.get_context("spawn")  # grpc does not survive fork
        with (
            pinned(client_cpus),
            concurrent.futures.ProcessPoolExecutor(args.clients, mp_context=spawn) as pool,
        ):
            open_qps = None
            for form, kind in FORMS:
                print(f"[{form}] rec-server on the {kind} export, CPUs {sorted(server_cpus)}")
                r = measure_form(pool, built["repos"][kind], form, split, shape, args,
                                 server_cpus, open_qps)  # fmt: skip
                doc["forms"][form] = r
                open_qps = r["open"]["rate_qps"]  # the context form at flat's query rate
    doc["summary"] = summary_rows(doc)
    doc["wall_s"] = round(time.perf_counter() - t0, 1)
    write_results(out, doc)
    print("\n" + table(doc))
    print(f"\nwritten: {out} ({doc['wall_s']:.0f} s)")


if __name__ == "__main__":
    main()
