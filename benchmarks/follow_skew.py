"""The skew between dense layers and rows: how far the dense layers a server answers with trail
the rows it answers with, when rows come through the update log and dense layers through
`rec export --follow`. All real processes on one machine:

    .venv/bin/python benchmarks/follow_skew.py                 # the default model, 2 ranks
    .venv/bin/python benchmarks/follow_skew.py --every-steps 50 --label every50

1. Our own redis-server (rec.broker); `rec train --publish` (default publish settings) with a
   checkpoint every `--every-steps` steps; `rec export --follow` on the run; rec-server with
   `--updates` and `--poll-repository-s 1`, started on the first version.
2. A client sends a B = 1 request every 10 ms and keeps each response's version (dense
   layers: the checkpoint step that version holds) and embedding watermark (rows: the step and
   wall time of the newest publish it applied).
3. While training runs, per response: skew in steps = watermark step - dense step; in seconds
   = the watermark's wall time - the wall time of the dense step (its publish before the
   checkpoint commit, from the update log; the later rank's).
4. Per version, where its time went: the step's end -> the checkpoint committed -> the version
   in the repository (the follower's line) -> the first response from it; and the time between
   checkpoints, which sets the rest of the skew.
5. After each swap: how many steps the rows went back (the new version's reader replays the
   log from its checkpoint) and how long until they were as new as before the swap.

Writes benchmarks/results/follow_skew[_<label>].json and prints it; the CPU and the load
average during the run are in the file.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parent.parent
REC = str(ROOT / ".venv" / "bin" / "rec")
RESULTS = ROOT / "benchmarks" / "results"
VERSION_LINE = re.compile(r"^version \S+ (\d+): step (\d+).*?\(([\d.]+) s after its commit\)")


def log(msg: str) -> None:
    print(f"[follow_skew] {msg}", flush=True)


def stats(values) -> dict:
    a = np.asarray(values, dtype=float)
    if a.size == 0:
        return {"n": 0}
    p50, p99 = (round(float(np.percentile(a, q)), 3) for q in (50, 99))
    return {"n": int(a.size), "mean": round(float(a.mean()), 3), "p50": p50, "p99": p99,
            "max": round(float(a.max()), 3)}  # fmt: skip


class Client(threading.Thread):
    """A B = 1 request every `period` s: (time, version, watermark step, watermark wall s)."""

    def __init__(self, http: str, request: dict, period: float = 0.01) -> None:
        super().__init__(daemon=True)
        self.http, self.request, self.period = http, request, period
        self.samples: list[tuple[float, int, int, float]] = []
        self.errors = 0
        self.stop = threading.Event()

    def run(self) -> None:
        import tritonclient.http as httpclient
        from tritonclient.utils import InferenceServerException

        from rec.contract import DTYPES

        with httpclient.InferenceServerClient(self.http) as c:
            inputs = []
            for name, arr in self.request.items():
                i = httpclient.InferInput(name, list(arr.shape), DTYPES[name])
                i.set_data_from_numpy(arr)
                inputs.append(i)
            while not self.stop.wait(self.period):
                try:
                    response = c.infer("rec", inputs).get_response()
                except InferenceServerException:
                    self.errors += 1
                    continue
                p = response.get("parameters", {})
                self.samples.append((time.time(), int(response["model_version"]),
                                     p.get("embedding_watermark_step", -1),
                                     p.get("embedding_watermark_wall_ns", 0) / 1e9))  # fmt: skip


class Follower(threading.Thread):
    """`rec export --follow`'s lines as they come: version -> (step, commit-to-version s)."""

    def __init__(self, proc: subprocess.Popen) -> None:
        super().__init__(daemon=True)
        self.proc, self.lines = proc, []
        self.versions: dict[int, tuple[int, float, float]] = {}
        self.start()

    def run(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())
            m = VERSION_LINE.match(line)
            if m:
                self.versions[int(m.group(1))] = (int(m.group(2)), float(m.group(3)), time.time())


def write_config(work: Path, url: str, steps: int, every: int) -> Path:
    from rec.config import load_config

    data = yaml.safe_load(load_config(None).to_yaml())
    data["training"].update(steps=steps, eval_every=0)
    data["checkpoint"].update(every_steps=every, keep_last=1000)  # commit times read at the end
    data["publish"]["url"] = url  # publish.every_seconds etc. at their defaults
    data["export"]["eval_batches"] = 4
    path = work / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def step_walls(url: str) -> dict[int, float]:
    """Each published step's wall time (s): the later rank's, of the newest generation."""
    from rec.update_log import read_records

    walls: dict[int, float] = {}
    for _, r in read_records(url):
        walls[r.step] = max(walls.get(r.step, 0.0), r.wall_ns / 1e9)
    return walls


def analyse(client: Client, follower: Follower, run: Path, walls: dict, end: float) -> dict:
    from rec import run_dir

    dense_step = {v: s for v, (s, _, _) in follower.versions.items()}
    commits = {int(p.name[5:]): float((p / run_dir.COMMITTED_FILE).read_text())
               for p in run_dir.committed_steps(run)}  # fmt: skip
    skew_steps, skew_s = [], []
    for t, version, wm_step, wm_wall in client.samples:
        step = dense_step.get(version)
        if t > end or step is None or step not in walls or wm_wall <= 0:
            continue
        skew_steps.append(wm_step - step)
        skew_s.append(wm_wall - walls[step])
    first_seen: dict[int, float] = {}
    for t, version, _, _ in client.samples:
        first_seen.setdefault(version, t)
    catch_up = rows_catch_up(client.samples)
    per_version = []
    for v, (step, after_commit, _) in sorted(follower.versions.items()):
        if step not in walls or step not in commits or v not in first_seen:
            continue
        per_version.append({
            "version": v, "step": step,
            "step_to_commit_s": round(commits[step] - walls[step], 3),
            "commit_to_version_s": after_commit,
            "version_to_served_s": round(first_seen[v] - commits[step] - after_commit, 3),
            "step_to_served_s": round(first_seen[v] - walls[step], 3),
            **catch_up.get(v, {}),
        })  # fmt: skip
    ckpt = sorted(s for s in commits if s in walls)
    intervals = [walls[b] - walls[a] for a, b in zip(ckpt, ckpt[1:], strict=False)]
    return {
        "checkpoint_interval_s": stats(intervals),
        "skew_steps": stats(skew_steps),
        "skew_s": stats(skew_s),
        "per_version": per_version,
        "step_to_served_s": stats([p["step_to_served_s"] for p in per_version]),
        "commit_to_version_s": stats([p["commit_to_version_s"] for p in per_version]),
        "version_to_served_s": stats([p["version_to_served_s"] for p in per_version]),
        "rows_set_back_steps": stats(
            [p["rows_set_back_steps"] for p in per_version if "rows_set_back_steps" in p]
        ),
        "rows_catch_up_s": stats(
            [p["rows_catch_up_s"] for p in per_version if p.get("rows_catch_up_s") is not None]
        ),
    }


def rows_catch_up(samples: list) -> dict[int, dict]:
    """After a swap the new version's reader replays the log from its start: its first
    responses have the checkpoint's rows, older than the version before it answered with. Per
    version: how many steps the rows went back, and how long until they were as new again."""
    out: dict[int, dict] = {}
    newest: dict[int, int] = {}
    for i, (t, version, wm_step, _) in enumerate(samples):
        if version in newest or not newest:
            newest[version] = max(newest.get(version, -1), wm_step)
            continue
        before = max(newest.values())
        caught = next((u for u, v, w, _ in samples[i:] if v == version and w >= before), None)
        out[version] = {
            "rows_set_back_steps": max(0, before - wm_step),
            "rows_catch_up_s": None if caught is None else round(caught - t, 3),
        }
        newest[version] = wm_step
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=900)
    parser.add_argument("--every-steps", type=int, default=100, help="checkpoint.every_steps")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--label", default="")
    args = parser.parse_args()

    from rec.broker import RedisBroker
    from rec.contract import ModelDir
    from rec.contract.requests import random_request
    from rec.cpu import cpu_info, describe
    from rec.serve.cpp import launch_cpp

    work = Path(tempfile.mkdtemp(prefix="rec-follow-skew-"))
    broker = RedisBroker(work / "redis")
    url = broker.url("rec:updates")
    config = write_config(work, url, args.steps, args.every_steps)
    run, repo = work / "run", work / "repo"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    load_before = os.getloadavg()
    log(f"work in {work}; load average {load_before}")
    t0 = time.time()
    with open(work / "train.log", "w") as train_log:  # the child keeps its own descriptor
        train = subprocess.Popen([REC, "train", "-c", str(config), "--run-dir", str(run),
                                  "--nproc", str(args.nproc)], stdout=train_log,
                                 stderr=subprocess.STDOUT, env=env)  # fmt: skip
    proc = subprocess.Popen([REC, "export", "--follow", str(run), "--repo", str(repo),
                             "--keep", "1000"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env)  # fmt: skip
    follower = Follower(proc)
    while not follower.versions:
        if train.poll() not in (None, 0) or proc.poll() is not None:
            sys.exit("training or the follower stopped:\n" + "\n".join(follower.lines))
        time.sleep(0.1)
    server = launch_cpp(repo, "--updates", url, "--poll-repository-s", "1")
    manifest = ModelDir.of(repo, "rec").read_manifest()
    request = random_request(len(manifest.dense_names), len(manifest.sparse_names), 1, seed=1)
    client = Client(server.endpoints.http, request)
    client.start()
    if train.wait() != 0:
        sys.exit(f"rec train failed: {(work / 'train.log').read_text()[-3000:]}")
    end = time.time()
    load_during = os.getloadavg()
    time.sleep(5)  # the last version reaches the server
    client.stop.set()
    client.join()
    proc.terminate()
    proc.wait(timeout=120)
    server.stop()
    walls = step_walls(url)
    broker.stop()
    result = {
        "benchmark": "follow_skew",
        "config": "embedded default",
        "cpu": describe(cpu_info()),
        "cpu_flags": [f for f in cpu_info()["flags"] if f.startswith(("avx512f", "amx"))],
        "date": time.strftime("%Y-%m-%d"),
        "command": "benchmarks/follow_skew.py " + " ".join(sys.argv[1:]),
        "nproc": args.nproc,
        "steps": args.steps,
        "checkpoint_every_steps": args.every_steps,
        "train_seconds": round(end - t0, 1),
        "load_average_1m": {"before": round(load_before[0], 2), "at_end": round(load_during[0], 2)},
        "requests": len(client.samples),
        "failed_requests": client.errors,
        "versions": len(follower.versions),
        **analyse(client, follower, run, walls, end),
        "follower_lines": follower.lines,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / ("follow_skew" + (f"_{args.label}" if args.label else "") + ".json")
    path.write_text(json.dumps(result, indent=1) + "\n")
    log(json.dumps({k: v for k, v in result.items() if k != "follower_lines"}, indent=1))
    log(f"wrote {path}")


if __name__ == "__main__":
    main()
