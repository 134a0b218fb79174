"""How a `rec train --stream` run ends (real torchrun rank, real redis-server): a run that
refused every event fails naming the field; a short ZCH run admits what it saw at its stop."""

from __future__ import annotations

import copy
import json
import time

import pytest
import redis

from rec import run_dir
from rec.broker import RedisBroker, redis_server_path
from rec.config import config_from_dict
from rec.contract.events import encode
from rec.data.replay import synthetic_events
from rec.data.stream import StreamConfig, open_reader
from rec.features import feature_spec
from rec.train.stream_loop import refusals
from tests.helpers import TINY, run_rec, write_config
from tests.train.test_train_distributed import _flat_checkpoint

pytestmark = pytest.mark.skipif(
    redis_server_path() is None, reason="redis-server is not installed (make setup installs it)"
)


def _config(url: str) -> dict:
    cfg = copy.deepcopy(TINY)
    cfg["tables"] = cfg["tables"][:4]
    cfg["training"] = {"batch_size": 32, "steps": 0, "log_every": 5, "profile_steps": 0}
    cfg["checkpoint"] = {"every_steps": 100, "keep_last": 2}
    cfg["data"]["stream"] = {"url": url, "wait_s": 0.2, "idle_exit_s": 2}
    return cfg


def _events(cfg: dict, n: int) -> list[dict]:
    _, chunks = synthetic_events(config_from_dict(cfg), n, 0)
    return [e for chunk, _ in chunks for e in chunk]


def _send(port: int, stream: str, events: list[dict], per_entry: int = 16) -> None:
    client = redis.Redis(port=port)
    for i in range(0, len(events), per_entry):
        client.xadd(stream, encode(events[i : i + per_entry]))
    client.close()


def test_a_run_that_refused_every_event_fails_naming_the_missing_field(tmp_path):
    with RedisBroker(tmp_path / "redis") as broker:
        url = broker.url("ev")
        cfg = _config(url)
        events = [{k: v for k, v in e.items() if k != "cat_2"} for e in _events(cfg, 200)]
        _send(broker.port, "ev", events)
        config = write_config(tmp_path / "c.yaml", cfg)
        r = run_rec("train", "-c", str(config), "--run-dir", str(tmp_path / "run"), "--nproc",
                    "1", check=False, timeout=300)  # fmt: skip
        assert r.returncode != 0, r.stdout
        assert "trained nothing: 200 events refused" in r.stdout, r.stdout
        assert "missing_field 200: 'cat_2'" in r.stdout, r.stdout
        # What the progress line says while nothing trains (every 10 s): the same words.
        reader = open_reader(StreamConfig(url=url, group="look", wait_s=0.2),
                             feature_spec(config_from_dict(cfg)), 0)  # fmt: skip
        deadline = time.monotonic() + 30
        while sum(reader.refused.values()) < 200 and time.monotonic() < deadline:
            reader.next_batch(32)
        assert refusals(reader) == "missing_field 200: 'cat_2'"
        reader.close()


def test_a_zch_run_shorter_than_a_round_admits_its_ids_at_the_stop(tmp_path):
    """10 steps, rounds every 25 (the default): the stop's round before the final checkpoint
    admits the 100 ids seen (300 slots: their windows have room), evicting none."""
    with RedisBroker(tmp_path / "redis") as broker:
        url = broker.url("zch")
        cfg = _config(url)
        cfg["tables"][0]["ids"] = {"zch": {}}
        events = _events(cfg, 320)
        for i, e in enumerate(events):
            e["cat_0"] = [1000 + i % 100]
        _send(broker.port, "zch", events)
        run = tmp_path / "run"
        out = run_rec("train", "-c", str(write_config(tmp_path / "c.yaml", cfg)), "--run-dir",
                      str(run), "--nproc", "1", timeout=300).stdout  # fmt: skip
        assert "stopped at step 10: no event for 2 s" in out, out
        assert "step 10: zch: t0 " in out, out  # the line at the stop
        flat = _flat_checkpoint(run_dir.latest_checkpoint(run), tmp_path)
        keys, used = flat["zch.t0.keys"], flat["zch.t0.used"]
        held = set(keys[used].tolist())
        assert held <= set(range(1000, 1100)) and len(held) >= 90, sorted(held)
        (record,) = [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
                     if r["kind"] == "zch"]  # fmt: skip
        assert record["step"] == 10 and record["t0_evicted"] == 0
        assert record["t0_live"] == len(held)
