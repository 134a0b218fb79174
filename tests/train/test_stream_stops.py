"""How a `rec train --stream` run ends (real torchrun rank, real redis-server): a run that
refused every event fails naming the field; a short ZCH run admits what it saw at its stop; a
clean SIGTERM trains what was delivered and leaves nothing pending."""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import time

import pytest
import redis

from rec import run_dir
from rec.broker import RedisBroker, redis_server_path
from rec.config import config_from_dict
from rec.contract import ModelDir
from rec.contract.events import encode
from rec.data.replay import synthetic_events
from rec.data.stream import StreamConfig, open_reader
from rec.features import feature_spec
from rec.train.stream_loop import refusals
from tests.helpers import REC, TINY, run_rec, write_config
from tests.train.test_train_distributed import _flat_checkpoint

pytestmark = pytest.mark.skipif(
    redis_server_path() is None, reason="redis-server is not installed (make setup installs it)"
)


def _config(url: str) -> dict:
    cfg = copy.deepcopy(TINY)
    cfg["tables"] = cfg["tables"][:4]
    cfg["training"] = {"batch_size": 32, "steps": 0, "log_every": 5, "profile_steps": 0}
    cfg["checkpoint"] = {"every_steps": 100, "keep_last": 2}
    # Untrimmed (data.stream.trim): the test counts what the stream holds.
    cfg["data"]["stream"] = {"url": url, "wait_s": 0.2, "idle_exit_s": 2, "trim": False}
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
    """About 10 steps, rounds every 25 (the default): the stop's round before the final checkpoint
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
        # 320 events less those held out for export (about 1 in 10, by name), 32 a step.
        stream = json.loads((run_dir.latest_checkpoint(run) / "meta.json").read_text())["stream"]
        steps = -(-(320 - sum(stream["held_out"])) // 32)
        assert 8 <= steps <= 10 and sum(stream["events"]) == 320, stream
        assert f"stopped at step {steps}: no event for 2 s" in out, out
        assert f"step {steps}: zch: t0 " in out, out  # the line at the stop
        flat = _flat_checkpoint(run_dir.latest_checkpoint(run), tmp_path)
        keys, used = flat["zch.t0.keys"], flat["zch.t0.used"]
        held = set(keys[used].tolist())
        assert held <= set(range(1000, 1100)) and len(held) >= 90, sorted(held)
        (record,) = [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
                     if r["kind"] == "zch"]  # fmt: skip
        assert record["step"] == steps and record["t0_evicted"] == 0
        assert record["t0_live"] == len(held)


@pytest.mark.parametrize("nproc", [1, 2])
def test_a_clean_sigterm_leaves_nothing_pending_and_its_resume_command_works(tmp_path, nproc):
    """SIGTERM mid-backlog: the ranks train the entries they had read ahead, checkpoint and
    acknowledge them all (XPENDING 0), the rest of the stream left unread; the ZCH line at the
    stop. The stop line's resume command, run as printed, trains the rest: every event once."""
    with RedisBroker(tmp_path / "redis") as broker:
        url = broker.url("term")
        cfg = _config(url)
        cfg["tables"][0]["ids"] = {"zch": {}}
        cfg["training"]["log_every"] = 1
        cfg["data"]["stream"]["idle_exit_s"] = 3  # the resume ends once the backlog is trained
        n = 8000
        _send(broker.port, "term", _events(cfg, n))
        run = tmp_path / "run"
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
        proc = subprocess.Popen([REC, "train", "-c", str(write_config(tmp_path / "c.yaml", cfg)),
                                 "--run-dir", str(run), "--nproc", str(nproc)],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=env)  # fmt: skip
        deadline = time.monotonic() + 240
        while not (run / "metrics.jsonl").exists() or len(_records(run, "train")) < 3:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=120)[0]
        assert proc.returncode == 0 and "signal SIGTERM" in out, out
        steps = int(out.split("stopped at step ")[1].split(":")[0])
        assert f"step {steps}: zch: t0 " in out, out
        latest = run_dir.latest_checkpoint(run)
        assert latest is not None and latest.name == f"step_{steps}", out
        trained = sum(json.loads((latest / "meta.json").read_text())["stream"]["events"])
        client = redis.Redis(port=broker.port)
        assert client.xpending("term", "rec")["pending"] == 0, out
        # Every entry delivered to the group was trained whole, and the backlog's rest is unread.
        (group,) = client.xinfo_groups("term")
        delivered = client.xrange("term", "-", group["last-delivered-id"])
        assert trained == 16 * len(delivered) < n, (trained, len(delivered), out)
        command = out.split("stopped by SIGTERM: LATEST is ")[1].split("`")[1]
        assert command == f"rec train --resume {run} --nproc {nproc}", out
        again = subprocess.run([REC, *command.split()[1:]], capture_output=True, text=True,
                               env=env, timeout=300)  # fmt: skip
        assert again.returncode == 0, again.stdout + again.stderr
        final = run_dir.latest_checkpoint(run)
        stream = json.loads((final / "meta.json").read_text())["stream"]
        assert sum(stream["events"]) == n  # trained and held out, each once
        assert client.xpending("term", "rec")["pending"] == 0
        client.close()
    if nproc == 2:
        return
    # The export verifies on the events training held out (about 1 in 10), not on files: the
    # config names none.
    held = sum(stream["held_out"])
    assert 0.05 * n < held < 0.15 * n, stream
    repo = tmp_path / "repo"
    out = run_rec("export", str(run), "--repo", str(repo)).stdout
    assert f"quality checks on {held:,} events the stream run held out of training" in out, out
    checks = json.loads(ModelDir.of(repo, "rec").manifest.read_text())["verification"]
    assert checks["eval"]["eval_samples"] == held, checks


def _records(run, kind: str) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]
