"""Freshness: how long a trained row takes to reach served responses, with the real parts.

    .venv/bin/python benchmarks/freshness.py                       # the default model
    .venv/bin/python benchmarks/freshness.py --config examples/criteo_kaggle.yaml --label kaggle
    .venv/bin/python benchmarks/freshness.py --compare   # both, in one run, and their ratios

1. Our own redis-server (rec.broker). `rec train` a first part of the run (publishing), `rec
   export` it, and rec-server serves the export with `--updates` on the log.
2. One client sends B = 1 requests back to back over HTTP the whole time and keeps each
   response's embedding watermark (the step whose rows it was scored with) and latency.
3. A quiet window (no training) gives the latency without updates; then `rec train --resume`
   trains the second part, publishing every `--every-s` seconds, while the client goes on.
4. Freshness of a publish at step s: the first response whose watermark reached s minus the
   wall time step s ended ("from step"), and minus when the step after the previous publish
   started ("worst row": a row trained right after the previous publish waits longest).
5. A second replica replays the whole log from the export: the rows/s one replica applies.
6. The publisher's own time per rank (its log line) against the training time: the cost.

Writes benchmarks/results/freshness_<label>.json and prints a summary; the CPU is in the file.

    .venv/bin/python benchmarks/freshness.py --defaults   # issue #52 item 7, a minute or two

--defaults measures freshness as first defined, at the shipped defaults: the config's own
publish, checkpoint and evaluation settings (only publish.url set), a closed-loop B = 64 client
as the load, and per row: from the end of the optimizer step that changed it (metrics.jsonl,
log_every 1) to the first response whose watermark covers that step. It skips the replay and
the update-stream latency windows, and lists every publish and pause beside the numbers.
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import yaml
from freshness_parts import RESULTS, Client, log, percentiles, rec


def stream_latency(repo, url, manifest, records, window_s: float) -> dict:
    """p50/p99 at B = 1 and B = 512 with 0, 10k and 100k rows/s of updates streaming in."""
    import redis
    import torch

    from rec.contract.requests import random_request
    from rec.contract.updates import UpdateRecord, encode, parse_url
    from rec.quantize import fused_rows
    from rec.serve.cpp import launch_cpp

    updates = manifest.updates
    table, place = max(updates.tables.items(), key=lambda kv: kv[1]["rows"])
    per_record = min(1000, place["rows"])
    gen = max(r.gen for r in records) + 1
    rng = np.random.default_rng(0)
    dim, dtype = place["dim"], place["dtype"]
    pool = [
        fused_rows(torch.randn(per_record, dim) * 0.05, dtype).numpy().tobytes() for _ in "abcd"
    ]
    where = parse_url(url)
    client = redis.Redis(host=where.host, port=where.port)
    server = launch_cpp(repo, "--updates", url)
    out: dict = {"table": table, "rows_per_record": per_record}
    step = [max(r.step for r in records) + 1]

    def writer(rate: float, stop: threading.Event) -> None:
        interval, k = per_record / rate, 0
        nxt = time.perf_counter()
        while not stop.is_set():
            drawn = np.unique(rng.integers(0, place["rows"], size=2 * per_record))
            if drawn.size < per_record:  # a table not much larger than a record: all of it
                drawn = np.arange(per_record)
            ids = np.sort(rng.choice(drawn, size=per_record, replace=False))
            rows = pool[k % 4]
            rec = UpdateRecord(updates.run, gen, 0, 1, step[0], time.time_ns(), True, table,
                               dtype, dim, tuple(ids.tolist()), rows)  # fmt: skip
            client.xadd(where.stream, encode(rec))
            step[0] += 1
            k += 1
            nxt += interval
            time.sleep(max(0.0, nxt - time.perf_counter()))

    try:
        for batch in (1, 512):
            request = random_request(len(manifest.dense_names), len(manifest.sparse_names),
                                     batch, seed=2)  # fmt: skip
            for rate in (0, 10_000, 100_000):
                stop = threading.Event()
                w = threading.Thread(target=writer, args=(rate, stop), daemon=True)
                if rate:
                    w.start()
                c = Client(server.endpoints.http, request)
                c.start()
                start = time.time()
                time.sleep(window_s)
                c.stop.set()
                c.join()
                stop.set()
                if rate:
                    w.join()
                lat = percentiles([x * 1e3 for x in c.window(start + 1.0, time.time())])
                out[f"b{batch}_rate{rate}_ms"] = lat
                log(f"B={batch}, {rate} rows/s of updates: {lat}")
            base = out[f"b{batch}_rate0_ms"]["p99"]
            for rate in (10_000, 100_000):
                out[f"b{batch}_rate{rate}_p99_ratio"] = round(
                    out[f"b{batch}_rate{rate}_ms"]["p99"] / base, 3
                )
        out["server_peak_rss_bytes"] = server.peak_rss_bytes()
    finally:
        server.stop()
        client.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default=None, help="YAML config (default: the embedded one)")
    parser.add_argument("--label", default="default")
    parser.add_argument("--first-steps", type=int, default=100)
    parser.add_argument("--steps", type=int, default=600, help="steps trained while serving")
    parser.add_argument("--every-s", type=float, default=0.5, help="publish.every_seconds")
    parser.add_argument("--quiet-s", type=float, default=10.0)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--window-s", type=float, default=8.0,
                        help="seconds per (update rate, batch size) latency window")  # fmt: skip
    parser.add_argument("--compare", action="store_true",
                        help="the default model, then the Kaggle-size one (40 + 200 steps), and "
                        "their ratios in freshness_compare.json")  # fmt: skip
    parser.add_argument("--defaults", action="store_true",
                        help="per-row freshness at the shipped defaults under a B = 64 load "
                        "(--label defaults unless given; --steps counts as given)")  # fmt: skip
    args = parser.parse_args()
    if args.defaults:
        from freshness_defaults import run_defaults

        label = "defaults" if args.label == "default" else args.label
        run_defaults(args.config, label, args.first_steps, args.steps, args.nproc)
        return
    if not args.compare:
        run_one(args, args.config, args.label, args.first_steps, args.steps)
        return
    small = run_one(args, None, "default", args.first_steps, args.steps)
    large = run_one(args, KAGGLE, "kaggle", 40, 200)
    compare(small, large)


KAGGLE = "examples/criteo_kaggle.yaml"
COMPARED = {
    "freshness_p99_s_from_step": ("freshness_s_from_step", "p99"),
    "freshness_p99_s_worst_row": ("freshness_s_worst_row", "p99"),
    "serving_p99_ms_b1_quiet": ("latency_ms_b1_quiet", "p99"),
    "serving_p99_ms_b1_while_training": ("latency_ms_b1_under_updates", "p99"),
    "replay_rows_per_s": ("replay_rows_per_s", None),
    "server_peak_rss_bytes": ("server_peak_rss_bytes", None),
}


def compare(small: dict, large: dict) -> None:
    """freshness_compare.json: each headline number for both models and large / small."""
    rows = {}
    for name, (key, sub) in COMPARED.items():
        a, b = small[key], large[key]
        a, b = (a[sub], b[sub]) if sub else (a, b)
        rows[name] = {"default": a, "kaggle": b, "kaggle_over_default": round(b / a, 3)}
    for batch in (1, 512):
        for rate in (10_000, 100_000):
            key = f"b{batch}_rate{rate}_p99_ratio"
            a = small["serving_under_update_streams"][key]
            b = large["serving_under_update_streams"][key]
            rows[f"p99_with_{rate}_rows_per_s_over_none_b{batch}"] = {"default": a, "kaggle": b}
    rows["publish_share_of_train_time"] = {
        m["label"]: round(m["publish_seconds_rank0"] / m["train_seconds"], 4)
        for m in (small, large)
        if m["publish_seconds_rank0"] is not None
    }
    out = {"benchmark": "freshness_compare", "cpu": small["cpu"], "date": small["date"],
           "command": "benchmarks/freshness.py --compare", "rows": rows}  # fmt: skip
    path = RESULTS / "freshness_compare.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    log(json.dumps(out, indent=1))
    log(f"wrote {path}")


def run_one(args, config: str | None, label: str, first_steps: int, steps: int) -> dict:
    """One model's whole measurement; writes freshness_<label>.json and returns it."""
    from rec.broker import RedisBroker
    from rec.config import load_config
    from rec.contract import ModelDir
    from rec.contract.requests import random_request
    from rec.cpu import cpu_info, describe
    from rec.serve.cpp import launch_cpp
    from rec.train.sharding import PUBLISHABLE_SHARDING_TYPES
    from rec.update_log import read_records

    work = Path(tempfile.mkdtemp(prefix="rec-fresh-"))
    broker = RedisBroker(work / "redis")
    url = broker.url("rec:updates")
    cfg = load_config(config)
    data = yaml.safe_load(cfg.to_yaml())
    data["training"]["steps"] = first_steps
    data["training"]["eval_every"] = 0
    data["training"]["eval_batches"] = 2
    data["checkpoint"]["every_steps"] = 0
    data["publish"] = {"url": url, "every_seconds": args.every_s, "every_steps": 0}
    # Publishing needs whole rows per rank: a table the config keeps data_parallel (the Kaggle
    # config's 3- and 4-row tables) is moved to table_wise here, where `rec train` would refuse it.
    for name, c in (data.get("sharding", {}).get("constraints") or {}).items():
        kept = [s for s in c.get("sharding_types") or [] if s in PUBLISHABLE_SHARDING_TYPES]
        if c.get("sharding_types") and not kept:
            log(f"table {name}: {c['sharding_types']} -> table_wise (publishing needs whole rows)")
            c["sharding_types"] = ["table_wise"]
    data["export"]["eval_batches"] = 2
    config_path = work / "config.yaml"
    config_path.write_text(yaml.safe_dump(data))
    run, repo = work / "run", work / "repo"
    log(f"work in {work}; training the first {first_steps} steps")
    rec("train", "--config", str(config_path), "--run-dir", str(run), "--nproc", str(args.nproc))
    log("exporting")
    rec("export", str(run), "--repo", str(repo))
    manifest = ModelDir.of(repo, "rec").read_manifest()
    server = launch_cpp(repo, "--updates", url)
    request = random_request(len(manifest.dense_names), len(manifest.sparse_names), 1, seed=1)
    client = Client(server.endpoints.http, request)
    client.start()
    quiet_start = time.time()
    time.sleep(args.quiet_s)
    quiet_end = time.time()
    saved = yaml.safe_load((run / "config.yaml").read_text())
    saved["training"]["steps"] = first_steps + steps
    (run / "config.yaml").write_text(yaml.safe_dump(saved))
    log(f"training {steps} more steps while serving, publishing every {args.every_s} s")
    t_train = time.time()
    out = rec("train", "--resume", str(run), "--nproc", str(args.nproc))
    train_s = time.time() - t_train
    last = first_steps + steps
    deadline = time.time() + 120
    while time.time() < deadline and not any(s >= last for _, _, s, _ in client.samples[-50:]):
        time.sleep(0.1)
    busy_end = time.time()
    client.stop.set()
    client.join()
    server_peak = server.peak_rss_bytes()
    records = [r for _, r in read_records(url)]
    server.stop()

    # Freshness per publish of the served generation.
    gen = max(r.gen for r in records)
    ends: dict[int, int] = {}
    for r in records:
        if r.gen == gen and r.last:
            ends[r.step] = max(ends.get(r.step, 0), r.wall_ns)  # the slower rank's end
    served = sorted((t, s) for t, g, s, _ in client.samples if g == gen)
    steps = sorted(ends)
    fresh_step, fresh_worst = [], []
    it = 0
    for k, step in enumerate(steps):
        while it < len(served) and served[it][1] < step:
            it += 1
        if it == len(served):
            break
        t_seen = served[it][0]
        fresh_step.append(t_seen - ends[step] / 1e9)
        if k > 0:
            fresh_worst.append(t_seen - ends[steps[k - 1]] / 1e9)

    # The rows/s one replica applies: a second one replays the whole log from the export.
    rows = sum(r.count for r in records if r.step > first_steps)
    replica = launch_cpp(repo, "--updates", url)
    t0 = time.perf_counter()
    import urllib.request

    def metric(name: str) -> float:
        text = urllib.request.urlopen(f"http://{replica.endpoints.metrics}/metrics").read().decode()
        m = re.search(rf"^{name}{{[^}}]*}} (\S+)$", text, re.M)
        return float(m.group(1)) if m else 0.0

    while metric("rec_update_rows_applied_total") < rows and time.perf_counter() - t0 < 600:
        time.sleep(0.01)
    apply_s = metric("rec_update_busy_us_total") / 1e6
    replica.stop()

    # Serving latency under a steady stream of updates (synthetic rows of a real table, at a set
    # rate) against none, at B = 1 and B = 512, with no training running.
    stream = stream_latency(repo, url, manifest, records, args.window_s)
    broker.stop()

    cost = re.search(r"published to \S+: (\d+) rows from rank 0, ([\d.]+) s", out)
    quiet = client.window(quiet_start, quiet_end)
    busy = client.window(t_train, busy_end)
    results = {
        "benchmark": "freshness",
        "label": label,
        "config": config or "embedded default",
        "cpu": describe(cpu_info()),
        "date": time.strftime("%Y-%m-%d"),
        "publish_every_s": args.every_s,
        "steps_while_serving": steps,
        "freshness_s_from_step": percentiles(fresh_step),
        "freshness_s_worst_row": percentiles(fresh_worst),
        "latency_ms_b1_quiet": percentiles([x * 1e3 for x in quiet]),
        "latency_ms_b1_under_updates": percentiles([x * 1e3 for x in busy]),
        "rows_published": rows,
        "rows_per_s_published": round(rows / train_s, 1),
        "replay_rows_per_s": round(rows / apply_s, 1) if apply_s else None,
        "serving_under_update_streams": stream,
        "publish_seconds_rank0": float(cost.group(2)) if cost else None,
        "train_seconds": round(train_s, 1),
        "server_peak_rss_bytes": server_peak,
    }
    q, b = results["latency_ms_b1_quiet"], results["latency_ms_b1_under_updates"]
    if q.get("p99") and b.get("p99"):
        results["p99_under_updates_over_quiet"] = round(b["p99"] / q["p99"], 3)
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"freshness_{label}.json"
    path.write_text(json.dumps(results, indent=1) + "\n")
    log(json.dumps(results, indent=1))
    log(f"wrote {path}")
    return results


if __name__ == "__main__":
    main()
