"""C++ server vs Triton (Python backend) on the same model.pt, same machine, in one run, for the
default model and the Kaggle-size one.

For B = 1 and B = 256 samples per request, over HTTP and gRPC: throughput at saturation (the
best of a closed-loop concurrency sweep) and p99 latency at a fixed offered load (open loop,
latency from the scheduled send time), and each server's peak RSS. The servers run one at a
time, each with one model instance and one torch thread (rec-server's defaults;
rec.serve.triton uses the same).

    .venv/bin/python benchmarks/serving_compare.py                      # both models, full size
    .venv/bin/python benchmarks/serving_compare.py --kaggle-scale 0.05  # a quick look
    .venv/bin/python benchmarks/serving_compare.py --repo artifacts/demo/model_repository

Without --repo it trains both models briefly and exports each as its config says
(rec/benchmarking.py's trained_repositories; serving cost does not depend on how well
they are trained). Prints Markdown tables and the ratios; writes
benchmarks/results/serving_compare.json and a serving_compare_MODEL.png per model.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
# cpp/'s closed-loop C++ client: far less client CPU per request than Python, which on a
# 2-core machine otherwise caps what either server can show at B=1.
REC_BENCH = Path(__file__).resolve().parent.parent / "build" / "cpp" / "rec-bench"
BACKENDS = ("cpp", "triton")


def rec_bench_point(repo: Path, grpc_url: str, batch: int, concurrency: int, seconds: float):
    argv = [str(REC_BENCH), "grpc", "--model-repository", str(repo), "--target", grpc_url]
    argv += ["--batch", str(batch), "--concurrency", str(concurrency), "--seconds", str(seconds)]
    out = json.loads(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)
    return {
        "client": "rec-bench",
        "batch": batch,
        "concurrency": concurrency,
        "ok": out["requests"],
        "errors": out["failures"],
        "throughput_rps": out["requests_per_s"],
        "throughput_samples_per_s": out["rows_per_s"],
        "latency_ms": {"p50": out["p50_us"] / 1e3, "p99": out["p99_us"] / 1e3},
    }


def rec_bench_rows(repo: Path, batches, concurrency, seconds: float, peaks: dict[str, int]):
    """gRPC closed-loop sweep of both servers with rec-bench (its HTTP dialect is rec-server's
    only: every request fails against Triton), one server at a time. No p95/p99.9. Raises each
    server's entry of `peaks` to its peak RSS here."""
    from rec.serve.launch import ServeConfig, start_server

    rows = []
    for backend in BACKENDS:
        with start_server(ServeConfig(repo, backend, None, "127.0.0.1", 0, 0, 0)) as server:
            for batch in batches:
                for c in concurrency:
                    row = rec_bench_point(repo, server.endpoints.grpc, batch, c, seconds)
                    rows.append({"target": f"{backend}-grpc", **row})
                    print(f"rec-bench {backend}-grpc B={batch} c={c}: "
                          f"{row['throughput_samples_per_s']:,.0f} samples/s "
                          f"p99 {row['latency_ms']['p99']:.2f} ms", flush=True)  # fmt: skip
            peaks[backend] = max(peaks.get(backend, 0), server.tree_peak_rss_bytes())
    return rows


def table(rows: list[dict]) -> str:
    lines = [
        "| server | protocol | B | saturation throughput (samples/s) | at concurrency "
        "| offered load (req/s) | p50 (ms) | p99 (ms) | errors |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    keys = dict.fromkeys((r["target"], r["batch"]) for r in rows)
    for target, batch in keys:
        mine = [r for r in rows if r["target"] == target and r["batch"] == batch]
        closed = [r for r in mine if not r["offered_rps"]]
        best = max(closed, key=lambda r: r["throughput_samples_per_s"])
        fixed = next((r for r in mine if r["offered_rps"]), None)
        lat = fixed["latency_ms"] if fixed else {"p50": None, "p99": None}
        server, protocol = target.rsplit("-", 1)
        fmt = lambda v: f"{v:.2f}" if v is not None else "-"  # noqa: E731
        lines.append(
            f"| {server} | {protocol} | {batch} | {best['throughput_samples_per_s']:,.0f} "
            f"| {best['concurrency']} | {fixed['offered_rps'] if fixed else '-'} "
            f"| {fmt(lat['p50'])} | {fmt(lat['p99'])} | {sum(r['errors'] for r in mine)} |"
        )
    return "\n".join(lines)


def client_table(rows: list[dict]) -> str:
    lines = [
        "| server | B | concurrency | samples/s | p50 (ms) | p99 (ms) | errors |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['target'].rsplit('-', 1)[0]} | {r['batch']} | {r['concurrency']} "
            f"| {r['throughput_samples_per_s']:,.0f} | {r['latency_ms']['p50']:.2f} "
            f"| {r['latency_ms']['p99']:.2f} | {r['errors']} |"
        )
    return "\n".join(lines)


def saturation(rows: list[dict], target: str, batch: int) -> float:
    """The best closed-loop samples/s of `target` at `batch`."""
    return max(
        r["throughput_samples_per_s"]
        for r in rows
        if r["target"] == target and r["batch"] == batch and not r.get("offered_rps")
    )


def ratios(models: dict[str, dict]) -> dict:
    """rec-server / Triton per model (saturation with the C++ client, peak RSS), and each
    server's Kaggle-size / default ratio of the same, when both models ran."""

    def facts(m: dict, backend: str) -> dict[str, float]:
        rows = m["results_rec_bench_client"]
        out = {f"samples_per_s_b{b}": saturation(rows, f"{backend}-grpc", b) for b in (1, 256)}
        out["peak_rss"] = m["server_peak_rss_bytes"][backend]
        return out

    def divide(x: dict[str, float], y: dict[str, float]) -> dict[str, float]:
        return {k: x[k] / y[k] for k in x}

    out = {name: divide(facts(m, "cpp"), facts(m, "triton")) for name, m in models.items()}
    if {"default", "kaggle"} <= models.keys():
        for backend in BACKENDS:
            out[f"kaggle_over_default_{backend}"] = divide(
                facts(models["kaggle"], backend), facts(models["default"], backend)
            )
    return out


def compare(repo: Path, args: argparse.Namespace) -> dict:
    """Both servers on one repository: the Python load generator's sweep and fixed loads over
    HTTP and gRPC, then the C++ client's gRPC sweep; each server's peak RSS over all of it."""
    from rec.serve.bench import BenchConfig, run_bench

    rows, created, peaks = [], None, {}
    concurrency = tuple(int(c) for c in args.concurrency.split(","))
    with tempfile.TemporaryDirectory(prefix="rec-serving-bench-") as tmp:
        for batch, rate in ((1, args.rate_b1), (256, args.rate_b256)):
            cfg = BenchConfig(
                repo=repo,
                batch_sizes=(batch,),
                concurrency=concurrency,
                rates=(rate,),
                warmup_s=args.warmup,
                duration_s=args.duration,
                processes=args.processes,
                output=Path(tmp) / f"b{batch}.json",
                plot=None,
            )
            result = run_bench(cfg)
            rows += result["results"]
            created = created or result["meta"]["created_utc"]
            for backend, peak in result["meta"]["server_peak_rss_bytes"].items():
                peaks[backend] = max(peaks.get(backend, 0), peak)
    cpp_client = rec_bench_rows(repo, (1, 256), concurrency, args.duration, peaks)
    return {
        "repository": str(repo),
        "created_utc": created,
        "results": rows,
        "results_rec_bench_client": cpp_client,
        "server_peak_rss_bytes": peaks,
    }


def main() -> None:
    from rec.benchmarking import trained_repositories
    from rec.cpu import cpu_info, describe
    from rec.serve.bench_plot import plot_results

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repo", type=Path, help="one model repository (default: both models)")
    p.add_argument("--kaggle-scale", type=float, default=1.0,
                   help="rows of every Kaggle table x this (1.0: 33.8M rows)")  # fmt: skip
    p.add_argument("--concurrency", default="1,4,16")
    p.add_argument("--rate-b1", type=float, default=200.0, help="fixed load for B=1, req/s")
    p.add_argument("--rate-b256", type=float, default=10.0, help="fixed load for B=256, req/s")
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--duration", type=float, default=4.0)
    p.add_argument("--processes", type=int, default=2)
    p.add_argument("--out", type=Path, default=RESULTS / "serving_compare")
    args = p.parse_args()
    if not REC_BENCH.is_file():
        raise SystemExit(f"{REC_BENCH} is missing: run scripts/setup.sh")

    with tempfile.TemporaryDirectory(prefix="rec-serving-repos-") as tmp:
        if args.repo:
            repos = {"model": args.repo}
        else:
            repos = trained_repositories(Path(tmp), args.kaggle_scale)
        models = {}
        for name, repo in repos.items():
            print(f"== {name} ({repo})", flush=True)
            models[name] = compare(repo, args)
    result = {
        "meta": {
            "cpu": describe(cpu_info()),
            "cpu_flags": cpu_info()["flags"],
            "kaggle_scale": None if args.repo else args.kaggle_scale,
            "script_args": {k: str(v) for k, v in vars(args).items()},
        },
        "models": models,
        "ratios": ratios(models),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=2))
    plots = {name: args.out.parent / f"{args.out.name}_{name}.png" for name in models}
    for name, m in models.items():
        plot_results(m["results"], plots[name], f"{name} model, {result['meta']['cpu']}")
        print(f"\n### {name}\n\n{table(m['results'])}")
        print("\nWith rec-bench (C++ client), gRPC, closed loop:\n"
              + client_table(m["results_rec_bench_client"]))  # fmt: skip
        for backend, peak in m["server_peak_rss_bytes"].items():
            print(f"{backend} peak RSS: {peak / 1e9:.2f} GB")
    print(json.dumps(result["ratios"], indent=2))
    print(f"wrote {args.out.with_suffix('.json')}, " + ", ".join(map(str, plots.values())))


if __name__ == "__main__":
    main()
