"""gRPC's per-call floor on this machine against rec-server's gRPC, and HTTP beside both.

    .venv/bin/python benchmarks/grpc_floor.py            # ~3 min: trains and exports the default
    .venv/bin/python benchmarks/grpc_floor.py --repo REPO [--model rec]

One client (rec-bench, gRPC's generated stub; HTTP over one keep-alive connection), one call in
flight, batching off. Servers:
- rec-server (1 HTTP, 1 gRPC, 1 executor thread), its threads polling for work (the default)
  and sleeping (`--busy-poll-us 0`);
- grpc-pingpong (cpp/bench): the smallest server that answers ServerLive, built against the same
  gRPC, on an async completion queue with one polling thread (rec-server's design) and on gRPC's
  callback API, both with abseil's Mutex deadlock detection off, and the async one again with
  it on (Debian's abseil default, which rec-server keeps).
Calls: bare liveness (`ServerLive`, `GET /v2/health/live`) on all, `ModelInfer` / HTTP infer at
B = 1 on rec-server, and `ModelInfer` at B = 1 on the async ping-pong, which answers at once with
zero scores: the floor of a call of ModelInfer's size, without a model or a thread hop; and on a
ping-pong that answers it after the model's in-process p50 (`--infer-delay-us`, spent on its
polling thread): the floor of a call that waits for a model. The servers take turns in short
rounds and the median round is kept.
With perf installed, CPU time per call (`perf stat -e task-clock`, the server's process and the
client's, calls counted by the client) is measured for each call in one more pass, sleeping
servers (`--busy-poll-us 0`, so a polling thread's spin is not counted as work): where the
time goes, server or client.
With `--perf`, each rec-server call is also sampled with `perf record` on the server's
process and the top symbols written beside the results.

Writes benchmarks/results/grpc_floor.json and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from rec.benchmarking import BUILD, RESULTS, Server, batching_repo, bench, median_run
from rec.cpu import cpu_info


class PingPong:
    def __init__(self, api: str, deadlock_detection: str = "off", delay_us: int = 0) -> None:
        self.proc = subprocess.Popen(
            [str(BUILD / "grpc-pingpong"), "--port", "0", "--api", api,
             "--absl-deadlock-detection", deadlock_detection, "--infer-delay-us", str(delay_us)],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        line = self.proc.stdout.readline()
        if "listening" not in line:
            raise SystemExit(f"grpc-pingpong ({api}) did not start")
        self.grpc = line.split()[2]  # "listening on 127.0.0.1:PORT (api)"

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def default_repo(tmp: Path) -> Path:
    from export_bench import REC, model_configs

    config = model_configs(tmp, 0.0001)["default"]
    run, repo = tmp / "run", tmp / "repo"
    print("[default] rec train, rec export", flush=True)
    subprocess.run([REC, "train", "-c", str(config), "--run-dir", str(run)], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    subprocess.run([REC, "export", str(run), "--repo", str(repo)], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    return repo


def cpu_per_call(
    pid: int, repo: Path, model: str, mode: str, target: str, call: str, seconds: float
) -> dict:
    """CPU µs per call of the server's process and of the client (rec-bench, its start-up
    included, a few ms over thousands of calls), from perf stat's task-clock."""

    def msec(stderr: str) -> float:  # perf stat -x, : "value,unit,event,..."
        return float(stderr.strip().splitlines()[-1].split(",")[0])

    stat = ["perf", "stat", "-x,", "-e", "task-clock"]
    server = subprocess.Popen([*stat, "-p", str(pid)], stderr=subprocess.PIPE, text=True)
    time.sleep(0.3)
    argv = [str(BUILD / "rec-bench"), mode, "--model-repository", str(repo), "--model", model,
            "--batch", "1", "--seconds", str(seconds), "--target", target, "--call", call,
            "--grpc-client", "stub"]  # fmt: skip
    client = subprocess.run([*stat, *argv], capture_output=True, text=True, check=True)
    server.send_signal(2)
    _, server_err = server.communicate(timeout=30)
    result = json.loads(client.stdout.strip().splitlines()[-1])
    calls = result["rows_per_s"] * seconds
    return {"p50_us": result["p50_us"], "server_cpu_us": msec(server_err) * 1000 / calls,
            "client_cpu_us": msec(client.stderr) * 1000 / calls}  # fmt: skip


def perf_top(pid: int, argv: list[str], out: Path, top: int = 25) -> list[str]:
    """Samples `pid` while `argv` runs; returns the top symbols by self time."""
    data = out.with_suffix(".data")
    rec = subprocess.Popen(["perf", "record", "-F", "4999", "-g", "-o", str(data), "-p", str(pid)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    time.sleep(0.5)
    subprocess.run(argv, check=True, capture_output=True)
    rec.send_signal(2)
    rec.wait(timeout=60)
    report = subprocess.run(
        ["perf", "report", "-i", str(data), "--no-children", "--sort", "dso,sym", "--stdio",
         "-g", "none", "--percent-limit", "0.5"],
        capture_output=True, text=True,
    ).stdout  # fmt: skip
    lines = [ln for ln in report.splitlines() if ln.strip() and not ln.startswith("#")][:top]
    out.write_text("\n".join(lines) + "\n")
    data.unlink(missing_ok=True)
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repo", type=Path)
    p.add_argument("--model", default="rec")
    p.add_argument("--seconds", type=float, default=2.0, help="per round and call")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--perf", action="store_true", help="also profile rec-server with perf")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        src = args.repo or default_repo(tmp)
        repo = batching_repo(src, args.model, tmp / "unbatched", False, 0)
        result = measure(repo, args.model, args.seconds, args.rounds, args.perf)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "grpc_floor.json").write_text(json.dumps(result, indent=2) + "\n")
    print(table(result))


def measure(repo: Path, model: str, seconds: float, rounds: int, profile: bool) -> dict:
    servers = {
        "rec-server": Server(repo, model, 1),
        "rec-server --busy-poll-us 0": Server(repo, model, 1, 0),
    }
    pingpongs = {f"grpc-pingpong {api}": PingPong(api) for api in ("async", "callback")}
    pingpongs["grpc-pingpong async, absl deadlock detection on"] = PingPong("async", "on")
    # ModelInfer answered after the model's own time (its in-process p50 at B = 1), spent on the
    # polling thread: the floor of a call that waits for a model, with no thread hop.
    forward_us = bench("forward", repo, model, 1, 1, seconds, "--intra-op-threads", 1)["p50_us"]
    late = f"grpc-pingpong async, answer after {forward_us:.0f} us"
    pingpongs[late] = PingPong("async", "off", round(forward_us))
    calls = []  # (name, mode, target, call)
    for name, s in servers.items():
        calls += [(f"{name} gRPC ServerLive", "grpc", s.grpc, "live"),
                  (f"{name} HTTP live", "http", s.http, "live"),
                  (f"{name} gRPC ModelInfer B=1", "grpc", s.grpc, "infer"),
                  (f"{name} HTTP infer B=1", "http", s.http, "infer")]  # fmt: skip
    for name, pp in pingpongs.items():
        calls.append((f"{name} gRPC ServerLive", "grpc", pp.grpc, "live"))
    for name in ("grpc-pingpong async", late):
        calls.append((f"{name} gRPC ModelInfer B=1", "grpc", pingpongs[name].grpc, "infer"))
    calls = [c for c in calls if not (c[0].startswith(late) and c[3] == "live")]
    runs: dict[str, list] = {}
    try:
        for _ in range(rounds):
            for name, mode, target, call in calls:
                extra = ("--target", target, "--call", call, "--grpc-client", "stub")
                runs.setdefault(name, []).append(bench(mode, repo, model, 1, 1, seconds, *extra))
        cpu_calls = {}
        if shutil.which("perf"):
            sleeping = servers["rec-server --busy-poll-us 0"]
            procs = {"rec-server --busy-poll-us 0": sleeping, **pingpongs}
            for name, mode, target, call in calls:
                owner = next((k for k in procs if name.startswith(k + " ")), None)
                if owner is None or owner not in ("grpc-pingpong async", late, *servers):
                    continue
                pid = procs[owner].proc.pid
                cpu_calls[name] = cpu_per_call(pid, repo, model, mode, target, call, seconds)
        profiles = {}
        if profile and shutil.which("perf"):
            s = servers["rec-server"]
            for name, mode, target, call in calls[:4]:
                argv = [str(BUILD / "rec-bench"), mode, "--model-repository", str(repo),
                        "--model", model, "--batch", "1", "--seconds", str(seconds),
                        "--target", target, "--call", call, "--grpc-client", "stub"]  # fmt: skip
                slug = name.replace(" ", "_").replace("=", "")
                profiles[name] = perf_top(s.proc.pid, argv, RESULTS / f"grpc_floor_{slug}.txt")
    finally:
        for s in [*servers.values(), *pingpongs.values()]:
            s.stop()
    p50 = {name: median_run(r)["p50_us"] for name, r in runs.items()}
    sleep = "rec-server --busy-poll-us 0"
    pairs = {  # ratio -> (numerator, denominator)
        "rec-server ServerLive / pingpong async": (
            "rec-server gRPC ServerLive", "grpc-pingpong async gRPC ServerLive"),
        "rec-server ServerLive / pingpong callback": (
            "rec-server gRPC ServerLive", "grpc-pingpong callback gRPC ServerLive"),
        "pingpong async, absl deadlock detection on / off": (
            "grpc-pingpong async, absl deadlock detection on gRPC ServerLive",
            "grpc-pingpong async gRPC ServerLive"),
        "gRPC / HTTP, live": ("rec-server gRPC ServerLive", "rec-server HTTP live"),
        "gRPC / HTTP, infer B=1": ("rec-server gRPC ModelInfer B=1", "rec-server HTTP infer B=1"),
        "gRPC / HTTP, infer B=1, --busy-poll-us 0": (
            f"{sleep} gRPC ModelInfer B=1", f"{sleep} HTTP infer B=1"),
        "pingpong ModelInfer / pingpong ServerLive": (
            "grpc-pingpong async gRPC ModelInfer B=1", "grpc-pingpong async gRPC ServerLive"),
        "rec-server ModelInfer / pingpong ModelInfer": (
            "rec-server gRPC ModelInfer B=1", "grpc-pingpong async gRPC ModelInfer B=1"),
        "rec-server ModelInfer / pingpong ModelInfer answered after the forward's time": (
            "rec-server gRPC ModelInfer B=1", f"{late} gRPC ModelInfer B=1"),
    }  # fmt: skip
    ratios = {name: p50[a] / p50[b] for name, (a, b) in pairs.items()}
    # What rec-server adds to a call (the model, the hand-off to the executor and back), over
    # each protocol's floor: HTTP's bare round trip, gRPC's ping-pong ModelInfer.
    added = {
        "HTTP: infer B=1 - live": p50["rec-server HTTP infer B=1"] - p50["rec-server HTTP live"],
        "gRPC: ModelInfer B=1 - pingpong ModelInfer B=1": (
            p50["rec-server gRPC ModelInfer B=1"] - p50["grpc-pingpong async gRPC ModelInfer B=1"]),
        "gRPC: pingpong answered after the forward's time - pingpong": (
            p50[f"{late} gRPC ModelInfer B=1"] - p50["grpc-pingpong async gRPC ModelInfer B=1"]),
        "in-process forward p50, B=1": forward_us,
    }  # fmt: skip
    cpu = cpu_info()
    return {
        "cpu": cpu["model"],
        "amx": "amx_tile" in cpu["flags"],
        "avx512f": "avx512f" in cpu["flags"],
        "date": time.strftime("%Y-%m-%d"),
        "p50_us": p50,
        "p99_us": {name: median_run(r)["p99_us"] for name, r in runs.items()},
        "ratios": ratios,
        "rec_server_added_us": added,
        "cpu_us_per_call": cpu_calls,
        "perf_top": profiles,
    }


def table(r: dict) -> str:
    amx = "AMX" if r["amx"] else "no AMX"
    lines = [f"CPU: {r['cpu']} ({'AVX-512' if r['avx512f'] else 'AVX2 only'}, {amx}), {r['date']}",
             "", "| call | p50 (µs) | p99 (µs) |", "|---|---|---|"]  # fmt: skip
    lines += [f"| {n} | {v:,.0f} | {r['p99_us'][n]:,.0f} |" for n, v in r["p50_us"].items()]
    lines += ["", "| ratio | value |", "|---|---|"]
    lines += [f"| {n} | {v:.2f} |" for n, v in r["ratios"].items()]
    lines += ["", "| rec-server's time over the protocol's floor | µs |", "|---|---|"]
    lines += [f"| {n} | {v:,.0f} |" for n, v in r.get("rec_server_added_us", {}).items()]
    if r.get("cpu_us_per_call"):
        lines += ["", "| call (servers sleeping) | p50 | server CPU / call | client CPU / call |",
                  "|---|---|---|---|"]  # fmt: skip
        for n, c in r["cpu_us_per_call"].items():
            cells = (c["p50_us"], c["server_cpu_us"], c["client_cpu_us"])
            lines.append(f"| {n} | " + " | ".join(f"{v:,.0f}" for v in cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
