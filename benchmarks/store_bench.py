"""The embedding store against in-process tables, with the real parts, in one run.

    .venv/bin/python benchmarks/store_bench.py                         # default and Kaggle size
    .venv/bin/python benchmarks/store_bench.py --kaggle-run RUN        # reuse a trained Kaggle run

For each model (the embedded default, then Criteo Kaggle's cardinalities):
1. A trained run (40 steps, or --kaggle-run), exported twice: every table in the model, and
   with `--store` into our own Redis Cluster (3 masters, 1 replica each, on this host).
2. rec-server on each repository (the tiered one with a --cache-mb row cache): its peak RSS.
3. One client sends requests back to back for --window-s seconds per (id distribution, batch),
   each with fresh ids: Zipf-like (alpha 1.05 and 1.2: id = rank, so small ids are the hot
   ones) and uniform, at B = 1 and B = 512; a tiered server started afresh for each, first cold
   (empty cache), then warmed to its steady state, then warm. p50 / p99 latency, the cache's hit
   rate and the store's time per lookup (rec-server's /metrics) for each window.
   The steady state: B = 512 requests of the same distribution (other draws), in windows of
   --window-s, until a window's hit rate is within --steady-points of the window before, or for
   --warmup-max-s. B = 512 fills the cache 500 times faster than B = 1, and which rows the cache
   holds depends on the ids' distribution, not on how they are batched. The warm-up's hit rate
   per window is in the result file.

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


def window(server, num_dense, rows, batch, dist, seconds, seed) -> dict:
    import tritonclient.http as httpclient

    from rec.contract import DTYPES

    # Fresh ids for every request (no pool that the cache would learn whole): the hit rate is
    # the distribution's.
    rng = np.random.default_rng(seed)
    before = metrics(server)
    lat = []
    with httpclient.InferenceServerClient(server.endpoints.http, network_timeout=120) as c:
        end = time.perf_counter() + seconds
        k = 0
        while time.perf_counter() < end:
            inputs = []
            for name, arr in request(num_dense, rows, batch, dist, rng).items():
                i = httpclient.InferInput(name, list(arr.shape), DTYPES[name])
                i.set_data_from_numpy(arr)
                inputs.append(i)
            t0 = time.perf_counter()
            c.infer("rec", inputs)
            lat.append(time.perf_counter() - t0)
            k += 1
    after = metrics(server)
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    a = np.asarray(lat) * 1e3
    out = {"n": int(a.size), "p50_ms": round(float(np.percentile(a, 50)), 3),
           "p99_ms": round(float(np.percentile(a, 99)), 3)}  # fmt: skip
    looked = d.get("rec_store_cache_hits_total", 0) + d.get("rec_store_cache_misses_total", 0)
    if looked:
        out["hit_rate"] = round(d["rec_store_cache_hits_total"] / looked, 4)
        lookups = d.get("rec_store_lookups_total", 0)
        if lookups:
            out["store_ms_per_lookup"] = round(d["rec_store_lookup_us_total"] / lookups / 1e3, 4)
            out["rows_per_lookup"] = round(d["rec_store_cache_misses_total"] / lookups, 1)
    return out


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

    from rec.contract import DTYPES

    done = [0] * clients
    before = metrics(server)

    def client(i: int) -> None:
        rng = np.random.default_rng(1000 + i)
        with httpclient.InferenceServerClient(server.endpoints.http, network_timeout=120) as c:
            end = time.perf_counter() + seconds
            while time.perf_counter() < end:
                inputs = []
                for name, arr in request(num_dense, rows, 512, "zipf1.05", rng).items():
                    x = httpclient.InferInput(name, list(arr.shape), DTYPES[name])
                    x.set_data_from_numpy(arr)
                    inputs.append(x)
                c.infer("rec", inputs)
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
    from rec.contract import read_manifest
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
                manifest = read_manifest(repo / "rec" / "1" / "rec.json")
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


def measure(label: str, run: Path, work: Path, args) -> dict:
    from rec.contract import read_manifest
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
        manifest = read_manifest(tiered / "rec" / "1" / "rec.json")
        section = json.loads((tiered / "rec" / "1" / "rec.json").read_text())["store"]
        result["stored_tables"] = sorted(section["tables"])
        by_name = {t["name"]: t["rows"] for t in manifest.data["tables"]}
        owner = manifest.data["features"]["sparse_table"]
        rows = [by_name[owner[f]] for f in manifest.sparse_names]
        num_dense = len(manifest.dense_names)
        # No update log: a reused run may name a broker that is gone.
        server = launch_cpp(plain, "--updates", "none", ready_timeout=600)
        try:
            r: dict = {"peak_rss_bytes_loaded": server.peak_rss_bytes()}
            for batch in (1, 512):
                for dist in DISTRIBUTIONS:
                    w = window(server, num_dense, rows, batch, dist, args.window_s, seed=batch)
                    r[f"b{batch}_{dist}_warm"] = w
                    log(f"{label} in-process B={batch} {dist}: {w}")
            r["peak_rss_bytes"] = server.peak_rss_bytes()
        finally:
            server.stop()
        result["in_process"] = r
        # The tiered server afresh for each (batch, ids): cold, then warm. No update log: a reused
        # run may name a broker that is gone.
        cache = ("--updates", "none", "--store-cache-bytes", str(args.cache_mb << 20))
        r = {"peak_rss_bytes": 0}
        for batch in (1, 512):
            for dist in DISTRIBUTIONS:
                server = launch_cpp(tiered, *cache, ready_timeout=600)
                try:
                    for phase in ("cold", "warm"):
                        seed = batch + 10 * DISTRIBUTIONS.index(dist) + 100 * (phase == "warm")
                        if phase == "warm":
                            warm = warm_up(server, num_dense, rows, dist, args, 1000 + seed)
                            r[f"b{batch}_{dist}_warmup"] = warm
                            log(f"{label} tiered B={batch} {dist} warm-up: {warm}")
                        w = window(server, num_dense, rows, batch, dist, args.window_s, seed)
                        r[f"b{batch}_{dist}_{phase}"] = w
                        log(f"{label} tiered B={batch} {dist} {phase}: {w}")
                    r["peak_rss_bytes"] = max(r["peak_rss_bytes"], server.peak_rss_bytes())
                finally:
                    server.stop()
        result["tiered"] = r
    ratios = {"peak_rss": round(result["tiered"]["peak_rss_bytes"]
                                / result["in_process"]["peak_rss_bytes"], 3)}  # fmt: skip
    for batch in (1, 512):
        for dist in DISTRIBUTIONS:
            base = result["in_process"][f"b{batch}_{dist}_warm"]["p99_ms"]
            for phase in ("cold", "warm"):
                p99 = result["tiered"][f"b{batch}_{dist}_{phase}"]["p99_ms"]
                ratios[f"p99_b{batch}_{dist}_{phase}"] = round(p99 / base, 3)
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
    parser.add_argument("--window-s", type=float, default=5.0)
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
    args = parser.parse_args()

    from rec.cpu import cpu_info, describe

    work = Path(tempfile.mkdtemp(prefix="rec-store-"))
    log(f"work in {work}")
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
