"""`rec train --stream` (rec.train.stream_loop) with real torchrun ranks and a real redis-server:
every produced event trained exactly once across a rank killed mid-stream and a resume, counted
and fingerprinted; progressive validation equal to scoring each batch offline with the
checkpoint of the step before it; a rank whose share runs dry steps with the others."""

from __future__ import annotations

import copy
import json
import math
import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import redis
import torch

from rec import run_dir
from rec.broker import RedisBroker, redis_server_path
from rec.config import config_from_dict
from rec.contract.events import encode
from rec.data.held_out import HeldOut
from rec.data.replay import synthetic_events
from rec.data.stream import StreamConfig, add_digests, event_digest, open_reader
from rec.export.load import load_run
from rec.features import feature_spec
from rec.train.stream_loop import online_metrics
from tests.helpers import REC, TINY, rec_in_process, run_rec, worker_pids, write_config

pytestmark = pytest.mark.skipif(
    redis_server_path() is None, reason="redis-server is not installed (make setup installs it)"
)


def _config(url: str, **training) -> dict:
    cfg = copy.deepcopy(TINY)
    cfg["tables"] = cfg["tables"][:4]
    cfg["training"] = {"batch_size": 32, "steps": 0, "log_every": 5, "profile_steps": 0,
                       **training}  # fmt: skip
    cfg["checkpoint"] = {"every_steps": 10, "keep_last": 2}
    # Untrimmed (data.stream.trim): the test counts what the stream holds.
    cfg["data"]["stream"] = {"url": url, "wait_s": 0.2, "idle_exit_s": 3, "trim": False}
    return cfg


def _produce(cfg: dict, url: str, n: int, first: int = 0, per_entry: int = 16) -> None:
    """n events of the synthetic generator's train split from position `first`, as
    `rec stream replay` sends them."""
    stream = url.rsplit("/", 1)[1]
    client = redis.Redis(port=int(url.split(":")[2].split("/")[0]))
    _, chunks = synthetic_events(config_from_dict(cfg), n, first)
    events = [e for chunk, _ in chunks for e in chunk]
    for i in range(0, n, per_entry):
        client.xadd(stream, encode(events[i : i + per_entry]))
    client.close()


def _stream_digest(port: int, stream: str) -> tuple[int, int]:
    """Events in the stream and their digest (rec.data.stream.event_digest), from XRANGE."""
    client = redis.Redis(port=port)
    n, digest = 0, 0
    for entry, fields in client.xrange(stream):
        k = len(json.loads(fields[b"events"]))
        n += k
        digest = add_digests(digest, event_digest(entry.decode(), np.arange(k)))
    client.close()
    return n, digest


def _lineage(run: Path) -> tuple[int, int]:
    """Events the LATEST checkpoint's lineage trained, and their digest."""
    latest = run / "checkpoints" / (run / "checkpoints" / "LATEST").read_text().strip()
    meta = json.loads((latest / "meta.json").read_text())["stream"]
    digest = 0
    for d in meta["digests"]:
        digest = add_digests(digest, int(d))
    return sum(meta["events"]), digest


def _records(run: Path, kind: str) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def test_every_event_is_trained_once_across_a_killed_rank_and_a_resume(tmp_path):
    with RedisBroker(tmp_path / "redis") as broker:
        url = broker.url("ev")
        cfg = _config(url)
        config, run = write_config(tmp_path / "c.yaml", cfg), tmp_path / "run"
        _produce(cfg, url, 1600)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
        first = subprocess.Popen([REC, "train", "-c", str(config), "--run-dir", str(run)],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                 env=env)  # fmt: skip
        produced, deadline = 1600, time.monotonic() + 240
        # Events keep coming, so the ranks are past the checkpoint of step 20 when one dies.
        while not (run / "checkpoints" / "step_20" / "COMMITTED").exists():
            assert first.poll() is None and time.monotonic() < deadline, first.communicate()[0]
            _produce(cfg, url, 64, first=produced)
            produced += 64
            time.sleep(0.05)
        while not any(r["step"] > 20 for r in _records(run, "online")):
            assert first.poll() is None and time.monotonic() < deadline, first.communicate()[0]
            time.sleep(0.05)
        os.kill(max(worker_pids(run)), signal.SIGKILL)
        out = first.communicate(timeout=120)[0]
        assert first.returncode != 0, out
        killed_at = max(r["step"] for r in _records(run, "online"))
        # The dead ranks' consumers hold unacknowledged entries: another --nproc is refused.
        r = rec_in_process("train", "--resume", str(run), "--nproc", "1")
        assert r.returncode != 0 and "resume it with --nproc 2, not 1" in r.stdout, r.stdout
        _produce(cfg, url, 800, first=produced)  # more while no rank reads
        produced += 800

        out = run_rec("train", "--resume", str(run), timeout=300).stdout
        assert "resumed from" in out and "no event for 3 s" in out, out
        resumed_at = int(out.split("resumed from ")[1].split("step_")[1].split()[0])
        assert resumed_at < killed_at, "some trained events were lost with the killed ranks"
        assert _lineage(run) == _stream_digest(broker.port, "ev") == (produced, _lineage(run)[1])
        client = redis.Redis(port=broker.port)
        assert client.xpending("ev", "rec")["pending"] == 0  # every entry acknowledged
        client.close()


def test_the_plain_pipeline_and_a_row_wise_table_over_many_segments(tmp_path):
    """training.pipeline: base (TorchRec's TrainPipelineBase stays stopped once a segment's
    iterator ends, unless reset: the run spun or ended early), a row-wise table, uneven shares
    (entries of 40 events: the ranks' batches differ, padded to the largest) and a checkpoint
    every 3 steps: every event trained once, then an idle exit."""
    with RedisBroker(tmp_path / "redis") as broker:
        url = broker.url("plain")
        cfg = _config(url, pipeline="base")
        cfg["checkpoint"]["every_steps"] = 3
        cfg["sharding"] = {"constraints": {"t1": {"sharding_types": ["row_wise"]}}}
        _produce(cfg, url, 400, per_entry=40)
        config, run = write_config(tmp_path / "c.yaml", cfg), tmp_path / "run"
        out = run_rec("train", "-c", str(config), "--run-dir", str(run), timeout=300).stdout
        assert "no event for 3 s" in out, out
        assert _lineage(run) == _stream_digest(broker.port, "plain"), out
        assert _lineage(run)[0] == 400
        steps = int(out.split("stopped at step ")[1].split(":")[0])
        meta = json.loads((run_dir.latest_checkpoint(run) / "meta.json").read_text())
        trained = 400 - sum(meta["stream"]["held_out"])  # about 1 in 10 held out for export
        assert 300 < trained < 400
        assert steps >= -(-trained // 64), out  # batches of at most 2 x 32: segments of 3 steps


def test_progressive_validation_equals_scoring_each_batch_before_its_step(tmp_path):
    with RedisBroker(tmp_path / "redis") as broker:
        url = broker.url("pv")
        cfg = _config(url, log_every=1, steps=5)
        cfg["checkpoint"] = {"every_steps": 1, "keep_last": 10}
        _produce(cfg, url, 7 * 32)  # 5 batches of 32 once about 1 in 10 is held out
        run = tmp_path / "run"
        run_rec("train", "-c", str(write_config(tmp_path / "c.yaml", cfg)), "--run-dir",
                str(run), "--nproc", "1", timeout=300)  # fmt: skip
        online = {r["step"]: r for r in _records(run, "online")}
        assert sorted(online) == [1, 2, 3, 4, 5]
        # The same batches, read again by another consumer group.
        model_cfg = config_from_dict(cfg)
        # The same events held out as training held out (chosen by their names).
        reader = open_reader(StreamConfig(url=url, group="offline", wait_s=0.5),
                             feature_spec(model_cfg), 0, hold_out=HeldOut(10, 0))  # fmt: skip
        batches = [reader.next_batch(32).batch for _ in range(5)]
        reader.close()
        keys = list(model_cfg.features.sparse)
        for step in range(2, 6):
            model = load_run(run, f"step_{step - 1}").model
            b = batches[step - 1].to_torchrec(keys, torch.tensor([t.rows for t in
                                                                  model_cfg.tables]))  # fmt: skip
            with torch.no_grad():
                probs = torch.sigmoid(model(b.dense_features, b.sparse_features))
            want = online_metrics(probs, b.labels, list(model_cfg.model.task_names))
            got = online[step]
            assert want is not None and got["events"] == 32
            for key in ("auc", "log_loss", "calibration"):
                assert math.isclose(got[key], want[key], rel_tol=1e-5, abs_tol=1e-6), (step, key)


def test_a_dry_rank_a_broker_restart_bad_events_and_sigterm(tmp_path):
    """One entry of 10 events (one rank gets it whole, the other steps dry); the broker
    SIGKILLed and restarted; then 5 good events with 2 bad ones and a malformed entry, refused,
    counted and parked, never trained; SIGTERM checkpoints and exits 0."""
    with RedisBroker(tmp_path / "redis") as broker:
        url = broker.url("dry")
        cfg = _config(url, log_every=1)
        cfg["data"]["stream"].update(idle_exit_s=0, retry_s=0.05, max_retry_s=0.2)
        # A row-wise table: its backward all-gathers every rank's rows (gloo), which needs the
        # same batch size on every rank, a dry one too.
        cfg["sharding"] = {"constraints": {"t1": {"sharding_types": ["row_wise"]}}}
        _produce(cfg, url, 10, per_entry=10)
        run = tmp_path / "run"
        config = write_config(tmp_path / "c.yaml", cfg)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
        proc = subprocess.Popen([REC, "train", "-c", str(config), "--run-dir", str(run)],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=env)  # fmt: skip

        def wait_for_steps(n: int) -> None:
            deadline = time.monotonic() + 240
            while not ((run / "metrics.jsonl").exists() and len(_records(run, "train")) >= n):
                assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
                time.sleep(0.1)

        wait_for_steps(1)
        good_digest = _stream_digest(broker.port, "dry")
        broker.restart(kill=True)
        client = redis.Redis(port=broker.port)
        _, chunks = synthetic_events(config_from_dict(cfg), 5, 10)
        events = [e for chunk, _ in chunks for e in chunk]
        missing = {k: v for k, v in events[0].items() if k != "cat_0"}
        entry = client.xadd("dry", encode([*events, missing, {**events[0], "label": 2}]))
        client.xadd("dry", {"format": "rec.events/1", "events": "[not json"})
        five = event_digest(entry.decode(), np.arange(5))
        good_digest = (good_digest[0] + 5, add_digests(good_digest[1], five))
        wait_for_steps(2)
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=120)[0]
        assert proc.returncode == 0, out
        assert "stopped at step 2: signal SIGTERM" in out and "stopped by SIGTERM" in out, out
        steps = _records(run, "train")
        assert len(steps) == 2 and all(math.isfinite(r["loss"]) for r in steps), steps
        assert _records(run, "online")[-1]["refused"] == 3
        assert (run / "checkpoints" / "LATEST").read_text().strip() == "step_2"
        assert _lineage(run) == good_digest
        dead = client.xrange("dry:dead")
        assert sorted(f[b"reason"].decode() for _, f in dead) == [
            "label_not_binary", "malformed_entry", "missing_field"]  # fmt: skip
        client.close()


def test_stream_refusals_come_before_any_rank(tmp_path):
    cfg = _config("redis://127.0.0.1:1/ev")
    config = write_config(tmp_path / "c.yaml", cfg)
    r = rec_in_process("train", "-c", str(config), "--run-dir", str(tmp_path / "a"))
    assert r.returncode != 0 and "the broker does not answer" in r.stdout, r.stdout
    assert not (tmp_path / "a").exists()
    cfg["training"]["lr_schedule"] = "cosine"
    r = rec_in_process("train", "-c", str(write_config(tmp_path / "d.yaml", cfg)))
    assert "decays over training.steps" in r.stdout, r.stdout
    r = rec_in_process("train", "--resume", str(tmp_path / "a"), "--stream", "redis://h:1/s")
    assert "--stream starts a run" in r.stdout, r.stdout
