"""Where a request's time goes in rec-server, from the server's own trace timestamps (issue #23):
HTTP against gRPC at B = 1, and B = 512 with its tensors through the socket and through system
shared memory, on the default model and the Criteo Kaggle-size one, one run; and what tracing
costs when it is off.

    .venv/bin/python benchmarks/serve_breakdown.py --repo DEFAULT_REPO --kaggle-repo KAGGLE_REPO
    .venv/bin/python benchmarks/serve_breakdown.py              # trains and exports both first
    .venv/bin/python benchmarks/serve_breakdown.py --report     # tables from the JSON again

Each case starts rec-server (one executor, one HTTP and one gRPC thread, --trace-file), turns
tracing on for every request (trace_rate 1), runs rec-bench with one client and dynamic
batching off (as serve_cpp_bench.py does: no window to wait out), then stops the server, which
writes the trace file.
Each traced request is cut at its timestamps into:

- receive: HTTP_RECV_START -> HTTP_RECV_END (HTTP; gRPC reads the message before rec-server sees
  it, so there it is outside);
- decode: HTTP_RECV_END or GRPC_WAITREAD_END -> QUEUE_START: parse, validate, the shared-memory
  read, the hand-off to the batcher;
- queue: QUEUE_START -> COMPUTE_START, the executor thread picking it up;
- input, infer, output: the COMPUTE_* stamps (assembling the batch, the forward, the slices);
- respond: COMPUTE_END -> REQUEST_END, the response encoded (or written into shared memory);
- hop back: REQUEST_END -> HTTP_SEND_START or GRPC_SEND_START, the answer handed from the
  executor to the protocol's thread;
- send: the SEND_START -> SEND_END stamps, the write (gRPC's ends when gRPC reports it done);
- outside: the client's p50 minus the median span from the first stamp to the last: the socket,
  the client's own encode and decode, the thread hops before the first stamp and after the last.

Tracing adds its own cost (a lock per stamp), so the traced p50s are a little above the untraced
ones, which are measured too. "trace off": B = 1 p50 against a server with no --trace-file, in
alternating rounds with one that has a trace file and tracing turned off (the check per request
is one relaxed atomic load, Tracer::Start). Writes benchmarks/results/serve_breakdown.json and
prints Markdown tables.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path

from rec import benchmarking
from rec.benchmarking import RESULTS, batching_repo, bench, median_run, trained_repositories

PHASES = {  # name: (start stamp, end stamp); read, send_start, send_end: either protocol's
    "receive": ("HTTP_RECV_START", "HTTP_RECV_END"),
    "decode": ("read", "QUEUE_START"),
    "queue": ("QUEUE_START", "COMPUTE_START"),
    "input": ("COMPUTE_START", "COMPUTE_INPUT_END"),
    "infer": ("COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START"),
    "output": ("COMPUTE_OUTPUT_START", "COMPUTE_END"),
    "respond": ("COMPUTE_END", "REQUEST_END"),
    "hop back": ("REQUEST_END", "send_start"),
    "send": ("send_start", "send_end"),
}
ALIASES = {
    "read": ("HTTP_RECV_END", "GRPC_WAITREAD_END"),
    "send_start": ("HTTP_SEND_START", "GRPC_SEND_START"),
    "send_end": ("HTTP_SEND_END", "GRPC_SEND_END"),
}
CASES = (  # name, protocol, batch, shared memory
    ("HTTP B=1", "http", 1, "none"),
    ("gRPC B=1", "grpc", 1, "none"),
    ("HTTP B=512", "http", 512, "none"),
    ("HTTP B=512 shm", "http", 512, "system"),
    ("gRPC B=512", "grpc", 512, "none"),
    ("gRPC B=512 shm", "grpc", 512, "system"),
)


class Server(benchmarking.Server):
    """rec-server as serve_cpp_bench runs it (one thread of each kind); `trace_file` given:
    tracing possible (and off until turned on)."""

    extra: tuple[str, ...] = ()  # more rec-server arguments (--server-arg)

    def __init__(self, repo: Path, model: str, trace_file: Path | None = None) -> None:
        traced = ("--trace-file", str(trace_file)) if trace_file is not None else ()
        super().__init__(repo, model, 1, extra=(*traced, *self.extra))

    def trace_every_request(self) -> None:
        body = {"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_count": "-1",
                "log_frequency": "0"}  # fmt: skip
        req = urllib.request.Request(f"http://{self.http}/v2/trace/setting",
                                     data=json.dumps(body).encode(), method="POST")  # fmt: skip
        urllib.request.urlopen(req, timeout=10).read()


def model_name(repo: Path) -> str:
    return "rec" if (repo / "rec").is_dir() else "rec_aoti"


def traced_requests(path: Path) -> list[dict[str, int]]:
    """Triton's JSON trace format: per request one entry with its model, then one entry per
    timestamp, all with the request's id. -> one {stamp name: ns} per request."""
    by_id: dict[int, dict[str, int]] = {}
    for entry in json.loads(path.read_text()):
        for ts in entry.get("timestamps", []):
            by_id.setdefault(entry["id"], {})[ts["name"]] = int(ts["ns"])
    return list(by_id.values())


def split(stamps: dict[str, int]) -> dict[str, float]:
    """One request's phases in µs."""
    at = dict(stamps)
    for alias, names in ALIASES.items():
        for n in names:
            if n in stamps:
                at[alias] = stamps[n]
    out = {}
    for phase, (a, b) in PHASES.items():
        if a in at and b in at:
            out[phase] = (at[b] - at[a]) / 1000
    out["server"] = (max(stamps.values()) - min(stamps.values())) / 1000
    return out


def run_case(repo: Path, proto: str, batch: int, shm: str, seconds: float, tmp: Path) -> dict:
    model = model_name(repo)
    trace = tmp / f"trace-{proto}-{batch}-{shm}.json"
    server = Server(repo, model, trace)
    try:
        server.trace_every_request()
        target = server.http if proto == "http" else server.grpc
        client = bench(proto, repo, model, batch, 1, seconds, "--target", target,
                       "--shared-memory", shm)  # fmt: skip
        peak = server.peak_rss_bytes()
    finally:
        server.stop()
    requests = [split(s) for s in traced_requests(trace)]
    phases = {p: statistics.median(r[p] for r in requests) for p in requests[0]}
    phases["outside"] = client["p50_us"] - phases["server"]
    return {"client": client, "traced": len(requests), "phases_p50_us": phases,
            "server_peak_rss_bytes": peak}  # fmt: skip


def trace_off_cost(repo: Path, seconds: float, rounds: int, tmp: Path) -> dict:
    """B = 1 p50, HTTP and gRPC, on a server without a trace file against one with a trace file
    and tracing off, in alternating rounds (median kept)."""
    model = model_name(repo)
    servers = {"no trace file": Server(repo, model), "tracing off": Server(repo, model, tmp / "t")}
    runs: dict[str, list] = {}
    try:
        short = max(1.0, seconds / rounds)
        for _ in range(rounds):
            for name, server in servers.items():
                for proto in ("http", "grpc"):
                    target = server.http if proto == "http" else server.grpc
                    r = bench(proto, repo, model, 1, 1, short, "--target", target)
                    runs.setdefault(f"{proto} {name}", []).append(r)
    finally:
        for s in servers.values():
            s.stop()
    return {k: median_run(v)["p50_us"] for k, v in runs.items()}


def run_model(src: Path, seconds: float, rounds: int, only: list[str]) -> dict:
    with tempfile.TemporaryDirectory(prefix="serve_breakdown-") as tmp:
        # Batching off, so a lone request does not wait out the batching window.
        repo = batching_repo(src, model_name(src), Path(tmp) / "repo", False, 0)
        forward = {str(b): bench("forward", repo, model_name(repo), b, 1, seconds,
                            "--intra-op-threads", 1)["p50_us"] for b in (1, 512)}  # fmt: skip
        cases = {name: run_case(repo, proto, batch, shm, seconds, Path(tmp))
                 for name, proto, batch, shm in CASES if name in only}  # fmt: skip
        off = trace_off_cost(repo, seconds, rounds, Path(tmp))
    return {"repository": str(src), "forward_p50_us": forward, "cases": cases, "trace_off": off}


def table(runs: dict[str, dict]) -> str:
    names = list(PHASES) + ["server", "outside"]
    lines = []
    for model, r in runs.items():
        fwd = r["forward_p50_us"]
        lines.append(f"\n{model}: in-process forward p50 B = 1 {fwd['1']:.0f} µs, "
                     f"B = 512 {fwd['512']:.0f} µs\n")  # fmt: skip
        lines.append("| case | client p50 | " + " | ".join(names) + " | server peak RSS |")
        lines.append("|---" * (len(names) + 3) + "|")
        for case, c in r["cases"].items():
            p = c["phases_p50_us"]
            cells = [f"{p[n]:,.0f}" if n in p else "" for n in names]
            rss = c["server_peak_rss_bytes"] / 1e9
            lines.append(f"| {case} | {c['client']['p50_us']:,.0f} | " + " | ".join(cells)
                         + f" | {rss:.2f} GB |")  # fmt: skip
        off = r["trace_off"]
        lines.append(
            "\ntrace off, B = 1 p50 (no trace file / trace file, tracing off): "
            + ", ".join(
                f"{p} {off[f'{p} no trace file']:.0f} / {off[f'{p} tracing off']:.0f} µs"
                for p in ("http", "grpc")
            )
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repo", type=Path, help="the default model's repository")
    p.add_argument("--kaggle-repo", type=Path, help="the Kaggle-size model's repository")
    p.add_argument("--kaggle-scale", type=float, default=1.0)
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--report", action="store_true")
    p.add_argument("--server-arg", action="append", default=[],
                   help="a rec-server argument: --server-arg=--busy-poll-us=0")  # fmt: skip
    p.add_argument("--cases", help="only these cases, comma-separated (e.g. 'gRPC B=1')")
    args = p.parse_args()
    Server.extra = tuple(a for arg in args.server_arg for a in arg.split("=", 1))
    out = RESULTS / "serve_breakdown.json"
    if args.report:
        print(table(json.loads(out.read_text())["runs"]))
        return
    from rec.cpu import cpu_info, describe

    with tempfile.TemporaryDirectory(prefix="serve_breakdown-repos-") as tmp:
        if args.repo:
            repos = {"default": args.repo}
            if args.kaggle_repo:
                repos["kaggle"] = args.kaggle_repo
        else:
            repos = trained_repositories(Path(tmp), args.kaggle_scale)
        runs = {}
        for name, repo in repos.items():
            print(f"== {name} ({repo})", flush=True)
            only = args.cases.split(",") if args.cases else [c[0] for c in CASES]
            runs[name] = run_model(repo.resolve(), args.seconds, args.rounds, only)
    result = {"cpu": describe(cpu_info()), "date": time.strftime("%Y-%m-%d"), "runs": runs}
    RESULTS.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(table(runs))


if __name__ == "__main__":
    main()
