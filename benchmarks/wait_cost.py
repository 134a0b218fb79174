"""WAIT's cost to the event replayer (#60): `rec stream replay`'s events/s and round-trip times
with WAIT 0 (no wait) against WAIT 1 (each round trip waits for one replica), on a master with one
replica, runs interleaved in pairs (0, 1, 0, 1, ...) on the same machine.

    .venv/bin/python benchmarks/wait_cost.py --label epyc_avx512  # about 3 minutes

The script starts both redis-servers itself (rec.broker: append-only, fsync always, as rec runs
them; the replica with --replicaof) on free ports. Each run replays the same N synthetic events
(generated once, before the runs, so that the generator's time is not in the rate) into a fresh
stream of P partitions through rec.data.replay.replay, the code `rec stream replay` runs, with
wait_replicas 0 or 1. A round trip is one sender flush (a pipeline of XADDs, with WAIT 1 its
WAIT); its time is taken around _Sender.flush, the benchmark's own probe.

The publisher (publish.wait_replicas): pairs of short `rec train --publish` runs (2 ranks, the
default model and publish settings, to the same master) with wait_replicas 0 and 1: samples/s
(the median of metrics.jsonl's after 30 steps) and publish_seconds (the slowest rank's training
time spent publishing, from its summary line). Its sender is a thread, so WAIT costs training
only when publish.max_pending publishes queue up, and at flush and close.

The plan's rule for `auto` (1 when the master has a replica): keep it unless WAIT 1 drops
events/s by more than 10 % or adds more than 100 ms to the round trip's p99.
The cluster variant: the same replays on a 3+3 cluster (rec.store.cluster, append-only off as it
runs them), each master's replica online first.
Writes benchmarks/results/wait_cost[_LABEL].json.
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import redis

from rec.broker import RedisBroker
from rec.cpu import cpu_info, describe
from rec.data import replay as replay_mod

RESULTS = Path(__file__).parent / "results"
REC = str(Path(__file__).resolve().parent.parent / ".venv" / "bin" / "rec")
WARMUP = 30
"""Training steps left out of a run's samples/s (publish_cost.py's)."""
PUBLISHED = re.compile(r"published to \S+: (\d+) rows .* at most ([\d.]+) s of a rank")
MAX_DROP = 0.10
"""The plan's rule: events/s may drop by at most this fraction under WAIT 1."""
MAX_P99_GROWTH_MS = 100.0
"""... and the round trip's p99 may grow by at most this much."""


def log(msg: str) -> None:
    print(f"[wait_cost] {msg}", flush=True)


def pair_brokers(work: Path) -> tuple[RedisBroker, RedisBroker]:
    """A master and its replica, returned once the replica is online. A replica counts in
    connected_slaves from its first sync on, but ACKs only when online: the master's diskless
    sync starts after repl-diskless-sync-delay (5 s), and meanwhile every WAIT 1 times out."""
    master = RedisBroker(work / "master")
    replica = RedisBroker(work / "replica", extra=("--replicaof", master.host, str(master.port)))
    client = redis.Redis(host=master.host, port=master.port)
    deadline = time.monotonic() + 30
    while client.info("replication").get("slave0", {}).get("state") != "online":
        if time.monotonic() > deadline:
            raise RuntimeError(f"the replica did not connect: {replica.log_tail()}")
        time.sleep(0.1)
    client.close()
    return master, replica


class RoundTrips:
    """Times each non-empty _Sender.flush (one pipelined round trip, its WAIT included)."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self.original = replay_mod._Sender.flush

    def __enter__(self) -> RoundTrips:
        original, seconds = self.original, self.seconds

        def timed(sender) -> None:
            if not sender.queued:
                return original(sender)
            t0 = time.perf_counter()
            original(sender)
            seconds.append(time.perf_counter() - t0)

        replay_mod._Sender.flush = timed
        return self

    def __exit__(self, *exc: object) -> None:
        replay_mod._Sender.flush = self.original


def one_run(url: str, chunks: list, partitions: int, wait: int) -> dict:
    """One replay of `chunks` into the fresh stream at `url` with WAIT `wait`."""
    with RoundTrips() as trips:
        stats = replay_mod.replay(iter(chunks), url, partitions=partitions, wait_replicas=wait,
                                  log=lambda line: None)  # fmt: skip
    ms = np.asarray(trips.seconds) * 1000.0
    return {
        "wait": wait,
        "events": stats.events,
        "entries": stats.entries,
        "seconds": round(stats.seconds, 3),
        "events_per_s": round(stats.rate),
        "unreplicated": stats.unreplicated,
        "round_trips": int(ms.size),
        "round_trip_ms": {
            "p50": round(float(np.percentile(ms, 50)), 3),
            "p99": round(float(np.percentile(ms, 99)), 3),
            "max": round(float(ms.max()), 3),
        },  # fmt: skip
    }


def train_run(work: Path, url: str, wait: int, steps: int) -> dict:
    """A short `rec train --publish` to `url` with publish.wait_replicas `wait`: the median
    samples/s after WARMUP steps, the rows published and publish_seconds (the slowest rank's
    training time spent publishing, from its summary line)."""
    import yaml

    from rec.config import load_config

    data = yaml.safe_load(load_config(None).to_yaml())
    data["training"].update(steps=steps, eval_every=0, eval_batches=2, log_every=10)
    data["checkpoint"]["every_steps"] = 0
    data["publish"].update(url=url, wait_replicas=wait)  # every other publish setting the default
    work.mkdir(parents=True)
    (work / "config.yaml").write_text(yaml.safe_dump(data))
    proc = subprocess.run([REC, "train", "--config", str(work / "config.yaml"), "--run-dir",
                           str(work / "run"), "--nproc", "2"], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=900)  # fmt: skip
    found = PUBLISHED.search(proc.stdout)
    if proc.returncode != 0 or found is None:
        sys.exit(f"rec train (wait {wait}) failed or published nothing:\n{proc.stdout[-3000:]}")
    lines = (work / "run" / "metrics.jsonl").read_text().splitlines()
    rates = [r["samples_per_s"] for r in map(json.loads, lines)
             if r.get("kind") == "train" and r["step"] > WARMUP]  # fmt: skip
    return {"wait": wait, "samples_per_s": round(float(np.median(rates))),
            "published_rows": int(found.group(1)),
            "publish_seconds": float(found.group(2))}  # fmt: skip


def publisher_verdict(runs: list[dict]) -> dict:
    """samples/s WAIT 1 over WAIT 0, each pair's and their median; publish_seconds per mode."""
    ratios = [round(b["samples_per_s"] / a["samples_per_s"], 4)
              for a, b in zip(runs[0::2], runs[1::2], strict=True)]  # fmt: skip
    return {
        "samples_per_s_wait1_over_wait0": round(float(np.median(ratios)), 4) if ratios else None,
        "samples_per_s_wait1_over_wait0_each_pair": ratios,
        "publish_seconds": {
            w: [r["publish_seconds"] for r in runs if r["wait"] == w] for w in (0, 1)
        },  # fmt: skip
        "runs": runs,
    }


def vm_hwm_kb(pid: int) -> int:
    """A live process's peak RSS (VmHWM), kB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def medians(runs: list[dict]) -> dict:
    """The runs' median events/s and round-trip p50 and p99."""
    return {"events_per_s": float(np.median([r["events_per_s"] for r in runs])),
            "p50_ms": float(np.median([r["round_trip_ms"]["p50"] for r in runs])),
            "p99_ms": float(np.median([r["round_trip_ms"]["p99"] for r in runs]))}  # fmt: skip


def verdict(runs: list[dict]) -> dict:
    """Medians per mode, the ratios (each pair's, their median, the medians'), and the plan's
    rule on the median pair ratio and the growth of the median p99."""
    med = {w: medians([r for r in runs if r["wait"] == w]) for w in (0, 1)}
    by_pair: dict[int, dict[int, dict]] = {}
    for r in runs:
        by_pair.setdefault(r["pair"], {})[r["wait"]] = r
    pair_ratios = [round(p[1]["events_per_s"] / p[0]["events_per_s"], 4)
                   for p in by_pair.values()]  # fmt: skip
    # Runs drift with the shared machine's load; a pair's two runs are seconds apart, so the
    # median of the pairs' ratios is the rule's number, not the ratio of the medians.
    rate_ratio = float(np.median(pair_ratios))
    p99_growth = med[1]["p99_ms"] - med[0]["p99_ms"]
    keep = rate_ratio >= 1 - MAX_DROP and p99_growth <= MAX_P99_GROWTH_MS
    return {
        "median_wait0": med[0],
        "median_wait1": med[1],
        "events_per_s_wait1_over_wait0": round(rate_ratio, 4),
        "events_per_s_wait1_over_wait0_each_pair": pair_ratios,
        "events_per_s_median_wait1_over_median_wait0": round(
            med[1]["events_per_s"] / med[0]["events_per_s"], 4
        ),
        "p50_ms_wait1_over_wait0": round(med[1]["p50_ms"] / med[0]["p50_ms"], 4),
        "p99_ms_wait1_over_wait0": round(med[1]["p99_ms"] / med[0]["p99_ms"], 4),
        "p99_growth_ms": round(p99_growth, 3),
        "rule": f"keep auto unless events/s drops > {MAX_DROP:.0%} or p99 grows > "
        f"{MAX_P99_GROWTH_MS:.0f} ms",
        "keep_auto": bool(keep),
    }


def replay_pairs(name: str, url: str, masters: list, chunks: list, args, loads: list) -> list:
    """args.pairs (or cluster_pairs) interleaved replays into fresh streams at `url`; every
    master flushed after each run."""
    runs = []
    for k in range(args.cluster_pairs if name == "cluster" else args.pairs):
        for wait in (0, 1):
            runs.append({"pair": k, **one_run(f"{url}/rec:wait{k}x{wait}", chunks,
                                              args.partitions, wait)})  # fmt: skip
            loads.append(Path("/proc/loadavg").read_text().split()[0])
            r = runs[-1]
            log(f"{name} pair {k}, WAIT {wait}: {r['events_per_s']:,} events/s, round trip "
                f"p50 {r['round_trip_ms']['p50']} ms p99 {r['round_trip_ms']['p99']} ms, "
                f"{r['unreplicated']} unreplicated")  # fmt: skip
            flush(masters)
    return runs


def flush(masters: list) -> None:
    for host, port in masters:
        redis.Redis(host=host, port=port).flushall()


def train_pairs(work: Path, master: RedisBroker, args) -> list:
    """args.train_pairs interleaved short `rec train --publish` runs to `master`."""
    trains = []
    for k in range(args.train_pairs):
        for wait in (0, 1):
            url = master.url(f"rec:pub{k}x{wait}")
            trains.append(train_run(work / f"train{k}x{wait}", url, wait, args.train_steps))
            t = trains[-1]
            log(f"train pair {k}, publish WAIT {wait}: {t['samples_per_s']:,} samples/s, "
                f"{t['published_rows']:,} rows published, {t['publish_seconds']} s "
                "of a rank's training time publishing")  # fmt: skip
            flush([(master.host, master.port)])
    return trains


def cluster_masters(cluster) -> list[tuple[str, int]]:
    """The cluster's masters, once each has its replica online (pair_brokers' reason)."""
    out = []
    for node in cluster.masters():
        client = redis.Redis(host=node.host, port=node.port)
        deadline = time.monotonic() + 30
        while client.info("replication").get("slave0", {}).get("state") != "online":
            if time.monotonic() > deadline:
                raise RuntimeError(f"{node.address}: its replica is not online")
            time.sleep(0.1)
        client.close()
        out.append((node.host, node.port))
    return out


def run_all(work: Path, chunks: list, args) -> dict:
    """Every measurement: the pair's replays and train runs, then the cluster's replays."""
    loads: list[str] = []
    master, replica = pair_brokers(work)
    try:
        one = [(master.host, master.port)]
        runs = replay_pairs("master+replica", master.url(), one, chunks, args, loads)
        trains = train_pairs(work, master, args)
        rss = {"master_kb": vm_hwm_kb(master.proc.pid),
               "replica_kb": vm_hwm_kb(replica.proc.pid)}  # fmt: skip
    finally:
        replica.stop()
        master.stop()
    cluster_runs = []
    if args.cluster_pairs:
        from rec.store.cluster import RedisCluster

        with RedisCluster(work / "cluster", masters=3, replicas=1) as cluster:
            masters = cluster_masters(cluster)
            cluster_runs = replay_pairs("cluster", cluster.url(), masters, chunks, args, loads)
    return {"runs": runs, "trains": trains, "cluster_runs": cluster_runs, "rss": rss,
            "loads": loads}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=60_000)
    parser.add_argument("--pairs", type=int, default=10)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--train-pairs", type=int, default=2,
                        help="pairs of short rec train --publish runs (0: none)")  # fmt: skip
    parser.add_argument("--train-steps", type=int, default=300)
    parser.add_argument("--cluster-pairs", type=int, default=5,
                        help="pairs of replays on a 3+3 cluster (0: none)")  # fmt: skip
    parser.add_argument("--label", default="", help="results file suffix, e.g. the CPU")
    args = parser.parse_args()
    from rec.config import load_config

    total, gen = replay_mod.synthetic_events(load_config(None), args.events)
    chunks = list(gen)  # generated once: the runs time the sending only
    log(f"{total:,} synthetic events in {len(chunks)} chunks")
    with tempfile.TemporaryDirectory(prefix="rec-waitcost-") as tmp:
        got = run_all(Path(tmp), chunks, args)
    runs, trains, rss = got["runs"], got["trains"], got["rss"]
    rss["bench_process_kb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    rss["largest_train_process_kb"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    label = f" --label {args.label}" if args.label else ""
    out = {
        "benchmark": "wait_cost",
        "cpu": describe(cpu_info()),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "command": f"benchmarks/wait_cost.py --events {args.events} --pairs {args.pairs} "
        f"--partitions {args.partitions} --train-pairs {args.train_pairs} "
        f"--train-steps {args.train_steps} --cluster-pairs {args.cluster_pairs}{label}",
        "setup": "1 master + 1 replica (redis-server --replicaof), appendfsync always, "
        "localhost; rec.data.replay.replay of synthetic events, per_entry 64",
        **verdict(runs),
        "runs": runs,
        "loadavg_1min_after_each_run": got["loads"],
        "publisher": publisher_verdict(trains),
        "cluster": {
            "setup": "3 masters + 3 replicas (rec.store.cluster: append-only off), "
            "localhost, the same replays",
            **verdict(got["cluster_runs"]),
            "runs": got["cluster_runs"],
        }
        if got["cluster_runs"]
        else None,
        "peak_rss": rss,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / (f"wait_cost_{args.label}.json" if args.label else "wait_cost.json")
    path.write_text(json.dumps(out, indent=1) + "\n")
    log(json.dumps({k: v for k, v in out.items() if k != "runs"}, indent=1))
    log(f"wrote {path}")


if __name__ == "__main__":
    main()
