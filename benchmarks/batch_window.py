"""Dynamic batching's window in rec-server: off, fixed (Triton's meaning: wait out
max_queue_delay_microseconds unless a batch fills) and adaptive (rec-server's default: close
the window after the model's recent mean forward pass when that is shorter), on the small
default model and the Criteo Kaggle-size one, in one run.

    .venv/bin/python benchmarks/batch_window.py                      # ~15 min, ~12 GB at peak
    .venv/bin/python benchmarks/batch_window.py --kaggle-scale 0.05  # a quick look
    .venv/bin/python benchmarks/batch_window.py --repos default=DIR kaggle=DIR2

Without --repos it trains both models briefly and exports each as its config says
(rec/benchmarking.py's trained_repositories). For each model, three rec-server processes
run side by side (one executor, one intra-op thread, one HTTP and one gRPC thread each), one
per policy, on copies of the repository whose window is --delay-us (export's default, 500).
For each protocol and closed-loop client count at B = 1, the three are measured back to back in
--rounds short rounds (the median kept), so other work on the shared machine hits all alike.
Then open loop over HTTP: Poisson arrivals at --loads shares of the best closed-loop rate, the
latency counted from each request's scheduled arrival (rec-bench --rate).
Each cell also records the rows per forward pass and the window the server reports
(rec_batch_window_us); each server's peak RSS is kept.

Writes benchmarks/results/batch_window.json and batch_window.png and prints Markdown tables
with the ratios adaptive / fixed and adaptive / off.
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
import time
import urllib.request
from pathlib import Path

from rec.benchmarking import Server, batching_repo, bench, median_run, trained_repositories

RESULTS = Path(__file__).resolve().parent / "results"
POLICIES = ("off", "fixed", "adaptive")
PROTOCOLS = ("http", "grpc")


def server_counts(server: Server, model: str) -> dict[str, float]:
    """Rows and forward passes so far (the KServe statistics) and the window now (the gauge)."""
    with urllib.request.urlopen(f"http://{server.http}/v2/models/{model}/stats", timeout=10) as r:
        stats = json.load(r)["model_stats"][0]
    metrics_url = f"http://{server.process.endpoints.metrics}/metrics"
    with urllib.request.urlopen(metrics_url, timeout=10) as r:
        text = r.read().decode()
    window = re.search(rf'^rec_batch_window_us\{{model="{re.escape(model)}"[^}}]*\}} (\S+)$',
                       text, re.M)  # fmt: skip
    return {
        "rows": stats["inference_count"],
        "passes": stats["execution_count"],
        "window_us": float(window.group(1)) if window else float("nan"),
    }


def rounds(servers: dict[str, Server], model: str, args, run) -> dict[str, dict]:
    """Per policy, the median of --rounds runs of `run(server)` (the policies back to back in
    each round, so other work on the shared machine hits all alike), with the mean rows per
    forward pass over all of them and the window the server reported after the last."""
    runs: dict[str, list[dict]] = {p: [] for p in servers}
    counts: dict[str, list[dict]] = {p: [] for p in servers}
    for _ in range(args.rounds):
        for policy, server in servers.items():
            before = server_counts(server, model)
            runs[policy].append(run(server))
            counts[policy].append({"before": before, "after": server_counts(server, model)})
    out = {}
    for policy in servers:
        rows = sum(c["after"]["rows"] - c["before"]["rows"] for c in counts[policy])
        passes = sum(c["after"]["passes"] - c["before"]["passes"] for c in counts[policy])
        best = median_run(runs[policy])
        out[policy] = {
            "rows_per_s": best["rows_per_s"],
            "p50_us": best["p50_us"],
            "p99_us": best["p99_us"],
            "failures": best["failures"],
            "late": best["late"],
            "requests": best["requests"],
            "rows_per_pass": rows / passes if passes else 0.0,
            "window_us": counts[policy][-1]["after"]["window_us"],
        }
    return out


def measure(servers: dict[str, Server], repo: Path, model: str, args) -> list[dict]:
    """Closed loop: one row per (protocol, clients, policy)."""
    cells = []
    for proto in PROTOCOLS:
        for clients in args.clients:

            def run(server: Server, proto=proto, clients=clients) -> dict:
                target = server.http if proto == "http" else server.grpc
                return bench(proto, repo, model, 1, clients, args.seconds, "--target", target)

            for policy, cell in rounds(servers, model, args, run).items():
                cells.append({"protocol": proto, "clients": clients, "policy": policy, **cell})
    return cells


def measure_open(servers: dict[str, Server], repo: Path, model: str, capacity: float,
                 args) -> list[dict]:  # fmt: skip
    """Open loop over HTTP: Poisson arrivals at --loads times `capacity` (the best closed-loop
    rows/s of any policy). Latency counts from each request's scheduled arrival, so an
    overloaded policy shows its queue. "late": requests rec-bench sent over 1 ms after their
    arrival (its threads were busy: on 2 shared cores, near capacity the load generator itself
    falls behind)."""
    cells = []
    for load in args.loads:
        rate = load * capacity

        def run(server: Server, rate=rate) -> dict:
            flags = ("--target", server.http, "--rate", f"{rate:.1f}")
            return bench("http", repo, model, 1, args.open_threads, args.seconds, *flags)

        for policy, cell in rounds(servers, model, args, run).items():
            cells.append({"load": load, "offered_per_s": rate, "policy": policy, **cell})
    return cells


def run_model(name: str, repo: Path, args) -> dict:
    model = args.model
    with tempfile.TemporaryDirectory() as tmp:
        servers: dict[str, Server] = {}
        try:
            for policy in POLICIES:
                copy = batching_repo(repo, model, Path(tmp) / policy, policy != "off",
                                     args.delay_us)  # fmt: skip
                extra = () if policy == "off" else ("--batch-window", policy)
                servers[policy] = Server(copy, model, 1, extra=extra)
            print(f"[{name}] three servers up: {', '.join(POLICIES)}", flush=True)
            cells = measure(servers, Path(tmp) / "fixed", model, args)
            capacity = max(c["rows_per_s"] for c in cells if c["protocol"] == "http")
            open_cells = measure_open(servers, Path(tmp) / "fixed", model, capacity, args)
        finally:
            peaks = {p: s.peak_rss_bytes() for p, s in servers.items()}
            for s in servers.values():
                s.stop()
    return {"repository": str(repo), "cells": cells, "open_loop": open_cells,
            "http_capacity_rows_per_s": capacity, "server_peak_rss_bytes": peaks}  # fmt: skip


def cell(cells: list[dict], proto: str, clients: int, policy: str) -> dict:
    return next(c for c in cells if (c["protocol"], c["clients"], c["policy"]) ==
                (proto, clients, policy))  # fmt: skip


def ratios(cells: list[dict]) -> list[dict]:
    out = []
    for proto in PROTOCOLS:
        for clients in sorted({c["clients"] for c in cells}):
            off, fixed, adaptive = (cell(cells, proto, clients, p) for p in POLICIES)
            out.append({
                "protocol": proto,
                "clients": clients,
                "adaptive_over_fixed_rows_per_s": adaptive["rows_per_s"] / fixed["rows_per_s"],
                "adaptive_over_off_rows_per_s": adaptive["rows_per_s"] / off["rows_per_s"],
                "fixed_over_off_rows_per_s": fixed["rows_per_s"] / off["rows_per_s"],
                "adaptive_over_fixed_p99": adaptive["p99_us"] / fixed["p99_us"],
            })  # fmt: skip
    return out


def table(name: str, m: dict) -> str:
    lines = [
        f"**{name}** (peak RSS off / fixed / adaptive: "
        + " / ".join(f"{m['server_peak_rss_bytes'][p] / 1e9:.2f}" for p in POLICIES)
        + " GB)",
        "",
        "| protocol | clients | rows/s off / fixed / adaptive | adaptive / fixed | adaptive / off "
        "| p99 µs fixed → adaptive | rows per pass fixed / adaptive | adaptive window µs |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in ratios(m["cells"]):
        proto, clients = r["protocol"], r["clients"]
        off, fixed, adaptive = (cell(m["cells"], proto, clients, p) for p in POLICIES)
        lines.append(
            f"| {proto} | {clients} | {off['rows_per_s']:,.0f} / {fixed['rows_per_s']:,.0f} / "
            f"{adaptive['rows_per_s']:,.0f} | {r['adaptive_over_fixed_rows_per_s']:.2f}x | "
            f"{r['adaptive_over_off_rows_per_s']:.2f}x | {fixed['p99_us']:,.0f} → "
            f"{adaptive['p99_us']:,.0f} | {fixed['rows_per_pass']:.1f} / "
            f"{adaptive['rows_per_pass']:.1f} | {adaptive['window_us']:,.0f} |"
        )
    lines += [
        "",
        f"Open loop, HTTP, Poisson arrivals (load 1.0 = {m['http_capacity_rows_per_s']:,.0f} "
        "rows/s, the best closed-loop rate above):",
        "",
        "| load | offered rows/s | rows/s off / fixed / adaptive | p50 µs off / fixed / adaptive "
        "| p99 µs off / fixed / adaptive | adaptive / fixed p99 | rows per pass fixed / adaptive "
        "| failed off / fixed / adaptive | sent > 1 ms late, adaptive |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for load in sorted({c["load"] for c in m["open_loop"]}):
        by = {c["policy"]: c for c in m["open_loop"] if c["load"] == load}
        fixed, adaptive = by["fixed"], by["adaptive"]

        def trio(key: str, fmt: str = ",.0f", by=by) -> str:
            return " / ".join(format(by[p][key], fmt) for p in POLICIES)

        lines.append(
            f"| {load:.2f} | {fixed['offered_per_s']:,.0f} | {trio('rows_per_s')} | "
            f"{trio('p50_us')} | {trio('p99_us')} | {adaptive['p99_us'] / fixed['p99_us']:.2f}x | "
            f"{fixed['rows_per_pass']:.1f} / {adaptive['rows_per_pass']:.1f} | "
            f"{trio('failures', 'd')} | {adaptive['late'] / max(1, adaptive['requests']):.0%} |"
        )
    return "\n".join(lines)


def plot(result: dict, path: Path) -> None:
    """Per model: rows/s and p99 against clients, a line per policy, HTTP solid, gRPC dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = result["models"]
    fig, axes = plt.subplots(len(models), 3, figsize=(17, 4 * len(models)), squeeze=False)
    for row, (name, m) in zip(axes, models.items(), strict=True):
        for policy, color in zip(POLICIES, ("gray", "tab:orange", "tab:blue"), strict=True):
            for proto, style in zip(PROTOCOLS, ("-", "--"), strict=True):
                pts = sorted((c for c in m["cells"]
                              if c["policy"] == policy and c["protocol"] == proto),
                             key=lambda c: c["clients"])  # fmt: skip
                xs = [c["clients"] for c in pts]
                label = f"{policy}, {'HTTP' if proto == 'http' else 'gRPC'}"
                row[0].plot(xs, [c["rows_per_s"] for c in pts], style, color=color, marker="o",
                            label=label)  # fmt: skip
                row[1].plot(xs, [c["p99_us"] / 1e3 for c in pts], style, color=color, marker="o",
                            label=label)  # fmt: skip
            pts = sorted((c for c in m["open_loop"] if c["policy"] == policy),
                         key=lambda c: c["load"])  # fmt: skip
            for key, style in (("p99_us", "-"), ("p50_us", ":")):
                row[2].plot([c["offered_per_s"] for c in pts], [c[key] / 1e3 for c in pts], style,
                            color=color, marker="o", label=f"{policy}, {key[:3]}")  # fmt: skip
        row[2].set_xlabel("offered rows/s (open loop, Poisson, HTTP)")
        row[2].set_ylabel("latency from arrival (ms)")
        row[2].set_yscale("log")
        row[2].set_title(f"{name} model, open loop")
        row[2].grid(alpha=0.3)
        row[2].legend(fontsize=7)
        for ax, ylabel in zip(row[:2], ("rows/s (B = 1 requests)", "p99 (ms)"), strict=True):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("closed-loop clients")
            ax.set_ylabel(ylabel)
            ax.set_title(f"{name} model")
            ax.grid(alpha=0.3)
        row[1].set_yscale("log")
        row[0].legend(fontsize=7)
    fig.suptitle(f"rec-server batching window, {result['meta']['cpu']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:

    from rec.cpu import cpu_info, describe

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repos", nargs="+", metavar="NAME=DIR",
                   help="model repositories to use instead of training both")  # fmt: skip
    p.add_argument("--kaggle-scale", type=float, default=1.0,
                   help="Kaggle tables' share of their real row counts")  # fmt: skip
    p.add_argument("--model", default="rec")
    p.add_argument("--clients", type=lambda s: [int(x) for x in s.split(",")], default="1,4,16,64")
    p.add_argument("--loads", type=lambda s: [float(x) for x in s.split(",")],
                   default="0.1,0.4,0.8",
                   help="open-loop rates, shares of the best closed-loop HTTP rows/s")  # fmt: skip
    p.add_argument("--open-threads", type=int, default=128,
                   help="rec-bench threads carrying the open-loop stream")  # fmt: skip
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--delay-us", type=int, default=500, help="max_queue_delay_us of both windows")
    p.add_argument("--out", default="batch_window")
    args = p.parse_args()
    info = cpu_info()
    result = {
        "meta": {
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "cpu": describe(info),
            "cpu_flags": info["flags"],
            "args": {k: v for k, v in vars(args).items() if k != "repos"},
        },
        "models": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        if args.repos:
            repos = {k: Path(v) for k, v in (r.split("=", 1) for r in args.repos)}
        else:
            repos = trained_repositories(Path(tmp), args.kaggle_scale)
        for name, repo in repos.items():
            result["models"][name] = run_model(name, repo, args)
            result["models"][name]["ratios"] = ratios(result["models"][name]["cells"])
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.out}.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(result, RESULTS / f"{args.out}.png")
    print(f"\nCPU: {result['meta']['cpu']}; window {args.delay_us} us; B = 1\n")
    for name, m in result["models"].items():
        print(table(name, m) + "\n")
    print(f"wrote {RESULTS / args.out}.json and .png")


if __name__ == "__main__":
    main()
