"""Two hosts for real: scripts/multihost.sh runs torchrun in two network namespaces joined by a
veth pair (2 hosts x 2 ranks, gloo over the namespaces' own addresses) to a committed
checkpoint, with table_row_wise and grid_shard tables placed by host and a row_wise one across
both."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from rec import run_dir
from tests.helpers import REPO, write_config

SCRIPT = REPO / "scripts" / "multihost.sh"


def _namespaces_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns); this session is not root"
    if shutil.which("ip") is None:
        return "iproute2's ip command is not installed"
    probe = f"recprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot create a network namespace here: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], check=False)
    return None


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


def test_two_namespace_hosts_train_to_a_committed_checkpoint(tmp_path, tiny_config):
    reason = _namespaces_unavailable()
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
    config = write_config(tmp_path / "cfg.yaml", tiny_config)
    run = tmp_path / "run"
    env = {**os.environ, "NPROC": "2", "PORT": str(29600 + os.getpid() % 300)}
    proc = subprocess.run(["bash", str(SCRIPT), str(config), str(run)], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:]
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
