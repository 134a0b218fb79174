"""How much of a store lookup is Redis's own work: redis-server's CPU time per batch, for the
Kaggle-size model's layout (5 stored tables x 16 partition hashes, rows of 68 bytes: 64 int8
codes and fp16 scale and bias) on our 3-master cluster.

store_bench measures rec-server's whole lookup (2,411 rows of a B = 512 batch in 3.6 ms, against
the parameter server's published 0.127 ms for 2,000 keys). This splits it: each batch of
`--keys` random rows is grouped by partition and sent as one pipeline of HMGETs (redis-py's
cluster pipeline, as rec's Triton model does), and every master's process CPU time (INFO cpu)
and time inside HMGET (INFO commandstats) are read before and after. Summed over the masters,
the CPU time is what Redis spends per batch whatever the client; on 2 cores shared by 3 masters
and the client, about half of it is the least wall time a batch can take here. Then the floor:
one standalone redis-server answering each batch as a single HMGET of one hash.

    .venv/bin/python benchmarks/store_server_time.py [--keys 2000] [--partitions 16]

Writes benchmarks/results/store_server_time.json; the CPU is in the file. About 30 s.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

import redis

from rec.broker import RedisBroker
from rec.contract.store import partition_key
from rec.cpu import cpu_info, describe
from rec.store.cluster import RedisCluster
from rec.store.writer import connect

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
TABLES, ROW_BYTES = 5, 68


def log(msg: str) -> None:
    print(f"[store_server_time] {msg}", flush=True)


def server_time(nodes: list[redis.Redis]) -> tuple[int, float, float]:
    """(HMGET calls, usec inside HMGET, the processes' CPU seconds), summed over `nodes`. The
    usec is wall time in the command, so it counts a master preempted by another too; the CPU
    seconds (INFO cpu) count everything the process did, reading and writing sockets included."""
    calls = usec = cpu = 0
    for node in nodes:
        stat = node.info("commandstats").get("cmdstat_hmget", {})
        calls, usec = calls + stat.get("calls", 0), usec + stat.get("usec", 0)
        info = node.info("cpu")
        cpu += info["used_cpu_user"] + info["used_cpu_sys"]
    return calls, usec, cpu


def standalone(folder: Path, keys: int, batches: int) -> dict:
    """The floor without the cluster: one redis-server, one hash of 20,000 rows, one HMGET of
    `keys` fields per batch. What Redis costs per row on this CPU at the least."""
    with RedisBroker(folder) as broker:
        client = redis.Redis(port=broker.port)
        row = bytes(range(ROW_BYTES))
        for i in range(0, 20_000, 5000):
            client.hset("h", mapping={str(j): row for j in range(i, i + 5000)})
        rng = random.Random(1)
        before = server_time([client])
        for _ in range(batches):
            assert all(client.hmget("h", [str(rng.randrange(20_000)) for _ in range(keys)]))
        _, usec, cpu = (a - b for a, b in zip(server_time([client]), before, strict=True))
        client.close()
    return {"cpu_us_per_row": round(cpu / (batches * keys) * 1e6, 3),
            "hmget_us_per_row": round(usec / (batches * keys), 3)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=2000, help="rows per batch")
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--partitions", type=int, default=16, help="hashes per table")
    parser.add_argument("--rows-per-table", type=int, default=320_000)
    args = parser.parse_args()
    rows, partitions = args.rows_per_table, args.partitions
    with (
        tempfile.TemporaryDirectory(prefix="rec-store-time-") as tmp,
        RedisCluster(Path(tmp) / "cluster", masters=3, replicas=0) as cluster,
    ):
        client = connect(cluster.url())
        row = bytes(range(ROW_BYTES))
        t0 = time.time()
        for t in range(TABLES):
            for p in range(partitions):
                key = partition_key("probe", f"t{t}", p)
                fields = {str(r): row for r in range(p, rows, partitions)}
                for i in range(0, len(fields), 5000):  # pipelined writes of 5,000 rows
                    client.hset(key, mapping=dict(list(fields.items())[i : i + 5000]))
            log(f"table {t + 1}/{TABLES} written ({time.time() - t0:.0f} s)")
        masters = [redis.Redis(m.host, m.port) for m in cluster.masters()]
        rng = random.Random(0)
        before, wall = server_time(masters), 0.0
        for b in range(args.batches):
            groups: dict[tuple[int, int], list[str]] = {}
            for _ in range(args.keys):
                t, r = rng.randrange(TABLES), rng.randrange(rows)
                groups.setdefault((t, r % partitions), []).append(str(r))
            pipe = client.pipeline(transaction=False)
            for (t, p), fields in groups.items():
                pipe.hmget(partition_key("probe", f"t{t}", p), fields)
            start = time.perf_counter()
            got = pipe.execute()
            wall += time.perf_counter() - start
            assert sum(len(v) for v in got) == args.keys and all(x for v in got for x in v)
            if (b + 1) % 50 == 0:
                log(f"batch {b + 1}/{args.batches}")
        after = server_time(masters)
        client.close()
        alone = standalone(Path(tmp) / "standalone", args.keys, args.batches)
    calls, usec, cpu = (a - b for a, b in zip(after, before, strict=True))
    out = {
        "benchmark": "store_server_time",
        "cpu": describe(cpu_info()),
        "date": time.strftime("%Y-%m-%d"),
        "command": "benchmarks/store_server_time.py",
        "layout": {
            "tables": TABLES,
            "partitions": partitions,
            "row_bytes": ROW_BYTES,
            "rows_per_table": rows,
            "masters": 3,
        },  # fmt: skip
        "keys_per_batch": args.keys,
        "batches": args.batches,
        "hmgets_per_batch": round(calls / args.batches, 1),
        "hmget_ms_per_batch": round(usec / args.batches / 1000, 3),
        "redis_server_cpu_ms_per_batch": round(cpu / args.batches * 1000, 3),
        "redis_server_cpu_us_per_row": round(cpu / (args.batches * args.keys) * 1e6, 3),
        "redis_py_wall_ms_per_batch": round(wall / args.batches * 1000, 3),
        "standalone_one_hmget": alone,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / "store_server_time.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    log(json.dumps(out, indent=1))
    log(f"wrote {path}")


if __name__ == "__main__":
    main()
