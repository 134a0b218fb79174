"""rec-server benchmark: in-process TorchScript forward (the limit) vs the server over HTTP
(binary tensors) and gRPC, on the small default model and the Criteo Kaggle-size one, one run,
with the C++ load generator rec-bench.

    .venv/bin/python benchmarks/serve_cpp_bench.py              # ~10 min, ~12 GB of RAM at peak
    .venv/bin/python benchmarks/serve_cpp_bench.py --kaggle-scale 0.05   # a quick look
    .venv/bin/python benchmarks/serve_cpp_bench.py --repo REPO [--kaggle-repo REPO2]
    .venv/bin/python benchmarks/serve_cpp_bench.py --repos ts=REPO aoti=REPO2 --out NAME

Without --repo it trains both models briefly and exports each twice (int8 tables; fp32 dense
layers, the default, and int8 dense layers, `export.dense_dtype: int8`), as
benchmarks/export_bench.py does: the default config and examples/criteo_kaggle.yaml with its
tables scaled by --kaggle-scale (1.0: Criteo Kaggle's 33.8M rows).

For each model and intra-op thread count (server and in-process loop alike): the in-process
forward at B = 1 and B = 512; with batching off, bare round trips (`live`) and B = 1 p50 with
one client, HTTP and gRPC alternating in short rounds, with the server's threads polling for
work (`--busy-poll-us`, the default) and sleeping (`--busy-poll-us 0`); B = 512 p50 with one
client, the tensors through the socket and through system shared memory (rec-bench
`--shared-memory system`: what is left over the in-process forward is the transport);
saturation throughput of B = 1 requests (16 clients) with batching off and on; and B = 512
throughput (2 clients).
The server runs one executor thread, one HTTP and one gRPC thread. Client and server share the
machine's cores, so the numbers are a lower bound of what the server does alone.

Summary per run (targets of issue #11 in TARGETS): gRPC/HTTP p50 ratio at B = 1, HTTP and gRPC
overhead over the in-process p50 at B = 1, batching speedup at 16 clients, B = 512 share of
in-process throughput, and the server's peak RSS (VmHWM, over everything it served).
Writes benchmarks/results/serve_cpp.json and serve_cpp.png and prints
Markdown tables; `--report` redraws the plot and tables from the JSON.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

from rec.benchmarking import BUILD, RESULTS, Server, batching_repo, bench, median_run


def run_unbatched(
    servers: dict[str, Server], repo: Path, model: str, seconds: float, rounds: int
) -> dict:
    """B = 1 latency, bare round trips, 16-client and B = 512 throughput with batching off.
    `servers`: "" -> the default server, "_sleep" -> one with --busy-poll-us 0. The B = 1 and
    live runs alternate HTTP and gRPC and the two servers in `rounds` short rounds (the median is
    kept), so a burst of other work on the shared machine hits all alike."""
    results: dict[str, dict] = {}
    short = max(1.0, seconds / rounds)
    for call, key in (("live", "live"), ("infer", "b1")):
        runs: dict[str, list] = {}
        for _ in range(rounds):
            for suffix, server in servers.items():
                for proto in ("http", "grpc"):
                    target = server.http if proto == "http" else server.grpc
                    runs.setdefault(f"{proto}_{key}_batching_off{suffix}", []).append(
                        bench(proto, repo, model, 1, 1, short, "--target", target, "--call", call)
                    )
        for name, r in runs.items():
            results[name] = median_run(r)
    server = servers[""]
    for proto in ("http", "grpc"):
        target = server.http if proto == "http" else server.grpc
        for key, batch, clients in (("b1_sat", 1, 16), ("b512", 512, 2)):
            results[f"{proto}_{key}_batching_off"] = bench(
                proto, repo, model, batch, clients, seconds, "--target", target
            )
    return results


def run(
    repo: Path, model: str, seconds: float, delay_us: int, threads: int, rounds: int
) -> tuple[dict, dict]:
    """-> (bench results by key, the server's peak RSS in bytes by batching on/off)."""
    results: dict[str, dict] = {}
    memory: dict[str, int] = {}
    print(f"in-process forward ({threads} intra-op thread(s))")
    for key, batch in (("forward_b1", 1), ("forward_b512", 512)):
        results[key] = bench(
            "forward", repo, model, batch, 1, seconds, "--intra-op-threads", threads
        )
    with tempfile.TemporaryDirectory() as tmp:
        for batching in (False, True):
            name = "on" if batching else "off"
            copy = batching_repo(repo, model, Path(tmp) / name, batching, delay_us)
            server = Server(copy, model, threads)
            sleeping = None if batching else Server(copy, model, threads, busy_poll_us=0)
            print(f"rec-server, dynamic batching {name}, {threads} intra-op thread(s)")
            try:
                if not batching:
                    servers = {"": server, "_sleep": sleeping}
                    results.update(run_unbatched(servers, copy, model, seconds, rounds))
                    # B = 512, one client, tensors through the socket and through shared memory:
                    # the p50 over the in-process forward is the transport's cost.
                    for proto, shm in itertools.product(("http", "grpc"), ("none", "system")):
                        target = server.http if proto == "http" else server.grpc
                        key = f"{proto}_b512_c1{'_shm' if shm == 'system' else ''}_batching_off"
                        results[key] = bench(proto, copy, model, 512, 1, seconds, "--target",
                                             target, "--shared-memory", shm)  # fmt: skip
                    continue
                for proto in ("http", "grpc"):
                    target = server.http if proto == "http" else server.grpc
                    for key, batch, clients in (("b1_sat", 1, 16), ("b512", 512, 2)):
                        results[f"{proto}_{key}_batching_on"] = bench(
                            proto, copy, model, batch, clients, seconds, "--target", target
                        )
            finally:
                memory[f"batching_{name}"] = server.peak_rss_bytes()
                server.stop()
                if sleeping is not None:
                    sleeping.stop()
    return results, memory


# Issue #11 items 5 and 6: what summarize() compares against.
TARGETS = {
    "grpc_http_b1_p50_ratio": "<= 1.15",
    "grpc_b512_fraction_of_in_process": ">= 0.85",
    "http_overhead_b1_p50_us": "<= 100 (Kaggle size)",
    "batching_speedup_16_clients": ">= 3 (Kaggle size)",
}


def summarize(r: dict) -> dict:
    fwd1, fwd512 = r["forward_b1"]["p50_us"], r["forward_b512"]["rows_per_s"]
    s = {
        "grpc_http_b1_p50_ratio": r["grpc_b1_batching_off"]["p50_us"]
        / r["http_b1_batching_off"]["p50_us"],
        "grpc_http_b1_p50_ratio_sleeping": r["grpc_b1_batching_off_sleep"]["p50_us"]
        / r["http_b1_batching_off_sleep"]["p50_us"],
        "http_live_p50_us": r["http_live_batching_off"]["p50_us"],
        "grpc_live_p50_us": r["grpc_live_batching_off"]["p50_us"],
    }
    for proto in ("http", "grpc"):
        s[f"{proto}_overhead_b1_p50_us"] = r[f"{proto}_b1_batching_off"]["p50_us"] - fwd1
        s[f"{proto}_overhead_b1_p50_us_sleeping"] = (
            r[f"{proto}_b1_batching_off_sleep"]["p50_us"] - fwd1
        )
        s[f"{proto}_batching_speedup_16_clients"] = (
            r[f"{proto}_b1_sat_batching_on"]["rows_per_s"]
            / r[f"{proto}_b1_sat_batching_off"]["rows_per_s"]
        )
        if f"{proto}_b512_c1_shm_batching_off" in r:  # runs from before shared memory lack it
            fwd512_us = r["forward_b512"]["p50_us"]
            s[f"{proto}_b512_transport_us"] = (
                r[f"{proto}_b512_c1_batching_off"]["p50_us"] - fwd512_us
            )
            s[f"{proto}_b512_transport_us_shm"] = (
                r[f"{proto}_b512_c1_shm_batching_off"]["p50_us"] - fwd512_us
            )
        s[f"{proto}_b512_fraction_of_in_process"] = (
            max(
                r[f"{proto}_b512_batching_off"]["rows_per_s"],
                r[f"{proto}_b512_batching_on"]["rows_per_s"],
            )
            / fwd512
        )
    return s


def table(r: dict) -> str:
    rows = ["| run | B | clients | p50 µs | p99 µs | rows/s |", "|---|---|---|---|---|---|"]
    for key, v in r.items():
        rows.append(
            f"| {key} | {v['batch']} | {v['concurrency']} | {v['p50_us']:.0f} | {v['p99_us']:.0f} "
            f"| {v['rows_per_s']:.0f} |"
        )
    return "\n".join(rows)


def plot(runs: dict[str, dict], path: Path) -> None:
    """Left: what the server adds to the in-process forward at B = 1 (p50), threads polling vs
    sleeping, per model and thread count. Right: 16 B = 1 clients, batching on vs off."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 4.5))
    names = list(runs)
    x = range(len(names))
    bars = (
        ("http_overhead_b1_p50_us", "HTTP, polling (default)"),
        ("http_overhead_b1_p50_us_sleeping", "HTTP, --busy-poll-us 0"),
        ("grpc_overhead_b1_p50_us", "gRPC, polling (default)"),
        ("grpc_overhead_b1_p50_us_sleeping", "gRPC, --busy-poll-us 0"),
    )
    width = 0.8 / len(bars)
    for k, (key, label) in enumerate(bars):
        a.bar([i + (k - 1.5) * width for i in x], [runs[n]["summary"][key] for n in names],
              width, label=label)  # fmt: skip
    a.axhline(100, color="gray", linestyle="--", linewidth=1)
    a.set_xticks(list(x), [n.replace("/intra_op_", "\nintra-op ") for n in names], fontsize=8)
    a.set_ylabel("p50 over the in-process forward (µs), B = 1")
    a.set_title("what the server adds to one B = 1 call")
    a.legend(fontsize=7)
    for k, proto in enumerate(("http", "grpc")):
        b.bar([i + (k - 0.5) * 0.4 for i in x],
              [runs[n]["summary"][f"{proto}_batching_speedup_16_clients"] for n in names],
              0.4, label=proto.upper())  # fmt: skip
    b.axhline(1, color="gray", linewidth=1)
    b.set_xticks(list(x), [n.replace("/intra_op_", "\nintra-op ") for n in names], fontsize=8)
    b.set_ylabel("rows/s batching on / off")
    b.set_title("16 clients at B = 1: dynamic batching's gain")
    b.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def build_repositories(tmp: Path, kaggle_scale: float) -> dict[str, Path]:
    """Trains the default and the Kaggle-size model briefly and exports each (int8 tables) into
    repositories of their own: the default export (fp32 dense layers, rec::linear) as `NAME`,
    with `export.dense_dtype: int8` as `NAME-int8`, and the fp32 one as an AOTInductor package
    (`--format aoti`, model `rec_aoti`) as `NAME-aoti`."""
    from export_bench import REC, model_configs

    fp32, int8 = tmp / "fp32.yaml", tmp / "int8.yaml"
    fp32.write_text("export:\n  dense_dtype: fp32\n")  # criteo_kaggle.yaml's own is int8
    int8.write_text("export:\n  dense_dtype: int8\n")
    repos = {}
    for name, config in model_configs(tmp, kaggle_scale).items():
        run_dir = tmp / f"{name}-run"
        print(f"[{name}] rec train, rec export (fp32 and int8 dense)", flush=True)
        subprocess.run([REC, "train", "-c", str(config), "--run-dir", str(run_dir)], check=True,
                       stdout=subprocess.DEVNULL)  # fmt: skip
        for key, dtype, fmt in ((name, fp32, "torchscript"), (f"{name}-int8", int8, "torchscript"),
                                (f"{name}-aoti", fp32, "aoti")):  # fmt: skip
            repos[key] = tmp / f"{key}-repo"
            subprocess.run(
                [REC, "export", str(run_dir), "--repo", str(repos[key]), "--config", str(dtype),
                 "--format", fmt],
                check=True, stdout=subprocess.DEVNULL,
            )  # fmt: skip
        shutil.rmtree(run_dir)  # the checkpoint: 8.9 GB at full size
    return repos


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repo", type=Path, help="benchmark this repository instead of building both")
    p.add_argument(
        "--kaggle-repo",
        type=Path,
        help="with --repo: a second repository, with the Kaggle-size model (benchmarks both)",
    )
    p.add_argument("--repos", nargs="+", metavar="NAME=DIR",
                   help="benchmark these repositories side by side (e.g. a TorchScript and an "
                   "AOTI export of one model)")  # fmt: skip
    p.add_argument("--kaggle-scale", type=float, default=1.0,
                   help="rows of every Kaggle table x this (1.0: 33.8M rows)")  # fmt: skip
    p.add_argument("--model", default="rec")
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--rounds", type=int, default=3, help="alternating HTTP/gRPC B = 1 rounds")
    p.add_argument("--threads", default="1,2", help="intra-op thread counts to run, e.g. 1,2")
    p.add_argument("--delay-us", type=int, default=500, help="batching window when batching is on")
    p.add_argument("--report", action="store_true", help="redraw from serve_cpp.json and exit")
    p.add_argument("--out", default="serve_cpp",
                   help="results name: benchmarks/results/<name>.json and .png")  # fmt: skip
    args = p.parse_args()
    if args.report:
        report(json.loads((RESULTS / f"{args.out}.json").read_text())["runs"], args.out)
        return
    if not (BUILD / "rec-bench").exists():
        raise SystemExit(f"{BUILD / 'rec-bench'} is missing: run scripts/setup.sh")
    with tempfile.TemporaryDirectory(prefix="serve_cpp_bench-") as tmp:
        if args.repos:
            repos = {n: Path(d) for n, d in (r.split("=", 1) for r in args.repos)}
        elif args.repo:
            repos = {"default": args.repo}
            if args.kaggle_repo:
                repos["kaggle"] = args.kaggle_repo
        else:
            repos = build_repositories(Path(tmp), args.kaggle_scale)
        bench_all(args, repos)


def bench_all(args: argparse.Namespace, repos: dict[str, Path]) -> None:
    runs: dict[str, dict] = {}
    for name, repo in repos.items():
        for threads in (int(t) for t in args.threads.split(",")):
            print(f"== {name} ({repo}), {threads} intra-op thread(s)")
            # An AOTInductor repository's model is <name>_aoti (rec export --format aoti).
            model = args.model if (repo / args.model).is_dir() else f"{args.model}_aoti"
            results, memory = run(repo.resolve(), model, args.seconds, args.delay_us, threads,
                                  args.rounds)  # fmt: skip
            runs[f"{name}/intra_op_{threads}"] = {
                "repository": str(repo),
                "intra_op_threads": threads,
                "results": results,
                "server_peak_rss_bytes": memory,
                "summary": {
                    **summarize(results),
                    "server_peak_rss_gb": max(memory.values()) / 1e9,
                },  # fmt: skip
            }
    from rec.cpu import cpu_info, describe

    out = {
        "machine": {
            "cpus": platform.processor() or platform.machine(),
            "cpu": describe(cpu_info()),
            "cores": os.cpu_count(),
        },
        "model": args.model,
        "server": "--executor-threads 1 --intra-op-threads T --http-threads 1 --grpc-threads 1",
        "kaggle_scale": None if args.repo or args.repos else args.kaggle_scale,
        "targets": TARGETS,
        "runs": runs,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.out}.json").write_text(json.dumps(out, indent=2))
    report(runs, args.out)


def report(runs: dict[str, dict], out: str = "serve_cpp") -> None:
    plot(runs, RESULTS / f"{out}.png")
    for key, run_ in runs.items():
        print(f"\n### {key}\n")
        print(table(run_["results"]))
        for what, peak in run_.get("server_peak_rss_bytes", {}).items():
            print(f"rec-server peak RSS ({what.replace('_', ' ')}): {peak / 1e9:.2f} GB")
    print(json.dumps({k: v["summary"] for k, v in runs.items()}, indent=2))


if __name__ == "__main__":
    main()
