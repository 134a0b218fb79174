"""The embedding store against in-process tables, with the real parts, in one run.

    .venv/bin/python benchmarks/store_bench.py                         # default and Kaggle size
    .venv/bin/python benchmarks/store_bench.py --kaggle-run RUN        # reuse a trained Kaggle run

For each model (the embedded default, then Criteo Kaggle's cardinalities):
1. A trained run (40 steps, or --kaggle-run), exported twice: every table in the model, and
   with `--store` into our own Redis Cluster (3 masters, 1 replica each, on this host).
2. rec-server on each repository (the tiered one with a --cache-mb row cache): its peak RSS.
3. One client sends requests back to back, each with fresh ids: Zipf-like (alpha 1.05 and
   1.2: id = rank, so small ids are the hot ones) and uniform, at B = 1 and B = 512. For each
   (ids, batch) a tiered server is started afresh: a cold window (empty cache) of --window-s,
   the warm-up to its steady state, then a warm window of --warm-window-s. The in-process
   server stays up throughout, and every request of those windows goes to both servers, one
   after the other (which one first alternates): the two p99s come from the same window, so
   their ratio is not moved by what else the machine did (5-s windows of each server apart
   gave 1.05x then 1.75x for one cell in two runs). p50 / p99 latency, the cache's hit rate and
   the store's time per lookup (rec-server's /metrics) for each window.
   The steady state: B = 512 requests of the same distribution (other draws), tiered server
   only, in windows of --window-s, until a window's hit rate is within --steady-points of the
   window before, or for --warmup-max-s. B = 512 fills the cache 500 times faster than B = 1,
   and which rows the cache holds depends on the ids' distribution, not on how they are
   batched. The warm-up's hit rate per window is in the result file.

4. Store hosts: the tiered export again into a cluster of 3 masters spread over 1, 2 and 3
   network-namespace hosts (rec/netns.py; skipped with the reason where namespaces cannot be
   made). rec-server runs on this host with no row cache (every row from the store), and
   --clients closed-loop clients send B = 512 Zipf 1.05 requests for --window-s: requests/s and
   rows/s read from the store, for each number of hosts. All hosts share this machine's cores.

Writes benchmarks/results/store.json and prints a summary; the CPU is in the file.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parent.parent
REC = str(ROOT / ".venv" / "bin" / "rec")
RESULTS = ROOT / "benchmarks" / "results"
KAGGLE = ROOT / "examples" / "criteo_kaggle.yaml"
DISTRIBUTIONS = ("zipf1.05", "zipf1.2", "uniform")


def log(msg: str) -> None:
    print(f"[store] {msg}", flush=True)


def rec(*args: str) -> str:
    t0 = time.time()
    proc = subprocess.run([REC, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        sys.exit(f"rec {' '.join(args)} failed:\n{proc.stdout[-3000:]}")
    log(f"rec {args[0]}: {time.time() - t0:.0f} s")
    return proc.stdout


def request(num_dense: int, rows: list[int], batch: int, dist: str, rng) -> dict:
    """One request's arrays: every sparse feature one id, drawn from `dist` over its table."""
    from rec.contract.io import DENSE, LENGTHS, VALUES

    dense = rng.standard_normal((batch, num_dense)).astype(np.float32)
    lengths = np.ones((batch, len(rows)), dtype=np.int32)
    ids = np.empty((batch, len(rows)), dtype=np.int64)
    for f, n in enumerate(rows):
        if dist == "uniform":
            ids[:, f] = rng.integers(0, n, size=batch)
        else:
            ids[:, f] = (rng.zipf(float(dist[4:]), size=batch) - 1) % n
    return {DENSE: dense, LENGTHS: lengths, VALUES: ids.reshape(-1)}


def metrics(server) -> dict[str, float]:
    url = f"http://{server.endpoints.metrics}/metrics"
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    out: dict[str, float] = {}
    for m in re.finditer(r"^(rec_store_\w+)\{[^}]*\} (\S+)$", text, re.M):
        out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(2))
    return out


def _inputs(arrays: dict):
    import tritonclient.http as httpclient

    from rec.contract import DTYPES

    inputs = []
    for name, arr in arrays.items():
        i = httpclient.InferInput(name, list(arr.shape), DTYPES[name])
        i.set_data_from_numpy(arr)
        inputs.append(i)
    return inputs


def _latency(lat: list[float]) -> dict:
    a = np.asarray(lat) * 1e3
    return {"n": int(a.size), "p50_ms": round(float(np.percentile(a, 50)), 3),
            "p99_ms": round(float(np.percentile(a, 99)), 3)}  # fmt: skip


def _store_counts(before: dict, after: dict) -> dict:
    """Hit rate and store time per lookup from two reads of rec-server's /metrics."""
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    out = {}
    looked = d.get("rec_store_cache_hits_total", 0) + d.get("rec_store_cache_misses_total", 0)
    if looked:
        out["hit_rate"] = round(d["rec_store_cache_hits_total"] / looked, 4)
        lookups = d.get("rec_store_lookups_total", 0)
        if lookups:
            out["store_ms_per_lookup"] = round(d["rec_store_lookup_us_total"] / lookups / 1e3, 4)
            out["rows_per_lookup"] = round(d["rec_store_cache_misses_total"] / lookups, 1)
    return out


def window(server, num_dense, rows, batch, dist, seconds, seed) -> dict:
    """One server, one client, requests back to back for `seconds`."""
    import tritonclient.http as httpclient

    # Fresh ids for every request (no pool that the cache would learn whole): the hit rate is
    # the distribution's.
    rng = np.random.default_rng(seed)
    before = metrics(server)
    lat = []
    with httpclient.InferenceServerClient(server.endpoints.http, network_timeout=120) as c:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            inputs = _inputs(request(num_dense, rows, batch, dist, rng))
            t0 = time.perf_counter()
            c.infer("rec", inputs)
            lat.append(time.perf_counter() - t0)
    return {**_latency(lat), **_store_counts(before, metrics(server))}


def paired_window(plain, tiered, num_dense, rows, batch, dist, seconds, seed) -> dict:
    """Every request to both servers, one after the other, the first one alternating: the two
    p99s share the window's noise (other jobs on the machine), so their ratio is stable where
    two windows' are not. One request is in flight at a time: the servers never compete."""
    import tritonclient.http as httpclient

    rng = np.random.default_rng(seed)
    before = metrics(tiered)
    lat: dict[str, list[float]] = {"in_process": [], "tiered": []}
    servers = {"in_process": plain, "tiered": tiered}
    clients = {k: httpclient.InferenceServerClient(s.endpoints.http, network_timeout=120)
               for k, s in servers.items()}  # fmt: skip
    try:
        end, k = time.perf_counter() + seconds, 0
        while time.perf_counter() < end:
            inputs = _inputs(request(num_dense, rows, batch, dist, rng))
            order = ("in_process", "tiered") if k % 2 == 0 else ("tiered", "in_process")
            for name in order:
                t0 = time.perf_counter()
                clients[name].infer("rec", inputs)
                lat[name].append(time.perf_counter() - t0)
            k += 1
    finally:
        for c in clients.values():
            c.close()
    tiered_out = {**_latency(lat["tiered"]), **_store_counts(before, metrics(tiered))}
    in_process = _latency(lat["in_process"])
    return {"in_process": in_process, "tiered": tiered_out,
            "p99_ratio": round(tiered_out["p99_ms"] / in_process["p99_ms"], 3),
            "p50_ratio": round(tiered_out["p50_ms"] / in_process["p50_ms"], 3)}  # fmt: skip


def warm_up(server, num_dense, rows, dist, args, seed) -> dict:
    """B = 512 windows of `dist` until the hit rate stops rising (see the module's docstring)."""
    rates: list[float] = []
    t0 = time.perf_counter()
    while True:
        w = window(server, num_dense, rows, 512, dist, args.window_s, seed + len(rates))
        rates.append(w.get("hit_rate", 1.0))
        steady = len(rates) >= 2 and abs(rates[-1] - rates[-2]) * 100 <= args.steady_points
        if steady or time.perf_counter() - t0 >= args.warmup_max_s:
            break
    return {"seconds": round(time.perf_counter() - t0, 1), "steady": steady,
            "hit_rate_per_window": rates}  # fmt: skip


def throughput(server, num_dense, rows, seconds, clients) -> dict:
    """`clients` threads sending B = 512 Zipf 1.05 requests back to back for `seconds`."""
    import threading

    import tritonclient.http as httpclient

    done = [0] * clients
    before = metrics(server)

    def client(i: int) -> None:
        rng = np.random.default_rng(1000 + i)
        with httpclient.InferenceServerClient(server.endpoints.http, network_timeout=120) as c:
            end = time.perf_counter() + seconds
            while time.perf_counter() < end:
                c.infer("rec", _inputs(request(num_dense, rows, 512, "zipf1.05", rng)))
                done[i] += 1

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    after = metrics(server)
    key = "rec_store_cache_misses_total"
    misses = after.get(key, 0) - before.get(key, 0)
    return {"requests_per_s": round(sum(done) / elapsed, 2),
            "store_rows_per_s": round(misses / elapsed), "requests": sum(done)}  # fmt: skip


def store_hosts(label: str, run: Path, work: Path, args) -> dict:
    """Throughput with the store's 3 masters on 1, 2 and 3 namespace hosts (no row cache)."""
    from rec import netns
    from rec.contract import ModelDir
    from rec.serve.cpp import launch_cpp
    from rec.store.cluster import RedisCluster

    why = netns.unavailable()
    if why:
        log(f"{label}: store hosts skipped: {why}")
        return {"skipped": why}
    out: dict = {}
    for n in (1, 2, 3):
        repo = work / f"{label}-hosts{n}"
        with netns.Hosts(n) as hosts:
            where = {"hosts": [hosts.address(i) for i in range(n)],
                     "prefixes": [hosts.prefix(i) for i in range(n)]}  # fmt: skip
            # Redis Cluster's 3 masters at least, spread over the n hosts.
            with RedisCluster(work / f"{label}-hosts{n}-cluster", 3, 0, **where) as cluster:
                config = work / f"{label}-hosts{n}.yaml"
                store = {"url": cluster.url(), "partitions": 16}
                if label == "default":
                    store["min_bytes"] = 0
                config.write_text(yaml.safe_dump({"export": {"store": store}}))
                rec("export", str(run), "--repo", str(repo), "--config", str(config))
                manifest = ModelDir.of(repo, "rec").read_manifest(1)
                by_name = {t["name"]: t["rows"] for t in manifest.data["tables"]}
                owner = manifest.data["features"]["sparse_table"]
                rows = [by_name[owner[f]] for f in manifest.sparse_names]
                server = launch_cpp(repo, "--updates", "none", "--store-cache-bytes", "0",
                                    ready_timeout=600)  # fmt: skip
                try:
                    r = throughput(server, len(manifest.dense_names), rows, args.window_s * 2,
                                   args.clients)  # fmt: skip
                finally:
                    server.stop()
                out[f"hosts_{n}"] = r
                log(f"{label} store on {n} host(s), no cache, {args.clients} clients: {r}")
        shutil.rmtree(repo, ignore_errors=True)
    base = out["hosts_1"]["requests_per_s"]
    out["requests_per_s_over_1_host"] = {
        k: round(v["requests_per_s"] / base, 3) for k, v in out.items() if k.startswith("hosts_")
    }
    return out


def tiered_cells(plain_server, tiered: Path, num_dense, rows, args, label) -> tuple[dict, dict]:
    """For each (batch, ids): a tiered rec-server afresh, a cold paired window, the warm-up, a
    warm paired window of --warm-window-s. Returns the tiered server's peak RSS and warm-ups,
    and the paired windows by cell (b1_zipf1.05_cold, ...)."""
    from rec.serve.cpp import launch_cpp

    cache = ("--updates", "none", "--store-cache-bytes", str(args.cache_mb << 20))
    tiered_out: dict = {"peak_rss_bytes": 0}
    paired: dict = {}
    for batch in (1, 512):
        for dist in DISTRIBUTIONS:
            server = launch_cpp(tiered, *cache, ready_timeout=600)
            try:
                for phase in ("cold", "warm"):
                    seed = batch + 10 * DISTRIBUTIONS.index(dist) + 100 * (phase == "warm")
                    seconds = args.window_s
                    if phase == "warm":
                        warm = warm_up(server, num_dense, rows, dist, args, 1000 + seed)
                        tiered_out[f"b{batch}_{dist}_warmup"] = warm
                        log(f"{label} tiered B={batch} {dist} warm-up: {warm}")
                        seconds = args.warm_window_s
                    cell = f"b{batch}_{dist}_{phase}"
                    paired[cell] = paired_window(plain_server, server, num_dense, rows, batch,
                                                 dist, seconds, seed)  # fmt: skip
                    log(f"{label} B={batch} {dist} {phase}, paired: {paired[cell]}")
                peak = max(tiered_out["peak_rss_bytes"], server.peak_rss_bytes())
                tiered_out["peak_rss_bytes"] = peak
            finally:
                server.stop()
    return tiered_out, paired


def measure(label: str, run: Path, work: Path, args) -> dict:
    from rec.contract import ModelDir
    from rec.serve.cpp import launch_cpp
    from rec.store.cluster import RedisCluster

    plain, tiered = work / f"{label}-plain", work / f"{label}-tiered"
    result: dict = {"label": label}
    with RedisCluster(work / f"{label}-cluster", masters=3, replicas=1) as cluster:
        t0 = time.time()
        rec("export", str(run), "--repo", str(plain))
        result["export_s_in_process"] = round(time.time() - t0, 1)
        # The default model's tables are small: every table to the store, for a comparison.
        config = work / f"{label}-store.yaml"
        store = {"url": cluster.url(), "partitions": 16}
        if label == "default":
            store["min_bytes"] = 0
        config.write_text(yaml.safe_dump({"export": {"store": store}}))
        t0 = time.time()
        out = rec("export", str(run), "--repo", str(tiered), "--config", str(config))
        result["export_s_tiered"] = round(time.time() - t0, 1)
        result["export_store_lines"] = [line for line in out.splitlines() if "store:" in line]
        used = cluster.used_memory()
        result["cluster_used_memory_bytes"] = sum(used.values())
        manifest = ModelDir.of(tiered, "rec").read_manifest(1)
        result["stored_tables"] = sorted(manifest.store.tables)
        by_name = {t["name"]: t["rows"] for t in manifest.data["tables"]}
        owner = manifest.data["features"]["sparse_table"]
        rows = [by_name[owner[f]] for f in manifest.sparse_names]
        num_dense = len(manifest.dense_names)
        # No update log: a reused run may name a broker that is gone. The in-process server
        # stays up beside each tiered one: the latencies are measured in paired windows.
        plain_server = launch_cpp(plain, "--updates", "none", ready_timeout=600)
        try:
            result["in_process"] = {"peak_rss_bytes_loaded": plain_server.peak_rss_bytes()}
            result["tiered"], result["paired"] = tiered_cells(
                plain_server, tiered, num_dense, rows, args, label
            )
            result["in_process"]["peak_rss_bytes"] = plain_server.peak_rss_bytes()
        finally:
            plain_server.stop()
    ratios = {"peak_rss": round(result["tiered"]["peak_rss_bytes"]
                                / result["in_process"]["peak_rss_bytes"], 3)}  # fmt: skip
    for cell, paired in result["paired"].items():
        ratios[f"p99_{cell}"] = paired["p99_ratio"]
    result["tiered_over_in_process"] = ratios
    if args.store_hosts:
        result["store_hosts"] = store_hosts(label, run, work, args)
    else:
        result["store_hosts"] = {"skipped": "--no-store-hosts"}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kaggle-run", type=Path, default=None,
                        help="a trained run of examples/criteo_kaggle.yaml to export")  # fmt: skip
    parser.add_argument("--cache-mb", type=int, default=256)
    parser.add_argument("--window-s", type=float, default=5.0,
                        help="cold and warm-up windows, store-hosts throughput")  # fmt: skip
    parser.add_argument("--warm-window-s", type=float, default=20.0,
                        help="the warm paired window, for a stable p99 ratio")  # fmt: skip
    parser.add_argument("--clients", type=int, default=2, help="closed-loop clients, store hosts")
    parser.add_argument(
        "--steady-points",
        type=float,
        default=1.0,
        help="warm-up ends when a window's hit rate moves by at most this",
    )
    parser.add_argument("--warmup-max-s", type=float, default=60.0)
    parser.add_argument("--store-hosts", action=argparse.BooleanOptionalAction, default=True,
                        help="the 1/2/3-host throughput part (no row cache)")  # fmt: skip
    parser.add_argument("--keep", action="store_true",
                        help="keep the work folder (runs, repositories, clusters; about 10 GB "
                             "with the Kaggle model); removed by default")  # fmt: skip
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="rec-store-"))
    log(f"work in {work}" + ("" if args.keep else " (removed at the end; --keep keeps it)"))
    try:
        run_all(args, work)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def run_all(args, work: Path) -> None:
    from rec.cpu import cpu_info, describe

    runs = {}
    for label, config in (("default", None), ("kaggle", KAGGLE)):
        if label == "kaggle" and args.kaggle_run is not None:
            runs[label] = args.kaggle_run
            continue
        run = work / f"{label}-run"
        overrides = {"training": {"steps": 40, "eval_every": 0}, "checkpoint": {"every_steps": 0}}
        cfg_path = work / f"{label}.yaml"
        data = yaml.safe_load(KAGGLE.read_text()) if config else {}
        for k, v in overrides.items():
            data.setdefault(k, {}).update(v)
        cfg_path.write_text(yaml.safe_dump(data))
        rec("train", "--config", str(cfg_path), "--run-dir", str(run), "--nproc", "2")
        runs[label] = run
    models = {label: measure(label, run, work, args) for label, run in runs.items()}
    out = {
        "benchmark": "store",
        "cpu": describe(cpu_info()),
        "date": time.strftime("%Y-%m-%d"),
        "command": "benchmarks/store_bench.py" + (" --kaggle-run RUN" if args.kaggle_run else ""),
        "cache_mb": args.cache_mb,
        "window_s": args.window_s,
        "warm_window_s": args.warm_window_s,
        "clients": args.clients,
        "steady_points": args.steady_points,
        "warmup_max_s": args.warmup_max_s,
        "models": models,
    }
    if set(models) == {"default", "kaggle"}:
        out["kaggle_over_default"] = {
            "in_process_peak_rss": round(models["kaggle"]["in_process"]["peak_rss_bytes"]
                                         / models["default"]["in_process"]["peak_rss_bytes"], 2),
            "tiered_peak_rss": round(models["kaggle"]["tiered"]["peak_rss_bytes"]
                                     / models["default"]["tiered"]["peak_rss_bytes"], 2),
        }  # fmt: skip
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / "store.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    log(json.dumps({k: v.get("tiered_over_in_process") for k, v in models.items()}, indent=1))
    log(f"wrote {path}")


if __name__ == "__main__":
    main()
