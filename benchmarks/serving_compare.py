"""C++ server vs Triton (Python backend) on the same model.pt, same machine, in one run.

For B = 1 and B = 256 samples per request, over HTTP and gRPC: throughput at saturation (the
best of a closed-loop concurrency sweep) and p99 latency at a fixed offered load (open loop,
latency from the scheduled send time). The servers run one at a time, each with one model
instance and one torch thread (rec-server's defaults; rec.serve.triton uses the same).

    .venv/bin/python benchmarks/serving_compare.py                  # default-config model
    .venv/bin/python benchmarks/serving_compare.py --repo artifacts/demo/model_repository

Without --repo it exports a seeded, untrained model of rec's default config (serving cost does
not depend on the weights' values). Writes benchmarks/results/serving_compare.{json,png} and
prints a Markdown table.
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


def seeded_default_repository(work: Path) -> Path:
    """Exports a seeded model of the default config (a checkpoint written as training would)."""
    import torch
    import torch.distributed.checkpoint as dcp

    from rec import run_dir
    from rec.config import config_from_dict, default_config_dict
    from rec.export.pipeline import export_run
    from rec.model import TrainModel, build_model

    data = default_config_dict()
    data.setdefault("export", {})["eval_batches"] = 2  # verification only; keep export quick
    cfg = config_from_dict(data)
    torch.manual_seed(0)
    model = TrainModel(build_model(cfg))
    run = work / "run"
    step = run_dir.checkpoints_dir(run) / run_dir.step_dir_name(1)
    dcp.save({"model": model.state_dict()}, checkpoint_id=str(step))
    run_dir.commit_checkpoint(run, 1, {"world_size": 1})
    (run / run_dir.CONFIG_FILE).write_text(cfg.to_yaml())
    repo = work / "model_repository"
    export_run(run, repo, fmt="torchscript", log=lambda _m: None)
    return repo


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


def rec_bench_rows(repo: Path, batches, concurrency, seconds: float) -> list[dict]:
    """gRPC closed-loop sweep of both servers with rec-bench (its HTTP dialect is rec-server's
    only: every request fails against Triton), one server at a time. No p95/p99.9."""
    from rec.serve.launch import ServeConfig, start_server

    rows = []
    for backend in ("cpp", "triton"):
        with start_server(ServeConfig(repo, backend, None, "127.0.0.1", 0, 0, 0)) as server:
            for batch in batches:
                for c in concurrency:
                    row = rec_bench_point(repo, server.endpoints.grpc, batch, c, seconds)
                    rows.append({"target": f"{backend}-grpc", **row})
                    print(f"rec-bench {backend}-grpc B={batch} c={c}: "
                          f"{row['throughput_samples_per_s']:,.0f} samples/s "
                          f"p99 {row['latency_ms']['p99']:.2f} ms", flush=True)  # fmt: skip
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


def main() -> None:
    from rec.serve.bench import BenchConfig, run_bench
    from rec.serve.bench_plot import plot_results

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repo", type=Path, help="model repository (default: seeded default export)")
    p.add_argument("--concurrency", default="1,4,16")
    p.add_argument("--rate-b1", type=float, default=200.0, help="fixed load for B=1, req/s")
    p.add_argument("--rate-b256", type=float, default=10.0, help="fixed load for B=256, req/s")
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--duration", type=float, default=4.0)
    p.add_argument("--processes", type=int, default=2)
    p.add_argument("--out", type=Path, default=RESULTS / "serving_compare")
    args = p.parse_args()

    with tempfile.TemporaryDirectory(prefix="rec-serving-bench-") as tmp:
        repo = args.repo or seeded_default_repository(Path(tmp))
        rows, meta, loads = [], None, []
        for batch, rate in ((1, args.rate_b1), (256, args.rate_b256)):
            cfg = BenchConfig(
                repo=repo,
                batch_sizes=(batch,),
                concurrency=tuple(int(c) for c in args.concurrency.split(",")),
                rates=(rate,),
                warmup_s=args.warmup,
                duration_s=args.duration,
                processes=args.processes,
                output=Path(tmp) / f"b{batch}.json",
                plot=None,
            )
            result = run_bench(cfg)
            rows += result["results"]
            meta = meta or result["meta"]
            loads.append(result["meta"]["load_average_1m"])
        cpp_client = []
        if REC_BENCH.is_file():
            sweep = tuple(int(c) for c in args.concurrency.split(","))
            cpp_client = rec_bench_rows(repo, (1, 256), sweep, args.duration)
    meta["repo"] = str(args.repo) if args.repo else "seeded default-config export"
    meta["load_average_1m"] = loads
    meta["script_args"] = {k: str(v) for k, v in vars(args).items()}
    meta["config"]["batch_sizes"] = [1, 256]
    meta["config"]["rates"] = {"1": args.rate_b1, "256": args.rate_b256}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = {"meta": meta, "results": rows, "results_rec_bench_client": cpp_client}
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=2))
    plot_results(rows, args.out.with_suffix(".png"))
    print(table(rows))
    if cpp_client:
        print("\nWith rec-bench (C++ client), gRPC, closed loop:\n" + client_table(cpp_client))
    print(f"wrote {args.out.with_suffix('.json')} and {args.out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
