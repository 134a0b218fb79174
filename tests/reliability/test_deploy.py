"""docker-compose.yml validates with Debian's docker-compose, and every file it and the Dockerfiles
point at exists. The stack itself runs in tests/deploy (`make test-deploy`, it needs Docker)."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(
    shutil.which("docker-compose") is None,
    reason="docker-compose not installed (scripts/setup.sh installs it)",
)
def test_compose_file_validates():
    out = subprocess.run(
        ["docker-compose", "-f", str(ROOT / "docker-compose.yml"), "config", "-q"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    services = subprocess.run(
        [
            "docker-compose",
            "-f",
            str(ROOT / "docker-compose.yml"),
            "--profile",
            "triton",
            "config",
            "--services",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.split()
    tier = {"redis-1", "redis-2", "redis-3", "store-init", "server-a", "server-b"}
    assert set(services) == {"train", "export", "server", "triton", "prometheus", *tier}


def test_deploy_files_exist():
    compose = (ROOT / "docker-compose.yml").read_text()
    assert compose.count("/v2/health/ready") == 3  # server, triton, the tier's replicas
    assert (ROOT / "deploy/prometheus.yml").exists()
    assert (ROOT / "deploy/tier_export.yaml").exists()
    for target in ("server:8002", "triton:8002"):
        assert target in (ROOT / "deploy/prometheus.yml").read_text()
    dockerfile = (ROOT / "Dockerfile").read_text()
    # The image's stack is requirements.txt (requirements-host.txt adds the host's tools).
    assert "requirements.txt" in (ROOT / "deploy/install_stack.sh").read_text()
    for src in re.findall(r"^COPY (?!--from)(\S+)", dockerfile, flags=re.M):
        assert (ROOT / src).exists(), src
    assert re.search(r"^USER rec$", dockerfile, flags=re.M)  # the runtime stage is not root
