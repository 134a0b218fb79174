"""Freshness as issue #52 item 7 defines it, at the shipped defaults (`freshness.py --defaults`).

Per row: from the end of the optimizer step that changed it to the first response scored with
it. A response carries the replica's watermark (the smallest step over the ranks' newest
complete publishes), so a response with watermark >= s holds every row step s changed: the
first such response after step s ended is counted. Step ends come from metrics.jsonl
(training.log_every 1, rank 0, written right after the step) and, at a publish's step, the
earlier of that and the publish's wall_ns. Everything else is the config's own: publish
interval, checkpoints, evaluations.
"""

from __future__ import annotations

import itertools
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml
from freshness_parts import RESULTS, Client, log, percentiles, rec

LOAD_BATCH = 64


def _config(config: str | None, url: str, first_steps: int, work: Path) -> Path:
    from rec.config import load_config

    data = yaml.safe_load(load_config(config).to_yaml())
    data["training"]["steps"] = first_steps
    data["training"]["log_every"] = 1  # every step's end time, for the per-row definition
    data["publish"]["url"] = url  # every other publish setting stays the default
    path = work / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _step_ends(run: Path, records, gen: int, after: int) -> tuple[dict[int, float], list]:
    """{step: wall time it ended} for steps > after, and the pauses (evaluations, checkpoints)
    seen in metrics.jsonl as the gaps between consecutive steps' records."""
    ends: dict[int, float] = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r.get("kind") == "train" and r["step"] > after:
            ends[r["step"]] = r["time"]
    for r in records:
        if r.gen == gen and r.step in ends:
            ends[r.step] = min(ends[r.step], r.wall_ns / 1e9)
    steps = sorted(ends)
    gaps = [(b, round(ends[b] - ends[a], 3)) for a, b in itertools.pairwise(steps)]
    typical = float(np.median([g for _, g in gaps])) if gaps else 0.0
    pauses = [(s, g) for s, g in gaps if g > max(0.2, 5 * typical)]
    return ends, pauses


def _freshness(ends: dict[int, float], served: list[tuple[float, int]]) -> dict[int, float]:
    """{step: seconds from its end to the first response whose watermark covers it}."""
    out, it = {}, 0
    for step in sorted(ends):
        while it < len(served) and served[it][1] < step:
            it += 1
        if it == len(served):
            break
        out[step] = max(0.0, served[it][0] - ends[step])  # ms-rounded step ends: never < 0
    return out


def _publishes(records, gen: int, t0: float) -> list[dict]:
    """Each complete publish of the served generation: rank, step, seconds after t0."""
    return [{"rank": r.rank, "step": r.step, "t": round(r.wall_ns / 1e9 - t0, 3)}
            for r in records if r.gen == gen and r.last]  # fmt: skip


def run_defaults(config: str | None, label: str, first_steps: int, steps: int,
                 nproc: int) -> dict:  # fmt: skip
    from rec.broker import RedisBroker
    from rec.contract import ModelDir
    from rec.contract.requests import random_request
    from rec.serve.cpp import launch_cpp
    from rec.update_log import read_records

    work = Path(tempfile.mkdtemp(prefix="rec-fresh-defaults-"))
    broker = RedisBroker(work / "redis")
    url = broker.url("rec:updates")
    run, repo = work / "run", work / "repo"
    cfg_path = _config(config, url, first_steps, work)
    log(f"work in {work}; training the first {first_steps} steps")
    rec("train", "--config", str(cfg_path), "--run-dir", str(run), "--nproc", str(nproc))
    rec("export", str(run), "--repo", str(repo))
    manifest = ModelDir.of(repo, "rec").read_manifest()
    server = launch_cpp(repo, "--updates", url)
    request = random_request(len(manifest.dense_names), len(manifest.sparse_names), LOAD_BATCH,
                             seed=1)  # fmt: skip
    client = Client(server.endpoints.http, request)
    client.start()
    time.sleep(2.0)
    saved = yaml.safe_load((run / "config.yaml").read_text())
    saved["training"]["steps"] = first_steps + steps
    (run / "config.yaml").write_text(yaml.safe_dump(saved))
    log(f"training {steps} more steps while serving a closed-loop B = {LOAD_BATCH} load")
    t_train = time.time()
    out = rec("train", "--resume", str(run), "--nproc", str(nproc))
    train_s = time.time() - t_train
    last = first_steps + steps
    deadline = time.time() + 60
    while time.time() < deadline and not any(s >= last for _, _, s, _ in client.samples[-5:]):
        time.sleep(0.05)
    client.stop.set()
    client.join()
    records = [r for _, r in read_records(url)]
    server.stop()
    broker.stop()
    return _report(locals())


def _report(v: dict) -> dict:
    from rec.config import load_config
    from rec.cpu import cpu_info, describe

    records, run, client, t_train = v["records"], v["run"], v["client"], v["t_train"]
    gen = max(r.gen for r in records)
    ends, pauses = _step_ends(run, records, gen, v["first_steps"])
    served = sorted((t, s) for t, g, s, _ in client.samples if g == gen)
    fresh = _freshness(ends, served)
    worst = sorted(fresh.items(), key=lambda kv: -kv[1])[:10]
    defaults = load_config(v["config"])
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    results = {
        "benchmark": "freshness_defaults",
        "label": v["label"],
        "config": v["config"] or "embedded default",
        "cpu": describe(cpu_info()),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "loadavg_after": load,
        "nproc": v["nproc"],
        "publish": {
            "every_seconds": defaults.publish.every_seconds,
            "every_steps": defaults.publish.every_steps,
        },  # fmt: skip
        "checkpoint_every_steps": defaults.checkpoint.every_steps,
        "eval_every": defaults.training.eval_every,
        "load_batch": LOAD_BATCH,
        "steps_while_serving": v["steps"],
        "train_seconds": round(v["train_s"], 1),
        "responses": len(served),
        "freshness_s_per_row_step": percentiles(list(fresh.values())),
        "steps_not_seen": len(ends) - len(fresh),
        "worst_steps": [[s, round(f, 3)] for s, f in worst],
        "pauses": pauses,
        "publishes": _publishes(records, gen, t_train),
        "published_line": [ln for ln in v["out"].splitlines() if "published to" in ln],
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"freshness_{v['label']}.json"
    path.write_text(json.dumps(results, indent=1) + "\n")
    log(json.dumps({k: results[k] for k in results if k != "publishes"}, indent=1))
    log(f"wrote {path}")
    return results
