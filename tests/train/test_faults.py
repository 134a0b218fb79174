"""Training faults with real processes: a killed rank, a torn checkpoint, a damaged shard.

First, in this process: the commit protocol every run directory is written with
(rec.run_dir.commit_checkpoint) and the reader rules that make a torn step dir not count.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from rec import run_dir
from tests.helpers import REC, run_rec, warning_lines, write_config


def test_commit_checkpoint_writes_the_commit_and_readers_skip_a_torn_step(tmp_path):
    run = tmp_path / "run"
    root = run_dir.checkpoints_dir(run)
    for step in (10, 20):  # shards on disk (as dcp.save leaves them), not yet committed
        (root / run_dir.step_dir_name(step)).mkdir(parents=True)
        (root / run_dir.step_dir_name(step) / "__0_0.distcp").write_bytes(b"shard")
    assert run_dir.latest_checkpoint(run) is None
    committed = run_dir.commit_checkpoint(run, 10, {"world_size": 1})
    assert committed == root / "step_10"
    assert run_dir.read_meta(committed) == {"world_size": 1, "step": 10}
    assert run_dir.is_committed(committed)
    assert (root / run_dir.LATEST_FILE).read_text() == "step_10\n"
    assert run_dir.latest_checkpoint(run) == committed
    assert not list(root.rglob("*.tmp"))  # every temp file was renamed into place
    # step_20 is newer and even named by LATEST, but has no COMMITTED: killed mid-save.
    (root / run_dir.LATEST_FILE).write_text("step_20\n")
    assert run_dir.committed_steps(run) == [committed]
    assert run_dir.latest_checkpoint(run) == committed
    with pytest.raises(run_dir.RunDirError, match="step_30.*does not exist"):
        run_dir.commit_checkpoint(run, 30, {})


def test_checkpointer_commits_through_run_dir_and_keeps_the_last(tmp_path):
    import torch

    from rec.config import CheckpointConfig
    from rec.train.checkpoint import Checkpointer

    run = tmp_path / "run"
    ckpt = Checkpointer(run, CheckpointConfig(every_steps=1, keep_last=1), rank=0)
    for step in (1, 2):
        ckpt.save(step, {"w": torch.full((4,), float(step))}, {"world_size": 1})
    assert [p.name for p in run_dir.committed_steps(run)] == ["step_2"]  # step_1 pruned
    latest = ckpt.latest()
    assert latest.name == "step_2"
    meta = run_dir.read_meta(latest)
    assert list(meta) == ["world_size", "step", "save_seconds", "files"]
    assert meta["step"] == 2 and set(meta["files"]) == {".metadata", "__0_0.distcp"}
    run_dir.verify_checkpoint(latest)


def _worker_pids(run: Path) -> list[int]:
    out = subprocess.run(["pgrep", "-f", f"rec.train.worker --run-dir {run}"],
                         capture_output=True, text=True)  # fmt: skip
    return [int(p) for p in out.stdout.split()]


def test_sigkill_of_one_rank_resumes_from_latest_and_finishes(tmp_path, tiny_config):
    tiny_config["training"].update(steps=120, eval_every=0, log_every=10)
    tiny_config["checkpoint"]["every_steps"] = 20
    path = write_config(tmp_path / "cfg.yaml", tiny_config)
    run = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    cmd = [REC, "train", "--config", str(path), "--run-dir", str(run), "--nproc", "2",
           "--max-restarts", "1"]  # fmt: skip
    log = tmp_path / "train.log"  # a file, not a pipe: nobody drains a pipe while we wait
    with open(log, "w") as sink:
        proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 240
        while run_dir.latest_checkpoint(run) is None and time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()
            time.sleep(0.2)
        killed_after = run_dir.latest_checkpoint(run)
        assert killed_after is not None, "no checkpoint was committed in time"
        pids = _worker_pids(run)
        assert len(pids) == 2
        os.kill(pids[1], signal.SIGKILL)
        proc.wait(timeout=300)
    finally:
        proc.kill()
    out = log.read_text()
    assert proc.returncode == 0, out
    assert "resumed from" in out
    latest = run_dir.latest_checkpoint(run)
    assert latest.name == "step_120"
    assert run_dir.read_meta(latest)["step"] == 120
    train = [json.loads(x) for x in (run / run_dir.METRICS_FILE).read_text().splitlines()]
    steps = [m["step"] for m in train if m["kind"] == "train"]
    assert steps[-1] == 120
    # After the restart the log goes on from a committed step, not from step 0.
    resumed_at = int(killed_after.name.split("_")[1])
    restarts = [i for i in range(1, len(steps)) if steps[i] <= steps[i - 1]]
    assert all(steps[i] > resumed_at for i in restarts), steps


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    from tests.helpers import TINY

    tmp = tmp_path_factory.mktemp("faults")
    cfg = json.loads(json.dumps(TINY))
    cfg["training"].update(steps=20, eval_every=0)
    cfg["checkpoint"]["every_steps"] = 10
    cfg["model"].update(arch="dlrm_dcn", dcn_num_layers=2, dcn_low_rank_dim=4)  # DCN trains too
    run = tmp / "run"
    run_rec("train", "--config", str(write_config(tmp / "cfg.yaml", cfg)), "--run-dir", str(run))
    return run


def test_resume_of_a_finished_run_trains_nothing(finished_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    latest = run_dir.latest_checkpoint(run)
    assert run_dir.read_meta(latest)["complete"] is True
    metrics = (run / run_dir.METRICS_FILE).read_text()
    out = run_rec("train", "--resume", str(run), "--nproc", "1").stdout
    assert f"complete (final checkpoint {latest.name}): nothing to train" in out
    assert "resumed from" not in out  # no rank was started
    assert (run / run_dir.METRICS_FILE).read_text() == metrics
    assert run_dir.latest_checkpoint(run) == latest


def test_torn_checkpoint_is_ignored_by_resume(finished_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    torn = run_dir.checkpoints_dir(run) / "step_30"
    shutil.copytree(run_dir.checkpoints_dir(run) / "step_20", torn)
    (torn / run_dir.COMMITTED_FILE).unlink()  # killed before the commit marker
    (run_dir.checkpoints_dir(run) / run_dir.LATEST_FILE).write_text("step_30\n")
    assert run_dir.latest_checkpoint(run).name == "step_20"
    cfg = run / run_dir.CONFIG_FILE
    cfg.write_text(cfg.read_text().replace("steps: 20", "steps: 30"))
    out = run_rec("train", "--resume", str(run), "--nproc", "1").stdout
    assert "at step 20" in out
    assert not warning_lines(out), warning_lines(out)  # loading sharded tables warns, known
    assert run_dir.latest_checkpoint(run).name == "step_30"
    assert run_dir.is_committed(torn)  # rewritten whole by the resumed run


def test_truncated_shard_stops_resume_with_the_file_named(finished_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    latest = run_dir.latest_checkpoint(run)
    shard = latest / "__1_0.distcp"
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    before = sorted(p.name for p in latest.iterdir())
    cfg = run / run_dir.CONFIG_FILE
    cfg.write_text(cfg.read_text().replace("steps: 20", "steps: 30"))
    proc = run_rec("train", "--resume", str(run), "--nproc", "1", check=False)
    assert proc.returncode != 0
    assert "__1_0.distcp" in proc.stdout
    assert sorted(p.name for p in latest.iterdir()) == before  # nothing overwritten
    assert run_dir.latest_checkpoint(run) == latest


def test_dcn_run_checkpoints_its_cross_network(finished_run):
    import torch.distributed.checkpoint as dcp

    step_dir = run_dir.latest_checkpoint(finished_run)
    keys = dcp.FileSystemReader(str(step_dir)).read_metadata().state_dict_metadata
    assert any("inter_arch.crossnet.V_kernels.1" in k for k in keys)
    assert set(run_dir.read_meta(step_dir)["files"]) == {
        p.name for p in run_dir.shard_files(step_dir)
    }
    run_dir.verify_checkpoint(step_dir)  # the recorded digests match what is on disk
