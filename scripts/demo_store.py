"""The demo's embedding-store step: the largest tables of the run go to a Redis Cluster instead
of the model, rec-server reads them through its row cache, and its scores are the in-process
model's, bit for bit.

    .venv/bin/python scripts/demo_store.py --run RUN --repo REPO   # make demo: artifacts/demo/...

Starts our own Redis Cluster (3 masters, a replica each, on free ports of 127.0.0.1), exports
RUN again with `--store` (its `--tables` to the store), then serves both repositories with
rec-server and scores the same synthetic rows on each: REPO (the in-process export of the same
checkpoint) and the tiered one. Prints the export's memory plan and the store's metrics.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parent.parent


def metrics(server) -> dict[str, float]:
    """rec-server's rec_store_* metrics, summed over their labels."""
    with urllib.request.urlopen(f"http://{server.endpoints.metrics}/metrics", timeout=10) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for name, value in re.findall(r"^(rec_store_[a-z_]+)\{[^}]*\} (\S+)$", text, re.M):
        out[name] = out.get(name, 0.0) + float(value)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run", type=Path, required=True)
    parser.add_argument("--repo", type=Path, required=True, help="the run's in-process export")
    parser.add_argument("--tables", default="t1,t4,t3", help="the tables to store")
    parser.add_argument("--cache-bytes", type=int, default=256 << 10,
                        help="rec-server's row cache (small: the store is read)")  # fmt: skip
    args = parser.parse_args()

    from rec.contract import ModelDir
    from rec.serve.client import ScoreClient, synthetic_rows
    from rec.serve.cpp import launch_cpp
    from rec.store.cluster import RedisCluster

    out = args.repo.parent
    tiered = out / "model_repository_store"
    overlay = out / "store.yaml"
    tables = args.tables.split(",")
    overlay.write_text(yaml.safe_dump({"export": {"store": {"tables": tables, "partitions": 4}}}))
    with RedisCluster(out / "store_cluster", masters=3, replicas=1) as cluster:
        print(f"Redis Cluster of our own: {cluster.url()}", flush=True)
        proc = subprocess.run(
            [str(ROOT / ".venv/bin/rec"), "export", str(args.run), "--repo", str(tiered),
             "--store", cluster.url(), "--config", str(overlay)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        for line in proc.stdout.splitlines():
            if "store" in line:
                print("  " + line.strip(), flush=True)
        if proc.returncode != 0:
            print(proc.stdout[-3000:], file=sys.stderr)
            return 1
        plain = launch_cpp(args.repo)
        stored = launch_cpp(tiered, "--store-cache-bytes", str(args.cache_bytes))
        try:
            manifest = ModelDir.of(args.repo, "rec").read_manifest()
            num_dense, num_sparse = len(manifest.dense_names), len(manifest.sparse_names)
            same = True
            for batch, seed in ((1, 0), (64, 1), (512, 2), (512, 2)):  # the last one: cached
                rows = synthetic_rows(num_dense, num_sparse, batch, seed=seed)
                scores = {}
                for name, server in (("in-process", plain), ("store", stored)):
                    client = ScoreClient(server.endpoints.grpc, "grpc")
                    try:
                        scores[name] = client.score(rows)
                    finally:
                        client.close()
                equal = np.array_equal(scores["in-process"], scores["store"])
                same &= equal
                print(f"B = {batch:3d}: in-process and store-backed scores "
                      f"{'identical' if equal else 'DIFFER'} "
                      f"(first {scores['store'][0, 0]:.6f})", flush=True)  # fmt: skip
            m = metrics(stored)
            hits = m.get("rec_store_cache_hits_total", 0)
            misses = m.get("rec_store_cache_misses_total", 0)
            lookups = m.get("rec_store_lookups_total", 0)
            print(f"rec-server's store metrics: {hits:.0f} cache hits, {misses:.0f} misses "
                  f"(hit rate {hits / max(hits + misses, 1):.2f}), {lookups:.0f} store lookups, "
                  f"{m.get('rec_store_lookup_us_total', 0) / max(lookups, 1):.0f} us each, "
                  f"cache {m.get('rec_store_cache_bytes', 0) / 1024:.0f} of "
                  f"{args.cache_bytes / 1024:.0f} KiB", flush=True)  # fmt: skip
        finally:
            stored.stop()
            plain.stop()
    print(
        f"tables {', '.join(tables)} served from the store, the rest from {tiered}; "
        "scores equal to the in-process model's"
        if same
        else "scores differ",
        flush=True,
    )
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
