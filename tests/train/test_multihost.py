"""Two hosts for real: scripts/multihost.sh runs torchrun in two network namespaces joined by a
veth pair (2 hosts x 2 ranks, gloo over the namespaces' own addresses) to a committed
checkpoint, with table_row_wise and grid_shard tables placed by host and a row_wise one across
both; that checkpoint resumed on one host; and a host killed mid-run, restarted by torchrun."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from rec import netns, run_dir
from tests.helpers import REPO, run_rec, write_config

SCRIPT = REPO / "scripts" / "multihost.sh"


def test_script_refuses_clearly_without_root(tmp_path):
    if shutil.which("setpriv") is None or os.geteuid() != 0:
        pytest.skip("needs root and setpriv to run the script as another user")
    proc = subprocess.run(
        ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups",
         "bash", str(SCRIPT), "cfg.yaml", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "needs root to create network namespaces" in proc.stderr
    assert not (tmp_path / "run").exists()


@pytest.fixture
def two_hosts(tmp_path, tiny_config):
    """(config path, run dir, a function starting the script); skips where it cannot run."""
    reason = netns.unavailable()
    if reason:
        pytest.skip(reason)
    tiny_config["sharding"] = {
        "constraints": {
            "t0": {"sharding_types": ["table_row_wise"]},
            "t1": {"sharding_types": ["grid_shard"]},
            "t2": {"sharding_types": ["row_wise"]},
        }
    }
    tiny_config["training"].update(steps=10, eval_every=0, log_every=10)
    tiny_config["checkpoint"]["every_steps"] = 0
    run = tmp_path / "run"

    def start(config: dict, max_restarts: int = 0) -> subprocess.Popen:
        path = write_config(tmp_path / "cfg.yaml", config)
        env = {**os.environ, "NPROC": "2", "PORT": str(29600 + os.getpid() % 300),
               "MAX_RESTARTS": str(max_restarts)}  # fmt: skip
        # Its own session, so a hung run is killed whole (torchrun agents and ranks included).
        return subprocess.Popen(["bash", str(SCRIPT), str(path), str(run)], env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip

    return tiny_config, run, start


def _finish(script: subprocess.Popen, timeout: float = 300) -> str:
    """The script's output once it exits; a run still going after `timeout` is killed, with
    every process it started, and fails the test with the end of its output."""
    try:
        out, _ = script.communicate(timeout=timeout)
        return out
    except subprocess.TimeoutExpired:
        os.killpg(script.pid, signal.SIGKILL)
        out, _ = script.communicate()
        pytest.fail(f"the two-host run hung for {timeout} s; it ended with:\n{out[-4000:]}")


def _kill_second_host_ranks(script: subprocess.Popen, run: Path) -> None:
    """SIGKILL the rank processes (not torchrun's agent) of the second namespace, once the
    run has a committed checkpoint."""
    deadline = time.monotonic() + 120
    while not (run / "checkpoints" / "LATEST").exists():
        assert time.monotonic() < deadline and script.poll() is None, "no checkpoint came"
        time.sleep(0.2)
    pids = subprocess.run(["ip", "netns", "pids", f"rec{script.pid}h1"], capture_output=True,
                          text=True, check=True).stdout.split()  # fmt: skip
    killed = 0
    for pid in pids:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        if b"rec.train.worker" in cmd and b"torch.distributed.run" not in cmd:
            os.kill(int(pid), signal.SIGKILL)
            killed += 1
    assert killed == 2


def test_two_namespace_hosts_train_to_a_committed_checkpoint(two_hosts):
    config, run, start = two_hosts
    script = start(config)
    out = _finish(script)
    assert script.returncode == 0, out[-4000:]
    latest = run_dir.latest_checkpoint(run)
    assert latest is not None and (latest / "COMMITTED").exists()
    assert run_dir.read_meta(latest)["world_size"] == 4
    assert len(list(latest.glob("*.distcp"))) == 4
    plan = {r["table"]: r for r in json.loads((run / run_dir.PLAN_FILE).read_text())["tables"]}
    assert plan["t0"]["sharding_type"] == "table_row_wise"
    assert {s["rank"] // 2 for s in plan["t0"]["shards"]} in ({0}, {1})  # inside one host
    assert plan["t1"]["sharding_type"] == "grid_shard"
    for column in {s["offsets"][1] for s in plan["t1"]["shards"]}:  # each column group: one host
        hosts = {s["rank"] // 2 for s in plan["t1"]["shards"] if s["offsets"][1] == column}
        assert len(hosts) == 1
    assert {s["rank"] for s in plan["t2"]["shards"]} == {0, 1, 2, 3}
    # The 4-rank, 2-host checkpoint resumes on one host with 2 ranks, the run made longer.
    saved = yaml.safe_load((run / run_dir.CONFIG_FILE).read_text())
    saved["training"]["steps"] = 20
    (run / run_dir.CONFIG_FILE).write_text(yaml.safe_dump(saved))
    resumed = run_rec("train", "--resume", str(run), "--nproc", "2").stdout
    assert f"resumed from {latest}" in resumed
    assert run_dir.latest_checkpoint(run).name == "step_20"
    assert run_dir.read_meta(run_dir.latest_checkpoint(run))["world_size"] == 2


def test_one_host_killed_mid_run_every_host_resumes_and_finishes(two_hosts):
    """torchrun's restart on the killed host, and the membership change on the other, resume
    all four ranks from the last committed checkpoint."""
    config, run, start = two_hosts
    # Killed right after the first checkpoint (step 20), with 100 steps still to go.
    config["training"].update(steps=120, log_every=20)
    config["checkpoint"]["every_steps"] = 20
    script = start(config, max_restarts=1)
    _kill_second_host_ranks(script, run)
    out = _finish(script)
    assert script.returncode == 0, out[-4000:]
    assert "exitcode: -9" in out  # the kill landed
    assert out.count("[rec train] resumed from") == 1  # rank 0 prints it, once
    assert run_dir.latest_checkpoint(run).name == "step_120"
    assert run_dir.read_meta(run_dir.latest_checkpoint(run))["world_size"] == 4
