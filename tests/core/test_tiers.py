"""make check's line (tests/tiers.py): which tests are integration, and which process starts
the check tier refuses."""

import subprocess
import sys

import pytest

from tests import tiers


@pytest.mark.parametrize(
    ("args", "heavy"),
    [
        (["/x/.venv/bin/rec", "train", "--config", "c.yaml"], "rec train"),
        (["rec", "export", "run"], None),
        (["/build/asan/rec-server", "--model-repository", "r"], "rec-server"),
        ("redis-server --port 0", "redis-server"),
        ([sys.executable, "-m", "torch.distributed.run", "w.py"], "torchrun"),
        (["torchrun", "--nproc-per-node", "2"], "torchrun"),
        (["g++", "--version"], None),
        ([], None),
    ],
)
def test_heavy_processes_are_named(args, heavy):
    assert tiers._heavy(args) == heavy


def test_a_file_a_folder_or_a_test_can_be_integration():
    assert tiers.in_integration("serve_cpp/test_batching.py", "test_x[1]")
    assert tiers.in_integration("export/test_aoti.py", "test_y")
    assert not tiers.in_integration("core/test_config.py", "test_z")


def test_the_check_tier_refuses_a_server_start(tmp_path):
    """In a fresh interpreter under REC_TEST_TIER=check, starting redis-server raises and
    names tests/tiers.py; a harmless process still starts."""
    code = (
        "from tests import tiers; import subprocess; tiers.guard_check_tier()\n"
        "assert subprocess.run(['true']).returncode == 0\n"
        "try:\n    subprocess.Popen(['redis-server', '--port', '0'])\n"
        "except RuntimeError as e:\n    print(e)\n"
    )
    env = {"REC_TEST_TIER": "check", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         cwd=tiers.Path(tiers.__file__).parents[1], timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "starts redis-server: add it to INTEGRATION in tests/tiers.py" in out.stdout
