"""rec-server A/B: B = 1 HTTP throughput of two builds of the server at two git revisions, on the
same export and the same op library, in interleaved wrk runs.

    .venv/bin/python benchmarks/serve_ab.py                       # 15fa6c6 vs HEAD, 5 pairs of 10 s
    .venv/bin/python benchmarks/serve_ab.py --revs 15fa6c6 HEAD --pairs 7 --seconds 15
    .venv/bin/python benchmarks/serve_ab.py --repo REPO          # an exported repository to serve
    .venv/bin/python benchmarks/serve_ab.py --revs HEAD HEAD --seconds 2 --pairs 1   # a smoke run

Each revision's cpp/ is extracted with `git archive` into build/ab/<commit>/src and built into
build/ab/<commit>/build (configured as scripts/setup.sh configures build/cpp: Release, torch's
cmake prefix path, the venv's Python) once; a later run reuses it. A revision that is the work
tree's HEAD uses build/cpp itself (brought up to date with `cmake --build`), so it saves a
build; that build holds the work tree, so uncommitted changes to cpp/ are in it (they are
listed in the results). Both servers load the same op library (rec/_ops.so of this checkout,
--ops-library) and serve the same repository: the default model trained briefly and exported
into build/ab/repo the first time (reused after), or --repo.

Both servers run with rec-server's default flags (plus --server-args) side by side; after a
warm-up run each, wrk (64 connections, a Lua script that POSTs the model's B = 1 KServe JSON
body to /v2/models/<model>/infer on 127.0.0.1) runs against A, then B, `--pairs` times, so a
burst of other work on the shared machine hits both alike. Per pair: requests/s and p99 of
each, and the ratio B / A of requests/s; the median ratio over pairs. A run with a non-2xx
answer or a socket error fails: its requests/s would not be the server's. `--revs HEAD HEAD`
measures the noise floor (one 2 s pair of the same build gave B / A = 1.05 on a busy 2-core
AMD EPYC), so a difference of a few percent needs several pairs of 10 s or more.

Writes benchmarks/results/serve_ab.json (--out) with the CPU, the revisions and every run.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from rec.benchmarking import BUILD, REC, RESULTS, ROOT, model_configs
from rec.contract import ModelDir
from rec.cpu import cpu_info, describe
from rec.serve.cpp import launch_cpp
from rec.serve.process import ServerProcess

AB = ROOT / "build" / "ab"
OPS = ROOT / "rec" / "_ops.so"
# wrk's Lua: the body from a file (its path in argv), and a summary line the script parses.
WRK_LUA = """
local body_file = io.open(os.getenv("SERVE_AB_BODY"), "rb")
wrk.method = "POST"
wrk.body = body_file:read("*a")
body_file:close()
wrk.headers["Content-Type"] = "application/json"

done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'SERVE_AB {"requests": %d, "duration_us": %d, "p50_us": %d, "p99_us": %d, ' ..
    '"errors": {"connect": %d, "read": %d, "write": %d, "status": %d, "timeout": %d}}\\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    e.connect, e.read, e.write, e.status, e.timeout))
end
"""


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True,
                          check=True).stdout  # fmt: skip


def build_worktree_head(jobs: int) -> Path:
    """build/cpp's rec-server, brought up to date (a no-op when it is)."""
    print(f"[build] work tree's HEAD: cmake --build {BUILD} --target rec-server", flush=True)
    subprocess.run(["cmake", "--build", str(BUILD), "-j", str(jobs), "--target", "rec-server"],
                   check=True, stdout=subprocess.DEVNULL)  # fmt: skip
    return BUILD / "rec-server"


def build_revision(commit: str, jobs: int) -> Path:
    """rec-server of `commit`, built once into build/ab/<commit>/build and reused after."""
    root = AB / commit[:12]
    binary = root / "build" / "rec-server"
    if binary.is_file():
        print(f"[build] {commit[:12]}: reusing {binary.relative_to(ROOT)}", flush=True)
        return binary
    src = root / "src"
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir(parents=True)
    # cpp/ and the golden files its CMakeLists points its unit tests at (not built here).
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit, "cpp", "tests/data"],
                             capture_output=True, check=True).stdout  # fmt: skip
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    import torch.utils  # only here: a run on built trees does not need it

    prefix = torch.utils.cmake_prefix_path
    configure = ["cmake", "-S", str(src / "cpp"), "-B", str(root / "build"),
                 "-DCMAKE_BUILD_TYPE=Release", f"-DCMAKE_PREFIX_PATH={prefix}",
                 f"-DPython3_EXECUTABLE={sys.executable}", f"-DREC_OPS_LIBRARY={OPS}"]  # fmt: skip
    log = root / "build.log"
    print(f"[build] {commit[:12]}: configure and build rec-server (log {log})", flush=True)
    with open(log, "w") as out:
        for cmd in (configure, ["cmake", "--build", str(root / "build"), "-j", str(jobs),
                                "--target", "rec-server"]):  # fmt: skip
            if subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT).returncode != 0:
                raise SystemExit(f"build of {commit[:12]} failed; see {log}")
    return binary


def resolve(revs: list[str], jobs: int) -> list[dict]:
    """Per revision: its name, commit and rec-server; a work tree's HEAD is build/cpp."""
    head = git("rev-parse", "HEAD").strip()
    dirty = [ln[3:] for ln in git("status", "--porcelain", "--", "cpp").splitlines()]
    built: dict[str, Path] = {}
    out = []
    for rev in revs:
        commit = git("rev-parse", "--verify", f"{rev}^{{commit}}").strip()
        if commit not in built:
            built[commit] = (
                build_worktree_head(jobs) if commit == head else build_revision(commit, jobs)
            )
        entry = {"rev": rev, "commit": commit, "binary": str(built[commit])}
        if commit == head:
            entry["work_tree_changes"] = dirty
            if dirty:
                print(f"[build] note: build/cpp holds uncommitted changes to {dirty}", flush=True)
        out.append(entry)
    return out


def default_repository() -> Path:
    """build/ab/repo: the default model trained briefly and exported, the first time only."""
    repo = AB / "repo"
    if ModelDir.of(repo, "rec").config.is_file():
        print(f"[model] reusing {repo.relative_to(ROOT)}", flush=True)
        return repo
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        config = model_configs(tmp, 0.0001)["default"]
        print("[model] rec train, rec export (the default model, once)", flush=True)
        quiet = {"check": True, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        subprocess.run([REC, "train", "-c", str(config), "--run-dir", str(tmp / "run")], **quiet)
        shutil.rmtree(repo, ignore_errors=True)
        subprocess.run([REC, "export", str(tmp / "run"), "--repo", str(repo)], **quiet)
    return repo


def b1_body(repo: Path, model: str) -> bytes:
    """The model's B = 1 request as KServe v2 JSON: dense features, one id per sparse feature
    (below every table's row count), from a fixed seed so every run sends the same bytes."""
    manifest = json.loads(ModelDir.of(repo, model).manifest.read_text())
    dense, sparse = manifest["features"]["dense"], manifest["features"]["sparse"]
    names = {i["role"]: i["name"] for i in manifest["inputs"]}
    rows = min(t["rows"] for t in manifest["tables"])
    rng = np.random.default_rng(0)
    inputs = [
        {"name": names["dense"], "datatype": "FP32", "shape": [1, len(dense)],
         "data": [round(float(x), 4) for x in rng.standard_normal(len(dense))]},
        {"name": names["lengths"], "datatype": "INT32", "shape": [1, len(sparse)],
         "data": [1] * len(sparse)},
        {"name": names["values"], "datatype": "INT64", "shape": [len(sparse)],
         "data": [int(x) for x in rng.integers(0, rows, len(sparse))]},
    ]  # fmt: skip
    return json.dumps({"inputs": inputs}).encode()


def start(binary: str, repo: Path, model: str, extra: list[str]) -> ServerProcess:
    """rec-server `binary` (launch_cpp runs $REC_SERVER) on the repository, same op library."""
    before = os.environ.get("REC_SERVER")
    os.environ["REC_SERVER"] = binary
    try:
        return launch_cpp(repo, "--model", model, "--ops-library", str(OPS), *extra)
    finally:
        if before is None:
            del os.environ["REC_SERVER"]
        else:
            os.environ["REC_SERVER"] = before


def wrk(server: ServerProcess, model: str, lua: Path, body: Path, args: argparse.Namespace) -> dict:
    """One wrk run against `server`: requests/s and latency percentiles (µs)."""
    url = f"http://{server.endpoints.http}/v2/models/{model}/infer"
    argv = ["wrk", "-t", str(args.wrk_threads), "-c", str(args.connections),
            "-d", f"{args.seconds}s", "-s", str(lua), url]  # fmt: skip
    env = {**os.environ, "SERVE_AB_BODY": str(body)}
    out = subprocess.run(argv, capture_output=True, text=True, env=env, check=True).stdout
    line = next((ln for ln in out.splitlines() if ln.startswith("SERVE_AB ")), None)
    if line is None:
        raise SystemExit(f"wrk printed no summary:\n{out}")
    r = json.loads(line[len("SERVE_AB ") :])
    if any(r["errors"].values()):
        raise SystemExit(f"wrk against {url} saw errors {r['errors']} (non-2xx or sockets)")
    r["requests_per_s"] = round(r["requests"] / (r["duration_us"] / 1e6), 1)
    return r


def run_pairs(servers: list[ServerProcess], names: list[str], model: str, args) -> list[dict]:
    """A warm-up run each, then `args.pairs` pairs A, B; per pair both runs and B / A."""
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        lua, body = tmp / "b1.lua", tmp / "body.json"
        lua.write_text(WRK_LUA)
        body.write_bytes(args.body)
        for name, server in zip(names, servers, strict=True):
            warm = argparse.Namespace(**{**vars(args), "seconds": args.warmup})
            r = wrk(server, model, lua, body, warm)
            print(f"[warm-up] {name}: {r['requests_per_s']:,.0f} req/s", flush=True)
        pairs = []
        for i in range(args.pairs):
            runs = []
            for name, server in zip(names, servers, strict=True):
                r = wrk(server, model, lua, body, args)
                print(f"[pair {i + 1}/{args.pairs}] {name}: {r['requests_per_s']:,.0f} req/s, "
                      f"p50 {r['p50_us'] / 1e3:.2f} ms, p99 {r['p99_us'] / 1e3:.2f} ms",
                      flush=True)  # fmt: skip
                runs.append(r)
            ratio = runs[1]["requests_per_s"] / runs[0]["requests_per_s"]
            print(f"[pair {i + 1}/{args.pairs}] B / A = {ratio:.3f}", flush=True)
            pairs.append({"a": runs[0], "b": runs[1], "ratio_b_over_a": round(ratio, 4)})
    return pairs


def report(result: dict) -> str:
    a, b = result["revs"]
    lines = [f"CPU: {result['cpu']}, {result['date']}",
             f"A = {a['rev']} ({a['commit'][:12]}), B = {b['rev']} ({b['commit'][:12]}); "
             f"{result['settings']['connections']} connections, {result['settings']['seconds']} s "
             "per run, B = 1 JSON", "",
             "| pair | A req/s | B req/s | B / A | A p99 (ms) | B p99 (ms) |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for i, p in enumerate(result["pairs"], 1):
        lines.append(f"| {i} | {p['a']['requests_per_s']:,.0f} | {p['b']['requests_per_s']:,.0f} "
                     f"| {p['ratio_b_over_a']:.3f} | {p['a']['p99_us'] / 1e3:.2f} "
                     f"| {p['b']['p99_us'] / 1e3:.2f} |")  # fmt: skip
    lines.append(f"\nmedian B / A: {result['median_ratio_b_over_a']:.3f}")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--revs", nargs=2, default=["15fa6c6", "HEAD"], metavar=("A", "B"))
    p.add_argument("--repo", type=Path, help="an exported repository (default: build/ab/repo)")
    p.add_argument("--model", default="rec")
    p.add_argument("--pairs", type=int, default=5)
    p.add_argument("--seconds", type=int, default=10, help="per wrk run")
    p.add_argument("--warmup", type=int, default=2, help="seconds of the first run per server")
    p.add_argument("--connections", type=int, default=64)
    p.add_argument("--wrk-threads", type=int, default=2)
    p.add_argument("--server-args", default="", help="more rec-server flags, both servers")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="build parallelism")
    p.add_argument("--out", type=Path, default=RESULTS / "serve_ab.json")
    args = p.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed (scripts/setup.sh installs Debian's)")
    revs = resolve(args.revs, args.jobs)
    repo = args.repo or default_repository()
    args.body = b1_body(repo, args.model)
    extra = shlex.split(args.server_args)
    servers = []
    try:
        for r in revs:
            servers.append(start(r["binary"], repo, args.model, extra))
            print(f"[server] {r['rev']} ({r['commit'][:12]}) on {servers[-1].endpoints.http}",
                  flush=True)  # fmt: skip
        names = [f"A {revs[0]['rev']}", f"B {revs[1]['rev']}"]
        pairs = run_pairs(servers, names, args.model, args)
    finally:
        for s in servers:
            s.stop(timeout=30)
    result = {
        "cpu": describe(cpu_info()),
        "cpu_flags": cpu_info()["flags"],
        "date": time.strftime("%Y-%m-%d"),
        "revs": revs,
        "repository": str(repo),
        "ops_library": str(OPS),
        "settings": {
            "connections": args.connections,
            "seconds": args.seconds,
            "wrk_threads": args.wrk_threads,
            "pairs": args.pairs,
            "server_args": extra,
            "body_bytes": len(args.body),
        },  # fmt: skip
        "pairs": pairs,
        "median_ratio_b_over_a": round(statistics.median(p["ratio_b_over_a"] for p in pairs), 4),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(report(result))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
