"""The demo's live-stream step: training from a stream of events whose ids churn, collision-free
(ZCH) tables admitting new ids and evicting old ones, and a server applying rows and id-map
changes while it answers.

    .venv/bin/python scripts/demo_stream.py --out artifacts/demo   # make demo runs it

Starts our own redis-server (events and the update log), replays a drifting synthetic stream
(ids born and retired, the hidden rule turning) with `rec stream replay`, trains a warm-up from
it (`rec train --stream`), exports it, serves it with rec-server `--updates`, then replays the
live part while `rec train --resume --publish` goes on from the stream. It prints the trainer's
progress lines (online AUC: each batch scored before it is trained on) and, once a second, what
the server answers for a sample holding an id born after the export: read from the table's
default row at first, then admitted by training, its row arriving through the update log.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parent.parent
REC = str(ROOT / ".venv/bin/rec")
ZCH_TABLE, WARM, LIVE = "t1", 40_000, 80_000


def config(out: Path, events: str) -> Path:
    """The default model with table t1 collision-free, on synthetic ids that churn and a rule
    that drifts, trained from `events`."""
    from rec.config import config_from_dict, load_config

    data = yaml.safe_load(load_config(None).to_yaml())
    for t in data["tables"]:
        if t["name"] == ZCH_TABLE:
            t["rows"] = 3001  # 3000 slots and the default row, for 4000 live ids: evictions
            t["ids"] = {"zch": {"every_steps": 25, "admit_after": 2}}
    data["data"]["synthetic"].update(live_ids={ZCH_TABLE: 4000}, churn=3.0, teacher_drift=1.0)
    # Each run ends once the stream has been quiet for 3 s: the replayer has sent everything.
    data["data"]["stream"] = {"url": events, "wait_s": 0.2, "idle_exit_s": 3}
    data["training"].update(log_every=25, profile_steps=0)
    data["checkpoint"] = {"every_steps": 100, "keep_last": 2}
    config_from_dict(data)  # refused here rather than by the ranks
    path = out / "stream.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def run(args: list[str], prefix: str) -> list[str]:
    """`rec ARGS`, its progress lines shown with a prefix; raises on failure."""
    proc = subprocess.Popen([REC, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)  # fmt: skip
    lines = _show(proc, prefix)
    if proc.wait() != 0:
        sys.stdout.write("".join(lines[-30:]))
        raise SystemExit(f"rec {' '.join(args)} exited {proc.returncode}")
    return lines


_SHOWN = re.compile(r"^step |zch:|checkpoint committed|stopped|online|exported|verified")


def _show(proc: subprocess.Popen, prefix: str) -> list[str]:
    lines = []
    for line in proc.stdout:  # type: ignore[union-attr]
        lines.append(line)
        text = line.removeprefix("[rec train] ").rstrip()
        if _SHOWN.search(text):
            print(f"  {prefix} | {text}", flush=True)
    return lines


def new_id_sample(cfg_path: Path, version_dir: Path):
    """A sample of the live part holding the most frequent t1 id that the export's map lacks."""
    from rec.config import load_config
    from rec.data.synthetic import SyntheticSource
    from rec.serve.client import Rows
    from rec.serve.unknown_ids import artifact_maps

    cfg = load_config(cfg_path)
    maps, feature_tables = artifact_maps(version_dir)
    feature = next(f for f, t in feature_tables.items() if t == ZCH_TABLE)
    f = list(cfg.features.sparse).index(feature)
    keys, used, probes = maps[ZCH_TABLE]
    held = set(keys[used].tolist())
    rows = SyntheticSource(cfg, "train").take(WARM, WARM + LIVE // 3).rows
    starts = np.concatenate([[0], np.cumsum(rows.lengths.ravel())])
    per_sample = rows.lengths.shape[1]
    counts: Counter = Counter()
    for i in range(len(rows.labels)):
        j = i * per_sample + f
        counts.update(v for v in rows.values[starts[j] : starts[j + 1]].tolist() if v not in held)
    new_id = counts.most_common(1)[0][0]
    for i in range(len(rows.labels)):
        j = i * per_sample + f
        if new_id in rows.values[starts[j] : starts[j + 1]].tolist():
            lo, hi = starts[i * per_sample], starts[(i + 1) * per_sample]
            sample = Rows(rows.dense[i : i + 1], rows.lengths[i : i + 1].astype(np.int32),
                          rows.values[lo:hi].astype(np.int64))  # fmt: skip
            return new_id, feature, sample
    raise RuntimeError("no sample holds the chosen id")


def unknown_total(metrics_url: str, feature: str) -> float:
    text = urllib.request.urlopen(f"http://{metrics_url}/metrics", timeout=5).read().decode()
    for line in text.splitlines():
        ours = line.startswith("rec_questionable_ids_total{") and f'feature="{feature}"' in line
        if ours and 'reason="unknown"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "artifacts" / "demo")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--rate", type=float, default=6000, help="live events per second")
    args = parser.parse_args()

    from rec.broker import RedisBroker
    from rec.serve.client import ScoreClient
    from rec.serve.cpp import launch_cpp

    out = args.out
    broker = RedisBroker(out / "stream_redis")
    events, updates = broker.url("rec:events"), broker.url("rec:updates")
    cfg = config(out, events)
    run_path, repo = out / "stream_run", out / "stream_repository"
    t0 = time.time()
    try:
        print(f"replaying {WARM:,} events (t1's ids churning, the rule drifting) into {events}; "
              "a warm-up trains on them")  # fmt: skip
        run(
            ["stream", "replay", "--synthetic", str(WARM), "--to", events, "-c", str(cfg)], "replay"
        )
        run(["train", "-c", str(cfg), "--run-dir", str(run_path), "--nproc", str(args.nproc)],
            "train")  # fmt: skip
        run(["export", str(run_path), "--repo", str(repo)], "export")
        server = launch_cpp(repo, "--updates", updates)
        new_id, feature, sample = new_id_sample(cfg, repo / "rec" / "1")
        print(f"rec-server serves the warm-up's export; a sample with {feature}={new_id}, an id "
              "born after it, reads t1's default row until training admits it",
              flush=True)  # fmt: skip
        replay = subprocess.Popen([REC, "stream", "replay", "--synthetic", str(LIVE), "--start",
                                   str(WARM), "--rate", str(args.rate), "--to", events, "-c",
                                   str(cfg)], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)  # fmt: skip
        train = subprocess.Popen([REC, "train", "--resume", str(run_path), "--nproc",
                                  str(args.nproc), "--publish", updates],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True)  # fmt: skip
        lines: list[str] = []
        shown = threading.Thread(target=lambda: lines.extend(_show(train, "train")), daemon=True)
        shown.start()
        client = ScoreClient(server.endpoints.http, "http")
        seen, scores, admitted = unknown_total(server.endpoints.metrics, feature), [], None
        while train.poll() is None:
            score = float(client.score(sample)[0, 0])
            now = unknown_total(server.endpoints.metrics, feature)
            unknown = now > seen
            seen = now
            if not unknown and admitted is None:
                admitted = time.time()
            scores.append(score)
            state = "default row (unknown)" if unknown else "its own row"
            print(f"  serve | {feature}={new_id}: {state}, score {score:.4f}", flush=True)
            time.sleep(1.0)
        shown.join(timeout=10)
        replay.kill()
        server.stop()
        if train.returncode != 0:
            sys.stdout.write("".join(lines[-40:]))
            raise SystemExit(f"rec train --resume exited {train.returncode}")
    finally:
        broker.stop()
    changed = len(set(round(s, 6) for s in scores))
    print(f"the stream step took {time.time() - t0:.0f} s; the new id was "
          f"{'admitted' if admitted else 'never admitted'} on the server, and its score took "
          f"{changed} values while training went on")  # fmt: skip
    return 0 if admitted and changed > 1 else 1


if __name__ == "__main__":
    sys.exit(main())
