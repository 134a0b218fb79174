"""rec-server benchmark: in-process TorchScript forward (the limit) vs the server over HTTP
(binary tensors) and gRPC, on one model and one machine, with the C++ load generator rec-bench.

    .venv/bin/python benchmarks/serve_cpp_bench.py --repo model_repository --model rec

Runs: p50/p99 at B = 1 with one client (batching off: the server's own overhead; batching on:
plus the batching window), saturation throughput of B = 1 requests (16 clients) with batching
off and on, and B = 512 throughput. The server runs with one executor thread and one intra-op
thread, like the in-process loop. Client and server share the machine's cores, so the numbers
are a lower bound of what the server does alone.

Writes benchmarks/results/serve_cpp.json and serve_cpp.png and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build" / "cpp"
RESULTS = ROOT / "benchmarks" / "results"
READY = re.compile(r"^rec-server ready http=(\S+) grpc=(\S+) metrics=(\S+)")


def batching_repo(src: Path, model: str, dst: Path, batching: bool, delay_us: int) -> Path:
    """A copy of the model with dynamic batching on (delay_us window) or off."""
    shutil.copytree(src / model, dst / model)
    config = dst / model / "config.pbtxt"
    text = re.sub(r"dynamic_batching\s*\{[^}]*\}", "", config.read_text())
    if "max_batch_size: 0" in text:
        # The `none` form: rec-server batches it with rec.json's "serving" settings, and serves
        # it one request per forward without them.
        manifest_path = dst / model / "rec.json"
        manifest = json.loads(manifest_path.read_text())
        if batching:
            manifest["serving"]["max_queue_delay_us"] = delay_us
        else:
            manifest.pop("serving", None)
        manifest_path.write_text(json.dumps(manifest, indent=2))
        return dst
    if batching:
        text += f"\ndynamic_batching {{ max_queue_delay_microseconds: {delay_us} }}\n"
    config.write_text(text)
    return dst


class Server:
    def __init__(self, repo: Path, model: str) -> None:
        argv = [str(BUILD / "rec-server"), "--model-repository", str(repo), "--model", model]
        argv += ["--http-port", "0", "--grpc-port", "0", "--metrics-port", "0"]
        argv += ["--executor-threads", "1", "--intra-op-threads", "1", "--http-threads", "1"]
        self.proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        for line in self.proc.stdout:
            m = READY.match(line)
            if m:
                self.http, self.grpc, _ = m.groups()
                return
        raise SystemExit("rec-server did not start")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def bench(mode: str, repo: Path, model: str, batch: int, clients: int, seconds: float, target=""):
    argv = [str(BUILD / "rec-bench"), mode, "--model-repository", str(repo), "--model", model]
    argv += ["--batch", str(batch), "--concurrency", str(clients), "--seconds", str(seconds)]
    if target:
        argv += ["--target", target]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    result = json.loads(out.strip().splitlines()[-1])
    print(
        f"  {mode:8s} B={batch:<4d} clients={clients:<3d} p50={result['p50_us']:9.1f}us "
        f"p99={result['p99_us']:9.1f}us {result['rows_per_s']:10.0f} rows/s"
    )
    return result


def run(repo: Path, model: str, seconds: float, delay_us: int) -> dict:
    results: dict[str, dict] = {}
    print("in-process forward (1 thread)")
    results["forward_b1"] = bench("forward", repo, model, 1, 1, seconds)
    results["forward_b512"] = bench("forward", repo, model, 512, 1, seconds)
    with tempfile.TemporaryDirectory() as tmp:
        for batching in (False, True):
            name = "on" if batching else "off"
            copy = batching_repo(repo, model, Path(tmp) / name, batching, delay_us)
            server = Server(copy, model)
            print(f"rec-server, dynamic batching {name}")
            try:
                for proto in ("http", "grpc"):
                    target = server.http if proto == "http" else server.grpc
                    for key, batch, clients in (("b1", 1, 1), ("b1_sat", 1, 16), ("b512", 512, 2)):
                        results[f"{proto}_{key}_batching_{name}"] = bench(
                            proto, copy, model, batch, clients, seconds, target
                        )
            finally:
                server.stop()
    return results


def summarize(r: dict) -> dict:
    fwd1, fwd512 = r["forward_b1"]["p50_us"], r["forward_b512"]["rows_per_s"]
    s = {}
    for proto in ("http", "grpc"):
        s[f"{proto}_overhead_b1_p50_us"] = r[f"{proto}_b1_batching_off"]["p50_us"] - fwd1
        s[f"{proto}_batching_speedup_b1"] = (
            r[f"{proto}_b1_sat_batching_on"]["rows_per_s"]
            / r[f"{proto}_b1_sat_batching_off"]["rows_per_s"]
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


def plot(r: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    lat = [
        "forward_b1",
        "http_b1_batching_off",
        "grpc_b1_batching_off",
        "http_b1_batching_on",
        "grpc_b1_batching_on",
    ]
    x = range(len(lat))
    a.bar([i - 0.2 for i in x], [r[k]["p50_us"] for k in lat], 0.4, label="p50")
    a.bar([i + 0.2 for i in x], [r[k]["p99_us"] for k in lat], 0.4, label="p99")
    a.set_xticks(list(x), [k.replace("_batching", "\nbatching") for k in lat], fontsize=7)
    a.set_ylabel("latency (µs), B = 1, one client")
    a.legend()
    thr = [
        "http_b1_sat_batching_off",
        "http_b1_sat_batching_on",
        "grpc_b1_sat_batching_off",
        "grpc_b1_sat_batching_on",
        "forward_b512",
        "http_b512_batching_off",
        "grpc_b512_batching_off",
    ]
    b.bar(range(len(thr)), [r[k]["rows_per_s"] for k in thr], color="tab:green")
    b.set_xticks(range(len(thr)), [k.replace("_batching", "\nbatching") for k in thr], fontsize=7)
    b.set_ylabel("rows / s")
    b.set_yscale("log")
    fig.suptitle("rec-server vs in-process TorchScript (same model, same 2-core machine)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repo", type=Path, default=ROOT / "model_repository")
    p.add_argument("--model", default="rec")
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--delay-us", type=int, default=500, help="batching window when batching is on")
    args = p.parse_args()
    if not (BUILD / "rec-bench").exists():
        raise SystemExit(f"{BUILD / 'rec-bench'} is missing: run scripts/setup.sh")
    results = run(args.repo.resolve(), args.model, args.seconds, args.delay_us)
    out = {
        "machine": {
            "cpus": platform.processor() or platform.machine(),
            "cores": __import__("os").cpu_count(),
        },
        "model_repository": str(args.repo),
        "model": args.model,
        "server": "--executor-threads 1 --intra-op-threads 1 --http-threads 1",
        "results": results,
        "summary": summarize(results),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "serve_cpp.json").write_text(json.dumps(out, indent=2))
    plot(results, RESULTS / "serve_cpp.png")
    print(table(results))
    print(json.dumps(out["summary"], indent=2))


if __name__ == "__main__":
    main()
