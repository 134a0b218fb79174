"""`rec train --stream` over a partitioned stream (rec.contract.partitions, rec.train.stream_tally)
with real torchrun ranks and a real redis-server: 2 ranks killed mid-stream, resumed at --nproc 1,
which takes over every partition with its pending entries; the summed counts and digests equal
what the partitions hold (0 lost, 0 twice). A changed partition count is refused."""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import redis

from rec.broker import RedisBroker, redis_server_path
from rec.config import config_from_dict
from rec.contract.events import encode
from rec.contract.partitions import Layout, layout_key, make_layout
from rec.data.replay import synthetic_events
from rec.data.stream import add_digests, event_digest
from rec.train.stream_tally import lineage
from tests.helpers import REC, TINY, rec_in_process, run_rec, worker_pids, write_config

pytestmark = pytest.mark.skipif(
    redis_server_path() is None, reason="redis-server is not installed (make setup installs it)"
)
P = 4
PER_ENTRY = 16


def _config(url: str) -> dict:
    cfg = copy.deepcopy(TINY)
    cfg["tables"] = cfg["tables"][:4]
    cfg["training"] = {"batch_size": 32, "steps": 0, "log_every": 5, "profile_steps": 0}
    cfg["checkpoint"] = {"every_steps": 5, "keep_last": 2}
    # Untrimmed (data.stream.trim): the test counts what the stream holds.
    cfg["data"]["stream"] = {"url": url, "wait_s": 0.2, "idle_exit_s": 3, "trim": False}
    return cfg


def _produce(cfg: dict, client, layout: Layout, n: int, first: int) -> None:
    """n synthetic events from `first`, entries of PER_ENTRY dealt round robin to partitions."""
    _, chunks = synthetic_events(config_from_dict(cfg), n, first)
    events = [e for chunk, _ in chunks for e in chunk]
    for i in range(0, n, PER_ENTRY):
        key = layout.keys[((first + i) // PER_ENTRY) % layout.partitions]
        client.xadd(key, encode(events[i : i + PER_ENTRY]))


def _held(client, layout: Layout) -> tuple[int, int]:
    """Events the partitions hold and their digest, each salted by its partition."""
    n, digest = 0, 0
    for k, key in enumerate(layout.keys):
        for entry, fields in client.xrange(key):
            size = len(json.loads(fields[b"events"]))
            n += size
            digest = add_digests(digest, event_digest(entry.decode(), np.arange(size), k))
    return n, digest


def _latest_meta(run: Path) -> dict:
    latest = run / "checkpoints" / (run / "checkpoints" / "LATEST").read_text().strip()
    return json.loads((latest / "meta.json").read_text())["stream"]


def _steps_logged(run: Path) -> list[int]:
    path = run / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [r["step"] for r in map(json.loads, lines) if r["kind"] == "online"]


def test_two_ranks_killed_resume_at_one_with_every_partition_exactly_once(tmp_path):
    with RedisBroker(tmp_path / "redis") as broker:
        url = broker.url("pev")
        cfg = _config(url)
        client = redis.Redis(port=broker.port)
        layout = make_layout("pev", P)
        client.set(layout_key("pev"), layout.to_json(), nx=True)
        config, run = write_config(tmp_path / "c.yaml", cfg), tmp_path / "run"
        produced = 1024
        _produce(cfg, client, layout, produced, 0)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
        first = subprocess.Popen([REC, "train", "-c", str(config), "--run-dir", str(run),
                                  "--nproc", "2"], stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True, env=env)  # fmt: skip
        deadline = time.monotonic() + 240
        # Events keep coming, so the ranks are past a checkpoint when they die.
        while not (run / "checkpoints" / "step_5" / "COMMITTED").exists() or \
                not any(s > 5 for s in _steps_logged(run)):  # fmt: skip
            assert first.poll() is None and time.monotonic() < deadline, first.communicate()[0]
            _produce(cfg, client, layout, 64, produced)
            produced += 64
            time.sleep(0.05)
        for pid in worker_pids(run):
            os.kill(pid, signal.SIGKILL)
        out = first.communicate(timeout=120)[0]
        assert first.returncode != 0, out
        meta = _latest_meta(run)
        assert (meta["format"], meta["partitions"], meta["world"]) == (2, P, 2), meta
        assert [p["partition"] for p in meta["parts"]] == list(range(P))
        assert [p["key"] for p in meta["parts"]] == list(layout.keys)
        pending = {k: client.xpending(key, "rec")["pending"] for k, key in enumerate(layout.keys)}
        assert sum(pending.values()) > 0, "the killed ranks left entries delivered, unacked"
        consumers = {c["name"] for key in layout.keys for c in client.xinfo_consumers(key, "rec")}
        assert consumers == {f"partition{k}".encode() for k in range(P)}
        _produce(cfg, client, layout, 256, produced)  # more while no rank reads
        produced += 256

        out = run_rec("train", "--resume", str(run), "--nproc", "1", timeout=300).stdout
        assert "resumed from" in out and "no event for 3 s" in out, out
        meta = _latest_meta(run)
        assert (meta["format"], meta["world"]) == (2, 1), meta
        # 0 lost, 0 twice: every partition's events, summed over the lineage's ranks.
        assert lineage(meta) == _held(client, layout)
        assert lineage(meta)[0] == produced
        for key in layout.keys:
            assert client.xpending(key, "rec")["pending"] == 0, key

        # Another partition count: a position holds only in its own partition.
        client.set(layout_key("pev"), make_layout("pev", 2).to_json())
        r = rec_in_process("train", "--resume", str(run), "--nproc", "1")
        assert r.returncode != 0 and "in 4 partitions, and the stream now has 2" in r.stdout, \
            r.stdout  # fmt: skip
        client.close()
